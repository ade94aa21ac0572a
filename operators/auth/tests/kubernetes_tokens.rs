//! Interoperability with a real token issuer: the test bed's kube-apiserver signs
//! ServiceAccount tokens (JWS by go-jose, ES256 with the test bed's P-256 key) and publishes
//! an OIDC discovery document and its JWKS. Our key parser and verifier must accept its
//! tokens for the requested audience, and refuse them for any other audience or once
//! expired. (The discovery document names `https://kubernetes.default.svc.cluster.local`,
//! which does not resolve here, so the documents are read through the API client and fed
//! to the pure verifier; the HTTPS fetching is covered by `tests/oidc.rs`.)
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use kontinuum_auth::token::{self, LEEWAY_SECS, Unverified};
use kontinuum_auth::{Algorithm, Clock as _, Expectations, KeySet, SystemClock, TokenError};
use kube::api::{DeleteParams, ObjectMeta, PostParams};
use kube::{Api, Client};

async fn get(client: &Client, path: &str) -> String {
    client
        .request_text(http::Request::get(path).body(Vec::new()).unwrap())
        .await
        .unwrap()
}

#[tokio::test]
async fn a_kubernetes_service_account_token_verifies() {
    let shared = kontinuum_testbed::shared().unwrap();
    let client = shared.client().await.unwrap();

    let discovery: serde_json::Value =
        serde_json::from_str(&get(&client, "/.well-known/openid-configuration").await).unwrap();
    let issuer = discovery["issuer"].as_str().unwrap().to_string();
    assert_eq!(issuer, "https://kubernetes.default.svc.cluster.local");
    let keys = KeySet::from_jwks_json(get(&client, "/openid/v1/jwks").await.as_bytes()).unwrap();
    assert!(!keys.is_empty(), "{keys:?}");

    let accounts: Api<ServiceAccount> = Api::namespaced(client, "default");
    let name = format!("kontinuum-auth-{}", std::process::id());
    let account = ServiceAccount {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            ..ObjectMeta::default()
        },
        ..ServiceAccount::default()
    };
    accounts
        .create(&PostParams::default(), &account)
        .await
        .unwrap();
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            audiences: Some(vec!["kontinuum".into()]),
            expiration_seconds: Some(600),
            ..TokenRequestSpec::default()
        }),
        ..TokenRequest::default()
    };
    let response = accounts
        .create_token_request(&name, &PostParams::default(), &request)
        .await
        .unwrap();
    let jwt = response.status.unwrap().token.unwrap();

    let parsed = Unverified::parse(&jwt).unwrap();
    assert_eq!(parsed.algorithm(), Algorithm::Es256);
    assert!(parsed.kid().is_some());

    let now = SystemClock::new().unix_seconds();
    let expect = Expectations {
        issuer: &issuer,
        audience: "kontinuum",
    };
    let claims = token::verify(&jwt, &keys, &expect, now).unwrap();
    assert_eq!(
        claims.subject,
        format!("system:serviceaccount:default:{name}")
    );
    assert!((now + 500..=now + 700).contains(&claims.expires_at));

    let other_audience = Expectations {
        issuer: &issuer,
        audience: "kubernetes",
    };
    assert_eq!(
        token::verify(&jwt, &keys, &other_audience, now),
        Err(TokenError::Audience)
    );
    let later = claims.expires_at + LEEWAY_SECS;
    assert_eq!(
        token::verify(&jwt, &keys, &expect, later),
        Err(TokenError::Expired)
    );
    // One changed byte of the claims breaks the real signature.
    let (head, rest) = jwt.split_once('.').unwrap();
    let (payload, signature) = rest.split_once('.').unwrap();
    let mut payload = payload.as_bytes().to_vec();
    payload[5] = if payload[5] == b'A' { b'B' } else { b'A' };
    let tampered = format!("{head}.{}.{signature}", String::from_utf8(payload).unwrap());
    assert!(token::verify(&tampered, &keys, &expect, now).is_err());

    accounts
        .delete(&name, &DeleteParams::default())
        .await
        .unwrap();
}
