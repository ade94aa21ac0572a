//! The fields of cert-manager's `cert-manager.io/v1` kinds that the stand-in reads and
//! writes. The CRDs in the cluster are the real ones; these types only name a subset, and
//! unknown fields are ignored when reading.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kontinuum_crds::conditions::HasConditions;
use kube::CustomResource;
use serde::{Deserialize, Serialize};

/// The issuer configuration shared by `Issuer` and `ClusterIssuer`: exactly one of the
/// issuer types is set (the CRD's schema says so).
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct IssuerConfig {
    /// `selfSigned`: certificates are signed by their own key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub self_signed: Option<serde_json::Value>,
    /// `ca`: certificates are signed by the key pair in a Secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca: Option<CaIssuer>,
    /// `acme`: certificates come from an ACME server (here: the stand-in's test CA).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acme: Option<AcmeIssuer>,
    /// `vault`: not supported by the stand-in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vault: Option<serde_json::Value>,
    /// `venafi`: not supported by the stand-in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub venafi: Option<serde_json::Value>,
}

/// `spec.ca` of an issuer.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct CaIssuer {
    /// Secret with `tls.crt` and `tls.key` of the signing CA (for a ClusterIssuer in the
    /// cluster resource namespace, for an Issuer in its own namespace).
    pub secret_name: String,
}

/// `spec.acme` of an issuer (the fields the stand-in reports on).
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct AcmeIssuer {
    /// The ACME directory URL.
    #[serde(default)]
    pub server: String,
    /// The account e-mail.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub email: Option<String>,
}

/// `spec` of a `ClusterIssuer`.
#[derive(CustomResource, Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[kube(
    group = "cert-manager.io",
    version = "v1",
    kind = "ClusterIssuer",
    status = "IssuerStatus",
    schema = "disabled"
)]
pub struct ClusterIssuerSpec {
    /// The issuer configuration.
    #[serde(flatten)]
    pub config: IssuerConfig,
}

/// `spec` of an `Issuer`.
#[derive(CustomResource, Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[kube(
    group = "cert-manager.io",
    version = "v1",
    kind = "Issuer",
    namespaced,
    status = "IssuerStatus",
    schema = "disabled"
)]
pub struct IssuerSpec {
    /// The issuer configuration.
    #[serde(flatten)]
    pub config: IssuerConfig,
}

/// `status` of an issuer: its `Ready` condition.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct IssuerStatus {
    /// Conditions; the stand-in owns `Ready`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

impl HasConditions for IssuerStatus {
    fn conditions(&self) -> &[Condition] {
        &self.conditions
    }
    fn conditions_mut(&mut self) -> &mut Vec<Condition> {
        &mut self.conditions
    }
}

/// `spec.issuerRef` of a Certificate.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct IssuerRef {
    /// Name of the issuer.
    pub name: String,
    /// `Issuer` (default) or `ClusterIssuer`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// `cert-manager.io` (default) or an external issuer's group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
}

impl IssuerRef {
    /// The kind, defaulted as cert-manager does.
    pub fn kind(&self) -> &str {
        self.kind
            .as_deref()
            .filter(|k| !k.is_empty())
            .unwrap_or("Issuer")
    }
    /// The group, defaulted as cert-manager does.
    pub fn group(&self) -> &str {
        self.group
            .as_deref()
            .filter(|g| !g.is_empty())
            .unwrap_or(GROUP)
    }
}

/// cert-manager's API group.
pub const GROUP: &str = "cert-manager.io";

/// `spec.privateKey` of a Certificate.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct PrivateKeySpec {
    /// `RSA` (default), `ECDSA` or `Ed25519`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub algorithm: Option<String>,
    /// Key size in bits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<i64>,
}

/// `spec.secretTemplate` of a Certificate.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct SecretTemplate {
    /// Annotations copied onto the Secret.
    #[serde(default)]
    pub annotations: std::collections::BTreeMap<String, String>,
    /// Labels copied onto the Secret.
    #[serde(default)]
    pub labels: std::collections::BTreeMap<String, String>,
}

/// `spec` of a `Certificate`.
#[derive(CustomResource, Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[kube(
    group = "cert-manager.io",
    version = "v1",
    kind = "Certificate",
    namespaced,
    status = "CertificateStatus",
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct CertificateSpec {
    /// The Secret the certificate and key are written to.
    pub secret_name: String,
    /// Who signs it.
    pub issuer_ref: IssuerRef,
    /// Subject common name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub common_name: Option<String>,
    /// DNS names.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dns_names: Vec<String>,
    /// IP addresses.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ip_addresses: Vec<String>,
    /// URIs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub uris: Vec<String>,
    /// Whether the certificate is a CA.
    #[serde(default, rename = "isCA")]
    pub is_ca: bool,
    /// Requested lifetime (Go duration, default `2160h`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration: Option<String>,
    /// How long before expiry to renew (Go duration, default a third of the lifetime).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renew_before: Option<String>,
    /// Private key settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub private_key: Option<PrivateKeySpec>,
    /// Labels and annotations for the Secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_template: Option<SecretTemplate>,
}

/// `status` of a Certificate.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CertificateStatus {
    /// Conditions; the stand-in owns `Ready` and `Issuing`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Start of validity of the stored certificate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_before: Option<Time>,
    /// End of validity of the stored certificate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_after: Option<Time>,
    /// When the stand-in will renew it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renewal_time: Option<Time>,
    /// How many times a certificate was issued for this Certificate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<i64>,
}

impl HasConditions for CertificateStatus {
    fn conditions(&self) -> &[Condition] {
        &self.conditions
    }
    fn conditions_mut(&mut self) -> &mut Vec<Condition> {
        &mut self.conditions
    }
}

/// Parses a Go duration as cert-manager writes them (`2160h`, `1h30m`, `90m0s`, `45s`).
pub fn parse_go_duration(text: &str) -> Option<i64> {
    let mut total: i64 = 0;
    let mut number = String::new();
    let mut chars = text.trim().chars().peekable();
    chars.peek()?;
    while let Some(c) = chars.next() {
        if c.is_ascii_digit() {
            number.push(c);
            continue;
        }
        let unit: i64 = match c {
            'h' => 3600,
            'm' if chars.peek() == Some(&'s') => {
                chars.next();
                0
            }
            'm' => 60,
            's' => 1,
            _ => return None,
        };
        let value: i64 = number.parse().ok()?;
        number.clear();
        total = total.checked_add(value.checked_mul(unit)?)?;
    }
    if number.is_empty() { Some(total) } else { None }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations_parse() {
        assert_eq!(parse_go_duration("2160h"), Some(2160 * 3600));
        assert_eq!(parse_go_duration("2160h0m0s"), Some(2160 * 3600));
        assert_eq!(parse_go_duration("1h30m"), Some(5400));
        assert_eq!(parse_go_duration("45s"), Some(45));
        assert_eq!(parse_go_duration("10"), None);
        assert_eq!(parse_go_duration(""), None);
        assert_eq!(parse_go_duration("1d"), None);
    }

    #[test]
    fn real_objects_deserialize() {
        let cert: Certificate = serde_json::from_value(serde_json::json!({
            "apiVersion": "cert-manager.io/v1", "kind": "Certificate",
            "metadata": { "name": "kontinuum", "namespace": "kontinuum-system" },
            "spec": {
                "dnsNames": ["a.eu.example.com"], "secretName": "kontinuum-tls",
                "issuerRef": { "name": "kontinuum", "kind": "ClusterIssuer", "group": "cert-manager.io" },
                "isCA": false, "usages": ["digital signature"]
            }
        }))
        .unwrap();
        assert_eq!(cert.spec.issuer_ref.kind(), "ClusterIssuer");
        let issuer: ClusterIssuer = serde_json::from_value(serde_json::json!({
            "apiVersion": "cert-manager.io/v1", "kind": "ClusterIssuer",
            "metadata": { "name": "kontinuum" },
            "spec": { "acme": {
                "email": "ops@example.com", "server": "https://acme.example/directory",
                "privateKeySecretRef": { "name": "kontinuum-account-key" },
                "solvers": [{ "http01": { "gatewayHTTPRoute": { "parentRefs": [{ "name": "kontinuum" }] } } }]
            } }
        }))
        .unwrap();
        assert!(issuer.spec.config.acme.is_some());
    }
}
