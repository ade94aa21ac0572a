//! Downstream health, event-driven: one watch task per zone cluster on the pods of the
//! namespaces its installed Addons own, started with the first of them and stopped with the
//! last. The task keeps a trimmed copy of those pods and, after every change, works out each
//! Addon's pod health the way the probe does; when that changes (a pod goes NotReady, comes
//! back, the last one goes away), or the connection is lost or comes back, it asks for a
//! reconcile of the Addon — which probes and writes the status. Nothing here writes to the
//! hub, and nothing is polled: the resync stays the only timer.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::{StreamExt as _, stream};
use k8s_openapi::api::core::v1::{Pod, PodSpec};
use kontinuum_crds::v1alpha2::Addon;
use kontinuum_operator_common::metrics::ControllerMetrics;
use kontinuum_operator_common::tracked::Forget;
use kube::ResourceExt as _;
use kube::api::Api;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{WatchStreamExt as _, watcher};
use tokio::sync::mpsc;
use tracing::{debug, info};

use crate::downstream;
use crate::health;

/// How long the API server keeps one watch request open before it is renewed: also bounds
/// how long a zone cluster that silently stopped answering (no reset, no refusal) goes
/// unnoticed, with the read timeout just above it.
const WATCH_SECONDS: u32 = 60;
const READ_TIMEOUT: Duration = Duration::from_secs(WATCH_SECONDS as u64 + 15);
/// The pause before a new client is built after the kubeconfig could not be used.
const RECONNECT: Duration = Duration::from_secs(10);

/// What one Addon wants watched: its release's pods.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// The release namespace in the zone cluster.
    pub namespace: String,
    /// The probe's label selectors (`key=value`); a pod matching any of them counts.
    pub selectors: Vec<String>,
}

/// Pod health as the watch sees it (coarse on purpose: a message change is no reason to
/// reconcile).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodHealth {
    /// Every matching pod is Succeeded, or Running and Ready.
    Healthy,
    /// A matching pod is not.
    Unhealthy,
    /// No pod matches (healthy or not depends on the workloads: the probe decides).
    NoPods,
}

/// The pod health of `target` among `pods`, as [`health::pods_verdict`] sees it.
pub fn pod_health<'a>(target: &Target, pods: impl IntoIterator<Item = &'a Pod>) -> PodHealth {
    let selectors: Vec<Vec<(&str, &str)>> = target
        .selectors
        .iter()
        .map(|s| {
            s.split(',')
                .filter_map(|term| term.split_once('='))
                .collect()
        })
        .collect();
    let matching: Vec<Pod> = pods
        .into_iter()
        .filter(|pod| {
            let labels = pod.labels();
            selectors.iter().any(|terms| {
                terms
                    .iter()
                    .all(|(k, v)| labels.get(*k).map(String::as_str) == Some(*v))
            })
        })
        .cloned()
        .collect();
    if matching.is_empty() {
        PodHealth::NoPods
    } else if health::pods_verdict(&matching, 0).is_none() {
        PodHealth::Healthy
    } else {
        PodHealth::Unhealthy
    }
}

/// Whether the watch should ask for a reconcile: `seen` is what it last worked out (`None`:
/// nothing yet since the Addon was registered), `reconciled_healthy` what the Addon's last
/// probe said. The first look triggers only when it contradicts the probe.
pub fn should_trigger(seen: Option<PodHealth>, now: PodHealth, reconciled_healthy: bool) -> bool {
    match seen {
        Some(seen) => seen != now,
        None => match now {
            PodHealth::Healthy => !reconciled_healthy,
            PodHealth::Unhealthy => reconciled_healthy,
            PodHealth::NoPods => false,
        },
    }
}

/// Only what the verdict reads: name, namespace, labels and status.
fn trim(pod: &mut Pod) {
    pod.spec = None::<PodSpec>;
    pod.metadata.managed_fields = None;
    pod.metadata.annotations = None;
    pod.metadata.owner_references = None;
    if let Some(status) = pod.status.as_mut() {
        status.pod_ips = None;
        status.host_ips = None;
        status.resource_claim_statuses = None;
    }
}

#[derive(Debug)]
struct Registration {
    target: Target,
    reconciled_healthy: bool,
    seen: Option<PodHealth>,
}

/// What a cluster's task and the reconciles share.
#[derive(Debug, Default)]
struct Shared {
    addons: HashMap<ObjectRef<Addon>, Registration>,
    /// Pods by namespace, then name (only after the namespace's first list).
    pods: HashMap<String, HashMap<String, Pod>>,
    /// Why the watch is down, if it is.
    lost: Option<String>,
}

struct ClusterWatch {
    kubeconfig: u64,
    namespaces: BTreeSet<String>,
    shared: Arc<Mutex<Shared>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ClusterWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The pod watches of every zone cluster, keyed by the hub's `namespace/TalosCluster`.
#[derive(Clone)]
pub struct PodWatches {
    clusters: Arc<Mutex<HashMap<String, ClusterWatch>>>,
    trigger: mpsc::UnboundedSender<ObjectRef<Addon>>,
    connect_timeout: Duration,
    size: Arc<std::sync::OnceLock<kontinuum_operator_common::metrics::Gauge>>,
}

impl PodWatches {
    /// No watches yet; reconciles are asked for on `trigger`.
    pub fn new(
        trigger: mpsc::UnboundedSender<ObjectRef<Addon>>,
        connect_timeout: Duration,
    ) -> Self {
        Self {
            clusters: Arc::default(),
            trigger,
            connect_timeout,
            size: Arc::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, ClusterWatch>> {
        self.clusters.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn report_size(&self, clusters: &HashMap<String, ClusterWatch>) {
        if let Some(size) = self.size.get() {
            let addons: usize = clusters
                .values()
                .map(|c| {
                    c.shared
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .addons
                        .len()
                })
                .sum();
            size.set(i64::try_from(addons).unwrap_or(i64::MAX));
        }
    }

    /// Watches the pods of `target` in the zone cluster `cluster` for `addon`, whose probe
    /// just said `healthy`. Starts the cluster's watch, or restarts it when the kubeconfig
    /// or the set of namespaces changed.
    pub fn watch(
        &self,
        cluster: &str,
        kubeconfig: &str,
        addon: ObjectRef<Addon>,
        target: Target,
        healthy: bool,
    ) {
        let digest = digest(kubeconfig);
        let mut clusters = self.lock();
        // An Addon moved to another cluster is no longer watched in the first one.
        drop_from_others(&mut clusters, cluster, &addon);
        let mut registrations = HashMap::new();
        let mut pods = HashMap::new();
        if let Some(existing) = clusters.get(cluster) {
            let mut shared = existing
                .shared
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let restart =
                existing.kubeconfig != digest || !existing.namespaces.contains(&target.namespace);
            match shared.addons.get_mut(&addon) {
                Some(r) if !restart => {
                    if r.target != target {
                        r.target = target;
                        r.seen = None;
                    }
                    r.reconciled_healthy = healthy;
                    drop(shared);
                    self.report_size(&clusters);
                    return;
                }
                None if !restart => {
                    shared.addons.insert(
                        addon,
                        Registration {
                            target,
                            reconciled_healthy: healthy,
                            seen: None,
                        },
                    );
                    drop(shared);
                    self.report_size(&clusters);
                    return;
                }
                _ => {}
            }
            registrations = std::mem::take(&mut shared.addons);
            if existing.kubeconfig == digest {
                pods = std::mem::take(&mut shared.pods);
            }
        }
        registrations.insert(
            addon,
            Registration {
                target,
                reconciled_healthy: healthy,
                seen: None,
            },
        );
        let namespaces: BTreeSet<String> = registrations
            .values()
            .map(|r| r.target.namespace.clone())
            .collect();
        pods.retain(|ns, _| namespaces.contains(ns));
        self.start(
            &mut clusters,
            cluster,
            kubeconfig,
            digest,
            registrations,
            pods,
        );
        self.report_size(&clusters);
    }

    fn start(
        &self,
        clusters: &mut HashMap<String, ClusterWatch>,
        cluster: &str,
        kubeconfig: &str,
        digest: u64,
        addons: HashMap<ObjectRef<Addon>, Registration>,
        pods: HashMap<String, HashMap<String, Pod>>,
    ) {
        let namespaces: BTreeSet<String> = addons
            .values()
            .map(|r| r.target.namespace.clone())
            .collect();
        let shared = Arc::new(Mutex::new(Shared {
            addons,
            pods,
            lost: None,
        }));
        info!(cluster, namespaces = ?namespaces, "watching the zone cluster's pods");
        let task = tokio::spawn(run(
            cluster.to_string(),
            kubeconfig.to_string(),
            namespaces.iter().cloned().collect(),
            Arc::clone(&shared),
            self.trigger.clone(),
            self.connect_timeout,
        ));
        // Replacing an entry drops (aborts) the task it had.
        clusters.insert(
            cluster.to_string(),
            ClusterWatch {
                kubeconfig: digest,
                namespaces,
                shared,
                task,
            },
        );
    }

    /// Why the watch of `cluster` is down, if it is.
    pub fn lost(&self, cluster: &str) -> Option<String> {
        self.lock().get(cluster).and_then(|c| {
            c.shared
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .lost
                .clone()
        })
    }

    /// Stops watching for `addon` (uninstalled, disabled, deleted); a cluster's watch stops
    /// with its last Addon.
    pub fn unwatch(&self, addon: &ObjectRef<Addon>) {
        let mut clusters = self.lock();
        drop_from_others(&mut clusters, "", addon);
        self.report_size(&clusters);
    }

    /// How many zone clusters are watched.
    pub fn clusters(&self) -> usize {
        self.lock().len()
    }
}

/// Removes `addon` from every cluster but `keep`, and the clusters left with no Addon.
fn drop_from_others(
    clusters: &mut HashMap<String, ClusterWatch>,
    keep: &str,
    addon: &ObjectRef<Addon>,
) {
    clusters.retain(|name, watch| {
        if name == keep {
            return true;
        }
        let mut shared = watch.shared.lock().unwrap_or_else(PoisonError::into_inner);
        shared.addons.remove(addon);
        let keep = !shared.addons.is_empty();
        if !keep {
            info!(
                cluster = name,
                "no installed Addon left: the pod watch stops"
            );
        }
        keep
    });
}

fn digest(text: &str) -> u64 {
    use std::hash::{Hash as _, Hasher as _};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    text.hash(&mut hasher);
    hasher.finish()
}

fn addon_key(addon: &ObjectRef<Addon>) -> String {
    format!(
        "{}/{}",
        addon.namespace.as_deref().unwrap_or_default(),
        addon.name
    )
}

impl Forget for PodWatches {
    fn forget(&self, key: &str) {
        let mut clusters = self.lock();
        let found: Vec<ObjectRef<Addon>> = clusters
            .values()
            .flat_map(|c| {
                c.shared
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .addons
                    .keys()
                    .filter(|a| addon_key(a) == key)
                    .cloned()
                    .collect::<Vec<_>>()
            })
            .collect();
        for addon in &found {
            drop_from_others(&mut clusters, "", addon);
        }
        self.report_size(&clusters);
    }

    fn retain_live(&self, live: &dyn Fn(&str) -> bool) -> usize {
        let mut clusters = self.lock();
        let mut removed = 0;
        clusters.retain(|_, watch| {
            let mut shared = watch.shared.lock().unwrap_or_else(PoisonError::into_inner);
            let before = shared.addons.len();
            shared.addons.retain(|a, _| live(&addon_key(a)));
            removed += before - shared.addons.len();
            !shared.addons.is_empty()
        });
        self.report_size(&clusters);
        removed
    }

    fn name(&self) -> &'static str {
        "pod_watch"
    }

    fn report(&self, metrics: &ControllerMetrics) {
        let _ = self.size.set(metrics.tracked(self.name()));
        let clusters = self.lock();
        self.report_size(&clusters);
    }
}

/// Whether a watch error means the cluster is out of reach (not a watch expiring, which
/// the watcher handles by listing again).
fn is_lost(err: &watcher::Error) -> bool {
    !matches!(err, watcher::Error::WatchError(status) if status.code == 410)
}

/// One zone cluster's watch: every namespace, merged into one stream.
async fn run(
    cluster: String,
    kubeconfig: String,
    namespaces: Vec<String>,
    shared: Arc<Mutex<Shared>>,
    trigger: mpsc::UnboundedSender<ObjectRef<Addon>>,
    connect_timeout: Duration,
) {
    let client = loop {
        match downstream::connect_for_watch(&kubeconfig, connect_timeout, READ_TIMEOUT).await {
            Ok(client) => break client,
            Err(err) => {
                set_lost(&shared, &trigger, Some(err.to_string()));
                tokio::time::sleep(RECONNECT).await;
            }
        }
    };
    let config = watcher::Config::default().timeout(WATCH_SECONDS);
    let streams = namespaces.into_iter().map(|ns| {
        let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
        watcher(api, config.clone())
            .default_backoff()
            .modify(trim)
            .map(move |event| (ns.clone(), event))
            .boxed()
    });
    let mut events = stream::select_all(streams);
    // The pods of each namespace's list in progress.
    let mut listing: HashMap<String, HashMap<String, Pod>> = HashMap::new();
    while let Some((ns, event)) = events.next().await {
        let changed = match event {
            Err(err) => {
                if is_lost(&err) {
                    debug!(cluster, error = %err, "the zone cluster's pod watch failed");
                    set_lost(
                        &shared,
                        &trigger,
                        Some(format!("watching pods in {ns}: {err}")),
                    );
                }
                false
            }
            Ok(watcher::Event::Init) => {
                listing.insert(ns.clone(), HashMap::new());
                false
            }
            Ok(watcher::Event::InitApply(pod)) => {
                listing
                    .entry(ns.clone())
                    .or_default()
                    .insert(pod.name_any(), pod);
                false
            }
            Ok(watcher::Event::InitDone) => {
                let pods = listing.remove(&ns).unwrap_or_default();
                lock(&shared).pods.insert(ns.clone(), pods);
                true
            }
            Ok(watcher::Event::Apply(pod)) => {
                lock(&shared)
                    .pods
                    .entry(ns.clone())
                    .or_default()
                    .insert(pod.name_any(), pod);
                true
            }
            Ok(watcher::Event::Delete(pod)) => {
                if let Some(pods) = lock(&shared).pods.get_mut(&ns) {
                    pods.remove(&pod.name_any());
                }
                true
            }
        };
        if changed {
            set_lost(&shared, &trigger, None);
            for addon in evaluate(&mut lock(&shared), &ns) {
                debug!(cluster, addon = %addon.name, "pod health changed: reconciling");
                let _ = trigger.send(addon);
            }
        }
    }
}

fn lock(shared: &Mutex<Shared>) -> std::sync::MutexGuard<'_, Shared> {
    shared.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Records the watch as down (`Some(why)`) or up; on a change, every Addon of the cluster is
/// reconciled (its probe says what the cluster's state means for it).
fn set_lost(
    shared: &Mutex<Shared>,
    trigger: &mpsc::UnboundedSender<ObjectRef<Addon>>,
    lost: Option<String>,
) {
    let mut shared = lock(shared);
    if shared.lost.is_some() == lost.is_some() {
        if lost.is_some() {
            shared.lost = lost;
        }
        return;
    }
    shared.lost = lost;
    for addon in shared.addons.keys() {
        let _ = trigger.send(addon.clone());
    }
}

/// The Addons of `namespace` whose pod health changed; records what was seen.
fn evaluate(shared: &mut Shared, namespace: &str) -> Vec<ObjectRef<Addon>> {
    let Shared { addons, pods, .. } = shared;
    let Some(pods) = pods.get(namespace) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for (addon, registration) in addons.iter_mut() {
        if registration.target.namespace != namespace {
            continue;
        }
        let now = pod_health(&registration.target, pods.values());
        if should_trigger(registration.seen, now, registration.reconciled_healthy) {
            out.push(addon.clone());
        }
        registration.seen = Some(now);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodCondition, PodStatus};

    fn pod(name: &str, labels: &[(&str, &str)], phase: &str, ready: bool) -> Pod {
        let mut pod = Pod::default();
        pod.metadata.name = Some(name.into());
        pod.metadata.namespace = Some("kube-system".into());
        pod.metadata.labels = Some(
            labels
                .iter()
                .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
                .collect(),
        );
        pod.status = Some(PodStatus {
            phase: Some(phase.into()),
            conditions: Some(vec![PodCondition {
                type_: "Ready".into(),
                status: if ready { "True" } else { "False" }.into(),
                ..PodCondition::default()
            }]),
            ..PodStatus::default()
        });
        pod
    }

    fn cilium() -> Target {
        Target {
            namespace: "kube-system".into(),
            selectors: health::selectors("cilium", "cilium", Some("1.20.1")),
        }
    }

    #[test]
    fn pod_health_follows_the_probe_selectors() {
        let target = cilium();
        let agent = pod(
            "cilium-x7",
            &[("app.kubernetes.io/instance", "cilium")],
            "Running",
            true,
        );
        let by_chart = pod(
            "cilium-op",
            &[("helm.sh/chart", "cilium-1.20.1")],
            "Running",
            true,
        );
        let other = pod("coredns", &[("k8s-app", "kube-dns")], "Running", false);
        assert_eq!(
            pod_health(&target, [&agent, &by_chart, &other]),
            PodHealth::Healthy
        );
        let sick = pod(
            "cilium-x7",
            &[("app.kubernetes.io/instance", "cilium")],
            "Running",
            false,
        );
        assert_eq!(
            pod_health(&target, [&sick, &by_chart]),
            PodHealth::Unhealthy
        );
        let pending = pod(
            "cilium-x8",
            &[("app.kubernetes.io/instance", "cilium")],
            "Pending",
            false,
        );
        assert_eq!(pod_health(&target, [&pending]), PodHealth::Unhealthy);
        let done = pod(
            "job",
            &[("app.kubernetes.io/instance", "cilium")],
            "Succeeded",
            false,
        );
        assert_eq!(pod_health(&target, [&done]), PodHealth::Healthy);
        assert_eq!(pod_health(&target, [&other]), PodHealth::NoPods);
        assert_eq!(pod_health(&target, std::iter::empty()), PodHealth::NoPods);
    }

    #[test]
    fn a_reconcile_is_asked_for_on_changes_and_contradictions_only() {
        use PodHealth::{Healthy, NoPods, Unhealthy};
        let table = [
            // (seen, now, reconciled healthy, trigger)
            (None, Healthy, true, false),
            (None, Unhealthy, true, true),
            (None, Healthy, false, true),
            (None, Unhealthy, false, false),
            (None, NoPods, true, false),
            (None, NoPods, false, false),
            (Some(Healthy), Healthy, true, false),
            (Some(Healthy), Unhealthy, true, true),
            (Some(Unhealthy), Healthy, false, true),
            (Some(Healthy), NoPods, true, true),
            (Some(NoPods), NoPods, true, false),
            // A probe that disagrees with an unchanged watch does not loop.
            (Some(NoPods), NoPods, false, false),
        ];
        for (seen, now, reconciled, want) in table {
            assert_eq!(
                should_trigger(seen, now, reconciled),
                want,
                "{seen:?} -> {now:?} (probe healthy: {reconciled})"
            );
        }
    }

    #[test]
    fn evaluation_records_and_reports_only_changes() {
        let addon = ObjectRef::<Addon>::new("cilium").within("eu");
        let mut shared = Shared::default();
        shared.addons.insert(
            addon.clone(),
            Registration {
                target: cilium(),
                reconciled_healthy: true,
                seen: None,
            },
        );
        let ready = pod(
            "cilium-x7",
            &[("app.kubernetes.io/instance", "cilium")],
            "Running",
            true,
        );
        shared.pods.insert(
            "kube-system".into(),
            HashMap::from([("cilium-x7".into(), ready)]),
        );
        assert!(
            evaluate(&mut shared, "kube-system").is_empty(),
            "agrees with the probe"
        );
        assert!(
            evaluate(&mut shared, "other").is_empty(),
            "another namespace"
        );
        let sick = pod(
            "cilium-x7",
            &[("app.kubernetes.io/instance", "cilium")],
            "Running",
            false,
        );
        shared.pods.insert(
            "kube-system".into(),
            HashMap::from([("cilium-x7".into(), sick)]),
        );
        assert_eq!(
            evaluate(&mut shared, "kube-system"),
            std::slice::from_ref(&addon)
        );
        assert!(
            evaluate(&mut shared, "kube-system").is_empty(),
            "reported once"
        );
    }

    #[test]
    fn trimming_keeps_what_the_verdict_reads() {
        let mut sick = pod(
            "cilium-x7",
            &[("app.kubernetes.io/instance", "cilium")],
            "Running",
            false,
        );
        sick.spec = Some(PodSpec::default());
        sick.metadata.annotations =
            Some(std::collections::BTreeMap::from([("a".into(), "b".into())]));
        trim(&mut sick);
        assert!(sick.spec.is_none() && sick.metadata.annotations.is_none());
        assert_eq!(pod_health(&cilium(), [&sick]), PodHealth::Unhealthy);
    }

    #[tokio::test]
    async fn the_last_addon_of_a_cluster_stops_its_watch() {
        let (tx, _rx) = mpsc::unbounded_channel();
        let watches = PodWatches::new(tx, Duration::from_secs(1));
        let a = ObjectRef::<Addon>::new("cilium").within("eu");
        let b = ObjectRef::<Addon>::new("cert-manager").within("eu");
        // Not a usable kubeconfig: the task keeps retrying, which is all this test needs.
        watches.watch("eu/one", "not yaml", a.clone(), cilium(), true);
        watches.watch("eu/one", "not yaml", b.clone(), cilium(), true);
        assert_eq!(watches.clusters(), 1);
        watches.unwatch(&a);
        assert_eq!(watches.clusters(), 1);
        watches.forget("eu/cert-manager");
        assert_eq!(watches.clusters(), 0);
        // Moving an Addon to another cluster leaves the first.
        watches.watch("eu/one", "not yaml", a.clone(), cilium(), true);
        watches.watch("eu/two", "not yaml", a.clone(), cilium(), true);
        assert_eq!(watches.clusters(), 1);
        assert_eq!(watches.retain_live(&|_| false), 1);
        assert_eq!(watches.clusters(), 0);
    }
}
