//! The GitOps fan-out of a Zone (reference section 4.2, DESIGN section 1), pure: the seed
//! Instances, the InstancePool and the TalosCluster a Zone with `spec.seed.talosAddresses`
//! stands for, as server-side-apply bodies, and whether the observed objects already say
//! so (then nothing is written).
//!
//! Ownership: Zone → TalosCluster → InstancePool (controller ownerReferences); Instances are
//! never owned. An existing unclaimed Instance with a seed address is adopted (labelled
//! with the zone); one claimed by another pool is refused and named.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::Secret;
use kontinuum_crds::labels::{CLAIMED_BY, REGION, ZONE};
use kontinuum_crds::names::{NameError, normalize_address, seed_instance_name};
use kontinuum_crds::v1alpha2::{Instance, Zone};
use kube::{Resource as _, ResourceExt as _};
use serde_json::{Value, json};

/// The API version of every Kontinuum kind written here.
const API_VERSION: &str = "kontinuum.sh/v1alpha2";

/// A controller ownerReference to `owner` (`blockOwnerDeletion` set, so foreground deletion
/// waits for the child).
pub fn owner_reference(kind: &str, name: &str, uid: &str) -> Value {
    json!({
        "apiVersion": API_VERSION,
        "kind": kind,
        "name": name,
        "uid": uid,
        "controller": true,
        "blockOwnerDeletion": true,
    })
}

/// The controller ownerReference to a Zone, `None` before it has a uid.
pub fn zone_owner(zone: &Zone) -> Option<Value> {
    let uid = zone.meta().uid.as_deref()?;
    Some(owner_reference("Zone", &zone.name_any(), uid))
}

/// A seed Instance claimed by another pool: refused, never taken over.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// The Instance.
    pub instance: String,
    /// The seed address it has.
    pub address: String,
    /// The pool that claimed it.
    pub claimed_by: String,
}

impl Refusal {
    /// The condition message naming the Instance.
    pub fn message(&self) -> String {
        format!(
            "Instance {} (seed address {}) is claimed by InstancePool {}: remove the address from spec.seed or release the Instance",
            self.instance, self.address, self.claimed_by
        )
    }
}

/// The seed Instances to write (apply bodies) and the addresses refused.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SeedPlan {
    /// Apply bodies: the Instance named after the address (created, or kept as desired), or
    /// the region/zone labels of an adopted Instance of another name.
    pub instances: Vec<Value>,
    /// Addresses whose Instance is claimed by another pool.
    pub refused: Vec<Refusal>,
}

/// Whether `instance` is dialled at `address` (normalised).
fn has_address(instance: &Instance, address: &str) -> bool {
    instance
        .spec
        .interfaces
        .iter()
        .any(|i| normalize_address(i).is_ok_and(|n| n == address))
}

/// Pure: the seed plan of `zone` given the Instances of its namespace.
///
/// For each address (deduplicated by its normalised form): the Instance named
/// `seed_instance_name` if it exists, else another Instance already dialled at that address,
/// is the seed Instance. It is refused if claimed by a pool other than the zone's; the one of
/// the seed name gets labels and `spec.interfaces`; one of another name (adopted) gets only
/// the labels. Without either, the seed-named Instance is created.
pub fn plan_seed(zone: &Zone, instances: &[&Instance]) -> Result<SeedPlan, NameError> {
    let region = &zone.spec.region;
    let zone_label = &zone.spec.zone;
    let pool = zone.name_any();
    let namespace = zone.namespace().unwrap_or_default();
    let mut plan = SeedPlan::default();
    let mut seen = BTreeSet::new();
    for address in seed_addresses(zone) {
        let normalized = normalize_address(address)?;
        if !seen.insert(normalized.clone()) {
            continue;
        }
        let name = seed_instance_name(region, zone_label, address)?;
        let found = instances.iter().find(|i| i.name_any() == name).or_else(|| {
            let mut others: Vec<&&Instance> = instances
                .iter()
                .filter(|i| has_address(i, &normalized))
                .collect();
            others.sort_by_key(|i| i.name_any());
            others.into_iter().next()
        });
        if let Some(claimed_by) = found
            .and_then(|i| i.labels().get(CLAIMED_BY))
            .filter(|c| **c != pool)
        {
            plan.refused.push(Refusal {
                instance: found.map(|i| i.name_any()).unwrap_or_default(),
                address: normalized,
                claimed_by: claimed_by.clone(),
            });
            continue;
        }
        let labels = json!({ REGION: region, ZONE: zone_label });
        match found {
            Some(other) if other.name_any() != name => {
                plan.instances.push(json!({
                    "apiVersion": API_VERSION,
                    "kind": "Instance",
                    "metadata": { "name": other.name_any(), "namespace": namespace, "labels": labels },
                }));
            }
            _ => plan.instances.push(json!({
                "apiVersion": API_VERSION,
                "kind": "Instance",
                "metadata": { "name": name, "namespace": namespace, "labels": labels },
                "spec": { "interfaces": [normalized] },
            })),
        }
    }
    Ok(plan)
}

/// The seed addresses of a Zone (empty without a seed).
pub fn seed_addresses(zone: &Zone) -> &[String] {
    zone.spec
        .seed
        .as_ref()
        .map_or(&[], |s| s.talos_addresses.as_slice())
}

/// `spec.cluster.controlPlaneReplicas`, default 1.
pub fn replicas(zone: &Zone) -> i32 {
    zone.spec
        .cluster
        .as_ref()
        .and_then(|c| c.control_plane_replicas)
        .unwrap_or(1)
}

/// Pure: the TalosCluster of a Zone (named like it), owned by it (`owner`).
pub fn talos_cluster(zone: &Zone, owner: &Value) -> Value {
    let name = zone.name_any();
    let template = zone.spec.cluster.clone().unwrap_or_default();
    let mut spec = json!({ "controlPlane": { "poolRef": { "name": name } } });
    if let Some(endpoint) = &template.endpoint {
        spec["controlPlane"]["endpoint"] = json!(endpoint);
    }
    if let Some(version) = template.talos_version {
        spec["talos"] = json!({ "version": version });
    }
    if !template.config_patches.is_empty() {
        spec["talos"]["configPatches"] = json!(template.config_patches);
    }
    if let Some(version) = template.kubernetes_version {
        spec["kubernetes"] = json!({ "version": version });
    }
    if let Some(teardown) = &zone.spec.teardown {
        spec["teardown"] = json!({ "unregisterInstances": teardown.unregister_instances });
    }
    json!({
        "apiVersion": API_VERSION,
        "kind": "TalosCluster",
        "metadata": {
            "name": name,
            "namespace": zone.namespace().unwrap_or_default(),
            "ownerReferences": [owner],
        },
        "spec": spec,
    })
}

/// Pure: the control-plane InstancePool of a Zone (named like it), selecting the zone's
/// labels, owned by its TalosCluster (`owner`).
pub fn instance_pool(zone: &Zone, owner: &Value) -> Value {
    json!({
        "apiVersion": API_VERSION,
        "kind": "InstancePool",
        "metadata": {
            "name": zone.name_any(),
            "namespace": zone.namespace().unwrap_or_default(),
            "ownerReferences": [owner],
        },
        "spec": {
            "replicas": replicas(zone),
            "selector": { "matchLabels": { REGION: zone.spec.region, ZONE: zone.spec.zone } },
        },
    })
}

/// Pure: whether `observed` already holds everything `desired` says, so applying it would
/// change nothing. Objects: every desired key, recursively. Lists of objects: every desired
/// item matches some observed item (ownerReferences, merged by the server); other lists and
/// scalars: equal.
///
/// Top-level `spec` fields are compared exactly (after this rule), and fields the desired
/// spec omits but the observed spec has are a difference only for [`OWNED_SPEC_FIELDS`],
/// so a field removed from the template is removed downstream too.
pub fn up_to_date(desired: &Value, observed: &Value) -> bool {
    if !contains(desired, observed) {
        return false;
    }
    let (Some(want), Some(have)) = (
        desired.get("spec").and_then(Value::as_object),
        observed.get("spec").and_then(Value::as_object),
    ) else {
        return true;
    };
    OWNED_SPEC_FIELDS
        .iter()
        .all(|field| want.contains_key(*field) || !have.contains_key(*field))
}

/// Optional spec fields the fan-out sets from the Zone: when the Zone stops setting one, the
/// object must be written to drop it.
pub const OWNED_SPEC_FIELDS: &[&str] = &["talos", "kubernetes", "teardown"];

fn contains(desired: &Value, observed: &Value) -> bool {
    match (desired, observed) {
        (Value::Object(want), Value::Object(have)) => want
            .iter()
            .all(|(k, v)| have.get(k).is_some_and(|h| contains(v, h))),
        (Value::Array(want), Value::Array(have)) if want.iter().all(Value::is_object) => {
            want.iter().all(|w| have.iter().any(|h| contains(w, h)))
        }
        (want, have) => want == have,
    }
}

/// The name of the Zone a hub identity Secret belongs to: the Secret `<zone name>-identity`
/// maps to the Zone `<zone name>` of its namespace.
pub fn zone_of_identity_secret(secret: &kube::core::PartialObjectMeta<Secret>) -> Option<String> {
    secret
        .name_any()
        .strip_suffix("-identity")
        .filter(|n| !n.is_empty())
        .map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn zone(addresses: &[&str]) -> Zone {
        serde_json::from_value(json!({
            "apiVersion": API_VERSION, "kind": "Zone",
            "metadata": { "name": "eu-west-1a", "namespace": "ns", "uid": "zone-uid" },
            "spec": { "region": "eu", "zone": "west-1a", "seed": { "talosAddresses": addresses } },
        }))
        .unwrap()
    }

    fn instance(name: &str, address: &str, claimed_by: Option<&str>) -> Instance {
        let mut labels = serde_json::Map::new();
        if let Some(pool) = claimed_by {
            labels.insert(CLAIMED_BY.into(), json!(pool));
        }
        serde_json::from_value(json!({
            "apiVersion": API_VERSION, "kind": "Instance",
            "metadata": { "name": name, "namespace": "ns", "labels": labels },
            "spec": { "interfaces": [address] },
        }))
        .unwrap()
    }

    #[test]
    fn creates_one_instance_per_address() {
        let z = zone(&["192.0.2.10", "2001:DB8::1", "192.0.2.10"]);
        let plan = plan_seed(&z, &[]).unwrap();
        assert!(plan.refused.is_empty());
        let names: Vec<&str> = plan
            .instances
            .iter()
            .map(|i| i["metadata"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["eu-west-1a-6d99cbd08f", "eu-west-1a-5afd19e856"]);
        assert_eq!(
            plan.instances[1]["spec"]["interfaces"],
            json!(["2001:db8::1"])
        );
        assert_eq!(plan.instances[0]["metadata"]["labels"][REGION], "eu");
        assert_eq!(plan.instances[0]["metadata"]["labels"][ZONE], "west-1a");
        assert!(
            plan.instances[0]["metadata"]
                .get("ownerReferences")
                .is_none()
        );
    }

    #[test]
    fn adopts_an_unclaimed_instance_and_refuses_a_claimed_one() {
        let z = zone(&["192.0.2.10", "192.0.2.11", "192.0.2.12"]);
        let free = instance("by-hand", "192.0.2.10", None);
        let taken = instance("taken", "192.0.2.11", Some("other-pool"));
        let ours = instance("eu-west-1a-x", "192.0.2.12", Some("eu-west-1a"));
        let plan = plan_seed(&z, &[&free, &taken, &ours]).unwrap();
        assert_eq!(
            plan.refused,
            [Refusal {
                instance: "taken".into(),
                address: "192.0.2.11".into(),
                claimed_by: "other-pool".into()
            }]
        );
        assert!(plan.refused[0].message().contains("Instance taken"));
        assert!(
            plan.refused[0]
                .message()
                .contains("InstancePool other-pool")
        );
        assert_eq!(plan.instances.len(), 2);
        assert_eq!(plan.instances[0]["metadata"]["name"], "by-hand");
        assert!(
            plan.instances[0].get("spec").is_none(),
            "adoption writes labels only"
        );
        assert_eq!(plan.instances[1]["metadata"]["name"], "eu-west-1a-x");
    }

    #[test]
    fn the_seed_named_instance_wins_over_another_with_the_address() {
        let z = zone(&["192.0.2.10"]);
        let seed = instance("eu-west-1a-6d99cbd08f", "192.0.2.10", None);
        let other = instance("a-other", "192.0.2.10", Some("elsewhere"));
        let plan = plan_seed(&z, &[&other, &seed]).unwrap();
        assert!(plan.refused.is_empty());
        assert_eq!(
            plan.instances[0]["metadata"]["name"],
            "eu-west-1a-6d99cbd08f"
        );
        assert!(plan.instances[0].get("spec").is_some());
    }

    #[test]
    fn cluster_and_pool_form_the_ownership_chain() {
        let mut z = zone(&["192.0.2.10"]);
        z.spec.cluster = Some(kontinuum_crds::v1alpha2::ZoneClusterTemplate {
            talos_version: Some("v1.13.0".into()),
            kubernetes_version: None,
            control_plane_replicas: Some(3),
            config_patches: vec![
                serde_json::from_value(json!({ "machine": { "install": { "disk": "/dev/sda" } } }))
                    .unwrap(),
            ],
            endpoint: Some(kontinuum_crds::v1alpha2::ControlPlaneEndpoint {
                host: Some("api.west-1a.example".into()),
                vip: None,
            }),
        });
        let owner = zone_owner(&z).unwrap();
        let cluster = talos_cluster(&z, &owner);
        assert_eq!(cluster["metadata"]["name"], "eu-west-1a");
        assert_eq!(cluster["metadata"]["ownerReferences"][0]["kind"], "Zone");
        assert_eq!(cluster["metadata"]["ownerReferences"][0]["uid"], "zone-uid");
        assert_eq!(cluster["spec"]["talos"]["version"], "v1.13.0");
        assert_eq!(
            cluster["spec"]["talos"]["configPatches"][0]["machine"]["install"]["disk"],
            "/dev/sda"
        );
        assert_eq!(
            cluster["metadata"]["ownerReferences"][0]["controller"],
            true
        );
        assert_eq!(
            cluster["spec"]["controlPlane"]["poolRef"]["name"],
            "eu-west-1a"
        );
        assert_eq!(
            cluster["spec"]["controlPlane"]["endpoint"],
            json!({ "host": "api.west-1a.example" })
        );
        assert!(
            talos_cluster(&zone(&[]), &owner)["spec"]["controlPlane"]
                .get("endpoint")
                .is_none()
        );
        assert_eq!(cluster["spec"]["talos"]["version"], "v1.13.0");
        assert!(cluster["spec"].get("kubernetes").is_none());
        let pool_owner = owner_reference("TalosCluster", "eu-west-1a", "tc-uid");
        let pool = instance_pool(&z, &pool_owner);
        assert_eq!(pool["spec"]["replicas"], 3);
        assert_eq!(
            pool["metadata"]["ownerReferences"][0]["kind"],
            "TalosCluster"
        );
        assert_eq!(
            pool["spec"]["selector"]["matchLabels"],
            json!({ REGION: "eu", ZONE: "west-1a" })
        );
        assert_eq!(replicas(&zone(&[])), 1);
    }

    #[test]
    fn up_to_date_is_a_subset_check_with_owned_spec_fields() {
        let desired = json!({"metadata": {"name": "a", "ownerReferences": [{"uid": "1"}]}, "spec": {"controlPlane": {"poolRef": {"name": "a"}}}});
        let observed = json!({"metadata": {"name": "a", "uid": "x", "ownerReferences": [{"uid": "0"}, {"uid": "1", "kind": "Zone"}]}, "spec": {"controlPlane": {"poolRef": {"name": "a"}}, "workers": []}, "status": {}});
        assert!(up_to_date(&desired, &observed));
        let mut changed = observed.clone();
        changed["spec"]["controlPlane"]["poolRef"]["name"] = json!("b");
        assert!(!up_to_date(&desired, &changed));
        let mut extra = observed.clone();
        extra["spec"]["talos"] = json!({"version": "v1.12.0"});
        assert!(
            !up_to_date(&desired, &extra),
            "a dropped template field is written"
        );
        let mut orphan = observed;
        orphan["metadata"]["ownerReferences"] = json!([{"uid": "0"}]);
        assert!(!up_to_date(&desired, &orphan));
        assert!(!up_to_date(
            &json!({"spec": {"interfaces": ["a"]}}),
            &json!({"spec": {"interfaces": ["a", "b"]}})
        ));
    }
}
