//! The hub chart (`charts/kontinuum`) in tests: rendered by the test bed's real helm
//! (`helm template`), and its RBAC applied to the test bed, so that operators run as host
//! processes with exactly the permissions the chart gives them (one source of truth).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use anyhow::{Context as _, bail};
use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule};
use kube::Client;
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use serde_json::Value;

use crate::FIELD_MANAGER;
use crate::testbed::Tools;

/// The label naming the operator (its binary) an object belongs to.
pub const COMPONENT: &str = "app.kubernetes.io/component";

/// The binaries the chart deploys, in the order of their values keys.
pub const OPERATORS: [&str; 7] = [
    "addon-installer",
    "etcd-proxy",
    "instance-discovery",
    "pool-claimer",
    "registry",
    "talos-bootstrapper",
    "zone-installer",
];

/// The operators whose rules apply in the watched namespace(s) (a ClusterRole, or a Role in
/// `watchNamespace`); etcd-proxy's are confined to the identity namespace and the
/// registry's to the release namespace.
pub const WATCHING_OPERATORS: [&str; 5] = [
    "addon-installer",
    "instance-discovery",
    "pool-claimer",
    "talos-bootstrapper",
    "zone-installer",
];

/// The store's component label (`app.kubernetes.io/component`).
pub const STORE: &str = "store";

/// The chart's directory in the workspace.
pub fn chart_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/kontinuum")
}

/// The values key of an operator: its binary's name in camelCase (`pool-claimer` →
/// `poolClaimer`), as in `operators.poolClaimer.replicas`.
pub fn values_key(binary: &str) -> String {
    let mut out = String::with_capacity(binary.len());
    let mut upper = false;
    for c in binary.chars() {
        if c == '-' {
            upper = true;
        } else if upper {
            out.extend(c.to_uppercase());
            upper = false;
        } else {
            out.push(c);
        }
    }
    out
}

/// Runs the test bed's helm with `args` (its cache, config and data in a fresh directory,
/// so nothing of the user's helm setup leaks in) and returns what it printed.
pub fn helm(tools: &Tools, args: &[&str]) -> anyhow::Result<Output> {
    let home = crate::testbed::unique_dir("chart-helm");
    std::process::Command::new(tools.path("helm"))
        .args(args)
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"))
        .output()
        .with_context(|| format!("running helm {args:?}"))
}

/// `helm template <release> charts/kontinuum --namespace <namespace>` with `--set key=value`
/// for each of `set` and `extra` arguments; the raw result, for tests of failures.
pub fn template(
    tools: &Tools,
    release: &str,
    namespace: &str,
    set: &[(&str, &str)],
    extra: &[&str],
) -> anyhow::Result<Output> {
    let chart = chart_dir();
    let chart = chart.to_string_lossy();
    let sets: Vec<String> = set.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let mut args = vec!["template", release, &chart, "--namespace", namespace];
    for s in &sets {
        args.extend(["--set", s.as_str()]);
    }
    args.extend_from_slice(extra);
    helm(tools, &args)
}

/// The manifests `helm template` renders for `release` in `namespace` with `--set` values
/// `set`, one JSON value per YAML document (empty documents left out).
pub fn render(
    tools: &Tools,
    release: &str,
    namespace: &str,
    set: &[(&str, &str)],
) -> anyhow::Result<Vec<Value>> {
    let out = template(tools, release, namespace, set, &[])?;
    if !out.status.success() {
        bail!(
            "helm template failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    parse_documents(&String::from_utf8_lossy(&out.stdout))
}

/// Parses a multi-document YAML stream, leaving out empty documents.
pub fn parse_documents(yaml: &str) -> anyhow::Result<Vec<Value>> {
    let docs: Vec<Value> =
        serde_saphyr::from_multiple(yaml).context("parsing the rendered manifests")?;
    Ok(docs.into_iter().filter(|d| !d.is_null()).collect())
}

/// `kind` of a rendered object.
pub fn kind(doc: &Value) -> &str {
    doc["kind"].as_str().unwrap_or_default()
}

/// `metadata.name` of a rendered object.
pub fn name(doc: &Value) -> &str {
    doc["metadata"]["name"].as_str().unwrap_or_default()
}

/// `metadata.namespace` of a rendered object (None for cluster-scoped ones).
pub fn object_namespace(doc: &Value) -> Option<&str> {
    doc["metadata"]["namespace"].as_str()
}

/// The operator (binary) a rendered object belongs to, from its component label.
pub fn component(doc: &Value) -> Option<&str> {
    doc["metadata"]["labels"][COMPONENT].as_str()
}

/// The rendered objects of `kind`.
pub fn of_kind<'a>(docs: &'a [Value], kind_: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| kind(d) == kind_).collect()
}

/// The rendered object of `kind` belonging to `operator`, if exactly one.
pub fn operator_object<'a>(docs: &'a [Value], kind_: &str, operator: &str) -> Option<&'a Value> {
    let mut found = docs
        .iter()
        .filter(|d| kind(d) == kind_ && component(d) == Some(operator));
    let first = found.next()?;
    found.next().is_none().then_some(first)
}

/// The RBAC kinds `apply_rbac` applies, in the order they must exist.
const RBAC_KINDS: [(&str, &str, &str); 5] = [
    ("", "v1", "ServiceAccount"),
    ("rbac.authorization.k8s.io", "v1", "ClusterRole"),
    ("rbac.authorization.k8s.io", "v1", "Role"),
    ("rbac.authorization.k8s.io", "v1", "ClusterRoleBinding"),
    ("rbac.authorization.k8s.io", "v1", "RoleBinding"),
];

/// Server-side applies the ServiceAccounts, (Cluster)Roles and bindings the chart renders
/// for `operators` (binaries) as release `release` in `namespace`, with `--set` values
/// `set` (e.g. `watchNamespace`). Namespaces must exist. Returns each operator's
/// ServiceAccount name (in `namespace`); [`token_kubeconfig`] makes a kubeconfig for it.
pub async fn apply_rbac(
    client: &Client,
    tools: &Tools,
    release: &str,
    namespace: &str,
    operators: &[&str],
    set: &[(&str, &str)],
) -> anyhow::Result<BTreeMap<String, String>> {
    let docs = render(tools, release, namespace, set)?;
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let mut accounts = BTreeMap::new();
    for (group, version, kind_) in RBAC_KINDS {
        let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind_));
        for doc in docs
            .iter()
            .filter(|d| kind(d) == kind_ && component(d).is_some_and(|c| operators.contains(&c)))
        {
            let object: DynamicObject = serde_json::from_value(doc.clone())?;
            let api: Api<DynamicObject> = match object_namespace(doc) {
                Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
                None => Api::all_with(client.clone(), &resource),
            };
            api.patch(name(doc), &params, &Patch::Apply(&object))
                .await
                .with_context(|| format!("applying {kind_} {}", name(doc)))?;
            if let Some(op) = component(doc).filter(|_| kind_ == "ServiceAccount") {
                accounts.insert(op.to_owned(), name(doc).to_owned());
            }
        }
    }
    for op in operators {
        if !accounts.contains_key(*op) {
            bail!("the chart renders no ServiceAccount for operator {op}");
        }
    }
    Ok(accounts)
}

/// The rules of every Role and ClusterRole the chart renders for `operator`, in order
/// (its ClusterRole's, then its leader-election Role's).
pub fn operator_rules(docs: &[Value], operator: &str) -> anyhow::Result<Vec<PolicyRule>> {
    let mut rules = Vec::new();
    for kind_ in ["ClusterRole", "Role"] {
        for doc in docs
            .iter()
            .filter(|d| kind(d) == kind_ && component(d) == Some(operator))
        {
            let parsed: Vec<PolicyRule> = serde_json::from_value(doc["rules"].clone())
                .with_context(|| format!("rules of {kind_} {}", name(doc)))?;
            rules.extend(parsed);
        }
    }
    if rules.is_empty() {
        bail!("the chart renders no rules for operator {operator}");
    }
    Ok(rules)
}

/// Applies, for each `(operator, cluster_role)`, a ClusterRole named `cluster_role` holding
/// every rule the chart gives `operator` (its ClusterRole's and its Lease Role's), for tests
/// that bind their own ServiceAccounts cluster-wide (see
/// [`crate::service_account_kubeconfig`]). The verbs and resources are exactly the chart's;
/// only the Lease rules apply in every namespace rather than the release's, because those
/// tests keep their Leases in their own namespaces, and the Lease is the one the binary
/// names by default (`--lease-name` unset: its own name), as those tests run it.
pub async fn apply_operator_cluster_roles(
    client: &Client,
    roles: &[(&str, &str)],
) -> anyhow::Result<()> {
    let tools = Tools::locate().map_err(|e| anyhow::anyhow!("locating the test bed: {e}"))?;
    let keys: Vec<(String, &str)> = roles
        .iter()
        .map(|(op, _)| (format!("operators.{}.leaseName", values_key(op)), *op))
        .collect();
    let set: Vec<(&str, &str)> = keys.iter().map(|(k, op)| (k.as_str(), *op)).collect();
    let docs = render(&tools, "kontinuum", "kontinuum-system", &set)?;
    let api: Api<ClusterRole> = Api::all(client.clone());
    for (operator, role_name) in roles {
        let role = ClusterRole {
            metadata: kube::api::ObjectMeta {
                name: Some((*role_name).to_owned()),
                ..kube::api::ObjectMeta::default()
            },
            rules: Some(operator_rules(&docs, operator)?),
            ..ClusterRole::default()
        };
        api.patch(
            role_name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&role),
        )
        .await
        .with_context(|| format!("applying ClusterRole {role_name} ({operator})"))?;
    }
    Ok(())
}

/// Writes a kubeconfig that authenticates as the existing ServiceAccount `name` in
/// `namespace` with a TokenRequest token (1 h), to `dir`; `admin_kubeconfig` gives the
/// server and CA. For the chart's ServiceAccounts ([`apply_rbac`]).
pub async fn token_kubeconfig(
    client: &Client,
    admin_kubeconfig: &str,
    dir: &Path,
    namespace: &str,
    name: &str,
) -> anyhow::Result<PathBuf> {
    use k8s_openapi::api::authentication::v1::TokenRequest;
    use k8s_openapi::api::core::v1::ServiceAccount;

    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    let request: TokenRequest = serde_json::from_value(serde_json::json!({
        "spec": { "audiences": [], "expirationSeconds": 3600 }
    }))?;
    let token = sas
        .create_token_request(name, &PostParams::default(), &request)
        .await
        .with_context(|| format!("requesting a token for ServiceAccount {namespace}/{name}"))?
        .status
        .context("token request without status")?
        .token
        .context("token request without a token")?;
    let mut kubeconfig = kube::config::Kubeconfig::from_yaml(admin_kubeconfig)?;
    for auth in &mut kubeconfig.auth_infos {
        auth.auth_info = Some(kube::config::AuthInfo {
            token: Some(token.clone().into()),
            ..kube::config::AuthInfo::default()
        });
    }
    let path = dir.join(format!("kubeconfig-{namespace}-{name}"));
    std::fs::write(&path, serde_json::to_string(&kubeconfig)?)?;
    Ok(path)
}

/// Whether `user` (with `groups`) may `verb` the `resource` (`group`, optional
/// `subresource`, `name`) in `namespace`, as the API server's authorizer decides
/// (a SubjectAccessReview, made as the admin `client`).
#[allow(
    clippy::too_many_arguments,
    reason = "one access question, spelled out"
)]
pub async fn can(
    client: &Client,
    user: &str,
    groups: &[String],
    verb: &str,
    group: &str,
    resource: &str,
    namespace: Option<&str>,
    name: Option<&str>,
) -> anyhow::Result<bool> {
    use k8s_openapi::api::authorization::v1::SubjectAccessReview;
    let (resource, subresource) = resource.split_once('/').unwrap_or((resource, ""));
    let review: SubjectAccessReview = serde_json::from_value(serde_json::json!({
        "spec": {
            "user": user,
            "groups": groups,
            "resourceAttributes": {
                "verb": verb, "group": group, "resource": resource,
                "subresource": subresource, "namespace": namespace.unwrap_or_default(),
                "name": name.unwrap_or_default(),
            }
        }
    }))?;
    let answer = Api::<SubjectAccessReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await
        .context("creating a SubjectAccessReview")?;
    Ok(answer.status.is_some_and(|s| s.allowed))
}

/// The user and groups of ServiceAccount `name` in `namespace`, as the authorizer sees them.
pub fn service_account_identity(namespace: &str, name: &str) -> (String, Vec<String>) {
    (
        crate::service_account_user(namespace, name),
        vec![
            "system:serviceaccounts".to_owned(),
            format!("system:serviceaccounts:{namespace}"),
            "system:authenticated".to_owned(),
        ],
    )
}

/// The `--flag[=value]` arguments of the rendered Deployment's container for `operator`.
pub fn deployment_args(docs: &[Value], operator: &str) -> anyhow::Result<Vec<String>> {
    let deployment = operator_object(docs, "Deployment", operator)
        .with_context(|| format!("no Deployment for {operator}"))?;
    let args = &deployment["spec"]["template"]["spec"]["containers"][0]["args"];
    serde_json::from_value(args.clone()).context("container args")
}

/// The subcommand a rendered operator Deployment runs (`serve` for etcd-proxy, `hub` for
/// the registry): its first argument when that is not a flag.
pub fn deployment_subcommand(docs: &[Value], operator: &str) -> anyhow::Result<Option<String>> {
    Ok(deployment_args(docs, operator)?
        .into_iter()
        .next()
        .filter(|a| !a.starts_with('-')))
}

/// A store for the chart in tests (`store.external.endpoints`): the test bed's etcd as a
/// process of its own on `address`, logging to `<dir>/store-etcd.log`. It dies with the
/// test (`setpriv --pdeathsig KILL`, kill-on-drop).
pub struct Store {
    child: tokio::process::Child,
    /// `http://<address>:<client port>`.
    pub endpoint: String,
}

impl Store {
    /// Starts it and waits until `etcdctl endpoint health` passes.
    pub async fn start(
        tools: &Tools,
        dir: &Path,
        address: std::net::IpAddr,
    ) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let url = |port: u16| format!("http://{}", std::net::SocketAddr::new(address, port));
        let endpoint = url(crate::testbed::free_port(address)?);
        let peer = url(crate::testbed::free_port(address)?);
        let log = std::fs::File::create(dir.join("store-etcd.log"))?;
        let child = tokio::process::Command::new("setpriv")
            .args(["--pdeathsig", "KILL", "--"])
            .arg(tools.path("etcd"))
            .args([
                "--name=store".to_owned(),
                format!("--data-dir={}", dir.join("store-etcd").display()),
                format!("--listen-client-urls={endpoint}"),
                format!("--advertise-client-urls={endpoint}"),
                format!("--listen-peer-urls={peer}"),
                format!("--initial-advertise-peer-urls={peer}"),
                format!("--initial-cluster=store={peer}"),
                "--unsafe-no-fsync=true".to_owned(),
                "--log-level=warn".to_owned(),
            ])
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .context("starting the store's etcd")?;
        let store = Self { child, endpoint };
        crate::eventually(
            Duration::from_secs(60),
            "the store's etcd to be healthy",
            || async {
                Ok(store
                    .etcdctl(tools, &["endpoint", "health"])
                    .await?
                    .status
                    .success())
            },
        )
        .await?;
        Ok(store)
    }

    /// Runs the test bed's etcdctl against the store (10 s at most).
    pub async fn etcdctl(&self, tools: &Tools, args: &[&str]) -> anyhow::Result<Output> {
        etcdctl(tools, &[&format!("--endpoints={}", self.endpoint)], args).await
    }

    /// The etcd process id.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }
}

/// Runs the test bed's etcdctl with `connection` flags then `args`, bounded to 10 s (its
/// own dial and command timeouts, and a kill after that).
pub async fn etcdctl(tools: &Tools, connection: &[&str], args: &[&str]) -> anyhow::Result<Output> {
    let run = tokio::process::Command::new(tools.path("etcdctl"))
        .args(["--dial-timeout=3s", "--command-timeout=5s"])
        .args(connection)
        .args(args)
        .kill_on_drop(true)
        .output();
    tokio::time::timeout(Duration::from_secs(10), run)
        .await
        .with_context(|| format!("etcdctl {args:?} timed out"))?
        .with_context(|| format!("running etcdctl {args:?}"))
}

/// The name of a rendered object, for messages.
pub fn describe(doc: &Value) -> String {
    match object_namespace(doc) {
        Some(ns) => format!("{} {ns}/{}", kind(doc), name(doc)),
        None => format!("{} {}", kind(doc), name(doc)),
    }
}

/// Objects of `docs` that belong to `operator`, described.
pub fn owned_by(docs: &[Value], operator: &str) -> Vec<String> {
    docs.iter()
        .filter(|d| component(d) == Some(operator))
        .map(describe)
        .collect()
}
