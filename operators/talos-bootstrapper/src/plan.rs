//! Pure decisions of the TalosCluster controller: who the members are, which machine the
//! cluster endpoint is, what the Addon aggregation says, the order of teardown, and the
//! conditions each step leads to. No I/O, no clock (callers pass `now`).

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kontinuum_crds::conditions::{self, ConditionStatus};
use kontinuum_crds::labels::CLAIMED_BY;
use kontinuum_crds::reasons::{
    InstanceCondition, InstanceCondition as ICond, InstanceReason as IReason,
    TalosClusterCondition, TalosClusterCondition as Cond, TalosClusterReason,
    TalosClusterReason as Reason,
};
use kontinuum_crds::v1alpha2::{
    Addon, BuiltinAddon, ConfigPatch, Instance, TalosCluster, TeardownOutcome,
};
use kontinuum_operator_common::error::chain;
use kontinuum_talos_config::TalosVersion;
use kube::ResourceExt as _;

/// Talos version of a cluster whose `spec.talos.version` is unset.
pub const DEFAULT_TALOS_VERSION: &str = "v1.13.0";
/// Kubernetes version of a cluster whose `spec.kubernetes.version` is unset.
pub const DEFAULT_KUBERNETES_VERSION: &str = "v1.32.0";

/// Whether a member is a control-plane node or a worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Runs etcd and the Kubernetes control plane.
    ControlPlane,
    /// Runs workloads only.
    Worker,
}

/// One claimed Instance as the controller sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    /// Instance name, also the machine's hostname.
    pub name: String,
    /// The pool that claimed it.
    pub pool: String,
    /// Control plane or worker.
    pub role: Role,
    /// The address to dial (`status.address`, else the first of `spec.interfaces`).
    pub address: Option<String>,
    /// `Discovered=True`.
    pub discovered: bool,
    /// `Configured=True`.
    pub configured: bool,
    /// `Joined=True`.
    pub joined: bool,
    /// The Talos version the machine reported in maintenance mode.
    pub talos_version: Option<String>,
    /// The identity its maintenance connection must prove: `spec.identity` (the user's
    /// pin), else `status.identity` (recorded at discovery).
    pub identity: Option<String>,
    /// The Instance's own machine-config patches (`spec.configPatches`), merged last.
    pub config_patches: Vec<ConfigPatch>,
}

impl Member {
    /// Reads an Instance claimed by `pool`.
    pub fn from_instance(instance: &Instance, pool: &str, role: Role) -> Self {
        let status = instance.status.as_ref();
        let conds = status.map(|s| s.conditions.as_slice()).unwrap_or_default();
        Self {
            name: instance.name_any(),
            pool: pool.to_owned(),
            role,
            address: dial_address(instance),
            discovered: conditions::is_true(conds, InstanceCondition::Discovered),
            configured: conditions::is_true(conds, InstanceCondition::Configured),
            joined: conditions::is_true(conds, InstanceCondition::Joined),
            talos_version: status
                .and_then(|s| s.talos.as_ref())
                .and_then(|t| t.version.clone()),
            identity: instance
                .spec
                .identity
                .clone()
                .or_else(|| status.and_then(|s| s.identity.clone())),
            config_patches: instance.spec.config_patches.clone(),
        }
    }

    /// Ready to be configured or already part of the cluster: discovered (or configured,
    /// after which discovery stops) and with an address.
    pub fn usable(&self) -> bool {
        (self.discovered || self.configured) && self.address.is_some()
    }
}

/// The machine-config patches of a cluster's spec: the cluster's, then each pool's.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Patches {
    /// The control planes' `Layer2VIPConfig` of `spec.controlPlane.endpoint.vip`.
    vip: Option<ConfigPatch>,
    cluster: Vec<ConfigPatch>,
    /// By InstancePool name: the field holding the pool's patches, and the patches.
    pools: BTreeMap<String, (String, Vec<ConfigPatch>)>,
}

/// One patch to merge, and where it is written (for a person to find it by).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourcedPatch<'a> {
    /// E.g. `TalosCluster spec.workers[gpu].configPatches[1]`.
    pub source: String,
    /// The patch document.
    pub patch: &'a ConfigPatch,
}

impl Patches {
    /// The patches `cluster`'s spec gives.
    pub fn of(cluster: &TalosCluster) -> Self {
        let spec = &cluster.spec;
        let mut pools = BTreeMap::new();
        pools.insert(
            spec.control_plane.pool_ref.name.clone(),
            (
                "spec.controlPlane.configPatches".to_owned(),
                spec.control_plane.config_patches.clone(),
            ),
        );
        for worker in &spec.workers {
            pools.insert(
                worker.pool_ref.name.clone(),
                (
                    format!("spec.workers[{}].configPatches", worker.name),
                    worker.config_patches.clone(),
                ),
            );
        }
        let vip = spec
            .control_plane
            .endpoint
            .as_ref()
            .and_then(|e| e.vip.as_ref())
            .map(|vip| {
                [
                    ("apiVersion", "v1alpha1"),
                    ("kind", "Layer2VIPConfig"),
                    ("name", vip.ip.as_str()),
                    ("link", vip.link.as_str()),
                ]
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.into()))
                .collect::<ConfigPatch>()
            });
        Self {
            vip,
            cluster: spec
                .talos
                .as_ref()
                .map(|t| t.config_patches.clone())
                .unwrap_or_default(),
            pools,
        }
    }

    /// The patches of `member`'s config, in merge order: on a control plane the shared IP's
    /// document first (a part of the generated config a patch may change), then the
    /// cluster's, its pool's, its Instance's.
    pub fn for_member<'a>(&'a self, member: &'a Member) -> Vec<SourcedPatch<'a>> {
        let sourced = |field: &str, patches: &'a [ConfigPatch]| {
            let field = field.to_owned();
            patches
                .iter()
                .enumerate()
                .map(move |(i, patch)| SourcedPatch {
                    source: format!("{field}[{i}]"),
                    patch,
                })
        };
        let cluster = sourced("TalosCluster spec.talos.configPatches", &self.cluster);
        let pool = self
            .pools
            .get(&member.pool)
            .into_iter()
            .flat_map(|(field, patches)| sourced(&format!("TalosCluster {field}"), patches));
        let own = sourced(
            &format!("Instance {} spec.configPatches", member.name),
            &member.config_patches,
        );
        let vip = self
            .vip
            .iter()
            .filter(|_| member.role == Role::ControlPlane)
            .map(|patch| SourcedPatch {
                source: "TalosCluster spec.controlPlane.endpoint.vip".to_owned(),
                patch,
            });
        vip.chain(cluster).chain(pool).chain(own).collect()
    }
}

/// The address to dial for an Instance: the one that answered discovery, else the first
/// listed. Host only (the Talos port is the operator's setting).
pub fn dial_address(instance: &Instance) -> Option<String> {
    instance
        .status
        .as_ref()
        .and_then(|s| s.address.clone())
        .or_else(|| instance.spec.interfaces.first().cloned())
        .filter(|a| !a.is_empty())
}

/// The members of a cluster, name-sorted within each pool.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Members {
    /// Control-plane members.
    pub control_plane: Vec<Member>,
    /// Worker members by worker pool name, in `spec.workers` order.
    pub workers: Vec<(String, Vec<Member>)>,
}

impl Members {
    /// Every member: workers first (pool order), then the control plane — teardown order.
    pub fn teardown_order(&self) -> Vec<&Member> {
        self.workers
            .iter()
            .flat_map(|(_, members)| members.iter())
            .chain(self.control_plane.iter())
            .collect()
    }

    /// Finds a member by Instance name.
    pub fn get(&self, name: &str) -> Option<&Member> {
        self.teardown_order().into_iter().find(|m| m.name == name)
    }
}

/// Pure: the members of `cluster` among `instances` (any namespace; filtered here).
pub fn members(cluster: &TalosCluster, instances: &[impl AsRef<Instance>]) -> Members {
    let ns = cluster.namespace();
    let of_pool = |pool: &str, role: Role| {
        let mut found: Vec<Member> = instances
            .iter()
            .map(AsRef::as_ref)
            .filter(|i| i.namespace() == ns)
            .filter(|i| i.labels().get(CLAIMED_BY).map(String::as_str) == Some(pool))
            .map(|i| Member::from_instance(i, pool, role))
            .collect();
        found.sort_by(|a, b| a.name.cmp(&b.name));
        found
    };
    Members {
        control_plane: of_pool(
            &cluster.spec.control_plane.pool_ref.name,
            Role::ControlPlane,
        ),
        workers: cluster
            .spec
            .workers
            .iter()
            .map(|w| (w.name.clone(), of_pool(&w.pool_ref.name, Role::Worker)))
            .collect(),
    }
}

/// Pure: the control-plane member whose address is the cluster endpoint. Sticky: the member
/// already serving as endpoint (`current_host`) keeps the role while it is a usable member;
/// otherwise the first usable member by name.
pub fn endpoint_member<'a>(
    control_plane: &'a [Member],
    current_host: Option<&str>,
) -> Option<&'a Member> {
    let usable = || control_plane.iter().filter(|m| m.usable());
    current_host
        .and_then(|host| usable().find(|m| m.address.as_deref() == Some(host)))
        .or_else(|| usable().next())
}

/// The Kubernetes API endpoint of a cluster whose endpoint member is at `host`:
/// `https://<host>:6443` (IPv6 in brackets), as the machine configs say.
pub fn endpoint_url(host: &str) -> String {
    let port = kontinuum_talos_config::KUBERNETES_API_PORT;
    if host.contains(':') {
        format!("https://[{host}]:{port}")
    } else {
        format!("https://{host}:{port}")
    }
}

/// The host of an endpoint URL such as `https://192.0.2.10:6443` or `https://[2001:db8::1]:6443`.
pub fn endpoint_host(url: &str) -> Option<&str> {
    let rest = url.strip_prefix("https://")?;
    let authority = rest.split('/').next()?;
    if let Some(v6) = authority.strip_prefix('[') {
        return v6.split(']').next();
    }
    authority
        .rsplit_once(':')
        .map_or(Some(authority), |(h, _)| Some(h))
}

/// The Addon aggregation of a cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AddonsView {
    /// Built-ins to create now: missing, and due (`gateway-api-crds` and `cilium` once the
    /// kubeconfig is stored, `cert-manager` once the control plane is ready).
    pub to_seed: Vec<BuiltinAddon>,
    /// The Cilium Addon is `Ready`.
    pub cni_ready: bool,
    /// Why Cilium is not ready (for `ControlPlaneReady`'s message).
    pub cni_message: String,
    /// `AddonsReady` status, reason and message.
    pub ready: bool,
    /// The message: `all addons installed and healthy` or `waiting for addons: …`.
    pub message: String,
}

/// Pure: what the Addons of `cluster` (from `addons`, any namespace and cluster) say, given
/// how far the cluster is.
pub fn addons_view(
    cluster: &TalosCluster,
    addons: &[impl AsRef<Addon>],
    kubeconfig_stored: bool,
    control_plane_ready: bool,
) -> AddonsView {
    let ns = cluster.namespace();
    let name = cluster.name_any();
    let mine: Vec<&Addon> = addons
        .iter()
        .map(AsRef::as_ref)
        .filter(|a| a.namespace() == ns && a.spec.talos_cluster_ref.name == name)
        .collect();
    let by_release: BTreeMap<&str, &Addon> = mine.iter().map(|a| (a.release_name(), *a)).collect();

    let mut to_seed = Vec::new();
    for builtin in BuiltinAddon::ALL {
        let due = match builtin {
            BuiltinAddon::GatewayApiCrds | BuiltinAddon::Cilium => kubeconfig_stored,
            BuiltinAddon::CertManager => control_plane_ready,
        };
        let seed_name = kontinuum_crds::names::builtin_addon_name(&name, builtin.release_name())
            .unwrap_or_default();
        let present = by_release.contains_key(builtin.release_name())
            || mine.iter().any(|a| a.name_any() == seed_name);
        if due && !present {
            to_seed.push(builtin);
        }
    }

    let (cni_ready, cni_message) = match by_release.get(BuiltinAddon::Cilium.release_name()) {
        Some(a) if !a.spec.enabled => (true, "the cilium Addon is disabled".to_owned()),
        Some(a) => addon_ready(a).map_or_else(
            |why| {
                (
                    false,
                    format!("waiting for Addon {} (cilium): {why}", a.name_any()),
                )
            },
            |()| (true, String::new()),
        ),
        None => (
            false,
            "waiting for the cilium Addon to be created".to_owned(),
        ),
    };

    let mut waiting = Vec::new();
    for builtin in BuiltinAddon::ALL {
        if !by_release.contains_key(builtin.release_name()) {
            waiting.push(format!(
                "{}: Pending: not created yet",
                builtin.release_name()
            ));
        }
    }
    let mut enabled: Vec<&Addon> = mine.iter().copied().filter(|a| a.spec.enabled).collect();
    enabled.sort_by(|a, b| a.release_name().cmp(b.release_name()));
    for addon in enabled {
        if let Err(why) = addon_ready(addon) {
            waiting.push(format!("{}: {why}", addon.release_name()));
        }
    }
    waiting.sort();
    let ready = waiting.is_empty();
    let message = if ready {
        "all addons installed and healthy".to_owned()
    } else {
        format!("waiting for addons: {}", waiting.join("; "))
    };
    AddonsView {
        to_seed,
        cni_ready,
        cni_message,
        ready,
        message,
    }
}

/// What of an Addon its cluster's reconcile reads (`AddonsReady`, seeding the built-ins): an
/// Addon event that changes none of it (most of the addon-installer's status writes) does
/// not wake the cluster.
pub fn addon_trigger_key(addon: &Addon) -> (bool, Option<i64>, Result<(), String>) {
    (
        addon.metadata.deletion_timestamp.is_some(),
        addon.metadata.generation,
        addon_ready(addon),
    )
}

/// `Ok` when the Addon is `Ready=True` for its current generation and not being deleted;
/// otherwise `<reason>: <message>` (reason `Pending` when it has no `Ready` yet).
fn addon_ready(addon: &Addon) -> Result<(), String> {
    if addon.metadata.deletion_timestamp.is_some() {
        return Err("Deleting: the Addon is being deleted".to_owned());
    }
    let conds = addon
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default();
    match conditions::get(conds, conditions::READY) {
        Some(c) if c.status == ConditionStatus::True.as_str() => Ok(()),
        Some(c) => Err(if c.message.is_empty() {
            c.reason.clone()
        } else {
            format!("{}: {}", c.reason, c.message)
        }),
        None => Err("Pending".to_owned()),
    }
}

/// Pure: the `Ready` summary from the gates.
pub fn ready_condition(status: &[Condition], deleting: bool, generation: Option<i64>) -> Condition {
    conditions::ready(
        status,
        TalosClusterCondition::READY_GATES,
        deleting,
        generation,
    )
}

/// One condition to set: what every decision below returns, so a table can check it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Set<C, R> {
    /// The condition type.
    pub condition: C,
    /// Its status.
    pub status: ConditionStatus,
    /// Its reason.
    pub reason: R,
    /// Its message.
    pub message: String,
}

/// A condition of the TalosCluster to set.
pub type ClusterSet = Set<Cond, Reason>;
/// A condition of a member Instance to set.
pub type MemberSet = Set<ICond, IReason>;

fn set<C, R>(
    condition: C,
    status: ConditionStatus,
    reason: R,
    message: impl Into<String>,
) -> Set<C, R> {
    Set {
        condition,
        status,
        reason,
        message: message.into(),
    }
}

/// Pure: the Talos version to render for, or `Bootstrapped=False/UnsupportedTalosVersion`.
pub fn talos_version(requested: &str) -> Result<TalosVersion, ClusterSet> {
    TalosVersion::parse(requested)
        .and_then(|v| v.contract().map(|_| v))
        .map_err(|err| {
            set(
                Cond::Bootstrapped,
                ConditionStatus::False,
                Reason::UnsupportedTalosVersion,
                format!("spec.talos.version: {}", chain(&err)),
            )
        })
}

/// Pure: the intent recorded just before Bootstrap is called on `endpoint`.
pub fn bootstrap_intent(endpoint: &str) -> ClusterSet {
    set(
        Cond::Bootstrapped,
        ConditionStatus::Unknown,
        Reason::Bootstrapping,
        format!("calling Bootstrap on {endpoint}"),
    )
}

/// Pure: `Bootstrapped=True`, `how` it is known, on `endpoint`.
pub fn bootstrapped(how: &str, endpoint: &str) -> ClusterSet {
    set(
        Cond::Bootstrapped,
        ConditionStatus::True,
        Reason::Bootstrapped,
        format!("{how} on {endpoint}"),
    )
}

/// Pure: `KubeconfigAvailable=True`, stored in `secret`.
pub fn kubeconfig_stored(secret: &str, key: &str) -> ClusterSet {
    set(
        Cond::KubeconfigAvailable,
        ConditionStatus::True,
        Reason::KubeconfigAvailable,
        format!("kubeconfig stored in Secret {secret} key {key}"),
    )
}

/// Pure: `Deleting=True` while teardown waits for `pending` machines: `ResettingInstances`
/// while nothing failed (a machine still on its way to maintenance mode), `TeardownFailed`
/// once a reset or release failed (the message has the last error).
pub fn teardown_waiting(
    pending: usize,
    last_error: Option<&str>,
    deadline: Deadline,
) -> ClusterSet {
    let reason = if last_error.is_some() {
        Reason::TeardownFailed
    } else {
        Reason::ResettingInstances
    };
    set(
        Cond::Deleting,
        ConditionStatus::True,
        reason,
        teardown_message(pending, last_error, &deadline.to_string()),
    )
}

/// How long a reconcile that cannot go on waits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wait {
    /// A human must act (restore a Secret): the periodic resync.
    Resync,
    /// Something else will act soon (the garbage collector): the short retry.
    Retry,
}

/// A reconcile that stops at a step: the conditions it leaves, and how long it waits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Halt {
    /// The conditions to set.
    pub sets: Vec<ClusterSet>,
    /// How long to wait.
    pub wait: Wait,
}

/// Pure: the secrets Secret `secret` is gone although a bundle was used. Never regenerated:
/// `KubeconfigAvailable` (and `Bootstrapped`, unless it is already True) say so.
pub fn secret_missing(secret: &str, bootstrapped: bool) -> Halt {
    let message = format!(
        "Secret {secret} with the talos secrets bundle is gone; the machines trust its CAs, so it is never regenerated: restore it from a backup"
    );
    let mut sets = vec![set(
        Cond::KubeconfigAvailable,
        ConditionStatus::False,
        Reason::SecretsBundleMissing,
        message.clone(),
    )];
    if !bootstrapped {
        sets.push(set(
            Cond::Bootstrapped,
            ConditionStatus::False,
            Reason::SecretsBundleMissing,
            message,
        ));
    }
    Halt {
        sets,
        wait: Wait::Resync,
    }
}

fn stale_message(secret: &str) -> String {
    format!(
        "Secret {secret} belongs to an earlier cluster of the same name; waiting for the garbage collector to delete it"
    )
}

/// Pure: the secrets Secret of that name belongs to an earlier cluster.
pub fn secret_stale(secret: &str) -> Halt {
    Halt {
        sets: vec![set(
            Cond::Bootstrapped,
            ConditionStatus::False,
            Reason::StaleSecret,
            stale_message(secret),
        )],
        wait: Wait::Retry,
    }
}

/// Pure: the kubeconfig Secret of that name belongs to an earlier cluster.
pub fn kubeconfig_stale(secret: &str) -> Vec<ClusterSet> {
    vec![set(
        Cond::KubeconfigAvailable,
        ConditionStatus::False,
        Reason::StaleSecret,
        stale_message(secret),
    )]
}

/// Pure: the kubeconfig could not be fetched from the endpoint yet.
pub fn kubeconfig_unfetched(error: &str) -> Vec<ClusterSet> {
    vec![
        set(
            Cond::KubeconfigAvailable,
            ConditionStatus::False,
            Reason::Bootstrapping,
            format!("waiting for the kubeconfig: {error}"),
        ),
        set(
            Cond::ControlPlaneReady,
            ConditionStatus::False,
            Reason::Bootstrapping,
            "waiting for the kubeconfig",
        ),
    ]
}

/// Pure: no claimed, discovered control-plane machine. What is already True stays
/// (nothing latches back to False for a machine that is only briefly away), except
/// `ControlPlaneReady`.
pub fn no_control_plane(current: &[Condition]) -> Vec<ClusterSet> {
    let message = "no claimed, discovered control-plane instance yet";
    [
        Cond::Bootstrapped,
        Cond::KubeconfigAvailable,
        Cond::ControlPlaneReady,
    ]
    .into_iter()
    .filter(|c| *c == Cond::ControlPlaneReady || !conditions::is_true(current, *c))
    .map(|c| {
        set(
            c,
            ConditionStatus::False,
            Reason::WaitingForInstances,
            message,
        )
    })
    .collect()
}

/// Pure: whether the cluster endpoint survives the loss of one control-plane machine:
/// `spec.controlPlane.endpoint` (`configured`) is set, or there is one control plane;
/// otherwise a warning naming the one machine everything points at.
pub fn endpoint_shared(
    configured: Option<&str>,
    control_planes: usize,
    member: &str,
) -> ClusterSet {
    let (status, reason, message) = match configured {
        Some(host) => (
            ConditionStatus::True,
            Reason::EndpointConfigured,
            format!(
                "every machine config and the kubeconfig use {}",
                endpoint_url(host)
            ),
        ),
        None if control_planes <= 1 => (
            ConditionStatus::True,
            Reason::SingleControlPlane,
            format!("one control plane: the endpoint is {member}'s address"),
        ),
        None => (
            ConditionStatus::False,
            Reason::EndpointIsOneMachine,
            format!(
                "{control_planes} control planes, but the endpoint is {member}'s address: if it \
                 stops, every kubeconfig points at a dead address; a new cluster should set \
                 spec.controlPlane.endpoint.host (a load balancer or DNS name in front of them)"
            ),
        ),
    };
    set(Cond::EndpointShared, status, reason, message)
}

/// Pure: while a possibly delivered Bootstrap is awaited.
pub fn bootstrap_pending(message: String) -> Vec<ClusterSet> {
    vec![
        set(
            Cond::Bootstrapped,
            ConditionStatus::Unknown,
            Reason::Bootstrapping,
            message,
        ),
        set(
            Cond::KubeconfigAvailable,
            ConditionStatus::False,
            Reason::Bootstrapping,
            "waiting for etcd to be bootstrapped",
        ),
    ]
}

/// What configuring the endpoint member failing leads to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndpointFailure {
    /// The conditions to set (`Bootstrapped`, unless it is already True).
    pub sets: Vec<ClusterSet>,
    /// The same input fails the same way: wait for a change instead of retrying.
    pub wait_for_change: bool,
}

impl EndpointFailure {
    /// The `Bootstrapped` condition to announce as a Warning Event: only when it differs
    /// from what the status `reported` said, so a refusal is told once, not per retry.
    pub fn announce(&self, reported: Option<&[Condition]>) -> Option<ClusterSet> {
        if !self.wait_for_change {
            return None;
        }
        let new = self.sets.first()?;
        let old = reported.and_then(|r| conditions::get(r, Cond::Bootstrapped));
        let same = old.is_some_and(|c| c.reason == new.reason.as_str() && c.message == new.message);
        (!same).then(|| new.clone())
    }
}

/// Pure: configuring the endpoint member failed with `error`; `identity_changed` when
/// another machine answers at its address, `refused` when its config cannot be rendered or
/// the machine refused it as invalid.
pub fn endpoint_config_failed(
    identity_changed: bool,
    refused: bool,
    error: &str,
    current: &[Condition],
) -> EndpointFailure {
    let reason = if identity_changed {
        Reason::IdentityChanged
    } else {
        Reason::ConfigFailed
    };
    let sets = if conditions::is_true(current, Cond::Bootstrapped) {
        Vec::new()
    } else {
        vec![set(
            Cond::Bootstrapped,
            ConditionStatus::False,
            reason,
            error,
        )]
    };
    EndpointFailure {
        sets,
        wait_for_change: refused,
    }
}

/// What a failed member configuration says on its `Configured` condition.
pub fn config_failure_reason(kind: ConfigFailure) -> IReason {
    match kind {
        ConfigFailure::Unreachable => IReason::TalosApiUnreachable,
        ConfigFailure::IdentityChanged => IReason::IdentityChanged,
        ConfigFailure::NoIdentity => IReason::IdentityUnknown,
        ConfigFailure::Refused => IReason::ConfigRejected,
        ConfigFailure::InvalidPatch => IReason::InvalidConfigPatch,
    }
}

/// Why configuring a member failed, as the planner tells them apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfigFailure {
    /// The machine did not answer (in time).
    Unreachable,
    /// Another machine answers at the address: nothing was sent.
    IdentityChanged,
    /// The Instance has no identity to pin: nothing was sent.
    NoIdentity,
    /// The config could not be rendered, or the machine refused it.
    Refused,
    /// A machine-config patch cannot be merged or makes the config invalid: nothing was
    /// sent.
    InvalidPatch,
}

/// Pure: a member's `Configured=True`.
pub fn configured() -> MemberSet {
    set(
        ICond::Configured,
        ConditionStatus::True,
        IReason::ConfigApplied,
        "talos machine configuration applied",
    )
}

/// Pure: a member's `Configured=False` after `error`.
pub fn not_configured(kind: ConfigFailure, error: &str) -> MemberSet {
    set(
        ICond::Configured,
        ConditionStatus::False,
        config_failure_reason(kind),
        error,
    )
}

/// Pure: a worker waiting for its control plane.
pub fn worker_waiting() -> MemberSet {
    set(
        ICond::Joined,
        ConditionStatus::False,
        IReason::WaitingForControlPlane,
        "waiting for the control plane to be ready",
    )
}

/// Pure: what a configured member answering (or not) its configured-mode Version says.
/// `None` when it answered in maintenance mode still (not joined yet, nothing to say).
pub fn join_answer(answer: Result<(bool, &str), &str>) -> Option<MemberSet> {
    match answer {
        Ok((true, tag)) => Some(set(
            ICond::Joined,
            ConditionStatus::True,
            IReason::Joined,
            format!("node answers with its configured identity, talos {tag}"),
        )),
        Ok((false, _)) => None,
        Err(error) => Some(set(
            ICond::Joined,
            ConditionStatus::Unknown,
            IReason::TalosApiUnreachable,
            error,
        )),
    }
}

/// Pure: a joined control-plane member's `Healthy`: True after a passing health check,
/// `Unknown` until its first check (`reported`: it carries `Healthy` already, which only a
/// check changes). Workers carry none: their `Ready` summary is `Configured` and `Joined`.
pub fn member_health(role: Role, healthy_control_plane: bool, reported: bool) -> Option<MemberSet> {
    match role {
        Role::ControlPlane if healthy_control_plane => Some(set(
            ICond::Healthy,
            ConditionStatus::True,
            IReason::Healthy,
            "control plane health check passed with this node included",
        )),
        Role::ControlPlane if !reported => Some(set(
            ICond::Healthy,
            ConditionStatus::Unknown,
            IReason::Reconciling,
            "waiting for the control plane health check",
        )),
        // Workers carry none; a reported `Healthy` changes only with a check.
        Role::ControlPlane | Role::Worker => None,
    }
}

/// The health of the control plane as observed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Health {
    /// Cilium is not `Ready` (the message says why): no check is made.
    NoCni(String),
    /// The Talos health check ran: its outcome.
    Checked(Result<(), String>),
}

/// What the control plane's health leads to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HealthOutcome {
    /// The cluster conditions to set.
    pub sets: Vec<ClusterSet>,
    /// Member conditions to set.
    pub members: Vec<(String, MemberSet)>,
    /// `Some(true)`: every usable control-plane member is ready; `Some(false)`: none.
    pub ready_replicas: Option<bool>,
    /// Look again soon (the check failed).
    pub retry: bool,
}

/// Pure: `ControlPlaneReady` from the health observed; `healthy_before` whether it was True,
/// `joined` the joined control-plane members (marked not ready when the check fails).
pub fn control_plane_health(
    health: Health,
    healthy_before: bool,
    joined: &[&str],
) -> HealthOutcome {
    match health {
        Health::NoCni(message) => HealthOutcome {
            sets: vec![set(
                Cond::ControlPlaneReady,
                ConditionStatus::False,
                Reason::WaitingForCni,
                message,
            )],
            members: Vec::new(),
            ready_replicas: None,
            retry: false,
        },
        Health::Checked(Ok(())) => HealthOutcome {
            sets: vec![set(
                Cond::ControlPlaneReady,
                ConditionStatus::True,
                Reason::Healthy,
                "control plane is healthy",
            )],
            members: Vec::new(),
            ready_replicas: Some(true),
            retry: false,
        },
        Health::Checked(Err(error)) => {
            let reason = if healthy_before {
                Reason::Unhealthy
            } else {
                Reason::Bootstrapping
            };
            let message = format!("control plane health check failed: {error}");
            let member = set(
                ICond::Healthy,
                ConditionStatus::False,
                IReason::Unhealthy,
                message.clone(),
            );
            HealthOutcome {
                members: joined
                    .iter()
                    .map(|m| ((*m).to_owned(), member.clone()))
                    .collect(),
                sets: vec![set(
                    Cond::ControlPlaneReady,
                    ConditionStatus::False,
                    reason,
                    message,
                )],
                ready_replicas: Some(false),
                retry: true,
            }
        }
    }
}

/// Pure: why a health check failed, from its progress messages (`waiting for <check>:
/// <status>`, the latest status of each check counting) and the call's `error`: the checks
/// that were not `OK` (nor `SKIP`, nor not yet evaluated), then the error.
pub fn health_failure(progress: &[String], error: &str) -> String {
    let mut latest: Vec<(&str, &str)> = Vec::new();
    for message in progress {
        let Some((check, status)) = message
            .strip_prefix("waiting for ")
            .and_then(|m| m.split_once(": "))
        else {
            continue;
        };
        match latest.iter_mut().find(|(c, _)| *c == check) {
            Some(entry) => entry.1 = status,
            None => latest.push((check, status)),
        }
    }
    let waiting: Vec<String> = latest
        .iter()
        .filter(|(_, s)| !matches!(*s, "OK" | "SKIP" | "..."))
        .map(|(c, s)| format!("{c}: {s}"))
        .collect();
    if waiting.is_empty() {
        error.to_owned()
    } else {
        format!("waiting for {} ({error})", waiting.join("; "))
    }
}

/// Pure: `AddonsReady` from the Addon aggregation.
pub fn addons_ready(view: &AddonsView) -> ClusterSet {
    if view.ready {
        set(
            Cond::AddonsReady,
            ConditionStatus::True,
            Reason::AddonsInstalled,
            view.message.clone(),
        )
    } else {
        set(
            Cond::AddonsReady,
            ConditionStatus::False,
            Reason::AddonNotHealthy,
            view.message.clone(),
        )
    }
}

/// Pure: whether a reset may be graceful (a worker leaves its cluster, a control plane
/// leaves etcd): not for the last configured control-plane member, which has no etcd to
/// leave.
pub fn graceful_reset(role: Role, other_control_planes_left: bool) -> bool {
    role == Role::Worker || other_control_planes_left
}

/// What teardown does with one member.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TeardownStep {
    /// Reset or skipped by an earlier reconcile: done, nothing to call.
    Finished(TeardownOutcome),
    /// Never configured: nothing to reset.
    Skip,
    /// The deadline passed: left as it is, with the last outcome recorded.
    Abandon(TeardownOutcome),
    /// Reset it now.
    Reset,
}

/// Pure: the teardown step of a member, from its `recorded` outcome, whether it was
/// `configured`, and whether the deadline `passed`.
pub fn teardown_step(
    recorded: Option<TeardownOutcome>,
    configured: bool,
    passed: bool,
) -> TeardownStep {
    match recorded {
        Some(o @ (TeardownOutcome::Reset | TeardownOutcome::Skipped)) => TeardownStep::Finished(o),
        _ if !configured => TeardownStep::Skip,
        last if passed => TeardownStep::Abandon(last.unwrap_or(TeardownOutcome::Unreachable)),
        _ => TeardownStep::Reset,
    }
}

/// The next step of the exactly-once Bootstrap, from the recorded `Bootstrapped` condition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BootstrapStep {
    /// `Bootstrapped=True` is recorded: never call again.
    Done,
    /// No call can be in flight: record the intent, then call.
    Call,
    /// The intent (`Unknown/Bootstrapping`) recorded at `since` is found: an earlier call
    /// may have reached the machine. Ask the cluster's API server before anything else.
    Probe { since: Timestamp },
}

/// Pure: what to do about Bootstrap, from the recorded conditions.
pub fn bootstrap_step(status: &[Condition]) -> BootstrapStep {
    if conditions::is_true(status, TalosClusterCondition::Bootstrapped) {
        return BootstrapStep::Done;
    }
    conditions::get(status, TalosClusterCondition::Bootstrapped)
        .filter(|c| {
            c.status == ConditionStatus::Unknown.as_str()
                && c.reason == TalosClusterReason::Bootstrapping.as_str()
        })
        .map_or(BootstrapStep::Call, |c| BootstrapStep::Probe {
            since: c.last_transition_time.0,
        })
}

/// What a probe of the API server after a possibly delivered Bootstrap decides.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AfterProbe {
    /// The API server answers: etcd was bootstrapped by the earlier call.
    Bootstrapped,
    /// Not yet, and the grace period has not passed: keep the intent, look again.
    Wait { message: String },
    /// Silent for the whole grace period: the earlier call did not take; call again
    /// (`AlreadyExists` then still counts as success).
    CallAgain,
}

/// Pure: the decision after probing the API server (`answer`), `grace` after the intent
/// recorded at `since`.
pub fn after_probe(
    since: Timestamp,
    now: Timestamp,
    grace: Duration,
    endpoint: &str,
    answer: Result<(), String>,
) -> AfterProbe {
    let Err(why) = answer else {
        return AfterProbe::Bootstrapped;
    };
    if now.duration_since(since).unsigned_abs() < grace {
        AfterProbe::Wait {
            message: format!(
                "a Bootstrap call to {endpoint} may have been sent at {since}; waiting for the API server to answer before calling again: {why}"
            ),
        }
    } else {
        AfterProbe::CallAgain
    }
}

/// Pure: what a failed Bootstrap call leaves on `Bootstrapped`. A call whose outcome is
/// unknown (a deadline, a connection broken after the request went out) may have reached
/// the machine, so the intent stays (`Unknown/Bootstrapping`) and the next reconcile
/// probes before calling again; one the machine answered, or that never left, is
/// `False/BootstrapFailed` and retried.
pub fn bootstrap_failed(outcome_unknown: bool, error: &str) -> ClusterSet {
    if outcome_unknown {
        set(
            Cond::Bootstrapped,
            ConditionStatus::Unknown,
            Reason::Bootstrapping,
            format!("the Bootstrap call may have reached the machine: {error}"),
        )
    } else {
        set(
            Cond::Bootstrapped,
            ConditionStatus::False,
            Reason::BootstrapFailed,
            error,
        )
    }
}

/// The teardown deadline of an object being deleted: its `deletionTimestamp` plus the
/// teardown timeout. Shared by the cluster's teardown and the instance-reset controller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Deadline(pub Timestamp);

impl Deadline {
    /// From the object's `deletionTimestamp` (`now` when unset) and the timeout.
    pub fn of(deleted_at: Option<Timestamp>, now: Timestamp, timeout: Duration) -> Self {
        let from = deleted_at.unwrap_or(now);
        let timeout = SignedDuration::try_from(timeout).unwrap_or(SignedDuration::from_secs(900));
        Self(from.checked_add(timeout).unwrap_or(from))
    }

    /// Whether it has passed at `now`.
    pub fn passed(self, now: Timestamp) -> bool {
        now >= self.0
    }

    /// When to look again: `retry`, or just after the deadline when that comes first.
    pub fn requeue(self, now: Timestamp, retry: Duration) -> Duration {
        let left = self.0.duration_since(now).unsigned_abs();
        retry.min(left + Duration::from_millis(100))
    }
}

impl std::fmt::Display for Deadline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// The message of the `Deleting` condition while teardown waits.
fn teardown_message(pending: usize, last_error: Option<&str>, deadline: &str) -> String {
    let base = format!(
        "resetting {pending} machine(s) to maintenance mode; will keep retrying until {deadline}, after which the finalizer is removed and the machines are left as they are"
    );
    match last_error {
        Some(err) => format!("{base}; last error: {err}"),
        None => base,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kontinuum_crds::v1alpha2::{AddonSpec, AddonStatus, LocalRef};
    use std::sync::Arc;

    fn cluster() -> TalosCluster {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "kontinuum.sh/v1alpha2", "kind": "TalosCluster",
            "metadata": { "name": "eu-1a", "namespace": "ns" },
            "spec": {
                "controlPlane": { "poolRef": { "name": "cp" } },
                "workers": [ { "name": "w", "poolRef": { "name": "wp" } } ]
            }
        }))
        .unwrap()
    }

    fn instance(name: &str, pool: Option<&str>, discovered: bool, address: &str) -> Instance {
        let mut labels = serde_json::Map::new();
        if let Some(pool) = pool {
            labels.insert(CLAIMED_BY.to_owned(), pool.into());
        }
        serde_json::from_value(serde_json::json!({
            "apiVersion": "kontinuum.sh/v1alpha2", "kind": "Instance",
            "metadata": { "name": name, "namespace": "ns", "labels": labels },
            "spec": { "interfaces": [address] },
            "status": { "address": address, "conditions": [{
                "type": "Discovered", "status": if discovered { "True" } else { "False" },
                "reason": "X", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"
            }]}
        }))
        .unwrap()
    }

    fn addon(release: &str, ready: Option<bool>, enabled: bool) -> Addon {
        let mut addon = Addon::new(
            &format!("eu-1a-{release}"),
            AddonSpec {
                talos_cluster_ref: LocalRef {
                    name: "eu-1a".into(),
                },
                release_name: Some(release.into()),
                enabled,
                ..AddonSpec::default()
            },
        );
        addon.metadata.namespace = Some("ns".into());
        if let Some(ready) = ready {
            addon.status = Some(AddonStatus {
                conditions: vec![conditions::new(
                    "Ready",
                    ready.into(),
                    if ready { "Ready" } else { "NotHealthy" },
                    if ready {
                        ""
                    } else {
                        "kube-system/cilium-x is Running but not Ready"
                    },
                    None,
                )],
                ..AddonStatus::default()
            });
        }
        addon
    }

    fn at(second: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + second).unwrap()
    }

    fn cond(c: Cond, s: ConditionStatus, reason: Reason, since: Timestamp) -> Condition {
        let mut c = conditions::new(c, s, reason, "m", None);
        c.last_transition_time = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(since);
        c
    }

    fn row(s: &ClusterSet) -> (Cond, &'static str, Reason) {
        (s.condition, s.status.as_str(), s.reason)
    }

    #[test]
    fn bootstrap_is_called_once_probed_after_an_intent_and_called_again_only_after_grace() {
        use ConditionStatus::{False, True, Unknown};
        let t0 = at(0);
        let grace = Duration::from_secs(120);
        // (recorded Bootstrapped, expected step)
        let steps = [
            (None, BootstrapStep::Call),
            (Some((True, Reason::Bootstrapped)), BootstrapStep::Done),
            (Some((False, Reason::BootstrapFailed)), BootstrapStep::Call),
            (Some((False, Reason::ConfigFailed)), BootstrapStep::Call),
            (
                Some((Unknown, Reason::Bootstrapping)),
                BootstrapStep::Probe { since: t0 },
            ),
            (Some((Unknown, Reason::Reconciling)), BootstrapStep::Call),
        ];
        for (recorded, want) in steps {
            let status: Vec<Condition> = recorded
                .map(|(s, r)| cond(Cond::Bootstrapped, s, r, t0))
                .into_iter()
                .collect();
            assert_eq!(bootstrap_step(&status), want, "{recorded:?}");
        }
        // (seconds since the intent, API server answer, expected decision)
        let probes: [(i64, Result<(), String>, &str); 4] = [
            (5, Ok(()), "Bootstrapped"),
            (500, Ok(()), "Bootstrapped"),
            (5, Err("connection refused".into()), "Wait"),
            (120, Err("connection refused".into()), "CallAgain"),
        ];
        for (after, answer, want) in probes {
            let got = after_probe(t0, at(after), grace, "cp-1", answer);
            let name = match &got {
                AfterProbe::Bootstrapped => "Bootstrapped",
                AfterProbe::Wait { message } => {
                    assert!(
                        message.contains("cp-1") && message.contains("connection refused"),
                        "{message}"
                    );
                    "Wait"
                }
                AfterProbe::CallAgain => "CallAgain",
            };
            assert_eq!(name, want, "{after}s");
        }
        // A failed call keeps the intent only when it may have reached the machine.
        assert_eq!(
            row(&bootstrap_failed(true, "reset")),
            (Cond::Bootstrapped, "Unknown", Reason::Bootstrapping)
        );
        assert_eq!(
            row(&bootstrap_failed(false, "refused")),
            (Cond::Bootstrapped, "False", Reason::BootstrapFailed)
        );
        // ...and the kept intent is what the next reconcile probes.
        let kept = bootstrap_failed(true, "reset");
        let status = vec![cond(kept.condition, kept.status, kept.reason, t0)];
        assert_eq!(bootstrap_step(&status), BootstrapStep::Probe { since: t0 });
    }

    #[test]
    fn a_failed_health_check_names_what_it_waited_for() {
        let progress: Vec<String> = [
            "discovered nodes: [\"10.0.0.1\", \"10.0.0.2\"]",
            "waiting for etcd to be healthy: ...",
            "waiting for etcd to be healthy: etcd member cp-2 (10.0.0.2) is not healthy",
            "waiting for kube-apiserver to report ready: OK",
            "waiting for all k8s nodes to report ready: some nodes are not ready: [\"w-1\"]",
            "waiting for all k8s nodes to report ready: OK",
            "waiting for coredns to report ready: SKIP",
        ]
        .map(str::to_owned)
        .to_vec();
        assert_eq!(
            health_failure(&progress, "deadline exceeded"),
            "waiting for etcd to be healthy: etcd member cp-2 (10.0.0.2) is not healthy (deadline exceeded)"
        );
        assert_eq!(health_failure(&[], "refused"), "refused");
        assert_eq!(
            health_failure(&progress[3..], "x"),
            "x",
            "only OK and SKIP left"
        );
    }

    #[test]
    fn teardown_steps_and_the_shared_deadline() {
        use TeardownOutcome::{Failed, Reset, Skipped, Unreachable};
        // (recorded outcome, configured, deadline passed, expected step)
        let table = [
            (Some(Reset), true, false, TeardownStep::Finished(Reset)),
            (Some(Skipped), false, true, TeardownStep::Finished(Skipped)),
            (None, false, false, TeardownStep::Skip),
            (Some(Failed), false, false, TeardownStep::Skip),
            (None, true, false, TeardownStep::Reset),
            (Some(Unreachable), true, false, TeardownStep::Reset),
            (Some(Failed), true, true, TeardownStep::Abandon(Failed)),
            (None, true, true, TeardownStep::Abandon(Unreachable)),
        ];
        for (recorded, configured, passed, want) in table {
            assert_eq!(
                teardown_step(recorded, configured, passed),
                want,
                "{recorded:?} configured={configured} passed={passed}"
            );
        }
        let deadline = Deadline::of(Some(at(0)), at(10), Duration::from_secs(60));
        assert_eq!(deadline, Deadline(at(60)));
        assert!(!deadline.passed(at(59)));
        assert!(deadline.passed(at(60)));
        assert_eq!(
            deadline.requeue(at(0), Duration::from_secs(5)),
            Duration::from_secs(5)
        );
        assert_eq!(
            deadline.requeue(at(58), Duration::from_secs(5)),
            Duration::from_millis(2100)
        );
        assert_eq!(
            Deadline::of(None, at(10), Duration::from_secs(5)),
            Deadline(at(15))
        );
        assert!(graceful_reset(Role::Worker, false));
        assert!(graceful_reset(Role::ControlPlane, true));
        assert!(
            !graceful_reset(Role::ControlPlane, false),
            "the last control plane"
        );
    }

    /// Every reason the TalosCluster's conditions can take is produced by a row here, with
    /// the status it goes with; the few written elsewhere are named.
    #[test]
    #[allow(
        clippy::too_many_lines,
        reason = "one table: every decision and what it sets"
    )]
    fn every_cluster_reason_is_reached_by_a_decision() {
        use std::collections::BTreeSet;
        let t0 = at(0);
        let none: &[Condition] = &[];
        let was_bootstrapped = [cond(
            Cond::Bootstrapped,
            ConditionStatus::True,
            Reason::Bootstrapped,
            t0,
        )];
        let view = |ready| AddonsView {
            to_seed: Vec::new(),
            cni_ready: ready,
            cni_message: "cilium is Pending".into(),
            ready,
            message: "m".into(),
        };
        let refused = endpoint_config_failed(false, true, "InvalidArgument: x", none);
        let changed = endpoint_config_failed(true, false, "another machine", none);
        let cluster: Vec<(&str, Vec<ClusterSet>)> = vec![
            ("version", vec![talos_version("v1.99.0").unwrap_err()]),
            ("secret missing", secret_missing("s", false).sets),
            ("secret stale", secret_stale("s").sets),
            ("no control plane", no_control_plane(none)),
            ("config refused", refused.sets.clone()),
            ("identity changed", changed.sets.clone()),
            ("intent", vec![bootstrap_intent("cp-1")]),
            (
                "bootstrapped",
                vec![bootstrapped("etcd bootstrapped", "cp-1")],
            ),
            ("call failed", vec![bootstrap_failed(false, "x")]),
            ("awaiting", bootstrap_pending("m".into())),
            ("kubeconfig stale", kubeconfig_stale("s")),
            ("kubeconfig unfetched", kubeconfig_unfetched("x")),
            (
                "kubeconfig stored",
                vec![kubeconfig_stored("s", "kubeconfig")],
            ),
            (
                "no cni",
                control_plane_health(Health::NoCni("m".into()), false, &[]).sets,
            ),
            (
                "healthy",
                control_plane_health(Health::Checked(Ok(())), false, &[]).sets,
            ),
            (
                "first check fails",
                control_plane_health(Health::Checked(Err("x".into())), false, &[]).sets,
            ),
            (
                "check fails again",
                control_plane_health(Health::Checked(Err("x".into())), true, &[]).sets,
            ),
            ("addons ready", vec![addons_ready(&view(true))]),
            ("addons waiting", vec![addons_ready(&view(false))]),
            (
                "teardown waits",
                vec![
                    teardown_waiting(1, None, Deadline(t0)),
                    teardown_waiting(1, Some("refused"), Deadline(t0)),
                ],
            ),
            (
                "endpoint",
                vec![
                    endpoint_shared(Some("lb.example"), 3, "cp-1"),
                    endpoint_shared(None, 1, "cp-1"),
                    endpoint_shared(None, 3, "cp-1"),
                ],
            ),
        ];
        let expected = [
            (Cond::Bootstrapped, "False", Reason::UnsupportedTalosVersion),
            (
                Cond::KubeconfigAvailable,
                "False",
                Reason::SecretsBundleMissing,
            ),
            (Cond::Bootstrapped, "False", Reason::SecretsBundleMissing),
            (Cond::Bootstrapped, "False", Reason::StaleSecret),
            (Cond::Bootstrapped, "False", Reason::WaitingForInstances),
            (
                Cond::KubeconfigAvailable,
                "False",
                Reason::WaitingForInstances,
            ),
            (
                Cond::ControlPlaneReady,
                "False",
                Reason::WaitingForInstances,
            ),
            (Cond::Bootstrapped, "False", Reason::ConfigFailed),
            (Cond::Bootstrapped, "False", Reason::IdentityChanged),
            (Cond::Bootstrapped, "Unknown", Reason::Bootstrapping),
            (Cond::Bootstrapped, "True", Reason::Bootstrapped),
            (Cond::Bootstrapped, "False", Reason::BootstrapFailed),
            (Cond::Bootstrapped, "Unknown", Reason::Bootstrapping),
            (Cond::KubeconfigAvailable, "False", Reason::Bootstrapping),
            (Cond::KubeconfigAvailable, "False", Reason::StaleSecret),
            (Cond::KubeconfigAvailable, "False", Reason::Bootstrapping),
            (Cond::ControlPlaneReady, "False", Reason::Bootstrapping),
            (
                Cond::KubeconfigAvailable,
                "True",
                Reason::KubeconfigAvailable,
            ),
            (Cond::ControlPlaneReady, "False", Reason::WaitingForCni),
            (Cond::ControlPlaneReady, "True", Reason::Healthy),
            (Cond::ControlPlaneReady, "False", Reason::Bootstrapping),
            (Cond::ControlPlaneReady, "False", Reason::Unhealthy),
            (Cond::AddonsReady, "True", Reason::AddonsInstalled),
            (Cond::AddonsReady, "False", Reason::AddonNotHealthy),
            (Cond::Deleting, "True", Reason::ResettingInstances),
            (Cond::Deleting, "True", Reason::TeardownFailed),
            (Cond::EndpointShared, "True", Reason::EndpointConfigured),
            (Cond::EndpointShared, "True", Reason::SingleControlPlane),
            (Cond::EndpointShared, "False", Reason::EndpointIsOneMachine),
        ];
        let got: Vec<_> = cluster
            .iter()
            .flat_map(|(_, sets)| sets.iter().map(row))
            .collect();
        assert_eq!(got, expected);
        // What is already True is not set back by a step that waits.
        assert_eq!(no_control_plane(&was_bootstrapped).len(), 2);
        assert!(
            endpoint_config_failed(false, true, "x", &was_bootstrapped)
                .sets
                .is_empty()
        );
        // A refused config waits for a change and is announced once; a transport failure
        // is retried.
        assert!(refused.wait_for_change && !changed.wait_for_change);
        assert!(refused.announce(None).is_some());
        let reported = [conditions::new(
            Cond::Bootstrapped,
            ConditionStatus::False,
            Reason::ConfigFailed,
            "InvalidArgument: x",
            None,
        )];
        assert!(refused.announce(Some(&reported)).is_none(), "told once");
        // The Ready summary's own reasons.
        let gates: Vec<Condition> = TalosClusterCondition::READY_GATES
            .iter()
            .map(|g| conditions::new(*g, ConditionStatus::True, Reason::Healthy, "", None))
            .collect();
        let summary = [
            ready_condition(&gates, false, None),
            ready_condition(&gates, true, None),
            ready_condition(none, false, None),
        ];
        let summary_reasons: Vec<&str> = summary.iter().map(|c| c.reason.as_str()).collect();
        assert_eq!(summary_reasons, ["Ready", "Deleting", "Reconciling"]);

        let mut seen: BTreeSet<&str> = got.iter().map(|(_, _, r)| r.as_str()).collect();
        seen.extend(summary_reasons);
        // Written elsewhere: `Forbidden` by the reconcile's RBAC report, an Event reason.
        // The roll of a changed config: reconfigure.rs (its decision, `next`, is tested there).
        let elsewhere = [
            "Forbidden",
            "TeardownDeadlineExceeded",
            "ConfigUpToDate",
            "Reconfiguring",
            "ReconfigureFailed",
        ];
        // Declared in the vocabulary, written by no one yet (named in the note).
        let unused = ["AddonInstallFailed"];
        let all: BTreeSet<&str> = TalosClusterReason::ALL.iter().map(|r| r.as_str()).collect();
        let missing: Vec<&&str> = all
            .iter()
            .filter(|r| !seen.contains(**r) && !elsewhere.contains(*r) && !unused.contains(*r))
            .collect();
        assert!(
            missing.is_empty(),
            "reasons no decision reaches: {missing:?}"
        );
    }

    /// The same for the member conditions this operator owns.
    #[test]
    fn every_member_reason_is_reached_by_a_decision() {
        use std::collections::BTreeSet;
        let members: Vec<MemberSet> = vec![
            configured(),
            not_configured(ConfigFailure::Unreachable, "x"),
            not_configured(ConfigFailure::IdentityChanged, "x"),
            not_configured(ConfigFailure::NoIdentity, "x"),
            not_configured(ConfigFailure::Refused, "x"),
            not_configured(ConfigFailure::InvalidPatch, "x"),
            worker_waiting(),
            join_answer(Ok((true, "v1.13.0"))).unwrap(),
            join_answer(Err("refused")).unwrap(),
            member_health(Role::ControlPlane, true, true).unwrap(),
            member_health(Role::ControlPlane, false, false).unwrap(),
            control_plane_health(Health::Checked(Err("x".into())), true, &["cp-1"]).members[0]
                .1
                .clone(),
        ];
        let member_rows: Vec<(ICond, &str, IReason)> = members
            .iter()
            .map(|s| (s.condition, s.status.as_str(), s.reason))
            .collect();
        assert_eq!(
            member_rows,
            [
                (ICond::Configured, "True", IReason::ConfigApplied),
                (ICond::Configured, "False", IReason::TalosApiUnreachable),
                (ICond::Configured, "False", IReason::IdentityChanged),
                (ICond::Configured, "False", IReason::IdentityUnknown),
                (ICond::Configured, "False", IReason::ConfigRejected),
                (ICond::Configured, "False", IReason::InvalidConfigPatch),
                (ICond::Joined, "False", IReason::WaitingForControlPlane),
                (ICond::Joined, "True", IReason::Joined),
                (ICond::Joined, "Unknown", IReason::TalosApiUnreachable),
                (ICond::Healthy, "True", IReason::Healthy),
                (ICond::Healthy, "Unknown", IReason::Reconciling),
                (ICond::Healthy, "False", IReason::Unhealthy),
            ]
        );
        assert!(
            join_answer(Ok((false, "v1.13.0"))).is_none(),
            "still in maintenance mode"
        );
        assert!(
            member_health(Role::ControlPlane, false, true).is_none(),
            "only a check changes a reported Healthy"
        );
        for healthy in [false, true] {
            assert!(member_health(Role::Worker, healthy, false).is_none());
        }
        let seen: BTreeSet<&str> = member_rows.iter().map(|(_, _, r)| r.as_str()).collect();
        // The member conditions this operator owns are Configured, Joined and Healthy;
        // the others are instance-discovery's (Discovered, the Ready summary) and the
        // instance-reset controller's (Deleting); `Resetting` is declared, written by no one.
        let elsewhere = [
            "Ready",
            "Discovered",
            "NoInterfaces",
            "ProbeFailed",
            "Deleting",
            "Resetting",
            "ResetFailed",
            "Forbidden",
        ];
        let missing: Vec<&str> = IReason::ALL
            .iter()
            .map(|r| r.as_str())
            .filter(|r| !seen.contains(r) && !elsewhere.contains(r))
            .collect();
        assert!(
            missing.is_empty(),
            "member reasons no decision reaches: {missing:?}"
        );
    }

    #[test]
    fn members_are_sorted_and_split_by_role() {
        let instances: Vec<Arc<Instance>> = vec![
            instance("m-2", Some("cp"), true, "10.0.0.2").into(),
            instance("m-1", Some("cp"), true, "10.0.0.1").into(),
            instance("m-3", Some("wp"), true, "10.0.0.3").into(),
            instance("m-4", Some("other"), true, "10.0.0.4").into(),
            instance("m-5", None, true, "10.0.0.5").into(),
        ];
        let m = members(&cluster(), &instances);
        let names = |v: &[Member]| v.iter().map(|m| m.name.clone()).collect::<Vec<_>>();
        assert_eq!(names(&m.control_plane), ["m-1", "m-2"]);
        assert_eq!(names(&m.workers[0].1), ["m-3"]);
        let order: Vec<&str> = m.teardown_order().iter().map(|m| m.name.as_str()).collect();
        assert_eq!(order, ["m-3", "m-1", "m-2"], "workers first");
    }

    #[test]
    fn endpoint_is_sticky_and_skips_unusable_members() {
        let instances: Vec<Arc<Instance>> = vec![
            instance("m-1", Some("cp"), false, "10.0.0.1").into(),
            instance("m-2", Some("cp"), true, "10.0.0.2").into(),
            instance("m-3", Some("cp"), true, "10.0.0.3").into(),
        ];
        let m = members(&cluster(), &instances);
        assert_eq!(endpoint_member(&m.control_plane, None).unwrap().name, "m-2");
        assert_eq!(
            endpoint_member(&m.control_plane, Some("10.0.0.3"))
                .unwrap()
                .name,
            "m-3"
        );
        assert_eq!(
            endpoint_member(&m.control_plane, Some("10.0.0.1"))
                .unwrap()
                .name,
            "m-2",
            "an undiscovered member is not the endpoint"
        );
    }

    #[test]
    fn endpoint_hosts_parse() {
        assert_eq!(endpoint_url("192.0.2.10"), "https://192.0.2.10:6443");
        assert_eq!(endpoint_url("2001:db8::1"), "https://[2001:db8::1]:6443");
        assert_eq!(
            endpoint_host(&endpoint_url("2001:db8::1")),
            Some("2001:db8::1")
        );
        assert_eq!(endpoint_host("https://192.0.2.10:6443"), Some("192.0.2.10"));
        assert_eq!(
            endpoint_host("https://[2001:db8::1]:6443"),
            Some("2001:db8::1")
        );
        assert_eq!(endpoint_host("https://cp.example"), Some("cp.example"));
        assert_eq!(endpoint_host("http://x"), None);
    }

    #[test]
    fn builtins_are_seeded_in_order() {
        let none: Vec<Arc<Addon>> = Vec::new();
        assert!(
            addons_view(&cluster(), &none, false, false)
                .to_seed
                .is_empty()
        );
        assert_eq!(
            addons_view(&cluster(), &none, true, false).to_seed,
            [BuiltinAddon::GatewayApiCrds, BuiltinAddon::Cilium]
        );
        let two: Vec<Arc<Addon>> = vec![
            addon("gateway-api-crds", None, true).into(),
            addon("cilium", None, true).into(),
        ];
        assert!(
            addons_view(&cluster(), &two, true, false)
                .to_seed
                .is_empty()
        );
        assert_eq!(
            addons_view(&cluster(), &two, true, true).to_seed,
            [BuiltinAddon::CertManager]
        );
    }

    #[test]
    fn aggregation_names_what_is_not_ready_and_is_never_latched() {
        let mut addons: Vec<Arc<Addon>> = vec![
            addon("gateway-api-crds", Some(true), true).into(),
            addon("cilium", Some(false), true).into(),
        ];
        let view = addons_view(&cluster(), &addons, true, false);
        assert!(!view.cni_ready);
        assert!(
            view.cni_message
                .contains("cilium-x is Running but not Ready")
        );
        assert!(!view.ready);
        assert_eq!(
            view.message,
            "waiting for addons: cert-manager: Pending: not created yet; cilium: NotHealthy: kube-system/cilium-x is Running but not Ready"
        );
        addons[1] = addon("cilium", Some(true), true).into();
        addons.push(addon("cert-manager", Some(true), true).into());
        let view = addons_view(&cluster(), &addons, true, true);
        assert!(view.cni_ready && view.ready, "{view:?}");
        // A custom Addon not Ready turns the aggregation False again; disabled ones do not count.
        addons.push(addon("extra", None, true).into());
        addons.push(addon("off", Some(false), false).into());
        let view = addons_view(&cluster(), &addons, true, true);
        assert_eq!(view.message, "waiting for addons: extra: Pending");
    }
}
