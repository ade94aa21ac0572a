//! The subset of the Talos `v1alpha1` machine config and `HostnameConfig` documents we
//! render and read back, as serde types.
//!
//! Every field is optional so the same types serve rendering (fields we set) and parsing
//! (a config from anywhere: unknown fields are ignored, missing ones are reported by the
//! parser with their path). Field names are Talos' YAML keys.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The `v1alpha1` document (no `kind`; `version: v1alpha1`).
#[derive(Debug, Default, Serialize, Deserialize)]
pub(crate) struct V1Alpha1 {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub debug: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persist: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine: Option<Machine>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<Cluster>,
}

/// `machine`.
#[derive(Debug, Default, Serialize, Deserialize)]
pub(crate) struct Machine {
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca: Option<PemPair>,
    #[serde(rename = "certSANs", default, skip_serializing_if = "Option::is_none")]
    pub cert_sans: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubelet: Option<Kubelet>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<MachineNetwork>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub install: Option<Install>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub features: Option<Features>,
    #[serde(
        rename = "nodeLabels",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub node_labels: Option<BTreeMap<String, String>>,
}

/// A `{crt, key}` pair; both base64 (std) of PEM text.
#[derive(Debug, Default, Serialize, Deserialize)]
pub(crate) struct PemPair {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crt: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

/// `machine.network`: rendered empty (`{}`, contract 1.12); only the legacy `hostname`
/// is read back.
#[derive(Debug, Default, Serialize, Deserialize)]
pub(crate) struct MachineNetwork {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
}

/// `machine.kubelet`.
#[derive(Debug, Default, Serialize, Deserialize)]
pub(crate) struct Kubelet {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    #[serde(
        rename = "defaultRuntimeSeccompProfileEnabled",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub default_runtime_seccomp_profile_enabled: Option<bool>,
    #[serde(
        rename = "disableManifestsDirectory",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub disable_manifests_directory: Option<bool>,
}

/// `machine.install`.
#[derive(Debug, Default, Serialize, Deserialize)]
pub(crate) struct Install {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk: Option<String>,
    #[serde(
        rename = "diskSelector",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub disk_selector: Option<crate::config::DiskSelector>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wipe: Option<bool>,
    #[serde(
        rename = "grubUseUKICmdline",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub grub_use_uki_cmdline: Option<bool>,
}

/// `machine.features`.
#[derive(Debug, Default, Serialize, Deserialize)]
pub(crate) struct Features {
    #[serde(
        rename = "diskQuotaSupport",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub disk_quota_support: Option<bool>,
    #[serde(rename = "kubePrism", default, skip_serializing_if = "Option::is_none")]
    pub kube_prism: Option<KubePrism>,
    #[serde(rename = "hostDNS", default, skip_serializing_if = "Option::is_none")]
    pub host_dns: Option<HostDns>,
}

/// `machine.features.kubePrism`.
#[derive(Debug, Default, Serialize, Deserialize)]
pub(crate) struct KubePrism {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
}

/// `machine.features.hostDNS`.
#[derive(Debug, Default, Serialize, Deserialize)]
pub(crate) struct HostDns {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    #[serde(
        rename = "forwardKubeDNSToHost",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub forward_kube_dns_to_host: Option<bool>,
}

/// `cluster`.
#[derive(Debug, Default, Serialize, Deserialize)]
pub(crate) struct Cluster {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
    #[serde(
        rename = "controlPlane",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub control_plane: Option<ControlPlane>,
    #[serde(
        rename = "clusterName",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<ClusterNetwork>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    #[serde(
        rename = "secretboxEncryptionSecret",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub secretbox_encryption_secret: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca: Option<PemPair>,
    #[serde(
        rename = "aggregatorCA",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub aggregator_ca: Option<PemPair>,
    #[serde(
        rename = "serviceAccount",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub service_account: Option<PemPair>,
    #[serde(rename = "apiServer", default, skip_serializing_if = "Option::is_none")]
    pub api_server: Option<ApiServer>,
    #[serde(
        rename = "controllerManager",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub controller_manager: Option<Image>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy: Option<Proxy>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduler: Option<Image>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub discovery: Option<Discovery>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd: Option<Etcd>,
    #[serde(
        rename = "allowSchedulingOnControlPlanes",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub allow_scheduling_on_control_planes: Option<bool>,
}

/// `cluster.controlPlane`.
#[derive(Debug, Default, Serialize, Deserialize)]
pub(crate) struct ControlPlane {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
}

/// `cluster.network`.
#[derive(Debug, Default, Serialize, Deserialize)]
pub(crate) struct ClusterNetwork {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cni: Option<Cni>,
    #[serde(rename = "dnsDomain", default, skip_serializing_if = "Option::is_none")]
    pub dns_domain: Option<String>,
    #[serde(
        rename = "podSubnets",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub pod_subnets: Option<Vec<String>>,
    #[serde(
        rename = "serviceSubnets",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub service_subnets: Option<Vec<String>>,
}

/// `cluster.network.cni`.
#[derive(Debug, Default, Serialize, Deserialize)]
pub(crate) struct Cni {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub urls: Option<Vec<String>>,
}

/// `cluster.apiServer`.
#[derive(Debug, Default, Serialize, Deserialize)]
pub(crate) struct ApiServer {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    #[serde(rename = "certSANs", default, skip_serializing_if = "Option::is_none")]
    pub cert_sans: Option<Vec<String>>,
    #[serde(
        rename = "admissionControl",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub admission_control: Option<Vec<serde_json::Value>>,
    #[serde(
        rename = "auditPolicy",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub audit_policy: Option<serde_json::Value>,
}

/// A component with just an image (`controllerManager`, `scheduler`).
#[derive(Debug, Default, Serialize, Deserialize)]
pub(crate) struct Image {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
}

/// `cluster.proxy`.
#[derive(Debug, Default, Serialize, Deserialize)]
pub(crate) struct Proxy {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disabled: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
}

/// `cluster.discovery`.
#[derive(Debug, Default, Serialize, Deserialize)]
pub(crate) struct Discovery {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub registries: Option<Registries>,
}

/// `cluster.discovery.registries`.
#[derive(Debug, Default, Serialize, Deserialize)]
pub(crate) struct Registries {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes: Option<Registry>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<Registry>,
}

/// One discovery registry.
#[derive(Debug, Default, Serialize, Deserialize)]
pub(crate) struct Registry {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disabled: Option<bool>,
}

/// `cluster.etcd`.
#[derive(Debug, Default, Serialize, Deserialize)]
pub(crate) struct Etcd {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca: Option<PemPair>,
}

/// The `HostnameConfig` document (contract ≥ 1.12).
#[derive(Debug, Default, Serialize, Deserialize)]
pub(crate) struct HostnameConfig {
    #[serde(
        rename = "apiVersion",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub api_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto: Option<String>,
}
