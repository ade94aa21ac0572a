//! `v1alpha1.Config.Validate` for the `metal` platform, re-stated from Talos
//! (`pkg/machinery/config/types/v1alpha1/v1alpha1_validation.go`), plus the runtime-fatal
//! checks Kontinuum refuses up front (their messages end with "(fails at runtime in Talos)").

use crate::checks::{
    is_subnet_or_address, is_valid_dns_name, kubernetes_version_of_image, parse_cidr, parse_url,
    validate_endpoint_uri, validate_ip_or_cidr, validate_label_value, validate_qualified_name,
    validate_taint,
};
use crate::decode::Decoded;
use crate::yaml::Node;
use crate::{Contract, DocumentRef, MachineType, Problem, ProblemKind};

/// Collects problems of one document.
pub(crate) struct Report<'a> {
    pub doc: &'a DocumentRef,
    pub problems: &'a mut Vec<Problem>,
}

impl Report<'_> {
    pub fn add(&mut self, kind: ProblemKind, path: &str, line: usize, message: impl Into<String>) {
        self.problems.push(Problem {
            document: self.doc.clone(),
            path: path.to_owned(),
            line: Some(line),
            kind,
            message: message.into(),
        });
    }

    pub fn invalid(&mut self, path: &str, line: usize, message: impl Into<String>) {
        self.add(ProblemKind::Invalid, path, line, message);
    }

    pub fn missing(&mut self, path: &str, line: usize, message: impl Into<String>) {
        self.add(ProblemKind::Missing, path, line, message);
    }
}

/// Talos' Kubernetes Talos API access roles (`role.All`).
const TALOS_ROLES: [&str; 5] = [
    "os:admin",
    "os:operator",
    "os:reader",
    "os:etcd:backup",
    "os:impersonator",
];
/// `constants.KubeSpanLinkMinimumMTU`.
const KUBESPAN_MIN_MTU: i128 = 1280;
/// Talos' default discovery service endpoint.
const DEFAULT_DISCOVERY_ENDPOINT: &str = "https://discovery.talos.dev/";

fn text(node: Option<&Node>) -> &str {
    node.and_then(Node::text).unwrap_or_default()
}

fn flag(node: Option<&Node>) -> bool {
    node.and_then(Node::as_bool).unwrap_or(false)
}

/// Validates the `v1alpha1` document; returns its machine type when it has a valid one.
pub(crate) fn validate(
    doc: &Decoded,
    contract: Contract,
    problems: &mut Vec<Problem>,
    warnings: &mut Vec<String>,
) -> Option<MachineType> {
    let mut r = Report {
        doc: &doc.id,
        problems,
    };
    let root = &doc.root;
    if let Some(version) = root.get("version")
        && version.text() != Some("v1alpha1")
    {
        r.invalid(".version", version.line, "invalid config version");
    }
    let Some(machine) = root.get("machine") else {
        r.missing(".machine", root.line, "machine instructions are required");
        return None;
    };
    let machine_type = machine_type(machine, &mut r, warnings);
    let control_plane = machine_type.is_some_and(MachineType::is_control_plane);
    match root.get("cluster") {
        None => r.missing(".cluster", root.line, "cluster instructions are required"),
        Some(cluster) => validate_cluster(cluster, control_plane, &mut r),
    }
    validate_install(machine, &mut r);
    validate_host_dns(machine, &mut r);
    validate_cas(machine, root.get("cluster"), machine_type, &mut r);
    if control_plane && let Some(cluster) = root.get("cluster") {
        validate_cni(cluster, &mut r);
        validate_control_plane_secrets(cluster, &mut r);
    }
    validate_network(machine, machine_type, &mut r);
    validate_disks(machine, &mut r);
    validate_kubelet(machine, &mut r);
    validate_disk_encryption(machine, &mut r);
    validate_kubespan(machine, root.get("cluster"), &mut r);
    validate_logging(machine, &mut r);
    validate_extensions(machine, &mut r);
    validate_node_metadata(machine, &mut r);
    validate_features(machine, control_plane, &mut r);
    validate_registries(machine, &mut r);
    if let Some(persist) = root.get("persist")
        && persist.as_bool() == Some(false)
    {
        r.invalid(".persist", persist.line, ".persist should be enabled");
    }
    validate_kubernetes_versions(
        machine,
        root.get("cluster"),
        control_plane,
        contract,
        &mut r,
    );
    machine_type
}

fn machine_type(
    machine: &Node,
    r: &mut Report<'_>,
    warnings: &mut Vec<String>,
) -> Option<MachineType> {
    let node = machine.get("type");
    let value = text(node);
    let line = node.map_or(machine.line, |n| n.line);
    match value {
        "init" => Some(MachineType::Init),
        "controlplane" => Some(MachineType::ControlPlane),
        "worker" => Some(MachineType::Worker),
        "join" => {
            warnings.push(r#"use "worker" instead of "join" for machine type"#.to_owned());
            Some(MachineType::Worker)
        }
        other => {
            r.invalid(
                ".machine.type",
                line,
                format!("unknown machine type {other:?}"),
            );
            None
        }
    }
}

/// `ClusterConfig.Validate`.
fn validate_cluster(cluster: &Node, control_plane: bool, r: &mut Report<'_>) {
    match cluster.at(&["controlPlane", "endpoint"]) {
        None => r.missing(
            ".cluster.controlPlane.endpoint",
            cluster.get("controlPlane").map_or(cluster.line, |n| n.line),
            "cluster controlplane endpoint is required",
        ),
        Some(endpoint) => {
            if let Err(e) = validate_endpoint_uri(text(Some(endpoint))) {
                r.invalid(
                    ".cluster.controlPlane.endpoint",
                    endpoint.line,
                    format!("invalid controlplane endpoint: {e}"),
                );
            }
        }
    }
    if let Some(domain) = cluster.at(&["network", "dnsDomain"])
        && !text(Some(domain)).is_empty()
        && !is_valid_dns_name(text(Some(domain)))
    {
        r.invalid(
            ".cluster.network.dnsDomain",
            domain.line,
            format!("{:?} is not a valid DNS name", text(Some(domain))),
        );
    }
    for field in ["podSubnets", "serviceSubnets"] {
        if let Some(list) = cluster.at(&["network", field]) {
            for (i, item) in list.items().iter().enumerate() {
                if let Err(e) = parse_cidr(text(Some(item))) {
                    r.invalid(
                        &format!(".cluster.network.{field}[{i}]"),
                        item.line,
                        format!("{e} (fails at runtime in Talos)"),
                    );
                }
            }
        }
    }
    validate_external_cloud_provider(cluster, r);
    if let Some(etcd) = cluster.get("etcd") {
        if control_plane {
            validate_etcd(etcd, r);
        } else {
            r.invalid(
                ".cluster.etcd",
                etcd.line,
                "etcd config is only allowed on control plane machines",
            );
        }
    }
    if !control_plane
        && let Some(key) = cluster.at(&["ca", "key"])
        && !text(Some(key)).is_empty()
    {
        r.invalid(
            ".cluster.ca.key",
            key.line,
            "issuing Kubernetes API CA key is not allowed on non-controlplane nodes (.cluster.ca)",
        );
    }
    validate_inline_manifests(cluster, r);
    validate_discovery(cluster, r);
    validate_authorizers(cluster, r);
}

fn validate_external_cloud_provider(cluster: &Node, r: &mut Report<'_>) {
    if let Some(ecp) = cluster.get("externalCloudProvider") {
        let manifests = ecp.get("manifests").map(Node::items).unwrap_or_default();
        if !flag(ecp.get("enabled")) && !manifests.is_empty() {
            r.invalid(
                ".cluster.externalCloudProvider",
                ecp.line,
                "external cloud provider is disabled, but manifests are provided",
            );
        }
        for (i, m) in manifests.iter().enumerate() {
            if let Err(e) = validate_endpoint_uri(text(Some(m))) {
                r.invalid(
                    &format!(".cluster.externalCloudProvider.manifests[{i}]"),
                    m.line,
                    format!("invalid external cloud provider manifest url: {e}"),
                );
            }
        }
    }
}

fn validate_inline_manifests(cluster: &Node, r: &mut Report<'_>) {
    let mut names: Vec<&str> = Vec::new();
    if let Some(manifests) = cluster.get("inlineManifests") {
        for (i, m) in manifests.items().iter().enumerate() {
            let name = text(m.get("name"));
            let path = format!(".cluster.inlineManifests[{i}].name");
            if name.trim().is_empty() {
                r.invalid(&path, m.line, "inline manifest name can't be empty");
            }
            if names.contains(&name) {
                r.invalid(
                    &path,
                    m.line,
                    format!("inline manifest name {name:?} is duplicate"),
                );
            }
            names.push(name);
        }
    }
}

fn validate_discovery(cluster: &Node, r: &mut Report<'_>) {
    if let Some(discovery) = cluster.get("discovery")
        && flag(discovery.get("enabled"))
    {
        let service = discovery.at(&["registries", "service"]);
        if !flag(service.and_then(|s| s.get("disabled"))) {
            let endpoint = text(service.and_then(|s| s.get("endpoint")));
            let endpoint = if endpoint.is_empty() {
                DEFAULT_DISCOVERY_ENDPOINT
            } else {
                endpoint
            };
            match parse_url(endpoint) {
                Ok(url) if url.scheme.is_empty() && !endpoint.starts_with('/') => r.invalid(
                    ".cluster.discovery.registries.service.endpoint",
                    discovery.line,
                    "cluster discovery service registry endpoint is invalid: invalid URI for request",
                ),
                Ok(url) if !url.path.is_empty() && url.path != "/" => r.invalid(
                    ".cluster.discovery.registries.service.endpoint",
                    discovery.line,
                    "cluster discovery service path should be empty",
                ),
                Ok(_) => {}
                Err(e) => r.invalid(
                    ".cluster.discovery.registries.service.endpoint",
                    discovery.line,
                    format!("cluster discovery service registry endpoint is invalid: {e}"),
                ),
            }
            if text(cluster.get("id")).is_empty() {
                r.missing(
                    ".cluster.id",
                    discovery.line,
                    "cluster discovery service requires .cluster.id",
                );
            }
            if text(cluster.get("secret")).is_empty() {
                r.missing(
                    ".cluster.secret",
                    discovery.line,
                    "cluster discovery service requires .cluster.secret",
                );
            }
        }
    }
}

fn validate_authorizers(cluster: &Node, r: &mut Report<'_>) {
    if let Some(authorizers) = cluster.at(&["apiServer", "authorizationConfig"]) {
        for (i, a) in authorizers.items().iter().enumerate() {
            let kind = text(a.get("type"));
            if !matches!(kind, "Node" | "RBAC" | "Webhook") {
                r.invalid(
                    &format!(".cluster.apiServer.authorizationConfig[{i}].type"),
                    a.line,
                    format!("authorizer type {kind:?} is not one of Node, RBAC, Webhook"),
                );
            }
        }
    }
}

/// `EtcdConfig.Validate`.
fn validate_etcd(etcd: &Node, r: &mut Report<'_>) {
    if etcd.get("ca").is_none() {
        r.missing(
            ".cluster.etcd.ca",
            etcd.line,
            "key/cert combination should not be empty",
        );
    }
    let advertised = etcd
        .get("advertisedSubnets")
        .map(Node::items)
        .unwrap_or_default();
    if !text(etcd.get("subnet")).is_empty() && !advertised.is_empty() {
        r.invalid(
            ".cluster.etcd.subnet",
            etcd.line,
            "etcd subnet can't be set when advertised subnets are set",
        );
    }
    for (field, what) in [
        ("advertisedSubnets", "advertised"),
        ("listenSubnets", "listen"),
    ] {
        for (i, s) in etcd
            .get(field)
            .map(Node::items)
            .unwrap_or_default()
            .iter()
            .enumerate()
        {
            let cidr = text(Some(s));
            if !is_subnet_or_address(cidr.strip_prefix('!').unwrap_or(cidr)) {
                r.invalid(
                    &format!(".cluster.etcd.{field}[{i}]"),
                    s.line,
                    format!("etcd {what} subnet is not valid: {cidr:?}"),
                );
            }
        }
    }
}

/// Install section, `metal` mode.
fn validate_install(machine: &Node, r: &mut Report<'_>) {
    let Some(install) = machine.get("install") else {
        r.missing(
            ".machine.install",
            machine.line,
            r#"install instructions are required in "metal" mode"#,
        );
        return;
    };
    let selector = install.get("diskSelector");
    if let Some(kind) = selector.and_then(|s| s.get("type")) {
        let t = text(Some(kind));
        if !t.is_empty() && !matches!(t, "ssd" | "hdd" | "nvme" | "sd") {
            r.invalid(
                ".machine.install.diskSelector.type",
                kind.line,
                format!("install disk selector is invalid: unsupported disk type {t:?}"),
            );
        }
    }
    let has_selector = install
        .entries()
        .iter()
        .any(|(k, v)| k.text() == Some("diskSelector") && !v.is_null());
    if text(install.get("disk")).is_empty() && !has_selector {
        r.missing(
            ".machine.install.disk",
            install.line,
            "either install disk or diskSelector should be defined",
        );
    }
    let extra_args = install
        .get("extraKernelArgs")
        .map(Node::items)
        .unwrap_or_default();
    if !extra_args.is_empty() && flag(install.get("grubUseUKICmdline")) {
        r.invalid(
            ".machine.install.extraKernelArgs",
            install.line,
            "install.extraKernelArgs and install.grubUseUKICmdline can't be used together",
        );
    }
}

fn validate_host_dns(machine: &Node, r: &mut Report<'_>) {
    if let Some(host_dns) = machine.at(&["features", "hostDNS"])
        && flag(host_dns.get("forwardKubeDNSToHost"))
        && !flag(host_dns.get("enabled"))
    {
        r.invalid(
            ".machine.features.hostDNS.forwardKubeDNSToHost",
            host_dns.line,
            "feature hostDNS.forwardKubeDNSToHost requires hostDNS.enabled to be true (.machine.features.hostDNS)",
        );
    }
}

/// The machine and cluster CAs for the machine type.
fn validate_cas(
    machine: &Node,
    cluster: Option<&Node>,
    machine_type: Option<MachineType>,
    r: &mut Report<'_>,
) {
    let ca = machine.get("ca");
    let crt = text(ca.and_then(|c| c.get("crt")));
    let key = text(ca.and_then(|c| c.get("key")));
    let accepted = machine
        .get("acceptedCAs")
        .map(Node::items)
        .unwrap_or_default();
    let line = ca.map_or(machine.line, |c| c.line);
    if ca.is_none() && accepted.is_empty() {
        r.missing(
            ".machine.ca",
            line,
            "issuing CA or some accepted CAs are required (.machine.ca, machine.acceptedCAs)",
        );
    }
    match machine_type {
        Some(MachineType::Init | MachineType::ControlPlane) => {
            if ca.is_none() {
                r.missing(".machine.ca", line, "issuing CA is required (.machine.ca)");
            } else if key.is_empty() {
                r.missing(
                    ".machine.ca.key",
                    line,
                    "issuing CA key is required for controlplane nodes (.machine.ca.key)",
                );
            }
        }
        Some(MachineType::Worker) if ca.is_some() => {
            if !key.is_empty() {
                r.invalid(
                    ".machine.ca.key",
                    line,
                    "issuing Talos API CA key is not allowed on non-controlplane nodes (.machine.ca)",
                );
            }
            if crt.is_empty() && accepted.is_empty() {
                r.missing(
                    ".machine.ca.crt",
                    line,
                    "trusted CA certificates are required on non-controlplane nodes (.machine.ca.crt, .machine.acceptedCAs)",
                );
            }
        }
        Some(MachineType::Worker) | None => {}
    }
    let cluster_ca = cluster.and_then(|c| c.get("ca"));
    if machine_type.is_some()
        && text(cluster_ca.and_then(|c| c.get("crt"))).is_empty()
        && cluster
            .and_then(|c| c.get("acceptedCAs"))
            .is_none_or(|a| a.items().is_empty())
    {
        r.missing(
            ".cluster.ca.crt",
            cluster_ca.or(cluster).map_or(machine.line, |n| n.line),
            "Kubernetes CA certificate is required (.cluster.ca.crt) (fails at runtime in Talos)",
        );
    }
}

/// Secrets a control plane needs to start etcd and the API server. Talos' `Validate` does
/// not check them, but a control plane without them never comes up; refused up front.
fn validate_control_plane_secrets(cluster: &Node, r: &mut Report<'_>) {
    for (path, keys, what) in [
        (".cluster.ca.key", ["ca", "key"], "Kubernetes CA key"),
        (
            ".cluster.serviceAccount.key",
            ["serviceAccount", "key"],
            "service account key",
        ),
        (
            ".cluster.aggregatorCA.key",
            ["aggregatorCA", "key"],
            "aggregator CA key",
        ),
    ] {
        if text(cluster.at(&keys)).is_empty() {
            r.missing(
                path,
                cluster.line,
                format!("{what} is required on control plane nodes (fails at runtime in Talos)"),
            );
        }
    }
    match cluster.get("etcd") {
        None => r.missing(
            ".cluster.etcd",
            cluster.line,
            "etcd CA certificate and key are required on control plane nodes (fails at runtime in Talos)",
        ),
        Some(etcd) => {
            if let Some(ca) = etcd.get("ca")
                && (text(ca.get("crt")).is_empty() || text(ca.get("key")).is_empty())
            {
                r.missing(
                    ".cluster.etcd.ca",
                    ca.line,
                    "etcd CA certificate and key are required on control plane nodes (fails at runtime in Talos)",
                );
            }
        }
    }
    if text(cluster.get("secretboxEncryptionSecret")).is_empty()
        && text(cluster.get("aescbcEncryptionSecret")).is_empty()
    {
        r.missing(
            ".cluster.secretboxEncryptionSecret",
            cluster.line,
            "etcd encryption config is required for control plane machines",
        );
    }
}

/// `ValidateCNI` (control planes only).
fn validate_cni(cluster: &Node, r: &mut Report<'_>) {
    let Some(cni) = cluster.at(&["network", "cni"]) else {
        return; // no CNI section: flannel
    };
    let name = text(cni.get("name"));
    let urls = cni.get("urls").map(Node::items).unwrap_or_default();
    let flannel_args = cni
        .at(&["flannel", "extraArgs"])
        .map(Node::items)
        .unwrap_or_default();
    let policies = flag(cni.at(&["flannel", "kubeNetworkPoliciesEnabled"]));
    let path = ".cluster.network.cni";
    match name {
        "flannel" | "none" => {
            if !urls.is_empty() {
                r.invalid(
                    &format!("{path}.urls"),
                    cni.line,
                    format!("\"urls\" field should be empty for {name:?} CNI"),
                );
            }
        }
        "custom" => {
            for (i, u) in urls.iter().enumerate() {
                if let Err(e) = validate_endpoint_uri(text(Some(u))) {
                    r.invalid(&format!("{path}.urls[{i}]"), u.line, e);
                }
            }
        }
        _ => {
            r.invalid(
                &format!("{path}.name"),
                cni.get("name").map_or(cni.line, |n| n.line),
                r#"cni name should be one of ["flannel", "custom", "none"]"#,
            );
            return;
        }
    }
    if name != "flannel" {
        if !flannel_args.is_empty() {
            r.invalid(
                &format!("{path}.flannel.extraArgs"),
                cni.line,
                format!("\"flanneldExtraArgs\" field should be empty for {name:?} CNI"),
            );
        }
        if policies {
            r.invalid(
                &format!("{path}.flannel.kubeNetworkPoliciesEnabled"),
                cni.line,
                format!(
                    "\"flannelKubeNetworkPoliciesEnabled\" should not be enabled for {name:?} CNI"
                ),
            );
        }
    }
}

/// `machine.network`: interfaces (addressing, routes, bonds, VIPs), as Talos' device checks.
fn validate_network(machine: &Node, machine_type: Option<MachineType>, r: &mut Report<'_>) {
    let Some(devices) = machine.at(&["network", "interfaces"]) else {
        return;
    };
    let mut secondary: Vec<(String, String)> = Vec::new();
    for device in devices.items() {
        let name = text(device.get("interface")).to_owned();
        let members = device
            .at(&["bond", "interfaces"])
            .or_else(|| device.at(&["bridge", "interfaces"]))
            .map(Node::strings)
            .unwrap_or_default();
        for member in members {
            if let Some((_, other)) = secondary.iter().find(|(m, o)| m == member && *o != name) {
                r.invalid(
                    ".machine.network.interfaces",
                    device.line,
                    format!(
                        "interface {member:?} is declared as part of two separate links: {other:?} and {name:?}"
                    ),
                );
            }
            secondary.push((member.to_owned(), name.clone()));
        }
    }
    for (i, device) in devices.items().iter().enumerate() {
        validate_device(device, i, &secondary, machine_type, r);
    }
}

/// One `machine.network.interfaces` entry.
fn validate_device(
    device: &Node,
    i: usize,
    secondary: &[(String, String)],
    machine_type: Option<MachineType>,
    r: &mut Report<'_>,
) {
    let path = format!(".machine.network.interfaces[{i}]");
    let name = text(device.get("interface"));
    if flag(device.get("ignore")) {
        return;
    }
    if device.get("bond").is_some() && device.get("bridge").is_some() {
        r.invalid(
            &path,
            device.line,
            format!("interface has both bridge and bond sections set {name:?}: config sections are mutually exclusive"),
        );
    }
    let selector = device.get("deviceSelector");
    match (name.is_empty(), selector.is_some()) {
        (true, false) => r.missing(
            &path,
            device.line,
            "[networking.os.device.interface], [networking.os.device.deviceSelector]: required either config section to be set",
        ),
        (false, true) => r.invalid(
            &path,
            device.line,
            "[networking.os.device.interface], [networking.os.device.deviceSelector]: config sections are mutually exclusive",
        ),
        _ => {}
    }
    if selector.is_some_and(|s| s.entries().is_empty()) {
        r.invalid(
            &format!("{path}.deviceSelector"),
            device.line,
            "[networking.os.device.deviceSelector]: config section should contain at least one field",
        );
    }
    let paired = secondary.iter().any(|(m, _)| m == name);
    let addresses = device.get("addresses").map(Node::items).unwrap_or_default();
    let cidr = text(device.get("cidr"));
    if paired
        && (flag(device.get("dhcp"))
            || !cidr.is_empty()
            || !addresses.is_empty()
            || device.get("vip").is_some())
    {
        r.invalid(
            &path,
            device.line,
            format!("[networking.os.device] {name:?}: bonded/bridged interface shouldn't have any addressing methods configured"),
        );
    }
    if !addresses.is_empty() && !cidr.is_empty() {
        r.invalid(
            &path,
            device.line,
            format!("[networking.os.device] {name:?}: interface can't have both .cidr and .addresses set"),
        );
    }
    for (j, a) in addresses.iter().chain(device.get("cidr")).enumerate() {
        if let Err(e) = validate_ip_or_cidr(text(Some(a))) {
            r.invalid(&format!("{path}.addresses[{j}]"), a.line, e);
        }
    }
    if let Some(vip) = device.get("vip") {
        if text(vip.get("ip")).parse::<std::net::IpAddr>().is_err() {
            r.invalid(
                &format!("{path}.vip.ip"),
                vip.line,
                "[networking.os.device.vip] failed to parse the IP address",
            );
        }
        if machine_type == Some(MachineType::Worker) {
            r.invalid(
                &format!("{path}.vip"),
                vip.line,
                "virtual (shared) IP is not allowed on non-controlplane nodes",
            );
        }
    }
    validate_routes(device, &path, r);
    for (j, vlan) in device
        .get("vlans")
        .map(Node::items)
        .unwrap_or_default()
        .iter()
        .enumerate()
    {
        if vlan.get("vip").is_some() && machine_type == Some(MachineType::Worker) {
            r.invalid(
                &format!("{path}.vlans[{j}].vip"),
                vlan.line,
                "virtual (shared) IP is not allowed on non-controlplane nodes",
            );
        }
        for a in vlan.get("addresses").map(Node::items).unwrap_or_default() {
            if let Err(e) = validate_ip_or_cidr(text(Some(a))) {
                r.invalid(&format!("{path}.vlans[{j}].addresses"), a.line, e);
            }
        }
    }
    if let Some(bond) = device.get("bond") {
        validate_bond(bond, &format!("{path}.bond"), r);
    }
}

/// `CheckDeviceRoutes`.
fn validate_routes(device: &Node, path: &str, r: &mut Report<'_>) {
    for (j, route) in device
        .get("routes")
        .map(Node::items)
        .unwrap_or_default()
        .iter()
        .enumerate()
    {
        let rpath = format!("{path}.routes[{j}]");
        let network = text(route.get("network"));
        let gateway = text(route.get("gateway"));
        if !network.is_empty() && parse_cidr(network).is_err() {
            r.invalid(
                &format!("{rpath}.network"),
                route.line,
                "invalid network address",
            );
        }
        if !gateway.is_empty() && gateway.parse::<std::net::IpAddr>().is_err() {
            r.invalid(
                &format!("{rpath}.gateway"),
                route.line,
                "invalid network address",
            );
        }
        if network.is_empty() && gateway.is_empty() {
            r.missing(
                &rpath,
                route.line,
                "either network or gateway should be set",
            );
        }
        let source = text(route.get("source"));
        if !source.is_empty() && source.parse::<std::net::IpAddr>().is_err() {
            r.invalid(
                &format!("{rpath}.source"),
                route.line,
                "invalid network address",
            );
        }
    }
}

/// The simplest of `checkBond`'s rules: a known mode, delays against `miimon`.
fn validate_bond(bond: &Node, path: &str, r: &mut Report<'_>) {
    let mode = text(bond.get("mode"));
    if !matches!(
        mode,
        "" | "balance-rr"
            | "active-backup"
            | "balance-xor"
            | "broadcast"
            | "802.3ad"
            | "balance-tlb"
            | "balance-alb"
    ) {
        r.invalid(
            &format!("{path}.mode"),
            bond.line,
            format!("invalid bond mode {mode:?}"),
        );
    }
    if !bond
        .get("interfaces")
        .map(Node::items)
        .unwrap_or_default()
        .is_empty()
        && !bond
            .get("deviceSelectors")
            .map(Node::items)
            .unwrap_or_default()
            .is_empty()
    {
        r.invalid(
            path,
            bond.line,
            "bond has both interfaces and selectors set: config sections are mutually exclusive",
        );
    }
    let miimon = bond.get("miimon").and_then(Node::as_int).unwrap_or(0);
    for field in ["updelay", "downdelay"] {
        let delay = bond.get(field).and_then(Node::as_int).unwrap_or(0);
        if miimon == 0 && delay != 0 {
            r.invalid(
                &format!("{path}.{field}"),
                bond.line,
                format!("bond.{field} can't be set if miiMon is zero"),
            );
        } else if miimon != 0 && delay % miimon != 0 {
            r.invalid(
                &format!("{path}.{field}"),
                bond.line,
                format!("bond.{field} should be a multiple of miiMon"),
            );
        }
    }
    if !bond
        .get("arpIPTarget")
        .map(Node::items)
        .unwrap_or_default()
        .is_empty()
    {
        r.invalid(
            &format!("{path}.arpIPTarget"),
            bond.line,
            "bond.arpIPTarget is not supported",
        );
    }
    if !text(bond.get("lacpRate")).is_empty() && mode != "802.3ad" {
        r.invalid(
            &format!("{path}.lacpRate"),
            bond.line,
            "bond.lacpRate is only available in 802.3ad mode",
        );
    }
}

fn validate_disks(machine: &Node, r: &mut Report<'_>) {
    for (i, disk) in machine
        .get("disks")
        .map(Node::items)
        .unwrap_or_default()
        .iter()
        .enumerate()
    {
        let partitions = disk.get("partitions").map(Node::items).unwrap_or_default();
        for (j, p) in partitions.iter().enumerate() {
            let size = p.get("size");
            let full = size.is_none_or(|s| s.as_int() == Some(0));
            if full && j + 1 != partitions.len() {
                r.invalid(
                    &format!(".machine.disks[{i}].partitions[{j}].size"),
                    p.line,
                    format!(
                        "partition for disk {:?} is set to occupy full disk, but it's not the last partition in the list",
                        text(disk.get("device"))
                    ),
                );
            }
        }
    }
}

fn validate_kubelet(machine: &Node, r: &mut Report<'_>) {
    let subnets = machine
        .at(&["kubelet", "nodeIP", "validSubnets"])
        .map(Node::items)
        .unwrap_or_default();
    for (i, s) in subnets.iter().enumerate() {
        let cidr = text(Some(s));
        if !is_subnet_or_address(cidr.strip_prefix('!').unwrap_or(cidr)) {
            r.invalid(
                &format!(".machine.kubelet.nodeIP.validSubnets[{i}]"),
                s.line,
                format!("kubelet nodeIP subnet is not valid: {cidr:?}"),
            );
        }
    }
}

fn validate_disk_encryption(machine: &Node, r: &mut Report<'_>) {
    for label in ["ephemeral", "state"] {
        let Some(config) = machine.at(&["systemDiskEncryption", label]) else {
            continue;
        };
        let path = format!(".machine.systemDiskEncryption.{label}");
        let partition = label.to_ascii_uppercase();
        let keys = config.get("keys").map(Node::items).unwrap_or_default();
        if keys.is_empty() {
            r.missing(
                &format!("{path}.keys"),
                config.line,
                format!("partition {partition:?}: no encryption keys provided"),
            );
        }
        let mut slots = Vec::new();
        for (i, key) in keys.iter().enumerate() {
            let slot = key.get("slot").and_then(Node::as_int).unwrap_or(0);
            if slots.contains(&slot) {
                r.invalid(
                    &format!("{path}.keys[{i}].slot"),
                    key.line,
                    format!(
                        "partition {partition:?}: encryption key slot {slot} is already in use"
                    ),
                );
            }
            slots.push(slot);
            if !["static", "nodeID", "kms", "tpm"]
                .iter()
                .any(|k| key.has_key(k))
            {
                r.invalid(
                    &format!("{path}.keys[{i}]"),
                    key.line,
                    format!("partition {partition:?}: encryption key at slot {slot} doesn't have the configuration parameters"),
                );
            }
        }
    }
}

fn validate_kubespan(machine: &Node, cluster: Option<&Node>, r: &mut Report<'_>) {
    let Some(kubespan) = machine.at(&["network", "kubespan"]) else {
        return;
    };
    if !flag(kubespan.get("enabled")) {
        return;
    }
    if let Some(mtu) = kubespan.get("mtu").and_then(Node::as_int)
        && mtu < KUBESPAN_MIN_MTU
    {
        r.invalid(
            ".machine.network.kubespan.mtu",
            kubespan.line,
            format!("kubespan link MTU must be at least {KUBESPAN_MIN_MTU}"),
        );
    }
    if !flag(cluster.and_then(|c| c.at(&["discovery", "enabled"]))) {
        r.invalid(
            ".cluster.discovery.enabled",
            kubespan.line,
            ".cluster.discovery should be enabled when .machine.network.kubespan is enabled",
        );
    }
    for (i, e) in kubespan
        .at(&["filters", "endpoints"])
        .map(Node::items)
        .unwrap_or_default()
        .iter()
        .enumerate()
    {
        let cidr = text(Some(e));
        if !is_subnet_or_address(cidr.strip_prefix('!').unwrap_or(cidr)) {
            r.invalid(
                &format!(".machine.network.kubespan.filters.endpoints[{i}]"),
                e.line,
                format!("KubeSpan endpoint filter is not valid: {cidr:?}"),
            );
        }
    }
}

fn validate_logging(machine: &Node, r: &mut Report<'_>) {
    let destinations = machine
        .at(&["logging", "destinations"])
        .map(Node::items)
        .unwrap_or_default();
    for (i, d) in destinations.iter().enumerate() {
        let path = format!(".machine.logging.destinations[{i}]");
        match parse_url(text(d.get("endpoint"))) {
            Ok(url) if matches!(url.scheme.as_str(), "tcp" | "udp") && !url.hostname.is_empty() => {
            }
            Ok(_) => r.invalid(
                &format!("{path}.endpoint"),
                d.line,
                "unsupported scheme: the endpoint must be tcp:// or udp://",
            ),
            Err(e) => r.invalid(&format!("{path}.endpoint"), d.line, e),
        }
        if text(d.get("format")) != "json_lines" {
            r.invalid(
                &format!("{path}.format"),
                d.line,
                "unknown format: only json_lines is supported",
            );
        }
    }
}

fn validate_extensions(machine: &Node, r: &mut Report<'_>) {
    let mut seen: Vec<&str> = Vec::new();
    for e in machine
        .at(&["install", "extensions"])
        .map(Node::items)
        .unwrap_or_default()
    {
        let image = text(e.get("image"));
        if seen.contains(&image) {
            r.invalid(
                ".machine.install.extensions",
                e.line,
                format!("duplicate system extension {image:?}"),
            );
        }
        seen.push(image);
    }
}

fn validate_node_metadata(machine: &Node, r: &mut Report<'_>) {
    for (field, what) in [
        ("nodeLabels", "labels"),
        ("nodeAnnotations", "annotations"),
        ("nodeTaints", "taints"),
    ] {
        for (key, value) in machine.get(field).map(Node::entries).unwrap_or_default() {
            let k = text(Some(key));
            let v = value.text().unwrap_or_default();
            let result = validate_qualified_name(k).and_then(|()| match field {
                "nodeLabels" => validate_label_value(v),
                "nodeTaints" => validate_taint(v),
                _ => Ok(()),
            });
            if let Err(e) = result {
                r.invalid(
                    &format!(".machine.{field}.{k}"),
                    key.line,
                    format!("invalid machine node {what}: {e}"),
                );
            }
        }
    }
}

fn validate_features(machine: &Node, control_plane: bool, r: &mut Report<'_>) {
    let Some(features) = machine.get("features") else {
        return;
    };
    if let Some(access) = features.get("kubernetesTalosAPIAccess") {
        if !control_plane {
            r.invalid(
                ".machine.features.kubernetesTalosAPIAccess",
                access.line,
                "feature Kubernetes Talos API Access can only be enabled on control plane machines",
            );
        }
        for role in access
            .get("allowedRoles")
            .map(Node::strings)
            .unwrap_or_default()
        {
            if !TALOS_ROLES.contains(&role) {
                r.invalid(
                    ".machine.features.kubernetesTalosAPIAccess.allowedRoles",
                    access.line,
                    format!(
                        "invalid role {role:?} in allowed roles for Kubernetes Talos API Access"
                    ),
                );
            }
        }
    }
    if let Some(algorithm) = features.get("nodeAddressSortAlgorithm")
        && !matches!(text(Some(algorithm)), "" | "v1" | "v2")
    {
        r.invalid(
            ".machine.features.nodeAddressSortAlgorithm",
            algorithm.line,
            "invalid node address sort algorithm: must be v1 or v2",
        );
    }
    if let Some(port) = features.at(&["kubePrism", "port"]).and_then(Node::as_int)
        && flag(features.at(&["kubePrism", "enabled"]))
        && !(1..=65535).contains(&port)
    {
        r.invalid(
            ".machine.features.kubePrism.port",
            machine.line,
            "KubePrism port must be between 1 and 65535",
        );
    }
}

fn validate_registries(machine: &Node, r: &mut Report<'_>) {
    for field in ["config", "mirrors"] {
        let Some(map) = machine.at(&["registries", field]) else {
            continue;
        };
        for (key, value) in map.entries() {
            if value.is_null() {
                let k = text(Some(key));
                r.invalid(
                    &format!(".machine.registries.{field}.{k}"),
                    key.line,
                    format!("registries.{field}[{k:?}] is null"),
                );
            }
        }
    }
}

/// `ValidateKubernetesVersions`: the kubelet's (and a control plane's component) image tags
/// must be a Kubernetes version this Talos line supports.
fn validate_kubernetes_versions(
    machine: &Node,
    cluster: Option<&Node>,
    control_plane: bool,
    contract: Contract,
    r: &mut Report<'_>,
) {
    let mut images: Vec<(&str, &str, &Node)> = Vec::new();
    if let Some(image) = machine.at(&["kubelet", "image"]) {
        images.push(("kubelet", ".machine.kubelet.image", image));
    }
    if control_plane && let Some(cluster) = cluster {
        for (name, section) in [
            ("kube-apiserver", ".cluster.apiServer.image"),
            (
                "kube-controller-manager",
                ".cluster.controllerManager.image",
            ),
            ("kube-scheduler", ".cluster.scheduler.image"),
        ] {
            let key = section.split('.').nth(2).unwrap_or_default();
            if let Some(image) = cluster.at(&[key, "image"]) {
                images.push((name, section, image));
            }
        }
    }
    let (min, max) = contract.kubernetes_versions();
    for (name, path, node) in images {
        let image = text(Some(node));
        let problem = match kubernetes_version_of_image(image) {
            Err(e) => Some(format!(
                "failed to parse Kubernetes version from image reference: {e}"
            )),
            Ok(v) if v < min => Some(format!(
                "version of Kubernetes {}.{}.{} is too old to be used with Talos {}",
                v.0,
                v.1,
                v.2,
                contract.label()
            )),
            Ok(v) if v > max => Some(format!(
                "version of Kubernetes {}.{}.{} is too new to be used with Talos {}",
                v.0,
                v.1,
                v.2,
                contract.label()
            )),
            Ok(_) => None,
        };
        if let Some(problem) = problem {
            r.invalid(
                path,
                node.line,
                format!("{name} image is not valid: {problem}"),
            );
        }
    }
}
