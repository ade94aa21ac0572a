//! kubectl-kontinuum as a process against the real test bed (kube-apiserver + etcd +
//! controller-manager): it creates and reads real objects, and the test plays the operators
//! by writing status through the status subresource.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::too_many_lines,
    clippy::large_futures
)]

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kontinuum_crds::v1alpha2::{Instance, TalosCluster, Zone};
use kontinuum_e2e::testbed::Shared;
use kontinuum_e2e::{eventually, install_kontinuum_crds, namespace, shared_client};
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt as _};
use serde_json::json;

const LIMIT: Duration = Duration::from_secs(30);

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

fn command(shared: &Shared, ns: &str, args: &[&str]) -> tokio::process::Command {
    command_with(&shared.kubeconfig_path, ns, args)
}

fn command_with(kubeconfig: &Path, ns: &str, args: &[&str]) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_kubectl-kontinuum"));
    cmd.arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["-n", ns])
        .args(args)
        .env_remove("KUBECONFIG")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd
}

async fn finish(cmd: &mut tokio::process::Command) -> Run {
    let out = tokio::time::timeout(Duration::from_secs(120), cmd.output())
        .await
        .expect("the plugin finished within 2 minutes")
        .unwrap();
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

async fn plugin(shared: &Shared, ns: &str, args: &[&str]) -> Run {
    finish(&mut command(shared, ns, args)).await
}

async fn setup(prefix: &str) -> (Client, &'static Shared, String) {
    let (client, shared) = shared_client().await.unwrap();
    install_kontinuum_crds(&client).await.unwrap();
    let ns = namespace(&client, prefix).await.unwrap();
    (client, shared, ns)
}

/// Runs the test bed's kubectl with `stdin`; returns (success, stdout + stderr).
fn kubectl_stdin(shared: &Shared, args: &[&str], stdin: &str) -> (bool, String) {
    use std::io::Write as _;
    let mut child = std::process::Command::new(shared.tools.path("kubectl"))
        .arg("--kubeconfig")
        .arg(&shared.kubeconfig_path)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// A running plugin whose stdout lines are read as they come.
struct Live {
    child: tokio::process::Child,
    lines: tokio::sync::mpsc::UnboundedReceiver<String>,
    seen: Vec<String>,
}

impl Live {
    fn spawn(mut cmd: tokio::process::Command) -> Self {
        use tokio::io::AsyncBufReadExt as _;
        let mut child = cmd.spawn().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut reader = tokio::io::BufReader::new(stdout).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Self {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// Waits for a line containing `text` (shown live: the view streams, it does not
    /// print at the end only).
    async fn expect(&mut self, text: &str) {
        if self.seen.iter().any(|l| l.contains(text)) {
            return;
        }
        let found = tokio::time::timeout(LIMIT, async {
            while let Some(line) = self.lines.recv().await {
                let hit = line.contains(text);
                self.seen.push(line);
                if hit {
                    return true;
                }
            }
            false
        })
        .await;
        assert!(
            matches!(found, Ok(true)),
            "no line containing {text:?}; saw:\n{}",
            self.seen.join("\n")
        );
    }

    /// Waits for the exit; returns the code and every stdout line.
    async fn finish(mut self) -> (Option<i32>, Vec<String>, String) {
        use tokio::io::AsyncReadExt as _;
        let mut stderr = String::new();
        if let Some(mut pipe) = self.child.stderr.take() {
            let _ = tokio::time::timeout(LIMIT, pipe.read_to_string(&mut stderr)).await;
        }
        let status = tokio::time::timeout(LIMIT, self.child.wait())
            .await
            .expect("the plugin exited in time")
            .unwrap();
        while let Some(line) = self.lines.recv().await {
            self.seen.push(line);
        }
        (status.code(), self.seen, stderr)
    }
}

fn condition(type_: &str, status: &str, reason: &str, message: &str) -> serde_json::Value {
    json!({
        "type": type_, "status": status, "reason": reason, "message": message,
        "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 1
    })
}

async fn set_status<K>(api: &Api<K>, name: &str, kind: &str, status: serde_json::Value)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.patch_status(
        name,
        &PatchParams::apply("kontinuum-e2e").force(),
        &Patch::Apply(json!({
            "apiVersion": "kontinuum.sh/v1alpha2", "kind": kind, "status": status
        })),
    )
    .await
    .unwrap();
}

/// Sets (or with `None` clears) the object's finalizers, as an operator would.
async fn set_finalizer<K>(api: &Api<K>, name: &str, finalizer: Option<&str>)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let finalizers = finalizer.map(|f| vec![f]);
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({ "metadata": { "finalizers": finalizers } })),
    )
    .await
    .unwrap();
}

async fn create_zone(client: &Client, ns: &str, region: &str, zone: &str) -> Zone {
    let api: Api<Zone> = Api::namespaced(client.clone(), ns);
    let object: Zone = serde_json::from_value(json!({
        "apiVersion": "kontinuum.sh/v1alpha2", "kind": "Zone",
        "metadata": { "name": format!("{region}-{zone}"), "namespace": ns },
        "spec": { "region": region, "zone": zone }
    }))
    .unwrap();
    api.create(&PostParams::default(), &object).await.unwrap()
}

async fn create_cluster(client: &Client, ns: &str, name: &str) -> TalosCluster {
    let api: Api<TalosCluster> = Api::namespaced(client.clone(), ns);
    let object: TalosCluster = serde_json::from_value(json!({
        "apiVersion": "kontinuum.sh/v1alpha2", "kind": "TalosCluster",
        "metadata": { "name": name, "namespace": ns },
        "spec": { "controlPlane": { "poolRef": { "name": name } } }
    }))
    .unwrap();
    api.create(&PostParams::default(), &object).await.unwrap()
}

fn one_line(text: &str) -> &str {
    let trimmed = text.trim_end();
    assert!(!trimmed.contains('\n'), "not one line: {text:?}");
    trimmed
}

#[tokio::test]
async fn zone_add_applies_once_and_the_dry_run_manifest_is_the_same_object() {
    let (client, shared, ns) = setup("plugin-add").await;
    let zones: Api<Zone> = Api::namespaced(client.clone(), &ns);
    let args = [
        "zone",
        "add",
        "--region",
        "eu",
        "--zone",
        "west-1a",
        "--talos-address",
        "192.0.2.10",
        "--seed",
        "192.0.2.11",
        "--domain",
        "example.com",
        "--talos-version",
        "v1.13.0",
        "--control-plane-replicas",
        "1",
    ];

    let started = Instant::now();
    let first = plugin(shared, &ns, &args).await;
    assert_eq!(first.code, 0, "{}", first.stderr);
    assert_eq!(first.stdout, "zone.kontinuum.sh/eu-west-1a created\n");
    let created = zones.get("eu-west-1a").await.unwrap();
    let spec = serde_json::to_value(&created.spec).unwrap();
    assert_eq!(
        spec,
        json!({
            "region": "eu", "zone": "west-1a", "domain": "example.com",
            "seed": { "talosAddresses": ["192.0.2.10", "192.0.2.11"] },
            "cluster": { "talosVersion": "v1.13.0", "controlPlaneReplicas": 1 }
        })
    );
    assert!(
        created
            .managed_fields()
            .iter()
            .any(|m| m.manager.as_deref() == Some("kubectl-kontinuum")
                && m.operation.as_deref() == Some("Apply")),
        "applied server-side with the plugin's field manager"
    );

    // Re-running is a no-op: nothing is written.
    let again = plugin(shared, &ns, &args).await;
    assert_eq!(again.code, 0, "{}", again.stderr);
    assert_eq!(again.stdout, "zone.kontinuum.sh/eu-west-1a unchanged\n");
    let after = zones.get("eu-west-1a").await.unwrap();
    assert_eq!(after.resource_version(), created.resource_version());
    eprintln!("zone add twice: {:?}", started.elapsed());

    // An identity rotation is requested by a new annotation value; the applied spec stays.
    let mut rotations = Vec::new();
    for _ in 0..2 {
        let rotate = plugin(shared, &ns, &["zone", "rotate-identity", "eu-west-1a"]).await;
        assert_eq!(rotate.code, 0, "{}", rotate.stderr);
        assert!(
            rotate.stdout.contains("identity rotation requested"),
            "{}",
            rotate.stdout
        );
        let rotated = zones.get("eu-west-1a").await.unwrap();
        assert_eq!(serde_json::to_value(&rotated.spec).unwrap(), spec);
        rotations.push(rotated.annotations()["kontinuum.sh/rotate-identity"].clone());
    }
    assert_ne!(rotations[0], rotations[1], "each request is a new value");
    let after_rotation = plugin(shared, &ns, &args).await;
    assert_eq!(
        after_rotation.stdout,
        "zone.kontinuum.sh/eu-west-1a unchanged\n"
    );
    let missing = plugin(shared, &ns, &["zone", "rotate-identity", "eu-nope"]).await;
    assert_eq!(missing.code, 2, "{}", missing.stderr);

    // The GitOps path: the dry-run manifest, applied by kubectl, is the same object.
    let mut dry = args.to_vec();
    dry[5] = "west-1b";
    dry.extend(["--dry-run=client", "-o", "yaml"]);
    let manifest = plugin(shared, &ns, &dry).await;
    assert_eq!(manifest.code, 0, "{}", manifest.stderr);
    assert!(manifest.stderr.is_empty(), "{}", manifest.stderr);
    assert!(
        manifest
            .stdout
            .starts_with("apiVersion: kontinuum.sh/v1alpha2\nkind: Zone\n"),
        "{}",
        manifest.stdout
    );
    assert!(!manifest.stdout.contains("status"), "{}", manifest.stdout);
    assert!(
        zones.get_opt("eu-west-1b").await.unwrap().is_none(),
        "a dry run writes nothing"
    );
    let (ok, text) = kubectl_stdin(shared, &["apply", "-f", "-"], &manifest.stdout);
    assert!(ok, "{text}");
    assert!(
        text.contains("zone.kontinuum.sh/eu-west-1b created"),
        "{text}"
    );
    let applied = zones.get("eu-west-1b").await.unwrap();
    assert_eq!(applied.namespace().as_deref(), Some(ns.as_str()));
    let mut expected = spec.clone();
    expected["zone"] = json!("west-1b");
    assert_eq!(serde_json::to_value(&applied.spec).unwrap(), expected);
    let (ok, text) = kubectl_stdin(shared, &["apply", "-f", "-"], &manifest.stdout);
    assert!(ok, "{text}");
    assert!(
        text.contains("zone.kontinuum.sh/eu-west-1b unchanged"),
        "{text}"
    );
    let reapplied = zones.get("eu-west-1b").await.unwrap();
    assert_eq!(reapplied.resource_version(), applied.resource_version());

    // A field set by another manager (here kubectl's apply) is not silently taken over:
    // the API's conflict is exit 2, and --force-conflicts takes it.
    let mut other = args.to_vec();
    other[5] = "west-1b";
    other[11] = "other.example";
    let conflict = plugin(shared, &ns, &other).await;
    assert_eq!(conflict.code, 2, "{}", conflict.stderr);
    assert!(
        one_line(&conflict.stderr).contains("applying Zone eu-west-1b"),
        "{}",
        conflict.stderr
    );
    let line = one_line(&conflict.stderr);
    assert!(line.contains(".spec.domain"), "{line}");
    assert!(line.ends_with("(Conflict, 409)"), "{line}");
    assert!(!line.contains("Status {"), "no debug dump: {line}");
    other.push("--force-conflicts");
    let forced = plugin(shared, &ns, &other).await;
    assert_eq!(forced.code, 0, "{}", forced.stderr);
    assert_eq!(forced.stdout, "zone.kontinuum.sh/eu-west-1b configured\n");
    let forced_zone = zones.get("eu-west-1b").await.unwrap();
    assert_eq!(forced_zone.spec.domain.as_deref(), Some("other.example"));

    // JSON is the same manifest.
    let last = dry.len() - 1;
    dry[last] = "json";
    let json_manifest = plugin(shared, &ns, &dry).await;
    assert_eq!(json_manifest.code, 0, "{}", json_manifest.stderr);
    let parsed: serde_json::Value = serde_json::from_str(&json_manifest.stdout).unwrap();
    assert_eq!(parsed["spec"], expected);
    assert_eq!(
        parsed["metadata"],
        json!({ "name": "eu-west-1b", "namespace": ns })
    );
}

#[tokio::test]
async fn bad_input_exits_1_with_one_line_naming_the_flag() {
    let (_client, shared, ns) = setup("plugin-bad").await;
    let cases: [(&[&str], &str); 5] = [
        (
            &["zone", "add", "--region", "EU", "--zone", "a"],
            "--region",
        ),
        (
            &[
                "zone",
                "add",
                "--region",
                "eu",
                "--zone",
                "a",
                "--talos-address",
                "10.0.0.256",
            ],
            "--talos-address",
        ),
        (
            &[
                "zone",
                "add",
                "--region",
                "eu",
                "--zone",
                "a",
                "--talos-version",
                "1.13",
            ],
            "--talos-version",
        ),
        (&["zone", "add", "--zone", "a"], "--region"),
        (
            &[
                "zone",
                "add",
                "--region",
                "eu",
                "--zone",
                "a",
                "--timeout",
                "soon",
            ],
            "--timeout",
        ),
    ];
    for (args, flag) in cases {
        let run = plugin(shared, &ns, args).await;
        assert_eq!(run.code, 1, "{args:?}: {}", run.stderr);
        let line = one_line(&run.stderr);
        assert!(line.starts_with("error: "), "{line}");
        assert!(line.contains(flag), "{args:?}: {line}");
        assert!(run.stdout.is_empty(), "{}", run.stdout);
    }
    // Nothing was created.
    let zones = kontinuum_e2e::kubectl(shared, &["get", "zones", "-n", &ns, "-o", "name"]).unwrap();
    assert!(zones.trim().is_empty(), "{zones}");
    // An API refusal is exit 2.
    let run = plugin(shared, &ns, &["zone", "remove", "eu-missing"]).await;
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(
        one_line(&run.stderr).contains("not found"),
        "{}",
        run.stderr
    );
    // Help documents the exit codes.
    let run = plugin(shared, &ns, &["zone", "add", "--help"]).await;
    assert_eq!(run.code, 0);
    assert!(run.stdout.contains("3  timeout"), "{}", run.stdout);
}

#[tokio::test]
async fn list_and_describe_show_what_exists() {
    let (client, shared, ns) = setup("plugin-list").await;
    create_zone(&client, &ns, "eu", "a").await;
    create_zone(&client, &ns, "ap", "b").await;
    let zones: Api<Zone> = Api::namespaced(client.clone(), &ns);
    set_status(
        &zones,
        "eu-a",
        "Zone",
        json!({ "conditions": [
            condition("ClusterReady", "False", "WaitingForTalosCluster", "waiting for talos cluster \"eu-a\" to become ready"),
            condition("Ready", "False", "WaitingForTalosCluster", "waiting for talos cluster \"eu-a\" to become ready"),
        ]}),
    )
    .await;
    create_cluster(&client, &ns, "eu-a").await;
    let clusters: Api<TalosCluster> = Api::namespaced(client.clone(), &ns);
    set_status(
        &clusters,
        "eu-a",
        "TalosCluster",
        json!({ "conditions": [
            condition("Bootstrapped", "True", "Bootstrapped", ""),
            condition("Ready", "False", "WaitingForCni", "cilium is not installed yet"),
        ]}),
    )
    .await;

    let list = plugin(shared, &ns, &["zone", "list"]).await;
    assert_eq!(list.code, 0, "{}", list.stderr);
    let lines: Vec<&str> = list.stdout.lines().collect();
    assert_eq!(
        lines[0].split_whitespace().collect::<Vec<_>>(),
        ["NAME", "REGION", "ZONE", "DOMAIN", "READY", "REASON", "AGE"]
    );
    let row = |name: &str| -> Vec<&str> {
        lines
            .iter()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("{name} not listed: {}", list.stdout))
            .split_whitespace()
            .collect()
    };
    assert_eq!(
        row("eu-a")[..6],
        [
            "eu-a",
            "eu",
            "a",
            "<none>",
            "False",
            "WaitingForTalosCluster"
        ]
    );
    assert_eq!(row("ap-b")[..5], ["ap-b", "ap", "b", "<none>", "Unknown"]);
    assert!(!list.stdout.contains('\x1b'), "no colour off a terminal");

    let describe = plugin(shared, &ns, &["zone", "describe", "eu-a"]).await;
    assert_eq!(describe.code, 0, "{}", describe.stderr);
    let tree: Vec<&str> = describe.stdout.lines().collect();
    assert!(tree[0].starts_with("Zone eu-a "), "{}", describe.stdout);
    assert!(
        tree[0].contains("WaitingForTalosCluster"),
        "{}",
        describe.stdout
    );
    assert!(
        tree[1].starts_with("├─ TalosCluster eu-a "),
        "{}",
        describe.stdout
    );
    assert!(
        tree[1].contains("False")
            && tree[1].contains("WaitingForCni")
            && tree[1].contains("cilium is not installed yet"),
        "{}",
        describe.stdout
    );
    assert!(
        tree.iter()
            .any(|l| l.contains("InstancePool eu-a (control plane)") && l.contains("NotFound")),
        "{}",
        describe.stdout
    );
    assert!(
        tree.last().unwrap().contains("registry entry")
            && tree.last().unwrap().contains("NotRegistered"),
        "{}",
        describe.stdout
    );

    let missing = plugin(shared, &ns, &["zone", "describe", "eu-zz"]).await;
    assert_eq!(missing.code, 2, "{}", missing.stderr);
    assert!(one_line(&missing.stderr).contains("not found"));
}

#[tokio::test]
async fn wait_ends_when_the_zone_is_ready_and_exits_3_on_timeout() {
    let (client, shared, ns) = setup("plugin-wait").await;
    let zones: Api<Zone> = Api::namespaced(client.clone(), &ns);

    // Timeout: nothing makes the zone Ready.
    let started = Instant::now();
    let timed_out = plugin(
        shared,
        &ns,
        &[
            "zone",
            "add",
            "--region",
            "eu",
            "--zone",
            "late",
            "--wait",
            "--timeout",
            "3s",
        ],
    )
    .await;
    let took = started.elapsed();
    assert_eq!(
        timed_out.code, 3,
        "{}\n{}",
        timed_out.stdout, timed_out.stderr
    );
    let line = one_line(&timed_out.stderr);
    assert!(
        line.starts_with(
            "error: timed out after 3s waiting for zone eu-late to become Ready; blocked on: "
        ),
        "{line}"
    );
    assert!(
        line.contains("Zone eu-late reports no status yet"),
        "{line}"
    );
    assert!(
        took >= Duration::from_secs(3) && took < Duration::from_secs(30),
        "{took:?}"
    );
    assert!(
        timed_out.stdout.contains("Zone eu-late: created"),
        "{}",
        timed_out.stdout
    );
    eprintln!("timed-out wait took {took:?}");

    // Success: the test plays the zone-installer, step by step, and each step shows up
    // live before the next one is taken.
    let mut running = Live::spawn(command(
        shared,
        &ns,
        &[
            "zone",
            "add",
            "--region",
            "eu",
            "--zone",
            "ok",
            "--wait",
            "--timeout",
            "60s",
        ],
    ));
    running.expect("zone.kontinuum.sh/eu-ok created").await;
    running.expect("Zone eu-ok: created").await;
    set_status(
        &zones,
        "eu-ok",
        "Zone",
        json!({ "conditions": [
            condition("ClusterReady", "False", "WaitingForTalosCluster", "waiting"),
            condition("Ready", "False", "WaitingForTalosCluster", "waiting"),
        ]}),
    )
    .await;
    running
        .expect("Zone eu-ok: ClusterReady=False (WaitingForTalosCluster): waiting")
        .await;
    create_cluster(&client, &ns, "eu-ok").await;
    running.expect("TalosCluster eu-ok: created").await;
    let clusters: Api<TalosCluster> = Api::namespaced(client.clone(), &ns);
    set_status(
        &clusters,
        "eu-ok",
        "TalosCluster",
        json!({ "conditions": [ condition("Ready", "True", "Ready", "") ]}),
    )
    .await;
    running
        .expect("TalosCluster eu-ok: Ready=True (Ready)")
        .await;
    let ready_at = Instant::now();
    set_status(
        &zones,
        "eu-ok",
        "Zone",
        json!({ "conditions": [
            condition("ClusterReady", "True", "ClusterReady", "talos cluster is ready"),
            condition("Installed", "True", "Installed", "installed"),
            condition("RegistryJoined", "True", "RegistryJoined", "heartbeating"),
            condition("Ready", "True", "Ready", "the zone is ready"),
        ]}),
    )
    .await;
    let (code, lines, stderr) = running.finish().await;
    eprintln!("--wait returned {:?} after Ready=True", ready_at.elapsed());
    let stdout = lines.join("\n");
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("Zone eu-ok: Ready=True (Ready): the zone is ready"),
        "{stdout}"
    );
    assert_eq!(
        lines.last().map(String::as_str),
        Some("zone eu-ok is Ready"),
        "{stdout}"
    );
    assert!(
        !stdout.contains('\x1b'),
        "plain appended lines off a terminal: {stdout}"
    );
}

#[tokio::test]
async fn zone_kubeconfig_writes_and_merges_the_stored_kubeconfig() {
    let (client, shared, ns) = setup("plugin-kubeconfig").await;
    create_cluster(&client, &ns, "eu-k").await;
    let zone_kubeconfig = "apiVersion: v1\nkind: Config\ncurrent-context: admin@eu-k\nclusters:\n- name: eu-k\n  cluster:\n    server: https://192.0.2.10:6443\n    certificate-authority-data: Q0E=\ncontexts:\n- name: admin@eu-k\n  context:\n    cluster: eu-k\n    user: admin@eu-k\nusers:\n- name: admin@eu-k\n  user:\n    token: zone-token\n";

    // No secretRef yet: a clear error, exit 2.
    let early = plugin(shared, &ns, &["zone", "kubeconfig", "eu-k"]).await;
    assert_eq!(early.code, 2, "{}", early.stderr);
    assert!(
        one_line(&early.stderr).contains("has no kubeconfig yet"),
        "{}",
        early.stderr
    );

    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    secrets
        .create(
            &PostParams::default(),
            &Secret {
                metadata: ObjectMeta {
                    name: Some("eu-k-kubeconfig".into()),
                    ..ObjectMeta::default()
                },
                data: Some(BTreeMap::from([(
                    "kubeconfig".to_owned(),
                    ByteString(zone_kubeconfig.as_bytes().to_vec()),
                )])),
                ..Secret::default()
            },
        )
        .await
        .unwrap();
    let clusters: Api<TalosCluster> = Api::namespaced(client.clone(), &ns);
    set_status(
        &clusters,
        "eu-k",
        "TalosCluster",
        json!({ "secretRef": { "name": "eu-k-kubeconfig" } }),
    )
    .await;

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("zone.yaml");
    let run = plugin(
        shared,
        &ns,
        &[
            "zone",
            "kubeconfig",
            "eu-k",
            "--output",
            file.to_str().unwrap(),
        ],
    )
    .await;
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(std::fs::read_to_string(&file).unwrap(), zone_kubeconfig);
    assert_eq!(
        std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
        0o600
    );
    assert!(
        !run.stdout.contains("zone-token"),
        "credentials stay out of the messages"
    );

    let stdout = plugin(shared, &ns, &["zone", "kubeconfig", "eu-k"]).await;
    assert_eq!(stdout.code, 0, "{}", stdout.stderr);
    assert_eq!(stdout.stdout, zone_kubeconfig);

    // Merge into a copy of the hub kubeconfig, which keeps working.
    let user: PathBuf = dir.path().join("config");
    std::fs::copy(&shared.kubeconfig_path, &user).unwrap();
    for _ in 0..2 {
        let run = finish(&mut command_with(
            &user,
            &ns,
            &["zone", "kubeconfig", "eu-k", "--merge"],
        ))
        .await;
        assert_eq!(run.code, 0, "{}", run.stderr);
        assert!(
            run.stdout.contains("merged context \"eu-k\""),
            "{}",
            run.stdout
        );
    }
    let merged = kube::config::Kubeconfig::read_from(&user).unwrap();
    let original = kube::config::Kubeconfig::read_from(&shared.kubeconfig_path).unwrap();
    assert_eq!(merged.current_context, original.current_context);
    assert_eq!(
        merged.contexts.iter().filter(|c| c.name == "eu-k").count(),
        1
    );
    assert_eq!(merged.contexts.len(), original.contexts.len() + 1);
    let cluster = merged.clusters.iter().find(|c| c.name == "eu-k").unwrap();
    assert_eq!(
        cluster.cluster.as_ref().unwrap().server.as_deref(),
        Some("https://192.0.2.10:6443")
    );
    // The merged file still reaches the hub.
    let list = finish(&mut command_with(&user, &ns, &["zone", "list"])).await;
    assert_eq!(list.code, 0, "{}", list.stderr);
}

#[tokio::test]
async fn zone_remove_deletes_and_waits_for_teardown() {
    let (client, shared, ns) = setup("plugin-remove").await;
    let zones: Api<Zone> = Api::namespaced(client.clone(), &ns);
    create_zone(&client, &ns, "eu", "gone").await;
    let run = plugin(shared, &ns, &["zone", "remove", "eu-gone"]).await;
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(run.stdout, "zone.kontinuum.sh/eu-gone deleted\n");
    eventually(LIMIT, "eu-gone deleted", || async {
        Ok(zones.get_opt("eu-gone").await?.is_none())
    })
    .await
    .unwrap();

    // With a finalizer (the zone-installer's teardown), --wait shows the Deleting condition
    // and its deadline until the Zone is gone, then the TalosCluster's teardown (its own
    // finalizer resets the machines after the Zone's went) until it is gone too.
    create_zone(&client, &ns, "eu", "slow").await;
    create_cluster(&client, &ns, "eu-slow").await;
    let clusters: Api<TalosCluster> = Api::namespaced(client.clone(), &ns);
    set_finalizer(&zones, "eu-slow", Some("kontinuum.sh/zone-installer")).await;
    set_finalizer(
        &clusters,
        "eu-slow",
        Some("kontinuum.sh/taloscluster-teardown"),
    )
    .await;
    set_status(
        &zones,
        "eu-slow",
        "Zone",
        json!({ "conditions": [ condition("Deleting", "True", "DownstreamTeardownFailed",
            "zone cluster unreachable; retrying until 2026-12-01T23:45:00Z, then the finalizer is removed") ]}),
    )
    .await;
    let mut running = Live::spawn(command(
        shared,
        &ns,
        &["zone", "remove", "eu-slow", "--wait", "--timeout", "60s"],
    ));
    running.expect("zone.kontinuum.sh/eu-slow deleted").await;
    running.expect(
        "Zone eu-slow: Deleting=True (DownstreamTeardownFailed): zone cluster unreachable; retrying until 2026-12-01T23:45:00Z",
    )
    .await;
    // The zone-installer's last step: the TalosCluster's deletion issued, its finalizer gone.
    clusters
        .delete("eu-slow", &DeleteParams::default())
        .await
        .unwrap();
    set_finalizer(&zones, "eu-slow", None).await;
    running.expect("Zone eu-slow: gone").await;
    // Still waiting: the machines are being reset.
    set_status(
        &clusters,
        "eu-slow",
        "TalosCluster",
        json!({ "conditions": [ condition("Deleting", "True", "ResettingInstances",
            "resetting eu-slow-cp-0") ]}),
    )
    .await;
    running
        .expect("TalosCluster eu-slow: Deleting=True (ResettingInstances): resetting eu-slow-cp-0")
        .await;
    set_finalizer(&clusters, "eu-slow", None).await;
    let (code, lines, stderr) = running.finish().await;
    let stdout = lines.join("\n");
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    assert!(stdout.contains("TalosCluster eu-slow: gone"), "{stdout}");
    assert_eq!(
        lines.last().map(String::as_str),
        Some("zone eu-slow removed"),
        "{stdout}"
    );

    // A removal that does not finish in time names the teardown condition.
    create_zone(&client, &ns, "eu", "stuck").await;
    set_finalizer(&zones, "eu-stuck", Some("kontinuum.sh/zone-installer")).await;
    set_status(
        &zones,
        "eu-stuck",
        "Zone",
        json!({ "conditions": [ condition("Deleting", "True", "Deleting", "removing the footprint until 2026-12-01T23:50:00Z") ]}),
    )
    .await;
    let stuck = plugin(
        shared,
        &ns,
        &["zone", "remove", "eu-stuck", "--wait", "--timeout", "2s"],
    )
    .await;
    assert_eq!(stuck.code, 3, "{}", stuck.stderr);
    assert!(
        one_line(&stuck.stderr).contains("blocked on: Zone eu-stuck Deleting=True (Deleting): removing the footprint until 2026-12-01T23:50:00Z"),
        "{}",
        stuck.stderr
    );
    set_finalizer(&zones, "eu-stuck", None).await;
}

#[tokio::test]
async fn instance_add_and_list() {
    let (client, shared, ns) = setup("plugin-instance").await;
    let args = [
        "instance",
        "add",
        "--address",
        "192.0.2.10",
        "--region",
        "eu",
        "--zone",
        "west-1a",
    ];
    let run = plugin(shared, &ns, &args).await;
    assert_eq!(run.code, 0, "{}", run.stderr);
    // The zone's seed name for the address, so `zone add` adopts it.
    assert_eq!(
        run.stdout,
        "instance.kontinuum.sh/eu-west-1a-6d99cbd08f created\n"
    );
    let again = plugin(shared, &ns, &args).await;
    assert_eq!(
        again.stdout,
        "instance.kontinuum.sh/eu-west-1a-6d99cbd08f unchanged\n"
    );
    let instances: Api<Instance> = Api::namespaced(client.clone(), &ns);
    let instance = instances.get("eu-west-1a-6d99cbd08f").await.unwrap();
    assert_eq!(instance.spec.interfaces, ["192.0.2.10"]);
    assert_eq!(
        instance
            .labels()
            .get("kontinuum.sh/zone")
            .map(String::as_str),
        Some("west-1a")
    );

    let named = plugin(
        shared,
        &ns,
        &[
            "instance",
            "add",
            "--address",
            "node-1.example.com",
            "--name",
            "rack1-n1",
        ],
    )
    .await;
    assert_eq!(named.code, 0, "{}", named.stderr);

    let list = plugin(shared, &ns, &["instance", "list"]).await;
    assert_eq!(list.code, 0, "{}", list.stderr);
    let lines: Vec<Vec<&str>> = list
        .stdout
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        lines[0],
        [
            "NAME",
            "ADDRESS",
            "REGION",
            "ZONE",
            "CLAIMED-BY",
            "DISCOVERED",
            "READY",
            "AGE"
        ]
    );
    assert_eq!(
        lines[1][..7],
        [
            "eu-west-1a-6d99cbd08f",
            "192.0.2.10",
            "eu",
            "west-1a",
            "<none>",
            "Unknown",
            "Unknown"
        ]
    );
    assert_eq!(
        lines[2][..5],
        [
            "rack1-n1",
            "node-1.example.com",
            "<none>",
            "<none>",
            "<none>"
        ]
    );

    let version = plugin(shared, &ns, &["version"]).await;
    assert_eq!(version.code, 0, "{}", version.stderr);
    assert!(
        version.stdout.starts_with("Client Version: v"),
        "{}",
        version.stdout
    );
    assert!(
        version.stdout.contains(&format!(
            "Server Version: unknown (no hub Kontinuum registered in namespace {ns})"
        )),
        "{}",
        version.stdout
    );

    let completion = plugin(shared, &ns, &["completion", "bash"]).await;
    assert_eq!(completion.code, 0, "{}", completion.stderr);
    assert!(
        completion.stdout.contains("kubectl-kontinuum"),
        "completion script"
    );
}
