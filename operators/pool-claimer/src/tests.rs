//! Pure tests of the planner and the status.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kontinuum_crds::conditions;
use kontinuum_crds::v1alpha2::{InstancePool, InstancePoolSpec};

use super::*;

fn candidate(name: &str, discovered: bool, claimed_by: Option<&str>, matches: bool) -> Candidate {
    Candidate {
        name: name.into(),
        discovered,
        claimed_by: claimed_by.map(Into::into),
        matches,
    }
}

fn names(names: &[&str]) -> Vec<String> {
    names.iter().map(ToString::to_string).collect()
}

#[test]
fn claims_the_lowest_named_free_discovered_matches() {
    let instances = [
        candidate("n-04", true, None, true),
        candidate("n-02", true, None, true),
        candidate("n-03", false, None, true), // not discovered
        candidate("n-01", true, Some("other"), true), // held by another pool
        candidate("n-05", true, None, false), // selector does not match
        candidate("n-06", true, None, true),
    ];
    let plan = plan(2, &[], &instances);
    assert_eq!(plan.need, 2);
    assert_eq!(plan.candidates, names(&["n-02", "n-04", "n-06"]));
    assert!(plan.release.is_empty() && plan.keep.is_empty());
}

#[test]
fn scale_down_keeps_the_first_names_and_releases_the_rest() {
    let plan = plan(1, &names(&["n-3", "n-1", "n-2"]), &[]);
    assert_eq!(plan.keep, names(&["n-1"]));
    assert_eq!(plan.release, names(&["n-2", "n-3"]));
    assert_eq!(plan.need, 0);
    assert!(plan.candidates.is_empty());
}

#[test]
fn a_satisfied_pool_plans_nothing() {
    let instances = [
        candidate("n-1", true, Some("pool"), true),
        candidate("n-2", true, None, true),
    ];
    let plan = plan(1, &names(&["n-1"]), &instances);
    assert_eq!(
        plan,
        Plan {
            keep: names(&["n-1"]),
            release: vec![],
            need: 0,
            candidates: vec![]
        }
    );
}

#[test]
fn negative_or_zero_replicas_release_everything() {
    assert_eq!(
        plan(0, &names(&["a", "b"]), &[]).release,
        names(&["a", "b"])
    );
    assert_eq!(plan(-3, &names(&["a"]), &[]).release, names(&["a"]));
}

fn pool(replicas: i32) -> InstancePool {
    let mut pool = InstancePool::new(
        "eu-west-1a",
        InstancePoolSpec {
            replicas,
            ..InstancePoolSpec::default()
        },
    );
    pool.metadata.generation = Some(4);
    pool
}

fn at(second: i64) -> Time {
    Time(Timestamp::from_second(second).unwrap())
}

#[test]
fn status_reports_shortage_with_counts() {
    let s = status(&pool(5), 3, 2, None, &at(10));
    let get = |t: &str| conditions::get(&s.conditions, t).unwrap().clone();
    assert_eq!(get("Claimed").status, "False");
    assert_eq!(get("InsufficientCapacity").status, "True");
    assert_eq!(get("InsufficientCapacity").reason, "InsufficientCapacity");
    assert!(
        get("InsufficientCapacity").message.contains("3/5"),
        "{}",
        get("InsufficientCapacity").message
    );
    assert_eq!(get("Ready").status, "False");
    assert_eq!(get("Ready").reason, "InsufficientCapacity");
    assert_eq!(
        (s.claimed_replicas, s.ready_replicas, s.observed_generation),
        (Some(3), Some(2), Some(4))
    );
    assert!(
        s.conditions
            .iter()
            .all(|c| c.observed_generation == Some(4))
    );
}

#[test]
fn status_is_ready_when_all_are_claimed_and_stable_across_runs() {
    let first = status(&pool(2), 2, 2, None, &at(10));
    assert!(conditions::is_true(&first.conditions, "Ready"));
    assert!(conditions::is_true(&first.conditions, "Claimed"));
    assert!(!conditions::is_true(
        &first.conditions,
        "InsufficientCapacity"
    ));
    // A later run with the same facts changes nothing, timestamps included.
    let second = status(&pool(2), 2, 2, Some(&first), &at(99));
    assert_eq!(first, second);
}

#[test]
fn last_transition_time_moves_only_on_a_flip() {
    let short = status(&pool(3), 1, 1, None, &at(10));
    let still_short = status(&pool(3), 2, 2, Some(&short), &at(20));
    let ltt = |s: &InstancePoolStatus| {
        conditions::get(&s.conditions, "Claimed")
            .unwrap()
            .last_transition_time
            .clone()
    };
    assert_eq!(ltt(&still_short), at(10));
    let full = status(&pool(3), 3, 3, Some(&still_short), &at(30));
    assert_eq!(ltt(&full), at(30));
}

#[test]
fn instance_events_map_to_matching_and_claiming_pools_only() {
    use std::sync::Arc;

    use kontinuum_crds::v1alpha2::InstanceSpec;
    use kube::api::ObjectMeta;

    let selecting = |name: &str, zone: &str| {
        let mut p = InstancePool::new(
            name,
            serde_json::from_value(serde_json::json!({
                "selector": { "matchLabels": { "kontinuum.sh/zone": zone } }, "replicas": 1
            }))
            .unwrap(),
        );
        p.metadata.namespace = Some("hub".into());
        Arc::new(p)
    };
    let pools = vec![
        selecting("a", "z1"),
        selecting("b", "z2"),
        selecting("c", "z1"),
    ];
    let mut other_ns = (*selecting("d", "z1")).clone();
    other_ns.metadata.namespace = Some("elsewhere".into());
    let pools = [pools, vec![Arc::new(other_ns)]].concat();

    let instance = Instance {
        metadata: ObjectMeta {
            name: Some("n-1".into()),
            namespace: Some("hub".into()),
            labels: Some(
                [
                    ("kontinuum.sh/zone".to_string(), "z1".to_string()),
                    (CLAIMED_BY.to_string(), "b".to_string()),
                ]
                .into(),
            ),
            ..ObjectMeta::default()
        },
        spec: InstanceSpec::default(),
        status: None,
    };
    let mut mapped: Vec<String> = pools_for(&instance, &pools)
        .into_iter()
        .map(|r| r.name)
        .collect();
    mapped.sort();
    assert_eq!(mapped, ["a", "b", "c"]);
}

#[test]
fn a_403_is_reported_as_forbidden() {
    let status = kube::core::Status::failure(
        "instances.kontinuum.sh \"n-01\" is forbidden: User \"u\" cannot patch resource \
         \"instances\" in API group \"kontinuum.sh\"",
        "Forbidden",
    )
    .with_code(403);
    let err = Error::Claim {
        instance: "n-01".into(),
        source: kube::Error::Api(status.boxed()),
    };
    assert_eq!(err.reason(), "Forbidden", "not ClaimFailed");
    assert_eq!(
        err.class(),
        ErrorClass::Transient,
        "RBAC is fixed without a spec change"
    );
    let message = forbidden(&err).unwrap();
    assert_eq!(
        message,
        "forbidden: the operator may not patch instances; its RBAC needs fixing"
    );
    let status = failure_status(&pool(2), Reason::Forbidden, &message, &at(5));
    for c in [Cond::Claimed, Cond::Ready] {
        let c = conditions::get(&status.conditions, c).unwrap();
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("False", "Forbidden")
        );
        assert_eq!(c.message, message);
    }
}
