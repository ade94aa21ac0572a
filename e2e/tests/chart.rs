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
    self, OPERATORS, component, kind, name, object_namespace as ns_of, of_kind, operator_object,
    values_key,
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
        assert!(a.contains(&"--leader-elect".to_owned()), "{op}: {a:?}");
        let lease = format!("{RELEASE}-{op}");
        assert!(a.contains(&format!("--lease-name={lease}")), "{op}: {a:?}");

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
        let tmp = c["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["mountPath"] == "/tmp")
            .unwrap_or_else(|| panic!("{op}: no /tmp mount"));
        let volume = pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == tmp["name"])
            .unwrap();
        assert!(volume["emptyDir"].is_object(), "{op}: {volume}");

        // Its own ServiceAccount, ClusterRole (+ Events) and binding, and a Lease Role.
        let sa = pod["serviceAccountName"].as_str().unwrap();
        let account = operator_object(&docs, "ServiceAccount", op).unwrap();
        assert_eq!(name(account), sa, "{op}");
        let cluster_role = operator_object(&docs, "ClusterRole", op).unwrap();
        let events = rules(cluster_role)
            .into_iter()
            .find(|r| r.api_groups.as_deref() == Some(&["events.k8s.io".to_owned()][..]));
        assert_eq!(
            events.map(|r| r.verbs).unwrap(),
            ["create", "patch"],
            "{op}: Events"
        );
        let binding = operator_object(&docs, "ClusterRoleBinding", op).unwrap();
        assert_eq!(binding["roleRef"]["kind"], "ClusterRole");
        assert_eq!(binding["roleRef"]["name"], name(cluster_role));
        assert_eq!(
            binding["subjects"],
            json!([{ "kind": "ServiceAccount", "name": sa, "namespace": RELEASE_NS }])
        );
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
        let lease_binding = rbac_of(&docs, "RoleBinding", op);
        assert_eq!(lease_binding.len(), 1, "{op}");
        assert_eq!(lease_binding[0]["roleRef"]["name"], name(lease_role));
        assert_eq!(lease_binding[0]["subjects"][0]["name"], sa);

        // A metrics Service that also publishes the followers (never Ready).
        let service = operator_object(&docs, "Service", op).unwrap();
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
    assert!(of_kind(&docs, "ClusterRole").is_empty());
    assert!(of_kind(&docs, "ClusterRoleBinding").is_empty());
    for op in OPERATORS {
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
        assert!(!args(deployment(&single, op)).contains(&"--leader-elect".to_owned()));
        assert!(
            rbac_of(&single, "Role", op).is_empty(),
            "{op}: no Lease Role"
        );
    }
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
        let service = operator_object(&docs, "Service", op).unwrap();
        let selected = sm["spec"]["selector"]["matchLabels"].as_object().unwrap();
        for (k, v) in selected {
            assert_eq!(
                &service["metadata"]["labels"][k], v,
                "{op}: selects its Service"
            );
        }
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
/// is one the binary accepts (a binary refuses unknown flags): checked against `--help`.
#[test]
fn rendered_flags_and_variables_are_ones_the_binaries_know() {
    let docs = render(&[(
        "operators.addonInstaller.chartMirror",
        "https://mirror.example",
    )]);
    for op in OPERATORS {
        let bin = kontinuum_e2e::workspace_binary(op).unwrap();
        let out = std::process::Command::new(&bin)
            .arg("--help")
            .output()
            .unwrap();
        assert!(out.status.success(), "{op} --help");
        let help = String::from_utf8_lossy(&out.stdout);
        let d = deployment(&docs, op);
        for arg in args(d) {
            let flag = arg.split('=').next().unwrap();
            assert!(
                help.contains(&format!("{flag} "))
                    || help.contains(&format!("{flag}\n"))
                    || help.contains(&format!("{flag} <")),
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
            !own.is_empty() || op == "pool-claimer",
            "{op}: its settings are rendered"
        );
        for var in own {
            assert!(
                help.contains(&format!("[env: {var}=")),
                "{op} does not read {var}:\n{help}"
            );
        }
        for var in [
            "KONTINUUM_LOG_LEVEL",
            "KONTINUUM_LOG_FORMAT",
            "KONTINUUM_WATCH_NAMESPACE",
            "POD_NAMESPACE",
            "POD_NAME",
        ] {
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
    for d in list.items {
        let status = d.status.unwrap_or_default();
        assert_eq!(
            status.ready_replicas,
            Some(2),
            "{}",
            d.metadata.name.unwrap_or_default()
        );
    }
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
