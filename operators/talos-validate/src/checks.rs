//! Value checks Talos makes with Go's standard library and its helpers, re-stated: Go's
//! duration syntax, humanize byte sizes, `net/url` parsing, `siderolabs/net`'s endpoint and
//! subnet checks, Talos' DNS-name rule, Kubernetes label syntax and image-tag versions.

use std::net::IpAddr;

/// Go's `time.ParseDuration`: `[-+]?([0-9]*(\.[0-9]*)?(ns|us|µs|μs|ms|s|m|h))+` or `0`.
/// Returns the duration in nanoseconds.
pub(crate) fn parse_go_duration(s: &str) -> Option<i128> {
    let (negative, mut rest) = match s.as_bytes().first()? {
        b'-' => (true, &s[1..]),
        b'+' => (false, &s[1..]),
        _ => (false, s),
    };
    if rest == "0" {
        return Some(0);
    }
    if rest.is_empty() {
        return None;
    }
    let mut total: f64 = 0.0;
    while !rest.is_empty() {
        let number_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let number = &rest[..number_end];
        if number.is_empty() || number == "." || number.matches('.').count() > 1 {
            return None;
        }
        let value: f64 = number.parse().ok()?;
        rest = &rest[number_end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_end] {
            "ns" => 1.0,
            "us" | "µs" | "μs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            _ => return None,
        };
        rest = &rest[unit_end..];
        total += value * scale;
    }
    if total > 9.3e18 {
        return None;
    }
    #[allow(clippy::cast_possible_truncation, reason = "range checked above")]
    let nanos = total as i128;
    Some(if negative { -nanos } else { nanos })
}

/// `go-humanize`'s `ParseBytes`: `100MB`, `1 GiB`, `1,000`, `4096`.
pub(crate) fn parse_bytes(s: &str) -> Option<u64> {
    let digits_end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == ','))
        .unwrap_or(s.len());
    let number: String = s[..digits_end].chars().filter(|c| *c != ',').collect();
    let value: f64 = number.parse().ok()?;
    let unit = s[digits_end..].trim().to_ascii_lowercase();
    let scale: f64 = match unit.as_str() {
        "" | "b" => 1.0,
        "k" | "kb" => 1e3,
        "ki" | "kib" => 1024.0,
        "m" | "mb" => 1e6,
        "mi" | "mib" => 1024.0 * 1024.0,
        "g" | "gb" => 1e9,
        "gi" | "gib" => 1024.0_f64.powi(3),
        "t" | "tb" => 1e12,
        "ti" | "tib" => 1024.0_f64.powi(4),
        "p" | "pb" => 1e15,
        "pi" | "pib" => 1024.0_f64.powi(5),
        "e" | "eb" => 1e18,
        "ei" | "eib" => 1024.0_f64.powi(6),
        _ => return None,
    };
    let bytes = value * scale;
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss,
        reason = "range checked; humanize truncates the same way"
    )]
    (bytes >= 0.0 && bytes < u64::MAX as f64).then_some(bytes as u64)
}

/// `InstallDiskSizeMatcher`: an optional operator and a size.
pub(crate) fn parse_size_matcher(s: &str) -> Result<(&'static str, u64), String> {
    let s = s.trim();
    let (op, rest) = ["<=", ">=", "==", "<", ">"]
        .iter()
        .find_map(|op| s.strip_prefix(op).map(|rest| (*op, rest)))
        .unwrap_or(("==", s));
    let size = parse_bytes(rest.trim())
        .ok_or_else(|| format!("failed to parse disk size {}", rest.trim()))?;
    Ok((op, size))
}

/// What Go's `net/url.Parse` yields, as far as Talos' checks look at it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Url {
    pub scheme: String,
    /// `host[:port]` as written (IPv6 in brackets).
    pub host: String,
    pub hostname: String,
    pub port: String,
    pub path: String,
}

/// Go's `url.Parse` (the parts of it that decide success and the host).
pub(crate) fn parse_url(raw: &str) -> Result<Url, String> {
    if raw.chars().any(|c| c.is_ascii_control()) {
        return Err("net/url: invalid control character in URL".to_owned());
    }
    let without_fragment = raw.split('#').next().unwrap_or_default();
    let mut scheme = String::new();
    let mut rest = without_fragment;
    for (i, c) in without_fragment.char_indices() {
        match c {
            'a'..='z' | 'A'..='Z' => {}
            '0'..='9' | '+' | '-' | '.' if i > 0 => {}
            ':' if i == 0 => return Err("missing protocol scheme".to_owned()),
            ':' => {
                scheme = without_fragment[..i].to_ascii_lowercase();
                rest = &without_fragment[i + 1..];
                break;
            }
            _ => break,
        }
    }
    let rest = rest.split('?').next().unwrap_or_default();
    let url = Url {
        scheme,
        host: String::new(),
        hostname: String::new(),
        port: String::new(),
        path: String::new(),
    };
    if !rest.starts_with('/') && !url.scheme.is_empty() {
        return Ok(url); // opaque, e.g. `mailto:x`: no host
    }
    if url.scheme.is_empty() {
        let first_segment = rest.split('/').next().unwrap_or_default();
        if first_segment.contains(':') {
            return Err("first path segment in URL cannot contain colon".to_owned());
        }
    }
    let Some(after) = rest.strip_prefix("//") else {
        return Ok(Url {
            path: rest.to_owned(),
            ..url
        });
    };
    let (authority, path) = match after.find('/') {
        Some(i) => (&after[..i], &after[i..]),
        None => (after, ""),
    };
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let (hostname, port) = if let Some(v6) = host.strip_prefix('[') {
        let Some((inside, after_bracket)) = v6.split_once(']') else {
            return Err("missing ']' in host".to_owned());
        };
        let port = match after_bracket {
            "" => "",
            p if p.starts_with(':') && p[1..].bytes().all(|b| b.is_ascii_digit()) => &p[1..],
            p => return Err(format!("invalid port {p:?} after host")),
        };
        (inside, port)
    } else if let Some((name, port)) = host.rsplit_once(':') {
        if !port.bytes().all(|b| b.is_ascii_digit()) {
            return Err(format!("invalid port \":{port}\" after host"));
        }
        (name, port)
    } else {
        (host, "")
    };
    Ok(Url {
        scheme: url.scheme,
        host: host.to_owned(),
        hostname: hostname.to_owned(),
        port: port.to_owned(),
        path: path.to_owned(),
    })
}

/// `siderolabs/net.ValidateEndpointURI`: parses, IPv6 in brackets, a hostname, a port in range.
pub(crate) fn validate_endpoint_uri(ep: &str) -> Result<Url, String> {
    let url = parse_url(ep)?;
    if url.host.matches(':').count() > 2 && !(url.host.contains('[') && url.host.contains(']')) {
        return Err("IPv6 addresses MUST be enclosed by square brackets".to_owned());
    }
    if url.hostname.is_empty() {
        return Err("hostname must not be blank".to_owned());
    }
    if !url.port.is_empty() {
        match url.port.parse::<u32>() {
            Ok(p) if (1..=65535).contains(&p) => {}
            Ok(_) => return Err("port number must be between 1 and 65535".to_owned()),
            Err(_) => return Err("port number must be numeric".to_owned()),
        }
    }
    Ok(url)
}

/// Go's `net.ParseCIDR`: `<ip>/<prefix>`.
pub(crate) fn parse_cidr(s: &str) -> Result<(IpAddr, u8), String> {
    let invalid = || format!("invalid CIDR address: {s}");
    let (ip, prefix) = s.split_once('/').ok_or_else(invalid)?;
    let ip: IpAddr = ip.parse().map_err(|_| invalid())?;
    if prefix.is_empty() || !prefix.bytes().all(|b| b.is_ascii_digit()) || prefix.len() > 3 {
        return Err(invalid());
    }
    let prefix: u8 = prefix.parse().map_err(|_| invalid())?;
    let max = if ip.is_ipv4() { 32 } else { 128 };
    if prefix > max {
        return Err(invalid());
    }
    Ok((ip, prefix))
}

/// `siderolabs/net.ParseSubnetOrAddress`: a CIDR or a bare IP.
pub(crate) fn is_subnet_or_address(s: &str) -> bool {
    if s.contains('/') {
        parse_cidr(s).is_ok()
    } else {
        s.parse::<IpAddr>().is_ok()
    }
}

/// Talos' `validateIPOrCIDR`.
pub(crate) fn validate_ip_or_cidr(s: &str) -> Result<(), String> {
    if s.contains('/') {
        parse_cidr(s).map(|_| ())
    } else if s.parse::<IpAddr>().is_ok() {
        Ok(())
    } else {
        Err(format!("failed to parse IP address {s:?}"))
    }
}

/// Talos' `isValidDNSName` (v1alpha1 validation): labels of `[a-zA-Z0-9_][a-zA-Z0-9_-]{0,62}`
/// separated by dots, an optional trailing `.` or `_`, at most 255 characters without dots.
pub(crate) fn is_valid_dns_name(name: &str) -> bool {
    if name.is_empty() || name.len() - name.matches('.').count() > 255 {
        return false;
    }
    let body = name
        .strip_suffix('.')
        .or_else(|| name.strip_suffix('_'))
        .unwrap_or(name);
    if body.is_empty() {
        return false;
    }
    body.split('.').all(|label| {
        let bytes = label.as_bytes();
        !bytes.is_empty()
            && bytes.len() <= 63
            && (bytes[0].is_ascii_alphanumeric() || bytes[0] == b'_')
            && bytes
                .iter()
                .all(|b| b.is_ascii_alphanumeric() || *b == b'_' || *b == b'-')
    })
}

/// A lowercase RFC 1123 subdomain.
fn is_dns1123_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        })
}

/// `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`, at most 63 characters.
fn is_label_name(s: &str) -> bool {
    let bytes = s.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 63
        && bytes[0].is_ascii_alphanumeric()
        && bytes[bytes.len() - 1].is_ascii_alphanumeric()
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// A Kubernetes qualified name (label or annotation key): `[prefix/]name`.
pub(crate) fn validate_qualified_name(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix
        && !is_dns1123_subdomain(prefix)
    {
        return Err(format!(
            "prefix part of {key:?} must be a lowercase RFC 1123 subdomain"
        ));
    }
    if !is_label_name(name) {
        return Err(format!(
            "name part of {key:?} must consist of alphanumeric characters, '-', '_' or '.', \
             start and end with an alphanumeric character, at most 63 characters"
        ));
    }
    Ok(())
}

/// A Kubernetes label value: empty or a label name.
pub(crate) fn validate_label_value(value: &str) -> Result<(), String> {
    if value.is_empty() || is_label_name(value) {
        Ok(())
    } else {
        Err(format!(
            "label value {value:?} must be 63 characters or less and consist of alphanumeric \
             characters, '-', '_' or '.', starting and ending with an alphanumeric character"
        ))
    }
}

/// A taint value `[value]:Effect`.
pub(crate) fn validate_taint(value: &str) -> Result<(), String> {
    let (v, effect) = match value.rsplit_once(':') {
        Some((v, effect)) => (v, effect),
        None => (value, ""),
    };
    if !effect.is_empty() && !matches!(effect, "NoSchedule" | "PreferNoSchedule" | "NoExecute") {
        return Err(format!("invalid taint effect {effect:?}"));
    }
    validate_label_value(v)
}

/// The `major.minor.patch` of a Kubernetes image reference's `:v<version>` tag.
pub(crate) fn kubernetes_version_of_image(image: &str) -> Result<(u64, u64, u64), String> {
    let image = image.split('@').next().unwrap_or(image);
    let idx = image
        .rfind(":v")
        .ok_or_else(|| "tag does not start with 'v'".to_owned())?;
    let tag = &image[idx + 2..];
    let core = tag.split(['-', '+']).next().unwrap_or(tag);
    let parts: Vec<&str> = core.split('.').collect();
    let number = |p: &str| -> Result<u64, String> {
        if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
            return Err(format!("invalid version {tag:?}"));
        }
        p.parse().map_err(|_| format!("invalid version {tag:?}"))
    };
    match parts.as_slice() {
        [major, minor, patch] => Ok((number(major)?, number(minor)?, number(patch)?)),
        _ => Err(format!("invalid version {tag:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_go_duration("1h30m"), Some(5_400_000_000_000));
        assert_eq!(parse_go_duration("0"), Some(0));
        assert_eq!(parse_go_duration("1.5s"), Some(1_500_000_000));
        assert_eq!(parse_go_duration("-2ms"), Some(-2_000_000));
        assert_eq!(
            parse_go_duration("87600h0m0s"),
            Some(87_600 * 3_600_000_000_000)
        );
        for bad in ["", "5", "1d", "h", ".s", "1..5s", "1h 2m"] {
            assert_eq!(parse_go_duration(bad), None, "{bad}");
        }
    }

    #[test]
    fn byte_sizes_and_matchers() {
        assert_eq!(parse_bytes("100MB"), Some(100_000_000));
        assert_eq!(parse_bytes("1 GiB"), Some(1 << 30));
        assert_eq!(parse_bytes("4096"), Some(4096));
        assert_eq!(parse_bytes("1,000 kb"), Some(1_000_000));
        assert_eq!(parse_bytes("10 parsecs"), None);
        assert_eq!(parse_size_matcher(">= 100GB"), Ok((">=", 100_000_000_000)));
        assert_eq!(parse_size_matcher("4GB"), Ok(("==", 4_000_000_000)));
        assert!(parse_size_matcher("big").is_err());
    }

    #[test]
    fn endpoints_like_talos() {
        for good in [
            "https://10.0.0.1:6443",
            "https://[fd00::1]:6443",
            "https://api.example",
            "https://api.example:443/",
            "http://10.0.0.1:6443",
            "tcp://1.2.3.4:5",
        ] {
            assert!(validate_endpoint_uri(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "10.0.0.1:6443",
            "api.example:6443",
            "https://",
            "https://:6443",
            "https://host:port",
            "https://host:0",
            "https://host:70000",
            "https://[fd00::1",
            "https://fd00::1:6443",
            "://host",
        ] {
            assert!(validate_endpoint_uri(bad).is_err(), "{bad}");
        }
        let url = validate_endpoint_uri("https://[fd00::1]:6443/x").unwrap();
        assert_eq!(
            (url.hostname.as_str(), url.port.as_str(), url.path.as_str()),
            ("fd00::1", "6443", "/x")
        );
    }

    #[test]
    fn cidrs_and_dns_names() {
        assert!(parse_cidr("10.244.0.0/16").is_ok());
        assert!(parse_cidr("fd00::/64").is_ok());
        for bad in [
            "10.244.0.0",
            "10.244.0.0/33",
            "10.244.0/16",
            "x/8",
            "10.0.0.0/",
        ] {
            assert!(parse_cidr(bad).is_err(), "{bad}");
        }
        assert!(is_subnet_or_address("10.0.0.1"));
        assert!(!is_subnet_or_address("10.0.0"));
        for good in ["cluster.local", "Example.COM", "a_b.c", "x."] {
            assert!(is_valid_dns_name(good), "{good}");
        }
        for bad in ["", "-a.b", "a..b", "a b", "a/b"] {
            assert!(!is_valid_dns_name(bad), "{bad}");
        }
    }

    #[test]
    fn labels_and_taints() {
        assert!(
            validate_qualified_name("node.kubernetes.io/exclude-from-external-load-balancers")
                .is_ok()
        );
        assert!(validate_qualified_name("app").is_ok());
        assert!(validate_qualified_name("Bad_Prefix/x").is_err());
        assert!(validate_qualified_name("-x").is_err());
        assert!(validate_label_value("").is_ok());
        assert!(validate_label_value("a b").is_err());
        assert!(validate_taint("value:NoSchedule").is_ok());
        assert!(validate_taint(":NoExecute").is_ok());
        assert!(validate_taint("value:Sometimes").is_err());
    }

    #[test]
    fn image_versions() {
        assert_eq!(
            kubernetes_version_of_image("ghcr.io/siderolabs/kubelet:v1.36.2"),
            Ok((1, 36, 2))
        );
        assert_eq!(
            kubernetes_version_of_image("registry:5000/kube-apiserver:v1.32.0-rc.1@sha256:ab"),
            Ok((1, 32, 0))
        );
        assert!(kubernetes_version_of_image("kubelet:latest").is_err());
        assert!(kubernetes_version_of_image("kubelet:v1.36").is_err());
    }
}
