//! Issue 11, acceptance 1, 2 and 3, on real parts: the test bed's etcd as the store, its
//! `etcdctl` as the zone's client, its API server for the identity Secrets, and the built
//! `etcd-proxy` binary as `serve` and `relay` processes.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::too_many_lines,
    clippy::items_after_statements
)]

mod support;

use std::time::{Duration, Instant};

use kontinuum_proto::etcd::etcdserverpb as pb;
use serde_json::json;
use support::{Background, Bed, Zone, etcdctl, free_port, wait_for};
use tonic::Code;

/// `lease 694d81abc granted with TTL(60s)` → the id, in hex as etcdctl takes it.
fn granted_lease(out: &str) -> String {
    out.split_whitespace()
        .nth(1)
        .unwrap_or_else(|| panic!("no lease in {out:?}"))
        .to_string()
}

fn lease_id(hex: &str) -> i64 {
    i64::from_str_radix(hex, 16).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acceptance_1_etcdctl_through_relay_and_proxy_is_confined_to_the_zone() {
    let mut bed = Bed::new("accept1").await;
    let zone = Zone::new(&bed.dir, "eu", "1a");
    let sibling = Zone::new(&bed.dir, "eu", "1ab");
    bed.admit(&zone).await;
    bed.admit(&sibling).await;
    bed.start_proxy().await;
    let socket = bed.dir.join("relay.sock");
    let relay_ep = format!("unix://{}", socket.display());
    let _relay = bed.start_relay(&zone, &relay_ep).await;
    let sibling_ep = format!("127.0.0.1:{}", free_port());
    let _sibling_relay = bed.start_relay(&sibling, &sibling_ep).await;
    let p = zone.prefix();
    let ep = relay_ep.as_str();

    // --- inside the prefix, everything works ---
    let put = etcdctl(ep, &["put", &format!("{p}a"), "1"], None).await;
    assert!(put.ok && put.stdout.trim() == "OK", "{put:?}");
    assert_eq!(bed.etcd.get(&format!("{p}a")).await.as_deref(), Some("1"));
    let get = etcdctl(ep, &["get", "--prefix", &p], None).await;
    assert!(
        get.ok && get.stdout.contains(&format!("{p}a\n1")),
        "{get:?}"
    );

    let txn = etcdctl(
        ep,
        &["txn"],
        Some(&format!(
            "value(\"{p}a\") = \"1\"\n\nput {p}b 2\n\nput {p}c 3\n\n"
        )),
    )
    .await;
    assert!(txn.ok && txn.stdout.starts_with("SUCCESS"), "{txn:?}");
    assert_eq!(bed.etcd.get(&format!("{p}b")).await.as_deref(), Some("2"));

    let mut watch = Background::start(ep, &["watch", "--prefix", &p]);
    // The watch is live once a put through the relay shows up in it.
    wait_for("the watch to see a put", Duration::from_secs(20), || {
        let ep = ep.to_string();
        let key = format!("{p}w");
        let seen = watch.put_keys().contains(&key);
        async move {
            if seen {
                return Some(());
            }
            etcdctl(&ep, &["put", &key, "x"], None).await;
            None
        }
    })
    .await;

    let grant = etcdctl(ep, &["lease", "grant", "60"], None).await;
    assert!(grant.ok, "{grant:?}");
    let lease = granted_lease(&grant.stdout);
    let put = etcdctl(
        ep,
        &["put", &format!("--lease={lease}"), &format!("{p}l"), "v"],
        None,
    )
    .await;
    assert!(put.ok, "{put:?}");
    let ttl = etcdctl(ep, &["lease", "timetolive", "--keys", &lease], None).await;
    assert!(ttl.ok && ttl.stdout.contains(&format!("{p}l")), "{ttl:?}");
    assert!(
        !ttl.stdout.contains("/kontinuum.sh/proxy/"),
        "owner record leaked: {ttl:?}"
    );
    let list = etcdctl(ep, &["lease", "list"], None).await;
    assert!(list.ok && list.stdout.contains(&lease), "{list:?}");
    let once = etcdctl(ep, &["lease", "keep-alive", "--once", &lease], None).await;
    assert!(once.ok && once.stdout.contains("keepalived"), "{once:?}");

    let del = etcdctl(ep, &["del", &format!("{p}a")], None).await;
    assert!(del.ok && del.stdout.trim() == "1", "{del:?}");
    assert_eq!(bed.etcd.get(&format!("{p}a")).await, None);

    // The sibling zone's lease, granted through its own relay.
    let foreign = etcdctl(&sibling_ep, &["lease", "grant", "60"], None).await;
    assert!(foreign.ok, "{foreign:?}");
    let foreign = granted_lease(&foreign.stdout);
    let sp = sibling.prefix();
    assert!(
        etcdctl(&sibling_ep, &["put", &format!("{sp}x"), "theirs"], None)
            .await
            .ok
    );

    // --- outside the prefix, everything is refused and the store does not move ---
    let before = bed.etcd.snapshot().await;
    let outside_txn_compare = format!("value(\"{sp}x\") = \"theirs\"\n\nput {p}t 1\n\n\n");
    let outside_txn_op = format!("value(\"{p}b\") = \"2\"\n\nput {p}t 1\n\nput {sp}x mine\n\n");
    let refused: Vec<(&str, Vec<String>, Option<String>)> = vec![
        (
            "sibling zone put",
            vec!["put".into(), format!("{sp}x"), "mine".into()],
            None,
        ),
        (
            "sibling zone get",
            vec!["get".into(), format!("{sp}x")],
            None,
        ),
        (
            "prefix without slash",
            vec![
                "get".into(),
                "--prefix".into(),
                p.trim_end_matches('/').into(),
            ],
            None,
        ),
        (
            "range leaving the prefix",
            vec![
                "get".into(),
                format!("{p}a"),
                "/kontinuum.sh/zones/eu/1b".into(),
            ],
            None,
        ),
        (
            "from key",
            vec!["get".into(), "--from-key".into(), format!("{p}a")],
            None,
        ),
        (
            "delete leaving the prefix",
            vec![
                "del".into(),
                format!("{p}b"),
                "/kontinuum.sh/zones/eu/2".into(),
            ],
            None,
        ),
        (
            "whole store get",
            vec!["get".into(), "--prefix".into(), String::new()],
            None,
        ),
        (
            "foreign lease revoke",
            vec!["lease".into(), "revoke".into(), foreign.clone()],
            None,
        ),
        (
            "foreign lease keep-alive",
            vec![
                "lease".into(),
                "keep-alive".into(),
                "--once".into(),
                foreign.clone(),
            ],
            None,
        ),
        (
            "foreign lease ttl",
            vec!["lease".into(), "timetolive".into(), foreign.clone()],
            None,
        ),
        (
            "foreign lease attach",
            vec![
                "put".into(),
                format!("--lease={foreign}"),
                format!("{p}stolen"),
                "v".into(),
            ],
            None,
        ),
        (
            "txn with a foreign compare",
            vec!["txn".into()],
            Some(outside_txn_compare),
        ),
        (
            "txn with a foreign op",
            vec!["txn".into()],
            Some(outside_txn_op),
        ),
        ("compaction", vec!["compaction".into(), "1".into()], None),
    ];
    for (name, args, stdin) in &refused {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = etcdctl(ep, &args, stdin.as_deref()).await;
        assert!(
            out.denied(),
            "{name}: expected PermissionDenied, got {out:?}"
        );
    }
    for (name, args) in [
        ("whole-store watch", vec!["watch", "--prefix", ""]),
        (
            "watch of the prefix without its slash",
            vec!["watch", "--prefix", "/kontinuum.sh/zones/eu/1a"],
        ),
        (
            "sibling watch",
            vec!["watch", "--prefix", "/kontinuum.sh/zones/eu/1ab/"],
        ),
    ] {
        let mut w = Background::start(ep, &args);
        let status = wait_for(name, Duration::from_secs(20), || {
            let s = w.exited();
            async move { s }
        })
        .await;
        assert!(
            !status.success() && w.stderr().contains("PermissionDenied"),
            "{name}: {}",
            w.stderr()
        );
    }
    let list = etcdctl(ep, &["lease", "list"], None).await;
    assert!(list.ok && !list.stdout.contains(&foreign), "{list:?}");
    let after = bed.etcd.snapshot().await;
    assert_eq!(before, after, "the store changed");
    assert!(
        bed.etcd.lease_ttl(lease_id(&foreign)).await > 0,
        "the foreign lease was revoked"
    );

    // The zone's own watch was not disturbed by any of it.
    assert!(watch.exited().is_none(), "{}", watch.stderr());
    let metrics = bed.proxy_metrics().await;
    for want in [
        "kontinuum_etcd_proxy_authz_failures_total{reason=\"OutsidePrefix\"}",
        "kontinuum_etcd_proxy_authz_failures_total{reason=\"ForeignLease\"}",
        "kontinuum_etcd_proxy_authz_failures_total{reason=\"Compact\"} 1",
        "kontinuum_etcd_proxy_authz_failures_total{reason=\"WatchOutsidePrefix\"} 3",
        "kontinuum_etcd_proxy_requests_total{method=\"Put\",code=\"OK\"}",
    ] {
        assert!(metrics.contains(want), "{want} not in\n{metrics}");
    }
    // Refused streams are closed, the zone's own watch is still open.
    wait_for("refused watches to close", Duration::from_secs(10), || {
        let bed = &bed;
        async move {
            bed.proxy_metrics()
                .await
                .contains("kontinuum_etcd_proxy_streams_in_flight{method=\"Watch\"} 1")
                .then_some(())
        }
    })
    .await;
}

fn range_request(key: &str, token: Option<&str>) -> tonic::Request<pb::RangeRequest> {
    let mut req = tonic::Request::new(pb::RangeRequest {
        key: key.as_bytes().to_vec(),
        ..Default::default()
    });
    if let Some(token) = token {
        req.metadata_mut()
            .insert("authorization", format!("Bearer {token}").parse().unwrap());
    }
    req
}

fn b64(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

fn hs256(signing_input: &str, key: &[u8]) -> String {
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, key);
    let tag = ring::hmac::sign(&key, signing_input.as_bytes());
    format!("{signing_input}.{}", b64(tag.as_ref()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acceptance_2_bad_tokens_are_unauthenticated_and_revocation_takes_under_a_second() {
    let mut bed = Bed::new("accept2").await;
    let zone = Zone::new(&bed.dir, "eu", "2a");
    let impostor = Zone::new(&bed.dir.join("impostor"), "eu", "2a");
    let stranger = Zone::new(&bed.dir, "eu", "9z");
    bed.admit(&zone).await;
    bed.start_proxy().await;
    let channel = bed.proxy_channel();
    let kv = || pb::kv_client::KvClient::new(channel.clone());
    let key = format!("{}k", zone.prefix());
    let signer = zone.signer();
    let now = etcd_proxy::token::unix_now();

    let good = signer.sign(now, 300);
    kv().range(range_request(&key, Some(&good))).await.unwrap();

    let header = json!({"alg": "EdDSA", "typ": "JWT"});
    let claims = |edit: &dyn Fn(&mut serde_json::Value)| {
        let mut c = json!({"iss": zone.name, "sub": zone.name, "aud": ["kontinuum-etcd-proxy"],
                           "iat": now, "nbf": now, "exp": now + 300});
        edit(&mut c);
        c
    };
    let unsigned = |h: serde_json::Value, c: serde_json::Value| {
        format!(
            "{}.{}",
            b64(h.to_string().as_bytes()),
            b64(c.to_string().as_bytes())
        )
    };
    let public_raw = signer.public_key();
    let flipped = {
        let (input, sig) = good.rsplit_once('.').unwrap();
        use base64::Engine as _;
        let mut sig = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(sig)
            .unwrap();
        sig[17] ^= 0x04;
        format!("{input}.{}", b64(&sig))
    };
    let table: Vec<(&str, Option<String>)> = vec![
        ("none", None),
        ("garbage", Some("garbage".into())),
        ("expired", Some(signer.sign(now - 1000, 300))),
        ("not yet valid", Some(signer.sign(now + 120, 300))),
        ("over-long lifetime", Some(signer.sign(now, 3600))),
        (
            "no exp",
            Some(signer.sign_raw(
                &header,
                &claims(&|c| {
                    c.as_object_mut().unwrap().remove("exp");
                }),
            )),
        ),
        ("wrong key", Some(impostor.signer().sign(now, 300))),
        (
            "alg none",
            Some(format!(
                "{}.",
                unsigned(json!({"alg": "none"}), claims(&|_| {}))
            )),
        ),
        (
            "HS256 keyed with the raw public key",
            Some(hs256(
                &unsigned(json!({"alg": "HS256"}), claims(&|_| {})),
                &public_raw,
            )),
        ),
        (
            "HS256 keyed with the certificate PEM",
            Some(hs256(
                &unsigned(json!({"alg": "HS256"}), claims(&|_| {})),
                zone.cert_pem.as_bytes(),
            )),
        ),
        (
            "wrong audience",
            Some(signer.sign_raw(&header, &claims(&|c| c["aud"] = json!(["kubernetes"])))),
        ),
        (
            "missing audience",
            Some(signer.sign_raw(
                &header,
                &claims(&|c| {
                    c.as_object_mut().unwrap().remove("aud");
                }),
            )),
        ),
        (
            "iss != sub",
            Some(signer.sign_raw(&header, &claims(&|c| c["iss"] = json!("eu-9z")))),
        ),
        ("unknown zone", Some(stranger.signer().sign(now, 300))),
        ("flipped signature bit", Some(flipped)),
    ];
    for (name, token) in &table {
        let err = kv()
            .range(range_request(&key, token.as_deref()))
            .await
            .expect_err(name);
        assert_eq!(err.code(), Code::Unauthenticated, "{name}: {err:?}");
        assert!(
            err.message().len() < 80,
            "{name}: message too long: {}",
            err.message()
        );
        assert!(
            !err.message().contains(&b64(&public_raw)),
            "{name}: key leaked"
        );
    }
    // Streams authenticate too.
    let mut watch = pb::watch_client::WatchClient::new(channel.clone());
    let mut req = tonic::Request::new(tokio_stream::iter(Vec::<pb::WatchRequest>::new()));
    req.metadata_mut()
        .insert("authorization", "Bearer garbage".parse().unwrap());
    let err = watch.watch(req).await.expect_err("watch with a bad token");
    assert_eq!(err.code(), Code::Unauthenticated);

    // A stream opened before the revocation is ended by it.
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tx.send(pb::WatchRequest {
        request_union: Some(pb::watch_request::RequestUnion::CreateRequest(
            pb::WatchCreateRequest {
                key: zone.prefix().into_bytes(),
                range_end: format!("{}0", zone.prefix().trim_end_matches('/')).into_bytes(),
                ..Default::default()
            },
        )),
    })
    .unwrap();
    let mut req = tonic::Request::new(tokio_stream::wrappers::UnboundedReceiverStream::new(rx));
    req.metadata_mut().insert(
        "authorization",
        format!("Bearer {}", signer.sign(etcd_proxy::token::unix_now(), 300))
            .parse()
            .unwrap(),
    );
    let mut open = watch.watch(req).await.unwrap().into_inner();
    let created = open.message().await.unwrap().unwrap();
    assert!(created.created);

    // A token the proxy has verified (and keeps in its cache) before the revocation.
    let cached = signer.sign(etcd_proxy::token::unix_now(), 300);
    for _ in 0..2 {
        kv().range(range_request(&key, Some(&cached)))
            .await
            .unwrap();
    }

    // Revocation: the next call is refused within a second of the Secret's deletion...
    bed.revoke(&zone).await;
    let deleted = Instant::now();
    loop {
        let token = signer.sign(etcd_proxy::token::unix_now(), 300);
        match kv().range(range_request(&key, Some(&token))).await {
            Err(e) if e.code() == Code::Unauthenticated => break,
            other => assert!(
                deleted.elapsed() < Duration::from_secs(1),
                "still admitted {:?} after deletion: {other:?}",
                deleted.elapsed()
            ),
        }
    }
    let revoked_in = deleted.elapsed();
    // ... the cached token too: the cache checks the zone's keys again on every call.
    let refused = kv()
        .range(range_request(&key, Some(&cached)))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::Unauthenticated, "{refused:?}");
    let ended = tokio::time::timeout(Duration::from_secs(5), open.message())
        .await
        .expect("the open watch was not ended");
    assert_eq!(ended.unwrap_err().code(), Code::Unauthenticated);

    // ... and re-creating it admits the zone again within a second.
    bed.admit(&zone).await;
    let created = Instant::now();
    loop {
        let token = signer.sign(etcd_proxy::token::unix_now(), 300);
        match kv().range(range_request(&key, Some(&token))).await {
            Ok(_) => break,
            Err(e) => assert!(
                created.elapsed() < Duration::from_secs(1),
                "still refused {:?} after re-creation: {e:?}",
                created.elapsed()
            ),
        }
    }
    eprintln!(
        "revoked in {revoked_in:?}, re-admitted in {:?}",
        created.elapsed()
    );

    let metrics = bed.proxy_metrics().await;
    for reason in [
        "MissingToken",
        "Malformed",
        "Expired",
        "NotYetValid",
        "LifetimeTooLong",
        "MissingExpiry",
        "BadSignature",
        "Algorithm",
        "Audience",
        "IssuerMismatch",
        "UnknownZone",
    ] {
        let want = format!("kontinuum_etcd_proxy_authn_failures_total{{reason=\"{reason}\"}}");
        assert!(metrics.contains(&want), "{want} not in\n{metrics}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acceptance_3_relay_clients_survive_a_proxy_killed_mid_watch_and_mid_keepalive() {
    let mut bed = Bed::new("accept3").await;
    let zone = Zone::new(&bed.dir, "eu", "3a");
    bed.admit(&zone).await;
    bed.start_proxy().await;
    let ep = format!("127.0.0.1:{}", free_port());
    let relay = bed.start_relay(&zone, &ep).await;
    let p = zone.prefix();

    let mut watch = Background::start(&ep, &["watch", "--prefix", &p]);
    wait_for("the watch to see k0", Duration::from_secs(20), || {
        let ep = ep.clone();
        let key = format!("{p}k0");
        let seen = watch.put_keys().contains(&key);
        async move {
            if seen {
                return Some(());
            }
            etcdctl(&ep, &["put", &key, "v"], None).await;
            None
        }
    })
    .await;
    const TTL: i64 = 10;
    let grant = etcdctl(&ep, &["lease", "grant", &TTL.to_string()], None).await;
    assert!(grant.ok, "{grant:?}");
    let lease = granted_lease(&grant.stdout);
    let mut keepalive = Background::start(&ep, &["lease", "keep-alive", &lease]);
    wait_for("a keep-alive", Duration::from_secs(20), || {
        let n = keepalive.lines().len();
        async move { (n >= 1).then_some(()) }
    })
    .await;
    assert!(
        etcdctl(&ep, &["put", &format!("{p}k1"), "v"], None)
            .await
            .ok
    );
    wait_for("the watch to see k1", Duration::from_secs(20), || {
        let seen = watch.put_keys().contains(&format!("{p}k1"));
        async move { seen.then_some(()) }
    })
    .await;

    // kill -9 mid-watch and mid-keepalive; the store moves on while the proxy is down.
    bed.kill_proxy().await;
    let killed = Instant::now();
    bed.etcd.put(&format!("{p}k2"), "while down").await;
    bed.etcd.put(&format!("{p}k3"), "while down").await;
    let keepalives_before = keepalive.lines().len();
    bed.start_proxy().await;
    let restarted_in = killed.elapsed();
    assert!(
        etcdctl(&ep, &["put", &format!("{p}k4"), "v"], None)
            .await
            .ok
    );

    let want: Vec<String> = ["k0", "k1", "k2", "k3", "k4"]
        .iter()
        .map(|k| format!("{p}{k}"))
        .collect();
    wait_for("the watch to resume", Duration::from_secs(30), || {
        // k0 may repeat (it was put until the watch saw it); nothing after it may.
        let mut seen = watch.put_keys();
        seen.dedup();
        let done = seen == want;
        async move { done.then_some(()) }
    })
    .await;
    let keys = watch.put_keys();
    let after_k0: Vec<&String> = keys.iter().skip_while(|k| k.ends_with("k0")).collect();
    assert_eq!(
        after_k0,
        want[1..].iter().collect::<Vec<_>>(),
        "lost or repeated events"
    );
    assert!(
        watch.exited().is_none(),
        "the watch ended: {}",
        watch.stderr()
    );

    // The lease keeps its owner: the restarted proxy lets the zone keep it alive, past a
    // whole TTL since the kill.
    wait_for(
        "keep-alives through the restarted proxy",
        Duration::from_secs(30),
        || {
            let n = keepalive.lines().len();
            async move { (n > keepalives_before).then_some(()) }
        },
    )
    .await;
    let past_ttl = Duration::from_secs(u64::try_from(TTL).unwrap() + 2);
    if let Some(rest) = past_ttl.checked_sub(killed.elapsed()) {
        // Waiting for time itself here: the claim is "still alive after a TTL".
        tokio::time::sleep(rest).await;
    }
    assert!(
        bed.etcd.lease_ttl(lease_id(&lease)).await > 0,
        "the lease expired"
    );
    assert!(
        keepalive.exited().is_none(),
        "keep-alive ended: {}",
        keepalive.stderr()
    );
    let ttl = etcdctl(&ep, &["lease", "timetolive", &lease], None).await;
    assert!(ttl.ok && ttl.stdout.contains("remaining"), "{ttl:?}");
    // The relay's clients never saw a broken stream: the relay re-opened its hub streams
    // itself (a client that had seen an error would have opened a new stream, and the
    // finished one would be counted).
    let text = support::metrics(relay.admin).await;
    for want in [
        "kontinuum_etcd_proxy_relay_stream_reconnects_total{method=\"Watch\"} 1",
        "kontinuum_etcd_proxy_relay_stream_reconnects_total{method=\"LeaseKeepAlive\"} 1",
        "kontinuum_etcd_proxy_relay_streams_in_flight{method=\"Watch\"} 1",
        "kontinuum_etcd_proxy_relay_streams_in_flight{method=\"LeaseKeepAlive\"} 1",
    ] {
        assert!(text.contains(want), "{want} not in\n{text}");
    }
    assert!(
        !text.contains("relay_requests_total{method=\"Watch\""),
        "{text}"
    );
    eprintln!("proxy back {restarted_in:?} after kill -9");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_serving_certificate_is_reloaded_when_its_files_change() {
    let mut bed = Bed::new("reload").await;
    let zone = Zone::new(&bed.dir, "eu", "4a");
    bed.admit(&zone).await;
    bed.start_proxy().await;
    let key = format!("{}k", zone.prefix());
    let call = |bed: &Bed| {
        let channel = bed.proxy_channel();
        let token = zone.signer().sign(etcd_proxy::token::unix_now(), 300);
        let key = key.clone();
        async move {
            pb::kv_client::KvClient::new(channel)
                .range(range_request(&key, Some(&token)))
                .await
        }
    };
    call(&bed).await.unwrap();

    // A new CA and serving pair, swapped in the way a Secret volume update does.
    let ca = kontinuum_testbed::CertificateAuthority::generate("second-ca").unwrap();
    let pair = ca.server("etcd-proxy", &[support::LOCALHOST], &[]).unwrap();
    std::fs::write(bed.dir.join("new.crt"), &pair.cert_pem).unwrap();
    std::fs::write(bed.dir.join("new.key"), &pair.key_pem).unwrap();
    std::fs::rename(bed.dir.join("new.key"), &bed.tls_key).unwrap();
    std::fs::rename(bed.dir.join("new.crt"), &bed.tls_cert).unwrap();
    let old_ca = bed.ca.clone();
    bed.ca = bed.dir.join("second-ca.crt");
    std::fs::write(&bed.ca, &ca.cert_pem).unwrap();
    wait_for("the new certificate", Duration::from_secs(10), || {
        let attempt = call(&bed);
        async move { attempt.await.ok() }
    })
    .await;
    // And the old CA no longer verifies it.
    bed.ca = old_ca;
    assert!(call(&bed).await.is_err());
}
