//! The hub's store mirror against a real etcd (the test bed's), reached through a TCP
//! forwarder the test can cut: a broken watch resumes from the last revision it saw (no
//! re-list, every change made meanwhile arrives), and a watch whose revision was compacted
//! meanwhile leads to a fresh list that replaces the index.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stderr
)]

mod support;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use etcd_proxy::store::Store;
use kontinuum_operator_common::shutdown::{Reason, Shutdown};
use kontinuum_proto::etcd::etcdserverpb as pb;
use prometheus_client::registry::Registry as Prometheus;
use registry::metrics::Metrics;
use registry::mirror::{self, Index};
use registry::record::RegistrationKey;
use support::{Etcd, LOCALHOST, free_port, wait_for};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio::task::{JoinHandle, JoinSet};

/// Forwards `addr` to `upstream` until cut; cutting closes the listener and every
/// connection, as a network partition would.
struct Forwarder {
    addr: SocketAddr,
    upstream: SocketAddr,
    task: Option<JoinHandle<()>>,
}

impl Forwarder {
    async fn start(upstream: SocketAddr) -> Self {
        let mut f = Self {
            addr: SocketAddr::new(LOCALHOST, free_port()),
            upstream,
            task: None,
        };
        f.restore().await;
        f
    }

    async fn restore(&mut self) {
        let listener = TcpListener::bind(self.addr).await.unwrap();
        let upstream = self.upstream;
        self.task = Some(tokio::spawn(async move {
            let mut conns = JoinSet::new();
            loop {
                let Ok((mut down, _)) = listener.accept().await else {
                    continue;
                };
                conns.spawn(async move {
                    if let Ok(mut up) = TcpStream::connect(upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut down, &mut up).await;
                    }
                });
            }
        }));
    }

    async fn cut(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
            let _ = task.await;
        }
    }
}

fn key(name: &str) -> String {
    RegistrationKey::new("eu", "1a", name).unwrap().key()
}

fn value() -> String {
    serde_json::json!({"lastHeartbeatTime": k8s_openapi::jiff::Timestamp::now().to_string()})
        .to_string()
}

async fn delete(etcd: &Etcd, key: &str) {
    etcd.kv()
        .delete_range(pb::DeleteRangeRequest {
            key: key.as_bytes().to_vec(),
            ..Default::default()
        })
        .await
        .unwrap();
}

async fn names(index: &Index, want: &[&str]) {
    let want: BTreeSet<String> = want.iter().map(|n| format!("eu.1a.{n}")).collect();
    wait_for(
        &format!("the index to hold {want:?}"),
        Duration::from_secs(20),
        || {
            let have: BTreeSet<String> = index.snapshot().unwrap_or_default().into_keys().collect();
            let done = have == want;
            async move { done.then_some(()) }
        },
    )
    .await;
}

fn count(metrics: &Metrics, event: &'static str) -> u64 {
    metrics
        .mirror_events
        .get_or_create(&registry::metrics::EventLabels { event })
        .get()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mirror_resumes_from_its_revision_and_relists_after_compaction() {
    kontinuum_testbed::install_crypto_provider();
    let dir = kontinuum_testbed::unique_dir("registry-mirror");
    std::fs::create_dir_all(&dir).unwrap();
    let etcd = Etcd::start(&dir).await;
    let upstream: SocketAddr = etcd.url.trim_start_matches("http://").parse().unwrap();
    let mut forwarder = Forwarder::start(upstream).await;

    let store = Arc::new(Store::new(
        &[format!("http://{}", forwarder.addr).parse().unwrap()],
        None,
    ));
    let index = Arc::new(Index::new(Arc::new(Notify::new())));
    let metrics = Metrics::register(&mut Prometheus::default());
    let shutdown = Shutdown::new();
    // Not a registration: ignored.
    etcd.put("/kontinuum.sh/zones/eu/1a/other", "x").await;
    etcd.put(&key("a"), &value()).await;
    let task = tokio::spawn(mirror::run(
        Arc::clone(&store),
        Arc::clone(&index),
        Arc::clone(&metrics),
        shutdown.clone(),
    ));
    names(&index, &["a"]).await;
    etcd.put(&key("b"), &value()).await;
    names(&index, &["a", "b"]).await;
    assert_eq!(count(&metrics, "list"), 1);

    // A partition: changes made meanwhile arrive once the watch resumes, without a list.
    forwarder.cut().await;
    etcd.put(&key("c"), &value()).await;
    delete(&etcd, &key("a")).await;
    forwarder.restore().await;
    names(&index, &["b", "c"]).await;
    assert!(count(&metrics, "watch_error") >= 1);
    assert_eq!(count(&metrics, "list"), 1, "resumed, not re-listed");
    assert_eq!(count(&metrics, "compacted"), 0);

    // A partition during which the store compacts past the watch's revision: re-listed.
    forwarder.cut().await;
    etcd.put(&key("d"), &value()).await;
    delete(&etcd, &key("b")).await;
    let (revision, _) = etcd.snapshot().await;
    etcd.kv()
        .compact(pb::CompactionRequest {
            revision,
            physical: true,
        })
        .await
        .unwrap();
    forwarder.restore().await;
    names(&index, &["c", "d"]).await;
    assert_eq!(count(&metrics, "compacted"), 1);
    assert_eq!(count(&metrics, "list"), 2, "re-listed after compaction");
    eprintln!(
        "mirror: lists {}, watch errors {}, compactions {}",
        count(&metrics, "list"),
        count(&metrics, "watch_error"),
        count(&metrics, "compacted")
    );

    shutdown.trigger(Reason::Signal);
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .unwrap()
        .unwrap();
}
