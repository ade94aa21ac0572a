//! instance-discovery as a host process against the real test bed and the Talos emulator.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::large_futures,
    clippy::too_many_lines
)]

use std::net::Ipv4Addr;
use std::path::Path;
use std::time::Duration;

use kontinuum_crds::conditions;
use kontinuum_crds::v1alpha2::Instance;
use kontinuum_e2e::testbed::unique_dir;
use kontinuum_e2e::{Operator, eventually, install_kontinuum_crds, namespace, shared_client};
use kube::Client;
use kube::api::{Api, PostParams};
use talos_emulator::{Emulator, Fault, Settings};

const LIMIT: Duration = Duration::from_secs(30);

async fn instance(client: &Client, ns: &str, name: &str, interfaces: &[&str]) {
    let instance: Instance = serde_json::from_value(serde_json::json!({
        "apiVersion": "kontinuum.sh/v1alpha2", "kind": "Instance",
        "metadata": { "name": name },
        "spec": { "interfaces": interfaces }
    }))
    .unwrap();
    Api::<Instance>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &instance)
        .await
        .unwrap();
}

async fn discovered(client: &Client, ns: &str, name: &str) -> Option<(String, String, String)> {
    let i = Api::<Instance>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .ok()?;
    let c = conditions::get(&i.status?.conditions, "Discovered")?.clone();
    Some((c.status, c.reason, c.message))
}

async fn start_operator(kubeconfig: &Path, ns: &str) -> Operator {
    Operator::start(
        Path::new(env!("CARGO_BIN_EXE_instance-discovery")),
        "instance-discovery",
        kubeconfig,
        &[
            "--namespace",
            ns,
            "--reprobe-seconds",
            "2",
            "--retry-seconds",
            "1",
            "--dial-timeout-seconds",
            "2",
        ],
    )
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn machines_are_discovered_lost_and_found_again() {
    let (client, shared) = shared_client().await.unwrap();
    install_kontinuum_crds(&client).await.unwrap();
    let ns = namespace(&client, "discovery").await.unwrap();
    let first = Ipv4Addr::new(127, 40, 0, 1);
    let emulator = Emulator::start(Settings {
        machines: 3,
        first_address: first,
        port: 50000,
        api_port: 6443,
        dir: unique_dir("emulator"),
        control_addr: None,
    })
    .await
    .unwrap();
    for i in 1..=3 {
        instance(&client, &ns, &format!("m-{i}"), &[&format!("127.40.0.{i}")]).await;
    }
    let _operator = start_operator(&shared.kubeconfig_path, &ns).await;

    let instances: Api<Instance> = Api::namespaced(client.clone(), &ns);
    eventually(LIMIT, "all three Discovered", || async {
        for i in 1..=3 {
            if discovered(&client, &ns, &format!("m-{i}"))
                .await
                .is_none_or(|c| c.0 != "True")
            {
                return Ok(false);
            }
        }
        Ok(true)
    })
    .await
    .unwrap();
    for i in 1..=3 {
        let status = instances
            .get(&format!("m-{i}"))
            .await
            .unwrap()
            .status
            .unwrap();
        assert!(!status.interfaces.is_empty(), "m-{i} has interfaces");
        assert!(status.interfaces.iter().any(|n| {
            n.addresses
                .iter()
                .any(|a| a.starts_with(&format!("127.40.0.{i}/")))
        }));
        assert!(!status.disks.is_empty(), "m-{i} has disks");
        assert_eq!(
            status.identity.as_ref().map(String::len),
            Some(64),
            "m-{i} has a SHA-256 identity"
        );
        assert!(
            status
                .talos
                .and_then(|t| t.version)
                .is_some_and(|v| v.starts_with("v1."))
        );
        assert!(status.last_seen_time.is_some());
        assert!(conditions::is_true(&status.conditions, "Ready"));
    }
    let mut identities = std::collections::BTreeSet::new();
    for i in 1..=3 {
        identities.insert(
            instances
                .get(&format!("m-{i}"))
                .await
                .unwrap()
                .status
                .unwrap()
                .identity,
        );
    }
    assert_eq!(identities.len(), 3, "every machine has its own identity");

    // The second machine stops answering, then comes back.
    emulator
        .inject(Ipv4Addr::new(127, 40, 0, 2), Fault::Refuse)
        .await
        .unwrap();
    eventually(LIMIT, "m-2 Discovered=False", || async {
        Ok(discovered(&client, &ns, "m-2")
            .await
            .is_some_and(|c| c.0 == "False" && c.1 == "ProbeFailed" && c.2.contains("127.40.0.2")))
    })
    .await
    .unwrap();
    assert_eq!(
        discovered(&client, &ns, "m-1").await.unwrap().0,
        "True",
        "the others are unaffected"
    );
    emulator
        .inject(Ipv4Addr::new(127, 40, 0, 2), Fault::Clear)
        .await
        .unwrap();
    eventually(LIMIT, "m-2 Discovered=True again", || async {
        Ok(discovered(&client, &ns, "m-2")
            .await
            .is_some_and(|c| c.0 == "True"))
    })
    .await
    .unwrap();
    emulator.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_addresses_are_reported_and_the_others_still_served() {
    let (client, shared) = shared_client().await.unwrap();
    install_kontinuum_crds(&client).await.unwrap();
    let ns = namespace(&client, "discovery-bad").await.unwrap();
    let emulator = Emulator::start(Settings {
        machines: 1,
        first_address: Ipv4Addr::new(127, 41, 0, 1),
        port: 50000,
        api_port: 6443,
        dir: unique_dir("emulator"),
        control_addr: None,
    })
    .await
    .unwrap();
    // Something that is not Talos on the Talos port.
    let not_talos = tokio::net::TcpListener::bind("127.41.0.8:50000")
        .await
        .unwrap();
    tokio::spawn(async move {
        use tokio::io::AsyncWriteExt as _;
        while let Ok((mut stream, _)) = not_talos.accept().await {
            let _ = stream
                .write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
                .await;
        }
    });
    instance(&client, &ns, "good", &["127.41.0.1"]).await;
    instance(&client, &ns, "empty", &[]).await;
    instance(&client, &ns, "unresolvable", &["no-such-machine.invalid"]).await;
    instance(&client, &ns, "closed-port", &["127.41.0.9"]).await;
    instance(&client, &ns, "not-talos", &["127.41.0.8"]).await;
    let _operator = start_operator(&shared.kubeconfig_path, &ns).await;

    eventually(LIMIT, "every Instance reported", || async {
        let good = discovered(&client, &ns, "good")
            .await
            .is_some_and(|c| c.0 == "True");
        let empty = discovered(&client, &ns, "empty")
            .await
            .is_some_and(|c| c.0 == "False" && c.1 == "NoInterfaces");
        let mut failed = true;
        for name in ["unresolvable", "closed-port", "not-talos"] {
            failed &= discovered(&client, &ns, name)
                .await
                .is_some_and(|c| c.0 == "False" && c.1 == "ProbeFailed");
        }
        Ok(good && empty && failed)
    })
    .await
    .unwrap();
    for name in ["unresolvable", "closed-port", "not-talos"] {
        let (_, _, message) = discovered(&client, &ns, name).await.unwrap();
        assert!(
            message.starts_with("all 1 candidate(s) failed, last error: "),
            "{name}: {message}"
        );
    }
    emulator.shutdown().await;
}
