//! talos-bootstrapper: turns the claimed machines of a `TalosCluster` from Talos maintenance
//! mode into a running Kubernetes cluster, and back into maintenance mode on deletion.
//!
//! Two controllers run in this binary:
//!
//! * [`cluster`] reconciles `TalosCluster`s. It owns the cluster's status (conditions
//!   `Bootstrapped`, `KubeconfigAvailable`, `ControlPlaneReady`, `AddonsReady`, `Ready`,
//!   `Deleting`), its Secrets `taloscluster-<name>` (keys `secrets-bundle`, created once and
//!   never regenerated, and `talosconfig`; read by this operator alone) and
//!   `taloscluster-<name>-kubeconfig` (key `kubeconfig` only, `status.secretRef`), the built-in Addons `<cluster>-<release>` it seeds,
//!   the Instance conditions `Configured`, `Joined` and (control planes) `Healthy` of its
//!   members, and the
//!   finalizer `kontinuum.sh/talos-bootstrapper` (teardown: reset workers, then the control
//!   plane, then release or delete the Instances). Field manager
//!   `talos-bootstrapper.kontinuum.sh`. Triggered by TalosCluster changes and by changes of
//!   the Instances, Addons and Secrets it depends on (mapped to their cluster), so progress
//!   is event-driven. Never touches an Instance another cluster's pool holds, or the spec of
//!   an Addon it did not create.
//! * [`reset`] reconciles `Instance`s claimed by a pool that a TalosCluster uses. It owns the
//!   finalizer `kontinuum.sh/instance-reset`: an Instance deleted while its machine is
//!   configured is reset to maintenance mode first (bounded by the teardown deadline).
//!
//! Every Talos call is bounded by `--talos-connect-timeout-seconds` and
//! `--talos-rpc-timeout-seconds`; the cluster health check by
//! `--health-check-timeout-seconds`.

pub mod cluster;
pub mod downstream;
pub mod machines;
pub mod plan;
mod reconfigure;
pub mod reset;
mod teardown;

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use kontinuum_crds::v1alpha2::{Addon, Instance, TalosCluster};
use kontinuum_operator_common::admin::{Readiness, hub_watch};
use kontinuum_operator_common::backoff::{Backoff, object_key};
use kontinuum_operator_common::error::{
    ErrorClass, FORBIDDEN, ReconcileError, forbidden, kube_error_class,
};
use kontinuum_operator_common::events::Events;
use kontinuum_operator_common::metrics::ControllerMetrics;
use kontinuum_operator_common::shutdown::Shutdown;
use kontinuum_operator_common::subscribe;
use kontinuum_operator_common::tracked::{ChangeFilter, ObjectMap, forget_gone};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Api, Client};

/// The controller's name.
pub const CONTROLLER: &str = "talos-bootstrapper";
/// Field manager of everything this operator writes.
pub const FIELD_MANAGER: &str = "talos-bootstrapper.kontinuum.sh";
/// At most this many machines of one cluster are called at once (configuring, asking
/// whether they joined): each call is bounded by the Talos timeouts, and a machine that
/// hangs holds up no other.
pub const MEMBER_CONCURRENCY: usize = 8;
/// Steady-state resync, a safety net for missed watch events.
pub const RESYNC: Duration = Duration::from_secs(600);

/// Settings of the operator.
#[derive(Clone, Debug)]
pub struct Settings {
    /// How machines are reached.
    pub dialer: machines::Dialer,
    /// How often a ready control plane's health is checked again.
    pub health_interval: Duration,
    /// Requeue while waiting for something outside Kubernetes (a machine, the API server).
    pub retry: Duration,
    /// How long teardown keeps trying before it removes its finalizer anyway.
    pub teardown_timeout: Duration,
    /// After a Bootstrap call whose outcome was lost (a crash, a timeout), how long to wait
    /// for the cluster's API server before calling Bootstrap again.
    pub bootstrap_grace: Duration,
    /// Bits of the Kubernetes service-account RSA key in new secrets bundles.
    pub rsa_bits: usize,
}

/// What a reconcile needs.
pub struct Ctx {
    /// Hub client.
    pub client: Client,
    /// Every Instance, from a reflector.
    pub instances: Store<Instance>,
    /// Every Addon, from a reflector.
    pub addons: Store<Addon>,
    /// Every TalosCluster, from a reflector.
    pub clusters: Store<TalosCluster>,
    /// Settings.
    pub settings: Settings,
    /// Every Talos call goes through this.
    pub machines: Arc<dyn machines::Machines>,
    /// Reconcile metrics.
    pub metrics: Arc<ControllerMetrics>,
    /// Event publisher.
    pub events: Events,
    /// Per-object backoff after failures.
    pub backoff: Backoff,
    /// When each cluster's control plane last passed its health check (`namespace/name`;
    /// dropped with the cluster).
    pub last_healthy: ObjectMap<tokio::time::Instant>,
    /// The TalosCluster statuses written, so a reconcile from a cache behind them writes
    /// none again.
    pub status_writes: kontinuum_operator_common::status::StatusWrites,
}

impl Ctx {
    /// Whether every store has had its first full list (waiting at most 30 s). Decisions
    /// read the stores: a process restarted during a teardown that had not yet seen the
    /// cluster's Instances would find no member to reset and finish at once, leaving the
    /// machines configured.
    pub async fn stores_ready(&self) -> bool {
        tokio::time::timeout(Duration::from_secs(30), async {
            self.instances.wait_until_ready().await.is_ok()
                && self.addons.wait_until_ready().await.is_ok()
                && self.clusters.wait_until_ready().await.is_ok()
        })
        .await
        .unwrap_or(false)
    }
}

/// What can go wrong in a reconcile.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A Kubernetes API call failed.
    #[error("failed to {what}")]
    Kube {
        /// What was being done.
        what: String,
        /// The cause.
        #[source]
        source: kube::Error,
    },
    /// A Talos call failed.
    #[error("talos api of {instance}")]
    Talos {
        /// The Instance.
        instance: String,
        /// The cause.
        #[source]
        source: kontinuum_talos::Error,
    },
    /// A member has no address to dial.
    #[error("instance {instance} has no address: neither status.address nor spec.interfaces")]
    NoAddress {
        /// The Instance.
        instance: String,
    },
    /// A member has no identity to pin its maintenance connection to.
    #[error(
        "instance {instance} has no identity (neither spec.identity nor status.identity): no machine config is sent to an unidentified machine"
    )]
    NoIdentity {
        /// The Instance.
        instance: String,
    },
    /// The secrets bundle could not be generated, parsed or used.
    #[error("talos secrets bundle")]
    Secrets(#[source] kontinuum_talos_config::SecretsError),
    /// The Secret holds no usable secrets bundle.
    #[error("secret {secret} holds no usable secrets bundle under key secrets-bundle")]
    BadSecret {
        /// The Secret.
        secret: String,
    },
    /// A machine reports a Talos version no machine config can be rendered for.
    #[error("instance {instance} runs a talos version this operator cannot configure")]
    MachineVersion {
        /// The Instance.
        instance: String,
        /// The cause.
        #[source]
        source: kontinuum_talos_config::VersionError,
    },
    /// Rendering a machine config failed.
    #[error("rendering the machine config of {instance}")]
    Config {
        /// The Instance.
        instance: String,
        /// The cause.
        #[source]
        source: Box<kontinuum_talos_config::ConfigError>,
    },
    /// A machine-config patch cannot be merged, or makes the config one Talos refuses.
    /// Names the patch (`TalosCluster spec.talos.configPatches[0]`) and the field, never a
    /// value (a config holds every cluster CA key).
    #[error("machine config of {instance}: patch {patch}: {problem}; nothing was sent")]
    Patch {
        /// The Instance.
        instance: String,
        /// Which patch, as a path a person can find it by.
        patch: String,
        /// What is wrong, in Talos' words.
        problem: String,
    },
    /// The cluster's own API server could not be asked.
    #[error("asking the cluster's API server")]
    Downstream(#[source] Box<downstream::DownstreamError>),
    /// A blocking task died.
    #[error("a background task failed")]
    Join,
}

impl Error {
    /// For `map_err`: a Talos call to `instance` failed.
    pub(crate) fn talos(instance: &str) -> impl FnOnce(kontinuum_talos::Error) -> Self {
        let instance = instance.to_owned();
        move |source| Self::Talos { instance, source }
    }

    pub(crate) fn kube(what: impl Into<String>) -> impl FnOnce(kube::Error) -> Self {
        let what = what.into();
        move |source| Self::Kube { what, source }
    }
}

impl ReconcileError for Error {
    fn reason(&self) -> &'static str {
        // An RBAC refusal is a person's to fix, not a failure to wait out.
        if forbidden(self).is_some() {
            return FORBIDDEN;
        }
        match self {
            Error::Kube { .. } => "KubeApiFailed",
            Error::Talos { source, .. } => source.reason(),
            Error::NoAddress { .. } => "NoAddress",
            Error::NoIdentity { .. } => "IdentityUnknown",
            Error::Secrets(_) | Error::BadSecret { .. } => "SecretsBundleFailed",
            Error::MachineVersion { .. } => "UnsupportedTalosVersion",
            Error::Config { .. } => "ConfigFailed",
            Error::Patch { .. } => "InvalidConfigPatch",
            Error::Join => "TaskFailed",
            Error::Downstream(_) => "DownstreamUnreachable",
        }
    }

    fn class(&self) -> ErrorClass {
        match self {
            Error::Kube { source, .. } => kube_error_class(source),
            Error::Talos { source, .. } if source.is_transient() => ErrorClass::Transient,
            Error::Talos { .. }
            | Error::NoAddress { .. }
            | Error::NoIdentity { .. }
            | Error::Secrets(_)
            | Error::BadSecret { .. }
            | Error::MachineVersion { .. }
            | Error::Config { .. }
            | Error::Patch { .. } => ErrorClass::Permanent,
            Error::Join | Error::Downstream(_) => ErrorClass::Transient,
        }
    }
}

/// Runs both controllers until `shutdown` triggers. `namespace` limits the watches.
pub async fn run(
    client: Client,
    namespace: Option<&str>,
    settings: Settings,
    metrics: Arc<ControllerMetrics>,
    events: Events,
    readiness: Readiness,
    shutdown: Shutdown,
) {
    fn api<K>(client: &Client, namespace: Option<&str>) -> Api<K>
    where
        K: kube::Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>,
    {
        match namespace {
            Some(ns) => Api::namespaced(client.clone(), ns),
            None => Api::all(client.clone()),
        }
    }
    let (instances, instance_writer) = reflector::store();
    // One Instance watch (and one cache of every Instance): the cluster controller's wakes
    // and the instance-reset controller's trigger are fed from it.
    let (instance_events, mut instance_subscribers) = subscribe::share(
        hub_watch(
            api::<Instance>(&client, namespace),
            watcher::Config::default(),
            &readiness,
        )
        .reflect(instance_writer),
        &instances,
        1,
    );
    let Some(reset_trigger) = instance_subscribers.pop() else {
        return;
    };
    let instance_events = instance_events.touched_objects();
    let (addons, addon_writer) = reflector::store();
    let addon_changes = ChangeFilter::new("addon_changes");
    let addon_events = forget_gone(
        hub_watch(
            api::<Addon>(&client, namespace),
            watcher::Config::default(),
            &readiness,
        )
        .reflect(addon_writer),
        addons.clone(),
        vec![Arc::new(addon_changes.map().clone())],
        &metrics,
    )
    .touched_objects()
    .filter(move |addon| {
        std::future::ready(addon.as_ref().map_or(true, |addon| {
            addon_changes.changed(object_key(addon), plan::addon_trigger_key(addon))
        }))
    });
    let (clusters, cluster_writer) = reflector::store();
    // Per-cluster state, dropped with its cluster.
    let backoff = Backoff::default();
    let last_healthy = ObjectMap::new("last_healthy");
    let status_writes = kontinuum_operator_common::status::StatusWrites::new("status_writes");
    let cluster_events = forget_gone(
        hub_watch(
            api::<TalosCluster>(&client, namespace),
            watcher::Config::default(),
            &readiness,
        )
        .reflect(cluster_writer),
        clusters.clone(),
        vec![
            Arc::new(backoff.clone()),
            Arc::new(last_healthy.clone()),
            Arc::new(status_writes.clone()),
        ],
        &metrics,
    )
    .applied_objects();

    let machines = Arc::new(machines::Network {
        dialer: settings.dialer,
        metrics: Arc::clone(&metrics),
    });
    let ctx = Arc::new(Ctx {
        client: client.clone(),
        instances,
        addons,
        clusters,
        settings,
        machines,
        metrics,
        events,
        backoff,
        last_healthy,
        status_writes,
    });
    let secrets = api::<k8s_openapi::api::core::v1::Secret>(&client, namespace);
    let clusters_done = cluster::run(
        Arc::clone(&ctx),
        cluster_events,
        instance_events,
        addon_events,
        secrets,
        &readiness,
        shutdown.clone(),
    );
    let resets_done = reset::run(ctx, reset_trigger, shutdown);
    futures::future::join(clusters_done, resets_done).await;
}
