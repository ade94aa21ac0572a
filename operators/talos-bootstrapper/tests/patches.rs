//! Machine-config patches end to end: the cluster's, a pool's and an Instance's, merged in
//! that order into what each emulated machine runs; a patch Talos would refuse stops its
//! machine before anything is sent, and fixing it lets the machine join; a changed patch on
//! the Ready cluster is rolled onto each machine in place, one at a time. Real test bed, the
//! Talos emulator (strict decoding, a real downstream control plane), and
//! instance-discovery, pool-claimer and talos-bootstrapper as processes.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::too_many_lines
)]

use std::net::Ipv4Addr;
use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::events::v1::Event;
use kontinuum_crds::conditions;
use kontinuum_crds::v1alpha2::{Instance, TalosCluster, secrets_secret_name};
use kontinuum_e2e::bootstrapper::{
    AddonsReady, create_cluster_with, create_instance, start_operators, wait_cluster,
};
use kontinuum_e2e::testbed::unique_dir;
use kontinuum_e2e::{eventually, install_kontinuum_crds, namespace, shared_client};
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::{Value, json};
use talos_emulator::{Emulator, Settings};

const LIMIT: Duration = Duration::from_secs(180);

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_talos-bootstrapper"))
}

/// The `v1alpha1` document of the config the machine at `address` runs.
fn running(emu: &Emulator, address: Ipv4Addr) -> Value {
    let yaml = emu
        .running_config(address)
        .expect("the machine runs a config");
    let documents: Vec<Value> = serde_saphyr::from_multiple(&yaml).unwrap();
    documents
        .into_iter()
        .find(|d| d.get("kind").is_none())
        .expect("a v1alpha1 document")
}

async fn set_instance_patches(api: &Api<Instance>, name: &str, patches: &Value) {
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({ "spec": { "configPatches": patches } })),
    )
    .await
    .unwrap();
}

fn configured(instance: &Instance) -> Option<(String, String, String)> {
    let c = conditions::get(&instance.status.as_ref()?.conditions, "Configured")?;
    Some((c.status.clone(), c.reason.clone(), c.message.clone()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn patches_merge_in_order_an_invalid_one_sends_nothing_and_a_change_rolls_in_place() {
    let (client, shared) = shared_client().await.unwrap();
    install_kontinuum_crds(&client).await.unwrap();
    let ns = namespace(&client, "patches").await.unwrap();
    let first = Ipv4Addr::new(127, 71, 0, 1);
    let (cp, w1, w2) = (
        first,
        Ipv4Addr::new(127, 71, 0, 2),
        Ipv4Addr::new(127, 71, 0, 3),
    );
    let emu = Emulator::start(Settings {
        machines: 3,
        first_address: first,
        port: 50000,
        api_port: 6443,
        dir: unique_dir("emulator-patches"),
        control_addr: None,
    })
    .await
    .unwrap();
    let instances: Api<Instance> = Api::namespaced(client.clone(), &ns);
    create_instance(&client, &ns, "cp-1", cp, "cp")
        .await
        .unwrap();
    create_instance(&client, &ns, "w-1", w1, "worker")
        .await
        .unwrap();
    create_instance(&client, &ns, "w-2", w2, "worker")
        .await
        .unwrap();
    // w-1: its static address, and the last word on a sysctl every level sets.
    let w1_patches = json!([{ "machine": {
        "network": { "interfaces": [{ "interface": "eth0", "addresses": ["10.0.0.5/24"] }] },
        "sysctls": { "net.core.somaxconn": "3" },
    } }]);
    set_instance_patches(&instances, "w-1", &w1_patches).await;
    // w-2: a misspelled key, as a person could write it.
    let misspelled = json!([{ "machine": { "registries": { "mirrorz": {
        "docker.io": { "endpoints": ["https://mirror.example"] },
    } } } }]);
    set_instance_patches(&instances, "w-2", &misspelled).await;

    let (_operators, _) = start_operators(&client, shared, &ns, bin(), &[])
        .await
        .unwrap();
    let _addons = AddonsReady::start(client.clone(), ns.clone());
    create_cluster_with(&client, &ns, "eu-pt", 1, 2, false, |spec| {
        spec["talos"]["configPatches"] = json!([{ "machine": {
            "registries": { "mirrors": { "docker.io": { "endpoints": ["https://mirror.example"] } } },
            "sysctls": { "net.core.somaxconn": "1" },
        } }]);
        spec["workers"][0]["configPatches"] = json!([{ "machine": {
            "install": { "disk": "/dev/sda", "diskSelector": { "$patch": "delete" } },
            "sysctls": { "net.core.somaxconn": "2" },
        } }]);
    })
    .await
    .unwrap();
    wait_cluster(&client, &ns, "eu-pt", "Ready", "True", LIMIT)
        .await
        .unwrap();

    // w-2 is stopped, named, and was sent nothing.
    let refused = eventually(LIMIT, "w-2 Configured=False/InvalidConfigPatch", || async {
        let i = instances.get("w-2").await?;
        Ok(configured(&i).is_some_and(|(s, r, _)| s == "False" && r == "InvalidConfigPatch"))
    });
    refused.await.unwrap();
    let (_, _, message) = configured(&instances.get("w-2").await.unwrap()).unwrap();
    assert!(
        message.contains("Instance w-2 spec.configPatches[0]")
            && message.contains(".machine.registries.mirrorz")
            && message.contains("nothing was sent"),
        "{message}"
    );
    assert_eq!(
        emu.apply_calls(w2),
        Some(0),
        "no ApplyConfiguration reached w-2"
    );
    let events: Api<Event> = Api::namespaced(client.clone(), &ns);
    let warned = events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .any(|e| {
            e.reason.as_deref() == Some("InvalidConfigPatch")
                && e.note.as_deref().is_some_and(|n| n.contains("mirrorz"))
        });
    assert!(warned, "a Warning Event names the refused patch");

    // What each configured machine runs: merged cluster → pool → Instance.
    let cp_config = running(&emu, cp);
    let w1_config = running(&emu, w1);
    let mirror = "/machine/registries/mirrors/docker.io/endpoints/0";
    for config in [&cp_config, &w1_config] {
        assert_eq!(
            config.pointer(mirror),
            Some(&json!("https://mirror.example"))
        );
    }
    let somaxconn = |c: &Value| c.pointer("/machine/sysctls/net.core.somaxconn").cloned();
    assert_eq!(
        somaxconn(&cp_config),
        Some(json!("1")),
        "the cluster's patch only"
    );
    assert_eq!(
        somaxconn(&w1_config),
        Some(json!("3")),
        "the Instance's patch last"
    );
    assert_eq!(
        cp_config.pointer("/machine/install/diskSelector"),
        Some(&json!({}))
    );
    assert_eq!(
        w1_config.pointer("/machine/install/disk"),
        Some(&json!("/dev/sda"))
    );
    assert_eq!(w1_config.pointer("/machine/install/diskSelector"), None);
    assert_eq!(
        w1_config.pointer("/machine/network/interfaces/0/addresses/0"),
        Some(&json!("10.0.0.5/24"))
    );

    // Fixed (the pool's sysctl is then what w-2 runs), it is configured and joins, once.
    let fixed = json!([{ "machine": { "registries": { "mirrors": {
        "quay.io": { "endpoints": ["https://mirror.example"] },
    } } } }]);
    set_instance_patches(&instances, "w-2", &fixed).await;
    eventually(LIMIT, "w-2 joined", || async {
        let i = instances.get("w-2").await?;
        Ok(conditions::is_true(
            &i.status.unwrap_or_default().conditions,
            "Joined",
        ))
    })
    .await
    .unwrap();
    assert_eq!(emu.apply_calls(w2), Some(1));
    let w2_config = running(&emu, w2);
    assert_eq!(somaxconn(&w2_config), Some(json!("2")));
    assert_eq!(
        w2_config.pointer("/machine/registries/mirrors/quay.io/endpoints/0"),
        Some(&json!("https://mirror.example"))
    );
    assert_eq!(emu.bootstrap_calls(cp), Some(1));

    // A changed cluster patch on the Ready cluster: rolled onto each machine in place, the
    // workers first, once each, with no Bootstrap and the same secrets bundle.
    let clusters: Api<TalosCluster> = Api::namespaced(client.clone(), &ns);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let bundle_version = |s: Secret| s.metadata.resource_version;
    let bundle_before = bundle_version(secrets.get(&secrets_secret_name("eu-pt")).await.unwrap());
    let applies_before: Vec<u32> = [cp, w1, w2]
        .iter()
        .map(|a| emu.apply_calls(*a).unwrap())
        .collect();
    assert_eq!(applies_before, [1, 1, 1]);
    let mut cluster = clusters.get("eu-pt").await.unwrap();
    cluster.spec.talos.as_mut().unwrap().config_patches[0]["machine"]["sysctls"]["vm.max_map_count"] =
        json!("262144");
    let patched = json!({ "spec": { "talos": { "configPatches": cluster.spec.talos.unwrap().config_patches } } });
    clusters
        .patch("eu-pt", &PatchParams::default(), &Patch::Merge(&patched))
        .await
        .unwrap();
    let ready_throughout = std::sync::atomic::AtomicBool::new(true);
    eventually(
        LIMIT,
        "ConfigUpToDate=True with every machine at its new config",
        || {
            let (clusters, emu) = (&clusters, &emu);
            let ready_throughout = &ready_throughout;
            async move {
                let c = clusters.get("eu-pt").await?;
                let conds = c.status.unwrap_or_default().conditions;
                if !conditions::is_true(&conds, "Ready") {
                    ready_throughout.store(false, std::sync::atomic::Ordering::Relaxed);
                }
                let rolled = [cp, w1, w2].iter().all(|a| {
                    emu.running_config(*a).is_some_and(|y| {
                        y.contains("vm.max_map_count: '262144'")
                            || y.contains("vm.max_map_count: \"262144\"")
                    })
                });
                Ok(rolled && conditions::is_true(&conds, "ConfigUpToDate"))
            }
        },
    )
    .await
    .unwrap();
    assert!(
        ready_throughout.into_inner(),
        "the cluster stayed Ready while its machines were reconfigured"
    );
    let applies_after: Vec<u32> = [cp, w1, w2]
        .iter()
        .map(|a| emu.apply_calls(*a).unwrap())
        .collect();
    assert_eq!(
        applies_after,
        [2, 2, 2],
        "one ApplyConfiguration per machine"
    );
    assert_eq!(emu.bootstrap_calls(cp), Some(1), "nothing re-bootstrapped");
    let bundle_after = bundle_version(secrets.get(&secrets_secret_name("eu-pt")).await.unwrap());
    assert_eq!(
        bundle_before, bundle_after,
        "the secrets bundle is untouched"
    );
    // One at a time, control planes last: each second apply ended before the next began.
    let second_apply = |a: Ipv4Addr| {
        emu.calls(a)
            .unwrap()
            .into_iter()
            .filter(|c| c.rpc == "ApplyConfiguration")
            .nth(1)
            .unwrap()
    };
    let (a, b, c) = (second_apply(w1), second_apply(w2), second_apply(cp));
    assert!(
        a.ended_ms.unwrap() <= b.started_ms && b.ended_ms.unwrap() <= c.started_ms,
        "w-1, w-2, then cp-1, one at a time: {a:?} {b:?} {c:?}"
    );
    let statuses = clusters.get("eu-pt").await.unwrap().status.unwrap();
    let recorded: Vec<&str> = statuses
        .machine_configs
        .iter()
        .map(|m| m.instance.as_str())
        .collect();
    assert_eq!(recorded, ["cp-1", "w-1", "w-2"]);
    assert!(
        statuses
            .machine_configs
            .iter()
            .all(|m| m.hash.len() == 64 && !m.rebooting)
    );
    emu.shutdown().await;
}
