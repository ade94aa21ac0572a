//! `etcd-proxy serve`: the hub side. Serves etcd v3 `KV`, `Watch` and `Lease` to zones and
//! forwards each call to the store once it is authenticated ([`token`](crate::token)) and
//! authorized ([`authz`](crate::authz)).
//!
//! * Every call first authenticates its bearer token against the zone identities in the
//!   [`Zones`] index (no API call per RPC); any failure is `Unauthenticated`. A token seen
//!   before is answered from [`VerifiedTokens`], which checks again on every call what can
//!   change (the key still trusted, the token's times), so revocation is as quick as without.
//! * Every key, range, compare and op must lie in the zone's prefix, every watch range too;
//!   `Compact` is refused; anything refused is `PermissionDenied` and never reaches the store.
//! * Leases: `LeaseGrant` records the owner at `/kontinuum.sh/proxy/leases/<id>` (attached to
//!   the lease, so the record lives exactly as long as the lease); revoke, keep-alive,
//!   time-to-live and attaching (a Put or Txn with `lease`) need that record to name the
//!   caller. Attaching is checked by the store in the same Txn as the write, so it is atomic.
//!   `LeaseLeases` lists only the caller's leases. A lease that does not exist at all is
//!   answered as etcd answers (not found, TTL -1 or 0), so a zone's own expired lease looks
//!   as it would on etcd.
//! * Streams (Watch, LeaseKeepAlive) authenticate once when they open, are checked message by
//!   message, and are ended `Unauthenticated` when the zone's identity is revoked or rotated
//!   away from the key that opened them.
//!
//! Never: forwards a refused request, clips a range, passes the store's own metadata (e.g.
//! etcd auth `token`) through, or logs a token.

use std::collections::{BTreeSet, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use kontinuum_proto::etcd::etcdserverpb as pb;
use pb::{kv_server::Kv, lease_server::Lease, watch_server::Watch};
use tokio::sync::mpsc;
use tokio_stream::StreamExt as _;
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::MetadataMap;
use tonic::{Code, Request, Response, Status, Streaming};
use tracing::debug;

use crate::authz::{self, Denied, LEASE_OWNERS_PREFIX};
use crate::identity::ZoneIdentity;
use crate::metrics::{Metrics, StreamGuard};
use crate::store::Store;
use crate::token::{self, VerifiedTokens, unix_now};
use crate::zones::{Lookup, Zones};

/// Timeout of one unary call to the store.
const STORE_TIMEOUT: Duration = Duration::from_secs(30);
/// Verified tokens kept (see [`VerifiedTokens`]): with the relay's one token per second, one
/// entry per zone.
const VERIFIED_TOKENS: usize = 4096;
/// Metadata passed from the zone to the store (clientv3's `WithRequireLeader`).
const PASSED_METADATA: &[&str] = &["hasleader"];
/// etcd's own answer for a lease that does not exist.
const LEASE_NOT_FOUND: &str = "etcdserver: requested lease not found";

type BoxStream<T> = std::pin::Pin<Box<dyn futures::Stream<Item = Result<T, Status>> + Send>>;

/// The proxy's gRPC services (one value serves KV, Watch and Lease).
#[derive(Clone)]
pub struct Proxy {
    zones: Arc<Zones>,
    store: Arc<Store>,
    metrics: Arc<Metrics>,
    tokens: Arc<VerifiedTokens>,
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proxy")
            .field("store", &self.store)
            .finish_non_exhaustive()
    }
}

/// An authenticated caller.
#[derive(Clone, Debug)]
struct Caller {
    identity: Arc<ZoneIdentity>,
    key: [u8; 32],
}

/// Whose a lease is.
enum Access {
    Owned,
    Foreign,
    /// No such lease (with the store's header, for answers shaped like etcd's).
    Missing(Option<pb::ResponseHeader>),
}

fn forward<T>(md: &MetadataMap, msg: T, timeout: Option<Duration>) -> Request<T> {
    let mut req = Request::new(msg);
    for key in PASSED_METADATA {
        if let Some(value) = md.get(*key) {
            req.metadata_mut().insert(*key, value.clone());
        }
    }
    if let Some(timeout) = timeout {
        req.set_timeout(timeout);
    }
    req
}

fn internal(what: &str) -> Status {
    Status::internal(format!("etcd-proxy: {what}"))
}

impl Proxy {
    /// Services backed by `zones` and `store`, counting into `metrics`.
    pub fn new(zones: Arc<Zones>, store: Arc<Store>, metrics: Arc<Metrics>) -> Self {
        Self {
            zones,
            store,
            metrics,
            tokens: Arc::new(VerifiedTokens::new(VERIFIED_TOKENS)),
        }
    }

    fn authenticate(&self, md: &MetadataMap) -> Result<Caller, Status> {
        let mut found = None;
        let verified = token::bearer(
            md.get("authorization")
                .map(tonic::metadata::MetadataValue::as_bytes),
        )
        .and_then(|t| {
            self.tokens
                .verify(t, unix_now(), |zone| match self.zones.lookup(zone) {
                    Lookup::Found(identity) => {
                        let keys = identity.keys.clone();
                        found = Some(identity);
                        Some(keys)
                    }
                    Lookup::Unknown | Lookup::Ambiguous => None,
                })
        });
        match (verified, found) {
            (Ok(v), Some(identity)) => Ok(Caller {
                identity,
                key: v.key,
            }),
            (Err(err), _) => {
                self.metrics.authn_failure(err.reason());
                Err(Status::unauthenticated(err.to_string()))
            }
            (Ok(_), None) => {
                let err = token::TokenError::UnknownZone;
                self.metrics.authn_failure(err.reason());
                Err(Status::unauthenticated(err.to_string()))
            }
        }
    }

    fn deny(&self, denied: Denied) -> Status {
        self.metrics.authz_failure(denied.reason());
        Status::permission_denied(format!("etcd-proxy: permission denied: {denied}"))
    }

    fn authorize(&self, check: Result<(), Denied>) -> Result<(), Status> {
        check.map_err(|d| self.deny(d))
    }

    /// The store's answer, without the store's response metadata.
    fn answer<T>(&self, result: Result<Response<T>, Status>) -> Result<Response<T>, Status> {
        match result {
            Ok(resp) => Ok(Response::new(resp.into_inner())),
            Err(status) => {
                self.store.observe(&status);
                Err(status)
            }
        }
    }

    fn count<T>(&self, method: &'static str, result: Result<T, Status>) -> Result<T, Status> {
        let code = result.as_ref().map_or_else(Status::code, |_| Code::Ok);
        self.metrics.request(method, code);
        result
    }

    /// Counts a stream refused before it opened.
    fn refused_stream(&self, method: &'static str, status: Status) -> Status {
        self.metrics.request(method, status.code());
        status
    }

    async fn lease_access(&self, md: &MetadataMap, zone: &str, id: i64) -> Result<Access, Status> {
        let range = pb::RangeRequest {
            key: authz::lease_owner_key(id),
            ..Default::default()
        };
        let owner = self
            .answer(
                self.store
                    .kv()
                    .range(forward(md, range, Some(STORE_TIMEOUT)))
                    .await,
            )?
            .into_inner();
        if let Some(kv) = owner.kvs.first() {
            return Ok(if kv.value == zone.as_bytes() {
                Access::Owned
            } else {
                Access::Foreign
            });
        }
        let ttl = pb::LeaseTimeToLiveRequest { id, keys: false };
        let ttl = self
            .answer(
                self.store
                    .lease()
                    .lease_time_to_live(forward(md, ttl, Some(STORE_TIMEOUT)))
                    .await,
            )?
            .into_inner();
        Ok(if ttl.ttl == -1 {
            Access::Missing(ttl.header)
        } else {
            Access::Foreign
        })
    }

    /// Why a write attaching `leases` did not pass its ownership compares.
    async fn lease_refusal(&self, md: &MetadataMap, zone: &str, leases: &BTreeSet<i64>) -> Status {
        let mut missing = false;
        for &id in leases {
            match self.lease_access(md, zone, id).await {
                Ok(Access::Owned) => {}
                Ok(Access::Missing(_)) => missing = true,
                Ok(Access::Foreign) => return self.deny(Denied::ForeignLease),
                Err(status) => return status,
            }
        }
        if missing {
            Status::not_found(LEASE_NOT_FOUND)
        } else {
            // Every lease is ours now: it changed hands while we looked. Let the caller retry.
            Status::aborted("etcd-proxy: lease ownership changed; retry")
        }
    }

    /// Runs `op` (a put or a zone's Txn that attaches `leases`) inside a Txn that checks
    /// ownership of every lease atomically with it; returns the op's response.
    async fn with_owned_leases(
        &self,
        md: &MetadataMap,
        zone: &str,
        leases: &BTreeSet<i64>,
        op: pb::RequestOp,
    ) -> Result<(Option<pb::ResponseHeader>, pb::response_op::Response), Status> {
        let txn = authz::owned_leases_txn(zone, leases, op);
        let resp = self
            .answer(
                self.store
                    .kv()
                    .txn(forward(md, txn, Some(STORE_TIMEOUT)))
                    .await,
            )?
            .into_inner();
        if !resp.succeeded {
            return Err(self.lease_refusal(md, zone, leases).await);
        }
        let inner = resp
            .responses
            .into_iter()
            .next()
            .and_then(|r| r.response)
            .ok_or_else(|| internal("the store answered an empty transaction"))?;
        Ok((resp.header, inner))
    }

    async fn serve_range(
        &self,
        req: Request<pb::RangeRequest>,
    ) -> Result<Response<pb::RangeResponse>, Status> {
        let caller = self.authenticate(req.metadata())?;
        let (md, _, msg) = req.into_parts();
        self.authorize(authz::check_range(&caller.identity.scope, &msg))?;
        self.answer(
            self.store
                .kv()
                .range(forward(&md, msg, Some(STORE_TIMEOUT)))
                .await,
        )
    }

    async fn serve_put(
        &self,
        req: Request<pb::PutRequest>,
    ) -> Result<Response<pb::PutResponse>, Status> {
        let caller = self.authenticate(req.metadata())?;
        let (md, _, msg) = req.into_parts();
        self.authorize(authz::check_put(&caller.identity.scope, &msg))?;
        if msg.lease == 0 || msg.ignore_lease {
            return self.answer(
                self.store
                    .kv()
                    .put(forward(&md, msg, Some(STORE_TIMEOUT)))
                    .await,
            );
        }
        let leases = BTreeSet::from([msg.lease]);
        let op = pb::RequestOp {
            request: Some(pb::request_op::Request::RequestPut(msg)),
        };
        match self
            .with_owned_leases(&md, &caller.identity.name, &leases, op)
            .await?
        {
            (header, pb::response_op::Response::ResponsePut(mut put)) => {
                put.header = header;
                Ok(Response::new(put))
            }
            _ => Err(internal("the store answered a put with another operation")),
        }
    }

    async fn serve_delete_range(
        &self,
        req: Request<pb::DeleteRangeRequest>,
    ) -> Result<Response<pb::DeleteRangeResponse>, Status> {
        let caller = self.authenticate(req.metadata())?;
        let (md, _, msg) = req.into_parts();
        self.authorize(authz::check_delete(&caller.identity.scope, &msg))?;
        self.answer(
            self.store
                .kv()
                .delete_range(forward(&md, msg, Some(STORE_TIMEOUT)))
                .await,
        )
    }

    async fn serve_txn(
        &self,
        req: Request<pb::TxnRequest>,
    ) -> Result<Response<pb::TxnResponse>, Status> {
        let caller = self.authenticate(req.metadata())?;
        let (md, _, msg) = req.into_parts();
        self.authorize(authz::check_txn(&caller.identity.scope, &msg))?;
        let leases = authz::txn_leases(&msg);
        if leases.is_empty() {
            return self.answer(
                self.store
                    .kv()
                    .txn(forward(&md, msg, Some(STORE_TIMEOUT)))
                    .await,
            );
        }
        let op = pb::RequestOp {
            request: Some(pb::request_op::Request::RequestTxn(msg)),
        };
        match self
            .with_owned_leases(&md, &caller.identity.name, &leases, op)
            .await?
        {
            (header, pb::response_op::Response::ResponseTxn(mut txn)) => {
                txn.header = header;
                Ok(Response::new(txn))
            }
            _ => Err(internal(
                "the store answered a transaction with another operation",
            )),
        }
    }

    async fn serve_lease_grant(
        &self,
        req: Request<pb::LeaseGrantRequest>,
    ) -> Result<Response<pb::LeaseGrantResponse>, Status> {
        let caller = self.authenticate(req.metadata())?;
        let (md, _, msg) = req.into_parts();
        let granted = self
            .answer(
                self.store
                    .lease()
                    .lease_grant(forward(&md, msg, Some(STORE_TIMEOUT)))
                    .await,
            )?
            .into_inner();
        if granted.id == 0 {
            return Ok(Response::new(granted));
        }
        // Record the owner, attached to the lease itself; a record left by an older lease
        // of the same id died with it, so one already there means something is wrong.
        let key = authz::lease_owner_key(granted.id);
        let record = pb::TxnRequest {
            compare: vec![pb::Compare {
                result: pb::compare::CompareResult::Equal.into(),
                target: pb::compare::CompareTarget::Create.into(),
                key: key.clone(),
                target_union: Some(pb::compare::TargetUnion::CreateRevision(0)),
                range_end: Vec::new(),
            }],
            success: vec![pb::RequestOp {
                request: Some(pb::request_op::Request::RequestPut(pb::PutRequest {
                    key,
                    value: caller.identity.name.as_bytes().to_vec(),
                    lease: granted.id,
                    ..Default::default()
                })),
            }],
            failure: Vec::new(),
        };
        let recorded = self
            .store
            .kv()
            .txn(forward(&md, record, Some(STORE_TIMEOUT)))
            .await;
        if matches!(&recorded, Ok(r) if r.get_ref().succeeded) {
            return Ok(Response::new(granted));
        }
        // An ownerless lease would be nobody's: take it back.
        let revoke = pb::LeaseRevokeRequest { id: granted.id };
        let _ = self
            .store
            .lease()
            .lease_revoke(forward(&md, revoke, Some(STORE_TIMEOUT)))
            .await;
        Err(Status::unavailable(
            "etcd-proxy: recording the lease's owner failed",
        ))
    }

    async fn serve_lease_revoke(
        &self,
        req: Request<pb::LeaseRevokeRequest>,
    ) -> Result<Response<pb::LeaseRevokeResponse>, Status> {
        let caller = self.authenticate(req.metadata())?;
        let (md, _, msg) = req.into_parts();
        match self
            .lease_access(&md, &caller.identity.name, msg.id)
            .await?
        {
            Access::Owned => self.answer(
                self.store
                    .lease()
                    .lease_revoke(forward(&md, msg, Some(STORE_TIMEOUT)))
                    .await,
            ),
            Access::Missing(_) => Err(Status::not_found(LEASE_NOT_FOUND)),
            Access::Foreign => Err(self.deny(Denied::ForeignLease)),
        }
    }

    async fn serve_lease_time_to_live(
        &self,
        req: Request<pb::LeaseTimeToLiveRequest>,
    ) -> Result<Response<pb::LeaseTimeToLiveResponse>, Status> {
        let caller = self.authenticate(req.metadata())?;
        let (md, _, msg) = req.into_parts();
        let id = msg.id;
        match self.lease_access(&md, &caller.identity.name, id).await? {
            Access::Owned => {
                let mut resp = self
                    .answer(
                        self.store
                            .lease()
                            .lease_time_to_live(forward(&md, msg, Some(STORE_TIMEOUT)))
                            .await,
                    )?
                    .into_inner();
                // The owner record is attached too; it is the proxy's, not the zone's.
                resp.keys.retain(|k| caller.identity.scope.contains_key(k));
                Ok(Response::new(resp))
            }
            Access::Missing(header) => Ok(Response::new(pb::LeaseTimeToLiveResponse {
                header,
                id,
                ttl: -1,
                ..Default::default()
            })),
            Access::Foreign => Err(self.deny(Denied::ForeignLease)),
        }
    }

    async fn serve_lease_leases(
        &self,
        req: Request<pb::LeaseLeasesRequest>,
    ) -> Result<Response<pb::LeaseLeasesResponse>, Status> {
        let caller = self.authenticate(req.metadata())?;
        let (md, _, msg) = req.into_parts();
        let mut all = self
            .answer(
                self.store
                    .lease()
                    .lease_leases(forward(&md, msg, Some(STORE_TIMEOUT)))
                    .await,
            )?
            .into_inner();
        let mut end = LEASE_OWNERS_PREFIX.as_bytes().to_vec();
        if let Some(last) = end.last_mut() {
            *last += 1;
        }
        let owners = pb::RangeRequest {
            key: LEASE_OWNERS_PREFIX.as_bytes().to_vec(),
            range_end: end,
            ..Default::default()
        };
        let owners = self
            .answer(
                self.store
                    .kv()
                    .range(forward(&md, owners, Some(STORE_TIMEOUT)))
                    .await,
            )?
            .into_inner();
        let mine: HashSet<i64> = owners
            .kvs
            .iter()
            .filter(|kv| kv.value == caller.identity.name.as_bytes())
            .filter_map(|kv| authz::lease_of_owner_key(&kv.key))
            .collect();
        all.leases.retain(|l| mine.contains(&l.id));
        Ok(Response::new(all))
    }
}

/// How a stream ended, for `requests_total`; recorded when the last holder drops it.
struct StreamEnd {
    metrics: Arc<Metrics>,
    method: &'static str,
    code: Mutex<Code>,
    _open: StreamGuard,
}

impl StreamEnd {
    fn new(metrics: &Arc<Metrics>, method: &'static str) -> Arc<Self> {
        Arc::new(Self {
            metrics: Arc::clone(metrics),
            method,
            code: Mutex::new(Code::Ok),
            _open: metrics.stream(method),
        })
    }

    fn set(&self, code: Code) {
        let mut current = self.code.lock().unwrap_or_else(PoisonError::into_inner);
        if *current == Code::Ok {
            *current = code;
        }
    }
}

impl Drop for StreamEnd {
    fn drop(&mut self) {
        let code = *self.code.lock().unwrap_or_else(PoisonError::into_inner);
        self.metrics.request(self.method, code);
    }
}

/// What the uplink of a stream does with one client message.
enum Verdict<T> {
    Forward(T),
    Refuse(Status),
}

impl Proxy {
    /// Runs one bidirectional stream: `check` authorizes each client message before it goes
    /// to the store, `open` opens the store's stream; the zone's revocation ends it.
    fn pump<Req, Resp, Check, CheckFut, Open, OpenFut>(
        &self,
        method: &'static str,
        caller: Caller,
        mut from_client: Streaming<Req>,
        check: Check,
        open: Open,
    ) -> BoxStream<Resp>
    where
        Req: Send + 'static,
        Resp: Send + 'static,
        Check: Fn(Caller, Req) -> CheckFut + Send + 'static,
        CheckFut: Future<Output = Verdict<Req>> + Send,
        Open: FnOnce(ReceiverStream<Req>) -> OpenFut + Send + 'static,
        OpenFut: Future<Output = Result<Response<Streaming<Resp>>, Status>> + Send,
    {
        let end = StreamEnd::new(&self.metrics, method);
        let (to_client, client_rx) = mpsc::channel::<Result<Resp, Status>>(64);
        let (to_store, store_rx) = mpsc::channel::<Req>(64);

        // Downlink: the store's responses to the client.
        let down_end = Arc::clone(&end);
        let down_client = to_client.clone();
        let store = Arc::clone(&self.store);
        tokio::spawn(async move {
            // etcd answers a stream's headers only with its first message: the client may
            // be gone (or refused) before that, so do not wait for the store alone.
            let opened = tokio::select! {
                () = down_client.closed() => return,
                opened = open(ReceiverStream::new(store_rx)) => opened,
            };
            let mut from_store = match opened {
                Ok(resp) => resp.into_inner(),
                Err(status) => {
                    store.observe(&status);
                    down_end.set(status.code());
                    let _ = down_client.send(Err(status)).await;
                    return;
                }
            };
            loop {
                tokio::select! {
                    () = down_client.closed() => return,
                    msg = from_store.next() => match msg {
                        Some(Ok(resp)) => {
                            if down_client.send(Ok(resp)).await.is_err() {
                                return;
                            }
                        }
                        Some(Err(status)) => {
                            store.observe(&status);
                            down_end.set(status.code());
                            let _ = down_client.send(Err(status)).await;
                            return;
                        }
                        None => return,
                    },
                }
            }
        });

        // Uplink: the client's messages, authorized, to the store; revocation ends it all.
        let zones = Arc::clone(&self.zones);
        tokio::spawn(async move {
            let mut changes = zones.changes();
            loop {
                let msg = tokio::select! {
                    () = to_client.closed() => return,
                    change = changes.changed() => {
                        if change.is_ok() && zones.still_trusts(&caller.identity, &caller.key) {
                            continue;
                        }
                        debug!(zone = %caller.identity.name, "zone identity revoked; ending stream");
                        let status = Status::unauthenticated("zone identity revoked");
                        end.set(status.code());
                        let _ = to_client.send(Err(status)).await;
                        return;
                    }
                    msg = from_client.next() => msg,
                };
                // The client closed its side (or went away): close ours towards the store;
                // the downlink keeps delivering until the client is gone, as etcd does.
                let Some(Ok(msg)) = msg else { return };
                match check(caller.clone(), msg).await {
                    Verdict::Forward(msg) => {
                        if to_store.send(msg).await.is_err() {
                            return;
                        }
                    }
                    Verdict::Refuse(status) => {
                        end.set(status.code());
                        let _ = to_client.send(Err(status)).await;
                        return;
                    }
                }
            }
        });

        Box::pin(ReceiverStream::new(client_rx))
    }
}

#[tonic::async_trait]
impl Kv for Proxy {
    async fn range(
        &self,
        req: Request<pb::RangeRequest>,
    ) -> Result<Response<pb::RangeResponse>, Status> {
        self.count("Range", self.serve_range(req).await)
    }

    async fn put(&self, req: Request<pb::PutRequest>) -> Result<Response<pb::PutResponse>, Status> {
        self.count("Put", self.serve_put(req).await)
    }

    async fn delete_range(
        &self,
        req: Request<pb::DeleteRangeRequest>,
    ) -> Result<Response<pb::DeleteRangeResponse>, Status> {
        self.count("DeleteRange", self.serve_delete_range(req).await)
    }

    async fn txn(&self, req: Request<pb::TxnRequest>) -> Result<Response<pb::TxnResponse>, Status> {
        self.count("Txn", self.serve_txn(req).await)
    }

    async fn compact(
        &self,
        req: Request<pb::CompactionRequest>,
    ) -> Result<Response<pb::CompactionResponse>, Status> {
        let result = self
            .authenticate(req.metadata())
            .and_then(|_| Err(self.deny(Denied::Compact)));
        self.count("Compact", result)
    }
}

#[tonic::async_trait]
impl Watch for Proxy {
    async fn watch(
        &self,
        req: Request<Streaming<pb::WatchRequest>>,
    ) -> Result<Response<BoxStream<pb::WatchResponse>>, Status> {
        let caller = self
            .authenticate(req.metadata())
            .map_err(|s| self.refused_stream("Watch", s))?;
        let (md, _, from_client) = req.into_parts();
        let store = Arc::clone(&self.store);
        let metrics = Arc::clone(&self.metrics);
        let check = move |caller: Caller, msg: pb::WatchRequest| {
            let metrics = Arc::clone(&metrics);
            async move {
                if let Some(pb::watch_request::RequestUnion::CreateRequest(create)) =
                    &msg.request_union
                    && let Err(denied) = authz::check_watch(&caller.identity.scope, create)
                {
                    metrics.authz_failure(denied.reason());
                    return Verdict::Refuse(Status::permission_denied(format!(
                        "etcd-proxy: permission denied: {denied}"
                    )));
                }
                Verdict::Forward(msg)
            }
        };
        let open = move |up| async move { store.watch().watch(forward(&md, up, None)).await };
        Ok(Response::new(self.pump(
            "Watch",
            caller,
            from_client,
            check,
            open,
        )))
    }
}

#[tonic::async_trait]
impl Lease for Proxy {
    async fn lease_grant(
        &self,
        req: Request<pb::LeaseGrantRequest>,
    ) -> Result<Response<pb::LeaseGrantResponse>, Status> {
        self.count("LeaseGrant", self.serve_lease_grant(req).await)
    }

    async fn lease_revoke(
        &self,
        req: Request<pb::LeaseRevokeRequest>,
    ) -> Result<Response<pb::LeaseRevokeResponse>, Status> {
        self.count("LeaseRevoke", self.serve_lease_revoke(req).await)
    }

    async fn lease_keep_alive(
        &self,
        req: Request<Streaming<pb::LeaseKeepAliveRequest>>,
    ) -> Result<Response<BoxStream<pb::LeaseKeepAliveResponse>>, Status> {
        let caller = self
            .authenticate(req.metadata())
            .map_err(|s| self.refused_stream("LeaseKeepAlive", s))?;
        let (md, _, from_client) = req.into_parts();
        let store = Arc::clone(&self.store);
        let this = self.clone();
        let check_md = md.clone();
        let check = move |caller: Caller, msg: pb::LeaseKeepAliveRequest| {
            let this = this.clone();
            let md = check_md.clone();
            async move {
                match this.lease_access(&md, &caller.identity.name, msg.id).await {
                    // A missing lease is forwarded: the store answers TTL 0, as etcd does.
                    Ok(Access::Owned | Access::Missing(_)) => Verdict::Forward(msg),
                    Ok(Access::Foreign) => Verdict::Refuse(this.deny(Denied::ForeignLease)),
                    Err(status) => Verdict::Refuse(status),
                }
            }
        };
        let open =
            move |up| async move { store.lease().lease_keep_alive(forward(&md, up, None)).await };
        Ok(Response::new(self.pump(
            "LeaseKeepAlive",
            caller,
            from_client,
            check,
            open,
        )))
    }

    async fn lease_time_to_live(
        &self,
        req: Request<pb::LeaseTimeToLiveRequest>,
    ) -> Result<Response<pb::LeaseTimeToLiveResponse>, Status> {
        self.count("LeaseTimeToLive", self.serve_lease_time_to_live(req).await)
    }

    async fn lease_leases(
        &self,
        req: Request<pb::LeaseLeasesRequest>,
    ) -> Result<Response<pb::LeaseLeasesResponse>, Status> {
        self.count("LeaseLeases", self.serve_lease_leases(req).await)
    }
}
