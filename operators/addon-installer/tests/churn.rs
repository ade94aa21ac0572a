//! Bounded state (issue 14, deliverable 4): the addon-installer, a process on the real test
//! bed with its chart's RBAC, keeps per-Addon maps (backoff, the spec-change filter, the
//! readiness tracker) whose entries go with their Addons. 1,000 Addons are created and
//! deleted; the maps' sizes, from the operator's own `tracked_objects` metric, rise to
//! 1,000 and return to zero.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::large_futures
)]

use std::path::Path;
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use kontinuum_crds::v1alpha2::Addon;
use kontinuum_e2e::addons::{
    ADDON_INSTALLER_ROLE, ChartRepo, install_addon_installer_role, start_addon_installer,
    tracked_objects,
};
use kontinuum_e2e::testbed::Tools;
use kontinuum_e2e::{
    eventually, install_kontinuum_crds, namespace, service_account_kubeconfig, shared_client,
};
use kube::api::{Api, DeleteParams, ListParams, PostParams};

const BIN: &str = env!("CARGO_BIN_EXE_addon-installer");
const OBJECTS: usize = 1_000;
const LIMIT: Duration = Duration::from_secs(300);
const MAPS: [&str; 3] = ["backoff", "spec_changes", "readiness"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maps_are_empty_after_a_thousand_addons_come_and_go() {
    let (hub, shared) = shared_client().await.unwrap();
    install_kontinuum_crds(&hub).await.unwrap();
    install_addon_installer_role(&hub).await.unwrap();
    let ns = namespace(&hub, "ai-churn").await.unwrap();
    let repo = ChartRepo::serve(&Tools::locate().unwrap()).await.unwrap();
    let kubeconfig =
        service_account_kubeconfig(&hub, shared, &ns, "addon-installer", ADDON_INSTALLER_ROLE)
            .await
            .unwrap();
    let operator = start_addon_installer(Path::new(BIN), &kubeconfig, &ns, &repo.url, &[])
        .await
        .unwrap();
    let sizes = || async {
        let metrics = operator.metrics().await?;
        Ok::<_, anyhow::Error>(MAPS.map(|m| tracked_objects(&metrics, m)))
    };
    assert_eq!(
        sizes().await.unwrap(),
        [Some(0); 3],
        "the maps are exported, empty"
    );

    // 1,000 Addons of a cluster that does not exist: each is seen and reconciled.
    let addons: Api<Addon> = Api::namespaced(hub.clone(), &ns);
    let started = Instant::now();
    futures::stream::iter(0..OBJECTS)
        .map(|i| {
            let addons = addons.clone();
            async move {
                let addon: Addon = serde_json::from_value(serde_json::json!({
                    "apiVersion": "kontinuum.sh/v1alpha2", "kind": "Addon",
                    "metadata": { "name": format!("churn-{i:04}") },
                    "spec": {
                        "talosClusterRef": { "name": "absent" },
                        "chart": { "repo": repo_url(), "name": "demo", "version": "0.1.0" },
                        "namespace": { "name": "demo" },
                    }
                }))
                .unwrap();
                addons.create(&PostParams::default(), &addon).await.unwrap();
            }
        })
        .buffer_unordered(16)
        .collect::<Vec<()>>()
        .await;
    let peak = std::sync::Mutex::new([0u64; 3]);
    eventually(LIMIT, "every Addon tracked", || async {
        let now = sizes().await?;
        let mut peak = peak.lock().unwrap();
        for (p, n) in peak.iter_mut().zip(now) {
            *p = (*p).max(n.unwrap_or(0));
        }
        Ok(now[1] == Some(OBJECTS as u64) && now[2] == Some(OBJECTS as u64))
    })
    .await
    .unwrap();
    let peak = *peak.lock().unwrap();
    let created = started.elapsed();

    // All deleted (the operator removes its finalizers): every map drops to zero.
    let deleting = Instant::now();
    addons
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await
        .unwrap();
    eventually(LIMIT, "every Addon gone", || async {
        Ok(addons
            .list_metadata(&ListParams::default())
            .await?
            .items
            .is_empty())
    })
    .await
    .unwrap();
    let emptied = eventually(LIMIT, "every map empty", || async {
        Ok(sizes().await? == [Some(0); 3])
    })
    .await;
    if let Err(err) = emptied {
        panic!(
            "{err:#}: backoff/spec_changes/readiness now {:?}; log {}",
            sizes().await,
            operator.log.display()
        );
    }
    eprintln!(
        "churn: {OBJECTS} Addons created and tracked in {created:?} (peak backoff/spec_changes/readiness entries {peak:?}), deleted and forgotten in {:?}",
        deleting.elapsed()
    );
}

/// A repository URL the Addons name; nothing is installed (their cluster does not exist).
fn repo_url() -> &'static str {
    "https://charts.invalid"
}
