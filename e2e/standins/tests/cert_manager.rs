//! The cert-manager stand-in as a process against the real test bed and the real
//! cert-manager CRDs. One stand-in serves the whole test (two would both sign); the
//! scenarios run concurrently, each in its own namespace with its own issuers.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::too_many_lines
)]

mod support;

use std::time::Instant;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::events::v1::Event;
use kontinuum_standins::pki::{self, CertificateRequest, KeyAlgorithm, Signer};
use kube::Client;
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;
use support::{apply, certificates, cluster_issuers, issuers, wait_condition};

const BIN: &str = env!("CARGO_BIN_EXE_cert-manager-standin");

fn certificate(name: &str, issuer_kind: &str, issuer: &str, dns: &[&str]) -> serde_json::Value {
    json!({
        "apiVersion": "cert-manager.io/v1", "kind": "Certificate",
        "metadata": { "name": name },
        "spec": {
            "secretName": format!("{name}-tls"),
            "dnsNames": dns,
            "issuerRef": { "name": issuer, "kind": issuer_kind, "group": "cert-manager.io" },
            "privateKey": { "algorithm": "ECDSA", "size": 256 }
        }
    })
}

async fn secret(client: &Client, ns: &str, name: &str) -> Option<Secret> {
    Api::<Secret>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await
        .unwrap()
}

fn data<'a>(secret: &'a Secret, key: &str) -> &'a [u8] {
    &secret.data.as_ref().unwrap()[key].0
}

/// Checks that `tls.crt` names `dns`, belongs to `tls.key`, and is signed by `ca.crt`.
fn check_issued(secret: &Secret, dns: &[&str]) {
    assert_eq!(secret.type_.as_deref(), Some("kubernetes.io/tls"));
    let cert = data(secret, "tls.crt");
    let info = pki::inspect(cert).unwrap();
    let mut want: Vec<String> = dns.iter().map(|d| (*d).to_owned()).collect();
    want.sort();
    assert_eq!(info.dns_names, want);
    assert!(pki::key_matches(cert, data(secret, "tls.key")));
    let leaf = pki::first_certificate(cert).unwrap();
    let ca = pki::first_certificate(data(secret, "ca.crt")).unwrap();
    let (_, leaf) = x509_parser::parse_x509_certificate(&leaf).unwrap();
    let (_, ca) = x509_parser::parse_x509_certificate(&ca).unwrap();
    leaf.verify_signature(Some(ca.public_key()))
        .expect("the certificate verifies against ca.crt");
}

/// selfSigned ClusterIssuer → Ready; a Certificate from it → its Secret; a changed
/// `dnsNames` → a new certificate and revision.
async fn self_signed(client: &Client, ns: &str) {
    let issuer = format!("selfsigned-{ns}");
    apply(
        &cluster_issuers(client),
        json!({ "apiVersion": "cert-manager.io/v1", "kind": "ClusterIssuer",
                "metadata": { "name": issuer }, "spec": { "selfSigned": {} } }),
    )
    .await;
    wait_condition(
        &cluster_issuers(client),
        &issuer,
        "Ready",
        ("True", "IsReady"),
    )
    .await;

    let certs = certificates(client, ns);
    apply(
        &certs,
        certificate("web", "ClusterIssuer", &issuer, &["web.eu.example.com"]),
    )
    .await;
    let cert = wait_condition(&certs, "web", "Ready", ("True", "Ready")).await;
    assert_eq!(cert.data["status"]["revision"], 1);
    assert!(cert.data["status"]["notAfter"].is_string());
    let stored = secret(client, ns, "web-tls")
        .await
        .expect("the Secret was written");
    check_issued(&stored, &["web.eu.example.com"]);
    let annotations = stored.metadata.annotations.clone().unwrap();
    assert_eq!(annotations["cert-manager.io/certificate-name"], "web");
    assert_eq!(annotations["cert-manager.io/issuer-name"], issuer);
    assert_eq!(annotations["cert-manager.io/issuer-kind"], "ClusterIssuer");

    // Re-issued when dnsNames change.
    apply(
        &certs,
        certificate(
            "web",
            "ClusterIssuer",
            &issuer,
            &["web.eu.example.com", "www.eu.example.com"],
        ),
    )
    .await;
    kontinuum_e2e::eventually(support::LIMIT, "the re-issued certificate", || async {
        let cert = certs.get("web").await?;
        Ok(cert.data["status"]["revision"] == 2)
    })
    .await
    .unwrap();
    let stored = secret(client, ns, "web-tls").await.unwrap();
    check_issued(&stored, &["web.eu.example.com", "www.eu.example.com"]);

    // Each issuance is reported once, as cert-manager does.
    let events: Api<Event> = Api::namespaced(client.clone(), ns);
    kontinuum_e2e::eventually(support::LIMIT, "two issuances reported", || async {
        let issuing: i32 = events
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .filter(|e| {
                e.reason.as_deref() == Some("Issuing")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("web")
            })
            // A repeated Event is one object with a series count.
            .map(|e| e.series.map_or(1, |s| s.count))
            .sum();
        Ok(issuing == 2)
    })
    .await
    .unwrap();
}

/// A Certificate whose issuer does not exist stays not Ready with no Secret; it is issued
/// once the issuer exists.
async fn missing_issuer(client: &Client, ns: &str) {
    let issuer = format!("late-{ns}");
    let certs = certificates(client, ns);
    apply(
        &certs,
        certificate("early", "ClusterIssuer", &issuer, &["early.eu.example.com"]),
    )
    .await;
    wait_condition(&certs, "early", "Ready", ("False", "IssuerNotFound")).await;
    assert!(
        secret(client, ns, "early-tls").await.is_none(),
        "no Secret without an issuer"
    );
    // A namespaced Issuer of the same name does not count for a ClusterIssuer reference.
    apply(
        &issuers(client, ns),
        json!({ "apiVersion": "cert-manager.io/v1", "kind": "Issuer",
                "metadata": { "name": issuer }, "spec": { "selfSigned": {} } }),
    )
    .await;
    wait_condition(&issuers(client, ns), &issuer, "Ready", ("True", "IsReady")).await;
    assert!(secret(client, ns, "early-tls").await.is_none());

    apply(
        &cluster_issuers(client),
        json!({ "apiVersion": "cert-manager.io/v1", "kind": "ClusterIssuer",
                "metadata": { "name": issuer }, "spec": { "selfSigned": {} } }),
    )
    .await;
    wait_condition(&certs, "early", "Ready", ("True", "Ready")).await;
    check_issued(
        &secret(client, ns, "early-tls").await.unwrap(),
        &["early.eu.example.com"],
    );
}

/// A `ca` ClusterIssuer without its Secret is not Ready, and neither is a Certificate from
/// it; once the CA Secret exists, both are, and the certificate verifies against the CA.
async fn ca_issuer(client: &Client, ns: &str, resource_ns: &str) {
    let issuer = format!("ca-{ns}");
    let secret_name = format!("root-{ns}");
    apply(
        &cluster_issuers(client),
        json!({ "apiVersion": "cert-manager.io/v1", "kind": "ClusterIssuer",
                "metadata": { "name": issuer }, "spec": { "ca": { "secretName": secret_name } } }),
    )
    .await;
    wait_condition(
        &cluster_issuers(client),
        &issuer,
        "Ready",
        ("False", "ErrGetKeyPair"),
    )
    .await;
    let certs = certificates(client, ns);
    apply(
        &certs,
        certificate("api", "ClusterIssuer", &issuer, &["api.eu.example.com"]),
    )
    .await;
    wait_condition(&certs, "api", "Ready", ("False", "IssuerNotReady")).await;
    assert!(secret(client, ns, "api-tls").await.is_none());

    let ca = pki::issue(
        &CertificateRequest {
            common_name: Some("test root".into()),
            is_ca: true,
            not_before: 1_700_000_000,
            not_after: 2_000_000_000,
            ..CertificateRequest::default()
        },
        KeyAlgorithm::EcdsaP256,
        &Signer::SelfSigned,
    )
    .unwrap();
    let root: Secret = serde_json::from_value(json!({
        "metadata": { "name": secret_name },
        "type": "kubernetes.io/tls",
        "stringData": { "tls.crt": ca.cert_pem, "tls.key": ca.key_pem }
    }))
    .unwrap();
    Api::<Secret>::namespaced(client.clone(), resource_ns)
        .create(&PostParams::default(), &root)
        .await
        .unwrap();
    wait_condition(
        &cluster_issuers(client),
        &issuer,
        "Ready",
        ("True", "KeyPairVerified"),
    )
    .await;
    wait_condition(&certs, "api", "Ready", ("True", "Ready")).await;
    let stored = secret(client, ns, "api-tls").await.unwrap();
    check_issued(&stored, &["api.eu.example.com"]);
    assert_eq!(data(&stored, "ca.crt"), ca.cert_pem.as_bytes());
}

/// Without a test CA, an ACME issuer cannot register (no ACME server is reachable).
async fn acme_without_test_ca(client: &Client, ns: &str) {
    let issuer = format!("acme-{ns}");
    apply(
        &cluster_issuers(client),
        json!({ "apiVersion": "cert-manager.io/v1", "kind": "ClusterIssuer",
                "metadata": { "name": issuer },
                "spec": { "acme": {
                    "email": "ops@example.com", "server": "https://acme.example/directory",
                    "privateKeySecretRef": { "name": "kontinuum-account-key" },
                    "solvers": [{ "http01": { "gatewayHTTPRoute": { "parentRefs": [{ "name": "kontinuum" }] } } }]
                } } }),
    )
    .await;
    wait_condition(
        &cluster_issuers(client),
        &issuer,
        "Ready",
        ("False", "ErrRegisterACMEAccount"),
    )
    .await;
}

#[tokio::test]
async fn cert_manager_standin_honours_issuer_readiness() {
    let (client, _) = kontinuum_e2e::shared_client().await.unwrap();
    support::install_crds(&client).await;
    let resource_ns = kontinuum_e2e::namespace(&client, "cm-resources")
        .await
        .unwrap();
    let standin = support::start(
        BIN,
        "cert-manager-standin",
        &["--cluster-resource-namespace", &resource_ns],
    )
    .await;
    let mut namespaces = Vec::new();
    for prefix in ["cm-self", "cm-missing", "cm-ca", "cm-acme"] {
        namespaces.push(kontinuum_e2e::namespace(&client, prefix).await.unwrap());
    }
    let started = Instant::now();
    tokio::join!(
        self_signed(&client, &namespaces[0]),
        missing_issuer(&client, &namespaces[1]),
        ca_issuer(&client, &namespaces[2], &resource_ns),
        acme_without_test_ca(&client, &namespaces[3]),
    );
    eprintln!(
        "cert-manager stand-in scenarios took {:?}",
        started.elapsed()
    );
    // Converged: nothing was issued again behind the scenarios' backs.
    let web = certificates(&client, &namespaces[0])
        .get("web")
        .await
        .unwrap();
    assert_eq!(web.data["status"]["revision"], 2);
    let metrics = standin.metrics().await.unwrap();
    assert!(!metrics.contains("reconcile_errors_total{"), "{metrics}");
    assert!(standin.is_ready().await);
}
