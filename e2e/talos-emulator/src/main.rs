//! `talos-emulator --machines N --first-address 127.10.0.1 --dir DIR [--node-agent
//! hostlet|kwok] [--image-map FILE] [--hostlet-bin FILE] [--reboot-downtime-ms MS]`: prints `listening <address>` per
//! machine and `control <addr>`, then serves until SIGINT/SIGTERM.

use std::io::Write as _;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;

use anyhow::Context as _;
use clap::Parser;
use talos_emulator::{DEFAULT_API_PORT, DEFAULT_PORT, Emulator, NodeAgent, NodeSettings, Settings};

/// Many emulated Talos machines on consecutive loopback addresses.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// Number of machines.
    #[arg(long, default_value_t = 1)]
    machines: usize,
    /// Address of the first machine.
    #[arg(long, default_value = "127.10.0.1")]
    first_address: Ipv4Addr,
    /// Talos API port of every machine.
    #[arg(long, default_value_t = DEFAULT_PORT)]
    port: u16,
    /// Kubernetes API port of a bootstrapped control plane when the one its config names is
    /// taken (0: a free port).
    #[arg(long, default_value_t = DEFAULT_API_PORT)]
    api_port: u16,
    /// State directory.
    #[arg(long)]
    dir: PathBuf,
    /// Address of the HTTP fault-injection interface.
    #[arg(long, default_value = "127.0.0.1:0")]
    control_addr: SocketAddr,
    /// What runs each cluster machine's Node: `hostlet` (pods of our image run for real,
    /// others are pretended Running/Ready) or `kwok` (every pod pretended).
    #[arg(long, default_value = "hostlet")]
    node_agent: NodeAgent,
    /// The hostlets' image map (default: `kontinuum:<any tag>` with `/usr/local/bin/<name>`
    /// for every executable next to this one, and the test bed's helm).
    #[arg(long)]
    image_map: Option<PathBuf>,
    /// The hostlet binary (default: next to this executable).
    #[arg(long)]
    hostlet_bin: Option<PathBuf>,
    /// How long a machine that a Reboot or Upgrade reboots stays unreachable.
    #[arg(long, default_value_t = 1000)]
    reboot_downtime_ms: u64,
    /// Log filter (also env TALOS_EMULATOR_LOG).
    #[arg(long, env = "TALOS_EMULATOR_LOG", default_value = "info")]
    log_level: String,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(&args.log_level))
        .with_writer(std::io::stderr)
        .init();
    let emulator = Emulator::start_with(
        Settings {
            machines: args.machines,
            first_address: args.first_address,
            port: args.port,
            api_port: args.api_port,
            dir: args.dir,
            control_addr: Some(args.control_addr),
        },
        NodeSettings {
            agent: args.node_agent,
            hostlet_binary: args.hostlet_bin,
            image_map: args.image_map,
        },
    )
    .await
    .context("starting the emulator")?;
    emulator.set_reboot_downtime(std::time::Duration::from_millis(args.reboot_downtime_ms));
    {
        let mut out = std::io::stdout().lock();
        for addr in emulator.addresses() {
            writeln!(out, "listening {addr}").context("writing to stdout")?;
        }
        if let Some(control) = emulator.control_addr() {
            writeln!(out, "control {control}").context("writing to stdout")?;
        }
        out.flush().context("flushing stdout")?;
    }
    tracing::info!(
        version = env!("CARGO_PKG_VERSION"),
        "talos emulator started"
    );
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing the SIGTERM handler")?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    emulator.shutdown().await;
    Ok(())
}
