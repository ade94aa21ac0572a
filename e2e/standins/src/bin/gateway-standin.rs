//! `gateway-standin`: a STAND-IN for a Gateway API data plane (Cilium's cannot run in
//! Kontinuum's e2e test bed). See `kontinuum_standins::gateway`.

use clap::Parser;
use kontinuum_operator_common::args::CommonArgs;
use kontinuum_operator_common::{install_crypto_provider, operator};
use kontinuum_standins::gateway::{self, CONTROLLER};

#[derive(Parser)]
#[command(
    version,
    about = "STAND-IN for a Gateway API data plane (test bed only): HTTP/HTTPS listeners, HTTPRoutes"
)]
struct Cli {
    #[command(flatten)]
    common: CommonArgs,
    #[command(flatten)]
    standin: gateway::Args,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    install_crypto_provider();
    let cli = Cli::parse();
    let settings = cli.standin.settings();
    operator::main(
        &cli.common,
        CONTROLLER,
        env!("CARGO_CRATE_NAME"),
        |rt| async move {
            // The watches and stores make a large future: keep it on the heap.
            Box::pin(gateway::run(
                rt.client,
                settings,
                rt.metrics,
                rt.readiness,
                rt.shutdown,
            ))
            .await;
        },
    )
    .await?;
    Ok(())
}
