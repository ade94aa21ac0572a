//! Kubernetes Events for transitions and failures a human should notice (never one per
//! reconcile). The reporting controller is `<controller>.kontinuum.sh`; reasons come from
//! the same vocabulary as condition reasons, actions are PascalCase verbs.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

/// Publishes Events on behalf of one controller.
#[derive(Clone)]
pub struct Events {
    recorder: Recorder,
}

impl Events {
    /// A publisher for `controller` (e.g. `pool-claimer`), running as `instance`.
    pub fn new(client: Client, controller: &str, instance: Option<String>) -> Self {
        let reporter = Reporter {
            controller: format!("{controller}.kontinuum.sh"),
            instance,
        };
        Self {
            recorder: Recorder::new(client, reporter),
        }
    }

    /// A `Normal` Event. Failing to publish is logged, never fatal.
    pub async fn normal(&self, object: &ObjectReference, reason: &str, action: &str, note: String) {
        self.publish(object, EventType::Normal, reason, action, note)
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
        self.publish(object, EventType::Warning, reason, action, note)
            .await;
    }

    async fn publish(
        &self,
        object: &ObjectReference,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) {
        let event = Event {
            type_,
            reason: reason.to_string(),
            note: Some(note),
            action: action.to_string(),
            secondary: None,
        };
        if let Err(error) = self.recorder.publish(&event, object).await {
            tracing::warn!(
                reason,
                error = &error as &dyn std::error::Error,
                "failed to publish event"
            );
        }
    }
}
