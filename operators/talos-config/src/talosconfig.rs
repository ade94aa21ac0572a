//! The admin client identity and its talosconfig.
//!
//! A fresh Ed25519 key and a certificate signed by the OS CA with Subject `O=os:admin`
//! (no CN), KeyUsage DigitalSignature and EKU clientAuth only (apid rejects a client chain
//! whose leaf has any other EKU), valid for one year from `now` — as
//! `talosctl gen config` does. The certificate is regenerated on demand from the stored
//! bundle, so nothing but the bundle needs storing.

use std::collections::BTreeMap;
use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use rand_core::CryptoRngCore;
use rcgen::{
    CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, KeyUsagePurpose,
};
use serde::Serialize;

use crate::pki;
use crate::secrets::{SecretsBundle, SecretsError, Sensitive};

/// The role the bootstrapper's client certificate carries (in the Organization).
pub const ADMIN_ROLE: &str = "os:admin";

/// Validity of the admin certificate: 365 days (`TalosAPIDefaultCertificateValidityDuration`).
pub const ADMIN_CERT_VALIDITY: time::Duration = time::Duration::days(365);

/// A Talos API client identity as PEM text, for a Rust (rustls) client.
#[derive(Clone, PartialEq, Eq)]
pub struct AdminIdentity {
    /// The OS CA certificate (verifies the server; PEM `CERTIFICATE`).
    pub ca_pem: String,
    /// The admin client certificate (PEM `CERTIFICATE`).
    pub cert_pem: String,
    /// The client key as standard PKCS#8 (PEM `PRIVATE KEY`, which rustls loads; the
    /// talosconfig carries Talos' own `ED25519 PRIVATE KEY` label around the same body).
    pub key_pem: Sensitive,
}

impl fmt::Debug for AdminIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdminIdentity")
            .field("key_pem", &self.key_pem)
            .finish_non_exhaustive()
    }
}

/// A generated talosconfig and the identity in it.
#[derive(Clone, PartialEq, Eq)]
pub struct AdminTalosconfig {
    /// The talosconfig YAML (what `talosctl --talosconfig` reads). Secret.
    pub talosconfig: Sensitive,
    /// The same identity as PEM text.
    pub identity: AdminIdentity,
}

impl fmt::Debug for AdminTalosconfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdminTalosconfig").finish_non_exhaustive()
    }
}

#[derive(Serialize)]
struct Talosconfig<'a> {
    context: &'a str,
    contexts: BTreeMap<&'a str, Context<'a>>,
}

#[derive(Serialize)]
struct Context<'a> {
    endpoints: &'a [String],
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    nodes: &'a [String],
    ca: String,
    crt: String,
    key: String,
}

/// Generates the admin identity (signed by the bundle's OS CA, valid from `now` for a year)
/// and a talosconfig with one context named `context`.
pub fn admin_talosconfig(
    bundle: &SecretsBundle,
    context: &str,
    endpoints: &[String],
    nodes: &[String],
    now: jiff::Timestamp,
    rng: &mut dyn CryptoRngCore,
) -> Result<AdminTalosconfig, SecretsError> {
    if context.is_empty() {
        return Err(SecretsError::InvalidField {
            field: "context",
            problem: "empty",
        });
    }
    let now = pki::to_offset_date_time(now)?;
    let key = pki::generate_ed25519(rng)?;
    let issuer = bundle.os_ca().issuer()?;

    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, ADMIN_ROLE);
    params.distinguished_name = dn;
    params.is_ca = IsCa::NoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    params.not_before = now;
    params.not_after = now + ADMIN_CERT_VALIDITY;
    params.serial_number = Some(pki::random_serial(rng));
    params.use_authority_key_identifier_extension = true;
    let cert = params
        .signed_by(&key.key_pair, &issuer)
        .map_err(|source| SecretsError::Crypto {
            what: "signing the admin certificate",
            source,
        })?;
    let cert_pem = pki::pem_encode("CERTIFICATE", cert.der());
    let ca_pem = bundle.os_ca().cert_pem.clone();

    let b64 = |s: &str| STANDARD.encode(s.as_bytes());
    let document = Talosconfig {
        context,
        contexts: BTreeMap::from([(
            context,
            Context {
                endpoints,
                nodes,
                ca: b64(&ca_pem),
                crt: b64(&cert_pem),
                key: b64(key.talos_pem.expose()),
            },
        )]),
    };
    let yaml = crate::config::to_yaml(&document);
    for context in document.contexts.into_values() {
        let mut key = context.key;
        zeroize::Zeroize::zeroize(&mut key);
    }
    let yaml = yaml.map_err(|source| SecretsError::Render {
        what: "talosconfig",
        source,
    })?;
    Ok(AdminTalosconfig {
        talosconfig: Sensitive::new(yaml),
        identity: AdminIdentity {
            ca_pem,
            cert_pem,
            key_pem: pki::standard_private_key_pem(key.talos_pem.expose())?,
        },
    })
}
