//! The Node object and its Lease, as a kubelet keeps them: registered with labels, taints,
//! capacity and addresses, `Ready`, the Lease in `kube-node-lease` renewed every 10 s and
//! the status heartbeat posted every minute.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};

use crate::{Error, HostletConfig, api};

/// The Lease's namespace.
pub const LEASE_NAMESPACE: &str = "kube-node-lease";
/// The Lease's duration (the node controller's grace period in the test bed is 40 s).
pub const LEASE_DURATION_SECONDS: i32 = 40;
/// How often the Lease is renewed.
pub const RENEW_PERIOD: Duration = Duration::from_secs(10);
/// How often the Node's status is posted even when nothing changed.
pub const STATUS_PERIOD: Duration = Duration::from_secs(60);

/// The Node object (metadata and spec) the hostlet registers. Deliberately without KWOK's
/// `kwok.x-k8s.io/node` annotation, so KWOK leaves the node and its pods alone.
pub fn node_object(config: &HostletConfig) -> Node {
    let mut labels = serde_json::Map::new();
    for (k, v) in [
        ("kubernetes.io/hostname", config.node_name.as_str()),
        ("kubernetes.io/os", "linux"),
        ("kubernetes.io/arch", arch()),
        ("type", "hostlet"),
    ] {
        labels.insert(k.into(), v.into());
    }
    for (k, v) in &config.labels {
        labels.insert(k.clone(), v.clone().into());
    }
    let taints: Vec<serde_json::Value> = config
        .taints
        .iter()
        .map(|(key, value, effect)| {
            let mut t = serde_json::json!({ "key": key, "effect": effect });
            if !value.is_empty() {
                t["value"] = value.clone().into();
            }
            t
        })
        .collect();
    let value = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": config.node_name,
            "labels": labels,
            "annotations": { "node.alpha.kubernetes.io/ttl": "0" },
        },
        "spec": { "taints": taints },
    });
    serde_json::from_value(value).unwrap_or_default()
}

/// The Node status the hostlet reports.
pub fn node_status(
    config: &HostletConfig,
    version: &str,
    since: &str,
    now: &str,
) -> serde_json::Value {
    let capacity = serde_json::json!({
        "cpu": config.cpu,
        "memory": config.memory,
        "pods": config.max_pods.to_string(),
        "ephemeral-storage": "1Ti",
    });
    let condition = |type_: &str, status: &str, reason: &str, message: &str| {
        serde_json::json!({
            "type": type_, "status": status, "reason": reason, "message": message,
            "lastHeartbeatTime": now, "lastTransitionTime": since,
        })
    };
    serde_json::json!({
        "status": {
            "capacity": capacity,
            "allocatable": capacity,
            "conditions": [
                condition("MemoryPressure", "False", "KubeletHasSufficientMemory", "hostlet has sufficient memory available"),
                condition("DiskPressure", "False", "KubeletHasNoDiskPressure", "hostlet has no disk pressure"),
                condition("PIDPressure", "False", "KubeletHasSufficientPID", "hostlet has sufficient PID available"),
                condition("Ready", "True", "KubeletReady", "hostlet is posting ready status"),
            ],
            "addresses": [
                { "type": "InternalIP", "address": config.node_ip.to_string() },
                { "type": "Hostname", "address": config.node_name },
            ],
            "daemonEndpoints": { "kubeletEndpoint": { "Port": 0 } },
            "nodeInfo": {
                "machineID": config.node_name,
                "systemUUID": config.node_name,
                "bootID": "",
                "kernelVersion": "",
                "osImage": "hostlet",
                "containerRuntimeVersion": concat!("hostlet://", env!("CARGO_PKG_VERSION")),
                "kubeletVersion": version,
                "kubeProxyVersion": "",
                "operatingSystem": "linux",
                "architecture": arch(),
            },
        }
    })
}

/// The Go name of this machine's architecture.
fn arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

fn now() -> String {
    jiff::Timestamp::from_second(jiff::Timestamp::now().as_second())
        .unwrap_or_else(|_| jiff::Timestamp::now())
        .to_string()
}

/// Creates (or updates) the Node and posts a Ready status; one attempt.
pub async fn register(client: &Client, config: &HostletConfig) -> Result<(), Error> {
    let nodes: Api<Node> = Api::all(client.clone());
    let name = &config.node_name;
    let wanted = node_object(config);
    let existing = api::call(format!("reading node {name}"), nodes.get_opt(name)).await?;
    if existing.is_some() {
        let patch = serde_json::json!({
            "metadata": { "labels": wanted.metadata.labels },
            "spec": { "taints": wanted.spec.as_ref().and_then(|s| s.taints.clone()).unwrap_or_default() },
        });
        api::call(
            format!("updating node {name}"),
            nodes.patch(name, &PatchParams::default(), &Patch::Merge(&patch)),
        )
        .await?;
    } else {
        api::call(
            format!("creating node {name}"),
            nodes.create(&PostParams::default(), &wanted),
        )
        .await?;
    }
    let version = api::call("reading the server version", client.apiserver_version())
        .await
        .map(|v| v.git_version)
        .unwrap_or_default();
    let now = now();
    post_status(client, config, &version, &now, &now).await?;
    renew_lease(client, config).await
}

async fn post_status(
    client: &Client,
    config: &HostletConfig,
    version: &str,
    since: &str,
    now: &str,
) -> Result<(), Error> {
    let nodes: Api<Node> = Api::all(client.clone());
    let status = node_status(config, version, since, now);
    api::call(
        format!("posting the status of node {}", config.node_name),
        nodes.patch_status(
            &config.node_name,
            &PatchParams::default(),
            &Patch::Merge(&status),
        ),
    )
    .await
    .map(|_| ())
}

/// Retries [`register`] with back-off (1 s doubling to 30 s) until it succeeds.
pub async fn register_until_done(client: &Client, config: &HostletConfig) {
    let mut delay = Duration::from_secs(1);
    loop {
        match register(client, config).await {
            Ok(()) => {
                tracing::info!(node = %config.node_name, "registered node");
                return;
            }
            Err(err) => {
                tracing::warn!(node = %config.node_name, error = &err as &dyn std::error::Error, "registering node failed; retrying");
            }
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(30));
    }
}

/// Creates or renews the node's Lease.
pub async fn renew_lease(client: &Client, config: &HostletConfig) -> Result<(), Error> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), LEASE_NAMESPACE);
    let name = &config.node_name;
    let renew = jiff::Timestamp::now();
    let patch = serde_json::json!({
        "spec": {
            "holderIdentity": name,
            "leaseDurationSeconds": LEASE_DURATION_SECONDS,
            "renewTime": k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(renew),
        }
    });
    let result = api::call(
        format!("renewing lease {name}"),
        leases.patch(name, &PatchParams::default(), &Patch::Merge(&patch)),
    )
    .await;
    match result {
        Ok(_) => Ok(()),
        Err(e) if e.is_not_found() => {
            let nodes: Api<Node> = Api::all(client.clone());
            let node = api::call(format!("reading node {name}"), nodes.get(name)).await?;
            let mut lease = patch;
            lease["metadata"] = serde_json::json!({
                "name": name,
                "namespace": LEASE_NAMESPACE,
                "ownerReferences": [{
                    "apiVersion": "v1", "kind": "Node", "name": name,
                    "uid": node.metadata.uid.unwrap_or_default(),
                }],
            });
            let lease: Lease = serde_json::from_value(lease).unwrap_or_default();
            api::call(
                format!("creating lease {name}"),
                leases.create(&PostParams::default(), &lease),
            )
            .await
            .map(|_| ())
        }
        Err(e) => Err(e),
    }
}

/// Renews the Lease every [`RENEW_PERIOD`] and posts the Node status every
/// [`STATUS_PERIOD`], forever; failures are logged and retried on the next tick.
pub async fn heartbeat(client: Client, config: HostletConfig) {
    let since = now();
    let version = api::call("reading the server version", client.apiserver_version())
        .await
        .map(|v| v.git_version)
        .unwrap_or_default();
    let mut ticks: u64 = 0;
    let per_status = STATUS_PERIOD.as_secs() / RENEW_PERIOD.as_secs();
    loop {
        tokio::time::sleep(RENEW_PERIOD).await;
        ticks += 1;
        if let Err(err) = renew_lease(&client, &config).await {
            tracing::warn!(node = %config.node_name, error = &err as &dyn std::error::Error, "renewing the node lease failed");
        }
        if ticks.is_multiple_of(per_status)
            && let Err(err) = post_status(&client, &config, &version, &since, &now()).await
        {
            tracing::warn!(node = %config.node_name, error = &err as &dyn std::error::Error, "posting the node status failed");
        }
    }
}
