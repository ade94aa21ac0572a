//! The gRPC services of one machine: `machine.MachineService`, `cluster.ClusterService`,
//! `cosi.resource.State` and `storage.StorageService`. Every call first endures injected
//! faults, then is authorized against the machine's mode and the connection's roles.

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kontinuum_proto::talos::cluster::cluster_service_server::ClusterService;
use kontinuum_proto::talos::cluster::{HealthCheckProgress, HealthCheckRequest};
use kontinuum_proto::talos::common::Data;
use kontinuum_proto::talos::cosi::resource::state_server::State;
use kontinuum_proto::talos::cosi::resource::{
    GetRequest, GetResponse, ListRequest, ListResponse, Metadata, Resource, Spec,
};
use kontinuum_proto::talos::machine::apply_configuration_request::Mode as ApplyMode;
use kontinuum_proto::talos::machine::machine_service_server::MachineService;
use kontinuum_proto::talos::machine::{
    ApplyConfiguration, ApplyConfigurationRequest, ApplyConfigurationResponse, Bootstrap,
    BootstrapRequest, BootstrapResponse, FeaturesInfo, PlatformInfo, Reboot, RebootRequest,
    RebootResponse, Reset, ResetRequest, ResetResponse, Upgrade, UpgradeRequest, UpgradeResponse,
    Version, VersionInfo, VersionResponse,
};
use kontinuum_proto::talos::storage::storage_service_server::StorageService;
use kontinuum_proto::talos::storage::{Disk, Disks, DisksResponse};
use kontinuum_talos_config::CertAndKey;
use kube::Api as KubeApi;
use tokio_stream::wrappers::ReceiverStream;
use tonic::codegen::BoxStream;
use tonic::{Request, Response, Status};

use crate::core::{self, Access, Mode, Refusal, resources};
use crate::machine::{Call, ConnInfo, Machine, Member, internal};
use crate::pki;

/// Talos version the emulator claims to be (until an Upgrade installs another).
pub const TALOS_TAG: &str = "v1.13.8";
const TALOS_SHA: &str = "3de49322";

/// The services of one machine.
#[derive(Clone)]
pub struct Api {
    pub(crate) machine: Arc<Machine>,
}

impl Api {
    /// Faults, then the connection's generation, then authorization.
    async fn admit<T>(&self, request: &Request<T>, access: Access) -> Result<Mode, Status> {
        self.machine.endure_faults().await?;
        let info = connection(request)?;
        let inner = self.machine.lock();
        if info.generation != inner.core.generation {
            return Err(Status::unavailable(
                "the machine rebooted since this connection was made",
            ));
        }
        let mode = inner.core.mode;
        core::authorize(mode, &info.roles, access).map_err(Refusal::into_status)?;
        Ok(mode)
    }
}

/// The connection a request came on.
fn connection<T>(request: &Request<T>) -> Result<ConnInfo, Status> {
    request
        .extensions()
        .get::<ConnInfo>()
        .cloned()
        .ok_or_else(|| Status::internal("connection info missing"))
}

#[tonic::async_trait]
impl MachineService for Api {
    async fn version(&self, request: Request<()>) -> Result<Response<VersionResponse>, Status> {
        let mode = self.admit(&request, Access::Read).await?;
        let tag = self
            .machine
            .talos_version()
            .unwrap_or_else(|| TALOS_TAG.to_owned());
        Ok(Response::new(VersionResponse {
            messages: vec![Version {
                metadata: None,
                version: Some(VersionInfo {
                    tag,
                    sha: TALOS_SHA.to_owned(),
                    built: String::new(),
                    go_version: "go1.25.1".to_owned(),
                    os: "linux".to_owned(),
                    arch: "amd64".to_owned(),
                }),
                platform: Some(PlatformInfo {
                    name: "metal".to_owned(),
                    mode: "metal".to_owned(),
                }),
                // Unset in maintenance mode (no config), rbac once configured.
                features: (mode == Mode::Configured).then_some(FeaturesInfo { rbac: true }),
            }],
        }))
    }

    async fn apply_configuration(
        &self,
        request: Request<ApplyConfigurationRequest>,
    ) -> Result<Response<ApplyConfigurationResponse>, Status> {
        let mut call = self.machine.call("ApplyConfiguration");
        self.machine
            .apply_calls
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.admit(&request, Access::Apply).await?;
        let connection = connection(&request)?;
        let request = request.into_inner();
        if request.dry_run {
            return Err(Status::unimplemented("dry run is not emulated"));
        }
        let machine = Arc::clone(&self.machine);
        let mode = request.mode();
        let data = request.data;
        let used = tokio::task::spawn_blocking(move || machine.apply(&data, mode))
            .await
            .map_err(|_| Status::internal("apply task failed"))??;
        self.machine.after(Call::Apply, &connection).await;
        call.succeeded();
        let mode_details = match used {
            ApplyMode::Reboot => "Applied configuration with a reboot",
            _ => "Applied configuration without a reboot",
        };
        Ok(Response::new(ApplyConfigurationResponse {
            messages: vec![ApplyConfiguration {
                metadata: None,
                warnings: Vec::new(),
                mode: used.into(),
                mode_details: mode_details.to_owned(),
            }],
        }))
    }

    async fn bootstrap(
        &self,
        request: Request<BootstrapRequest>,
    ) -> Result<Response<BootstrapResponse>, Status> {
        let mut call = self.machine.call("Bootstrap");
        self.admit(&request, Access::Admin).await?;
        let connection = connection(&request)?;
        self.machine.bootstrap()?;
        self.machine.after(Call::Bootstrap, &connection).await;
        call.succeeded();
        Ok(Response::new(BootstrapResponse {
            messages: vec![Bootstrap { metadata: None }],
        }))
    }

    async fn kubeconfig(&self, request: Request<()>) -> Result<Response<BoxStream<Data>>, Status> {
        let mut call = self.machine.call("Kubeconfig");
        self.admit(&request, Access::Admin).await?;
        let config = self
            .machine
            .active_config()
            .ok_or_else(|| Status::failed_precondition("machine is not configured"))?;
        let (Some(key), true) = (
            config.kubernetes_ca.key_pem.clone(),
            config.machine_type.is_control_plane(),
        ) else {
            return Err(Status::unimplemented(
                "kubeconfig is only available on control plane nodes",
            ));
        };
        // As Talos: the cluster endpoint. When it names one of the machines, the address the
        // control plane really serves on (its port may differ from the endpoint's when that
        // was taken); a load balancer or name in front of them is taken as it is.
        let host = core::endpoint_host(&config.cluster_endpoint).unwrap_or_default();
        let names_a_machine = self
            .machine
            .shared()
            .is_some_and(|shared| crate::find(&shared, host).is_some());
        let server = match self.machine.own_cluster() {
            Some(cluster) if names_a_machine => cluster.server.clone(),
            _ => config.cluster_endpoint.clone(),
        };
        let ca = CertAndKey {
            cert_pem: config.kubernetes_ca.cert_pem.clone(),
            key_pem: key,
        };
        let name = config.cluster_name.as_deref().unwrap_or("talos-default");
        let kubeconfig = pki::admin_kubeconfig(&ca, name, &server).map_err(|e| internal(&e))?;
        let archive =
            pki::kubeconfig_archive(kubeconfig.expose().as_bytes()).map_err(|e| internal(&e))?;
        let chunk = Data {
            metadata: None,
            bytes: archive,
        };
        call.succeeded();
        Ok(Response::new(Box::pin(tokio_stream::iter([Ok(chunk)]))))
    }

    async fn reboot(
        &self,
        request: Request<RebootRequest>,
    ) -> Result<Response<RebootResponse>, Status> {
        let mut call = self.machine.call("Reboot");
        self.machine
            .reboot_calls
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.admit(&request, Access::Operator).await?;
        // Every mode (default kexec, powercycle, force) reboots the same way here.
        self.machine.reboot_rpc();
        call.succeeded();
        Ok(Response::new(RebootResponse {
            messages: vec![Reboot {
                metadata: None,
                actor_id: self.machine.actor_id("reboot"),
            }],
        }))
    }

    async fn upgrade(
        &self,
        request: Request<UpgradeRequest>,
    ) -> Result<Response<UpgradeResponse>, Status> {
        let mut call = self.machine.call("Upgrade");
        self.machine
            .upgrade_calls
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.admit(&request, Access::Admin).await?;
        let version =
            core::upgrade_version(&request.get_ref().image).map_err(Refusal::into_status)?;
        // `stage` reboots before installing, the default installs then reboots: either way
        // the machine comes back on the new version. `preserve` is what Talos always does
        // since v1.8; `force` skips etcd checks the emulator does not make.
        self.machine.upgrade(&version)?;
        call.succeeded();
        Ok(Response::new(UpgradeResponse {
            messages: vec![Upgrade {
                metadata: None,
                ack: "Upgrade request received".to_owned(),
                actor_id: self.machine.actor_id("upgrade"),
            }],
        }))
    }

    async fn reset(
        &self,
        request: Request<ResetRequest>,
    ) -> Result<Response<ResetResponse>, Status> {
        self.admit(&request, Access::Admin).await?;
        let request = request.into_inner();
        let labels: Vec<String> = request
            .system_partitions_to_wipe
            .iter()
            .filter(|p| p.wipe)
            .map(|p| p.label.clone())
            .collect();
        let plan = core::plan_reset(&labels, &request.user_disks_to_wipe, request.mode)
            .map_err(Refusal::into_status)?;
        let effects = {
            let mut inner = self.machine.lock();
            inner
                .core
                .reset(&plan, &self.machine.facts)
                .map_err(Refusal::into_status)?
        };
        tracing::info!(
            instance = %self.machine.facts.address,
            graceful = request.graceful,
            full_wipe = plan.full_wipe,
            "resetting"
        );
        // Talos replies first and resets asynchronously; the emulator finishes the teardown
        // before replying, so that a new bootstrap never meets the old control plane.
        self.machine
            .carry_out(effects)
            .await
            .map_err(|e| internal(&e))?;
        Ok(Response::new(ResetResponse {
            messages: vec![Reset {
                metadata: None,
                actor_id: format!("reset-{}", self.machine.facts.index),
            }],
        }))
    }
}

#[tonic::async_trait]
impl ClusterService for Api {
    async fn health_check(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<BoxStream<HealthCheckProgress>>, Status> {
        let mut call = self.machine.call("HealthCheck");
        let mode = self.admit(&request, Access::Read).await?;
        let config = self.machine.active_config();
        let Some(config) =
            config.filter(|c| mode == Mode::Configured && c.machine_type.is_control_plane())
        else {
            return Err(Status::unimplemented(
                "machine type is not set, cannot use cluster health check API",
            ));
        };
        drop(config);
        let wait = request
            .get_ref()
            .wait_timeout
            .and_then(|d| Duration::try_from(d).ok())
            .unwrap_or_default();
        if wait.is_zero() {
            return Err(Status::deadline_exceeded("context deadline exceeded"));
        }
        let expected = Expected::from_request(request.get_ref());
        let machine = Arc::clone(&self.machine);
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        tokio::spawn(async move {
            let deadline = tokio::time::Instant::now() + wait;
            let result =
                tokio::time::timeout_at(deadline, run_health_check(&machine, &expected, &tx)).await;
            let end = match result {
                Ok(Ok(())) => {
                    call.succeeded();
                    return;
                }
                Ok(Err(status)) => status,
                Err(_) => Status::deadline_exceeded("context deadline exceeded"),
            };
            let _ = tx.send(Err(end)).await;
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

type Progress = tokio::sync::mpsc::Sender<Result<HealthCheckProgress, Status>>;

async fn say(tx: &Progress, message: String) -> Result<(), Status> {
    tx.send(Ok(HealthCheckProgress {
        metadata: None,
        message,
    }))
    .await
    .map_err(|_| Status::cancelled("client went away"))
}

/// The nodes a health check is about: the request's `cluster_info` lists when it has any
/// (as Talos uses them), else every configured machine of the cluster.
struct Expected {
    /// `None`: not given, discovered at each check.
    given: Option<(Vec<Ipv4Addr>, Vec<Ipv4Addr>)>,
}

impl Expected {
    fn from_request(request: &HealthCheckRequest) -> Self {
        let parse = |list: &[String]| -> Vec<Ipv4Addr> {
            list.iter().filter_map(|a| a.parse().ok()).collect()
        };
        let given = request
            .cluster_info
            .as_ref()
            .filter(|i| !i.control_plane_nodes.is_empty() || !i.worker_nodes.is_empty())
            .map(|i| (parse(&i.control_plane_nodes), parse(&i.worker_nodes)));
        Self { given }
    }

    /// The control-plane and worker addresses to check, given the cluster's members now.
    fn nodes(&self, members: &[Member]) -> (Vec<Ipv4Addr>, Vec<Ipv4Addr>) {
        if let Some(given) = &self.given {
            return given.clone();
        }
        let of = |cp: bool| {
            members
                .iter()
                .filter(|m| m.control_plane == cp)
                .map(|m| m.address)
                .collect()
        };
        (of(true), of(false))
    }
}

/// Reports `waiting for <check>: <status>` whenever a check's status changes, until every
/// check passes. The caller bounds it with the request's wait_timeout.
async fn run_health_check(
    machine: &Machine,
    expected: &Expected,
    tx: &Progress,
) -> Result<(), Status> {
    let members = machine.members().await;
    let (cps, workers) = expected.nodes(&members);
    let ips: Vec<String> = cps
        .iter()
        .chain(&workers)
        .map(ToString::to_string)
        .collect();
    say(tx, format!("discovered nodes: {ips:?}")).await?;
    let mut last: Vec<(&str, String)> = Vec::new();
    loop {
        let statuses = check_once(machine, expected).await;
        let all_ok = statuses.iter().all(|(_, s)| s == "OK");
        for (check, status) in &statuses {
            let seen = last.iter().any(|(c, s)| c == check && s == status);
            if !seen {
                say(tx, format!("waiting for {check}: {status}")).await?;
            }
        }
        if all_ok {
            return Ok(());
        }
        last = statuses;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn ok_or(problems: &[String]) -> String {
    if problems.is_empty() {
        "OK".to_owned()
    } else {
        problems.join("; ")
    }
}

/// etcd as Talos checks it: every listed control plane is an etcd member that answers, and
/// the members are exactly the listed control planes.
fn etcd_checks(members: &[Member], cps: &[Ipv4Addr]) -> [(&'static str, String); 2] {
    let mut problems = Vec::new();
    for ip in cps {
        match members.iter().find(|m| m.address == *ip && m.control_plane) {
            None => problems.push(format!("{ip} is not a control plane of this cluster")),
            Some(m) if !m.joined => problems.push(format!(
                "etcd member {} ({ip}) has not joined yet",
                m.hostname
            )),
            Some(m) if !m.answering => problems.push(format!(
                "etcd member {} ({ip}) is not healthy: the machine does not answer",
                m.hostname
            )),
            Some(_) => {}
        }
    }
    let mut joined: Vec<Ipv4Addr> = members
        .iter()
        .filter(|m| m.control_plane && m.joined)
        .map(|m| m.address)
        .collect();
    joined.sort();
    let mut listed = cps.to_vec();
    listed.sort();
    let consistent = if joined == listed {
        "OK".to_owned()
    } else {
        format!("etcd members {joined:?} are not the control plane nodes {listed:?}")
    };
    [
        ("etcd to be healthy", ok_or(&problems)),
        ("etcd members to be control plane nodes", consistent),
    ]
}

async fn check_once(machine: &Machine, expected: &Expected) -> Vec<(&'static str, String)> {
    let client = match machine.member_of() {
        None => Err("etcd is not bootstrapped".to_owned()),
        Some(c) => c.client().await,
    };
    let client = match client {
        Ok(c) => c,
        Err(e) => {
            return vec![
                ("etcd to be healthy", e.clone()),
                ("kube-apiserver to report ready", e.clone()),
                ("all k8s nodes to report", e.clone()),
                ("all k8s nodes to report ready", e),
            ];
        }
    };
    let members = machine.members().await;
    let (cps, workers) = expected.nodes(&members);
    let mut out = etcd_checks(&members, &cps).to_vec();
    let ready = client
        .request_text(
            http::Request::get("/readyz")
                .body(Vec::new())
                .unwrap_or_default(),
        )
        .await;
    out.push((
        "kube-apiserver to report ready",
        match ready {
            Ok(body) if body.trim() == "ok" => "OK".to_owned(),
            Ok(body) => body,
            Err(e) => e.to_string(),
        },
    ));
    let wanted: Vec<String> = cps
        .iter()
        .chain(&workers)
        .map(|ip| {
            members
                .iter()
                .find(|m| m.address == *ip)
                .map_or_else(|| ip.to_string(), |m| m.hostname.clone())
        })
        .collect();
    out.extend(node_checks(client, &wanted).await);
    out
}

/// `all k8s nodes to report` (exactly the listed nodes, none missing, none unexpected) and
/// `all k8s nodes to report ready`.
async fn node_checks(client: kube::Client, wanted: &[String]) -> [(&'static str, String); 2] {
    let api: KubeApi<Node> = KubeApi::all(client);
    let nodes = match api.list(&kube::api::ListParams::default()).await {
        Ok(list) => list.items,
        Err(e) => {
            let e = e.to_string();
            return [
                ("all k8s nodes to report", e.clone()),
                ("all k8s nodes to report ready", e),
            ];
        }
    };
    let names: Vec<String> = nodes
        .iter()
        .filter_map(|n| n.metadata.name.clone())
        .collect();
    let missing: Vec<&String> = wanted.iter().filter(|w| !names.contains(w)).collect();
    let unexpected: Vec<&String> = names.iter().filter(|n| !wanted.contains(n)).collect();
    let mut problems = Vec::new();
    if !missing.is_empty() {
        problems.push(format!("some nodes are missing: {missing:?}"));
    }
    if !unexpected.is_empty() {
        problems.push(format!("unexpected nodes: {unexpected:?}"));
    }
    let not_ready: Vec<&String> = nodes
        .iter()
        .filter(|n| !kontinuum_testbed::node_is_ready(n))
        .filter_map(|n| n.metadata.name.as_ref())
        .filter(|n| wanted.contains(n))
        .collect();
    let ready = if not_ready.is_empty() && missing.is_empty() {
        "OK".to_owned()
    } else {
        format!(
            "some nodes are not ready: {:?}",
            [missing, not_ready].concat()
        )
    };
    [
        ("all k8s nodes to report", ok_or(&problems)),
        ("all k8s nodes to report ready", ready),
    ]
}

/// A COSI resource as Talos serves it: both `proto_spec` and `yaml_spec` filled.
fn resource(namespace: &str, ty: &str, spec: resources::CosiSpec) -> Resource {
    Resource {
        metadata: Some(Metadata {
            namespace: namespace.to_owned(),
            r#type: ty.to_owned(),
            id: spec.id,
            version: "1".to_owned(),
            owner: String::new(),
            phase: "running".to_owned(),
            ..Default::default()
        }),
        spec: Some(Spec {
            proto_spec: spec.proto,
            yaml_spec: spec.yaml,
        }),
    }
}

/// COSI namespaces and types the emulator serves.
const NETWORK: &str = "network";
const RUNTIME: &str = "runtime";
const LINKS: &str = "LinkStatuses.net.talos.dev";
const ADDRESSES: &str = "AddressStatuses.net.talos.dev";
const DISKS: &str = "Disks.block.talos.dev";

impl Api {
    fn resources(&self, namespace: &str, ty: &str) -> Result<Vec<Resource>, Status> {
        let facts = &self.machine.facts;
        let specs = match (namespace, ty) {
            (NETWORK, LINKS) => resources::links(facts),
            (NETWORK, ADDRESSES) => resources::addresses(facts),
            (RUNTIME, DISKS) => resources::disks(facts),
            _ => {
                return Err(Status::not_found(format!(
                    "resource type {ty:?} in namespace {namespace:?} is not emulated"
                )));
            }
        };
        Ok(specs
            .into_iter()
            .map(|spec| resource(namespace, ty, spec))
            .collect())
    }
}

#[tonic::async_trait]
impl State for Api {
    async fn get(&self, request: Request<GetRequest>) -> Result<Response<GetResponse>, Status> {
        self.admit(&request, Access::Read).await?;
        let r = request.into_inner();
        let found = self
            .resources(&r.namespace, &r.r#type)?
            .into_iter()
            .find(|res| res.metadata.as_ref().is_some_and(|m| m.id == r.id))
            .ok_or_else(|| Status::not_found(format!("resource {:?} doesn't exist", r.id)))?;
        Ok(Response::new(GetResponse {
            resource: Some(found),
        }))
    }

    async fn list(
        &self,
        request: Request<ListRequest>,
    ) -> Result<Response<BoxStream<ListResponse>>, Status> {
        self.admit(&request, Access::Read).await?;
        let r = request.into_inner();
        let items: Vec<Result<ListResponse, Status>> = self
            .resources(&r.namespace, &r.r#type)?
            .into_iter()
            .map(|resource| {
                Ok(ListResponse {
                    resource: Some(resource),
                })
            })
            .collect();
        Ok(Response::new(Box::pin(tokio_stream::iter(items))))
    }
}

#[tonic::async_trait]
impl StorageService for Api {
    async fn disks(&self, request: Request<()>) -> Result<Response<DisksResponse>, Status> {
        self.admit(&request, Access::Read).await?;
        let d = self.machine.facts.disk();
        Ok(Response::new(DisksResponse {
            messages: vec![Disks {
                metadata: None,
                disks: vec![Disk {
                    size: d.size,
                    model: d.model,
                    device_name: d.dev_path,
                    name: d.name,
                    serial: d.serial,
                    r#type: 1, // SSD
                    system_disk: true,
                    subsystem: "/sys/class/block".to_owned(),
                    ..Default::default()
                }],
            }],
        }))
    }
}
