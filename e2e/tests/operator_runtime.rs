//! The shared operator runtime against the real API server: status writes are skipped when
//! nothing but timestamps changed (and `lastTransitionTime` moves only on a status flip) or
//! when a cache behind the process's own last write would repeat it (counted in the audit log),
//! and leader election hands the Lease over when the leader stops; an operator binary elects
//! a leader by default, in its pod's namespace (never a fixed one), and logs at `info`; a
//! repeated Event is counted on one Event's series.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::large_futures
)]

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::events::v1::Event as K8sEvent;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kontinuum_crds::conditions::{self, ConditionStatus};
use kontinuum_crds::v1alpha2::{Zone, ZoneStatus};
use kontinuum_e2e::{audit_writes, eventually, install_kontinuum_crds, namespace, shared_client};
use kontinuum_operator_common::admin::Readiness;
use kontinuum_operator_common::args::LeaderArgs;
use kontinuum_operator_common::events::Events;
use kontinuum_operator_common::leader::Leadership;
use kontinuum_operator_common::shutdown::{Reason, Shutdown};
use kontinuum_operator_common::status::{StatusWrites, apply_status};
use kontinuum_operator_common::tracked::Forget as _;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::{Resource as _, ResourceExt as _};

const MANAGER: &str = "e2e-status.kontinuum.sh";

fn status_with(status: ConditionStatus, message: &str, now: i64) -> (ZoneStatus, Time) {
    let now = Time(Timestamp::from_second(now).unwrap());
    let mut s = ZoneStatus {
        observed_generation: Some(1),
        ..ZoneStatus::default()
    };
    conditions::set(
        &mut s.conditions,
        conditions::new(
            "ClusterReady",
            status,
            "WaitingForTalosCluster",
            message,
            Some(1),
        ),
        &now,
    );
    (s, now)
}

/// A Zone `eu-west-1a` in a new namespace: its Api, the Zone as created, the audit log.
async fn new_zone(prefix: &str) -> (Api<Zone>, Zone, std::path::PathBuf) {
    let (client, shared) = shared_client().await.unwrap();
    install_kontinuum_crds(&client).await.unwrap();
    let ns = namespace(&client, prefix).await.unwrap();
    let zones: Api<Zone> = Api::namespaced(client.clone(), &ns);
    let zone: Zone = serde_json::from_value(serde_json::json!({
        "apiVersion": "kontinuum.sh/v1alpha2", "kind": "Zone",
        "metadata": { "name": "eu-west-1a" },
        "spec": { "region": "eu", "zone": "west-1a" }
    }))
    .unwrap();
    let created = zones.create(&PostParams::default(), &zone).await.unwrap();
    (zones, created, shared.audit_log())
}

#[tokio::test]
async fn status_is_written_only_when_it_changes() {
    let (zones, _, _) = new_zone("status").await;

    let (first, _) = status_with(ConditionStatus::False, "waiting", 1_000);
    assert!(
        apply_status(&zones, "eu-west-1a", MANAGER, None, &first)
            .await
            .unwrap()
    );
    let stored = zones.get("eu-west-1a").await.unwrap();
    let rv = stored.resource_version();

    // Same status computed at a later time: nothing to write.
    let (mut again, later) = status_with(ConditionStatus::False, "waiting", 2_000);
    let current = stored.status.clone().unwrap();
    for c in &mut again.conditions {
        c.last_transition_time = later.clone();
    }
    assert!(
        !apply_status(&zones, "eu-west-1a", MANAGER, Some(&current), &again)
            .await
            .unwrap()
    );
    assert_eq!(
        zones.get("eu-west-1a").await.unwrap().resource_version(),
        rv
    );

    // A new message is written; its lastTransitionTime stays, since the status did not flip.
    let mut changed = current.clone();
    conditions::set(
        &mut changed.conditions,
        conditions::new(
            "ClusterReady",
            ConditionStatus::False,
            "WaitingForTalosCluster",
            "still waiting",
            Some(1),
        ),
        &later,
    );
    assert!(
        apply_status(&zones, "eu-west-1a", MANAGER, Some(&current), &changed)
            .await
            .unwrap()
    );
    let stored = zones.get("eu-west-1a").await.unwrap().status.unwrap();
    let c = conditions::get(&stored.conditions, "ClusterReady").unwrap();
    assert_eq!(c.message, "still waiting");
    assert_eq!(
        c.last_transition_time,
        Time(Timestamp::from_second(1_000).unwrap())
    );
}

/// A reconcile that starts from the version of the object its own last status write was
/// computed from (the watch has not delivered that write yet) and computes the same status
/// writes nothing; anything else is written: another status from that version, and our status
/// again once another manager has changed it. Counted from the audit log.
#[tokio::test]
async fn a_status_written_is_not_written_again_from_a_cache_behind_it() {
    let (zones, stale, log) = new_zone("status-writes").await;
    let ns = stale.namespace().unwrap();
    let status_path = format!("/namespaces/{ns}/zones/eu-west-1a/status");
    let status_writes = || {
        audit_writes(&log, "admin")
            .unwrap()
            .iter()
            .filter(|e| e.request_u_r_i.contains(&status_path))
            .count()
    };
    let writes = StatusWrites::new("status_writes");

    let (first, _) = status_with(ConditionStatus::False, "waiting", 1_000);
    assert!(
        writes
            .apply(&zones, &stale, MANAGER, None, &first)
            .await
            .unwrap()
    );
    assert_eq!(status_writes(), 1);

    // The same object again, still without the status just written (a cache behind it), and
    // the same status computed a second later: already on the server, not written.
    let (again, _) = status_with(ConditionStatus::False, "waiting", 1_001);
    assert!(
        !writes
            .apply(&zones, &stale, MANAGER, None, &again)
            .await
            .unwrap()
    );
    assert_eq!(
        status_writes(),
        1,
        "the repeat from the stale object was skipped"
    );

    // Another status from that same version is written.
    let (other, _) = status_with(ConditionStatus::False, "still waiting", 1_002);
    assert!(
        writes
            .apply(&zones, &stale, MANAGER, None, &other)
            .await
            .unwrap()
    );
    assert_eq!(status_writes(), 2);

    // The cache catches up: equal, nothing written, and the entry goes.
    let fresh = zones.get("eu-west-1a").await.unwrap();
    assert!(
        !writes
            .apply(&zones, &fresh, MANAGER, fresh.status.as_ref(), &other)
            .await
            .unwrap()
    );
    assert_eq!(writes.retain_live(&|_| false), 0, "no entry is left");
    assert_eq!(status_writes(), 2);

    // We write a status, another manager overwrites it, and our next reconcile computes ours
    // again: the object it starts from is a version we did not write from, so it is written.
    let (ours, _) = status_with(ConditionStatus::True, "ready", 1_003);
    assert!(
        writes
            .apply(&zones, &fresh, MANAGER, fresh.status.as_ref(), &ours)
            .await
            .unwrap()
    );
    let (theirs, _) = status_with(ConditionStatus::False, "theirs", 1_004);
    apply_status(
        &zones,
        "eu-west-1a",
        "e2e-other.kontinuum.sh",
        None,
        &theirs,
    )
    .await
    .unwrap();
    let changed = zones.get("eu-west-1a").await.unwrap();
    assert!(
        writes
            .apply(&zones, &changed, MANAGER, changed.status.as_ref(), &ours)
            .await
            .unwrap()
    );
    assert_eq!(status_writes(), 5);
    let stored = zones.get("eu-west-1a").await.unwrap().status.unwrap();
    assert_eq!(
        conditions::get(&stored.conditions, "ClusterReady")
            .unwrap()
            .message,
        "ready"
    );

    // An entry goes with its object.
    writes.forget(&format!("{ns}/eu-west-1a"));
    assert_eq!(
        writes.retain_live(&|_| false),
        0,
        "forgotten with its object"
    );
}

/// A repeated Warning is one Event whose `series` counts the repeats (the API server accepts
/// what we create and patch), another reason is another Event, and a repeat after the first
/// Event was deleted creates a new one instead of failing.
#[tokio::test]
async fn a_repeated_event_is_one_event_with_a_series() {
    let (client, _) = shared_client().await.unwrap();
    let ns = namespace(&client, "events").await.unwrap();
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let object = config_maps
        .create(
            &PostParams::default(),
            &serde_json::from_value(serde_json::json!({
                "apiVersion": "v1", "kind": "ConfigMap", "metadata": { "name": "subject" }
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    let reference = object.object_ref(&());
    let publisher = Events::new(client.clone(), "e2e-events", Some("e2e-0".into()));
    for _ in 0..3 {
        publisher
            .warning(&reference, "ProbeFailed", "Probe", "no answer".into())
            .await;
    }
    publisher
        .normal(&reference, "Discovered", "Probe", "answered".into())
        .await;
    let events: Api<K8sEvent> = Api::namespaced(client.clone(), &ns);
    let listed = events.list(&ListParams::default()).await.unwrap().items;
    let by_reason = |reason: &str| -> Vec<K8sEvent> {
        listed
            .iter()
            .filter(|e| e.reason.as_deref() == Some(reason))
            .cloned()
            .collect()
    };
    let failed = by_reason("ProbeFailed");
    assert_eq!(failed.len(), 1, "three repeats, one Event: {failed:?}");
    let failed = &failed[0];
    assert_eq!(failed.series.as_ref().map(|s| s.count), Some(3));
    assert_eq!(failed.type_.as_deref(), Some("Warning"));
    assert_eq!(
        failed.reporting_controller.as_deref(),
        Some("e2e-events.kontinuum.sh")
    );
    assert_eq!(failed.reporting_instance.as_deref(), Some("e2e-0"));
    assert_eq!(
        failed.regarding.as_ref().and_then(|r| r.uid.clone()),
        object.metadata.uid
    );
    let discovered = by_reason("Discovered");
    assert_eq!(discovered.len(), 1);
    assert!(discovered[0].series.is_none());

    // The first Event deleted: the next repeat publishes a new one.
    events
        .delete(&failed.name_any(), &DeleteParams::default())
        .await
        .unwrap();
    publisher
        .warning(&reference, "ProbeFailed", "Probe", "no answer".into())
        .await;
    let again: Vec<K8sEvent> = events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("ProbeFailed"))
        .collect();
    assert_eq!(again.len(), 1, "{again:?}");
    assert_ne!(again[0].name_any(), failed.name_any());
    assert!(again[0].series.is_none());
}

fn leader_args(ns: &str, identity: &str) -> LeaderArgs {
    LeaderArgs {
        leader_elect: true,
        lease_name: Some("e2e-operator".into()),
        lease_namespace: Some(ns.to_string()),
        lease_duration_seconds: 4,
        identity: Some(identity.into()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lease_moves_to_the_other_replica_when_the_leader_stops() {
    let (client, _) = shared_client().await.unwrap();
    let ns = namespace(&client, "lease").await.unwrap();
    let replica = |identity: &'static str| {
        let client = client.clone();
        let ns = ns.clone();
        async move {
            let readiness = Readiness::new(true);
            readiness.set_synced();
            let shutdown = Shutdown::new();
            let leadership = Leadership::start(
                client,
                &leader_args(&ns, identity),
                "e2e-operator",
                identity.to_string(),
                readiness.clone(),
                shutdown.clone(),
                None,
            )
            .await
            .unwrap();
            (leadership, readiness, shutdown)
        }
    };
    let (a, ready_a, stop_a) = replica("replica-a").await;
    let (b, ready_b, stop_b) = replica("replica-b").await;

    eventually(Duration::from_secs(20), "one leader", || async {
        Ok(a.is_leader() ^ b.is_leader())
    })
    .await
    .unwrap();
    let (leader, follower, leader_stop, follower_ready, leader_ready) = if a.is_leader() {
        (a, b, stop_a, ready_b, ready_a)
    } else {
        (b, a, stop_b, ready_a, ready_b)
    };
    assert!(leader_ready.check().is_ok());
    assert_eq!(follower_ready.check(), Err("not the leader"));

    // Stopping the leader releases the Lease; the follower takes it within a lease duration.
    leader_stop.trigger(Reason::Signal);
    let mut follower = follower;
    tokio::time::timeout(Duration::from_secs(10), follower.acquired())
        .await
        .unwrap();
    assert!(follower.is_leader());
    assert!(follower_ready.check().is_ok());
    eventually(
        Duration::from_secs(5),
        "the old leader to step down",
        || async { Ok(!leader.is_leader() || leader_ready.check().is_err()) },
    )
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_the_lease_stops_the_process() {
    use k8s_openapi::api::coordination::v1::Lease;
    use kube::api::{Patch, PatchParams};

    let (client, _) = shared_client().await.unwrap();
    let ns = namespace(&client, "lease-lost").await.unwrap();
    let readiness = Readiness::new(true);
    readiness.set_synced();
    let shutdown = Shutdown::new();
    let mut leadership = Leadership::start(
        client.clone(),
        &leader_args(&ns, "replica-a"),
        "e2e-operator",
        "replica-a".into(),
        readiness.clone(),
        shutdown.clone(),
        None,
    )
    .await
    .unwrap();
    tokio::time::timeout(Duration::from_secs(10), leadership.acquired())
        .await
        .unwrap();

    // Another party takes the Lease over (as after a network partition).
    let leases: Api<Lease> = Api::namespaced(client, &ns);
    let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(Timestamp::now());
    let patch = serde_json::json!({
        "spec": { "holderIdentity": "intruder", "acquireTime": now, "renewTime": now, "leaseDurationSeconds": 3600 }
    });
    leases
        .patch(
            "e2e-operator",
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .unwrap();

    tokio::time::timeout(Duration::from_secs(20), shutdown.wait())
        .await
        .unwrap();
    assert_eq!(
        shutdown.reason(),
        Some(Reason::Fatal("lost the leader lease".into()))
    );
    assert_eq!(readiness.check(), Err("not the leader"));
}

/// An operator binary with no leader-election flags (the defaults), as a process: it holds
/// a Lease in the namespace it is given (`POD_NAMESPACE`, else the one it watches), logs at
/// `info`, and refuses to start when no namespace for the Lease is known instead of
/// falling back to a fixed one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_elects_a_leader_by_default_in_its_own_namespace() {
    use k8s_openapi::api::coordination::v1::Lease;
    use kontinuum_e2e::workspace_binary;

    let (client, shared) = shared_client().await.unwrap();
    install_kontinuum_crds(&client).await.unwrap();
    let ns = namespace(&client, "default-lease").await.unwrap();
    let pod_ns = namespace(&client, "default-lease-pod").await.unwrap();
    let bin = workspace_binary("pool-claimer").unwrap();
    let dir = kontinuum_e2e::testbed::unique_dir("default-lease");
    std::fs::create_dir_all(&dir).unwrap();
    let run = |name: &str, args: &[&str], pod_namespace: Option<&str>| {
        let port = kontinuum_e2e::testbed::free_port([127, 0, 0, 1].into()).unwrap();
        let log = std::fs::File::create(dir.join(format!("{name}.log"))).unwrap();
        let mut cmd = tokio::process::Command::new(&bin);
        cmd.arg("--kubeconfig")
            .arg(&shared.kubeconfig_path)
            .arg(format!("--admin-addr=127.0.0.1:{port}"))
            .args(["--log-format", "text"])
            .args(args)
            .env_remove("POD_NAMESPACE")
            .env_remove("KONTINUUM_LEADER_ELECT")
            .env_remove("KONTINUUM_LOG_LEVEL")
            .env("POD_NAME", name)
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .kill_on_drop(true);
        if let Some(pod_namespace) = pod_namespace {
            cmd.env("POD_NAMESPACE", pod_namespace);
        }
        cmd.spawn().unwrap()
    };
    let holder = |lease_ns: String| {
        let leases: Api<Lease> = Api::namespaced(client.clone(), &lease_ns);
        async move {
            leases
                .get_opt("pool-claimer")
                .await
                .unwrap()
                .and_then(|l| l.spec?.holder_identity)
        }
    };

    // Watching one namespace, no POD_NAMESPACE: the Lease is in the watched namespace.
    let _watching = run("watching", &["--namespace", &ns], None);
    eventually(
        Duration::from_secs(60),
        "a Lease in the watched namespace",
        || async { Ok(holder(ns.clone()).await.as_deref() == Some("watching")) },
    )
    .await
    .unwrap();
    let log = std::fs::read_to_string(dir.join("watching.log")).unwrap();
    assert!(log.contains("INFO"), "logs at info by default:\n{log}");

    // POD_NAMESPACE wins over the watched namespace.
    let _pod = run("in-pod", &["--namespace", &ns], Some(&pod_ns));
    eventually(
        Duration::from_secs(60),
        "a Lease in the pod's namespace",
        || async { Ok(holder(pod_ns.clone()).await.as_deref() == Some("in-pod")) },
    )
    .await
    .unwrap();

    // All namespaces and no POD_NAMESPACE: no namespace for the Lease, so it stops at start
    // naming the variable (the old fallback was a fixed `kontinuum-system`).
    let mut lost = run("nowhere", &[], None);
    let status = tokio::time::timeout(Duration::from_secs(60), lost.wait())
        .await
        .expect("the binary did not stop")
        .unwrap();
    assert!(!status.success());
    let log = std::fs::read_to_string(dir.join("nowhere.log")).unwrap();
    assert!(log.contains("POD_NAMESPACE"), "{log}");
    assert!(
        holder("kontinuum-system".into()).await.as_deref() != Some("nowhere"),
        "no Lease in a fixed namespace"
    );
}
