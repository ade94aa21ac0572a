//! What the emulator's tests share: a secrets bundle, machine configs, the admin identity
//! and Talos clients of the machines under test.
#![allow(clippy::unwrap_used, clippy::panic, dead_code)]

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use kontinuum_proto::talos::machine::machine_service_client::MachineServiceClient;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use tonic::transport::Channel;

use kontinuum_talos::{ClientIdentity, Endpoint, TalosClient, Timeouts};
use kontinuum_talos_config::{
    ConfigInput, InstallDisk, MachineType, SecretsBundle, TalosVersion, admin_talosconfig,
    render_machine_config,
};

/// Bounds on every Talos call of the tests.
pub const TIMEOUTS: Timeouts = Timeouts {
    connect: Duration::from_secs(10),
    rpc: Duration::from_secs(30),
};

/// A fresh secrets bundle (RSA 2048: fast enough for tests).
pub fn new_bundle() -> SecretsBundle {
    SecretsBundle::generate_with_rsa_bits(
        &mut rand_core::OsRng,
        jiff::Timestamp::now(),
        &TalosVersion::parse("v1.13.8").unwrap(),
        2048,
    )
    .unwrap()
}

/// The machine config of cluster `emu` for `hostname`, its control plane at `endpoint`.
pub fn config(
    bundle: &SecretsBundle,
    kind: MachineType,
    hostname: &str,
    endpoint: Ipv4Addr,
) -> Vec<u8> {
    let mut input = ConfigInput::new(
        "emu",
        endpoint.to_string(),
        TalosVersion::parse("v1.13.8").unwrap(),
        "1.36.2",
    );
    input.install_disk = InstallDisk::Path("/dev/sda".into());
    render_machine_config(&input, bundle, kind, hostname)
        .unwrap()
        .expose()
        .as_bytes()
        .to_vec()
}

/// The cluster's `os:admin` identity.
pub fn identity(bundle: &SecretsBundle) -> ClientIdentity {
    let admin = admin_talosconfig(
        bundle,
        "emu",
        &[],
        &[],
        jiff::Timestamp::now(),
        &mut rand_core::OsRng,
    )
    .unwrap();
    ClientIdentity::new(
        admin.identity.ca_pem,
        admin.identity.cert_pem,
        admin.identity.key_pem.expose(),
    )
}

/// One machine at `first_address` (free Talos and API ports, no control interface), its
/// state in a fresh directory named after `name`.
pub fn one_machine(name: &str, first_address: Ipv4Addr) -> talos_emulator::Settings {
    let dir = kontinuum_testbed::unique_dir(name);
    std::fs::create_dir_all(&dir).unwrap();
    talos_emulator::Settings {
        machines: 1,
        first_address,
        port: 0,
        api_port: 0,
        dir,
        control_addr: None,
    }
}

/// Applies `config` in maintenance mode, then bootstraps the machine as the cluster's
/// `os:admin`; returns that admin's client.
pub async fn apply_and_bootstrap(
    addr: SocketAddr,
    config: Vec<u8>,
    bundle: &SecretsBundle,
) -> TalosClient {
    maintenance(addr)
        .await
        .apply_configuration(config, kontinuum_talos::ApplyMode::Auto)
        .await
        .unwrap();
    let admin = configured(addr, &identity(bundle)).await;
    admin.bootstrap().await.unwrap();
    admin
}

/// The IPv4 address of a machine's socket address.
pub fn ip(addr: SocketAddr) -> Ipv4Addr {
    match addr.ip() {
        IpAddr::V4(v4) => v4,
        IpAddr::V6(_) => panic!("the emulator listens on IPv4 loopback only"),
    }
}

/// The Talos endpoint of a machine.
pub fn endpoint(addr: SocketAddr) -> Endpoint {
    addr.to_string().parse().unwrap()
}

/// A maintenance-mode client.
pub async fn maintenance(addr: SocketAddr) -> TalosClient {
    TalosClient::connect_maintenance(&endpoint(addr), TIMEOUTS)
        .await
        .unwrap()
}

/// A configured-mode client with `id`.
pub async fn configured(addr: SocketAddr, id: &ClientIdentity) -> TalosClient {
    TalosClient::connect(&endpoint(addr), id, TIMEOUTS)
        .await
        .unwrap()
}

/// PEM certificate and key of a client certificate of the bundle's OS CA with Organization
/// `org` (the role) and the given extended key usages.
pub fn leaf_pems(
    bundle: &SecretsBundle,
    org: &str,
    ekus: Vec<rcgen::ExtendedKeyUsagePurpose>,
) -> (String, String) {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
    let mut params = rcgen::CertificateParams::default();
    params
        .distinguished_name
        .push(rcgen::DnType::OrganizationName, org);
    params.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = ekus;
    let cert = params
        .signed_by(&key, &bundle.os_ca().issuer().unwrap())
        .unwrap();
    (cert.pem(), key.serialize_pem())
}

/// A client identity of the bundle's OS CA with role `org`.
pub fn leaf_cert(
    bundle: &SecretsBundle,
    org: &str,
    ekus: Vec<rcgen::ExtendedKeyUsagePurpose>,
) -> ClientIdentity {
    let (cert, key) = leaf_pems(bundle, org, ekus);
    ClientIdentity::new(bundle.os_ca().cert_pem.clone(), cert, key)
}

/// The cluster's `os:admin` identity for a raw client.
pub fn admin_tls(bundle: &SecretsBundle) -> Tls {
    let admin = admin_talosconfig(
        bundle,
        "emu",
        &[],
        &[],
        jiff::Timestamp::now(),
        &mut rand_core::OsRng,
    )
    .unwrap();
    Tls::Client {
        ca: admin.identity.ca_pem,
        cert: admin.identity.cert_pem,
        key: admin.identity.key_pem.expose().to_owned(),
    }
}

/// A raw client's identity with role `org` (EKU clientAuth).
pub fn role_tls(bundle: &SecretsBundle, org: &str) -> Tls {
    let (cert, key) = leaf_pems(
        bundle,
        org,
        vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth],
    );
    Tls::Client {
        ca: bundle.os_ca().cert_pem.clone(),
        cert,
        key,
    }
}

/// How a raw client presents itself.
pub enum Tls {
    /// Maintenance mode: no client certificate, any server certificate.
    Maintenance,
    /// Configured mode: this client certificate and key (PEM), the server verified against
    /// the bundle's OS CA.
    Client {
        ca: String,
        cert: String,
        key: String,
    },
}

/// A raw `MachineService` client of the machine at `addr`, for RPCs our client crate does not
/// have (Reboot, Upgrade). tonic speaks plain HTTP/2 to a loopback relay, which opens one TLS
/// connection (ALPN h2) to the machine per relayed connection; every call is bounded by the
/// caller.
pub async fn raw_machine(addr: SocketAddr, tls: Tls) -> MachineServiceClient<Channel> {
    let config = Arc::new(client_tls(tls));
    let relay = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let relay_addr = relay.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut plain, _)) = relay.accept().await {
            let config = Arc::clone(&config);
            tokio::spawn(async move {
                let Ok(tcp) = tokio::net::TcpStream::connect(addr).await else {
                    return;
                };
                let name = ServerName::IpAddress(addr.ip().into());
                let connector = tokio_rustls::TlsConnector::from(config);
                let Ok(Ok(mut tls)) =
                    tokio::time::timeout(TIMEOUTS.connect, connector.connect(name, tcp)).await
                else {
                    return;
                };
                let _ = tokio::io::copy_bidirectional(&mut plain, &mut tls).await;
            });
        }
    });
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{relay_addr}"))
        .unwrap()
        .connect_timeout(TIMEOUTS.connect)
        .timeout(TIMEOUTS.rpc)
        .connect_lazy();
    MachineServiceClient::new(channel)
}

fn client_tls(tls: Tls) -> rustls::ClientConfig {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .unwrap();
    let mut config = match tls {
        Tls::Maintenance => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyServer(provider)))
            .with_no_client_auth(),
        Tls::Client { ca, cert, key } => {
            let mut roots = rustls::RootCertStore::empty();
            for ca in CertificateDer::pem_slice_iter(ca.as_bytes()) {
                roots.add(ca.unwrap()).unwrap();
            }
            let chain: Vec<CertificateDer<'static>> =
                CertificateDer::pem_slice_iter(cert.as_bytes())
                    .map(Result::unwrap)
                    .collect();
            // Talos' `ED25519 PRIVATE KEY` label around a PKCS#8 body.
            let key = key.replace("ED25519 PRIVATE KEY", "PRIVATE KEY");
            let key = PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap();
            builder
                .with_root_certificates(roots)
                .with_client_auth_cert(chain, key)
                .unwrap()
        }
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    config
}

/// Accepts any server certificate (maintenance mode), still checking handshake signatures.
#[derive(Debug)]
struct AnyServer(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyServer {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
