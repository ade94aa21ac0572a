//! `kontinuum-bench zone`: a zone added (`kubectl kontinuum zone add`) to `Ready`, stage by
//! stage, through the operators, against the floor: the same steps driven directly by the
//! operators' libraries, one after another (issue 12, acceptance 6; target: the operators
//! within max(2 s, 10 %) of the floor).
//!
//! Real parts, release builds: a hub control plane of the test bed; the Talos emulator as a
//! process, whose bootstrapped clusters are real control planes with hostlet nodes (the zone
//! agent and its relay run as processes from the objects written into the zone cluster;
//! the addons' pods are pretended Running and Ready); the fixture charts from a local chart
//! repository, installed with the real helm. Each path has a namespace of its own and its
//! own hub zone services: a store (etcd), `etcd-proxy serve` (TLS from a test CA) and
//! `registry hub`, each with a ServiceAccount bound to the chart's rules.
//!
//! * Operator path ([`operator_run`]): instance-discovery, pool-claimer, talos-bootstrapper,
//!   addon-installer and zone-installer as processes with the chart's rules;
//!   `kubectl-kontinuum zone add --wait` with one seed address; each stage's time is the
//!   first watch event that shows it.
//! * Floor path ([`Floor::run`]): no operator runs in its namespace; the benchmark makes the
//!   operators' calls itself, with their libraries, in their order ([`ROWS`] says exactly
//!   which), then waits for its `registry hub` to mirror the agent's registration.
//!
//! Runs alternate (floor, operator, floor, …), each on a fresh maintenance-mode machine.
//! Nothing sleeps in place of a condition: watches, and polls with deadlines.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use addon_installer::{downstream, health, manifests, resolve};
use anyhow::{Context as _, bail};
use clap::Parser as _;
use futures::{Stream, StreamExt as _};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;
use kontinuum_crds::conditions;
use kontinuum_crds::labels::{CLAIMED_BY, REGION as REGION_LABEL, ZONE as ZONE_LABEL};
use kontinuum_crds::names::{builtin_addon_name, seed_instance_name};
use kontinuum_crds::reasons::{
    AddonCondition, InstanceCondition, TalosClusterCondition, ZoneCondition,
};
use kontinuum_crds::v1alpha2::{
    Addon, BuiltinAddon, Instance, InstancePool, Kontinuum, ProvisioningMethod, TalosCluster, Zone,
};
use kontinuum_e2e::addons::{
    ADDON_INSTALLER_ROLE, ChartRepo, install_addon_installer_role, start_addon_installer,
};
use kontinuum_e2e::chart::apply_operator_cluster_roles;
use kontinuum_e2e::testbed::{ControlPlane, ControlPlaneConfig, Tools, unique_dir};
use kontinuum_e2e::{
    Operator, eventually, http_get, install_kontinuum_crds, namespace,
    service_account_kubeconfig_for,
};
use kontinuum_operator_common::claims::set_claim;
use kontinuum_operator_common::kubeconfig;
use kontinuum_operator_common::status::apply_status;
use kontinuum_proto::etcd::{etcdserverpb as pb, mvccpb};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Client, Resource, ResourceExt as _};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use zone_installer::{fanout, footprint, identity};

use crate::bootstrap::{
    FloorCluster, operator_binary, signed, start_cluster_operators, start_operator,
};
use crate::child::Child;
use crate::emulator::{EmulatorProcess, Options, default_binary};
use crate::etcd_proxy::{free_port, log_args, plain_connect, start_proxy, start_store, write_pki};
use crate::report::{Environment, Report, Section, Table};
use crate::say;
use crate::stats::{fmt_duration, summarize};

/// Arguments of `kontinuum-bench zone`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Zones added by each path.
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// Where to write the Markdown report.
    #[arg(long, default_value = "bench-results/zone.md")]
    out: PathBuf,
    /// Give up on one run (or one teardown) after this many seconds.
    #[arg(long, default_value_t = 600)]
    timeout_seconds: u64,
}

/// The region of every zone; the zones are `floor-<run>` and `op-<run>`.
const REGION: &str = "eu";
/// The first emulated machine (the others follow it).
const FIRST_MACHINE: Ipv4Addr = Ipv4Addr::new(127, 24, 0, 1);
const LOCALHOST: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);
/// Where zone agents register in the store.
const ZONES_PREFIX: &str = "/kontinuum.sh/zones/";
/// ClusterRoles with the chart's rules for the processes this benchmark adds to
/// [`start_cluster_operators`]'s.
const ZONE_INSTALLER_ROLE: &str = "kontinuum-zone-installer-bench";
const ETCD_PROXY_ROLE: &str = "kontinuum-etcd-proxy-bench";
const REGISTRY_ROLE: &str = "kontinuum-registry-bench";
/// talos-bootstrapper's flags besides [`start_cluster_operators`]'s.
const BOOTSTRAPPER_FLAGS: [&str; 2] = ["--retry-seconds", "1"];
/// addon-installer's flags besides the chart mirror, helm and its home (the floor's helm
/// calls are made with the same settings).
const ADDON_INSTALLER_FLAGS: [&str; 2] = ["--retry-interval", "1s"];

/// A point in time both paths (or one of them) report, in flow order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Mark {
    FanOut,
    Discovered,
    Claimed,
    Bootstrapped,
    Kubeconfig,
    ControlPlane,
    Addons,
    Installed,
    Registered,
    Joined,
    Ready,
    PluginReturned,
}

/// The times of one run, since its start.
type Marks = BTreeMap<Mark, Duration>;

/// One row of the report: what each path's time of `mark` is.
struct Row {
    mark: Mark,
    stage: &'static str,
    short: &'static str,
    operator: &'static str,
    floor: &'static str,
}

/// Every row, in flow order. The floor's last row is `Joined`: its total.
const ROWS: [Row; 12] = [
    Row {
        mark: Mark::FanOut,
        stage: "fan-out",
        short: "fan-out",
        operator: "the TalosCluster, InstancePool and seed Instance all exist",
        floor: "Zone created; TalosCluster, InstancePool and seed Instance server-side applied as `zone_installer::fanout` renders them",
    },
    Row {
        mark: Mark::Discovered,
        stage: "discovered",
        short: "discovered",
        operator: "Instance `Discovered=True`",
        floor: "maintenance-mode probe (`instance_discovery::talos_prober`: Version, COSI links, addresses, disks) and its status server-side applied",
    },
    Row {
        mark: Mark::Claimed,
        stage: "claimed",
        short: "claimed",
        operator: "Instance labelled `kontinuum.sh/claimed-by`",
        floor: "the Instance read back, then the claim label (`set_claim`: a merge patch carrying its resourceVersion, as pool-claimer writes it)",
    },
    Row {
        mark: Mark::Bootstrapped,
        stage: "bootstrapped",
        short: "bootstrapped",
        operator: "TalosCluster `Bootstrapped=True`",
        floor: "secrets bundle (RSA 2048), ApplyConfiguration, Bootstrap (the floor of `kontinuum-bench bootstrap`)",
    },
    Row {
        mark: Mark::Kubeconfig,
        stage: "↳ kubeconfig",
        short: "kubeconfig",
        operator: "TalosCluster `KubeconfigAvailable=True` (kubeconfig stored)",
        floor: "Kubeconfig (not stored on the hub)",
    },
    Row {
        mark: Mark::ControlPlane,
        stage: "↳ control plane healthy",
        short: "healthy",
        operator: "TalosCluster `ControlPlaneReady=True`: the health check, after the Cilium Addon is Ready",
        floor: "HealthCheck (etcd, API server, node Ready), once gateway-api-crds and cilium are healthy",
    },
    Row {
        mark: Mark::Addons,
        stage: "addons",
        short: "addons",
        operator: "the three built-in Addons `Ready=True`",
        floor: "in the operators' order, one after another: once the API server answers (polled), gateway-api-crds (`helm template`, server-side apply) and cilium (`helm template`, `helm upgrade --install`), then the health check, then cert-manager (as cilium); each until its CRDs are Established and its pods Running and Ready (polled every 100 ms); `addon_installer` library, the fixture charts, the real helm",
    },
    Row {
        mark: Mark::Installed,
        stage: "installed",
        short: "installed",
        operator: "Zone `Installed=True`",
        floor: "identity issued, hub identity Secret applied, footprint rendered and applied to the zone cluster (`zone_installer::identity`, `zone_installer::footprint`)",
    },
    Row {
        mark: Mark::Registered,
        stage: "↳ registration in the store",
        short: "in store",
        operator: "the zone agent's key under `/kontinuum.sh/zones/<region>/<zone>/registry/` put (an etcd watch of the store)",
        floor: "the same",
    },
    Row {
        mark: Mark::Joined,
        stage: "joined",
        short: "joined",
        operator: "Zone `RegistryJoined=True`",
        floor: "a heartbeating Kontinuum of the zone mirrored by `registry hub` (watch): the floor's end",
    },
    Row {
        mark: Mark::Ready,
        stage: "Ready",
        short: "Ready",
        operator: "Zone `Ready=True`: the operator path's end",
        floor: "—",
    },
    Row {
        mark: Mark::PluginReturned,
        stage: "`zone add --wait` returned",
        short: "plugin",
        operator: "`kubectl-kontinuum zone add --wait` exited 0",
        floor: "—",
    },
];

/// The first time, since `started`, of `mark`.
fn first(marks: &mut Marks, mark: Mark, at: Duration) {
    marks.entry(mark).or_insert(at);
}

/// The first time, since `started`, of each mark whose condition is True in `conditions`.
fn first_true<C: AsRef<str>, const N: usize>(
    marks: &mut Marks,
    conditions: &[Condition],
    pairs: [(C, Mark); N],
    at: Duration,
) {
    for (condition, mark) in pairs {
        if conditions::is_true(conditions, condition) {
            first(marks, mark, at);
        }
    }
}

/// What the merged watches deliver.
enum Update {
    /// One watch finished its initial list.
    Synced,
    Zone(Box<Zone>),
    Cluster(Box<TalosCluster>),
    Pool,
    Instance(Box<Instance>),
    Addon(Box<Addon>),
    Kontinuum(Box<Kontinuum>),
}

type UpdateStream = Pin<Box<dyn Stream<Item = Result<Update, watcher::Error>> + Send>>;

/// Watches merged into one stream, each listed before a run's clock starts (so that no
/// initial list is timed and no event is missed).
struct Updates {
    streams: futures::stream::SelectAll<UpdateStream>,
    watches: usize,
}

impl Updates {
    fn new() -> Self {
        Self {
            streams: futures::stream::SelectAll::new(),
            watches: 0,
        }
    }

    fn watch<K>(&mut self, api: Api<K>, config: watcher::Config, wrap: fn(K) -> Update)
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
    {
        let stream = watcher(api, config)
            .default_backoff()
            .filter_map(move |event| async move {
                match event {
                    Ok(watcher::Event::Apply(k) | watcher::Event::InitApply(k)) => {
                        Some(Ok(wrap(k)))
                    }
                    Ok(watcher::Event::InitDone) => Some(Ok(Update::Synced)),
                    Ok(watcher::Event::Init | watcher::Event::Delete(_)) => None,
                    Err(e) => Some(Err(e)),
                }
            });
        self.streams.push(Box::pin(stream));
        self.watches += 1;
    }

    /// Until every watch has listed once.
    async fn synced(&mut self, limit: Duration) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + limit;
        let mut left = self.watches;
        while left > 0 {
            match tokio::time::timeout_at(deadline, self.streams.next()).await {
                Err(_) => bail!("{left} watch(es) did not list within {limit:?}"),
                Ok(None) => bail!("the watches ended"),
                Ok(Some(Ok(Update::Synced))) => left -= 1,
                Ok(Some(_)) => {}
            }
        }
        Ok(())
    }

    async fn next(&mut self) -> Option<Result<Update, watcher::Error>> {
        self.streams.next().await
    }
}

/// When a registration key of each zone (`<region>-<zone>`) first appeared in a store: one
/// etcd Watch of [`ZONES_PREFIX`], opened before any run.
struct Registrations {
    first: Arc<Mutex<HashMap<String, Instant>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Registrations {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// `<region>-<zone>` of a key `/kontinuum.sh/zones/<region>/<zone>/registry/<name>`.
fn registration_zone(key: &[u8]) -> Option<String> {
    let key = std::str::from_utf8(key).ok()?;
    let mut parts = key.strip_prefix(ZONES_PREFIX)?.split('/');
    let (region, zone) = (parts.next()?, parts.next()?);
    (parts.next()? == "registry").then(|| format!("{region}-{zone}"))
}

impl Registrations {
    async fn watch(store_url: &str) -> anyhow::Result<Self> {
        let mut client = pb::watch_client::WatchClient::new(plain_connect(store_url)?());
        let key = ZONES_PREFIX.as_bytes().to_vec();
        let mut range_end = key.clone();
        if let Some(last) = range_end.last_mut() {
            *last += 1;
        }
        let create = pb::WatchRequest {
            request_union: Some(pb::watch_request::RequestUnion::CreateRequest(
                pb::WatchCreateRequest {
                    key,
                    range_end,
                    ..Default::default()
                },
            )),
        };
        // The request stream stays open: closing it would end the watch.
        let requests = futures::stream::iter([create]).chain(futures::stream::pending());
        let mut responses = tokio::time::timeout(Duration::from_secs(10), client.watch(requests))
            .await
            .context("opening a watch of the store timed out")?
            .context("opening a watch of the store")?
            .into_inner();
        let created = tokio::time::timeout(Duration::from_secs(10), responses.message())
            .await
            .context("the store did not confirm the watch")??
            .context("the store closed the watch")?;
        if !created.created {
            bail!("the store answered the watch with {created:?}");
        }
        let first = Arc::new(Mutex::new(HashMap::new()));
        let seen = first.clone();
        let task = tokio::spawn(async move {
            while let Ok(Some(response)) = responses.message().await {
                let at = Instant::now();
                let mut seen = seen.lock().unwrap_or_else(PoisonError::into_inner);
                for event in response.events {
                    if event.r#type != mvccpb::event::EventType::Put as i32 {
                        continue;
                    }
                    if let Some(zone) = event.kv.and_then(|kv| registration_zone(&kv.key)) {
                        seen.entry(zone).or_insert(at);
                    }
                }
            }
        });
        Ok(Self { first, task })
    }

    fn get(&self, zone_name: &str) -> Option<Instant> {
        self.first
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(zone_name)
            .copied()
    }

    /// When zone `zone_name` first registered, since `started`; waits up to `limit` for the
    /// store's event (it may arrive after the hub's).
    async fn since(
        &self,
        zone_name: &str,
        started: Instant,
        limit: Duration,
    ) -> anyhow::Result<Duration> {
        eventually(
            limit,
            &format!("the registration of {zone_name} in the store"),
            || async { Ok(self.get(zone_name).is_some()) },
        )
        .await?;
        Ok(self
            .get(zone_name)
            .map(|at| at.saturating_duration_since(started))
            .unwrap_or_default())
    }
}

/// One path's hub zone services: its namespace, store, `etcd-proxy serve` and
/// `registry hub`, and the watch of its store's registrations.
struct Side {
    ns: String,
    proxy: SocketAddr,
    registrations: Registrations,
    children: Vec<Child>,
}

impl Side {
    /// `pki` is (CA, serving certificate, key) of the proxy.
    async fn start(
        hub: &ControlPlane,
        tools: &Tools,
        dir: &Path,
        prefix: &str,
        pki: &(PathBuf, PathBuf, PathBuf),
    ) -> anyhow::Result<Self> {
        let client = hub.client();
        let ns = namespace(&client, prefix).await?;
        let dir = dir.join(prefix);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let (store, store_url) = start_store(tools, &dir, true).await?;
        let registrations = Registrations::watch(&store_url).await?;
        let sa = |name: &'static str, role: &'static str| {
            service_account_kubeconfig_for(
                &client,
                hub.kubeconfig_yaml(),
                hub.dir(),
                &ns,
                name,
                role,
            )
        };
        let (_, cert, key) = pki;
        let proxy = SocketAddr::new(LOCALHOST, free_port()?);
        let mut args = vec![
            "serve".to_owned(),
            format!("--listen={proxy}"),
            format!("--store={store_url}"),
            format!("--tls-cert={}", cert.display()),
            format!("--tls-key={}", key.display()),
            format!("--namespace={ns}"),
            format!(
                "--kubeconfig={}",
                sa("etcd-proxy", ETCD_PROXY_ROLE).await?.display()
            ),
            format!("--admin-addr=127.0.0.1:{}", free_port()?),
        ];
        args.extend(log_args());
        let proxy_child = start_proxy(
            "etcd-proxy serve",
            &operator_binary("etcd-proxy")?,
            &args,
            &dir.join("etcd-proxy.log"),
            proxy,
            None,
        )
        .await?;
        let admin = SocketAddr::new(LOCALHOST, free_port()?);
        let mut args = vec![
            "hub".to_owned(),
            format!(
                "--kubeconfig={}",
                sa("registry", REGISTRY_ROLE).await?.display()
            ),
            format!("--namespace={ns}"),
            "--name=hub".to_owned(),
            format!("--store={store_url}"),
            format!("--admin-addr={admin}"),
            format!("--webhook-addr=127.0.0.1:{}", free_port()?),
        ];
        args.extend(log_args());
        let mut registry = Child::spawn(
            "registry hub",
            &operator_binary("registry")?,
            &args,
            dir.join("registry-hub.log"),
        )?;
        registry
            .wait_until("answer /readyz", Duration::from_secs(60), || async move {
                http_get(admin, "/readyz")
                    .await
                    .is_some_and(|(code, _)| code == 200)
            })
            .await?;
        Ok(Self {
            ns,
            proxy,
            registrations,
            children: vec![registry, proxy_child, store],
        })
    }

    /// The zone-installer's flags for this side (the floor parses the same into its
    /// settings).
    fn zone_installer_flags(&self, proxy_ca: &Path) -> Vec<String> {
        vec![
            "--insecure-allow-anonymous".into(),
            "true".into(),
            "--hub-grpc-endpoint".into(),
            self.proxy.to_string(),
            "--proxy-ca-file".into(),
            proxy_ca.to_string_lossy().into_owned(),
            "--retry-interval".into(),
            "1s".into(),
        ]
    }

    async fn stop(self) {
        for child in self.children {
            child.stop(Duration::from_secs(10)).await;
        }
    }
}

/// The zone-installer's flags, parsed as the binary parses them.
#[derive(clap::Parser)]
struct ZoneInstallerFlags {
    #[command(flatten)]
    args: zone_installer::Args,
}

/// The addon-installer's flags, parsed as the binary parses them.
#[derive(clap::Parser)]
struct AddonInstallerFlags {
    #[command(flatten)]
    args: addon_installer::Args,
}

/// The floor path: the operators' steps made by the benchmark with their libraries.
struct Floor<'a> {
    hub: Client,
    side: &'a Side,
    zone: zone_installer::Settings,
    addons: addon_installer::Settings,
    helm: addon_installer::helm::Helm,
}

impl<'a> Floor<'a> {
    fn new(
        hub: Client,
        side: &'a Side,
        tools: &Tools,
        repo: &ChartRepo,
        proxy_ca: &Path,
        dir: &Path,
    ) -> anyhow::Result<Self> {
        let zone = ZoneInstallerFlags::try_parse_from(
            std::iter::once("zone-installer".to_owned()).chain(side.zone_installer_flags(proxy_ca)),
        )?
        .args
        .settings()?;
        let mut flags = vec![
            "addon-installer".to_owned(),
            "--helm".into(),
            tools.path("helm").to_string_lossy().into_owned(),
            "--helm-home".into(),
            dir.join("floor-helm").to_string_lossy().into_owned(),
            "--chart-mirror".into(),
            repo.url.clone(),
        ];
        flags.extend(ADDON_INSTALLER_FLAGS.map(str::to_owned));
        let addons = AddonInstallerFlags::try_parse_from(flags)?.args;
        Ok(Self {
            hub,
            side,
            zone,
            addons: addons.settings(),
            helm: addons.helm(),
        })
    }

    /// One zone by the floor on the machine at `address`; the machine is reset and the hub
    /// objects deleted afterwards (not measured).
    #[allow(
        clippy::too_many_lines,
        reason = "the floor's steps in the operators' order, one after another"
    )]
    async fn run(&self, run: usize, address: Ipv4Addr, limit: Duration) -> anyhow::Result<Marks> {
        let ns = &self.side.ns;
        let zone_label = format!("floor-{run}");
        let name = format!("{REGION}-{zone_label}");
        let mut updates = Updates::new();
        updates.watch(
            Api::<Kontinuum>::namespaced(self.hub.clone(), ns),
            watcher::Config::default().labels(&format!(
                "{REGION_LABEL}={REGION},{ZONE_LABEL}={zone_label}"
            )),
            |k| Update::Kontinuum(Box::new(k)),
        );
        updates.synced(limit).await?;
        let zones: Api<Zone> = Api::namespaced(self.hub.clone(), ns);
        let instances: Api<Instance> = Api::namespaced(self.hub.clone(), ns);
        let apply = PatchParams::apply(zone_installer::FIELD_MANAGER).force();
        let started = Instant::now();
        let mut marks = Marks::new();

        let zone = zones
            .create(
                &PostParams::default(),
                &zone_manifest(&zone_label, address)?,
            )
            .await
            .context("creating the Zone")?;
        let owner = fanout::zone_owner(&zone).context("the Zone has no uid")?;
        let cluster: TalosCluster = Api::namespaced(self.hub.clone(), ns)
            .patch(
                &name,
                &apply,
                &Patch::Apply(&fanout::talos_cluster(&zone, &owner)),
            )
            .await
            .context("applying the TalosCluster")?;
        let uid = cluster.uid().context("the TalosCluster has no uid")?;
        Api::<InstancePool>::namespaced(self.hub.clone(), ns)
            .patch(
                &name,
                &apply,
                &Patch::Apply(&fanout::instance_pool(
                    &zone,
                    &fanout::owner_reference("TalosCluster", &name, &uid),
                )),
            )
            .await
            .context("applying the InstancePool")?;
        let mut seed = None;
        for desired in fanout::plan_seed(&zone, &[])?.instances {
            let instance = desired["metadata"]["name"].as_str().unwrap_or_default();
            seed = Some(
                instances
                    .patch(instance, &apply, &Patch::Apply(&desired))
                    .await
                    .with_context(|| format!("applying Instance {instance}"))?,
            );
        }
        let seed = seed.context("the fan-out planned no seed Instance")?;
        let seed_name = seed.name_any();
        first(&mut marks, Mark::FanOut, started.elapsed());

        let outcome = instance_discovery::probe_all(
            &instance_discovery::talos_prober(),
            &seed.spec.interfaces,
            Duration::from_secs(10),
        )
        .await;
        let status = instance_discovery::status(&seed, &outcome, None, Timestamp::now());
        if !conditions::is_true(&status.conditions, InstanceCondition::Discovered) {
            bail!("the floor's probe of {address} failed: {outcome:?}");
        }
        apply_status(
            &instances,
            &seed_name,
            instance_discovery::FIELD_MANAGER,
            None,
            &instance_discovery::owned(&status),
        )
        .await
        .context("writing the Instance status")?;
        first(&mut marks, Mark::Discovered, started.elapsed());

        // The pool-claimer's compare-and-set carries the resourceVersion its reflector holds;
        // the floor reads it back.
        let current = instances.get(&seed_name).await?;
        if !set_claim(
            &instances,
            &seed_name,
            current.resource_version(),
            Some(name.as_str()),
            pool_claimer::FIELD_MANAGER,
        )
        .await
        .context("claiming the Instance")?
        {
            bail!("the claim of Instance {seed_name} was refused");
        }
        first(&mut marks, Mark::Claimed, started.elapsed());

        let mut steps = Vec::new();
        let machine = FloorCluster::bootstrap(address, &seed_name, started, &mut steps).await?;
        for (mark, step) in [(Mark::Bootstrapped, 2), (Mark::Kubeconfig, 3)] {
            if let Some(at) = steps.get(step) {
                first(&mut marks, mark, *at);
            }
        }
        // The operators' order: the addons of the first waves as soon as the API server
        // answers, the health check once Cilium is healthy, cert-manager after it.
        let cluster = serde_json::to_value(&cluster)?;
        let downstream = self.downstream(&machine.kubeconfig, limit).await?;
        self.addons(
            &downstream,
            &cluster,
            &machine.kubeconfig,
            &[BuiltinAddon::GatewayApiCrds, BuiltinAddon::Cilium],
            limit,
        )
        .await?;
        machine.health_check().await?;
        first(&mut marks, Mark::ControlPlane, started.elapsed());
        self.addons(
            &downstream,
            &cluster,
            &machine.kubeconfig,
            &[BuiltinAddon::CertManager],
            limit,
        )
        .await?;
        first(&mut marks, Mark::Addons, started.elapsed());

        self.install(&zone, &machine.kubeconfig).await?;
        first(&mut marks, Mark::Installed, started.elapsed());

        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let next = tokio::time::timeout_at(deadline, updates.next())
                .await
                .with_context(|| format!("no Kontinuum of {name} heartbeating within {limit:?}"))?;
            match next {
                None => bail!("the watch of Kontinuums ended"),
                Some(Ok(Update::Kontinuum(k)))
                    if k.status
                        .as_ref()
                        .is_some_and(|s| s.last_heartbeat_time.is_some()) =>
                {
                    break;
                }
                Some(_) => {}
            }
        }
        first(&mut marks, Mark::Joined, started.elapsed());
        let registered = self
            .side
            .registrations
            .since(&name, started, Duration::from_secs(10))
            .await?;
        first(&mut marks, Mark::Registered, registered);

        machine.reset().await?;
        zones.delete(&name, &DeleteParams::default()).await?;
        instances
            .delete(&seed_name, &DeleteParams::default())
            .await?;
        Ok(marks)
    }

    /// A client of the zone cluster and its version, once its API server answers (polled:
    /// the kubeconfig exists before the API server does).
    async fn downstream(
        &self,
        kubeconfig: &str,
        limit: Duration,
    ) -> anyhow::Result<(Client, String)> {
        let client = downstream::connect(kubeconfig, self.addons.probe_timeout).await?;
        eventually(limit, "the zone cluster's API server", || async {
            Ok(downstream::kube_version(&client).await.is_ok())
        })
        .await?;
        let version = downstream::kube_version(&client).await?;
        Ok((client, version))
    }

    /// `builtins` as the addon-installer installs them, one after another, each until
    /// healthy: its CRD gate and pod probe, polled.
    async fn addons(
        &self,
        (client, kube_version): &(Client, String),
        cluster: &Value,
        kubeconfig: &str,
        builtins: &[BuiltinAddon],
        limit: Duration,
    ) -> anyhow::Result<()> {
        let cluster_name = cluster["metadata"]["name"].as_str().unwrap_or_default();
        for builtin in builtins {
            let release = builtin.release_name();
            let addon: Addon = serde_json::from_value(json!({
                "apiVersion": "kontinuum.sh/v1alpha2", "kind": "Addon",
                "metadata": { "name": builtin_addon_name(cluster_name, release)? },
                "spec": { "talosClusterRef": { "name": cluster_name }, "releaseName": release },
            }))?;
            let request = resolve::resolve(&addon, cluster, self.addons.chart_mirror.as_deref())?;
            let objects = manifests::parse(&self.helm.template(&request, kube_version).await?)?;
            match request.method {
                ProvisioningMethod::KubectlApply => {
                    downstream::apply_rendered(
                        client,
                        &request.namespace,
                        &request.release,
                        &objects,
                        &request.hash,
                    )
                    .await?;
                }
                ProvisioningMethod::HelmUpgradeInstall => {
                    self.helm.upgrade_install(kubeconfig, &request).await?;
                }
            }
            let crds = manifests::crds(&objects);
            let selectors = health::selectors(
                &request.release,
                request.chart.short_name(),
                request.chart.version.as_deref(),
            );
            eventually(limit, &format!("addon {release} healthy"), || async {
                let states = downstream::crd_states(client, &crds).await?;
                if health::crd_verdict(&states).is_some() {
                    return Ok(false);
                }
                Ok(
                    downstream::probe_pods(client, &request.namespace, &selectors)
                        .await?
                        .is_none(),
                )
            })
            .await?;
        }
        Ok(())
    }

    /// The zone-installer's install step for a new zone: a fresh identity, the hub Secret
    /// trusting it, the footprint applied to the zone cluster.
    async fn install(&self, zone: &Zone, kubeconfig: &str) -> anyhow::Result<()> {
        let ns = &self.side.ns;
        let name = zone.name_any();
        let current = identity::issue(&name)?;
        let nothing = identity::HubTrust {
            certificates: Vec::new(),
            overlap_until: None,
        };
        let trust = identity::hub_trust(
            &current.cert_der,
            None,
            &nothing,
            Timestamp::now(),
            self.zone.identity_overlap,
        );
        let owner = fanout::zone_owner(zone).context("the Zone has no uid")?;
        let secret = identity::hub_secret(
            &name,
            ns,
            &zone.spec.region,
            &zone.spec.zone,
            &owner,
            &trust,
        );
        Api::<Secret>::namespaced(self.hub.clone(), ns)
            .patch(
                &identity::secret_name(&name),
                &PatchParams::apply(zone_installer::FIELD_MANAGER).force(),
                &Patch::Apply(&secret),
            )
            .await
            .context("applying the hub identity Secret")?;
        let thumbprint = current.thumbprint();
        let inputs = footprint::Zone {
            region: &zone.spec.region,
            zone: &zone.spec.zone,
            zone_name: &name,
            domain: None,
            identity_cert_pem: &current.cert_pem,
            identity_key_pem: current.key.expose(),
            identity_thumbprint: &thumbprint,
        };
        let objects = footprint::render(&inputs, &self.zone.footprint);
        let limit = self.zone.downstream_timeout;
        let client = kubeconfig::client(kubeconfig, limit).await?;
        footprint::apply(&client, &objects, limit).await?;
        Ok(())
    }
}

/// The Zone `kubectl kontinuum zone add --region <REGION> --zone <zone> --talos-address
/// <address>` writes.
fn zone_manifest(zone: &str, address: Ipv4Addr) -> anyhow::Result<Zone> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "kontinuum.sh/v1alpha2", "kind": "Zone",
        "metadata": { "name": format!("{REGION}-{zone}") },
        "spec": { "region": REGION, "zone": zone, "seed": { "talosAddresses": [address.to_string()] } },
    }))?)
}

/// What the operator path's watches have shown so far.
#[derive(Default)]
struct Seen {
    cluster: bool,
    pool: bool,
    instance: bool,
    /// Readiness of the zone's built-in Addons, by release.
    addons: BTreeMap<&'static str, bool>,
}

impl Seen {
    fn update(&mut self, update: Update, cluster: &str, at: Duration, marks: &mut Marks) {
        match update {
            Update::Zone(zone) => first_true(
                marks,
                &zone.status.map(|s| s.conditions).unwrap_or_default(),
                [
                    (ZoneCondition::Installed, Mark::Installed),
                    (ZoneCondition::RegistryJoined, Mark::Joined),
                    (ZoneCondition::Ready, Mark::Ready),
                ],
                at,
            ),
            Update::Cluster(c) => {
                self.cluster = true;
                first_true(
                    marks,
                    &c.status.map(|s| s.conditions).unwrap_or_default(),
                    [
                        (TalosClusterCondition::Bootstrapped, Mark::Bootstrapped),
                        (TalosClusterCondition::KubeconfigAvailable, Mark::Kubeconfig),
                        (TalosClusterCondition::ControlPlaneReady, Mark::ControlPlane),
                    ],
                    at,
                );
            }
            Update::Pool => self.pool = true,
            Update::Instance(instance) => {
                self.instance = true;
                if instance.labels().contains_key(CLAIMED_BY) {
                    first(marks, Mark::Claimed, at);
                }
                if instance.status.as_ref().is_some_and(|s| {
                    conditions::is_true(&s.conditions, InstanceCondition::Discovered)
                }) {
                    first(marks, Mark::Discovered, at);
                }
            }
            Update::Addon(addon) => {
                if addon.spec.talos_cluster_ref.name == cluster
                    && let Some(builtin) = addon.builtin()
                {
                    let ready = addon
                        .status
                        .as_ref()
                        .is_some_and(|s| conditions::is_true(&s.conditions, AddonCondition::Ready));
                    self.addons.insert(builtin.release_name(), ready);
                }
                if BuiltinAddon::ALL
                    .iter()
                    .all(|b| self.addons.get(b.release_name()) == Some(&true))
                {
                    first(marks, Mark::Addons, at);
                }
            }
            Update::Kontinuum(_) | Update::Synced => {}
        }
        if self.cluster && self.pool && self.instance {
            first(marks, Mark::FanOut, at);
        }
    }
}

/// One zone through the operators on the machine at `address`: `kubectl-kontinuum zone add
/// --wait`, each stage's time from the first watch event showing it.
async fn operator_run(
    hub: &ControlPlane,
    side: &Side,
    run: usize,
    address: Ipv4Addr,
    limit: Duration,
) -> anyhow::Result<Marks> {
    let client = hub.client();
    let ns = &side.ns;
    let zone_label = format!("op-{run}");
    let name = format!("{REGION}-{zone_label}");
    let seed = seed_instance_name(REGION, &zone_label, &address.to_string())?;
    let by_name = |n: &str| watcher::Config::default().fields(&format!("metadata.name={n}"));
    let mut updates = Updates::new();
    updates.watch(
        Api::<Zone>::namespaced(client.clone(), ns),
        by_name(&name),
        |z| Update::Zone(Box::new(z)),
    );
    updates.watch(
        Api::<TalosCluster>::namespaced(client.clone(), ns),
        by_name(&name),
        |c| Update::Cluster(Box::new(c)),
    );
    updates.watch(
        Api::<InstancePool>::namespaced(client.clone(), ns),
        by_name(&name),
        |_| Update::Pool,
    );
    updates.watch(
        Api::<Instance>::namespaced(client.clone(), ns),
        by_name(&seed),
        |i| Update::Instance(Box::new(i)),
    );
    updates.watch(
        Api::<Addon>::namespaced(client.clone(), ns),
        watcher::Config::default(),
        |a| Update::Addon(Box::new(a)),
    );
    updates.synced(limit).await?;
    let log = hub.dir().join(format!("zone-add-{name}.log"));
    let started = Instant::now();
    let mut plugin = Child::spawn(
        "kubectl-kontinuum zone add",
        &operator_binary("kubectl-kontinuum")?,
        &[
            format!("--kubeconfig={}", hub.kubeconfig_path().display()),
            format!("--namespace={ns}"),
            "zone".into(),
            "add".into(),
            format!("--region={REGION}"),
            format!("--zone={zone_label}"),
            format!("--talos-address={address}"),
            "--wait".into(),
            format!("--timeout={}s", limit.as_secs()),
        ],
        log,
    )?;
    let deadline = tokio::time::Instant::now() + limit;
    let mut watched = Seen::default();
    let mut marks = Marks::new();
    while !(marks.contains_key(&Mark::Ready) && marks.contains_key(&Mark::PluginReturned)) {
        tokio::select! {
            update = updates.next() => match update {
                None => bail!("the watches ended"),
                // The watcher backs off and resumes by itself.
                Some(Err(_)) => {}
                Some(Ok(update)) => watched.update(update, &name, started.elapsed(), &mut marks),
            },
            exited = plugin.wait_success(), if !marks.contains_key(&Mark::PluginReturned) => {
                exited?;
                first(&mut marks, Mark::PluginReturned, started.elapsed());
            }
            () = tokio::time::sleep_until(deadline) => {
                bail!("zone {name} not Ready within {limit:?}; seen so far: {marks:?}");
            }
        }
    }
    let registered = side
        .registrations
        .since(&name, started, Duration::from_secs(10))
        .await?;
    first(&mut marks, Mark::Registered, registered);
    Ok(marks)
}

/// `zone remove`, as the zone-installer does it (not measured): the Zone deleted, then its
/// TalosCluster gone (the machine back in maintenance mode), then the seed Instance deleted.
async fn operator_teardown(
    client: &Client,
    ns: &str,
    run: usize,
    address: Ipv4Addr,
    limit: Duration,
) -> anyhow::Result<()> {
    let zone_label = format!("op-{run}");
    let name = format!("{REGION}-{zone_label}");
    let seed = seed_instance_name(REGION, &zone_label, &address.to_string())?;
    let zones: Api<Zone> = Api::namespaced(client.clone(), ns);
    let clusters: Api<TalosCluster> = Api::namespaced(client.clone(), ns);
    let instances: Api<Instance> = Api::namespaced(client.clone(), ns);
    zones.delete(&name, &DeleteParams::default()).await?;
    eventually(limit, &format!("zone {name} removed"), || async {
        Ok(zones.get_opt(&name).await?.is_none() && clusters.get_opt(&name).await?.is_none())
    })
    .await?;
    instances.delete(&seed, &DeleteParams::default()).await?;
    eventually(limit, &format!("Instance {seed} deleted"), || async {
        Ok(instances.get_opt(&seed).await?.is_none())
    })
    .await
}

/// The operators of the zone flow for the operator path's side, each as a process.
async fn start_zone_operators(
    hub: &ControlPlane,
    side: &Side,
    repo: &ChartRepo,
    proxy_ca: &Path,
) -> anyhow::Result<Vec<Operator>> {
    let client = hub.client();
    let mut operators = start_cluster_operators(hub, &side.ns, &BOOTSTRAPPER_FLAGS).await?;
    install_addon_installer_role(&client).await?;
    let kubeconfig = service_account_kubeconfig_for(
        &client,
        hub.kubeconfig_yaml(),
        hub.dir(),
        &side.ns,
        "addon-installer",
        ADDON_INSTALLER_ROLE,
    )
    .await?;
    operators.push(
        start_addon_installer(
            &operator_binary("addon-installer")?,
            &kubeconfig,
            &side.ns,
            &repo.url,
            &ADDON_INSTALLER_FLAGS,
        )
        .await?,
    );
    let flags = side.zone_installer_flags(proxy_ca);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    operators
        .push(start_operator(hub, &side.ns, "zone-installer", ZONE_INSTALLER_ROLE, &flags).await?);
    Ok(operators)
}

/// Runs the benchmark and returns the rendered report.
pub async fn run(args: Args) -> anyhow::Result<String> {
    let limit = Duration::from_secs(args.timeout_seconds);
    let runs = args.runs.max(1);
    let environment = Environment::capture();
    let tools = Tools::locate().context("locating the test-bed tools (KONTINUUM_TESTBED_BIN)")?;
    let dir = unique_dir("bench-zone");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    say(&format!(
        "starting the hub control plane in {}",
        dir.display()
    ));
    let mut config = ControlPlaneConfig::new(dir.join("hub"));
    config.nodes = Vec::new();
    let hub = ControlPlane::start(&tools, config)
        .await
        .context("starting the hub")?;
    let client = hub.client();
    install_kontinuum_crds(&client).await?;
    apply_operator_cluster_roles(
        &client,
        &[
            ("zone-installer", ZONE_INSTALLER_ROLE),
            ("etcd-proxy", ETCD_PROXY_ROLE),
            ("registry", REGISTRY_ROLE),
        ],
    )
    .await?;
    let pki = write_pki(&dir)?;
    say("starting each path's store, etcd-proxy serve and registry hub");
    let floor_side = Side::start(&hub, &tools, &dir, "bench-zone-floor", &pki).await?;
    let operator_side = Side::start(&hub, &tools, &dir, "bench-zone-operators", &pki).await?;
    let repo = ChartRepo::serve(&tools).await?;
    say("starting the emulator");
    let emulator = EmulatorProcess::start(&Options {
        binary: default_binary(),
        machines: runs * 2,
        first_address: FIRST_MACHINE,
        port: 50000,
        dir: dir.join("emulator"),
        log_level: "warn".into(),
        start_timeout: Duration::from_secs(60),
    })
    .await?;
    let addresses = emulator.ipv4_addresses()?;
    say("starting the operators");
    let mut operators = start_zone_operators(&hub, &operator_side, &repo, &pki.0).await?;
    let floor = Floor::new(client.clone(), &floor_side, &tools, &repo, &pki.0, &dir)?;

    let mut floor_runs = Vec::new();
    let mut operator_runs = Vec::new();
    for run in 0..runs {
        let address = addresses[2 * run];
        say(&format!("run {run}: floor on {address}"));
        let marks = floor.run(run, address, limit).await?;
        say(&format!(
            "run {run}: floor done after {}",
            marks
                .get(&Mark::Joined)
                .map_or("?".into(), |d| fmt_duration(*d))
        ));
        floor_runs.push(marks);

        let address = addresses[2 * run + 1];
        say(&format!("run {run}: operators on {address}"));
        let marks = operator_run(&hub, &operator_side, run, address, limit).await?;
        say(&format!(
            "run {run}: Zone Ready after {}",
            marks
                .get(&Mark::Ready)
                .map_or("?".into(), |d| fmt_duration(*d))
        ));
        operator_runs.push(marks);
        operator_teardown(&client, &operator_side.ns, run, address, limit).await?;
    }

    let report = render(environment, &floor_runs, &operator_runs);
    for op in &mut operators {
        let _ = op.kill().await;
    }
    emulator.stop(Duration::from_secs(60)).await?;
    drop(floor);
    floor_side.stop().await;
    operator_side.stop().await;
    drop(repo);
    hub.stop().await;
    report.write_to(&args.out)
}

fn samples(runs: &[Marks], mark: Mark) -> Vec<Duration> {
    runs.iter().filter_map(|m| m.get(&mark).copied()).collect()
}

fn cell(d: Option<Duration>) -> String {
    d.map_or_else(|| "—".to_owned(), fmt_duration)
}

/// p50 and max of `mark` over `runs`, `None` when no run has it.
fn p50_max(runs: &[Marks], mark: Mark) -> Option<(Duration, Duration)> {
    let all = samples(runs, mark);
    (!all.is_empty()).then(|| {
        let s = summarize(&all);
        (s.p50, s.max)
    })
}

fn per_run(runs: &[Marks], total: Mark) -> Table {
    let mut headers = vec!["run"];
    let rows: Vec<&Row> = ROWS
        .iter()
        .filter(|r| runs.iter().any(|m| m.contains_key(&r.mark)))
        .collect();
    headers.extend(rows.iter().map(|r| r.short));
    let mut table = Table::new(&headers);
    for (i, marks) in runs.iter().enumerate() {
        let mut cells = vec![i.to_string()];
        for row in &rows {
            let value = cell(marks.get(&row.mark).copied());
            cells.push(if row.mark == total {
                format!("**{value}**")
            } else {
                value
            });
        }
        table.row(cells);
    }
    table
}

#[allow(
    clippy::too_many_lines,
    reason = "one report: definitions, stages, target, runs"
)]
fn render(environment: Environment, floor: &[Marks], operator: &[Marks]) -> Report {
    let runs = floor.len();
    let mut definitions = Table::new(&[
        "stage",
        "operator path: the first watch event showing",
        "floor path: done after",
    ]);
    for row in &ROWS {
        definitions.row(vec![
            row.stage.to_owned(),
            row.operator.to_owned(),
            row.floor.to_owned(),
        ]);
    }

    let mut stages = Table::new(&[
        "stage (time since start)",
        "floor p50",
        "floor max",
        "operator p50",
        "operator max",
        "operator − floor (p50)",
    ]);
    for row in &ROWS {
        let f = p50_max(floor, row.mark);
        let o = p50_max(operator, row.mark);
        stages.row(vec![
            row.stage.to_owned(),
            cell(f.map(|(p, _)| p)),
            cell(f.map(|(_, m)| m)),
            cell(o.map(|(p, _)| p)),
            cell(o.map(|(_, m)| m)),
            match (f, o) {
                (Some((f, _)), Some((o, _))) => signed(o, f),
                _ => "—".to_owned(),
            },
        ]);
    }
    let f_total = p50_max(floor, Mark::Joined).unwrap_or_default();
    let o_total = p50_max(operator, Mark::Ready).unwrap_or_default();
    stages.row(vec![
        "**total: floor joined / operator Zone `Ready`**".to_owned(),
        format!("**{}**", fmt_duration(f_total.0)),
        format!("**{}**", fmt_duration(f_total.1)),
        format!("**{}**", fmt_duration(o_total.0)),
        format!("**{}**", fmt_duration(o_total.1)),
        format!("**{}**", signed(o_total.0, f_total.0)),
    ]);

    let overhead = o_total.0.as_secs_f64() - f_total.0.as_secs_f64();
    let allowed = (f_total.0.as_secs_f64() * 0.10).max(2.0);
    let share = overhead / f_total.0.as_secs_f64().max(f64::EPSILON) * 100.0;
    let verdict = if overhead <= allowed { "met" } else { "missed" };

    let mut paired = Table::new(&[
        "run",
        "floor total (joined)",
        "operator total (Zone Ready)",
        "operator − floor",
    ]);
    for (i, (f, o)) in floor.iter().zip(operator).enumerate() {
        let (f, o) = (f.get(&Mark::Joined).copied(), o.get(&Mark::Ready).copied());
        paired.row(vec![
            i.to_string(),
            cell(f),
            cell(o),
            match (f, o) {
                (Some(f), Some(o)) => signed(o, f),
                _ => "—".to_owned(),
            },
        ]);
    }

    let mut report = Report::new(
        "Zone add benchmark: operators against the floor",
        environment,
    );
    report.push(
        Section::new("Target")
            .text(format!(
                "`zone add` → `Ready` through the operators within max(2 s, 10 %) of the floor, \
                 at p50 over {runs} run(s) per path: floor {} (the zone's registration mirrored \
                 by the hub), operators {} (Zone `Ready`): operator overhead {overhead:+.2} s \
                 ({share:+.1} %), allowed {allowed:.2} s: **{verdict}**.",
                fmt_duration(f_total.0),
                fmt_duration(o_total.0),
            ))
            .table(paired),
    );
    report.push(
        Section::new("Stages: operators against the floor")
            .text(format!(
                "{runs} run(s) per path, alternating (floor, operator, …), each on a fresh \
                 maintenance-mode machine of the Talos emulator; times since the start of the \
                 run (the floor: `Zone` create; the operators: `kubectl-kontinuum zone add` \
                 spawned). Max is the p99 of {runs} runs. Rows marked ↳ are sub-steps."
            ))
            .table(stages),
    );
    report.push(
        Section::new("What each stage's time is")
            .text(
                "Each path has its own namespace, store (etcd), `etcd-proxy serve` (TLS from a \
                 test CA, watching the identity Secrets of its namespace) and `registry hub` \
                 (mirroring its store's registrations into Kontinuums of its namespace), each \
                 with a ServiceAccount bound to the chart's rules. Operator path: \
                 instance-discovery (`--retry-seconds 1`), pool-claimer, talos-bootstrapper \
                 (`--service-account-key-bits 2048 --retry-seconds 1`), addon-installer \
                 (`--retry-interval 1s`, the fixture charts through `--chart-mirror`, the test \
                 bed's helm) and zone-installer (`--insecure-allow-anonymous true \
                 --hub-grpc-endpoint <its proxy> --proxy-ca-file <the test CA> \
                 --retry-interval 1s`), each a process with its own ServiceAccount and the \
                 chart's rules; the Zone written by `kubectl-kontinuum zone add --region eu \
                 --zone op-<run> --talos-address <machine> --wait`. Floor path: the \
                 benchmark alone, with the operators' libraries and the same settings (the \
                 zone-installer's and addon-installer's flags parsed by their own `Args`), \
                 one call after another; no Addon objects, no TalosCluster or Zone status, no \
                 Events. In both, the zone agent (`registry zone`) and its relay (`etcd-proxy \
                 relay`) run as processes on the zone cluster's hostlet node, from the \
                 footprint's Deployment.",
            )
            .table(definitions),
    );
    report.push(
        Section::new("Every run")
            .text("The floor's times, then the operators' (since the start of each run).")
            .table(per_run(floor, Mark::Joined))
            .table(per_run(operator, Mark::Ready)),
    );
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registration_keys_name_their_zone() {
        assert_eq!(
            registration_zone(b"/kontinuum.sh/zones/eu/op-0/registry/kontinuum-abc"),
            Some("eu-op-0".to_owned())
        );
        assert_eq!(
            registration_zone(b"/kontinuum.sh/zones/eu/op-0/other/x"),
            None
        );
        assert_eq!(registration_zone(b"/kontinuum.sh/proxy/leases/1"), None);
        assert_eq!(registration_zone(b"/kontinuum.sh/zones/eu"), None);
    }

    #[test]
    fn rows_are_in_flow_order() {
        let marks: Vec<Mark> = ROWS.iter().map(|r| r.mark).collect();
        let mut sorted = marks.clone();
        sorted.sort();
        assert_eq!(marks, sorted);
    }
}
