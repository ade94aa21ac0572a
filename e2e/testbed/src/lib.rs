//! The Kontinuum test bed: a REAL Kubernetes control plane (etcd, kube-apiserver,
//! kube-controller-manager, kube-scheduler, KWOK) started from Rust in seconds, without
//! Docker. The binaries are built from the Go module proxy by `build-tools.sh` (see
//! [`Tools`]).
//!
//! * [`ControlPlane::start`] runs one control plane bound to a given address and port, so
//!   several can run at once on different loopback addresses.
//! * [`shared`] gives every test of one test binary the same control plane, started once on
//!   a thread of its own so that it outlives any single test's runtime.
//!
//! Every component is a child process that dies with the test process (see `process`), and
//! logs to `<dir>/logs/<component>.log`, which is kept after the run.

mod control_plane;
mod hostlet;
mod pki;
mod process;
mod tools;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::Client;

pub use control_plane::{
    AUDIT_LOG, ControlPlane, ControlPlaneConfig, FIRST_SERVICE_IP, KWOK_NODE_ANNOTATION,
    client_from, free_port,
};
pub use hostlet::{Hostlet, HostletConfig, hostlet_dir};
pub use pki::{CertPair, CertificateAuthority, EtcdPki, FrontProxyPki, Pki, PkiInputs};
pub use tools::{BIN_ENV, BUILD_SCRIPT, Tools};

/// Errors of the test bed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The tools are missing or could not be built.
    #[error("test-bed tools: {0}")]
    Tools(String),
    /// A [`ControlPlaneConfig`] asks for something the test bed cannot start.
    #[error("invalid control plane config: {0}")]
    InvalidConfig(String),
    /// A file or process operation failed.
    #[error("{what}")]
    Io {
        /// What we were doing.
        what: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Certificate generation failed.
    #[error("{what}")]
    Pki {
        /// What we were doing.
        what: &'static str,
        /// The cause.
        #[source]
        source: rcgen::Error,
    },
    /// The kubeconfig could not be loaded.
    #[error("loading the kubeconfig")]
    Kubeconfig(#[source] kube::config::KubeconfigError),
    /// A Kubernetes API call failed.
    #[error("{what}")]
    Kube {
        /// What we were doing.
        what: String,
        /// The cause.
        #[source]
        source: kube::Error,
    },
    /// A component exited while it should be running.
    #[error("{component} exited ({status}); end of its log:\n{log_tail}")]
    Exited {
        /// The component.
        component: &'static str,
        /// Its exit status.
        status: String,
        /// The end of its log.
        log_tail: String,
    },
    /// A readiness condition did not hold in time.
    #[error("timed out after {after:?} waiting for {what}")]
    Timeout {
        /// The condition.
        what: String,
        /// How long we waited.
        after: Duration,
    },
}

/// Whether a Node's `Ready` condition is `True`.
pub fn node_is_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Where control planes of tests keep their files: `KONTINUUM_TESTBED_DIR`, or
/// `target/testbed` of this workspace.
pub fn base_dir() -> PathBuf {
    match std::env::var_os("KONTINUUM_TESTBED_DIR") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => {
            let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
            let workspace = manifest.parent().and_then(Path::parent).unwrap_or(manifest);
            workspace.join("target/testbed")
        }
    }
}

/// A new directory `<base>/<prefix>-<pid>-<n>` for one control plane. Also frees the etcd
/// data of earlier runs whose process is gone, at any depth (the store's `store-etcd`, the
/// emulated machines' control planes); their logs and certificates stay.
pub fn unique_dir(prefix: &str) -> PathBuf {
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    let base = base_dir();
    prune_dead_runs(&base);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    base.join(format!("{prefix}-{}-{n}", std::process::id()))
}

fn prune_dead_runs(base: &Path) {
    let Ok(entries) = std::fs::read_dir(base) else {
        return;
    };
    for entry in entries.filter_map(Result::ok) {
        let name = entry.file_name().to_string_lossy().into_owned();
        let pid = name.rsplit('-').nth(1).and_then(|p| p.parse::<u32>().ok());
        if let Some(pid) = pid
            && pid != std::process::id()
            && !Path::new(&format!("/proc/{pid}")).exists()
        {
            remove_etcd_data(&entry.path(), 4);
        }
    }
}

/// Removes every directory named `etcd` or `*-etcd` under `dir`, looking `depth` levels down.
fn remove_etcd_data(dir: &Path, depth: usize) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.filter_map(Result::ok) {
        if !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name == "etcd" || name.ends_with("-etcd") {
            let _ = std::fs::remove_dir_all(entry.path());
        } else if depth > 1 {
            remove_etcd_data(&entry.path(), depth - 1);
        }
    }
}

/// The control plane shared by all tests of one test binary.
#[derive(Debug)]
pub struct Shared {
    /// The admin kubeconfig.
    pub kubeconfig_yaml: String,
    /// Path of the admin kubeconfig file.
    pub kubeconfig_path: PathBuf,
    /// `https://<address>:<port>`.
    pub server: String,
    /// The control plane's directory (logs under `logs/`).
    pub dir: PathBuf,
    /// The tools it was started with (kubectl, helm, ...).
    pub tools: Tools,
    /// How long it took to become usable.
    pub started_in: Duration,
}

impl Shared {
    /// The API server's audit log: one JSON event per write request.
    pub fn audit_log(&self) -> PathBuf {
        self.dir.join(AUDIT_LOG)
    }

    /// A client for the calling test's runtime.
    pub async fn client(&self) -> Result<Client, Error> {
        client_from(&self.kubeconfig_yaml).await
    }
}

/// Starts (once per process) and returns the shared control plane. It runs on a dedicated
/// thread, which outlives every test, and is killed when the test process exits.
pub fn shared() -> Result<&'static Shared, String> {
    static SHARED: OnceLock<Result<Shared, String>> = OnceLock::new();
    SHARED
        .get_or_init(start_shared)
        .as_ref()
        .map_err(Clone::clone)
}

fn start_shared() -> Result<Shared, String> {
    install_crypto_provider();
    let tools = Tools::locate().map_err(|e| error_chain(&e))?;
    let exe = std::env::current_exe().ok();
    let prefix = exe.as_deref().and_then(Path::file_stem).map_or_else(
        || "shared".to_string(),
        |s| s.to_string_lossy().into_owned(),
    );
    // Test executables are named `<test>-<hash>`: keep the test's name.
    let prefix = prefix.split('-').next().unwrap_or("shared").to_string();
    let config = ControlPlaneConfig::new(unique_dir(&prefix));
    let (tx, rx) = std::sync::mpsc::channel();
    let thread_tools = tools.clone();
    std::thread::Builder::new()
        .name("testbed".into())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = tx.send(Err(format!("building a runtime: {e}")));
                    return;
                }
            };
            runtime.block_on(async move {
                match ControlPlane::start(&thread_tools, config).await {
                    Ok(cp) => {
                        let _ = tx.send(Ok((
                            cp.kubeconfig_yaml().to_string(),
                            cp.kubeconfig_path().to_path_buf(),
                            cp.server().to_string(),
                            cp.dir().to_path_buf(),
                            cp.started_in(),
                        )));
                        // Keep the components (and this thread, their parent) alive until
                        // the process exits.
                        std::future::pending::<()>().await;
                        drop(cp);
                    }
                    Err(e) => {
                        let _ = tx.send(Err(error_chain(&e)));
                    }
                }
            });
        })
        .map_err(|e| format!("spawning the testbed thread: {e}"))?;
    let (kubeconfig_yaml, kubeconfig_path, server, dir, started_in) = rx
        .recv()
        .map_err(|e| format!("testbed thread died: {e}"))??;
    Ok(Shared {
        kubeconfig_yaml,
        kubeconfig_path,
        server,
        dir,
        tools,
        started_in,
    })
}

/// Installs ring as the process's rustls crypto provider (idempotent).
pub fn install_crypto_provider() {
    // Err means a provider is already installed, which is fine.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// An error and all its sources, one line.
pub fn error_chain(err: &dyn std::error::Error) -> String {
    let mut out = err.to_string();
    let mut source = err.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dead_runs_etcd_data_goes_at_any_depth_and_its_logs_stay() {
        let base = std::env::temp_dir().join(format!("testbed-prune-{}", std::process::id()));
        let run = base.join("chart-install-4194303-0");
        for dir in [
            "etcd/member",
            "store-etcd/member",
            "127.0.0.9/control-plane/etcd",
            "logs",
        ] {
            std::fs::create_dir_all(run.join(dir)).unwrap();
        }
        std::fs::write(run.join("logs/etcd.log"), "kept").unwrap();
        let alive = base.join(format!("alive-{}-0", std::process::id()));
        std::fs::create_dir_all(alive.join("etcd")).unwrap();

        prune_dead_runs(&base);

        assert!(!run.join("etcd").exists());
        assert!(!run.join("store-etcd").exists());
        assert!(!run.join("127.0.0.9/control-plane/etcd").exists());
        assert!(run.join("127.0.0.9/control-plane").exists());
        assert!(run.join("logs/etcd.log").exists());
        assert!(
            alive.join("etcd").exists(),
            "a live run's data is left alone"
        );
        std::fs::remove_dir_all(&base).unwrap();
    }
}
