//! A zone joins the hub's registry for real: the zone-installer installs the footprint into a
//! zone cluster whose node is a hostlet (so the zone agent and its relay run as real
//! processes from the objects the zone-installer wrote); the relay signs with the identity
//! key the zone-installer issued and dials the hub's `etcd-proxy serve`, which trusts the
//! certificate in the hub Secret the zone-installer wrote; the hub's `registry hub` mirrors
//! the registration into a Kontinuum; the Zone turns `RegistryJoined` and `Ready`. Deleting
//! the hub Secret revokes the zone: the proxy refuses it, and the Zone says why.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::large_futures,
    clippy::too_many_lines
)]

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use kontinuum_crds::v1alpha2::{Kontinuum, TalosCluster, Zone};
use kontinuum_e2e::testbed::{HostletConfig, unique_dir};
use kontinuum_e2e::zone::{HubJoin, wait_zone_condition};
use kontinuum_e2e::{
    Operator, install_kontinuum_crds, namespace, service_account_kubeconfig, shared_client,
    workspace_binary,
};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt as _};
use serde_json::json;

const LIMIT: Duration = Duration::from_secs(120);

/// Waits for the Zone's condition `type_` to be `status`/`reason`.
async fn wait(client: &Client, ns: &str, type_: &str, status: &str, reason: &str) {
    wait_zone_condition(client, ns, "eu-joined", (type_, status, reason), LIMIT)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_installed_agent_heartbeats_through_the_proxy_and_the_zone_is_ready() {
    let (client, shared) = shared_client().await.unwrap();
    install_kontinuum_crds(&client).await.unwrap();
    let ns = namespace(&client, "zone-joined").await.unwrap();
    let dir: PathBuf = unique_dir("zone-joined");
    std::fs::create_dir_all(&dir).unwrap();

    // The hub's store (etcd), its public proxy (TLS from a test CA), its registry.
    let hub = HubJoin::start(shared, &dir, &ns, &[]).await.unwrap();
    let (proxy, ca_file) = (hub.proxy, hub.proxy_ca.clone());

    // The zone cluster: one hostlet node runs our image's binaries for real.
    let mut zone_cluster = kontinuum_e2e::addons::downstream_cluster(&shared.tools, "zone-joined")
        .await
        .unwrap();
    let down = zone_cluster.client();
    let binary = |name: &str| {
        workspace_binary(name)
            .unwrap()
            .to_string_lossy()
            .into_owned()
    };
    let map = dir.join("image-map.json");
    let images = json!({ "images": [{
        "image": "kontinuum",
        "files": {
            "/usr/local/bin/registry": binary("registry"),
            "/usr/local/bin/etcd-proxy": binary("etcd-proxy"),
        },
    }] });
    std::fs::write(&map, images.to_string()).unwrap();
    let octet = u8::try_from(150 + std::process::id() % 50).unwrap();
    let mut node = HostletConfig::new(
        "zone-node",
        Ipv4Addr::new(127, octet, 12, 1),
        &map,
        binary("hostlet"),
    );
    node.pod_cidr = Some(format!("127.{octet}.13.0/24"));
    zone_cluster.start_hostlet(&node).await.unwrap();
    let nodes = Api::<k8s_openapi::api::core::v1::Node>::all(down.clone());
    for kwok in nodes.list(&kube::api::ListParams::default()).await.unwrap() {
        if kwok.name_any() != "zone-node" {
            let cordon = json!({ "spec": { "unschedulable": true } });
            nodes
                .patch(
                    &kwok.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(&cordon),
                )
                .await
                .unwrap();
        }
    }

    // The zone-installer, pointed at the proxy.
    let kubeconfig =
        service_account_kubeconfig(&client, shared, &ns, "zone-installer", "cluster-admin")
            .await
            .unwrap();
    let _zone_installer = Operator::start(
        Path::new(env!("CARGO_BIN_EXE_zone-installer")),
        "zone-installer",
        &kubeconfig,
        &[
            "--namespace",
            &ns,
            "--insecure-allow-anonymous",
            "true",
            "--hub-grpc-endpoint",
            &proxy.to_string(),
            "--proxy-ca-file",
            &ca_file.to_string_lossy(),
            "--agent-image",
            "kontinuum:e2e",
            "--retry-interval",
            "1s",
        ],
    )
    .await
    .unwrap();

    let zone: Zone = serde_json::from_value(json!({
        "apiVersion": "kontinuum.sh/v1alpha2", "kind": "Zone",
        "metadata": { "name": "eu-joined" }, "spec": { "region": "eu", "zone": "joined" },
    }))
    .unwrap();
    Api::<Zone>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &zone)
        .await
        .unwrap();
    let started = Instant::now();
    kontinuum_e2e::addons::seed_cluster(
        &client,
        &ns,
        "eu-joined",
        zone_cluster.kubeconfig_yaml(),
        1,
    )
    .await
    .unwrap();
    let ready = json!({ "status": { "conditions": [{
        "type": "Ready", "status": "True", "reason": "Ready", "message": "ready for the test",
        "lastTransitionTime": "2026-01-01T00:00:00Z" }] } });
    Api::<TalosCluster>::namespaced(client.clone(), &ns)
        .patch_status("eu-joined", &PatchParams::default(), &Patch::Merge(&ready))
        .await
        .unwrap();

    wait(&client, &ns, "Installed", "True", "Installed").await;
    let installed = started.elapsed();
    wait(&client, &ns, "RegistryJoined", "True", "RegistryJoined").await;
    wait(&client, &ns, "Ready", "True", "Ready").await;
    let joined = started.elapsed();
    let kontinuums = Api::<Kontinuum>::namespaced(client.clone(), &ns)
        .list(&kube::api::ListParams::default())
        .await
        .unwrap()
        .items;
    assert!(
        kontinuums
            .iter()
            .any(|k| k.spec.region.as_deref() == Some("eu")
                && k.spec.zone.as_deref() == Some("joined")),
        "{:?}",
        kontinuums
            .iter()
            .map(kube::ResourceExt::name_any)
            .collect::<Vec<_>>()
    );

    // Revoked: the hub Secret deleted, the Zone says so at once (and the proxy refuses the
    // zone: its registration is not renewed).
    Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client.clone(), &ns)
        .delete("eu-joined-identity", &DeleteParams::default())
        .await
        .unwrap();
    wait(&client, &ns, "Installed", "False", "IdentityRevoked").await;
    wait(&client, &ns, "Ready", "False", "IdentityRevoked").await;
    let revoked = Instant::now();
    // The proxy refuses the revoked zone's calls, so its registration's lease runs out, the
    // registry withdraws the Kontinuum, and RegistryJoined turns False (never latched).
    wait(
        &client,
        &ns,
        "RegistryJoined",
        "False",
        "WaitingForRegistry",
    )
    .await;
    let withdrawn = revoked.elapsed();
    let agent_entries = Api::<Kontinuum>::namespaced(client.clone(), &ns)
        .list(&kube::api::ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|k| k.spec.zone.as_deref() == Some("joined"))
        .count();
    assert_eq!(
        agent_entries, 0,
        "the revoked zone's registration was withdrawn"
    );
    eprintln!(
        "zone Installed {installed:?} after its cluster was Ready; RegistryJoined and Ready after {joined:?}; registration withdrawn {withdrawn:?} after the revocation"
    );
}
