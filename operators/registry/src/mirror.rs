//! The store side of the hub: one list + watch of `/kontinuum.sh/zones/` on the Kontinuum
//! store feeding an in-memory [`Index`] of valid registrations (the linkerd shape: a watch
//! feeds an index, a separate lease-gated writer reads it, see [`hub`](crate::hub)).
//!
//! * List (paged, pinned to the first page's revision), then watch from revision + 1.
//! * A broken watch is resumed from the last revision seen (no event is lost or replayed
//!   twice); a watch the store cancels because that revision was compacted leads to a
//!   fresh list, which replaces the whole index (so deletions missed meanwhile converge).
//! * Only keys [`RegistrationKey::parse`] accepts are indexed; values are read with
//!   [`Mirrored::from_value`] (bounded; the region and zone come from the key).
//!
//! Never writes to the store (the hub's sweeper deletes stale keys, see
//! [`delete_key`]).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use etcd_proxy::store::Store;
use k8s_openapi::jiff::Timestamp;
use kontinuum_operator_common::backoff::delay;
use kontinuum_operator_common::shutdown::Shutdown;
use kontinuum_proto::etcd::etcdserverpb as pb;
use kontinuum_proto::etcd::mvccpb;
use tokio::sync::{Notify, mpsc};
use tokio_stream::StreamExt as _;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;
use tracing::{debug, info, warn};

use crate::metrics::Metrics;
use crate::record::{Mirrored, RegistrationKey, ZONES_PREFIX, prefix_range_end};

/// Deadline of one unary call to the store.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// Keys per page of the initial list.
const PAGE: i64 = 500;

/// The registrations the store holds, by mirrored object name.
#[derive(Debug)]
pub struct Index {
    state: Mutex<State>,
    wake: Arc<Notify>,
}

#[derive(Debug, Default)]
struct State {
    synced: bool,
    entries: BTreeMap<String, Mirrored>,
}

impl Index {
    /// An empty, unsynced index that notifies `wake` on every change.
    pub fn new(wake: Arc<Notify>) -> Self {
        Self {
            state: Mutex::new(State::default()),
            wake,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The registrations, or `None` until the first full list has been read.
    pub fn snapshot(&self) -> Option<BTreeMap<String, Mirrored>> {
        let state = self.lock();
        state.synced.then(|| state.entries.clone())
    }

    /// How many registrations are indexed.
    pub fn len(&self) -> usize {
        self.lock().entries.len()
    }

    /// Whether no registration is indexed.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Replaces everything with the result of a full list.
    pub fn replace(&self, entries: impl IntoIterator<Item = Mirrored>) {
        {
            let mut state = self.lock();
            state.entries = entries
                .into_iter()
                .map(|m| (m.key.object_name(), m))
                .collect();
            state.synced = true;
        }
        self.wake.notify_one();
    }

    /// Adds or replaces one registration.
    pub fn upsert(&self, mirrored: Mirrored) {
        self.lock()
            .entries
            .insert(mirrored.key.object_name(), mirrored);
        self.wake.notify_one();
    }

    /// Removes one registration.
    pub fn remove(&self, key: &RegistrationKey) {
        let removed = self.lock().entries.remove(&key.object_name()).is_some();
        if removed {
            self.wake.notify_one();
        }
    }
}

/// Why a list or watch stopped.
#[derive(Debug, thiserror::Error)]
pub enum MirrorError {
    /// A store call failed.
    #[error("store call {call} failed")]
    Store {
        /// The call.
        call: &'static str,
        /// The cause.
        #[source]
        source: Status,
    },
    /// A store call took longer than [`CALL_TIMEOUT`].
    #[error("store call {call} timed out")]
    Timeout {
        /// The call.
        call: &'static str,
    },
    /// The watch ended or was cancelled by the store.
    #[error("the store ended the watch: {reason}")]
    WatchEnded {
        /// What the store said.
        reason: String,
    },
}

impl MirrorError {
    /// A stable token for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Store { .. } => "StoreCallFailed",
            Self::Timeout { .. } => "StoreTimeout",
            Self::WatchEnded { .. } => "WatchEnded",
        }
    }
}

async fn call<T>(
    store: &Store,
    name: &'static str,
    fut: impl Future<Output = Result<tonic::Response<T>, Status>>,
) -> Result<T, MirrorError> {
    match tokio::time::timeout(CALL_TIMEOUT, fut).await {
        Ok(Ok(response)) => Ok(response.into_inner()),
        Ok(Err(source)) => {
            store.observe(&source);
            Err(MirrorError::Store { call: name, source })
        }
        Err(_) => Err(MirrorError::Timeout { call: name }),
    }
}

/// Reads one key-value of the prefix; `None` when it is not a registration or its value
/// is refused (counted).
fn read(kv: &mvccpb::KeyValue, observed: Timestamp, metrics: &Metrics) -> Option<Mirrored> {
    let key = RegistrationKey::parse(&kv.key)?;
    match Mirrored::from_value(key, &kv.value, kv.mod_revision, observed) {
        Ok(m) => {
            if m.mismatched {
                metrics.mirror_event("mismatch");
                debug!(
                    key = %m.key.key(),
                    "registration value names another location; the key wins"
                );
            }
            Some(m)
        }
        Err(err) => {
            metrics.mirror_event("invalid");
            warn!(
                key = %String::from_utf8_lossy(&kv.key),
                reason = err.reason(),
                "registration value refused"
            );
            None
        }
    }
}

/// Lists every registration (paged, at one revision); returns the revision and them.
pub async fn list(store: &Store, metrics: &Metrics) -> Result<(i64, Vec<Mirrored>), MirrorError> {
    let prefix = ZONES_PREFIX.as_bytes().to_vec();
    let end = prefix_range_end(&prefix);
    let mut from = prefix;
    let mut revision = 0;
    let mut out = Vec::new();
    loop {
        let request = pb::RangeRequest {
            key: from.clone(),
            range_end: end.clone(),
            limit: PAGE,
            revision,
            ..Default::default()
        };
        let mut kv = store.kv();
        let page = call(store, "Range", kv.range(request)).await?;
        if revision == 0 {
            revision = page.header.as_ref().map_or(0, |h| h.revision);
        }
        let observed = Timestamp::now();
        out.extend(page.kvs.iter().filter_map(|kv| read(kv, observed, metrics)));
        match page.kvs.last() {
            Some(last) if page.more => {
                from.clone_from(&last.key);
                from.push(0);
            }
            _ => break,
        }
    }
    Ok((revision, out))
}

/// How a watch ended.
enum WatchEnd {
    /// The start revision was compacted: list again.
    Compacted,
    /// The stream broke; resume from this revision.
    Broken(i64, MirrorError),
    /// Shutdown.
    Stopped,
}

/// Applies one watch event to the index; returns its revision.
fn apply(event: &mvccpb::Event, index: &Index, metrics: &Metrics) -> Option<i64> {
    let kv = event.kv.as_ref()?;
    if event.r#type == mvccpb::event::EventType::Delete as i32 {
        if let Some(key) = RegistrationKey::parse(&kv.key) {
            metrics.mirror_event("delete");
            index.remove(&key);
        }
    } else if let Some(key) = RegistrationKey::parse(&kv.key) {
        metrics.mirror_event("put");
        match read(kv, Timestamp::now(), metrics) {
            Some(m) => index.upsert(m),
            // A refused value: the key no longer holds a registration the hub can mirror.
            None => index.remove(&key),
        }
    }
    Some(kv.mod_revision)
}

async fn watch(
    store: &Store,
    start: i64,
    index: &Index,
    metrics: &Metrics,
    shutdown: &Shutdown,
) -> WatchEnd {
    let prefix = ZONES_PREFIX.as_bytes().to_vec();
    let (tx, rx) = mpsc::channel(4);
    let create = pb::WatchRequest {
        request_union: Some(pb::watch_request::RequestUnion::CreateRequest(
            pb::WatchCreateRequest {
                range_end: prefix_range_end(&prefix),
                key: prefix,
                start_revision: start,
                progress_notify: true,
                ..Default::default()
            },
        )),
    };
    // The channel has room: this cannot fail.
    let _ = tx.try_send(create);
    let mut client = store.watch();
    let opened = tokio::time::timeout(CALL_TIMEOUT, client.watch(ReceiverStream::new(rx))).await;
    let mut stream = match opened {
        Ok(Ok(response)) => response.into_inner(),
        Ok(Err(source)) => {
            store.observe(&source);
            return WatchEnd::Broken(
                start - 1,
                MirrorError::Store {
                    call: "Watch",
                    source,
                },
            );
        }
        Err(_) => return WatchEnd::Broken(start - 1, MirrorError::Timeout { call: "Watch" }),
    };
    let mut revision = start - 1;
    loop {
        let message = tokio::select! {
            () = shutdown.wait() => return WatchEnd::Stopped,
            message = stream.next() => message,
        };
        let response = match message {
            Some(Ok(response)) => response,
            Some(Err(source)) => {
                store.observe(&source);
                return WatchEnd::Broken(
                    revision,
                    MirrorError::Store {
                        call: "Watch",
                        source,
                    },
                );
            }
            None => {
                return WatchEnd::Broken(
                    revision,
                    MirrorError::WatchEnded {
                        reason: "the stream closed".into(),
                    },
                );
            }
        };
        if response.compact_revision > 0 {
            info!(
                compacted = response.compact_revision,
                "watch revision was compacted; listing again"
            );
            return WatchEnd::Compacted;
        }
        if response.canceled {
            return WatchEnd::Broken(
                revision,
                MirrorError::WatchEnded {
                    reason: response.cancel_reason,
                },
            );
        }
        for event in &response.events {
            if let Some(r) = apply(event, index, metrics) {
                revision = revision.max(r);
            }
        }
        // Progress notifications (no events) carry the store's revision: everything
        // before it has been seen.
        if response.events.is_empty()
            && let Some(header) = &response.header
            && !response.created
        {
            revision = revision.max(header.revision);
        }
        metrics
            .registrations
            .set(i64::try_from(index.len()).unwrap_or(i64::MAX));
    }
}

/// Mirrors the store's registrations into `index` until `shutdown`.
pub async fn run(store: Arc<Store>, index: Arc<Index>, metrics: Arc<Metrics>, shutdown: Shutdown) {
    let mut resume: Option<i64> = None;
    let mut failures = 0u32;
    loop {
        let from = match resume {
            Some(revision) => revision,
            None => match list(&store, &metrics).await {
                Ok((revision, entries)) => {
                    metrics.mirror_event("list");
                    info!(
                        revision,
                        registrations = entries.len(),
                        "listed zone registrations"
                    );
                    index.replace(entries);
                    metrics
                        .registrations
                        .set(i64::try_from(index.len()).unwrap_or(i64::MAX));
                    failures = 0;
                    revision
                }
                Err(err) => {
                    metrics.failure(err.reason());
                    warn!(
                        error = &err as &dyn std::error::Error,
                        "listing zone registrations failed"
                    );
                    if pause(&mut failures, &shutdown).await {
                        return;
                    }
                    continue;
                }
            },
        };
        match watch(&store, from + 1, &index, &metrics, &shutdown).await {
            WatchEnd::Stopped => return,
            WatchEnd::Compacted => {
                metrics.mirror_event("compacted");
                resume = None;
            }
            WatchEnd::Broken(revision, err) => {
                metrics.mirror_event("watch_error");
                metrics.failure(err.reason());
                warn!(
                    revision,
                    error = &err as &dyn std::error::Error,
                    "watch of zone registrations broke; resuming"
                );
                // Events up to `revision` were applied; a watch that made progress
                // resets the backoff.
                if revision > from {
                    failures = 0;
                }
                resume = Some(revision);
                if pause(&mut failures, &shutdown).await {
                    return;
                }
            }
        }
    }
}

/// Waits out the backoff after a failure; true when shutting down.
async fn pause(failures: &mut u32, shutdown: &Shutdown) -> bool {
    let wait = delay(
        Duration::from_millis(200),
        Duration::from_secs(10),
        *failures,
    );
    *failures = failures.saturating_add(1);
    tokio::select! {
        () = shutdown.wait() => true,
        () = tokio::time::sleep(wait) => false,
    }
}

/// Deletes `key` if it still holds the value of `mod_revision` (a sweep must not remove a
/// registration that heartbeated meanwhile). Returns whether it was deleted.
pub async fn delete_key(store: &Store, key: &str, mod_revision: i64) -> Result<bool, MirrorError> {
    let txn = pb::TxnRequest {
        compare: vec![pb::Compare {
            result: pb::compare::CompareResult::Equal as i32,
            target: pb::compare::CompareTarget::Mod as i32,
            key: key.as_bytes().to_vec(),
            range_end: Vec::new(),
            target_union: Some(pb::compare::TargetUnion::ModRevision(mod_revision)),
        }],
        success: vec![pb::RequestOp {
            request: Some(pb::request_op::Request::RequestDeleteRange(
                pb::DeleteRangeRequest {
                    key: key.as_bytes().to_vec(),
                    ..Default::default()
                },
            )),
        }],
        failure: Vec::new(),
    };
    let mut kv = store.kv();
    let response = call(store, "Txn", kv.txn(txn)).await?;
    Ok(response.succeeded)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(key: &str, value: &str, rev: i64) -> mvccpb::KeyValue {
        mvccpb::KeyValue {
            key: key.as_bytes().to_vec(),
            value: value.as_bytes().to_vec(),
            mod_revision: rev,
            ..Default::default()
        }
    }

    fn event(kind: mvccpb::event::EventType, kv: mvccpb::KeyValue) -> mvccpb::Event {
        mvccpb::Event {
            r#type: kind as i32,
            kv: Some(kv),
            prev_kv: None,
        }
    }

    #[test]
    fn watch_events_maintain_the_index() {
        let wake = Arc::new(Notify::new());
        let index = Index::new(Arc::clone(&wake));
        let metrics = Metrics::default();
        assert_eq!(index.snapshot(), None, "unsynced until listed");
        index.replace([]);
        let key = "/kontinuum.sh/zones/eu/1a/registry/a";
        let put = event(mvccpb::event::EventType::Put, kv(key, "{}", 5));
        assert_eq!(apply(&put, &index, &metrics), Some(5));
        let snapshot = index.snapshot().unwrap();
        assert_eq!(snapshot["eu.1a.a"].mod_revision, 5);

        // Other keys of the zone are not registrations; their revision still counts.
        let other = event(
            mvccpb::event::EventType::Put,
            kv("/kontinuum.sh/zones/eu/1a/data", "x", 6),
        );
        assert_eq!(apply(&other, &index, &metrics), Some(6));
        assert_eq!(index.len(), 1);

        // A refused value removes the registration.
        let garbage = event(mvccpb::event::EventType::Put, kv(key, "garbage", 7));
        apply(&garbage, &index, &metrics);
        assert!(index.is_empty());
        apply(&put, &index, &metrics);
        let delete = event(mvccpb::event::EventType::Delete, kv(key, "", 8));
        assert_eq!(apply(&delete, &index, &metrics), Some(8));
        assert!(index.snapshot().unwrap().is_empty());
    }
}
