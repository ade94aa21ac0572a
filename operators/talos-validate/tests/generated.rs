//! Every config our generator (`kontinuum-talos-config`) writes for Talos v1.12 and v1.13 —
//! control plane and worker, install disk by path or selector, discovery on or off, extra
//! SANs — is accepted, and every key it emits is in the validator's allow-lists.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::OnceLock;

use kontinuum_talos_config::{
    ConfigInput, DiskSelector, InstallDisk, MachineType, SecretsBundle, TalosVersion,
    render_machine_config,
};
use kontinuum_talos_validate::{Contract, ProblemKind, allowed_keys, describe, validate};
use rand_chacha::ChaCha20Rng;
use rand_chacha::rand_core::SeedableRng as _;
use serde_json::Value;

fn bundle() -> &'static SecretsBundle {
    static BUNDLE: OnceLock<SecretsBundle> = OnceLock::new();
    BUNDLE.get_or_init(|| {
        SecretsBundle::generate_with_rsa_bits(
            &mut ChaCha20Rng::seed_from_u64(7),
            "2026-08-01T12:00:00Z".parse().unwrap(),
            &TalosVersion::parse("v1.13.8").unwrap(),
            1024,
        )
        .unwrap()
    })
}

/// The (Talos version, Kubernetes version) pairs a TalosCluster may ask for.
const LINES: [(&str, &str, Contract); 5] = [
    ("v1.12.4", "1.32.0", Contract::V1_12),
    ("v1.12.4", "1.35.0", Contract::V1_12),
    ("v1.13.0", "1.32.0", Contract::V1_13),
    ("v1.13.8", "1.36.2", Contract::V1_13),
    ("v1.13.8", "v1.31.0", Contract::V1_13),
];

fn inputs(talos: &str, kubernetes: &str) -> Vec<ConfigInput> {
    let version = TalosVersion::parse(talos).unwrap();
    let base = ConfigInput::new("demo", "10.0.0.10", version, kubernetes);
    let mut by_path = base.clone();
    by_path.install_disk = InstallDisk::Path("/dev/sda".into());
    let mut by_selector = base.clone();
    by_selector.install_disk = InstallDisk::Selector(DiskSelector {
        size: Some(">= 100GB".into()),
        model: Some("QEMU*".into()),
        disk_type: Some("ssd".into()),
        ..DiskSelector::default()
    });
    let mut no_discovery = base.clone();
    no_discovery.discovery = false;
    let mut extras = base.clone();
    extras.endpoint_host = "api.demo.example".into();
    extras.machine_cert_sans = vec!["127.0.0.1".into(), "node.example".into()];
    extras.api_server_cert_sans = vec!["api.example".into()];
    extras.pod_subnets = vec!["10.244.0.0/16".into(), "fd00:10:244::/56".into()];
    extras.install_image = Some("registry.local/installer:v1".into());
    let mut ipv6 = base.clone();
    ipv6.endpoint_host = "fd00::10".into();
    vec![base, by_path, by_selector, no_discovery, extras, ipv6]
}

fn configs() -> Vec<(String, Contract, Vec<u8>)> {
    let mut out = Vec::new();
    for (talos, kubernetes, contract) in LINES {
        for (i, input) in inputs(talos, kubernetes).iter().enumerate() {
            for kind in [MachineType::ControlPlane, MachineType::Worker] {
                let config = render_machine_config(input, bundle(), kind, "node-1").unwrap();
                out.push((
                    format!("{talos}/k8s {kubernetes}/input {i}/{kind}"),
                    contract,
                    config.expose().as_bytes().to_vec(),
                ));
            }
        }
    }
    out
}

#[test]
fn every_generated_config_is_accepted() {
    let configs = configs();
    for (what, contract, yaml) in &configs {
        if let Err(problems) = validate(yaml, *contract) {
            panic!("{what}: {}", describe(&problems));
        }
    }
    println!("{} generated configs accepted", configs.len());
    assert_eq!(configs.len(), 60);
}

/// Flattens a document's keys into allow-list paths (`[]` for items, `*` for map keys);
/// embedded objects (allowed paths without children) are not descended into.
fn flatten(value: &Value, prefix: &str, allowed: &[String], out: &mut Vec<String>) {
    let has_children = |p: &str| {
        allowed
            .iter()
            .any(|a| a.starts_with(&format!("{p}.")) || a.starts_with(&format!("{p}[]")))
    };
    match value {
        Value::Object(map) => {
            for (key, child) in map {
                let named = if prefix.is_empty() {
                    key.clone()
                } else {
                    format!("{prefix}.{key}")
                };
                let path = if allowed.contains(&named) {
                    named
                } else if allowed.contains(&format!("{prefix}.*")) {
                    format!("{prefix}.*")
                } else {
                    out.push(named);
                    continue;
                };
                if has_children(&path) {
                    flatten(child, &path, allowed, out);
                }
            }
        }
        Value::Array(items) => {
            for item in items {
                flatten(item, &format!("{prefix}[]"), allowed, out);
            }
        }
        _ => {}
    }
}

#[test]
fn allow_lists_cover_every_key_the_generator_emits() {
    let mut emitted = 0;
    for (what, _, yaml) in configs() {
        let documents: Vec<Value> =
            serde_saphyr::from_multiple(std::str::from_utf8(&yaml).unwrap()).unwrap();
        for document in documents {
            let kind = document
                .get("kind")
                .and_then(Value::as_str)
                .unwrap_or("v1alpha1")
                .to_owned();
            let allowed =
                allowed_keys(&kind).unwrap_or_else(|| panic!("{what}: {kind} not modeled"));
            let mut uncovered = Vec::new();
            flatten(&document, "", &allowed, &mut uncovered);
            assert!(
                uncovered.is_empty(),
                "{what}: {kind} keys not allowed: {uncovered:?}"
            );
            emitted += 1;
        }
    }
    assert_eq!(emitted, 120);
}

/// The generator does not check Kubernetes against the Talos line; real Talos v1.12 refuses
/// Kubernetes 1.36 (its range is 1.30–1.35), and so does the validator.
#[test]
fn kubernetes_too_new_for_v1_12_is_refused() {
    let input = ConfigInput::new(
        "demo",
        "10.0.0.10",
        TalosVersion::parse("v1.12.4").unwrap(),
        "1.36.2",
    );
    let config = render_machine_config(&input, bundle(), MachineType::Worker, "w-1").unwrap();
    let problems = validate(config.expose().as_bytes(), Contract::V1_12).unwrap_err();
    assert_eq!(problems.len(), 1, "{problems:#?}");
    assert_eq!(problems[0].kind, ProblemKind::Invalid);
    assert_eq!(problems[0].path, ".machine.kubelet.image");
    assert!(
        problems[0]
            .message
            .contains("too new to be used with Talos v1.12")
    );
}

/// A typo our generator could make, in every generated config, is caught.
#[test]
fn a_misspelled_generated_key_is_refused() {
    for (what, contract, yaml) in configs() {
        let text = String::from_utf8(yaml).unwrap();
        let misspelled = text.replace("disableManifestsDirectory", "disableManifestDirectory");
        let problems = validate(misspelled.as_bytes(), contract).unwrap_err();
        assert_eq!(problems.len(), 1, "{what}: {problems:#?}");
        assert_eq!(
            problems[0].path, ".machine.kubelet.disableManifestDirectory",
            "{what}"
        );
        assert_eq!(problems[0].kind, ProblemKind::UnknownKey);
    }
}
