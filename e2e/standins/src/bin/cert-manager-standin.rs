//! `cert-manager-standin`: a STAND-IN for cert-manager's controllers in Kontinuum's e2e
//! test bed. See `kontinuum_standins::cert_manager`.

use clap::Parser;
use kontinuum_operator_common::args::CommonArgs;
use kontinuum_operator_common::{install_crypto_provider, operator};
use kontinuum_standins::cert_manager::{self, CONTROLLER};

#[derive(Parser)]
#[command(
    version,
    about = "STAND-IN for cert-manager (test bed only): issuer readiness and Certificate issuance"
)]
struct Cli {
    #[command(flatten)]
    common: CommonArgs,
    #[command(flatten)]
    standin: cert_manager::Args,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    install_crypto_provider();
    let cli = Cli::parse();
    let settings = cli.standin.settings()?;
    operator::main(
        &cli.common,
        CONTROLLER,
        env!("CARGO_CRATE_NAME"),
        |rt| async move {
            cert_manager::run(
                rt.client,
                settings,
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
