//! zone-installer as a host process against the real test bed: the hub (shared control
//! plane) and, for the identity and footprint, a real zone cluster (a second control plane)
//! whose kubeconfig a hand-made Ready TalosCluster names, where the talos-bootstrapper
//! would. The operator runs with its own ServiceAccount, so the audit log tells its writes.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::large_futures,
    clippy::too_many_lines
)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use k8s_openapi::jiff::Timestamp;
use kontinuum_crds::labels::{CLAIMED_BY, IDENTITY_THUMBPRINT, REGION, ROTATE_IDENTITY, ZONE};
use kontinuum_crds::names::seed_instance_name;
use kontinuum_crds::v1alpha2::{Instance, InstancePool, Kontinuum, TalosCluster, Zone};
use kontinuum_e2e::zone::{wait_zone_condition, zone_condition};
use kontinuum_e2e::{
    Operator, audit_writes, eventually, install_kontinuum_crds, namespace,
    service_account_kubeconfig, service_account_user, shared_client,
};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt as _};
use serde_json::json;
use zone_installer::identity;

const LIMIT: Duration = Duration::from_secs(60);

/// The operator, as its own ServiceAccount (bound to cluster-admin: the chart's role is the
/// lead's to write), watching `ns`.
async fn operator(kubeconfig: &Path, ns: &str, extra: &[&str]) -> Operator {
    let mut args = vec![
        "--namespace",
        ns,
        "--insecure-allow-anonymous",
        "true",
        "--retry-interval",
        "1s",
    ];
    args.extend_from_slice(extra);
    Operator::start(
        Path::new(env!("CARGO_BIN_EXE_zone-installer")),
        "zone-installer",
        kubeconfig,
        &args,
    )
    .await
    .unwrap()
}

async fn operator_account(client: &Client, ns: &str) -> (PathBuf, String) {
    let (_, shared) = shared_client().await.unwrap();
    let name = "zone-installer";
    let kubeconfig = service_account_kubeconfig(client, shared, ns, name, "cluster-admin")
        .await
        .unwrap();
    (kubeconfig, service_account_user(ns, name))
}

async fn create_zone(client: &Client, ns: &str, region: &str, zone: &str, seed: &[&str]) {
    let mut spec = json!({ "region": region, "zone": zone });
    if !seed.is_empty() {
        spec["seed"] = json!({ "talosAddresses": seed });
    }
    let z: Zone = serde_json::from_value(json!({
        "apiVersion": "kontinuum.sh/v1alpha2", "kind": "Zone",
        "metadata": { "name": format!("{region}-{zone}") }, "spec": spec,
    }))
    .unwrap();
    Api::<Zone>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &z)
        .await
        .unwrap();
}

async fn create_instance(
    client: &Client,
    ns: &str,
    name: &str,
    address: &str,
    claimed_by: Option<&str>,
) {
    let mut labels = serde_json::Map::new();
    if let Some(pool) = claimed_by {
        labels.insert(CLAIMED_BY.into(), json!(pool));
    }
    let i: Instance = serde_json::from_value(json!({
        "apiVersion": "kontinuum.sh/v1alpha2", "kind": "Instance",
        "metadata": { "name": name, "labels": labels },
        "spec": { "interfaces": [address] },
    }))
    .unwrap();
    Api::<Instance>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &i)
        .await
        .unwrap();
}

/// Waits for the Zone's condition and returns its message.
async fn wait_condition(
    client: &Client,
    ns: &str,
    zone: &str,
    type_: &str,
    status: &str,
    reason: &str,
) -> String {
    wait_zone_condition(client, ns, zone, (type_, status, reason), LIMIT)
        .await
        .unwrap()
        .2
}

fn controller_owner(refs: &[OwnerReference]) -> Option<(&str, &str)> {
    refs.iter()
        .find(|r| r.controller == Some(true))
        .map(|r| (r.kind.as_str(), r.name.as_str()))
}

fn writes(user: &str) -> Vec<String> {
    let log = kontinuum_e2e::testbed::shared().unwrap().audit_log();
    audit_writes(&log, user)
        .unwrap()
        .into_iter()
        .map(|e| format!("{} {}", e.verb, e.request_u_r_i))
        .collect()
}

fn reconciles(metrics: &str) -> u64 {
    metrics
        .lines()
        .find(|l| l.starts_with("kontinuum_zone_installer_reconcile_total"))
        .and_then(|l| l.split_whitespace().last())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fans_out_a_zone_adopts_refuses_and_takes_it_back_without_rewrites() {
    let (client, _) = shared_client().await.unwrap();
    install_kontinuum_crds(&client).await.unwrap();
    let ns = namespace(&client, "zone-fanout").await.unwrap();
    let (kubeconfig, user) = operator_account(&client, &ns).await;
    // An unclaimed Instance at one seed address (adopted), one claimed elsewhere (refused).
    create_instance(&client, &ns, "by-hand", "192.0.2.11", None).await;
    create_instance(&client, &ns, "taken", "192.0.2.12", Some("other-pool")).await;
    let mut op = operator(&kubeconfig, &ns, &[]).await;
    let started = Instant::now();
    create_zone(&client, &ns, "eu", "a", &["192.0.2.10", "192.0.2.11"]).await;
    create_zone(&client, &ns, "eu", "b", &["192.0.2.12"]).await;
    create_zone(&client, &ns, "eu", "c", &[]).await;

    // eu-a: Zone → TalosCluster → InstancePool, seed Instances labelled, never owned.
    let message = wait_condition(
        &client,
        &ns,
        "eu-a",
        "ClusterReady",
        "False",
        "WaitingForTalosCluster",
    )
    .await;
    let fanned_out = started.elapsed();
    assert!(message.contains("TalosCluster eu-a"), "{message}");
    let cluster = Api::<TalosCluster>::namespaced(client.clone(), &ns)
        .get("eu-a")
        .await
        .unwrap();
    assert_eq!(
        controller_owner(cluster.owner_references()),
        Some(("Zone", "eu-a"))
    );
    assert_eq!(cluster.spec.control_plane.pool_ref.name, "eu-a");
    let pool = Api::<InstancePool>::namespaced(client.clone(), &ns)
        .get("eu-a")
        .await
        .unwrap();
    assert_eq!(
        controller_owner(pool.owner_references()),
        Some(("TalosCluster", "eu-a"))
    );
    assert_eq!(pool.spec.replicas, 1);
    let selector = pool.spec.selector.match_labels.clone().unwrap();
    assert_eq!(selector.get(REGION).map(String::as_str), Some("eu"));
    assert_eq!(selector.get(ZONE).map(String::as_str), Some("a"));
    let instances = Api::<Instance>::namespaced(client.clone(), &ns);
    let seed = instances
        .get(&seed_instance_name("eu", "a", "192.0.2.10").unwrap())
        .await
        .unwrap();
    assert_eq!(seed.spec.interfaces, ["192.0.2.10"]);
    let adopted = instances.get("by-hand").await.unwrap();
    assert!(
        instances
            .get_opt(&seed_instance_name("eu", "a", "192.0.2.11").unwrap())
            .await
            .unwrap()
            .is_none(),
        "adopted, not duplicated"
    );
    for i in [&seed, &adopted] {
        assert_eq!(i.labels().get(REGION).map(String::as_str), Some("eu"));
        assert_eq!(i.labels().get(ZONE).map(String::as_str), Some("a"));
        assert!(i.owner_references().is_empty(), "Instances are never owned");
    }

    // eu-b: the claimed Instance is refused by name, and left alone.
    let message = wait_condition(
        &client,
        &ns,
        "eu-b",
        "ClusterReady",
        "False",
        "SeedInstanceClaimed",
    )
    .await;
    assert!(
        message.contains("Instance taken") && message.contains("InstancePool other-pool"),
        "{message}"
    );
    let taken = instances.get("taken").await.unwrap();
    assert_eq!(
        taken.labels().get(CLAIMED_BY).map(String::as_str),
        Some("other-pool")
    );
    assert!(taken.labels().get(REGION).is_none());

    // eu-c: no seed, so it waits for a TalosCluster made by hand.
    wait_condition(
        &client,
        &ns,
        "eu-c",
        "ClusterReady",
        "False",
        "TalosClusterNotFound",
    )
    .await;
    let ready = zone_condition(&client, &ns, "eu-c", "Ready").await.unwrap();
    assert_eq!(
        (ready.0.as_str(), ready.1.as_str()),
        ("False", "TalosClusterNotFound")
    );
    for c in ["Installed", "RegistryJoined"] {
        assert!(
            zone_condition(&client, &ns, "eu-c", c).await.is_some(),
            "{c} written on the first visit"
        );
    }
    let by_hand: TalosCluster = serde_json::from_value(json!({
        "apiVersion": "kontinuum.sh/v1alpha2", "kind": "TalosCluster",
        "metadata": { "name": "eu-c" }, "spec": { "controlPlane": { "poolRef": { "name": "eu-c" } } },
    }))
    .unwrap();
    Api::<TalosCluster>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &by_hand)
        .await
        .unwrap();
    wait_condition(
        &client,
        &ns,
        "eu-c",
        "ClusterReady",
        "False",
        "WaitingForTalosCluster",
    )
    .await;

    // Re-reconciling unchanged Zones writes nothing: a fresh operator reconciles each again.
    // First let this one finish what it started (its last writes are not the new one's).
    eventually(LIMIT, "the first operator to settle", || {
        let op = &op;
        async move {
            let a = reconciles(&op.metrics().await?);
            tokio::time::sleep(Duration::from_millis(500)).await;
            Ok(reconciles(&op.metrics().await?) == a)
        }
    })
    .await
    .unwrap();
    op.kill().await.unwrap();
    let before = writes(&user);
    let op = operator(&kubeconfig, &ns, &[]).await;
    eventually(LIMIT, "every Zone reconciled again", || async {
        Ok(reconciles(&op.metrics().await?) >= 3)
    })
    .await
    .unwrap();
    // The stores may still deliver the other kinds' initial events: let those settle too.
    eventually(LIMIT, "reconciles to settle", || {
        let op = &op;
        async move {
            let a = reconciles(&op.metrics().await?);
            tokio::time::sleep(Duration::from_millis(500)).await;
            Ok(reconciles(&op.metrics().await?) == a)
        }
    })
    .await
    .unwrap();
    let after = writes(&user);
    assert_eq!(
        after.len(),
        before.len(),
        "no writes on re-reconcile: {:?}",
        &after[before.len()..]
    );

    // Deleting the Zone deletes its TalosCluster (GC takes the pool); Instances stay.
    Api::<Zone>::namespaced(client.clone(), &ns)
        .delete("eu-a", &DeleteParams::default())
        .await
        .unwrap();
    eventually(LIMIT, "Zone eu-a and its TalosCluster gone", || async {
        Ok(Api::<Zone>::namespaced(client.clone(), &ns)
            .get_opt("eu-a")
            .await?
            .is_none()
            && Api::<TalosCluster>::namespaced(client.clone(), &ns)
                .get_opt("eu-a")
                .await?
                .is_none())
    })
    .await
    .unwrap();
    assert!(instances.get_opt("by-hand").await.unwrap().is_some());
    assert!(instances.get_opt(&seed.name_any()).await.unwrap().is_some());
    eprintln!(
        "fan-out observed after {fanned_out:?}; writes {}",
        before.len()
    );
}

/// A Ready TalosCluster `name` in `ns` whose kubeconfig Secret points at `zone_kubeconfig`.
async fn ready_cluster(client: &Client, ns: &str, name: &str, zone_kubeconfig: &str) {
    kontinuum_e2e::addons::seed_cluster(client, ns, name, zone_kubeconfig, 1)
        .await
        .unwrap();
    let status = json!({ "status": { "conditions": [{
        "type": "Ready", "status": "True", "reason": "Ready", "message": "ready for the test",
        "lastTransitionTime": "2026-01-01T00:00:00Z" }] } });
    Api::<TalosCluster>::namespaced(client.clone(), ns)
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
}

async fn hub_certificates(client: &Client, ns: &str, zone: &str) -> Option<Vec<Vec<u8>>> {
    let secret = Api::<Secret>::namespaced(client.clone(), ns)
        .get_opt(&identity::secret_name(zone))
        .await
        .unwrap()?;
    Some(identity::certificates(
        &secret.data?.get(identity::CERT_KEY)?.0,
    ))
}

async fn thumbprint(client: &Client, ns: &str, zone: &str) -> Option<String> {
    Api::<Zone>::namespaced(client.clone(), ns)
        .get(zone)
        .await
        .unwrap()
        .status?
        .identity_thumbprint
}

/// The zone cluster's identity certificate and the Deployment's thumbprint annotation and
/// generation.
async fn downstream(down: &Client) -> (Vec<u8>, Option<String>, i64) {
    let secret = Api::<Secret>::namespaced(down.clone(), "kontinuum-system")
        .get("kontinuum-identity")
        .await
        .unwrap();
    let data = secret.data.unwrap();
    let cert = identity::certificates(&data["tls.crt"].0).remove(0);
    assert!(String::from_utf8_lossy(&data["tls.key"].0).contains("PRIVATE KEY"));
    let deployment = Api::<Deployment>::namespaced(down.clone(), "kontinuum-system")
        .get("kontinuum")
        .await
        .unwrap();
    let annotation = deployment
        .spec
        .template
        .metadata
        .and_then(|m| m.annotations)
        .and_then(|a| a.get(IDENTITY_THUMBPRINT).cloned());
    (
        cert,
        annotation,
        deployment.metadata.generation.unwrap_or(0),
    )
}

async fn annotate(client: &Client, ns: &str, zone: &str, value: &str) {
    let patch = json!({ "metadata": { "annotations": { ROTATE_IDENTITY: value } } });
    Api::<Zone>::namespaced(client.clone(), ns)
        .patch(zone, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identity_is_issued_rotated_revoked_and_the_footprint_torn_down() {
    let (client, shared) = shared_client().await.unwrap();
    install_kontinuum_crds(&client).await.unwrap();
    let ns = namespace(&client, "zone-identity").await.unwrap();
    let (kubeconfig, _) = operator_account(&client, &ns).await;
    let zone_cluster = kontinuum_e2e::addons::downstream_cluster(&shared.tools, "zone-identity")
        .await
        .unwrap();
    let down = zone_cluster.client();
    let _op = operator(
        &kubeconfig,
        &ns,
        &[
            "--hub-grpc-endpoint",
            "127.0.0.1:2379",
            "--identity-overlap",
            "8s",
            "--registry-ttl",
            "6s",
        ],
    )
    .await;
    create_zone(&client, &ns, "eu", "id", &[]).await;
    wait_condition(
        &client,
        &ns,
        "eu-id",
        "ClusterReady",
        "False",
        "TalosClusterNotFound",
    )
    .await;
    let started = Instant::now();
    ready_cluster(&client, &ns, "eu-id", zone_cluster.kubeconfig_yaml()).await;

    // Installed (no domain): the identity issued, the footprint applied downstream.
    let message = wait_condition(&client, &ns, "eu-id", "Installed", "True", "Installed").await;
    let installed_in = started.elapsed();
    assert!(message.contains("network exposure skipped"), "{message}");
    let hub = Api::<Secret>::namespaced(client.clone(), &ns)
        .get("eu-id-identity")
        .await
        .unwrap();
    assert_eq!(hub.type_.as_deref(), Some("kontinuum.sh/zone-identity"));
    assert_eq!(hub.labels().get(REGION).map(String::as_str), Some("eu"));
    assert_eq!(hub.labels().get(ZONE).map(String::as_str), Some("id"));
    assert_eq!(
        controller_owner(hub.owner_references()),
        Some(("Zone", "eu-id"))
    );
    let data = hub.data.clone().unwrap();
    assert_eq!(
        data.keys().collect::<Vec<_>>(),
        ["tls.crt"],
        "the hub holds no key"
    );
    let certs = hub_certificates(&client, &ns, "eu-id").await.unwrap();
    assert_eq!(certs.len(), 1);
    let first = identity::thumbprint(&certs[0]);
    assert_eq!(
        thumbprint(&client, &ns, "eu-id").await.as_deref(),
        Some(first.as_str())
    );
    let (cert, annotation, generation) = downstream(&down).await;
    assert_eq!(
        cert, certs[0],
        "the zone cluster holds the key of the certificate the hub trusts"
    );
    assert_eq!(annotation.as_deref(), Some(first.as_str()));
    let endpoint_zone = Api::<Zone>::namespaced(client.clone(), &ns)
        .get("eu-id")
        .await
        .unwrap();
    assert_eq!(endpoint_zone.status.unwrap().endpoint, None);

    // RegistryJoined: a Kontinuum of this zone heartbeating makes the zone Ready; once the
    // heartbeats stop for longer than the TTL, it is not Ready any more (never latched).
    let kontinuum: Kontinuum = serde_json::from_value(json!({
        "apiVersion": "kontinuum.sh/v1alpha2", "kind": "Kontinuum",
        "metadata": { "name": "eu-id-agent" }, "spec": { "region": "eu", "zone": "id" },
    }))
    .unwrap();
    let kontinuums = Api::<Kontinuum>::namespaced(client.clone(), &ns);
    kontinuums
        .create(&PostParams::default(), &kontinuum)
        .await
        .unwrap();
    let beat = json!({ "status": { "lastHeartbeatTime": Timestamp::now().to_string() } });
    kontinuums
        .patch_status("eu-id-agent", &PatchParams::default(), &Patch::Merge(&beat))
        .await
        .unwrap();
    let beat_at = Instant::now();
    wait_condition(
        &client,
        &ns,
        "eu-id",
        "RegistryJoined",
        "True",
        "RegistryJoined",
    )
    .await;
    wait_condition(&client, &ns, "eu-id", "Ready", "True", "Ready").await;
    wait_condition(
        &client,
        &ns,
        "eu-id",
        "RegistryJoined",
        "False",
        "WaitingForRegistry",
    )
    .await;
    let expired_after = beat_at.elapsed();
    assert!(
        expired_after >= Duration::from_secs(5),
        "expired after {expired_after:?}"
    );
    wait_condition(
        &client,
        &ns,
        "eu-id",
        "Ready",
        "False",
        "WaitingForRegistry",
    )
    .await;

    // Rotation: new key downstream, both certificates trusted during the overlap, the
    // Deployment changed once, then the old certificate dropped.
    annotate(&client, &ns, "eu-id", "1").await;
    eventually(LIMIT, "the rotation handled", || async {
        let z = Api::<Zone>::namespaced(client.clone(), &ns)
            .get("eu-id")
            .await?;
        Ok(z.status.and_then(|s| s.identity_rotation).as_deref() == Some("1"))
    })
    .await
    .unwrap();
    let second = thumbprint(&client, &ns, "eu-id").await.unwrap();
    assert_ne!(second, first);
    let certs = hub_certificates(&client, &ns, "eu-id").await.unwrap();
    assert_eq!(
        certs
            .iter()
            .map(|c| identity::thumbprint(c))
            .collect::<Vec<_>>(),
        [second.clone(), first.clone()],
        "new and old during the overlap"
    );
    let (cert, annotation, rotated_generation) = downstream(&down).await;
    assert_eq!(identity::thumbprint(&cert), second);
    assert_eq!(annotation.as_deref(), Some(second.as_str()));
    assert_eq!(
        rotated_generation,
        generation + 1,
        "the agent's pod template changed once"
    );
    eventually(
        LIMIT,
        "the old certificate dropped after the overlap",
        || async {
            Ok(hub_certificates(&client, &ns, "eu-id")
                .await
                .is_some_and(|c| c.len() == 1))
        },
    )
    .await
    .unwrap();
    assert_eq!(
        identity::thumbprint(&hub_certificates(&client, &ns, "eu-id").await.unwrap()[0]),
        second
    );
    assert_eq!(
        downstream(&down).await.2,
        rotated_generation,
        "no second restart"
    );
    assert_eq!(
        thumbprint(&client, &ns, "eu-id").await.as_deref(),
        Some(second.as_str()),
        "no second rotation"
    );

    // Revocation: deleting the hub Secret is not silently undone.
    Api::<Secret>::namespaced(client.clone(), &ns)
        .delete("eu-id-identity", &DeleteParams::default())
        .await
        .unwrap();
    let message = wait_condition(
        &client,
        &ns,
        "eu-id",
        "Installed",
        "False",
        "IdentityRevoked",
    )
    .await;
    assert!(message.contains(ROTATE_IDENTITY), "{message}");
    let ready = zone_condition(&client, &ns, "eu-id", "Ready")
        .await
        .unwrap();
    assert_eq!(ready.1, "IdentityRevoked");
    assert!(
        hub_certificates(&client, &ns, "eu-id").await.is_none(),
        "not re-issued"
    );
    // Re-admission by a rotation request.
    annotate(&client, &ns, "eu-id", "2").await;
    wait_condition(&client, &ns, "eu-id", "Installed", "True", "Installed").await;
    let third = thumbprint(&client, &ns, "eu-id").await.unwrap();
    assert_ne!(third, second);
    let certs = hub_certificates(&client, &ns, "eu-id").await.unwrap();
    assert!(
        certs.len() == 1 && identity::thumbprint(&certs[0]) == third,
        "a revoked key is not trusted again"
    );

    // Teardown: footprint removed from the zone cluster, TalosCluster deleted, finalizer off.
    let torn = Instant::now();
    Api::<Zone>::namespaced(client.clone(), &ns)
        .delete("eu-id", &DeleteParams::default())
        .await
        .unwrap();
    eventually(
        Duration::from_secs(120),
        "the Zone, its TalosCluster and the footprint gone",
        || async {
            Ok(Api::<Zone>::namespaced(client.clone(), &ns)
                .get_opt("eu-id")
                .await?
                .is_none()
                && Api::<TalosCluster>::namespaced(client.clone(), &ns)
                    .get_opt("eu-id")
                    .await?
                    .is_none()
                && Api::<Namespace>::all(down.clone())
                    .get_opt("kontinuum-system")
                    .await?
                    .is_none())
        },
    )
    .await
    .unwrap();
    let teardown = torn.elapsed();
    eprintln!(
        "installed {installed_in:?} after the cluster was Ready; registry expiry seen after {expired_after:?} (TTL 6s); teardown {teardown:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_zone_cluster_is_given_up_at_the_visible_deadline() {
    let (client, _) = shared_client().await.unwrap();
    install_kontinuum_crds(&client).await.unwrap();
    let ns = namespace(&client, "zone-deadline").await.unwrap();
    let (kubeconfig, _) = operator_account(&client, &ns).await;
    let _op = operator(
        &kubeconfig,
        &ns,
        &[
            "--hub-grpc-endpoint",
            "127.0.0.1:2379",
            "--teardown-timeout",
            "5s",
            "--downstream-timeout",
            "2s",
        ],
    )
    .await;
    // Nothing listens on port 1: the zone cluster refuses every connection.
    let dead = "apiVersion: v1\nkind: Config\nclusters:\n- name: dead\n  cluster:\n    server: https://127.0.0.1:1\n    insecure-skip-tls-verify: true\nusers:\n- name: u\n  user:\n    token: not-a-secret\ncontexts:\n- name: c\n  context:\n    cluster: dead\n    user: u\ncurrent-context: c\n";
    create_zone(&client, &ns, "eu", "dead", &[]).await;
    ready_cluster(&client, &ns, "eu-dead", dead).await;
    let message = wait_condition(
        &client,
        &ns,
        "eu-dead",
        "Installed",
        "False",
        "InstallFailed",
    )
    .await;
    assert!(message.contains("zone cluster"), "{message}");
    assert!(!message.contains("not-a-secret"), "{message}");

    let deleted = Instant::now();
    Api::<Zone>::namespaced(client.clone(), &ns)
        .delete("eu-dead", &DeleteParams::default())
        .await
        .unwrap();
    let message = wait_condition(
        &client,
        &ns,
        "eu-dead",
        "Deleting",
        "True",
        "DownstreamTeardownFailed",
    )
    .await;
    assert!(
        message.contains("the finalizer is removed anyway at"),
        "{message}"
    );
    let ready = zone_condition(&client, &ns, "eu-dead", "Ready")
        .await
        .unwrap();
    assert_eq!((ready.0.as_str(), ready.1.as_str()), ("False", "Deleting"));
    eventually(
        LIMIT,
        "the Zone and its TalosCluster gone after the deadline",
        || async {
            Ok(Api::<Zone>::namespaced(client.clone(), &ns)
                .get_opt("eu-dead")
                .await?
                .is_none()
                && Api::<TalosCluster>::namespaced(client.clone(), &ns)
                    .get_opt("eu-dead")
                    .await?
                    .is_none())
        },
    )
    .await
    .unwrap();
    let gone_after = deleted.elapsed();
    // deletionTimestamp has whole seconds: the deadline (it + 5 s) may fall up to 1 s before
    // the test's own clock says 5 s have passed since its delete call.
    assert!(
        gone_after >= Duration::from_secs(4),
        "gave up after {gone_after:?}, before the deadline"
    );
    let events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(client.clone(), &ns)
        .list(&kube::api::ListParams::default())
        .await
        .unwrap()
        .items;
    let gave_up = events
        .iter()
        .find(|e| e.reason.as_deref() == Some("TeardownDeadlineExceeded"))
        .expect("a TeardownDeadlineExceeded Event");
    assert!(
        gave_up
            .note
            .as_deref()
            .unwrap_or_default()
            .contains("left behind"),
        "{gave_up:?}"
    );
    eprintln!("unreachable zone given up after {gone_after:?} (deadline 5s)");
}

/// Installs the real Gateway API and cert-manager CRDs (the e2e fixture charts' copies of
/// `shared/data/crds/`) into a zone cluster.
async fn network_crds(down: &Client) {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let mut crds: Vec<CustomResourceDefinition> = Vec::new();
    for file in [
        "charts/gateway-api-crds/files/standard/gateway.networking.k8s.io_gatewayclasses.yaml",
        "charts/gateway-api-crds/files/standard/gateway.networking.k8s.io_gateways.yaml",
        "charts/gateway-api-crds/files/standard/gateway.networking.k8s.io_httproutes.yaml",
        "charts/cert-manager/files/crds/cert-manager.io_certificates.yaml",
        "charts/cert-manager/files/crds/cert-manager.io_clusterissuers.yaml",
    ] {
        crds.extend(kontinuum_e2e::load_yaml::<CustomResourceDefinition>(file).unwrap());
    }
    kontinuum_e2e::install_crds(down, &crds).await.unwrap();
}

fn dynamic(
    down: &Client,
    group: &str,
    kind: &str,
    plural: &str,
    ns: Option<&str>,
) -> Api<kube::core::DynamicObject> {
    let gvk = kube::core::GroupVersionKind::gvk(group, "v1", kind);
    let resource = kube::core::ApiResource::from_gvk_with_plural(&gvk, plural);
    match ns {
        Some(ns) => Api::namespaced_with(down.clone(), ns, &resource),
        None => Api::all_with(down.clone(), &resource),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_domain_installed_waits_for_the_gateway_class_and_the_certificate() {
    let (client, shared) = shared_client().await.unwrap();
    install_kontinuum_crds(&client).await.unwrap();
    let ns = namespace(&client, "zone-domain").await.unwrap();
    let (kubeconfig, _) = operator_account(&client, &ns).await;
    let zone_cluster = kontinuum_e2e::addons::downstream_cluster(&shared.tools, "zone-domain")
        .await
        .unwrap();
    let down = zone_cluster.client();
    network_crds(&down).await;
    let _op = operator(
        &kubeconfig,
        &ns,
        &[
            "--hub-grpc-endpoint",
            "127.0.0.1:2379",
            "--dns-domain",
            "zones.example.com",
            "--zone-issuer",
            "self-signed",
        ],
    )
    .await;
    create_zone(&client, &ns, "eu", "web", &[]).await;
    ready_cluster(&client, &ns, "eu-web", zone_cluster.kubeconfig_yaml()).await;

    // No GatewayClass cilium in the zone cluster: said so, not Installed.
    let message = wait_condition(
        &client,
        &ns,
        "eu-web",
        "Installed",
        "False",
        "GatewayClassNotFound",
    )
    .await;
    assert!(message.contains("GatewayClass cilium"), "{message}");
    let zone = Api::<Zone>::namespaced(client.clone(), &ns)
        .get("eu-web")
        .await
        .unwrap();
    assert_eq!(
        zone.status.unwrap().endpoint.as_deref(),
        Some("web.eu.zones.example.com"),
        "the operator's domain is the default"
    );

    // The class exists: now the certificate is waited for.
    let class: kube::core::DynamicObject = serde_json::from_value(json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "GatewayClass",
        "metadata": { "name": "cilium" },
        "spec": { "controllerName": "io.cilium/gateway-controller" },
    }))
    .unwrap();
    dynamic(
        &down,
        "gateway.networking.k8s.io",
        "GatewayClass",
        "gatewayclasses",
        None,
    )
    .create(&PostParams::default(), &class)
    .await
    .unwrap();
    let message = wait_condition(
        &client,
        &ns,
        "eu-web",
        "Installed",
        "False",
        "WaitingForCertificate",
    )
    .await;
    assert!(message.contains("web.eu.zones.example.com"), "{message}");

    // cert-manager (here: the test) issues it: Installed, served at the host.
    let certificates = dynamic(
        &down,
        "cert-manager.io",
        "Certificate",
        "certificates",
        Some("kontinuum-system"),
    );
    let certificate = certificates.get("kontinuum").await.unwrap();
    assert_eq!(
        certificate.data["spec"]["dnsNames"],
        json!(["web.eu.zones.example.com"])
    );
    let status = json!({ "status": { "conditions": [{
        "type": "Ready", "status": "True", "reason": "Ready", "message": "issued by the test",
        "observedGeneration": certificate.metadata.generation,
        "lastTransitionTime": "2026-01-01T00:00:00Z" }] } });
    certificates
        .patch_status("kontinuum", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
    let message = wait_condition(&client, &ns, "eu-web", "Installed", "True", "Installed").await;
    assert!(
        message.contains("https://web.eu.zones.example.com"),
        "{message}"
    );
}
