//! ApplyConfiguration decodes strictly, end to end over the emulator's gRPC (our Talos
//! client, maintenance TLS): a config with a key our generator could misspell, a value of
//! the wrong type, an unknown or duplicated document, or a combination Talos refuses is
//! `InvalidArgument` with Talos' kind of message, counted, and nothing is applied; the same
//! config spelled right is then applied. No control plane is started.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::net::Ipv4Addr;

use kontinuum_talos::{ApplyMode, ErrorKind};
use kontinuum_talos_config::MachineType;
use support::{config, ip, maintenance, new_bundle};
use talos_emulator::{Emulator, Mode, Settings};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_configs_are_refused_and_nothing_is_applied() {
    let dir = kontinuum_testbed::unique_dir("emulator-strict");
    std::fs::create_dir_all(&dir).unwrap();
    let emulator = Emulator::start(Settings {
        machines: 1,
        first_address: Ipv4Addr::new(127, 66, 0, 1),
        port: 0,
        api_port: 0,
        dir: dir.clone(),
        control_addr: None,
    })
    .await
    .unwrap();
    let addr = emulator.addresses()[0];
    let machine = ip(addr);
    let bundle = new_bundle();
    let good =
        String::from_utf8(config(&bundle, MachineType::ControlPlane, "cp", machine)).unwrap();
    let hostname_doc = "---\napiVersion: v1alpha1\nkind: HostnameConfig\nhostname: cp\n";

    let cases: Vec<(&str, String, &str)> = vec![
        (
            "a key our generator could misspell",
            good.replace(
                "allowSchedulingOnControlPlanes: true",
                "allowSchedulingOnControlPlane: true",
            ),
            "failed to parse config: error decoding document /v1alpha1/ (line 1): \
             .cluster.allowSchedulingOnControlPlane: unknown keys found during decoding",
        ),
        (
            "a value of the wrong type",
            good.replace("      port: 7445", "      port: \"7445\""),
            ".machine.features.kubePrism.port: cannot unmarshal !!str into int",
        ),
        (
            "an unknown document kind",
            format!("{good}---\napiVersion: v1alpha1\nkind: HostnameConfigs\nhostname: cp\n"),
            "\"HostnameConfigs\" \"v1alpha1\": not registered",
        ),
        (
            "a duplicated document",
            format!("{good}{hostname_doc}"),
            "duplicate document v1alpha1/HostnameConfig/ is not allowed",
        ),
        (
            "an invalid CNI",
            good.replace("name: none", "name: cilium"),
            "configuration validation failed: 1 error occurred:\n\t* v1alpha1: \
             .cluster.network.cni.name: cni name should be one of [\"flannel\", \"custom\", \"none\"]",
        ),
        (
            "a control plane without the Kubernetes CA key",
            drop_cluster_ca_key(&good),
            ".cluster.ca.key: Kubernetes CA key is required on control plane nodes",
        ),
    ];
    let client = maintenance(addr).await;
    for (i, (what, bad, expected)) in cases.iter().enumerate() {
        if i == 0 || i == 2 {
            // What the emulator checked before: the generator's own parser lets these through.
            assert!(
                kontinuum_talos_config::parse_machine_config(bad.as_bytes()).is_ok(),
                "{what}"
            );
        }
        let err = client
            .apply_configuration(bad.clone().into_bytes(), ApplyMode::Auto)
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{what}: {err:?}");
        let message = err.status().expect("a gRPC status").message().to_owned();
        assert!(message.contains(expected), "{what}: {message}");
        // Secrets are never echoed back.
        assert!(
            !message.contains(bundle.trustd_token().expose()),
            "{what}: {message}"
        );
        let refused = u32::try_from(i + 1).unwrap();
        assert_eq!(emulator.rejected_configs(machine), Some(refused), "{what}");
        assert_eq!(emulator.apply_calls(machine), Some(refused), "{what}");
        assert_eq!(emulator.mode(machine), Some(Mode::Maintenance), "{what}");
    }
    // Nothing was applied: the machine still answers in maintenance mode, and the config
    // spelled right is accepted.
    client.version().await.unwrap();
    client
        .apply_configuration(good.into_bytes(), ApplyMode::Auto)
        .await
        .unwrap();
    assert_eq!(emulator.mode(machine), Some(Mode::Configured));
    assert_eq!(emulator.rejected_configs(machine), Some(6));
    assert_eq!(emulator.apply_calls(machine), Some(7));
    emulator.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// The config without `cluster.ca.key` (the Kubernetes CA key), keeping its certificate.
fn drop_cluster_ca_key(config: &str) -> String {
    let mut out: Vec<&str> = Vec::new();
    let mut in_cluster_ca = false;
    for line in config.lines() {
        if line == "  ca:" && out.contains(&"cluster:") {
            in_cluster_ca = true;
        } else if in_cluster_ca && line.starts_with("    key:") {
            in_cluster_ca = false;
            continue;
        }
        out.push(line);
    }
    let result = out.join("\n") + "\n";
    assert_ne!(result, config, "the cluster CA key was found");
    result
}
