//! One emulated machine at run time: its core state behind a lock, its files under
//! `<dir>/<address>/`, its listener (TLS chosen per connection from the current mode), its
//! injected faults, and — on a bootstrapped control plane — its real test-bed cluster, whose
//! machines are hostlet (or KWOK) nodes (see [`crate::nodes`]).
//!
//! Processes of a cluster — the control plane's components, its own hostlet and the hostlets
//! of workers that joined — are started from the cluster's tasks on the emulator's runtime,
//! whose threads they die with (parent-death signal), and are stopped with the cluster.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kontinuum_talos_config::{CertAndKey, ParsedConfig, Sensitive, parse_machine_config};
use kontinuum_testbed::{ControlPlane, ControlPlaneConfig, Hostlet, HostletConfig, Tools};
use kube::api::{Api, DeleteParams, PostParams};
use rustls::ServerConfig;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tonic::transport::server::Connected;

use kontinuum_proto::talos::machine::apply_configuration_request::Mode as ApplyMode;

use crate::cluster_config::{self, CONTROL_PLANE_ROLE, ClusterSettings};
use crate::core::{self, Core, Effects, Facts, KnownControlPlane, Mode, Refusal, Role};
use crate::error::Error;
use crate::nodes::{self, Agent, NodeSettings};
use crate::pki;

/// Emulator-wide settings and the list of machines (so that machines find their cluster).
pub(crate) struct Shared {
    pub machines: Vec<Arc<Machine>>,
    /// Port of every control plane's API server; 0 picks a free one per bootstrap.
    pub api_port: u16,
    /// The first machine's address and the machine count (for pod ranges).
    first_address: Ipv4Addr,
    machine_count: usize,
    /// The emulator's state directory (the default image map is written there).
    dir: PathBuf,
    node_settings: NodeSettings,
    tools: Mutex<Option<Tools>>,
    /// How long a machine stays unreachable when a Reboot or Upgrade reboots it, in ms.
    pub reboot_downtime_ms: std::sync::atomic::AtomicU64,
    /// How long a shared IP stays with a holder that powered off: the TTL of its etcd
    /// election lease, in ms.
    pub vip_lease_ttl_ms: std::sync::atomic::AtomicU64,
    /// Who holds each shared IP now, for tests.
    pub vip_holders: Mutex<BTreeMap<IpAddr, Ipv4Addr>>,
    /// The node agent, resolved on first use.
    agent: Mutex<Option<Agent>>,
}

impl Shared {
    pub fn new(
        api_port: u16,
        first_address: Ipv4Addr,
        machine_count: usize,
        dir: PathBuf,
        node_settings: NodeSettings,
    ) -> Self {
        Self {
            machines: Vec::new(),
            api_port,
            first_address,
            machine_count,
            dir,
            node_settings,
            tools: Mutex::new(None),
            reboot_downtime_ms: std::sync::atomic::AtomicU64::new(DEFAULT_REBOOT_DOWNTIME_MS),
            vip_lease_ttl_ms: std::sync::atomic::AtomicU64::new(crate::vip::DEFAULT_LEASE_TTL_MS),
            vip_holders: Mutex::new(BTreeMap::new()),
            agent: Mutex::new(None),
        }
    }

    /// The node agent of new clusters (resolved once: a missing hostlet is warned about once).
    fn agent(&self) -> Agent {
        let mut cached = lock(&self.agent);
        if let Some(agent) = cached.as_ref() {
            return agent.clone();
        }
        let helm = self.tools().ok().map(|t| t.path("helm"));
        let agent = nodes::resolve(&self.node_settings, &self.dir, helm.as_deref());
        *cached = Some(agent.clone());
        agent
    }

    /// The pod range of the machine at `address`.
    fn pod_cidr(&self, address: Ipv4Addr) -> Option<String> {
        let index = self
            .machines
            .iter()
            .position(|m| m.facts.address == address)?;
        nodes::pod_cidr(self.first_address, self.machine_count, index)
    }

    /// Whether the machine at `address` is a configured worker of the cluster `cluster_id`
    /// named `hostname`.
    fn is_joiner_of(&self, cluster_id: Option<&String>, address: Ipv4Addr, hostname: &str) -> bool {
        self.joiners_of(cluster_id)
            .iter()
            .any(|(a, h)| *a == address && h == hostname)
    }

    /// The configured machines of a cluster that join the bootstrapped one: its workers and
    /// its other control planes (etcd members that joined the first), by address and
    /// hostname.
    fn joiners_of(&self, cluster_id: Option<&String>) -> Vec<(Ipv4Addr, String)> {
        self.members_of(cluster_id)
            .into_iter()
            .filter(|(m, _)| lock(&m.cluster).is_none())
            .map(|(m, hostname)| (m.facts.address, hostname))
            .collect()
    }

    /// Every configured machine with this cluster id, with its hostname.
    fn members_of(&self, cluster_id: Option<&String>) -> Vec<(&Arc<Machine>, String)> {
        self.machines
            .iter()
            .filter_map(|m| {
                let inner = m.lock();
                let config = inner.core.active_config()?;
                (config.cluster_id.as_ref() == cluster_id)
                    .then(|| (m, inner.core.hostname(&m.facts)))
            })
            .collect()
    }

    fn tools(&self) -> Result<Tools, kontinuum_testbed::Error> {
        let mut cached = lock(&self.tools);
        if let Some(tools) = cached.as_ref() {
            return Ok(tools.clone());
        }
        let tools = Tools::locate()?;
        *cached = Some(tools.clone());
        Ok(tools)
    }

    /// The cluster whose control plane was bootstrapped with `cluster_id`.
    fn cluster(&self, cluster_id: Option<&String>) -> Option<Arc<Cluster>> {
        self.machines.iter().find_map(|m| {
            lock(&m.cluster)
                .as_ref()
                .filter(|c| c.id.as_ref() == cluster_id)
                .cloned()
        })
    }

    /// Every configured control plane (for the worker-config cluster check).
    fn control_planes(&self) -> Vec<KnownControlPlane> {
        self.machines
            .iter()
            .filter_map(|m| {
                let inner = m.lock();
                let config = inner.core.active_config()?;
                config
                    .machine_type
                    .is_control_plane()
                    .then(|| KnownControlPlane {
                        address: m.facts.address,
                        cluster_id: config.cluster_id.clone(),
                        kubernetes_ca_pem: config.kubernetes_ca.cert_pem.clone(),
                        os_ca_pem: config.os_ca.cert_pem.clone(),
                    })
            })
            .collect()
    }

    /// The OS CA key of the cluster whose OS CA certificate is `cert_pem` (workers have no
    /// key; Talos gets their certificate from trustd on a control plane).
    fn os_ca_key(&self, cert_pem: &str) -> Option<Sensitive> {
        self.machines.iter().find_map(|m| {
            let inner = m.lock();
            let config = inner.core.config.as_ref()?;
            (config.os_ca.cert_pem.trim() == cert_pem.trim())
                .then(|| config.os_ca.key_pem.clone())
                .flatten()
        })
    }
}

/// A rebooting machine's unreachable time, unless [`crate::Emulator::set_reboot_downtime`]
/// says otherwise.
pub(crate) const DEFAULT_REBOOT_DOWNTIME_MS: u64 = 1000;

pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Faults injected through the control interface.
#[derive(Clone, Debug, Default)]
#[expect(
    clippy::struct_excessive_bools,
    reason = "independent switches: any combination can be injected"
)]
pub(crate) struct Faults {
    pub hang_until: Option<tokio::time::Instant>,
    pub refuse: bool,
    pub unavailable: bool,
    /// Rebooting (a Reboot or Upgrade RPC): new connections are refused, as `refuse`, until
    /// the reboot's downtime is over.
    pub rebooting: bool,
    /// Powered off ([`crate::Fault::PowerOff`]): nothing answers, as `refuse`, and it takes
    /// part in no election (its shared IP's lease runs out).
    pub powered_off: bool,
    /// Armed: what happens after the next Bootstrap took effect, before it is answered.
    pub after_bootstrap: Option<After>,
    /// Armed: what happens after the next ApplyConfiguration took effect.
    pub after_apply: Option<After>,
}

/// An armed fault point: what a call that took effect does instead of answering at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum After {
    /// Answer this much later.
    Hang(Duration),
    /// Reboot (connections made before are stale), cutting this call's connection.
    Reboot,
    /// Cut this call's connection.
    Drop,
    /// Answer, then refuse new connections.
    Refuse,
}

/// Which call an armed fault point follows.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Call {
    Bootstrap,
    Apply,
}

/// Cuts one connection from inside a call: its reads and writes fail from then on, so the
/// transport closes with the answer unsent.
#[derive(Debug, Default)]
pub(crate) struct Cut {
    cut: std::sync::atomic::AtomicBool,
    waker: Mutex<Option<std::task::Waker>>,
}

impl Cut {
    pub(crate) fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        if let Some(waker) = lock(&self.waker).take() {
            waker.wake();
        }
    }

    /// `Some(error)` once cut; else remembers the waker, so a cut wakes the connection.
    fn check(&self, cx: &Context<'_>) -> Option<std::io::Error> {
        if !self.cut.load(Ordering::SeqCst) {
            *lock(&self.waker) = Some(cx.waker().clone());
            if !self.cut.load(Ordering::SeqCst) {
                return None;
            }
        }
        Some(std::io::Error::new(
            std::io::ErrorKind::ConnectionReset,
            "connection cut by an injected fault",
        ))
    }
}

pub(crate) struct Inner {
    pub core: Core,
    maintenance_key: Vec<u8>,
    maintenance_tls: Option<Arc<ServerConfig>>,
    configured_tls: Option<(u64, Arc<ServerConfig>)>,
}

/// A running control plane's state.
pub(crate) enum Phase {
    Starting,
    Running(Box<ControlPlane>),
    Failed(String),
    Stopped,
}

/// The downstream cluster a control plane bootstrapped.
pub(crate) struct Cluster {
    pub id: Option<String>,
    pub server: String,
    pub phase: tokio::sync::Mutex<Phase>,
    start: Mutex<Option<JoinHandle<()>>>,
    /// What runs its machines' Nodes.
    agent: Agent,
    /// The machines that joined (workers, and the other control planes as etcd members), by
    /// node name, with their hostlet (`None`: a KWOK node). The lock also orders joins and
    /// leaves, so that a machine that left is never joined again by a late join.
    joined: tokio::sync::Mutex<BTreeMap<String, Option<Hostlet>>>,
}

impl Cluster {
    /// An admin client, if the control plane runs.
    pub async fn client(&self) -> Result<kube::Client, String> {
        match &*self.phase.lock().await {
            Phase::Running(cp) => Ok(cp.client()),
            Phase::Starting => Err("control plane is starting".to_owned()),
            Phase::Failed(e) => Err(format!("control plane failed to start: {e}")),
            Phase::Stopped => Err("control plane is stopped".to_owned()),
        }
    }

    async fn stop(&self) {
        let start = lock(&self.start).take();
        if let Some(start) = start {
            start.abort();
            let _ = start.await;
        }
        let joined = std::mem::take(&mut *self.joined.lock().await);
        for hostlet in joined.into_values().flatten() {
            hostlet.stop().await;
        }
        let phase = std::mem::replace(&mut *self.phase.lock().await, Phase::Stopped);
        if let Phase::Running(cp) = phase {
            cp.stop().await;
        }
    }
}

/// One emulated machine.
pub struct Machine {
    pub(crate) facts: Facts,
    dir: PathBuf,
    port: AtomicU16,
    inner: Mutex<Inner>,
    pub(crate) faults: watch::Sender<Faults>,
    pub(crate) cluster: Mutex<Option<Arc<Cluster>>>,
    shared: Weak<Shared>,
    /// Bootstrap RPCs that passed admission (successful or not), for tests.
    pub(crate) bootstrap_calls: std::sync::atomic::AtomicU32,
    /// ApplyConfiguration RPCs that reached the machine (admitted or not, valid or not),
    /// for tests.
    pub(crate) apply_calls: std::sync::atomic::AtomicU32,
    /// Configs refused as invalid (`InvalidArgument`: nothing applied), for tests.
    pub(crate) rejected_configs: std::sync::atomic::AtomicU32,
    /// Armed faults carried out, for tests.
    pub(crate) fired_faults: std::sync::atomic::AtomicU32,
    /// Reboot RPCs that reached the machine (admitted or not), for tests.
    pub(crate) reboot_calls: std::sync::atomic::AtomicU32,
    /// Upgrade RPCs that reached the machine (admitted or not, valid or not), for tests.
    pub(crate) upgrade_calls: std::sync::atomic::AtomicU32,
    /// The last [`CALLS_KEPT`] calls of the RPCs that change a machine, for tests and
    /// benchmarks.
    calls: Mutex<std::collections::VecDeque<CallRecord>>,
}

/// How many calls a machine remembers.
const CALLS_KEPT: usize = 1000;

/// One call a machine received: its RPC, when it arrived (before faults and
/// authorization) and when it ended (answered, refused, or abandoned by the caller), in Unix
/// milliseconds, and whether it succeeded. For a HealthCheck, the end is the end of its
/// stream.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CallRecord {
    /// `ApplyConfiguration`, `Bootstrap`, `Kubeconfig`, `HealthCheck`, `Reboot` or
    /// `Upgrade`.
    pub rpc: String,
    /// Arrival, Unix milliseconds.
    pub started_ms: u64,
    /// End, Unix milliseconds (`None` while running).
    pub ended_ms: Option<u64>,
    /// Whether it succeeded (`None` while running).
    pub ok: Option<bool>,
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Records a call's end when dropped: ok once [`CallGuard::succeeded`] was called.
pub(crate) struct CallGuard {
    machine: Arc<Machine>,
    started_ms: u64,
    rpc: &'static str,
    ok: bool,
}

impl CallGuard {
    pub(crate) fn succeeded(&mut self) {
        self.ok = true;
    }
}

impl Drop for CallGuard {
    fn drop(&mut self) {
        let mut calls = lock(&self.machine.calls);
        if let Some(call) = calls
            .iter_mut()
            .rev()
            .find(|c| c.rpc == self.rpc && c.started_ms == self.started_ms && c.ended_ms.is_none())
        {
            call.ended_ms = Some(unix_ms());
            call.ok = Some(self.ok);
        }
    }
}

/// Written at Bootstrap, removed by a wipe: etcd has data, and the API server's port, so a
/// restarted emulator brings the control plane back as a rebooted Talos node does.
#[derive(Serialize, Deserialize)]
struct BootstrapFile {
    api_port: u16,
}

const BOOTSTRAP_FILE: &str = "bootstrap.json";

#[derive(Serialize, Deserialize)]
struct StateFile {
    configured: bool,
    /// The Talos version an Upgrade installed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    installed: Option<String>,
}

const STATE_FILE: &str = "state.json";
const CONFIG_FILE: &str = "config.yaml";
const KEY_FILE: &str = "maintenance-key.der";

fn io_err(what: String) -> impl FnOnce(std::io::Error) -> Error {
    move |source| Error::Io { what, source }
}

fn write_private(path: &Path, bytes: &[u8]) -> Result<(), Error> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .and_then(|mut f| f.write_all(bytes))
        .map_err(io_err(format!("writing {}", path.display())))
}

fn remove(path: &Path) -> Result<(), Error> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(io_err(format!("removing {}", path.display()))(e))
        }
        _ => Ok(()),
    }
}

impl Machine {
    /// Loads (or creates) the machine's state under `<base>/<address>/`.
    pub(crate) fn load(
        facts: Facts,
        base: &Path,
        port: u16,
        shared: Weak<Shared>,
    ) -> Result<Self, Error> {
        let dir = base.join(facts.address.to_string());
        std::fs::create_dir_all(&dir).map_err(io_err(format!("creating {}", dir.display())))?;
        let key_path = dir.join(KEY_FILE);
        let maintenance_key = if let Ok(key) = std::fs::read(&key_path) {
            key
        } else {
            let key = pki::generate_maintenance_key()?;
            write_private(&key_path, &key)?;
            key
        };
        let state = match std::fs::read(dir.join(STATE_FILE)) {
            Ok(bytes) => {
                serde_json::from_slice::<StateFile>(&bytes).map_err(|source| Error::State {
                    address: facts.address.to_string(),
                    source,
                })?
            }
            Err(_) => StateFile {
                configured: false,
                installed: None,
            },
        };
        let configured = state.configured;
        let config = match std::fs::read(dir.join(CONFIG_FILE)) {
            Ok(bytes) => {
                Some(
                    parse_machine_config(&bytes).map_err(|source| Error::StoredConfig {
                        address: facts.address.to_string(),
                        source: Box::new(source),
                    })?,
                )
            }
            Err(_) => None,
        };
        let bootstrap = std::fs::read(dir.join(BOOTSTRAP_FILE))
            .ok()
            .and_then(|b| serde_json::from_slice::<BootstrapFile>(&b).ok())
            .filter(|_| configured && config.is_some());
        let mut core = Core::restored(config, configured);
        core.bootstrapped = bootstrap.is_some();
        core.installed = state.installed;
        Ok(Self {
            facts,
            dir,
            port: AtomicU16::new(port),
            inner: Mutex::new(Inner {
                core,
                maintenance_key,
                maintenance_tls: None,
                configured_tls: None,
            }),
            faults: watch::Sender::new(Faults::default()),
            cluster: Mutex::new(None),
            shared,
            bootstrap_calls: std::sync::atomic::AtomicU32::new(0),
            apply_calls: std::sync::atomic::AtomicU32::new(0),
            fired_faults: std::sync::atomic::AtomicU32::new(0),
            rejected_configs: std::sync::atomic::AtomicU32::new(0),
            reboot_calls: std::sync::atomic::AtomicU32::new(0),
            upgrade_calls: std::sync::atomic::AtomicU32::new(0),
            calls: Mutex::new(std::collections::VecDeque::new()),
        })
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Inner> {
        lock(&self.inner)
    }

    pub(crate) fn shared(&self) -> Option<Arc<Shared>> {
        self.shared.upgrade()
    }

    /// The `replace` fault: a new maintenance key, as if another machine took this one's
    /// address. Persisted, so a restarted emulator keeps the new identity.
    pub(crate) fn replace_identity(&self) -> Result<(), Error> {
        let key = pki::generate_maintenance_key()?;
        let mut inner = self.lock();
        write_private(&self.dir.join(KEY_FILE), &key)?;
        inner.maintenance_key = key;
        inner.maintenance_tls = None;
        Ok(())
    }

    /// Where the machine's API listens.
    pub fn socket_addr(&self) -> SocketAddr {
        SocketAddr::new(
            IpAddr::V4(self.facts.address),
            self.port.load(Ordering::Relaxed),
        )
    }

    /// The current mode.
    pub fn mode(&self) -> Mode {
        self.lock().core.mode
    }

    fn persist_state(&self, core: &Core) -> Result<(), Error> {
        let state = StateFile {
            configured: core.mode == Mode::Configured,
            installed: core.installed.clone(),
        };
        let json = serde_json::to_vec(&state).map_err(|source| Error::State {
            address: self.facts.address.to_string(),
            source,
        })?;
        write_private(&self.dir.join(STATE_FILE), &json)
    }

    /// The TLS configuration for a new connection and what the connection may do.
    fn tls_for_connection(&self) -> Result<(Arc<ServerConfig>, ConnInfo, bool), Error> {
        let mut inner = self.lock();
        let generation = inner.core.generation;
        let info = ConnInfo {
            generation,
            roles: Arc::new(Vec::new()),
            cut: Arc::new(Cut::default()),
        };
        let Some(config) = inner.core.active_config().cloned() else {
            if let Some(tls) = &inner.maintenance_tls {
                return Ok((Arc::clone(tls), info, false));
            }
            let tls = pki::maintenance_config(&inner.maintenance_key, self.facts.address)?;
            inner.maintenance_tls = Some(Arc::clone(&tls));
            return Ok((tls, info, false));
        };
        if let Some((g, tls)) = &inner.configured_tls
            && *g == generation
        {
            return Ok((Arc::clone(tls), info, true));
        }
        let hostname = inner.core.hostname(&self.facts);
        drop(inner);
        let key = match config.os_ca.key_pem.clone() {
            Some(key) => key,
            None => self
                .shared()
                .and_then(|s| s.os_ca_key(&config.os_ca.cert_pem))
                .ok_or(Error::NoOsCaKey)?,
        };
        let os_ca = CertAndKey {
            cert_pem: config.os_ca.cert_pem.clone(),
            key_pem: key,
        };
        let tls = pki::configured_config(&os_ca, self.facts.address, &hostname)?;
        let mut inner = self.lock();
        if inner.core.generation == generation {
            inner.configured_tls = Some((generation, Arc::clone(&tls)));
        }
        Ok((tls, info, true))
    }

    /// Waits out an injected hang; fails if the machine is told to answer Unavailable.
    pub(crate) async fn endure_faults(&self) -> Result<(), tonic::Status> {
        loop {
            let faults = self.faults.borrow().clone();
            if faults.unavailable {
                return Err(tonic::Status::unavailable("machine is unavailable"));
            }
            match faults.hang_until {
                Some(until) if until > tokio::time::Instant::now() => {
                    let mut changed = self.faults.subscribe();
                    tokio::select! {
                        () = tokio::time::sleep_until(until) => {}
                        _ = changed.changed() => {}
                    }
                }
                _ => return Ok(()),
            }
        }
    }

    /// Records the arrival of an `rpc` call; its end is recorded when the guard drops.
    pub(crate) fn call(self: &Arc<Self>, rpc: &'static str) -> CallGuard {
        let started_ms = unix_ms();
        let mut calls = lock(&self.calls);
        if calls.len() == CALLS_KEPT {
            calls.pop_front();
        }
        calls.push_back(CallRecord {
            rpc: rpc.to_owned(),
            started_ms,
            ended_ms: None,
            ok: None,
        });
        CallGuard {
            machine: Arc::clone(self),
            started_ms,
            rpc,
            ok: false,
        }
    }

    /// The config the machine runs: the one its last accepted ApplyConfiguration carried,
    /// as persisted; `None` in maintenance mode.
    pub(crate) fn running_config(&self) -> Option<String> {
        if self.mode() != Mode::Configured {
            return None;
        }
        std::fs::read_to_string(self.dir.join(CONFIG_FILE)).ok()
    }

    /// The calls remembered, oldest first.
    pub(crate) fn calls(&self) -> Vec<CallRecord> {
        lock(&self.calls).iter().cloned().collect()
    }

    /// After a call that took effect: the fault point armed for it, if any (fired once).
    /// Returns when the call may be answered; a cut connection's call never is.
    pub(crate) async fn after(&self, call: Call, connection: &ConnInfo) {
        let mut armed = None;
        self.faults.send_if_modified(|f| {
            let slot = match call {
                Call::Bootstrap => &mut f.after_bootstrap,
                Call::Apply => &mut f.after_apply,
            };
            armed = slot.take();
            armed.is_some()
        });
        let Some(after) = armed else {
            return;
        };
        self.fired_faults.fetch_add(1, Ordering::Relaxed);
        tracing::info!(instance = %self.facts.address, ?call, ?after, "armed fault point reached");
        match after {
            After::Hang(d) => {
                tokio::time::sleep(d).await;
                return;
            }
            After::Reboot => {
                self.lock().core.reboot_in_place();
                connection.cut.cut();
            }
            After::Drop => connection.cut.cut(),
            After::Refuse => {
                self.faults.send_modify(|f| f.refuse = true);
                return;
            }
        }
        // The transport is closing: the caller never gets an answer. Bounded, so a call whose
        // connection somehow lives on still ends.
        tokio::time::sleep(Duration::from_secs(60)).await;
    }

    /// ApplyConfiguration on a configured machine, in `mode` as Talos takes it: the new
    /// config (already validated) replaces the running one; a change outside what applies
    /// live ([`core::needs_reboot`]) reboots the machine in `AUTO` and `REBOOT` mode and is
    /// refused in `NO_REBOOT` mode, as Talos refuses it; `STAGED` and `TRY` are not
    /// emulated. Returns the mode used, as Talos reports it.
    fn reconfigure(
        self: &Arc<Self>,
        bytes: &[u8],
        parsed: ParsedConfig,
        mode: ApplyMode,
    ) -> Result<ApplyMode, tonic::Status> {
        let path = self.dir.join(CONFIG_FILE);
        let old = std::fs::read_to_string(&path).unwrap_or_default();
        let new = std::str::from_utf8(bytes).unwrap_or_default();
        let reboot = match (mode, core::needs_reboot(&old, new)) {
            (ApplyMode::Staged | ApplyMode::Try, _) => {
                return Err(tonic::Status::unimplemented(
                    "staged and try modes are not emulated",
                ));
            }
            (ApplyMode::NoReboot, true) => {
                return Err(tonic::Status::failed_precondition(
                    "this config change can't be applied in immediate mode",
                ));
            }
            (ApplyMode::Reboot, _) | (ApplyMode::Auto, true) => true,
            (ApplyMode::NoReboot | ApplyMode::Auto, false) => false,
        };
        {
            let mut inner = self.lock();
            let mut applied = inner.core.clone();
            applied.reconfigure(parsed).map_err(Refusal::into_status)?;
            write_private(&path, bytes).map_err(|e| internal(&e))?;
            if reboot {
                applied.reboot_in_place();
            }
            self.persist_state(&applied).map_err(|e| internal(&e))?;
            inner.core = applied;
        }
        tracing::info!(instance = %self.facts.address, reboot, "applied a new machine config to the running machine");
        if reboot {
            self.go_down();
            return Ok(ApplyMode::Reboot);
        }
        Ok(ApplyMode::NoReboot)
    }

    /// ApplyConfiguration: validate, persist, switch to configured mode (a worker of a
    /// running cluster joins it); on a configured machine, [`Machine::reconfigure`].
    /// Returns the mode used.
    pub(crate) fn apply(
        self: &Arc<Self>,
        bytes: &[u8],
        mode: ApplyMode,
    ) -> Result<ApplyMode, tonic::Status> {
        let shared = self.shared().ok_or_else(stopping)?;
        let parsed = match core::validate_config(bytes, &self.facts, &shared.control_planes()) {
            Ok(parsed) => parsed,
            Err(refusal) => {
                self.rejected_configs.fetch_add(1, Ordering::Relaxed);
                if let Refusal::InvalidArgument(why) = &refusal {
                    // Problems name fields and lines, never values: safe to log.
                    tracing::warn!(instance = %self.facts.address, reason = "InvalidConfig", problems = %why, "refused a machine config");
                }
                return Err(refusal.into_status());
            }
        };
        let cluster_id = parsed.cluster_id.clone();
        if self.mode() == Mode::Configured {
            return self.reconfigure(bytes, parsed, mode);
        }
        {
            let mut inner = self.lock();
            if inner.core.mode != Mode::Maintenance {
                return Err(tonic::Status::aborted(
                    "the machine changed mode during the call",
                ));
            }
            write_private(&self.dir.join(CONFIG_FILE), bytes).map_err(|e| internal(&e))?;
            let mut applied = inner.core.clone();
            applied.apply(parsed).map_err(Refusal::into_status)?;
            self.persist_state(&applied).map_err(|e| internal(&e))?;
            inner.core = applied;
        }
        tracing::info!(instance = %self.facts.address, "applied machine config");
        if let Some(cluster) = shared.cluster(cluster_id.as_ref()) {
            let hostname = self.lock().core.hostname(&self.facts);
            let address = self.facts.address;
            let weak = Arc::downgrade(&shared);
            tokio::spawn(async move { join(&cluster, &weak, address, &hostname).await });
        }
        // Maintenance mode turns REBOOT and AUTO into NO_REBOOT.
        Ok(ApplyMode::NoReboot)
    }

    /// Bootstrap: starts the real control plane in the background.
    pub(crate) fn bootstrap(self: &Arc<Self>) -> Result<(), tonic::Status> {
        self.bootstrap_calls.fetch_add(1, Ordering::Relaxed);
        let tools = self.tools()?;
        self.lock().core.bootstrap().map_err(Refusal::into_status)?;
        self.start_control_plane(tools, None)
    }

    /// After an emulator restart: a bootstrapped control plane starts its cluster again on
    /// the same API port, as a rebooted Talos node restarts etcd and the API server.
    pub(crate) fn restart_control_plane(self: &Arc<Self>) -> Result<(), tonic::Status> {
        let bootstrapped = self.lock().core.bootstrapped;
        if !bootstrapped {
            return Ok(());
        }
        let port = std::fs::read(self.dir.join(BOOTSTRAP_FILE))
            .ok()
            .and_then(|b| serde_json::from_slice::<BootstrapFile>(&b).ok())
            .map(|f| f.api_port);
        let tools = self.tools()?;
        tracing::info!(instance = %self.facts.address, "restarting the bootstrapped control plane");
        self.start_control_plane(tools, port)
    }

    fn tools(&self) -> Result<Tools, tonic::Status> {
        let shared = self.shared().ok_or_else(stopping)?;
        shared.tools().map_err(|e| {
            tonic::Status::failed_precondition(format!(
                "control plane binaries unavailable: {}",
                kontinuum_testbed::error_chain(&e)
            ))
        })
    }

    fn start_control_plane(
        self: &Arc<Self>,
        tools: Tools,
        port: Option<u16>,
    ) -> Result<(), tonic::Status> {
        let shared = self.shared().ok_or_else(stopping)?;
        let (config, hostname) = {
            let inner = self.lock();
            let config = inner.core.active_config().cloned();
            (config, inner.core.hostname(&self.facts))
        };
        let config = config.ok_or_else(|| tonic::Status::internal("no active config"))?;
        let settings = self.cluster_settings();
        let (_, _, mut ignored) = settings.networks();
        let address = IpAddr::V4(self.facts.address);
        let port = match port {
            Some(port) => port, // a restart keeps the port it had
            None => choose_api_port(
                settings.api_port(self.facts.address),
                shared.api_port,
                address,
                &mut ignored,
            )?,
        };
        for setting in &ignored {
            tracing::warn!(instance = %self.facts.address, setting = %setting, "ignoring a config setting the emulator cannot honour");
        }
        let record = serde_json::to_vec(&BootstrapFile { api_port: port }).map_err(|source| {
            internal(&Error::State {
                address: self.facts.address.to_string(),
                source,
            })
        })?;
        write_private(&self.dir.join(BOOTSTRAP_FILE), &record).map_err(|e| internal(&e))?;
        let agent = shared.agent();
        let role = NodeRole::ControlPlane {
            tainted: !settings.allow_scheduling_on_control_planes,
        };
        let hostlet = match &agent {
            Agent::Kwok => None,
            Agent::Hostlet { binary, image_map } => Some(hostlet_config(
                &hostname,
                self.facts.address,
                shared.pod_cidr(self.facts.address),
                (image_map, binary),
                role,
            )),
        };
        let cluster = Arc::new(Cluster {
            id: config.cluster_id.clone(),
            server: format!("https://{}", SocketAddr::new(address, port)),
            phase: tokio::sync::Mutex::new(Phase::Starting),
            start: Mutex::new(None),
            agent,
            joined: tokio::sync::Mutex::new(BTreeMap::new()),
        });
        let mut cp_config = control_plane_config(&config, &settings, address, port)?;
        cp_config.dir = self.dir.join("control-plane");
        // A hostlet registers its own Node once the control plane runs.
        cp_config.nodes = if hostlet.is_some() {
            Vec::new()
        } else {
            vec![hostname.clone()]
        };
        // The node name first (run_cluster reads it), then what the config says the API
        // server's certificate names: the cluster endpoint's host (a load balancer or DNS
        // name in front of the machines) and `cluster.apiServer.certSANs`.
        cp_config.extra_dns = vec![hostname];
        let endpoint_host = settings
            .endpoint
            .as_deref()
            .and_then(core::endpoint_host)
            .map(str::to_owned);
        for san in endpoint_host
            .into_iter()
            .chain(settings.api_server_cert_sans.clone())
        {
            if san != address.to_string() && !cp_config.extra_dns.contains(&san) {
                cp_config.extra_dns.push(san);
            }
        }
        *lock(&self.cluster) = Some(Arc::clone(&cluster));
        tracing::info!(instance = %self.facts.address, "bootstrapping");
        // The control plane's processes and its hostlet are children of the thread running
        // this task: a thread of the emulator's runtime, which lives as long as the emulator.
        let handle = tokio::spawn(run_cluster(
            Arc::clone(&cluster),
            Arc::downgrade(&shared),
            tools,
            cp_config,
            (hostlet, role),
        ));
        *lock(&cluster.start) = Some(handle);
        Ok(())
    }

    /// The cluster settings of the config on disk (Talos' defaults if it cannot be read,
    /// which a config that passed validation always can).
    pub(crate) fn cluster_settings(&self) -> ClusterSettings {
        let path = self.dir.join(CONFIG_FILE);
        match std::fs::read(&path)
            .map_err(|e| e.to_string())
            .and_then(|b| cluster_config::read(&b))
        {
            Ok(settings) => settings,
            Err(problem) => {
                tracing::warn!(instance = %self.facts.address, problem = %problem, "reading the cluster settings of the config failed; using Talos' defaults");
                ClusterSettings::default()
            }
        }
    }

    /// How this machine's Node registers: a worker, or a control plane (tainted unless its
    /// config allows scheduling there).
    pub(crate) fn node_role(&self) -> NodeRole {
        match self.active_config() {
            Some(c) if c.machine_type.is_control_plane() => NodeRole::ControlPlane {
                tainted: !self.cluster_settings().allow_scheduling_on_control_planes,
            },
            _ => NodeRole::Worker,
        }
    }

    /// Reset or reboot effects: stop the control plane (and every hostlet of its cluster),
    /// remove the worker's node (stopping its hostlet first), wipe files, forget the identity.
    pub(crate) async fn carry_out(&self, effects: Effects) -> Result<(), Error> {
        if effects.stop_control_plane {
            let cluster = lock(&self.cluster).take();
            if let Some(cluster) = cluster {
                cluster.stop().await;
            }
        }
        if let Some((cluster_id, hostname)) = effects.leave_cluster
            && let Some(cluster) = self.shared().and_then(|s| s.cluster(cluster_id.as_ref()))
        {
            leave_cluster(&cluster, &hostname).await;
        }
        if effects.wipe_config {
            remove(&self.dir.join(CONFIG_FILE))?;
        }
        if effects.stop_control_plane || effects.wipe_config {
            remove(&self.dir.join(BOOTSTRAP_FILE))?;
        }
        let core = self.lock().core.clone();
        self.persist_state(&core)?;
        if effects.forget_identity {
            let key = pki::generate_maintenance_key()?;
            write_private(&self.dir.join(KEY_FILE), &key)?;
            let mut inner = self.lock();
            inner.maintenance_key = key;
            inner.maintenance_tls = None;
        }
        Ok(())
    }

    /// A Reboot RPC: the machine reboots in place (configured, its config, etcd data and
    /// cluster kept) and is unreachable for the reboot's downtime.
    pub(crate) fn reboot_rpc(self: &Arc<Self>) {
        self.lock().core.reboot_in_place();
        tracing::info!(instance = %self.facts.address, "rebooting");
        self.go_down();
    }

    /// An Upgrade RPC whose installer carries `version`: installed, then a reboot into it.
    pub(crate) fn upgrade(self: &Arc<Self>, version: &str) -> Result<(), tonic::Status> {
        {
            let mut inner = self.lock();
            let mut upgraded = inner.core.clone();
            upgraded
                .upgrade(version.to_owned())
                .map_err(Refusal::into_status)?;
            self.persist_state(&upgraded).map_err(|e| internal(&e))?;
            inner.core = upgraded;
        }
        tracing::info!(instance = %self.facts.address, version = %version, "upgrading");
        self.go_down();
        Ok(())
    }

    /// Refuses new connections for the reboot's downtime (connections made before are
    /// already stale: their generation has passed). The call that caused it is still
    /// answered on its own connection.
    fn go_down(self: &Arc<Self>) {
        let downtime =
            Duration::from_millis(self.shared().map_or(DEFAULT_REBOOT_DOWNTIME_MS, |s| {
                s.reboot_downtime_ms.load(Ordering::Relaxed)
            }));
        self.faults.send_modify(|f| f.rebooting = true);
        let machine = Arc::clone(self);
        tokio::spawn(async move {
            // The emulated reboot itself: the machine is away for this long.
            tokio::time::sleep(downtime).await;
            machine.faults.send_modify(|f| f.rebooting = false);
            tracing::info!(instance = %machine.facts.address, "back from the reboot");
        });
    }

    /// An actor id for an action's events (Talos answers a UUID; unique per call here).
    pub(crate) fn actor_id(&self, action: &str) -> String {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        format!("{action}-{}-{n}", self.facts.index)
    }

    /// The Talos version the machine runs.
    pub(crate) fn talos_version(&self) -> Option<String> {
        self.lock().core.installed.clone()
    }

    /// The injected `reboot` fault.
    pub(crate) async fn reboot(&self) -> Result<(), Error> {
        let effects = self.lock().core.reboot_to_maintenance();
        tracing::info!(instance = %self.facts.address, "rebooted into maintenance mode");
        self.carry_out(effects).await
    }

    /// What this machine campaigns for, if it may hold a shared IP now: the IP, the port the
    /// endpoint names, and its cluster's API server. A configured control plane whose config
    /// names a shared IP, powered on and not rebooting, a member of a running cluster
    /// (etcd up, as Talos waits for before it campaigns).
    pub(crate) async fn vip_candidate(&self) -> Option<(IpAddr, u16, SocketAddr)> {
        {
            let faults = self.faults.borrow();
            if faults.powered_off || faults.rebooting {
                return None;
            }
        }
        let control_plane = self
            .lock()
            .core
            .active_config()
            .is_some_and(|c| c.machine_type.is_control_plane());
        if !control_plane {
            return None;
        }
        let settings = self.cluster_settings();
        let vip = settings.shared_vip?;
        let port = settings
            .endpoint
            .as_deref()
            .and_then(cluster_config::endpoint_port)
            .unwrap_or(cluster_config::DEFAULT_LOCAL_API_PORT);
        let cluster = self.member_of()?;
        let hostname = self.lock().core.hostname(&self.facts);
        let joined =
            self.own_cluster().is_some() || cluster.joined.lock().await.contains_key(&hostname);
        if !joined || cluster.client().await.is_err() {
            return None;
        }
        let upstream = cluster
            .server
            .strip_prefix("https://")
            .and_then(|a| a.parse().ok())?;
        Some((vip, port, upstream))
    }

    /// This machine's cluster (control planes that bootstrapped).
    pub(crate) fn own_cluster(&self) -> Option<Arc<Cluster>> {
        lock(&self.cluster).clone()
    }

    /// The running cluster this machine belongs to: its own, or the one it joined.
    pub(crate) fn member_of(&self) -> Option<Arc<Cluster>> {
        self.own_cluster().or_else(|| {
            let id = self.lock().core.active_config()?.cluster_id.clone();
            self.shared()?.cluster(id.as_ref())
        })
    }

    /// The machines of this machine's cluster as a health check sees them now: every
    /// configured machine with its cluster id, whether it joined (the one that
    /// bootstrapped, or one in its cluster's joined set) and whether it answers.
    pub(crate) async fn members(&self) -> Vec<Member> {
        let cluster_id = self
            .lock()
            .core
            .active_config()
            .and_then(|c| c.cluster_id.clone());
        let Some(shared) = self.shared() else {
            return Vec::new();
        };
        let joined: Vec<String> = match shared.cluster(cluster_id.as_ref()) {
            Some(cluster) => cluster.joined.lock().await.keys().cloned().collect(),
            None => Vec::new(),
        };
        shared
            .members_of(cluster_id.as_ref())
            .into_iter()
            .map(|(m, hostname)| {
                let faults = m.faults.borrow().clone();
                let hung = faults
                    .hang_until
                    .is_some_and(|t| t > tokio::time::Instant::now());
                Member {
                    address: m.facts.address,
                    control_plane: m
                        .active_config()
                        .is_some_and(|c| c.machine_type.is_control_plane()),
                    joined: lock(&m.cluster).is_some() || joined.contains(&hostname),
                    answering: !(faults.refuse
                        || faults.rebooting
                        || faults.powered_off
                        || faults.unavailable
                        || hung),
                    hostname,
                }
            })
            .collect()
    }

    /// Stops this machine's control plane, if any (emulator shutdown).
    pub(crate) async fn shutdown(&self) {
        let cluster = lock(&self.cluster).take();
        if let Some(cluster) = cluster {
            cluster.stop().await;
        }
    }

    /// The active config, if configured.
    pub(crate) fn active_config(&self) -> Option<ParsedConfig> {
        self.lock().core.active_config().cloned()
    }
}

/// The control plane a config asks for, on `address:port`: its Kubernetes, etcd and
/// aggregator CAs, its ServiceAccount key, its pod and Service networks and its name.
fn control_plane_config(
    config: &ParsedConfig,
    settings: &ClusterSettings,
    address: IpAddr,
    port: u16,
) -> Result<ControlPlaneConfig, tonic::Status> {
    let key = config
        .kubernetes_ca
        .key_pem
        .as_ref()
        .ok_or_else(|| tonic::Status::failed_precondition("no kubernetes ca key"))?;
    let ca_of = |ca: &cluster_config::Ca| {
        pki::testbed_ca(&ca.cert_pem, &ca.key_pem).map_err(|e| internal(&e))
    };
    let (pods, services, _) = settings.networks();
    let mut cp = ControlPlaneConfig::new(PathBuf::new());
    cp.address = address;
    cp.port = port;
    cp.ca = Some(ca_of(&cluster_config::Ca {
        cert_pem: config.kubernetes_ca.cert_pem.clone(),
        key_pem: key.clone(),
    })?);
    cp.etcd_ca = settings.etcd_ca.as_ref().map(ca_of).transpose()?;
    cp.aggregator_ca = settings.aggregator_ca.as_ref().map(ca_of).transpose()?;
    cp.service_account_key_pem = settings
        .service_account_key
        .as_ref()
        .map(|k| pki::pkcs8_pem(k).map_err(|e| internal(&e)))
        .transpose()?;
    cp.pod_cidr = pods.map(str::to_owned);
    cp.service_cidr = services.map(str::to_owned);
    cp.cluster_name.clone_from(&settings.cluster_name);
    Ok(cp)
}

/// The API server's port: the config's when it is free on `address`, else (said in
/// `ignored`) `fallback` (0: a free port).
fn choose_api_port(
    wanted: u16,
    fallback: u16,
    address: IpAddr,
    ignored: &mut Vec<String>,
) -> Result<u16, tonic::Status> {
    if std::net::TcpListener::bind(SocketAddr::new(address, wanted)).is_ok() {
        return Ok(wanted);
    }
    ignored.push(format!("the API server port {wanted} (taken on {address})"));
    match fallback {
        0 => kontinuum_testbed::free_port(address)
            .map_err(|e| internal(&Error::Testbed(Box::new(e)))),
        port => Ok(port),
    }
}

/// How a machine's Node registers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum NodeRole {
    Worker,
    /// Labelled `node-role.kubernetes.io/control-plane`; `tainted`: with Talos'
    /// `node-role.kubernetes.io/control-plane:NoSchedule` taint too.
    ControlPlane {
        tainted: bool,
    },
}

impl NodeRole {
    /// The Node's labels and taints as a merge patch (`None` for a worker).
    fn patch(self) -> Option<serde_json::Value> {
        let NodeRole::ControlPlane { tainted } = self else {
            return None;
        };
        let taints: Vec<serde_json::Value> = if tainted {
            vec![serde_json::json!({"key": CONTROL_PLANE_ROLE, "effect": "NoSchedule"})]
        } else {
            Vec::new()
        };
        Some(serde_json::json!({
            "metadata": {"labels": {CONTROL_PLANE_ROLE: ""}},
            "spec": {"taints": taints},
        }))
    }
}

/// Labels (and taints) a control plane's Node as Talos' kubelet registers it.
async fn mark_node(client: &kube::Client, name: &str, role: NodeRole) {
    let Some(patch) = role.patch() else {
        return;
    };
    let api = Api::<Node>::all(client.clone());
    let params = kube::api::PatchParams::default();
    if let Err(err) = api
        .patch(name, &params, &kube::api::Patch::Merge(&patch))
        .await
    {
        tracing::warn!(
            node = name,
            error = &err as &dyn std::error::Error,
            "labelling a control plane's node failed"
        );
    }
}

fn stopping() -> tonic::Status {
    tonic::Status::unavailable("emulator is stopping")
}

pub(crate) fn internal(err: &Error) -> tonic::Status {
    tracing::warn!(error = err as &dyn std::error::Error, "internal error");
    tonic::Status::internal(kontinuum_testbed::error_chain(err))
}

/// Starts a cluster's control plane and the node of its machine (a hostlet, or a KWOK node
/// if hostlets are off or the hostlet does not come up), then joins the cluster's workers.
async fn run_cluster(
    cluster: Arc<Cluster>,
    shared: Weak<Shared>,
    tools: Tools,
    config: ControlPlaneConfig,
    (hostlet, role): (Option<HostletConfig>, NodeRole),
) {
    let node = config.extra_dns.first().cloned().unwrap_or_default();
    let started = Box::pin(ControlPlane::start(&tools, config)).await;
    let started = match (started, hostlet) {
        (Ok(mut cp), Some(hostlet)) => {
            if let Err(err) = cp.start_hostlet(&hostlet).await {
                tracing::warn!(
                    node = %hostlet.name,
                    error = &err as &dyn std::error::Error,
                    "the hostlet node did not come up; joining as a kwok node"
                );
                create_kwok_node(&cp.client(), &hostlet.name).await;
            }
            Ok(cp)
        }
        (started, _) => started,
    };
    // A hostlet registers with its role already; a KWOK node gets it now.
    if let Ok(cp) = &started {
        mark_node(&cp.client(), &node, role).await;
    }
    let mut phase = cluster.phase.lock().await;
    match started {
        Ok(cp) => {
            tracing::info!(cluster = %cluster.server, "control plane ready");
            *phase = Phase::Running(Box::new(cp));
        }
        Err(err) => {
            tracing::warn!(
                error = &err as &dyn std::error::Error,
                "control plane failed"
            );
            *phase = Phase::Failed(kontinuum_testbed::error_chain(&err));
            return;
        }
    }
    drop(phase);
    // Machines configured before etcd was bootstrapped (the other control planes) join
    // now, as Talos' wait for etcd to be bootstrapped elsewhere and then join it.
    let joiners = shared
        .upgrade()
        .map(|s| s.joiners_of(cluster.id.as_ref()))
        .unwrap_or_default();
    for (address, hostname) in joiners {
        join(&cluster, &shared, address, &hostname).await;
    }
}

/// The hostlet of the node `name` at `address`: pods on their own addresses from
/// `pod_cidr`, unmapped images pretended Running/Ready as KWOK does.
fn hostlet_config(
    name: &str,
    address: Ipv4Addr,
    pod_cidr: Option<String>,
    (image_map, binary): (&Path, &Path),
    role: NodeRole,
) -> HostletConfig {
    let mut config = HostletConfig::new(name, address, image_map, binary);
    config.pod_cidr = pod_cidr;
    config.pretend_unmapped = true;
    if let NodeRole::ControlPlane { tainted } = role {
        config
            .labels
            .push((CONTROL_PLANE_ROLE.to_owned(), String::new()));
        if tainted {
            config
                .taints
                .push(format!("{CONTROL_PLANE_ROLE}:NoSchedule"));
        }
    }
    config
}

/// A worker joins its cluster: a hostlet node of its own, started against the cluster's API
/// server (a KWOK Node if hostlets are off or its hostlet does not come up). A no-op while
/// the control plane is starting (its start joins the workers), for a node already there,
/// and for a worker that has left since.
async fn join(cluster: &Cluster, shared: &Weak<Shared>, address: Ipv4Addr, hostname: &str) {
    let Ok(client) = cluster.client().await else {
        return; // joined when the control plane is up
    };
    let mut joined = cluster.joined.lock().await;
    let Some(shared) = shared.upgrade() else {
        return;
    };
    if joined.contains_key(hostname) || !shared.is_joiner_of(cluster.id.as_ref(), address, hostname)
    {
        return;
    }
    let role = shared
        .machines
        .iter()
        .find(|m| m.facts.address == address)
        .map_or(NodeRole::Worker, |m| m.node_role());
    let Agent::Hostlet { binary, image_map } = &cluster.agent else {
        create_kwok_node(&client, hostname).await;
        mark_node(&client, hostname, role).await;
        joined.insert(hostname.to_owned(), None);
        return;
    };
    let config = hostlet_config(
        hostname,
        address,
        shared.pod_cidr(address),
        (image_map, binary),
        role,
    );
    drop(shared);
    let (cluster_dir, kubeconfig) = match &*cluster.phase.lock().await {
        Phase::Running(cp) => (cp.dir().to_path_buf(), cp.kubeconfig_path().to_path_buf()),
        _ => return,
    };
    match Hostlet::start(&config, &cluster_dir, &kubeconfig, &client).await {
        Ok(hostlet) => {
            tracing::info!(node = hostname, "joined the cluster");
            joined.insert(hostname.to_owned(), Some(hostlet));
        }
        Err(err) => {
            tracing::warn!(
                node = hostname,
                error = &err as &dyn std::error::Error,
                "the hostlet node did not come up; joining as a kwok node"
            );
            create_kwok_node(&client, hostname).await;
            mark_node(&client, hostname, role).await;
            joined.insert(hostname.to_owned(), None);
        }
    }
}

/// Creates a KWOK Node (KWOK marks it Ready and pretends its pods run).
async fn create_kwok_node(client: &kube::Client, hostname: &str) {
    let node: Result<Node, _> = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": hostname,
            "annotations": {
                kontinuum_testbed::KWOK_NODE_ANNOTATION: "fake",
                "node.alpha.kubernetes.io/ttl": "0"
            },
            "labels": {
                "type": "kwok",
                "kubernetes.io/hostname": hostname,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
            }
        }
    }));
    let Ok(node) = node else { return };
    match Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &node)
        .await
    {
        Ok(_) => tracing::info!(node = hostname, "worker joined"),
        Err(kube::Error::Api(status)) if status.code == 409 => {}
        Err(err) => tracing::warn!(
            node = hostname,
            error = &err as &dyn std::error::Error,
            "worker join failed"
        ),
    }
}

/// A worker leaves its cluster: its hostlet stops (its pods with it), then its Node goes.
async fn leave_cluster(cluster: &Cluster, hostname: &str) {
    let mut joined = cluster.joined.lock().await;
    if let Some(hostlet) = joined.remove(hostname).flatten() {
        hostlet.stop().await;
    }
    let Ok(client) = cluster.client().await else {
        return;
    };
    match Api::<Node>::all(client)
        .delete(hostname, &DeleteParams::default())
        .await
    {
        Ok(_) => tracing::info!(node = hostname, "left the cluster"),
        Err(kube::Error::Api(status)) if status.code == 404 => {}
        Err(err) => tracing::warn!(
            node = hostname,
            error = &err as &dyn std::error::Error,
            "removing node failed"
        ),
    }
}

/// A machine of a cluster as the health check sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Member {
    pub address: Ipv4Addr,
    pub hostname: String,
    pub control_plane: bool,
    /// Bootstrapped the cluster, or joined it (an etcd member for a control plane).
    pub joined: bool,
    /// Its Talos API and services answer (no `refuse`, `unavailable` or `hang` fault).
    pub answering: bool,
}

/// What a connection may do: the generation it was accepted in and its client roles.
#[derive(Clone, Debug)]
pub(crate) struct ConnInfo {
    pub generation: u64,
    pub roles: Arc<Vec<Role>>,
    /// Cuts this connection (armed fault points).
    pub cut: Arc<Cut>,
}

/// A TLS connection handed to tonic, carrying its [`ConnInfo`].
pub(crate) struct TlsIo {
    stream: tokio_rustls::server::TlsStream<TcpStream>,
    info: ConnInfo,
}

impl Connected for TlsIo {
    type ConnectInfo = ConnInfo;
    fn connect_info(&self) -> ConnInfo {
        self.info.clone()
    }
}

impl AsyncRead for TlsIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if let Some(err) = self.info.cut.check(cx) {
            return Poll::Ready(Err(err));
        }
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for TlsIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        if let Some(err) = self.info.cut.check(cx) {
            return Poll::Ready(Err(err));
        }
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// Binds the machine's listener (the port is fixed after the first bind).
pub(crate) async fn bind(machine: &Machine) -> Result<TcpListener, Error> {
    let addr = machine.socket_addr();
    let listener = TcpListener::bind(addr)
        .await
        .map_err(io_err(format!("binding {addr}")))?;
    if let Ok(local) = listener.local_addr() {
        machine.port.store(local.port(), Ordering::Relaxed);
    }
    Ok(listener)
}

/// Accepts connections until the process ends: TLS per the current mode, `refuse` drops the
/// listener until cleared.
pub(crate) async fn accept_loop(
    machine: Arc<Machine>,
    mut listener: Option<TcpListener>,
    connections: mpsc::Sender<std::io::Result<TlsIo>>,
) {
    let mut faults = machine.faults.subscribe();
    loop {
        let refuse = {
            let f = faults.borrow_and_update();
            f.refuse || f.rebooting || f.powered_off
        };
        if refuse {
            listener = None;
            if faults.changed().await.is_err() {
                return;
            }
            continue;
        }
        let Some(current) = listener.as_ref() else {
            match bind(&machine).await {
                Ok(l) => listener = Some(l),
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
            continue;
        };
        tokio::select! {
            accepted = current.accept() => {
                let Ok((tcp, _)) = accepted else { continue };
                let machine = Arc::clone(&machine);
                let connections = connections.clone();
                tokio::spawn(async move {
                    if let Some(io) = handshake(&machine, tcp).await {
                        let _ = connections.send(Ok(io)).await;
                    }
                });
            }
            changed = faults.changed() => {
                if changed.is_err() {
                    return;
                }
            }
        }
    }
}

async fn handshake(machine: &Machine, tcp: TcpStream) -> Option<TlsIo> {
    let _ = tcp.set_nodelay(true);
    let (config, mut info, configured) = match machine.tls_for_connection() {
        Ok(v) => v,
        Err(err) => {
            tracing::debug!(
                error = &err as &dyn std::error::Error,
                "no tls configuration"
            );
            return None;
        }
    };
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    let stream = tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp))
        .await
        .ok()?
        .ok()?;
    if configured {
        let roles = stream
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|c| c.first())
            .map(|leaf| pki::roles_of(leaf))
            .unwrap_or_default();
        info.roles = Arc::new(roles);
    }
    Some(TlsIo { stream, info })
}
