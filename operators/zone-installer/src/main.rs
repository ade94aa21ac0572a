//! `zone-installer`: fans Zones out into their hub objects, installs the zone agent and
//! reports the zone Ready once it heartbeats. See the crate docs.

use anyhow::Context as _;
use clap::Parser;
use kontinuum_operator_common::args::CommonArgs;
use kontinuum_operator_common::{install_crypto_provider, operator};
use zone_installer::CONTROLLER;

#[derive(Parser)]
#[command(
    version,
    about = "Fans Zones out into their hub objects, installs the zone agent downstream and reports the zone Ready once it heartbeats"
)]
struct Cli {
    #[command(flatten)]
    common: CommonArgs,
    #[command(flatten)]
    zones: zone_installer::Args,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    install_crypto_provider();
    let cli = Cli::parse();
    let settings = cli.zones.settings().context("invalid settings")?;
    let namespace = cli.common.namespace.clone();
    operator::main(
        &cli.common,
        CONTROLLER,
        env!("CARGO_CRATE_NAME"),
        |rt| async move {
            zone_installer::run(
                rt.client,
                namespace.as_deref(),
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
