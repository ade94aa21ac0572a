//! The nodes of a bootstrapped cluster are hostlet nodes by default: our image runs for real
//! in the downstream cluster, other images are pretended Running/Ready, workers join and leave
//! with hostlets of their own, and a restarted emulator brings the node back.
//!
//! Needs the test-bed binaries (KONTINUUM_TESTBED_BIN) and the hostlet built next to this
//! test (`cargo build -p kontinuum-hostlet`; `cargo test --workspace` builds it).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::too_many_lines
)]

mod support;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod};
use kontinuum_talos::{ApplyMode, BootstrapOutcome, ResetOptions, TalosClient};
use kontinuum_talos_config::{MachineType, SecretsBundle};
use kube::api::{Api, ListParams, PostParams};
use kube::runtime::wait::await_condition;
use kube::{Client, ResourceExt as _};
use support::{config, configured, identity, ip, maintenance, new_bundle};
use talos_emulator::{Emulator, NodeSettings, Settings};

const WAIT: Duration = Duration::from_secs(120);

/// Applies a control-plane config, bootstraps, returns the admin client and a kube client.
async fn bring_up(cp: SocketAddr, bundle: &SecretsBundle, hostname: &str) -> (TalosClient, Client) {
    maintenance(cp)
        .await
        .apply_configuration(
            config(bundle, MachineType::ControlPlane, hostname, ip(cp)),
            ApplyMode::Auto,
        )
        .await
        .unwrap();
    let admin = configured(cp, &identity(bundle)).await;
    assert_eq!(
        admin.bootstrap().await.unwrap(),
        BootstrapOutcome::Bootstrapped
    );
    let kubeconfig = admin.kubeconfig().await.unwrap();
    let kubeconfig = String::from_utf8(kubeconfig.as_bytes().to_vec()).unwrap();
    // The API server answers once the control plane has started.
    let client = kontinuum_testbed::client_from(&kubeconfig).await.unwrap();
    (admin, client)
}

/// Waits (watching) until `name` exists and `check` holds for it.
async fn wait_for<K>(api: &Api<K>, name: &str, what: &str, check: impl Fn(&K) -> bool)
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
{
    let started = Instant::now();
    loop {
        // The API server may not answer yet right after Bootstrap: retry the watch.
        let waited = tokio::time::timeout(
            WAIT.saturating_sub(started.elapsed()),
            await_condition(api.clone(), name, |o: Option<&K>| o.is_some_and(&check)),
        )
        .await;
        match waited {
            Ok(Ok(_)) => return,
            Ok(Err(_)) if started.elapsed() < WAIT => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            _ => panic!("{what} not reached in {WAIT:?}"),
        }
    }
}

fn is_hostlet_node(node: &Node, address: Ipv4Addr) -> bool {
    let kwok = node
        .annotations()
        .contains_key(kontinuum_testbed::KWOK_NODE_ANNOTATION);
    let internal_ip = node
        .status
        .as_ref()
        .and_then(|s| s.addresses.as_ref())
        .and_then(|a| a.iter().find(|a| a.type_ == "InternalIP"))
        .map(|a| a.address.clone());
    !kwok
        && node.labels().get("type").map(String::as_str) == Some("hostlet")
        && internal_ip == Some(address.to_string())
}

/// Processes whose command line holds every one of `args`.
fn processes_with_args(wanted: &[String]) -> Vec<u32> {
    pids_where(|pid| {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let argv: Vec<String> = cmdline
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        wanted.iter().all(|w| argv.contains(w))
    })
}

/// Hostlet processes running the node `name` at `address`.
fn hostlets(name: &str, address: Ipv4Addr) -> Vec<u32> {
    processes_with_args(&[
        format!("--node-name={name}"),
        format!("--node-ip={address}"),
    ])
}

/// Processes whose environment holds `entry` (`KEY=value`).
fn processes_with_env(entry: &str) -> Vec<u32> {
    pids_where(|pid| {
        std::fs::read(format!("/proc/{pid}/environ"))
            .unwrap_or_default()
            .split(|b| *b == 0)
            .any(|e| e == entry.as_bytes())
    })
}

fn pids_where(keep: impl Fn(u32) -> bool) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| keep(*pid))
        .collect()
}

fn deployment(name: &str, image: &str, command: &[&str], args: &[&str]) -> Deployment {
    serde_json::from_value(serde_json::json!({
        "metadata": { "name": name, "namespace": "default" },
        "spec": {
            "replicas": 1,
            "selector": { "matchLabels": { "app": name } },
            "template": {
                "metadata": { "labels": { "app": name } },
                "spec": {
                    "containers": [{
                        "name": "main",
                        "image": image,
                        "command": command,
                        "args": args,
                        "env": [
                            { "name": "POD_NAME", "valueFrom": { "fieldRef": { "fieldPath": "metadata.name" } } },
                            { "name": "POD_IP", "valueFrom": { "fieldRef": { "fieldPath": "status.podIP" } } }
                        ],
                        "ports": [{ "containerPort": 50000 }],
                        "readinessProbe": { "tcpSocket": { "port": 50000 }, "periodSeconds": 1 },
                        "volumeMounts": [{ "name": "tmp", "mountPath": "/tmp" }]
                    }],
                    "volumes": [{ "name": "tmp", "emptyDir": {} }]
                }
            }
        }
    }))
    .unwrap()
}

/// The one pod of the Deployment `app`.
async fn pod_of(client: &Client, app: &str) -> Pod {
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let mut list = pods
        .list(&ListParams::default().labels(&format!("app={app}")))
        .await
        .unwrap()
        .items;
    assert_eq!(list.len(), 1, "{list:?}");
    list.remove(0)
}

fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn machines_are_hostlet_nodes_running_our_image_for_real() {
    kontinuum_testbed::Tools::locate().expect("test-bed binaries (KONTINUUM_TESTBED_BIN)");
    let bin_dir = talos_emulator::nodes::binary_dir().unwrap();
    assert!(
        bin_dir.join("hostlet").is_file(),
        "{}/hostlet is not built; run `cargo build -p kontinuum-hostlet`",
        bin_dir.display()
    );
    let started = Instant::now();
    let dir: PathBuf = kontinuum_testbed::unique_dir("emulator-hostlet");
    let settings = Settings {
        machines: 2,
        first_address: Ipv4Addr::new(127, 64, 0, 1),
        port: 0,
        api_port: 0,
        dir: dir.clone(),
        control_addr: None,
    };
    let emulator = Emulator::start(settings.clone()).await.unwrap();
    let addrs = emulator.addresses();
    let (cp, w) = (addrs[0], addrs[1]);
    let bundle = new_bundle();
    let (admin, client) = bring_up(cp, &bundle, "cp-h").await;

    // The control plane's node: a hostlet node on the machine's address, Ready.
    let nodes: Api<Node> = Api::all(client.clone());
    wait_for(
        &nodes,
        "cp-h",
        "node cp-h Ready",
        kontinuum_testbed::node_is_ready,
    )
    .await;
    let node = nodes.get("cp-h").await.unwrap();
    assert!(is_hostlet_node(&node, ip(cp)), "{node:?}");
    assert_eq!(hostlets("cp-h", ip(cp)).len(), 1);
    let node_up = started.elapsed();

    // Our image runs for real: a Talos emulator inside the cluster, Ready by its probe.
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "default");
    let real = deployment(
        "real",
        "kontinuum:test",
        &["/usr/local/bin/talos-emulator"],
        &[
            "--machines=1",
            "--first-address=$(POD_IP)",
            "--port=50000",
            "--dir=/tmp/emulator",
            "--control-addr=$(POD_IP):0",
            "--node-agent=kwok",
        ],
    );
    // Any other image is pretended Running/Ready, as KWOK did.
    let pretended = deployment(
        "pretended",
        "registry.example/cilium:1",
        &["cilium-agent"],
        &[],
    );
    for d in [&real, &pretended] {
        deployments.create(&PostParams::default(), d).await.unwrap();
    }
    for name in ["real", "pretended"] {
        wait_for(
            &deployments,
            name,
            "Deployment available",
            |d: &Deployment| {
                d.status
                    .as_ref()
                    .and_then(|s| s.available_replicas)
                    .unwrap_or(0)
                    == 1
            },
        )
        .await;
    }
    let pod = pod_of(&client, "real").await;
    assert!(pod_ready(&pod));
    let status = pod.status.clone().unwrap();
    assert_eq!(status.host_ip.as_deref(), Some(ip(cp).to_string().as_str()));
    let pod_ip: Ipv4Addr = status.pod_ip.unwrap().parse().unwrap();
    assert_eq!(
        pod_ip.octets()[..3],
        [127, 64, 128],
        "machine 0's pod range 127.64.128.0/26: {pod_ip}"
    );
    let pids = processes_with_env(&format!("POD_NAME={}", pod.name_any()));
    assert_eq!(pids.len(), 1, "one real process for pod {}", pod.name_any());
    let argv0 = std::fs::read(format!("/proc/{}/cmdline", pids[0])).unwrap();
    assert!(argv0.starts_with(b"/usr/local/bin/talos-emulator\0"));
    // And it is really our emulator, answering Talos on the pod's address.
    let inner = maintenance(SocketAddr::new(IpAddr::V4(pod_ip), 50000)).await;
    assert_eq!(
        inner.version().await.unwrap().tag,
        talos_emulator::TALOS_TAG
    );
    let pretend = pod_of(&client, "pretended").await;
    assert!(pod_ready(&pretend), "{pretend:?}");
    assert!(processes_with_env(&format!("POD_NAME={}", pretend.name_any())).is_empty());
    let pods_up = started.elapsed();

    // A worker joins with a hostlet node of its own; a reset stops it and removes the node.
    maintenance(w)
        .await
        .apply_configuration(
            config(&bundle, MachineType::Worker, "worker-h", ip(cp)),
            ApplyMode::Auto,
        )
        .await
        .unwrap();
    wait_for(&nodes, "worker-h", "node worker-h Ready", |n: &Node| {
        kontinuum_testbed::node_is_ready(n) && is_hostlet_node(n, ip(w))
    })
    .await;
    assert_eq!(hostlets("worker-h", ip(w)).len(), 1);
    admin
        .health_check(
            Duration::from_secs(60),
            &[cp.ip().to_string()],
            &[w.ip().to_string()],
            |_| {},
        )
        .await
        .unwrap();
    configured(w, &identity(&bundle))
        .await
        .reset(&ResetOptions::to_maintenance(true))
        .await
        .unwrap();
    assert!(nodes.get_opt("worker-h").await.unwrap().is_none());
    assert!(hostlets("worker-h", ip(w)).is_empty());
    let worker_cycle = started.elapsed();

    // Shutdown stops the control plane's hostlet and its pods; a restart brings it back.
    emulator.shutdown().await;
    assert!(hostlets("cp-h", ip(cp)).is_empty());
    assert!(processes_with_env(&format!("POD_NAME={}", pod.name_any())).is_empty());
    let emulator = Emulator::start(settings).await.unwrap();
    let cp = emulator.addresses()[0]; // a new Talos port (port 0), the same address
    let admin = configured(cp, &identity(&bundle)).await;
    let kubeconfig = admin.kubeconfig().await.unwrap();
    let client =
        kontinuum_testbed::client_from(std::str::from_utf8(kubeconfig.as_bytes()).unwrap())
            .await
            .unwrap();
    let nodes: Api<Node> = Api::all(client);
    wait_for(&nodes, "cp-h", "node cp-h Ready again", |n: &Node| {
        kontinuum_testbed::node_is_ready(n) && is_hostlet_node(n, ip(cp))
    })
    .await;
    assert_eq!(hostlets("cp-h", ip(cp)).len(), 1);
    // The cluster is up as the emulator sees it (so that shutdown stops it gracefully).
    admin
        .health_check(Duration::from_secs(60), &[cp.ip().to_string()], &[], |_| {})
        .await
        .unwrap();
    emulator.shutdown().await;
    assert!(hostlets("cp-h", ip(cp)).is_empty());
    eprintln!(
        "hostlet node Ready {node_up:?}; real and pretended pods Ready {pods_up:?}; \
         worker joined and left {worker_cycle:?}; restarted {:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_the_hostlet_binary_machines_are_kwok_nodes() {
    kontinuum_testbed::Tools::locate().expect("test-bed binaries (KONTINUUM_TESTBED_BIN)");
    let emulator = Emulator::start_with(
        Settings {
            machines: 1,
            first_address: Ipv4Addr::new(127, 65, 0, 1),
            port: 0,
            api_port: 0,
            dir: kontinuum_testbed::unique_dir("emulator-kwok"),
            control_addr: None,
        },
        NodeSettings {
            hostlet_binary: Some(PathBuf::from("/nonexistent/hostlet")),
            ..NodeSettings::default()
        },
    )
    .await
    .unwrap();
    let cp = emulator.addresses()[0];
    let (_admin, client) = bring_up(cp, &new_bundle(), "cp-k").await;
    let nodes: Api<Node> = Api::all(client);
    wait_for(
        &nodes,
        "cp-k",
        "node cp-k Ready",
        kontinuum_testbed::node_is_ready,
    )
    .await;
    let node = nodes.get("cp-k").await.unwrap();
    assert_eq!(
        node.annotations()
            .get(kontinuum_testbed::KWOK_NODE_ANNOTATION)
            .map(String::as_str),
        Some("fake")
    );
    emulator.shutdown().await;
}
