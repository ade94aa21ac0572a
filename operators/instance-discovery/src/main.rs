//! `instance-discovery`: probes unclaimed Instances in Talos maintenance mode. See the
//! crate docs.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use instance_discovery::{CONTROLLER, Ctx, Settings, talos_prober};
use kontinuum_operator_common::admin::{self, Readiness};
use kontinuum_operator_common::args::CommonArgs;
use kontinuum_operator_common::backoff::Backoff;
use kontinuum_operator_common::events::Events;
use kontinuum_operator_common::leader::Leadership;
use kontinuum_operator_common::metrics::ControllerMetrics;
use kontinuum_operator_common::shutdown::{Reason, Shutdown};
use kontinuum_operator_common::{install_crypto_provider, telemetry};
use prometheus_client::registry::Registry;

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
    let args = cli.common;
    telemetry::init(args.log_level, args.log_format, env!("CARGO_CRATE_NAME"))
        .map_err(|e| anyhow::anyhow!("setting up logging: {e}"))?;
    let settings = Settings {
        dial_timeout: Duration::from_secs(cli.dial_timeout_seconds),
        reprobe_interval: Duration::from_secs(cli.reprobe_seconds),
        retry_interval: Duration::from_secs(cli.retry_seconds),
        concurrency: cli.concurrency,
    };
    let identity = args.identity();
    tracing::info!(version = env!("CARGO_PKG_VERSION"), namespace = ?args.namespace, identity = %identity, ?settings, "starting");
    let client = args.client().await.context("connecting to the hub")?;
    let shutdown = Shutdown::on_signals().context("installing signal handlers")?;
    let readiness = Readiness::new(args.leader.leader_elect);
    let mut registry = Registry::default();
    let metrics = ControllerMetrics::register(&mut registry, CONTROLLER);
    let admin = tokio::spawn(admin::serve(
        args.admin_addr,
        admin::router(readiness.clone(), Arc::new(registry)),
        shutdown.clone(),
    ));
    let mut leadership = Leadership::start(
        client.clone(),
        &args.leader,
        CONTROLLER,
        identity.clone(),
        readiness.clone(),
        shutdown.clone(),
    )
    .await
    .context("starting leader election")?;
    tokio::select! {
        () = leadership.acquired() => {
            let events = Events::new(client.clone(), CONTROLLER, Some(identity));
            let ctx = Ctx { client, prober: talos_prober(), settings, metrics, events, backoff: Backoff::default() };
            instance_discovery::run(ctx, args.namespace.as_deref(), readiness, shutdown.clone()).await;
        }
        () = shutdown.wait() => {}
    }
    shutdown.trigger(Reason::Signal);
    admin
        .await
        .context("admin server task")?
        .context("admin server")?;
    match shutdown.reason() {
        Some(Reason::Fatal(why)) => anyhow::bail!("stopped: {why}"),
        _ => Ok(()),
    }
}
