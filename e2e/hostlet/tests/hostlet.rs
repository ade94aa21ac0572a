//! The hostlet on the real test bed: pods bound to its nodes run as real host processes,
//! with the env, volumes, identity, probes, restarts, termination and refusals of a kubelet.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::large_futures,
    clippy::too_many_lines,
    clippy::similar_names
)]

mod support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use base64::Engine as _;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, ServiceAccount};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::runtime::wait::{await_condition, conditions};
use kube::{Client, ResourceExt as _};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use support::{
    NODE_A, NODE_B, alive, bed, condition, first_container, namespace, pid_of, running, wait_file,
    wait_pod, within,
};

const LIMIT: Duration = Duration::from_secs(90);

async fn create<K>(client: &Client, ns: &str, value: serde_json::Value) -> K
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    let object: K = serde_json::from_value(value).unwrap();
    Api::<K>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &object)
        .await
        .unwrap()
}

/// A bare pod bound to `node` running `script` with /bin/sh.
fn shell_pod(name: &str, node: &str, script: &str) -> serde_json::Value {
    serde_json::json!({
        "metadata": { "name": name },
        "spec": {
            "nodeName": node,
            "containers": [{
                "name": "main",
                "image": "test.kontinuum.sh/shell:1",
                "command": ["/bin/sh", "-c", script],
            }]
        }
    })
}

const REPORT_SCRIPT: &str = r#"
SA=/var/run/secrets/kubernetes.io/serviceaccount
{
  echo "uid=$(id -u)"
  echo "gid=$(id -g)"
  echo "groups=$(id -G)"
  echo "LITERAL=$LITERAL"
  echo "EXPANDED=$EXPANDED"
  echo "PASSWORD=$PASSWORD"
  echo "GREETING=$GREETING"
  echo "POD_IP=$POD_IP"
  echo "POD_NAME=$POD_NAME"
  echo "POD_NAMESPACE=$POD_NAMESPACE"
  echo "MEM_LIMIT_MI=$MEM_LIMIT_MI"
  echo "KUBE=$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT"
  echo "HOSTNAME=$HOSTNAME"
  echo "hostname=$(hostname)"
  echo "secret_file=$(cat /etc/creds/password)"
  echo "config_file=$(cat /etc/settings/greeting)"
  echo "downward_name=$(cat /etc/podinfo/name)"
  echo "downward_labels=$(tr '\n' ',' < /etc/podinfo/labels)"
  echo "hello=$(/opt/kontinuum-hostlet-test/bin/hello from-the-image)"
  echo "sa_namespace=$(cat $SA/namespace)"
  echo "token=$(cat $SA/token)"
  echo "ca=$(base64 -w0 < $SA/ca.crt)"
  echo written-by-the-pod > /scratch/note
  echo "scratch=$(cat /scratch/note)"
  if echo x > /etc/creds/new 2>/dev/null; then echo "secret_volume=writable"; else echo "secret_volume=read-only"; fi
} > /scratch/report 2>&1
cat /scratch/report
echo REPORT-END
exec /usr/bin/python3 -m http.server 8080 --bind "$POD_IP" --directory /scratch
"#;

fn report(log: &str) -> BTreeMap<String, String> {
    log.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[tokio::test]
async fn a_deployment_runs_a_real_process_with_env_volumes_and_identity() {
    let bed = bed();
    let client = bed.client().await.unwrap();
    let ns = namespace(&client, "real").await.unwrap();
    let _: ServiceAccount = create(
        &client,
        &ns,
        serde_json::json!({ "metadata": { "name": "runner" } }),
    )
    .await;
    let _: Secret = create(
        &client,
        &ns,
        serde_json::json!({ "metadata": { "name": "creds" }, "stringData": { "password": "s3cret" } }),
    )
    .await;
    let _: ConfigMap = create(
        &client,
        &ns,
        serde_json::json!({
            "metadata": { "name": "settings" },
            "data": { "greeting": "hello", "report.sh": REPORT_SCRIPT }
        }),
    )
    .await;
    let _: Deployment = create(
        &client,
        &ns,
        serde_json::json!({
            "metadata": { "name": "web" },
            "spec": {
                "replicas": 1,
                "selector": { "matchLabels": { "app": "web" } },
                "template": {
                    "metadata": { "labels": { "app": "web" } },
                    "spec": {
                        "nodeSelector": { "kubernetes.io/hostname": NODE_A },
                        "serviceAccountName": "runner",
                        "securityContext": { "runAsUser": 1234, "runAsGroup": 1234, "fsGroup": 2345, "runAsNonRoot": true },
                        "containers": [{
                            "name": "app",
                            "image": "test.kontinuum.sh/shell:v1",
                            "command": ["/bin/sh", "/etc/settings/report.sh"],
                            "ports": [{ "name": "http", "containerPort": 8080 }],
                            "resources": { "limits": { "memory": "64Mi" } },
                            "securityContext": { "allowPrivilegeEscalation": false },
                            "env": [
                                { "name": "LITERAL", "value": "lit" },
                                { "name": "EXPANDED", "value": "$(LITERAL)-and-$(POD_NAME)-$$(LITERAL)" },
                                { "name": "POD_NAME", "valueFrom": { "fieldRef": { "fieldPath": "metadata.name" } } },
                                { "name": "POD_NAMESPACE", "valueFrom": { "fieldRef": { "fieldPath": "metadata.namespace" } } },
                                { "name": "POD_IP", "valueFrom": { "fieldRef": { "fieldPath": "status.podIP" } } },
                                { "name": "PASSWORD", "valueFrom": { "secretKeyRef": { "name": "creds", "key": "password" } } },
                                { "name": "GREETING", "valueFrom": { "configMapKeyRef": { "name": "settings", "key": "greeting" } } },
                                { "name": "MEM_LIMIT_MI", "valueFrom": { "resourceFieldRef": { "resource": "limits.memory", "divisor": "1Mi" } } },
                            ],
                            "readinessProbe": { "httpGet": { "path": "/report", "port": "http" }, "periodSeconds": 1 },
                            "volumeMounts": [
                                { "name": "creds", "mountPath": "/etc/creds" },
                                { "name": "settings", "mountPath": "/etc/settings" },
                                { "name": "scratch", "mountPath": "/scratch" },
                                { "name": "podinfo", "mountPath": "/etc/podinfo" },
                            ]
                        }],
                        "volumes": [
                            { "name": "creds", "secret": { "secretName": "creds" } },
                            { "name": "settings", "configMap": { "name": "settings" } },
                            { "name": "scratch", "emptyDir": {} },
                            { "name": "podinfo", "downwardAPI": { "items": [
                                { "path": "name", "fieldRef": { "fieldPath": "metadata.name" } },
                                { "path": "labels", "fieldRef": { "fieldPath": "metadata.labels" } },
                            ] } },
                        ]
                    }
                }
            }
        }),
    )
    .await;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    within(
        LIMIT,
        "Deployment web available through its readiness probe",
        await_condition(
            deployments.clone(),
            "web",
            conditions::is_deployment_completed(),
        ),
    )
    .await
    .unwrap()
    .unwrap();

    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let pod = pods
        .list(&ListParams::default().labels("app=web"))
        .await
        .unwrap()
        .items
        .pop()
        .unwrap();
    assert!(running(&pod) && condition(&pod, "Ready") && condition(&pod, "ContainersReady"));
    let status = pod.status.clone().unwrap();
    // The pod was not Ready before it was; its True conditions keep nothing of that past.
    for c in status.conditions.iter().flatten() {
        if c.status == "True" {
            assert_eq!((&c.reason, &c.message), (&None, &None), "{c:?}");
        }
    }
    let pod_ip: std::net::Ipv4Addr = status.pod_ip.clone().unwrap().parse().unwrap();
    assert_eq!(
        status.host_ip.as_deref(),
        Some(bed.node_a_ip.to_string().as_str())
    );
    let cidr_prefix = bed.pod_cidr_a.rsplit_once('.').unwrap().0;
    assert!(
        pod_ip.to_string().starts_with(&format!("{cidr_prefix}.")) && pod_ip != bed.node_a_ip,
        "pod IP {pod_ip} is from the pod CIDR {}",
        bed.pod_cidr_a
    );

    // What the process saw, from its log.
    let log = wait_file(&bed.log(NODE_A, &pod, "app"), "REPORT-END", LIMIT)
        .await
        .unwrap();
    let seen = report(&log);
    let get = |k: &str| seen.get(k).map_or("<missing>", String::as_str);
    assert_eq!(get("uid"), "1234", "{log}");
    assert_eq!(get("gid"), "1234");
    assert!(
        get("groups").split(' ').any(|g| g == "2345"),
        "fsGroup is a supplementary group: {}",
        get("groups")
    );
    assert_eq!(get("LITERAL"), "lit");
    assert_eq!(
        get("EXPANDED"),
        "lit-and-$(POD_NAME)-$(LITERAL)",
        "later vars are not expanded, $$ escapes"
    );
    assert_eq!(get("PASSWORD"), "s3cret");
    assert_eq!(get("GREETING"), "hello");
    assert_eq!(get("POD_IP"), pod_ip.to_string());
    assert_eq!(get("POD_NAME"), pod.name_any());
    assert_eq!(get("POD_NAMESPACE"), ns);
    assert_eq!(get("MEM_LIMIT_MI"), "64");
    let server = bed.server.trim_start_matches("https://");
    assert_eq!(
        get("KUBE"),
        server,
        "in-cluster config reaches the real API server"
    );
    assert_eq!(get("HOSTNAME"), pod.name_any());
    assert_eq!(get("hostname"), pod.name_any(), "a UTS namespace per pod");
    assert_eq!(get("secret_file"), "s3cret");
    assert_eq!(get("config_file"), "hello");
    assert_eq!(get("downward_name"), pod.name_any());
    assert!(
        get("downward_labels").contains("app=\"web\""),
        "{}",
        get("downward_labels")
    );
    assert_eq!(
        get("hello"),
        "from-the-image",
        "a mapped image file at its in-image path"
    );
    assert_eq!(get("sa_namespace"), ns);
    assert_eq!(get("scratch"), "written-by-the-pod");
    assert_eq!(get("secret_volume"), "read-only");

    // The readiness probe really reached the process: it serves the report over HTTP.
    let mut stream = tokio::net::TcpStream::connect((pod_ip, 8080))
        .await
        .unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut stream, b"GET /note HTTP/1.0\r\n\r\n")
        .await
        .unwrap();
    let mut body = String::new();
    tokio::io::AsyncReadExt::read_to_string(&mut stream, &mut body)
        .await
        .unwrap();
    assert!(body.contains("written-by-the-pod"), "{body}");

    // The process itself (python, exec'd by the script) runs as the pod's user.
    let pid = pid_of(&pod).unwrap();
    let proc_status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let uid_line = proc_status.lines().find(|l| l.starts_with("Uid:")).unwrap();
    assert!(
        uid_line.split_whitespace().skip(1).all(|u| u == "1234"),
        "{uid_line}"
    );
    let nnp = proc_status
        .lines()
        .find(|l| l.starts_with("NoNewPrivs:"))
        .unwrap();
    assert!(
        nnp.ends_with('1'),
        "allowPrivilegeEscalation: false sets no_new_privs: {nnp}"
    );
    // Its mounts are private: the host does not see the pod's /etc/creds.
    assert!(!std::path::Path::new("/etc/creds/password").exists());

    // The projected token authenticates as the pod's ServiceAccount, trusting ca.crt.
    let ca = base64::engine::general_purpose::STANDARD
        .decode(get("ca"))
        .unwrap();
    let root_ca: ConfigMap = Api::namespaced(client.clone(), &ns)
        .get("kube-root-ca.crt")
        .await
        .unwrap();
    assert_eq!(
        String::from_utf8(ca.clone()).unwrap(),
        root_ca.data.unwrap()["ca.crt"]
    );
    let kubeconfig = format!(
        "apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: '{}', certificate-authority-data: {}}}}}]
users: [{{name: u, user: {{token: '{}'}}}}]
contexts: [{{name: c, context: {{cluster: c, user: u}}}}]
current-context: c
",
        bed.server,
        base64::engine::general_purpose::STANDARD.encode(&ca),
        get("token")
    );
    let as_pod = kontinuum_testbed::client_from(&kubeconfig).await.unwrap();
    let review: SelfSubjectReview = serde_json::from_value(serde_json::json!({
        "apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"
    }))
    .unwrap();
    let review = Api::<SelfSubjectReview>::all(as_pod)
        .create(&PostParams::default(), &review)
        .await
        .unwrap();
    let user = review.status.unwrap().user_info.unwrap();
    assert_eq!(
        user.username.as_deref(),
        Some(format!("system:serviceaccount:{ns}:runner").as_str())
    );
    let extra = user.extra.unwrap_or_default();
    assert_eq!(
        extra.get("authentication.kubernetes.io/pod-name"),
        Some(&vec![pod.name_any()]),
        "the token is bound to the pod"
    );
}

#[tokio::test]
async fn a_killed_process_is_restarted_and_counted() {
    let bed = bed();
    let client = bed.client().await.unwrap();
    let ns = namespace(&client, "restart").await.unwrap();
    let _: Pod = create(
        &client,
        &ns,
        shell_pod(
            "crashy",
            NODE_A,
            // `$$` in a command is Kubernetes' escape for `$`, so the shell's `$$` is `$$$$`.
            "echo started pid=$$$$; exec sleep 3600",
        ),
    )
    .await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let pod = wait_pod(&pods, "crashy", "running and ready", LIMIT, |p| {
        running(p) && condition(p, "Ready")
    })
    .await
    .unwrap();
    let first = pid_of(&pod).unwrap();
    assert!(alive(first));
    // Kill the shell's process only once it is the shell (its pid is the container's).
    wait_file(
        &bed.log(NODE_A, &pod, "main"),
        &format!("started pid={first}"),
        LIMIT,
    )
    .await
    .unwrap();
    kill(Pid::from_raw(first), Signal::SIGKILL).unwrap();
    let pod = wait_pod(&pods, "crashy", "restarted after SIGKILL", LIMIT, |p| {
        running(p)
            && first_container(p).is_some_and(|c| c.restart_count >= 1)
            && pid_of(p) != Some(first)
    })
    .await
    .unwrap();
    let c = first_container(&pod).unwrap();
    assert_eq!(c.restart_count, 1);
    let last = c
        .last_state
        .as_ref()
        .and_then(|s| s.terminated.as_ref())
        .unwrap();
    assert_eq!(last.exit_code, 137, "killed by SIGKILL");
    assert_eq!(last.reason.as_deref(), Some("Error"));
    let second = pid_of(&pod).unwrap();
    assert!(alive(second));
    let log = wait_file(
        &bed.log(NODE_A, &pod, "main"),
        &format!("started pid={second}"),
        LIMIT,
    )
    .await
    .unwrap();
    assert_eq!(log.matches("started pid=").count(), 2, "{log}");
    // Restarts are counted again after a second kill, with back-off in between.
    kill(Pid::from_raw(second), Signal::SIGKILL).unwrap();
    wait_pod(&pods, "crashy", "second restart", LIMIT, |p| {
        first_container(p).is_some_and(|c| c.restart_count >= 2)
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn a_process_failing_readiness_leaves_the_deployment_unavailable() {
    let bed = bed();
    let client = bed.client().await.unwrap();
    let ns = namespace(&client, "unready").await.unwrap();
    let _: Deployment = create(
        &client,
        &ns,
        serde_json::json!({
            "metadata": { "name": "unready" },
            "spec": {
                "replicas": 1,
                "selector": { "matchLabels": { "app": "unready" } },
                "template": {
                    "metadata": { "labels": { "app": "unready" } },
                    "spec": {
                        "nodeSelector": { "kubernetes.io/hostname": NODE_A },
                        "containers": [{
                            "name": "main",
                            "image": "test.kontinuum.sh/shell",
                            "command": ["/bin/sh", "-c", "exec sleep 3600"],
                            "readinessProbe": {
                                "httpGet": { "path": "/", "port": 8080 },
                                "periodSeconds": 1,
                                "failureThreshold": 1,
                            },
                        }]
                    }
                }
            }
        }),
    )
    .await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let name = within(LIMIT, "the Deployment's pod", async {
        loop {
            let list = pods
                .list(&ListParams::default().labels("app=unready"))
                .await
                .unwrap();
            if let Some(p) = list.items.first() {
                return p.name_any();
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await
    .unwrap();
    wait_pod(&pods, &name, "running", LIMIT, running)
        .await
        .unwrap();
    // Wait until the probe has failed several times (Events), not for a fixed time.
    let events: Api<Event> = Api::namespaced(client.clone(), &ns);
    within(LIMIT, "three failed readiness probes", async {
        loop {
            let list = events.list(&ListParams::default()).await.unwrap();
            let failures: i32 = list
                .items
                .iter()
                .filter(|e| {
                    e.reason.as_deref() == Some("Unhealthy")
                        && e.regarding.as_ref().and_then(|r| r.name.as_deref())
                            == Some(name.as_str())
                        && e.note
                            .as_deref()
                            .is_some_and(|n| n.starts_with("Readiness probe failed"))
                })
                .map(|e| e.series.as_ref().map_or(1, |s| s.count))
                .sum();
            if failures >= 3 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await
    .unwrap();
    let pod = pods.get(&name).await.unwrap();
    assert!(running(&pod), "the process runs");
    assert!(!condition(&pod, "Ready"), "but the pod is not Ready");
    assert!(!condition(&pod, "ContainersReady"));
    assert!(!first_container(&pod).unwrap().ready);
    let deployment: Deployment = Api::namespaced(client.clone(), &ns)
        .get("unready")
        .await
        .unwrap();
    let status = deployment.status.unwrap();
    assert_eq!(status.available_replicas.unwrap_or(0), 0, "{status:?}");
    assert_eq!(status.ready_replicas.unwrap_or(0), 0, "{status:?}");
}

#[tokio::test]
async fn deleting_a_pod_stops_its_process_within_the_grace_period() {
    let bed = bed();
    let client = bed.client().await.unwrap();
    let ns = namespace(&client, "delete").await.unwrap();
    let polite =
        "trap 'echo got SIGTERM; exit 0' TERM; echo started; while true; do sleep 0.2; done";
    let stubborn =
        "trap 'echo ignoring SIGTERM' TERM; echo started; while true; do sleep 0.2; done";
    let _: Pod = create(&client, &ns, shell_pod("polite", NODE_A, polite)).await;
    let mut stubborn_pod = shell_pod("stubborn", NODE_A, stubborn);
    stubborn_pod["spec"]["terminationGracePeriodSeconds"] = 3.into();
    let _: Pod = create(&client, &ns, stubborn_pod).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let polite = wait_pod(&pods, "polite", "running", LIMIT, running)
        .await
        .unwrap();
    let stubborn = wait_pod(&pods, "stubborn", "running", LIMIT, running)
        .await
        .unwrap();
    for p in [&polite, &stubborn] {
        wait_file(&bed.log(NODE_A, p, "main"), "started", LIMIT)
            .await
            .unwrap();
    }
    let (polite_pid, stubborn_pid) = (pid_of(&polite).unwrap(), pid_of(&stubborn).unwrap());

    let (polite_uid, stubborn_uid) = (polite.uid().unwrap(), stubborn.uid().unwrap());
    let started = Instant::now();
    pods.delete("polite", &DeleteParams::default())
        .await
        .unwrap();
    pods.delete("stubborn", &DeleteParams::default())
        .await
        .unwrap();
    let polite_gone = within(
        LIMIT,
        "pod polite deleted",
        await_condition(pods.clone(), "polite", conditions::is_deleted(&polite_uid)),
    );
    let stubborn_gone = async {
        within(
            LIMIT,
            "pod stubborn deleted",
            await_condition(
                pods.clone(),
                "stubborn",
                conditions::is_deleted(&stubborn_uid),
            ),
        )
        .await
        .unwrap()
        .unwrap();
        started.elapsed()
    };
    let polite_gone = async {
        polite_gone.await.unwrap().unwrap();
        started.elapsed()
    };
    let (polite_after, stubborn_after) = tokio::join!(polite_gone, stubborn_gone);
    // SIGTERM honoured: well inside the default 30 s grace period.
    assert!(
        polite_after < Duration::from_secs(15),
        "polite took {polite_after:?}"
    );
    assert!(!alive(polite_pid), "polite's process is gone");
    let log = std::fs::read_to_string(bed.log(NODE_A, &polite, "main")).unwrap();
    assert!(log.contains("got SIGTERM"), "{log}");
    // SIGTERM ignored: killed after terminationGracePeriodSeconds (3 s), not before.
    assert!(
        stubborn_after >= Duration::from_millis(2900),
        "stubborn took {stubborn_after:?}"
    );
    assert!(
        stubborn_after < Duration::from_secs(20),
        "stubborn took {stubborn_after:?}"
    );
    assert!(!alive(stubborn_pid), "stubborn's process is gone");
    let log = std::fs::read_to_string(bed.log(NODE_A, &stubborn, "main")).unwrap();
    assert!(
        log.contains("ignoring SIGTERM"),
        "it did get SIGTERM first: {log}"
    );
}

#[tokio::test]
async fn unmapped_images_and_port_clashes_are_refused_and_pretend_runs_them() {
    let bed = bed();
    let client = bed.client().await.unwrap();
    let ns = namespace(&client, "refuse").await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);

    // Node A refuses an unmapped image, naming it; KWOK does not pretend it runs either.
    let mut unmapped = shell_pod("unmapped", NODE_A, "true");
    unmapped["spec"]["containers"][0]["image"] = "example.invalid/nothing:1".into();
    let _: Pod = create(&client, &ns, unmapped.clone()).await;
    let pod = wait_pod(&pods, "unmapped", "ImageNotMapped", LIMIT, |p| {
        first_container(p)
            .and_then(|c| c.state.as_ref())
            .and_then(|s| s.waiting.as_ref())
            .is_some_and(|w| w.reason.as_deref() == Some("ImageNotMapped"))
    })
    .await
    .unwrap();
    let waiting = first_container(&pod)
        .unwrap()
        .state
        .clone()
        .unwrap()
        .waiting
        .unwrap();
    assert!(
        waiting
            .message
            .as_deref()
            .unwrap()
            .contains("example.invalid/nothing:1"),
        "{waiting:?}"
    );
    assert_eq!(pod.status.unwrap().phase.as_deref(), Some("Pending"));

    // Node B (pod IP = node IP): a second pod declaring a taken port is rejected.
    let sleeper = "exec sleep 3600";
    let mut first = shell_pod("first", NODE_B, sleeper);
    first["spec"]["containers"][0]["ports"] = serde_json::json!([{ "containerPort": 18081 }]);
    let _: Pod = create(&client, &ns, first.clone()).await;
    let first_pod = wait_pod(&pods, "first", "running", LIMIT, running)
        .await
        .unwrap();
    assert_eq!(
        first_pod.status.unwrap().pod_ip.as_deref(),
        Some(bed.node_b_ip.to_string().as_str()),
        "without a pod CIDR the pod IP is the node's"
    );
    first["metadata"]["name"] = "second".into();
    let _: Pod = create(&client, &ns, first).await;
    let second = wait_pod(&pods, "second", "rejected", LIMIT, |p| {
        p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Failed")
    })
    .await
    .unwrap();
    let status = second.status.unwrap();
    assert_eq!(status.reason.as_deref(), Some("NodePorts"));
    let message = status.message.unwrap();
    assert!(
        message.contains("18081") && message.contains(&format!("{ns}/first")),
        "{message}"
    );

    // Node B pretends unmapped images run, as KWOK would.
    unmapped["metadata"]["name"] = "pretend".into();
    unmapped["spec"]["nodeName"] = NODE_B.into();
    let _: Pod = create(&client, &ns, unmapped).await;
    let pod = wait_pod(
        &pods,
        "pretend",
        "pretended Running and Ready",
        LIMIT,
        |p| running(p) && condition(p, "Ready"),
    )
    .await
    .unwrap();
    assert_eq!(
        pod.status.unwrap().pod_ip.as_deref(),
        Some(bed.node_b_ip.to_string().as_str())
    );
}

#[tokio::test]
async fn init_containers_liveness_and_finished_pods_behave_like_a_kubelets() {
    let bed = bed();
    let client = bed.client().await.unwrap();
    let ns = namespace(&client, "lifecycle").await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);

    // Init containers run to completion, in order, before the app container.
    let _: Pod = create(
        &client,
        &ns,
        serde_json::json!({
            "metadata": { "name": "with-init" },
            "spec": {
                "nodeName": NODE_A,
                "volumes": [{ "name": "work", "emptyDir": {} }],
                "initContainers": [
                    { "name": "first", "image": "test.kontinuum.sh/shell", "command": ["/bin/sh", "-c", "echo one > /work/marker"],
                      "volumeMounts": [{ "name": "work", "mountPath": "/work" }] },
                    { "name": "second", "image": "test.kontinuum.sh/shell", "command": ["/bin/sh", "-c", "echo two >> /work/marker"],
                      "volumeMounts": [{ "name": "work", "mountPath": "/work" }] },
                ],
                "containers": [
                    { "name": "main", "image": "test.kontinuum.sh/shell", "command": ["/bin/sh", "-c", "echo saw $(cat /work/marker); exec sleep 3600"],
                      "volumeMounts": [{ "name": "work", "mountPath": "/work" }] },
                ]
            }
        }),
    )
    .await;
    let pod = wait_pod(&pods, "with-init", "running", LIMIT, running)
        .await
        .unwrap();
    let inits = pod.status.clone().unwrap().init_container_statuses.unwrap();
    for init in &inits {
        let t = init
            .state
            .as_ref()
            .and_then(|s| s.terminated.as_ref())
            .unwrap();
        assert_eq!(
            (t.exit_code, t.reason.as_deref()),
            (0, Some("Completed")),
            "{init:?}"
        );
    }
    assert!(condition(&pod, "Initialized"));
    wait_file(&bed.log(NODE_A, &pod, "main"), "saw one two", LIMIT)
        .await
        .unwrap();

    // A failing liveness probe (exec, run inside the pod's namespace) restarts the container.
    let mut unhealthy = shell_pod("unhealthy", NODE_A, "exec sleep 3600");
    unhealthy["spec"]["terminationGracePeriodSeconds"] = 1.into();
    unhealthy["spec"]["containers"][0]["livenessProbe"] = serde_json::json!({
        "exec": { "command": ["test", "-e", "/nonexistent"] },
        "periodSeconds": 1,
        "failureThreshold": 2,
    });
    let _: Pod = create(&client, &ns, unhealthy).await;
    wait_pod(
        &pods,
        "unhealthy",
        "restarted by its liveness probe",
        LIMIT,
        |p| first_container(p).is_some_and(|c| c.restart_count >= 1),
    )
    .await
    .unwrap();

    // restartPolicy Never: the phase is the process's verdict.
    for (name, script, phase, code) in [
        ("done", "exit 0", "Succeeded", 0),
        ("broken", "exit 3", "Failed", 3),
    ] {
        let mut p = shell_pod(name, NODE_A, script);
        p["spec"]["restartPolicy"] = "Never".into();
        let _: Pod = create(&client, &ns, p).await;
        let pod = wait_pod(&pods, name, phase, LIMIT, |p| {
            p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some(phase)
        })
        .await
        .unwrap();
        let t = first_container(&pod)
            .unwrap()
            .state
            .clone()
            .unwrap()
            .terminated
            .unwrap();
        assert_eq!(t.exit_code, code);
        assert_eq!(first_container(&pod).unwrap().restart_count, 0);
        assert!(!condition(&pod, "Ready"));
    }
}
