//! `kontinuum.sh/v1alpha1`: the legacy version of [`Kontinuum`], still served (not stored)
//! so that clients of the Go predecessor keep working. Frozen: nothing new is added here.
//! See [`conversion`](crate::conversion) for how it maps onto `v1alpha2`.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::schema::{DNS1123_LABEL_OR_EMPTY, MAX_LABEL_LEN};

/// Registry entry of one running Kontinuum installation, in its legacy shape: the role is in
/// the spec.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "kontinuum.sh",
    version = "v1alpha1",
    kind = "Kontinuum",
    plural = "kontinuums",
    namespaced,
    status = "KontinuumStatus",
    derive = "PartialEq",
    shortname = "kon",
    category = "kontinuum",
    storage = false,
    deprecated = "kontinuum.sh/v1alpha1 Kontinuum is deprecated; use kontinuum.sh/v1alpha2",
    doc = "A running Kontinuum installation (legacy version; use v1alpha2).",
    printcolumn(name = "Role", type_ = "string", json_path = ".spec.role"),
    printcolumn(name = "Region", type_ = "string", json_path = ".spec.region"),
    printcolumn(name = "Zone", type_ = "string", json_path = ".spec.zone"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "(!has(self.region) || self.region == '') == (!has(self.zone) || self.zone == '')",
        "message": "spec.region and spec.zone must both be set, or both be empty",
    },
    {
        "rule": "(has(self.region) ? self.region : '') == (has(oldSelf.region) ? oldSelf.region : '')",
        "fieldPath": ".region",
        "message": "spec.region is immutable",
    },
    {
        "rule": "(has(self.zone) ? self.zone : '') == (has(oldSelf.zone) ? oldSelf.zone : '')",
        "fieldPath": ".zone",
        "message": "spec.zone is immutable",
    },
]))]
#[serde(rename_all = "camelCase")]
pub struct KontinuumSpec {
    /// `ControlPlane` (the hub) or `Worker` (a zone agent).
    pub role: KontinuumRole,

    /// Region this installation serves. Empty on the hub. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_LABEL_LEN), pattern(DNS1123_LABEL_OR_EMPTY))]
    pub region: Option<String>,

    /// Zone this installation serves, within `region`. Empty on the hub. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_LABEL_LEN), pattern(DNS1123_LABEL_OR_EMPTY))]
    pub zone: Option<String>,
}

/// The role of a Kontinuum installation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum KontinuumRole {
    /// The hub.
    #[default]
    ControlPlane,
    /// The agent of one zone.
    Worker,
}

/// Observed state of a Kontinuum installation, in its legacy shape.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KontinuumStatus {
    /// When the installation last heartbeated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_heartbeat_time: Option<Time>,
}
