//! The hub's decisions, pure (no I/O, no clock: `now` is passed in): from the Kontinuum
//! objects in the namespace, the registrations in the store and the hub's own entry, what
//! to apply, write and delete. [`hub`](crate::hub) observes, calls [`plan`], and acts.
//!
//! * The hub's own entry (`--name`): exists while the hub runs, role `ControlPlane`, its
//!   heartbeat, version and published config; re-created whenever it is missing.
//! * Every registration: a `Kontinuum` `<region>.<zone>.<name>`, labelled with
//!   [`labels::REGION`], [`labels::ZONE`] and [`MIRROR_LABEL`], spec region and zone from the
//!   key, status role `Worker` and the heartbeat, version and config of the value.
//! * Once the store has been listed, a mirrored object without a registration is deleted
//!   (deregistration, lease expiry, or keys removed while the hub was down).
//! * Time-to-live: an entry whose last heartbeat (or creation) is `ttl` old is deleted, and
//!   for a registration its store key too (at the revision seen, so a fresh heartbeat wins);
//!   from `ttl / 2` on, its `Heartbeating` condition is `False`/`HeartbeatStale`. The hub's
//!   own live entry is exempt.
//! * Conditions (all owned by the registry): `Heartbeating`, `Ready` (its summary) and
//!   `Deleting` (written True just before an entry is deleted; absent otherwise).
//! * Statuses are written only when they differ from the object's (condition times
//!   ignored), so a pass that changes nothing writes nothing.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kontinuum_crds::conditions::{self, ConditionStatus};
use kontinuum_crds::labels;
use kontinuum_crds::reasons::{KontinuumCondition as Cond, KontinuumReason as Reason};
use kontinuum_crds::v1alpha2::{
    Kontinuum, KontinuumConfig, KontinuumRole, KontinuumSpec, KontinuumStatus,
};
use kube::ResourceExt as _;

use crate::record::Mirrored;

/// Label on every `Kontinuum` mirrored from a registration (value `"true"`): only these
/// are deleted when their registration is gone.
pub const MIRROR_LABEL: &str = "kontinuum.sh/registry-mirror";

/// The hub's own entry, as it should be now.
#[derive(Clone, Debug, PartialEq)]
pub struct HubEntry {
    /// The object's name (`--name`).
    pub name: String,
    /// The last heartbeat.
    pub last_heartbeat: Timestamp,
    /// The hub's version.
    pub version: String,
    /// The hub's published config.
    pub config: KontinuumConfig,
}

/// What [`plan`] looks at.
#[derive(Clone, Copy, Debug)]
pub struct Inputs<'a> {
    /// The hub's own entry; `None` while shutting down (it is then never re-created).
    pub hub: Option<&'a HubEntry>,
    /// Every `Kontinuum` in the namespace.
    pub objects: &'a [Arc<Kontinuum>],
    /// The store's registrations by object name; `None` until the store has been listed.
    pub registrations: Option<&'a BTreeMap<String, Mirrored>>,
    /// Now.
    pub now: Timestamp,
    /// Time-to-live of an entry without a heartbeat, in seconds.
    pub ttl_seconds: i64,
}

/// Why an entry is removed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Removal {
    /// Its registration left the store.
    Deregistered,
    /// Its heartbeat is older than the time-to-live.
    Expired,
    /// The hub is shutting down (its own entry).
    Shutdown,
    /// An object holds the hub's name but is not a hub entry (it has a region and zone).
    Squatting,
}

impl Removal {
    /// The `Deleting` condition's message.
    pub fn message(self, ttl_seconds: i64) -> String {
        match self {
            Self::Deregistered => "the registration left the Kontinuum store".into(),
            Self::Expired => format!("no heartbeat for {ttl_seconds}s"),
            Self::Shutdown => "the hub is shutting down".into(),
            Self::Squatting => "the object holds the hub's name but names a zone".into(),
        }
    }
}

/// One step of a plan.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Server-side apply the object's labels and spec (creating it if missing).
    Apply {
        /// Object name.
        name: String,
        /// Labels this controller owns.
        labels: BTreeMap<String, String>,
        /// The spec.
        spec: KontinuumSpec,
    },
    /// Server-side apply `/status` with exactly these fields.
    Status {
        /// Object name.
        name: String,
        /// The fields to own.
        status: Box<KontinuumStatus>,
        /// Whether this is the hub's own heartbeat.
        heartbeat: bool,
    },
    /// Delete the object (with this uid as a precondition).
    Delete {
        /// Object name.
        name: String,
        /// Its uid, when it exists.
        uid: Option<String>,
        /// Why.
        why: Removal,
    },
    /// Delete a stale registration from the store, if it still holds this revision.
    DeleteKey {
        /// The store key.
        key: String,
        /// The revision the sweep judged.
        mod_revision: i64,
    },
}

/// The actions of one pass, and when the next pass is due at the latest (the next moment
/// an entry turns stale or expires).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    /// What to do, in order.
    pub actions: Vec<Action>,
    /// When to look again even if nothing changes.
    pub next_wakeup: Option<Timestamp>,
}

impl Plan {
    fn wake_at(&mut self, at: Timestamp) {
        self.next_wakeup = Some(self.next_wakeup.map_or(at, |w| w.min(at)));
    }
}

/// The labels of a mirrored object.
pub fn mirror_labels(region: &str, zone: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (labels::REGION.to_owned(), region.to_owned()),
        (labels::ZONE.to_owned(), zone.to_owned()),
        (MIRROR_LABEL.to_owned(), "true".to_owned()),
        (
            labels::APP_MANAGED_BY.to_owned(),
            labels::KONTINUUM.to_owned(),
        ),
    ])
}

/// The labels of the hub's own entry.
pub fn hub_labels() -> BTreeMap<String, String> {
    BTreeMap::from([(
        labels::APP_MANAGED_BY.to_owned(),
        labels::KONTINUUM.to_owned(),
    )])
}

const OURS: [Cond; 3] = [Cond::Heartbeating, Cond::Ready, Cond::Deleting];

fn is_ours(c: &Condition) -> bool {
    OURS.iter().any(|o| o.as_str() == c.type_)
}

/// Seconds after the last heartbeat at which an entry counts as stale.
pub fn stale_after(ttl_seconds: i64) -> i64 {
    (ttl_seconds / 2).max(1)
}

/// Our conditions for an entry last heard of at `last`: `Heartbeating` and `Ready`, plus
/// `Deleting` when `removal` is set. Transition times are kept from `current`.
fn conditions_for(
    current: &[Condition],
    last: Timestamp,
    removal: Option<Removal>,
    generation: Option<i64>,
    now: Timestamp,
    ttl_seconds: i64,
) -> Vec<Condition> {
    let now_time = Time(now);
    let mut out: Vec<Condition> = current.iter().filter(|c| is_ours(c)).cloned().collect();
    let age = now.as_second() - last.as_second();
    let stale = stale_after(ttl_seconds);
    let heartbeating = if age < stale {
        conditions::new(
            Cond::Heartbeating,
            ConditionStatus::True,
            Reason::HeartbeatReceived,
            format!("the last heartbeat is less than {stale}s old"),
            generation,
        )
    } else {
        conditions::new(
            Cond::Heartbeating,
            ConditionStatus::False,
            Reason::HeartbeatStale,
            format!(
                "no heartbeat for {stale}s; the entry is removed {ttl_seconds}s after its last heartbeat"
            ),
            generation,
        )
    };
    conditions::set(&mut out, heartbeating, &now_time);
    match removal {
        Some(why) => {
            conditions::set(
                &mut out,
                conditions::new(
                    Cond::Deleting,
                    ConditionStatus::True,
                    Reason::Deleting,
                    why.message(ttl_seconds),
                    generation,
                ),
                &now_time,
            );
        }
        None => {
            conditions::remove(&mut out, Cond::Deleting);
        }
    }
    let ready = conditions::ready(&out, Cond::READY_GATES, removal.is_some(), generation);
    conditions::set(&mut out, ready, &now_time);
    out
}

/// What a full status (hub or mirrored entry) holds besides conditions.
struct Reported {
    role: KontinuumRole,
    last: Timestamp,
    version: Option<String>,
    config: Option<KontinuumConfig>,
}

/// The status this controller owns on `object`, from `current`: all fields for the hub and
/// mirrored entries (`reported`), only the conditions for any other entry.
fn desired_status(
    object: Option<&Kontinuum>,
    reported: Option<&Reported>,
    last: Timestamp,
    removal: Option<Removal>,
    now: Timestamp,
    ttl_seconds: i64,
) -> KontinuumStatus {
    let current = object.and_then(|o| o.status.as_ref());
    // An object about to be created starts at generation 1.
    let generation = object.map_or(Some(1), |o| o.metadata.generation);
    let conditions = conditions_for(
        current.map_or(&[][..], |s| &s.conditions),
        last,
        removal,
        generation,
        now,
        ttl_seconds,
    );
    match reported {
        Some(r) => KontinuumStatus {
            conditions,
            observed_generation: generation,
            role: Some(r.role),
            last_heartbeat_time: Some(Time(r.last)),
            version: r.version.clone(),
            secret_ref: None,
            config: r.config.clone(),
        },
        None => KontinuumStatus {
            conditions,
            ..KontinuumStatus::default()
        },
    }
}

/// The part of `current` that `desired` claims (the same fields), to compare the two.
fn owned_part(current: Option<&KontinuumStatus>, full: bool) -> KontinuumStatus {
    let Some(current) = current else {
        return KontinuumStatus::default();
    };
    let conditions = current
        .conditions
        .iter()
        .filter(|c| is_ours(c))
        .cloned()
        .collect();
    if full {
        KontinuumStatus {
            conditions,
            secret_ref: None,
            ..current.clone()
        }
    } else {
        KontinuumStatus {
            conditions,
            ..KontinuumStatus::default()
        }
    }
}

fn needs_write(object: Option<&Kontinuum>, desired: &KontinuumStatus, full: bool) -> bool {
    let current = owned_part(object.and_then(|o| o.status.as_ref()), full);
    !conditions::status_eq_ignoring_time(&current, desired)
}

fn labels_hold(object: &Kontinuum, wanted: &BTreeMap<String, String>) -> bool {
    let have = object.labels();
    wanted.iter().all(|(k, v)| have.get(k) == Some(v))
}

fn location_spec(region: &str, zone: &str) -> KontinuumSpec {
    KontinuumSpec {
        region: Some(region.to_owned()),
        zone: Some(zone.to_owned()),
    }
}

fn has_location(spec: &KontinuumSpec) -> bool {
    KontinuumRole::for_location(spec.region.as_deref(), spec.zone.as_deref())
        == KontinuumRole::Worker
}

/// The last sign of life of an object: its `lastHeartbeatTime`, else its creation.
fn last_seen(object: &Kontinuum) -> Option<Timestamp> {
    object
        .status
        .as_ref()
        .and_then(|s| s.last_heartbeat_time.as_ref())
        .or(object.metadata.creation_timestamp.as_ref())
        .map(|t| t.0)
}

/// Deletes `object` (after writing its `Deleting` condition).
fn remove(
    plan: &mut Plan,
    object: &Kontinuum,
    reported: Option<&Reported>,
    last: Timestamp,
    why: Removal,
    inputs: &Inputs<'_>,
) {
    let status = desired_status(
        Some(object),
        reported,
        last,
        Some(why),
        inputs.now,
        inputs.ttl_seconds,
    );
    plan.actions.push(Action::Status {
        name: object.name_any(),
        status: Box::new(status),
        heartbeat: false,
    });
    plan.actions.push(Action::Delete {
        name: object.name_any(),
        uid: object.metadata.uid.clone(),
        why,
    });
}

/// An entry the registry keeps: the hub's own or a mirror.
struct Entry<'a> {
    name: &'a str,
    labels: BTreeMap<String, String>,
    spec: KontinuumSpec,
    reported: &'a Reported,
    heartbeat: bool,
}

/// Keeps an entry's object in shape: applies labels and spec when missing or different,
/// writes the status when it differs.
fn maintain(plan: &mut Plan, entry: &Entry<'_>, object: Option<&Kontinuum>, inputs: &Inputs<'_>) {
    let reshape = object.is_none_or(|o| !labels_hold(o, &entry.labels) || o.spec != entry.spec);
    if reshape {
        plan.actions.push(Action::Apply {
            name: entry.name.to_owned(),
            labels: entry.labels.clone(),
            spec: entry.spec.clone(),
        });
    }
    let status = desired_status(
        object,
        Some(entry.reported),
        entry.reported.last,
        None,
        inputs.now,
        inputs.ttl_seconds,
    );
    if object.is_none() || needs_write(object, &status, true) {
        plan.actions.push(Action::Status {
            name: entry.name.to_owned(),
            status: Box::new(status),
            heartbeat: entry.heartbeat,
        });
    }
}

/// When `last` next changes state (turns stale, then expires), if that is still ahead.
fn next_transition(last: Timestamp, now: Timestamp, ttl_seconds: i64) -> Option<Timestamp> {
    [stale_after(ttl_seconds), ttl_seconds]
        .into_iter()
        .filter_map(|after| Timestamp::from_second(last.as_second().saturating_add(after)).ok())
        .find(|at| *at > now)
}

/// What the hub does to its own entry on graceful shutdown: write `Deleting`, then delete
/// it (nothing when it is already gone).
pub fn deregister(
    hub: &HubEntry,
    object: Option<&Kontinuum>,
    now: Timestamp,
    ttl_seconds: i64,
) -> Vec<Action> {
    let Some(object) = object else {
        return Vec::new();
    };
    let reported = Reported {
        role: KontinuumRole::ControlPlane,
        last: hub.last_heartbeat,
        version: Some(hub.version.clone()),
        config: Some(hub.config.clone()),
    };
    let inputs = Inputs {
        hub: None,
        objects: &[],
        registrations: None,
        now,
        ttl_seconds,
    };
    let mut plan = Plan::default();
    remove(
        &mut plan,
        object,
        Some(&reported),
        hub.last_heartbeat,
        Removal::Shutdown,
        &inputs,
    );
    plan.actions
}

/// Plans one pass. Deterministic: objects and registrations are visited in name order.
pub fn plan(inputs: &Inputs<'_>) -> Plan {
    let mut plan = Plan::default();
    let by_name: BTreeMap<String, &Kontinuum> = inputs
        .objects
        .iter()
        .map(|o| (o.name_any(), o.as_ref()))
        .collect();
    if let Some(hub) = inputs.hub {
        plan_hub(&mut plan, hub, by_name.get(&hub.name).copied(), inputs);
    }
    for (name, m) in inputs.registrations.into_iter().flatten() {
        plan_registration(&mut plan, name, m, by_name.get(name).copied(), inputs);
    }
    for (name, object) in &by_name {
        let handled = inputs.hub.is_some_and(|h| &h.name == name)
            || inputs.registrations.is_some_and(|r| r.contains_key(name));
        if !handled {
            plan_other(&mut plan, name, object, inputs);
        }
    }
    plan
}

fn live(object: &Kontinuum) -> bool {
    object.metadata.deletion_timestamp.is_none()
}

/// The hub's own entry: kept in shape; an object squatting its name is replaced.
fn plan_hub(plan: &mut Plan, hub: &HubEntry, object: Option<&Kontinuum>, inputs: &Inputs<'_>) {
    match object {
        Some(o) if !live(o) => {}
        Some(o) if has_location(&o.spec) => {
            let last = last_seen(o).unwrap_or(inputs.now);
            remove(plan, o, None, last, Removal::Squatting, inputs);
        }
        _ => {
            let reported = Reported {
                role: KontinuumRole::ControlPlane,
                last: hub.last_heartbeat,
                version: Some(hub.version.clone()),
                config: Some(hub.config.clone()),
            };
            let entry = Entry {
                name: &hub.name,
                labels: hub_labels(),
                spec: KontinuumSpec::default(),
                reported: &reported,
                heartbeat: true,
            };
            maintain(plan, &entry, object, inputs);
        }
    }
}

/// One registration: mirrored while fresh; swept with its key once expired.
fn plan_registration(
    plan: &mut Plan,
    name: &str,
    m: &Mirrored,
    object: Option<&Kontinuum>,
    inputs: &Inputs<'_>,
) {
    if object.is_some_and(|o| !live(o)) {
        return;
    }
    let reported = Reported {
        role: KontinuumRole::Worker,
        last: m.last_heartbeat,
        version: m.version.clone(),
        config: m.config.clone(),
    };
    let age = inputs.now.as_second() - m.last_heartbeat.as_second();
    if age >= inputs.ttl_seconds {
        if let Some(o) = object {
            remove(
                plan,
                o,
                Some(&reported),
                m.last_heartbeat,
                Removal::Expired,
                inputs,
            );
        }
        plan.actions.push(Action::DeleteKey {
            key: m.key.key(),
            mod_revision: m.mod_revision,
        });
        return;
    }
    if let Some(at) = next_transition(m.last_heartbeat, inputs.now, inputs.ttl_seconds) {
        plan.wake_at(at);
    }
    let entry = Entry {
        name,
        labels: mirror_labels(m.key.region(), m.key.zone()),
        spec: location_spec(m.key.region(), m.key.zone()),
        reported: &reported,
        heartbeat: false,
    };
    maintain(plan, &entry, object, inputs);
}

/// Any other object: a mirror whose registration is gone (once the store was listed), or
/// an entry living by its own heartbeat until the time-to-live.
fn plan_other(plan: &mut Plan, name: &str, object: &Kontinuum, inputs: &Inputs<'_>) {
    if !live(object) {
        return;
    }
    let last = last_seen(object).unwrap_or(inputs.now);
    let mirrored = object
        .labels()
        .get(MIRROR_LABEL)
        .is_some_and(|v| v == "true");
    if mirrored && inputs.registrations.is_some() {
        // Everything this controller wrote stays until the object is gone (an apply
        // without a field would remove it).
        let reported = object.status.as_ref().map(|s| Reported {
            role: s.role.unwrap_or(KontinuumRole::Worker),
            last,
            version: s.version.clone(),
            config: s.config.clone(),
        });
        remove(
            plan,
            object,
            reported.as_ref(),
            last,
            Removal::Deregistered,
            inputs,
        );
        return;
    }
    let age = inputs.now.as_second() - last.as_second();
    if age >= inputs.ttl_seconds {
        remove(plan, object, None, last, Removal::Expired, inputs);
        return;
    }
    if let Some(at) = next_transition(last, inputs.now, inputs.ttl_seconds) {
        plan.wake_at(at);
    }
    let status = desired_status(
        Some(object),
        None,
        last,
        None,
        inputs.now,
        inputs.ttl_seconds,
    );
    if needs_write(Some(object), &status, false) {
        plan.actions.push(Action::Status {
            name: name.to_owned(),
            status: Box::new(status),
            heartbeat: false,
        });
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;
    use crate::record::RegistrationKey;

    const TTL: i64 = 300;

    /// `object` after `status` was applied to it by this controller, as the API server
    /// would merge it.
    fn applied(object: &Kontinuum, status: &KontinuumStatus) -> Kontinuum {
        let mut out = object.clone();
        let mut merged = out.status.take().unwrap_or_default();
        merged.conditions.retain(|c| !is_ours(c));
        merged.conditions.extend(status.conditions.iter().cloned());
        if status.role.is_some() {
            merged.role = status.role;
            merged
                .last_heartbeat_time
                .clone_from(&status.last_heartbeat_time);
            merged.version.clone_from(&status.version);
            merged.config.clone_from(&status.config);
            merged.observed_generation = status.observed_generation;
        }
        out.status = Some(merged);
        out
    }

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(s).unwrap()
    }

    const NOW: i64 = 1_800_000_000;

    fn hub(last: i64) -> HubEntry {
        HubEntry {
            name: "hub".into(),
            last_heartbeat: at(last),
            version: "0.1.0".into(),
            config: KontinuumConfig::default(),
        }
    }

    fn registration(zone: &str, last: i64, rev: i64) -> (String, Mirrored) {
        let key = RegistrationKey::new("eu", zone, "agent").unwrap();
        (
            key.object_name(),
            Mirrored {
                key,
                mod_revision: rev,
                version: Some("0.1.0".into()),
                last_heartbeat: at(last),
                config: None,
                mismatched: false,
            },
        )
    }

    fn object(name: &str, labels: BTreeMap<String, String>, spec: KontinuumSpec) -> Kontinuum {
        Kontinuum {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                uid: Some(format!("uid-{name}")),
                generation: Some(1),
                creation_timestamp: Some(Time(at(NOW - 10))),
                labels: Some(labels),
                ..ObjectMeta::default()
            },
            spec,
            status: None,
        }
    }

    /// Applies a plan's Apply and Status actions to `objects` and drops the deleted ones,
    /// as the API server would (creation gives generation 1 and a creation time).
    fn execute(objects: &mut Vec<Arc<Kontinuum>>, plan: &Plan, now: i64) {
        for action in &plan.actions {
            match action {
                Action::Apply { name, labels, spec } => {
                    let mut o = objects.iter().find(|o| o.name_any() == *name).map_or_else(
                        || {
                            let mut o = object(name, BTreeMap::new(), spec.clone());
                            o.metadata.creation_timestamp = Some(Time(at(now)));
                            o
                        },
                        |o| (**o).clone(),
                    );
                    o.metadata
                        .labels
                        .get_or_insert_default()
                        .extend(labels.clone());
                    o.spec = spec.clone();
                    objects.retain(|x| x.name_any() != *name);
                    objects.push(Arc::new(o));
                }
                Action::Status { name, status, .. } => {
                    if let Some(i) = objects.iter().position(|o| o.name_any() == *name) {
                        let updated = applied(&objects[i], status);
                        objects[i] = Arc::new(updated);
                    }
                }
                Action::Delete { name, .. } => objects.retain(|o| o.name_any() != *name),
                Action::DeleteKey { .. } => {}
            }
        }
        objects.sort_by_key(|o| o.name_any());
    }

    fn inputs<'a>(
        hub: Option<&'a HubEntry>,
        objects: &'a [Arc<Kontinuum>],
        registrations: Option<&'a BTreeMap<String, Mirrored>>,
        now: i64,
    ) -> Inputs<'a> {
        Inputs {
            hub,
            objects,
            registrations,
            now: at(now),
            ttl_seconds: TTL,
        }
    }

    fn names(plan: &Plan) -> Vec<String> {
        plan.actions
            .iter()
            .map(|a| match a {
                Action::Apply { name, .. } => format!("apply {name}"),
                Action::Status { name, .. } => format!("status {name}"),
                Action::Delete { name, why, .. } => format!("delete {name} {why:?}"),
                Action::DeleteKey { key, mod_revision } => format!("delkey {key}@{mod_revision}"),
            })
            .collect()
    }

    #[test]
    fn a_new_hub_registers_then_plans_nothing() {
        let hub = hub(NOW);
        let mut objects = Vec::new();
        let first = plan(&inputs(Some(&hub), &objects, None, NOW));
        assert_eq!(names(&first), ["apply hub", "status hub"]);
        let Action::Status {
            status, heartbeat, ..
        } = &first.actions[1]
        else {
            panic!()
        };
        assert!(heartbeat);
        assert_eq!(status.role, Some(KontinuumRole::ControlPlane));
        assert_eq!(status.last_heartbeat_time, Some(Time(at(NOW))));
        assert_eq!(status.version.as_deref(), Some("0.1.0"));
        let ready = conditions::get(&status.conditions, "Ready").unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("True", "Ready")
        );
        assert_eq!(
            conditions::get(&status.conditions, "Heartbeating")
                .unwrap()
                .reason,
            "HeartbeatReceived"
        );
        execute(&mut objects, &first, NOW);
        // Idempotent: the same world plans nothing, even later.
        assert_eq!(
            plan(&inputs(Some(&hub), &objects, None, NOW + 5)).actions,
            []
        );
    }

    #[test]
    fn a_heartbeat_writes_only_the_hub_status() {
        let mut objects = Vec::new();
        let first = plan(&inputs(Some(&hub(NOW)), &objects, None, NOW));
        execute(&mut objects, &first, NOW);
        let later = hub(NOW + 60);
        let next = plan(&inputs(Some(&later), &objects, None, NOW + 60));
        assert_eq!(names(&next), ["status hub"]);
        execute(&mut objects, &next, NOW + 60);
        assert_eq!(
            plan(&inputs(Some(&later), &objects, None, NOW + 61)).actions,
            []
        );
    }

    #[test]
    fn a_deleted_hub_entry_is_recreated_but_not_while_shutting_down() {
        let hub = hub(NOW);
        assert_eq!(
            names(&plan(&inputs(Some(&hub), &[], None, NOW))),
            ["apply hub", "status hub"]
        );
        assert_eq!(plan(&inputs(None, &[], None, NOW)).actions, []);
    }

    #[test]
    fn registrations_are_mirrored_with_the_key_location() {
        let regs: BTreeMap<_, _> = [registration("1a", NOW - 5, 7)].into();
        let mut objects = Vec::new();
        let first = plan(&inputs(None, &objects, Some(&regs), NOW));
        assert_eq!(names(&first), ["apply eu.1a.agent", "status eu.1a.agent"]);
        let Action::Apply { labels, spec, .. } = &first.actions[0] else {
            panic!()
        };
        assert_eq!(spec, &location_spec("eu", "1a"));
        assert_eq!(labels[kontinuum_crds::labels::REGION], "eu");
        assert_eq!(labels[MIRROR_LABEL], "true");
        let Action::Status { status, .. } = &first.actions[1] else {
            panic!()
        };
        assert_eq!(status.role, Some(KontinuumRole::Worker));
        assert_eq!(status.last_heartbeat_time, Some(Time(at(NOW - 5))));
        assert_eq!(first.next_wakeup, Some(at(NOW - 5 + TTL / 2)));
        execute(&mut objects, &first, NOW);
        assert_eq!(
            plan(&inputs(None, &objects, Some(&regs), NOW + 1)).actions,
            []
        );

        // A label removed by someone else is restored; a new heartbeat is written.
        let mut tampered = (*objects[0]).clone();
        tampered
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .remove(MIRROR_LABEL);
        let tampered = vec![Arc::new(tampered)];
        assert_eq!(
            names(&plan(&inputs(None, &tampered, Some(&regs), NOW))),
            ["apply eu.1a.agent"]
        );
        let beat: BTreeMap<_, _> = [registration("1a", NOW, 8)].into();
        assert_eq!(
            names(&plan(&inputs(None, &objects, Some(&beat), NOW))),
            ["status eu.1a.agent"]
        );
    }

    #[test]
    fn deregistered_mirrors_are_deleted_only_after_the_store_was_listed() {
        let regs: BTreeMap<_, _> = [registration("1a", NOW, 7)].into();
        let mut objects = Vec::new();
        let first = plan(&inputs(None, &objects, Some(&regs), NOW));
        execute(&mut objects, &first, NOW);
        // Not listed yet (a restart): left alone.
        assert_eq!(plan(&inputs(None, &objects, None, NOW + 1)).actions, []);
        let empty = BTreeMap::new();
        let gone = plan(&inputs(None, &objects, Some(&empty), NOW + 1));
        assert_eq!(
            names(&gone),
            ["status eu.1a.agent", "delete eu.1a.agent Deregistered"]
        );
        let Action::Status { status, .. } = &gone.actions[0] else {
            panic!()
        };
        let deleting = conditions::get(&status.conditions, "Deleting").unwrap();
        assert_eq!(
            (deleting.status.as_str(), deleting.reason.as_str()),
            ("True", "Deleting")
        );
        let ready = conditions::get(&status.conditions, "Ready").unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", "Deleting")
        );
        assert_eq!(
            status.role,
            Some(KontinuumRole::Worker),
            "the full status is kept"
        );
        let Action::Delete { uid, .. } = &gone.actions[1] else {
            panic!()
        };
        assert_eq!(uid.as_deref(), Some("uid-eu.1a.agent"));
    }

    #[test]
    fn stale_registrations_turn_stale_then_are_swept_with_their_key() {
        let regs: BTreeMap<_, _> = [registration("1a", NOW, 7)].into();
        let mut objects = Vec::new();
        let first = plan(&inputs(None, &objects, Some(&regs), NOW));
        execute(&mut objects, &first, NOW);

        let half = NOW + TTL / 2;
        let stale = plan(&inputs(None, &objects, Some(&regs), half));
        assert_eq!(names(&stale), ["status eu.1a.agent"]);
        let Action::Status { status, .. } = &stale.actions[0] else {
            panic!()
        };
        let hb = conditions::get(&status.conditions, "Heartbeating").unwrap();
        assert_eq!(
            (hb.status.as_str(), hb.reason.as_str()),
            ("False", "HeartbeatStale")
        );
        assert_eq!(
            conditions::get(&status.conditions, "Ready").unwrap().reason,
            "HeartbeatStale"
        );
        assert_eq!(stale.next_wakeup, Some(at(NOW + TTL)));
        execute(&mut objects, &stale, half);
        assert_eq!(
            plan(&inputs(None, &objects, Some(&regs), half + 1)).actions,
            []
        );

        let swept = plan(&inputs(None, &objects, Some(&regs), NOW + TTL));
        assert_eq!(
            names(&swept),
            [
                "status eu.1a.agent",
                "delete eu.1a.agent Expired",
                "delkey /kontinuum.sh/zones/eu/1a/registry/agent@7"
            ]
        );
        // Once deleted, the stale registration is not mirrored again.
        execute(&mut objects, &swept, NOW + TTL);
        assert_eq!(
            names(&plan(&inputs(None, &objects, Some(&regs), NOW + TTL + 1))),
            ["delkey /kontinuum.sh/zones/eu/1a/registry/agent@7"]
        );
    }

    #[test]
    fn other_entries_live_by_their_heartbeat_or_creation() {
        let hub = hub(NOW);
        let mut old_hub = object("old-hub", BTreeMap::new(), KontinuumSpec::default());
        old_hub.metadata.creation_timestamp = Some(Time(at(NOW - 1000)));
        old_hub.status = Some(KontinuumStatus {
            last_heartbeat_time: Some(Time(at(NOW - TTL))),
            secret_ref: Some(kontinuum_crds::v1alpha2::LocalRef::new("s")),
            ..KontinuumStatus::default()
        });
        let fresh = object("fresh", BTreeMap::new(), location_spec("us", "2b"));
        let mut ours = vec![Arc::new(old_hub), Arc::new(fresh)];
        let first = plan(&inputs(Some(&hub), &ours, Some(&BTreeMap::new()), NOW));
        assert_eq!(
            names(&first),
            [
                "apply hub",
                "status hub",
                "status fresh",
                "status old-hub",
                "delete old-hub Expired"
            ]
        );
        // Someone else's entry only gets conditions.
        let Action::Status { status, .. } = &first.actions[2] else {
            panic!()
        };
        assert_eq!(
            (status.role.is_none(), status.config.is_none()),
            (true, true)
        );
        assert_eq!(first.next_wakeup, Some(at(NOW - 10 + TTL / 2)));
        execute(&mut ours, &first, NOW);
        assert_eq!(
            plan(&inputs(Some(&hub), &ours, Some(&BTreeMap::new()), NOW)).actions,
            []
        );
        // Not labelled as a mirror: kept until its time-to-live, even once listed.
        assert_eq!(ours.len(), 2);
    }

    #[test]
    fn an_object_squatting_the_hub_name_is_replaced() {
        let hub = hub(NOW);
        let squatter = object("hub", BTreeMap::new(), location_spec("eu", "1a"));
        let objects = vec![Arc::new(squatter)];
        assert_eq!(
            names(&plan(&inputs(Some(&hub), &objects, None, NOW))),
            ["status hub", "delete hub Squatting"]
        );
    }

    #[test]
    fn objects_being_deleted_are_left_alone() {
        let hub = hub(NOW);
        let mut dying = object("hub", hub_labels(), KontinuumSpec::default());
        dying.metadata.deletion_timestamp = Some(Time(at(NOW)));
        let objects = vec![Arc::new(dying)];
        assert_eq!(plan(&inputs(Some(&hub), &objects, None, NOW)).actions, []);
    }
}
