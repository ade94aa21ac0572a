//! Talos calls of the bootstrapper, each bounded by the client's timeouts: the secrets
//! bundle and admin identity, machine configs, and the maintenance- and configured-mode
//! connections.

use std::time::Duration;

use kontinuum_talos::{ClientIdentity, Endpoint, ErrorKind, ResetOptions, TalosClient, Timeouts};
use kontinuum_talos_config::{
    ConfigInput, MachineConfig, MachineType, SecretsBundle, TalosVersion, admin_talosconfig,
    render_machine_config,
};

use kontinuum_operator_common::metrics::ControllerMetrics;

use crate::Error;
use crate::plan::{Member, Role};

/// How the bootstrapper reaches machines.
#[derive(Clone, Copy, Debug)]
pub struct Dialer {
    /// Talos API port of every machine.
    pub port: u16,
    /// Connect and per-call bounds.
    pub timeouts: Timeouts,
    /// Server-side wait of one cluster health check.
    pub health_wait: Duration,
}

impl Dialer {
    fn endpoint(&self, host: &str) -> Result<Endpoint, Error> {
        Endpoint::new(host, self.port).map_err(|source| Error::Talos {
            instance: host.to_owned(),
            source,
        })
    }

    /// A maintenance-mode connection (no client certificate).
    pub async fn maintenance(&self, member: &Member) -> Result<TalosClient, Error> {
        let host = address(member)?;
        TalosClient::connect_maintenance(&self.endpoint(host)?, self.timeouts)
            .await
            .map_err(Error::talos(&member.name))
    }

    /// A maintenance-mode connection that only the machine with the member's identity can
    /// complete (checked in the TLS handshake): the one to send a machine config over. A
    /// member without an identity gets nothing.
    pub async fn maintenance_pinned(&self, member: &Member) -> Result<TalosClient, Error> {
        let host = address(member)?;
        let identity = member
            .identity
            .as_deref()
            .ok_or_else(|| Error::NoIdentity {
                instance: member.name.clone(),
            })?;
        TalosClient::connect_maintenance_pinned(&self.endpoint(host)?, identity, self.timeouts)
            .await
            .map_err(Error::talos(&member.name))
    }

    /// A configured-mode connection (mTLS as `os:admin`).
    pub async fn configured(
        &self,
        member: &Member,
        identity: &ClientIdentity,
    ) -> Result<TalosClient, Error> {
        let host = address(member)?;
        TalosClient::connect(&self.endpoint(host)?, identity, self.timeouts)
            .await
            .map_err(Error::talos(&member.name))
    }
}

/// How a reset ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResetDone {
    /// The machine accepted the reset.
    Reset,
    /// The machine already answers in maintenance mode (an earlier reset whose result was
    /// lost, or a reinstall).
    AlreadyInMaintenance,
}

impl Dialer {
    /// Resets `member` to maintenance mode (STATE and EPHEMERAL wiped, reboot), dialled
    /// directly as `os:admin`. If that fails, a machine that answers in maintenance mode
    /// counts as reset.
    pub async fn reset(
        &self,
        member: &Member,
        identity: &ClientIdentity,
        graceful: bool,
        metrics: &ControllerMetrics,
    ) -> Result<ResetDone, Error> {
        let attempt = async {
            let client = self.configured(member, identity).await?;
            metrics.external_call("talos", "Reset");
            client
                .reset(&ResetOptions::to_maintenance(graceful))
                .await
                .map_err(Error::talos(&member.name))
        }
        .await;
        let Err(err) = attempt else {
            return Ok(ResetDone::Reset);
        };
        let maintenance = async {
            let client = self.maintenance(member).await?;
            metrics.external_call("talos", "Version");
            client.version().await.map_err(Error::talos(&member.name))
        }
        .await;
        match maintenance {
            Ok(version) if !version.rbac => Ok(ResetDone::AlreadyInMaintenance),
            _ => Err(err),
        }
    }
}

/// Whether an error means the machine did not answer (as opposed to refusing).
pub fn unreachable(err: &Error) -> bool {
    matches!(err, Error::Talos { source, .. } if matches!(
        source.kind(),
        ErrorKind::Unreachable | ErrorKind::TimedOut | ErrorKind::Unavailable
    ))
}

fn address(member: &Member) -> Result<&str, Error> {
    member.address.as_deref().ok_or_else(|| Error::NoAddress {
        instance: member.name.clone(),
    })
}

/// Generates a secrets bundle for `version` (blocking: RSA key generation takes seconds).
pub async fn generate_bundle(
    version: TalosVersion,
    rsa_bits: usize,
) -> Result<SecretsBundle, Error> {
    tokio::task::spawn_blocking(move || {
        SecretsBundle::generate_with_rsa_bits(
            &mut rand_core::OsRng,
            jiff::Timestamp::now(),
            &version,
            rsa_bits,
        )
    })
    .await
    .map_err(|_| Error::Join)?
    .map_err(Error::Secrets)
}

/// The admin identity (`os:admin`), signed now by the bundle's OS CA.
pub fn admin_identity(bundle: &SecretsBundle, cluster: &str) -> Result<ClientIdentity, Error> {
    let admin = admin_talosconfig(
        bundle,
        cluster,
        &[],
        &[],
        jiff::Timestamp::now(),
        &mut rand_core::OsRng,
    )
    .map_err(Error::Secrets)?;
    Ok(ClientIdentity::new(
        admin.identity.ca_pem,
        admin.identity.cert_pem,
        admin.identity.key_pem.expose(),
    ))
}

/// What every machine config of a cluster shares.
#[derive(Clone, Debug)]
pub struct ClusterInput {
    /// `cluster.clusterName`: the TalosCluster's name.
    pub name: String,
    /// The endpoint member's address.
    pub endpoint_host: String,
    /// The requested Talos version (used for machines that report none).
    pub talos_version: TalosVersion,
    /// Kubernetes version without a leading `v`.
    pub kubernetes_version: String,
}

/// Renders `member`'s config for the Talos version it reported (else the requested one).
pub fn machine_config(
    input: &ClusterInput,
    bundle: &SecretsBundle,
    member: &Member,
) -> Result<MachineConfig, Error> {
    let version = match &member.talos_version {
        Some(reported) => {
            TalosVersion::parse(reported).map_err(|source| Error::MachineVersion {
                instance: member.name.clone(),
                source,
            })?
        }
        None => input.talos_version.clone(),
    };
    version.contract().map_err(|source| Error::MachineVersion {
        instance: member.name.clone(),
        source,
    })?;
    let config_input = ConfigInput::new(
        &input.name,
        &input.endpoint_host,
        version,
        &input.kubernetes_version,
    );
    let machine_type = match member.role {
        Role::ControlPlane => MachineType::ControlPlane,
        Role::Worker => MachineType::Worker,
    };
    render_machine_config(&config_input, bundle, machine_type, &member.name).map_err(|source| {
        Error::Config {
            instance: member.name.clone(),
            source: Box::new(source),
        }
    })
}
