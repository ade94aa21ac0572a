//! [`OidcVerifier`] against a real HTTPS issuer in the test (`testing::TestIssuer`: TLS from
//! a test CA on 127.0.0.1, discovery + JWKS): tokens accepted and refused end to end, key
//! rotation, the refresh rate limit (counted at the issuer), single-flight fetching, stale
//! keys, TLS verification, and a hanging issuer.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use kontinuum_auth::oidc::DEFAULT_MIN_REFRESH_INTERVAL;
use kontinuum_auth::testing::{ManualClock, TestIssuer, TestKey};
use kontinuum_auth::{Algorithm, FetchError, OidcError, OidcVerifier, TokenError};
use serde_json::json;

const CLIENT: &str = "kontinuum";
const TIMEOUT: Duration = Duration::from_secs(5);

struct Bed {
    issuer: TestIssuer,
    clock: Arc<ManualClock>,
    verifier: OidcVerifier,
}

async fn bed(keys: &[&TestKey]) -> Bed {
    bed_with(keys, TIMEOUT).await
}

async fn bed_with(keys: &[&TestKey], timeout: Duration) -> Bed {
    let issuer = TestIssuer::start().await.unwrap();
    issuer.publish(keys);
    let clock = ManualClock::new();
    let verifier = OidcVerifier::new(&issuer.settings(CLIENT, &["admins"]), timeout)
        .unwrap()
        .with_ca(issuer.ca_pem().as_bytes())
        .unwrap()
        .with_clock(clock.clone());
    Bed {
        issuer,
        clock,
        verifier,
    }
}

fn key(alg: Algorithm, kid: &str) -> TestKey {
    TestKey::generate(alg, kid).unwrap()
}

fn token_error(got: Result<impl std::fmt::Debug, OidcError>) -> TokenError {
    match got {
        Err(OidcError::Token(e)) => e,
        other => panic!("expected a token error, got {other:?}"),
    }
}

#[tokio::test]
async fn valid_tokens_of_every_algorithm_are_accepted_with_one_fetch() {
    let keys = [
        key(Algorithm::Rs256, "rsa-1"),
        key(Algorithm::Es256, "ec-1"),
        key(Algorithm::EdDsa, "ed-1"),
    ];
    let b = bed(&keys.iter().collect::<Vec<_>>()).await;
    for k in &keys {
        let claims = b.issuer.claims(CLIENT, "alice", &["admins"]);
        let v = b.verifier.verify(&k.token(&claims)).await.unwrap();
        assert_eq!(v.subject, "alice");
        assert_eq!(v.email.as_deref(), Some("alice@example.com"));
        assert_eq!(v.groups, ["admins"]);
        assert_eq!(v.expires_at, claims["exp"].as_i64().unwrap());
    }
    // Discovery and keys were fetched once, then served from the cache.
    assert_eq!(b.issuer.discovery_requests(), 1);
    assert_eq!(b.issuer.jwks_requests(), 1);
    assert_eq!(b.verifier.refresh().await.unwrap(), 3);
}

#[tokio::test]
async fn bad_tokens_are_refused() {
    let ec = key(Algorithm::Es256, "ec-1");
    let rsa = key(Algorithm::Rs256, "rsa-1");
    let rogue = key(Algorithm::Es256, "ec-1");
    let b = bed(&[&ec, &rsa]).await;
    let url = b.issuer.url().to_string();
    let good = || b.issuer.claims(CLIENT, "alice", &["admins"]);
    let now = good()["iat"].as_i64().unwrap();
    let with = |f: &dyn Fn(&mut serde_json::Value)| {
        let mut c = good();
        f(&mut c);
        c
    };
    let flipped = {
        let t = ec.token(&good());
        let (input, sig) = t.rsplit_once('.').unwrap();
        let mut sig = sig.as_bytes().to_vec();
        // Flip a bit inside the base64url text of the signature, keeping the alphabet.
        sig[10] = if sig[10] == b'A' { b'B' } else { b'A' };
        format!("{input}.{}", String::from_utf8(sig).unwrap())
    };
    let b64 = |v: &serde_json::Value| {
        base64::Engine::encode(
            &base64::engine::general_purpose::URL_SAFE_NO_PAD,
            v.to_string(),
        )
    };
    let hs256 = {
        let input = format!(
            "{}.{}",
            b64(&json!({"alg": "HS256", "kid": "ec-1"})),
            b64(&good())
        );
        let k = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, ec.public_bytes());
        let tag = ring::hmac::sign(&k, input.as_bytes());
        format!(
            "{input}.{}",
            base64::Engine::encode(&base64::engine::general_purpose::URL_SAFE_NO_PAD, tag)
        )
    };
    let cases: Vec<(&str, String, TokenError)> = vec![
        ("garbage", "garbage".into(), TokenError::Malformed),
        (
            "expired",
            ec.token(&with(&|c| c["exp"] = json!(now - 120))),
            TokenError::Expired,
        ),
        (
            "not yet valid",
            ec.token(&with(&|c| c["nbf"] = json!(now + 120))),
            TokenError::NotYetValid,
        ),
        (
            "wrong issuer",
            ec.token(&with(&|c| c["iss"] = json!(format!("{url}/other")))),
            TokenError::Issuer,
        ),
        (
            "wrong audience",
            ec.token(&with(&|c| c["aud"] = json!("someone-else"))),
            TokenError::Audience,
        ),
        (
            "alg none",
            format!("{}.{}.", b64(&json!({"alg": "none"})), b64(&good())),
            TokenError::Algorithm,
        ),
        (
            "HS256 keyed with the public key",
            hs256,
            TokenError::Algorithm,
        ),
        (
            "unknown kid",
            ec.token_with_header(&json!({"alg": "ES256", "kid": "ec-9"}), &good()),
            TokenError::UnknownKey,
        ),
        ("flipped signature bit", flipped, TokenError::BadSignature),
        ("wrong key", rogue.token(&good()), TokenError::BadSignature),
    ];
    for (name, token, want) in cases {
        assert_eq!(token_error(b.verifier.verify(&token).await), want, "{name}");
    }
    // And the good token still passes.
    assert!(b.verifier.verify(&ec.token(&good())).await.is_ok());
}

#[tokio::test]
async fn a_key_rotation_at_the_issuer_is_picked_up() {
    let old = key(Algorithm::Rs256, "2024");
    let new = key(Algorithm::Rs256, "2025");
    let b = bed(&[&old]).await;
    let claims = b.issuer.claims(CLIENT, "alice", &["admins"]);
    b.verifier.verify(&old.token(&claims)).await.unwrap();
    assert_eq!(b.issuer.jwks_requests(), 1);

    // The issuer rotates: only the new key is published from now on. A burst of
    // concurrent requests with the new key shares one fetch, and every one passes.
    b.issuer.publish(&[&new]);
    b.clock.advance(DEFAULT_MIN_REFRESH_INTERVAL);
    let token = new.token(&claims);
    let burst = (0..20).map(|_| b.verifier.verify(&token));
    for got in futures::future::join_all(burst).await {
        assert_eq!(got.unwrap().subject, "alice");
    }
    assert_eq!(b.issuer.jwks_requests(), 2);
    // The old key is gone from the cache too (and its tokens cause no fetch: rate limit).
    assert_eq!(
        token_error(b.verifier.verify(&old.token(&claims)).await),
        TokenError::UnknownKey
    );
    assert_eq!(b.issuer.jwks_requests(), 2);
    // Discovery was not repeated: the jwks_uri is kept while it works.
    assert_eq!(b.issuer.discovery_requests(), 1);
}

#[tokio::test]
async fn unknown_kids_refresh_at_most_once_per_interval() {
    let ec = key(Algorithm::Es256, "ec-1");
    let b = bed(&[&ec]).await;
    let claims = b.issuer.claims(CLIENT, "alice", &["admins"]);
    b.verifier.verify(&ec.token(&claims)).await.unwrap();
    assert_eq!(b.issuer.jwks_requests(), 1);

    let garbage =
        |i: usize| ec.token_with_header(&json!({"alg": "ES256", "kid": format!("k{i}")}), &claims);
    // A storm of tokens with random kids, sequential and concurrent: no fetch at all
    // within the interval.
    for i in 0..50 {
        assert_eq!(
            token_error(b.verifier.verify(&garbage(i)).await),
            TokenError::UnknownKey
        );
    }
    let storm = (0..50).map(|i| {
        let token = garbage(100 + i);
        let verifier = &b.verifier;
        async move { verifier.verify(&token).await }
    });
    for got in futures::future::join_all(storm).await {
        assert_eq!(token_error(got), TokenError::UnknownKey);
    }
    b.clock.advance(
        DEFAULT_MIN_REFRESH_INTERVAL
            .checked_sub(Duration::from_millis(1))
            .unwrap(),
    );
    assert!(b.verifier.verify(&garbage(999)).await.is_err());
    assert_eq!(b.issuer.jwks_requests(), 1, "refreshed within the interval");

    // Once the interval has passed, a concurrent burst causes exactly one fetch.
    b.clock.advance(Duration::from_millis(1));
    let burst = (0..20).map(|i| {
        let token = garbage(2000 + i);
        let verifier = &b.verifier;
        async move { verifier.verify(&token).await }
    });
    for got in futures::future::join_all(burst).await {
        assert_eq!(token_error(got), TokenError::UnknownKey);
    }
    assert_eq!(b.issuer.jwks_requests(), 2, "one fetch for the whole burst");

    // Tokens that name another issuer never reach the key lookup, whatever the interval.
    b.clock.advance(DEFAULT_MIN_REFRESH_INTERVAL * 2);
    let mut foreign = claims.clone();
    foreign["iss"] = json!("https://evil.example.com");
    for i in 0..10 {
        let t = ec.token_with_header(&json!({"alg": "ES256", "kid": format!("z{i}")}), &foreign);
        assert_eq!(token_error(b.verifier.verify(&t).await), TokenError::Issuer);
    }
    assert_eq!(b.issuer.jwks_requests(), 2);
    assert_eq!(b.issuer.discovery_requests(), 1);
}

#[tokio::test]
async fn a_hanging_issuer_times_out() {
    let ec = key(Algorithm::Es256, "ec-1");
    let timeout = Duration::from_millis(400);
    let b = bed_with(&[&ec], timeout).await;
    b.issuer.set_hang(true);
    let token = ec.token(&b.issuer.claims(CLIENT, "alice", &["admins"]));
    let started = Instant::now();
    // The guard turns a missing timeout into a failure rather than a hung test.
    let got = tokio::time::timeout(timeout * 10, b.verifier.verify(&token))
        .await
        .expect("verify did not time out on its own");
    let took = started.elapsed();
    assert!(
        matches!(got, Err(OidcError::Discovery(FetchError::Timeout))),
        "{got:?}"
    );
    assert!(took >= timeout && took < timeout * 5, "took {took:?}");
    assert_eq!(b.issuer.discovery_requests(), 1);
    // Within the interval the failure is remembered: no second wait, no second request.
    let started = Instant::now();
    let got = b.verifier.verify(&token).await;
    assert!(matches!(got, Err(OidcError::KeysUnavailable)), "{got:?}");
    assert!(started.elapsed() < timeout);
    assert_eq!(b.issuer.discovery_requests(), 1);
    // The issuer recovers; after the interval the next token fetches and passes.
    b.issuer.set_hang(false);
    b.clock.advance(DEFAULT_MIN_REFRESH_INTERVAL);
    assert!(b.verifier.verify(&token).await.is_ok());
}

#[tokio::test]
async fn a_hanging_jwks_endpoint_times_out_and_stale_keys_keep_serving() {
    let ec = key(Algorithm::Es256, "ec-1");
    let timeout = Duration::from_millis(400);
    let b = bed_with(&[&ec], timeout).await;
    let verifier = b.verifier.with_max_key_age(Duration::from_secs(60));
    let claims = b.issuer.claims(CLIENT, "alice", &["admins"]);
    verifier.verify(&ec.token(&claims)).await.unwrap();
    assert_eq!(b.issuer.jwks_requests(), 1);

    // Old keys are refreshed on use...
    let ed = key(Algorithm::EdDsa, "ed-1");
    b.issuer.publish(&[&ec, &ed]);
    b.clock.advance(Duration::from_secs(61));
    verifier.verify(&ec.token(&claims)).await.unwrap();
    assert_eq!(b.issuer.jwks_requests(), 2);
    verifier.verify(&ed.token(&claims)).await.unwrap();
    assert_eq!(b.issuer.jwks_requests(), 2);

    // ...and when the refresh hangs, it times out and the cached keys still serve.
    b.issuer.set_hang(true);
    b.clock.advance(Duration::from_secs(61));
    let started = Instant::now();
    tokio::time::timeout(timeout * 10, verifier.verify(&ec.token(&claims)))
        .await
        .expect("the refresh did not time out on its own")
        .unwrap();
    assert!(started.elapsed() >= timeout);
    assert_eq!(b.issuer.jwks_requests(), 3);
}

#[tokio::test]
async fn discovery_must_name_the_configured_issuer() {
    let ec = key(Algorithm::Es256, "ec-1");
    let b = bed(&[&ec]).await;
    let token = ec.token(&b.issuer.claims(CLIENT, "alice", &["admins"]));
    for announced in [
        format!("{}/", b.issuer.url()),
        "https://evil.example.com".to_string(),
    ] {
        b.issuer.announce_issuer(&announced);
        let got = b.verifier.verify(&token).await;
        assert!(matches!(got, Err(OidcError::DiscoveryIssuer)), "{got:?}");
        b.clock.advance(DEFAULT_MIN_REFRESH_INTERVAL);
    }
    assert_eq!(
        b.issuer.jwks_requests(),
        0,
        "keys fetched from a foreign issuer"
    );
    b.issuer.announce_issuer(b.issuer.url());
    assert!(b.verifier.verify(&token).await.is_ok());
}

#[tokio::test]
async fn an_untrusted_issuer_certificate_is_refused() {
    let ec = key(Algorithm::Es256, "ec-1");
    let issuer = TestIssuer::start().await.unwrap();
    issuer.publish(&[&ec]);
    // No `with_ca`: the system's roots do not know the test CA.
    let verifier = OidcVerifier::new(&issuer.settings(CLIENT, &["admins"]), TIMEOUT).unwrap();
    let got = verifier
        .verify(&ec.token(&issuer.claims(CLIENT, "alice", &["admins"])))
        .await;
    assert!(
        matches!(got, Err(OidcError::Discovery(FetchError::Connect(_)))),
        "{got:?}"
    );
    assert_eq!(issuer.discovery_requests(), 0);
    // A bundle without certificates is refused up front.
    let verifier = OidcVerifier::new(&issuer.settings(CLIENT, &["admins"]), TIMEOUT).unwrap();
    assert!(matches!(
        verifier.with_ca(b"not a PEM"),
        Err(OidcError::CaBundle)
    ));
}

#[tokio::test]
async fn a_broken_jwks_is_an_issuer_error() {
    let ec = key(Algorithm::Es256, "ec-1");
    let b = bed(&[]).await;
    let token = ec.token(&b.issuer.claims(CLIENT, "alice", &["admins"]));
    b.issuer.publish_raw("this is not JSON");
    let got = b.verifier.verify(&token).await;
    assert!(matches!(got, Err(OidcError::JwksDocument(_))), "{got:?}");
    // An empty key set is valid, and no key fits.
    b.issuer.publish(&[]);
    b.clock.advance(DEFAULT_MIN_REFRESH_INTERVAL);
    assert_eq!(
        token_error(b.verifier.verify(&token).await),
        TokenError::UnknownKey
    );
    // The key appears; the next interval picks it up.
    b.issuer.publish(&[&ec]);
    b.clock.advance(DEFAULT_MIN_REFRESH_INTERVAL);
    assert!(b.verifier.verify(&token).await.is_ok());
    // Discovery is repeated after a failed JWKS fetch only.
    assert_eq!(b.issuer.discovery_requests(), 2);
    assert_eq!(b.issuer.jwks_requests(), 3);
}

#[tokio::test]
async fn an_insecure_issuer_url_is_refused() {
    let mut settings = TestIssuer::start()
        .await
        .unwrap()
        .settings(CLIENT, &["admins"]);
    settings.issuer_url = "http://id.example.com".into();
    assert!(matches!(
        OidcVerifier::new(&settings, TIMEOUT),
        Err(OidcError::IssuerUrl(_))
    ));
}
