//! One real Kubernetes control plane: etcd, kube-apiserver, kube-controller-manager,
//! kube-scheduler and KWOK, as child processes bound to one address.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use base64::Engine as _;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, ServiceAccount};
use kube::api::{Api, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::hostlet::HostletConfig;
use crate::pki::{CertificateAuthority, Pki, PkiInputs};
use crate::process::Component;
use crate::{Error, Tools};

/// The first address of the service CIDR: the `kubernetes` Service's ClusterIP.
pub const FIRST_SERVICE_IP: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 96, 0, 1));
const SERVICE_CIDR: &str = "10.96.0.0/16";
const POD_CIDR: &str = "10.244.0.0/16";
/// How long each start-up phase may take on a busy 2-core machine.
const START_TIMEOUT: Duration = Duration::from_secs(90);
const POLL: Duration = Duration::from_millis(100);

/// The annotation that marks a node as KWOK's (value `fake`); KWOK manages only those.
pub const KWOK_NODE_ANNOTATION: &str = "kwok.x-k8s.io/node";

/// Where the API server's audit log goes, relative to the control plane's directory.
pub const AUDIT_LOG: &str = "logs/audit.log";

/// Audit every write, and every request for Secrets, reads included (at Metadata level:
/// who, what, when; never bodies, which may hold secrets), and nothing else: tests count the
/// writes a component makes and show which Secrets it asks for. Readers of the log that
/// want writes filter on the verb.
const AUDIT_POLICY: &str = "apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
  verbs: [create, update, patch, delete, deletecollection]
- level: Metadata
  resources: [{group: \"\", resources: [secrets]}]
- level: None
";

/// What to start.
#[derive(Clone, Debug)]
pub struct ControlPlaneConfig {
    /// Directory for certificates, logs, the kubeconfig and etcd's data. Logs are kept after
    /// the control plane stops, so a failed test can be read afterwards.
    pub dir: PathBuf,
    /// Address every component binds to (e.g. `127.0.0.1`, or `127.10.0.3` for one of many).
    pub address: IpAddr,
    /// The API server's port; 0 picks a free one.
    pub port: u16,
    /// Fake (KWOK) nodes to create and wait for.
    pub nodes: Vec<String>,
    /// Extra DNS names (or IP addresses) for the API server's serving certificate.
    pub extra_dns: Vec<String>,
    /// CA to build the PKI around; a new one is generated when `None`.
    pub ca: Option<CertificateAuthority>,
    /// etcd's CA: etcd serves TLS to clients holding a certificate of it, and the API server
    /// presents one (`None`: etcd on plain HTTP).
    pub etcd_ca: Option<CertificateAuthority>,
    /// The aggregator (front-proxy) CA: the API server's request-header client CA and its
    /// proxy client certificate (`None`: no front proxy).
    pub aggregator_ca: Option<CertificateAuthority>,
    /// The ServiceAccount token signing key, PKCS#8 PEM (`None`: a fresh P-256 key).
    pub service_account_key_pem: Option<String>,
    /// The Service CIDR, IPv4 (`None`: `10.96.0.0/16`); the `kubernetes` Service gets its
    /// first address.
    pub service_cidr: Option<String>,
    /// The pod CIDR, IPv4 (`None`: `10.244.0.0/16`): the addresses KWOK gives its pods.
    pub pod_cidr: Option<String>,
    /// The controller manager's cluster name (`None`: its default, `kubernetes`).
    pub cluster_name: Option<String>,
}

impl ControlPlaneConfig {
    /// Loopback, a free port, one node named `kwok-node-0`, a fresh CA.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            address: IpAddr::from([127, 0, 0, 1]),
            port: 0,
            nodes: vec!["kwok-node-0".to_string()],
            extra_dns: Vec::new(),
            ca: None,
            etcd_ca: None,
            aggregator_ca: None,
            service_account_key_pem: None,
            service_cidr: None,
            pod_cidr: None,
            cluster_name: None,
        }
    }

    /// The Service CIDR in use and its first address (the `kubernetes` Service's ClusterIP).
    pub fn service_network(&self) -> Result<(String, IpAddr), Error> {
        let cidr = self.service_cidr.as_deref().unwrap_or(SERVICE_CIDR);
        Ok((cidr.to_owned(), first_address(cidr)?))
    }

    /// The pod CIDR in use.
    pub fn pod_network(&self) -> Result<String, Error> {
        let cidr = self.pod_cidr.as_deref().unwrap_or(POD_CIDR);
        first_address(cidr)?;
        Ok(cidr.to_owned())
    }
}

/// The first host address of an IPv4 CIDR (`10.96.0.0/12` → `10.96.0.1`).
pub fn first_address(cidr: &str) -> Result<IpAddr, Error> {
    let invalid = || Error::InvalidConfig(format!("{cidr:?} is not an IPv4 CIDR"));
    let (ip, len) = cidr.split_once('/').ok_or_else(invalid)?;
    let ip: std::net::Ipv4Addr = ip.parse().map_err(|_| invalid())?;
    let len: u32 = len.parse().ok().filter(|l| *l <= 30).ok_or_else(invalid)?;
    let mask = u32::MAX.checked_shl(32 - len).unwrap_or(0);
    let network = u32::from(ip) & mask;
    Ok(IpAddr::V4(std::net::Ipv4Addr::from(network + 1)))
}

/// A running control plane. Dropping it kills every component; `stop` does it gracefully.
pub struct ControlPlane {
    dir: PathBuf,
    server: String,
    kubeconfig: PathBuf,
    kubeconfig_yaml: String,
    components: Vec<Component>,
    client: Client,
    started_in: Duration,
}

impl ControlPlane {
    /// Starts every component, waits until the cluster really works (API ready, default
    /// ServiceAccount and root CA ConfigMap published by the controller manager, nodes
    /// Ready), and returns it.
    pub async fn start(tools: &Tools, config: ControlPlaneConfig) -> Result<Self, Error> {
        let started = Instant::now();
        let dir = config.dir.clone();
        for sub in ["pki", "logs"] {
            create_dir(&dir.join(sub))?;
        }
        let etcd_data = dir.join("etcd");
        // A leftover data dir from an earlier run would resurrect its objects.
        if etcd_data.exists() {
            std::fs::remove_dir_all(&etcd_data).map_err(|source| Error::Io {
                what: "clearing etcd data".into(),
                source,
            })?;
        }
        let address = config.address;
        let port = if config.port == 0 {
            free_port(address)?
        } else {
            config.port
        };
        let (pki, networks) = pki_and_networks(&config)?;
        let files = PkiFiles::write(&dir.join("pki"), &pki)?;
        let audit_policy = dir.join("audit-policy.yaml");
        write(&audit_policy, AUDIT_POLICY)?;
        let server = format!("https://{}", SocketAddr::new(address, port));
        let kubeconfig_yaml = kubeconfig(&server, &pki);
        let kubeconfig = dir.join("kubeconfig");
        write(&kubeconfig, &kubeconfig_yaml)?;
        let logs = dir.join("logs");

        let mut components = Vec::new();
        let etcd_url =
            start_etcd(tools, address, (&etcd_data, &logs), &files, &mut components).await?;
        components.push(Component::spawn(
            "kube-apiserver",
            &tools.path("kube-apiserver"),
            &[
                apiserver_args(address, port, &etcd_url, &files, &networks),
                vec![
                    format!("--audit-policy-file={}", path_str(&audit_policy)),
                    format!("--audit-log-path={}", path_str(&dir.join(AUDIT_LOG))),
                    "--audit-log-format=json".into(),
                    "--audit-log-mode=blocking".into(),
                ],
            ]
            .concat(),
            &logs,
        )?);
        let client = client_from(&kubeconfig_yaml).await?;
        wait_for(&mut components, "kube-apiserver /readyz", || {
            readyz(&client)
        })
        .await?;

        spawn_controllers(
            tools,
            &dir,
            &kubeconfig,
            &files,
            &networks,
            address,
            &mut components,
        )?;

        for name in &config.nodes {
            create_node(&client, name).await?;
        }
        wait_for(
            &mut components,
            "default ServiceAccount and kube-root-ca.crt",
            || controller_manager_working(&client),
        )
        .await?;
        wait_for(&mut components, "nodes Ready", || {
            nodes_ready(&client, &config.nodes)
        })
        .await?;

        let started_in = started.elapsed();
        tracing::info!(server = %server, elapsed_ms = started_in.as_millis(), "control plane ready");
        Ok(Self {
            dir,
            server,
            kubeconfig,
            kubeconfig_yaml,
            components,
            client,
            started_in,
        })
    }

    /// A client (admin, `system:masters`) bound to the runtime that started the control plane.
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// The admin kubeconfig, as written to `kubeconfig_path()`.
    pub fn kubeconfig_yaml(&self) -> &str {
        &self.kubeconfig_yaml
    }

    /// Path of the admin kubeconfig file.
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// `https://<address>:<port>`.
    pub fn server(&self) -> &str {
        &self.server
    }

    /// The control plane's directory (certificates, logs, kubeconfig).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The API server's audit log: one JSON event per write request.
    pub fn audit_log(&self) -> PathBuf {
        self.dir.join(AUDIT_LOG)
    }

    /// How long `start` took until the cluster was usable.
    pub fn started_in(&self) -> Duration {
        self.started_in
    }

    /// Process ids of the components, by name (for measuring RSS).
    pub fn pids(&self) -> Vec<(&'static str, u32)> {
        self.components
            .iter()
            .filter_map(|c| c.pid().map(|pid| (c.name(), pid)))
            .collect()
    }

    /// The directory of the hostlet node `name`: pod logs are in
    /// `pods/<namespace>_<pod>_<uid>/<container>.log` under it.
    pub fn hostlet_dir(&self, name: &str) -> PathBuf {
        crate::hostlet::hostlet_dir(&self.dir, name)
    }

    /// Starts a hostlet node (the `hostlet` binary, as one more component logging to
    /// `logs/hostlet-<name>.log`) and waits until its Node is Ready. The hostlet is a child
    /// of the calling thread: start it from the thread that keeps the control plane.
    pub async fn start_hostlet(&mut self, hostlet: &HostletConfig) -> Result<PathBuf, Error> {
        let dir = self.hostlet_dir(&hostlet.name);
        create_dir(&dir)?;
        self.components.push(Component::spawn_logged(
            "hostlet",
            &format!("hostlet-{}", hostlet.name),
            &hostlet.binary,
            &hostlet.args(&self.kubeconfig, &dir),
            &self.dir.join("logs"),
        )?);
        let client = self.client.clone();
        let names = [hostlet.name.clone()];
        wait_for(
            &mut self.components,
            &format!("hostlet node {} Ready", hostlet.name),
            || nodes_ready(&client, &names),
        )
        .await?;
        Ok(dir)
    }

    /// Fails if any component has exited.
    pub fn check_alive(&mut self) -> Result<(), Error> {
        self.components
            .iter_mut()
            .try_for_each(Component::check_alive)
    }

    /// Stops the components in reverse start order (KWOK first, etcd last) and removes
    /// etcd's data; certificates and logs stay.
    pub async fn stop(mut self) {
        while let Some(mut component) = self.components.pop() {
            component.stop().await;
        }
        let _ = std::fs::remove_dir_all(self.dir.join("etcd"));
    }
}

/// The certificates and networks `config` asks for.
fn pki_and_networks(config: &ControlPlaneConfig) -> Result<(Pki, Networks), Error> {
    let (service_cidr, service_ip) = config.service_network()?;
    let inputs = PkiInputs {
        ca: config.ca.clone(),
        service_account_key_pem: config.service_account_key_pem.clone(),
        etcd_ca: config.etcd_ca.clone(),
        aggregator_ca: config.aggregator_ca.clone(),
    };
    let pki = Pki::generate_with(inputs, config.address, &config.extra_dns, service_ip)?;
    let networks = Networks {
        service_cidr,
        pod_cidr: config.pod_network()?,
        cluster_name: config.cluster_name.clone(),
    };
    Ok((pki, networks))
}

/// Starts etcd (on TLS when `files` hold its certificates) and waits until it is healthy;
/// returns its client URL.
async fn start_etcd(
    tools: &Tools,
    address: IpAddr,
    (data, logs): (&Path, &Path),
    files: &PkiFiles,
    components: &mut Vec<Component>,
) -> Result<String, Error> {
    let ports = EtcdPorts {
        client: free_port(address)?,
        peer: free_port(address)?,
        // With TLS for clients, /health is read on a plain-HTTP metrics listener.
        metrics: match files.etcd {
            Some(_) => Some(free_port(address)?),
            None => None,
        },
    };
    components.push(Component::spawn(
        "etcd",
        &tools.path("etcd"),
        &etcd_args(address, &ports, data, files),
        logs,
    )?);
    wait_for(components, "etcd /health", || {
        etcd_healthy(address, ports.metrics.unwrap_or(ports.client))
    })
    .await?;
    let scheme = if files.etcd.is_some() {
        "https"
    } else {
        "http"
    };
    Ok(format!(
        "{scheme}://{}",
        SocketAddr::new(address, ports.client)
    ))
}

/// Starts kube-controller-manager, kube-scheduler and KWOK against a ready API server.
fn spawn_controllers(
    tools: &Tools,
    dir: &Path,
    kubeconfig: &Path,
    files: &PkiFiles,
    networks: &Networks,
    address: IpAddr,
    components: &mut Vec<Component>,
) -> Result<(), Error> {
    let logs = dir.join("logs");
    let kcfg = path_str(kubeconfig);
    components.push(Component::spawn(
        "kube-controller-manager",
        &tools.path("kube-controller-manager"),
        &kcm_args(&kcfg, files, networks),
        &logs,
    )?);
    components.push(Component::spawn(
        "kube-scheduler",
        &tools.path("kube-scheduler"),
        &[
            format!("--kubeconfig={kcfg}"),
            "--leader-elect=false".into(),
            "--secure-port=0".into(),
        ],
        &logs,
    )?);
    let stages = write_kwok_config(tools, dir)?;
    components.push(Component::spawn(
        "kwok",
        &tools.path("kwok"),
        &[
            format!("--kubeconfig={kcfg}"),
            format!("--config={}", path_str(&stages)),
            // Only KWOK's own fake nodes (created with this annotation): hostlet nodes and
            // their pods are left to their hostlet.
            format!("--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}=fake"),
            format!("--cidr={}", networks.pod_cidr),
            format!("--node-ip={address}"),
            "--node-lease-duration-seconds=40".into(),
        ],
        &logs,
    )?);
    Ok(())
}

/// Builds a client from a kubeconfig document in the current runtime.
pub async fn client_from(kubeconfig_yaml: &str) -> Result<Client, Error> {
    let kubeconfig = Kubeconfig::from_yaml(kubeconfig_yaml).map_err(Error::Kubeconfig)?;
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(Error::Kubeconfig)?;
    Client::try_from(config).map_err(|source| Error::Kube {
        what: "building a client".into(),
        source,
    })
}

/// The networks and name a control plane is started with.
struct Networks {
    service_cidr: String,
    pod_cidr: String,
    cluster_name: Option<String>,
}

/// Where etcd listens.
struct EtcdPorts {
    client: u16,
    peer: u16,
    metrics: Option<u16>,
}

/// A certificate file, its key file and the CA file it chains to.
struct TlsFiles {
    ca: String,
    cert: String,
    key: String,
}

struct PkiFiles {
    ca: String,
    apiserver_cert: String,
    apiserver_key: String,
    sa_key: String,
    sa_pub: String,
    /// etcd's serving certificate (when etcd serves TLS).
    etcd: Option<TlsFiles>,
    /// The API server's etcd client certificate (when etcd serves TLS).
    etcd_client: Option<TlsFiles>,
    /// The API server's front-proxy client certificate and the aggregator CA.
    front_proxy: Option<TlsFiles>,
}

impl PkiFiles {
    fn write(dir: &Path, pki: &Pki) -> Result<Self, Error> {
        let put = |name: &str, content: &str| -> Result<String, Error> {
            let path = dir.join(name);
            write(&path, content)?;
            Ok(path_str(&path))
        };
        let pair = |prefix: &str, ca: &str, pair: &crate::CertPair| -> Result<TlsFiles, Error> {
            Ok(TlsFiles {
                ca: put(&format!("{prefix}-ca.crt"), ca)?,
                cert: put(&format!("{prefix}.crt"), &pair.cert_pem)?,
                key: put(&format!("{prefix}.key"), &pair.key_pem)?,
            })
        };
        let (etcd, etcd_client) = match &pki.etcd {
            Some(e) => (
                Some(pair("etcd-server", &e.ca_pem, &e.server)?),
                Some(pair(
                    "apiserver-etcd-client",
                    &e.ca_pem,
                    &e.apiserver_client,
                )?),
            ),
            None => (None, None),
        };
        let front_proxy = match &pki.front_proxy {
            Some(f) => Some(pair("front-proxy-client", &f.ca_pem, &f.client)?),
            None => None,
        };
        Ok(Self {
            ca: put("ca.crt", &pki.ca.cert_pem)?,
            apiserver_cert: put("apiserver.crt", &pki.apiserver.cert_pem)?,
            apiserver_key: put("apiserver.key", &pki.apiserver.key_pem)?,
            sa_key: put("sa.key", &pki.sa_key_pem)?,
            sa_pub: put("sa.pub", &pki.sa_pub_pem)?,
            etcd,
            etcd_client,
            front_proxy,
        })
    }
}

fn etcd_args(address: IpAddr, ports: &EtcdPorts, data: &Path, files: &PkiFiles) -> Vec<String> {
    let scheme = if files.etcd.is_some() {
        "https"
    } else {
        "http"
    };
    let client_url = format!("{scheme}://{}", SocketAddr::new(address, ports.client));
    let peer_url = format!("http://{}", SocketAddr::new(address, ports.peer));
    let mut args = vec![
        "--name=default".into(),
        format!("--data-dir={}", path_str(data)),
        format!("--listen-client-urls={client_url}"),
        format!("--advertise-client-urls={client_url}"),
        format!("--listen-peer-urls={peer_url}"),
        format!("--initial-advertise-peer-urls={peer_url}"),
        format!("--initial-cluster=default={peer_url}"),
        "--unsafe-no-fsync=true".into(),
        "--log-level=warn".into(),
        // Nothing but this API server uses it; keep its disk footprint small.
        "--quota-backend-bytes=1073741824".into(),
        "--snapshot-count=10000".into(),
    ];
    if let (Some(tls), Some(metrics)) = (&files.etcd, ports.metrics) {
        args.extend([
            format!(
                "--listen-metrics-urls=http://{}",
                SocketAddr::new(address, metrics)
            ),
            format!("--cert-file={}", tls.cert),
            format!("--key-file={}", tls.key),
            format!("--trusted-ca-file={}", tls.ca),
            "--client-cert-auth=true".into(),
        ]);
    }
    args
}

fn apiserver_args(
    address: IpAddr,
    port: u16,
    etcd_url: &str,
    f: &PkiFiles,
    networks: &Networks,
) -> Vec<String> {
    let mut args = vec![
        format!("--etcd-servers={etcd_url}"),
        format!("--bind-address={address}"),
        format!("--advertise-address={address}"),
        format!("--secure-port={port}"),
        format!("--tls-cert-file={}", f.apiserver_cert),
        format!("--tls-private-key-file={}", f.apiserver_key),
        format!("--client-ca-file={}", f.ca),
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
        format!("--service-account-key-file={}", f.sa_pub),
        format!("--service-account-signing-key-file={}", f.sa_key),
        format!("--service-cluster-ip-range={}", networks.service_cidr),
        "--authorization-mode=Node,RBAC".into(),
        "--allow-privileged=true".into(),
        // A loopback advertise address cannot be put into the `kubernetes` Endpoints.
        "--endpoint-reconciler-type=none".into(),
        "--profiling=false".into(),
        // Tests and benchmarks are the only clients: no server-side throttling.
        "--max-requests-inflight=0".into(),
        "--max-mutating-requests-inflight=0".into(),
        "--enable-priority-and-fairness=false".into(),
        "--v=1".into(),
    ];
    if let Some(tls) = &f.etcd_client {
        args.extend([
            format!("--etcd-cafile={}", tls.ca),
            format!("--etcd-certfile={}", tls.cert),
            format!("--etcd-keyfile={}", tls.key),
        ]);
    }
    if let Some(tls) = &f.front_proxy {
        args.extend([
            format!("--requestheader-client-ca-file={}", tls.ca),
            format!("--proxy-client-cert-file={}", tls.cert),
            format!("--proxy-client-key-file={}", tls.key),
            "--requestheader-allowed-names=front-proxy-client".into(),
            "--requestheader-username-headers=X-Remote-User".into(),
            "--requestheader-group-headers=X-Remote-Group".into(),
            "--requestheader-extra-headers-prefix=X-Remote-Extra-".into(),
        ]);
    }
    args
}

fn kcm_args(kubeconfig: &str, f: &PkiFiles, networks: &Networks) -> Vec<String> {
    let mut args = vec![
        format!("--kubeconfig={kubeconfig}"),
        "--leader-elect=false".into(),
        "--controllers=*".into(),
        // Each controller acts as its own ServiceAccount, as in a real cluster.
        "--use-service-account-credentials=true".into(),
        format!("--service-account-private-key-file={}", f.sa_key),
        format!("--root-ca-file={}", f.ca),
        "--secure-port=0".into(),
        "--node-monitor-period=5s".into(),
        "--node-monitor-grace-period=40s".into(),
        "--concurrent-gc-syncs=5".into(),
        "--v=1".into(),
    ];
    if let Some(name) = &networks.cluster_name {
        args.push(format!("--cluster-name={name}"));
    }
    args
}

fn write_kwok_config(tools: &Tools, dir: &Path) -> Result<PathBuf, Error> {
    let mut config = String::new();
    for stage in tools.kwok_stages()? {
        let text = std::fs::read_to_string(&stage).map_err(|source| Error::Io {
            what: format!("reading {}", stage.display()),
            source,
        })?;
        config.push_str("---\n");
        config.push_str(&text);
        config.push('\n');
    }
    let path = dir.join("kwok.yaml");
    write(&path, &config)?;
    Ok(path)
}

fn kubeconfig(server: &str, pki: &Pki) -> String {
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: testbed
  cluster:
    server: {server}
    certificate-authority-data: {ca}
users:
- name: admin
  user:
    client-certificate-data: {cert}
    client-key-data: {key}
contexts:
- name: testbed
  context:
    cluster: testbed
    user: admin
current-context: testbed
",
        ca = b64(&pki.ca.cert_pem),
        cert = b64(&pki.admin.cert_pem),
        key = b64(&pki.admin.key_pem),
    )
}

/// Polls `check` until it returns `Ok(true)`, failing fast when a component exits.
pub(crate) async fn wait_for<F, Fut>(
    components: &mut [Component],
    what: &str,
    mut check: F,
) -> Result<(), Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        for c in components.iter_mut() {
            c.check_alive()?;
        }
        if tokio::time::timeout(Duration::from_secs(5), check())
            .await
            .unwrap_or(false)
        {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(Error::Timeout {
                what: what.to_string(),
                after: START_TIMEOUT,
            });
        }
        tokio::time::sleep(POLL).await;
    }
}

async fn etcd_healthy(address: IpAddr, port: u16) -> bool {
    let Ok(mut stream) = tokio::net::TcpStream::connect(SocketAddr::new(address, port)).await
    else {
        return false;
    };
    let request = format!("GET /health HTTP/1.0\r\nHost: {address}\r\n\r\n");
    if stream.write_all(request.as_bytes()).await.is_err() {
        return false;
    }
    let mut response = String::new();
    if stream.read_to_string(&mut response).await.is_err() {
        return false;
    }
    response.starts_with("HTTP/1.0 200") || response.starts_with("HTTP/1.1 200")
}

async fn readyz(client: &Client) -> bool {
    let Ok(request) = http::Request::get("/readyz").body(Vec::new()) else {
        return false;
    };
    client
        .request_text(request)
        .await
        .is_ok_and(|body| body.trim() == "ok")
}

async fn controller_manager_working(client: &Client) -> bool {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    for ns in ["default", "kube-system"] {
        if namespaces.get_opt(ns).await.ok().flatten().is_none() {
            return false;
        }
    }
    let sa: Api<ServiceAccount> = Api::namespaced(client.clone(), "default");
    let cm: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    sa.get_opt("default").await.ok().flatten().is_some()
        && cm
            .get_opt("kube-root-ca.crt")
            .await
            .ok()
            .flatten()
            .is_some()
}

async fn create_node(client: &Client, name: &str) -> Result<(), Error> {
    let nodes: Api<Node> = Api::all(client.clone());
    let node: Node = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": { KWOK_NODE_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0" },
            "labels": {
                "type": "kwok",
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
            }
        }
    }))
    .map_err(|e| Error::Tools(format!("building node {name}: {e}")))?;
    match nodes.create(&PostParams::default(), &node).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
        Err(source) => Err(Error::Kube {
            what: format!("creating node {name}"),
            source,
        }),
    }
}

pub(crate) async fn nodes_ready(client: &Client, names: &[String]) -> bool {
    let nodes: Api<Node> = Api::all(client.clone());
    for name in names {
        let Ok(node) = nodes.get(name).await else {
            return false;
        };
        if !crate::node_is_ready(&node) {
            return false;
        }
    }
    true
}

/// A port that is free on `address` right now, and that nothing else will be given.
///
/// Binding port 0 would hand out an ephemeral port: the kernel gives the same range to
/// every outgoing connection, so between this call and the component's own bind, any
/// client socket on the machine (another test bed's API server dialling its etcd) may take
/// it, and the component dies with "address already in use". Ports are therefore taken
/// from below the ephemeral range, each checked by binding it, and never twice by one
/// process; the start is spread by process id so that consecutive test binaries do not walk
/// the same ports.
pub fn free_port(address: IpAddr) -> Result<u16, Error> {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);

    let (low, high) = fixed_port_range();
    let span = u32::from(high - low);
    if NEXT.load(Ordering::Relaxed) == u32::MAX {
        let seed = std::process::id().wrapping_mul(7919) % span;
        let _ = NEXT.compare_exchange(u32::MAX, seed, Ordering::Relaxed, Ordering::Relaxed);
    }
    for _ in 0..span {
        let offset = NEXT.fetch_add(1, Ordering::Relaxed) % span;
        // `offset < span`, which fits in a u16.
        let port = low + u16::try_from(offset).unwrap_or(0);
        if std::net::TcpListener::bind(SocketAddr::new(address, port)).is_ok() {
            return Ok(port);
        }
    }
    Err(Error::Io {
        what: format!("finding a free port on {address} in {low}..{high}"),
        source: std::io::Error::from(std::io::ErrorKind::AddrInUse),
    })
}

/// Ports below the kernel's ephemeral range (`net.ipv4.ip_local_port_range`), above the
/// well-known ones and those Kubernetes components use by default (6443, 10250–10259).
fn fixed_port_range() -> (u16, u16) {
    const LOW: u16 = 20_000;
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32_768);
    // A kernel whose ephemeral range starts lower leaves too little room: use the top of
    // the port space, which a default range (ending at 60999) does not reach.
    if ephemeral_low >= LOW + 4_096 {
        (LOW, ephemeral_low)
    } else {
        (61_000, 65_535)
    }
}

pub(crate) fn create_dir(path: &Path) -> Result<(), Error> {
    std::fs::create_dir_all(path).map_err(|source| Error::Io {
        what: format!("creating {}", path.display()),
        source,
    })
}

/// Writes a file readable by its owner only: most of what we write holds a private key.
fn write(path: &Path, content: &str) -> Result<(), Error> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .and_then(|mut f| f.write_all(content.as_bytes()))
        .map_err(|source| Error::Io {
            what: format!("writing {}", path.display()),
            source,
        })
}

fn path_str(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_ports_are_outside_the_ephemeral_range_and_never_repeated() {
        let (low, high) = fixed_port_range();
        let address = IpAddr::from([127, 0, 0, 1]);
        let ports: Vec<u16> = (0..200).map(|_| free_port(address).unwrap()).collect();
        let unique: std::collections::BTreeSet<u16> = ports.iter().copied().collect();
        assert_eq!(unique.len(), ports.len(), "a port was handed out twice");
        assert!(ports.iter().all(|p| (low..high).contains(p)), "{ports:?}");
        // The test machine's kernel keeps its default ephemeral range.
        assert!(high <= 32_768 || low >= 61_000, "{low}..{high}");
    }

    #[test]
    fn first_addresses_of_cidrs() {
        for (cidr, first) in [
            ("10.96.0.0/16", [10, 96, 0, 1]),
            ("10.112.0.0/12", [10, 112, 0, 1]),
            ("10.100.7.9/12", [10, 96, 0, 1]),
        ] {
            assert_eq!(first_address(cidr).unwrap(), IpAddr::from(first), "{cidr}");
        }
        for bad in ["10.96.0.0", "fd00::/108", "10.96.0.0/31", "x/8"] {
            assert!(first_address(bad).is_err(), "{bad}");
        }
        let config = ControlPlaneConfig::new("/tmp/x");
        assert_eq!(
            config.service_network().unwrap(),
            ("10.96.0.0/16".to_owned(), FIRST_SERVICE_IP),
            "the default stays"
        );
        assert_eq!(config.pod_network().unwrap(), "10.244.0.0/16");
    }

    #[test]
    fn a_bound_port_is_skipped() {
        let address = IpAddr::from([127, 0, 0, 1]);
        let first = free_port(address).unwrap();
        // Hold the next candidates so the allocator must step over them.
        let held: Vec<_> = (1..=3)
            .filter_map(|i| std::net::TcpListener::bind(SocketAddr::new(address, first + i)).ok())
            .collect();
        let next = free_port(address).unwrap();
        let held_ports: Vec<u16> = held
            .iter()
            .map(|l| l.local_addr().unwrap().port())
            .collect();
        assert!(
            !held_ports.contains(&next),
            "{next} is held: {held_ports:?}"
        );
    }
}
