//! The real parts the registry's tests run on. The store (test-bed etcd), the zone
//! identities, `etcd-proxy serve` and `etcd-proxy relay` come from etcd-proxy's own test
//! support, included as [`proxy`] (see `build.rs` for how it finds its binary); this module
//! adds the `registry` processes (which must be stopped gracefully, so their pids matter),
//! the CRD, and small HTTP helpers.
#![allow(
    dead_code,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    unused_imports
)]

#[path = "../../../etcd-proxy/tests/support/mod.rs"]
pub mod proxy;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant};

use kontinuum_crds::v1alpha2::Kontinuum;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt as _};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::process::{Child, Command};

pub use proxy::{Bed, Etcd, LOCALHOST, Zone, free_port, wait_for};

/// The `registry` binary under test.
pub fn registry_bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_registry"))
}

/// Checks that `etcd-proxy` was built (the tests spawn it; `cargo test -p registry` alone
/// does not build another package's binary).
pub fn require_etcd_proxy() {
    let bin = Path::new(env!("CARGO_BIN_EXE_etcd-proxy"));
    assert!(
        bin.is_file(),
        "{} is missing: run `cargo build -p etcd-proxy` first",
        bin.display()
    );
}

/// Applies the Kontinuum CRD (both versions, no conversion stanza) and waits until it is
/// Established.
pub async fn install_kontinuum_crd(client: &Client) {
    kontinuum_e2e::install_crds(client, &[kontinuum_crds::kontinuum_crd()])
        .await
        .unwrap();
}

/// A `registry` process (hub or zone), logging to a file, killed when dropped.
pub struct Registry {
    pub name: String,
    child: Child,
    pub log: PathBuf,
    pub admin: SocketAddr,
}

impl Registry {
    /// Spawns `registry <args>` with `--admin-addr` on a free port, plain-text debug logs,
    /// the environment cleared but for `PATH` and `env`.
    pub fn spawn(name: &str, args: &[String], env: &[(&str, &str)], dir: &Path) -> Self {
        let admin = SocketAddr::new(LOCALHOST, free_port());
        let log = dir.join(format!("{name}-{}.log", admin.port()));
        let file = std::fs::File::create(&log).unwrap();
        let mut cmd = Command::new(registry_bin());
        cmd.args(args)
            .arg(format!("--admin-addr={admin}"))
            .args(["--log-level=debug", "--log-format=text"])
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .kill_on_drop(true);
        let child = cmd.spawn().unwrap();
        Self {
            name: name.into(),
            child,
            log,
            admin,
        }
    }

    pub fn pid(&self) -> Pid {
        Pid::from_raw(i32::try_from(self.child.id().expect("running")).unwrap())
    }

    /// SIGTERM: a graceful stop.
    pub fn sigterm(&self) {
        kill(self.pid(), Signal::SIGTERM).unwrap();
    }

    /// SIGKILL, and wait for it to be gone.
    pub async fn kill9(&mut self) {
        let _ = self.child.start_kill();
        let _ = self.child.wait().await;
    }

    /// Waits for the process to exit, at most `limit`.
    pub async fn exited(&mut self, limit: Duration) -> ExitStatus {
        let waited = tokio::time::timeout(limit, self.child.wait()).await;
        let tail = self.log_tail();
        waited
            .unwrap_or_else(|_| panic!("{} did not exit within {limit:?}:\n{tail}", self.name))
            .unwrap()
    }

    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    pub fn assert_alive(&mut self) {
        if let Ok(Some(status)) = self.child.try_wait() {
            panic!("{} exited ({status}):\n{}", self.name, self.log_tail());
        }
    }

    /// Waits until the admin server answers `/healthz`.
    pub async fn wait_healthy(&mut self) {
        let start = Instant::now();
        loop {
            self.assert_alive();
            if get(self.admin, "/healthz", None)
                .await
                .is_some_and(|(c, _)| c == 200)
            {
                return;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "{} did not start:\n{}",
                self.name,
                self.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The `/metrics` text.
    pub async fn metrics(&self) -> String {
        get(self.admin, "/metrics", None).await.unwrap().1
    }

    /// One sample of `/metrics`, 0 when absent.
    pub async fn metric(&self, line_prefix: &str) -> u64 {
        metric(&self.metrics().await, line_prefix)
    }
}

/// The (integer) value of the sample whose line starts with `line_prefix` (0 when absent).
pub fn metric(text: &str, line_prefix: &str) -> u64 {
    text.lines()
        .find_map(|l| {
            l.strip_prefix(line_prefix)
                .and_then(|rest| rest.trim().split(' ').next())
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// A plain HTTP/1.0 GET on loopback with an optional bearer token: `(status, body)`.
pub async fn get(addr: SocketAddr, path: &str, bearer: Option<&str>) -> Option<(u16, String)> {
    let mut stream =
        tokio::time::timeout(Duration::from_secs(5), tokio::net::TcpStream::connect(addr))
            .await
            .ok()?
            .ok()?;
    let auth = bearer.map_or_else(String::new, |t| format!("Authorization: Bearer {t}\r\n"));
    let request = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n{auth}\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut response = String::new();
    tokio::time::timeout(
        Duration::from_secs(15),
        stream.read_to_string(&mut response),
    )
    .await
    .ok()?
    .ok()?;
    let code = response.split_whitespace().nth(1)?.parse().ok()?;
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Some((code, body))
}

/// Every Kontinuum in `namespace`, by name.
pub async fn kontinuums(client: &Client, namespace: &str) -> BTreeMap<String, Kontinuum> {
    Api::<Kontinuum>::namespaced(client.clone(), namespace)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|k| (k.name_any(), k))
        .collect()
}

/// Polls (every 50 ms) until `check` holds for the Kontinuums of `namespace`; returns how
/// long that took. Fails after `limit`.
pub async fn until<F>(
    client: &Client,
    namespace: &str,
    limit: Duration,
    what: &str,
    check: F,
) -> Duration
where
    F: Fn(&BTreeMap<String, Kontinuum>) -> bool,
{
    let start = Instant::now();
    loop {
        let all = kontinuums(client, namespace).await;
        if check(&all) {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}; Kontinuums: {:?}",
            all.keys().collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
