//! The hostlet: a test-bed node agent that acts as the kubelet of one node and runs the
//! pods bound to it as REAL host processes.
//!
//! The test bed has no container runtime: KWOK only pretends pods run. The hostlet
//! registers a Node (and keeps its Lease fresh), watches the pods bound to it, and for each
//! one: maps the container image to host files through an [`ImageMap`], builds the
//! environment as a kubelet does ([`env`]), materialises the volumes ([`volumes`]), starts
//! the process in a private mount namespace under the pod's user ([`container`]), probes
//! it ([`probe`]), restarts it by policy with a crash-loop back-off ([`backoff`]), and
//! reports the truth in the pod's status ([`status`]). Processes share the host's network
//! namespace; each pod gets the node's loopback address or one of its own ([`ipam`]).
//!
//! [`run`] is the whole agent; the `hostlet` binary wraps it.

pub mod backoff;
pub mod container;
pub mod env;
pub mod image_map;
pub mod ipam;
pub mod node;
mod pod;
pub mod probe;
pub mod status;
pub mod volumes;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::runtime::WatchStreamExt as _;
use kube::runtime::watcher;
use kube::{Client, Resource as _};

pub use image_map::ImageMap;

/// How long one API call may take before it is abandoned (and retried).
pub const API_TIMEOUT: Duration = Duration::from_secs(15);
/// How long the hostlet gives its pods to stop when it is itself stopped.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Errors of the hostlet.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A Kubernetes API call failed.
    #[error("{what}")]
    Kube {
        /// What we were doing.
        what: String,
        /// The cause.
        #[source]
        source: kube::Error,
    },
    /// A Kubernetes API call took longer than [`API_TIMEOUT`].
    #[error("{what}: timed out after {API_TIMEOUT:?}")]
    Timeout {
        /// What we were doing.
        what: String,
    },
    /// The image map could not be loaded.
    #[error("loading the image map")]
    ImageMap(#[from] image_map::ImageMapError),
    /// The configuration is invalid.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// A file operation failed.
    #[error("{what}")]
    Io {
        /// What we were doing.
        what: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The hostlet must run as root (mount namespaces, changing users).
    #[error("the hostlet must run as root")]
    NotRoot,
}

impl Error {
    /// A stable CamelCase reason.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Kube { .. } => "ApiError",
            Self::Timeout { .. } => "ApiTimeout",
            Self::ImageMap(e) => e.reason(),
            Self::Config(_) => "InvalidConfig",
            Self::Io { .. } => "IoError",
            Self::NotRoot => "NotRoot",
        }
    }

    /// Whether the API said the object does not exist.
    pub fn is_not_found(&self) -> bool {
        matches!(self, Self::Kube { source: kube::Error::Api(s), .. } if s.code == 404)
    }
}

/// What to do with a pod whose image is not in the image map.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Unmapped {
    /// Leave it Pending with the waiting reason `ImageNotMapped`.
    #[default]
    Refuse,
    /// Report it Running and Ready without running anything, as KWOK does.
    Pretend,
}

/// The hostlet's configuration.
#[derive(Clone, Debug)]
pub struct HostletConfig {
    /// The Node's name.
    pub node_name: String,
    /// The Node's InternalIP (a loopback address such as `127.20.0.1`).
    pub node_ip: Ipv4Addr,
    /// A range of per-pod loopback addresses; `None`: every pod uses `node_ip`.
    pub pod_cidr: Option<ipam::Cidr>,
    /// The image map.
    pub image_map: ImageMap,
    /// The hostlet's directory (pod logs under `pods/`).
    pub dir: PathBuf,
    /// What to do with unmapped images.
    pub unmapped: Unmapped,
    /// Extra Node labels.
    pub labels: BTreeMap<String, String>,
    /// Node taints: `(key, value, effect)`.
    pub taints: Vec<(String, String, String)>,
    /// The first crash-loop back-off (kubelet: 10 s).
    pub initial_backoff: Duration,
    /// The API server as pods should reach it (`KUBERNETES_SERVICE_HOST`, `..._PORT`).
    pub api_host: String,
    /// The API server's port.
    pub api_port: u16,
    /// Node capacity: CPU (a quantity).
    pub cpu: String,
    /// Node capacity: memory (a quantity).
    pub memory: String,
    /// Node capacity: pods.
    pub max_pods: u32,
}

impl HostletConfig {
    /// A configuration with the defaults: refuse unmapped images, 10 s back-off, no labels
    /// or taints, 16 CPUs, 64 GiB, 110 pods.
    pub fn new(
        node_name: impl Into<String>,
        node_ip: Ipv4Addr,
        image_map: ImageMap,
        dir: impl Into<PathBuf>,
        api_host: impl Into<String>,
        api_port: u16,
    ) -> Self {
        Self {
            node_name: node_name.into(),
            node_ip,
            pod_cidr: None,
            image_map,
            dir: dir.into(),
            unmapped: Unmapped::Refuse,
            labels: BTreeMap::new(),
            taints: Vec::new(),
            initial_backoff: backoff::INITIAL,
            api_host: api_host.into(),
            api_port,
            cpu: "16".into(),
            memory: "64Gi".into(),
            max_pods: 110,
        }
    }
}

/// What every pod worker shares.
pub(crate) struct Context {
    pub client: Client,
    pub config: HostletConfig,
    pub ipam: Mutex<ipam::Ipam>,
    pub ports: Mutex<ipam::Ports>,
    pub recorder: kube::runtime::events::Recorder,
    pub node_cpu_milli: i128,
    pub node_memory: i128,
}

/// Runs a Kubernetes call with [`API_TIMEOUT`].
pub(crate) mod api {
    use super::{API_TIMEOUT, Error};
    use k8s_openapi::NamespaceResourceScope;
    use kube::api::Api;
    use std::future::Future;

    /// Awaits `fut` for at most [`API_TIMEOUT`].
    pub async fn call<T>(
        what: impl Into<String>,
        fut: impl Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, Error> {
        match tokio::time::timeout(API_TIMEOUT, fut).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(source)) => Err(Error::Kube {
                what: what.into(),
                source,
            }),
            Err(_) => Err(Error::Timeout { what: what.into() }),
        }
    }

    /// GET of a namespaced object; `None` if it does not exist.
    pub async fn get_opt<K>(client: &kube::Client, ns: &str, name: &str) -> Result<Option<K>, Error>
    where
        K: kube::Resource<Scope = NamespaceResourceScope>
            + Clone
            + serde::de::DeserializeOwned
            + std::fmt::Debug,
        K::DynamicType: Default,
    {
        let api: Api<K> = Api::namespaced(client.clone(), ns);
        let kind = K::kind(&K::DynamicType::default()).into_owned();
        call(format!("reading {kind} {ns}/{name}"), api.get_opt(name)).await
    }
}

/// Runs the hostlet until `shutdown` completes: registers the node, calls `on_ready` once
/// it is registered and Ready, runs the pods bound to it, and on shutdown stops every pod
/// process (SIGTERM, SIGKILL after [`SHUTDOWN_GRACE`]).
pub async fn run(
    client: Client,
    config: HostletConfig,
    shutdown: impl Future<Output = ()>,
    on_ready: impl FnOnce(),
) -> Result<(), Error> {
    if !nix::unistd::geteuid().is_root() {
        return Err(Error::NotRoot);
    }
    let pods_dir = config.dir.join("pods");
    std::fs::create_dir_all(&pods_dir).map_err(|source| Error::Io {
        what: format!("creating {}", pods_dir.display()),
        source,
    })?;
    let node_cpu_milli = env::parse_quantity(&config.cpu)
        .map_err(|e| Error::Config(format!("cpu: {e}")))?
        / 1_000_000;
    let node_memory = env::parse_quantity(&config.memory)
        .map_err(|e| Error::Config(format!("memory: {e}")))?
        / 1_000_000_000;
    let recorder = kube::runtime::events::Recorder::new(
        client.clone(),
        kube::runtime::events::Reporter {
            controller: "hostlet".into(),
            instance: Some(config.node_name.clone()),
        },
    );
    let ctx = Arc::new(Context {
        client: client.clone(),
        ipam: Mutex::new(ipam::Ipam::new(config.node_ip, config.pod_cidr)),
        ports: Mutex::new(ipam::Ports::default()),
        recorder,
        node_cpu_milli,
        node_memory,
        config,
    });
    tokio::pin!(shutdown);
    let registration = node::register_until_done(&ctx.client, &ctx.config);
    tokio::select! {
        () = &mut shutdown => return Ok(()),
        () = registration => {}
    }
    on_ready();
    let heartbeat = tokio::spawn(node::heartbeat(ctx.client.clone(), ctx.config.clone()));
    let result = watch_pods(&ctx, shutdown).await;
    heartbeat.abort();
    result
}

struct Worker {
    tx: tokio::sync::watch::Sender<Option<Pod>>,
    task: tokio::task::JoinHandle<()>,
}

async fn watch_pods(ctx: &Arc<Context>, shutdown: impl Future<Output = ()>) -> Result<(), Error> {
    let pods: Api<Pod> = Api::all(ctx.client.clone());
    let selector = format!("spec.nodeName={}", ctx.config.node_name);
    let stream = watcher(pods, watcher::Config::default().fields(&selector)).default_backoff();
    tokio::pin!(stream);
    tokio::pin!(shutdown);
    let mut workers: HashMap<String, Worker> = HashMap::new();
    // Pods whose worker has finished (deleted by us): later events about them are stale.
    let mut finished: HashSet<String> = HashSet::new();
    let mut listed: Option<HashSet<String>> = None;
    loop {
        let event = tokio::select! {
            () = &mut shutdown => break,
            event = stream.next() => event,
        };
        let Some(event) = event else { break };
        workers.retain(|uid, w| {
            if w.task.is_finished() {
                finished.insert(uid.clone());
                false
            } else {
                true
            }
        });
        match event {
            Ok(watcher::Event::Init) => listed = Some(HashSet::new()),
            Ok(watcher::Event::InitApply(pod)) => {
                if let (Some(seen), Some(uid)) = (listed.as_mut(), pod.meta().uid.clone()) {
                    seen.insert(uid);
                }
                dispatch(ctx, &mut workers, &finished, pod);
            }
            Ok(watcher::Event::InitDone) => {
                if let Some(seen) = listed.take() {
                    for (uid, w) in &workers {
                        if !seen.contains(uid) {
                            w.tx.send_replace(None);
                        }
                    }
                }
            }
            Ok(watcher::Event::Apply(pod)) => dispatch(ctx, &mut workers, &finished, pod),
            Ok(watcher::Event::Delete(pod)) => {
                if let Some(w) = pod.meta().uid.as_ref().and_then(|u| workers.get(u)) {
                    w.tx.send_replace(None);
                }
            }
            Err(err) => {
                tracing::warn!(
                    error = &err as &dyn std::error::Error,
                    "pod watch failed; retrying"
                );
            }
        }
    }
    // Dropping the senders tells each worker the hostlet is stopping.
    let tasks: Vec<_> = workers.into_values().map(|w| w.task).collect();
    let all = futures::future::join_all(tasks);
    if tokio::time::timeout(SHUTDOWN_GRACE + Duration::from_secs(5), all)
        .await
        .is_err()
    {
        tracing::warn!("pods did not stop in time");
    }
    Ok(())
}

fn dispatch(
    ctx: &Arc<Context>,
    workers: &mut HashMap<String, Worker>,
    finished: &HashSet<String>,
    pod: Pod,
) {
    let Some(uid) = pod.meta().uid.clone() else {
        return;
    };
    if finished.contains(&uid) {
        return;
    }
    if let Some(w) = workers.get(&uid) {
        w.tx.send_replace(Some(pod));
        return;
    }
    let (tx, rx) = tokio::sync::watch::channel(Some(pod));
    let task = tokio::spawn(pod::run(ctx.clone(), rx));
    workers.insert(uid, Worker { tx, task });
}

/// The API server address from a kubeconfig's cluster URL (`https://host:port`).
pub fn api_address(server: &str) -> Result<(String, u16), Error> {
    let uri: http::Uri = server
        .parse()
        .map_err(|_| Error::Config(format!("invalid server URL {server}")))?;
    let host = uri
        .host()
        .ok_or_else(|| Error::Config(format!("no host in {server}")))?
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    let port = uri.port_u16().unwrap_or(443);
    Ok((host, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_api_address_comes_from_the_server_url() {
        assert_eq!(
            api_address("https://127.0.0.1:6443").unwrap(),
            ("127.0.0.1".to_string(), 6443)
        );
        assert_eq!(
            api_address("https://example.com").unwrap(),
            ("example.com".to_string(), 443)
        );
        assert!(api_address("::bad::").is_err());
    }
}
