//! The zone agent's endpoint on `--addr` (what the zone's Gateway exposes as
//! `<zone>.<region>.<domain>`):
//!
//! * `/healthz`: the process is alive (unauthenticated, for probes);
//! * `/readyz`: the zone is registered in the hub's store (unauthenticated, for probes);
//! * `/version` and `/status`: behind the installation's auth mode (an OIDC bearer token of
//!   an admin, or nothing in anonymous mode), via [`kontinuum_auth::require_auth`].
//!
//! `/status` is JSON: `region`, `zone`, `name`, `version`, `registered`, `leaseId`,
//! `lastHeartbeatTime`, `storeReachable`.

use std::sync::{Arc, PoisonError};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::middleware;
use axum::response::IntoResponse;
use axum::routing::get;
use kontinuum_auth::{Authenticator, require_auth};
use serde::Serialize;

use crate::record::RegistrationKey;
use crate::zone::SharedState;

/// What `/status` answers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ZoneStatus {
    /// The zone's region.
    pub region: String,
    /// The zone.
    pub zone: String,
    /// The registration's name.
    pub name: String,
    /// The agent's version.
    pub version: String,
    /// Whether the registration is live.
    pub registered: bool,
    /// The registration's lease (decimal).
    pub lease_id: Option<i64>,
    /// The last heartbeat written (RFC 3339).
    pub last_heartbeat_time: Option<String>,
    /// Whether the last call to the store (through the relay) succeeded.
    pub store_reachable: bool,
}

/// What the routes read.
#[derive(Clone)]
pub struct Endpoint {
    /// The registration.
    pub key: RegistrationKey,
    /// The agent's version.
    pub version: String,
    /// The lease TTL, in seconds (a confirmation older than this is not registered).
    pub lease_ttl: i64,
    /// The agent's state.
    pub state: SharedState,
}

impl Endpoint {
    /// The current status.
    pub fn status(&self) -> ZoneStatus {
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        ZoneStatus {
            region: self.key.region().to_owned(),
            zone: self.key.zone().to_owned(),
            name: self.key.name().to_owned(),
            version: self.version.clone(),
            registered: state.registered(self.lease_ttl),
            lease_id: state.lease_id,
            last_heartbeat_time: state.last_heartbeat.map(|t| t.to_string()),
            store_reachable: state.store_reachable,
        }
    }
}

fn json<T: Serialize>(value: &T) -> impl IntoResponse + use<T> {
    (
        [(header::CONTENT_TYPE, "application/json")],
        serde_json::to_vec(value).unwrap_or_default(),
    )
}

async fn status(State(endpoint): State<Arc<Endpoint>>) -> impl IntoResponse {
    json(&endpoint.status())
}

async fn version(State(endpoint): State<Arc<Endpoint>>) -> impl IntoResponse {
    json(&serde_json::json!({ "version": endpoint.version }))
}

async fn readyz(State(endpoint): State<Arc<Endpoint>>) -> impl IntoResponse {
    if endpoint.status().registered {
        (StatusCode::OK, "ok")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not registered")
    }
}

/// The routes: `/version` and `/status` behind `auth`, the probes open.
pub fn router(endpoint: Arc<Endpoint>, auth: Authenticator) -> Router {
    let protected = Router::new()
        .route("/status", get(status))
        .route("/version", get(version))
        .route_layer(middleware::from_fn_with_state(auth, require_auth));
    Router::new()
        .merge(protected)
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .with_state(endpoint)
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::time::Duration;

    use axum::body::Body;
    use http::Request;
    use tower::ServiceExt as _;

    use super::*;
    use crate::zone::AgentState;

    async fn get(router: &Router, path: &str, bearer: Option<&str>) -> (StatusCode, String) {
        let mut request = Request::get(path);
        if let Some(token) = bearer {
            request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
        }
        let response = router
            .clone()
            .oneshot(request.body(Body::empty()).unwrap())
            .await
            .unwrap();
        let status = response.status();
        let body = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .unwrap();
        (status, String::from_utf8(body.to_vec()).unwrap())
    }

    fn endpoint() -> Arc<Endpoint> {
        Arc::new(Endpoint {
            key: RegistrationKey::new("eu", "1a", "agent").unwrap(),
            version: "0.1.0".into(),
            lease_ttl: 30,
            state: Arc::new(Mutex::new(AgentState::default())),
        })
    }

    #[tokio::test]
    async fn anonymous_mode_serves_the_status() {
        let endpoint = endpoint();
        let router = router(Arc::clone(&endpoint), Authenticator::anonymous());
        assert_eq!(get(&router, "/healthz", None).await.0, StatusCode::OK);
        assert_eq!(
            get(&router, "/readyz", None).await.0,
            StatusCode::SERVICE_UNAVAILABLE
        );
        {
            let mut state = endpoint.state.lock().unwrap();
            state.lease_id = Some(42);
            state.confirmed = Some(tokio::time::Instant::now());
            state.store_reachable = true;
            state.last_heartbeat = Some("2027-01-15T08:00:00Z".parse().unwrap());
        }
        assert_eq!(get(&router, "/readyz", None).await.0, StatusCode::OK);
        let (code, body) = get(&router, "/status", None).await;
        assert_eq!(code, StatusCode::OK);
        let status: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(
            status,
            serde_json::json!({
                "region": "eu", "zone": "1a", "name": "agent", "version": "0.1.0",
                "registered": true, "leaseId": 42,
                "lastHeartbeatTime": "2027-01-15T08:00:00Z", "storeReachable": true,
            })
        );
        let (_, body) = get(&router, "/version", None).await;
        assert_eq!(body, r#"{"version":"0.1.0"}"#);
    }

    #[tokio::test]
    async fn oidc_mode_refuses_requests_without_a_valid_token() {
        use kontinuum_auth::testing::{TestIssuer, TestKey};
        use kontinuum_auth::{Algorithm, AuthMode};

        let issuer = TestIssuer::start().await.unwrap();
        let key = TestKey::generate(Algorithm::Es256, "k1").unwrap();
        issuer.publish(&[&key]);
        let auth = Authenticator::with_ca(
            AuthMode::Oidc(issuer.settings("kontinuum", &["admins"])),
            Duration::from_secs(5),
            Some(issuer.ca_pem().as_bytes()),
        )
        .unwrap();
        let router = router(endpoint(), auth);
        let admin = key.token(&issuer.claims("kontinuum", "alice", &["admins"]));
        assert_eq!(
            get(&router, "/status", Some(&admin)).await.0,
            StatusCode::OK
        );
        assert_eq!(
            get(&router, "/version", Some(&admin)).await.0,
            StatusCode::OK
        );
        assert_eq!(
            get(&router, "/status", None).await.0,
            StatusCode::UNAUTHORIZED
        );
        assert_eq!(
            get(&router, "/status", Some("garbage")).await.0,
            StatusCode::UNAUTHORIZED
        );
        let other = key.token(&issuer.claims("someone-else", "alice", &["admins"]));
        assert_eq!(
            get(&router, "/status", Some(&other)).await.0,
            StatusCode::UNAUTHORIZED
        );
        let user = key.token(&issuer.claims("kontinuum", "bob", &["users"]));
        assert_eq!(
            get(&router, "/status", Some(&user)).await.0,
            StatusCode::FORBIDDEN
        );
        // Probes stay open.
        assert_eq!(get(&router, "/healthz", None).await.0, StatusCode::OK);
    }
}
