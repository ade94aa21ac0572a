//! The client against a minimal in-process fake of Talos' MachineService, ClusterService and
//! COSI State, served over real TLS (rcgen certificates, ALPN h2) on 127.0.0.1:0.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::Write;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use kontinuum_proto::talos::cluster::cluster_service_server::{
    ClusterService, ClusterServiceServer,
};
use kontinuum_proto::talos::cluster::{HealthCheckProgress, HealthCheckRequest};
use kontinuum_proto::talos::common::Data;
use kontinuum_proto::talos::cosi::resource::state_server::{State, StateServer};
use kontinuum_proto::talos::cosi::resource::{ListRequest, ListResponse, Metadata, Resource, Spec};
use kontinuum_proto::talos::machine::machine_service_server::{
    MachineService, MachineServiceServer,
};
use kontinuum_proto::talos::machine::{self as pb, apply_configuration_request::Mode};
use kontinuum_talos::{
    ApplyMode, BootstrapOutcome, ClientIdentity, Endpoint, ErrorKind, ResetOptions, TalosClient,
    Timeouts,
};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, PKCS_ED25519,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::server::WebPkiClientVerifier;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::Connected;
use tonic::{Request, Response, Status};

// ---------------------------------------------------------------- PKI

struct Ca {
    issuer: Issuer<'static, KeyPair>,
    pem: String,
}

fn ca(org: &str) -> Ca {
    let key = KeyPair::generate_for(&PKCS_ED25519).unwrap();
    let mut params = CertificateParams::default();
    params
        .distinguished_name
        .push(DnType::OrganizationName, org);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let cert = params.self_signed(&key).unwrap();
    Ca {
        pem: cert.pem(),
        issuer: Issuer::new(params, key),
    }
}

struct Leaf {
    der: CertificateDer<'static>,
    pem: String,
    key: KeyPair,
}

fn leaf(ca: &Ca, server: bool) -> Leaf {
    let key = KeyPair::generate_for(&PKCS_ED25519).unwrap();
    let mut params = if server {
        let mut p = CertificateParams::new(vec!["127.0.0.1".to_owned()]).unwrap();
        p.distinguished_name
            .push(DnType::CommonName, "maintenance-service.talos.dev");
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        p
    } else {
        let mut p = CertificateParams::default();
        p.distinguished_name
            .push(DnType::OrganizationName, "os:admin");
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        p
    };
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    let cert = params.signed_by(&key, &ca.issuer).unwrap();
    Leaf {
        der: cert.der().clone(),
        pem: cert.pem(),
        key,
    }
}

/// Talos writes Ed25519 keys with a non-standard label; the client must cope.
fn talos_key_pem(key: &KeyPair) -> String {
    key.serialize_pem()
        .replace("PRIVATE KEY", "ED25519 PRIVATE KEY")
}

fn identity(ca: &Ca, client: &Leaf) -> ClientIdentity {
    ClientIdentity::new(
        ca.pem.clone(),
        client.pem.clone(),
        talos_key_pem(&client.key),
    )
}

// ---------------------------------------------------------------- fake Talos

#[derive(Default)]
struct Fake {
    hang: bool,
    bootstrapped: AtomicBool,
    /// Every `node` metadata value seen by Version ("" when absent).
    nodes: std::sync::Mutex<Vec<String>>,
    /// ApplyConfiguration requests received.
    applies: std::sync::atomic::AtomicU32,
}

fn kubeconfig_archive(body: &[u8]) -> Vec<u8> {
    // Like Talos: a gzip'd tar whose writer is never closed (no end-of-archive blocks).
    let mut header = tar::Header::new_gnu();
    header.set_path("kubeconfig").unwrap();
    header.set_size(body.len() as u64);
    header.set_mode(0o600);
    header.set_cksum();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(header.as_bytes()).unwrap();
    gz.write_all(body).unwrap();
    gz.finish().unwrap()
}

type BoxStream<T> = Pin<Box<dyn tokio_stream::Stream<Item = Result<T, Status>> + Send>>;

#[tonic::async_trait]
impl MachineService for Fake {
    async fn version(&self, request: Request<()>) -> Result<Response<pb::VersionResponse>, Status> {
        if self.hang {
            tokio::time::sleep(Duration::from_secs(3600)).await;
        }
        let node = request.metadata().get_all("node").iter().count();
        let node = match node {
            0 => String::new(),
            1 => request
                .metadata()
                .get("node")
                .unwrap()
                .to_str()
                .unwrap()
                .to_owned(),
            _ => {
                return Err(Status::invalid_argument(
                    "node metadata must be single-valued",
                ));
            }
        };
        self.nodes.lock().unwrap().push(node);
        Ok(Response::new(pb::VersionResponse {
            messages: vec![pb::Version {
                metadata: None,
                version: Some(pb::VersionInfo {
                    tag: "v1.13.8".into(),
                    sha: "3de49322".into(),
                    os: "linux".into(),
                    arch: "amd64".into(),
                    ..Default::default()
                }),
                platform: Some(pb::PlatformInfo {
                    name: "metal".into(),
                    mode: "metal".into(),
                }),
                features: None,
            }],
        }))
    }

    async fn apply_configuration(
        &self,
        request: Request<pb::ApplyConfigurationRequest>,
    ) -> Result<Response<pb::ApplyConfigurationResponse>, Status> {
        self.applies.fetch_add(1, Ordering::SeqCst);
        let req = request.into_inner();
        if !req.data.starts_with(b"version: v1alpha1") {
            return Err(Status::invalid_argument(
                "config is not a v1alpha1 document",
            ));
        }
        assert_eq!(req.mode(), Mode::Reboot);
        Ok(Response::new(pb::ApplyConfigurationResponse {
            messages: vec![pb::ApplyConfiguration {
                metadata: None,
                warnings: vec!["w".into()],
                mode: Mode::NoReboot.into(),
                mode_details: "Applied configuration without a reboot".into(),
            }],
        }))
    }

    async fn bootstrap(
        &self,
        _request: Request<pb::BootstrapRequest>,
    ) -> Result<Response<pb::BootstrapResponse>, Status> {
        if self.bootstrapped.swap(true, Ordering::SeqCst) {
            return Err(Status::already_exists("etcd data directory is not empty"));
        }
        Ok(Response::new(pb::BootstrapResponse {
            messages: vec![pb::Bootstrap { metadata: None }],
        }))
    }

    async fn kubeconfig(&self, _request: Request<()>) -> Result<Response<BoxStream<Data>>, Status> {
        let archive = kubeconfig_archive(b"apiVersion: v1\nkind: Config\n");
        let (first, second) = archive.split_at(archive.len() / 2);
        let chunks = vec![
            Ok(Data {
                metadata: None,
                bytes: first.to_vec(),
            }),
            Ok(Data {
                metadata: None,
                bytes: second.to_vec(),
            }),
        ];
        // The stream then stays open forever: the client must stop on its own.
        let stream =
            tokio_stream::StreamExt::chain(tokio_stream::iter(chunks), tokio_stream::pending());
        Ok(Response::new(Box::pin(stream)))
    }

    async fn reset(
        &self,
        request: Request<pb::ResetRequest>,
    ) -> Result<Response<pb::ResetResponse>, Status> {
        let req = request.into_inner();
        let labels: Vec<_> = req
            .system_partitions_to_wipe
            .iter()
            .map(|p| (p.label.as_str(), p.wipe))
            .collect();
        if labels != [("STATE", true), ("EPHEMERAL", true)] || !req.reboot || req.graceful {
            return Err(Status::invalid_argument("unexpected reset request"));
        }
        Ok(Response::new(pb::ResetResponse {
            messages: vec![pb::Reset {
                metadata: None,
                actor_id: "actor-1".into(),
            }],
        }))
    }
}

#[tonic::async_trait]
impl ClusterService for Fake {
    async fn health_check(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<BoxStream<HealthCheckProgress>>, Status> {
        let req = request.into_inner();
        if req.wait_timeout.is_none() {
            return Err(Status::deadline_exceeded("no wait timeout"));
        }
        let nodes = req.cluster_info.unwrap_or_default().control_plane_nodes;
        let progress = |message: String| {
            Ok(HealthCheckProgress {
                metadata: None,
                message,
            })
        };
        let items = vec![
            progress(format!("discovered nodes: {nodes:?}")),
            progress("waiting for etcd to be healthy: OK".into()),
        ];
        Ok(Response::new(Box::pin(tokio_stream::iter(items))))
    }
}

fn resource(ty: &str, id: &str, yaml: &str) -> Resource {
    Resource {
        metadata: Some(Metadata {
            r#type: ty.into(),
            id: id.into(),
            version: "1".into(),
            phase: "running".into(),
            ..Default::default()
        }),
        spec: Some(Spec {
            proto_spec: vec![],
            yaml_spec: yaml.into(),
        }),
    }
}

#[tonic::async_trait]
impl State for Fake {
    async fn list(
        &self,
        request: Request<ListRequest>,
    ) -> Result<Response<BoxStream<ListResponse>>, Status> {
        let req = request.into_inner();
        let resources = match (req.namespace.as_str(), req.r#type.as_str()) {
            ("network", "LinkStatuses.net.talos.dev") => vec![
                resource(
                    &req.r#type,
                    "eth0",
                    "hardwareAddr: 52:54:00:12:34:56\nmtu: 1500\n",
                ),
                resource(&req.r#type, "lo", "hardwareAddr: 00:00:00:00:00:00\n"),
            ],
            ("network", "AddressStatuses.net.talos.dev") => vec![
                resource(
                    &req.r#type,
                    "eth0/192.0.2.10/24",
                    "address: 192.0.2.10/24\nlinkName: eth0\n",
                ),
                resource(
                    &req.r#type,
                    "lo/127.0.0.1/8",
                    "address: 127.0.0.1/8\nlinkName: lo\n",
                ),
            ],
            ("runtime", "Disks.block.talos.dev") => vec![resource(
                &req.r#type,
                "vda",
                "size: 10737418240\nmodel: QEMU\nserial: S1\ntransport: virtio\nrotational: true\nreadonly: false\ncdrom: false\ndev_path: /dev/vda\n",
            )],
            _ => return Err(Status::not_found("unknown resource type")),
        };
        let items: Vec<_> = resources
            .into_iter()
            .map(|r| Ok(ListResponse { resource: Some(r) }))
            .collect();
        Ok(Response::new(Box::pin(tokio_stream::iter(items))))
    }
}

// ---------------------------------------------------------------- TLS server plumbing

struct TlsIo(tokio_rustls::server::TlsStream<TcpStream>);

impl Connected for TlsIo {
    type ConnectInfo = ();
    fn connect_info(&self) {}
}

impl AsyncRead for TlsIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for TlsIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

struct Served {
    addr: SocketAddr,
    cert_der: CertificateDer<'static>,
    negotiated_h2: Arc<AtomicBool>,
    fake: Arc<Fake>,
}

impl Served {
    fn endpoint(&self) -> Endpoint {
        self.addr.to_string().parse().unwrap()
    }
}

/// Serves the fake over TLS; with `client_ca`, client certificates are required (mTLS).
async fn serve(fake: Fake, server_ca: &Ca, client_ca: Option<&Ca>) -> Served {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let server = leaf(server_ca, true);
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(server.key.serialize_der()));
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap();
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            roots
                .add(CertificateDer::from_pem_slice_compat(&ca.pem))
                .unwrap();
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .unwrap();
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder
        .with_single_cert(vec![server.der.clone()], key)
        .unwrap();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));

    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let negotiated_h2 = Arc::new(AtomicBool::new(false));
    let (tx, rx) = tokio::sync::mpsc::channel::<std::io::Result<TlsIo>>(16);
    let h2 = Arc::clone(&negotiated_h2);
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (acceptor, tx, h2) = (acceptor.clone(), tx.clone(), Arc::clone(&h2));
            tokio::spawn(async move {
                if let Ok(tls) = acceptor.accept(tcp).await {
                    if tls.get_ref().1.alpn_protocol() == Some(b"h2") {
                        h2.store(true, Ordering::SeqCst);
                    }
                    let _ = tx.send(Ok(TlsIo(tls))).await;
                }
            });
        }
    });
    let fake = Arc::new(fake);
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(MachineServiceServer::from_arc(Arc::clone(&fake)))
            .add_service(ClusterServiceServer::from_arc(Arc::clone(&fake)))
            .add_service(StateServer::from_arc(Arc::clone(&fake)))
            .serve_with_incoming(ReceiverStream::new(rx)),
    );
    Served {
        addr,
        cert_der: server.der,
        negotiated_h2,
        fake,
    }
}

trait PemCompat {
    fn from_pem_slice_compat(pem: &str) -> CertificateDer<'static>;
}

impl PemCompat for CertificateDer<'static> {
    fn from_pem_slice_compat(pem: &str) -> CertificateDer<'static> {
        use rustls::pki_types::pem::PemObject;
        CertificateDer::from_pem_slice(pem.as_bytes()).unwrap()
    }
}

fn short() -> Timeouts {
    Timeouts {
        connect: Duration::from_secs(5),
        rpc: Duration::from_secs(5),
    }
}

// ---------------------------------------------------------------- tests

#[tokio::test]
async fn maintenance_version_discovery_and_fingerprint() {
    let server_ca = ca("maintenance");
    let served = serve(Fake::default(), &server_ca, None).await;
    let client = TalosClient::connect_maintenance(&served.endpoint(), short())
        .await
        .unwrap();

    let version = client.version().await.unwrap();
    assert_eq!(version.tag, "v1.13.8");
    assert_eq!(version.platform.as_deref(), Some("metal"));
    assert!(
        served.negotiated_h2.load(Ordering::SeqCst),
        "ALPN h2 was not negotiated"
    );

    let peer = client.peer_certificate().unwrap();
    let expected = Sha256::digest(&served.cert_der)
        .iter()
        .fold(String::new(), |s, b| s + &format!("{b:02x}"));
    assert_eq!(peer.certificate_sha256, expected);
    assert_eq!(
        peer.common_name.as_deref(),
        Some("maintenance-service.talos.dev")
    );
    assert!(peer.public_key_sha256.is_some());

    let found = client.discover().await.unwrap();
    let names: Vec<_> = found.interfaces.iter().map(|i| i.name.as_str()).collect();
    assert_eq!(names, ["eth0", "lo"]);
    assert_eq!(
        found.interfaces[0].mac_address.as_deref(),
        Some("52:54:00:12:34:56")
    );
    assert_eq!(found.interfaces[0].addresses, ["192.0.2.10/24"]);
    assert_eq!(found.disks.len(), 1);
    assert_eq!(found.disks[0].size_bytes, Some(10_737_418_240));
    assert_eq!(found.disks[0].dev_path.as_deref(), Some("/dev/vda"));

    let outcome = client
        .apply_configuration(b"version: v1alpha1\n".to_vec(), ApplyMode::Reboot)
        .await
        .unwrap();
    assert_eq!(outcome.mode, ApplyMode::NoReboot);
    assert_eq!(outcome.warnings, ["w"]);
    let err = client
        .apply_configuration(b"garbage".to_vec(), ApplyMode::Reboot)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert!(!err.is_transient());

    let err = client
        .get_resource("network", "Nope", "x")
        .await
        .unwrap_err();
    assert_eq!(
        err.kind(),
        ErrorKind::Unimplemented,
        "fake's State/Get is a default stub"
    );
}

#[tokio::test]
async fn pinned_maintenance_sends_nothing_to_another_machine() {
    let served = serve(Fake::default(), &ca("maintenance"), None).await;
    let recorded = TalosClient::connect_maintenance(&served.endpoint(), short())
        .await
        .unwrap()
        .peer_certificate()
        .unwrap()
        .public_key_sha256
        .unwrap();

    // The machine that was discovered: the pin holds, calls go through.
    let client = TalosClient::connect_maintenance_pinned(&served.endpoint(), &recorded, short())
        .await
        .unwrap();
    client
        .apply_configuration(b"version: v1alpha1\n".to_vec(), ApplyMode::Reboot)
        .await
        .unwrap();
    assert_eq!(served.fake.applies.load(Ordering::SeqCst), 1);

    // Another machine at the address (its key hashes to something else): refused in the
    // handshake, typed, not transient, and no request reached it.
    let other = "0".repeat(64);
    let err = TalosClient::connect_maintenance_pinned(&served.endpoint(), &other, short())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::IdentityMismatch, "{err:?}");
    assert_eq!(err.reason(), "IdentityMismatch");
    assert!(!err.is_transient());
    match &err {
        kontinuum_talos::Error::IdentityMismatch {
            expected,
            presented,
            ..
        } => {
            assert_eq!(expected, &other);
            assert_eq!(presented, &recorded);
        }
        other => panic!("unexpected error {other:?}"),
    }
    assert_eq!(served.fake.applies.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn configured_mtls_calls_succeed_with_the_right_identity() {
    let os_ca = ca("talos");
    let served = serve(Fake::default(), &os_ca, Some(&os_ca)).await;
    let admin = leaf(&os_ca, false);
    let client = TalosClient::connect(&served.endpoint(), &identity(&os_ca, &admin), short())
        .await
        .unwrap();

    assert_eq!(
        client.version().await.unwrap().platform.as_deref(),
        Some("metal")
    );
    // Routing through this endpoint to another node: one `node` value.
    let routed = client.with_node("10.0.0.7").unwrap();
    let version = routed.version().await.unwrap();
    assert_eq!(version.tag, "v1.13.8");
    assert_eq!(*served.fake.nodes.lock().unwrap(), ["", "10.0.0.7"]);
    assert!(client.with_node("").is_err());
    assert!(client.with_node("a,b").is_err());

    assert_eq!(
        client.bootstrap().await.unwrap(),
        BootstrapOutcome::Bootstrapped
    );
    assert_eq!(
        client.bootstrap().await.unwrap(),
        BootstrapOutcome::AlreadyBootstrapped
    );

    // The fake keeps the stream open after the archive: the client stops on its own.
    let started = Instant::now();
    let kubeconfig = client.kubeconfig().await.unwrap();
    assert_eq!(kubeconfig.as_bytes(), b"apiVersion: v1\nkind: Config\n");
    assert!(started.elapsed() < Duration::from_secs(4));

    let mut progress = Vec::new();
    client
        .health_check(
            Duration::from_secs(60),
            &["127.0.0.1".to_owned()],
            &[],
            |m| progress.push(m.to_owned()),
        )
        .await
        .unwrap();
    assert_eq!(progress.len(), 2);
    assert!(progress[0].contains("127.0.0.1"));

    let actor = client
        .reset(&ResetOptions::to_maintenance(false))
        .await
        .unwrap();
    assert_eq!(actor, "actor-1");
}

#[tokio::test]
async fn configured_mode_refuses_missing_or_foreign_client_certificates() {
    let os_ca = ca("talos");
    let served = serve(Fake::default(), &os_ca, Some(&os_ca)).await;

    // No client certificate at all.
    let result = match TalosClient::connect_maintenance(&served.endpoint(), short()).await {
        Ok(client) => client.version().await.map(|_| ()),
        Err(err) => Err(err),
    };
    let err = result.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Tls, "{err:?}");

    // A certificate from another CA.
    let other = ca("other");
    let stranger = leaf(&other, false);
    let id = ClientIdentity::new(
        os_ca.pem.clone(),
        stranger.pem.clone(),
        talos_key_pem(&stranger.key),
    );
    let result = match TalosClient::connect(&served.endpoint(), &id, short()).await {
        Ok(client) => client.version().await.map(|_| ()),
        Err(err) => Err(err),
    };
    let err = result.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Tls, "{err:?}");

    // A server that does not chain to our CA.
    let admin = leaf(&other, false);
    let err = TalosClient::connect(&served.endpoint(), &identity(&other, &admin), short())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Tls, "{err:?}");
    assert!(err.is_transient());
}

#[tokio::test]
async fn a_hanging_rpc_times_out_within_the_bound() {
    let server_ca = ca("maintenance");
    let served = serve(
        Fake {
            hang: true,
            ..Fake::default()
        },
        &server_ca,
        None,
    )
    .await;
    let timeouts = Timeouts {
        connect: Duration::from_secs(5),
        rpc: Duration::from_millis(300),
    };
    let client = TalosClient::connect_maintenance(&served.endpoint(), timeouts)
        .await
        .unwrap();
    let started = Instant::now();
    let err = client.version().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::TimedOut, "{err:?}");
    assert!(err.is_transient());
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn a_server_that_never_answers_tls_times_out_on_connect() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((tcp, _)) = listener.accept().await {
            held.push(tcp);
        }
    });
    let timeouts = Timeouts {
        connect: Duration::from_millis(300),
        rpc: Duration::from_secs(5),
    };
    let started = Instant::now();
    let err = TalosClient::connect_maintenance(&addr.to_string().parse().unwrap(), timeouts)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::TimedOut, "{err:?}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn a_closed_port_is_unreachable() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let err = TalosClient::connect_maintenance(&addr.to_string().parse().unwrap(), short())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unreachable, "{err:?}");
    assert!(err.is_transient());
}
