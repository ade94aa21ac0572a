use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use kube::core::Rule;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::LocalRef;
use crate::conditions::HasConditions;
use crate::schema::{
    self, ADDON_IS_BUILTIN, CHART_REPO, CHART_VERSION, DNS1123_LABEL, DNS1123_SUBDOMAIN,
    MAX_LABEL_LEN, MAX_NAME_LEN, MAX_RELEASE_LEN,
};

/// One Helm release, or one server-side-applied chart, on a TalosCluster.
///
/// The release is `spec.releaseName`, else `metadata.name`. The built-in releases
/// (`gateway-api-crds`, `cilium`, `cert-manager`) carry defaults for chart, version, namespace
/// and lifecycle; every other Addon names its chart and namespace. Addons of one cluster
/// install in waves of `spec.lifecycle.priority` (lower first) and after the Addons of
/// `spec.dependsOn`.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "kontinuum.sh",
    version = "v1alpha2",
    kind = "Addon",
    namespaced,
    status = "AddonStatus",
    derive = "PartialEq",
    shortname = "ao",
    category = "kontinuum",
    selectable = ".spec.talosClusterRef.name",
    doc = "A Helm chart installed on a TalosCluster.",
    printcolumn(name = "Cluster", type_ = "string", json_path = ".spec.talosClusterRef.name"),
    printcolumn(name = "Chart", type_ = "string", json_path = ".status.chartVersion"),
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
    validation = chart_name_rule(),
    validation = chart_repo_rule(),
    validation = namespace_rule(),
    validation = schema::required_rule(
        "has(self.spec.releaseName) || size(self.metadata.name) <= 53",
        ".spec.releaseName",
        "spec.releaseName is required when metadata.name is longer than 53 characters, the longest Helm release name",
    ),
    validation = schema::rule(
        "!has(self.spec.dependsOn) || !(self.metadata.name in self.spec.dependsOn)",
        "spec.dependsOn must not name the Addon itself",
    ),
)]
#[serde(rename_all = "camelCase")]
pub struct AddonSpec {
    /// The TalosCluster, in the same namespace, to install on. Immutable.
    #[schemars(extend("x-kubernetes-validations" = [
        {
            "rule": "self.name == oldSelf.name",
            "fieldPath": ".name",
            "message": "spec.talosClusterRef.name is immutable",
        },
    ]))]
    pub talos_cluster_ref: LocalRef,

    /// Helm release name. Unset: `metadata.name`. `gateway-api-crds`, `cilium` and
    /// `cert-manager` are the built-ins, whose chart, version, namespace and lifecycle have
    /// defaults.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = MAX_RELEASE_LEN), pattern(DNS1123_SUBDOMAIN))]
    pub release_name: Option<String>,

    /// Whether to install the release. `false` uninstalls it (the Addon stays, `Ready=False`
    /// with reason `Disabled`) and removes the Addon from its cluster's `AddonsReady`
    /// aggregation.
    #[serde(default = "enabled_by_default")]
    pub enabled: bool,

    /// The chart. Each field overrides a built-in's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chart: Option<AddonChart>,

    /// How and when to install.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lifecycle: Option<AddonLifecycle>,

    /// The namespace to install into, in the TalosCluster. Required unless the release is a
    /// built-in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<AddonNamespace>,

    /// Helm values, deep-merged over the built-in defaults (these values win; lists replace
    /// lists).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::preserve_unknown_object")]
    pub values: Option<serde_json::Map<String, serde_json::Value>>,

    /// Names of Addons, in the same namespace, that must be `Ready` before this one
    /// installs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "schema::name_set")]
    pub depends_on: Vec<String>,
}

impl Addon {
    /// The Helm release: `spec.releaseName`, else `metadata.name`.
    pub fn release_name(&self) -> &str {
        self.spec
            .release_name
            .as_deref()
            .or(self.metadata.name.as_deref())
            .unwrap_or_default()
    }

    /// The built-in this Addon installs, if its release is one.
    pub fn builtin(&self) -> Option<BuiltinAddon> {
        BuiltinAddon::from_release_name(self.release_name())
    }
}

fn enabled_by_default() -> bool {
    true
}

const BUILTINS: &str = "built-in (gateway-api-crds, cilium, cert-manager)";

fn chart_name_rule() -> Rule {
    schema::required_rule(
        &format!("{ADDON_IS_BUILTIN} || (has(self.spec.chart) && has(self.spec.chart.name))"),
        ".spec.chart.name",
        &format!("spec.chart.name is required unless the release is a {BUILTINS}"),
    )
}

fn chart_repo_rule() -> Rule {
    schema::required_rule(
        &format!(
            "{ADDON_IS_BUILTIN} || !has(self.spec.chart) || !has(self.spec.chart.name) \
             || self.spec.chart.name.startsWith('oci://') || has(self.spec.chart.repo)"
        ),
        ".spec.chart.repo",
        &format!(
            "spec.chart.repo is required unless spec.chart.name starts with oci:// or the release is a {BUILTINS}"
        ),
    )
}

fn namespace_rule() -> Rule {
    // `namespace` is a CEL keyword: the field is `__namespace__` in rules.
    schema::required_rule(
        &format!("{ADDON_IS_BUILTIN} || has(self.spec.__namespace__)"),
        ".spec.namespace",
        &format!("spec.namespace.name is required unless the release is a {BUILTINS}"),
    )
}

/// A Helm chart.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AddonChart {
    /// Helm repository URL, e.g. `https://helm.cilium.io`. Not needed when `name` is an
    /// `oci://` reference.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256), pattern(CHART_REPO))]
    pub repo: Option<String>,

    /// Chart name in the repository, or an `oci://` reference.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = MAX_NAME_LEN))]
    pub name: Option<String>,

    /// Chart version, e.g. `1.20.1` or `v1.21.1`. Unset: a built-in's pinned default, or the
    /// latest version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64), pattern(CHART_VERSION))]
    pub version: Option<String>,
}

/// How and when an Addon is installed.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AddonLifecycle {
    /// How the chart reaches the cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provisioning: Option<AddonProvisioning>,

    /// Install wave: every enabled Addon of the same cluster with a lower priority must be
    /// `Ready` first; equal priorities install in parallel. Unset: the built-in's default,
    /// else 100.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub priority: Option<i32>,
}

/// How a chart reaches the cluster.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AddonProvisioning {
    /// `HelmUpgradeInstall` or `KubectlApply`. Unset: the built-in's default, else
    /// `HelmUpgradeInstall`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<ProvisioningMethod>,
}

/// How a chart reaches the cluster.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum ProvisioningMethod {
    /// `helm upgrade --install`, without waiting; health is probed separately.
    #[default]
    HelmUpgradeInstall,
    /// Render the chart client-side and server-side apply every object; no Helm release
    /// record (for charts whose release would exceed Helm's 1 MiB Secret).
    KubectlApply,
}

/// The namespace an Addon installs into.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AddonNamespace {
    /// Namespace name in the TalosCluster: a DNS-1123 label.
    #[schemars(length(min = 1, max = MAX_LABEL_LEN), pattern(DNS1123_LABEL))]
    pub name: String,
}

/// The releases every TalosCluster gets, seeded by the talos-bootstrapper as Addons named
/// `<cluster>-<release>` ([`builtin_addon_name`](crate::names::builtin_addon_name)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BuiltinAddon {
    /// The Gateway API CRDs, in an earlier wave: Cilium's Gateway API support needs them.
    GatewayApiCrds,
    /// Cilium, the cluster's CNI: nothing (CoreDNS included) runs before it does.
    Cilium,
    /// cert-manager, seeded once the control plane is ready.
    CertManager,
}

impl BuiltinAddon {
    /// Every built-in, in seeding order.
    pub const ALL: [Self; 3] = [Self::GatewayApiCrds, Self::Cilium, Self::CertManager];

    /// The Helm release name.
    pub const fn release_name(self) -> &'static str {
        match self {
            Self::GatewayApiCrds => "gateway-api-crds",
            Self::Cilium => "cilium",
            Self::CertManager => "cert-manager",
        }
    }

    /// The built-in with this release name, if any.
    pub fn from_release_name(release: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|b| b.release_name() == release)
    }
}

/// Observed state of an Addon.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AddonStatus {
    /// Conditions: `Installed`, `Healthy`, `Ready`, `Deleting`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,

    /// The `metadata.generation` of the last reconcile in which every step succeeded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// The release name in effect.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub release_name: Option<String>,

    /// The namespace in effect.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,

    /// The chart version last installed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chart_version: Option<String>,

    /// The Helm release revision last installed (unset for `KubectlApply`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<i64>,
}

impl HasConditions for AddonStatus {
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
    use crate::schema::ADDON_IS_BUILTIN;

    #[test]
    fn the_schema_knows_every_builtin() {
        let quoted: Vec<String> = BuiltinAddon::ALL
            .iter()
            .map(|b| format!("'{}'", b.release_name()))
            .collect();
        assert!(ADDON_IS_BUILTIN.contains(&format!("[{}]", quoted.join(", "))));
    }

    #[test]
    fn release_name_falls_back_to_the_object_name() {
        let mut addon = Addon::new("eu-west-1a-cilium", AddonSpec::default());
        assert_eq!(addon.release_name(), "eu-west-1a-cilium");
        assert_eq!(addon.builtin(), None);
        addon.spec.release_name = Some("cilium".into());
        assert_eq!(addon.release_name(), "cilium");
        assert_eq!(addon.builtin(), Some(BuiltinAddon::Cilium));
        assert_eq!(
            BuiltinAddon::from_release_name("cert-manager"),
            Some(BuiltinAddon::CertManager)
        );
    }

    #[test]
    fn enabled_defaults_to_true() {
        let spec: AddonSpec =
            serde_json::from_value(serde_json::json!({"talosClusterRef": {"name": "c"}})).unwrap();
        assert!(spec.enabled);
        assert_eq!(spec.lifecycle, None);
    }
}
