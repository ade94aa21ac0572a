//! The Zone controller: observe (stores, the hub identity Secret, the zone cluster's
//! identity), plan (pure: [`fanout`], [`identity`], [`status`], [`footprint::render`]), act
//! (server-side apply, only what differs), report (one status write, only when changed).

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kontinuum_crds::conditions::{self, ConditionStatus};
use kontinuum_crds::labels::ROTATE_IDENTITY;
use kontinuum_crds::names::NameError;
use kontinuum_crds::reasons::{ZoneCondition as Cond, ZoneReason as Reason};
use kontinuum_crds::v1alpha2::{
    Instance, InstancePool, KUBECONFIG_KEY, Kontinuum, TalosCluster, Zone, ZoneStatus,
};
use kontinuum_operator_common::admin::{Readiness, hub_watch};
use kontinuum_operator_common::backoff::{Backoff, object_key};
use kontinuum_operator_common::error::{
    FORBIDDEN, ReconcileError, chain, forbidden, retry_after_backoff,
};
use kontinuum_operator_common::events::Events;
use kontinuum_operator_common::finalizer;
use kontinuum_operator_common::kubeconfig::{self, KubeconfigError};
use kontinuum_operator_common::metrics::ControllerMetrics;
use kontinuum_operator_common::shutdown::Shutdown;
use kontinuum_operator_common::status::StatusWrites;
use kontinuum_operator_common::subscribe;
use kontinuum_operator_common::tracked::{ChangeFilter, ObjectMap, forget_gone};
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::core::PartialObjectMeta;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Api, Client, Resource as _, ResourceExt as _};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tracing::{info, instrument, warn};

use crate::config::Settings;
use crate::fanout::{self, Refusal};
use crate::footprint::{self, TeardownProgress};
use crate::identity::{self, Decision, HubTrust, Identity, IdentityError, IssueReason};
use crate::status::{self, Report, Verdict};
use crate::{CONTROLLER, FIELD_MANAGER, FINALIZER};

/// What a reconcile needs.
pub struct Ctx {
    /// Hub client.
    pub client: Client,
    /// Settings.
    pub settings: Settings,
    /// Every TalosCluster (a Zone's is found by name).
    pub clusters: Store<TalosCluster>,
    /// Every Instance (seed adoption and refusal).
    pub instances: Store<Instance>,
    /// Every Kontinuum (the registry).
    pub kontinuums: Store<Kontinuum>,
    /// Reconcile metrics.
    pub metrics: Arc<ControllerMetrics>,
    /// Event publisher.
    pub events: Events,
    /// Per-Zone backoff after failures.
    pub backoff: Backoff,
    /// The rotation request last handled per Zone (`namespace/name`): a reconcile that
    /// runs before the store shows the status that recorded it must not rotate again.
    pub rotations: ObjectMap<String>,
    /// The Zone statuses written, so a reconcile from a cache behind them neither writes
    /// one again nor announces its transitions twice.
    pub status_writes: StatusWrites,
}

/// What can go wrong in a reconcile. Each is reported in a condition too.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The Zone has no namespace or uid yet.
    #[error("the Zone has no {0} yet")]
    Incomplete(&'static str),
    /// A seed address or name is invalid.
    #[error("building the seed names")]
    Name(#[source] NameError),
    /// Server-side apply of a hub object failed.
    #[error("applying {kind} {name}")]
    Apply {
        /// The kind.
        kind: &'static str,
        /// The object.
        name: String,
        /// The cause.
        #[source]
        source: kube::Error,
    },
    /// Reading a hub object failed.
    #[error("reading {kind} {name}")]
    Read {
        /// The kind.
        kind: &'static str,
        /// The object.
        name: String,
        /// The cause.
        #[source]
        source: kube::Error,
    },
    /// Deleting the TalosCluster failed.
    #[error("deleting TalosCluster {name}")]
    DeleteCluster {
        /// The TalosCluster.
        name: String,
        /// The cause.
        #[source]
        source: kube::Error,
    },
    /// No client for the zone cluster.
    #[error("connecting to the zone cluster")]
    Connect(#[source] KubeconfigError),
    /// Reading the identity in the zone cluster failed.
    #[error(
        "reading Secret {}/{} in the zone cluster",
        footprint::NAMESPACE,
        footprint::IDENTITY_SECRET
    )]
    ReadIdentity(#[source] kube::Error),
    /// A call to the zone cluster did not finish in time.
    #[error("timed out after {after:?} {what}")]
    Timeout {
        /// What was being done.
        what: &'static str,
        /// The bound.
        after: Duration,
    },
    /// Issuing an identity failed.
    #[error("issuing the zone's identity")]
    Identity(#[source] IdentityError),
    /// The footprint failed in the zone cluster.
    #[error("zone footprint")]
    Footprint(#[source] footprint::Error),
    /// Writing the finalizer failed.
    #[error("updating the finalizer")]
    Finalizer(#[source] kube::Error),
    /// Writing the status failed.
    #[error("writing the Zone status")]
    PatchStatus(#[source] kube::Error),
}

impl ReconcileError for Error {
    fn reason(&self) -> &'static str {
        if forbidden(self).is_some() {
            return FORBIDDEN;
        }
        match self {
            Error::Incomplete(_) | Error::Name(_) | Error::Apply { .. } | Error::Read { .. } => {
                Reason::FanOutFailed.as_str()
            }
            Error::DeleteCluster { .. } => Reason::TalosClusterDeleteFailed.as_str(),
            Error::Connect(_) | Error::ReadIdentity(_) | Error::Timeout { .. } => {
                "DownstreamUnreachable"
            }
            Error::Identity(e) => e.reason(),
            Error::Footprint(e) => e.reason(),
            Error::Finalizer(_) => "FinalizerFailed",
            Error::PatchStatus(_) => "StatusPatchFailed",
        }
    }
}

/// The verdict of a failed step: `Forbidden` when the hub's or the zone cluster's RBAC
/// refused a call (retried with backoff like any transient failure, but shown as what a
/// human must fix), otherwise `reason` with the error chain.
fn failed(reason: Reason, err: &Error) -> Verdict {
    match forbidden(err) {
        Some(message) => Verdict::new(ConditionStatus::False, Reason::Forbidden, message),
        None => Verdict::new(ConditionStatus::False, reason, chain(err)),
    }
}

fn now() -> Timestamp {
    Timestamp::now()
}

/// Reconciles one Zone.
#[instrument(skip_all, fields(controller = CONTROLLER, zone = %zone.name_any()))]
pub async fn reconcile(zone: Arc<Zone>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let _timer = ctx.metrics.reconcile_timer();
    if !stores_ready(&ctx).await {
        return Ok(Action::requeue(ctx.settings.retry));
    }
    if zone.metadata.deletion_timestamp.is_some() {
        teardown(&zone, &ctx).await
    } else {
        apply(&zone, &ctx).await
    }
}

/// How long a reconcile waits for the stores' first full list.
const STORES_READY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// Whether every store has had its first full list. Decisions read the stores: a process
/// that had not yet seen every Instance would apply a second seed Instance for an address
/// whose Instance is claimed elsewhere, and rewrite what is already there.
async fn stores_ready(ctx: &Ctx) -> bool {
    tokio::time::timeout(STORES_READY_TIMEOUT, async {
        ctx.clusters.wait_until_ready().await.is_ok()
            && ctx.instances.wait_until_ready().await.is_ok()
            && ctx.kontinuums.wait_until_ready().await.is_ok()
    })
    .await
    .unwrap_or(false)
}

/// Logs the failure, counts it, and backs off per Zone.
#[allow(
    clippy::needless_pass_by_value,
    reason = "the signature Controller::run requires"
)]
pub fn error_policy(zone: Arc<Zone>, err: &Error, ctx: Arc<Ctx>) -> Action {
    retry_after_backoff(&object_key(zone.as_ref()), err, &ctx.metrics, &ctx.backoff)
}

fn zones_api(ctx: &Ctx, ns: &str) -> Api<Zone> {
    Api::namespaced(ctx.client.clone(), ns)
}

/// `<zone>.<region>.<domain>`: the endpoint of a zone with a domain (its own, else the
/// operator's).
pub fn endpoint(zone: &Zone, default_domain: Option<&str>) -> Option<String> {
    zone.spec
        .domain
        .as_deref()
        .or(default_domain)
        .filter(|d| !d.is_empty())
        .map(|d| {
            format!(
                "{}.{}.{}",
                zone.spec.zone,
                zone.spec.region,
                d.trim_end_matches('.')
            )
        })
}

/// The earliest of `hints` (instants) and `base` from `now`, at least one second away.
pub fn next_requeue(now: Timestamp, base: Duration, hints: &[Option<Timestamp>]) -> Duration {
    hints
        .iter()
        .flatten()
        .map(|t| Duration::try_from(t.duration_since(now)).unwrap_or(Duration::ZERO))
        .fold(base, Duration::min)
        .max(Duration::from_secs(1))
}

/// The apply path: fan-out, `ClusterReady`, identity and footprint, `RegistryJoined`.
async fn apply(zone: &Zone, ctx: &Ctx) -> Result<Action, Error> {
    let ns = zone.namespace().ok_or(Error::Incomplete("namespace"))?;
    let name = zone.name_any();
    finalizer::add(&zones_api(ctx, &ns), zone, FINALIZER)
        .await
        .map_err(Error::Finalizer)?;
    let started = now();
    let previous = zone.status.clone().unwrap_or_default();
    let host = endpoint(zone, ctx.settings.dns_domain.as_deref());
    let kontinuums = ctx.kontinuums.state();
    let refs: Vec<&Kontinuum> = kontinuums.iter().map(AsRef::as_ref).collect();
    let (registry_joined, joined_until) = status::registry_joined(
        &zone.spec.region,
        &zone.spec.zone,
        &refs,
        started,
        ctx.settings.registry_ttl,
    );
    let mut report = Report {
        cluster_ready: Verdict::not_evaluated("not evaluated yet"),
        installed: Verdict::not_evaluated("waiting for ClusterReady"),
        registry_joined,
        identity_thumbprint: previous.identity_thumbprint.clone(),
        identity_rotation: previous.identity_rotation.clone(),
        endpoint: host.clone(),
        complete: false,
    };
    let mut failure = None;
    let mut hints = vec![joined_until];
    let mut waiting = false;

    // Fan-out, then ClusterReady.
    match fan_out(zone, ctx).await {
        Ok(refused) => {
            let cluster = ctx
                .clusters
                .get(&ObjectRef::<TalosCluster>::new(&name).within(&ns));
            report.cluster_ready =
                status::cluster_ready(&name, cluster.as_deref(), refused.as_deref());
            if report.cluster_ready.is_true()
                && let Some(cluster) = cluster
            {
                match install(zone, &cluster, ctx, host.as_deref(), started).await {
                    Ok(done) => {
                        waiting = !done.verdict.is_true();
                        report.installed = done.verdict;
                        if let Some(t) = done.thumbprint {
                            report.identity_thumbprint = Some(t);
                        }
                        if let Some(r) = done.rotation {
                            report.identity_rotation = Some(r);
                        }
                        hints.push(done.overlap_until);
                        report.complete = true;
                    }
                    Err(err) => {
                        report.installed = failed(Reason::InstallFailed, &err);
                        failure = Some(err);
                    }
                }
            } else {
                report.complete = true;
            }
        }
        Err(err) => {
            report.cluster_ready = failed(Reason::FanOutFailed, &err);
            failure = Some(err);
        }
    }

    write_status(zone, ctx, &status::status(zone, &report, &Time(now()))).await?;
    if let Some(err) = failure {
        return Err(err);
    }
    ctx.backoff.reset(&object_key(zone));
    let base = if waiting {
        ctx.settings.retry
    } else {
        ctx.settings.resync
    };
    Ok(Action::requeue(next_requeue(now(), base, &hints)))
}

/// Writes `desired` if it differs, and announces the transitions.
async fn write_status(zone: &Zone, ctx: &Ctx, desired: &ZoneStatus) -> Result<(), Error> {
    let ns = zone.namespace().unwrap_or_default();
    let written = ctx
        .status_writes
        .apply(
            &zones_api(ctx, &ns),
            zone,
            FIELD_MANAGER,
            zone.status.as_ref(),
            desired,
        )
        .await
        .map_err(Error::PatchStatus)?;
    if written {
        let reference = zone.object_ref(&());
        for c in status::transitions(zone.status.as_ref(), desired) {
            let note = format!("{}={}: {}", c.type_, c.status, c.message);
            if status::is_failure(&c.reason) {
                ctx.events
                    .warning(&reference, &c.reason, "Reconcile", note)
                    .await;
            } else {
                ctx.events
                    .normal(&reference, &c.reason, "Reconcile", note)
                    .await;
            }
        }
    }
    Ok(())
}

/// Server-side applies `desired` unless `observed` already says all of it. Returns the
/// object (observed, or as applied).
async fn apply_if_changed<K>(
    api: &Api<K>,
    kind: &'static str,
    desired: &Value,
    observed: Option<K>,
) -> Result<K, Error>
where
    K: kube::Resource + Clone + DeserializeOwned + Serialize + std::fmt::Debug,
{
    let name = desired["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    if let Some(observed) = observed
        && serde_json::to_value(&observed).is_ok_and(|o| fanout::up_to_date(desired, &o))
    {
        return Ok(observed);
    }
    let applied = api
        .patch(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(desired),
        )
        .await
        .map_err(|source| Error::Apply {
            kind,
            name: name.clone(),
            source,
        })?;
    info!(kind, object = %name, "applied");
    Ok(applied)
}

/// The fan-out of `spec.seed`: TalosCluster, InstancePool, seed Instances. Returns the
/// refusal message when a seed Instance is claimed elsewhere. Nothing without a seed.
async fn fan_out(zone: &Zone, ctx: &Ctx) -> Result<Option<String>, Error> {
    if fanout::seed_addresses(zone).is_empty() {
        return Ok(None);
    }
    let ns = zone.namespace().ok_or(Error::Incomplete("namespace"))?;
    let name = zone.name_any();
    let owner = fanout::zone_owner(zone).ok_or(Error::Incomplete("uid"))?;
    let all = ctx.instances.state();
    let in_ns: Vec<&Instance> = all
        .iter()
        .map(AsRef::as_ref)
        .filter(|i| i.namespace().as_deref() == Some(ns.as_str()))
        .collect();
    let plan = fanout::plan_seed(zone, &in_ns).map_err(Error::Name)?;

    let clusters: Api<TalosCluster> = Api::namespaced(ctx.client.clone(), &ns);
    let observed = ctx
        .clusters
        .get(&ObjectRef::<TalosCluster>::new(&name).within(&ns))
        .map(|c| c.as_ref().clone());
    let cluster = apply_if_changed(
        &clusters,
        "TalosCluster",
        &fanout::talos_cluster(zone, &owner),
        observed,
    )
    .await?;
    let uid = cluster
        .meta()
        .uid
        .clone()
        .ok_or(Error::Incomplete("TalosCluster uid"))?;

    let pools: Api<InstancePool> = Api::namespaced(ctx.client.clone(), &ns);
    let observed = pools.get_opt(&name).await.map_err(|source| Error::Read {
        kind: "InstancePool",
        name: name.clone(),
        source,
    })?;
    let pool_owner = fanout::owner_reference("TalosCluster", &name, &uid);
    apply_if_changed(
        &pools,
        "InstancePool",
        &fanout::instance_pool(zone, &pool_owner),
        observed,
    )
    .await?;

    let instances: Api<Instance> = Api::namespaced(ctx.client.clone(), &ns);
    for desired in &plan.instances {
        let instance = desired["metadata"]["name"].as_str().unwrap_or_default();
        let observed = in_ns
            .iter()
            .find(|i| i.name_any() == instance)
            .map(|i| (*i).clone());
        apply_if_changed(&instances, "Instance", desired, observed).await?;
    }
    Ok((!plan.refused.is_empty()).then(|| {
        plan.refused
            .iter()
            .map(Refusal::message)
            .collect::<Vec<_>>()
            .join("; ")
    }))
}

/// What the install step found.
struct Installed {
    verdict: Verdict,
    thumbprint: Option<String>,
    rotation: Option<String>,
    overlap_until: Option<Timestamp>,
}

impl Installed {
    fn verdict(verdict: Verdict) -> Self {
        Self {
            verdict,
            thumbprint: None,
            rotation: None,
            overlap_until: None,
        }
    }
}

async fn bounded<T, E>(
    limit: Duration,
    what: &'static str,
    fut: impl Future<Output = Result<T, E>>,
    wrap: impl FnOnce(E) -> Error,
) -> Result<T, Error> {
    match tokio::time::timeout(limit, fut).await {
        Ok(result) => result.map_err(wrap),
        Err(_) => Err(Error::Timeout { what, after: limit }),
    }
}

/// The kubeconfig of a TalosCluster, from the Secret its status names; `Err(why)` when not
/// there yet.
async fn kubeconfig(cluster: &TalosCluster, ctx: &Ctx) -> Result<Result<String, String>, Error> {
    let ns = cluster.namespace().unwrap_or_default();
    let name = cluster.name_any();
    let Some(secret) = cluster
        .status
        .as_ref()
        .and_then(|s| s.secret_ref.as_ref())
        .map(|r| r.name.clone())
    else {
        return Ok(Err(format!(
            "TalosCluster {name} has no kubeconfig Secret yet"
        )));
    };
    let found = Api::<Secret>::namespaced(ctx.client.clone(), &ns)
        .get_opt(&secret)
        .await
        .map_err(|source| Error::Read {
            kind: "Secret",
            name: secret.clone(),
            source,
        })?;
    Ok(found
        .and_then(|s| s.data)
        .and_then(|d| d.get(KUBECONFIG_KEY).cloned())
        .and_then(|b| String::from_utf8(b.0).ok())
        .filter(|k| !k.trim().is_empty())
        .ok_or_else(|| {
            format!("Secret {secret} of TalosCluster {name} has no {KUBECONFIG_KEY:?} yet")
        }))
}

/// Reads the identity the zone cluster holds, if it holds a valid one.
async fn downstream_identity(client: &Client, limit: Duration) -> Result<Option<Identity>, Error> {
    let api: Api<Secret> = Api::namespaced(client.clone(), footprint::NAMESPACE);
    let secret = bounded(
        limit,
        "reading the zone's identity",
        api.get_opt(footprint::IDENTITY_SECRET),
        Error::ReadIdentity,
    )
    .await?;
    let data = secret.and_then(|s| s.data).unwrap_or_default();
    let text = |key: &str| {
        data.get(key)
            .and_then(|b| String::from_utf8(b.0.clone()).ok())
    };
    Ok(match (text(identity::CERT_KEY), text(identity::KEY_KEY)) {
        (Some(cert), Some(key)) => identity::from_downstream(&cert, &key),
        _ => None,
    })
}

/// What the hub lacks to install any zone agent: the store's endpoint, an auth mode to mirror.
fn unconfigured(settings: &Settings) -> Option<Verdict> {
    if settings.hub_grpc_endpoint.is_none() {
        return Some(Verdict::new(
            ConditionStatus::False,
            Reason::NoStorageSecretFound,
            "this hub has no KONTINUUM_SERVER_GRPC_ENDPOINT (--hub-grpc-endpoint) configured: a zone agent could not reach the hub's store",
        ));
    }
    settings.auth_missing.as_ref().map(|why| {
        Verdict::new(
            ConditionStatus::False,
            Reason::NoAuthMode,
            format!(
                "this hub has no auth mode to mirror into the zone, whose agent would refuse to start: {why} (chart: auth.oidc.issuerUrl or auth.insecureAllowAnonymous)"
            ),
        )
    })
}

/// Identity, then the footprint, in the zone cluster of a Ready TalosCluster.
async fn install(
    zone: &Zone,
    cluster: &TalosCluster,
    ctx: &Ctx,
    host: Option<&str>,
    started: Timestamp,
) -> Result<Installed, Error> {
    let ns = zone.namespace().ok_or(Error::Incomplete("namespace"))?;
    let name = zone.name_any();
    let settings = &ctx.settings;
    if let Some(verdict) = unconfigured(settings) {
        return Ok(Installed::verdict(verdict));
    }
    let kubeconfig = match kubeconfig(cluster, ctx).await? {
        Ok(k) => k,
        Err(why) => {
            return Ok(Installed::verdict(Verdict::new(
                ConditionStatus::False,
                Reason::DownstreamNotReady,
                why,
            )));
        }
    };

    // The hub's trust, and whether the zone was revoked.
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &ns);
    let hub_name = identity::secret_name(&name);
    let hub = secrets
        .get_opt(&hub_name)
        .await
        .map_err(|source| Error::Read {
            kind: "Secret",
            name: hub_name.clone(),
            source,
        })?;
    let previous = zone.status.clone().unwrap_or_default();
    let annotation = zone.annotations().get(ROTATE_IDENTITY).map(String::as_str);
    // A request already handled by this process (its status write may not be in the store
    // yet) is recorded again, but not acted on again.
    let pending = identity::rotation_requested(annotation, previous.identity_rotation.as_deref());
    let already = pending && annotation == handled_rotation(ctx, zone).as_deref();
    let mut facts = identity::Facts {
        hub_secret: hub.is_some(),
        downstream: true,
        recorded: previous.identity_thumbprint.is_some(),
        rotation_requested: pending && !already,
    };
    if identity::decide(facts) == Decision::Revoked {
        return Ok(Installed::verdict(Verdict::new(
            ConditionStatus::False,
            Reason::IdentityRevoked,
            format!(
                "the hub's identity Secret {hub_name} was deleted, which revokes this zone; to admit it again with a new identity, set the annotation {ROTATE_IDENTITY} on this Zone to a new value"
            ),
        )));
    }

    // The zone cluster's identity: keep it, or issue one (the hub trusts it first).
    let limit = settings.downstream_timeout;
    let client = kubeconfig::client(&kubeconfig, limit)
        .await
        .map_err(Error::Connect)?;
    let held = downstream_identity(&client, limit).await?;
    facts.downstream = held.is_some();
    let (current, overlap_until) =
        settle_identity(zone, ctx, &secrets, hub, held, facts, started).await?;
    let thumbprint = current.thumbprint();

    // The footprint, with the identity in use.
    let fp_zone = footprint::Zone {
        region: &zone.spec.region,
        zone: &zone.spec.zone,
        zone_name: &name,
        domain: zone
            .spec
            .domain
            .as_deref()
            .or(settings.dns_domain.as_deref()),
        identity_cert_pem: &current.cert_pem,
        identity_key_pem: current.key.expose(),
        identity_thumbprint: &thumbprint,
    };
    let objects = footprint::render(&fp_zone, &settings.footprint);
    let observed = footprint::apply(&client, &objects, limit)
        .await
        .map_err(Error::Footprint)?;
    let verdict = status::installed(&observed, host, &settings.footprint.gateway_class);
    Ok(Installed {
        verdict,
        thumbprint: Some(thumbprint),
        rotation: if pending {
            let value = annotation.map(str::to_owned);
            if let Some(value) = &value {
                ctx.rotations
                    .update(|m| m.insert(object_key(zone), value.clone()));
            }
            value
        } else {
            None
        },
        overlap_until,
    })
}

/// The rotation request this process last handled for `zone`, if any.
fn handled_rotation(ctx: &Ctx, zone: &Zone) -> Option<String> {
    ctx.rotations.update(|m| m.get(&object_key(zone)).cloned())
}

/// Keeps the zone cluster's identity or issues one, as [`identity::decide`] says, and
/// makes the hub Secret trust it (and, during an overlap window, the one it replaced).
/// Returns the identity to install and when the overlap window closes.
async fn settle_identity(
    zone: &Zone,
    ctx: &Ctx,
    secrets: &Api<Secret>,
    hub: Option<Secret>,
    held: Option<Identity>,
    facts: identity::Facts,
    started: Timestamp,
) -> Result<(Identity, Option<Timestamp>), Error> {
    let ns = zone.namespace().ok_or(Error::Incomplete("namespace"))?;
    let name = zone.name_any();
    let (current, replaced, issued) = match (identity::decide(facts), held) {
        (Decision::Keep, Some(held)) => (held, None, None),
        (Decision::Issue(reason), held) => {
            let new = identity::issue(&name).map_err(Error::Identity)?;
            let replaced = held
                .filter(|_| reason == IssueReason::Rotation)
                .map(|h| h.cert_der);
            (new, replaced, Some(reason))
        }
        // `decide` keeps only what is held, and the caller handled a revocation.
        (Decision::Keep | Decision::Revoked, _) => {
            let new = identity::issue(&name).map_err(Error::Identity)?;
            (new, None, Some(IssueReason::First))
        }
    };
    let observed_trust = hub.as_ref().map_or_else(
        || HubTrust {
            certificates: Vec::new(),
            overlap_until: None,
        },
        identity::read_hub,
    );
    let trust = identity::hub_trust(
        &current.cert_der,
        replaced.as_deref(),
        &observed_trust,
        started,
        ctx.settings.identity_overlap,
    );
    let owner = fanout::zone_owner(zone).ok_or(Error::Incomplete("uid"))?;
    let desired = identity::hub_secret(
        &name,
        &ns,
        &zone.spec.region,
        &zone.spec.zone,
        &owner,
        &trust,
    );
    apply_if_changed(secrets, "Secret", &desired, hub).await?;
    if let Some(reason) = issued {
        let thumbprint = current.thumbprint();
        let (event, note) = match reason {
            IssueReason::First => ("IdentityIssued", "issued the zone's identity"),
            IssueReason::Rotation => (
                "IdentityRotated",
                "rotated the zone's identity: both certificates are trusted during the overlap window",
            ),
            IssueReason::Readmission => (
                "IdentityIssued",
                "issued a new identity after the revocation: the zone is admitted again",
            ),
            IssueReason::LostKey => (
                "IdentityIssued",
                "the zone cluster had lost its identity key: issued a new one",
            ),
        };
        info!(thumbprint = %thumbprint, ?reason, "zone identity issued");
        ctx.events
            .normal(
                &zone.object_ref(&()),
                event,
                "Issue",
                format!("{note} (thumbprint {thumbprint})"),
            )
            .await;
    }
    Ok((current, trust.overlap_until))
}

/// The teardown path: the footprint in the zone cluster (reverse order), then the
/// TalosCluster, then the finalizer; at the deadline, the finalizer goes anyway.
async fn teardown(zone: &Zone, ctx: &Ctx) -> Result<Action, Error> {
    if !finalizer::has(zone, FINALIZER) {
        return Ok(Action::await_change());
    }
    let ns = zone.namespace().ok_or(Error::Incomplete("namespace"))?;
    let name = zone.name_any();
    let reference = zone.object_ref(&());
    let api = zones_api(ctx, &ns);
    let cluster = ctx
        .clusters
        .get(&ObjectRef::<TalosCluster>::new(&name).within(&ns));
    let deadline = status::teardown_deadline(zone, ctx.settings.teardown_timeout);
    let until = deadline.map_or_else(String::new, |d| {
        format!(
            "; the finalizer is removed anyway at {d} (remove it by hand to stop waiting sooner)"
        )
    });
    if deadline.is_some_and(|d| now() >= d) {
        return give_up(zone, ctx, cluster.as_deref()).await;
    }
    let deleting =
        |reason: Reason, message: String| status::deleting(zone, reason, message, &Time(now()));

    // 1. The footprint, unless the cluster is gone, going (its machines are wiped) or has no
    //    kubeconfig.
    let footprint = match remove_footprint(cluster.as_deref(), ctx).await {
        Ok(FootprintStep::Done(outcome)) => outcome,
        Ok(FootprintStep::Waiting(remaining)) => {
            let desired = deleting(
                Reason::Deleting,
                format!(
                    "removing the zone footprint: waiting for {}{until}",
                    remaining.join(", ")
                ),
            );
            write_status(zone, ctx, &desired).await?;
            return Ok(Action::requeue(Duration::from_secs(2)));
        }
        Err(err) => {
            let desired = deleting(
                Reason::DownstreamTeardownFailed,
                format!("removing the zone footprint failed: {}{until}", chain(&err)),
            );
            write_status(zone, ctx, &desired).await?;
            return Ok(retry_teardown(zone, ctx, &err, deadline));
        }
    };

    // 2. The TalosCluster, explicitly (its own finalizer resets the machines).
    if let Some(c) = &cluster
        && let Err(err) = delete_cluster(ctx, c).await
    {
        let desired = deleting(
            Reason::TalosClusterDeleteFailed,
            format!("{footprint}; {}{until}", chain(&err)),
        );
        write_status(zone, ctx, &desired).await?;
        return Ok(retry_teardown(zone, ctx, &err, deadline));
    }
    let cluster_step = if cluster.is_some() {
        format!("TalosCluster {name} deleted")
    } else {
        "no TalosCluster to delete".to_owned()
    };

    // 3. Done.
    ctx.events
        .normal(
            &reference,
            Reason::Deleting.as_str(),
            "Teardown",
            format!("teardown finished: {footprint}; {cluster_step}"),
        )
        .await;
    info!("teardown finished");
    ctx.backoff.reset(&object_key(zone));
    finalizer::remove(&api, zone, FINALIZER)
        .await
        .map_err(Error::Finalizer)?;
    Ok(Action::await_change())
}

/// A failed teardown step, already reported in `Deleting`: logged and counted like any
/// failure, retried after the Zone's backoff but no later than the deadline, so that the
/// give-up happens when the condition said it would.
fn retry_teardown(zone: &Zone, ctx: &Ctx, err: &Error, deadline: Option<Timestamp>) -> Action {
    warn!(
        reason = err.reason(),
        error = err as &dyn std::error::Error,
        "teardown step failed"
    );
    ctx.metrics.failure(err.reason());
    let wait = ctx.backoff.next(&object_key(zone));
    Action::requeue(next_requeue(now(), wait, &[deadline]))
}

/// The teardown deadline passed: the TalosCluster deletion is still issued (it needs no
/// zone cluster), then the finalizer goes, and an Event says what was left.
async fn give_up(zone: &Zone, ctx: &Ctx, cluster: Option<&TalosCluster>) -> Result<Action, Error> {
    let ns = zone.namespace().ok_or(Error::Incomplete("namespace"))?;
    let name = zone.name_any();
    let mut left = vec!["possibly the footprint in the zone cluster".to_owned()];
    if let Some(c) = cluster
        && let Err(err) = delete_cluster(ctx, c).await
    {
        left.push(format!("TalosCluster {name} ({})", chain(&err)));
    }
    warn!("teardown deadline passed: removing the finalizer");
    ctx.events
        .warning(
            &zone.object_ref(&()),
            Reason::TeardownDeadlineExceeded.as_str(),
            "Teardown",
            format!(
                "gave up tearing down at the deadline; left behind: {}",
                left.join(", ")
            ),
        )
        .await;
    ctx.backoff.reset(&object_key(zone));
    finalizer::remove(&zones_api(ctx, &ns), zone, FINALIZER)
        .await
        .map_err(Error::Finalizer)?;
    Ok(Action::await_change())
}

/// Deletes a TalosCluster unless it is already being deleted (or gone).
async fn delete_cluster(ctx: &Ctx, cluster: &TalosCluster) -> Result<(), Error> {
    if cluster.metadata.deletion_timestamp.is_some() {
        return Ok(());
    }
    let name = cluster.name_any();
    let api: Api<TalosCluster> =
        Api::namespaced(ctx.client.clone(), &cluster.namespace().unwrap_or_default());
    match api.delete(&name, &DeleteParams::background()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(source) => Err(Error::DeleteCluster { name, source }),
    }
}

/// Where removing the footprint stands.
enum FootprintStep {
    /// Finished or skipped; why.
    Done(String),
    /// These objects are still there.
    Waiting(Vec<String>),
}

async fn remove_footprint(
    cluster: Option<&TalosCluster>,
    ctx: &Ctx,
) -> Result<FootprintStep, Error> {
    let Some(cluster) = cluster else {
        return Ok(FootprintStep::Done(
            "no TalosCluster: nothing to remove downstream".to_owned(),
        ));
    };
    if cluster.metadata.deletion_timestamp.is_some() {
        return Ok(FootprintStep::Done(
            "the TalosCluster is being deleted: its machines are reset, footprint included"
                .to_owned(),
        ));
    }
    let Ok(kubeconfig) = kubeconfig(cluster, ctx).await? else {
        return Ok(FootprintStep::Done(
            "no kubeconfig: nothing was installed downstream".to_owned(),
        ));
    };
    let limit = ctx.settings.downstream_timeout;
    let client = kubeconfig::client(&kubeconfig, limit)
        .await
        .map_err(Error::Connect)?;
    Ok(
        match footprint::teardown(&client, limit)
            .await
            .map_err(Error::Footprint)?
        {
            TeardownProgress::Done => FootprintStep::Done("zone footprint removed".to_owned()),
            TeardownProgress::InProgress { remaining } => FootprintStep::Waiting(remaining),
        },
    )
}

/// Generation, whether deleting, finalizers, rotation annotation.
type SpecKey = (Option<i64>, bool, Vec<String>, Option<String>);

/// Remembers what of each Zone triggers a reconcile (generation, deletion, finalizers,
/// the rotation annotation), so that its own status writes do not. Entries go with their
/// Zones.
#[derive(Clone, Debug)]
pub struct SpecChanges(ChangeFilter<SpecKey>);

impl Default for SpecChanges {
    fn default() -> Self {
        Self(ChangeFilter::new("spec_changes"))
    }
}

impl SpecChanges {
    /// Whether anything but the status changed since `zone` was last seen.
    pub fn changed(&self, zone: &Zone) -> bool {
        self.0.changed(
            object_key(zone),
            (
                zone.metadata.generation,
                zone.metadata.deletion_timestamp.is_some(),
                zone.finalizers().to_vec(),
                zone.annotations().get(ROTATE_IDENTITY).cloned(),
            ),
        )
    }

    /// The map behind the filter.
    pub fn map(&self) -> &ObjectMap<SpecKey> {
        self.0.map()
    }
}

/// Pure: the Zones a Kontinuum's change may concern: those of its region and zone, in any
/// namespace, whose `RegistryJoined` is not True (a True one is requeued when its newest
/// heartbeat expires) — all of them when the Kontinuum is gone.
pub fn zones_of_kontinuum(
    kontinuum: &Kontinuum,
    gone: bool,
    zones: &[Arc<Zone>],
) -> Vec<ObjectRef<Zone>> {
    zones
        .iter()
        .filter(|z| {
            kontinuum.spec.region.as_deref() == Some(z.spec.region.as_str())
                && kontinuum.spec.zone.as_deref() == Some(z.spec.zone.as_str())
        })
        .filter(|z| {
            gone || !z
                .status
                .as_ref()
                .is_some_and(|s| conditions::is_true(&s.conditions, Cond::RegistryJoined))
        })
        .map(|z| ObjectRef::from_obj(z.as_ref()))
        .collect()
}

/// Pure: the Zones of an Instance's namespace that list one of its addresses as a seed
/// (adoption and refusal depend on it).
pub fn zones_of_instance(instance: &Instance, zones: &[Arc<Zone>]) -> Vec<ObjectRef<Zone>> {
    use kontinuum_crds::names::normalize_address;
    let addresses: Vec<String> = instance
        .spec
        .interfaces
        .iter()
        .filter_map(|a| normalize_address(a).ok())
        .collect();
    zones
        .iter()
        .filter(|z| z.namespace() == instance.namespace())
        .filter(|z| {
            fanout::seed_addresses(z)
                .iter()
                .filter_map(|a| normalize_address(a).ok())
                .any(|a| addresses.contains(&a))
        })
        .map(|z| ObjectRef::from_obj(z.as_ref()))
        .collect()
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

/// Runs the controller until `shutdown` triggers. `namespace` limits the watches (the
/// Kontinuum registry is watched in every namespace unless limited too).
#[allow(clippy::too_many_lines, reason = "one watch per trigger, wired once")]
pub async fn run(
    client: Client,
    namespace: Option<&str>,
    settings: Settings,
    metrics: Arc<ControllerMetrics>,
    events: Events,
    readiness: Readiness,
    shutdown: Shutdown,
) {
    let (zones, zone_writer) = reflector::store();
    // Per-Zone state, dropped with its Zone.
    let backoff = Backoff::default();
    let rotations = ObjectMap::new("rotations");
    let status_writes = StatusWrites::new("status_writes");
    let changes = SpecChanges::default();
    let (zone_events, mut subscribers) = subscribe::share(
        forget_gone(
            hub_watch(
                api::<Zone>(&client, namespace),
                watcher::Config::default(),
                &readiness,
            )
            .reflect(zone_writer),
            zones.clone(),
            vec![
                Arc::new(backoff.clone()),
                Arc::new(rotations.clone()),
                Arc::new(status_writes.clone()),
                Arc::new(changes.map().clone()),
            ],
            &metrics,
        ),
        &zones,
        1,
    );
    let Some(zone_trigger) = subscribers.pop() else {
        return;
    };
    let zone_events = zone_events.for_each(|_| std::future::ready(()));

    let (clusters, cluster_writer) = reflector::store();
    let cluster_events = hub_watch(
        api::<TalosCluster>(&client, namespace),
        watcher::Config::default(),
        &readiness,
    )
    .reflect(cluster_writer)
    .touched_objects();
    let (instances, instance_writer) = reflector::store();
    let instance_events = hub_watch(
        api::<Instance>(&client, namespace),
        watcher::Config::default(),
        &readiness,
    )
    .reflect(instance_writer)
    .touched_objects();
    let (kontinuums, kontinuum_writer) = reflector::store();
    let kontinuum_events = hub_watch(
        api::<Kontinuum>(&client, namespace),
        watcher::Config::default(),
        &readiness,
    )
    .reflect(kontinuum_writer)
    .touched_objects();
    let identity_events = hub_watch(
        api::<PartialObjectMeta<Secret>>(&client, namespace),
        watcher::Config::default().fields(&format!("type={}", identity::SECRET_TYPE)),
        &readiness,
    )
    .touched_objects();

    let ctx = Arc::new(Ctx {
        client,
        settings,
        clusters,
        instances,
        kontinuums: kontinuums.clone(),
        metrics,
        events,
        backoff,
        rotations,
        status_writes,
    });
    let zone_trigger = zone_trigger.filter(move |zone| std::future::ready(changes.changed(zone)));
    let by_instance = zones.clone();
    let by_kontinuum = zones.clone();
    let controller = Controller::for_shared_stream(zone_trigger, zones)
        .with_config(kube::runtime::controller::Config::default().concurrency(4))
        .watches_stream(cluster_events, |cluster: TalosCluster| {
            let name = cluster.name_any();
            let ns = cluster.namespace().unwrap_or_default();
            Some(ObjectRef::<Zone>::new(&name).within(&ns))
        })
        .watches_stream(instance_events, move |instance: Instance| {
            zones_of_instance(&instance, &by_instance.state())
        })
        .watches_stream(kontinuum_events, move |kontinuum: Kontinuum| {
            let gone = kontinuums.get(&ObjectRef::from_obj(&kontinuum)).is_none();
            zones_of_kontinuum(&kontinuum, gone, &by_kontinuum.state())
        })
        .watches_stream(identity_events, |secret| {
            let ns = secret.namespace().unwrap_or_default();
            fanout::zone_of_identity_secret(&secret)
                .map(|zone| ObjectRef::<Zone>::new(&zone).within(&ns))
        })
        .graceful_shutdown_on(async move { shutdown.wait().await })
        .run(reconcile, error_policy, ctx);
    tokio::select! {
        () = kontinuum_operator_common::operator::drain(controller) => {}
        () = zone_events => {}
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_403_is_forbidden_not_fan_out_failed() {
        let api = |code| {
            kube::Error::Api(
                kube::core::Status::failure(
                    "talosclusters.kontinuum.sh \"eu-west\" is forbidden: User \"u\" cannot \
                     patch resource \"talosclusters\" in API group \"kontinuum.sh\"",
                    "Forbidden",
                )
                .with_code(code)
                .boxed(),
            )
        };
        let refused = Error::Apply {
            kind: "TalosCluster",
            name: "eu-west".into(),
            source: api(403),
        };
        assert_eq!(refused.reason(), "Forbidden");
        let verdict = failed(Reason::FanOutFailed, &refused);
        assert_eq!(verdict.reason, Reason::Forbidden);
        assert_eq!(
            verdict.message,
            "forbidden: the operator may not patch talosclusters; its RBAC needs fixing"
        );
        let conflict = Error::Apply {
            kind: "TalosCluster",
            name: "eu-west".into(),
            source: api(409),
        };
        assert_eq!(conflict.reason(), "FanOutFailed");
        assert_eq!(
            failed(Reason::FanOutFailed, &conflict).reason,
            Reason::FanOutFailed
        );
    }

    fn zone(name: &str, ns: &str, seed: &[&str], joined: Option<&str>) -> Arc<Zone> {
        let (region, zone) = name.split_once('-').unwrap();
        let mut z: Zone = serde_json::from_value(json!({
            "apiVersion": "kontinuum.sh/v1alpha2", "kind": "Zone",
            "metadata": { "name": name, "namespace": ns, "generation": 1 },
            "spec": { "region": region, "zone": zone, "seed": { "talosAddresses": seed } },
        }))
        .unwrap();
        if let Some(status) = joined {
            z.status = Some(
                serde_json::from_value(json!({ "conditions": [{ "type": "RegistryJoined",
                    "status": status, "reason": "x", "message": "",
                    "lastTransitionTime": "2026-01-01T00:00:00Z" }] }))
                .unwrap(),
            );
        }
        Arc::new(z)
    }

    #[test]
    fn requeues_at_the_earliest_instant() {
        let now = Timestamp::from_second(1000).unwrap();
        let base = Duration::from_secs(300);
        assert_eq!(next_requeue(now, base, &[None]), base);
        let soon = Some(Timestamp::from_second(1042).unwrap());
        let later = Some(Timestamp::from_second(2000).unwrap());
        assert_eq!(
            next_requeue(now, base, &[later, soon, None]),
            Duration::from_secs(42)
        );
        let past = Some(Timestamp::from_second(10).unwrap());
        assert_eq!(next_requeue(now, base, &[past]), Duration::from_secs(1));
    }

    #[test]
    fn the_endpoint_uses_the_zone_domain_then_the_default() {
        let mut z = zone("eu-a", "ns", &[], None).as_ref().clone();
        assert_eq!(endpoint(&z, None), None);
        assert_eq!(
            endpoint(&z, Some("hub.example.com.")).as_deref(),
            Some("a.eu.hub.example.com")
        );
        z.spec.domain = Some("example.org".into());
        assert_eq!(
            endpoint(&z, Some("hub.example.com")).as_deref(),
            Some("a.eu.example.org")
        );
    }

    #[test]
    fn kontinuums_wake_the_zones_of_their_location_until_joined() {
        let zones = [
            zone("eu-a", "ns1", &[], None),
            zone("eu-a", "ns2", &[], Some("True")),
            zone("eu-b", "ns1", &[], None),
        ];
        let k: Kontinuum = serde_json::from_value(json!({
            "apiVersion": "kontinuum.sh/v1alpha2", "kind": "Kontinuum",
            "metadata": { "name": "agent" }, "spec": { "region": "eu", "zone": "a" },
        }))
        .unwrap();
        let woken = zones_of_kontinuum(&k, false, &zones);
        assert_eq!(woken, [ObjectRef::new("eu-a").within("ns1")]);
        assert_eq!(
            zones_of_kontinuum(&k, true, &zones).len(),
            2,
            "a deletion wakes all"
        );
    }

    #[test]
    fn instances_wake_the_zones_seeding_their_address() {
        let zones = [
            zone("eu-a", "ns", &["192.0.2.1"], None),
            zone("eu-b", "ns", &["192.0.2.2"], None),
            zone("eu-c", "other", &["192.0.2.1"], None),
        ];
        let i: Instance = serde_json::from_value(json!({
            "apiVersion": "kontinuum.sh/v1alpha2", "kind": "Instance",
            "metadata": { "name": "by-hand", "namespace": "ns" },
            "spec": { "interfaces": ["192.0.2.1"] },
        }))
        .unwrap();
        assert_eq!(
            zones_of_instance(&i, &zones),
            [ObjectRef::new("eu-a").within("ns")]
        );
    }

    #[test]
    fn status_writes_alone_do_not_trigger() {
        let changes = SpecChanges::default();
        let mut z = zone("eu-a", "ns", &[], None).as_ref().clone();
        assert!(changes.changed(&z));
        z.status = None;
        assert!(!changes.changed(&z), "a status change is not a change");
        z.metadata
            .annotations
            .get_or_insert_default()
            .insert(ROTATE_IDENTITY.into(), "1".into());
        assert!(changes.changed(&z), "a rotation request is");
        z.metadata.generation = Some(2);
        assert!(changes.changed(&z));
    }
}
