//! Prometheus metrics (prometheus-client, OpenMetrics text). One [`Registry`] per binary;
//! each controller registers under the prefix `kontinuum_<controller>`:
//! `reconcile_total`, `reconcile_errors_total{reason}`, `reconcile_duration_seconds`,
//! `external_calls_total{system,operation}` and `tracked_objects{map}` (entries of the
//! per-object maps, see [`crate::tracked`]).
//! Labels come from bounded sets only (error reasons are constants).

use std::sync::Arc;
use std::time::Instant;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
pub use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

/// The content type of `/metrics`.
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The label set of `reconcile_errors_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    /// The error's stable reason (`ReconcileError::reason`).
    pub reason: String,
}

/// The label set of `external_calls_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CallLabels {
    /// The system called: `talos`, `helm`, `downstream`.
    pub system: String,
    /// The call: an RPC or a helm verb.
    pub operation: String,
}

/// The label set of `tracked_objects`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MapLabels {
    /// The map: `backoff`, `spec_changes`, ...
    pub map: String,
}

/// The reconcile metrics of one controller.
#[derive(Debug)]
pub struct ControllerMetrics {
    reconciles: Counter,
    errors: Family<ErrorLabels, Counter>,
    duration: Histogram,
    calls: Family<CallLabels, Counter>,
    tracked: Family<MapLabels, Gauge>,
}

impl ControllerMetrics {
    /// Registers the metrics of `controller` (e.g. `pool-claimer`) in `registry`.
    pub fn register(registry: &mut Registry, controller: &str) -> Arc<Self> {
        let sub = registry.sub_registry_with_prefix(prefix(controller));
        let metrics = Self {
            reconciles: Counter::default(),
            errors: Family::default(),
            // 1 ms .. ~33 s
            duration: Histogram::new(exponential_buckets(0.001, 2.0, 16)),
            calls: Family::default(),
            tracked: Family::default(),
        };
        sub.register(
            "tracked_objects",
            "Entries of the per-object maps (backoff, change filters, ...), by map: objects that exist, never deleted ones",
            metrics.tracked.clone(),
        );
        sub.register(
            "external_calls",
            "Calls to systems outside the hub (machines, helm, downstream clusters), by system and operation",
            metrics.calls.clone(),
        );
        sub.register("reconcile", "Reconciles run", metrics.reconciles.clone());
        sub.register(
            "reconcile_errors",
            "Reconciles that failed, by reason",
            metrics.errors.clone(),
        );
        sub.register_with_unit(
            "reconcile_duration",
            "Time one reconcile took",
            Unit::Seconds,
            metrics.duration.clone(),
        );
        Arc::new(metrics)
    }

    /// Starts timing a reconcile; the count and duration are recorded when the guard drops.
    pub fn reconcile_timer(&self) -> ReconcileTimer<'_> {
        ReconcileTimer {
            metrics: self,
            start: Instant::now(),
        }
    }

    /// Counts one call to a system outside the hub (e.g. `("helm", "upgrade")`).
    pub fn external_call(&self, system: &str, operation: &str) {
        self.calls
            .get_or_create(&CallLabels {
                system: system.to_owned(),
                operation: operation.to_owned(),
            })
            .inc();
    }

    /// The gauge `tracked_objects{map}`.
    pub fn tracked(&self, map: &str) -> Gauge {
        self.tracked
            .get_or_create(&MapLabels {
                map: map.to_owned(),
            })
            .clone()
    }

    /// Counts a failed reconcile.
    pub fn failure(&self, reason: &str) {
        self.errors
            .get_or_create(&ErrorLabels {
                reason: reason.to_string(),
            })
            .inc();
    }
}

/// Records one reconcile when dropped.
#[must_use = "the reconcile is recorded when the timer drops"]
pub struct ReconcileTimer<'a> {
    metrics: &'a ControllerMetrics,
    start: Instant,
}

impl Drop for ReconcileTimer<'_> {
    fn drop(&mut self) {
        self.metrics.reconciles.inc();
        self.metrics
            .duration
            .observe(self.start.elapsed().as_secs_f64());
    }
}

/// `kontinuum_<controller>`, with characters metric names cannot hold replaced by `_`.
pub fn prefix(controller: &str) -> String {
    let name: String = controller
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .collect();
    format!("kontinuum_{name}")
}

/// Encodes a registry as OpenMetrics text.
pub fn encode(registry: &Registry) -> Result<String, std::fmt::Error> {
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, registry)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reconcile_metrics_are_named_and_counted() {
        let mut registry = Registry::default();
        let metrics = ControllerMetrics::register(&mut registry, "pool-claimer");
        {
            let _timer = metrics.reconcile_timer();
        }
        metrics.failure("ClaimFailed");
        metrics.failure("ClaimFailed");
        metrics.external_call("helm", "upgrade");
        let text = encode(&registry).unwrap();
        assert!(
            text.contains("kontinuum_pool_claimer_reconcile_total 1"),
            "{text}"
        );
        assert!(
            text.contains(
                "kontinuum_pool_claimer_reconcile_errors_total{reason=\"ClaimFailed\"} 2"
            ),
            "{text}"
        );
        assert!(
            text.contains("kontinuum_pool_claimer_reconcile_duration_seconds_count 1"),
            "{text}"
        );
        assert!(
            text.contains(
                "kontinuum_pool_claimer_external_calls_total{system=\"helm\",operation=\"upgrade\"} 1"
            ),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"));
    }

    #[test]
    fn prefixes_are_valid_metric_names() {
        assert_eq!(prefix("talos-bootstrapper"), "kontinuum_talos_bootstrapper");
        assert_eq!(prefix("Zone.Installer"), "kontinuum_zone_installer");
    }
}
