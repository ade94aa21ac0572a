use std::collections::BTreeMap;

use k8s_openapi::jiff::Timestamp;
use serde_json::json;

use super::*;

const CONTROLLER_NAME: &str = "kontinuum.sh/gateway-standin";
const HOST: &str = "eu-1a.eu.example.com";

fn settings() -> Settings {
    Settings {
        controller_name: CONTROLLER_NAME.into(),
        listen_ip: IpAddr::from([127, 0, 0, 9]),
        port_offset: 8000,
    }
}

fn t(seconds: i64) -> Time {
    Time(Timestamp::from_second(seconds).unwrap())
}

fn class(name: &str, controller: &str) -> Arc<GatewayClass> {
    Arc::new(
        serde_json::from_value(json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "GatewayClass",
            "metadata": { "name": name, "generation": 1 },
            "spec": { "controllerName": controller }
        }))
        .unwrap(),
    )
}

fn gateway(name: &str, class: &str, created: &str, listeners: &serde_json::Value) -> Arc<Gateway> {
    Arc::new(
        serde_json::from_value(json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
            "metadata": { "name": name, "namespace": "ks", "generation": 2, "creationTimestamp": created },
            "spec": { "gatewayClassName": class, "listeners": listeners }
        }))
        .unwrap(),
    )
}

fn zone_listeners() -> serde_json::Value {
    json!([
        { "name": "http", "port": 80, "protocol": "HTTP" },
        { "name": "https", "port": 443, "protocol": "HTTPS", "hostname": HOST,
          "tls": { "mode": "Terminate", "certificateRefs": [{ "kind": "Secret", "group": "", "name": "kontinuum-tls" }] } }
    ])
}

fn route(
    name: &str,
    namespace: &str,
    parent: &serde_json::Value,
    hostnames: &[&str],
) -> Arc<HTTPRoute> {
    Arc::new(
        serde_json::from_value(json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
            "metadata": { "name": name, "namespace": namespace, "generation": 4 },
            "spec": {
                "parentRefs": [parent],
                "hostnames": hostnames,
                "rules": [{
                    "matches": [{ "path": { "type": "PathPrefix", "value": "/" } }],
                    "backendRefs": [{ "group": "", "kind": "Service", "name": "kontinuum", "port": 80, "weight": 1 }]
                }]
            }
        }))
        .unwrap(),
    )
}

fn service() -> Arc<Service> {
    Arc::new(
        serde_json::from_value(json!({
            "metadata": { "name": "kontinuum", "namespace": "ks" },
            "spec": { "ports": [{ "name": "http", "port": 80, "targetPort": "http" }] }
        }))
        .unwrap(),
    )
}

fn slice() -> Arc<EndpointSlice> {
    Arc::new(
        serde_json::from_value(json!({
            "metadata": { "name": "kontinuum-abc", "namespace": "ks",
                          "labels": { SERVICE_NAME_LABEL: "kontinuum" } },
            "addressType": "IPv4",
            "ports": [{ "name": "http", "port": 8080, "protocol": "TCP" }],
            "endpoints": [
                { "addresses": ["127.0.0.5"], "conditions": { "ready": true } },
                { "addresses": ["127.0.0.6"], "conditions": { "ready": false } }
            ]
        }))
        .unwrap(),
    )
}

fn tls_secret(name: &str) -> Arc<Secret> {
    use crate::pki::{CertificateRequest, KeyAlgorithm, Signer, issue};
    let issued = issue(
        &CertificateRequest {
            dns_names: vec![HOST.into()],
            not_before: 1_700_000_000,
            not_after: 1_900_000_000,
            ..CertificateRequest::default()
        },
        KeyAlgorithm::EcdsaP256,
        &Signer::SelfSigned,
    )
    .unwrap();
    let data: BTreeMap<String, k8s_openapi::ByteString> =
        [("tls.crt", issued.cert_pem), ("tls.key", issued.key_pem)]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), k8s_openapi::ByteString(v.into_bytes())))
            .collect();
    Arc::new(Secret {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some(name.into()),
            namespace: Some("ks".into()),
            ..Default::default()
        },
        type_: Some("kubernetes.io/tls".into()),
        data: Some(data),
        ..Secret::default()
    })
}

fn zone_world() -> World {
    World {
        classes: vec![
            class("standin", CONTROLLER_NAME),
            class("cilium", "io.cilium/gateway-controller"),
        ],
        gateways: vec![gateway(
            "kontinuum",
            "standin",
            "2026-01-01T00:00:00Z",
            &zone_listeners(),
        )],
        routes: vec![route(
            "kontinuum",
            "ks",
            &json!({ "name": "kontinuum", "sectionName": "https" }),
            &[HOST],
        )],
        services: vec![service()],
        slices: vec![slice()],
        secrets: vec![tls_secret("kontinuum-tls")],
        pods: Vec::new(),
    }
}

fn all_bound(plan: &Plan) -> BTreeMap<u16, Result<(), String>> {
    plan.ports.keys().map(|p| (*p, Ok(()))).collect()
}

fn condition<'a>(conds: &'a [Condition], type_: &str) -> (&'a str, &'a str) {
    let c = conditions::get(conds, type_).unwrap_or_else(|| panic!("no {type_} in {conds:?}"));
    (c.status.as_str(), c.reason.as_str())
}

#[test]
fn the_zone_gateway_is_programmed_and_routes_to_ready_endpoints() {
    let plan = plan(&zone_world(), &settings());
    assert_eq!(plan.classes, ["standin"]);
    assert_eq!(plan.ports.keys().copied().collect::<Vec<_>>(), [8080, 8443]);
    let https = &plan.ports[&8443];
    assert!(https.tls);
    assert_eq!(https.listeners[0].hostname.as_deref(), Some(HOST));
    assert!(https.listeners[0].tls.is_some());
    let route = &https.listeners[0].routes[0];
    let Backends::Endpoints(addrs, _) = &route.rules[0].backends else {
        panic!("backends are valid");
    };
    assert_eq!(addrs, &[SocketAddr::from(([127, 0, 0, 5], 8080))]);
    // The route names the https listener only.
    assert!(plan.ports[&8080].listeners[0].routes.is_empty());

    let status = gateway_status(
        &plan.gateways[0],
        None,
        &all_bound(&plan),
        &settings(),
        &t(10),
    );
    assert_eq!(
        condition(&status.conditions, ACCEPTED),
        ("True", "Accepted")
    );
    assert_eq!(
        condition(&status.conditions, PROGRAMMED),
        ("True", "Programmed")
    );
    assert_eq!(status.addresses[0].value, "127.0.0.9");
    let https = status.listeners.iter().find(|l| l.name == "https").unwrap();
    assert_eq!(https.attached_routes, 1);
    assert_eq!(https.supported_kinds, [http_route_kind()]);
    assert_eq!(
        condition(&https.conditions, RESOLVED_REFS),
        ("True", "ResolvedRefs")
    );
    assert_eq!(
        condition(&https.conditions, CONFLICTED),
        ("False", "NoConflicts")
    );
    assert_eq!(
        condition(&https.conditions, PROGRAMMED),
        ("True", "Programmed")
    );
    assert_eq!(https.conditions[0].observed_generation, Some(2));

    let parents = route_parents(&plan.routes[0], &[], CONTROLLER_NAME, &t(10));
    assert_eq!(parents.len(), 1);
    assert_eq!(parents[0].controller_name, CONTROLLER_NAME);
    assert_eq!(
        condition(&parents[0].conditions, ACCEPTED),
        ("True", "Accepted")
    );
    assert_eq!(
        condition(&parents[0].conditions, RESOLVED_REFS),
        ("True", "ResolvedRefs")
    );
}

#[test]
fn without_its_secret_the_https_listener_is_not_programmed() {
    let mut world = zone_world();
    world.secrets.clear();
    let plan = plan(&world, &settings());
    assert_eq!(plan.ports.keys().copied().collect::<Vec<_>>(), [8080]);
    let status = gateway_status(
        &plan.gateways[0],
        None,
        &all_bound(&plan),
        &settings(),
        &t(10),
    );
    let https = status.listeners.iter().find(|l| l.name == "https").unwrap();
    assert_eq!(
        condition(&https.conditions, RESOLVED_REFS),
        ("False", "InvalidCertificateRef")
    );
    assert_eq!(
        condition(&https.conditions, PROGRAMMED),
        ("False", "Invalid")
    );
    // The route still attaches (the listener is accepted); it is served once the Secret
    // exists.
    assert_eq!(https.attached_routes, 1);
    assert_eq!(
        condition(&status.conditions, ACCEPTED),
        ("True", "ListenersNotValid")
    );
    assert_eq!(
        condition(&status.conditions, PROGRAMMED),
        ("True", "Programmed")
    );
}

#[test]
fn gateways_of_other_classes_and_their_routes_are_left_alone() {
    let mut world = zone_world();
    world.gateways = vec![gateway(
        "other",
        "cilium",
        "2026-01-01T00:00:00Z",
        &zone_listeners(),
    )];
    world.routes = vec![route("r", "ks", &json!({ "name": "other" }), &[HOST])];
    let plan = plan(&world, &settings());
    assert!(plan.gateways.is_empty());
    assert!(plan.routes.is_empty());
    assert!(plan.ports.is_empty());
}

#[test]
fn routes_that_cannot_attach_say_why() {
    let mut world = zone_world();
    world.routes = vec![
        route(
            "wrong-host",
            "ks",
            &json!({ "name": "kontinuum", "sectionName": "https" }),
            &["other.org"],
        ),
        route(
            "wrong-section",
            "ks",
            &json!({ "name": "kontinuum", "sectionName": "nope" }),
            &[],
        ),
        route(
            "other-ns",
            "elsewhere",
            &json!({ "name": "kontinuum", "namespace": "ks" }),
            &[],
        ),
    ];
    let plan = plan(&world, &settings());
    let reason = |name: &str| {
        let r = plan.routes.iter().find(|r| r.name == name).unwrap();
        r.parents[0].1.as_ref().map(|p| p.0)
    };
    assert_eq!(reason("wrong-host"), Some("NoMatchingListenerHostname"));
    assert_eq!(reason("wrong-section"), Some("NoMatchingParent"));
    assert_eq!(reason("other-ns"), Some("NotAllowedByListeners"));
    let status = gateway_status(
        &plan.gateways[0],
        None,
        &all_bound(&plan),
        &settings(),
        &t(1),
    );
    assert!(status.listeners.iter().all(|l| l.attached_routes == 0));
}

#[test]
fn a_missing_backend_is_reported_and_answered_with_500() {
    let mut world = zone_world();
    world.services.clear();
    let plan = plan(&world, &settings());
    let resolved = plan.routes[0].parents[0].2.clone();
    assert_eq!(resolved.map(|p| p.0), Some("BackendNotFound"));
    let rule = &plan.ports[&8443].listeners[0].routes[0].rules[0];
    assert!(matches!(rule.backends, Backends::Invalid));
}

#[test]
fn a_second_gateway_on_the_same_port_and_host_conflicts() {
    let mut world = zone_world();
    world.gateways.push(gateway(
        "later",
        "standin",
        "2026-02-01T00:00:00Z",
        &json!([
            { "name": "web", "port": 80, "protocol": "HTTP" },
            { "name": "tls-on-80", "port": 80, "protocol": "HTTPS", "hostname": "x.example.com",
              "tls": { "certificateRefs": [{ "name": "kontinuum-tls" }] } }
        ]),
    ));
    let plan = plan(&world, &settings());
    let later = plan.gateways.iter().find(|g| g.name == "later").unwrap();
    assert_eq!(
        later.listeners[0].conflicted.as_ref().map(|c| c.0),
        Some("HostnameConflict")
    );
    assert_eq!(
        later.listeners[1].conflicted.as_ref().map(|c| c.0),
        Some("ProtocolConflict")
    );
    let first = plan
        .gateways
        .iter()
        .find(|g| g.name == "kontinuum")
        .unwrap();
    assert!(first.listeners.iter().all(ListenerPlan::valid));
}

#[test]
fn unsupported_protocols_and_bind_failures_are_not_accepted() {
    let mut world = zone_world();
    world.gateways = vec![gateway(
        "kontinuum",
        "standin",
        "2026-01-01T00:00:00Z",
        &json!([
            { "name": "tcp", "port": 5000, "protocol": "TCP" },
            { "name": "http", "port": 80, "protocol": "HTTP" }
        ]),
    )];
    let plan = plan(&world, &settings());
    let mut bound = all_bound(&plan);
    bound.insert(8080, Err("address in use".into()));
    let status = gateway_status(&plan.gateways[0], None, &bound, &settings(), &t(1));
    let tcp = &status.listeners[0];
    assert_eq!(
        condition(&tcp.conditions, ACCEPTED),
        ("False", "UnsupportedProtocol")
    );
    assert!(tcp.supported_kinds.is_empty());
    let http = &status.listeners[1];
    assert_eq!(
        condition(&http.conditions, ACCEPTED),
        ("False", "PortUnavailable")
    );
    assert_eq!(
        condition(&status.conditions, PROGRAMMED),
        ("False", "Invalid")
    );
}

#[test]
fn statuses_are_stable_and_keep_their_transition_times() {
    let world = zone_world();
    let plan = plan(&world, &settings());
    let bound = all_bound(&plan);
    let first = gateway_status(&plan.gateways[0], None, &bound, &settings(), &t(10));
    let second = gateway_status(&plan.gateways[0], Some(&first), &bound, &settings(), &t(20));
    assert!(same_gateway_status(&first, &second));
    assert_eq!(first, second, "transition times kept: nothing to write");
    let parents = route_parents(&plan.routes[0], &[], CONTROLLER_NAME, &t(10));
    let again = route_parents(&plan.routes[0], &parents, CONTROLLER_NAME, &t(20));
    assert_eq!(parents, again);
    let class_first = class_status(&world.classes[0], &t(10));
    assert_eq!(
        condition(&class_first.conditions, ACCEPTED),
        ("True", "Accepted")
    );
}

#[test]
fn wildcard_hostnames_intersect() {
    assert!(hostnames_intersect("*.example.com", "a.example.com"));
    assert!(hostnames_intersect("a.example.com", "*.example.com"));
    assert!(hostnames_intersect("*.example.com", "*.a.example.com"));
    assert!(!hostnames_intersect("*.example.com", "example.com"));
    assert!(!hostnames_intersect("a.example.com", "b.example.com"));
}

#[test]
fn without_endpoint_slices_the_selected_ready_pods_are_the_endpoints() {
    let mut world = zone_world();
    // The EndpointSlice controller's placeholder: no endpoints.
    world.slices = vec![Arc::new(
        serde_json::from_value(json!({
            "metadata": { "name": "kontinuum-xyz", "namespace": "ks",
                          "labels": { SERVICE_NAME_LABEL: "kontinuum" } },
            "addressType": "IPv4", "endpoints": []
        }))
        .unwrap(),
    )];
    world.services = vec![Arc::new(
        serde_json::from_value(json!({
            "metadata": { "name": "kontinuum", "namespace": "ks" },
            "spec": {
                "selector": { "app.kubernetes.io/name": "kontinuum" },
                "ports": [{ "name": "http", "port": 80, "targetPort": "http" }]
            }
        }))
        .unwrap(),
    )];
    let pod = |name: &str, ip: &str, ready: &str, app: &str| -> Arc<Pod> {
        Arc::new(
            serde_json::from_value(json!({
                "metadata": { "name": name, "namespace": "ks",
                              "labels": { "app.kubernetes.io/name": app } },
                "spec": { "containers": [{ "name": "c", "ports": [{ "name": "http", "containerPort": 8080 }] }] },
                "status": { "podIP": ip, "conditions": [{ "type": "Ready", "status": ready }] }
            }))
            .unwrap(),
        )
    };
    world.pods = vec![
        pod("ready", "127.20.0.7", "True", "kontinuum"),
        pod("starting", "127.20.0.8", "False", "kontinuum"),
        pod("other-app", "127.20.0.9", "True", "other"),
    ];
    let plan = plan(&world, &settings());
    let Backends::Endpoints(addrs, _) = &plan.ports[&8443].listeners[0].routes[0].rules[0].backends
    else {
        panic!("backends are valid");
    };
    assert_eq!(addrs, &[SocketAddr::from(([127, 20, 0, 7], 8080))]);
}
