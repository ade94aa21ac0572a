//! Unit tests of the pure decisions: status, waves and dependencies, the release action.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kontinuum_crds::conditions::{self, ConditionStatus};
use kontinuum_crds::reasons::AddonReason;
use kontinuum_crds::v1alpha2::{Addon, AddonSpec, AddonStatus};
use serde_json::json;

use super::*;
use crate::downstream::Revision;

fn at(secs: i64) -> Time {
    Time(Timestamp::from_second(secs).unwrap())
}

fn addon(name: &str, spec: serde_json::Value) -> Addon {
    let spec: AddonSpec = serde_json::from_value(spec).unwrap();
    let mut a = Addon::new(name, spec);
    a.metadata.namespace = Some("ns".into());
    a.metadata.generation = Some(1);
    a
}

fn with_ready(mut a: Addon, ready: bool) -> Addon {
    let mut status = AddonStatus::default();
    conditions::set(
        &mut status.conditions,
        conditions::new(
            "Ready",
            ready.into(),
            if ready { "Ready" } else { "NotHealthy" },
            "m",
            Some(1),
        ),
        &at(1),
    );
    a.status = Some(status);
    a
}

fn builtin(cluster: &str, release: &str, ready: bool) -> Arc<Addon> {
    Arc::new(with_ready(
        addon(
            &format!("{cluster}-{release}"),
            json!({ "talosClusterRef": { "name": cluster }, "releaseName": release }),
        ),
        ready,
    ))
}

fn ready_of(status: &AddonStatus) -> (String, String, String) {
    let c = conditions::get(&status.conditions, "Ready").unwrap();
    (c.status.clone(), c.reason.clone(), c.message.clone())
}

#[test]
fn waves_wait_for_every_lower_priority_addon_of_the_same_cluster() {
    let crds = builtin("c1", "gateway-api-crds", false);
    let cilium = builtin("c1", "cilium", false);
    let cert = builtin("c1", "cert-manager", false);
    let other_cluster = builtin("c2", "gateway-api-crds", false);
    let all = vec![crds.clone(), cilium.clone(), cert.clone(), other_cluster];
    // The CRDs (priority 50) wait for nothing; Cilium and cert-manager wait for them.
    assert_eq!(blocking_dependency(&crds, &all), None);
    let why = blocking_dependency(&cilium, &all).unwrap();
    assert!(
        why.contains("c1-gateway-api-crds (priority 50 < 100)"),
        "{why}"
    );
    assert!(blocking_dependency(&cert, &all).is_some());
    // Same priority: in parallel.
    let all = vec![
        builtin("c1", "gateway-api-crds", true),
        cilium.clone(),
        cert.clone(),
    ];
    assert_eq!(blocking_dependency(&cilium, &all), None);
    assert_eq!(blocking_dependency(&cert, &all), None);
    // A disabled lower wave does not block.
    let mut disabled = (*crds).clone();
    disabled.spec.enabled = false;
    assert_eq!(
        blocking_dependency(&cilium, &[Arc::new(disabled), cilium.clone()]),
        None
    );
}

#[test]
fn depends_on_names_must_exist_and_be_ready() {
    let app = Arc::new(addon(
        "app",
        json!({ "talosClusterRef": { "name": "c1" }, "chart": { "name": "oci://r/app" },
                "namespace": { "name": "app" }, "dependsOn": ["db"], "lifecycle": { "priority": 1 } }),
    ));
    assert_eq!(
        blocking_dependency(&app, std::slice::from_ref(&app)).unwrap(),
        "waiting for Addon db: not found"
    );
    let db = |ready| {
        Arc::new(with_ready(
            addon(
                "db",
                json!({ "talosClusterRef": { "name": "c9" }, "chart": { "name": "oci://r/db" }, "namespace": { "name": "db" } }),
            ),
            ready,
        ))
    };
    let why = blocking_dependency(&app, &[app.clone(), db(false)]).unwrap();
    assert_eq!(why, "waiting for Addon db to be Ready (NotHealthy: m)");
    assert_eq!(blocking_dependency(&app, &[app.clone(), db(true)]), None);
}

#[test]
fn unchanged_deployed_releases_are_left_alone_and_stuck_ones_repaired() {
    let rev = |version, status: &str, hash: &str| Revision {
        version,
        status: status.into(),
        hash: Some(hash.into()),
    };
    assert_eq!(plan_release(&[], "h"), ReleaseAction::Upgrade);
    assert_eq!(
        plan_release(&[rev(1, "superseded", "a"), rev(2, "deployed", "h")], "h"),
        ReleaseAction::UpToDate { revision: 2 }
    );
    assert_eq!(
        plan_release(&[rev(2, "deployed", "a")], "h"),
        ReleaseAction::Upgrade
    );
    assert_eq!(
        plan_release(&[rev(1, "failed", "h")], "h"),
        ReleaseAction::Upgrade
    );
    assert_eq!(
        plan_release(&[rev(1, "pending-install", "h")], "h"),
        ReleaseAction::RepairByUninstall
    );
    assert_eq!(
        plan_release(
            &[rev(1, "deployed", "a"), rev(2, "pending-upgrade", "h")],
            "h"
        ),
        ReleaseAction::RepairByRollback
    );
    let unlabelled = Revision {
        version: 1,
        status: "deployed".into(),
        hash: None,
    };
    assert_eq!(plan_release(&[unlabelled], "h"), ReleaseAction::Upgrade);
}

#[test]
fn installed_and_healthy_is_ready_and_failures_name_their_reason() {
    let a = addon(
        "c1-cilium",
        json!({ "talosClusterRef": { "name": "c1" }, "releaseName": "cilium" }),
    );
    let healthy = Outcome::Installed {
        summary: "release cilium revision 1".into(),
        chart_version: Some("1.20.1".into()),
        revision: Some(1),
        health: Health::Healthy,
    };
    let s = status(&a, &healthy, Some(("cilium", "kube-system")), &at(10));
    assert_eq!(ready_of(&s).0, "True");
    assert_eq!(s.chart_version.as_deref(), Some("1.20.1"));
    assert_eq!(s.revision, Some(1));
    assert_eq!(s.namespace.as_deref(), Some("kube-system"));
    assert_eq!(s.observed_generation, Some(1));

    let sick = Outcome::Installed {
        summary: "x".into(),
        chart_version: None,
        revision: None,
        health: Health::NotHealthy("kube-system/cilium-abc is Running but not Ready".into()),
    };
    let s = status(&a, &sick, None, &at(10));
    assert_eq!(
        ready_of(&s),
        (
            "False".into(),
            "NotHealthy".into(),
            "kube-system/cilium-abc is Running but not Ready".into()
        )
    );
    let crds = Outcome::Installed {
        summary: "x".into(),
        chart_version: None,
        revision: None,
        health: Health::CrdsNotReady("a: crd not found yet".into()),
    };
    assert_eq!(
        ready_of(&status(&a, &crds, None, &at(10))).1,
        "CRDsNotReady"
    );
    let waiting = Outcome::WaitingForDependency("waiting for Addon x".into());
    assert_eq!(
        ready_of(&status(&a, &waiting, None, &at(10))),
        (
            "False".into(),
            "WaitingForDependency".into(),
            "waiting for Addon x".into()
        )
    );
    let failed = Outcome::InstallFailed("helm upgrade failed".into());
    assert_eq!(
        ready_of(&status(&a, &failed, None, &at(10))).1,
        "InstallFailed"
    );
    let off = Outcome::Disabled("spec.enabled is false".into());
    assert_eq!(ready_of(&status(&a, &off, None, &at(10))).1, "Disabled");
    let refused = Outcome::Forbidden("forbidden: the operator may not get secrets".into());
    let refused = status(&a, &refused, None, &at(10));
    assert_eq!(ready_of(&refused).1, "Forbidden");
    assert_eq!(
        conditions::get(&refused.conditions, "Installed").map(|c| c.reason.as_str()),
        Some("Forbidden")
    );
}

#[test]
fn a_403_is_reported_as_forbidden_and_helm_output_stays_out() {
    let api = |code| {
        kube::Error::Api(
            kube::core::Status::failure(
                "secrets \"c1-kubeconfig\" is forbidden: User \"u\" cannot get resource \
                 \"secrets\" in API group \"\" in the namespace \"k\"",
                "Forbidden",
            )
            .with_code(code)
            .boxed(),
        )
    };
    let refused = Error::ReadSecret {
        secret: "c1-kubeconfig".into(),
        source: api(403),
    };
    assert_eq!(refused.reason(), "Forbidden", "not WaitingForKubeconfig");
    assert_eq!(
        failed(&refused, "release cilium"),
        Outcome::Forbidden(
            "forbidden: the operator may not get secrets; its RBAC needs fixing".into()
        )
    );
    let other = Error::ReadSecret {
        secret: "c1-kubeconfig".into(),
        source: api(500),
    };
    assert_eq!(other.reason(), "WaitingForKubeconfig");

    let helm = Error::Helm(crate::helm::HelmError::Failed {
        verb: "upgrade",
        status: "exit status: 1".into(),
        stderr: "Error: values don't meet the specifications: password=hunter2".into(),
    });
    let Outcome::InstallFailed(message) = failed(&helm, "release cilium") else {
        panic!("not InstallFailed");
    };
    assert_eq!(
        message,
        "release cilium: running helm: helm upgrade failed (exit status: 1); the operator's \
         log has helm's output"
    );
}

#[test]
fn the_same_outcome_twice_writes_nothing_new() {
    let mut a = addon(
        "c1-cilium",
        json!({ "talosClusterRef": { "name": "c1" }, "releaseName": "cilium" }),
    );
    let outcome = Outcome::Installed {
        summary: "s".into(),
        chart_version: Some("1".into()),
        revision: Some(1),
        health: Health::Healthy,
    };
    let first = status(&a, &outcome, Some(("cilium", "kube-system")), &at(10));
    a.status = Some(first.clone());
    let second = status(&a, &outcome, Some(("cilium", "kube-system")), &at(99));
    assert_eq!(first, second, "timestamps move only on a status flip");
}

#[test]
fn a_failure_after_an_install_keeps_what_is_installed() {
    let mut a = addon(
        "c1-cilium",
        json!({ "talosClusterRef": { "name": "c1" }, "releaseName": "cilium" }),
    );
    let ok = Outcome::Installed {
        summary: "s".into(),
        chart_version: Some("1.20.1".into()),
        revision: Some(4),
        health: Health::Healthy,
    };
    a.status = Some(status(&a, &ok, None, &at(10)));
    let failed = status(&a, &Outcome::InstallFailed("boom".into()), None, &at(20));
    assert_eq!(failed.revision, Some(4));
    assert_eq!(
        conditions::status(&failed.conditions, "Healthy"),
        ConditionStatus::Unknown
    );
    assert!(may_be_installed(&Addon {
        status: Some(failed),
        ..a.clone()
    }));
    assert!(!may_be_installed(&addon(
        "x",
        json!({ "talosClusterRef": { "name": "c1" } })
    )));
}

#[test]
fn cluster_and_sibling_events_map_to_the_right_addons() {
    let crds = builtin("c1", "gateway-api-crds", true);
    let cilium = builtin("c1", "cilium", false);
    let cert = builtin("c1", "cert-manager", true);
    let elsewhere = builtin("c2", "cilium", false);
    let all = vec![crds.clone(), cilium.clone(), cert, elsewhere];
    let names = |refs: Vec<ObjectRef<Addon>>| refs.into_iter().map(|r| r.name).collect::<Vec<_>>();
    assert_eq!(names(addons_of(Some("ns"), "c1", &all)).len(), 3);
    // Only siblings that are not Ready can be unblocked.
    assert_eq!(names(siblings_waiting(&crds, &all)), ["c1-cilium"]);
}

#[test]
fn only_a_change_of_readiness_wakes_the_siblings() {
    let tracker = ReadinessTracker::default();
    let crds = builtin("c1", "gateway-api-crds", false);
    assert!(tracker.changed(&crds), "a new Addon");
    assert!(!tracker.changed(&crds), "the same readiness again");
    let ready = builtin("c1", "gateway-api-crds", true);
    assert!(tracker.changed(&ready));
    assert!(!tracker.changed(&ready));
    let mut off = (*ready).clone();
    off.spec.enabled = false;
    assert!(tracker.changed(&off));
}

#[test]
fn status_writes_alone_do_not_retrigger() {
    let changes = SpecChanges::default();
    let mut a = (*builtin("c1", "cilium", false)).clone();
    assert!(changes.changed(&a));
    a.status = with_ready(a.clone(), true).status;
    assert!(!changes.changed(&a), "a status change");
    a.metadata.generation = Some(2);
    assert!(changes.changed(&a), "a spec change");
    a.metadata.finalizers = Some(vec![FINALIZER.into()]);
    assert!(changes.changed(&a), "the finalizer");
    a.metadata.deletion_timestamp = Some(at(5));
    assert!(changes.changed(&a), "the deletion");
    assert!(!changes.changed(&a));
}

#[test]
fn deleting_says_what_and_until_when_on_ready_too() {
    let a = with_ready(
        addon("x", json!({ "talosClusterRef": { "name": "c1" } })),
        true,
    );
    let s = deleting_status(
        &a,
        AddonReason::UninstallFailed,
        "uninstalling release x failed: unreachable; gives up at T".into(),
        &at(9),
    );
    let deleting = conditions::get(&s.conditions, "Deleting").unwrap();
    assert_eq!(
        (deleting.status.as_str(), deleting.reason.as_str()),
        ("True", "UninstallFailed")
    );
    assert_eq!(
        ready_of(&s),
        (
            "False".into(),
            "Deleting".into(),
            "uninstalling release x failed: unreachable; gives up at T".into()
        )
    );
}

#[test]
fn durations_parse_with_units() {
    assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
    assert_eq!(parse_duration("15s").unwrap(), Duration::from_secs(15));
    assert_eq!(parse_duration("30").unwrap(), Duration::from_secs(30));
    assert_eq!(parse_duration("5m").unwrap(), Duration::from_secs(300));
    assert_eq!(parse_duration("1h").unwrap(), Duration::from_secs(3600));
    assert!(parse_duration("0s").is_err());
    assert!(parse_duration("5 minutes").is_err());
    assert!(parse_duration("x").is_err());
}

#[test]
fn the_uninstall_deadline_counts_from_the_deletion() {
    let mut a = addon("x", json!({ "talosClusterRef": { "name": "c1" } }));
    assert_eq!(uninstall_deadline(&a, Duration::from_secs(60)), None);
    a.metadata.deletion_timestamp = Some(at(1000));
    assert_eq!(
        uninstall_deadline(&a, Duration::from_secs(60)),
        Some(Timestamp::from_second(1060).unwrap())
    );
}

#[test]
fn an_unreachable_zone_cluster_is_said_so_and_keeps_what_is_installed() {
    let mut a = addon(
        "c1-cilium",
        json!({ "talosClusterRef": { "name": "c1" }, "releaseName": "cilium" }),
    );
    let gone = Error::Timeout("reading the release".into());
    assert!(unreachable(&gone));
    let Outcome::Unreachable(message) = failed(&gone, "release cilium") else {
        panic!("not Unreachable");
    };
    assert_eq!(
        message,
        "the zone cluster does not answer (release cilium): reading the release timed out"
    );
    let refused = Error::Downstream(crate::downstream::DownstreamError::Api {
        what: "reading the release".into(),
        source: kube::Error::Api(
            kube::core::Status::failure("boom", "InternalError")
                .with_code(500)
                .boxed(),
        ),
    });
    assert!(
        !unreachable(&refused),
        "an answer, even an error, is not unreachable"
    );

    // Never installed: Installed says so too.
    let first = status(&a, &Outcome::Unreachable(message.clone()), None, &at(10));
    assert_eq!(
        conditions::get(&first.conditions, "Installed").map(|c| c.reason.as_str()),
        Some("ClusterUnreachable")
    );
    // Installed and healthy: Installed stays, health is unknown, Ready says why.
    let ok = Outcome::Installed {
        summary: "s".into(),
        chart_version: Some("1.20.1".into()),
        revision: Some(4),
        health: Health::Healthy,
    };
    a.status = Some(status(&a, &ok, None, &at(10)));
    let lost = status(&a, &Outcome::Unreachable(message.clone()), None, &at(20));
    assert!(conditions::is_true(&lost.conditions, "Installed"));
    assert_eq!(lost.revision, Some(4));
    let healthy = conditions::get(&lost.conditions, "Healthy").unwrap();
    assert_eq!(
        (healthy.status.as_str(), healthy.reason.as_str()),
        ("Unknown", "ClusterUnreachable")
    );
    assert_eq!(
        ready_of(&lost),
        ("Unknown".into(), "ClusterUnreachable".into(), message)
    );
}

#[test]
fn a_cluster_wakes_its_addons_for_what_they_read_not_for_condition_writes() {
    let cluster: TalosCluster = serde_json::from_value(json!({
        "apiVersion": "kontinuum.sh/v1alpha2", "kind": "TalosCluster",
        "metadata": { "name": "c", "namespace": "ns", "generation": 1, "resourceVersion": "5" },
        "spec": { "controlPlane": { "poolRef": { "name": "p" } } },
        "status": {
            "conditions": [{ "type": "Ready", "status": "False", "reason": "Bootstrapping",
                "message": "m", "lastTransitionTime": "2026-01-01T00:00:00Z" }],
            "observedGeneration": 1
        }
    }))
    .unwrap();
    let key = cluster_trigger_key(&cluster);

    // The bootstrapper's progress writes: conditions, observed generation, resource version.
    let mut progress = cluster.clone();
    let status = progress.status.as_mut().unwrap();
    status.conditions[0].status = "True".into();
    status.conditions[0].reason = "Ready".into();
    status.observed_generation = Some(2);
    progress.metadata.resource_version = Some("6".into());
    assert_eq!(cluster_trigger_key(&progress), key);

    // What an Addon reads: its kubeconfig Secret, the endpoint (for $cel), deletion, labels.
    let mut kubeconfig = cluster.clone();
    kubeconfig.status.as_mut().unwrap().secret_ref =
        Some(serde_json::from_value(json!({ "name": "taloscluster-c-kubeconfig" })).unwrap());
    let mut endpoint = cluster.clone();
    endpoint.status.as_mut().unwrap().endpoint = Some("https://192.0.2.1:6443".into());
    let mut deleting = cluster.clone();
    deleting.metadata.deletion_timestamp = Some(at(9));
    let mut labelled = cluster.clone();
    labelled.metadata.labels = Some([("a".to_owned(), "b".to_owned())].into());
    for changed in [kubeconfig, endpoint, deleting, labelled] {
        assert_ne!(cluster_trigger_key(&changed), key);
    }
}
