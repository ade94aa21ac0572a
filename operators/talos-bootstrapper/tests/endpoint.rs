//! `spec.controlPlane.endpoint`: a load balancer in front of the control planes is the
//! endpoint of every machine config, a name in the API server's certificate and the server
//! of the stored kubeconfig, which works through it. Real test bed, the Talos emulator, and
//! instance-discovery, pool-claimer and talos-bootstrapper as processes; the load balancer is
//! the test's own TCP forwarder (users bring theirs).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::too_many_lines
)]

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kontinuum_crds::v1alpha2::TalosCluster;
use kontinuum_e2e::bootstrapper::{
    AddonsReady, cluster_condition, create_cluster_with, create_instance, start_operators,
    stored_kubeconfig, wait_cluster,
};
use kontinuum_e2e::testbed::unique_dir;
use kontinuum_e2e::{install_kontinuum_crds, namespace, shared_client};
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::{Value, json};
use talos_emulator::{Emulator, Settings};
use tokio::net::{TcpListener, TcpStream};

const LIMIT: Duration = Duration::from_secs(180);

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_talos-bootstrapper"))
}

/// The load balancer: every connection to `listen` is forwarded to `upstream`.
async fn load_balancer(listen: SocketAddr, upstream: SocketAddr) -> tokio::task::JoinHandle<()> {
    let listener = TcpListener::bind(listen).await.unwrap();
    tokio::spawn(async move {
        while let Ok((mut down, _)) = listener.accept().await {
            tokio::spawn(async move {
                if let Ok(mut up) = TcpStream::connect(upstream).await {
                    let _ = tokio::io::copy_bidirectional(&mut down, &mut up).await;
                }
            });
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_load_balancer_endpoint_is_in_every_config_the_certificate_and_the_kubeconfig() {
    let (client, shared) = shared_client().await.unwrap();
    install_kontinuum_crds(&client).await.unwrap();
    let ns = namespace(&client, "endpoint").await.unwrap();
    let cp = Ipv4Addr::new(127, 73, 0, 1);
    let lb = Ipv4Addr::new(127, 73, 0, 200);
    let emu = Emulator::start(Settings {
        machines: 1,
        first_address: cp,
        port: 50000,
        api_port: 6443,
        dir: unique_dir("emulator-endpoint"),
        control_addr: None,
    })
    .await
    .unwrap();
    let _lb = load_balancer((lb, 6443).into(), (cp, 6443).into()).await;
    create_instance(&client, &ns, "cp-1", cp, "cp")
        .await
        .unwrap();
    let (_operators, _) = start_operators(&client, shared, &ns, bin(), &[])
        .await
        .unwrap();
    let _addons = AddonsReady::start(client.clone(), ns.clone());
    create_cluster_with(&client, &ns, "eu-lb", 1, 0, false, |spec| {
        spec["controlPlane"]["endpoint"] = json!({ "host": lb.to_string() });
    })
    .await
    .unwrap();
    wait_cluster(&client, &ns, "eu-lb", "Ready", "True", LIMIT)
        .await
        .unwrap();

    let endpoint = format!("https://{lb}:6443");
    let clusters: Api<TalosCluster> = Api::namespaced(client.clone(), &ns);
    let status = clusters.get("eu-lb").await.unwrap().status.unwrap();
    assert_eq!(status.endpoint.as_deref(), Some(endpoint.as_str()));
    let shared_endpoint = cluster_condition(&client, &ns, "eu-lb", "EndpointShared").await;
    assert_eq!(
        shared_endpoint.map(|(s, r, _)| (s, r)),
        Some(("True".to_owned(), "EndpointConfigured".to_owned()))
    );
    // The config the machine runs.
    let yaml = emu.running_config(cp).unwrap();
    let documents: Vec<Value> = serde_saphyr::from_multiple(&yaml).unwrap();
    let main = documents.iter().find(|d| d.get("kind").is_none()).unwrap();
    assert_eq!(
        main.pointer("/cluster/controlPlane/endpoint"),
        Some(&json!(endpoint))
    );
    assert_eq!(
        main.pointer("/cluster/apiServer/certSANs"),
        Some(&json!([lb.to_string()]))
    );
    // The stored kubeconfig names the load balancer and works through it, the API server's
    // certificate verified for that address.
    let kubeconfig = stored_kubeconfig(&client, &ns, "eu-lb").await.unwrap();
    assert!(
        kubeconfig.contains(&format!("server: {endpoint}")),
        "the kubeconfig's server is the load balancer"
    );
    let down = kontinuum_e2e::testbed::client_from(&kubeconfig)
        .await
        .unwrap();
    let nodes = Api::<Node>::all(down)
        .list(&ListParams::default())
        .await
        .unwrap();
    assert_eq!(nodes.items.len(), 1);

    // Set at creation, for good.
    let moved = json!({ "spec": { "controlPlane": { "endpoint": { "host": "lb2.example" } } } });
    let err = clusters
        .patch("eu-lb", &PatchParams::default(), &Patch::Merge(&moved))
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("spec.controlPlane.endpoint is immutable"),
        "{err}"
    );
    emu.shutdown().await;
}
