//! The typed documents' own `Validate` methods and their conflicts with the `v1alpha1`
//! document (`V1Alpha1ConflictValidate`), re-stated from Talos.

use std::net::IpAddr;

use crate::checks::{parse_go_duration, parse_url};
use crate::decode::Decoded;
use crate::v1alpha1::Report;
use crate::yaml::Node;
use crate::{Problem, ProblemKind};

fn text(node: Option<&Node>) -> &str {
    node.and_then(Node::text).unwrap_or_default()
}

fn flag(node: Option<&Node>) -> bool {
    node.and_then(Node::as_bool).unwrap_or(false)
}

/// Validates one typed document (its kind was decoded, so it is one of the modeled kinds).
pub(crate) fn validate(doc: &Decoded, legacy: Option<&Decoded>, problems: &mut Vec<Problem>) {
    let Some(kind) = doc.kind else { return };
    let mut r = Report {
        doc: &doc.id,
        problems,
    };
    let root = &doc.root;
    let v1 = legacy.map(|l| &l.root);
    if kind.named && text(root.get("name")).is_empty() {
        r.missing(".name", root.line, "name must be specified");
    }
    match kind.name {
        "HostnameConfig" => hostname(root, v1, &mut r),
        "ResolverConfig" => resolver(root, v1, &mut r),
        "TimeSyncConfig" => time_sync(root, v1, &mut r),
        "StaticHostConfig" => {
            let name = text(root.get("name"));
            if !name.is_empty() && name.parse::<IpAddr>().is_err() {
                r.invalid(".name", root.line, "name must be a valid IP address");
            }
            if root.get("hostnames").is_none_or(|h| h.items().is_empty()) {
                r.missing(".hostnames", root.line, "at least one hostname is required");
            }
        }
        "Layer2VIPConfig" => {
            let name = text(root.get("name"));
            if !name.is_empty() && name.parse::<IpAddr>().is_err() {
                r.invalid(".name", root.line, "name must be a valid IP address");
            }
            if text(root.get("link")).is_empty() {
                r.missing(".link", root.line, "link must be specified");
            }
        }
        "RegistryMirrorConfig" => {
            for (i, endpoint) in root
                .get("endpoints")
                .map(Node::items)
                .unwrap_or_default()
                .iter()
                .enumerate()
            {
                let url = text(endpoint.get("url"));
                let path = format!(".endpoints[{i}].url");
                if url.is_empty() {
                    r.missing(
                        &path,
                        endpoint.line,
                        format!("endpoints[{i}].url must be specified"),
                    );
                    continue;
                }
                match parse_url(url) {
                    Ok(u) if matches!(u.scheme.as_str(), "http" | "https") => {}
                    Ok(u) => r.invalid(
                        &path,
                        endpoint.line,
                        format!("endpoints[{i}].url has unsupported scheme: {:?}", u.scheme),
                    ),
                    Err(e) => r.invalid(&path, endpoint.line, e),
                }
            }
        }
        "KmsgLogConfig" => {
            let url = text(root.get("url"));
            let line = root.get("url").map_or(root.line, |n| n.line);
            if url.is_empty() {
                r.missing(".url", line, "url is required");
            } else {
                match parse_url(url) {
                    Err(e) => r.invalid(".url", line, e),
                    Ok(u) if !matches!(u.scheme.as_str(), "tcp" | "udp") => {
                        r.invalid(".url", line, "url scheme must be tcp:// or udp://");
                    }
                    Ok(u) if !matches!(u.path.as_str(), "" | "/") => {
                        r.invalid(".url", line, "url path must be empty");
                    }
                    Ok(u) if u.port.is_empty() => r.invalid(".url", line, "url port is required"),
                    Ok(_) => {}
                }
            }
        }
        "EventSinkConfig" => {
            let endpoint = text(root.get("endpoint"));
            if endpoint.is_empty() {
                r.missing(".endpoint", root.line, "endpoint is required");
            } else if !is_host_port(endpoint) {
                r.invalid(".endpoint", root.line, "endpoint must be host:port");
            }
        }
        "WatchdogTimerConfig" if text(root.get("device")).is_empty() => {
            r.missing(".device", root.line, "watchdog device is required");
        }
        "ExtensionServiceConfig" => extension_service(root, &mut r),
        _ => {}
    }
}

/// Go's `net.SplitHostPort` succeeds (with a non-empty port).
fn is_host_port(s: &str) -> bool {
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        match rest.split_once("]:") {
            Some((h, p)) => (h, p),
            None => return false,
        }
    } else {
        match s.rsplit_once(':') {
            Some((h, p)) if !h.contains(':') => (h, p),
            _ => return false,
        }
    };
    !port.is_empty() && !host.contains(['[', ']'])
}

fn hostname(root: &Node, v1: Option<&Node>, r: &mut Report<'_>) {
    let auto = root.get("auto").and_then(Node::text);
    let name = text(root.get("hostname"));
    if auto.is_none() && name.is_empty() {
        r.missing("", root.line, "either 'auto' or 'hostname' must be set");
    }
    if auto.is_some_and(|a| a != "off") && !name.is_empty() {
        r.invalid(
            ".auto",
            root.line,
            "'auto' and 'hostname' cannot be set at the same time",
        );
    }
    if let Some(auto) = auto
        && !matches!(auto, "off" | "stable")
    {
        r.invalid(
            ".auto",
            root.line,
            format!("invalid value for 'auto': {auto}"),
        );
    }
    if !name.is_empty() {
        if name.len() > 253 {
            r.invalid(
                ".hostname",
                root.line,
                format!("fqdn is too long: {}", name.len()),
            );
        }
        let first = name.split('.').next().unwrap_or_default();
        if first.is_empty() || first.len() > 63 {
            r.invalid(
                ".hostname",
                root.line,
                format!("invalid hostname {first:?}"),
            );
        }
    }
    if let Some(v1) = v1 {
        if !text(v1.at(&["machine", "network", "hostname"])).is_empty() {
            r.add(
                ProblemKind::Conflict,
                "",
                root.line,
                "static hostname is already set in v1alpha1 config",
            );
        }
        if flag(v1.at(&["machine", "features", "stableHostname"])) {
            r.add(
                ProblemKind::Conflict,
                "",
                root.line,
                "stable hostname is already set in v1alpha1 config",
            );
        }
    }
}

fn resolver(root: &Node, v1: Option<&Node>, r: &mut Report<'_>) {
    for (i, ns) in root
        .get("nameservers")
        .map(Node::items)
        .unwrap_or_default()
        .iter()
        .enumerate()
    {
        if text(ns.get("address")).parse::<IpAddr>().is_err() {
            r.invalid(
                &format!(".nameservers[{i}].address"),
                ns.line,
                format!("nameserver address must be a valid IP: entry {i}"),
            );
        }
    }
    if let Some(network) = v1.and_then(|v| v.at(&["machine", "network"])) {
        for (key, message) in [
            (
                "searchDomains",
                ".machine.network.searchDomains is already set in v1alpha1 config",
            ),
            (
                "nameservers",
                ".machine.network.nameservers is already set in v1alpha1 config",
            ),
        ] {
            if network.get(key).is_some() {
                r.add(ProblemKind::Conflict, "", root.line, message);
            }
        }
        if flag(network.get("disableSearchDomain")) {
            r.add(
                ProblemKind::Conflict,
                "",
                root.line,
                ".machine.network.disableSearchDomain is already set in v1alpha1 config",
            );
        }
    }
}

fn time_sync(root: &Node, v1: Option<&Node>, r: &mut Report<'_>) {
    if let Some(timeout) = root.get("bootTimeout")
        && parse_go_duration(text(Some(timeout))).is_some_and(|d| d < 0)
    {
        r.invalid(
            ".bootTimeout",
            timeout.line,
            "bootTimeout cannot be negative",
        );
    }
    let ntp = root.get("ntp");
    let ptp = root.get("ptp");
    if ntp.is_some() && ptp.is_some() {
        r.invalid(
            "",
            root.line,
            "only one of ntp or ptp configuration can be specified",
        );
    }
    for server in ntp
        .and_then(|n| n.get("servers"))
        .map(Node::strings)
        .unwrap_or_default()
    {
        if server.starts_with("/dev/") {
            r.invalid(
                ".ntp.servers",
                root.line,
                format!("PTP devices should be specified in the ptp section, not as NTP servers: {server:?}"),
            );
        }
    }
    for device in ptp
        .and_then(|p| p.get("devices"))
        .map(Node::strings)
        .unwrap_or_default()
    {
        if !device.starts_with("/dev/ptp") {
            r.invalid(
                ".ptp.devices",
                root.line,
                format!("PTP device should be a path under /dev/ptp: {device:?}"),
            );
        }
    }
    if let Some(time) = v1.and_then(|v| v.at(&["machine", "time"])) {
        if flag(time.get("disabled")) {
            r.add(
                ProblemKind::Conflict,
                "",
                root.line,
                "time sync cannot be disabled in both v1alpha1 and new-style configuration",
            );
        }
        if !time
            .get("servers")
            .map(Node::items)
            .unwrap_or_default()
            .is_empty()
        {
            r.add(
                ProblemKind::Conflict,
                "",
                root.line,
                "time servers cannot be specified in both v1alpha1 and new-style configuration",
            );
        }
        if time
            .get("bootTimeout")
            .and_then(Node::text)
            .and_then(parse_go_duration)
            .is_some_and(|d| d != 0)
        {
            r.add(
                ProblemKind::Conflict,
                "",
                root.line,
                "boot timeout cannot be specified in both v1alpha1 and new-style configuration",
            );
        }
    }
}

fn extension_service(root: &Node, r: &mut Report<'_>) {
    let name = text(root.get("name"));
    let files = root.get("configFiles").map(Node::items).unwrap_or_default();
    let environment = root.get("environment").map(Node::items).unwrap_or_default();
    if name.is_empty() {
        return; // reported as a missing name
    }
    if files.is_empty() && environment.is_empty() {
        r.missing(
            "",
            root.line,
            format!("no config files found for extension {name:?}"),
        );
    }
    for (i, file) in files.iter().enumerate() {
        if text(file.get("content")).is_empty() {
            r.missing(
                &format!(".configFiles[{i}].content"),
                file.line,
                format!("extension content is required for extension {name:?}"),
            );
        }
        if text(file.get("mountPath")).is_empty() {
            r.missing(
                &format!(".configFiles[{i}].mountPath"),
                file.line,
                format!("extension mount path is required for extension {name:?}"),
            );
        }
    }
}
