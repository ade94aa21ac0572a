//! Two control planes run at once on different loopback addresses, each with its own CRDs:
//! what is installed in one does not exist in the other.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::large_futures
)]

use std::net::IpAddr;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kontinuum_e2e::install_crds;
use kontinuum_e2e::testbed::{
    ControlPlane, ControlPlaneConfig, Tools, install_crypto_provider, node_is_ready, unique_dir,
};
use kube::Api;

async fn start(address: [u8; 4], node: &str) -> ControlPlane {
    let tools = Tools::locate().unwrap();
    let mut config = ControlPlaneConfig::new(unique_dir("two-cps"));
    config.address = IpAddr::from(address);
    config.nodes = vec![node.to_string()];
    ControlPlane::start(&tools, config).await.unwrap()
}

fn crd(kind: &str) -> CustomResourceDefinition {
    kontinuum_crds::all_crds()
        .into_iter()
        .find(|c| c.spec.names.kind == kind)
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_control_planes_on_different_addresses_keep_their_own_crds() {
    install_crypto_provider();
    let (a, b) = tokio::join!(
        start([127, 0, 0, 2], "node-a"),
        start([127, 0, 0, 3], "node-b")
    );
    assert!(
        a.server().starts_with("https://127.0.0.2:"),
        "{}",
        a.server()
    );
    assert!(
        b.server().starts_with("https://127.0.0.3:"),
        "{}",
        b.server()
    );

    let zone = crd("Zone");
    let instance = crd("Instance");
    install_crds(&a.client(), std::slice::from_ref(&zone))
        .await
        .unwrap();
    install_crds(&b.client(), std::slice::from_ref(&instance))
        .await
        .unwrap();

    let crds_a: Api<CustomResourceDefinition> = Api::all(a.client());
    let crds_b: Api<CustomResourceDefinition> = Api::all(b.client());
    let zones = zone.metadata.name.clone().unwrap();
    let instances = instance.metadata.name.clone().unwrap();
    assert!(crds_a.get_opt(&zones).await.unwrap().is_some());
    assert!(
        crds_a.get_opt(&instances).await.unwrap().is_none(),
        "A must not see B's CRD"
    );
    assert!(crds_b.get_opt(&instances).await.unwrap().is_some());
    assert!(
        crds_b.get_opt(&zones).await.unwrap().is_none(),
        "B must not see A's CRD"
    );

    // Each has its own KWOK node, Ready.
    let node_a = Api::<Node>::all(a.client()).get("node-a").await.unwrap();
    let node_b = Api::<Node>::all(b.client()).get("node-b").await.unwrap();
    assert!(node_is_ready(&node_a) && node_is_ready(&node_b));
    assert!(
        Api::<Node>::all(a.client())
            .get_opt("node-b")
            .await
            .unwrap()
            .is_none()
    );

    tokio::join!(a.stop(), b.stop());
}
