//! Issue 11, acceptance 4, on real parts: the test bed's etcd as the Kontinuum store and its
//! API server (with the Kontinuum CRD) as the hub; `etcd-proxy serve` (TLS, the zone's
//! identity Secret) and `etcd-proxy relay` (unix socket) between the zone agent and the
//! store; `registry hub` and `registry zone` as processes of the built binary.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::too_many_lines,
    clippy::print_stderr
)]

mod support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kontinuum_crds::conditions;
use kontinuum_crds::labels;
use kontinuum_crds::v1alpha2::{Kontinuum, KontinuumRole, KontinuumSpec, KontinuumStatus};
use kube::ResourceExt as _;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use registry::record::RegistrationKey;
use support::{Bed, LOCALHOST, Registry, Zone, free_port, get, install_kontinuum_crd, until};

const VERSION: &str = env!("CARGO_PKG_VERSION");

fn hub_args(bed: &Bed, extra: &[&str]) -> Vec<String> {
    let mut args = vec![
        "hub".to_string(),
        format!("--kubeconfig={}", bed.kubeconfig.display()),
        format!("--namespace={}", bed.namespace),
        "--name=hub".into(),
        format!("--store={}", bed.etcd.url),
    ];
    args.extend(extra.iter().map(ToString::to_string));
    args
}

fn spawn_hub(bed: &Bed, extra: &[&str]) -> Registry {
    Registry::spawn(
        "hub",
        &hub_args(bed, extra),
        &[
            ("KONTINUUM_SERVER_DNS_DOMAIN", "zones.example.com"),
            ("KONTINUUM_SERVER_GRPC_ENDPOINT", "hub.example.com:443"),
            (
                "KONTINUUM_SERVER_STORAGE",
                "postgres://kontinuum:hunter2@db:5432/k",
            ),
            ("KONTINUUM_ACME_EMAIL", "ops@example.com"),
            ("KONTINUUM_INSECURE_ALLOW_ANONYMOUS", "true"),
        ],
        &bed.dir,
    )
}

/// A zone agent for `zone` named `name`, through the relay at `store`, with a 3 s lease
/// kept alive every second and a heartbeat every second.
fn spawn_agent(bed: &Bed, zone: &Zone, name: &str, store: &str, http: SocketAddr) -> Registry {
    Registry::spawn(
        &format!("agent-{name}"),
        &[
            "zone".into(),
            format!("--region={}", zone.region),
            format!("--zone={}", zone.zone),
            format!("--name={name}"),
            format!("--store={store}"),
            "--lease-ttl-seconds=3".into(),
            "--heartbeat-seconds=1".into(),
            format!("--addr={http}"),
        ],
        &[("KONTINUUM_INSECURE_ALLOW_ANONYMOUS", "true")],
        &bed.dir,
    )
}

fn condition<'a>(k: &'a Kontinuum, type_: &str) -> Option<(&'a str, &'a str)> {
    let status = k.status.as_ref()?;
    conditions::get(&status.conditions, type_).map(|c| (c.status.as_str(), c.reason.as_str()))
}

fn ready(k: &Kontinuum) -> bool {
    condition(k, "Ready") == Some(("True", "Ready"))
}

fn is_worker(k: &Kontinuum) -> bool {
    k.status.as_ref().and_then(|s| s.role) == Some(KontinuumRole::Worker)
}

/// Polls the store key and the mirrored object together: when each first showed up.
async fn appearance(bed: &Bed, key: &str, object: &str, limit: Duration) -> (Instant, Instant) {
    let api: Api<Kontinuum> = Api::namespaced(bed.client.clone(), &bed.namespace);
    let start = Instant::now();
    let (mut key_at, mut object_at) = (None, None);
    loop {
        if key_at.is_none() && bed.etcd.get(key).await.is_some() {
            key_at = Some(Instant::now());
        }
        if object_at.is_none()
            && api
                .get_opt(object)
                .await
                .unwrap()
                .is_some_and(|k| is_worker(&k))
        {
            object_at = Some(Instant::now());
        }
        if let (Some(k), Some(o)) = (key_at, object_at) {
            return (k, o);
        }
        assert!(
            start.elapsed() < limit,
            "{key} / {object} did not appear within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acceptance_4_zone_registrations_are_mirrored_and_withdrawn() {
    support::require_etcd_proxy();
    let mut bed = Bed::new("reg-a4").await;
    install_kontinuum_crd(&bed.client).await;
    let zone = Zone::new(&bed.dir, "eu", "1a");
    bed.admit(&zone).await;
    bed.start_proxy().await;
    let socket = bed.dir.join("relay.sock");
    let store = format!("unix://{}", socket.display());
    let _relay = bed.start_relay(&zone, &store).await;
    let client = bed.client.clone();
    let ns = bed.namespace.clone();
    let api: Api<Kontinuum> = Api::namespaced(client.clone(), &ns);
    let limit = Duration::from_secs(30);

    // --- the hub registers itself ---
    let mut hub = spawn_hub(&bed, &["--heartbeat-seconds=60"]);
    hub.wait_healthy().await;
    let took = until(&client, &ns, limit, "the hub's Kontinuum", |all| {
        all.get("hub").is_some_and(ready)
    })
    .await;
    eprintln!("hub entry Ready {took:?} after the hub was healthy");
    let own = api.get("hub").await.unwrap();
    let status = own.status.clone().unwrap();
    assert_eq!(status.role, Some(KontinuumRole::ControlPlane));
    assert_eq!(status.version.as_deref(), Some(VERSION));
    assert_eq!(own.spec, KontinuumSpec::default());
    let config = status.config.clone().unwrap();
    let server = config.server.clone().unwrap();
    assert_eq!(
        server.dns.unwrap().domain.as_deref(),
        Some("zones.example.com")
    );
    assert_eq!(
        server.grpc.unwrap().endpoint.as_deref(),
        Some("hub.example.com:443")
    );
    assert_eq!(server.storage.as_deref(), Some("postgres://db:5432/k"));
    assert_eq!(
        config.acme.unwrap().email.as_deref(),
        Some("ops@example.com")
    );
    assert_eq!(config.insecure_allow_anonymous, Some(true));
    let published = serde_json::to_string(&status).unwrap();
    assert!(
        !published.contains("hunter2"),
        "a secret was published: {published}"
    );

    // --- a zone agent registers through relay and proxy: mirrored within 2 s ---
    let http = SocketAddr::new(LOCALHOST, free_port());
    let spawned = Instant::now();
    let mut agent = spawn_agent(&bed, &zone, "agent-a", &store, http);
    let key = RegistrationKey::new("eu", "1a", "agent-a").unwrap();
    let (key_at, object_at) = appearance(&bed, &key.key(), &key.object_name(), limit).await;
    let mirrored_in = object_at.saturating_duration_since(key_at);
    eprintln!(
        "agent spawned -> key in the store {:?}, -> Kontinuum on the hub {:?}; key -> Kontinuum {mirrored_in:?}",
        key_at - spawned,
        object_at - spawned
    );
    assert!(
        mirrored_in <= Duration::from_secs(2),
        "mirrored {mirrored_in:?} after the key appeared"
    );
    let mirrored = api.get("eu.1a.agent-a").await.unwrap();
    assert_eq!(mirrored.spec.region.as_deref(), Some("eu"));
    assert_eq!(mirrored.spec.zone.as_deref(), Some("1a"));
    assert_eq!(mirrored.labels()[labels::REGION], "eu");
    assert_eq!(mirrored.labels()[labels::ZONE], "1a");
    let status = mirrored.status.clone().unwrap();
    assert_eq!(status.version.as_deref(), Some(VERSION));
    let beat = status.last_heartbeat_time.clone().unwrap().0;
    assert!((Timestamp::now().as_second() - beat.as_second()).abs() <= 5);
    let zone_config = status.config.clone().unwrap();
    assert_eq!(zone_config.insecure_allow_anonymous, Some(true));
    assert_eq!(zone_config.server.unwrap().region.as_deref(), Some("eu"));
    until(&client, &ns, limit, "the mirrored entry Ready", |all| {
        all.get("eu.1a.agent-a").is_some_and(ready)
    })
    .await;

    // The zone endpoint (anonymous mode) shows the registration.
    let (code, body) = get(http, "/status", None).await.unwrap();
    assert_eq!(code, 200, "{body}");
    let zone_status: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(zone_status["region"], "eu");
    assert_eq!(zone_status["zone"], "1a");
    assert_eq!(zone_status["name"], "agent-a");
    assert_eq!(zone_status["version"], VERSION);
    assert_eq!(zone_status["registered"], true, "{zone_status}");
    assert_eq!(zone_status["storeReachable"], true);
    let lease_id = zone_status["leaseId"].as_i64().unwrap();
    assert!(zone_status["lastHeartbeatTime"].is_string());
    assert_eq!(get(http, "/readyz", None).await.unwrap().0, 200);
    let (code, body) = get(http, "/version", None).await.unwrap();
    assert_eq!(
        (code, body),
        (200, format!("{{\"version\":\"{VERSION}\"}}"))
    );
    assert!(agent.metric("kontinuum_registry_registered ").await >= 1);
    assert!(bed.etcd.lease_ttl(lease_id).await > 0);

    // --- the lease is lost (revoked behind the agent's back): a new one, the key again ---
    bed.etcd
        .lease()
        .lease_revoke(kontinuum_proto::etcd::etcdserverpb::LeaseRevokeRequest { id: lease_id })
        .await
        .unwrap();
    let revoked = Instant::now();
    let renewed = support::wait_for("a new lease", limit, || async {
        let (_, body) = get(http, "/status", None).await?;
        let status: serde_json::Value = serde_json::from_str(&body).ok()?;
        let id = status["leaseId"].as_i64()?;
        (id != lease_id && status["registered"] == true).then_some(id)
    })
    .await;
    support::wait_for("the key back on the new lease", limit, || async {
        bed.etcd.get(&key.key()).await.map(|_| ())
    })
    .await;
    eprintln!(
        "lease revoked -> registered again on a new lease in {:?}",
        revoked.elapsed()
    );
    assert!(bed.etcd.lease_ttl(renewed).await > 0);
    assert!(bed.etcd.lease_ttl(lease_id).await <= 0);
    assert_eq!(
        agent.metric("kontinuum_registry_lease_grants_total ").await,
        2
    );
    until(&client, &ns, limit, "the mirrored entry back", |all| {
        all.get("eu.1a.agent-a").is_some_and(ready)
    })
    .await;

    // --- a value claiming another location does not move the mirror ---
    let liar = RegistrationKey::new("eu", "1a", "liar").unwrap();
    let value = serde_json::json!({
        "name": "someone", "region": "us", "zone": "east-9", "version": "9.9.9",
        "lastHeartbeatTime": Time(Timestamp::now()),
        "config": {"server": {"region": "us", "zone": "east-9"}},
    });
    bed.etcd.put(&liar.key(), &value.to_string()).await;
    until(&client, &ns, limit, "the liar's mirror", |all| {
        all.get("eu.1a.liar").is_some_and(is_worker)
    })
    .await;
    let lied = api.get("eu.1a.liar").await.unwrap();
    assert_eq!(
        (lied.spec.region.as_deref(), lied.spec.zone.as_deref()),
        (Some("eu"), Some("1a"))
    );
    assert_eq!(lied.labels()[labels::REGION], "eu");
    let server = lied.status.unwrap().config.unwrap().server.unwrap();
    assert_eq!(
        (server.region.as_deref(), server.zone.as_deref()),
        (Some("eu"), Some("1a"))
    );
    assert!(
        hub.metric("kontinuum_registry_mirror_events_total{event=\"mismatch\"}")
            .await
            >= 1
    );
    // Deleting the key removes the mirror within 2 s.
    bed.etcd
        .kv()
        .delete_range(kontinuum_proto::etcd::etcdserverpb::DeleteRangeRequest {
            key: liar.key().into_bytes(),
            ..Default::default()
        })
        .await
        .unwrap();
    let gone = until(&client, &ns, limit, "the liar's mirror gone", |all| {
        !all.contains_key("eu.1a.liar")
    })
    .await;
    eprintln!("key deleted -> mirror deleted in {gone:?}");
    assert!(gone <= Duration::from_secs(2), "{gone:?}");

    // --- kill -9: the entry stays while the lease lives, and goes when it expires ---
    agent.kill9().await;
    let killed = Instant::now();
    // The last keep-alive was at most 1 s before the kill: the lease has 2 s or more left.
    while killed.elapsed() < Duration::from_millis(1800) {
        assert!(
            api.get_opt("eu.1a.agent-a").await.unwrap().is_some(),
            "removed {:?} after kill -9, before the lease's TTL",
            killed.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        bed.etcd.get(&key.key()).await.is_some(),
        "the key outlived no lease"
    );
    let removed = until(
        &client,
        &ns,
        limit,
        "the killed agent's entry gone",
        |all| !all.contains_key("eu.1a.agent-a"),
    )
    .await
        + Duration::from_millis(1800);
    eprintln!("kill -9 -> entry removed after {removed:?} (lease TTL 3 s)");
    assert!(removed <= Duration::from_secs(6), "{removed:?}");
    assert_eq!(bed.etcd.get(&key.key()).await, None);

    // --- graceful stop: removed within 2 s ---
    let mut agent = spawn_agent(&bed, &zone, "agent-a", &store, http);
    until(&client, &ns, limit, "the agent's entry again", |all| {
        all.get("eu.1a.agent-a").is_some_and(ready)
    })
    .await;
    let (_, body) = get(http, "/status", None).await.unwrap();
    let lease_id: i64 = serde_json::from_str::<serde_json::Value>(&body).unwrap()["leaseId"]
        .as_i64()
        .unwrap();
    agent.sigterm();
    let stopped = Instant::now();
    let removed = until(
        &client,
        &ns,
        limit,
        "the stopped agent's entry gone",
        |all| !all.contains_key("eu.1a.agent-a"),
    )
    .await;
    eprintln!("SIGTERM -> entry removed in {removed:?}");
    assert!(removed <= Duration::from_secs(2), "{removed:?}");
    let status = agent.exited(Duration::from_secs(10)).await;
    assert!(status.success(), "agent exited with {status}");
    eprintln!("agent exited {:?} after SIGTERM", stopped.elapsed());
    assert_eq!(bed.etcd.get(&key.key()).await, None);
    assert!(
        bed.etcd.lease_ttl(lease_id).await <= 0,
        "the lease was not revoked"
    );

    // --- the hub's own entry comes back within 2 s when deleted ---
    let before = api.get("hub").await.unwrap();
    api.delete("hub", &DeleteParams::default()).await.unwrap();
    let back = until(&client, &ns, limit, "the hub's entry re-created", |all| {
        all.get("hub")
            .is_some_and(|k| k.uid() != before.uid() && k.status.is_some())
    })
    .await;
    eprintln!("hub entry deleted -> re-created in {back:?}");
    assert!(back <= Duration::from_secs(2), "{back:?}");

    // --- a restart converges: an entry whose key went while the hub was down goes ---
    let http_b = SocketAddr::new(LOCALHOST, free_port());
    let mut agent_b = spawn_agent(&bed, &zone, "agent-b", &store, http_b);
    until(&client, &ns, limit, "agent-b's entry", |all| {
        all.get("eu.1a.agent-b").is_some_and(ready)
    })
    .await;
    hub.sigterm();
    let hub_stopped = Instant::now();
    let status = hub.exited(Duration::from_secs(10)).await;
    assert!(
        status.success(),
        "hub exited with {status}:\n{}",
        hub.log_tail()
    );
    eprintln!("hub exited {:?} after SIGTERM", hub_stopped.elapsed());
    let all = support::kontinuums(&client, &ns).await;
    assert!(
        !all.contains_key("hub"),
        "the hub's entry outlived its shutdown"
    );
    assert!(all.contains_key("eu.1a.agent-b"));
    agent_b.sigterm();
    assert!(agent_b.exited(Duration::from_secs(10)).await.success());
    assert_eq!(
        bed.etcd
            .get("/kontinuum.sh/zones/eu/1a/registry/agent-b")
            .await,
        None
    );
    assert!(
        api.get_opt("eu.1a.agent-b").await.unwrap().is_some(),
        "nothing removes it while the hub is down"
    );
    let mut hub = spawn_hub(&bed, &["--heartbeat-seconds=60"]);
    hub.wait_healthy().await;
    let converged = until(&client, &ns, limit, "a restarted hub to converge", |all| {
        !all.contains_key("eu.1a.agent-b") && all.get("hub").is_some_and(ready)
    })
    .await;
    eprintln!("restarted hub converged in {converged:?}");

    // --- steady state: nothing is written when nothing changed ---
    let writes = || async {
        let text = hub.metrics().await;
        support::metric(&text, "kontinuum_registry_writes_total{write=\"status\"}")
            + support::metric(&text, "kontinuum_registry_writes_total{write=\"apply\"}")
    };
    // Settled first (a write's count lands a moment after its effect is visible)...
    let settling = Instant::now();
    let mut before = writes().await;
    loop {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let now = writes().await;
        if now == before {
            break;
        }
        before = now;
        assert!(settling.elapsed() < limit, "the hub keeps writing");
    }
    // ...and then, observing an absence needs an interval: three seconds without a write.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(writes().await, before, "writes without a change");
    assert_eq!(hub.metric("kontinuum_registry_registrations ").await, 0);
    hub.sigterm();
    assert!(hub.exited(Duration::from_secs(10)).await.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_entries_turn_stale_then_are_swept() {
    let bed = Bed::new("reg-ttl").await;
    install_kontinuum_crd(&bed.client).await;
    let client = bed.client.clone();
    let ns = bed.namespace.clone();
    let api: Api<Kontinuum> = Api::namespaced(client.clone(), &ns);
    let limit = Duration::from_secs(30);
    let mut hub = spawn_hub(&bed, &["--heartbeat-seconds=1", "--ttl-seconds=6"]);
    hub.wait_healthy().await;
    until(&client, &ns, limit, "the hub's entry", |all| {
        all.get("hub").is_some_and(ready)
    })
    .await;

    // Someone else's entry, heartbeating once.
    let foreign = Kontinuum::new(
        "old-agent",
        KontinuumSpec {
            region: Some("us".into()),
            zone: Some("2b".into()),
        },
    );
    api.create(&PostParams::default(), &foreign).await.unwrap();
    let beat = Timestamp::now();
    let status = serde_json::json!({
        "apiVersion": "kontinuum.sh/v1alpha2", "kind": "Kontinuum",
        "status": KontinuumStatus {
            last_heartbeat_time: Some(Time(registry::record::whole_seconds(beat))),
            ..KontinuumStatus::default()
        },
    });
    api.patch_status(
        "old-agent",
        &PatchParams::apply("test").force(),
        &Patch::Apply(&status),
    )
    .await
    .unwrap();
    until(
        &client,
        &ns,
        limit,
        "the foreign entry Heartbeating",
        |all| {
            all.get("old-agent").is_some_and(|k| {
                condition(k, "Heartbeating") == Some(("True", "HeartbeatReceived"))
            })
        },
    )
    .await;
    until(&client, &ns, limit, "the foreign entry stale", |all| {
        all.get("old-agent").is_some_and(|k| {
            condition(k, "Heartbeating") == Some(("False", "HeartbeatStale"))
                && condition(k, "Ready") == Some(("False", "HeartbeatStale"))
        })
    })
    .await;
    let stale_after =
        Timestamp::now().as_second() - registry::record::whole_seconds(beat).as_second();
    assert!(stale_after >= 3, "stale after {stale_after}s, before ttl/2");
    until(&client, &ns, limit, "the foreign entry swept", |all| {
        !all.contains_key("old-agent")
    })
    .await;
    let swept_after =
        Timestamp::now().as_second() - registry::record::whole_seconds(beat).as_second();
    eprintln!("foreign entry: stale after {stale_after}s, swept after {swept_after}s (ttl 6 s)");
    assert!((6..=9).contains(&swept_after), "swept after {swept_after}s");
    support::wait_for("the sweep counted", Duration::from_secs(5), || async {
        (hub.metric("kontinuum_registry_sweeps_total ").await >= 1).then_some(())
    })
    .await;

    // A registration that stops heartbeating: mirrored, stale, then swept with its key.
    let quiet = RegistrationKey::new("us", "2b", "quiet").unwrap();
    let now = Time(Timestamp::now());
    let value = serde_json::json!({"name": "quiet", "region": "us", "zone": "2b",
                                   "version": "0.0.1", "lastHeartbeatTime": now});
    bed.etcd.put(&quiet.key(), &value.to_string()).await;
    until(
        &client,
        &ns,
        limit,
        "the quiet registration mirrored",
        |all| all.get("us.2b.quiet").is_some_and(ready),
    )
    .await;
    until(&client, &ns, limit, "the quiet registration swept", |all| {
        !all.contains_key("us.2b.quiet")
    })
    .await;
    let swept_after = Timestamp::now().as_second() - now.0.as_second();
    assert!((6..=9).contains(&swept_after), "swept after {swept_after}s");
    support::wait_for("the quiet key deleted", Duration::from_secs(5), || async {
        bed.etcd.get(&quiet.key()).await.is_none().then_some(())
    })
    .await;

    // A registration already stale when first seen is never mirrored; its key goes.
    let ghost = RegistrationKey::new("us", "2b", "ghost").unwrap();
    let old = Time(Timestamp::from_second(Timestamp::now().as_second() - 60).unwrap());
    let value = serde_json::json!({"lastHeartbeatTime": old});
    bed.etcd.put(&ghost.key(), &value.to_string()).await;
    let start = Instant::now();
    loop {
        assert!(
            api.get_opt("us.2b.ghost").await.unwrap().is_none(),
            "a stale key was mirrored"
        );
        if bed.etcd.get(&ghost.key()).await.is_none() {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the stale key was not swept"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!("stale key swept in {:?}", start.elapsed());
    // Counted once the hub has the store's answer, a moment after the key is gone.
    support::wait_for(
        "both stale keys counted",
        Duration::from_secs(5),
        || async {
            (hub.metric("kontinuum_registry_writes_total{write=\"delete_key\"}")
                .await
                >= 2)
                .then_some(())
        },
    )
    .await;

    // The hub's own entry never expires while it heartbeats.
    let own = api.get("hub").await.unwrap();
    assert!(ready(&own));
    hub.sigterm();
    assert!(hub.exited(Duration::from_secs(10)).await.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_leader_writes_and_a_standby_takes_over() {
    let bed = Bed::new("reg-ha").await;
    install_kontinuum_crd(&bed.client).await;
    let client = bed.client.clone();
    let ns = bed.namespace.clone();
    let limit = Duration::from_secs(60);
    let replica = |identity: &str| {
        Registry::spawn(
            identity,
            &hub_args(
                &bed,
                &[
                    "--leader-elect",
                    "--lease-duration-seconds=3",
                    "--heartbeat-seconds=1",
                ],
            ),
            &[("POD_NAME", identity), ("POD_NAMESPACE", ns.as_str())],
            &bed.dir,
        )
    };
    let mut first = replica("hub-a");
    first.wait_healthy().await;
    until(&client, &ns, limit, "the hub's entry", |all| {
        all.get("hub").is_some_and(ready)
    })
    .await;
    let mut second = replica("hub-b");
    second.wait_healthy().await;
    // A few heartbeats later, the standby has written nothing.
    let leader_beats = support::wait_for("three leader heartbeats", limit, || async {
        let beats = first.metric("kontinuum_registry_heartbeats_total ").await;
        (beats >= 3).then_some(beats)
    })
    .await;
    let standby = second.metrics().await;
    for write in ["apply", "status", "delete", "delete_key"] {
        let line = format!("kontinuum_registry_writes_total{{write=\"{write}\"}}");
        assert_eq!(
            support::metric(&standby, &line),
            0,
            "the standby wrote ({write})"
        );
    }
    assert_eq!(
        support::metric(&standby, "kontinuum_registry_heartbeats_total "),
        0
    );
    eprintln!("leader heartbeats {leader_beats}, standby writes 0");

    // The leader stops: its entry goes, the standby takes the lease and brings it back.
    first.sigterm();
    assert!(first.exited(Duration::from_secs(10)).await.success());
    let stopped = Instant::now();
    until(&client, &ns, limit, "the standby's heartbeat", |all| {
        all.get("hub").is_some_and(ready)
    })
    .await;
    support::wait_for("the standby to heartbeat", limit, || async {
        (second.metric("kontinuum_registry_heartbeats_total ").await >= 1).then_some(())
    })
    .await;
    eprintln!(
        "leader stopped -> standby heartbeating in {:?}",
        stopped.elapsed()
    );
    second.sigterm();
    assert!(second.exited(Duration::from_secs(10)).await.success());
}
