//! TLS for both halves, with rustls (ring): the proxy's serving certificate, hot-reloaded
//! from its files; client configurations for the store and for the relay's hub connection;
//! and the connector that dials `http://` (plain TCP) or `https://` (TLS) endpoints for
//! tonic channels. ALPN `h2` on both sides (gRPC clients such as grpc-go require it).

use std::fs;
use std::future::Future;
use std::io;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use http::Uri;
use hyper_util::rt::TokioIo;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::ring as provider;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, ServerConfig, SignatureScheme};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tracing::{info, warn};

/// How often, at most, a handshake looks at the certificate files for a change.
const RELOAD_CHECK: Duration = Duration::from_secs(1);

/// Errors building TLS configurations.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("reading {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// A file holds no usable PEM certificate or key.
    #[error("{path} holds no PEM {what}")]
    Pem {
        /// The file.
        path: PathBuf,
        /// `certificate` or `private key`.
        what: &'static str,
    },
    /// rustls refused the material.
    #[error("building the TLS configuration")]
    Rustls(#[source] rustls::Error),
    /// Reading the system's trusted roots failed.
    #[error("no trusted roots: pass a CA file")]
    NoRoots,
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// The certificates of a PEM file.
pub fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read(path)?;
    let certs: Vec<_> = CertificateDer::pem_slice_iter(&pem)
        .filter_map(Result::ok)
        .collect();
    if certs.is_empty() {
        return Err(TlsError::Pem {
            path: path.to_path_buf(),
            what: "certificate",
        });
    }
    Ok(certs)
}

fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let pem = read(path)?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|_| TlsError::Pem {
        path: path.to_path_buf(),
        what: "private key",
    })
}

fn certified_key(cert: &Path, key: &Path) -> Result<Arc<CertifiedKey>, TlsError> {
    let chain = load_certs(cert)?;
    let key = load_key(key)?;
    let signing = provider::sign::any_supported_type(&key).map_err(TlsError::Rustls)?;
    Ok(Arc::new(CertifiedKey::new(chain, signing)))
}

/// What identifies one version of a file: its inode, size and modification time (a
/// Kubernetes Secret volume swaps a symlink, which changes all of them).
type Stamp = Option<(u64, u64, i64, i64)>;

fn stamp(path: &Path) -> Stamp {
    let m = fs::metadata(path).ok()?;
    Some((m.ino(), m.size(), m.mtime(), m.mtime_nsec()))
}

struct Loaded {
    key: Arc<CertifiedKey>,
    stamps: (Stamp, Stamp),
    checked: Instant,
}

/// The serving certificate, re-read when its files change (checked at most once a second,
/// on a handshake). A broken new pair keeps the old one in service.
pub struct ReloadingCert {
    cert: PathBuf,
    key: PathBuf,
    loaded: Mutex<Loaded>,
}

impl std::fmt::Debug for ReloadingCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReloadingCert")
            .field("cert", &self.cert)
            .finish_non_exhaustive()
    }
}

impl ReloadingCert {
    /// Loads the pair once; fails when it cannot be used.
    pub fn new(cert: PathBuf, key: PathBuf) -> Result<Self, TlsError> {
        let stamps = (stamp(&cert), stamp(&key));
        let loaded = certified_key(&cert, &key)?;
        Ok(Self {
            cert,
            key,
            loaded: Mutex::new(Loaded {
                key: loaded,
                stamps,
                checked: Instant::now(),
            }),
        })
    }

    fn current(&self) -> Arc<CertifiedKey> {
        let mut loaded = self.loaded.lock().unwrap_or_else(PoisonError::into_inner);
        if loaded.checked.elapsed() >= RELOAD_CHECK {
            loaded.checked = Instant::now();
            let stamps = (stamp(&self.cert), stamp(&self.key));
            if stamps != loaded.stamps {
                match certified_key(&self.cert, &self.key) {
                    Ok(key) => {
                        info!(cert = %self.cert.display(), "serving certificate reloaded");
                        loaded.key = key;
                        loaded.stamps = stamps;
                    }
                    // Half-written files (cert updated, key not yet) settle on a later check.
                    Err(err) => warn!(
                        error = &err as &dyn std::error::Error,
                        "reloading the serving certificate failed; keeping the old one"
                    ),
                }
            }
        }
        Arc::clone(&loaded.key)
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

/// The proxy's server configuration: the reloading certificate, no client certificates
/// (zones authenticate with tokens), ALPN `h2`.
pub fn server_config(cert: Arc<ReloadingCert>) -> Result<Arc<ServerConfig>, TlsError> {
    let mut config = ServerConfig::builder_with_provider(Arc::new(provider::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Rustls)?
        .with_no_client_auth()
        .with_cert_resolver(cert);
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

/// How a client trusts its server.
#[derive(Clone, Debug)]
pub enum Trust {
    /// The CAs in this PEM file.
    CaFile(PathBuf),
    /// The system's roots.
    System,
    /// Nothing is checked but the handshake itself (`--insecure-skip-verify` only).
    InsecureSkipVerify,
}

/// A client configuration: `trust` for the server, an optional client certificate and key.
pub fn client_config(
    trust: &Trust,
    identity: Option<(&Path, &Path)>,
) -> Result<Arc<ClientConfig>, TlsError> {
    let provider = Arc::new(provider::default_provider());
    let builder = ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Rustls)?;
    let builder = match trust {
        Trust::InsecureSkipVerify => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(SkipVerify(provider))),
        Trust::CaFile(path) => {
            let mut roots = RootCertStore::empty();
            for cert in load_certs(path)? {
                roots.add(cert).map_err(TlsError::Rustls)?;
            }
            builder.with_root_certificates(roots)
        }
        Trust::System => {
            let mut roots = RootCertStore::empty();
            let found = rustls_native_certs::load_native_certs();
            roots.add_parsable_certificates(found.certs);
            if roots.is_empty() {
                return Err(TlsError::NoRoots);
            }
            builder.with_root_certificates(roots)
        }
    };
    let mut config = match identity {
        Some((cert, key)) => builder
            .with_client_auth_cert(load_certs(cert)?, load_key(key)?)
            .map_err(TlsError::Rustls)?,
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

/// Accepts any server certificate; still checks the handshake signatures, so the session is
/// at least bound to the key the server presented.
#[derive(Debug)]
struct SkipVerify(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for SkipVerify {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// A client connection: plain TCP or TLS over TCP.
pub enum Conn {
    /// `http://`.
    Plain(TcpStream),
    /// `https://`.
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Self::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Self::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_flush(cx),
            Self::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Self::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// Dials `http://host:port` in plain TCP and `https://host:port` with TLS (SNI and
/// verification against the URI's host).
#[derive(Clone)]
pub struct Connector {
    tls: Option<TlsConnector>,
}

impl Connector {
    /// `tls` is used for `https://` URIs; without it they fail.
    pub fn new(tls: Option<Arc<ClientConfig>>) -> Self {
        Self {
            tls: tls.map(TlsConnector::from),
        }
    }
}

type ConnectFuture = Pin<Box<dyn Future<Output = io::Result<TokioIo<Conn>>> + Send>>;

impl tower_service::Service<Uri> for Connector {
    type Response = TokioIo<Conn>;
    type Error = io::Error;
    type Future = ConnectFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let tls = self.tls.clone();
        Box::pin(async move {
            let invalid =
                |what: &str| io::Error::new(io::ErrorKind::InvalidInput, what.to_string());
            let host = uri.host().ok_or_else(|| invalid("endpoint has no host"))?;
            let host = host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string();
            let https = uri.scheme_str() == Some("https");
            let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
            let tcp = TcpStream::connect((host.as_str(), port)).await?;
            tcp.set_nodelay(true)?;
            if !https {
                return Ok(TokioIo::new(Conn::Plain(tcp)));
            }
            let tls = tls.ok_or_else(|| invalid("https endpoint without a TLS configuration"))?;
            let name = ServerName::try_from(host).map_err(|_| invalid("invalid server name"))?;
            let stream = tls.connect(name, tcp).await?;
            Ok(TokioIo::new(Conn::Tls(Box::new(stream))))
        })
    }
}

/// A lazily connected channel to `uri` through `connector`, with HTTP/2 keep-alives so a
/// dead peer is noticed.
pub fn channel(uri: Uri, connector: Connector) -> tonic::transport::Channel {
    tonic::transport::Endpoint::from(uri)
        .connect_timeout(Duration::from_secs(5))
        .http2_keep_alive_interval(Duration::from_secs(10))
        .keep_alive_timeout(Duration::from_secs(5))
        .keep_alive_while_idle(true)
        .tcp_nodelay(true)
        .connect_with_connector_lazy(connector)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_pair(dir: &Path, cn: &str) {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec![cn.into()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        // Write to temporary names and rename, as a Secret volume update swaps files.
        fs::write(dir.join("tmp.crt"), cert.pem()).unwrap();
        fs::write(dir.join("tmp.key"), key.serialize_pem()).unwrap();
        fs::rename(dir.join("tmp.crt"), dir.join("tls.crt")).unwrap();
        fs::rename(dir.join("tmp.key"), dir.join("tls.key")).unwrap();
    }

    #[test]
    fn the_serving_certificate_follows_its_files() {
        let dir = tempfile::tempdir().unwrap();
        write_pair(dir.path(), "one");
        let cert =
            ReloadingCert::new(dir.path().join("tls.crt"), dir.path().join("tls.key")).unwrap();
        let first = cert.current().cert[0].clone();
        write_pair(dir.path(), "two");
        // Not re-read more than once a second.
        cert.loaded.lock().unwrap().checked = Instant::now().checked_sub(RELOAD_CHECK).unwrap();
        let second = cert.current().cert[0].clone();
        assert_ne!(first, second);
        // A broken file keeps the working pair.
        fs::write(dir.path().join("tls.crt"), "garbage").unwrap();
        cert.loaded.lock().unwrap().checked = Instant::now().checked_sub(RELOAD_CHECK).unwrap();
        assert_eq!(cert.current().cert[0], second);
    }

    #[test]
    fn missing_files_are_named() {
        let err = ReloadingCert::new("/nonexistent/a".into(), "/nonexistent/b".into())
            .unwrap_err()
            .to_string();
        assert!(err.contains("/nonexistent/a"), "{err}");
    }
}
