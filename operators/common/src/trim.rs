//! What a watch cache does not keep of an object.
//!
//! With 10,000 Instances in a store, an object's `managedFields` (the API server's record of
//! which manager set which field, often larger than the spec) and `kubectl apply`'s
//! `last-applied-configuration` annotation (a second copy of the object) were most of each
//! operator's memory, and no operator reads either: status is written server-side and
//! finalizers by patch, never by replacing a cached object. Every hub watch passes its
//! objects through [`for_cache`] before they reach a store.

use kube::Resource;

/// `kubectl apply`'s copy of the object it last applied.
pub const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Drops `managedFields` and the last-applied annotation (use with
/// `WatchStreamExt::modify`, before `reflect`).
pub fn for_cache<K: Resource>(object: &mut K) {
    let meta = object.meta_mut();
    meta.managed_fields = None;
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.remove(LAST_APPLIED);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;

    #[test]
    fn keeps_everything_a_reconcile_reads() {
        let mut object = ConfigMap::default();
        object.metadata.name = Some("a".into());
        object.metadata.labels = Some([("l".to_owned(), "v".to_owned())].into());
        object.metadata.annotations = Some(
            [
                (LAST_APPLIED.to_owned(), "{\"big\":true}".to_owned()),
                ("kontinuum.sh/rotate-identity".to_owned(), "1".to_owned()),
            ]
            .into(),
        );
        object.metadata.managed_fields = Some(vec![ManagedFieldsEntry::default()]);
        object.metadata.finalizers = Some(vec!["kontinuum.sh/f".into()]);
        object.data = Some([("k".to_owned(), "v".to_owned())].into());
        let mut expected = object.clone();
        expected.metadata.managed_fields = None;
        expected.metadata.annotations =
            Some([("kontinuum.sh/rotate-identity".to_owned(), "1".to_owned())].into());
        for_cache(&mut object);
        assert_eq!(object, expected);
    }
}
