//! The zone flow through every operator as a process, nothing standing in for one: a Zone
//! with one seed address (an emulated Talos machine in maintenance mode) is fanned out by
//! the zone-installer, discovered, claimed and bootstrapped into a real zone control plane
//! by instance-discovery, pool-claimer and talos-bootstrapper, its addons installed by the
//! addon-installer (fixture charts through the chart mirror), and then the zone-installer
//! installs the footprint into that zone cluster; then, idle, none of the five operators
//! writes anything over 60 s (the audit log); deleting the Zone takes it all back.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::large_futures,
    clippy::too_many_lines
)]

use std::net::Ipv4Addr;
use std::path::Path;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service};
use kontinuum_crds::labels::{CLAIMED_BY, IDENTITY_THUMBPRINT};
use kontinuum_crds::names::seed_instance_name;
use kontinuum_crds::v1alpha2::{
    Instance, KUBECONFIG_KEY, KUBECONFIG_SECRET_COMPONENT, SECRETS_BUNDLE_KEY, TALOSCONFIG_KEY,
    TalosCluster, Zone, kubeconfig_secret_name, secrets_secret_name,
};
use kontinuum_e2e::addons::{ChartRepo, start_addon_installer_with_role};
use kontinuum_e2e::bootstrapper::{start_operators, stored_kubeconfig};
use kontinuum_e2e::testbed::{Tools, unique_dir};
use kontinuum_e2e::zone::wait_zone_condition;
use kontinuum_e2e::{
    Operator, audit_requests, audit_writes, eventually, install_kontinuum_crds, namespace,
    reconcile_totals, secret_requests, service_account_kubeconfig, service_account_user,
    shared_client, workspace_binary,
};
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Client, ResourceExt as _};
use talos_emulator::{Emulator, Mode, Settings};
use zone_installer::identity;

const LIMIT: Duration = Duration::from_secs(300);

/// Waits for the Zone's condition `type_` to be `status`: its `(reason, message)`.
async fn wait(client: &Client, ns: &str, type_: &str, status: &str) -> (String, String) {
    let (_, reason, message) =
        wait_zone_condition(client, ns, "eu-flow", (type_, status, ""), LIMIT)
            .await
            .unwrap();
    (reason, message)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zone_manifest_becomes_an_installed_zone_and_goes_away() {
    let (client, shared) = shared_client().await.unwrap();
    install_kontinuum_crds(&client).await.unwrap();
    let ns = namespace(&client, "zone-flow").await.unwrap();
    let address = Ipv4Addr::new(127, 98, 12, 1);
    let emulator = Emulator::start(Settings {
        machines: 1,
        first_address: address,
        port: 50000,
        api_port: 6443,
        dir: unique_dir("emulator-zone-flow"),
        control_addr: None,
    })
    .await
    .unwrap();
    let (operators, _) = start_operators(
        &client,
        shared,
        &ns,
        &workspace_binary("talos-bootstrapper").unwrap(),
        &[],
    )
    .await
    .unwrap();
    let tools = Tools::locate().unwrap();
    let repo = ChartRepo::serve(&tools).await.unwrap();
    // The default resync (5 min): pod health comes from the addon-installer's pod watch.
    let addon_operator = start_addon_installer_with_role(&client, shared, &ns, &repo.url, &[])
        .await
        .unwrap();
    let kubeconfig =
        service_account_kubeconfig(&client, shared, &ns, "zone-installer", "cluster-admin")
            .await
            .unwrap();
    let zone_operator = Operator::start(
        Path::new(env!("CARGO_BIN_EXE_zone-installer")),
        "zone-installer",
        &kubeconfig,
        &[
            "--namespace",
            &ns,
            "--insecure-allow-anonymous",
            "true",
            "--hub-grpc-endpoint",
            "127.0.0.1:2379",
            "--retry-interval",
            "1s",
        ],
    )
    .await
    .unwrap();

    // The Zone alone, as a GitOps repository would hold it.
    let started = Instant::now();
    let zone: Zone = serde_json::from_value(serde_json::json!({
        "apiVersion": "kontinuum.sh/v1alpha2", "kind": "Zone",
        "metadata": { "name": "eu-flow" },
        "spec": { "region": "eu", "zone": "flow", "seed": { "talosAddresses": [address.to_string()] } },
    }))
    .unwrap();
    Api::<Zone>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &zone)
        .await
        .unwrap();
    let (reason, _) = wait(&client, &ns, "ClusterReady", "True").await;
    assert_eq!(reason, "ClusterReady");
    let cluster_ready = started.elapsed();
    let (reason, message) = wait(&client, &ns, "Installed", "True").await;
    let installed = started.elapsed();
    assert_eq!(reason, "Installed");
    assert!(message.contains("network exposure skipped"), "{message}");
    let seed = seed_instance_name("eu", "flow", &address.to_string()).unwrap();
    let instance = Api::<Instance>::namespaced(client.clone(), &ns)
        .get(&seed)
        .await
        .unwrap();
    assert_eq!(
        instance.labels().get(CLAIMED_BY).map(String::as_str),
        Some("eu-flow")
    );

    // The footprint in the real zone cluster, with the identity the hub trusts.
    let down = kontinuum_e2e::testbed::client_from(
        &stored_kubeconfig(&client, &ns, "eu-flow").await.unwrap(),
    )
    .await
    .unwrap();
    let system = "kontinuum-system";
    let deployment = Api::<Deployment>::namespaced(down.clone(), system)
        .get("kontinuum")
        .await
        .unwrap();
    Api::<Service>::namespaced(down.clone(), system)
        .get("kontinuum")
        .await
        .unwrap();
    let env = Api::<ConfigMap>::namespaced(down.clone(), system)
        .get("kontinuum-env")
        .await
        .unwrap()
        .data
        .unwrap();
    assert_eq!(
        env.get("KONTINUUM_SERVER_REGION").map(String::as_str),
        Some("eu")
    );
    assert_eq!(
        env.get("KONTINUUM_SERVER_ZONE").map(String::as_str),
        Some("flow")
    );
    let dsn = Api::<Secret>::namespaced(down.clone(), system)
        .get("kontinuum-env")
        .await
        .unwrap()
        .data
        .unwrap();
    assert_eq!(
        dsn.get("KONTINUUM_SERVER_STORAGE").map(|b| b.0.as_slice()),
        Some(b"grpc://eu-flow@127.0.0.1:2379".as_slice())
    );
    let thumbprint = Api::<Zone>::namespaced(client.clone(), &ns)
        .get("eu-flow")
        .await
        .unwrap()
        .status
        .unwrap()
        .identity_thumbprint
        .unwrap();
    let annotations = deployment
        .spec
        .template
        .metadata
        .and_then(|m| m.annotations)
        .unwrap_or_default();
    assert_eq!(annotations.get(IDENTITY_THUMBPRINT), Some(&thumbprint));
    let held = Api::<Secret>::namespaced(down.clone(), system)
        .get("kontinuum-identity")
        .await
        .unwrap()
        .data
        .unwrap();
    let cert = identity::certificates(&held["tls.crt"].0).remove(0);
    assert_eq!(identity::thumbprint(&cert), thumbprint);

    // Idle (issue 14, deliverable 6): with the cluster Ready and the zone installed, none of
    // the five operators writes anything over 60 s (the API server's audit log, each as its
    // own ServiceAccount). First the writes of reaching this state must have settled: no
    // write by any of them for 5 s.
    let log = shared.audit_log();
    let users: Vec<String> = [
        "instance-discovery",
        "pool-claimer",
        "talos-bootstrapper",
        "addon-installer",
        "zone-installer",
    ]
    .iter()
    .map(|name| service_account_user(&ns, name))
    .collect();
    let counts = || -> Vec<usize> {
        users
            .iter()
            .map(|u| audit_writes(&log, u).unwrap().len())
            .collect()
    };
    let mut settled = (Instant::now(), counts());
    eventually(LIMIT, "no operator writing for 5 s", || {
        let now = counts();
        if now != settled.1 {
            settled = (Instant::now(), now);
        }
        let quiet = settled.0.elapsed() >= Duration::from_secs(5);
        async move { Ok(quiet) }
    })
    .await
    .unwrap();
    let before = counts();
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

    // Secrets split by need (issue 14, deliverable 1), from the audit log, which records
    // every Secret request: the addon-installer asks for the kubeconfig Secret that
    // status.secretRef names and nothing else; its watch selects kubeconfig Secrets only. The
    // zone-installer never asks for the secrets bundle either, and nobody watches all Secrets.
    let cluster_status = Api::<TalosCluster>::namespaced(client.clone(), &ns)
        .get("eu-flow")
        .await
        .unwrap()
        .status
        .unwrap();
    let kubeconfig_secret = cluster_status.secret_ref.unwrap().name;
    assert_eq!(kubeconfig_secret, kubeconfig_secret_name("eu-flow"));
    let bundle_secret = secrets_secret_name("eu-flow");
    let kubeconfig_selector =
        format!("labelSelector=app.kubernetes.io%2Fcomponent%3D{KUBECONFIG_SECRET_COMPONENT}");
    let addon_installer = secret_requests(
        &audit_requests(&log, &service_account_user(&ns, "addon-installer")).unwrap(),
    );
    let mut by_request = std::collections::BTreeMap::<(String, String), usize>::new();
    for (verb, name, _) in &addon_installer {
        *by_request
            .entry((verb.clone(), name.clone().unwrap_or_default()))
            .or_default() += 1;
    }
    eprintln!("addon-installer Secret requests (verb, name): {by_request:?}");
    assert!(
        addon_installer
            .iter()
            .any(|(verb, name, _)| verb == "get" && name.as_ref() == Some(&kubeconfig_secret)),
        "the addon-installer read the kubeconfig Secret: {addon_installer:#?}"
    );
    for (verb, name, query) in &addon_installer {
        match name {
            Some(name) => assert!(
                verb == "get" && *name == kubeconfig_secret,
                "the addon-installer asked for Secret {name} ({verb})"
            ),
            None => assert!(
                query.contains(&kubeconfig_selector),
                "the addon-installer listed Secrets beyond kubeconfigs: {verb} ?{query}"
            ),
        }
    }
    for operator in ["zone-installer", "talos-bootstrapper"] {
        let requests =
            secret_requests(&audit_requests(&log, &service_account_user(&ns, operator)).unwrap());
        assert!(!requests.is_empty(), "{operator} made no Secret request");
        for (verb, name, query) in &requests {
            if operator == "zone-installer" {
                assert_ne!(
                    name.as_ref(),
                    Some(&bundle_secret),
                    "the zone-installer asked for the secrets bundle ({verb})"
                );
            }
            if name.is_none() && (verb == "list" || verb == "watch") {
                assert!(
                    query.contains("labelSelector=") || query.contains("fieldSelector="),
                    "{operator} listed every Secret: {verb} ?{query}"
                );
            }
        }
    }
    // The kubeconfig Secret holds the kubeconfig alone; the bundle's, bundle and talosconfig.
    let secrets = Api::<Secret>::namespaced(client.clone(), &ns);
    let keys = |s: Secret| -> Vec<String> { s.data.unwrap_or_default().into_keys().collect() };
    assert_eq!(
        keys(secrets.get(&kubeconfig_secret).await.unwrap()),
        [KUBECONFIG_KEY]
    );
    assert_eq!(
        keys(secrets.get(&bundle_secret).await.unwrap()),
        [SECRETS_BUNDLE_KEY, TALOSCONFIG_KEY]
    );

    // Remove: the footprint gone, the machine back in maintenance mode, the Instance
    // released (not deleted: unregisterInstances is unset), the hub objects gone.
    let removing = Instant::now();
    Api::<Zone>::namespaced(client.clone(), &ns)
        .delete("eu-flow", &DeleteParams::default())
        .await
        .unwrap();
    eventually(LIMIT, "the Zone and its TalosCluster gone", || async {
        Ok(Api::<Zone>::namespaced(client.clone(), &ns)
            .get_opt("eu-flow")
            .await?
            .is_none()
            && Api::<TalosCluster>::namespaced(client.clone(), &ns)
                .get_opt("eu-flow")
                .await?
                .is_none())
    })
    .await
    .unwrap();
    let removed = removing.elapsed();
    assert_eq!(emulator.mode(address), Some(Mode::Maintenance));
    eventually(LIMIT, "the seed Instance released", || async {
        Ok(Api::<Instance>::namespaced(client.clone(), &ns)
            .get(&seed)
            .await?
            .labels()
            .get(CLAIMED_BY)
            .is_none())
    })
    .await
    .unwrap();
    // The footprint was removed from the live zone cluster before its TalosCluster was
    // deleted (the machine's reset would take it along otherwise): the Zone's Event says so.
    let events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(client.clone(), &ns)
        .list(&kube::api::ListParams::default())
        .await
        .unwrap()
        .items;
    let notes: Vec<String> = events
        .iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("eu-flow"))
        .filter_map(|e| e.note.clone())
        .collect();
    assert!(
        notes.iter().any(|n| n
            .contains("teardown finished: zone footprint removed; TalosCluster eu-flow deleted")),
        "{notes:#?}"
    );
    eprintln!(
        "zone add: ClusterReady after {cluster_ready:?}, Installed after {installed:?}; remove: {removed:?}"
    );

    // Churn (issue 14, deliverable 3): what one Zone's whole life (add, Ready, 60 idle
    // seconds, remove) cost each operator, in reconciles (its own metric) and writes (the
    // audit log).
    let mut lifecycle = Vec::new();
    for (user, operator) in users
        .iter()
        .zip(operators.iter().chain([&addon_operator, &zone_operator]))
    {
        let reconciles = reconcile_totals(&operator.metrics().await.unwrap());
        let writes = audit_writes(&log, user).unwrap().len();
        lifecycle.push((
            user.rsplit(':').next().unwrap_or_default().to_string(),
            reconciles,
            writes,
        ));
    }
    eprintln!("zone lifecycle (operator, reconciles by controller, writes): {lifecycle:?}");
    emulator.shutdown().await;
}
