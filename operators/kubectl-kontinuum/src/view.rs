//! The `--wait` view, pure: a [`Snapshot`] of the conditions of a Zone, its TalosCluster
//! and its Addons; a multi-line [`frame`] of it (redrawn in place on a terminal); the
//! [`changes`] between two snapshots (appended lines when not on a terminal); and the
//! condition that blocks a zone ([`ready_blocker`], [`removal_blocker`]) for the one-line
//! timeout error.

use std::fmt::Write as _;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kontinuum_crds::conditions::{self, ConditionStatus};
use kontinuum_crds::reasons::{AddonCondition, TalosClusterCondition, ZoneCondition};
use kontinuum_crds::v1alpha2::{Addon, TalosCluster, Zone};
use kube::ResourceExt as _;

use crate::style::Style;

/// The predecessor's negative-polarity teardown condition type, still shown if present.
pub const LEGACY_TEARDOWN: &str = "Teardown";

/// One object of the view.
#[derive(Clone, Debug, PartialEq)]
pub struct ObjectState {
    /// Kind, e.g. `Zone`.
    pub kind: &'static str,
    /// Object name.
    pub name: String,
    /// Whether the object exists.
    pub exists: bool,
    /// Whether the object is being deleted.
    pub deleting: bool,
    /// Its conditions, in the kind's documented order.
    pub conditions: Vec<Condition>,
}

/// Everything the view shows: the Zone, then its TalosCluster, then its Addons by name.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Snapshot {
    /// The objects, in display order.
    pub objects: Vec<ObjectState>,
}

/// Builds the snapshot of zone `name`: its Zone, the TalosCluster of the same name and the
/// Addons of that cluster (by `spec.talosClusterRef` or owner reference) among `addons`.
pub fn snapshot(
    name: &str,
    zone: Option<&Zone>,
    cluster: Option<&TalosCluster>,
    addons: &[Addon],
) -> Snapshot {
    let mut objects = vec![
        state(
            "Zone",
            name,
            zone.map(|z| {
                (
                    z.metadata.deletion_timestamp.is_some(),
                    z.status.as_ref().map(|s| s.conditions.as_slice()),
                )
            }),
            ZoneCondition::ALL.iter().map(|c| c.as_str()),
        ),
        state(
            "TalosCluster",
            name,
            cluster.map(|c| {
                (
                    c.metadata.deletion_timestamp.is_some(),
                    c.status.as_ref().map(|s| s.conditions.as_slice()),
                )
            }),
            TalosClusterCondition::ALL.iter().map(|c| c.as_str()),
        ),
    ];
    let mut ours: Vec<&Addon> = addons.iter().filter(|a| belongs_to(a, name)).collect();
    ours.sort_by_key(|a| a.name_any());
    for addon in ours {
        objects.push(state(
            "Addon",
            &addon.name_any(),
            Some((
                addon.metadata.deletion_timestamp.is_some(),
                addon.status.as_ref().map(|s| s.conditions.as_slice()),
            )),
            AddonCondition::ALL.iter().map(|c| c.as_str()),
        ));
    }
    Snapshot { objects }
}

/// Whether `addon` belongs to the TalosCluster `cluster`.
pub fn belongs_to(addon: &Addon, cluster: &str) -> bool {
    addon.spec.talos_cluster_ref.name == cluster
        || addon
            .owner_references()
            .iter()
            .any(|o| o.kind == "TalosCluster" && o.name == cluster)
}

fn state<'a>(
    kind: &'static str,
    name: &str,
    found: Option<(bool, Option<&[Condition]>)>,
    order: impl Iterator<Item = &'a str>,
) -> ObjectState {
    let (exists, deleting, conditions) = match found {
        None => (false, false, Vec::new()),
        Some((deleting, conditions)) => (true, deleting, conditions.unwrap_or_default().to_vec()),
    };
    ObjectState {
        kind,
        name: name.to_owned(),
        exists,
        deleting,
        conditions: ordered(conditions, order),
    }
}

/// `conditions` in the documented order of their kind, unknown types last by name.
fn ordered<'a>(
    mut conditions: Vec<Condition>,
    order: impl Iterator<Item = &'a str>,
) -> Vec<Condition> {
    let order: Vec<&str> = order.collect();
    conditions.sort_by(|a, b| {
        let rank = |c: &Condition| {
            order
                .iter()
                .position(|t| *t == c.type_)
                .unwrap_or(order.len())
        };
        rank(a).cmp(&rank(b)).then_with(|| a.type_.cmp(&b.type_))
    });
    conditions
}

/// The frame of `snapshot` under `title`: one header line per object and one line per
/// condition (type, status, reason, message), each cut to `width` columns so that a
/// terminal never wraps it (a wrapped line would break redrawing in place).
pub fn frame(title: &str, snapshot: &Snapshot, style: Style, width: usize) -> Vec<String> {
    let type_width = column_width(snapshot, |c| c.type_.len());
    let reason_width = column_width(snapshot, |c| c.reason.len());
    let mut lines = vec![truncate(title, width)];
    for object in &snapshot.objects {
        let mut header = format!("{} {}", object.kind, object.name);
        if object.deleting {
            header.push_str(" (deleting)");
        }
        lines.push(style.bold(&truncate(&header, width)));
        if !object.exists {
            lines.push(truncate("  not created yet", width));
            continue;
        }
        if object.conditions.is_empty() {
            lines.push(truncate("  no status reported yet", width));
            continue;
        }
        for c in &object.conditions {
            let prefix = format!(
                "  {:type_width$}  {:7}  {:reason_width$}  ",
                c.type_, c.status, c.reason
            );
            let message = fold(&c.message);
            let plain = truncate(&format!("{prefix}{message}"), width);
            // Colour the status column only; the rest keeps its cut.
            let start = 2 + type_width + 2;
            let status_end = start + c.status.len();
            let line = if plain.len() >= status_end && plain.is_char_boundary(status_end) {
                format!(
                    "{}{}{}",
                    &plain[..start],
                    style.status(ConditionStatus::parse(&c.status), &c.status),
                    &plain[status_end..]
                )
            } else {
                plain
            };
            lines.push(line.trim_end().to_owned());
        }
    }
    lines
}

fn column_width(snapshot: &Snapshot, len: impl Fn(&Condition) -> usize) -> usize {
    snapshot
        .objects
        .iter()
        .flat_map(|o| o.conditions.iter())
        .map(len)
        .max()
        .unwrap_or(0)
}

/// What to write to a terminal to replace a frame of `previous_lines` lines with `lines`:
/// the cursor goes up to the old frame's first line, clears to the end of the screen and
/// draws the new frame.
pub fn redraw(previous_lines: usize, lines: &[String]) -> String {
    let mut out = String::new();
    if previous_lines > 0 {
        let _ = write!(out, "\x1b[{previous_lines}A\r\x1b[J");
    }
    for line in lines {
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// The change lines between `before` and `after`, prefixed with `elapsed`: an object that
/// appeared or disappeared, and every condition that is new or whose status, reason or
/// message changed.
pub fn changes(before: &Snapshot, after: &Snapshot, elapsed: Duration) -> Vec<String> {
    let at = format!("[{:>6}]", format_elapsed(elapsed));
    let mut lines = Vec::new();
    for object in &after.objects {
        let previous = before
            .objects
            .iter()
            .find(|o| o.kind == object.kind && o.name == object.name);
        let existed = previous.is_some_and(|p| p.exists);
        let label = format!("{} {}", object.kind, object.name);
        if object.exists && !existed {
            lines.push(format!("{at} {label}: created"));
        }
        if !object.exists && existed {
            lines.push(format!("{at} {label}: gone"));
        }
        if object.deleting && !previous.is_some_and(|p| p.deleting) {
            lines.push(format!("{at} {label}: deleting"));
        }
        for c in &object.conditions {
            let old = previous.and_then(|p| conditions::get(&p.conditions, &c.type_));
            let changed = old.is_none_or(|o| {
                o.status != c.status || o.reason != c.reason || o.message != c.message
            });
            if changed {
                lines.push(format!("{at} {label}: {}", describe_condition(c)));
            }
        }
    }
    for object in &before.objects {
        let still_listed = after
            .objects
            .iter()
            .any(|o| o.kind == object.kind && o.name == object.name);
        if object.exists && !still_listed {
            lines.push(format!("{at} {} {}: gone", object.kind, object.name));
        }
    }
    lines
}

/// `Type=Status (Reason): message`, on one line.
pub fn describe_condition(c: &Condition) -> String {
    let message = fold(&c.message);
    if message.is_empty() {
        format!("{}={} ({})", c.type_, c.status, c.reason)
    } else {
        format!("{}={} ({}): {message}", c.type_, c.status, c.reason)
    }
}

/// Whether the zone of `snapshot` is Ready.
pub fn zone_ready(snapshot: &Snapshot) -> bool {
    snapshot
        .objects
        .iter()
        .find(|o| o.kind == "Zone")
        .is_some_and(|z| z.exists && conditions::is_true(&z.conditions, ZoneCondition::Ready))
}

/// Whether the Zone of `snapshot` is gone.
pub fn zone_gone(snapshot: &Snapshot) -> bool {
    gone(snapshot, "Zone")
}

/// Whether the zone's removal has finished: the Zone is gone and so is its TalosCluster.
/// The Zone's finalizer goes once it has *issued* the TalosCluster's deletion; the
/// TalosCluster's own finalizer then resets and releases the machines, so only its going
/// means the machines are back in maintenance.
pub fn zone_removed(snapshot: &Snapshot) -> bool {
    gone(snapshot, "Zone") && gone(snapshot, "TalosCluster")
}

fn gone(snapshot: &Snapshot, kind: &str) -> bool {
    snapshot
        .objects
        .iter()
        .find(|o| o.kind == kind)
        .is_none_or(|o| !o.exists)
}

/// The deepest condition that keeps the zone from being Ready: the first Zone gate that is
/// not True; for `ClusterReady`, the TalosCluster's first gate that is not True; for its
/// `AddonsReady`, the first Addon that is not Ready and its first gate that is not True.
pub fn ready_blocker(snapshot: &Snapshot) -> String {
    let find = |kind: &str| snapshot.objects.iter().find(|o| o.kind == kind);
    let Some(zone) = find("Zone").filter(|z| z.exists) else {
        return "the Zone does not exist".to_owned();
    };
    if zone.conditions.is_empty() {
        return format!(
            "Zone {} reports no status yet (is the zone-installer running?)",
            zone.name
        );
    }
    let Some(gate) = first_not_true(zone, ZoneCondition::READY_GATES) else {
        return match conditions::get(&zone.conditions, ZoneCondition::Ready) {
            Some(ready) => format!("Zone {} {}", zone.name, describe_condition(ready)),
            None => format!("Zone {} has no Ready condition yet", zone.name),
        };
    };
    let zone_line = gate_line(zone, gate.as_str());
    if gate != ZoneCondition::ClusterReady {
        return zone_line;
    }
    let Some(cluster) = find("TalosCluster").filter(|c| c.exists) else {
        return zone_line;
    };
    let Some(cluster_gate) = first_not_true(cluster, TalosClusterCondition::READY_GATES) else {
        return zone_line;
    };
    let cluster_line = gate_line(cluster, cluster_gate.as_str());
    if cluster_gate != TalosClusterCondition::AddonsReady {
        return cluster_line;
    }
    snapshot
        .objects
        .iter()
        .filter(|o| o.kind == "Addon")
        .find_map(|addon| {
            first_not_true(addon, AddonCondition::READY_GATES)
                .map(|gate| gate_line(addon, gate.as_str()))
        })
        .unwrap_or(cluster_line)
}

/// Why the removal has not finished: the Zone's `Deleting` (or legacy `Teardown`)
/// condition while the Zone is there, then its TalosCluster's `Deleting` condition (the
/// machines being reset); their messages carry the teardown deadline.
pub fn removal_blocker(snapshot: &Snapshot) -> String {
    let existing = |kind: &str| snapshot.objects.iter().find(|o| o.kind == kind && o.exists);
    let (object, progress): (_, &[&str]) = if let Some(zone) = existing("Zone") {
        (zone, &[ZoneCondition::Deleting.as_str(), LEGACY_TEARDOWN])
    } else if let Some(cluster) = existing("TalosCluster") {
        (cluster, &[TalosClusterCondition::Deleting.as_str()])
    } else {
        return "the Zone and its TalosCluster are gone".to_owned();
    };
    progress
        .iter()
        .find_map(|t| conditions::get(&object.conditions, t))
        .map_or_else(
            || {
                format!(
                    "{} {} reports no teardown progress yet",
                    object.kind, object.name
                )
            },
            |c| format!("{} {} {}", object.kind, object.name, describe_condition(c)),
        )
}

fn first_not_true<G: AsRef<str> + Copy>(object: &ObjectState, gates: &[G]) -> Option<G> {
    gates
        .iter()
        .copied()
        .find(|g| !conditions::is_true(&object.conditions, g))
}

fn gate_line(object: &ObjectState, gate: &str) -> String {
    match conditions::get(&object.conditions, gate) {
        Some(c) => format!("{} {} {}", object.kind, object.name, describe_condition(c)),
        None => format!("{} {} {gate} not reported yet", object.kind, object.name),
    }
}

/// `90s` → `1m30s`; under a minute, seconds only.
pub fn format_elapsed(elapsed: Duration) -> String {
    let secs = elapsed.as_secs();
    if secs < 60 {
        format!("{secs}s")
    } else if secs < 3600 {
        format!("{}m{:02}s", secs / 60, secs % 60)
    } else {
        format!("{}h{:02}m", secs / 3600, (secs % 3600) / 60)
    }
}

fn fold(text: &str) -> String {
    crate::error::fold_lines(text)
}

/// `text` cut to `width` characters, ending in `…` when cut.
pub fn truncate(text: &str, width: usize) -> String {
    if text.chars().count() <= width {
        return text.to_owned();
    }
    let mut cut: String = text.chars().take(width.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

#[cfg(test)]
mod tests {
    use kontinuum_crds::v1alpha2::{
        AddonSpec, AddonStatus, LocalRef, TalosClusterSpec, TalosClusterStatus, ZoneSpec,
        ZoneStatus,
    };

    use super::*;

    fn cond(type_: &str, status: ConditionStatus, reason: &str, message: &str) -> Condition {
        conditions::new(type_, status, reason, message, Some(1))
    }

    fn zone(conds: Vec<Condition>) -> Zone {
        let mut zone = Zone::new(
            "eu-a",
            ZoneSpec {
                region: "eu".into(),
                zone: "a".into(),
                domain: None,
                seed: None,
                cluster: None,
                teardown: None,
            },
        );
        zone.status = Some(ZoneStatus {
            conditions: conds,
            ..ZoneStatus::default()
        });
        zone
    }

    fn cluster(conds: Vec<Condition>) -> TalosCluster {
        let mut tc = TalosCluster::new("eu-a", TalosClusterSpec::default());
        tc.status = Some(TalosClusterStatus {
            conditions: conds,
            ..TalosClusterStatus::default()
        });
        tc
    }

    fn addon(name: &str, cluster: &str, conds: Vec<Condition>) -> Addon {
        let mut addon = Addon::new(
            name,
            AddonSpec {
                talos_cluster_ref: LocalRef::new(cluster),
                ..AddonSpec::default()
            },
        );
        addon.status = Some(AddonStatus {
            conditions: conds,
            ..AddonStatus::default()
        });
        addon
    }

    use ConditionStatus::{False, True, Unknown};

    fn waiting_zone() -> Vec<Condition> {
        vec![
            cond(
                "Ready",
                False,
                "WaitingForTalosCluster",
                "waiting for talos cluster \"eu-a\" to become ready",
            ),
            cond(
                "ClusterReady",
                False,
                "WaitingForTalosCluster",
                "waiting for talos cluster \"eu-a\" to become ready",
            ),
            cond("Installed", Unknown, "Reconciling", ""),
            cond("RegistryJoined", Unknown, "Reconciling", ""),
        ]
    }

    #[test]
    fn the_frame_shows_every_condition_of_every_object_in_order() {
        let snap = snapshot(
            "eu-a",
            Some(&zone(waiting_zone())),
            None,
            &[
                addon(
                    "eu-a-cilium",
                    "eu-a",
                    vec![cond("Ready", True, "Ready", "")],
                ),
                addon("other-cilium", "other", vec![]),
            ],
        );
        let lines = frame("Waiting for zone eu-a", &snap, Style::plain(), 200);
        assert_eq!(
            lines,
            [
                "Waiting for zone eu-a",
                "Zone eu-a",
                "  ClusterReady    False    WaitingForTalosCluster  waiting for talos cluster \"eu-a\" to become ready",
                "  Installed       Unknown  Reconciling",
                "  RegistryJoined  Unknown  Reconciling",
                "  Ready           False    WaitingForTalosCluster  waiting for talos cluster \"eu-a\" to become ready",
                "TalosCluster eu-a",
                "  not created yet",
                "Addon eu-a-cilium",
                "  Ready           True     Ready",
            ]
        );
    }

    #[test]
    fn frame_lines_never_exceed_the_width_and_colour_only_the_status() {
        let snap = snapshot("eu-a", Some(&zone(waiting_zone())), None, &[]);
        for line in frame("t", &snap, Style::plain(), 40) {
            assert!(line.chars().count() <= 40, "{line}");
        }
        let coloured = frame("t", &snap, Style::colored(), 200);
        assert!(
            coloured[2].contains("\x1b[31mFalse\x1b[0m"),
            "{:?}",
            coloured[2]
        );
        assert!(
            coloured[3].contains("\x1b[33mUnknown\x1b[0m"),
            "{:?}",
            coloured[3]
        );
    }

    #[test]
    fn redraw_moves_up_over_the_previous_frame() {
        let lines = vec!["a".to_owned(), "b".to_owned()];
        assert_eq!(redraw(0, &lines), "a\nb\n");
        assert_eq!(redraw(5, &lines), "\x1b[5A\r\x1b[Ja\nb\n");
    }

    #[test]
    fn changes_list_only_what_changed() {
        let before = snapshot("eu-a", Some(&zone(waiting_zone())), None, &[]);
        assert!(changes(&before, &before, Duration::from_secs(3)).is_empty());
        let mut conds = waiting_zone();
        conds[2] = cond(
            "Installed",
            False,
            "DownstreamNotReady",
            "no kubeconfig\nyet",
        );
        let after = snapshot(
            "eu-a",
            Some(&zone(conds)),
            Some(&cluster(vec![cond(
                "Ready",
                False,
                "WaitingForInstances",
                "",
            )])),
            &[],
        );
        assert_eq!(
            changes(&before, &after, Duration::from_secs(75)),
            [
                "[ 1m15s] Zone eu-a: Installed=False (DownstreamNotReady): no kubeconfig yet",
                "[ 1m15s] TalosCluster eu-a: created",
                "[ 1m15s] TalosCluster eu-a: Ready=False (WaitingForInstances)",
            ]
        );
        let first = changes(&Snapshot::default(), &before, Duration::ZERO);
        assert_eq!(first[0], "[    0s] Zone eu-a: created");
        assert_eq!(first.len(), 5);
    }

    #[test]
    fn the_blocker_is_the_deepest_failing_gate() {
        // No Zone at all.
        let snap = snapshot("eu-a", None, None, &[]);
        assert_eq!(ready_blocker(&snap), "the Zone does not exist");
        let snap = snapshot("eu-a", Some(&zone(vec![])), None, &[]);
        assert_eq!(
            ready_blocker(&snap),
            "Zone eu-a reports no status yet (is the zone-installer running?)"
        );
        // ClusterReady False, no TalosCluster: the Zone's own gate.
        let snap = snapshot("eu-a", Some(&zone(waiting_zone())), None, &[]);
        assert_eq!(
            ready_blocker(&snap),
            "Zone eu-a ClusterReady=False (WaitingForTalosCluster): waiting for talos cluster \"eu-a\" to become ready"
        );
        // The cluster waits for its addons: the failing Addon gate.
        let tc = cluster(vec![
            cond("Bootstrapped", True, "Bootstrapped", ""),
            cond("KubeconfigAvailable", True, "KubeconfigAvailable", ""),
            cond("ControlPlaneReady", True, "Healthy", ""),
            cond(
                "AddonsReady",
                False,
                "AddonNotHealthy",
                "cert-manager is not healthy",
            ),
        ]);
        let addons = [
            addon(
                "eu-a-cilium",
                "eu-a",
                vec![
                    cond("Installed", True, "Installed", ""),
                    cond("Healthy", True, "Healthy", ""),
                ],
            ),
            addon(
                "eu-a-cert-manager",
                "eu-a",
                vec![
                    cond("Installed", True, "Installed", ""),
                    cond("Healthy", False, "Unhealthy", "0/1 pods ready"),
                ],
            ),
        ];
        let snap = snapshot("eu-a", Some(&zone(waiting_zone())), Some(&tc), &addons);
        assert_eq!(
            ready_blocker(&snap),
            "Addon eu-a-cert-manager Healthy=False (Unhealthy): 0/1 pods ready"
        );
        // Cluster ready; the zone waits for its agent.
        let zone_conds = vec![
            cond("ClusterReady", True, "ClusterReady", ""),
            cond("Installed", True, "Installed", ""),
            cond(
                "RegistryJoined",
                False,
                "WaitingForRegistry",
                "waiting for the agent",
            ),
        ];
        let snap = snapshot("eu-a", Some(&zone(zone_conds)), Some(&tc), &addons);
        assert_eq!(
            ready_blocker(&snap),
            "Zone eu-a RegistryJoined=False (WaitingForRegistry): waiting for the agent"
        );
        assert!(!zone_ready(&snap));
        let ready = snapshot(
            "eu-a",
            Some(&zone(vec![cond("Ready", True, "Ready", "")])),
            None,
            &[],
        );
        assert!(zone_ready(&ready));
    }

    #[test]
    fn the_removal_blocker_carries_the_deadline() {
        let mut z = zone(vec![cond(
            "Deleting",
            True,
            "DownstreamTeardownFailed",
            "zone cluster unreachable; retrying until 2026-12-01T23:00:00Z",
        )]);
        z.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
        ));
        let snap = snapshot("eu-a", Some(&z), None, &[]);
        assert_eq!(
            removal_blocker(&snap),
            "Zone eu-a Deleting=True (DownstreamTeardownFailed): zone cluster unreachable; retrying until 2026-12-01T23:00:00Z"
        );
        assert!(frame("t", &snap, Style::plain(), 200)[1].ends_with("(deleting)"));
        assert!(!zone_gone(&snap));
        assert!(zone_gone(&snapshot("eu-a", None, None, &[])));
    }

    #[test]
    fn a_zone_is_removed_once_its_talos_cluster_is_gone_too() {
        let mut tc = cluster(vec![cond(
            "Deleting",
            True,
            "ResettingInstances",
            "resetting eu-a-cp-0",
        )]);
        tc.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        let resetting = snapshot("eu-a", None, Some(&tc), &[]);
        assert!(zone_gone(&resetting));
        assert!(!zone_removed(&resetting));
        assert_eq!(
            removal_blocker(&resetting),
            "TalosCluster eu-a Deleting=True (ResettingInstances): resetting eu-a-cp-0"
        );
        let quiet = snapshot("eu-a", None, Some(&cluster(Vec::new())), &[]);
        assert_eq!(
            removal_blocker(&quiet),
            "TalosCluster eu-a reports no teardown progress yet"
        );
        let both_gone = snapshot("eu-a", None, None, &[]);
        assert!(zone_removed(&both_gone));
        assert_eq!(
            removal_blocker(&both_gone),
            "the Zone and its TalosCluster are gone"
        );
    }
}
