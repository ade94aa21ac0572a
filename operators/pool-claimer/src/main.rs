//! `pool-claimer`: claims `Discovered` Instances for InstancePools. See the crate docs.

use std::sync::Arc;

use anyhow::Context as _;
use clap::Parser;
use kontinuum_operator_common::admin::{self, Readiness};
use kontinuum_operator_common::args::CommonArgs;
use kontinuum_operator_common::events::Events;
use kontinuum_operator_common::leader::Leadership;
use kontinuum_operator_common::metrics::ControllerMetrics;
use kontinuum_operator_common::shutdown::{Reason, Shutdown};
use kontinuum_operator_common::{install_crypto_provider, telemetry};
use pool_claimer::CONTROLLER;
use prometheus_client::registry::Registry;

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
    let args = cli.common;
    telemetry::init(args.log_level, args.log_format, env!("CARGO_CRATE_NAME"))
        .map_err(|e| anyhow::anyhow!("setting up logging: {e}"))?;
    let identity = args.identity();
    tracing::info!(version = env!("CARGO_PKG_VERSION"), namespace = ?args.namespace, identity = %identity, leader_elect = args.leader.leader_elect, "starting");
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
            pool_claimer::run(client, args.namespace.as_deref(), metrics, events, readiness, shutdown.clone()).await;
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
