//! The `Kontinuum` conversion webhook: HTTPS `POST /convert` taking an
//! `apiextensions.k8s.io/v1` `ConversionReview` and converting each object between
//! `kontinuum.sh/v1alpha1` and `v1alpha2` with the pure conversions of
//! [`kontinuum_crds::conversion`]. Served by every replica (it writes nothing).
//!
//! One thing the pure conversions cannot keep on their own: `v1alpha1` holds the role in
//! the spec, `v1alpha2` in the status, and the API server drops the status of every write
//! to the main resource. A `v1alpha1` role that the location does not imply (a `Worker`
//! without region and zone, or a `ControlPlane` with them) therefore travels in the
//! annotation [`ROLE_ANNOTATION`] of the stored object, and comes back from it; the
//! annotation never shows in `v1alpha1`. So a `v1alpha1` round trip keeps every field
//! `v1alpha1` can express.
//!
//! A review that cannot be converted as a whole is answered with `result.status: Failure`
//! and a message naming the object; the body is bounded ([`MAX_REVIEW_BYTES`]).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::post;
use etcd_proxy::listen::{self, Incoming, Listen, ServerConn};
use etcd_proxy::tls::{ReloadingCert, TlsError};
use kontinuum_crds::v1alpha2::KontinuumRole;
use kontinuum_crds::{v1alpha1, v1alpha2};
use kontinuum_operator_common::shutdown::Shutdown;
use kube::core::Status;
use kube::core::conversion::{ConversionRequest, ConversionResponse, ConversionReview};
use rustls::ServerConfig;
use tokio_stream::StreamExt as _;
use tracing::{debug, info, warn};

use crate::crd::CONVERT_PATH;
use crate::metrics::Metrics;

/// The largest review accepted (a list of many objects converts in one review).
pub const MAX_REVIEW_BYTES: usize = 16 * 1024 * 1024;

/// Annotation on a stored (`v1alpha2`) object holding a `v1alpha1` role that its location
/// does not imply.
pub const ROLE_ANNOTATION: &str = "kontinuum.sh/v1alpha1-role";

const V1ALPHA1: &str = "kontinuum.sh/v1alpha1";
const V1ALPHA2: &str = "kontinuum.sh/v1alpha2";

/// Why one object could not be converted.
#[derive(Debug, thiserror::Error)]
pub enum ConvertError {
    /// The object names an API version or kind this webhook does not serve.
    #[error("cannot convert {kind} {api_version}")]
    Unsupported {
        /// Its `apiVersion`.
        api_version: String,
        /// Its `kind`.
        kind: String,
    },
    /// The object does not parse as a `Kontinuum` of its version.
    #[error("the object is not a valid {api_version} Kontinuum")]
    Invalid {
        /// Its `apiVersion`.
        api_version: &'static str,
        /// The parser's error.
        #[source]
        source: serde_json::Error,
    },
}

fn role_name(role: v1alpha1::KontinuumRole) -> &'static str {
    match role {
        v1alpha1::KontinuumRole::ControlPlane => "ControlPlane",
        v1alpha1::KontinuumRole::Worker => "Worker",
    }
}

fn up(object: serde_json::Value) -> Result<serde_json::Value, ConvertError> {
    let old: v1alpha1::Kontinuum =
        serde_json::from_value(object).map_err(|source| ConvertError::Invalid {
            api_version: V1ALPHA1,
            source,
        })?;
    let implied = KontinuumRole::for_location(old.spec.region.as_deref(), old.spec.zone.as_deref());
    let role = old.spec.role;
    let mut new = v1alpha2::Kontinuum::from(old);
    let annotations = new.metadata.annotations.get_or_insert_default();
    if v1alpha2::KontinuumRole::from(role) == implied {
        annotations.remove(ROLE_ANNOTATION);
    } else {
        annotations.insert(ROLE_ANNOTATION.to_owned(), role_name(role).to_owned());
    }
    if annotations.is_empty() {
        new.metadata.annotations = None;
    }
    serde_json::to_value(&new).map_err(|source| ConvertError::Invalid {
        api_version: V1ALPHA2,
        source,
    })
}

fn down(object: serde_json::Value) -> Result<serde_json::Value, ConvertError> {
    let mut new: v1alpha2::Kontinuum =
        serde_json::from_value(object).map_err(|source| ConvertError::Invalid {
            api_version: V1ALPHA2,
            source,
        })?;
    let annotated = new
        .metadata
        .annotations
        .as_mut()
        .and_then(|a| a.remove(ROLE_ANNOTATION));
    if new
        .metadata
        .annotations
        .as_ref()
        .is_some_and(std::collections::BTreeMap::is_empty)
    {
        new.metadata.annotations = None;
    }
    let recorded = new.status.as_ref().and_then(|s| s.role);
    let mut old = v1alpha1::Kontinuum::from(new);
    if recorded.is_none() {
        match annotated.as_deref() {
            Some("Worker") => old.spec.role = v1alpha1::KontinuumRole::Worker,
            Some("ControlPlane") => old.spec.role = v1alpha1::KontinuumRole::ControlPlane,
            _ => {}
        }
    }
    serde_json::to_value(&old).map_err(|source| ConvertError::Invalid {
        api_version: V1ALPHA1,
        source,
    })
}

/// Converts one object to `desired` (an `apiVersion`).
pub fn convert_object(
    object: serde_json::Value,
    desired: &str,
) -> Result<serde_json::Value, ConvertError> {
    let field = |name: &str| {
        object
            .get(name)
            .and_then(serde_json::Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    let (api_version, kind) = (field("apiVersion"), field("kind"));
    if kind != "Kontinuum" {
        return Err(ConvertError::Unsupported { api_version, kind });
    }
    match (api_version.as_str(), desired) {
        (from, to) if from == to && (to == V1ALPHA1 || to == V1ALPHA2) => Ok(object),
        (V1ALPHA1, V1ALPHA2) => up(object),
        (V1ALPHA2, V1ALPHA1) => down(object),
        _ => Err(ConvertError::Unsupported {
            api_version: format!("{api_version} to {desired}"),
            kind,
        }),
    }
}

/// Answers one review: every object converted, or a `Failure` naming the first object
/// that could not be. Returns the review and how many objects were converted (or failed).
pub fn review(request: ConversionRequest) -> (ConversionReview, bool, u64) {
    let desired = request.desired_api_version.clone();
    let objects = request.objects.clone();
    let count = u64::try_from(objects.len()).unwrap_or(u64::MAX);
    let response = ConversionResponse::for_request(request);
    let mut converted = Vec::with_capacity(objects.len());
    for (i, object) in objects.into_iter().enumerate() {
        match convert_object(object, &desired) {
            Ok(o) => converted.push(o),
            Err(err) => {
                let message = format!(
                    "object {i}: {}",
                    kontinuum_operator_common::error::chain(&err)
                );
                return (
                    response
                        .failure(Status::failure(&message, "ConversionFailed"))
                        .into_review(),
                    false,
                    count,
                );
            }
        }
    }
    (response.success(converted).into_review(), true, count)
}

/// `POST /convert`.
async fn convert(State(metrics): State<Arc<Metrics>>, body: Bytes) -> impl IntoResponse {
    let parsed = serde_json::from_slice::<ConversionReview>(&body)
        .ok()
        .and_then(|r| ConversionRequest::from_review(r).ok());
    let Some(request) = parsed else {
        metrics.conversion(false, 1);
        let review = ConversionResponse::invalid(Status::failure(
            "the body is not a ConversionReview with a request",
            "BadRequest",
        ))
        .into_review();
        return (StatusCode::BAD_REQUEST, json(&review));
    };
    let (review, ok, count) = review(request);
    metrics.conversion(ok, count);
    debug!(objects = count, success = ok, "conversion review answered");
    (StatusCode::OK, json(&review))
}

fn json(review: &ConversionReview) -> impl IntoResponse + use<> {
    (
        [(header::CONTENT_TYPE, "application/json")],
        serde_json::to_vec(review).unwrap_or_default(),
    )
}

/// The webhook's routes.
pub fn router(metrics: Arc<Metrics>) -> Router {
    Router::new()
        .route(CONVERT_PATH, post(convert))
        .layer(DefaultBodyLimit::max(MAX_REVIEW_BYTES))
        .with_state(metrics)
}

/// TLS for the webhook: the reloading serving certificate, HTTP/1.1.
pub fn tls_config(cert: Arc<ReloadingCert>) -> Result<Arc<ServerConfig>, TlsError> {
    let mut config =
        ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(TlsError::Rustls)?
            .with_no_client_auth()
            .with_cert_resolver(cert);
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Accepted TLS connections, as an axum listener.
struct TlsListener {
    incoming: Incoming,
    local: SocketAddr,
}

impl axum::serve::Listener for TlsListener {
    type Io = ServerConn;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            match self.incoming.next().await {
                Some(Ok(conn)) => return (conn, self.local),
                Some(Err(err)) => debug!(
                    error = &err as &dyn std::error::Error,
                    "accepting a webhook connection failed"
                ),
                // The acceptor never stops while the listener lives.
                None => std::future::pending::<()>().await,
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}

/// Binds `addr` with `tls`; returns the server future (runs until `shutdown`) and the
/// bound address.
pub async fn bind(
    addr: SocketAddr,
    tls: Arc<ServerConfig>,
    metrics: Arc<Metrics>,
    shutdown: Shutdown,
) -> std::io::Result<(impl Future<Output = std::io::Result<()>>, SocketAddr)> {
    let (incoming, local) = listen::bind(&Listen::Tcp(addr), Some(tls)).await?;
    let local: SocketAddr = local
        .parse()
        .map_err(|_| std::io::Error::other("the listener's address does not parse"))?;
    info!(addr = %local, "conversion webhook listening");
    let server = axum::serve(TlsListener { incoming, local }, router(metrics))
        .with_graceful_shutdown(async move { shutdown.wait().await });
    Ok((
        async move {
            let result = server.await;
            if let Err(err) = &result {
                warn!(
                    error = err as &dyn std::error::Error,
                    "conversion webhook failed"
                );
            }
            result
        },
        local,
    ))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn old(role: &str, location: Option<(&str, &str)>) -> serde_json::Value {
        let mut spec = json!({"role": role});
        if let Some((region, zone)) = location {
            spec["region"] = json!(region);
            spec["zone"] = json!(zone);
        }
        json!({
            "apiVersion": V1ALPHA1,
            "kind": "Kontinuum",
            "metadata": {
                "name": "a", "namespace": "ns", "uid": "u-1", "resourceVersion": "12",
                "generation": 2, "creationTimestamp": "2027-01-15T08:00:00Z",
                "labels": {"team": "ops"}, "annotations": {"note": "kept"},
                "managedFields": [{"manager": "kubectl", "operation": "Update",
                                   "apiVersion": V1ALPHA1, "time": "2027-01-15T08:00:00Z",
                                   "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {}}}]
            },
            "spec": spec,
            "status": {"lastHeartbeatTime": "2027-01-15T08:00:00Z"},
        })
    }

    /// What the API server does to a main-resource write: the status is not stored.
    fn store(mut v2: serde_json::Value) -> serde_json::Value {
        v2.as_object_mut().unwrap().remove("status");
        v2
    }

    #[test]
    fn v1alpha1_round_trips_through_storage() {
        for (role, location) in [
            ("Worker", Some(("eu", "1a"))),
            ("ControlPlane", None),
            ("Worker", None),
            ("ControlPlane", Some(("eu", "1a"))),
        ] {
            let original = old(role, location);
            let v2 = convert_object(original.clone(), V1ALPHA2).unwrap();
            assert_eq!(v2["apiVersion"], V1ALPHA2);
            assert_eq!(v2["status"]["role"], role);
            let implied = location.map_or("ControlPlane", |_| "Worker");
            assert_eq!(
                v2["metadata"]["annotations"].get(ROLE_ANNOTATION).is_some(),
                role != implied,
                "{role} {location:?}"
            );
            // Through the status (subresource) the role and heartbeat survive as is...
            let back = convert_object(v2.clone(), V1ALPHA1).unwrap();
            assert_eq!(back, original, "{role} {location:?}");
            // ...and through a main-resource write, which drops the status, the role too.
            let mut back = convert_object(store(v2), V1ALPHA1).unwrap();
            assert_eq!(back["spec"], original["spec"], "{role} {location:?}");
            back.as_object_mut()
                .unwrap()
                .insert("status".into(), original["status"].clone());
            assert_eq!(back, original);
        }
    }

    #[test]
    fn down_conversion_keeps_the_metadata_and_drops_what_v1alpha1_lacks() {
        let v2 = json!({
            "apiVersion": V1ALPHA2, "kind": "Kontinuum",
            "metadata": {"name": "hub", "namespace": "ns", "labels": {"a": "b"}},
            "spec": {},
            "status": {"role": "ControlPlane", "version": "0.1.0",
                       "lastHeartbeatTime": "2027-01-15T08:00:00Z",
                       "conditions": [{"type": "Ready", "status": "True", "reason": "Ready",
                                       "message": "", "lastTransitionTime": "2027-01-15T08:00:00Z"}]},
        });
        let v1 = convert_object(v2, V1ALPHA1).unwrap();
        assert_eq!(
            v1,
            json!({
                "apiVersion": V1ALPHA1, "kind": "Kontinuum",
                "metadata": {"name": "hub", "namespace": "ns", "labels": {"a": "b"}},
                "spec": {"role": "ControlPlane"},
                "status": {"lastHeartbeatTime": "2027-01-15T08:00:00Z"},
            })
        );
    }

    #[test]
    fn same_version_passes_through_and_foreign_objects_fail() {
        let v1 = old("Worker", Some(("eu", "1a")));
        assert_eq!(convert_object(v1.clone(), V1ALPHA1).unwrap(), v1);
        assert!(convert_object(v1.clone(), "kontinuum.sh/v9").is_err());
        let mut zone = v1.clone();
        zone["kind"] = json!("Zone");
        assert!(convert_object(zone, V1ALPHA2).is_err());
        let mut broken = v1;
        broken["spec"]["role"] = json!("Boss");
        let err = convert_object(broken, V1ALPHA2).unwrap_err();
        assert!(err.to_string().contains("v1alpha1"), "{err}");
    }

    fn request(objects: &[serde_json::Value], desired: &str) -> ConversionRequest {
        let review: ConversionReview = serde_json::from_value(json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "ConversionReview",
            "request": {"uid": "r-1", "desiredAPIVersion": desired, "objects": objects},
        }))
        .unwrap();
        ConversionRequest::from_review(review).unwrap()
    }

    #[test]
    fn reviews_succeed_as_a_whole_or_fail_naming_the_object() {
        let (review, ok, count) = review(request(
            &[old("Worker", Some(("eu", "1a"))), old("ControlPlane", None)],
            V1ALPHA2,
        ));
        assert!(ok);
        assert_eq!(count, 2);
        let json = serde_json::to_value(&review).unwrap();
        assert_eq!(json["response"]["uid"], "r-1");
        assert_eq!(json["response"]["result"]["status"], "Success");
        assert_eq!(
            json["response"]["convertedObjects"][1]["apiVersion"],
            V1ALPHA2
        );

        let mut bad = old("Worker", None);
        bad["spec"] = json!("nope");
        let (review, ok, _) = review_of(&[old("Worker", None), bad]);
        assert!(!ok);
        let json = serde_json::to_value(&review).unwrap();
        assert_eq!(json["response"]["result"]["status"], "Failure");
        let message = json["response"]["result"]["message"].as_str().unwrap();
        assert!(message.starts_with("object 1:"), "{message}");
    }

    fn review_of(objects: &[serde_json::Value]) -> (ConversionReview, bool, u64) {
        review(request(objects, V1ALPHA2))
    }
}
