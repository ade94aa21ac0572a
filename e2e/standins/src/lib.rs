//! STAND-INS for what cannot run in Kontinuum's test bed (DESIGN section 5): cert-manager's
//! controllers (its ACME issuer needs the internet; cert-manager itself is not built here)
//! and a Gateway API data plane (Cilium's cannot run here). Both run against a real
//! kube-apiserver with the real cert-manager and Gateway API CRDs, so every object the
//! zone-installer writes is validated by their schemas, and both honour only what the real
//! implementations would. See `README.md` for what each does and does not do.
//!
//! * [`cert_manager`]: the `cert-manager-standin` binary's controllers;
//! * [`gateway`]: the `gateway-standin` binary's controller and data plane;
//! * [`pki`]: keys and certificates.

#![warn(missing_docs)]

pub mod cert_manager;
pub mod gateway;
pub mod pki;

use std::future::Future;
use std::time::Duration;

/// The limit on every call to the API server.
pub const API_TIMEOUT: Duration = Duration::from_secs(10);

/// Runs an API call with [`API_TIMEOUT`]; a timeout becomes a `kube::Error::Service`.
pub async fn with_timeout<T>(
    call: impl Future<Output = Result<T, kube::Error>>,
) -> Result<T, kube::Error> {
    match tokio::time::timeout(API_TIMEOUT, call).await {
        Ok(result) => result,
        Err(elapsed) => Err(kube::Error::Service(Box::new(elapsed))),
    }
}
