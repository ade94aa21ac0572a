//! talos-bootstrapper test support: the ClusterRole with the chart's rules for it, and a rig that
//! runs a zone's hub objects (Instances, InstancePools, a TalosCluster) against the Talos
//! emulator with instance-discovery, pool-claimer and talos-bootstrapper as processes.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;
use k8s_openapi::api::core::v1::Secret;
use kontinuum_crds::conditions;
use kontinuum_crds::v1alpha2::{Addon, Instance, InstancePool, TalosCluster};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt as _};

use crate::{Operator, eventually, service_account_kubeconfig, testbed};

/// ClusterRole holding the rules the chart (`charts/kontinuum`) gives talos-bootstrapper.
pub const TALOS_BOOTSTRAPPER_ROLE: &str = "kontinuum-talos-bootstrapper-e2e";

/// Creates (or updates) [`TALOS_BOOTSTRAPPER_ROLE`] and the roles of
/// [`crate::install_operator_roles`], from the chart's rendered RBAC (`helm template`).
pub async fn install_role(client: &Client) -> anyhow::Result<()> {
    crate::chart::apply_operator_cluster_roles(
        client,
        &[
            ("instance-discovery", crate::INSTANCE_DISCOVERY_ROLE),
            ("pool-claimer", crate::POOL_CLAIMER_ROLE),
            ("talos-bootstrapper", TALOS_BOOTSTRAPPER_ROLE),
        ],
    )
    .await
}

/// Creates Instance `name` dialled at `address`, labelled `role=<role>`.
pub async fn create_instance(
    client: &Client,
    ns: &str,
    name: &str,
    address: Ipv4Addr,
    role: &str,
) -> anyhow::Result<()> {
    let instance: Instance = serde_json::from_value(serde_json::json!({
        "apiVersion": "kontinuum.sh/v1alpha2", "kind": "Instance",
        "metadata": { "name": name, "labels": { "role": role } },
        "spec": { "interfaces": [address.to_string()] }
    }))?;
    Api::<Instance>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &instance)
        .await
        .with_context(|| format!("creating Instance {name}"))?;
    Ok(())
}

/// The TalosCluster `name` with a control-plane pool of `control_planes` and, when
/// `workers > 0`, one worker pool `w` of `workers`; pools select Instances by `role`
/// label. The pools are owned by the cluster, as the zone fan-out makes them.
pub async fn create_cluster(
    client: &Client,
    ns: &str,
    name: &str,
    control_planes: i32,
    workers: i32,
    unregister: bool,
) -> anyhow::Result<TalosCluster> {
    create_cluster_with(
        client,
        ns,
        name,
        control_planes,
        workers,
        unregister,
        |_| {},
    )
    .await
}

/// As [`create_cluster`], with the TalosCluster's spec (JSON) changed by `edit` first (e.g.
/// machine-config patches added).
pub async fn create_cluster_with(
    client: &Client,
    ns: &str,
    name: &str,
    control_planes: i32,
    workers: i32,
    unregister: bool,
    edit: impl FnOnce(&mut serde_json::Value),
) -> anyhow::Result<TalosCluster> {
    let mut spec = serde_json::json!({
        "controlPlane": { "poolRef": { "name": format!("{name}-cp") } },
        "talos": { "version": "v1.13.0" },
        "teardown": { "unregisterInstances": unregister },
    });
    if workers > 0 {
        spec["workers"] =
            serde_json::json!([{ "name": "w", "poolRef": { "name": format!("{name}-w") } }]);
    }
    edit(&mut spec);
    let cluster: TalosCluster = serde_json::from_value(serde_json::json!({
        "apiVersion": "kontinuum.sh/v1alpha2", "kind": "TalosCluster",
        "metadata": { "name": name },
        "spec": spec,
    }))?;
    let cluster = Api::<TalosCluster>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &cluster)
        .await
        .context("creating the TalosCluster")?;
    let owner = serde_json::json!([{
        "apiVersion": "kontinuum.sh/v1alpha2", "kind": "TalosCluster",
        "name": name, "uid": cluster.uid(), "controller": true, "blockOwnerDeletion": true
    }]);
    let pools: Api<InstancePool> = Api::namespaced(client.clone(), ns);
    for (suffix, role, replicas) in [("cp", "cp", control_planes), ("w", "worker", workers)] {
        if replicas == 0 {
            continue;
        }
        let pool: InstancePool = serde_json::from_value(serde_json::json!({
            "apiVersion": "kontinuum.sh/v1alpha2", "kind": "InstancePool",
            "metadata": { "name": format!("{name}-{suffix}"), "ownerReferences": owner },
            "spec": { "replicas": replicas, "selector": { "matchLabels": { "role": role } } }
        }))?;
        pools
            .create(&PostParams::default(), &pool)
            .await
            .with_context(|| format!("creating InstancePool {name}-{suffix}"))?;
    }
    Ok(cluster)
}

/// Sets an Addon's `Ready` condition, as the addon-installer would (status only).
pub async fn set_addon_ready(
    client: &Client,
    ns: &str,
    name: &str,
    ready: bool,
) -> anyhow::Result<()> {
    let (status, reason, message) = if ready {
        ("True", "Ready", "installed and healthy")
    } else {
        (
            "False",
            "NotHealthy",
            "kube-system/example-0 is Running but not Ready",
        )
    };
    let patch = serde_json::json!({
        "apiVersion": "kontinuum.sh/v1alpha2", "kind": "Addon",
        "status": { "conditions": [{
            "type": "Ready", "status": status, "reason": reason, "message": message,
            "lastTransitionTime": k8s_openapi::jiff::Timestamp::now().to_string(),
        }]}
    });
    Api::<Addon>::namespaced(client.clone(), ns)
        .patch_status(
            name,
            &PatchParams::apply("addon-stand-in.e2e").force(),
            &Patch::Apply(&patch),
        )
        .await
        .with_context(|| format!("setting Addon {name} Ready={ready}"))?;
    Ok(())
}

/// Marks every Addon of `ns` `Ready` the moment a watch sees it not Ready, until dropped:
/// the stand-in for the addon-installer in tests and benchmarks that prove the
/// bootstrapper alone (the operators coordinate only through this status).
pub struct AddonsReady(tokio::task::JoinHandle<()>);

impl AddonsReady {
    /// Starts watching and marking.
    pub fn start(client: Client, ns: String) -> Self {
        use futures::TryStreamExt as _;
        use kube::runtime::{WatchStreamExt as _, watcher};
        Self(tokio::spawn(async move {
            let api: Api<Addon> = Api::namespaced(client.clone(), &ns);
            let stream = watcher(api, watcher::Config::default())
                .default_backoff()
                .applied_objects();
            let mut stream = std::pin::pin!(stream);
            while let Ok(Some(addon)) = stream.try_next().await {
                let ready = addon
                    .status
                    .as_ref()
                    .is_some_and(|s| conditions::is_true(&s.conditions, "Ready"));
                if !ready && addon.metadata.deletion_timestamp.is_none() {
                    let _ = set_addon_ready(&client, &ns, &addon.name_any(), true).await;
                }
            }
        }))
    }
}

impl Drop for AddonsReady {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A condition of a TalosCluster: `(status, reason, message)`.
pub async fn cluster_condition(
    client: &Client,
    ns: &str,
    name: &str,
    type_: &str,
) -> Option<(String, String, String)> {
    let cluster = Api::<TalosCluster>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .ok()?;
    let c = conditions::get(&cluster.status?.conditions, type_)?.clone();
    Some((c.status, c.reason, c.message))
}

/// Waits until the cluster's condition `type_` has `status`.
pub async fn wait_cluster(
    client: &Client,
    ns: &str,
    name: &str,
    type_: &str,
    status: &str,
    limit: Duration,
) -> anyhow::Result<()> {
    let waited = eventually(
        limit,
        &format!("TalosCluster {name} {type_}={status}"),
        || async {
            Ok(cluster_condition(client, ns, name, type_)
                .await
                .is_some_and(|c| c.0 == status))
        },
    )
    .await;
    if let Err(err) = waited {
        let conditions = Api::<TalosCluster>::namespaced(client.clone(), ns)
            .get(name)
            .await
            .ok()
            .and_then(|c| c.status)
            .map(|s| s.conditions);
        anyhow::bail!("{err:#}; conditions now: {conditions:#?}");
    }
    Ok(())
}

/// The kubeconfig the bootstrapper stored for cluster `name`, from the Secret its
/// `status.secretRef` names, as every reader finds it.
pub async fn stored_kubeconfig(client: &Client, ns: &str, name: &str) -> anyhow::Result<String> {
    let secret_name = Api::<TalosCluster>::namespaced(client.clone(), ns)
        .get(name)
        .await?
        .status
        .and_then(|s| s.secret_ref)
        .context("no status.secretRef")?
        .name;
    let secret = Api::<Secret>::namespaced(client.clone(), ns)
        .get(&secret_name)
        .await?;
    let bytes = secret
        .data
        .and_then(|d| d.get("kubeconfig").cloned())
        .context("no kubeconfig key")?;
    Ok(String::from_utf8(bytes.0)?)
}

/// instance-discovery's flags for the test bed: a slow re-probe, fast retries, and a short
/// dial timeout (emulated machines answer at once or not at all).
pub const DISCOVERY_ARGS: [&str; 6] = [
    "--reprobe-seconds",
    "60",
    "--retry-seconds",
    "1",
    "--dial-timeout-seconds",
    "3",
];

/// Starts the three operators (instance-discovery, pool-claimer, talos-bootstrapper) for
/// `ns`, each as its own ServiceAccount. `bootstrapper` is the talos-bootstrapper binary
/// (tests pass `CARGO_BIN_EXE_talos-bootstrapper`); `extra` go to it.
pub async fn start_operators(
    client: &Client,
    shared: &testbed::Shared,
    ns: &str,
    bootstrapper: &Path,
    extra: &[&str],
) -> anyhow::Result<(Vec<Operator>, PathBuf)> {
    install_role(client).await?;
    let mut running = Vec::new();
    for (name, role, args) in [
        (
            "instance-discovery",
            crate::INSTANCE_DISCOVERY_ROLE,
            DISCOVERY_ARGS.to_vec(),
        ),
        ("pool-claimer", crate::POOL_CLAIMER_ROLE, vec![]),
    ] {
        let kubeconfig = service_account_kubeconfig(client, shared, ns, name, role).await?;
        let mut all = vec!["--namespace", ns];
        all.extend(args);
        running
            .push(Operator::start(&crate::workspace_binary(name)?, name, &kubeconfig, &all).await?);
    }
    let kubeconfig = service_account_kubeconfig(
        client,
        shared,
        ns,
        "talos-bootstrapper",
        TALOS_BOOTSTRAPPER_ROLE,
    )
    .await?;
    running.push(start_bootstrapper(bootstrapper, &kubeconfig, ns, extra).await?);
    Ok((running, kubeconfig))
}

/// Starts (or restarts) talos-bootstrapper for `ns` with test-friendly bounds.
pub async fn start_bootstrapper(
    bin: &Path,
    kubeconfig: &Path,
    ns: &str,
    extra: &[&str],
) -> anyhow::Result<Operator> {
    let mut args = vec![
        "--namespace",
        ns,
        "--service-account-key-bits",
        "2048",
        "--retry-seconds",
        "1",
    ];
    args.extend(extra);
    Operator::start(bin, "talos-bootstrapper", kubeconfig, &args).await
}

/// The number of Nodes the API server behind `kubeconfig` lists, within 2 s.
pub async fn node_count(kubeconfig: &str) -> anyhow::Result<usize> {
    let down = testbed::client_from(kubeconfig).await?;
    let listed = tokio::time::timeout(
        Duration::from_secs(2),
        Api::<k8s_openapi::api::core::v1::Node>::all(down).list(&kube::api::ListParams::default()),
    )
    .await
    .context("listing Nodes timed out")??;
    Ok(listed.items.len())
}

/// Powers off the machine holding the shared IP `vip` (a control plane of the cluster
/// `kubeconfig` reaches through it, `nodes` Nodes) and waits for the API to answer there
/// again: first the address must stop answering, then answer with every Node, from another
/// of `control_planes`, no sooner than the election `lease`. Returns the time from the
/// power-off to the answer, the old holder and the new.
pub async fn shared_ip_failover(
    emu: &talos_emulator::Emulator,
    kubeconfig: &str,
    vip: Ipv4Addr,
    nodes: usize,
    control_planes: &[Ipv4Addr],
    lease: Duration,
) -> anyhow::Result<(Duration, Ipv4Addr, Ipv4Addr)> {
    let holder = emu
        .vip_holder(vip.into())
        .context("no control plane holds the shared IP")?;
    anyhow::ensure!(
        control_planes.contains(&holder),
        "{holder} is no control plane"
    );
    anyhow::ensure!(
        node_count(kubeconfig).await? == nodes,
        "not every Node is listed"
    );
    emu.inject(holder, talos_emulator::Fault::PowerOff).await?;
    let lost = std::time::Instant::now();
    // The address went with the machine (within the emulator's election tick).
    while node_count(kubeconfig).await.is_ok() {
        anyhow::ensure!(
            lost.elapsed() < Duration::from_secs(5),
            "the shared IP still answers after its holder powered off"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let back = loop {
        if node_count(kubeconfig).await.is_ok_and(|n| n == nodes) {
            break lost.elapsed();
        }
        anyhow::ensure!(
            lost.elapsed() < lease + Duration::from_secs(60),
            "the API never answered on the shared IP again"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let new_holder = emu
        .vip_holder(vip.into())
        .context("the shared IP is not held again")?;
    anyhow::ensure!(
        new_holder != holder,
        "the powered-off machine still holds it"
    );
    anyhow::ensure!(
        control_planes.contains(&new_holder),
        "{new_holder} is no control plane"
    );
    anyhow::ensure!(
        back >= lease,
        "the address moved after {back:?}, before the powered-off holder's lease ran out"
    );
    Ok((back, holder, new_holder))
}
