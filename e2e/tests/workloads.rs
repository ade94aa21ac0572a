//! The test bed behaves like a cluster: a Deployment's pod is scheduled onto a KWOK node and
//! becomes Running and Ready, and deleting a namespace finishes.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::large_futures
)]

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kontinuum_e2e::{eventually, namespace, shared_client, within};
use kube::ResourceExt as _;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::runtime::wait::{await_condition, conditions};

fn pod_ready(pod: &Pod) -> bool {
    let status = pod.status.as_ref();
    status.and_then(|s| s.phase.as_deref()) == Some("Running")
        && status.and_then(|s| s.pod_ip.as_ref()).is_some()
        && status
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

#[tokio::test]
async fn a_deployment_pod_runs_on_a_kwok_node_and_the_namespace_deletes() {
    let (client, _) = shared_client().await.unwrap();
    let ns = namespace(&client, "workloads").await.unwrap();
    let deployment: Deployment = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "web" },
        "spec": {
            "replicas": 1,
            "selector": { "matchLabels": { "app": "web" } },
            "template": {
                "metadata": { "labels": { "app": "web" } },
                "spec": { "containers": [{ "name": "web", "image": "example.invalid/web:1" }] }
            }
        }
    }))
    .unwrap();
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    deployments
        .create(&PostParams::default(), &deployment)
        .await
        .unwrap();

    within(
        Duration::from_secs(60),
        "Deployment web available",
        await_condition(
            deployments.clone(),
            "web",
            conditions::is_deployment_completed(),
        ),
    )
    .await
    .unwrap()
    .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let listed = pods
        .list(&ListParams::default().labels("app=web"))
        .await
        .unwrap();
    assert_eq!(listed.items.len(), 1);
    let pod = &listed.items[0];
    assert!(
        pod_ready(pod),
        "pod {} is not Running and Ready: {:?}",
        pod.name_any(),
        pod.status
    );
    assert_eq!(
        pod.spec.as_ref().unwrap().node_name.as_deref(),
        Some("kwok-node-0")
    );

    let namespaces: Api<Namespace> = Api::all(client.clone());
    let uid = namespaces.get(&ns).await.unwrap().uid().unwrap();
    namespaces
        .delete(&ns, &DeleteParams::default())
        .await
        .unwrap();
    within(
        Duration::from_secs(90),
        "namespace deleted",
        await_condition(namespaces, &ns, conditions::is_deleted(&uid)),
    )
    .await
    .unwrap()
    .unwrap();
    eventually(Duration::from_secs(5), "the pod to be gone", || async {
        Ok(pods.list(&ListParams::default()).await?.items.is_empty())
    })
    .await
    .unwrap();
}
