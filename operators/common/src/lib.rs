//! The runtime every Kontinuum operator shares, written once (STYLE.md section 3.6):
//!
//! * [`args`]: the command-line arguments and `KONTINUUM_*` variables all operators take;
//! * [`telemetry`]: structured logs (JSON or plain);
//! * [`admin`]: `/healthz`, `/readyz` and `/metrics` on `--admin-addr`;
//! * [`metrics`]: the per-controller reconcile metrics, OpenMetrics encoded;
//! * [`leader`]: leader election on a coordination Lease; losing it stops the process;
//! * [`shutdown`]: one SIGTERM/SIGINT signal shared by controllers, admin server and lease;
//! * [`status`]: server-side apply of `/status`, skipped when nothing but timestamps changed
//!   or when it would repeat, from a cache behind it, the last status written;
//! * [`events`]: Kubernetes Events for transitions a human should notice;
//! * [`finalizer`]: adding and removing a finalizer, for cleanups that wait;
//! * [`error`]: the stable `reason()` and transient/permanent class of reconcile errors;
//! * [`backoff`]: per-object exponential backoff for failed reconciles;
//! * [`tracked`]: per-object maps that drop an entry with its object;
//! * [`claims`]: the compare-and-set claim label of Instances;
//! * [`kubeconfig`]: clients for downstream clusters, with explicit timeouts;
//! * [`operator`]: all of the above around a binary's controllers, for its `main`.
#![warn(missing_docs)]

pub mod admin;
pub mod args;
pub mod backoff;
pub mod claims;
pub mod error;
pub mod events;
pub mod finalizer;
pub mod kubeconfig;
pub mod leader;
pub mod metrics;
pub mod operator;
pub mod shutdown;
pub mod status;
pub mod subscribe;
pub mod telemetry;
pub mod tracked;
pub mod trim;

/// Installs ring as the process's rustls crypto provider. Call it first in every `main`,
/// before any client is built. Idempotent.
pub fn install_crypto_provider() {
    // Err means a provider is already installed, which is what we want.
    let _ = rustls::crypto::ring::default_provider().install_default();
}
