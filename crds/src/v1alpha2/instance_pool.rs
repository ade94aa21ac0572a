use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::TypedRef;
use crate::conditions::HasConditions;
use crate::schema;

/// Claims `Discovered`, unclaimed Instances of its namespace that match `spec.selector`, up
/// to `spec.replicas`, by writing the `kontinuum.sh/claimed-by` label; releases surplus
/// Instances on scale-down and all of them on deletion.
///
/// The name is the value of that label, hence at most 63 characters.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "kontinuum.sh",
    version = "v1alpha2",
    kind = "InstancePool",
    namespaced,
    status = "InstancePoolStatus",
    derive = "PartialEq",
    shortname = "ipool",
    category = "kontinuum",
    doc = "A pool of machines: claims matching Instances up to spec.replicas.",
    printcolumn(name = "Replicas", type_ = "integer", json_path = ".spec.replicas"),
    printcolumn(name = "Claimed", type_ = "integer", json_path = ".status.claimedReplicas"),
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
        "metadata.name must be at most 63 characters: it is the value of the kontinuum.sh/claimed-by label",
    ),
)]
#[serde(rename_all = "camelCase")]
pub struct InstancePoolSpec {
    /// Which Instances of the pool's namespace are candidates, e.g. `matchLabels:
    /// {kontinuum.sh/region: eu, kontinuum.sh/zone: west-1a}`.
    pub selector: LabelSelector,

    /// How many Instances to keep claimed. On scale-down, the surplus is released (name
    /// order, last first).
    #[schemars(range(min = 0))]
    pub replicas: i32,

    /// Create machines on demand from a provider template. Reserved: no provider integration
    /// exists yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<InstancePoolTemplate>,
}

/// How to create machines on demand.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InstancePoolTemplate {
    /// The provider template to create machines from.
    pub provider_template_ref: TypedRef,
}

/// Observed state of an InstancePool.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InstancePoolStatus {
    /// Conditions: `Claimed`, `InsufficientCapacity`, `Ready`, `Deleting`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,

    /// The `metadata.generation` of the last reconcile in which every step succeeded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// How many Instances carry this pool's claim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claimed_replicas: Option<i32>,

    /// How many claimed Instances are also `Discovered`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_replicas: Option<i32>,
}

impl HasConditions for InstancePoolStatus {
    fn conditions(&self) -> &[Condition] {
        &self.conditions
    }

    fn conditions_mut(&mut self) -> &mut Vec<Condition> {
        &mut self.conditions
    }
}
