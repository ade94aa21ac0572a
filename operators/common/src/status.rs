//! Status writes: server-side apply of `/status` with the controller's own field manager
//! (forced: each condition type has exactly one owner, and conditions are `listType=map`),
//! skipped when the status differs from the current one only in condition timestamps. A
//! reconcile that changes nothing therefore writes nothing, and its own status patch cannot
//! trigger a second write.

use kontinuum_crds::conditions::{HasConditions, status_eq_ignoring_time};
use kube::api::{Patch, PatchParams};
use kube::{Api, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;

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
