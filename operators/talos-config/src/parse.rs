//! Reading a machine config back: what the emulator needs from an applied config, with
//! the checks Talos makes before accepting one.
//!
//! Accepts any multi-document config (unknown fields and document kinds are ignored) and
//! rejects, naming the field: empty or oversized input, non-YAML, no `v1alpha1` document,
//! missing `version`, `machine.type`, `machine.token`, `machine.ca.crt`, `cluster.ca.crt`,
//! `cluster.controlPlane.endpoint` or an install disk; control planes without the OS or
//! Kubernetes CA keys; workers *with* them or with an etcd section; `persist: false`; an
//! unknown CNI. Certificates must parse as CA certificates and CA keys must match them.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;

use crate::config::{ConfigError, DiskSelector, InstallDisk, MachineType, is_dns_subdomain};
use crate::schema;
use crate::secrets::{self, Sensitive};

/// Largest config [`parse_machine_config`] reads: 1 MiB. A generated config is ~10 KiB.
pub const MAX_CONFIG_BYTES: usize = 1024 * 1024;

/// A CA read from a machine config: the certificate, and the key where the config has one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedCa {
    /// PEM `CERTIFICATE`.
    pub cert_pem: String,
    /// PEM private key (controlplane configs only).
    pub key_pem: Option<Sensitive>,
}

/// What a machine config says, as far as Kontinuum and its emulator care.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedConfig {
    /// `machine.type`.
    pub machine_type: MachineType,
    /// `machine.token` (trustd token).
    pub machine_token: Sensitive,
    /// `machine.ca`: the OS (Talos API) CA.
    pub os_ca: ParsedCa,
    /// `cluster.ca`: the Kubernetes CA.
    pub kubernetes_ca: ParsedCa,
    /// `cluster.controlPlane.endpoint`, e.g. `https://10.0.0.1:6443`.
    pub cluster_endpoint: String,
    /// `cluster.clusterName`.
    pub cluster_name: Option<String>,
    /// `cluster.id`.
    pub cluster_id: Option<String>,
    /// `cluster.token` (Kubernetes bootstrap token).
    pub bootstrap_token: Option<Sensitive>,
    /// `HostnameConfig.hostname` (or the legacy `machine.network.hostname`).
    pub hostname: Option<String>,
    /// `machine.install.disk` or `machine.install.diskSelector`.
    pub install_disk: InstallDisk,
    /// `machine.certSANs`.
    pub machine_cert_sans: Vec<String>,
}

fn missing(field: &'static str) -> ConfigError {
    ConfigError::MissingField { field }
}

fn invalid(field: &'static str, problem: &'static str) -> ConfigError {
    ConfigError::InvalidField { field, problem }
}

/// Parses and checks a rendered (or any Talos) machine config.
pub fn parse_machine_config(bytes: &[u8]) -> Result<ParsedConfig, ConfigError> {
    if bytes.len() > MAX_CONFIG_BYTES {
        return Err(ConfigError::TooLarge {
            size: bytes.len(),
            max: MAX_CONFIG_BYTES,
        });
    }
    let text = std::str::from_utf8(bytes).map_err(|_| ConfigError::InvalidYaml(None))?;
    if text.trim().is_empty() {
        return Err(ConfigError::Empty);
    }
    let documents: Vec<serde_json::Value> =
        serde_saphyr::from_multiple(text).map_err(|e| ConfigError::InvalidYaml(Some(e)))?;

    let mut v1alpha1: Option<schema::V1Alpha1> = None;
    let mut hostname_config: Option<schema::HostnameConfig> = None;
    for document in documents {
        let serde_json::Value::Object(map) = &document else {
            if document.is_null() {
                continue; // an empty document between two `---`
            }
            return Err(invalid("document", "not a mapping"));
        };
        let kind = map.get("kind").and_then(serde_json::Value::as_str);
        match kind {
            None if map.contains_key("machine") || map.contains_key("version") => {
                if v1alpha1.is_some() {
                    return Err(ConfigError::DuplicateDocument {
                        document: "v1alpha1",
                    });
                }
                v1alpha1 = Some(
                    serde_json::from_value(document)
                        .map_err(|_| invalid("v1alpha1", "unexpected field types"))?,
                );
            }
            Some("HostnameConfig") => {
                if hostname_config.is_some() {
                    return Err(ConfigError::DuplicateDocument {
                        document: "HostnameConfig",
                    });
                }
                hostname_config = Some(
                    serde_json::from_value(document)
                        .map_err(|_| invalid("HostnameConfig", "unexpected field types"))?,
                );
            }
            None => return Err(invalid("document", "neither v1alpha1 nor a typed document")),
            // Other documents (network, volumes, ...) are valid Talos but not ours to read.
            Some(_) => {}
        }
    }
    let config = v1alpha1.ok_or(ConfigError::NoV1Alpha1)?;
    let hostname = match hostname_config {
        Some(doc) => {
            if doc.api_version.as_deref() != Some("v1alpha1") {
                return Err(invalid("HostnameConfig.apiVersion", "must be v1alpha1"));
            }
            if doc.hostname.is_some() && doc.auto.is_some() {
                return Err(invalid(
                    "HostnameConfig.hostname",
                    "hostname and auto are mutually exclusive",
                ));
            }
            match doc.hostname {
                Some(h) if !is_dns_subdomain(&h) => {
                    return Err(invalid("HostnameConfig.hostname", "not a DNS name"));
                }
                other => other,
            }
        }
        None => None,
    };
    check_v1alpha1(config, hostname)
}

fn check_v1alpha1(
    config: schema::V1Alpha1,
    hostname: Option<String>,
) -> Result<ParsedConfig, ConfigError> {
    match config.version.as_deref() {
        None => return Err(missing("version")),
        Some("v1alpha1") => {}
        Some(_) => return Err(invalid("version", "must be v1alpha1")),
    }
    if config.persist == Some(false) {
        return Err(invalid("persist", "must be true"));
    }
    let machine = config.machine.ok_or_else(|| missing("machine"))?;
    let cluster = config.cluster.ok_or_else(|| missing("cluster"))?;
    let legacy_hostname = machine
        .network
        .and_then(|n| n.hostname)
        .filter(|h| !h.is_empty());
    if legacy_hostname
        .as_deref()
        .is_some_and(|h| !is_dns_subdomain(h))
    {
        return Err(invalid("machine.network.hostname", "not a DNS name"));
    }
    let hostname = hostname.or(legacy_hostname);

    let machine_type = machine
        .kind
        .as_deref()
        .filter(|t| !t.is_empty())
        .ok_or_else(|| missing("machine.type"))?;
    let machine_type = MachineType::parse(machine_type)
        .ok_or_else(|| invalid("machine.type", "must be controlplane, worker or init"))?;
    let control_plane = machine_type.is_control_plane();

    let machine_token = machine
        .token
        .filter(|t| !t.is_empty())
        .ok_or_else(|| missing("machine.token"))?;

    let os_ca = read_ca(
        machine.ca,
        control_plane,
        ["machine.ca.crt", "machine.ca.key"],
    )?;
    let kubernetes_ca = read_ca(
        cluster.ca,
        control_plane,
        ["cluster.ca.crt", "cluster.ca.key"],
    )?;
    if !control_plane && cluster.etcd.is_some() {
        return Err(invalid("cluster.etcd", "forbidden on workers"));
    }

    let cluster_endpoint = cluster
        .control_plane
        .and_then(|c| c.endpoint)
        .filter(|e| !e.is_empty())
        .ok_or_else(|| missing("cluster.controlPlane.endpoint"))?;
    if !is_endpoint_url(&cluster_endpoint) {
        return Err(invalid(
            "cluster.controlPlane.endpoint",
            "must be an https://host:port URL",
        ));
    }

    let install_disk = read_install(machine.install)?;
    if let Some(cni) = cluster.network.as_ref().and_then(|n| n.cni.as_ref()) {
        check_cni(cni)?;
    }

    Ok(ParsedConfig {
        machine_type,
        machine_token: Sensitive::new(machine_token),
        os_ca,
        kubernetes_ca,
        cluster_endpoint,
        cluster_name: cluster.name.filter(|n| !n.is_empty()),
        cluster_id: cluster.id.filter(|n| !n.is_empty()),
        bootstrap_token: cluster.token.filter(|t| !t.is_empty()).map(Sensitive::new),
        hostname,
        install_disk,
        machine_cert_sans: machine.cert_sans.unwrap_or_default(),
    })
}

/// `machine.install`: a disk path or a selector is required (metal mode).
fn read_install(install: Option<schema::Install>) -> Result<InstallDisk, ConfigError> {
    let install = install.ok_or_else(|| missing("machine.install"))?;
    let install_disk = match (
        install.disk.filter(|d| !d.is_empty()),
        install.disk_selector,
    ) {
        (Some(disk), _) => InstallDisk::Path(disk),
        (None, Some(selector)) => InstallDisk::Selector(selector),
        (None, None) => return Err(missing("machine.install.disk")),
    };
    if let InstallDisk::Selector(DiskSelector {
        disk_type: Some(kind),
        ..
    }) = &install_disk
        && !matches!(kind.as_str(), "ssd" | "hdd" | "nvme" | "sd")
    {
        return Err(invalid(
            "machine.install.diskSelector.type",
            "must be ssd, hdd, nvme or sd",
        ));
    }
    Ok(install_disk)
}

/// `cluster.network.cni`: a known CNI, and URLs only with `custom`.
fn check_cni(cni: &schema::Cni) -> Result<(), ConfigError> {
    match cni.name.as_deref() {
        Some("flannel" | "none") => {
            if cni.urls.as_ref().is_some_and(|u| !u.is_empty()) {
                return Err(invalid(
                    "cluster.network.cni.urls",
                    "only allowed with the custom CNI",
                ));
            }
        }
        Some("custom") => {}
        _ => {
            return Err(invalid(
                "cluster.network.cni.name",
                "must be flannel, custom or none",
            ));
        }
    }
    Ok(())
}

/// Reads a `{crt, key}` CA: the certificate is required; the key is required on control
/// planes (and must match the certificate) and forbidden on workers.
fn read_ca(
    pair: Option<schema::PemPair>,
    control_plane: bool,
    [crt_field, key_field]: [&'static str; 2],
) -> Result<ParsedCa, ConfigError> {
    let pair = pair.unwrap_or_default();
    let crt = pair
        .crt
        .filter(|c| !c.is_empty())
        .ok_or_else(|| missing(crt_field))?;
    let cert_pem = decode_pem(crt_field, &crt)?;
    secrets::check_ca_cert(crt_field, cert_pem.expose())
        .map_err(|_| invalid(crt_field, "not a ca certificate"))?;
    let key = pair.key.filter(|k| !k.is_empty());
    let key_pem = match (control_plane, key) {
        (true, None) => return Err(missing(key_field)),
        (false, Some(_)) => return Err(invalid(key_field, "forbidden on workers")),
        (false, None) => None,
        (true, Some(key)) => {
            let key_pem = decode_pem(key_field, &key)?;
            secrets::check_ca_pair(crt_field, cert_pem.expose(), key_pem.expose(), None)
                .map_err(|_| invalid(key_field, "not the key of the ca certificate"))?;
            Some(key_pem)
        }
    };
    Ok(ParsedCa {
        cert_pem: cert_pem.expose().to_owned(),
        key_pem,
    })
}

fn decode_pem(field: &'static str, value: &str) -> Result<Sensitive, ConfigError> {
    let bytes = STANDARD
        .decode(value.trim())
        .map_err(|_| invalid(field, "not base64"))?;
    let text = String::from_utf8(bytes).map_err(|_| invalid(field, "not pem"))?;
    let text = Sensitive::new(text);
    if !text.expose().contains("-----BEGIN ") {
        return Err(invalid(field, "not pem"));
    }
    Ok(text)
}

/// `https://<host>[:<port>][/...]` with a non-empty host (IPv6 in brackets) and, if
/// given, a numeric port, as Talos parses the endpoint as a URL.
fn is_endpoint_url(url: &str) -> bool {
    let Some(rest) = url.strip_prefix("https://") else {
        return false;
    };
    let authority = rest.split('/').next().unwrap_or_default();
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let Some((host, after)) = v6.split_once(']') else {
            return false;
        };
        if !after.is_empty() && !after.starts_with(':') {
            return false;
        }
        (host, after.strip_prefix(':'))
    } else {
        match authority.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        }
    };
    !host.is_empty()
        && !host.contains(char::is_whitespace)
        && port.is_none_or(|p| p.parse::<u16>().is_ok_and(|p| p > 0))
}

#[cfg(test)]
mod tests {
    use super::is_endpoint_url;

    #[test]
    fn endpoint_urls() {
        for good in [
            "https://10.0.0.1:6443",
            "https://[fd00::1]:6443",
            "https://api.example",
            "https://api.example:443/",
        ] {
            assert!(is_endpoint_url(good), "{good}");
        }
        for bad in [
            "",
            "10.0.0.1:6443",
            "http://10.0.0.1:6443",
            "https://",
            "https://:6443",
            "https://host:port",
            "https://host:0",
            "https://[fd00::1",
            "https://[fd00::1]x",
        ] {
            assert!(!is_endpoint_url(bad), "{bad}");
        }
    }
}
