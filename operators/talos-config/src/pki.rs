//! Key generation, PEM encodings and certificate building, in the formats Talos writes.
//!
//! Every key is drawn from the caller's RNG (so bundle generation is a pure function of
//! `(rng, now)`); rcgen and ring only sign. Encodings match Go's `crypto/x509` output:
//!
//! * Ed25519: PKCS#8 v1 (seed only), PEM label `ED25519 PRIVATE KEY` (Talos' own label);
//! * ECDSA P-256: SEC1 `ECPrivateKey` *with* the named-curve parameters (Go's
//!   `x509.ParseECPrivateKey` refuses a SEC1 key without them), label `EC PRIVATE KEY`;
//! * RSA: PKCS#1, label `RSA PRIVATE KEY`.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use rand_core::CryptoRngCore;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyIdMethod, KeyPair, KeyUsagePurpose, PKCS_ECDSA_P256_SHA256, PKCS_ED25519, SerialNumber,
};
use rsa::pkcs1::EncodeRsaPrivateKey as _;
use zeroize::Zeroizing;

use crate::secrets::{SecretsError, Sensitive};

/// PEM label Talos (siderolabs/crypto) writes around an Ed25519 PKCS#8 key.
pub const ED25519_PEM_LABEL: &str = "ED25519 PRIVATE KEY";
/// PEM label of a SEC1 EC private key.
pub const EC_PEM_LABEL: &str = "EC PRIVATE KEY";
/// PEM label of a PKCS#1 RSA private key.
pub const RSA_PEM_LABEL: &str = "RSA PRIVATE KEY";
/// PEM label of a standard PKCS#8 private key.
pub const PKCS8_PEM_LABEL: &str = "PRIVATE KEY";

/// Validity of the CAs in a secrets bundle: 87 600 h (10 years), as Talos.
pub(crate) const CA_VALIDITY: time::Duration = time::Duration::hours(87_600);

/// DER prefix of a PKCS#8 v1 Ed25519 key (RFC 8410), followed by the 32-byte seed.
const ED25519_PKCS8_PREFIX: [u8; 16] = [
    0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20,
];

/// A key type used in a Talos PKI.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeyKind {
    Ed25519,
    P256,
}

/// Encodes DER as PEM with 64-column lines and LF line endings (Go's `pem.Encode`).
pub(crate) fn pem_encode(label: &str, der: &[u8]) -> String {
    let body = STANDARD.encode(der);
    let mut out = String::with_capacity(body.len() + body.len() / 64 + 2 * label.len() + 40);
    out.push_str("-----BEGIN ");
    out.push_str(label);
    out.push_str("-----\n");
    for chunk in body.as_bytes().chunks(64) {
        // base64 output is ASCII, so every chunk is valid UTF-8.
        out.push_str(std::str::from_utf8(chunk).unwrap_or_default());
        out.push('\n');
    }
    out.push_str("-----END ");
    out.push_str(label);
    out.push_str("-----\n");
    out
}

/// Decodes the first PEM block of `pem`: its label and DER body.
pub(crate) fn pem_decode(pem: &str) -> Option<(String, Zeroizing<Vec<u8>>)> {
    let (_, block) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).ok()?;
    Some((block.label, Zeroizing::new(block.contents)))
}

/// A freshly generated private key: its PKCS#8 DER (for signing) and its PEM as Talos writes it.
pub(crate) struct GeneratedKey {
    pub(crate) key_pair: KeyPair,
    pub(crate) talos_pem: Sensitive,
}

/// Generates an Ed25519 key from 32 random bytes of `rng`.
pub(crate) fn generate_ed25519(rng: &mut dyn CryptoRngCore) -> Result<GeneratedKey, SecretsError> {
    let mut seed = Zeroizing::new([0_u8; 32]);
    rng.fill_bytes(seed.as_mut());
    let mut der = Zeroizing::new(Vec::with_capacity(48));
    der.extend_from_slice(&ED25519_PKCS8_PREFIX);
    der.extend_from_slice(seed.as_ref());
    let key_pair = pkcs8_key_pair(&der, &PKCS_ED25519)?;
    Ok(GeneratedKey {
        talos_pem: Sensitive::new(pem_encode(ED25519_PEM_LABEL, &der)),
        key_pair,
    })
}

/// Generates an ECDSA P-256 key from `rng`.
pub(crate) fn generate_p256(rng: &mut dyn CryptoRngCore) -> Result<GeneratedKey, SecretsError> {
    let secret = p256::SecretKey::random(&mut &mut *rng);
    let sec1 = sec1_der(&secret);
    let key_pair = p256_key_pair(&secret)?;
    Ok(GeneratedKey {
        talos_pem: Sensitive::new(pem_encode(EC_PEM_LABEL, &sec1)),
        key_pair,
    })
}

/// Generates an RSA key of `bits` from `rng` and returns its PKCS#1 PEM.
pub(crate) fn generate_rsa(
    rng: &mut dyn CryptoRngCore,
    bits: usize,
) -> Result<Sensitive, SecretsError> {
    let key = rsa::RsaPrivateKey::new(rng, bits).map_err(|source| SecretsError::Rsa { source })?;
    let pem = key
        .to_pkcs1_pem(rsa::pkcs8::LineEnding::LF)
        .map_err(|_| SecretsError::Encode {
            what: "rsa private key",
        })?;
    Ok(Sensitive::new(pem.as_str()))
}

/// SEC1 `ECPrivateKey` DER with the P-256 named-curve parameters and the public key, laid out
/// exactly as Go's `x509.MarshalECPrivateKey` (121 bytes).
fn sec1_der(secret: &p256::SecretKey) -> Zeroizing<Vec<u8>> {
    use p256::elliptic_curve::sec1::ToEncodedPoint as _;
    // SEQUENCE(119) { INTEGER 1, OCTET STRING(32) d, [0] { OID prime256v1 }, [1] { BIT STRING(66) 0x00 || Q } }
    const HEAD: [u8; 7] = [0x30, 0x77, 0x02, 0x01, 0x01, 0x04, 0x20];
    const CURVE: [u8; 12] = [
        0xa0, 0x0a, 0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07,
    ];
    const POINT_HEAD: [u8; 5] = [0xa1, 0x44, 0x03, 0x42, 0x00];
    let point = secret.public_key().to_encoded_point(false);
    let mut der = Zeroizing::new(Vec::with_capacity(121));
    der.extend_from_slice(&HEAD);
    der.extend_from_slice(secret.to_bytes().as_slice());
    der.extend_from_slice(&CURVE);
    der.extend_from_slice(&POINT_HEAD);
    der.extend_from_slice(point.as_bytes());
    der
}

fn p256_key_pair(secret: &p256::SecretKey) -> Result<KeyPair, SecretsError> {
    use p256::pkcs8::EncodePrivateKey as _;
    let pkcs8 = secret.to_pkcs8_der().map_err(|_| SecretsError::Encode {
        what: "p-256 private key",
    })?;
    pkcs8_key_pair(pkcs8.as_bytes(), &PKCS_ECDSA_P256_SHA256)
}

/// Loads PKCS#8 DER as an rcgen key pair and checks it is of the expected algorithm.
fn pkcs8_key_pair(
    der: &[u8],
    alg: &'static rcgen::SignatureAlgorithm,
) -> Result<KeyPair, SecretsError> {
    match KeyPair::try_from(der) {
        Ok(pair) if pair.algorithm() == alg => Ok(pair),
        _ => Err(SecretsError::InvalidKey {
            what: "private key of an unexpected type",
        }),
    }
}

/// Converts a private key PEM as Talos writes it (`ED25519 PRIVATE KEY`, `EC PRIVATE KEY`)
/// or a standard `PRIVATE KEY` (PKCS#8) into PKCS#8 DER, the form rustls and rcgen load.
///
/// RSA keys are not converted (Talos only uses RSA for the service-account key, which
/// nothing here signs with).
pub fn private_key_pkcs8_der(pem: &str) -> Result<Zeroizing<Vec<u8>>, SecretsError> {
    let (label, der) = pem_decode(pem).ok_or(SecretsError::InvalidPem {
        what: "private key",
    })?;
    match label.as_str() {
        ED25519_PEM_LABEL | PKCS8_PEM_LABEL => Ok(der),
        EC_PEM_LABEL => {
            use p256::pkcs8::EncodePrivateKey as _;
            let secret =
                p256::SecretKey::from_sec1_der(&der).map_err(|_| SecretsError::InvalidKey {
                    what: "ec private key",
                })?;
            let doc = secret.to_pkcs8_der().map_err(|_| SecretsError::Encode {
                what: "p-256 private key",
            })?;
            Ok(Zeroizing::new(doc.as_bytes().to_vec()))
        }
        _ => Err(SecretsError::InvalidKey {
            what: "private key of an unsupported type",
        }),
    }
}

/// Rewrites an `ED25519 PRIVATE KEY` PEM to the standard `PRIVATE KEY` label (same body),
/// which rustls-pemfile, OpenSSL and Python accept. Other keys are returned as they are.
pub fn standard_private_key_pem(pem: &str) -> Result<Sensitive, SecretsError> {
    let (label, der) = pem_decode(pem).ok_or(SecretsError::InvalidPem {
        what: "private key",
    })?;
    if label == ED25519_PEM_LABEL {
        Ok(Sensitive::new(pem_encode(PKCS8_PEM_LABEL, &der)))
    } else {
        Ok(Sensitive::new(pem))
    }
}

/// Loads a Talos private key PEM (Ed25519 or P-256) as an rcgen key pair, for signing.
pub(crate) fn load_key_pair(pem: &str) -> Result<(KeyPair, KeyKind), SecretsError> {
    let der = private_key_pkcs8_der(pem)?;
    if let Ok(pair) = pkcs8_key_pair(&der, &PKCS_ED25519) {
        return Ok((pair, KeyKind::Ed25519));
    }
    pkcs8_key_pair(&der, &PKCS_ECDSA_P256_SHA256)
        .map(|pair| (pair, KeyKind::P256))
        .map_err(|_| SecretsError::InvalidKey {
            what: "private key (expected ed25519 or p-256)",
        })
}

/// A positive, minimally encoded 128-bit serial number from `rng`.
pub(crate) fn random_serial(rng: &mut dyn CryptoRngCore) -> SerialNumber {
    let mut bytes = [0_u8; 16];
    rng.fill_bytes(&mut bytes);
    // Clear the sign bit and set the next one: positive, and no leading zero octet.
    bytes[0] = (bytes[0] & 0x3f) | 0x40;
    SerialNumber::from_slice(&bytes)
}

/// Converts a jiff timestamp to the `time` type rcgen uses (second precision, as X.509).
pub(crate) fn to_offset_date_time(
    now: jiff::Timestamp,
) -> Result<time::OffsetDateTime, SecretsError> {
    time::OffsetDateTime::from_unix_timestamp(now.as_second())
        .map_err(|_| SecretsError::InvalidTime)
}

/// How a CA names itself.
pub(crate) enum CaSubject {
    Organization(&'static str),
    CommonName(&'static str),
}

/// Builds the parameters of a self-signed Talos CA valid from `now` for [`CA_VALIDITY`]:
/// KeyUsage CertSign + DigitalSignature, EKU serverAuth + clientAuth, a random
/// SubjectKeyId and serial (siderolabs/crypto `NewSelfSignedCertificateAuthority`).
pub(crate) fn ca_params(
    subject: &CaSubject,
    now: time::OffsetDateTime,
    rng: &mut dyn CryptoRngCore,
) -> CertificateParams {
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    match subject {
        CaSubject::Organization(o) => dn.push(DnType::OrganizationName, *o),
        CaSubject::CommonName(cn) => dn.push(DnType::CommonName, *cn),
    }
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    params.not_before = now;
    params.not_after = now + CA_VALIDITY;
    params.serial_number = Some(random_serial(rng));
    let mut ski = vec![0_u8; 20];
    rng.fill_bytes(&mut ski);
    params.key_identifier_method = KeyIdMethod::PreSpecified(ski);
    params
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand_chacha::ChaCha20Rng;
    use rand_core::SeedableRng as _;

    #[test]
    fn sec1_layout_round_trips_through_p256() {
        let mut rng = ChaCha20Rng::seed_from_u64(7);
        let secret = p256::SecretKey::random(&mut rng);
        let der = sec1_der(&secret);
        assert_eq!(der.len(), 121);
        let back = p256::SecretKey::from_sec1_der(&der).unwrap();
        assert_eq!(back.to_bytes(), secret.to_bytes());
        // The named curve is present (Go requires it): OID 1.2.840.10045.3.1.7.
        assert!(
            der.windows(10)
                .any(|w| w == [0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07])
        );
    }

    #[test]
    fn ed25519_pem_uses_talos_label_and_converts_to_standard() {
        let mut rng = ChaCha20Rng::seed_from_u64(8);
        let key = generate_ed25519(&mut rng).unwrap();
        let pem = key.talos_pem.expose();
        assert!(pem.starts_with("-----BEGIN ED25519 PRIVATE KEY-----\n"));
        assert!(pem.ends_with("-----END ED25519 PRIVATE KEY-----\n"));
        let standard = standard_private_key_pem(pem).unwrap();
        assert!(
            standard
                .expose()
                .starts_with("-----BEGIN PRIVATE KEY-----\n")
        );
        let (pair, kind) = load_key_pair(standard.expose()).unwrap();
        assert_eq!(kind, KeyKind::Ed25519);
        assert_eq!(pair.public_key_raw(), key.key_pair.public_key_raw());
    }

    #[test]
    fn p256_pem_loads_back() {
        let mut rng = ChaCha20Rng::seed_from_u64(9);
        let key = generate_p256(&mut rng).unwrap();
        assert!(
            key.talos_pem
                .expose()
                .starts_with("-----BEGIN EC PRIVATE KEY-----\n")
        );
        let (pair, kind) = load_key_pair(key.talos_pem.expose()).unwrap();
        assert_eq!(kind, KeyKind::P256);
        assert_eq!(pair.public_key_raw(), key.key_pair.public_key_raw());
    }

    #[test]
    fn pem_lines_are_64_columns() {
        let pem = pem_encode("TEST", &[0xab; 100]);
        let lines: Vec<&str> = pem.lines().collect();
        assert_eq!(lines[0], "-----BEGIN TEST-----");
        assert_eq!(lines[1].len(), 64);
        assert_eq!(lines.last().copied(), Some("-----END TEST-----"));
        let (label, der) = pem_decode(&pem).unwrap();
        assert_eq!(label, "TEST");
        assert_eq!(der.as_slice(), &[0xab; 100]);
    }

    #[test]
    fn rejects_unknown_or_broken_keys() {
        assert!(private_key_pkcs8_der("not a pem").is_err());
        let rsa_label = pem_encode(RSA_PEM_LABEL, &[1, 2, 3]);
        assert!(private_key_pkcs8_der(&rsa_label).is_err());
        let bad_p256 = pem_encode(EC_PEM_LABEL, &[1, 2, 3]);
        assert!(private_key_pkcs8_der(&bad_p256).is_err());
        let bad_ed25519 = pem_encode(ED25519_PEM_LABEL, &[1, 2, 3]);
        assert!(load_key_pair(&bad_ed25519).is_err());
    }
}
