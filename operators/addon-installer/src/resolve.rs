//! Resolution of an Addon into an install request: the built-in defaults (data files under
//! `src/defaults/`), the chart mirror, `spec` overrides, `$cel` values and the hash of the
//! desired state. Pure: no I/O, no clock.

use std::collections::BTreeMap;

use kontinuum_crds::v1alpha2::{Addon, BuiltinAddon, ProvisioningMethod};
use serde::Deserialize;
use serde_json::{Map, Value};

/// Priority of an Addon that sets none and is not a built-in.
pub const DEFAULT_PRIORITY: i32 = 100;

/// The KubePrism port Talos serves the API server on, on every node (`ctx.talos.kubePrism.port`).
pub const KUBE_PRISM_PORT: i64 = 7445;

/// The defaults of one built-in, as kept in its data file.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BuiltinDefaults {
    /// The chart.
    pub chart: ChartDefaults,
    /// Install namespace.
    pub namespace: String,
    /// Wave and method.
    pub lifecycle: LifecycleDefaults,
    /// Default values; may hold `$cel` expressions.
    #[serde(default)]
    pub values: Map<String, Value>,
}

/// A built-in's chart.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ChartDefaults {
    /// Helm repository URL; none for `oci://` names.
    #[serde(default)]
    pub repo: Option<String>,
    /// Chart name or `oci://` reference.
    pub name: String,
    /// Pinned version.
    pub version: String,
}

/// A built-in's lifecycle.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LifecycleDefaults {
    /// Install wave.
    pub priority: i32,
    /// How the chart reaches the cluster.
    pub method: ProvisioningMethod,
}

/// The data file of a built-in.
pub fn builtin_file(builtin: BuiltinAddon) -> &'static str {
    match builtin {
        BuiltinAddon::GatewayApiCrds => include_str!("defaults/gateway-api-crds.yaml"),
        BuiltinAddon::Cilium => include_str!("defaults/cilium.yaml"),
        BuiltinAddon::CertManager => include_str!("defaults/cert-manager.yaml"),
    }
}

/// The parsed defaults of a built-in. The files are part of the binary and checked by the
/// unit tests, so an error here is a build defect; it is still reported, not panicked on.
pub fn builtin_defaults(builtin: BuiltinAddon) -> Result<BuiltinDefaults, ResolveError> {
    serde_saphyr::from_str(builtin_file(builtin)).map_err(|e| ResolveError::Defaults {
        release: builtin.release_name(),
        message: e.to_string(),
    })
}

/// Where a chart comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChartRef {
    /// Helm repository URL (`--repo`); `None` for an `oci://` reference.
    pub repo: Option<String>,
    /// Chart name in the repository, or an `oci://` reference.
    pub name: String,
    /// Version; `None` means the latest.
    pub version: Option<String>,
}

impl ChartRef {
    /// The chart's name without repository: the last path segment of an OCI reference.
    pub fn short_name(&self) -> &str {
        self.name.rsplit('/').next().unwrap_or(&self.name)
    }
}

/// Everything needed to install one Addon.
#[derive(Clone, Debug, PartialEq)]
pub struct InstallRequest {
    /// Helm release name.
    pub release: String,
    /// Install namespace in the downstream cluster.
    pub namespace: String,
    /// The chart.
    pub chart: ChartRef,
    /// How it is installed.
    pub method: ProvisioningMethod,
    /// Values with every `$cel` resolved and the user's values merged over the defaults.
    pub values: Map<String, Value>,
    /// Hash of chart, version, method and values: a change means an upgrade is due.
    pub hash: String,
}

/// Why an Addon could not be resolved. Every variant is a spec problem (a condition).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ResolveError {
    /// A built-in's data file is broken.
    #[error("built-in defaults of {release} are invalid: {message}")]
    Defaults {
        /// The built-in.
        release: &'static str,
        /// The parser's message.
        message: String,
    },
    /// No chart for a non-built-in.
    #[error(
        "addon has no chart repo/name — set spec.chart (no built-in default for this ReleaseName)"
    )]
    NoChart,
    /// No namespace for a non-built-in.
    #[error(
        "addon has no namespace — set spec.namespace (no built-in default for this ReleaseName)"
    )]
    NoNamespace,
    /// A `$cel` expression does not compile.
    #[error("values.{path}: CEL expression {expression:?} does not compile: {message}")]
    CelCompile {
        /// Where in the values.
        path: String,
        /// The expression.
        expression: String,
        /// The compiler's message.
        message: String,
    },
    /// A `$cel` expression failed to evaluate.
    #[error("values.{path}: CEL expression {expression:?} failed: {message}")]
    CelEval {
        /// Where in the values.
        path: String,
        /// The expression.
        expression: String,
        /// The evaluator's message.
        message: String,
    },
}

/// Resolves an Addon. `taloscluster` is the TalosCluster as JSON (for `ctx.taloscluster`);
/// `mirror` replaces the repository of every built-in.
pub fn resolve(
    addon: &Addon,
    taloscluster: &Value,
    mirror: Option<&str>,
) -> Result<InstallRequest, ResolveError> {
    let release = addon.release_name().to_string();
    let defaults = addon.builtin().map(builtin_defaults).transpose()?;
    let spec_chart = addon.spec.chart.clone().unwrap_or_default();

    let default_chart = defaults
        .as_ref()
        .map(|d| mirrored(&d.chart, &release, mirror));
    let name = spec_chart
        .name
        .clone()
        .or_else(|| default_chart.as_ref().map(|c| c.name.clone()))
        .ok_or(ResolveError::NoChart)?;
    let oci = name.starts_with("oci://");
    let repo = if oci {
        None
    } else {
        Some(
            spec_chart
                .repo
                .clone()
                .or_else(|| default_chart.as_ref().and_then(|c| c.repo.clone()))
                .ok_or(ResolveError::NoChart)?,
        )
    };
    let version = spec_chart
        .version
        .clone()
        .or_else(|| default_chart.as_ref().and_then(|c| c.version.clone()));
    let namespace = namespace(addon, defaults.as_ref())?;
    let method = method(addon, defaults.as_ref());

    let ctx = cel_context(taloscluster);
    let mut values = match &defaults {
        Some(d) => resolve_cel(&Value::Object(d.values.clone()), &ctx, "")?,
        None => Value::Object(Map::new()),
    };
    if let Some(user) = &addon.spec.values {
        let user = resolve_cel(&Value::Object(user.clone()), &ctx, "")?;
        merge(&mut values, user);
    }
    let values = match values {
        Value::Object(map) => map,
        _ => Map::new(),
    };
    let chart = ChartRef {
        repo,
        name,
        version,
    };
    let hash = desired_hash(&chart, method, &values);
    Ok(InstallRequest {
        release,
        namespace,
        chart,
        method,
        values,
        hash,
    })
}

/// Where an Addon installs and how, without resolving its values (for uninstalling even
/// when its values no longer resolve): `(release, namespace, method)`.
pub fn target(addon: &Addon) -> Result<(String, String, ProvisioningMethod), ResolveError> {
    let defaults = addon.builtin().map(builtin_defaults).transpose()?;
    let namespace = namespace(addon, defaults.as_ref())?;
    Ok((
        addon.release_name().to_string(),
        namespace,
        method(addon, defaults.as_ref()),
    ))
}

/// A built-in's chart, through the mirror if one is set: the mirror is a Helm repository
/// (or an `oci://` registry path) holding every built-in under its release name, so the
/// OCI default `oci://docker.io/envoyproxy/gateway-crds-helm` becomes chart
/// `gateway-api-crds` of the mirror.
fn mirrored(chart: &ChartDefaults, release: &str, mirror: Option<&str>) -> ChartRef {
    match mirror {
        Some(m) if m.starts_with("oci://") => ChartRef {
            repo: None,
            name: format!("{}/{release}", m.trim_end_matches('/')),
            version: Some(chart.version.clone()),
        },
        Some(m) => ChartRef {
            repo: Some(m.to_string()),
            name: release.to_string(),
            version: Some(chart.version.clone()),
        },
        None => ChartRef {
            repo: chart.repo.clone(),
            name: chart.name.clone(),
            version: Some(chart.version.clone()),
        },
    }
}

/// `spec.namespace`, else the built-in's.
fn namespace(addon: &Addon, defaults: Option<&BuiltinDefaults>) -> Result<String, ResolveError> {
    addon
        .spec
        .namespace
        .as_ref()
        .map(|n| n.name.clone())
        .or_else(|| defaults.map(|d| d.namespace.clone()))
        .ok_or(ResolveError::NoNamespace)
}

fn method(addon: &Addon, defaults: Option<&BuiltinDefaults>) -> ProvisioningMethod {
    addon
        .spec
        .lifecycle
        .as_ref()
        .and_then(|l| l.provisioning.as_ref())
        .and_then(|p| p.method)
        .or_else(|| defaults.map(|d| d.lifecycle.method))
        .unwrap_or_default()
}

/// The wave of an Addon: `spec.lifecycle.priority`, else its built-in's, else 100.
pub fn priority(addon: &Addon) -> i32 {
    addon
        .spec
        .lifecycle
        .as_ref()
        .and_then(|l| l.priority)
        .or_else(|| {
            addon
                .builtin()
                .and_then(|b| builtin_defaults(b).ok())
                .map(|d| d.lifecycle.priority)
        })
        .unwrap_or(DEFAULT_PRIORITY)
}

/// The CEL `ctx` variable: `taloscluster` (with `status.controlPlane.replicas` injected as
/// 0 when absent, so expressions over it evaluate before the bootstrapper reports it) and
/// `talos.kubePrism.port`.
pub fn cel_context(taloscluster: &Value) -> Value {
    let mut cluster = taloscluster.clone();
    if let Value::Object(root) = &mut cluster {
        let status = root
            .entry("status")
            .or_insert_with(|| Value::Object(Map::new()));
        if let Value::Object(status) = status {
            let cp = status
                .entry("controlPlane")
                .or_insert_with(|| Value::Object(Map::new()));
            if let Value::Object(cp) = cp {
                cp.entry("replicas").or_insert(Value::from(0));
            }
        }
    }
    serde_json::json!({
        "taloscluster": cluster,
        "talos": { "kubePrism": { "port": KUBE_PRISM_PORT } },
    })
}

/// Replaces every map node that has exactly one key, `$cel`, with a string value by the
/// value of that expression over `ctx`.
pub fn resolve_cel(value: &Value, ctx: &Value, path: &str) -> Result<Value, ResolveError> {
    match value {
        Value::Object(map) => {
            if map.len() == 1
                && let Some(Value::String(expression)) = map.get("$cel")
            {
                return eval_cel(expression, ctx, path);
            }
            let mut out = Map::new();
            for (key, child) in map {
                let child_path = if path.is_empty() {
                    key.clone()
                } else {
                    format!("{path}.{key}")
                };
                out.insert(key.clone(), resolve_cel(child, ctx, &child_path)?);
            }
            Ok(Value::Object(out))
        }
        Value::Array(items) => items
            .iter()
            .enumerate()
            .map(|(i, item)| resolve_cel(item, ctx, &format!("{path}[{i}]")))
            .collect::<Result<Vec<_>, _>>()
            .map(Value::Array),
        other => Ok(other.clone()),
    }
}

fn eval_cel(expression: &str, ctx: &Value, path: &str) -> Result<Value, ResolveError> {
    let program = cel::Program::compile(expression).map_err(|e| ResolveError::CelCompile {
        path: path.to_string(),
        expression: expression.to_string(),
        message: e.to_string().trim().to_string(),
    })?;
    let eval_err = |message: String| ResolveError::CelEval {
        path: path.to_string(),
        expression: expression.to_string(),
        message,
    };
    let mut context = cel::Context::default();
    let ctx_value = cel::to_value(ctx).map_err(|e| eval_err(e.to_string()))?;
    context.add_variable_from_value("ctx", ctx_value);
    let result = program
        .execute(&context)
        .map_err(|e| eval_err(e.to_string()))?;
    result.json().map_err(|e| eval_err(e.to_string()))
}

/// Deep-merges `over` into `base`: maps merge key by key (`over` wins), anything else
/// (lists included) replaces.
pub fn merge(base: &mut Value, over: Value) {
    match (base, over) {
        (Value::Object(base), Value::Object(over)) => {
            for (key, value) in over {
                match base.get_mut(&key) {
                    Some(existing) => merge(existing, value),
                    None => {
                        base.insert(key, value);
                    }
                }
            }
        }
        (base, over) => *base = over,
    }
}

/// Hash of the desired state: chart source, version, method and values (canonical JSON:
/// keys sorted). Hex, 32 characters, so it fits a label value.
pub fn desired_hash(
    chart: &ChartRef,
    method: ProvisioningMethod,
    values: &Map<String, Value>,
) -> String {
    let canonical = serde_json::json!({
        "repo": chart.repo,
        "name": chart.name,
        "version": chart.version,
        "method": method,
        "values": sorted(&Value::Object(values.clone())),
    });
    let mut digest = kontinuum_crds::names::sha256_hex(canonical.to_string().as_bytes());
    digest.truncate(32);
    digest
}

fn sorted(value: &Value) -> Value {
    match value {
        Value::Object(map) => {
            let ordered: BTreeMap<&String, Value> =
                map.iter().map(|(k, v)| (k, sorted(v))).collect();
            Value::Object(ordered.into_iter().map(|(k, v)| (k.clone(), v)).collect())
        }
        Value::Array(items) => Value::Array(items.iter().map(sorted).collect()),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use kontinuum_crds::v1alpha2::AddonSpec;
    use serde_json::json;

    use super::*;

    fn addon(spec: Value) -> Addon {
        let spec: AddonSpec = serde_json::from_value(spec).unwrap();
        let mut addon = Addon::new("c1-x", spec);
        addon.metadata.namespace = Some("ns".into());
        addon
    }

    fn builtin(release: &str) -> Addon {
        addon(json!({ "talosClusterRef": { "name": "c1" }, "releaseName": release }))
    }

    fn cluster(replicas: Option<i32>) -> Value {
        match replicas {
            Some(r) => {
                json!({ "metadata": { "name": "c1" }, "status": { "controlPlane": { "replicas": r } } })
            }
            None => json!({ "metadata": { "name": "c1" } }),
        }
    }

    #[test]
    fn every_builtin_data_file_parses() {
        for b in BuiltinAddon::ALL {
            let d = builtin_defaults(b).unwrap();
            assert!(!d.chart.version.is_empty(), "{b:?}");
            assert!(!d.namespace.is_empty(), "{b:?}");
        }
        let g = builtin_defaults(BuiltinAddon::GatewayApiCrds).unwrap();
        assert_eq!(g.lifecycle.priority, 50);
        assert_eq!(g.lifecycle.method, ProvisioningMethod::KubectlApply);
        assert!(g.chart.name.starts_with("oci://"));
    }

    #[test]
    fn cilium_gets_talos_values_with_cel_resolved() {
        let one = resolve(&builtin("cilium"), &cluster(Some(1)), None).unwrap();
        assert_eq!(one.namespace, "kube-system");
        assert_eq!(one.chart.repo.as_deref(), Some("https://helm.cilium.io"));
        assert_eq!(one.chart.name, "cilium");
        assert_eq!(one.chart.version.as_deref(), Some("1.20.1"));
        assert_eq!(one.method, ProvisioningMethod::HelmUpgradeInstall);
        assert_eq!(one.values["k8sServicePort"], json!(7445));
        assert_eq!(one.values["k8sServiceHost"], json!("localhost"));
        assert_eq!(one.values["kubeProxyReplacement"], json!(true));
        assert_eq!(one.values["operator"]["replicas"], json!(1));
        assert_eq!(one.values["cgroup"]["autoMount"]["enabled"], json!(false));
        assert_eq!(
            one.values["securityContext"]["capabilities"]["cleanCiliumState"],
            json!(["NET_ADMIN", "SYS_ADMIN", "SYS_RESOURCE"])
        );
        let three = resolve(&builtin("cilium"), &cluster(Some(3)), None).unwrap();
        assert_eq!(three.values["operator"]["replicas"], json!(2));
        assert_ne!(one.hash, three.hash, "a value change changes the hash");
        // No replicas reported yet: injected as 0, so the expression still evaluates.
        let none = resolve(&builtin("cilium"), &cluster(None), None).unwrap();
        assert_eq!(none.values["operator"]["replicas"], json!(1));
    }

    #[test]
    fn user_values_win_and_lists_replace() {
        let a = addon(json!({
            "talosClusterRef": { "name": "c1" }, "releaseName": "cilium",
            "values": {
                "operator": { "replicas": 5 },
                "securityContext": { "capabilities": { "ciliumAgent": ["NET_ADMIN"] } },
                "extra": { "$cel": "ctx.taloscluster.metadata.name + '-x'" }
            }
        }));
        let r = resolve(&a, &cluster(Some(1)), None).unwrap();
        assert_eq!(r.values["operator"]["replicas"], json!(5));
        assert_eq!(
            r.values["securityContext"]["capabilities"]["ciliumAgent"],
            json!(["NET_ADMIN"])
        );
        assert_eq!(
            r.values["securityContext"]["capabilities"]["cleanCiliumState"],
            json!(["NET_ADMIN", "SYS_ADMIN", "SYS_RESOURCE"])
        );
        assert_eq!(r.values["extra"], json!("c1-x"));
        assert_eq!(r.values["envoy"]["enabled"], json!(true));
    }

    #[test]
    fn spec_overrides_builtin_chart_fields_one_by_one() {
        let a = addon(json!({
            "talosClusterRef": { "name": "c1" }, "releaseName": "cert-manager",
            "chart": { "version": "v1.22.0" }, "namespace": { "name": "certs" },
            "lifecycle": { "priority": 7 }
        }));
        let r = resolve(&a, &cluster(None), None).unwrap();
        assert_eq!(r.chart.version.as_deref(), Some("v1.22.0"));
        assert_eq!(r.chart.repo.as_deref(), Some("https://charts.jetstack.io"));
        assert_eq!(r.namespace, "certs");
        assert_eq!(priority(&a), 7);
        assert_eq!(priority(&builtin("gateway-api-crds")), 50);
        assert_eq!(priority(&builtin("cilium")), 100);
    }

    #[test]
    fn the_mirror_replaces_every_builtin_repository() {
        let m = Some("http://127.0.0.1:8080/charts");
        let g = resolve(&builtin("gateway-api-crds"), &cluster(None), m).unwrap();
        assert_eq!(g.chart.repo.as_deref(), m);
        assert_eq!(g.chart.name, "gateway-api-crds");
        assert_eq!(g.chart.version.as_deref(), Some("1.9.0"));
        assert_eq!(g.method, ProvisioningMethod::KubectlApply);
        let c = resolve(&builtin("cilium"), &cluster(None), m).unwrap();
        assert_eq!(c.chart.repo.as_deref(), m);
        let oci = resolve(
            &builtin("cert-manager"),
            &cluster(None),
            Some("oci://registry.local/charts/"),
        )
        .unwrap();
        assert_eq!(oci.chart.repo, None);
        assert_eq!(oci.chart.name, "oci://registry.local/charts/cert-manager");
        assert_eq!(oci.chart.short_name(), "cert-manager");
        // A user-set chart is not mirrored.
        let own = addon(json!({
            "talosClusterRef": { "name": "c1" }, "releaseName": "cilium",
            "chart": { "repo": "https://example.invalid/charts" }
        }));
        let r = resolve(&own, &cluster(None), m).unwrap();
        assert_eq!(
            r.chart.repo.as_deref(),
            Some("https://example.invalid/charts")
        );
    }

    #[test]
    fn non_builtins_need_chart_and_namespace() {
        let cases = [
            (
                json!({ "namespace": { "name": "a" } }),
                ResolveError::NoChart,
            ),
            (
                json!({ "chart": { "name": "x" }, "namespace": { "name": "a" } }),
                ResolveError::NoChart,
            ),
            (
                json!({ "chart": { "name": "oci://r/x" } }),
                ResolveError::NoNamespace,
            ),
        ];
        for (mut spec, expected) in cases {
            spec["talosClusterRef"] = json!({ "name": "c1" });
            assert_eq!(resolve(&addon(spec), &cluster(None), None), Err(expected));
        }
        let oci = addon(
            json!({ "talosClusterRef": { "name": "c1" }, "chart": { "name": "oci://r/x" }, "namespace": { "name": "a" } }),
        );
        let r = resolve(&oci, &cluster(None), None).unwrap();
        assert_eq!((r.chart.repo, r.chart.version), (None, None));
        assert_eq!(r.method, ProvisioningMethod::HelmUpgradeInstall);
        assert_eq!(priority(&oci), DEFAULT_PRIORITY);
    }

    #[test]
    fn cel_errors_name_the_path_and_expression() {
        let bad = addon(json!({
            "talosClusterRef": { "name": "c1" }, "releaseName": "cilium",
            "values": { "a": { "b": { "$cel": "ctx.talos.kubePrism.port +" } } }
        }));
        match resolve(&bad, &cluster(None), None) {
            Err(ResolveError::CelCompile {
                path, expression, ..
            }) => {
                assert_eq!(path, "a.b");
                assert_eq!(expression, "ctx.talos.kubePrism.port +");
            }
            other => panic!("{other:?}"),
        }
        let missing = addon(json!({
            "talosClusterRef": { "name": "c1" }, "releaseName": "cilium",
            "values": { "list": [ { "$cel": "ctx.nope.field" } ] }
        }));
        let err = resolve(&missing, &cluster(None), None).unwrap_err();
        assert!(
            matches!(err, ResolveError::CelEval { ref path, .. } if path == "list[0]"),
            "{err:?}"
        );
        // A map with `$cel` and another key is plain data.
        let plain = resolve_cel(&json!({ "$cel": "1", "x": 2 }), &json!({}), "").unwrap();
        assert_eq!(plain, json!({ "$cel": "1", "x": 2 }));
    }

    #[test]
    fn the_hash_ignores_key_order_and_sees_every_change() {
        let chart = ChartRef {
            repo: Some("r".into()),
            name: "n".into(),
            version: Some("1".into()),
        };
        let a: Map<String, Value> = serde_json::from_str(r#"{"a":1,"b":{"c":2,"d":3}}"#).unwrap();
        let b: Map<String, Value> = serde_json::from_str(r#"{"b":{"d":3,"c":2},"a":1}"#).unwrap();
        let m = ProvisioningMethod::HelmUpgradeInstall;
        assert_eq!(desired_hash(&chart, m, &a), desired_hash(&chart, m, &b));
        assert_eq!(desired_hash(&chart, m, &a).len(), 32);
        let newer = ChartRef {
            version: Some("2".into()),
            ..chart.clone()
        };
        assert_ne!(desired_hash(&chart, m, &a), desired_hash(&newer, m, &a));
        assert_ne!(
            desired_hash(&chart, m, &a),
            desired_hash(&chart, ProvisioningMethod::KubectlApply, &a)
        );
    }
}
