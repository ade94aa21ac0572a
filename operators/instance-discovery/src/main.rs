//! `instance-discovery`: probes unclaimed Instances in Talos maintenance mode. See the
//! crate docs.

use std::time::Duration;

use clap::Parser;
use instance_discovery::{CONTROLLER, Ctx, Settings, talos_prober};
use kontinuum_operator_common::args::CommonArgs;
use kontinuum_operator_common::backoff::Backoff;
use kontinuum_operator_common::status::StatusWrites;
use kontinuum_operator_common::{install_crypto_provider, operator};

#[derive(Parser)]
#[command(
    version,
    about = "Probes unclaimed Instances in Talos maintenance mode"
)]
struct Cli {
    #[command(flatten)]
    common: CommonArgs,
    /// Bound on probing one address, in seconds.
    #[arg(long, env = "KONTINUUM_DISCOVERY_DIAL_TIMEOUT_SECONDS", default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=300))]
    dial_timeout_seconds: u64,
    /// Re-probe interval of a discovered machine, in seconds.
    #[arg(long, env = "KONTINUUM_DISCOVERY_REPROBE_SECONDS", default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..=86400))]
    reprobe_seconds: u64,
    /// Re-probe interval of a machine that does not answer, in seconds.
    #[arg(long, env = "KONTINUUM_DISCOVERY_RETRY_SECONDS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=3600))]
    retry_seconds: u64,
    /// How many Instances are probed at once.
    #[arg(long, env = "KONTINUUM_DISCOVERY_CONCURRENCY", default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..=1024))]
    concurrency: u16,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    install_crypto_provider();
    let cli = Cli::parse();
    let settings = Settings {
        dial_timeout: Duration::from_secs(cli.dial_timeout_seconds),
        reprobe_interval: Duration::from_secs(cli.reprobe_seconds),
        retry_interval: Duration::from_secs(cli.retry_seconds),
        concurrency: cli.concurrency,
    };
    let namespace = cli.common.namespace.clone();
    operator::main(
        &cli.common,
        CONTROLLER,
        env!("CARGO_CRATE_NAME"),
        |rt| async move {
            tracing::info!(?settings, "probing");
            let ctx = Ctx {
                client: rt.client,
                prober: talos_prober(),
                settings,
                metrics: rt.metrics,
                events: rt.events,
                backoff: Backoff::default(),
                status_writes: StatusWrites::new("status_writes"),
            };
            instance_discovery::run(ctx, namespace.as_deref(), rt.readiness, rt.shutdown).await;
        },
    )
    .await?;
    Ok(())
}
