//! Everything the addon-installer reads or writes in a downstream (zone) cluster, with the
//! cluster's kubeconfig: the Helm release record, the KubectlApply inventory and its
//! objects, CRDs, pods and workloads. Every call has a timeout (the client's connect and
//! read timeouts, and the caller's overall bound).

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::discovery::{ApiCapabilities, Scope};
use kube::{Client, Config, ResourceExt as _};
use serde_json::Value;

use crate::FIELD_MANAGER;
use crate::health::{self, CrdState};
use crate::helm::HASH_LABEL;
use crate::manifests::{self, CrdInfo, ObjectId};

/// Prefix of the ConfigMap, in the release namespace, listing what a KubectlApply release
/// applied (its inventory), so objects no longer rendered are pruned.
pub const INVENTORY_PREFIX: &str = "kontinuum-addon-";

/// A downstream failure.
#[derive(Debug, thiserror::Error)]
pub enum DownstreamError {
    /// The kubeconfig is unusable. The parser's own message is not kept: it may quote
    /// part of the document, which holds credentials, and this text reaches conditions.
    #[error("the cluster's kubeconfig is unusable ({0})")]
    Kubeconfig(&'static str),
    /// Building the client failed.
    #[error("building a client for the cluster")]
    Client(#[source] kube::Error),
    /// An API call failed.
    #[error("{what}")]
    Api {
        /// What was being done.
        what: String,
        /// The cause.
        #[source]
        source: kube::Error,
    },
    /// A rendered object cannot be applied.
    #[error("{0}")]
    Object(String),
}

fn api_err(what: impl Into<String>) -> impl FnOnce(kube::Error) -> DownstreamError {
    let what = what.into();
    move |source| DownstreamError::Api { what, source }
}

/// A client for a downstream cluster, with connect/read/write timeouts of `timeout`.
pub async fn connect(kubeconfig: &str, timeout: Duration) -> Result<Client, DownstreamError> {
    connect_for_watch(kubeconfig, timeout, timeout).await
}

/// A client for a downstream cluster whose reads may wait `read` (a watch request, open
/// until the server ends it), with connect and write timeouts of `timeout`.
pub async fn connect_for_watch(
    kubeconfig: &str,
    timeout: Duration,
    read: Duration,
) -> Result<Client, DownstreamError> {
    let parsed = kube::config::Kubeconfig::from_yaml(kubeconfig)
        .map_err(|_| DownstreamError::Kubeconfig("not a kubeconfig document"))?;
    let mut config =
        Config::from_custom_kubeconfig(parsed, &kube::config::KubeConfigOptions::default())
            .await
            .map_err(|_| DownstreamError::Kubeconfig("no usable context, cluster or user"))?;
    config.connect_timeout = Some(timeout);
    config.read_timeout = Some(read);
    config.write_timeout = Some(timeout);
    Client::try_from(config).map_err(DownstreamError::Client)
}

/// The cluster's version, e.g. `v1.37.0`, for `helm template --kube-version`.
pub async fn kube_version(client: &Client) -> Result<String, DownstreamError> {
    let info = client
        .apiserver_version()
        .await
        .map_err(api_err("reading the cluster's version"))?;
    Ok(info.git_version)
}

/// One revision of a Helm release, from its storage Secret's labels.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Revision {
    /// The revision number.
    pub version: i64,
    /// Helm's status: `deployed`, `failed`, `pending-install`, ...
    pub status: String,
    /// The desired-state hash the revision was made from (our release label).
    pub hash: Option<String>,
}

/// The revisions of `release` in `namespace`, read from Helm's storage Secrets (labels
/// `owner=helm,name=<release>`): no helm process is needed to tell whether anything changed.
pub async fn release_revisions(
    client: &Client,
    namespace: &str,
    release: &str,
) -> Result<Vec<Revision>, DownstreamError> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let params = ListParams::default().labels(&format!("owner=helm,name={release}"));
    let list = secrets
        .list_metadata(&params)
        .await
        .map_err(api_err(format!("listing the Helm records of {release}")))?;
    let mut out: Vec<Revision> = list
        .items
        .iter()
        .filter_map(|s| {
            let labels = s.labels();
            Some(Revision {
                version: labels.get("version")?.parse().ok()?,
                status: labels.get("status")?.clone(),
                hash: labels.get(HASH_LABEL).cloned(),
            })
        })
        .collect();
    out.sort_by_key(|r| r.version);
    Ok(out)
}

/// A KubectlApply release's inventory.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Inventory {
    /// The desired-state hash last applied completely.
    pub hash: Option<String>,
    /// What was applied.
    pub objects: Vec<ObjectId>,
}

/// Reads the inventory of `release` (empty if there is none).
pub async fn read_inventory(
    client: &Client,
    namespace: &str,
    release: &str,
) -> Result<Inventory, DownstreamError> {
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let name = format!("{INVENTORY_PREFIX}{release}");
    let Some(cm) = cms
        .get_opt(&name)
        .await
        .map_err(api_err(format!("reading the inventory {namespace}/{name}")))?
    else {
        return Ok(Inventory::default());
    };
    let data = cm.data.unwrap_or_default();
    Ok(Inventory {
        hash: data.get("hash").cloned(),
        objects: data
            .get("objects")
            .and_then(|o| serde_json::from_str(o).ok())
            .unwrap_or_default(),
    })
}

async fn write_inventory(
    client: &Client,
    namespace: &str,
    release: &str,
    inventory: &Inventory,
) -> Result<(), DownstreamError> {
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let name = format!("{INVENTORY_PREFIX}{release}");
    let objects = serde_json::to_string(&inventory.objects).unwrap_or_default();
    let cm = serde_json::json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "labels": {
                "app.kubernetes.io/managed-by": "kontinuum",
                "app.kubernetes.io/instance": release,
            }
        },
        "data": { "hash": inventory.hash, "objects": objects },
    });
    cms.patch(
        &name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&cm),
    )
    .await
    .map_err(api_err(format!("writing the inventory {namespace}/{name}")))?;
    Ok(())
}

/// Finds how to reach kinds, caching per call.
struct Resolver<'a> {
    client: &'a Client,
    cache: HashMap<(String, String), (ApiResource, ApiCapabilities)>,
}

impl<'a> Resolver<'a> {
    fn new(client: &'a Client) -> Self {
        Self {
            client,
            cache: HashMap::new(),
        }
    }

    async fn api(
        &mut self,
        id: &ObjectId,
        default_namespace: &str,
    ) -> Result<(Api<DynamicObject>, String), DownstreamError> {
        let key = (id.api_version.clone(), id.kind.clone());
        if !self.cache.contains_key(&key) {
            let (group, version) = id
                .api_version
                .split_once('/')
                .unwrap_or(("", &id.api_version));
            let gvk = GroupVersionKind::gvk(group, version, &id.kind);
            let found = kube::discovery::pinned_kind(self.client, &gvk)
                .await
                .map_err(api_err(format!(
                    "{}, Kind={} is not served by the cluster",
                    id.api_version, id.kind
                )))?;
            self.cache.insert(key.clone(), found);
        }
        let Some((resource, caps)) = self.cache.get(&key) else {
            return Err(DownstreamError::Object(format!("no API for {id}")));
        };
        Ok(match caps.scope {
            Scope::Cluster => (Api::all_with(self.client.clone(), resource), String::new()),
            Scope::Namespaced => {
                let ns = if id.namespace.is_empty() {
                    default_namespace.to_string()
                } else {
                    id.namespace.clone()
                };
                (Api::namespaced_with(self.client.clone(), &ns, resource), ns)
            }
        })
    }
}

/// KubectlApply: server-side applies every rendered object (namespaced objects without a
/// namespace go to `namespace`), then deletes what the previous inventory listed and this
/// rendering no longer has, then records the new inventory with `hash`. The namespace is
/// created if missing (it holds the inventory).
pub async fn apply_rendered(
    client: &Client,
    namespace: &str,
    release: &str,
    objects: &[Value],
    hash: &str,
) -> Result<usize, DownstreamError> {
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let ns = serde_json::json!({ "apiVersion": "v1", "kind": "Namespace", "metadata": { "name": namespace } });
    Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
        .patch(namespace, &params, &Patch::Apply(&ns))
        .await
        .map_err(api_err(format!("creating namespace {namespace}")))?;
    let previous = read_inventory(client, namespace, release).await?;

    let mut ordered = objects.to_vec();
    manifests::apply_order(&mut ordered);
    let mut resolver = Resolver::new(client);
    let mut applied = Vec::new();
    for object in &ordered {
        let Some(id) = manifests::object_id(object) else {
            return Err(DownstreamError::Object(
                "a rendered object has no apiVersion, kind or metadata.name".into(),
            ));
        };
        let (api, ns) = resolver.api(&id, namespace).await?;
        let mut body = object.clone();
        if !ns.is_empty()
            && let Some(meta) = body.get_mut("metadata").and_then(Value::as_object_mut)
        {
            meta.insert("namespace".into(), Value::String(ns.clone()));
        }
        api.patch(&id.name, &params, &Patch::Apply(&body))
            .await
            .map_err(api_err(format!("applying {id}")))?;
        applied.push(ObjectId {
            namespace: ns,
            ..id
        });
    }
    applied.sort();
    let keep: BTreeSet<&ObjectId> = applied.iter().collect();
    for stale in previous.objects.iter().filter(|o| !keep.contains(o)) {
        delete_object(&mut resolver, stale, namespace).await?;
    }
    let count = applied.len();
    write_inventory(
        client,
        namespace,
        release,
        &Inventory {
            hash: Some(hash.to_string()),
            objects: applied,
        },
    )
    .await?;
    Ok(count)
}

async fn delete_object(
    resolver: &mut Resolver<'_>,
    id: &ObjectId,
    namespace: &str,
) -> Result<(), DownstreamError> {
    let (api, _) = match resolver.api(id, namespace).await {
        Ok(found) => found,
        // The kind is gone (its CRD was removed): so is the object.
        Err(DownstreamError::Api {
            source: kube::Error::Api(s),
            ..
        }) if s.code == 404 => {
            return Ok(());
        }
        Err(e) => return Err(e),
    };
    match api.delete(&id.name, &DeleteParams::background()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(source) => Err(DownstreamError::Api {
            what: format!("deleting {id}"),
            source,
        }),
    }
}

/// Removes everything a KubectlApply release applied, then its inventory.
pub async fn delete_applied(
    client: &Client,
    namespace: &str,
    release: &str,
) -> Result<(), DownstreamError> {
    let inventory = read_inventory(client, namespace, release).await?;
    let mut resolver = Resolver::new(client);
    for id in inventory.objects.iter().rev() {
        delete_object(&mut resolver, id, namespace).await?;
    }
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    match cms
        .delete(
            &format!("{INVENTORY_PREFIX}{release}"),
            &DeleteParams::default(),
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(source) => Err(DownstreamError::Api {
            what: "deleting the inventory".into(),
            source,
        }),
    }
}

/// The CRD gate's observations: for each CRD, whether it exists, is `Established`, and
/// every served version of its kind is discoverable.
pub async fn crd_states(
    client: &Client,
    crds: &[CrdInfo],
) -> Result<Vec<(CrdInfo, CrdState)>, DownstreamError> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut out = Vec::new();
    for crd in crds {
        let state = match api
            .get_opt(&crd.name)
            .await
            .map_err(api_err(format!("reading CRD {}", crd.name)))?
        {
            None => CrdState::Missing,
            Some(found) => {
                let established = found
                    .status
                    .and_then(|s| s.conditions)
                    .unwrap_or_default()
                    .iter()
                    .any(|c| c.type_ == "Established" && c.status == "True");
                if established {
                    discoverable(client, crd).await?
                } else {
                    CrdState::NotEstablished
                }
            }
        };
        out.push((crd.clone(), state));
    }
    Ok(out)
}

async fn discoverable(client: &Client, crd: &CrdInfo) -> Result<CrdState, DownstreamError> {
    for version in &crd.served {
        let group_version = format!("{}/{version}", crd.group);
        let found = match client.list_api_group_resources(&group_version).await {
            Ok(list) => list.resources.iter().any(|r| r.kind == crd.kind),
            Err(kube::Error::Api(s)) if s.code == 404 => false,
            Err(source) => {
                return Err(DownstreamError::Api {
                    what: format!("discovering {group_version}"),
                    source,
                });
            }
        };
        if !found {
            return Ok(CrdState::NotDiscoverable(format!(
                "{group_version}, Kind={}",
                crd.kind
            )));
        }
    }
    Ok(CrdState::Ready)
}

/// The pod-health probe: the release's pods in its namespace (union of both selectors,
/// deduplicated by UID) and, if there are none, whether any workload matches.
pub async fn probe_pods(
    client: &Client,
    namespace: &str,
    selectors: &[String],
) -> Result<Option<String>, DownstreamError> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let mut seen = BTreeSet::new();
    let mut found = Vec::new();
    for selector in selectors {
        let list = pods
            .list(&ListParams::default().labels(selector))
            .await
            .map_err(api_err(format!("listing pods {selector}")))?;
        for pod in list.items {
            if seen.insert(pod.uid().unwrap_or_else(|| pod.name_any())) {
                found.push(pod);
            }
        }
    }
    let workloads = if found.is_empty() {
        count_workloads(client, namespace, selectors).await?
    } else {
        0
    };
    Ok(health::pods_verdict(&found, workloads))
}

async fn count_workloads(
    client: &Client,
    namespace: &str,
    selectors: &[String],
) -> Result<usize, DownstreamError> {
    async fn count<K>(client: &Client, ns: &str, selector: &str) -> Result<usize, DownstreamError>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
            + Clone
            + serde::de::DeserializeOwned
            + std::fmt::Debug,
    {
        let api: Api<K> = Api::namespaced(client.clone(), ns);
        let list = api
            .list_metadata(&ListParams::default().labels(selector))
            .await
            .map_err(api_err(format!("listing {} {selector}", K::kind(&()))))?;
        Ok(list.items.len())
    }
    let mut total = 0;
    for s in selectors {
        total += count::<Deployment>(client, namespace, s).await?;
        total += count::<DaemonSet>(client, namespace, s).await?;
        total += count::<StatefulSet>(client, namespace, s).await?;
        total += count::<Job>(client, namespace, s).await?;
        total += count::<CronJob>(client, namespace, s).await?;
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::panic)]

    use super::*;

    #[tokio::test]
    async fn a_broken_kubeconfig_is_never_quoted() {
        let secret = "client-key-data: c2VjcmV0LWtleS1tYXRlcmlhbA== [unclosed";
        let Err(err) = connect(secret, Duration::from_secs(1)).await else {
            panic!("a broken kubeconfig was accepted");
        };
        let text = kontinuum_operator_common::error::chain(&err);
        assert!(text.contains("kubeconfig is unusable"), "{text}");
        assert!(!text.contains("c2VjcmV0"), "{text}");
        let no_context = "apiVersion: v1\nkind: Config\nclusters: []\nusers: []\ncontexts: []\n";
        let Err(err) = connect(no_context, Duration::from_secs(1)).await else {
            panic!("a kubeconfig without a context was accepted");
        };
        assert!(matches!(err, DownstreamError::Kubeconfig(_)), "{err}");
    }
}
