//! Kubernetes Events for transitions and failures a human should notice (never one per
//! reconcile). The reporting controller is `<controller>.kontinuum.sh`; reasons come from
//! the same vocabulary as condition reasons, actions are PascalCase verbs. A note is capped
//! like a condition message ([`cap_message`]), so error text never makes a long one.

use k8s_openapi::api::core::v1::ObjectReference;
use kontinuum_crds::conditions::cap_message;
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
        let event = event(type_, reason, action, note);
        if let Err(error) = self.recorder.publish(&event, object).await {
            tracing::warn!(
                reason,
                error = &error as &dyn std::error::Error,
                "failed to publish event"
            );
        }
    }
}

/// The Event published, its note capped by [`cap_message`].
fn event(type_: EventType, reason: &str, action: &str, note: String) -> Event {
    Event {
        type_,
        reason: reason.to_string(),
        note: Some(cap_message(note)),
        action: action.to_string(),
        secondary: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kontinuum_crds::conditions::MESSAGE_LIMIT;

    #[test]
    fn notes_are_capped_like_condition_messages() {
        let long = event(
            EventType::Warning,
            "InstallFailed",
            "Install",
            "x".repeat(5000),
        );
        let note = long.note.unwrap_or_default();
        assert_eq!(note.chars().count(), MESSAGE_LIMIT);
        assert!(note.ends_with('…'));
        let short = event(EventType::Normal, "Installed", "Install", "done".into());
        assert_eq!(short.note.as_deref(), Some("done"));
    }
}
