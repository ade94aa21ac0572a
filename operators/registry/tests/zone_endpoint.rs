//! The zone agent's start-up rules and its endpoint behind the auth mode, with the built
//! `registry` binary: no auth mode (or two, or a bad flag) refuses to start naming the
//! variables (reference section 7.3); in OIDC mode `/status` and `/version` need an admin's
//! bearer token signed by the issuer (a tiny in-test HTTPS issuer serving discovery and
//! JWKS), while the probes stay open. The store here is the test bed's etcd on loopback
//! (plain gRPC, as the relay would be).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::too_many_lines,
    clippy::print_stderr
)]

mod support;

use std::net::SocketAddr;
use std::process::Stdio;
use std::time::{Duration, Instant};

use kontinuum_auth::Algorithm;
use kontinuum_auth::testing::{TestIssuer, TestKey};
use support::{Etcd, LOCALHOST, Registry, free_port, get, registry_bin};

/// Runs `registry zone` with exactly `env` and returns its exit status and output.
async fn refused(env: &[(&str, &str)]) -> (std::process::ExitStatus, String) {
    let out = tokio::time::timeout(
        Duration::from_secs(20),
        tokio::process::Command::new(registry_bin())
            .args(["zone", "--region=eu", "--zone=1a", "--name=agent"])
            .arg(format!("--addr=127.0.0.1:{}", free_port()))
            .arg(format!("--admin-addr=127.0.0.1:{}", free_port()))
            .arg("--store=127.0.0.1:1")
            .env_clear()
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .output(),
    )
    .await
    .expect("registry zone hung instead of refusing")
    .unwrap();
    (
        out.status,
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

#[tokio::test]
async fn the_agent_refuses_to_start_without_exactly_one_auth_mode() {
    let cases: [(&[(&str, &str)], &str); 5] = [
        (
            &[],
            "neither KONTINUUM_OIDC_ISSUER_URL nor KONTINUUM_INSECURE_ALLOW_ANONYMOUS=true is set",
        ),
        (
            &[("KONTINUUM_INSECURE_ALLOW_ANONYMOUS", "false")],
            "neither KONTINUUM_OIDC_ISSUER_URL nor KONTINUUM_INSECURE_ALLOW_ANONYMOUS=true is set",
        ),
        (
            &[
                ("KONTINUUM_INSECURE_ALLOW_ANONYMOUS", "true"),
                ("KONTINUUM_OIDC_ISSUER_URL", "https://id.example.com"),
                ("KONTINUUM_OIDC_ADMIN_GROUPS", "admins"),
            ],
            "KONTINUUM_INSECURE_ALLOW_ANONYMOUS=true is incompatible with KONTINUUM_OIDC_ISSUER_URL being set",
        ),
        (
            &[("KONTINUUM_INSECURE_ALLOW_ANONYMOUS", "yes")],
            "KONTINUUM_INSECURE_ALLOW_ANONYMOUS must be a boolean",
        ),
        (
            &[("KONTINUUM_OIDC_ISSUER_URL", "https://id.example.com")],
            "KONTINUUM_OIDC_ADMIN_GROUPS",
        ),
    ];
    for (env, message) in cases {
        let (status, output) = refused(env).await;
        assert!(!status.success(), "{env:?} started:\n{output}");
        assert!(
            output.contains(message),
            "{env:?}: {message:?} not in\n{output}"
        );
    }
    // A bad region names its variable too.
    let out = tokio::process::Command::new(registry_bin())
        .args(["zone", "--zone=1a"])
        .env_clear()
        .env("KONTINUUM_SERVER_REGION", "Not_A_Label")
        .env("KONTINUUM_INSECURE_ALLOW_ANONYMOUS", "true")
        .output()
        .await
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("KONTINUUM_SERVER_REGION"), "{stderr}");
}

fn expired(claims: &serde_json::Value) -> serde_json::Value {
    let mut claims = claims.clone();
    let now = claims["iat"].as_i64().unwrap();
    claims["iat"] = (now - 900).into();
    claims["nbf"] = (now - 900).into();
    claims["exp"] = (now - 600).into();
    claims
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_zone_endpoint_is_behind_oidc() {
    kontinuum_testbed::install_crypto_provider();
    let dir = kontinuum_testbed::unique_dir("registry-zone-oidc");
    std::fs::create_dir_all(&dir).unwrap();
    let etcd = Etcd::start(&dir).await;
    let issuer = TestIssuer::start().await.unwrap();
    let key = TestKey::generate(Algorithm::Es256, "k1").unwrap();
    issuer.publish(&[&key]);
    let ca = dir.join("issuer-ca.crt");
    std::fs::write(&ca, issuer.ca_pem()).unwrap();

    let http = SocketAddr::new(LOCALHOST, free_port());
    let mut agent = Registry::spawn(
        "agent-oidc",
        &[
            "zone".into(),
            "--region=eu".into(),
            "--zone=1a".into(),
            "--name=oidc".into(),
            format!("--store={}", etcd.url),
            format!("--addr={http}"),
            format!("--oidc-ca={}", ca.display()),
            "--lease-ttl-seconds=5".into(),
            "--heartbeat-seconds=1".into(),
        ],
        &[
            ("KONTINUUM_OIDC_ISSUER_URL", issuer.url()),
            ("KONTINUUM_OIDC_CLIENT_ID", "kontinuum"),
            ("KONTINUUM_OIDC_ADMIN_GROUPS", "platform,admins"),
        ],
        &dir,
    );
    agent.wait_healthy().await;
    let start = Instant::now();
    while get(http, "/readyz", None).await.map(|(c, _)| c) != Some(200) {
        agent.assert_alive();
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "never registered:\n{}",
            agent.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(get(http, "/healthz", None).await.unwrap().0, 200);

    let admin = key.token(&issuer.claims("kontinuum", "alice", &["admins"]));
    let (code, body) = get(http, "/status", Some(&admin)).await.unwrap();
    assert_eq!(code, 200, "{body}");
    let status: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(status["registered"], true, "{status}");
    assert_eq!(status["name"], "oidc");
    assert!(status["leaseId"].as_i64().unwrap() > 0);
    assert_eq!(get(http, "/version", Some(&admin)).await.unwrap().0, 200);
    // The value in the store says how the zone authenticates (and nothing secret).
    let value: serde_json::Value = serde_json::from_str(
        &etcd
            .get("/kontinuum.sh/zones/eu/1a/registry/oidc")
            .await
            .unwrap(),
    )
    .unwrap();
    assert_eq!(value["config"]["oidc"]["issuerURL"], issuer.url());
    assert_eq!(
        value["config"]["oidc"]["adminGroups"],
        serde_json::json!(["platform", "admins"])
    );

    let other_key = TestKey::generate(Algorithm::Es256, "k1").unwrap();
    let refusals: Vec<(&str, Option<String>, u16)> = vec![
        ("no token", None, 401),
        ("garbage", Some("not.a.token".into()), 401),
        (
            "expired",
            Some(key.token(&expired(&issuer.claims("kontinuum", "alice", &["admins"])))),
            401,
        ),
        (
            "wrong audience",
            Some(key.token(&issuer.claims("another-client", "alice", &["admins"]))),
            401,
        ),
        (
            "signed by another key",
            Some(other_key.token(&issuer.claims("kontinuum", "alice", &["admins"]))),
            401,
        ),
        (
            "not an admin",
            Some(key.token(&issuer.claims("kontinuum", "bob", &["users"]))),
            403,
        ),
    ];
    for (what, token, expected) in &refusals {
        for path in ["/status", "/version"] {
            let (code, body) = get(http, path, token.as_deref()).await.unwrap();
            assert_eq!(code, *expected, "{what} on {path}: {body}");
            assert!(!body.contains("leaseId"), "{what} leaked the status");
        }
    }
    // Probes stay open.
    assert_eq!(get(http, "/readyz", Some("garbage")).await.unwrap().0, 200);

    agent.sigterm();
    assert!(agent.exited(Duration::from_secs(10)).await.success());
    assert_eq!(
        etcd.get("/kontinuum.sh/zones/eu/1a/registry/oidc").await,
        None
    );
}
