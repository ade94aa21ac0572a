//! Hostlet nodes: the test bed's kubelet stand-in (`e2e/hostlet`), which runs the pods bound
//! to its node as real host processes. The test bed starts the `hostlet` binary as one more
//! component (see [`crate::ControlPlane::start_hostlet`]); it does not link the crate.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

/// One hostlet node to run.
#[derive(Clone, Debug)]
pub struct HostletConfig {
    /// The Node's name.
    pub name: String,
    /// The Node's InternalIP (a loopback address such as `127.20.0.1`).
    pub node_ip: Ipv4Addr,
    /// A loopback range giving each pod an address of its own (`127.20.1.0/24`); `None`:
    /// every pod uses `node_ip`.
    pub pod_cidr: Option<String>,
    /// The image map file (see `e2e/hostlet/README.md`).
    pub image_map: PathBuf,
    /// The `hostlet` binary (tests pass the workspace's `target/<profile>/hostlet`).
    pub binary: PathBuf,
    /// Report pods with unmapped images Running/Ready (as KWOK does) instead of refusing
    /// them.
    pub pretend_unmapped: bool,
    /// The first crash-loop back-off in seconds (`None`: the kubelet's 10 s).
    pub initial_backoff_seconds: Option<u64>,
    /// Extra Node labels.
    pub labels: Vec<(String, String)>,
    /// Node taints, `key=value:Effect`.
    pub taints: Vec<String>,
    /// Anything else to pass to the hostlet.
    pub extra_args: Vec<String>,
}

impl HostletConfig {
    /// A node named `name` on `node_ip`, every pod on the node's IP, unmapped images refused.
    pub fn new(
        name: impl Into<String>,
        node_ip: Ipv4Addr,
        image_map: impl Into<PathBuf>,
        binary: impl Into<PathBuf>,
    ) -> Self {
        Self {
            name: name.into(),
            node_ip,
            pod_cidr: None,
            image_map: image_map.into(),
            binary: binary.into(),
            pretend_unmapped: false,
            initial_backoff_seconds: None,
            labels: Vec::new(),
            taints: Vec::new(),
            extra_args: Vec::new(),
        }
    }

    /// The hostlet's command line.
    pub fn args(&self, kubeconfig: &Path, dir: &Path) -> Vec<String> {
        let mut args = vec![
            format!("--kubeconfig={}", kubeconfig.display()),
            format!("--node-name={}", self.name),
            format!("--node-ip={}", self.node_ip),
            format!("--image-map={}", self.image_map.display()),
            format!("--dir={}", dir.display()),
        ];
        if let Some(cidr) = &self.pod_cidr {
            args.push(format!("--pod-cidr={cidr}"));
        }
        if self.pretend_unmapped {
            args.push("--unmapped=pretend".into());
        }
        if let Some(secs) = self.initial_backoff_seconds {
            args.push(format!("--initial-backoff-seconds={secs}"));
        }
        for (k, v) in &self.labels {
            args.push(format!("--label={k}={v}"));
        }
        for taint in &self.taints {
            args.push(format!("--taint={taint}"));
        }
        args.extend(self.extra_args.iter().cloned());
        args
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_carries_every_setting() {
        let mut h = HostletConfig::new(
            "n1",
            Ipv4Addr::new(127, 20, 0, 1),
            "/m.yaml",
            "/bin/hostlet",
        );
        h.pod_cidr = Some("127.20.1.0/24".into());
        h.pretend_unmapped = true;
        h.initial_backoff_seconds = Some(1);
        h.labels.push(("a".into(), "b".into()));
        h.taints.push("k=v:NoSchedule".into());
        let args = h.args(Path::new("/kc"), Path::new("/d"));
        assert_eq!(
            args,
            [
                "--kubeconfig=/kc",
                "--node-name=n1",
                "--node-ip=127.20.0.1",
                "--image-map=/m.yaml",
                "--dir=/d",
                "--pod-cidr=127.20.1.0/24",
                "--unmapped=pretend",
                "--initial-backoff-seconds=1",
                "--label=a=b",
                "--taint=k=v:NoSchedule",
            ]
        );
    }
}
