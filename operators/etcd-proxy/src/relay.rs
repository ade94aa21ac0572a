//! `etcd-proxy relay`: the zone side. A local listener (a unix socket or loopback TCP) with
//! the same `KV`, `Watch` and `Lease` services and no authentication, forwarding every call
//! to the hub's proxy over TLS, each with a freshly signed short-lived token (the zone's
//! ed25519 key; [`TOKEN_LIFETIME_SECS`]): the token of the current second, signed once per
//! second (ed25519 is deterministic, so it is the token each call would have signed).
//!
//! Streams survive a broken hub connection: the relay re-opens the hub stream with backoff
//! (and a fresh token) and, for Watch, re-creates every watch under the same id from the
//! revision after the last event it passed on, swallowing the repeated `created`; for
//! LeaseKeepAlive, it re-sends the keep-alives still unanswered. The local client sees one
//! unbroken stream and loses no event (within the store's compaction window: a resumed
//! watch whose revision was compacted is cancelled with `compact_revision`, as etcd does).
//!
//! Watch ids: the relay assigns them as etcd does (the client's, or the next unused one),
//! and asks the hub for exactly that id, so a resumed watch keeps its id.

use std::collections::{BTreeMap, BTreeSet, HashSet, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use kontinuum_proto::etcd::etcdserverpb as pb;
use pb::{kv_server::Kv, lease_server::Lease, watch_server::Watch};
use tokio::sync::mpsc;
use tokio_stream::StreamExt as _;
use tokio_stream::wrappers::{ReceiverStream, UnboundedReceiverStream};
use tonic::metadata::{Ascii, MetadataMap, MetadataValue};
use tonic::transport::Channel;
use tonic::{Code, Request, Response, Status, Streaming};
use tracing::{debug, warn};

use crate::metrics::{Metrics, StreamGuard};
use crate::store::MAX_RESPONSE_BYTES;
use crate::token::{Signer, unix_now};

/// Lifetime of each token; a token is used only in the second it was issued, so none is
/// used after half of it.
pub const TOKEN_LIFETIME_SECS: i64 = 300;
/// Timeout of one unary call to the hub.
const HUB_TIMEOUT: Duration = Duration::from_secs(30);
/// How long opening a hub stream may take.
const OPEN_TIMEOUT: Duration = Duration::from_secs(10);
/// Reconnect backoff: first and longest wait.
const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(5);
/// Metadata passed from the local client to the hub.
const PASSED_METADATA: &[&str] = &["hasleader"];

/// The relay's `authorization` value: `Bearer` and the token of the current second, signed
/// once per second. Signing is deterministic and the claims only change with the second, so
/// this is the token that signing anew for each call of that second would give.
pub struct SecondToken {
    signer: Arc<Signer>,
    /// The second signed for, and its value.
    current: Mutex<Option<(i64, MetadataValue<Ascii>)>>,
}

impl std::fmt::Debug for SecondToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The token is a credential: never print it.
        f.debug_struct("SecondToken")
            .field("zone", &self.signer.zone())
            .finish_non_exhaustive()
    }
}

impl SecondToken {
    /// Tokens of `signer`.
    pub fn new(signer: Arc<Signer>) -> Self {
        Self {
            signer,
            current: Mutex::new(None),
        }
    }

    /// The zone the tokens speak for.
    pub fn zone(&self) -> &str {
        self.signer.zone()
    }

    /// The `authorization` value for a call at `now` (unix seconds), valid
    /// [`TOKEN_LIFETIME_SECS`].
    pub fn at(&self, now: i64) -> Result<MetadataValue<Ascii>, Status> {
        let mut current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((at, value)) = current.as_ref()
            && *at == now
        {
            return Ok(value.clone());
        }
        let token = self.signer.sign(now, TOKEN_LIFETIME_SECS);
        let value = MetadataValue::try_from(format!("Bearer {token}"))
            .map_err(|_| Status::internal("etcd-proxy relay: token is not valid metadata"))?;
        *current = Some((now, value.clone()));
        Ok(value)
    }
}

type BoxStream<T> = std::pin::Pin<Box<dyn futures::Stream<Item = Result<T, Status>> + Send>>;

/// The relay's gRPC services.
#[derive(Clone)]
pub struct Relay {
    hub: Channel,
    token: Arc<SecondToken>,
    metrics: Arc<Metrics>,
}

impl std::fmt::Debug for Relay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relay")
            .field("zone", &self.token.zone())
            .finish_non_exhaustive()
    }
}

/// Whether a failed hub stream is worth re-opening (the connection broke) rather than
/// reporting (the hub refused).
fn transient(code: Code) -> bool {
    matches!(
        code,
        Code::Unavailable
            | Code::Unknown
            | Code::Internal
            | Code::Cancelled
            | Code::DeadlineExceeded
            | Code::Aborted
    )
}

struct Backoff(Duration);

impl Backoff {
    fn new() -> Self {
        Self(BACKOFF_MIN)
    }

    fn next(&mut self) -> Duration {
        let wait = self.0;
        self.0 = (self.0 * 2).min(BACKOFF_MAX);
        wait
    }
}

impl Relay {
    /// Services forwarding to the proxy behind `hub`, signing as `signer`.
    pub fn new(hub: Channel, signer: Arc<Signer>, metrics: Arc<Metrics>) -> Self {
        Self {
            hub,
            token: Arc::new(SecondToken::new(signer)),
            metrics,
        }
    }

    /// `msg` as a call to the hub: this second's token, and the metadata we pass on.
    fn request<T>(&self, md: &MetadataMap, msg: T) -> Result<Request<T>, Status> {
        let value = self.token.at(unix_now())?;
        let mut req = Request::new(msg);
        for key in PASSED_METADATA {
            if let Some(v) = md.get(*key) {
                req.metadata_mut().insert(*key, v.clone());
            }
        }
        req.metadata_mut().insert("authorization", value);
        Ok(req)
    }

    fn unary_request<T>(&self, req: Request<T>) -> Result<Request<T>, Status> {
        let (md, _, msg) = req.into_parts();
        let mut out = self.request(&md, msg)?;
        out.set_timeout(HUB_TIMEOUT);
        Ok(out)
    }

    fn kv(&self) -> pb::kv_client::KvClient<Channel> {
        pb::kv_client::KvClient::new(self.hub.clone()).max_decoding_message_size(MAX_RESPONSE_BYTES)
    }

    fn lease(&self) -> pb::lease_client::LeaseClient<Channel> {
        pb::lease_client::LeaseClient::new(self.hub.clone())
            .max_decoding_message_size(MAX_RESPONSE_BYTES)
    }

    fn watch_client(&self) -> pb::watch_client::WatchClient<Channel> {
        pb::watch_client::WatchClient::new(self.hub.clone())
            .max_decoding_message_size(MAX_RESPONSE_BYTES)
    }

    fn count<T>(
        &self,
        method: &'static str,
        result: Result<Response<T>, Status>,
    ) -> Result<Response<T>, Status> {
        let code = result.as_ref().map_or_else(Status::code, |_| Code::Ok);
        self.metrics.request(method, code);
        result.map(|r| Response::new(r.into_inner()))
    }
}

/// Counts a relayed stream: in flight while alive, by final code when it ends.
struct StreamEnd {
    metrics: Arc<Metrics>,
    method: &'static str,
    code: Code,
    _open: StreamGuard,
}

impl StreamEnd {
    fn new(metrics: &Arc<Metrics>, method: &'static str) -> Self {
        Self {
            metrics: Arc::clone(metrics),
            method,
            code: Code::Ok,
            _open: metrics.stream(method),
        }
    }
}

impl Drop for StreamEnd {
    fn drop(&mut self) {
        self.metrics.request(self.method, self.code);
    }
}

/// One watch the client holds, as it must be re-created after a reconnect.
struct Tracked {
    create: pb::WatchCreateRequest,
    /// The revision to resume from: one past the last event passed on.
    next_rev: i64,
}

/// A create sent to the hub and not yet acknowledged (the hub answers creates in order).
struct Pending {
    id: i64,
    create: pb::WatchCreateRequest,
    /// A re-creation after a reconnect: the client already saw its `created`.
    resume: bool,
}

type HubStream<Req, Resp> = (mpsc::UnboundedSender<Req>, Streaming<Resp>);

fn create_request(create: pb::WatchCreateRequest) -> pb::WatchRequest {
    pb::WatchRequest {
        request_union: Some(pb::watch_request::RequestUnion::CreateRequest(create)),
    }
}

/// The client side of one relayed Watch stream.
struct WatchSession {
    relay: Relay,
    md: MetadataMap,
    to_client: mpsc::Sender<Result<pb::WatchResponse, Status>>,
    watches: BTreeMap<i64, Tracked>,
    pending: VecDeque<Pending>,
    /// Creates the client sent while the hub was unreachable.
    waiting: Vec<(i64, pb::WatchCreateRequest)>,
    canceled: HashSet<i64>,
    next_auto: i64,
    end: StreamEnd,
}

/// What became of the client stream.
enum Flow {
    Continue,
    Stop,
}

impl WatchSession {
    fn in_use(&self, id: i64) -> bool {
        self.watches.contains_key(&id)
            || self.pending.iter().any(|p| p.id == id)
            || self.waiting.iter().any(|(w, _)| *w == id)
    }

    async fn send(&mut self, resp: Result<pb::WatchResponse, Status>) -> Flow {
        if let Err(status) = &resp {
            self.end.code = status.code();
        }
        let failed = resp.is_err();
        if self.to_client.send(resp).await.is_err() || failed {
            Flow::Stop
        } else {
            Flow::Continue
        }
    }

    /// Opens a hub stream and re-creates every watch on it.
    async fn connect(&mut self) -> Result<HubStream<pb::WatchRequest, pb::WatchResponse>, Status> {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut sent = Vec::new();
        for (&id, tracked) in &self.watches {
            let mut create = tracked.create.clone();
            create.watch_id = id;
            create.start_revision = tracked.next_rev;
            let _ = tx.send(create_request(create.clone()));
            sent.push(Pending {
                id,
                create,
                resume: true,
            });
        }
        for (id, create) in self.waiting.drain(..) {
            let _ = tx.send(create_request(create.clone()));
            sent.push(Pending {
                id,
                create,
                resume: false,
            });
        }
        let req = self
            .relay
            .request(&self.md, UnboundedReceiverStream::new(rx));
        let opened = match req {
            Ok(req) => tokio::time::timeout(OPEN_TIMEOUT, self.relay.watch_client().watch(req))
                .await
                .unwrap_or_else(|_| Err(Status::unavailable("opening the hub stream timed out"))),
            Err(status) => Err(status),
        };
        match opened {
            Ok(resp) => {
                self.pending.extend(sent);
                Ok((tx, resp.into_inner()))
            }
            Err(status) => {
                self.requeue(sent);
                Err(status)
            }
        }
    }

    /// Creates that never got their answer go back to waiting (re-creations stay tracked).
    fn requeue(&mut self, sent: impl IntoIterator<Item = Pending>) {
        for p in sent {
            if !p.resume && !self.canceled.remove(&p.id) {
                self.waiting.push((p.id, p.create));
            }
        }
    }

    fn disconnected(&mut self) {
        let pending: Vec<Pending> = self.pending.drain(..).collect();
        self.requeue(pending);
    }

    async fn on_client_message(
        &mut self,
        msg: pb::WatchRequest,
        hub: Option<&mpsc::UnboundedSender<pb::WatchRequest>>,
    ) -> Flow {
        use pb::watch_request::RequestUnion;
        match msg.request_union {
            Some(RequestUnion::CreateRequest(mut create)) => {
                let id = if create.watch_id == 0 {
                    while self.in_use(self.next_auto) {
                        self.next_auto += 1;
                    }
                    self.next_auto += 1;
                    self.next_auto - 1
                } else if self.in_use(create.watch_id) {
                    return self
                        .send(Ok(pb::WatchResponse {
                            watch_id: -1,
                            created: true,
                            canceled: true,
                            cancel_reason: "mvcc: duplicate watch ID provided on the WatchStream"
                                .into(),
                            ..Default::default()
                        }))
                        .await;
                } else {
                    create.watch_id
                };
                // Id 0 is "any id" on the wire; the hub's first automatic id is 0, and the
                // relay never asks for another automatic one on that stream.
                create.watch_id = id;
                match hub {
                    Some(hub) if hub.send(create_request(create.clone())).is_ok() => {
                        self.pending.push_back(Pending {
                            id,
                            create,
                            resume: false,
                        });
                    }
                    _ => self.waiting.push((id, create)),
                }
                Flow::Continue
            }
            Some(RequestUnion::CancelRequest(cancel)) => {
                let id = cancel.watch_id;
                self.waiting.retain(|(w, _)| *w != id);
                let tracked = self.watches.remove(&id).is_some();
                let pending = self.pending.iter().any(|p| p.id == id);
                if pending {
                    self.canceled.insert(id);
                }
                match hub {
                    Some(hub) if (tracked || pending) => {
                        let _ = hub.send(pb::WatchRequest {
                            request_union: Some(RequestUnion::CancelRequest(cancel)),
                        });
                        Flow::Continue
                    }
                    _ => {
                        self.send(Ok(pb::WatchResponse {
                            watch_id: id,
                            canceled: true,
                            ..Default::default()
                        }))
                        .await
                    }
                }
            }
            Some(other @ RequestUnion::ProgressRequest(_)) => {
                if let Some(hub) = hub {
                    let _ = hub.send(pb::WatchRequest {
                        request_union: Some(other),
                    });
                }
                Flow::Continue
            }
            None => Flow::Continue,
        }
    }

    async fn on_hub_message(&mut self, resp: pb::WatchResponse) -> Flow {
        if resp.created {
            let Some(p) = self.pending.pop_front() else {
                return self.send(Ok(resp)).await;
            };
            if p.id != resp.watch_id && !resp.canceled {
                warn!(
                    expected = p.id,
                    got = resp.watch_id,
                    "hub assigned another watch id"
                );
            }
            if resp.canceled {
                self.watches.remove(&p.id);
                self.canceled.remove(&p.id);
                if p.resume {
                    // The client saw this watch created long ago: tell it the watch ended.
                    let ended = pb::WatchResponse {
                        watch_id: p.id,
                        canceled: true,
                        created: false,
                        ..resp
                    };
                    return self.send(Ok(ended)).await;
                }
                return self.send(Ok(resp)).await;
            }
            if p.resume {
                return Flow::Continue;
            }
            if !self.canceled.remove(&p.id) {
                let next_rev = if p.create.start_revision > 0 {
                    p.create.start_revision
                } else {
                    resp.header.as_ref().map_or(0, |h| h.revision + 1)
                };
                self.watches.insert(
                    p.id,
                    Tracked {
                        create: p.create,
                        next_rev,
                    },
                );
            }
            return self.send(Ok(resp)).await;
        }
        if resp.canceled {
            self.watches.remove(&resp.watch_id);
        } else if let Some(tracked) = self.watches.get_mut(&resp.watch_id) {
            if let Some(last) = resp.events.last() {
                // A fragmented revision is complete only with its last fragment.
                if !resp.fragment {
                    let rev = last.kv.as_ref().map_or(0, |kv| kv.mod_revision);
                    tracked.next_rev = tracked.next_rev.max(rev + 1);
                }
            } else if let Some(header) = &resp.header {
                // A progress notification: everything up to this revision was delivered.
                tracked.next_rev = tracked.next_rev.max(header.revision + 1);
            }
        }
        self.send(Ok(resp)).await
    }

    async fn run(mut self, mut from_client: Streaming<pb::WatchRequest>) {
        let mut hub: Option<HubStream<pb::WatchRequest, pb::WatchResponse>> = None;
        let mut backoff = Backoff::new();
        let mut retry_at = Some(tokio::time::Instant::now());
        let mut opened_once = false;
        loop {
            let hub_next = async {
                match hub.as_mut() {
                    Some((_, stream)) => stream.next().await,
                    None => std::future::pending().await,
                }
            };
            let retry = async {
                match retry_at {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = self.to_client.closed() => return,
                msg = from_client.next() => {
                    let Some(Ok(msg)) = msg else { return };
                    let sender = hub.as_ref().map(|(tx, _)| tx.clone());
                    if let Flow::Stop = self.on_client_message(msg, sender.as_ref()).await {
                        return;
                    }
                }
                msg = hub_next => match msg {
                    Some(Ok(resp)) => {
                        if let Flow::Stop = self.on_hub_message(resp).await {
                            return;
                        }
                    }
                    Some(Err(status)) if !transient(status.code()) => {
                        let _ = self.send(Err(status)).await;
                        return;
                    }
                    other => {
                        if let Some(Err(status)) = &other {
                            debug!(code = ?status.code(), "hub watch stream broke; reconnecting");
                        }
                        hub = None;
                        self.disconnected();
                        retry_at = Some(tokio::time::Instant::now() + backoff.next());
                    }
                },
                () = retry => {
                    retry_at = None;
                    match self.connect().await {
                        Ok(stream) => {
                            if opened_once {
                                self.relay.metrics.reconnect("Watch");
                            }
                            opened_once = true;
                            hub = Some(stream);
                            backoff = Backoff::new();
                        }
                        Err(status) if !transient(status.code()) => {
                            let _ = self.send(Err(status)).await;
                            return;
                        }
                        Err(status) => {
                            debug!(code = ?status.code(), "opening the hub watch stream failed; retrying");
                            retry_at = Some(tokio::time::Instant::now() + backoff.next());
                        }
                    }
                }
            }
        }
    }
}

/// The client side of one relayed LeaseKeepAlive stream.
async fn relay_keep_alive(
    relay: Relay,
    md: MetadataMap,
    mut from_client: Streaming<pb::LeaseKeepAliveRequest>,
    to_client: mpsc::Sender<Result<pb::LeaseKeepAliveResponse, Status>>,
) {
    let mut end = StreamEnd::new(&relay.metrics, "LeaseKeepAlive");
    let mut hub: Option<HubStream<pb::LeaseKeepAliveRequest, pb::LeaseKeepAliveResponse>> = None;
    // Keep-alives sent and not answered: re-sent on a new hub stream.
    let mut unanswered: BTreeSet<i64> = BTreeSet::new();
    let mut backoff = Backoff::new();
    let mut retry_at = Some(tokio::time::Instant::now());
    let mut opened_once = false;
    loop {
        let hub_next = async {
            match hub.as_mut() {
                Some((_, stream)) => stream.next().await,
                None => std::future::pending().await,
            }
        };
        let retry = async {
            match retry_at {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = to_client.closed() => return,
            msg = from_client.next() => {
                let Some(Ok(msg)) = msg else { return };
                unanswered.insert(msg.id);
                if let Some((tx, _)) = &hub {
                    let _ = tx.send(msg);
                }
            }
            msg = hub_next => match msg {
                Some(Ok(resp)) => {
                    unanswered.remove(&resp.id);
                    if to_client.send(Ok(resp)).await.is_err() {
                        return;
                    }
                }
                Some(Err(status)) if !transient(status.code()) => {
                    end.code = status.code();
                    let _ = to_client.send(Err(status)).await;
                    return;
                }
                _ => {
                    hub = None;
                    retry_at = Some(tokio::time::Instant::now() + backoff.next());
                }
            },
            () = retry => {
                retry_at = None;
                let (tx, rx) = mpsc::unbounded_channel();
                for &id in &unanswered {
                    let _ = tx.send(pb::LeaseKeepAliveRequest { id });
                }
                let opened = match relay.request(&md, UnboundedReceiverStream::new(rx)) {
                    Ok(req) => tokio::time::timeout(OPEN_TIMEOUT, relay.lease().lease_keep_alive(req))
                        .await
                        .unwrap_or_else(|_| Err(Status::unavailable("opening the hub stream timed out"))),
                    Err(status) => Err(status),
                };
                match opened {
                    Ok(resp) => {
                        if opened_once {
                            relay.metrics.reconnect("LeaseKeepAlive");
                        }
                        opened_once = true;
                        hub = Some((tx, resp.into_inner()));
                        backoff = Backoff::new();
                    }
                    Err(status) if !transient(status.code()) => {
                        end.code = status.code();
                        let _ = to_client.send(Err(status)).await;
                        return;
                    }
                    Err(_) => retry_at = Some(tokio::time::Instant::now() + backoff.next()),
                }
            }
        }
    }
}

#[tonic::async_trait]
impl Kv for Relay {
    async fn range(
        &self,
        req: Request<pb::RangeRequest>,
    ) -> Result<Response<pb::RangeResponse>, Status> {
        let req = self.unary_request(req)?;
        self.count("Range", self.kv().range(req).await)
    }

    async fn put(&self, req: Request<pb::PutRequest>) -> Result<Response<pb::PutResponse>, Status> {
        let req = self.unary_request(req)?;
        self.count("Put", self.kv().put(req).await)
    }

    async fn delete_range(
        &self,
        req: Request<pb::DeleteRangeRequest>,
    ) -> Result<Response<pb::DeleteRangeResponse>, Status> {
        let req = self.unary_request(req)?;
        self.count("DeleteRange", self.kv().delete_range(req).await)
    }

    async fn txn(&self, req: Request<pb::TxnRequest>) -> Result<Response<pb::TxnResponse>, Status> {
        let req = self.unary_request(req)?;
        self.count("Txn", self.kv().txn(req).await)
    }

    async fn compact(
        &self,
        req: Request<pb::CompactionRequest>,
    ) -> Result<Response<pb::CompactionResponse>, Status> {
        let req = self.unary_request(req)?;
        self.count("Compact", self.kv().compact(req).await)
    }
}

#[tonic::async_trait]
impl Watch for Relay {
    async fn watch(
        &self,
        req: Request<Streaming<pb::WatchRequest>>,
    ) -> Result<Response<BoxStream<pb::WatchResponse>>, Status> {
        let (md, _, from_client) = req.into_parts();
        let (to_client, rx) = mpsc::channel(64);
        let session = WatchSession {
            relay: self.clone(),
            md,
            to_client,
            watches: BTreeMap::new(),
            pending: VecDeque::new(),
            waiting: Vec::new(),
            canceled: HashSet::new(),
            next_auto: 0,
            end: StreamEnd::new(&self.metrics, "Watch"),
        };
        tokio::spawn(session.run(from_client));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

#[tonic::async_trait]
impl Lease for Relay {
    async fn lease_grant(
        &self,
        req: Request<pb::LeaseGrantRequest>,
    ) -> Result<Response<pb::LeaseGrantResponse>, Status> {
        let req = self.unary_request(req)?;
        self.count("LeaseGrant", self.lease().lease_grant(req).await)
    }

    async fn lease_revoke(
        &self,
        req: Request<pb::LeaseRevokeRequest>,
    ) -> Result<Response<pb::LeaseRevokeResponse>, Status> {
        let req = self.unary_request(req)?;
        self.count("LeaseRevoke", self.lease().lease_revoke(req).await)
    }

    async fn lease_keep_alive(
        &self,
        req: Request<Streaming<pb::LeaseKeepAliveRequest>>,
    ) -> Result<Response<BoxStream<pb::LeaseKeepAliveResponse>>, Status> {
        let (md, _, from_client) = req.into_parts();
        let (to_client, rx) = mpsc::channel(64);
        tokio::spawn(relay_keep_alive(self.clone(), md, from_client, to_client));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn lease_time_to_live(
        &self,
        req: Request<pb::LeaseTimeToLiveRequest>,
    ) -> Result<Response<pb::LeaseTimeToLiveResponse>, Status> {
        let req = self.unary_request(req)?;
        self.count(
            "LeaseTimeToLive",
            self.lease().lease_time_to_live(req).await,
        )
    }

    async fn lease_leases(
        &self,
        req: Request<pb::LeaseLeasesRequest>,
    ) -> Result<Response<pb::LeaseLeasesResponse>, Status> {
        let req = self.unary_request(req)?;
        self.count("LeaseLeases", self.lease().lease_leases(req).await)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_of_a_second_is_signed_once_and_verifies() {
        use base64::Engine as _;
        use ring::rand::SystemRandom;
        use ring::signature::Ed25519KeyPair;

        let pkcs8 = Ed25519KeyPair::generate_pkcs8(&SystemRandom::new()).unwrap();
        let pem = format!(
            "-----BEGIN PRIVATE KEY-----\n{}\n-----END PRIVATE KEY-----\n",
            base64::engine::general_purpose::STANDARD.encode(pkcs8.as_ref())
        );
        let signer = Arc::new(Signer::from_pkcs8_pem(pem.as_bytes(), "eu-1a").unwrap());
        let tokens = SecondToken::new(Arc::clone(&signer));
        let now = 1_800_000_000;
        let first = tokens.at(now).unwrap();
        // Within the second: the same value, and the one signing anew would give.
        assert_eq!(tokens.at(now).unwrap(), first);
        let fresh = format!("Bearer {}", signer.sign(now, TOKEN_LIFETIME_SECS));
        assert_eq!(first.to_str().unwrap(), fresh);
        // The next second: a new token, valid from then.
        let next = tokens.at(now + 1).unwrap();
        assert_ne!(next, first);
        let keys = vec![crate::token::TrustedKey {
            key: signer.public_key(),
            not_before: now - 60,
            not_after: now + 3600,
        }];
        let token = crate::token::bearer(Some(next.as_bytes())).unwrap();
        let verified = crate::token::verify(token, now + 1, |_| Some(keys.clone())).unwrap();
        assert_eq!(verified.expires, now + 1 + TOKEN_LIFETIME_SECS);
    }

    #[test]
    fn backoff_doubles_up_to_its_cap() {
        let mut b = Backoff::new();
        let waits: Vec<_> = (0..8).map(|_| b.next()).collect();
        assert_eq!(waits[0], BACKOFF_MIN);
        assert_eq!(waits[1], BACKOFF_MIN * 2);
        assert_eq!(*waits.last().unwrap(), BACKOFF_MAX);
    }

    #[test]
    fn only_broken_connections_are_retried() {
        assert!(transient(Code::Unavailable));
        assert!(transient(Code::Unknown));
        assert!(!transient(Code::PermissionDenied));
        assert!(!transient(Code::Unauthenticated));
        assert!(!transient(Code::InvalidArgument));
    }
}
