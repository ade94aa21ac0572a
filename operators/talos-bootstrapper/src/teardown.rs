//! Teardown of a TalosCluster being deleted: every member (workers first) reset to
//! maintenance mode — gracefully, except the last control-plane member, which has no etcd
//! to leave — its conditions cleared, its Instance released or deleted; retried until the
//! teardown deadline ([`plan::Deadline`], shared with the instance-reset controller), after
//! which the finalizer goes anyway. Each member's step is the pure [`plan::teardown_step`];
//! its outcome is recorded in `status.teardown` and announced as an Event.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::jiff::Timestamp;
use kontinuum_crds::labels;
use kontinuum_crds::reasons::TalosClusterReason as Reason;
use kontinuum_crds::v1alpha2::{
    Instance, InstancePool, MachineTeardown, SECRETS_BUNDLE_KEY, TalosCluster, TeardownOutcome,
};
use kontinuum_operator_common::backoff::object_key;
use kontinuum_operator_common::claims::set_claim;
use kontinuum_operator_common::error::chain;
use kontinuum_operator_common::finalizer;
use kontinuum_operator_common::tracked::Forget as _;
use kontinuum_talos::ClientIdentity;
use kontinuum_talos_config::SecretsBundle;
use kube::api::DeleteParams;
use kube::runtime::controller::Action;
use kube::{Api, Resource as _, ResourceExt};
use tracing::{info, warn};

use crate::cluster::{
    FINALIZER, Run, own_conditions, owned_by, secret_name, write_member_conditions,
};
use crate::plan::{self, Member, Role, TeardownStep};
use crate::{Ctx, Error, FIELD_MANAGER, machines};

/// One teardown pass over the members: what each ended with.
struct Pass {
    outcomes: BTreeMap<String, MachineTeardown>,
    last_error: Option<String>,
    release_error: Option<Error>,
    control_planes: usize,
    control_planes_reset: usize,
}

/// Returns `None` when teardown is finished (the finalizer may go), else when to look again.
pub(crate) async fn cleanup(cluster: &TalosCluster, ctx: &Ctx) -> Result<Option<Action>, Error> {
    let mut run = Run::new(cluster, ctx);
    let now = Timestamp::now();
    let deleted_at = cluster.metadata.deletion_timestamp.as_ref().map(|t| t.0);
    let deadline = plan::Deadline::of(deleted_at, now, ctx.settings.teardown_timeout);
    let passed = deadline.passed(now);
    let order = members(&run);
    let identity = admin_identity(ctx, cluster).await?;
    let mut pass = Pass {
        outcomes: run
            .status
            .teardown
            .iter()
            .map(|t| (t.instance.clone(), t.clone()))
            .collect(),
        last_error: None,
        release_error: None,
        control_planes: order
            .iter()
            .filter(|m| m.role == Role::ControlPlane)
            .count(),
        control_planes_reset: 0,
    };
    for member in &order {
        pass.member(ctx, cluster, member, identity.as_ref(), passed)
            .await;
    }
    let pending: Vec<String> = pass
        .outcomes
        .values()
        .filter(|t| !finished(t.outcome))
        .filter(|t| order.iter().any(|m| m.name == t.instance))
        .map(|t| t.instance.clone())
        .collect();
    run.status.teardown = pass.outcomes.into_values().collect();
    if let Some(err) = pass.release_error {
        run.flush().await?;
        return Err(err);
    }
    if pending.is_empty() || passed {
        if !pending.is_empty() {
            gave_up(ctx, cluster, deadline, &pending).await;
        }
        remove_secret_finalizer(ctx, cluster).await?;
        ctx.last_healthy.forget(&object_key(cluster));
        info!("teardown finished");
        return Ok(None);
    }
    let waiting = plan::teardown_waiting(pending.len(), pass.last_error.as_deref(), deadline);
    run.set(
        waiting.condition,
        waiting.status,
        waiting.reason,
        waiting.message,
    );
    run.flush().await?;
    Ok(Some(Action::requeue(
        deadline.requeue(Timestamp::now(), ctx.settings.retry),
    )))
}

fn finished(outcome: TeardownOutcome) -> bool {
    matches!(outcome, TeardownOutcome::Reset | TeardownOutcome::Skipped)
}

impl Pass {
    /// Tears down one member: reset (unless finished, skipped or abandoned), then release.
    async fn member(
        &mut self,
        ctx: &Ctx,
        cluster: &TalosCluster,
        member: &Member,
        identity: Option<&ClientIdentity>,
        passed: bool,
    ) {
        let recorded = self.outcomes.get(&member.name).map(|t| t.outcome);
        let step = plan::teardown_step(recorded, member.configured, passed);
        let outcome = match step {
            TeardownStep::Finished(o) | TeardownStep::Abandon(o) => o,
            TeardownStep::Skip => TeardownOutcome::Skipped,
            TeardownStep::Reset => match self.reset(ctx, member, identity).await {
                Ok(()) => TeardownOutcome::Reset,
                Err((outcome, message)) => {
                    warn!(instance = %member.name, error = %message, "resetting a machine failed; retrying");
                    self.last_error = Some(format!("{}: {message}", member.name));
                    self.record(member, outcome, Some(message));
                    return;
                }
            },
        };
        if member.role == Role::ControlPlane && outcome == TeardownOutcome::Reset {
            self.control_planes_reset += 1;
        }
        if finished(outcome) && !matches!(step, TeardownStep::Finished(_)) {
            info!(instance = %member.name, outcome = outcome.as_str(), "machine torn down");
            let note = match outcome {
                TeardownOutcome::Reset => format!("reset {} to maintenance mode", member.name),
                _ => format!(
                    "skipped {}: never configured, nothing to reset",
                    member.name
                ),
            };
            let reference = cluster.object_ref(&());
            ctx.events
                .normal(&reference, outcome.as_str(), "Teardown", note)
                .await;
            self.record(member, outcome, None);
        }
        if (finished(outcome) || passed)
            && let Err(err) = release(ctx, cluster, member).await
        {
            warn!(instance = %member.name, error = &err as &dyn std::error::Error, "releasing a torn-down instance failed; retrying");
            self.release_error.get_or_insert(err);
        }
    }

    /// Resets `member`; on failure the outcome to record (`Unreachable` or `Failed`) and why.
    async fn reset(
        &self,
        ctx: &Ctx,
        member: &Member,
        identity: Option<&ClientIdentity>,
    ) -> Result<(), (TeardownOutcome, String)> {
        let Some(identity) = identity else {
            let why =
                "the cluster's secrets bundle is gone: the machine cannot be reached as os:admin";
            return Err((TeardownOutcome::Failed, why.to_owned()));
        };
        let others_left = self.control_planes_reset + 1 < self.control_planes;
        let graceful = plan::graceful_reset(member.role, others_left);
        machines::reset(ctx.machines.as_ref(), member, identity, graceful)
            .await
            .map(|_| ())
            .map_err(|e| {
                let outcome = if machines::unreachable(&e) {
                    TeardownOutcome::Unreachable
                } else {
                    TeardownOutcome::Failed
                };
                (outcome, chain(&e))
            })
    }

    fn record(&mut self, member: &Member, outcome: TeardownOutcome, message: Option<String>) {
        let entry = MachineTeardown {
            instance: member.name.clone(),
            outcome,
            message,
        };
        self.outcomes.insert(member.name.clone(), entry);
    }
}

/// Every member, in teardown order: claimed by a pool of the cluster, or configured by it
/// earlier (`status.configuredInstances`, an Instance some pool released since).
fn members(run: &Run<'_>) -> Vec<Member> {
    let cluster = run.cluster;
    let ns = cluster.namespace().unwrap_or_default();
    let instances = run.ctx.instances.state();
    let members = plan::members(cluster, &instances);
    let mut order: Vec<Member> = members.teardown_order().into_iter().cloned().collect();
    let recorded: BTreeSet<&String> = run.status.configured_instances.iter().collect();
    for extra in recorded {
        if order.iter().any(|m| &m.name == extra) {
            continue;
        }
        let found = instances
            .iter()
            .find(|i| i.namespace().as_deref() == Some(ns.as_str()) && &i.name_any() == extra);
        if let Some(i) = found {
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
    order
}

/// The cluster's admin identity, from its secrets bundle (`None` when it is gone).
async fn admin_identity(
    ctx: &Ctx,
    cluster: &TalosCluster,
) -> Result<Option<ClientIdentity>, Error> {
    let name = secret_name(&cluster.name_any());
    let secrets: Api<Secret> =
        Api::namespaced(ctx.client.clone(), &cluster.namespace().unwrap_or_default());
    let secret = secrets
        .get_opt(&name)
        .await
        .map_err(Error::kube(format!("read Secret {name}")))?;
    Ok(secret
        .as_ref()
        .and_then(|s| s.data.as_ref())
        .and_then(|d| d.get(SECRETS_BUNDLE_KEY))
        .and_then(|b| SecretsBundle::from_json(&b.0).ok())
        .and_then(|bundle| machines::admin_identity(&bundle, &cluster.name_any()).ok()))
}

/// The deadline passed with members not torn down: a Warning Event names them.
async fn gave_up(ctx: &Ctx, cluster: &TalosCluster, deadline: plan::Deadline, pending: &[String]) {
    let message = format!(
        "teardown deadline {deadline} passed; removed the finalizer, leaving {} as they are",
        pending.join(", ")
    );
    warn!(%message, "teardown gave up");
    let reference = cluster.object_ref(&());
    let reason = Reason::TeardownDeadlineExceeded.as_str();
    ctx.events
        .warning(&reference, reason, "Teardown", message)
        .await;
}

/// Clears this operator's conditions on a torn-down member, then releases its claim (or
/// deletes the Instance when the cluster unregisters its machines). A claim by a pool the
/// cluster owns is left to that pool: it is garbage-collected with the cluster and releases
/// its Instances itself, while releasing here would only let the dying pool claim the
/// machine again.
async fn release(ctx: &Ctx, cluster: &TalosCluster, member: &Member) -> Result<(), Error> {
    let unregister = cluster
        .spec
        .teardown
        .as_ref()
        .is_some_and(|t| t.unregister_instances);
    let ns = cluster.namespace().unwrap_or_default();
    let api: Api<Instance> = Api::namespaced(ctx.client.clone(), &ns);
    let name = &member.name;
    let Some(current) = api
        .get_opt(name)
        .await
        .map_err(Error::kube(format!("read Instance {name}")))?
    else {
        return Ok(());
    };
    let has_own = current
        .status
        .as_ref()
        .is_some_and(|s| !own_conditions(&s.conditions).is_empty());
    if has_own {
        write_member_conditions(&api, name, &[]).await?;
    }
    if unregister {
        return unregister_instance(&api, &current).await;
    }
    let Some(pool) = current.labels().get(labels::CLAIMED_BY) else {
        return Ok(());
    };
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
        .get(name)
        .await
        .map_err(Error::kube(format!("read Instance {name}")))?;
    set_claim(&api, name, fresh.resource_version(), None, FIELD_MANAGER)
        .await
        .map_err(Error::kube(format!("release Instance {name}")))?;
    Ok(())
}

async fn unregister_instance(api: &Api<Instance>, current: &Instance) -> Result<(), Error> {
    if current.metadata.deletion_timestamp.is_some() {
        return Ok(());
    }
    let name = current.name_any();
    match api.delete(&name, &DeleteParams::default()).await {
        Ok(_) => {
            info!(instance = %name, "unregistered instance");
            Ok(())
        }
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(source) => Err(Error::Kube {
            what: format!("delete Instance {name}"),
            source,
        }),
    }
}

async fn remove_secret_finalizer(ctx: &Ctx, cluster: &TalosCluster) -> Result<(), Error> {
    let name = secret_name(&cluster.name_any());
    let secrets: Api<Secret> =
        Api::namespaced(ctx.client.clone(), &cluster.namespace().unwrap_or_default());
    let Some(secret) = secrets
        .get_opt(&name)
        .await
        .map_err(Error::kube(format!("read Secret {name}")))?
    else {
        return Ok(());
    };
    finalizer::remove(&secrets, &secret, FINALIZER)
        .await
        .map_err(Error::kube(format!(
            "remove the finalizer of Secret {name}"
        )))
}
