//! Helpers for standard `metav1.Condition`s
//! ([`Condition`](k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition) itself, never a
//! copy of it).
//!
//! * [`new`] builds a condition; [`set`] merges it into a list so that `lastTransitionTime`
//!   moves only when the status flips. Both cap the message at [`MESSAGE_LIMIT`]
//!   characters ([`cap_message`]), so no controller can write a longer one.
//! * [`ready`] computes a kind's `Ready` summary from its gating conditions.
//! * [`eq_ignoring_time`] and [`status_eq_ignoring_time`] tell whether a status write is
//!   needed at all.
//!
//! The clock is always passed in (`now`): these functions are pure.

use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

/// The condition type every kind summarises itself with.
pub const READY: &str = "Ready";

/// The condition type that is True while an object's cleanup runs.
pub const DELETING: &str = "Deleting";

/// The reason of a condition that has not been evaluated yet.
pub const RECONCILING: &str = "Reconciling";

/// The most characters a condition message (or an Event note) may have (STYLE 3.3).
pub const MESSAGE_LIMIT: usize = 256;

/// Cuts `message` to at most [`MESSAGE_LIMIT`] characters, on a char boundary, ending a cut
/// message with `…`. A message within the limit is returned unchanged.
pub fn cap_message(mut message: String) -> String {
    if let Some((cut, _)) = message.char_indices().nth(MESSAGE_LIMIT - 1)
        && message[cut..].chars().nth(1).is_some()
    {
        message.truncate(cut);
        message.push('…');
    }
    message
}

/// The status of a condition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ConditionStatus {
    /// The condition holds.
    True,
    /// The condition does not hold.
    False,
    /// Not observed yet, or contact was lost.
    Unknown,
}

impl ConditionStatus {
    /// The string written to `status`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::True => "True",
            Self::False => "False",
            Self::Unknown => "Unknown",
        }
    }

    /// Parses a `status` string; anything but `True` or `False` is `Unknown`.
    pub fn parse(status: &str) -> Self {
        match status {
            "True" => Self::True,
            "False" => Self::False,
            _ => Self::Unknown,
        }
    }
}

impl From<bool> for ConditionStatus {
    fn from(value: bool) -> Self {
        if value { Self::True } else { Self::False }
    }
}

impl fmt::Display for ConditionStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A status that carries conditions.
pub trait HasConditions {
    /// The conditions.
    fn conditions(&self) -> &[Condition];
    /// The conditions, to change them.
    fn conditions_mut(&mut self) -> &mut Vec<Condition>;
}

/// Builds a condition. Its `lastTransitionTime` is a placeholder (the Unix epoch): [`set`]
/// stamps the real one. The message is capped by [`cap_message`].
pub fn new(
    type_: impl AsRef<str>,
    status: ConditionStatus,
    reason: impl AsRef<str>,
    message: impl Into<String>,
    observed_generation: Option<i64>,
) -> Condition {
    Condition {
        type_: type_.as_ref().to_owned(),
        status: status.as_str().to_owned(),
        reason: reason.as_ref().to_owned(),
        message: cap_message(message.into()),
        observed_generation,
        last_transition_time: Time(Timestamp::UNIX_EPOCH),
    }
}

/// The conditions of an object whose cleanup is under way: `Deleting=True` with `reason`
/// and `message`, and `Ready=False/Deleting` repeating the message (see [`ready`]).
pub fn set_deleting<G: AsRef<str>>(
    conditions: &mut Vec<Condition>,
    gates: &[G],
    reason: impl AsRef<str>,
    message: impl Into<String>,
    observed_generation: Option<i64>,
    now: &Time,
) {
    set(
        conditions,
        new(
            DELETING,
            ConditionStatus::True,
            reason,
            message,
            observed_generation,
        ),
        now,
    );
    let ready = ready(conditions, gates, true, observed_generation);
    set(conditions, ready, now);
}

/// Merges `condition` into `conditions`, replacing the entry of the same type.
///
/// `lastTransitionTime` becomes `now` when the condition is new or its status changed, and
/// is kept otherwise, even if the reason, message or observed generation changed. The
/// message is capped by [`cap_message`] (a condition may have been built without [`new`]).
/// Returns whether anything other than a timestamp changed.
pub fn set(conditions: &mut Vec<Condition>, mut condition: Condition, now: &Time) -> bool {
    condition.message = cap_message(std::mem::take(&mut condition.message));
    match conditions.iter_mut().find(|c| c.type_ == condition.type_) {
        None => {
            condition.last_transition_time = now.clone();
            conditions.push(condition);
            true
        }
        Some(existing) => {
            condition.last_transition_time = if existing.status == condition.status {
                existing.last_transition_time.clone()
            } else {
                now.clone()
            };
            let changed = !same_ignoring_time(existing, &condition);
            *existing = condition;
            changed
        }
    }
}

/// The condition of the given type, if present.
pub fn get(conditions: &[Condition], type_: impl AsRef<str>) -> Option<&Condition> {
    conditions.iter().find(|c| c.type_ == type_.as_ref())
}

/// The status of the condition of the given type; `Unknown` when absent.
pub fn status(conditions: &[Condition], type_: impl AsRef<str>) -> ConditionStatus {
    get(conditions, type_).map_or(ConditionStatus::Unknown, |c| {
        ConditionStatus::parse(&c.status)
    })
}

/// Whether the condition of the given type is present and True.
pub fn is_true(conditions: &[Condition], type_: impl AsRef<str>) -> bool {
    status(conditions, type_) == ConditionStatus::True
}

/// Removes the condition of the given type; returns whether it was present.
pub fn remove(conditions: &mut Vec<Condition>, type_: impl AsRef<str>) -> bool {
    let before = conditions.len();
    conditions.retain(|c| c.type_ != type_.as_ref());
    conditions.len() != before
}

/// Whether two condition lists say the same thing: same types with the same status, reason,
/// message and observed generation, in any order. `lastTransitionTime` is ignored.
pub fn eq_ignoring_time(a: &[Condition], b: &[Condition]) -> bool {
    a.len() == b.len()
        && a.iter()
            .all(|x| get(b, &x.type_).is_some_and(|y| same_ignoring_time(x, y)))
}

/// Whether two statuses are equal once condition timestamps and order are ignored: the test
/// a controller runs before writing a status.
pub fn status_eq_ignoring_time<S>(a: &S, b: &S) -> bool
where
    S: HasConditions + Clone + PartialEq,
{
    normalized(a) == normalized(b)
}

/// `status` with condition timestamps zeroed and conditions sorted by type: two statuses are
/// [`status_eq_ignoring_time`] exactly when their normalized forms are equal.
pub fn normalized<S: HasConditions + Clone>(status: &S) -> S {
    let mut status = status.clone();
    let conditions = status.conditions_mut();
    for condition in conditions.iter_mut() {
        condition.last_transition_time = Time(Timestamp::UNIX_EPOCH);
    }
    conditions.sort_by(|x, y| x.type_.cmp(&y.type_));
    status
}

/// Computes the `Ready` summary of an object from its gating conditions.
///
/// * `Ready=False`, reason `Deleting`, when `deleting` (the message of the `Deleting`
///   condition, if any, says what cleanup waits for);
/// * otherwise the status, reason and message of the first gate, in `gates` order, that is
///   not True (a gate not reported yet is `Unknown`/`Reconciling`);
/// * otherwise `Ready=True`, reason `Ready`.
///
/// The result goes through [`set`] like any other condition.
pub fn ready<G: AsRef<str>>(
    conditions: &[Condition],
    gates: &[G],
    deleting: bool,
    observed_generation: Option<i64>,
) -> Condition {
    if deleting {
        let message = get(conditions, DELETING)
            .map(|c| c.message.as_str())
            .filter(|m| !m.is_empty())
            .unwrap_or("the object is being deleted");
        return new(
            READY,
            ConditionStatus::False,
            DELETING,
            message,
            observed_generation,
        );
    }
    for gate in gates {
        let gate = gate.as_ref();
        match get(conditions, gate) {
            None => {
                return new(
                    READY,
                    ConditionStatus::Unknown,
                    RECONCILING,
                    format!("{gate} has not been reported yet"),
                    observed_generation,
                );
            }
            Some(c) if c.status != ConditionStatus::True.as_str() => {
                let status = ConditionStatus::parse(&c.status);
                let reason = if c.reason.is_empty() {
                    RECONCILING
                } else {
                    &c.reason
                };
                let message = if c.message.is_empty() {
                    format!("{gate} is {status}")
                } else {
                    c.message.clone()
                };
                return new(READY, status, reason, message, observed_generation);
            }
            Some(_) => {}
        }
    }
    let names: Vec<&str> = gates.iter().map(AsRef::as_ref).collect();
    let message = if names.is_empty() {
        "ready".to_owned()
    } else {
        format!("{} True", names.join(", "))
    };
    new(
        READY,
        ConditionStatus::True,
        READY,
        message,
        observed_generation,
    )
}

fn same_ignoring_time(a: &Condition, b: &Condition) -> bool {
    a.type_ == b.type_
        && a.status == b.status
        && a.reason == b.reason
        && a.message == b.message
        && a.observed_generation == b.observed_generation
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reasons::{ZoneCondition, ZoneReason};
    use crate::v1alpha2::ZoneStatus;
    use ConditionStatus::{False, True, Unknown};

    fn at(seconds: i64) -> Time {
        Time(Timestamp::from_second(seconds).unwrap())
    }

    fn installed(status: ConditionStatus, reason: ZoneReason, generation: i64) -> Condition {
        new(
            ZoneCondition::Installed,
            status,
            reason,
            "msg",
            Some(generation),
        )
    }

    #[test]
    fn messages_are_capped_on_a_char_boundary() {
        let short = "é".repeat(MESSAGE_LIMIT);
        assert_eq!(cap_message(short.clone()), short, "at the limit: unchanged");

        let long = format!("{}{}", "a".repeat(MESSAGE_LIMIT - 2), "ééé");
        let capped = cap_message(long);
        assert_eq!(capped.chars().count(), MESSAGE_LIMIT);
        assert!(capped.ends_with("aé…"), "{capped}");

        let built = new(READY, False, RECONCILING, "x".repeat(10_000), None);
        assert_eq!(built.message.chars().count(), MESSAGE_LIMIT);
        assert!(built.message.ends_with('…'));

        // A condition built by hand is capped when it is set.
        let mut raw = installed(False, ZoneReason::InstallFailed, 1);
        raw.message = "ü".repeat(1000);
        let mut conditions = Vec::new();
        set(&mut conditions, raw, &at(1));
        assert_eq!(conditions[0].message.chars().count(), MESSAGE_LIMIT);
        assert!(conditions[0].message.ends_with('…'));
    }

    #[test]
    fn set_adds_a_new_condition_stamped_now() {
        let mut conditions = Vec::new();
        assert!(set(
            &mut conditions,
            installed(Unknown, ZoneReason::Reconciling, 1),
            &at(10)
        ));
        assert_eq!(conditions.len(), 1);
        assert_eq!(conditions[0].last_transition_time, at(10));
        assert_eq!(conditions[0].status, "Unknown");
        assert_eq!(conditions[0].reason, "Reconciling");
        assert_eq!(conditions[0].observed_generation, Some(1));
    }

    #[test]
    fn set_moves_the_transition_time_only_when_the_status_flips() {
        let mut conditions = Vec::new();
        set(
            &mut conditions,
            installed(False, ZoneReason::InstallFailed, 1),
            &at(10),
        );

        // Same status, new reason, message and generation: written, time kept.
        let mut next = installed(False, ZoneReason::WaitingForCertificate, 2);
        next.message = "waiting".into();
        assert!(set(&mut conditions, next, &at(20)));
        assert_eq!(conditions[0].last_transition_time, at(10));
        assert_eq!(conditions[0].reason, "WaitingForCertificate");
        assert_eq!(conditions[0].message, "waiting");
        assert_eq!(conditions[0].observed_generation, Some(2));

        // Flip: time moves.
        assert!(set(
            &mut conditions,
            installed(True, ZoneReason::Installed, 2),
            &at(30)
        ));
        assert_eq!(conditions[0].last_transition_time, at(30));
        assert_eq!(conditions.len(), 1);
    }

    #[test]
    fn set_reports_no_change_for_an_identical_condition() {
        let mut conditions = Vec::new();
        set(
            &mut conditions,
            installed(True, ZoneReason::Installed, 3),
            &at(10),
        );
        let before = conditions.clone();
        assert!(!set(
            &mut conditions,
            installed(True, ZoneReason::Installed, 3),
            &at(99)
        ));
        assert_eq!(conditions, before);
    }

    #[test]
    fn lookups() {
        let mut conditions = Vec::new();
        set(
            &mut conditions,
            installed(True, ZoneReason::Installed, 1),
            &at(1),
        );
        assert!(is_true(&conditions, ZoneCondition::Installed));
        assert_eq!(status(&conditions, ZoneCondition::ClusterReady), Unknown);
        assert!(get(&conditions, "Installed").is_some());
        assert!(remove(&mut conditions, ZoneCondition::Installed));
        assert!(!remove(&mut conditions, ZoneCondition::Installed));
        assert!(conditions.is_empty());
        assert_eq!(ConditionStatus::parse("bogus"), Unknown);
        assert_eq!(ConditionStatus::from(true), True);
    }

    #[test]
    fn eq_ignoring_time_ignores_time_and_order_only() {
        let a = vec![
            installed(True, ZoneReason::Installed, 1),
            new(
                ZoneCondition::Ready,
                False,
                ZoneReason::WaitingForRegistry,
                "m",
                Some(1),
            ),
        ];
        let mut b: Vec<Condition> = a.iter().rev().cloned().collect();
        b[0].last_transition_time = at(500);
        assert!(eq_ignoring_time(&a, &b));

        b[0].message = "other".into();
        assert!(!eq_ignoring_time(&a, &b));
        assert!(!eq_ignoring_time(&a, &a[..1]));
        let mut c = a.clone();
        c[0].observed_generation = Some(2);
        assert!(!eq_ignoring_time(&a, &c));
    }

    #[test]
    fn status_eq_ignoring_time_compares_the_other_fields() {
        let mut a = ZoneStatus {
            observed_generation: Some(1),
            ..ZoneStatus::default()
        };
        set(
            &mut a.conditions,
            installed(True, ZoneReason::Installed, 1),
            &at(1),
        );
        let mut b = a.clone();
        b.conditions[0].last_transition_time = at(2);
        assert!(status_eq_ignoring_time(&a, &b));
        b.observed_generation = Some(2);
        assert!(!status_eq_ignoring_time(&a, &b));
    }

    fn zone_conditions(
        statuses: [(ZoneCondition, ConditionStatus, ZoneReason); 3],
    ) -> Vec<Condition> {
        let mut conditions = Vec::new();
        for (type_, status, reason) in statuses {
            let message = format!("{type_} says {reason}");
            set(
                &mut conditions,
                new(type_, status, reason, message, Some(4)),
                &at(1),
            );
        }
        conditions
    }

    #[test]
    fn ready_is_true_when_every_gate_is_true() {
        let conditions = zone_conditions([
            (ZoneCondition::ClusterReady, True, ZoneReason::ClusterReady),
            (ZoneCondition::Installed, True, ZoneReason::Installed),
            (
                ZoneCondition::RegistryJoined,
                True,
                ZoneReason::RegistryJoined,
            ),
        ]);
        let summary = ready(&conditions, ZoneCondition::READY_GATES, false, Some(4));
        assert_eq!(summary.type_, "Ready");
        assert_eq!(summary.status, "True");
        assert_eq!(summary.reason, "Ready");
        assert_eq!(
            summary.message,
            "ClusterReady, Installed, RegistryJoined True"
        );
        assert_eq!(summary.observed_generation, Some(4));
    }

    #[test]
    fn ready_reports_the_first_failing_gate() {
        let conditions = zone_conditions([
            (ZoneCondition::ClusterReady, True, ZoneReason::ClusterReady),
            (
                ZoneCondition::Installed,
                False,
                ZoneReason::WaitingForCertificate,
            ),
            (
                ZoneCondition::RegistryJoined,
                Unknown,
                ZoneReason::Reconciling,
            ),
        ]);
        let summary = ready(&conditions, ZoneCondition::READY_GATES, false, Some(4));
        assert_eq!(summary.status, "False");
        assert_eq!(summary.reason, "WaitingForCertificate");
        assert_eq!(summary.message, "Installed says WaitingForCertificate");

        let conditions = zone_conditions([
            (
                ZoneCondition::ClusterReady,
                Unknown,
                ZoneReason::Reconciling,
            ),
            (ZoneCondition::Installed, False, ZoneReason::InstallFailed),
            (
                ZoneCondition::RegistryJoined,
                True,
                ZoneReason::RegistryJoined,
            ),
        ]);
        let summary = ready(&conditions, ZoneCondition::READY_GATES, false, None);
        assert_eq!(summary.status, "Unknown");
        assert_eq!(summary.reason, "Reconciling");
    }

    #[test]
    fn ready_is_unknown_while_a_gate_is_missing() {
        let conditions = vec![new(
            ZoneCondition::ClusterReady,
            True,
            ZoneReason::ClusterReady,
            "",
            None,
        )];
        let summary = ready(&conditions, ZoneCondition::READY_GATES, false, None);
        assert_eq!(summary.status, "Unknown");
        assert_eq!(summary.reason, "Reconciling");
        assert_eq!(summary.message, "Installed has not been reported yet");
    }

    #[test]
    fn ready_is_false_while_deleting_even_if_every_gate_is_true() {
        let mut conditions = zone_conditions([
            (ZoneCondition::ClusterReady, True, ZoneReason::ClusterReady),
            (ZoneCondition::Installed, True, ZoneReason::Installed),
            (
                ZoneCondition::RegistryJoined,
                True,
                ZoneReason::RegistryJoined,
            ),
        ]);
        let summary = ready(&conditions, ZoneCondition::READY_GATES, true, Some(5));
        assert_eq!(
            (summary.status.as_str(), summary.reason.as_str()),
            ("False", "Deleting")
        );
        assert_eq!(summary.message, "the object is being deleted");

        let waiting = "waiting for the TalosCluster to be deleted";
        set(
            &mut conditions,
            new(
                ZoneCondition::Deleting,
                True,
                ZoneReason::Deleting,
                waiting,
                Some(5),
            ),
            &at(2),
        );
        let summary = ready(&conditions, ZoneCondition::READY_GATES, true, Some(5));
        assert_eq!(summary.message, waiting);
    }

    #[test]
    fn ready_goes_false_again_when_a_gate_degrades() {
        let mut conditions = zone_conditions([
            (ZoneCondition::ClusterReady, True, ZoneReason::ClusterReady),
            (ZoneCondition::Installed, True, ZoneReason::Installed),
            (
                ZoneCondition::RegistryJoined,
                True,
                ZoneReason::RegistryJoined,
            ),
        ]);
        let up = ready(&conditions, ZoneCondition::READY_GATES, false, Some(1));
        set(&mut conditions, up, &at(10));
        let degraded = new(
            ZoneCondition::ClusterReady,
            False,
            ZoneReason::WaitingForTalosCluster,
            "down",
            Some(1),
        );
        set(&mut conditions, degraded, &at(20));
        let down = ready(&conditions, ZoneCondition::READY_GATES, false, Some(1));
        assert!(set(&mut conditions, down, &at(20)));
        let summary = get(&conditions, READY).unwrap();
        assert_eq!(
            (
                summary.status.as_str(),
                summary.last_transition_time.clone()
            ),
            ("False", at(20))
        );
    }
}
