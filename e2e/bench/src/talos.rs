//! `kontinuum-bench talos`: the Talos emulator with many maintenance-mode machines
//! (issue 3, acceptance 5).
//!
//! 1. Start-up: spawn `talos-emulator --machines N`, time until every `listening` line, RSS.
//! 2. Probes: our client (`connect_maintenance` + `version` + `discover`, a fresh connection
//!    each, as the operator's probe does) against every machine, at each bounded concurrency.
//! 3. Bootstrap: one control plane (apply, bootstrap, HealthCheck, kubeconfig, node Ready),
//!    time per step, then the RSS of the emulator's process tree (control plane included).

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use k8s_openapi::api::core::v1::Node;
use kontinuum_talos::{
    ApplyMode, BootstrapOutcome, ClientIdentity, Endpoint, TalosClient, Timeouts,
};
use kontinuum_talos_config::{
    ConfigInput, InstallDisk, MachineType, SecretsBundle, TalosVersion, admin_talosconfig,
    render_machine_config,
};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::emulator::{self, EmulatorProcess};
use crate::procfs::{self, ProcMemory};
use crate::report::{Environment, Report, Section, Table};
use crate::say;
use crate::stats::{fmt_duration, fmt_kib, rate, summarize};

const TALOS_VERSION: &str = "v1.13.8";
const KUBERNETES_VERSION: &str = "1.36.2";
const CLUSTER_NAME: &str = "bench";
const HOSTNAME: &str = "bench-cp-1";

/// Options of `kontinuum-bench talos`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Emulated machines.
    #[arg(long, default_value_t = 1000)]
    machines: usize,
    /// Probe concurrencies, each probing every machine once per round.
    #[arg(long, value_delimiter = ',', default_value = "16,64")]
    concurrency: Vec<usize>,
    /// Probe rounds per concurrency (the very first round meets cold machines: each builds
    /// its maintenance certificate on the first handshake).
    #[arg(long, default_value_t = 2)]
    rounds: usize,
    /// Address of the first machine.
    #[arg(long, default_value = "127.20.0.1")]
    first_address: std::net::Ipv4Addr,
    /// Talos API port (a free one is used if it is taken on the first address).
    #[arg(long, default_value_t = 50000)]
    port: u16,
    /// The talos-emulator binary (default: next to this executable).
    #[arg(long, env = "KONTINUUM_TALOS_EMULATOR_BIN")]
    emulator_bin: Option<PathBuf>,
    /// State directory (default: a new one under the test bed's directory, removed after).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Emulator log filter (its log goes to <dir>/emulator.log).
    #[arg(long, default_value = "info")]
    emulator_log: String,
    /// Skip the bootstrap part (no test-bed binaries needed).
    #[arg(long)]
    skip_bootstrap: bool,
    /// HealthCheck wait_timeout for the bootstrapped cluster, in seconds.
    #[arg(long, default_value_t = 300)]
    health_timeout: u64,
    /// Per-probe bounds: connect (TCP + TLS) and each RPC, in seconds.
    #[arg(long, default_value_t = 10)]
    connect_timeout: u64,
    #[arg(long, default_value_t = 30)]
    rpc_timeout: u64,
    /// Where to write the Markdown report.
    #[arg(long, default_value = "bench-results/talos.md")]
    out: PathBuf,
}

/// Runs the benchmark, writes and returns the report.
pub async fn run(args: Args) -> anyhow::Result<String> {
    if args.machines == 0 || args.concurrency.contains(&0) {
        bail!("--machines and every --concurrency must be at least 1");
    }
    if !args.skip_bootstrap {
        kontinuum_testbed::Tools::locate().context(
            "the bootstrap step needs the test-bed binaries (set KONTINUUM_TESTBED_BIN, or pass --skip-bootstrap)",
        )?;
    }
    let env = Environment::capture();
    let keep_dir = args.dir.is_some();
    let dir = emulator::run_dir("bench-talos", args.dir.as_deref());
    let port = emulator::usable_port(args.first_address, args.port)?;
    let options = emulator::Options {
        binary: args
            .emulator_bin
            .clone()
            .unwrap_or_else(emulator::default_binary),
        machines: args.machines,
        first_address: args.first_address,
        port,
        dir: dir.clone(),
        log_level: args.emulator_log.clone(),
        start_timeout: Duration::from_secs(600),
    };
    say(&format!(
        "starting {} machines from {}:{port} ({})",
        args.machines,
        args.first_address,
        options.binary.display()
    ));
    let emu = EmulatorProcess::start(&options).await?;
    let result = scenario(&args, &emu, &options, env).await;
    let stopped = emu.stop(Duration::from_secs(60)).await;
    let report = result?;
    if let Err(err) = stopped {
        say(&format!("warning: {err:#}"));
    } else if !keep_dir {
        let _ = std::fs::remove_dir_all(&dir);
    }
    let text = report.write_to(&args.out)?;
    say(&format!("report written to {}", args.out.display()));
    Ok(text)
}

async fn scenario(
    args: &Args,
    emu: &EmulatorProcess,
    options: &emulator::Options,
    env: Environment,
) -> anyhow::Result<Report> {
    let mut report = Report::new("Talos emulator benchmark", env);
    let pid = emu.pid();
    let start_mem = procfs::memory(pid);
    report.push(startup_section(
        emu,
        options,
        &start_mem.clone().unwrap_or_default(),
    ));
    let mut memory = vec![("after start-up", start_mem)];
    say(&format!(
        "all listening after {}",
        fmt_duration(emu.startup.all_listening)
    ));

    let timeouts = Timeouts {
        connect: Duration::from_secs(args.connect_timeout),
        rpc: Duration::from_secs(args.rpc_timeout),
    };
    report.push(probe_section(args, emu, timeouts, report.environment.host.cpus).await);
    memory.push(("after probes", procfs::memory(pid)));

    if args.skip_bootstrap {
        report.push(Section::new("Bootstrap one cluster").text("Skipped (`--skip-bootstrap`)."));
    } else {
        let target = *emu.addresses.first().context("no machine")?;
        say(&format!("bootstrapping {target}"));
        let bootstrap = bootstrap(target, timeouts, Duration::from_secs(args.health_timeout))
            .await
            .with_context(|| {
                format!(
                    "bootstrapping {target} (emulator log: {})",
                    emu.log.display()
                )
            })?;
        memory.push(("after bootstrap", procfs::memory(pid)));
        report.push(bootstrap_section(&bootstrap, target));
        report.push(tree_section(pid));
    }

    let mut table = Table::new(&["when", "VmRSS", "VmHWM (peak so far)", "threads"]);
    for (when, m) in memory {
        let m = m.unwrap_or_default();
        table.row(vec![
            when.to_owned(),
            fmt_kib(m.rss_kib),
            fmt_kib(m.hwm_kib),
            m.threads.to_string(),
        ]);
    }
    let me = procfs::memory(std::process::id()).unwrap_or_default();
    report.push(
        Section::new("Emulator process memory")
            .text(format!(
                "The `talos-emulator` process alone (pid {pid}). For comparison, the benchmark \
                 client itself peaked at {} (VmHWM).",
                fmt_kib(me.hwm_kib)
            ))
            .table(table),
    );
    Ok(report)
}

fn startup_section(
    emu: &EmulatorProcess,
    options: &emulator::Options,
    mem: &ProcMemory,
) -> Section {
    let pid = emu.pid();
    let mut startup = Table::new(&[
        "machines",
        "first `listening`",
        "all `listening`",
        "per machine",
        "VmRSS",
        "VmHWM",
        "threads",
    ]);
    startup.row(vec![
        options.machines.to_string(),
        fmt_duration(emu.startup.first_listening),
        fmt_duration(emu.startup.all_listening),
        fmt_duration(emu.startup.all_listening / u32::try_from(options.machines).unwrap_or(1)),
        fmt_kib(mem.rss_kib),
        fmt_kib(mem.hwm_kib),
        mem.threads.to_string(),
    ]);
    Section::new("Emulator start-up")
        .text(format!(
            "`talos-emulator` as a child process (pid {pid}), fresh state directory, machines on \
             {}..{} port {} (fault-injection interface on {}); times from spawn to the line on \
             its stdout (every listener is bound before the first line is printed). RSS from \
             `/proc/{pid}/status` right after.",
            options.first_address,
            emu.addresses
                .last()
                .map_or_else(String::new, |a| a.ip().to_string()),
            options.port,
            emu.control
                .map_or_else(|| "-".to_owned(), |c| c.to_string()),
        ))
        .table(startup)
}

async fn probe_section(
    args: &Args,
    emu: &EmulatorProcess,
    timeouts: Timeouts,
    cpus: usize,
) -> Section {
    let mut probes = Table::new(&[
        "concurrency",
        "round",
        "probes",
        "errors",
        "wall",
        "probes/s",
        "p50",
        "p90",
        "p99",
        "max",
        "p50 connect / version / discover",
    ]);
    let mut errors_seen: BTreeMap<String, (usize, String)> = BTreeMap::new();
    for &concurrency in &args.concurrency {
        for round in 1..=args.rounds {
            let outcome = probe_all(&emu.addresses, concurrency, timeouts).await;
            let total = summarize(&outcome.ok.iter().map(|p| p.total).collect::<Vec<_>>());
            let part = |f: fn(&ProbeTimes) -> Duration| {
                fmt_duration(summarize(&outcome.ok.iter().map(f).collect::<Vec<_>>()).p50)
            };
            say(&format!(
                "probes c={concurrency} round {round}: {} ok, {} errors, {:.0}/s",
                outcome.ok.len(),
                outcome.errors.len(),
                rate(outcome.ok.len(), outcome.wall)
            ));
            probes.row(vec![
                concurrency.to_string(),
                round.to_string(),
                outcome.ok.len().to_string(),
                outcome.errors.len().to_string(),
                fmt_duration(outcome.wall),
                format!("{:.0}", rate(outcome.ok.len(), outcome.wall)),
                fmt_duration(total.p50),
                fmt_duration(total.p90),
                fmt_duration(total.p99),
                fmt_duration(total.max),
                format!(
                    "{} / {} / {}",
                    part(|p| p.connect),
                    part(|p| p.version),
                    part(|p| p.discover)
                ),
            ]);
            for (key, message) in outcome.errors {
                let entry = errors_seen.entry(key).or_insert((0, message));
                entry.0 += 1;
            }
        }
    }
    let mut section = Section::new("Maintenance probes (our client)")
        .text(format!(
            "One probe = `TalosClient::connect_maintenance` (TCP + TLS, fresh connection) + \
             `version` + `discover` (COSI links, addresses, disks), success only with interfaces, \
             disks and the server certificate fingerprint. Every machine once per round, at most \
             `concurrency` probes in flight (tokio tasks behind a semaphore). Client and emulator \
             share the {} CPUs. Timeouts: connect {}s, RPC {}s. Round 1 of the first concurrency \
             meets machines that build their maintenance certificate on first contact.",
            cpus, args.connect_timeout, args.rpc_timeout
        ))
        .table(probes);
    if !errors_seen.is_empty() {
        let mut table = Table::new(&["error", "count", "first message"]);
        for (key, (count, message)) in &errors_seen {
            table.row(vec![key.clone(), count.to_string(), message.clone()]);
        }
        section = section.table(table);
    }
    section
}

/// Times of one successful probe.
#[derive(Clone, Copy, Debug)]
struct ProbeTimes {
    connect: Duration,
    version: Duration,
    discover: Duration,
    total: Duration,
}

struct ProbeRound {
    ok: Vec<ProbeTimes>,
    /// `stage: reason` and the message.
    errors: Vec<(String, String)>,
    wall: Duration,
}

async fn probe_all(addresses: &[SocketAddr], concurrency: usize, timeouts: Timeouts) -> ProbeRound {
    let limit = Arc::new(Semaphore::new(concurrency));
    let mut tasks = JoinSet::new();
    let started = Instant::now();
    for &addr in addresses {
        let Ok(permit) = Arc::clone(&limit).acquire_owned().await else {
            break;
        };
        tasks.spawn(async move {
            let result = probe(addr, timeouts).await;
            drop(permit);
            result
        });
    }
    let mut round = ProbeRound {
        ok: Vec::with_capacity(addresses.len()),
        errors: Vec::new(),
        wall: Duration::ZERO,
    };
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok(Ok(times)) => round.ok.push(times),
            Ok(Err(error)) => round.errors.push(error),
            Err(join) => round.errors.push(("task".to_owned(), join.to_string())),
        }
    }
    round.wall = started.elapsed();
    round
}

async fn probe(addr: SocketAddr, timeouts: Timeouts) -> Result<ProbeTimes, (String, String)> {
    let fail = |stage: &str, e: &kontinuum_talos::Error| {
        (
            format!("{stage}: {}", e.reason()),
            kontinuum_testbed::error_chain(e),
        )
    };
    let endpoint =
        Endpoint::new(addr.ip().to_string(), addr.port()).map_err(|e| fail("endpoint", &e))?;
    let started = Instant::now();
    let client = TalosClient::connect_maintenance(&endpoint, timeouts)
        .await
        .map_err(|e| fail("connect", &e))?;
    let connected = Instant::now();
    client.version().await.map_err(|e| fail("version", &e))?;
    let versioned = Instant::now();
    let found = client.discover().await.map_err(|e| fail("discover", &e))?;
    let done = Instant::now();
    if found.interfaces.is_empty() || found.disks.is_empty() || client.peer_certificate().is_none()
    {
        return Err((
            "discover: incomplete".to_owned(),
            format!(
                "{} interfaces, {} disks, fingerprint {}",
                found.interfaces.len(),
                found.disks.len(),
                client.peer_certificate().is_some()
            ),
        ));
    }
    Ok(ProbeTimes {
        connect: connected.duration_since(started),
        version: versioned.duration_since(connected),
        discover: done.duration_since(versioned),
        total: done.duration_since(started),
    })
}

struct Bootstrap {
    steps: Vec<(&'static str, Duration)>,
    /// HealthCheck progress messages, with the time since the Bootstrap call returned.
    progress: Vec<(Duration, String)>,
    total: Duration,
}

async fn bootstrap(
    target: SocketAddr,
    timeouts: Timeouts,
    health_timeout: Duration,
) -> anyhow::Result<Bootstrap> {
    let mut steps = Vec::new();
    let mut clock = Instant::now();
    let mut step = |name: &'static str, steps: &mut Vec<(&'static str, Duration)>| {
        steps.push((name, clock.elapsed()));
        clock = Instant::now();
    };
    let address = match target.ip() {
        IpAddr::V4(v4) => v4,
        IpAddr::V6(_) => bail!("IPv6 machine address {target}"),
    };
    let endpoint = Endpoint::new(address.to_string(), target.port())?;
    let version = TalosVersion::parse(TALOS_VERSION)?;
    let now = jiff::Timestamp::now();

    let bundle = SecretsBundle::generate_with_rsa_bits(&mut rand_core::OsRng, now, &version, 2048)?;
    let mut input = ConfigInput::new(
        CLUSTER_NAME,
        address.to_string(),
        version.clone(),
        KUBERNETES_VERSION,
    );
    input.install_disk = InstallDisk::Path("/dev/sda".into());
    let config = render_machine_config(&input, &bundle, MachineType::ControlPlane, HOSTNAME)?
        .expose()
        .as_bytes()
        .to_vec();
    let admin = admin_talosconfig(&bundle, CLUSTER_NAME, &[], &[], now, &mut rand_core::OsRng)?;
    let identity = ClientIdentity::new(
        admin.identity.ca_pem,
        admin.identity.cert_pem,
        admin.identity.key_pem.expose(),
    );
    step(
        "secrets bundle (RSA 2048) + controlplane config + admin identity",
        &mut steps,
    );
    let total_started = Instant::now();

    let maintenance = TalosClient::connect_maintenance(&endpoint, timeouts).await?;
    maintenance
        .apply_configuration(config, ApplyMode::Reboot)
        .await?;
    step("ApplyConfiguration (maintenance connection)", &mut steps);

    let client = TalosClient::connect(&endpoint, &identity, timeouts).await?;
    if !client.version().await?.rbac {
        bail!("the machine is not in configured mode after ApplyConfiguration");
    }
    step("mTLS connect + Version (configured mode)", &mut steps);

    let outcome = client.bootstrap().await?;
    if outcome != BootstrapOutcome::Bootstrapped {
        bail!("Bootstrap answered {outcome:?}");
    }
    step("Bootstrap RPC", &mut steps);

    let since_bootstrap = Instant::now();
    let mut progress = Vec::new();
    client
        .health_check(health_timeout, &[address.to_string()], &[], |m| {
            progress.push((since_bootstrap.elapsed(), m.to_owned()));
        })
        .await
        .context("HealthCheck")?;
    step(
        "HealthCheck passes (control plane started, API ready, node Ready)",
        &mut steps,
    );

    let kubeconfig = client.kubeconfig().await?;
    let kubeconfig =
        String::from_utf8(kubeconfig.into_bytes()).context("kubeconfig is not UTF-8")?;
    step("Kubeconfig", &mut steps);

    let kube = kontinuum_testbed::client_from(&kubeconfig).await?;
    let nodes: kube::Api<Node> = kube::Api::all(kube);
    let node = nodes
        .get(HOSTNAME)
        .await
        .with_context(|| format!("getting node {HOSTNAME} with the fetched kubeconfig"))?;
    if !kontinuum_testbed::node_is_ready(&node) {
        bail!("node {HOSTNAME} is not Ready after a passing HealthCheck");
    }
    step("kubeconfig → API server → node Ready", &mut steps);
    Ok(Bootstrap {
        steps,
        progress,
        total: total_started.elapsed(),
    })
}

fn bootstrap_section(b: &Bootstrap, target: SocketAddr) -> Section {
    let mut table = Table::new(&["step", "time"]);
    for (name, took) in &b.steps {
        table.row(vec![(*name).to_owned(), fmt_duration(*took)]);
    }
    table.row(vec![
        "**apply → usable cluster (all but the first row)**".to_owned(),
        format!("**{}**", fmt_duration(b.total)),
    ]);
    let mut progress = Table::new(&["since Bootstrap", "HealthCheck progress"]);
    for (at, message) in &b.progress {
        progress.row(vec![fmt_duration(*at), message.clone()]);
    }
    Section::new("Bootstrap one cluster")
        .text(format!(
            "Machine {target} (after the probes): a generated controlplane config for Talos \
             {TALOS_VERSION} / Kubernetes {KUBERNETES_VERSION}, then our client. The emulator's \
             Bootstrap starts a real test-bed control plane (etcd, kube-apiserver, \
             kube-controller-manager, kube-scheduler, KWOK) on the machine's address."
        ))
        .table(table)
        .table(progress)
}

fn tree_section(pid: u32) -> Section {
    let tree = procfs::tree(pid);
    let mut table = Table::new(&["process", "pid", "VmRSS", "VmHWM"]);
    let (mut rss, mut hwm) = (0, 0);
    for m in &tree {
        let ProcMemory {
            pid,
            name,
            rss_kib,
            hwm_kib,
            ..
        } = m;
        rss += rss_kib;
        hwm += hwm_kib;
        table.row(vec![
            name.clone(),
            pid.to_string(),
            fmt_kib(*rss_kib),
            fmt_kib(*hwm_kib),
        ]);
    }
    table.row(vec![
        format!("**total ({} processes)**", tree.len()),
        String::new(),
        format!("**{}**", fmt_kib(rss)),
        format!("**{}**", fmt_kib(hwm)),
    ]);
    Section::new("Memory after bootstrap (emulator process tree)")
        .text(
            "The emulator and its descendants (the control plane's processes), `/proc/<pid>/status` \
             right after the checks above. Sums of RSS count shared pages more than once.",
        )
        .table(table)
}
