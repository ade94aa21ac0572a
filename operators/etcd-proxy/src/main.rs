//! `etcd-proxy serve` (hub) and `etcd-proxy relay` (zone). See the crate docs.

use anyhow::Context as _;
use clap::Parser as _;
use etcd_proxy::run::{self, Cli, Command};
use kontinuum_operator_common::install_crypto_provider;

fn main() -> anyhow::Result<()> {
    install_crypto_provider();
    let command = Cli::parse().command;
    let runtime = command.runtime().context("starting the async runtime")?;
    runtime.block_on(async move {
        match command {
            Command::Serve(args) => run::serve(args).await.context("etcd-proxy serve"),
            Command::Relay(args) => run::relay(args).await.context("etcd-proxy relay"),
        }
    })
}
