//! The shared operator runtime against the real API server: status writes are skipped when
//! nothing but timestamps changed (and `lastTransitionTime` moves only on a status flip),
//! and leader election hands the Lease over when the leader stops.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::large_futures
)]

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kontinuum_crds::conditions::{self, ConditionStatus};
use kontinuum_crds::v1alpha2::{Zone, ZoneStatus};
use kontinuum_e2e::{eventually, install_kontinuum_crds, namespace, shared_client};
use kontinuum_operator_common::admin::Readiness;
use kontinuum_operator_common::args::LeaderArgs;
use kontinuum_operator_common::leader::Leadership;
use kontinuum_operator_common::shutdown::{Reason, Shutdown};
use kontinuum_operator_common::status::apply_status;
use kube::ResourceExt as _;
use kube::api::{Api, PostParams};

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

#[tokio::test]
async fn status_is_written_only_when_it_changes() {
    let (client, _) = shared_client().await.unwrap();
    install_kontinuum_crds(&client).await.unwrap();
    let ns = namespace(&client, "status").await.unwrap();
    let zones: Api<Zone> = Api::namespaced(client.clone(), &ns);
    let zone: Zone = serde_json::from_value(serde_json::json!({
        "apiVersion": "kontinuum.sh/v1alpha2", "kind": "Zone",
        "metadata": { "name": "eu-west-1a" },
        "spec": { "region": "eu", "zone": "west-1a" }
    }))
    .unwrap();
    zones.create(&PostParams::default(), &zone).await.unwrap();

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

fn leader_args(ns: &str, identity: &str) -> LeaderArgs {
    LeaderArgs {
        leader_elect: true,
        lease_name: Some("e2e-operator".into()),
        lease_namespace: ns.to_string(),
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
