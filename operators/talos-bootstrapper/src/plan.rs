//! Pure decisions of the TalosCluster controller: who the members are, which machine the
//! cluster endpoint is, what the Addon aggregation says, the order of teardown, and the
//! conditions each step leads to. No I/O, no clock (callers pass `now`).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kontinuum_crds::conditions::{self, ConditionStatus};
use kontinuum_crds::labels::CLAIMED_BY;
use kontinuum_crds::reasons::{InstanceCondition, TalosClusterCondition};
use kontinuum_crds::v1alpha2::{Addon, BuiltinAddon, Instance, TalosCluster};
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
        }
    }

    /// Ready to be configured or already part of the cluster: discovered (or configured,
    /// after which discovery stops) and with an address.
    pub fn usable(&self) -> bool {
        (self.discovered || self.configured) && self.address.is_some()
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

/// Pure: the message of the `Deleting` condition while teardown waits.
pub fn teardown_message(pending: usize, last_error: Option<&str>, deadline: &str) -> String {
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
