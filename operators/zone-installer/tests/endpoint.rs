//! Issue 12, acceptance 1 and 3, against the real test bed with emulated Talos machines and
//! every operator as a process (nothing standing in for one; cert-manager and the Gateway
//! data plane are the `e2e/standins` binaries, as DESIGN section 5 allows):
//!
//! 1. `kubectl-kontinuum zone add --domain .. --wait` (the built plugin) exits 0 once the
//!    Zone is Ready: the emulated machine bootstrapped into a real zone control plane, its
//!    addons installed (the real Gateway API and cert-manager CRDs), the footprint installed,
//!    the zone agent (run by the zone cluster's hostlet) heartbeating through the hub's
//!    `etcd-proxy serve` into `registry hub`'s Kontinuum. In the zone cluster the
//!    cert-manager stand-in signs the zone's ACME certificate from a test CA and the gateway
//!    stand-in serves the zone's Gateway; an HTTPS request to
//!    `https://<zone>.<region>.<domain>:<443+offset>/version` (connected to the stand-in's
//!    listen IP, SNI = the host) verifies the certificate, issued for exactly that name,
//!    against the test CA, and gets the agent's answer.
//! 2. Two zones in two regions at once, from two emulated machines, both Ready: A with
//!    `zone add --wait`, B the GitOps way (acceptance 2), its `zone add --dry-run=client -o
//!    yaml` manifest applied with `kubectl apply`; re-applying it to the Ready zone writes
//!    nothing (the API server's audit log shows no write to B's Zone, TalosCluster or
//!    InstancePool by anyone over the window after it). Then zone A's real identity (its
//!    key read from A's cluster) through an `etcd-proxy relay` reads A's own registration
//!    but is refused (`PermissionDenied`) zone B's.
//! 3. The hub in OIDC mode with a private issuer (an in-process `TestIssuer` whose serving
//!    certificate chains to a test CA, given to the zone-installer as `--oidc-ca-file`):
//!    the zone's agent gets the mode and that CA (ConfigMap `kontinuum-ca`, mounted), so the
//!    zone endpoint over the gateway answers `401` without a token, `403` for a valid
//!    non-admin token and `200` for a valid admin token (a `503` would mean the agent
//!    could not verify the issuer).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::large_futures,
    clippy::too_many_lines,
    clippy::print_stderr
)]

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::jiff::Timestamp;
use kontinuum_auth::testing::{TestIssuer, TestKey};
use kontinuum_crds::conditions;
use kontinuum_crds::v1alpha2::{Kontinuum, Zone};
use kontinuum_e2e::addons::{ChartRepo, start_addon_installer_with_role};
use kontinuum_e2e::bootstrapper::{start_operators, stored_kubeconfig};
use kontinuum_e2e::testbed::{CertificateAuthority, Shared, Tools, free_port, unique_dir};
use kontinuum_e2e::zone::{HubJoin, spawn_logged, wait_zone_condition, zone_condition};
use kontinuum_e2e::{
    AuditEvent, Operator, eventually, install_kontinuum_crds, namespace,
    service_account_kubeconfig, shared_client, workspace_binary,
};
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams};
use kube::{Api, Client, ResourceExt as _};
use serde_json::json;
use talos_emulator::{Emulator, Settings};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::process::{Child, Command};

/// Deadline of every wait: the machine is shared with other test runs.
const LIMIT: Duration = Duration::from_secs(600);
const LOOPBACK: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);
/// The zone-installer's default GatewayClass, created in the zone cluster for the stand-in.
const GATEWAY_CLASS: &str = "cilium";
/// The gateway stand-in's own controller name (its default).
const STANDIN_CONTROLLER: &str = "kontinuum.sh/gateway-standin";
/// The zone's namespace in its cluster.
const SYSTEM: &str = "kontinuum-system";

/// [`spawn_logged`], which must start.
fn spawn(dir: &Path, name: &str, bin: &Path, args: &[String], env: &[(&str, &str)]) -> Child {
    spawn_logged(dir, name, bin, args, env).unwrap()
}

/// The hub side of one test: its namespace, the Kontinuum store (etcd), the public
/// `etcd-proxy serve` (TLS from a test CA), `registry hub`, every operator of the zone flow
/// as a process, the fixture chart mirror, and the emulated machines.
struct Hub {
    client: Client,
    shared: &'static Shared,
    ns: String,
    dir: PathBuf,
    /// The proxy's address.
    proxy: SocketAddr,
    /// The proxy CA (PEM file).
    proxy_ca: PathBuf,
    /// The store's client URL.
    store: String,
    emulator: Emulator,
    _join: HubJoin,
    _operators: Vec<Operator>,
    _repo: ChartRepo,
}

impl Hub {
    /// [`Hub::start_with_auth`] in anonymous mode.
    async fn start(prefix: &str, machines: usize, first: Ipv4Addr) -> Self {
        Self::start_with_auth(
            prefix,
            machines,
            first,
            &["--insecure-allow-anonymous".into(), "true".into()],
        )
        .await
    }

    /// The hub, its zone-installer started with `auth` (the auth mode it mirrors into zones).
    async fn start_with_auth(
        prefix: &str,
        machines: usize,
        first: Ipv4Addr,
        auth: &[String],
    ) -> Self {
        let (client, shared) = shared_client().await.unwrap();
        install_kontinuum_crds(&client).await.unwrap();
        let ns = namespace(&client, prefix).await.unwrap();
        let dir = unique_dir(prefix);
        std::fs::create_dir_all(&dir).unwrap();
        let join = HubJoin::start(shared, &dir, &ns, &[]).await.unwrap();
        let (proxy, proxy_ca, store) = (
            join.proxy,
            join.proxy_ca.clone(),
            join.store.endpoint.clone(),
        );

        // The machines, in maintenance mode; bootstrapped clusters get hostlet nodes that
        // run our image's binaries (the zone agent and its relay) for real.
        let emulator = Emulator::start(Settings {
            machines,
            first_address: first,
            port: 50000,
            api_port: 6443,
            dir: unique_dir(&format!("emulator-{prefix}")),
            control_addr: None,
        })
        .await
        .unwrap();

        // Every operator of the zone flow, each as its own ServiceAccount.
        let (mut operators, _) = start_operators(
            &client,
            shared,
            &ns,
            &workspace_binary("talos-bootstrapper").unwrap(),
            &[],
        )
        .await
        .unwrap();
        let repo = ChartRepo::serve(&Tools::locate().unwrap()).await.unwrap();
        operators.push(
            start_addon_installer_with_role(
                &client,
                shared,
                &ns,
                &repo.url,
                &["--resync-interval", "2s"],
            )
            .await
            .unwrap(),
        );
        let kubeconfig =
            service_account_kubeconfig(&client, shared, &ns, "zone-installer", "cluster-admin")
                .await
                .unwrap();
        // Production defaults otherwise: ACME issuer, GatewayClass `cilium`, the agent image
        // `kontinuum:<version>` (mapped to our binaries by the hostlets).
        let mut args: Vec<String> = vec![
            "--namespace".into(),
            ns.clone(),
            "--hub-grpc-endpoint".into(),
            proxy.to_string(),
            "--proxy-ca-file".into(),
            proxy_ca.to_string_lossy().into_owned(),
            "--acme-email".into(),
            "ops@example.com".into(),
            "--retry-interval".into(),
            "1s".into(),
        ];
        args.extend_from_slice(auth);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        operators.push(
            Operator::start(
                Path::new(env!("CARGO_BIN_EXE_zone-installer")),
                "zone-installer",
                &kubeconfig,
                &args,
            )
            .await
            .unwrap(),
        );
        Self {
            client,
            shared,
            ns,
            dir,
            proxy,
            proxy_ca,
            store,
            emulator,
            _join: join,
            _operators: operators,
            _repo: repo,
        }
    }

    /// Stops the emulated machines (and with them the zone clusters).
    async fn stop(self) {
        self.emulator.shutdown().await;
    }

    /// `kubectl-kontinuum -n <ns> zone add ... --wait` as a process (logs in the hub's dir).
    fn zone_add(&self, region: &str, zone: &str, address: Ipv4Addr, extra: &[&str]) -> Child {
        let mut args: Vec<String> = vec![
            format!("--kubeconfig={}", self.shared.kubeconfig_path.display()),
            format!("--namespace={}", self.ns),
            "zone".into(),
            "add".into(),
            format!("--region={region}"),
            format!("--zone={zone}"),
            format!("--talos-address={address}"),
            "--wait".into(),
            format!("--timeout={}s", LIMIT.as_secs()),
        ];
        args.extend(extra.iter().map(|a| (*a).to_owned()));
        spawn(
            &self.dir,
            &format!("zone-add-{region}-{zone}"),
            &workspace_binary("kubectl-kontinuum").unwrap(),
            &args,
            &[],
        )
    }

    /// The Zone manifest a GitOps repository holds for the zone: `kubectl-kontinuum zone add
    /// ... --dry-run=client -o yaml`, which writes nothing.
    async fn manifest(&self, region: &str, zone: &str, address: Ipv4Addr) -> String {
        let out = Command::new(workspace_binary("kubectl-kontinuum").unwrap())
            .arg(format!(
                "--kubeconfig={}",
                self.shared.kubeconfig_path.display()
            ))
            .arg(format!("--namespace={}", self.ns))
            .args(["zone", "add", "--dry-run=client", "-o", "yaml"])
            .arg(format!("--region={region}"))
            .arg(format!("--zone={zone}"))
            .arg(format!("--talos-address={address}"))
            .stdin(Stdio::null())
            .output()
            .await
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    }

    /// `kubectl apply -f -` of `manifest`, as the test bed's admin (a GitOps tool's apply):
    /// kubectl's output.
    async fn kubectl_apply(&self, manifest: &str) -> String {
        let mut child = Command::new(self.shared.tools.path("kubectl"))
            .arg(format!(
                "--kubeconfig={}",
                self.shared.kubeconfig_path.display()
            ))
            .args(["apply", "-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(manifest.as_bytes()).await.unwrap();
        drop(stdin);
        let out = child.wait_with_output().await.unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "kubectl apply: {text}");
        text
    }

    /// Waits for the Zone `name` to be `Ready=True`.
    async fn ready(&self, name: &str) {
        wait_zone_condition(
            &self.client,
            &self.ns,
            name,
            ("Ready", "True", "Ready"),
            LIMIT,
        )
        .await
        .unwrap();
    }

    /// Every write in the test bed's audit log received at or after `since` whose URI
    /// contains one of `needles`: `verb uri (user)`.
    fn writes_since(&self, since: Timestamp, needles: &[String]) -> Vec<String> {
        let text = std::fs::read_to_string(self.shared.audit_log()).unwrap();
        text.lines()
            .filter_map(|line| serde_json::from_str::<AuditEvent>(line).ok())
            .filter(AuditEvent::is_write)
            .filter(|e| {
                e.request_received_timestamp
                    .parse::<Timestamp>()
                    .is_ok_and(|t| t >= since)
            })
            .filter(|e| needles.iter().any(|n| e.request_u_r_i.contains(n.as_str())))
            .map(|e| format!("{} {} ({})", e.verb, e.request_u_r_i, e.user.username))
            .collect()
    }

    /// Waits for `zone add` to exit and asserts it exited 0 with the Zone Ready.
    async fn added(&self, mut plugin: Child, name: &str) {
        let status = tokio::time::timeout(LIMIT + Duration::from_secs(30), plugin.wait())
            .await
            .unwrap_or_else(|_| panic!("zone add {name} did not return"))
            .unwrap();
        let log = std::fs::read_to_string(self.dir.join(format!("zone-add-{name}.log")))
            .unwrap_or_default();
        let ready = self.condition(name, "Ready").await;
        assert!(
            status.success(),
            "zone add {name}: {status}; Ready {ready:?}; output:\n{log}"
        );
        assert_eq!(
            ready.as_ref().map(|(s, r, _)| (s.as_str(), r.as_str())),
            Some(("True", "Ready")),
            "{ready:?}"
        );
    }

    async fn condition(&self, name: &str, type_: &str) -> Option<(String, String, String)> {
        zone_condition(&self.client, &self.ns, name, type_).await
    }

    /// The zone cluster's kubeconfig, once the bootstrapper stored it.
    async fn zone_kubeconfig(&self, name: &str) -> String {
        eventually(LIMIT, &format!("the kubeconfig of {name}"), || async {
            Ok(stored_kubeconfig(&self.client, &self.ns, name)
                .await
                .is_ok())
        })
        .await
        .unwrap();
        stored_kubeconfig(&self.client, &self.ns, name)
            .await
            .unwrap()
    }

    /// Asserts a Kontinuum of `region`/`zone` is heartbeating on the hub.
    async fn heartbeating(&self, region: &str, zone: &str) {
        let kontinuums = Api::<Kontinuum>::namespaced(self.client.clone(), &self.ns);
        eventually(
            LIMIT,
            &format!("the Kontinuum of {region}/{zone} heartbeating"),
            || async {
                Ok(kontinuums
                    .list(&ListParams::default())
                    .await?
                    .items
                    .iter()
                    .any(|k| {
                        k.spec.region.as_deref() == Some(region)
                            && k.spec.zone.as_deref() == Some(zone)
                            && k.status.as_ref().is_some_and(|s| {
                                s.last_heartbeat_time.is_some()
                                    && conditions::get(&s.conditions, "Heartbeating")
                                        .is_some_and(|c| c.status == "True")
                            })
                    }))
            },
        )
        .await
        .unwrap();
    }

    /// `etcdctl --endpoints=<endpoint> args...`: (success, stdout, stderr).
    async fn etcdctl(&self, endpoint: &str, args: &[&str]) -> (bool, String, String) {
        let out = tokio::time::timeout(
            Duration::from_secs(60),
            Command::new(self.shared.tools.path("etcdctl"))
                .arg(format!("--endpoints={endpoint}"))
                .args(["--dial-timeout=10s", "--command-timeout=20s"])
                .args(args)
                .stdin(Stdio::null())
                .kill_on_drop(true)
                .output(),
        )
        .await
        .expect("etcdctl hung")
        .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }
}

fn dynamic(client: &Client, gvk: (&str, &str, &str), plural: &str) -> Api<DynamicObject> {
    let (group, version, kind) = gvk;
    let resource =
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural);
    Api::all_with(client.clone(), &resource)
}

/// Waits until the zone cluster serves every CRD in `names` (the addons install them).
async fn crds_established(down: &Client, names: &[&str]) {
    let crds = Api::<CustomResourceDefinition>::all(down.clone());
    eventually(LIMIT, &format!("CRDs {names:?} established"), || async {
        for name in names {
            let Some(crd) = crds.get_opt(name).await? else {
                return Ok(false);
            };
            let established = crd.status.and_then(|s| s.conditions).is_some_and(|cs| {
                cs.iter()
                    .any(|c| c.type_ == "Established" && c.status == "True")
            });
            if !established {
                return Ok(false);
            }
        }
        Ok(true)
    })
    .await
    .unwrap();
}

fn client_config(ca_pem: &str) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    let (_, pem) = x509_parser::pem::parse_x509_pem(ca_pem.as_bytes()).unwrap();
    roots
        .add(rustls::pki_types::CertificateDer::from(pem.contents))
        .unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Arc::new(
        rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth(),
    )
}

/// The served certificate's DNS names.
fn dns_names(der: &[u8]) -> Vec<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).unwrap();
    cert.subject_alternative_name()
        .unwrap()
        .map(|san| {
            san.value
                .general_names
                .iter()
                .filter_map(|n| match n {
                    x509_parser::extensions::GeneralName::DNSName(d) => Some((*d).to_owned()),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default()
}

/// `GET https://<host>:<addr.port><path>`, connected to `addr` (the host resolved to the
/// gateway's listen IP), SNI and Host = `host`, the server verified against `config`'s
/// roots: `(status line and headers and body, the served certificate's DNS names)`.
async fn https_get(
    addr: SocketAddr,
    host: &str,
    path: &str,
    config: &Arc<rustls::ClientConfig>,
) -> std::io::Result<(String, Vec<String>)> {
    https_get_as(addr, host, path, config, None).await
}

/// [`https_get`] with `Authorization: Bearer <token>` when a token is given.
async fn https_get_as(
    addr: SocketAddr,
    host: &str,
    path: &str,
    config: &Arc<rustls::ClientConfig>,
    token: Option<&str>,
) -> std::io::Result<(String, Vec<String>)> {
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let name = rustls::pki_types::ServerName::try_from(host.to_owned()).unwrap();
    let mut tls = tokio_rustls::TlsConnector::from(config.clone())
        .connect(name, tcp)
        .await?;
    let served = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .map(|c| dns_names(c))
        .unwrap_or_default();
    let authorization = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    tls.write_all(
        format!(
            "GET {path} HTTP/1.1\r\nHost: {host}:{}\r\n{authorization}Connection: close\r\n\r\n",
            addr.port()
        )
        .as_bytes(),
    )
    .await?;
    let mut response = String::new();
    tls.read_to_string(&mut response).await.or_else(|e| {
        // A peer may close without close_notify after the response.
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            Ok(0)
        } else {
            Err(e)
        }
    })?;
    Ok((response, served))
}

/// The zone cluster's cert-manager and gateway stand-ins, started once the cluster exists
/// and its addons installed the Gateway API and cert-manager CRDs (the plugin may still be
/// waiting); the GatewayClass `cilium` (the zone-installer's default) names the stand-in.
struct StandIns {
    /// The zone cluster.
    down: Client,
    /// The test ACME CA the cert-manager stand-in signs from (cert-manager's ACME issuer
    /// would talk to Let's Encrypt, which is not reachable here).
    acme_ca: CertificateAuthority,
    /// The gateway's HTTPS listener (`listen_ip`, 443 + the port offset).
    addr: SocketAddr,
    _cert_manager: Operator,
    _gateway: Operator,
}

impl StandIns {
    async fn start(hub: &Hub, name: &str, listen_ip: IpAddr) -> Self {
        let acme_ca = CertificateAuthority::generate(&format!("{name} test ACME CA")).unwrap();
        let (acme_cert, acme_key) = (
            hub.dir.join(format!("{name}-acme-ca.crt")),
            hub.dir.join(format!("{name}-acme-ca.key")),
        );
        std::fs::write(&acme_cert, &acme_ca.cert_pem).unwrap();
        std::fs::write(&acme_key, &acme_ca.key_pem).unwrap();
        let kubeconfig_yaml = hub.zone_kubeconfig(name).await;
        let kubeconfig = hub.dir.join(format!("{name}.kubeconfig"));
        std::fs::write(&kubeconfig, &kubeconfig_yaml).unwrap();
        let down = kontinuum_e2e::testbed::client_from(&kubeconfig_yaml)
            .await
            .unwrap();
        crds_established(
            &down,
            &[
                "gatewayclasses.gateway.networking.k8s.io",
                "gateways.gateway.networking.k8s.io",
                "httproutes.gateway.networking.k8s.io",
                "certificates.cert-manager.io",
                "clusterissuers.cert-manager.io",
                "issuers.cert-manager.io",
            ],
        )
        .await;
        let class = json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "GatewayClass",
            "metadata": { "name": GATEWAY_CLASS },
            "spec": { "controllerName": STANDIN_CONTROLLER },
        });
        dynamic(
            &down,
            ("gateway.networking.k8s.io", "v1", "GatewayClass"),
            "gatewayclasses",
        )
        .patch(
            GATEWAY_CLASS,
            &PatchParams::apply("kontinuum-e2e").force(),
            &Patch::Apply(&class),
        )
        .await
        .unwrap();
        let cert_manager = Operator::start(
            &workspace_binary("cert-manager-standin").unwrap(),
            "cert-manager-standin",
            &kubeconfig,
            &[
                "--acme-ca-cert",
                &acme_cert.to_string_lossy(),
                "--acme-ca-key",
                &acme_key.to_string_lossy(),
            ],
        )
        .await
        .unwrap();
        let https_port = free_port(listen_ip).unwrap();
        let offset = https_port - 443;
        let gateway = Operator::start(
            &workspace_binary("gateway-standin").unwrap(),
            "gateway-standin",
            &kubeconfig,
            &[
                "--controller-name",
                STANDIN_CONTROLLER,
                "--listen-ip",
                &listen_ip.to_string(),
                "--port-offset",
                &offset.to_string(),
            ],
        )
        .await
        .unwrap();
        Self {
            down,
            acme_ca,
            addr: SocketAddr::new(listen_ip, https_port),
            _cert_manager: cert_manager,
            _gateway: gateway,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zone_add_publishes_the_zone_endpoint_over_verified_tls() {
    let (region, zone, domain) = ("eu", "tls", "zones.example.com");
    let name = format!("{region}-{zone}");
    let host = format!("{zone}.{region}.{domain}");
    let machine = Ipv4Addr::new(127, 87, 0, 1);
    let hub = Hub::start("zone-endpoint", 1, machine).await;

    let started = Instant::now();
    let plugin = hub.zone_add(region, zone, machine, &[&format!("--domain={domain}")]);
    let cluster_up = {
        hub.zone_kubeconfig(&name).await;
        started.elapsed()
    };
    let standins = StandIns::start(&hub, &name, IpAddr::V4(Ipv4Addr::new(127, 87, 5, 1))).await;
    let (down, acme_ca, addr) = (&standins.down, &standins.acme_ca, standins.addr);

    // `zone add --wait` returns 0 with the Zone Ready: cluster, footprint, certificate,
    // registry all True.
    hub.added(plugin, &name).await;
    let ready_after = started.elapsed();
    hub.heartbeating(region, zone).await;
    let status = Api::<Zone>::namespaced(hub.client.clone(), &hub.ns)
        .get(&name)
        .await
        .unwrap()
        .status
        .unwrap();
    assert_eq!(status.endpoint.as_deref(), Some(host.as_str()));
    for type_ in ["ClusterReady", "Installed", "RegistryJoined"] {
        let c = conditions::get(&status.conditions, type_).unwrap();
        assert_eq!(c.status, "True", "{type_}: {c:?}");
    }

    // The zone endpoint over TLS: the host resolved to the gateway's listen IP, the served
    // certificate issued for exactly that name and verified against the issuing CA, the
    // answer the agent's (anonymous mode: `/version` is open).
    let config = client_config(&acme_ca.cert_pem);
    let first = std::sync::Mutex::new(None);
    eventually(LIMIT, "the zone endpoint answering over TLS", || async {
        let request = Instant::now();
        Ok(match https_get(addr, &host, "/version", &config).await {
            Ok((response, names)) if response.starts_with("HTTP/1.1 200") => {
                *first.lock().unwrap() = Some((request.elapsed(), response, names));
                true
            }
            _ => false,
        })
    })
    .await
    .unwrap();
    let (first_took, response, names) = first.into_inner().unwrap().unwrap();
    assert_eq!(names, [host.as_str()]);
    let body = response.split_once("\r\n\r\n").map(|(_, b)| b).unwrap();
    let version: serde_json::Value = serde_json::from_str(body.trim()).unwrap();
    assert_eq!(version["version"], env!("CARGO_PKG_VERSION"), "{response}");
    let mut latencies = Vec::new();
    for _ in 0..10 {
        let request = Instant::now();
        let (response, _) = https_get(addr, &host, "/version", &config).await.unwrap();
        latencies.push(request.elapsed());
        assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    }
    latencies.sort();
    // Another CA does not verify it: the certificate is the test CA's, not any.
    let stranger = CertificateAuthority::generate("someone else").unwrap();
    assert!(
        https_get(addr, &host, "/version", &client_config(&stranger.cert_pem))
            .await
            .is_err()
    );
    // The agent the gateway reached is the zone Deployment's pod, run by the machine's
    // hostlet on a loopback address of its own: the API server refuses such addresses in
    // EndpointSlices, so the stand-in found it as the Ready pod the Service selects.
    let pods = Api::<Pod>::namespaced(down.clone(), SYSTEM)
        .list(&ListParams::default().labels("app.kubernetes.io/name=kontinuum"))
        .await
        .unwrap()
        .items;
    let ready: Vec<String> = pods
        .iter()
        .filter_map(|p| p.status.as_ref())
        .filter(|s| {
            s.conditions
                .iter()
                .flatten()
                .any(|c| c.type_ == "Ready" && c.status == "True")
        })
        .filter_map(|s| s.pod_ip.clone())
        .collect();
    assert_eq!(ready.len(), 1, "{pods:#?}");
    assert!(
        ready[0].parse::<Ipv4Addr>().unwrap().is_loopback(),
        "{ready:?}"
    );
    let secret = Api::<Secret>::namespaced(down.clone(), SYSTEM)
        .get("kontinuum-tls")
        .await
        .unwrap()
        .data
        .unwrap();
    assert_eq!(
        secret.get("ca.crt").map(|b| b.0.as_slice()),
        Some(acme_ca.cert_pem.as_bytes())
    );
    eprintln!(
        "zone add --domain: zone cluster kubeconfig after {cluster_up:?}, Ready (plugin exit 0) after {ready_after:?}; \
         first HTTPS /version {first_took:?}, then 10 requests min {:?} median {:?} max {:?}",
        latencies[0], latencies[5], latencies[9]
    );
    drop(standins);
    hub.stop().await;
}

/// The status code of an HTTP response's status line.
fn status_code(response: &str) -> Option<u16> {
    response.split_whitespace().nth(1)?.parse().ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oidc_hub_mirrors_its_private_issuer_ca_and_the_zone_endpoint_requires_a_token() {
    kontinuum_testbed::install_crypto_provider();
    let (region, zone, domain) = ("eu", "oidc", "zones.example.com");
    let name = format!("{region}-{zone}");
    let host = format!("{zone}.{region}.{domain}");
    let machine = Ipv4Addr::new(127, 85, 0, 1);

    // A private issuer: its serving certificate chains to a test CA no system trusts.
    let issuer = TestIssuer::start().await.unwrap();
    let key = TestKey::generate(kontinuum_auth::Algorithm::Es256, "k1").unwrap();
    issuer.publish(&[&key]);
    let ca_dir = unique_dir("zone-oidc-issuer");
    std::fs::create_dir_all(&ca_dir).unwrap();
    let ca_file = ca_dir.join("oidc-ca.crt");
    std::fs::write(&ca_file, issuer.ca_pem()).unwrap();
    let hub = Hub::start_with_auth(
        "zone-oidc",
        1,
        machine,
        &[
            "--oidc-issuer-url".into(),
            issuer.url().to_owned(),
            "--oidc-admin-groups".into(),
            "admins".into(),
            "--oidc-ca-file".into(),
            ca_file.to_string_lossy().into_owned(),
        ],
    )
    .await;

    let started = Instant::now();
    let plugin = hub.zone_add(region, zone, machine, &[&format!("--domain={domain}")]);
    let standins = StandIns::start(&hub, &name, IpAddr::V4(Ipv4Addr::new(127, 85, 5, 1))).await;
    hub.added(plugin, &name).await;
    let ready_after = started.elapsed();

    // The zone got the hub's CA as a file of `kontinuum-ca`, and the agent the variable
    // naming where it is mounted (not the hub's path).
    let cas = Api::<ConfigMap>::namespaced(standins.down.clone(), SYSTEM)
        .get("kontinuum-ca")
        .await
        .unwrap()
        .data
        .unwrap();
    assert_eq!(
        cas.get("oidc-ca.crt").map(String::as_str),
        Some(issuer.ca_pem())
    );
    let env = Api::<ConfigMap>::namespaced(standins.down.clone(), SYSTEM)
        .get("kontinuum-env")
        .await
        .unwrap()
        .data
        .unwrap();
    assert_eq!(
        env.get("KONTINUUM_OIDC_ISSUER_URL").map(String::as_str),
        Some(issuer.url())
    );
    assert!(!env.contains_key("KONTINUUM_OIDC_CA_FILE"), "{env:?}");

    // The zone endpoint over TLS: without a token 401 with a Bearer challenge.
    let config = client_config(&standins.acme_ca.cert_pem);
    let addr = standins.addr;
    let request = |token: Option<String>| {
        let (config, host) = (config.clone(), host.clone());
        async move {
            https_get_as(addr, &host, "/version", &config, token.as_deref())
                .await
                .map(|(response, _)| response)
        }
    };
    let first = std::sync::Mutex::new(None);
    eventually(LIMIT, "the zone endpoint answering over TLS", || async {
        let response = request(None).await.ok();
        let answered = response
            .as_deref()
            .and_then(status_code)
            .is_some_and(|code| code != 502 && code != 503);
        *first.lock().unwrap() = response;
        Ok(answered)
    })
    .await
    .unwrap();
    let anonymous = first.into_inner().unwrap().unwrap();
    assert_eq!(status_code(&anonymous), Some(401), "{anonymous}");
    assert!(
        anonymous
            .to_ascii_lowercase()
            .contains("www-authenticate: bearer"),
        "{anonymous}"
    );

    // A valid admin token: 200 with the agent's answer. The agent verified the token
    // against the issuer's JWKS, fetched over TLS trusting only the mirrored CA (without
    // it the answer would be 503: the issuer unreachable).
    let discovery_before = issuer.discovery_requests();
    let admin = key.token(&issuer.claims("kontinuum", "alice", &["admins"]));
    let timed = Instant::now();
    let response = request(Some(admin.clone())).await.unwrap();
    let admin_took = timed.elapsed();
    assert_eq!(status_code(&response), Some(200), "{response}");
    let body = response.split_once("\r\n\r\n").map(|(_, b)| b).unwrap();
    let version: serde_json::Value = serde_json::from_str(body.trim()).unwrap();
    assert_eq!(version["version"], env!("CARGO_PKG_VERSION"), "{response}");
    assert!(
        issuer.discovery_requests() > discovery_before || discovery_before > 0,
        "the agent asked the issuer"
    );
    assert!(issuer.jwks_requests() > 0, "the agent fetched the keys");

    // A valid token of a user in no admin group: 403; a token of another key: 401.
    let user = key.token(&issuer.claims("kontinuum", "bob", &["users"]));
    let response = request(Some(user)).await.unwrap();
    assert_eq!(status_code(&response), Some(403), "{response}");
    let stranger = TestKey::generate(kontinuum_auth::Algorithm::Es256, "k1").unwrap();
    let forged = stranger.token(&issuer.claims("kontinuum", "mallory", &["admins"]));
    let response = request(Some(forged)).await.unwrap();
    assert_eq!(status_code(&response), Some(401), "{response}");
    // And the admin again, with the keys cached.
    let timed = Instant::now();
    let response = request(Some(admin)).await.unwrap();
    let cached_took = timed.elapsed();
    assert_eq!(status_code(&response), Some(200), "{response}");
    eprintln!(
        "zone add --domain (OIDC hub, private issuer CA): Ready after {ready_after:?}; \
         admin /version first {admin_took:?} (discovery + JWKS over the mirrored CA), cached {cached_took:?}; \
         issuer saw {} discovery and {} JWKS requests",
        issuer.discovery_requests(),
        issuer.jwks_requests()
    );
    drop(standins);
    hub.stop().await;
    let _ = std::fs::remove_dir_all(&ca_dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_zones_in_two_regions_are_ready_and_confined_to_their_own_keys() {
    let first = Ipv4Addr::new(127, 86, 0, 1);
    let second = Ipv4Addr::new(127, 86, 0, 2);
    let hub = Hub::start("zone-pair", 2, first).await;
    let (a, b) = (("eu", "a"), ("us", "b"));
    let (name_a, name_b) = (format!("{}-{}", a.0, a.1), format!("{}-{}", b.0, b.1));

    // Both at once, each with its own machine: A with `zone add --wait`, B the GitOps way
    // (acceptance 2): the plugin's dry-run manifest, applied by kubectl.
    let started = Instant::now();
    let plugin_a = hub.zone_add(a.0, a.1, first, &[]);
    let manifest_b = hub.manifest(b.0, b.1, second).await;
    let zones = Api::<Zone>::namespaced(hub.client.clone(), &hub.ns);
    assert!(
        zones.get_opt(&name_b).await.unwrap().is_none(),
        "a dry run writes nothing"
    );
    let applied = hub.kubectl_apply(&manifest_b).await;
    assert!(
        applied.contains(&format!("zone.kontinuum.sh/{name_b} created")),
        "{applied}"
    );
    let (ready_a, ready_b) = tokio::join!(
        async {
            hub.added(plugin_a, &name_a).await;
            started.elapsed()
        },
        async {
            hub.ready(&name_b).await;
            started.elapsed()
        }
    );
    hub.heartbeating(a.0, a.1).await;
    hub.heartbeating(b.0, b.1).await;

    // Re-applying the manifest to the Ready zone is a no-op: in the audit log, no request
    // to B's Zone, TalosCluster or InstancePool from kubectl or from anything it could
    // have woken (the zone-installer, the bootstrapper), over a window after it.
    let before = zones.get(&name_b).await.unwrap();
    let since = Timestamp::now();
    let again = hub.kubectl_apply(&manifest_b).await;
    assert!(
        again.contains(&format!("zone.kontinuum.sh/{name_b} unchanged")),
        "{again}"
    );
    // An absence is observed over an interval: what the re-apply could trigger happens
    // within milliseconds (the zone-installer reacts to a Zone change in ~20 ms).
    tokio::time::sleep(Duration::from_secs(3)).await;
    let writes = hub.writes_since(
        since,
        &[
            format!("/zones/{name_b}"),
            format!("/talosclusters/{name_b}"),
            format!("/instancepools/{name_b}"),
        ],
    );
    assert_eq!(writes, Vec::<String>::new(), "re-applying wrote");
    assert_eq!(
        zones.get(&name_b).await.unwrap().resource_version(),
        before.resource_version()
    );
    let thumbprint = |z: Zone| z.status.and_then(|s| s.identity_thumbprint).unwrap();
    assert_ne!(
        thumbprint(zones.get(&name_a).await.unwrap()),
        thumbprint(zones.get(&name_b).await.unwrap()),
        "each zone has an identity of its own"
    );

    // Both registrations are in the store (read directly, as the hub).
    let prefix_a = format!("/kontinuum.sh/zones/{}/{}/", a.0, a.1);
    let prefix_b = format!("/kontinuum.sh/zones/{}/{}/", b.0, b.1);
    let keys = |out: &str| -> Vec<String> {
        out.lines()
            .filter(|l| l.starts_with("/kontinuum.sh/"))
            .map(str::to_owned)
            .collect()
    };
    let (ok, stdout, stderr) = hub
        .etcdctl(&hub.store, &["get", "--prefix", "--keys-only", &prefix_b])
        .await;
    assert!(ok, "{stderr}");
    let keys_b = keys(&stdout);
    assert!(
        keys_b.iter().any(|k| k.contains("/registry/")),
        "{keys_b:?}"
    );

    // Zone A's REAL credentials: its identity from its own cluster's Secret.
    let down_a = kontinuum_e2e::testbed::client_from(&hub.zone_kubeconfig(&name_a).await)
        .await
        .unwrap();
    let identity = Api::<Secret>::namespaced(down_a, SYSTEM)
        .get("kontinuum-identity")
        .await
        .unwrap()
        .data
        .unwrap();
    let identity_dir = hub.dir.join("identity-a");
    std::fs::create_dir_all(&identity_dir).unwrap();
    for key in ["tls.crt", "tls.key"] {
        std::fs::write(identity_dir.join(key), &identity[key].0).unwrap();
    }
    // A short socket path (unix socket paths are limited to 108 bytes).
    let socket = std::env::temp_dir().join(format!("kz-relay-{}.sock", std::process::id()));
    let _ = std::fs::remove_file(&socket);
    let relay_admin = SocketAddr::new(LOOPBACK, free_port(LOOPBACK).unwrap());
    let _relay = spawn(
        &hub.dir,
        "relay-a",
        &workspace_binary("etcd-proxy").unwrap(),
        &[
            "relay".into(),
            format!("--listen=unix://{}", socket.display()),
            format!("--endpoint=https://{}", hub.proxy),
            format!("--ca={}", hub.proxy_ca.display()),
            format!("--identity-dir={}", identity_dir.display()),
            format!("--zone={name_a}"),
            format!("--admin-addr={relay_admin}"),
            "--log-format=text".into(),
            "--log-level=info".into(),
        ],
        &[],
    );
    let relay = format!("unix://{}", socket.display());
    eventually(LIMIT, "the relay's socket", || async {
        Ok(tokio::net::UnixStream::connect(&socket).await.is_ok())
    })
    .await
    .unwrap();

    // Its own keys read fine through the relay and the hub's proxy.
    let (ok, stdout, stderr) = hub
        .etcdctl(&relay, &["get", "--prefix", "--keys-only", &prefix_a])
        .await;
    assert!(ok, "{stderr}");
    let own = keys(&stdout);
    assert!(own.iter().any(|k| k.contains("/registry/")), "{own:?}");
    // Zone B's registration, a prefix read of B and a read of the whole zones tree: each
    // PermissionDenied.
    let denied =
        |(ok, _, stderr): &(bool, String, String)| !ok && stderr.contains("PermissionDenied");
    let refused_at = Instant::now();
    for args in [
        vec!["get", keys_b[0].as_str()],
        vec!["get", "--prefix", prefix_b.as_str()],
        vec!["get", "--prefix", "/kontinuum.sh/zones/"],
    ] {
        let out = hub.etcdctl(&relay, &args).await;
        assert!(
            denied(&out),
            "{args:?}: expected PermissionDenied, got {out:?}"
        );
    }
    let refusals = refused_at.elapsed();
    // Nor can it write there: B's registration stays B's (B's own heartbeats may rewrite
    // it meanwhile, so only the forgery is looked for).
    let out = hub
        .etcdctl(&relay, &["put", &keys_b[0], "forged by zone a"])
        .await;
    assert!(
        denied(&out),
        "put into B: expected PermissionDenied, got {out:?}"
    );
    let (_, after, _) = hub.etcdctl(&hub.store, &["get", &keys_b[0]]).await;
    assert!(!after.contains("forged"), "{after}");
    let _ = std::fs::remove_file(&socket);
    eprintln!(
        "two zones added at once: {name_a} Ready after {ready_a:?}, {name_b} after {ready_b:?}; \
         A's relay refused 3 reads of B's keys in {refusals:?} (own prefix: {} keys)",
        own.len()
    );
    hub.stop().await;
}
