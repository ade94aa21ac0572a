//! Reboot and Upgrade against the emulator, through a raw `MachineService` client (our client
//! crate has neither RPC yet). Needs the test-bed binaries (KONTINUUM_TESTBED_BIN): the
//! machine is a bootstrapped control plane, so that a reboot is shown to keep its cluster.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::too_many_lines
)]

mod support;

use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use kontinuum_proto::talos::machine::reboot_request::Mode as RebootMode;
use kontinuum_proto::talos::machine::{RebootRequest, UpgradeRequest};
use kontinuum_talos::{ErrorKind, TalosClient};
use kontinuum_talos_config::MachineType;
use kube::Api;
use kube::api::PostParams;
use support::{
    TIMEOUTS, Tls, admin_tls, apply_and_bootstrap, config, endpoint, identity, ip, new_bundle,
    one_machine, raw_machine, role_tls,
};
use talos_emulator::{Emulator, Mode};

/// How long the machine stays away in this test: long enough to be seen from outside.
const DOWNTIME: Duration = Duration::from_secs(3);
/// What a reboot is seen to last at least, from the answer (the port is probed from outside).
const AWAY_AT_LEAST: Duration = Duration::from_millis(2800);

/// Waits until new connections to `addr` are refused, then until the machine answers
/// Version again over a new mTLS connection; returns how long after `since` it came back and
/// the version it reports.
async fn down_then_back(
    addr: SocketAddr,
    bundle: &kontinuum_talos_config::SecretsBundle,
    since: Instant,
) -> (Duration, String) {
    let deadline = since + DOWNTIME / 2;
    loop {
        match TalosClient::connect_maintenance(&endpoint(addr), TIMEOUTS).await {
            Err(err) if err.kind() == ErrorKind::Unreachable => break,
            _ => {}
        }
        assert!(Instant::now() < deadline, "the machine never went away");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let deadline = since + DOWNTIME + Duration::from_secs(10);
    loop {
        if let Ok(client) = TalosClient::connect(&endpoint(addr), &identity(bundle), TIMEOUTS).await
            && let Ok(version) = client.version().await
        {
            return (since.elapsed(), version.tag);
        }
        assert!(Instant::now() < deadline, "the machine did not come back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn config_map_exists(kubeconfig: &str, name: &str) -> bool {
    let client = kontinuum_testbed::client_from(kubeconfig).await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(client, "default");
    tokio::time::timeout(TIMEOUTS.rpc, api.get_opt(name))
        .await
        .unwrap()
        .unwrap()
        .is_some()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reboot_and_upgrade() {
    kontinuum_testbed::Tools::locate().expect("test-bed binaries (KONTINUUM_TESTBED_BIN)");
    let started = Instant::now();
    let settings = one_machine("emulator-lifecycle", Ipv4Addr::new(127, 67, 0, 1));
    let emulator = Emulator::start(settings.clone()).await.unwrap();
    emulator.set_reboot_downtime(DOWNTIME);
    let cp = emulator.addresses()[0];
    let bundle = new_bundle();
    let reboot = RebootRequest {
        mode: RebootMode::Default.into(),
    };
    let upgrade = |image: &str| UpgradeRequest {
        image: image.to_owned(),
        ..UpgradeRequest::default()
    };

    // Maintenance mode: every caller is os:reader, both are refused by the authorizer.
    let mut raw = raw_machine(cp, Tls::Maintenance).await;
    let code = raw.reboot(reboot).await.unwrap_err().code();
    assert_eq!(code, tonic::Code::PermissionDenied);
    let code = raw
        .upgrade(upgrade("ghcr.io/siderolabs/installer:v1.13.9"))
        .await
        .unwrap_err()
        .code();
    assert_eq!(code, tonic::Code::PermissionDenied);
    assert_eq!(emulator.mode(ip(cp)), Some(Mode::Maintenance));

    // Configured, bootstrapped, a Kubernetes object written.
    let control_plane = config(&bundle, MachineType::ControlPlane, "cp", ip(cp));
    let admin = apply_and_bootstrap(cp, control_plane, &bundle).await;
    let kubeconfig = {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if let Ok(k) = admin.kubeconfig().await
                && let Ok(k) = String::from_utf8(k.into_bytes())
                && let Ok(client) = kontinuum_testbed::client_from(&k).await
                && Api::<ConfigMap>::namespaced(client, "default")
                    .create(
                        &PostParams::default(),
                        &serde_json::from_value(serde_json::json!({
                            "metadata": {"name": "before-reboot"}
                        }))
                        .unwrap(),
                    )
                    .await
                    .is_ok()
            {
                break k;
            }
            assert!(
                Instant::now() < deadline,
                "the control plane did not come up"
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    };
    let bootstrapped = started.elapsed();

    // Roles: Reboot wants admin or operator, Upgrade admin.
    let reader = raw_machine(cp, role_tls(&bundle, "os:reader")).await;
    let code = reader.clone().reboot(reboot).await.unwrap_err().code();
    assert_eq!(code, tonic::Code::PermissionDenied);
    let mut operator = raw_machine(cp, role_tls(&bundle, "os:operator")).await;
    let code = operator
        .upgrade(upgrade("ghcr.io/siderolabs/installer:v1.13.9"))
        .await
        .unwrap_err()
        .code();
    assert_eq!(code, tonic::Code::PermissionDenied);

    // Reboot by an operator: answered, away for the downtime, back as it was.
    let answer = operator.reboot(reboot).await.unwrap().into_inner();
    let since = Instant::now();
    assert_eq!(answer.messages.len(), 1);
    assert!(!answer.messages[0].actor_id.is_empty());
    assert_eq!(
        admin.version().await.unwrap_err().kind(),
        ErrorKind::Unavailable,
        "a connection made before the reboot is stale"
    );
    let (away, tag) = down_then_back(cp, &bundle, since).await;
    assert!(away >= AWAY_AT_LEAST, "{away:?}");
    assert_eq!(tag, talos_emulator::TALOS_TAG);
    assert_eq!(emulator.mode(ip(cp)), Some(Mode::Configured));
    assert!(config_map_exists(&kubeconfig, "before-reboot").await);

    // A malformed installer reference: InvalidArgument, nothing happens.
    let mut admin_raw = raw_machine(cp, admin_tls(&bundle)).await;
    for bad in ["ghcr.io/siderolabs/Installer:v1.13.9", "installer:v1:2", ""] {
        let status = admin_raw.upgrade(upgrade(bad)).await.unwrap_err();
        assert_eq!(
            status.code(),
            tonic::Code::InvalidArgument,
            "{bad:?}: {status:?}"
        );
    }
    let client = TalosClient::connect(&endpoint(cp), &identity(&bundle), TIMEOUTS)
        .await
        .unwrap();
    assert_eq!(
        client.version().await.unwrap().tag,
        talos_emulator::TALOS_TAG
    );

    // Upgrade: acknowledged, a reboot, then the installer's version.
    let answer = admin_raw
        .upgrade(UpgradeRequest {
            image: "ghcr.io/siderolabs/installer:v1.13.9".to_owned(),
            reboot_mode: 1, // POWERCYCLE
            ..UpgradeRequest::default()
        })
        .await
        .unwrap()
        .into_inner();
    let since = Instant::now();
    assert_eq!(answer.messages[0].ack, "Upgrade request received");
    assert!(!answer.messages[0].actor_id.is_empty());
    let (away, tag) = down_then_back(cp, &bundle, since).await;
    assert!(away >= AWAY_AT_LEAST, "{away:?}");
    assert_eq!(tag, "v1.13.9");
    assert_eq!(emulator.mode(ip(cp)), Some(Mode::Configured));
    assert!(config_map_exists(&kubeconfig, "before-reboot").await);

    // Counted and recorded like the other RPCs.
    assert_eq!(emulator.reboot_calls(ip(cp)), Some(3));
    assert_eq!(emulator.upgrade_calls(ip(cp)), Some(6));
    let calls = emulator.calls(ip(cp)).unwrap();
    let outcome = |rpc: &str| -> Vec<Option<bool>> {
        calls
            .iter()
            .filter(|c| c.rpc == rpc)
            .map(|c| c.ok)
            .collect()
    };
    assert_eq!(
        outcome("Reboot"),
        [Some(false), Some(false), Some(true)],
        "{calls:?}"
    );
    let upgrades = outcome("Upgrade");
    assert_eq!(upgrades.len(), 6, "{calls:?}");
    assert_eq!(upgrades.iter().filter(|ok| **ok == Some(true)).count(), 1);
    assert_eq!(upgrades.last(), Some(&Some(true)));

    // The installed version is on disk: a restarted emulator still runs it.
    emulator.shutdown().await;
    let emulator = Emulator::start(settings).await.unwrap();
    let cp = emulator.addresses()[0]; // a new free port
    let client = TalosClient::connect(&endpoint(cp), &identity(&bundle), TIMEOUTS)
        .await
        .unwrap();
    assert_eq!(client.version().await.unwrap().tag, "v1.13.9");
    emulator.shutdown().await;
    report(bootstrapped, started.elapsed());
}

#[allow(clippy::print_stderr)]
fn report(bootstrapped: Duration, total: Duration) {
    eprintln!("bootstrapped after {bootstrapped:?}; reboot, upgrade and restart: {total:?} in all");
}
