//! The fields of Gateway API `gateway.networking.k8s.io/v1` kinds the Gateway stand-in
//! reads and writes. The CRDs in the cluster are the real ones (they apply the defaults);
//! these types name a subset, and unknown fields are ignored when reading.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use serde::{Deserialize, Serialize};

/// The Gateway API group.
pub const GROUP: &str = "gateway.networking.k8s.io";

/// `spec` of a `GatewayClass`.
#[derive(CustomResource, Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[kube(
    group = "gateway.networking.k8s.io",
    version = "v1",
    kind = "GatewayClass",
    status = "GatewayClassStatus",
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct GatewayClassSpec {
    /// The controller that manages Gateways of this class.
    pub controller_name: String,
}

/// `status` of a GatewayClass.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct GatewayClassStatus {
    /// Conditions; the stand-in owns `Accepted` on classes of its controller.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// `spec` of a `Gateway`.
#[derive(CustomResource, Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[kube(
    group = "gateway.networking.k8s.io",
    version = "v1",
    kind = "Gateway",
    namespaced,
    status = "GatewayStatus",
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct GatewaySpec {
    /// The GatewayClass.
    pub gateway_class_name: String,
    /// Listeners.
    #[serde(default)]
    pub listeners: Vec<Listener>,
    /// Requested addresses (the stand-in can only serve its listen IP).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<GatewayAddress>,
}

/// One listener of a Gateway.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Listener {
    /// Name, unique in the Gateway.
    pub name: String,
    /// Host name requests must be for (exact or `*.` wildcard); any when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    /// Port.
    pub port: i32,
    /// `HTTP`, `HTTPS`, `TLS`, `TCP` or `UDP` (the stand-in serves HTTP and HTTPS).
    pub protocol: String,
    /// TLS settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<ListenerTls>,
    /// Which routes may attach.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_routes: Option<AllowedRoutes>,
}

/// `tls` of a listener.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ListenerTls {
    /// `Terminate` (default) or `Passthrough`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// The certificate Secrets (the stand-in uses the first).
    #[serde(default)]
    pub certificate_refs: Vec<ObjectReference>,
}

/// A reference to an object by group, kind, namespace and name.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ObjectReference {
    /// Group (`""` is core).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Kind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Name.
    pub name: String,
    /// Namespace; the referrer's when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

/// `allowedRoutes` of a listener.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AllowedRoutes {
    /// From which namespaces.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespaces: Option<RouteNamespaces>,
    /// Which kinds.
    #[serde(default)]
    pub kinds: Vec<RouteGroupKind>,
}

/// `allowedRoutes.namespaces`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RouteNamespaces {
    /// `Same` (default), `All`, `Selector` or `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
}

/// A route kind.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct RouteGroupKind {
    /// Group; Gateway API's when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Kind.
    pub kind: String,
}

/// An address of a Gateway.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct GatewayAddress {
    /// `IPAddress` (default) or `Hostname`.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub type_: Option<String>,
    /// The address.
    pub value: String,
}

/// `status` of a Gateway.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct GatewayStatus {
    /// Where the Gateway is reachable: the stand-in's listen IP.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<GatewayAddress>,
    /// `Accepted`, `Programmed`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// One entry per listener.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub listeners: Vec<ListenerStatus>,
}

/// Status of one listener.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ListenerStatus {
    /// The listener's name.
    pub name: String,
    /// Route kinds it accepts.
    pub supported_kinds: Vec<RouteGroupKind>,
    /// How many routes are attached.
    pub attached_routes: i32,
    /// `Accepted`, `Conflicted`, `ResolvedRefs`, `Programmed`.
    pub conditions: Vec<Condition>,
}

/// `spec` of an `HTTPRoute`.
#[derive(CustomResource, Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[kube(
    group = "gateway.networking.k8s.io",
    version = "v1",
    kind = "HTTPRoute",
    namespaced,
    status = "HttpRouteStatus",
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct HttpRouteSpec {
    /// The Gateways (and listeners) to attach to.
    #[serde(default)]
    pub parent_refs: Vec<ParentReference>,
    /// Host names requests must be for; any when empty.
    #[serde(default)]
    pub hostnames: Vec<String>,
    /// Rules (the CRD defaults one matching every path).
    #[serde(default)]
    pub rules: Vec<HttpRouteRule>,
}

/// A route's reference to its parent.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ParentReference {
    /// Group; Gateway API's when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Kind; `Gateway` when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Namespace; the route's when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Name.
    pub name: String,
    /// Listener name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub section_name: Option<String>,
    /// Listener port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<i32>,
}

/// One rule of an HTTPRoute.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HttpRouteRule {
    /// Request matches (any may match); every path when empty.
    #[serde(default)]
    pub matches: Vec<HttpRouteMatch>,
    /// Where matching requests go.
    #[serde(default)]
    pub backend_refs: Vec<BackendRef>,
}

/// One request match.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HttpRouteMatch {
    /// Path match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<PathMatchSpec>,
    /// Header matches (not evaluated by the stand-in: such a match never matches).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub headers: Vec<serde_json::Value>,
    /// Query parameter matches (not evaluated: such a match never matches).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub query_params: Vec<serde_json::Value>,
    /// Method match (not evaluated: such a match never matches).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
}

/// A path match.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct PathMatchSpec {
    /// `PathPrefix` (default), `Exact` or `RegularExpression`.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub type_: Option<String>,
    /// The path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
}

/// A backend of a rule.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct BackendRef {
    /// Group (`""`, core, when unset).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Kind (`Service` when unset).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Name.
    pub name: String,
    /// Namespace; the route's when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// The Service port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<i32>,
    /// Relative weight (default 1; 0 takes no traffic).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<i32>,
}

/// `status` of an HTTPRoute.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HttpRouteStatus {
    /// One entry per (parent, controller).
    #[serde(default)]
    pub parents: Vec<RouteParentStatus>,
}

/// A route's status for one parent.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RouteParentStatus {
    /// The parent, as the route names it.
    pub parent_ref: ParentReference,
    /// The controller that wrote this entry.
    pub controller_name: String,
    /// `Accepted`, `ResolvedRefs`.
    pub conditions: Vec<Condition>,
}
