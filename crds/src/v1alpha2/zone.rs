use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{ConfigPatch, ControlPlaneEndpoint, Teardown};
use crate::conditions::HasConditions;
use crate::schema::{self, DNS1123_LABEL, DNS1123_SUBDOMAIN, MAX_LABEL_LEN, MAX_NAME_LEN, VERSION};

/// Identity of one zone of a region, and what to build there.
///
/// A Zone is named `<spec.region>-<spec.zone>`; its TalosCluster and InstancePool carry the
/// same name. The zone-installer fans out the hub objects from `spec.seed` and
/// `spec.cluster`, installs the zone agent once the cluster is Ready, and reports `Ready`
/// when that agent heartbeats in the hub's registry.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "kontinuum.sh",
    version = "v1alpha2",
    kind = "Zone",
    namespaced,
    status = "ZoneStatus",
    derive = "PartialEq",
    shortname = "zn",
    category = "kontinuum",
    doc = "A zone: one Talos Kubernetes cluster of a region, built and joined by Kontinuum.",
    printcolumn(name = "Region", type_ = "string", json_path = ".spec.region"),
    printcolumn(name = "Zone", type_ = "string", json_path = ".spec.zone"),
    printcolumn(name = "Domain", type_ = "string", json_path = ".spec.domain"),
    printcolumn(name = "Endpoint", type_ = "string", json_path = ".status.endpoint"),
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
        "self.metadata.name == self.spec.region + '-' + self.spec.zone",
        "metadata.name must be <spec.region>-<spec.zone>",
    ),
)]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "size(self.region) + size(self.zone) <= 51",
        "message": "spec.region and spec.zone together must be at most 51 characters, so that the seed Instance names <region>-<zone>-<hash> are valid host names",
    },
    {
        "rule": "!has(self.domain) || size(self.zone) + size(self.region) + size(self.domain) <= 251",
        "fieldPath": ".domain",
        "message": "spec.domain is too long: <spec.zone>.<spec.region>.<spec.domain> must be at most 253 characters",
    },
]))]
#[serde(rename_all = "camelCase")]
pub struct ZoneSpec {
    /// Region the zone belongs to: a DNS-1123 label. Immutable.
    #[schemars(
        length(min = 1, max = MAX_LABEL_LEN),
        pattern(DNS1123_LABEL),
        extend("x-kubernetes-validations" = [
            { "rule": "self == oldSelf", "message": "spec.region is immutable" },
        ]),
    )]
    pub region: String,

    /// Name of the zone within its region: a DNS-1123 label. Immutable.
    #[schemars(
        length(min = 1, max = MAX_LABEL_LEN),
        pattern(DNS1123_LABEL),
        extend("x-kubernetes-validations" = [
            { "rule": "self == oldSelf", "message": "spec.zone is immutable" },
        ]),
    )]
    pub zone: String,

    /// Base DNS domain: the zone agent is published at `<zone>.<region>.<domain>`. When
    /// unset, no Gateway or certificate is installed in the zone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = MAX_NAME_LEN), pattern(DNS1123_SUBDOMAIN))]
    pub domain: Option<String>,

    /// Machines to build the zone from. The zone-installer registers one Instance per address
    /// (named `<region>-<zone>-<hash of the address>`, so the same address is always the same
    /// Instance) and the InstancePool and TalosCluster that use them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<ZoneSeed>,

    /// Template of the zone's TalosCluster. Unset fields take the operators' defaults, so
    /// that new default versions reach zones that did not pin one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<ZoneClusterTemplate>,

    /// What happens to the zone's machines when the Zone is deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub teardown: Option<Teardown>,
}

/// Machines to build a zone from.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ZoneSeed {
    /// Addresses (IP addresses or DNS names) of machines booted into Talos maintenance mode,
    /// dialled on the Talos API port. Each becomes one seed Instance.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "schema::seed_addresses")]
    pub talos_addresses: Vec<String>,
}

/// Template of a zone's TalosCluster.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "has(self.endpoint) == has(oldSelf.endpoint) && (!has(self.endpoint) || self.endpoint == oldSelf.endpoint)",
        "fieldPath": ".endpoint",
        "message": "spec.cluster.endpoint is immutable: set it when the zone is created",
    },
]))]
pub struct ZoneClusterTemplate {
    /// Talos version of every machine, e.g. `v1.13.0`. Unset: the operators' default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32), pattern(VERSION))]
    pub talos_version: Option<String>,

    /// Kubernetes version of the cluster, e.g. `v1.32.0`. Unset: the operators' default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32), pattern(VERSION))]
    pub kubernetes_version: Option<String>,

    /// Number of control-plane machines (the InstancePool's `spec.replicas`). Unset: 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub control_plane_replicas: Option<i32>,

    /// Talos machine-config patches for every machine of the zone: the TalosCluster's
    /// `spec.talos.configPatches` (see there for the format and rules).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "schema::config_patches")]
    pub config_patches: Vec<ConfigPatch>,

    /// The Kubernetes API endpoint of the zone's cluster: the TalosCluster's
    /// `spec.controlPlane.endpoint` (a load balancer or DNS name in front of the control
    /// planes, or a Talos shared IP; see there). Unset: the first control-plane machine's
    /// address. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<ControlPlaneEndpoint>,
}

/// Observed state of a Zone.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ZoneStatus {
    /// Conditions: `ClusterReady`, `Installed`, `RegistryJoined`, `Ready`, `Deleting`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,

    /// The `metadata.generation` of the last reconcile in which every step succeeded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// SHA-256 thumbprint (lowercase hex) of the zone's identity certificate, the one the
    /// etcd proxy verifies the zone agent's tokens against.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity_thumbprint: Option<String>,

    /// The last value of the `kontinuum.sh/rotate-identity` annotation that was acted on:
    /// a rotation is requested by setting the annotation to any other value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity_rotation: Option<String>,

    /// Host name the zone agent is published at, `<zone>.<region>.<domain>`; unset without
    /// a domain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
}

impl HasConditions for ZoneStatus {
    fn conditions(&self) -> &[Condition] {
        &self.conditions
    }

    fn conditions_mut(&mut self) -> &mut Vec<Condition> {
        &mut self.conditions
    }
}
