//! Adding and removing one finalizer, for controllers whose cleanup must be able to *wait*
//! (a teardown with a deadline): kube-runtime's `finalizer()` helper removes the finalizer as
//! soon as cleanup returns `Ok`, whatever `Action` it returns, so waiting there means
//! returning an error. These write only the finalizer list, with a merge patch guarded by
//! the object's resourceVersion (a concurrent change is a 409, retried by the caller).

use std::time::Duration;

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Patch, PatchParams};
use kube::{Api, Resource, ResourceExt};
use serde::de::DeserializeOwned;

/// When a cleanup that waits gives up: `deletionTimestamp + timeout` (`None` while the
/// object is not being deleted, or when the sum does not fit).
pub fn deadline<K: Resource>(object: &K, timeout: Duration) -> Option<Timestamp> {
    let deleted = object.meta().deletion_timestamp.as_ref()?.0;
    deleted
        .checked_add(SignedDuration::try_from(timeout).ok()?)
        .ok()
}

/// Whether `object` carries `finalizer`.
pub fn has<K: ResourceExt>(object: &K, finalizer: &str) -> bool {
    object.finalizers().iter().any(|f| f == finalizer)
}

/// Adds `finalizer` to `object` (no-op if present).
pub async fn add<K>(api: &Api<K>, object: &K, finalizer: &str) -> Result<(), kube::Error>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    if has(object, finalizer) {
        return Ok(());
    }
    let mut finalizers = object.finalizers().to_vec();
    finalizers.push(finalizer.to_owned());
    write(api, object, &finalizers).await
}

/// Removes `finalizer` from `object` (no-op if absent or the object is gone).
pub async fn remove<K>(api: &Api<K>, object: &K, finalizer: &str) -> Result<(), kube::Error>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    if !has(object, finalizer) {
        return Ok(());
    }
    let finalizers: Vec<String> = object
        .finalizers()
        .iter()
        .filter(|f| *f != finalizer)
        .cloned()
        .collect();
    match write(api, object, &finalizers).await {
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        other => other,
    }
}

async fn write<K>(api: &Api<K>, object: &K, finalizers: &[String]) -> Result<(), kube::Error>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    let patch = serde_json::json!({
        "metadata": { "finalizers": finalizers, "resourceVersion": object.resource_version() }
    });
    api.patch(
        &object.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await
    .map(|_| ())
}
