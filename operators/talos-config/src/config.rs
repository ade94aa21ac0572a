//! Machine configs: the controlplane and worker `v1alpha1` documents plus the
//! `HostnameConfig` document, as Kontinuum applies them in maintenance mode.
//!
//! What `talosctl gen config` emits for the contract, with Kontinuum's choices on top:
//! CNI `none` (Cilium is installed as an Addon), kube-proxy disabled (Cilium replaces it
//! through KubePrism on `127.0.0.1:7445`), scheduling allowed on control planes, an
//! install disk given by path or selector, and a fixed hostname (the Instance name) in a
//! separate `HostnameConfig` document. Workers carry no CA keys, no etcd, aggregator or
//! service-account sections and no control-plane components. Contract differences are
//! listed in [`crate::version`].

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde::{Deserialize, Serialize};

use crate::schema;
use crate::secrets::{CertAndKey, SecretsBundle, SecretsError, Sensitive};
use crate::version::{Contract, TalosVersion, VersionError};

/// Kubernetes API server port on the cluster endpoint.
pub const KUBERNETES_API_PORT: u16 = 6443;
/// KubePrism (the local API load balancer) port.
pub const KUBEPRISM_PORT: u16 = 7445;
/// Talos' default pod subnet.
pub const DEFAULT_POD_SUBNET: &str = "10.244.0.0/16";
/// Talos' default service subnet.
pub const DEFAULT_SERVICE_SUBNET: &str = "10.96.0.0/12";
/// Talos' default cluster DNS domain.
pub const DEFAULT_DNS_DOMAIN: &str = "cluster.local";

const KUBELET_IMAGE: &str = "ghcr.io/siderolabs/kubelet";
const INSTALLER_IMAGE: &str = "ghcr.io/siderolabs/installer";
const APISERVER_IMAGE: &str = "registry.k8s.io/kube-apiserver";
const CONTROLLER_MANAGER_IMAGE: &str = "registry.k8s.io/kube-controller-manager";
const SCHEDULER_IMAGE: &str = "registry.k8s.io/kube-scheduler";
const EXCLUDE_FROM_LB_LABEL: &str = "node.kubernetes.io/exclude-from-external-load-balancers";

/// Role of a machine (`machine.type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MachineType {
    /// `controlplane`.
    ControlPlane,
    /// `worker`.
    Worker,
    /// `init`: a legacy control-plane type Talos still accepts. Never rendered, only parsed.
    Init,
}

impl MachineType {
    /// The `machine.type` value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ControlPlane => "controlplane",
            Self::Worker => "worker",
            Self::Init => "init",
        }
    }

    /// Whether the machine runs the control plane (and so holds the CA keys).
    pub fn is_control_plane(self) -> bool {
        matches!(self, Self::ControlPlane | Self::Init)
    }

    pub(crate) fn parse(s: &str) -> Option<Self> {
        match s {
            "controlplane" => Some(Self::ControlPlane),
            "worker" => Some(Self::Worker),
            "init" => Some(Self::Init),
            _ => None,
        }
    }
}

impl fmt::Display for MachineType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Talos' `machine.install.diskSelector`. Every set field must match; an empty selector
/// matches the first non-read-only, non-CD disk.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiskSelector {
    /// Size match, e.g. `">= 100GB"` or `"4GB"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<String>,
    /// Disk model (glob).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Serial number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serial: Option<String>,
    /// Device name, e.g. `sda`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Disk type: `ssd`, `hdd`, `nvme` or `sd`.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub disk_type: Option<String>,
    /// World-wide id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wwid: Option<String>,
    /// Bus path (glob).
    #[serde(rename = "busPath", default, skip_serializing_if = "Option::is_none")]
    pub bus_path: Option<String>,
}

/// Where Talos installs itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InstallDisk {
    /// A device path, e.g. `/dev/vda` (`machine.install.disk`).
    Path(String),
    /// A selector (`machine.install.diskSelector`); `DiskSelector::default()` is `{}`.
    Selector(DiskSelector),
}

/// Cluster-wide inputs of a machine config (one per TalosCluster).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigInput {
    /// `cluster.clusterName`.
    pub cluster_name: String,
    /// Host (IP or DNS name) of the Kubernetes API: the endpoint is `https://<host>:6443`.
    pub endpoint_host: String,
    /// Target Talos version; its contract decides the shape of the config.
    pub talos_version: TalosVersion,
    /// Kubernetes version, e.g. `1.36.2` (a leading `v` is accepted).
    pub kubernetes_version: String,
    /// Install disk. Defaults to an empty selector (as the Go predecessor).
    pub install_disk: InstallDisk,
    /// Installer image. Defaults to `ghcr.io/siderolabs/installer:<talos version>`.
    pub install_image: Option<String>,
    /// Pod CIDRs. Default `10.244.0.0/16`.
    pub pod_subnets: Vec<String>,
    /// Service CIDRs. Default `10.96.0.0/12`.
    pub service_subnets: Vec<String>,
    /// Cluster DNS domain. Default `cluster.local`.
    pub dns_domain: String,
    /// Cluster discovery through the discovery service (Kubernetes registry disabled).
    /// Default true, as `talosctl gen config`.
    pub discovery: bool,
    /// Extra SANs for the Talos API certificate (`machine.certSANs`).
    pub machine_cert_sans: Vec<String>,
    /// Extra SANs for the API server certificate (`cluster.apiServer.certSANs`).
    pub api_server_cert_sans: Vec<String>,
}

impl ConfigInput {
    /// Inputs with `talosctl gen config` defaults for everything not given.
    pub fn new(
        cluster_name: impl Into<String>,
        endpoint_host: impl Into<String>,
        talos_version: TalosVersion,
        kubernetes_version: impl Into<String>,
    ) -> Self {
        Self {
            cluster_name: cluster_name.into(),
            endpoint_host: endpoint_host.into(),
            talos_version,
            kubernetes_version: kubernetes_version.into(),
            install_disk: InstallDisk::Selector(DiskSelector::default()),
            install_image: None,
            pod_subnets: vec![DEFAULT_POD_SUBNET.to_owned()],
            service_subnets: vec![DEFAULT_SERVICE_SUBNET.to_owned()],
            dns_domain: DEFAULT_DNS_DOMAIN.to_owned(),
            discovery: true,
            machine_cert_sans: Vec::new(),
            api_server_cert_sans: Vec::new(),
        }
    }

    /// The cluster endpoint URL, `https://<host>:6443` (IPv6 in brackets).
    pub fn endpoint_url(&self) -> String {
        match self.endpoint_host.parse::<IpAddr>() {
            Ok(IpAddr::V6(ip)) => format!("https://[{ip}]:{KUBERNETES_API_PORT}"),
            _ => format!("https://{}:{KUBERNETES_API_PORT}", self.endpoint_host),
        }
    }
}

/// A rendered machine config (multi-document YAML). It holds keys: `Debug` is redacted.
#[derive(Clone, PartialEq, Eq)]
pub struct MachineConfig(Sensitive);

impl MachineConfig {
    /// The YAML text, for `ApplyConfiguration`.
    pub fn expose(&self) -> &str {
        self.0.expose()
    }

    pub(crate) fn from_sensitive(yaml: Sensitive) -> Self {
        Self(yaml)
    }
}

impl fmt::Debug for MachineConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("MachineConfig([REDACTED])")
    }
}

/// Errors generating or parsing a machine config.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The Talos version is invalid or unsupported.
    #[error("unsupported talos version for a machine config")]
    Version(#[from] VersionError),
    /// A generation input is invalid.
    #[error("invalid {field}: {problem}")]
    InvalidInput {
        /// The input.
        field: &'static str,
        /// What is wrong with it.
        problem: &'static str,
    },
    /// The secrets bundle could not be used.
    #[error("using the secrets bundle failed")]
    Secrets(#[source] SecretsError),
    /// Rendering YAML failed.
    #[error("rendering the {document} document failed")]
    Render {
        /// Which document.
        document: &'static str,
        /// The cause.
        #[source]
        source: serde_saphyr::ser::Error,
    },
    /// The config to parse is empty.
    #[error("machine config is empty")]
    Empty,
    /// The config to parse is larger than [`crate::MAX_CONFIG_BYTES`].
    #[error("machine config is {size} bytes, more than the {max} allowed")]
    TooLarge {
        /// Its size.
        size: usize,
        /// The limit.
        max: usize,
    },
    /// The config is not UTF-8 YAML.
    #[error("machine config is not valid yaml")]
    InvalidYaml(#[source] Option<serde_saphyr::Error>),
    /// No `v1alpha1` document.
    #[error("machine config has no v1alpha1 document")]
    NoV1Alpha1,
    /// More than one document of a kind that must be unique.
    #[error("machine config has more than one {document} document")]
    DuplicateDocument {
        /// Which document.
        document: &'static str,
    },
    /// A field Talos requires is missing.
    #[error("machine config is missing {field}")]
    MissingField {
        /// Its path, e.g. `machine.ca.crt`.
        field: &'static str,
    },
    /// A field has a value Talos rejects.
    #[error("machine config field {field} is invalid: {problem}")]
    InvalidField {
        /// Its path.
        field: &'static str,
        /// What is wrong with it.
        problem: &'static str,
    },
}

impl ConfigError {
    /// Stable CamelCase reason, for conditions and metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Version(e) => e.reason(),
            Self::InvalidInput { .. } => "InvalidConfigInput",
            Self::Secrets(e) => e.reason(),
            Self::Render { .. } => "RenderFailed",
            Self::Empty => "EmptyConfig",
            Self::TooLarge { .. } => "ConfigTooLarge",
            Self::InvalidYaml(_) => "InvalidYaml",
            Self::NoV1Alpha1 | Self::DuplicateDocument { .. } => "InvalidDocuments",
            Self::MissingField { .. } => "MissingField",
            Self::InvalidField { .. } => "InvalidField",
        }
    }
}

/// Renders the machine config of one machine: the `v1alpha1` document for `machine_type`
/// (`ControlPlane` or `Worker`) and the `HostnameConfig` document with `hostname`.
pub fn render_machine_config(
    input: &ConfigInput,
    bundle: &SecretsBundle,
    machine_type: MachineType,
    hostname: &str,
) -> Result<MachineConfig, ConfigError> {
    let contract = input.talos_version.contract()?;
    validate_input(input)?;
    validate_hostname(hostname)?;
    let control_plane = match machine_type {
        MachineType::ControlPlane => true,
        MachineType::Worker => false,
        MachineType::Init => {
            return Err(ConfigError::InvalidInput {
                field: "machine type",
                problem: "init is legacy; render controlplane",
            });
        }
    };
    let document = schema::V1Alpha1 {
        version: Some("v1alpha1".to_owned()),
        debug: Some(false),
        persist: Some(true),
        machine: Some(machine_section(input, bundle, contract, machine_type)),
        cluster: Some(cluster_section(input, bundle, control_plane)),
    };
    let hostname_document = schema::HostnameConfig {
        api_version: Some("v1alpha1".to_owned()),
        kind: Some("HostnameConfig".to_owned()),
        hostname: Some(hostname.to_owned()),
        auto: None,
    };
    let mut yaml = to_yaml(&document).map_err(|source| ConfigError::Render {
        document: "v1alpha1",
        source,
    })?;
    if !yaml.ends_with('\n') {
        yaml.push('\n');
    }
    yaml.push_str("---\n");
    yaml.push_str(
        &to_yaml(&hostname_document).map_err(|source| ConfigError::Render {
            document: "HostnameConfig",
            source,
        })?,
    );
    Ok(MachineConfig(Sensitive::new(yaml)))
}

/// The `machine` section.
fn machine_section(
    input: &ConfigInput,
    bundle: &SecretsBundle,
    contract: Contract,
    machine_type: MachineType,
) -> schema::Machine {
    let control_plane = machine_type.is_control_plane();
    let k8s = kubernetes_version(input);
    let (disk, disk_selector) = match &input.install_disk {
        InstallDisk::Path(path) => (Some(path.clone()), None),
        InstallDisk::Selector(selector) => (None, Some(selector.clone())),
    };
    schema::Machine {
        kind: Some(machine_type.as_str().to_owned()),
        token: Some(bundle.trustd_token().expose().to_owned()),
        ca: Some(pem_pair(bundle.os_ca(), control_plane)),
        cert_sans: Some(input.machine_cert_sans.clone()),
        kubelet: Some(schema::Kubelet {
            image: Some(format!("{KUBELET_IMAGE}:v{k8s}")),
            default_runtime_seccomp_profile_enabled: Some(true),
            disable_manifests_directory: Some(true),
        }),
        network: contract
            .emits_empty_machine_network()
            .then(schema::MachineNetwork::default),
        install: Some(schema::Install {
            disk,
            disk_selector,
            image: Some(
                input
                    .install_image
                    .clone()
                    .unwrap_or_else(|| format!("{INSTALLER_IMAGE}:{}", input.talos_version)),
            ),
            wipe: Some(false),
            grub_use_uki_cmdline: Some(true),
        }),
        features: Some(schema::Features {
            disk_quota_support: Some(true),
            kube_prism: Some(schema::KubePrism {
                enabled: Some(true),
                port: Some(KUBEPRISM_PORT),
            }),
            host_dns: Some(schema::HostDns {
                enabled: Some(true),
                forward_kube_dns_to_host: Some(true),
            }),
        }),
        node_labels: control_plane
            .then(|| BTreeMap::from([(EXCLUDE_FROM_LB_LABEL.to_owned(), String::new())])),
    }
}

/// The `cluster` section; workers get no keys, etcd or control-plane components.
fn cluster_section(
    input: &ConfigInput,
    bundle: &SecretsBundle,
    control_plane: bool,
) -> schema::Cluster {
    let k8s = kubernetes_version(input);
    let discovery = schema::Discovery {
        enabled: Some(input.discovery),
        registries: input.discovery.then(|| schema::Registries {
            kubernetes: Some(schema::Registry {
                disabled: Some(true),
            }),
            service: Some(schema::Registry::default()),
        }),
    };
    let mut cluster = schema::Cluster {
        id: Some(bundle.cluster_id().to_owned()),
        secret: Some(bundle.cluster_secret().expose().to_owned()),
        control_plane: Some(schema::ControlPlane {
            endpoint: Some(input.endpoint_url()),
        }),
        name: Some(input.cluster_name.clone()),
        network: Some(schema::ClusterNetwork {
            cni: Some(schema::Cni {
                name: Some("none".to_owned()),
                urls: None,
            }),
            dns_domain: Some(input.dns_domain.clone()),
            pod_subnets: Some(input.pod_subnets.clone()),
            service_subnets: Some(input.service_subnets.clone()),
        }),
        token: Some(bundle.bootstrap_token().expose().to_owned()),
        ca: Some(pem_pair(bundle.kubernetes_ca(), control_plane)),
        discovery: Some(discovery),
        ..schema::Cluster::default()
    };
    if control_plane {
        cluster.secretbox_encryption_secret =
            Some(bundle.secretbox_encryption_secret().expose().to_owned());
        cluster.aggregator_ca = Some(pem_pair(bundle.aggregator_ca(), true));
        cluster.service_account = Some(schema::PemPair {
            crt: None,
            key: Some(b64(bundle.service_account_key().expose())),
        });
        cluster.api_server = Some(schema::ApiServer {
            image: Some(format!("{APISERVER_IMAGE}:v{k8s}")),
            cert_sans: Some(input.api_server_cert_sans.clone()),
            admission_control: Some(vec![pod_security_admission()]),
            audit_policy: Some(audit_policy()),
        });
        cluster.controller_manager = Some(schema::Image {
            image: Some(format!("{CONTROLLER_MANAGER_IMAGE}:v{k8s}")),
        });
        cluster.proxy = Some(schema::Proxy {
            disabled: Some(true),
            image: None,
        });
        cluster.scheduler = Some(schema::Image {
            image: Some(format!("{SCHEDULER_IMAGE}:v{k8s}")),
        });
        cluster.etcd = Some(schema::Etcd {
            ca: Some(pem_pair(bundle.etcd_ca(), true)),
        });
        cluster.allow_scheduling_on_control_planes = Some(true);
    }
    cluster
}

/// The Kubernetes version without a leading `v`.
fn kubernetes_version(input: &ConfigInput) -> &str {
    input
        .kubernetes_version
        .strip_prefix('v')
        .unwrap_or(&input.kubernetes_version)
}

/// YAML as Go's encoder writes it for these documents: plain scalars (no folded `>-` blocks
/// for long base64 values), two-space indentation.
pub(crate) fn to_yaml<T: Serialize>(value: &T) -> Result<String, serde_saphyr::ser::Error> {
    serde_saphyr::to_string_with_options(
        value,
        serde_saphyr::ser_options! { prefer_block_scalars: false },
    )
}

/// `{crt, key}` as base64 of PEM; the key is `""` unless `with_key` (workers).
fn pem_pair(ca: &CertAndKey, with_key: bool) -> schema::PemPair {
    schema::PemPair {
        crt: Some(b64(&ca.cert_pem)),
        key: Some(if with_key {
            b64(ca.key_pem.expose())
        } else {
            String::new()
        }),
    }
}

fn b64(text: &str) -> String {
    STANDARD.encode(text.as_bytes())
}

/// `talosctl gen config`'s PodSecurity admission defaults (baseline enforced, restricted
/// audited and warned, kube-system exempt).
fn pod_security_admission() -> serde_json::Value {
    serde_json::json!({
        "name": "PodSecurity",
        "configuration": {
            "apiVersion": "pod-security.admission.config.k8s.io/v1alpha1",
            "kind": "PodSecurityConfiguration",
            "defaults": {
                "audit": "restricted",
                "audit-version": "latest",
                "enforce": "baseline",
                "enforce-version": "latest",
                "warn": "restricted",
                "warn-version": "latest",
            },
            "exemptions": {
                "namespaces": ["kube-system"],
                "runtimeClasses": [],
                "usernames": [],
            },
        },
    })
}

/// `talosctl gen config`'s audit policy: everything at `Metadata` level.
fn audit_policy() -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "audit.k8s.io/v1",
        "kind": "Policy",
        "rules": [{"level": "Metadata"}],
    })
}

fn invalid(field: &'static str, problem: &'static str) -> ConfigError {
    ConfigError::InvalidInput { field, problem }
}

fn validate_input(input: &ConfigInput) -> Result<(), ConfigError> {
    if !is_dns_subdomain(&input.cluster_name) {
        return Err(invalid(
            "cluster name",
            "must be a lowercase RFC 1123 DNS name",
        ));
    }
    if input.endpoint_host.parse::<IpAddr>().is_err() && !is_dns_subdomain(&input.endpoint_host) {
        return Err(invalid(
            "endpoint host",
            "must be an IP address or a DNS name (no scheme or port)",
        ));
    }
    let k8s = input
        .kubernetes_version
        .strip_prefix('v')
        .unwrap_or(&input.kubernetes_version);
    let parts: Vec<&str> = k8s.split('.').collect();
    if parts.len() != 3
        || parts
            .iter()
            .any(|p| p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()))
    {
        return Err(invalid("kubernetes version", "must be MAJOR.MINOR.PATCH"));
    }
    match &input.install_disk {
        InstallDisk::Path(path) => {
            if !path.starts_with("/dev/") || path.len() <= 5 || path.contains(char::is_whitespace) {
                return Err(invalid("install disk", "must be a /dev/ path"));
            }
        }
        InstallDisk::Selector(selector) => {
            if let Some(kind) = &selector.disk_type
                && !matches!(kind.as_str(), "ssd" | "hdd" | "nvme" | "sd")
            {
                return Err(invalid(
                    "install disk selector type",
                    "must be ssd, hdd, nvme or sd",
                ));
            }
        }
    }
    if input
        .install_image
        .as_deref()
        .is_some_and(|i| i.is_empty() || i.contains(char::is_whitespace))
    {
        return Err(invalid("install image", "must be an image reference"));
    }
    for (field, subnets) in [
        ("pod subnets", &input.pod_subnets),
        ("service subnets", &input.service_subnets),
    ] {
        if subnets.is_empty() || !subnets.iter().all(|s| is_cidr(s)) {
            return Err(invalid(field, "must be one or more CIDRs"));
        }
    }
    if !is_dns_subdomain(&input.dns_domain) {
        return Err(invalid("dns domain", "must be a DNS name"));
    }
    for san in input
        .machine_cert_sans
        .iter()
        .chain(&input.api_server_cert_sans)
    {
        if san.parse::<IpAddr>().is_err() && !is_dns_subdomain(san) {
            return Err(invalid("cert SANs", "must be IP addresses or DNS names"));
        }
    }
    Ok(())
}

fn validate_hostname(hostname: &str) -> Result<(), ConfigError> {
    if is_dns_subdomain(hostname) {
        Ok(())
    } else {
        Err(invalid("hostname", "must be a lowercase RFC 1123 DNS name"))
    }
}

/// A lowercase RFC 1123 subdomain: dot-separated labels of `[a-z0-9-]`, 1–63 characters,
/// not starting or ending with `-`, at most 253 characters in all.
pub(crate) fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        })
}

fn is_cidr(s: &str) -> bool {
    let Some((ip, prefix)) = s.split_once('/') else {
        return false;
    };
    let Ok(prefix) = prefix.parse::<u8>() else {
        return false;
    };
    match ip.parse::<IpAddr>() {
        Ok(IpAddr::V4(_)) => prefix <= 32,
        Ok(IpAddr::V6(_)) => prefix <= 128,
        Err(_) => false,
    }
}
