//! The zone identity (DESIGN section 3): an ed25519 key pair in a self-signed X.509
//! certificate (CN = the zone's name).
//!
//! * The private key (PKCS#8 PEM) lives only in the zone cluster, in the footprint's
//!   `kontinuum-identity` Secret: the zone-installer reads it back from there on every
//!   reconcile and never stores it on the hub.
//! * The hub keeps only certificates, in the Secret `<zone name>-identity` of type
//!   [`SECRET_TYPE`]: the etcd proxy's trust. During a rotation's overlap window its
//!   `tls.crt` holds the new and the old certificate, and the annotation
//!   [`IDENTITY_OVERLAP_UNTIL`] says when the old one is dropped.
//! * Deleting the hub Secret revokes the zone: [`decide`] then says [`Decision::Revoked`]
//!   instead of issuing a new identity, until a rotation is requested.
//!
//! Everything here but [`issue`] (which draws a fresh key) is pure.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use base64::Engine as _;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kontinuum_crds::labels::{IDENTITY_OVERLAP_UNTIL, REGION, ZONE};
use serde_json::{Value, json};

/// The type of the hub Secrets that hold zone certificates (what the etcd proxy trusts).
pub const SECRET_TYPE: &str = "kontinuum.sh/zone-identity";
/// The key of the certificate bundle, in the hub Secret and the downstream one.
pub const CERT_KEY: &str = "tls.crt";
/// The key of the private key, in the downstream Secret only.
pub const KEY_KEY: &str = "tls.key";

/// The name of a zone's hub identity Secret: `<zone name>-identity`.
pub fn secret_name(zone_name: &str) -> String {
    format!("{zone_name}-identity")
}

/// A PKCS#8 PEM private key. Its `Debug` never shows the key.
#[derive(Clone, PartialEq, Eq)]
pub struct KeyPem(String);

impl KeyPem {
    /// The PEM text, to hand to the footprint (and nowhere else).
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for KeyPem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("KeyPem(<redacted>)")
    }
}

/// One identity: a certificate and its private key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    /// The certificate, PEM.
    pub cert_pem: String,
    /// The certificate, DER.
    pub cert_der: Vec<u8>,
    /// The private key.
    pub key: KeyPem,
}

impl Identity {
    /// SHA-256 (lowercase hex) of the certificate's DER.
    pub fn thumbprint(&self) -> String {
        thumbprint(&self.cert_der)
    }
}

/// Why an identity could not be issued or read.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    /// rcgen failed to generate the key or certificate.
    #[error("generating the zone's identity")]
    Generate(#[source] rcgen::Error),
}

impl IdentityError {
    /// Stable CamelCase reason.
    pub fn reason(&self) -> &'static str {
        "IdentityIssueFailed"
    }
}

/// Issues a new identity for `zone_name`: a fresh ed25519 key in a self-signed certificate
/// whose common name is the zone's name.
pub fn issue(zone_name: &str) -> Result<Identity, IdentityError> {
    let key =
        rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).map_err(IdentityError::Generate)?;
    let mut params = rcgen::CertificateParams::default();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, zone_name);
    let cert = params.self_signed(&key).map_err(IdentityError::Generate)?;
    Ok(Identity {
        cert_pem: cert.pem(),
        cert_der: cert.der().to_vec(),
        key: KeyPem(key.serialize_pem()),
    })
}

/// SHA-256 (lowercase hex) of `der`.
pub fn thumbprint(der: &[u8]) -> String {
    kontinuum_crds::names::sha256_hex(der)
}

/// The DER of every `CERTIFICATE` block of a PEM bundle, in order; anything else is skipped.
pub fn certificates(pem: &[u8]) -> Vec<Vec<u8>> {
    x509_parser::pem::Pem::iter_from_buffer(pem)
        .filter_map(Result::ok)
        .filter(|p| p.label == "CERTIFICATE")
        .map(|p| p.contents)
        .collect()
}

/// A PEM bundle of `ders`, one `CERTIFICATE` block each.
pub fn bundle_pem(ders: &[Vec<u8>]) -> String {
    let mut out = String::new();
    for der in ders {
        let text = base64::engine::general_purpose::STANDARD.encode(der);
        out.push_str("-----BEGIN CERTIFICATE-----\n");
        let mut rest = text.as_str();
        while !rest.is_empty() {
            let (line, tail) = rest.split_at(rest.len().min(64));
            out.push_str(line);
            out.push('\n');
            rest = tail;
        }
        out.push_str("-----END CERTIFICATE-----\n");
    }
    out
}

/// Reads an identity back from the downstream Secret's `tls.crt` and `tls.key`: `None`
/// unless the certificate is an ed25519 certificate and the key is its private key (a
/// Secret that does not hold together is treated as missing, and a new identity issued).
pub fn from_downstream(cert_pem: &str, key_pem: &str) -> Option<Identity> {
    let der = certificates(cert_pem.as_bytes()).into_iter().next()?;
    let (_, cert) = x509_parser::parse_x509_certificate(&der).ok()?;
    if cert.public_key().algorithm.algorithm != x509_parser::oid_registry::OID_SIG_ED25519 {
        return None;
    }
    let key = rcgen::KeyPair::from_pem(key_pem).ok()?;
    if key.public_key_raw() != cert.public_key().subject_public_key.data.as_ref() {
        return None;
    }
    Some(Identity {
        cert_pem: bundle_pem(std::slice::from_ref(&der)),
        cert_der: der,
        key: KeyPem(key_pem.to_owned()),
    })
}

/// Why a new identity is issued.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IssueReason {
    /// The zone never had one.
    First,
    /// A rotation was requested (`kontinuum.sh/rotate-identity`).
    Rotation,
    /// A rotation was requested after a revocation: the zone is admitted again.
    Readmission,
    /// The zone cluster lost its key (its Secret is gone or broken) while the hub still
    /// trusts the zone: a new key, trusted alone (the old key is lost, nothing to overlap).
    LostKey,
}

/// What to do about the identity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// The hub Secret was deleted: the zone is revoked. Nothing is issued or installed.
    Revoked,
    /// Issue a new identity.
    Issue(IssueReason),
    /// Keep the zone cluster's identity.
    Keep,
}

/// What [`decide`] decides from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(
    clippy::struct_excessive_bools,
    reason = "four independent observations"
)]
pub struct Facts {
    /// The hub Secret exists.
    pub hub_secret: bool,
    /// The zone cluster holds a valid identity.
    pub downstream: bool,
    /// The Zone's status records a thumbprint: an identity was issued before.
    pub recorded: bool,
    /// A rotation is requested and not handled yet.
    pub rotation_requested: bool,
}

/// Pure: what to do about the identity.
pub fn decide(facts: Facts) -> Decision {
    let Facts {
        hub_secret,
        downstream,
        recorded,
        rotation_requested,
    } = facts;
    if rotation_requested {
        return Decision::Issue(if recorded && !hub_secret {
            IssueReason::Readmission
        } else {
            IssueReason::Rotation
        });
    }
    if recorded && !hub_secret {
        return Decision::Revoked;
    }
    if !downstream {
        return Decision::Issue(if recorded {
            IssueReason::LostKey
        } else {
            IssueReason::First
        });
    }
    Decision::Keep
}

/// Whether a rotation is requested: the annotation is set and differs from the value last
/// handled.
pub fn rotation_requested(annotation: Option<&str>, handled: Option<&str>) -> bool {
    annotation.is_some_and(|a| !a.is_empty() && Some(a) != handled)
}

/// The certificates the hub trusts for a zone, and until when an older one stays.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HubTrust {
    /// The DER certificates, the current one first.
    pub certificates: Vec<Vec<u8>>,
    /// When the older certificate is dropped; `None` when only the current one is trusted.
    pub overlap_until: Option<Timestamp>,
}

/// Pure: the hub's trust after a decision. `current` is the identity in use from now on;
/// `previous` the zone cluster's identity it replaces (a rotation); `hub` what the hub
/// Secret holds now, with its overlap annotation.
///
/// * A rotation from a known previous identity trusts both until `now + overlap`.
/// * Otherwise the current certificate is trusted, plus the hub's other certificates only
///   while an earlier overlap window is still open.
pub fn hub_trust(
    current: &[u8],
    previous: Option<&[u8]>,
    hub: &HubTrust,
    now: Timestamp,
    overlap: Duration,
) -> HubTrust {
    if let Some(previous) = previous.filter(|p| *p != current) {
        let until = SignedDuration::try_from(overlap)
            .ok()
            .and_then(|d| now.checked_add(d).ok());
        return HubTrust {
            certificates: vec![current.to_vec(), previous.to_vec()],
            overlap_until: until,
        };
    }
    let open = hub.overlap_until.filter(|until| *until > now);
    let mut certificates = vec![current.to_vec()];
    if open.is_some() {
        certificates.extend(
            hub.certificates
                .iter()
                .filter(|c| c.as_slice() != current)
                .take(1)
                .cloned(),
        );
    }
    let overlap_until = if certificates.len() > 1 { open } else { None };
    HubTrust {
        certificates,
        overlap_until,
    }
}

/// Reads the hub Secret's trust: its certificates and overlap annotation.
pub fn read_hub(secret: &k8s_openapi::api::core::v1::Secret) -> HubTrust {
    let certificates = secret
        .data
        .as_ref()
        .and_then(|d| d.get(CERT_KEY))
        .map(|b| certificates(&b.0))
        .unwrap_or_default();
    let overlap_until = secret
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(IDENTITY_OVERLAP_UNTIL))
        .and_then(|t| t.parse::<Timestamp>().ok());
    HubTrust {
        certificates,
        overlap_until,
    }
}

/// Pure: the hub identity Secret for server-side apply: type [`SECRET_TYPE`], labelled
/// region and zone, `tls.crt` only, controller-owned by the Zone (`owner`, an
/// ownerReference), with the overlap annotation while two certificates are trusted.
pub fn hub_secret(
    zone_name: &str,
    namespace: &str,
    region: &str,
    zone: &str,
    owner: &Value,
    trust: &HubTrust,
) -> Value {
    let pem = bundle_pem(&trust.certificates);
    let mut metadata = json!({
        "name": secret_name(zone_name),
        "namespace": namespace,
        "labels": { REGION: region, ZONE: zone },
        "ownerReferences": [owner],
    });
    if let Some(until) = trust.overlap_until {
        let annotations: BTreeMap<&str, String> =
            BTreeMap::from([(IDENTITY_OVERLAP_UNTIL, until.to_string())]);
        metadata["annotations"] = json!(annotations);
    }
    json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": metadata,
        "type": SECRET_TYPE,
        "data": { CERT_KEY: base64::engine::general_purpose::STANDARD.encode(pem) },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(seconds).unwrap()
    }

    #[test]
    fn issues_an_ed25519_self_signed_certificate_named_after_the_zone() {
        let id = issue("eu-west-1a").unwrap();
        let (_, cert) = x509_parser::parse_x509_certificate(&id.cert_der).unwrap();
        assert_eq!(
            cert.public_key().algorithm.algorithm,
            x509_parser::oid_registry::OID_SIG_ED25519
        );
        let cn = cert.subject().iter_common_name().next().unwrap();
        assert_eq!(cn.as_str().unwrap(), "eu-west-1a");
        assert_eq!(cert.subject(), cert.issuer(), "self-signed");
        assert!(
            id.key.expose().starts_with("-----BEGIN PRIVATE KEY-----"),
            "PKCS#8"
        );
        assert_eq!(format!("{:?}", id.key), "KeyPem(<redacted>)");
        assert!(!format!("{id:?}").contains("PRIVATE KEY"));
        assert_eq!(id.thumbprint().len(), 64);
        assert_ne!(issue("eu-west-1a").unwrap().thumbprint(), id.thumbprint());
    }

    #[test]
    fn reads_back_a_matching_pair_only() {
        let a = issue("z").unwrap();
        let b = issue("z").unwrap();
        let back = from_downstream(&a.cert_pem, a.key.expose()).unwrap();
        assert_eq!(back.cert_der, a.cert_der);
        assert_eq!(back.thumbprint(), a.thumbprint());
        assert!(
            from_downstream(&a.cert_pem, b.key.expose()).is_none(),
            "mismatched key"
        );
        assert!(from_downstream("garbage", a.key.expose()).is_none());
        assert!(from_downstream(&a.cert_pem, "garbage").is_none());
    }

    #[test]
    fn bundles_round_trip() {
        let a = issue("z").unwrap();
        let b = issue("z").unwrap();
        let pem = bundle_pem(&[a.cert_der.clone(), b.cert_der.clone()]);
        assert_eq!(certificates(pem.as_bytes()), vec![a.cert_der, b.cert_der]);
        assert!(pem.lines().all(|l| l.len() <= 64));
    }

    #[test]
    fn decisions() {
        use Decision::{Issue, Keep, Revoked};
        use IssueReason::{First, LostKey, Readmission, Rotation};
        // (hub secret, downstream, recorded, rotation requested) -> decision
        let table = [
            ((false, false, false, false), Issue(First)),
            ((true, false, false, false), Issue(First)),
            ((true, true, true, false), Keep),
            ((true, true, false, false), Keep),
            ((false, true, true, false), Revoked),
            ((false, false, true, false), Revoked),
            ((true, false, true, false), Issue(LostKey)),
            ((true, true, true, true), Issue(Rotation)),
            ((false, false, false, true), Issue(Rotation)),
            ((false, true, true, true), Issue(Readmission)),
        ];
        for ((hub_secret, downstream, recorded, rotation_requested), expected) in table {
            let facts = Facts {
                hub_secret,
                downstream,
                recorded,
                rotation_requested,
            };
            assert_eq!(decide(facts), expected, "{facts:?}");
        }
    }

    #[test]
    fn rotation_is_requested_by_a_new_annotation_value_only() {
        assert!(!rotation_requested(None, None));
        assert!(!rotation_requested(Some(""), None));
        assert!(rotation_requested(Some("1"), None));
        assert!(!rotation_requested(Some("1"), Some("1")));
        assert!(rotation_requested(Some("2"), Some("1")));
    }

    #[test]
    fn rotation_overlaps_then_drops_the_old_certificate() {
        let overlap = Duration::from_secs(600);
        let none = HubTrust {
            certificates: vec![b"old".to_vec()],
            overlap_until: None,
        };
        let rotated = hub_trust(b"new", Some(b"old"), &none, at(1000), overlap);
        assert_eq!(rotated.certificates, vec![b"new".to_vec(), b"old".to_vec()]);
        assert_eq!(rotated.overlap_until, Some(at(1600)));
        // Within the window: both kept, same deadline (idempotent).
        assert_eq!(
            hub_trust(b"new", None, &rotated, at(1599), overlap),
            rotated
        );
        // After it: the old one is dropped.
        let after = hub_trust(b"new", None, &rotated, at(1600), overlap);
        assert_eq!(after.certificates, vec![b"new".to_vec()]);
        assert_eq!(after.overlap_until, None);
        // A first issue, or a tampered bundle, trusts the current certificate alone.
        let tampered = HubTrust {
            certificates: vec![b"other".to_vec()],
            overlap_until: None,
        };
        let fixed = hub_trust(b"new", None, &tampered, at(1000), overlap);
        assert_eq!(fixed.certificates, vec![b"new".to_vec()]);
        // Rotating to the same certificate is no rotation.
        assert_eq!(
            hub_trust(b"new", Some(b"new"), &none, at(1000), overlap).certificates,
            vec![b"new".to_vec()]
        );
    }

    #[test]
    fn the_hub_secret_holds_certificates_only() {
        let id = issue("eu-west-1a").unwrap();
        let owner = json!({"apiVersion": "kontinuum.sh/v1alpha2", "kind": "Zone", "name": "eu-west-1a", "uid": "u", "controller": true});
        let trust = HubTrust {
            certificates: vec![id.cert_der.clone()],
            overlap_until: None,
        };
        let secret = hub_secret("eu-west-1a", "ns", "eu", "west-1a", &owner, &trust);
        assert_eq!(secret["type"], SECRET_TYPE);
        assert_eq!(secret["metadata"]["name"], "eu-west-1a-identity");
        assert_eq!(secret["metadata"]["labels"][REGION], "eu");
        assert_eq!(secret["metadata"]["labels"][ZONE], "west-1a");
        assert_eq!(secret["metadata"]["ownerReferences"][0], owner);
        assert!(secret["metadata"].get("annotations").is_none());
        let data = secret["data"].as_object().unwrap();
        assert_eq!(data.len(), 1, "tls.crt only: {data:?}");
        let pem = base64::engine::general_purpose::STANDARD
            .decode(data[CERT_KEY].as_str().unwrap())
            .unwrap();
        assert!(!String::from_utf8_lossy(&pem).contains("PRIVATE"));
        assert_eq!(certificates(&pem), vec![id.cert_der]);
        let overlapping = HubTrust {
            certificates: trust.certificates.clone(),
            overlap_until: Some(at(1600)),
        };
        let secret = hub_secret("eu-west-1a", "ns", "eu", "west-1a", &owner, &overlapping);
        assert_eq!(
            secret["metadata"]["annotations"][IDENTITY_OVERLAP_UNTIL],
            at(1600).to_string()
        );
    }
}
