//! A container's environment, built exactly as a kubelet builds it, from data already
//! fetched (so it is pure and unit-tested): the runtime's base (image env, `HOSTNAME`),
//! then the kubelet's `KUBERNETES_SERVICE_*` variables, `envFrom`, and `env` with `$(VAR)`
//! expansion and `valueFrom`. Also the downward API's field and resource values, shared
//! with downwardAPI volumes.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use k8s_openapi::api::core::v1::{
    Container, EnvVar, EnvVarSource, ObjectFieldSelector, Pod, ResourceFieldSelector,
};

/// Why an environment could not be built; the container waits with
/// `CreateContainerConfigError` and this message, as with a kubelet.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EnvError {
    /// A referenced Secret or ConfigMap does not exist.
    #[error("{kind} \"{name}\" not found")]
    ObjectNotFound {
        /// `secret` or `configmap`.
        kind: &'static str,
        /// Its name.
        name: String,
    },
    /// A referenced key does not exist.
    #[error("couldn't find key {key} in {kind} {namespace}/{name}")]
    KeyNotFound {
        /// `Secret` or `ConfigMap`.
        kind: &'static str,
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// Key.
        key: String,
    },
    /// An unsupported or invalid field path.
    #[error("unsupported fieldPath {0}")]
    FieldPath(String),
    /// An unsupported or invalid resource reference.
    #[error("unsupported resource {0}")]
    Resource(String),
    /// A `valueFrom` with no source.
    #[error("env var {0} has an empty valueFrom")]
    EmptySource(String),
}

/// Objects fetched for a pod: `None` when the object does not exist.
#[derive(Clone, Debug, Default)]
pub struct Fetched {
    /// Secrets by name (decoded data).
    pub secrets: BTreeMap<String, Option<BTreeMap<String, Vec<u8>>>>,
    /// ConfigMaps by name (`data` plus `binaryData`).
    pub config_maps: BTreeMap<String, Option<BTreeMap<String, Vec<u8>>>>,
}

/// Everything the downward API may read besides the pod object.
#[derive(Clone, Debug)]
pub struct PodFacts<'a> {
    /// The pod.
    pub pod: &'a Pod,
    /// Its IPs (`status.podIP(s)`).
    pub pod_ips: Vec<String>,
    /// The node's IP (`status.hostIP(s)`).
    pub host_ip: String,
    /// The node's allocatable CPU in millicores (used when a container has no CPU limit).
    pub node_cpu_milli: i128,
    /// The node's allocatable memory in bytes (used when a container has no memory limit).
    pub node_memory: i128,
}

/// Inputs of [`build`] besides the pod facts.
#[derive(Clone, Debug)]
pub struct EnvInputs<'a> {
    /// The container.
    pub container: &'a Container,
    /// The runtime's base: the image's env and `HOSTNAME`; overridden by everything else
    /// and not visible to `$(VAR)`.
    pub runtime: Vec<(String, String)>,
    /// `KUBERNETES_SERVICE_HOST` etc.: visible to `$(VAR)`, overridden by the container.
    pub service: Vec<(String, String)>,
    /// Secrets and ConfigMaps.
    pub fetched: &'a Fetched,
}

/// Names of the Secrets and ConfigMaps a container's env refers to (to fetch them).
pub fn referenced(container: &Container) -> (Vec<String>, Vec<String>) {
    let mut secrets = Vec::new();
    let mut config_maps = Vec::new();
    for from in container.env_from.iter().flatten() {
        if let Some(s) = &from.secret_ref {
            secrets.push(s.name.clone());
        }
        if let Some(c) = &from.config_map_ref {
            config_maps.push(c.name.clone());
        }
    }
    for var in container.env.iter().flatten() {
        if let Some(src) = &var.value_from {
            if let Some(s) = &src.secret_key_ref {
                secrets.push(s.name.clone());
            }
            if let Some(c) = &src.config_map_key_ref {
                config_maps.push(c.name.clone());
            }
        }
    }
    (secrets, config_maps)
}

/// The container's final environment, in definition order, later definitions replacing
/// earlier ones in place.
pub fn build(
    facts: &PodFacts<'_>,
    input: &EnvInputs<'_>,
) -> Result<Vec<(String, String)>, EnvError> {
    let namespace = facts.pod.metadata.namespace.clone().unwrap_or_default();
    // What the kubelet defines; `$(VAR)` sees it (plus the service variables).
    let mut defined = Env::default();
    for from in input.container.env_from.iter().flatten() {
        let prefix = from.prefix.clone().unwrap_or_default();
        let (kind, name, optional, data) = if let Some(s) = &from.secret_ref {
            (
                "secret",
                &s.name,
                s.optional,
                input.fetched.secrets.get(&s.name),
            )
        } else if let Some(c) = &from.config_map_ref {
            (
                "configmap",
                &c.name,
                c.optional,
                input.fetched.config_maps.get(&c.name),
            )
        } else {
            continue;
        };
        match data.and_then(Option::as_ref) {
            Some(data) => {
                for (key, value) in data {
                    let key = format!("{prefix}{key}");
                    if key.is_empty() || key.contains('=') {
                        continue;
                    }
                    defined.set(key, String::from_utf8_lossy(value).into_owned());
                }
            }
            None if optional == Some(true) => {}
            None => {
                return Err(EnvError::ObjectNotFound {
                    kind,
                    name: name.clone(),
                });
            }
        }
    }
    let service = Env::from(input.service.clone());
    for var in input.container.env.iter().flatten() {
        if let Some(value) = value_of(var, facts, input, &namespace, &defined, &service)? {
            defined.set(var.name.clone(), value);
        }
    }
    let mut all = Env::from(input.runtime.clone());
    for (k, v) in service.0.into_iter().chain(defined.0) {
        all.set(k, v);
    }
    Ok(all.0)
}

fn value_of(
    var: &EnvVar,
    facts: &PodFacts<'_>,
    input: &EnvInputs<'_>,
    namespace: &str,
    defined: &Env,
    service: &Env,
) -> Result<Option<String>, EnvError> {
    let Some(src) = &var.value_from else {
        let raw = var.value.clone().unwrap_or_default();
        return Ok(Some(expand(&raw, |name| {
            defined.get(name).or_else(|| service.get(name))
        })));
    };
    value_from(&var.name, src, facts, input, namespace)
}

fn value_from(
    var: &str,
    src: &EnvVarSource,
    facts: &PodFacts<'_>,
    input: &EnvInputs<'_>,
    namespace: &str,
) -> Result<Option<String>, EnvError> {
    if let Some(f) = &src.field_ref {
        return field_value(facts, f).map(Some);
    }
    if let Some(r) = &src.resource_field_ref {
        return resource_value(facts, Some(input.container), r).map(Some);
    }
    let (kind, object_kind, name, key, optional, data) = if let Some(s) = &src.secret_key_ref {
        (
            "secret",
            "Secret",
            &s.name,
            &s.key,
            s.optional,
            input.fetched.secrets.get(&s.name),
        )
    } else if let Some(c) = &src.config_map_key_ref {
        (
            "configmap",
            "ConfigMap",
            &c.name,
            &c.key,
            c.optional,
            input.fetched.config_maps.get(&c.name),
        )
    } else {
        return Err(EnvError::EmptySource(var.to_string()));
    };
    let optional = optional == Some(true);
    match data.and_then(Option::as_ref) {
        None if optional => Ok(None),
        None => Err(EnvError::ObjectNotFound {
            kind,
            name: name.clone(),
        }),
        Some(data) => match data.get(key) {
            Some(v) => Ok(Some(String::from_utf8_lossy(v).into_owned())),
            None if optional => Ok(None),
            None => Err(EnvError::KeyNotFound {
                kind: object_kind,
                namespace: namespace.to_string(),
                name: name.clone(),
                key: key.clone(),
            }),
        },
    }
}

/// The value of a downward-API `fieldRef`. `metadata.labels` and `metadata.annotations`
/// (volumes only) give `key="value"` lines, sorted, as a kubelet writes them.
pub fn field_value(
    facts: &PodFacts<'_>,
    selector: &ObjectFieldSelector,
) -> Result<String, EnvError> {
    let meta = &facts.pod.metadata;
    let spec = facts.pod.spec.as_ref();
    let path = selector.field_path.as_str();
    let subscript = |prefix: &str| -> Option<String> {
        let rest = path
            .strip_prefix(prefix)?
            .strip_prefix('[')?
            .strip_suffix(']')?;
        let key = rest
            .strip_prefix('\'')
            .and_then(|r| r.strip_suffix('\''))
            .or_else(|| rest.strip_prefix('"').and_then(|r| r.strip_suffix('"')))?;
        Some(key.to_string())
    };
    let value = match path {
        "metadata.name" => meta.name.clone().unwrap_or_default(),
        "metadata.namespace" => meta.namespace.clone().unwrap_or_default(),
        "metadata.uid" => meta.uid.clone().unwrap_or_default(),
        "metadata.labels" => format_map(meta.labels.as_ref()),
        "metadata.annotations" => format_map(meta.annotations.as_ref()),
        "spec.nodeName" => spec.and_then(|s| s.node_name.clone()).unwrap_or_default(),
        "spec.serviceAccountName" => spec
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_default(),
        "status.podIP" => facts.pod_ips.first().cloned().unwrap_or_default(),
        "status.podIPs" => facts.pod_ips.join(","),
        "status.hostIP" | "status.hostIPs" => facts.host_ip.clone(),
        _ => {
            if let Some(key) = subscript("metadata.labels") {
                meta.labels
                    .as_ref()
                    .and_then(|l| l.get(&key).cloned())
                    .unwrap_or_default()
            } else if let Some(key) = subscript("metadata.annotations") {
                meta.annotations
                    .as_ref()
                    .and_then(|a| a.get(&key).cloned())
                    .unwrap_or_default()
            } else {
                return Err(EnvError::FieldPath(path.to_string()));
            }
        }
    };
    Ok(value)
}

fn format_map(map: Option<&BTreeMap<String, String>>) -> String {
    map.into_iter()
        .flatten()
        .map(|(k, v)| format!("{k}={}", go_quote(v)))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Go's `%q` for the common cases.
fn go_quote(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Billionths in one.
const NANO: i128 = 1_000_000_000;

/// The value of a `resourceFieldRef` (`limits.cpu`, `requests.memory`, ...), divided by its
/// divisor and rounded up; an unset limit is the node's allocatable, as with a kubelet.
/// `current` is the container an env var belongs to (volumes name theirs).
pub fn resource_value(
    facts: &PodFacts<'_>,
    current: Option<&Container>,
    selector: &ResourceFieldSelector,
) -> Result<String, EnvError> {
    let spec = facts.pod.spec.as_ref();
    let container = match selector.container_name.as_deref().filter(|n| !n.is_empty()) {
        Some(name) => spec
            .and_then(|s| {
                s.containers
                    .iter()
                    .chain(s.init_containers.iter().flatten())
                    .find(|c| c.name == name)
            })
            .ok_or_else(|| EnvError::Resource(format!("container {name}")))?,
        None => current.ok_or_else(|| EnvError::Resource(selector.resource.clone()))?,
    };
    let (section, resource) = selector
        .resource
        .split_once('.')
        .ok_or_else(|| EnvError::Resource(selector.resource.clone()))?;
    let resources = container.resources.as_ref();
    let list = match section {
        "limits" => resources.and_then(|r| r.limits.as_ref()),
        "requests" => resources.and_then(|r| r.requests.as_ref()),
        _ => return Err(EnvError::Resource(selector.resource.clone())),
    };
    let declared = list
        .and_then(|l| l.get(resource))
        .map(|q| parse_quantity(&q.0))
        .transpose()?;
    let value = match (declared, section, resource) {
        (Some(v), _, _) => v,
        (None, "limits", "cpu") => facts.node_cpu_milli * 1_000_000,
        (None, "limits", "memory") => facts.node_memory * NANO,
        (None, "limits", "ephemeral-storage") => (1_i128 << 40) * NANO,
        (None, "requests", "cpu" | "memory" | "ephemeral-storage") => 0,
        _ => return Err(EnvError::Resource(selector.resource.clone())),
    };
    let divisor = match selector.divisor.as_ref() {
        Some(q) if !q.0.is_empty() => parse_quantity(&q.0)?,
        _ => NANO,
    };
    if divisor <= 0 {
        return Err(EnvError::Resource(format!(
            "divisor of {}",
            selector.resource
        )));
    }
    Ok(div_ceil(value, divisor).to_string())
}

fn div_ceil(a: i128, b: i128) -> i128 {
    let q = a / b;
    if a % b != 0 && a > 0 { q + 1 } else { q }
}

/// Parses a Kubernetes quantity (`100m`, `1.5Gi`, `2e3`, `128974848`) into billionths.
pub fn parse_quantity(q: &str) -> Result<i128, EnvError> {
    let bad = || EnvError::Resource(format!("quantity {q}"));
    let q = q.trim();
    let end = q
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(q.len());
    let (number, suffix) = q.split_at(end);
    let (negative, number) = match number.strip_prefix('-') {
        Some(n) => (true, n),
        None => (false, number.strip_prefix('+').unwrap_or(number)),
    };
    let (int_part, frac_part) = number.split_once('.').unwrap_or((number, ""));
    if int_part.is_empty() && frac_part.is_empty() {
        return Err(bad());
    }
    let digits = |s: &str| -> Result<i128, EnvError> {
        if s.is_empty() {
            Ok(0)
        } else if s.chars().all(|c| c.is_ascii_digit()) && s.len() < 30 {
            s.parse::<i128>().map_err(|_| bad())
        } else {
            Err(bad())
        }
    };
    // number in billionths (fraction truncated at 9 digits)
    let frac9: String = frac_part
        .chars()
        .chain(std::iter::repeat('0'))
        .take(9)
        .collect();
    let mut nanos = digits(int_part)? * 1_000_000_000 + digits(&frac9)?;
    // Finer than nano: round up, as Kubernetes does.
    if frac_part.len() > 9 && frac_part[9..].chars().any(|c| c != '0') {
        nanos += 1;
    }
    let scaled = match suffix {
        "" => nanos,
        "n" => div_ceil(nanos, 1_000_000_000),
        "u" => div_ceil(nanos, 1_000_000),
        "m" => div_ceil(nanos, 1_000),
        "k" => nanos * 1_000,
        "M" => nanos * 1_000_000,
        "G" => nanos * 1_000_000_000,
        "T" => nanos * 1_000_000_000_000,
        "P" => nanos * 1_000_000_000_000_000,
        "E" => nanos * 1_000_000_000_000_000_000,
        "Ki" => nanos << 10,
        "Mi" => nanos << 20,
        "Gi" => nanos << 30,
        "Ti" => nanos << 40,
        "Pi" => nanos << 50,
        "Ei" => nanos << 60,
        s if s.starts_with(['e', 'E']) => {
            let exp: i32 = s[1..].parse().map_err(|_| bad())?;
            if !(-9..=18).contains(&exp) {
                return Err(bad());
            }
            if exp >= 0 {
                nanos * 10_i128.pow(exp.unsigned_abs())
            } else {
                div_ceil(nanos, 10_i128.pow(exp.unsigned_abs()))
            }
        }
        _ => return Err(bad()),
    };
    Ok(if negative { -scaled } else { scaled })
}

/// Kubernetes' `$(VAR)` expansion: `$(NAME)` becomes the value `lookup` gives, or stays as
/// written when it gives none; `$$` is an escaped `$`; anything else is kept.
pub fn expand<'a>(input: &str, lookup: impl Fn(&str) -> Option<&'a str>) -> String {
    let bytes = input.as_bytes();
    let mut out = String::with_capacity(input.len());
    let mut checkpoint = 0;
    let mut cursor = 0;
    while cursor < bytes.len() {
        if bytes[cursor] == b'$' && cursor + 1 < bytes.len() {
            out.push_str(&input[checkpoint..cursor]);
            match bytes[cursor + 1] {
                b'$' => {
                    out.push('$');
                    cursor += 1;
                }
                b'(' => {
                    if let Some(len) = input[cursor + 2..].find(')') {
                        let name = &input[cursor + 2..cursor + 2 + len];
                        if let Some(v) = lookup(name) {
                            out.push_str(v);
                        } else {
                            // Unknown references stay as written.
                            out.push_str("$(");
                            out.push_str(name);
                            out.push(')');
                        }
                        cursor += 2 + len;
                    } else {
                        // An unterminated reference is kept verbatim.
                        out.push_str("$(");
                        cursor += 1;
                    }
                }
                _ => {
                    out.push('$');
                    checkpoint = cursor + 1;
                    cursor += 1;
                    continue;
                }
            }
            checkpoint = cursor + 1;
        }
        cursor += 1;
    }
    out.push_str(&input[checkpoint..]);
    out
}

/// Expands `command` and `args` with the container's final environment, as a kubelet does.
pub fn expand_all(items: &[String], env: &[(String, String)]) -> Vec<String> {
    items
        .iter()
        .map(|s| {
            expand(s, |name| {
                env.iter()
                    .rev()
                    .find(|(k, _)| k == name)
                    .map(|(_, v)| v.as_str())
            })
        })
        .collect()
}

/// An ordered environment where setting a name again replaces its value in place.
#[derive(Clone, Debug, Default)]
struct Env(Vec<(String, String)>);

impl Env {
    fn set(&mut self, key: String, value: String) {
        match self.0.iter_mut().find(|(k, _)| *k == key) {
            Some(slot) => slot.1 = value,
            None => self.0.push((key, value)),
        }
    }

    fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

impl From<Vec<(String, String)>> for Env {
    fn from(vars: Vec<(String, String)>) -> Self {
        let mut env = Self::default();
        for (k, v) in vars {
            env.set(k, v);
        }
        env
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lookup(name: &str) -> Option<&'static str> {
        match name {
            "A" => Some("a"),
            "EMPTY" => Some(""),
            _ => None,
        }
    }

    #[test]
    fn expansion_follows_kubernetes() {
        for (input, want) in [
            ("$(A)", "a"),
            ("x$(A)y$(A)", "xaya"),
            ("$(MISSING)", "$(MISSING)"),
            ("$$(A)", "$(A)"),
            ("$$$(A)", "$a"),
            ("$(A", "$(A"),
            ("$", "$"),
            ("a$", "a$"),
            ("$x$(A)", "$xa"),
            ("$(EMPTY)!", "!"),
            ("é$(A)é", "éaé"),
            ("$é", "$é"),
            ("", ""),
        ] {
            assert_eq!(expand(input, lookup), want, "input {input:?}");
        }
    }

    #[test]
    fn quantities_parse_into_billionths() {
        let g = 1_000_000_000_i128;
        assert_eq!(parse_quantity("1").unwrap(), g);
        assert_eq!(parse_quantity("100m").unwrap(), g / 10);
        assert_eq!(parse_quantity("1.5").unwrap(), g * 3 / 2);
        assert_eq!(parse_quantity("64Mi").unwrap(), (64 << 20) * g);
        assert_eq!(parse_quantity("2k").unwrap(), 2000 * g);
        assert_eq!(parse_quantity("1e3").unwrap(), 1000 * g);
        assert_eq!(parse_quantity("1Ei").unwrap(), (1_i128 << 60) * g);
        assert!(parse_quantity("abc").is_err());
        assert!(parse_quantity("1Q").is_err());
    }

    fn pod() -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": "p", "namespace": "ns", "uid": "u-1",
                "labels": { "app": "web", "tier": "a\"b" },
                "annotations": { "note": "n" }
            },
            "spec": {
                "nodeName": "node-1",
                "serviceAccountName": "sa",
                "containers": [{
                    "name": "c",
                    "resources": { "limits": { "memory": "64Mi" }, "requests": { "cpu": "250m" } },
                    "envFrom": [
                        { "configMapRef": { "name": "cm" }, "prefix": "CM_" },
                        { "secretRef": { "name": "missing", "optional": true } }
                    ],
                    "env": [
                        { "name": "LIT", "value": "lit" },
                        { "name": "REF", "value": "$(LIT)-$(CM_k)-$(KUBERNETES_SERVICE_HOST)-$(LATER)-$$(LIT)" },
                        { "name": "SEC", "valueFrom": { "secretKeyRef": { "name": "s", "key": "password" } } },
                        { "name": "OPT", "valueFrom": { "configMapKeyRef": { "name": "cm", "key": "nope", "optional": true } } },
                        { "name": "POD_IP", "valueFrom": { "fieldRef": { "fieldPath": "status.podIP" } } },
                        { "name": "POD_NAME", "valueFrom": { "fieldRef": { "fieldPath": "metadata.name" } } },
                        { "name": "APP", "valueFrom": { "fieldRef": { "fieldPath": "metadata.labels['app']" } } },
                        { "name": "MEM", "valueFrom": { "resourceFieldRef": { "resource": "limits.memory", "divisor": "1Mi" } } },
                        { "name": "CPU_REQ", "valueFrom": { "resourceFieldRef": { "resource": "requests.cpu", "divisor": "1m" } } },
                        { "name": "CPU_LIM", "valueFrom": { "resourceFieldRef": { "resource": "limits.cpu" } } },
                        { "name": "LATER", "value": "later" },
                        { "name": "LIT", "value": "again" },
                        { "name": "PATH", "value": "/custom" }
                    ]
                }]
            }
        }))
        .unwrap()
    }

    fn fetched() -> Fetched {
        let mut f = Fetched::default();
        f.config_maps.insert(
            "cm".into(),
            Some(BTreeMap::from([("k".into(), b"v".to_vec())])),
        );
        f.secrets.insert(
            "s".into(),
            Some(BTreeMap::from([("password".into(), b"hunter2".to_vec())])),
        );
        f.secrets.insert("missing".into(), None);
        f
    }

    fn facts(pod: &Pod) -> PodFacts<'_> {
        PodFacts {
            pod,
            pod_ips: vec!["127.1.0.5".into()],
            host_ip: "127.1.0.1".into(),
            node_cpu_milli: 4000,
            node_memory: 8 << 30,
        }
    }

    #[test]
    fn the_environment_is_built_like_a_kubelets() {
        let pod = pod();
        let container = &pod.spec.as_ref().unwrap().containers[0];
        let fetched = fetched();
        let env = build(
            &facts(&pod),
            &EnvInputs {
                container,
                runtime: vec![
                    ("PATH".into(), "/image/bin".into()),
                    ("HOSTNAME".into(), "p".into()),
                    ("IMAGE_ONLY".into(), "i".into()),
                ],
                service: vec![("KUBERNETES_SERVICE_HOST".into(), "127.0.0.1".into())],
                fetched: &fetched,
            },
        )
        .unwrap();
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("LIT"), Some("again"));
        assert_eq!(get("REF"), Some("lit-v-127.0.0.1-$(LATER)-$(LIT)"));
        assert_eq!(get("CM_k"), Some("v"));
        assert_eq!(get("SEC"), Some("hunter2"));
        assert_eq!(get("OPT"), None);
        assert_eq!(get("POD_IP"), Some("127.1.0.5"));
        assert_eq!(get("POD_NAME"), Some("p"));
        assert_eq!(get("APP"), Some("web"));
        assert_eq!(get("MEM"), Some("64"));
        assert_eq!(get("CPU_REQ"), Some("250"));
        assert_eq!(get("CPU_LIM"), Some("4"));
        assert_eq!(get("PATH"), Some("/custom"));
        assert_eq!(get("HOSTNAME"), Some("p"));
        assert_eq!(get("IMAGE_ONLY"), Some("i"));
        assert_eq!(env.iter().filter(|(k, _)| k == "LIT").count(), 1);
    }

    #[test]
    fn missing_objects_and_keys_are_config_errors_unless_optional() {
        let mut pod = pod();
        let fetched = fetched();
        let spec = pod.spec.as_mut().unwrap();
        spec.containers[0].env = Some(vec![EnvVar {
            name: "X".into(),
            value_from: Some(EnvVarSource {
                secret_key_ref: Some(k8s_openapi::api::core::v1::SecretKeySelector {
                    name: "s".into(),
                    key: "nope".into(),
                    optional: None,
                }),
                ..EnvVarSource::default()
            }),
            value: None,
        }]);
        let pod2 = pod.clone();
        let c = &pod2.spec.as_ref().unwrap().containers[0];
        let inputs = EnvInputs {
            container: c,
            runtime: vec![],
            service: vec![],
            fetched: &fetched,
        };
        let err = build(&facts(&pod2), &inputs).unwrap_err();
        assert_eq!(err.to_string(), "couldn't find key nope in Secret ns/s");
        let mut c2 = c.clone();
        c2.env_from = Some(vec![k8s_openapi::api::core::v1::EnvFromSource {
            secret_ref: Some(k8s_openapi::api::core::v1::SecretEnvSource {
                name: "missing".into(),
                optional: None,
            }),
            ..Default::default()
        }]);
        c2.env = None;
        let inputs = EnvInputs {
            container: &c2,
            ..inputs
        };
        let err = build(&facts(&pod2), &inputs).unwrap_err();
        assert_eq!(err.to_string(), "secret \"missing\" not found");
    }

    #[test]
    fn downward_labels_are_quoted_lines() {
        let pod = pod();
        let f = facts(&pod);
        let v = field_value(
            &f,
            &ObjectFieldSelector {
                field_path: "metadata.labels".into(),
                api_version: None,
            },
        )
        .unwrap();
        assert_eq!(v, "app=\"web\"\ntier=\"a\\\"b\"");
        assert!(
            field_value(
                &f,
                &ObjectFieldSelector {
                    field_path: "spec.bogus".into(),
                    api_version: None
                }
            )
            .is_err()
        );
    }

    #[test]
    fn command_and_args_expand_with_the_final_environment() {
        let env = vec![("POD_IP".to_string(), "127.0.0.9".to_string())];
        assert_eq!(
            expand_all(&["--bind=$(POD_IP):8080".into(), "$(NOPE)".into()], &env),
            vec!["--bind=127.0.0.9:8080".to_string(), "$(NOPE)".to_string()]
        );
    }
}
