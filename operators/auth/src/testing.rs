//! Test support (feature `testing`): an in-process OIDC issuer over HTTPS, signing keys of
//! every accepted algorithm, and a clock that tests move by hand.
//!
//! [`TestIssuer::start`] serves, on `127.0.0.1` with a fresh test CA ([`TestIssuer::ca_pem`]),
//! the discovery document and the JWKS of whatever keys were [published], counts the
//! requests, and can be told to hang (accept, then never answer) or to announce another
//! issuer. [`TestKey`] signs tokens, valid or deliberately not. A crate whose HTTP server
//! sits behind an [`AuthMode`](crate::AuthMode) uses the same pieces in its own tests:
//!
//! ```
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use kontinuum_auth::testing::{TestIssuer, TestKey};
//! use kontinuum_auth::{Algorithm, AuthMode, Authenticator};
//!
//! let issuer = TestIssuer::start().await?;
//! let key = TestKey::generate(Algorithm::Es256, "k1")?;
//! issuer.publish(&[&key]);
//! let auth = Authenticator::with_ca(
//!     AuthMode::Oidc(issuer.settings("kontinuum", &["admins"])),
//!     Duration::from_secs(5),
//!     Some(issuer.ca_pem().as_bytes()),
//! )?;
//! let token = key.token(&issuer.claims("kontinuum", "alice", &["admins"]));
//! let mut headers = http::HeaderMap::new();
//! headers.insert(http::header::AUTHORIZATION, format!("Bearer {token}").parse()?);
//! let who = auth.authorize(&headers).await?.ok_or("no identity")?;
//! assert_eq!(who.subject, "alice");
//! # Ok(()) }
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
//! #     .block_on(example()).unwrap();
//! ```
//!
//! [published]: TestIssuer::publish

use std::io;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use ring::rand::SystemRandom;
use ring::signature::{
    ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, Ed25519KeyPair, KeyPair as _, RSA_PKCS1_SHA256,
    RsaKeyPair,
};
use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};
use tokio_rustls::TlsAcceptor;

use crate::jwk::{Algorithm, PublicKey};
use crate::mode::OidcSettings;
use crate::oidc::{Clock, DISCOVERY_PATH};

/// Errors setting up test fixtures.
#[derive(Debug, thiserror::Error)]
pub enum TestingError {
    /// Binding or accepting failed.
    #[error("test issuer I/O")]
    Io(#[from] io::Error),
    /// Certificate generation failed.
    #[error("generating the test issuer's certificates")]
    Certificate(#[from] rcgen::Error),
    /// rustls refused the serving certificate.
    #[error("building the test issuer's TLS configuration")]
    Tls(#[from] rustls::Error),
    /// Generating or loading a signing key failed.
    #[error("generating a {0} signing key")]
    Key(&'static str),
}

enum Pair {
    Rsa(RsaKeyPair),
    Ec(EcdsaKeyPair),
    Ed(Ed25519KeyPair),
}

/// A signing key of the test issuer.
pub struct TestKey {
    kid: String,
    alg: Algorithm,
    pair: Pair,
    jwk: Value,
    public: Vec<u8>,
}

impl std::fmt::Debug for TestKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestKey")
            .field("kid", &self.kid)
            .field("alg", &self.alg)
            .finish_non_exhaustive()
    }
}

impl TestKey {
    /// A fresh key (RSA 2048 bits, P-256 or Ed25519) with key id `kid`.
    pub fn generate(alg: Algorithm, kid: &str) -> Result<Self, TestingError> {
        let rng = SystemRandom::new();
        let (pair, jwk, public) = match alg {
            Algorithm::Rs256 => {
                use rsa::pkcs8::EncodePrivateKey as _;
                use rsa::traits::PublicKeyParts as _;
                let key = rsa::RsaPrivateKey::new(&mut rand_core::OsRng, 2048)
                    .map_err(|_| TestingError::Key("RSA"))?;
                let der = key.to_pkcs8_der().map_err(|_| TestingError::Key("RSA"))?;
                let pair =
                    RsaKeyPair::from_pkcs8(der.as_bytes()).map_err(|_| TestingError::Key("RSA"))?;
                let n = key.n().to_bytes_be();
                let jwk = json!({
                    "kty": "RSA", "kid": kid, "use": "sig", "alg": "RS256",
                    "n": URL_SAFE_NO_PAD.encode(&n),
                    "e": URL_SAFE_NO_PAD.encode(key.e().to_bytes_be()),
                });
                (Pair::Rsa(pair), jwk, n)
            }
            Algorithm::Es256 => {
                let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng)
                    .map_err(|_| TestingError::Key("P-256"))?;
                let pair = EcdsaKeyPair::from_pkcs8(
                    &ECDSA_P256_SHA256_FIXED_SIGNING,
                    pkcs8.as_ref(),
                    &rng,
                )
                .map_err(|_| TestingError::Key("P-256"))?;
                let point = pair.public_key().as_ref().to_vec();
                let jwk = json!({
                    "kty": "EC", "kid": kid, "use": "sig", "alg": "ES256", "crv": "P-256",
                    "x": URL_SAFE_NO_PAD.encode(&point[1..33]),
                    "y": URL_SAFE_NO_PAD.encode(&point[33..65]),
                });
                (Pair::Ec(pair), jwk, point)
            }
            Algorithm::EdDsa => {
                let pkcs8 = Ed25519KeyPair::generate_pkcs8(&rng)
                    .map_err(|_| TestingError::Key("Ed25519"))?;
                let pair = Ed25519KeyPair::from_pkcs8(pkcs8.as_ref())
                    .map_err(|_| TestingError::Key("Ed25519"))?;
                let x = pair.public_key().as_ref().to_vec();
                let jwk = json!({
                    "kty": "OKP", "kid": kid, "use": "sig", "alg": "EdDSA", "crv": "Ed25519",
                    "x": URL_SAFE_NO_PAD.encode(&x),
                });
                (Pair::Ed(pair), jwk, x)
            }
        };
        Ok(Self {
            kid: kid.to_string(),
            alg,
            pair,
            jwk,
            public,
        })
    }

    /// The key id.
    pub fn kid(&self) -> &str {
        &self.kid
    }

    /// The algorithm.
    pub fn algorithm(&self) -> Algorithm {
        self.alg
    }

    /// The public JWK, as the issuer publishes it.
    pub fn jwk(&self) -> &Value {
        &self.jwk
    }

    /// The public key, as a verifier holds it.
    pub fn public_key(&self) -> Option<PublicKey> {
        PublicKey::from_jwk(&self.jwk)
    }

    /// The raw public key bytes (RSA modulus, EC point, Ed25519 key): what an attacker
    /// would use as an HMAC secret in an algorithm-confusion forgery.
    pub fn public_bytes(&self) -> &[u8] {
        &self.public
    }

    /// This key's signature over `input`.
    pub fn sign_bytes(&self, input: &[u8]) -> Vec<u8> {
        let rng = SystemRandom::new();
        match &self.pair {
            Pair::Rsa(pair) => {
                let mut signature = vec![0; pair.public().modulus_len()];
                // Signing with a valid key into a buffer of the right size cannot fail.
                let _ = pair.sign(&RSA_PKCS1_SHA256, &rng, input, &mut signature);
                signature
            }
            Pair::Ec(pair) => pair
                .sign(&rng, input)
                .map(|s| s.as_ref().to_vec())
                .unwrap_or_default(),
            Pair::Ed(pair) => pair.sign(input).as_ref().to_vec(),
        }
    }

    /// A token with header `{"alg": <alg>, "kid": <kid>, "typ": "JWT"}` and `claims`.
    pub fn token(&self, claims: &Value) -> String {
        let header = json!({"alg": self.alg.name(), "kid": self.kid, "typ": "JWT"});
        self.token_with_header(&header, claims)
    }

    /// A token with any header and claims, signed by this key.
    pub fn token_with_header(&self, header: &Value, claims: &Value) -> String {
        let input = signing_input(header, claims);
        let signature = self.sign_bytes(input.as_bytes());
        format!("{input}.{}", URL_SAFE_NO_PAD.encode(signature))
    }
}

/// `<base64url header>.<base64url claims>`: what a JWS signature covers.
pub fn signing_input(header: &Value, claims: &Value) -> String {
    format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(header.to_string()),
        URL_SAFE_NO_PAD.encode(claims.to_string())
    )
}

/// A clock that moves only when told; starts at the system's wall-clock time.
#[derive(Debug)]
pub struct ManualClock {
    unix: AtomicI64,
    monotonic_ms: AtomicU64,
}

impl ManualClock {
    /// A clock at the current wall-clock time.
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            unix: AtomicI64::new(crate::oidc::SystemClock::new().unix_seconds()),
            monotonic_ms: AtomicU64::new(0),
        })
    }

    /// Moves both readings forward.
    pub fn advance(&self, by: Duration) {
        let ms = u64::try_from(by.as_millis()).unwrap_or(u64::MAX);
        self.monotonic_ms.fetch_add(ms, Ordering::SeqCst);
        self.unix.fetch_add(
            i64::try_from(by.as_secs()).unwrap_or(i64::MAX),
            Ordering::SeqCst,
        );
    }
}

impl Clock for ManualClock {
    fn unix_seconds(&self) -> i64 {
        self.unix.load(Ordering::SeqCst)
    }

    fn monotonic(&self) -> Duration {
        Duration::from_millis(self.monotonic_ms.load(Ordering::SeqCst))
    }
}

struct Shared {
    discovery_issuer: Mutex<String>,
    jwks_uri: String,
    jwks: Mutex<String>,
    hang: AtomicBool,
    discovery_requests: AtomicUsize,
    jwks_requests: AtomicUsize,
}

/// An OIDC issuer on `https://127.0.0.1:<port>/issuer`, stopped when dropped.
pub struct TestIssuer {
    url: String,
    ca_pem: String,
    shared: Arc<Shared>,
    task: JoinHandle<()>,
}

impl std::fmt::Debug for TestIssuer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestIssuer")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

impl Drop for TestIssuer {
    fn drop(&mut self) {
        // Dropping the task's JoinSet aborts every open (or hanging) connection too.
        self.task.abort();
    }
}

const JWKS_PATH: &str = "/issuer/keys";

impl TestIssuer {
    /// Starts an issuer with an empty JWKS on the current tokio runtime.
    pub async fn start() -> Result<Self, TestingError> {
        let (ca_pem, tls) = test_tls()?;
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let url = format!("https://127.0.0.1:{port}/issuer");
        let shared = Arc::new(Shared {
            discovery_issuer: Mutex::new(url.clone()),
            jwks_uri: format!("https://127.0.0.1:{port}{JWKS_PATH}"),
            jwks: Mutex::new(json!({"keys": []}).to_string()),
            hang: AtomicBool::new(false),
            discovery_requests: AtomicUsize::new(0),
            jwks_requests: AtomicUsize::new(0),
        });
        let acceptor = TlsAcceptor::from(Arc::new(tls));
        let task = tokio::spawn(accept_loop(listener, acceptor, shared.clone()));
        Ok(Self {
            url,
            ca_pem,
            shared,
            task,
        })
    }

    /// The issuer URL (tokens' `iss`).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The PEM CA certificate the issuer's serving certificate chains to.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// OIDC settings for this issuer.
    pub fn settings(&self, client_id: &str, admin_groups: &[&str]) -> OidcSettings {
        OidcSettings {
            issuer_url: self.url.clone(),
            client_id: client_id.to_string(),
            redirect_url: None,
            admin_groups: admin_groups.iter().map(ToString::to_string).collect(),
        }
    }

    /// Valid claims of this issuer for `audience`, subject `subject` in `groups`: issued
    /// now (system clock), expiring in 5 minutes.
    pub fn claims(&self, audience: &str, subject: &str, groups: &[&str]) -> Value {
        let now = crate::oidc::SystemClock::new().unix_seconds();
        json!({
            "iss": self.url, "sub": subject, "aud": audience,
            "iat": now, "nbf": now, "exp": now + 300,
            "email": format!("{subject}@example.com"), "groups": groups,
        })
    }

    /// Publishes exactly these keys in the JWKS.
    pub fn publish(&self, keys: &[&TestKey]) {
        let keys: Vec<&Value> = keys.iter().map(|k| k.jwk()).collect();
        self.publish_raw(&json!({ "keys": keys }).to_string());
    }

    /// Serves `body` as the JWKS, whatever it is.
    pub fn publish_raw(&self, body: &str) {
        *self
            .shared
            .jwks
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = body.to_string();
    }

    /// The `issuer` the discovery document announces (this issuer's URL by default).
    pub fn announce_issuer(&self, issuer: &str) {
        *self
            .shared
            .discovery_issuer
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = issuer.to_string();
    }

    /// When set, requests are read and never answered.
    pub fn set_hang(&self, hang: bool) {
        self.shared.hang.store(hang, Ordering::SeqCst);
    }

    /// Discovery requests answered or hung so far.
    pub fn discovery_requests(&self) -> usize {
        self.shared.discovery_requests.load(Ordering::SeqCst)
    }

    /// JWKS requests answered or hung so far.
    pub fn jwks_requests(&self) -> usize {
        self.shared.jwks_requests.load(Ordering::SeqCst)
    }
}

/// A fresh CA and a serving configuration for `127.0.0.1` and `localhost` signed by it.
fn test_tls() -> Result<(String, ServerConfig), TestingError> {
    let ca_key = KeyPair::generate()?;
    let mut ca = CertificateParams::default();
    ca.distinguished_name
        .push(DnType::CommonName, "kontinuum-auth test CA");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca.self_signed(&ca_key)?;
    let ca_pem = ca_cert.pem();
    let issuer = Issuer::new(ca, ca_key);

    let key = KeyPair::generate()?;
    let mut leaf = CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])?;
    leaf.distinguished_name
        .push(DnType::CommonName, "kontinuum-auth test issuer");
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let cert = leaf.signed_by(&key, &issuer)?;

    let chain = vec![
        CertificateDer::from_pem_slice(cert.pem().as_bytes())
            .map_err(|_| TestingError::Key("serving certificate"))?,
    ];
    let key = PrivateKeyDer::from_pem_slice(key.serialize_pem().as_bytes())
        .map_err(|_| TestingError::Key("serving"))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(chain, key)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok((ca_pem, config))
}

async fn accept_loop(listener: TcpListener, acceptor: TlsAcceptor, shared: Arc<Shared>) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                if let Ok((tcp, _)) = accepted {
                    connections.spawn(serve(tcp, acceptor.clone(), shared.clone()));
                }
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

/// One request per connection (`Connection: close`), HTTP/1.1, GET only.
async fn serve(tcp: TcpStream, acceptor: TlsAcceptor, shared: Arc<Shared>) {
    let Ok(mut tls) = acceptor.accept(tcp).await else {
        return;
    };
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match tls.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
        if head.len() > 16 * 1024 {
            return;
        }
    }
    let head = String::from_utf8_lossy(&head);
    let path = head
        .lines()
        .next()
        .and_then(|line| line.split(' ').nth(1))
        .unwrap_or_default()
        .to_string();
    let discovery = format!("/issuer{DISCOVERY_PATH}");
    let (status, body) = if path == discovery {
        shared.discovery_requests.fetch_add(1, Ordering::SeqCst);
        let issuer = shared
            .discovery_issuer
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let doc = json!({
            "issuer": issuer,
            "jwks_uri": shared.jwks_uri,
            "authorization_endpoint": format!("{issuer}/auth"),
            "token_endpoint": format!("{issuer}/token"),
            "response_types_supported": ["code"],
            "subject_types_supported": ["public"],
            "id_token_signing_alg_values_supported": ["RS256", "ES256", "EdDSA"],
        });
        ("200 OK", doc.to_string())
    } else if path == JWKS_PATH {
        shared.jwks_requests.fetch_add(1, Ordering::SeqCst);
        let jwks = shared
            .jwks
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        ("200 OK", jwks)
    } else {
        ("404 Not Found", "{}".to_string())
    };
    if shared.hang.load(Ordering::SeqCst) {
        std::future::pending::<()>().await;
    }
    let response = format!(
        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
         connection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = tls.write_all(response.as_bytes()).await;
    let _ = tls.shutdown().await;
}
