//! The admin server on `--admin-addr`: `/healthz` (the process and runtime are alive),
//! `/readyz` (watches have synced and, when leader election is on, the lease is held) and
//! `/metrics` (OpenMetrics). It stops with the shared [`Shutdown`].

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use futures::{Stream, StreamExt as _};
use kube::runtime::watcher;
use prometheus_client::registry::Registry;

use crate::metrics::{OPENMETRICS_CONTENT_TYPE, encode};
use crate::shutdown::Shutdown;

/// What `/readyz` reports. Cheap to clone; all clones share state.
#[derive(Clone, Debug)]
pub struct Readiness {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    synced: AtomicBool,
    expected_watches: AtomicUsize,
    synced_watches: AtomicUsize,
    leader_required: bool,
    leader: AtomicBool,
}

impl Readiness {
    /// Not ready until [`set_synced`](Self::set_synced) (and, if `leader_required`,
    /// [`set_leader`](Self::set_leader)`(true)`).
    pub fn new(leader_required: bool) -> Self {
        Self {
            inner: Arc::new(Inner {
                synced: AtomicBool::new(false),
                expected_watches: AtomicUsize::new(0),
                synced_watches: AtomicUsize::new(0),
                leader_required,
                leader: AtomicBool::new(false),
            }),
        }
    }

    /// Every watch has delivered its initial list (for binaries that track it themselves;
    /// controllers use [`track_sync`] on each watch instead).
    pub fn set_synced(&self) {
        self.inner.synced.store(true, Ordering::Release);
    }

    fn synced(&self) -> bool {
        if self.inner.synced.load(Ordering::Acquire) {
            return true;
        }
        let expected = self.inner.expected_watches.load(Ordering::Acquire);
        expected > 0 && self.inner.synced_watches.load(Ordering::Acquire) >= expected
    }

    /// Whether this replica holds the leader lease.
    pub fn set_leader(&self, leader: bool) {
        self.inner.leader.store(leader, Ordering::Release);
    }

    /// `Ok` when ready, else what is missing.
    pub fn check(&self) -> Result<(), &'static str> {
        if !self.synced() {
            return Err("watches have not synced yet");
        }
        if self.inner.leader_required && !self.inner.leader.load(Ordering::Acquire) {
            return Err("not the leader");
        }
        Ok(())
    }
}

/// The watch every operator opens on the hub: `api` with `config`, retried with the
/// watcher's default backoff, its objects trimmed for the cache
/// ([`crate::trim::for_cache`]), counted among the watches `/readyz` waits for
/// ([`track_sync`]).
pub fn hub_watch<K>(
    api: kube::Api<K>,
    config: watcher::Config,
    readiness: &Readiness,
) -> impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + use<K>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    use kube::runtime::WatchStreamExt as _;
    track_sync(
        watcher::watcher(api, config)
            .default_backoff()
            .modify(crate::trim::for_cache),
        readiness,
    )
}

/// Counts `stream` (a watcher's event stream) among the watches `/readyz` waits for: the
/// process is ready once every tracked watch has delivered its initial list (`InitDone`).
///
/// Why not `Store::wait_until_ready`: in kube-runtime 5.0 a second task waiting on the same
/// store (the Controller already waits on its own) can lose its wake-up, so readiness would
/// hang. Observing the stream itself has no such race.
pub fn track_sync<S, K>(stream: S, readiness: &Readiness) -> impl Stream<Item = S::Item> + use<S, K>
where
    S: Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
{
    readiness
        .inner
        .expected_watches
        .fetch_add(1, Ordering::AcqRel);
    let readiness = readiness.clone();
    let mut seen = false;
    stream.inspect(move |event| {
        if !seen && matches!(event, Ok(watcher::Event::InitDone)) {
            seen = true;
            readiness
                .inner
                .synced_watches
                .fetch_add(1, Ordering::AcqRel);
        }
    })
}

#[derive(Clone)]
struct AppState {
    readiness: Readiness,
    registry: Arc<Registry>,
}

/// The admin routes.
pub fn router(readiness: Readiness, registry: Arc<Registry>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(AppState {
            readiness,
            registry,
        })
}

async fn readyz(State(state): State<AppState>) -> impl IntoResponse {
    match state.readiness.check() {
        Ok(()) => (StatusCode::OK, "ok"),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, why),
    }
}

async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    match encode(&state.registry) {
        Ok(body) => ([(header::CONTENT_TYPE, OPENMETRICS_CONTENT_TYPE)], body).into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

/// Serves `router` on `addr` until `shutdown` triggers.
pub async fn serve(addr: SocketAddr, router: Router, shutdown: Shutdown) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(addr = %listener.local_addr()?, "admin server listening");
    axum::serve(listener, router)
        .with_graceful_shutdown(async move { shutdown.wait().await })
        .await
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use http::Request;
    use tower::ServiceExt as _;

    use super::*;
    use crate::metrics::ControllerMetrics;

    async fn get(router: &Router, path: &str) -> (StatusCode, String, String) {
        let response = router
            .clone()
            .oneshot(Request::get(path).body(Body::empty()).unwrap())
            .await
            .unwrap();
        let status = response.status();
        let content_type = response
            .headers()
            .get(header::CONTENT_TYPE)
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default();
        let body = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .unwrap();
        (
            status,
            content_type,
            String::from_utf8(body.to_vec()).unwrap(),
        )
    }

    #[tokio::test]
    async fn readyz_needs_sync_and_the_lease() {
        let readiness = Readiness::new(true);
        let router = router(readiness.clone(), Arc::new(Registry::default()));
        assert_eq!(get(&router, "/healthz").await.0, StatusCode::OK);
        let (status, _, body) = get(&router, "/readyz").await;
        assert_eq!(
            (status, body.as_str()),
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "watches have not synced yet"
            )
        );
        readiness.set_synced();
        assert_eq!(get(&router, "/readyz").await.2, "not the leader");
        readiness.set_leader(true);
        assert_eq!(get(&router, "/readyz").await.0, StatusCode::OK);
        readiness.set_leader(false);
        assert_eq!(
            get(&router, "/readyz").await.0,
            StatusCode::SERVICE_UNAVAILABLE
        );
    }

    #[tokio::test]
    async fn readyz_waits_for_every_tracked_watch() {
        use futures::stream;
        use k8s_openapi::api::core::v1::ConfigMap;

        let readiness = Readiness::new(false);
        let events = || {
            stream::iter(vec![
                Ok(watcher::Event::<ConfigMap>::Init),
                Ok(watcher::Event::InitDone),
                Ok(watcher::Event::InitDone), // a re-list counts once
            ])
        };
        let a = track_sync(events(), &readiness);
        let b = track_sync(events(), &readiness);
        assert!(readiness.check().is_err());
        a.collect::<Vec<_>>().await;
        assert!(readiness.check().is_err(), "one of two watches synced");
        b.collect::<Vec<_>>().await;
        assert!(readiness.check().is_ok());
    }

    #[tokio::test]
    async fn metrics_are_openmetrics() {
        let mut registry = Registry::default();
        let metrics = ControllerMetrics::register(&mut registry, "instance-discovery");
        metrics.failure("ProbeFailed");
        let router = router(Readiness::new(false), Arc::new(registry));
        let (status, content_type, body) = get(&router, "/metrics").await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(content_type, OPENMETRICS_CONTENT_TYPE);
        assert!(body.contains(
            "kontinuum_instance_discovery_reconcile_errors_total{reason=\"ProbeFailed\"} 1"
        ));
    }

    #[tokio::test]
    async fn serve_stops_on_shutdown() {
        let shutdown = Shutdown::new();
        let server = tokio::spawn(serve(
            "127.0.0.1:0".parse().unwrap(),
            router(Readiness::new(false), Arc::new(Registry::default())),
            shutdown.clone(),
        ));
        shutdown.trigger(crate::shutdown::Reason::Signal);
        tokio::time::timeout(std::time::Duration::from_secs(5), server)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
    }
}
