//! Tests across the crate: bundles, configs, the parser and the talosconfig.
//!
//! One bundle is generated per test binary (a 1024-bit service-account key keeps debug
//! builds fast; the 4096-bit default has one test of its own, fast because the workspace
//! optimises the rsa crates in dev builds).

use std::collections::HashSet;
use std::sync::OnceLock;

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE};
use rand_chacha::ChaCha20Rng;
use rand_core::{CryptoRng, RngCore, SeedableRng as _};
use serde_json::{Value, json};
use x509_parser::certificate::X509Certificate;
use x509_parser::extensions::GeneralName;
use x509_parser::oid_registry::{OID_EC_P256, OID_KEY_TYPE_EC_PUBLIC_KEY, OID_SIG_ED25519};

use crate::*;

const TEST_RSA_BITS: usize = 1024;

fn now() -> jiff::Timestamp {
    "2026-08-01T12:00:00Z".parse().unwrap()
}

fn v(version: &str) -> TalosVersion {
    TalosVersion::parse(version).unwrap()
}

fn rng(seed: u64) -> ChaCha20Rng {
    ChaCha20Rng::seed_from_u64(seed)
}

fn bundle() -> &'static SecretsBundle {
    static BUNDLE: OnceLock<SecretsBundle> = OnceLock::new();
    BUNDLE.get_or_init(|| {
        SecretsBundle::generate_with_rsa_bits(&mut rng(42), now(), &v("v1.13.8"), TEST_RSA_BITS)
            .unwrap()
    })
}

fn input(version: &str) -> ConfigInput {
    ConfigInput::new("demo", "10.0.0.10", v(version), "1.36.2")
}

fn pem_der(pem: &str) -> (String, Vec<u8>) {
    let (_, block) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).unwrap();
    (block.label, block.contents)
}

fn with_cert<T>(pem: &str, f: impl FnOnce(&X509Certificate<'_>) -> T) -> T {
    let (label, der) = pem_der(pem);
    assert_eq!(label, "CERTIFICATE");
    let (rest, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
    assert!(rest.is_empty());
    f(&cert)
}

fn organizations(cert: &X509Certificate<'_>) -> Vec<String> {
    cert.subject()
        .iter_organization()
        .map(|o| o.as_str().unwrap().to_owned())
        .collect()
}

fn common_names(cert: &X509Certificate<'_>) -> Vec<String> {
    cert.subject()
        .iter_common_name()
        .map(|o| o.as_str().unwrap().to_owned())
        .collect()
}

fn b64_pem(value: &Value) -> String {
    String::from_utf8(STANDARD.decode(value.as_str().unwrap()).unwrap()).unwrap()
}

/// The documents of a rendered config as JSON values.
fn documents(config: &MachineConfig) -> Vec<Value> {
    serde_saphyr::from_multiple(config.expose()).unwrap()
}

fn render(version: &str, machine_type: MachineType) -> MachineConfig {
    render_machine_config(&input(version), bundle(), machine_type, "node-1").unwrap()
}

// ---------------------------------------------------------------- secrets bundle

#[derive(Clone, Copy)]
enum CaCheck {
    Ed25519,
    P256,
}

fn check_ca(ca: &CertAndKey, kind: CaCheck, org: Option<&str>, cn: Option<&str>) {
    with_cert(&ca.cert_pem, |cert| {
        // Self-signed, and the signature verifies.
        assert_eq!(cert.subject(), cert.issuer());
        cert.verify_signature(None).unwrap();
        assert!(cert.is_ca());
        let ku = cert.key_usage().unwrap().unwrap().value;
        assert!(ku.key_cert_sign() && ku.digital_signature());
        let eku = cert.extended_key_usage().unwrap().unwrap().value;
        assert!(eku.server_auth && eku.client_auth);
        assert!(cert.subject_alternative_name().unwrap().is_none());
        assert!(
            cert.get_extension_unique(
                &x509_parser::oid_registry::OID_X509_EXT_SUBJECT_KEY_IDENTIFIER
            )
            .unwrap()
            .is_some()
        );
        // Valid from now for 87 600 h.
        assert_eq!(cert.validity().not_before.timestamp(), now().as_second());
        assert_eq!(
            cert.validity().not_after.timestamp(),
            now().as_second() + 87_600 * 3600
        );
        assert_eq!(
            organizations(cert),
            org.map(str::to_owned).into_iter().collect::<Vec<_>>()
        );
        assert_eq!(
            common_names(cert),
            cn.map(str::to_owned).into_iter().collect::<Vec<_>>()
        );
        let spki = cert.public_key();
        match kind {
            CaCheck::Ed25519 => {
                assert_eq!(spki.algorithm.algorithm, OID_SIG_ED25519);
                assert_eq!(cert.signature_algorithm.algorithm, OID_SIG_ED25519);
            }
            CaCheck::P256 => {
                assert_eq!(spki.algorithm.algorithm, OID_KEY_TYPE_EC_PUBLIC_KEY);
                let curve = spki
                    .algorithm
                    .parameters
                    .as_ref()
                    .unwrap()
                    .as_oid()
                    .unwrap();
                assert_eq!(curve, OID_EC_P256);
                assert_eq!(
                    cert.signature_algorithm.algorithm,
                    x509_parser::oid_registry::OID_SIG_ECDSA_WITH_SHA256
                );
            }
        }
    });
    let (label, der) = pem_der(ca.key_pem.expose());
    match kind {
        CaCheck::Ed25519 => {
            assert_eq!(label, "ED25519 PRIVATE KEY");
            assert_eq!(
                der.len(),
                48,
                "PKCS#8 v1 with the seed only, as Go writes it"
            );
        }
        CaCheck::P256 => {
            assert_eq!(label, "EC PRIVATE KEY");
            p256::SecretKey::from_sec1_der(&der).unwrap();
        }
    }
}

#[test]
fn bundle_cas_have_talos_algorithms_subjects_and_validity() {
    let b = bundle();
    check_ca(b.os_ca(), CaCheck::Ed25519, Some("talos"), None);
    check_ca(b.kubernetes_ca(), CaCheck::P256, Some("kubernetes"), None);
    check_ca(b.aggregator_ca(), CaCheck::P256, None, Some("front-proxy"));
    check_ca(b.etcd_ca(), CaCheck::P256, Some("etcd"), None);
}

#[test]
fn service_account_key_is_pkcs1_rsa() {
    use rsa::pkcs1::DecodeRsaPrivateKey as _;
    use rsa::traits::PublicKeyParts as _;
    let pem = bundle().service_account_key().expose();
    assert!(pem.starts_with("-----BEGIN RSA PRIVATE KEY-----\n"));
    let key = rsa::RsaPrivateKey::from_pkcs1_pem(pem).unwrap();
    assert_eq!(key.size() * 8, TEST_RSA_BITS);
}

#[test]
fn default_service_account_key_is_rsa_4096() {
    use rsa::pkcs1::DecodeRsaPrivateKey as _;
    use rsa::traits::PublicKeyParts as _;
    let b = SecretsBundle::generate(&mut rand_core::OsRng, now(), &v("v1.13.8")).unwrap();
    let key = rsa::RsaPrivateKey::from_pkcs1_pem(b.service_account_key().expose()).unwrap();
    assert_eq!(key.size() * 8, SERVICE_ACCOUNT_RSA_BITS);
}

#[test]
fn random_values_have_talos_encodings() {
    let b = bundle();
    let id = URL_SAFE.decode(b.cluster_id()).unwrap();
    assert_eq!(id.len(), 32);
    assert!(b.cluster_id().ends_with('='), "padded URL encoding");
    assert_eq!(
        STANDARD.decode(b.cluster_secret().expose()).unwrap().len(),
        32
    );
    assert_eq!(
        STANDARD
            .decode(b.secretbox_encryption_secret().expose())
            .unwrap()
            .len(),
        32
    );
    for token in [b.bootstrap_token(), b.trustd_token()] {
        assert!(crate::secrets::is_token(token.expose()), "{token:?}");
    }
    assert_ne!(b.bootstrap_token(), b.trustd_token());
}

#[test]
fn tokens_are_well_formed_unique_and_uniform() {
    let mut r = rng(1);
    let mut seen = HashSet::new();
    let mut counts = [0_u32; 36];
    for _ in 0..2000 {
        let token = crate::secrets::generate_token(&mut r);
        let t = token.expose();
        assert!(crate::secrets::is_token(t), "{t}");
        assert!(seen.insert(t.to_owned()), "duplicate token");
        for c in t.bytes().filter(|&c| c != b'.') {
            let i = b"0123456789abcdefghijklmnopqrstuvwxyz"
                .iter()
                .position(|&a| a == c)
                .unwrap();
            counts[i] += 1;
        }
    }
    // 44 000 characters over 36 symbols: ~1222 each; a biased or broken alphabet falls out.
    let mean = 2000 * 22 / 36;
    for (i, &n) in counts.iter().enumerate() {
        assert!(n > mean * 8 / 10 && n < mean * 12 / 10, "symbol {i}: {n}");
    }
}

/// An RNG replaying fixed bytes, to show that bytes ≥ 252 are skipped.
struct Replay(Vec<u8>, usize);

impl RngCore for Replay {
    fn next_u32(&mut self) -> u32 {
        rand_core::impls::next_u32_via_fill(self)
    }
    fn next_u64(&mut self) -> u64 {
        rand_core::impls::next_u64_via_fill(self)
    }
    fn fill_bytes(&mut self, dest: &mut [u8]) {
        for b in dest {
            *b = self.0[self.1 % self.0.len()];
            self.1 += 1;
        }
    }
    fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), rand_core::Error> {
        self.fill_bytes(dest);
        Ok(())
    }
}
impl CryptoRng for Replay {}

#[test]
fn token_rejects_biased_bytes() {
    // 252..=255 would map to 0..=3 and favour "0123"; they must be dropped.
    let mut r = Replay(vec![252, 253, 254, 255, 10, 35, 36, 251], 0);
    let token = crate::secrets::generate_token(&mut r);
    assert_eq!(&token.expose()[..4], "az0z");
    assert!(!token.expose().contains('1'));
}

#[test]
fn bundle_json_uses_go_field_names_and_round_trips() {
    let b = bundle();
    let json = b.to_json().unwrap();
    let value: Value = serde_json::from_str(json.expose()).unwrap();
    assert_eq!(value["Cluster"]["Id"], b.cluster_id());
    assert_eq!(value["Cluster"]["Secret"], b.cluster_secret().expose());
    assert_eq!(
        value["Secrets"]["BootstrapToken"],
        b.bootstrap_token().expose()
    );
    assert_eq!(
        value["Secrets"]["SecretboxEncryptionSecret"],
        b.secretbox_encryption_secret().expose()
    );
    assert!(value["Secrets"].get("AESCBCEncryptionSecret").is_none());
    assert_eq!(value["TrustdInfo"]["Token"], b.trustd_token().expose());
    for (name, ca) in [
        ("Etcd", b.etcd_ca()),
        ("K8s", b.kubernetes_ca()),
        ("K8sAggregator", b.aggregator_ca()),
        ("OS", b.os_ca()),
    ] {
        assert_eq!(b64_pem(&value["Certs"][name]["Crt"]), ca.cert_pem);
        assert_eq!(b64_pem(&value["Certs"][name]["Key"]), ca.key_pem.expose());
    }
    assert_eq!(
        b64_pem(&value["Certs"]["K8sServiceAccount"]["Key"]),
        b.service_account_key().expose()
    );
    let back = SecretsBundle::from_json(json.expose().as_bytes()).unwrap();
    assert_eq!(&back, b);
}

#[test]
fn bundle_json_rejects_broken_bundles() {
    let json = bundle().to_json().unwrap();
    let good: Value = serde_json::from_str(json.expose()).unwrap();
    let reject = |mutate: &dyn Fn(&mut Value), field: &str| {
        let mut value = good.clone();
        mutate(&mut value);
        let err = SecretsBundle::from_json(value.to_string().as_bytes()).unwrap_err();
        assert!(err.to_string().contains(field), "{field}: {err}");
        assert_eq!(err.reason(), "InvalidSecretsBundle", "{field}: {err}");
    };
    assert!(SecretsBundle::from_json(b"").is_err());
    assert!(SecretsBundle::from_json(b"garbage").is_err());
    assert!(SecretsBundle::from_json(b"{}").is_err());
    reject(&|v| v["Cluster"]["Id"] = json!(""), "Cluster.Id");
    reject(&|v| v["Cluster"]["Id"] = json!("***"), "Cluster.Id");
    reject(
        &|v| v["Secrets"]["BootstrapToken"] = json!("ABCDEF.0123456789abcdef"),
        "Secrets.BootstrapToken",
    );
    reject(
        &|v| v["TrustdInfo"]["Token"] = json!("abc.def"),
        "TrustdInfo.Token",
    );
    reject(
        &|v| v["Secrets"]["AESCBCEncryptionSecret"] = json!("c2VjcmV0"),
        "AESCBC",
    );
    reject(
        &|v| v["Certs"]["OS"]["Crt"] = json!("not base64!"),
        "Certs.OS.Crt",
    );
    reject(
        &|v| v["Certs"]["K8sServiceAccount"]["Key"] = v["Certs"]["OS"]["Crt"].clone(),
        "Certs.K8sServiceAccount.Key",
    );
    // Wrong key type in a slot, and a key that does not match its certificate.
    let invalid_cert = |mutate: &dyn Fn(&mut Value), problem: &str| {
        let mut value = good.clone();
        mutate(&mut value);
        let err = SecretsBundle::from_json(value.to_string().as_bytes()).unwrap_err();
        assert_eq!(err.reason(), "InvalidCertificate");
        assert!(err.to_string().contains(problem), "{err}");
    };
    invalid_cert(
        &|v| v["Certs"]["OS"]["Key"] = v["Certs"]["K8s"]["Key"].clone(),
        "wrong type",
    );
    invalid_cert(
        &|v| v["Certs"]["K8s"]["Key"] = v["Certs"]["Etcd"]["Key"].clone(),
        "does not match",
    );
}

#[test]
fn bundle_refuses_unsupported_versions_and_key_sizes() {
    let err = SecretsBundle::generate(&mut rng(3), now(), &v("v1.9.0")).unwrap_err();
    assert_eq!(err.reason(), "UnsupportedTalosVersion");
    let err =
        SecretsBundle::generate_with_rsa_bits(&mut rng(3), now(), &v("v1.13.0"), 512).unwrap_err();
    assert_eq!(err.reason(), "InvalidKeySize");
}

#[test]
fn secrets_never_show_in_debug() {
    let b = bundle();
    let debug = format!("{b:?} {:?} {:?}", b.os_ca(), b.trustd_token());
    for secret in [
        b.cluster_secret().expose(),
        b.bootstrap_token().expose(),
        b.trustd_token().expose(),
        b.secretbox_encryption_secret().expose(),
    ] {
        assert!(!debug.contains(secret));
    }
    assert!(!debug.contains("PRIVATE KEY"));
    assert!(debug.contains("[REDACTED]"));
    let config = render("v1.13.8", MachineType::ControlPlane);
    assert_eq!(format!("{config:?}"), "MachineConfig([REDACTED])");
    let parsed = parse_machine_config(config.expose().as_bytes()).unwrap();
    let debug = format!("{parsed:?}");
    assert!(!debug.contains("PRIVATE KEY") && !debug.contains(b.trustd_token().expose()));
}

#[test]
fn ca_issuer_signs_serving_certificates_with_sans() {
    // What the emulator does with the Kubernetes CA from an applied config.
    let ca = bundle().kubernetes_ca();
    let issuer = ca.issuer().unwrap();
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let mut params =
        rcgen::CertificateParams::new(vec!["kubernetes".to_owned(), "10.0.0.10".to_owned()])
            .unwrap();
    params.use_authority_key_identifier_extension = true;
    let cert = params.signed_by(&key, &issuer).unwrap();
    with_cert(&ca.cert_pem, |ca_cert| {
        let (_, leaf) = x509_parser::parse_x509_certificate(cert.der()).unwrap();
        assert_eq!(leaf.issuer(), ca_cert.subject());
        leaf.verify_signature(Some(ca_cert.public_key())).unwrap();
        let san = leaf.subject_alternative_name().unwrap().unwrap().value;
        assert!(
            san.general_names
                .contains(&GeneralName::DNSName("kubernetes"))
        );
        assert!(
            san.general_names
                .contains(&GeneralName::IPAddress(&[10, 0, 0, 10]))
        );
    });
    // Keys in Talos' PEM forms convert to PKCS#8 for rustls.
    private_key_pkcs8_der(ca.key_pem.expose()).unwrap();
    private_key_pkcs8_der(bundle().os_ca().key_pem.expose()).unwrap();
}

// ---------------------------------------------------------------- machine configs

#[test]
fn controlplane_config_parses_back_field_by_field() {
    let b = bundle();
    let config = render("v1.13.8", MachineType::ControlPlane);
    let parsed = parse_machine_config(config.expose().as_bytes()).unwrap();
    assert_eq!(parsed.machine_type, MachineType::ControlPlane);
    assert_eq!(&parsed.machine_token, b.trustd_token());
    assert_eq!(parsed.os_ca.cert_pem, b.os_ca().cert_pem);
    assert_eq!(parsed.os_ca.key_pem.as_ref(), Some(&b.os_ca().key_pem));
    assert_eq!(parsed.kubernetes_ca.cert_pem, b.kubernetes_ca().cert_pem);
    assert_eq!(
        parsed.kubernetes_ca.key_pem.as_ref(),
        Some(&b.kubernetes_ca().key_pem)
    );
    assert_eq!(parsed.cluster_endpoint, "https://10.0.0.10:6443");
    assert_eq!(parsed.cluster_name.as_deref(), Some("demo"));
    assert_eq!(parsed.cluster_id.as_deref(), Some(b.cluster_id()));
    assert_eq!(parsed.bootstrap_token.as_ref(), Some(b.bootstrap_token()));
    assert_eq!(parsed.hostname.as_deref(), Some("node-1"));
    assert_eq!(
        parsed.install_disk,
        InstallDisk::Selector(DiskSelector::default())
    );
    assert!(parsed.machine_cert_sans.is_empty());
}

#[test]
fn controlplane_config_documents_have_the_contract_fields() {
    let b = bundle();
    let config = render("v1.13.8", MachineType::ControlPlane);
    let docs = documents(&config);
    assert_eq!(docs.len(), 2);
    let (config_doc, hostname_doc) = (&docs[0], &docs[1]);
    assert_eq!(config_doc["version"], "v1alpha1");
    assert_eq!(config_doc["debug"], false);
    assert_eq!(config_doc["persist"], true);
    let m = &config_doc["machine"];
    assert_eq!(m["type"], "controlplane");
    assert_eq!(m["kubelet"]["image"], "ghcr.io/siderolabs/kubelet:v1.36.2");
    assert_eq!(m["kubelet"]["defaultRuntimeSeccompProfileEnabled"], true);
    assert_eq!(m["kubelet"]["disableManifestsDirectory"], true);
    assert!(m.get("network").is_none(), "not emitted for contract 1.13");
    assert_eq!(m["install"]["diskSelector"], json!({}));
    assert!(m["install"].get("disk").is_none());
    assert_eq!(
        m["install"]["image"],
        "ghcr.io/siderolabs/installer:v1.13.8"
    );
    assert_eq!(m["install"]["wipe"], false);
    assert_eq!(m["install"]["grubUseUKICmdline"], true);
    assert_eq!(m["features"]["diskQuotaSupport"], true);
    assert_eq!(
        m["features"]["kubePrism"],
        json!({"enabled": true, "port": 7445})
    );
    assert_eq!(
        m["features"]["hostDNS"],
        json!({"enabled": true, "forwardKubeDNSToHost": true})
    );
    assert!(m["features"].get("rbac").is_none());
    assert_eq!(
        m["nodeLabels"],
        json!({"node.kubernetes.io/exclude-from-external-load-balancers": ""})
    );
    let k = &config_doc["cluster"];
    assert_eq!(k["controlPlane"]["endpoint"], "https://10.0.0.10:6443");
    assert_eq!(k["clusterName"], "demo");
    assert_eq!(k["id"], b.cluster_id());
    assert_eq!(k["secret"], b.cluster_secret().expose());
    assert_eq!(k["token"], b.bootstrap_token().expose());
    assert_eq!(
        k["secretboxEncryptionSecret"],
        b.secretbox_encryption_secret().expose()
    );
    assert_eq!(
        k["network"],
        json!({
            "cni": {"name": "none"},
            "dnsDomain": "cluster.local",
            "podSubnets": ["10.244.0.0/16"],
            "serviceSubnets": ["10.96.0.0/12"],
        })
    );
    assert_eq!(
        b64_pem(&k["aggregatorCA"]["crt"]),
        b.aggregator_ca().cert_pem
    );
    assert_eq!(
        b64_pem(&k["aggregatorCA"]["key"]),
        b.aggregator_ca().key_pem.expose()
    );
    assert_eq!(b64_pem(&k["etcd"]["ca"]["crt"]), b.etcd_ca().cert_pem);
    assert_eq!(
        b64_pem(&k["etcd"]["ca"]["key"]),
        b.etcd_ca().key_pem.expose()
    );
    assert_eq!(
        b64_pem(&k["serviceAccount"]["key"]),
        b.service_account_key().expose()
    );
    assert_eq!(
        k["apiServer"]["image"],
        "registry.k8s.io/kube-apiserver:v1.36.2"
    );
    assert_eq!(k["apiServer"]["admissionControl"][0]["name"], "PodSecurity");
    assert_eq!(
        k["apiServer"]["auditPolicy"]["rules"][0]["level"],
        "Metadata"
    );
    assert_eq!(
        k["controllerManager"]["image"],
        "registry.k8s.io/kube-controller-manager:v1.36.2"
    );
    assert_eq!(
        k["scheduler"]["image"],
        "registry.k8s.io/kube-scheduler:v1.36.2"
    );
    assert_eq!(k["proxy"], json!({"disabled": true}));
    assert_eq!(
        k["discovery"],
        json!({"enabled": true, "registries": {"kubernetes": {"disabled": true}, "service": {}}})
    );
    assert_eq!(k["allowSchedulingOnControlPlanes"], true);
    assert_eq!(
        hostname_doc,
        &json!({"apiVersion": "v1alpha1", "kind": "HostnameConfig", "hostname": "node-1"})
    );
}

#[test]
fn worker_config_has_no_keys_or_control_plane_sections() {
    let b = bundle();
    let config = render("v1.13.8", MachineType::Worker);
    let parsed = parse_machine_config(config.expose().as_bytes()).unwrap();
    assert_eq!(parsed.machine_type, MachineType::Worker);
    assert_eq!(parsed.os_ca.cert_pem, b.os_ca().cert_pem);
    assert!(parsed.os_ca.key_pem.is_none());
    assert!(parsed.kubernetes_ca.key_pem.is_none());
    assert_eq!(parsed.cluster_name.as_deref(), Some("demo"));
    assert_eq!(&parsed.machine_token, b.trustd_token());
    assert_eq!(parsed.bootstrap_token.as_ref(), Some(b.bootstrap_token()));

    let docs = documents(&config);
    let (m, k) = (&docs[0]["machine"], &docs[0]["cluster"]);
    assert_eq!(m["type"], "worker");
    assert_eq!(m["ca"]["key"], "");
    assert_eq!(k["ca"]["key"], "");
    assert!(m.get("nodeLabels").is_none());
    for absent in [
        "aggregatorCA",
        "serviceAccount",
        "etcd",
        "secretboxEncryptionSecret",
        "apiServer",
        "controllerManager",
        "scheduler",
        "proxy",
        "allowSchedulingOnControlPlanes",
    ] {
        assert!(k.get(absent).is_none(), "{absent} on a worker");
    }
    assert_eq!(k["network"]["cni"]["name"], "none");
    assert_eq!(m["features"]["kubePrism"]["port"], 7445);
    assert_eq!(docs[1]["hostname"], "node-1");
    let text = config.expose();
    for key in [
        &b.os_ca().key_pem,
        &b.kubernetes_ca().key_pem,
        &b.etcd_ca().key_pem,
        b.service_account_key(),
    ] {
        assert!(!text.contains(&STANDARD.encode(key.expose())));
    }
}

#[test]
fn contract_1_12_keeps_machine_network() {
    let docs = documents(&render("v1.12.4", MachineType::ControlPlane));
    assert_eq!(docs[0]["machine"]["network"], json!({}));
    assert_eq!(
        docs[0]["machine"]["install"]["image"],
        "ghcr.io/siderolabs/installer:v1.12.4"
    );
    assert_eq!(docs[1]["kind"], "HostnameConfig");
    let docs = documents(&render("v1.13.0", MachineType::Worker));
    assert!(docs[0]["machine"].get("network").is_none());
}

#[test]
fn install_disk_path_ipv6_endpoint_and_overrides() {
    let mut i = ConfigInput::new("edge", "fd00::10", v("v1.13.8"), "v1.35.0");
    i.install_disk = InstallDisk::Path("/dev/vda".to_owned());
    i.install_image = Some("registry.example/installer:v1.13.8".to_owned());
    i.pod_subnets = vec!["10.1.0.0/16".to_owned(), "fd10::/56".to_owned()];
    i.discovery = false;
    i.machine_cert_sans = vec!["127.0.0.1".to_owned()];
    i.api_server_cert_sans = vec!["api.example".to_owned()];
    let config = render_machine_config(&i, bundle(), MachineType::ControlPlane, "edge-0").unwrap();
    let parsed = parse_machine_config(config.expose().as_bytes()).unwrap();
    assert_eq!(parsed.cluster_endpoint, "https://[fd00::10]:6443");
    assert_eq!(
        parsed.install_disk,
        InstallDisk::Path("/dev/vda".to_owned())
    );
    assert_eq!(parsed.machine_cert_sans, vec!["127.0.0.1".to_owned()]);
    let docs = documents(&config);
    let (m, k) = (&docs[0]["machine"], &docs[0]["cluster"]);
    assert!(m["install"].get("diskSelector").is_none());
    assert_eq!(m["install"]["image"], "registry.example/installer:v1.13.8");
    assert_eq!(m["kubelet"]["image"], "ghcr.io/siderolabs/kubelet:v1.35.0");
    assert_eq!(
        k["network"]["podSubnets"],
        json!(["10.1.0.0/16", "fd10::/56"])
    );
    assert_eq!(k["discovery"], json!({"enabled": false}));
    assert_eq!(k["apiServer"]["certSANs"], json!(["api.example"]));

    let mut s = input("v1.13.8");
    s.install_disk = InstallDisk::Selector(DiskSelector {
        size: Some(">= 10GB".to_owned()),
        disk_type: Some("ssd".to_owned()),
        ..DiskSelector::default()
    });
    let config = render_machine_config(&s, bundle(), MachineType::Worker, "w-1").unwrap();
    assert_eq!(
        documents(&config)[0]["machine"]["install"]["diskSelector"],
        json!({"size": ">= 10GB", "type": "ssd"})
    );
}

#[test]
fn unsupported_versions_are_refused_with_a_typed_error() {
    for version in ["v1.9.0", "v1.11.9", "v1.14.0", "v2.0.0"] {
        let err = render_machine_config(&input(version), bundle(), MachineType::ControlPlane, "n")
            .unwrap_err();
        assert!(
            matches!(err, ConfigError::Version(VersionError::Unsupported { .. })),
            "{version}: {err:?}"
        );
        assert_eq!(err.reason(), "UnsupportedTalosVersion");
    }
    assert!(matches!(
        TalosVersion::parse("garbage"),
        Err(VersionError::Invalid { .. })
    ));
}

#[test]
fn invalid_inputs_are_refused() {
    let refuse = |mutate: &dyn Fn(&mut ConfigInput), hostname: &str, field: &str| {
        let mut i = input("v1.13.8");
        mutate(&mut i);
        let err =
            render_machine_config(&i, bundle(), MachineType::ControlPlane, hostname).unwrap_err();
        assert_eq!(err.reason(), "InvalidConfigInput", "{field}: {err}");
        assert!(err.to_string().contains(field), "{field}: {err}");
    };
    refuse(&|_| {}, "Node_1", "hostname");
    refuse(&|_| {}, "", "hostname");
    refuse(
        &|i| i.cluster_name = "Demo!".to_owned(),
        "n",
        "cluster name",
    );
    refuse(
        &|i| i.endpoint_host = "https://10.0.0.1:6443".to_owned(),
        "n",
        "endpoint host",
    );
    refuse(
        &|i| i.kubernetes_version = "latest".to_owned(),
        "n",
        "kubernetes version",
    );
    refuse(
        &|i| i.pod_subnets = vec!["10.0.0.0/33".to_owned()],
        "n",
        "pod subnets",
    );
    refuse(&|i| i.service_subnets.clear(), "n", "service subnets");
    refuse(
        &|i| i.install_disk = InstallDisk::Path("sda".to_owned()),
        "n",
        "install disk",
    );
    refuse(&|i| i.dns_domain = String::new(), "n", "dns domain");
    let err =
        render_machine_config(&input("v1.13.8"), bundle(), MachineType::Init, "n").unwrap_err();
    assert_eq!(err.reason(), "InvalidConfigInput");
}

/// Replaces every secret of the test bundle in `text` with a placeholder.
fn redact(text: &str) -> String {
    let b = bundle();
    let b64 = |s: &str| STANDARD.encode(s.as_bytes());
    let mut out = text.to_owned();
    for (name, secret) in [
        ("os-ca-crt", b64(&b.os_ca().cert_pem)),
        ("os-ca-key", b64(b.os_ca().key_pem.expose())),
        ("k8s-ca-crt", b64(&b.kubernetes_ca().cert_pem)),
        ("k8s-ca-key", b64(b.kubernetes_ca().key_pem.expose())),
        ("aggregator-ca-crt", b64(&b.aggregator_ca().cert_pem)),
        ("aggregator-ca-key", b64(b.aggregator_ca().key_pem.expose())),
        ("etcd-ca-crt", b64(&b.etcd_ca().cert_pem)),
        ("etcd-ca-key", b64(b.etcd_ca().key_pem.expose())),
        ("service-account-key", b64(b.service_account_key().expose())),
        ("cluster-id", b.cluster_id().to_owned()),
        ("cluster-secret", b.cluster_secret().expose().to_owned()),
        ("bootstrap-token", b.bootstrap_token().expose().to_owned()),
        ("trustd-token", b.trustd_token().expose().to_owned()),
        (
            "secretbox",
            b.secretbox_encryption_secret().expose().to_owned(),
        ),
    ] {
        assert!(!secret.is_empty());
        out = out.replace(&secret, &format!("<{name}>"));
    }
    out
}

#[test]
fn snapshot_controlplane_v1_13() {
    insta::assert_snapshot!(redact(
        render("v1.13.8", MachineType::ControlPlane).expose()
    ));
}

#[test]
fn snapshot_worker_v1_13() {
    insta::assert_snapshot!(redact(render("v1.13.8", MachineType::Worker).expose()));
}

#[test]
fn snapshot_controlplane_v1_12() {
    insta::assert_snapshot!(redact(
        render("v1.12.4", MachineType::ControlPlane).expose()
    ));
}

// ---------------------------------------------------------------- parser

/// Renders a config, lets `mutate` change its v1alpha1 document, and renders it back.
fn mutated(machine_type: MachineType, mutate: &dyn Fn(&mut Value)) -> String {
    let mut docs = documents(&render("v1.13.8", machine_type));
    mutate(&mut docs[0]);
    docs.iter()
        .map(|d| serde_saphyr::to_string(d).unwrap())
        .collect::<Vec<_>>()
        .join("---\n")
}

fn remove(path: &'static str) -> impl Fn(&mut Value) {
    move |doc: &mut Value| {
        let (parent, leaf) = path.rsplit_once('/').unwrap();
        doc.pointer_mut(parent)
            .unwrap()
            .as_object_mut()
            .unwrap()
            .remove(leaf)
            .unwrap();
    }
}

#[test]
fn parser_rejects_garbage_and_empty_input() {
    for (input, reason) in [
        (&b""[..], "EmptyConfig"),
        (b"   \n\n", "EmptyConfig"),
        (b"\xff\xfe\x00garbage", "InvalidYaml"),
        (b"machine: [unclosed", "InvalidYaml"),
        (b"just a string", "InvalidField"),
        (b"- a\n- list\n", "InvalidField"),
        (b"foo: bar\n", "InvalidField"),
        (
            b"apiVersion: v1alpha1\nkind: HostnameConfig\nhostname: x\n",
            "InvalidDocuments",
        ),
    ] {
        let err = parse_machine_config(input).unwrap_err();
        assert_eq!(
            err.reason(),
            reason,
            "{:?}: {err}",
            String::from_utf8_lossy(input)
        );
    }
    let huge = vec![b'#'; MAX_CONFIG_BYTES + 1];
    assert_eq!(
        parse_machine_config(&huge).unwrap_err().reason(),
        "ConfigTooLarge"
    );
    let config = render("v1.13.8", MachineType::Worker);
    let twice = format!("{}---\n{}", config.expose(), config.expose());
    assert_eq!(
        parse_machine_config(twice.as_bytes()).unwrap_err().reason(),
        "InvalidDocuments"
    );
}

#[test]
fn parser_names_the_missing_field() {
    let cases: [(MachineType, &str, &str); 9] = [
        (MachineType::ControlPlane, "/version", "version"),
        (MachineType::ControlPlane, "/machine/type", "machine.type"),
        (MachineType::Worker, "/machine/token", "machine.token"),
        (MachineType::Worker, "/machine/ca/crt", "machine.ca.crt"),
        (MachineType::Worker, "/cluster/ca/crt", "cluster.ca.crt"),
        (
            MachineType::Worker,
            "/cluster/controlPlane/endpoint",
            "cluster.controlPlane.endpoint",
        ),
        (
            MachineType::ControlPlane,
            "/machine/ca/key",
            "machine.ca.key",
        ),
        (
            MachineType::ControlPlane,
            "/cluster/ca/key",
            "cluster.ca.key",
        ),
        (MachineType::Worker, "/machine/install", "machine.install"),
    ];
    for (machine_type, path, field) in cases {
        let yaml = mutated(machine_type, &remove(path));
        let err = parse_machine_config(yaml.as_bytes()).unwrap_err();
        assert!(
            matches!(&err, ConfigError::MissingField { field: f } if f.starts_with(field)),
            "{path}: {err:?}"
        );
        assert!(err.to_string().contains(field));
    }
}

#[test]
fn parser_rejects_what_talos_rejects() {
    let reject = |machine_type, mutate: &dyn Fn(&mut Value), field: &str| {
        let yaml = mutated(machine_type, mutate);
        let err = parse_machine_config(yaml.as_bytes()).unwrap_err();
        assert_eq!(err.reason(), "InvalidField", "{field}: {err}");
        assert!(err.to_string().contains(field), "{field}: {err}");
    };
    let b = bundle();
    let os_key = STANDARD.encode(b.os_ca().key_pem.expose());
    let etcd_key = STANDARD.encode(b.etcd_ca().key_pem.expose());
    reject(
        MachineType::Worker,
        &|d| d["machine"]["ca"]["key"] = json!(os_key.clone()),
        "machine.ca.key",
    );
    reject(
        MachineType::Worker,
        &|d| d["cluster"]["etcd"] = json!({}),
        "cluster.etcd",
    );
    reject(
        MachineType::ControlPlane,
        &|d| d["cluster"]["ca"]["key"] = json!(etcd_key.clone()),
        "cluster.ca.key",
    );
    reject(
        MachineType::ControlPlane,
        &|d| d["machine"]["type"] = json!("master"),
        "machine.type",
    );
    reject(
        MachineType::ControlPlane,
        &|d| d["version"] = json!("v1alpha2"),
        "version",
    );
    reject(
        MachineType::ControlPlane,
        &|d| d["persist"] = json!(false),
        "persist",
    );
    reject(
        MachineType::ControlPlane,
        &|d| d["cluster"]["network"]["cni"]["name"] = json!("calico"),
        "cni.name",
    );
    reject(
        MachineType::ControlPlane,
        &|d| d["cluster"]["network"]["cni"]["urls"] = json!(["https://x"]),
        "cni.urls",
    );
    reject(
        MachineType::Worker,
        &|d| d["machine"]["ca"]["crt"] = json!("%%%"),
        "machine.ca.crt",
    );
    reject(
        MachineType::Worker,
        &|d| {
            d["machine"]["ca"]["crt"] = json!(
                STANDARD.encode("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
            );
        },
        "machine.ca.crt",
    );
    reject(
        MachineType::Worker,
        &|d| d["cluster"]["controlPlane"]["endpoint"] = json!("10.0.0.1:6443"),
        "cluster.controlPlane.endpoint",
    );
    reject(
        MachineType::Worker,
        &|d| d["machine"] = json!({"type": 5}),
        "v1alpha1",
    );
}

#[test]
fn parser_tolerates_unknown_fields_documents_and_init() {
    let yaml = mutated(MachineType::ControlPlane, &|d| {
        d["machine"]["type"] = json!("init");
        d["machine"]["sysctls"] = json!({"net.ipv4.ip_forward": "1"});
        d["cluster"]["extraManifests"] = json!([]);
    });
    let yaml = format!(
        "{yaml}---\napiVersion: v1alpha1\nkind: NetworkDefaultActionConfig\ningress: accept\n"
    );
    let parsed = parse_machine_config(yaml.as_bytes()).unwrap();
    assert_eq!(parsed.machine_type, MachineType::Init);
    assert!(parsed.machine_type.is_control_plane());
    // Without a HostnameConfig document there is no hostname.
    let only_v1alpha1 = mutated(MachineType::Worker, &|_| {});
    let first = only_v1alpha1.split("---\n").next().unwrap();
    assert_eq!(
        parse_machine_config(first.as_bytes()).unwrap().hostname,
        None
    );
}

// ---------------------------------------------------------------- talosconfig

#[test]
fn admin_certificate_is_os_admin_client_auth_only_for_a_year() {
    let b = bundle();
    let endpoints = vec!["10.0.0.10".to_owned()];
    let nodes = vec!["10.0.0.10".to_owned(), "10.0.0.11".to_owned()];
    let generated = admin_talosconfig(b, "demo", &endpoints, &nodes, now(), &mut rng(5)).unwrap();
    let id = &generated.identity;
    assert_eq!(id.ca_pem, b.os_ca().cert_pem);
    with_cert(&id.ca_pem, |ca| {
        with_cert(&id.cert_pem, |cert| {
            assert_eq!(cert.issuer(), ca.subject());
            cert.verify_signature(Some(ca.public_key())).unwrap();
            assert!(!cert.is_ca());
            assert_eq!(organizations(cert), vec!["os:admin".to_owned()]);
            assert!(common_names(cert).is_empty());
            let eku = cert.extended_key_usage().unwrap().unwrap().value;
            assert!(eku.client_auth);
            assert!(!eku.server_auth && !eku.any && eku.other.is_empty());
            assert!(!eku.code_signing && !eku.email_protection && !eku.ocsp_signing);
            let ku = cert.key_usage().unwrap().unwrap().value;
            assert!(ku.digital_signature());
            assert!(!ku.key_cert_sign() && !ku.key_encipherment());
            assert_eq!(cert.validity().not_before.timestamp(), now().as_second());
            assert_eq!(
                cert.validity().not_after.timestamp(),
                now().as_second() + 365 * 86_400
            );
            assert_eq!(cert.public_key().algorithm.algorithm, OID_SIG_ED25519);
            assert!(cert.subject_alternative_name().unwrap().is_none());
            // The authority key id names the OS CA's subject key id.
            let aki = cert
                .get_extension_unique(
                    &x509_parser::oid_registry::OID_X509_EXT_AUTHORITY_KEY_IDENTIFIER,
                )
                .unwrap()
                .unwrap();
            let ski = ca
                .get_extension_unique(
                    &x509_parser::oid_registry::OID_X509_EXT_SUBJECT_KEY_IDENTIFIER,
                )
                .unwrap()
                .unwrap();
            match (aki.parsed_extension(), ski.parsed_extension()) {
                (
                    x509_parser::extensions::ParsedExtension::AuthorityKeyIdentifier(aki),
                    x509_parser::extensions::ParsedExtension::SubjectKeyIdentifier(ski),
                ) => assert_eq!(aki.key_identifier.as_ref().unwrap().0, ski.0),
                other => panic!("unexpected extensions {other:?}"),
            }
        });
    });
    // The identity key is standard PKCS#8 and belongs to the certificate.
    let (label, der) = pem_der(id.key_pem.expose());
    assert_eq!(label, "PRIVATE KEY");
    let pair = rcgen::KeyPair::try_from(der.as_slice()).unwrap();
    with_cert(&id.cert_pem, |cert| {
        assert_eq!(
            pair.public_key_raw(),
            cert.public_key().subject_public_key.data.as_ref()
        );
    });
    assert!(!format!("{generated:?}").contains("PRIVATE"));
}

#[test]
fn talosconfig_yaml_has_the_context_and_talos_encodings() {
    let b = bundle();
    let endpoints = vec!["10.0.0.10".to_owned()];
    let generated = admin_talosconfig(b, "demo", &endpoints, &[], now(), &mut rng(6)).unwrap();
    let value: Value = serde_saphyr::from_str(generated.talosconfig.expose()).unwrap();
    assert_eq!(value["context"], "demo");
    let ctx = &value["contexts"]["demo"];
    assert_eq!(ctx["endpoints"], json!(["10.0.0.10"]));
    assert!(ctx.get("nodes").is_none());
    assert_eq!(b64_pem(&ctx["ca"]), b.os_ca().cert_pem);
    assert_eq!(b64_pem(&ctx["crt"]), generated.identity.cert_pem);
    let talos_key = b64_pem(&ctx["key"]);
    assert!(talos_key.starts_with("-----BEGIN ED25519 PRIVATE KEY-----\n"));
    assert_eq!(
        pem_der(&talos_key).1,
        pem_der(generated.identity.key_pem.expose()).1
    );
    assert!(admin_talosconfig(b, "", &endpoints, &[], now(), &mut rng(6)).is_err());
}
