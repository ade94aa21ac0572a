//! One real control plane per test binary with two hostlet nodes, started once on a thread
//! that outlives every test (the hostlets are its children), plus helpers.
#![allow(dead_code)]

use std::future::Future;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kontinuum_testbed::{
    ControlPlane, ControlPlaneConfig, HostletConfig, Tools, client_from, install_crypto_provider,
    unique_dir,
};
use kube::api::{Api, PostParams};
use kube::runtime::wait::await_condition;
use kube::{Client, ResourceExt as _};

/// Node A: one loopback address per pod (`--pod-cidr`), unmapped images refused, 1 s back-off.
pub const NODE_A: &str = "hostlet-a";
/// Node B: every pod on the node's IP, unmapped images pretended.
pub const NODE_B: &str = "hostlet-b";

/// The shared test bed.
pub struct Bed {
    /// Admin kubeconfig.
    pub kubeconfig_yaml: String,
    /// `https://address:port`.
    pub server: String,
    /// The control plane's directory.
    pub dir: PathBuf,
    /// Node A's IP and pod range.
    pub node_a_ip: Ipv4Addr,
    /// Node A's pod CIDR.
    pub pod_cidr_a: String,
    /// Node B's IP.
    pub node_b_ip: Ipv4Addr,
}

impl Bed {
    /// A client for the calling test's runtime.
    pub async fn client(&self) -> anyhow::Result<Client> {
        client_from(&self.kubeconfig_yaml)
            .await
            .context("building a client")
    }

    /// The log file of a container of a pod on a node.
    pub fn log(&self, node: &str, pod: &Pod, container: &str) -> PathBuf {
        self.dir
            .join("hostlets")
            .join(node)
            .join("pods")
            .join(format!(
                "{}_{}_{}/{container}.log",
                pod.namespace().unwrap_or_default(),
                pod.name_any(),
                pod.uid().unwrap_or_default()
            ))
    }
}

/// `target/<profile>/<name>`, built next to this test (as `e2e/src/lib.rs` finds binaries).
pub fn workspace_binary(name: &str) -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .context("locating the target directory")?;
    let path = dir.join(name);
    if !path.is_file() {
        bail!(
            "{} is not built; run `cargo build -p kontinuum-hostlet`",
            path.display()
        );
    }
    Ok(path)
}

/// The image map of the tests: host programs standing in for images.
pub const IMAGE_MAP: &str = "images:
  - image: test.kontinuum.sh/shell
    files:
      /bin/sh: /bin/sh
      /opt/kontinuum-hostlet-test/bin/hello: /bin/echo
    entrypoint: [/bin/sh]
";

/// The shared bed, started once.
pub fn bed() -> &'static Bed {
    static BED: OnceLock<Result<Bed, String>> = OnceLock::new();
    match BED.get_or_init(start) {
        Ok(bed) => bed,
        Err(e) => panic!("starting the test bed: {e}"),
    }
}

fn start() -> Result<Bed, String> {
    install_crypto_provider();
    let tools = Tools::locate().map_err(|e| format!("{e:#}"))?;
    let hostlet = workspace_binary("hostlet").map_err(|e| format!("{e:#}"))?;
    let dir = unique_dir("hostlet");
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let map = dir.join("image-map.yaml");
    std::fs::write(&map, IMAGE_MAP).map_err(|e| e.to_string())?;
    // Addresses of this process only, so concurrent test runs do not meet.
    let octet = u8::try_from(100 + std::process::id() % 100).unwrap_or(100);
    let node_a_ip = Ipv4Addr::new(127, octet, 1, 1);
    let pod_cidr_a = format!("127.{octet}.2.0/24");
    let node_b_ip = Ipv4Addr::new(127, octet, 3, 1);
    let mut a = HostletConfig::new(NODE_A, node_a_ip, &map, &hostlet);
    a.pod_cidr = Some(pod_cidr_a.clone());
    a.initial_backoff_seconds = Some(1);
    a.labels.push(("kontinuum.sh/test".into(), "a".into()));
    let mut b = HostletConfig::new(NODE_B, node_b_ip, &map, &hostlet);
    b.pretend_unmapped = true;
    b.initial_backoff_seconds = Some(1);
    let config = ControlPlaneConfig::new(&dir);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("hostlet-bed".into())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = tx.send(Err(e.to_string()));
                    return;
                }
            };
            runtime.block_on(async move {
                let started = async {
                    let mut cp = ControlPlane::start(&tools, config).await?;
                    cp.start_hostlet(&a).await?;
                    cp.start_hostlet(&b).await?;
                    Ok::<_, kontinuum_testbed::Error>(cp)
                };
                match Box::pin(started).await {
                    Ok(cp) => {
                        let _ = tx.send(Ok((
                            cp.kubeconfig_yaml().to_string(),
                            cp.server().to_string(),
                        )));
                        std::future::pending::<()>().await;
                        drop(cp);
                    }
                    Err(e) => {
                        let _ = tx.send(Err(kontinuum_testbed::error_chain(&e)));
                    }
                }
            });
        })
        .map_err(|e| e.to_string())?;
    let (kubeconfig_yaml, server) = rx.recv().map_err(|e| e.to_string())??;
    Ok(Bed {
        kubeconfig_yaml,
        server,
        dir,
        node_a_ip,
        pod_cidr_a,
        node_b_ip,
    })
}

/// A new namespace named `<prefix>-<pid>-<n>`.
pub async fn namespace(client: &Client, prefix: &str) -> anyhow::Result<String> {
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    let name = format!(
        "{prefix}-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    );
    let ns: Namespace =
        serde_json::from_value(serde_json::json!({ "metadata": { "name": name } }))?;
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .with_context(|| format!("creating namespace {name}"))?;
    Ok(name)
}

/// Runs `fut`, failing with a message naming `what` if it takes longer than `limit`.
pub async fn within<T>(
    limit: Duration,
    what: &str,
    fut: impl Future<Output = T>,
) -> anyhow::Result<T> {
    tokio::time::timeout(limit, fut)
        .await
        .map_err(|_| anyhow::anyhow!("timed out after {limit:?} waiting for {what}"))
}

/// Watches the pod until `check` holds; returns it.
pub async fn wait_pod(
    api: &Api<Pod>,
    name: &str,
    what: &str,
    limit: Duration,
    check: impl Fn(&Pod) -> bool,
) -> anyhow::Result<Pod> {
    let cond = move |p: Option<&Pod>| p.is_some_and(&check);
    within(limit, what, await_condition(api.clone(), name, cond))
        .await?
        .with_context(|| format!("watching pod {name}"))?
        .with_context(|| format!("pod {name} is gone"))
}

/// Polls a file until it contains `needle`; returns its text.
pub async fn wait_file(path: &Path, needle: &str, limit: Duration) -> anyhow::Result<String> {
    let deadline = Instant::now() + limit;
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if text.contains(needle) {
            return Ok(text);
        }
        if Instant::now() > deadline {
            bail!(
                "{} did not contain {needle:?} within {limit:?}; it holds:\n{text}",
                path.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The first container's status.
pub fn first_container(pod: &Pod) -> Option<&k8s_openapi::api::core::v1::ContainerStatus> {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|cs| cs.first())
}

/// Whether the pod's condition `type_` is True.
pub fn condition(pod: &Pod, type_: &str) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == type_ && c.status == "True"))
}

/// Phase Running, the first container running.
pub fn running(pod: &Pod) -> bool {
    pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
        && first_container(pod)
            .and_then(|c| c.state.as_ref())
            .is_some_and(|s| s.running.is_some())
}

/// The host pid of the first container (`hostlet://<pid>`).
pub fn pid_of(pod: &Pod) -> Option<i32> {
    first_container(pod)?
        .container_id
        .as_deref()?
        .strip_prefix("hostlet://")?
        .parse()
        .ok()
}

/// Whether a process exists (and is not a zombie).
pub fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        !s.rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z')
    })
}
