//! The TalosCluster controller.
//!
//! * Reconciles: `TalosCluster`.
//! * Owns: its status; two Secrets in the cluster's namespace, split by who needs them:
//!   `taloscluster-<name>` (keys `secrets-bundle` and `talosconfig`, read by this operator
//!   alone; a controller ownerReference and this operator's finalizer, so a foreground
//!   deletion cannot take the bundle before the machines are reset) and
//!   `taloscluster-<name>-kubeconfig` (key `kubeconfig` only, named by `status.secretRef`:
//!   what the addon-installer and zone-installer read); the built-in Addons it seeds (created once each, never updated); the Instance
//!   conditions `Configured`, `Joined`, `Ready` of its members; the finalizer
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

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kontinuum_crds::conditions::{self, ConditionStatus};
use kontinuum_crds::labels;
use kontinuum_crds::reasons::{
    InstanceCondition as ICond, InstanceReason as IReason, TalosClusterCondition as Cond,
    TalosClusterReason as Reason,
};
use kontinuum_crds::v1alpha2::{
    Addon, AddonSpec, BuiltinAddon, ControlPlaneStatus, Instance, InstancePool, KUBECONFIG_KEY,
    KUBECONFIG_SECRET_COMPONENT, LocalRef, MachineTeardown, SECRETS_BUNDLE_KEY,
    SECRETS_SECRET_COMPONENT, TALOSCONFIG_KEY, TalosCluster, TalosClusterStatus, TeardownOutcome,
    WorkerPoolStatus, kubeconfig_secret_name,
};
use kontinuum_operator_common::backoff::object_key;
use kontinuum_operator_common::claims::set_claim;
use kontinuum_operator_common::error::{chain, forbidden, retry_after_backoff};
use kontinuum_operator_common::finalizer;
use kontinuum_operator_common::shutdown::Shutdown;
use kontinuum_operator_common::status::apply_status;
use kontinuum_operator_common::tracked::Forget as _;
use kontinuum_talos::{ApplyMode, ClientIdentity, ErrorKind};
use kontinuum_talos_config::{SecretsBundle, TalosVersion};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
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
const MEMBER_CONDITIONS: [ICond; 3] = [ICond::Configured, ICond::Joined, ICond::Ready];

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
        if let Some(wait) = cleanup(&cluster, &ctx).await? {
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
struct Run<'a> {
    cluster: &'a TalosCluster,
    ctx: &'a Ctx,
    api: Api<TalosCluster>,
    instances: Api<Instance>,
    written: Option<TalosClusterStatus>,
    status: TalosClusterStatus,
    members: BTreeMap<String, (Vec<Condition>, Vec<Condition>)>,
    now: Time,
}

impl<'a> Run<'a> {
    fn new(cluster: &'a TalosCluster, ctx: &'a Ctx) -> Self {
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

    fn set(&mut self, c: Cond, s: ConditionStatus, reason: Reason, message: impl Into<String>) {
        let condition = conditions::new(c, s, reason, message, self.generation());
        conditions::set(&mut self.status.conditions, condition, &self.now);
    }

    fn is_true(&self, c: Cond) -> bool {
        conditions::is_true(&self.status.conditions, c)
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
    async fn flush(&mut self) -> Result<(), Error> {
        // The cluster status first: it records what was done (Bootstrapped, configured
        // members); the member conditions only mirror it.
        let ready = plan::ready_condition(
            &self.status.conditions,
            self.cluster.metadata.deletion_timestamp.is_some(),
            self.generation(),
        );
        conditions::set(&mut self.status.conditions, ready, &self.now);
        let name = self.cluster.name_any();
        apply_status(
            &self.api,
            &name,
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

fn own_conditions(all: &[Condition]) -> Vec<Condition> {
    all.iter()
        .filter(|c| MEMBER_CONDITIONS.iter().any(|t| t.as_str() == c.type_))
        .cloned()
        .collect()
}

/// Replaces this operator's conditions on an Instance with `desired`, keeping every other
/// condition: a read-modify-write guarded by the resourceVersion (retried on conflict), so
/// a condition is always written or removed whole — server-side apply would leave
/// half-owned entries behind when another controller wrote the same type.
async fn write_member_conditions(
    api: &Api<Instance>,
    name: &str,
    desired: &[Condition],
) -> Result<(), Error> {
    let mut attempts = 0;
    loop {
        attempts += 1;
        let Some(current) = api
            .get_opt(name)
            .await
            .map_err(Error::kube(format!("read Instance {name}")))?
        else {
            return Ok(());
        };
        let mut conditions: Vec<Condition> = current
            .status
            .map(|s| s.conditions)
            .unwrap_or_default()
            .into_iter()
            .filter(|c| !MEMBER_CONDITIONS.iter().any(|t| t.as_str() == c.type_))
            .collect();
        conditions.extend(desired.iter().cloned());
        let patch = serde_json::json!({
            "metadata": { "resourceVersion": current.metadata.resource_version },
            "status": { "conditions": conditions },
        });
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..PatchParams::default()
        };
        match api.patch_status(name, &params, &Patch::Merge(&patch)).await {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 && attempts < 5 => {}
            Err(source) => {
                return Err(Error::Kube {
                    what: format!("patch the conditions of Instance {name}"),
                    source,
                });
            }
        }
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

fn owned_by(
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
    Stored(Vec<u8>),
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
        .map_or(KubeconfigState::Absent, |k| {
            KubeconfigState::Stored(k.0.clone())
        }))
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

#[allow(
    clippy::too_many_lines,
    reason = "the flow reads top to bottom, one step after another"
)]
async fn apply(cluster: &TalosCluster, ctx: &Ctx) -> Result<Action, Error> {
    let name = cluster.name_any();
    let ns = cluster.namespace().unwrap_or_default();
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &ns);
    let retry = ctx.settings.retry;
    let mut run = Run::new(cluster, ctx);
    run.status.teardown.clear();
    conditions::remove(&mut run.status.conditions, Cond::Deleting);

    // The requested version must have a config contract (machines that report none use it).
    let version = match TalosVersion::parse(requested_version(cluster))
        .and_then(|v| v.contract().map(|_| v))
    {
        Ok(v) => v,
        Err(err) => {
            let message = format!("spec.talos.version: {}", chain(&err));
            run.set(
                Cond::Bootstrapped,
                ConditionStatus::False,
                Reason::UnsupportedTalosVersion,
                message,
            );
            return run.finish(Action::await_change()).await;
        }
    };

    // 1. observe
    let instances = ctx.instances.state();
    let members = plan::members(cluster, &instances);
    let addons = ctx.addons.state();
    let usable_cp: Vec<&Member> = members
        .control_plane
        .iter()
        .filter(|m| m.usable())
        .collect();
    run.status.control_plane = Some(ControlPlaneStatus {
        replicas: i32::try_from(usable_cp.len()).unwrap_or(i32::MAX),
        ready_replicas: run
            .status
            .control_plane
            .as_ref()
            .map_or(0, |c| c.ready_replicas),
    });
    // Every member with Configured=True is recorded, also one configured by an earlier
    // reconcile whose status write was lost.
    for member in members.teardown_order() {
        if member.configured && !run.status.configured_instances.contains(&member.name) {
            run.status.configured_instances.push(member.name.clone());
        }
    }
    run.status.configured_instances.sort();
    run.status.workers = members
        .workers
        .iter()
        .map(|(pool, ms)| WorkerPoolStatus {
            name: pool.clone(),
            replicas: i32::try_from(ms.iter().filter(|m| m.usable()).count()).unwrap_or(i32::MAX),
            joined_replicas: i32::try_from(ms.iter().filter(|m| m.joined).count())
                .unwrap_or(i32::MAX),
        })
        .collect();

    // 2. the secrets bundle: created once, never regenerated.
    let (bundle, legacy_kubeconfig, has_talosconfig) = match ensure_secret(
        &mut run, &secrets, &version,
    )
    .await?
    {
        SecretState::Ready {
            bundle,
            legacy_kubeconfig,
            has_talosconfig,
        } => (bundle, legacy_kubeconfig, has_talosconfig),
        SecretState::Missing => {
            let secret = secret_name(&name);
            let message = format!(
                "Secret {secret} with the talos secrets bundle is gone; the machines trust its CAs, so it is never regenerated: restore it from a backup"
            );
            // One Event when it is first noticed, not one per reconcile.
            if conditions::get(&run.status.conditions, Cond::KubeconfigAvailable)
                .is_none_or(|c| c.reason != Reason::SecretsBundleMissing.as_str())
            {
                ctx.events
                    .warning(
                        &cluster.object_ref(&()),
                        Reason::SecretsBundleMissing.as_str(),
                        "Reconcile",
                        message.clone(),
                    )
                    .await;
            }
            run.set(
                Cond::KubeconfigAvailable,
                ConditionStatus::False,
                Reason::SecretsBundleMissing,
                message.clone(),
            );
            if !run.is_true(Cond::Bootstrapped) {
                run.set(
                    Cond::Bootstrapped,
                    ConditionStatus::False,
                    Reason::SecretsBundleMissing,
                    message,
                );
            }
            return run.finish(Action::requeue(RESYNC)).await;
        }
        SecretState::Stale { secret } => {
            let message = format!(
                "Secret {secret} belongs to an earlier cluster of the same name; waiting for the garbage collector to delete it"
            );
            run.set(
                Cond::Bootstrapped,
                ConditionStatus::False,
                Reason::StaleSecret,
                message,
            );
            return run.finish(Action::requeue(retry)).await;
        }
    };

    // 3. the control-plane members.
    let current_host = run
        .status
        .endpoint
        .as_deref()
        .and_then(plan::endpoint_host)
        .map(str::to_owned);
    let Some(endpoint) =
        plan::endpoint_member(&members.control_plane, current_host.as_deref()).cloned()
    else {
        let message = "no claimed, discovered control-plane instance yet";
        for c in [
            Cond::Bootstrapped,
            Cond::KubeconfigAvailable,
            Cond::ControlPlaneReady,
        ] {
            if !run.is_true(c) || c == Cond::ControlPlaneReady {
                run.set(
                    c,
                    ConditionStatus::False,
                    Reason::WaitingForInstances,
                    message,
                );
            }
        }
        set_addons(&mut run, &addons, false);
        return run.finish(Action::requeue(RESYNC)).await;
    };
    let endpoint_host = endpoint.address.clone().unwrap_or_default();
    run.status.endpoint = Some(plan::endpoint_url(&endpoint_host));
    let input = ClusterInput {
        name: name.clone(),
        endpoint_host,
        talos_version: version,
        kubernetes_version: kubernetes_version(cluster),
    };
    let identity = machines::admin_identity(&bundle, &name)?;

    // 4. configure the control plane (the endpoint must succeed; others are retried).
    let mut pending = false;
    for member in &usable_cp {
        if member.configured {
            continue;
        }
        match configure(&mut run, &input, &bundle, &identity, member).await {
            Ok(()) => {}
            Err(err) if member.name == endpoint.name => {
                let message = chain(&err);
                let reason = if identity_refused(&err) {
                    Reason::IdentityChanged
                } else {
                    Reason::ConfigFailed
                };
                if !run.is_true(Cond::Bootstrapped) {
                    run.set(
                        Cond::Bootstrapped,
                        ConditionStatus::False,
                        reason,
                        message.clone(),
                    );
                }
                if config_refused(&err) {
                    // The same config fails the same way: report it and wait for a change
                    // of the cluster or its Instances (both watched) instead of retrying.
                    warn!(instance = %member.name, error = &err as &dyn std::error::Error, "the endpoint's machine config is refused; waiting for a change");
                    let reported = cluster.status.as_ref().and_then(|s| {
                        conditions::get(&s.conditions, Cond::Bootstrapped)
                            .map(|c| (c.reason.clone(), c.message.clone()))
                    });
                    if reported != Some((reason.as_str().to_owned(), message.clone())) {
                        ctx.events
                            .warning(
                                &cluster.object_ref(&()),
                                reason.as_str(),
                                "Configure",
                                message,
                            )
                            .await;
                    }
                    return run.finish(Action::await_change()).await;
                }
                run.flush().await?;
                return Err(err);
            }
            Err(err) => {
                warn!(instance = %member.name, error = &err as &dyn std::error::Error, "configuring a control-plane member failed; retrying");
                pending = true;
            }
        }
    }

    // 5. Bootstrap, exactly once. The intent is recorded before the call
    //    (`Bootstrapped=Unknown`, reason `Bootstrapping`); finding it means an earlier call
    //    may have gone out before a crash or an ambiguous timeout. Then the cluster's API
    //    server answering proves etcd was bootstrapped; only when it has not answered for
    //    `--bootstrap-grace-seconds` is Bootstrap called again (AlreadyExists is success).
    if !run.is_true(Cond::Bootstrapped) {
        let intent = conditions::get(&run.status.conditions, Cond::Bootstrapped)
            .filter(|c| {
                c.status == ConditionStatus::Unknown.as_str()
                    && c.reason == Reason::Bootstrapping.as_str()
            })
            .map(|c| c.last_transition_time.0);
        let mut call = true;
        if let Some(since) = intent {
            match crate::downstream::api_server_answers(ctx, &endpoint, &identity).await {
                Ok(()) => {
                    call = false;
                    bootstrapped(
                        &mut run,
                        &endpoint,
                        "the API server answers after an earlier Bootstrap call",
                    )
                    .await?;
                }
                Err(err) => {
                    let waited = Timestamp::now().duration_since(since).unsigned_abs();
                    if waited < ctx.settings.bootstrap_grace {
                        let message = format!(
                            "a Bootstrap call to {} may have been sent at {since}; waiting for the API server to answer before calling again: {}",
                            endpoint.name,
                            chain(&err)
                        );
                        run.set(
                            Cond::Bootstrapped,
                            ConditionStatus::Unknown,
                            Reason::Bootstrapping,
                            message,
                        );
                        run.set(
                            Cond::KubeconfigAvailable,
                            ConditionStatus::False,
                            Reason::Bootstrapping,
                            "waiting for etcd to be bootstrapped",
                        );
                        return run.finish(Action::requeue(retry)).await;
                    }
                }
            }
        }
        if call {
            run.set(
                Cond::Bootstrapped,
                ConditionStatus::Unknown,
                Reason::Bootstrapping,
                format!("calling Bootstrap on {}", endpoint.name),
            );
            run.flush().await?;
            let outcome = async {
                let client = ctx.settings.dialer.configured(&endpoint, &identity).await?;
                ctx.metrics.external_call("talos", "Bootstrap");
                client.bootstrap().await.map_err(|source| Error::Talos {
                    instance: endpoint.name.clone(),
                    source,
                })
            }
            .await;
            match outcome {
                Ok(outcome) => {
                    info!(instance = %endpoint.name, ?outcome, "etcd bootstrapped");
                    bootstrapped(&mut run, &endpoint, "etcd bootstrapped").await?;
                }
                // The call may have reached the machine: keep the intent.
                Err(err) if matches!(&err, Error::Talos { source, .. } if source.kind() == ErrorKind::TimedOut) =>
                {
                    let message = format!(
                        "the Bootstrap call may have reached the machine: {}",
                        chain(&err)
                    );
                    run.set(
                        Cond::Bootstrapped,
                        ConditionStatus::Unknown,
                        Reason::Bootstrapping,
                        message,
                    );
                    run.flush().await?;
                    return Err(err);
                }
                Err(err) => {
                    run.set(
                        Cond::Bootstrapped,
                        ConditionStatus::False,
                        Reason::BootstrapFailed,
                        chain(&err),
                    );
                    run.flush().await?;
                    return Err(err);
                }
            }
        }
    }

    // 6. The kubeconfig, into a Secret of its own (the one `status.secretRef` names).
    let stored_kubeconfig = match read_kubeconfig(cluster, &secrets).await? {
        KubeconfigState::Stored(kubeconfig) => Some(kubeconfig),
        KubeconfigState::Absent => None,
        KubeconfigState::Stale => {
            let message = format!(
                "Secret {} belongs to an earlier cluster of the same name; waiting for the garbage collector to delete it",
                kubeconfig_secret_name(&name)
            );
            run.set(
                Cond::KubeconfigAvailable,
                ConditionStatus::False,
                Reason::StaleSecret,
                message,
            );
            set_addons(&mut run, &addons, false);
            return run.finish(Action::requeue(retry)).await;
        }
    };
    let kubeconfig_secret = kubeconfig_secret_name(&name);
    if stored_kubeconfig.is_none() {
        let fetched = match legacy_kubeconfig.clone() {
            Some(kubeconfig) => Ok(kubeconfig),
            None => {
                async {
                    let client = ctx.settings.dialer.configured(&endpoint, &identity).await?;
                    ctx.metrics.external_call("talos", "Kubeconfig");
                    client
                        .kubeconfig()
                        .await
                        .map(kontinuum_talos::Kubeconfig::into_bytes)
                        .map_err(|source| Error::Talos {
                            instance: endpoint.name.clone(),
                            source,
                        })
                }
                .await
            }
        };
        match fetched {
            Ok(kubeconfig) => {
                store_kubeconfig(cluster, &secrets, &kubeconfig).await?;
                info!(secret = %kubeconfig_secret, "stored the kubeconfig");
                ctx.events
                    .normal(
                        &cluster.object_ref(&()),
                        Reason::KubeconfigAvailable.as_str(),
                        "Store",
                        format!("stored the admin kubeconfig in Secret {kubeconfig_secret}"),
                    )
                    .await;
            }
            Err(err) => {
                run.set(
                    Cond::KubeconfigAvailable,
                    ConditionStatus::False,
                    Reason::Bootstrapping,
                    format!("waiting for the kubeconfig: {}", chain(&err)),
                );
                run.set(
                    Cond::ControlPlaneReady,
                    ConditionStatus::False,
                    Reason::Bootstrapping,
                    "waiting for the kubeconfig",
                );
                set_addons(&mut run, &addons, false);
                run.flush().await?;
                return Err(err);
            }
        }
    }
    finish_secrets_secret(
        cluster,
        &secrets,
        &bundle,
        &usable_cp,
        has_talosconfig,
        legacy_kubeconfig.is_some(),
    )
    .await?;
    run.status.secret_ref = Some(LocalRef {
        name: kubeconfig_secret.clone(),
    });
    run.set(
        Cond::KubeconfigAvailable,
        ConditionStatus::True,
        Reason::KubeconfigAvailable,
        format!("kubeconfig stored in Secret {kubeconfig_secret} key {KUBECONFIG_KEY}"),
    );

    // 7. Addons before health: nothing, CoreDNS included, runs before Cilium does.
    let cp_ready_before = run.is_true(Cond::ControlPlaneReady);
    let view = plan::addons_view(cluster, &addons, true, cp_ready_before);
    seed(&run, &view.to_seed).await?;

    // 8. ControlPlaneReady: Cilium Ready and the Talos health check passing.
    let mut action = Action::requeue(RESYNC.min(ctx.settings.health_interval));
    if view.cni_ready {
        let key = object_key(cluster);
        let due = !cp_ready_before
            || ctx.last_healthy.update(|m| {
                m.get(&key)
                    .is_none_or(|t| t.elapsed() >= ctx.settings.health_interval)
            });
        if due {
            match health_check(ctx, &endpoint, &identity, &usable_cp).await {
                Ok(()) => {
                    ctx.last_healthy
                        .update(|m| m.insert(key, tokio::time::Instant::now()));
                    join_members(&mut run, &identity, &usable_cp, true).await;
                    run.set(
                        Cond::ControlPlaneReady,
                        ConditionStatus::True,
                        Reason::Healthy,
                        "control plane is healthy",
                    );
                    if let Some(cp) = run.status.control_plane.as_mut() {
                        cp.ready_replicas = cp.replicas;
                    }
                }
                Err(err) => {
                    let reason = if cp_ready_before {
                        Reason::Unhealthy
                    } else {
                        Reason::Bootstrapping
                    };
                    let message = format!("control plane health check failed: {}", chain(&err));
                    for m in &usable_cp {
                        if m.joined {
                            run.set_member(
                                &m.name,
                                ICond::Ready,
                                ConditionStatus::False,
                                IReason::Unhealthy,
                                &message,
                            );
                        }
                    }
                    run.set(
                        Cond::ControlPlaneReady,
                        ConditionStatus::False,
                        reason,
                        message,
                    );
                    if let Some(cp) = run.status.control_plane.as_mut() {
                        cp.ready_replicas = 0;
                    }
                    action = Action::requeue(retry);
                }
            }
        }
    } else {
        run.set(
            Cond::ControlPlaneReady,
            ConditionStatus::False,
            Reason::WaitingForCni,
            view.cni_message.clone(),
        );
    }

    // 9. Workers, once the control plane is ready.
    if run.is_true(Cond::ControlPlaneReady) {
        let workers: Vec<Member> = members
            .workers
            .iter()
            .flat_map(|(_, ms)| ms.iter().cloned())
            .filter(Member::usable)
            .collect();
        for worker in &workers {
            if !worker.configured
                && let Err(err) = configure(&mut run, &input, &bundle, &identity, worker).await
            {
                warn!(instance = %worker.name, error = &err as &dyn std::error::Error, "configuring a worker failed; retrying");
                pending = true;
            }
        }
        let worker_refs: Vec<&Member> = workers.iter().collect();
        if !join_members(&mut run, &identity, &worker_refs, false).await {
            pending = true;
        }
        // A newly ready control plane gets cert-manager now.
        let view = plan::addons_view(cluster, &addons, true, true);
        seed(&run, &view.to_seed).await?;
    } else {
        for (_, ms) in &members.workers {
            for w in ms.iter().filter(|w| !w.configured) {
                run.set_member(
                    &w.name,
                    ICond::Joined,
                    ConditionStatus::False,
                    IReason::WaitingForControlPlane,
                    "waiting for the control plane to be ready",
                );
            }
        }
    }
    // 10. Scale-down: members this cluster configured that their pool has released.
    if !reset_released(&mut run, &members, &endpoint, &identity).await {
        pending = true;
    }
    let cp_ready = run.is_true(Cond::ControlPlaneReady);
    set_addons(&mut run, &addons, cp_ready);
    if pending {
        action = Action::requeue(retry);
    }
    run.status.observed_generation = cluster.metadata.generation;
    run.finish(action).await
}

/// Scale-down: every machine this cluster configured (`status.configuredInstances`) whose
/// pool released it is reset to maintenance mode, gracefully (a worker leaves its cluster, a
/// control plane leaves etcd), its conditions cleared and its name forgotten, so it can
/// serve another cluster. The endpoint member is never reset here. An Instance that is gone
/// is forgotten (deleting one resets it first: the instance-reset controller). Returns
/// whether nothing is left to do.
async fn reset_released(
    run: &mut Run<'_>,
    members: &Members,
    endpoint: &Member,
    identity: &ClientIdentity,
) -> bool {
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
        let reset = ctx
            .settings
            .dialer
            .reset(&member, identity, true, &ctx.metrics)
            .await;
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
    run.set(
        Cond::Bootstrapped,
        ConditionStatus::True,
        Reason::Bootstrapped,
        format!("{how} on {}", endpoint.name),
    );
    run.flush().await?;
    run.ctx
        .events
        .normal(
            &run.cluster.object_ref(&()),
            Reason::Bootstrapped.as_str(),
            "Bootstrap",
            format!("{how} on {}", endpoint.name),
        )
        .await;
    Ok(())
}

/// Sets `AddonsReady` from the Addons in the store. Built-ins not created yet count as
/// pending.
fn set_addons(run: &mut Run<'_>, addons: &[Arc<Addon>], control_plane_ready: bool) {
    let view = plan::addons_view(run.cluster, addons, true, control_plane_ready);
    let (s, reason) = if view.ready {
        (ConditionStatus::True, Reason::AddonsInstalled)
    } else {
        (ConditionStatus::False, Reason::AddonNotHealthy)
    };
    run.set(Cond::AddonsReady, s, reason, view.message);
}

/// Applies `member`'s config in maintenance mode. If maintenance mode no longer answers,
/// the machine may have been configured by an earlier attempt whose result was lost: a
/// configured-mode Version with this cluster's admin identity proves it.
async fn configure(
    run: &mut Run<'_>,
    input: &ClusterInput,
    bundle: &SecretsBundle,
    identity: &ClientIdentity,
    member: &Member,
) -> Result<(), Error> {
    let dialer = run.ctx.settings.dialer;
    let config = machines::machine_config(input, bundle, member).inspect_err(|err| {
        run.set_member(
            &member.name,
            ICond::Configured,
            ConditionStatus::False,
            IReason::ConfigRejected,
            &chain(err),
        );
    })?;
    let metrics = &run.ctx.metrics;
    let applied = async {
        // Pinned: a machine config (a control plane's holds every cluster CA key) goes only
        // to the machine that was discovered; the handshake proves its key first.
        let client = dialer.maintenance_pinned(member).await?;
        metrics.external_call("talos", "ApplyConfiguration");
        client
            .apply_configuration(config.expose().as_bytes().to_vec(), ApplyMode::Reboot)
            .await
            .map_err(|source| Error::Talos {
                instance: member.name.clone(),
                source,
            })
    }
    .await;
    let result = match applied {
        Ok(_) => Ok(()),
        Err(err) => {
            // Already ours? (an earlier apply whose status write was lost)
            let ours = async {
                let client = dialer.configured(member, identity).await?;
                metrics.external_call("talos", "Version");
                client.version().await.map_err(|source| Error::Talos {
                    instance: member.name.clone(),
                    source,
                })
            }
            .await;
            match ours {
                Ok(v) if v.rbac => Ok(()),
                _ => Err(err),
            }
        }
    };
    match result {
        Ok(()) => {
            info!(instance = %member.name, "machine configuration applied");
            run.set_member(
                &member.name,
                ICond::Configured,
                ConditionStatus::True,
                IReason::ConfigApplied,
                "talos machine configuration applied",
            );
            if !run.status.configured_instances.contains(&member.name) {
                run.status.configured_instances.push(member.name.clone());
                run.status.configured_instances.sort();
            }
            run.ctx
                .events
                .normal(
                    &run.cluster.object_ref(&()),
                    IReason::ConfigApplied.as_str(),
                    "Configure",
                    format!(
                        "applied the {} machine configuration to {}",
                        match member.role {
                            Role::ControlPlane => "control-plane",
                            Role::Worker => "worker",
                        },
                        member.name
                    ),
                )
                .await;
            Ok(())
        }
        Err(err) => {
            config_failed(run, member, &err).await;
            Err(err)
        }
    }
}

/// Records why `member` could not be configured, with a Warning Event when another machine
/// answers at its address (once per transition, not per retry).
async fn config_failed(run: &mut Run<'_>, member: &Member, err: &Error) {
    let reason = match err {
        Error::Talos { source, .. }
            if matches!(
                source.kind(),
                ErrorKind::Unreachable | ErrorKind::TimedOut | ErrorKind::Unavailable
            ) =>
        {
            IReason::TalosApiUnreachable
        }
        _ if identity_refused(err) => IReason::IdentityChanged,
        Error::NoIdentity { .. } => IReason::IdentityUnknown,
        _ => IReason::ConfigRejected,
    };
    if reason == IReason::IdentityChanged
        && !member_reason_is(run, &member.name, ICond::Configured, reason)
    {
        run.ctx
            .events
            .warning(
                &run.cluster.object_ref(&()),
                reason.as_str(),
                "Configure",
                format!(
                    "not configuring {}: another machine answers at its address; nothing was sent",
                    member.name
                ),
            )
            .await;
    }
    run.set_member(
        &member.name,
        ICond::Configured,
        ConditionStatus::False,
        reason,
        &chain(err),
    );
}

/// Whether `err` is a maintenance connection the identity pin refused.
/// Whether configuring a machine failed in a way retrying the same input cannot fix: the
/// config could not be rendered from the spec, or the machine refused it as invalid.
/// Kubernetes and transport failures are not (they are retried with backoff).
fn config_refused(err: &Error) -> bool {
    match err {
        Error::Config { .. } => true,
        Error::Talos { source, .. } => source.kind() == ErrorKind::InvalidArgument,
        _ => false,
    }
}

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

async fn health_check(
    ctx: &Ctx,
    endpoint: &Member,
    identity: &ClientIdentity,
    control_plane: &[&Member],
) -> Result<(), Error> {
    let client = ctx.settings.dialer.configured(endpoint, identity).await?;
    let nodes: Vec<String> = control_plane
        .iter()
        .filter_map(|m| m.address.clone())
        .collect();
    ctx.metrics.external_call("talos", "HealthCheck");
    client
        .health_check(ctx.settings.dialer.health_wait, &nodes, &[], |_| {})
        .await
        .map_err(|source| Error::Talos {
            instance: endpoint.name.clone(),
            source,
        })
}

/// Marks configured members `Joined` once they answer a configured-mode Version (and, for
/// a healthy control plane, `Ready`). Returns whether every configured member joined.
async fn join_members(
    run: &mut Run<'_>,
    identity: &ClientIdentity,
    members: &[&Member],
    healthy_control_plane: bool,
) -> bool {
    let dialer = run.ctx.settings.dialer;
    let metrics = std::sync::Arc::clone(&run.ctx.metrics);
    let mut all = true;
    for member in members {
        let configured = member.configured
            || run
                .members
                .get(&member.name)
                .is_some_and(|(_, d)| conditions::is_true(d, ICond::Configured));
        if !configured {
            all = false;
            continue;
        }
        if !member.joined {
            let answered = async {
                let client = dialer.configured(member, identity).await?;
                metrics.external_call("talos", "Version");
                client.version().await.map_err(|source| Error::Talos {
                    instance: member.name.clone(),
                    source,
                })
            }
            .await;
            match answered {
                Ok(v) if v.rbac => {
                    run.set_member(
                        &member.name,
                        ICond::Joined,
                        ConditionStatus::True,
                        IReason::Joined,
                        &format!("node answers with its configured identity, talos {}", v.tag),
                    );
                }
                Ok(_) => {
                    all = false;
                    continue;
                }
                Err(err) => {
                    run.set_member(
                        &member.name,
                        ICond::Joined,
                        ConditionStatus::Unknown,
                        IReason::TalosApiUnreachable,
                        &chain(&err),
                    );
                    all = false;
                    continue;
                }
            }
        }
        if healthy_control_plane {
            run.set_member(
                &member.name,
                ICond::Ready,
                ConditionStatus::True,
                IReason::Healthy,
                "control plane health check passed with this node included",
            );
        } else if member.role == Role::Worker {
            run.set_member(
                &member.name,
                ICond::Ready,
                ConditionStatus::True,
                IReason::Ready,
                "configured and joined",
            );
        }
    }
    all
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

/// Teardown: reset every member (workers first), clear its conditions, release or delete
/// its Instance; bounded by the teardown deadline.
#[allow(clippy::too_many_lines, reason = "the teardown reads top to bottom")]
/// Returns `None` when teardown is finished (the finalizer may go), else when to look again.
async fn cleanup(cluster: &TalosCluster, ctx: &Ctx) -> Result<Option<Action>, Error> {
    let name = cluster.name_any();
    let ns = cluster.namespace().unwrap_or_default();
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &ns);
    let mut run = Run::new(cluster, ctx);
    let deleted_at = cluster
        .metadata
        .deletion_timestamp
        .as_ref()
        .map_or_else(Timestamp::now, |t| t.0);
    let timeout = SignedDuration::try_from(ctx.settings.teardown_timeout)
        .unwrap_or(SignedDuration::from_secs(900));
    let deadline = deleted_at.checked_add(timeout).unwrap_or(deleted_at);
    let expired = Timestamp::now() >= deadline;
    let unregister = cluster
        .spec
        .teardown
        .as_ref()
        .is_some_and(|t| t.unregister_instances);

    // Every member: claimed by a pool of the cluster, or configured by it earlier.
    let instances = ctx.instances.state();
    let members: Members = plan::members(cluster, &instances);
    let mut order: Vec<Member> = members.teardown_order().into_iter().cloned().collect();
    let recorded: BTreeSet<&String> = run.status.configured_instances.iter().collect();
    for extra in recorded {
        if order.iter().any(|m| &m.name == extra) {
            continue;
        }
        if let Some(i) = instances
            .iter()
            .find(|i| i.namespace().as_deref() == Some(ns.as_str()) && &i.name_any() == extra)
        {
            let pool = i
                .labels()
                .get(labels::CLAIMED_BY)
                .cloned()
                .unwrap_or_default();
            let mut m = Member::from_instance(i, &pool, Role::Worker);
            m.configured = true;
            order.push(m);
        }
    }
    let secret_state = secrets
        .get_opt(&secret_name(&name))
        .await
        .map_err(Error::kube(format!("read Secret {}", secret_name(&name))))?;
    let identity = secret_state
        .as_ref()
        .and_then(|s| s.data.as_ref())
        .and_then(|d| d.get(SECRETS_BUNDLE_KEY))
        .and_then(|b| SecretsBundle::from_json(&b.0).ok())
        .and_then(|bundle| machines::admin_identity(&bundle, &name).ok());

    let mut outcomes: BTreeMap<String, MachineTeardown> = run
        .status
        .teardown
        .iter()
        .map(|t| (t.instance.clone(), t.clone()))
        .collect();
    let mut last_error = None;
    let mut release_error = None;
    let cp_total = order
        .iter()
        .filter(|m| m.role == Role::ControlPlane)
        .count();
    let mut cp_reset = 0;
    for member in &order {
        let done = outcomes.get(&member.name).is_some_and(|t| {
            matches!(t.outcome, TeardownOutcome::Reset | TeardownOutcome::Skipped)
        });
        let outcome = if done {
            outcomes
                .get(&member.name)
                .map_or(TeardownOutcome::Reset, |t| t.outcome)
        } else if !member.configured {
            TeardownOutcome::Skipped
        } else if expired {
            outcomes
                .get(&member.name)
                .map_or(TeardownOutcome::Unreachable, |t| t.outcome)
        } else {
            // The last control-plane member cannot leave etcd gracefully.
            let graceful = member.role == Role::Worker || cp_reset + 1 < cp_total;
            let result = match &identity {
                None => Err((
                    false,
                    "the cluster's secrets bundle is gone: the machine cannot be reached as os:admin".to_owned(),
                )),
                Some(identity) => ctx
                    .settings
                    .dialer
                    .reset(member, identity, graceful, &ctx.metrics)
                    .await
                    .map(|_| ())
                    .map_err(|e| (machines::unreachable(&e), chain(&e))),
            };
            match result {
                Ok(()) => TeardownOutcome::Reset,
                Err((unreachable, message)) => {
                    warn!(instance = %member.name, error = %message, "resetting a machine failed; retrying");
                    last_error = Some(format!("{}: {message}", member.name));
                    outcomes.insert(
                        member.name.clone(),
                        MachineTeardown {
                            instance: member.name.clone(),
                            outcome: if unreachable {
                                TeardownOutcome::Unreachable
                            } else {
                                TeardownOutcome::Failed
                            },
                            message: Some(message),
                        },
                    );
                    continue;
                }
            }
        };
        if member.role == Role::ControlPlane && outcome == TeardownOutcome::Reset {
            cp_reset += 1;
        }
        let finished = matches!(outcome, TeardownOutcome::Reset | TeardownOutcome::Skipped);
        if finished && !done {
            info!(instance = %member.name, outcome = outcome.as_str(), "machine torn down");
            let note = match outcome {
                TeardownOutcome::Reset => format!("reset {} to maintenance mode", member.name),
                _ => format!(
                    "skipped {}: never configured, nothing to reset",
                    member.name
                ),
            };
            ctx.events
                .normal(&cluster.object_ref(&()), outcome.as_str(), "Teardown", note)
                .await;
            outcomes.insert(
                member.name.clone(),
                MachineTeardown {
                    instance: member.name.clone(),
                    outcome,
                    message: None,
                },
            );
        }
        if (finished || expired)
            && let Err(err) = release(ctx, cluster, member, unregister).await
        {
            warn!(instance = %member.name, error = &err as &dyn std::error::Error, "releasing a torn-down instance failed; retrying");
            release_error.get_or_insert(err);
        }
    }
    let pending: Vec<&MachineTeardown> = outcomes
        .values()
        .filter(|t| !matches!(t.outcome, TeardownOutcome::Reset | TeardownOutcome::Skipped))
        .filter(|t| order.iter().any(|m| m.name == t.instance))
        .collect();
    if let Some(err) = release_error {
        run.status.teardown = outcomes.into_values().collect();
        run.flush().await?;
        return Err(err);
    }
    if pending.is_empty() || expired {
        if expired && !pending.is_empty() {
            let names: Vec<&str> = pending.iter().map(|t| t.instance.as_str()).collect();
            let message = format!(
                "teardown deadline {deadline} passed; removed the finalizer, leaving {} as they are",
                names.join(", ")
            );
            warn!(%message, "teardown gave up");
            ctx.events
                .warning(
                    &cluster.object_ref(&()),
                    Reason::TeardownDeadlineExceeded.as_str(),
                    "Teardown",
                    message,
                )
                .await;
        }
        remove_secret_finalizer(&secrets, &secret_name(&name)).await?;
        ctx.last_healthy.forget(&object_key(cluster));
        info!("teardown finished");
        return Ok(None);
    }
    let message =
        plan::teardown_message(pending.len(), last_error.as_deref(), &deadline.to_string());
    run.status.teardown = outcomes.into_values().collect();
    run.set(
        Cond::Deleting,
        ConditionStatus::True,
        Reason::TeardownFailed,
        message,
    );
    run.flush().await?;
    let left = deadline.duration_since(Timestamp::now()).unsigned_abs();
    Ok(Some(Action::requeue(
        ctx.settings.retry.min(left + Duration::from_millis(100)),
    )))
}

/// Clears this operator's conditions on a torn-down member, then releases its claim (or
/// deletes the Instance when the cluster unregisters its machines). A claim by a pool the
/// cluster owns is left to that pool: it is garbage-collected with the cluster and releases
/// its Instances itself, while releasing here would only let the dying pool claim the
/// machine again.
async fn release(
    ctx: &Ctx,
    cluster: &TalosCluster,
    member: &Member,
    unregister: bool,
) -> Result<(), Error> {
    let ns = cluster.namespace().unwrap_or_default();
    let api: Api<Instance> = Api::namespaced(ctx.client.clone(), &ns);
    let Some(current) = api
        .get_opt(&member.name)
        .await
        .map_err(Error::kube(format!("read Instance {}", member.name)))?
    else {
        return Ok(());
    };
    let has_own = current
        .status
        .as_ref()
        .is_some_and(|s| !own_conditions(&s.conditions).is_empty());
    if has_own {
        write_member_conditions(&api, &member.name, &[]).await?;
    }
    if unregister {
        if current.metadata.deletion_timestamp.is_none() {
            match api.delete(&member.name, &DeleteParams::default()).await {
                Ok(_) => info!(instance = %member.name, "unregistered instance"),
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(source) => {
                    return Err(Error::Kube {
                        what: format!("delete Instance {}", member.name),
                        source,
                    });
                }
            }
        }
    } else if let Some(pool) = current.labels().get(labels::CLAIMED_BY) {
        let pools: Api<InstancePool> = Api::namespaced(ctx.client.clone(), &ns);
        let owned = pools
            .get_opt(pool)
            .await
            .map_err(Error::kube(format!("read InstancePool {pool}")))?
            .is_some_and(|p| owned_by(&p.metadata, cluster.uid().as_deref()));
        if owned {
            return Ok(());
        }
        let fresh = api
            .get(&member.name)
            .await
            .map_err(Error::kube(format!("read Instance {}", member.name)))?;
        set_claim(
            &api,
            &member.name,
            fresh.resource_version(),
            None,
            FIELD_MANAGER,
        )
        .await
        .map_err(Error::kube(format!("release Instance {}", member.name)))?;
    }
    Ok(())
}

async fn remove_secret_finalizer(secrets: &Api<Secret>, name: &str) -> Result<(), Error> {
    let Some(secret) = secrets
        .get_opt(name)
        .await
        .map_err(Error::kube(format!("read Secret {name}")))?
    else {
        return Ok(());
    };
    finalizer::remove(secrets, &secret, FINALIZER)
        .await
        .map_err(Error::kube(format!(
            "remove the finalizer of Secret {name}"
        )))
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
