//! Every operator in all-namespaces mode, the default (issue 14, deliverable 6): the five
//! operators of the zone flow run without `--namespace`, each as its own ServiceAccount of
//! a third namespace with the chart's ClusterRoles, on a hub control plane of this test's
//! own (an operator watching every namespace of the shared one would act on other tests'
//! objects). Two teams each apply one Zone in their own namespace: both become installed
//! zones, every object they fan out into stays in its team's namespace, and both go away.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::large_futures,
    clippy::too_many_lines
)]

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use kontinuum_crds::labels::CLAIMED_BY;
use kontinuum_crds::names::seed_instance_name;
use kontinuum_crds::v1alpha2::{Addon, Instance, InstancePool, TalosCluster, Zone};
use kontinuum_e2e::addons::{ADDON_INSTALLER_ROLE, ChartRepo, install_addon_installer_role};
use kontinuum_e2e::bootstrapper::{DISCOVERY_ARGS, TALOS_BOOTSTRAPPER_ROLE, install_role};
use kontinuum_e2e::testbed::{ControlPlane, ControlPlaneConfig, Tools, unique_dir};
use kontinuum_e2e::zone::wait_zone_condition;
use kontinuum_e2e::{
    INSTANCE_DISCOVERY_ROLE, Operator, POOL_CLAIMER_ROLE, eventually, install_kontinuum_crds,
    install_operator_roles, namespace, service_account_kubeconfig_for, workspace_binary,
};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::{Client, ResourceExt};
use talos_emulator::{Emulator, Mode, Settings};

const LIMIT: Duration = Duration::from_secs(240);
const FIRST: Ipv4Addr = Ipv4Addr::new(127, 98, 30, 1);

/// The names of `K` in `ns`.
async fn names<K>(client: &Client, ns: &str) -> Vec<String>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let mut out: Vec<String> = Api::<K>::namespaced(client.clone(), ns)
        .list_metadata(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(ResourceExt::name_any)
        .collect();
    out.sort();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_operator_watching_all_namespaces_serves_two_teams() {
    let tools = Tools::locate().unwrap();
    let hub = ControlPlane::start(&tools, ControlPlaneConfig::new(unique_dir("all-ns")))
        .await
        .unwrap();
    let client = hub.client();
    install_kontinuum_crds(&client).await.unwrap();
    install_operator_roles(&client).await.unwrap();
    install_role(&client).await.unwrap();
    install_addon_installer_role(&client).await.unwrap();
    let system = namespace(&client, "kontinuum-system").await.unwrap();
    let teams = [
        namespace(&client, "team-a").await.unwrap(),
        namespace(&client, "team-b").await.unwrap(),
    ];
    let emulator = Emulator::start(Settings {
        machines: 2,
        first_address: FIRST,
        port: 50000,
        api_port: 6443,
        dir: unique_dir("emulator-all-ns"),
        control_addr: None,
    })
    .await
    .unwrap();
    let repo = ChartRepo::serve(&tools).await.unwrap();
    let helm = tools.path("helm").to_string_lossy().into_owned();
    let helm_home = unique_dir("helm-home").to_string_lossy().into_owned();
    let dir = unique_dir("all-ns-accounts");
    std::fs::create_dir_all(&dir).unwrap();

    // No --namespace anywhere: each operator watches every namespace.
    let operators: [(&str, &str, Vec<&str>); 5] = [
        (
            "instance-discovery",
            INSTANCE_DISCOVERY_ROLE,
            DISCOVERY_ARGS.to_vec(),
        ),
        ("pool-claimer", POOL_CLAIMER_ROLE, vec![]),
        (
            "talos-bootstrapper",
            TALOS_BOOTSTRAPPER_ROLE,
            vec!["--service-account-key-bits", "2048", "--retry-seconds", "1"],
        ),
        (
            "addon-installer",
            ADDON_INSTALLER_ROLE,
            vec![
                "--helm",
                &helm,
                "--helm-home",
                &helm_home,
                "--chart-mirror",
                &repo.url,
                "--resync-interval",
                "2s",
            ],
        ),
        (
            "zone-installer",
            "cluster-admin",
            vec![
                "--insecure-allow-anonymous",
                "true",
                "--hub-grpc-endpoint",
                "127.0.0.1:2379",
                "--retry-interval",
                "1s",
            ],
        ),
    ];
    let mut running = Vec::new();
    for (name, role, args) in &operators {
        assert!(!args.contains(&"--namespace"));
        let kubeconfig = service_account_kubeconfig_for(
            &client,
            hub.kubeconfig_yaml(),
            &dir,
            &system,
            name,
            role,
        )
        .await
        .unwrap();
        running.push(
            Operator::start(&workspace_binary(name).unwrap(), name, &kubeconfig, args)
                .await
                .unwrap(),
        );
    }

    // One Zone per team, in its own namespace.
    let started = Instant::now();
    let zones = [("eu-a", "a"), ("eu-b", "b")];
    for (i, (ns, (name, zone))) in teams.iter().zip(zones).enumerate() {
        let address = Ipv4Addr::from(u32::from(FIRST) + u32::try_from(i).unwrap());
        let object: Zone = serde_json::from_value(serde_json::json!({
            "apiVersion": "kontinuum.sh/v1alpha2", "kind": "Zone",
            "metadata": { "name": name },
            "spec": { "region": "eu", "zone": zone, "seed": { "talosAddresses": [address.to_string()] } },
        }))
        .unwrap();
        Api::<Zone>::namespaced(client.clone(), ns)
            .create(&PostParams::default(), &object)
            .await
            .unwrap();
    }
    for (ns, (name, _)) in teams.iter().zip(zones) {
        let (_, reason, message) =
            wait_zone_condition(&client, ns, name, ("Installed", "True", ""), LIMIT)
                .await
                .unwrap();
        assert_eq!(reason, "Installed", "{message}");
    }
    eprintln!(
        "all namespaces: two zones of two teams installed in {:?}",
        started.elapsed()
    );

    // What each Zone fanned out into is in its own namespace, and only there.
    for (i, (ns, (name, zone))) in teams.iter().zip(zones).enumerate() {
        let address = Ipv4Addr::from(u32::from(FIRST) + u32::try_from(i).unwrap());
        let seed = seed_instance_name("eu", zone, &address.to_string()).unwrap();
        assert_eq!(names::<TalosCluster>(&client, ns).await, [name]);
        assert_eq!(names::<InstancePool>(&client, ns).await, [name]);
        assert_eq!(
            names::<Instance>(&client, ns).await,
            std::slice::from_ref(&seed)
        );
        let instance = Api::<Instance>::namespaced(client.clone(), ns)
            .get(&seed)
            .await
            .unwrap();
        assert_eq!(
            instance.labels().get(CLAIMED_BY).map(String::as_str),
            Some(name)
        );
        let addons = names::<Addon>(&client, ns).await;
        assert_eq!(addons.len(), 3, "{addons:?}");
        assert!(addons.iter().all(|a| a.starts_with(name)), "{addons:?}");
    }
    assert!(
        names::<TalosCluster>(&client, &system).await.is_empty(),
        "nothing lands in the operators' own namespace"
    );

    // Both go away.
    for (ns, (name, _)) in teams.iter().zip(zones) {
        Api::<Zone>::namespaced(client.clone(), ns)
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
    }
    for (ns, (name, _)) in teams.iter().zip(zones) {
        eventually(
            LIMIT,
            &format!("Zone {name} and its cluster gone"),
            || async {
                Ok(Api::<Zone>::namespaced(client.clone(), ns)
                    .get_opt(name)
                    .await?
                    .is_none()
                    && names::<TalosCluster>(&client, ns).await.is_empty())
            },
        )
        .await
        .unwrap();
    }
    for i in 0..2 {
        let address = Ipv4Addr::from(u32::from(FIRST) + i);
        assert_eq!(emulator.mode(address), Some(Mode::Maintenance));
    }
    drop(running);
}
