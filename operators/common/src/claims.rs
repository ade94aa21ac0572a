//! The claim label of an Instance (`kontinuum.sh/claimed-by`), written only with a
//! compare-and-set: a merge patch carrying the `resourceVersion` the writer read, so of two
//! writers racing for one Instance exactly one wins (server-side apply from two field
//! managers would let both win). pool-claimer claims and releases; talos-bootstrapper
//! releases after a teardown.

use std::collections::BTreeMap;

use kontinuum_crds::labels::CLAIMED_BY;
use kontinuum_crds::v1alpha2::Instance;
use kube::Api;
use kube::api::{Patch, PatchParams};

/// Compare-and-set of the claim label: `Some(pool)` claims, `None` releases. The patch
/// carries `resource_version`, so it fails with 409 if the Instance changed since it was
/// read. Returns whether this write won (false on a lost race or a vanished Instance).
pub async fn set_claim(
    api: &Api<Instance>,
    instance: &str,
    resource_version: Option<String>,
    pool: Option<&str>,
    field_manager: &str,
) -> Result<bool, kube::Error> {
    let mut labels = BTreeMap::new();
    labels.insert(CLAIMED_BY, pool);
    let patch = serde_json::json!({
        "metadata": { "resourceVersion": resource_version, "labels": labels }
    });
    let params = PatchParams {
        field_manager: Some(field_manager.to_string()),
        ..PatchParams::default()
    };
    match api.patch(instance, &params, &Patch::Merge(&patch)).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(status)) if status.code == 409 || status.code == 404 => Ok(false),
        Err(e) => Err(e),
    }
}
