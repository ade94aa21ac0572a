//! `kontinuum-bench bootstrap`: TalosCluster creation to `Ready` through the operators,
//! per step, against the floor: the same steps driven directly by the client library
//! (issue 5, acceptance 6). A real hub control plane from the test bed; the emulator as a
//! process (each bootstrap starts a real downstream control plane); instance-discovery,
//! pool-claimer and talos-bootstrapper as processes with their own ServiceAccounts. Addons
//! are marked `Ready` the moment they appear (a watch), as the issue asks.
//!
//! Each run uses a fresh maintenance-mode machine for each path, and the two paths
//! alternate (floor, operator, floor, …) so neither gets the quieter machine.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use futures::StreamExt as _;
use kontinuum_crds::conditions;
use kontinuum_crds::v1alpha2::{Instance, TalosCluster};
use kontinuum_e2e::bootstrapper::{
    AddonsReady, TALOS_BOOTSTRAPPER_ROLE, create_cluster, install_role,
};
use kontinuum_e2e::testbed::{ControlPlane, ControlPlaneConfig, Tools, unique_dir};
use kontinuum_e2e::{
    INSTANCE_DISCOVERY_ROLE, Operator, POOL_CLAIMER_ROLE, install_kontinuum_crds, namespace,
    service_account_kubeconfig_for,
};
use kontinuum_talos::{ApplyMode, ClientIdentity, Endpoint, ResetOptions, TalosClient, Timeouts};
use kontinuum_talos_config::{
    ConfigInput, MachineType, SecretsBundle, TalosVersion, admin_talosconfig, render_machine_config,
};
use kube::api::{Api, DeleteParams, PostParams};
use kube::runtime::wait::{await_condition, conditions::is_deleted};
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Client, ResourceExt as _};

use crate::emulator::{EmulatorProcess, Options, default_binary};
use crate::report::{Environment, Report, Section, Table};
use crate::say;
use crate::stats::{fmt_duration, summarize};

/// Arguments of `kontinuum-bench bootstrap`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Clusters bootstrapped by each path.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Where to write the Markdown report.
    #[arg(long, default_value = "bench-results/bootstrap.md")]
    out: PathBuf,
    /// Give up on one run after this many seconds.
    #[arg(long, default_value_t = 300)]
    timeout_seconds: u64,
}

const STEPS: [&str; 5] = [
    "secrets bundle stored",
    "Configured (ApplyConfiguration)",
    "Bootstrapped",
    "KubeconfigAvailable",
    "ControlPlaneReady (HealthCheck)",
];

/// `target/<profile>/<name>`, next to this benchmark's executable.
pub(crate) fn operator_binary(name: &str) -> anyhow::Result<PathBuf> {
    let path = std::env::current_exe()?
        .parent()
        .context("locating the target directory")?
        .join(name);
    if !path.is_file() {
        bail!(
            "{} is missing: cargo build --release -p {name}",
            path.display()
        );
    }
    Ok(path)
}

/// `name` (a binary next to this benchmark) for `ns` as a process, with a ServiceAccount of
/// its own in `ns` bound to ClusterRole `role`, and `args` after `--namespace <ns>`.
pub(crate) async fn start_operator(
    hub: &ControlPlane,
    ns: &str,
    name: &str,
    role: &str,
    args: &[&str],
) -> anyhow::Result<Operator> {
    let client = hub.client();
    let kubeconfig =
        service_account_kubeconfig_for(&client, hub.kubeconfig_yaml(), hub.dir(), ns, name, role)
            .await?;
    let mut all = vec!["--namespace", ns];
    all.extend_from_slice(args);
    Operator::start(&operator_binary(name)?, name, &kubeconfig, &all).await
}

/// instance-discovery, pool-claimer and talos-bootstrapper for `ns`, each with the chart's
/// rules ([`install_role`]): discovery retries after 1 s, 2048-bit service-account keys,
/// `bootstrapper` more flags of talos-bootstrapper.
pub(crate) async fn start_cluster_operators(
    hub: &ControlPlane,
    ns: &str,
    bootstrapper: &[&str],
) -> anyhow::Result<Vec<Operator>> {
    install_role(&hub.client()).await?;
    let mut talos = vec!["--service-account-key-bits", "2048"];
    talos.extend_from_slice(bootstrapper);
    let mut operators = Vec::new();
    for (name, role, args) in [
        (
            "instance-discovery",
            INSTANCE_DISCOVERY_ROLE,
            vec!["--retry-seconds", "1"],
        ),
        ("pool-claimer", POOL_CLAIMER_ROLE, vec![]),
        ("talos-bootstrapper", TALOS_BOOTSTRAPPER_ROLE, talos),
    ] {
        operators.push(start_operator(hub, ns, name, role, &args).await?);
    }
    Ok(operators)
}

/// A machine the floor bootstrapped: its `os:admin` client and the cluster's kubeconfig.
pub(crate) struct FloorCluster {
    address: Ipv4Addr,
    client: TalosClient,
    /// The admin kubeconfig (YAML).
    pub kubeconfig: String,
}

impl FloorCluster {
    /// The talos-bootstrapper's steps up to the kubeconfig, in its order, by the client
    /// library alone: secrets bundle (RSA 2048), ApplyConfiguration (maintenance mode),
    /// Bootstrap, Kubeconfig. After each, the time since `started` is pushed onto `marks`.
    pub(crate) async fn bootstrap(
        address: Ipv4Addr,
        hostname: &str,
        started: Instant,
        marks: &mut Vec<Duration>,
    ) -> anyhow::Result<Self> {
        let timeouts = Timeouts::default();
        let version = TalosVersion::parse("v1.13.0")?;
        let bundle = tokio::task::spawn_blocking(move || {
            SecretsBundle::generate_with_rsa_bits(
                &mut rand_core::OsRng,
                jiff::Timestamp::now(),
                &version,
                2048,
            )
        })
        .await??;
        let _json = bundle.to_json()?;
        marks.push(started.elapsed());
        let endpoint = Endpoint::new(address.to_string(), 50000)?;
        let input = ConfigInput::new(
            hostname,
            address.to_string(),
            TalosVersion::parse("v1.13.8")?,
            "1.32.0",
        );
        let config = render_machine_config(&input, &bundle, MachineType::ControlPlane, hostname)?;
        TalosClient::connect_maintenance(&endpoint, timeouts)
            .await?
            .apply_configuration(config.expose().as_bytes().to_vec(), ApplyMode::Reboot)
            .await?;
        marks.push(started.elapsed());
        let admin = admin_talosconfig(
            &bundle,
            hostname,
            &[],
            &[],
            jiff::Timestamp::now(),
            &mut rand_core::OsRng,
        )?;
        let identity = ClientIdentity::new(
            admin.identity.ca_pem,
            admin.identity.cert_pem,
            admin.identity.key_pem.expose(),
        );
        let client = TalosClient::connect(&endpoint, &identity, timeouts).await?;
        client.bootstrap().await?;
        marks.push(started.elapsed());
        let kubeconfig = String::from_utf8(client.kubeconfig().await?.into_bytes())
            .context("the kubeconfig is not UTF-8")?;
        marks.push(started.elapsed());
        Ok(Self {
            address,
            client,
            kubeconfig,
        })
    }

    /// The Talos cluster health check (etcd, the API server, every node Ready), waiting up
    /// to 30 s on the machine's side, as the operator's `ControlPlaneReady` gate calls it.
    pub(crate) async fn health_check(&self) -> anyhow::Result<()> {
        self.client
            .health_check(
                Duration::from_secs(30),
                &[self.address.to_string()],
                &[],
                |_| {},
            )
            .await?;
        Ok(())
    }

    /// Back to maintenance mode, which stops the cluster (not measured).
    pub(crate) async fn reset(&self) -> anyhow::Result<()> {
        self.client
            .reset(&ResetOptions::to_maintenance(false))
            .await?;
        Ok(())
    }
}

/// The floor: the operator's steps, in its order, by the client library alone.
async fn floor(address: Ipv4Addr, hostname: &str) -> anyhow::Result<(Vec<Duration>, Duration)> {
    let started = Instant::now();
    let mut marks = Vec::new();
    let cluster = FloorCluster::bootstrap(address, hostname, started, &mut marks).await?;
    cluster.health_check().await?;
    marks.push(started.elapsed());
    let total = started.elapsed();
    cluster.reset().await?;
    Ok((marks, total))
}

/// What one operator run saw, for the reaction times: the wall-clock times (Unix ms, every
/// field) of the
/// events that enable a step, from the benchmark's watches.
#[derive(Clone, Debug, Default)]
struct Enablers {
    /// The later of the bundle's Secret appearing and the Instance being claimed.
    configure: u64,
    /// The Cilium Addon seen `Ready`.
    cilium_ready: u64,
    /// The TalosCluster seen `Ready`.
    ready: u64,
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// One watched change of an operator run.
enum Change {
    Secret,
    Claimed,
    CiliumReady,
    Cluster(Box<TalosCluster>),
}

/// One operator run: TalosCluster creation → Ready, with the first time each condition was
/// seen True (from a watch), and the enabling events' wall-clock times.
#[allow(
    clippy::too_many_lines,
    reason = "one watch loop over four streams, then the marks"
)]
async fn operator_run(
    client: &Client,
    ns: &str,
    name: &str,
    instance: &str,
    limit: Duration,
) -> anyhow::Result<(Vec<Duration>, Duration, Enablers)> {
    let clusters: Api<TalosCluster> = Api::namespaced(client.clone(), ns);
    let selector = format!("metadata.name={name}");
    // The bundle has a Secret of its own (status names only the kubeconfig's): its first
    // appearance is the "secrets bundle stored" mark.
    let bundle_secret = kontinuum_crds::v1alpha2::secrets_secret_name(name);
    let bundle_stored = watcher(
        Api::<kube::core::PartialObjectMeta<k8s_openapi::api::core::v1::Secret>>::namespaced(
            client.clone(),
            ns,
        ),
        watcher::Config::default().fields(&format!("metadata.name={bundle_secret}")),
    )
    .applied_objects()
    .map(|r| r.map(|_| Some(Change::Secret)))
    .boxed();
    let claimed = watcher(
        Api::<Instance>::namespaced(client.clone(), ns),
        watcher::Config::default().fields(&format!("metadata.name={instance}")),
    )
    .applied_objects()
    .map(|r| {
        r.map(|i| {
            i.labels()
                .contains_key(kontinuum_crds::labels::CLAIMED_BY)
                .then_some(Change::Claimed)
        })
    })
    .boxed();
    let cilium = kontinuum_crds::names::builtin_addon_name(name, "cilium")?;
    let cilium_ready = watcher(
        Api::<kontinuum_crds::v1alpha2::Addon>::namespaced(client.clone(), ns),
        watcher::Config::default().fields(&format!("metadata.name={cilium}")),
    )
    .applied_objects()
    .map(|r| {
        r.map(|a| {
            a.status
                .is_some_and(|s| conditions::is_true(&s.conditions, "Ready"))
                .then_some(Change::CiliumReady)
        })
    })
    .boxed();
    let cluster_changes = watcher(
        clusters.clone(),
        watcher::Config::default().fields(&selector),
    )
    .applied_objects()
    .map(|r| r.map(|c| Some(Change::Cluster(Box::new(c)))))
    .boxed();
    let mut stream =
        futures::stream::select_all([bundle_stored, claimed, cilium_ready, cluster_changes]);
    let mut walls: BTreeMap<&str, u64> = BTreeMap::new();
    let started = Instant::now();
    create_cluster(client, ns, name, 1, 0, false).await?;
    let mut seen: BTreeMap<&str, Duration> = BTreeMap::new();
    let wanted = [
        "Bootstrapped",
        "KubeconfigAvailable",
        "ControlPlaneReady",
        "Ready",
    ];
    let deadline = tokio::time::Instant::now() + limit;
    while !seen.contains_key("Ready") {
        let next = tokio::time::timeout_at(deadline, stream.next())
            .await
            .context("the run did not reach Ready in time")?;
        let Some(change) = next.transpose()? else {
            bail!("the watch ended");
        };
        let at = started.elapsed();
        let wall = unix_ms();
        let cluster = match change {
            None => continue,
            Some(Change::Secret) => {
                seen.entry("secret").or_insert(at);
                walls.entry("secret").or_insert(wall);
                continue;
            }
            Some(Change::Claimed) => {
                walls.entry("claimed").or_insert(wall);
                continue;
            }
            Some(Change::CiliumReady) => {
                walls.entry("cilium").or_insert(wall);
                continue;
            }
            Some(Change::Cluster(cluster)) => cluster,
        };
        if conditions::is_true(
            &cluster
                .status
                .as_ref()
                .map(|s| s.conditions.clone())
                .unwrap_or_default(),
            "Ready",
        ) {
            walls.entry("ready").or_insert(wall);
        }
        let status = cluster.status.unwrap_or_default();
        if !status.configured_instances.is_empty() {
            seen.entry("configured").or_insert(at);
        }
        for c in wanted {
            if conditions::is_true(&status.conditions, c) {
                seen.entry(c).or_insert(at);
            }
        }
    }
    let total = seen.get("Ready").copied().unwrap_or_default();
    let secret = seen.get("secret").copied().unwrap_or_default();
    // Configured and the secret land in the same status write as Bootstrapped when the
    // flow does not pause in between; the first status write carries all three.
    let configured = seen.get("configured").copied().unwrap_or(secret);
    let marks = vec![
        secret,
        configured,
        seen.get("Bootstrapped").copied().unwrap_or_default(),
        seen.get("KubeconfigAvailable").copied().unwrap_or_default(),
        seen.get("ControlPlaneReady").copied().unwrap_or_default(),
    ];
    let wall = |k| walls.get(k).copied().unwrap_or_default();
    let enablers = Enablers {
        configure: wall("secret").max(wall("claimed")),
        cilium_ready: wall("cilium"),
        ready: wall("ready"),
    };
    Ok((marks, total, enablers))
}

/// A call the emulator recorded (`GET /machines/<ip>/calls`).
#[derive(Clone, Debug, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct Call {
    rpc: String,
    started_ms: u64,
    ended_ms: Option<u64>,
    ok: Option<bool>,
}

/// The calls the emulator recorded for the machine at `address`, over its control interface.
async fn emulator_calls(
    control: std::net::SocketAddr,
    address: Ipv4Addr,
) -> anyhow::Result<Vec<Call>> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut stream = tokio::net::TcpStream::connect(control).await?;
    let request = format!(
        "GET /machines/{address}/calls HTTP/1.1\r\nHost: {control}\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await?;
    let mut answer = String::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_string(&mut answer))
        .await
        .context("the emulator's control interface did not answer")??;
    let (head, body) = answer
        .split_once("\r\n\r\n")
        .context("no HTTP body from the control interface")?;
    if !head.starts_with("HTTP/1.1 200") {
        bail!("GET calls: {head}");
    }
    Ok(serde_json::from_str(body.trim())?)
}

/// One run's operator reaction per step (from the event that enables the step to the
/// step's call arriving at the machine) and the step's own duration, in ms.
#[derive(Clone, Debug, Default)]
struct Reactions {
    /// (reaction, step duration) per [`REACTION_STEPS`] entry; `None` when not found.
    steps: Vec<Option<(u64, u64)>>,
}

const REACTION_STEPS: [(&str, &str); 5] = [
    (
        "ApplyConfiguration",
        "bundle stored and Instance claimed → ApplyConfiguration",
    ),
    ("Bootstrap", "ApplyConfiguration answered → Bootstrap"),
    ("Kubeconfig", "Bootstrap answered → Kubeconfig"),
    ("HealthCheck", "Cilium Addon `Ready` → HealthCheck"),
    ("Ready", "HealthCheck passed → TalosCluster `Ready`"),
];

fn reactions(calls: &[Call], enablers: &Enablers) -> Reactions {
    let first_after = |rpc: &str, after: u64| {
        calls
            .iter()
            .find(|c| c.rpc == rpc && c.started_ms >= after)
            .map(|c| (c.started_ms, c.ended_ms.unwrap_or(c.started_ms)))
    };
    let span = |enabled: u64, call: Option<(u64, u64)>| {
        call.map(|(start, end)| (start.saturating_sub(enabled), end.saturating_sub(start)))
    };
    let apply = first_after("ApplyConfiguration", 0);
    let apply_end = apply.map_or(0, |(_, e)| e);
    let bootstrap = first_after("Bootstrap", apply_end);
    let bootstrap_end = bootstrap.map_or(0, |(_, e)| e);
    let kubeconfig = first_after("Kubeconfig", bootstrap_end);
    let health = first_after("HealthCheck", enablers.cilium_ready);
    let passed = calls
        .iter()
        .filter(|c| c.rpc == "HealthCheck" && c.ok == Some(true))
        .find_map(|c| c.ended_ms);
    Reactions {
        steps: vec![
            span(enablers.configure, apply),
            span(apply_end, bootstrap),
            span(bootstrap_end, kubeconfig),
            span(enablers.cilium_ready, health),
            passed.map(|p| (enablers.ready.saturating_sub(p), 0)),
        ],
    }
}

/// Runs the benchmark and returns the rendered report.
#[allow(
    clippy::too_many_lines,
    reason = "one linear script: set up, alternate runs, report"
)]
pub async fn run(args: Args) -> anyhow::Result<String> {
    let limit = Duration::from_secs(args.timeout_seconds);
    let environment = Environment::capture();
    let tools = Tools::locate().context("locating the test-bed tools (KONTINUUM_TESTBED_BIN)")?;
    say("starting the hub control plane");
    let hub = ControlPlane::start(
        &tools,
        ControlPlaneConfig::new(unique_dir("bench-bootstrap")),
    )
    .await
    .context("starting the hub")?;
    let client = hub.client();
    install_kontinuum_crds(&client).await?;
    let ns = namespace(&client, "bench-bootstrap").await?;
    let runs = args.runs.max(1);
    let emulator = EmulatorProcess::start(&Options {
        binary: default_binary(),
        machines: runs * 2,
        first_address: Ipv4Addr::new(127, 23, 0, 1),
        port: 50000,
        dir: unique_dir("bench-bootstrap-emulator"),
        log_level: "warn".into(),
        start_timeout: Duration::from_secs(60),
    })
    .await?;
    let addresses = emulator.ipv4_addresses()?;

    let operators = start_cluster_operators(&hub, &ns, &[]).await?;
    let marker = AddonsReady::start(client.clone(), ns.clone());

    let mut floor_runs = Vec::new();
    let mut operator_runs = Vec::new();
    let mut reaction_runs = Vec::new();
    for run in 0..runs {
        let floor_address = addresses[2 * run];
        say(&format!("run {run}: floor on {floor_address}"));
        floor_runs.push(
            tokio::time::timeout(limit, floor(floor_address, &format!("floor-{run}")))
                .await
                .context("floor run timed out")??,
        );

        let address = addresses[2 * run + 1];
        let instance_name = format!("m-{run}");
        let instance: Instance = serde_json::from_value(serde_json::json!({
            "apiVersion": "kontinuum.sh/v1alpha2", "kind": "Instance",
            "metadata": { "name": instance_name, "labels": { "role": "cp" } },
            "spec": { "interfaces": [address.to_string()] }
        }))?;
        let instances: Api<Instance> = Api::namespaced(client.clone(), &ns);
        instances.create(&PostParams::default(), &instance).await?;
        let discovered =
            await_condition(instances.clone(), &instance_name, |i: Option<&Instance>| {
                i.and_then(|i| i.status.as_ref())
                    .is_some_and(|s| conditions::is_true(&s.conditions, "Discovered"))
            });
        tokio::time::timeout(limit, discovered)
            .await
            .context("discovery timed out")??;
        say(&format!("run {run}: operators on {address}"));
        let cluster = format!("bench-{run}");
        let (marks, total, enablers) =
            operator_run(&client, &ns, &cluster, &instance_name, limit).await?;
        operator_runs.push((marks, total));
        let control = emulator
            .control
            .context("the emulator printed no control address")?;
        reaction_runs.push(reactions(
            &emulator_calls(control, address).await?,
            &enablers,
        ));
        // Teardown (not measured): the machine back to maintenance, the Instance released,
        // then removed so the next run's pool claims only its own machine.
        let clusters: Api<TalosCluster> = Api::namespaced(client.clone(), &ns);
        let uid = clusters.get(&cluster).await?.uid().unwrap_or_default();
        clusters.delete(&cluster, &DeleteParams::default()).await?;
        let gone = await_condition(clusters.clone(), &cluster, is_deleted(&uid));
        tokio::time::timeout(limit, gone)
            .await
            .context("teardown timed out")??;
        instances
            .delete(&instance_name, &DeleteParams::default())
            .await?;
    }
    drop(marker);

    let mut table = Table::new(&[
        "step (time since start)",
        "floor p50",
        "operator p50",
        "operator − floor",
    ]);
    for (i, step) in STEPS.iter().enumerate() {
        let f: Vec<Duration> = floor_runs.iter().map(|(m, _)| m[i]).collect();
        let o: Vec<Duration> = operator_runs.iter().map(|(m, _)| m[i]).collect();
        let (f, o) = (summarize(&f).p50, summarize(&o).p50);
        table.row(vec![
            (*step).to_owned(),
            fmt_duration(f),
            fmt_duration(o),
            signed(o, f),
        ]);
    }
    let f_total: Vec<Duration> = floor_runs.iter().map(|(_, t)| *t).collect();
    let o_total: Vec<Duration> = operator_runs.iter().map(|(_, t)| *t).collect();
    let (f, o) = (summarize(&f_total), summarize(&o_total));
    table.row(vec![
        "**total: floor done / operator `Ready`**".to_owned(),
        format!("**{}**", fmt_duration(f.p50)),
        format!("**{}**", fmt_duration(o.p50)),
        format!("**{}**", signed(o.p50, f.p50)),
    ]);
    let mut each = Table::new(&["run", "floor total", "operator total"]);
    for (i, (fr, or)) in floor_runs.iter().zip(&operator_runs).enumerate() {
        each.row(vec![i.to_string(), fmt_duration(fr.1), fmt_duration(or.1)]);
    }
    #[allow(clippy::cast_precision_loss, reason = "durations far below 2^52 ms")]
    let overhead =
        (o.p50.as_secs_f64() - f.p50.as_secs_f64()) / f.p50.as_secs_f64().max(f64::EPSILON) * 100.0;
    let mut report = Report::new("TalosCluster bootstrap benchmark", environment);
    report.push(
        Section::new("Creation to Ready: operator against the client-library floor")
            .text(format!(
                "{runs} run(s) per path, alternating. Floor: secrets bundle (RSA 2048) → \
                 ApplyConfiguration → Bootstrap → Kubeconfig → HealthCheck, one call after \
                 another. Operator: `kubectl create` of the TalosCluster and its pool (the \
                 Instance already Discovered) → `Ready`, timestamps from a watch; Addons are \
                 marked `Ready` by a watch the moment they appear. Both with 2048-bit \
                 service-account keys (production default 4096). Operator overhead at p50: \
                 {:.2} s ({overhead:.1} %).",
                o.p50.as_secs_f64() - f.p50.as_secs_f64()
            ))
            .table(table)
            .table(each),
    );
    report.push(reaction_section(&reaction_runs));
    for mut op in operators {
        let _ = op.kill().await;
    }
    emulator.stop(Duration::from_secs(30)).await?;
    hub.stop().await;
    report.write_to(&args.out)
}

/// The operator's reaction per step beside the step's duration, p50 and p99 over the runs.
fn reaction_section(runs: &[Reactions]) -> Section {
    let mut table = Table::new(&[
        "step (enabling event → the step's call arrives)",
        "reaction p50",
        "reaction p99",
        "step duration p50 (the call)",
        "runs",
    ]);
    for (i, (rpc, what)) in REACTION_STEPS.iter().enumerate() {
        let found: Vec<(u64, u64)> = runs
            .iter()
            .filter_map(|r| r.steps.get(i).copied().flatten())
            .collect();
        let reaction: Vec<Duration> = found
            .iter()
            .map(|(r, _)| Duration::from_millis(*r))
            .collect();
        let took: Vec<Duration> = found
            .iter()
            .map(|(_, d)| Duration::from_millis(*d))
            .collect();
        let r = summarize(&reaction);
        let duration = if *rpc == "Ready" {
            "—".to_owned()
        } else {
            fmt_duration(summarize(&took).p50)
        };
        table.row(vec![
            (*what).to_owned(),
            fmt_duration(r.p50),
            fmt_duration(r.p99),
            duration,
            found.len().to_string(),
        ]);
    }
    Section::new("Operator reaction per step")
        .text(
            "How long the operators take to start a step once the event that enables it \
             happened, beside how long the step itself took: the step's start and end are \
             the emulator's record of the call arriving and being answered (`GET \
             /machines/<ip>/calls`); the enabling events are the benchmark's watch \
             timestamps (the bundle's Secret, the Instance's claim label, the Cilium \
             Addon's `Ready`, which the benchmark sets the moment the Addon appears) or the \
             previous call's answer. Millisecond wall clocks of one machine. The \
             configuration step's reaction includes reading the cluster and its Secret, \
             rendering the machine config and the pinned TLS handshake; Bootstrap's two \
             status writes (what was configured, with the members' conditions, then the \
             intent) and an Event; Kubeconfig's the status write of `Bootstrapped`; `Ready`'s the members' \
             Version calls and the status write.",
        )
        .table(table)
}

/// `a − b`, signed: `+1.20 s`, `−35.0 ms`.
pub(crate) fn signed(a: Duration, b: Duration) -> String {
    match a.checked_sub(b) {
        Some(more) => format!("+{}", fmt_duration(more)),
        None => format!("−{}", fmt_duration(b.saturating_sub(a))),
    }
}
