//! Keys and certificates for the cert-manager stand-in: key generation in the algorithms a
//! Certificate may ask for, issuance (self-signed or signed by a CA key pair), and reading
//! back what a certificate says (names, validity) so that issuance is only repeated when the
//! stored certificate no longer matches its Certificate.

use std::net::IpAddr;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType, SerialNumber, SignatureAlgorithm,
};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// Errors of key and certificate handling. Messages never contain key material.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    /// A private key could not be generated.
    #[error("generating a {0} private key")]
    Generate(&'static str),
    /// The PEM text holds no private key in a format we read (PKCS#8, PKCS#1 RSA, SEC1 P-256).
    #[error("no usable private key in the PEM data")]
    InvalidKey,
    /// The PEM text holds no certificate, or it does not parse.
    #[error("no usable certificate in the PEM data")]
    InvalidCertificate,
    /// The private key does not belong to the certificate.
    #[error("the private key does not match the certificate")]
    KeyMismatch,
    /// The certificate could not be built or signed.
    #[error("signing the certificate")]
    Sign(#[source] rcgen::Error),
    /// A requested name is not valid in a certificate.
    #[error("invalid subject alternative name {0:?}")]
    InvalidName(String),
    /// A validity time is out of range.
    #[error("validity time out of range")]
    Time,
}

/// The private key algorithms of cert-manager's `spec.privateKey` that the stand-in honours.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyAlgorithm {
    /// RSA with the given modulus size in bits (cert-manager's default: 2048).
    Rsa(usize),
    /// ECDSA on P-256.
    EcdsaP256,
    /// ECDSA on P-384.
    EcdsaP384,
    /// Ed25519.
    Ed25519,
}

impl KeyAlgorithm {
    /// From `spec.privateKey.algorithm` and `size`, with cert-manager's defaults (RSA 2048;
    /// ECDSA 256). `None` for a combination cert-manager would refuse.
    pub fn from_spec(algorithm: Option<&str>, size: Option<i64>) -> Option<Self> {
        match (algorithm.unwrap_or("RSA"), size) {
            ("RSA", None | Some(0)) => Some(Self::Rsa(2048)),
            ("RSA", Some(bits @ (2048 | 3072 | 4096 | 8192))) => {
                usize::try_from(bits).ok().map(Self::Rsa)
            }
            ("ECDSA", None | Some(0 | 256)) => Some(Self::EcdsaP256),
            ("ECDSA", Some(384)) => Some(Self::EcdsaP384),
            ("Ed25519", _) => Some(Self::Ed25519),
            _ => None,
        }
    }

    fn signature_algorithm(self) -> &'static SignatureAlgorithm {
        match self {
            Self::Rsa(_) => &rcgen::PKCS_RSA_SHA256,
            Self::EcdsaP256 => &rcgen::PKCS_ECDSA_P256_SHA256,
            Self::EcdsaP384 => &rcgen::PKCS_ECDSA_P384_SHA384,
            Self::Ed25519 => &rcgen::PKCS_ED25519,
        }
    }
}

/// Generates a fresh private key. RSA keys take a moment: call it off the async runtime.
pub fn generate_key(algorithm: KeyAlgorithm) -> Result<KeyPair, PkiError> {
    match algorithm {
        KeyAlgorithm::Rsa(bits) => {
            use rsa::pkcs8::EncodePrivateKey as _;
            let key = rsa::RsaPrivateKey::new(&mut rand_core::OsRng, bits)
                .map_err(|_| PkiError::Generate("RSA"))?;
            let der = key.to_pkcs8_der().map_err(|_| PkiError::Generate("RSA"))?;
            KeyPair::from_pkcs8_der_and_sign_algo(
                &PrivatePkcs8KeyDer::from(der.as_bytes()),
                algorithm.signature_algorithm(),
            )
            .map_err(|_| PkiError::Generate("RSA"))
        }
        other => KeyPair::generate_for(other.signature_algorithm())
            .map_err(|_| PkiError::Generate("ECDSA/Ed25519")),
    }
}

/// Reads a private key from PEM: PKCS#8 (`PRIVATE KEY`), PKCS#1 (`RSA PRIVATE KEY`) or SEC1
/// on P-256 (`EC PRIVATE KEY`), the encodings cert-manager writes.
pub fn load_key(pem: &[u8]) -> Result<KeyPair, PkiError> {
    let der = PrivateKeyDer::from_pem_slice(pem).map_err(|_| PkiError::InvalidKey)?;
    let pkcs8: Vec<u8> = match der {
        PrivateKeyDer::Pkcs8(key) => key.secret_pkcs8_der().to_vec(),
        PrivateKeyDer::Pkcs1(key) => {
            use rsa::pkcs1::DecodeRsaPrivateKey as _;
            use rsa::pkcs8::EncodePrivateKey as _;
            let key = rsa::RsaPrivateKey::from_pkcs1_der(key.secret_pkcs1_der())
                .map_err(|_| PkiError::InvalidKey)?;
            key.to_pkcs8_der()
                .map_err(|_| PkiError::InvalidKey)?
                .as_bytes()
                .to_vec()
        }
        PrivateKeyDer::Sec1(key) => {
            use p256::pkcs8::EncodePrivateKey as _;
            let key = p256::SecretKey::from_sec1_der(key.secret_sec1_der())
                .map_err(|_| PkiError::InvalidKey)?;
            key.to_pkcs8_der()
                .map_err(|_| PkiError::InvalidKey)?
                .as_bytes()
                .to_vec()
        }
        _ => return Err(PkiError::InvalidKey),
    };
    let der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(pkcs8));
    KeyPair::try_from(&der).map_err(|_| PkiError::InvalidKey)
}

/// The first certificate of a PEM bundle, as DER.
pub fn first_certificate(pem: &[u8]) -> Result<CertificateDer<'static>, PkiError> {
    CertificateDer::pem_slice_iter(pem)
        .next()
        .and_then(Result::ok)
        .ok_or(PkiError::InvalidCertificate)
}

/// A CA that signs certificates: its certificate (PEM) and private key.
pub struct CaKeyPair {
    cert_pem: String,
    key: KeyPair,
}

impl std::fmt::Debug for CaKeyPair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the key.
        f.debug_struct("CaKeyPair").finish_non_exhaustive()
    }
}

impl CaKeyPair {
    /// Reads a CA from PEM (`tls.crt` / `tls.key` of a CA issuer's Secret), checking that the
    /// key belongs to the certificate, as cert-manager's CA issuer does before it is Ready.
    pub fn from_pem(cert_pem: &[u8], key_pem: &[u8]) -> Result<Self, PkiError> {
        let key = load_key(key_pem)?;
        let der = first_certificate(cert_pem)?;
        let (_, cert) =
            x509_parser::parse_x509_certificate(&der).map_err(|_| PkiError::InvalidCertificate)?;
        if cert.public_key().raw != rcgen::PublicKeyData::subject_public_key_info(&key) {
            return Err(PkiError::KeyMismatch);
        }
        let cert_pem =
            String::from_utf8(cert_pem.to_vec()).map_err(|_| PkiError::InvalidCertificate)?;
        Ok(Self { cert_pem, key })
    }

    /// The CA certificate (PEM), for `ca.crt`.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }
}

/// What to put in a certificate (from a Certificate's spec).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CertificateRequest {
    /// Subject common name.
    pub common_name: Option<String>,
    /// DNS subject alternative names.
    pub dns_names: Vec<String>,
    /// IP subject alternative names.
    pub ip_addresses: Vec<IpAddr>,
    /// URI subject alternative names.
    pub uris: Vec<String>,
    /// Whether the certificate is a CA (may sign others).
    pub is_ca: bool,
    /// Start of validity, Unix seconds.
    pub not_before: i64,
    /// End of validity, Unix seconds.
    pub not_after: i64,
}

/// Who signs a certificate.
pub enum Signer<'a> {
    /// The certificate's own key (a self-signed certificate, cert-manager's `selfSigned`).
    SelfSigned,
    /// A CA key pair (cert-manager's `ca`, and the stand-in's test CA for `acme`).
    Ca(&'a CaKeyPair),
}

/// An issued certificate: PEM texts for `tls.crt`, `tls.key` and `ca.crt`.
pub struct Issued {
    /// The certificate (PEM).
    pub cert_pem: String,
    /// The private key (PKCS#8 PEM). Never log it.
    pub key_pem: String,
    /// The certificate of the signer (PEM): the CA, or the certificate itself when
    /// self-signed.
    pub ca_pem: String,
}

/// Issues a certificate for `request` with a fresh key of `algorithm`, signed by `signer`.
pub fn issue(
    request: &CertificateRequest,
    algorithm: KeyAlgorithm,
    signer: &Signer<'_>,
) -> Result<Issued, PkiError> {
    let key = generate_key(algorithm)?;
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    if let Some(cn) = request.common_name.as_deref().filter(|cn| !cn.is_empty()) {
        dn.push(DnType::CommonName, cn);
    }
    params.distinguished_name = dn;
    for name in &request.dns_names {
        let san = name
            .clone()
            .try_into()
            .map_err(|_| PkiError::InvalidName(name.clone()))?;
        params.subject_alt_names.push(SanType::DnsName(san));
    }
    for ip in &request.ip_addresses {
        params.subject_alt_names.push(SanType::IpAddress(*ip));
    }
    for uri in &request.uris {
        let san = uri
            .clone()
            .try_into()
            .map_err(|_| PkiError::InvalidName(uri.clone()))?;
        params.subject_alt_names.push(SanType::URI(san));
    }
    params.not_before = time::OffsetDateTime::from_unix_timestamp(request.not_before)
        .map_err(|_| PkiError::Time)?;
    params.not_after =
        time::OffsetDateTime::from_unix_timestamp(request.not_after).map_err(|_| PkiError::Time)?;
    params.serial_number = Some(random_serial());
    // cert-manager's default usages: digital signature and key encipherment; server auth
    // and client auth are what clients check.
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    if request.is_ca {
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages.push(KeyUsagePurpose::KeyCertSign);
        params.key_usages.push(KeyUsagePurpose::CrlSign);
    } else {
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
    }
    let (cert_pem, ca_pem) = match signer {
        Signer::SelfSigned => {
            let cert = params.self_signed(&key).map_err(PkiError::Sign)?;
            let pem = cert.pem();
            (pem.clone(), pem)
        }
        Signer::Ca(ca) => {
            params.use_authority_key_identifier_extension = true;
            let issuer = Issuer::from_ca_cert_pem(&ca.cert_pem, &ca.key).map_err(PkiError::Sign)?;
            let cert = params.signed_by(&key, &issuer).map_err(PkiError::Sign)?;
            (cert.pem(), ca.cert_pem.clone())
        }
    };
    Ok(Issued {
        cert_pem,
        key_pem: key.serialize_pem(),
        ca_pem,
    })
}

fn random_serial() -> SerialNumber {
    use rand_core::RngCore as _;
    let mut bytes = [0u8; 16];
    rand_core::OsRng.fill_bytes(&mut bytes);
    // A positive INTEGER: clear the top bit.
    bytes[0] &= 0x7f;
    SerialNumber::from_slice(&bytes)
}

/// What a stored certificate says, to decide whether it still matches its Certificate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertificateInfo {
    /// Subject common name.
    pub common_name: Option<String>,
    /// DNS names, sorted.
    pub dns_names: Vec<String>,
    /// IP addresses, sorted.
    pub ip_addresses: Vec<IpAddr>,
    /// URIs, sorted.
    pub uris: Vec<String>,
    /// Whether it is a CA.
    pub is_ca: bool,
    /// Start of validity, Unix seconds.
    pub not_before: i64,
    /// End of validity, Unix seconds.
    pub not_after: i64,
}

/// Reads the first certificate of a PEM bundle.
pub fn inspect(cert_pem: &[u8]) -> Result<CertificateInfo, PkiError> {
    inspect_der(&first_certificate(cert_pem)?)
}

/// Reads a DER certificate.
pub fn inspect_der(der: &[u8]) -> Result<CertificateInfo, PkiError> {
    use x509_parser::extensions::GeneralName;
    let (_, cert) =
        x509_parser::parse_x509_certificate(der).map_err(|_| PkiError::InvalidCertificate)?;
    let common_name = cert
        .subject()
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .map(str::to_owned);
    let mut dns_names = Vec::new();
    let mut ip_addresses = Vec::new();
    let mut uris = Vec::new();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for name in &san.value.general_names {
            match name {
                GeneralName::DNSName(dns) => dns_names.push((*dns).to_owned()),
                GeneralName::URI(uri) => uris.push((*uri).to_owned()),
                GeneralName::IPAddress(bytes) => match bytes.len() {
                    4 => {
                        let octets: [u8; 4] = [bytes[0], bytes[1], bytes[2], bytes[3]];
                        ip_addresses.push(IpAddr::from(octets));
                    }
                    16 => {
                        let mut octets = [0u8; 16];
                        octets.copy_from_slice(bytes);
                        ip_addresses.push(IpAddr::from(octets));
                    }
                    _ => {}
                },
                _ => {}
            }
        }
    }
    dns_names.sort();
    ip_addresses.sort();
    uris.sort();
    Ok(CertificateInfo {
        common_name,
        dns_names,
        ip_addresses,
        uris,
        is_ca: cert.is_ca(),
        not_before: cert.validity().not_before.timestamp(),
        not_after: cert.validity().not_after.timestamp(),
    })
}

/// Whether the private key (PEM) belongs to the certificate (PEM).
pub fn key_matches(cert_pem: &[u8], key_pem: &[u8]) -> bool {
    let Ok(key) = load_key(key_pem) else {
        return false;
    };
    let Ok(der) = first_certificate(cert_pem) else {
        return false;
    };
    x509_parser::parse_x509_certificate(&der).is_ok_and(|(_, cert)| {
        cert.public_key().raw == rcgen::PublicKeyData::subject_public_key_info(&key)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_800_000_000;

    fn request(names: &[&str]) -> CertificateRequest {
        CertificateRequest {
            common_name: names.first().map(|n| (*n).to_owned()),
            dns_names: names.iter().map(|n| (*n).to_owned()).collect(),
            not_before: NOW,
            not_after: NOW + 3600,
            ..CertificateRequest::default()
        }
    }

    #[test]
    fn self_signed_certificates_carry_the_names_and_validity() {
        let issued = issue(
            &request(&["b.example.com", "a.example.com"]),
            KeyAlgorithm::EcdsaP256,
            &Signer::SelfSigned,
        )
        .unwrap();
        let info = inspect(issued.cert_pem.as_bytes()).unwrap();
        assert_eq!(info.dns_names, ["a.example.com", "b.example.com"]);
        assert_eq!(info.common_name.as_deref(), Some("b.example.com"));
        assert_eq!((info.not_before, info.not_after), (NOW, NOW + 3600));
        assert!(!info.is_ca);
        assert_eq!(issued.ca_pem, issued.cert_pem);
        assert!(key_matches(
            issued.cert_pem.as_bytes(),
            issued.key_pem.as_bytes()
        ));
    }

    #[test]
    fn a_ca_signs_leaf_certificates_that_verify_against_it() {
        let mut ca_request = request(&["ca"]);
        ca_request.is_ca = true;
        let ca = issue(&ca_request, KeyAlgorithm::EcdsaP256, &Signer::SelfSigned).unwrap();
        assert!(inspect(ca.cert_pem.as_bytes()).unwrap().is_ca);
        let ca = CaKeyPair::from_pem(ca.cert_pem.as_bytes(), ca.key_pem.as_bytes()).unwrap();
        let leaf = issue(
            &request(&["zone.example.com"]),
            KeyAlgorithm::Ed25519,
            &Signer::Ca(&ca),
        )
        .unwrap();
        assert_eq!(leaf.ca_pem, ca.cert_pem());
        let leaf_der = first_certificate(leaf.cert_pem.as_bytes()).unwrap();
        let ca_der = first_certificate(ca.cert_pem().as_bytes()).unwrap();
        let (_, leaf) = x509_parser::parse_x509_certificate(&leaf_der).unwrap();
        let (_, ca) = x509_parser::parse_x509_certificate(&ca_der).unwrap();
        leaf.verify_signature(Some(ca.public_key())).unwrap();
        assert_eq!(leaf.issuer(), ca.subject());
    }

    #[test]
    fn rsa_keys_are_generated_and_read_back_in_every_encoding() {
        use rsa::pkcs1::EncodeRsaPrivateKey as _;
        use rsa::pkcs8::DecodePrivateKey as _;
        let issued = issue(
            &request(&["rsa.example.com"]),
            KeyAlgorithm::Rsa(2048),
            &Signer::SelfSigned,
        )
        .unwrap();
        assert!(issued.key_pem.contains("BEGIN PRIVATE KEY"));
        // PKCS#1, as cert-manager writes RSA keys by default.
        let rsa = rsa::RsaPrivateKey::from_pkcs8_pem(&issued.key_pem).unwrap();
        let pkcs1 = rsa.to_pkcs1_pem(rsa::pkcs8::LineEnding::LF).unwrap();
        assert!(key_matches(issued.cert_pem.as_bytes(), pkcs1.as_bytes()));
        assert!(CaKeyPair::from_pem(issued.cert_pem.as_bytes(), pkcs1.as_bytes()).is_ok());
    }

    #[test]
    fn sec1_keys_are_read() {
        use p256::pkcs8::DecodePrivateKey as _;
        let issued = issue(
            &request(&["ec.example.com"]),
            KeyAlgorithm::EcdsaP256,
            &Signer::SelfSigned,
        )
        .unwrap();
        let key = p256::SecretKey::from_pkcs8_pem(&issued.key_pem).unwrap();
        let sec1 = key.to_sec1_pem(p256::pkcs8::LineEnding::LF).unwrap();
        assert!(key_matches(issued.cert_pem.as_bytes(), sec1.as_bytes()));
    }

    #[test]
    fn a_key_of_another_certificate_is_refused() {
        let a = issue(
            &request(&["a"]),
            KeyAlgorithm::EcdsaP256,
            &Signer::SelfSigned,
        )
        .unwrap();
        let b = issue(
            &request(&["b"]),
            KeyAlgorithm::EcdsaP256,
            &Signer::SelfSigned,
        )
        .unwrap();
        assert!(matches!(
            CaKeyPair::from_pem(a.cert_pem.as_bytes(), b.key_pem.as_bytes()),
            Err(PkiError::KeyMismatch)
        ));
        assert!(matches!(
            CaKeyPair::from_pem(b"junk", b.key_pem.as_bytes()),
            Err(PkiError::InvalidCertificate)
        ));
        assert!(matches!(load_key(b"junk"), Err(PkiError::InvalidKey)));
    }

    #[test]
    fn key_algorithms_follow_cert_manager_defaults() {
        assert_eq!(
            KeyAlgorithm::from_spec(None, None),
            Some(KeyAlgorithm::Rsa(2048))
        );
        assert_eq!(
            KeyAlgorithm::from_spec(Some("ECDSA"), None),
            Some(KeyAlgorithm::EcdsaP256)
        );
        assert_eq!(
            KeyAlgorithm::from_spec(Some("ECDSA"), Some(384)),
            Some(KeyAlgorithm::EcdsaP384)
        );
        assert_eq!(KeyAlgorithm::from_spec(Some("RSA"), Some(1024)), None);
        assert_eq!(KeyAlgorithm::from_spec(Some("DSA"), None), None);
    }
}
