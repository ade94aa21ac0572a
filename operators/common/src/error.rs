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
/// server errors and transport failures are; validation and permission errors are not.
pub fn kube_error_class(err: &kube::Error) -> ErrorClass {
    match err {
        kube::Error::Api(status) => match status.code {
            400 | 401 | 403 | 404 | 405 | 410 | 415 | 422 => ErrorClass::Permanent,
            _ => ErrorClass::Transient,
        },
        kube::Error::SerdeError(_) => ErrorClass::Permanent,
        _ => ErrorClass::Transient,
    }
}

/// The error policy every controller shares: log the failure with its chain, count it by
/// reason, and retry the object after its own exponential backoff.
pub fn retry_after_backoff<E: ReconcileError>(
    object: &str,
    err: &E,
    metrics: &crate::metrics::ControllerMetrics,
    backoff: &crate::backoff::Backoff,
) -> kube::runtime::controller::Action {
    tracing::warn!(
        object,
        reason = err.reason(),
        error = err as &dyn std::error::Error,
        "reconcile failed"
    );
    metrics.failure(err.reason());
    kube::runtime::controller::Action::requeue(backoff.next(object))
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
        assert_eq!(kube_error_class(&api(403)), ErrorClass::Permanent);
    }
}
