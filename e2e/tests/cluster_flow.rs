//! The whole TalosCluster flow with every operator so far as a process and nothing standing
//! in for one: instance-discovery, pool-claimer, talos-bootstrapper and addon-installer
//! against the Talos emulator (real downstream control planes) and the real helm, the
//! fixture charts served through the chart mirror (stand-ins for the public charts, which
//! cannot be reached here).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::large_futures,
    clippy::too_many_lines
)]

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kontinuum_crds::conditions;
use kontinuum_crds::v1alpha2::{Addon, Instance, TalosCluster};
use kontinuum_e2e::addons::{ChartRepo, start_addon_installer_with_role};
use kontinuum_e2e::bootstrapper::{
    cluster_condition, create_cluster, create_instance, start_operators, stored_kubeconfig,
    wait_cluster,
};
use kontinuum_e2e::testbed::{Tools, unique_dir};
use kontinuum_e2e::{
    eventually, install_kontinuum_crds, namespace, shared_client, workspace_binary,
};
use kube::ResourceExt as _;
use kube::api::{Api, DeleteParams, ListParams};
use talos_emulator::{Emulator, Mode, Settings};

const LIMIT: Duration = Duration::from_secs(240);

fn established(crd: &CustomResourceDefinition) -> bool {
    crd.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_becomes_ready_with_the_real_addon_installer() {
    let (client, shared) = shared_client().await.unwrap();
    install_kontinuum_crds(&client).await.unwrap();
    let ns = namespace(&client, "flow").await.unwrap();
    let first = Ipv4Addr::new(127, 96, 0, 1);
    let emulator = Emulator::start(Settings {
        machines: 1,
        first_address: first,
        port: 50000,
        api_port: 6443,
        dir: unique_dir("emulator-flow"),
        control_addr: None,
    })
    .await
    .unwrap();
    create_instance(&client, &ns, "m-1", first, "cp")
        .await
        .unwrap();
    let (_operators, _) = start_operators(
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
    let _installer = start_addon_installer_with_role(
        &client,
        shared,
        &ns,
        &repo.url,
        &["--resync-interval", "2s"],
    )
    .await
    .unwrap();

    let started = Instant::now();
    create_cluster(&client, &ns, "eu-2a", 1, 0, false)
        .await
        .unwrap();
    wait_cluster(&client, &ns, "eu-2a", "Ready", "True", LIMIT)
        .await
        .unwrap();
    eprintln!(
        "TalosCluster creation to Ready with the real addon-installer: {:?}",
        started.elapsed()
    );

    // All three built-ins Ready, installed by the addon-installer (not a stand-in).
    let addons: Api<Addon> = Api::namespaced(client.clone(), &ns);
    let list = addons.list(&ListParams::default()).await.unwrap().items;
    let mut releases: Vec<String> = list.iter().map(|a| a.release_name().to_owned()).collect();
    releases.sort();
    assert_eq!(releases, ["cert-manager", "cilium", "gateway-api-crds"]);
    for addon in &list {
        let ready = conditions::get(&addon.status.as_ref().unwrap().conditions, "Ready").unwrap();
        assert_eq!(ready.status, "True", "{}: {ready:?}", addon.name_any());
        let managers: Vec<String> = addon
            .metadata
            .managed_fields
            .iter()
            .flatten()
            .filter(|m| m.subresource.as_deref() == Some("status"))
            .filter_map(|m| m.manager.clone())
            .collect();
        assert!(
            managers.iter().any(|m| m.starts_with("addon-installer")),
            "{}: status written by {managers:?}",
            addon.name_any()
        );
    }

    // The Gateway API and cert-manager CRDs are Established on the downstream cluster.
    let down = kontinuum_e2e::testbed::client_from(
        &stored_kubeconfig(&client, &ns, "eu-2a").await.unwrap(),
    )
    .await
    .unwrap();
    let crds: Api<CustomResourceDefinition> = Api::all(down.clone());
    for name in [
        "gateways.gateway.networking.k8s.io",
        "httproutes.gateway.networking.k8s.io",
        "certificates.cert-manager.io",
        "issuers.cert-manager.io",
    ] {
        let crd = crds
            .get(name)
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(established(&crd), "{name} is not Established");
    }

    // Pod health reaches the TalosCluster: a cilium agent pod NotReady turns the Addon and
    // the cluster Ready=False, naming the pod; restored, both are Ready again.
    let agent = kontinuum_e2e::addons::agent_pod(&down).await.unwrap();
    kontinuum_e2e::addons::set_agent_pod_ready(&down, &agent, false)
        .await
        .unwrap();
    wait_cluster(&client, &ns, "eu-2a", "Ready", "False", LIMIT)
        .await
        .unwrap();
    // Cilium gates the control plane, so Ready names that gate; AddonsReady names the pod too.
    let (_, reason, message) = cluster_condition(&client, &ns, "eu-2a", "Ready")
        .await
        .unwrap();
    assert_eq!(reason, "WaitingForCni", "{message}");
    assert!(message.contains(&agent), "{message}");
    let (status, reason, message) = cluster_condition(&client, &ns, "eu-2a", "AddonsReady")
        .await
        .unwrap();
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "AddonNotHealthy"),
        "{message}"
    );
    assert!(
        message.contains("cilium: NotHealthy") && message.contains(&agent),
        "{message}"
    );
    kontinuum_e2e::addons::set_agent_pod_ready(&down, &agent, true)
        .await
        .unwrap();
    wait_cluster(&client, &ns, "eu-2a", "Ready", "True", LIMIT)
        .await
        .unwrap();

    // Teardown with the addon-installer running: the machine back in maintenance mode, the
    // Addons (their finalizers included) and the cluster gone.
    let clusters: Api<TalosCluster> = Api::namespaced(client.clone(), &ns);
    clusters
        .delete("eu-2a", &DeleteParams::default())
        .await
        .unwrap();
    eventually(LIMIT, "the cluster and its Addons gone", || async {
        Ok(clusters.get_opt("eu-2a").await?.is_none()
            && addons.list(&ListParams::default()).await?.items.is_empty())
    })
    .await
    .unwrap();
    assert_eq!(emulator.mode(first), Some(Mode::Maintenance));
    eventually(LIMIT, "m-1 released", || async {
        Ok(Api::<Instance>::namespaced(client.clone(), &ns)
            .get("m-1")
            .await?
            .labels()
            .get("kontinuum.sh/claimed-by")
            .is_none())
    })
    .await
    .unwrap();
    emulator.shutdown().await;
}
