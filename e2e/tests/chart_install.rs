//! Kontinuum installed as users install it: `helm install` (the real helm) of
//! `charts/kontinuum` onto a real hub whose only node is a hostlet, which runs the chart's
//! pods as real processes. Every operator runs from its own Deployment on its own
//! ServiceAccount token (in-cluster config: nothing started by hand, no admin credentials);
//! a TalosCluster with a machine-config patch goes from emulated machines in maintenance
//! mode to `Ready` with the fixture charts, the machine running the patched config, and a
//! changed patch is rolled onto it in place (one ApplyConfiguration, no Bootstrap), and
//! three control planes behind a Talos shared IP keep their kubeconfig working when the
//! holder powers off; the zones' side of the hub answers: etcd-proxy serves TLS with the
//! chart's certificate in front of the store (a test-bed etcd, `store.external.endpoints`)
//! and refuses a call without a token, the registry heartbeats the hub's Kontinuum and
//! wires the CRD's conversion webhook to its Service, through which the API server then
//! converts; `helm upgrade` rolls the Deployments, the new pods take the Leases and the
//! certificates are kept (or re-issued by the same CA when their names change); each
//! ServiceAccount is refused what it has no business doing; `helm uninstall` stops every
//! process.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::large_futures,
    clippy::too_many_lines,
    clippy::print_stderr
)]

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::authorization::v1::SubjectAccessReview;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Pod, Secret, Service};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kontinuum_crds::{v1alpha1, v1alpha2};
use kontinuum_e2e::addons::ChartRepo;
use kontinuum_e2e::bootstrapper::{
    create_cluster_with, create_instance, shared_ip_failover, stored_kubeconfig, wait_cluster,
};
use kontinuum_e2e::chart::{self, OPERATORS, Store};
use kontinuum_e2e::testbed::{ControlPlane, ControlPlaneConfig, HostletConfig, Tools, unique_dir};
use kontinuum_e2e::{
    audit_writes, eventually, install_kontinuum_crds, service_account_user, workspace_binary,
};
use kube::api::{Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt as _};
use talos_emulator::{Emulator, Settings};

const LIMIT: Duration = Duration::from_secs(240);
const RELEASE: &str = "kontinuum";
const NS: &str = "kontinuum-system";
/// The hostlet node's address (`hub_with_hostlet(.., 98)`): a pod on the node's network has
/// it.
const NODE_IP: Ipv4Addr = Ipv4Addr::new(127, 98, 0, 2);
/// The hub's API server address (`hub_with_hostlet(.., 98)`), which its pods are given.
const HUB_IP: Ipv4Addr = Ipv4Addr::new(127, 98, 0, 1);
/// The operators that hold a Lease (etcd-proxy has none: every replica serves).
const LEADER_ELECTED: [&str; 6] = [
    "instance-discovery",
    "pool-claimer",
    "talos-bootstrapper",
    "addon-installer",
    "registry",
    "zone-installer",
];
/// What zones dial (`server.grpcEndpoint`): the proxy's certificate must name it.
const GRPC_HOST: &str = "proxy.hub.test";

/// The hostlet's image map: the chart's image (`kontinuum`, any tag) holds the workspace's
/// operator binaries and the test bed's helm at their in-image paths; the store's image
/// (the upstream etcd's, any tag) the test bed's etcd.
fn image_map(dir: &Path, tools: &Tools) -> PathBuf {
    use std::fmt::Write as _;
    let mut map = String::from("images:\n  - image: kontinuum\n    files:\n");
    for op in OPERATORS {
        let bin = workspace_binary(op).unwrap();
        writeln!(map, "      /usr/local/bin/{op}: {}", bin.display()).unwrap();
    }
    writeln!(
        map,
        "      /usr/local/bin/helm: {}",
        tools.path("helm").display()
    )
    .unwrap();
    writeln!(
        map,
        "  - image: quay.io/coreos/etcd\n    files:\n      /usr/local/bin/etcd: {}",
        tools.path("etcd").display()
    )
    .unwrap();
    let path = dir.join("images.yaml");
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(&path, map).unwrap();
    path
}

/// A hub of its own whose only node is a hostlet, so that every pod of the chart runs for
/// real: the API server on `127.<net>.0.1`, the node on `127.<net>.0.2`, pods on
/// `127.<net>.1.0/24` (tests of this file run at once, each on its own `net`).
async fn hub_with_hostlet(tools: &Tools, dir: &Path, net: u8) -> ControlPlane {
    let mut config = ControlPlaneConfig::new(dir.join("hub"));
    config.address = Ipv4Addr::new(127, net, 0, 1).into();
    config.nodes = Vec::new();
    let mut hub = ControlPlane::start(tools, config).await.unwrap();
    let mut hostlet = HostletConfig::new(
        "hub-node",
        Ipv4Addr::new(127, net, 0, 2),
        image_map(dir, tools),
        workspace_binary("hostlet").unwrap(),
    );
    hostlet.pod_cidr = Some(format!("127.{net}.1.0/24"));
    hostlet.initial_backoff_seconds = Some(1);
    hub.start_hostlet(&hostlet).await.unwrap();
    hub
}

/// Runs the test bed's helm against the hub; fails the test with helm's output.
async fn helm(tools: &Tools, kubeconfig: &Path, home: &Path, args: &[&str]) -> String {
    let out = tokio::time::timeout(
        Duration::from_secs(300),
        tokio::process::Command::new(tools.path("helm"))
            .args(args)
            .env_clear()
            .env("KUBECONFIG", kubeconfig)
            // Without HOME, client-go would keep its discovery cache in the working directory.
            .env("HOME", home)
            .env("HELM_CACHE_HOME", home.join("cache"))
            .env("HELM_CONFIG_HOME", home.join("config"))
            .env("HELM_DATA_HOME", home.join("data"))
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("helm timed out")
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "helm {args:?} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

fn chart_dir() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../charts/kontinuum")
        .to_string_lossy()
        .into_owned()
}

/// PIDs of the processes run for pods of `namespace` (their environment says so: the chart
/// sets `POD_NAMESPACE` from the downward API), with the binary each runs.
fn pod_processes(namespace: &str) -> BTreeMap<u32, String> {
    let needle = format!("POD_NAMESPACE={namespace}");
    // Only this hub's pods: a zone cluster's agent (of another test, its pods live in
    // kontinuum-system too) is given another API server.
    let hub = format!("KUBERNETES_SERVICE_HOST={HUB_IP}");
    let mut found = BTreeMap::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(environ) = std::fs::read(entry.path().join("environ")) else {
            continue;
        };
        let mut vars = environ.split(|b| *b == 0);
        if vars.clone().any(|kv| kv == needle.as_bytes()) && vars.any(|kv| kv == hub.as_bytes()) {
            let link = std::fs::read_link(entry.path().join("exe")).unwrap_or_default();
            // A binary rebuilt while it runs reads "<name> (deleted)".
            let exe = link
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .trim_end_matches(" (deleted)")
                .to_owned();
            found.insert(pid, exe);
        }
    }
    found
}

/// Whether ServiceAccount `sa` of `ns` may `verb` the `resource` (group `group`) in
/// `in_ns`, as the API server's authorizer answers (a SubjectAccessReview).
async fn can(
    client: &Client,
    ns: &str,
    sa: &str,
    verb: &str,
    group: &str,
    resource: &str,
    in_ns: &str,
) -> bool {
    let review: SubjectAccessReview = serde_json::from_value(serde_json::json!({
        "spec": {
            "user": service_account_user(ns, sa),
            "groups": ["system:serviceaccounts", format!("system:serviceaccounts:{ns}"), "system:authenticated"],
            "resourceAttributes": { "verb": verb, "group": group, "resource": resource, "namespace": in_ns }
        }
    }))
    .unwrap();
    Api::<SubjectAccessReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await
        .unwrap()
        .status
        .is_some_and(|s| s.allowed)
}

/// Where Service `service` routes to: a Ready pod it selects, at the container port its
/// first port's targetPort names; what its EndpointSlice would list. (The test bed has no
/// EndpointSlices for hostlet pods: the API server refuses loopback addresses in them, and
/// the hostlet's pod IPs are loopback addresses.)
async fn service_target(client: &Client, ns: &str, service: &str) -> Option<SocketAddr> {
    let spec = Api::<Service>::namespaced(client.clone(), ns)
        .get(service)
        .await
        .ok()?
        .spec?;
    let Some(IntOrString::String(port_name)) = spec.ports?.first()?.target_port.clone() else {
        return None;
    };
    let selector: Vec<String> = spec
        .selector?
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    let pods = Api::<Pod>::namespaced(client.clone(), ns)
        .list(&ListParams::default().labels(&selector.join(",")))
        .await
        .ok()?;
    pods.items.into_iter().find_map(|pod| {
        let status = pod.status?;
        let ready = status
            .conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        if !ready || pod.metadata.deletion_timestamp.is_some() {
            return None;
        }
        let ip: IpAddr = status.pod_ip?.parse().ok()?;
        let port = pod.spec?.containers.into_iter().find_map(|c| {
            c.ports
                .into_iter()
                .flatten()
                .find(|p| p.name.as_deref() == Some(port_name.as_str()))
        })?;
        Some(SocketAddr::new(
            ip,
            u16::try_from(port.container_port).ok()?,
        ))
    })
}

/// The data of Secret `name`.
async fn secret_data(client: &Client, ns: &str, name: &str) -> BTreeMap<String, Vec<u8>> {
    Api::<Secret>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .unwrap_or_else(|e| panic!("Secret {name}: {e}"))
        .data
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, v.0))
        .collect()
}

/// Whether a TLS client that trusts only `ca` (a PEM file) accepts the certificate served at
/// `addr` for `server_name`: the test bed's kubectl (Go's crypto/tls) with that server name
/// and CA. What it then sends is no gRPC call, so only the handshake's verdict counts: a
/// refused certificate is an `x509:` error; an accepted one gets an HTTP answer. Returns the
/// verdict and what kubectl said.
async fn tls_accepts(
    tools: &Tools,
    dir: &Path,
    ca: &[u8],
    addr: SocketAddr,
    server_name: &str,
) -> (bool, String) {
    let ca_file = dir.join("tls-check-ca.crt");
    std::fs::write(&ca_file, ca).unwrap();
    let kubeconfig = dir.join(format!("tls-check-{server_name}.kubeconfig"));
    let config = serde_json::json!({
        "apiVersion": "v1", "kind": "Config", "current-context": "check",
        "clusters": [{ "name": "proxy", "cluster": {
            "server": format!("https://{addr}"),
            "certificate-authority": ca_file,
            "tls-server-name": server_name,
        }}],
        // A token, so that kubectl asks for no credentials (nothing checks it).
        "users": [{ "name": "nobody", "user": { "token": "none" } }],
        "contexts": [{ "name": "check", "context": { "cluster": "proxy", "user": "nobody" } }],
    });
    std::fs::write(&kubeconfig, config.to_string()).unwrap();
    let out = tokio::time::timeout(
        Duration::from_secs(30),
        tokio::process::Command::new(tools.path("kubectl"))
            .args(["--kubeconfig"])
            .arg(&kubeconfig)
            .args(["get", "--raw", "/", "--request-timeout=10s"])
            .env("HOME", dir)
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("kubectl timed out")
    .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let refused = said.contains("x509:");
    // Accepted means the server answered over the verified connection: an HTTP response
    // (gRPC's is empty; the webhook's a 404), nothing else (no refused connection).
    let answered = out.status.success() || said.contains("Error from server");
    assert!(
        refused || answered,
        "no verdict from the TLS handshake at {addr}: {said}"
    );
    (!refused, said)
}

/// Checks the serving certificate at `addr` against the CA `ca`: accepted for each of
/// `names`, refused for a name it does not carry (so a check that accepts everything
/// cannot pass).
async fn assert_serves_for(tools: &Tools, dir: &Path, ca: &[u8], addr: SocketAddr, names: &[&str]) {
    for name in names {
        let (accepted, said) = tls_accepts(tools, dir, ca, addr, name).await;
        eprintln!("TLS as {name} at {addr}: {}", said.trim());
        assert!(
            accepted,
            "the certificate at {addr} is refused for {name}: {said}"
        );
    }
    let (accepted, said) = tls_accepts(tools, dir, ca, addr, "elsewhere.hub.test").await;
    assert!(
        !accepted,
        "a name the certificate lacks was accepted: {said}"
    );
}

/// The ReplicaSet hash of each operator's running, Ready pods.
async fn ready_pods(client: &Client, ns: &str) -> BTreeMap<String, Vec<(String, String)>> {
    let pods = Api::<Pod>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .unwrap();
    let mut by_op: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
    for pod in pods.items {
        let ready = pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        if !ready || pod.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let labels = pod.labels();
        let (Some(op), Some(hash)) = (
            labels.get("app.kubernetes.io/component"),
            labels.get("pod-template-hash"),
        ) else {
            continue;
        };
        by_op
            .entry(op.clone())
            .or_default()
            .push((pod.name_any(), hash.clone()));
    }
    by_op
}

/// Where the CRD's conversion webhook should point.
enum Webhook<'a> {
    /// The chart's Service (namespace, name), port 443, path `/convert`.
    Service(&'a str, &'a str),
    /// A URL.
    Url(&'a str),
}

/// Waits until the Kontinuum CRD converts through the registry's webhook: strategy
/// Webhook, conversion reviews v1, the expected target and the chart's CA.
async fn assert_conversion_wired(client: &Client, target: &Webhook<'_>, ca: &[u8]) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    wait_for("the Kontinuum CRD's conversion webhook", || {
        let crds = crds.clone();
        async move {
            let conversion = crds
                .get("kontinuums.kontinuum.sh")
                .await
                .ok()?
                .spec
                .conversion?;
            let webhook = conversion.webhook.as_ref()?;
            let config = webhook.client_config.as_ref()?;
            let points = match (target, &config.service, &config.url) {
                (Webhook::Service(ns, name), Some(svc), None) => {
                    svc.namespace == *ns
                        && svc.name == *name
                        && svc.port == Some(443)
                        && svc.path.as_deref() == Some("/convert")
                }
                (Webhook::Url(url), None, Some(set)) => set == url,
                _ => false,
            };
            (conversion.strategy == "Webhook"
                && points
                && webhook.conversion_review_versions == ["v1"]
                && config.ca_bundle.as_ref().map(|b| b.0.as_slice()) == Some(ca))
            .then_some(())
        }
    })
    .await;
}

/// Reads Kontinuum `name` as `kontinuum.sh/v1alpha1` (stored as v1alpha2: the API server
/// converts through the webhook), retrying until it works.
async fn read_v1alpha1(client: &Client, ns: &str, name: &str) -> DynamicObject {
    let resource = ApiResource::erase::<v1alpha1::Kontinuum>(&());
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &resource);
    let deadline = Instant::now() + LIMIT;
    loop {
        match api.get(name).await {
            Ok(object) => return object,
            Err(e) if Instant::now() < deadline => {
                eprintln!("v1alpha1 read of {name} not yet: {e}");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => panic!("v1alpha1 read of {name} failed for {LIMIT:?}: {e}"),
        }
    }
}

/// `helm upgrade` with `args`, then waits until every operator runs a new pod (a new
/// ReplicaSet), Ready, holding its Lease (etcd-proxy has none), and none of the `old`
/// processes is left; returns the new processes.
async fn upgrade_and_wait(
    tools: &Tools,
    hub: &ControlPlane,
    helm_home: &Path,
    args: &[&str],
    old: &BTreeMap<u32, String>,
) -> BTreeMap<u32, String> {
    let client = hub.client();
    let before = ready_pods(&client, NS).await;
    helm(tools, hub.kubeconfig_path(), helm_home, args).await;
    let leases: Api<Lease> = Api::namespaced(client.clone(), NS);
    eventually(LIMIT, "new pods Ready and holding the Leases", || async {
        let now = ready_pods(&client, NS).await;
        for op in OPERATORS {
            let (Some(old), Some(new)) = (before.get(op), now.get(op)) else {
                return Ok(false);
            };
            let [(pod, hash)] = new.as_slice() else {
                return Ok(false);
            };
            if old.iter().any(|(_, h)| h == hash) {
                return Ok(false);
            }
            if !LEADER_ELECTED.contains(&op) {
                continue;
            }
            let holder = leases
                .get(&format!("{RELEASE}-{op}"))
                .await?
                .spec
                .and_then(|s| s.holder_identity);
            if holder.as_deref() != Some(pod.as_str()) {
                return Ok(false);
            }
        }
        Ok(true)
    })
    .await
    .unwrap();
    // etcd-proxy's old pod leaves only once its successor is Ready (a rolling update).
    let mut now = BTreeMap::new();
    eventually(LIMIT, "the old processes replaced", || {
        now = pod_processes(NS);
        let done = now.len() == OPERATORS.len() && now.keys().all(|pid| !old.contains_key(pid));
        async move { Ok(done) }
    })
    .await
    .unwrap();
    now
}

/// The registry's successful conversions so far, from its `/metrics` at `admin`.
async fn conversions(admin: SocketAddr) -> u64 {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let fetch = async {
        let mut stream = tokio::net::TcpStream::connect(admin).await?;
        stream
            .write_all(format!("GET /metrics HTTP/1.0\r\nHost: {admin}\r\n\r\n").as_bytes())
            .await?;
        let mut text = String::new();
        stream.read_to_string(&mut text).await?;
        std::io::Result::Ok(text)
    };
    let text = tokio::time::timeout(Duration::from_secs(10), fetch)
        .await
        .expect("the registry's /metrics timed out")
        .unwrap();
    let counted: Vec<u64> = text
        .lines()
        .filter(|l| l.contains("conversions_total{") && l.contains("result=\"success\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
        .collect();
    assert!(!counted.is_empty(), "no conversions counter in:\n{text}");
    counted.iter().sum()
}

/// Polls `check` every 200 ms until it gives `Some`, for at most [`LIMIT`].
async fn wait_for<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + LIMIT;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {LIMIT:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_install_runs_the_operators_for_real_and_a_cluster_becomes_ready() {
    kontinuum_e2e::testbed::install_crypto_provider();
    let tools = Tools::locate().unwrap();
    let dir = unique_dir("chart-install");
    let hub = hub_with_hostlet(&tools, &dir, 98).await;
    let client = hub.client();
    let kubeconfig = hub.kubeconfig_path().to_path_buf();
    let helm_home = dir.join("helm");
    let repo = ChartRepo::serve(&tools).await.unwrap();
    let ns = NS;
    // The store: the test bed's etcd, given to the chart as a store of the user's own.
    let store = Store::start(&tools, &dir, Ipv4Addr::new(127, 98, 0, 3).into())
        .await
        .unwrap();

    // 1. helm install, as a user would, with test-friendly intervals.
    let started = Instant::now();
    let mirror = format!("operators.addonInstaller.chartMirror={}", repo.url);
    let store_endpoint = format!("store.external.endpoints[0]={}", store.endpoint);
    let grpc_endpoint = format!("server.grpcEndpoint={GRPC_HOST}:443");
    let install_args = [
        "install",
        RELEASE,
        &chart_dir(),
        "--namespace",
        ns,
        "--create-namespace",
        "--set",
        &mirror,
        "--set",
        "operators.instanceDiscovery.retrySeconds=1",
        "--set",
        "operators.talosBootstrapper.retrySeconds=1",
        "--set",
        "operators.talosBootstrapper.serviceAccountKeyBits=2048",
        "--set",
        "operators.addonInstaller.resyncInterval=2s",
        "--set",
        "operators.addonInstaller.retryInterval=1s",
        "--set",
        &store_endpoint,
        "--set",
        &grpc_endpoint,
        "--set",
        "auth.insecureAllowAnonymous=true",
        "--wait",
        "--timeout",
        "4m",
    ];
    helm(&tools, &kubeconfig, &helm_home, &install_args).await;
    eprintln!("helm install --wait: {:?}", started.elapsed());
    let deployments = Api::<Deployment>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .unwrap();
    assert_eq!(deployments.items.len(), OPERATORS.len());
    for d in &deployments.items {
        let status = d.status.clone().unwrap_or_default();
        assert_eq!(status.available_replicas, Some(1), "{}", d.name_any());
    }
    // Each operator is a real process of its own binary, started by the hostlet for its pod,
    // with no kubeconfig: in-cluster config from its ServiceAccount token.
    let processes = pod_processes(ns);
    let mut binaries: Vec<&str> = processes.values().map(String::as_str).collect();
    binaries.sort_unstable();
    let mut expected = OPERATORS.to_vec();
    expected.sort_unstable();
    assert_eq!(binaries, expected, "{processes:?}");
    for pid in processes.keys() {
        let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
        assert!(
            !environ
                .split(|b| *b == 0)
                .any(|kv| kv.starts_with(b"KUBECONFIG=")),
            "pid {pid} has a KUBECONFIG"
        );
    }

    // 2. The zones' side of the hub. etcd-proxy serves TLS with the chart's certificate at
    //    its Service's endpoint, for the name zones dial and the Service's names, and a real
    //    etcd client without a token is refused.
    let ca = secret_data(&client, ns, &format!("{RELEASE}-ca")).await["tls.crt"].clone();
    let proxy_tls = secret_data(&client, ns, &format!("{RELEASE}-etcd-proxy-tls")).await;
    assert_eq!(
        proxy_tls["ca.crt"], ca,
        "the proxy's Secret carries the chart's CA"
    );
    let grpc_service = format!("{RELEASE}-etcd-proxy-grpc");
    let proxy_addr = wait_for("a Ready endpoint of etcd-proxy's Service", || {
        service_target(&client, ns, &grpc_service)
    })
    .await;
    let svc_name = format!("{grpc_service}.{ns}.svc");
    assert_serves_for(&tools, &dir, &ca, proxy_addr, &[GRPC_HOST, &svc_name]).await;
    let out = chart::etcdctl(
        &tools,
        &[
            &format!("--endpoints=https://{proxy_addr}"),
            "--insecure-skip-tls-verify",
        ],
        &["get", "/kontinuum.sh/zones/eu/1a/registry/x"],
    )
    .await
    .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !out.status.success() && said.contains("Unauthenticated"),
        "etcdctl without a token: {said}"
    );

    //    The registry heartbeats the hub's Kontinuum (named after the release) ...
    let kontinuums: Api<v1alpha2::Kontinuum> = Api::namespaced(client.clone(), ns);
    let hub_entry = wait_for("the hub's Kontinuum, heartbeating", || async {
        kontinuums
            .get_opt(RELEASE)
            .await
            .ok()
            .flatten()
            .filter(|k| {
                k.status
                    .as_ref()
                    .is_some_and(|s| s.last_heartbeat_time.is_some())
            })
    })
    .await;
    eprintln!("the hub's Kontinuum after install: {:?}", started.elapsed());
    assert_eq!(
        hub_entry.status.and_then(|s| s.role),
        Some(v1alpha2::KontinuumRole::ControlPlane)
    );
    //    ... mirrors a zone's registration from the store the chart points it at (written
    //    straight into the store here, as a zone agent would through relay and proxy) ...
    let key = "/kontinuum.sh/zones/eu/1a/registry/agent";
    let value = serde_json::json!({
        "name": "agent", "region": "eu", "zone": "1a", "version": "0.1.0",
        "lastHeartbeatTime": k8s_openapi::jiff::Timestamp::now().round(k8s_openapi::jiff::Unit::Second).unwrap().to_string(),
    });
    let put = store
        .etcdctl(&tools, &["put", key, &value.to_string()])
        .await
        .unwrap();
    assert!(put.status.success(), "{put:?}");
    let mirrored = wait_for("the zone's registration mirrored", || async {
        kontinuums.get_opt("eu.1a.agent").await.ok().flatten()
    })
    .await;
    let labels = mirrored.metadata.labels.unwrap_or_default();
    assert_eq!(
        labels.get("kontinuum.sh/region").map(String::as_str),
        Some("eu")
    );
    assert_eq!(
        labels.get("kontinuum.sh/zone").map(String::as_str),
        Some("1a")
    );
    let del = store.etcdctl(&tools, &["del", key]).await.unwrap();
    assert!(del.status.success(), "{del:?}");
    wait_for("the mirrored Kontinuum gone with its key", || async {
        matches!(kontinuums.get_opt("eu.1a.agent").await, Ok(None)).then_some(())
    })
    .await;
    //    ... and points the CRD's conversion webhook at its Service, with the chart's CA,
    //    which the registry pod serves. (The API server cannot call it there on the test bed:
    //    it reaches a Service through its EndpointSlices, which refuse the hostlet's loopback
    //    pod IPs. The conversion itself is shown after the second upgrade, with webhookUrl.)
    let webhook_service = format!("{RELEASE}-registry-webhook");
    let webhook_tls = secret_data(&client, ns, &format!("{webhook_service}-tls")).await;
    assert_eq!(
        webhook_tls["ca.crt"], ca,
        "the webhook's Secret carries the chart's CA"
    );
    assert_conversion_wired(&client, &Webhook::Service(ns, &webhook_service), &ca).await;
    let webhook_addr = wait_for("the registry pod behind the webhook Service", || {
        service_target(&client, ns, &webhook_service)
    })
    .await;
    assert_serves_for(
        &tools,
        &dir,
        &ca,
        webhook_addr,
        &[&format!("{webhook_service}.{ns}.svc")],
    )
    .await;

    // 3. A TalosCluster from emulated machines to Ready, through the installed operators.
    install_kontinuum_crds(&client).await.unwrap();
    // One namespace for a cluster of one machine, one for three control planes.
    let (flow, ha) = ("flow", "flow-vip");
    for name in [flow, ha] {
        let ns_obj: k8s_openapi::api::core::v1::Namespace =
            serde_json::from_value(serde_json::json!({ "metadata": { "name": name } })).unwrap();
        Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns_obj)
            .await
            .unwrap();
    }
    let first = Ipv4Addr::new(127, 99, 0, 1);
    let emulator = Emulator::start(Settings {
        machines: 4,
        first_address: first,
        port: 50000,
        api_port: 6443,
        dir: dir.join("machines"),
        control_addr: None,
    })
    .await
    .unwrap();
    create_instance(&client, flow, "m-1", first, "cp")
        .await
        .unwrap();
    // Machine-config patches at every level: the machine's static address and the last word
    // on a sysctl each level sets (Instance), its pool's install disk, and a registry mirror
    // for every machine (cluster).
    let sysctl = |v: &str| serde_json::json!({ "net.core.somaxconn": v });
    let own = serde_json::json!({ "spec": { "configPatches": [{ "machine": {
        "network": { "interfaces": [{ "interface": "eth0", "addresses": ["10.0.0.5/24"] }] },
        "sysctls": sysctl("3"),
    } }] } });
    Api::<v1alpha2::Instance>::namespaced(client.clone(), flow)
        .patch("m-1", &PatchParams::default(), &Patch::Merge(&own))
        .await
        .unwrap();
    let created = Instant::now();
    let mirror = |url: &str| {
        serde_json::json!([{ "machine": {
            "registries": { "mirrors": { "docker.io": { "endpoints": [url] } } },
            "sysctls": sysctl("1"),
        } }])
    };
    create_cluster_with(&client, flow, "eu-9a", 1, 0, false, |spec| {
        spec["talos"]["configPatches"] = mirror("https://mirror-a.example");
        spec["controlPlane"]["configPatches"] = serde_json::json!([{ "machine": {
            "install": { "disk": "/dev/sda", "diskSelector": { "$patch": "delete" } },
            "sysctls": sysctl("2"),
        } }]);
    })
    .await
    .unwrap();
    wait_cluster(&client, flow, "eu-9a", "Ready", "True", LIMIT)
        .await
        .unwrap();
    eprintln!(
        "TalosCluster creation to Ready through the chart's pods: {:?}",
        created.elapsed()
    );
    let runs_mirror = |url: &str| {
        emulator
            .running_config(first)
            .is_some_and(|yaml| yaml.contains(url))
    };
    assert!(
        runs_mirror("https://mirror-a.example"),
        "the machine runs the patched config"
    );
    let running: Vec<serde_json::Value> =
        serde_saphyr::from_multiple(&emulator.running_config(first).unwrap()).unwrap();
    let main = running.iter().find(|d| d.get("kind").is_none()).unwrap();
    let at = |path: &str| main.pointer(path).cloned();
    assert_eq!(
        (
            at("/machine/install/disk"),
            at("/machine/install/diskSelector"),
            at("/machine/network/interfaces/0/addresses/0"),
            at("/machine/sysctls/net.core.somaxconn"),
        ),
        (
            Some(serde_json::json!("/dev/sda")),
            None,
            Some(serde_json::json!("10.0.0.5/24")),
            Some(serde_json::json!("3")),
        ),
        "merged cluster, then pool, then Instance"
    );
    assert_eq!(emulator.apply_calls(first), Some(1));
    // The patch changed on the Ready cluster: the chart's bootstrapper rolls it onto the
    // machine in place, one ApplyConfiguration, no Bootstrap, Ready throughout.
    let clusters = Api::<v1alpha2::TalosCluster>::namespaced(client.clone(), flow);
    let changed = serde_json::json!({ "spec": { "talos": { "configPatches": mirror("https://mirror-b.example") } } });
    let changed_at = Instant::now();
    clusters
        .patch("eu-9a", &PatchParams::default(), &Patch::Merge(&changed))
        .await
        .unwrap();
    wait_for("the changed patch rolled onto the machine", || {
        let clusters = clusters.clone();
        let rolled = runs_mirror("https://mirror-b.example");
        async move {
            let conditions = clusters.get("eu-9a").await.ok()?.status?.conditions;
            let ready = kontinuum_crds::conditions::is_true(&conditions, "Ready");
            let current = kontinuum_crds::conditions::is_true(&conditions, "ConfigUpToDate");
            assert!(ready, "the cluster stayed Ready while it was reconfigured");
            (rolled && current).then_some(())
        }
    })
    .await;
    eprintln!(
        "changed patch to rolled through the chart's bootstrapper: {:?}",
        changed_at.elapsed()
    );
    assert_eq!(
        emulator.apply_calls(first),
        Some(2),
        "one ApplyConfiguration"
    );
    assert_eq!(
        emulator.bootstrap_calls(first),
        Some(1),
        "nothing re-bootstrapped"
    );

    // Three control planes behind a Talos shared IP, through the chart's operators: its
    // holder powered off, the stored kubeconfig works again through the next one.
    let vip = Ipv4Addr::new(127, 99, 0, 100);
    let lease = Duration::from_secs(10);
    emulator.set_vip_lease_ttl(lease);
    let control_planes: Vec<Ipv4Addr> = (2..=4).map(|i| Ipv4Addr::new(127, 99, 0, i)).collect();
    for (i, address) in control_planes.iter().enumerate() {
        create_instance(&client, ha, &format!("v-{}", i + 1), *address, "cp")
            .await
            .unwrap();
    }
    create_cluster_with(&client, ha, "eu-9b", 3, 0, false, |spec| {
        spec["controlPlane"]["endpoint"] =
            serde_json::json!({ "vip": { "ip": vip.to_string(), "link": "eth0" } });
    })
    .await
    .unwrap();
    wait_cluster(&client, ha, "eu-9b", "Ready", "True", LIMIT)
        .await
        .unwrap();
    let zone_kubeconfig = stored_kubeconfig(&client, ha, "eu-9b").await.unwrap();
    assert!(zone_kubeconfig.contains(&format!("server: https://{vip}:6443")));
    let (back, holder, new_holder) =
        shared_ip_failover(&emulator, &zone_kubeconfig, vip, 3, &control_planes, lease)
            .await
            .unwrap();
    eprintln!(
        "shared IP failover through the chart's operators: the API answered on {vip} again {back:?} after {holder} powered off (lease TTL {lease:?}); now held by {new_holder}"
    );
    // The writes came from the operators' own ServiceAccounts (the audit log's users);
    // etcd-proxy writes nothing to Kubernetes at all.
    for op in OPERATORS {
        let writes = audit_writes(
            &hub.audit_log(),
            &service_account_user(ns, &format!("{RELEASE}-{op}")),
        )
        .unwrap();
        assert_eq!(
            writes.is_empty(),
            op == "etcd-proxy",
            "{op}'s writes as its ServiceAccount: {:?}",
            writes.iter().map(|w| &w.request_u_r_i).collect::<Vec<_>>()
        );
    }

    // 4. RBAC: each ServiceAccount is refused what it has no business doing, and allowed
    //    what it needs (so a broken review cannot pass for a refusal).
    let cases = [
        (
            "instance-discovery",
            "patch",
            "kontinuum.sh",
            "instances/status",
            flow,
            true,
        ),
        (
            "instance-discovery",
            "create",
            "kontinuum.sh",
            "talosclusters",
            flow,
            false,
        ),
        (
            "instance-discovery",
            "update",
            "kontinuum.sh",
            "talosclusters",
            flow,
            false,
        ),
        ("instance-discovery", "get", "", "secrets", flow, false),
        (
            "instance-discovery",
            "patch",
            "kontinuum.sh",
            "instances",
            flow,
            false,
        ),
        (
            "pool-claimer",
            "patch",
            "kontinuum.sh",
            "instances",
            flow,
            true,
        ),
        ("pool-claimer", "get", "", "secrets", flow, false),
        (
            "pool-claimer",
            "delete",
            "kontinuum.sh",
            "instances",
            flow,
            false,
        ),
        (
            "pool-claimer",
            "create",
            "kontinuum.sh",
            "addons",
            flow,
            false,
        ),
        ("talos-bootstrapper", "create", "", "secrets", flow, true),
        (
            "talos-bootstrapper",
            "delete",
            "",
            "namespaces",
            flow,
            false,
        ),
        (
            "talos-bootstrapper",
            "create",
            "kontinuum.sh",
            "zones",
            flow,
            false,
        ),
        (
            "talos-bootstrapper",
            "create",
            "rbac.authorization.k8s.io",
            "clusterrolebindings",
            flow,
            false,
        ),
        (
            "addon-installer",
            "patch",
            "kontinuum.sh",
            "addons/status",
            flow,
            true,
        ),
        ("addon-installer", "create", "", "secrets", flow, false),
        (
            "addon-installer",
            "update",
            "kontinuum.sh",
            "talosclusters",
            flow,
            false,
        ),
        (
            "addon-installer",
            "patch",
            "kontinuum.sh",
            "instances",
            flow,
            false,
        ),
        // etcd-proxy reads the identity Secrets of the release namespace only, and writes
        // none; the registry's Kontinuums are in the release namespace only.
        ("etcd-proxy", "watch", "", "secrets", ns, true),
        ("etcd-proxy", "list", "", "secrets", flow, false),
        ("etcd-proxy", "list", "", "secrets", "", false),
        ("etcd-proxy", "create", "", "secrets", ns, false),
        ("etcd-proxy", "patch", "", "secrets", ns, false),
        ("registry", "delete", "kontinuum.sh", "kontinuums", ns, true),
        (
            "registry",
            "create",
            "kontinuum.sh",
            "kontinuums",
            flow,
            false,
        ),
        ("registry", "get", "", "secrets", ns, false),
    ];
    for (op, verb, group, resource, in_ns, expected) in cases {
        let sa = format!("{RELEASE}-{op}");
        assert_eq!(
            can(&client, ns, &sa, verb, group, resource, in_ns).await,
            expected,
            "{sa} {verb} {group}/{resource} in {in_ns:?}"
        );
    }

    // 5. helm upgrade with a changed value: every Deployment rolls, each new pod takes over
    //    its operator's Lease; the certificates are kept as they were.
    let secret_names = [
        format!("{RELEASE}-ca"),
        format!("{webhook_service}-tls"),
        format!("{RELEASE}-etcd-proxy-tls"),
    ];
    let mut kept = Vec::new();
    for name in &secret_names {
        kept.push(secret_data(&client, ns, name).await);
    }
    let mut upgrade_args = install_args.to_vec();
    upgrade_args[0] = "upgrade";
    upgrade_args.retain(|a| *a != "--create-namespace");
    upgrade_args.extend(["--set", "logLevel=debug"]);
    let processes = upgrade_and_wait(&tools, &hub, &helm_home, &upgrade_args, &processes).await;
    for (name, before) in secret_names.iter().zip(&kept) {
        assert_eq!(
            &secret_data(&client, ns, name).await,
            before,
            "{name} is kept across upgrades"
        );
    }
    assert_conversion_wired(&client, &Webhook::Service(ns, &webhook_service), &ca).await;

    // 6. helm upgrade with new names: zones now dial another host, and the API server calls
    //    the webhook at a URL, the registry on the node's network (its address is known
    //    before it starts, so the certificate can name it). The certificates are re-issued
    //    for the new names by the same CA; the registry re-wires the CRD; and the API server
    //    converts through it: v1alpha1 reads of the hub's Kontinuum work.
    let moved_host = "proxy2.hub.test";
    let moved_endpoint = format!("server.grpcEndpoint={moved_host}:443");
    let webhook_url = format!("https://{NODE_IP}:9443/convert");
    let url_value = format!("operators.registry.webhookUrl={webhook_url}");
    upgrade_args.extend([
        "--set",
        &moved_endpoint,
        "--set",
        "operators.registry.hostNetwork=true",
        "--set",
        &url_value,
    ]);
    upgrade_and_wait(&tools, &hub, &helm_home, &upgrade_args, &processes).await;
    assert_eq!(
        secret_data(&client, ns, &secret_names[0]).await,
        kept[0],
        "the CA is kept"
    );
    for (name, before) in secret_names.iter().zip(&kept).skip(1) {
        let after = secret_data(&client, ns, name).await;
        assert_ne!(after["tls.crt"], before["tls.crt"], "{name}: re-issued");
        assert_eq!(after["ca.crt"], ca, "{name}: by the same CA");
    }
    let proxy_addr = wait_for("the etcd-proxy pod behind its Service", || {
        service_target(&client, ns, &grpc_service)
    })
    .await;
    assert_serves_for(&tools, &dir, &ca, proxy_addr, &[moved_host, &svc_name]).await;
    assert_conversion_wired(&client, &Webhook::Url(&webhook_url), &ca).await;
    let registry_admin = SocketAddr::new(NODE_IP.into(), 8080);
    let conversions_before = conversions(registry_admin).await;
    let converted = read_v1alpha1(&client, ns, RELEASE).await;
    let conversions_after = conversions(registry_admin).await;
    eprintln!("the registry's conversions: {conversions_before} -> {conversions_after}");
    assert!(
        conversions_after > conversions_before,
        "the read went through the registry's webhook: {conversions_before} -> {conversions_after}"
    );
    eprintln!(
        "a v1alpha1 read through the webhook: {:?}",
        started.elapsed()
    );
    assert_eq!(
        converted.types.as_ref().map(|t| t.api_version.as_str()),
        Some("kontinuum.sh/v1alpha1")
    );
    assert!(
        converted.data["status"]["lastHeartbeatTime"].is_string(),
        "the status came through the conversion: {}",
        converted.data
    );
    // The cluster stays Ready across the rollouts.
    wait_cluster(&client, flow, "eu-9a", "Ready", "True", LIMIT)
        .await
        .unwrap();

    // 7. helm uninstall stops every process.
    helm(
        &tools,
        &kubeconfig,
        &helm_home,
        &["uninstall", RELEASE, "--namespace", ns, "--wait"],
    )
    .await;
    eventually(LIMIT, "every operator process stopped", || async {
        Ok(pod_processes(ns).is_empty())
    })
    .await
    .unwrap();

    drop(repo);
    drop(store);
    emulator.shutdown().await;
    hub.stop().await;
}

/// The chart's own store, run for real: its StatefulSet's pod is the test bed's etcd under
/// the hostlet (the upstream image mapped to it), with the chart's flags, user, read-only
/// root and probes. (Only the volume is an emptyDir: there is no volume provisioner here.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_charts_own_store_runs_etcd_with_its_flags_and_probes() {
    kontinuum_e2e::testbed::install_crypto_provider();
    let tools = Tools::locate().unwrap();
    let dir = unique_dir("chart-store");
    let hub = hub_with_hostlet(&tools, &dir, 97).await;
    let client = hub.client();
    let helm_home = dir.join("helm");
    let started = Instant::now();
    helm(
        &tools,
        hub.kubeconfig_path(),
        &helm_home,
        &[
            "install",
            RELEASE,
            &chart_dir(),
            "--namespace",
            NS,
            "--create-namespace",
            // The store alone.
            "--set",
            "operatorDefaults.enabled=false",
            "--set",
            "store.persistence.enabled=false",
            "--wait",
            "--timeout",
            "4m",
        ],
    )
    .await;
    eprintln!("helm install --wait of the store: {:?}", started.elapsed());
    // Ready: etcd took every flag the chart gives it and passed its startup and readiness
    // probes (/livez, /readyz on the metrics listener).
    let member = format!("{RELEASE}-store-0");
    let pod = Api::<Pod>::namespaced(client.clone(), NS)
        .get(&member)
        .await
        .unwrap();
    let status = pod.status.unwrap();
    assert!(
        status
            .conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == "Ready" && c.status == "True"),
        "{member} is not Ready"
    );
    let ip = status.pod_ip.unwrap();
    // The process is the test bed's etcd, as the chart's user.
    let needle = format!("POD_NAME={member}");
    let process = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .find(|e| {
            std::fs::read(e.path().join("environ"))
                .is_ok_and(|env| env.split(|b| *b == 0).any(|kv| kv == needle.as_bytes()))
        })
        .expect("the store's process");
    let exe = std::fs::read_link(process.path().join("exe")).unwrap();
    assert_eq!(exe.file_name().unwrap(), "etcd", "{}", exe.display());
    let proc_status = std::fs::read_to_string(process.path().join("status")).unwrap();
    assert!(
        proc_status
            .lines()
            .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("65532")),
        "{proc_status}"
    );
    // A real client at the pod's client port: the member is named after its pod, with the
    // peer URL of the headless Service's name; it stores and reads.
    let connection = [format!("--endpoints=http://{ip}:2379")];
    let connection: Vec<&str> = connection.iter().map(String::as_str).collect();
    let members = chart::etcdctl(&tools, &connection, &["member", "list"])
        .await
        .unwrap();
    let listed = String::from_utf8_lossy(&members.stdout);
    assert!(
        listed.contains(&format!(
            "{member}, http://{member}.{RELEASE}-store-peers.{NS}.svc:2380"
        )),
        "{listed}{}",
        String::from_utf8_lossy(&members.stderr)
    );
    let put = chart::etcdctl(&tools, &connection, &["put", "/kontinuum.sh/probe", "ok"])
        .await
        .unwrap();
    assert!(put.status.success(), "{put:?}");
    let get = chart::etcdctl(
        &tools,
        &connection,
        &["get", "--print-value-only", "/kontinuum.sh/probe"],
    )
    .await
    .unwrap();
    assert_eq!(String::from_utf8_lossy(&get.stdout).trim(), "ok");

    helm(
        &tools,
        hub.kubeconfig_path(),
        &helm_home,
        &["uninstall", RELEASE, "--namespace", NS, "--wait"],
    )
    .await;
    eventually(LIMIT, "the store's process stopped", || async {
        Ok(!process.path().exists())
    })
    .await
    .unwrap();
    hub.stop().await;
}
