//! Issue 11, acceptance 5: `v1alpha1` Kontinuums written and read through the real API
//! server, converted by `registry hub`'s webhook (HTTPS, serving certificate from a test
//! CA), which also wires itself into the CRD and restores the wiring when it is stripped.
//! Its own test binary, hence its own control plane: the CRD's conversion is cluster-wide.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::too_many_lines,
    clippy::print_stderr
)]

mod support;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kontinuum_crds::v1alpha2::{Kontinuum, KontinuumRole, KontinuumSpec};
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams,
};
use kube::{Client, ResourceExt as _};
use registry::webhook::ROLE_ANNOTATION;
use serde_json::json;
use support::{Bed, LOCALHOST, Registry, free_port, install_kontinuum_crd, until};

const CRD: &str = "kontinuums.kontinuum.sh";

fn v1alpha1(client: &Client, ns: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("kontinuum.sh", "v1alpha1", "Kontinuum");
    Api::namespaced_with(
        client.clone(),
        ns,
        &ApiResource::from_gvk_with_plural(&gvk, "kontinuums"),
    )
}

fn webhook_wired(crd: &CustomResourceDefinition, url: &str, ca: &[u8]) -> bool {
    crd.spec.conversion.as_ref().is_some_and(|c| {
        c.strategy == "Webhook"
            && c.webhook.as_ref().is_some_and(|w| {
                w.conversion_review_versions == ["v1"]
                    && w.client_config.as_ref().is_some_and(|cc| {
                        cc.url.as_deref() == Some(url)
                            && cc.ca_bundle.as_ref().is_some_and(|b| b.0 == ca)
                    })
            })
    })
}

async fn wait_crd(
    crds: &Api<CustomResourceDefinition>,
    limit: Duration,
    ok: impl Fn(&CustomResourceDefinition) -> bool,
) -> Duration {
    let start = Instant::now();
    loop {
        if ok(&crds.get(CRD).await.unwrap()) {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < limit,
            "the CRD did not reach the expected state in {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn v1_object(name: &str, spec: &serde_json::Value) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "kontinuum.sh/v1alpha1",
        "kind": "Kontinuum",
        "metadata": {
            "name": name,
            "labels": {"team": "ops"},
            "annotations": {"kontinuum.sh/note": "written as v1alpha1"},
        },
        "spec": spec,
    }))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acceptance_5_v1alpha1_round_trips_through_the_webhook() {
    let bed = Bed::new("reg-a5").await;
    install_kontinuum_crd(&bed.client).await;
    let client = bed.client.clone();

    // The webhook's serving certificate, from a test CA, for 127.0.0.1.
    let ca = kontinuum_testbed::CertificateAuthority::generate("registry-webhook-ca").unwrap();
    let serving = ca.server("registry-webhook", &[LOCALHOST], &[]).unwrap();
    let (ca_file, cert, key) = (
        bed.dir.join("webhook-ca.crt"),
        bed.dir.join("webhook.crt"),
        bed.dir.join("webhook.key"),
    );
    std::fs::write(&ca_file, &ca.cert_pem).unwrap();
    std::fs::write(&cert, &serving.cert_pem).unwrap();
    std::fs::write(&key, &serving.key_pem).unwrap();
    let webhook = SocketAddr::new(LOCALHOST, free_port());
    let url = format!("https://{webhook}/convert");

    let mut hub = Registry::spawn(
        "hub",
        &[
            "hub".into(),
            format!("--kubeconfig={}", bed.kubeconfig.display()),
            format!("--namespace={}", bed.namespace),
            "--name=hub".into(),
            format!("--store={}", bed.etcd.url),
            format!("--webhook-addr={webhook}"),
            format!("--webhook-cert={}", cert.display()),
            format!("--webhook-key={}", key.display()),
            format!("--webhook-ca={}", ca_file.display()),
            format!("--webhook-url={url}"),
        ],
        &[],
        &bed.dir,
    );
    hub.wait_healthy().await;

    // --- the registry wires its webhook into the CRD ---
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let ca_pem = ca.cert_pem.as_bytes().to_vec();
    let wired = wait_crd(&crds, Duration::from_secs(30), |c| {
        webhook_wired(c, &url, &ca_pem)
    })
    .await;
    eprintln!("CRD conversion wired {wired:?} after the hub was healthy");

    // Objects written by users, in a namespace the registry does not manage.
    let ns = kontinuum_e2e::namespace(&client, "reg-a5-objects")
        .await
        .unwrap();
    let old = v1alpha1(&client, &ns);
    let new: Api<Kontinuum> = Api::namespaced(client.clone(), &ns);

    // --- a v1alpha1 object: created, read back, read as v1alpha2 and back ---
    let worker = v1_object(
        "worker",
        &json!({"role": "Worker", "region": "eu", "zone": "1a"}),
    );
    let created = old.create(&PostParams::default(), &worker).await.unwrap();
    assert_eq!(
        created.types.as_ref().unwrap().api_version,
        "kontinuum.sh/v1alpha1"
    );
    assert_eq!(
        created.data["spec"],
        json!({"role": "Worker", "region": "eu", "zone": "1a"})
    );
    // The status a v1alpha1 client writes, through the status subresource.
    let heartbeat = "2027-01-15T08:00:00Z";
    let status = json!({
        "apiVersion": "kontinuum.sh/v1alpha1", "kind": "Kontinuum",
        "status": {"lastHeartbeatTime": heartbeat},
    });
    old.patch_status(
        "worker",
        &PatchParams::apply("v1alpha1-client").force(),
        &Patch::Apply(&status),
    )
    .await
    .unwrap();
    let as_new = new.get("worker").await.unwrap();
    assert_eq!(
        as_new.spec,
        KontinuumSpec {
            region: Some("eu".into()),
            zone: Some("1a".into())
        }
    );
    let new_status = as_new.status.clone().unwrap();
    assert_eq!(new_status.role, Some(KontinuumRole::Worker));
    assert_eq!(
        new_status.last_heartbeat_time.unwrap().0.to_string(),
        heartbeat
    );
    assert_eq!(as_new.labels()["team"], "ops");
    assert!(
        !as_new.annotations().contains_key(ROLE_ANNOTATION),
        "the role is implied"
    );
    let back = old.get("worker").await.unwrap();
    assert_eq!(
        back.data["spec"],
        json!({"role": "Worker", "region": "eu", "zone": "1a"})
    );
    assert_eq!(back.data["status"], json!({"lastHeartbeatTime": heartbeat}));
    assert_eq!(
        back.labels(),
        &BTreeMap::from([("team".to_owned(), "ops".to_owned())])
    );
    assert_eq!(
        back.annotations(),
        &BTreeMap::from([(
            "kontinuum.sh/note".to_owned(),
            "written as v1alpha1".to_owned()
        )])
    );
    assert_eq!(back.metadata.uid, created.metadata.uid);

    // A v1alpha2 write (a label) and a v1alpha1 update keep what v1alpha1 can express.
    let mut relabel = back.clone();
    relabel.labels_mut().insert("tier".into(), "edge".into());
    let updated = old
        .replace("worker", &PostParams::default(), &relabel)
        .await
        .unwrap();
    assert_eq!(updated.data["spec"], back.data["spec"]);
    assert_eq!(updated.data["status"], back.data["status"]);
    assert_eq!(updated.labels()["tier"], "edge");

    // --- a role its location does not imply survives too ---
    let odd = v1_object("odd", &json!({"role": "Worker"}));
    old.create(&PostParams::default(), &odd).await.unwrap();
    let back = old.get("odd").await.unwrap();
    assert_eq!(back.data["spec"], json!({"role": "Worker"}));
    assert!(
        !back.annotations().contains_key(ROLE_ANNOTATION),
        "never shown in v1alpha1"
    );
    let stored = new.get("odd").await.unwrap();
    assert_eq!(stored.annotations()[ROLE_ANNOTATION], "Worker");

    // --- v1alpha2 objects read as v1alpha1, one by one and as a list ---
    let hub_entry = v1alpha1(&client, &bed.namespace).get("hub").await.unwrap();
    assert_eq!(hub_entry.data["spec"], json!({"role": "ControlPlane"}));
    assert!(hub_entry.data["status"]["lastHeartbeatTime"].is_string());
    let written_new = Kontinuum::new(
        "from-v2",
        KontinuumSpec {
            region: Some("us".into()),
            zone: Some("2b".into()),
        },
    );
    new.create(&PostParams::default(), &written_new)
        .await
        .unwrap();
    let listed = old.list(&ListParams::default()).await.unwrap();
    let roles: BTreeMap<String, String> = listed
        .items
        .iter()
        .map(|o| {
            (
                o.name_any(),
                o.data["spec"]["role"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        roles,
        BTreeMap::from([
            ("from-v2".to_owned(), "Worker".to_owned()),
            ("odd".to_owned(), "Worker".to_owned()),
            ("worker".to_owned(), "Worker".to_owned()),
        ])
    );
    assert!(
        hub.metric("kontinuum_registry_conversions_total{result=\"success\"}")
            .await
            >= 5
    );
    assert_eq!(
        hub.metric("kontinuum_registry_conversions_total{result=\"failure\"}")
            .await,
        0
    );

    // --- someone strips the conversion stanza: it is restored ---
    let strip = json!({"spec": {"conversion": {"strategy": "None", "webhook": null}}});
    crds.patch(CRD, &PatchParams::default(), &Patch::Merge(&strip))
        .await
        .unwrap();
    let stripped = Instant::now();
    let restored = wait_crd(&crds, Duration::from_secs(30), |c| {
        webhook_wired(c, &url, &ca_pem)
    })
    .await;
    eprintln!("conversion stanza stripped -> restored in {restored:?}");
    assert!(
        stripped.elapsed() <= Duration::from_secs(5),
        "{:?}",
        stripped.elapsed()
    );
    // And v1alpha1 reads work again.
    assert_eq!(
        old.get("odd").await.unwrap().data["spec"],
        json!({"role": "Worker"})
    );

    // The hub's own entry is there (and readable in both versions) the whole time.
    until(
        &client,
        &bed.namespace,
        Duration::from_secs(10),
        "the hub's entry",
        |all| all.contains_key("hub"),
    )
    .await;
    hub.sigterm();
    assert!(
        hub.exited(Duration::from_secs(10)).await.success(),
        "{}",
        hub.log_tail()
    );
}
