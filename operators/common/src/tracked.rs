//! Per-object state that goes with its object: maps keyed by `namespace/name`
//! ([`object_key`](crate::backoff::object_key)) that lose an entry when its object is deleted
//! (a watch `Delete`) or is found gone after a re-list (which reports no deletions), so that a
//! long-running operator holds nothing for objects that no longer exist. Their sizes are
//! exported as `kontinuum_<controller>_tracked_objects{map}`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use futures::{Stream, StreamExt as _};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;

use crate::metrics::ControllerMetrics;

/// A map of per-object state, shared by its clones.
#[derive(Debug)]
pub struct ObjectMap<V> {
    inner: Arc<Inner<V>>,
}

#[derive(Debug)]
struct Inner<V> {
    name: &'static str,
    entries: Mutex<HashMap<String, V>>,
    size: OnceLock<prometheus_client::metrics::gauge::Gauge>,
}

impl<V> Clone for ObjectMap<V> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<V> ObjectMap<V> {
    /// An empty map; `name` labels its size metric (e.g. `backoff`).
    pub fn new(name: &'static str) -> Self {
        Self {
            inner: Arc::new(Inner {
                name,
                entries: Mutex::new(HashMap::new()),
                size: OnceLock::new(),
            }),
        }
    }

    /// Runs `f` on the entries, then updates the size metric.
    pub fn update<R>(&self, f: impl FnOnce(&mut HashMap<String, V>) -> R) -> R {
        let mut entries = self
            .inner
            .entries
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let out = f(&mut entries);
        if let Some(size) = self.inner.size.get() {
            size.set(i64::try_from(entries.len()).unwrap_or(i64::MAX));
        }
        out
    }

    /// The number of entries.
    pub fn len(&self) -> usize {
        self.update(|m| m.len())
    }

    /// Whether the map is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The name of the map, as its metric label says it.
    pub fn name(&self) -> &'static str {
        self.inner.name
    }
}

/// Remembers, per object, the parts of it that should trigger a reconcile (its generation,
/// deletion, finalizers, ...), so that a change of anything else (its own status writes)
/// does not. Shared by clones.
#[derive(Debug)]
pub struct ChangeFilter<T> {
    seen: ObjectMap<T>,
}

impl<T> Clone for ChangeFilter<T> {
    fn clone(&self) -> Self {
        Self {
            seen: self.seen.clone(),
        }
    }
}

impl<T: PartialEq> ChangeFilter<T> {
    /// An empty filter; `name` labels its size metric.
    pub fn new(name: &'static str) -> Self {
        Self {
            seen: ObjectMap::new(name),
        }
    }

    /// Whether `now` differs from what was last seen of the object `key` (true for one not
    /// seen before); records `now`.
    pub fn changed(&self, key: String, now: T) -> bool {
        self.seen.update(|seen| {
            let same = seen.get(&key) == Some(&now);
            seen.insert(key, now);
            !same
        })
    }

    /// The map behind the filter (to be forgotten with its objects).
    pub fn map(&self) -> &ObjectMap<T> {
        &self.seen
    }
}

/// What an operator keeps per object, to be dropped with the object.
pub trait Forget: Send + Sync {
    /// Drops what is kept for the object `key` (`namespace/name`).
    fn forget(&self, key: &str);
    /// Keeps only what is kept for objects `live` says exist; returns how many entries went.
    fn retain_live(&self, live: &dyn Fn(&str) -> bool) -> usize;
    /// The name of the map, as its metric label says it.
    fn name(&self) -> &'static str;
    /// Exports the size as `tracked_objects{map}` of `metrics`.
    fn report(&self, metrics: &ControllerMetrics);
}

impl<V: Send> Forget for ObjectMap<V> {
    fn forget(&self, key: &str) {
        self.update(|m| m.remove(key));
    }

    fn retain_live(&self, live: &dyn Fn(&str) -> bool) -> usize {
        self.update(|m| {
            let before = m.len();
            m.retain(|key, _| live(key));
            before - m.len()
        })
    }

    fn name(&self) -> &'static str {
        self.inner.name
    }

    fn report(&self, metrics: &ControllerMetrics) {
        let _ = self.inner.size.set(metrics.tracked(self.inner.name));
        // Set the gauge to the size now.
        let _ = self.len();
    }
}

/// How often the maps are swept against the store: a reconcile that was running when its
/// object was deleted may record state (a failure's backoff) after the deletion was seen.
pub const SWEEP_INTERVAL: std::time::Duration = std::time::Duration::from_secs(30);

/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Passes a watch stream (already reflected into `store`) through, dropping from `maps` the
/// state of each object deleted, after each (re)list the state of every object `store` no
/// longer holds, and the same every [`SWEEP_INTERVAL`] (for state recorded after its
/// object's deletion). Reports the maps' sizes to `metrics`. Call it inside a Tokio runtime.
pub fn forget_gone<K, S>(
    stream: S,
    store: Store<K>,
    maps: Vec<Arc<dyn Forget>>,
    metrics: &ControllerMetrics,
) -> impl Stream<Item = S::Item> + Send + use<K, S>
where
    K: kube::Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
    S: Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send,
{
    forget_gone_every(stream, store, maps, metrics, SWEEP_INTERVAL)
}

/// [`forget_gone`], sweeping every `sweep`.
pub fn forget_gone_every<K, S>(
    stream: S,
    store: Store<K>,
    maps: Vec<Arc<dyn Forget>>,
    metrics: &ControllerMetrics,
    sweep: std::time::Duration,
) -> impl Stream<Item = S::Item> + Send + use<K, S>
where
    K: kube::Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
    S: Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send,
{
    for map in &maps {
        map.report(metrics);
    }
    // Before the first list the store is empty, not authoritative. (Not
    // `Store::wait_until_ready`: in kube-runtime 5.0 a second task waiting on a store the
    // Controller also waits on can lose its wake-up, see `admin::track_sync`.)
    let listed = Arc::new(AtomicBool::new(false));
    let sweeper = {
        let maps = maps.clone();
        let store = store.clone();
        let listed = Arc::clone(&listed);
        AbortOnDrop(tokio::spawn(async move {
            let mut tick = tokio::time::interval(sweep);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                if !listed.load(Ordering::Acquire) {
                    continue;
                }
                let live = |key: &str| store.get(&object_ref(key)).is_some();
                for map in &maps {
                    let removed = map.retain_live(&live);
                    if removed > 0 {
                        tracing::debug!(
                            map = map.name(),
                            removed,
                            "dropped the state of deleted objects"
                        );
                    }
                }
            }
        }))
    };
    stream.inspect(move |event| match event {
        Ok(watcher::Event::Delete(object)) => {
            let key = crate::backoff::object_key(object);
            for map in &maps {
                map.forget(&key);
            }
        }
        Ok(watcher::Event::InitDone) => {
            let _alive = &sweeper;
            listed.store(true, Ordering::Release);
            let live = |key: &str| store.get(&object_ref(key)).is_some();
            for map in &maps {
                let _ = map.retain_live(&live);
            }
        }
        _ => {}
    })
}

/// The reference of `namespace/name` (an empty namespace: a cluster-scoped object).
fn object_ref<K: kube::Resource<DynamicType = ()>>(key: &str) -> ObjectRef<K> {
    match key.split_once('/') {
        Some(("", name)) => ObjectRef::new(name),
        Some((namespace, name)) => ObjectRef::new(name).within(namespace),
        None => ObjectRef::new(key),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::runtime::WatchStreamExt as _;
    use kube::runtime::reflector;

    fn config_map(namespace: &str, name: &str) -> ConfigMap {
        let mut object = ConfigMap::default();
        object.metadata.name = Some(name.into());
        object.metadata.namespace = Some(namespace.into());
        object
    }

    #[tokio::test]
    async fn deleted_and_relisted_away_objects_are_forgotten() {
        let mut registry = prometheus_client::registry::Registry::default();
        let metrics = ControllerMetrics::register(&mut registry, "test");
        let map: ObjectMap<u32> = ObjectMap::new("backoff");
        for key in ["a/one", "a/two", "b/three"] {
            map.update(|m| m.insert(key.into(), 1));
        }
        let (store, writer) = reflector::store::<ConfigMap>();
        let events = vec![
            // A first list holding all three.
            Ok(watcher::Event::Init),
            Ok(watcher::Event::InitApply(config_map("a", "one"))),
            Ok(watcher::Event::InitApply(config_map("a", "two"))),
            Ok(watcher::Event::InitApply(config_map("b", "three"))),
            Ok(watcher::Event::InitDone),
            // One deleted while watched.
            Ok(watcher::Event::Delete(config_map("a", "one"))),
            // A re-list (after a lost watch) no longer holding b/three.
            Ok(watcher::Event::Init),
            Ok(watcher::Event::InitApply(config_map("a", "two"))),
            Ok(watcher::Event::InitDone),
        ];
        let mut sizes = Vec::new();
        let stream = forget_gone(
            futures::stream::iter(events).reflect(writer),
            store,
            vec![Arc::new(map.clone())],
            &metrics,
        );
        let mut stream = std::pin::pin!(stream);
        while stream.next().await.is_some() {
            sizes.push(map.len());
        }
        assert_eq!(sizes, [3, 3, 3, 3, 3, 2, 2, 2, 1]);
        assert!(map.update(|m| m.contains_key("a/two")));
        let text = crate::metrics::encode(&registry).unwrap();
        assert!(
            text.contains("kontinuum_test_tracked_objects{map=\"backoff\"} 1"),
            "{text}"
        );
    }

    #[tokio::test]
    async fn state_recorded_after_a_deletion_is_swept() {
        let mut registry = prometheus_client::registry::Registry::default();
        let metrics = ControllerMetrics::register(&mut registry, "test");
        let map: ObjectMap<u32> = ObjectMap::new("backoff");
        let (store, writer) = reflector::store::<ConfigMap>();
        let events = futures::stream::iter(vec![
            Ok(watcher::Event::Init),
            Ok(watcher::Event::InitApply(config_map("a", "live"))),
            Ok(watcher::Event::InitDone),
        ])
        .chain(futures::stream::pending());
        let stream = forget_gone_every(
            events.reflect(writer),
            store,
            vec![Arc::new(map.clone())],
            &metrics,
            std::time::Duration::from_millis(20),
        );
        let mut stream = std::pin::pin!(stream);
        for _ in 0..3 {
            stream.next().await;
        }
        // A reconcile that failed after its object's deletion was seen records a backoff.
        map.update(|m| {
            m.insert("a/gone".into(), 1);
            m.insert("a/live".into(), 1)
        });
        let swept = tokio::time::timeout(std::time::Duration::from_secs(5), async {
            while map.len() != 1 {
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
        })
        .await;
        assert!(swept.is_ok(), "still {} entries", map.len());
        assert!(map.update(|m| m.contains_key("a/live")));
    }

    #[test]
    fn a_change_filter_sees_only_changes() {
        let filter: ChangeFilter<(i64, bool)> = ChangeFilter::new("spec_changes");
        assert!(filter.changed("a/x".into(), (1, false)), "first sight");
        assert!(!filter.changed("a/x".into(), (1, false)), "a status write");
        assert!(filter.changed("a/x".into(), (2, false)), "a new generation");
        assert!(filter.changed("a/y".into(), (2, false)), "another object");
        filter.map().forget("a/x");
        assert_eq!(filter.map().len(), 1);
        assert!(
            filter.changed("a/x".into(), (2, false)),
            "seen again after its deletion"
        );
    }

    #[test]
    fn keys_map_back_to_references() {
        let namespaced: ObjectRef<ConfigMap> = object_ref("ns/name");
        assert_eq!(namespaced, ObjectRef::new("name").within("ns"));
        let cluster: ObjectRef<ConfigMap> = object_ref("/name");
        assert_eq!(cluster, ObjectRef::new("name"));
    }
}
