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

/// Spawns `bin args` with `env`, its output in `<dir>/<name>.log`, killed when dropped.
pub fn spawn_logged(
    dir: &Path,
    name: &str,
    bin: &Path,
    args: &[String],
    env: &[(&str, &str)],
) -> anyhow::Result<Child> {
    let path = dir.join(format!("{name}.log"));
    let log =
        std::fs::File::create(&path).with_context(|| format!("creating {}", path.display()))?;
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
    _processes: Vec<Child>,
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
        let etcd_proxy = spawn_logged(
            dir,
            "etcd-proxy",
            &workspace_binary("etcd-proxy")?,
            &proxy_args,
            &[],
        )?;
        listening(proxy, "etcd-proxy serve").await?;
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
        let registry = spawn_logged(
            dir,
            "registry-hub",
            &workspace_binary("registry")?,
            &registry_args,
            &[("KONTINUUM_INSECURE_ALLOW_ANONYMOUS", "true")],
        )?;
        listening(registry_admin, "registry hub").await?;
        Ok(Self {
            store,
            proxy,
            proxy_admin,
            proxy_ca,
            registry_admin,
            _processes: vec![etcd_proxy, registry],
        })
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
