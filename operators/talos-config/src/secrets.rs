//! The Talos secrets bundle: every CA, key and token a cluster's machine configs carry.
//!
//! Generated once per cluster and stored as JSON (Go field names, as machinery's
//! `secrets.Bundle`) in a Kubernetes Secret; never regenerated, never logged. Secret
//! material is held in [`Sensitive`], whose `Debug` is redacted and whose memory is zeroed
//! on drop.
//!
//! | secret | format |
//! | --- | --- |
//! | OS (Talos API) CA | Ed25519, O=`talos`, key PEM `ED25519 PRIVATE KEY` (PKCS#8) |
//! | Kubernetes CA | ECDSA P-256, O=`kubernetes`, key PEM `EC PRIVATE KEY` (SEC1) |
//! | aggregator (front-proxy) CA | ECDSA P-256, CN=`front-proxy` |
//! | etcd CA | ECDSA P-256, O=`etcd` |
//! | service-account key | RSA 4096, PEM `RSA PRIVATE KEY` (PKCS#1) |
//! | bootstrap and trustd tokens | `[a-z0-9]{6}.[a-z0-9]{16}`, rejection-sampled (no modulo bias) |
//! | secretbox secret, cluster secret | base64 (std) of 32 random bytes |
//! | cluster id | base64 URL (padded) of 32 random bytes |
//!
//! CAs are valid for 10 years from the `now` passed in; all randomness comes from the RNG
//! passed in.

use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE};
use rand_core::CryptoRngCore;
use serde::{Deserialize, Serialize};
use zeroize::Zeroizing;

use crate::pki::{self, CaSubject, KeyKind};
use crate::version::{TalosVersion, VersionError};

/// RSA size of the service-account key for the supported contracts (> 1.6).
pub const SERVICE_ACCOUNT_RSA_BITS: usize = 4096;

/// Smallest RSA size [`SecretsBundle::generate_with_rsa_bits`] accepts (tests only; see there).
const MIN_RSA_BITS: usize = 1024;

/// A secret string (PEM key, token, config with keys). `Debug` prints `[REDACTED]`; there
/// is no `Display`; the bytes are zeroed when dropped.
#[derive(Clone, PartialEq, Eq)]
pub struct Sensitive(Zeroizing<String>);

impl Sensitive {
    /// Wraps a secret.
    pub fn new(secret: impl Into<String>) -> Self {
        Self(Zeroizing::new(secret.into()))
    }

    /// The secret itself. Keep it out of logs, events and conditions.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Sensitive {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[REDACTED]")
    }
}

/// A CA certificate (public) and its private key (secret), both PEM.
#[derive(Clone, PartialEq, Eq)]
pub struct CertAndKey {
    /// PEM `CERTIFICATE`.
    pub cert_pem: String,
    /// PEM private key in the form Talos writes it.
    pub key_pem: Sensitive,
}

impl fmt::Debug for CertAndKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CertAndKey")
            .field("cert_pem", &"<certificate>")
            .field("key_pem", &self.key_pem)
            .finish()
    }
}

impl CertAndKey {
    /// An rcgen issuer for signing certificates with this CA (the emulator signs Kubernetes
    /// serving certificates; the talosconfig signs the admin certificate).
    pub fn issuer(&self) -> Result<rcgen::Issuer<'static, rcgen::KeyPair>, SecretsError> {
        let (key, _) = pki::load_key_pair(self.key_pem.expose())?;
        rcgen::Issuer::from_ca_cert_pem(&self.cert_pem, key).map_err(|source| {
            SecretsError::Crypto {
                what: "loading a ca certificate",
                source,
            }
        })
    }
}

/// Errors building, encoding or decoding secrets.
#[derive(Debug, thiserror::Error)]
pub enum SecretsError {
    /// The Talos version is not supported.
    #[error("unsupported talos version for a secrets bundle")]
    Version(#[from] VersionError),
    /// rcgen/ring refused an operation.
    #[error("{what} failed")]
    Crypto {
        /// What we were doing.
        what: &'static str,
        /// The cause.
        #[source]
        source: rcgen::Error,
    },
    /// RSA key generation failed.
    #[error("generating the service-account rsa key failed")]
    Rsa {
        /// The cause.
        #[source]
        source: rsa::Error,
    },
    /// A requested RSA size is out of range.
    #[error("rsa key size {bits} is out of range")]
    RsaKeySize {
        /// The requested size.
        bits: usize,
    },
    /// A key could not be encoded.
    #[error("encoding the {what} failed")]
    Encode {
        /// Which key.
        what: &'static str,
    },
    /// `now` cannot be represented as an X.509 time.
    #[error("timestamp out of range for a certificate")]
    InvalidTime,
    /// Something is not a PEM block.
    #[error("{what} is not valid pem")]
    InvalidPem {
        /// Which value.
        what: &'static str,
    },
    /// A key is malformed or of the wrong type.
    #[error("{what} is invalid")]
    InvalidKey {
        /// Which key.
        what: &'static str,
    },
    /// A certificate is malformed, of the wrong key type, or does not match its key.
    #[error("certificate {field} is invalid: {problem}")]
    InvalidCertificate {
        /// Which certificate (bundle field path).
        field: &'static str,
        /// What is wrong with it.
        problem: &'static str,
    },
    /// The JSON bundle is malformed.
    #[error("secrets bundle json is malformed")]
    Json(#[source] serde_json::Error),
    /// A bundle field is missing, empty or badly encoded.
    #[error("secrets bundle field {field} is {problem}")]
    InvalidField {
        /// The field (Go JSON path, e.g. `Certs.OS.Key`).
        field: &'static str,
        /// What is wrong with it.
        problem: &'static str,
    },
    /// Rendering YAML (talosconfig) failed.
    #[error("rendering {what} failed")]
    Render {
        /// What we were rendering.
        what: &'static str,
        /// The cause.
        #[source]
        source: serde_saphyr::ser::Error,
    },
}

impl SecretsError {
    /// Stable CamelCase reason, for conditions and metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Version(e) => e.reason(),
            Self::Crypto { .. } | Self::Rsa { .. } | Self::Encode { .. } => "CryptoFailed",
            Self::RsaKeySize { .. } => "InvalidKeySize",
            Self::InvalidTime => "InvalidTime",
            Self::InvalidPem { .. } | Self::InvalidKey { .. } => "InvalidKey",
            Self::InvalidCertificate { .. } => "InvalidCertificate",
            Self::Json(_) | Self::InvalidField { .. } => "InvalidSecretsBundle",
            Self::Render { .. } => "RenderFailed",
        }
    }
}

/// All the secrets of one Talos cluster.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretsBundle {
    cluster_id: String,
    cluster_secret: Sensitive,
    bootstrap_token: Sensitive,
    secretbox_encryption_secret: Sensitive,
    trustd_token: Sensitive,
    os_ca: CertAndKey,
    kubernetes_ca: CertAndKey,
    aggregator_ca: CertAndKey,
    etcd_ca: CertAndKey,
    service_account_key: Sensitive,
}

impl fmt::Debug for SecretsBundle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SecretsBundle")
            .field("cluster_id", &self.cluster_id)
            .finish_non_exhaustive()
    }
}

impl SecretsBundle {
    /// Generates a bundle for `version` (refused unless supported), with CAs valid from
    /// `now` for 10 years and a 4096-bit service-account key.
    pub fn generate(
        rng: &mut dyn CryptoRngCore,
        now: jiff::Timestamp,
        version: &TalosVersion,
    ) -> Result<Self, SecretsError> {
        Self::generate_with_rsa_bits(rng, now, version, SERVICE_ACCOUNT_RSA_BITS)
    }

    /// As [`SecretsBundle::generate`] with a chosen service-account RSA size (≥ 1024).
    ///
    /// Exists so that debug-build tests (here, in the emulator and end to end) stay fast:
    /// RSA-4096 generation takes many seconds without optimisation. Production code uses
    /// [`SecretsBundle::generate`]; Talos and the API server accept any RSA size.
    pub fn generate_with_rsa_bits(
        rng: &mut dyn CryptoRngCore,
        now: jiff::Timestamp,
        version: &TalosVersion,
        rsa_bits: usize,
    ) -> Result<Self, SecretsError> {
        version.contract()?;
        if !(MIN_RSA_BITS..=8192).contains(&rsa_bits) {
            return Err(SecretsError::RsaKeySize { bits: rsa_bits });
        }
        let now = pki::to_offset_date_time(now)?;
        let os_ca = new_ca(
            rng,
            now,
            KeyKind::Ed25519,
            &CaSubject::Organization("talos"),
        )?;
        let kubernetes_ca = new_ca(
            rng,
            now,
            KeyKind::P256,
            &CaSubject::Organization("kubernetes"),
        )?;
        let aggregator_ca = new_ca(
            rng,
            now,
            KeyKind::P256,
            &CaSubject::CommonName("front-proxy"),
        )?;
        let etcd_ca = new_ca(rng, now, KeyKind::P256, &CaSubject::Organization("etcd"))?;
        let service_account_key = pki::generate_rsa(rng, rsa_bits)?;
        Ok(Self {
            cluster_id: URL_SAFE.encode(random_bytes::<32>(rng).as_ref()),
            cluster_secret: Sensitive::new(STANDARD.encode(random_bytes::<32>(rng).as_ref())),
            bootstrap_token: generate_token(rng),
            secretbox_encryption_secret: Sensitive::new(
                STANDARD.encode(random_bytes::<32>(rng).as_ref()),
            ),
            trustd_token: generate_token(rng),
            os_ca,
            kubernetes_ca,
            aggregator_ca,
            etcd_ca,
            service_account_key,
        })
    }

    /// Cluster id (base64 URL of 32 bytes): `cluster.id`.
    pub fn cluster_id(&self) -> &str {
        &self.cluster_id
    }
    /// Cluster secret (base64 of 32 bytes): `cluster.secret`.
    pub fn cluster_secret(&self) -> &Sensitive {
        &self.cluster_secret
    }
    /// Kubernetes bootstrap token: `cluster.token`.
    pub fn bootstrap_token(&self) -> &Sensitive {
        &self.bootstrap_token
    }
    /// Secretbox encryption secret: `cluster.secretboxEncryptionSecret`.
    pub fn secretbox_encryption_secret(&self) -> &Sensitive {
        &self.secretbox_encryption_secret
    }
    /// trustd token: `machine.token`.
    pub fn trustd_token(&self) -> &Sensitive {
        &self.trustd_token
    }
    /// OS (Talos API) CA, Ed25519: `machine.ca`.
    pub fn os_ca(&self) -> &CertAndKey {
        &self.os_ca
    }
    /// Kubernetes CA, P-256: `cluster.ca`.
    pub fn kubernetes_ca(&self) -> &CertAndKey {
        &self.kubernetes_ca
    }
    /// Aggregator (front-proxy) CA, P-256: `cluster.aggregatorCA`.
    pub fn aggregator_ca(&self) -> &CertAndKey {
        &self.aggregator_ca
    }
    /// etcd CA, P-256: `cluster.etcd.ca`.
    pub fn etcd_ca(&self) -> &CertAndKey {
        &self.etcd_ca
    }
    /// Service-account key, RSA PKCS#1 PEM: `cluster.serviceAccount.key`.
    pub fn service_account_key(&self) -> &Sensitive {
        &self.service_account_key
    }

    /// The bundle as JSON in machinery's layout (Go field names; `Crt`/`Key` are base64 of
    /// PEM), for the `secrets-bundle` key of a Secret. The result is secret.
    pub fn to_json(&self) -> Result<Sensitive, SecretsError> {
        let b64 = |s: &str| STANDARD.encode(s.as_bytes());
        let pair = |ca: &CertAndKey| WireCertAndKey {
            crt: b64(&ca.cert_pem),
            key: b64(ca.key_pem.expose()),
        };
        let wire = WireBundle {
            cluster: WireCluster {
                id: self.cluster_id.clone(),
                secret: self.cluster_secret.expose().to_owned(),
            },
            secrets: WireSecrets {
                bootstrap_token: self.bootstrap_token.expose().to_owned(),
                aescbc_encryption_secret: None,
                secretbox_encryption_secret: Some(
                    self.secretbox_encryption_secret.expose().to_owned(),
                ),
            },
            trustd_info: WireTrustd {
                token: self.trustd_token.expose().to_owned(),
            },
            certs: WireCerts {
                etcd: pair(&self.etcd_ca),
                k8s: pair(&self.kubernetes_ca),
                k8s_aggregator: pair(&self.aggregator_ca),
                k8s_service_account: WireKey {
                    key: b64(self.service_account_key.expose()),
                },
                os: pair(&self.os_ca),
            },
        };
        let json = serde_json::to_string(&wire).map_err(SecretsError::Json);
        wire.zeroize();
        json.map(Sensitive::new)
    }

    /// Parses a bundle written by [`SecretsBundle::to_json`] (or by machinery), checking
    /// every field: tokens, encodings, certificate and key types, and that each CA key
    /// matches its certificate.
    pub fn from_json(json: &[u8]) -> Result<Self, SecretsError> {
        let wire: WireBundle = serde_json::from_slice(json).map_err(SecretsError::Json)?;
        let result = Self::from_wire(&wire);
        wire.zeroize();
        result
    }

    fn from_wire(wire: &WireBundle) -> Result<Self, SecretsError> {
        let cluster_id = non_empty("Cluster.Id", &wire.cluster.id)?;
        decode_b64("Cluster.Id", &URL_SAFE, cluster_id)?;
        let cluster_secret = non_empty("Cluster.Secret", &wire.cluster.secret)?;
        let secretbox = wire
            .secrets
            .secretbox_encryption_secret
            .as_deref()
            .unwrap_or_default();
        if wire
            .secrets
            .aescbc_encryption_secret
            .as_deref()
            .is_some_and(|s| !s.is_empty())
        {
            return Err(SecretsError::InvalidField {
                field: "Secrets.AESCBCEncryptionSecret",
                problem: "set (only secretbox encryption is supported)",
            });
        }
        let secretbox = non_empty("Secrets.SecretboxEncryptionSecret", secretbox)?;
        decode_b64("Secrets.SecretboxEncryptionSecret", &STANDARD, secretbox)?;
        let bootstrap_token = token("Secrets.BootstrapToken", &wire.secrets.bootstrap_token)?;
        let trustd_token = token("TrustdInfo.Token", &wire.trustd_info.token)?;
        let certs = &wire.certs;
        let sa_pem = pem_field(
            "Certs.K8sServiceAccount.Key",
            &certs.k8s_service_account.key,
        )?;
        match pki::pem_decode(sa_pem.expose()) {
            Some((label, _)) if label == pki::RSA_PEM_LABEL || label == pki::EC_PEM_LABEL => {}
            _ => {
                return Err(SecretsError::InvalidField {
                    field: "Certs.K8sServiceAccount.Key",
                    problem: "not an rsa or ec private key",
                });
            }
        }
        Ok(Self {
            cluster_id: cluster_id.to_owned(),
            cluster_secret: Sensitive::new(cluster_secret),
            bootstrap_token,
            secretbox_encryption_secret: Sensitive::new(secretbox),
            trustd_token,
            os_ca: ca_field(
                ["Certs.OS.Crt", "Certs.OS.Key"],
                &certs.os,
                KeyKind::Ed25519,
            )?,
            kubernetes_ca: ca_field(
                ["Certs.K8s.Crt", "Certs.K8s.Key"],
                &certs.k8s,
                KeyKind::P256,
            )?,
            aggregator_ca: ca_field(
                ["Certs.K8sAggregator.Crt", "Certs.K8sAggregator.Key"],
                &certs.k8s_aggregator,
                KeyKind::P256,
            )?,
            etcd_ca: ca_field(
                ["Certs.Etcd.Crt", "Certs.Etcd.Key"],
                &certs.etcd,
                KeyKind::P256,
            )?,
            service_account_key: sa_pem,
        })
    }
}

fn new_ca(
    rng: &mut dyn CryptoRngCore,
    now: time::OffsetDateTime,
    kind: KeyKind,
    subject: &CaSubject,
) -> Result<CertAndKey, SecretsError> {
    let key = match kind {
        KeyKind::Ed25519 => pki::generate_ed25519(rng)?,
        KeyKind::P256 => pki::generate_p256(rng)?,
    };
    let params = pki::ca_params(subject, now, rng);
    let cert = params
        .self_signed(&key.key_pair)
        .map_err(|source| SecretsError::Crypto {
            what: "self-signing a ca certificate",
            source,
        })?;
    Ok(CertAndKey {
        cert_pem: pki::pem_encode("CERTIFICATE", cert.der()),
        key_pem: key.talos_pem,
    })
}

fn random_bytes<const N: usize>(rng: &mut dyn CryptoRngCore) -> Zeroizing<[u8; N]> {
    let mut bytes = Zeroizing::new([0_u8; N]);
    rng.fill_bytes(bytes.as_mut());
    bytes
}

const TOKEN_ALPHABET: &[u8; 36] = b"0123456789abcdefghijklmnopqrstuvwxyz";

/// `n` characters of `[a-z0-9]`: bytes ≥ 252 (= 7 × 36) are rejected so every character
/// is equally likely, as kubeadm and Talos do.
fn token_part(rng: &mut dyn CryptoRngCore, n: usize, out: &mut String) {
    let mut buf = [0_u8; 32];
    let mut produced = 0;
    while produced < n {
        rng.fill_bytes(&mut buf);
        for &b in &buf {
            if produced == n {
                break;
            }
            if b < 252 {
                out.push(char::from(TOKEN_ALPHABET[usize::from(b % 36)]));
                produced += 1;
            }
        }
    }
}

/// A `[a-z0-9]{6}.[a-z0-9]{16}` token (Kubernetes bootstrap token and trustd token).
pub(crate) fn generate_token(rng: &mut dyn CryptoRngCore) -> Sensitive {
    let mut token = String::with_capacity(23);
    token_part(rng, 6, &mut token);
    token.push('.');
    token_part(rng, 16, &mut token);
    Sensitive::new(token)
}

/// Whether `s` is a `[a-z0-9]{6}.[a-z0-9]{16}` token.
pub(crate) fn is_token(s: &str) -> bool {
    let valid = |part: &str, len: usize| {
        part.len() == len
            && part
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    };
    matches!(s.split_once('.'), Some((id, secret)) if valid(id, 6) && valid(secret, 16))
}

fn non_empty<'a>(field: &'static str, value: &'a str) -> Result<&'a str, SecretsError> {
    if value.is_empty() {
        Err(SecretsError::InvalidField {
            field,
            problem: "missing",
        })
    } else {
        Ok(value)
    }
}

fn decode_b64(
    field: &'static str,
    engine: &base64::engine::GeneralPurpose,
    value: &str,
) -> Result<Zeroizing<Vec<u8>>, SecretsError> {
    engine
        .decode(value)
        .map(Zeroizing::new)
        .map_err(|_| SecretsError::InvalidField {
            field,
            problem: "not valid base64",
        })
}

fn token(field: &'static str, value: &str) -> Result<Sensitive, SecretsError> {
    if is_token(non_empty(field, value)?) {
        Ok(Sensitive::new(value))
    } else {
        Err(SecretsError::InvalidField {
            field,
            problem: "not a [a-z0-9]{6}.[a-z0-9]{16} token",
        })
    }
}

/// Decodes a base64-of-PEM field to its PEM text.
fn pem_field(field: &'static str, value: &str) -> Result<Sensitive, SecretsError> {
    let bytes = decode_b64(field, &STANDARD, non_empty(field, value)?)?;
    let text = std::str::from_utf8(&bytes).map_err(|_| SecretsError::InvalidField {
        field,
        problem: "not pem text",
    })?;
    if pki::pem_decode(text).is_none() {
        return Err(SecretsError::InvalidField {
            field,
            problem: "not pem text",
        });
    }
    Ok(Sensitive::new(text))
}

fn ca_field(
    [crt_field, key_field]: [&'static str; 2],
    wire: &WireCertAndKey,
    kind: KeyKind,
) -> Result<CertAndKey, SecretsError> {
    let cert = pem_field(crt_field, &wire.crt)?;
    let key = pem_field(key_field, &wire.key)?;
    check_ca_pair(crt_field, cert.expose(), key.expose(), Some(kind))?;
    Ok(CertAndKey {
        cert_pem: cert.expose().to_owned(),
        key_pem: key,
    })
}

/// Checks that `cert_pem` is a CA certificate whose public key belongs to `key_pem` (and,
/// if given, is of `kind`).
pub(crate) fn check_ca_pair(
    field: &'static str,
    cert_pem: &str,
    key_pem: &str,
    kind: Option<KeyKind>,
) -> Result<(), SecretsError> {
    let invalid = |problem| SecretsError::InvalidCertificate { field, problem };
    let public = check_ca_cert(field, cert_pem)?;
    let (pair, actual) =
        pki::load_key_pair(key_pem).map_err(|_| invalid("key is not ed25519 or p-256"))?;
    if kind.is_some_and(|k| k != actual) {
        return Err(invalid("key is of the wrong type"));
    }
    if pair.public_key_raw() != public.as_slice() {
        return Err(invalid("key does not match the certificate"));
    }
    Ok(())
}

/// Checks that `cert_pem` is a parseable CA certificate; returns its raw public key.
pub(crate) fn check_ca_cert(field: &'static str, cert_pem: &str) -> Result<Vec<u8>, SecretsError> {
    let invalid = |problem| SecretsError::InvalidCertificate { field, problem };
    let (label, der) = pki::pem_decode(cert_pem).ok_or_else(|| invalid("not pem"))?;
    if label != "CERTIFICATE" {
        return Err(invalid("not a certificate pem block"));
    }
    let (_, cert) =
        x509_parser::parse_x509_certificate(&der).map_err(|_| invalid("not valid x.509"))?;
    if !cert.is_ca() {
        return Err(invalid("not a ca certificate"));
    }
    Ok(cert.public_key().subject_public_key.data.to_vec())
}

#[derive(Serialize, Deserialize)]
struct WireBundle {
    #[serde(rename = "Cluster")]
    cluster: WireCluster,
    #[serde(rename = "Secrets")]
    secrets: WireSecrets,
    #[serde(rename = "TrustdInfo")]
    trustd_info: WireTrustd,
    #[serde(rename = "Certs")]
    certs: WireCerts,
}

#[derive(Serialize, Deserialize)]
struct WireCluster {
    #[serde(rename = "Id", default)]
    id: String,
    #[serde(rename = "Secret", default)]
    secret: String,
}

#[derive(Serialize, Deserialize)]
struct WireSecrets {
    #[serde(rename = "BootstrapToken", default)]
    bootstrap_token: String,
    #[serde(
        rename = "AESCBCEncryptionSecret",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    aescbc_encryption_secret: Option<String>,
    #[serde(
        rename = "SecretboxEncryptionSecret",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    secretbox_encryption_secret: Option<String>,
}

#[derive(Serialize, Deserialize)]
struct WireTrustd {
    #[serde(rename = "Token", default)]
    token: String,
}

#[derive(Serialize, Deserialize)]
struct WireCerts {
    #[serde(rename = "Etcd")]
    etcd: WireCertAndKey,
    #[serde(rename = "K8s")]
    k8s: WireCertAndKey,
    #[serde(rename = "K8sAggregator")]
    k8s_aggregator: WireCertAndKey,
    #[serde(rename = "K8sServiceAccount")]
    k8s_service_account: WireKey,
    #[serde(rename = "OS")]
    os: WireCertAndKey,
}

#[derive(Serialize, Deserialize)]
struct WireCertAndKey {
    #[serde(rename = "Crt", default)]
    crt: String,
    #[serde(rename = "Key", default)]
    key: String,
}

#[derive(Serialize, Deserialize)]
struct WireKey {
    #[serde(rename = "Key", default)]
    key: String,
}

impl WireBundle {
    /// Best-effort wipe of the plain copies made while (de)serialising.
    fn zeroize(self) {
        use zeroize::Zeroize as _;
        let Self {
            mut cluster,
            mut secrets,
            mut trustd_info,
            mut certs,
        } = self;
        cluster.secret.zeroize();
        secrets.bootstrap_token.zeroize();
        secrets.secretbox_encryption_secret.zeroize();
        secrets.aescbc_encryption_secret.zeroize();
        trustd_info.token.zeroize();
        for pair in [
            &mut certs.etcd,
            &mut certs.k8s,
            &mut certs.k8s_aggregator,
            &mut certs.os,
        ] {
            pair.key.zeroize();
        }
        certs.k8s_service_account.key.zeroize();
    }
}
