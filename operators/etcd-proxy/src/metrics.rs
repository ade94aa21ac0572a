//! The proxy's and the relay's Prometheus metrics (prefix `kontinuum_etcd_proxy`, and
//! `kontinuum_etcd_proxy_relay` for the relay). Labels come from bounded sets only: gRPC
//! methods and codes, and the stable `reason()`s of [`TokenError`](crate::token::TokenError)
//! and [`Denied`](crate::authz::Denied).

use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tonic::Code;

/// `method` and `code` of `requests_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// `Range`, `Put`, `Watch`, `LeaseKeepAlive`, ...
    pub method: &'static str,
    /// The gRPC status code, as in the gRPC spec (`OK`, `PERMISSION_DENIED`, ...).
    pub code: &'static str,
}

/// `reason` of the failure counters.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    /// A stable CamelCase reason.
    pub reason: &'static str,
}

/// `method` of the stream gauge and counters.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MethodLabels {
    /// `Watch` or `LeaseKeepAlive`.
    pub method: &'static str,
}

/// Metrics of one server (the proxy or the relay).
#[derive(Debug)]
pub struct Metrics {
    requests: Family<RequestLabels, Counter>,
    authn_failures: Family<ReasonLabels, Counter>,
    authz_failures: Family<ReasonLabels, Counter>,
    streams: Family<MethodLabels, Gauge>,
    reconnects: Family<MethodLabels, Counter>,
}

impl Metrics {
    /// The proxy's metrics, `kontinuum_etcd_proxy_*`.
    pub fn proxy(registry: &mut Registry) -> Arc<Self> {
        let metrics = Self::new();
        let sub = registry.sub_registry_with_prefix("kontinuum_etcd_proxy");
        sub.register(
            "requests",
            "Calls answered, by method and gRPC status code (streams count when they end)",
            metrics.requests.clone(),
        );
        sub.register(
            "authn_failures",
            "Calls refused as Unauthenticated, by reason",
            metrics.authn_failures.clone(),
        );
        sub.register(
            "authz_failures",
            "Calls refused as PermissionDenied, by reason",
            metrics.authz_failures.clone(),
        );
        sub.register(
            "streams_in_flight",
            "Open Watch and LeaseKeepAlive streams",
            metrics.streams.clone(),
        );
        Arc::new(metrics)
    }

    /// The relay's metrics, `kontinuum_etcd_proxy_relay_*`.
    pub fn relay(registry: &mut Registry) -> Arc<Self> {
        let metrics = Self::new();
        let sub = registry.sub_registry_with_prefix("kontinuum_etcd_proxy_relay");
        sub.register(
            "requests",
            "Calls answered, by method and gRPC status code (streams count when they end)",
            metrics.requests.clone(),
        );
        sub.register(
            "streams_in_flight",
            "Open Watch and LeaseKeepAlive streams of local clients",
            metrics.streams.clone(),
        );
        sub.register(
            "stream_reconnects",
            "Hub streams re-opened after the hub connection broke",
            metrics.reconnects.clone(),
        );
        Arc::new(metrics)
    }

    fn new() -> Self {
        Self {
            requests: Family::default(),
            authn_failures: Family::default(),
            authz_failures: Family::default(),
            streams: Family::default(),
            reconnects: Family::default(),
        }
    }

    /// Counts one answered call.
    pub fn request(&self, method: &'static str, code: Code) {
        self.requests
            .get_or_create(&RequestLabels {
                method,
                code: code_name(code),
            })
            .inc();
    }

    /// Counts one authentication failure.
    pub fn authn_failure(&self, reason: &'static str) {
        self.authn_failures
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }

    /// Counts one authorization failure.
    pub fn authz_failure(&self, reason: &'static str) {
        self.authz_failures
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }

    /// Counts one re-opened hub stream.
    pub fn reconnect(&self, method: &'static str) {
        self.reconnects
            .get_or_create(&MethodLabels { method })
            .inc();
    }

    /// Marks a stream open until the guard drops.
    pub fn stream(self: &Arc<Self>, method: &'static str) -> StreamGuard {
        self.streams.get_or_create(&MethodLabels { method }).inc();
        StreamGuard {
            metrics: Arc::clone(self),
            method,
        }
    }
}

/// Decrements the in-flight gauge when dropped.
#[must_use = "the stream counts as open while the guard lives"]
pub struct StreamGuard {
    metrics: Arc<Metrics>,
    method: &'static str,
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        self.metrics
            .streams
            .get_or_create(&MethodLabels {
                method: self.method,
            })
            .dec();
    }
}

/// The gRPC spec's name of a status code.
pub fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proxy_metrics_are_named_and_counted() {
        let mut registry = Registry::default();
        let m = Metrics::proxy(&mut registry);
        m.request("Range", Code::PermissionDenied);
        m.authn_failure("Expired");
        m.authz_failure("OutsidePrefix");
        let guard = m.stream("Watch");
        let text = kontinuum_operator_common::metrics::encode(&registry).unwrap();
        for want in [
            "kontinuum_etcd_proxy_requests_total{method=\"Range\",code=\"PERMISSION_DENIED\"} 1",
            "kontinuum_etcd_proxy_authn_failures_total{reason=\"Expired\"} 1",
            "kontinuum_etcd_proxy_authz_failures_total{reason=\"OutsidePrefix\"} 1",
            "kontinuum_etcd_proxy_streams_in_flight{method=\"Watch\"} 1",
        ] {
            assert!(text.contains(want), "{want} in {text}");
        }
        drop(guard);
        let text = kontinuum_operator_common::metrics::encode(&registry).unwrap();
        assert!(text.contains("kontinuum_etcd_proxy_streams_in_flight{method=\"Watch\"} 0"));
    }
}
