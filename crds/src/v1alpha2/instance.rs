use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{ConfigPatch, TypedRef};
use crate::conditions::HasConditions;
use crate::schema;

/// One machine, reachable on the Talos API in maintenance mode.
///
/// Instances are owned by nobody: a TalosCluster's teardown releases or deletes them as its
/// `spec.teardown.unregisterInstances` says, never garbage collection. The name becomes the
/// machine's host name, hence at most 63 characters.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "kontinuum.sh",
    version = "v1alpha2",
    kind = "Instance",
    namespaced,
    status = "InstanceStatus",
    derive = "PartialEq",
    shortname = "inst",
    category = "kontinuum",
    doc = "A machine booted into Talos Linux, discovered through its maintenance-mode API.",
    printcolumn(name = "Address", type_ = "string", json_path = ".spec.interfaces[0]"),
    printcolumn(name = "Talos", type_ = "string", json_path = ".status.talos.version"),
    printcolumn(name = "Identity", type_ = "string", json_path = ".status.identity"),
    printcolumn(
        name = "Discovered",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Discovered\")].status"
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
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    validation = schema::rule(
        "size(self.metadata.name) <= 63",
        "metadata.name must be at most 63 characters: it becomes the machine's host name",
    ),
)]
#[serde(rename_all = "camelCase")]
pub struct InstanceSpec {
    /// Addresses (IP addresses or DNS names) to dial the machine's Talos API on, tried in
    /// order. Ignored when `providerRef` is set.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "schema::interface_addresses")]
    pub interfaces: Vec<String>,

    /// The provider object backing this machine (e.g. a cloud instance). Reserved: no
    /// provider integration exists yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_ref: Option<TypedRef>,

    /// Pins the machine's identity up front: the SHA-256 (64 lowercase hex characters) of
    /// the public key of the certificate its Talos API presents in maintenance mode, e.g.
    /// read from the machine's console. When set, discovery records no other machine
    /// (`Discovered=False`, reason `IdentityChanged`) and the bootstrapper sends a machine
    /// configuration only over a connection whose handshake proved this key. When unset,
    /// the identity first discovered (`status.identity`) is pinned the same way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-validations" = [
        { "rule": "self.matches('^[0-9a-f]{64}$')", "message": "spec.identity must be 64 lowercase hex characters: the SHA-256 of the public key of the machine's maintenance certificate" }
    ]), length(max = 64))]
    pub identity: Option<String>,

    /// Talos machine-config patches for this machine only (e.g. its static address), merged
    /// last, after its cluster's and its pool's (see the TalosCluster's
    /// `spec.talos.configPatches` for the format and rules).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "schema::config_patches")]
    pub config_patches: Vec<ConfigPatch>,
}

/// Observed state of an Instance.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InstanceStatus {
    /// Conditions, each with one owner (its field manager): `Discovered` and the `Ready`
    /// summary (instance-discovery); `Configured`, `Joined` and, on control planes,
    /// `Healthy` (talos-bootstrapper, while a pool of its cluster claims the Instance);
    /// `Deleting` (its instance-reset controller).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,

    /// The `metadata.generation` of the last reconcile in which every step succeeded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// The entry of `spec.interfaces` that answered the last successful probe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,

    /// Network interfaces of the machine, as reported by Talos.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub interfaces: Vec<InterfaceStatus>,

    /// Disks of the machine, as reported by Talos.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub disks: Vec<DiskStatus>,

    /// Talos running on the machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub talos: Option<TalosStatus>,

    /// The machine's identity: SHA-256 (lowercase hex) of the public key of the TLS
    /// certificate its Talos API presented in maintenance mode (what talosctl
    /// `--cert-fingerprint` pins). A different key at the same address means a different
    /// machine (reason `IdentityChanged`); machine configurations are sent only to this key
    /// (or to `spec.identity`, when set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<String>,

    /// When the machine last answered a probe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_seen_time: Option<Time>,
}

/// A network interface of a machine.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InterfaceStatus {
    /// Link name, e.g. `eth0`.
    pub name: String,

    /// Hardware address, e.g. `52:54:00:12:34:56`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac_address: Option<String>,

    /// Addresses assigned to the link, in CIDR notation, e.g. `192.0.2.10/24`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<String>,
}

/// A disk of a machine.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DiskStatus {
    /// Device name, e.g. `sda` or `nvme0n1`.
    pub name: String,

    /// Device path, e.g. `/dev/sda`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dev_path: Option<String>,

    /// Model, as reported by the device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,

    /// Serial number, as reported by the device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serial: Option<String>,

    /// Size in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_bytes: Option<i64>,

    /// Transport, e.g. `nvme`, `sata`, `usb` or `virtio`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transport: Option<String>,

    /// Whether the disk is rotational (a hard disk rather than flash).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rotational: Option<bool>,

    /// Whether the disk is read-only (e.g. a CD-ROM); Talos never installs on one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub readonly: Option<bool>,
}

/// Talos running on a machine.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TalosStatus {
    /// Talos version, e.g. `v1.13.0`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

impl HasConditions for InstanceStatus {
    fn conditions(&self) -> &[Condition] {
        &self.conditions
    }

    fn conditions_mut(&mut self) -> &mut Vec<Condition> {
        &mut self.conditions
    }
}
