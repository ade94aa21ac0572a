//! The real parts the acceptance tests run on: the test bed's etcd (the store) and etcdctl
//! (the client), the test bed's API server (the identity Secrets), and `etcd-proxy serve` /
//! `etcd-proxy relay` as processes of the built binary. Every wait is a bounded poll for a
//! condition; every process dies with the test (`setpriv --pdeathsig KILL`, kill-on-drop).
#![allow(
    dead_code,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::struct_field_names
)]

use std::collections::BTreeMap;
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etcd_proxy::identity::{CERT_KEY, SECRET_TYPE, labels};
use etcd_proxy::tls::{Connector, Trust, channel, client_config};
use etcd_proxy::token::Signer;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kontinuum_proto::etcd::etcdserverpb as pb;
use kube::api::{DeleteParams, ObjectMeta, PostParams};
use kube::{Api, Client};
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::process::{Child, Command};
use tonic::transport::Channel;

pub const LOCALHOST: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// Polls `check` every 50 ms until it returns `Some`, for at most `limit`.
pub async fn wait_for<T, F, Fut>(what: &str, limit: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            start.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub fn free_port() -> u16 {
    kontinuum_testbed::free_port(LOCALHOST).unwrap()
}

pub fn tools() -> kontinuum_testbed::Tools {
    kontinuum_testbed::Tools::locate().expect("test-bed tools")
}

/// A child process logging to a file.
pub struct Proc {
    pub name: String,
    child: Child,
    pub log: PathBuf,
}

impl Proc {
    pub fn spawn(name: &str, bin: &Path, args: &[String], log: PathBuf) -> Self {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .unwrap();
        let child = Command::new("setpriv")
            .args(["--pdeathsig", "KILL", "--"])
            .arg(bin)
            .args(args)
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        Self {
            name: name.into(),
            child,
            log,
        }
    }

    /// SIGKILL, and wait for it to be gone.
    pub async fn kill9(&mut self) {
        let _ = self.child.start_kill();
        let _ = self.child.wait().await;
    }

    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    pub fn assert_alive(&mut self) {
        if let Ok(Some(status)) = self.child.try_wait() {
            panic!("{} exited ({status}):\n{}", self.name, self.log_tail());
        }
    }
}

pub async fn wait_tcp(proc: &mut Proc, addr: SocketAddr) {
    let start = Instant::now();
    loop {
        proc.assert_alive();
        if tokio::net::TcpStream::connect(addr).await.is_ok() {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{} did not listen on {addr}:\n{}",
            proc.name,
            proc.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The store: one etcd on loopback.
pub struct Etcd {
    pub proc: Proc,
    pub url: String,
}

impl Etcd {
    pub async fn start(dir: &Path) -> Self {
        let client = free_port();
        let peer = free_port();
        let url = format!("http://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let args = vec![
            "--name=default".to_string(),
            format!("--data-dir={}", dir.join("etcd").display()),
            format!("--listen-client-urls={url}"),
            format!("--advertise-client-urls={url}"),
            format!("--listen-peer-urls={peer_url}"),
            format!("--initial-advertise-peer-urls={peer_url}"),
            format!("--initial-cluster=default={peer_url}"),
            "--unsafe-no-fsync=true".into(),
            "--log-level=warn".into(),
        ];
        let mut proc = Proc::spawn("etcd", &tools().path("etcd"), &args, dir.join("etcd.log"));
        let store = Self::channel_to(&url);
        wait_for("etcd to answer", Duration::from_secs(30), || {
            proc.assert_alive();
            let store = store.clone();
            async move {
                pb::kv_client::KvClient::new(store)
                    .range(pb::RangeRequest {
                        key: b"x".to_vec(),
                        ..Default::default()
                    })
                    .await
                    .ok()
            }
        })
        .await;
        Self { proc, url }
    }

    fn channel_to(url: &str) -> Channel {
        channel(url.parse().unwrap(), Connector::new(None))
    }

    pub fn kv(&self) -> pb::kv_client::KvClient<Channel> {
        pb::kv_client::KvClient::new(Self::channel_to(&self.url))
    }

    pub fn lease(&self) -> pb::lease_client::LeaseClient<Channel> {
        pb::lease_client::LeaseClient::new(Self::channel_to(&self.url))
    }

    /// Every key and value, and the revision: what "the store is unchanged" compares.
    pub async fn snapshot(&self) -> (i64, Vec<(String, String)>) {
        let resp = self
            .kv()
            .range(pb::RangeRequest {
                key: vec![0],
                range_end: vec![0],
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        let kvs = resp
            .kvs
            .iter()
            .map(|kv| {
                (
                    String::from_utf8_lossy(&kv.key).into_owned(),
                    String::from_utf8_lossy(&kv.value).into_owned(),
                )
            })
            .collect();
        (resp.header.unwrap().revision, kvs)
    }

    pub async fn put(&self, key: &str, value: &str) {
        self.kv()
            .put(pb::PutRequest {
                key: key.into(),
                value: value.into(),
                ..Default::default()
            })
            .await
            .unwrap();
    }

    pub async fn get(&self, key: &str) -> Option<String> {
        let resp = self
            .kv()
            .range(pb::RangeRequest {
                key: key.into(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        resp.kvs
            .first()
            .map(|kv| String::from_utf8_lossy(&kv.value).into_owned())
    }

    pub async fn lease_ttl(&self, id: i64) -> i64 {
        self.lease()
            .lease_time_to_live(pb::LeaseTimeToLiveRequest { id, keys: false })
            .await
            .unwrap()
            .into_inner()
            .ttl
    }
}

/// A zone's identity: an ed25519 key and its self-signed certificate, as the zone-installer
/// issues them, in a directory laid out like the mounted Secret (`tls.key`, `tls.crt`).
pub struct Zone {
    pub region: String,
    pub zone: String,
    pub name: String,
    pub dir: PathBuf,
    pub cert_pem: String,
    pub key_pem: String,
}

impl Zone {
    pub fn new(base: &Path, region: &str, zone: &str) -> Self {
        let name = format!("{region}-{zone}");
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name.clone());
        let cert = params.self_signed(&key).unwrap();
        let dir = base.join(format!("identity-{name}"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("tls.crt"), cert.pem()).unwrap();
        std::fs::write(dir.join("tls.key"), key.serialize_pem()).unwrap();
        Self {
            region: region.into(),
            zone: zone.into(),
            name,
            dir,
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    }

    /// `/kontinuum.sh/zones/<region>/<zone>/`.
    pub fn prefix(&self) -> String {
        format!("/kontinuum.sh/zones/{}/{}/", self.region, self.zone)
    }

    pub fn signer(&self) -> Signer {
        Signer::from_pkcs8_pem(self.key_pem.as_bytes(), self.name.clone()).unwrap()
    }

    /// The hub Secret, as the zone-installer writes it.
    pub fn secret(&self) -> Secret {
        Secret {
            metadata: ObjectMeta {
                name: Some(format!("{}-identity", self.name)),
                labels: Some(labels(&self.region, &self.zone)),
                ..Default::default()
            },
            type_: Some(SECRET_TYPE.into()),
            data: Some(BTreeMap::from([(
                CERT_KEY.to_string(),
                ByteString(self.cert_pem.clone().into_bytes()),
            )])),
            ..Default::default()
        }
    }
}

/// One test's world: a store, a namespace for identity Secrets, the proxy's serving
/// certificate, and the processes.
pub struct Bed {
    pub dir: PathBuf,
    pub etcd: Etcd,
    pub client: Client,
    pub namespace: String,
    pub kubeconfig: PathBuf,
    pub ca: PathBuf,
    pub tls_cert: PathBuf,
    pub tls_key: PathBuf,
    pub proxy_addr: SocketAddr,
    pub proxy_admin: SocketAddr,
    pub proxy: Option<Proc>,
    starts: usize,
}

impl Bed {
    pub async fn new(name: &str) -> Self {
        kontinuum_testbed::install_crypto_provider();
        let shared = kontinuum_testbed::shared().expect("test-bed control plane");
        let client = shared.client().await.unwrap();
        let dir = kontinuum_testbed::unique_dir(&format!("etcd-proxy-{name}"));
        std::fs::create_dir_all(&dir).unwrap();
        let etcd = Etcd::start(&dir).await;

        let namespace = format!("{name}-{}", std::process::id());
        let ns: Namespace = serde_json::from_value(serde_json::json!({
            "metadata": {"name": namespace}
        }))
        .unwrap();
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .unwrap();

        let ca = kontinuum_testbed::CertificateAuthority::generate("etcd-proxy-test-ca").unwrap();
        let serving = ca.server("etcd-proxy", &[LOCALHOST], &[]).unwrap();
        let (ca_path, tls_cert, tls_key) = (
            dir.join("ca.crt"),
            dir.join("proxy.crt"),
            dir.join("proxy.key"),
        );
        std::fs::write(&ca_path, &ca.cert_pem).unwrap();
        std::fs::write(&tls_cert, &serving.cert_pem).unwrap();
        std::fs::write(&tls_key, &serving.key_pem).unwrap();

        Self {
            dir,
            etcd,
            client,
            namespace,
            kubeconfig: shared.kubeconfig_path.clone(),
            ca: ca_path,
            tls_cert,
            tls_key,
            proxy_addr: SocketAddr::new(LOCALHOST, free_port()),
            proxy_admin: SocketAddr::new(LOCALHOST, free_port()),
            proxy: None,
            starts: 0,
        }
    }

    pub fn secrets(&self) -> Api<Secret> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    pub async fn admit(&self, zone: &Zone) {
        self.secrets()
            .create(&PostParams::default(), &zone.secret())
            .await
            .unwrap();
    }

    pub async fn revoke(&self, zone: &Zone) {
        self.secrets()
            .delete(&format!("{}-identity", zone.name), &DeleteParams::default())
            .await
            .unwrap();
    }

    /// Starts (or restarts) `etcd-proxy serve` on the bed's fixed address, and waits until
    /// it listens (which it does only once its identity index has synced).
    pub async fn start_proxy(&mut self) {
        self.starts += 1;
        let args = vec![
            "serve".to_string(),
            format!("--listen={}", self.proxy_addr),
            format!("--store={}", self.etcd.url),
            format!("--tls-cert={}", self.tls_cert.display()),
            format!("--tls-key={}", self.tls_key.display()),
            format!("--namespace={}", self.namespace),
            format!("--kubeconfig={}", self.kubeconfig.display()),
            format!("--admin-addr={}", self.proxy_admin),
            "--log-level=debug".into(),
            "--log-format=text".into(),
        ];
        let mut proc = Proc::spawn(
            "etcd-proxy serve",
            Path::new(env!("CARGO_BIN_EXE_etcd-proxy")),
            &args,
            self.dir.join(format!("proxy-{}.log", self.starts)),
        );
        wait_tcp(&mut proc, self.proxy_addr).await;
        self.proxy = Some(proc);
    }

    pub async fn kill_proxy(&mut self) {
        if let Some(mut proc) = self.proxy.take() {
            proc.kill9().await;
        }
    }

    /// Starts `etcd-proxy relay` for `zone` on `listen` (`host:port` or `unix:///path`).
    pub async fn start_relay(&self, zone: &Zone, listen: &str) -> Relay {
        let admin = SocketAddr::new(LOCALHOST, free_port());
        let args = vec![
            "relay".to_string(),
            format!("--listen={listen}"),
            format!("--endpoint=https://{}", self.proxy_addr),
            format!("--ca={}", self.ca.display()),
            format!("--identity-dir={}", zone.dir.display()),
            format!("--zone={}", zone.name),
            format!("--admin-addr={admin}"),
            "--log-level=debug".into(),
            "--log-format=text".into(),
        ];
        let mut proc = Proc::spawn(
            &format!("etcd-proxy relay {}", zone.name),
            Path::new(env!("CARGO_BIN_EXE_etcd-proxy")),
            &args,
            self.dir.join(format!("relay-{}.log", zone.name)),
        );
        if let Some(path) = listen.strip_prefix("unix://") {
            let path = PathBuf::from(path);
            wait_for("the relay's socket", Duration::from_secs(30), || {
                proc.assert_alive();
                let path = path.clone();
                async move {
                    tokio::net::UnixStream::connect(&path)
                        .await
                        .ok()
                        .map(|_| ())
                }
            })
            .await;
        } else {
            wait_tcp(&mut proc, listen.parse().unwrap()).await;
        }
        Relay { proc, admin }
    }

    /// A TLS channel straight to the proxy (for tests that bring their own tokens).
    pub fn proxy_channel(&self) -> Channel {
        let tls = client_config(&Trust::CaFile(self.ca.clone()), None).unwrap();
        channel(
            format!("https://{}", self.proxy_addr).parse().unwrap(),
            Connector::new(Some(tls)),
        )
    }

    /// The proxy's `/metrics` text.
    pub async fn proxy_metrics(&self) -> String {
        metrics(self.proxy_admin).await
    }
}

/// A running relay and its admin address.
pub struct Relay {
    pub proc: Proc,
    pub admin: SocketAddr,
}

/// The `/metrics` text of an admin server.
pub async fn metrics(admin: SocketAddr) -> String {
    {
        let mut conn = tokio::net::TcpStream::connect(admin).await.unwrap();
        conn.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut out = String::new();
        let mut reader = BufReader::new(conn);
        let mut line = String::new();
        while reader.read_line(&mut line).await.unwrap() > 0 {
            out.push_str(&line);
            line.clear();
        }
        out
    }
}

/// What one etcdctl run printed.
#[derive(Debug)]
pub struct Ctl {
    pub ok: bool,
    pub stdout: String,
    pub stderr: String,
}

impl Ctl {
    pub fn denied(&self) -> bool {
        !self.ok && self.stderr.contains("PermissionDenied")
    }
}

/// Runs `etcdctl --endpoints=<endpoint> args...` (with `stdin` when given).
pub async fn etcdctl(endpoint: &str, args: &[&str], stdin: Option<&str>) -> Ctl {
    let mut cmd = Command::new(tools().path("etcdctl"));
    cmd.arg(format!("--endpoints={endpoint}"))
        .args(["--dial-timeout=5s", "--command-timeout=10s"])
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = cmd.spawn().unwrap();
    if let Some(input) = stdin {
        let mut pipe = child.stdin.take().unwrap();
        pipe.write_all(input.as_bytes()).await.unwrap();
        drop(pipe);
    }
    let out = tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
        .await
        .expect("etcdctl hung")
        .unwrap();
    Ctl {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// A long-running etcdctl (watch, lease keep-alive) whose output lines are collected.
pub struct Background {
    child: Child,
    pub lines: Arc<Mutex<Vec<String>>>,
    pub errors: Arc<Mutex<Vec<String>>>,
}

impl Background {
    pub fn start(endpoint: &str, args: &[&str]) -> Self {
        let mut child = Command::new(tools().path("etcdctl"))
            .arg(format!("--endpoints={endpoint}"))
            .arg("--dial-timeout=5s")
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let errors = Arc::new(Mutex::new(Vec::new()));
        for (pipe, sink) in [
            (
                Box::new(child.stdout.take().unwrap())
                    as Box<dyn tokio::io::AsyncRead + Send + Unpin>,
                Arc::clone(&lines),
            ),
            (Box::new(child.stderr.take().unwrap()), Arc::clone(&errors)),
        ] {
            tokio::spawn(async move {
                let mut reader = BufReader::new(pipe).lines();
                while let Ok(Some(line)) = reader.next_line().await {
                    sink.lock().unwrap().push(line);
                }
            });
        }
        Self {
            child,
            lines,
            errors,
        }
    }

    pub fn lines(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }

    pub fn stderr(&self) -> String {
        self.errors.lock().unwrap().join("\n")
    }

    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().unwrap()
    }

    /// The keys of the PUT events seen so far, in order (`etcdctl watch` prints
    /// `PUT`, key, value per event).
    pub fn put_keys(&self) -> Vec<String> {
        let lines = self.lines();
        lines
            .windows(2)
            .filter(|w| w[0] == "PUT")
            .map(|w| w[1].clone())
            .collect()
    }
}
