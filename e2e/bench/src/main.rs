//! `kontinuum-bench`: benchmarks that MEASURE and write Markdown; they assert nothing about
//! time. One subcommand per scenario:
//!
//! * `talos`: the Talos emulator with many maintenance-mode machines: start-up, RSS, probe
//!   throughput of our client, bootstrap of one cluster (issue 3, acceptance 5).
//! * `discovery`: instance-discovery and pool-claimer at scale: time to discover N
//!   machines and to claim them across P pools, writes per object, RSS and CPU (issue 4).
//! * `bootstrap`: TalosCluster creation to `Ready` through the operators, per step, against
//!   the same steps driven directly by the client library (issue 5).
//! * `etcd-proxy`: the Kontinuum store directly against relay + proxy (TLS, a token per
//!   call): latency, throughput, CPU per call, cross-checked with `etcdctl check perf`
//!   (issue 11, acceptance 7), and against two byte forwarders (`forward`, the floor).
//! * `zone`: `kubectl kontinuum zone add` to a `Ready` Zone through every operator, per
//!   stage (fan-out, discovered, claimed, bootstrapped, addons, installed, joined), against
//!   the same steps driven directly by the operators' libraries (issue 12, acceptance 6).
//!
//! Shared pieces for further scenarios (e.g. discovery/claim with the operators): the
//! emulator as a child process ([`emulator`]), any other long-running child ([`child`]),
//! `/proc` memory and CPU time ([`procfs`]), `perf` profiles ([`perf_profile`]), a
//! closed-loop etcd v3 load generator ([`etcd_load`]), latency summaries ([`stats`]) and
//! the report ([`report`]).

mod addons;
mod bootstrap;
mod child;
mod discovery;
mod emulator;
mod etcd_load;
mod etcd_proxy;
mod forward;
mod perf_profile;
mod procfs;
mod report;
mod stats;
mod talos;
mod zone;
mod zone_watches;

use std::io::Write as _;

use anyhow::Context as _;
use clap::{Parser, Subcommand};

/// Kontinuum benchmarks.
#[derive(Parser, Debug)]
#[command(version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Talos emulator: start-up, RSS, maintenance probes per second, one bootstrap.
    Talos(talos::Args),
    /// instance-discovery and pool-claimer: N machines discovered, then claimed by P pools.
    Discovery(discovery::Args),
    /// addon-installer: kubeconfig to three built-ins Ready; helm invocations per resync.
    Addons(addons::Args),
    /// talos-bootstrapper: TalosCluster creation to Ready, per step, against the client floor.
    Bootstrap(bootstrap::Args),
    /// etcd-proxy: the store directly against relay + proxy, put and range at 1 and 16 clients.
    EtcdProxy(etcd_proxy::Args),
    /// zone-installer and every operator: `zone add` to Ready, per stage, against the floor.
    Zone(zone::Args),
    /// addon-installer's downstream pod watches: memory per zone cluster watched.
    ZoneWatches(zone_watches::Args),
    /// A byte-copying TCP forwarder (the etcd-proxy benchmark's floor; started by it).
    #[command(hide = true)]
    Forward(forward::Args),
}

/// A progress line on stderr (the report goes to stdout).
pub(crate) fn say(message: &str) {
    let _ = writeln!(std::io::stderr().lock(), "kontinuum-bench: {message}");
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    if let Command::Forward(args) = &cli.command {
        return forward::run(args);
    }
    tokio::runtime::Runtime::new()
        .context("starting the async runtime")?
        .block_on(run(cli.command))
}

async fn run(command: Command) -> anyhow::Result<()> {
    kontinuum_testbed::install_crypto_provider();
    let report = match command {
        Command::Talos(args) => talos::run(args).await?,
        Command::Discovery(args) => discovery::run(args).await?,
        Command::Addons(args) => addons::run(args).await?,
        Command::Bootstrap(args) => bootstrap::run(args).await?,
        Command::EtcdProxy(args) => etcd_proxy::run(args).await?,
        Command::Zone(args) => zone::run(args).await?,
        Command::ZoneWatches(args) => zone_watches::run(args).await?,
        // Handled in `main`, before any runtime: it runs its own, on one thread.
        Command::Forward(_) => anyhow::bail!("forward does not run inside another runtime"),
    };
    let mut out = std::io::stdout().lock();
    write!(out, "{report}").context("writing to stdout")?;
    out.flush().context("flushing stdout")?;
    Ok(())
}
