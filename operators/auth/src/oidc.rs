//! [`OidcVerifier`]: verifies bearer tokens against the keys an OIDC issuer publishes.
//!
//! Discovery: `<issuer>/.well-known/openid-configuration` (the issuer without its trailing
//! slash), whose `issuer` must equal the configured issuer exactly, and whose `jwks_uri`
//! must be `https` (or `http` to a loopback host). Keys: the JWKS at `jwks_uri`, parsed by
//! [`KeySet`]. Both are fetched over HTTPS (rustls, ring) trusting the system's roots plus
//! an optional extra CA bundle ([`OidcVerifier::with_ca`]), each call within the timeout.
//!
//! Caching: the keys are fetched on first use and kept. A token whose `kid` (and algorithm)
//! matches no cached key triggers a refresh, so a key rotation at the issuer is picked up on
//! the first token signed with the new key; keys older than the maximum age are refreshed
//! on the next use (the old ones still serve if that fails). Every fetch attempt after the
//! first, successful or not, is at most one per [minimum refresh interval]
//! (default [`DEFAULT_MIN_REFRESH_INTERVAL`]), and concurrent callers share one fetch: a
//! stream of garbage tokens with random `kid`s costs the issuer at most one JWKS request per
//! interval. Only tokens that parse, use an accepted algorithm and name the configured
//! issuer get that far.
//!
//! [minimum refresh interval]: OidcVerifier::with_min_refresh_interval

use std::fmt;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rustls::RootCertStore;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject as _;
use serde::Deserialize;
use tracing::{debug, info, warn};

use crate::http_client::HttpsClient;
use crate::jwk::{JwksError, KeySet};
use crate::mode::{OidcSettings, UrlProblem, check_url};
use crate::token::{Expectations, TokenError, Unverified, VerifiedClaims};

/// The default for [`OidcVerifier::with_min_refresh_interval`].
pub const DEFAULT_MIN_REFRESH_INTERVAL: Duration = Duration::from_secs(10);
/// The default for [`OidcVerifier::with_max_key_age`].
pub const DEFAULT_MAX_KEY_AGE: Duration = Duration::from_secs(3600);
/// The discovery document's path below the issuer.
pub const DISCOVERY_PATH: &str = "/.well-known/openid-configuration";

/// Time, for the verifier: wall-clock seconds for the token's claims, and a monotonic
/// duration for the refresh rate limit. Swappable so tests control both.
pub trait Clock: Send + Sync + fmt::Debug {
    /// Seconds since the Unix epoch.
    fn unix_seconds(&self) -> i64;
    /// Time since an arbitrary fixed origin; never goes backwards.
    fn monotonic(&self) -> Duration;
}

/// The real clock.
#[derive(Debug)]
pub struct SystemClock {
    origin: Instant,
}

impl SystemClock {
    /// A clock whose monotonic origin is now.
    pub fn new() -> Self {
        Self {
            origin: Instant::now(),
        }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    fn unix_seconds(&self) -> i64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
    }

    fn monotonic(&self) -> Duration {
        self.origin.elapsed()
    }
}

/// Why a document could not be fetched.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// The URL could not be made into a request.
    #[error("invalid request URL")]
    Url,
    /// No response within the timeout.
    #[error("timed out")]
    Timeout,
    /// Connecting, TLS, or the exchange failed.
    #[error("request failed")]
    Connect(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// A status other than 200.
    #[error("HTTP status {0}")]
    Status(u16),
    /// The body is larger than 1 MiB.
    #[error("response body is too large")]
    TooLarge,
    /// Reading the body failed.
    #[error("reading the response body")]
    Body(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The body is not the JSON expected.
    #[error("response is not the expected JSON")]
    Json(#[source] serde_json::Error),
}

/// Errors of [`OidcVerifier`]: the token's fault ([`OidcError::Token`]), or the issuer's
/// or the configuration's.
#[derive(Debug, thiserror::Error)]
pub enum OidcError {
    /// The token is refused.
    #[error(transparent)]
    Token(#[from] TokenError),
    /// The configured issuer is not an acceptable URL.
    #[error("the OIDC issuer URL is invalid: {0}")]
    IssuerUrl(UrlProblem),
    /// The HTTPS client could not be built.
    #[error("building the HTTPS client")]
    Tls(#[source] rustls::Error),
    /// The extra CA bundle holds no PEM certificate.
    #[error("the CA bundle holds no usable PEM certificate")]
    CaBundle,
    /// The discovery document could not be fetched.
    #[error("fetching the OIDC discovery document")]
    Discovery(#[source] FetchError),
    /// The discovery document names another issuer.
    #[error("the OIDC discovery document names another issuer")]
    DiscoveryIssuer,
    /// The discovery document's `jwks_uri` is not acceptable.
    #[error("the OIDC discovery document's jwks_uri is invalid: {0}")]
    JwksUri(UrlProblem),
    /// The JWKS could not be fetched.
    #[error("fetching the OIDC issuer's JWKS")]
    Jwks(#[source] FetchError),
    /// The JWKS is not a valid JWK Set.
    #[error("the OIDC issuer's JWKS is invalid")]
    JwksDocument(#[source] JwksError),
    /// No keys were ever fetched, and the last attempt failed less than the minimum refresh
    /// interval ago.
    #[error("the OIDC issuer's keys are not available yet")]
    KeysUnavailable,
}

impl OidcError {
    /// Stable CamelCase, for metrics and logs.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Token(e) => e.reason(),
            Self::IssuerUrl(_) => "InvalidIssuerUrl",
            Self::Tls(_) => "TlsConfig",
            Self::CaBundle => "CaBundle",
            Self::Discovery(FetchError::Timeout) | Self::Jwks(FetchError::Timeout) => {
                "IssuerTimeout"
            }
            Self::Discovery(_) => "DiscoveryFailed",
            Self::DiscoveryIssuer => "DiscoveryIssuerMismatch",
            Self::JwksUri(_) => "InvalidJwksUri",
            Self::Jwks(_) => "JwksFetchFailed",
            Self::JwksDocument(_) => "InvalidJwks",
            Self::KeysUnavailable => "KeysUnavailable",
        }
    }

    /// Whether the token itself is refused (as opposed to the issuer being unusable).
    pub fn is_token_error(&self) -> bool {
        matches!(self, Self::Token(_))
    }
}

/// The keys as last fetched.
struct Snapshot {
    keys: KeySet,
    /// When they were fetched (monotonic); `None` before the first success.
    fetched_at: Option<Duration>,
    /// Bumped on every successful fetch.
    generation: u64,
}

/// The state of fetching, held (by one caller at a time) across a fetch.
struct Fetcher {
    /// From the last good discovery; forgotten when the JWKS fetch fails.
    jwks_uri: Option<String>,
    last_attempt: Option<Duration>,
}

#[derive(Deserialize)]
struct Discovery {
    issuer: String,
    jwks_uri: String,
}

/// Verifies OIDC bearer tokens of one issuer for one client id. Cheap to share behind an
/// `Arc`; all methods take `&self`.
pub struct OidcVerifier {
    issuer: String,
    client_id: String,
    discovery_url: String,
    roots: RootCertStore,
    timeout: Duration,
    http: HttpsClient,
    clock: Arc<dyn Clock>,
    min_refresh_interval: Duration,
    max_key_age: Duration,
    snapshot: RwLock<Arc<Snapshot>>,
    fetcher: tokio::sync::Mutex<Fetcher>,
}

impl fmt::Debug for OidcVerifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OidcVerifier")
            .field("issuer", &self.issuer)
            .field("client_id", &self.client_id)
            .finish_non_exhaustive()
    }
}

impl OidcVerifier {
    /// A verifier for `settings.issuer_url` and `settings.client_id`, trusting the system's
    /// roots, with `timeout` on every HTTP call. Does no I/O besides reading the system's
    /// roots: keys are fetched on first use.
    pub fn new(settings: &OidcSettings, timeout: Duration) -> Result<Self, OidcError> {
        check_url(&settings.issuer_url).map_err(OidcError::IssuerUrl)?;
        let mut roots = RootCertStore::empty();
        let native = rustls_native_certs::load_native_certs();
        let (added, _ignored) = roots.add_parsable_certificates(native.certs);
        if added == 0 {
            // Fine for a private issuer trusted through `with_ca`; fatal for a public one,
            // which then fails on its first fetch.
            warn!("no system trust roots found; only an explicitly configured CA is trusted");
        }
        Ok(Self {
            issuer: settings.issuer_url.clone(),
            client_id: settings.client_id.clone(),
            discovery_url: format!(
                "{}{DISCOVERY_PATH}",
                settings.issuer_url.trim_end_matches('/')
            ),
            http: HttpsClient::new(roots.clone(), timeout).map_err(OidcError::Tls)?,
            roots,
            timeout,
            clock: Arc::new(SystemClock::new()),
            min_refresh_interval: DEFAULT_MIN_REFRESH_INTERVAL,
            max_key_age: DEFAULT_MAX_KEY_AGE,
            snapshot: RwLock::new(Arc::new(Snapshot {
                keys: KeySet::default(),
                fetched_at: None,
                generation: 0,
            })),
            fetcher: tokio::sync::Mutex::new(Fetcher {
                jwks_uri: None,
                last_attempt: None,
            }),
        })
    }

    /// Also trusts the certificates of a PEM bundle (a private issuer's CA).
    pub fn with_ca(mut self, pem: &[u8]) -> Result<Self, OidcError> {
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(pem)
            .filter_map(Result::ok)
            .collect();
        let (added, _ignored) = self.roots.add_parsable_certificates(certs);
        if added == 0 {
            return Err(OidcError::CaBundle);
        }
        self.http = HttpsClient::new(self.roots.clone(), self.timeout).map_err(OidcError::Tls)?;
        Ok(self)
    }

    /// At most one fetch per `interval` after the first (default 10 s).
    #[must_use]
    pub fn with_min_refresh_interval(mut self, interval: Duration) -> Self {
        self.min_refresh_interval = interval;
        self
    }

    /// Keys older than `age` are refreshed on their next use (default 1 h).
    #[must_use]
    pub fn with_max_key_age(mut self, age: Duration) -> Self {
        self.max_key_age = age;
        self
    }

    /// Uses `clock` instead of the system's.
    #[must_use]
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// The issuer tokens must name.
    pub fn issuer(&self) -> &str {
        &self.issuer
    }

    /// The client id tokens must have in `aud`.
    pub fn client_id(&self) -> &str {
        &self.client_id
    }

    /// Verifies a bearer token (without the `Bearer ` prefix).
    pub async fn verify(&self, token: &str) -> Result<VerifiedClaims, OidcError> {
        let token = Unverified::parse(token)?;
        token.check_issuer(&self.issuer)?;
        let mut snapshot = self.snapshot();
        if token.has_candidate(&snapshot.keys) {
            if self.is_stale(&snapshot) {
                snapshot = self.refresh_stale(snapshot).await;
            }
        } else {
            snapshot = self.refresh_for(&token, snapshot.generation).await?;
        }
        let expect = Expectations {
            issuer: &self.issuer,
            audience: &self.client_id,
        };
        Ok(token.verify(&snapshot.keys, &expect, self.clock.unix_seconds())?)
    }

    /// Fetches the keys now, unless a fetch was attempted less than the minimum refresh
    /// interval ago. Returns how many usable keys the issuer publishes. For start-up checks
    /// and readiness; [`verify`](Self::verify) fetches on its own when it needs to.
    pub async fn refresh(&self) -> Result<usize, OidcError> {
        let seen = self.snapshot().generation;
        let mut fetcher = self.fetcher.lock().await;
        let current = self.snapshot();
        if current.generation != seen || !self.may_fetch(&fetcher) {
            return if current.fetched_at.is_some() {
                Ok(current.keys.keys().len())
            } else {
                Err(OidcError::KeysUnavailable)
            };
        }
        Ok(self.fetch(&mut fetcher).await?.keys.keys().len())
    }

    fn snapshot(&self) -> Arc<Snapshot> {
        self.snapshot
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn is_stale(&self, snapshot: &Snapshot) -> bool {
        snapshot
            .fetched_at
            .is_some_and(|at| self.clock.monotonic().saturating_sub(at) >= self.max_key_age)
    }

    fn may_fetch(&self, fetcher: &Fetcher) -> bool {
        fetcher.last_attempt.is_none_or(|last| {
            self.clock.monotonic().saturating_sub(last) >= self.min_refresh_interval
        })
    }

    /// The cached keys are old but hold the token's key: refresh if nobody else is and the
    /// rate limit allows, and keep using the old keys if that fails.
    async fn refresh_stale(&self, snapshot: Arc<Snapshot>) -> Arc<Snapshot> {
        let Ok(mut fetcher) = self.fetcher.try_lock() else {
            return snapshot;
        };
        if !self.may_fetch(&fetcher) {
            return snapshot;
        }
        match self.fetch(&mut fetcher).await {
            Ok(fresh) => fresh,
            Err(err) => {
                warn!(
                    reason = err.reason(),
                    error = &err as &dyn std::error::Error,
                    "refreshing the OIDC issuer's keys failed; using the cached keys"
                );
                snapshot
            }
        }
    }

    /// No cached key fits the token: fetch (once per interval, one caller at a time).
    async fn refresh_for(
        &self,
        token: &Unverified<'_>,
        seen: u64,
    ) -> Result<Arc<Snapshot>, OidcError> {
        let mut fetcher = self.fetcher.lock().await;
        let current = self.snapshot();
        if current.generation != seen && token.has_candidate(&current.keys) {
            // Another caller fetched while we waited.
            return Ok(current);
        }
        if !self.may_fetch(&fetcher) {
            debug!(
                kid = token.kid().unwrap_or_default(),
                "no cached OIDC key fits the token; refresh is rate-limited"
            );
            return Err(if current.fetched_at.is_some() {
                OidcError::Token(TokenError::UnknownKey)
            } else {
                OidcError::KeysUnavailable
            });
        }
        self.fetch(&mut fetcher).await
    }

    /// One fetch attempt: discovery (unless known), then the JWKS. Holds the fetcher lock.
    async fn fetch(&self, fetcher: &mut Fetcher) -> Result<Arc<Snapshot>, OidcError> {
        fetcher.last_attempt = Some(self.clock.monotonic());
        let result = self.fetch_keys(fetcher).await;
        if result.is_err() {
            // Discover again next time: the issuer may have moved its keys.
            fetcher.jwks_uri = None;
        }
        let keys = result?;
        let mut guard = self
            .snapshot
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        let fresh = Arc::new(Snapshot {
            fetched_at: Some(self.clock.monotonic()),
            generation: guard.generation + 1,
            keys,
        });
        *guard = fresh.clone();
        drop(guard);
        info!(
            keys = fresh.keys.keys().len(),
            skipped = fresh.keys.skipped(),
            "fetched the OIDC issuer's signing keys"
        );
        Ok(fresh)
    }

    async fn fetch_keys(&self, fetcher: &mut Fetcher) -> Result<KeySet, OidcError> {
        let jwks_uri = if let Some(uri) = &fetcher.jwks_uri {
            uri.clone()
        } else {
            let discovery: Discovery = self
                .http
                .get_json(&self.discovery_url)
                .await
                .map_err(OidcError::Discovery)?;
            if discovery.issuer != self.issuer {
                return Err(OidcError::DiscoveryIssuer);
            }
            check_url(&discovery.jwks_uri).map_err(OidcError::JwksUri)?;
            fetcher.jwks_uri = Some(discovery.jwks_uri.clone());
            discovery.jwks_uri
        };
        let jwks = self
            .http
            .get_bytes(&jwks_uri)
            .await
            .map_err(OidcError::Jwks)?;
        KeySet::from_jwks_json(&jwks).map_err(OidcError::JwksDocument)
    }
}
