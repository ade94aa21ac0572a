//! Zone faults (issue 12, acceptance 5), on the real test bed, every operator a process:
//!
//! * The zone agent crashes: its process (run on the host by the zone cluster's hostlet) is
//!   killed with SIGKILL and stays down for the hostlet's crash-loop back-off. No heartbeat
//!   reaches the hub, so `RegistryJoined` turns False at the registry TTL; once the hostlet
//!   has restarted the agent it turns True again (never latched).
//! * The hub's identity Secret is deleted: the proxy refuses the zone (its Unauthenticated
//!   count grows), the registration lapses, the Zone says `Installed=False/IdentityRevoked`,
//!   and the rotation annotation re-admits the zone with a new identity, trusted alone (the
//!   revoked certificate is not trusted again), up to `Ready`.
//! * The zone-installer and the talos-bootstrapper are killed (SIGKILL, as a crash) at fixed
//!   points of adding a zone through every operator and of removing it, and restarted each
//!   time: the zone still becomes Ready (its agent heartbeating through the real proxy) and
//!   is still removed, with exactly one Bootstrap and one secrets bundle by the emulator's
//!   counters and the hub's Secrets, and one identity Secret.
//! * Every operator of the flow (instance-discovery, pool-claimer, talos-bootstrapper,
//!   addon-installer, zone-installer) and the hub's `etcd-proxy serve` and `registry hub`
//!   are killed at random points of adding and of removing the zone, one at a time, again
//!   and again, over several add/remove rounds of the same Zone: each round ends Ready with
//!   one more Bootstrap, one bundle and one identity, and then removed with nothing left.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::large_futures,
    clippy::too_many_lines
)]

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod, Secret};
use kontinuum_crds::labels::{CLAIMED_BY, IDENTITY_THUMBPRINT, ROTATE_IDENTITY};
use kontinuum_crds::names::seed_instance_name;
use kontinuum_crds::v1alpha2::{Instance, Kontinuum, TalosCluster, Zone};
use kontinuum_e2e::addons::{ChartRepo, start_addon_installer_with_role};
use kontinuum_e2e::bootstrapper::{start_operators, stored_kubeconfig};
use kontinuum_e2e::chaos::Rng;
use kontinuum_e2e::testbed::{ControlPlane, HostletConfig, Shared, Tools, unique_dir};
use kontinuum_e2e::zone::{HubJoin, HubPart, wait_zone_condition, zone_condition};
use kontinuum_e2e::{
    Operator, eventually, http_get, install_kontinuum_crds, namespace, service_account_kubeconfig,
    shared_client, workspace_binary,
};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt as _};
use serde_json::json;
use talos_emulator::{Emulator, Mode, Settings};
use zone_installer::{footprint, identity};

/// Bound of every wait: generous, the machine is shared with other builds and tests.
const LIMIT: Duration = Duration::from_secs(300);
/// How often the zone agent rewrites its registration (`registry zone`'s default; the
/// footprint sets none).
const AGENT_HEARTBEAT: Duration = Duration::from_secs(10);
/// The registry TTL of the agent tests: the zone-installer's `--registry-ttl` and
/// `registry hub --ttl-seconds`.
const TTL_SECONDS: u64 = 20;
/// The hostlet's first crash-loop back-off in the crash test: the agent stays down this
/// long after its SIGKILL, well past the TTL.
const AGENT_BACKOFF_SECONDS: u64 = 60;

/// One heavy test at a time in this binary (each runs a hub store, a proxy, a registry and
/// a zone control plane on a shared two-core machine).
static HEAVY: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The hub's side of a zone join: the Kontinuum store (etcd), `etcd-proxy serve` in front
/// of it (TLS from a test CA) and `registry hub` mirroring registrations, all processes.
struct Hub {
    /// The proxy's public endpoint.
    proxy: SocketAddr,
    /// The proxy's admin server (`/metrics`).
    proxy_admin: SocketAddr,
    /// The CA of the proxy's serving certificate (the zone-installer's `--proxy-ca-file`).
    ca_file: PathBuf,
    join: HubJoin,
}

impl Hub {
    async fn start(shared: &Shared, ns: &str, dir: &Path, ttl_seconds: u64) -> Self {
        let registry = [
            format!("--ttl-seconds={ttl_seconds}"),
            "--heartbeat-seconds=5".to_owned(),
        ];
        let join = HubJoin::start(shared, dir, ns, &registry).await.unwrap();
        Self {
            proxy: join.proxy,
            proxy_admin: join.proxy_admin,
            ca_file: join.proxy_ca.clone(),
            join,
        }
    }

    /// Calls the proxy refused as Unauthenticated so far (every reason).
    async fn refusals(&self) -> u64 {
        let (_, text) = http_get(self.proxy_admin, "/metrics")
            .await
            .expect("the proxy's /metrics");
        text.lines()
            .filter(|l| l.starts_with("kontinuum_etcd_proxy_authn_failures_total"))
            .filter_map(|l| l.split_whitespace().last()?.parse::<u64>().ok())
            .sum()
    }
}

/// Starts (or restarts) the zone-installer for `ns`, pointed at the hub's proxy.
async fn start_zone_installer(
    kubeconfig: &Path,
    ns: &str,
    hub: &Hub,
    registry_ttl: &str,
) -> Operator {
    Operator::start(
        Path::new(env!("CARGO_BIN_EXE_zone-installer")),
        "zone-installer",
        kubeconfig,
        &[
            "--namespace",
            ns,
            "--insecure-allow-anonymous",
            "true",
            "--hub-grpc-endpoint",
            &hub.proxy.to_string(),
            "--proxy-ca-file",
            &hub.ca_file.to_string_lossy(),
            "--agent-image",
            "kontinuum:e2e",
            "--retry-interval",
            "1s",
            "--registry-ttl",
            registry_ttl,
        ],
    )
    .await
    .unwrap()
}

/// Waits until the Zone's condition `type_` has `status` (and `reason`, when given).
async fn wait(client: &Client, ns: &str, zone: &str, type_: &str, status: &str, reason: &str) {
    wait_zone_condition(client, ns, zone, (type_, status, reason), LIMIT)
        .await
        .unwrap();
}

async fn zone_status(
    client: &Client,
    ns: &str,
    zone: &str,
) -> kontinuum_crds::v1alpha2::ZoneStatus {
    Api::<Zone>::namespaced(client.clone(), ns)
        .get(zone)
        .await
        .unwrap()
        .status
        .unwrap_or_default()
}

/// The zone agent's container, as the zone cluster's hostlet reports it.
#[derive(Debug)]
struct Agent {
    pod: String,
    /// The host pid while it runs (the hostlet's container id is `hostlet://<pid>`).
    pid: Option<u32>,
    restarts: i32,
    waiting: Option<String>,
}

async fn agent(down: &Client) -> Option<Agent> {
    let pods = Api::<Pod>::namespaced(down.clone(), footprint::NAMESPACE)
        .list(&ListParams::default())
        .await
        .ok()?;
    pods.items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .find_map(|p| {
            let c = p
                .status?
                .container_statuses?
                .into_iter()
                .find(|c| c.name == footprint::AGENT_CONTAINER)?;
            let state = c.state.unwrap_or_default();
            let pid = c
                .container_id
                .as_deref()
                .and_then(|id| id.strip_prefix("hostlet://"))
                .and_then(|pid| pid.parse().ok())
                .filter(|_| state.running.is_some());
            Some(Agent {
                pod: p.metadata.name?,
                pid,
                restarts: c.restart_count,
                waiting: state.waiting.and_then(|w| w.reason),
            })
        })
}

/// A field of `/proc/<pid>/status`.
fn proc_status(pid: u32, field: &str) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .map(|v| v.trim().to_owned())
}

/// A zone joined for real: its cluster (a real control plane whose one schedulable node is
/// a hostlet, so the agent and relay run as host processes), the zone-installer, the Zone
/// Ready.
struct JoinedZone {
    name: String,
    cluster: ControlPlane,
    down: Client,
    _zone_installer: Operator,
}

impl JoinedZone {
    async fn start(
        client: &Client,
        shared: &'static Shared,
        ns: &str,
        dir: &Path,
        hub: &Hub,
        (zone, node_octet, backoff): (&str, u8, Option<u64>),
    ) -> Self {
        let name = format!("eu-{zone}");
        let mut cluster = kontinuum_e2e::addons::downstream_cluster(&shared.tools, &name)
            .await
            .unwrap();
        let down = cluster.client();
        let binary = |name: &str| {
            workspace_binary(name)
                .unwrap()
                .to_string_lossy()
                .into_owned()
        };
        let map = dir.join("image-map.json");
        let images = json!({ "images": [{
            "image": "kontinuum",
            "files": {
                "/usr/local/bin/registry": binary("registry"),
                "/usr/local/bin/etcd-proxy": binary("etcd-proxy"),
            },
        }] });
        std::fs::write(&map, images.to_string()).unwrap();
        let octet = u8::try_from(100 + std::process::id() % 50).unwrap();
        let mut node = HostletConfig::new(
            "zone-node",
            Ipv4Addr::new(127, octet, node_octet, 1),
            &map,
            binary("hostlet"),
        );
        node.pod_cidr = Some(format!("127.{octet}.{}.0/24", node_octet + 1));
        node.initial_backoff_seconds = backoff;
        cluster.start_hostlet(&node).await.unwrap();
        let nodes = Api::<Node>::all(down.clone());
        for kwok in nodes.list(&ListParams::default()).await.unwrap() {
            if kwok.name_any() != "zone-node" {
                let cordon = json!({ "spec": { "unschedulable": true } });
                nodes
                    .patch(
                        &kwok.name_any(),
                        &PatchParams::default(),
                        &Patch::Merge(&cordon),
                    )
                    .await
                    .unwrap();
            }
        }

        let kubeconfig =
            service_account_kubeconfig(client, shared, ns, "zone-installer", "cluster-admin")
                .await
                .unwrap();
        let zone_installer =
            start_zone_installer(&kubeconfig, ns, hub, &format!("{TTL_SECONDS}s")).await;
        let object: Zone = serde_json::from_value(json!({
            "apiVersion": "kontinuum.sh/v1alpha2", "kind": "Zone",
            "metadata": { "name": name }, "spec": { "region": "eu", "zone": zone },
        }))
        .unwrap();
        Api::<Zone>::namespaced(client.clone(), ns)
            .create(&PostParams::default(), &object)
            .await
            .unwrap();
        kontinuum_e2e::addons::seed_cluster(client, ns, &name, cluster.kubeconfig_yaml(), 1)
            .await
            .unwrap();
        let ready = json!({ "status": { "conditions": [{
            "type": "Ready", "status": "True", "reason": "Ready", "message": "ready for the test",
            "lastTransitionTime": "2026-01-01T00:00:00Z" }] } });
        Api::<TalosCluster>::namespaced(client.clone(), ns)
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&ready))
            .await
            .unwrap();
        wait(client, ns, &name, "Ready", "True", "").await;
        Self {
            name,
            cluster,
            down,
            _zone_installer: zone_installer,
        }
    }

    fn hostlet_pid(&self) -> u32 {
        self.cluster
            .pids()
            .into_iter()
            .find(|(component, _)| *component == "hostlet")
            .map(|(_, pid)| pid)
            .expect("the zone cluster's hostlet runs")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_zone_agent_turns_registry_joined_false_at_the_ttl_and_true_once_it_runs_again() {
    let _heavy = HEAVY.lock().await;
    let (client, shared) = shared_client().await.unwrap();
    install_kontinuum_crds(&client).await.unwrap();
    let ns = namespace(&client, "zone-agent-crash").await.unwrap();
    let dir = unique_dir("zone-agent-crash");
    std::fs::create_dir_all(&dir).unwrap();
    let hub = Hub::start(shared, &ns, &dir, TTL_SECONDS).await;
    let zone = JoinedZone::start(
        &client,
        shared,
        &ns,
        &dir,
        &hub,
        ("crash", 20, Some(AGENT_BACKOFF_SECONDS)),
    )
    .await;
    let name = zone.name.as_str();

    // The agent's process: a child of the zone cluster's hostlet, the `registry` binary.
    let before = agent(&zone.down).await.unwrap();
    let pid = before.pid.expect("the agent runs");
    assert_eq!(before.restarts, 0, "{before:?}");
    assert_eq!(
        proc_status(pid, "Name").as_deref(),
        Some("registry"),
        "pid {pid} is the zone agent"
    );
    assert_eq!(
        proc_status(pid, "PPid"),
        Some(zone.hostlet_pid().to_string()),
        "pid {pid} runs under the zone cluster's hostlet"
    );

    // SIGKILL, as a crash: no deregistration, the heartbeats just stop.
    let killed_status = std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap();
    assert!(killed_status.success());
    let killed = Instant::now();
    wait(
        &client,
        &ns,
        name,
        "RegistryJoined",
        "False",
        "WaitingForRegistry",
    )
    .await;
    let lapsed = killed.elapsed();
    let (ready, reason, _) = zone_condition(&client, &ns, name, "Ready").await.unwrap();
    assert_eq!(
        (ready.as_str(), reason.as_str()),
        ("False", "WaitingForRegistry")
    );
    // Still down (the hostlet's back-off), so the False came from the missing heartbeats.
    let down = agent(&zone.down).await.unwrap();
    assert!(
        down.pid.is_none() && down.waiting.as_deref() == Some("CrashLoopBackOff"),
        "{down:?}"
    );
    // Not before the last heartbeat's TTL could have run out.
    let earliest = Duration::from_secs(TTL_SECONDS)
        .saturating_sub(AGENT_HEARTBEAT)
        .saturating_sub(Duration::from_secs(1));
    assert!(
        lapsed >= earliest,
        "RegistryJoined turned False {lapsed:?} after the kill, before the TTL allows"
    );

    // The hostlet restarts the same container after its back-off; the Zone follows.
    eventually(LIMIT, "the hostlet restarted the agent", || async {
        Ok(agent(&zone.down)
            .await
            .is_some_and(|a| a.pid.is_some_and(|p| p != pid) && a.restarts == 1))
    })
    .await
    .unwrap();
    let restarted = killed.elapsed();
    wait(
        &client,
        &ns,
        name,
        "RegistryJoined",
        "True",
        "RegistryJoined",
    )
    .await;
    let rejoined = killed.elapsed();
    wait(&client, &ns, name, "Ready", "True", "Ready").await;
    let after = agent(&zone.down).await.unwrap();
    assert_eq!(after.pod, before.pod, "the same pod: a container restart");
    let entries = Api::<Kontinuum>::namespaced(client.clone(), &ns)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|k| k.spec.zone.as_deref() == Some("crash"))
        .count();
    assert_eq!(entries, 1, "one registration of the zone");
    eprintln!(
        "agent killed: RegistryJoined=False after {lapsed:?} (TTL {TTL_SECONDS}s, heartbeat {AGENT_HEARTBEAT:?}); \
         the hostlet restarted it after {restarted:?} (back-off {AGENT_BACKOFF_SECONDS}s); \
         RegistryJoined=True again {rejoined:?} after the kill, {:?} after the restart",
        rejoined.saturating_sub(restarted)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_zone_is_refused_by_the_proxy_and_readmitted_by_the_rotation_annotation() {
    let _heavy = HEAVY.lock().await;
    let (client, shared) = shared_client().await.unwrap();
    install_kontinuum_crds(&client).await.unwrap();
    let ns = namespace(&client, "zone-readmit").await.unwrap();
    let dir = unique_dir("zone-readmit");
    std::fs::create_dir_all(&dir).unwrap();
    let hub = Hub::start(shared, &ns, &dir, TTL_SECONDS).await;
    let zone = JoinedZone::start(&client, shared, &ns, &dir, &hub, ("readmit", 22, Some(2))).await;
    let name = zone.name.as_str();
    let revoked_thumbprint = zone_status(&client, &ns, name)
        .await
        .identity_thumbprint
        .unwrap();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let hub_secret = identity::secret_name(name);

    // Revoked: the proxy refuses the zone's calls, the registration lapses.
    let refused_before = hub.refusals().await;
    secrets
        .delete(&hub_secret, &DeleteParams::default())
        .await
        .unwrap();
    let revoked = Instant::now();
    wait(&client, &ns, name, "Installed", "False", "IdentityRevoked").await;
    wait(&client, &ns, name, "Ready", "False", "IdentityRevoked").await;
    let said = revoked.elapsed();
    eventually(LIMIT, "the proxy refusing the revoked zone", || async {
        Ok(hub.refusals().await > refused_before)
    })
    .await
    .unwrap();
    let refused = revoked.elapsed();
    wait(
        &client,
        &ns,
        name,
        "RegistryJoined",
        "False",
        "WaitingForRegistry",
    )
    .await;
    let lapsed = revoked.elapsed();
    assert!(
        secrets.get_opt(&hub_secret).await.unwrap().is_none(),
        "a revoked zone is not re-issued an identity on its own"
    );

    // Re-admitted: a rotation request issues a new identity, trusted alone.
    let patch = json!({ "metadata": { "annotations": { ROTATE_IDENTITY: "readmit-1" } } });
    Api::<Zone>::namespaced(client.clone(), &ns)
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let readmitting = Instant::now();
    wait(&client, &ns, name, "Installed", "True", "Installed").await;
    let installed = readmitting.elapsed();
    wait(
        &client,
        &ns,
        name,
        "RegistryJoined",
        "True",
        "RegistryJoined",
    )
    .await;
    wait(&client, &ns, name, "Ready", "True", "Ready").await;
    let readmitted = readmitting.elapsed();

    let status = zone_status(&client, &ns, name).await;
    let thumbprint = status.identity_thumbprint.unwrap();
    assert_ne!(thumbprint, revoked_thumbprint, "a new identity");
    assert_eq!(status.identity_rotation.as_deref(), Some("readmit-1"));
    let trusted = secrets.get(&hub_secret).await.unwrap();
    assert_eq!(trusted.type_.as_deref(), Some(identity::SECRET_TYPE));
    assert_eq!(
        trusted_thumbprints(&trusted),
        vec![thumbprint.clone()],
        "the new certificate alone: the revoked one is not trusted again"
    );
    let held = Api::<Secret>::namespaced(zone.down.clone(), footprint::NAMESPACE)
        .get(footprint::IDENTITY_SECRET)
        .await
        .unwrap()
        .data
        .unwrap();
    let held = identity::certificates(&held[identity::CERT_KEY].0).remove(0);
    assert_eq!(identity::thumbprint(&held), thumbprint, "the zone holds it");
    let template = Api::<Deployment>::namespaced(zone.down.clone(), footprint::NAMESPACE)
        .get(footprint::DEPLOYMENT)
        .await
        .unwrap()
        .spec
        .template
        .metadata
        .unwrap()
        .annotations
        .unwrap();
    assert_eq!(template.get(IDENTITY_THUMBPRINT), Some(&thumbprint));
    eprintln!(
        "revoked: Installed=False/IdentityRevoked after {said:?}, the proxy refused the zone after {refused:?}, \
         RegistryJoined=False after {lapsed:?}; re-admitted by the annotation: Installed after {installed:?}, \
         RegistryJoined and Ready after {readmitted:?}"
    );
}

/// The Zone's identity Secrets on the hub.
async fn identity_secrets(client: &Client, ns: &str) -> Vec<Secret> {
    Api::<Secret>::namespaced(client.clone(), ns)
        .list(&ListParams::default().fields(&format!("type={}", identity::SECRET_TYPE)))
        .await
        .unwrap()
        .items
}

/// The thumbprints of the certificates a hub identity Secret trusts, in its order.
fn trusted_thumbprints(secret: &Secret) -> Vec<String> {
    let data = secret.data.clone().unwrap_or_default();
    identity::certificates(&data[identity::CERT_KEY].0)
        .iter()
        .map(|c| identity::thumbprint(c))
        .collect()
}

/// The cluster's secrets bundles on the hub.
async fn bundles(client: &Client, ns: &str) -> Vec<Secret> {
    Api::<Secret>::namespaced(client.clone(), ns)
        .list(&ListParams::default().labels("app.kubernetes.io/component=talos-cluster-secrets"))
        .await
        .unwrap()
        .items
}

/// The whole flow of a zone on the test bed, every operator a process: the emulator's one
/// machine, instance-discovery, pool-claimer, talos-bootstrapper and addon-installer (in
/// that order in `operators`), the hub's store, proxy and registry, and a kubeconfig for
/// the zone-installer (started by each test, so that it can be killed on its own).
struct Flow {
    client: Client,
    ns: String,
    address: Ipv4Addr,
    emulator: Emulator,
    operators: Vec<Operator>,
    hub: Hub,
    zone_installer_kubeconfig: PathBuf,
    _repo: ChartRepo,
}

impl Flow {
    async fn start(label: &str, address: Ipv4Addr) -> Self {
        let (client, shared) = shared_client().await.unwrap();
        install_kontinuum_crds(&client).await.unwrap();
        let ns = namespace(&client, label).await.unwrap();
        let dir = unique_dir(label);
        std::fs::create_dir_all(&dir).unwrap();
        let emulator = Emulator::start(Settings {
            machines: 1,
            first_address: address,
            port: 50000,
            api_port: 6443,
            dir: unique_dir(&format!("emulator-{label}")),
            control_addr: None,
        })
        .await
        .unwrap();
        let bootstrapper = workspace_binary("talos-bootstrapper").unwrap();
        let (mut operators, _) = start_operators(&client, shared, &ns, &bootstrapper, &[])
            .await
            .unwrap();
        let tools = Tools::locate().unwrap();
        let repo = ChartRepo::serve(&tools).await.unwrap();
        operators.push(
            start_addon_installer_with_role(
                &client,
                shared,
                &ns,
                &repo.url,
                &["--resync-interval", "2s"],
            )
            .await
            .unwrap(),
        );
        let hub = Hub::start(shared, &ns, &dir, 300).await;
        let zone_installer_kubeconfig =
            service_account_kubeconfig(&client, shared, &ns, "zone-installer", "cluster-admin")
                .await
                .unwrap();
        Self {
            client,
            ns,
            address,
            emulator,
            operators,
            hub,
            zone_installer_kubeconfig,
            _repo: repo,
        }
    }

    async fn zone_installer(&self) -> Operator {
        start_zone_installer(&self.zone_installer_kubeconfig, &self.ns, &self.hub, "60s").await
    }

    fn zones(&self) -> Api<Zone> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    fn clusters(&self) -> Api<TalosCluster> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    fn bootstraps(&self) -> u32 {
        self.emulator.bootstrap_calls(self.address).unwrap_or(0)
    }

    /// Creates the Zone alone, as a GitOps repository would.
    async fn add(&self, name: &str, zone: &str) {
        let manifest: Zone = serde_json::from_value(json!({
            "apiVersion": "kontinuum.sh/v1alpha2", "kind": "Zone",
            "metadata": { "name": name },
            "spec": { "region": "eu", "zone": zone, "seed": { "talosAddresses": [self.address.to_string()] } },
        }))
        .unwrap();
        self.zones()
            .create(&PostParams::default(), &manifest)
            .await
            .unwrap();
    }

    /// Whether the Zone and its TalosCluster are gone.
    async fn gone(&self, name: &str) -> bool {
        matches!(self.zones().get_opt(name).await, Ok(None))
            && matches!(self.clusters().get_opt(name).await, Ok(None))
    }

    /// After the Zone went Ready: `bootstraps` Bootstrap calls in all, one secrets bundle,
    /// one identity Secret trusting exactly the identity in use (the one the zone holds),
    /// and the zone's registration mirrored once. `what` names the run in the messages.
    async fn assert_converged(&self, name: &str, zone: &str, bootstraps: u32, what: &str) {
        let (client, ns) = (&self.client, self.ns.as_str());
        assert_eq!(
            self.bootstraps(),
            bootstraps,
            "{what}: exactly one Bootstrap call"
        );
        assert_eq!(
            bundles(client, ns).await.len(),
            1,
            "{what}: one secrets bundle"
        );
        let identities = identity_secrets(client, ns).await;
        assert_eq!(
            identities
                .iter()
                .map(kube::ResourceExt::name_any)
                .collect::<Vec<_>>(),
            vec![identity::secret_name(name)],
            "{what}: one identity Secret"
        );
        let thumbprint = zone_status(client, ns, name)
            .await
            .identity_thumbprint
            .unwrap();
        assert_eq!(
            trusted_thumbprints(&identities[0]),
            vec![thumbprint.clone()],
            "{what}: the hub trusts exactly the identity in use"
        );
        let down = kontinuum_e2e::testbed::client_from(
            &stored_kubeconfig(client, ns, name).await.unwrap(),
        )
        .await
        .unwrap();
        let held = Api::<Secret>::namespaced(down, footprint::NAMESPACE)
            .get(footprint::IDENTITY_SECRET)
            .await
            .unwrap()
            .data
            .unwrap();
        let held = identity::certificates(&held[identity::CERT_KEY].0).remove(0);
        assert_eq!(
            identity::thumbprint(&held),
            thumbprint,
            "{what}: the zone holds it"
        );
        assert_eq!(
            registrations(client, ns, zone).await,
            1,
            "{what}: the zone's registration is mirrored once"
        );
    }

    /// After the Zone and its TalosCluster are gone: the machine back in maintenance mode
    /// with no Bootstrap since (`bootstraps` in all), the seed Instance released, and the
    /// identity Secret, the bundle and the registration collected. `log` is the
    /// restarted talos-bootstrapper's, shown if the machine was not reset.
    async fn assert_removed(&self, zone: &str, bootstraps: u32, what: &str, log: &Path) {
        let (client, ns) = (&self.client, self.ns.as_str());
        assert_eq!(
            self.emulator.mode(self.address),
            Some(Mode::Maintenance),
            "{what}: the machine was not reset; the talos-bootstrapper's log ({}):\n{}",
            log.display(),
            std::fs::read_to_string(log).unwrap_or_default()
        );
        assert_eq!(
            self.bootstraps(),
            bootstraps,
            "{what}: no Bootstrap during the teardown"
        );
        let seed = seed_instance_name("eu", zone, &self.address.to_string()).unwrap();
        eventually(LIMIT, "the seed Instance released", || async {
            Ok(Api::<Instance>::namespaced(client.clone(), ns)
                .get(&seed)
                .await?
                .labels()
                .get(CLAIMED_BY)
                .is_none())
        })
        .await
        .unwrap();
        eventually(
            LIMIT,
            "the identity Secret, the bundle and the registration collected",
            || async {
                Ok(identity_secrets(client, ns).await.is_empty()
                    && bundles(client, ns).await.is_empty()
                    && registrations(client, ns, zone).await == 0)
            },
        )
        .await
        .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_killed_at_fixed_points_of_add_and_remove_converge_with_one_bootstrap() {
    const NAME: &str = "eu-faults";
    let _heavy = HEAVY.lock().await;
    let mut flow = Flow::start("zone-faults", Ipv4Addr::new(127, 88, 0, 1)).await;
    let mut zone_installer = flow.zone_installer().await;
    let (client, ns) = (flow.client.clone(), flow.ns.clone());
    let clusters = flow.clusters();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let mut kills: Vec<(&str, Duration)> = Vec::new();

    let started = Instant::now();
    flow.add(NAME, "faults").await;

    // 1. The zone-installer, right after the fan-out appears.
    eventually(LIMIT, "the fan-out's TalosCluster", || async {
        Ok(clusters.get_opt(NAME).await?.is_some())
    })
    .await
    .unwrap();
    zone_installer.restart().await.unwrap();
    kills.push(("zone-installer after the fan-out", started.elapsed()));

    // 2. The talos-bootstrapper, right after the Bootstrap call.
    eventually(LIMIT, "the Bootstrap call", || async {
        Ok(flow.bootstraps() >= 1)
    })
    .await
    .unwrap();
    flow.operators[2].kill().await.unwrap();
    kills.push(("talos-bootstrapper after Bootstrap", started.elapsed()));
    let bundle_uid = bundles(&client, &ns)
        .await
        .first()
        .and_then(kube::ResourceExt::uid);
    flow.operators[2].restart().await.unwrap();

    // 3. The zone-installer, right after the identity Secret appears.
    eventually(LIMIT, "the identity Secret", || async {
        Ok(secrets
            .get_opt(&identity::secret_name(NAME))
            .await?
            .is_some())
    })
    .await
    .unwrap();
    zone_installer.restart().await.unwrap();
    kills.push((
        "zone-installer after the identity Secret",
        started.elapsed(),
    ));

    // Ready: the agent installed in the emulated zone cluster heartbeats through the proxy.
    wait(&client, &ns, NAME, "Ready", "True", "Ready").await;
    let ready = started.elapsed();
    flow.assert_converged(NAME, "faults", 1, "fixed points")
        .await;
    if bundle_uid.is_some() {
        assert_eq!(
            bundles(&client, &ns).await[0].uid(),
            bundle_uid,
            "the bundle was never regenerated"
        );
    }

    // Remove.
    let removing = Instant::now();
    flow.zones()
        .delete(NAME, &DeleteParams::default())
        .await
        .unwrap();

    // 4. The zone-installer, once its teardown has started.
    eventually(LIMIT, "the Zone Deleting", || async {
        Ok(zone_condition(&client, &ns, NAME, "Deleting")
            .await
            .is_some_and(|(s, _, _)| s == "True"))
    })
    .await
    .unwrap();
    zone_installer.kill().await.unwrap();
    kills.push((
        "zone-installer during the Zone's teardown",
        started.elapsed(),
    ));
    assert!(
        flow.zones().get_opt(NAME).await.unwrap().is_some(),
        "killed while the Zone was still being torn down"
    );
    zone_installer.restart().await.unwrap();

    // 5. The talos-bootstrapper, once the TalosCluster is being deleted (machines reset).
    eventually(LIMIT, "the TalosCluster being deleted", || async {
        Ok(clusters
            .get_opt(NAME)
            .await?
            .is_none_or(|c| c.metadata.deletion_timestamp.is_some()))
    })
    .await
    .unwrap();
    let still = clusters.get_opt(NAME).await.unwrap().is_some();
    flow.operators[2].kill().await.unwrap();
    kills.push((
        "talos-bootstrapper during the TalosCluster's teardown",
        started.elapsed(),
    ));
    assert!(
        still,
        "killed while the TalosCluster was still being torn down"
    );
    flow.operators[2].restart().await.unwrap();

    eventually(LIMIT, "the Zone and its TalosCluster gone", || async {
        Ok(flow.gone(NAME).await)
    })
    .await
    .unwrap();
    let removed = removing.elapsed();
    // A talos-bootstrapper restarted during teardown must not reconcile the deleted
    // TalosCluster before its Instance store has synced (it would find no member and finish
    // without resetting the machine): its log is shown if it did.
    let log = flow.operators[2].log.clone();
    flow.assert_removed("faults", 1, "fixed points", &log).await;
    let notes: Vec<String> =
        Api::<k8s_openapi::api::events::v1::Event>::namespaced(client.clone(), &ns)
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(NAME))
            .filter_map(|e| e.note)
            .collect();
    assert!(
        notes
            .iter()
            .any(|n| n.contains("teardown finished: zone footprint removed")),
        "{notes:#?}"
    );
    let issued: Vec<&String> = notes.iter().filter(|n| n.contains("identity")).collect();
    drop(zone_installer);
    eprintln!(
        "zone faults: killed {kills:?}; Ready after {ready:?}, removed {removed:?} after the delete; \
         1 Bootstrap, 1 secrets bundle, 1 identity Secret; identity events {issued:?}"
    );
    flow.emulator.shutdown().await;
}

/// Longest a kill phase of the chaos test lasts in kills; after that the flow is let run.
const MAX_KILLS_PER_PHASE: usize = 25;

/// Kills a random one of `operators` or of the hub's processes at random moments, restarts
/// it at once, until `done` holds (checked before every kill) or `MAX_KILLS_PER_PHASE`
/// kills; `log` gets `<seconds since started> <what>` for each. Returns the kills made.
async fn kill_until<F, Fut>(
    rng: &mut Rng,
    (operators, hub): (&mut [Operator], &mut Hub),
    (started, log): (Instant, &mut Vec<String>),
    mut done: F,
) -> usize
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let mut kills = 0;
    while kills < MAX_KILLS_PER_PHASE && !done().await {
        // A random kill point, not a wait for a condition.
        tokio::time::sleep(rng.between(Duration::from_millis(200), Duration::from_millis(2500)))
            .await;
        let victim = rng.index(operators.len() + 2);
        let what = if let Some(operator) = operators.get_mut(victim) {
            operator.restart().await.unwrap();
            operator.name().to_owned()
        } else {
            let part = if victim == operators.len() {
                HubPart::Proxy
            } else {
                HubPart::Registry
            };
            hub.join.restart(part).await.unwrap();
            format!("{part:?}").to_lowercase()
        };
        log.push(format!("{:.1}s {what}", started.elapsed().as_secs_f64()));
        kills += 1;
    }
    kills
}

/// The Kontinuum objects of zone `zone` on the hub.
async fn registrations(client: &Client, ns: &str, zone: &str) -> usize {
    Api::<Kontinuum>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter(|k| k.spec.zone.as_deref() == Some(zone))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_operator_killed_at_random_points_of_add_and_remove_repeatedly_converges() {
    const NAME: &str = "eu-chaos";
    // Add/remove rounds of the same Zone; more with KONTINUUM_CHAOS_ROUNDS.
    let rounds: u64 = std::env::var("KONTINUUM_CHAOS_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(2);
    let _heavy = HEAVY.lock().await;
    let mut flow = Flow::start("zone-chaos", Ipv4Addr::new(127, 89, 0, 1)).await;
    let zone_installer = flow.zone_installer().await;
    flow.operators.push(zone_installer);
    let (client, ns) = (flow.client.clone(), flow.ns.clone());
    let mut rng = Rng::from_env();
    eprintln!("zone chaos: {}", rng.replay());
    let mut log = Vec::new();
    let mut summary = Vec::new();
    for round in 1..=rounds {
        let what = format!("round {round}");
        let bootstraps = flow.bootstraps();
        let started = Instant::now();
        flow.add(NAME, "chaos").await;
        log.push(format!("{what}: add"));
        let Flow { operators, hub, .. } = &mut flow;
        let add_kills = kill_until(&mut rng, (operators, hub), (started, &mut log), || async {
            zone_condition(&client, &ns, NAME, "Ready")
                .await
                .is_some_and(|(s, _, _)| s == "True")
        })
        .await;
        wait(&client, &ns, NAME, "Ready", "True", "Ready").await;
        let ready = started.elapsed();
        flow.assert_converged(
            NAME,
            "chaos",
            bootstraps + 1,
            &format!("{what}; kills {log:?}"),
        )
        .await;

        // Remove, killing again.
        let removing = Instant::now();
        flow.zones()
            .delete(NAME, &DeleteParams::default())
            .await
            .unwrap();
        log.push(format!("{what}: remove"));
        let zones = flow.zones();
        let clusters = flow.clusters();
        let Flow { operators, hub, .. } = &mut flow;
        let remove_kills = kill_until(&mut rng, (operators, hub), (started, &mut log), || async {
            matches!(zones.get_opt(NAME).await, Ok(None))
                && matches!(clusters.get_opt(NAME).await, Ok(None))
        })
        .await;
        eventually(LIMIT, "the Zone and its TalosCluster gone", || async {
            Ok(flow.gone(NAME).await)
        })
        .await
        .unwrap();
        let removed = removing.elapsed();
        let bootstrapper_log = flow.operators[2].log.clone();
        flow.assert_removed(
            "chaos",
            bootstraps + 1,
            &format!("{what}; kills {log:?}"),
            &bootstrapper_log,
        )
        .await;
        summary.push(format!(
            "{what}: {add_kills} kills, Ready after {ready:.1?}; {remove_kills} kills, removed {removed:.1?} after the delete"
        ));
    }
    let total = log.iter().filter(|l| !l.starts_with("round")).count();
    let killed: std::collections::BTreeSet<&str> = log
        .iter()
        .filter(|l| !l.starts_with("round"))
        .filter_map(|l| l.split_whitespace().nth(1))
        .collect();
    eprintln!("zone chaos: {summary:#?}\nkills: {log:#?}");
    eprintln!("zone chaos: {total} kills over {rounds} rounds, of {killed:?}");
    flow.emulator.shutdown().await;
}
