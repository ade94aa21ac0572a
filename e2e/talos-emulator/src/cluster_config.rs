//! What a control plane's machine config asks of the Kubernetes control plane that Bootstrap
//! starts, read from the config by the emulator itself (the generator's parser keeps only
//! what the rest of the emulator needs): the cluster's name, the etcd and aggregator CAs,
//! the ServiceAccount signing key, the pod and Service networks, the API server's port, the
//! control-plane taint and the CNI. Pure: the edge (`machine.rs`) turns it into a
//! `kontinuum_testbed::ControlPlaneConfig` and logs what cannot be honoured.

use std::net::Ipv4Addr;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use kontinuum_talos_config::Sensitive;
use serde_json::Value;

/// Talos' default port of the API server on a control plane.
pub const DEFAULT_LOCAL_API_PORT: u16 = 6443;
/// Talos' taint (and label) of control-plane Nodes.
pub const CONTROL_PLANE_ROLE: &str = "node-role.kubernetes.io/control-plane";

/// A CA certificate and key from the config, both PEM.
#[derive(Clone, Debug)]
pub struct Ca {
    pub cert_pem: String,
    pub key_pem: Sensitive,
}

/// The cluster settings of a machine config, as far as the emulator starts a control plane.
#[derive(Clone, Debug, Default)]
pub struct ClusterSettings {
    /// `cluster.clusterName`.
    pub cluster_name: Option<String>,
    /// `cluster.etcd.ca`.
    pub etcd_ca: Option<Ca>,
    /// `cluster.aggregatorCA`.
    pub aggregator_ca: Option<Ca>,
    /// `cluster.serviceAccount.key`, PEM.
    pub service_account_key: Option<Sensitive>,
    /// `cluster.network.podSubnets`.
    pub pod_subnets: Vec<String>,
    /// `cluster.network.serviceSubnets`.
    pub service_subnets: Vec<String>,
    /// `cluster.controlPlane.localAPIServerPort`.
    pub local_api_server_port: Option<u16>,
    /// `cluster.controlPlane.endpoint`.
    pub endpoint: Option<String>,
    /// `cluster.apiServer.certSANs`.
    pub api_server_cert_sans: Vec<String>,
    /// `cluster.allowSchedulingOnControlPlanes` (Talos' default: false).
    pub allow_scheduling_on_control_planes: bool,
    /// `cluster.network.cni.name` (unset: Talos installs flannel).
    pub cni: Option<String>,
    /// The shared IP of a `Layer2VIPConfig` document (its `name`), or of
    /// `machine.network.interfaces[].vip.ip`.
    pub shared_vip: Option<std::net::IpAddr>,
}

impl ClusterSettings {
    /// The API server's port on the machine at `address`: `localAPIServerPort` when set,
    /// else the endpoint's port when the endpoint names this machine (what its clients dial),
    /// else Talos' 6443.
    pub fn api_port(&self, address: Ipv4Addr) -> u16 {
        if let Some(port) = self.local_api_server_port {
            return port;
        }
        self.endpoint
            .as_deref()
            .filter(|e| crate::core::endpoint_host(e) == Some(address.to_string().as_str()))
            .map_or(DEFAULT_LOCAL_API_PORT, |e| endpoint_port(e).unwrap_or(443))
    }

    /// The first IPv4 subnet of `subnets`, and what of the list cannot be honoured.
    fn first_v4<'a>(
        subnets: &'a [String],
        field: &str,
        ignored: &mut Vec<String>,
    ) -> Option<&'a str> {
        let first = subnets.iter().find(|s| is_v4_cidr(s));
        for other in subnets.iter().filter(|s| Some(*s) != first) {
            ignored.push(format!(
                "{field} {other} (one IPv4 network per cluster is emulated)"
            ));
        }
        first.map(String::as_str)
    }

    /// The pod and Service networks to start with, and every setting that cannot be
    /// honoured, one line each, naming it.
    pub fn networks(&self) -> (Option<&str>, Option<&str>, Vec<String>) {
        let mut ignored = Vec::new();
        let pods = Self::first_v4(
            &self.pod_subnets,
            "cluster.network.podSubnets",
            &mut ignored,
        );
        let services = Self::first_v4(
            &self.service_subnets,
            "cluster.network.serviceSubnets",
            &mut ignored,
        );
        match self.cni.as_deref() {
            Some("none") => {}
            Some(other) => ignored.push(format!(
                "cluster.network.cni.name {other} (no CNI is installed)"
            )),
            None => ignored.push(
                "cluster.network.cni (Talos' default, flannel; no CNI is installed)".to_owned(),
            ),
        }
        (pods, services, ignored)
    }
}

/// `a.b.c.d/n`, IPv4 only.
fn is_v4_cidr(cidr: &str) -> bool {
    cidr.split_once('/').is_some_and(|(ip, len)| {
        ip.parse::<Ipv4Addr>().is_ok() && len.parse::<u8>().is_ok_and(|l| l <= 30)
    })
}

/// The port of `https://host:port/...` (`None` without one).
pub(crate) fn endpoint_port(url: &str) -> Option<u16> {
    let authority = url.strip_prefix("https://")?.split('/').next()?;
    let port = match authority.strip_prefix('[') {
        Some(v6) => v6.split_once("]:")?.1,
        None => authority.rsplit_once(':')?.1,
    };
    port.parse().ok()
}

/// Reads the cluster settings of a (validated) machine config.
pub fn read(bytes: &[u8]) -> Result<ClusterSettings, String> {
    let text = std::str::from_utf8(bytes).map_err(|_| "the config is not UTF-8".to_owned())?;
    let documents: Vec<Value> =
        serde_saphyr::from_multiple(text).map_err(|e| format!("the config is not YAML: {e}"))?;
    let shared_vip = shared_vip(&documents);
    let Some(cluster) = documents
        .iter()
        .find(|d| d.get("machine").is_some() || d.get("cluster").is_some())
        .and_then(|d| d.get("cluster"))
    else {
        return Ok(ClusterSettings {
            shared_vip,
            ..ClusterSettings::default()
        });
    };
    let at =
        |path: &[&str]| -> Option<&Value> { path.iter().try_fold(cluster, |v, key| v.get(*key)) };
    let string = |path: &[&str]| at(path).and_then(Value::as_str).map(str::to_owned);
    let strings = |path: &[&str]| -> Vec<String> {
        at(path)
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default()
    };
    let pem = |path: &[&str]| -> Result<Option<String>, String> {
        let Some(b64) = string(path) else {
            return Ok(None);
        };
        let bytes = STANDARD
            .decode(b64.trim())
            .map_err(|_| format!("cluster.{} is not base64", path.join(".")))?;
        String::from_utf8(bytes)
            .map(Some)
            .map_err(|_| format!("cluster.{} is not PEM", path.join(".")))
    };
    let ca = |path: &[&str]| -> Result<Option<Ca>, String> {
        let crt = [path, &["crt"]].concat();
        let key = [path, &["key"]].concat();
        Ok(match (pem(&crt)?, pem(&key)?) {
            (Some(cert_pem), Some(key)) => Some(Ca {
                cert_pem,
                key_pem: Sensitive::new(key),
            }),
            _ => None,
        })
    };
    Ok(ClusterSettings {
        cluster_name: string(&["clusterName"]),
        etcd_ca: ca(&["etcd", "ca"])?,
        aggregator_ca: ca(&["aggregatorCA"])?,
        service_account_key: pem(&["serviceAccount", "key"])?.map(Sensitive::new),
        pod_subnets: strings(&["network", "podSubnets"]),
        service_subnets: strings(&["network", "serviceSubnets"]),
        local_api_server_port: at(&["controlPlane", "localAPIServerPort"])
            .and_then(Value::as_u64)
            .and_then(|p| u16::try_from(p).ok()),
        endpoint: string(&["controlPlane", "endpoint"]),
        api_server_cert_sans: strings(&["apiServer", "certSANs"]),
        allow_scheduling_on_control_planes: at(&["allowSchedulingOnControlPlanes"])
            .and_then(Value::as_bool)
            .unwrap_or(false),
        cni: string(&["network", "cni", "name"]),
        shared_vip,
    })
}

/// The shared IP a config's documents name: a `Layer2VIPConfig`'s `name`, else the first
/// `machine.network.interfaces[].vip.ip` (Talos' older form).
fn shared_vip(documents: &[Value]) -> Option<std::net::IpAddr> {
    let typed = documents
        .iter()
        .filter(|d| d.get("kind").and_then(Value::as_str) == Some("Layer2VIPConfig"))
        .find_map(|d| d.get("name")?.as_str()?.parse().ok());
    typed.or_else(|| {
        documents
            .iter()
            .find_map(|d| {
                d.pointer("/machine/network/interfaces")?
                    .as_array()
                    .cloned()
            })?
            .iter()
            .find_map(|i| i.pointer("/vip/ip")?.as_str()?.parse().ok())
    })
}

#[cfg(test)]
mod tests;
