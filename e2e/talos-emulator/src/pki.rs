//! Certificates and TLS configurations of an emulated machine: the self-signed maintenance
//! certificate, the configured-mode server certificate (signed by the OS CA) with Talos'
//! client verification (chain to the OS CA, EKU exactly clientAuth), and the admin
//! kubeconfig signed by the Kubernetes CA.

use std::io::Write as _;
use std::net::Ipv4Addr;
use std::sync::Arc;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use kontinuum_talos_config::{CertAndKey, Sensitive, private_key_pkcs8_der};
use rcgen::{
    CertificateParams, DnType, ExtendedKeyUsagePurpose, KeyPair, KeyUsagePurpose, PKCS_ED25519,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{
    DigitallySignedStruct, DistinguishedName, RootCertStore, ServerConfig, SignatureScheme,
};

use crate::core::Role;
use crate::error::Error;

/// Common name of Talos' maintenance certificate.
pub const MAINTENANCE_CN: &str = "maintenance-service.talos.dev";
/// OID of the clientAuth extended key usage.
const CLIENT_AUTH_OID: &str = "1.3.6.1.5.5.7.3.2";

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn pki(what: &'static str) -> impl Fn(rcgen::Error) -> Error {
    move |source| Error::Pki { what, source }
}

fn tls(what: &'static str) -> impl Fn(rustls::Error) -> Error {
    move |source| Error::Tls { what, source }
}

/// A new Ed25519 key, PKCS#8 DER (the machine's maintenance identity).
pub fn generate_maintenance_key() -> Result<Vec<u8>, Error> {
    let key = KeyPair::generate_for(&PKCS_ED25519).map_err(pki("generating a maintenance key"))?;
    Ok(key.serialize_der())
}

fn validity(params: &mut CertificateParams, days: i64) {
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::minutes(1);
    params.not_after = now + time::Duration::days(days);
}

fn server_config(
    builder: rustls::ConfigBuilder<ServerConfig, rustls::server::WantsServerCert>,
    cert: CertificateDer<'static>,
    key_der: Vec<u8>,
) -> Result<Arc<ServerConfig>, Error> {
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key_der));
    let mut config = builder
        .with_single_cert(vec![cert], key)
        .map_err(tls("building the server configuration"))?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

/// Maintenance mode: a self-signed Ed25519 certificate (CN maintenance-service.talos.dev,
/// SANs the machine's IP and 127.0.0.1), ALPN h2, no client certificate.
pub fn maintenance_config(key_der: &[u8], address: Ipv4Addr) -> Result<Arc<ServerConfig>, Error> {
    let key = KeyPair::try_from(key_der).map_err(pki("loading the maintenance key"))?;
    let mut params = CertificateParams::new(vec![address.to_string(), "127.0.0.1".to_owned()])
        .map_err(pki("maintenance certificate names"))?;
    params
        .distinguished_name
        .push(DnType::CommonName, MAINTENANCE_CN);
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    validity(&mut params, 1);
    let cert = params
        .self_signed(&key)
        .map_err(pki("self-signing the maintenance certificate"))?;
    let builder = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(tls("tls versions"))?
        .with_no_client_auth();
    server_config(builder, cert.der().clone(), key_der.to_vec())
}

/// Configured mode: an Ed25519 server certificate signed by the OS CA (CN and DNS SAN the
/// hostname, IP SANs the machine's address and 127.0.0.1), client certificates required and
/// verified as Talos does.
pub fn configured_config(
    os_ca: &CertAndKey,
    address: Ipv4Addr,
    hostname: &str,
) -> Result<Arc<ServerConfig>, Error> {
    let issuer = os_ca.issuer().map_err(|source| Error::Secrets {
        what: "loading the os ca",
        source: Box::new(source),
    })?;
    let key = KeyPair::generate_for(&PKCS_ED25519).map_err(pki("generating a server key"))?;
    let mut params = CertificateParams::new(vec![
        address.to_string(),
        "127.0.0.1".to_owned(),
        hostname.to_owned(),
    ])
    .map_err(pki("server certificate names"))?;
    params.distinguished_name.push(DnType::CommonName, hostname);
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    validity(&mut params, 1);
    let cert = params
        .signed_by(&key, &issuer)
        .map_err(pki("signing the server certificate"))?;

    let mut roots = RootCertStore::empty();
    for ca in CertificateDer::pem_slice_iter(os_ca.cert_pem.as_bytes()) {
        let ca = ca.map_err(|_| Error::InvalidCa)?;
        roots.add(ca).map_err(tls("adding the os ca"))?;
    }
    let inner = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
        .build()
        .map_err(|_| Error::InvalidCa)?;
    let builder = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(tls("tls versions"))?
        .with_client_cert_verifier(Arc::new(TalosClientVerifier { inner }));
    server_config(builder, cert.der().clone(), key.serialize_der())
}

/// WebPKI verification against the OS CA plus Talos' `verifyExtKeyUsage`: the client
/// certificate's extended key usage must be exactly `[clientAuth]`.
#[derive(Debug)]
struct TalosClientVerifier {
    inner: Arc<dyn ClientCertVerifier>,
}

impl ClientCertVerifier for TalosClientVerifier {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self
            .inner
            .verify_client_cert(end_entity, intermediates, now)?;
        if eku_is_exactly_client_auth(end_entity) {
            Ok(verified)
        } else {
            Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::InvalidPurpose,
            ))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// Whether a certificate's extended key usage is exactly clientAuth.
pub fn eku_is_exactly_client_auth(der: &[u8]) -> bool {
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(der) else {
        return false;
    };
    let Ok(Some(eku)) = cert.extended_key_usage() else {
        return false;
    };
    let eku = eku.value;
    eku.client_auth
        && !eku.any
        && !eku.server_auth
        && !eku.code_signing
        && !eku.email_protection
        && !eku.time_stamping
        && !eku.ocsp_signing
        && eku
            .other
            .iter()
            .all(|oid| oid.to_id_string() == CLIENT_AUTH_OID)
}

/// The roles in a client certificate's Organization values.
pub fn roles_of(der: &[u8]) -> Vec<Role> {
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(der) else {
        return Vec::new();
    };
    cert.subject()
        .iter_organization()
        .filter_map(|o| o.as_str().ok())
        .filter_map(Role::parse)
        .collect()
}

/// A Kubernetes CA from a machine config as the test bed takes it (PKCS#8 PEM key).
pub fn testbed_ca(
    cert_pem: &str,
    key_pem: &Sensitive,
) -> Result<kontinuum_testbed::CertificateAuthority, Error> {
    Ok(kontinuum_testbed::CertificateAuthority {
        cert_pem: cert_pem.to_owned(),
        key_pem: pkcs8_pem(key_pem)?,
    })
}

/// A private key of a Talos config (`EC PRIVATE KEY`, `ED25519 PRIVATE KEY`, `RSA PRIVATE
/// KEY` or PKCS#8) as a PKCS#8 `PRIVATE KEY` PEM, the form the test bed loads.
pub fn pkcs8_pem(key_pem: &Sensitive) -> Result<String, Error> {
    let key = if let Some(pkcs1) = rsa_pkcs1_der(key_pem.expose()) {
        KeyPair::try_from(rsa_pkcs8_der(&pkcs1).as_slice())
    } else {
        let der = private_key_pkcs8_der(key_pem.expose()).map_err(|source| Error::Secrets {
            what: "converting a private key",
            source: Box::new(source),
        })?;
        KeyPair::try_from(der.as_slice())
    }
    .map_err(pki("loading a private key"))?;
    Ok(key.serialize_pem())
}

/// The DER body of an `RSA PRIVATE KEY` (PKCS#1) PEM.
fn rsa_pkcs1_der(pem: &str) -> Option<Vec<u8>> {
    let body = pem
        .trim()
        .strip_prefix("-----BEGIN RSA PRIVATE KEY-----")?
        .strip_suffix("-----END RSA PRIVATE KEY-----")?;
    let b64: String = body.chars().filter(|c| !c.is_whitespace()).collect();
    STANDARD.decode(b64).ok()
}

/// PKCS#1 RSA key → PKCS#8: `SEQUENCE { INTEGER 0, SEQUENCE { rsaEncryption, NULL },
/// OCTET STRING { pkcs1 } }`.
fn rsa_pkcs8_der(pkcs1: &[u8]) -> Vec<u8> {
    const RSA_ENCRYPTION: [u8; 11] = [
        0x06, 0x09, 0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01,
    ];
    let algorithm = der_tlv(0x30, &[&RSA_ENCRYPTION[..], &[0x05, 0x00]].concat());
    let body = [der_tlv(0x02, &[0]), algorithm, der_tlv(0x04, pkcs1)].concat();
    der_tlv(0x30, &body)
}

/// One DER element: `tag`, a definite length, `content`.
pub fn der_tlv(tag: u8, content: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    let len = content.len();
    if len < 0x80 {
        out.push(u8::try_from(len).unwrap_or(0));
    } else {
        let bytes: Vec<u8> = len
            .to_be_bytes()
            .into_iter()
            .skip_while(|b| *b == 0)
            .collect();
        out.push(0x80 | u8::try_from(bytes.len()).unwrap_or(0));
        out.extend(bytes);
    }
    out.extend_from_slice(content);
    out
}

/// Talos' admin kubeconfig: a P-256 client certificate (CN admin, O system:masters, EKU
/// clientAuth, from 10 s ago for a year) signed by the Kubernetes CA; context
/// `admin@<cluster>`.
pub fn admin_kubeconfig(
    kubernetes_ca: &CertAndKey,
    cluster_name: &str,
    server: &str,
) -> Result<Sensitive, Error> {
    let issuer = kubernetes_ca.issuer().map_err(|source| Error::Secrets {
        what: "loading the kubernetes ca",
        source: Box::new(source),
    })?;
    let key = KeyPair::generate().map_err(pki("generating the admin key"))?;
    let mut params = CertificateParams::default();
    params.distinguished_name.push(DnType::CommonName, "admin");
    params
        .distinguished_name
        .push(DnType::OrganizationName, "system:masters");
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::seconds(10);
    params.not_after = now + time::Duration::days(365);
    let cert = params
        .signed_by(&key, &issuer)
        .map_err(pki("signing the admin certificate"))?;
    let b64 = |s: &str| STANDARD.encode(s.as_bytes());
    let user = format!("admin@{cluster_name}");
    Ok(Sensitive::new(format!(
        "apiVersion: v1\nkind: Config\nclusters:\n  - name: {cluster_name}\n    cluster:\n      \
         server: {server}\n      certificate-authority-data: {ca}\nusers:\n  - name: {user}\n    \
         user:\n      client-certificate-data: {crt}\n      client-key-data: {key}\n\
         contexts:\n  - context:\n      cluster: {cluster_name}\n      namespace: default\n      \
         user: {user}\n    name: {user}\ncurrent-context: {user}\n",
        ca = b64(&kubernetes_ca.cert_pem),
        crt = b64(&cert.pem()),
        key = b64(&key.serialize_pem()),
    )))
}

/// A gzip'd tar with one entry `kubeconfig` (mode 0600), properly terminated.
pub fn kubeconfig_archive(kubeconfig: &[u8]) -> Result<Vec<u8>, Error> {
    let io = |source| Error::Io {
        what: "building the kubeconfig archive".to_owned(),
        source,
    };
    let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    let mut builder = tar::Builder::new(gz);
    let mut header = tar::Header::new_gnu();
    header.set_size(kubeconfig.len() as u64);
    header.set_mode(0o600);
    header.set_entry_type(tar::EntryType::Regular);
    builder
        .append_data(&mut header, "kubeconfig", kubeconfig)
        .map_err(io)?;
    let mut gz = builder.into_inner().map_err(io)?;
    gz.flush().map_err(io)?;
    gz.finish().map_err(io)
}
