//! Zone identities as the hub keeps them: a Secret `<region>-<zone>-identity` of type
//! [`SECRET_TYPE`], labelled [`REGION_LABEL`] and [`ZONE_LABEL`], whose `tls.crt` is a PEM
//! bundle of the zone's self-signed ed25519 certificates (two during a rotation's overlap).
//!
//! [`ZoneIdentity::from_secret`] is pure. A Secret that does not hold together (wrong name for
//! its labels, a label that is empty or holds `/`, no ed25519 certificate) trusts nothing.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt as _;
use x509_parser::oid_registry::OID_SIG_ED25519;

use crate::authz::Scope;
use crate::token::TrustedKey;

/// The type of the hub Secrets that hold zone certificates.
pub const SECRET_TYPE: &str = "kontinuum.sh/zone-identity";
/// The region label of an identity Secret.
pub const REGION_LABEL: &str = "kontinuum.sh/region";
/// The zone label of an identity Secret.
pub const ZONE_LABEL: &str = "kontinuum.sh/zone";
/// The key holding the certificate bundle.
pub const CERT_KEY: &str = "tls.crt";
/// At most this many certificates of a bundle are considered.
const MAX_CERTS: usize = 4;

/// Why a Secret trusts nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum IdentityError {
    /// Not of type [`SECRET_TYPE`].
    #[error("secret is not of type kontinuum.sh/zone-identity")]
    WrongType,
    /// A label is missing, empty or holds a `/`.
    #[error("secret lacks valid kontinuum.sh/region and kontinuum.sh/zone labels")]
    Labels,
    /// The name is not `<region>-<zone>-identity`.
    #[error("secret name does not match its region and zone labels")]
    Name,
    /// `tls.crt` holds no ed25519 certificate.
    #[error("tls.crt holds no ed25519 certificate")]
    NoCertificate,
}

impl IdentityError {
    /// Stable CamelCase, for logs.
    pub fn reason(self) -> &'static str {
        match self {
            Self::WrongType => "WrongType",
            Self::Labels => "InvalidLabels",
            Self::Name => "NameMismatch",
            Self::NoCertificate => "NoCertificate",
        }
    }
}

/// One zone's trust: its name, the keys it signs with and the keys it may touch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ZoneIdentity {
    /// `<region>-<zone>`, the tokens' `sub`.
    pub name: String,
    /// Where the zone may read and write.
    pub scope: Scope,
    /// The public keys of its certificates.
    pub keys: Vec<TrustedKey>,
}

impl ZoneIdentity {
    /// Reads an identity Secret.
    pub fn from_secret(secret: &Secret) -> Result<Self, IdentityError> {
        if secret.type_.as_deref() != Some(SECRET_TYPE) {
            return Err(IdentityError::WrongType);
        }
        let labels = secret.labels();
        let region = labels.get(REGION_LABEL).ok_or(IdentityError::Labels)?;
        let zone = labels.get(ZONE_LABEL).ok_or(IdentityError::Labels)?;
        let scope = Scope::new(region, zone).map_err(|_| IdentityError::Labels)?;
        let name = format!("{region}-{zone}");
        if secret.name_any() != format!("{name}-identity") {
            return Err(IdentityError::Name);
        }
        let bundle = secret
            .data
            .as_ref()
            .and_then(|d| d.get(CERT_KEY))
            .map(|b| b.0.as_slice())
            .unwrap_or_default();
        let keys = trusted_keys(bundle);
        if keys.is_empty() {
            return Err(IdentityError::NoCertificate);
        }
        Ok(Self { name, scope, keys })
    }
}

/// The ed25519 keys of every parsable certificate in a PEM bundle (others are skipped).
pub fn trusted_keys(pem: &[u8]) -> Vec<TrustedKey> {
    pem_blocks(pem, "CERTIFICATE")
        .iter()
        .take(MAX_CERTS)
        .filter_map(|der| certificate_key(der))
        .collect()
}

fn certificate_key(der: &[u8]) -> Option<TrustedKey> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let spki = cert.public_key();
    if spki.algorithm.algorithm != OID_SIG_ED25519 {
        return None;
    }
    let key: [u8; 32] = spki.subject_public_key.data.as_ref().try_into().ok()?;
    let validity = cert.validity();
    Some(TrustedKey {
        key,
        not_before: validity.not_before.timestamp(),
        not_after: validity.not_after.timestamp(),
    })
}

/// The DER contents of every PEM block labelled `label` in `pem`; unparsable input yields
/// what was found before it.
pub fn pem_blocks(pem: &[u8], label: &str) -> Vec<Vec<u8>> {
    x509_parser::pem::Pem::iter_from_buffer(pem)
        .map_while(Result::ok)
        .filter(|block| block.label == label)
        .map(|block| block.contents)
        .collect()
}

/// The labels an identity Secret carries for a zone (used by tests and the zone-installer's
/// contract).
pub fn labels(region: &str, zone: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (REGION_LABEL.to_string(), region.to_string()),
        (ZONE_LABEL.to_string(), zone.to_string()),
    ])
}

#[cfg(test)]
mod tests {
    use k8s_openapi::ByteString;
    use kube::api::ObjectMeta;

    use super::*;

    fn cert_pem() -> (String, [u8; 32]) {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
        let cert = rcgen::CertificateParams::new(vec!["eu-1a".into()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let raw: [u8; 32] = key.public_key_raw().try_into().unwrap();
        (cert.pem(), raw)
    }

    fn secret(name: &str, region: &str, zone: &str, crt: &str) -> Secret {
        Secret {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some(labels(region, zone)),
                ..Default::default()
            },
            type_: Some(SECRET_TYPE.into()),
            data: Some(BTreeMap::from([(
                CERT_KEY.to_string(),
                ByteString(crt.as_bytes().to_vec()),
            )])),
            ..Default::default()
        }
    }

    #[test]
    fn a_well_formed_secret_trusts_its_certificates() {
        let (a, key_a) = cert_pem();
        let (b, key_b) = cert_pem();
        let id =
            ZoneIdentity::from_secret(&secret("eu-1a-identity", "eu", "1a", &(a + &b))).unwrap();
        assert_eq!(id.name, "eu-1a");
        assert_eq!(id.scope.prefix(), b"/kontinuum.sh/zones/eu/1a/");
        assert_eq!(
            id.keys.iter().map(|k| k.key).collect::<Vec<_>>(),
            [key_a, key_b]
        );
        assert!(id.keys[0].not_after > id.keys[0].not_before);
    }

    #[test]
    fn inconsistent_secrets_trust_nothing() {
        let (pem, _) = cert_pem();
        let mut wrong_type = secret("eu-1a-identity", "eu", "1a", &pem);
        wrong_type.type_ = Some("Opaque".into());
        let cases = [
            (wrong_type, IdentityError::WrongType),
            (
                secret("eu-1b-identity", "eu", "1a", &pem),
                IdentityError::Name,
            ),
            // The labels decide the prefix; a name that does not match them trusts nothing.
            (
                secret("eu-1a-identity", "eu-1", "a", &pem),
                IdentityError::Name,
            ),
            (
                secret("eu--identity", "eu", "", &pem),
                IdentityError::Labels,
            ),
            (
                secret("eu-1a/x-identity", "eu", "1a/x", &pem),
                IdentityError::Labels,
            ),
            (
                secret("eu-1a-identity", "eu", "1a", "not pem"),
                IdentityError::NoCertificate,
            ),
        ];
        for (s, want) in cases {
            assert_eq!(ZoneIdentity::from_secret(&s), Err(want), "{:?}", s.metadata);
        }
    }

    #[test]
    fn non_ed25519_certificates_are_skipped() {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let ec = rcgen::CertificateParams::new(vec!["x".into()])
            .unwrap()
            .self_signed(&key)
            .unwrap()
            .pem();
        assert!(trusted_keys(ec.as_bytes()).is_empty());
        let (ed, raw) = cert_pem();
        let keys = trusted_keys((ec + &ed).as_bytes());
        assert_eq!(keys.len(), 1);
        assert_eq!(keys[0].key, raw);
    }
}
