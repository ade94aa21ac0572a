use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::LocalRef;
use crate::conditions::HasConditions;
use crate::schema::{DNS1123_LABEL_OR_EMPTY, MAX_LABEL_LEN};

/// Registry entry of one running Kontinuum installation: the hub (no region or zone), or a
/// zone agent (both set).
///
/// The registry operator writes these: it heartbeats the hub's own entry and mirrors each
/// zone's registration from the Kontinuum store; an entry whose heartbeat is older than the
/// time-to-live is deleted. `v1alpha1` is still served.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "kontinuum.sh",
    version = "v1alpha2",
    kind = "Kontinuum",
    plural = "kontinuums",
    namespaced,
    status = "KontinuumStatus",
    derive = "PartialEq",
    shortname = "kon",
    category = "kontinuum",
    doc = "A running Kontinuum installation: the hub, or the agent of one zone.",
    printcolumn(name = "Role", type_ = "string", json_path = ".status.role"),
    printcolumn(name = "Region", type_ = "string", json_path = ".spec.region"),
    printcolumn(name = "Zone", type_ = "string", json_path = ".spec.zone"),
    printcolumn(name = "Version", type_ = "string", json_path = ".status.version"),
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
    /// The hub: serves no particular zone.
    #[default]
    ControlPlane,
    /// The agent of one zone.
    Worker,
}

impl KontinuumRole {
    /// The role of an installation serving `region`/`zone`: `ControlPlane` when neither is
    /// set, `Worker` otherwise.
    pub fn for_location(region: Option<&str>, zone: Option<&str>) -> Self {
        let set = |value: Option<&str>| value.is_some_and(|v| !v.is_empty());
        if set(region) || set(zone) {
            Self::Worker
        } else {
            Self::ControlPlane
        }
    }
}

/// Observed state of a Kontinuum installation.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KontinuumStatus {
    /// Conditions: `Heartbeating`, `Ready`, `Deleting`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,

    /// The `metadata.generation` of the last reconcile in which every step succeeded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// `ControlPlane` (no region or zone) or `Worker`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<KontinuumRole>,

    /// When the installation last heartbeated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_heartbeat_time: Option<Time>,

    /// Build version of the installation, e.g. `v0.3.0`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,

    /// The Secret, in this object's namespace, holding the installation's confidential
    /// configuration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<LocalRef>,

    /// The installation's non-confidential configuration. Credentials are never published
    /// here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<KontinuumConfig>,
}

/// The published, non-confidential configuration of a Kontinuum installation.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KontinuumConfig {
    /// Server settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<ServerConfig>,

    /// Logging settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log: Option<LogConfig>,

    /// OpenID Connect settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oidc: Option<OidcConfig>,

    /// Whether anonymous access is allowed (`KONTINUUM_INSECURE_ALLOW_ANONYMOUS`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub insecure_allow_anonymous: Option<bool>,

    /// ACME settings of zone certificates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acme: Option<AcmeConfig>,
}

/// Server settings of a Kontinuum installation.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServerConfig {
    /// Listen address (`KONTINUUM_SERVER_ADDR`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub addr: Option<String>,

    /// Storage DSN (`KONTINUUM_SERVER_STORAGE`) with any user and password removed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage: Option<String>,

    /// Region (`KONTINUUM_SERVER_REGION`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,

    /// Zone (`KONTINUUM_SERVER_ZONE`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,

    /// DNS settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dns: Option<DnsConfig>,

    /// gRPC endpoint settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grpc: Option<GrpcConfig>,
}

/// DNS settings of a Kontinuum installation.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DnsConfig {
    /// Base domain of zones (`KONTINUUM_SERVER_DNS_DOMAIN`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
}

/// gRPC endpoint settings of a Kontinuum installation.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GrpcConfig {
    /// Public `host:port` of the hub's etcd proxy (`KONTINUUM_SERVER_GRPC_ENDPOINT`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,

    /// Whether the relay skips TLS verification of the hub
    /// (`KONTINUUM_SERVER_GRPC_INSECURE_TLS_SKIP_VERIFY`; development only).
    #[serde(
        default,
        rename = "insecureTLSSkipVerify",
        skip_serializing_if = "Option::is_none"
    )]
    pub insecure_tls_skip_verify: Option<bool>,
}

/// Logging settings of a Kontinuum installation.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LogConfig {
    /// Log level (`KONTINUUM_LOG_LEVEL`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub level: Option<String>,

    /// Log format (`KONTINUUM_LOG_FORMAT`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<String>,
}

/// OpenID Connect settings of a Kontinuum installation.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OidcConfig {
    /// Whether OIDC authentication is enabled (an issuer is configured).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,

    /// Issuer URL (`KONTINUUM_OIDC_ISSUER_URL`).
    #[serde(default, rename = "issuerURL", skip_serializing_if = "Option::is_none")]
    pub issuer_url: Option<String>,

    /// Public client ID (`KONTINUUM_OIDC_CLIENT_ID`).
    #[serde(default, rename = "clientID", skip_serializing_if = "Option::is_none")]
    pub client_id: Option<String>,

    /// Redirect URL of the login flow (`KONTINUUM_OIDC_REDIRECT_URL`).
    #[serde(
        default,
        rename = "redirectURL",
        skip_serializing_if = "Option::is_none"
    )]
    pub redirect_url: Option<String>,

    /// Groups whose members are administrators (`KONTINUUM_OIDC_ADMIN_GROUPS`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub admin_groups: Vec<String>,
}

/// ACME settings of a Kontinuum installation.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AcmeConfig {
    /// ACME account email (`KONTINUUM_ACME_EMAIL`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub email: Option<String>,

    /// ACME directory URL (`KONTINUUM_ACME_SERVER`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<String>,
}

impl HasConditions for KontinuumStatus {
    fn conditions(&self) -> &[Condition] {
        &self.conditions
    }

    fn conditions_mut(&mut self) -> &mut Vec<Condition> {
        &mut self.conditions
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn role_follows_the_location() {
        assert_eq!(
            KontinuumRole::for_location(None, None),
            KontinuumRole::ControlPlane
        );
        assert_eq!(
            KontinuumRole::for_location(Some(""), Some("")),
            KontinuumRole::ControlPlane
        );
        assert_eq!(
            KontinuumRole::for_location(Some("eu"), Some("west-1a")),
            KontinuumRole::Worker
        );
    }
}
