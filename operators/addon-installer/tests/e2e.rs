//! The addon-installer as a host process against the real test bed: a real hub, a real
//! downstream control plane with a KWOK node per test, the real helm, the fixture charts
//! served from a local chart repository through `--chart-mirror`. The test writes what the
//! talos-bootstrapper would (the TalosCluster, its kubeconfig Secret, the built-in Addons).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::large_futures,
    clippy::too_many_lines
)]

use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::jiff::Timestamp;
use kontinuum_crds::conditions;
use kontinuum_crds::v1alpha2::{Addon, TalosCluster};
use kontinuum_e2e::addons::{
    ADDON_INSTALLER_ROLE, ChartRepo, addon_ready, downstream_cluster, install_addon_installer_role,
    reconciles, seed_builtin, seed_cluster, start_addon_installer, tracked_objects,
};
use kontinuum_e2e::testbed::Tools;
use kontinuum_e2e::{
    Operator, audit_writes, eventually, install_kontinuum_crds, namespace,
    service_account_kubeconfig, shared_client,
};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt as _};

const CLUSTER: &str = "eu-west-1a";
const LIMIT: Duration = Duration::from_secs(180);
const BIN: &str = env!("CARGO_BIN_EXE_addon-installer");

struct Bed {
    hub: Client,
    ns: String,
    down: Option<kontinuum_e2e::testbed::ControlPlane>,
    repo: ChartRepo,
    operator: Operator,
    kubeconfig: std::path::PathBuf,
    args: Vec<String>,
}

impl Bed {
    fn down(&self) -> &kontinuum_e2e::testbed::ControlPlane {
        self.down
            .as_ref()
            .expect("the downstream cluster is running")
    }
}

/// A hub namespace with the cluster seeded, a downstream cluster, the chart repository and
/// the addon-installer (with its chart's RBAC) watching that namespace.
async fn bed(prefix: &str, extra: &[&str]) -> Bed {
    let (hub, shared) = shared_client().await.unwrap();
    install_kontinuum_crds(&hub).await.unwrap();
    install_addon_installer_role(&hub).await.unwrap();
    let ns = namespace(&hub, prefix).await.unwrap();
    let tools = Tools::locate().unwrap();
    let (down, repo) = tokio::join!(downstream_cluster(&tools, prefix), ChartRepo::serve(&tools));
    let (down, repo) = (down.unwrap(), repo.unwrap());
    seed_cluster(&hub, &ns, CLUSTER, down.kubeconfig_yaml(), 1)
        .await
        .unwrap();
    let kubeconfig =
        service_account_kubeconfig(&hub, shared, &ns, "addon-installer", ADDON_INSTALLER_ROLE)
            .await
            .unwrap();
    let operator = start_addon_installer(Path::new(BIN), &kubeconfig, &ns, &repo.url, extra)
        .await
        .unwrap();
    Bed {
        hub,
        ns,
        down: Some(down),
        repo,
        operator,
        kubeconfig,
        args: extra.iter().map(ToString::to_string).collect(),
    }
}

async fn ready(client: &Client, ns: &str, name: &str) -> anyhow::Result<bool> {
    Ok(addon_ready(client, ns, name)
        .await?
        .is_some_and(|(s, _, _)| s == "True"))
}

async fn wait_ready(bed: &Bed, names: &[&str]) {
    for name in names {
        let result = eventually(LIMIT, &format!("{name} Ready"), || async {
            ready(&bed.hub, &bed.ns, name).await
        })
        .await;
        if let Err(e) = result {
            let status = addon_ready(&bed.hub, &bed.ns, name).await;
            panic!(
                "{e:#}; Ready: {status:?}; log: {}",
                bed.operator.log.display()
            );
        }
    }
}

/// Helm revisions of `release` in `ns`, from its storage Secrets: `(version, status)`.
async fn revisions(down: &Client, ns: &str, release: &str) -> Vec<(i64, String)> {
    let secrets: Api<Secret> = Api::namespaced(down.clone(), ns);
    let mut out: Vec<(i64, String)> = secrets
        .list_metadata(&ListParams::default().labels(&format!("owner=helm,name={release}")))
        .await
        .unwrap()
        .items
        .iter()
        .map(|s| {
            (
                s.labels()["version"].parse().unwrap(),
                s.labels()["status"].clone(),
            )
        })
        .collect();
    out.sort();
    out
}

/// Waits until the operator has run `n` more reconciles (resyncs, with a short interval).
async fn wait_reconciles(operator: &Operator, n: u64) {
    let start = reconciles(&operator.metrics().await.unwrap());
    eventually(LIMIT, &format!("{n} more reconciles"), || async {
        Ok(reconciles(&operator.metrics().await?) >= start + n)
    })
    .await
    .unwrap();
}

/// Writes to the downstream API server whose URI matches `filter`, by time received.
fn writes(
    down: &kontinuum_e2e::testbed::ControlPlane,
    filter: impl Fn(&str) -> bool,
) -> Vec<Timestamp> {
    let mut out: Vec<Timestamp> = audit_writes(&down.audit_log(), "admin")
        .unwrap()
        .into_iter()
        .filter(|e| filter(&e.request_u_r_i))
        .map(|e| e.request_received_timestamp.parse().unwrap())
        .collect();
    out.sort();
    out
}

fn workload_write(uri: &str, ns: &str) -> bool {
    ["daemonsets", "deployments", "secrets"].iter().any(|r| {
        uri.starts_with(&format!("/apis/apps/v1/namespaces/{ns}/{r}"))
            || uri.starts_with(&format!("/api/v1/namespaces/{ns}/{r}"))
    })
}

/// Runs the real helm (`install` or `upgrade` of release `stuck` in `apps`) with `--wait`
/// and a value that leaves its operator pod unschedulable, and kills it once the release
/// record says `status`: a release left behind by a helm killed mid-way.
async fn helm_killed_while(bed: &Bed, verb: &str, status: &str) {
    let tools = Tools::locate().unwrap();
    let home = kontinuum_e2e::testbed::unique_dir("helm-killed");
    let kubeconfig = bed.down().kubeconfig_path().to_string_lossy().into_owned();
    let mut helm = tokio::process::Command::new(tools.path("helm"))
        .args([
            verb,
            "stuck",
            "cilium",
            "--repo",
            &bed.repo.url,
            "--namespace",
            "apps",
        ])
        .args([
            "--create-namespace",
            "--wait",
            "--timeout",
            "5m",
            "--kubeconfig",
            &kubeconfig,
        ])
        .args(["--set-string", "operator.nodeSelector.nowhere=true"])
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"))
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let down = bed.down().client();
    eventually(LIMIT, &format!("stuck {status}"), || async {
        Ok(revisions(&down, "apps", "stuck")
            .await
            .last()
            .is_some_and(|(_, s)| s == status))
    })
    .await
    .unwrap();
    assert!(
        helm.try_wait().unwrap().is_none(),
        "helm must still be waiting when it is killed"
    );
    helm.kill().await.unwrap();
    assert_eq!(
        revisions(&down, "apps", "stuck").await.last().unwrap().1,
        status
    );
}

/// Acceptance 2, 3 and 4: the built-ins install in waves (and `dependsOn` holds), a pod
/// going NotReady turns the Addon NotHealthy naming it, a value change makes exactly one
/// revision, and resyncs of an unchanged Addon make none.
#[tokio::test]
async fn builtins_install_in_waves_follow_pod_health_and_never_churn() {
    let mut bed = bed(
        "addons-waves",
        &[
            "--resync-interval",
            "2s",
            "--retry-interval",
            "1s",
            "--uninstall-deadline",
            "15s",
        ],
    )
    .await;
    let (hub_client, ns_name) = (bed.hub.clone(), bed.ns.clone());
    let (hub, ns) = (&hub_client, ns_name.as_str());
    let down = bed.down().client();

    // Seeded at once, as if the bootstrapper had seeded all three; the waves order them.
    let cert = seed_builtin(hub, ns, CLUSTER, "cert-manager")
        .await
        .unwrap();
    let cilium = seed_builtin(hub, ns, CLUSTER, "cilium").await.unwrap();
    let crds = seed_builtin(hub, ns, CLUSTER, "gateway-api-crds")
        .await
        .unwrap();
    // A user's Addon at the same priority as cert-manager that depends on it.
    let extra: Addon = serde_json::from_value(serde_json::json!({
        "apiVersion": "kontinuum.sh/v1alpha2", "kind": "Addon",
        "metadata": { "name": "extra" },
        "spec": {
            "talosClusterRef": { "name": CLUSTER },
            "chart": { "repo": bed.repo.url, "name": "cilium" },
            "namespace": { "name": "extra" },
            "dependsOn": [cert.clone()],
            "values": { "k8sServiceHost": "localhost" }
        }
    }))
    .unwrap();
    Api::<Addon>::namespaced(hub.clone(), ns)
        .create(&PostParams::default(), &extra)
        .await
        .unwrap();
    wait_ready(&bed, &[&crds, &cilium, &cert, "extra"]).await;

    // The Gateway API CRDs are Established downstream (applied, not a Helm release).
    let crd_api: Api<CustomResourceDefinition> = Api::all(down.clone());
    let gateways = crd_api
        .get("gateways.gateway.networking.k8s.io")
        .await
        .unwrap();
    assert!(
        gateways
            .status
            .unwrap()
            .conditions
            .unwrap()
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True")
    );
    assert!(
        revisions(&down, "kontinuum-system", "gateway-api-crds")
            .await
            .is_empty()
    );
    crd_api.get("certificates.cert-manager.io").await.unwrap();

    // Acceptance 2: order, from the downstream API server's audit log (microseconds).
    let crd_writes = writes(bed.down(), |u| {
        u.contains("customresourcedefinitions/") && u.contains("gateway.networking.k8s.io")
    });
    let cilium_writes = writes(bed.down(), |u| workload_write(u, "kube-system"));
    let cert_writes = writes(bed.down(), |u| workload_write(u, "kontinuum-system"));
    let extra_writes = writes(bed.down(), |u| workload_write(u, "extra"));
    let last_crd = *crd_writes.last().unwrap();
    assert!(
        cilium_writes[0] > last_crd,
        "cilium started {} before the CRDs completed {last_crd}",
        cilium_writes[0]
    );
    assert!(
        cert_writes[0] > last_crd,
        "cert-manager started {} before the CRDs completed {last_crd}",
        cert_writes[0]
    );
    // The CRDs completed = their Addon turned Ready; cilium's first write came after that.
    let crds_ready = Api::<Addon>::namespaced(hub.clone(), ns)
        .get(&crds)
        .await
        .unwrap();
    let crds_ready_at = conditions::get(&crds_ready.status.unwrap().conditions, "Ready")
        .unwrap()
        .last_transition_time
        .0;
    assert!(
        cilium_writes[0] >= crds_ready_at,
        "cilium started before gateway-api-crds was Ready"
    );
    // dependsOn: extra's first write came after cert-manager was Ready.
    let cert_ready = Api::<Addon>::namespaced(hub.clone(), ns)
        .get(&cert)
        .await
        .unwrap();
    let cert_ready_at = conditions::get(&cert_ready.status.unwrap().conditions, "Ready")
        .unwrap()
        .last_transition_time
        .0;
    assert!(
        extra_writes[0] >= cert_ready_at,
        "extra started {} before cert-manager was Ready {cert_ready_at}",
        extra_writes[0]
    );

    // Talos values reached the chart: KubePrism port, operator replicas from the cluster.
    let agent =
        Api::<k8s_openapi::api::apps::v1::DaemonSet>::namespaced(down.clone(), "kube-system")
            .get("cilium")
            .await
            .unwrap();
    let env = agent.spec.template.spec.unwrap().containers[0]
        .env
        .clone()
        .unwrap();
    let port = env
        .iter()
        .find(|e| e.name == "KUBERNETES_SERVICE_PORT")
        .unwrap();
    assert_eq!(port.value.as_deref(), Some("7445"));
    let operator_deploy = Api::<Deployment>::namespaced(down.clone(), "kube-system");
    assert_eq!(
        operator_deploy
            .get("cilium-operator")
            .await
            .unwrap()
            .spec
            .replicas,
        Some(1)
    );

    // Acceptance 3: a cilium pod goes NotReady -> the Addon says so, naming pod and container.
    let agent_pod = kontinuum_e2e::addons::agent_pod(&down).await.unwrap();
    kontinuum_e2e::addons::set_agent_pod_ready(&down, &agent_pod, false)
        .await
        .unwrap();
    eventually(LIMIT, "cilium NotHealthy naming the pod", || async {
        Ok(addon_ready(hub, ns, &cilium)
            .await?
            .is_some_and(|(s, r, m)| {
                s == "False"
                    && r == "NotHealthy"
                    && m.contains(&agent_pod)
                    && m.contains("cilium-agent")
            }))
    })
    .await
    .unwrap();
    let (_, _, message) = addon_ready(hub, ns, &cilium).await.unwrap().unwrap();
    assert!(message.contains("is Running but not Ready"), "{message}");
    assert!(
        ready(hub, ns, &cert).await.unwrap(),
        "other Addons are unaffected"
    );
    kontinuum_e2e::addons::set_agent_pod_ready(&down, &agent_pod, true)
        .await
        .unwrap();
    wait_ready(&bed, &[&cilium]).await;

    // Acceptance 4: resyncs of unchanged Addons make no revision.
    let before = (
        revisions(&down, "kube-system", "cilium").await,
        revisions(&down, "kontinuum-system", "cert-manager").await,
        revisions(&down, "extra", "extra").await,
    );
    assert_eq!(before.0.len(), 1, "{before:?}");
    // Ten resyncs of each of the four Addons at a 2 s interval (stands for 10 x 5 min).
    wait_reconciles(&bed.operator, 40).await;
    let after = (
        revisions(&down, "kube-system", "cilium").await,
        revisions(&down, "kontinuum-system", "cert-manager").await,
        revisions(&down, "extra", "extra").await,
    );
    assert_eq!(before, after, "resyncs made new revisions");

    // A value change: exactly one new revision.
    let patch = serde_json::json!({ "spec": { "values": { "operator": { "replicas": 3 } } } });
    Api::<Addon>::namespaced(hub.clone(), ns)
        .patch(&cilium, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    eventually(LIMIT, "cilium-operator scaled to 3", || async {
        Ok(operator_deploy.get("cilium-operator").await?.spec.replicas == Some(3))
    })
    .await
    .unwrap();
    wait_ready(&bed, &[&cilium]).await;
    wait_reconciles(&bed.operator, 20).await;
    let changed = revisions(&down, "kube-system", "cilium").await;
    assert_eq!(
        changed.iter().map(|(v, _)| *v).collect::<Vec<_>>(),
        [1, 2],
        "exactly one new revision: {changed:?}"
    );
    assert_eq!(changed[1].1, "deployed");
    let addon = Api::<Addon>::namespaced(hub.clone(), ns)
        .get(&cilium)
        .await
        .unwrap();
    assert_eq!(addon.status.unwrap().revision, Some(2));

    // KubectlApply prunes what is no longer rendered: the Gateway API CRDs switched off.
    let off = serde_json::json!({ "spec": { "values": { "crds": { "gatewayAPI": { "enabled": false } } } } });
    Api::<Addon>::namespaced(hub.clone(), ns)
        .patch(&crds, &PatchParams::default(), &Patch::Merge(&off))
        .await
        .unwrap();
    eventually(LIMIT, "the Gateway API CRDs pruned", || async {
        Ok(crd_api
            .get_opt("gateways.gateway.networking.k8s.io")
            .await?
            .is_none()
            && crd_api
                .get_opt("httproutes.gateway.networking.k8s.io")
                .await?
                .is_none())
    })
    .await
    .unwrap();
    wait_ready(&bed, &[&crds]).await;
    assert!(
        crd_api
            .get_opt("certificates.cert-manager.io")
            .await
            .unwrap()
            .is_some(),
        "only the pruned release's objects go"
    );

    // A dead downstream cluster cannot block a deletion forever: the uninstall fails,
    // `Deleting` says until when it is retried, then the finalizer goes.
    bed.down.take().unwrap().stop().await;
    let addons: Api<Addon> = Api::namespaced(hub.clone(), ns);
    addons
        .delete("extra", &DeleteParams::default())
        .await
        .unwrap();
    eventually(LIMIT, "extra Deleting with its deadline", || async {
        let Some(addon) = addons.get_opt("extra").await? else {
            return Ok(false);
        };
        Ok(addon.status.is_some_and(|s| {
            conditions::get(&s.conditions, "Deleting").is_some_and(|c| {
                c.status == "True"
                    && c.reason == "UninstallFailed"
                    && c.message.contains("gives up at")
            }) && conditions::get(&s.conditions, "Ready").is_some_and(|c| c.reason == "Deleting")
        }))
    })
    .await
    .unwrap();
    eventually(LIMIT, "extra gone after the deadline", || async {
        Ok(addons.get_opt("extra").await?.is_none())
    })
    .await
    .unwrap();
}

/// Downstream health is event-driven (issue 14, deliverable 2): with the default resync
/// (5 min) and nothing else due, a cilium pod going NotReady in the zone cluster, and back,
/// flips the `Ready` Addon through the operator's pod watch of that cluster; a dead zone
/// cluster is a condition (`ClusterUnreachable`); the watch goes with the last Addon.
#[tokio::test]
async fn a_pod_going_not_ready_flips_its_ready_addon_without_waiting_for_the_resync() {
    // No --resync-interval: the default, far longer than any wait below.
    let mut bed = bed("addons-podwatch", &["--retry-interval", "1s"]).await;
    let (hub_client, ns_name) = (bed.hub.clone(), bed.ns.clone());
    let (hub, ns) = (&hub_client, ns_name.as_str());
    let down = bed.down().client();
    let cilium = seed_builtin(hub, ns, CLUSTER, "cilium").await.unwrap();
    wait_ready(&bed, &[&cilium]).await;
    let watched = || async {
        let metrics = bed.operator.metrics().await?;
        Ok::<_, anyhow::Error>(tracked_objects(&metrics, "pod_watch"))
    };
    eventually(LIMIT, "the cilium Addon's pods watched", || async {
        Ok(watched().await? == Some(1))
    })
    .await
    .unwrap();
    // Well below the 5 min resync: only an event can flip the Addon in this time.
    let within = Duration::from_secs(30);
    let flip = |want: &'static str| {
        let cilium = cilium.clone();
        async move {
            let started = std::time::Instant::now();
            eventually(within, &format!("cilium Ready={want}"), || async {
                Ok(addon_ready(hub, ns, &cilium)
                    .await?
                    .is_some_and(|(s, _, _)| s == want))
            })
            .await
            .map(|()| started.elapsed())
        }
    };
    let agent_pod = kontinuum_e2e::addons::agent_pod(&down).await.unwrap();
    let before = reconciles(&bed.operator.metrics().await.unwrap());
    kontinuum_e2e::addons::set_agent_pod_ready(&down, &agent_pod, false)
        .await
        .unwrap();
    let to_not_ready = flip("False").await.unwrap();
    let (_, reason, message) = addon_ready(hub, ns, &cilium).await.unwrap().unwrap();
    assert_eq!(reason, "NotHealthy", "{message}");
    assert!(message.contains(&agent_pod), "{message}");
    kontinuum_e2e::addons::set_agent_pod_ready(&down, &agent_pod, true)
        .await
        .unwrap();
    let to_ready = flip("True").await.unwrap();
    let after = reconciles(&bed.operator.metrics().await.unwrap());
    eprintln!(
        "pod watch: NotReady seen on the Addon after {to_not_ready:?}, Ready again after \
         {to_ready:?}, {} reconciles for the two flips",
        after - before
    );

    // The zone cluster dies: the Addon says so instead of staying Ready.
    bed.down.take().unwrap().stop().await;
    eventually(LIMIT, "cilium ClusterUnreachable", || async {
        Ok(addon_ready(hub, ns, &cilium)
            .await?
            .is_some_and(|(s, r, _)| s == "Unknown" && r == "ClusterUnreachable"))
    })
    .await
    .unwrap();
    let addon = Api::<Addon>::namespaced(hub.clone(), ns)
        .get(&cilium)
        .await
        .unwrap();
    let status = addon.status.unwrap();
    assert!(
        conditions::is_true(&status.conditions, "Installed"),
        "what is installed stays recorded: {:?}",
        status.conditions
    );

    // The cluster and its Addon go: so does the watch.
    Api::<TalosCluster>::namespaced(hub.clone(), ns)
        .delete(CLUSTER, &DeleteParams::default())
        .await
        .unwrap();
    Api::<Addon>::namespaced(hub.clone(), ns)
        .delete(&cilium, &DeleteParams::default())
        .await
        .unwrap();
    eventually(LIMIT, "no pod watch left", || async {
        Ok(watched().await? == Some(0))
    })
    .await
    .unwrap();
}

/// Acceptance 5, 6 and 7: a release left pending-install by a killed helm is repaired;
/// deleting an Addon or disabling it uninstalls; bad input is reported on the Addon
/// without disturbing the others.
#[tokio::test]
async fn repairs_stuck_releases_uninstalls_and_reports_bad_input() {
    let mut bed = bed(
        "addons-repair",
        &["--resync-interval", "3s", "--retry-interval", "1s"],
    )
    .await;
    let (hub_client, ns_name) = (bed.hub.clone(), bed.ns.clone());
    let (hub, ns) = (&hub_client, ns_name.as_str());
    let down = bed.down().client();
    let addons: Api<Addon> = Api::namespaced(hub.clone(), ns);

    // Acceptance 5: helm killed mid-install leaves `stuck` pending-install.
    helm_killed_while(&bed, "install", "pending-install").await;
    assert_eq!(
        revisions(&down, "apps", "stuck").await,
        [(1, "pending-install".to_string())]
    );

    let user_addon = |name: &str, chart: serde_json::Value, values: serde_json::Value| -> Addon {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "kontinuum.sh/v1alpha2", "kind": "Addon",
            "metadata": { "name": name },
            "spec": {
                "talosClusterRef": { "name": CLUSTER },
                "chart": chart,
                "namespace": { "name": "apps" },
                "values": values
            }
        }))
        .unwrap()
    };
    let good_chart = serde_json::json!({ "repo": bed.repo.url, "name": "cilium" });
    addons
        .create(
            &PostParams::default(),
            &user_addon("stuck", good_chart.clone(), serde_json::json!({})),
        )
        .await
        .unwrap();
    wait_ready(&bed, &["stuck"]).await;
    let repaired = revisions(&down, "apps", "stuck").await;
    assert_eq!(repaired.last().unwrap().1, "deployed", "{repaired:?}");

    // The same for an upgrade killed mid-way while the operator was down (pending-upgrade):
    // repaired by the next operator.
    bed.operator.kill().await.unwrap();
    helm_killed_while(&bed, "upgrade", "pending-upgrade").await;
    let args: Vec<&str> = bed.args.iter().map(String::as_str).collect();
    bed.operator = start_addon_installer(Path::new(BIN), &bed.kubeconfig, ns, &bed.repo.url, &args)
        .await
        .unwrap();
    // Rolled back (a new revision), then upgraded to the desired state (another); Helm
    // leaves the interrupted revision's record as it was.
    eventually(LIMIT, "stuck's upgrade repaired", || async {
        let history = revisions(&down, "apps", "stuck").await;
        Ok(history.len() >= 3 && history.last().is_some_and(|(_, s)| s == "deployed"))
    })
    .await
    .unwrap();
    wait_ready(&bed, &["stuck"]).await;

    // Acceptance 7: bad input, each reported on its own Addon; `stuck` stays Ready. A helm
    // failure names the release, never helm's output (it may echo values).
    let helm_failed = "the operator's log has helm's output";
    let refused = format!(
        "http://127.0.0.1:{}",
        kontinuum_e2e::testbed::free_port(std::net::IpAddr::from([127, 0, 0, 1])).unwrap()
    );
    let bad = [
        (
            "unknown-chart",
            serde_json::json!({ "repo": bed.repo.url, "name": "nope" }),
            serde_json::json!({}),
            helm_failed,
        ),
        (
            "unreachable-repo",
            serde_json::json!({ "repo": refused, "name": "cilium" }),
            serde_json::json!({}),
            helm_failed,
        ),
        (
            "bad-cel",
            good_chart.clone(),
            serde_json::json!({ "x": { "$cel": "ctx.talos.kubePrism.port +" } }),
            "does not compile",
        ),
        (
            "rejected-values",
            good_chart.clone(),
            serde_json::json!({ "operator": { "replicas": "many" } }),
            helm_failed,
        ),
    ];
    for (name, chart, values, _) in &bad {
        let mut addon = user_addon(name, chart.clone(), values.clone());
        addon.spec.release_name = Some((*name).to_string());
        addons.create(&PostParams::default(), &addon).await.unwrap();
    }
    for (name, _, _, expect) in &bad {
        let result = eventually(LIMIT, &format!("{name} InstallFailed"), || async {
            Ok(addon_ready(hub, ns, name).await?.is_some_and(|(s, r, m)| {
                s == "False"
                    && r == "InstallFailed"
                    && m.contains(expect)
                    && (*expect != helm_failed || m.contains(&format!("release {name}")))
            }))
        })
        .await;
        if let Err(e) = result {
            panic!("{e:#}: {:?}", addon_ready(hub, ns, name).await);
        }
    }
    assert!(
        ready(hub, ns, "stuck").await.unwrap(),
        "a good Addon is unaffected"
    );

    // Acceptance 6: disabling uninstalls.
    addons
        .patch(
            "stuck",
            &PatchParams::default(),
            &Patch::Merge(&serde_json::json!({ "spec": { "enabled": false } })),
        )
        .await
        .unwrap();
    eventually(LIMIT, "stuck uninstalled and Disabled", || async {
        let gone = revisions(&down, "apps", "stuck").await.is_empty();
        let disabled = addon_ready(hub, ns, "stuck")
            .await?
            .is_some_and(|(s, r, _)| s == "False" && r == "Disabled");
        Ok(gone && disabled)
    })
    .await
    .unwrap();
    let deployments: Api<Deployment> = Api::namespaced(down.clone(), "apps");
    eventually(LIMIT, "stuck's Deployment gone", || async {
        Ok(deployments.get_opt("cilium-operator").await?.is_none())
    })
    .await
    .unwrap();

    // Acceptance 6: deleting uninstalls, for a Helm release and for an applied chart.
    addons
        .patch(
            "stuck",
            &PatchParams::default(),
            &Patch::Merge(&serde_json::json!({ "spec": { "enabled": true } })),
        )
        .await
        .unwrap();
    let crds = seed_builtin(hub, ns, CLUSTER, "gateway-api-crds")
        .await
        .unwrap();
    wait_ready(&bed, &["stuck", &crds]).await;
    assert!(!revisions(&down, "apps", "stuck").await.is_empty());
    let crd_api: Api<CustomResourceDefinition> = Api::all(down.clone());
    crd_api
        .get("httproutes.gateway.networking.k8s.io")
        .await
        .unwrap();
    for name in ["stuck", crds.as_str()] {
        addons.delete(name, &DeleteParams::default()).await.unwrap();
    }
    eventually(
        LIMIT,
        "both Addons gone, release and CRDs uninstalled",
        || async {
            let gone =
                addons.get_opt("stuck").await?.is_none() && addons.get_opt(&crds).await?.is_none();
            let uninstalled = revisions(&down, "apps", "stuck").await.is_empty()
                && crd_api
                    .get_opt("httproutes.gateway.networking.k8s.io")
                    .await?
                    .is_none();
            Ok(gone && uninstalled)
        },
    )
    .await
    .unwrap();

    // The TalosCluster going away: the finalizer does not try to uninstall.
    let keep = seed_builtin(hub, ns, CLUSTER, "cilium").await.unwrap();
    wait_ready(&bed, &[&keep]).await;
    Api::<TalosCluster>::namespaced(hub.clone(), ns)
        .delete(CLUSTER, &DeleteParams::default())
        .await
        .unwrap();
    // The operator has seen the cluster go (the Addon says so) before the Addon is deleted.
    eventually(LIMIT, "the Addon waiting for its cluster", || async {
        Ok(addon_ready(hub, ns, &keep)
            .await?
            .is_some_and(|(_, r, m)| r == "WaitingForKubeconfig" && m.contains("not found")))
    })
    .await
    .unwrap();
    addons
        .delete(&keep, &DeleteParams::default())
        .await
        .unwrap();
    eventually(LIMIT, "Addon gone without uninstalling", || async {
        Ok(addons.get_opt(&keep).await?.is_none())
    })
    .await
    .unwrap();
    assert!(
        !revisions(&down, "kube-system", "cilium").await.is_empty(),
        "the release stays when the cluster goes"
    );
}
