//! `pool-claimer`: claims `Discovered` Instances for InstancePools. See the crate docs.

use clap::Parser;
use kontinuum_operator_common::args::CommonArgs;
use kontinuum_operator_common::{install_crypto_provider, operator};
use pool_claimer::CONTROLLER;

#[derive(Parser)]
#[command(version, about = "Claims Discovered Instances for InstancePools")]
struct Cli {
    #[command(flatten)]
    common: CommonArgs,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    install_crypto_provider();
    let cli = Cli::parse();
    let namespace = cli.common.namespace.clone();
    operator::main(
        &cli.common,
        CONTROLLER,
        env!("CARGO_CRATE_NAME"),
        |rt| async move {
            pool_claimer::run(
                rt.client,
                namespace.as_deref(),
                rt.metrics,
                rt.events,
                rt.readiness,
                rt.shutdown,
            )
            .await;
        },
    )
    .await?;
    Ok(())
}
