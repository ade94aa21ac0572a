//! `etcd-proxy serve` (hub) and `etcd-proxy relay` (zone). See the crate docs.

use anyhow::Context as _;
use clap::Parser as _;
use etcd_proxy::run::{self, Cli, Command};
use kontinuum_operator_common::install_crypto_provider;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    install_crypto_provider();
    match Cli::parse().command {
        Command::Serve(args) => run::serve(args).await.context("etcd-proxy serve")?,
        Command::Relay(args) => run::relay(args).await.context("etcd-proxy relay")?,
    }
    Ok(())
}
