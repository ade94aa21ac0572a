//! Hostlet nodes: the test bed's kubelet stand-in (`e2e/hostlet`), which runs the pods bound
//! to its node as real host processes. The test bed starts the `hostlet` binary as one more
//! component (see [`crate::ControlPlane::start_hostlet`]), or on its own as a [`Hostlet`]
//! for a node that comes and goes while its cluster runs; it does not link the crate.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use kube::Client;

use crate::Error;
use crate::process::Component;

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

/// A hostlet node that is not one of a control plane's components: a node that joins and
/// leaves while the cluster runs (a worker machine). Its owner stops it; dropping it kills
/// the process.
pub struct Hostlet {
    name: String,
    dir: PathBuf,
    component: Component,
}

impl Hostlet {
    /// Starts the hostlet `config` against the API server of `kubeconfig` (an identity allowed
    /// what a hostlet does, such as the admin kubeconfig), with its files in
    /// `<cluster_dir>/hostlets/<name>` and its log in `<cluster_dir>/logs/hostlet-<name>.log`
    /// (as [`crate::ControlPlane::start_hostlet`] does), and waits until `client` sees its Node
    /// Ready. The hostlet is a child of the calling thread (it dies with it): call this from a
    /// thread that lives as long as the node should.
    pub async fn start(
        config: &HostletConfig,
        cluster_dir: &Path,
        kubeconfig: &Path,
        client: &Client,
    ) -> Result<Self, Error> {
        let dir = hostlet_dir(cluster_dir, &config.name);
        crate::control_plane::create_dir(&dir)?;
        let mut component = Component::spawn_logged(
            "hostlet",
            &format!("hostlet-{}", config.name),
            &config.binary,
            &config.args(kubeconfig, &dir),
            &cluster_dir.join("logs"),
        )?;
        let names = [config.name.clone()];
        let waited = crate::control_plane::wait_for(
            std::slice::from_mut(&mut component),
            &format!("hostlet node {} Ready", config.name),
            || crate::control_plane::nodes_ready(client, &names),
        )
        .await;
        if let Err(err) = waited {
            component.stop().await;
            return Err(err);
        }
        Ok(Self {
            name: config.name.clone(),
            dir,
            component,
        })
    }

    /// The Node's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The hostlet's directory (pod logs under `pods/`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.component.pid()
    }

    /// Fails if the hostlet has exited.
    pub fn check_alive(&mut self) -> Result<(), Error> {
        self.component.check_alive()
    }

    /// SIGTERM (the hostlet stops its pods first), then SIGKILL after a grace period. The
    /// Node stays registered, as a stopped kubelet's does.
    pub async fn stop(mut self) {
        self.component.stop().await;
    }
}

/// `<cluster_dir>/hostlets/<name>`: where the hostlet node `name` keeps its files.
pub fn hostlet_dir(cluster_dir: &Path, name: &str) -> PathBuf {
    cluster_dir.join("hostlets").join(name)
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
