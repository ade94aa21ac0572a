//! `talos-bootstrapper`: TalosClusters from maintenance mode to Ready, and back. See the
//! crate docs.

use std::time::Duration;

use clap::Parser;
use kontinuum_operator_common::args::CommonArgs;
use kontinuum_operator_common::{install_crypto_provider, operator};
use kontinuum_talos::Timeouts;
use talos_bootstrapper::machines::Dialer;
use talos_bootstrapper::{CONTROLLER, Settings};

#[derive(Parser)]
#[command(
    version,
    about = "Bootstraps Talos clusters from claimed machines, and resets them"
)]
struct Cli {
    #[command(flatten)]
    common: CommonArgs,
    /// Talos API port of every machine.
    #[arg(long, env = "KONTINUUM_TALOS_PORT", default_value_t = kontinuum_talos::DEFAULT_PORT)]
    talos_port: u16,
    /// Bound on connecting to a machine (TCP + TLS), in seconds.
    #[arg(long, env = "KONTINUUM_TALOS_CONNECT_TIMEOUT_SECONDS", default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=300))]
    talos_connect_timeout_seconds: u64,
    /// Bound on one Talos call, in seconds.
    #[arg(long, env = "KONTINUUM_TALOS_RPC_TIMEOUT_SECONDS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=600))]
    talos_rpc_timeout_seconds: u64,
    /// How long one cluster health check may wait for the cluster, in seconds.
    #[arg(long, env = "KONTINUUM_HEALTH_CHECK_TIMEOUT_SECONDS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=600))]
    health_check_timeout_seconds: u64,
    /// How often a ready control plane's health is checked again, in seconds.
    #[arg(long, env = "KONTINUUM_HEALTH_CHECK_INTERVAL_SECONDS", default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..=86400))]
    health_check_interval_seconds: u64,
    /// Requeue while waiting on a machine or the cluster, in seconds.
    #[arg(long, env = "KONTINUUM_RETRY_SECONDS", default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=3600))]
    retry_seconds: u64,
    /// How long teardown keeps trying to reset machines before removing its finalizer, in
    /// seconds.
    #[arg(long, env = "KONTINUUM_TEARDOWN_TIMEOUT_SECONDS", default_value_t = 900, value_parser = clap::value_parser!(u64).range(1..=86400))]
    teardown_timeout_seconds: u64,
    /// After a Bootstrap call whose outcome was lost (a crash, a timeout), how long to wait
    /// for the cluster's API server to answer before calling Bootstrap again, in seconds.
    #[arg(long, env = "KONTINUUM_BOOTSTRAP_GRACE_SECONDS", default_value_t = 120, value_parser = clap::value_parser!(u64).range(1..=3600))]
    bootstrap_grace_seconds: u64,
    /// Bits of the Kubernetes service-account RSA key of new secrets bundles.
    #[arg(long, env = "KONTINUUM_SERVICE_ACCOUNT_KEY_BITS", default_value_t = 4096, value_parser = clap::value_parser!(u64).range(2048..=8192))]
    service_account_key_bits: u64,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    install_crypto_provider();
    let cli = Cli::parse();
    let settings = Settings {
        dialer: Dialer {
            port: cli.talos_port,
            timeouts: Timeouts {
                connect: Duration::from_secs(cli.talos_connect_timeout_seconds),
                rpc: Duration::from_secs(cli.talos_rpc_timeout_seconds),
            },
            health_wait: Duration::from_secs(cli.health_check_timeout_seconds),
        },
        health_interval: Duration::from_secs(cli.health_check_interval_seconds),
        retry: Duration::from_secs(cli.retry_seconds),
        teardown_timeout: Duration::from_secs(cli.teardown_timeout_seconds),
        bootstrap_grace: Duration::from_secs(cli.bootstrap_grace_seconds),
        rsa_bits: usize::try_from(cli.service_account_key_bits)?,
    };
    let namespace = cli.common.namespace.clone();
    operator::main(
        &cli.common,
        CONTROLLER,
        env!("CARGO_CRATE_NAME"),
        |rt| async move {
            tracing::info!(?settings, "bootstrapping");
            talos_bootstrapper::run(
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
