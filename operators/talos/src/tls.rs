//! TLS for the two Talos connection modes, and the server-certificate fingerprints.
//!
//! * Maintenance: the server certificate comes from an ephemeral in-memory CA, so it cannot
//!   be verified. [`MaintenanceVerifier`] accepts any end-entity certificate but still checks
//!   the handshake signature (Ed25519 included), so the peer provably holds the key of the
//!   certificate it presented, and that certificate is what we fingerprint.
//! * Maintenance, pinned: the same, but the certificate's public key must hash to the
//!   identity recorded at discovery (or pinned by the user). The check runs inside the
//!   handshake, so a machine with another key gets no byte of our request (a control plane's
//!   config carries every cluster CA key).
//! * Configured: mTLS with a [`ClientIdentity`]; the server is verified against its CA.
//!
//! Both offer ALPN `h2`, which Talos (grpc-go >= 1.67) requires, and use only the ring
//! provider.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use kontinuum_crds::names::sha256_hex;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms, ring};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};

use crate::error::IdentityError;

/// The client identity for configured mode: the talosconfig's CA, certificate and key, as
/// PEM text. The key may use Talos' non-standard `ED25519 PRIVATE KEY` label. `Debug` never
/// shows the key.
#[derive(Clone)]
pub struct ClientIdentity {
    ca: String,
    crt: String,
    key: String,
}

impl ClientIdentity {
    /// An identity from the CA bundle (one or more certificates), the client certificate
    /// (chain) and its private key, all PEM.
    pub fn new(
        ca_pem: impl Into<String>,
        crt_pem: impl Into<String>,
        key_pem: impl Into<String>,
    ) -> Self {
        Self {
            ca: ca_pem.into(),
            crt: crt_pem.into(),
            key: key_pem.into(),
        }
    }
}

impl fmt::Debug for ClientIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientIdentity")
            .field("ca", &format_args!("<{} bytes>", self.ca.len()))
            .field("crt", &format_args!("<{} bytes>", self.crt.len()))
            .field("key", &"<redacted>")
            .finish()
    }
}

/// Fingerprints of the certificate a server presented, lowercase hex SHA-256.
///
/// Talos re-issues its maintenance certificate every 12 hours, from a CA created at boot, so
/// `certificate_sha256` changes with every re-issue and every reboot. `public_key_sha256`
/// (the SPKI, which talosctl `--cert-fingerprint` pins) changes only when the key does; Talos
/// may generate a fresh key on re-issue, so neither is a lifelong machine identity.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerCertificate {
    /// SHA-256 of the DER certificate (what `openssl x509 -fingerprint -sha256` shows).
    pub certificate_sha256: String,
    /// SHA-256 of the DER SubjectPublicKeyInfo; `None` if the certificate does not parse.
    pub public_key_sha256: Option<String>,
    /// The subject common name; `maintenance-service.talos.dev` in maintenance mode.
    pub common_name: Option<String>,
}

impl PeerCertificate {
    /// Fingerprints of a DER certificate.
    pub fn from_der(der: &[u8]) -> Self {
        let parsed = x509_parser::parse_x509_certificate(der)
            .ok()
            .map(|(_, cert)| cert);
        Self {
            certificate_sha256: sha256_hex(der),
            public_key_sha256: parsed.as_ref().map(|c| sha256_hex(c.public_key().raw)),
            common_name: parsed.as_ref().and_then(|c| {
                c.subject()
                    .iter_common_name()
                    .next()
                    .and_then(|cn| cn.as_str().ok())
                    .map(str::to_owned)
            }),
        }
    }
}

/// Rewrites Talos' non-standard `ED25519 PRIVATE KEY` PEM label to `PRIVATE KEY`; the body
/// (PKCS#8) is unchanged.
pub fn normalize_key_pem(pem: &str) -> Cow<'_, str> {
    if pem.contains("ED25519 PRIVATE KEY-----") {
        Cow::Owned(
            pem.replace(
                "-----BEGIN ED25519 PRIVATE KEY-----",
                "-----BEGIN PRIVATE KEY-----",
            )
            .replace(
                "-----END ED25519 PRIVATE KEY-----",
                "-----END PRIVATE KEY-----",
            ),
        )
    } else {
        Cow::Borrowed(pem)
    }
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(ring::default_provider())
}

fn builder() -> Result<rustls::ConfigBuilder<ClientConfig, rustls::WantsVerifier>, rustls::Error> {
    ClientConfig::builder_with_provider(provider()).with_safe_default_protocol_versions()
}

fn with_alpn(mut config: ClientConfig) -> Arc<ClientConfig> {
    config.alpn_protocols = vec![b"h2".to_vec()];
    Arc::new(config)
}

/// Maintenance mode: no server verification beyond the handshake signature, no client cert.
/// With `pin`, the server's public key must hash (SHA-256 of the SubjectPublicKeyInfo,
/// lowercase hex) to it; a mismatch fails the handshake and is recorded in `pin`.
pub(crate) fn maintenance_config(
    pin: Option<Arc<IdentityPin>>,
) -> Result<Arc<ClientConfig>, rustls::Error> {
    let verifier = MaintenanceVerifier {
        algorithms: provider().signature_verification_algorithms,
        pin,
    };
    Ok(with_alpn(
        builder()?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(verifier))
            .with_no_client_auth(),
    ))
}

/// The identity a maintenance connection must meet, and what the server presented when it
/// did not.
#[derive(Debug)]
pub(crate) struct IdentityPin {
    expected: String,
    presented: std::sync::Mutex<Option<String>>,
}

impl IdentityPin {
    pub(crate) fn new(expected: &str) -> Self {
        Self {
            expected: expected.trim().to_ascii_lowercase(),
            presented: std::sync::Mutex::new(None),
        }
    }

    pub(crate) fn expected(&self) -> &str {
        &self.expected
    }

    /// The identity a refused server presented (`"unparsable"` for a certificate without a
    /// readable public key), if any handshake was refused.
    pub(crate) fn mismatch(&self) -> Option<String> {
        self.presented
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    fn check(&self, end_entity: &[u8]) -> Result<(), rustls::Error> {
        let presented = PeerCertificate::from_der(end_entity).public_key_sha256;
        if presented.as_deref() == Some(self.expected.as_str()) {
            return Ok(());
        }
        let presented = presented.unwrap_or_else(|| "unparsable".to_owned());
        *self
            .presented
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(presented);
        Err(rustls::Error::InvalidCertificate(
            rustls::CertificateError::ApplicationVerificationFailure,
        ))
    }
}

/// Configured mode: server verified against the identity's CA, our certificate presented.
pub(crate) fn configured_config(
    identity: &ClientIdentity,
) -> Result<Arc<ClientConfig>, IdentityError> {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(identity.ca.as_bytes()) {
        roots
            .add(cert.map_err(IdentityError::Pem)?)
            .map_err(IdentityError::InvalidCaCertificate)?;
    }
    if roots.is_empty() {
        return Err(IdentityError::NoCaCertificate);
    }
    let chain = CertificateDer::pem_slice_iter(identity.crt.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(IdentityError::Pem)?;
    if chain.is_empty() {
        return Err(IdentityError::NoClientCertificate);
    }
    // The key's parse error is dropped on purpose: it must not echo key material.
    let key = PrivateKeyDer::from_pem_slice(normalize_key_pem(&identity.key).as_bytes())
        .map_err(|_| IdentityError::InvalidPrivateKey)?;
    let config = builder()
        .map_err(IdentityError::Rejected)?
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .map_err(IdentityError::Rejected)?;
    Ok(with_alpn(config))
}

/// Accepts any server certificate (or, pinned, only one whose public key matches), and
/// still verifies the handshake signature with it.
#[derive(Debug)]
struct MaintenanceVerifier {
    algorithms: WebPkiSupportedAlgorithms,
    pin: Option<Arc<IdentityPin>>,
}

impl ServerCertVerifier for MaintenanceVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if let Some(pin) = &self.pin {
            pin.check(end_entity)?;
        }
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY_BODY: &str = "MC4CAQAwBQYDK2VwBCIEIF1hZjgYJbyFuU9dZ4Lrz2d+sqqDrDEUbVeTnNnpcUfs";

    #[test]
    fn ed25519_label_is_rewritten_and_parses() {
        let talos = format!(
            "-----BEGIN ED25519 PRIVATE KEY-----\n{KEY_BODY}\n-----END ED25519 PRIVATE KEY-----\n"
        );
        let fixed = normalize_key_pem(&talos);
        assert_eq!(
            fixed,
            format!("-----BEGIN PRIVATE KEY-----\n{KEY_BODY}\n-----END PRIVATE KEY-----\n")
        );
        assert!(matches!(
            PrivateKeyDer::from_pem_slice(fixed.as_bytes()),
            Ok(PrivateKeyDer::Pkcs8(_))
        ));
        // Without the rewrite the standard parser finds nothing.
        assert!(PrivateKeyDer::from_pem_slice(talos.as_bytes()).is_err());
        // Standard labels pass through untouched.
        assert!(matches!(normalize_key_pem(&fixed), Cow::Borrowed(_)));
    }

    #[test]
    fn fingerprints_of_a_known_certificate() {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
        let mut params = rcgen::CertificateParams::new(vec!["127.0.0.1".into()]).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "maintenance-service.talos.dev");
        let cert = params.self_signed(&key).unwrap();
        let fp = PeerCertificate::from_der(cert.der());
        assert_eq!(fp.certificate_sha256, sha256_hex(cert.der()));
        assert_eq!(fp.certificate_sha256.len(), 64);
        assert!(
            fp.certificate_sha256
                .chars()
                .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
        );
        assert_eq!(
            fp.public_key_sha256,
            Some(sha256_hex(&rcgen::PublicKeyData::subject_public_key_info(
                &key
            )))
        );
        assert_eq!(
            fp.common_name.as_deref(),
            Some("maintenance-service.talos.dev")
        );
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn pin_accepts_only_the_recorded_public_key() {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
        let other = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
        let cert = |k: &rcgen::KeyPair| {
            rcgen::CertificateParams::new(vec!["127.0.0.1".into()])
                .unwrap()
                .self_signed(k)
                .unwrap()
        };
        let ours = cert(&key);
        let identity = PeerCertificate::from_der(ours.der())
            .public_key_sha256
            .unwrap();
        // Upper case and stray spaces in a user's pin still match.
        let pin = IdentityPin::new(&format!(" {} ", identity.to_ascii_uppercase()));
        assert!(pin.check(ours.der()).is_ok());
        // A re-issued certificate over the same key still matches (Talos re-issues).
        assert!(pin.check(cert(&key).der()).is_ok());
        assert_eq!(pin.mismatch(), None);
        let theirs = cert(&other);
        assert!(matches!(
            pin.check(theirs.der()),
            Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::ApplicationVerificationFailure
            ))
        ));
        assert_eq!(
            pin.mismatch(),
            PeerCertificate::from_der(theirs.der()).public_key_sha256
        );
        assert!(pin.check(b"not a certificate").is_err());
        assert_eq!(pin.mismatch().as_deref(), Some("unparsable"));
    }

    #[test]
    fn identity_debug_hides_the_key() {
        let id = ClientIdentity::new("ca", "crt", "SECRET KEY");
        assert!(!format!("{id:?}").contains("SECRET"));
    }

    #[test]
    fn bad_identities_are_typed() {
        let err = configured_config(&ClientIdentity::new("", "", "")).unwrap_err();
        assert!(matches!(err, IdentityError::NoCaCertificate), "{err:?}");
    }
}
