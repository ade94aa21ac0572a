//! The hub chart `charts/kontinuum`, rendered by the test bed's real helm and checked in
//! tests, not by eye: the rendered manifests for default and non-default values, the values
//! schema, `helm lint --strict`, the CRDs it ships, the image it needs (the Containerfile),
//! and its RBAC on the real test bed (what each operator may and may not do, and an
//! operator running with exactly the chart's namespaced permissions and its Lease).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::large_futures,
    clippy::too_many_lines
)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::rbac::v1::PolicyRule;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kontinuum_crds::conditions::{self, ConditionStatus};
use kontinuum_crds::labels::CLAIMED_BY;
use kontinuum_crds::v1alpha2::{Instance, InstancePool, InstanceStatus};
use kontinuum_e2e::chart::{
    self, OPERATORS, STORE, WATCHING_OPERATORS, component, kind, name, object_namespace as ns_of,
    of_kind, operator_object, values_key,
};
use kontinuum_e2e::testbed::Tools;
use kontinuum_e2e::{Operator, eventually, install_kontinuum_crds, namespace, shared_client};
use kube::ResourceExt as _;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

const RELEASE: &str = "kontinuum";
const RELEASE_NS: &str = "kontinuum-system";
const LIMIT: Duration = Duration::from_secs(60);

fn tools() -> Tools {
    Tools::locate().expect("locating the test bed (run `make testbed`)")
}

fn render(set: &[(&str, &str)]) -> Vec<Value> {
    chart::render(&tools(), RELEASE, RELEASE_NS, set).unwrap()
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn deployment<'a>(docs: &'a [Value], op: &str) -> &'a Value {
    operator_object(docs, "Deployment", op).unwrap_or_else(|| panic!("no Deployment for {op}"))
}

fn container(deployment: &Value) -> &Value {
    let containers = deployment["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap();
    assert_eq!(containers.len(), 1, "one container per operator pod");
    &containers[0]
}

fn args(deployment: &Value) -> Vec<String> {
    serde_json::from_value(container(deployment)["args"].clone()).unwrap()
}

/// The container's environment as its process would see it: the ConfigMaps named by
/// `envFrom` (from the rendered documents), then the `env` entries, which win. A
/// downward-API variable reads `fieldRef:<path>`.
fn environment(docs: &[Value], deployment: &Value) -> BTreeMap<String, String> {
    let c = container(deployment);
    let mut env = BTreeMap::new();
    for source in c["envFrom"].as_array().into_iter().flatten() {
        let cm_name = source["configMapRef"]["name"].as_str().unwrap();
        let cm = docs
            .iter()
            .find(|d| kind(d) == "ConfigMap" && name(d) == cm_name)
            .unwrap_or_else(|| panic!("envFrom names ConfigMap {cm_name}, which is not rendered"));
        for (k, v) in cm["data"].as_object().unwrap() {
            env.insert(k.clone(), v.as_str().unwrap().to_owned());
        }
    }
    for e in c["env"].as_array().into_iter().flatten() {
        let value = match (&e["value"], &e["valueFrom"]["fieldRef"]["fieldPath"]) {
            (Value::String(v), _) => v.clone(),
            (_, Value::String(path)) => format!("fieldRef:{path}"),
            other => panic!("unexpected env entry {e}: {other:?}"),
        };
        env.insert(e["name"].as_str().unwrap().to_owned(), value);
    }
    env
}

/// The container port a probe's named port resolves to.
fn probe_port(deployment: &Value, probe: &str) -> (String, i64) {
    let c = container(deployment);
    let get = &c[probe]["httpGet"];
    let port = get["port"]
        .as_str()
        .expect("probes use the named admin port");
    let number = c["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == port)
        .and_then(|p| p["containerPort"].as_i64())
        .unwrap_or_else(|| panic!("{probe} names port {port}, which the container lacks"));
    (get["path"].as_str().unwrap().to_owned(), number)
}

/// The number of the container port named `port`.
fn container_port(deployment: &Value, port: &str) -> i64 {
    container(deployment)["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == port)
        .and_then(|p| p["containerPort"].as_i64())
        .unwrap_or_else(|| panic!("no container port {port}"))
}

fn rules(doc: &Value) -> Vec<PolicyRule> {
    serde_json::from_value(doc["rules"].clone()).unwrap()
}

fn rbac_of<'a>(docs: &'a [Value], kind_: &str, op: &str) -> Vec<&'a Value> {
    docs.iter()
        .filter(|d| kind(d) == kind_ && component(d) == Some(op))
        .collect()
}

/// The Role in the release namespace that holds only the operator's Lease rules.
fn lease_role<'a>(docs: &'a [Value], op: &str) -> &'a Value {
    let roles: Vec<&Value> = rbac_of(docs, "Role", op)
        .into_iter()
        .filter(|r| {
            rules(r)
                .iter()
                .all(|rule| rule.resources.as_deref() == Some(&["leases".to_owned()][..]))
        })
        .collect();
    assert_eq!(roles.len(), 1, "{op}: one leader-election Role");
    roles[0]
}

fn helm_error(set: &[(&str, &str)]) -> String {
    let out = chart::template(&tools(), RELEASE, RELEASE_NS, set, &[]).unwrap();
    assert!(
        !out.status.success(),
        "helm template {set:?} should fail but rendered:\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The Service of `op` that exposes its admin port (`<release>-<op>`), apart from the
/// Services its traits add (etcd-proxy's gRPC, the registry's webhook).
fn metrics_service<'a>(docs: &'a [Value], op: &str) -> &'a Value {
    let name_ = format!("{RELEASE}-{op}");
    docs.iter()
        .find(|d| kind(d) == "Service" && name(d) == name_)
        .unwrap_or_else(|| panic!("no metrics Service {name_}"))
}

fn by_name<'a>(docs: &'a [Value], kind_: &str, name_: &str) -> &'a Value {
    docs.iter()
        .find(|d| kind(d) == kind_ && name(d) == name_)
        .unwrap_or_else(|| panic!("no {kind_} {name_}"))
}

/// The Deployment's pod volume `volume` mounted at `path` in its container.
fn mounted<'a>(deployment: &'a Value, path: &str) -> &'a Value {
    let mount = container(deployment)["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["mountPath"] == path)
        .unwrap_or_else(|| panic!("nothing mounted at {path}"));
    deployment["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == mount["name"])
        .unwrap_or_else(|| panic!("the mount at {path} names no volume"))
}

#[test]
fn every_deployment_is_hardened_probed_and_leader_elected() {
    let docs = render(&[]);
    let deployments = of_kind(&docs, "Deployment");
    let components: BTreeSet<&str> = deployments.iter().filter_map(|d| component(d)).collect();
    assert_eq!(components, OPERATORS.into_iter().collect::<BTreeSet<_>>());
    for op in OPERATORS {
        let d = deployment(&docs, op);
        assert_eq!(ns_of(d), Some(RELEASE_NS));
        let pod = &d["spec"]["template"]["spec"];
        let c = container(d);
        assert_eq!(
            c["command"],
            json!([format!("/usr/local/bin/{op}")]),
            "{op}"
        );
        assert_eq!(
            c["image"], "kontinuum:0.1.0",
            "{op}: one image, tag = appVersion"
        );
        assert_eq!(c["imagePullPolicy"], "IfNotPresent", "{op}");

        // Restricted pod security, on the pod and the container.
        for (what, sc) in [
            ("pod", &pod["securityContext"]),
            ("container", &c["securityContext"]),
        ] {
            assert_eq!(sc["runAsNonRoot"], true, "{op} {what}");
            assert_eq!(sc["runAsUser"], 65532, "{op} {what}");
            assert_eq!(
                sc["seccompProfile"]["type"], "RuntimeDefault",
                "{op} {what}"
            );
        }
        let sc = &c["securityContext"];
        assert_eq!(sc["readOnlyRootFilesystem"], true, "{op}");
        assert_eq!(sc["allowPrivilegeEscalation"], false, "{op}");
        assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]), "{op}");

        // Probes on the admin port, which the operator binds on the pod's IP.
        assert_eq!(
            probe_port(d, "livenessProbe"),
            ("/healthz".to_owned(), 8080),
            "{op}"
        );
        assert_eq!(
            probe_port(d, "readinessProbe"),
            ("/readyz".to_owned(), 8080),
            "{op}"
        );
        let a = args(d);
        assert!(
            a.contains(&"--admin-addr=$(POD_IP):8080".to_owned()),
            "{op}: {a:?}"
        );
        // Leader election, except for etcd-proxy, which has none: every replica serves.
        let lease = format!("{RELEASE}-{op}");
        let elected = op != "etcd-proxy";
        assert_eq!(
            a.contains(&"--leader-elect".to_owned()),
            elected,
            "{op}: {a:?}"
        );
        assert_eq!(
            a.contains(&format!("--lease-name={lease}")),
            elected,
            "{op}: {a:?}"
        );
        assert_eq!(
            d["spec"]["strategy"]["type"],
            if elected { "Recreate" } else { "RollingUpdate" },
            "{op}: a follower is never Ready, so only a Lease-less operator can roll"
        );

        let env = environment(&docs, d);
        assert_eq!(env["POD_NAME"], "fieldRef:metadata.name", "{op}");
        assert_eq!(env["POD_NAMESPACE"], "fieldRef:metadata.namespace", "{op}");
        assert_eq!(env["POD_IP"], "fieldRef:status.podIP", "{op}");
        assert_eq!(env["KONTINUUM_LOG_LEVEL"], "info", "{op}");
        assert_eq!(env["KONTINUUM_LOG_FORMAT"], "json", "{op}");
        assert!(
            !env.contains_key("KONTINUUM_WATCH_NAMESPACE"),
            "{op}: all namespaces"
        );

        let resources = &c["resources"];
        assert!(
            resources["requests"]["memory"].is_string(),
            "{op}: {resources}"
        );
        assert!(
            resources["limits"]["memory"].is_string(),
            "{op}: {resources}"
        );

        // The only writable place: an emptyDir at /tmp.
        assert!(mounted(d, "/tmp")["emptyDir"].is_object(), "{op}");

        // Its own ServiceAccount, rules (+ Events) and binding, and a Lease Role.
        let sa = pod["serviceAccountName"].as_str().unwrap();
        let account = operator_object(&docs, "ServiceAccount", op).unwrap();
        assert_eq!(name(account), sa, "{op}");
        let main_role = by_name(
            &docs,
            if WATCHING_OPERATORS.contains(&op) {
                "ClusterRole"
            } else {
                "Role"
            },
            &lease,
        );
        let events = rules(main_role)
            .into_iter()
            .find(|r| r.api_groups.as_deref() == Some(&["events.k8s.io".to_owned()][..]));
        if op == "etcd-proxy" {
            assert!(events.is_none(), "etcd-proxy emits no Events");
        } else {
            assert_eq!(
                events.map(|r| r.verbs).unwrap(),
                ["create", "patch"],
                "{op}: Events"
            );
        }
        let binding = by_name(
            &docs,
            &format!("{}Binding", kind(main_role)),
            name(main_role),
        );
        assert_eq!(binding["roleRef"]["kind"], kind(main_role));
        assert_eq!(binding["roleRef"]["name"], name(main_role));
        assert_eq!(
            binding["subjects"],
            json!([{ "kind": "ServiceAccount", "name": sa, "namespace": RELEASE_NS }])
        );
        let leader_roles: Vec<&Value> = rbac_of(&docs, "Role", op)
            .into_iter()
            .filter(|r| name(r).ends_with("-leader-election"))
            .collect();
        if elected {
            let lease_role = lease_role(&docs, op);
            assert_eq!(
                ns_of(lease_role),
                Some(RELEASE_NS),
                "{op}: the Lease's namespace"
            );
            let lease_rules = rules(lease_role);
            assert!(
                lease_rules
                    .iter()
                    .any(|r| r.verbs == ["create"] && r.resource_names.is_none()),
                "{op}: {lease_rules:?}"
            );
            assert!(
                lease_rules.iter().any(|r| r.verbs == ["get", "patch"]
                    && r.resource_names.as_deref() == Some(&[lease.clone()][..])),
                "{op}: only its own Lease is read and renewed: {lease_rules:?}"
            );
            let lease_binding = by_name(&docs, "RoleBinding", &format!("{lease}-leader-election"));
            assert_eq!(lease_binding["roleRef"]["name"], name(lease_role));
            assert_eq!(lease_binding["subjects"][0]["name"], sa);
        } else {
            assert!(leader_roles.is_empty(), "{op}: no Lease, no Lease Role");
        }

        // A metrics Service that also publishes the followers (never Ready).
        let service = metrics_service(&docs, op);
        assert_eq!(service["spec"]["publishNotReadyAddresses"], true, "{op}");
        assert_eq!(service["spec"]["ports"][0]["targetPort"], "admin", "{op}");
        assert_eq!(
            service["spec"]["selector"], d["spec"]["selector"]["matchLabels"],
            "{op}: the Service selects the operator's pods"
        );
    }

    // The addon-installer runs the image's helm, with its home on the writable /tmp.
    let a = args(deployment(&docs, "addon-installer"));
    assert!(
        a.contains(&"--helm=/usr/local/bin/helm".to_owned()),
        "{a:?}"
    );
    assert!(
        a.contains(&"--helm-home=/tmp/kontinuum-helm".to_owned()),
        "{a:?}"
    );

    assert!(
        of_kind(&docs, "PodDisruptionBudget").is_empty(),
        "one replica: no budget"
    );
    assert!(
        of_kind(&docs, "ServiceMonitor").is_empty(),
        "off by default"
    );

    // The usual labels on everything.
    for doc in &docs {
        let labels = &doc["metadata"]["labels"];
        for key in [
            "app.kubernetes.io/name",
            "app.kubernetes.io/instance",
            "app.kubernetes.io/version",
            "app.kubernetes.io/managed-by",
            "helm.sh/chart",
        ] {
            assert!(
                labels[key].is_string(),
                "{} lacks {key}",
                chart::describe(doc)
            );
        }
        assert_eq!(labels["app.kubernetes.io/instance"], RELEASE);
        assert_eq!(labels["helm.sh/chart"], "kontinuum-0.1.0");
        if kind(doc) != "ConfigMap" {
            assert!(
                component(doc).is_some(),
                "{} lacks a component",
                chart::describe(doc)
            );
        }
    }
}

#[test]
fn watch_namespace_turns_cluster_roles_into_roles_there() {
    let cluster_wide = render(&[]);
    let docs = render(&[("watchNamespace", "foo")]);
    // Left cluster-wide: only the registry's rule on the one CRD it wires (cluster-scoped).
    let cluster_roles: Vec<&str> = of_kind(&docs, "ClusterRole")
        .into_iter()
        .map(name)
        .collect();
    assert_eq!(cluster_roles, [format!("{RELEASE}-registry-cluster")]);
    let crd_rules = rules(of_kind(&docs, "ClusterRole")[0]);
    assert_eq!(
        crd_rules
            .iter()
            .map(|r| r.resource_names.clone())
            .collect::<Vec<_>>(),
        [Some(vec!["kontinuums.kontinuum.sh".to_owned()])],
        "narrowed to its CRD by name"
    );
    assert_eq!(of_kind(&docs, "ClusterRoleBinding").len(), 1);
    for op in WATCHING_OPERATORS {
        let cluster_role = operator_object(&cluster_wide, "ClusterRole", op).unwrap();
        let roles: Vec<&Value> = rbac_of(&docs, "Role", op)
            .into_iter()
            .filter(|r| ns_of(r) == Some("foo"))
            .collect();
        assert_eq!(roles.len(), 1, "{op}: one Role in foo");
        assert_eq!(
            rules(roles[0]),
            rules(cluster_role),
            "{op}: the same rules, in foo only"
        );
        let bindings: Vec<&Value> = rbac_of(&docs, "RoleBinding", op)
            .into_iter()
            .filter(|r| ns_of(r) == Some("foo"))
            .collect();
        assert_eq!(bindings.len(), 1, "{op}");
        assert_eq!(bindings[0]["roleRef"]["kind"], "Role");
        assert_eq!(bindings[0]["roleRef"]["name"], name(roles[0]));
        assert_eq!(bindings[0]["subjects"][0]["namespace"], RELEASE_NS);
        // The Lease stays in the release namespace.
        assert_eq!(ns_of(lease_role(&docs, op)), Some(RELEASE_NS), "{op}");
        let env = environment(&docs, deployment(&docs, op));
        assert_eq!(env["KONTINUUM_WATCH_NAMESPACE"], "foo", "{op}");
    }
    // etcd-proxy follows the watched namespace (the Zones, so their identity Secrets, are
    // there); the registry stays home, where its Kontinuums and Lease are.
    let proxy_role = by_name(&docs, "Role", &format!("{RELEASE}-etcd-proxy"));
    assert_eq!(ns_of(proxy_role), Some("foo"));
    assert!(args(deployment(&docs, "etcd-proxy")).contains(&"--namespace=foo".to_owned()));
    let registry_role = by_name(&docs, "Role", &format!("{RELEASE}-registry"));
    assert_eq!(ns_of(registry_role), Some(RELEASE_NS));
}

/// etcd-proxy reads Secrets in exactly one namespace, the one it is told to trust, and
/// writes none; the registry touches Kontinuums in the release namespace and one CRD.
#[test]
fn etcd_proxy_and_registry_rbac_is_confined() {
    let docs = render(&[]);
    let proxy = format!("{RELEASE}-etcd-proxy");
    let role = by_name(&docs, "Role", &proxy);
    assert_eq!(
        ns_of(role),
        Some(RELEASE_NS),
        "the release namespace by default"
    );
    let proxy_rules = rules(role);
    assert_eq!(proxy_rules.len(), 1, "{proxy_rules:?}");
    assert_eq!(
        proxy_rules[0].api_groups.as_deref(),
        Some(&[String::new()][..])
    );
    assert_eq!(
        proxy_rules[0].resources.as_deref(),
        Some(&["secrets".to_owned()][..])
    );
    assert_eq!(
        proxy_rules[0].verbs,
        ["list", "watch"],
        "read from a watch only"
    );
    assert!(
        rbac_of(&docs, "ClusterRole", "etcd-proxy").is_empty()
            && rbac_of(&docs, "ClusterRoleBinding", "etcd-proxy").is_empty(),
        "nothing cluster-wide"
    );
    assert!(args(deployment(&docs, "etcd-proxy")).contains(&format!("--namespace={RELEASE_NS}")));
    let elsewhere = render(&[
        ("operators.etcdProxy.identityNamespace", "zones"),
        ("watchNamespace", "foo"),
    ]);
    assert_eq!(ns_of(by_name(&elsewhere, "Role", &proxy)), Some("zones"));
    assert_eq!(
        by_name(&elsewhere, "RoleBinding", &proxy)["subjects"][0]["namespace"],
        RELEASE_NS
    );
    assert!(args(deployment(&elsewhere, "etcd-proxy")).contains(&"--namespace=zones".to_owned()));

    let registry = format!("{RELEASE}-registry");
    let role = by_name(&docs, "Role", &registry);
    assert_eq!(ns_of(role), Some(RELEASE_NS));
    let resources: BTreeSet<String> = rules(role)
        .into_iter()
        .flat_map(|r| r.resources.unwrap_or_default())
        .collect();
    assert_eq!(
        resources,
        ["events", "kontinuums", "kontinuums/status"]
            .map(str::to_owned)
            .into(),
    );
    let crd = by_name(&docs, "ClusterRole", &format!("{registry}-cluster"));
    let crd_rules = rules(crd);
    assert_eq!(crd_rules.len(), 1);
    assert_eq!(
        crd_rules[0].resource_names.as_deref(),
        Some(&["kontinuums.kontinuum.sh".to_owned()][..])
    );
    assert_eq!(crd_rules[0].verbs, ["get", "list", "watch", "patch"]);
    let binding = by_name(&docs, "ClusterRoleBinding", &format!("{registry}-cluster"));
    assert_eq!(binding["subjects"][0]["name"], registry);
}

/// Whether a `matchLabels` selector selects an object with `labels`.
fn selects(selector: &Value, labels: &Value) -> bool {
    selector["matchLabels"]
        .as_object()
        .is_some_and(|m| !m.is_empty() && m.iter().all(|(k, v)| &labels[k] == v))
}

/// The pod template labels of every rendered Deployment and StatefulSet, by name.
fn pod_labels(docs: &[Value]) -> BTreeMap<String, Value> {
    docs.iter()
        .filter(|d| ["Deployment", "StatefulSet"].contains(&kind(d)))
        .map(|d| {
            (
                name(d).to_owned(),
                d["spec"]["template"]["metadata"]["labels"].clone(),
            )
        })
        .collect()
}

/// The etcd release the test bed runs (its go.mod), which the store's image pins too.
fn testbed_etcd_version() -> String {
    let gomod = std::fs::read_to_string(workspace().join("e2e/testbed/tools/k8s/go.mod")).unwrap();
    gomod
        .lines()
        .find_map(|l| l.trim().strip_prefix("go.etcd.io/etcd/server/v3 "))
        .and_then(|rest| rest.split_whitespace().next())
        .expect("the test bed pins etcd")
        .to_owned()
}

/// `--flag=value` of `args`.
fn flag<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    args.iter()
        .find_map(|a| a.strip_prefix(flag)?.strip_prefix('='))
}

#[test]
fn the_store_is_a_hardened_etcd_statefulset_that_only_etcd_proxy_and_registry_reach() {
    let docs = render(&[]);
    let store = format!("{RELEASE}-store");
    let peers = format!("{store}-peers");
    let sts = by_name(&docs, "StatefulSet", &store);
    assert_eq!(component(sts), Some(STORE));
    assert_eq!(sts["spec"]["replicas"], 1, "one member by default");
    assert_eq!(sts["spec"]["serviceName"], peers);
    assert_eq!(sts["spec"]["podManagementPolicy"], "Parallel");
    let pod = &sts["spec"]["template"]["spec"];
    let c = container(sts);
    assert_eq!(
        c["image"],
        format!("quay.io/coreos/etcd:{}", testbed_etcd_version()),
        "the upstream image, at the etcd release the tests run"
    );
    assert_eq!(c["command"], json!(["/usr/local/bin/etcd"]));
    assert_eq!(
        pod["automountServiceAccountToken"], false,
        "etcd needs no API access"
    );
    for (what, sc) in [
        ("pod", &pod["securityContext"]),
        ("container", &c["securityContext"]),
    ] {
        assert_eq!(sc["runAsNonRoot"], true, "{what}");
        assert_eq!(sc["runAsUser"], 65532, "{what}");
        assert_eq!(sc["seccompProfile"]["type"], "RuntimeDefault", "{what}");
    }
    assert_eq!(
        pod["securityContext"]["fsGroup"], 65532,
        "the volume is writable"
    );
    let sc = &c["securityContext"];
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]));
    assert!(c["resources"]["limits"]["memory"].is_string());
    assert!(c["resources"]["requests"]["cpu"].is_string());
    // etcd's own health endpoints on its metrics listener.
    for (probe, path) in [
        ("startupProbe", "/livez"),
        ("livenessProbe", "/livez"),
        ("readinessProbe", "/readyz"),
    ] {
        assert_eq!(c[probe]["httpGet"]["path"], path, "{probe}");
        assert_eq!(c[probe]["httpGet"]["port"], "metrics", "{probe}");
    }
    assert_eq!(container_port(sts, "metrics"), 2381);
    let a = args(sts);
    assert_eq!(
        flag(&a, "--listen-metrics-urls"),
        Some("http://$(POD_IP):2381")
    );
    assert_eq!(
        flag(&a, "--listen-client-urls"),
        Some("http://$(POD_IP):2379")
    );
    assert_eq!(flag(&a, "--name"), Some("$(POD_NAME)"));
    let member_url = |port: u16| format!("http://{store}-0.{peers}.{RELEASE_NS}.svc:{port}");
    assert_eq!(
        flag(&a, "--initial-cluster"),
        Some(format!("{store}-0={}", member_url(2380)).as_str())
    );
    assert_eq!(
        flag(&a, "--advertise-client-urls"),
        Some(format!("http://$(POD_NAME).{peers}.{RELEASE_NS}.svc:2379").as_str())
    );
    assert_eq!(flag(&a, "--auto-compaction-mode"), Some("periodic"));
    // The data directory on a volume claimed per member.
    let data = flag(&a, "--data-dir").unwrap();
    let mount = c["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| data.starts_with(m["mountPath"].as_str().unwrap()))
        .expect("the data directory is on a volume");
    let claims = sts["spec"]["volumeClaimTemplates"].as_array().unwrap();
    assert_eq!(claims.len(), 1);
    assert_eq!(claims[0]["metadata"]["name"], mount["name"]);
    assert_eq!(claims[0]["spec"]["resources"]["requests"]["storage"], "8Gi");
    assert_eq!(claims[0]["spec"]["accessModes"], json!(["ReadWriteOnce"]));
    assert!(
        claims[0]["spec"]["storageClassName"].is_null(),
        "the default class"
    );
    assert!(
        pod["volumes"].is_null(),
        "no other volume: {}",
        pod["volumes"]
    );

    // A headless Service names the members (before they are Ready: they must meet), a
    // client Service is what etcd-proxy and registry use.
    let members = &sts["spec"]["template"]["metadata"]["labels"];
    let headless = by_name(&docs, "Service", &peers);
    assert_eq!(headless["spec"]["clusterIP"], "None");
    assert_eq!(headless["spec"]["publishNotReadyAddresses"], true);
    let client = by_name(&docs, "Service", &store);
    for svc in [headless, client] {
        assert!(
            selects(&json!({ "matchLabels": svc["spec"]["selector"] }), members),
            "{} selects the members",
            name(svc)
        );
    }
    assert_eq!(client["spec"]["ports"][0]["port"], 2379);
    assert_eq!(client["spec"]["ports"][0]["targetPort"], "client");
    for op in ["etcd-proxy", "registry"] {
        assert_eq!(
            flag(&args(deployment(&docs, op)), "--store"),
            Some(format!("http://{store}.{RELEASE_NS}.svc:2379").as_str()),
            "{op} uses the client Service"
        );
    }

    // The NetworkPolicy: only etcd-proxy's and the registry's pods reach the client port,
    // only members the peer port, nobody the metrics port.
    let policy = by_name(&docs, "NetworkPolicy", &store);
    assert!(selects(&policy["spec"]["podSelector"], members));
    assert_eq!(policy["spec"]["policyTypes"], json!(["Ingress"]));
    let workloads = pod_labels(&docs);
    let mut admitted: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for rule in policy["spec"]["ingress"].as_array().unwrap() {
        let from = rule["from"].as_array().expect("every rule names its peers");
        assert!(!from.is_empty(), "a rule without peers admits everyone");
        for port in rule["ports"].as_array().unwrap() {
            let port = port["port"].as_str().unwrap().to_owned();
            for peer in from {
                assert!(
                    peer["namespaceSelector"].is_null() && peer["ipBlock"].is_null(),
                    "{peer}"
                );
                for (workload, labels) in &workloads {
                    if selects(&peer["podSelector"], labels) {
                        admitted
                            .entry(port.clone())
                            .or_default()
                            .insert(workload.clone());
                    }
                }
            }
        }
    }
    assert_eq!(
        admitted,
        BTreeMap::from([
            (
                "client".to_owned(),
                [
                    format!("{RELEASE}-etcd-proxy"),
                    format!("{RELEASE}-registry")
                ]
                .into()
            ),
            ("peer".to_owned(), [store.clone()].into()),
        ])
    );
    for port in ["client", "peer"] {
        container_port(sts, port);
    }
    assert!(
        of_kind(&docs, "PodDisruptionBudget").is_empty(),
        "one member: no budget"
    );
}

#[test]
fn store_values_reach_the_statefulset() {
    let docs = render(&[
        ("store.replicas", "3"),
        ("store.persistence.size", "20Gi"),
        ("store.persistence.storageClass", "fast"),
        ("store.image.repository", "mirror.example/etcd"),
        ("store.image.tag", "v3.7.1"),
        ("store.autoCompactionRetention", "30m"),
        ("store.extraArgs[0]", "--experimental-flag"),
        (
            "store.networkPolicy.metricsFrom[0].podSelector.matchLabels.app",
            "prometheus",
        ),
    ]);
    let store = format!("{RELEASE}-store");
    let sts = by_name(&docs, "StatefulSet", &store);
    assert_eq!(sts["spec"]["replicas"], 3);
    assert_eq!(container(sts)["image"], "mirror.example/etcd:v3.7.1");
    let claim = &sts["spec"]["volumeClaimTemplates"][0]["spec"];
    assert_eq!(claim["storageClassName"], "fast");
    assert_eq!(claim["resources"]["requests"]["storage"], "20Gi");
    let a = args(sts);
    let members: Vec<String> = (0..3)
        .map(|i| format!("{store}-{i}=http://{store}-{i}.{store}-peers.{RELEASE_NS}.svc:2380"))
        .collect();
    assert_eq!(
        flag(&a, "--initial-cluster"),
        Some(members.join(",").as_str())
    );
    assert_eq!(flag(&a, "--auto-compaction-retention"), Some("30m"));
    assert_eq!(a.last().unwrap(), "--experimental-flag");
    let pdb = by_name(&docs, "PodDisruptionBudget", &store);
    assert_eq!(
        pdb["spec"]["maxUnavailable"], 1,
        "a quorum of three survives one"
    );
    let policy = by_name(&docs, "NetworkPolicy", &store);
    let metrics = policy["spec"]["ingress"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["ports"][0]["port"] == "metrics")
        .expect("metricsFrom admits the scraper");
    assert_eq!(
        metrics["from"],
        json!([{ "podSelector": { "matchLabels": { "app": "prometheus" } } }])
    );

    // Without persistence: an emptyDir, no claims. Without the policy: none.
    let docs = render(&[
        ("store.persistence.enabled", "false"),
        ("store.networkPolicy.enabled", "false"),
    ]);
    let sts = by_name(&docs, "StatefulSet", &store);
    assert!(sts["spec"]["volumeClaimTemplates"].is_null());
    let data = flag(&args(sts), "--data-dir").unwrap().to_owned();
    assert!(data.starts_with("/var/lib/etcd"), "{data}");
    assert!(mounted(sts, "/var/lib/etcd")["emptyDir"].is_object());
    assert!(of_kind(&docs, "NetworkPolicy").is_empty());
    // With etcd-proxy disabled, the policy admits the registry alone.
    let docs = render(&[("operators.etcdProxy.enabled", "false")]);
    let policy = by_name(&docs, "NetworkPolicy", &store);
    let client_rules: Vec<&Value> = policy["spec"]["ingress"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["ports"][0]["port"] == "client")
        .collect();
    assert_eq!(client_rules.len(), 1);
    assert_eq!(
        client_rules[0]["from"][0]["podSelector"]["matchLabels"][chart::COMPONENT],
        "registry"
    );
}

#[test]
fn an_external_store_deploys_nothing_and_reaches_both_users() {
    let endpoints = "https://store-0.example:2379,https://store-1.example:2379";
    let docs = render(&[
        (
            "store.external.endpoints[0]",
            "https://store-0.example:2379",
        ),
        (
            "store.external.endpoints[1]",
            "https://store-1.example:2379",
        ),
        ("store.external.tls.secretName", "store-client"),
    ]);
    let stored: Vec<String> = docs
        .iter()
        .filter(|d| component(d) == Some(STORE))
        .map(chart::describe)
        .collect();
    assert!(
        stored.is_empty(),
        "nothing of the chart's own store: {stored:?}"
    );
    assert!(of_kind(&docs, "StatefulSet").is_empty());
    assert!(of_kind(&docs, "NetworkPolicy").is_empty());
    for op in ["etcd-proxy", "registry"] {
        let d = deployment(&docs, op);
        let a = args(d);
        assert_eq!(flag(&a, "--store"), Some(endpoints), "{op}");
        let volume = mounted(d, "/etc/kontinuum/store-tls");
        assert_eq!(volume["secret"]["secretName"], "store-client", "{op}");
        assert_eq!(volume["secret"]["defaultMode"], 0o440, "{op}");
        for (flag_, file) in [
            ("--store-ca", "ca.crt"),
            ("--store-cert", "tls.crt"),
            ("--store-key", "tls.key"),
        ] {
            assert_eq!(
                flag(&a, flag_),
                Some(format!("/etc/kontinuum/store-tls/{file}").as_str()),
                "{op}"
            );
        }
    }
    // A store that checks no client certificate: only its CA.
    let docs = render(&[
        (
            "store.external.endpoints[0]",
            "https://store-0.example:2379",
        ),
        ("store.external.tls.secretName", "store-ca"),
        ("store.external.tls.clientCertificate", "false"),
    ]);
    for op in ["etcd-proxy", "registry"] {
        let a = args(deployment(&docs, op));
        assert!(flag(&a, "--store-ca").is_some(), "{op}");
        assert!(flag(&a, "--store-cert").is_none() && flag(&a, "--store-key").is_none());
    }
    // No TLS Secret: no files (an https store is then checked against the system's roots).
    let docs = render(&[("store.external.endpoints[0]", "http://10.0.0.5:2379")]);
    for op in ["etcd-proxy", "registry"] {
        let d = deployment(&docs, op);
        let a = args(d);
        assert_eq!(flag(&a, "--store"), Some("http://10.0.0.5:2379"));
        assert!(flag(&a, "--store-ca").is_none(), "{op}");
        assert!(
            !container(d)["volumeMounts"]
                .as_array()
                .unwrap()
                .iter()
                .any(|m| m["mountPath"] == "/etc/kontinuum/store-tls"),
            "{op}"
        );
    }
}

/// The serving certificates: generated by the chart (its CA, never mounted; each serving
/// Secret mounted where the flags point, with the names clients use), or cert-manager
/// Certificates for the very same Secrets. (`chart_install.rs` checks real TLS handshakes
/// against them.)
#[test]
fn serving_certificates_are_generated_or_issued_by_cert_manager() {
    let proxy = format!("{RELEASE}-etcd-proxy");
    let grpc = format!("{proxy}-grpc");
    let webhook = format!("{RELEASE}-registry-webhook");
    let svc_names = |svc: &str| {
        vec![
            svc.to_owned(),
            format!("{svc}.{RELEASE_NS}"),
            format!("{svc}.{RELEASE_NS}.svc"),
            format!("{svc}.{RELEASE_NS}.svc.cluster.local"),
        ]
    };
    let docs = render(&[
        ("server.grpcEndpoint", "proxy.hub.example:443"),
        ("operators.etcdProxy.service.type", "LoadBalancer"),
        ("operators.etcdProxy.service.port", "443"),
        ("operators.etcdProxy.service.nodePort", "30443"),
        (
            "operators.etcdProxy.service.annotations.lb\\.example/scheme",
            "internal",
        ),
    ]);
    let ca = by_name(&docs, "Secret", &format!("{RELEASE}-ca"));
    assert_eq!(ca["type"], "kubernetes.io/tls");
    let ca_cert = ca["data"]["tls.crt"].as_str().unwrap();
    // The CA key is mounted nowhere.
    for d in docs
        .iter()
        .filter(|d| ["Deployment", "StatefulSet"].contains(&kind(d)))
    {
        let volumes = d["spec"]["template"]["spec"]["volumes"].to_string();
        assert!(!volumes.contains(name(ca)), "{} mounts the CA", name(d));
    }

    let expect = [
        (
            "etcd-proxy",
            format!("{proxy}-tls"),
            "/etc/kontinuum/tls",
            [("--tls-cert", "tls.crt"), ("--tls-key", "tls.key")].to_vec(),
            [vec!["proxy.hub.example".to_owned()], svc_names(&grpc)].concat(),
        ),
        (
            "registry",
            format!("{webhook}-tls"),
            "/etc/kontinuum/webhook-tls",
            [
                ("--webhook-cert", "tls.crt"),
                ("--webhook-key", "tls.key"),
                ("--webhook-ca", "ca.crt"),
            ]
            .to_vec(),
            svc_names(&webhook),
        ),
    ];
    for (op, secret_name, dir, files, names) in &expect {
        let secret = by_name(&docs, "Secret", secret_name);
        assert_eq!(component(secret), Some(*op));
        assert_eq!(secret["type"], "kubernetes.io/tls");
        assert_eq!(
            secret["data"]["ca.crt"], ca_cert,
            "{op}: signed by the chart's CA"
        );
        for key in ["tls.crt", "tls.key"] {
            assert!(
                secret["data"][key].as_str().is_some_and(|v| v.len() > 100),
                "{op}: {key}"
            );
        }
        assert_eq!(
            secret["metadata"]["annotations"]["kontinuum.sh/names"],
            names.join(","),
            "{op}"
        );
        let d = deployment(&docs, op);
        let volume = mounted(d, dir);
        assert_eq!(volume["secret"]["secretName"], secret_name.as_str(), "{op}");
        assert_eq!(volume["secret"]["defaultMode"], 0o440, "{op}");
        let a = args(d);
        for (flag_, file) in files {
            assert_eq!(
                flag(&a, flag_),
                Some(format!("{dir}/{file}").as_str()),
                "{op}"
            );
        }
    }

    // etcd-proxy's Service: what zones reach through server.grpcEndpoint.
    let svc = by_name(&docs, "Service", &grpc);
    assert_eq!(component(svc), Some("etcd-proxy"));
    assert_eq!(svc["spec"]["type"], "LoadBalancer");
    assert_eq!(
        svc["metadata"]["annotations"]["lb.example/scheme"],
        "internal"
    );
    let port = &svc["spec"]["ports"][0];
    assert_eq!(port["port"], 443);
    assert_eq!(port["nodePort"], 30443);
    assert_eq!(port["targetPort"], "grpc");
    let d = deployment(&docs, "etcd-proxy");
    assert_eq!(
        flag(&args(d), "--listen"),
        Some(format!("$(POD_IP):{}", container_port(d, "grpc")).as_str())
    );
    assert_eq!(
        svc["spec"]["selector"],
        d["spec"]["selector"]["matchLabels"]
    );
    // The registry's webhook Service, which it writes into the CRD (port 443).
    let svc = by_name(&docs, "Service", &webhook);
    let d = deployment(&docs, "registry");
    let a = args(d);
    assert_eq!(flag(&a, "--webhook-service"), Some(webhook.as_str()));
    assert_eq!(flag(&a, "--webhook-service-port"), Some("443"));
    assert_eq!(svc["spec"]["ports"][0]["port"], 443);
    assert_eq!(svc["spec"]["ports"][0]["targetPort"], "webhook");
    assert_eq!(
        flag(&a, "--webhook-addr"),
        Some(format!("$(POD_IP):{}", container_port(d, "webhook")).as_str())
    );
    assert_eq!(
        svc["spec"]["selector"],
        d["spec"]["selector"]["matchLabels"]
    );
    assert!(
        svc["spec"]["publishNotReadyAddresses"].is_null(),
        "Ready pods only"
    );
    assert_eq!(
        flag(&a, "--name"),
        Some(RELEASE),
        "the hub's Kontinuum: the fullname"
    );

    // The webhook at a URL (the registry on the node's network): the URL's host is named.
    let docs = render(&[
        ("operators.registry.hostNetwork", "true"),
        (
            "operators.registry.webhookUrl",
            "https://10.0.0.7:9443/convert",
        ),
    ]);
    let d = deployment(&docs, "registry");
    assert_eq!(d["spec"]["template"]["spec"]["hostNetwork"], true);
    assert_eq!(
        d["spec"]["template"]["spec"]["dnsPolicy"],
        "ClusterFirstWithHostNet"
    );
    let a = args(d);
    assert_eq!(
        flag(&a, "--webhook-url"),
        Some("https://10.0.0.7:9443/convert")
    );
    assert!(flag(&a, "--webhook-service").is_none(), "{a:?}");
    let secret = by_name(&docs, "Secret", &format!("{webhook}-tls"));
    assert_eq!(
        secret["metadata"]["annotations"]["kontinuum.sh/names"],
        [svc_names(&webhook), vec!["10.0.0.7".to_owned()]]
            .concat()
            .join(",")
    );
    for op in OPERATORS.iter().filter(|op| **op != "registry") {
        assert!(
            deployment(&docs, op)["spec"]["template"]["spec"]["hostNetwork"].is_null(),
            "{op}"
        );
    }

    // An IP endpoint is an IP name.
    let docs = render(&[("server.grpcEndpoint", "203.0.113.7:443")]);
    let secret = by_name(&docs, "Secret", &format!("{proxy}-tls"));
    assert_eq!(
        secret["metadata"]["annotations"]["kontinuum.sh/names"],
        [svc_names(&grpc), vec!["203.0.113.7".to_owned()]]
            .concat()
            .join(",")
    );

    // cert-manager: the same Secrets, issued; nothing generated.
    let docs = render(&[
        ("server.grpcEndpoint", "203.0.113.7:443"),
        ("certManager.enabled", "true"),
        ("certManager.issuerRef.name", "hub-ca"),
        ("certManager.issuerRef.kind", "Issuer"),
    ]);
    assert!(
        of_kind(&docs, "Secret").is_empty(),
        "no generated Secret, no CA"
    );
    let certificates = of_kind(&docs, "Certificate");
    assert_eq!(certificates.len(), 2);
    for (op, secret_name, dir, _, names) in &expect {
        let cert = by_name(&docs, "Certificate", secret_name);
        assert_eq!(cert["apiVersion"], "cert-manager.io/v1");
        assert_eq!(component(cert), Some(*op));
        assert_eq!(cert["spec"]["secretName"], secret_name.as_str());
        assert_eq!(
            cert["spec"]["issuerRef"],
            json!({ "name": "hub-ca", "kind": "Issuer", "group": "cert-manager.io" })
        );
        let mut want = names.clone();
        if *op == "etcd-proxy" {
            want.retain(|n| n != "proxy.hub.example");
            assert_eq!(cert["spec"]["ipAddresses"], json!(["203.0.113.7"]));
        }
        assert_eq!(cert["spec"]["dnsNames"], json!(want), "{op}");
        assert_eq!(
            mounted(deployment(&docs, op), dir)["secret"]["secretName"],
            secret_name.as_str()
        );
    }
}

/// The zone-installer mirrors CAs into zones: it gets the etcd proxy's CA (never the proxy's
/// key) and, with `auth.oidc.caSecret`, a private issuer's CA, each as a file its variable
/// names; nothing of either when absent.
#[test]
fn the_zone_installer_is_given_only_the_cas_it_mirrors() {
    let only_ca = |volume: &Value| {
        assert_eq!(
            volume["secret"]["items"],
            json!([{ "key": "ca.crt", "path": "ca.crt" }]),
            "{volume}"
        );
    };
    let docs = render(&[]);
    let zi = deployment(&docs, "zone-installer");
    let env = environment(&docs, zi);
    assert_eq!(
        env.get("KONTINUUM_PROXY_CA_FILE").map(String::as_str),
        Some("/etc/kontinuum/proxy-ca/ca.crt")
    );
    let proxy = mounted(zi, "/etc/kontinuum/proxy-ca");
    assert_eq!(
        proxy["secret"]["secretName"],
        mounted(deployment(&docs, "etcd-proxy"), "/etc/kontinuum/tls")["secret"]["secretName"],
        "the Secret etcd-proxy serves with"
    );
    only_ca(proxy);
    assert!(!env.contains_key("KONTINUUM_OIDC_CA_FILE"));

    let docs = render(&[
        ("auth.oidc.issuerUrl", "https://id.example.com"),
        ("auth.oidc.adminGroups[0]", "admins"),
        ("auth.oidc.caSecret", "issuer-ca"),
    ]);
    let zi = deployment(&docs, "zone-installer");
    assert_eq!(
        environment(&docs, zi)
            .get("KONTINUUM_OIDC_CA_FILE")
            .map(String::as_str),
        Some("/etc/kontinuum/oidc-ca/ca.crt")
    );
    let oidc = mounted(zi, "/etc/kontinuum/oidc-ca");
    assert_eq!(oidc["secret"]["secretName"], "issuer-ca");
    only_ca(oidc);

    let docs = render(&[("operators.etcdProxy.enabled", "false")]);
    let zi = deployment(&docs, "zone-installer");
    assert!(!environment(&docs, zi).contains_key("KONTINUUM_PROXY_CA_FILE"));
    assert!(
        zi["spec"]["template"]["spec"]["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .all(|v| v["name"] != "proxy-ca")
    );
}

#[test]
fn a_disruption_budget_only_above_one_replica() {
    assert!(of_kind(&render(&[]), "PodDisruptionBudget").is_empty());
    let docs = render(&[("operators.poolClaimer.replicas", "2")]);
    let budgets = of_kind(&docs, "PodDisruptionBudget");
    assert_eq!(budgets.len(), 1, "only pool-claimer has two replicas");
    let pdb = budgets[0];
    assert_eq!(component(pdb), Some("pool-claimer"));
    let d = deployment(&docs, "pool-claimer");
    assert_eq!(d["spec"]["replicas"], 2);
    assert_eq!(pdb["spec"]["selector"], d["spec"]["selector"]);
    assert_eq!(pdb["spec"]["maxUnavailable"], 1);
    assert_eq!(deployment(&docs, "addon-installer")["spec"]["replicas"], 1);

    let all = render(&[("operatorDefaults.replicas", "3")]);
    assert_eq!(of_kind(&all, "PodDisruptionBudget").len(), OPERATORS.len());

    // Replicas without leader election would act at once.
    let err = helm_error(&[
        ("operators.poolClaimer.replicas", "2"),
        ("leaderElection.enabled", "false"),
    ]);
    assert!(err.contains("leaderElection.enabled"), "{err}");
    let single = render(&[("leaderElection.enabled", "false")]);
    for op in OPERATORS {
        let single_args = args(deployment(&single, op));
        assert!(!single_args.contains(&"--leader-elect".to_owned()));
        // The binaries elect by default, so the chart turns it off explicitly (etcd-proxy
        // has no election to turn off).
        assert_eq!(
            single_args.contains(&"--leader-elect=false".to_owned()),
            op != "etcd-proxy",
            "{op}: {single_args:?}"
        );
        assert!(
            !rbac_of(&single, "Role", op)
                .iter()
                .any(|r| name(r).ends_with("-leader-election")),
            "{op}: no Lease Role"
        );
    }
    // etcd-proxy has no Lease: its replicas all serve, with or without leader election.
    let proxies = render(&[
        ("operators.etcdProxy.replicas", "3"),
        ("leaderElection.enabled", "false"),
    ]);
    assert_eq!(deployment(&proxies, "etcd-proxy")["spec"]["replicas"], 3);
    assert_eq!(
        component(of_kind(&proxies, "PodDisruptionBudget")[0]),
        Some("etcd-proxy")
    );
}

#[test]
fn service_monitors_only_when_enabled() {
    assert!(of_kind(&render(&[]), "ServiceMonitor").is_empty());
    let docs = render(&[
        ("serviceMonitor.enabled", "true"),
        ("serviceMonitor.labels.release", "prom"),
    ]);
    let monitors = of_kind(&docs, "ServiceMonitor");
    assert_eq!(monitors.len(), OPERATORS.len());
    for op in OPERATORS {
        let sm = operator_object(&docs, "ServiceMonitor", op).unwrap();
        assert_eq!(sm["apiVersion"], "monitoring.coreos.com/v1");
        assert_eq!(sm["metadata"]["labels"]["release"], "prom");
        let selected = sm["spec"]["selector"]["matchLabels"].as_object().unwrap();
        let matches = |doc: &Value| {
            selected
                .iter()
                .all(|(k, v)| &doc["metadata"]["labels"][k] == v)
        };
        // Exactly its metrics Service: not etcd-proxy's gRPC or the registry's webhook one.
        let services: Vec<&str> = of_kind(&docs, "Service")
            .into_iter()
            .filter(|d| matches(d))
            .map(name)
            .collect();
        assert_eq!(
            services,
            [format!("{RELEASE}-{op}")],
            "{op}: selects its Service"
        );
        let service = metrics_service(&docs, op);
        assert_eq!(
            sm["spec"]["endpoints"][0]["port"],
            service["spec"]["ports"][0]["name"]
        );
        assert_eq!(sm["spec"]["endpoints"][0]["path"], "/metrics");
    }
    let err = helm_error(&[
        ("serviceMonitor.enabled", "true"),
        ("metricsService.enabled", "false"),
    ]);
    assert!(err.contains("metricsService.enabled"), "{err}");
}

#[test]
fn values_reach_the_operators_arguments_and_environment() {
    let docs = render(&[
        ("logLevel", "debug"),
        ("logFormat", "text"),
        ("operators.poolClaimer.logLevel", "warn"),
        ("operators.poolClaimer.adminPort", "9090"),
        (
            "operators.poolClaimer.extraArgs[0]",
            "--lease-duration-seconds=30",
        ),
        ("operators.poolClaimer.env[0].name", "EXTRA"),
        ("operators.poolClaimer.env[0].value", "yes"),
        (
            "operators.addonInstaller.chartMirror",
            "oci://mirror.example/charts",
        ),
        ("operators.addonInstaller.resyncInterval", "2m"),
        ("operators.instanceDiscovery.dialTimeoutSeconds", "7"),
        ("operators.talosBootstrapper.serviceAccountKeyBits", "2048"),
        (
            "operators.talosBootstrapper.teardownTimeoutSeconds",
            "86400",
        ),
        ("server.dnsDomain", "zones.example"),
        ("server.grpcEndpoint", "hub.example:443"),
        ("acme.email", "ops@example.org"),
        ("auth.oidc.issuerUrl", "https://id.example"),
        ("auth.oidc.adminGroups[0]", "platform"),
        ("auth.oidc.adminGroups[1]", "sre"),
        ("image.repository", "registry.example/kontinuum"),
        ("image.tag", "1.2.3"),
        ("image.pullPolicy", "Never"),
        ("leaderElection.leaseDurationSeconds", "20"),
        ("operators.registry.heartbeatSeconds", "5"),
        ("operators.registry.ttlSeconds", "30"),
        ("operators.registry.webhookPort", "9444"),
        ("operators.etcdProxy.grpcPort", "2400"),
    ]);
    let claimer = deployment(&docs, "pool-claimer");
    let env = environment(&docs, claimer);
    assert_eq!(
        env["KONTINUUM_LOG_LEVEL"], "warn",
        "the operator's own level wins"
    );
    assert_eq!(env["EXTRA"], "yes");
    let a = args(claimer);
    assert!(
        a.contains(&"--admin-addr=$(POD_IP):9090".to_owned()),
        "{a:?}"
    );
    assert_eq!(probe_port(claimer, "readinessProbe").1, 9090);
    assert_eq!(
        a.last().unwrap(),
        "--lease-duration-seconds=30",
        "extraArgs come last"
    );
    assert!(
        a.contains(&"--lease-duration-seconds=20".to_owned()),
        "{a:?}"
    );
    assert_eq!(
        operator_object(&docs, "Service", "pool-claimer").unwrap()["spec"]["ports"][0]["port"],
        9090
    );

    for op in OPERATORS {
        let d = deployment(&docs, op);
        let c = container(d);
        assert_eq!(c["image"], "registry.example/kontinuum:1.2.3");
        assert_eq!(c["imagePullPolicy"], "Never");
        let env = environment(&docs, d);
        if op != "pool-claimer" {
            assert_eq!(env["KONTINUUM_LOG_LEVEL"], "debug", "{op}");
        }
        assert_eq!(env["KONTINUUM_LOG_FORMAT"], "text", "{op}");
        assert_eq!(env["KONTINUUM_SERVER_DNS_DOMAIN"], "zones.example", "{op}");
        assert_eq!(
            env["KONTINUUM_SERVER_GRPC_ENDPOINT"], "hub.example:443",
            "{op}"
        );
        assert_eq!(env["KONTINUUM_ACME_EMAIL"], "ops@example.org", "{op}");
        assert_eq!(
            env["KONTINUUM_OIDC_ISSUER_URL"], "https://id.example",
            "{op}"
        );
        assert_eq!(env["KONTINUUM_OIDC_ADMIN_GROUPS"], "platform,sre", "{op}");
        assert_eq!(env["KONTINUUM_INSECURE_ALLOW_ANONYMOUS"], "false", "{op}");
    }
    let addon = environment(&docs, deployment(&docs, "addon-installer"));
    assert_eq!(
        addon["KONTINUUM_ADDON_CHART_MIRROR"],
        "oci://mirror.example/charts"
    );
    assert_eq!(addon["KONTINUUM_ADDON_RESYNC_INTERVAL"], "2m");
    assert_eq!(addon["KONTINUUM_ADDON_CONCURRENCY"], "4");
    let discovery = environment(&docs, deployment(&docs, "instance-discovery"));
    assert_eq!(discovery["KONTINUUM_DISCOVERY_DIAL_TIMEOUT_SECONDS"], "7");
    assert_eq!(discovery["KONTINUUM_DISCOVERY_CONCURRENCY"], "16");
    let bootstrapper = environment(&docs, deployment(&docs, "talos-bootstrapper"));
    assert_eq!(bootstrapper["KONTINUUM_SERVICE_ACCOUNT_KEY_BITS"], "2048");
    assert_eq!(bootstrapper["KONTINUUM_TEARDOWN_TIMEOUT_SECONDS"], "86400");
    assert_eq!(bootstrapper["KONTINUUM_TALOS_PORT"], "50000");
    let registry = deployment(&docs, "registry");
    let env = environment(&docs, registry);
    assert_eq!(env["KONTINUUM_REGISTRY_HEARTBEAT_SECONDS"], "5");
    assert_eq!(env["KONTINUUM_REGISTRY_TTL_SECONDS"], "30");
    assert!(args(registry).contains(&"--webhook-addr=$(POD_IP):9444".to_owned()));
    assert_eq!(container_port(registry, "webhook"), 9444);
    let proxy = deployment(&docs, "etcd-proxy");
    assert!(args(proxy).contains(&"--listen=$(POD_IP):2400".to_owned()));
    assert_eq!(container_port(proxy, "grpc"), 2400);

    // An empty mirror is left out (the binary's default: the built-ins' own repositories).
    let defaults = render(&[]);
    let addon = environment(&defaults, deployment(&defaults, "addon-installer"));
    assert!(
        !addon.contains_key("KONTINUUM_ADDON_CHART_MIRROR"),
        "{addon:?}"
    );

    // A changed setting restarts the pods.
    let checksum = |docs: &[Value]| {
        deployment(docs, "pool-claimer")["spec"]["template"]["metadata"]["annotations"]["checksum/env"].clone()
    };
    assert_ne!(checksum(&docs), checksum(&defaults));

    // Exactly one auth mode.
    let err = helm_error(&[
        ("auth.insecureAllowAnonymous", "true"),
        ("auth.oidc.issuerUrl", "https://id.example"),
        ("auth.oidc.adminGroups[0]", "platform"),
    ]);
    assert!(err.contains("auth.insecureAllowAnonymous"), "{err}");
}

/// Every flag the chart passes, and every KONTINUUM_* variable of an operator's own settings,
/// is one the binary (its subcommand, for etcd-proxy and registry) accepts (a binary refuses
/// unknown flags): checked against `--help`.
#[test]
fn rendered_flags_and_variables_are_ones_the_binaries_know() {
    let defaults = render(&[]);
    let others = render(&[
        (
            "operators.addonInstaller.chartMirror",
            "https://mirror.example",
        ),
        ("store.external.endpoints[0]", "https://store.example:2379"),
        ("store.external.tls.secretName", "store-client"),
        (
            "operators.registry.webhookUrl",
            "https://hub.example:9443/convert",
        ),
    ]);
    for (docs, op) in OPERATORS
        .iter()
        .flat_map(|op| [(&defaults, *op), (&others, *op)])
    {
        let bin = kontinuum_e2e::workspace_binary(op).unwrap();
        let d = deployment(docs, op);
        let subcommand = chart::deployment_subcommand(docs, op).unwrap();
        let out = std::process::Command::new(&bin)
            .args(subcommand.iter())
            .arg("--help")
            .output()
            .unwrap();
        assert!(out.status.success(), "{op} {subcommand:?} --help");
        let help = String::from_utf8_lossy(&out.stdout);
        for arg in args(d).iter().skip(usize::from(subcommand.is_some())) {
            let flag = arg.split('=').next().unwrap();
            assert!(
                flag.starts_with("--"),
                "{op}: {arg} is not a flag (a subcommand must come first)"
            );
            assert!(
                help.contains(&format!("{flag} "))
                    || help.contains(&format!("{flag}\n"))
                    || help.contains(&format!("{flag} <"))
                    // A flag whose value is optional (`--leader-elect[=<LEADER_ELECT>]`).
                    || help.contains(&format!("{flag}[=")),
                "{op} does not take {flag}:\n{help}"
            );
        }
        let own: Vec<String> = container(d)["env"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|e| e["name"].as_str())
            .filter(|n| n.starts_with("KONTINUUM_"))
            .map(str::to_owned)
            .collect();
        assert!(
            !own.is_empty() || ["pool-claimer", "etcd-proxy"].contains(&op),
            "{op}: its settings are rendered"
        );
        let mut read = vec!["KONTINUUM_LOG_LEVEL", "KONTINUUM_LOG_FORMAT"];
        if WATCHING_OPERATORS.contains(&op) {
            read.push("KONTINUUM_WATCH_NAMESPACE");
        }
        if op != "etcd-proxy" {
            // The Lease's namespace and this replica's identity.
            read.extend(["POD_NAMESPACE", "POD_NAME"]);
        }
        for var in own.iter().map(String::as_str).chain(read) {
            assert!(
                help.contains(&format!("[env: {var}=")),
                "{op} does not read {var}:\n{help}"
            );
        }
    }
}

#[test]
fn a_disabled_operator_leaves_nothing_behind() {
    let all = render(&[]);
    for op in OPERATORS {
        assert!(
            chart::owned_by(&all, op).len() >= 7,
            "{op}: {:?}",
            chart::owned_by(&all, op)
        );
        let key = format!("operators.{}.enabled", values_key(op));
        let docs = render(&[(&key, "false")]);
        assert_eq!(
            chart::owned_by(&docs, op),
            Vec::<String>::new(),
            "{op} disabled"
        );
        let others: Vec<String> = all
            .iter()
            .filter(|d| component(d) != Some(op) && kind(d) != "ConfigMap")
            .map(chart::describe)
            .collect();
        let left: Vec<String> = docs
            .iter()
            .filter(|d| kind(d) != "ConfigMap")
            .map(chart::describe)
            .collect();
        assert_eq!(left, others, "{op} disabled: the others are unchanged");
    }
    // Without either, no serving certificate is needed, so no CA either.
    let neither = render(&[
        ("operators.etcdProxy.enabled", "false"),
        ("operators.registry.enabled", "false"),
    ]);
    assert!(of_kind(&neither, "Secret").is_empty());
}

#[test]
fn bad_values_are_refused_naming_them() {
    for (set, named) in [
        (("logLevel", "loud"), "logLevel"),
        (("logFormat", "xml"), "logFormat"),
        (("operators.poolClaimer.replicas", "-1"), "replicas"),
        (("operatorDefaults.replicas", "-1"), "replicas"),
        (("image.pullPolicy", "Sometimes"), "pullPolicy"),
        (("bogus", "1"), "bogus"),
        (("operators.poolClaimer.bogus", "1"), "bogus"),
        (("operators.bogus.enabled", "true"), "bogus"),
        (("watchNamespace", "Not_A_Namespace"), "watchNamespace"),
        (
            ("operators.addonInstaller.resyncInterval", "soon"),
            "resyncInterval",
        ),
        (
            ("operators.addonInstaller.chartMirror", "ftp://x"),
            "chartMirror",
        ),
        (
            ("operators.instanceDiscovery.concurrency", "0"),
            "concurrency",
        ),
        (
            ("leaderElection.leaseDurationSeconds", "1"),
            "leaseDurationSeconds",
        ),
        (("operatorDefaults.adminPort", "70000"), "adminPort"),
        (("store.replicas", "2"), "replicas"),
        (("store.bogus", "1"), "bogus"),
        (("store.external.endpoints[0]", "store:2379"), "endpoints"),
        (
            ("store.external.endpoints[0]", "ftp://store:2379"),
            "endpoints",
        ),
        (
            ("store.external.tls.secretName", "Not_A_Name"),
            "secretName",
        ),
        (("store.persistence.size", "lots"), "size"),
        (("store.image.pullPolicy", "Sometimes"), "pullPolicy"),
        (("store.logLevel", "loud"), "logLevel"),
        (
            ("store.autoCompactionRetention", "soon"),
            "autoCompactionRetention",
        ),
        (("operators.etcdProxy.service.type", "ExternalName"), "type"),
        (("operators.etcdProxy.service.port", "0"), "port"),
        (
            ("operators.etcdProxy.identityNamespace", "Bad_Ns"),
            "identityNamespace",
        ),
        (("operators.registry.ttlSeconds", "1"), "ttlSeconds"),
        (("operators.registry.bogus", "1"), "bogus"),
        (("certManager.issuerRef.kind", "Vault"), "kind"),
        (("certManager.duration", "90 days"), "duration"),
        (
            ("operators.registry.webhookUrl", "http://hub:9443/convert"),
            "webhookUrl",
        ),
        (("operatorDefaults.hostNetwork", "sometimes"), "hostNetwork"),
        // Checked by the templates rather than the schema.
        (
            ("certManager.enabled", "true"),
            "certManager.issuerRef.name",
        ),
    ] {
        let err = helm_error(&[set]);
        assert!(
            err.contains(named),
            "{set:?}: the error does not name {named}: {err}"
        );
    }
}

#[test]
fn helm_lint_strict_passes() {
    let dir = chart::chart_dir();
    let dir = dir.to_string_lossy();
    for extra in [
        vec![],
        vec![
            "--set",
            "watchNamespace=foo,serviceMonitor.enabled=true,operatorDefaults.replicas=2",
        ],
        vec![
            "--set",
            "store.replicas=3,store.persistence.enabled=false,certManager.enabled=true,\
             certManager.issuerRef.name=ca,server.grpcEndpoint=203.0.113.7:443",
        ],
        vec![
            "--set",
            "store.external.endpoints[0]=https://store.example:2379,\
             store.external.tls.secretName=store-client,\
             operators.etcdProxy.service.type=LoadBalancer,\
             operators.etcdProxy.service.nodePort=30443,\
             operators.registry.hostNetwork=true,\
             operators.registry.webhookUrl=https://hub.example:9443/convert",
        ],
    ] {
        let mut args = vec!["lint", "--strict", &dir];
        args.extend(extra.iter().copied());
        let out = chart::helm(&tools(), &args).unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            out.status.success(),
            "helm lint --strict {extra:?}:\n{text}"
        );
        assert!(
            text.contains("1 chart(s) linted, 0 chart(s) failed"),
            "{text}"
        );
        assert!(!text.contains("[WARNING]"), "{text}");
    }
}

#[test]
fn the_chart_ships_exactly_the_generated_crds() {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let out = chart::helm(
        &tools(),
        &["show", "crds", &chart::chart_dir().to_string_lossy()],
    )
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // One document per CRD: `helm show crds | kubectl apply -f -` must see six objects.
    let shipped: Vec<CustomResourceDefinition> =
        serde_saphyr::from_multiple(&String::from_utf8_lossy(&out.stdout)).unwrap();
    let shipped: BTreeMap<String, CustomResourceDefinition> =
        shipped.into_iter().map(|c| (c.name_any(), c)).collect();
    let generated: BTreeMap<String, CustomResourceDefinition> = kontinuum_crds::all_crds()
        .into_iter()
        .map(|c| (c.name_any(), c))
        .collect();
    assert_eq!(
        shipped.keys().collect::<Vec<_>>(),
        generated.keys().collect::<Vec<_>>()
    );
    for (name, crd) in &generated {
        assert!(
            shipped[name] == *crd,
            "the chart's CRD {name} differs from the types: run `make crds`"
        );
    }
}

/// The `ARG <name>="..."` (or `ARG <name>=...`) default of the Containerfile.
fn containerfile_arg(text: &str, arg: &str) -> String {
    text.lines()
        .find_map(|l| l.trim().strip_prefix(&format!("ARG {arg}=")))
        .unwrap_or_else(|| panic!("Containerfile has no ARG {arg}"))
        .trim_matches('"')
        .to_owned()
}

fn containerfile() -> String {
    std::fs::read_to_string(workspace().join("Containerfile")).unwrap()
}

#[test]
fn the_image_builds_every_operator_binary() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = std::process::Command::new(cargo)
        .args([
            "metadata",
            "--no-deps",
            "--format-version",
            "1",
            "--manifest-path",
        ])
        .arg(workspace().join("Cargo.toml"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let metadata: Value = serde_json::from_slice(&out.stdout).unwrap();
    let operators_dir = workspace().join("operators").canonicalize().unwrap();
    let mut workspace_bins = BTreeSet::new();
    for package in metadata["packages"].as_array().unwrap() {
        let manifest = PathBuf::from(package["manifest_path"].as_str().unwrap());
        if !manifest.starts_with(&operators_dir) {
            continue; // test-bed tools, the emulator, benchmarks, crdgen, ...
        }
        if package["name"] == "kubectl-kontinuum" {
            continue; // the plugin runs on users' machines, not in the hub
        }
        for target in package["targets"].as_array().unwrap() {
            if target["kind"]
                .as_array()
                .unwrap()
                .iter()
                .any(|k| k == "bin")
            {
                workspace_bins.insert(target["name"].as_str().unwrap().to_owned());
            }
        }
    }
    let text = containerfile();
    let image_bins: BTreeSet<String> = containerfile_arg(&text, "BINARIES")
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    assert_eq!(
        image_bins, workspace_bins,
        "Containerfile ARG BINARIES vs the operators' binaries"
    );
    assert!(
        text.contains("cargo build --release --locked"),
        "built from Cargo.lock"
    );
    assert!(text.contains("COPY --from=build /out/ /usr/local/bin/"));
    assert!(text.contains("USER 65532:65532"), "the chart's runAsUser");

    // helm: the version the tests run with.
    let script = std::fs::read_to_string(workspace().join("e2e/testbed/build-tools.sh")).unwrap();
    let pinned = script
        .lines()
        .find_map(|l| l.strip_prefix("HELM_VERSION="))
        .unwrap();
    assert_eq!(containerfile_arg(&text, "HELM_VERSION"), pinned);
    assert!(text.contains("COPY --from=helm /out/helm /usr/local/bin/helm"));
}

#[test]
fn the_deployments_run_binaries_the_image_has() {
    let text = containerfile();
    let image_bins: BTreeSet<String> = containerfile_arg(&text, "BINARIES")
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    let docs = render(&[]);
    for d in of_kind(&docs, "Deployment") {
        let command: Vec<String> = serde_json::from_value(container(d)["command"].clone()).unwrap();
        let binary = command[0].strip_prefix("/usr/local/bin/").unwrap();
        assert!(image_bins.contains(binary), "{binary} is not in the image");
        for arg in args(d) {
            if let Some(helm) = arg.strip_prefix("--helm=") {
                assert_eq!(helm, "/usr/local/bin/helm");
            }
        }
    }
}

/// `helm install` of the chart on the test bed: the API server accepts every object and
/// the Deployments become available (KWOK runs the pods).
#[tokio::test]
async fn helm_install_is_accepted_by_the_api_server() {
    let (client, shared) = shared_client().await.unwrap();
    let ns = namespace(&client, "chart-install").await.unwrap();
    let release = format!("install-{}", std::process::id());
    let out = chart::helm(
        &shared.tools,
        &[
            "install",
            &release,
            &chart::chart_dir().to_string_lossy(),
            "--kubeconfig",
            &shared.kubeconfig_path.to_string_lossy(),
            "--namespace",
            &ns,
            "--set",
            "operatorDefaults.replicas=2",
            // No volume provisioner here; KWOK runs the members.
            "--set",
            "store.persistence.enabled=false",
            "--set",
            "store.replicas=3",
            "--wait",
            "--timeout",
            "120s",
        ],
    )
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "helm install failed: {}{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("kubectl get kontinuum -A"),
        "NOTES: {stdout}"
    );
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let list = deployments.list(&ListParams::default()).await.unwrap();
    let mut names: Vec<String> = list.items.iter().map(kube::ResourceExt::name_any).collect();
    names.sort();
    let expected: Vec<String> = OPERATORS
        .iter()
        .map(|op| format!("{release}-kontinuum-{op}"))
        .collect();
    assert_eq!(names, expected);
    // `helm --wait` accepts a RollingUpdate Deployment once `replicas - maxUnavailable` pods
    // are ready, so the second replica of one may still be starting: wait for both.
    eventually(
        Duration::from_secs(60),
        "two ready replicas of every operator",
        || {
            let deployments = deployments.clone();
            async move {
                let list = deployments.list(&ListParams::default()).await?;
                Ok(list
                    .items
                    .iter()
                    .all(|d| d.status.as_ref().and_then(|s| s.ready_replicas) == Some(2)))
            }
        },
    )
    .await
    .unwrap();
    assert!(stdout.contains("Store: StatefulSet"), "NOTES: {stdout}");
    let store = Api::<k8s_openapi::api::apps::v1::StatefulSet>::namespaced(client.clone(), &ns)
        .get(&format!("{release}-kontinuum-store"))
        .await
        .unwrap();
    assert_eq!(
        store.status.unwrap_or_default().ready_replicas,
        Some(3),
        "the store's three members"
    );
}

/// (operator, verb, API group, resource[/subresource], namespace, object name, allowed)
type Access<'a> = (
    &'a str,
    &'a str,
    &'a str,
    &'a str,
    &'a str,
    Option<String>,
    bool,
);

/// What each operator's ServiceAccount may and may not do, asked of the API server's
/// authorizer (SubjectAccessReview), with the chart's RBAC applied cluster-wide and, in a
/// second release, confined to one namespace.
#[tokio::test]
async fn the_chart_grants_each_operator_what_it_needs_and_no_more() {
    let (client, _) = shared_client().await.unwrap();
    let tools = tools();
    let home = namespace(&client, "chart-rbac").await.unwrap();
    let work = namespace(&client, "chart-rbac-work").await.unwrap();
    let other = namespace(&client, "chart-rbac-other").await.unwrap();
    let release = format!("rbac-{}", std::process::id());
    let accounts = chart::apply_rbac(&client, &tools, &release, &home, &OPERATORS, &[])
        .await
        .unwrap();
    let lease = |op: &str| format!("{release}-kontinuum-{op}");

    // (operator, verb, group, resource, namespace, name, allowed)
    let kontinuum = "kontinuum.sh";
    let cases: Vec<Access> = vec![
        (
            "instance-discovery",
            "watch",
            kontinuum,
            "instances",
            &work,
            None,
            true,
        ),
        (
            "instance-discovery",
            "patch",
            kontinuum,
            "instances/status",
            &work,
            None,
            true,
        ),
        (
            "instance-discovery",
            "patch",
            kontinuum,
            "instances",
            &work,
            None,
            false,
        ),
        (
            "instance-discovery",
            "delete",
            kontinuum,
            "instances",
            &work,
            None,
            false,
        ),
        (
            "instance-discovery",
            "get",
            "",
            "secrets",
            &work,
            None,
            false,
        ),
        (
            "instance-discovery",
            "create",
            "events.k8s.io",
            "events",
            &work,
            None,
            true,
        ),
        (
            "instance-discovery",
            "get",
            "coordination.k8s.io",
            "leases",
            &home,
            Some(lease("instance-discovery")),
            true,
        ),
        (
            "instance-discovery",
            "patch",
            "coordination.k8s.io",
            "leases",
            &home,
            Some(lease("pool-claimer")),
            false,
        ),
        (
            "instance-discovery",
            "create",
            "coordination.k8s.io",
            "leases",
            &home,
            None,
            true,
        ),
        (
            "instance-discovery",
            "create",
            "coordination.k8s.io",
            "leases",
            &work,
            None,
            false,
        ),
        (
            "pool-claimer",
            "patch",
            kontinuum,
            "instances",
            &work,
            None,
            true,
        ),
        (
            "pool-claimer",
            "delete",
            kontinuum,
            "instances",
            &work,
            None,
            false,
        ),
        (
            "pool-claimer",
            "patch",
            kontinuum,
            "instances/status",
            &work,
            None,
            false,
        ),
        (
            "pool-claimer",
            "patch",
            kontinuum,
            "instancepools",
            &work,
            None,
            true,
        ),
        (
            "pool-claimer",
            "patch",
            kontinuum,
            "instancepools/status",
            &work,
            None,
            true,
        ),
        (
            "pool-claimer",
            "update",
            kontinuum,
            "instancepools",
            &work,
            None,
            false,
        ),
        ("pool-claimer", "list", "", "secrets", &work, None, false),
        (
            "talos-bootstrapper",
            "create",
            "",
            "secrets",
            &work,
            None,
            true,
        ),
        (
            "talos-bootstrapper",
            "patch",
            "",
            "secrets",
            &work,
            None,
            true,
        ),
        (
            "talos-bootstrapper",
            "delete",
            "",
            "secrets",
            &work,
            None,
            false,
        ),
        (
            "talos-bootstrapper",
            "delete",
            kontinuum,
            "instances",
            &work,
            None,
            true,
        ),
        (
            "talos-bootstrapper",
            "patch",
            kontinuum,
            "instances/status",
            &work,
            None,
            true,
        ),
        (
            "talos-bootstrapper",
            "create",
            kontinuum,
            "addons",
            &work,
            None,
            true,
        ),
        (
            "talos-bootstrapper",
            "patch",
            kontinuum,
            "addons",
            &work,
            None,
            false,
        ),
        (
            "talos-bootstrapper",
            "patch",
            kontinuum,
            "talosclusters/status",
            &work,
            None,
            true,
        ),
        (
            "talos-bootstrapper",
            "update",
            kontinuum,
            "talosclusters/finalizers",
            &work,
            None,
            true,
        ),
        (
            "talos-bootstrapper",
            "delete",
            kontinuum,
            "talosclusters",
            &work,
            None,
            false,
        ),
        (
            "talos-bootstrapper",
            "get",
            kontinuum,
            "instancepools",
            &work,
            None,
            true,
        ),
        (
            "talos-bootstrapper",
            "patch",
            kontinuum,
            "instancepools",
            &work,
            None,
            false,
        ),
        ("addon-installer", "get", "", "secrets", &work, None, true),
        ("addon-installer", "watch", "", "secrets", &work, None, true),
        (
            "addon-installer",
            "create",
            "",
            "secrets",
            &work,
            None,
            false,
        ),
        (
            "addon-installer",
            "patch",
            kontinuum,
            "addons/status",
            &work,
            None,
            true,
        ),
        (
            "addon-installer",
            "patch",
            kontinuum,
            "addons",
            &work,
            None,
            true,
        ),
        (
            "addon-installer",
            "create",
            kontinuum,
            "addons",
            &work,
            None,
            false,
        ),
        (
            "addon-installer",
            "patch",
            kontinuum,
            "talosclusters",
            &work,
            None,
            false,
        ),
        (
            "addon-installer",
            "list",
            kontinuum,
            "talosclusters",
            &work,
            None,
            true,
        ),
        (
            "addon-installer",
            "get",
            "coordination.k8s.io",
            "leases",
            &home,
            Some(lease("addon-installer")),
            true,
        ),
        (
            "addon-installer",
            "get",
            "coordination.k8s.io",
            "leases",
            &home,
            Some(lease("talos-bootstrapper")),
            false,
        ),
        // etcd-proxy: the identity Secrets of one namespace, read from a watch; nothing else.
        ("etcd-proxy", "list", "", "secrets", &home, None, true),
        ("etcd-proxy", "watch", "", "secrets", &home, None, true),
        ("etcd-proxy", "get", "", "secrets", &home, None, false),
        ("etcd-proxy", "list", "", "secrets", &work, None, false),
        ("etcd-proxy", "list", "", "secrets", "", None, false),
        ("etcd-proxy", "watch", "", "secrets", "", None, false),
        ("etcd-proxy", "create", "", "secrets", &home, None, false),
        ("etcd-proxy", "update", "", "secrets", &home, None, false),
        ("etcd-proxy", "patch", "", "secrets", &home, None, false),
        ("etcd-proxy", "delete", "", "secrets", &home, None, false),
        (
            "etcd-proxy",
            "create",
            "events.k8s.io",
            "events",
            &home,
            None,
            false,
        ),
        (
            "etcd-proxy",
            "create",
            "coordination.k8s.io",
            "leases",
            &home,
            None,
            false,
        ),
        ("etcd-proxy", "list", kontinuum, "zones", &home, None, false),
        // registry: Kontinuums at home, its CRD's conversion, its Lease, Events.
        (
            "registry",
            "create",
            kontinuum,
            "kontinuums",
            &home,
            None,
            true,
        ),
        (
            "registry",
            "delete",
            kontinuum,
            "kontinuums",
            &home,
            None,
            true,
        ),
        (
            "registry",
            "watch",
            kontinuum,
            "kontinuums",
            &home,
            None,
            true,
        ),
        (
            "registry",
            "patch",
            kontinuum,
            "kontinuums/status",
            &home,
            None,
            true,
        ),
        (
            "registry",
            "create",
            kontinuum,
            "kontinuums",
            &work,
            None,
            false,
        ),
        ("registry", "list", kontinuum, "kontinuums", "", None, false),
        (
            "registry",
            "update",
            kontinuum,
            "kontinuums",
            &home,
            None,
            false,
        ),
        ("registry", "create", kontinuum, "zones", &home, None, false),
        (
            "registry",
            "patch",
            "apiextensions.k8s.io",
            "customresourcedefinitions",
            "",
            Some("kontinuums.kontinuum.sh".to_owned()),
            true,
        ),
        (
            "registry",
            "get",
            "apiextensions.k8s.io",
            "customresourcedefinitions",
            "",
            Some("kontinuums.kontinuum.sh".to_owned()),
            true,
        ),
        (
            "registry",
            "watch",
            "apiextensions.k8s.io",
            "customresourcedefinitions",
            "",
            Some("kontinuums.kontinuum.sh".to_owned()),
            true,
        ),
        (
            "registry",
            "list",
            "apiextensions.k8s.io",
            "customresourcedefinitions",
            "",
            None,
            false,
        ),
        (
            "registry",
            "patch",
            "apiextensions.k8s.io",
            "customresourcedefinitions",
            "",
            Some("zones.kontinuum.sh".to_owned()),
            false,
        ),
        (
            "registry",
            "patch",
            "apiextensions.k8s.io",
            "customresourcedefinitions",
            "",
            Some("certificates.cert-manager.io".to_owned()),
            false,
        ),
        (
            "registry",
            "create",
            "apiextensions.k8s.io",
            "customresourcedefinitions",
            "",
            None,
            false,
        ),
        (
            "registry",
            "update",
            "apiextensions.k8s.io",
            "customresourcedefinitions",
            "",
            Some("kontinuums.kontinuum.sh".to_owned()),
            false,
        ),
        (
            "registry",
            "delete",
            "apiextensions.k8s.io",
            "customresourcedefinitions",
            "",
            Some("kontinuums.kontinuum.sh".to_owned()),
            false,
        ),
        ("registry", "get", "", "secrets", &home, None, false),
        (
            "registry",
            "create",
            "events.k8s.io",
            "events",
            &home,
            None,
            true,
        ),
        (
            "registry",
            "patch",
            "coordination.k8s.io",
            "leases",
            &home,
            Some(lease("registry")),
            true,
        ),
        (
            "registry",
            "patch",
            "coordination.k8s.io",
            "leases",
            &home,
            Some(lease("pool-claimer")),
            false,
        ),
    ];
    let mut wrong = Vec::new();
    for (op, verb, group, resource, ns, object, allowed) in &cases {
        let (user, groups) = chart::service_account_identity(&home, &accounts[*op]);
        let answer = chart::can(
            &client,
            &user,
            &groups,
            verb,
            group,
            resource,
            Some(ns),
            object.as_deref(),
        )
        .await
        .unwrap();
        if answer != *allowed {
            wrong.push(format!(
                "{op} {verb} {resource} in {ns} {object:?}: allowed={answer}, want {allowed}"
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "cluster-wide release:\n  {}",
        wrong.join("\n  ")
    );

    // watchNamespace: the same rights in `work`, none in `other`.
    let scoped_home = namespace(&client, "chart-rbac-scoped").await.unwrap();
    let scoped = format!("scoped-{}", std::process::id());
    let accounts = chart::apply_rbac(
        &client,
        &tools,
        &scoped,
        &scoped_home,
        &OPERATORS,
        &[("watchNamespace", &work)],
    )
    .await
    .unwrap();
    for (op, verb, group, resource, allowed_in_work) in [
        ("talos-bootstrapper", "create", "", "secrets", true),
        ("addon-installer", "get", "", "secrets", true),
        ("pool-claimer", "patch", kontinuum, "instances", true),
        (
            "instance-discovery",
            "patch",
            kontinuum,
            "instances/status",
            true,
        ),
        (
            "instance-discovery",
            "create",
            "events.k8s.io",
            "events",
            true,
        ),
        // etcd-proxy follows watchNamespace (where the Zones and their identities are).
        ("etcd-proxy", "list", "", "secrets", true),
        // The registry stays in the release namespace: nothing in `work`.
        ("registry", "create", kontinuum, "kontinuums", false),
    ] {
        let (user, groups) = chart::service_account_identity(&scoped_home, &accounts[op]);
        for (ns, want) in [(work.as_str(), allowed_in_work), (other.as_str(), false)] {
            let answer = chart::can(
                &client,
                &user,
                &groups,
                verb,
                group,
                resource,
                Some(ns),
                None,
            )
            .await
            .unwrap();
            assert_eq!(
                answer, want,
                "{op} {verb} {resource} in {ns} (watchNamespace={work})"
            );
        }
        let cluster_wide = chart::can(
            &client,
            &user,
            &groups,
            "list",
            group,
            resource.split('/').next().unwrap(),
            None,
            None,
        )
        .await
        .unwrap();
        assert!(
            !cluster_wide,
            "{op}: no cluster-wide list with watchNamespace"
        );
    }
    let (user, groups) = chart::service_account_identity(&scoped_home, &accounts["registry"]);
    assert!(
        chart::can(
            &client,
            &user,
            &groups,
            "create",
            kontinuum,
            "kontinuums",
            Some(&scoped_home),
            None
        )
        .await
        .unwrap(),
        "the registry's Kontinuums stay in the release namespace"
    );
}

/// pool-claimer as a host process with exactly the chart's namespaced RBAC (watchNamespace)
/// and the chart's arguments: it takes its Lease in the release namespace and claims.
#[tokio::test]
async fn pool_claimer_runs_with_the_charts_namespaced_rbac_and_lease() {
    let (client, shared) = shared_client().await.unwrap();
    install_kontinuum_crds(&client).await.unwrap();
    let tools = tools();
    let home = namespace(&client, "chart-run").await.unwrap();
    let work = namespace(&client, "chart-run-work").await.unwrap();
    let release = format!("run-{}", std::process::id());
    let set = [("watchNamespace", work.as_str())];
    let accounts = chart::apply_rbac(&client, &tools, &release, &home, &["pool-claimer"], &set)
        .await
        .unwrap();
    let kubeconfig = chart::token_kubeconfig(
        &client,
        &shared.kubeconfig_yaml,
        &shared.dir,
        &home,
        &accounts["pool-claimer"],
    )
    .await
    .unwrap();

    // The Deployment's arguments, less the admin address (the harness binds a free port),
    // plus what the pod's environment would give it.
    let docs = chart::render(&tools, &release, &home, &set).unwrap();
    let d = deployment(&docs, "pool-claimer");
    let env = environment(&docs, d);
    let mut run_args: Vec<String> = args(d)
        .into_iter()
        .filter(|a| !a.starts_with("--admin-addr"))
        .collect();
    let lease_name = run_args
        .iter()
        .find_map(|a| a.strip_prefix("--lease-name="))
        .unwrap()
        .to_owned();
    run_args.extend([
        "--namespace".into(),
        env["KONTINUUM_WATCH_NAMESPACE"].clone(),
        "--lease-namespace".into(),
        home.clone(),
        "--identity".into(),
        "pool-claimer-0".into(),
    ]);
    let run_args: Vec<&str> = run_args.iter().map(String::as_str).collect();
    let _operator = Operator::start(
        &kontinuum_e2e::workspace_binary("pool-claimer").unwrap(),
        "pool-claimer-chart",
        &kubeconfig,
        &run_args,
    )
    .await
    .unwrap();

    let instances: Api<Instance> = Api::namespaced(client.clone(), &work);
    for i in 0..2 {
        let name = format!("m-{i}");
        let instance: Instance = serde_json::from_value(json!({
            "apiVersion": "kontinuum.sh/v1alpha2", "kind": "Instance",
            "metadata": { "name": name, "labels": { "role": "cp" } },
            "spec": { "interfaces": [format!("192.0.2.{}", i + 1)] }
        }))
        .unwrap();
        instances
            .create(&PostParams::default(), &instance)
            .await
            .unwrap();
        let mut status = InstanceStatus::default();
        conditions::set(
            &mut status.conditions,
            conditions::new(
                "Discovered",
                ConditionStatus::True,
                "Discovered",
                "by the test",
                Some(1),
            ),
            &Time(Timestamp::now()),
        );
        instances
            .patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Merge(&json!({ "status": status })),
            )
            .await
            .unwrap();
    }
    let pool: InstancePool = serde_json::from_value(json!({
        "apiVersion": "kontinuum.sh/v1alpha2", "kind": "InstancePool",
        "metadata": { "name": "cp" },
        "spec": { "replicas": 2, "selector": { "matchLabels": { "role": "cp" } } }
    }))
    .unwrap();
    let pools: Api<InstancePool> = Api::namespaced(client.clone(), &work);
    pools.create(&PostParams::default(), &pool).await.unwrap();
    eventually(
        LIMIT,
        "both Instances claimed and the pool Ready",
        || async {
            let claimed = instances
                .list(&ListParams::default())
                .await?
                .items
                .iter()
                .filter(|i| i.labels().get(CLAIMED_BY).map(String::as_str) == Some("cp"))
                .count();
            let ready = pools
                .get("cp")
                .await?
                .status
                .is_some_and(|s| conditions::is_true(&s.conditions, "Ready"));
            Ok(claimed == 2 && ready)
        },
    )
    .await
    .unwrap();
    let lease = Api::<Lease>::namespaced(client.clone(), &home)
        .get(&lease_name)
        .await
        .unwrap();
    assert_eq!(
        lease.spec.and_then(|s| s.holder_identity).as_deref(),
        Some("pool-claimer-0"),
        "the Lease of the chart's name, in the release namespace"
    );
}
