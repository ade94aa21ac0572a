//! `hostlet`: the kubelet of one test-bed node, running its pods as host processes.
//!
//! ```text
//! hostlet --kubeconfig <path> --node-name <n> --node-ip <ip> [--pod-cidr <cidr>]
//!         --image-map <file> --dir <dir> [--unmapped refuse|pretend] [--label k=v ...]
//!         [--taint k=v:Effect ...] [--initial-backoff-seconds N]
//! ```
//!
//! Prints `ready` once the node is registered and Ready; stops every pod on SIGTERM/SIGINT.

use std::io::Write as _;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::{Parser, Subcommand, ValueEnum};
use kontinuum_hostlet::{HostletConfig, ImageMap, Unmapped, api_address, container, ipam};
use kube::config::{KubeConfigOptions, Kubeconfig};

#[derive(Parser, Debug)]
#[command(
    name = "hostlet",
    version,
    about = "A test-bed kubelet running pods as host processes"
)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Internal: set up a container's namespace and execute its program.
    #[command(hide = true, name = "exec-container")]
    ExecContainer {
        /// The container spec (JSON) written by the hostlet.
        #[arg(long)]
        spec: PathBuf,
    },
}

#[derive(clap::Args, Debug)]
struct RunArgs {
    /// Kubeconfig of the API server (the hostlet needs to read Secrets and ConfigMaps,
    /// request tokens, and write Nodes, Leases, pod status and Events).
    #[arg(long, required = true)]
    kubeconfig: Option<PathBuf>,
    /// The Node's name.
    #[arg(long, required = true)]
    node_name: Option<String>,
    /// The Node's InternalIP (a loopback address such as 127.20.0.1).
    #[arg(long, required = true)]
    node_ip: Option<Ipv4Addr>,
    /// Give each pod a loopback address of its own from this range (e.g. 127.20.1.0/24);
    /// without it every pod uses the node's IP.
    #[arg(long)]
    pod_cidr: Option<String>,
    /// The image map (YAML or JSON).
    #[arg(long, required = true)]
    image_map: Option<PathBuf>,
    /// The hostlet's directory: pod logs in `pods/<ns>_<name>_<uid>/<container>.log`.
    #[arg(long, required = true)]
    dir: Option<PathBuf>,
    /// What to do with pods whose image is not in the map.
    #[arg(long, value_enum, default_value_t = UnmappedArg::Refuse)]
    unmapped: UnmappedArg,
    /// An extra Node label (repeatable).
    #[arg(long = "label", value_name = "KEY=VALUE")]
    labels: Vec<String>,
    /// A Node taint (repeatable): `key=value:Effect` or `key:Effect`.
    #[arg(long = "taint", value_name = "KEY=VALUE:EFFECT")]
    taints: Vec<String>,
    /// The first crash-loop back-off (a kubelet's is 10 s).
    #[arg(long, default_value_t = 10)]
    initial_backoff_seconds: u64,
    /// Node capacity: CPU.
    #[arg(long, default_value = "16")]
    cpu: String,
    /// Node capacity: memory.
    #[arg(long, default_value = "64Gi")]
    memory: String,
    /// Node capacity: pods.
    #[arg(long, default_value_t = 110)]
    max_pods: u32,
    /// Log filter (also `HOSTLET_LOG`).
    #[arg(long, env = "HOSTLET_LOG", default_value = "info")]
    log_level: String,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum UnmappedArg {
    Refuse,
    Pretend,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    if let Some(Command::ExecContainer { spec }) = cli.command {
        // Errors go to the container's log (our stderr).
        init_tracing("warn");
        let err = match container::exec_container(&spec) {
            Ok(never) => match never {},
            Err(err) => err,
        };
        tracing::error!(
            error = &err as &dyn std::error::Error,
            "starting the container failed"
        );
        std::process::exit(128);
    }
    init_tracing(&cli.run.log_level);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("building the runtime")?;
    runtime.block_on(run(cli.run))
}

fn init_tracing(filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_new(filter)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .init();
}

fn parse_kv(s: &str, what: &str) -> anyhow::Result<(String, String)> {
    let (k, v) = s
        .split_once('=')
        .with_context(|| format!("{what} {s}: want KEY=VALUE"))?;
    if k.is_empty() {
        bail!("{what} {s}: empty key");
    }
    Ok((k.to_string(), v.to_string()))
}

fn parse_taint(s: &str) -> anyhow::Result<(String, String, String)> {
    let (kv, effect) = s
        .rsplit_once(':')
        .with_context(|| format!("taint {s}: want KEY=VALUE:EFFECT"))?;
    if !matches!(effect, "NoSchedule" | "PreferNoSchedule" | "NoExecute") {
        bail!("taint {s}: effect must be NoSchedule, PreferNoSchedule or NoExecute");
    }
    let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
    if k.is_empty() {
        bail!("taint {s}: empty key");
    }
    Ok((k.to_string(), v.to_string(), effect.to_string()))
}

async fn run(args: RunArgs) -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let (Some(kubeconfig), Some(node_name), Some(node_ip), Some(image_map), Some(dir)) = (
        args.kubeconfig,
        args.node_name,
        args.node_ip,
        args.image_map,
        args.dir,
    ) else {
        bail!("--kubeconfig, --node-name, --node-ip, --image-map and --dir are required");
    };
    let map = ImageMap::load(&image_map).context("loading the image map")?;
    let yaml = std::fs::read_to_string(&kubeconfig)
        .with_context(|| format!("reading {}", kubeconfig.display()))?;
    let kc = Kubeconfig::from_yaml(&yaml).context("parsing the kubeconfig")?;
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .context("loading the kubeconfig")?;
    let (api_host, api_port) =
        api_address(&config.cluster_url.to_string()).context("reading the server address")?;
    let client = kube::Client::try_from(config).context("building a client")?;
    let mut hostlet = HostletConfig::new(node_name, node_ip, map, dir, api_host, api_port);
    hostlet.pod_cidr = args
        .pod_cidr
        .as_deref()
        .map(ipam::Cidr::parse)
        .transpose()
        .context("parsing --pod-cidr")?;
    hostlet.unmapped = match args.unmapped {
        UnmappedArg::Refuse => Unmapped::Refuse,
        UnmappedArg::Pretend => Unmapped::Pretend,
    };
    for label in &args.labels {
        let (k, v) = parse_kv(label, "label")?;
        hostlet.labels.insert(k, v);
    }
    for taint in &args.taints {
        hostlet.taints.push(parse_taint(taint)?);
    }
    hostlet.initial_backoff = Duration::from_secs(args.initial_backoff_seconds);
    hostlet.cpu = args.cpu;
    hostlet.memory = args.memory;
    hostlet.max_pods = args.max_pods;
    tracing::info!(
        version = env!("CARGO_PKG_VERSION"),
        node = %hostlet.node_name,
        node_ip = %hostlet.node_ip,
        pod_cidr = ?hostlet.pod_cidr.map(|c| c.to_string()),
        "starting hostlet"
    );
    let shutdown = async {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(err) => {
                    tracing::warn!(
                        error = &err as &dyn std::error::Error,
                        "cannot watch SIGTERM"
                    );
                    std::future::pending::<()>().await;
                    return;
                }
            };
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        tracing::info!("stopping");
    };
    kontinuum_hostlet::run(client, hostlet, shutdown, || {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "ready");
        let _ = out.flush();
    })
    .await
    .context("running the hostlet")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn taints_and_labels_parse() {
        assert_eq!(
            parse_taint("a=b:NoSchedule").unwrap(),
            ("a".into(), "b".into(), "NoSchedule".into())
        );
        assert_eq!(
            parse_taint("a:NoExecute").unwrap(),
            ("a".into(), String::new(), "NoExecute".into())
        );
        assert!(parse_taint("a=b:Bogus").is_err());
        assert_eq!(
            parse_kv("k=v=w", "label").unwrap(),
            ("k".into(), "v=w".into())
        );
        assert!(parse_kv("novalue", "label").is_err());
    }

    #[test]
    fn the_cli_parses() {
        let cli = Cli::try_parse_from([
            "hostlet",
            "--kubeconfig",
            "k",
            "--node-name",
            "n",
            "--node-ip",
            "127.0.0.2",
            "--image-map",
            "m",
            "--dir",
            "d",
            "--unmapped",
            "pretend",
            "--label",
            "a=b",
        ])
        .unwrap();
        assert!(matches!(cli.run.unmapped, UnmappedArg::Pretend));
        let cli = Cli::try_parse_from(["hostlet", "exec-container", "--spec", "s"]).unwrap();
        assert!(matches!(cli.command, Some(Command::ExecContainer { .. })));
        assert!(Cli::try_parse_from(["hostlet", "--node-name", "n"]).is_err());
    }
}
