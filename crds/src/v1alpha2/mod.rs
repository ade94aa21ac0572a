//! `kontinuum.sh/v1alpha2`: the storage version of every kind.

mod addon;
mod instance;
mod instance_pool;
mod kontinuum;
mod talos_cluster;
mod zone;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::schema::{API_VERSION, DNS1123_SUBDOMAIN, KIND, MAX_LABEL_LEN, MAX_NAME_LEN};

pub use addon::{
    Addon, AddonChart, AddonLifecycle, AddonNamespace, AddonProvisioning, AddonSpec, AddonStatus,
    BuiltinAddon, ProvisioningMethod,
};
pub use instance::{
    DiskStatus, Instance, InstanceSpec, InstanceStatus, InterfaceStatus, TalosStatus,
};
pub use instance_pool::{InstancePool, InstancePoolSpec, InstancePoolStatus, InstancePoolTemplate};
pub use kontinuum::{
    AcmeConfig, DnsConfig, GrpcConfig, Kontinuum, KontinuumConfig, KontinuumRole, KontinuumSpec,
    KontinuumStatus, LogConfig, OidcConfig, ServerConfig,
};
pub use talos_cluster::{
    ControlPlane, ControlPlaneEndpoint, ControlPlaneStatus, KUBECONFIG_KEY,
    KUBECONFIG_SECRET_COMPONENT, KubernetesSettings, MachineConfigStatus, MachineTeardown,
    SECRETS_BUNDLE_KEY, SECRETS_SECRET_COMPONENT, SharedVip, TALOSCONFIG_KEY, TalosCluster,
    TalosClusterSpec, TalosClusterStatus, TalosSettings, TeardownOutcome, WorkerPool,
    WorkerPoolStatus, kubeconfig_secret_name, secrets_secret_name,
};
pub use zone::{Zone, ZoneClusterTemplate, ZoneSeed, ZoneSpec, ZoneStatus};

/// One Talos machine-config patch: a YAML document, as an object. See
/// `TalosSettings.configPatches` for how patches are merged and checked.
pub type ConfigPatch = serde_json::Map<String, serde_json::Value>;

/// A reference to an object in the same namespace as the referring object.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct LocalRef {
    /// Name of the object, in the same namespace as the referring object.
    #[schemars(length(min = 1, max = MAX_NAME_LEN), pattern(DNS1123_SUBDOMAIN))]
    pub name: String,
}

impl LocalRef {
    /// A reference to the object called `name`.
    pub fn new(name: impl Into<String>) -> Self {
        Self { name: name.into() }
    }
}

/// A reference to an object of any kind in the same namespace.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TypedRef {
    /// API version of the object, e.g. `infrastructure.example.com/v1`.
    #[schemars(length(min = 1, max = MAX_NAME_LEN), pattern(API_VERSION))]
    pub api_version: String,
    /// Kind of the object, e.g. `AWSInstance`.
    #[schemars(length(min = 1, max = MAX_LABEL_LEN), pattern(KIND))]
    pub kind: String,
    /// Name of the object, in the same namespace as the referring object.
    #[schemars(length(min = 1, max = MAX_NAME_LEN), pattern(DNS1123_SUBDOMAIN))]
    pub name: String,
}

/// What happens to a cluster's machines when it is deleted.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Teardown {
    /// On deletion, reset every member to maintenance mode and then delete its Instance
    /// (true) instead of releasing it for reuse (false, the default).
    #[serde(default)]
    pub unregister_instances: bool,
}
