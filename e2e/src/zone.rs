//! Zones in tests: the zone's way back to the hub as real processes (DESIGN section 3) — the
//! Kontinuum store (the test bed's etcd, [`Store`]), the public `etcd-proxy serve` with a
//! serving certificate from a test CA, and `registry hub` mirroring registrations into
//! Kontinuum objects, each logging to a file of the test's directory and dying with the
//! test — and waiting for a Zone's conditions.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context as _;
use kontinuum_crds::conditions;
use kontinuum_crds::v1alpha2::Zone;
use kube::{Api, Client};
use tokio::process::{Child, Command};

use crate::chart::Store;
use crate::testbed::{CertificateAuthority, Shared, free_port};
use crate::{eventually, workspace_binary};

const LOOPBACK: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// How long a process may take to start listening.
const START: Duration = Duration::from_secs(120);

/// Spawns `bin args` with `env`, its output appended to `<dir>/<name>.log`, killed when
/// dropped.
pub fn spawn_logged(
    dir: &Path,
    name: &str,
    bin: &Path,
    args: &[String],
    env: &[(&str, &str)],
) -> anyhow::Result<Child> {
    let path = dir.join(format!("{name}.log"));
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    Command::new(bin)
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {name} ({})", bin.display()))
}

/// Waits until something accepts TCP connections at `addr`.
pub async fn listening(addr: SocketAddr, what: &str) -> anyhow::Result<()> {
    eventually(START, what, || async {
        Ok(tokio::net::TcpStream::connect(addr).await.is_ok())
    })
    .await
}

/// The hub's side of the zone join: store, proxy and registry, watching one namespace.
pub struct HubJoin {
    /// The store's etcd (`store.endpoint` is its client URL).
    pub store: Store,
    /// Where `etcd-proxy serve` listens (TLS).
    pub proxy: SocketAddr,
    /// The proxy's admin server (`/metrics`).
    pub proxy_admin: SocketAddr,
    /// The CA of the proxy's serving certificate, a PEM file (the zone-installer's
    /// `--proxy-ca-file`).
    pub proxy_ca: PathBuf,
    /// `registry hub`'s admin server.
    pub registry_admin: SocketAddr,
    /// `etcd-proxy serve`, then `registry hub`.
    processes: [HubProcess; 2],
}

/// One of the hub's processes of a [`HubJoin`], to kill and restart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HubPart {
    /// `etcd-proxy serve`.
    Proxy,
    /// `registry hub`.
    Registry,
}

/// A running hub process and how to start it again.
struct HubProcess {
    dir: PathBuf,
    name: &'static str,
    bin: PathBuf,
    args: Vec<String>,
    env: Vec<(&'static str, &'static str)>,
    /// Where it listens once started.
    listens: SocketAddr,
    child: Child,
}

impl HubProcess {
    /// Starts workspace binary `binary` as `name` (its log `<dir>/<name>.log`) and waits
    /// until it listens at `listens`.
    async fn start(
        dir: &Path,
        (name, binary): (&'static str, &str),
        args: Vec<String>,
        env: Vec<(&'static str, &'static str)>,
        listens: SocketAddr,
    ) -> anyhow::Result<Self> {
        let bin = workspace_binary(binary)?;
        let child = spawn_logged(dir, name, &bin, &args, &env)?;
        listening(listens, name).await?;
        Ok(Self {
            dir: dir.to_path_buf(),
            name,
            bin,
            args,
            env,
            listens,
            child,
        })
    }
}

impl HubJoin {
    /// Starts the store, `etcd-proxy serve` (zone identity Secrets read from `namespace`)
    /// and `registry hub` (Kontinuum objects in `namespace`, anonymous auth, `registry`
    /// added to its flags), all in `dir`, and waits until each listens.
    pub async fn start(
        shared: &Shared,
        dir: &Path,
        namespace: &str,
        registry: &[String],
    ) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let store = Store::start(&shared.tools, dir, LOOPBACK).await?;
        let ca = CertificateAuthority::generate("kontinuum-e2e-proxy-ca")?;
        let serving = ca.server("etcd-proxy", &[LOOPBACK], &[])?;
        let (proxy_ca, cert, key) = (
            dir.join("proxy-ca.crt"),
            dir.join("proxy.crt"),
            dir.join("proxy.key"),
        );
        std::fs::write(&proxy_ca, &ca.cert_pem)?;
        std::fs::write(&cert, &serving.cert_pem)?;
        std::fs::write(&key, &serving.key_pem)?;
        let port = || -> anyhow::Result<SocketAddr> {
            Ok(SocketAddr::new(LOOPBACK, free_port(LOOPBACK)?))
        };
        let (proxy, proxy_admin, registry_admin) = (port()?, port()?, port()?);
        let kubeconfig = format!("--kubeconfig={}", shared.kubeconfig_path.display());
        let logs = [
            "--log-format=text".to_owned(),
            "--log-level=info".to_owned(),
        ];
        let mut proxy_args = vec![
            "serve".to_owned(),
            format!("--listen={proxy}"),
            format!("--store={}", store.endpoint),
            format!("--tls-cert={}", cert.display()),
            format!("--tls-key={}", key.display()),
            format!("--namespace={namespace}"),
            kubeconfig.clone(),
            format!("--admin-addr={proxy_admin}"),
        ];
        proxy_args.extend(logs.iter().cloned());
        let etcd_proxy = HubProcess::start(
            dir,
            ("etcd-proxy", "etcd-proxy"),
            proxy_args,
            Vec::new(),
            proxy,
        )
        .await?;
        let mut registry_args = vec![
            "hub".to_owned(),
            kubeconfig,
            format!("--namespace={namespace}"),
            "--name=hub".to_owned(),
            format!("--store={}", store.endpoint),
            format!("--admin-addr={registry_admin}"),
            format!("--webhook-addr=127.0.0.1:{}", free_port(LOOPBACK)?),
        ];
        registry_args.extend(logs.iter().cloned());
        registry_args.extend(registry.iter().cloned());
        let registry = HubProcess::start(
            dir,
            ("registry-hub", "registry"),
            registry_args,
            vec![("KONTINUUM_INSECURE_ALLOW_ANONYMOUS", "true")],
            registry_admin,
        )
        .await?;
        Ok(Self {
            store,
            proxy,
            proxy_admin,
            proxy_ca,
            registry_admin,
            processes: [etcd_proxy, registry],
        })
    }

    /// Kills `part` with SIGKILL, as a crash would, starts it again with the same command
    /// line (its log appended to), and waits until it listens again.
    pub async fn restart(&mut self, part: HubPart) -> anyhow::Result<()> {
        let process = &mut self.processes[match part {
            HubPart::Proxy => 0,
            HubPart::Registry => 1,
        }];
        if process.child.try_wait()?.is_none() {
            process.child.kill().await?;
        }
        process.child = spawn_logged(
            &process.dir,
            process.name,
            &process.bin,
            &process.args,
            &process.env,
        )?;
        listening(process.listens, process.name).await
    }
}

/// `(status, reason, message)` of the condition `type_` of Zone `namespace/name`, if the
/// Zone and the condition exist.
pub async fn zone_condition(
    client: &Client,
    namespace: &str,
    name: &str,
    type_: &str,
) -> Option<(String, String, String)> {
    let zone = Api::<Zone>::namespaced(client.clone(), namespace)
        .get_opt(name)
        .await
        .ok()??;
    zone.status.and_then(|s| {
        conditions::get(&s.conditions, type_)
            .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
    })
}

/// Waits (up to `limit`) until the Zone's condition `type_` has `status` and `reason` (any
/// reason when `reason` is empty), and returns it as `(status, reason, message)`; the error
/// names the last condition seen.
pub async fn wait_zone_condition(
    client: &Client,
    namespace: &str,
    name: &str,
    (type_, status, reason): (&str, &str, &str),
    limit: Duration,
) -> anyhow::Result<(String, String, String)> {
    let what = format!("Zone {name} {type_}={status}/{reason}");
    let matches =
        |(s, r, _): &(String, String, String)| s == status && (reason.is_empty() || r == reason);
    let result = eventually(limit, &what, || async {
        Ok(zone_condition(client, namespace, name, type_)
            .await
            .is_some_and(|c| matches(&c)))
    })
    .await;
    let last = zone_condition(client, namespace, name, type_).await;
    match (result, last) {
        (Ok(()), Some(last)) if matches(&last) => Ok(last),
        (Ok(()), last) => anyhow::bail!("{what}: it changed again at once, to {last:?}"),
        (Err(e), last) => Err(e.context(format!("last {type_}: {last:?}"))),
    }
}
