//! `kontinuum-testbed up --dir DIR [--address 127.0.0.1] [--port 6443]`: runs one real
//! control plane in the foreground, writes `DIR/kubeconfig`, prints `ready` once it is
//! usable, and stops everything on SIGTERM or SIGINT.

use std::io::Write as _;
use std::net::IpAddr;
use std::path::PathBuf;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use kontinuum_testbed::{ControlPlane, ControlPlaneConfig, Tools};
use tokio::signal::unix::{SignalKind, signal};

#[derive(Parser)]
#[command(
    version,
    about = "A real Kubernetes control plane for Kontinuum's tests"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run one control plane until SIGTERM/SIGINT.
    Up {
        /// Directory for certificates, logs, etcd data and `kubeconfig`.
        #[arg(long)]
        dir: PathBuf,
        /// Address every component binds to.
        #[arg(long, default_value = "127.0.0.1")]
        address: IpAddr,
        /// The API server's port (0 picks a free one).
        #[arg(long, default_value_t = 6443)]
        port: u16,
        /// Names of the fake (KWOK) nodes to create.
        #[arg(long = "node", default_value = "kwok-node-0")]
        nodes: Vec<String>,
    },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .init();
    kontinuum_testbed::install_crypto_provider();
    let Command::Up {
        dir,
        address,
        port,
        nodes,
    } = Cli::parse().command;
    let tools = Tools::locate().context("locating the test-bed tools")?;
    let mut config = ControlPlaneConfig::new(dir);
    config.address = address;
    config.port = port;
    config.nodes = nodes;
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let cp = tokio::select! {
        cp = ControlPlane::start(&tools, config) => cp.context("starting the control plane")?,
        _ = term.recv() => return Ok(()),
        _ = tokio::signal::ctrl_c() => return Ok(()),
    };
    writeln!(std::io::stdout().lock(), "ready").context("writing to stdout")?;
    tracing::info!(
        kubeconfig = %cp.kubeconfig_path().display(),
        server = cp.server(),
        "control plane running; stop with SIGTERM or Ctrl-C"
    );
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    cp.stop().await;
    Ok(())
}
