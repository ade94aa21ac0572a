//! The zone agent's registration: a lease it keeps alive and a key on it.
//!
//! * Grants a lease (`--lease-ttl-seconds`) and puts
//!   `/kontinuum.sh/zones/<region>/<zone>/registry/<name>` with the JSON
//!   [`Registration`] on it; keeps the lease alive on a `LeaseKeepAlive` stream (a request
//!   every third of the TTL); rewrites the value every `--heartbeat-seconds`.
//! * A lost lease (the store answers a keep-alive with TTL 0, or refuses a put on it) is
//!   replaced: a new lease is granted and the key put again. A broken keep-alive stream is
//!   reopened; if that takes longer than the TTL, the store has expired the lease and the
//!   next keep-alive says so.
//! * On graceful shutdown the key is deleted and the lease revoked, within
//!   [`DEREGISTER_TIMEOUT`].
//! * Reaches the store only through `--store`: the relay's unix socket (or a loopback
//!   `host:port`), plain gRPC. Every unary call has a deadline.
//!
//! Never: writes outside its own key, holds more than one live lease at a time.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use http::Uri;
use hyper_util::rt::TokioIo;
use k8s_openapi::jiff::Timestamp;
use kontinuum_crds::v1alpha2::KontinuumConfig;
use kontinuum_operator_common::backoff::delay;
use kontinuum_operator_common::shutdown::Shutdown;
use kontinuum_proto::etcd::etcdserverpb as pb;
use pb::kv_client::KvClient;
use pb::lease_client::LeaseClient;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::StreamExt as _;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status, Streaming};
use tracing::{info, warn};

use crate::metrics::Metrics;
use crate::record::{Registration, RegistrationKey};

/// Deadline of one unary call to the store.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// How long deregistration on shutdown may take.
pub const DEREGISTER_TIMEOUT: Duration = Duration::from_secs(5);

/// Where the agent reaches the store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreAddr {
    /// A unix socket (`unix:///path`).
    Unix(PathBuf),
    /// `http://host:port` (or `host:port`).
    Tcp(Uri),
}

impl std::str::FromStr for StoreAddr {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Some(path) = s.strip_prefix("unix://") {
            if !path.starts_with('/') {
                return Err("a unix socket must be unix:///absolute/path".into());
            }
            return Ok(Self::Unix(PathBuf::from(path)));
        }
        let full = if s.contains("://") {
            s.to_owned()
        } else {
            format!("http://{s}")
        };
        let uri: Uri = full
            .parse()
            .map_err(|_| "expected unix:///path, host:port or http://host:port".to_owned())?;
        if uri.scheme_str() != Some("http") || uri.host().is_none() || uri.port().is_none() {
            return Err("expected unix:///path, host:port or http://host:port (plain gRPC)".into());
        }
        Ok(Self::Tcp(uri))
    }
}

impl std::fmt::Display for StoreAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Unix(path) => write!(f, "unix://{}", path.display()),
            Self::Tcp(uri) => write!(f, "{uri}"),
        }
    }
}

/// A lazily connected channel to the store.
pub fn channel(addr: &StoreAddr) -> Channel {
    match addr {
        StoreAddr::Tcp(uri) => {
            etcd_proxy::tls::channel(uri.clone(), etcd_proxy::tls::Connector::new(None))
        }
        StoreAddr::Unix(path) => {
            let path = path.clone();
            // The URI is required by the builder and ignored by the connector.
            Endpoint::from_static("http://relay.local")
                .connect_timeout(Duration::from_secs(5))
                .http2_keep_alive_interval(Duration::from_secs(10))
                .keep_alive_timeout(Duration::from_secs(5))
                .keep_alive_while_idle(true)
                .connect_with_connector_lazy(tower::service_fn(move |_: Uri| {
                    let path = path.clone();
                    async move {
                        tokio::net::UnixStream::connect(path)
                            .await
                            .map(TokioIo::new)
                    }
                }))
        }
    }
}

/// What the agent registers.
#[derive(Clone, Debug)]
pub struct Agent {
    /// Where.
    pub key: RegistrationKey,
    /// The agent's version.
    pub version: String,
    /// The published config.
    pub config: KontinuumConfig,
    /// Lease time-to-live, in seconds.
    pub lease_ttl: i64,
    /// Heartbeat period.
    pub heartbeat: Duration,
}

/// The agent's state, as `/status` shows it.
#[derive(Clone, Debug, Default)]
pub struct AgentState {
    /// The live lease.
    pub lease_id: Option<i64>,
    /// When the store last confirmed the registration (a put or a keep-alive).
    pub confirmed: Option<Instant>,
    /// The last heartbeat written.
    pub last_heartbeat: Option<Timestamp>,
    /// Whether the last call to the store succeeded.
    pub store_reachable: bool,
    /// Shutdown has begun: the registration is being (or was) withdrawn.
    pub withdrawn: bool,
}

impl AgentState {
    /// Whether the registration is live: a lease, confirmed within its TTL.
    pub fn registered(&self, lease_ttl: i64) -> bool {
        let ttl = Duration::from_secs(u64::try_from(lease_ttl).unwrap_or(0));
        !self.withdrawn
            && self.lease_id.is_some()
            && self.confirmed.is_some_and(|at| at.elapsed() < ttl)
    }
}

/// Shared agent state.
pub type SharedState = Arc<Mutex<AgentState>>;

fn update(state: &SharedState, f: impl FnOnce(&mut AgentState)) {
    f(&mut state.lock().unwrap_or_else(PoisonError::into_inner));
}

/// Why a store call failed.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// The store answered with an error.
    #[error("{call} failed")]
    Status {
        /// The call.
        call: &'static str,
        /// The status.
        #[source]
        source: Status,
    },
    /// No answer within [`CALL_TIMEOUT`].
    #[error("{call} timed out")]
    Timeout {
        /// The call.
        call: &'static str,
    },
}

impl CallError {
    /// Whether the error means the lease is gone (expired, revoked, or not this zone's).
    pub fn lease_lost(&self) -> bool {
        match self {
            Self::Status { source, .. } => {
                matches!(source.code(), Code::NotFound | Code::PermissionDenied)
                    || source.message().contains("lease not found")
            }
            Self::Timeout { .. } => false,
        }
    }
}

async fn call<T>(
    name: &'static str,
    fut: impl Future<Output = Result<tonic::Response<T>, Status>>,
) -> Result<T, CallError> {
    match tokio::time::timeout(CALL_TIMEOUT, fut).await {
        Ok(Ok(response)) => Ok(response.into_inner()),
        Ok(Err(source)) => Err(CallError::Status { call: name, source }),
        Err(_) => Err(CallError::Timeout { call: name }),
    }
}

async fn grant(channel: &Channel, ttl: i64) -> Result<i64, CallError> {
    let mut client = LeaseClient::new(channel.clone());
    let response = call(
        "LeaseGrant",
        client.lease_grant(pb::LeaseGrantRequest { ttl, id: 0 }),
    )
    .await?;
    if !response.error.is_empty() {
        return Err(CallError::Status {
            call: "LeaseGrant",
            source: Status::unavailable(response.error),
        });
    }
    Ok(response.id)
}

async fn put(
    channel: &Channel,
    agent: &Agent,
    lease: i64,
    now: Timestamp,
) -> Result<(), CallError> {
    let value = Registration::new(&agent.key, &agent.version, now, Some(agent.config.clone()));
    let mut client = KvClient::new(channel.clone());
    call(
        "Put",
        client.put(pb::PutRequest {
            key: agent.key.key().into_bytes(),
            value: value.to_value(),
            lease,
            ..Default::default()
        }),
    )
    .await
    .map(|_| ())
}

/// Withdraws the registration: deletes the key, revokes the lease.
async fn withdraw(channel: &Channel, agent: &Agent, lease: Option<i64>) -> Result<(), CallError> {
    let mut kv = KvClient::new(channel.clone());
    call(
        "DeleteRange",
        kv.delete_range(pb::DeleteRangeRequest {
            key: agent.key.key().into_bytes(),
            ..Default::default()
        }),
    )
    .await?;
    if let Some(id) = lease {
        let mut leases = LeaseClient::new(channel.clone());
        match call(
            "LeaseRevoke",
            leases.lease_revoke(pb::LeaseRevokeRequest { id }),
        )
        .await
        {
            Ok(_) => {}
            // Expired already: nothing to revoke.
            Err(err) if err.lease_lost() => {}
            Err(err) => return Err(err),
        }
    }
    Ok(())
}

/// An open keep-alive stream.
struct KeepAlive {
    tx: mpsc::Sender<pb::LeaseKeepAliveRequest>,
    rx: Streaming<pb::LeaseKeepAliveResponse>,
}

/// Opens a keep-alive stream whose first request (for `id`) is already queued: a gRPC
/// server may send its response headers only with its first response, so the call would
/// not return before a request was sent.
async fn open_keepalive(channel: &Channel, id: i64) -> Result<KeepAlive, CallError> {
    let (tx, rx) = mpsc::channel(4);
    // The channel has room for it.
    let _ = tx.try_send(pb::LeaseKeepAliveRequest { id });
    let mut client = LeaseClient::new(channel.clone());
    let rx = call(
        "LeaseKeepAlive",
        client.lease_keep_alive(ReceiverStream::new(rx)),
    )
    .await?;
    Ok(KeepAlive { tx, rx })
}

/// What ended the steady state.
enum Steady {
    LeaseLost,
    Shutdown,
}

/// Keeps the registration alive until shutdown, then withdraws it.
pub async fn run(
    channel: Channel,
    agent: Agent,
    state: SharedState,
    metrics: Arc<Metrics>,
    shutdown: Shutdown,
) {
    let mut lease: Option<i64> = None;
    let mut failures = 0u32;
    let pause = |failures: &mut u32| {
        let wait = delay(
            Duration::from_millis(200),
            Duration::from_secs(5),
            *failures,
        );
        *failures = failures.saturating_add(1);
        wait
    };
    'register: loop {
        if shutdown.reason().is_some() {
            break;
        }
        let id = match lease {
            Some(id) => id,
            None => match or_shutdown(&shutdown, grant(&channel, agent.lease_ttl)).await {
                None => break,
                Some(Ok(id)) => {
                    metrics.lease_grants.inc();
                    lease = Some(id);
                    update(&state, |s| {
                        s.lease_id = Some(id);
                        s.store_reachable = true;
                    });
                    id
                }
                Some(Err(err)) => {
                    warn!(
                        error = &err as &dyn std::error::Error,
                        "granting a lease failed"
                    );
                    update(&state, |s| s.store_reachable = false);
                    let wait = pause(&mut failures);
                    tokio::select! {
                        () = shutdown.wait() => break,
                        () = tokio::time::sleep(wait) => continue,
                    }
                }
            },
        };
        let now = Timestamp::now();
        let Some(written) = or_shutdown(&shutdown, put(&channel, &agent, id, now)).await else {
            break;
        };
        if let Err(err) = written {
            metrics.zone_heartbeat(false);
            warn!(error = &err as &dyn std::error::Error, "registering failed");
            if err.lease_lost() {
                lease = None;
                update(&state, |s| s.lease_id = None);
            } else {
                update(&state, |s| s.store_reachable = false);
            }
            let wait = pause(&mut failures);
            tokio::select! {
                () = shutdown.wait() => break,
                () = tokio::time::sleep(wait) => continue,
            }
        }
        metrics.zone_heartbeat(true);
        metrics.registered.set(1);
        failures = 0;
        update(&state, |s| {
            s.confirmed = Some(Instant::now());
            s.last_heartbeat = Some(now);
            s.store_reachable = true;
        });
        info!(key = %agent.key.key(), lease = id, "registered");
        match steady(&channel, &agent, id, &state, &metrics, &shutdown).await {
            Steady::Shutdown => break 'register,
            Steady::LeaseLost => {
                warn!(
                    lease = id,
                    "the registration's lease was lost; registering again"
                );
                metrics.registered.set(0);
                lease = None;
                update(&state, |s| {
                    s.lease_id = None;
                    s.confirmed = None;
                });
            }
        }
    }

    update(&state, |s| s.withdrawn = true);
    metrics.registered.set(0);
    match tokio::time::timeout(DEREGISTER_TIMEOUT, withdraw(&channel, &agent, lease)).await {
        Ok(Ok(())) => info!(key = %agent.key.key(), "deregistered"),
        Ok(Err(err)) => warn!(
            error = &err as &dyn std::error::Error,
            "deregistering failed"
        ),
        Err(_) => warn!("deregistering timed out"),
    }
}

/// Keeps lease `id` alive and heartbeats until it is lost or shutdown begins.
async fn steady(
    channel: &Channel,
    agent: &Agent,
    id: i64,
    state: &SharedState,
    metrics: &Metrics,
    shutdown: &Shutdown,
) -> Steady {
    let keepalive_every = Duration::from_millis(
        u64::try_from(agent.lease_ttl.saturating_mul(1000) / 3)
            .unwrap_or(1000)
            .max(100),
    );
    let mut keepalive_tick = tokio::time::interval(keepalive_every);
    keepalive_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut heartbeat_tick =
        tokio::time::interval_at(Instant::now() + agent.heartbeat, agent.heartbeat);
    heartbeat_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut stream: Option<KeepAlive> = None;
    loop {
        tokio::select! {
            () = shutdown.wait() => return Steady::Shutdown,
            _ = keepalive_tick.tick() => {
                if let Some(ka) = &stream {
                    if ka.tx.try_send(pb::LeaseKeepAliveRequest { id }).is_err() {
                        stream = None;
                    }
                    continue;
                }
                let opened = tokio::select! {
                    () = shutdown.wait() => return Steady::Shutdown,
                    opened = open_keepalive(channel, id) => opened,
                };
                match opened {
                    Ok(ka) => stream = Some(ka),
                    Err(err) => {
                        update(state, |s| s.store_reachable = false);
                        warn!(
                            error = &err as &dyn std::error::Error,
                            "opening the keep-alive stream failed"
                        );
                    }
                }
            }
            response = next_response(&mut stream) => match response {
                Some(Ok(r)) if r.ttl <= 0 => return Steady::LeaseLost,
                Some(Ok(_)) => update(state, |s| {
                    s.confirmed = Some(Instant::now());
                    s.store_reachable = true;
                }),
                Some(Err(status)) => {
                    warn!(
                        error = &status as &dyn std::error::Error,
                        "the keep-alive stream broke; reopening"
                    );
                    update(state, |s| s.store_reachable = false);
                    stream = None;
                }
                None => stream = None,
            },
            _ = heartbeat_tick.tick() => {
                let now = Timestamp::now();
                let written = tokio::select! {
                    () = shutdown.wait() => return Steady::Shutdown,
                    written = put(channel, agent, id, now) => written,
                };
                match written {
                    Ok(()) => {
                        metrics.zone_heartbeat(true);
                        update(state, |s| {
                            s.confirmed = Some(Instant::now());
                            s.last_heartbeat = Some(now);
                            s.store_reachable = true;
                        });
                    }
                    Err(err) => {
                        metrics.zone_heartbeat(false);
                        if err.lease_lost() {
                            return Steady::LeaseLost;
                        }
                        update(state, |s| s.store_reachable = false);
                        warn!(error = &err as &dyn std::error::Error, "heartbeat failed");
                    }
                }
            }
        }
    }
}

/// `fut`, unless shutdown begins first.
async fn or_shutdown<T>(shutdown: &Shutdown, fut: impl Future<Output = T>) -> Option<T> {
    tokio::select! {
        () = shutdown.wait() => None,
        value = fut => Some(value),
    }
}

/// The next keep-alive response; pending while no stream is open.
async fn next_response(
    stream: &mut Option<KeepAlive>,
) -> Option<Result<pb::LeaseKeepAliveResponse, Status>> {
    match stream {
        Some(ka) => ka.rx.next().await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_addresses_parse() {
        assert_eq!(
            "unix:///tmp/kontinuum-storage-relay.sock".parse::<StoreAddr>(),
            Ok(StoreAddr::Unix("/tmp/kontinuum-storage-relay.sock".into()))
        );
        assert_eq!(
            "127.0.0.1:2379".parse::<StoreAddr>().unwrap().to_string(),
            "http://127.0.0.1:2379/"
        );
        assert!("http://localhost:2379".parse::<StoreAddr>().is_ok());
        assert!("https://hub:443".parse::<StoreAddr>().is_err());
        assert!("unix://relative".parse::<StoreAddr>().is_err());
        assert!("localhost".parse::<StoreAddr>().is_err());
    }

    #[test]
    fn registered_needs_a_confirmed_lease() {
        let mut s = AgentState::default();
        assert!(!s.registered(30));
        s.lease_id = Some(7);
        s.confirmed = Some(Instant::now());
        assert!(s.registered(30));
        assert!(!s.registered(0), "confirmation older than the TTL");
        s.withdrawn = true;
        assert!(!s.registered(30));
    }

    #[test]
    fn lost_leases_are_recognised() {
        let lost = CallError::Status {
            call: "Put",
            source: Status::not_found("etcdserver: requested lease not found"),
        };
        assert!(lost.lease_lost());
        let denied = CallError::Status {
            call: "Put",
            source: Status::permission_denied("lease is not this zone's"),
        };
        assert!(denied.lease_lost());
        let down = CallError::Status {
            call: "Put",
            source: Status::unavailable("connection refused"),
        };
        assert!(!down.lease_lost());
        assert!(!CallError::Timeout { call: "Put" }.lease_lost());
    }
}
