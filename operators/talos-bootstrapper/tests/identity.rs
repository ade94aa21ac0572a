//! Secrets go only to the machine that was discovered: a machine config (a control plane's
//! carries every cluster CA key) is sent over a maintenance connection whose TLS handshake
//! proved the key instance-discovery recorded. Real test bed, the Talos emulator, and
//! instance-discovery, pool-claimer and talos-bootstrapper as processes on their own
//! ServiceAccounts.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::too_many_lines
)]

use std::net::Ipv4Addr;
use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::events::v1::Event;
use kontinuum_crds::conditions;
use kontinuum_crds::labels::CLAIMED_BY;
use kontinuum_crds::v1alpha2::Instance;
use kontinuum_e2e::bootstrapper::{
    cluster_condition, create_cluster, create_instance, start_bootstrapper, start_operators,
    wait_cluster,
};
use kontinuum_e2e::testbed::unique_dir;
use kontinuum_e2e::{eventually, install_kontinuum_crds, namespace, shared_client};
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt as _};
use talos_emulator::{Emulator, Fault, Mode, Settings};

const LIMIT: Duration = Duration::from_secs(90);

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_talos-bootstrapper"))
}

/// An Instance condition: `(status, reason, message)`.
async fn instance_condition(
    client: &Client,
    ns: &str,
    name: &str,
    type_: &str,
) -> Option<(String, String, String)> {
    let instance = Api::<Instance>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .ok()?;
    let c = conditions::get(&instance.status?.conditions, type_)?.clone();
    Some((c.status, c.reason, c.message))
}

async fn wait_instance(client: &Client, ns: &str, name: &str, type_: &str, reason: &str) {
    let what = format!("Instance {name} {type_} with reason {reason}");
    eventually(LIMIT, &what, || async {
        Ok(instance_condition(client, ns, name, type_)
            .await
            .is_some_and(|c| c.1 == reason))
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn a_machine_replaced_after_discovery_gets_no_config() {
    let (client, shared) = shared_client().await.unwrap();
    install_kontinuum_crds(&client).await.unwrap();
    let ns = namespace(&client, "identity").await.unwrap();
    let first = Ipv4Addr::new(127, 95, 0, 1);
    let emu = Emulator::start(Settings {
        machines: 2,
        first_address: first,
        port: 50000,
        api_port: 6443,
        dir: unique_dir("emulator-identity"),
        control_addr: None,
    })
    .await
    .unwrap();
    let (mut operators, kubeconfig) = start_operators(&client, shared, &ns, bin(), &[])
        .await
        .unwrap();
    // The bootstrapper waits until the machine is claimed and then replaced, so the
    // replacement falls exactly between discovery and the apply.
    operators[2].kill().await.unwrap();

    create_instance(&client, &ns, "m-1", first, "cp")
        .await
        .unwrap();
    wait_instance(&client, &ns, "m-1", "Discovered", "Discovered").await;
    let instances: Api<Instance> = Api::namespaced(client.clone(), &ns);
    let recorded = instances
        .get("m-1")
        .await
        .unwrap()
        .status
        .unwrap()
        .identity
        .expect("discovery records the identity");
    assert_eq!(recorded.len(), 64);

    create_cluster(&client, &ns, "c", 1, 0, false)
        .await
        .unwrap();
    eventually(LIMIT, "m-1 claimed", || async {
        Ok(instances
            .get("m-1")
            .await?
            .labels()
            .get(CLAIMED_BY)
            .is_some())
    })
    .await
    .unwrap();

    // Another machine takes m-1's address (a new maintenance key), then the bootstrapper
    // comes up and tries to configure m-1.
    emu.inject(first, Fault::Replace).await.unwrap();
    operators.push(
        start_bootstrapper(bin(), &kubeconfig, &ns, &[])
            .await
            .unwrap(),
    );

    wait_instance(&client, &ns, "m-1", "Configured", "IdentityChanged").await;
    let (status, _, message) = instance_condition(&client, &ns, "m-1", "Configured")
        .await
        .unwrap();
    assert_eq!(status, "False");
    assert!(
        message.contains(&format!("not the recorded {recorded}"))
            && message.contains("nothing was sent"),
        "{message}"
    );
    wait_cluster(&client, &ns, "c", "Bootstrapped", "False", LIMIT)
        .await
        .unwrap();
    eventually(LIMIT, "Bootstrapped reason IdentityChanged", || async {
        Ok(cluster_condition(&client, &ns, "c", "Bootstrapped")
            .await
            .is_some_and(|c| c.1 == "IdentityChanged" && c.2.contains("m-1")))
    })
    .await
    .unwrap();
    let events: Api<Event> = Api::namespaced(client.clone(), &ns);
    eventually(
        LIMIT,
        "a Warning Event IdentityChanged on the cluster",
        || async {
            Ok(events
                .list(&ListParams::default())
                .await?
                .items
                .iter()
                .any(|e| {
                    e.reason.as_deref() == Some("IdentityChanged")
                        && e.type_.as_deref() == Some("Warning")
                        && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("c")
                }))
        },
    )
    .await
    .unwrap();

    // The emulator's own counters: no ApplyConfiguration reached the impostor, which is
    // still in maintenance mode and was never bootstrapped.
    assert_eq!(emu.apply_calls(first), Some(0));
    assert_eq!(emu.mode(first), Some(Mode::Maintenance));
    assert_eq!(emu.bootstrap_calls(first), Some(0));

    // A user pin (spec.identity) trusts nobody else, not even on first discovery.
    let second = Ipv4Addr::new(127, 95, 0, 2);
    let pinned: Instance = serde_json::from_value(serde_json::json!({
        "apiVersion": "kontinuum.sh/v1alpha2", "kind": "Instance",
        "metadata": { "name": "m-2", "labels": { "role": "spare" } },
        "spec": { "interfaces": [second.to_string()], "identity": "a".repeat(64) }
    }))
    .unwrap();
    instances
        .create(&kube::api::PostParams::default(), &pinned)
        .await
        .unwrap();
    wait_instance(&client, &ns, "m-2", "Discovered", "IdentityChanged").await;
    let m2 = instances.get("m-2").await.unwrap();
    assert!(
        m2.status.and_then(|s| s.identity).is_none(),
        "a pinned Instance records no other machine"
    );

    // A malformed pin is refused at admission, naming the field.
    let err = instances
        .patch(
            "m-2",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "spec": { "identity": "not-hex" } })),
        )
        .await
        .unwrap_err();
    assert!(err.to_string().contains("spec.identity"), "{err}");

    drop(operators);
    emu.shutdown().await;
}
