//! addon-installer: installs Addons (Helm charts) onto the zone clusters of TalosClusters.
//!
//! * Reconciles: `Addon`.
//! * Owns: the Addon's status (conditions `Installed`, `Healthy`, `Ready`, `Deleting`,
//!   `releaseName`, `namespace`, `chartVersion`, `revision`) under field manager
//!   `addon-installer.kontinuum.sh`; finalizer `kontinuum.sh/addon-installer`, which
//!   uninstalls the release when the Addon is deleted (unless its TalosCluster is going away
//!   too, or the visible deadline passed); in the downstream cluster: the Helm release
//!   (HelmUpgradeInstall) or the applied objects plus their inventory ConfigMap
//!   `kontinuum-addon-<release>` (KubectlApply).
//! * Triggered by: Addon changes; changes of an Addon of the same cluster (for waves and
//!   `dependsOn`, mapped to the siblings that are not `Ready`); TalosCluster changes and
//!   changes of the cluster's kubeconfig Secret (mapped to the cluster's Addons; the Secret
//!   watch selects `app.kubernetes.io/component=talos-cluster-kubeconfig`, and the only
//!   Secret ever read is the one `status.secretRef` names, never the secrets bundle); a
//!   change of pod health in the zone cluster, from one pod watch per cluster
//!   ([`pod_watch`]); a resync (`--resync-interval`) that probes health and repairs drift
//!   without a new revision.
//! * Never: writes the TalosCluster or its Secrets, upgrades a release whose desired state
//!   did not change, or waits for workloads inside a helm call (`--wait` is never used).
//!
//! Steps of one reconcile: observe (cluster, kubeconfig, release record), plan (resolve the
//! request, pure; decide the release action, pure), act (dependency gate, then helm or
//! server-side apply), report (CRD gate, pod probe, status if changed).

pub mod downstream;
pub mod health;
pub mod helm;
pub mod manifests;
pub mod pod_watch;
pub mod resolve;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kontinuum_crds::conditions::{self, ConditionStatus};
use kontinuum_crds::reasons::{AddonCondition as Cond, AddonReason as Reason};
use kontinuum_crds::v1alpha2::{
    Addon, AddonStatus, KUBECONFIG_KEY, KUBECONFIG_SECRET_COMPONENT, ProvisioningMethod,
    TalosCluster,
};
use kontinuum_operator_common::admin::{Readiness, hub_watch};
use kontinuum_operator_common::backoff::{Backoff, object_key};
use kontinuum_operator_common::error::{
    FORBIDDEN, ReconcileError, chain, forbidden, retry_after_backoff,
};
use kontinuum_operator_common::events::Events;
use kontinuum_operator_common::metrics::ControllerMetrics;
use kontinuum_operator_common::shutdown::Shutdown;
use kontinuum_operator_common::status::{StatusWrites, apply_status};
use kontinuum_operator_common::subscribe;
use kontinuum_operator_common::tracked::{ChangeFilter, ObjectMap, forget_gone};
use kube::core::PartialObjectMeta;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::finalizer::{self, Event as FinalizerEvent, finalizer};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Api, Client, Resource as _, ResourceExt as _};
use serde_json::Value;
use tracing::{info, instrument, warn};

use crate::downstream::DownstreamError;
use crate::helm::{Helm, HelmError};
use crate::manifests::CrdInfo;
use crate::resolve::{InstallRequest, ResolveError};

/// The controller's name.
pub const CONTROLLER: &str = "addon-installer";
/// Field manager of everything this controller writes, on the hub and downstream.
pub const FIELD_MANAGER: &str = "addon-installer.kontinuum.sh";
/// Finalizer that uninstalls the release.
pub const FINALIZER: &str = kontinuum_crds::finalizers::ADDON_INSTALLER;

/// Settings of the controller (from the command line).
#[derive(Clone, Debug)]
pub struct Settings {
    /// Helm repository (or `oci://` path) replacing the repository of every built-in.
    pub chart_mirror: Option<String>,
    /// Steady-state resync: health probe and drift check.
    pub resync: Duration,
    /// Requeue while waiting (dependency, kubeconfig, unhealthy workloads).
    pub retry: Duration,
    /// Bound of each helm call.
    pub install_timeout: Duration,
    /// Bound of each call to a downstream cluster.
    pub probe_timeout: Duration,
    /// How long after an Addon's deletion the uninstall is retried before giving up.
    pub uninstall_deadline: Duration,
    /// How many Addons are reconciled at once (each may run helm).
    pub concurrency: u16,
}

impl Default for Settings {
    /// The reference's figures: resync 5 min, retry 15 s, install 90 s, probe 15 s; and a
    /// 15 min bound on uninstalling.
    fn default() -> Self {
        Self {
            chart_mirror: None,
            resync: Duration::from_secs(300),
            retry: Duration::from_secs(15),
            install_timeout: Duration::from_secs(90),
            probe_timeout: Duration::from_secs(15),
            uninstall_deadline: Duration::from_secs(900),
            concurrency: 4,
        }
    }
}

/// The command-line arguments of the addon-installer (besides the common ones).
#[derive(clap::Args, Clone, Debug)]
pub struct Args {
    /// The helm binary (a path, or a name looked up on PATH).
    #[arg(long, env = "KONTINUUM_ADDON_HELM", default_value = "helm")]
    pub helm: PathBuf,

    /// Writable directory for helm's cache, config and data (and temporary kubeconfigs).
    /// Unset: `$TMPDIR/kontinuum-helm`.
    #[arg(long, env = "KONTINUUM_ADDON_HELM_HOME")]
    pub helm_home: Option<PathBuf>,

    /// Helm repository URL (or `oci://` registry path) that replaces the repository of every
    /// built-in Addon: it must hold each built-in under its release name
    /// (`gateway-api-crds`, `cilium`, `cert-manager`).
    #[arg(long, env = "KONTINUUM_ADDON_CHART_MIRROR")]
    pub chart_mirror: Option<String>,

    /// Steady-state resync interval, e.g. `5m`, `30s`.
    #[arg(long, env = "KONTINUUM_ADDON_RESYNC_INTERVAL", default_value = "5m", value_parser = parse_duration)]
    pub resync_interval: Duration,

    /// Requeue interval while waiting for a dependency, the kubeconfig or healthy workloads.
    #[arg(long, env = "KONTINUUM_ADDON_RETRY_INTERVAL", default_value = "15s", value_parser = parse_duration)]
    pub retry_interval: Duration,

    /// Timeout of each helm call.
    #[arg(long, env = "KONTINUUM_ADDON_INSTALL_TIMEOUT", default_value = "90s", value_parser = parse_duration)]
    pub install_timeout: Duration,

    /// Timeout of each call to a downstream cluster.
    #[arg(long, env = "KONTINUUM_ADDON_PROBE_TIMEOUT", default_value = "15s", value_parser = parse_duration)]
    pub probe_timeout: Duration,

    /// How long uninstalling a deleted Addon is retried before its finalizer is dropped.
    #[arg(long, env = "KONTINUUM_ADDON_UNINSTALL_DEADLINE", default_value = "15m", value_parser = parse_duration)]
    pub uninstall_deadline: Duration,

    /// How many Addons are reconciled at once (each may run a helm process).
    #[arg(long, env = "KONTINUUM_ADDON_CONCURRENCY", default_value_t = 4,
          value_parser = clap::value_parser!(u16).range(1..))]
    pub concurrency: u16,
}

impl Args {
    /// The controller settings.
    pub fn settings(&self) -> Settings {
        Settings {
            chart_mirror: self.chart_mirror.clone().filter(|m| !m.is_empty()),
            resync: self.resync_interval,
            retry: self.retry_interval,
            install_timeout: self.install_timeout,
            probe_timeout: self.probe_timeout,
            uninstall_deadline: self.uninstall_deadline,
            concurrency: self.concurrency,
        }
    }

    /// The helm wrapper.
    pub fn helm(&self) -> Helm {
        let home = self
            .helm_home
            .clone()
            .unwrap_or_else(|| std::env::temp_dir().join("kontinuum-helm"));
        Helm::new(self.helm.clone(), home, self.install_timeout)
    }
}

pub use kontinuum_operator_common::args::parse_duration;

/// A rendering of a chart, cached by desired-state hash.
#[derive(Debug)]
pub struct Rendered {
    /// Every object.
    pub objects: Vec<Value>,
    /// The CRDs among them.
    pub crds: Vec<CrdInfo>,
}

/// What a reconcile needs.
pub struct Ctx {
    /// Hub client.
    pub client: Client,
    /// Every Addon (waves, dependencies).
    pub addons: Store<Addon>,
    /// Every TalosCluster.
    pub clusters: Store<TalosCluster>,
    /// The helm CLI.
    pub helm: Helm,
    /// Settings.
    pub settings: Settings,
    /// Reconcile metrics.
    pub metrics: Arc<ControllerMetrics>,
    /// Event publisher.
    pub events: Events,
    /// Per-Addon backoff after failures.
    pub backoff: Backoff,
    /// The Addon statuses written, so a reconcile from a cache behind them neither writes
    /// one again nor announces it twice.
    pub status_writes: StatusWrites,
    /// Renderings by desired-state hash (the CRD gate needs the chart's CRDs).
    pub renders: Mutex<HashMap<String, Arc<Rendered>>>,
    /// The pod watches of the zone clusters (health between resyncs).
    pub pods: pod_watch::PodWatches,
}

/// What can go wrong in a reconcile. Install failures are also written to the status.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Reading the kubeconfig Secret failed.
    #[error("reading the kubeconfig Secret {secret}")]
    ReadSecret {
        /// The Secret.
        secret: String,
        /// The cause.
        #[source]
        source: kube::Error,
    },
    /// The downstream cluster failed.
    #[error("downstream cluster")]
    Downstream(#[source] DownstreamError),
    /// A downstream call did not finish in time.
    #[error("{0} timed out")]
    Timeout(String),
    /// helm failed.
    #[error("running helm")]
    Helm(#[source] HelmError),
    /// The rendered chart could not be read.
    #[error("reading the rendered chart")]
    Render(#[source] manifests::ParseError),
    /// The Addon is waiting for something (kubeconfig, uninstall) that will come.
    #[error("{0}")]
    Waiting(String),
    /// Writing the status failed.
    #[error("failed to patch the Addon status")]
    PatchStatus(#[source] kube::Error),
    /// The finalizer machinery failed.
    #[error("finalizer handling failed")]
    Finalizer(#[source] Box<finalizer::Error<Error>>),
}

impl ReconcileError for Error {
    fn reason(&self) -> &'static str {
        if forbidden(self).is_some() {
            return FORBIDDEN;
        }
        match self {
            Error::ReadSecret { .. } => Reason::WaitingForKubeconfig.as_str(),
            Error::Downstream(_) | Error::Timeout(_) | Error::Helm(_) | Error::Render(_) => {
                Reason::InstallFailed.as_str()
            }
            Error::Waiting(_) => "Waiting",
            Error::PatchStatus(_) => "StatusPatchFailed",
            Error::Finalizer(e) => match e.as_ref() {
                finalizer::Error::ApplyFailed(e) | finalizer::Error::CleanupFailed(e) => e.reason(),
                _ => "FinalizerFailed",
            },
        }
    }
}

/// How a reconcile ended, as the status reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// `spec.enabled` is false and nothing is installed.
    Disabled(String),
    /// The TalosCluster or its kubeconfig is not there yet.
    WaitingForKubeconfig(String),
    /// A dependency (wave or `dependsOn`) is not Ready.
    WaitingForDependency(String),
    /// Resolution, install or uninstall failed.
    InstallFailed(String),
    /// The hub's or the zone cluster's RBAC refused a call (an API 403); retried.
    Forbidden(String),
    /// The zone cluster does not answer; retried, the release left as it is.
    Unreachable(String),
    /// Installed at the desired state; health as probed.
    Installed {
        /// What is installed, e.g. `revision 3 of cilium-1.20.1`.
        summary: String,
        /// The chart version.
        chart_version: Option<String>,
        /// The Helm revision (KubectlApply: none).
        revision: Option<i64>,
        /// The CRD gate and pod probe.
        health: Health,
    },
}

/// The verdict of the CRD gate and pod probe.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Health {
    /// A CRD is missing, not Established or not served.
    CrdsNotReady(String),
    /// A workload is not ready.
    NotHealthy(String),
    /// All good.
    Healthy,
}

/// Sets `Installed` and `Healthy` (and what is installed) for an outcome.
fn set_outcome(status: &mut AddonStatus, outcome: &Outcome, generation: Option<i64>, now: &Time) {
    use ConditionStatus::{False, True, Unknown};
    let not_probed = "not probed: the release is not installed at the desired state";
    let was_installed = conditions::is_true(&status.conditions, Cond::Installed);
    // (Installed, if it changes; Healthy), each as status, reason and message.
    let (installed, healthy): (Option<(ConditionStatus, Reason, &str)>, _) = match outcome {
        Outcome::Disabled(m) => (
            Some((False, Reason::Disabled, m)),
            (Unknown, Reason::Disabled, m.as_str()),
        ),
        Outcome::WaitingForKubeconfig(m) => (
            Some((False, Reason::WaitingForKubeconfig, m)),
            (Unknown, Reason::Reconciling, not_probed),
        ),
        Outcome::WaitingForDependency(m) => (
            Some((False, Reason::WaitingForDependency, m)),
            (Unknown, Reason::Reconciling, not_probed),
        ),
        Outcome::InstallFailed(m) => (
            Some((False, Reason::InstallFailed, m)),
            (Unknown, Reason::Reconciling, not_probed),
        ),
        Outcome::Forbidden(m) => (
            Some((False, Reason::Forbidden, m)),
            (Unknown, Reason::Reconciling, not_probed),
        ),
        // What was installed stays recorded: the cluster may come back as it was.
        Outcome::Unreachable(m) => (
            (!was_installed).then_some((False, Reason::ClusterUnreachable, m.as_str())),
            (Unknown, Reason::ClusterUnreachable, m.as_str()),
        ),
        Outcome::Installed {
            summary,
            chart_version,
            revision,
            health,
        } => {
            status.chart_version.clone_from(chart_version);
            status.revision = *revision;
            status.observed_generation = generation;
            let healthy = match health {
                Health::CrdsNotReady(m) => (False, Reason::CRDsNotReady, m.as_str()),
                Health::NotHealthy(m) => (False, Reason::NotHealthy, m.as_str()),
                Health::Healthy => (
                    True,
                    Reason::Healthy,
                    "CRDs established and workloads ready",
                ),
            };
            (Some((True, Reason::Installed, summary.as_str())), healthy)
        }
    };
    let mut set = |c: Cond, (s, r, m): (ConditionStatus, Reason, &str)| {
        conditions::set(
            &mut status.conditions,
            conditions::new(c, s, r, m, generation),
            now,
        );
    };
    if let Some(installed) = installed {
        set(Cond::Installed, installed);
    }
    set(Cond::Healthy, healthy);
}

/// Pure: the status an outcome leads to.
pub fn status(
    addon: &Addon,
    outcome: &Outcome,
    target: Option<(&str, &str)>,
    now: &Time,
) -> AddonStatus {
    let generation = addon.metadata.generation;
    let mut status = addon.status.clone().unwrap_or_default();
    set_outcome(&mut status, outcome, generation, now);
    if let Some((release, namespace)) = target {
        status.release_name = Some(release.to_string());
        status.namespace = Some(namespace.to_string());
    }
    conditions::remove(&mut status.conditions, Cond::Deleting);
    let ready = conditions::ready(&status.conditions, Cond::READY_GATES, false, generation);
    let ready = if matches!(outcome, Outcome::Disabled(_)) {
        conditions::new(
            Cond::Ready,
            ConditionStatus::False,
            Reason::Disabled,
            "spec.enabled is false",
            generation,
        )
    } else {
        ready
    };
    conditions::set(&mut status.conditions, ready, now);
    status
}

/// Pure: what the Addon waits for, if anything: each of `spec.dependsOn` must exist and be
/// `Ready`, and so must every other enabled Addon of the same cluster with a strictly lower
/// priority (its wave). `None` when it may install.
pub fn blocking_dependency(addon: &Addon, all: &[Arc<Addon>]) -> Option<String> {
    let ns = addon.namespace();
    let cluster = &addon.spec.talos_cluster_ref.name;
    let ready = |a: &Addon| {
        a.status
            .as_ref()
            .is_some_and(|s| conditions::is_true(&s.conditions, Cond::Ready))
    };
    let why = |a: &Addon| {
        a.status
            .as_ref()
            .and_then(|s| conditions::get(&s.conditions, Cond::Ready))
            .map_or_else(
                || "not reported yet".to_string(),
                |c| format!("{}: {}", c.reason, c.message),
            )
    };
    let mut depends = addon.spec.depends_on.clone();
    depends.sort();
    for name in &depends {
        match all
            .iter()
            .find(|a| a.namespace() == ns && &a.name_any() == name)
        {
            None => return Some(format!("waiting for Addon {name}: not found")),
            Some(dep) if !ready(dep) => {
                return Some(format!(
                    "waiting for Addon {name} to be Ready ({})",
                    why(dep)
                ));
            }
            Some(_) => {}
        }
    }
    let own = resolve::priority(addon);
    let mut lower: Vec<(i32, String, &Arc<Addon>)> = all
        .iter()
        .filter(|a| a.namespace() == ns && &a.spec.talos_cluster_ref.name == cluster)
        .filter(|a| a.name_any() != addon.name_any() && a.spec.enabled)
        .map(|a| (resolve::priority(a), a.name_any(), a))
        .filter(|(p, _, _)| *p < own)
        .collect();
    lower.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
    lower
        .into_iter()
        .find(|(_, _, a)| !ready(a))
        .map(|(p, name, a)| {
            format!(
                "waiting for Addon {name} (priority {p} < {own}) to be Ready ({})",
                why(a)
            )
        })
}

/// What to do with a Helm release.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReleaseAction {
    /// Deployed at the desired state: nothing to do.
    UpToDate {
        /// The deployed revision.
        revision: i64,
    },
    /// Install or upgrade (absent, changed, or `failed`).
    Upgrade,
    /// A `pending-install` (or `uninstalling`) release: uninstall it, then install.
    RepairByUninstall,
    /// A `pending-upgrade`/`pending-rollback` release: roll back, then upgrade.
    RepairByRollback,
}

/// Pure: the action for a release whose revisions are `revisions` (oldest first).
pub fn plan_release(revisions: &[downstream::Revision], hash: &str) -> ReleaseAction {
    let Some(latest) = revisions.last() else {
        return ReleaseAction::Upgrade;
    };
    match latest.status.as_str() {
        "deployed" if latest.hash.as_deref() == Some(hash) => ReleaseAction::UpToDate {
            revision: latest.version,
        },
        "pending-install" | "uninstalling" => ReleaseAction::RepairByUninstall,
        "pending-upgrade" | "pending-rollback" => {
            if revisions.len() > 1 {
                ReleaseAction::RepairByRollback
            } else {
                ReleaseAction::RepairByUninstall
            }
        }
        _ => ReleaseAction::Upgrade,
    }
}

fn now() -> Time {
    Time(Timestamp::now())
}

/// Reconciles one Addon (through the finalizer).
#[instrument(skip_all, fields(controller = CONTROLLER, addon = %addon.name_any(), namespace = addon.namespace().unwrap_or_default()))]
pub async fn reconcile(addon: Arc<Addon>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let _timer = ctx.metrics.reconcile_timer();
    let ns = addon.namespace().unwrap_or_default();
    let api: Api<Addon> = Api::namespaced(ctx.client.clone(), &ns);
    let action = finalizer(&api, FINALIZER, addon, |event| async {
        match event {
            FinalizerEvent::Apply(addon) => apply(&addon, &ctx).await,
            FinalizerEvent::Cleanup(addon) => cleanup(&addon, &ctx).await,
        }
    })
    .await;
    match action {
        Ok(action) => Ok(action),
        // A reconcile that started from a cached copy of an Addon another one had just
        // released: it is gone, which is what removing the finalizer was for.
        Err(
            finalizer::Error::RemoveFinalizer(kube::Error::Api(status))
            | finalizer::Error::AddFinalizer(kube::Error::Api(status)),
        ) if status.code == 404 => Ok(Action::await_change()),
        Err(e) => Err(Error::Finalizer(Box::new(e))),
    }
}

/// The cluster of an Addon and its kubeconfig, as far as they exist.
enum Access {
    /// No TalosCluster.
    NoCluster,
    /// The TalosCluster is being deleted.
    ClusterDeleting,
    /// No kubeconfig yet; why.
    NoKubeconfig(String),
    /// Ready to talk to the cluster.
    Ready {
        cluster: Arc<TalosCluster>,
        kubeconfig: String,
    },
}

async fn access(addon: &Addon, ctx: &Ctx) -> Result<Access, Error> {
    let ns = addon.namespace().unwrap_or_default();
    let name = &addon.spec.talos_cluster_ref.name;
    let Some(cluster) = ctx
        .clusters
        .get(&ObjectRef::<TalosCluster>::new(name).within(&ns))
    else {
        return Ok(Access::NoCluster);
    };
    if cluster.metadata.deletion_timestamp.is_some() {
        return Ok(Access::ClusterDeleting);
    }
    let Some(secret) = cluster
        .status
        .as_ref()
        .and_then(|s| s.secret_ref.as_ref())
        .map(|r| r.name.clone())
    else {
        return Ok(Access::NoKubeconfig(format!(
            "TalosCluster {name} has no kubeconfig Secret yet"
        )));
    };
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &ns);
    let found = secrets
        .get_opt(&secret)
        .await
        .map_err(|source| Error::ReadSecret {
            secret: secret.clone(),
            source,
        })?;
    let kubeconfig = found
        .and_then(|s| s.data)
        .and_then(|d| d.get(KUBECONFIG_KEY).cloned())
        .and_then(|b| String::from_utf8(b.0).ok())
        .filter(|k| !k.trim().is_empty());
    Ok(match kubeconfig {
        Some(kubeconfig) => Access::Ready {
            cluster,
            kubeconfig,
        },
        None => Access::NoKubeconfig(format!(
            "Secret {secret} of TalosCluster {name} has no {KUBECONFIG_KEY:?} yet"
        )),
    })
}

async fn write_status(
    addon: &Addon,
    ctx: &Ctx,
    outcome: &Outcome,
    target: Option<(&str, &str)>,
) -> Result<(), Error> {
    let ns = addon.namespace().unwrap_or_default();
    let api: Api<Addon> = Api::namespaced(ctx.client.clone(), &ns);
    let desired = status(addon, outcome, target, &now());
    let before = addon
        .status
        .as_ref()
        .and_then(|s| conditions::get(&s.conditions, Cond::Ready))
        .map(|c| (c.status.clone(), c.reason.clone()));
    let written = ctx
        .status_writes
        .apply(&api, addon, FIELD_MANAGER, addon.status.as_ref(), &desired)
        .await
        .map_err(Error::PatchStatus)?;
    // Not written: nothing changed, or this very status was written (and announced) from
    // this version of the Addon already.
    if written && let Some(ready) = conditions::get(&desired.conditions, Cond::Ready) {
        let after = (ready.status.clone(), ready.reason.clone());
        if before.as_ref() != Some(&after) {
            let reference = addon.object_ref(&());
            if ready.status == "True" {
                ctx.events
                    .normal(
                        &reference,
                        &ready.reason,
                        "Reconcile",
                        ready.message.clone(),
                    )
                    .await;
            } else if matches!(
                outcome,
                Outcome::InstallFailed(_)
                    | Outcome::Forbidden(_)
                    | Outcome::Unreachable(_)
                    | Outcome::Installed {
                        health: Health::NotHealthy(_) | Health::CrdsNotReady(_),
                        ..
                    }
            ) {
                ctx.events
                    .warning(
                        &reference,
                        &ready.reason,
                        "Reconcile",
                        ready.message.clone(),
                    )
                    .await;
            }
        }
    }
    Ok(())
}

async fn bounded<T, E>(
    limit: Duration,
    what: &str,
    fut: impl std::future::Future<Output = Result<T, E>>,
) -> Result<T, Error>
where
    Error: From<E>,
{
    match tokio::time::timeout(limit, fut).await {
        Ok(result) => result.map_err(Error::from),
        Err(_) => Err(Error::Timeout(what.to_string())),
    }
}

impl From<DownstreamError> for Error {
    fn from(e: DownstreamError) -> Self {
        Error::Downstream(e)
    }
}

impl From<HelmError> for Error {
    fn from(e: HelmError) -> Self {
        Error::Helm(e)
    }
}

async fn apply(addon: &Addon, ctx: &Ctx) -> Result<Action, Error> {
    let key = object_key(addon);
    // 1. observe: the cluster and its kubeconfig.
    let access = match access(addon, ctx).await {
        Ok(access) => access,
        Err(err) => {
            // An RBAC refusal is shown as such, not as waiting for the kubeconfig.
            if let Some(message) = forbidden(&err) {
                write_status(addon, ctx, &Outcome::Forbidden(message), None).await?;
            }
            return Err(err);
        }
    };
    if !addon.spec.enabled {
        ctx.pods.unwatch(&ObjectRef::from_obj(addon));
        return disable(addon, ctx, &access).await;
    }
    let (cluster, kubeconfig) = match access {
        Access::ClusterDeleting => {
            ctx.pods.unwatch(&ObjectRef::from_obj(addon));
            return Ok(Action::await_change());
        }
        Access::NoCluster => {
            ctx.pods.unwatch(&ObjectRef::from_obj(addon));
            let message = format!(
                "TalosCluster {} not found",
                addon.spec.talos_cluster_ref.name
            );
            write_status(addon, ctx, &Outcome::WaitingForKubeconfig(message), None).await?;
            return Ok(Action::await_change());
        }
        Access::NoKubeconfig(message) => {
            write_status(addon, ctx, &Outcome::WaitingForKubeconfig(message), None).await?;
            return Ok(Action::requeue(ctx.settings.retry));
        }
        Access::Ready {
            cluster,
            kubeconfig,
        } => (cluster, kubeconfig),
    };

    // 2. plan: resolve the request (CEL over the cluster, every time).
    let cluster_json = serde_json::to_value(cluster.as_ref()).unwrap_or(Value::Null);
    let request = match resolve::resolve(addon, &cluster_json, ctx.settings.chart_mirror.as_deref())
    {
        Ok(request) => request,
        Err(err) => return resolve_failed(addon, ctx, &err).await,
    };
    let target = Some((request.release.as_str(), request.namespace.as_str()));

    // 3. act, and 4. report; failures are reported in the status and retried with backoff.
    match install_and_probe(addon, ctx, &request, &kubeconfig).await {
        Ok(outcome) => {
            write_status(addon, ctx, &outcome, target).await?;
            ctx.backoff.reset(&key);
            let healthy = matches!(
                outcome,
                Outcome::Installed {
                    health: Health::Healthy,
                    ..
                }
            );
            let cluster_key = format!(
                "{}/{}",
                cluster.namespace().unwrap_or_default(),
                cluster.name_any()
            );
            if matches!(outcome, Outcome::Installed { .. }) {
                // From now on a pod change downstream wakes this Addon, not the resync.
                ctx.pods.watch(
                    &cluster_key,
                    &kubeconfig,
                    ObjectRef::from_obj(addon),
                    pod_target(&request),
                    healthy,
                );
            }
            // While the pod watch is down, health is probed at the retry interval instead.
            let watched = ctx.pods.lost(&cluster_key).is_none();
            Ok(Action::requeue(if healthy && watched {
                ctx.settings.resync
            } else {
                ctx.settings.retry
            }))
        }
        Err(err) => {
            let outcome = failed(&err, &format!("release {}", request.release));
            write_status(addon, ctx, &outcome, target).await?;
            Err(err)
        }
    }
}

/// What a failed install or uninstall reports: `Forbidden` for an RBAC refusal, otherwise
/// `InstallFailed` with `context` (what was being done) and the error chain. Helm's own
/// output is never in the chain (see [`HelmError`]).
fn failed(err: &Error, context: &str) -> Outcome {
    if let Some(message) = forbidden(err) {
        return Outcome::Forbidden(message);
    }
    if unreachable(err) {
        return Outcome::Unreachable(format!(
            "the zone cluster does not answer ({context}): {}",
            chain(err)
        ));
    }
    Outcome::InstallFailed(format!("{context}: {}", chain(err)))
}

/// Whether `err` says the zone cluster could not be reached (refused, reset, timed out),
/// rather than that it answered with an error.
pub fn unreachable(err: &Error) -> bool {
    match err {
        Error::Timeout(_) => true,
        Error::Downstream(DownstreamError::Api { source, .. }) => {
            matches!(source, kube::Error::HyperError(_) | kube::Error::Service(_))
        }
        _ => false,
    }
}

async fn resolve_failed(addon: &Addon, ctx: &Ctx, err: &ResolveError) -> Result<Action, Error> {
    warn!(
        error = err as &dyn std::error::Error,
        "addon does not resolve"
    );
    write_status(addon, ctx, &Outcome::InstallFailed(err.to_string()), None).await?;
    // A spec problem: wait for a change of the Addon or its cluster (both are watched).
    Ok(Action::await_change())
}

async fn install_and_probe(
    addon: &Addon,
    ctx: &Ctx,
    request: &InstallRequest,
    kubeconfig: &str,
) -> Result<Outcome, Error> {
    let limit = ctx.settings.probe_timeout;
    let client = downstream::connect(kubeconfig, limit).await?;
    let release = &request.release;
    let ns = &request.namespace;
    let helm_method = request.method == ProvisioningMethod::HelmUpgradeInstall;

    // Observe the release record and decide.
    let action = if helm_method {
        let revisions = bounded(
            limit,
            "reading the release",
            downstream::release_revisions(&client, ns, release),
        )
        .await?;
        plan_release(&revisions, &request.hash)
    } else {
        let inventory = bounded(
            limit,
            "reading the inventory",
            downstream::read_inventory(&client, ns, release),
        )
        .await?;
        if inventory.hash.as_deref() == Some(request.hash.as_str()) {
            ReleaseAction::UpToDate { revision: 0 }
        } else {
            ReleaseAction::Upgrade
        }
    };

    if !matches!(action, ReleaseAction::UpToDate { .. }) {
        if let Some(waiting) = blocking_dependency(addon, &ctx.addons.state()) {
            return Ok(Outcome::WaitingForDependency(waiting));
        }
        let kube_version = bounded(
            limit,
            "reading the cluster version",
            downstream::kube_version(&client),
        )
        .await?;
        act(ctx, &client, request, kubeconfig, &action, &kube_version).await?;
        // Warm the rendering for the CRD gate with the version just read.
        render(ctx, request, &kube_version).await?;
    }

    let revision = if helm_method {
        bounded(
            limit,
            "reading the release",
            downstream::release_revisions(&client, ns, release),
        )
        .await?
        .last()
        .map(|r| r.version)
    } else {
        None
    };
    let chart_version = request.chart.version.clone();
    let chart = format!(
        "{}-{}",
        request.chart.short_name(),
        chart_version.as_deref().unwrap_or("latest")
    );
    let summary = match revision {
        Some(r) => format!("release {release} revision {r} of {chart} in {ns}"),
        None => format!("{chart} applied to {ns} as {release}"),
    };

    let health = probe(ctx, &client, request).await?;
    Ok(Outcome::Installed {
        summary,
        chart_version,
        revision,
        health,
    })
}

/// Installs or upgrades (after repairing a stuck release), or renders and applies.
async fn act(
    ctx: &Ctx,
    client: &Client,
    request: &InstallRequest,
    kubeconfig: &str,
    action: &ReleaseAction,
    kube_version: &str,
) -> Result<(), Error> {
    let release = &request.release;
    let ns = &request.namespace;
    match request.method {
        ProvisioningMethod::HelmUpgradeInstall => {
            match action {
                ReleaseAction::RepairByUninstall => {
                    info!(
                        release,
                        "repairing a release stuck pending: uninstalling it first"
                    );
                    ctx.helm.uninstall(kubeconfig, release, ns).await?;
                }
                ReleaseAction::RepairByRollback => {
                    info!(
                        release,
                        "repairing a release stuck pending: rolling it back first"
                    );
                    ctx.helm.rollback(kubeconfig, release, ns).await?;
                }
                _ => {}
            }
            ctx.helm.upgrade_install(kubeconfig, request).await?;
            info!(release, hash = %request.hash, "release installed");
        }
        ProvisioningMethod::KubectlApply => {
            let rendered = render(ctx, request, kube_version).await?;
            let count = bounded(
                ctx.settings.install_timeout,
                "applying the rendered chart",
                downstream::apply_rendered(client, ns, release, &rendered.objects, &request.hash),
            )
            .await?;
            info!(release, objects = count, hash = %request.hash, "rendered chart applied");
        }
    }
    Ok(())
}

/// The CRD gate, then the pod probe.
async fn probe(ctx: &Ctx, client: &Client, request: &InstallRequest) -> Result<Health, Error> {
    let limit = ctx.settings.probe_timeout;
    let ns = &request.namespace;
    let rendered = if let Some(r) = cached_render(ctx, &request.hash) {
        r
    } else {
        let kube_version = bounded(
            limit,
            "reading the cluster version",
            downstream::kube_version(client),
        )
        .await?;
        render(ctx, request, &kube_version).await?
    };
    let states = bounded(
        limit,
        "the CRD gate",
        downstream::crd_states(client, &rendered.crds),
    )
    .await?;
    Ok(if let Some(problem) = health::crd_verdict(&states) {
        Health::CrdsNotReady(problem)
    } else {
        let selectors = pod_target(request).selectors;
        match bounded(
            limit,
            "the pod probe",
            downstream::probe_pods(client, ns, &selectors),
        )
        .await?
        {
            Some(problem) => Health::NotHealthy(problem),
            None => Health::Healthy,
        }
    })
}

/// The pods of a release, as the probe and the pod watch find them.
fn pod_target(request: &InstallRequest) -> pod_watch::Target {
    pod_watch::Target {
        namespace: request.namespace.clone(),
        selectors: health::selectors(
            &request.release,
            request.chart.short_name(),
            request.chart.version.as_deref(),
        ),
    }
}

fn cached_render(ctx: &Ctx, hash: &str) -> Option<Arc<Rendered>> {
    ctx.renders
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .get(hash)
        .cloned()
}

/// Renders the request (`helm template`), once per desired state.
async fn render(
    ctx: &Ctx,
    request: &InstallRequest,
    kube_version: &str,
) -> Result<Arc<Rendered>, Error> {
    if let Some(found) = cached_render(ctx, &request.hash) {
        return Ok(found);
    }
    let text = ctx.helm.template(request, kube_version).await?;
    let objects = manifests::parse(&text).map_err(Error::Render)?;
    let crds = manifests::crds(&objects);
    let rendered = Arc::new(Rendered { objects, crds });
    let mut cache = ctx
        .renders
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if cache.len() >= 256 {
        cache.clear();
    }
    cache.insert(request.hash.clone(), rendered.clone());
    Ok(rendered)
}

/// Removes what an Addon installed: the Helm release, or the applied objects.
async fn uninstall(
    ctx: &Ctx,
    kubeconfig: &str,
    release: &str,
    namespace: &str,
    method: ProvisioningMethod,
) -> Result<(), Error> {
    match method {
        ProvisioningMethod::HelmUpgradeInstall => {
            ctx.helm.uninstall(kubeconfig, release, namespace).await?;
        }
        ProvisioningMethod::KubectlApply => {
            let client = downstream::connect(kubeconfig, ctx.settings.probe_timeout).await?;
            bounded(
                ctx.settings.install_timeout,
                "deleting the applied objects",
                downstream::delete_applied(&client, namespace, release),
            )
            .await?;
        }
    }
    info!(release, namespace, "release uninstalled");
    Ok(())
}

/// Whether anything may be installed for this Addon (an install was attempted).
fn may_be_installed(addon: &Addon) -> bool {
    let Some(status) = addon.status.as_ref() else {
        return false;
    };
    status.chart_version.is_some()
        || conditions::get(&status.conditions, Cond::Installed).is_some_and(|c| {
            c.status == "True"
                || c.reason == Reason::InstallFailed.as_str()
                || c.reason == Reason::Forbidden.as_str()
        })
}

async fn disable(addon: &Addon, ctx: &Ctx, access: &Access) -> Result<Action, Error> {
    let target = resolve::target(addon).ok();
    if may_be_installed(addon)
        && let (Some((release, namespace, method)), Access::Ready { kubeconfig, .. }) =
            (&target, access)
    {
        if let Err(err) = uninstall(ctx, kubeconfig, release, namespace, *method).await {
            let outcome = failed(&err, "uninstalling the disabled release failed");
            write_status(addon, ctx, &outcome, None).await?;
            return Err(err);
        }
        ctx.events
            .normal(
                &addon.object_ref(&()),
                Reason::Disabled.as_str(),
                "Uninstall",
                format!("spec.enabled is false: release {release} uninstalled"),
            )
            .await;
    }
    let message = match &target {
        Some((release, namespace, _)) => {
            format!("spec.enabled is false: release {release} is not installed in {namespace}")
        }
        None => "spec.enabled is false".to_string(),
    };
    let mut disabled = addon.clone();
    if let Some(status) = disabled.status.as_mut() {
        status.chart_version = None;
        status.revision = None;
    }
    write_status(&disabled, ctx, &Outcome::Disabled(message), None).await?;
    Ok(Action::await_change())
}

/// Pure: the status while the release is uninstalled: `Deleting=True` with `reason` and
/// `message`, `Ready=False/Deleting` repeating the message.
pub fn deleting_status(addon: &Addon, reason: Reason, message: String, now: &Time) -> AddonStatus {
    let mut status = addon.status.clone().unwrap_or_default();
    conditions::set_deleting(
        &mut status.conditions,
        Cond::READY_GATES,
        reason,
        message,
        addon.metadata.generation,
        now,
    );
    status
}

/// The time by which uninstalling gives up: `deletionTimestamp + uninstall_deadline`.
pub fn uninstall_deadline(addon: &Addon, deadline: Duration) -> Option<Timestamp> {
    kontinuum_operator_common::finalizer::deadline(addon, deadline)
}

async fn cleanup(addon: &Addon, ctx: &Ctx) -> Result<Action, Error> {
    let name = addon.name_any();
    let reference = addon.object_ref(&());
    ctx.pods.unwatch(&ObjectRef::from_obj(addon));
    let access = access(addon, ctx).await?;
    let kubeconfig = match access {
        Access::NoCluster | Access::ClusterDeleting => {
            info!("the TalosCluster is gone or being deleted: not uninstalling");
            return Ok(Action::await_change());
        }
        Access::NoKubeconfig(why) => Err(why),
        Access::Ready { kubeconfig, .. } => Ok(kubeconfig),
    };
    if !may_be_installed(addon) {
        return Ok(Action::await_change());
    }
    let Ok((release, namespace, method)) = resolve::target(addon) else {
        return Ok(Action::await_change());
    };
    let deadline = uninstall_deadline(addon, ctx.settings.uninstall_deadline);
    if deadline.is_some_and(|d| Timestamp::now() > d) {
        warn!(addon = %name, "uninstall deadline passed: removing the finalizer without uninstalling");
        ctx.events
            .warning(
                &reference,
                Reason::UninstallFailed.as_str(),
                "Uninstall",
                format!("gave up uninstalling release {release} from {namespace}: deadline passed; the release may remain on the cluster"),
            )
            .await;
        return Ok(Action::await_change());
    }
    let until = deadline.map_or_else(String::new, |d| format!("; gives up at {d}"));
    let deleting =
        |reason: Reason, message: String| deleting_status(addon, reason, message, &now());
    let api: Api<Addon> =
        Api::namespaced(ctx.client.clone(), &addon.namespace().unwrap_or_default());
    let result = match kubeconfig {
        Err(why) => Err(Error::Waiting(why)),
        Ok(kubeconfig) => {
            // Announced once; a retry after a failure keeps `UninstallFailed` (rewriting the
            // status on every attempt would wake this Addon again at once, past its backoff).
            let announced = addon
                .status
                .as_ref()
                .is_some_and(|s| conditions::is_true(&s.conditions, Cond::Deleting));
            if !announced {
                let desired = deleting(
                    Reason::Deleting,
                    format!("uninstalling release {release} from {namespace}{until}"),
                );
                apply_status(&api, &name, FIELD_MANAGER, addon.status.as_ref(), &desired)
                    .await
                    .map_err(Error::PatchStatus)?;
            }
            uninstall(ctx, &kubeconfig, &release, &namespace, method).await
        }
    };
    match result {
        Ok(()) => {
            ctx.events
                .normal(
                    &reference,
                    Reason::Deleting.as_str(),
                    "Uninstall",
                    format!("release {release} uninstalled from {namespace}"),
                )
                .await;
            Ok(Action::await_change())
        }
        Err(err) => {
            let desired = match forbidden(&err) {
                Some(message) => deleting(Reason::Forbidden, format!("{message}{until}")),
                None => deleting(
                    Reason::UninstallFailed,
                    format!(
                        "uninstalling release {release} failed: {}{until}",
                        chain(&err)
                    ),
                ),
            };
            // Best effort: the Addon may already be gone.
            let _ = apply_status(&api, &name, FIELD_MANAGER, addon.status.as_ref(), &desired).await;
            Err(err)
        }
    }
}

/// Logs the failure, counts it, and backs off per Addon.
#[allow(
    clippy::needless_pass_by_value,
    reason = "the signature Controller::run requires"
)]
pub fn error_policy(addon: Arc<Addon>, err: &Error, ctx: Arc<Ctx>) -> Action {
    retry_after_backoff(&object_key(addon.as_ref()), err, &ctx.metrics, &ctx.backoff)
}

/// What of a TalosCluster its Addons' reconcile reads, as a hash: the object without its
/// resource version, managed fields and the status fields that only report progress
/// (conditions, observed generation, teardown). Deletion, labels, annotations, spec,
/// `secretRef`, `endpoint` and members (all visible to `$cel` values) change it; a condition
/// write does not, so a `$cel` expression over the cluster's conditions sees their new value
/// at the Addon's next reconcile, not at once.
pub fn cluster_trigger_key(cluster: &TalosCluster) -> u64 {
    use std::hash::{Hash as _, Hasher as _};
    let mut value = serde_json::to_value(cluster).unwrap_or(Value::Null);
    if let Some(meta) = value.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove("resourceVersion");
        meta.remove("managedFields");
    }
    if let Some(status) = value.get_mut("status").and_then(Value::as_object_mut) {
        status.remove("conditions");
        status.remove("observedGeneration");
        status.remove("teardown");
    }
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    value.to_string().hash(&mut hasher);
    hasher.finish()
}

/// The Addons of a cluster (namespace and name).
pub fn addons_of(
    namespace: Option<&str>,
    cluster: &str,
    addons: &[Arc<Addon>],
) -> Vec<ObjectRef<Addon>> {
    addons
        .iter()
        .filter(|a| {
            a.namespace().as_deref() == namespace && a.spec.talos_cluster_ref.name == cluster
        })
        .map(|a| ObjectRef::from_obj(a.as_ref()))
        .collect()
}

/// The Addons of the clusters whose kubeconfig is Secret `name` in `namespace`.
pub fn addons_of_secret(
    namespace: Option<&str>,
    name: &str,
    clusters: &[Arc<TalosCluster>],
    addons: &[Arc<Addon>],
) -> Vec<ObjectRef<Addon>> {
    clusters
        .iter()
        .filter(|c| c.namespace().as_deref() == namespace)
        .filter(|c| {
            c.status
                .as_ref()
                .and_then(|s| s.secret_ref.as_ref())
                .is_some_and(|r| r.name == name)
        })
        .flat_map(|c| addons_of(namespace, &c.name_any(), addons))
        .collect()
}

/// The Addons a change of `changed` may unblock: the other Addons of its cluster (or that
/// name it in `dependsOn`) that are not Ready.
pub fn siblings_waiting(changed: &Addon, addons: &[Arc<Addon>]) -> Vec<ObjectRef<Addon>> {
    addons
        .iter()
        .filter(|a| {
            a.namespace() == changed.namespace()
                && a.name_any() != changed.name_any()
                && (a.spec.talos_cluster_ref.name == changed.spec.talos_cluster_ref.name
                    || a.spec.depends_on.contains(&changed.name_any()))
        })
        .filter(|a| !is_ready(a))
        .map(|a| ObjectRef::from_obj(a.as_ref()))
        .collect()
}

fn is_ready(addon: &Addon) -> bool {
    addon
        .status
        .as_ref()
        .is_some_and(|s| conditions::is_true(&s.conditions, Cond::Ready))
}

/// Generation, whether deleting, finalizers.
type SpecKey = (Option<i64>, bool, Vec<String>);

/// Remembers each Addon's generation, deletion and finalizers, so that a change of its
/// status alone does not trigger a reconcile. Entries go with their Addons.
#[derive(Clone, Debug)]
pub struct SpecChanges(ChangeFilter<SpecKey>);

impl Default for SpecChanges {
    fn default() -> Self {
        Self(ChangeFilter::new("spec_changes"))
    }
}

impl SpecChanges {
    /// Whether anything but the status changed since `addon` was last seen.
    pub fn changed(&self, addon: &Addon) -> bool {
        self.0.changed(
            object_key(addon),
            (
                addon.metadata.generation,
                addon.metadata.deletion_timestamp.is_some(),
                addon.finalizers().to_vec(),
            ),
        )
    }

    /// The map behind the filter.
    pub fn map(&self) -> &ObjectMap<SpecKey> {
        self.0.map()
    }
}

/// Remembers whether each Addon was Ready, so that only a change of readiness (or of
/// priority or enablement, or a new Addon) wakes its siblings; every other change of an
/// Addon (its own status messages, a resync) does not. Entries go with their Addons.
#[derive(Clone, Debug)]
pub struct ReadinessTracker(ChangeFilter<(bool, i32, bool)>);

impl Default for ReadinessTracker {
    fn default() -> Self {
        Self(ChangeFilter::new("readiness"))
    }
}

impl ReadinessTracker {
    /// Whether `addon`'s readiness, priority or enablement differ from when last seen.
    pub fn changed(&self, addon: &Addon) -> bool {
        self.0.changed(
            object_key(addon),
            (
                is_ready(addon),
                resolve::priority(addon),
                addon.spec.enabled,
            ),
        )
    }

    /// The map behind the tracker.
    pub fn map(&self) -> &ObjectMap<(bool, i32, bool)> {
        self.0.map()
    }
}

/// The API of a namespaced kind, in `namespace` or all namespaces.
fn api<K>(client: &Client, namespace: Option<&str>) -> Api<K>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// The TalosClusters, cached, and the changes of them their Addons' reconcile reads (not
/// each of the bootstrapper's condition writes: see [`cluster_trigger_key`]).
fn cluster_events(
    client: &Client,
    namespace: Option<&str>,
    readiness: &Readiness,
    metrics: &ControllerMetrics,
) -> (
    Store<TalosCluster>,
    impl futures::Stream<Item = Result<TalosCluster, watcher::Error>> + use<>,
) {
    let (clusters, cluster_writer) = reflector::store();
    let cluster_changes = ChangeFilter::new("cluster_changes");
    let events = forget_gone(
        hub_watch(
            api::<TalosCluster>(client, namespace),
            watcher::Config::default(),
            readiness,
        )
        .reflect(cluster_writer),
        clusters.clone(),
        vec![Arc::new(cluster_changes.map().clone())],
        metrics,
    )
    .applied_objects()
    .filter(move |cluster| {
        std::future::ready(cluster.as_ref().map_or(true, |cluster| {
            cluster_changes.changed(object_key(cluster), cluster_trigger_key(cluster))
        }))
    });
    (clusters, events)
}

/// The metadata of the kubeconfig Secrets only: the secrets bundle, and every other Secret,
/// stay unseen.
fn kubeconfig_secret_events(
    client: &Client,
    namespace: Option<&str>,
    readiness: &Readiness,
) -> impl futures::Stream<Item = Result<PartialObjectMeta<Secret>, watcher::Error>> + use<> {
    hub_watch(
        api::<PartialObjectMeta<Secret>>(client, namespace),
        watcher::Config::default().labels(&format!(
            "{}={KUBECONFIG_SECRET_COMPONENT}",
            kontinuum_crds::labels::APP_COMPONENT
        )),
        readiness,
    )
    .applied_objects()
}

/// Runs the controller until `shutdown` triggers. `namespace` limits the watches.
#[allow(
    clippy::too_many_arguments,
    reason = "the runtime's parts, passed once from main"
)]
pub async fn run(
    client: Client,
    namespace: Option<&str>,
    settings: Settings,
    helm: Helm,
    metrics: Arc<ControllerMetrics>,
    events: Events,
    readiness: Readiness,
    shutdown: Shutdown,
) {
    let (addons, addon_writer) = reflector::store();
    // Per-Addon state, dropped with its Addon.
    let backoff = Backoff::default();
    let status_writes = StatusWrites::new("status_writes");
    let tracker = ReadinessTracker::default();
    let changes = SpecChanges::default();
    let (pod_trigger, pod_events) = tokio::sync::mpsc::unbounded_channel();
    let pods = pod_watch::PodWatches::new(pod_trigger, settings.probe_timeout);
    // One Addon watch: the controller's trigger and the siblings' are fed from it.
    let (addon_events, mut subscribers) = subscribe::share(
        forget_gone(
            hub_watch(
                api::<Addon>(&client, namespace),
                watcher::Config::default(),
                &readiness,
            )
            .reflect(addon_writer),
            addons.clone(),
            vec![
                Arc::new(backoff.clone()),
                Arc::new(status_writes.clone()),
                Arc::new(tracker.map().clone()),
                Arc::new(changes.map().clone()),
                Arc::new(pods.clone()),
            ],
            &metrics,
        ),
        &addons,
        2,
    );
    let (Some(sibling_trigger), Some(addon_trigger)) = (subscribers.pop(), subscribers.pop())
    else {
        return;
    };
    let addon_events = addon_events.for_each(|_| std::future::ready(()));

    let (clusters, cluster_events) = cluster_events(&client, namespace, &readiness, &metrics);
    let secret_events = kubeconfig_secret_events(&client, namespace, &readiness);

    let ctx = Arc::new(Ctx {
        client,
        addons: addons.clone(),
        clusters: clusters.clone(),
        helm,
        settings,
        metrics,
        events,
        backoff,
        status_writes,
        renders: Mutex::new(HashMap::new()),
        pods,
    });
    let by_cluster = addons.clone();
    let by_secret = addons.clone();
    let by_sibling = addons.clone();
    let secret_clusters = clusters.clone();
    // An Addon's own status writes do not wake it (its backoff and requeues decide when it
    // runs again); spec, deletion and finalizer changes do.
    let addon_trigger =
        addon_trigger.filter(move |addon| std::future::ready(changes.changed(addon)));
    let config = kube::runtime::controller::Config::default().concurrency(ctx.settings.concurrency);
    let controller = Controller::for_shared_stream(addon_trigger, addons)
        .with_config(config)
        .watches_shared_stream(sibling_trigger, move |addon: Arc<Addon>| {
            if tracker.changed(&addon) || addon.metadata.deletion_timestamp.is_some() {
                siblings_waiting(&addon, &by_sibling.state())
            } else {
                Vec::new()
            }
        })
        .watches_stream(cluster_events, move |cluster: TalosCluster| {
            addons_of(
                cluster.namespace().as_deref(),
                &cluster.name_any(),
                &by_cluster.state(),
            )
        })
        .watches_stream(secret_events, move |secret| {
            addons_of_secret(
                secret.namespace().as_deref(),
                &secret.name_any(),
                &secret_clusters.state(),
                &by_secret.state(),
            )
        })
        // A pod of an installed release changed health in its zone cluster.
        .reconcile_on(futures::stream::unfold(
            pod_events,
            |mut events| async move { events.recv().await.map(|addon| (addon, events)) },
        ))
        .graceful_shutdown_on(async move { shutdown.wait().await })
        .run(reconcile, error_policy, ctx);
    tokio::select! {
        () = kontinuum_operator_common::operator::drain(controller) => {}
        () = addon_events => {}
    }
}

#[cfg(test)]
mod tests;
