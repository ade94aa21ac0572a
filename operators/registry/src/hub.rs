//! The hub's lease-gated writer: heartbeats the hub's own `Kontinuum`, mirrors the store's
//! registrations into `Kontinuum` objects and sweeps stale ones.
//!
//! * Reconciles: every `Kontinuum` in `--namespace`, against the store's registrations
//!   ([`mirror::Index`]) and the hub's own entry.
//! * Owns (field manager [`FIELD_MANAGER`]): the hub's own `Kontinuum` (`--name`); every
//!   mirrored `Kontinuum` (`<region>.<zone>.<name>`, labels region/zone/
//!   [`MIRROR_LABEL`](crate::plan::MIRROR_LABEL), spec, status); the conditions
//!   `Heartbeating`, `Ready` and `Deleting` of every `Kontinuum` in the namespace; stale
//!   registration keys in the store (deleted by the sweeper).
//! * Triggered by: the Kontinuum watch (a deleted hub entry is re-created at once), the
//!   store watch (a deleted key removes its object at once), the heartbeat tick, and the
//!   moment the next entry turns stale or expires.
//! * Never: takes the region or zone of a mirrored object from anything but the store key;
//!   re-creates the hub's entry once shutdown has begun; runs on a replica that is not the
//!   leader.
//!
//! Each pass is observe (reflector + index snapshot) → [`plan`](crate::plan::plan) (pure)
//! → act (one call per action, each with a deadline) → wait for the next trigger.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use etcd_proxy::store::Store;
use futures::StreamExt as _;
use k8s_openapi::jiff::Timestamp;
use kontinuum_crds::reasons::KontinuumReason;
use kontinuum_crds::v1alpha2::Kontinuum;
use kontinuum_operator_common::backoff::delay;
use kontinuum_operator_common::events::Events;
use kontinuum_operator_common::shutdown::Shutdown;
use kontinuum_operator_common::status::status_patch;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Api, Client, Resource as _, ResourceExt as _};
use tokio::sync::Notify;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::metrics::Metrics;
use crate::mirror::{self, Index, MirrorError};
use crate::plan::{self, Action, HubEntry, Inputs, Removal};
use crate::record::whole_seconds;

/// Field manager of everything the registry writes.
pub const FIELD_MANAGER: &str = "registry.kontinuum.sh";

/// Deadline of one API call.
pub const API_TIMEOUT: Duration = Duration::from_secs(10);

/// How long deregistration on shutdown may take.
pub const DEREGISTER_TIMEOUT: Duration = Duration::from_secs(5);

/// Safety-net resync: a pass runs at least this often even if nothing signals.
pub const RESYNC: Duration = Duration::from_secs(300);

/// What the leader needs.
pub struct Hub {
    /// Hub client.
    pub client: Client,
    /// Where Kontinuum objects are written.
    pub namespace: String,
    /// The hub's own entry (its `last_heartbeat` is refreshed on every tick).
    pub entry: HubEntry,
    /// Heartbeat period of the hub's own entry.
    pub heartbeat: Duration,
    /// Time-to-live of an entry without a heartbeat, in seconds.
    pub ttl_seconds: i64,
    /// The Kontinuum store.
    pub store: Arc<Store>,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Event publisher.
    pub events: Events,
}

/// The API call an action makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Server-side apply of labels and spec.
    Apply,
    /// Server-side apply of `/status`.
    Status,
    /// Delete.
    Delete,
}

impl std::fmt::Display for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Apply => "applying",
            Self::Status => "writing the status of",
            Self::Delete => "deleting",
        })
    }
}

/// A failed action.
#[derive(Debug, thiserror::Error)]
pub enum ActError {
    /// An API call failed.
    #[error("{step} {name} failed")]
    Api {
        /// What we were doing.
        step: Step,
        /// The object.
        name: String,
        /// The cause.
        #[source]
        source: kube::Error,
    },
    /// An API call did not answer in time.
    #[error("{step} {name} timed out")]
    Timeout {
        /// What we were doing.
        step: Step,
        /// The object.
        name: String,
    },
    /// Deleting a stale key failed.
    #[error("deleting the stale registration {key} failed")]
    DeleteKey {
        /// The key.
        key: String,
        /// The cause.
        #[source]
        source: MirrorError,
    },
}

impl ActError {
    /// Stable token for metrics and logs.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Api { step, .. } | Self::Timeout { step, .. } => match step {
                Step::Apply => "ApplyFailed",
                Step::Status => "StatusPatchFailed",
                Step::Delete => "DeleteFailed",
            },
            Self::DeleteKey { .. } => "DeleteKeyFailed",
        }
    }
}

async fn timed<T>(
    step: Step,
    name: &str,
    fut: impl Future<Output = Result<T, kube::Error>>,
) -> Result<T, ActError> {
    match tokio::time::timeout(API_TIMEOUT, fut).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(source)) => Err(ActError::Api {
            step,
            name: name.to_owned(),
            source,
        }),
        Err(_) => Err(ActError::Timeout {
            step,
            name: name.to_owned(),
        }),
    }
}

fn is_status(err: &ActError, codes: &[u16]) -> bool {
    match err {
        ActError::Api {
            source: kube::Error::Api(status),
            ..
        } => codes.contains(&status.code),
        _ => false,
    }
}

/// What an action changed, for [`Written`].
enum Outcome {
    /// The object as the API server returned it after the write.
    Wrote(Box<Kontinuum>),
    /// The object (name, uid) was deleted.
    Deleted(String, Option<String>),
    /// Nothing this replica needs to remember.
    Nothing,
}

/// Carries out one action.
async fn act(hub: &Hub, api: &Api<Kontinuum>, action: &Action) -> Result<Outcome, ActError> {
    match action {
        Action::Apply { name, labels, spec } => apply(hub, api, name, labels, spec).await,
        Action::Status {
            name,
            status,
            heartbeat,
        } => write_status(hub, api, name, status, *heartbeat).await,
        Action::Delete { name, uid, why } => {
            delete(hub, api, name, uid.as_deref(), *why).await?;
            Ok(Outcome::Deleted(name.clone(), uid.clone()))
        }
        Action::DeleteKey { key, mod_revision } => {
            let deleted = mirror::delete_key(&hub.store, key, *mod_revision)
                .await
                .map_err(|source| ActError::DeleteKey {
                    key: key.clone(),
                    source,
                })?;
            if deleted {
                hub.metrics.write("delete_key");
                info!(key = %key, "stale registration removed from the store");
            }
            Ok(Outcome::Nothing)
        }
    }
}

/// Server-side applies an entry's labels and spec (creating it when missing).
async fn apply(
    hub: &Hub,
    api: &Api<Kontinuum>,
    name: &str,
    labels: &std::collections::BTreeMap<String, String>,
    spec: &kontinuum_crds::v1alpha2::KontinuumSpec,
) -> Result<Outcome, ActError> {
    let body = serde_json::json!({
        "apiVersion": "kontinuum.sh/v1alpha2",
        "kind": "Kontinuum",
        "metadata": { "name": name, "labels": labels },
        "spec": spec,
    });
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let object = timed(
        Step::Apply,
        name,
        api.patch(name, &params, &Patch::Apply(&body)),
    )
    .await?;
    hub.metrics.write("apply");
    debug!(kontinuum = %name, "applied");
    // A fresh object has no status yet: announce the entry.
    if object.status.is_none() {
        info!(kontinuum = %name, "registry entry created");
        hub.events
            .normal(
                &object.object_ref(&()),
                KontinuumReason::HeartbeatReceived.as_str(),
                "Register",
                "entry created in the registry".into(),
            )
            .await;
    }
    Ok(Outcome::Wrote(Box::new(object)))
}

/// Server-side applies the fields of `/status` this controller owns.
async fn write_status(
    hub: &Hub,
    api: &Api<Kontinuum>,
    name: &str,
    status: &kontinuum_crds::v1alpha2::KontinuumStatus,
    heartbeat: bool,
) -> Result<Outcome, ActError> {
    let patch = status_patch::<Kontinuum, _>(status);
    let params = PatchParams::apply(FIELD_MANAGER).force();
    match timed(
        Step::Status,
        name,
        api.patch_status(name, &params, &Patch::Apply(&patch)),
    )
    .await
    {
        Ok(object) => {
            hub.metrics.write("status");
            debug!(kontinuum = %name, heartbeat, "status written");
            if heartbeat {
                hub.metrics.heartbeats.inc();
            }
            Ok(Outcome::Wrote(Box::new(object)))
        }
        // Deleted meanwhile: the next pass sees it.
        Err(err) if is_status(&err, &[404]) => Ok(Outcome::Nothing),
        Err(err) => Err(err),
    }
}

/// Deletes an entry (only the object with `uid`, when given).
async fn delete(
    hub: &Hub,
    api: &Api<Kontinuum>,
    name: &str,
    uid: Option<&str>,
    why: Removal,
) -> Result<(), ActError> {
    let params = DeleteParams {
        preconditions: uid.map(|uid| Preconditions {
            uid: Some(uid.to_owned()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match timed(Step::Delete, name, api.delete(name, &params)).await {
        Ok(_) => {}
        // Gone already, or replaced by a new object of the same name.
        Err(err) if is_status(&err, &[404, 409]) => return Ok(()),
        Err(err) => return Err(err),
    }
    hub.metrics.write("delete");
    if why == Removal::Expired {
        hub.metrics.sweeps.inc();
    }
    info!(kontinuum = %name, removal = ?why, "registry entry removed");
    let reference = k8s_openapi::api::core::v1::ObjectReference {
        api_version: Some("kontinuum.sh/v1alpha2".into()),
        kind: Some("Kontinuum".into()),
        name: Some(name.to_owned()),
        namespace: Some(hub.namespace.clone()),
        uid: uid.map(ToOwned::to_owned),
        ..Default::default()
    };
    let reason = if why == Removal::Expired {
        KontinuumReason::HeartbeatStale
    } else {
        KontinuumReason::Deleting
    };
    hub.events
        .normal(
            &reference,
            reason.as_str(),
            "Delete",
            why.message(hub.ttl_seconds),
        )
        .await;
    Ok(())
}

/// How long this replica's own writes override the watch's view of an object.
pub const WRITTEN_GRACE: Duration = Duration::from_secs(10);

/// What this replica wrote and the watch has not shown yet. The reflector lags behind our
/// own writes: a pass woken by the event of a create (an object without status yet) would
/// otherwise write the status a second time, and one woken before a delete shows would
/// delete twice. Each entry lasts until the watch catches up, or [`WRITTEN_GRACE`].
#[derive(Debug, Default)]
pub struct Written {
    objects: HashMap<String, (Kontinuum, std::time::Instant)>,
    deleted: HashMap<String, (Option<String>, std::time::Instant)>,
}

fn resource_version(object: &Kontinuum) -> Option<u64> {
    object.metadata.resource_version.as_deref()?.parse().ok()
}

impl Written {
    fn record(&mut self, outcome: Outcome, now: std::time::Instant) {
        match outcome {
            Outcome::Wrote(object) => {
                let name = object.name_any();
                self.deleted.remove(&name);
                self.objects.insert(name, (*object, now));
            }
            Outcome::Deleted(name, uid) => {
                self.objects.remove(&name);
                self.deleted.insert(name, (uid, now));
            }
            Outcome::Nothing => {}
        }
    }

    /// The watch's objects, with this replica's newer writes in place of what it shows.
    /// `seen` is the latest resource version the watch delivered for each name, deletions
    /// included: our write of an object stands until the watch delivered that version or a
    /// later one (so a deletion by someone else after our write is not hidden).
    pub fn view(
        &mut self,
        observed: Vec<Arc<Kontinuum>>,
        seen: &HashMap<String, u64>,
        now: std::time::Instant,
    ) -> Vec<Arc<Kontinuum>> {
        let mut by_name: BTreeMap<String, Arc<Kontinuum>> =
            observed.into_iter().map(|o| (o.name_any(), o)).collect();
        let fresh = |at: &std::time::Instant| now.duration_since(*at) < WRITTEN_GRACE;
        // Resource versions are etcd revisions on every API server we run against; one that
        // does not parse leaves the watch's view in charge.
        self.objects.retain(|name, (ours, at)| {
            fresh(at)
                && resource_version(ours)
                    .is_some_and(|ours| seen.get(name).copied().unwrap_or(0) < ours)
        });
        self.deleted.retain(|name, (uid, at)| {
            fresh(at)
                && by_name
                    .get(name)
                    .is_some_and(|shown| shown.metadata.uid == *uid)
        });
        for (name, (ours, _)) in &self.objects {
            by_name.insert(name.clone(), Arc::new(ours.clone()));
        }
        for name in self.deleted.keys() {
            by_name.remove(name);
        }
        by_name.into_values().collect()
    }
}

/// The latest resource version the watch delivered per object name, deletions included.
pub type Seen = Arc<std::sync::Mutex<HashMap<String, u64>>>;

fn note_seen(seen: &Seen, object: &Kontinuum) {
    if let Some(rv) = resource_version(object) {
        let mut seen = seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let entry = seen.entry(object.name_any()).or_insert(0);
        *entry = (*entry).max(rv);
    }
}

/// Forgets names that neither the watch nor `written` knows any more (names of mirrors
/// change with every agent rollout).
fn prune_seen(seen: &Seen, shown: &[Arc<Kontinuum>], written: &Written) {
    let shown: std::collections::HashSet<String> = shown.iter().map(|o| o.name_any()).collect();
    seen.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .retain(|name, _| shown.contains(name) || written.objects.contains_key(name));
}

/// Watches the Kontinuums of the namespace into `writer`, waking `wake` on every event;
/// `synced` turns true once the first list is complete.
fn spawn_watch(
    api: Api<Kontinuum>,
    writer: reflector::store::Writer<Kontinuum>,
    seen: Seen,
    synced: Arc<AtomicBool>,
    wake: Arc<Notify>,
    shutdown: Shutdown,
) {
    let stream = reflector::reflector(
        writer,
        watcher(api, watcher::Config::default()).default_backoff(),
    );
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        loop {
            let event = tokio::select! {
                () = shutdown.wait() => return,
                event = stream.next() => event,
            };
            match event {
                Some(Ok(watcher::Event::InitDone)) => {
                    synced.store(true, Ordering::Release);
                    wake.notify_one();
                }
                Some(Ok(
                    watcher::Event::Apply(object)
                    | watcher::Event::InitApply(object)
                    | watcher::Event::Delete(object),
                )) => {
                    note_seen(&seen, &object);
                    wake.notify_one();
                }
                Some(Ok(watcher::Event::Init)) => wake.notify_one(),
                Some(Err(err)) => warn!(
                    error = &err as &dyn std::error::Error,
                    "watching Kontinuums failed; retrying"
                ),
                None => return,
            }
        }
    });
}

/// One pass: observe, plan, act. Returns when the next pass is due at the latest, and the
/// first failure.
async fn pass(
    hub: &Hub,
    api: &Api<Kontinuum>,
    reader: &reflector::Store<Kontinuum>,
    written: &mut Written,
    seen: &Seen,
    index: &Index,
) -> (Duration, Option<ActError>) {
    let _timer = hub.metrics.reconcile.as_ref().map(|m| m.reconcile_timer());
    let shown = reader.state();
    prune_seen(seen, &shown, written);
    let objects = {
        let seen = seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        written.view(shown, &seen, std::time::Instant::now())
    };
    let registrations = index.snapshot();
    let now = whole_seconds(Timestamp::now());
    let planned = plan::plan(&Inputs {
        hub: Some(&hub.entry),
        objects: &objects,
        registrations: registrations.as_ref(),
        now,
        ttl_seconds: hub.ttl_seconds,
    });
    for action in &planned.actions {
        match act(hub, api, action).await {
            Ok(outcome) => written.record(outcome, std::time::Instant::now()),
            Err(err) => return (RESYNC, Some(err)),
        }
    }
    let next = planned.next_wakeup.map_or(RESYNC, |at| {
        let secs = at.as_second().saturating_sub(now.as_second());
        // Half a second late: the plan judges in whole seconds.
        Duration::from_secs(u64::try_from(secs).unwrap_or(0)) + Duration::from_millis(500)
    });
    (next.min(RESYNC), None)
}

/// Deletes the hub's own entry on shutdown, within [`DEREGISTER_TIMEOUT`].
async fn deregister(hub: &Hub, api: &Api<Kontinuum>, reader: &reflector::Store<Kontinuum>) {
    let name = &hub.entry.name;
    let current = reader.get(&ObjectRef::new(name).within(&hub.namespace));
    let actions = plan::deregister(
        &hub.entry,
        current.as_deref(),
        whole_seconds(Timestamp::now()),
        hub.ttl_seconds,
    );
    let run = async {
        for action in &actions {
            act(hub, api, action).await?;
        }
        Ok::<_, ActError>(())
    };
    match tokio::time::timeout(DEREGISTER_TIMEOUT, run).await {
        Ok(Ok(())) => info!(kontinuum = %name, "deregistered the hub"),
        Ok(Err(err)) => warn!(
            error = &err as &dyn std::error::Error,
            "deregistering the hub failed"
        ),
        Err(_) => warn!("deregistering the hub timed out"),
    }
}

/// Leads until `shutdown`: mirrors the store, keeps the hub's entry and every mirror in
/// shape, sweeps stale entries; on shutdown deletes the hub's own entry (bounded by
/// [`DEREGISTER_TIMEOUT`]) and never re-creates it.
pub async fn lead(mut hub: Hub, shutdown: Shutdown) {
    let wake = Arc::new(Notify::new());
    let index = Arc::new(Index::new(Arc::clone(&wake)));
    tokio::spawn(mirror::run(
        Arc::clone(&hub.store),
        Arc::clone(&index),
        Arc::clone(&hub.metrics),
        shutdown.clone(),
    ));
    let api: Api<Kontinuum> = Api::namespaced(hub.client.clone(), &hub.namespace);
    let (reader, writer) = reflector::store();
    let synced = Arc::new(AtomicBool::new(false));
    let seen = Seen::default();
    spawn_watch(
        api.clone(),
        writer,
        Arc::clone(&seen),
        Arc::clone(&synced),
        Arc::clone(&wake),
        shutdown.clone(),
    );

    let mut ticker = tokio::time::interval(hub.heartbeat);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut next_pass: Option<Instant> = None;
    let mut failures = 0u32;
    let mut written = Written::default();
    loop {
        tokio::select! {
            () = shutdown.wait() => break,
            _ = ticker.tick() => {
                hub.entry.last_heartbeat = whole_seconds(Timestamp::now());
            }
            () = wake.notified() => {}
            () = sleep_until(next_pass) => {}
        }
        if !synced.load(Ordering::Acquire) {
            continue;
        }
        let (next, failed) = pass(&hub, &api, &reader, &mut written, &seen, &index).await;
        next_pass = Some(Instant::now() + next);
        match failed {
            None => failures = 0,
            Some(err) => {
                hub.metrics.failure(err.reason());
                warn!(
                    reason = err.reason(),
                    error = &err as &dyn std::error::Error,
                    "registry pass failed; retrying"
                );
                let retry = delay(
                    Duration::from_millis(500),
                    Duration::from_secs(30),
                    failures,
                );
                failures = failures.saturating_add(1);
                next_pass = Some(Instant::now() + retry);
            }
        }
    }
    // Shutdown: the entry goes, and nothing above runs again to re-create it.
    deregister(&hub, &api, &reader).await;
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    fn object(name: &str, uid: &str, rv: u64) -> Kontinuum {
        Kontinuum {
            metadata: ObjectMeta {
                name: Some(name.into()),
                uid: Some(uid.into()),
                resource_version: Some(rv.to_string()),
                ..ObjectMeta::default()
            },
            spec: kontinuum_crds::v1alpha2::KontinuumSpec::default(),
            status: None,
        }
    }

    fn rvs(view: &[Arc<Kontinuum>]) -> Vec<(String, Option<u64>)> {
        view.iter()
            .map(|o| (o.name_any(), resource_version(o)))
            .collect()
    }

    fn seen(pairs: &[(&str, u64)]) -> HashMap<String, u64> {
        pairs.iter().map(|(n, rv)| ((*n).to_owned(), *rv)).collect()
    }

    #[test]
    fn our_writes_override_a_lagging_watch_until_it_catches_up() {
        let now = std::time::Instant::now();
        let mut written = Written::default();
        written.record(Outcome::Wrote(Box::new(object("hub", "u1", 12))), now);
        // The watch has not delivered the create yet: our object stands in.
        let view = written.view(Vec::new(), &seen(&[]), now);
        assert_eq!(rvs(&view), [("hub".into(), Some(12))]);
        // It shows the create (rv 11) but not yet our status write (rv 12).
        let view = written.view(
            vec![Arc::new(object("hub", "u1", 11))],
            &seen(&[("hub", 11)]),
            now,
        );
        assert_eq!(rvs(&view), [("hub".into(), Some(12))]);
        // Caught up: the watch's view again, and the entry is forgotten.
        let caught_up = seen(&[("hub", 13)]);
        let view = written.view(vec![Arc::new(object("hub", "u1", 13))], &caught_up, now);
        assert_eq!(rvs(&view), [("hub".into(), Some(13))]);
        let view = written.view(vec![Arc::new(object("hub", "u1", 11))], &caught_up, now);
        assert_eq!(rvs(&view), [("hub".into(), Some(11))]);
    }

    #[test]
    fn deletions_by_others_are_seen_and_our_deletions_hide_the_object() {
        let now = std::time::Instant::now();
        let mut written = Written::default();
        written.record(Outcome::Wrote(Box::new(object("hub", "u1", 12))), now);
        // Someone deleted it after our write: the watch delivered the deletion (rv 14).
        assert!(
            written
                .view(Vec::new(), &seen(&[("hub", 14)]), now)
                .is_empty()
        );

        written.record(Outcome::Deleted("gone".into(), Some("u2".into())), now);
        let lagging = vec![Arc::new(object("gone", "u2", 20))];
        assert!(
            written
                .view(lagging.clone(), &seen(&[("gone", 20)]), now)
                .is_empty()
        );
        // A new object of the same name is shown.
        let recreated = vec![Arc::new(object("gone", "u3", 30))];
        assert_eq!(
            written.view(recreated, &seen(&[("gone", 30)]), now).len(),
            1
        );
        // And entries expire.
        written.record(Outcome::Deleted("gone".into(), Some("u2".into())), now);
        let later = now + WRITTEN_GRACE;
        assert_eq!(
            written.view(lagging, &seen(&[("gone", 20)]), later).len(),
            1
        );
    }
}
