//! Kontinuum installed as users install it: `helm install` (the real helm) of
//! `charts/kontinuum` onto a real hub whose only node is a hostlet, which runs the chart's
//! pods as real processes. Every operator runs from its own Deployment on its own
//! ServiceAccount token (in-cluster config: nothing started by hand, no admin credentials);
//! a TalosCluster goes from emulated machines in maintenance mode to `Ready` with the
//! fixture charts; `helm upgrade` rolls the Deployments and the new pods take the Leases;
//! each ServiceAccount is refused what it has no business doing; `helm uninstall` stops
//! every process.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::large_futures,
    clippy::too_many_lines
)]

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::authorization::v1::SubjectAccessReview;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kontinuum_e2e::addons::ChartRepo;
use kontinuum_e2e::bootstrapper::{create_cluster, create_instance, wait_cluster};
use kontinuum_e2e::testbed::{ControlPlane, ControlPlaneConfig, HostletConfig, Tools, unique_dir};
use kontinuum_e2e::{
    audit_writes, eventually, install_kontinuum_crds, service_account_user, workspace_binary,
};
use kube::api::{Api, ListParams, PostParams};
use kube::{Client, ResourceExt as _};
use talos_emulator::{Emulator, Settings};

const LIMIT: Duration = Duration::from_secs(240);
const RELEASE: &str = "kontinuum";
const OPERATORS: [&str; 4] = [
    "instance-discovery",
    "pool-claimer",
    "talos-bootstrapper",
    "addon-installer",
];

/// The hostlet's image map: the chart's image (`kontinuum`, any tag) holds the workspace's
/// operator binaries and the test bed's helm at their in-image paths.
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
    let path = dir.join("images.yaml");
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(&path, map).unwrap();
    path
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
    let mut found = BTreeMap::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(environ) = std::fs::read(entry.path().join("environ")) else {
            continue;
        };
        if environ.split(|b| *b == 0).any(|kv| kv == needle.as_bytes()) {
            let exe = std::fs::read_link(entry.path().join("exe"))
                .map(|p| {
                    p.file_name()
                        .unwrap_or_default()
                        .to_string_lossy()
                        .into_owned()
                })
                .unwrap_or_default();
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_install_runs_the_operators_for_real_and_a_cluster_becomes_ready() {
    kontinuum_e2e::testbed::install_crypto_provider();
    let tools = Tools::locate().unwrap();
    let dir = unique_dir("chart-install");
    // A hub of its own whose only node is a hostlet: every pod of the chart runs for real.
    let mut config = ControlPlaneConfig::new(dir.join("hub"));
    config.address = Ipv4Addr::new(127, 98, 0, 1).into();
    config.nodes = Vec::new();
    let mut hub = ControlPlane::start(&tools, config).await.unwrap();
    let mut hostlet = HostletConfig::new(
        "hub-node",
        Ipv4Addr::new(127, 98, 0, 2),
        image_map(&dir, &tools),
        workspace_binary("hostlet").unwrap(),
    );
    hostlet.pod_cidr = Some("127.98.1.0/24".into());
    hostlet.initial_backoff_seconds = Some(1);
    hub.start_hostlet(&hostlet).await.unwrap();
    let client = hub.client();
    let kubeconfig = hub.kubeconfig_path().to_path_buf();
    let helm_home = dir.join("helm");
    let repo = ChartRepo::serve(&tools).await.unwrap();
    let ns = "kontinuum-system";

    // 1. helm install, as a user would, with test-friendly intervals.
    let started = Instant::now();
    let mirror = format!("operators.addonInstaller.chartMirror={}", repo.url);
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
    assert_eq!(
        binaries,
        [
            "addon-installer",
            "instance-discovery",
            "pool-claimer",
            "talos-bootstrapper"
        ],
        "{processes:?}"
    );
    for pid in processes.keys() {
        let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
        assert!(
            !environ
                .split(|b| *b == 0)
                .any(|kv| kv.starts_with(b"KUBECONFIG=")),
            "pid {pid} has a KUBECONFIG"
        );
    }

    // 2. A TalosCluster from emulated machines to Ready, through the installed operators.
    install_kontinuum_crds(&client).await.unwrap();
    let flow = "flow";
    let ns_obj: k8s_openapi::api::core::v1::Namespace =
        serde_json::from_value(serde_json::json!({ "metadata": { "name": flow } })).unwrap();
    Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns_obj)
        .await
        .unwrap();
    let first = Ipv4Addr::new(127, 99, 0, 1);
    let emulator = Emulator::start(Settings {
        machines: 1,
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
    let created = Instant::now();
    create_cluster(&client, flow, "eu-9a", 1, 0, false)
        .await
        .unwrap();
    wait_cluster(&client, flow, "eu-9a", "Ready", "True", LIMIT)
        .await
        .unwrap();
    eprintln!(
        "TalosCluster creation to Ready through the chart's pods: {:?}",
        created.elapsed()
    );
    // The writes came from the operators' own ServiceAccounts (the audit log's users).
    for op in OPERATORS {
        let writes = audit_writes(
            &hub.audit_log(),
            &service_account_user(ns, &format!("{RELEASE}-{op}")),
        )
        .unwrap();
        assert!(
            !writes.is_empty(),
            "{op} wrote nothing as its ServiceAccount"
        );
    }

    // 3. RBAC: each ServiceAccount is refused what it has no business doing, and allowed
    //    what it needs (so a broken review cannot pass for a refusal).
    let cases = [
        (
            "instance-discovery",
            "patch",
            "kontinuum.sh",
            "instances/status",
            true,
        ),
        (
            "instance-discovery",
            "create",
            "kontinuum.sh",
            "talosclusters",
            false,
        ),
        (
            "instance-discovery",
            "update",
            "kontinuum.sh",
            "talosclusters",
            false,
        ),
        ("instance-discovery", "get", "", "secrets", false),
        (
            "instance-discovery",
            "patch",
            "kontinuum.sh",
            "instances",
            false,
        ),
        ("pool-claimer", "patch", "kontinuum.sh", "instances", true),
        ("pool-claimer", "get", "", "secrets", false),
        ("pool-claimer", "delete", "kontinuum.sh", "instances", false),
        ("pool-claimer", "create", "kontinuum.sh", "addons", false),
        ("talos-bootstrapper", "create", "", "secrets", true),
        ("talos-bootstrapper", "delete", "", "namespaces", false),
        (
            "talos-bootstrapper",
            "create",
            "kontinuum.sh",
            "zones",
            false,
        ),
        (
            "talos-bootstrapper",
            "create",
            "rbac.authorization.k8s.io",
            "clusterrolebindings",
            false,
        ),
        (
            "addon-installer",
            "patch",
            "kontinuum.sh",
            "addons/status",
            true,
        ),
        ("addon-installer", "create", "", "secrets", false),
        (
            "addon-installer",
            "update",
            "kontinuum.sh",
            "talosclusters",
            false,
        ),
        (
            "addon-installer",
            "patch",
            "kontinuum.sh",
            "instances",
            false,
        ),
    ];
    for (op, verb, group, resource, expected) in cases {
        let sa = format!("{RELEASE}-{op}");
        assert_eq!(
            can(&client, ns, &sa, verb, group, resource, flow).await,
            expected,
            "{sa} {verb} {group}/{resource}"
        );
    }

    // 4. helm upgrade with a changed value: every Deployment rolls, and each new pod takes
    //    over its operator's Lease.
    let before = ready_pods(&client, ns).await;
    let mut upgrade_args = install_args.to_vec();
    upgrade_args[0] = "upgrade";
    upgrade_args.retain(|a| *a != "--create-namespace");
    upgrade_args.extend(["--set", "logLevel=debug"]);
    helm(&tools, &kubeconfig, &helm_home, &upgrade_args).await;
    let leases: Api<Lease> = Api::namespaced(client.clone(), ns);
    eventually(LIMIT, "new pods Ready and holding the Leases", || async {
        let now = ready_pods(&client, ns).await;
        for op in OPERATORS {
            let (Some(old), Some(new)) = (before.get(op), now.get(op)) else {
                return Ok(false);
            };
            let Some((pod, hash)) = new.first() else {
                return Ok(false);
            };
            if old.iter().any(|(_, h)| h == hash) {
                return Ok(false);
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
    let after = pod_processes(ns);
    assert_eq!(after.len(), OPERATORS.len(), "{after:?}");
    assert!(
        after.keys().all(|pid| !processes.contains_key(pid)),
        "the old processes were replaced: {processes:?} -> {after:?}"
    );
    // The cluster stays Ready across the rollout.
    wait_cluster(&client, flow, "eu-9a", "Ready", "True", LIMIT)
        .await
        .unwrap();

    // 5. helm uninstall stops every process.
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
    emulator.shutdown().await;
    hub.stop().await;
}
