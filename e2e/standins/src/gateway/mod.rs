//! The Gateway STAND-IN (`gateway-standin`): Cilium's Gateway API implementation cannot run
//! in Kontinuum's test bed, so e2e runs this in its place against the real Gateway API
//! CRDs. It programs Gateways of GatewayClasses whose `controllerName` is its own, the
//! linkerd way: reflectors feed one snapshot, a pure [`plan`] turns it into the data plane
//! ([`proxy`]) and the statuses, which are written only when they change.
//!
//! Reconciles: GatewayClasses with its `controllerName`; Gateways of those classes;
//! HTTPRoutes whose parentRefs name such Gateways.
//! Owns (field manager [`FIELD_MANAGER`]): GatewayClass `Accepted`; Gateway
//! `status.addresses`, `Accepted`, `Programmed` and `status.listeners` (with `Accepted`,
//! `Conflicted`, `ResolvedRefs`, `Programmed`, `attachedRoutes`, `supportedKinds`); the
//! HTTPRoute `status.parents` entries with its `controllerName` (`Accepted`,
//! `ResolvedRefs`), keeping other controllers' entries.
//! Triggered by: any change of GatewayClasses, Gateways, HTTPRoutes, Services,
//! EndpointSlices, Pods (for Services without EndpointSlices) and `kubernetes.io/tls`
//! Secrets (a renewed certificate is served to new connections at once), plus a resync.
//! Never: touches GatewayClasses of other controllers or their Gateways, or any spec.

pub mod plan;
pub mod proxy;
pub mod types;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{Pod, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kontinuum_operator_common::admin::{Readiness, track_sync};
use kontinuum_operator_common::error::ReconcileError;
use kontinuum_operator_common::metrics::ControllerMetrics;
use kontinuum_operator_common::shutdown::Shutdown;
use kube::api::{Patch, PatchParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Api, Client, Resource, ResourceExt as _};
use tokio::sync::Notify;

use plan::{Plan, Settings, World};
use types::{Gateway, GatewayClass, HTTPRoute};

/// The controller name (metrics, logs).
pub const CONTROLLER: &str = "gateway-standin";
/// The field manager of every status write.
pub const FIELD_MANAGER: &str = "gateway-standin.kontinuum.sh";
/// The default `controllerName` it serves.
pub const DEFAULT_CONTROLLER_NAME: &str = "kontinuum.sh/gateway-standin";
/// Safety-net resync.
pub const RESYNC: Duration = Duration::from_secs(300);
/// Retry delay after a failed status write or port bind.
pub const RETRY: Duration = Duration::from_secs(2);

/// Command-line arguments of `gateway-standin` (besides the common ones).
#[derive(clap::Args, Clone, Debug)]
pub struct Args {
    /// The `controllerName` of the GatewayClasses to program.
    #[arg(long, env = "GATEWAY_CONTROLLER_NAME", default_value = DEFAULT_CONTROLLER_NAME)]
    pub controller_name: String,
    /// The address to listen on, reported as every Gateway's address.
    #[arg(long, env = "GATEWAY_LISTEN_IP", default_value = "127.0.0.1")]
    pub listen_ip: IpAddr,
    /// Added to each listener's port (e.g. 8000: :443 is served on :8443).
    #[arg(long, env = "GATEWAY_PORT_OFFSET", default_value_t = 0)]
    pub port_offset: u16,
}

impl Args {
    /// The settings.
    pub fn settings(&self) -> Settings {
        Settings {
            controller_name: self.controller_name.clone(),
            listen_ip: self.listen_ip,
            port_offset: self.port_offset,
        }
    }
}

/// Errors of one round.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A status write failed.
    #[error("writing the status of {kind} {object}")]
    PatchStatus {
        /// The kind.
        kind: &'static str,
        /// `namespace/name` or `name`.
        object: String,
        /// The cause.
        #[source]
        source: kube::Error,
    },
}

impl ReconcileError for Error {
    fn reason(&self) -> &'static str {
        match self {
            Self::PatchStatus { .. } => "StatusPatchFailed",
        }
    }
}

struct Stores {
    classes: Store<GatewayClass>,
    gateways: Store<Gateway>,
    routes: Store<HTTPRoute>,
    services: Store<Service>,
    slices: Store<EndpointSlice>,
    secrets: Store<Secret>,
    pods: Store<Pod>,
}

impl Stores {
    fn snapshot(&self) -> World {
        World {
            classes: self.classes.state(),
            gateways: self.gateways.state(),
            routes: self.routes.state(),
            services: self.services.state(),
            slices: self.slices.state(),
            secrets: self.secrets.state(),
            pods: self.pods.state(),
        }
    }
}

/// Watches `api` into a store, counting the watch for `/readyz` and waking `notify` on
/// every event.
fn reflect<K>(
    api: Api<K>,
    config: watcher::Config,
    readiness: &Readiness,
    notify: &Arc<Notify>,
) -> (
    Store<K>,
    impl std::future::Future<Output = ()> + Send + use<K>,
)
where
    K: Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let (store, writer) = reflector::store();
    let notify = notify.clone();
    let driver = track_sync(watcher(api, config).default_backoff(), readiness)
        .reflect(writer)
        .for_each(move |event| {
            if let Err(e) = event {
                tracing::warn!(
                    error = &e as &dyn std::error::Error,
                    "watch failed; retrying"
                );
            }
            notify.notify_one();
            std::future::ready(())
        });
    (store, driver)
}

/// Runs the stand-in until `shutdown`.
pub async fn run(
    client: Client,
    settings: Settings,
    metrics: Arc<ControllerMetrics>,
    readiness: Readiness,
    shutdown: Shutdown,
) {
    let notify = Arc::new(Notify::new());
    let cfg = watcher::Config::default;
    let (classes, w1) = reflect(Api::all(client.clone()), cfg(), &readiness, &notify);
    let (gateways, w2) = reflect(Api::all(client.clone()), cfg(), &readiness, &notify);
    let (routes, w3) = reflect(Api::all(client.clone()), cfg(), &readiness, &notify);
    let (services, w4) = reflect(Api::all(client.clone()), cfg(), &readiness, &notify);
    let (slices, w5) = reflect(Api::all(client.clone()), cfg(), &readiness, &notify);
    let (secrets, w6) = reflect(
        Api::all(client.clone()),
        cfg().fields("type=kubernetes.io/tls"),
        &readiness,
        &notify,
    );
    let (pods, w7) = reflect(Api::all(client.clone()), cfg(), &readiness, &notify);
    let stores = Stores {
        classes,
        gateways,
        routes,
        services,
        slices,
        secrets,
        pods,
    };
    tracing::info!(
        controller_name = %settings.controller_name,
        listen_ip = %settings.listen_ip,
        port_offset = settings.port_offset,
        "starting the Gateway stand-in"
    );
    let watches = async {
        tokio::join!(w1, w2, w3, w4, w5, w6, w7);
    };
    tokio::select! {
        () = watches => {}
        () = rounds(&client, &settings, &stores, &metrics, &readiness, &notify) => {}
        () = shutdown.wait() => {}
    }
}

async fn rounds(
    client: &Client,
    settings: &Settings,
    stores: &Stores,
    metrics: &ControllerMetrics,
    readiness: &Readiness,
    notify: &Notify,
) {
    let mut dataplane = proxy::DataPlane::new(settings.listen_ip);
    let mut wait = RESYNC;
    loop {
        tokio::select! {
            () = notify.notified() => {}
            () = tokio::time::sleep(wait) => {}
        }
        // Act only on a complete picture.
        if readiness.check().is_err() {
            wait = RESYNC;
            continue;
        }
        let _timer = metrics.reconcile_timer();
        let world = stores.snapshot();
        let plan = plan::plan(&world, settings);
        let bound = dataplane.apply(plan.ports.clone()).await;
        let bind_failed = bound.values().any(Result::is_err);
        wait = match report(client, settings, &world, &plan, &bound).await {
            Ok(()) if !bind_failed => RESYNC,
            Ok(()) => RETRY,
            Err(e) => {
                tracing::warn!(
                    reason = e.reason(),
                    error = &e as &dyn std::error::Error,
                    "round failed; retrying"
                );
                metrics.failure(e.reason());
                RETRY
            }
        };
    }
}

fn status_body<K: Resource<DynamicType = ()>>(status: &impl serde::Serialize) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "status": status,
    })
}

/// Writes every status that changed.
async fn report(
    client: &Client,
    settings: &Settings,
    world: &World,
    plan: &Plan,
    bound: &BTreeMap<u16, Result<(), String>>,
) -> Result<(), Error> {
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let apply = PatchParams::apply(FIELD_MANAGER).force();
    for class in world
        .classes
        .iter()
        .filter(|c| plan.classes.contains(&c.name_any()))
    {
        let desired = plan::class_status(class, &now);
        let current = class.status.clone().unwrap_or_default();
        if plan::same_conditions(&current.conditions, &desired.conditions) {
            continue;
        }
        let api: Api<GatewayClass> = Api::all(client.clone());
        crate::with_timeout(api.patch_status(
            &class.name_any(),
            &apply,
            &Patch::Apply(status_body::<GatewayClass>(&desired)),
        ))
        .await
        .map_err(|source| Error::PatchStatus {
            kind: "GatewayClass",
            object: class.name_any(),
            source,
        })?;
        tracing::info!(class = %class.name_any(), "accepted gateway class");
    }
    for gp in &plan.gateways {
        let current = world
            .gateways
            .iter()
            .find(|g| {
                g.namespace().as_deref() == Some(gp.namespace.as_str()) && g.name_any() == gp.name
            })
            .and_then(|g| g.status.clone());
        let desired = plan::gateway_status(gp, current.as_ref(), bound, settings, &now);
        if current
            .as_ref()
            .is_some_and(|c| plan::same_gateway_status(c, &desired))
        {
            continue;
        }
        let api: Api<Gateway> = Api::namespaced(client.clone(), &gp.namespace);
        crate::with_timeout(api.patch_status(
            &gp.name,
            &apply,
            &Patch::Apply(status_body::<Gateway>(&desired)),
        ))
        .await
        .map_err(|source| Error::PatchStatus {
            kind: "Gateway",
            object: format!("{}/{}", gp.namespace, gp.name),
            source,
        })?;
        tracing::info!(gateway = %format!("{}/{}", gp.namespace, gp.name), "gateway status changed");
    }
    for route in &world.routes {
        let namespace = route.namespace().unwrap_or_default();
        let name = route.name_any();
        let current = route.status.clone().unwrap_or_default().parents;
        let (mine, others): (Vec<_>, Vec<_>) = current
            .into_iter()
            .partition(|p| p.controller_name == settings.controller_name);
        let desired = plan
            .routes
            .iter()
            .find(|r| r.namespace == namespace && r.name == name)
            .map(|r| plan::route_parents(r, &mine, &settings.controller_name, &now))
            .unwrap_or_default();
        if plan::same_parents(&mine, &desired) {
            continue;
        }
        // `status.parents` is an atomic list: write it whole, other controllers' entries
        // included.
        let mut parents = others;
        parents.extend(desired);
        let api: Api<HTTPRoute> = Api::namespaced(client.clone(), &namespace);
        let body = serde_json::json!({ "status": { "parents": parents } });
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.to_owned()),
            ..PatchParams::default()
        };
        crate::with_timeout(api.patch_status(&name, &params, &Patch::Merge(&body)))
            .await
            .map_err(|source| Error::PatchStatus {
                kind: "HTTPRoute",
                object: format!("{namespace}/{name}"),
                source,
            })?;
        tracing::info!(route = %format!("{namespace}/{name}"), "route status changed");
    }
    Ok(())
}
