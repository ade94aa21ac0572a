//! The contract of every controller's error type: a stable, low-cardinality `reason()`
//! (used as metric label, Event reason and condition reason) and a class that tells the
//! error policy whether retrying can help.

/// Whether retrying can help.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorClass {
    /// A bounded failure (timeout, conflict, unreachable): retry with backoff.
    Transient,
    /// Retrying the same input fails the same way (bad spec): report it in a condition and
    /// wait for a change.
    Permanent,
}

/// Implemented by each controller's `Error`.
pub trait ReconcileError: std::error::Error + Send + Sync + 'static {
    /// Stable CamelCase token, e.g. `ClaimFailed`.
    fn reason(&self) -> &'static str;

    /// Transient unless the error says otherwise.
    fn class(&self) -> ErrorClass {
        ErrorClass::Transient
    }
}

/// Whether a Kubernetes API error is worth retrying: conflicts, throttling, timeouts,
/// server errors and transport failures are; validation errors are not.
///
/// A 403 is [`ErrorClass::Transient`]: RBAC is fixed by changing a Role or binding, not the
/// object's spec, so waiting for a spec change would wedge the object after the fix. It is
/// retried with the normal (slowing) backoff and reported with reason `Forbidden` (see
/// [`forbidden`]) rather than a waiting reason, so a human sees what to fix.
pub fn kube_error_class(err: &kube::Error) -> ErrorClass {
    match err {
        kube::Error::Api(status) => match status.code {
            400 | 401 | 404 | 405 | 410 | 415 | 422 => ErrorClass::Permanent,
            _ => ErrorClass::Transient,
        },
        kube::Error::SerdeError(_) => ErrorClass::Permanent,
        _ => ErrorClass::Transient,
    }
}

/// The error policy every controller shares: log the failure with its chain, count it by
/// reason, and retry the object after its own exponential backoff — unless the error is
/// [`ErrorClass::Permanent`]: then retrying the same input cannot help, and the object waits
/// for a change that wakes it (its spec, or whatever else its controller watches) instead
/// of being retried forever.
pub fn retry_after_backoff<E: ReconcileError>(
    object: &str,
    err: &E,
    metrics: &crate::metrics::ControllerMetrics,
    backoff: &crate::backoff::Backoff,
) -> kube::runtime::controller::Action {
    metrics.failure(err.reason());
    let permanent = err.class() == ErrorClass::Permanent;
    tracing::warn!(
        object,
        reason = err.reason(),
        error = err as &dyn std::error::Error,
        waiting_for_change = permanent,
        "reconcile failed"
    );
    if permanent {
        kube::runtime::controller::Action::await_change()
    } else {
        kube::runtime::controller::Action::requeue(backoff.next(object))
    }
}

/// An error and every source, joined with `: ` (for condition messages and Events).
pub fn chain(err: &dyn std::error::Error) -> String {
    let mut out = err.to_string();
    let mut source = err.source();
    while let Some(s) = source {
        let text = s.to_string();
        // Some errors repeat their source's text; say it once.
        if !out.ends_with(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

/// The condition and Event reason of an RBAC refusal: every kind's reason vocabulary in
/// `crds::reasons` has a `Forbidden` token of this name.
pub const FORBIDDEN: &str = "Forbidden";

/// If a Kubernetes API 403 (from the hub or a zone cluster) is in `err` or its sources, the
/// message to report it with (reason [`FORBIDDEN`]): it names the verb and resource when
/// the API server said them, and holds nothing else of the server's text.
pub fn forbidden(err: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut current = Some(err);
    while let Some(e) = current {
        if let Some(kube::Error::Api(status)) = e.downcast_ref::<kube::Error>()
            && status.code == 403
        {
            return Some(forbidden_message(status));
        }
        current = e.source();
    }
    None
}

fn forbidden_message(status: &kube::core::Status) -> String {
    // The API server says `... cannot <verb> resource "<resource>" in API group ...`.
    let said = status.message.split_once(" cannot ").and_then(|(_, rest)| {
        let mut words = rest.split_whitespace();
        let verb = words.next()?;
        let resource = match (words.next(), words.next()) {
            (Some("resource"), Some(resource)) => resource.trim_matches('"'),
            _ => return None,
        };
        let plain = |s: &str| {
            !s.is_empty()
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '/'))
        };
        (plain(verb) && plain(resource)).then(|| format!("{verb} {resource}"))
    });
    let what = said.or_else(|| {
        status
            .details
            .as_ref()
            .filter(|d| !d.kind.is_empty())
            .map(|d| format!("access {}", d.kind))
    });
    match what {
        Some(what) => format!("forbidden: the operator may not {what}; its RBAC needs fixing"),
        None => "forbidden by the API server; the operator's RBAC needs fixing".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("claiming instance n-01")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn chain_joins_sources() {
        let err = Outer(std::io::Error::other("conflict"));
        assert_eq!(chain(&err), "claiming instance n-01: conflict");
    }

    #[test]
    fn api_errors_are_classified() {
        let api = |code| {
            kube::Error::Api(
                kube::core::Status::failure("x", "y")
                    .with_code(code)
                    .boxed(),
            )
        };
        assert_eq!(kube_error_class(&api(409)), ErrorClass::Transient);
        assert_eq!(kube_error_class(&api(500)), ErrorClass::Transient);
        assert_eq!(kube_error_class(&api(422)), ErrorClass::Permanent);
        // RBAC is fixed without a spec change: retried, not awaited.
        assert_eq!(kube_error_class(&api(403)), ErrorClass::Transient);
    }

    #[derive(Debug, thiserror::Error)]
    #[error("patching the Addon status")]
    struct Patch(#[source] kube::Error);

    #[derive(Debug, thiserror::Error)]
    #[error("bad spec")]
    struct BadSpec;

    impl ReconcileError for BadSpec {
        fn reason(&self) -> &'static str {
            "BadSpec"
        }
        fn class(&self) -> ErrorClass {
            ErrorClass::Permanent
        }
    }

    impl ReconcileError for Outer {
        fn reason(&self) -> &'static str {
            "ClaimFailed"
        }
    }

    #[test]
    fn a_permanent_error_waits_for_a_change_a_transient_one_backs_off() {
        use kube::runtime::controller::Action;
        use std::time::Duration;
        let mut registry = prometheus_client::registry::Registry::default();
        let metrics = crate::metrics::ControllerMetrics::register(&mut registry, "test");
        let backoff = crate::backoff::Backoff::new(Duration::from_secs(1), Duration::from_secs(8));
        assert_eq!(
            retry_after_backoff("ns/a", &BadSpec, &metrics, &backoff),
            Action::await_change()
        );
        // Waiting for a change counts no attempt: the first retry after it is quick.
        let transient = Outer(std::io::Error::other("timeout"));
        assert_eq!(
            retry_after_backoff("ns/a", &transient, &metrics, &backoff),
            Action::requeue(Duration::from_secs(1))
        );
        assert_eq!(
            retry_after_backoff("ns/a", &transient, &metrics, &backoff),
            Action::requeue(Duration::from_secs(2))
        );
    }

    #[test]
    fn a_403_anywhere_in_the_chain_is_forbidden() {
        let status = kube::core::Status::failure(
            "addons.kontinuum.sh \"cilium\" is forbidden: User \"system:serviceaccount:k:addon\" \
             cannot patch resource \"addons/status\" in API group \"kontinuum.sh\" in the \
             namespace \"k\"",
            "Forbidden",
        )
        .with_code(403);
        let err = Patch(kube::Error::Api(status.boxed()));
        assert_eq!(
            forbidden(&err).as_deref(),
            Some("forbidden: the operator may not patch addons/status; its RBAC needs fixing")
        );

        let vague = Patch(kube::Error::Api(
            kube::core::Status::failure("no", "Forbidden")
                .with_code(403)
                .boxed(),
        ));
        assert_eq!(
            forbidden(&vague).as_deref(),
            Some("forbidden by the API server; the operator's RBAC needs fixing")
        );

        let conflict = Patch(kube::Error::Api(
            kube::core::Status::failure("conflict", "Conflict")
                .with_code(409)
                .boxed(),
        ));
        assert_eq!(forbidden(&conflict), None);
        assert_eq!(forbidden(&std::io::Error::other("x")), None);
    }

    #[test]
    fn every_kind_has_the_forbidden_reason() {
        use kontinuum_crds::reasons::*;
        for token in [
            AddonReason::Forbidden.as_str(),
            InstanceReason::Forbidden.as_str(),
            InstancePoolReason::Forbidden.as_str(),
            TalosClusterReason::Forbidden.as_str(),
            ZoneReason::Forbidden.as_str(),
        ] {
            assert_eq!(token, FORBIDDEN);
        }
    }
}
