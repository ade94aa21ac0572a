//! The pure verification of one token against a key set (no network, fixed clock): every
//! acceptance rule, every refusal with its reason, and proptest runs showing that arbitrary
//! input never panics the parsers and is never accepted.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::OnceLock;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use kontinuum_auth::testing::{TestKey, signing_input};
use kontinuum_auth::token::{self, LEEWAY_SECS, MAX_TOKEN_LEN};
use kontinuum_auth::{Algorithm, Expectations, KeySet, TokenError, VerifiedClaims};
use serde_json::{Value, json};

const ISSUER: &str = "https://id.example.com/realms/kontinuum";
const CLIENT: &str = "kontinuum";
const NOW: i64 = 1_800_000_000;

struct Keys {
    rsa: TestKey,
    ec: TestKey,
    ed: TestKey,
    /// Not published; signs with the kids of the published keys.
    rogue_ec: TestKey,
    rogue_rsa: TestKey,
}

fn keys() -> &'static Keys {
    static KEYS: OnceLock<Keys> = OnceLock::new();
    KEYS.get_or_init(|| Keys {
        rsa: TestKey::generate(Algorithm::Rs256, "rsa-1").unwrap(),
        ec: TestKey::generate(Algorithm::Es256, "ec-1").unwrap(),
        ed: TestKey::generate(Algorithm::EdDsa, "ed-1").unwrap(),
        rogue_ec: TestKey::generate(Algorithm::Es256, "ec-1").unwrap(),
        rogue_rsa: TestKey::generate(Algorithm::Rs256, "rsa-1").unwrap(),
    })
}

fn published() -> KeySet {
    let k = keys();
    KeySet::new(
        [&k.rsa, &k.ec, &k.ed]
            .iter()
            .map(|k| k.public_key().unwrap())
            .collect(),
    )
}

fn claims() -> Value {
    json!({
        "iss": ISSUER, "sub": "alice", "aud": [CLIENT, "other"],
        "iat": NOW, "nbf": NOW, "exp": NOW + 300,
        "email": "alice@example.com", "groups": ["admins", "dev"],
    })
}

fn with(change: impl FnOnce(&mut Value)) -> Value {
    let mut c = claims();
    change(&mut c);
    c
}

fn without(claim: &str) -> Value {
    with(|c| {
        c.as_object_mut().unwrap().remove(claim);
    })
}

fn check(token: &str) -> Result<VerifiedClaims, TokenError> {
    let expect = Expectations {
        issuer: ISSUER,
        audience: CLIENT,
    };
    token::verify(token, &published(), &expect, NOW)
}

/// A token with `header` and `claims` whose third part is `signature`.
fn forged(header: &Value, claims: &Value, signature: &[u8]) -> String {
    format!(
        "{}.{}",
        signing_input(header, claims),
        URL_SAFE_NO_PAD.encode(signature)
    )
}

fn hs256(secret: &[u8], header: &Value, claims: &Value) -> String {
    let input = signing_input(header, claims);
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret);
    let tag = ring::hmac::sign(&key, input.as_bytes());
    format!("{input}.{}", URL_SAFE_NO_PAD.encode(tag.as_ref()))
}

#[test]
fn a_valid_token_of_each_algorithm_is_accepted() {
    let k = keys();
    for key in [&k.rsa, &k.ec, &k.ed] {
        let got = check(&key.token(&claims()));
        assert_eq!(
            got,
            Ok(VerifiedClaims {
                subject: "alice".into(),
                email: Some("alice@example.com".into()),
                groups: vec!["admins".into(), "dev".into()],
                expires_at: NOW + 300,
            }),
            "{:?}",
            key.algorithm()
        );
    }
}

#[test]
fn leeway_and_claim_shapes() {
    let ec = &keys().ec;
    let ok = |c: Value| check(&ec.token(&c));
    // Within the leeway on either side, and at its edge.
    assert!(ok(with(|c| c["exp"] = json!(NOW - LEEWAY_SECS + 1))).is_ok());
    assert!(ok(with(|c| c["nbf"] = json!(NOW + LEEWAY_SECS))).is_ok());
    assert!(ok(with(|c| c["iat"] = json!(NOW + LEEWAY_SECS))).is_ok());
    // nbf and iat are optional; a fractional exp is floored.
    let v = ok(with(|c| {
        let c = c.as_object_mut().unwrap();
        c.remove("nbf");
        c.remove("iat");
        c.insert("exp".into(), json!(1_800_000_100.75_f64));
    }))
    .unwrap();
    assert_eq!(v.expires_at, NOW + 100);
    // A single-string audience; groups as one string; odd shapes of optional claims.
    assert!(ok(with(|c| c["aud"] = json!(CLIENT))).is_ok());
    let v = ok(with(|c| c["groups"] = json!("admins"))).unwrap();
    assert_eq!(v.groups, ["admins"]);
    let v = ok(with(|c| c["groups"] = json!({"admins": true}))).unwrap();
    assert!(v.groups.is_empty());
    let v = ok(with(|c| c["groups"] = json!(["a", 1, null, "b"]))).unwrap();
    assert_eq!(v.groups, ["a", "b"]);
    let v = ok(with(|c| c["email"] = json!(42))).unwrap();
    assert_eq!(v.email, None);
    let v = ok(without("groups")).unwrap();
    assert!(v.groups.is_empty());
}

#[test]
fn a_token_without_kid_is_tried_against_every_key_of_its_algorithm() {
    let k = keys();
    for key in [&k.rsa, &k.ec, &k.ed] {
        let header = json!({"alg": key.algorithm().name()});
        assert!(check(&key.token_with_header(&header, &claims())).is_ok());
    }
    // ... but never against keys of another algorithm.
    let header = json!({"alg": "ES256"});
    let token = k.rogue_ec.token_with_header(&header, &claims());
    assert_eq!(check(&token), Err(TokenError::BadSignature));
}

#[test]
#[allow(clippy::too_many_lines)] // one row per refusal
fn every_bad_token_is_refused_with_its_reason() {
    let k = keys();
    let ec = &k.ec;
    let ec_header = |alg: &str| json!({"alg": alg, "kid": "ec-1", "typ": "JWT"});
    let too_long = with(|c| c["pad"] = json!("x".repeat(MAX_TOKEN_LEN)));
    let cases: Vec<(&str, String, TokenError)> = vec![
        ("empty", String::new(), TokenError::Malformed),
        ("garbage", "not a token".into(), TokenError::Malformed),
        (
            "two parts",
            "eyJhbGciOiJFUzI1NiJ9.e30".into(),
            TokenError::Malformed,
        ),
        (
            "four parts",
            format!("{}.AA", ec.token(&claims())),
            TokenError::Malformed,
        ),
        ("too long", ec.token(&too_long), TokenError::TooLong),
        (
            "claims not JSON",
            format!(
                "{}.{}.AA",
                URL_SAFE_NO_PAD.encode(ec_header("ES256").to_string()),
                URL_SAFE_NO_PAD.encode("nope")
            ),
            TokenError::Malformed,
        ),
        (
            "expired",
            ec.token(&with(|c| c["exp"] = json!(NOW - LEEWAY_SECS))),
            TokenError::Expired,
        ),
        (
            "not yet valid (nbf)",
            ec.token(&with(|c| c["nbf"] = json!(NOW + LEEWAY_SECS + 1))),
            TokenError::NotYetValid,
        ),
        (
            "issued in the future",
            ec.token(&with(|c| c["iat"] = json!(NOW + LEEWAY_SECS + 1))),
            TokenError::NotYetValid,
        ),
        (
            "no exp",
            ec.token(&without("exp")),
            TokenError::MissingExpiry,
        ),
        (
            "exp not a number",
            ec.token(&with(|c| c["exp"] = json!("tomorrow"))),
            TokenError::Malformed,
        ),
        (
            "wrong issuer",
            ec.token(&with(|c| c["iss"] = json!("https://evil.example.com"))),
            TokenError::Issuer,
        ),
        (
            "issuer with a trailing slash",
            ec.token(&with(|c| c["iss"] = json!(format!("{ISSUER}/")))),
            TokenError::Issuer,
        ),
        ("no issuer", ec.token(&without("iss")), TokenError::Issuer),
        (
            "wrong audience",
            ec.token(&with(|c| c["aud"] = json!(["kubernetes"]))),
            TokenError::Audience,
        ),
        (
            "audience prefix",
            ec.token(&with(|c| c["aud"] = json!("kontinuum-ui"))),
            TokenError::Audience,
        ),
        (
            "no audience",
            ec.token(&without("aud")),
            TokenError::Audience,
        ),
        (
            "no subject",
            ec.token(&without("sub")),
            TokenError::MissingSubject,
        ),
        (
            "empty subject",
            ec.token(&with(|c| c["sub"] = json!(""))),
            TokenError::MissingSubject,
        ),
        (
            "alg none, no signature",
            forged(&json!({"alg": "none"}), &claims(), b""),
            TokenError::Algorithm,
        ),
        (
            "alg none with a kid",
            forged(&ec_header("none"), &claims(), b""),
            TokenError::Algorithm,
        ),
        (
            "alg lowercase",
            ec.token_with_header(&ec_header("es256"), &claims()),
            TokenError::Algorithm,
        ),
        (
            "alg RS512",
            forged(&json!({"alg": "RS512", "kid": "rsa-1"}), &claims(), b"x"),
            TokenError::Algorithm,
        ),
        (
            "crit",
            ec.token_with_header(
                &json!({"alg": "ES256", "kid": "ec-1", "crit": ["b64"], "b64": false}),
                &claims(),
            ),
            TokenError::Critical,
        ),
        (
            "unknown kid",
            ec.token_with_header(&json!({"alg": "ES256", "kid": "ec-2"}), &claims()),
            TokenError::UnknownKey,
        ),
        (
            "kid of an RSA key with alg ES256",
            ec.token_with_header(&json!({"alg": "ES256", "kid": "rsa-1"}), &claims()),
            TokenError::UnknownKey,
        ),
        (
            "kid of an EC key with alg RS256",
            k.rsa
                .token_with_header(&json!({"alg": "RS256", "kid": "ec-1"}), &claims()),
            TokenError::UnknownKey,
        ),
        (
            "EdDSA header over an ES256 key id",
            k.ed.token_with_header(&json!({"alg": "EdDSA", "kid": "ec-1"}), &claims()),
            TokenError::UnknownKey,
        ),
        (
            "wrong EC key with a published kid",
            k.rogue_ec.token(&claims()),
            TokenError::BadSignature,
        ),
        (
            "wrong RSA key with a published kid",
            k.rogue_rsa.token(&claims()),
            TokenError::BadSignature,
        ),
        (
            "signature of other claims",
            {
                let good = ec.token(&claims());
                let other = ec.token(&with(|c| c["sub"] = json!("mallory")));
                let (_, sig) = good.rsplit_once('.').unwrap();
                let (input, _) = other.rsplit_once('.').unwrap();
                format!("{input}.{sig}")
            },
            TokenError::BadSignature,
        ),
        (
            "empty signature",
            forged(&ec_header("ES256"), &claims(), b""),
            TokenError::BadSignature,
        ),
    ];
    for (name, token, want) in cases {
        assert_eq!(check(&token), Err(want), "{name}");
    }
}

/// Algorithm confusion: an HMAC over the token keyed with the verifier's public key
/// (every encoding an attacker might try) is never accepted.
#[test]
fn hs256_keyed_with_a_public_key_is_refused() {
    let k = keys();
    for key in [&k.rsa, &k.ec, &k.ed] {
        let jwk = key.jwk().to_string();
        let secrets: [&[u8]; 2] = [key.public_bytes(), jwk.as_bytes()];
        for secret in secrets {
            for alg in ["HS256", "HS384", "HS512"] {
                let header = json!({"alg": alg, "kid": key.kid()});
                assert_eq!(
                    check(&hs256(secret, &header, &claims())),
                    Err(TokenError::Algorithm),
                    "{alg} with {:?}",
                    key.algorithm()
                );
            }
            // With the header claiming the key's own algorithm, the tag is not a signature.
            let header = json!({"alg": key.algorithm().name(), "kid": key.kid()});
            assert_eq!(
                check(&hs256(secret, &header, &claims())),
                Err(TokenError::BadSignature)
            );
        }
    }
}

#[test]
fn every_flipped_signature_bit_is_refused() {
    let k = keys();
    for key in [&k.rsa, &k.ec, &k.ed] {
        let token = key.token(&claims());
        assert!(check(&token).is_ok());
        let (input, sig) = token.rsplit_once('.').unwrap();
        let sig = URL_SAFE_NO_PAD.decode(sig).unwrap();
        for bit in 0..sig.len() * 8 {
            let mut flipped = sig.clone();
            flipped[bit / 8] ^= 1 << (bit % 8);
            let bad = format!("{input}.{}", URL_SAFE_NO_PAD.encode(&flipped));
            assert_eq!(
                check(&bad),
                Err(TokenError::BadSignature),
                "{:?} bit {bit}",
                key.algorithm()
            );
        }
    }
}

#[test]
fn reasons_and_messages_are_short_and_safe_for_a_header() {
    let all = [
        TokenError::TooLong,
        TokenError::Malformed,
        TokenError::Algorithm,
        TokenError::Critical,
        TokenError::Issuer,
        TokenError::UnknownKey,
        TokenError::BadSignature,
        TokenError::Audience,
        TokenError::MissingSubject,
        TokenError::MissingExpiry,
        TokenError::Expired,
        TokenError::NotYetValid,
    ];
    let mut reasons = std::collections::HashSet::new();
    for e in all {
        let msg = e.to_string();
        assert!(msg.len() < 80 && !msg.contains(['"', '\\']), "{msg}");
        assert!(e.reason().chars().all(|c| c.is_ascii_alphabetic()));
        assert!(
            reasons.insert(e.reason()),
            "duplicate reason {}",
            e.reason()
        );
    }
}

mod fuzz {
    use kontinuum_auth::token::Unverified;
    use proptest::prelude::*;

    use super::*;

    // Cases: proptest's default (256), or `PROPTEST_CASES` for a long run.
    proptest! {
        /// Arbitrary strings never panic the parser, and nothing unsigned passes.
        #[test]
        fn arbitrary_strings(token in ".{0,600}") {
            let _ = Unverified::parse(&token);
            prop_assert!(check(&token).is_err());
        }

        /// Three base64url parts of arbitrary bytes, or of an accepted header and JSON-ish
        /// claims, with an arbitrary signature.
        #[test]
        fn arbitrary_parts(
            header in prop::collection::vec(any::<u8>(), 0..80),
            claims_json in r#"\{("[a-z]{1,6}":(-?[0-9]{1,20}(\.[0-9]{1,3})?|"[a-z:/.-]{0,40}"|\[("[a-z-]{0,12}",?){0,3}\]|null|true|\{\}),?){0,10}\}"#,
            signature in prop::collection::vec(any::<u8>(), 0..600),
            alg in prop::sample::select(vec!["", "ES256", "RS256", "EdDSA", "none", "HS256"]),
            kid in prop::sample::select(vec!["", "ec-1", "rsa-1", "ed-1", "x"]),
        ) {
            let header = if alg.is_empty() {
                header
            } else if kid.is_empty() {
                json!({"alg": alg}).to_string().into_bytes()
            } else {
                json!({"alg": alg, "kid": kid}).to_string().into_bytes()
            };
            let token = format!(
                "{}.{}.{}",
                URL_SAFE_NO_PAD.encode(header),
                URL_SAFE_NO_PAD.encode(claims_json),
                URL_SAFE_NO_PAD.encode(signature)
            );
            prop_assert!(check(&token).is_err());
        }

        /// Valid claims with arbitrary (wrong) signatures are never accepted.
        #[test]
        fn arbitrary_signatures_over_valid_claims(
            signature in prop::collection::vec(any::<u8>(), 0..600),
            which in 0usize..3,
        ) {
            let k = keys();
            let key = [&k.rsa, &k.ec, &k.ed][which];
            let header = json!({"alg": key.algorithm().name(), "kid": key.kid()});
            prop_assert_eq!(
                check(&forged(&header, &claims(), &signature)),
                Err(TokenError::BadSignature)
            );
        }

        /// Arbitrary JWKS documents never panic the key parser, and whatever keys they
        /// yield never verify a token they did not sign.
        #[test]
        fn arbitrary_jwks(
            kty in prop::sample::select(vec!["RSA", "EC", "OKP", "oct", ""]),
            crv in prop::sample::select(vec!["P-256", "Ed25519", "P-384", ""]),
            n in prop::collection::vec(any::<u8>(), 0..600),
            x in prop::collection::vec(any::<u8>(), 0..40),
            y in prop::collection::vec(any::<u8>(), 0..40),
            raw in ".{0,200}",
        ) {
            let _ = KeySet::from_jwks_json(raw.as_bytes());
            let doc = json!({"keys": [{
                "kty": kty, "crv": crv, "kid": "ec-1",
                "n": URL_SAFE_NO_PAD.encode(&n), "e": "AQAB",
                "x": URL_SAFE_NO_PAD.encode(&x), "y": URL_SAFE_NO_PAD.encode(&y),
            }]});
            let set = KeySet::from_jwks_json(doc.to_string().as_bytes()).unwrap();
            let expect = Expectations { issuer: ISSUER, audience: CLIENT };
            let token = keys().ec.token(&claims());
            prop_assert!(token::verify(&token, &set, &expect, NOW).is_err());
        }

        /// Signed tokens with arbitrary times: accepted exactly when the time rules hold.
        #[test]
        fn time_rules(exp_off in -400i64..400, nbf_off in -400i64..400, iat_off in -400i64..400) {
            let c = with(|c| {
                c["exp"] = json!(NOW + exp_off);
                c["nbf"] = json!(NOW + nbf_off);
                c["iat"] = json!(NOW + iat_off);
            });
            let valid = NOW < NOW + exp_off + LEEWAY_SECS
                && nbf_off <= LEEWAY_SECS
                && iat_off <= LEEWAY_SECS;
            prop_assert_eq!(check(&keys().ed.token(&c)).is_ok(), valid);
        }
    }
}
