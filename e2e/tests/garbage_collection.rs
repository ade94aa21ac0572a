//! The ownership chain of DESIGN section 1, collected by the REAL garbage collector of the
//! test bed's kube-controller-manager: Zone -> TalosCluster -> {InstancePool, Addon,
//! Secret}. Deleting the Zone removes the rest, with background and with foreground
//! propagation; an Instance (owned by nobody) survives.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::large_futures
)]

use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kontinuum_e2e::{
    dynamic_api, eventually, install_kontinuum_crds, load_yaml, namespace, shared_client,
};
use kube::api::{Api, DeleteParams, DynamicObject, PostParams, PropagationPolicy};
use kube::{Client, ResourceExt as _};

const GC_LIMIT: Duration = Duration::from_secs(60);

fn example(kind: &str) -> DynamicObject {
    let examples: Vec<DynamicObject> = load_yaml("api/valid.yaml").unwrap();
    examples
        .into_iter()
        .find(|o| o.types.as_ref().unwrap().kind == kind)
        .unwrap()
}

fn owner(obj: &DynamicObject) -> OwnerReference {
    let types = obj.types.as_ref().unwrap();
    OwnerReference {
        api_version: types.api_version.clone(),
        kind: types.kind.clone(),
        name: obj.name_any(),
        uid: obj.uid().unwrap(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

struct Chain {
    zone: DynamicObject,
    dependents: Vec<(Api<DynamicObject>, String)>,
    secret: String,
    instance: String,
}

/// Creates Zone -> TalosCluster -> {InstancePool, Addon, Secret}, plus an unowned Instance.
async fn create_chain(client: &Client, ns: &str) -> Chain {
    let create = |mut obj: DynamicObject, owner: Option<OwnerReference>| {
        let client = client.clone();
        let ns = ns.to_string();
        async move {
            obj.metadata.owner_references = owner.map(|o| vec![o]);
            let api = dynamic_api(&client, &ns, &obj).unwrap();
            let created = api.create(&PostParams::default(), &obj).await.unwrap();
            (api, created)
        }
    };
    let (_, zone) = create(example("Zone"), None).await;
    let (tc_api, cluster) = create(example("TalosCluster"), Some(owner(&zone))).await;
    let (pool_api, pool) = create(example("InstancePool"), Some(owner(&cluster))).await;
    let (addon_api, addon) = create(example("Addon"), Some(owner(&cluster))).await;
    let (_, instance) = create(example("Instance"), None).await;

    let secret: Secret = serde_json::from_value(serde_json::json!({
        "metadata": { "name": format!("{}-secrets", cluster.name_any()), "ownerReferences": [owner(&cluster)] },
        "stringData": { "bundle": "not a real bundle" }
    }))
    .unwrap();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    let secret = secrets
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();

    Chain {
        zone,
        dependents: vec![
            (tc_api, cluster.name_any()),
            (pool_api, pool.name_any()),
            (addon_api, addon.name_any()),
        ],
        secret: secret.name_any(),
        instance: instance.name_any(),
    }
}

async fn assert_collected(client: &Client, ns: &str, chain: &Chain) {
    let zones = dynamic_api(client, ns, &chain.zone).unwrap();
    let zone = chain.zone.name_any();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    eventually(
        GC_LIMIT,
        "the Zone and everything it owns to be gone",
        || async {
            let mut present = zones.get_opt(&zone).await?.is_some();
            for (api, name) in &chain.dependents {
                present |= api.get_opt(name).await?.is_some();
            }
            present |= secrets.get_opt(&chain.secret).await?.is_some();
            Ok(!present)
        },
    )
    .await
    .unwrap();
    let instance = example("Instance");
    let instances = dynamic_api(client, ns, &instance).unwrap();
    assert!(
        instances.get_opt(&chain.instance).await.unwrap().is_some(),
        "the Instance is owned by nobody and must survive"
    );
}

#[tokio::test]
async fn deleting_a_zone_collects_its_chain_in_the_background() {
    let (client, _) = shared_client().await.unwrap();
    install_kontinuum_crds(&client).await.unwrap();
    let ns = namespace(&client, "gc-background").await.unwrap();
    let chain = create_chain(&client, &ns).await;
    let zones = dynamic_api(&client, &ns, &chain.zone).unwrap();
    zones
        .delete(&chain.zone.name_any(), &DeleteParams::background())
        .await
        .unwrap();
    assert_collected(&client, &ns, &chain).await;
}

#[tokio::test]
async fn deleting_a_zone_collects_its_chain_in_the_foreground() {
    let (client, _) = shared_client().await.unwrap();
    install_kontinuum_crds(&client).await.unwrap();
    let ns = namespace(&client, "gc-foreground").await.unwrap();
    let chain = create_chain(&client, &ns).await;
    let zones = dynamic_api(&client, &ns, &chain.zone).unwrap();
    let params = DeleteParams {
        propagation_policy: Some(PropagationPolicy::Foreground),
        ..Default::default()
    };
    zones.delete(&chain.zone.name_any(), &params).await.unwrap();
    // Foreground: the Zone stays (with the foregroundDeletion finalizer) until its
    // dependents are gone; then it goes too.
    assert_collected(&client, &ns, &chain).await;
}
