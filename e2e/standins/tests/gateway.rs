//! The Gateway stand-in as a process against the real test bed and the real Gateway API
//! CRDs, with the zone-installer's objects (reference 3.6 step 13): an ACME ClusterIssuer
//! (signed from a test CA by the cert-manager stand-in), a Gateway with an HTTPS listener,
//! its Certificate, and an HTTPRoute to a Service whose (Ready) pod's IP is the loopback
//! address of a small HTTP server this test runs.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::too_many_lines
)]

mod support;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::core::v1::{Node, Pod, Service};
use kontinuum_standins::pki::{self, CertificateRequest, KeyAlgorithm, Signer};
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::json;
use support::{
    apply, certificates, cluster_issuers, condition_at, gateway_classes, gateways, http_routes,
    wait_condition,
};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

const GATEWAY_BIN: &str = env!("CARGO_BIN_EXE_gateway-standin");
const CERT_MANAGER_BIN: &str = env!("CARGO_BIN_EXE_cert-manager-standin");
const CONTROLLER_NAME: &str = "kontinuum.sh/gateway-standin";
const HOST: &str = "eu-1a.eu.example.com";

/// A loopback address of this test process's own: `127.72.<pid % 250>.<host>`.
fn loopback(host: u8) -> IpAddr {
    let net = u8::try_from(std::process::id() % 250).unwrap();
    IpAddr::from([127, 72, net, host])
}

/// A tiny HTTP backend: answers every request with 200 and the Host it was sent.
async fn backend(ip: IpAddr) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind(SocketAddr::new(ip, 0))
        .await
        .unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let text = String::from_utf8_lossy(&head);
                let host = text
                    .lines()
                    .find_map(|l| {
                        l.strip_prefix("Host: ")
                            .or_else(|| l.strip_prefix("host: "))
                    })
                    .unwrap_or("")
                    .to_owned();
                let body = format!("hello from the backend for {host}");
                let response = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(response.as_bytes()).await;
                let _ = stream.shutdown().await;
            });
        }
    });
    addr
}

fn client_config(ca_pem: &str) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(pki::first_certificate(ca_pem.as_bytes()).unwrap())
        .unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Arc::new(
        rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth(),
    )
}

/// An HTTPS GET through the gateway with `sni`, verifying the server against the CA:
/// `(response, the served certificate's DNS names)`.
async fn https_get(
    addr: SocketAddr,
    sni: &str,
    config: &Arc<rustls::ClientConfig>,
) -> std::io::Result<(String, Vec<String>)> {
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let name = rustls::pki_types::ServerName::try_from(sni.to_owned()).unwrap();
    let mut tls = tokio_rustls::TlsConnector::from(config.clone())
        .connect(name, tcp)
        .await?;
    let served = tls.get_ref().1.peer_certificates().unwrap()[0].clone();
    let names = pki::inspect_der(&served).unwrap().dns_names;
    tls.write_all(format!("GET / HTTP/1.1\r\nHost: {sni}\r\nConnection: close\r\n\r\n").as_bytes())
        .await?;
    let mut response = String::new();
    tls.read_to_string(&mut response).await.or_else(|e| {
        // Some peers close without close_notify after the response.
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            Ok(0)
        } else {
            Err(e)
        }
    })?;
    Ok((response, names))
}

async fn http_get(addr: SocketAddr, host: &str) -> String {
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    tcp.write_all(format!("GET / HTTP/1.1\r\nHost: {host}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut response = String::new();
    tcp.read_to_string(&mut response).await.unwrap();
    response
}

fn listener<'a>(gateway: &'a DynamicObject, name: &str) -> &'a serde_json::Value {
    gateway.data["status"]["listeners"]
        .as_array()
        .and_then(|ls| ls.iter().find(|l| l["name"] == name))
        .unwrap_or_else(|| panic!("no status of listener {name}: {:?}", gateway.data["status"]))
}

fn listener_condition(
    gateway: &DynamicObject,
    name: &str,
    type_: &str,
) -> Option<(String, String)> {
    let index = gateway.data["status"]["listeners"]
        .as_array()?
        .iter()
        .position(|l| l["name"] == name)?;
    condition_at(
        gateway,
        &format!("/status/listeners/{index}/conditions"),
        type_,
    )
}

fn managers(object: &DynamicObject) -> Vec<String> {
    object
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter_map(|f| f.manager.clone())
        .collect()
}

#[tokio::test]
async fn gateway_standin_serves_the_zone_endpoint_over_tls() {
    let (client, shared) = kontinuum_e2e::shared_client().await.unwrap();
    support::install_crds(&client).await;
    let ns = kontinuum_e2e::namespace(&client, "gw").await.unwrap();

    // The test CA the cert-manager stand-in signs "ACME" certificates from.
    let ca = pki::issue(
        &CertificateRequest {
            common_name: Some("test ACME CA".into()),
            is_ca: true,
            not_before: 1_700_000_000,
            not_after: 2_000_000_000,
            ..CertificateRequest::default()
        },
        KeyAlgorithm::EcdsaP256,
        &Signer::SelfSigned,
    )
    .unwrap();
    let dir = tempfile::tempdir_in(&shared.dir).unwrap();
    let (ca_cert, ca_key) = (dir.path().join("ca.crt"), dir.path().join("ca.key"));
    std::fs::write(&ca_cert, &ca.cert_pem).unwrap();
    std::fs::write(&ca_key, &ca.key_pem).unwrap();
    let _cert_manager = support::start(
        CERT_MANAGER_BIN,
        "cert-manager-standin",
        &[
            "--acme-ca-cert",
            ca_cert.to_str().unwrap(),
            "--acme-ca-key",
            ca_key.to_str().unwrap(),
        ],
    )
    .await;

    let listen_ip = loopback(1);
    let backend = backend(loopback(2)).await;
    let https_port = kontinuum_e2e::testbed::free_port(listen_ip).unwrap();
    let offset = https_port - 443;

    // Classes: ours and another controller's, with a Gateway of the other class that must be
    // left alone.
    let (ours, theirs) = (format!("standin-{ns}"), format!("other-{ns}"));
    let class = |name: &str, controller: &str| {
        json!({ "apiVersion": "gateway.networking.k8s.io/v1", "kind": "GatewayClass",
                "metadata": { "name": name }, "spec": { "controllerName": controller } })
    };
    apply(&gateway_classes(&client), class(&ours, CONTROLLER_NAME)).await;
    apply(
        &gateway_classes(&client),
        class(&theirs, "example.com/other-controller"),
    )
    .await;
    let gateway = |name: &str, class: &str| {
        json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
            "metadata": { "name": name },
            "spec": {
                "gatewayClassName": class,
                "listeners": [
                    { "name": "http", "port": 80, "protocol": "HTTP" },
                    { "name": "https", "port": 443, "protocol": "HTTPS", "hostname": HOST,
                      "tls": { "mode": "Terminate", "certificateRefs": [{ "kind": "Secret", "group": "", "name": "kontinuum-tls" }] } }
                ]
            }
        })
    };
    apply(&gateways(&client, &ns), gateway("ignored", &theirs)).await;

    let started = Instant::now();
    let _gateway = support::start(
        GATEWAY_BIN,
        "gateway-standin",
        &[
            "--controller-name",
            CONTROLLER_NAME,
            "--listen-ip",
            &listen_ip.to_string(),
            "--port-offset",
            &offset.to_string(),
        ],
    )
    .await;
    wait_condition(
        &gateway_classes(&client),
        &ours,
        "Accepted",
        ("True", "Accepted"),
    )
    .await;

    // The backend: a Service selecting a Ready pod whose IP is the backend's loopback
    // address, as a hostlet pod's would be. (The API server refuses loopback addresses in
    // EndpointSlices, so on the test bed the stand-in lists the selected pods, as the
    // EndpointSlice controller would; the pod is bound to a Node of this test that no
    // kubelet or KWOK manages, so nothing else writes its status.)
    let node: Node =
        serde_json::from_value(json!({ "metadata": { "name": format!("standin-{ns}") } })).unwrap();
    Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &node)
        .await
        .unwrap();
    let service: Service = serde_json::from_value(json!({
        "metadata": { "name": "kontinuum" },
        "spec": {
            "selector": { "app.kubernetes.io/name": "kontinuum" },
            "ports": [{ "name": "http", "port": 80, "targetPort": "http" }]
        }
    }))
    .unwrap();
    Api::<Service>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &service)
        .await
        .unwrap();
    let pod: Pod = serde_json::from_value(json!({
        "metadata": { "name": "kontinuum-0", "labels": { "app.kubernetes.io/name": "kontinuum" } },
        "spec": {
            "nodeName": format!("standin-{ns}"),
            "containers": [{ "name": "kontinuum", "image": "ghcr.io/nicklasfrahm-dev/kontinuum:test",
                             "ports": [{ "name": "http", "containerPort": backend.port() }] }]
        }
    }))
    .unwrap();
    let pods = Api::<Pod>::namespaced(client.clone(), &ns);
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let ip = backend.ip().to_string();
    pods.patch_status(
        "kontinuum-0",
        &PatchParams::default(),
        &Patch::Merge(json!({ "status": {
            "phase": "Running", "podIP": ip, "podIPs": [{ "ip": ip }],
            "conditions": [{ "type": "Ready", "status": "True" }]
        } })),
    )
    .await
    .unwrap();

    // The zone-installer's objects: Gateway and HTTPRoute first, the Certificate later.
    apply(&gateways(&client, &ns), gateway("kontinuum", &ours)).await;
    apply(
        &http_routes(&client, &ns),
        json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
            "metadata": { "name": "kontinuum" },
            "spec": {
                "parentRefs": [{ "name": "kontinuum", "sectionName": "https" }],
                "hostnames": [HOST],
                "rules": [{ "backendRefs": [{ "name": "kontinuum", "port": 80 }] }]
            }
        }),
    )
    .await;

    // No Secret yet: the HTTPS listener cannot be programmed.
    let gws = gateways(&client, &ns);
    kontinuum_e2e::eventually(
        support::LIMIT,
        "listener https InvalidCertificateRef",
        || async {
            let gw = gws.get("kontinuum").await?;
            Ok(listener_condition(&gw, "https", "ResolvedRefs")
                == Some(("False".into(), "InvalidCertificateRef".into())))
        },
    )
    .await
    .unwrap();

    // The Certificate, from an ACME ClusterIssuer shaped like the zone-installer's.
    let issuer = format!("kontinuum-{ns}");
    apply(
        &cluster_issuers(&client),
        json!({ "apiVersion": "cert-manager.io/v1", "kind": "ClusterIssuer",
                "metadata": { "name": issuer },
                "spec": { "acme": {
                    "email": "ops@example.com", "server": "https://acme.example/directory",
                    "privateKeySecretRef": { "name": "kontinuum-account-key" },
                    "solvers": [{ "http01": { "gatewayHTTPRoute": { "parentRefs": [{ "name": "kontinuum" }] } } }]
                } } }),
    )
    .await;
    let certificate = |dns: &[&str]| {
        json!({ "apiVersion": "cert-manager.io/v1", "kind": "Certificate",
                "metadata": { "name": "kontinuum" },
                "spec": { "dnsNames": dns, "secretName": "kontinuum-tls",
                          "issuerRef": { "name": issuer, "kind": "ClusterIssuer", "group": "cert-manager.io" } } })
    };
    apply(&certificates(&client, &ns), certificate(&[HOST])).await;
    wait_condition(
        &certificates(&client, &ns),
        "kontinuum",
        "Ready",
        ("True", "Ready"),
    )
    .await;

    // Accepted and Programmed, as Gateway API says.
    let gw = wait_condition(&gws, "kontinuum", "Programmed", ("True", "Programmed")).await;
    let gw = if condition_at(&gw, "/status/conditions", "Accepted")
        == Some(("True".into(), "Accepted".into()))
    {
        gw
    } else {
        wait_condition(&gws, "kontinuum", "Accepted", ("True", "Accepted")).await
    };
    let programmed_after = started.elapsed();
    assert_eq!(
        gw.data["status"]["addresses"][0]["value"],
        listen_ip.to_string()
    );
    assert_eq!(gw.data["status"]["addresses"][0]["type"], "IPAddress");
    let https = listener(&gw, "https");
    assert_eq!(https["attachedRoutes"], 1);
    assert_eq!(https["supportedKinds"][0]["kind"], "HTTPRoute");
    for (type_, expected) in [
        ("Accepted", ("True", "Accepted")),
        ("ResolvedRefs", ("True", "ResolvedRefs")),
        ("Programmed", ("True", "Programmed")),
        ("Conflicted", ("False", "NoConflicts")),
    ] {
        assert_eq!(
            listener_condition(&gw, "https", type_),
            Some((expected.0.into(), expected.1.into())),
            "{type_}"
        );
    }
    assert_eq!(listener(&gw, "http")["attachedRoutes"], 0);
    let route = http_routes(&client, &ns).get("kontinuum").await.unwrap();
    let parent = &route.data["status"]["parents"][0];
    assert_eq!(parent["controllerName"], CONTROLLER_NAME);
    assert_eq!(parent["parentRef"]["name"], "kontinuum");
    assert_eq!(
        condition_at(&route, "/status/parents/0/conditions", "Accepted"),
        Some(("True".into(), "Accepted".into()))
    );
    assert_eq!(
        condition_at(&route, "/status/parents/0/conditions", "ResolvedRefs"),
        Some(("True".into(), "ResolvedRefs".into()))
    );

    // An HTTPS request with SNI = the zone host reaches the backend; the client verifies the
    // served certificate against the test CA.
    let https_addr = SocketAddr::new(listen_ip, https_port);
    let config = client_config(&ca.cert_pem);
    let request_started = Instant::now();
    let (response, names) = https_get(https_addr, HOST, &config).await.unwrap();
    let request_took = request_started.elapsed();
    assert!(response.starts_with("HTTP/1.1 200 OK"), "{response}");
    assert!(
        response.ends_with(&format!("hello from the backend for {HOST}")),
        "{response}"
    );
    assert_eq!(names, [HOST]);
    // Another server name has no listener: the handshake fails.
    assert!(
        https_get(https_addr, "other.example.com", &config)
            .await
            .is_err()
    );
    // The plain listener has no route attached: the stand-in answers 404 itself.
    let plain_addr = SocketAddr::new(listen_ip, 80 + offset);
    let plain = http_get(plain_addr, HOST).await;
    assert!(plain.starts_with("HTTP/1.1 404"), "{plain}");
    // With a route on it, plain HTTP is forwarded as it is.
    let plain_host = format!("plain.{HOST}");
    apply(
        &http_routes(&client, &ns),
        json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
            "metadata": { "name": "plain" },
            "spec": {
                "parentRefs": [{ "name": "kontinuum", "sectionName": "http" }],
                "hostnames": [plain_host],
                "rules": [{ "backendRefs": [{ "name": "kontinuum", "port": 80 }] }]
            }
        }),
    )
    .await;
    kontinuum_e2e::eventually(support::LIMIT, "the http listener's route", || async {
        let gw = gws.get("kontinuum").await?;
        Ok(listener(&gw, "http")["attachedRoutes"] == 1)
    })
    .await
    .unwrap();
    let plain = http_get(plain_addr, &plain_host).await;
    assert!(plain.starts_with("HTTP/1.1 200 OK"), "{plain}");
    assert!(
        plain.ends_with(&format!("hello from the backend for {plain_host}")),
        "{plain}"
    );
    assert!(http_get(plain_addr, HOST).await.starts_with("HTTP/1.1 404"));

    // A renewed certificate (here: new dnsNames) is served to new connections.
    let alt = format!("alt.{HOST}");
    apply(&certificates(&client, &ns), certificate(&[HOST, &alt])).await;
    kontinuum_e2e::eventually(support::LIMIT, "the new certificate served", || async {
        let (_, names) = https_get(https_addr, HOST, &config).await?;
        Ok(names.contains(&alt))
    })
    .await
    .unwrap();

    // The other class's Gateway and class were left alone.
    let ignored = gws.get("ignored").await.unwrap();
    assert_eq!(
        condition_at(&ignored, "/status/conditions", "Accepted"),
        Some(("Unknown".into(), "Pending".into()))
    );
    assert!(ignored.data["status"]["listeners"].is_null());
    assert!(
        !managers(&ignored)
            .iter()
            .any(|m| m.contains("gateway-standin"))
    );
    let other_class = gateway_classes(&client).get(&theirs).await.unwrap();
    assert_eq!(
        condition_at(&other_class, "/status/conditions", "Accepted"),
        Some(("Unknown".into(), "Pending".into()))
    );
    eprintln!(
        "gateway programmed {programmed_after:?} after the stand-in started; first HTTPS request took {request_took:?}"
    );
}
