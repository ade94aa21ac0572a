//! pool-claimer as a host process against the real test bed. The test marks Instances
//! `Discovered` itself, where instance-discovery would: the two coordinate only through
//! that condition, so this is the same contract.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::large_futures,
    clippy::too_many_lines
)]

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kontinuum_crds::conditions::{self, ConditionStatus};
use kontinuum_crds::labels::CLAIMED_BY;
use kontinuum_crds::v1alpha2::{Instance, InstancePool, InstanceStatus};
use kontinuum_e2e::{Operator, eventually, install_kontinuum_crds, namespace, shared_client};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt as _};

const LIMIT: Duration = Duration::from_secs(30);

async fn start_operator(kubeconfig: &Path, ns: &str) -> Operator {
    Operator::start(
        Path::new(env!("CARGO_BIN_EXE_pool-claimer")),
        "pool-claimer",
        kubeconfig,
        &["--namespace", ns],
    )
    .await
    .unwrap()
}

/// Creates Instances `prefix-00..` in zone `zone`, marked Discovered (or not).
async fn instances(
    client: &Client,
    ns: &str,
    prefix: &str,
    zone: &str,
    n: usize,
    discovered: bool,
) {
    let api: Api<Instance> = Api::namespaced(client.clone(), ns);
    for i in 0..n {
        let name = format!("{prefix}-{i:02}");
        let instance: Instance = serde_json::from_value(serde_json::json!({
            "apiVersion": "kontinuum.sh/v1alpha2", "kind": "Instance",
            "metadata": { "name": name, "labels": { "kontinuum.sh/region": "eu", "kontinuum.sh/zone": zone } },
            "spec": { "interfaces": [format!("192.0.2.{}", i + 1)] }
        }))
        .unwrap();
        api.create(&PostParams::default(), &instance).await.unwrap();
        if discovered {
            let mut status = InstanceStatus::default();
            conditions::set(
                &mut status.conditions,
                conditions::new(
                    "Discovered",
                    ConditionStatus::True,
                    "Discovered",
                    "discovered by the test",
                    Some(1),
                ),
                &Time(Timestamp::now()),
            );
            let patch = serde_json::json!({ "status": status });
            api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .unwrap();
        }
    }
}

async fn pool(client: &Client, ns: &str, name: &str, zone: &str, replicas: i32) {
    let pool: InstancePool = serde_json::from_value(serde_json::json!({
        "apiVersion": "kontinuum.sh/v1alpha2", "kind": "InstancePool",
        "metadata": { "name": name },
        "spec": { "replicas": replicas, "selector": { "matchLabels": { "kontinuum.sh/region": "eu", "kontinuum.sh/zone": zone } } }
    }))
    .unwrap();
    Api::<InstancePool>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &pool)
        .await
        .unwrap();
}

async fn scale(client: &Client, ns: &str, name: &str, replicas: i32) {
    let patch = serde_json::json!({ "spec": { "replicas": replicas } });
    Api::<InstancePool>::namespaced(client.clone(), ns)
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

/// Claims by pool, from the labels.
async fn claims(client: &Client, ns: &str) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for i in Api::<Instance>::namespaced(client.clone(), ns)
        .list(&kube::api::ListParams::default())
        .await
        .unwrap()
    {
        if let Some(pool) = i.labels().get(CLAIMED_BY) {
            out.entry(pool.clone()).or_default().push(i.name_any());
        }
    }
    out
}

async fn condition(
    client: &Client,
    ns: &str,
    pool: &str,
    type_: &str,
) -> Option<(String, String, String)> {
    let pool = Api::<InstancePool>::namespaced(client.clone(), ns)
        .get(pool)
        .await
        .ok()?;
    let status = pool.status?;
    let c = conditions::get(&status.conditions, type_)?;
    Some((c.status.clone(), c.reason.clone(), c.message.clone()))
}

#[tokio::test]
async fn a_pool_claims_scales_and_releases_everything_on_deletion() {
    let (client, shared) = shared_client().await.unwrap();
    install_kontinuum_crds(&client).await.unwrap();
    let ns = namespace(&client, "pool").await.unwrap();
    instances(&client, &ns, "n", "west-1a", 3, true).await;
    instances(&client, &ns, "undiscovered", "west-1a", 2, false).await;
    let _operator = start_operator(&shared.kubeconfig_path, &ns).await;

    pool(&client, &ns, "eu-west-1a", "west-1a", 2).await;
    eventually(LIMIT, "2 claimed and Ready", || async {
        let claimed = claims(&client, &ns)
            .await
            .get("eu-west-1a")
            .map_or(0, Vec::len);
        let ready = condition(&client, &ns, "eu-west-1a", "Ready").await;
        Ok(claimed == 2 && ready.is_some_and(|c| c.0 == "True"))
    })
    .await
    .unwrap();
    assert_eq!(
        claims(&client, &ns).await["eu-west-1a"],
        ["n-00", "n-01"],
        "lowest names first"
    );

    scale(&client, &ns, "eu-west-1a", 5).await;
    eventually(LIMIT, "InsufficientCapacity naming the counts", || async {
        Ok(
            condition(&client, &ns, "eu-west-1a", "InsufficientCapacity")
                .await
                .is_some_and(|(s, r, m)| {
                    s == "True" && r == "InsufficientCapacity" && m.contains("3/5")
                }),
        )
    })
    .await
    .unwrap();
    let claimed = claims(&client, &ns).await;
    assert_eq!(
        claimed["eu-west-1a"],
        ["n-00", "n-01", "n-02"],
        "undiscovered Instances are never claimed"
    );
    let ready = condition(&client, &ns, "eu-west-1a", "Ready")
        .await
        .unwrap();
    assert_eq!(
        (ready.0.as_str(), ready.1.as_str()),
        ("False", "InsufficientCapacity")
    );

    scale(&client, &ns, "eu-west-1a", 1).await;
    eventually(LIMIT, "scaled down to one", || async {
        Ok(claims(&client, &ns)
            .await
            .get("eu-west-1a")
            .is_some_and(|c| c == &["n-00"])
            && condition(&client, &ns, "eu-west-1a", "Ready")
                .await
                .is_some_and(|c| c.0 == "True"))
    })
    .await
    .unwrap();
    let pools: Api<InstancePool> = Api::namespaced(client.clone(), &ns);
    let status = pools.get("eu-west-1a").await.unwrap().status.unwrap();
    assert_eq!(
        (status.claimed_replicas, status.ready_replicas),
        (Some(1), Some(1))
    );

    pools
        .delete("eu-west-1a", &DeleteParams::default())
        .await
        .unwrap();
    eventually(LIMIT, "everything released and the pool gone", || async {
        Ok(claims(&client, &ns).await.is_empty() && pools.get_opt("eu-west-1a").await?.is_none())
    })
    .await
    .unwrap();
}

/// The compare-and-set, driven rather than hoped for: a proxy holds back the operator's
/// Instance watch, so its cache still shows `m-00` free after another claimer took it. Its
/// claim of `m-00` carries that stale resourceVersion and must lose (409 in the audit log,
/// under its own user, and on `m-00` only), and the claim it did not see survives. Without
/// the precondition the label would be overwritten and the pool would hold all four.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_made_on_a_stale_cache_loses_to_the_claim_it_did_not_see() {
    use kontinuum_e2e::api_proxy::ApiProxy;
    use kontinuum_e2e::{audit_writes, service_account_kubeconfig, service_account_user};

    let (client, shared) = shared_client().await.unwrap();
    install_kontinuum_crds(&client).await.unwrap();
    kontinuum_e2e::install_operator_roles(&client)
        .await
        .unwrap();
    let ns = namespace(&client, "race").await.unwrap();
    instances(&client, &ns, "m", "west-1b", 4, true).await;
    let name = "pool-claimer-race";
    let kubeconfig =
        service_account_kubeconfig(&client, shared, &ns, name, kontinuum_e2e::POOL_CLAIMER_ROLE)
            .await
            .unwrap();
    let as_operator = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(&kubeconfig).unwrap(),
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .unwrap();
    let proxy = ApiProxy::start(Client::try_from(as_operator).unwrap(), "/instances")
        .await
        .unwrap();
    let through_proxy = proxy
        .kubeconfig(&shared.dir, &format!("{ns}-{name}"))
        .unwrap();
    // Ready means its caches are synced: it has seen the four free Instances.
    let _operator = start_operator(&through_proxy, &ns).await;

    proxy.freeze(true);
    let api: Api<Instance> = Api::namespaced(client.clone(), &ns);
    api.patch(
        "m-00",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({ "metadata": { "labels": { CLAIMED_BY: "rival" } } })),
    )
    .await
    .unwrap();
    pool(&client, &ns, "a", "west-1b", 4).await;
    let user = service_account_user(&ns, name);
    let log = shared.audit_log();
    let conflicts = || {
        audit_writes(&log, &user)
            .unwrap()
            .into_iter()
            .filter(|e| e.response_status.as_ref().and_then(|s| s.code) == Some(409))
            .map(|e| e.request_u_r_i)
            .collect::<Vec<_>>()
    };
    // Claims go in name order: m-00 first, refused; then m-01..m-03, won.
    eventually(
        LIMIT,
        "the stale claim refused and the rest won",
        || async {
            Ok(!conflicts().is_empty()
                && claims(&client, &ns).await.get("a").map(Vec::as_slice)
                    == Some(&["m-01".to_owned(), "m-02".to_owned(), "m-03".to_owned()][..]))
        },
    )
    .await
    .unwrap();
    for uri in conflicts() {
        assert!(
            uri.contains("/instances/m-00"),
            "only the stale claim conflicts: {uri}"
        );
    }
    let holder = |i: Instance| i.labels().get(CLAIMED_BY).cloned();
    assert_eq!(
        holder(api.get("m-00").await.unwrap()).as_deref(),
        Some("rival")
    );

    // Thawed, the operator sees what it missed: three of four, and says so.
    proxy.freeze(false);
    eventually(LIMIT, "a reports 3 of 4 claimed", || async {
        let pools: Api<InstancePool> = Api::namespaced(client.clone(), &ns);
        let claimed = pools
            .get("a")
            .await?
            .status
            .and_then(|s| s.claimed_replicas);
        Ok(claimed == Some(3)
            && condition(&client, &ns, "a", "InsufficientCapacity")
                .await
                .is_some_and(|c| c.0 == "True"))
    })
    .await
    .unwrap();
    assert_eq!(
        holder(api.get("m-00").await.unwrap()).as_deref(),
        Some("rival")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_leader_writes_and_the_other_replica_takes_over() {
    use kontinuum_e2e::{audit_writes, service_account_kubeconfig, service_account_user};

    let (client, shared) = shared_client().await.unwrap();
    install_kontinuum_crds(&client).await.unwrap();
    kontinuum_e2e::install_operator_roles(&client)
        .await
        .unwrap();
    let ns = namespace(&client, "leader").await.unwrap();
    instances(&client, &ns, "l", "west-1d", 6, true).await;
    let bin = Path::new(env!("CARGO_BIN_EXE_pool-claimer"));
    let mut replicas = Vec::new();
    for id in ["a", "b"] {
        let name = format!("pool-claimer-{id}");
        let kubeconfig = service_account_kubeconfig(
            &client,
            shared,
            &ns,
            &name,
            kontinuum_e2e::POOL_CLAIMER_ROLE,
        )
        .await
        .unwrap();
        let args = [
            "--namespace",
            &ns,
            "--leader-elect",
            "--lease-namespace",
            &ns,
            "--lease-duration-seconds",
            "6",
            "--identity",
            &name,
        ];
        // The first replica becomes the leader (ready); the second stays a follower.
        let path = if id == "a" { "/readyz" } else { "/healthz" };
        replicas.push((
            Operator::start_until(bin, &name, &kubeconfig, &args, path)
                .await
                .unwrap(),
            service_account_user(&ns, &name),
        ));
    }
    let (mut leader, leader_user) = replicas.remove(0);
    let (follower, follower_user) = replicas.remove(0);
    assert!(!follower.is_ready().await, "the follower is not ready");

    pool(&client, &ns, "eu-west-1d", "west-1d", 2).await;
    eventually(LIMIT, "2 claimed", || async {
        Ok(claims(&client, &ns)
            .await
            .get("eu-west-1d")
            .map_or(0, Vec::len)
            == 2
            && condition(&client, &ns, "eu-west-1d", "Ready")
                .await
                .is_some_and(|c| c.0 == "True"))
    })
    .await
    .unwrap();
    let not_lease = |e: &&kontinuum_e2e::AuditEvent| !e.request_u_r_i.contains("/leases");
    let log = shared.audit_log();
    assert!(
        audit_writes(&log, &leader_user)
            .unwrap()
            .iter()
            .filter(not_lease)
            .count()
            >= 3
    );
    assert_eq!(
        audit_writes(&log, &follower_user)
            .unwrap()
            .iter()
            .filter(not_lease)
            .count(),
        0,
        "the follower wrote"
    );

    // Kill the leader as a crash would: the Lease is not released, it must expire.
    leader.kill().await.unwrap();
    let killed = std::time::Instant::now();
    eventually(
        Duration::from_secs(20),
        "the follower to take over",
        || async { Ok(follower.is_ready().await) },
    )
    .await
    .unwrap();
    let took = killed.elapsed();
    eprintln!(
        "pool-claimer: the follower took over {took:?} after the leader was killed (6 s lease)"
    );
    assert!(
        took <= Duration::from_secs(6 + 3),
        "take-over took {took:?} for a 6 s lease"
    );

    scale(&client, &ns, "eu-west-1d", 4).await;
    eventually(LIMIT, "claims to continue under the new leader", || async {
        Ok(claims(&client, &ns)
            .await
            .get("eu-west-1d")
            .map_or(0, Vec::len)
            == 4)
    })
    .await
    .unwrap();
    assert!(
        audit_writes(&log, &follower_user)
            .unwrap()
            .iter()
            .filter(not_lease)
            .count()
            >= 2,
        "the new leader claimed"
    );
}
