//! What the emulator's tests share: a secrets bundle, machine configs, the admin identity
//! and Talos clients of the machines under test.
#![allow(clippy::unwrap_used, clippy::panic, dead_code)]

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

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
