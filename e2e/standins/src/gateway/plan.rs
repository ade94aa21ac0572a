//! The pure part of the Gateway stand-in: from a snapshot of the cluster (GatewayClasses,
//! Gateways, HTTPRoutes, Services, EndpointSlices, TLS Secrets) to the data plane's port
//! configurations ([`plan`]), and, once the ports are bound, to every status the stand-in
//! owns ([`gateway_status`], [`route_parents`], [`class_status`]). No I/O, no clock.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Pod, Secret, Service, ServicePort};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kontinuum_crds::conditions::{self, ConditionStatus};
use kube::ResourceExt as _;

use super::proxy::{
    self, Backends, ListenerConfig, PathMatch, PortConfig, RouteConfig, RuleConfig,
};
use super::types::{
    GROUP, Gateway, GatewayAddress, GatewayClass, GatewayClassStatus, GatewayStatus, HTTPRoute,
    Listener, ListenerStatus, ParentReference, RouteGroupKind, RouteParentStatus,
};

/// Condition type `Accepted`.
pub const ACCEPTED: &str = "Accepted";
/// Condition type `Programmed`.
pub const PROGRAMMED: &str = "Programmed";
/// Condition type `ResolvedRefs`.
pub const RESOLVED_REFS: &str = "ResolvedRefs";
/// Condition type `Conflicted`.
pub const CONFLICTED: &str = "Conflicted";

/// The label naming an EndpointSlice's Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// What the stand-in is configured with.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The `controllerName` of the GatewayClasses it manages.
    pub controller_name: String,
    /// The address it listens on (reported as each Gateway's address).
    pub listen_ip: IpAddr,
    /// Added to every listener port (so 443 can be served without root).
    pub port_offset: u16,
}

/// A snapshot of the cluster.
#[derive(Clone, Debug, Default)]
pub struct World {
    /// GatewayClasses.
    pub classes: Vec<Arc<GatewayClass>>,
    /// Gateways.
    pub gateways: Vec<Arc<Gateway>>,
    /// HTTPRoutes.
    pub routes: Vec<Arc<HTTPRoute>>,
    /// Services.
    pub services: Vec<Arc<Service>>,
    /// EndpointSlices.
    pub slices: Vec<Arc<EndpointSlice>>,
    /// Secrets of type `kubernetes.io/tls`.
    pub secrets: Vec<Arc<Secret>>,
    /// Pods (for Services without EndpointSlices).
    pub pods: Vec<Arc<Pod>>,
}

/// Why a listener or reference is not usable: (reason, message).
pub type Problem = (&'static str, String);

/// The plan for one listener.
#[derive(Clone, Debug, PartialEq)]
pub struct ListenerPlan {
    /// The listener's name.
    pub name: String,
    /// The port the data plane serves it on (listener port + offset).
    pub port: Option<u16>,
    /// `Accepted=False` problem (unsupported protocol, port out of range).
    pub not_accepted: Option<Problem>,
    /// `Conflicted=True` problem.
    pub conflicted: Option<Problem>,
    /// `ResolvedRefs=False` problem.
    pub unresolved: Option<Problem>,
    /// The route kinds it supports.
    pub supported_kinds: Vec<RouteGroupKind>,
    /// How many routes attached.
    pub attached_routes: i32,
}

impl ListenerPlan {
    /// Whether the listener goes into the data plane.
    pub fn valid(&self) -> bool {
        self.not_accepted.is_none() && self.conflicted.is_none() && self.unresolved.is_none()
    }
}

/// The plan for one Gateway of a managed class.
#[derive(Clone, Debug, PartialEq)]
pub struct GatewayPlan {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// `metadata.generation`.
    pub generation: Option<i64>,
    /// `spec.addresses` asks for an address the stand-in does not have.
    pub unsupported_address: Option<String>,
    /// Listeners, in spec order.
    pub listeners: Vec<ListenerPlan>,
}

/// The plan for one HTTPRoute with a parent the stand-in manages.
#[derive(Clone, Debug, PartialEq)]
pub struct RoutePlan {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// `metadata.generation`.
    pub generation: Option<i64>,
    /// Per managed parentRef: (the ref, Accepted problem, ResolvedRefs problem).
    pub parents: Vec<(ParentReference, Option<Problem>, Option<Problem>)>,
}

/// Everything one round decides.
#[derive(Clone, Debug, Default)]
pub struct Plan {
    /// GatewayClasses of the stand-in's controller (names).
    pub classes: Vec<String>,
    /// Gateways of those classes.
    pub gateways: Vec<GatewayPlan>,
    /// HTTPRoutes attached (or trying to attach) to those Gateways.
    pub routes: Vec<RoutePlan>,
    /// The data plane: configuration per port.
    pub ports: BTreeMap<u16, PortConfig>,
}

fn precedence<K: kube::Resource>(a: &K, b: &K) -> std::cmp::Ordering {
    let key = |k: &K| {
        (
            k.meta().creation_timestamp.clone().map(|t| t.0),
            k.meta().namespace.clone(),
            k.meta().name.clone(),
        )
    };
    key(a).cmp(&key(b))
}

fn http_route_kind() -> RouteGroupKind {
    RouteGroupKind {
        group: Some(GROUP.to_owned()),
        kind: "HTTPRoute".to_owned(),
    }
}

/// Whether two host names (exact or wildcard) can both match some host.
pub fn hostnames_intersect(a: &str, b: &str) -> bool {
    let (a, b) = (a.to_ascii_lowercase(), b.to_ascii_lowercase());
    match (a.strip_prefix("*."), b.strip_prefix("*.")) {
        (None, None) => a == b,
        (Some(_), None) => proxy::host_matches(&a, &b),
        (None, Some(_)) => proxy::host_matches(&b, &a),
        (Some(x), Some(y)) => {
            x == y || x.ends_with(&format!(".{y}")) || y.ends_with(&format!(".{x}"))
        }
    }
}

fn tls_secret<'a>(world: &'a World, namespace: &str, name: &str) -> Option<&'a Secret> {
    world
        .secrets
        .iter()
        .find(|s| s.namespace().as_deref() == Some(namespace) && s.name_any() == name)
        .map(AsRef::as_ref)
}

/// The TLS configuration of an HTTPS listener, or why it has none.
fn listener_tls(
    world: &World,
    gateway: &Gateway,
    listener: &Listener,
) -> Result<Arc<rustls::ServerConfig>, Problem> {
    let namespace = gateway.namespace().unwrap_or_default();
    let tls = listener.tls.as_ref();
    if tls.and_then(|t| t.mode.as_deref()).unwrap_or("Terminate") != "Terminate" {
        return Err((
            "InvalidCertificateRef",
            "only TLS mode Terminate is supported on HTTPS listeners".into(),
        ));
    }
    let Some(reference) = tls.and_then(|t| t.certificate_refs.first()) else {
        return Err(("InvalidCertificateRef", "no certificateRefs".into()));
    };
    if reference.group.as_deref().unwrap_or_default() != ""
        || reference.kind.as_deref().unwrap_or("Secret") != "Secret"
    {
        return Err((
            "InvalidCertificateRef",
            format!("certificateRef {} is not a core Secret", reference.name),
        ));
    }
    if reference
        .namespace
        .as_deref()
        .is_some_and(|ns| ns != namespace)
    {
        return Err((
            "RefNotPermitted",
            format!(
                "certificateRef {} is in another namespace (ReferenceGrants are not honoured by the stand-in)",
                reference.name
            ),
        ));
    }
    let Some(secret) = tls_secret(world, &namespace, &reference.name) else {
        return Err((
            "InvalidCertificateRef",
            format!(
                "Secret {} of type kubernetes.io/tls does not exist",
                reference.name
            ),
        ));
    };
    let data = secret.data.clone().unwrap_or_default();
    let cert = data
        .get("tls.crt")
        .map(|b| b.0.as_slice())
        .unwrap_or_default();
    let key = data
        .get("tls.key")
        .map(|b| b.0.as_slice())
        .unwrap_or_default();
    if !crate::pki::key_matches(cert, key) {
        return Err((
            "InvalidCertificateRef",
            format!(
                "Secret {} holds no matching tls.crt and tls.key",
                reference.name
            ),
        ));
    }
    proxy::tls_config(cert, key).map_err(|why| {
        (
            "InvalidCertificateRef",
            format!("Secret {}: {why}", reference.name),
        )
    })
}

/// The endpoints of a Service port, or why the backend is not found.
fn service_endpoints(
    world: &World,
    namespace: &str,
    name: &str,
    port: i32,
) -> Result<Vec<SocketAddr>, Problem> {
    let Some(service) = world
        .services
        .iter()
        .find(|s| s.namespace().as_deref() == Some(namespace) && s.name_any() == name)
    else {
        return Err(("BackendNotFound", format!("Service {name} does not exist")));
    };
    let Some(service_port) = service
        .spec
        .as_ref()
        .and_then(|s| s.ports.as_ref())
        .and_then(|ports| ports.iter().find(|p| p.port == port))
    else {
        return Err((
            "BackendNotFound",
            format!("Service {name} has no port {port}"),
        ));
    };
    let port_name = service_port.name.clone().unwrap_or_default();
    let slices: Vec<&EndpointSlice> = world
        .slices
        .iter()
        .filter(|s| {
            s.namespace().as_deref() == Some(namespace)
                && s.labels().get(SERVICE_NAME_LABEL).map(String::as_str) == Some(name)
        })
        .map(AsRef::as_ref)
        .collect();
    let mut endpoints = BTreeSet::new();
    for slice in slices {
        let Some(target) = slice
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.clone().unwrap_or_default() == port_name)
            .and_then(|p| p.port)
            .and_then(|p| u16::try_from(p).ok())
        else {
            continue;
        };
        for endpoint in slice.endpoints.iter().flatten() {
            let ready = endpoint.conditions.as_ref().and_then(|c| c.ready);
            if ready == Some(false) {
                continue;
            }
            for address in &endpoint.addresses {
                if let Ok(ip) = address.parse::<IpAddr>() {
                    endpoints.insert(SocketAddr::new(ip, target));
                }
            }
        }
    }
    if endpoints.is_empty() {
        // No endpoints in EndpointSlices (none, or the controller's empty placeholder): on
        // the test bed the API server refuses the hostlet's loopback pod IPs in them, so
        // list what the EndpointSlice controller would: the Ready pods the Service selects.
        return Ok(pod_endpoints(world, namespace, service, service_port));
    }
    Ok(endpoints.into_iter().collect())
}

/// The endpoints the EndpointSlice controller would list for a Service port: the Ready,
/// not deleting pods its selector matches, at the port its `targetPort` names.
fn pod_endpoints(
    world: &World,
    namespace: &str,
    service: &Service,
    service_port: &ServicePort,
) -> Vec<SocketAddr> {
    let Some(selector) = service
        .spec
        .as_ref()
        .and_then(|s| s.selector.as_ref())
        .filter(|s| !s.is_empty())
    else {
        return Vec::new();
    };
    let mut endpoints = BTreeSet::new();
    for pod in &world.pods {
        let labels = pod.labels();
        if pod.namespace().as_deref() != Some(namespace)
            || pod.metadata.deletion_timestamp.is_some()
            || !selector.iter().all(|(k, v)| labels.get(k) == Some(v))
        {
            continue;
        }
        let status = pod.status.as_ref();
        let ready = status
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        let Some(ip) = status
            .and_then(|s| s.pod_ip.as_deref())
            .and_then(|ip| ip.parse::<IpAddr>().ok())
        else {
            continue;
        };
        let target = match &service_port.target_port {
            None => Some(service_port.port),
            Some(IntOrString::Int(port)) => Some(*port),
            Some(IntOrString::String(name)) => pod
                .spec
                .iter()
                .flat_map(|s| &s.containers)
                .flat_map(|c| c.ports.iter().flatten())
                .find(|p| p.name.as_deref() == Some(name.as_str()))
                .map(|p| p.container_port),
        };
        if let (true, Some(port)) = (ready, target.and_then(|p| u16::try_from(p).ok())) {
            endpoints.insert(SocketAddr::new(ip, port));
        }
    }
    endpoints.into_iter().collect()
}

/// A rule's backends, or the problem with the first invalid reference.
fn rule_backends(
    world: &World,
    namespace: &str,
    rule: &super::types::HttpRouteRule,
) -> (Backends, Option<Problem>) {
    let mut endpoints = BTreeSet::new();
    let mut problem = None;
    let mut any_valid = false;
    for backend in &rule.backend_refs {
        let result = if backend.group.as_deref().unwrap_or_default() != ""
            || backend.kind.as_deref().unwrap_or("Service") != "Service"
        {
            Err((
                "InvalidKind",
                format!("backendRef {} is not a core Service", backend.name),
            ))
        } else if backend
            .namespace
            .as_deref()
            .is_some_and(|ns| ns != namespace)
        {
            Err((
                "RefNotPermitted",
                format!(
                    "backendRef {} is in another namespace (ReferenceGrants are not honoured by the stand-in)",
                    backend.name
                ),
            ))
        } else if let Some(port) = backend.port {
            service_endpoints(world, namespace, &backend.name, port)
        } else {
            Err((
                "BackendNotFound",
                format!("backendRef {} has no port", backend.name),
            ))
        };
        match result {
            Ok(addrs) => {
                any_valid = true;
                if backend.weight.unwrap_or(1) > 0 {
                    endpoints.extend(addrs);
                }
            }
            Err(p) => {
                problem.get_or_insert(p);
            }
        }
    }
    let backends = if any_valid {
        Backends::endpoints(endpoints.into_iter().collect())
    } else {
        Backends::Invalid
    };
    (backends, problem)
}

fn path_matches(rule: &super::types::HttpRouteRule) -> Vec<PathMatch> {
    if rule.matches.is_empty() {
        return vec![PathMatch::Prefix("/".into())];
    }
    rule.matches
        .iter()
        .map(|m| {
            if !m.headers.is_empty() || !m.query_params.is_empty() || m.method.is_some() {
                return PathMatch::Never;
            }
            let path = m.path.clone().unwrap_or_default();
            let value = path.value.unwrap_or_else(|| "/".into());
            match path.type_.as_deref().unwrap_or("PathPrefix") {
                "PathPrefix" => PathMatch::Prefix(value),
                "Exact" => PathMatch::Exact(value),
                _ => PathMatch::Never,
            }
        })
        .collect()
}

/// Whether a parentRef names `gateway`.
fn refers_to(route_namespace: &str, parent: &ParentReference, gateway: &Gateway) -> bool {
    parent.group.as_deref().unwrap_or(GROUP) == GROUP
        && parent.kind.as_deref().unwrap_or("Gateway") == "Gateway"
        && parent.namespace.as_deref().unwrap_or(route_namespace)
            == gateway.namespace().as_deref().unwrap_or_default()
        && parent.name == gateway.name_any()
}

/// Which listeners hold each port: whether it is TLS, and the host names on it.
type PortClaims = BTreeMap<u16, (bool, Vec<Option<String>>)>;

/// The route kinds a listener supports, and whether it asks for kinds it does not.
fn route_kinds(listener: &Listener) -> (Vec<RouteGroupKind>, bool) {
    let kinds = listener
        .allowed_routes
        .as_ref()
        .map(|a| a.kinds.clone())
        .unwrap_or_default();
    let is_http_route =
        |k: &RouteGroupKind| k.kind == "HTTPRoute" && k.group.as_deref().unwrap_or(GROUP) == GROUP;
    let supported = if kinds.is_empty() || kinds.iter().any(is_http_route) {
        vec![http_route_kind()]
    } else {
        Vec::new()
    };
    (supported, kinds.iter().any(|k| !is_http_route(k)))
}

/// Plans one listener: its checks and, when valid, its data plane entry (routes come later).
fn plan_listener(
    world: &World,
    settings: &Settings,
    gateway: &Gateway,
    listener: &Listener,
    claims: &mut PortClaims,
) -> (ListenerPlan, Option<ListenerConfig>) {
    let mut lp = ListenerPlan {
        name: listener.name.clone(),
        port: None,
        not_accepted: None,
        conflicted: None,
        unresolved: None,
        supported_kinds: Vec::new(),
        attached_routes: 0,
    };
    let tls = match listener.protocol.as_str() {
        "HTTP" => false,
        "HTTPS" => true,
        other => {
            lp.not_accepted = Some((
                "UnsupportedProtocol",
                format!("the Gateway stand-in serves HTTP and HTTPS, not {other}"),
            ));
            return (lp, None);
        }
    };
    let Some(port) = u16::try_from(listener.port)
        .ok()
        .and_then(|p| p.checked_add(settings.port_offset))
    else {
        lp.not_accepted = Some((
            "PortUnavailable",
            format!(
                "port {} plus offset {} is out of range",
                listener.port, settings.port_offset
            ),
        ));
        return (lp, None);
    };
    lp.port = Some(port);
    let (supported, unsupported) = route_kinds(listener);
    lp.supported_kinds = supported;
    if unsupported {
        lp.unresolved = Some(("InvalidRouteKinds", "only HTTPRoute is supported".into()));
    }
    let claim = claims.entry(port).or_insert_with(|| (tls, Vec::new()));
    if claim.0 != tls {
        lp.conflicted = Some((
            "ProtocolConflict",
            format!("port {port} already serves another protocol"),
        ));
    } else if claim.1.contains(&listener.hostname) {
        lp.conflicted = Some((
            "HostnameConflict",
            format!("another Gateway's listener on port {port} has the same hostname"),
        ));
    } else {
        claim.1.push(listener.hostname.clone());
    }
    let server_tls = if tls {
        match listener_tls(world, gateway, listener) {
            Ok(config) => Some(config),
            Err(problem) => {
                lp.unresolved.get_or_insert(problem);
                None
            }
        }
    } else {
        None
    };
    let config = lp.valid().then(|| ListenerConfig {
        id: format!(
            "{}/{}/{}",
            gateway.namespace().unwrap_or_default(),
            gateway.name_any(),
            listener.name
        ),
        hostname: listener.hostname.clone(),
        tls: server_tls,
        routes: Vec::new(),
    });
    (lp, config)
}

/// Whether a listener lets a route of `route_namespace` attach (kind and namespace).
fn listener_allows(
    listener: &Listener,
    lp: &ListenerPlan,
    route_ns: &str,
    gateway_ns: &str,
) -> bool {
    if lp.supported_kinds.is_empty() {
        return false;
    }
    let from = listener
        .allowed_routes
        .as_ref()
        .and_then(|a| a.namespaces.as_ref())
        .and_then(|n| n.from.as_deref())
        .unwrap_or("Same");
    match from {
        "All" => true,
        "Same" => route_ns == gateway_ns,
        // `Selector` (label selectors on namespaces) is not honoured by the stand-in.
        _ => false,
    }
}

/// Attaches a route to one parent Gateway's listeners; returns the `Accepted` problem.
fn attach(
    route: &HTTPRoute,
    parent: &ParentReference,
    gateway: &Gateway,
    listeners: &mut [ListenerPlan],
    configs: &mut [Option<ListenerConfig>],
    rules: &[RuleConfig],
) -> Option<Problem> {
    let route_ns = route.namespace().unwrap_or_default();
    let gateway_ns = gateway.namespace().unwrap_or_default();
    let (mut matched_section, mut allowed, mut attached) = (false, false, false);
    for (li, listener) in gateway.spec.listeners.iter().enumerate() {
        if parent
            .section_name
            .as_ref()
            .is_some_and(|s| *s != listener.name)
            || parent.port.is_some_and(|p| p != listener.port)
        {
            continue;
        }
        matched_section = true;
        let Some(lp) = listeners.get_mut(li) else {
            continue;
        };
        if !listener_allows(listener, lp, &route_ns, &gateway_ns) {
            continue;
        }
        allowed = true;
        let host_ok = listener.hostname.as_ref().is_none_or(|l| {
            route.spec.hostnames.is_empty()
                || route
                    .spec
                    .hostnames
                    .iter()
                    .any(|h| hostnames_intersect(l, h))
        });
        if !host_ok {
            continue;
        }
        attached = true;
        lp.attached_routes += 1;
        if let Some(Some(config)) = configs.get_mut(li) {
            config.routes.push(RouteConfig {
                id: format!("{route_ns}/{}", route.name_any()),
                hostnames: route.spec.hostnames.clone(),
                rules: rules.to_vec(),
            });
        }
    }
    if attached {
        None
    } else if !matched_section {
        Some((
            "NoMatchingParent",
            "no listener of the Gateway matches sectionName/port".into(),
        ))
    } else if !allowed {
        Some((
            "NotAllowedByListeners",
            "no listener allows this route (kind or namespace)".into(),
        ))
    } else {
        Some((
            "NoMatchingListenerHostname",
            "no listener hostname intersects the route's hostnames".into(),
        ))
    }
}

/// Pure: the plan of one round.
pub fn plan(world: &World, settings: &Settings) -> Plan {
    let mut classes: Vec<String> = world
        .classes
        .iter()
        .filter(|c| c.spec.controller_name == settings.controller_name)
        .map(|c| c.name_any())
        .collect();
    classes.sort();
    let mut gateways: Vec<Arc<Gateway>> = world
        .gateways
        .iter()
        .filter(|g| classes.contains(&g.spec.gateway_class_name))
        .cloned()
        .collect();
    gateways.sort_by(|a, b| precedence(a.as_ref(), b.as_ref()));
    let mut routes: Vec<Arc<HTTPRoute>> = world.routes.clone();
    routes.sort_by(|a, b| precedence(a.as_ref(), b.as_ref()));

    let mut out = Plan {
        classes,
        ..Plan::default()
    };
    let mut claims = PortClaims::new();
    // Per gateway, per listener: the data plane listener being built.
    let mut built: Vec<Vec<Option<ListenerConfig>>> = Vec::new();
    for gateway in &gateways {
        let (listeners, configs): (Vec<_>, Vec<_>) = gateway
            .spec
            .listeners
            .iter()
            .map(|l| plan_listener(world, settings, gateway, l, &mut claims))
            .unzip();
        out.gateways.push(GatewayPlan {
            namespace: gateway.namespace().unwrap_or_default(),
            name: gateway.name_any(),
            generation: gateway.metadata.generation,
            unsupported_address: gateway
                .spec
                .addresses
                .iter()
                .find(|a| a.value != settings.listen_ip.to_string())
                .map(|a| a.value.clone()),
            listeners,
        });
        built.push(configs);
    }

    for route in &routes {
        let route_ns = route.namespace().unwrap_or_default();
        let mut rules = Vec::new();
        let mut resolved = None;
        for rule in &route.spec.rules {
            let (backends, problem) = rule_backends(world, &route_ns, rule);
            if resolved.is_none() {
                resolved = problem;
            }
            rules.push(RuleConfig {
                matches: path_matches(rule),
                backends,
            });
        }
        let mut parents = Vec::new();
        for parent in &route.spec.parent_refs {
            let Some(gi) = gateways
                .iter()
                .position(|g| refers_to(&route_ns, parent, g))
            else {
                continue;
            };
            let accepted = attach(
                route,
                parent,
                &gateways[gi],
                &mut out.gateways[gi].listeners,
                &mut built[gi],
                &rules,
            );
            parents.push((parent.clone(), accepted, resolved.clone()));
        }
        if !parents.is_empty() {
            out.routes.push(RoutePlan {
                namespace: route_ns,
                name: route.name_any(),
                generation: route.metadata.generation,
                parents,
            });
        }
    }

    // The data plane, per port, listeners in Gateway precedence order.
    for (gp, configs) in out.gateways.iter().zip(built) {
        for (lp, config) in gp.listeners.iter().zip(configs) {
            let (Some(config), Some(port)) = (config, lp.port) else {
                continue;
            };
            out.ports
                .entry(port)
                .or_insert_with(|| PortConfig {
                    tls: config.tls.is_some(),
                    listeners: Vec::new(),
                })
                .listeners
                .push(config);
        }
    }
    out
}

fn cond(
    type_: &str,
    status: bool,
    reason: &str,
    message: impl Into<String>,
    generation: Option<i64>,
) -> Condition {
    conditions::new(
        type_,
        ConditionStatus::from(status),
        reason,
        message,
        generation,
    )
}

fn merge(current: &[Condition], desired: Vec<Condition>, now: &Time) -> Vec<Condition> {
    let mut out: Vec<Condition> = current
        .iter()
        .filter(|c| desired.iter().any(|d| d.type_ == c.type_))
        .cloned()
        .collect();
    for c in desired {
        conditions::set(&mut out, c, now);
    }
    out.sort_by(|a, b| a.type_.cmp(&b.type_));
    out
}

/// Pure: a managed GatewayClass's status: `Accepted=True`.
pub fn class_status(class: &GatewayClass, now: &Time) -> GatewayClassStatus {
    let current = class.status.clone().unwrap_or_default();
    GatewayClassStatus {
        conditions: merge(
            &current.conditions,
            vec![cond(
                ACCEPTED,
                true,
                "Accepted",
                "Managed by the Kontinuum Gateway stand-in",
                class.metadata.generation,
            )],
            now,
        ),
    }
}

/// Pure: one listener's status; whether it is programmed.
fn listener_status(
    lp: &ListenerPlan,
    existing: &[Condition],
    bound: &BTreeMap<u16, Result<(), String>>,
    settings: &Settings,
    g: Option<i64>,
    now: &Time,
) -> (ListenerStatus, bool) {
    let bind_error = lp
        .port
        .and_then(|p| bound.get(&p))
        .and_then(|r| r.as_ref().err());
    let mut not_accepted = lp.not_accepted.clone();
    if not_accepted.is_none()
        && lp.conflicted.is_none()
        && let Some(e) = bind_error
    {
        not_accepted = Some(("PortUnavailable", format!("binding the port failed: {e}")));
    }
    let accepted = match &not_accepted {
        None => cond(ACCEPTED, true, "Accepted", "", g),
        Some((r, m)) => cond(ACCEPTED, false, r, m.clone(), g),
    };
    let conflicted = match &lp.conflicted {
        None => cond(CONFLICTED, false, "NoConflicts", "", g),
        Some((r, m)) => cond(CONFLICTED, true, r, m.clone(), g),
    };
    let resolved = match &lp.unresolved {
        None => cond(RESOLVED_REFS, true, "ResolvedRefs", "", g),
        Some((r, m)) => cond(RESOLVED_REFS, false, r, m.clone(), g),
    };
    let is_programmed = not_accepted.is_none() && lp.valid();
    let programmed = if is_programmed {
        let port = lp.port.unwrap_or_default();
        cond(
            PROGRAMMED,
            true,
            "Programmed",
            format!("serving on {}:{port}", settings.listen_ip),
            g,
        )
    } else {
        cond(PROGRAMMED, false, "Invalid", "the listener is not valid", g)
    };
    let status = ListenerStatus {
        name: lp.name.clone(),
        supported_kinds: lp.supported_kinds.clone(),
        attached_routes: lp.attached_routes,
        conditions: merge(
            existing,
            vec![accepted, conflicted, resolved, programmed],
            now,
        ),
    };
    (status, is_programmed)
}

/// Pure: a Gateway's status once the data plane reported which ports are bound.
pub fn gateway_status(
    plan: &GatewayPlan,
    current: Option<&GatewayStatus>,
    bound: &BTreeMap<u16, Result<(), String>>,
    settings: &Settings,
    now: &Time,
) -> GatewayStatus {
    let current = current.cloned().unwrap_or_default();
    let g = plan.generation;
    let mut listeners = Vec::new();
    let (mut any_programmed, mut any_invalid) = (false, false);
    for lp in &plan.listeners {
        let existing = current
            .listeners
            .iter()
            .find(|l| l.name == lp.name)
            .map(|l| l.conditions.clone())
            .unwrap_or_default();
        let (status, programmed) = listener_status(lp, &existing, bound, settings, g, now);
        any_programmed |= programmed;
        any_invalid |= !programmed;
        listeners.push(status);
    }
    let (accepted, programmed) = if let Some(address) = &plan.unsupported_address {
        (
            cond(
                ACCEPTED,
                false,
                "UnsupportedAddress",
                format!(
                    "the Gateway stand-in serves only {}, not {address}",
                    settings.listen_ip
                ),
                g,
            ),
            cond(
                PROGRAMMED,
                false,
                "AddressNotUsable",
                "the requested address is not served",
                g,
            ),
        )
    } else {
        let accepted = match (any_invalid, any_programmed) {
            (false, _) => cond(ACCEPTED, true, "Accepted", "", g),
            (true, true) => cond(
                ACCEPTED,
                true,
                "ListenersNotValid",
                "some listeners are not valid",
                g,
            ),
            (true, false) => cond(
                ACCEPTED,
                false,
                "ListenersNotValid",
                "no listener is valid",
                g,
            ),
        };
        let programmed = if any_programmed {
            cond(
                PROGRAMMED,
                true,
                "Programmed",
                format!("served by the Gateway stand-in on {}", settings.listen_ip),
                g,
            )
        } else {
            cond(PROGRAMMED, false, "Invalid", "no listener is programmed", g)
        };
        (accepted, programmed)
    };
    GatewayStatus {
        addresses: vec![GatewayAddress {
            type_: Some("IPAddress".to_owned()),
            value: settings.listen_ip.to_string(),
        }],
        conditions: merge(&current.conditions, vec![accepted, programmed], now),
        listeners,
    }
}

/// Pure: the route's `status.parents` entries of the stand-in's controller.
pub fn route_parents(
    plan: &RoutePlan,
    current: &[RouteParentStatus],
    controller_name: &str,
    now: &Time,
) -> Vec<RouteParentStatus> {
    let g = plan.generation;
    plan.parents
        .iter()
        .map(|(parent, accepted, resolved)| {
            let existing = current
                .iter()
                .find(|p| p.controller_name == controller_name && p.parent_ref == *parent)
                .map(|p| p.conditions.clone())
                .unwrap_or_default();
            let accepted = match accepted {
                None => cond(ACCEPTED, true, "Accepted", "", g),
                Some((r, m)) => cond(ACCEPTED, false, r, m.clone(), g),
            };
            let resolved = match resolved {
                None => cond(RESOLVED_REFS, true, "ResolvedRefs", "", g),
                Some((r, m)) => cond(RESOLVED_REFS, false, r, m.clone(), g),
            };
            RouteParentStatus {
                parent_ref: parent.clone(),
                controller_name: controller_name.to_owned(),
                conditions: merge(&existing, vec![accepted, resolved], now),
            }
        })
        .collect()
}

/// Whether two lists of conditions say the same, ignoring `lastTransitionTime`.
pub fn same_conditions(a: &[Condition], b: &[Condition]) -> bool {
    conditions::eq_ignoring_time(a, b)
}

/// Whether two Gateway statuses say the same, ignoring `lastTransitionTime`.
pub fn same_gateway_status(a: &GatewayStatus, b: &GatewayStatus) -> bool {
    a.addresses == b.addresses
        && same_conditions(&a.conditions, &b.conditions)
        && a.listeners.len() == b.listeners.len()
        && a.listeners.iter().all(|x| {
            b.listeners.iter().any(|y| {
                x.name == y.name
                    && x.supported_kinds == y.supported_kinds
                    && x.attached_routes == y.attached_routes
                    && same_conditions(&x.conditions, &y.conditions)
            })
        })
}

/// Whether two lists of route parent statuses say the same, ignoring `lastTransitionTime`.
pub fn same_parents(a: &[RouteParentStatus], b: &[RouteParentStatus]) -> bool {
    a.len() == b.len()
        && a.iter().all(|x| {
            b.iter().any(|y| {
                x.parent_ref == y.parent_ref
                    && x.controller_name == y.controller_name
                    && same_conditions(&x.conditions, &y.conditions)
            })
        })
}

#[cfg(test)]
mod tests;
