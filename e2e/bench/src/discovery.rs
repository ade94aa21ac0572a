//! `kontinuum-bench discovery`: instance-discovery and pool-claimer at scale (issue 4,
//! acceptance 8). A real control plane from the test bed, the emulator with N
//! maintenance-mode machines, N Instances; then the two operators as processes with their
//! own ServiceAccounts: wall time until every Instance is `Discovered`, API writes per
//! Instance (from the API server's audit log), operator RSS and CPU time; and claiming all
//! N Instances across P pools.

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use futures::{StreamExt as _, stream};
use kontinuum_crds::conditions;
use kontinuum_crds::v1alpha2::{Instance, InstancePool};
use kontinuum_e2e::testbed::{ControlPlane, ControlPlaneConfig, Tools, unique_dir};
use kontinuum_e2e::{
    INSTANCE_DISCOVERY_ROLE, Operator, POOL_CLAIMER_ROLE, audit_writes, install_kontinuum_crds,
    install_operator_roles, namespace, service_account_kubeconfig_for, service_account_user,
};
use kube::Client;
use kube::api::{Api, ListParams, PostParams};

use crate::bootstrap::operator_binary;
use crate::emulator::{EmulatorProcess, Options, default_binary};
use crate::report::{Environment, Report, Section, Table};
use crate::say;
use crate::stats::fmt_duration;

/// Arguments of `kontinuum-bench discovery`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Emulated machines and Instances.
    #[arg(long, default_value_t = 1000)]
    machines: usize,
    /// Pools the Instances are claimed by (machines / pools each).
    #[arg(long, default_value_t = 10)]
    pools: usize,
    /// instance-discovery's `--concurrency`.
    #[arg(long, default_value_t = 64)]
    concurrency: u16,
    /// Where to write the Markdown report.
    #[arg(long, default_value = "bench-results/discovery.md")]
    out: PathBuf,
    /// Give up after this many seconds per phase.
    #[arg(long, default_value_t = 600)]
    timeout_seconds: u64,
}

async fn count(instances: &Api<Instance>, condition: &str) -> anyhow::Result<usize> {
    Ok(instances
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .filter(|i| {
            i.status
                .as_ref()
                .is_some_and(|s| conditions::is_true(&s.conditions, condition))
        })
        .count())
}

/// Polls until `done` or the phase times out; returns the elapsed time.
async fn until<F, Fut>(limit: Duration, what: &str, mut done: F) -> anyhow::Result<Duration>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<bool>>,
{
    let start = Instant::now();
    while !done().await? {
        if start.elapsed() > limit {
            bail!("{what} did not happen within {limit:?}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Ok(start.elapsed())
}

/// The operators, in the order of the footprint table.
const OPERATORS: [&str; 5] = [
    "instance-discovery",
    "pool-claimer",
    "talos-bootstrapper",
    "addon-installer",
    "zone-installer",
];

/// How long an operator runs, ready, before its footprint is read.
const SETTLE: Duration = Duration::from_secs(10);

/// `name` with admin credentials for `ns`, with the flags it needs to start at all.
async fn start_plain(
    name: &str,
    kubeconfig: &std::path::Path,
    ns: &str,
) -> anyhow::Result<Operator> {
    let mut args = vec!["--namespace", ns];
    if name == "zone-installer" {
        args.extend([
            "--insecure-allow-anonymous",
            "true",
            "--hub-grpc-endpoint",
            "127.0.0.1:2379",
        ]);
    }
    Operator::start(&operator_binary(name)?, name, kubeconfig, &args).await
}

/// What a ready operator costs: its RSS after [`SETTLE`], and the CPU time it used in it.
async fn settle(operator: &Operator) -> Footprint {
    let pid = operator.pid().unwrap_or_default();
    let before = crate::procfs::cpu_time(pid).unwrap_or_default();
    tokio::time::sleep(SETTLE).await; // the measurement window itself
    Footprint {
        rss_kib: crate::procfs::memory(pid).unwrap_or_default().rss_kib,
        cpu: crate::procfs::cpu_time(pid)
            .unwrap_or_default()
            .saturating_sub(before),
    }
}

struct Footprint {
    rss_kib: u64,
    cpu: Duration,
}

struct Phase {
    wall: Duration,
    writes: usize,
    rss_kib: u64,
    hwm_kib: u64,
    cpu: Duration,
}

fn phase_row(name: &str, n: usize, phase: &Phase) -> Vec<String> {
    #[allow(clippy::cast_precision_loss, reason = "counts far below 2^52")]
    let per = phase.writes as f64 / n.max(1) as f64;
    vec![
        name.to_string(),
        n.to_string(),
        fmt_duration(phase.wall),
        phase.writes.to_string(),
        format!("{per:.2}"),
        crate::stats::fmt_kib(phase.rss_kib),
        crate::stats::fmt_kib(phase.hwm_kib),
        fmt_duration(phase.cpu),
    ]
}

fn measure(operator: &Operator, wall: Duration, writes: usize) -> Phase {
    let pid = operator.pid().unwrap_or_default();
    let memory = crate::procfs::memory(pid).unwrap_or_default();
    Phase {
        wall,
        writes,
        rss_kib: memory.rss_kib,
        hwm_kib: memory.hwm_kib,
        cpu: crate::procfs::cpu_time(pid).unwrap_or_default(),
    }
}

/// Runs the benchmark and returns the rendered report.
#[allow(
    clippy::too_many_lines,
    reason = "one linear script: set up, two measured phases, report"
)]
pub async fn run(args: Args) -> anyhow::Result<String> {
    let limit = Duration::from_secs(args.timeout_seconds);
    let environment = Environment::capture();
    let tools = Tools::locate().context("locating the test-bed tools (KONTINUUM_TESTBED_BIN)")?;
    say("starting a control plane");
    let cp = ControlPlane::start(
        &tools,
        ControlPlaneConfig::new(unique_dir("bench-discovery")),
    )
    .await
    .context("starting the control plane")?;
    let client: Client = cp.client();
    install_kontinuum_crds(&client).await?;
    install_operator_roles(&client).await?;
    let ns = namespace(&client, "bench").await?;

    // Every operator with nothing to do: a namespace of its own, empty.
    let idle_ns = namespace(&client, "bench-idle").await?;
    let mut idle = Vec::new();
    for name in OPERATORS {
        say(&format!("{name}: idle"));
        let operator = start_plain(name, cp.kubeconfig_path(), &idle_ns).await?;
        idle.push(settle(&operator).await);
    }

    say(&format!(
        "starting the emulator with {} machines",
        args.machines
    ));
    let emulator = EmulatorProcess::start(&Options {
        binary: default_binary(),
        machines: args.machines,
        first_address: Ipv4Addr::new(127, 21, 0, 1),
        port: 50000,
        dir: unique_dir("bench-discovery-emulator"),
        log_level: "warn".into(),
        start_timeout: Duration::from_secs(120),
    })
    .await?;
    if emulator.addresses.iter().any(|a| a.port() != 50000) {
        bail!("the emulator could not bind port 50000 (Instances name addresses without ports)");
    }

    say(&format!("creating {} Instances", args.machines));
    let instances: Api<Instance> = Api::namespaced(client.clone(), &ns);
    let pools = args.pools.max(1);
    let created: Vec<anyhow::Result<()>> = stream::iter(emulator.addresses.iter().enumerate())
        .map(|(i, address)| {
            let instances = instances.clone();
            async move {
                let instance: Instance = serde_json::from_value(serde_json::json!({
                    "apiVersion": "kontinuum.sh/v1alpha2", "kind": "Instance",
                    "metadata": { "name": format!("m-{i:05}"), "labels": { "kontinuum.sh/zone": format!("z{}", i % pools) } },
                    "spec": { "interfaces": [address.ip().to_string()] }
                }))?;
                instances.create(&PostParams::default(), &instance).await?;
                Ok(())
            }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    created
        .into_iter()
        .collect::<anyhow::Result<Vec<()>>>()
        .context("creating Instances")?;

    let log = cp.audit_log();
    let discovery_user = service_account_user(&ns, "instance-discovery");
    let claimer_user = service_account_user(&ns, "pool-claimer");
    let discovery_config = service_account_kubeconfig_for(
        &client,
        cp.kubeconfig_yaml(),
        cp.dir(),
        &ns,
        "instance-discovery",
        INSTANCE_DISCOVERY_ROLE,
    )
    .await?;
    let claimer_config = service_account_kubeconfig_for(
        &client,
        cp.kubeconfig_yaml(),
        cp.dir(),
        &ns,
        "pool-claimer",
        POOL_CLAIMER_ROLE,
    )
    .await?;

    say("discovering");
    let concurrency = args.concurrency.to_string();
    let started = Instant::now();
    let discovery = Operator::start(
        &operator_binary("instance-discovery")?,
        "instance-discovery",
        &discovery_config,
        &["--namespace", &ns, "--concurrency", &concurrency],
    )
    .await?;
    until(limit, "every Instance Discovered", || async {
        Ok(count(&instances, "Discovered").await? == args.machines)
    })
    .await?;
    let discovery_phase = measure(
        &discovery,
        started.elapsed(),
        audit_writes(&log, &discovery_user)?.len(),
    );

    say("claiming");
    let claimer = Operator::start(
        &operator_binary("pool-claimer")?,
        "pool-claimer",
        &claimer_config,
        &["--namespace", &ns],
    )
    .await?;
    let per_pool = args.machines / pools;
    let pool_api: Api<InstancePool> = Api::namespaced(client.clone(), &ns);
    let started = Instant::now();
    for p in 0..pools {
        let pool: InstancePool = serde_json::from_value(serde_json::json!({
            "apiVersion": "kontinuum.sh/v1alpha2", "kind": "InstancePool",
            "metadata": { "name": format!("pool-{p}") },
            "spec": { "replicas": per_pool, "selector": { "matchLabels": { "kontinuum.sh/zone": format!("z{p}") } } }
        }))?;
        pool_api.create(&PostParams::default(), &pool).await?;
    }
    let expected = i32::try_from(per_pool)?;
    until(limit, "every pool Ready with all its replicas", || async {
        let list = pool_api.list(&ListParams::default()).await?;
        Ok(list.items.len() == pools
            && list.items.iter().all(|p| {
                p.status.as_ref().is_some_and(|s| {
                    s.claimed_replicas == Some(expected)
                        && conditions::is_true(&s.conditions, "Ready")
                })
            }))
    })
    .await?;
    let claim_phase = measure(
        &claimer,
        started.elapsed(),
        audit_writes(&log, &claimer_user)?.len(),
    );

    // Converged with every Instance and pool present: the three operators that did nothing
    // yet join (they cache Instances too), and all five are measured over the same window.
    let mut others = Vec::new();
    for name in &OPERATORS[2..] {
        others.push(start_plain(name, cp.kubeconfig_path(), &ns).await?);
    }
    let loaded = futures::future::join_all(
        [&discovery, &claimer]
            .into_iter()
            .chain(&others)
            .map(settle),
    )
    .await;

    let mut report = Report::new("Discovery and claim benchmark", environment);
    let mut table = Table::new(&[
        "phase",
        "objects",
        "wall",
        "API writes",
        "writes per object",
        "operator RSS",
        "RSS peak",
        "operator CPU",
    ]);
    table.row(phase_row(
        &format!(
            "instance-discovery: {} Instances to Discovered",
            args.machines
        ),
        args.machines,
        &discovery_phase,
    ));
    table.row(phase_row(
        &format!(
            "pool-claimer: {} Instances claimed by {pools} pools",
            per_pool * pools
        ),
        per_pool * pools,
        &claim_phase,
    ));
    report.push(
        Section::new("Results")
            .text(format!(
                "A real control plane (test bed), the Talos emulator as a child process with {} maintenance-mode machines on 127.21.0.1 upwards, port 50000, and the release builds of both operators as processes, each with its own ServiceAccount. instance-discovery runs with `--concurrency {}`. Wall time from starting the operator (discovery) or creating the pools (claim) until the condition holds; writes are the operator's write requests in the API server's audit log (status patches, claim labels, Events, finalizer updates); RSS and CPU time from `/proc` at the end of each phase.",
                args.machines, args.concurrency
            ))
            .table(table),
    );
    let mut footprint = Table::new(&[
        "operator",
        "RSS idle (nothing to do)",
        "CPU idle (per 10 s)",
        &format!("RSS with {} Instances, {pools} pools", args.machines),
        "CPU converged (per 10 s)",
        "targets (idle / loaded)",
    ]);
    for ((name, idle), loaded) in OPERATORS.iter().zip(&idle).zip(&loaded) {
        footprint.row(vec![
            (*name).to_string(),
            crate::stats::fmt_kib(idle.rss_kib),
            fmt_duration(idle.cpu),
            crate::stats::fmt_kib(loaded.rss_kib),
            fmt_duration(loaded.cpu),
            "< 20 MiB / < 100 MiB".into(),
        ]);
    }
    report.push(
        Section::new("Footprint")
            .text(format!(
                "Each operator (release build, admin credentials, `--namespace` set) first alone in an empty namespace, then in the benchmark's namespace after every Instance is Discovered and claimed ({} Instances, {pools} InstancePools, no TalosCluster: bootstrapping them would start a control plane per cluster, which this machine cannot hold). RSS is VmRSS after the operator was ready and {}s more passed; CPU is the CPU time it used in that window.",
                args.machines,
                SETTLE.as_secs()
            ))
            .table(footprint),
    );
    drop(others);
    drop(discovery);
    drop(claimer);
    emulator.stop(Duration::from_secs(10)).await?;
    cp.stop().await;
    report.write_to(&args.out)
}
