//! Test support for the addon-installer: the fixture chart repository (the charts of
//! `e2e/fixtures/charts/`, packaged with the real helm and served over HTTP from the test
//! process), the addon-installer as a process with the chart mirror pointed at it, its
//! RBAC, downstream clusters, and the hub objects the talos-bootstrapper would write
//! (a TalosCluster with its kubeconfig Secret, built-in Addons).

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU8, Ordering};

use anyhow::{Context as _, bail};
use k8s_openapi::api::core::v1::Secret;
use kontinuum_crds::v1alpha2::{Addon, TalosCluster};
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::task::JoinHandle;

use crate::Operator;
use crate::testbed::{ControlPlane, ControlPlaneConfig, Tools};

/// The fixture charts, by directory name under `e2e/fixtures/charts/`.
pub const FIXTURE_CHARTS: [&str; 3] = ["gateway-api-crds", "cilium", "cert-manager"];

/// ClusterRole holding the rules the chart (`charts/kontinuum`) gives the addon-installer
/// (tests run it with exactly these).
pub const ADDON_INSTALLER_ROLE: &str = "kontinuum-addon-installer-e2e";

/// A Helm chart repository serving the packaged fixture charts over HTTP on loopback.
/// The server stops when this is dropped.
pub struct ChartRepo {
    /// The repository URL (`http://127.0.0.1:<port>`), for `--chart-mirror`.
    pub url: String,
    /// Where the packages and `index.yaml` are.
    pub dir: PathBuf,
    server: JoinHandle<()>,
}

impl Drop for ChartRepo {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl ChartRepo {
    /// Packages every fixture chart with the test bed's helm (`helm package`, `helm repo
    /// index`) into a fresh directory and serves it.
    pub async fn serve(tools: &Tools) -> anyhow::Result<Self> {
        let dir = crate::testbed::unique_dir("charts");
        std::fs::create_dir_all(&dir)?;
        let helm = tools.path("helm");
        for chart in FIXTURE_CHARTS {
            run_helm(
                &helm,
                &dir,
                &[
                    "package",
                    &crate::fixture(&format!("charts/{chart}")).to_string_lossy(),
                    "--destination",
                    &dir.to_string_lossy(),
                ],
            )
            .await?;
        }
        run_helm(&helm, &dir, &["repo", "index", &dir.to_string_lossy()]).await?;
        let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
            .await
            .context("binding the chart repository")?;
        let url = format!("http://{}", listener.local_addr()?);
        let root = dir.clone();
        let server = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let root = root.clone();
                tokio::spawn(async move {
                    let _ = serve_file(stream, &root).await;
                });
            }
        });
        Ok(Self { url, dir, server })
    }
}

async fn run_helm(helm: &Path, home: &Path, args: &[&str]) -> anyhow::Result<()> {
    let helm_home = home.join(".helm");
    let out = tokio::time::timeout(
        std::time::Duration::from_secs(60),
        tokio::process::Command::new(helm)
            .args(args)
            .env("HELM_CACHE_HOME", helm_home.join("cache"))
            .env("HELM_CONFIG_HOME", helm_home.join("config"))
            .env("HELM_DATA_HOME", helm_home.join("data"))
            .kill_on_drop(true)
            .output(),
    )
    .await
    .context("helm timed out")??;
    if !out.status.success() {
        bail!(
            "helm {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// Answers one GET with a file of `root` (HTTP/1.1, `Connection: close`).
async fn serve_file(mut stream: tokio::net::TcpStream, root: &Path) -> std::io::Result<()> {
    let mut request = Vec::new();
    let mut buf = [0u8; 1024];
    while !request.windows(4).any(|w| w == b"\r\n\r\n") && request.len() < 16 * 1024 {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        request.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&request);
    let path = text
        .lines()
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap_or("/");
    let name = path.trim_start_matches('/').split('?').next().unwrap_or("");
    let file = (!name.is_empty() && !name.contains("..") && !name.contains('/'))
        .then(|| root.join(name))
        .filter(|p| p.is_file());
    match file {
        Some(file) => {
            let body = tokio::fs::read(&file).await?;
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nContent-Type: application/octet-stream\r\nConnection: close\r\n\r\n",
                body.len()
            );
            stream.write_all(head.as_bytes()).await?;
            stream.write_all(&body).await?;
        }
        None => {
            stream
                .write_all(
                    b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                )
                .await?;
        }
    }
    stream.shutdown().await
}

/// Creates (or updates) [`ADDON_INSTALLER_ROLE`] from the chart's rendered RBAC (`helm
/// template`): Addons, their status; TalosClusters (read); Secrets (read: the kubeconfigs);
/// Events; its Lease.
pub async fn install_addon_installer_role(client: &Client) -> anyhow::Result<()> {
    crate::chart::apply_operator_cluster_roles(client, &[("addon-installer", ADDON_INSTALLER_ROLE)])
        .await
}

/// Starts the addon-installer (`bin`) watching `namespace`, with the test bed's helm (unless
/// `extra` names another `--helm`), its own helm home, and `--chart-mirror` set to `mirror`
/// (a [`ChartRepo`] URL); `extra` args come last (e.g. `--resync-interval 2s`).
pub async fn start_addon_installer(
    bin: &Path,
    kubeconfig: &Path,
    namespace: &str,
    mirror: &str,
    extra: &[&str],
) -> anyhow::Result<Operator> {
    let tools = Tools::locate().map_err(|e| anyhow::anyhow!("{e}"))?;
    let helm = tools.path("helm").to_string_lossy().into_owned();
    let home = crate::testbed::unique_dir("helm-home")
        .to_string_lossy()
        .into_owned();
    let mut args = vec![
        "--namespace",
        namespace,
        "--helm-home",
        &home,
        "--chart-mirror",
        mirror,
    ];
    if !extra.contains(&"--helm") {
        args.extend(["--helm", &helm]);
    }
    args.extend_from_slice(extra);
    Operator::start(bin, "addon-installer", kubeconfig, &args).await
}

/// Starts the workspace's addon-installer for `namespace` as the chart runs it: its
/// ClusterRole installed, a service account of `namespace` bound to it, and
/// [`start_addon_installer`] with that account's kubeconfig.
pub async fn start_addon_installer_with_role(
    client: &Client,
    shared: &crate::testbed::Shared,
    namespace: &str,
    mirror: &str,
    extra: &[&str],
) -> anyhow::Result<Operator> {
    install_addon_installer_role(client).await?;
    let kubeconfig = crate::service_account_kubeconfig(
        client,
        shared,
        namespace,
        "addon-installer",
        ADDON_INSTALLER_ROLE,
    )
    .await?;
    let bin = crate::workspace_binary("addon-installer")?;
    start_addon_installer(&bin, &kubeconfig, namespace, mirror, extra).await
}

/// Starts a downstream cluster (a real control plane with one KWOK node) on its own
/// loopback address `127.70.<pid>.<n>`, as a zone cluster would be.
pub async fn downstream_cluster(tools: &Tools, prefix: &str) -> anyhow::Result<ControlPlane> {
    static NEXT: AtomicU8 = AtomicU8::new(1);
    let host = NEXT.fetch_add(1, Ordering::Relaxed);
    let net = u8::try_from(std::process::id() % 250).unwrap_or(0);
    let mut config = ControlPlaneConfig::new(crate::testbed::unique_dir(prefix));
    config.address = IpAddr::from([127, 70, net, host]);
    ControlPlane::start(tools, config).await.map_err(|e| {
        anyhow::anyhow!(
            "starting the downstream cluster: {}",
            crate::testbed::error_chain(&e)
        )
    })
}

/// What the talos-bootstrapper writes once a cluster's kubeconfig is stored: TalosCluster
/// `name` (control-plane pool `<name>-cp`) with `status.secretRef` and
/// `status.controlPlane.replicas`, and the Secret `<name>-talos` holding `kubeconfig`.
pub async fn seed_cluster(
    client: &Client,
    namespace: &str,
    name: &str,
    kubeconfig_yaml: &str,
    replicas: i32,
) -> anyhow::Result<()> {
    let secret_name = format!("{name}-talos");
    let secret: Secret = serde_json::from_value(serde_json::json!({
        "metadata": {
            "name": secret_name,
            // What the bootstrapper's kubeconfig Secrets carry, and the addon-installer's
            // Secret watch selects on.
            "labels": {
                kontinuum_crds::labels::APP_COMPONENT:
                    kontinuum_crds::v1alpha2::KUBECONFIG_SECRET_COMPONENT,
            },
        },
        "stringData": { kontinuum_crds::v1alpha2::KUBECONFIG_KEY: kubeconfig_yaml }
    }))?;
    Api::<Secret>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &secret)
        .await
        .context("creating the kubeconfig Secret")?;
    let clusters: Api<TalosCluster> = Api::namespaced(client.clone(), namespace);
    let cluster: TalosCluster = serde_json::from_value(serde_json::json!({
        "apiVersion": "kontinuum.sh/v1alpha2", "kind": "TalosCluster",
        "metadata": { "name": name },
        "spec": { "controlPlane": { "poolRef": { "name": format!("{name}-cp") } } }
    }))?;
    clusters
        .create(&PostParams::default(), &cluster)
        .await
        .context("creating the TalosCluster")?;
    let status = serde_json::json!({
        "status": {
            "secretRef": { "name": secret_name },
            "controlPlane": { "replicas": replicas, "readyReplicas": 0 }
        }
    });
    clusters
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .context("writing the TalosCluster status")?;
    Ok(())
}

/// Seeds built-in Addon `<cluster>-<release>` the way the talos-bootstrapper does: only
/// `spec.talosClusterRef` and `spec.releaseName`; everything else comes from the defaults.
pub async fn seed_builtin(
    client: &Client,
    namespace: &str,
    cluster: &str,
    release: &str,
) -> anyhow::Result<String> {
    let name = kontinuum_crds::names::builtin_addon_name(cluster, release)
        .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    let addon: Addon = serde_json::from_value(serde_json::json!({
        "apiVersion": "kontinuum.sh/v1alpha2", "kind": "Addon",
        "metadata": { "name": name },
        "spec": { "talosClusterRef": { "name": cluster }, "releaseName": release }
    }))?;
    Api::<Addon>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &addon)
        .await
        .with_context(|| format!("creating Addon {name}"))?;
    Ok(name)
}

/// The `Ready` condition of an Addon: `(status, reason, message)`.
pub async fn addon_ready(
    client: &Client,
    namespace: &str,
    name: &str,
) -> anyhow::Result<Option<(String, String, String)>> {
    let addon = Api::<Addon>::namespaced(client.clone(), namespace)
        .get(name)
        .await?;
    Ok(addon.status.and_then(|s| {
        kontinuum_crds::conditions::get(&s.conditions, "Ready")
            .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
    }))
}

/// `kontinuum_addon_installer_reconcile_total` from the operator's `/metrics` text.
pub fn reconciles(metrics: &str) -> u64 {
    metrics
        .lines()
        .find(|l| l.starts_with("kontinuum_addon_installer_reconcile_total"))
        .and_then(|l| l.split_whitespace().last())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// `kontinuum_addon_installer_tracked_objects{map}` from the operator's `/metrics` text.
pub fn tracked_objects(metrics: &str, map: &str) -> Option<u64> {
    let prefix = format!("kontinuum_addon_installer_tracked_objects{{map=\"{map}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|n| n.trim().parse().ok())
}

/// The name of the fixture cilium agent pod (namespace `kube-system`) of a zone cluster.
pub async fn agent_pod(down: &Client) -> anyhow::Result<String> {
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(down.clone(), "kube-system");
    pods.list(&kube::api::ListParams::default().labels("app.kubernetes.io/name=cilium-agent"))
        .await?
        .items
        .first()
        .map(kube::ResourceExt::name_any)
        .context("no cilium agent pod")
}

/// Sets the readiness of the fixture cilium agent pod `pod` (namespace `kube-system`) in its
/// status, as a kubelet would report it: `Ready`, `ContainersReady` and the `cilium-agent`
/// container status.
pub async fn set_agent_pod_ready(down: &Client, pod: &str, ready: bool) -> anyhow::Result<()> {
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(down.clone(), "kube-system");
    let status = if ready { "True" } else { "False" };
    let patch = serde_json::json!({
        "status": {
            "conditions": [
                { "type": "Ready", "status": status },
                { "type": "ContainersReady", "status": status }
            ],
            "containerStatuses": [{
                "name": "cilium-agent", "ready": ready, "image": "quay.io/cilium/cilium:v1.20.1",
                "imageID": "", "restartCount": 0,
                "state": { "running": { "startedAt": "2026-01-01T00:00:00Z" } }
            }]
        }
    });
    pods.patch_status(pod, &PatchParams::default(), &Patch::Strategic(&patch))
        .await
        .with_context(|| format!("setting pod {pod} ready={ready}"))?;
    Ok(())
}
