//! Kubernetes Events for transitions and failures a human should notice (never one per
//! reconcile). The reporting controller is `<controller>.kontinuum.sh`; reasons come from
//! the same vocabulary as condition reasons, actions are PascalCase verbs. A note is capped
//! like a condition message ([`cap_message`]), so error text never makes a long one.
//!
//! A repeat of an Event (same object, type, reason and action within [`SERIES_TTL`]) is
//! counted on the first one's `series` instead of creating another, as client-go's
//! recorder does. Which series are open is remembered for at most [`SERIES_LIMIT`] of them:
//! kube-runtime's `Recorder` kept a full copy of every Event it published for six minutes,
//! which was a quarter of an operator's memory right after it published 10,000
//! (`bench-results/discovery.md`).

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash as _, Hasher as _};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event as K8sEvent;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kontinuum_crds::conditions::cap_message;
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};

/// How long a repeat joins the series of the Event it repeats (client-go's and
/// kube-runtime's figure).
pub const SERIES_TTL: SignedDuration = SignedDuration::from_mins(6);
/// The most open series remembered at once; past it the oldest is forgotten (its next
/// repeat starts a new Event).
pub const SERIES_LIMIT: usize = 1024;
/// The bound on one create or patch of an Event.
const PUBLISH_TIMEOUT: Duration = Duration::from_secs(10);

/// Publishes Events on behalf of one controller.
#[derive(Clone)]
pub struct Events {
    client: Client,
    reporter: Reporter,
    series: Arc<Mutex<SeriesCache>>,
}

/// Who publishes: the reporting controller and its instance.
#[derive(Clone, Debug)]
struct Reporter {
    controller: String,
    instance: String,
}

/// One Event to publish, before it is an object.
#[derive(Debug)]
struct Draft<'a> {
    type_: EventType,
    reason: &'a str,
    action: &'a str,
    note: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum EventType {
    Normal,
    Warning,
}

impl EventType {
    fn as_str(self) -> &'static str {
        match self {
            Self::Normal => "Normal",
            Self::Warning => "Warning",
        }
    }
}

#[derive(Debug, thiserror::Error)]
enum PublishError {
    #[error(transparent)]
    Api(#[from] kube::Error),
    #[error("no answer within {0:?}")]
    Timeout(Duration),
}

impl Events {
    /// A publisher for `controller` (e.g. `pool-claimer`), running as `instance`.
    pub fn new(client: Client, controller: &str, instance: Option<String>) -> Self {
        let controller = format!("{controller}.kontinuum.sh");
        Self {
            client,
            reporter: Reporter {
                instance: instance.unwrap_or_else(|| controller.clone()),
                controller,
            },
            series: Arc::default(),
        }
    }

    /// A `Normal` Event. Failing to publish is logged, never fatal.
    pub async fn normal(&self, object: &ObjectReference, reason: &str, action: &str, note: String) {
        self.publish(
            object,
            Draft {
                type_: EventType::Normal,
                reason,
                action,
                note,
            },
        )
        .await;
    }

    /// A `Warning` Event. Failing to publish is logged, never fatal.
    pub async fn warning(
        &self,
        object: &ObjectReference,
        reason: &str,
        action: &str,
        note: String,
    ) {
        self.publish(
            object,
            Draft {
                type_: EventType::Warning,
                reason,
                action,
                note,
            },
        )
        .await;
    }

    async fn publish(&self, object: &ObjectReference, draft: Draft<'_>) {
        let reason = draft.reason;
        let result = tokio::time::timeout(PUBLISH_TIMEOUT, self.try_publish(object, draft))
            .await
            .unwrap_or(Err(PublishError::Timeout(PUBLISH_TIMEOUT)));
        if let Err(error) = result {
            tracing::warn!(
                reason,
                error = &error as &dyn std::error::Error,
                "failed to publish event"
            );
        }
    }

    async fn try_publish(
        &self,
        object: &ObjectReference,
        draft: Draft<'_>,
    ) -> Result<(), PublishError> {
        let now = Timestamp::now();
        let key = series_key(object, draft.type_, draft.reason, draft.action);
        let namespace = object.namespace.as_deref().unwrap_or("default");
        let events: Api<K8sEvent> = Api::namespaced(self.client.clone(), namespace);
        let repeat = self.cache().repeat(key, now);
        if let Some((name, count)) = repeat {
            let patch = serde_json::json!({
                "series": { "count": count, "lastObservedTime": MicroTime(now) }
            });
            match events
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => return Ok(()),
                // The first Event is gone (expired or deleted): this one starts anew.
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                Err(err) => return Err(err.into()),
            }
        }
        let event = self.reporter.event(object, draft, now);
        let name = event.metadata.name.clone().unwrap_or_default();
        events.create(&PostParams::default(), &event).await?;
        self.cache().open(key, name, now);
        Ok(())
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, SeriesCache> {
        self.series.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Reporter {
    /// The Event published first in a series, its note capped by [`cap_message`].
    fn event(&self, object: &ObjectReference, draft: Draft<'_>, now: Timestamp) -> K8sEvent {
        K8sEvent {
            metadata: ObjectMeta {
                name: Some(format!(
                    "{}.{:x}",
                    object.name.as_deref().unwrap_or(&self.controller),
                    now.as_nanosecond()
                )),
                namespace: object.namespace.clone(),
                ..ObjectMeta::default()
            },
            event_time: Some(MicroTime(now)),
            type_: Some(draft.type_.as_str().to_owned()),
            reason: Some(draft.reason.to_owned()),
            action: Some(draft.action.to_owned()),
            note: Some(cap_message(draft.note)),
            regarding: Some(object.clone()),
            reporting_controller: Some(self.controller.clone()),
            reporting_instance: Some(self.instance.clone()),
            ..K8sEvent::default()
        }
    }
}

/// What makes two Events one series: the object, type, reason and action (not the note,
/// as client-go).
fn series_key(object: &ObjectReference, type_: EventType, reason: &str, action: &str) -> u64 {
    let mut hasher = DefaultHasher::new();
    (
        &object.api_version,
        &object.kind,
        &object.namespace,
        &object.name,
        &object.uid,
        type_,
        reason,
        action,
    )
        .hash(&mut hasher);
    hasher.finish()
}

/// The open series: the first Event's name, the count so far and when it was last seen.
#[derive(Debug, Default)]
struct SeriesCache {
    open: HashMap<u64, Series>,
}

#[derive(Debug)]
struct Series {
    name: String,
    count: i32,
    last: Timestamp,
}

impl SeriesCache {
    /// Forgets the series past their TTL; for `key`'s, if still open, counts one more and
    /// returns the first Event's name and the new count.
    fn repeat(&mut self, key: u64, now: Timestamp) -> Option<(String, i32)> {
        self.open
            .retain(|_, series| now.duration_since(series.last) < SERIES_TTL);
        let series = self.open.get_mut(&key)?;
        series.count = series.count.saturating_add(1);
        series.last = now;
        Some((series.name.clone(), series.count))
    }

    /// Opens a series for `key` with its first Event `name`, forgetting the oldest one
    /// when [`SERIES_LIMIT`] are open.
    fn open(&mut self, key: u64, name: String, now: Timestamp) {
        if self.open.len() >= SERIES_LIMIT && !self.open.contains_key(&key) {
            let oldest = self
                .open
                .iter()
                .min_by_key(|(_, series)| series.last)
                .map(|(key, _)| *key);
            if let Some(oldest) = oldest {
                self.open.remove(&oldest);
            }
        }
        self.open.insert(
            key,
            Series {
                name,
                count: 1,
                last: now,
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kontinuum_crds::conditions::MESSAGE_LIMIT;

    fn reporter() -> Reporter {
        Reporter {
            controller: "pool-claimer.kontinuum.sh".into(),
            instance: "pool-claimer-0".into(),
        }
    }

    fn instance(name: &str) -> ObjectReference {
        ObjectReference {
            api_version: Some("kontinuum.sh/v1alpha2".into()),
            kind: Some("Instance".into()),
            namespace: Some("eu".into()),
            name: Some(name.into()),
            uid: Some(format!("uid-{name}")),
            ..ObjectReference::default()
        }
    }

    fn at(second: i64) -> Timestamp {
        Timestamp::from_second(second).unwrap_or(Timestamp::UNIX_EPOCH)
    }

    #[test]
    fn notes_are_capped_like_condition_messages() {
        let object = instance("a");
        let long = reporter().event(
            &object,
            Draft {
                type_: EventType::Warning,
                reason: "InstallFailed",
                action: "Install",
                note: "x".repeat(5000),
            },
            at(100),
        );
        let note = long.note.unwrap_or_default();
        assert_eq!(note.chars().count(), MESSAGE_LIMIT);
        assert!(note.ends_with('…'));
        let short = reporter().event(
            &object,
            Draft {
                type_: EventType::Normal,
                reason: "Installed",
                action: "Install",
                note: "done".into(),
            },
            at(100),
        );
        assert_eq!(short.note.as_deref(), Some("done"));
        assert_eq!(short.type_.as_deref(), Some("Normal"));
        assert_eq!(short.metadata.namespace.as_deref(), Some("eu"));
        assert_eq!(short.reporting_instance.as_deref(), Some("pool-claimer-0"));
        assert!(short.metadata.name.unwrap_or_default().starts_with("a."));
    }

    #[test]
    fn a_series_is_one_object_type_reason_and_action() {
        let key = series_key(&instance("a"), EventType::Warning, "Failed", "Probe");
        assert_eq!(
            key,
            series_key(&instance("a"), EventType::Warning, "Failed", "Probe")
        );
        for other in [
            series_key(&instance("b"), EventType::Warning, "Failed", "Probe"),
            series_key(&instance("a"), EventType::Normal, "Failed", "Probe"),
            series_key(&instance("a"), EventType::Warning, "Discovered", "Probe"),
            series_key(&instance("a"), EventType::Warning, "Failed", "Claim"),
        ] {
            assert_ne!(key, other);
        }
    }

    #[test]
    fn a_repeat_within_the_ttl_counts_on_the_first_event_and_later_starts_anew() {
        let mut cache = SeriesCache::default();
        assert_eq!(cache.repeat(1, at(0)), None);
        cache.open(1, "a.1".into(), at(0));
        assert_eq!(cache.repeat(1, at(60)), Some(("a.1".into(), 2)));
        // The TTL runs from the last repeat.
        assert_eq!(cache.repeat(1, at(60 + 359)), Some(("a.1".into(), 3)));
        assert_eq!(cache.repeat(1, at(60 + 359 + 360)), None);
        assert!(cache.open.is_empty(), "a series past its TTL is forgotten");
    }

    #[test]
    fn at_most_the_limit_of_series_is_remembered_the_oldest_goes_first() {
        let mut cache = SeriesCache::default();
        let mut second = 0;
        for key in 0..10_000_u64 {
            second += 1;
            cache.open(key, format!("e.{key}"), at(second));
            assert!(cache.open.len() <= SERIES_LIMIT);
        }
        assert_eq!(cache.open.len(), SERIES_LIMIT);
        let first_kept = 10_000 - SERIES_LIMIT as u64;
        assert!(!cache.open.contains_key(&(first_kept - 1)));
        assert!(cache.open.contains_key(&first_kept));
        assert!(cache.open.contains_key(&9_999));
    }
}
