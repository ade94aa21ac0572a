//! The control plane Bootstrap starts uses what the machine config says: its Kubernetes CA
//! (the API server's serving chain), its ServiceAccount key (a token issued there verifies
//! with it), its Service network (the `kubernetes` Service's ClusterIP), its etcd CA (the
//! API server's etcd client certificate), its aggregator CA (the request-header CA the API
//! server publishes), its API port, and `allowSchedulingOnControlPlanes: false` (Talos'
//! control-plane taint). Needs the test-bed binaries (KONTINUUM_TESTBED_BIN).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::too_many_lines
)]

mod support;

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Service, ServiceAccount};
use kontinuum_talos_config::{
    ConfigInput, InstallDisk, MachineType, SecretsBundle, TalosVersion, render_machine_config,
};
use kube::Api;
use kube::api::PostParams;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, ServerName};
use support::{TIMEOUTS, apply_and_bootstrap, ip, new_bundle, one_machine};
use talos_emulator::Emulator;
use x509_parser::pem::parse_x509_pem;

const POD_SUBNET: &str = "10.32.0.0/16";
const SERVICE_SUBNET: &str = "10.112.0.0/12";
const FIRST_SERVICE_IP: &str = "10.112.0.1";

/// A control-plane config of cluster `blue` whose endpoint is `cp:api_port`, with its own
/// networks and no scheduling on control planes.
fn config(bundle: &SecretsBundle, cp: Ipv4Addr, api_port: u16) -> Vec<u8> {
    let mut input = ConfigInput::new(
        "blue",
        cp.to_string(),
        TalosVersion::parse("v1.13.8").unwrap(),
        "1.36.2",
    );
    input.install_disk = InstallDisk::Path("/dev/sda".into());
    input.pod_subnets = vec![POD_SUBNET.to_owned()];
    input.service_subnets = vec![SERVICE_SUBNET.to_owned()];
    let yaml = render_machine_config(&input, bundle, MachineType::ControlPlane, "cp")
        .unwrap()
        .expose()
        .to_owned();
    let endpoint = format!("https://{cp}:6443");
    assert!(yaml.contains(&endpoint), "{endpoint} not in the config");
    assert!(yaml.contains("allowSchedulingOnControlPlanes: true"));
    yaml.replace(&endpoint, &format!("https://{cp}:{api_port}"))
        .replace(
            "allowSchedulingOnControlPlanes: true",
            "allowSchedulingOnControlPlanes: false",
        )
        .into_bytes()
}

fn der(pem: &str) -> Vec<u8> {
    parse_x509_pem(pem.as_bytes()).unwrap().1.contents
}

/// Whether the certificate `cert_pem` is signed by the CA certificate `ca_pem`.
fn signed_by(cert_pem: &str, ca_pem: &str) -> bool {
    let cert = der(cert_pem);
    let ca = der(ca_pem);
    let (_, cert) = x509_parser::parse_x509_certificate(&cert).unwrap();
    let (_, ca) = x509_parser::parse_x509_certificate(&ca).unwrap();
    cert.issuer() == ca.subject() && cert.verify_signature(Some(ca.public_key())).is_ok()
}

/// A TLS handshake with `addr`, trusting only `ca_pem` and checking the IP SAN.
async fn handshake(addr: SocketAddr, ca_pem: &str) -> Result<(), std::io::Error> {
    let mut roots = rustls::RootCertStore::empty();
    for ca in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(ca.unwrap()).unwrap();
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    tokio::time::timeout(
        TIMEOUTS.connect,
        connector.connect(ServerName::IpAddress(addr.ip().into()), tcp),
    )
    .await
    .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
    Ok(())
}

/// The `RSAPublicKey` (n, e) of a PKCS#1 `RSA PRIVATE KEY` PEM.
fn rsa_public_key(private_pem: &str) -> Vec<u8> {
    let body: String = private_pem
        .lines()
        .filter(|l| !l.starts_with("-----"))
        .collect();
    let pkcs1 = base64::engine::general_purpose::STANDARD
        .decode(body)
        .unwrap();
    let (_, key) = x509_parser::der_parser::parse_der(&pkcs1).unwrap();
    let fields = key.as_sequence().unwrap();
    let n = fields[1].as_slice().unwrap();
    let e = fields[2].as_slice().unwrap();
    let tlv = talos_emulator::pki::der_tlv;
    tlv(0x30, &[tlv(0x02, n), tlv(0x02, e)].concat())
}

/// Whether the RS256 JWT `token` is signed by the RSA key `public_key` (`RSAPublicKey` DER).
fn jwt_signed_by(token: &str, public_key: &[u8]) -> bool {
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let parts: Vec<&str> = token.split('.').collect();
    assert_eq!(parts.len(), 3, "a JWT");
    let header: serde_json::Value = serde_json::from_slice(&b64.decode(parts[0]).unwrap()).unwrap();
    assert_eq!(header["alg"], "RS256", "{header}");
    let signature = b64.decode(parts[2]).unwrap();
    let message = format!("{}.{}", parts[0], parts[1]);
    let provider = rustls::crypto::ring::default_provider();
    let algorithms = provider
        .signature_verification_algorithms
        .mapping
        .iter()
        .find(|(scheme, _)| *scheme == rustls::SignatureScheme::RSA_PKCS1_SHA256)
        .unwrap()
        .1;
    algorithms.iter().any(|alg| {
        alg.verify_signature(public_key, message.as_bytes(), &signature)
            .is_ok()
    })
}

async fn until<T, F, Fut>(what: &str, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Some(value) = tokio::time::timeout(TIMEOUTS.rpc, probe())
            .await
            .ok()
            .flatten()
        {
            return value;
        }
        assert!(Instant::now() < deadline, "{what} did not happen in time");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_control_plane_uses_what_the_config_says() {
    kontinuum_testbed::Tools::locate().expect("test-bed binaries (KONTINUUM_TESTBED_BIN)");
    let started = Instant::now();
    let settings = one_machine("emulator-cp-config", Ipv4Addr::new(127, 68, 0, 1));
    let dir = settings.dir.clone();
    let emulator = Emulator::start(settings).await.unwrap();
    let cp = emulator.addresses()[0];
    let api_port = kontinuum_testbed::free_port(cp.ip()).unwrap();
    let bundle = new_bundle();
    let admin = apply_and_bootstrap(cp, config(&bundle, ip(cp), api_port), &bundle).await;
    let kubeconfig = until("the kubeconfig working", || async {
        let k = String::from_utf8(admin.kubeconfig().await.ok()?.into_bytes()).ok()?;
        let client = kontinuum_testbed::client_from(&k).await.ok()?;
        Api::<ServiceAccount>::namespaced(client, "default")
            .get_opt("default")
            .await
            .ok()
            .flatten()
            .map(|_| k)
    })
    .await;
    let up = started.elapsed();
    let client = kontinuum_testbed::client_from(&kubeconfig).await.unwrap();

    // The API port is the config's, and the serving chain verifies against its Kubernetes CA
    // (and not against another cluster's).
    let api = SocketAddr::new(cp.ip(), api_port);
    assert!(
        kubeconfig.contains(&format!("server: https://{api}")),
        "{kubeconfig}"
    );
    handshake(api, &bundle.kubernetes_ca().cert_pem)
        .await
        .unwrap();
    let other = new_bundle();
    assert!(
        handshake(api, &other.kubernetes_ca().cert_pem)
            .await
            .is_err()
    );

    // The `kubernetes` Service has the first address of the config's Service network.
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let kubernetes = services.get("kubernetes").await.unwrap();
    let cluster_ip = kubernetes.spec.unwrap().cluster_ip.unwrap();
    assert_eq!(cluster_ip, FIRST_SERVICE_IP);

    // A ServiceAccount token issued there verifies with the config's ServiceAccount key
    // (and not with another's).
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), "default");
    let account: ServiceAccount =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "probe"}})).unwrap();
    accounts
        .create(&PostParams::default(), &account)
        .await
        .unwrap();
    let request = http::Request::post("/api/v1/namespaces/default/serviceaccounts/probe/token")
        .header("content-type", "application/json")
        .body(
            serde_json::to_vec(&serde_json::json!({
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": {"expirationSeconds": 600}
            }))
            .unwrap(),
        )
        .unwrap();
    let answer: serde_json::Value = client.request(request).await.unwrap();
    let token = answer["status"]["token"].as_str().unwrap();
    let ours = rsa_public_key(bundle.service_account_key().expose());
    assert!(
        jwt_signed_by(token, &ours),
        "the token does not verify with the config's key"
    );
    let theirs = rsa_public_key(other.service_account_key().expose());
    assert!(!jwt_signed_by(token, &theirs));

    // etcd's certificates and the API server's etcd client certificate chain to the
    // config's etcd CA (so etcd serves TLS, and the API server, which works, uses it).
    let pki = dir.join(cp.ip().to_string()).join("control-plane/pki");
    let read = |name: &str| std::fs::read_to_string(pki.join(name)).unwrap();
    let etcd_ca = &bundle.etcd_ca().cert_pem;
    assert!(signed_by(&read("apiserver-etcd-client.crt"), etcd_ca));
    assert!(signed_by(&read("etcd-server.crt"), etcd_ca));
    assert!(!signed_by(
        &read("apiserver-etcd-client.crt"),
        &other.etcd_ca().cert_pem
    ));

    // The front proxy: the API server publishes the config's aggregator CA as its
    // request-header CA, and its proxy client certificate chains to it.
    let aggregator_ca = &bundle.aggregator_ca().cert_pem;
    let published: Api<ConfigMap> = Api::namespaced(client.clone(), "kube-system");
    let auth = published
        .get("extension-apiserver-authentication")
        .await
        .unwrap();
    let header_ca = auth.data.unwrap()["requestheader-client-ca-file"].clone();
    assert_eq!(der(&header_ca), der(aggregator_ca));
    assert!(signed_by(&read("front-proxy-client.crt"), aggregator_ca));

    // allowSchedulingOnControlPlanes: false → Talos' control-plane taint and label.
    let nodes: Api<Node> = Api::all(client.clone());
    let node = until("the control plane's Node", || async {
        nodes.get_opt("cp").await.ok().flatten()
    })
    .await;
    let taints = node.spec.unwrap().taints.unwrap_or_default();
    assert!(
        taints
            .iter()
            .any(|t| t.key == "node-role.kubernetes.io/control-plane" && t.effect == "NoSchedule"),
        "{taints:?}"
    );
    assert!(
        node.metadata
            .labels
            .unwrap()
            .contains_key("node-role.kubernetes.io/control-plane")
    );
    emulator.shutdown().await;
    report(up, started.elapsed());
}

#[allow(clippy::print_stderr)]
fn report(up: Duration, total: Duration) {
    eprintln!("control plane usable after {up:?}; all checks {total:?}");
}
