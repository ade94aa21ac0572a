//! Per-object exponential backoff for failed reconciles: each object's delay doubles from
//! `base` up to `max` while it keeps failing, and starts over after a success. One object
//! failing never slows another.

use std::time::Duration;

use crate::tracked::{Forget, ObjectMap};

/// The delay before retry number `attempt` (0-based): `base * 2^attempt`, capped at `max`.
pub fn delay(base: Duration, max: Duration, attempt: u32) -> Duration {
    base.checked_mul(2u32.saturating_pow(attempt))
        .map_or(max, |d| d.min(max))
}

/// The key of an object for [`Backoff`]: `namespace/name`.
pub fn object_key<K: kube::ResourceExt>(object: &K) -> String {
    format!(
        "{}/{}",
        object.namespace().unwrap_or_default(),
        object.name_any()
    )
}

/// Failure counts by object key (see [`object_key`]), shared by clones. An entry goes with
/// a success ([`Backoff::reset`]) or with its object ([`crate::tracked::forget_gone`]).
#[derive(Clone, Debug)]
pub struct Backoff {
    base: Duration,
    max: Duration,
    attempts: ObjectMap<u32>,
}

impl Backoff {
    /// Backoff from `base` doubling up to `max`.
    pub fn new(base: Duration, max: Duration) -> Self {
        Self {
            base,
            max,
            attempts: ObjectMap::new("backoff"),
        }
    }

    /// Records a failure of `key` and returns how long to wait before retrying it.
    pub fn next(&self, key: &str) -> Duration {
        self.attempts.update(|attempts| {
            let attempt = attempts.entry(key.to_string()).or_insert(0);
            let wait = delay(self.base, self.max, *attempt);
            *attempt = attempt.saturating_add(1);
            wait
        })
    }

    /// Forgets the failures of `key` (after a successful reconcile or its deletion).
    pub fn reset(&self, key: &str) {
        self.attempts.forget(key);
    }

    /// The objects with failures on record.
    pub fn len(&self) -> usize {
        self.attempts.len()
    }

    /// Whether no object has failures on record.
    pub fn is_empty(&self) -> bool {
        self.attempts.is_empty()
    }
}

impl Forget for Backoff {
    fn forget(&self, key: &str) {
        self.attempts.forget(key);
    }

    fn retain_live(&self, live: &dyn Fn(&str) -> bool) -> usize {
        self.attempts.retain_live(live)
    }

    fn name(&self) -> &'static str {
        self.attempts.name()
    }

    fn report(&self, metrics: &crate::metrics::ControllerMetrics) {
        self.attempts.report(metrics);
    }
}

impl Default for Backoff {
    /// 1 s doubling up to 5 minutes.
    fn default() -> Self {
        Self::new(Duration::from_secs(1), Duration::from_secs(300))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_per_object_caps_and_resets() {
        let b = Backoff::new(Duration::from_secs(1), Duration::from_secs(10));
        let waits: Vec<_> = (0..6).map(|_| b.next("ns/a").as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 10, 10]);
        assert_eq!(
            b.next("ns/b"),
            Duration::from_secs(1),
            "objects are independent"
        );
        b.reset("ns/a");
        assert_eq!(b.next("ns/a"), Duration::from_secs(1));
    }

    #[test]
    fn huge_attempt_counts_do_not_overflow() {
        assert_eq!(
            delay(Duration::from_secs(1), Duration::from_secs(300), u32::MAX),
            Duration::from_secs(300)
        );
    }
}
