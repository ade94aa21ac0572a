use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{ConfigPatch, LocalRef, Teardown};
use crate::conditions::HasConditions;
use crate::schema::{self, DNS1123_LABEL, IP_OR_DNS_NAME, MAX_LABEL_LEN, MAX_NAME_LEN, VERSION};

// A cluster's Secrets are split by who needs them (DESIGN section 1): the kubeconfig alone
// in one, which the addon-installer and zone-installer read through `status.secretRef`; the
// secrets bundle and talosconfig (every cluster CA key) in another that only the
// talos-bootstrapper reads.

/// Key, in the cluster's secrets Secret ([`secrets_secret_name`]), of the Talos secrets
/// bundle (JSON). Generated once and never regenerated: the machines trust its CAs.
pub const SECRETS_BUNDLE_KEY: &str = "secrets-bundle";

/// Key, in the cluster's secrets Secret, of an admin talosconfig (`talosctl --talosconfig`)
/// for the control-plane members, written once the cluster is bootstrapped.
pub const TALOSCONFIG_KEY: &str = "talosconfig";

/// Key, in the kubeconfig Secret of `status.secretRef` ([`kubeconfig_secret_name`]), of the
/// cluster's admin kubeconfig.
pub const KUBECONFIG_KEY: &str = "kubeconfig";

/// `app.kubernetes.io/component` of a cluster's secrets Secret (bundle and talosconfig).
pub const SECRETS_SECRET_COMPONENT: &str = "talos-cluster-secrets";

/// `app.kubernetes.io/component` of a cluster's kubeconfig Secret: what the operators that
/// need only the kubeconfig select their Secret watches on.
pub const KUBECONFIG_SECRET_COMPONENT: &str = "talos-cluster-kubeconfig";

/// The name of the Secret holding cluster `cluster`'s secrets bundle and talosconfig.
pub fn secrets_secret_name(cluster: &str) -> String {
    format!("taloscluster-{cluster}")
}

/// The name of the Secret holding cluster `cluster`'s admin kubeconfig, and nothing else.
pub fn kubeconfig_secret_name(cluster: &str) -> String {
    format!("taloscluster-{cluster}-kubeconfig")
}

/// A Talos Kubernetes cluster, built from a control-plane InstancePool and optional worker
/// pools of the same namespace.
///
/// The talos-bootstrapper generates the secrets bundle, applies machine configurations,
/// bootstraps etcd, stores the kubeconfig, seeds the built-in Addons and reports `Ready`
/// once the control plane is healthy and every enabled Addon is `Ready`.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "kontinuum.sh",
    version = "v1alpha2",
    kind = "TalosCluster",
    namespaced,
    status = "TalosClusterStatus",
    derive = "PartialEq",
    shortname = "tc",
    category = "kontinuum",
    doc = "A Talos Linux Kubernetes cluster built from InstancePools.",
    printcolumn(name = "Talos", type_ = "string", json_path = ".spec.talos.version"),
    printcolumn(
        name = "Kubernetes",
        type_ = "string",
        json_path = ".spec.kubernetes.version"
    ),
    printcolumn(
        name = "ControlPlanePool",
        type_ = "string",
        json_path = ".spec.controlPlane.poolRef.name"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Reason",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].reason"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[schemars(extend("x-kubernetes-validations" = [
    {
        // The guards keep a missing (required) control plane a plain "Required value" error.
        "rule": "!has(self.workers) || !has(self.controlPlane) || !has(self.controlPlane.poolRef) || !has(self.controlPlane.poolRef.name) || self.workers.all(w, w.poolRef.name != self.controlPlane.poolRef.name)",
        "fieldPath": ".workers",
        "message": "spec.workers[].poolRef.name must differ from spec.controlPlane.poolRef.name",
    },
]))]
#[serde(rename_all = "camelCase")]
pub struct TalosClusterSpec {
    /// Talos settings of every machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub talos: Option<TalosSettings>,

    /// Kubernetes settings of the cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes: Option<KubernetesSettings>,

    /// The control plane. A single replica is a first-class setup.
    pub control_plane: ControlPlane,

    /// Named worker pools, joined once the control plane is ready.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(max = 32),
        extend(
            "x-kubernetes-list-type" = "map",
            "x-kubernetes-list-map-keys" = ["name"],
            "x-kubernetes-validations" = [
                {
                    "rule": "self.all(w, self.exists_one(x, x.name == w.name))",
                    "message": "spec.workers[].name must be unique",
                },
                {
                    "rule": "self.all(w, self.exists_one(x, x.poolRef.name == w.poolRef.name))",
                    "message": "spec.workers[].poolRef.name must be unique: two worker pools cannot share an InstancePool",
                },
            ],
        ),
    )]
    pub workers: Vec<WorkerPool>,

    /// What happens to the machines when the cluster is deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub teardown: Option<Teardown>,
}

/// Talos settings of a cluster.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TalosSettings {
    /// Talos version of every machine, e.g. `v1.13.0`. Unset: the operators' default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32), pattern(VERSION))]
    pub version: Option<String>,

    /// Talos machine-config patches for every machine of the cluster (at most 16). Each is
    /// one YAML document, merged over the generated config as Talos merges a strategic
    /// merge patch (`talosctl machineconfig patch`): mappings merge, the patch's values win;
    /// lists are appended to, except `cluster.network.podSubnets`/`serviceSubnets`
    /// (replaced) and `machine.network.interfaces` (merged on `interface`, with `vlans`
    /// merged on `vlanId`); `$patch: delete` removes a key, a keyed list item or a typed
    /// document. A patch with `apiVersion` and `kind` patches that typed document (by
    /// `name` too), adding it when the config has none. Order: these, then the pool's
    /// (`spec.controlPlane.configPatches` or `spec.workers[].configPatches`), then the
    /// Instance's `spec.configPatches`. The merged config is checked as Talos decodes and
    /// validates one; a patch that makes it invalid stops that machine
    /// (`Configured=False`, reason `InvalidConfigPatch`, naming the patch and the field) and
    /// nothing is sent.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "schema::config_patches")]
    pub config_patches: Vec<ConfigPatch>,
}

/// Kubernetes settings of a cluster.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KubernetesSettings {
    /// Kubernetes version, e.g. `v1.32.0`. Unset: the operators' default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32), pattern(VERSION))]
    pub version: Option<String>,
}

/// The control plane of a cluster.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "has(self.endpoint) == has(oldSelf.endpoint) && (!has(self.endpoint) || self.endpoint == oldSelf.endpoint)",
        "fieldPath": ".endpoint",
        "message": "spec.controlPlane.endpoint is immutable: set it when the cluster is created",
    },
]))]
pub struct ControlPlane {
    /// The InstancePool whose Instances form the control plane. Immutable.
    #[schemars(extend("x-kubernetes-validations" = [
        {
            "rule": "self.name == oldSelf.name",
            "fieldPath": ".name",
            "message": "spec.controlPlane.poolRef.name is immutable",
        },
    ]))]
    pub pool_ref: LocalRef,

    /// Talos machine-config patches for the control-plane machines, merged after
    /// `spec.talos.configPatches` (same format and rules).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "schema::config_patches")]
    pub config_patches: Vec<ConfigPatch>,

    /// The Kubernetes API endpoint every machine config and the stored kubeconfig use, and
    /// that the API server's certificate names. Unset: the first control-plane machine's
    /// address, which suits one control plane; with more, that one machine is a single point
    /// of failure (`EndpointShared=False`). Immutable: set it when the cluster is created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<ControlPlaneEndpoint>,
}

/// A Kubernetes API endpoint in front of the control-plane machines: exactly one of `host`
/// and `vip`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    { "rule": "has(self.host) != has(self.vip)", "message": "endpoint: set exactly one of host (a load balancer or DNS name) and vip (a Talos shared IP)" }
]))]
pub struct ControlPlaneEndpoint {
    /// A load balancer's address or a DNS name resolving to the control-plane machines,
    /// serving their API servers on port 6443: `https://<host>:6443` is the endpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = MAX_NAME_LEN), extend("x-kubernetes-validations" = [
        { "rule": IP_OR_DNS_NAME, "message": "endpoint.host must be an IP address or a DNS name (a load balancer or a name in front of the control planes)" }
    ]))]
    pub host: Option<String>,

    /// A Talos shared (virtual) IP: one healthy control plane holds it, elected through
    /// etcd, and another takes it over when that one stops (Talos' `Layer2VIPConfig` on
    /// every control plane). The machines must share a layer-2 network and the address must
    /// be a free one of their subnet. `https://<ip>:6443` is the endpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vip: Option<SharedVip>,
}

impl ControlPlaneEndpoint {
    /// The endpoint's host: `host`, or the shared IP.
    pub fn address(&self) -> Option<&str> {
        self.host
            .as_deref()
            .or_else(|| self.vip.as_ref().map(|v| v.ip.as_str()))
    }
}

/// A Talos shared (virtual) IP on the control planes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SharedVip {
    /// The shared address (IPv4 or IPv6), free in the control planes' subnet.
    #[schemars(length(min = 2, max = 45), extend("x-kubernetes-validations" = [
        { "rule": "isIP(self)", "message": "endpoint.vip.ip must be an IP address" }
    ]))]
    pub ip: String,

    /// The link (network interface) the address is put on, the same name on every control
    /// plane, e.g. `eth0` or `enp1s0`.
    #[schemars(length(min = 1, max = 15), pattern(LINK_NAME))]
    pub link: String,
}

/// A Linux link name: no `/`, whitespace or `:`.
const LINK_NAME: &str = "^[^/:\\s]+$";

/// A named pool of worker machines.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkerPool {
    /// Name of the worker pool, unique within the cluster: a DNS-1123 label.
    #[schemars(length(min = 1, max = MAX_LABEL_LEN), pattern(DNS1123_LABEL))]
    pub name: String,

    /// The InstancePool whose Instances join as workers. Immutable for a given worker pool
    /// name.
    #[schemars(extend("x-kubernetes-validations" = [
        {
            "rule": "self.name == oldSelf.name",
            "fieldPath": ".name",
            "message": "spec.workers[].poolRef.name is immutable",
        },
    ]))]
    pub pool_ref: LocalRef,

    /// Talos machine-config patches for this pool's machines, merged after
    /// `spec.talos.configPatches` (same format and rules).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "schema::config_patches")]
    pub config_patches: Vec<ConfigPatch>,
}

/// Observed state of a TalosCluster.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TalosClusterStatus {
    /// Conditions: `Bootstrapped`, `KubeconfigAvailable`, `ControlPlaneReady`,
    /// `AddonsReady`, `Ready`, `Deleting`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,

    /// The `metadata.generation` of the last reconcile in which every step succeeded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// The Secret, in the cluster's namespace, holding the admin kubeconfig (key
    /// `kubeconfig`) and nothing else; set once it is stored. The secrets bundle lives in
    /// another Secret (`taloscluster-<name>`) that only the talos-bootstrapper reads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<LocalRef>,

    /// The Kubernetes API endpoint of the cluster, e.g. `https://192.0.2.10:6443`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,

    /// Members of the control plane.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane: Option<ControlPlaneStatus>,

    /// Members of each worker pool.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub workers: Vec<WorkerPoolStatus>,

    /// Instances that were given a machine configuration of this cluster. Teardown resets
    /// every one of them, even one whose pool released it first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "set"))]
    pub configured_instances: Vec<String>,

    /// The machine config each configured member runs, as this operator last applied it
    /// (its SHA-256). When a patch changes, the members whose config it changes are
    /// re-configured in place, one at a time (see the `ConfigUpToDate` condition).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["instance"]))]
    pub machine_configs: Vec<MachineConfigStatus>,

    /// While the cluster is being deleted: what happened to each machine.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["instance"]))]
    pub teardown: Vec<MachineTeardown>,
}

/// The machine config one member runs.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineConfigStatus {
    /// The Instance.
    pub instance: String,
    /// SHA-256 (hex) of the machine config it was last sent.
    pub hash: String,
    /// Talos answered that applying it reboots the machine, and the machine has not
    /// answered since: the roll waits for it before the next member.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub rebooting: bool,
}

/// What teardown did to one machine.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineTeardown {
    /// The Instance.
    pub instance: String,
    /// `Reset` (back in maintenance mode), `Skipped` (never configured, nothing to reset),
    /// `Unreachable` (the machine did not answer; retried until the deadline) or `Failed`
    /// (the machine refused the reset; retried until the deadline).
    pub outcome: TeardownOutcome,
    /// Details, e.g. the error of the last attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// The outcome of tearing down one machine.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum TeardownOutcome {
    /// Not handled yet.
    #[default]
    Pending,
    /// Reset to maintenance mode.
    Reset,
    /// Never configured: nothing to reset.
    Skipped,
    /// Did not answer; retried until the deadline.
    Unreachable,
    /// Refused the reset; retried until the deadline.
    Failed,
}

impl TeardownOutcome {
    /// The API token.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "Pending",
            Self::Reset => "Reset",
            Self::Skipped => "Skipped",
            Self::Unreachable => "Unreachable",
            Self::Failed => "Failed",
        }
    }
}

/// Members of a cluster's control plane.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ControlPlaneStatus {
    /// Claimed, `Discovered` Instances of the control-plane pool.
    #[serde(default)]
    pub replicas: i32,

    /// Control-plane members that pass the cluster health check.
    #[serde(default)]
    pub ready_replicas: i32,
}

/// Members of one worker pool.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkerPoolStatus {
    /// Name of the worker pool (`spec.workers[].name`).
    pub name: String,

    /// Claimed, `Discovered` Instances of the pool.
    #[serde(default)]
    pub replicas: i32,

    /// Members that joined the cluster.
    #[serde(default)]
    pub joined_replicas: i32,
}

impl HasConditions for TalosClusterStatus {
    fn conditions(&self) -> &[Condition] {
        &self.conditions
    }

    fn conditions_mut(&mut self) -> &mut Vec<Condition> {
        &mut self.conditions
    }
}
