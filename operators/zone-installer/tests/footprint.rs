//! `zone_installer::footprint` against a real kube-apiserver (the test bed's, standing in for
//! a zone cluster, with its controller-manager and a KWOK node), with the REAL Gateway API
//! v1.4.1 and cert-manager v1.21.1 CRDs (the fixture charts' unmodified copies of
//! `shared/data/crds/`), so every object is checked by their schemas and CEL rules, and the
//! agent's pod by Pod Security admission (`restricted`).
//!
//! One test, in phases, because the phases change cluster-wide state (CRDs, the
//! ClusterIssuer `kontinuum`): without the Gateway API CRDs → `CrdMissing` naming the kind;
//! with them → every object accepted; re-apply → no resourceVersion changes; observation of
//! a missing GatewayClass, a not-Ready and then a Ready Certificate, the agent available;
//! every issuer kind accepted; teardown until Done.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::large_futures,
    clippy::too_many_lines
)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kontinuum_e2e::{eventually, install_crds, load_yaml, namespace, shared_client};
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use kube::{Client, ResourceExt as _};
use serde_json::{Value, json};
use zone_installer::footprint::{
    self, CertificateState, IssuerKind, Settings, TeardownProgress, Zone,
};

const TIMEOUT: Duration = Duration::from_secs(10);
const LIMIT: Duration = Duration::from_secs(90);

const GATEWAY_API_CRDS: [&str; 3] = [
    "gateway.networking.k8s.io_gatewayclasses.yaml",
    "gateway.networking.k8s.io_gateways.yaml",
    "gateway.networking.k8s.io_httproutes.yaml",
];
const CERT_MANAGER_CRDS: [&str; 2] = [
    "cert-manager.io_certificates.yaml",
    "cert-manager.io_clusterissuers.yaml",
];

async fn install(client: &Client, dir: &str, files: &[&str]) {
    let mut crds: Vec<CustomResourceDefinition> = Vec::new();
    for file in files {
        crds.extend(load_yaml::<CustomResourceDefinition>(&format!("{dir}/{file}")).unwrap());
    }
    install_crds(client, &crds).await.unwrap();
}

/// The API of a rendered object's kind (the plural is the lowercase kind plus "s", or
/// "es" after an "s"/"ss", for every kind the footprint writes).
fn api_of(client: &Client, object: &Value) -> Api<DynamicObject> {
    let api_version = object["apiVersion"].as_str().unwrap();
    let kind = object["kind"].as_str().unwrap();
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let lower = kind.to_lowercase();
    let plural = if lower.ends_with('s') {
        format!("{lower}es")
    } else {
        format!("{lower}s")
    };
    let resource =
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), &plural);
    match object["metadata"]["namespace"].as_str() {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
        None => Api::all_with(client.clone(), &resource),
    }
}

/// `Kind/name` → resourceVersion of every rendered object, read back from the server.
async fn versions(client: &Client, objects: &[Value]) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for object in objects {
        let name = object["metadata"]["name"].as_str().unwrap();
        let live = api_of(client, object).get(name).await.unwrap();
        out.insert(
            format!("{}/{name}", object["kind"].as_str().unwrap()),
            live.resource_version().unwrap(),
        );
    }
    out
}

fn settings(class: &str) -> Settings {
    Settings {
        agent_image: "kontinuum:e2e".into(),
        image_pull_policy: Some("IfNotPresent".into()),
        hub_grpc_endpoint: "hub.example.test:443".into(),
        proxy_ca_pem: Some(
            "-----BEGIN CERTIFICATE-----\nMIIBproxyca\n-----END CERTIFICATE-----\n".into(),
        ),
        oidc_ca_pem: Some(
            "-----BEGIN CERTIFICATE-----\nMIIBoidcca\n-----END CERTIFICATE-----\n".into(),
        ),
        auth_env: BTreeMap::from([
            (
                "KONTINUUM_OIDC_ISSUER_URL".into(),
                "https://id.example.test".into(),
            ),
            ("KONTINUUM_OIDC_ADMIN_GROUPS".into(), "ops".into()),
            (
                "KONTINUUM_OIDC_CLIENT_SECRET".into(),
                "client-secret".into(),
            ),
        ]),
        gateway_class: class.into(),
        issuer: IssuerKind::Acme {
            email: "ops@example.test".into(),
            server: "https://acme.example.test/directory".into(),
        },
    }
}

const CERT: &str = "-----BEGIN CERTIFICATE-----\nMIIBzonecert\n-----END CERTIFICATE-----\n";
const KEY: &str =
    "-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIzonekey\n-----END PRIVATE KEY-----\n";

fn zone() -> Zone<'static> {
    Zone {
        region: "eu",
        zone: "west-1a",
        zone_name: "eu-west-1a",
        domain: Some("zones.example.test"),
        identity_cert_pem: CERT,
        identity_key_pem: KEY,
        identity_thumbprint: "0123456789abcdef",
    }
}

#[tokio::test]
async fn the_footprint_is_accepted_observed_and_torn_down_on_a_real_api_server() {
    let (client, _) = shared_client().await.unwrap();
    install(
        &client,
        "charts/cert-manager/files/crds",
        &CERT_MANAGER_CRDS,
    )
    .await;
    // The footprint's namespace may already exist (here: made by the test, with its own
    // labels); apply adds ours.
    let ns = namespace(&client, "footprint").await.unwrap();
    let class = format!("kontinuum-e2e-{}", std::process::id());
    let objects = footprint::render_in(&zone(), &settings(&class), &ns);
    assert_eq!(objects.len(), 11);

    // 1. No Gateway API in the zone cluster: an error naming the kind.
    let err = footprint::apply(&client, &objects, TIMEOUT)
        .await
        .unwrap_err();
    assert_eq!(err.reason(), "CrdMissing", "{err:?}");
    assert!(err.to_string().contains("Gateway"), "{err}");
    assert!(err.is_transient());

    // 2. With the real CRDs every object is accepted by their schemas and CEL rules.
    install(
        &client,
        "charts/gateway-api-crds/files/standard",
        &GATEWAY_API_CRDS,
    )
    .await;
    let observed = footprint::apply(&client, &objects, TIMEOUT).await.unwrap();
    assert_eq!(
        observed.gateway_class_missing.as_deref(),
        Some(class.as_str())
    );
    assert!(
        matches!(
            &observed.certificate,
            Some(CertificateState::NotReady { .. })
        ),
        "{observed:?}"
    );

    // The namespace keeps its own labels and gains the Pod Security ones.
    let live_ns = Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
        .get(&ns)
        .await
        .unwrap();
    assert_eq!(live_ns.labels()["kontinuum.sh/e2e"], "true");
    assert_eq!(
        live_ns.labels()["pod-security.kubernetes.io/enforce"],
        "restricted"
    );

    // The agent's pod passes `restricted` admission and (on the KWOK node) becomes available.
    eventually(LIMIT, "the agent Deployment available", || async {
        Ok(footprint::observe(&client, &objects, TIMEOUT)
            .await?
            .agent_available)
    })
    .await
    .unwrap();
    let pods = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(client.clone(), &ns)
        .list(&kube::api::ListParams::default().labels("app.kubernetes.io/name=kontinuum"))
        .await
        .unwrap();
    assert_eq!(pods.items.len(), 1);
    let pod_annotations = pods.items[0].annotations();
    assert_eq!(
        pod_annotations["kontinuum.sh/identity-thumbprint"],
        "0123456789abcdef"
    );

    // The Secrets hold what was rendered (base64 on the wire, decoded by the server).
    let secrets = Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client.clone(), &ns);
    let env = secrets.get("kontinuum-env").await.unwrap().data.unwrap();
    assert_eq!(
        env["KONTINUUM_SERVER_STORAGE"].0,
        b"grpc://eu-west-1a@hub.example.test:443"
    );
    let identity = secrets.get("kontinuum-identity").await.unwrap();
    assert_eq!(identity.type_.as_deref(), Some("kubernetes.io/tls"));
    assert_eq!(identity.data.unwrap()["tls.key"].0, KEY.as_bytes());
    // The CAs are files of their own ConfigMap; the env ConfigMap holds variables only.
    let config_maps = Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client.clone(), &ns);
    let cas = config_maps.get("kontinuum-ca").await.unwrap().data.unwrap();
    let expected = settings(&class);
    assert_eq!(
        cas,
        BTreeMap::from([
            ("oidc-ca.crt".to_owned(), expected.oidc_ca_pem.unwrap()),
            ("proxy-ca.crt".to_owned(), expected.proxy_ca_pem.unwrap()),
        ])
    );
    let env = config_maps
        .get("kontinuum-env")
        .await
        .unwrap()
        .data
        .unwrap();
    assert!(
        env.keys()
            .all(|k| k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')),
        "{env:?}"
    );
    assert_eq!(env["KONTINUUM_SERVER_REGION"], "eu");

    // 3. Re-applying the same objects writes nothing. One upstream exception: the Gateway
    //    CRD defaults `status` and has a status subresource, so its create stores no status
    //    and the first update through the main resource stores the defaulted one (the
    //    content is unchanged, only the resourceVersion moves, once).
    let before = versions(&client, &objects).await;
    footprint::apply(&client, &objects, TIMEOUT).await.unwrap();
    let after = versions(&client, &objects).await;
    let moved: Vec<&String> = before
        .keys()
        .filter(|k| before[k.as_str()] != after[k.as_str()])
        .collect();
    assert!(
        moved.is_empty() || moved == ["Gateway/kontinuum"],
        "a re-apply changed {moved:?}"
    );
    for _ in 0..2 {
        let again = footprint::apply(&client, &objects, TIMEOUT).await.unwrap();
        assert!(again.agent_available);
        assert_eq!(
            after,
            versions(&client, &objects).await,
            "a re-apply changed objects"
        );
    }

    // 4. The GatewayClass appears: no longer reported missing.
    let gateway_class = json!({
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "GatewayClass",
        "metadata": { "name": class },
        "spec": { "controllerName": "example.test/gateway-stand-in" },
    });
    let classes = api_of(&client, &gateway_class);
    classes
        .create(
            &PostParams::default(),
            &serde_json::from_value(gateway_class.clone()).unwrap(),
        )
        .await
        .unwrap();
    let observed = footprint::observe(&client, &objects, TIMEOUT)
        .await
        .unwrap();
    assert_eq!(observed.gateway_class_missing, None);
    assert!(matches!(
        observed.certificate,
        Some(CertificateState::NotReady { .. })
    ));

    // 5. cert-manager marks the Certificate Ready (status subresource): Ready.
    let certificate = objects.iter().find(|o| o["kind"] == "Certificate").unwrap();
    let certificates = api_of(&client, certificate);
    let generation = certificates
        .get("kontinuum")
        .await
        .unwrap()
        .metadata
        .generation
        .unwrap();
    let status = json!({ "status": { "conditions": [{
        "type": "Ready", "status": "True", "reason": "Ready",
        "message": "Certificate is up to date and has not expired",
        "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": generation,
    }] } });
    certificates
        .patch_status("kontinuum", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
    let observed = footprint::observe(&client, &objects, TIMEOUT)
        .await
        .unwrap();
    assert_eq!(observed.certificate, Some(CertificateState::Ready));
    // Re-applying keeps it Ready: our apply never touches status.
    let observed = footprint::apply(&client, &objects, TIMEOUT).await.unwrap();
    assert_eq!(observed.certificate, Some(CertificateState::Ready));

    // 6. The other issuer kinds are accepted too (the same ClusterIssuer, re-applied).
    for issuer in [
        IssuerKind::SelfSigned,
        IssuerKind::Ca {
            secret_name: "site-ca".into(),
        },
    ] {
        let mut s = settings(&class);
        s.issuer = issuer;
        let rendered = footprint::render_in(&zone(), &s, &ns);
        let cluster_issuer: Vec<Value> = rendered
            .into_iter()
            .filter(|o| o["kind"] == "ClusterIssuer")
            .collect();
        footprint::apply(&client, &cluster_issuer, TIMEOUT)
            .await
            .unwrap();
        let live = api_of(&client, &cluster_issuer[0])
            .get("kontinuum")
            .await
            .unwrap();
        assert_eq!(
            live.data["spec"], cluster_issuer[0]["spec"],
            "the previous issuer's fields are gone"
        );
    }

    // 7. Teardown, called until Done: everything is gone, the namespace included.
    let mut calls = 0;
    eventually(LIMIT, "the footprint torn down", || {
        calls += 1;
        let client = client.clone();
        let ns = ns.clone();
        async move {
            Ok(footprint::teardown_in(&client, &ns, TIMEOUT).await? == TeardownProgress::Done)
        }
    })
    .await
    .unwrap();
    assert!(calls >= 2, "the namespace cannot be gone after one call");
    for object in &objects {
        let name = object["metadata"]["name"].as_str().unwrap();
        assert!(
            api_of(&client, object)
                .get_opt(name)
                .await
                .unwrap()
                .is_none(),
            "{} {name} still exists",
            object["kind"]
        );
    }
    // Idempotent once done.
    assert_eq!(
        footprint::teardown_in(&client, &ns, TIMEOUT).await.unwrap(),
        TeardownProgress::Done
    );
    classes
        .delete(&class, &kube::api::DeleteParams::default())
        .await
        .unwrap();
}

#[tokio::test]
async fn an_unreachable_zone_cluster_is_a_typed_error_within_the_timeout() {
    // A closed port on loopback: connection refused, reported as DownstreamUnreachable.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let config = kube::Config::new(format!("http://{addr}").parse().unwrap());
    let client = Client::try_from(config).unwrap();
    let objects = footprint::render(&zone(), &settings("cilium"));
    let started = Instant::now();
    let err = footprint::apply(&client, &objects, Duration::from_secs(2))
        .await
        .unwrap_err();
    assert_eq!(err.reason(), "DownstreamUnreachable", "{err:?}");
    assert!(err.to_string().contains("Namespace"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(5));
    let err = footprint::teardown(&client, Duration::from_secs(2))
        .await
        .unwrap_err();
    assert_eq!(err.reason(), "DownstreamUnreachable", "{err:?}");
    assert!(err.to_string().contains("HTTPRoute"), "{err}");
}

/// The zone agent's pod as rendered, run for real: a fresh control plane with a hostlet
/// node (the KWOK node cordoned), our binaries mapped into the image, no hub behind the
/// relay. Both processes start and stay up under the restricted profile, the relay serves
/// its socket (the agent's calls reach it), the agent's endpoint answers with the region,
/// zone and auth mode from the env objects, and `/readyz` says it is not registered.
#[tokio::test]
async fn the_rendered_agent_runs_for_real_on_a_hostlet_node() {
    let tools = kontinuum_e2e::testbed::Tools::locate().unwrap();
    let mut cluster = kontinuum_e2e::addons::downstream_cluster(&tools, "footprint-hostlet")
        .await
        .unwrap();
    let client = cluster.client();
    let dir = cluster.dir().join("footprint");
    std::fs::create_dir_all(&dir).unwrap();
    let binary = |name: &str| {
        kontinuum_e2e::workspace_binary(name)
            .unwrap()
            .to_string_lossy()
            .into_owned()
    };
    let map = dir.join("image-map.json");
    let images = json!({ "images": [{
        "image": "kontinuum",
        "files": {
            "/usr/local/bin/registry": binary("registry"),
            "/usr/local/bin/etcd-proxy": binary("etcd-proxy"),
        },
    }] });
    std::fs::write(&map, images.to_string()).unwrap();
    let octet = u8::try_from(200 + std::process::id() % 50).unwrap();
    let mut node = kontinuum_e2e::testbed::HostletConfig::new(
        "zone-node",
        std::net::Ipv4Addr::new(127, octet, 1, 1),
        &map,
        binary("hostlet"),
    );
    node.pod_cidr = Some(format!("127.{octet}.2.0/24"));
    cluster.start_hostlet(&node).await.unwrap();
    // Only the hostlet node takes the pod.
    let nodes = Api::<k8s_openapi::api::core::v1::Node>::all(client.clone());
    for kwok in nodes.list(&kube::api::ListParams::default()).await.unwrap() {
        if kwok.name_any() != "zone-node" {
            let cordon = json!({ "spec": { "unschedulable": true } });
            nodes
                .patch(
                    &kwok.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(&cordon),
                )
                .await
                .unwrap();
        }
    }

    let identity = zone_installer::identity::issue("eu-west-1a").unwrap();
    let proxy_ca = zone_installer::identity::issue("proxy-ca").unwrap();
    let oidc_ca = zone_installer::identity::issue("oidc-ca").unwrap();
    let thumbprint = identity.thumbprint();
    let zone = Zone {
        domain: None,
        identity_cert_pem: &identity.cert_pem,
        identity_key_pem: identity.key.expose(),
        identity_thumbprint: &thumbprint,
        ..zone()
    };
    let mut s = settings("cilium");
    s.agent_image = "kontinuum:e2e".into();
    s.hub_grpc_endpoint = "127.0.0.1:1".into();
    s.proxy_ca_pem = Some(proxy_ca.cert_pem.clone());
    // Mounted for the agent, which reads it at start (a missing file would stop it).
    s.oidc_ca_pem = Some(oidc_ca.cert_pem.clone());
    s.auth_env = BTreeMap::from([("KONTINUUM_INSECURE_ALLOW_ANONYMOUS".into(), "true".into())]);
    let objects = footprint::render(&zone, &s);
    let observed = footprint::apply(&client, &objects, TIMEOUT).await.unwrap();
    assert_eq!(observed.certificate, None);
    assert!(!observed.agent_available, "nothing runs yet");

    let pods =
        Api::<k8s_openapi::api::core::v1::Pod>::namespaced(client.clone(), footprint::NAMESPACE);
    let selector = kube::api::ListParams::default().labels("app.kubernetes.io/name=kontinuum");
    let ip = std::cell::RefCell::new(None);
    eventually(LIMIT, "the relay Ready and the agent running", || async {
        let listed = pods.list(&selector).await?;
        let Some(pod) = listed.items.first() else {
            return Ok(false);
        };
        let status = pod.status.clone().unwrap_or_default();
        let statuses = status.container_statuses.unwrap_or_default();
        let relay_ready = statuses.iter().any(|c| c.name == "relay" && c.ready);
        let agent_running = statuses.iter().any(|c| {
            c.name == "kontinuum" && c.state.as_ref().is_some_and(|s| s.running.is_some())
        });
        *ip.borrow_mut() = status.pod_ip.clone();
        Ok(relay_ready && agent_running)
    })
    .await
    .unwrap();
    let ip: std::net::IpAddr = ip.into_inner().unwrap().parse().unwrap();
    let agent = std::net::SocketAddr::new(ip, 8080);
    let relay_admin = std::net::SocketAddr::new(ip, 8081);

    // The agent's calls go through the relay's socket (and fail at the missing hub).
    eventually(LIMIT, "the relay answering the agent's calls", || async {
        let metrics = kontinuum_e2e::http_get(relay_admin, "/metrics").await;
        Ok(metrics.is_some_and(|(code, body)| {
            code == 200 && body.contains("kontinuum_etcd_proxy_relay_requests_total{")
        }))
    })
    .await
    .unwrap();
    let (code, _) = kontinuum_e2e::http_get(agent, "/healthz").await.unwrap();
    assert_eq!(code, 200);
    let (code, _) = kontinuum_e2e::http_get(agent, "/readyz").await.unwrap();
    assert_eq!(code, 503, "no hub: not registered");
    let (code, body) = kontinuum_e2e::http_get(agent, "/status").await.unwrap();
    assert_eq!(code, 200, "anonymous mode mirrored: {body}");
    let status: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(status["region"], "eu");
    assert_eq!(status["zone"], "west-1a");
    assert_eq!(status["registered"], false);

    let pod = pods.list(&selector).await.unwrap().items.remove(0);
    for c in pod.status.unwrap().container_statuses.unwrap() {
        assert_eq!(
            c.restart_count, 0,
            "{} restarted: {:?}",
            c.name, c.last_state
        );
    }
    let observed = footprint::observe(&client, &objects, TIMEOUT)
        .await
        .unwrap();
    assert!(
        !observed.agent_available,
        "not available before it registers"
    );

    // Torn down: the processes go with the pods, the namespace with them.
    eventually(LIMIT, "the footprint torn down", || async {
        Ok(footprint::teardown(&client, TIMEOUT).await? == TeardownProgress::Done)
    })
    .await
    .unwrap();
}
