//! Shared helpers for Kontinuum's end-to-end tests, which run against the real test bed
//! (`kontinuum-testbed`): namespaces per test, CRD installation, fixture loading, waiting
//! for conditions (never sleeping in their place).

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use kube::runtime::wait::{await_condition, conditions};
use kube::{Client, ResourceExt as _};

pub use kontinuum_testbed as testbed;

pub mod addons;
pub mod api_proxy;
pub mod bootstrapper;
pub mod chaos;
pub mod chart;
pub mod zone;

/// Field manager of everything the tests apply.
pub const FIELD_MANAGER: &str = "kontinuum-e2e";

/// The shared control plane of this test binary and a client for the calling runtime.
pub async fn shared_client() -> anyhow::Result<(Client, &'static testbed::Shared)> {
    let shared = testbed::shared()
        .map_err(anyhow::Error::msg)
        .context("starting the test bed")?;
    let client = shared.client().await.context("building a client")?;
    Ok((client, shared))
}

/// `e2e/fixtures/<relative>`.
pub fn fixture(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(relative)
}

/// Parses a multi-document YAML fixture.
pub fn load_yaml<T: serde::de::DeserializeOwned>(relative: &str) -> anyhow::Result<Vec<T>> {
    let path = fixture(relative);
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    serde_saphyr::from_multiple(&text).with_context(|| format!("parsing {}", path.display()))
}

/// Creates a namespace with a unique name starting with `prefix`.
pub async fn namespace(client: &Client, prefix: &str) -> anyhow::Result<String> {
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    let name = format!(
        "{prefix}-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    );
    let ns: Namespace = serde_json::from_value(serde_json::json!({
        "metadata": { "name": name, "labels": { "kontinuum.sh/e2e": "true" } }
    }))?;
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .with_context(|| format!("creating namespace {name}"))?;
    Ok(name)
}

/// Applies CRDs (server-side) and waits until each is Established.
pub async fn install_crds(
    client: &Client,
    crds: &[CustomResourceDefinition],
) -> anyhow::Result<()> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let params = PatchParams::apply(FIELD_MANAGER).force();
    for crd in crds {
        let name = crd.name_any();
        api.patch(&name, &params, &Patch::Apply(crd))
            .await
            .with_context(|| format!("applying CRD {name}"))?;
    }
    for crd in crds {
        let name = crd.name_any();
        within(
            Duration::from_secs(30),
            &format!("CRD {name} Established"),
            await_condition(api.clone(), &name, conditions::is_crd_established()),
        )
        .await?
        .with_context(|| format!("watching CRD {name}"))?;
    }
    Ok(())
}

/// Installs every Kontinuum CRD.
pub async fn install_kontinuum_crds(
    client: &Client,
) -> anyhow::Result<Vec<CustomResourceDefinition>> {
    let crds = kontinuum_crds::all_crds();
    install_crds(client, &crds).await?;
    Ok(crds)
}

/// The API of a Kontinuum object's kind in `namespace`, resolved from our CRDs (so plurals
/// come from the same source as the cluster's).
pub fn dynamic_api(
    client: &Client,
    namespace: &str,
    obj: &DynamicObject,
) -> anyhow::Result<Api<DynamicObject>> {
    let types = obj
        .types
        .as_ref()
        .context("object has no apiVersion/kind")?;
    let (group, version) = types
        .api_version
        .split_once('/')
        .unwrap_or(("", &types.api_version));
    let gvk = GroupVersionKind::gvk(group, version, &types.kind);
    let plural = kontinuum_crds::all_crds()
        .into_iter()
        .find(|crd| crd.spec.group == group && crd.spec.names.kind == types.kind)
        .map(|crd| crd.spec.names.plural)
        .with_context(|| format!("no Kontinuum CRD for {}", types.kind))?;
    let resource = ApiResource::from_gvk_with_plural(&gvk, &plural);
    Ok(Api::namespaced_with(client.clone(), namespace, &resource))
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

/// Polls `check` (an API read) until it returns `Ok(true)`. For states no watch condition
/// expresses conveniently (e.g. "every one of these is gone"); each poll is a real read.
pub async fn eventually<F, Fut>(limit: Duration, what: &str, mut check: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<bool>>,
{
    let deadline = Instant::now() + limit;
    let mut last_err = None;
    loop {
        match check().await {
            Ok(true) => return Ok(()),
            Ok(false) => {}
            Err(e) => last_err = Some(e),
        }
        if Instant::now() > deadline {
            match last_err {
                Some(e) => {
                    bail!("timed out after {limit:?} waiting for {what} (last error: {e:#})")
                }
                None => bail!("timed out after {limit:?} waiting for {what}"),
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Runs the test bed's `kubectl` with the shared kubeconfig; returns stdout.
pub fn kubectl(shared: &testbed::Shared, args: &[&str]) -> anyhow::Result<String> {
    let out = std::process::Command::new(shared.tools.path("kubectl"))
        .arg("--kubeconfig")
        .arg(&shared.kubeconfig_path)
        .args(args)
        .output()
        .context("running kubectl")?;
    if !out.status.success() {
        bail!(
            "kubectl {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `kontinuum_<controller>_reconcile_total` of every controller in an operator's `/metrics`
/// text, by controller (`talos_bootstrapper`, `instance_reset`, ...).
pub fn reconcile_totals(metrics: &str) -> Vec<(String, u64)> {
    metrics
        .lines()
        .filter_map(|line| {
            let (name, value) = line.split_once(' ')?;
            let controller = name
                .strip_prefix("kontinuum_")?
                .strip_suffix("_reconcile_total")?;
            Some((controller.to_string(), value.trim().parse().ok()?))
        })
        .collect()
}

/// An operator binary running as a host process, killed when dropped. Its logs go to
/// `<dir>/<name>.log`.
pub struct Operator {
    child: tokio::process::Child,
    /// The admin server's address (`/healthz`, `/readyz`, `/metrics`).
    pub admin: std::net::SocketAddr,
    /// The log file.
    pub log: PathBuf,
    /// How it was started, for [`Operator::restart`].
    launch: Launch,
}

/// An operator's command line and the admin path that says it has started.
#[derive(Clone)]
struct Launch {
    bin: PathBuf,
    name: String,
    kubeconfig: PathBuf,
    args: Vec<String>,
    path: String,
}

impl Operator {
    /// Starts `bin` with `args` plus `--kubeconfig`, `--admin-addr` (a free loopback port)
    /// and plain-text info logs, and waits until its `/readyz` answers 200. Unless `args`
    /// say otherwise it runs without leader election (`--leader-elect=false`): one process
    /// per test namespace, restarted at once after a kill without waiting out a Lease.
    pub async fn start(
        bin: &Path,
        name: &str,
        kubeconfig: &Path,
        args: &[&str],
    ) -> anyhow::Result<Self> {
        Self::start_until(bin, name, kubeconfig, args, "/readyz").await
    }

    /// Like [`Operator::start`], but waits only until `path` (e.g. `/healthz`, for a replica
    /// that is not the leader and so never ready) answers 200.
    pub async fn start_until(
        bin: &Path,
        name: &str,
        kubeconfig: &Path,
        args: &[&str],
        path: &str,
    ) -> anyhow::Result<Self> {
        Self::launch(Launch {
            bin: bin.to_path_buf(),
            name: name.to_owned(),
            kubeconfig: kubeconfig.to_path_buf(),
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            path: path.to_owned(),
        })
        .await
    }

    /// Kills the process (SIGKILL, as a crash would) unless it has exited already, and
    /// starts it again with the same command line, on a new admin port and log file,
    /// waiting as [`Operator::start_until`] does.
    pub async fn restart(&mut self) -> anyhow::Result<()> {
        if self.child.try_wait()?.is_none() {
            self.kill().await?;
        }
        *self = Self::launch(self.launch.clone()).await?;
        Ok(())
    }

    /// The operator's name, as given to [`Operator::start`].
    pub fn name(&self) -> &str {
        &self.launch.name
    }

    async fn launch(launch: Launch) -> anyhow::Result<Self> {
        let Launch {
            bin,
            name,
            kubeconfig,
            args,
            path,
        } = &launch;
        let (bin, name, path) = (bin.as_path(), name.as_str(), path.as_str());
        let port = testbed::free_port(std::net::IpAddr::from([127, 0, 0, 1]))?;
        let admin = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        let dir = testbed::base_dir().join("operators");
        std::fs::create_dir_all(&dir)?;
        let log = dir.join(format!("{name}-{}-{port}.log", std::process::id()));
        let file = std::fs::File::create(&log)?;
        let child = tokio::process::Command::new(bin)
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .arg("--admin-addr")
            .arg(admin.to_string())
            .args(["--log-format", "text", "--log-level", "info"])
            .args(
                (!args.iter().any(|a| a.starts_with("--leader-elect")))
                    .then_some("--leader-elect=false"),
            )
            .args(args)
            .stdout(file.try_clone()?)
            .stderr(file)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let mut operator = Self {
            child,
            admin,
            log,
            launch: launch.clone(),
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while http_get(admin, path).await.map(|(code, _)| code) != Some(200) {
            if let Some(status) = operator.child.try_wait()? {
                bail!(
                    "{name} exited ({status}); log: {}",
                    std::fs::read_to_string(&operator.log)?
                );
            }
            if Instant::now() > deadline {
                bail!(
                    "{name} did not become ready; log: {}",
                    operator.log.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(operator)
    }

    /// The process id.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Whether `/readyz` answers 200 now.
    pub async fn is_ready(&self) -> bool {
        http_get(self.admin, "/readyz")
            .await
            .is_some_and(|(code, _)| code == 200)
    }

    /// Kills the process (SIGKILL, as a crash would) and waits for it.
    pub async fn kill(&mut self) -> anyhow::Result<()> {
        self.child.kill().await?;
        Ok(())
    }

    /// Fetches `/metrics`.
    pub async fn metrics(&self) -> anyhow::Result<String> {
        http_get(self.admin, "/metrics")
            .await
            .map(|(_, body)| body)
            .context("fetching /metrics")
    }
}

/// A plain HTTP/1.0 GET on loopback: `(status code, body)`, or `None` if nothing answers.
pub async fn http_get(addr: std::net::SocketAddr, path: &str) -> Option<(u16, String)> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    let request = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await.ok()?;
    let code = response.split_whitespace().nth(1)?.parse().ok()?;
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Some((code, body))
}

/// Creates ServiceAccount `name` in `namespace`, binds it to ClusterRole `cluster_role`,
/// and writes a kubeconfig that authenticates as it (a TokenRequest token), so that an
/// operator under test runs with its own identity and permissions, not the admin's.
pub async fn service_account_kubeconfig(
    client: &Client,
    shared: &testbed::Shared,
    namespace: &str,
    name: &str,
    cluster_role: &str,
) -> anyhow::Result<PathBuf> {
    service_account_kubeconfig_for(
        client,
        &shared.kubeconfig_yaml,
        &shared.dir,
        namespace,
        name,
        cluster_role,
    )
    .await
}

/// [`service_account_kubeconfig`] for any control plane: `admin_kubeconfig` gives the
/// server and CA, the file goes to `dir`.
pub async fn service_account_kubeconfig_for(
    client: &Client,
    admin_kubeconfig: &str,
    dir: &Path,
    namespace: &str,
    name: &str,
    cluster_role: &str,
) -> anyhow::Result<PathBuf> {
    use k8s_openapi::api::core::v1::ServiceAccount;
    use k8s_openapi::api::rbac::v1::ClusterRoleBinding;

    let sa: ServiceAccount =
        serde_json::from_value(serde_json::json!({ "metadata": { "name": name } }))?;
    Api::<ServiceAccount>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &sa)
        .await
        .context("creating the ServiceAccount")?;
    let binding: ClusterRoleBinding = serde_json::from_value(serde_json::json!({
        "metadata": { "name": format!("{namespace}-{name}") },
        "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": cluster_role },
        "subjects": [{ "kind": "ServiceAccount", "name": name, "namespace": namespace }]
    }))?;
    Api::<ClusterRoleBinding>::all(client.clone())
        .create(&PostParams::default(), &binding)
        .await
        .context("binding the ServiceAccount")?;
    chart::token_kubeconfig(client, admin_kubeconfig, dir, namespace, name).await
}

/// The user name of a ServiceAccount, as the API server (and its audit log) knows it.
pub fn service_account_user(namespace: &str, name: &str) -> String {
    format!("system:serviceaccount:{namespace}:{name}")
}

/// The verbs that change something.
pub const WRITE_VERBS: [&str; 5] = ["create", "update", "patch", "delete", "deletecollection"];

/// One request from the API server's audit log (which records writes, and every request
/// for Secrets).
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AuditEvent {
    /// The verb (create, update, patch, delete, ...).
    pub verb: String,
    /// The request URI.
    pub request_u_r_i: String,
    /// Who made it.
    pub user: AuditUser,
    /// When the API server received it (RFC 3339).
    pub request_received_timestamp: String,
    /// The response code.
    #[serde(default)]
    pub response_status: Option<AuditStatus>,
}

/// The user of an audit event.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct AuditUser {
    /// User name.
    pub username: String,
}

/// The response of an audit event.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct AuditStatus {
    /// HTTP status code.
    #[serde(default)]
    pub code: Option<u16>,
}

impl AuditEvent {
    /// Whether the request changes something.
    pub fn is_write(&self) -> bool {
        WRITE_VERBS.contains(&self.verb.as_str())
    }
}

/// The write requests `user` made, as recorded in the audit log at `path`.
pub fn audit_writes(path: &Path, user: &str) -> anyhow::Result<Vec<AuditEvent>> {
    Ok(audit_requests(path, user)?
        .into_iter()
        .filter(AuditEvent::is_write)
        .collect())
}

/// Every request of `user` the audit log at `path` recorded: its writes, and its requests
/// for Secrets (reads included).
pub fn audit_requests(path: &Path, user: &str) -> anyhow::Result<Vec<AuditEvent>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(text
        .lines()
        .filter_map(|line| serde_json::from_str::<AuditEvent>(line).ok())
        .filter(|e| e.user.username == user)
        .collect())
}

/// The Secret requests among `events`: `(verb, name or None for a list/watch, query)`.
pub fn secret_requests(events: &[AuditEvent]) -> Vec<(String, Option<String>, String)> {
    events
        .iter()
        .filter_map(|e| {
            let (path, query) = e
                .request_u_r_i
                .split_once('?')
                .unwrap_or((e.request_u_r_i.as_str(), ""));
            let (_, rest) = path.split_once("/secrets")?;
            if !(path.starts_with("/api/v1/")) || !(rest.is_empty() || rest.starts_with('/')) {
                return None;
            }
            let name = rest.strip_prefix('/').map(str::to_owned);
            Some((e.verb.clone(), name, query.to_owned()))
        })
        .collect()
}

/// A binary of this workspace, built next to the running test (`cargo test --workspace`
/// builds every package's binaries before running any test).
pub fn workspace_binary(name: &str) -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    // target/<profile>/deps/<test>-<hash> -> target/<profile>/<name>
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .context("locating the target directory")?;
    let path = dir.join(name);
    if !path.is_file() {
        bail!(
            "{} is not built; run `cargo build -p {name}` (or `make test`)",
            path.display()
        );
    }
    Ok(path)
}

/// ClusterRole holding the rules the chart (`charts/kontinuum`) gives instance-discovery;
/// tests bind their ServiceAccounts to it, so the operator runs with exactly those
/// permissions, not as admin. See [`chart::apply_operator_cluster_roles`].
pub const INSTANCE_DISCOVERY_ROLE: &str = "kontinuum-instance-discovery-e2e";
/// ClusterRole holding the rules the chart gives pool-claimer.
pub const POOL_CLAIMER_ROLE: &str = "kontinuum-pool-claimer-e2e";

/// Creates (or updates) [`INSTANCE_DISCOVERY_ROLE`] and [`POOL_CLAIMER_ROLE`] from the
/// chart's rendered RBAC (`helm template`).
pub async fn install_operator_roles(client: &Client) -> anyhow::Result<()> {
    chart::apply_operator_cluster_roles(
        client,
        &[
            ("instance-discovery", INSTANCE_DISCOVERY_ROLE),
            ("pool-claimer", POOL_CLAIMER_ROLE),
        ],
    )
    .await
}
