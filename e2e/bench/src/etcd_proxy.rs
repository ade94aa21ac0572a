//! `kontinuum-bench etcd-proxy`: what the zone's way to the Kontinuum store costs (issue 11,
//! acceptance 7). Direct to the store against relay + proxy (TLS, a token on every call),
//! with a Rust etcd client (the tonic clients of `kontinuum-proto`): p50/p99 latency and
//! throughput of put and range at 1 and 16 concurrent clients, against the target
//! "p99 ≤ 1.2 × direct + 1 ms, throughput ≥ 80 % of direct"; cross-checked with the test
//! bed's `etcdctl check perf --prefix`.
//!
//! Real parts, release builds: the test bed's etcd is the store; a test-bed control plane
//! holds the zone's identity Secret, which `etcd-proxy serve` (TLS, serving certificate from
//! a test CA) watches; `etcd-proxy relay` listens on a unix socket with the zone's ed25519
//! key, as in a zone. To tell where the time goes, two more paths skip parts of the chain:
//! the proxy without TLS and the proxy with TLS, each called by the benchmark itself with
//! tokens made exactly as the relay makes them. A third, the floor, replaces relay and proxy
//! by two processes that only copy bytes (`kontinuum-bench forward`): the least any path
//! through two more processes costs here. CPU time of every process is read from `/proc`
//! around each measured window, so the operators' own cost per call is apart from the
//! store's. Two placements: every process on every CPU, and the relay and the proxy pinned
//! to CPUs of their own (as on nodes of their own). With `perf` installed, a flat CPU
//! profile of the relay and the proxy under load says where their time goes.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use etcd_proxy::identity::{CERT_KEY, SECRET_TYPE, labels};
use etcd_proxy::relay::SecondToken;
use etcd_proxy::tls::{Connector, Trust, channel, client_config};
use etcd_proxy::token::{self, Signer, TrustedKey, VerifiedTokens, unix_now};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kontinuum_proto::etcd::etcdserverpb as pb;
use kontinuum_testbed::{CertificateAuthority, ControlPlane, ControlPlaneConfig, Tools};
use kube::Api;
use kube::api::{ObjectMeta, PostParams};
use tonic::transport::{Channel, Endpoint};

use crate::child::Child;
use crate::etcd_load::{self, Auth, Op, Outcome, Target, Workload};
use crate::perf_profile;
use crate::procfs::{self, HostCpu};
use crate::report::{Environment, Report, Section, Table};
use crate::say;
use crate::stats::{fmt_duration, fmt_kib, rate, summarize};

const LOCALHOST: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);
const REGION: &str = "bench";
const ZONE: &str = "1a";
/// How long a process may take to listen, and a path to answer its first call.
const START_LIMIT: Duration = Duration::from_secs(60);
/// Latency target: p99 ≤ `P99_FACTOR` × direct p99 + `P99_SLACK`.
const P99_FACTOR: f64 = 1.2;
const P99_SLACK: Duration = Duration::from_millis(1);
/// Throughput target: at least this share of direct.
const THROUGHPUT_SHARE: f64 = 0.8;
/// Token sign/verify iterations for the in-process figures.
const TOKEN_ITERATIONS: u32 = 2_000;

/// The ways from the client to the store.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum Way {
    /// The store itself (plaintext, loopback).
    Direct,
    /// `etcd-proxy serve --plaintext`; the benchmark signs a token per call.
    ProxyPlaintext,
    /// `etcd-proxy serve` with TLS; the benchmark signs a token per call.
    ProxyTls,
    /// `etcd-proxy relay` on a unix socket, in front of the TLS proxy: the zone's path.
    Relay,
    /// Two byte-copying TCP forwarders in a row (`kontinuum-bench forward`): the floor of any
    /// path through two more processes.
    Forwarders,
}

impl Way {
    fn label(self) -> &'static str {
        match self {
            Self::Direct => "direct (store)",
            Self::ProxyPlaintext => "proxy, plaintext",
            Self::ProxyTls => "proxy, TLS",
            Self::Relay => "relay + proxy (TLS)",
            Self::Forwarders => "two byte forwarders (floor)",
        }
    }
}

/// Where the processes may run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum Placement {
    /// Every process on every CPU, as the scheduler likes.
    Shared,
    /// The client and the store on the first half of the CPUs, the relay and the proxies on
    /// the other half: the operators do not take CPU from the store or the client, as on
    /// nodes of their own.
    Split,
}

/// Options of `kontinuum-bench etcd-proxy`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Calls to measure.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "put,range,put-lease"
    )]
    ops: Vec<Op>,
    /// Concurrent clients (each its own connection).
    #[arg(long, value_delimiter = ',', default_value = "1,16")]
    concurrency: Vec<usize>,
    /// Paths to the store (`direct` and `relay` make the target table).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "direct,proxy-plaintext,proxy-tls,relay,forwarders"
    )]
    ways: Vec<Way>,
    /// CPU placements to measure in (`split` measures `direct`, `relay` and `forwarders` only).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "shared,split"
    )]
    placements: Vec<Placement>,
    /// Rounds: each round measures every path once, one after the other, so that a
    /// disturbance of the shared machine spreads over all of them.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Measured window per path, round and configuration, in milliseconds.
    #[arg(long, default_value_t = 2_000)]
    window_ms: u64,
    /// Unmeasured warm-up before each window, in milliseconds.
    #[arg(long, default_value_t = 500)]
    warmup_ms: u64,
    /// Bytes per value.
    #[arg(long, default_value_t = 256)]
    value_size: usize,
    /// Keys per put client, and keys read by range clients.
    #[arg(long, default_value_t = 256)]
    keys: usize,
    /// Run the store with `--unsafe-no-fsync` (no disk flush per write: only CPU and
    /// network are left in a put's latency).
    #[arg(long)]
    unsafe_no_fsync: bool,
    /// Seconds to sample the relay and the proxy with `perf` (if installed) under load through
    /// the relay; 0 for no profile.
    #[arg(long, default_value_t = 10)]
    profile_seconds: u64,
    /// The call profiled (at the highest --concurrency).
    #[arg(long, value_enum, default_value = "range")]
    profile_op: Op,
    /// The `etcdctl check perf --load` workload.
    #[arg(long, default_value = "s")]
    check_perf_load: String,
    /// Skip the `etcdctl check perf` cross-check (a minute per path).
    #[arg(long)]
    skip_check_perf: bool,
    /// The etcd-proxy binary (default: next to this executable).
    #[arg(long, env = "KONTINUUM_ETCD_PROXY_BIN")]
    etcd_proxy_bin: Option<PathBuf>,
    /// Where to write the Markdown report.
    #[arg(long, default_value = "bench-results/etcd-proxy.md")]
    out: PathBuf,
}

/// Runs the benchmark, writes and returns the report.
pub async fn run(args: Args) -> anyhow::Result<String> {
    if args.concurrency.is_empty() || args.concurrency.contains(&0) {
        bail!("every --concurrency must be at least 1");
    }
    if args.rounds == 0 || args.keys == 0 || args.window_ms == 0 {
        bail!("--rounds, --keys and --window-ms must be at least 1");
    }
    let started = Instant::now();
    let environment = Environment::capture();
    let tools = Tools::locate().context("locating the test-bed tools (KONTINUUM_TESTBED_BIN)")?;
    let bin = match &args.etcd_proxy_bin {
        Some(bin) => bin.clone(),
        None => crate::bootstrap::operator_binary("etcd-proxy")?,
    };
    let mut world = World::start(
        &tools,
        &bin,
        args.ways.contains(&Way::ProxyPlaintext),
        args.ways.contains(&Way::Forwarders),
        args.unsafe_no_fsync,
    )
    .await?;
    let result = measure_all(&args, &tools, &mut world, environment).await;
    world.stop().await;
    let mut report = result?;
    report.push(Section::new("Run").text(format!(
        "Whole run (set-up, measurements, cross-checks, tear-down): {}.",
        fmt_duration(started.elapsed())
    )));
    let text = report.write_to(&args.out)?;
    say(&format!("report written to {}", args.out.display()));
    Ok(text)
}

/// Every process of the benchmark and how to reach it.
struct World {
    dir: PathBuf,
    bin: PathBuf,
    hub: ControlPlane,
    store: Child,
    store_url: String,
    proxy: Child,
    proxy_addr: SocketAddr,
    proxy_admin: SocketAddr,
    plain: Option<(Child, SocketAddr)>,
    relay: Child,
    relay_socket: PathBuf,
    /// The two forwarders (first, second) and the first one's address.
    forwarders: Option<(Child, Child, SocketAddr)>,
    ca: PathBuf,
    signer: Arc<Signer>,
}

pub(crate) fn free_port() -> anyhow::Result<u16> {
    Ok(kontinuum_testbed::free_port(LOCALHOST)?)
}

pub(crate) fn log_args() -> [String; 2] {
    // The production default level: what a deployed proxy and relay log per call.
    ["--log-level=warn".into(), "--log-format=text".into()]
}

pub(crate) async fn listens(addr: SocketAddr) -> bool {
    tokio::time::timeout(Duration::from_secs(1), tokio::net::TcpStream::connect(addr))
        .await
        .is_ok_and(|c| c.is_ok())
}

/// A zone identity as the zone-installer issues it: an ed25519 key and its self-signed
/// certificate, written as the mounted Secret is (`tls.key`, `tls.crt`); returns the
/// certificate PEM and the signer.
fn zone_identity(dir: &Path, name: &str) -> anyhow::Result<(String, Signer)> {
    let key =
        rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).context("generating the zone key")?;
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new())?;
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name.to_owned());
    let cert = params
        .self_signed(&key)
        .context("self-signing the zone certificate")?;
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join("tls.crt"), cert.pem())?;
    std::fs::write(dir.join("tls.key"), key.serialize_pem())?;
    let signer = Signer::from_pkcs8_pem(key.serialize_pem().as_bytes(), name)?;
    Ok((cert.pem(), signer))
}

/// The hub's identity Secret for the zone, as the zone-installer writes it.
fn identity_secret(name: &str, cert_pem: &str) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(format!("{name}-identity")),
            labels: Some(labels(REGION, ZONE)),
            ..ObjectMeta::default()
        },
        type_: Some(SECRET_TYPE.into()),
        data: Some(BTreeMap::from([(
            CERT_KEY.to_owned(),
            ByteString(cert_pem.as_bytes().to_vec()),
        )])),
        ..Secret::default()
    }
}

fn zone_prefix() -> String {
    format!("/kontinuum.sh/zones/{REGION}/{ZONE}/")
}

/// The store: one test-bed etcd member on loopback; returns it once it answers.
pub(crate) async fn start_store(
    tools: &Tools,
    dir: &Path,
    no_fsync: bool,
) -> anyhow::Result<(Child, String)> {
    let (client_port, peer_port) = (free_port()?, free_port()?);
    let store_url = format!("http://127.0.0.1:{client_port}");
    let peer_url = format!("http://127.0.0.1:{peer_port}");
    let mut args = vec![
        "--name=store".to_owned(),
        format!("--data-dir={}", dir.join("store").display()),
        format!("--listen-client-urls={store_url}"),
        format!("--advertise-client-urls={store_url}"),
        format!("--listen-peer-urls={peer_url}"),
        format!("--initial-advertise-peer-urls={peer_url}"),
        format!("--initial-cluster=store={peer_url}"),
        "--log-level=warn".to_owned(),
    ];
    if no_fsync {
        args.push("--unsafe-no-fsync=true".to_owned());
    }
    let mut store = Child::spawn(
        "etcd (store)",
        &tools.path("etcd"),
        &args,
        dir.join("store.log"),
    )?;
    let direct = Target {
        connect: plain_connect(&store_url)?,
        auth: Auth::None,
    };
    store
        .wait_until("answer a Range", START_LIMIT, || answers(&direct))
        .await?;
    Ok((store, store_url))
}

/// A test CA and the proxy's serving certificate for 127.0.0.1: (CA, cert, key) files.
pub(crate) fn write_pki(dir: &Path) -> anyhow::Result<(PathBuf, PathBuf, PathBuf)> {
    let ca = CertificateAuthority::generate("etcd-proxy-bench-ca")?;
    let serving = ca.server("etcd-proxy", &[LOCALHOST], &[])?;
    let paths = (
        dir.join("ca.crt"),
        dir.join("proxy.crt"),
        dir.join("proxy.key"),
    );
    std::fs::write(&paths.0, &ca.cert_pem)?;
    std::fs::write(&paths.1, &serving.cert_pem)?;
    std::fs::write(&paths.2, &serving.key_pem)?;
    Ok(paths)
}

/// Issues the zone's identity into `identity_dir` and admits it on the hub (its identity
/// Secret in a new namespace); returns the namespace and the zone's signer.
async fn admit_zone(
    hub: &ControlPlane,
    identity_dir: &Path,
    zone_name: &str,
) -> anyhow::Result<(String, Arc<Signer>)> {
    let (cert_pem, signer) = zone_identity(identity_dir, zone_name)?;
    let client = hub.client();
    let namespace = kontinuum_e2e::namespace(&client, "bench-etcd-proxy").await?;
    Api::<Secret>::namespaced(client, &namespace)
        .create(
            &PostParams::default(),
            &identity_secret(zone_name, &cert_pem),
        )
        .await
        .context("creating the zone's identity Secret")?;
    Ok((namespace, Arc::new(signer)))
}

/// Starts `etcd-proxy serve` and waits until it listens on `addr` (which it does once its
/// identity index has synced) and, given a target, until the zone is admitted through it.
pub(crate) async fn start_proxy(
    name: &str,
    bin: &Path,
    args: &[String],
    log: &Path,
    addr: SocketAddr,
    admitted: Option<&Target>,
) -> anyhow::Result<Child> {
    let mut child = Child::spawn(name, bin, args, log.to_path_buf())?;
    child
        .wait_until("listen", START_LIMIT, || listens(addr))
        .await?;
    if let Some(target) = admitted {
        child
            .wait_until("admit the zone", START_LIMIT, || answers(target))
            .await?;
    }
    Ok(child)
}

/// Starts `etcd-proxy relay` and waits until a call through it reaches the store.
async fn start_relay(
    bin: &Path,
    args: &[String],
    dir: &Path,
    socket: &Path,
) -> anyhow::Result<Child> {
    let mut relay = Child::spawn("etcd-proxy relay", bin, args, dir.join("relay.log"))?;
    let through_relay = Target {
        connect: unix_connect(socket.to_path_buf()),
        auth: Auth::None,
    };
    relay
        .wait_until("answer a Range through the proxy", START_LIMIT, || {
            answers(&through_relay)
        })
        .await?;
    Ok(relay)
}

/// When `wanted`, starts two forwarders in a row in front of the store and waits until a
/// call through them reaches it; returns them with the first one's address.
async fn start_forwarders(
    wanted: bool,
    dir: &Path,
    store_url: &str,
) -> anyhow::Result<Option<(Child, Child, SocketAddr)>> {
    if !wanted {
        return Ok(None);
    }
    let store: SocketAddr = store_url
        .trim_start_matches("http://")
        .parse()
        .with_context(|| format!("the store's address in {store_url}"))?;
    let bench = std::env::current_exe().context("locating kontinuum-bench")?;
    let second_addr = SocketAddr::new(LOCALHOST, free_port()?);
    let first_addr = SocketAddr::new(LOCALHOST, free_port()?);
    let forward = |listen: SocketAddr, to: SocketAddr| {
        vec![
            "forward".to_owned(),
            format!("--listen={listen}"),
            format!("--to={to}"),
        ]
    };
    let mut second = Child::spawn(
        "forwarder 2",
        &bench,
        &forward(second_addr, store),
        dir.join("forwarder-2.log"),
    )?;
    second
        .wait_until("listen", START_LIMIT, || listens(second_addr))
        .await?;
    let mut first = Child::spawn(
        "forwarder 1",
        &bench,
        &forward(first_addr, second_addr),
        dir.join("forwarder-1.log"),
    )?;
    let through = Target {
        connect: plain_connect(&format!("http://{first_addr}"))?,
        auth: Auth::None,
    };
    first
        .wait_until("answer a Range through both", START_LIMIT, || {
            answers(&through)
        })
        .await?;
    Ok(Some((first, second, first_addr)))
}

impl World {
    async fn start(
        tools: &Tools,
        bin: &Path,
        plaintext: bool,
        forwarders: bool,
        no_fsync: bool,
    ) -> anyhow::Result<Self> {
        let dir = kontinuum_testbed::unique_dir("bench-etcd-proxy");
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        say(&format!(
            "starting the hub control plane and the store in {}",
            dir.display()
        ));
        let mut config = ControlPlaneConfig::new(dir.join("hub"));
        config.nodes = Vec::new();
        let hub = ControlPlane::start(tools, config)
            .await
            .context("starting the hub control plane")?;

        let (store, store_url) = start_store(tools, &dir, no_fsync).await?;

        let (ca_path, cert_path, key_path) = write_pki(&dir)?;

        let zone_name = format!("{REGION}-{ZONE}");
        let identity_dir = dir.join("identity");
        let (namespace, signer) = admit_zone(&hub, &identity_dir, &zone_name).await?;

        let serve = |listen: SocketAddr, admin: SocketAddr, tls: bool| {
            let mut args = vec![
                "serve".to_owned(),
                format!("--listen={listen}"),
                format!("--store={store_url}"),
                format!("--namespace={namespace}"),
                format!("--kubeconfig={}", hub.kubeconfig_path().display()),
                format!("--admin-addr={admin}"),
            ];
            if tls {
                args.push(format!("--tls-cert={}", cert_path.display()));
                args.push(format!("--tls-key={}", key_path.display()));
            } else {
                args.push("--plaintext".to_owned());
            }
            args.extend(log_args());
            args
        };
        let proxy_addr = SocketAddr::new(LOCALHOST, free_port()?);
        let proxy_admin = SocketAddr::new(LOCALHOST, free_port()?);
        let proxy = start_proxy(
            "etcd-proxy serve (TLS)",
            bin,
            &serve(proxy_addr, proxy_admin, true),
            &dir.join("proxy-tls.log"),
            proxy_addr,
            None,
        )
        .await?;
        let plain = if plaintext {
            let addr = SocketAddr::new(LOCALHOST, free_port()?);
            let admin = SocketAddr::new(LOCALHOST, free_port()?);
            let target = Target {
                connect: plain_connect(&format!("http://{addr}"))?,
                auth: Auth::AsTheRelay(Arc::new(SecondToken::new(Arc::clone(&signer)))),
            };
            let child = start_proxy(
                "etcd-proxy serve (plaintext)",
                bin,
                &serve(addr, admin, false),
                &dir.join("proxy-plaintext.log"),
                addr,
                Some(&target),
            )
            .await?;
            Some((child, addr))
        } else {
            None
        };

        let relay_socket = dir.join("relay.sock");
        let relay_args = [
            "relay".to_owned(),
            format!("--listen=unix://{}", relay_socket.display()),
            format!("--endpoint=https://{proxy_addr}"),
            format!("--ca={}", ca_path.display()),
            format!("--identity-dir={}", identity_dir.display()),
            format!("--zone={zone_name}"),
            format!("--admin-addr={}", SocketAddr::new(LOCALHOST, free_port()?)),
        ];
        let relay = start_relay(
            bin,
            &[&relay_args[..], &log_args()].concat(),
            &dir,
            &relay_socket,
        )
        .await?;
        Ok(Self {
            forwarders: start_forwarders(forwarders, &dir, &store_url).await?,
            dir,
            bin: bin.to_path_buf(),
            hub,
            store,
            store_url,
            proxy,
            proxy_addr,
            proxy_admin,
            plain,
            relay,
            relay_socket,
            ca: ca_path,
            signer,
        })
    }

    fn target(&self, way: Way) -> anyhow::Result<Target> {
        let signed = Auth::AsTheRelay(Arc::new(SecondToken::new(Arc::clone(&self.signer))));
        Ok(match way {
            Way::Direct => Target {
                connect: plain_connect(&self.store_url)?,
                auth: Auth::None,
            },
            Way::ProxyPlaintext => {
                let (_, addr) = self
                    .plain
                    .as_ref()
                    .context("the plaintext proxy is not running")?;
                Target {
                    connect: plain_connect(&format!("http://{addr}"))?,
                    auth: signed,
                }
            }
            Way::ProxyTls => {
                let tls = client_config(&Trust::CaFile(self.ca.clone()), None)?;
                let uri: http::Uri = format!("https://{}", self.proxy_addr).parse()?;
                Target {
                    connect: Arc::new(move || {
                        channel(uri.clone(), Connector::new(Some(Arc::clone(&tls))))
                    }),
                    auth: signed,
                }
            }
            Way::Relay => Target {
                connect: unix_connect(self.relay_socket.clone()),
                auth: Auth::None,
            },
            Way::Forwarders => {
                let (_, _, addr) = self
                    .forwarders
                    .as_ref()
                    .context("the forwarders are not running")?;
                Target {
                    connect: plain_connect(&format!("http://{addr}"))?,
                    auth: Auth::None,
                }
            }
        })
    }

    /// The processes whose CPU time is read around each window.
    fn pids(&self) -> Pids {
        let forwarders = self.forwarders.as_ref();
        Pids {
            client: std::process::id(),
            relay: [Some(self.relay.pid()), forwarders.map(|(f, _, _)| f.pid())],
            proxies: [
                Some(self.proxy.pid()),
                self.plain.as_ref().map(|(c, _)| c.pid()),
                forwarders.map(|(_, f, _)| f.pid()),
            ],
            store: self.store.pid(),
        }
    }

    fn alive(&mut self) -> anyhow::Result<()> {
        self.store.check_alive()?;
        self.proxy.check_alive()?;
        self.relay.check_alive()?;
        if let Some((plain, _)) = self.plain.as_mut() {
            plain.check_alive()?;
        }
        if let Some((first, second, _)) = self.forwarders.as_mut() {
            first.check_alive()?;
            second.check_alive()?;
        }
        Ok(())
    }

    async fn stop(self) {
        let grace = Duration::from_secs(10);
        self.relay.stop(grace).await;
        if let Some((plain, _)) = self.plain {
            plain.stop(grace).await;
        }
        if let Some((first, second, _)) = self.forwarders {
            first.stop(grace).await;
            second.stop(grace).await;
        }
        self.proxy.stop(grace).await;
        self.store.stop(grace).await;
        self.hub.stop().await;
        // The logs stay; the store's data goes.
        let _ = std::fs::remove_dir_all(self.dir.join("store"));
    }
}

pub(crate) type Connect = Arc<dyn Fn() -> Channel + Send + Sync>;

pub(crate) fn plain_connect(url: &str) -> anyhow::Result<Connect> {
    let uri: http::Uri = url.parse().with_context(|| format!("parsing {url}"))?;
    Ok(Arc::new(move || channel(uri.clone(), Connector::new(None))))
}

/// Channels to a unix socket (the relay's listener).
fn unix_connect(path: PathBuf) -> Connect {
    Arc::new(move || {
        let path = path.clone();
        Endpoint::from_static("http://relay.invalid")
            .connect_timeout(Duration::from_secs(5))
            .connect_with_connector_lazy(tower::service_fn(move |_: http::Uri| {
                let path = path.clone();
                async move {
                    let stream = tokio::net::UnixStream::connect(path).await?;
                    Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
                }
            }))
    })
}

/// Whether a Range of one key in the zone's prefix succeeds through `target`.
async fn answers(target: &Target) -> bool {
    let Ok(req) = target.request(pb::RangeRequest {
        key: format!("{}ready", zone_prefix()).into_bytes(),
        ..Default::default()
    }) else {
        return false;
    };
    tokio::time::timeout(Duration::from_secs(5), target.kv().range(req))
        .await
        .is_ok_and(|r| r.is_ok())
}

/// The processes of one path's cost.
#[derive(Clone, Copy, Debug)]
struct Pids {
    client: u32,
    /// The relay, and the first forwarder (summed: the idle one adds nothing).
    relay: [Option<u32>; 2],
    /// The proxies, and the second forwarder.
    proxies: [Option<u32>; 3],
    store: u32,
}

/// CPU counters at one instant.
#[derive(Clone, Copy, Debug, Default)]
struct CpuSnapshot {
    host: HostCpu,
    /// client, relay (or first forwarder), proxies (or second forwarder), store: the
    /// processes of one column summed, as only the path measured is busy.
    cpu: [Duration; 4],
}

impl CpuSnapshot {
    fn take(pids: Pids) -> Self {
        let cpu = |pid: u32| procfs::cpu_time(pid).unwrap_or_default();
        let relay = pids.relay.iter().flatten().map(|&p| cpu(p)).sum();
        let proxies = pids.proxies.iter().flatten().map(|&p| cpu(p)).sum();
        Self {
            host: HostCpu::read(),
            cpu: [cpu(pids.client), relay, proxies, cpu(pids.store)],
        }
    }
}

/// Everything measured for one (op, clients, path), over all rounds.
#[derive(Clone, Debug, Default)]
struct Aggregate {
    outcome: Outcome,
    cpu: [Duration; 4],
    host_busy: u64,
    host_total: u64,
    /// Calls per second of each round.
    round_rates: Vec<f64>,
}

impl Aggregate {
    fn add(&mut self, outcome: Outcome, first: CpuSnapshot, last: CpuSnapshot) {
        self.round_rates
            .push(rate(outcome.latencies.len(), outcome.window));
        self.outcome.latencies.extend(outcome.latencies);
        self.outcome.window += outcome.window;
        for (code, (n, message)) in outcome.errors {
            self.outcome.errors.entry(code).or_insert((0, message)).0 += n;
        }
        for (sum, (a, b)) in self
            .cpu
            .iter_mut()
            .zip(first.cpu.iter().zip(last.cpu.iter()))
        {
            *sum += b.saturating_sub(*a);
        }
        self.host_busy += last.host.busy.saturating_sub(first.host.busy);
        self.host_total += last.host.total.saturating_sub(first.host.total);
    }

    fn calls(&self) -> usize {
        self.outcome.latencies.len()
    }

    fn rate(&self) -> f64 {
        rate(self.calls(), self.outcome.window)
    }

    /// CPU per successful call of process `i` (see [`CpuSnapshot::cpu`]).
    fn cpu_per_call(&self, i: usize) -> Duration {
        let calls = u32::try_from(self.calls()).unwrap_or(u32::MAX).max(1);
        self.cpu[i] / calls
    }

    /// CPU per call of every process on the path together.
    fn path_cpu_per_call(&self) -> Duration {
        (0..4).map(|i| self.cpu_per_call(i)).sum()
    }

    fn host_busy_share(&self) -> f64 {
        HostCpu {
            total: self.host_total,
            busy: self.host_busy,
        }
        .busy_since(HostCpu::default())
    }
}

type Key = (Op, usize, Way);

/// Sets the CPU affinity of every thread of `pid` (threads started later inherit it).
fn pin(pid: u32, cpus: &[usize]) -> anyhow::Result<()> {
    let mut set = nix::sched::CpuSet::new();
    for &cpu in cpus {
        set.set(cpu)?;
    }
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))
        .with_context(|| format!("listing the threads of {pid}"))?;
    for task in tasks.filter_map(Result::ok) {
        let Some(tid) = task
            .file_name()
            .to_str()
            .and_then(|t| t.parse::<i32>().ok())
        else {
            continue;
        };
        // A thread that ended meanwhile has nothing left to pin.
        let _ = nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(tid), &set);
    }
    Ok(())
}

/// The CPUs of (client and store, relay and proxies) for a placement on `cpus` CPUs.
fn cpu_sets(placement: Placement, cpus: usize) -> (Vec<usize>, Vec<usize>) {
    let all: Vec<usize> = (0..cpus.max(1)).collect();
    match placement {
        Placement::Split if cpus >= 2 => {
            let (first, second) = all.split_at(cpus / 2);
            (first.to_vec(), second.to_vec())
        }
        _ => (all.clone(), all),
    }
}

/// Pins the processes for `placement` on the machine's `cpus` CPUs. (`cpus` is read once,
/// before any pinning: a pinned thread sees only its own CPUs.)
fn place(pids: Pids, placement: Placement, cpus: usize) -> anyhow::Result<()> {
    let (clients, operators) = cpu_sets(placement, cpus);
    pin(pids.client, &clients)?;
    pin(pids.store, &clients)?;
    for relay in pids.relay.iter().flatten() {
        pin(*relay, &operators)?;
    }
    for proxy in pids.proxies.iter().flatten() {
        pin(*proxy, &operators)?;
    }
    Ok(())
}

/// Every configuration and round on `targets`, with the processes placed as `placement`.
async fn measure_placement(
    args: &Args,
    world: &mut World,
    targets: &[&(Way, Target)],
    placement: Placement,
    prefix: &[u8],
    value: &[u8],
) -> anyhow::Result<BTreeMap<Key, Aggregate>> {
    let pids = world.pids();
    let mut results: BTreeMap<Key, Aggregate> = BTreeMap::new();
    for &op in &args.ops {
        for &clients in &args.concurrency {
            let workload = Workload {
                op,
                clients,
                warmup: Duration::from_millis(args.warmup_ms),
                window: Duration::from_millis(args.window_ms),
                prefix: prefix.to_vec(),
                keys: args.keys,
                value: value.to_vec(),
                timeout: Duration::from_secs(10),
            };
            for round in 1..=args.rounds {
                // Alternate the order, so that no path always runs first or last.
                let mut order = targets.to_vec();
                if round % 2 == 0 {
                    order.reverse();
                }
                for (way, target) in order {
                    let (outcome, first, last) =
                        etcd_load::run(target, &workload, || CpuSnapshot::take(pids)).await?;
                    say(&format!(
                        "{placement:?} {} c={clients} round {round} {}: {:.0} calls/s, p50 {}, p99 {}, {} errors",
                        op.label(),
                        way.label(),
                        rate(outcome.latencies.len(), outcome.window),
                        fmt_duration(summarize(&outcome.latencies).p50),
                        fmt_duration(summarize(&outcome.latencies).p99),
                        outcome.error_count(),
                    ));
                    world.alive()?;
                    results
                        .entry((op, clients, *way))
                        .or_default()
                        .add(outcome, first, last);
                }
            }
        }
    }
    Ok(results)
}

async fn measure_all(
    args: &Args,
    tools: &Tools,
    world: &mut World,
    environment: Environment,
) -> anyhow::Result<Report> {
    let mut report = Report::new(
        "etcd-proxy: direct to the store against relay + proxy",
        environment,
    );
    report.push(setup_section(args, world));
    let cost = token_cost(&world.signer);

    let prefix = format!("{}bench/", zone_prefix()).into_bytes();
    let value = vec![b'v'; args.value_size];
    let direct = world.target(Way::Direct)?;
    if args.ops.contains(&Op::Range) || (args.profile_seconds > 0 && args.profile_op == Op::Range) {
        say(&format!("writing {} keys to read", args.keys));
        etcd_load::populate(&direct, &prefix, args.keys, &value).await?;
    }
    let mut ways: Vec<Way> = args.ways.clone();
    ways.sort_unstable();
    ways.dedup();
    let targets: Vec<(Way, Target)> = ways
        .iter()
        .map(|&w| Ok((w, world.target(w)?)))
        .collect::<anyhow::Result<_>>()?;
    let pids = world.pids();
    let cpus = report.environment.host.cpus.max(1);
    let mut placements = args.placements.clone();
    placements.sort_unstable();
    placements.dedup();
    let mut all: BTreeMap<Placement, BTreeMap<Key, Aggregate>> = BTreeMap::new();
    for &placement in &placements {
        place(pids, placement, cpus)?;
        let targets: Vec<&(Way, Target)> = targets
            .iter()
            .filter(|(w, _)| {
                placement == Placement::Shared
                    || matches!(w, Way::Direct | Way::Relay | Way::Forwarders)
            })
            .collect();
        let results = measure_placement(args, world, &targets, placement, &prefix, &value).await?;
        all.insert(placement, results);
    }
    place(pids, Placement::Shared, cpus)?;
    let empty = BTreeMap::new();
    let shared = all.get(&Placement::Shared).unwrap_or(&empty);
    if placements.contains(&Placement::Shared) {
        report.push(target_section(args, shared, Placement::Shared));
        report.push(paths_section(args, shared, Placement::Shared, cpus));
        if let Some(section) = hops_section(shared) {
            report.push(section);
        }
        if let Some(section) = floor_section(shared, Placement::Shared) {
            report.push(section);
        }
    }
    if let Some(split) = all.get(&Placement::Split) {
        report.push(target_section(args, split, Placement::Split));
        report.push(paths_section(args, split, Placement::Split, cpus));
        if let Some(section) = floor_section(split, Placement::Split) {
            report.push(section);
        }
    }
    let measured = if shared.is_empty() {
        all.get(&Placement::Split).unwrap_or(&empty)
    } else {
        shared
    };
    report.push(token_section(cost, measured));
    for (placement, results) in &all {
        if let Some(section) = errors_section(*placement, results) {
            report.push(section);
        }
    }
    report.push(profile_section(args, world, &prefix, &value).await?);
    if args.skip_check_perf {
        report.push(
            Section::new("Cross-check: etcdctl check perf").text("Skipped (`--skip-check-perf`)."),
        );
    } else {
        report.push(check_perf_section(args, tools, world).await?);
    }
    report.push(processes_section(world));
    Ok(report)
}

/// Samples the relay and the proxy with `perf` while clients call through the relay.
async fn profile_section(
    args: &Args,
    world: &World,
    prefix: &[u8],
    value: &[u8],
) -> anyhow::Result<Section> {
    let title = "Profile of the relay and the proxy";
    if args.profile_seconds == 0 {
        return Ok(Section::new(title).text("Skipped (`--profile-seconds 0`)."));
    }
    if !perf_profile::available().await {
        return Ok(Section::new(title).text("Skipped: `perf` is not installed."));
    }
    let clients = args.concurrency.iter().copied().max().unwrap_or(1);
    let seconds = Duration::from_secs(args.profile_seconds);
    let warmup = Duration::from_millis(500);
    let workload = Workload {
        op: args.profile_op,
        clients,
        warmup,
        window: seconds + Duration::from_secs(1),
        prefix: prefix.to_vec(),
        keys: args.keys,
        value: value.to_vec(),
        timeout: Duration::from_secs(10),
    };
    say(&format!(
        "profiling the relay and the proxy for {}",
        fmt_duration(seconds)
    ));
    let target = world.target(Way::Relay)?;
    let (proxy_data, relay_data) = (world.dir.join("proxy.perf"), world.dir.join("relay.perf"));
    let recordings = async {
        // Recording starts once the clients are past their warm-up.
        tokio::time::sleep(warmup + Duration::from_millis(200)).await;
        tokio::join!(
            perf_profile::record(world.proxy.pid(), seconds, &proxy_data),
            perf_profile::record(world.relay.pid(), seconds, &relay_data),
        )
    };
    let (load, (proxy_recorded, relay_recorded)) =
        tokio::join!(etcd_load::run(&target, &workload, || ()), recordings);
    let (outcome, (), ()) = load?;
    proxy_recorded?;
    relay_recorded?;
    let top = 8;
    let proxy = perf_profile::report(&proxy_data, top).await?;
    let relay = perf_profile::report(&relay_data, top).await?;
    let mut names: Vec<&str> = proxy.categories.iter().map(|(n, _)| *n).collect();
    for (n, _) in &relay.categories {
        if !names.contains(n) {
            names.push(n);
        }
    }
    let pct = |p: &perf_profile::Profile, name: &str| {
        p.categories
            .iter()
            .find(|(n, _)| *n == name)
            .map_or_else(|| "-".to_owned(), |(_, v)| format!("{v:.1} %"))
    };
    let mut categories = Table::new(&["where the CPU goes", "proxy", "relay"]);
    for name in names {
        categories.row(vec![name.to_owned(), pct(&proxy, name), pct(&relay, name)]);
    }
    let mut symbols = Table::new(&["proxy: symbol", "share", "relay: symbol", "share"]);
    for i in 0..top {
        let cell = |p: &perf_profile::Profile| {
            p.top.get(i).map_or_else(
                || (String::new(), String::new()),
                |(v, s)| (format!("`{s}`"), format!("{v:.1} %")),
            )
        };
        let ((ps, pv), (rs, rv)) = (cell(&proxy), cell(&relay));
        symbols.row(vec![ps, pv, rs, rv]);
    }
    Ok(Section::new(title)
        .text(format!(
            "`perf record -F 999` on the proxy and the relay for {} while {clients} clients \
             called `{}` through the relay ({:.0} calls/s, p50 {}), every process on every \
             CPU. Flat profiles by symbol, grouped by what the code does; percentages of each \
             process's own samples. The recordings stay in the run's directory.",
            fmt_duration(seconds),
            args.profile_op.label(),
            rate(outcome.latencies.len(), outcome.window),
            fmt_duration(summarize(&outcome.latencies).p50),
        ))
        .table(categories)
        .table(symbols))
}

fn setup_section(args: &Args, world: &World) -> Section {
    Section::new("Set-up")
        .text(format!(
            "Everything on one machine. `{}`{} as proxy and relay. The store: the test bed's \
             etcd, one member on loopback ({}). The hub: a test-bed control plane (etcd, kube-apiserver, \
             kube-controller-manager, kube-scheduler, KWOK) holding the zone's identity Secret \
             (`{REGION}-{ZONE}-identity`, an ed25519 certificate made as the zone-installer \
             makes it). `etcd-proxy serve` with TLS (serving certificate from a test CA) watches \
             that Secret; `etcd-proxy relay` listens on a unix socket with the zone's key and \
             signs a fresh token (lifetime {} s) for every call it forwards. Log level `warn` \
             (the default) for both.\n\n\
             The client is this benchmark, with the tonic etcd v3 clients of `kontinuum-proto`: \
             closed loop, each of N clients on its own connection sends one call, waits for the \
             answer, sends the next. Per configuration and path: a warm-up of {} ms, then a \
             window of {} ms, in {} round(s), the paths one after the other within each round \
             (in reverse order every other round). \
             Keys under the zone's prefix `{}bench/`, values of {} bytes; `put` rewrites the \
             client's {} keys in turn, `range` reads one of {} keys (linearizable, etcd's \
             default), `put with lease` is a put attached to a lease the client granted through \
             the same path. CPU time of each process from `/proc/<pid>/stat` (10 ms ticks) \
             around each window; host CPU busy from `/proc/stat`.",
            world.bin.display(),
            if world.bin.components().any(|c| c.as_os_str() == "debug") {
                " (a debug build: figures are pessimistic)"
            } else {
                ""
            },
            if args.unsafe_no_fsync {
                "`--unsafe-no-fsync`: no disk flush per write"
            } else {
                "with fsync, as in production"
            },
            etcd_proxy::relay::TOKEN_LIFETIME_SECS,
            args.warmup_ms,
            args.window_ms,
            args.rounds,
            zone_prefix(),
            args.value_size,
            args.keys,
            args.keys,
        ))
        .text(format!(
            "Paths: **{}**: the benchmark → the store. **{}**: the benchmark (making its tokens \
             as the relay does) → `etcd-proxy serve --plaintext` → the store. **{}**: the \
             same over TLS. **{}**: the benchmark → the relay's unix socket → (TLS) the proxy → \
             the store: the zone's path. **{}**: the benchmark → `kontinuum-bench forward` → a \
             second one → the store, plaintext, each copying bytes on one thread and doing \
             nothing else (their CPU is in the relay and proxy columns). Logs and data: `{}`.",
            Way::Direct.label(),
            Way::ProxyPlaintext.label(),
            Way::ProxyTls.label(),
            Way::Relay.label(),
            Way::Forwarders.label(),
            world.dir.display()
        ))
}

/// Whether a path's figures meet the target against direct's.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Verdict {
    p99_limit: Duration,
    p99_ok: bool,
    share: f64,
    share_ok: bool,
}

/// The target: p99 ≤ 1.2 × direct + 1 ms, throughput ≥ 80 % of direct.
fn verdict(direct_p99: Duration, direct_rate: f64, p99: Duration, rate: f64) -> Verdict {
    let p99_limit = direct_p99.mul_f64(P99_FACTOR) + P99_SLACK;
    let share = if direct_rate > 0.0 {
        rate / direct_rate
    } else {
        0.0
    };
    Verdict {
        p99_limit,
        p99_ok: p99 <= p99_limit,
        share,
        share_ok: share >= THROUGHPUT_SHARE,
    }
}

fn met(ok: bool) -> String {
    if ok {
        "met".into()
    } else {
        "**missed**".into()
    }
}

fn target_section(
    args: &Args,
    results: &BTreeMap<Key, Aggregate>,
    placement: Placement,
) -> Section {
    let mut table = Table::new(&[
        "op",
        "clients",
        "direct p50",
        "direct p99",
        "relay+proxy p50",
        "relay+proxy p99",
        "p99 limit (1.2 × direct + 1 ms)",
        "p99",
        "direct calls/s",
        "relay+proxy calls/s",
        "share of direct (≥ 80 %)",
        "throughput",
        "host CPU busy: direct / relay+proxy",
    ]);
    let (mut checks, mut passed) = (0, 0);
    for &op in &args.ops {
        for &clients in &args.concurrency {
            let (Some(d), Some(r)) = (
                results.get(&(op, clients, Way::Direct)),
                results.get(&(op, clients, Way::Relay)),
            ) else {
                continue;
            };
            let (ds, rs) = (
                summarize(&d.outcome.latencies),
                summarize(&r.outcome.latencies),
            );
            let v = verdict(ds.p99, d.rate(), rs.p99, r.rate());
            checks += 2;
            passed += usize::from(v.p99_ok) + usize::from(v.share_ok);
            table.row(vec![
                op.label().to_owned(),
                clients.to_string(),
                fmt_duration(ds.p50),
                fmt_duration(ds.p99),
                fmt_duration(rs.p50),
                fmt_duration(rs.p99),
                fmt_duration(v.p99_limit),
                met(v.p99_ok),
                format!("{:.0}", d.rate()),
                format!("{:.0}", r.rate()),
                format!("{:.0} %", v.share * 100.0),
                met(v.share_ok),
                format!(
                    "{:.0} % / {:.0} %",
                    d.host_busy_share() * 100.0,
                    r.host_busy_share() * 100.0
                ),
            ]);
        }
    }
    let (title, intro) = match placement {
        Placement::Shared => (
            "Target: relay + proxy against direct",
            "Every process may run on every CPU. ",
        ),
        Placement::Split => (
            "Target, with the operators on CPUs of their own",
            "The client and the store pinned to the first half of the CPUs, the relay and the \
             proxy to the other half (`sched_setaffinity`), as when the operators run on nodes \
             of their own: they add hops, but take no CPU from the store or the client. Direct \
             gets the same CPUs for the client and the store. ",
        ),
    };
    Section::new(title)
        .text(format!(
            "{intro}Issue 11, acceptance 7: p99 ≤ 1.2 × direct + 1 ms and throughput ≥ 80 % of \
             direct. {passed} of {checks} checks met. Latencies and rates over all rounds. With \
             one client the loop is closed, so its throughput is 1 / mean latency: 80 % of \
             direct means the path may add at most a quarter of the store's own mean latency. \
             Where host CPU is near 100 %, every process competes for the same CPUs (see the \
             tables below for the CPU each call costs in each process)."
        ))
        .table(table)
}

fn paths_section(
    args: &Args,
    results: &BTreeMap<Key, Aggregate>,
    placement: Placement,
    cpus: usize,
) -> Section {
    let mut table = Table::new(&[
        "op",
        "clients",
        "path",
        "calls",
        "errors",
        "calls/s (rounds)",
        "p50",
        "p90",
        "p99",
        "max",
        "host CPU busy",
        "CPU per call: client / relay / proxy / store",
    ]);
    for ((op, clients, way), agg) in results {
        let s = summarize(&agg.outcome.latencies);
        let rounds: Vec<String> = agg.round_rates.iter().map(|r| format!("{r:.0}")).collect();
        let cpu: Vec<String> = (0..4)
            .map(|i| match (i, way) {
                (1, Way::Direct | Way::ProxyPlaintext | Way::ProxyTls) | (2, Way::Direct) => {
                    "-".to_owned()
                }
                _ => fmt_duration(agg.cpu_per_call(i)),
            })
            .collect();
        table.row(vec![
            op.label().to_owned(),
            clients.to_string(),
            way.label().to_owned(),
            agg.calls().to_string(),
            agg.outcome.error_count().to_string(),
            format!("{:.0} ({})", agg.rate(), rounds.join(", ")),
            fmt_duration(s.p50),
            fmt_duration(s.p90),
            fmt_duration(s.p99),
            fmt_duration(s.max),
            format!("{:.0} %", agg.host_busy_share() * 100.0),
            cpu.join(" / "),
        ]);
    }
    let title = match placement {
        Placement::Shared => "Every path",
        Placement::Split => "Every path, with the operators on CPUs of their own",
    };
    Section::new(title)
        .text(format!(
            "All rounds together ({} × {} ms per row). CPU per call is the process's CPU time in \
             the windows over the calls answered (`-`: the process is not on the path). The \
             machine has {cpus} CPUs; other processes (the hub's control plane, anything else \
             running) count in host CPU busy. When it nears 100 %, throughput is bounded by \
             the CPU each call costs in all processes together, not by any one hop.",
            args.rounds, args.window_ms,
        ))
        .table(table)
}

/// p50 latency added by each hop, where every path was measured.
/// The floor: relay + proxy against two processes that do nothing but copy bytes.
fn floor_section(results: &BTreeMap<Key, Aggregate>, placement: Placement) -> Option<Section> {
    let mut table = Table::new(&[
        "op",
        "clients",
        "direct p50",
        "forwarders p50",
        "relay+proxy p50",
        "direct calls/s",
        "forwarders calls/s",
        "relay+proxy calls/s",
        "forwarders: share of direct",
        "relay+proxy: share of direct",
        "relay+proxy: share of the forwarders",
        "CPU per call of the two forwarders / of relay + proxy",
    ]);
    let mut keys: Vec<(Op, usize)> = results.keys().map(|(o, c, _)| (*o, *c)).collect();
    keys.dedup();
    for (op, clients) in keys {
        let get = |way| results.get(&(op, clients, way));
        let (Some(d), Some(f), Some(r)) = (get(Way::Direct), get(Way::Forwarders), get(Way::Relay))
        else {
            continue;
        };
        let p50 = |a: &Aggregate| fmt_duration(summarize(&a.outcome.latencies).p50);
        let share = |a: &Aggregate, of: &Aggregate| {
            if of.rate() > 0.0 {
                format!("{:.0} %", a.rate() / of.rate() * 100.0)
            } else {
                "-".to_owned()
            }
        };
        let hops = |a: &Aggregate| a.cpu_per_call(1) + a.cpu_per_call(2);
        table.row(vec![
            op.label().to_owned(),
            clients.to_string(),
            p50(d),
            p50(f),
            p50(r),
            format!("{:.0}", d.rate()),
            format!("{:.0}", f.rate()),
            format!("{:.0}", r.rate()),
            share(f, d),
            share(r, d),
            share(r, f),
            format!("{} / {}", fmt_duration(hops(f)), fmt_duration(hops(r))),
        ]);
    }
    if table.rows.is_empty() {
        return None;
    }
    let title = match placement {
        Placement::Shared => "Floor: two byte forwarders in place of relay + proxy",
        Placement::Split => "Floor, with the operators on CPUs of their own",
    };
    Some(
        Section::new(title)
            .text(
                "The same calls through two `kontinuum-bench forward` processes in a row, each \
                 copying bytes between two TCP connections on one thread: no gRPC, no TLS, no \
                 token, no authorization, so as little as a process on the path can do. Their \
                 share of direct is the most any design with two more processes on the path \
                 (DESIGN section 3: the relay beside the agent, the proxy in front of the store) \
                 can reach on this machine; where it is under 80 %, no relay and proxy can meet \
                 the throughput target here, however little they do per call.",
            )
            .table(table),
    )
}

fn hops_section(results: &BTreeMap<Key, Aggregate>) -> Option<Section> {
    let mut table = Table::new(&[
        "op",
        "clients",
        "direct p50",
        "+ proxy (authn, authz, one more gRPC hop)",
        "+ TLS",
        "+ relay (unix socket hop, signing)",
        "relay + proxy CPU per call",
        "store CPU per call (direct)",
        "whole-path CPU per call: direct / relay+proxy",
        "throughput share: CPU-bound estimate / measured",
    ]);
    let mut keys: Vec<(Op, usize)> = results.keys().map(|(o, c, _)| (*o, *c)).collect();
    keys.dedup();
    for (op, clients) in keys {
        let get = |way| results.get(&(op, clients, way));
        let (Some(d), Some(p), Some(t), Some(r)) = (
            get(Way::Direct),
            get(Way::ProxyPlaintext),
            get(Way::ProxyTls),
            get(Way::Relay),
        ) else {
            continue;
        };
        let p50 = |a: &Aggregate| summarize(&a.outcome.latencies).p50;
        let delta = |later: Duration, earlier: Duration| {
            if later >= earlier {
                format!("+{}", fmt_duration(later.saturating_sub(earlier)))
            } else {
                format!("−{}", fmt_duration(earlier.saturating_sub(later)))
            }
        };
        table.row(vec![
            op.label().to_owned(),
            clients.to_string(),
            fmt_duration(p50(d)),
            delta(p50(p), p50(d)),
            delta(p50(t), p50(p)),
            delta(p50(r), p50(t)),
            fmt_duration(r.cpu_per_call(1) + r.cpu_per_call(2)),
            fmt_duration(d.cpu_per_call(3)),
            format!(
                "{} / {}",
                fmt_duration(d.path_cpu_per_call()),
                fmt_duration(r.path_cpu_per_call())
            ),
            format!(
                "{} / {:.0} %",
                share(d.path_cpu_per_call(), r.path_cpu_per_call()),
                if d.rate() > 0.0 {
                    r.rate() / d.rate() * 100.0
                } else {
                    0.0
                }
            ),
        ]);
    }
    if table.rows.is_empty() {
        return None;
    }
    Some(
        Section::new("Where the time goes")
            .text(
                "Differences of p50 latency between consecutive paths: what the proxy adds over \
                 the store (verifying the token, authorizing the call, a second gRPC hop), what \
                 TLS adds on top, and what the relay adds on top of that (the unix socket hop, \
                 a second gRPC server, signing the token). At 16 clients the machine's CPUs are \
                 saturated, so these differences there are CPU per call, queued. The last two \
                 columns: CPU per call summed over every process on the path (client included); \
                 when the CPUs are saturated, throughput through the relay can be at most about \
                 direct's times the ratio of the two, whatever the latency of each hop.",
            )
            .table(table),
    )
}

fn errors_section(placement: Placement, results: &BTreeMap<Key, Aggregate>) -> Option<Section> {
    let mut table = Table::new(&["op", "clients", "path", "error", "count", "first message"]);
    for ((op, clients, way), agg) in results {
        for (code, (n, message)) in &agg.outcome.errors {
            table.row(vec![
                op.label().to_owned(),
                clients.to_string(),
                way.label().to_owned(),
                code.clone(),
                n.to_string(),
                message.clone(),
            ]);
        }
    }
    (!table.rows.is_empty())
        .then(|| Section::new(format!("Errors ({placement:?} CPUs)")).table(table))
}

/// Median time of one call of `f`, over batches.
fn time_per_call(mut f: impl FnMut()) -> Duration {
    let batches = 10;
    let per_batch = TOKEN_ITERATIONS / batches;
    let mut samples = Vec::new();
    for _ in 0..batches {
        let start = Instant::now();
        for _ in 0..per_batch {
            f();
        }
        samples.push(start.elapsed() / per_batch);
    }
    summarize(&samples).p50
}

/// What a token costs, measured in-process.
#[derive(Clone, Copy, Debug)]
struct TokenCost {
    sign: Duration,
    verify: Duration,
    cached: Duration,
    len: usize,
}

fn token_cost(signer: &Signer) -> TokenCost {
    let now = unix_now();
    let keys = vec![TrustedKey {
        key: signer.public_key(),
        not_before: now - 3600,
        not_after: now + 3600,
    }];
    let sign = time_per_call(|| {
        std::hint::black_box(signer.sign(unix_now(), etcd_proxy::relay::TOKEN_LIFETIME_SECS));
    });
    let token = signer.sign(now, etcd_proxy::relay::TOKEN_LIFETIME_SECS);
    let header = format!("Bearer {token}");
    let verify = time_per_call(|| {
        let verified = token::bearer(Some(header.as_bytes()))
            .and_then(|t| token::verify(t, unix_now(), |_| Some(keys.clone())));
        std::hint::black_box(verified.is_ok());
    });
    let cache = VerifiedTokens::new(4096);
    let cached = time_per_call(|| {
        let verified = token::bearer(Some(header.as_bytes()))
            .and_then(|t| cache.verify(t, unix_now(), |_| Some(keys.clone())));
        std::hint::black_box(verified.is_ok());
    });
    TokenCost {
        sign,
        verify,
        cached,
        len: token.len(),
    }
}

/// `part` as a percentage of `whole`.
fn share(part: Duration, whole: Duration) -> String {
    if whole.is_zero() {
        return "-".to_owned();
    }
    format!("{:.0} %", part.as_secs_f64() / whole.as_secs_f64() * 100.0)
}

fn token_section(cost: TokenCost, results: &BTreeMap<Key, Aggregate>) -> Section {
    let mut table = Table::new(&["step", "where", "time per call (median of 10 batches)"]);
    table
        .row(vec![
            "sign a token (`Signer::sign`: JSON, base64url, ed25519)".into(),
            "relay, once per second".into(),
            fmt_duration(cost.sign),
        ])
        .row(vec![
            "verify a token (`token::bearer` + `token::verify`: base64url, JSON, ed25519)".into(),
            "proxy, a token's first call".into(),
            fmt_duration(cost.verify),
        ])
        .row(vec![
            "verify a token seen before (`VerifiedTokens::verify`: lookup, keys and times \
             checked again)"
                .into(),
            "proxy, every other call".into(),
            fmt_duration(cost.cached),
        ]);
    let mut shares = Table::new(&[
        "op",
        "clients",
        "calls/s",
        "relay CPU per call",
        "of which signing",
        "proxy CPU per call",
        "of which verifying",
    ]);
    for ((op, clients, way), agg) in results {
        if *way != Way::Relay {
            continue;
        }
        let (relay, proxy) = (agg.cpu_per_call(1), agg.cpu_per_call(2));
        // One signature and one full verification per second; cached checks for the rest.
        let rate = agg.rate().max(1.0);
        let signing = cost.sign.div_f64(rate);
        let verifying = (cost.verify + cost.cached.mul_f64(rate - 1.0)).div_f64(rate);
        shares.row(vec![
            op.label().to_owned(),
            clients.to_string(),
            format!("{rate:.0}"),
            fmt_duration(relay),
            share(signing, relay),
            fmt_duration(proxy),
            share(verifying, proxy),
        ]);
    }
    let mut section = Section::new("Token cost")
        .text(format!(
            "The etcd-proxy library's own functions, {TOKEN_ITERATIONS} calls each on one thread \
             of this process. Token length: {} bytes, in one `authorization` header per call. \
             ed25519 signatures are deterministic and the claims change once a second, so the \
             relay signs the current second's token once and every call of that second carries \
             the same bytes (which HTTP/2 header compression can index); the proxy verifies a \
             token fully on its first call and answers its later calls from its cache of \
             verified tokens, which checks again on each call what can change (the zone's keys \
             and certificate validity, `exp`, `nbf`/`iat`). The benchmark's own proxy paths \
             make their tokens the same way.",
            cost.len
        ))
        .table(table);
    if !shares.rows.is_empty() {
        section = section
            .text(
                "Their share of what the relay and the proxy spend per call on the relay path \
                 (CPU per call from the table above; one signature and one full verification \
                 per second of calls):",
            )
            .table(shares);
    }
    section
}

/// What one `etcdctl check perf` printed.
struct CheckPerf {
    ok: bool,
    took: Duration,
    summary: Vec<String>,
}

/// The verdict lines of `check perf`'s output (its progress bar, redrawn with `\r` on
/// stderr, is dropped).
fn check_perf_summary(stdout: &str, stderr: &str) -> Vec<String> {
    let keep = |l: &&str| {
        let l = l.trim();
        !l.is_empty() && !l.contains(" p/s") && !l.contains("% ")
    };
    let mut lines: Vec<String> = stdout
        .split(['\r', '\n'])
        .filter(keep)
        .map(|l| l.trim().to_owned())
        .collect();
    let errors: Vec<String> = stderr
        .split(['\r', '\n'])
        .filter(keep)
        .map(|l| l.trim().to_owned())
        .collect();
    lines.extend(errors.into_iter().rev().take(5).rev());
    lines
}

async fn check_perf(
    tools: &Tools,
    endpoint: &str,
    load: &str,
    prefix: &str,
) -> anyhow::Result<CheckPerf> {
    let started = Instant::now();
    let child = tokio::process::Command::new(tools.path("etcdctl"))
        .arg(format!("--endpoints={endpoint}"))
        .args([
            "--dial-timeout=5s",
            "check",
            "perf",
            "--load",
            load,
            "--prefix",
            prefix,
        ])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .context("starting etcdctl check perf")?;
    let out = tokio::time::timeout(Duration::from_secs(300), child.wait_with_output())
        .await
        .context("etcdctl check perf did not finish within 5 minutes")??;
    Ok(CheckPerf {
        ok: out.status.success(),
        took: started.elapsed(),
        summary: check_perf_summary(
            &String::from_utf8_lossy(&out.stdout),
            &String::from_utf8_lossy(&out.stderr),
        ),
    })
}

/// `kontinuum_etcd_proxy_requests_total` (and the failure counters) from a `/metrics` text.
fn request_counters(metrics: &str) -> BTreeMap<String, f64> {
    metrics
        .lines()
        .filter(|l| {
            l.starts_with("kontinuum_etcd_proxy_requests_total{")
                || l.starts_with("kontinuum_etcd_proxy_authn_failures_total{")
                || l.starts_with("kontinuum_etcd_proxy_authz_failures_total{")
        })
        .filter_map(|l| {
            let (name, value) = l.rsplit_once(' ')?;
            Some((name.to_owned(), value.trim().parse().ok()?))
        })
        .collect()
}

async fn proxy_counters(admin: SocketAddr) -> BTreeMap<String, f64> {
    match tokio::time::timeout(
        Duration::from_secs(10),
        kontinuum_e2e::http_get(admin, "/metrics"),
    )
    .await
    {
        Ok(Some((200, body))) => request_counters(&body),
        _ => BTreeMap::new(),
    }
}

async fn check_perf_section(args: &Args, tools: &Tools, world: &World) -> anyhow::Result<Section> {
    let mut table = Table::new(&["path", "endpoint", "exit", "took", "summary"]);
    let prefix = format!("{}perf/", zone_prefix());
    let relay_endpoint = format!("unix://{}", world.relay_socket.display());
    let mut counted = BTreeMap::new();
    for (label, endpoint) in [
        (Way::Direct.label(), world.store_url.clone()),
        (Way::Relay.label(), relay_endpoint),
    ] {
        say(&format!(
            "etcdctl check perf --load {} through {label}",
            args.check_perf_load
        ));
        let before = proxy_counters(world.proxy_admin).await;
        let run = check_perf(tools, &endpoint, &args.check_perf_load, &prefix).await?;
        if label == Way::Relay.label() {
            let after = proxy_counters(world.proxy_admin).await;
            for (name, value) in after {
                let delta = value - before.get(&name).copied().unwrap_or(0.0);
                if delta > 0.0 {
                    counted.insert(name, delta);
                }
            }
        }
        table.row(vec![
            label.to_owned(),
            format!("`{endpoint}`"),
            if run.ok {
                "0".into()
            } else {
                "**failed**".into()
            },
            fmt_duration(run.took),
            run.summary.join("<br>"),
        ]);
    }
    let mut counters = Table::new(&["proxy counter during the relay run", "increase"]);
    for (name, delta) in &counted {
        counters.row(vec![format!("`{name}`"), format!("{delta:.0}")]);
    }
    Ok(Section::new("Cross-check: etcdctl check perf")
        .text(format!(
            "`etcdctl check perf --load {} --prefix {prefix}` (etcdctl of the test bed), once \
             against the store and once through the relay. Its workload `s`: 50 clients, puts \
             of 256-byte keys and 1 KiB values under the prefix, rate-limited to 150 writes/s \
             for 60 s; it passes when throughput is at least 90 % of that, the slowest request \
             under 500 ms and the standard deviation under 100 ms. It reads the prefix first \
             (must be empty) and deletes it at the end, all inside the zone's prefix, so the \
             proxy allows every call it makes; it uses no Compact or Maintenance call unless \
             asked (`--auto-compact`, `--auto-defrag`, which the proxy refuses or does not \
             serve). It measures a fixed, light load, so it checks that the path keeps up and \
             stays steady, not its headroom: the table above does that.",
            args.check_perf_load
        ))
        .table(table)
        .text("What the proxy answered during the run through the relay (its `/metrics`):")
        .table(counters))
}

fn processes_section(world: &World) -> Section {
    let mut table = Table::new(&[
        "process",
        "pid",
        "CPU time (whole run)",
        "VmRSS at end",
        "VmHWM (peak)",
        "threads",
    ]);
    let mut rows: Vec<(&str, u32)> = vec![
        ("etcd-proxy relay", world.relay.pid()),
        ("etcd-proxy serve (TLS)", world.proxy.pid()),
    ];
    if let Some((plain, _)) = &world.plain {
        rows.push(("etcd-proxy serve (plaintext)", plain.pid()));
    }
    rows.push(("etcd (the store)", world.store.pid()));
    rows.push(("kontinuum-bench (the clients)", std::process::id()));
    for (name, pid) in rows {
        let memory = procfs::memory(pid).unwrap_or_default();
        table.row(vec![
            name.to_owned(),
            pid.to_string(),
            fmt_duration(procfs::cpu_time(pid).unwrap_or_default()),
            fmt_kib(memory.rss_kib),
            fmt_kib(memory.hwm_kib),
            memory.threads.to_string(),
        ]);
    }
    Section::new("Processes")
        .text(
            "From `/proc/<pid>/status` and `/proc/<pid>/stat` at the end of the run (the \
             cross-check included). The proxy and relay figures are the operators' own cost, \
             apart from the store's.",
        )
        .table(table)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn the_target_is_p99_within_1_2x_plus_1ms_and_80_percent_of_throughput() {
        let v = verdict(ms(10), 1000.0, ms(13), 800.0);
        assert_eq!(v.p99_limit, ms(13));
        assert!(v.p99_ok && v.share_ok);
        let v = verdict(ms(10), 1000.0, Duration::from_micros(13_001), 799.0);
        assert!(!v.p99_ok && !v.share_ok);
        // A sub-millisecond store leaves a whole millisecond of slack.
        let v = verdict(
            Duration::from_micros(200),
            10.0,
            Duration::from_micros(1_240),
            9.0,
        );
        assert!(v.p99_ok);
        assert!(!verdict(ms(1), 0.0, ms(1), 1.0).share_ok);
    }

    #[test]
    fn split_gives_the_operators_the_upper_half_of_the_cpus() {
        assert_eq!(cpu_sets(Placement::Split, 2), (vec![0], vec![1]));
        assert_eq!(cpu_sets(Placement::Split, 3), (vec![0], vec![1, 2]));
        assert_eq!(cpu_sets(Placement::Split, 4), (vec![0, 1], vec![2, 3]));
        assert_eq!(cpu_sets(Placement::Split, 1), (vec![0], vec![0]));
        assert_eq!(cpu_sets(Placement::Shared, 2), (vec![0, 1], vec![0, 1]));
    }

    #[test]
    fn pinning_takes_effect_on_every_thread() {
        let me = std::process::id();
        // Read before pinning: a pinned thread sees only its own CPUs.
        let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
        let before = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0)).unwrap();
        pin(me, &[0]).unwrap();
        let pinned = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0)).unwrap();
        assert!(pinned.is_set(0).unwrap());
        for cpu in 1..cpus {
            assert!(!pinned.is_set(cpu).unwrap());
        }
        let all: Vec<usize> = (0..cpus).collect();
        pin(me, &all).unwrap();
        let restored = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0)).unwrap();
        for cpu in 0..cpus {
            assert_eq!(restored.is_set(cpu).unwrap(), before.is_set(cpu).unwrap());
        }
    }

    #[test]
    fn check_perf_output_keeps_the_verdicts_only() {
        let stdout = "PASS: Throughput is 150 writes/s\nPASS: Slowest request took 0.164925s\nPASS: Stddev is 0.010569s\nPASS\n";
        let stderr =
            "0 / 60 [___] 0.00% ? p/s\r1 / 60 [->__] 1.67% 2 p/s\r60 / 60 [----] 100.00% 1 p/s\n";
        assert_eq!(
            check_perf_summary(stdout, stderr),
            [
                "PASS: Throughput is 150 writes/s",
                "PASS: Slowest request took 0.164925s",
                "PASS: Stddev is 0.010569s",
                "PASS"
            ]
        );
        let failed = check_perf_summary("", "Error: etcdserver: permission denied\n");
        assert_eq!(failed, ["Error: etcdserver: permission denied"]);
    }

    #[test]
    fn request_counters_are_read_from_metrics() {
        let text = "# HELP x\nkontinuum_etcd_proxy_requests_total{method=\"Put\",code=\"OK\"} 7\n\
                    kontinuum_etcd_proxy_streams_in_flight{method=\"Watch\"} 1\n\
                    kontinuum_etcd_proxy_authz_failures_total{reason=\"Compact\"} 2\n";
        let counters = request_counters(text);
        assert_eq!(counters.len(), 2);
        assert!(
            (counters["kontinuum_etcd_proxy_requests_total{method=\"Put\",code=\"OK\"}"] - 7.0)
                .abs()
                < f64::EPSILON
        );
    }

    #[test]
    fn the_identity_secret_is_the_one_the_proxy_trusts() {
        let dir = kontinuum_testbed::unique_dir("bench-etcd-proxy-unit");
        let (pem, signer) = zone_identity(&dir, "bench-1a").unwrap();
        let secret = identity_secret("bench-1a", &pem);
        let identity = etcd_proxy::identity::ZoneIdentity::from_secret(&secret).unwrap();
        assert_eq!(identity.name, "bench-1a");
        assert_eq!(identity.scope.prefix(), zone_prefix().as_bytes());
        assert_eq!(identity.keys[0].key, signer.public_key());
        let token = signer.sign(unix_now(), 300);
        assert!(token::verify(&token, unix_now(), |_| Some(identity.keys.clone())).is_ok());
        let _ = std::fs::remove_dir_all(dir);
    }
}
