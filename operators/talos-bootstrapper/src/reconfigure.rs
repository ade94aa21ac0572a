//! Rolling a changed machine config onto a running cluster: when a patch (or anything else
//! the config is rendered from) changes, each configured, joined member whose config it
//! changes is sent its new config in place (ApplyConfiguration, mode AUTO, as `os:admin`:
//! Talos applies it live or reboots when it must), one machine per pass, workers first and
//! control planes last, after a member that rebooted answers again. The first failure halts
//! the roll (`ConfigUpToDate=False/ReconfigureFailed`). Nothing is re-bootstrapped and the
//! secrets bundle is never touched: only the config changes. `status.machineConfigs`
//! records the hash of what each member was last sent.
//!
//! [`next`] is the pure decision; [`step`] carries it out.

use std::time::Duration;

use kontinuum_crds::conditions::{self, ConditionStatus};
use kontinuum_crds::reasons::{TalosClusterCondition as Cond, TalosClusterReason as Reason};
use kontinuum_crds::v1alpha2::{MachineConfigStatus, TalosClusterStatus};
use kontinuum_operator_common::error::chain;
use kontinuum_talos::ClientIdentity;
use kontinuum_talos_config::SecretsBundle;
use kube::Resource as _;
use tracing::{info, warn};

use crate::cluster::Run;
use crate::machines::{self, ClusterInput};
use crate::plan::{Member, Members};

/// Records that `instance` was sent the config with `hash`.
pub fn record(status: &mut TalosClusterStatus, instance: &str, hash: String, rebooting: bool) {
    let entry = MachineConfigStatus {
        instance: instance.to_owned(),
        hash,
        rebooting,
    };
    if let Some(existing) = status
        .machine_configs
        .iter_mut()
        .find(|e| e.instance == instance)
    {
        *existing = entry;
        return;
    }
    status.machine_configs.push(entry);
    status
        .machine_configs
        .sort_by(|a, b| a.instance.cmp(&b.instance));
}

/// What the roll does next.
#[derive(Debug, PartialEq, Eq)]
pub enum Next<'a> {
    /// Every member runs its current config.
    UpToDate,
    /// `instance` was rebooted by its new config: ask whether it answers before going on.
    AwaitReboot(&'a str),
    /// Send `member` its new config (the `index`-th of `order`).
    Apply(usize),
}

/// Pure: the next step of the roll over `order` (members with their desired hashes, workers
/// first), given what `recorded` says each was sent. A member with no record (configured
/// before hashes were recorded) counts as running its current config.
pub fn next<'a>(order: &[(&Member, String)], recorded: &'a [MachineConfigStatus]) -> Next<'a> {
    if let Some(rebooting) = recorded.iter().find(|r| r.rebooting) {
        return Next::AwaitReboot(&rebooting.instance);
    }
    let stale = order.iter().position(|(member, desired)| {
        recorded
            .iter()
            .find(|r| r.instance == member.name)
            .is_some_and(|r| r.hash != *desired)
    });
    stale.map_or(Next::UpToDate, Next::Apply)
}

/// The members the roll covers, in its order: joined workers by pool, then joined control
/// planes.
fn order(members: &Members) -> Vec<&Member> {
    let workers = members.workers.iter().flat_map(|(_, ms)| ms.iter());
    workers
        .chain(members.control_plane.iter())
        .filter(|m| m.configured && m.joined)
        .collect()
}

/// One pass of the roll, on a bootstrapped cluster whose control plane is healthy (else
/// nothing happens). Returns how soon the roll needs the next pass, if it does (a halted
/// roll waits for a change of the cluster or its Instances, which wake it anyway).
pub(crate) async fn step(
    run: &mut Run<'_>,
    members: &Members,
    input: &ClusterInput,
    bundle: &SecretsBundle,
    identity: &ClientIdentity,
) -> Option<Duration> {
    let healthy = conditions::is_true(&run.status.conditions, Cond::ControlPlaneReady);
    if !healthy || run.cluster.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let mut order_with_hash = Vec::new();
    let mut configs = Vec::new();
    for member in order(members) {
        match machines::machine_config(input, bundle, member) {
            Ok(config) => {
                if !run
                    .status
                    .machine_configs
                    .iter()
                    .any(|r| r.instance == member.name)
                {
                    // Configured before hashes were recorded: what it runs is taken as current.
                    record(
                        &mut run.status,
                        &member.name,
                        machines::config_hash(&config),
                        false,
                    );
                }
                order_with_hash.push((member, machines::config_hash(&config)));
                configs.push(config);
            }
            Err(err) => {
                let message = format!(
                    "halted at {}: {}; the other machines keep what they run",
                    member.name,
                    chain(&err)
                );
                failed(run, message).await;
                return None;
            }
        }
    }
    match next(&order_with_hash, &run.status.machine_configs) {
        Next::UpToDate => {
            run.set(
                Cond::ConfigUpToDate,
                ConditionStatus::True,
                Reason::ConfigUpToDate,
                "every machine runs its current config",
            );
            None
        }
        Next::AwaitReboot(name) => {
            let name = name.to_owned();
            let member = order_with_hash.iter().find(|(m, _)| m.name == name);
            let back = match member {
                Some((m, _)) => run.ctx.machines.version(m, identity).await.is_ok(),
                // No longer a joined member: nothing to wait for.
                None => true,
            };
            if back {
                if let Some(entry) = run
                    .status
                    .machine_configs
                    .iter_mut()
                    .find(|e| e.instance == name)
                {
                    entry.rebooting = false;
                }
                return Some(Duration::ZERO);
            }
            run.set(
                Cond::ConfigUpToDate,
                ConditionStatus::False,
                Reason::Reconfiguring,
                format!("waiting for {name} to come back from the reboot its new config needed"),
            );
            Some(run.ctx.settings.retry)
        }
        Next::Apply(i) => {
            let (member, hash) = (order_with_hash[i].0, order_with_hash[i].1.clone());
            apply(
                run,
                member,
                hash,
                configs[i].expose().as_bytes(),
                identity,
                order_with_hash.len() - i - 1,
            )
            .await
        }
    }
}

/// Sends `member` its changed config and records the outcome.
async fn apply(
    run: &mut Run<'_>,
    member: &Member,
    hash: String,
    config: &[u8],
    identity: &ClientIdentity,
    after: usize,
) -> Option<Duration> {
    run.set(
        Cond::ConfigUpToDate,
        ConditionStatus::False,
        Reason::Reconfiguring,
        format!("applying the changed machine config to {}", member.name),
    );
    match run.ctx.machines.reconfigure(member, identity, config).await {
        Ok(rebooting) => {
            info!(instance = %member.name, rebooting, "changed machine config applied in place");
            record(&mut run.status, &member.name, hash, rebooting);
            let how = if rebooting {
                "with a reboot"
            } else {
                "without a reboot"
            };
            run.set(
                Cond::ConfigUpToDate,
                ConditionStatus::False,
                Reason::Reconfiguring,
                format!(
                    "applied the changed machine config to {} {how}; {after} to check after it",
                    member.name
                ),
            );
            let reference = run.cluster.object_ref(&());
            run.ctx
                .events
                .normal(
                    &reference,
                    "Reconfigured",
                    "Reconfigure",
                    format!(
                        "applied the changed machine config to {} {how}",
                        member.name
                    ),
                )
                .await;
            Some(Duration::ZERO)
        }
        Err(err) => {
            warn!(instance = %member.name, error = &err as &dyn std::error::Error, "a running machine refused its changed config; the roll halts");
            let message = format!(
                "halted at {}: it refused its changed machine config: {}; the other machines keep what they run",
                member.name,
                chain(&err)
            );
            failed(run, message).await;
            None
        }
    }
}

/// The roll halts with `message` (a Warning Event once per message): it resumes on a change
/// of the cluster or its Instances.
async fn failed(run: &mut Run<'_>, message: String) {
    let old = conditions::get(&run.status.conditions, Cond::ConfigUpToDate)
        .map(|c| (c.reason.clone(), c.message.clone()));
    if old
        != Some((
            Reason::ReconfigureFailed.as_str().to_owned(),
            message.clone(),
        ))
    {
        let reference = run.cluster.object_ref(&());
        run.ctx
            .events
            .warning(
                &reference,
                Reason::ReconfigureFailed.as_str(),
                "Reconfigure",
                message.clone(),
            )
            .await;
    }
    run.set(
        Cond::ConfigUpToDate,
        ConditionStatus::False,
        Reason::ReconfigureFailed,
        message,
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::Role;

    fn member(name: &str) -> Member {
        Member {
            name: name.into(),
            pool: "p".into(),
            role: Role::Worker,
            address: Some("192.0.2.1".into()),
            discovered: false,
            configured: true,
            joined: true,
            talos_version: None,
            identity: None,
            config_patches: Vec::new(),
        }
    }

    fn sent(instance: &str, hash: &str, rebooting: bool) -> MachineConfigStatus {
        MachineConfigStatus {
            instance: instance.into(),
            hash: hash.into(),
            rebooting,
        }
    }

    #[test]
    fn the_roll_takes_the_first_stale_member_in_order_after_any_reboot() {
        let (w, cp) = (member("w-1"), member("cp-1"));
        let order = [(&w, "new".to_owned()), (&cp, "new".to_owned())];
        let rows: [(&[MachineConfigStatus], Next<'_>); 6] = [
            (&[], Next::UpToDate),
            (
                &[sent("w-1", "new", false), sent("cp-1", "new", false)],
                Next::UpToDate,
            ),
            // Workers first: both stale, the worker goes.
            (
                &[sent("w-1", "old", false), sent("cp-1", "old", false)],
                Next::Apply(0),
            ),
            (
                &[sent("w-1", "new", false), sent("cp-1", "old", false)],
                Next::Apply(1),
            ),
            // One still rebooting holds up the next.
            (
                &[sent("w-1", "new", true), sent("cp-1", "old", false)],
                Next::AwaitReboot("w-1"),
            ),
            // Unrecorded: taken as current.
            (&[sent("cp-1", "new", false)], Next::UpToDate),
        ];
        for (recorded, want) in rows {
            assert_eq!(next(&order, recorded), want, "{recorded:?}");
        }
    }

    #[test]
    fn recording_replaces_and_keeps_the_list_sorted() {
        let mut status = TalosClusterStatus::default();
        record(&mut status, "w-2", "a".into(), false);
        record(&mut status, "cp-1", "b".into(), true);
        record(&mut status, "w-2", "c".into(), false);
        assert_eq!(
            status.machine_configs,
            [sent("cp-1", "b", true), sent("w-2", "c", false)]
        );
    }
}
