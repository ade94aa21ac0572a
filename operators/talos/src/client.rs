//! The Talos API client: connections (maintenance TLS, configured mTLS), `node` routing,
//! per-call timeouts, and the RPCs the operators need.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use kontinuum_proto::talos::cluster::cluster_service_client::ClusterServiceClient;
use kontinuum_proto::talos::cluster::{ClusterInfo, HealthCheckRequest};
use kontinuum_proto::talos::common::Metadata;
use kontinuum_proto::talos::cosi::resource::state_client::StateClient;
use kontinuum_proto::talos::cosi::resource::{GetRequest, ListRequest, Resource};
use kontinuum_proto::talos::machine::machine_service_client::MachineServiceClient;
use kontinuum_proto::talos::machine::{
    ApplyConfigurationRequest, BootstrapRequest, ResetPartitionSpec, ResetRequest,
};
use rustls::ClientConfig;
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;
use tonic::Code;
use tonic::metadata::{AsciiMetadataValue, MetadataValue};
use tonic::transport::{Channel, Uri};

pub use kontinuum_proto::talos::machine::apply_configuration_request::Mode as ApplyMode;

use crate::discovery::{self, Discovery};
use crate::endpoint::Endpoint;
use crate::error::{Error, ErrorKind, ProtocolError, Rpc};
use crate::kubeconfig::{self, Kubeconfig};
use crate::tls::{self, ClientIdentity, IdentityPin, PeerCertificate};

/// How much later than our own bound the deadline we send to the server is.
const DEADLINE_GRACE: Duration = Duration::from_secs(1);

/// Largest gRPC message either way; Talos' `GRPCMaxMessageSize`.
pub const MAX_MESSAGE_SIZE: usize = 32 * 1024 * 1024;

/// Bounds on every interaction with a machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeouts {
    /// TCP connect plus TLS handshake.
    pub connect: Duration,
    /// One unary call, or one whole stream (COSI List, Kubeconfig). HealthCheck gets its
    /// `wait_timeout` plus this.
    pub rpc: Duration,
}

impl Default for Timeouts {
    /// 10 s to connect, 30 s per call: the predecessor's values.
    fn default() -> Self {
        Self {
            connect: Duration::from_secs(10),
            rpc: Duration::from_secs(30),
        }
    }
}

/// The Talos version a machine reports.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Version {
    /// Release tag, e.g. `v1.13.8`.
    pub tag: String,
    /// Git SHA of the build.
    pub sha: String,
    /// `linux/amd64`-style OS and architecture.
    pub os: String,
    pub arch: String,
    /// Platform name, e.g. `metal`.
    pub platform: Option<String>,
    /// RBAC is on: true only once the machine has a config.
    pub rbac: bool,
}

/// What ApplyConfiguration did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApplyOutcome {
    /// The mode actually used (maintenance mode turns REBOOT and AUTO into NO_REBOOT).
    pub mode: ApplyMode,
    /// Talos' description, e.g. "Applied configuration without a reboot".
    pub mode_details: String,
    /// Validation warnings.
    pub warnings: Vec<String>,
}

/// Result of Bootstrap: `AlreadyBootstrapped` (Talos' `AlreadyExists`) means done, too.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BootstrapOutcome {
    /// etcd was bootstrapped by this call.
    Bootstrapped,
    /// etcd already had data: an earlier call bootstrapped it.
    AlreadyBootstrapped,
}

/// A Reset request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResetOptions {
    /// Cordon, drain and leave etcd first; false for the last control-plane node.
    pub graceful: bool,
    /// Reboot afterwards (true) or power off.
    pub reboot: bool,
    /// System volume labels to wipe. Empty wipes the WHOLE system disk (bootloader included).
    pub system_partitions: Vec<String>,
}

impl ResetOptions {
    /// Wipe STATE (the machine config) and EPHEMERAL (`/var`, etcd) and reboot: the installed
    /// Talos boots back into maintenance mode.
    pub fn to_maintenance(graceful: bool) -> Self {
        Self {
            graceful,
            reboot: true,
            system_partitions: vec!["STATE".to_owned(), "EPHEMERAL".to_owned()],
        }
    }
}

/// A connection to one Talos API endpoint. Cheap to clone; clones share the connection.
#[derive(Clone, Debug)]
pub struct TalosClient {
    channel: Channel,
    endpoint: Endpoint,
    node: Option<AsciiMetadataValue>,
    target: String,
    timeouts: Timeouts,
    peer: Arc<Mutex<Option<PeerCertificate>>>,
    pin: Option<Arc<IdentityPin>>,
}

impl TalosClient {
    /// Connects to a machine in maintenance mode: TLS without server verification and
    /// without a client certificate. [`Self::peer_certificate`] then holds its fingerprint.
    pub async fn connect_maintenance(
        endpoint: &Endpoint,
        timeouts: Timeouts,
    ) -> Result<Self, Error> {
        let config = tls::maintenance_config(None).map_err(Error::TlsConfig)?;
        Self::connect_with(endpoint, config, None, timeouts).await
    }

    /// Connects to a machine in maintenance mode that must be the one whose identity was
    /// recorded: the SHA-256 of its certificate's public key
    /// ([`PeerCertificate::public_key_sha256`]) must equal `identity`. The check runs in the
    /// TLS handshake (and again on every reconnection), so another machine answering at the
    /// address never receives a byte of a request; it fails with
    /// [`Error::IdentityMismatch`].
    pub async fn connect_maintenance_pinned(
        endpoint: &Endpoint,
        identity: &str,
        timeouts: Timeouts,
    ) -> Result<Self, Error> {
        let pin = Arc::new(IdentityPin::new(identity));
        let config = tls::maintenance_config(Some(Arc::clone(&pin))).map_err(Error::TlsConfig)?;
        Self::connect_with(endpoint, config, Some(pin), timeouts).await
    }

    /// Connects to a configured machine with mTLS: the server must chain to the identity's
    /// CA and have the endpoint host among its SANs.
    pub async fn connect(
        endpoint: &Endpoint,
        identity: &ClientIdentity,
        timeouts: Timeouts,
    ) -> Result<Self, Error> {
        let config = tls::configured_config(identity).map_err(Error::Identity)?;
        Self::connect_with(endpoint, config, None, timeouts).await
    }

    async fn connect_with(
        endpoint: &Endpoint,
        config: Arc<ClientConfig>,
        pin: Option<Arc<IdentityPin>>,
        timeouts: Timeouts,
    ) -> Result<Self, Error> {
        let invalid = || Error::InvalidEndpoint {
            endpoint: endpoint.to_string(),
        };
        let server_name =
            ServerName::try_from(endpoint.host().to_owned()).map_err(|_| invalid())?;
        let uri: Uri = endpoint.uri().parse().map_err(|_| invalid())?;
        let peer = Arc::new(Mutex::new(None));
        let connector = Connector {
            tls: TlsConnector::from(config),
            server_name,
            endpoint: endpoint.clone(),
            peer: Arc::clone(&peer),
        };
        // Per-call bounds are applied by `bounded`, around whole streams too.
        let channel = tonic::transport::Endpoint::from(uri).connect_timeout(timeouts.connect);
        let channel =
            match tokio::time::timeout(timeouts.connect, channel.connect_with_connector(connector))
                .await
            {
                Err(_) => {
                    return Err(Error::ConnectTimedOut {
                        endpoint: endpoint.to_string(),
                        after: timeouts.connect,
                    });
                }
                Ok(Err(err)) => {
                    if let Some(mismatch) = pin_mismatch(pin.as_deref(), endpoint) {
                        return Err(mismatch);
                    }
                    let kind = ErrorKind::from_transport(&err, ErrorKind::Unreachable);
                    return Err(Error::Connect {
                        endpoint: endpoint.to_string(),
                        kind,
                        source: Box::new(err),
                    });
                }
                Ok(Ok(channel)) => channel,
            };
        tracing::debug!(talos.endpoint = %endpoint, "connected to talos api");
        Ok(Self {
            channel,
            endpoint: endpoint.clone(),
            node: None,
            target: endpoint.to_string(),
            timeouts,
            peer,
            pin,
        })
    }

    /// A client whose calls go through this endpoint to `node` (single-valued `node`
    /// metadata; apid proxies one-to-one). Shares the connection.
    pub fn with_node(&self, node: &str) -> Result<Self, Error> {
        let value = MetadataValue::try_from(node)
            .ok()
            .filter(|_| !node.is_empty() && !node.contains(','))
            .ok_or_else(|| Error::InvalidNode {
                node: node.to_owned(),
            })?;
        Ok(Self {
            node: Some(value),
            target: format!("{} (node {node})", self.endpoint),
            ..self.clone()
        })
    }

    /// The endpoint this client is connected to.
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// The timeouts this client applies.
    pub fn timeouts(&self) -> Timeouts {
        self.timeouts
    }

    /// Fingerprints of the certificate the server presented on the latest (re)connection.
    pub fn peer_certificate(&self) -> Option<PeerCertificate> {
        self.peer
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn request<T>(&self, message: T, timeout: Duration) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        // The server learns our deadline, plus a grace: our own bound (`bounded`) must fire
        // first, so a hung call is always our TimedOut, never a race with the server's or
        // tonic's deadline error.
        request.set_timeout(timeout + DEADLINE_GRACE);
        if let Some(node) = &self.node {
            request.metadata_mut().insert("node", node.clone());
        }
        request
    }

    fn machine(&self) -> MachineServiceClient<Channel> {
        MachineServiceClient::new(self.channel.clone())
            .max_decoding_message_size(MAX_MESSAGE_SIZE)
            .max_encoding_message_size(MAX_MESSAGE_SIZE)
    }

    fn cluster(&self) -> ClusterServiceClient<Channel> {
        ClusterServiceClient::new(self.channel.clone())
            .max_decoding_message_size(MAX_MESSAGE_SIZE)
            .max_encoding_message_size(MAX_MESSAGE_SIZE)
    }

    fn state(&self) -> StateClient<Channel> {
        StateClient::new(self.channel.clone())
            .max_decoding_message_size(MAX_MESSAGE_SIZE)
            .max_encoding_message_size(MAX_MESSAGE_SIZE)
    }

    /// Runs `call` under `bound`, mapping statuses and the elapsed bound to [`Error`].
    async fn bounded<T, F>(&self, rpc: Rpc, bound: Duration, call: F) -> Result<T, Error>
    where
        F: Future<Output = Result<T, CallError>>,
    {
        match tokio::time::timeout(bound, call).await {
            Err(_) => Err(Error::TimedOut {
                rpc,
                target: self.target.clone(),
                after: bound,
            }),
            Ok(Ok(value)) => Ok(value),
            // A reconnection refused by the pin: say so, not "unavailable".
            Ok(Err(CallError::Status(status))) => {
                Err(pin_mismatch(self.pin.as_deref(), &self.endpoint)
                    .unwrap_or_else(|| Error::rpc(rpc, &self.target, status)))
            }
            Ok(Err(CallError::Protocol(err))) => Err(Error::protocol(rpc, &self.target, err)),
        }
    }

    /// `MachineService/Version` (allowed in maintenance mode since Talos 1.13).
    pub async fn version(&self) -> Result<Version, Error> {
        let t = self.timeouts.rpc;
        self.bounded(Rpc::Version, t, async {
            let reply = self
                .machine()
                .version(self.request((), t))
                .await?
                .into_inner();
            let msg = first(reply.messages)?;
            check(msg.metadata.as_ref())?;
            let info = msg.version.unwrap_or_default();
            Ok(Version {
                tag: info.tag,
                sha: info.sha,
                os: info.os,
                arch: info.arch,
                platform: msg.platform.map(|p| p.name).filter(|n| !n.is_empty()),
                rbac: msg.features.is_some_and(|f| f.rbac),
            })
        })
        .await
    }

    /// `MachineService/ApplyConfiguration` with the machine config YAML (multi-document).
    pub async fn apply_configuration(
        &self,
        config: Vec<u8>,
        mode: ApplyMode,
    ) -> Result<ApplyOutcome, Error> {
        let t = self.timeouts.rpc;
        self.bounded(Rpc::ApplyConfiguration, t, async {
            let request = ApplyConfigurationRequest {
                data: config,
                mode: mode.into(),
                dry_run: false,
                try_mode_timeout: None,
            };
            let reply = self
                .machine()
                .apply_configuration(self.request(request, t))
                .await?;
            let msg = first(reply.into_inner().messages)?;
            check(msg.metadata.as_ref())?;
            Ok(ApplyOutcome {
                mode: msg.mode(),
                mode_details: msg.mode_details,
                warnings: msg.warnings,
            })
        })
        .await
    }

    /// `MachineService/Bootstrap`. `AlreadyExists` ("etcd data directory is not empty") is
    /// [`BootstrapOutcome::AlreadyBootstrapped`], not an error.
    pub async fn bootstrap(&self) -> Result<BootstrapOutcome, Error> {
        let t = self.timeouts.rpc;
        let result = self
            .bounded(Rpc::Bootstrap, t, async {
                let request = BootstrapRequest::default();
                let reply = self.machine().bootstrap(self.request(request, t)).await?;
                check(first(reply.into_inner().messages)?.metadata.as_ref())?;
                Ok(())
            })
            .await;
        match result {
            Ok(()) => Ok(BootstrapOutcome::Bootstrapped),
            Err(err) if err.kind() == ErrorKind::AlreadyExists => {
                Ok(BootstrapOutcome::AlreadyBootstrapped)
            }
            Err(err) => Err(err),
        }
    }

    /// `MachineService/Kubeconfig`: collects `common.Data` chunks of the gzip'd tar and stops
    /// reading as soon as the `kubeconfig` entry is complete.
    pub async fn kubeconfig(&self) -> Result<Kubeconfig, Error> {
        let t = self.timeouts.rpc;
        self.bounded(Rpc::Kubeconfig, t, async {
            let mut stream = self
                .machine()
                .kubeconfig(self.request((), t))
                .await?
                .into_inner();
            let mut archive = Vec::new();
            let mut last = kubeconfig::KubeconfigError::NoEntry;
            while let Some(chunk) = stream.message().await? {
                check(chunk.metadata.as_ref())?;
                if archive.len() + chunk.bytes.len() > MAX_MESSAGE_SIZE {
                    return Err(
                        ProtocolError::Kubeconfig(kubeconfig::KubeconfigError::TooLarge).into(),
                    );
                }
                archive.extend_from_slice(&chunk.bytes);
                match kubeconfig::extract(&archive) {
                    Ok(found) => return Ok(found),
                    Err(err) => last = err,
                }
            }
            Err(ProtocolError::Kubeconfig(last).into())
        })
        .await
    }

    /// `MachineService/Reset`; returns the actor id. The reply comes before the reset runs.
    pub async fn reset(&self, options: &ResetOptions) -> Result<String, Error> {
        let t = self.timeouts.rpc;
        self.bounded(Rpc::Reset, t, async {
            let request = ResetRequest {
                graceful: options.graceful,
                reboot: options.reboot,
                system_partitions_to_wipe: options
                    .system_partitions
                    .iter()
                    .map(|label| ResetPartitionSpec {
                        label: label.clone(),
                        wipe: true,
                    })
                    .collect(),
                user_disks_to_wipe: Vec::new(),
                mode: 0,
            };
            let reply = self.machine().reset(self.request(request, t)).await?;
            let msg = first(reply.into_inner().messages)?;
            check(msg.metadata.as_ref())?;
            Ok(msg.actor_id)
        })
        .await
    }

    /// `cluster.ClusterService/HealthCheck`, run by the server under `wait_timeout`; every
    /// progress message goes to `on_progress`. A clean end of stream is healthy. The client
    /// bound is `wait_timeout` plus the RPC timeout, so the server's own deadline error wins.
    pub async fn health_check(
        &self,
        wait_timeout: Duration,
        control_plane_nodes: &[String],
        worker_nodes: &[String],
        mut on_progress: impl FnMut(&str) + Send,
    ) -> Result<(), Error> {
        let bound = wait_timeout.saturating_add(self.timeouts.rpc);
        self.bounded(Rpc::HealthCheck, bound, async {
            let request = HealthCheckRequest {
                wait_timeout: prost_types::Duration::try_from(wait_timeout).ok(),
                cluster_info: Some(ClusterInfo {
                    control_plane_nodes: control_plane_nodes.to_vec(),
                    worker_nodes: worker_nodes.to_vec(),
                    force_endpoint: String::new(),
                }),
            };
            let mut stream =
                self.cluster().health_check(self.request(request, bound)).await?.into_inner();
            while let Some(progress) = stream.message().await? {
                check(progress.metadata.as_ref())?;
                tracing::debug!(talos.endpoint = %self.target, message = %progress.message, "health check progress");
                on_progress(&progress.message);
            }
            Ok(())
        })
        .await
    }

    /// COSI `State/List`: every resource of a type in a namespace.
    pub async fn list_resources(
        &self,
        namespace: &str,
        r#type: &str,
    ) -> Result<Vec<Resource>, Error> {
        let t = self.timeouts.rpc;
        self.bounded(Rpc::CosiList, t, async {
            let request = ListRequest {
                namespace: namespace.to_owned(),
                r#type: r#type.to_owned(),
                options: None,
            };
            let mut stream = self
                .state()
                .list(self.request(request, t))
                .await?
                .into_inner();
            let mut resources = Vec::new();
            while let Some(item) = stream.message().await? {
                resources.extend(item.resource);
            }
            Ok(resources)
        })
        .await
    }

    /// COSI `State/Get`: one resource.
    pub async fn get_resource(
        &self,
        namespace: &str,
        r#type: &str,
        id: &str,
    ) -> Result<Resource, Error> {
        let t = self.timeouts.rpc;
        self.bounded(Rpc::CosiGet, t, async {
            let request = GetRequest {
                namespace: namespace.to_owned(),
                r#type: r#type.to_owned(),
                id: id.to_owned(),
                options: None,
            };
            let reply = self
                .state()
                .get(self.request(request, t))
                .await?
                .into_inner();
            reply
                .resource
                .ok_or(CallError::Protocol(ProtocolError::EmptyReply))
        })
        .await
    }

    /// Links, addresses and disks, mapped into the Instance status types.
    pub async fn discover(&self) -> Result<Discovery, Error> {
        let (links, addresses, disks) = tokio::try_join!(
            self.list_resources(discovery::NETWORK_NAMESPACE, discovery::LINK_STATUS_TYPE),
            self.list_resources(discovery::NETWORK_NAMESPACE, discovery::ADDRESS_STATUS_TYPE),
            self.list_resources(discovery::RUNTIME_NAMESPACE, discovery::DISK_TYPE),
        )?;
        let interfaces = discovery::interfaces(&links, &addresses)
            .map_err(|e| Error::protocol(Rpc::CosiList, &self.target, e))?;
        let disks = discovery::disks(&disks)
            .map_err(|e| Error::protocol(Rpc::CosiList, &self.target, e))?;
        Ok(Discovery { interfaces, disks })
    }
}

/// Failure inside a bounded call, before the RPC and endpoint are attached.
enum CallError {
    Status(tonic::Status),
    Protocol(ProtocolError),
}

impl From<tonic::Status> for CallError {
    fn from(status: tonic::Status) -> Self {
        Self::Status(status)
    }
}

impl From<ProtocolError> for CallError {
    fn from(err: ProtocolError) -> Self {
        Self::Protocol(err)
    }
}

fn first<T>(messages: Vec<T>) -> Result<T, CallError> {
    messages
        .into_iter()
        .next()
        .ok_or(CallError::Protocol(ProtocolError::EmptyReply))
}

/// A reply proxied by apid may carry a node's failure in `metadata.error`/`status`.
fn check(metadata: Option<&Metadata>) -> Result<(), CallError> {
    match metadata {
        Some(m) if !m.error.is_empty() || m.status.as_ref().is_some_and(|s| s.code != 0) => {
            let code = m
                .status
                .as_ref()
                .map_or(Code::Unknown, |s| Code::from_i32(s.code));
            Err(CallError::Status(tonic::Status::new(code, m.error.clone())))
        }
        _ => Ok(()),
    }
}

/// The typed error for a handshake the identity pin refused, if it refused one.
fn pin_mismatch(pin: Option<&IdentityPin>, endpoint: &Endpoint) -> Option<Error> {
    let pin = pin?;
    pin.mismatch().map(|presented| Error::IdentityMismatch {
        endpoint: endpoint.to_string(),
        expected: pin.expected().to_owned(),
        presented,
    })
}

/// Dials TCP + TLS for the gRPC channel and records the server's certificate.
#[derive(Clone)]
struct Connector {
    tls: TlsConnector,
    server_name: ServerName<'static>,
    endpoint: Endpoint,
    peer: Arc<Mutex<Option<PeerCertificate>>>,
}

type ConnectFuture =
    Pin<Box<dyn Future<Output = io::Result<TokioIo<TlsStream<TcpStream>>>> + Send>>;

impl tower_service::Service<Uri> for Connector {
    type Response = TokioIo<TlsStream<TcpStream>>;
    type Error = io::Error;
    type Future = ConnectFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _uri: Uri) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let tcp = TcpStream::connect((this.endpoint.host(), this.endpoint.port())).await?;
            tcp.set_nodelay(true)?;
            let stream = this.tls.connect(this.server_name.clone(), tcp).await?;
            let leaf = stream
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|c| c.first());
            if let Some(leaf) = leaf {
                let fingerprint = PeerCertificate::from_der(leaf);
                *this.peer.lock().unwrap_or_else(PoisonError::into_inner) = Some(fingerprint);
            }
            Ok(TokioIo::new(stream))
        })
    }
}
