//! instance-discovery: probes unclaimed Instances in Talos maintenance mode.
//!
//! * Reconciles: `Instance`s: probes those without the `kontinuum.sh/claimed-by` label and
//!   summarises every one.
//! * Owns: Instance status fields `address`, `interfaces`, `disks`, `talos.version`,
//!   `identity`, `lastSeenTime`, `observedGeneration`, and the conditions `Discovered` and
//!   `Ready`, under field manager `instance-discovery.kontinuum.sh`. `Ready` summarises
//!   [`InstanceCondition::ready_gates`](kontinuum_crds::reasons::InstanceCondition::ready_gates):
//!   `Discovered` while free; the talos-bootstrapper's `Configured`, `Joined` (and `Healthy`
//!   on a control plane) once claimed; False while the Instance is being deleted.
//! * Triggered by: Instance changes, and a re-probe every `--reprobe-interval` (sooner,
//!   `--retry-interval`, while a machine does not answer), so a machine that disappears goes
//!   `Discovered=False` and one that comes back goes `True` again.
//! * Never: probes, or rewrites the discovery of, a claimed or deleting Instance (its
//!   machine has left maintenance mode); it only recomputes `Ready` there.
//!
//! Each probe dials the addresses of `spec.interfaces` in order, each bounded by
//! `--dial-timeout`, and stops at the first that answers: Version, then COSI links,
//! addresses and disks. The machine's identity is the SHA-256 of the public key of its
//! maintenance TLS certificate. If it changes on an unclaimed Instance, the machine may have
//! been swapped: `Discovered=False` with reason `IdentityChanged` and a Warning Event, until
//! a user accepts the new identity with the annotation `kontinuum.sh/accept-identity`.
//!
//! Writes happen only on real changes: `lastSeenTime` is refreshed at most every
//! [`LAST_SEEN_RESOLUTION`], so a steady machine costs no write per probe.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kontinuum_crds::conditions::{self, ConditionStatus};
use kontinuum_crds::labels::{ACCEPT_IDENTITY, CLAIMED_BY};
use kontinuum_crds::reasons::{InstanceCondition as Cond, InstanceReason as Reason};
use kontinuum_crds::v1alpha2::{
    DiskStatus, Instance, InstanceStatus, InterfaceStatus, TalosStatus,
};
use kontinuum_operator_common::admin::{Readiness, hub_watch};
use kontinuum_operator_common::backoff::{Backoff, object_key};
use kontinuum_operator_common::error::{FORBIDDEN, ReconcileError, forbidden, retry_after_backoff};
use kontinuum_operator_common::events::Events;
use kontinuum_operator_common::metrics::ControllerMetrics;
use kontinuum_operator_common::shutdown::Shutdown;
use kontinuum_operator_common::status::StatusWrites;
use kontinuum_operator_common::tracked::forget_gone;
use kube::runtime::controller::{Action, Config as ControllerConfig, Controller};
use kube::runtime::{WatchStreamExt as _, reflector, watcher};
use kube::{Api, Client, Resource as _, ResourceExt as _};
use tracing::{info, instrument, warn};

/// The controller's name.
pub const CONTROLLER: &str = "instance-discovery";
/// Field manager of the status this controller writes.
pub const FIELD_MANAGER: &str = "instance-discovery.kontinuum.sh";
/// `lastSeenTime` is refreshed at most this often while nothing else changes.
pub const LAST_SEEN_RESOLUTION: Duration = Duration::from_secs(600);

/// What a probe of one address found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Probe {
    /// Talos version, when the machine reports it (v1.13+ does in maintenance mode).
    pub version: Option<String>,
    /// Network interfaces.
    pub interfaces: Vec<InterfaceStatus>,
    /// Disks.
    pub disks: Vec<DiskStatus>,
    /// SHA-256 of the maintenance certificate's public key.
    pub identity: Option<String>,
}

/// A failed probe: a short, secret-free description.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ProbeError(pub String);

/// Probes one address with a bound; swappable in tests.
pub type Prober = Arc<
    dyn Fn(String, Duration) -> Pin<Box<dyn Future<Output = Result<Probe, ProbeError>> + Send>>
        + Send
        + Sync,
>;

/// The real prober: a Talos maintenance-mode connection through `kontinuum-talos`.
pub fn talos_prober() -> Prober {
    Arc::new(|address: String, timeout: Duration| {
        Box::pin(async move {
            let endpoint: kontinuum_talos::Endpoint = address
                .parse()
                .map_err(|e: kontinuum_talos::Error| ProbeError(e.to_string()))?;
            let timeouts = kontinuum_talos::Timeouts {
                connect: timeout,
                rpc: timeout,
            };
            let err = |e: kontinuum_talos::Error| ProbeError(e.to_string());
            let client = kontinuum_talos::TalosClient::connect_maintenance(&endpoint, timeouts)
                .await
                .map_err(err)?;
            let version = match client.version().await {
                Ok(v) => Some(v.tag),
                // Talos <= 1.12 does not answer Version in maintenance mode.
                Err(e) if e.kind() == kontinuum_talos::ErrorKind::Unimplemented => None,
                Err(e) => return Err(err(e)),
            };
            let discovery = client.discover().await.map_err(err)?;
            let identity = client.peer_certificate().and_then(|c| c.public_key_sha256);
            Ok(Probe {
                version,
                interfaces: discovery.interfaces,
                disks: discovery.disks,
                identity,
            })
        })
    })
}

/// Settings.
#[derive(Clone, Copy, Debug)]
pub struct Settings {
    /// Bound on each address's probe.
    pub dial_timeout: Duration,
    /// Re-probe interval of a discovered machine.
    pub reprobe_interval: Duration,
    /// Re-probe interval of a machine that does not answer.
    pub retry_interval: Duration,
    /// How many Instances are probed at once.
    pub concurrency: u16,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            dial_timeout: Duration::from_secs(10),
            reprobe_interval: Duration::from_secs(300),
            retry_interval: Duration::from_secs(30),
            concurrency: 16,
        }
    }
}

/// What a reconcile needs.
pub struct Ctx {
    /// Hub client.
    pub client: Client,
    /// How to probe.
    pub prober: Prober,
    /// Settings.
    pub settings: Settings,
    /// Reconcile metrics.
    pub metrics: Arc<ControllerMetrics>,
    /// Events.
    pub events: Events,
    /// Per-Instance backoff after failures.
    pub backoff: Backoff,
    /// The Instance statuses written, so a reconcile from a cache behind them writes none
    /// again.
    pub status_writes: StatusWrites,
}

/// What can go wrong in a reconcile (a machine that does not answer is not an error: it is
/// a condition).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Writing the status failed.
    #[error("failed to patch the instance status")]
    PatchStatus(#[source] kube::Error),
}

impl ReconcileError for Error {
    fn reason(&self) -> &'static str {
        // An RBAC refusal is a person's to fix, not a failure to wait out.
        if forbidden(self).is_some() {
            return FORBIDDEN;
        }
        match self {
            Error::PatchStatus(_) => "StatusPatchFailed",
        }
    }
}

/// The outcome of probing every address of an Instance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// `spec.interfaces` is empty.
    NoInterfaces,
    /// The machine answered at `address`.
    Found {
        /// The address that answered.
        address: String,
        /// What it reported.
        probe: Probe,
    },
    /// No address answered.
    Failed {
        /// How many addresses were tried.
        tried: usize,
        /// The last error.
        last: String,
    },
}

/// Pure: the Instance's next status from the probe outcome. `accepted` is the identity the
/// user accepted through the annotation, if any.
pub fn status(
    instance: &Instance,
    outcome: &Outcome,
    accepted: Option<&str>,
    now: Timestamp,
) -> InstanceStatus {
    let generation = instance.metadata.generation;
    let current = instance.status.clone().unwrap_or_default();
    let mut next = current.clone();
    let now_time = Time(now);
    let (discovered, reason, message) = match outcome {
        Outcome::NoInterfaces => (
            ConditionStatus::False,
            Reason::NoInterfaces,
            "spec.interfaces is empty".to_string(),
        ),
        Outcome::Failed { tried, last } => (
            ConditionStatus::False,
            Reason::ProbeFailed,
            format!("all {tried} candidate(s) failed, last error: {last}"),
        ),
        Outcome::Found { address, probe } => {
            let presented = probe.identity.as_deref();
            let pinned = instance.spec.identity.as_deref();
            let changed_identity = match (pinned, current.identity.as_deref(), presented) {
                // The user's pin trusts nobody else, not even a first discovery.
                (Some(pin), _, _) => presented != Some(pin),
                (None, Some(old), Some(new)) => old != new && accepted != Some(new),
                _ => false,
            };
            if changed_identity {
                let new = presented.unwrap_or("none (no readable public key)");
                let message = match pinned {
                    Some(pin) => format!(
                        "the machine at {address} presents identity {new}, not spec.identity {pin}; if this machine is expected, set spec.identity to its identity"
                    ),
                    None => format!(
                        "the machine at {address} presents identity {new}, not the recorded one; if this machine is expected, annotate the Instance {ACCEPT_IDENTITY}={new}"
                    ),
                };
                (ConditionStatus::False, Reason::IdentityChanged, message)
            } else {
                next.address = Some(address.clone());
                next.interfaces.clone_from(&probe.interfaces);
                next.disks.clone_from(&probe.disks);
                next.talos = probe
                    .version
                    .clone()
                    .map(|v| TalosStatus { version: Some(v) });
                next.identity.clone_from(&probe.identity);
                let stale = current.last_seen_time.as_ref().is_none_or(|t| {
                    now.duration_since(t.0)
                        >= SignedDuration::try_from(LAST_SEEN_RESOLUTION)
                            .unwrap_or(SignedDuration::MAX)
                });
                if stale || next != current {
                    next.last_seen_time = Some(now_time.clone());
                }
                (
                    ConditionStatus::True,
                    Reason::Discovered,
                    format!("discovered via {address}"),
                )
            }
        }
    };
    set(
        &mut next.conditions,
        conditions::new(Cond::Discovered, discovered, reason, message, generation),
        &now_time,
    );
    let ready = conditions::ready(
        &next.conditions,
        Cond::ready_gates(false, false),
        false,
        generation,
    );
    set(&mut next.conditions, ready, &now_time);
    next.observed_generation = generation;
    next
}

/// Pure: the status of a claimed or deleting Instance, which is not probed: the same
/// discovery, `Ready` recomputed from the talos-bootstrapper's conditions (or False while
/// deleting).
pub fn summary(instance: &Instance, now: Timestamp) -> InstanceStatus {
    let mut next = instance.status.clone().unwrap_or_default();
    let claimed = instance.labels().contains_key(CLAIMED_BY);
    let control_plane = conditions::get(&next.conditions, Cond::Healthy).is_some();
    let ready = conditions::ready(
        &next.conditions,
        Cond::ready_gates(claimed, control_plane),
        instance.metadata.deletion_timestamp.is_some(),
        instance.metadata.generation,
    );
    set(&mut next.conditions, ready, &Time(now));
    next
}

/// The part of a status this controller owns: everything but other controllers' conditions.
pub fn owned(status: &InstanceStatus) -> InstanceStatus {
    let mut owned = status.clone();
    owned
        .conditions
        .retain(|c| c.type_ == Cond::Discovered.as_str() || c.type_ == Cond::Ready.as_str());
    owned
}

fn set(conditions: &mut Vec<Condition>, condition: Condition, now: &Time) {
    conditions::set(conditions, condition, now);
}

/// Probes each address in order and stops at the first that answers.
pub async fn probe_all(prober: &Prober, addresses: &[String], timeout: Duration) -> Outcome {
    if addresses.is_empty() {
        return Outcome::NoInterfaces;
    }
    let mut last = String::new();
    for address in addresses {
        // The prober bounds each call; this outer bound is a safety net against a prober
        // that does not.
        match tokio::time::timeout(timeout * 2, prober(address.clone(), timeout)).await {
            Ok(Ok(probe)) => {
                return Outcome::Found {
                    address: address.clone(),
                    probe,
                };
            }
            Ok(Err(e)) => last = format!("{address}: {e}"),
            Err(_) => last = format!("{address}: timed out after {timeout:?}"),
        }
    }
    Outcome::Failed {
        tried: addresses.len(),
        last,
    }
}

/// Writes this controller's part of `desired` unless the Instance's status already equals it
/// (or this very status was written from this version of the Instance); returns whether it
/// wrote. Only this controller's fields are sent: conditions of other owners (the
/// talos-bootstrapper's `Configured`/`Joined`/`Healthy`) must not become co-owned, or their
/// owner could never remove them.
async fn write_status(
    instance: &Instance,
    ctx: &Ctx,
    desired: &InstanceStatus,
) -> Result<bool, Error> {
    let changed = instance
        .status
        .as_ref()
        .is_none_or(|c| !conditions::status_eq_ignoring_time(c, desired));
    if !changed {
        return Ok(false);
    }
    let api: Api<Instance> = Api::namespaced(
        ctx.client.clone(),
        &instance.namespace().unwrap_or_default(),
    );
    ctx.status_writes
        .apply(&api, instance, FIELD_MANAGER, None, &owned(desired))
        .await
        .map_err(Error::PatchStatus)
}

/// Reconciles one Instance.
#[instrument(skip_all, fields(controller = CONTROLLER, instance = %instance.name_any()))]
pub async fn reconcile(instance: Arc<Instance>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let _timer = ctx.metrics.reconcile_timer();
    if instance.labels().contains_key(CLAIMED_BY) || instance.metadata.deletion_timestamp.is_some()
    {
        // Its machine has left maintenance mode: no probe, only the summary. The
        // bootstrapper's condition writes and a release are watch events.
        let desired = summary(&instance, Timestamp::now());
        write_status(&instance, &ctx, &desired).await?;
        return Ok(Action::await_change());
    }

    let outcome = probe_all(
        &ctx.prober,
        &instance.spec.interfaces,
        ctx.settings.dial_timeout,
    )
    .await;
    let accepted = instance
        .annotations()
        .get(ACCEPT_IDENTITY)
        .map(String::as_str);
    let desired = status(&instance, &outcome, accepted, Timestamp::now());
    let current = instance.status.as_ref();
    let reason_of = |s: Option<&InstanceStatus>| {
        s.and_then(|s| conditions::get(&s.conditions, Cond::Discovered))
            .map(|c| (c.status.clone(), c.reason.clone()))
    };
    let before = reason_of(current);
    let after = reason_of(Some(&desired));
    if write_status(&instance, &ctx, &desired).await? && before != after {
        report_transition(&instance, &desired, &ctx).await;
    }
    ctx.backoff.reset(&object_key(instance.as_ref()));
    let discovered = conditions::is_true(&desired.conditions, Cond::Discovered);
    Ok(Action::requeue(if discovered {
        ctx.settings.reprobe_interval
    } else {
        ctx.settings.retry_interval
    }))
}

async fn report_transition(instance: &Instance, status: &InstanceStatus, ctx: &Ctx) {
    let Some(c) = conditions::get(&status.conditions, Cond::Discovered) else {
        return;
    };
    let object = instance.object_ref(&());
    if c.status == "True" {
        info!(message = %c.message, "discovered");
        ctx.events
            .normal(&object, &c.reason, "Probe", c.message.clone())
            .await;
    } else {
        warn!(reason = %c.reason, message = %c.message, "not discovered");
        ctx.events
            .warning(&object, &c.reason, "Probe", c.message.clone())
            .await;
    }
}

/// Logs the failure, counts it, and backs off per instance.
#[allow(
    clippy::needless_pass_by_value,
    reason = "the signature Controller::run requires"
)]
pub fn error_policy(instance: Arc<Instance>, err: &Error, ctx: Arc<Ctx>) -> Action {
    retry_after_backoff(
        &object_key(instance.as_ref()),
        err,
        &ctx.metrics,
        &ctx.backoff,
    )
}

/// Runs the controller until `shutdown` triggers. `namespace` limits the watch.
pub async fn run(ctx: Ctx, namespace: Option<&str>, readiness: Readiness, shutdown: Shutdown) {
    let api: Api<Instance> = match namespace {
        Some(ns) => Api::namespaced(ctx.client.clone(), ns),
        None => Api::all(ctx.client.clone()),
    };
    let (store, writer) = reflector::store();
    let stream = forget_gone(
        hub_watch(api, watcher::Config::default(), &readiness).reflect(writer),
        store.clone(),
        vec![
            Arc::new(ctx.backoff.clone()),
            Arc::new(ctx.status_writes.clone()),
        ],
        &ctx.metrics,
    )
    .applied_objects();
    let concurrency = ctx.settings.concurrency;
    Controller::for_stream(stream, store)
        .with_config(ControllerConfig::default().concurrency(concurrency))
        .graceful_shutdown_on(async move { shutdown.wait().await })
        .run(reconcile, error_policy, Arc::new(ctx))
        .for_each(|result| async move {
            if let Err(error) = result {
                tracing::debug!(
                    error = &error as &dyn std::error::Error,
                    "reconcile did not finish"
                );
            }
        })
        .await;
}

#[cfg(test)]
mod tests;
