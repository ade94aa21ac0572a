//! The zone's downstream footprint: what the zone-installer installs INTO THE ZONE CLUSTER
//! (reference section 3.6 steps 11–13, hardened as DESIGN section 3 says) and takes back.
//!
//! * Owns, in the zone cluster (all server-side applied with [`FIELD_MANAGER`], force):
//!   Namespace [`NAMESPACE`] (Pod Security `restricted`), Secret `kontinuum-identity`
//!   (`kubernetes.io/tls`: the zone's certificate and PKCS#8 key), Secret and ConfigMap
//!   `kontinuum-env` (environment variables only), ConfigMap `kontinuum-ca` (the hub's
//!   proxy and OIDC CA certificates, mounted as files), Deployment and Service `kontinuum`;
//!   with a domain, ClusterIssuer, Gateway, Certificate and HTTPRoute `kontinuum`.
//! * Shape: [`render`] is pure (inputs → JSON objects in install order); [`apply`],
//!   [`observe`] and [`teardown`] are small async acts, every call bounded by a timeout.
//!   [`render_in`] and [`teardown_in`] take the namespace as a parameter (tests sharing one
//!   API server); production uses [`NAMESPACE`].
//! * The Deployment runs the zone agent (`registry zone`) with `etcd-proxy relay` beside it:
//!   the relay alone mounts the identity key (read-only), listens on a unix socket in a
//!   shared `emptyDir`, and dials the hub's proxy with the proxy CA; the agent reaches the
//!   store only through that socket. The agent mounts the hub's OIDC CA (read-only), when
//!   the hub has one, with `KONTINUUM_OIDC_CA_FILE` naming it. The pod template carries the
//!   identity thumbprint ([`kontinuum_crds::labels::IDENTITY_THUMBPRINT`]), so a rotation
//!   restarts the agent exactly once, and a checksum of the env and CA objects
//!   ([`CONFIG_CHECKSUM`]), so a settings change rolls out; neither changes on a no-op
//!   reconcile (no timestamps).
//!
//! Never: logs, or puts into an error, the identity key or a secret env value; replaces the
//! Deployment's spec wholesale (server-side apply sends only our fields); touches objects
//! other than the ones listed.

use std::collections::BTreeMap;
use std::time::Duration;

use kontinuum_operator_common::error::{ErrorClass, ReconcileError, kube_error_class};
use serde_json::Value;

mod act;
mod render;

pub use act::{apply, observe, teardown, teardown_in};
pub use render::{
    ca_data, config_env, dsn, host, is_auth_env, is_secret_env, pem_fingerprint, render_in,
    secret_env,
};

/// Field manager of every downstream write.
pub const FIELD_MANAGER: &str = "zone-installer.kontinuum.sh";
/// Namespace of the footprint in the zone cluster.
pub const NAMESPACE: &str = "kontinuum-system";

/// Secret `kubernetes.io/tls` holding the zone's identity certificate and private key.
pub const IDENTITY_SECRET: &str = "kontinuum-identity";
/// Secret holding the agent's secret env (the DSN, secret auth variables).
pub const ENV_SECRET: &str = "kontinuum-env";
/// ConfigMap holding the agent's plain env (environment variables only: it is loaded with
/// `envFrom`).
pub const ENV_CONFIG_MAP: &str = "kontinuum-env";
/// ConfigMap holding the hub's CA certificates (public data), mounted read-only as files;
/// rendered always, empty when the hub has neither CA.
pub const CA_CONFIG_MAP: &str = "kontinuum-ca";
/// Key of the proxy CA bundle in the `kontinuum-ca` ConfigMap (mounted for the relay).
pub const PROXY_CA_KEY: &str = "proxy-ca.crt";
/// Key of the OIDC issuer's CA bundle in the `kontinuum-ca` ConfigMap (mounted for the
/// agent).
pub const OIDC_CA_KEY: &str = "oidc-ca.crt";
/// Deployment running the zone agent and the relay.
pub const DEPLOYMENT: &str = "kontinuum";
/// Service in front of the zone agent's HTTP port.
pub const SERVICE: &str = "kontinuum";
/// Name of the ClusterIssuer, Gateway, Certificate and HTTPRoute.
pub const NETWORK: &str = "kontinuum";
/// Secret cert-manager writes the zone endpoint's certificate into.
pub const TLS_SECRET: &str = "kontinuum-tls";
/// Secret of the ACME account key (cert-manager keeps it in its cluster resource namespace).
pub const ACCOUNT_KEY_SECRET: &str = "kontinuum-account-key";
/// The zone agent's container.
pub const AGENT_CONTAINER: &str = "kontinuum";
/// The relay's container.
pub const RELAY_CONTAINER: &str = "relay";
/// The zone agent's HTTP port (`/healthz`, `/readyz`, `/version`, `/status`), named `http`.
pub const AGENT_HTTP_PORT: i32 = 8080;
/// The zone agent's admin port (`/metrics`), named `metrics`.
pub const AGENT_METRICS_PORT: i32 = 9090;
/// The relay's admin port (`/healthz`, `/readyz`, `/metrics`), named `relay-admin`.
pub const RELAY_ADMIN_PORT: i32 = 8081;
/// Directory (an `emptyDir` in both containers) holding the relay's unix socket.
pub const SOCKET_DIR: &str = "/run/kontinuum";
/// Where the relay finds the identity (`tls.crt`, `tls.key`), read-only.
pub const IDENTITY_DIR: &str = "/etc/kontinuum/etcd-identity";
/// Where the relay finds the proxy CA (`ca.crt`), when one is set.
pub const PROXY_CA_DIR: &str = "/etc/kontinuum/proxy-ca";
/// Where the agent finds the OIDC issuer's CA (`ca.crt`), when one is set.
pub const OIDC_CA_DIR: &str = "/etc/kontinuum/oidc-ca";
/// The agent's variable naming the OIDC CA file (the same name on the hub, where
/// zone-installer reads it: [`crate::config::Args::oidc_ca_file`]).
pub const OIDC_CA_FILE_ENV: &str = "KONTINUUM_OIDC_CA_FILE";
/// Pod template annotation: SHA-256 of the env Secret, env ConfigMap and CA ConfigMap
/// entries.
pub const CONFIG_CHECKSUM: &str = "kontinuum.sh/config-checksum";
/// `app.kubernetes.io/managed-by` of every object.
pub const MANAGED_BY: &str = "zone-installer";
/// The storage DSN variable (in the `kontinuum-env` Secret).
pub const STORAGE_ENV: &str = "KONTINUUM_SERVER_STORAGE";

/// Which issuer the zone's certificate comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IssuerKind {
    /// ACME (e.g. Let's Encrypt) with an HTTP-01 solver answering through the Gateway.
    Acme {
        /// Account e-mail; omitted when empty.
        email: String,
        /// The ACME directory URL.
        server: String,
    },
    /// A self-signed certificate (private sites, tests).
    SelfSigned,
    /// A CA whose certificate and key are in a `kubernetes.io/tls` Secret in cert-manager's
    /// cluster resource namespace.
    Ca {
        /// That Secret's name.
        secret_name: String,
    },
}

/// Operator-wide settings (from flags/env of zone-installer, set by the chart).
#[derive(Clone, PartialEq, Eq)]
pub struct Settings {
    /// The zone agent image (the same image as the hub operators).
    pub agent_image: String,
    /// `imagePullPolicy` of both containers; the API server's default when `None`.
    pub image_pull_policy: Option<String>,
    /// `host:port` of the hub's etcd-proxy (`KONTINUUM_SERVER_GRPC_ENDPOINT`).
    pub hub_grpc_endpoint: String,
    /// CA bundle the relay trusts for the proxy's serving certificate; the system's roots
    /// when `None`. Public data (certificates only).
    pub proxy_ca_pem: Option<String>,
    /// CA bundle the agent trusts for the OIDC issuer (a private issuer), mounted from
    /// [`CA_CONFIG_MAP`] with [`OIDC_CA_FILE_ENV`] naming it; the system's roots when
    /// `None`. Public data (certificates only).
    pub oidc_ca_pem: Option<String>,
    /// The hub's auth mode, mirrored: `KONTINUUM_OIDC_*` or
    /// `KONTINUUM_INSECURE_ALLOW_ANONYMOUS` (other names are ignored; see [`is_auth_env`]).
    pub auth_env: BTreeMap<String, String>,
    /// Class of the zone's Gateway (default `cilium`).
    pub gateway_class: String,
    /// Where the zone endpoint's certificate comes from.
    pub issuer: IssuerKind,
}

impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Secret auth values (an OIDC client secret) are never printed.
        let auth: BTreeMap<&str, &str> = self
            .auth_env
            .iter()
            .map(|(k, v)| {
                let shown = if is_secret_env(k) { "<redacted>" } else { v };
                (k.as_str(), shown)
            })
            .collect();
        f.debug_struct("Settings")
            .field("agent_image", &self.agent_image)
            .field("image_pull_policy", &self.image_pull_policy)
            .field("hub_grpc_endpoint", &self.hub_grpc_endpoint)
            .field(
                "proxy_ca_pem",
                &self.proxy_ca_pem.as_deref().map(pem_fingerprint),
            )
            .field(
                "oidc_ca_pem",
                &self.oidc_ca_pem.as_deref().map(pem_fingerprint),
            )
            .field("auth_env", &auth)
            .field("gateway_class", &self.gateway_class)
            .field("issuer", &self.issuer)
            .finish()
    }
}

/// One zone's inputs.
#[derive(Clone, Copy)]
pub struct Zone<'a> {
    /// The zone's region.
    pub region: &'a str,
    /// The zone.
    pub zone: &'a str,
    /// `<region>-<zone>`: the Zone object's name, the relay's token issuer.
    pub zone_name: &'a str,
    /// DNS domain; the zone endpoint is `<zone>.<region>.<domain>`. No network exposure
    /// (ClusterIssuer, Gateway, Certificate, HTTPRoute) without one.
    pub domain: Option<&'a str>,
    /// The zone's current self-signed ed25519 certificate (PEM).
    pub identity_cert_pem: &'a str,
    /// Its PKCS#8 private key (PEM). SECRET: never logged, never in a condition; it appears
    /// only in the identity Secret.
    pub identity_key_pem: &'a str,
    /// SHA-256 hex of the certificate's DER, the pod template annotation
    /// `kontinuum.sh/identity-thumbprint`.
    pub identity_thumbprint: &'a str,
}

impl std::fmt::Debug for Zone<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Zone")
            .field("region", &self.region)
            .field("zone", &self.zone)
            .field("zone_name", &self.zone_name)
            .field("domain", &self.domain)
            .field("identity_thumbprint", &self.identity_thumbprint)
            .finish_non_exhaustive()
    }
}

/// Every object of the footprint in [`NAMESPACE`], in install order, as JSON objects ready
/// for server-side apply (apiVersion/kind/metadata.name/namespace set). Pure.
pub fn render(zone: &Zone<'_>, settings: &Settings) -> Vec<Value> {
    render_in(zone, settings, NAMESPACE)
}

/// What was observed downstream after applying.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observed {
    /// `Some(class)` when the Gateway's GatewayClass does not exist downstream.
    pub gateway_class_missing: Option<String>,
    /// The Certificate's readiness; `None` without a domain (no Certificate).
    pub certificate: Option<CertificateState>,
    /// Deployment `kontinuum` has an available replica (the agent is registered: its
    /// readiness probe is `/readyz`).
    pub agent_available: bool,
}

/// Readiness of the zone endpoint's Certificate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CertificateState {
    /// cert-manager reports `Ready=True` for the current generation.
    Ready,
    /// Not (yet) ready.
    NotReady {
        /// cert-manager's reason (or ours: `Pending`, `Outdated`, `NotFound`).
        reason: String,
        /// cert-manager's message (or ours).
        message: String,
    },
}

/// Progress of [`teardown`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TeardownProgress {
    /// Deletions were issued; these objects (`Kind/name`) still exist (finalizers, a
    /// terminating namespace). Call again.
    InProgress {
        /// What is still there.
        remaining: Vec<String>,
    },
    /// Everything is gone, the namespace included.
    Done,
}

/// A failure to apply, observe or tear down the footprint. Messages carry the object's
/// kind and name, never its content.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An object to apply lacks apiVersion, kind or name, or is of a kind the footprint
    /// does not know.
    #[error("invalid footprint object {index}: {why}")]
    InvalidObject {
        /// Its position in the list.
        index: usize,
        /// What is wrong.
        why: String,
    },
    /// The zone cluster does not serve this kind: its CRD (Gateway API, cert-manager) is
    /// not installed.
    #[error("the zone cluster has no {kind} API ({api_version}): its CRD is not installed")]
    CrdMissing {
        /// The kind.
        kind: String,
        /// Its apiVersion.
        api_version: String,
    },
    /// The zone cluster's API server did not answer in time.
    #[error("timed out after {after:?} {action} {kind} {name} in the zone cluster")]
    Timeout {
        /// What we were doing (`applying`, `reading`, `deleting`).
        action: &'static str,
        /// The object's kind.
        kind: String,
        /// The object's name.
        name: String,
        /// The deadline.
        after: Duration,
    },
    /// The zone cluster's API server could not be reached.
    #[error("zone cluster unreachable {action} {kind} {name}")]
    Unreachable {
        /// What we were doing.
        action: &'static str,
        /// The object's kind.
        kind: String,
        /// The object's name.
        name: String,
        /// The cause.
        #[source]
        source: Box<kube::Error>,
    },
    /// The API server refused an object (schema, CEL, admission, permissions).
    #[error("applying {kind} {name} in the zone cluster failed")]
    Apply {
        /// The object's kind.
        kind: String,
        /// The object's name.
        name: String,
        /// The cause.
        #[source]
        source: Box<kube::Error>,
    },
    /// Reading an object back failed.
    #[error("reading {kind} {name} in the zone cluster failed")]
    Observe {
        /// The object's kind.
        kind: String,
        /// The object's name.
        name: String,
        /// The cause.
        #[source]
        source: Box<kube::Error>,
    },
    /// Deleting an object failed.
    #[error("deleting {kind} {name} in the zone cluster failed")]
    Delete {
        /// The object's kind.
        kind: String,
        /// The object's name.
        name: String,
        /// The cause.
        #[source]
        source: Box<kube::Error>,
    },
}

impl Error {
    /// Stable CamelCase reason (metric label, Event and condition reason).
    pub fn reason(&self) -> &'static str {
        match self {
            Self::InvalidObject { .. } => "InvalidObject",
            Self::CrdMissing { .. } => "CrdMissing",
            Self::Timeout { .. } | Self::Unreachable { .. } => "DownstreamUnreachable",
            Self::Apply { .. } => "ApplyFailed",
            Self::Observe { .. } => "ObserveFailed",
            Self::Delete { .. } => "DeleteFailed",
        }
    }

    /// Whether retrying can help. A missing CRD is transient: the addons install it.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::InvalidObject { .. } => false,
            Self::CrdMissing { .. } | Self::Timeout { .. } | Self::Unreachable { .. } => true,
            Self::Apply { source, .. }
            | Self::Observe { source, .. }
            | Self::Delete { source, .. } => kube_error_class(source) == ErrorClass::Transient,
        }
    }
}

impl ReconcileError for Error {
    fn reason(&self) -> &'static str {
        Error::reason(self)
    }

    fn class(&self) -> ErrorClass {
        if self.is_transient() {
            ErrorClass::Transient
        } else {
            ErrorClass::Permanent
        }
    }
}

#[cfg(test)]
mod tests;
