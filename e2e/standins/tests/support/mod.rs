//! Shared by the stand-ins' e2e tests: the real CRDs, the binaries as processes, objects as
//! JSON, and condition reads.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kontinuum_e2e::Operator;
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};

/// How long any wait in these tests may take.
pub const LIMIT: Duration = Duration::from_secs(60);

/// The real CRDs (unmodified upstream copies, kept with the fixture charts) the stand-ins
/// work on: cert-manager's Certificates and issuers; Gateway API's classes, Gateways and
/// HTTPRoutes.
pub async fn install_crds(client: &Client) {
    let charts = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/charts");
    let files = [
        "cert-manager/files/crds/cert-manager.io_certificates.yaml",
        "cert-manager/files/crds/cert-manager.io_clusterissuers.yaml",
        "cert-manager/files/crds/cert-manager.io_issuers.yaml",
        "gateway-api-crds/files/standard/gateway.networking.k8s.io_gatewayclasses.yaml",
        "gateway-api-crds/files/standard/gateway.networking.k8s.io_gateways.yaml",
        "gateway-api-crds/files/standard/gateway.networking.k8s.io_httproutes.yaml",
    ];
    let crds: Vec<CustomResourceDefinition> = files
        .iter()
        .map(|f| {
            let text = std::fs::read_to_string(charts.join(f)).unwrap();
            serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("parsing {f}: {e}"))
        })
        .collect();
    kontinuum_e2e::install_crds(client, &crds).await.unwrap();
}

/// Starts a stand-in binary against the shared test bed (admin kubeconfig).
pub async fn start(bin: &str, name: &str, args: &[&str]) -> Operator {
    let (_, shared) = kontinuum_e2e::shared_client().await.unwrap();
    Operator::start(Path::new(bin), name, &shared.kubeconfig_path, args)
        .await
        .unwrap()
}

/// A dynamic API for `group/version` `kind` (plural `plural`), namespaced unless `namespace`
/// is `None`.
pub fn api(
    client: &Client,
    gvk: (&str, &str, &str),
    plural: &str,
    namespace: Option<&str>,
) -> Api<DynamicObject> {
    let (group, version, kind) = gvk;
    let resource =
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural);
    match namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
        None => Api::all_with(client.clone(), &resource),
    }
}

/// cert-manager's kinds.
pub fn certificates(client: &Client, ns: &str) -> Api<DynamicObject> {
    api(
        client,
        ("cert-manager.io", "v1", "Certificate"),
        "certificates",
        Some(ns),
    )
}
/// ClusterIssuers.
pub fn cluster_issuers(client: &Client) -> Api<DynamicObject> {
    api(
        client,
        ("cert-manager.io", "v1", "ClusterIssuer"),
        "clusterissuers",
        None,
    )
}
/// Issuers.
pub fn issuers(client: &Client, ns: &str) -> Api<DynamicObject> {
    api(
        client,
        ("cert-manager.io", "v1", "Issuer"),
        "issuers",
        Some(ns),
    )
}
/// GatewayClasses.
pub fn gateway_classes(client: &Client) -> Api<DynamicObject> {
    api(
        client,
        ("gateway.networking.k8s.io", "v1", "GatewayClass"),
        "gatewayclasses",
        None,
    )
}
/// Gateways.
pub fn gateways(client: &Client, ns: &str) -> Api<DynamicObject> {
    api(
        client,
        ("gateway.networking.k8s.io", "v1", "Gateway"),
        "gateways",
        Some(ns),
    )
}
/// HTTPRoutes.
pub fn http_routes(client: &Client, ns: &str) -> Api<DynamicObject> {
    api(
        client,
        ("gateway.networking.k8s.io", "v1", "HTTPRoute"),
        "httproutes",
        Some(ns),
    )
}

/// Applies `object` (JSON with apiVersion/kind/metadata.name) server-side as the tests.
pub async fn apply(api: &Api<DynamicObject>, object: serde_json::Value) {
    let name = object["metadata"]["name"].as_str().unwrap().to_owned();
    api.patch(
        &name,
        &PatchParams::apply(kontinuum_e2e::FIELD_MANAGER).force(),
        &Patch::Apply(&object),
    )
    .await
    .unwrap_or_else(|e| panic!("applying {name}: {e}"));
}

/// `(status, reason)` of condition `type_` in the conditions array at `pointer`.
pub fn condition_at(
    object: &DynamicObject,
    pointer: &str,
    type_: &str,
) -> Option<(String, String)> {
    object
        .data
        .pointer(pointer)?
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
        .map(|c| {
            (
                c["status"].as_str().unwrap_or_default().to_owned(),
                c["reason"].as_str().unwrap_or_default().to_owned(),
            )
        })
}

/// Waits until condition `type_` of `name` (conditions at `/status/conditions`) has
/// `status` and `reason`; returns the object.
pub async fn wait_condition(
    api: &Api<DynamicObject>,
    name: &str,
    type_: &str,
    expected: (&str, &str),
) -> DynamicObject {
    let last = std::cell::RefCell::new(None);
    let what = format!("{name} {type_}={expected:?}");
    let result = kontinuum_e2e::eventually(LIMIT, &what, || {
        let api = api.clone();
        let last = &last;
        async move {
            let object = api.get(name).await?;
            let found = condition_at(&object, "/status/conditions", type_);
            let ok = found
                .as_ref()
                .is_some_and(|(s, r)| (s.as_str(), r.as_str()) == expected);
            *last.borrow_mut() = Some((object, found));
            Ok(ok)
        }
    })
    .await;
    let last = last.into_inner();
    match (result, last) {
        (Ok(()), Some((object, _))) => object,
        (Err(e), last) => panic!("{e}; last seen: {:?}", last.map(|(_, c)| c)),
        (Ok(()), None) => unreachable!(),
    }
}
