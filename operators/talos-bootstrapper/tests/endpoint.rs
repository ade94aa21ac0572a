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

use kontinuum_crds::v1alpha2::TalosCluster;
use kontinuum_e2e::bootstrapper::{
    AddonsReady, cluster_condition, create_cluster_with, create_instance, node_count,
    shared_ip_failover, start_operators, stored_kubeconfig, wait_cluster,
};
use kontinuum_e2e::testbed::unique_dir;
use kontinuum_e2e::{install_kontinuum_crds, namespace, shared_client};
use kube::api::{Api, Patch, PatchParams};
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

/// An emulator of `machines` machines from `first`, its API servers on 6443.
async fn emulator(first: Ipv4Addr, machines: usize, name: &str) -> Emulator {
    Emulator::start(Settings {
        machines,
        first_address: first,
        port: 50000,
        api_port: 6443,
        dir: unique_dir(name),
        control_addr: None,
    })
    .await
    .unwrap()
}

/// The cluster says `endpoint` is its endpoint, one that survives a machine's loss.
async fn assert_endpoint(client: &kube::Client, ns: &str, name: &str, endpoint: &str) {
    let clusters: Api<TalosCluster> = Api::namespaced(client.clone(), ns);
    let status = clusters.get(name).await.unwrap().status.unwrap();
    assert_eq!(status.endpoint.as_deref(), Some(endpoint));
    let shared_endpoint = cluster_condition(client, ns, name, "EndpointShared").await;
    assert_eq!(
        shared_endpoint.map(|(s, r, _)| (s, r)),
        Some(("True".to_owned(), "EndpointConfigured".to_owned()))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_load_balancer_endpoint_is_in_every_config_the_certificate_and_the_kubeconfig() {
    let (client, shared) = shared_client().await.unwrap();
    install_kontinuum_crds(&client).await.unwrap();
    let ns = namespace(&client, "endpoint").await.unwrap();
    let cp = Ipv4Addr::new(127, 73, 0, 1);
    let lb = Ipv4Addr::new(127, 73, 0, 200);
    let emu = emulator(cp, 1, "emulator-endpoint").await;
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
    assert_endpoint(&client, &ns, "eu-lb", &endpoint).await;
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
    assert_eq!(node_count(&kubeconfig).await.unwrap(), 1);

    // Set at creation, for good.
    let moved = json!({ "spec": { "controlPlane": { "endpoint": { "host": "lb2.example" } } } });
    let err = Api::<TalosCluster>::namespaced(client.clone(), &ns)
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

/// Three control planes with a Talos shared IP: every control plane's config carries the
/// `Layer2VIPConfig`, the workers' none; one control plane holds the address and the stored
/// kubeconfig works through it; that machine powered off, another takes the address once
/// the election lease's TTL has passed and the same kubeconfig works again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_vip_moves_to_another_control_plane_when_its_holder_powers_off() {
    let (client, shared) = shared_client().await.unwrap();
    install_kontinuum_crds(&client).await.unwrap();
    let ns = namespace(&client, "endpoint-vip").await.unwrap();
    let first = Ipv4Addr::new(127, 74, 0, 1);
    let vip = Ipv4Addr::new(127, 74, 0, 100);
    let emu = emulator(first, 4, "emulator-vip").await;
    // Shorter than Talos' 60 s, so that the test waits less; the mechanism is the same.
    let lease = Duration::from_secs(10);
    emu.set_vip_lease_ttl(lease);
    let machine = |i: u8| Ipv4Addr::new(127, 74, 0, i);
    for (i, name, pool) in [
        (1, "cp-1", "cp"),
        (2, "cp-2", "cp"),
        (3, "cp-3", "cp"),
        (4, "w-1", "worker"),
    ] {
        create_instance(&client, &ns, name, machine(i), pool)
            .await
            .unwrap();
    }
    let (_operators, _) = start_operators(&client, shared, &ns, bin(), &[])
        .await
        .unwrap();
    let _addons = AddonsReady::start(client.clone(), ns.clone());
    create_cluster_with(&client, &ns, "eu-vip", 3, 1, false, |spec| {
        spec["controlPlane"]["endpoint"] =
            json!({ "vip": { "ip": vip.to_string(), "link": "eth0" } });
    })
    .await
    .unwrap();
    wait_cluster(&client, &ns, "eu-vip", "Ready", "True", LIMIT * 2)
        .await
        .unwrap();

    let endpoint = format!("https://{vip}:6443");
    assert_endpoint(&client, &ns, "eu-vip", &endpoint).await;
    // The shared IP's document on the control planes only.
    let vip_documents = |address: Ipv4Addr| -> Vec<Value> {
        let yaml = emu.running_config(address).unwrap();
        serde_saphyr::from_multiple::<Value>(&yaml)
            .unwrap()
            .into_iter()
            .filter(|d| d["kind"] == "Layer2VIPConfig")
            .collect()
    };
    for i in 1..=3 {
        assert_eq!(
            vip_documents(machine(i)),
            [
                json!({ "apiVersion": "v1alpha1", "kind": "Layer2VIPConfig", "name": vip.to_string(), "link": "eth0" })
            ],
            "cp-{i}"
        );
    }
    assert!(
        vip_documents(machine(4)).is_empty(),
        "a worker holds no shared IP"
    );

    // The kubeconfig reaches the API through the shared IP; its holder powers off: nothing
    // answers there until the lease has run out, then another control plane holds it and
    // the same kubeconfig works.
    let kubeconfig = stored_kubeconfig(&client, &ns, "eu-vip").await.unwrap();
    assert!(kubeconfig.contains(&format!("server: {endpoint}")));
    let control_planes: Vec<Ipv4Addr> = (1..=3).map(machine).collect();
    let (back, holder, new_holder) =
        shared_ip_failover(&emu, &kubeconfig, vip, 4, &control_planes, lease)
            .await
            .unwrap();
    println!(
        "shared IP failover: the API answered on {vip} again {back:?} after {holder} powered off (lease TTL {lease:?}); now held by {new_holder}"
    );
    emu.shutdown().await;
}
