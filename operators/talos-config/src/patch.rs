//! Machine-config patches, merged as Talos merges a strategic merge patch (`talosctl
//! machineconfig patch`, `gen config --config-patch`).
//!
//! A patch is one YAML document. It patches the document of the config it names: the
//! legacy `v1alpha1` document when it has no `kind`, else the typed document with the same
//! `apiVersion`, `kind` and `name`; a typed document the config does not have is appended.
//! Within a document, Talos' merge rules:
//!
//! * mappings merge key by key, the patch's value winning; a `null` in the patch leaves the
//!   value as it is;
//! * lists are appended to, except `cluster.network.podSubnets` and
//!   `cluster.network.serviceSubnets` (replaced), `machine.network.interfaces` (an item
//!   merges into the one with the same `interface`, or the same `deviceSelector`),
//!   `machine.network.interfaces[].vlans` (merged on `vlanId`) and an
//!   `ExtensionServiceConfig`'s `configFiles` (merged on `mountPath`);
//! * `cluster.apiServer.auditPolicy` is replaced, not merged;
//! * `$patch: delete` removes what it sits in: a mapping value (the key goes), a keyed list
//!   item (matched as above) or a whole typed document (never the `v1alpha1` document).
//!
//! The result is not checked here: the caller validates it (the bootstrapper with
//! `kontinuum-talos-validate`, as Talos decodes and validates the merged config).

use std::fmt;

use serde_json::{Map, Value};

use crate::config::{MachineConfig, to_yaml};
use crate::secrets::Sensitive;

/// The `$patch` directive key.
const DIRECTIVE: &str = "$patch";

/// Lists Talos replaces instead of appending to (document paths).
const REPLACED_LISTS: &[&str] = &[
    ".cluster.network.podSubnets",
    ".cluster.network.serviceSubnets",
];

/// Mappings Talos replaces instead of merging.
const REPLACED_MAPS: &[&str] = &[".cluster.apiServer.auditPolicy"];

/// Why a patch could not be merged. `path` is the field in the patch (`.machine.install`),
/// never a value: configs hold secrets.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatchError {
    /// `$patch: delete` on the `v1alpha1` document.
    #[error("the v1alpha1 document cannot be deleted")]
    DeleteMainDocument,
    /// A `$patch` directive other than `delete`.
    #[error("{path}: unsupported $patch directive (only \"delete\" is)")]
    UnsupportedDirective {
        /// Where it is.
        path: String,
    },
    /// `$patch: delete` in a list item of a list that has no merge key.
    #[error("{path}: $patch: delete needs a list merged on a key (interface, vlanId, mountPath)")]
    DeleteInUnkeyedList {
        /// Where it is.
        path: String,
    },
    /// A typed document patch without `apiVersion`.
    #[error("a patch of a {kind} document needs apiVersion")]
    MissingApiVersion {
        /// The document kind.
        kind: String,
    },
    /// The machine config itself is not a YAML document stream.
    #[error("the machine config to patch is not valid YAML")]
    InvalidConfig,
    /// Writing the patched config failed.
    #[error("writing the patched config failed")]
    Render,
}

/// A machine config read into documents, patched in place, then written back.
pub struct PatchedConfig {
    documents: Vec<Value>,
}

impl fmt::Debug for PatchedConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PatchedConfig([REDACTED])")
    }
}

impl PatchedConfig {
    /// Reads `config`'s documents.
    pub fn new(config: &MachineConfig) -> Result<Self, PatchError> {
        let documents: Vec<Value> =
            serde_saphyr::from_multiple(config.expose()).map_err(|_| PatchError::InvalidConfig)?;
        Ok(Self {
            documents: documents.into_iter().filter(|d| !d.is_null()).collect(),
        })
    }

    /// Merges one patch document into the config.
    pub fn apply(&mut self, patch: &Map<String, Value>) -> Result<(), PatchError> {
        let kind = patch.get("kind").and_then(Value::as_str);
        let delete = directive(patch, "")?;
        let Some(kind) = kind else {
            if delete {
                return Err(PatchError::DeleteMainDocument);
            }
            let Some(main) = self.documents.iter_mut().find(|d| is_main(d)) else {
                self.documents.insert(0, Value::Object(stripped(patch)));
                return Ok(());
            };
            return merge_map(main, patch, "", None);
        };
        let api_version = patch.get("apiVersion").and_then(Value::as_str);
        if api_version.is_none() {
            return Err(PatchError::MissingApiVersion {
                kind: kind.to_owned(),
            });
        }
        let name = patch.get("name").and_then(Value::as_str);
        let same = |d: &Value| {
            d.get("kind").and_then(Value::as_str) == Some(kind)
                && d.get("apiVersion").and_then(Value::as_str) == api_version
                && d.get("name").and_then(Value::as_str) == name
        };
        let found = self.documents.iter().position(same);
        match (found, delete) {
            (Some(i), true) => {
                self.documents.remove(i);
                Ok(())
            }
            (None, true) => Ok(()),
            (Some(i), false) => merge_map(&mut self.documents[i], patch, "", Some(kind)),
            (None, false) => {
                self.documents.push(Value::Object(stripped(patch)));
                Ok(())
            }
        }
    }

    /// The patched config, as multi-document YAML.
    pub fn render(&self) -> Result<MachineConfig, PatchError> {
        let mut yaml = String::new();
        for (i, document) in self.documents.iter().enumerate() {
            if i > 0 {
                yaml.push_str("---\n");
            }
            let text = to_yaml(document).map_err(|_| PatchError::Render)?;
            yaml.push_str(&text);
            if !yaml.ends_with('\n') {
                yaml.push('\n');
            }
        }
        Ok(MachineConfig::from_sensitive(Sensitive::new(yaml)))
    }
}

/// The legacy `v1alpha1` document: no `kind`.
fn is_main(document: &Value) -> bool {
    document.get("kind").is_none()
}

/// Whether `map` carries `$patch: delete`; any other directive is refused.
fn directive(map: &Map<String, Value>, path: &str) -> Result<bool, PatchError> {
    match map.get(DIRECTIVE) {
        None => Ok(false),
        Some(Value::String(s)) if s == "delete" => Ok(true),
        Some(_) => Err(PatchError::UnsupportedDirective {
            path: display_path(path),
        }),
    }
}

fn display_path(path: &str) -> String {
    if path.is_empty() {
        ".".to_owned()
    } else {
        path.to_owned()
    }
}

/// `value` without `$patch` keys anywhere (new content: there is nothing to delete in it).
fn stripped_value(value: &Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(stripped(map)),
        Value::Array(items) => Value::Array(items.iter().map(stripped_value).collect()),
        other => other.clone(),
    }
}

fn stripped(map: &Map<String, Value>) -> Map<String, Value> {
    map.iter()
        .filter(|(k, _)| k.as_str() != DIRECTIVE)
        .map(|(k, v)| (k.clone(), stripped_value(v)))
        .collect()
}

/// Merges mapping `changes` into `target` (a mapping, else replaced by one) at `path`;
/// `kind` is the typed document's kind (`None` for `v1alpha1`).
fn merge_map(
    target: &mut Value,
    changes: &Map<String, Value>,
    path: &str,
    kind: Option<&str>,
) -> Result<(), PatchError> {
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let Value::Object(map) = target else {
        return Ok(());
    };
    for (key, value) in changes {
        if key == DIRECTIVE {
            continue;
        }
        let child = format!("{path}.{key}");
        match value {
            Value::Null => {}
            Value::Object(inner) if directive(inner, &child)? => {
                map.remove(key);
            }
            Value::Object(inner) if REPLACED_MAPS.contains(&child.as_str()) && kind.is_none() => {
                map.insert(key.clone(), Value::Object(stripped(inner)));
            }
            Value::Object(inner) => {
                let slot = map.entry(key.clone()).or_insert(Value::Null);
                merge_map(slot, inner, &child, kind)?;
            }
            Value::Array(items) => {
                let slot = map.entry(key.clone()).or_insert(Value::Null);
                merge_list(slot, items, &child, kind)?;
            }
            scalar => {
                map.insert(key.clone(), scalar.clone());
            }
        }
    }
    Ok(())
}

/// The merge keys of the list at `path`, if Talos merges its items.
fn merge_keys(path: &str, kind: Option<&str>) -> Option<&'static [&'static str]> {
    match kind {
        None if path == ".machine.network.interfaces" => Some(&["interface", "deviceSelector"]),
        None if path.starts_with(".machine.network.interfaces[") && path.ends_with("].vlans") => {
            Some(&["vlanId"])
        }
        Some("ExtensionServiceConfig") if path == ".configFiles" => Some(&["mountPath"]),
        _ => None,
    }
}

/// The index of the item of `list` that `item` merges into: the first with an equal,
/// present value of one of `keys`, tried in order.
fn matching(list: &[Value], item: &Map<String, Value>, keys: &[&str]) -> Option<usize> {
    keys.iter().find_map(|key| {
        let wanted = item.get(*key).filter(|v| !v.is_null())?;
        list.iter().position(|x| x.get(*key) == Some(wanted))
    })
}

/// Merges list `changes` into `target` at `path`.
fn merge_list(
    target: &mut Value,
    changes: &[Value],
    path: &str,
    kind: Option<&str>,
) -> Result<(), PatchError> {
    let new: Vec<Value> = changes.iter().map(stripped_value).collect();
    if (kind.is_none() && REPLACED_LISTS.contains(&path)) || !target.is_array() {
        // Replaced, or nothing to append to. A delete directive in new items deletes
        // nothing (they were stripped).
        *target = Value::Array(new);
        return Ok(());
    }
    let Value::Array(list) = target else {
        return Ok(());
    };
    let Some(keys) = merge_keys(path, kind) else {
        if let Some(i) = changes
            .iter()
            .position(|item| item.as_object().is_some_and(|m| m.contains_key(DIRECTIVE)))
        {
            return Err(PatchError::DeleteInUnkeyedList {
                path: format!("{path}[{i}]"),
            });
        }
        list.extend(new);
        return Ok(());
    };
    for (i, item) in changes.iter().enumerate() {
        let item_path = format!("{path}[{i}]");
        let Value::Object(item) = item else {
            list.push(item.clone());
            continue;
        };
        let delete = directive(item, &item_path)?;
        match (matching(list, item, keys), delete) {
            (Some(at), true) => {
                list.remove(at);
            }
            (None, true) => {}
            (Some(at), false) => merge_map(&mut list[at], item, &item_path, kind)?,
            (None, false) => list.push(Value::Object(stripped(item))),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(yaml: &str) -> PatchedConfig {
        let documents: Vec<Value> = serde_saphyr::from_multiple(yaml).unwrap();
        PatchedConfig { documents }
    }

    fn patch(yaml: &str) -> Map<String, Value> {
        match serde_saphyr::from_str::<Value>(yaml).unwrap() {
            Value::Object(m) => m,
            other => panic!("not a mapping: {other}"),
        }
    }

    fn docs(c: &PatchedConfig) -> Vec<Value> {
        c.documents.clone()
    }

    fn yaml_docs(yaml: &str) -> Vec<Value> {
        serde_saphyr::from_multiple(yaml).unwrap()
    }

    const BASE: &str = "\
version: v1alpha1
machine:
  type: worker
  certSANs: [a]
  install:
    diskSelector: {}
    wipe: false
  network:
    interfaces:
      - interface: eth0
        dhcp: true
        vlans:
          - vlanId: 10
            mtu: 1500
cluster:
  network:
    podSubnets: [10.244.0.0/16]
    serviceSubnets: [10.96.0.0/12]
  apiServer:
    auditPolicy:
      apiVersion: audit.k8s.io/v1
      rules: [{level: Metadata}]
---
apiVersion: v1alpha1
kind: HostnameConfig
hostname: w-1
---
apiVersion: v1alpha1
kind: ExtensionServiceConfig
name: foo
configFiles:
  - mountPath: /etc/a
    content: one
";

    /// Every rule of the module doc, each against the base config, in one table.
    #[test]
    fn merges_as_talos_does() {
        let cases: &[(&str, &str, &str)] = &[
            (
                "scalars win, mappings merge",
                "machine: {install: {disk: /dev/sda, wipe: true}}",
                "/0/machine/install",
            ),
            (
                "a list is appended to",
                "machine: {certSANs: [b]}",
                "/0/machine/certSANs",
            ),
            (
                "podSubnets is replaced",
                "cluster: {network: {podSubnets: [10.1.0.0/16]}}",
                "/0/cluster/network/podSubnets",
            ),
            (
                "an interface merges on its name",
                "machine: {network: {interfaces: [{interface: eth0, addresses: [10.0.0.5/24]}]}}",
                "/0/machine/network/interfaces",
            ),
            (
                "a vlan merges on its id",
                "machine: {network: {interfaces: [{interface: eth0, vlans: [{vlanId: 10, mtu: 9000}, {vlanId: 20}]}]}}",
                "/0/machine/network/interfaces/0/vlans",
            ),
            (
                "auditPolicy is replaced",
                "cluster: {apiServer: {auditPolicy: {apiVersion: audit.k8s.io/v1, rules: []}}}",
                "/0/cluster/apiServer/auditPolicy",
            ),
            (
                "$patch: delete removes a key",
                "machine: {install: {diskSelector: {$patch: delete}}}",
                "/0/machine/install",
            ),
            (
                "$patch: delete removes a keyed item",
                "machine: {network: {interfaces: [{interface: eth0, $patch: delete}]}}",
                "/0/machine/network/interfaces",
            ),
            (
                "null leaves a value",
                "machine: {type: null}",
                "/0/machine/type",
            ),
            (
                "configFiles merge on mountPath",
                "apiVersion: v1alpha1\nkind: ExtensionServiceConfig\nname: foo\nconfigFiles: [{mountPath: /etc/a, content: two}, {mountPath: /etc/b, content: three}]",
                "/2/configFiles",
            ),
        ];
        let wanted: &[&str] = &[
            "{disk: /dev/sda, diskSelector: {}, wipe: true}",
            "[a, b]",
            "[10.1.0.0/16]",
            "[{interface: eth0, dhcp: true, addresses: [10.0.0.5/24], vlans: [{vlanId: 10, mtu: 1500}]}]",
            "[{vlanId: 10, mtu: 9000}, {vlanId: 20}]",
            "{apiVersion: audit.k8s.io/v1, rules: []}",
            "{wipe: false}",
            "[]",
            "worker",
            "[{mountPath: /etc/a, content: two}, {mountPath: /etc/b, content: three}]",
        ];
        for ((name, p, pointer), want) in cases.iter().zip(wanted) {
            let mut c = config(BASE);
            c.apply(&patch(p)).unwrap_or_else(|e| panic!("{name}: {e}"));
            let got = docs(&c)
                .iter()
                .cloned()
                .collect::<Value>()
                .pointer(pointer)
                .cloned();
            let want: Value = serde_saphyr::from_str(want).unwrap();
            assert_eq!(got, Some(want), "{name}");
        }
    }

    #[test]
    fn typed_documents_match_on_kind_api_version_and_name() {
        let mut c = config(BASE);
        // Another name: appended, not merged into `foo`.
        c.apply(&patch(
            "apiVersion: v1alpha1\nkind: ExtensionServiceConfig\nname: bar\nconfigFiles: []",
        ))
        .unwrap();
        // A new kind: appended, its directives stripped.
        c.apply(&patch(
            "apiVersion: v1alpha1\nkind: RegistryMirrorConfig\nname: docker.io\nendpoints: [{url: 'https://m.example', $patch: delete}]",
        ))
        .unwrap();
        // A document deleted.
        c.apply(&patch(
            "apiVersion: v1alpha1\nkind: HostnameConfig\n$patch: delete",
        ))
        .unwrap();
        let got = docs(&c);
        let kinds: Vec<_> = got
            .iter()
            .map(|d| d.get("kind").and_then(Value::as_str).unwrap_or("v1alpha1"))
            .collect();
        assert_eq!(
            kinds,
            [
                "v1alpha1",
                "ExtensionServiceConfig",
                "ExtensionServiceConfig",
                "RegistryMirrorConfig"
            ]
        );
        assert_eq!(
            got[3].pointer("/endpoints/0"),
            Some(&serde_saphyr::from_str::<Value>("{url: 'https://m.example'}").unwrap())
        );
    }

    #[test]
    fn refuses_what_cannot_be_merged() {
        let cases: &[(&str, PatchError)] = &[
            (
                "version: v1alpha1\n$patch: delete",
                PatchError::DeleteMainDocument,
            ),
            (
                "machine: {install: {$patch: replace}}",
                PatchError::UnsupportedDirective {
                    path: ".machine.install".into(),
                },
            ),
            (
                "machine: {certSANs: [{$patch: delete}]}",
                PatchError::DeleteInUnkeyedList {
                    path: ".machine.certSANs[0]".into(),
                },
            ),
            (
                "kind: HostnameConfig\nhostname: x",
                PatchError::MissingApiVersion {
                    kind: "HostnameConfig".into(),
                },
            ),
        ];
        for (p, want) in cases {
            let mut c = config(BASE);
            assert_eq!(c.apply(&patch(p)).as_ref(), Err(want), "{p}");
        }
    }

    #[test]
    fn renders_back_to_the_same_documents() {
        let mut c = config(BASE);
        c.apply(&patch("machine: {certSANs: [b]}")).unwrap();
        let rendered = c.render().unwrap();
        let mut want = yaml_docs(BASE);
        want[0]["machine"]["certSANs"] = serde_json::json!(["a", "b"]);
        assert_eq!(yaml_docs(rendered.expose()), want);
    }
}
