//! `talos-emulator`: many emulated Talos machines in one process, speaking the Talos wire
//! protocol on consecutive loopback addresses.
//!
//! * Maintenance mode: self-signed Ed25519 TLS (ALPN h2, no client certificate), Version,
//!   COSI links/addresses/disks (`proto_spec` and `yaml_spec` filled, as Talos does),
//!   ApplyConfiguration: decoded and validated strictly as Talos v1.13 does
//!   (`kontinuum_talos_validate`: unknown keys, wrong types, missing or invalid fields →
//!   `InvalidArgument` with a Talos-shaped message, counted, nothing applied), then read with
//!   `kontinuum_talos_config::parse_machine_config` for what the emulator needs.
//! * Configured mode: mTLS against the OS CA of the applied config (`os:admin`, EKU exactly
//!   clientAuth); Bootstrap starts a REAL control plane from the test bed on the machine's
//!   address, built from what the config says (`cluster_config`): its Kubernetes, etcd
//!   (etcd on TLS) and aggregator CAs, ServiceAccount key, first IPv4 pod and Service
//!   networks, cluster name and API port (`localAPIServerPort`, else the endpoint's port when
//!   it names the machine, else 6443; [`Settings::api_port`] if that port is taken), Talos'
//!   control-plane label and, with `allowSchedulingOnControlPlanes: false`, its NoSchedule
//!   taint; CNI `none` installs nothing, and what cannot be honoured (another CNI, further or
//!   IPv6 networks, a taken port) is logged as ignored, one line per setting; Kubeconfig, HealthCheck (over the nodes the request lists: etcd members,
//!   Nodes), Reset; workers and further control planes join the cluster of the same id.
//!   Reboot (`os:admin` or `os:operator`) and Upgrade (`os:admin`; an installer image
//!   `…/installer:vX.Y.Z`, a malformed reference → `InvalidArgument`): answered, then the
//!   machine reboots in place — unreachable for [`Emulator::set_reboot_downtime`] (1 s by
//!   default), connections made before stale, then back configured with the same config and
//!   its cluster running; after an Upgrade, Version reports the installer's tag (kept across
//!   emulator restarts and resets, forgotten by a full wipe). In maintenance mode both are
//!   `PermissionDenied`, as Talos v1.13's authorizer refuses every caller there.
//!   ApplyConfiguration to a configured machine (`os:admin`) replaces the config it runs and
//!   keeps its cluster; in AUTO mode it reboots only for a change outside what applies live
//!   ([`core::needs_reboot`]), NO_REBOOT refuses such a change, the answer names the mode
//!   used. [`Emulator::running_config`] (and `GET /machines/<ip>/config`) is what it runs.
//! * Each machine of a cluster is a **hostlet** node by default ([`nodes`]): named after its
//!   hostname, InternalIP its address, pods of our image (`kontinuum:<any tag>`, binaries
//!   found next to the emulator's executable) run as real processes, others are pretended
//!   Running/Ready as KWOK does. A reset worker's hostlet stops and its Node is removed.
//!   [`NodeAgent::Kwok`] (`--node-agent kwok`) keeps KWOK nodes.
//! * Faults injected per machine ([`Fault`]), in process or through the HTTP control
//!   interface ([`control`]).
//!
//! The state machine is pure ([`core`]); sockets, files and the test bed are at the edges.

mod cluster_config;
pub mod control;
pub mod core;
mod error;
mod machine;
pub mod nodes;
pub mod pki;
mod service;
mod vip;

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use kontinuum_proto::talos::cluster::cluster_service_server::ClusterServiceServer;
use kontinuum_proto::talos::cosi::resource::state_server::StateServer;
use kontinuum_proto::talos::machine::machine_service_server::MachineServiceServer;
use kontinuum_proto::talos::storage::storage_service_server::StorageServiceServer;
use serde::Deserialize;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;

pub use crate::core::Mode;
pub use crate::error::Error;
pub use crate::machine::CallRecord;
pub use crate::nodes::{NodeAgent, NodeSettings};
pub use crate::service::TALOS_TAG;

use crate::core::Facts;
use crate::machine::{Machine, Shared};

/// Largest gRPC message either way (Talos' `GRPCMaxMessageSize`).
pub const MAX_MESSAGE_SIZE: usize = 32 * 1024 * 1024;
/// The Talos API port.
pub const DEFAULT_PORT: u16 = 50000;
/// The Kubernetes API port of a bootstrapped control plane.
pub const DEFAULT_API_PORT: u16 = 6443;

/// What to emulate. How bootstrapped clusters get their nodes is [`NodeSettings`], passed to
/// [`Emulator::start_with`] ([`Emulator::start`] uses the default: hostlet nodes).
#[derive(Clone, Debug)]
pub struct Settings {
    /// Number of machines.
    pub machines: usize,
    /// Address of machine 0; machine i listens on the i-th following address.
    pub first_address: Ipv4Addr,
    /// Talos API port of every machine (0: a free port per machine, for tests).
    pub port: u16,
    /// Kubernetes API port of a bootstrapped control plane when the one its config names is
    /// taken on its address (0: a free one per bootstrap).
    pub api_port: u16,
    /// State directory (one sub-directory per machine address).
    pub dir: PathBuf,
    /// Where the HTTP control interface listens (None: no control interface).
    pub control_addr: Option<SocketAddr>,
}

/// A fault to inject into one machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(tag = "fault", rename_all = "kebab-case")]
pub enum Fault {
    /// Every RPC hangs for this long (calls already running keep hanging until then).
    Hang {
        /// Seconds to hang.
        seconds: u64,
    },
    /// Stop listening: new connections are refused.
    Refuse,
    /// Answer every RPC with `Unavailable`.
    Unavailable,
    /// Reboot into maintenance mode, the config staying on disk.
    Reboot,
    /// Another machine now answers at this address: a new maintenance key (so a new
    /// identity), kept across restarts. Connections already open keep the old one.
    Replace,
    /// Armed, once: the next Bootstrap is carried out (etcd bootstrapped, the control plane
    /// starting), then its answer is held back this long: the caller's deadline passes
    /// although the call took effect.
    HangAfterBootstrap {
        /// Seconds to hold the answer back.
        seconds: u64,
    },
    /// Armed, once: the next Bootstrap is carried out, then the machine reboots before
    /// answering: the call's connection is cut and every connection made before is stale.
    /// The reboot takes no time (the control plane's start goes on, as etcd would start
    /// again from its data directory).
    RebootAfterBootstrap,
    /// Armed, once: the next ApplyConfiguration is carried out (the machine configured,
    /// a worker's Node registered) and answered, then the machine's Talos API refuses new
    /// connections (as [`Fault::Refuse`]): configured, never seen joined.
    RefuseAfterApply,
    /// Armed, once: the next ApplyConfiguration is carried out (the machine configured),
    /// then the call's connection is cut before the answer is sent.
    DropAfterApply,
    /// Power the machine off: nothing answers (as [`Fault::Refuse`]) and it takes part in no
    /// election: a shared IP it holds moves to another control plane once its lease's TTL
    /// has passed (see [`Emulator::set_vip_lease_ttl`]). The cluster's API server, which
    /// stands for every control plane's, keeps running. `Clear` powers it on again.
    PowerOff,
    /// Remove every fault (also armed ones that have not fired).
    Clear,
}

/// Why a fault could not be injected.
#[derive(Debug, thiserror::Error)]
pub enum FaultError {
    #[error("no machine at {0}")]
    UnknownMachine(String),
    #[error("rebooting the machine failed")]
    Reboot(#[source] Error),
    #[error("giving the machine a new maintenance key failed")]
    Replace(#[source] Error),
}

/// A running emulator. Dropping it stops serving (and kills control planes); prefer
/// [`Emulator::shutdown`], which stops control planes gracefully.
pub struct Emulator {
    shared: Arc<Shared>,
    tasks: Vec<JoinHandle<()>>,
    control_addr: Option<SocketAddr>,
}

impl Emulator {
    /// Binds every machine's listener (and the control interface) and starts serving;
    /// bootstrapped clusters get hostlet nodes ([`NodeSettings::default`]).
    pub async fn start(settings: Settings) -> Result<Self, Error> {
        Self::start_with(settings, NodeSettings::default()).await
    }

    /// [`Emulator::start`] with the given node agent settings.
    pub async fn start_with(settings: Settings, nodes: NodeSettings) -> Result<Self, Error> {
        kontinuum_testbed::install_crypto_provider();
        if settings.machines == 0 {
            return Err(Error::Settings("at least one machine"));
        }
        let first = u32::from(settings.first_address);
        let count =
            u32::try_from(settings.machines).map_err(|_| Error::Settings("too many machines"))?;
        first
            .checked_add(count - 1)
            .ok_or(Error::Settings("addresses overflow"))?;
        std::fs::create_dir_all(&settings.dir).map_err(|source| Error::Io {
            what: format!("creating {}", settings.dir.display()),
            source,
        })?;

        let mut load_error = None;
        let shared = Arc::new_cyclic(|weak| {
            let mut shared = Shared::new(
                settings.api_port,
                settings.first_address,
                settings.machines,
                settings.dir.clone(),
                nodes,
            );
            for (index, n) in (first..first + count).enumerate() {
                let facts = Facts {
                    index,
                    address: Ipv4Addr::from(n),
                };
                match Machine::load(facts, &settings.dir, settings.port, weak.clone()) {
                    Ok(m) => shared.machines.push(Arc::new(m)),
                    Err(e) => {
                        load_error = Some(e);
                        break;
                    }
                }
            }
            shared
        });
        if let Some(err) = load_error {
            return Err(err);
        }

        let mut tasks = Vec::new();
        for machine in &shared.machines {
            let listener = machine::bind(machine).await?;
            let (tx, rx) = tokio::sync::mpsc::channel(64);
            let api = Arc::new(service::Api {
                machine: Arc::clone(machine),
            });
            let server = tonic::transport::Server::builder()
                .add_service(
                    MachineServiceServer::from_arc(Arc::clone(&api))
                        .max_decoding_message_size(MAX_MESSAGE_SIZE)
                        .max_encoding_message_size(MAX_MESSAGE_SIZE),
                )
                .add_service(ClusterServiceServer::from_arc(Arc::clone(&api)))
                .add_service(StateServer::from_arc(Arc::clone(&api)))
                .add_service(StorageServiceServer::from_arc(api))
                .serve_with_incoming(ReceiverStream::new(rx));
            tasks.push(tokio::spawn(async move {
                if let Err(err) = server.await {
                    tracing::warn!(error = &err as &dyn std::error::Error, "grpc server ended");
                }
            }));
            tasks.push(tokio::spawn(machine::accept_loop(
                Arc::clone(machine),
                Some(listener),
                tx,
            )));
        }

        // The shared-IP elections.
        tasks.push(tokio::spawn(vip::run(Arc::downgrade(&shared))));

        // Bootstrapped control planes come back after a restart, as after a reboot.
        for machine in &shared.machines {
            if let Err(status) = machine.restart_control_plane() {
                tracing::warn!(instance = %machine.facts.address, error = %status.message(), "restarting a control plane failed");
            }
        }

        let control_addr = match settings.control_addr {
            Some(addr) => {
                let listener = tokio::net::TcpListener::bind(addr)
                    .await
                    .map_err(|source| Error::Io {
                        what: format!("binding the control interface on {addr}"),
                        source,
                    })?;
                let local = listener.local_addr().map_err(|source| Error::Io {
                    what: "reading the control address".to_owned(),
                    source,
                })?;
                let weak = Arc::downgrade(&shared);
                tasks.push(tokio::spawn(control::serve(listener, weak)));
                Some(local)
            }
            None => None,
        };
        Ok(Self {
            shared,
            tasks,
            control_addr,
        })
    }

    /// Where each machine's Talos API listens, in order.
    pub fn addresses(&self) -> Vec<SocketAddr> {
        self.shared
            .machines
            .iter()
            .map(|m| m.socket_addr())
            .collect()
    }

    /// Where the HTTP control interface listens.
    pub fn control_addr(&self) -> Option<SocketAddr> {
        self.control_addr
    }

    /// The mode of the machine at `address` (IP), if it is one of ours.
    pub fn mode(&self, address: Ipv4Addr) -> Option<Mode> {
        find(&self.shared, &address.to_string()).map(|m| m.mode())
    }

    /// How many Bootstrap calls the machine at `address` (IP) received since the emulator
    /// started (answered or refused, after authentication).
    pub fn bootstrap_calls(&self, address: Ipv4Addr) -> Option<u32> {
        find(&self.shared, &address.to_string())
            .map(|m| m.bootstrap_calls.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// ApplyConfiguration calls that reached the machine at `address` (valid or not), or
    /// `None` for an unknown address.
    pub fn apply_calls(&self, address: Ipv4Addr) -> Option<u32> {
        find(&self.shared, &address.to_string())
            .map(|m| m.apply_calls.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// ApplyConfiguration calls the machine at `address` refused as invalid
    /// (`InvalidArgument`, nothing applied), or `None` for an unknown address.
    pub fn rejected_configs(&self, address: Ipv4Addr) -> Option<u32> {
        find(&self.shared, &address.to_string()).map(|m| {
            m.rejected_configs
                .load(std::sync::atomic::Ordering::Relaxed)
        })
    }

    /// How many armed faults (`*-after-*`) the machine at `address` carried out, or `None`
    /// for an unknown address: a test proves its fault point was reached.
    pub fn fired_faults(&self, address: Ipv4Addr) -> Option<u32> {
        find(&self.shared, &address.to_string())
            .map(|m| m.fired_faults.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// Reboot calls that reached the machine at `address` (admitted or not), or `None` for
    /// an unknown address.
    pub fn reboot_calls(&self, address: Ipv4Addr) -> Option<u32> {
        find(&self.shared, &address.to_string())
            .map(|m| m.reboot_calls.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// Upgrade calls that reached the machine at `address` (admitted or not, valid or not),
    /// or `None` for an unknown address.
    pub fn upgrade_calls(&self, address: Ipv4Addr) -> Option<u32> {
        find(&self.shared, &address.to_string())
            .map(|m| m.upgrade_calls.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// How long a machine a Reboot or Upgrade reboots stays unreachable (default 1 s).
    pub fn set_reboot_downtime(&self, downtime: Duration) {
        let ms = u64::try_from(downtime.as_millis()).unwrap_or(u64::MAX);
        self.shared
            .reboot_downtime_ms
            .store(ms, std::sync::atomic::Ordering::Relaxed);
    }

    /// How long a shared IP stays with a holder that powered off before another control
    /// plane may take it (its etcd election lease's TTL; default 60 s, as Talos).
    pub fn set_vip_lease_ttl(&self, ttl: Duration) {
        let ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        self.shared
            .vip_lease_ttl_ms
            .store(ms, std::sync::atomic::Ordering::Relaxed);
    }

    /// The machine holding the shared IP `vip` now, if any.
    pub fn vip_holder(&self, vip: std::net::IpAddr) -> Option<Ipv4Addr> {
        vip::holder(&self.shared, vip)
    }

    /// The recent calls of the machine at `address` (see [`CallRecord`]), or `None` for an
    /// unknown address.
    pub fn calls(&self, address: Ipv4Addr) -> Option<Vec<CallRecord>> {
        find(&self.shared, &address.to_string()).map(|m| m.calls())
    }

    /// The machine config the machine at `address` runs (what its last accepted
    /// ApplyConfiguration carried, multi-document YAML), or `None` for an unknown address or
    /// a machine in maintenance mode. It holds the cluster's keys: for tests only.
    pub fn running_config(&self, address: Ipv4Addr) -> Option<String> {
        find(&self.shared, &address.to_string()).and_then(|m| m.running_config())
    }

    /// Injects a fault into the machine at `address` (IP).
    pub async fn inject(&self, address: Ipv4Addr, fault: Fault) -> Result<(), FaultError> {
        inject(&self.shared, &address.to_string(), fault).await
    }

    /// Stops every control plane gracefully and stops serving.
    pub async fn shutdown(mut self) {
        for machine in &self.shared.machines {
            machine.shutdown().await;
        }
        for task in self.tasks.drain(..) {
            task.abort();
        }
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

pub(crate) fn find<'a>(shared: &'a Shared, address: &str) -> Option<&'a Arc<Machine>> {
    shared
        .machines
        .iter()
        .find(|m| m.facts.address.to_string() == address)
}

pub(crate) async fn inject(shared: &Shared, address: &str, fault: Fault) -> Result<(), FaultError> {
    let machine =
        find(shared, address).ok_or_else(|| FaultError::UnknownMachine(address.to_owned()))?;
    tracing::info!(instance = %address, fault = ?fault, "injecting fault");
    match fault {
        Fault::Hang { seconds } => machine.faults.send_modify(|f| {
            f.hang_until = Some(tokio::time::Instant::now() + Duration::from_secs(seconds));
        }),
        Fault::Refuse => machine.faults.send_modify(|f| f.refuse = true),
        Fault::PowerOff => machine.faults.send_modify(|f| f.powered_off = true),
        Fault::Unavailable => machine.faults.send_modify(|f| f.unavailable = true),
        Fault::Clear => machine
            .faults
            .send_modify(|f| *f = machine::Faults::default()),
        Fault::Reboot => machine.reboot().await.map_err(FaultError::Reboot)?,
        Fault::Replace => machine.replace_identity().map_err(FaultError::Replace)?,
        Fault::HangAfterBootstrap { seconds } => machine.faults.send_modify(|f| {
            f.after_bootstrap = Some(machine::After::Hang(Duration::from_secs(seconds)));
        }),
        Fault::RebootAfterBootstrap => machine
            .faults
            .send_modify(|f| f.after_bootstrap = Some(machine::After::Reboot)),
        Fault::DropAfterApply => machine
            .faults
            .send_modify(|f| f.after_apply = Some(machine::After::Drop)),
        Fault::RefuseAfterApply => machine
            .faults
            .send_modify(|f| f.after_apply = Some(machine::After::Refuse)),
    }
    Ok(())
}
