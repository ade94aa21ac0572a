//! Our Talos client against the emulator, in process, on 127.x addresses with free ports.
//!
//! * `full_cycles_with_workers`: needs the test-bed binaries (KONTINUUM_TESTBED_BIN); starts
//!   two real control planes in sequence (acceptance 1 and 2).
//! * `bad_input_refusals_faults_and_restart`: no control plane (acceptance 3, faults,
//!   persistence).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::too_many_lines
)]

mod support;

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kontinuum_talos::{
    ApplyMode, BootstrapOutcome, ClientIdentity, ErrorKind, ResetOptions, TalosClient, Timeouts,
};
use kontinuum_talos_config::{MachineType, SecretsBundle, admin_talosconfig};
use kube::Api;
use support::{
    TIMEOUTS, config, configured, endpoint, identity, ip, leaf_cert, maintenance, new_bundle,
};
use talos_emulator::{Emulator, Fault, Mode, Settings};

fn dir(name: &str) -> PathBuf {
    let dir = kontinuum_testbed::unique_dir(name);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

async fn wait_nodes_ready(kubeconfig: &str, names: &[&str]) {
    let client = kontinuum_testbed::client_from(kubeconfig).await.unwrap();
    let nodes: Api<Node> = Api::all(client);
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let mut ready = 0;
        for name in names {
            if let Ok(Some(node)) = nodes.get_opt(name).await
                && kontinuum_testbed::node_is_ready(&node)
            {
                ready += 1;
            }
        }
        if ready == names.len() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "nodes {names:?} not Ready in time"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Probe, apply, bootstrap (twice), kubeconfig, nodes Ready, health; returns the kubeconfig.
async fn bring_up(cp: SocketAddr, bundle: &SecretsBundle, hostname: &str) -> (TalosClient, String) {
    let client = maintenance(cp).await;
    let version = client.version().await.unwrap();
    assert_eq!(version.tag, talos_emulator::TALOS_TAG);
    assert!(!version.rbac);
    let found = client.discover().await.unwrap();
    let fp = client.peer_certificate().unwrap();
    assert_eq!(
        fp.common_name.as_deref(),
        Some("maintenance-service.talos.dev")
    );
    assert_eq!(found.interfaces.len(), 2);
    assert_eq!(
        found.interfaces[0].addresses,
        vec![format!("{}/24", cp.ip())]
    );
    assert!(found.interfaces[0].mac_address.is_some());
    assert_eq!(found.disks[0].dev_path.as_deref(), Some("/dev/sda"));

    let outcome = client
        .apply_configuration(
            config(bundle, MachineType::ControlPlane, hostname, ip(cp)),
            ApplyMode::Reboot,
        )
        .await
        .unwrap();
    assert_eq!(outcome.mode, ApplyMode::NoReboot);

    let admin = configured(cp, &identity(bundle)).await;
    assert!(admin.version().await.unwrap().rbac);
    assert_eq!(
        admin.bootstrap().await.unwrap(),
        BootstrapOutcome::Bootstrapped
    );
    assert_eq!(
        admin.bootstrap().await.unwrap(),
        BootstrapOutcome::AlreadyBootstrapped
    );
    let kubeconfig = admin.kubeconfig().await.unwrap();
    let kubeconfig = String::from_utf8(kubeconfig.as_bytes().to_vec()).unwrap();
    assert!(kubeconfig.contains("admin@emu"));
    (admin, kubeconfig)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn full_cycles_with_workers() {
    kontinuum_testbed::Tools::locate().expect("test-bed binaries (KONTINUUM_TESTBED_BIN)");
    let started = Instant::now();
    let dir = dir("emulator-cycles");
    let emulator = Emulator::start(Settings {
        machines: 3,
        first_address: Ipv4Addr::new(127, 61, 0, 1),
        port: 0,
        api_port: 0,
        dir: dir.clone(),
        control_addr: None,
    })
    .await
    .unwrap();
    let addrs = emulator.addresses();
    let (cp, w1, w2) = (addrs[0], addrs[1], addrs[2]);
    let first_fp = maintenance(cp).await.peer_certificate().unwrap();

    // Cycle 1: a control plane and two workers (one applied before, one after bootstrap).
    let bundle1 = new_bundle();
    maintenance(w1)
        .await
        .apply_configuration(
            config(&bundle1, MachineType::Worker, "worker-1", ip(cp)),
            ApplyMode::Auto,
        )
        .await
        .unwrap();
    let (admin, kubeconfig) = bring_up(cp, &bundle1, "cp-1").await;
    maintenance(w2)
        .await
        .apply_configuration(
            config(&bundle1, MachineType::Worker, "worker-2", ip(cp)),
            ApplyMode::Auto,
        )
        .await
        .unwrap();
    wait_nodes_ready(&kubeconfig, &["cp-1", "worker-1", "worker-2"]).await;
    let mut progress = Vec::new();
    admin
        .health_check(
            Duration::from_secs(60),
            &[cp.ip().to_string()],
            &[w1.ip().to_string(), w2.ip().to_string()],
            |m| progress.push(m.to_owned()),
        )
        .await
        .unwrap();
    assert!(progress[0].starts_with("discovered nodes"), "{progress:?}");
    assert!(
        progress
            .iter()
            .any(|m| m == "waiting for all k8s nodes to report ready: OK")
    );
    // A health check that cannot pass in time ends with DeadlineExceeded.
    let id1 = identity(&bundle1);
    let short = admin
        .health_check(Duration::from_millis(1), &[], &[], |_| {})
        .await;
    assert!(short.is_ok() || short.unwrap_err().kind() == ErrorKind::TimedOut);
    let cycle1 = started.elapsed();

    // Reset the workers (their nodes go), then the control plane.
    for w in [w1, w2] {
        configured(w, &id1)
            .await
            .reset(&ResetOptions::to_maintenance(true))
            .await
            .unwrap();
        assert_eq!(emulator.mode(ip(w)), Some(Mode::Maintenance));
    }
    let client = kontinuum_testbed::client_from(&kubeconfig).await.unwrap();
    let nodes: Api<Node> = Api::all(client);
    assert!(nodes.get_opt("worker-1").await.unwrap().is_none());
    admin
        .reset(&ResetOptions::to_maintenance(false))
        .await
        .unwrap();
    assert_eq!(emulator.mode(ip(cp)), Some(Mode::Maintenance));
    let again = maintenance(cp).await;
    again.version().await.unwrap();
    assert_eq!(
        again.peer_certificate().unwrap().public_key_sha256,
        first_fp.public_key_sha256,
        "STATE+EPHEMERAL keeps the identity"
    );

    // Cycle 2: a new cluster on the same machine; a full wipe then forgets the identity.
    let bundle2 = new_bundle();
    let (admin2, kubeconfig2) = bring_up(cp, &bundle2, "cp-2").await;
    wait_nodes_ready(&kubeconfig2, &["cp-2"]).await;
    admin2
        .health_check(Duration::from_secs(60), &[cp.ip().to_string()], &[], |_| {})
        .await
        .unwrap();
    admin2
        .reset(&ResetOptions {
            graceful: false,
            reboot: true,
            system_partitions: Vec::new(),
        })
        .await
        .unwrap();
    let wiped = maintenance(cp).await;
    wiped.version().await.unwrap();
    assert_ne!(
        wiped.peer_certificate().unwrap().public_key_sha256,
        first_fp.public_key_sha256,
        "a full wipe forgets the identity"
    );
    emulator.shutdown().await;
    eprintln!(
        "cycle 1 (cp + 2 workers) took {cycle1:?}, both cycles {:?}",
        started.elapsed()
    );
}

async fn http(control: SocketAddr, method: &str, path: &str, body: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tcp = tokio::net::TcpStream::connect(control).await.unwrap();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nhost: emulator\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    tcp.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    tcp.read_to_string(&mut response).await.unwrap();
    response
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_input_refusals_faults_and_restart() {
    let dir = dir("emulator-refusals");
    let settings = Settings {
        machines: 2,
        first_address: Ipv4Addr::new(127, 62, 0, 1),
        port: 0,
        api_port: 0,
        dir: dir.clone(),
        control_addr: Some("127.0.0.1:0".parse().unwrap()),
    };
    let emulator = Emulator::start(settings.clone()).await.unwrap();
    let addrs = emulator.addresses();
    let (cp, w) = (addrs[0], addrs[1]);
    let bundle = new_bundle();
    let other = new_bundle();

    // Configure machine 0 as a control plane (no bootstrap: no control plane needed).
    maintenance(cp)
        .await
        .apply_configuration(
            config(&bundle, MachineType::ControlPlane, "cp", ip(cp)),
            ApplyMode::Auto,
        )
        .await
        .unwrap();

    // Bad input to machine 1 → InvalidArgument, machine unchanged.
    let client = maintenance(w).await;
    let oversized = vec![b'#'; 1024 * 1024 + 10];
    let wrong_cluster = config(&other, MachineType::Worker, "w", ip(cp));
    for bad in [
        b"{{{ not yaml".to_vec(),
        Vec::new(),
        oversized,
        wrong_cluster,
    ] {
        let err = client
            .apply_configuration(bad, ApplyMode::Auto)
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err:?}");
        assert_eq!(emulator.mode(ip(w)), Some(Mode::Maintenance));
    }
    client.version().await.unwrap();

    // Configured mode refuses: no client certificate, another CA's, no os:admin, wrong EKU.
    let refused = |r: Result<(), kontinuum_talos::Error>| {
        let err = r.unwrap_err();
        assert!(
            matches!(
                err.kind(),
                ErrorKind::Tls
                    | ErrorKind::PermissionDenied
                    | ErrorKind::Unreachable
                    | ErrorKind::Unavailable
            ),
            "{err:?}"
        );
    };
    let no_cert = async {
        TalosClient::connect_maintenance(&endpoint(cp), TIMEOUTS)
            .await?
            .bootstrap()
            .await
            .map(|_| ())
    };
    refused(no_cert.await);
    let other_admin = admin_talosconfig(
        &other,
        "x",
        &[],
        &[],
        jiff::Timestamp::now(),
        &mut rand_core::OsRng,
    )
    .unwrap()
    .identity;
    let foreign = ClientIdentity::new(
        bundle.os_ca().cert_pem.clone(),
        other_admin.cert_pem,
        other_admin.key_pem.expose(),
    );
    refused(
        async {
            configured_try(cp, &foreign)
                .await?
                .version()
                .await
                .map(|_| ())
        }
        .await,
    );
    let reader = leaf_cert(
        &bundle,
        "os:reader",
        vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth],
    );
    let reader = configured(cp, &reader).await;
    reader.version().await.unwrap();
    let denied = reader.bootstrap().await.unwrap_err();
    assert_eq!(denied.kind(), ErrorKind::PermissionDenied, "{denied:?}");
    let nobody = leaf_cert(
        &bundle,
        "system:masters",
        vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth],
    );
    let nobody = configured(cp, &nobody).await;
    assert_eq!(
        nobody.version().await.unwrap_err().kind(),
        ErrorKind::PermissionDenied
    );
    let both_ekus = leaf_cert(
        &bundle,
        "os:admin",
        vec![
            rcgen::ExtendedKeyUsagePurpose::ClientAuth,
            rcgen::ExtendedKeyUsagePurpose::ServerAuth,
        ],
    );
    refused(
        async {
            configured_try(cp, &both_ekus)
                .await?
                .version()
                .await
                .map(|_| ())
        }
        .await,
    );

    // Faults through the HTTP control interface.
    let control = emulator.control_addr().unwrap();
    let admin = configured(cp, &identity(&bundle)).await;
    admin.version().await.unwrap();
    let path = format!("/machines/{}/fault", cp.ip());
    let answer = http(control, "POST", &path, r#"{"fault":"hang","seconds":30}"#).await;
    assert!(answer.starts_with("HTTP/1.1 204"), "{answer}");
    let short = TalosClient::connect(
        &endpoint(cp),
        &identity(&bundle),
        Timeouts {
            connect: Duration::from_secs(2),
            rpc: Duration::from_secs(1),
        },
    )
    .await
    .unwrap();
    let t = Instant::now();
    for result in [
        short.version().await.map(|_| ()),
        short.bootstrap().await.map(|_| ()),
        short.kubeconfig().await.map(|_| ()),
        short.discover().await.map(|_| ()),
    ] {
        assert_eq!(result.unwrap_err().kind(), ErrorKind::TimedOut);
    }
    assert!(t.elapsed() < Duration::from_secs(6), "{:?}", t.elapsed());
    emulator.inject(ip(cp), Fault::Unavailable).await.unwrap();
    // The armed fault points by their HTTP names; `clear` disarms them too.
    for armed in [
        r#"{"fault":"hang-after-bootstrap","seconds":5}"#,
        r#"{"fault":"reboot-after-bootstrap"}"#,
        r#"{"fault":"drop-after-apply"}"#,
    ] {
        let answer = http(control, "POST", &path, armed).await;
        assert!(answer.starts_with("HTTP/1.1 204"), "{armed}: {answer}");
    }
    let answer = http(control, "POST", &path, r#"{"fault":"clear"}"#).await;
    assert!(answer.starts_with("HTTP/1.1 204"), "{answer}");
    // The calls the machine received, with their outcome: its config applied, every
    // Bootstrap refused (the first) or abandoned under the hang.
    let calls = emulator.calls(ip(cp)).unwrap();
    let outcome = |rpc: &str| -> Vec<Option<bool>> {
        calls
            .iter()
            .filter(|c| c.rpc == rpc)
            .map(|c| c.ok)
            .collect()
    };
    assert_eq!(outcome("ApplyConfiguration"), [Some(true)], "{calls:?}");
    let bootstraps = outcome("Bootstrap");
    assert!(
        bootstraps.len() >= 2 && bootstraps.iter().all(|ok| *ok != Some(true)),
        "{calls:?}"
    );
    assert!(
        calls
            .iter()
            .all(|c| c.ended_ms.is_none_or(|e| e >= c.started_ms))
    );
    let listed = http(control, "GET", &format!("/machines/{}/calls", cp.ip()), "").await;
    assert!(
        listed.starts_with("HTTP/1.1 200") && listed.contains(r#""rpc":"Bootstrap""#),
        "{listed}"
    );
    // The config it runs, as applied: in process and over the control interface.
    let running = emulator.running_config(ip(cp)).unwrap();
    assert!(running.contains("type: controlplane"), "{running}");
    let served = http(control, "GET", &format!("/machines/{}/config", cp.ip()), "").await;
    assert!(
        served.starts_with("HTTP/1.1 200") && served.ends_with(&running),
        "{served}"
    );
    let unknown = http(control, "GET", "/machines/127.9.9.9/config", "").await;
    assert!(unknown.starts_with("HTTP/1.1 404"), "{unknown}");
    emulator.inject(ip(cp), Fault::Unavailable).await.unwrap();
    assert_eq!(
        admin.version().await.unwrap_err().kind(),
        ErrorKind::Unavailable
    );
    emulator.inject(ip(cp), Fault::Clear).await.unwrap();
    admin.version().await.unwrap();
    emulator.inject(ip(cp), Fault::Refuse).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let err = TalosClient::connect_maintenance(&endpoint(cp), TIMEOUTS)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unreachable, "{err:?}");
    emulator.inject(ip(cp), Fault::Clear).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    configured(cp, &identity(&bundle))
        .await
        .version()
        .await
        .unwrap();
    let answer = http(
        control,
        "POST",
        "/machines/127.9.9.9/fault",
        r#"{"fault":"clear"}"#,
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 404"), "{answer}");
    let answer = http(control, "POST", &path, "nonsense").await;
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    let answer = http(control, "GET", "/machines", "").await;
    assert!(
        answer.contains(&format!("{} {} configured", cp.ip(), cp.port())),
        "{answer}"
    );

    // A restarted emulator keeps the applied config.
    emulator.shutdown().await;
    let emulator = Emulator::start(Settings {
        control_addr: None,
        ..settings
    })
    .await
    .unwrap();
    assert_eq!(emulator.mode(ip(cp)), Some(Mode::Configured));
    assert_eq!(emulator.mode(ip(w)), Some(Mode::Maintenance));
    let cp = emulator.addresses()[0];
    configured(cp, &identity(&bundle))
        .await
        .version()
        .await
        .unwrap();

    // Reboot: back to maintenance mode with the config still on disk.
    emulator.inject(ip(cp), Fault::Reboot).await.unwrap();
    assert_eq!(emulator.mode(ip(cp)), Some(Mode::Maintenance));
    assert!(dir.join(cp.ip().to_string()).join("config.yaml").exists());
    maintenance(cp).await.version().await.unwrap();
    emulator.shutdown().await;
}

async fn configured_try(
    addr: SocketAddr,
    id: &ClientIdentity,
) -> Result<TalosClient, kontinuum_talos::Error> {
    TalosClient::connect(&endpoint(addr), id, TIMEOUTS).await
}
