//! Scale-down: a worker its pool releases is reset to maintenance mode (it leaves the
//! cluster), its conditions cleared and its name forgotten, so another cluster can use it.
//! Real test bed, the Talos emulator with a real downstream control plane, and
//! instance-discovery, pool-claimer and talos-bootstrapper as processes.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::too_many_lines
)]

use std::net::Ipv4Addr;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::events::v1::Event;
use kontinuum_crds::conditions;
use kontinuum_crds::labels::CLAIMED_BY;
use kontinuum_crds::v1alpha2::{Instance, InstancePool, TalosCluster};
use kontinuum_e2e::bootstrapper::{
    AddonsReady, create_cluster, create_instance, start_operators, stored_kubeconfig, wait_cluster,
};
use kontinuum_e2e::testbed::unique_dir;
use kontinuum_e2e::{eventually, install_kontinuum_crds, namespace, shared_client};
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use talos_emulator::{Emulator, Mode, Settings};

const LIMIT: Duration = Duration::from_secs(120);

async fn node_names(client: &Client, ns: &str, cluster: &str) -> Vec<String> {
    let Ok(kubeconfig) = stored_kubeconfig(client, ns, cluster).await else {
        return Vec::new();
    };
    let Ok(down) = kontinuum_e2e::testbed::client_from(&kubeconfig).await else {
        return Vec::new();
    };
    Api::<Node>::all(down)
        .list(&ListParams::default())
        .await
        .map(|l| l.items.iter().map(ResourceExt::name_any).collect())
        .unwrap_or_default()
}

fn has_condition(instance: &Instance, type_: &str) -> bool {
    instance
        .status
        .as_ref()
        .is_some_and(|s| conditions::get(&s.conditions, type_).is_some())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_worker_is_reset_and_forgotten() {
    let (client, shared) = shared_client().await.unwrap();
    install_kontinuum_crds(&client).await.unwrap();
    let ns = namespace(&client, "scale-down").await.unwrap();
    let first = Ipv4Addr::new(127, 97, 0, 1);
    let w2 = Ipv4Addr::new(127, 97, 0, 3);
    let emu = Emulator::start(Settings {
        machines: 3,
        first_address: first,
        port: 50000,
        api_port: 6443,
        dir: unique_dir("emulator-scale-down"),
        control_addr: None,
    })
    .await
    .unwrap();
    create_instance(&client, &ns, "cp-1", first, "cp")
        .await
        .unwrap();
    create_instance(&client, &ns, "w-1", Ipv4Addr::new(127, 97, 0, 2), "worker")
        .await
        .unwrap();
    create_instance(&client, &ns, "w-2", w2, "worker")
        .await
        .unwrap();
    let (_operators, _) = start_operators(
        &client,
        shared,
        &ns,
        env!("CARGO_BIN_EXE_talos-bootstrapper").as_ref(),
        &[],
    )
    .await
    .unwrap();
    let _addons = AddonsReady::start(client.clone(), ns.clone());
    create_cluster(&client, &ns, "sd", 1, 2, false)
        .await
        .unwrap();
    wait_cluster(&client, &ns, "sd", "Ready", "True", LIMIT)
        .await
        .unwrap();
    let clusters: Api<TalosCluster> = Api::namespaced(client.clone(), &ns);
    eventually(LIMIT, "both workers configured and joined", || async {
        let status = clusters.get("sd").await?.status.unwrap_or_default();
        Ok(status
            .workers
            .first()
            .is_some_and(|w| w.joined_replicas == 2)
            && status.configured_instances == ["cp-1", "w-1", "w-2"])
    })
    .await
    .unwrap();
    assert_eq!(emu.mode(w2), Some(Mode::Configured));

    // Scale the worker pool down: pool-claimer releases the last name, w-2.
    Api::<InstancePool>::namespaced(client.clone(), &ns)
        .patch(
            "sd-w",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "spec": { "replicas": 1 } })),
        )
        .await
        .unwrap();
    let instances: Api<Instance> = Api::namespaced(client.clone(), &ns);
    eventually(
        LIMIT,
        "w-2 released and forgotten by the cluster",
        || async {
            let status = clusters.get("sd").await?.status.unwrap_or_default();
            let released = !instances
                .get("w-2")
                .await?
                .labels()
                .contains_key(CLAIMED_BY);
            Ok(released && status.configured_instances == ["cp-1", "w-1"])
        },
    )
    .await
    .unwrap();
    // The machine is back in maintenance mode and left the downstream cluster; the
    // bootstrapper's conditions are gone from the Instance; the remaining worker is untouched.
    assert_eq!(emu.mode(w2), Some(Mode::Maintenance));
    assert_eq!(
        emu.mode(Ipv4Addr::new(127, 97, 0, 2)),
        Some(Mode::Configured)
    );
    let w2_instance = instances.get("w-2").await.unwrap();
    for c in ["Configured", "Joined"] {
        assert!(!has_condition(&w2_instance, c), "w-2 still has {c}");
    }
    eventually(LIMIT, "node w-2 gone downstream", || async {
        let nodes = node_names(&client, &ns, "sd").await;
        Ok(nodes.iter().any(|n| n == "cp-1") && !nodes.iter().any(|n| n == "w-2"))
    })
    .await
    .unwrap();
    let events: Api<Event> = Api::namespaced(client.clone(), &ns);
    let reset_events = events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some("Reset")
                && e.note.as_deref().is_some_and(|n| n.contains("w-2"))
        })
        .count();
    assert_eq!(reset_events, 1, "one Reset Event for w-2");
    // Back in maintenance mode, discovery finds it again: usable by another pool.
    eventually(LIMIT, "w-2 discovered again", || async {
        let i = instances.get("w-2").await?;
        Ok(i.status
            .as_ref()
            .is_some_and(|s| conditions::is_true(&s.conditions, "Discovered")))
    })
    .await
    .unwrap();
    // The cluster stays Ready with one worker.
    wait_cluster(&client, &ns, "sd", "Ready", "True", LIMIT)
        .await
        .unwrap();

    clusters
        .delete("sd", &kube::api::DeleteParams::default())
        .await
        .unwrap();
    eventually(LIMIT, "the cluster gone", || async {
        Ok(clusters.get_opt("sd").await?.is_none())
    })
    .await
    .unwrap();
    emu.shutdown().await;
}
