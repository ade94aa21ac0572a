//! GitOps, against the real API server of the test bed:
//!
//! * the example repository (`examples/gitops`) renders with the real `kubectl kustomize`,
//!   every Zone manifest in it is accepted by `kubectl apply --server-side`, and re-applying
//!   it writes nothing (every resourceVersion unchanged), even after an operator wrote the
//!   Zone's status and finalizer under its own field managers; a change in Git applies
//!   without a conflict and leaves the operator's fields alone;
//! * each Argo CD health check (the script of its kind in `docs/argocd/argocd-cm.yaml`: its
//!   `<kind>.lua` table followed by `common.lua`), run by a Lua 5.1 interpreter as
//!   Argo CD's gopher-lua runs it, gives every verdict (Healthy, Progressing, Degraded, and
//!   Suspended where a kind can be switched off) on objects read back from the API server
//!   after their statuses were written through the status subresource: no status yet, Ready
//!   True, Ready False with a waiting reason and with a failing one, a stale
//!   observedGeneration, and deletion (waiting, and a failed teardown step);
//! * Flux's `healthCheckExprs` of the example (`examples/gitops/flux/zones.yaml`), evaluated
//!   by a CEL interpreter on the same Zones, agree with the Lua verdicts;
//! * `docs/argocd/argocd-cm.yaml` is exactly what `docs/argocd/generate.sh` writes from the Lua
//!   files (the one place the scripts are assembled), holds one key per kind, and is a
//!   ConfigMap the API server accepts; each kind's table names every reason of its kind;
//! * the example's Flux Kustomization and Argo CD Application point at the tree's root.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::large_futures,
    clippy::too_many_lines
)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};
use std::time::Instant;

use k8s_openapi::api::core::v1::ConfigMap;
use kontinuum_crds::finalizers;
use kontinuum_crds::reasons::{
    AddonCondition, AddonReason, InstanceCondition, InstancePoolCondition, InstancePoolReason,
    InstanceReason, KontinuumCondition, KontinuumReason, TalosClusterCondition, TalosClusterReason,
    ZoneCondition, ZoneReason,
};
use kontinuum_e2e::{
    dynamic_api, install_kontinuum_crds, kubectl, load_yaml, namespace, shared_client, testbed,
};
use kontinuum_operator_common::finalizer;
use kube::ResourceExt as _;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use mlua::serde::SerializeOptions;
use mlua::{Lua, LuaOptions, LuaSerdeExt as _, StdLib, Table};
use serde_json::{Value, json};

/// Field manager of the example's applies (what Flux or Argo CD would be).
const GIT_MANAGER: &str = "gitops";

/// The repository root.
fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn read(relative: &str) -> String {
    let path = repo().join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// The key of a kind's health check in argocd-cm.
fn health_key(kind: &str) -> String {
    format!("resource.customizations.health.kontinuum.sh_{kind}")
}

/// The health-check scripts as Argo CD reads them: the data of `docs/argocd/argocd-cm.yaml`.
fn argocd_cm() -> ConfigMap {
    serde_saphyr::from_str(&read("docs/argocd/argocd-cm.yaml")).unwrap()
}

/// The script of `kind` in `docs/argocd/argocd-cm.yaml`.
fn health_script(cm: &ConfigMap, kind: &str) -> String {
    cm.data
        .as_ref()
        .and_then(|d| d.get(&health_key(kind)))
        .unwrap_or_else(|| panic!("argocd-cm.yaml has no health check of {kind}"))
        .clone()
}

/// What an Argo CD health check returned.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Health {
    status: String,
    message: String,
}

/// Runs a health check as Argo CD does: a fresh interpreter, `obj` set to the live object,
/// the chunk's return value read as `hs`. Only the base, string, table and math libraries
/// are open (Argo CD's default, without `useOpenLibs`).
fn argo_health(script: &str, object: &Value) -> Health {
    let lua = Lua::new_with(
        StdLib::STRING | StdLib::TABLE | StdLib::MATH,
        LuaOptions::default(),
    )
    .unwrap();
    // JSON null is nil for gopher-lua too.
    let options = SerializeOptions::new()
        .serialize_none_to_null(false)
        .serialize_unit_to_null(false);
    lua.globals()
        .set("obj", lua.to_value_with(object, options).unwrap())
        .unwrap();
    let hs: Table = lua
        .load(script)
        .set_name("health.lua")
        .eval()
        .unwrap_or_else(|e| panic!("health check failed on {object}: {e}"));
    let status: String = hs.get("status").unwrap();
    let message: Option<String> = hs.get("message").unwrap();
    assert!(
        ["Healthy", "Progressing", "Degraded", "Suspended"].contains(&status.as_str()),
        "not an Argo CD health status: {status:?}"
    );
    Health {
        status,
        message: message.unwrap_or_default(),
    }
}

/// One Kontinuum kind, as the health checks see it.
struct Kind {
    name: &'static str,
    file: &'static str,
    /// Field manager of the operator that writes its status.
    manager: &'static str,
    /// The finalizer its operator adds, if any.
    finalizer: Option<&'static str>,
    gates: Vec<String>,
    reasons: Vec<String>,
    /// A reason of a gate that waits (Progressing), and one that failed (Degraded).
    waiting: (&'static str, &'static str),
    failing: (&'static str, &'static str),
    /// A reason of Deleting that says a teardown step failed.
    teardown_failed: Option<&'static str>,
    /// A merge patch of a mutable spec field (it bumps metadata.generation).
    spec_change: Option<Value>,
}

fn tokens<T: AsRef<str>>(all: &[T]) -> Vec<String> {
    all.iter().map(|t| t.as_ref().to_owned()).collect()
}

fn kinds() -> Vec<Kind> {
    vec![
        Kind {
            name: "Zone",
            file: "zone.lua",
            manager: "zone-installer.kontinuum.sh",
            finalizer: Some(finalizers::ZONE_INSTALLER),
            gates: tokens(ZoneCondition::READY_GATES),
            reasons: tokens(ZoneReason::ALL),
            waiting: ("ClusterReady", "WaitingForTalosCluster"),
            failing: ("ClusterReady", "SeedInstanceClaimed"),
            teardown_failed: Some("DownstreamTeardownFailed"),
            spec_change: Some(json!({ "spec": { "domain": "other.example.com" } })),
        },
        Kind {
            name: "Instance",
            file: "instance.lua",
            manager: "instance-discovery.kontinuum.sh",
            finalizer: Some(finalizers::INSTANCE_RESET),
            gates: tokens(InstanceCondition::ready_gates(false, false)),
            reasons: tokens(InstanceReason::ALL),
            waiting: ("Discovered", "Reconciling"),
            failing: ("Discovered", "ProbeFailed"),
            teardown_failed: Some("ResetFailed"),
            spec_change: Some(json!({ "spec": { "interfaces": ["192.0.2.99"] } })),
        },
        Kind {
            name: "InstancePool",
            file: "instancepool.lua",
            manager: "pool-claimer.kontinuum.sh",
            finalizer: Some(finalizers::POOL_CLAIMER),
            gates: tokens(InstancePoolCondition::READY_GATES),
            reasons: tokens(InstancePoolReason::ALL),
            waiting: ("Claimed", "InsufficientCapacity"),
            failing: ("Claimed", "InvalidSelector"),
            teardown_failed: Some("ReleaseFailed"),
            spec_change: Some(json!({ "spec": { "replicas": 3 } })),
        },
        Kind {
            name: "TalosCluster",
            file: "taloscluster.lua",
            manager: "talos-bootstrapper.kontinuum.sh",
            finalizer: Some(finalizers::TALOS_BOOTSTRAPPER),
            gates: tokens(TalosClusterCondition::READY_GATES),
            reasons: tokens(TalosClusterReason::ALL),
            waiting: ("Bootstrapped", "WaitingForInstances"),
            failing: ("ControlPlaneReady", "Unhealthy"),
            teardown_failed: Some("TeardownFailed"),
            spec_change: Some(json!({ "spec": { "talos": { "version": "v1.13.1" } } })),
        },
        Kind {
            name: "Addon",
            file: "addon.lua",
            manager: "addon-installer.kontinuum.sh",
            finalizer: Some(finalizers::ADDON_INSTALLER),
            gates: tokens(AddonCondition::READY_GATES),
            reasons: tokens(AddonReason::ALL),
            waiting: ("Installed", "WaitingForDependency"),
            failing: ("Installed", "InstallFailed"),
            teardown_failed: Some("UninstallFailed"),
            spec_change: Some(json!({ "spec": { "values": { "replicas": 2 } } })),
        },
        Kind {
            name: "Kontinuum",
            file: "kontinuum.lua",
            manager: "registry.kontinuum.sh",
            // The registry deletes entries outright; the test holds one with a finalizer
            // of its own to see the deletion verdict.
            finalizer: None,
            gates: tokens(KontinuumCondition::READY_GATES),
            reasons: tokens(KontinuumReason::ALL),
            waiting: ("Heartbeating", "Reconciling"),
            failing: ("Heartbeating", "HeartbeatStale"),
            teardown_failed: None,
            // spec.region and spec.zone are immutable: the generation never moves.
            spec_change: None,
        },
    ]
}

/// The path of `target` relative to `from` (both absolute): kustomize refuses absolute
/// resource paths.
fn relative(from: &Path, target: &Path) -> PathBuf {
    let from: Vec<Component<'_>> = from.components().collect();
    let target: Vec<Component<'_>> = target.components().collect();
    let common = from.iter().zip(&target).take_while(|(a, b)| a == b).count();
    let mut path = PathBuf::new();
    for _ in common..from.len() {
        path.push("..");
    }
    for c in &target[common..] {
        path.push(c);
    }
    path
}

/// Every `zone.yaml` under `examples/gitops/regions`, parsed.
fn example_zones() -> BTreeMap<String, Value> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.file_name().is_some_and(|n| n == "zone.yaml") {
                out.push(path);
            }
        }
    }
    let mut files = Vec::new();
    walk(&repo().join("examples/gitops/regions"), &mut files);
    files
        .iter()
        .map(|path| {
            let zone: Value =
                serde_saphyr::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
            assert_eq!(zone["kind"], "Zone", "{}", path.display());
            let spec = &zone["spec"];
            let name = zone["metadata"]["name"].as_str().unwrap().to_owned();
            // The directory is <region>/<zone>, as docs/gitops.md lays it out.
            let dir = path.parent().unwrap();
            assert_eq!(
                dir.file_name().unwrap().to_str(),
                spec["zone"].as_str(),
                "{}",
                path.display()
            );
            assert_eq!(
                dir.parent().unwrap().file_name().unwrap().to_str(),
                spec["region"].as_str(),
                "{}",
                path.display()
            );
            (name, zone)
        })
        .collect()
}

async fn resource_versions(api: &Api<DynamicObject>) -> BTreeMap<String, String> {
    api.list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|o| (o.name_any(), o.resource_version().unwrap()))
        .collect()
}

fn zone_api(client: &kube::Client, ns: &str) -> Api<DynamicObject> {
    let probe: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "kontinuum.sh/v1alpha2", "kind": "Zone", "metadata": { "name": "x" }
    }))
    .unwrap();
    dynamic_api(client, ns, &probe).unwrap()
}

/// Writes an overlay that puts the example repository into `ns`, with optional extra
/// kustomization fields; returns its directory.
fn overlay(ns: &str, extra: &str) -> PathBuf {
    let dir = testbed::unique_dir("gitops-overlay");
    std::fs::create_dir_all(&dir).unwrap();
    let base = relative(&dir, &repo().join("examples/gitops"));
    std::fs::write(
        dir.join("kustomization.yaml"),
        format!(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nnamespace: {ns}\nresources:\n  - {}\n{extra}",
            base.display()
        ),
    )
    .unwrap();
    dir
}

fn apply(shared: &testbed::Shared, dir: &Path) -> String {
    kubectl(
        shared,
        &[
            "apply",
            "--server-side",
            &format!("--field-manager={GIT_MANAGER}"),
            "-k",
            dir.to_str().unwrap(),
        ],
    )
    .unwrap()
}

fn now() -> String {
    k8s_openapi::jiff::Timestamp::now().to_string()
}

fn condition(
    type_: &str,
    status: &str,
    reason: &str,
    message: &str,
    generation: Option<i64>,
) -> Value {
    let mut c = json!({
        "type": type_, "status": status, "reason": reason, "message": message,
        "lastTransitionTime": now(),
    });
    if let Some(g) = generation {
        c["observedGeneration"] = json!(g);
    }
    c
}

/// How an operator writes a status.
#[derive(Clone, Copy)]
enum Writer {
    /// Server-side apply under the operator's field manager (forced), as
    /// `kontinuum_operator_common::status::apply_status` does.
    Apply(&'static str),
    /// A merge patch replacing the whole condition list, as talos-bootstrapper writes the
    /// conditions of the Instances it claimed: a condition type with two writers must never
    /// be server-side applied by both, or one writer's leftovers make half entries the
    /// schema refuses.
    Merge,
}

/// Writes `status` through the status subresource and reads the object back.
async fn write_status(
    api: &Api<DynamicObject>,
    name: &str,
    kind: &str,
    writer: Writer,
    status: Value,
) -> DynamicObject {
    let result = match writer {
        Writer::Apply(manager) => {
            let body =
                json!({ "apiVersion": "kontinuum.sh/v1alpha2", "kind": kind, "status": status });
            api.patch_status(
                name,
                &PatchParams::apply(manager).force(),
                &Patch::Apply(&body),
            )
            .await
        }
        Writer::Merge => {
            let mut status = status;
            if status.get("conditions").is_none() {
                status["conditions"] = json!([]);
            }
            api.patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(&json!({ "status": status })),
            )
            .await
        }
    };
    result.unwrap_or_else(|e| panic!("writing the status of {kind} {name}: {e}"));
    api.get(name).await.unwrap()
}

/// A status whose gates are all True (the first `failed` one replaced), with Ready as
/// `conditions::ready` computes it.
fn status_of(
    kind: &Kind,
    generation: Option<i64>,
    observed: Option<i64>,
    not_true: Option<(&str, &str, &str)>,
) -> Value {
    let mut conditions = Vec::new();
    let mut ready = condition("Ready", "True", "Ready", "every gate is True", generation);
    for gate in &kind.gates {
        match not_true {
            Some((g, reason, message)) if g == gate.as_str() => {
                conditions.push(condition(gate, "False", reason, message, generation));
                ready = condition("Ready", "False", reason, message, generation);
            }
            _ => conditions.push(condition(gate, "True", gate, "ok", generation)),
        }
    }
    conditions.push(ready);
    let mut status = json!({ "conditions": conditions });
    if let Some(g) = observed {
        status["observedGeneration"] = json!(g);
    }
    status
}

fn to_json(object: &DynamicObject) -> Value {
    serde_json::to_value(object).unwrap()
}

/// Flux's verdict from a Kustomization's `healthCheckExprs` entry: `inProgress`, then
/// `failed`, then `current`; none true (or an expression that cannot be evaluated, e.g. on a
/// field that does not exist yet) is InProgress.
fn flux_health(exprs: &Value, object: &Value) -> &'static str {
    let eval = |key: &str| -> Option<bool> {
        let source = exprs.get(key)?.as_str()?;
        let program =
            cel::Program::compile(source).unwrap_or_else(|e| panic!("{key} does not compile: {e}"));
        let mut context = cel::Context::default();
        for (name, value) in object.as_object().unwrap() {
            context.add_variable_from_value(name.clone(), cel::to_value(value).unwrap());
        }
        match program.execute(&context) {
            Ok(cel::Value::Bool(b)) => Some(b),
            Ok(other) => panic!("{key} is not a boolean: {other:?}"),
            Err(_) => None,
        }
    };
    if eval("inProgress") != Some(false) && exprs.get("inProgress").is_some() {
        return "InProgress";
    }
    if eval("failed") == Some(true) {
        return "Failed";
    }
    if eval("current") == Some(true) {
        return "Current";
    }
    "InProgress"
}

/// The example's Flux health check of Zones.
fn flux_zone_exprs() -> Value {
    let docs: Vec<Value> =
        serde_saphyr::from_multiple(&read("examples/gitops/flux/zones.yaml")).unwrap();
    let kustomization = docs
        .iter()
        .find(|d| d["kind"] == "Kustomization")
        .expect("flux/zones.yaml has a Kustomization");
    kustomization["spec"]["healthCheckExprs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["kind"] == "Zone" && e["apiVersion"] == "kontinuum.sh/v1alpha2")
        .expect("a healthCheckExprs entry for Zones")
        .clone()
}

#[tokio::test]
async fn example_zones_apply_server_side_and_reapplying_is_a_no_op() {
    let started = Instant::now();
    let (client, shared) = shared_client().await.unwrap();
    install_kontinuum_crds(&client).await.unwrap();
    let ns = namespace(&client, "gitops-example").await.unwrap();
    let zones = example_zones();
    assert!(zones.len() >= 3, "{zones:?}");
    let regions: BTreeSet<&str> = zones
        .values()
        .map(|z| z["spec"]["region"].as_str().unwrap())
        .collect();
    assert!(
        regions.len() >= 2,
        "zones of at least two regions: {regions:?}"
    );

    // The tree renders, and every zone.yaml is in it.
    let dir = overlay(&ns, "");
    let rendered = kubectl(shared, &["kustomize", dir.to_str().unwrap()]).unwrap();
    let rendered: Vec<Value> = serde_saphyr::from_multiple(&rendered).unwrap();
    let names: BTreeSet<String> = rendered
        .iter()
        .map(|o| o["metadata"]["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        names,
        zones.keys().cloned().collect(),
        "the kustomization tree must hold every zone.yaml, and nothing else"
    );

    let out = apply(shared, &dir);
    for name in zones.keys() {
        assert!(
            out.contains(&format!("zone.kontinuum.sh/{name} serverside-applied")),
            "{name} missing from:\n{out}"
        );
    }
    let api = zone_api(&client, &ns);
    for (name, zone) in &zones {
        let live = to_json(&api.get(name).await.unwrap());
        assert_eq!(live["spec"]["region"], zone["spec"]["region"]);
        assert_eq!(live["spec"]["seed"], zone["spec"]["seed"]);
        assert_eq!(
            live["metadata"]["labels"]["kontinuum.sh/region"], zone["spec"]["region"],
            "the region kustomization labels its Zones"
        );
    }

    // Re-applying the same tree changes nothing.
    let before = resource_versions(&api).await;
    apply(shared, &dir);
    assert_eq!(resource_versions(&api).await, before, "re-applying wrote");

    // An operator writes the status and adds its finalizer under its own field managers.
    let name = zones.keys().next().unwrap().clone();
    let zone = api.get(&name).await.unwrap();
    finalizer::add(&api, &zone, finalizers::ZONE_INSTALLER)
        .await
        .unwrap();
    let generation = zone.metadata.generation;
    let status = json!({
        "observedGeneration": generation,
        "conditions": [condition("Ready", "False", "WaitingForTalosCluster", "waiting", generation)],
    });
    write_status(
        &api,
        &name,
        "Zone",
        Writer::Apply("zone-installer.kontinuum.sh"),
        status,
    )
    .await;

    // Git re-applies: no conflict (kubectl fails on one), no write, the operator's fields stay.
    let before = resource_versions(&api).await;
    apply(shared, &dir);
    assert_eq!(
        resource_versions(&api).await,
        before,
        "re-applying after the operator's writes wrote"
    );
    let live = api.get(&name).await.unwrap();
    assert!(
        live.finalizers()
            .contains(&finalizers::ZONE_INSTALLER.to_owned())
    );
    assert_eq!(
        to_json(&live)["status"]["conditions"][0]["reason"],
        "WaitingForTalosCluster"
    );
    let managers: BTreeSet<String> = live
        .managed_fields()
        .iter()
        .filter_map(|m| m.manager.clone())
        .collect();
    assert!(managers.contains(GIT_MANAGER), "{managers:?}");
    assert!(
        managers.contains("zone-installer.kontinuum.sh"),
        "{managers:?}"
    );

    // A change in Git applies without a conflict and leaves the operator's fields alone.
    let changed = overlay(
        &ns,
        &format!(
            "patches:\n  - target:\n      kind: Zone\n      name: {name}\n    patch: |\n      - op: replace\n        path: /spec/domain\n        value: changed.example.com\n"
        ),
    );
    apply(shared, &changed);
    let live = api.get(&name).await.unwrap();
    let json = to_json(&live);
    assert_eq!(json["spec"]["domain"], "changed.example.com");
    assert_eq!(live.metadata.generation, generation.map(|g| g + 1));
    assert!(
        live.finalizers()
            .contains(&finalizers::ZONE_INSTALLER.to_owned())
    );
    assert_eq!(
        json["status"]["conditions"][0]["reason"],
        "WaitingForTalosCluster"
    );

    finalizer::remove(&api, &live, finalizers::ZONE_INSTALLER)
        .await
        .unwrap();
    eprintln!(
        "gitops example: {} zones in {} regions applied, re-applied twice without a write, in {:?}",
        zones.len(),
        regions.len(),
        started.elapsed()
    );
}

/// The verdicts seen, per kind, and how many checks ran.
#[derive(Default)]
struct Tally {
    seen: BTreeMap<String, BTreeSet<String>>,
    evaluations: usize,
    flux_evaluations: usize,
}

/// Checks Flux's verdict on `object`, when `exprs` (a `healthCheckExprs` entry) applies to it.
fn flux_says(exprs: Option<&Value>, object: &DynamicObject, want: &str, tally: &mut Tally) {
    if let Some(exprs) = exprs {
        assert_eq!(
            flux_health(exprs, &to_json(object)),
            want,
            "Flux on {:#}",
            to_json(object)
        );
        tally.flux_evaluations += 1;
    }
}

/// Runs the health check of `kind` on `object`, and checks the verdict.
fn expect(
    script: &str,
    kind: &str,
    case: &str,
    object: &DynamicObject,
    status: &str,
    message_has: &str,
    tally: &mut Tally,
) -> Health {
    let health = argo_health(script, &to_json(object));
    assert_eq!(
        health.status,
        status,
        "{kind}, {case}: {health:?} on {:#}",
        to_json(object)
    );
    assert!(
        health.message.contains(message_has),
        "{kind}, {case}: {:?} does not contain {message_has:?}",
        health.message
    );
    tally.evaluations += 1;
    tally
        .seen
        .entry(kind.to_owned())
        .or_default()
        .insert(health.status.clone());
    health
}

#[tokio::test]
async fn argo_cd_health_checks_give_every_verdict_on_real_objects() {
    let started = Instant::now();
    let (client, _shared) = shared_client().await.unwrap();
    install_kontinuum_crds(&client).await.unwrap();
    let ns = namespace(&client, "gitops-health").await.unwrap();
    let examples: Vec<DynamicObject> = load_yaml("api/valid.yaml").unwrap();
    let flux = flux_zone_exprs();
    let mut tally = Tally::default();
    let cm = argocd_cm();

    for kind in kinds() {
        let script = health_script(&cm, kind.name);
        let example = examples
            .iter()
            .find(|o| {
                o.types.as_ref().is_some_and(|t| {
                    t.kind == kind.name && t.api_version == "kontinuum.sh/v1alpha2"
                })
            })
            .unwrap_or_else(|| panic!("no {} in api/valid.yaml", kind.name))
            .clone();
        let api = dynamic_api(&client, &ns, &example).unwrap();
        let name = example.name_any();
        let k = kind.name;
        let mut writer = Writer::Apply(kind.manager);

        // No status yet.
        let created = api.create(&PostParams::default(), &example).await.unwrap();
        let mut object = api.get(&name).await.unwrap();
        assert_eq!(object.resource_version(), created.resource_version());
        expect(
            &script,
            k,
            "no status",
            &object,
            "Progressing",
            "to report Ready",
            &mut tally,
        );
        // The example's Flux expressions are for Zones.
        let flux_exprs = (k == "Zone").then_some(&flux);
        flux_says(flux_exprs, &object, "InProgress", &mut tally);
        let generation = object.metadata.generation.unwrap();

        // Ready=True at the current generation.
        object = write_status(
            &api,
            &name,
            k,
            writer,
            status_of(&kind, Some(generation), Some(generation), None),
        )
        .await;
        expect(
            &script,
            k,
            "Ready=True",
            &object,
            "Healthy",
            "every gate is True",
            &mut tally,
        );
        flux_says(flux_exprs, &object, "Current", &mut tally);

        // A gate that waits.
        let (gate, reason) = kind.waiting;
        object = write_status(
            &api,
            &name,
            k,
            writer,
            status_of(
                &kind,
                Some(generation),
                Some(generation),
                Some((gate, reason, "waiting for it")),
            ),
        )
        .await;
        expect(
            &script,
            k,
            "waiting",
            &object,
            "Progressing",
            reason,
            &mut tally,
        );
        flux_says(flux_exprs, &object, "InProgress", &mut tally);

        // A gate that failed: Degraded, naming the gate, reason and message.
        let (gate, reason) = kind.failing;
        object = write_status(
            &api,
            &name,
            k,
            writer,
            status_of(
                &kind,
                Some(generation),
                Some(generation.saturating_sub(1)),
                Some((gate, reason, "it broke")),
            ),
        )
        .await;
        let h = expect(
            &script, k, "failed", &object, "Degraded", reason, &mut tally,
        );
        assert_eq!(h.message, format!("{gate}=False {reason}: it broke"));
        flux_says(flux_exprs, &object, "Failed", &mut tally);

        // A verdict about an older spec.
        if let Some(change) = &kind.spec_change {
            write_status(
                &api,
                &name,
                k,
                writer,
                status_of(&kind, Some(generation), Some(generation), None),
            )
            .await;
            api.patch(&name, &PatchParams::default(), &Patch::Merge(change))
                .await
                .unwrap();
            object = api.get(&name).await.unwrap();
            let next = object.metadata.generation.unwrap();
            assert_eq!(next, generation + 1, "the spec change bumps the generation");
            expect(
                &script,
                k,
                "stale",
                &object,
                "Progressing",
                &format!("to observe generation {next} (Ready is of generation {generation})"),
                &mut tally,
            );
            flux_says(flux_exprs, &object, "InProgress", &mut tally);

            // Ready=True of this generation, but its reconcile has not fully succeeded.
            object = write_status(
                &api,
                &name,
                k,
                writer,
                status_of(&kind, Some(next), Some(generation), None),
            )
            .await;
            expect(
                &script,
                k,
                "not fully reconciled",
                &object,
                "Progressing",
                &format!("generation {next} is not fully reconciled"),
                &mut tally,
            );
            flux_says(flux_exprs, &object, "InProgress", &mut tally);
        } else {
            // The generation cannot move: a status that names none is stale all the same.
            object = write_status(&api, &name, k, writer, status_of(&kind, None, None, None)).await;
            expect(
                &script,
                k,
                "stale",
                &object,
                "Progressing",
                &format!("to observe generation {generation}"),
                &mut tally,
            );
        }
        let generation = object.metadata.generation.unwrap();

        // Kind-specific verdicts.
        if k == "Addon" {
            api.patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({ "spec": { "enabled": false } })),
            )
            .await
            .unwrap();
            object = api.get(&name).await.unwrap();
            expect(
                &script,
                k,
                "disabled",
                &object,
                "Suspended",
                "spec.enabled is false",
                &mut tally,
            );
        }
        if k == "Instance" {
            // Claimed, the gates are Configured and Joined.
            api.patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(
                    json!({ "metadata": { "labels": { "kontinuum.sh/claimed-by": "some-pool" } } }),
                ),
            )
            .await
            .unwrap();
            let status = json!({
                "observedGeneration": generation,
                "conditions": [
                    condition("Discovered", "True", "Discovered", "discovered", Some(generation)),
                    condition("Configured", "False", "ConfigRejected", "the machine refused its configuration", None),
                    condition("Joined", "Unknown", "Reconciling", "not yet", None),
                    condition("Ready", "False", "ConfigRejected", "the machine refused its configuration", Some(generation)),
                ],
            });
            writer = Writer::Merge;
            object = write_status(&api, &name, k, writer, status).await;
            expect(
                &script,
                k,
                "claimed, config rejected",
                &object,
                "Degraded",
                "Configured=False ConfigRejected",
                &mut tally,
            );
        }

        // Deleting: the operator's finalizer holds the object while its Deleting condition
        // says what cleanup waits for.
        let held = kind.finalizer.unwrap_or("kontinuum.sh/e2e-hold");
        finalizer::add(&api, &object, held).await.unwrap();
        api.delete(&name, &DeleteParams::default()).await.unwrap();
        let deleting = json!({
            "observedGeneration": generation,
            "conditions": [
                condition("Deleting", "True", "Deleting", "removing the footprint; gives up at 2030-01-01T00:00:00Z", Some(generation)),
                condition("Ready", "False", "Deleting", "removing the footprint; gives up at 2030-01-01T00:00:00Z", Some(generation)),
            ],
        });
        object = write_status(&api, &name, k, writer, deleting).await;
        assert!(object.metadata.deletion_timestamp.is_some());
        expect(
            &script,
            k,
            "deleting",
            &object,
            "Progressing",
            "Deleting: removing the footprint; gives up at 2030-01-01T00:00:00Z",
            &mut tally,
        );
        if let Some(reason) = kind.teardown_failed {
            let failed = json!({
                "observedGeneration": generation,
                "conditions": [
                    condition("Deleting", "True", reason, "the step failed; retried until 2030-01-01T00:00:00Z", Some(generation)),
                    condition("Ready", "False", "Deleting", "the step failed", Some(generation)),
                ],
            });
            object = write_status(&api, &name, k, writer, failed).await;
            expect(
                &script,
                k,
                "teardown failed",
                &object,
                "Degraded",
                "retried until 2030-01-01T00:00:00Z",
                &mut tally,
            );
        }
        // Without a Deleting condition, the finalizers are named.
        object = write_status(
            &api,
            &name,
            k,
            writer,
            json!({ "observedGeneration": generation }),
        )
        .await;
        expect(
            &script,
            k,
            "deleting, no condition",
            &object,
            "Progressing",
            held,
            &mut tally,
        );
        finalizer::remove(&api, &object, held).await.unwrap();
        kontinuum_e2e::eventually(
            std::time::Duration::from_secs(30),
            &format!("{k} {name} gone"),
            || {
                let api = api.clone();
                let name = name.clone();
                async move { Ok(api.get_opt(&name).await?.is_none()) }
            },
        )
        .await
        .unwrap();
    }

    assert!(
        tally.flux_evaluations >= 6,
        "Flux's expressions were checked"
    );
    // Every kind gave every verdict it can give.
    for kind in kinds() {
        let mut want: BTreeSet<String> = ["Healthy", "Progressing", "Degraded"]
            .map(String::from)
            .into();
        if kind.name == "Addon" {
            want.insert("Suspended".into());
        }
        assert_eq!(tally.seen[kind.name], want, "{}", kind.name);
    }
    eprintln!(
        "Argo CD health checks: {} kinds, {} checks on objects read back from the API server, {} Flux checks of Zones, in {:?}",
        tally.seen.len(),
        tally.evaluations,
        tally.flux_evaluations,
        started.elapsed()
    );
}

#[tokio::test]
async fn argocd_cm_is_what_generate_sh_writes() {
    // generate.sh is the one place the scripts are assembled: its output now must be the
    // committed file, byte for byte.
    let generated = std::process::Command::new("bash")
        .arg(repo().join("docs/argocd/generate.sh"))
        .arg("-")
        .output()
        .unwrap();
    assert!(
        generated.status.success(),
        "generate.sh failed: {}",
        String::from_utf8_lossy(&generated.stderr)
    );
    assert!(
        String::from_utf8(generated.stdout).unwrap() == read("docs/argocd/argocd-cm.yaml"),
        "docs/argocd/argocd-cm.yaml differs from the Lua files: run bash docs/argocd/generate.sh"
    );

    // One table per kind (besides common.lua), starting with the line generate.sh reads the
    // kind from.
    let dir = repo().join("docs/argocd");
    let mut files: BTreeMap<String, String> = BTreeMap::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.extension().is_some_and(|e| e == "lua") && name != "common.lua" {
            files.insert(name, std::fs::read_to_string(&path).unwrap());
        }
    }
    let crds = kontinuum_crds::all_crds();
    let crd_kinds: BTreeSet<String> = crds.iter().map(|c| c.spec.names.kind.clone()).collect();
    for kind in &crd_kinds {
        let file = format!("{}.lua", kind.to_lowercase());
        let text = files
            .get(&file)
            .unwrap_or_else(|| panic!("docs/argocd/{file} is missing"));
        assert!(
            text.starts_with(&format!(
                "-- Argo CD health check of kontinuum.sh/v1alpha2 {kind},"
            )),
            "{file} must start with the line generate.sh reads the kind from"
        );
    }
    assert_eq!(
        files.len(),
        crd_kinds.len(),
        "a Lua file of no kind: {:?}",
        files.keys()
    );

    // A key per kind, and nothing else.
    let cm = argocd_cm();
    let keys: BTreeSet<String> = cm.data.clone().unwrap_or_default().into_keys().collect();
    assert_eq!(
        keys,
        crd_kinds
            .iter()
            .map(|k| health_key(k))
            .collect::<BTreeSet<_>>()
    );
    assert_eq!(cm.metadata.name.as_deref(), Some("argocd-cm"));

    // Each kind's table names every reason and gate of its kind, so a new reason is a decision.
    for kind in kinds() {
        let text = &files[kind.file];
        let words: BTreeSet<&str> = text
            .split(|c: char| !c.is_ascii_alphanumeric())
            .filter(|w| !w.is_empty())
            .collect();
        for token in kind.reasons.iter().chain(&kind.gates) {
            assert!(
                words.contains(token.as_str()),
                "{} does not name {token}",
                kind.file
            );
        }
        // And every reason on a not-True Ready gives a valid verdict.
        let script = health_script(&cm, kind.name);
        for reason in &kind.reasons {
            let object = json!({
                "apiVersion": "kontinuum.sh/v1alpha2", "kind": kind.name,
                "metadata": { "name": "x", "generation": 1 },
                "spec": {},
                "status": {
                    "observedGeneration": 1,
                    "conditions": [condition("Ready", "False", reason, "m", Some(1))],
                },
            });
            let health = argo_health(&script, &object);
            assert_ne!(
                health.status, "Healthy",
                "{} on Ready=False {reason}",
                kind.file
            );
        }
    }

    // The API server takes it as a ConfigMap (size, keys).
    let (client, _shared) = shared_client().await.unwrap();
    let ns = namespace(&client, "gitops-argocd-cm").await.unwrap();
    let mut cm = cm;
    cm.metadata.namespace = Some(ns.clone());
    Api::<ConfigMap>::namespaced(client, &ns)
        .create(&PostParams::default(), &cm)
        .await
        .unwrap();
}

/// The Flux and Argo CD objects of the example point at the tree the first test applies:
/// the repository root, whose kustomization.yaml sets the namespace they deploy to.
#[test]
fn the_tool_manifests_point_at_the_example_tree() {
    let root: Value = serde_saphyr::from_str(&read("examples/gitops/kustomization.yaml")).unwrap();
    let namespace = root["namespace"].as_str().unwrap();

    let flux: Vec<Value> =
        serde_saphyr::from_multiple(&read("examples/gitops/flux/zones.yaml")).unwrap();
    let source = flux.iter().find(|d| d["kind"] == "GitRepository").unwrap();
    let kustomization = flux.iter().find(|d| d["kind"] == "Kustomization").unwrap();
    assert_eq!(kustomization["spec"]["path"], "./");
    assert_eq!(
        kustomization["spec"]["sourceRef"]["name"],
        source["metadata"]["name"]
    );
    assert_eq!(kustomization["spec"]["wait"], true);

    let app: Value = serde_saphyr::from_str(&read("examples/gitops/argocd/zones.yaml")).unwrap();
    assert_eq!(app["kind"], "Application");
    assert_eq!(app["spec"]["source"]["path"], ".");
    assert_eq!(app["spec"]["source"]["repoURL"], source["spec"]["url"]);
    assert_eq!(app["spec"]["destination"]["namespace"], namespace);
    let options: Vec<&str> = app["spec"]["syncPolicy"]["syncOptions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o.as_str().unwrap())
        .collect();
    assert!(options.contains(&"ServerSideApply=true"), "{options:?}");

    // Every zone.yaml names the namespace the root sets, so applying one alone lands in
    // the same place.
    for (name, zone) in example_zones() {
        assert_eq!(zone["metadata"]["namespace"], namespace, "{name}");
    }
}
