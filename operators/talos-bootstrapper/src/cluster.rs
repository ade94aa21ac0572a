//! The TalosCluster controller.
//!
//! * Reconciles: `TalosCluster`.
//! * Owns: its status; two Secrets in the cluster's namespace, split by who needs them:
//!   `taloscluster-<name>` (keys `secrets-bundle` and `talosconfig`, read by this operator
//!   alone; a controller ownerReference and this operator's finalizer, so a foreground
//!   deletion cannot take the bundle before the machines are reset) and
//!   `taloscluster-<name>-kubeconfig` (key `kubeconfig` only, named by `status.secretRef`:
//!   what the addon-installer and zone-installer read); the built-in Addons it seeds
//!   (created once each, never updated); the Instance conditions `Configured`, `Joined`
//!   and, on control planes, `Healthy` of its members (server-side applied, nothing else of
//!   the Instance's status: its `Ready` summary is instance-discovery's); the finalizer
//!   `kontinuum.sh/talos-bootstrapper`.
//! * Triggered by: TalosCluster changes; Instance changes (mapped to the cluster whose pool
//!   claims the Instance, or that configured it); Addon changes (mapped to
//!   `spec.talosClusterRef`); changes of its Secret.
//! * Never: regenerates a secrets bundle once stored, calls Bootstrap once `Bootstrapped` is
//!   True, or touches an Instance no pool of the cluster claims (except to reset and release
//!   one it configured itself).
//!
//! The flow: secrets bundle → configs applied in maintenance mode → Bootstrap → kubeconfig
//! → `gateway-api-crds` and `cilium` seeded → once Cilium is `Ready`, the Talos health check
//! → `ControlPlaneReady` → `cert-manager` seeded, workers configured → `Ready` when every
//! enabled Addon is `Ready`. Every gate is re-evaluated on every reconcile: nothing latches.

use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::sync::Arc;

use futures::StreamExt as _;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kontinuum_crds::conditions::{self, ConditionStatus};
use kontinuum_crds::labels;
use kontinuum_crds::reasons::{
    InstanceCondition as ICond, InstanceReason as IReason, TalosClusterCondition as Cond,
    TalosClusterReason as Reason,
};
use kontinuum_crds::v1alpha2::{
    Addon, AddonSpec, BuiltinAddon, ControlPlaneStatus, Instance, KUBECONFIG_KEY,
    KUBECONFIG_SECRET_COMPONENT, LocalRef, SECRETS_BUNDLE_KEY, SECRETS_SECRET_COMPONENT,
    TALOSCONFIG_KEY, TalosCluster, TalosClusterStatus, WorkerPoolStatus, kubeconfig_secret_name,
};
use kontinuum_operator_common::backoff::object_key;
use kontinuum_operator_common::error::{chain, forbidden, retry_after_backoff};
use kontinuum_operator_common::finalizer;
use kontinuum_operator_common::shutdown::Shutdown;
use kontinuum_operator_common::status::apply_status;
use kontinuum_talos::{ClientIdentity, ErrorKind};
use kontinuum_talos_config::{SecretsBundle, TalosVersion};
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Api, Resource as _, ResourceExt};
use tracing::{info, instrument, warn};

use crate::machines::{self, ClusterInput};
use crate::plan::{self, Member, Members, Role};
use crate::{Ctx, Error, FIELD_MANAGER, RESYNC};

/// Finalizer that resets the machines before the cluster goes away.
pub const FINALIZER: &str = kontinuum_crds::finalizers::TALOS_BOOTSTRAPPER;
pub use kontinuum_crds::v1alpha2::secrets_secret_name as secret_name;

fn now() -> Time {
    Time(Timestamp::now())
}

/// The conditions this operator writes on Instances.
const MEMBER_CONDITIONS: [ICond; 3] = [ICond::Configured, ICond::Joined, ICond::Healthy];

/// Reconciles one TalosCluster (through the finalizer).
#[instrument(skip_all, fields(controller = crate::CONTROLLER, cluster = %cluster.name_any()))]
pub async fn reconcile(cluster: Arc<TalosCluster>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let _timer = ctx.metrics.reconcile_timer();
    if !ctx.stores_ready().await {
        return Ok(Action::requeue(ctx.settings.retry));
    }
    let ns = cluster.namespace().unwrap_or_default();
    let api: Api<TalosCluster> = Api::namespaced(ctx.client.clone(), &ns);
    let name = cluster.name_any();
    // The status is the record of what was done (Bootstrapped, configured members): read
    // it fresh, never from a cache that may not have seen this controller's last write yet.
    let Some(cluster) = api
        .get_opt(&name)
        .await
        .map_err(Error::kube(format!("read TalosCluster {name}")))?
    else {
        return Ok(Action::await_change());
    };
    let cluster = Arc::new(cluster);
    if cluster.metadata.deletion_timestamp.is_some() {
        if !finalizer::has(cluster.as_ref(), FINALIZER) {
            return Ok(Action::await_change());
        }
        if let Some(wait) = crate::teardown::cleanup(&cluster, &ctx).await? {
            return Ok(wait);
        }
        finalizer::remove(&api, cluster.as_ref(), FINALIZER)
            .await
            .map_err(Error::kube(format!(
                "remove the finalizer of TalosCluster {name}"
            )))?;
        return Ok(Action::await_change());
    }
    // The finalizer first: nothing reaches a machine before teardown is guaranteed.
    if !finalizer::has(cluster.as_ref(), FINALIZER) {
        finalizer::add(&api, cluster.as_ref(), FINALIZER)
            .await
            .map_err(Error::kube(format!(
                "add the finalizer to TalosCluster {name}"
            )))?;
        return Ok(Action::await_change());
    }
    let result = apply(&cluster, &ctx).await;
    if let Err(err) = &result
        && let Some(message) = forbidden(err)
    {
        // Shown as an RBAC problem (a person must fix a Role), retried with the backoff.
        report_forbidden(&api, &cluster, &message).await;
    }
    result
}

/// `Ready=False/Forbidden` with `message`, best effort: the refused call may be this write.
async fn report_forbidden(api: &Api<TalosCluster>, cluster: &TalosCluster, message: &str) {
    let mut status = cluster.status.clone().unwrap_or_default();
    let ready = conditions::new(
        Cond::Ready,
        ConditionStatus::False,
        Reason::Forbidden,
        message,
        cluster.metadata.generation,
    );
    conditions::set(&mut status.conditions, ready, &now());
    let name = cluster.name_any();
    if let Err(err) =
        apply_status(api, &name, FIELD_MANAGER, cluster.status.as_ref(), &status).await
    {
        warn!(
            error = &err as &dyn std::error::Error,
            "could not report the RBAC refusal"
        );
    }
}

/// One reconcile's working state: the desired cluster status and member conditions,
/// written by [`Run::finish`] (and by [`Run::flush`] right after a step that must not be
/// repeated).
pub(crate) struct Run<'a> {
    pub(crate) cluster: &'a TalosCluster,
    pub(crate) ctx: &'a Ctx,
    api: Api<TalosCluster>,
    instances: Api<Instance>,
    written: Option<TalosClusterStatus>,
    pub(crate) status: TalosClusterStatus,
    members: BTreeMap<String, (Vec<Condition>, Vec<Condition>)>,
    now: Time,
}

impl<'a> Run<'a> {
    pub(crate) fn new(cluster: &'a TalosCluster, ctx: &'a Ctx) -> Self {
        let ns = cluster.namespace().unwrap_or_default();
        Self {
            cluster,
            ctx,
            api: Api::namespaced(ctx.client.clone(), &ns),
            instances: Api::namespaced(ctx.client.clone(), &ns),
            written: cluster.status.clone(),
            status: cluster.status.clone().unwrap_or_default(),
            members: BTreeMap::new(),
            now: now(),
        }
    }

    fn generation(&self) -> Option<i64> {
        self.cluster.metadata.generation
    }

    pub(crate) fn set(
        &mut self,
        c: Cond,
        s: ConditionStatus,
        reason: Reason,
        message: impl Into<String>,
    ) {
        let condition = conditions::new(c, s, reason, message, self.generation());
        conditions::set(&mut self.status.conditions, condition, &self.now);
    }

    fn is_true(&self, c: Cond) -> bool {
        conditions::is_true(&self.status.conditions, c)
    }

    fn namespace(&self) -> String {
        self.cluster.namespace().unwrap_or_default()
    }

    /// Sets what a decision of [`plan`] returned.
    fn apply_sets(&mut self, sets: impl IntoIterator<Item = plan::ClusterSet>) {
        for s in sets {
            self.set(s.condition, s.status, s.reason, s.message);
        }
    }

    /// Sets a member condition a decision of [`plan`] returned.
    fn apply_member(&mut self, name: &str, s: &plan::MemberSet) {
        self.set_member(name, s.condition, s.status, s.reason, &s.message);
    }

    /// Sets a condition on a member Instance (written by `flush`).
    fn set_member(&mut self, name: &str, c: ICond, s: ConditionStatus, reason: IReason, msg: &str) {
        if !self.members.contains_key(name) {
            let current = self.current_member_conditions(name);
            self.members
                .insert(name.to_owned(), (current.clone(), current));
        }
        let Some(entry) = self.members.get_mut(name) else {
            return;
        };
        let generation = None;
        conditions::set(
            &mut entry.1,
            conditions::new(c, s, reason, msg, generation),
            &self.now,
        );
    }

    fn current_member_conditions(&self, name: &str) -> Vec<Condition> {
        let ns = self.cluster.namespace().unwrap_or_default();
        self.ctx
            .instances
            .get(&ObjectRef::new(name).within(&ns))
            .and_then(|i| i.status.clone())
            .map(|s| own_conditions(&s.conditions))
            .unwrap_or_default()
    }

    /// Writes the cluster status and every changed member's conditions.
    pub(crate) async fn flush(&mut self) -> Result<(), Error> {
        // The cluster status first: it records what was done (Bootstrapped, configured
        // members); the member conditions only mirror it.
        let ready = plan::ready_condition(
            &self.status.conditions,
            self.cluster.metadata.deletion_timestamp.is_some(),
            self.generation(),
        );
        conditions::set(&mut self.status.conditions, ready, &self.now);
        let name = self.cluster.name_any();
        self.ctx
            .status_writes
            .apply(
                &self.api,
                self.cluster,
                FIELD_MANAGER,
                self.written.as_ref(),
                &self.status,
            )
            .await
            .map_err(Error::kube(format!(
                "patch the status of TalosCluster {name}"
            )))?;
        self.written = Some(self.status.clone());
        for (name, (current, desired)) in &mut self.members {
            if conditions::eq_ignoring_time(current, desired) {
                continue;
            }
            write_member_conditions(&self.instances, name, desired).await?;
            current.clone_from(desired);
        }
        Ok(())
    }

    /// Writes everything, publishes an Event for a `Ready` transition, and returns `action`.
    async fn finish(mut self, action: Action) -> Result<Action, Error> {
        let was_ready = self
            .cluster
            .status
            .as_ref()
            .map(|s| conditions::status(&s.conditions, Cond::Ready));
        self.flush().await?;
        let now_ready = conditions::get(&self.status.conditions, Cond::Ready).cloned();
        if let Some(ready) = now_ready
            && was_ready.is_some_and(|w| w.as_str() != ready.status)
        {
            let reference = self.cluster.object_ref(&());
            if ready.status == ConditionStatus::True.as_str() {
                self.ctx
                    .events
                    .normal(&reference, "Ready", "Reconcile", ready.message)
                    .await;
            } else if was_ready == Some(ConditionStatus::True) {
                self.ctx
                    .events
                    .warning(&reference, &ready.reason, "Reconcile", ready.message)
                    .await;
            }
        }
        self.ctx.backoff.reset(&object_key(self.cluster));
        Ok(action)
    }
}

pub(crate) fn own_conditions(all: &[Condition]) -> Vec<Condition> {
    all.iter()
        .filter(|c| MEMBER_CONDITIONS.iter().any(|t| t.as_str() == c.type_))
        .cloned()
        .collect()
}

/// Makes `desired` this operator's conditions on an Instance: server-side applied under
/// [`FIELD_MANAGER`] with only these entries, so a condition it no longer sends is removed
/// and no other owner's condition or field is touched (each condition type has one owner).
/// Entries an older release wrote by merge patch under the same manager are removed alike
/// (the e2e test `one_control_plane_to_ready_...` writes one and releases).
pub(crate) async fn write_member_conditions(
    api: &Api<Instance>,
    name: &str,
    desired: &[Condition],
) -> Result<(), Error> {
    // `conditions` is sent even when empty: the apply then removes every entry of ours.
    let patch = kontinuum_operator_common::status::status_patch::<Instance, _>(
        &serde_json::json!({ "conditions": desired }),
    );
    match api
        .patch_status(
            name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&patch),
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(source) => Err(Error::Kube {
            what: format!("apply the conditions of Instance {name}"),
            source,
        }),
    }
}

/// The cluster's secrets Secret, read.
enum SecretState {
    Ready {
        bundle: Box<SecretsBundle>,
        /// A kubeconfig stored beside the bundle by a release before the split: moved into
        /// the kubeconfig Secret, then removed from here.
        legacy_kubeconfig: Option<Vec<u8>>,
        has_talosconfig: bool,
    },
    /// Something says a bundle was used (a member was configured, `Bootstrapped`, a stored
    /// kubeconfig), and it is gone.
    Missing,
    /// A Secret of that name belongs to another (earlier) cluster.
    Stale { secret: String },
}

fn secret_labels(cluster: &TalosCluster, component: &str) -> BTreeMap<String, String> {
    let mut out: BTreeMap<String, String> = cluster
        .labels()
        .iter()
        .filter(|(k, _)| k.as_str() == labels::REGION || k.as_str() == labels::ZONE)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    out.insert(labels::APP_MANAGED_BY.into(), crate::CONTROLLER.into());
    out.insert(labels::APP_PART_OF.into(), labels::KONTINUUM.into());
    out.insert(labels::APP_COMPONENT.into(), component.into());
    out.insert(labels::APP_INSTANCE.into(), cluster.name_any());
    out
}

pub(crate) fn owned_by(
    object: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    uid: Option<&str>,
) -> bool {
    object
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.controller == Some(true) && Some(o.uid.as_str()) == uid)
}

async fn ensure_secret(
    run: &mut Run<'_>,
    secrets: &Api<Secret>,
    version: &TalosVersion,
) -> Result<SecretState, Error> {
    let cluster = run.cluster;
    let name = secret_name(&cluster.name_any());
    let uid = cluster.uid();
    let existing = secrets
        .get_opt(&name)
        .await
        .map_err(Error::kube(format!("read Secret {name}")))?;
    let secret = match existing {
        Some(secret) if !owned_by(&secret.metadata, uid.as_deref()) => {
            return Ok(SecretState::Stale { secret: name });
        }
        Some(secret) => secret,
        None => {
            // A bundle is never regenerated once anything used it: a machine that was sent
            // a config trusts its CAs.
            let recorded = cluster
                .status
                .as_ref()
                .is_some_and(|s| s.secret_ref.is_some())
                || !run.status.configured_instances.is_empty()
                || run.is_true(Cond::Bootstrapped);
            if recorded {
                return Ok(SecretState::Missing);
            }
            let bundle =
                machines::generate_bundle(version.clone(), run.ctx.settings.rsa_bits).await?;
            let json = bundle.to_json().map_err(Error::Secrets)?;
            let secret = Secret {
                metadata: kube::api::ObjectMeta {
                    name: Some(name.clone()),
                    namespace: cluster.namespace(),
                    labels: Some(secret_labels(cluster, SECRETS_SECRET_COMPONENT)),
                    owner_references: cluster.controller_owner_ref(&()).map(|o| vec![o]),
                    finalizers: Some(vec![FINALIZER.to_owned()]),
                    ..kube::api::ObjectMeta::default()
                },
                type_: Some("Opaque".into()),
                data: Some(BTreeMap::from([(
                    SECRETS_BUNDLE_KEY.to_owned(),
                    ByteString(json.expose().as_bytes().to_vec()),
                )])),
                ..Secret::default()
            };
            if create_once(run, secrets, &secret, "SecretsBundleCreated", || {
                format!("generated the talos secrets bundle into Secret {name}")
            })
            .await?
            {
                secret
            } else {
                // An earlier attempt won (its status write was lost): use its bundle, never
                // a second one.
                secrets
                    .get(&name)
                    .await
                    .map_err(Error::kube(format!("read Secret {name}")))?
            }
        }
    };
    if !owned_by(&secret.metadata, uid.as_deref()) {
        return Ok(SecretState::Stale { secret: name });
    }
    let data = secret.data.unwrap_or_default();
    let bundle = data
        .get(SECRETS_BUNDLE_KEY)
        .ok_or_else(|| Error::BadSecret {
            secret: name.clone(),
        })
        .and_then(|b| SecretsBundle::from_json(&b.0).map_err(Error::Secrets))?;
    Ok(SecretState::Ready {
        bundle: Box::new(bundle),
        legacy_kubeconfig: data.get(KUBECONFIG_KEY).map(|k| k.0.clone()),
        has_talosconfig: data.contains_key(TALOSCONFIG_KEY),
    })
}

/// The cluster's kubeconfig Secret, read.
enum KubeconfigState {
    Stored,
    Absent,
    /// A Secret of that name belongs to another (earlier) cluster.
    Stale,
}

async fn read_kubeconfig(
    cluster: &TalosCluster,
    secrets: &Api<Secret>,
) -> Result<KubeconfigState, Error> {
    let name = kubeconfig_secret_name(&cluster.name_any());
    let Some(secret) = secrets
        .get_opt(&name)
        .await
        .map_err(Error::kube(format!("read Secret {name}")))?
    else {
        return Ok(KubeconfigState::Absent);
    };
    if !owned_by(&secret.metadata, cluster.uid().as_deref()) {
        return Ok(KubeconfigState::Stale);
    }
    Ok(secret
        .data
        .as_ref()
        .and_then(|d| d.get(KUBECONFIG_KEY))
        .map_or(KubeconfigState::Absent, |_| KubeconfigState::Stored))
}

/// Creates (or repairs) the kubeconfig Secret: the kubeconfig alone, owned by the cluster.
async fn store_kubeconfig(
    cluster: &TalosCluster,
    secrets: &Api<Secret>,
    kubeconfig: &[u8],
) -> Result<(), Error> {
    let name = kubeconfig_secret_name(&cluster.name_any());
    let secret = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": name,
            "namespace": cluster.namespace(),
            "labels": secret_labels(cluster, KUBECONFIG_SECRET_COMPONENT),
            "ownerReferences": cluster.controller_owner_ref(&()).map(|o| vec![o]),
        },
        "type": "Opaque",
        "data": { KUBECONFIG_KEY: ByteString(kubeconfig.to_vec()) },
    });
    secrets
        .patch(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&secret),
        )
        .await
        .map_err(Error::kube(format!(
            "store the kubeconfig in Secret {name}"
        )))?;
    Ok(())
}

/// Completes the secrets Secret once the kubeconfig has its own: an admin talosconfig for
/// the control-plane members (written once), and no legacy kubeconfig copy.
async fn finish_secrets_secret(
    cluster: &TalosCluster,
    secrets: &Api<Secret>,
    bundle: &SecretsBundle,
    control_plane: &[&Member],
    has_talosconfig: bool,
    has_legacy_kubeconfig: bool,
) -> Result<(), Error> {
    if has_talosconfig && !has_legacy_kubeconfig {
        return Ok(());
    }
    let name = secret_name(&cluster.name_any());
    let mut data = serde_json::Map::new();
    if !has_talosconfig {
        let addresses: Vec<String> = control_plane
            .iter()
            .filter_map(|m| m.address.clone())
            .collect();
        let talosconfig = kontinuum_talos_config::admin_talosconfig(
            bundle,
            &cluster.name_any(),
            &addresses,
            &addresses,
            Timestamp::now(),
            &mut rand_core::OsRng,
        )
        .map_err(Error::Secrets)?;
        data.insert(
            TALOSCONFIG_KEY.into(),
            serde_json::to_value(ByteString(
                talosconfig.talosconfig.expose().as_bytes().to_vec(),
            ))
            .unwrap_or_default(),
        );
    }
    if has_legacy_kubeconfig {
        data.insert(KUBECONFIG_KEY.into(), serde_json::Value::Null);
    }
    let patch = serde_json::json!({ "data": data });
    secrets
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(Error::kube(format!("complete Secret {name}")))?;
    Ok(())
}

fn requested_version(cluster: &TalosCluster) -> &str {
    cluster
        .spec
        .talos
        .as_ref()
        .and_then(|t| t.version.as_deref())
        .unwrap_or(plan::DEFAULT_TALOS_VERSION)
}

fn kubernetes_version(cluster: &TalosCluster) -> String {
    let v = cluster
        .spec
        .kubernetes
        .as_ref()
        .and_then(|k| k.version.as_deref())
        .unwrap_or(plan::DEFAULT_KUBERNETES_VERSION);
    v.strip_prefix('v').unwrap_or(v).to_owned()
}

/// A step's outcome: go on with its result, or end the reconcile with this `Action` (the
/// status written by [`Run::finish`]).
type Step<T> = ControlFlow<Action, T>;

/// What one reconcile read from the caches: the members and the cluster's Addons.
struct World {
    members: Members,
    addons: Vec<Arc<Addon>>,
}

impl World {
    fn usable_control_plane(&self) -> Vec<&Member> {
        self.members
            .control_plane
            .iter()
            .filter(|m| m.usable())
            .collect()
    }

    fn usable_workers(&self) -> Vec<Member> {
        self.members
            .workers
            .iter()
            .flat_map(|(_, ms)| ms.iter().cloned())
            .filter(Member::usable)
            .collect()
    }
}

/// What every Talos step needs: the endpoint member, the config input, the bundle and the
/// cluster's admin identity.
struct Target {
    endpoint: Member,
    input: ClusterInput,
    bundle: Box<SecretsBundle>,
    identity: ClientIdentity,
}

/// The secrets Secret as the later steps use it.
struct StoredSecrets {
    bundle: Box<SecretsBundle>,
    legacy_kubeconfig: Option<Vec<u8>>,
    has_talosconfig: bool,
}

async fn apply(cluster: &TalosCluster, ctx: &Ctx) -> Result<Action, Error> {
    let mut run = Run::new(cluster, ctx);
    run.status.teardown.clear();
    conditions::remove(&mut run.status.conditions, Cond::Deleting);
    let version = match plan::talos_version(requested_version(cluster)) {
        Ok(v) => v,
        Err(unsupported) => {
            run.apply_sets([unsupported]);
            return run.finish(Action::await_change()).await;
        }
    };
    let world = observe(&mut run);
    let secrets = match secrets_bundle(&mut run, &version).await? {
        ControlFlow::Continue(s) => s,
        ControlFlow::Break(action) => return run.finish(action).await,
    };
    let Some(endpoint) = endpoint(&mut run, &world) else {
        return run.finish(Action::requeue(RESYNC)).await;
    };
    let target = Target {
        input: ClusterInput {
            name: cluster.name_any(),
            endpoint_host: configured_endpoint(cluster).map_or_else(
                || endpoint.address.clone().unwrap_or_default(),
                str::to_owned,
            ),
            talos_version: version,
            kubernetes_version: kubernetes_version(cluster),
            patches: plan::Patches::of(cluster),
        },
        identity: machines::admin_identity(&secrets.bundle, &cluster.name_any())?,
        endpoint,
        bundle: secrets.bundle.clone(),
    };
    let mut pending = match configure_control_plane(&mut run, &world, &target).await? {
        ControlFlow::Continue(all) => !all,
        ControlFlow::Break(action) => return run.finish(action).await,
    };
    if let ControlFlow::Break(action) = bootstrap_once(&mut run, &target).await? {
        return run.finish(action).await;
    }
    if let ControlFlow::Break(action) = kubeconfig(&mut run, &world, &target, &secrets).await? {
        return run.finish(action).await;
    }
    // Addons before health: nothing, CoreDNS included, runs before Cilium does.
    let view = plan::addons_view(
        cluster,
        &world.addons,
        true,
        run.is_true(Cond::ControlPlaneReady),
    );
    seed(&run, &view.to_seed).await?;
    // Released machines go first: the health check expects exactly the members' Nodes.
    pending |= !reset_released(&mut run, &world.members, &target).await;
    let mut action = control_plane_health(&mut run, &world, &target, &view).await;
    pending |= !workers(&mut run, &world, &target).await?;
    let roll = crate::reconfigure::step(
        &mut run,
        &world.members,
        &target.input,
        &target.bundle,
        &target.identity,
    )
    .await;
    if let Some(soon) = roll {
        action = Action::requeue(soon);
    }
    let cp_ready = run.is_true(Cond::ControlPlaneReady);
    set_addons(&mut run, &world.addons, cp_ready);
    if pending {
        action = Action::requeue(ctx.settings.retry);
    }
    run.status.observed_generation = cluster.metadata.generation;
    run.finish(action).await
}

/// `spec.controlPlane.endpoint`'s host or shared IP, when set.
fn configured_endpoint(cluster: &TalosCluster) -> Option<&str> {
    cluster.spec.control_plane.endpoint.as_ref()?.address()
}

/// Reads the members and Addons, and records what follows from them alone: replica counts
/// and every member found configured (also one whose status write was lost).
fn observe(run: &mut Run<'_>) -> World {
    let world = World {
        members: plan::members(run.cluster, &run.ctx.instances.state()),
        addons: run.ctx.addons.state(),
    };
    let ready_replicas = run
        .status
        .control_plane
        .as_ref()
        .map_or(0, |c| c.ready_replicas);
    run.status.control_plane = Some(ControlPlaneStatus {
        replicas: count(world.usable_control_plane().len()),
        ready_replicas,
    });
    for member in world.members.teardown_order() {
        if member.configured && !run.status.configured_instances.contains(&member.name) {
            run.status.configured_instances.push(member.name.clone());
        }
    }
    run.status.configured_instances.sort();
    run.status.workers = world
        .members
        .workers
        .iter()
        .map(|(pool, ms)| WorkerPoolStatus {
            name: pool.clone(),
            replicas: count(ms.iter().filter(|m| m.usable()).count()),
            joined_replicas: count(ms.iter().filter(|m| m.joined).count()),
        })
        .collect();
    world
}

fn count(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// The secrets bundle: created once, never regenerated.
async fn secrets_bundle(
    run: &mut Run<'_>,
    version: &TalosVersion,
) -> Result<Step<StoredSecrets>, Error> {
    let secrets: Api<Secret> = Api::namespaced(run.ctx.client.clone(), &run.namespace());
    let state = ensure_secret(run, &secrets, version).await?;
    let bootstrapped = run.is_true(Cond::Bootstrapped);
    let reported = conditions::get(&run.status.conditions, Cond::KubeconfigAvailable)
        .map(|c| c.reason.clone());
    let outcome = match state {
        SecretState::Ready {
            bundle,
            legacy_kubeconfig,
            has_talosconfig,
        } => {
            return Ok(ControlFlow::Continue(StoredSecrets {
                bundle,
                legacy_kubeconfig,
                has_talosconfig,
            }));
        }
        SecretState::Missing => {
            plan::secret_missing(&secret_name(&run.cluster.name_any()), bootstrapped)
        }
        SecretState::Stale { secret } => plan::secret_stale(&secret),
    };
    // One Event when a missing bundle is first noticed, not one per reconcile.
    if outcome
        .sets
        .iter()
        .any(|s| s.reason == Reason::SecretsBundleMissing)
        && reported.as_deref() != Some(Reason::SecretsBundleMissing.as_str())
        && let Some(set) = outcome.sets.first()
    {
        let reference = run.cluster.object_ref(&());
        run.ctx
            .events
            .warning(
                &reference,
                set.reason.as_str(),
                "Reconcile",
                set.message.clone(),
            )
            .await;
    }
    run.apply_sets(outcome.sets);
    let wait = match outcome.wait {
        plan::Wait::Resync => RESYNC,
        plan::Wait::Retry => run.ctx.settings.retry,
    };
    Ok(ControlFlow::Break(Action::requeue(wait)))
}

/// The endpoint member (sticky, see [`plan::endpoint_member`]), recorded in
/// `status.endpoint`; `None` (conditions set) while no control-plane machine is usable.
fn endpoint(run: &mut Run<'_>, world: &World) -> Option<Member> {
    let current = run
        .status
        .endpoint
        .as_deref()
        .and_then(plan::endpoint_host)
        .map(str::to_owned);
    let Some(endpoint) =
        plan::endpoint_member(&world.members.control_plane, current.as_deref()).cloned()
    else {
        let sets = plan::no_control_plane(&run.status.conditions);
        run.apply_sets(sets);
        set_addons(run, &world.addons, false);
        return None;
    };
    let configured = configured_endpoint(run.cluster);
    let host = configured.unwrap_or_else(|| endpoint.address.as_deref().unwrap_or_default());
    run.status.endpoint = Some(plan::endpoint_url(host));
    let control_planes = world.usable_control_plane().len();
    run.apply_sets([plan::endpoint_shared(
        configured,
        control_planes,
        &endpoint.name,
    )]);
    Some(endpoint)
}

/// Configures the unconfigured control-plane members. The endpoint must succeed (its
/// failure ends the reconcile); the others are retried. Continues with whether all were.
async fn configure_control_plane(
    run: &mut Run<'_>,
    world: &World,
    target: &Target,
) -> Result<Step<bool>, Error> {
    let mut all = true;
    let pending: Vec<&Member> = world
        .usable_control_plane()
        .into_iter()
        .filter(|m| !m.configured)
        .collect();
    // Every outcome is recorded before the endpoint's failure, if any, decides the pass.
    let mut endpoint_failed = None;
    for (member, sent) in send_configs(run.ctx, target, &pending).await {
        let Err(err) = record_config(run, member, sent).await else {
            continue;
        };
        if member.name == target.endpoint.name {
            endpoint_failed = Some((member, err));
        } else {
            warn!(instance = %member.name, error = &err as &dyn std::error::Error, "configuring a control-plane member failed; retrying");
            all = false;
        }
    }
    if !pending.is_empty() {
        // Progress as it happens: what was configured is on record before Bootstrap.
        run.flush().await?;
    }
    if let Some((member, err)) = endpoint_failed {
        let failed = plan::endpoint_config_failed(
            identity_refused(&err),
            config_refused(&err),
            &chain(&err),
            &run.status.conditions,
        );
        let announce =
            failed.announce(run.cluster.status.as_ref().map(|s| s.conditions.as_slice()));
        run.apply_sets(failed.sets.clone());
        if !failed.wait_for_change {
            run.flush().await?;
            return Err(err);
        }
        // The same config fails the same way: report it and wait for a change of the
        // cluster or its Instances (both watched) instead of retrying.
        warn!(instance = %member.name, error = &err as &dyn std::error::Error, "the endpoint's machine config is refused; waiting for a change");
        if let Some(set) = announce {
            let reference = run.cluster.object_ref(&());
            run.ctx
                .events
                .warning(&reference, set.reason.as_str(), "Configure", set.message)
                .await;
        }
        return Ok(ControlFlow::Break(Action::await_change()));
    }
    Ok(ControlFlow::Continue(all))
}

/// Bootstrap, exactly once: the intent is recorded before the call; finding it means an
/// earlier call may have gone out, so the cluster's API server is asked first, and only
/// after `--bootstrap-grace-seconds` of silence is Bootstrap called again (`AlreadyExists`
/// is success). See [`plan::bootstrap_step`].
async fn bootstrap_once(run: &mut Run<'_>, target: &Target) -> Result<Step<()>, Error> {
    let ctx = run.ctx;
    let endpoint = &target.endpoint;
    match plan::bootstrap_step(&run.status.conditions) {
        plan::BootstrapStep::Done => return Ok(ControlFlow::Continue(())),
        plan::BootstrapStep::Call => {}
        plan::BootstrapStep::Probe { since } => {
            let answer = crate::downstream::api_server_answers(ctx, endpoint, &target.identity)
                .await
                .map_err(|e| chain(&e));
            let grace = ctx.settings.bootstrap_grace;
            match plan::after_probe(since, Timestamp::now(), grace, &endpoint.name, answer) {
                plan::AfterProbe::Bootstrapped => {
                    let how = "the API server answers after an earlier Bootstrap call";
                    bootstrapped(run, endpoint, how).await?;
                    return Ok(ControlFlow::Continue(()));
                }
                plan::AfterProbe::Wait { message } => {
                    run.apply_sets(plan::bootstrap_pending(message));
                    return Ok(ControlFlow::Break(Action::requeue(ctx.settings.retry)));
                }
                plan::AfterProbe::CallAgain => {}
            }
        }
    }
    run.apply_sets([plan::bootstrap_intent(&endpoint.name)]);
    run.flush().await?;
    let outcome = ctx.machines.bootstrap(endpoint, &target.identity).await;
    match outcome {
        Ok(outcome) => {
            info!(instance = %endpoint.name, ?outcome, "etcd bootstrapped");
            bootstrapped(run, endpoint, "etcd bootstrapped").await?;
            Ok(ControlFlow::Continue(()))
        }
        Err(err) => {
            let unknown = matches!(&err, Error::Talos { source, .. } if source.outcome_unknown());
            run.apply_sets([plan::bootstrap_failed(unknown, &chain(&err))]);
            run.flush().await?;
            Err(err)
        }
    }
}

/// The kubeconfig, into a Secret of its own (the one `status.secretRef` names), then the
/// secrets Secret completed.
async fn kubeconfig(
    run: &mut Run<'_>,
    world: &World,
    target: &Target,
    secrets: &StoredSecrets,
) -> Result<Step<()>, Error> {
    let ctx = run.ctx;
    let cluster = run.cluster;
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), &run.namespace());
    let name = kubeconfig_secret_name(&cluster.name_any());
    let stored = match read_kubeconfig(cluster, &api).await? {
        KubeconfigState::Stored => true,
        KubeconfigState::Absent => false,
        KubeconfigState::Stale => {
            run.apply_sets(plan::kubeconfig_stale(&name));
            set_addons(run, &world.addons, false);
            return Ok(ControlFlow::Break(Action::requeue(ctx.settings.retry)));
        }
    };
    if !stored {
        let fetched = match secrets.legacy_kubeconfig.clone() {
            Some(kubeconfig) => Ok(kubeconfig),
            None => fetch_kubeconfig(ctx, target).await,
        };
        let kubeconfig = match fetched {
            Ok(kubeconfig) => kubeconfig,
            Err(err) => {
                run.apply_sets(plan::kubeconfig_unfetched(&chain(&err)));
                set_addons(run, &world.addons, false);
                run.flush().await?;
                return Err(err);
            }
        };
        store_kubeconfig(cluster, &api, &kubeconfig).await?;
        info!(secret = %name, "stored the kubeconfig");
        let message = format!("stored the admin kubeconfig in Secret {name}");
        let reference = cluster.object_ref(&());
        let reason = Reason::KubeconfigAvailable.as_str();
        ctx.events
            .normal(&reference, reason, "Store", message)
            .await;
    }
    let has_legacy = secrets.legacy_kubeconfig.is_some();
    let cp = world.usable_control_plane();
    finish_secrets_secret(
        cluster,
        &api,
        &target.bundle,
        &cp,
        secrets.has_talosconfig,
        has_legacy,
    )
    .await?;
    run.status.secret_ref = Some(LocalRef { name: name.clone() });
    run.apply_sets([plan::kubeconfig_stored(&name, KUBECONFIG_KEY)]);
    Ok(ControlFlow::Continue(()))
}

async fn fetch_kubeconfig(ctx: &Ctx, target: &Target) -> Result<Vec<u8>, Error> {
    ctx.machines
        .kubeconfig(&target.endpoint, &target.identity)
        .await
}

/// `ControlPlaneReady`: Cilium `Ready` and the Talos health check passing (again every
/// `--health-check-interval-seconds` once ready). Returns when to look again.
async fn control_plane_health(
    run: &mut Run<'_>,
    world: &World,
    target: &Target,
    view: &plan::AddonsView,
) -> Action {
    let ctx = run.ctx;
    let healthy_before = run.is_true(Cond::ControlPlaneReady);
    let check = if view.cni_ready {
        let key = object_key(run.cluster);
        let due = !healthy_before
            || ctx.last_healthy.update(|m| {
                m.get(&key)
                    .is_none_or(|t| t.elapsed() >= ctx.settings.health_interval)
            });
        if !due {
            return Action::requeue(RESYNC.min(ctx.settings.health_interval));
        }
        let cp = world.usable_control_plane();
        let result = health_check(ctx, target, &cp, &world.usable_workers()).await;
        if result.is_ok() {
            ctx.last_healthy
                .update(|m| m.insert(key, tokio::time::Instant::now()));
            join_members(run, &target.identity, &cp, true).await;
        }
        plan::Health::Checked(result)
    } else {
        plan::Health::NoCni(view.cni_message.clone())
    };
    let joined: Vec<&str> = world
        .usable_control_plane()
        .into_iter()
        .filter(|m| m.joined)
        .map(|m| m.name.as_str())
        .collect();
    let outcome = plan::control_plane_health(check, healthy_before, &joined);
    run.apply_sets(outcome.sets);
    for (member, set) in outcome.members {
        run.set_member(&member, set.condition, set.status, set.reason, &set.message);
    }
    if let (Some(ready), Some(cp)) = (outcome.ready_replicas, run.status.control_plane.as_mut()) {
        cp.ready_replicas = if ready { cp.replicas } else { 0 };
    }
    if outcome.retry {
        Action::requeue(ctx.settings.retry)
    } else {
        Action::requeue(RESYNC.min(ctx.settings.health_interval))
    }
}

/// Workers, once the control plane is ready: configured, then joined; cert-manager is
/// seeded. Before that, each waits (`Joined=False/WaitingForControlPlane`). Returns whether
/// every worker is configured and joined.
async fn workers(run: &mut Run<'_>, world: &World, target: &Target) -> Result<bool, Error> {
    if !run.is_true(Cond::ControlPlaneReady) {
        for (_, ms) in &world.members.workers {
            for w in ms.iter().filter(|w| !w.configured) {
                let set = plan::worker_waiting();
                run.set_member(&w.name, set.condition, set.status, set.reason, &set.message);
            }
        }
        return Ok(true);
    }
    let workers = world.usable_workers();
    let mut all = true;
    let pending: Vec<&Member> = workers.iter().filter(|w| !w.configured).collect();
    for (worker, sent) in send_configs(run.ctx, target, &pending).await {
        if let Err(err) = record_config(run, worker, sent).await {
            warn!(instance = %worker.name, error = &err as &dyn std::error::Error, "configuring a worker failed; retrying");
            all = false;
        }
    }
    if !pending.is_empty() {
        run.flush().await?;
    }
    let refs: Vec<&Member> = workers.iter().collect();
    all &= join_members(run, &target.identity, &refs, false).await;
    // A newly ready control plane gets cert-manager now.
    let view = plan::addons_view(run.cluster, &world.addons, true, true);
    seed(run, &view.to_seed).await?;
    Ok(all)
}

/// Scale-down: every machine this cluster configured (`status.configuredInstances`) whose
/// pool released it is reset to maintenance mode, gracefully (a worker leaves its cluster, a
/// control plane leaves etcd), its conditions cleared and its name forgotten, so it can
/// serve another cluster. The endpoint member is never reset here. An Instance that is gone
/// is forgotten (deleting one resets it first: the instance-reset controller). Returns
/// whether nothing is left to do.
async fn reset_released(run: &mut Run<'_>, members: &Members, target: &Target) -> bool {
    let (endpoint, identity) = (&target.endpoint, &target.identity);
    let ctx = run.ctx;
    let ns = run.cluster.namespace().unwrap_or_default();
    let api: Api<Instance> = Api::namespaced(ctx.client.clone(), &ns);
    let released: Vec<String> = run
        .status
        .configured_instances
        .iter()
        .filter(|n| members.get(n).is_none() && **n != endpoint.name)
        .cloned()
        .collect();
    let mut done = true;
    for name in released {
        let Some(instance) = ctx.instances.get(&ObjectRef::new(&name).within(&ns)) else {
            run.status.configured_instances.retain(|n| *n != name);
            continue;
        };
        let member = Member::from_instance(&instance, "", Role::Worker);
        let reset = machines::reset(ctx.machines.as_ref(), &member, identity, true).await;
        let cleared = match reset {
            Ok(_) => write_member_conditions(&api, &name, &[]).await,
            Err(err) => Err(err),
        };
        if let Err(err) = cleared {
            warn!(instance = %name, error = &err as &dyn std::error::Error, "resetting a released machine failed; retrying");
            done = false;
            continue;
        }
        info!(instance = %name, "released machine reset to maintenance mode");
        run.status.configured_instances.retain(|n| *n != name);
        ctx.events
            .normal(
                &run.cluster.object_ref(&()),
                "Reset",
                "ScaleDown",
                format!("reset {name} to maintenance mode: its pool released it"),
            )
            .await;
    }
    done
}

/// Records `Bootstrapped=True` at once (the cluster status first), so that a crash after
/// this point never calls Bootstrap again, and tells a human.
async fn bootstrapped(run: &mut Run<'_>, endpoint: &Member, how: &str) -> Result<(), Error> {
    let set = plan::bootstrapped(how, &endpoint.name);
    let (reason, message) = (set.reason.as_str(), set.message.clone());
    run.apply_sets([set]);
    run.flush().await?;
    let reference = run.cluster.object_ref(&());
    run.ctx
        .events
        .normal(&reference, reason, "Bootstrap", message)
        .await;
    Ok(())
}

/// Sets `AddonsReady` from the Addons in the store. Built-ins not created yet count as
/// pending.
fn set_addons(run: &mut Run<'_>, addons: &[Arc<Addon>], control_plane_ready: bool) {
    let view = plan::addons_view(run.cluster, addons, true, control_plane_ready);
    run.apply_sets([plan::addons_ready(&view)]);
}

/// Applies `member`'s config in maintenance mode. If maintenance mode no longer answers,
/// the machine may have been configured by an earlier attempt whose result was lost: a
/// configured-mode Version with this cluster's admin identity proves it.
/// The Talos side of configuring `member`: its config rendered and sent over the pinned
/// maintenance connection, each call bounded by the dialer's timeouts.
async fn send_config(ctx: &Ctx, target: &Target, member: &Member) -> Result<String, Error> {
    // Pinned: a machine config (a control plane's holds every cluster CA key) goes only to
    // the machine that was discovered; the handshake proves its key first.
    let config = machines::machine_config(&target.input, &target.bundle, member)?;
    let bytes = config.expose().as_bytes();
    machines::apply_config(ctx.machines.as_ref(), member, &target.identity, bytes).await?;
    Ok(machines::config_hash(&config))
}

/// Configures `members` at once (at most [`crate::MEMBER_CONCURRENCY`] calls in flight), so
/// a machine that hangs holds up no other; the outcomes come back in `members`' order.
async fn send_configs<'m>(
    ctx: &Ctx,
    target: &Target,
    members: &[&'m Member],
) -> Vec<(&'m Member, Result<String, Error>)> {
    // The futures are made up front: a closure inside the stream would make the
    // reconcile's future not provably `Send` (a known limit of higher-ranked inference).
    let calls: Vec<_> = members
        .iter()
        .map(|&member| async move { (member, send_config(ctx, target, member).await) })
        .collect();
    futures::stream::iter(calls)
        .buffered(crate::MEMBER_CONCURRENCY)
        .collect()
        .await
}

/// Records how configuring `member` ended: `Configured` (and the member in
/// `status.configuredInstances`, with an Event), or why not.
async fn record_config(
    run: &mut Run<'_>,
    member: &Member,
    result: Result<String, Error>,
) -> Result<(), Error> {
    let hash = match result {
        Ok(hash) => hash,
        Err(err) => {
            config_failed(run, member, &err).await;
            return Err(err);
        }
    };
    info!(instance = %member.name, "machine configuration applied");
    crate::reconfigure::record(&mut run.status, &member.name, hash, false);
    run.apply_member(&member.name, &plan::configured());
    if !run.status.configured_instances.contains(&member.name) {
        run.status.configured_instances.push(member.name.clone());
        run.status.configured_instances.sort();
    }
    let role = match member.role {
        Role::ControlPlane => "control-plane",
        Role::Worker => "worker",
    };
    let message = format!(
        "applied the {role} machine configuration to {}",
        member.name
    );
    let reference = run.cluster.object_ref(&());
    let reason = IReason::ConfigApplied.as_str();
    run.ctx
        .events
        .normal(&reference, reason, "Configure", message)
        .await;
    Ok(())
}

/// Records why `member` could not be configured, with a Warning Event when another machine
/// answers at its address (once per transition, not per retry).
async fn config_failed(run: &mut Run<'_>, member: &Member, err: &Error) {
    let kind = match err {
        _ if machines::unreachable(err) => plan::ConfigFailure::Unreachable,
        _ if identity_refused(err) => plan::ConfigFailure::IdentityChanged,
        Error::NoIdentity { .. } => plan::ConfigFailure::NoIdentity,
        Error::Patch { .. } => plan::ConfigFailure::InvalidPatch,
        _ => plan::ConfigFailure::Refused,
    };
    let set = plan::not_configured(kind, &chain(err));
    let warn = match set.reason {
        IReason::IdentityChanged => Some(format!(
            "not configuring {}: another machine answers at its address; nothing was sent",
            member.name
        )),
        IReason::InvalidConfigPatch => Some(chain(err)),
        _ => None,
    };
    if let Some(message) = warn
        && !member_reason_is(run, &member.name, ICond::Configured, set.reason)
    {
        let reference = run.cluster.object_ref(&());
        let reason = set.reason.as_str();
        run.ctx
            .events
            .warning(&reference, reason, "Configure", message)
            .await;
    }
    run.apply_member(&member.name, &set);
}

/// Whether configuring a machine failed in a way retrying the same input cannot fix: the
/// config could not be rendered from the spec, or the machine refused it as invalid.
/// Kubernetes and transport failures are not (they are retried with backoff).
fn config_refused(err: &Error) -> bool {
    match err {
        Error::Config { .. } | Error::Patch { .. } => true,
        Error::Talos { source, .. } => source.kind() == ErrorKind::InvalidArgument,
        _ => false,
    }
}

/// Whether `err` is a maintenance connection the identity pin refused.
fn identity_refused(err: &Error) -> bool {
    matches!(err, Error::Talos { source, .. } if source.kind() == ErrorKind::IdentityMismatch)
}

/// Whether member `name`'s condition `c` already carries `reason` (so a transition's Event
/// is not repeated on every retry).
fn member_reason_is(run: &Run<'_>, name: &str, c: ICond, reason: IReason) -> bool {
    run.current_member_conditions(name)
        .iter()
        .any(|x| x.type_ == c.as_str() && x.reason == reason.as_str())
}

/// The Talos cluster health check through the endpoint, over the usable control planes
/// and the workers that were sent their config (Talos checks exactly the nodes it is
/// given, and a configured worker registers its Node before it is seen `Joined`: leaving it
/// out would fail the check on an unexpected node, and keep the workers waiting for a
/// control plane that never gets ready). A failure names what the check was still
/// waiting for, from its progress messages.
async fn health_check(
    ctx: &Ctx,
    target: &Target,
    control_plane: &[&Member],
    workers: &[Member],
) -> Result<(), String> {
    let addresses = |ms: &mut dyn Iterator<Item = &Member>| -> Vec<String> {
        ms.filter_map(|m| m.address.clone()).collect()
    };
    let nodes = addresses(&mut control_plane.iter().copied());
    let workers = addresses(&mut workers.iter().filter(|w| w.configured || w.joined));
    let (checked, progress) = ctx
        .machines
        .health_check(&target.endpoint, &target.identity, &nodes, &workers)
        .await;
    checked.map_err(|err| plan::health_failure(&progress, &chain(&err)))
}

/// Marks configured members `Joined` once they answer a configured-mode Version (and a
/// control plane's `Healthy` as the check found it). Returns whether every configured member joined.
async fn join_members(
    run: &mut Run<'_>,
    identity: &ClientIdentity,
    members: &[&Member],
    healthy_control_plane: bool,
) -> bool {
    let configured = |run: &Run<'_>, member: &Member| {
        member.configured
            || run
                .members
                .get(&member.name)
                .is_some_and(|(_, d)| conditions::is_true(d, ICond::Configured))
    };
    // Every configured member not yet joined is asked at once (bounded), so one that does
    // not answer holds up no other.
    let ctx = run.ctx;
    let asked: Vec<&Member> = members
        .iter()
        .copied()
        .filter(|m| !m.joined && configured(run, m))
        .collect();
    let calls: Vec<_> = asked
        .into_iter()
        .map(|m| async move { (m.name.clone(), configured_version(ctx, m, identity).await) })
        .collect();
    let mut answers: BTreeMap<String, Result<kontinuum_talos::Version, String>> =
        futures::stream::iter(calls)
            .buffered(crate::MEMBER_CONCURRENCY)
            .collect()
            .await;
    let mut all = true;
    for member in members {
        if !configured(run, member) {
            all = false;
            continue;
        }
        if let Some(answer) = answers.remove(&member.name) {
            let answer = match &answer {
                Ok(v) => Ok((v.rbac, v.tag.as_str())),
                Err(err) => Err(err.as_str()),
            };
            let joined = matches!(answer, Ok((true, _)));
            if let Some(set) = plan::join_answer(answer) {
                run.apply_member(&member.name, &set);
            }
            if !joined {
                all = false;
                continue;
            }
        }
        // As this pass left it: a failed check above set `Healthy=False` already.
        let reported = match run.members.get(&member.name) {
            Some((_, desired)) => conditions::get(desired, ICond::Healthy).is_some(),
            None => conditions::get(&run.current_member_conditions(&member.name), ICond::Healthy)
                .is_some(),
        };
        if let Some(set) = plan::member_health(member.role, healthy_control_plane, reported) {
            run.apply_member(&member.name, &set);
        }
    }
    all
}

/// The configured-mode Version of `member`, as this cluster's admin.
async fn configured_version(
    ctx: &Ctx,
    member: &Member,
    identity: &ClientIdentity,
) -> Result<kontinuum_talos::Version, String> {
    ctx.machines
        .version(member, identity)
        .await
        .map_err(|e| chain(&e))
}

/// Creates `object` (owned by the cluster) unless an object of its name exists; a creation
/// is logged and announced as a Normal Event with `reason`. Returns whether this call
/// created it.
async fn create_once<K>(
    run: &Run<'_>,
    api: &Api<K>,
    object: &K,
    reason: &str,
    note: impl FnOnce() -> String,
) -> Result<bool, Error>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + k8s_openapi::serde::Serialize
        + k8s_openapi::serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let name = object.name_any();
    let params = PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PostParams::default()
    };
    match api.create(&params, object).await {
        Ok(_) => {
            let note = note();
            info!(kind = %K::kind(&()), %name, "{note}");
            run.ctx
                .events
                .normal(&run.cluster.object_ref(&()), reason, "Create", note)
                .await;
            Ok(true)
        }
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
        Err(source) => Err(Error::Kube {
            what: format!("create {} {name}", K::kind(&())),
            source,
        }),
    }
}

/// Creates the built-ins in `to_seed` (named `<cluster>-<release>`, owned by the cluster).
/// Only `talosClusterRef` and `releaseName` are set: the addon-installer's defaults do the
/// rest, so default bumps reach existing clusters.
async fn seed(run: &Run<'_>, to_seed: &[BuiltinAddon]) -> Result<(), Error> {
    let cluster = run.cluster;
    let name = cluster.name_any();
    let api: Api<Addon> = Api::namespaced(
        run.ctx.client.clone(),
        &cluster.namespace().unwrap_or_default(),
    );
    for builtin in to_seed {
        let release = builtin.release_name();
        let Ok(addon_name) = kontinuum_crds::names::builtin_addon_name(&name, release) else {
            warn!(release, "cluster name too long for a built-in Addon name");
            continue;
        };
        let mut addon = Addon::new(
            &addon_name,
            AddonSpec {
                talos_cluster_ref: LocalRef { name: name.clone() },
                release_name: Some(release.to_owned()),
                enabled: true,
                ..AddonSpec::default()
            },
        );
        addon.metadata.namespace = cluster.namespace();
        addon.metadata.owner_references = cluster.controller_owner_ref(&()).map(|o| vec![o]);
        let mut l = secret_labels(cluster, "addon");
        l.insert(labels::APP_COMPONENT.into(), "addon".into());
        l.insert(labels::APP_NAME.into(), release.into());
        addon.metadata.labels = Some(l);
        create_once(run, &api, &addon, "AddonSeeded", || {
            format!("created the built-in Addon {addon_name} ({release})")
        })
        .await?;
    }
    Ok(())
}

/// Logs, counts and backs off.
#[allow(
    clippy::needless_pass_by_value,
    reason = "the signature Controller::run requires"
)]
pub fn error_policy(cluster: Arc<TalosCluster>, err: &Error, ctx: Arc<Ctx>) -> Action {
    retry_after_backoff(
        &object_key(cluster.as_ref()),
        err,
        &ctx.metrics,
        &ctx.backoff,
    )
}

/// The clusters an Instance event concerns: those whose pools claim it, or that configured
/// it.
pub fn clusters_for_instance(
    instance: &Instance,
    clusters: &[Arc<TalosCluster>],
) -> Vec<ObjectRef<TalosCluster>> {
    let ns = instance.namespace();
    let pool = instance.labels().get(labels::CLAIMED_BY);
    let name = instance.name_any();
    clusters
        .iter()
        .filter(|c| c.namespace() == ns)
        .filter(|c| {
            pool.is_some_and(|p| {
                &c.spec.control_plane.pool_ref.name == p
                    || c.spec.workers.iter().any(|w| &w.pool_ref.name == p)
            }) || c
                .status
                .as_ref()
                .is_some_and(|s| s.configured_instances.contains(&name))
        })
        .map(|c| ObjectRef::from_obj(c.as_ref()))
        .collect()
}

/// Runs the TalosCluster controller until `shutdown` triggers.
pub async fn run(
    ctx: Arc<Ctx>,
    cluster_events: impl futures::Stream<Item = Result<TalosCluster, watcher::Error>> + Send + 'static,
    instance_events: impl futures::Stream<Item = Result<Instance, watcher::Error>> + Send + 'static,
    addon_events: impl futures::Stream<Item = Result<Addon, watcher::Error>> + Send + 'static,
    secrets: Api<Secret>,
    readiness: &kontinuum_operator_common::admin::Readiness,
    shutdown: Shutdown,
) {
    let store = ctx.clusters.clone();
    let selector = format!(
        "{} in ({SECRETS_SECRET_COMPONENT},{KUBECONFIG_SECRET_COMPONENT})",
        labels::APP_COMPONENT
    );
    let secret_events = kontinuum_operator_common::admin::hub_watch(
        secrets,
        watcher::Config::default().labels(&selector),
        readiness,
    );
    let secret_events = kube::runtime::WatchStreamExt::touched_objects(secret_events);
    kontinuum_operator_common::operator::drain(
        Controller::for_stream(cluster_events, ctx.clusters.clone())
            .owns_stream(secret_events)
            .watches_stream(instance_events, move |instance| {
                clusters_for_instance(&instance, &store.state())
            })
            .watches_stream(addon_events, |addon| {
                addon
                    .namespace()
                    .map(|ns| ObjectRef::new(&addon.spec.talos_cluster_ref.name).within(&ns))
            })
            .graceful_shutdown_on(async move { shutdown.wait().await })
            .run(reconcile, error_policy, ctx),
    )
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn talos(kind: ErrorKind) -> Error {
        Error::Talos {
            instance: "n-01".into(),
            source: kontinuum_talos::Error::Connect {
                endpoint: "10.0.0.1:50000".into(),
                kind,
                source: Box::new(std::io::Error::other("x")),
            },
        }
    }

    #[test]
    fn only_a_refused_config_waits_for_a_change() {
        assert!(config_refused(&talos(ErrorKind::InvalidArgument)));
        assert!(!config_refused(&talos(ErrorKind::Unavailable)));
        assert!(!config_refused(&talos(ErrorKind::TimedOut)));
        let kube = Error::Kube {
            what: "read Secret s".into(),
            source: kube::Error::Api(
                kube::core::Status::failure("x", "Invalid")
                    .with_code(422)
                    .boxed(),
            ),
        };
        assert!(!config_refused(&kube));
    }
}
