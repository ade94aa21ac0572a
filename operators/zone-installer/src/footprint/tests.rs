#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use serde_json::{Value, json};

use super::act::{self, certificate_state, deployment_available, is_missing_api, target};
use super::*;

const CERT: &str = "-----BEGIN CERTIFICATE-----\nMIIBcert\n-----END CERTIFICATE-----\n";
const KEY: &str = "-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIKEYMATERIALsecret\n-----END PRIVATE KEY-----\n";
const THUMB: &str = "ab12cd34";

fn zone(domain: Option<&'static str>) -> Zone<'static> {
    Zone {
        region: "eu",
        zone: "west-1a",
        zone_name: "eu-west-1a",
        domain,
        identity_cert_pem: CERT,
        identity_key_pem: KEY,
        identity_thumbprint: THUMB,
    }
}

fn settings() -> Settings {
    Settings {
        agent_image: "kontinuum:0.1.0".into(),
        image_pull_policy: None,
        hub_grpc_endpoint: "hub.example.com:443".into(),
        proxy_ca_pem: Some(
            "-----BEGIN CERTIFICATE-----\nproxyca\n-----END CERTIFICATE-----\n".into(),
        ),
        oidc_ca_pem: None,
        auth_env: BTreeMap::from([(
            "KONTINUUM_INSECURE_ALLOW_ANONYMOUS".to_owned(),
            "true".to_owned(),
        )]),
        gateway_class: "cilium".into(),
        issuer: IssuerKind::Acme {
            email: "ops@example.com".into(),
            server: "https://acme.example/directory".into(),
        },
    }
}

fn oidc_settings() -> Settings {
    Settings {
        auth_env: BTreeMap::from([
            (
                "KONTINUUM_OIDC_ISSUER_URL".to_owned(),
                "https://id.example".to_owned(),
            ),
            (
                "KONTINUUM_OIDC_CLIENT_ID".to_owned(),
                "kontinuum".to_owned(),
            ),
            (
                "KONTINUUM_OIDC_CLIENT_SECRET".to_owned(),
                "s3cr3t-value".to_owned(),
            ),
            ("KONTINUUM_OIDC_ADMIN_GROUPS".to_owned(), "ops".to_owned()),
            (
                "KONTINUUM_OIDC_REDIRECT_URL".to_owned(),
                "https://hub.example/app".to_owned(),
            ),
            (
                "KONTINUUM_OIDC_CA_FILE".to_owned(),
                "/etc/hub/ca.pem".to_owned(),
            ),
            // Not an auth variable: must never override the zone's own DSN.
            (
                "KONTINUUM_SERVER_STORAGE".to_owned(),
                "etcd://hub-store:2379".to_owned(),
            ),
        ]),
        ..settings()
    }
}

fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

fn kinds(objects: &[Value]) -> Vec<String> {
    objects
        .iter()
        .map(|o| {
            format!(
                "{}/{}",
                o["kind"].as_str().unwrap(),
                o["metadata"]["name"].as_str().unwrap()
            )
        })
        .collect()
}

fn decoded(secret: &Value) -> BTreeMap<String, String> {
    let data: BTreeMap<String, ByteString> =
        serde_json::from_value(secret["data"].clone()).unwrap();
    data.into_iter()
        .map(|(k, v)| (k, String::from_utf8(v.0).unwrap()))
        .collect()
}

fn container<'a>(objects: &'a [Value], name: &str) -> &'a Value {
    find(objects, "Deployment", DEPLOYMENT)["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no container {name}"))
}

fn env_value<'a>(container: &'a Value, name: &str) -> Option<&'a str> {
    container["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == name)
        .and_then(|e| e["value"].as_str())
}

fn mount<'a>(container: &'a Value, volume: &str) -> Option<&'a Value> {
    container["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == volume)
}

#[test]
fn without_a_domain_only_the_workload_is_rendered_in_install_order() {
    let objects = render(&zone(None), &settings());
    assert_eq!(
        kinds(&objects),
        [
            "Namespace/kontinuum-system",
            "Secret/kontinuum-identity",
            "Secret/kontinuum-env",
            "ConfigMap/kontinuum-env",
            "ConfigMap/kontinuum-ca",
            "Deployment/kontinuum",
            "Service/kontinuum",
        ]
    );
    for object in &objects[1..] {
        assert_eq!(object["metadata"]["namespace"], NAMESPACE, "{object}");
    }
    let config = find(&objects, "ConfigMap", ENV_CONFIG_MAP);
    assert!(config["data"].get("KONTINUUM_SERVER_DNS_DOMAIN").is_none());
    assert_eq!(config["data"]["KONTINUUM_SERVER_REGION"], "eu");
    assert_eq!(config["data"]["KONTINUUM_SERVER_ZONE"], "west-1a");
    let ns = &objects[0];
    assert_eq!(
        ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"],
        "restricted"
    );
    assert_eq!(host(&zone(None)), None);
}

#[test]
fn with_a_domain_the_network_objects_follow_for_the_zone_host() {
    let objects = render(&zone(Some("zones.example.com")), &settings());
    assert_eq!(
        kinds(&objects)[7..],
        [
            "ClusterIssuer/kontinuum",
            "Gateway/kontinuum",
            "Certificate/kontinuum",
            "HTTPRoute/kontinuum",
        ]
    );
    let host = "west-1a.eu.zones.example.com";
    assert_eq!(
        super::host(&zone(Some("zones.example.com."))).as_deref(),
        Some(host)
    );
    let issuer = find(&objects, "ClusterIssuer", NETWORK);
    assert!(
        issuer["metadata"].get("namespace").is_none(),
        "cluster-scoped"
    );

    let gateway = find(&objects, "Gateway", NETWORK);
    assert_eq!(gateway["spec"]["gatewayClassName"], "cilium");
    assert_eq!(
        gateway["spec"]["listeners"],
        json!([
            { "name": "http", "port": 80, "protocol": "HTTP" },
            {
                "name": "https", "port": 443, "protocol": "HTTPS", "hostname": host,
                "tls": {
                    "mode": "Terminate",
                    "certificateRefs": [{ "group": "", "kind": "Secret", "name": "kontinuum-tls" }]
                }
            }
        ])
    );
    let cert = find(&objects, "Certificate", NETWORK);
    assert_eq!(cert["spec"]["dnsNames"], json!([host]));
    assert_eq!(cert["spec"]["secretName"], TLS_SECRET);
    assert_eq!(
        cert["spec"]["issuerRef"],
        json!({ "group": "cert-manager.io", "kind": "ClusterIssuer", "name": "kontinuum" })
    );
    let route = find(&objects, "HTTPRoute", NETWORK);
    assert_eq!(route["spec"]["hostnames"], json!([host]));
    assert_eq!(route["spec"]["parentRefs"][0]["name"], "kontinuum");
    assert_eq!(route["spec"]["parentRefs"][0]["sectionName"], "https");
    assert_eq!(
        route["spec"]["rules"][0]["backendRefs"],
        json!([{ "group": "", "kind": "Service", "name": "kontinuum", "port": 80 }])
    );
    let config = find(&objects, "ConfigMap", ENV_CONFIG_MAP);
    assert_eq!(
        config["data"]["KONTINUUM_SERVER_DNS_DOMAIN"],
        "zones.example.com"
    );

    let mut other = settings();
    other.gateway_class = "istio".into();
    let objects = render(&zone(Some("zones.example.com")), &other);
    assert_eq!(
        find(&objects, "Gateway", NETWORK)["spec"]["gatewayClassName"],
        "istio"
    );
}

#[test]
fn acme_issuer_solves_http01_through_the_gateway() {
    let objects = render_in(&zone(Some("z.example")), &settings(), "ns-1");
    let spec = &find(&objects, "ClusterIssuer", NETWORK)["spec"];
    assert_eq!(spec["acme"]["server"], "https://acme.example/directory");
    assert_eq!(spec["acme"]["email"], "ops@example.com");
    assert_eq!(
        spec["acme"]["privateKeySecretRef"]["name"],
        ACCOUNT_KEY_SECRET
    );
    assert_eq!(
        spec["acme"]["solvers"][0]["http01"]["gatewayHTTPRoute"]["parentRefs"],
        json!([{
            "group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "kontinuum",
            "namespace": "ns-1", "sectionName": "http"
        }])
    );
    assert!(spec.get("selfSigned").is_none() && spec.get("ca").is_none());

    let mut no_email = settings();
    no_email.issuer = IssuerKind::Acme {
        email: " ".into(),
        server: "https://acme.example/directory".into(),
    };
    let objects = render(&zone(Some("z.example")), &no_email);
    assert!(
        find(&objects, "ClusterIssuer", NETWORK)["spec"]["acme"]
            .get("email")
            .is_none()
    );
}

#[test]
fn self_signed_and_ca_issuers() {
    let mut s = settings();
    s.issuer = IssuerKind::SelfSigned;
    let objects = render(&zone(Some("z.example")), &s);
    assert_eq!(
        find(&objects, "ClusterIssuer", NETWORK)["spec"],
        json!({ "selfSigned": {} })
    );
    s.issuer = IssuerKind::Ca {
        secret_name: "site-ca".into(),
    };
    let objects = render(&zone(Some("z.example")), &s);
    assert_eq!(
        find(&objects, "ClusterIssuer", NETWORK)["spec"],
        json!({ "ca": { "secretName": "site-ca" } })
    );
}

#[test]
fn the_dsn_names_the_zone_and_the_hub_endpoint_in_the_secret() {
    let objects = render(&zone(None), &oidc_settings());
    let env = decoded(find(&objects, "Secret", ENV_SECRET));
    assert_eq!(
        env.get(STORAGE_ENV).map(String::as_str),
        Some("grpc://eu-west-1a@hub.example.com:443"),
        "a hub variable of the same name never overrides it"
    );
    assert_eq!(
        dsn(&zone(None), &settings()),
        "grpc://eu-west-1a@hub.example.com:443"
    );
    let config = find(&objects, "ConfigMap", ENV_CONFIG_MAP);
    assert!(config["data"].get(STORAGE_ENV).is_none());
}

#[test]
fn auth_env_is_split_into_secret_and_plain() {
    let objects = render(&zone(Some("zones.example.com")), &oidc_settings());
    let secret = decoded(find(&objects, "Secret", ENV_SECRET));
    assert_eq!(
        secret.keys().map(String::as_str).collect::<Vec<_>>(),
        ["KONTINUUM_OIDC_CLIENT_SECRET", STORAGE_ENV]
    );
    assert_eq!(secret["KONTINUUM_OIDC_CLIENT_SECRET"], "s3cr3t-value");
    let data = &find(&objects, "ConfigMap", ENV_CONFIG_MAP)["data"];
    assert_eq!(data["KONTINUUM_OIDC_ISSUER_URL"], "https://id.example");
    assert_eq!(data["KONTINUUM_OIDC_CLIENT_ID"], "kontinuum");
    assert_eq!(data["KONTINUUM_OIDC_ADMIN_GROUPS"], "ops");
    assert_eq!(
        data["KONTINUUM_OIDC_REDIRECT_URL"], "https://west-1a.eu.zones.example.com/app",
        "the zone's own redirect URL, not the hub's"
    );
    assert!(data.get("KONTINUUM_OIDC_CA_FILE").is_none(), "a hub path");
    assert!(data.get("KONTINUUM_OIDC_CLIENT_SECRET").is_none());
    assert!(!data.to_string().contains("s3cr3t-value"));

    // Without a domain the hub's redirect URL is dropped, not copied.
    let objects = render(&zone(None), &oidc_settings());
    let data = &find(&objects, "ConfigMap", ENV_CONFIG_MAP)["data"];
    assert!(data.get("KONTINUUM_OIDC_REDIRECT_URL").is_none());

    // Anonymous mode: one plain variable, nothing secret but the DSN.
    let objects = render(&zone(Some("zones.example.com")), &settings());
    let data = &find(&objects, "ConfigMap", ENV_CONFIG_MAP)["data"];
    assert_eq!(data["KONTINUUM_INSECURE_ALLOW_ANONYMOUS"], "true");
    assert!(data.get("KONTINUUM_OIDC_REDIRECT_URL").is_none());
    assert_eq!(decoded(find(&objects, "Secret", ENV_SECRET)).len(), 1);

    assert!(is_secret_env("KONTINUUM_OIDC_CLIENT_SECRET"));
    assert!(is_secret_env("KONTINUUM_SERVER_STORAGE"));
    assert!(!is_secret_env("KONTINUUM_OIDC_CLIENT_ID"));
    assert!(is_auth_env("KONTINUUM_OIDC_CLIENT_ID"));
    assert!(!is_auth_env("KONTINUUM_SERVER_REGION"));
}

#[test]
fn the_proxy_ca_is_in_the_ca_config_map_and_mounted_for_the_relay_only() {
    let s = settings();
    let objects = render(&zone(None), &s);
    let data = &find(&objects, "ConfigMap", CA_CONFIG_MAP)["data"];
    assert_eq!(
        data,
        &json!({ "proxy-ca.crt": s.proxy_ca_pem.clone().unwrap() })
    );
    assert!(
        find(&objects, "ConfigMap", ENV_CONFIG_MAP)["data"]
            .get(PROXY_CA_KEY)
            .is_none(),
        "no longer an env entry"
    );
    let agent = container(&objects, AGENT_CONTAINER);
    assert!(mount(agent, "proxy-ca").is_none());
    let relay = container(&objects, RELAY_CONTAINER);
    assert_eq!(
        env_value(relay, "KONTINUUM_RELAY_CA"),
        Some("/etc/kontinuum/proxy-ca/ca.crt")
    );
    assert_eq!(mount(relay, "proxy-ca").unwrap()["readOnly"], true);
    let volumes = &find(&objects, "Deployment", DEPLOYMENT)["spec"]["template"]["spec"]["volumes"];
    let ca = volumes
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "proxy-ca")
        .unwrap();
    assert_eq!(
        ca["configMap"],
        json!({ "name": "kontinuum-ca", "items": [{ "key": "proxy-ca.crt", "path": "ca.crt" }], "defaultMode": 0o444 })
    );

    let mut system_roots = settings();
    system_roots.proxy_ca_pem = None;
    let objects = render(&zone(None), &system_roots);
    let relay = container(&objects, RELAY_CONTAINER);
    assert_eq!(env_value(relay, "KONTINUUM_RELAY_CA"), None);
    assert!(mount(relay, "proxy-ca").is_none());
    let deployment = find(&objects, "Deployment", DEPLOYMENT);
    assert!(
        !deployment.to_string().contains("proxy-ca.crt"),
        "no volume of a key that is not there"
    );
    // Still rendered, empty: a CA removed on the hub is removed in the zone too.
    assert_eq!(
        find(&objects, "ConfigMap", CA_CONFIG_MAP)["data"],
        json!({})
    );
}

#[test]
fn the_oidc_ca_is_mirrored_and_mounted_for_the_agent_only() {
    let oidc_ca = crate::identity::issue("oidc-ca").unwrap();
    let mut s = oidc_settings();
    s.oidc_ca_pem = Some(oidc_ca.cert_pem.clone());
    let objects = render(&zone(Some("z.example")), &s);
    let data = &find(&objects, "ConfigMap", CA_CONFIG_MAP)["data"];
    assert_eq!(data[OIDC_CA_KEY], oidc_ca.cert_pem);
    assert_eq!(data[PROXY_CA_KEY], s.proxy_ca_pem.clone().unwrap());
    assert_eq!(data.as_object().unwrap().len(), 2);

    let agent = container(&objects, AGENT_CONTAINER);
    assert_eq!(
        env_value(agent, OIDC_CA_FILE_ENV),
        Some("/etc/kontinuum/oidc-ca/ca.crt"),
        "the zone's own path, not the hub's /etc/hub/ca.pem"
    );
    let m = mount(agent, "oidc-ca").unwrap();
    assert_eq!(m["readOnly"], true);
    assert_eq!(m["mountPath"], OIDC_CA_DIR);
    let relay = container(&objects, RELAY_CONTAINER);
    assert!(mount(relay, "oidc-ca").is_none());
    assert_eq!(env_value(relay, OIDC_CA_FILE_ENV), None);
    let volumes = &find(&objects, "Deployment", DEPLOYMENT)["spec"]["template"]["spec"]["volumes"];
    let volume = volumes
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "oidc-ca")
        .unwrap();
    assert_eq!(
        volume["configMap"],
        json!({ "name": "kontinuum-ca", "items": [{ "key": "oidc-ca.crt", "path": "ca.crt" }], "defaultMode": 0o444 })
    );
    // The hub's path never reaches the env objects.
    let env = &find(&objects, "ConfigMap", ENV_CONFIG_MAP)["data"];
    assert!(env.get(OIDC_CA_FILE_ENV).is_none());
    assert!(!env.to_string().contains("/etc/hub/ca.pem"));

    // Without one: no variable, no mount, no volume, no key.
    let objects = render(&zone(Some("z.example")), &oidc_settings());
    let agent = container(&objects, AGENT_CONTAINER);
    assert_eq!(env_value(agent, OIDC_CA_FILE_ENV), None);
    assert!(mount(agent, "oidc-ca").is_none());
    assert!(
        find(&objects, "ConfigMap", CA_CONFIG_MAP)["data"]
            .get(OIDC_CA_KEY)
            .is_none()
    );
    assert!(
        !find(&objects, "Deployment", DEPLOYMENT)
            .to_string()
            .contains("oidc-ca")
    );
}

/// A C identifier, what every kubelet accepts as an environment variable's name.
fn is_env_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

#[test]
fn the_env_config_map_holds_only_environment_variables() {
    let oidc_ca = crate::identity::issue("oidc-ca").unwrap();
    for z in [zone(None), zone(Some("z.example"))] {
        for mut s in [settings(), oidc_settings()] {
            s.oidc_ca_pem = Some(oidc_ca.cert_pem.clone());
            let objects = render(&z, &s);
            for name in ["ConfigMap", "Secret"] {
                let object = find(&objects, name, "kontinuum-env");
                for key in object["data"].as_object().unwrap().keys() {
                    assert!(is_env_name(key), "{name} kontinuum-env: {key:?}");
                }
            }
            let text = find(&objects, "ConfigMap", ENV_CONFIG_MAP).to_string();
            assert!(!text.contains("BEGIN CERTIFICATE"), "{text}");
        }
    }
    assert!(!is_env_name("proxy-ca.crt"));
}

#[test]
fn a_ca_change_rolls_the_agent_out_and_touches_only_the_ca_config_map() {
    let before = render(&zone(None), &settings());
    let a = annotations(&before)[CONFIG_CHECKSUM].clone();
    let edits: [fn(&mut Settings); 3] = [
        |s: &mut Settings| {
            s.proxy_ca_pem =
                Some("-----BEGIN CERTIFICATE-----\nnew\n-----END CERTIFICATE-----\n".into());
        },
        |s: &mut Settings| s.proxy_ca_pem = None,
        |s: &mut Settings| {
            s.oidc_ca_pem =
                Some("-----BEGIN CERTIFICATE-----\noidc\n-----END CERTIFICATE-----\n".into());
        },
    ];
    for edit in edits {
        let mut s = settings();
        edit(&mut s);
        let after = render(&zone(None), &s);
        assert_ne!(a, annotations(&after)[CONFIG_CHECKSUM], "{s:?}");
        let changed: Vec<String> = kinds(&before)
            .into_iter()
            .zip(before.iter().zip(&after))
            .filter(|(_, (x, y))| x != y)
            .map(|(k, _)| k)
            .collect();
        assert_eq!(
            changed,
            ["ConfigMap/kontinuum-ca", "Deployment/kontinuum"],
            "{s:?}"
        );
    }
    // The same CA in the other key is another config too.
    let pem = "-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----\n".to_owned();
    let mut proxy = settings();
    proxy.proxy_ca_pem = Some(pem.clone());
    let mut oidc = settings();
    oidc.proxy_ca_pem = None;
    oidc.oidc_ca_pem = Some(pem);
    assert_ne!(
        annotations(&render(&zone(None), &proxy))[CONFIG_CHECKSUM],
        annotations(&render(&zone(None), &oidc))[CONFIG_CHECKSUM]
    );
}

#[test]
fn debug_shows_ca_fingerprints_not_pem() {
    let ca = crate::identity::issue("oidc-ca").unwrap();
    let mut s = settings();
    s.oidc_ca_pem = Some(format!("{}{}", ca.cert_pem, ca.cert_pem));
    let debug = format!("{s:?}");
    let body = ca.cert_pem.lines().nth(1).unwrap();
    assert!(!debug.contains(body), "{debug}");
    let expected = format!("2 certificate(s), first sha256:{}", ca.thumbprint());
    assert!(debug.contains(&expected), "{debug}");
    assert_eq!(pem_fingerprint("not a pem"), "no certificate");
}

#[test]
fn agent_and_relay_run_from_the_one_image_and_share_only_the_socket() {
    let objects = render(&zone(None), &settings());
    let deployment = find(&objects, "Deployment", DEPLOYMENT);
    assert_eq!(deployment["spec"]["replicas"], 1);
    assert_eq!(
        deployment["spec"]["selector"],
        json!({ "matchLabels": { "app.kubernetes.io/name": "kontinuum" } })
    );
    assert_eq!(
        deployment["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"],
        "kontinuum"
    );
    let agent = container(&objects, AGENT_CONTAINER);
    assert_eq!(agent["image"], "kontinuum:0.1.0");
    assert_eq!(agent["command"], json!(["/usr/local/bin/registry"]));
    assert_eq!(
        agent["args"],
        json!([
            "zone",
            "--addr=$(POD_IP):8080",
            "--admin-addr=$(POD_IP):9090"
        ])
    );
    assert_eq!(
        agent["envFrom"],
        json!([
            { "secretRef": { "name": "kontinuum-env" } },
            { "configMapRef": { "name": "kontinuum-env" } }
        ]),
        "the Secret first, then the ConfigMap"
    );
    let socket = "unix:///run/kontinuum/relay.sock";
    assert_eq!(env_value(agent, "KONTINUUM_REGISTRY_STORE"), Some(socket));
    assert!(
        mount(agent, "identity").is_none(),
        "the agent never sees the key"
    );
    assert!(agent.get("imagePullPolicy").is_none());

    let relay = container(&objects, RELAY_CONTAINER);
    assert_eq!(relay["image"], "kontinuum:0.1.0");
    assert_eq!(relay["command"], json!(["/usr/local/bin/etcd-proxy"]));
    assert_eq!(
        relay["args"],
        json!(["relay", "--admin-addr=$(POD_IP):8081"])
    );
    assert_eq!(env_value(relay, "KONTINUUM_RELAY_LISTEN"), Some(socket));
    assert_eq!(
        env_value(relay, "KONTINUUM_RELAY_ENDPOINT"),
        Some("hub.example.com:443")
    );
    assert_eq!(env_value(relay, "KONTINUUM_RELAY_ZONE"), Some("eu-west-1a"));
    assert_eq!(
        env_value(relay, "KONTINUUM_RELAY_IDENTITY_DIR"),
        Some("/etc/kontinuum/etcd-identity")
    );
    assert!(
        relay.get("envFrom").is_none(),
        "the relay gets no auth secrets"
    );
    let identity = mount(relay, "identity").unwrap();
    assert_eq!(identity["readOnly"], true);
    assert_eq!(identity["mountPath"], IDENTITY_DIR);
    for c in [agent, relay] {
        assert_eq!(mount(c, "relay").unwrap()["mountPath"], SOCKET_DIR);
        assert!(c["resources"]["requests"]["cpu"].is_string());
        assert!(c["resources"]["limits"]["memory"].is_string());
    }
    let volumes = &deployment["spec"]["template"]["spec"]["volumes"];
    let identity = volumes
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "identity")
        .unwrap();
    assert_eq!(identity["secret"]["secretName"], IDENTITY_SECRET);

    let mut pinned = settings();
    pinned.image_pull_policy = Some("Always".into());
    let objects = render(&zone(None), &pinned);
    for name in [AGENT_CONTAINER, RELAY_CONTAINER] {
        assert_eq!(container(&objects, name)["imagePullPolicy"], "Always");
    }
}

#[test]
fn pod_security_is_restricted() {
    let objects = render(&zone(None), &settings());
    let pod = &find(&objects, "Deployment", DEPLOYMENT)["spec"]["template"]["spec"];
    assert_eq!(
        pod["securityContext"],
        json!({
            "runAsNonRoot": true, "runAsUser": 65532, "runAsGroup": 65532, "fsGroup": 65532,
            "seccompProfile": { "type": "RuntimeDefault" }
        })
    );
    assert_eq!(pod["automountServiceAccountToken"], false);
    for name in [AGENT_CONTAINER, RELAY_CONTAINER] {
        let sc = &container(&objects, name)["securityContext"];
        assert_eq!(sc["runAsNonRoot"], true, "{name}");
        assert_eq!(sc["runAsUser"], 65532, "{name}");
        assert_eq!(sc["allowPrivilegeEscalation"], false, "{name}");
        assert_eq!(sc["readOnlyRootFilesystem"], true, "{name}");
        assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]), "{name}");
        assert_eq!(sc["seccompProfile"]["type"], "RuntimeDefault", "{name}");
    }
    // Only volume types the restricted profile allows.
    for volume in pod["volumes"].as_array().unwrap() {
        let types: Vec<&String> = volume
            .as_object()
            .unwrap()
            .keys()
            .filter(|k| *k != "name")
            .collect();
        assert!(
            types
                .iter()
                .all(|t| ["emptyDir", "secret", "configMap"].contains(&t.as_str())),
            "{volume}"
        );
    }
}

#[test]
fn probes_use_the_agents_and_relays_health_endpoints() {
    let objects = render(&zone(None), &settings());
    let agent = container(&objects, AGENT_CONTAINER);
    assert_eq!(
        agent["readinessProbe"]["httpGet"],
        json!({ "path": "/readyz", "port": "http" })
    );
    assert_eq!(
        agent["livenessProbe"]["httpGet"],
        json!({ "path": "/healthz", "port": "http" })
    );
    assert_eq!(
        agent["ports"][0],
        json!({ "name": "http", "containerPort": 8080, "protocol": "TCP" })
    );
    let relay = container(&objects, RELAY_CONTAINER);
    assert_eq!(
        relay["readinessProbe"]["httpGet"],
        json!({ "path": "/readyz", "port": "relay-admin" })
    );
    assert_eq!(
        relay["livenessProbe"]["httpGet"],
        json!({ "path": "/healthz", "port": "relay-admin" })
    );
    let service = find(&objects, "Service", SERVICE);
    assert_eq!(service["spec"]["type"], "ClusterIP");
    assert_eq!(
        service["spec"]["ports"],
        json!([{ "name": "http", "port": 80, "targetPort": "http", "protocol": "TCP" }])
    );
    assert_eq!(
        service["spec"]["selector"],
        json!({ "app.kubernetes.io/name": "kontinuum" })
    );
}

fn annotations(objects: &[Value]) -> Value {
    find(objects, "Deployment", DEPLOYMENT)["spec"]["template"]["metadata"]["annotations"].clone()
}

#[test]
fn the_thumbprint_annotation_changes_only_with_the_identity() {
    let s = settings();
    let first = render(&zone(Some("z.example")), &s);
    assert_eq!(first, render(&zone(Some("z.example")), &s), "deterministic");
    let a = annotations(&first);
    assert_eq!(a["kontinuum.sh/identity-thumbprint"], THUMB);
    assert_eq!(a.as_object().unwrap().len(), 2, "no timestamps: {a}");

    let mut rotated = zone(Some("z.example"));
    rotated.identity_thumbprint = "ffff0000";
    rotated.identity_key_pem = "-----BEGIN PRIVATE KEY-----\nNEW\n-----END PRIVATE KEY-----\n";
    let second = render(&rotated, &s);
    let b = annotations(&second);
    assert_eq!(b["kontinuum.sh/identity-thumbprint"], "ffff0000");
    assert_eq!(
        a[CONFIG_CHECKSUM], b[CONFIG_CHECKSUM],
        "the env did not change"
    );
    // Only the identity Secret and the annotation differ.
    let changed: Vec<String> = kinds(&first)
        .into_iter()
        .zip(first.iter().zip(&second))
        .filter(|(_, (x, y))| x != y)
        .map(|(k, _)| k)
        .collect();
    assert_eq!(
        changed,
        ["Secret/kontinuum-identity", "Deployment/kontinuum"]
    );

    // A settings change rolls the agent out through the checksum.
    let mut other = settings();
    other.hub_grpc_endpoint = "hub2.example.com:443".into();
    let c = annotations(&render(&zone(Some("z.example")), &other));
    assert_ne!(a[CONFIG_CHECKSUM], c[CONFIG_CHECKSUM]);
    assert_eq!(c["kontinuum.sh/identity-thumbprint"], THUMB);
}

#[test]
fn the_identity_secret_holds_the_certificate_and_the_key() {
    let objects = render(&zone(None), &settings());
    let identity = find(&objects, "Secret", IDENTITY_SECRET);
    assert_eq!(identity["type"], "kubernetes.io/tls");
    let data = decoded(identity);
    assert_eq!(data["tls.crt"], CERT);
    assert_eq!(data["tls.key"], KEY);
}

#[test]
fn the_key_never_appears_outside_the_identity_secret() {
    let key_b64 = serde_json::to_value(ByteString(KEY.as_bytes().to_vec())).unwrap();
    let key_b64 = key_b64.as_str().unwrap();
    for z in [zone(None), zone(Some("z.example"))] {
        for s in [settings(), oidc_settings()] {
            let objects = render(&z, &s);
            for object in &objects {
                if object["kind"] == "Secret" && object["metadata"]["name"] == IDENTITY_SECRET {
                    continue;
                }
                let text = object.to_string();
                assert!(!text.contains("KEYMATERIAL"), "{text}");
                assert!(!text.contains(key_b64), "{text}");
            }
        }
    }
    // Nor in Debug output (logs) of the inputs.
    let debug = format!("{:?} {:?}", zone(None), oidc_settings());
    assert!(!debug.contains("KEYMATERIAL"), "{debug}");
    assert!(!debug.contains("s3cr3t-value"), "{debug}");
    assert!(debug.contains(THUMB));
}

#[test]
fn every_rendered_object_is_addressable() {
    for z in [zone(None), zone(Some("z.example"))] {
        let objects = render(&z, &settings());
        for (index, object) in objects.iter().enumerate() {
            let t = target(index, object).unwrap();
            assert_eq!(t.kind.name, object["kind"]);
            assert_eq!(t.namespace.is_some(), t.kind.namespaced, "{object}");
            assert_eq!(
                object["metadata"]["labels"]["app.kubernetes.io/managed-by"],
                MANAGED_BY
            );
            assert_eq!(object["metadata"]["labels"]["kontinuum.sh/zone"], "west-1a");
        }
    }
}

#[test]
fn invalid_objects_are_refused_naming_what_is_missing() {
    let cases = [
        (
            json!({ "kind": "Secret", "metadata": { "name": "x", "namespace": "n" } }),
            "apiVersion",
        ),
        (
            json!({ "apiVersion": "v1", "metadata": { "name": "x" } }),
            "kind",
        ),
        (
            json!({ "apiVersion": "v1", "kind": "Secret", "metadata": { "namespace": "n" } }),
            "name",
        ),
        (
            json!({ "apiVersion": "v1", "kind": "Secret", "metadata": { "name": "x" } }),
            "namespace",
        ),
        (
            json!({ "apiVersion": "v1", "kind": "Pod", "metadata": { "name": "x", "namespace": "n" } }),
            "unsupported",
        ),
    ];
    for (object, why) in cases {
        let err = target(3, &object).unwrap_err();
        assert_eq!(err.reason(), "InvalidObject");
        assert!(err.to_string().contains(why), "{err}");
        assert!(err.to_string().contains(" 3"), "{err}");
    }
}

#[test]
fn certificate_readiness_comes_from_its_current_ready_condition() {
    assert_eq!(
        certificate_state(&json!({ "metadata": { "generation": 1 } })),
        CertificateState::NotReady {
            reason: "Pending".into(),
            message: "cert-manager has not reported on the certificate yet".into()
        }
    );
    let with = |status: &str, seen: i64| {
        json!({
            "metadata": { "generation": 2 },
            "status": { "conditions": [
                { "type": "Issuing", "status": "True" },
                { "type": "Ready", "status": status, "reason": "DoesNotExist",
                  "message": "Issuing certificate as Secret does not exist", "observedGeneration": seen }
            ] }
        })
    };
    assert_eq!(certificate_state(&with("True", 2)), CertificateState::Ready);
    assert_eq!(
        certificate_state(&with("False", 2)),
        CertificateState::NotReady {
            reason: "DoesNotExist".into(),
            message: "Issuing certificate as Secret does not exist".into()
        }
    );
    assert!(matches!(
        certificate_state(&with("True", 1)),
        CertificateState::NotReady { reason, .. } if reason == "Outdated"
    ));
    let bare = json!({ "status": { "conditions": [{ "type": "Ready", "status": "Unknown" }] } });
    assert!(matches!(
        certificate_state(&bare),
        CertificateState::NotReady { reason, .. } if reason == "NotReady"
    ));
}

#[test]
fn a_deployment_is_available_with_one_available_replica() {
    assert!(!deployment_available(&json!({ "status": {} })));
    assert!(!deployment_available(
        &json!({ "status": { "availableReplicas": 0 } })
    ));
    assert!(deployment_available(
        &json!({ "status": { "availableReplicas": 1 } })
    ));
}

#[test]
fn teardown_goes_in_reverse_install_order_with_the_namespace_last() {
    let steps: Vec<String> = act::teardown_steps("ns-x")
        .iter()
        .map(|s| format!("{}/{}@{}", s.kind.name, s.name, s.namespace.unwrap_or("-")))
        .collect();
    assert_eq!(
        steps,
        [
            "HTTPRoute/kontinuum@ns-x",
            "Certificate/kontinuum@ns-x",
            "Gateway/kontinuum@ns-x",
            "ClusterIssuer/kontinuum@-",
            "Service/kontinuum@ns-x",
            "Deployment/kontinuum@ns-x",
            "ConfigMap/kontinuum-ca@ns-x",
            "ConfigMap/kontinuum-env@ns-x",
            "Secret/kontinuum-env@ns-x",
            "Secret/kontinuum-identity@ns-x",
            "Secret/kontinuum-tls@ns-x",
            "Namespace/ns-x@-",
        ]
    );
    // Everything render() makes is torn down.
    let objects = render_in(&zone(Some("z.example")), &settings(), "ns-x");
    for object in &objects {
        let name = format!(
            "{}/{}@",
            object["kind"].as_str().unwrap(),
            object["metadata"]["name"].as_str().unwrap()
        );
        assert!(
            steps.iter().any(|s| s.starts_with(&name)),
            "{name} is never deleted"
        );
    }
}

#[test]
fn a_404_means_a_missing_crd_only_for_crd_kinds_and_not_for_a_missing_namespace() {
    let not_found = kube::core::Status::failure(
        "the server could not find the requested resource",
        "NotFound",
    )
    .with_code(404);
    assert!(is_missing_api(&act::GATEWAY, &not_found));
    assert!(is_missing_api(&act::CLUSTER_ISSUER, &not_found));
    assert!(!is_missing_api(&act::SECRET, &not_found));
    let no_namespace = not_found
        .clone()
        .with_details(kube::core::response::StatusDetails {
            kind: "namespaces".into(),
            name: "kontinuum-system".into(),
            group: String::new(),
            uid: String::new(),
            causes: Vec::new(),
            retry_after_seconds: 0,
        });
    assert!(!is_missing_api(&act::GATEWAY, &no_namespace));
    let invalid = kube::core::Status::failure("invalid", "Invalid").with_code(422);
    assert!(!is_missing_api(&act::GATEWAY, &invalid));
}

#[test]
fn errors_have_stable_reasons_and_name_the_object() {
    let crd = Error::CrdMissing {
        kind: "Gateway".into(),
        api_version: "gateway.networking.k8s.io/v1".into(),
    };
    assert_eq!(crd.reason(), "CrdMissing");
    assert!(crd.to_string().contains("Gateway"));
    assert!(crd.is_transient());
    let timeout = Error::Timeout {
        action: "applying",
        kind: "Deployment".into(),
        name: "kontinuum".into(),
        after: std::time::Duration::from_secs(10),
    };
    assert_eq!(timeout.reason(), "DownstreamUnreachable");
    assert!(timeout.to_string().contains("Deployment kontinuum"));
    let rejected = Error::Apply {
        kind: "Gateway".into(),
        name: "kontinuum".into(),
        source: Box::new(kube::Error::Api(
            kube::core::Status::failure("spec.listeners: Invalid value", "Invalid")
                .with_code(422)
                .boxed(),
        )),
    };
    assert_eq!(rejected.reason(), "ApplyFailed");
    assert!(!rejected.is_transient());
    assert_eq!(
        kontinuum_operator_common::error::ReconcileError::class(&rejected),
        kontinuum_operator_common::error::ErrorClass::Permanent
    );
    assert_eq!(
        rejected.to_string(),
        "applying Gateway kontinuum in the zone cluster failed"
    );
}
