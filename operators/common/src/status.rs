//! Status writes: server-side apply of `/status` with the controller's own field manager
//! (forced: each condition type has exactly one owner, and conditions are `listType=map`),
//! skipped when the status differs from the current one only in condition timestamps. A
//! reconcile that changes nothing therefore writes nothing, and its own status patch cannot
//! trigger a second write. [`StatusWrites`] also skips the write a reconcile would make from
//! a cache that has not yet seen the process's own last write.

use kontinuum_crds::conditions::{HasConditions, normalized, status_eq_ignoring_time};
use kube::api::{Patch, PatchParams};
use kube::{Api, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::backoff::object_key;
use crate::tracked::{Forget, ObjectMap};

/// Applies `desired` as the status of `name` unless `current` already equals it (condition
/// timestamps ignored). Returns whether a write was made.
pub async fn apply_status<K, S>(
    api: &Api<K>,
    name: &str,
    field_manager: &str,
    current: Option<&S>,
    desired: &S,
) -> Result<bool, kube::Error>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
    S: HasConditions + Clone + PartialEq + Serialize,
{
    if current.is_some_and(|c| status_eq_ignoring_time(c, desired)) {
        return Ok(false);
    }
    let patch = status_patch::<K, S>(desired);
    api.patch_status(
        name,
        &PatchParams::apply(field_manager).force(),
        &Patch::Apply(&patch),
    )
    .await?;
    Ok(true)
}

/// The statuses this process wrote, per object (`namespace/name`), each with the
/// `resourceVersion` of the object it was computed from.
///
/// A reconcile can start before the watch has delivered the process's own last status write:
/// a child's event (a claim label it just wrote) arrives first, and the reconcile gets the
/// object that write was computed from, still without the new status. Computing the same
/// status again, it would write it again: a request the server turns into a no-op, but a
/// write all the same, at a moment nothing changed (and an Event announced twice). [`Self::apply`]
/// skips it: the object is the very version the last write started from, and the status is
/// the one written, so the server holds it already. Any other write to the object gives it a
/// new `resourceVersion`, so nothing else is skipped.
///
/// An entry holds a SHA-256 digest of the status (timestamps left out), not the status; it
/// is dropped once the cache has caught up (the next reconcile finds the status equal) and
/// with its object (it is a [`Forget`] for [`crate::tracked::forget_gone`]).
#[derive(Clone, Debug)]
pub struct StatusWrites {
    written: ObjectMap<Written>,
}

#[derive(Debug, PartialEq, Eq)]
struct Written {
    /// The `resourceVersion` of the object the status was computed from.
    from: String,
    /// [`digest`] of the status written.
    digest: String,
}

/// SHA-256 of the status's JSON once its condition timestamps are zeroed and its conditions
/// sorted: equal for two statuses exactly when they are equal ignoring time.
fn digest<S: HasConditions + Clone + Serialize>(status: &S) -> String {
    // Serializing a status (strings, numbers, vectors, maps with string keys) cannot fail;
    // if it ever did, the empty digest matches no status written, so the write goes ahead.
    let json = serde_json::to_vec(&normalized(status)).unwrap_or_default();
    kontinuum_crds::names::sha256_hex(&json)
}

impl StatusWrites {
    /// None written yet; `name` labels the map's size metric.
    pub fn new(name: &'static str) -> Self {
        Self {
            written: ObjectMap::new(name),
        }
    }

    /// [`apply_status`] of `desired` on `object`, whose status is `current`, unless the
    /// last status written from this very version of `object` was `desired` (condition
    /// timestamps ignored). Returns whether a write was made.
    pub async fn apply<K, S>(
        &self,
        api: &Api<K>,
        object: &K,
        field_manager: &str,
        current: Option<&S>,
        desired: &S,
    ) -> Result<bool, kube::Error>
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
        S: HasConditions + Clone + PartialEq + Serialize,
    {
        let key = object_key(object);
        let written = object.resource_version().map(|from| Written {
            from,
            digest: digest(desired),
        });
        let already = written.as_ref().is_some_and(|w| {
            self.written
                .update(|m| m.get(&key).is_some_and(|last| last == w))
        });
        if already {
            return Ok(false);
        }
        let wrote = apply_status(api, &object.name_any(), field_manager, current, desired).await?;
        self.written.update(|m| match written {
            Some(written) if wrote => {
                m.insert(key, written);
            }
            _ => {
                m.remove(&key);
            }
        });
        Ok(wrote)
    }
}

impl Forget for StatusWrites {
    fn forget(&self, key: &str) {
        self.written.forget(key);
    }

    fn retain_live(&self, live: &dyn Fn(&str) -> bool) -> usize {
        self.written.retain_live(live)
    }

    fn name(&self) -> &'static str {
        self.written.name()
    }

    fn report(&self, metrics: &crate::metrics::ControllerMetrics) {
        self.written.report(metrics);
    }
}

/// The apply body: apiVersion, kind and status only.
pub fn status_patch<K: Resource<DynamicType = ()>, S: Serialize>(status: &S) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "status": status,
    })
}

#[cfg(test)]
mod tests {
    use kontinuum_crds::v1alpha2::{Zone, ZoneStatus};

    use super::*;

    #[test]
    fn the_patch_names_the_kind_and_holds_only_status() {
        let status = ZoneStatus {
            observed_generation: Some(3),
            ..ZoneStatus::default()
        };
        let patch = status_patch::<Zone, _>(&status);
        assert_eq!(patch["apiVersion"], "kontinuum.sh/v1alpha2");
        assert_eq!(patch["kind"], "Zone");
        assert_eq!(patch["status"]["observedGeneration"], 3);
        assert_eq!(patch.as_object().unwrap().len(), 3);
    }
}
