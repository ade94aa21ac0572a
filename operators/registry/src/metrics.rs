//! The registry's own metrics (prometheus-client, prefix `kontinuum_registry`), next to the
//! shared reconcile metrics ([`ControllerMetrics`]) on the same admin registry. Every label
//! comes from a small fixed set.
//!
//! Hub: `registrations` (gauge: registrations mirrored), `mirror_events_total{event}`
//! (`put`, `delete`, `invalid`, `mismatch`, `list`, `compacted`, `watch_error`),
//! `heartbeats_total` (the hub's own), `sweeps_total` (entries removed for a stale
//! heartbeat), `writes_total{write}` (`apply`, `status`, `delete`, `delete_key`, `crd`),
//! `conversions_total{result}` (`success`, `failure`).
//! Zone: `registered` (gauge, 0 or 1), `zone_heartbeats_total{result}` (`success`,
//! `failure`), `lease_grants_total`.

use std::sync::Arc;

use kontinuum_operator_common::metrics::{ControllerMetrics, prefix};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::CONTROLLER;

/// One label named `event`, `write` or `result`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EventLabels {
    /// The event.
    pub event: &'static str,
}

/// The label of `writes_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WriteLabels {
    /// What was written.
    pub write: &'static str,
}

/// The label of `conversions_total` and `zone_heartbeats_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    /// `success` or `failure`.
    pub result: &'static str,
}

/// The registry's metrics (both modes register the same set; each uses its own half).
#[derive(Debug, Default)]
pub struct Metrics {
    /// Registrations currently mirrored.
    pub registrations: Gauge,
    /// Mirror events by kind.
    pub mirror_events: Family<EventLabels, Counter>,
    /// Heartbeats of the hub's own entry written.
    pub heartbeats: Counter,
    /// Entries removed because their heartbeat was older than the time-to-live.
    pub sweeps: Counter,
    /// Writes to the API server and the store, by kind.
    pub writes: Family<WriteLabels, Counter>,
    /// Objects converted by the webhook, by result.
    pub conversions: Family<ResultLabels, Counter>,
    /// Whether the zone agent is registered now.
    pub registered: Gauge,
    /// Zone heartbeats (value rewrites), by result.
    pub zone_heartbeats: Family<ResultLabels, Counter>,
    /// Leases the zone agent granted.
    pub lease_grants: Counter,
    /// The shared reconcile metrics (`reconcile_total`, `reconcile_errors_total{reason}`,
    /// `reconcile_duration_seconds`).
    pub reconcile: Option<Arc<ControllerMetrics>>,
}

impl Metrics {
    /// Registers every metric in `registry`.
    pub fn register(registry: &mut Registry) -> Arc<Self> {
        let reconcile = ControllerMetrics::register(registry, CONTROLLER);
        let metrics = Self {
            reconcile: Some(reconcile),
            ..Self::default()
        };
        let sub = registry.sub_registry_with_prefix(prefix(CONTROLLER));
        sub.register(
            "registrations",
            "Zone registrations mirrored into Kontinuum objects",
            metrics.registrations.clone(),
        );
        sub.register(
            "mirror_events",
            "Events of the store mirror, by event",
            metrics.mirror_events.clone(),
        );
        sub.register(
            "heartbeats",
            "Heartbeats of the hub's own Kontinuum written",
            metrics.heartbeats.clone(),
        );
        sub.register(
            "sweeps",
            "Kontinuum entries removed because their heartbeat was older than the time-to-live",
            metrics.sweeps.clone(),
        );
        sub.register(
            "writes",
            "Writes to the API server and the store, by kind",
            metrics.writes.clone(),
        );
        sub.register(
            "conversions",
            "Objects the conversion webhook converted, by result",
            metrics.conversions.clone(),
        );
        sub.register(
            "registered",
            "Whether the zone agent is registered (1) or not (0)",
            metrics.registered.clone(),
        );
        sub.register(
            "zone_heartbeats",
            "Heartbeats of the zone agent's registration, by result",
            metrics.zone_heartbeats.clone(),
        );
        sub.register(
            "lease_grants",
            "Leases the zone agent granted for its registration",
            metrics.lease_grants.clone(),
        );
        Arc::new(metrics)
    }

    /// Counts a mirror event.
    pub fn mirror_event(&self, event: &'static str) {
        self.mirror_events
            .get_or_create(&EventLabels { event })
            .inc();
    }

    /// Counts a write.
    pub fn write(&self, write: &'static str) {
        self.writes.get_or_create(&WriteLabels { write }).inc();
    }

    /// Counts converted objects.
    pub fn conversion(&self, success: bool, objects: u64) {
        let result = if success { "success" } else { "failure" };
        self.conversions
            .get_or_create(&ResultLabels { result })
            .inc_by(objects);
    }

    /// Counts a zone heartbeat.
    pub fn zone_heartbeat(&self, success: bool) {
        let result = if success { "success" } else { "failure" };
        self.zone_heartbeats
            .get_or_create(&ResultLabels { result })
            .inc();
    }

    /// Counts a failed reconcile pass by reason.
    pub fn failure(&self, reason: &str) {
        if let Some(r) = &self.reconcile {
            r.failure(reason);
        }
    }
}

#[cfg(test)]
mod tests {
    use kontinuum_operator_common::metrics::encode;

    use super::*;

    #[test]
    fn metrics_are_named_under_the_registry_prefix() {
        let mut registry = Registry::default();
        let metrics = Metrics::register(&mut registry);
        metrics.registrations.set(2);
        metrics.mirror_event("put");
        metrics.write("status");
        metrics.conversion(true, 3);
        metrics.zone_heartbeat(false);
        metrics.failure("StoreUnavailable");
        let text = encode(&registry).unwrap();
        for line in [
            "kontinuum_registry_registrations 2",
            "kontinuum_registry_mirror_events_total{event=\"put\"} 1",
            "kontinuum_registry_writes_total{write=\"status\"} 1",
            "kontinuum_registry_conversions_total{result=\"success\"} 3",
            "kontinuum_registry_zone_heartbeats_total{result=\"failure\"} 1",
            "kontinuum_registry_reconcile_errors_total{reason=\"StoreUnavailable\"} 1",
            "kontinuum_registry_sweeps_total 0",
        ] {
            assert!(text.contains(line), "{line} missing in\n{text}");
        }
    }
}
