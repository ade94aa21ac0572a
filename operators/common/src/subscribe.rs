//! One watch stream, several consumers (a Controller's own trigger and its `watches` of the
//! same kind), without a second watch — and without kube-runtime 5.0's shared-stream stall:
//! its `ReflectHandle` returns `Pending` without arranging a wake-up when an object it was
//! told about is already gone from the store (an Addon whose finalizer was removed a moment
//! later), so a burst of deletions could freeze the subscriber, fill the dispatcher's buffer
//! and, with it, the watch itself. Here a subscriber skips such an object and reads on.

use std::sync::Arc;

use futures::stream::BoxStream;
use futures::{Stream, StreamExt as _};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use tokio::sync::mpsc;

/// Passes `stream` (already reflected into `store`) through and gives `subscribers` streams
/// of the objects it applied — each changed object, and every object after a (re)list — as
/// the store holds them when the subscriber reads (objects deleted since are skipped). The
/// subscriber streams end with `stream`. Their queues are unbounded: what they hold is one
/// reference per event not consumed yet.
pub fn share<K, S>(
    stream: S,
    store: &Store<K>,
    subscribers: usize,
) -> (
    impl Stream<Item = S::Item> + Send + use<K, S>,
    Vec<BoxStream<'static, Arc<K>>>,
)
where
    K: kube::Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
    S: Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send,
{
    let (senders, receivers): (Vec<_>, Vec<_>) =
        (0..subscribers).map(|_| mpsc::unbounded_channel()).unzip();
    let reader = store.clone();
    let passed = stream.inspect(move |event| {
        let send = |reference: ObjectRef<K>| {
            for sender in &senders {
                let _ = sender.send(reference.clone());
            }
        };
        match event {
            Ok(watcher::Event::Apply(object)) => send(ObjectRef::from_obj(object)),
            Ok(watcher::Event::InitDone) => {
                for object in reader.state() {
                    send(ObjectRef::from_obj(object.as_ref()));
                }
            }
            _ => {}
        }
    });
    let streams = receivers
        .into_iter()
        .map(|receiver| {
            futures::stream::unfold(
                (receiver, store.clone()),
                |(mut receiver, store)| async move {
                    loop {
                        let reference = receiver.recv().await?;
                        if let Some(object) = store.get(&reference) {
                            return Some((object, (receiver, store)));
                        }
                    }
                },
            )
            .boxed()
        })
        .collect();
    (passed, streams)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::runtime::WatchStreamExt as _;
    use kube::runtime::reflector;

    fn config_map(name: &str) -> ConfigMap {
        let mut object = ConfigMap::default();
        object.metadata.name = Some(name.into());
        object.metadata.namespace = Some("a".into());
        object
    }

    #[tokio::test]
    async fn an_object_gone_before_it_is_read_is_skipped_not_a_stall() {
        let (store, writer) = reflector::store::<ConfigMap>();
        let events = vec![
            Ok(watcher::Event::Init),
            Ok(watcher::Event::InitApply(config_map("listed"))),
            Ok(watcher::Event::InitDone),
            Ok(watcher::Event::Apply(config_map("gone"))),
            Ok(watcher::Event::Delete(config_map("gone"))),
            Ok(watcher::Event::Apply(config_map("next"))),
        ];
        let (passed, subscribers) = share(futures::stream::iter(events).reflect(writer), &store, 2);
        // The watch runs ahead of both subscribers: "gone" is gone when they read.
        assert_eq!(passed.count().await, 6);
        for subscriber in subscribers {
            let names: Vec<String> = tokio::time::timeout(
                std::time::Duration::from_secs(5),
                subscriber
                    .map(|o| o.metadata.name.clone().unwrap_or_default())
                    .collect(),
            )
            .await
            .expect("the subscriber reads on and ends with the watch");
            assert_eq!(names, ["listed", "next"]);
        }
    }
}
