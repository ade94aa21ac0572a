//! Rendered charts: splitting `helm template` output into objects, finding the CRDs a chart
//! ships, and the order objects are applied in. Pure.

use serde_json::Value;

/// A CustomResourceDefinition a chart ships, and what it must serve.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CrdInfo {
    /// `metadata.name`, e.g. `gateways.gateway.networking.k8s.io`.
    pub name: String,
    /// `spec.group`.
    pub group: String,
    /// `spec.names.kind`.
    pub kind: String,
    /// The versions with `served: true`.
    pub served: Vec<String>,
}

/// The identity of one applied object (the KubectlApply inventory holds a list of them).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectId {
    /// `apiVersion`.
    pub api_version: String,
    /// `kind`.
    pub kind: String,
    /// Namespace, empty for cluster-scoped objects (and for namespaced objects the chart
    /// left without one, which go to the release namespace).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
}

impl std::fmt::Display for ObjectId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.namespace.is_empty() {
            write!(f, "{}/{}", self.kind, self.name)
        } else {
            write!(f, "{}/{}/{}", self.kind, self.namespace, self.name)
        }
    }
}

/// Why a rendering could not be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("the rendered chart is not valid YAML: {0}")]
pub struct ParseError(String);

/// Splits a multi-document rendering into its objects: documents that are empty (only
/// comments) are dropped, `List` kinds are flattened.
pub fn parse(rendered: &str) -> Result<Vec<Value>, ParseError> {
    let docs: Vec<Value> =
        serde_saphyr::from_multiple(rendered).map_err(|e| ParseError(e.to_string()))?;
    let mut out = Vec::new();
    for doc in docs {
        flatten(doc, &mut out);
    }
    Ok(out)
}

fn flatten(doc: Value, out: &mut Vec<Value>) {
    if let Value::Object(map) = doc {
        {
            let is_list = map
                .get("kind")
                .and_then(Value::as_str)
                .is_some_and(|k| k.ends_with("List"))
                && map.get("items").is_some_and(Value::is_array);
            if is_list {
                if let Some(Value::Array(items)) = map.get("items") {
                    for item in items {
                        flatten(item.clone(), out);
                    }
                }
            } else if map.contains_key("kind") && map.contains_key("apiVersion") {
                out.push(Value::Object(map));
            }
        }
    }
}

/// The identity of an object (`None` if it lacks apiVersion, kind or name).
pub fn object_id(object: &Value) -> Option<ObjectId> {
    Some(ObjectId {
        api_version: object.get("apiVersion")?.as_str()?.to_string(),
        kind: object.get("kind")?.as_str()?.to_string(),
        namespace: object
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string(),
        name: object.pointer("/metadata/name")?.as_str()?.to_string(),
    })
}

/// Whether an object is a CustomResourceDefinition.
pub fn is_crd(object: &Value) -> bool {
    object.get("kind").and_then(Value::as_str) == Some("CustomResourceDefinition")
        && object
            .get("apiVersion")
            .and_then(Value::as_str)
            .is_some_and(|v| v.starts_with("apiextensions.k8s.io/"))
}

/// Every CRD in `objects`, with its served versions.
pub fn crds(objects: &[Value]) -> Vec<CrdInfo> {
    let mut out: Vec<CrdInfo> = objects
        .iter()
        .filter(|o| is_crd(o))
        .filter_map(|o| {
            let served = o
                .pointer("/spec/versions")
                .and_then(Value::as_array)
                .map(|versions| {
                    versions
                        .iter()
                        .filter(|v| v.get("served").and_then(Value::as_bool) == Some(true))
                        .filter_map(|v| v.get("name").and_then(Value::as_str))
                        .map(str::to_string)
                        .collect()
                })
                .unwrap_or_default();
            Some(CrdInfo {
                name: o.pointer("/metadata/name")?.as_str()?.to_string(),
                group: o.pointer("/spec/group")?.as_str()?.to_string(),
                kind: o.pointer("/spec/names/kind")?.as_str()?.to_string(),
                served,
            })
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// The order to apply in: Namespaces, then CRDs, then everything else; by name within each.
pub fn apply_order(objects: &mut [Value]) {
    let rank = |o: &Value| match o.get("kind").and_then(Value::as_str) {
        Some("Namespace") => 0,
        Some("CustomResourceDefinition") => 1,
        _ => 2,
    };
    objects.sort_by(|a, b| {
        rank(a)
            .cmp(&rank(b))
            .then_with(|| object_id(a).cmp(&object_id(b)))
    });
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const RENDERED: &str = r"---
# Source: x/templates/empty.yaml
---
# Source: x/templates/crd.yaml
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.example.com
spec:
  group: example.com
  names: { kind: Widget, plural: widgets }
  scope: Namespaced
  versions:
  - { name: v1, served: true, storage: true }
  - { name: v1alpha1, served: false, storage: false }
  - { name: v1beta1, served: true, storage: false }
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  labels: { app.kubernetes.io/instance: x }
---
apiVersion: v1
kind: ConfigMapList
items:
- apiVersion: v1
  kind: ConfigMap
  metadata: { name: a, namespace: other }
---
apiVersion: v1
kind: Namespace
metadata: { name: zz }
";

    #[test]
    fn parses_documents_drops_empty_ones_and_flattens_lists() {
        let objects = parse(RENDERED).unwrap();
        let ids: Vec<String> = objects
            .iter()
            .map(|o| object_id(o).unwrap().to_string())
            .collect();
        assert_eq!(
            ids,
            [
                "CustomResourceDefinition/widgets.example.com",
                "Deployment/web",
                "ConfigMap/other/a",
                "Namespace/zz"
            ]
        );
        assert!(parse("a: [unclosed").is_err());
    }

    #[test]
    fn finds_crds_with_their_served_versions() {
        let objects = parse(RENDERED).unwrap();
        assert_eq!(
            crds(&objects),
            [CrdInfo {
                name: "widgets.example.com".into(),
                group: "example.com".into(),
                kind: "Widget".into(),
                served: vec!["v1".into(), "v1beta1".into()],
            }]
        );
        assert!(crds(&[json!({"apiVersion": "v1", "kind": "ConfigMap"})]).is_empty());
    }

    #[test]
    fn namespaces_and_crds_are_applied_first() {
        let mut objects = parse(RENDERED).unwrap();
        apply_order(&mut objects);
        let kinds: Vec<&str> = objects
            .iter()
            .map(|o| o["kind"].as_str().unwrap())
            .collect();
        assert_eq!(
            kinds,
            // then by apiVersion (apps/v1 before v1), kind, namespace, name
            [
                "Namespace",
                "CustomResourceDefinition",
                "Deployment",
                "ConfigMap"
            ]
        );
    }

    #[test]
    fn the_real_gateway_api_crds_parse() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../e2e/fixtures/charts/gateway-api-crds/files/standard"
        );
        let Ok(entries) = std::fs::read_dir(path) else {
            panic!("fixture CRDs missing at {path}");
        };
        let mut text = String::new();
        for entry in entries {
            text.push_str("---\n");
            text.push_str(&std::fs::read_to_string(entry.unwrap().path()).unwrap());
        }
        let found = crds(&parse(&text).unwrap());
        let gateways = found
            .iter()
            .find(|c| c.name == "gateways.gateway.networking.k8s.io")
            .unwrap();
        assert_eq!(gateways.served, ["v1", "v1beta1"]);
        let tls = found.iter().find(|c| c.kind == "BackendTLSPolicy").unwrap();
        assert_eq!(tls.served, ["v1"], "v1alpha3 is not served");
    }
}
