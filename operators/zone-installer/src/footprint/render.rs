//! Pure rendering of the footprint: every object, in install order, as JSON ready for
//! server-side apply. No I/O, no clock, no randomness: the same inputs give byte-identical
//! objects, so re-applying them is a no-op on the API server.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use kontinuum_crds::labels::{self, APP_NAME};
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};

use super::{
    ACCOUNT_KEY_SECRET, AGENT_CONTAINER, AGENT_HTTP_PORT, AGENT_METRICS_PORT, CA_CONFIG_MAP,
    CONFIG_CHECKSUM, DEPLOYMENT, ENV_CONFIG_MAP, ENV_SECRET, IDENTITY_DIR, IDENTITY_SECRET,
    IssuerKind, MANAGED_BY, NETWORK, OIDC_CA_DIR, OIDC_CA_FILE_ENV, OIDC_CA_KEY, PROXY_CA_DIR,
    PROXY_CA_KEY, RELAY_ADMIN_PORT, RELAY_CONTAINER, SERVICE, SOCKET_DIR, Settings, TLS_SECRET,
    Zone,
};

/// In-image path of the zone agent's binary.
const REGISTRY_BIN: &str = "/usr/local/bin/registry";
/// In-image path of the relay's binary.
const ETCD_PROXY_BIN: &str = "/usr/local/bin/etcd-proxy";
/// The unprivileged uid/gid every container runs as (the distroless `nonroot` user).
const NONROOT: i64 = 65532;
/// The relay's socket, inside [`SOCKET_DIR`] (shared by both containers).
const SOCKET_FILE: &str = "relay.sock";
/// Name of the file each CA is mounted as, inside [`PROXY_CA_DIR`] and [`OIDC_CA_DIR`].
const CA_FILE: &str = "ca.crt";

/// `KONTINUUM_OIDC_ISSUER_URL`: its presence means the hub runs in OIDC mode.
const OIDC_ISSUER_URL: &str = "KONTINUUM_OIDC_ISSUER_URL";
/// `KONTINUUM_OIDC_REDIRECT_URL`: the zone's own, never the hub's.
const OIDC_REDIRECT_URL: &str = "KONTINUUM_OIDC_REDIRECT_URL";
/// `KONTINUUM_INSECURE_ALLOW_ANONYMOUS`: the anonymous auth mode.
const ALLOW_ANONYMOUS: &str = "KONTINUUM_INSECURE_ALLOW_ANONYMOUS";

/// Whether an environment variable holds a secret, so it goes to the `kontinuum-env`
/// Secret rather than the ConfigMap: the storage DSN, and any `*_SECRET`, `*_PASSWORD` or
/// `*_TOKEN` (e.g. `KONTINUUM_OIDC_CLIENT_SECRET`).
pub fn is_secret_env(name: &str) -> bool {
    name == super::STORAGE_ENV
        || name.ends_with("_SECRET")
        || name.ends_with("_PASSWORD")
        || name.ends_with("_TOKEN")
}

/// Whether a hub variable is part of the auth mode mirrored into the zone:
/// `KONTINUUM_OIDC_*` or `KONTINUUM_INSECURE_ALLOW_ANONYMOUS`. Anything else in
/// [`Settings::auth_env`] is ignored, so a setting can never override the zone's own
/// region, zone or DSN.
pub fn is_auth_env(name: &str) -> bool {
    name == ALLOW_ANONYMOUS || name.starts_with("KONTINUUM_OIDC_")
}

/// `<zone>.<region>.<domain>`, the zone endpoint's host name, when the zone has a domain.
pub fn host(zone: &Zone<'_>) -> Option<String> {
    zone.domain
        .map(|domain| format!("{}.{}.{}", zone.zone, zone.region, domain.trim_matches('.')))
}

/// The zone agent's storage DSN: `grpc://<zone name>@<hub grpc endpoint>`.
pub fn dsn(zone: &Zone<'_>, settings: &Settings) -> String {
    format!("grpc://{}@{}", zone.zone_name, settings.hub_grpc_endpoint)
}

/// The mirrored auth mode, split into (secret, plain) variables. The hub's redirect URL
/// and CA file (a path on the hub) are not copied: in OIDC mode a zone with a domain gets
/// its own redirect URL `https://<host>/app` (reference section 3.6 step 11), and the CA's
/// content reaches the agent through [`CA_CONFIG_MAP`].
fn auth_env(
    settings: &Settings,
    host: Option<&str>,
) -> (BTreeMap<String, String>, BTreeMap<String, String>) {
    let mut secret = BTreeMap::new();
    let mut plain = BTreeMap::new();
    for (name, value) in &settings.auth_env {
        if !is_auth_env(name) || name == OIDC_REDIRECT_URL || name == OIDC_CA_FILE_ENV {
            continue;
        }
        if is_secret_env(name) {
            secret.insert(name.clone(), value.clone());
        } else {
            plain.insert(name.clone(), value.clone());
        }
    }
    let oidc = settings
        .auth_env
        .get(OIDC_ISSUER_URL)
        .is_some_and(|v| !v.trim().is_empty());
    if let (true, Some(host)) = (oidc, host) {
        plain.insert(OIDC_REDIRECT_URL.to_owned(), format!("https://{host}/app"));
    }
    (secret, plain)
}

/// The `kontinuum-env` Secret's entries: the DSN and the secret auth variables.
pub fn secret_env(zone: &Zone<'_>, settings: &Settings) -> BTreeMap<String, String> {
    let host = host(zone);
    let (mut secret, _) = auth_env(settings, host.as_deref());
    secret.insert(super::STORAGE_ENV.to_owned(), dsn(zone, settings));
    secret
}

/// The `kontinuum-env` ConfigMap's entries: region, zone, DNS domain and the plain auth
/// variables. Environment variables only (it is loaded with `envFrom`); the CAs are in
/// [`ca_data`].
pub fn config_env(zone: &Zone<'_>, settings: &Settings) -> BTreeMap<String, String> {
    let host = host(zone);
    let (_, mut plain) = auth_env(settings, host.as_deref());
    plain.insert("KONTINUUM_SERVER_REGION".to_owned(), zone.region.to_owned());
    plain.insert("KONTINUUM_SERVER_ZONE".to_owned(), zone.zone.to_owned());
    if let Some(domain) = zone.domain {
        plain.insert(
            "KONTINUUM_SERVER_DNS_DOMAIN".to_owned(),
            domain.trim_matches('.').to_owned(),
        );
    }
    plain
}

/// The `kontinuum-ca` ConfigMap's entries: [`PROXY_CA_KEY`] when the hub has a proxy CA,
/// [`OIDC_CA_KEY`] when it has an OIDC CA; empty otherwise.
pub fn ca_data(settings: &Settings) -> BTreeMap<String, String> {
    [
        (PROXY_CA_KEY, &settings.proxy_ca_pem),
        (OIDC_CA_KEY, &settings.oidc_ca_pem),
    ]
    .into_iter()
    .filter_map(|(key, pem)| pem.as_ref().map(|pem| (key.to_owned(), pem.clone())))
    .collect()
}

/// What a PEM bundle is, for logs: how many certificates, and the SHA-256 of the first
/// one's DER (a CA certificate is public; its fingerprint identifies it). Pure.
pub fn pem_fingerprint(pem: &str) -> String {
    let ders = crate::identity::certificates(pem.as_bytes());
    match ders.first() {
        None => "no certificate".to_owned(),
        Some(first) => format!(
            "{} certificate(s), first sha256:{:x}",
            ders.len(),
            Sha256::digest(first)
        ),
    }
}

/// SHA-256 (hex) over the env objects' and the CA ConfigMap's entries: a pod template
/// annotation, so that a change of settings rolls the agent out (env from a ConfigMap or
/// Secret, and the CA files, are read only at container start). Deterministic, so an
/// unchanged config never restarts anything.
fn config_checksum(
    secret: &BTreeMap<String, String>,
    plain: &BTreeMap<String, String>,
    cas: &BTreeMap<String, String>,
) -> String {
    let mut hasher = Sha256::new();
    for (section, entries) in [("secret", secret), ("configmap", plain), ("ca", cas)] {
        hasher.update(section.as_bytes());
        hasher.update([0]);
        for (name, value) in entries {
            // Length-prefixed, so no two different maps hash alike.
            for part in [name, value] {
                hasher.update((part.len() as u64).to_be_bytes());
                hasher.update(part.as_bytes());
            }
        }
    }
    format!("{:x}", hasher.finalize())
}

/// Base64 (the API's encoding of Secret `data`) of each value.
fn secret_data(entries: &BTreeMap<String, String>) -> Value {
    let data: BTreeMap<&str, ByteString> = entries
        .iter()
        .map(|(k, v)| (k.as_str(), ByteString(v.as_bytes().to_vec())))
        .collect();
    serde_json::to_value(data).unwrap_or(Value::Null)
}

/// Labels of every object.
fn common_labels(zone: &Zone<'_>) -> Value {
    json!({
        APP_NAME: "kontinuum",
        "app.kubernetes.io/managed-by": MANAGED_BY,
        labels::REGION: zone.region,
        labels::ZONE: zone.zone,
    })
}

fn metadata(name: &str, namespace: Option<&str>, zone: &Zone<'_>) -> Value {
    let mut meta = json!({ "name": name, "labels": common_labels(zone) });
    if let Some(ns) = namespace {
        meta["namespace"] = json!(ns);
    }
    meta
}

fn namespace_object(zone: &Zone<'_>, namespace: &str) -> Value {
    let mut meta = metadata(namespace, None, zone);
    meta["labels"]["pod-security.kubernetes.io/enforce"] = json!("restricted");
    meta["labels"]["pod-security.kubernetes.io/warn"] = json!("restricted");
    json!({ "apiVersion": "v1", "kind": "Namespace", "metadata": meta })
}

fn identity_secret(zone: &Zone<'_>, namespace: &str) -> Value {
    let entries = BTreeMap::from([
        ("tls.crt".to_owned(), zone.identity_cert_pem.to_owned()),
        ("tls.key".to_owned(), zone.identity_key_pem.to_owned()),
    ]);
    json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": metadata(IDENTITY_SECRET, Some(namespace), zone),
        "type": "kubernetes.io/tls",
        "data": secret_data(&entries),
    })
}

fn env_secret(zone: &Zone<'_>, namespace: &str, entries: &BTreeMap<String, String>) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": metadata(ENV_SECRET, Some(namespace), zone),
        "type": "Opaque",
        "data": secret_data(entries),
    })
}

fn config_map(
    name: &str,
    zone: &Zone<'_>,
    namespace: &str,
    entries: &BTreeMap<String, String>,
) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(name, Some(namespace), zone),
        "data": entries,
    })
}

/// A read-only volume of one key of [`CA_CONFIG_MAP`], as the file [`CA_FILE`].
fn ca_volume(name: &str, key: &str) -> Value {
    json!({
        "name": name,
        "configMap": {
            "name": CA_CONFIG_MAP,
            "items": [{ "key": key, "path": CA_FILE }],
            "defaultMode": 0o444,
        },
    })
}

/// The restricted Pod Security Standard, per container.
fn container_security() -> Value {
    json!({
        "runAsNonRoot": true,
        "runAsUser": NONROOT,
        "runAsGroup": NONROOT,
        "readOnlyRootFilesystem": true,
        "allowPrivilegeEscalation": false,
        "privileged": false,
        "capabilities": { "drop": ["ALL"] },
        "seccompProfile": { "type": "RuntimeDefault" },
    })
}

fn field_env(name: &str, path: &str) -> Value {
    json!({ "name": name, "valueFrom": { "fieldRef": { "fieldPath": path } } })
}

fn http_probe(path: &str, port: &str, period: u32, failures: u32) -> Value {
    json!({
        "httpGet": { "path": path, "port": port },
        "periodSeconds": period,
        "timeoutSeconds": 2,
        "failureThreshold": failures,
    })
}

fn socket_uri() -> String {
    format!("unix://{SOCKET_DIR}/{SOCKET_FILE}")
}

/// The zone agent: `registry zone`, reaching the store only through the relay's socket;
/// with the hub's OIDC CA mounted read-only and named by [`OIDC_CA_FILE_ENV`], when set.
fn agent_container(settings: &Settings) -> Value {
    let mut env = vec![
        field_env("POD_NAME", "metadata.name"),
        field_env("POD_NAMESPACE", "metadata.namespace"),
        field_env("POD_IP", "status.podIP"),
        json!({ "name": "KONTINUUM_REGISTRY_STORE", "value": socket_uri() }),
    ];
    let mut mounts = vec![
        json!({ "name": "tmp", "mountPath": "/tmp" }),
        json!({ "name": "relay", "mountPath": SOCKET_DIR }),
    ];
    if settings.oidc_ca_pem.is_some() {
        env.push(json!({
            "name": OIDC_CA_FILE_ENV,
            "value": format!("{OIDC_CA_DIR}/{CA_FILE}"),
        }));
        mounts.push(json!({ "name": "oidc-ca", "mountPath": OIDC_CA_DIR, "readOnly": true }));
    }
    let mut container = json!({
        "name": AGENT_CONTAINER,
        "image": settings.agent_image,
        "command": [REGISTRY_BIN],
        // Bound to the pod's own IP, not 0.0.0.0: pods may share a network (host
        // networking with one loopback address per pod) and must not clash on a port.
        "args": [
            "zone",
            format!("--addr=$(POD_IP):{AGENT_HTTP_PORT}"),
            format!("--admin-addr=$(POD_IP):{AGENT_METRICS_PORT}"),
        ],
        "env": env,
        "envFrom": [
            { "secretRef": { "name": ENV_SECRET } },
            { "configMapRef": { "name": ENV_CONFIG_MAP } },
        ],
        "ports": [
            { "name": "http", "containerPort": AGENT_HTTP_PORT, "protocol": "TCP" },
            { "name": "metrics", "containerPort": AGENT_METRICS_PORT, "protocol": "TCP" },
        ],
        // /healthz: the process is alive; /readyz: the zone is registered in the hub's store.
        "livenessProbe": http_probe("/healthz", "http", 10, 3),
        "readinessProbe": http_probe("/readyz", "http", 5, 3),
        "resources": {
            "requests": { "cpu": "10m", "memory": "32Mi" },
            "limits": { "memory": "128Mi" },
        },
        "securityContext": container_security(),
        "volumeMounts": mounts,
    });
    if let Some(policy) = &settings.image_pull_policy {
        container["imagePullPolicy"] = json!(policy);
    }
    container
}

/// The relay: `etcd-proxy relay`, the only holder of the identity key (mounted read-only);
/// it puts a short-lived token (signed once per second) on every call and dials the hub
/// with the proxy CA.
fn relay_container(zone: &Zone<'_>, settings: &Settings) -> Value {
    let mut env = vec![
        field_env("POD_IP", "status.podIP"),
        json!({ "name": "KONTINUUM_RELAY_LISTEN", "value": socket_uri() }),
        json!({ "name": "KONTINUUM_RELAY_ENDPOINT", "value": settings.hub_grpc_endpoint }),
        json!({ "name": "KONTINUUM_RELAY_ZONE", "value": zone.zone_name }),
        json!({ "name": "KONTINUUM_RELAY_IDENTITY_DIR", "value": IDENTITY_DIR }),
    ];
    let mut mounts = vec![
        json!({ "name": "tmp", "mountPath": "/tmp" }),
        json!({ "name": "relay", "mountPath": SOCKET_DIR }),
        json!({ "name": "identity", "mountPath": IDENTITY_DIR, "readOnly": true }),
    ];
    if settings.proxy_ca_pem.is_some() {
        env.push(json!({
            "name": "KONTINUUM_RELAY_CA",
            "value": format!("{PROXY_CA_DIR}/{CA_FILE}"),
        }));
        mounts.push(json!({ "name": "proxy-ca", "mountPath": PROXY_CA_DIR, "readOnly": true }));
    }
    let mut container = json!({
        "name": RELAY_CONTAINER,
        "image": settings.agent_image,
        "command": [ETCD_PROXY_BIN],
        "args": ["relay", format!("--admin-addr=$(POD_IP):{RELAY_ADMIN_PORT}")],
        "env": env,
        "ports": [
            { "name": "relay-admin", "containerPort": RELAY_ADMIN_PORT, "protocol": "TCP" },
        ],
        "livenessProbe": http_probe("/healthz", "relay-admin", 10, 3),
        "readinessProbe": http_probe("/readyz", "relay-admin", 5, 3),
        "resources": {
            "requests": { "cpu": "10m", "memory": "32Mi" },
            "limits": { "memory": "128Mi" },
        },
        "securityContext": container_security(),
        "volumeMounts": mounts,
    });
    if let Some(policy) = &settings.image_pull_policy {
        container["imagePullPolicy"] = json!(policy);
    }
    container
}

fn deployment(zone: &Zone<'_>, settings: &Settings, namespace: &str, checksum: &str) -> Value {
    let mut volumes = vec![
        json!({ "name": "tmp", "emptyDir": { "sizeLimit": "64Mi" } }),
        json!({ "name": "relay", "emptyDir": { "sizeLimit": "1Mi" } }),
        json!({
            "name": "identity",
            "secret": { "secretName": IDENTITY_SECRET, "defaultMode": 0o440 },
        }),
    ];
    if settings.proxy_ca_pem.is_some() {
        volumes.push(ca_volume("proxy-ca", PROXY_CA_KEY));
    }
    if settings.oidc_ca_pem.is_some() {
        volumes.push(ca_volume("oidc-ca", OIDC_CA_KEY));
    }
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(DEPLOYMENT, Some(namespace), zone),
        "spec": {
            "replicas": 1,
            "revisionHistoryLimit": 3,
            // A new pod (new identity or settings) registers before the old one goes.
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": { "maxUnavailable": 0, "maxSurge": 1 },
            },
            "selector": { "matchLabels": { APP_NAME: "kontinuum" } },
            "template": {
                "metadata": {
                    "labels": common_labels(zone),
                    "annotations": {
                        // Changes exactly when the identity rotates: one restart per rotation.
                        labels::IDENTITY_THUMBPRINT: zone.identity_thumbprint,
                        CONFIG_CHECKSUM: checksum,
                    },
                },
                "spec": {
                    // The agent never talks to the zone's Kubernetes API.
                    "automountServiceAccountToken": false,
                    "enableServiceLinks": false,
                    "terminationGracePeriodSeconds": 30,
                    "securityContext": {
                        "runAsNonRoot": true,
                        "runAsUser": NONROOT,
                        "runAsGroup": NONROOT,
                        "fsGroup": NONROOT,
                        "seccompProfile": { "type": "RuntimeDefault" },
                    },
                    "containers": [agent_container(settings), relay_container(zone, settings)],
                    "volumes": volumes,
                },
            },
        },
    })
}

fn service(zone: &Zone<'_>, namespace: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(SERVICE, Some(namespace), zone),
        "spec": {
            "type": "ClusterIP",
            "selector": { APP_NAME: "kontinuum" },
            "ports": [{ "name": "http", "port": 80, "targetPort": "http", "protocol": "TCP" }],
        },
    })
}

fn cluster_issuer(zone: &Zone<'_>, settings: &Settings, namespace: &str) -> Value {
    let spec = match &settings.issuer {
        IssuerKind::Acme { email, server } => {
            let mut acme = json!({
                "server": server,
                "privateKeySecretRef": { "name": ACCOUNT_KEY_SECRET },
                "solvers": [{
                    "http01": {
                        "gatewayHTTPRoute": {
                            // The challenge is answered on the Gateway's plain HTTP listener.
                            "parentRefs": [{
                                "group": "gateway.networking.k8s.io",
                                "kind": "Gateway",
                                "name": NETWORK,
                                "namespace": namespace,
                                "sectionName": "http",
                            }],
                        },
                    },
                }],
            });
            if !email.trim().is_empty() {
                acme["email"] = json!(email);
            }
            json!({ "acme": acme })
        }
        IssuerKind::SelfSigned => json!({ "selfSigned": {} }),
        IssuerKind::Ca { secret_name } => json!({ "ca": { "secretName": secret_name } }),
    };
    json!({
        "apiVersion": "cert-manager.io/v1",
        "kind": "ClusterIssuer",
        "metadata": metadata(NETWORK, None, zone),
        "spec": spec,
    })
}

fn gateway(zone: &Zone<'_>, settings: &Settings, namespace: &str, host: &str) -> Value {
    json!({
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "Gateway",
        "metadata": metadata(NETWORK, Some(namespace), zone),
        "spec": {
            "gatewayClassName": settings.gateway_class,
            "listeners": [
                { "name": "http", "port": 80, "protocol": "HTTP" },
                {
                    "name": "https",
                    "port": 443,
                    "protocol": "HTTPS",
                    "hostname": host,
                    "tls": {
                        "mode": "Terminate",
                        "certificateRefs": [{ "group": "", "kind": "Secret", "name": TLS_SECRET }],
                    },
                },
            ],
        },
    })
}

fn certificate(zone: &Zone<'_>, namespace: &str, host: &str) -> Value {
    json!({
        "apiVersion": "cert-manager.io/v1",
        "kind": "Certificate",
        "metadata": metadata(NETWORK, Some(namespace), zone),
        "spec": {
            "secretName": TLS_SECRET,
            "dnsNames": [host],
            "issuerRef": { "group": "cert-manager.io", "kind": "ClusterIssuer", "name": NETWORK },
        },
    })
}

fn http_route(zone: &Zone<'_>, namespace: &str, host: &str) -> Value {
    json!({
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": metadata(NETWORK, Some(namespace), zone),
        "spec": {
            "parentRefs": [{
                "group": "gateway.networking.k8s.io",
                "kind": "Gateway",
                "name": NETWORK,
                "sectionName": "https",
            }],
            "hostnames": [host],
            "rules": [{
                "backendRefs": [{ "group": "", "kind": "Service", "name": SERVICE, "port": 80 }],
            }],
        },
    })
}

/// Every object of the footprint in `namespace`, in install order.
pub fn render_in(zone: &Zone<'_>, settings: &Settings, namespace: &str) -> Vec<Value> {
    let secret = secret_env(zone, settings);
    let plain = config_env(zone, settings);
    let cas = ca_data(settings);
    let checksum = config_checksum(&secret, &plain, &cas);
    let mut objects = vec![
        namespace_object(zone, namespace),
        identity_secret(zone, namespace),
        env_secret(zone, namespace, &secret),
        config_map(ENV_CONFIG_MAP, zone, namespace, &plain),
        config_map(CA_CONFIG_MAP, zone, namespace, &cas),
        deployment(zone, settings, namespace, &checksum),
        service(zone, namespace),
    ];
    if let Some(host) = host(zone) {
        objects.extend([
            cluster_issuer(zone, settings, namespace),
            gateway(zone, settings, namespace, &host),
            certificate(zone, namespace, &host),
            http_route(zone, namespace, &host),
        ]);
    }
    objects
}
