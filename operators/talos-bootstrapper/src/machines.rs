//! Talos calls of the bootstrapper, each bounded by the client's timeouts: the secrets
//! bundle and admin identity, machine configs, the maintenance- and configured-mode
//! connections, and [`Machines`], the one door every call goes through.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use kontinuum_talos::{
    ApplyMode, BootstrapOutcome, ClientIdentity, Endpoint, ErrorKind, ResetOptions, TalosClient,
    Timeouts, Version,
};
use kontinuum_talos_config::{
    ConfigInput, MachineConfig, MachineType, PatchedConfig, SecretsBundle, TalosVersion,
    admin_talosconfig, render_machine_config,
};

use kontinuum_operator_common::metrics::ControllerMetrics;

use crate::Error;
use crate::plan::{Member, Patches, Role, SourcedPatch};

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

/// A Talos call in flight.
pub type Call<'a, T> = Pin<Box<dyn Future<Output = Result<T, Error>> + Send + 'a>>;

/// A health check in flight: its outcome, and the progress messages it reported.
pub type HealthCall<'a> =
    Pin<Box<dyn Future<Output = (Result<(), Error>, Vec<String>)> + Send + 'a>>;

/// Every Talos call the bootstrapper makes, one method per RPC, each bounded by its
/// implementation's timeouts: [`Network`] makes them over the wire; the unit tests script
/// them. The decisions around the calls (a failed apply that already took effect, a reset
/// machine found in maintenance mode) are the functions below, written once over this.
pub trait Machines: Send + Sync {
    /// ApplyConfiguration (mode REBOOT) over the maintenance connection pinned to the
    /// member's identity: nothing is sent to another machine.
    fn apply<'a>(&'a self, member: &'a Member, config: &'a [u8]) -> Call<'a, ()>;
    /// Version in maintenance mode (no client certificate).
    fn maintenance_version<'a>(&'a self, member: &'a Member) -> Call<'a, Version>;
    /// Version as the cluster's `os:admin`.
    fn version<'a>(&'a self, member: &'a Member, identity: &'a ClientIdentity)
    -> Call<'a, Version>;
    /// Bootstrap (etcd) on the endpoint member.
    fn bootstrap<'a>(
        &'a self,
        endpoint: &'a Member,
        identity: &'a ClientIdentity,
    ) -> Call<'a, BootstrapOutcome>;
    /// The admin kubeconfig the control plane hands out.
    fn kubeconfig<'a>(
        &'a self,
        endpoint: &'a Member,
        identity: &'a ClientIdentity,
    ) -> Call<'a, Vec<u8>>;
    /// The cluster health check through `endpoint`, over exactly these nodes.
    fn health_check<'a>(
        &'a self,
        endpoint: &'a Member,
        identity: &'a ClientIdentity,
        control_plane: &'a [String],
        workers: &'a [String],
    ) -> HealthCall<'a>;
    /// Reset to maintenance mode (STATE and EPHEMERAL wiped, reboot).
    fn reset<'a>(
        &'a self,
        member: &'a Member,
        identity: &'a ClientIdentity,
        graceful: bool,
    ) -> Call<'a, ()>;
    /// ApplyConfiguration (mode AUTO) to a running member, as the cluster's `os:admin`:
    /// Talos applies it live, or reboots when the change needs it. Returns whether it
    /// reboots.
    fn reconfigure<'a>(
        &'a self,
        member: &'a Member,
        identity: &'a ClientIdentity,
        config: &'a [u8],
    ) -> Call<'a, bool>;
}

/// [`Machines`] over the network: each call dials the machine (bounded by the dialer's
/// timeouts) and is counted in `kontinuum_talos_bootstrapper_external_calls_total` once the
/// connection stands.
pub struct Network {
    /// How machines are dialled.
    pub dialer: Dialer,
    /// Where calls are counted.
    pub metrics: Arc<ControllerMetrics>,
}

impl Network {
    fn count(&self, rpc: &str) {
        self.metrics.external_call("talos", rpc);
    }
}

impl Machines for Network {
    fn reconfigure<'a>(
        &'a self,
        member: &'a Member,
        identity: &'a ClientIdentity,
        config: &'a [u8],
    ) -> Call<'a, bool> {
        Box::pin(async move {
            let client = self.dialer.configured(member, identity).await?;
            self.count("ApplyConfiguration");
            client
                .apply_configuration(config.to_vec(), ApplyMode::Auto)
                .await
                .map(|applied| applied.mode == ApplyMode::Reboot)
                .map_err(Error::talos(&member.name))
        })
    }

    fn apply<'a>(&'a self, member: &'a Member, config: &'a [u8]) -> Call<'a, ()> {
        Box::pin(async move {
            let client = self.dialer.maintenance_pinned(member).await?;
            self.count("ApplyConfiguration");
            client
                .apply_configuration(config.to_vec(), ApplyMode::Reboot)
                .await
                .map(|_| ())
                .map_err(Error::talos(&member.name))
        })
    }

    fn maintenance_version<'a>(&'a self, member: &'a Member) -> Call<'a, Version> {
        Box::pin(async move {
            let client = self.dialer.maintenance(member).await?;
            self.count("Version");
            client.version().await.map_err(Error::talos(&member.name))
        })
    }

    fn version<'a>(
        &'a self,
        member: &'a Member,
        identity: &'a ClientIdentity,
    ) -> Call<'a, Version> {
        Box::pin(async move {
            let client = self.dialer.configured(member, identity).await?;
            self.count("Version");
            client.version().await.map_err(Error::talos(&member.name))
        })
    }

    fn bootstrap<'a>(
        &'a self,
        endpoint: &'a Member,
        identity: &'a ClientIdentity,
    ) -> Call<'a, BootstrapOutcome> {
        Box::pin(async move {
            let client = self.dialer.configured(endpoint, identity).await?;
            self.count("Bootstrap");
            client
                .bootstrap()
                .await
                .map_err(Error::talos(&endpoint.name))
        })
    }

    fn kubeconfig<'a>(
        &'a self,
        endpoint: &'a Member,
        identity: &'a ClientIdentity,
    ) -> Call<'a, Vec<u8>> {
        Box::pin(async move {
            let client = self.dialer.configured(endpoint, identity).await?;
            self.count("Kubeconfig");
            client
                .kubeconfig()
                .await
                .map(kontinuum_talos::Kubeconfig::into_bytes)
                .map_err(Error::talos(&endpoint.name))
        })
    }

    fn health_check<'a>(
        &'a self,
        endpoint: &'a Member,
        identity: &'a ClientIdentity,
        control_plane: &'a [String],
        workers: &'a [String],
    ) -> HealthCall<'a> {
        Box::pin(async move {
            let mut progress = Vec::new();
            let checked = async {
                let client = self.dialer.configured(endpoint, identity).await?;
                self.count("HealthCheck");
                client
                    .health_check(self.dialer.health_wait, control_plane, workers, |m| {
                        progress.push(m.to_owned());
                    })
                    .await
                    .map_err(Error::talos(&endpoint.name))
            }
            .await;
            (checked, progress)
        })
    }

    fn reset<'a>(
        &'a self,
        member: &'a Member,
        identity: &'a ClientIdentity,
        graceful: bool,
    ) -> Call<'a, ()> {
        Box::pin(async move {
            let client = self.dialer.configured(member, identity).await?;
            self.count("Reset");
            client
                .reset(&ResetOptions::to_maintenance(graceful))
                .await
                .map(|_| ())
                .map_err(Error::talos(&member.name))
        })
    }
}

/// Sends `config` to `member`; if that fails, a machine that answers this cluster's
/// `os:admin` identity counts as configured (an earlier apply whose answer or status write
/// was lost), and the first error stands otherwise.
pub async fn apply_config(
    machines: &dyn Machines,
    member: &Member,
    identity: &ClientIdentity,
    config: &[u8],
) -> Result<(), Error> {
    let Err(err) = machines.apply(member, config).await else {
        return Ok(());
    };
    match machines.version(member, identity).await {
        Ok(v) if v.rbac => Ok(()),
        _ => Err(err),
    }
}

/// Resets `member` to maintenance mode, dialled directly as `os:admin`. If that fails, a
/// machine that answers in maintenance mode counts as reset; the reset's error stands
/// otherwise.
pub async fn reset(
    machines: &dyn Machines,
    member: &Member,
    identity: &ClientIdentity,
    graceful: bool,
) -> Result<ResetDone, Error> {
    let Err(err) = machines.reset(member, identity, graceful).await else {
        return Ok(ResetDone::Reset);
    };
    match machines.maintenance_version(member).await {
        Ok(version) if !version.rbac => Ok(ResetDone::AlreadyInMaintenance),
        _ => Err(err),
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
    /// The cluster's and its pools' machine-config patches.
    pub patches: Patches,
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
    let mut config_input = ConfigInput::new(
        &input.name,
        &input.endpoint_host,
        version,
        &input.kubernetes_version,
    );
    // The endpoint is in the API server's certificate (Talos adds it too; explicit here, so
    // a load balancer's name is there whatever the Talos version).
    config_input.api_server_cert_sans = vec![input.endpoint_host.clone()];
    let machine_type = match member.role {
        Role::ControlPlane => MachineType::ControlPlane,
        Role::Worker => MachineType::Worker,
    };
    let config = render_machine_config(&config_input, bundle, machine_type, &member.name).map_err(
        |source| Error::Config {
            instance: member.name.clone(),
            source: Box::new(source),
        },
    )?;
    let patches = input.patches.for_member(member);
    if patches.is_empty() {
        return Ok(config);
    }
    patched(config, &patches, &config_input.talos_version, &member.name)
}

/// SHA-256 (hex) of a machine config: what `status.machineConfigs[].hash` records.
pub fn config_hash(config: &MachineConfig) -> String {
    kontinuum_crds::names::sha256_hex(config.expose().as_bytes())
}

/// `config` with `patches` merged in order, as Talos merges them. The config is validated
/// as Talos decodes and validates one after each patch, so the first patch that makes it
/// invalid is the one named (the generated config itself is valid).
fn patched(
    config: MachineConfig,
    patches: &[SourcedPatch<'_>],
    version: &TalosVersion,
    instance: &str,
) -> Result<MachineConfig, Error> {
    let failed = |patch: &str, problem: String| Error::Patch {
        instance: instance.to_owned(),
        patch: patch.to_owned(),
        problem,
    };
    let contract = kontinuum_talos_validate::Contract::from_version(&version.to_string())
        .map_err(|e| failed(&patches[0].source, e.to_string()))?;
    let mut documents =
        PatchedConfig::new(&config).map_err(|e| failed(&patches[0].source, e.to_string()))?;
    let mut config = config;
    for patch in patches {
        documents
            .apply(patch.patch)
            .map_err(|e| failed(&patch.source, e.to_string()))?;
        config = documents
            .render()
            .map_err(|e| failed(&patch.source, e.to_string()))?;
        kontinuum_talos_validate::validate(config.expose().as_bytes(), contract).map_err(
            |problems| failed(&patch.source, kontinuum_talos_validate::describe(&problems)),
        )?;
    }
    Ok(config)
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    /// How a scripted call answers.
    #[derive(Clone, Copy, Debug)]
    enum Answer {
        Ok,
        /// Version answers, with RBAC on (configured) or off (maintenance mode).
        Version {
            rbac: bool,
        },
        /// Nothing answers.
        Unreachable,
        /// Another machine answers at the address.
        OtherMachine,
    }

    /// Machines that answer as scripted and record what was called.
    struct Scripted {
        apply: Answer,
        version: Answer,
        maintenance_version: Answer,
        reset: Answer,
        calls: Mutex<Vec<&'static str>>,
    }

    impl Scripted {
        fn new(apply: Answer, version: Answer, maintenance_version: Answer, reset: Answer) -> Self {
            Self {
                apply,
                version,
                maintenance_version,
                reset,
                calls: Mutex::new(Vec::new()),
            }
        }

        fn calls(&self) -> Vec<&'static str> {
            self.calls.lock().unwrap().clone()
        }

        fn answer<T: Send + 'static>(
            &self,
            rpc: &'static str,
            member: &Member,
            answer: Answer,
            ok: impl FnOnce(Answer) -> Option<T>,
        ) -> Call<'_, T> {
            self.calls.lock().unwrap().push(rpc);
            let instance = member.name.clone();
            let result = match answer {
                Answer::Unreachable => Err(Error::Talos {
                    instance,
                    source: kontinuum_talos::Error::ConnectTimedOut {
                        endpoint: "192.0.2.1:50000".into(),
                        after: Duration::from_secs(10),
                    },
                }),
                Answer::OtherMachine => Err(Error::Talos {
                    instance,
                    source: kontinuum_talos::Error::IdentityMismatch {
                        endpoint: "192.0.2.1:50000".into(),
                        expected: "aa".into(),
                        presented: "bb".into(),
                    },
                }),
                other => ok(other).ok_or_else(|| Error::Talos {
                    instance,
                    source: kontinuum_talos::Error::InvalidNode {
                        node: format!("{rpc} was not scripted to answer {other:?}"),
                    },
                }),
            };
            Box::pin(async move { result })
        }
    }

    fn version(answer: Answer) -> Option<Version> {
        match answer {
            Answer::Version { rbac } => Some(Version {
                tag: "v1.13.0".into(),
                rbac,
                ..Version::default()
            }),
            _ => None,
        }
    }

    fn unit(answer: Answer) -> Option<()> {
        matches!(answer, Answer::Ok).then_some(())
    }

    impl Machines for Scripted {
        fn apply<'a>(&'a self, member: &'a Member, _: &'a [u8]) -> Call<'a, ()> {
            self.answer("ApplyConfiguration", member, self.apply, unit)
        }
        fn maintenance_version<'a>(&'a self, member: &'a Member) -> Call<'a, Version> {
            self.answer(
                "Version (maintenance)",
                member,
                self.maintenance_version,
                version,
            )
        }
        fn version<'a>(&'a self, member: &'a Member, _: &'a ClientIdentity) -> Call<'a, Version> {
            self.answer("Version", member, self.version, version)
        }
        fn bootstrap<'a>(
            &'a self,
            member: &'a Member,
            _: &'a ClientIdentity,
        ) -> Call<'a, BootstrapOutcome> {
            self.answer("Bootstrap", member, Answer::Ok, |_| {
                Some(BootstrapOutcome::Bootstrapped)
            })
        }
        fn kubeconfig<'a>(
            &'a self,
            member: &'a Member,
            _: &'a ClientIdentity,
        ) -> Call<'a, Vec<u8>> {
            self.answer("Kubeconfig", member, Answer::Ok, |_| Some(Vec::new()))
        }
        fn health_check<'a>(
            &'a self,
            _: &'a Member,
            _: &'a ClientIdentity,
            _: &'a [String],
            _: &'a [String],
        ) -> HealthCall<'a> {
            Box::pin(async { (Ok(()), Vec::new()) })
        }
        fn reset<'a>(&'a self, member: &'a Member, _: &'a ClientIdentity, _: bool) -> Call<'a, ()> {
            self.answer("Reset", member, self.reset, unit)
        }
        fn reconfigure<'a>(
            &'a self,
            member: &'a Member,
            _: &'a ClientIdentity,
            _: &'a [u8],
        ) -> Call<'a, bool> {
            self.answer(
                "ApplyConfiguration (configured)",
                member,
                Answer::Ok,
                |_| Some(false),
            )
        }
    }

    fn member() -> Member {
        Member {
            name: "m-1".into(),
            pool: "cp".into(),
            role: Role::ControlPlane,
            address: Some("192.0.2.1".into()),
            discovered: true,
            configured: false,
            joined: false,
            talos_version: Some("v1.13.0".into()),
            identity: Some("aa".into()),
            config_patches: Vec::new(),
        }
    }

    fn patch(json: serde_json::Value) -> kontinuum_crds::v1alpha2::ConfigPatch {
        serde_json::from_value(json).unwrap()
    }

    /// A cluster whose spec patches every machine, its control-plane pool and one Instance.
    #[allow(clippy::needless_pass_by_value)]
    fn patched_input(cluster: serde_json::Value) -> ClusterInput {
        let spec = serde_json::json!({
            "talos": { "configPatches": [cluster] },
            "controlPlane": {
                "poolRef": { "name": "cp" },
                "configPatches": [{ "machine": { "install": {
                    "disk": "/dev/sda", "diskSelector": { "$patch": "delete" },
                } } }],
            },
        });
        let cluster =
            kontinuum_crds::v1alpha2::TalosCluster::new("c", serde_json::from_value(spec).unwrap());
        ClusterInput {
            name: "c".into(),
            endpoint_host: "192.0.2.1".into(),
            talos_version: TalosVersion::parse("v1.13.0").unwrap(),
            kubernetes_version: "1.32.0".into(),
            patches: Patches::of(&cluster),
        }
    }

    fn bundle() -> SecretsBundle {
        use rand_core::SeedableRng as _;
        SecretsBundle::generate_with_rsa_bits(
            &mut rand_chacha::ChaCha20Rng::seed_from_u64(7),
            jiff::Timestamp::now(),
            &TalosVersion::parse("v1.13.0").unwrap(),
            1024,
        )
        .unwrap()
    }

    #[test]
    fn a_shared_ip_is_a_layer2_vip_document_on_control_planes_only() {
        let spec = serde_json::json!({
            "controlPlane": {
                "poolRef": { "name": "cp" },
                "endpoint": { "vip": { "ip": "192.0.2.100", "link": "enp1s0" } },
            },
            "workers": [{ "name": "w", "poolRef": { "name": "w" } }],
        });
        let cluster =
            kontinuum_crds::v1alpha2::TalosCluster::new("c", serde_json::from_value(spec).unwrap());
        let vip_documents = |version: &str, role: Role| {
            let input = ClusterInput {
                name: "c".into(),
                endpoint_host: "192.0.2.100".into(),
                talos_version: TalosVersion::parse(version).unwrap(),
                kubernetes_version: "1.32.0".into(),
                patches: Patches::of(&cluster),
            };
            let mut m = member();
            m.talos_version = Some(version.into());
            m.role = role;
            m.pool = if role == Role::ControlPlane {
                "cp"
            } else {
                "w"
            }
            .into();
            // Validated after the patch, for the machine's Talos line.
            let config = machine_config(&input, &bundle(), &m).unwrap();
            let documents: Vec<serde_json::Value> =
                serde_saphyr::from_multiple(config.expose()).unwrap();
            documents
                .into_iter()
                .filter(|d| d["kind"] == "Layer2VIPConfig")
                .collect::<Vec<_>>()
        };
        for version in ["v1.12.0", "v1.13.0"] {
            assert_eq!(
                vip_documents(version, Role::ControlPlane),
                [serde_json::json!({
                    "apiVersion": "v1alpha1", "kind": "Layer2VIPConfig",
                    "name": "192.0.2.100", "link": "enp1s0",
                })],
                "{version}"
            );
            assert!(vip_documents(version, Role::Worker).is_empty(), "{version}");
        }
    }

    #[test]
    fn patches_merge_cluster_then_pool_then_instance_into_a_valid_config() {
        let mirror = serde_json::json!({ "machine": { "registries": { "mirrors": {
            "docker.io": { "endpoints": ["https://mirror.example"] },
        } } } });
        let input = patched_input(mirror);
        let mut m = member();
        m.config_patches = vec![
            patch(
                serde_json::json!({ "machine": { "network": { "interfaces": [
                { "interface": "eth0", "addresses": ["192.0.2.1/24"] },
            ] } } }),
            ),
            // The Instance's patch comes last: it overrides the pool's.
            patch(serde_json::json!({ "machine": { "install": { "disk": "/dev/vda" } } })),
        ];
        let config = machine_config(&input, &bundle(), &m).unwrap();
        let parsed =
            kontinuum_talos_config::parse_machine_config(config.expose().as_bytes()).unwrap();
        assert_eq!(
            parsed.install_disk,
            kontinuum_talos_config::InstallDisk::Path("/dev/vda".into())
        );
        let main: serde_json::Value =
            serde_saphyr::from_multiple::<serde_json::Value>(config.expose())
                .unwrap()
                .remove(0);
        assert_eq!(
            main.pointer("/machine/registries/mirrors/docker.io/endpoints/0"),
            Some(&serde_json::json!("https://mirror.example"))
        );
        assert_eq!(
            main.pointer("/machine/network/interfaces/0/addresses/0"),
            Some(&serde_json::json!("192.0.2.1/24"))
        );
        assert_eq!(main.pointer("/machine/install/diskSelector"), None);
        // A worker of another pool gets only the cluster's patch.
        let mut worker = member();
        worker.pool = "workers".into();
        worker.role = Role::Worker;
        let config = machine_config(&input, &bundle(), &worker).unwrap();
        assert!(config.expose().contains("mirror.example"));
        assert!(!config.expose().contains("disk: /dev/sda"));
    }

    #[test]
    fn a_patch_talos_would_refuse_is_named_with_its_field() {
        let rows = [
            (
                serde_json::json!({ "machine": { "registries": { "mirrorz": {} } } }),
                "TalosCluster spec.talos.configPatches[0]",
                ".machine.registries.mirrorz",
            ),
            (
                serde_json::json!({ "machine": { "install": { "wipe": "sometimes" } } }),
                "TalosCluster spec.talos.configPatches[0]",
                ".machine.install.wipe",
            ),
            (
                serde_json::json!({ "version": "v1alpha1", "$patch": "delete" }),
                "TalosCluster spec.talos.configPatches[0]",
                "v1alpha1 document cannot be deleted",
            ),
        ];
        for (bad, source, field) in rows {
            let err = machine_config(&patched_input(bad.clone()), &bundle(), &member())
                .expect_err(&bad.to_string());
            let Error::Patch {
                instance,
                patch,
                problem,
            } = &err
            else {
                panic!("{bad}: not a patch error: {err}");
            };
            assert_eq!(
                (instance.as_str(), patch.as_str()),
                ("m-1", source),
                "{bad}"
            );
            assert!(problem.contains(field), "{bad}: {problem}");
        }
        // The Instance's own patch is named as such, after the valid ones before it.
        let mut m = member();
        m.config_patches = vec![patch(
            serde_json::json!({ "machine": { "kubelet": { "extraArgz": {} } } }),
        )];
        let input = patched_input(serde_json::json!({ "machine": { "certSANs": ["a.example"] } }));
        let err = machine_config(&input, &bundle(), &m).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("machine config of m-1: patch Instance m-1 spec.configPatches[0]: "),
            "{err}"
        );
        assert!(
            err.to_string().contains(".machine.kubelet.extraArgz"),
            "{err}"
        );
    }

    fn identity() -> ClientIdentity {
        ClientIdentity::new("ca", "cert", "key")
    }

    #[tokio::test]
    async fn a_failed_apply_counts_only_when_the_machine_is_already_ours() {
        use Answer::{Ok as Answered, OtherMachine, Unreachable, Version as V};
        // (apply, admin Version) → applied?, calls made
        let rows = [
            (Answered, Unreachable, true, vec!["ApplyConfiguration"]),
            // The answer was lost, the config took: the machine answers our admin.
            (
                Unreachable,
                V { rbac: true },
                true,
                vec!["ApplyConfiguration", "Version"],
            ),
            (
                Unreachable,
                Unreachable,
                false,
                vec!["ApplyConfiguration", "Version"],
            ),
            (
                Unreachable,
                V { rbac: false },
                false,
                vec!["ApplyConfiguration", "Version"],
            ),
            (
                OtherMachine,
                Unreachable,
                false,
                vec!["ApplyConfiguration", "Version"],
            ),
        ];
        for (apply, admin, applied, calls) in rows {
            let machines = Scripted::new(apply, admin, Unreachable, Unreachable);
            let result = apply_config(&machines, &member(), &identity(), b"config").await;
            assert_eq!(
                result.is_ok(),
                applied,
                "{apply:?} then {admin:?}: {result:?}"
            );
            assert_eq!(machines.calls(), calls, "{apply:?} then {admin:?}");
            if let (OtherMachine, Err(err)) = (apply, &result) {
                // The first error stands: it says another machine answers.
                assert!(err.to_string().contains("m-1"), "{err}");
                assert!(
                    matches!(err, Error::Talos { source, .. } if matches!(source, kontinuum_talos::Error::IdentityMismatch { .. })),
                    "{err:?}"
                );
            }
        }
    }

    #[tokio::test]
    async fn a_failed_reset_counts_only_when_the_machine_is_in_maintenance_mode() {
        use Answer::{Ok as Answered, Unreachable, Version as V};
        // (reset, maintenance Version) → outcome, calls made
        let rows = [
            (Answered, Unreachable, Some(ResetDone::Reset), vec!["Reset"]),
            (
                Unreachable,
                V { rbac: false },
                Some(ResetDone::AlreadyInMaintenance),
                vec!["Reset", "Version (maintenance)"],
            ),
            // Answering with RBAC on: still configured, not reset.
            (
                Unreachable,
                V { rbac: true },
                None,
                vec!["Reset", "Version (maintenance)"],
            ),
            (
                Unreachable,
                Unreachable,
                None,
                vec!["Reset", "Version (maintenance)"],
            ),
        ];
        for (answer, maintenance, outcome, calls) in rows {
            let machines = Scripted::new(Unreachable, Unreachable, maintenance, answer);
            let result = reset(&machines, &member(), &identity(), true).await;
            assert_eq!(
                result.as_ref().ok().copied(),
                outcome,
                "{answer:?} then {maintenance:?}"
            );
            assert_eq!(machines.calls(), calls, "{answer:?} then {maintenance:?}");
            if outcome.is_none() {
                let err = result.unwrap_err();
                assert!(unreachable(&err), "the reset's own error stands: {err:?}");
            }
        }
    }
}
