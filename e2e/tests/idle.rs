//! With nothing changing, the operators make zero write requests: measured over 60 s from
//! the API server's audit log, each operator running as its own ServiceAccount with the
//! RBAC the chart will grant it.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::large_futures,
    clippy::too_many_lines
)]

use std::net::Ipv4Addr;
use std::time::Duration;

use kontinuum_crds::conditions;
use kontinuum_crds::v1alpha2::{Instance, InstancePool};
use kontinuum_e2e::testbed::unique_dir;
use kontinuum_e2e::{
    INSTANCE_DISCOVERY_ROLE, Operator, POOL_CLAIMER_ROLE, audit_writes, eventually,
    install_kontinuum_crds, install_operator_roles, namespace, service_account_kubeconfig,
    service_account_user, shared_client, workspace_binary,
};
use kube::api::{Api, ListParams, PostParams};
use talos_emulator::{Emulator, Settings};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_operators_make_no_writes() {
    let (client, shared) = shared_client().await.unwrap();
    install_kontinuum_crds(&client).await.unwrap();
    install_operator_roles(&client).await.unwrap();
    let ns = namespace(&client, "idle").await.unwrap();
    let emulator = Emulator::start(Settings {
        machines: 3,
        first_address: Ipv4Addr::new(127, 43, 0, 1),
        port: 50000,
        api_port: 6443,
        dir: unique_dir("emulator"),
        control_addr: None,
    })
    .await
    .unwrap();
    let instances: Api<Instance> = Api::namespaced(client.clone(), &ns);
    for i in 1..=3 {
        let instance: Instance = serde_json::from_value(serde_json::json!({
            "apiVersion": "kontinuum.sh/v1alpha2", "kind": "Instance",
            "metadata": { "name": format!("q-{i}"), "labels": { "kontinuum.sh/zone": "q" } },
            "spec": { "interfaces": [format!("127.43.0.{i}")] }
        }))
        .unwrap();
        instances
            .create(&PostParams::default(), &instance)
            .await
            .unwrap();
    }
    let pool: InstancePool = serde_json::from_value(serde_json::json!({
        "apiVersion": "kontinuum.sh/v1alpha2", "kind": "InstancePool",
        "metadata": { "name": "eu-q" },
        "spec": { "replicas": 2, "selector": { "matchLabels": { "kontinuum.sh/zone": "q" } } }
    }))
    .unwrap();
    let pools: Api<InstancePool> = Api::namespaced(client.clone(), &ns);
    pools.create(&PostParams::default(), &pool).await.unwrap();

    let discovery_config = service_account_kubeconfig(
        &client,
        shared,
        &ns,
        "instance-discovery",
        INSTANCE_DISCOVERY_ROLE,
    )
    .await
    .unwrap();
    let claimer_config =
        service_account_kubeconfig(&client, shared, &ns, "pool-claimer", POOL_CLAIMER_ROLE)
            .await
            .unwrap();
    // Re-probing every 2 s: the idle minute holds some 30 probes per machine.
    let _discovery = Operator::start(
        &workspace_binary("instance-discovery").unwrap(),
        "instance-discovery",
        &discovery_config,
        &[
            "--namespace",
            &ns,
            "--reprobe-seconds",
            "2",
            "--retry-seconds",
            "1",
        ],
    )
    .await
    .unwrap();
    let _claimer = Operator::start(
        &workspace_binary("pool-claimer").unwrap(),
        "pool-claimer",
        &claimer_config,
        &["--namespace", &ns],
    )
    .await
    .unwrap();

    eventually(
        Duration::from_secs(30),
        "3 discovered, 2 claimed, pool Ready",
        || async {
            let list = instances.list(&ListParams::default()).await?;
            let discovered = list
                .items
                .iter()
                .filter(|i| {
                    i.status
                        .as_ref()
                        .is_some_and(|s| conditions::is_true(&s.conditions, "Discovered"))
                })
                .count();
            let pool = pools.get("eu-q").await?;
            Ok(discovered == 3
                && pool
                    .status
                    .is_some_and(|s| conditions::is_true(&s.conditions, "Ready")))
        },
    )
    .await
    .unwrap();

    let log = shared.audit_log();
    let users = [
        service_account_user(&ns, "instance-discovery"),
        service_account_user(&ns, "pool-claimer"),
    ];
    let before: Vec<usize> = users
        .iter()
        .map(|u| audit_writes(&log, u).unwrap().len())
        .collect();
    assert!(
        before.iter().all(|n| *n > 0),
        "each operator wrote as its own ServiceAccount: {before:?}"
    );
    tokio::time::sleep(Duration::from_secs(60)).await; // the measurement window itself
    for (user, before) in users.iter().zip(&before) {
        let writes = audit_writes(&log, user).unwrap();
        eprintln!(
            "idle: {user}: {before} writes to converge, {} during 60 idle seconds",
            writes.len() - before
        );
        assert_eq!(
            writes.len(),
            *before,
            "{user} wrote while idle: {:#?}",
            writes[*before..]
                .iter()
                .map(|e| (&e.verb, &e.request_u_r_i))
                .collect::<Vec<_>>()
        );
    }
    emulator.shutdown().await;
}
