//! The instance-reset controller.
//!
//! * Reconciles: `Instance`s.
//! * Owns: the finalizer `kontinuum.sh/instance-reset` on Instances claimed by a pool that a
//!   TalosCluster uses (as control plane or workers), and, while such an Instance is being
//!   deleted, its `Deleting` condition. Field manager `talos-bootstrapper.kontinuum.sh`.
//! * Triggered by: Instance changes.
//! * Never: resets a machine that was never configured (`Configured` not True), or one whose
//!   Instance is not being deleted. Releasing an Instance (scale-down) does not reset it.
//!
//! An Instance deleted while its machine is configured is reset to maintenance mode first
//! (dialled directly as `os:admin` of its cluster; not gracefully when it is the cluster's
//! last control-plane member), retried until the teardown deadline (`deletionTimestamp` +
//! `--teardown-timeout-seconds`), after which the finalizer is removed anyway.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kontinuum_crds::conditions::{self, ConditionStatus};
use kontinuum_crds::labels::CLAIMED_BY;
use kontinuum_crds::reasons::{InstanceCondition as ICond, InstanceReason as IReason};
use kontinuum_crds::v1alpha2::{Instance, InstanceStatus, SECRETS_BUNDLE_KEY, TalosCluster};
use kontinuum_operator_common::backoff::object_key;
use kontinuum_operator_common::error::{chain, retry_after_backoff};
use kontinuum_operator_common::finalizer;
use kontinuum_operator_common::shutdown::Shutdown;
use kontinuum_talos_config::SecretsBundle;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::{Api, Resource as _, ResourceExt};
use tracing::{info, instrument, warn};

use crate::cluster::secret_name;
use crate::plan::{Deadline, Member, Role};
use crate::{Ctx, Error, FIELD_MANAGER, RESYNC, machines};

/// The finalizer this controller owns.
pub const FINALIZER: &str = kontinuum_crds::finalizers::INSTANCE_RESET;

/// The cluster using `pool` in `namespace`, and the member's role in it.
pub fn cluster_of(
    clusters: &[Arc<TalosCluster>],
    namespace: &str,
    pool: &str,
) -> Option<(Arc<TalosCluster>, Role)> {
    clusters
        .iter()
        .filter(|c| c.namespace().as_deref() == Some(namespace))
        .find_map(|c| {
            if c.spec.control_plane.pool_ref.name == pool {
                Some((Arc::clone(c), Role::ControlPlane))
            } else if c.spec.workers.iter().any(|w| w.pool_ref.name == pool) {
                Some((Arc::clone(c), Role::Worker))
            } else {
                None
            }
        })
}

/// Reconciles one Instance.
#[allow(
    clippy::too_many_lines,
    reason = "one decision table, read top to bottom"
)]
#[instrument(skip_all, fields(controller = "instance-reset", instance = %instance.name_any()))]
pub async fn reconcile(instance: Arc<Instance>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    if !ctx.stores_ready().await {
        return Ok(Action::requeue(ctx.settings.retry));
    }
    let ns = instance.namespace().unwrap_or_default();
    let name = instance.name_any();
    let api: Api<Instance> = Api::namespaced(ctx.client.clone(), &ns);
    let has_finalizer = instance.finalizers().iter().any(|f| f == FINALIZER);
    let configured = instance
        .status
        .as_ref()
        .is_some_and(|s| conditions::is_true(&s.conditions, ICond::Configured));
    let cluster = instance
        .labels()
        .get(CLAIMED_BY)
        .and_then(|pool| cluster_of(&ctx.clusters.state(), &ns, pool));
    let deleting = instance.metadata.deletion_timestamp.is_some();

    if !deleting {
        if cluster.is_some() && configured && !has_finalizer {
            set_finalizer(&api, &instance, true).await?;
        } else if (cluster.is_none() || !configured) && has_finalizer {
            set_finalizer(&api, &instance, false).await?;
        }
        return Ok(Action::requeue(RESYNC));
    }
    if !has_finalizer {
        return Ok(Action::await_change());
    }
    let Some((cluster, role)) = cluster.filter(|_| configured) else {
        set_finalizer(&api, &instance, false).await?;
        return Ok(Action::await_change());
    };

    let deleted_at = instance.metadata.deletion_timestamp.as_ref().map(|t| t.0);
    let deadline = Deadline::of(deleted_at, Timestamp::now(), ctx.settings.teardown_timeout);
    let result = reset(&ctx, &cluster, &instance, role).await;
    match result {
        Ok(()) => {
            info!("machine reset before its Instance is deleted");
            ctx.events
                .normal(
                    &instance.object_ref(&()),
                    "Reset",
                    "Reset",
                    format!("reset {name} to maintenance mode before deletion"),
                )
                .await;
            set_finalizer(&api, &instance, false).await?;
            Ok(Action::await_change())
        }
        Err(err) if deadline.passed(Timestamp::now()) => {
            let message = format!(
                "could not reset the machine before {deadline}; removed the finalizer and left it as it is: {}",
                chain(&err)
            );
            warn!(%message, "reset deadline passed");
            ctx.events
                .warning(
                    &instance.object_ref(&()),
                    IReason::ResetFailed.as_str(),
                    "Reset",
                    message,
                )
                .await;
            set_finalizer(&api, &instance, false).await?;
            Ok(Action::await_change())
        }
        Err(err) => {
            let message = format!(
                "resetting the machine failed; will keep retrying until {deadline}, after which the finalizer is removed: {}",
                chain(&err)
            );
            let mut status = InstanceStatus::default();
            let now = Time(Timestamp::now());
            let current = instance
                .status
                .as_ref()
                .and_then(|s| conditions::get(&s.conditions, ICond::Deleting).cloned());
            status.conditions.extend(current);
            conditions::set(
                &mut status.conditions,
                conditions::new(
                    ICond::Deleting,
                    ConditionStatus::True,
                    IReason::ResetFailed,
                    message,
                    instance.metadata.generation,
                ),
                &now,
            );
            let patch = kontinuum_operator_common::status::status_patch::<Instance, _>(&status);
            api.patch_status(
                &name,
                &PatchParams::apply(&format!("{FIELD_MANAGER}/instance-reset")).force(),
                &Patch::Apply(&patch),
            )
            .await
            .map_err(Error::kube(format!("patch the status of Instance {name}")))?;
            Ok(Action::requeue(
                deadline.requeue(Timestamp::now(), ctx.settings.retry),
            ))
        }
    }
}

async fn reset(
    ctx: &Ctx,
    cluster: &TalosCluster,
    instance: &Instance,
    role: Role,
) -> Result<(), Error> {
    let ns = cluster.namespace().unwrap_or_default();
    let secret_name = secret_name(&cluster.name_any());
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &ns);
    let secret = secrets
        .get(&secret_name)
        .await
        .map_err(Error::kube(format!("read Secret {secret_name}")))?;
    let bundle = secret
        .data
        .as_ref()
        .and_then(|d| d.get(SECRETS_BUNDLE_KEY))
        .ok_or(Error::BadSecret {
            secret: secret_name.clone(),
        })
        .and_then(|b| SecretsBundle::from_json(&b.0).map_err(Error::Secrets))?;
    let identity = machines::admin_identity(&bundle, &cluster.name_any())?;
    let pool = instance
        .labels()
        .get(CLAIMED_BY)
        .cloned()
        .unwrap_or_default();
    let member = Member::from_instance(instance, &pool, role);
    // The last configured control-plane member cannot leave etcd gracefully.
    let other_cp = ctx
        .instances
        .state()
        .iter()
        .filter(|i| i.namespace().as_deref() == Some(ns.as_str()))
        .filter(|i| i.name_any() != member.name)
        .filter(|i| i.labels().get(CLAIMED_BY) == Some(&cluster.spec.control_plane.pool_ref.name))
        .any(|i| {
            i.status
                .as_ref()
                .is_some_and(|s| conditions::is_true(&s.conditions, ICond::Configured))
        });
    let graceful = crate::plan::graceful_reset(role, other_cp);
    machines::reset(ctx.machines.as_ref(), &member, &identity, graceful).await?;
    Ok(())
}

/// Adds or removes the finalizer.
async fn set_finalizer(
    api: &Api<Instance>,
    instance: &Instance,
    present: bool,
) -> Result<(), Error> {
    let result = if present {
        finalizer::add(api, instance, FINALIZER).await
    } else {
        finalizer::remove(api, instance, FINALIZER).await
    };
    result.map_err(Error::kube(format!(
        "update the finalizers of Instance {}",
        instance.name_any()
    )))
}

/// Logs, counts and backs off.
#[allow(
    clippy::needless_pass_by_value,
    reason = "the signature Controller::run requires"
)]
pub fn error_policy(instance: Arc<Instance>, err: &Error, ctx: Arc<Ctx>) -> Action {
    retry_after_backoff(
        &format!("instance/{}", object_key(instance.as_ref())),
        err,
        &ctx.metrics,
        &ctx.backoff,
    )
}

/// Runs the instance-reset controller until `shutdown` triggers, on `trigger` (the
/// Instances of the bootstrapper's one Instance watch, cached in `ctx.instances`).
pub async fn run(
    ctx: Arc<Ctx>,
    trigger: futures::stream::BoxStream<'static, Arc<Instance>>,
    shutdown: Shutdown,
) {
    let store = ctx.instances.clone();
    kontinuum_operator_common::operator::drain(
        Controller::for_shared_stream(trigger, store)
            .graceful_shutdown_on(async move { shutdown.wait().await })
            .run(reconcile, error_policy, ctx),
    )
    .await;
}
