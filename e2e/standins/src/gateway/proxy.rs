//! The data plane of the Gateway stand-in: one TCP listener per port (listener port +
//! offset, on the listen IP), shared by every programmed listener on that port. HTTPS ports
//! pick the listener by SNI and terminate TLS with its certificate; then the first request's
//! head picks the route (Host header, path) and the connection is relayed, bytes as they
//! are, to one endpoint of the rule's backend Service. Later requests on a kept-alive
//! connection go to the same endpoint.
//!
//! Answers it gives itself, as Gateway API asks: `404` when no route matches, `500` when the
//! matching rule's backends are all invalid, `503` when they have no ready endpoint,
//! `502` when the endpoint refuses the connection.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// How long a client may take for the TLS handshake and the first request head.
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(30);
/// How long connecting to an endpoint may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// The largest request head read before routing.
pub const MAX_HEAD: usize = 64 * 1024;

/// What one port serves.
#[derive(Clone, Debug, Default)]
pub struct PortConfig {
    /// Whether the port terminates TLS (HTTPS listeners) or is plain (HTTP).
    pub tls: bool,
    /// The programmed listeners on it, in precedence order.
    pub listeners: Vec<ListenerConfig>,
}

/// One programmed listener.
#[derive(Clone)]
pub struct ListenerConfig {
    /// `namespace/gateway/listener`, for logs.
    pub id: String,
    /// The listener's host name (exact or `*.` wildcard); any when `None`.
    pub hostname: Option<String>,
    /// The TLS configuration built from the listener's certificate (HTTPS).
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// The routes attached to it, in precedence order.
    pub routes: Vec<RouteConfig>,
}

impl std::fmt::Debug for ListenerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ListenerConfig")
            .field("id", &self.id)
            .field("hostname", &self.hostname)
            .field("tls", &self.tls.is_some())
            .field("routes", &self.routes)
            .finish()
    }
}

/// One attached route.
#[derive(Clone, Debug, Default)]
pub struct RouteConfig {
    /// `namespace/name`, for logs.
    pub id: String,
    /// Its host names; any when empty.
    pub hostnames: Vec<String>,
    /// Its rules.
    pub rules: Vec<RuleConfig>,
}

/// One rule of a route.
#[derive(Clone, Debug, Default)]
pub struct RuleConfig {
    /// Its path matches (any may match).
    pub matches: Vec<PathMatch>,
    /// Where requests go.
    pub backends: Backends,
}

/// A path match the data plane evaluates.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PathMatch {
    /// The path equals this.
    Exact(String),
    /// The path is this or below it (segment-wise).
    Prefix(String),
    /// A match the stand-in does not evaluate (headers, query, method, regex): never
    /// matches.
    Never,
}

/// The endpoints of a rule.
#[derive(Clone, Debug, Default)]
pub enum Backends {
    /// Ready endpoints, used round robin (may be empty: `503`).
    Endpoints(Vec<SocketAddr>, Arc<AtomicUsize>),
    /// Every backend reference is invalid: `500`.
    #[default]
    Invalid,
}

impl Backends {
    /// Endpoints without a shared counter.
    pub fn endpoints(addrs: Vec<SocketAddr>) -> Self {
        Self::Endpoints(addrs, Arc::new(AtomicUsize::new(0)))
    }
}

/// Whether `host` matches a Gateway API host name pattern (`*.` wildcards match one or more
/// labels). Both are compared case-insensitively.
pub fn host_matches(pattern: &str, host: &str) -> bool {
    let pattern = pattern.to_ascii_lowercase();
    let host = host.to_ascii_lowercase();
    match pattern.strip_prefix("*.") {
        Some(suffix) => host
            .strip_suffix(suffix)
            .is_some_and(|rest| rest.len() > 1 && rest.ends_with('.')),
        None => pattern == host,
    }
}

/// How specifically a pattern matched: exact beats wildcard beats "any".
fn host_score(pattern: Option<&str>, host: &str) -> Option<usize> {
    match pattern {
        None => Some(0),
        Some(p) if !host_matches(p, host) => None,
        Some(p) if p.starts_with("*.") => Some(p.len()),
        Some(_) => Some(usize::MAX),
    }
}

/// The listener of `listeners` for `host`: the most specific host name match.
pub fn select_listener<'a>(
    listeners: &'a [ListenerConfig],
    host: Option<&str>,
) -> Option<&'a ListenerConfig> {
    let host = host.unwrap_or_default();
    let mut best: Option<(usize, &ListenerConfig)> = None;
    for listener in listeners {
        if let Some(score) = host_score(listener.hostname.as_deref(), host)
            && best.is_none_or(|(b, _)| score > b)
        {
            best = Some((score, listener));
        }
    }
    best.map(|(_, l)| l)
}

fn path_matches(matcher: &PathMatch, path: &str) -> Option<(u8, usize)> {
    match matcher {
        PathMatch::Exact(p) if p == path => Some((2, p.len())),
        PathMatch::Prefix(p) => {
            let prefix = p.trim_end_matches('/');
            let ok = prefix.is_empty()
                || path == prefix
                || path
                    .strip_prefix(prefix)
                    .is_some_and(|rest| rest.starts_with('/'));
            ok.then_some((1, prefix.len()))
        }
        _ => None,
    }
}

/// The rule for a request to `host` and `path` among a listener's routes: the most
/// specific host name, then exact over prefix paths, then the longest prefix; ties go to
/// the earlier route (routes come in precedence order).
pub fn select_rule<'a>(
    routes: &'a [RouteConfig],
    host: &str,
    path: &str,
) -> Option<&'a RuleConfig> {
    let mut best: Option<((usize, u8, usize), &RuleConfig)> = None;
    for route in routes {
        let host_rank = if route.hostnames.is_empty() {
            Some(0)
        } else {
            route
                .hostnames
                .iter()
                .filter_map(|h| host_score(Some(h), host))
                .max()
        };
        let Some(host_rank) = host_rank else {
            continue;
        };
        for rule in &route.rules {
            for matcher in &rule.matches {
                if let Some((kind, len)) = path_matches(matcher, path) {
                    let score = (host_rank, kind, len);
                    if best.is_none_or(|(b, _)| score > b) {
                        best = Some((score, rule));
                    }
                }
            }
        }
    }
    best.map(|(_, r)| r)
}

/// The data plane: the bound ports and their configurations.
pub struct DataPlane {
    listen_ip: IpAddr,
    ports: HashMap<u16, Port>,
}

struct Port {
    config: watch::Sender<Arc<PortConfig>>,
    task: JoinHandle<()>,
}

impl Drop for DataPlane {
    fn drop(&mut self) {
        for port in self.ports.values() {
            port.task.abort();
        }
    }
}

impl DataPlane {
    /// A data plane listening on `listen_ip`.
    pub fn new(listen_ip: IpAddr) -> Self {
        Self {
            listen_ip,
            ports: HashMap::new(),
        }
    }

    /// Serves exactly `desired`: binds new ports, updates the configuration of bound ones
    /// (new connections see it at once), closes ports no longer wanted. Returns, per wanted
    /// port, whether it is listening (or why not).
    pub async fn apply(
        &mut self,
        desired: BTreeMap<u16, PortConfig>,
    ) -> BTreeMap<u16, Result<(), String>> {
        self.ports.retain(|port, handle| {
            let keep = desired.contains_key(port);
            if !keep {
                handle.task.abort();
                tracing::info!(port, "closed port");
            }
            keep
        });
        let mut bound = BTreeMap::new();
        for (port, config) in desired {
            let config = Arc::new(config);
            if let Some(existing) = self.ports.get(&port) {
                existing.config.send_replace(config);
                bound.insert(port, Ok(()));
                continue;
            }
            match TcpListener::bind(SocketAddr::new(self.listen_ip, port)).await {
                Ok(listener) => {
                    let (tx, rx) = watch::channel(config);
                    let task = tokio::spawn(accept_loop(listener, rx));
                    self.ports.insert(port, Port { config: tx, task });
                    tracing::info!(port, "listening");
                    bound.insert(port, Ok(()));
                }
                Err(e) => {
                    bound.insert(port, Err(e.to_string()));
                }
            }
        }
        bound
    }
}

async fn accept_loop(listener: TcpListener, config: watch::Receiver<Arc<PortConfig>>) {
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                let config = config.borrow().clone();
                tokio::spawn(async move {
                    if let Err(e) = handle(stream, &config).await {
                        tracing::debug!(%peer, error = %e, "connection ended with an error");
                    }
                });
            }
            Err(e) => {
                tracing::warn!(error = &e as &dyn std::error::Error, "accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Why a connection was not relayed.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// Reading or writing a socket failed.
    #[error("i/o")]
    Io(#[from] std::io::Error),
    /// The client was too slow.
    #[error("the client timed out")]
    Timeout,
    /// No listener serves the requested server name.
    #[error("no listener for server name {0:?}")]
    NoListener(Option<String>),
    /// The request head was malformed or too large.
    #[error("bad request")]
    BadRequest,
}

async fn handle(stream: TcpStream, config: &PortConfig) -> Result<(), ProxyError> {
    if config.tls {
        let acceptor =
            tokio_rustls::LazyConfigAcceptor::new(rustls::server::Acceptor::default(), stream);
        let start = tokio::time::timeout(CLIENT_TIMEOUT, acceptor)
            .await
            .map_err(|_| ProxyError::Timeout)??;
        let sni = start.client_hello().server_name().map(str::to_owned);
        let listener = select_listener(&config.listeners, sni.as_deref())
            .ok_or_else(|| ProxyError::NoListener(sni.clone()))?;
        let tls = listener
            .tls
            .clone()
            .ok_or_else(|| ProxyError::NoListener(sni.clone()))?;
        let stream = tokio::time::timeout(CLIENT_TIMEOUT, start.into_stream(tls))
            .await
            .map_err(|_| ProxyError::Timeout)??;
        serve(stream, std::slice::from_ref(listener), sni.as_deref()).await
    } else {
        serve(stream, &config.listeners, None).await
    }
}

/// The request line's path (without query) and the Host header (without port).
fn parse_head(head: &[u8]) -> Option<(String, Option<String>)> {
    let text = std::str::from_utf8(head).ok()?;
    let mut lines = text.split("\r\n");
    let request_line = lines.next()?;
    let mut parts = request_line.split(' ');
    let _method = parts.next()?;
    let target = parts.next()?;
    let path = target.split(['?', '#']).next().unwrap_or("/").to_owned();
    let host = lines
        .take_while(|l| !l.is_empty())
        .filter_map(|l| l.split_once(':'))
        .find(|(name, _)| name.trim().eq_ignore_ascii_case("host"))
        .map(|(_, value)| strip_port(value.trim()).to_owned());
    Some((path, host))
}

fn strip_port(host: &str) -> &str {
    if host.starts_with('[') {
        return host.split(']').next().map_or(host, |h| &h[1..]);
    }
    host.rsplit_once(':')
        .filter(|(_, port)| port.chars().all(|c| c.is_ascii_digit()))
        .map_or(host, |(h, _)| h)
}

async fn read_head<S: AsyncRead + Unpin>(client: &mut S) -> Result<Vec<u8>, ProxyError> {
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        if head.len() > MAX_HEAD {
            return Err(ProxyError::BadRequest);
        }
        let n = client.read(&mut buf).await?;
        if n == 0 {
            return Err(ProxyError::BadRequest);
        }
        head.extend_from_slice(&buf[..n]);
    }
    Ok(head)
}

async fn respond<S: AsyncWrite + Unpin>(client: &mut S, status: &str) -> Result<(), ProxyError> {
    let body = format!("{status}\n");
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\nServer: kontinuum-gateway-standin\r\n\r\n{body}",
        body.len()
    );
    client.write_all(response.as_bytes()).await?;
    client.shutdown().await?;
    Ok(())
}

async fn serve<S>(
    mut client: S,
    listeners: &[ListenerConfig],
    sni: Option<&str>,
) -> Result<(), ProxyError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let head = tokio::time::timeout(CLIENT_TIMEOUT, read_head(&mut client))
        .await
        .map_err(|_| ProxyError::Timeout)??;
    let Some((path, host)) = parse_head(&head) else {
        return respond(&mut client, "400 Bad Request").await;
    };
    let host = host.or_else(|| sni.map(str::to_owned)).unwrap_or_default();
    let Some(listener) = select_listener(listeners, Some(&host)) else {
        return respond(&mut client, "404 Not Found").await;
    };
    let Some(rule) = select_rule(&listener.routes, &host, &path) else {
        return respond(&mut client, "404 Not Found").await;
    };
    let endpoint = match &rule.backends {
        Backends::Invalid => return respond(&mut client, "500 Internal Server Error").await,
        Backends::Endpoints(addrs, _) if addrs.is_empty() => {
            return respond(&mut client, "503 Service Unavailable").await;
        }
        Backends::Endpoints(addrs, next) => {
            addrs[next.fetch_add(1, Ordering::Relaxed) % addrs.len()]
        }
    };
    let upstream = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(endpoint)).await;
    let Ok(Ok(mut upstream)) = upstream else {
        tracing::debug!(listener = %listener.id, %endpoint, "endpoint unreachable");
        return respond(&mut client, "502 Bad Gateway").await;
    };
    upstream.write_all(&head).await?;
    tokio::io::copy_bidirectional(&mut client, &mut upstream).await?;
    Ok(())
}

/// Builds the TLS configuration of a listener from its Secret's `tls.crt` and `tls.key`
/// (HTTP/1.1 only: the relay reads HTTP/1 request heads).
pub fn tls_config(cert_pem: &[u8], key_pem: &[u8]) -> Result<Arc<rustls::ServerConfig>, String> {
    use rustls::pki_types::pem::PemObject as _;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| "tls.crt is not a PEM certificate chain".to_owned())?;
    if certs.is_empty() {
        return Err("tls.crt holds no certificate".into());
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem)
        .map_err(|_| "tls.key holds no private key".to_owned())?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| format!("the certificate and key are unusable: {e}"))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    fn rule(matches: Vec<PathMatch>, port: u16) -> RuleConfig {
        RuleConfig {
            matches,
            backends: Backends::endpoints(vec![addr(port)]),
        }
    }

    fn endpoint(rule: Option<&RuleConfig>) -> Option<u16> {
        match &rule?.backends {
            Backends::Endpoints(a, _) => a.first().map(SocketAddr::port),
            Backends::Invalid => None,
        }
    }

    #[test]
    fn host_names_match_as_gateway_api_says() {
        assert!(host_matches("a.example.com", "A.example.com"));
        assert!(host_matches("*.example.com", "a.example.com"));
        assert!(host_matches("*.example.com", "a.b.example.com"));
        assert!(!host_matches("*.example.com", "example.com"));
        assert!(!host_matches("*.example.com", "aexample.com"));
        assert!(!host_matches("a.example.com", "b.example.com"));
    }

    #[test]
    fn the_most_specific_listener_wins() {
        let l = |id: &str, host: Option<&str>| ListenerConfig {
            id: id.into(),
            hostname: host.map(str::to_owned),
            tls: None,
            routes: Vec::new(),
        };
        let listeners = vec![
            l("any", None),
            l("wild", Some("*.example.com")),
            l("exact", Some("a.example.com")),
        ];
        let pick = |h| select_listener(&listeners, Some(h)).map(|l| l.id.clone());
        assert_eq!(pick("a.example.com").as_deref(), Some("exact"));
        assert_eq!(pick("b.example.com").as_deref(), Some("wild"));
        assert_eq!(pick("other.org").as_deref(), Some("any"));
        assert!(select_listener(&listeners[2..], Some("other.org")).is_none());
    }

    #[test]
    fn paths_match_segment_wise_and_exact_beats_prefix() {
        let routes = vec![RouteConfig {
            id: "r".into(),
            hostnames: vec!["a.example.com".into()],
            rules: vec![
                rule(vec![PathMatch::Prefix("/".into())], 1),
                rule(vec![PathMatch::Prefix("/api".into())], 2),
                rule(vec![PathMatch::Exact("/api/health".into())], 3),
                rule(vec![PathMatch::Never], 4),
            ],
        }];
        let pick = |p| endpoint(select_rule(&routes, "a.example.com", p));
        assert_eq!(pick("/"), Some(1));
        assert_eq!(pick("/apix"), Some(1));
        assert_eq!(pick("/api"), Some(2));
        assert_eq!(pick("/api/v1"), Some(2));
        assert_eq!(pick("/api/health"), Some(3));
        assert_eq!(endpoint(select_rule(&routes, "b.example.com", "/")), None);
    }

    #[test]
    fn an_exact_host_route_beats_a_catch_all() {
        let routes = vec![
            RouteConfig {
                id: "all".into(),
                hostnames: vec![],
                rules: vec![rule(vec![PathMatch::Prefix("/".into())], 1)],
            },
            RouteConfig {
                id: "a".into(),
                hostnames: vec!["a.example.com".into()],
                rules: vec![rule(vec![PathMatch::Prefix("/".into())], 2)],
            },
        ];
        assert_eq!(
            endpoint(select_rule(&routes, "a.example.com", "/x")),
            Some(2)
        );
        assert_eq!(
            endpoint(select_rule(&routes, "b.example.com", "/x")),
            Some(1)
        );
    }

    #[test]
    fn request_heads_parse() {
        let (path, host) =
            parse_head(b"GET /v1/x?y=1 HTTP/1.1\r\nhost: a.example.com:8443\r\n\r\n").unwrap();
        assert_eq!(path, "/v1/x");
        assert_eq!(host.as_deref(), Some("a.example.com"));
        let (_, host) = parse_head(b"GET / HTTP/1.1\r\nHost: [::1]:80\r\n\r\n").unwrap();
        assert_eq!(host.as_deref(), Some("::1"));
        let (_, host) = parse_head(b"GET / HTTP/1.0\r\n\r\n").unwrap();
        assert_eq!(host, None);
    }

    #[test]
    fn tls_configs_need_a_matching_pair() {
        use crate::pki::{CertificateRequest, KeyAlgorithm, Signer, issue};
        let request = CertificateRequest {
            dns_names: vec!["a.example.com".into()],
            not_before: 1_700_000_000,
            not_after: 1_900_000_000,
            ..CertificateRequest::default()
        };
        let a = issue(&request, KeyAlgorithm::EcdsaP256, &Signer::SelfSigned).unwrap();
        let b = issue(&request, KeyAlgorithm::EcdsaP256, &Signer::SelfSigned).unwrap();
        assert!(tls_config(a.cert_pem.as_bytes(), a.key_pem.as_bytes()).is_ok());
        assert!(tls_config(a.cert_pem.as_bytes(), b"").is_err());
        assert!(tls_config(b"", a.key_pem.as_bytes()).is_err());
        // A key of another certificate: rustls refuses the pair.
        assert!(tls_config(a.cert_pem.as_bytes(), b.key_pem.as_bytes()).is_err());
    }

    /// A backend answering every request with 200 and `ok`.
    async fn backend() -> SocketAddr {
        let listener = TcpListener::bind(addr(0)).await.unwrap();
        let local = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let _ = read_head(&mut stream).await;
                    let _ = stream
                        .write_all(
                            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok",
                        )
                        .await;
                    let _ = stream.shutdown().await;
                });
            }
        });
        local
    }

    async fn get(
        port: u16,
        sni: &str,
        host: &str,
        path: &str,
        roots: &Arc<rustls::ClientConfig>,
    ) -> std::io::Result<String> {
        let tcp = TcpStream::connect(addr(port)).await?;
        let name = rustls::pki_types::ServerName::try_from(sni.to_owned()).unwrap();
        let mut tls = tokio_rustls::TlsConnector::from(roots.clone())
            .connect(name, tcp)
            .await?;
        tls.write_all(format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n").as_bytes())
            .await?;
        let mut response = String::new();
        let _ = tls.read_to_string(&mut response).await;
        Ok(response.lines().next().unwrap_or_default().to_owned())
    }

    #[tokio::test]
    #[allow(clippy::too_many_lines)] // one scenario: serve, reconfigure, refuse, close
    async fn the_data_plane_terminates_tls_relays_and_answers_itself() {
        use crate::pki::{CertificateRequest, KeyAlgorithm, Signer, issue};
        let issued = issue(
            &CertificateRequest {
                dns_names: vec!["a.example.com".into()],
                not_before: 1_700_000_000,
                not_after: 2_000_000_000,
                ..CertificateRequest::default()
            },
            KeyAlgorithm::EcdsaP256,
            &Signer::SelfSigned,
        )
        .unwrap();
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(crate::pki::first_certificate(issued.cert_pem.as_bytes()).unwrap())
            .unwrap();
        let client = Arc::new(
            rustls::ClientConfig::builder_with_provider(Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth(),
        );
        let dead = {
            let l = TcpListener::bind(addr(0)).await.unwrap();
            l.local_addr().unwrap()
        };
        let route = |rules| RouteConfig {
            id: "ns/r".into(),
            hostnames: vec!["a.example.com".into()],
            rules,
        };
        let config = |rules| PortConfig {
            tls: true,
            listeners: vec![ListenerConfig {
                id: "ns/gw/https".into(),
                hostname: Some("a.example.com".into()),
                tls: Some(
                    tls_config(issued.cert_pem.as_bytes(), issued.key_pem.as_bytes()).unwrap(),
                ),
                routes: vec![route(rules)],
            }],
        };
        let port = TcpListener::bind(addr(0))
            .await
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut plane = DataPlane::new(IpAddr::from([127, 0, 0, 1]));
        let bound = plane
            .apply(BTreeMap::from([(
                port,
                config(vec![
                    rule(vec![PathMatch::Prefix("/".into())], backend().await.port()),
                    RuleConfig {
                        matches: vec![PathMatch::Exact("/empty".into())],
                        backends: Backends::endpoints(Vec::new()),
                    },
                    RuleConfig {
                        matches: vec![PathMatch::Exact("/invalid".into())],
                        backends: Backends::Invalid,
                    },
                    rule(vec![PathMatch::Exact("/dead".into())], dead.port()),
                ]),
            )]))
            .await;
        assert_eq!(bound[&port], Ok(()));
        let sni = "a.example.com";
        let status = |path: &'static str, host: &'static str| {
            let client = client.clone();
            async move { get(port, sni, host, path, &client).await.unwrap() }
        };
        assert_eq!(status("/x", sni).await, "HTTP/1.1 200 OK");
        assert_eq!(
            status("/empty", sni).await,
            "HTTP/1.1 503 Service Unavailable"
        );
        assert_eq!(
            status("/invalid", sni).await,
            "HTTP/1.1 500 Internal Server Error"
        );
        assert_eq!(status("/dead", sni).await, "HTTP/1.1 502 Bad Gateway");
        assert_eq!(
            status("/", "other.example.com").await,
            "HTTP/1.1 404 Not Found"
        );
        // No listener for another server name: no handshake.
        assert!(get(port, "b.example.com", sni, "/", &client).await.is_err());

        // A new configuration is seen by new connections; the port stays bound.
        let bound = plane
            .apply(BTreeMap::from([(port, config(Vec::new()))]))
            .await;
        assert_eq!(bound[&port], Ok(()));
        assert_eq!(status("/x", sni).await, "HTTP/1.1 404 Not Found");

        // A port another process holds is reported, not fatal.
        let held = TcpListener::bind(addr(0)).await.unwrap();
        let held_port = held.local_addr().unwrap().port();
        let bound = plane
            .apply(BTreeMap::from([(held_port, config(Vec::new()))]))
            .await;
        assert!(bound[&held_port].is_err());
        // ... and the port no longer wanted was closed.
        assert!(TcpStream::connect(addr(port)).await.is_err());
    }
}
