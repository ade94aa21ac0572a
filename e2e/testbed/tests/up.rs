//! `kontinuum-testbed up` as a user runs it: it prints `ready`, the kubeconfig it wrote
//! works, and SIGTERM stops every component.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::large_futures
)]

use std::process::Stdio;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kontinuum_testbed::{Tools, client_from, install_crypto_provider, node_is_ready, unique_dir};
use kube::Api;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, BufReader};

#[tokio::test]
async fn up_prints_ready_serves_and_stops_on_sigterm() {
    install_crypto_provider();
    let tools = Tools::locate().unwrap();
    let dir = unique_dir("up");
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_kontinuum-testbed"))
        .args(["up", "--port", "0", "--dir"])
        .arg(&dir)
        .env(kontinuum_testbed::BIN_ENV, tools.dir())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = tokio::time::timeout(Duration::from_secs(120), lines.next_line())
        .await
        .expect("no output within 120 s")
        .unwrap();
    assert_eq!(first.as_deref(), Some("ready"));

    let kubeconfig = std::fs::read_to_string(dir.join("kubeconfig")).unwrap();
    let client = client_from(&kubeconfig).await.unwrap();
    let node = Api::<Node>::all(client).get("kwok-node-0").await.unwrap();
    assert!(node_is_ready(&node));

    // Every component is a child of the harness; remember them to check they are gone.
    let pid = i32::try_from(child.id().unwrap()).unwrap();
    let mut children = String::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(Result::ok)
    {
        let path = task.path().join("children");
        children.push_str(&std::fs::read_to_string(path).unwrap_or_default());
        children.push(' ');
    }
    assert!(
        children.split_whitespace().count() >= 5,
        "expected 5 components, got {children:?}"
    );
    kill(Pid::from_raw(pid), Signal::SIGTERM).unwrap();
    let status = tokio::time::timeout(Duration::from_secs(60), child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "exit status {status}");
    for component in children.split_whitespace() {
        assert!(
            !std::path::Path::new(&format!("/proc/{component}")).exists()
                || std::fs::read_to_string(format!("/proc/{component}/stat"))
                    .unwrap_or_default()
                    .contains(") Z"),
            "component {component} still runs after SIGTERM"
        );
    }
    assert!(
        !dir.join("etcd").exists(),
        "etcd data is removed on a clean stop"
    );
    assert!(
        dir.join("logs/kube-apiserver.log").exists(),
        "logs are kept"
    );
}
