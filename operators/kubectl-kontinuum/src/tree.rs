//! `zone list`, `instance list` and `zone describe`, pure: tables and the describe tree
//! (Zone → TalosCluster → pools and their machines → addons; registry entry), each line
//! with Ready, reason and age, blockers (anything not Ready) first among siblings.

use std::fmt::Write as _;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kontinuum_crds::conditions::{self, ConditionStatus, READY};
use kontinuum_crds::labels;
use kontinuum_crds::v1alpha2::{Addon, Instance, InstancePool, Kontinuum, TalosCluster, Zone};
use kube::ResourceExt as _;

use crate::style::Style;
use crate::view::{belongs_to, truncate};

/// One line of the describe tree.
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    /// What the line names, e.g. `TalosCluster eu-west-1a`.
    pub label: String,
    /// The `Ready` status; `Unknown` when the object has none, `False` when it is missing.
    pub ready: ConditionStatus,
    /// The `Ready` reason (or why the object is missing).
    pub reason: String,
    /// The `Ready` message, shown for blockers only.
    pub message: String,
    /// Age of the object, e.g. `5m`; empty when it does not exist.
    pub age: String,
    /// Children, blockers first.
    pub children: Vec<Node>,
}

impl Node {
    fn object<K: kube::Resource>(
        kind: &str,
        object: &K,
        conds: &[Condition],
        now: Timestamp,
    ) -> Self {
        let ready = conditions::get(conds, READY);
        let mut node = Self {
            label: format!("{kind} {}", object.meta().name.clone().unwrap_or_default()),
            ready: ready.map_or(ConditionStatus::Unknown, |c| {
                ConditionStatus::parse(&c.status)
            }),
            reason: ready.map_or_else(|| "NoStatus".to_owned(), |c| c.reason.clone()),
            message: ready.map(|c| c.message.clone()).unwrap_or_default(),
            age: object
                .meta()
                .creation_timestamp
                .as_ref()
                .map(|t| age(t, now))
                .unwrap_or_default(),
            children: Vec::new(),
        };
        if object.meta().deletion_timestamp.is_some() {
            node.label.push_str(" (deleting)");
        }
        node
    }

    fn missing(label: String, reason: &str, message: String) -> Self {
        Self {
            label,
            ready: ConditionStatus::False,
            reason: reason.to_owned(),
            message,
            age: String::new(),
            children: Vec::new(),
        }
    }

    fn with_children(mut self, mut children: Vec<Node>) -> Self {
        // Stable: blockers first, otherwise the caller's order (kind, then name).
        children.sort_by_key(|c| c.ready == ConditionStatus::True);
        self.children = children;
        self
    }
}

/// Everything `zone describe` read about one zone.
#[derive(Clone, Debug, Default)]
pub struct ZoneObjects {
    /// Its TalosCluster (same name).
    pub cluster: Option<TalosCluster>,
    /// The InstancePools of the namespace.
    pub pools: Vec<InstancePool>,
    /// The Instances of the namespace.
    pub instances: Vec<Instance>,
    /// The Addons of the namespace.
    pub addons: Vec<Addon>,
    /// The registry entries of the namespace.
    pub registry: Vec<Kontinuum>,
}

/// The describe tree of `zone`.
pub fn describe_tree(zone: &Zone, objects: &ZoneObjects, now: Timestamp) -> Node {
    let name = zone.name_any();
    let zone_conds = zone
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default();
    let mut children = Vec::new();
    match &objects.cluster {
        None => children.push(Node::missing(
            format!("TalosCluster {name}"),
            "NotFound",
            if zone.spec.seed.is_some() {
                "not created yet by the zone-installer".to_owned()
            } else {
                "the Zone has no seed addresses: create a TalosCluster of this name".to_owned()
            },
        )),
        Some(cluster) => children.push(cluster_node(cluster, objects, now)),
    }
    let entries: Vec<&Kontinuum> = objects
        .registry
        .iter()
        .filter(|k| {
            k.spec.region.as_deref() == Some(zone.spec.region.as_str())
                && k.spec.zone.as_deref() == Some(zone.spec.zone.as_str())
        })
        .collect();
    if entries.is_empty() {
        children.push(Node::missing(
            "Kontinuum (registry entry)".to_owned(),
            "NotRegistered",
            "the zone agent has not registered in the hub's registry yet".to_owned(),
        ));
    }
    for entry in entries {
        let conds = entry
            .status
            .as_ref()
            .map(|s| s.conditions.as_slice())
            .unwrap_or_default();
        let mut node = Node::object("Kontinuum", entry, conds, now);
        node.label.push_str(" (registry entry)");
        children.push(node);
    }
    let mut node = Node::object("Zone", zone, zone_conds, now);
    if let Some(endpoint) = zone.status.as_ref().and_then(|s| s.endpoint.as_deref()) {
        let _ = write!(node.label, " (https://{endpoint})");
    }
    node.with_children(children)
}

fn cluster_node(cluster: &TalosCluster, objects: &ZoneObjects, now: Timestamp) -> Node {
    let name = cluster.name_any();
    let conds = cluster
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default();
    let mut pool_refs = vec![(
        cluster.spec.control_plane.pool_ref.name.clone(),
        "control plane".to_owned(),
    )];
    pool_refs.extend(
        cluster
            .spec
            .workers
            .iter()
            .map(|w| (w.pool_ref.name.clone(), format!("workers {}", w.name))),
    );
    let mut children = Vec::new();
    for (pool_name, role) in pool_refs {
        let node = match objects.pools.iter().find(|p| p.name_any() == pool_name) {
            None => Node::missing(
                format!("InstancePool {pool_name} ({role})"),
                "NotFound",
                "the pool does not exist".to_owned(),
            ),
            Some(pool) => {
                let pool_conds = pool
                    .status
                    .as_ref()
                    .map(|s| s.conditions.as_slice())
                    .unwrap_or_default();
                let mut node = Node::object("InstancePool", pool, pool_conds, now);
                let _ = write!(node.label, " ({role})");
                let mut machines: Vec<&Instance> = objects
                    .instances
                    .iter()
                    .filter(|i| i.labels().get(labels::CLAIMED_BY) == Some(&pool_name))
                    .collect();
                machines.sort_by_key(|i| i.name_any());
                let machines = machines
                    .into_iter()
                    .map(|i| {
                        let c = i
                            .status
                            .as_ref()
                            .map(|s| s.conditions.as_slice())
                            .unwrap_or_default();
                        let mut node = Node::object("Instance", i, c, now);
                        if let Some(address) = i.spec.interfaces.first() {
                            let _ = write!(node.label, " ({address})");
                        }
                        node
                    })
                    .collect();
                node.with_children(machines)
            }
        };
        children.push(node);
    }
    let mut addons: Vec<&Addon> = objects
        .addons
        .iter()
        .filter(|a| belongs_to(a, &name))
        .collect();
    addons.sort_by_key(|a| a.name_any());
    for addon in addons {
        let c = addon
            .status
            .as_ref()
            .map(|s| s.conditions.as_slice())
            .unwrap_or_default();
        children.push(Node::object("Addon", addon, c, now));
    }
    Node::object("TalosCluster", cluster, conds, now).with_children(children)
}

/// The tree as text: branches drawn with box characters, the label column aligned, then
/// Ready, reason, age and (for blockers) the message.
pub fn render_tree(root: &Node, style: Style) -> String {
    let mut rows = Vec::new();
    flatten(root, "", "", &mut rows);
    let label_width = rows
        .iter()
        .map(|(p, n)| p.chars().count() + n.label.chars().count())
        .max()
        .unwrap_or(0);
    let reason_width = rows.iter().map(|(_, n)| n.reason.len()).max().unwrap_or(0);
    let age_width = rows
        .iter()
        .map(|(_, n)| n.age.len())
        .max()
        .unwrap_or(0)
        .max(3);
    let mut out = String::new();
    for (prefix, node) in rows {
        let label = format!("{prefix}{}", node.label);
        let pad = label_width - label.chars().count();
        let status = node.ready.as_str();
        let mut line = format!(
            "{label}{}  {}{}  {:reason_width$}  {:>age_width$}",
            " ".repeat(pad),
            style.status(node.ready, status),
            " ".repeat(7 - status.len()),
            node.reason,
            node.age,
        );
        if node.ready != ConditionStatus::True && !node.message.is_empty() {
            line.push_str("  ");
            line.push_str(&truncate(&crate::error::fold_lines(&node.message), 160));
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

fn flatten<'a>(
    node: &'a Node,
    prefix: &str,
    child_prefix: &str,
    rows: &mut Vec<(String, &'a Node)>,
) {
    rows.push((prefix.to_owned(), node));
    let count = node.children.len();
    for (i, child) in node.children.iter().enumerate() {
        let last = i + 1 == count;
        let (branch, next) = if last {
            ("└─ ", "   ")
        } else {
            ("├─ ", "│  ")
        };
        flatten(
            child,
            &format!("{child_prefix}{branch}"),
            &format!("{child_prefix}{next}"),
            rows,
        );
    }
}

/// The `zone list` table: NAME REGION ZONE DOMAIN READY REASON AGE, sorted by name.
pub fn zone_table(zones: &[Zone], now: Timestamp, style: Style) -> String {
    let mut zones: Vec<&Zone> = zones.iter().collect();
    zones.sort_by_key(|z| z.name_any());
    let rows = zones
        .into_iter()
        .map(|z| {
            let ready = z
                .status
                .as_ref()
                .and_then(|s| conditions::get(&s.conditions, READY));
            vec![
                Cell::plain(z.name_any()),
                Cell::plain(z.spec.region.clone()),
                Cell::plain(z.spec.zone.clone()),
                Cell::plain(z.spec.domain.clone().unwrap_or_else(|| "<none>".to_owned())),
                Cell::status(ready),
                Cell::plain(ready.map_or_else(String::new, |c| c.reason.clone())),
                Cell::plain(
                    z.metadata
                        .creation_timestamp
                        .as_ref()
                        .map(|t| age(t, now))
                        .unwrap_or_default(),
                ),
            ]
        })
        .collect();
    table(
        &["NAME", "REGION", "ZONE", "DOMAIN", "READY", "REASON", "AGE"],
        rows,
        style,
    )
}

/// The `instance list` table: NAME ADDRESS REGION ZONE CLAIMED-BY DISCOVERED READY AGE.
pub fn instance_table(instances: &[Instance], now: Timestamp, style: Style) -> String {
    let mut instances: Vec<&Instance> = instances.iter().collect();
    instances.sort_by_key(|i| i.name_any());
    let label = |i: &Instance, key: &str| {
        i.labels()
            .get(key)
            .cloned()
            .unwrap_or_else(|| "<none>".to_owned())
    };
    let rows = instances
        .into_iter()
        .map(|i| {
            let conds = i
                .status
                .as_ref()
                .map(|s| s.conditions.as_slice())
                .unwrap_or_default();
            vec![
                Cell::plain(i.name_any()),
                Cell::plain(
                    i.spec
                        .interfaces
                        .first()
                        .cloned()
                        .unwrap_or_else(|| "<none>".to_owned()),
                ),
                Cell::plain(label(i, labels::REGION)),
                Cell::plain(label(i, labels::ZONE)),
                Cell::plain(label(i, labels::CLAIMED_BY)),
                Cell::status(conditions::get(conds, "Discovered")),
                Cell::status(conditions::get(conds, READY)),
                Cell::plain(
                    i.metadata
                        .creation_timestamp
                        .as_ref()
                        .map(|t| age(t, now))
                        .unwrap_or_default(),
                ),
            ]
        })
        .collect();
    table(
        &[
            "NAME",
            "ADDRESS",
            "REGION",
            "ZONE",
            "CLAIMED-BY",
            "DISCOVERED",
            "READY",
            "AGE",
        ],
        rows,
        style,
    )
}

struct Cell {
    text: String,
    status: Option<ConditionStatus>,
}

impl Cell {
    fn plain(text: String) -> Self {
        Self { text, status: None }
    }

    fn status(condition: Option<&Condition>) -> Self {
        match condition {
            None => Self::plain("Unknown".to_owned()),
            Some(c) => Self {
                text: c.status.clone(),
                status: Some(ConditionStatus::parse(&c.status)),
            },
        }
    }
}

fn table(headers: &[&str], rows: Vec<Vec<Cell>>, style: Style) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.text.chars().count());
        }
    }
    let mut out = String::new();
    let header: Vec<String> = headers
        .iter()
        .zip(&widths)
        .map(|(h, w)| format!("{h:w$}"))
        .collect();
    out.push_str(header.join("   ").trim_end());
    out.push('\n');
    for row in rows {
        let cells: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, w)| {
                let pad = " ".repeat(w - cell.text.chars().count());
                match cell.status {
                    Some(status) => format!("{}{pad}", style.status(status, &cell.text)),
                    None => format!("{}{pad}", cell.text),
                }
            })
            .collect();
        out.push_str(cells.join("   ").trim_end());
        out.push('\n');
    }
    out
}

/// kubectl's age: `45s`, `3m20s` under ten minutes, `42m`, `5h10m` under eight hours, `20h`,
/// `3d4h` under eight days, `30d`, then years.
pub fn age(created: &Time, now: Timestamp) -> String {
    let secs = now.as_second().saturating_sub(created.0.as_second()).max(0);
    let (m, h, d) = (secs / 60, secs / 3600, secs / 86_400);
    if secs < 120 {
        format!("{secs}s")
    } else if m < 10 {
        if secs % 60 == 0 {
            format!("{m}m")
        } else {
            format!("{m}m{}s", secs % 60)
        }
    } else if h < 3 {
        format!("{m}m")
    } else if h < 8 {
        if m % 60 == 0 {
            format!("{h}h")
        } else {
            format!("{h}h{}m", m % 60)
        }
    } else if h < 48 {
        format!("{h}h")
    } else if d < 8 {
        if h % 24 == 0 {
            format!("{d}d")
        } else {
            format!("{d}d{}h", h % 24)
        }
    } else if d < 365 * 2 {
        format!("{d}d")
    } else {
        format!("{}y", d / 365)
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
    use kontinuum_crds::v1alpha2::{
        AddonSpec, AddonStatus, ControlPlane, InstancePoolSpec, InstancePoolStatus, InstanceSpec,
        InstanceStatus, KontinuumSpec, KontinuumStatus, LocalRef, TalosClusterSpec,
        TalosClusterStatus, ZoneSeed, ZoneSpec, ZoneStatus,
    };
    use std::collections::BTreeMap;

    use super::*;

    const NOW: i64 = 1_800_000_000;

    fn time(seconds_ago: i64) -> Time {
        Time(Timestamp::from_second(NOW - seconds_ago).unwrap())
    }

    fn now() -> Timestamp {
        Timestamp::from_second(NOW).unwrap()
    }

    fn ready(status: ConditionStatus, reason: &str, message: &str) -> Vec<Condition> {
        vec![conditions::new(READY, status, reason, message, Some(1))]
    }

    fn zone(status: ConditionStatus, reason: &str) -> Zone {
        let mut zone = Zone::new(
            "eu-a",
            ZoneSpec {
                region: "eu".into(),
                zone: "a".into(),
                domain: Some("example.com".into()),
                seed: Some(ZoneSeed {
                    talos_addresses: vec!["192.0.2.10".into()],
                }),
                cluster: None,
                teardown: None,
            },
        );
        zone.metadata.creation_timestamp = Some(time(600));
        zone.status = Some(ZoneStatus {
            conditions: ready(status, reason, "waiting for talos cluster \"eu-a\""),
            ..ZoneStatus::default()
        });
        zone
    }

    fn objects() -> ZoneObjects {
        let mut cluster = TalosCluster::new(
            "eu-a",
            TalosClusterSpec {
                control_plane: ControlPlane {
                    pool_ref: LocalRef::new("eu-a"),
                    ..ControlPlane::default()
                },
                ..TalosClusterSpec::default()
            },
        );
        cluster.metadata.creation_timestamp = Some(time(590));
        cluster.status = Some(TalosClusterStatus {
            conditions: ready(
                ConditionStatus::False,
                "AddonNotHealthy",
                "cilium is not healthy",
            ),
            ..TalosClusterStatus::default()
        });
        let mut pool = InstancePool::new(
            "eu-a",
            InstancePoolSpec {
                selector: LabelSelector::default(),
                replicas: 1,
                template: None,
            },
        );
        pool.metadata.creation_timestamp = Some(time(590));
        pool.status = Some(InstancePoolStatus {
            conditions: ready(ConditionStatus::True, "AllClaimed", ""),
            ..InstancePoolStatus::default()
        });
        let instance = |name: &str, claimed: &str| {
            let mut i = Instance::new(
                name,
                InstanceSpec {
                    interfaces: vec!["192.0.2.10".into()],
                    ..InstanceSpec::default()
                },
            );
            i.metadata.labels = Some(BTreeMap::from([(
                labels::CLAIMED_BY.to_owned(),
                claimed.to_owned(),
            )]));
            i.metadata.creation_timestamp = Some(time(595));
            i.status = Some(InstanceStatus {
                conditions: ready(ConditionStatus::True, "Ready", ""),
                ..InstanceStatus::default()
            });
            i
        };
        let addon = |release: &str, status: ConditionStatus, reason: &str| {
            let mut a = Addon::new(
                &format!("eu-a-{release}"),
                AddonSpec {
                    talos_cluster_ref: LocalRef::new("eu-a"),
                    ..AddonSpec::default()
                },
            );
            a.metadata.creation_timestamp = Some(time(300));
            a.status = Some(AddonStatus {
                conditions: ready(status, reason, "0/1 pods ready"),
                ..AddonStatus::default()
            });
            a
        };
        let mut entry = Kontinuum::new(
            "zone-agent",
            KontinuumSpec {
                region: Some("eu".into()),
                zone: Some("a".into()),
            },
        );
        entry.metadata.creation_timestamp = Some(time(30));
        entry.status = Some(KontinuumStatus::default());
        ZoneObjects {
            cluster: Some(cluster),
            pools: vec![pool],
            instances: vec![
                instance("eu-a-6d99cbd08f", "eu-a"),
                instance("other", "other-pool"),
            ],
            addons: vec![
                addon("cert-manager", ConditionStatus::True, "Ready"),
                addon("cilium", ConditionStatus::False, "Unhealthy"),
                addon("gateway-api-crds", ConditionStatus::True, "Ready"),
            ],
            registry: vec![entry],
        }
    }

    #[test]
    fn the_tree_puts_blockers_first() {
        let tree = describe_tree(
            &zone(ConditionStatus::False, "WaitingForTalosCluster"),
            &objects(),
            now(),
        );
        let text = render_tree(&tree, Style::plain());
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("Zone eu-a "), "{text}");
        assert!(lines[1].starts_with("├─ TalosCluster eu-a "), "{text}");
        assert!(lines[2].starts_with("│  ├─ Addon eu-a-cilium "), "{text}");
        assert!(
            lines[2].contains("False") && lines[2].ends_with("0/1 pods ready"),
            "{text}"
        );
        assert!(
            lines[3].starts_with("│  ├─ InstancePool eu-a (control plane) "),
            "{text}"
        );
        assert!(
            lines[4].starts_with("│  │  └─ Instance eu-a-6d99cbd08f (192.0.2.10) "),
            "{text}"
        );
        assert!(
            lines[5].starts_with("│  ├─ Addon eu-a-cert-manager "),
            "{text}"
        );
        assert!(
            lines[6].starts_with("│  └─ Addon eu-a-gateway-api-crds "),
            "{text}"
        );
        // The registry entry has no Ready condition yet: Unknown, a blocker, but after the
        // cluster (both blockers keep their order).
        assert!(
            lines[7].starts_with("└─ Kontinuum zone-agent (registry entry) "),
            "{text}"
        );
        assert!(lines[7].contains("Unknown  NoStatus"), "{text}");
        assert_eq!(lines.len(), 8, "{text}");
        // Columns line up.
        let column = |line: &str, word: &str| line[..line.find(word).unwrap()].chars().count();
        assert_eq!(
            column(lines[3], "True"),
            column(lines[0], "False"),
            "{text}"
        );
        assert_eq!(
            column(lines[4], "True"),
            column(lines[0], "False"),
            "{text}"
        );
    }

    #[test]
    fn the_zone_line_names_its_endpoint_once_published() {
        let mut published = zone(ConditionStatus::True, "Ready");
        let tree = describe_tree(&published, &ZoneObjects::default(), now());
        assert_eq!(
            tree.label, "Zone eu-a",
            "no endpoint before the status has one"
        );
        if let Some(status) = published.status.as_mut() {
            status.endpoint = Some("a.eu.example.com".into());
        }
        let tree = describe_tree(&published, &ZoneObjects::default(), now());
        assert_eq!(tree.label, "Zone eu-a (https://a.eu.example.com)");
    }

    #[test]
    fn missing_children_are_blockers_with_a_reason() {
        let tree = describe_tree(
            &zone(ConditionStatus::True, "Ready"),
            &ZoneObjects::default(),
            now(),
        );
        let text = render_tree(&tree, Style::plain());
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[1].contains("TalosCluster eu-a") && lines[1].contains("NotFound"),
            "{text}"
        );
        assert!(
            lines[1].contains("not created yet by the zone-installer"),
            "{text}"
        );
        assert!(
            lines[2].contains("registry entry") && lines[2].contains("NotRegistered"),
            "{text}"
        );
    }

    #[test]
    fn colour_never_reaches_plain_output() {
        let tree = describe_tree(&zone(ConditionStatus::False, "X"), &objects(), now());
        assert!(!render_tree(&tree, Style::plain()).contains('\x1b'));
        assert!(render_tree(&tree, Style::colored()).contains("\x1b[31mFalse\x1b[0m"));
    }

    #[test]
    fn the_zone_table_has_kubectl_columns() {
        let mut other = zone(ConditionStatus::True, "Ready");
        other.metadata.name = Some("ap-b".into());
        other.spec.domain = None;
        let text = zone_table(
            &[
                zone(ConditionStatus::False, "WaitingForTalosCluster"),
                other,
            ],
            now(),
            Style::plain(),
        );
        assert_eq!(
            text,
            "\
NAME   REGION   ZONE   DOMAIN        READY   REASON                   AGE
ap-b   eu       a      <none>        True    Ready                    10m
eu-a   eu       a      example.com   False   WaitingForTalosCluster   10m
"
        );
    }

    #[test]
    fn the_instance_table_shows_claims() {
        let text = instance_table(&objects().instances, now(), Style::plain());
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "NAME              ADDRESS      REGION   ZONE     CLAIMED-BY   DISCOVERED   READY   AGE"
        );
        assert!(lines[1].starts_with("eu-a-6d99cbd08f   192.0.2.10   <none>   <none>   eu-a         Unknown      True    9m55s"), "{text}");
    }

    #[test]
    fn ages_read_like_kubectl() {
        let t = |ago: i64| age(&time(ago), now());
        assert_eq!(t(-5), "0s");
        assert_eq!(t(45), "45s");
        assert_eq!(t(200), "3m20s");
        assert_eq!(t(600), "10m");
        assert_eq!(t(2520), "42m");
        assert_eq!(t(5 * 3600 + 600), "5h10m");
        assert_eq!(t(20 * 3600), "20h");
        assert_eq!(t(3 * 86_400 + 4 * 3600), "3d4h");
        assert_eq!(t(30 * 86_400), "30d");
        assert_eq!(t(800 * 86_400), "2y");
    }
}
