//! instance-discovery and pool-claimer killed (SIGKILL, as a crash) and restarted at
//! random points while machines are discovered and claimed: they converge to the same final
//! state as an undisturbed run.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::large_futures,
    clippy::too_many_lines
)]

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::time::Duration;

use kontinuum_crds::conditions;
use kontinuum_crds::labels::CLAIMED_BY;
use kontinuum_crds::v1alpha2::{Instance, InstancePool};
use kontinuum_e2e::chaos::Rng;
use kontinuum_e2e::testbed::unique_dir;
use kontinuum_e2e::{
    Operator, eventually, install_kontinuum_crds, namespace, shared_client, workspace_binary,
};
use kube::ResourceExt as _;
use kube::api::{Api, ListParams, PostParams};
use talos_emulator::{Emulator, Settings};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_killed_at_random_points_converge() {
    let (client, shared) = shared_client().await.unwrap();
    install_kontinuum_crds(&client).await.unwrap();
    let ns = namespace(&client, "restarts").await.unwrap();
    let emulator = Emulator::start(Settings {
        machines: 6,
        first_address: Ipv4Addr::new(127, 42, 0, 1),
        port: 50000,
        api_port: 6443,
        dir: unique_dir("emulator"),
        control_addr: None,
    })
    .await
    .unwrap();
    let mut rng = Rng::from_env();
    eprintln!("restarts: {}", rng.replay());

    let instances: Api<Instance> = Api::namespaced(client.clone(), &ns);
    for i in 1..=6 {
        let instance: Instance = serde_json::from_value(serde_json::json!({
            "apiVersion": "kontinuum.sh/v1alpha2", "kind": "Instance",
            "metadata": { "name": format!("r-{i}"), "labels": { "kontinuum.sh/zone": "r" } },
            "spec": { "interfaces": [format!("127.42.0.{i}")] }
        }))
        .unwrap();
        instances
            .create(&PostParams::default(), &instance)
            .await
            .unwrap();
    }
    let pool: InstancePool = serde_json::from_value(serde_json::json!({
        "apiVersion": "kontinuum.sh/v1alpha2", "kind": "InstancePool",
        "metadata": { "name": "eu-r" },
        "spec": { "replicas": 4, "selector": { "matchLabels": { "kontinuum.sh/zone": "r" } } }
    }))
    .unwrap();
    let pools: Api<InstancePool> = Api::namespaced(client.clone(), &ns);
    pools.create(&PostParams::default(), &pool).await.unwrap();

    let kubeconfig = shared.kubeconfig_path.clone();
    let discovery_bin = workspace_binary("instance-discovery").unwrap();
    let claimer_bin = workspace_binary("pool-claimer").unwrap();
    let discovery_args = [
        "--namespace",
        ns.as_str(),
        "--reprobe-seconds",
        "2",
        "--retry-seconds",
        "1",
        "--dial-timeout-seconds",
        "2",
    ];
    let claimer_args = ["--namespace", ns.as_str()];
    let mut discovery = Operator::start(
        &discovery_bin,
        "instance-discovery",
        &kubeconfig,
        &discovery_args,
    )
    .await
    .unwrap();
    let mut claimer = Operator::start(&claimer_bin, "pool-claimer", &kubeconfig, &claimer_args)
        .await
        .unwrap();

    for round in 0..8 {
        // A random moment in the flow, then a crash and a restart of one of the two.
        tokio::time::sleep(Duration::from_millis(rng.below(1500))).await;
        let victim = if rng.below(2) == 0 {
            &mut discovery
        } else {
            &mut claimer
        };
        victim.restart().await.unwrap();
        eprintln!("restarts: round {round}: restarted {}", victim.name());
    }

    eventually(
        Duration::from_secs(60),
        "all discovered, 4 claimed, the pool Ready and agreeing",
        || async {
            let list = instances.list(&ListParams::default()).await?;
            let discovered = list.items.iter().filter(|i| {
                i.status
                    .as_ref()
                    .is_some_and(|s| conditions::is_true(&s.conditions, "Discovered"))
            });
            let mut claims: BTreeMap<String, usize> = BTreeMap::new();
            for i in &list.items {
                if let Some(pool) = i.labels().get(CLAIMED_BY) {
                    *claims.entry(pool.clone()).or_default() += 1;
                }
            }
            let pool = pools.get("eu-r").await?;
            let status = pool.status.unwrap_or_default();
            Ok(discovered.count() == 6
                && claims.get("eu-r") == Some(&4)
                && claims.len() == 1
                && status.claimed_replicas == Some(4)
                && conditions::is_true(&status.conditions, "Ready"))
        },
    )
    .await
    .unwrap();
    emulator.shutdown().await;
}
