//! `addon-installer`: installs Addons (Helm charts) onto zone clusters. See the crate docs.

use addon_installer::CONTROLLER;
use clap::Parser;
use kontinuum_operator_common::args::CommonArgs;
use kontinuum_operator_common::{install_crypto_provider, operator};

#[derive(Parser)]
#[command(version, about = "Installs Addons (Helm charts) onto zone clusters")]
struct Cli {
    #[command(flatten)]
    common: CommonArgs,
    #[command(flatten)]
    addons: addon_installer::Args,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    install_crypto_provider();
    let cli = Cli::parse();
    let namespace = cli.common.namespace.clone();
    let settings = cli.addons.settings();
    let helm = cli.addons.helm();
    operator::main(
        &cli.common,
        CONTROLLER,
        env!("CARGO_CRATE_NAME"),
        |rt| async move {
            addon_installer::run(
                rt.client,
                namespace.as_deref(),
                settings,
                helm.with_metrics(rt.metrics.clone()),
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
