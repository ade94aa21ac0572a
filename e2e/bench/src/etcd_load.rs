//! A closed-loop etcd v3 load generator on the tonic clients of `kontinuum-proto`: `clients`
//! tasks, each with its own connection, each sending one call, waiting for its answer and
//! sending the next, for a warm-up and then a measured window. Latency is taken per call;
//! throughput is the calls started in the window over the window's length.
//!
//! The same code drives every path (the store directly, the proxy, the relay), so any
//! difference between paths is the path's.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};
use etcd_proxy::relay::SecondToken;
use etcd_proxy::token::unix_now;
use kontinuum_proto::etcd::etcdserverpb as pb;
use pb::kv_client::KvClient;
use pb::lease_client::LeaseClient;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tonic::transport::Channel;
use tonic::{Request, Status};

/// TTL of the leases `put-lease` attaches (longer than any window).
const LEASE_TTL_SECS: i64 = 3600;

/// The call each client repeats.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum Op {
    /// `Put` of a fresh value to one of the client's own keys.
    Put,
    /// Linearizable `Range` of one existing key.
    Range,
    /// `Put` attached to a lease the client granted (through the proxy: the lease-ownership
    /// transaction).
    PutLease,
}

impl Op {
    /// The name in reports.
    pub fn label(self) -> &'static str {
        match self {
            Self::Put => "put",
            Self::Range => "range",
            Self::PutLease => "put with lease",
        }
    }
}

/// How the calls authenticate.
#[derive(Clone)]
pub enum Auth {
    /// Not at all (the store; the relay, which signs itself).
    None,
    /// A token on every call, exactly as the relay makes them (the current second's, signed
    /// once per second).
    AsTheRelay(Arc<SecondToken>),
}

/// Where the clients send their calls.
#[derive(Clone)]
pub struct Target {
    /// A new (lazily connected) channel: one per client, so one connection per client.
    pub connect: Arc<dyn Fn() -> Channel + Send + Sync>,
    /// How each call authenticates.
    pub auth: Auth,
}

impl Target {
    /// `msg` as a request, with a token when the target needs one.
    pub fn request<T>(&self, msg: T) -> Result<Request<T>, Status> {
        let mut req = Request::new(msg);
        if let Auth::AsTheRelay(token) = &self.auth {
            req.metadata_mut()
                .insert("authorization", token.at(unix_now())?);
        }
        Ok(req)
    }

    /// A KV client on a new channel.
    pub fn kv(&self) -> KvClient<Channel> {
        KvClient::new((self.connect)())
    }
}

/// One measurement's parameters.
#[derive(Clone, Debug)]
pub struct Workload {
    /// The call.
    pub op: Op,
    /// Concurrent clients.
    pub clients: usize,
    /// Calls before the window are not measured (connections, caches, JIT of the store).
    pub warmup: Duration,
    /// The measured window.
    pub window: Duration,
    /// Every key starts with this (the zone's prefix and `bench/`).
    pub prefix: Vec<u8>,
    /// Keys per client (`put`), or in all (`range`, see [`range_keys`]).
    pub keys: usize,
    /// The value of every put.
    pub value: Vec<u8>,
    /// A call taking longer counts as an error.
    pub timeout: Duration,
}

/// The keys `range` reads: `<prefix>range/<n>`, written once by [`populate`].
pub fn range_keys(prefix: &[u8], keys: usize) -> Vec<Vec<u8>> {
    (0..keys)
        .map(|n| [prefix, format!("range/{n:05}").as_bytes()].concat())
        .collect()
}

/// Writes the keys `range` reads.
pub async fn populate(
    target: &Target,
    prefix: &[u8],
    keys: usize,
    value: &[u8],
) -> anyhow::Result<()> {
    let mut kv = target.kv();
    for key in range_keys(prefix, keys) {
        let put = pb::PutRequest {
            key,
            value: value.to_vec(),
            ..Default::default()
        };
        tokio::time::timeout(Duration::from_secs(10), kv.put(target.request(put)?))
            .await
            .context("writing the keys to read timed out")?
            .context("writing the keys to read")?;
    }
    Ok(())
}

/// What one measurement saw.
#[derive(Clone, Debug, Default)]
pub struct Outcome {
    /// The latency of every successful call started in the window.
    pub latencies: Vec<Duration>,
    /// Failed calls (warm-up included) by gRPC code, `timeout`, or `task`; with one message.
    pub errors: BTreeMap<String, (usize, String)>,
    /// The window's length.
    pub window: Duration,
}

impl Outcome {
    /// Failed calls in all.
    pub fn error_count(&self) -> usize {
        self.errors.values().map(|(n, _)| n).sum()
    }
}

/// One client: its connection and its keys.
struct Client {
    kv: KvClient<Channel>,
    target: Target,
    op: Op,
    keys: Vec<Vec<u8>>,
    value: Vec<u8>,
    lease: i64,
    /// Where in `keys` this client starts (range clients spread over the keys).
    offset: usize,
}

impl Client {
    async fn new(target: &Target, n: usize, w: &Workload) -> anyhow::Result<Self> {
        let channel = (target.connect)();
        let kv = KvClient::new(channel.clone());
        let keys = match w.op {
            Op::Range => range_keys(&w.prefix, w.keys),
            Op::Put | Op::PutLease => {
                let kind = if w.op == Op::Put { "put" } else { "lease" };
                (0..w.keys)
                    .map(|k| [&w.prefix[..], format!("{kind}/{n:03}/{k:05}").as_bytes()].concat())
                    .collect()
            }
        };
        let lease = if w.op == Op::PutLease {
            let grant = pb::LeaseGrantRequest {
                ttl: LEASE_TTL_SECS,
                id: 0,
            };
            let granted = tokio::time::timeout(
                w.timeout,
                LeaseClient::new(channel).lease_grant(target.request(grant)?),
            )
            .await
            .context("granting a lease timed out")?
            .context("granting a lease")?
            .into_inner();
            if !granted.error.is_empty() || granted.id == 0 {
                bail!("granting a lease: {}", granted.error);
            }
            granted.id
        } else {
            0
        };
        Ok(Self {
            kv,
            target: target.clone(),
            op: w.op,
            keys,
            value: w.value.clone(),
            lease,
            offset: n.wrapping_mul(7919),
        })
    }

    async fn call(&mut self, seq: usize) -> Result<(), Status> {
        let Some(key) = self
            .keys
            .get(seq.wrapping_add(self.offset) % self.keys.len().max(1))
            .cloned()
        else {
            return Err(Status::invalid_argument("no keys"));
        };
        match self.op {
            Op::Range => {
                let range = pb::RangeRequest {
                    key,
                    ..Default::default()
                };
                let resp = self
                    .kv
                    .range(self.target.request(range)?)
                    .await?
                    .into_inner();
                if resp.kvs.is_empty() {
                    return Err(Status::not_found("the key to read is missing"));
                }
            }
            Op::Put | Op::PutLease => {
                let put = pb::PutRequest {
                    key,
                    value: self.value.clone(),
                    lease: self.lease,
                    ..Default::default()
                };
                self.kv.put(self.target.request(put)?).await?;
            }
        }
        Ok(())
    }
}

/// What one client task recorded.
#[derive(Default)]
struct Record {
    latencies: Vec<Duration>,
    errors: BTreeMap<String, (usize, String)>,
}

async fn drive(mut client: Client, from: Instant, until: Instant, timeout: Duration) -> Record {
    let mut record = Record::default();
    let mut seq = 0usize;
    loop {
        let started = Instant::now();
        if started >= until {
            return record;
        }
        let result = tokio::time::timeout(timeout, client.call(seq)).await;
        let took = started.elapsed();
        seq = seq.wrapping_add(1);
        let failure = match result {
            Ok(Ok(())) => {
                if started >= from {
                    record.latencies.push(took);
                }
                continue;
            }
            Ok(Err(status)) => (format!("{:?}", status.code()), status.message().to_owned()),
            Err(_) => (
                "timeout".to_owned(),
                format!("no answer within {timeout:?}"),
            ),
        };
        let entry = record.errors.entry(failure.0).or_insert((0, failure.1));
        entry.0 += 1;
    }
}

/// Runs one measurement: sets the clients up (a connection each, a lease each for
/// `put-lease`), warms up, and measures. `snapshot` is taken when the window opens and when
/// it closes (CPU counters), and both are returned with the outcome.
pub async fn run<S>(
    target: &Target,
    w: &Workload,
    mut snapshot: impl FnMut() -> S,
) -> anyhow::Result<(Outcome, S, S)> {
    if w.clients == 0 || w.keys == 0 {
        bail!("a workload needs at least one client and one key");
    }
    let mut clients = Vec::with_capacity(w.clients);
    for n in 0..w.clients {
        clients.push(Client::new(target, n, w).await?);
    }
    let start = Instant::now();
    let from = start + w.warmup;
    let until = from + w.window;
    let mut tasks = JoinSet::new();
    for client in clients {
        tasks.spawn(drive(client, from, until, w.timeout));
    }
    // The window is a fixed span of time by design: the snapshots bracket it.
    tokio::time::sleep_until(from).await;
    let first = snapshot();
    tokio::time::sleep_until(until).await;
    let last = snapshot();
    let mut outcome = Outcome {
        window: w.window,
        ..Outcome::default()
    };
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok(record) => {
                outcome.latencies.extend(record.latencies);
                for (code, (n, message)) in record.errors {
                    outcome.errors.entry(code).or_insert((0, message)).0 += n;
                }
            }
            Err(join) => {
                outcome
                    .errors
                    .entry("task".to_owned())
                    .or_insert((0, join.to_string()))
                    .0 += 1;
            }
        }
    }
    Ok((outcome, first, last))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range_keys_are_under_the_prefix_and_sorted() {
        let keys = range_keys(b"/p/", 3);
        assert_eq!(
            keys,
            vec![
                b"/p/range/00000".to_vec(),
                b"/p/range/00001".to_vec(),
                b"/p/range/00002".to_vec()
            ]
        );
    }
}
