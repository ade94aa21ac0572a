//! `registry hub` (hub) and `registry zone` (zone agent). See the crate docs.

use anyhow::Context as _;
use clap::Parser as _;
use kontinuum_operator_common::install_crypto_provider;
use registry::run::{self, Cli, Command};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    install_crypto_provider();
    match Cli::parse().command {
        Command::Hub(args) => run::hub(args).await.context("registry hub")?,
        Command::Zone(args) => run::zone(args).await.context("registry zone")?,
    }
    Ok(())
}
