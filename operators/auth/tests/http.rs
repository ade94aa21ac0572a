//! An axum router behind [`require_auth`], as the zone agent serves `/status`: the mode is
//! read from environment variables with [`AuthMode::from_env`], the issuer is the in-test
//! HTTPS issuer. Statuses, `WWW-Authenticate` challenges and the [`Identity`] extension.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashMap;
use std::time::Duration;

use axum::body::Body;
use axum::routing::get;
use axum::{Extension, Router, middleware};
use http::header::{AUTHORIZATION, WWW_AUTHENTICATE};
use http::{Request, StatusCode};
use kontinuum_auth::authn::bearer_token;
use kontinuum_auth::mode::{ADMIN_GROUPS_ENV, ANONYMOUS_ENV, ISSUER_URL_ENV};
use kontinuum_auth::testing::{TestIssuer, TestKey};
use kontinuum_auth::{
    Algorithm, AuthError, AuthMode, Authenticator, Identity, TokenError, require_auth,
};
use serde_json::json;
use tower::ServiceExt as _;

fn router(auth: Authenticator) -> Router {
    Router::new()
        .route(
            "/status",
            get(|Extension(Identity(who)): Extension<Identity>| async move {
                who.map_or_else(|| "anonymous".to_string(), |c| c.subject)
            }),
        )
        .route_layer(middleware::from_fn_with_state(auth, require_auth))
        .route("/healthz", get(|| async { "ok" }))
}

struct Reply {
    status: StatusCode,
    challenge: Option<String>,
    body: String,
}

async fn call(app: &Router, path: &str, authorization: &[&str]) -> Reply {
    let mut request = Request::get(path);
    for value in authorization {
        request = request.header(AUTHORIZATION, *value);
    }
    let response = app
        .clone()
        .oneshot(request.body(Body::empty()).unwrap())
        .await
        .unwrap();
    let status = response.status();
    let challenge = response
        .headers()
        .get(WWW_AUTHENTICATE)
        .map(|v| v.to_str().unwrap().to_string());
    let body = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .unwrap();
    Reply {
        status,
        challenge,
        body: String::from_utf8(body.to_vec()).unwrap(),
    }
}

fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let vars: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
        .collect();
    move |name| vars.get(name).cloned()
}

#[tokio::test]
async fn anonymous_mode_lets_everyone_in() {
    let mode = AuthMode::from_env(env(&[(ANONYMOUS_ENV, "true")])).unwrap();
    let auth = Authenticator::new(mode, Duration::from_secs(5)).unwrap();
    assert!(auth.is_anonymous() && auth.verifier().is_none());
    let app = router(auth);
    let r = call(&app, "/status", &[]).await;
    assert_eq!((r.status, r.body.as_str()), (StatusCode::OK, "anonymous"));
    // Even a garbage token: anonymous mode does not look at it.
    let r = call(&app, "/status", &["Bearer garbage"]).await;
    assert_eq!(r.status, StatusCode::OK);
}

#[tokio::test]
async fn oidc_mode_requires_a_valid_token_of_an_admin() {
    let issuer = TestIssuer::start().await.unwrap();
    let key = TestKey::generate(Algorithm::Es256, "ec-1").unwrap();
    issuer.publish(&[&key]);
    let mode = AuthMode::from_env(env(&[
        (ISSUER_URL_ENV, issuer.url()),
        (ADMIN_GROUPS_ENV, "platform,ops"),
    ]))
    .unwrap();
    let auth = Authenticator::with_ca(
        mode,
        Duration::from_secs(5),
        Some(issuer.ca_pem().as_bytes()),
    )
    .unwrap();
    assert!(!auth.is_anonymous());
    let app = router(auth);
    let token = |groups: &[&str]| key.token(&issuer.claims("kontinuum", "alice", groups));

    // Open routes stay open.
    assert_eq!(call(&app, "/healthz", &[]).await.status, StatusCode::OK);

    let admin = format!("Bearer {}", token(&["dev", "ops"]));
    let r = call(&app, "/status", &[&admin]).await;
    assert_eq!((r.status, r.body.as_str()), (StatusCode::OK, "alice"));
    assert_eq!(r.challenge, None);
    // The scheme is case-insensitive.
    let lower = format!("bearer {}", token(&["platform"]));
    assert_eq!(
        call(&app, "/status", &[&lower]).await.status,
        StatusCode::OK
    );

    let r = call(&app, "/status", &[]).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    assert_eq!(r.challenge.as_deref(), Some(r#"Bearer realm="kontinuum""#));
    assert_eq!(r.body, "Unauthorized: missing bearer token\n");

    for bad in [
        "Basic YWxpY2U6cHc=",
        "Bearer",
        "Bearer ",
        "Bearer a b",
        "token",
    ] {
        let r = call(&app, "/status", &[bad]).await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{bad}");
        assert!(
            r.challenge.unwrap().contains(r#"error="invalid_request""#),
            "{bad}"
        );
    }
    // Two Authorization headers are ambiguous: refused even if one is valid.
    let r = call(&app, "/status", &[&admin, "Bearer x"]).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);

    let r = call(&app, "/status", &["Bearer garbage"]).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    assert_eq!(
        r.challenge.as_deref(),
        Some(
            r#"Bearer realm="kontinuum", error="invalid_token", error_description="malformed token""#
        )
    );
    let mut expired = issuer.claims("kontinuum", "alice", &["ops"]);
    expired["exp"] = json!(expired["iat"].as_i64().unwrap() - 3600);
    let r = call(
        &app,
        "/status",
        &[&format!("Bearer {}", key.token(&expired))],
    )
    .await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    assert!(r.challenge.unwrap().contains("token has expired"));
    // The reason, never the token.
    assert_eq!(
        r.body,
        "Unauthorized: invalid bearer token: token has expired\n"
    );

    // A valid token of someone outside the admin groups.
    let r = call(&app, "/status", &[&format!("Bearer {}", token(&["dev"]))]).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert!(
        r.challenge
            .unwrap()
            .contains(r#"error="insufficient_scope""#)
    );
    let r = call(&app, "/status", &[&format!("Bearer {}", token(&[]))]).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
}

#[tokio::test]
async fn an_unreachable_issuer_is_a_503_not_a_401() {
    let issuer = TestIssuer::start().await.unwrap();
    let key = TestKey::generate(Algorithm::EdDsa, "ed-1").unwrap();
    issuer.publish(&[&key]);
    issuer.set_hang(true);
    let auth = Authenticator::with_ca(
        AuthMode::Oidc(issuer.settings("kontinuum", &["ops"])),
        Duration::from_millis(300),
        Some(issuer.ca_pem().as_bytes()),
    )
    .unwrap();
    let app = router(auth);
    let token = key.token(&issuer.claims("kontinuum", "alice", &["ops"]));
    let r = call(&app, "/status", &[&format!("Bearer {token}")]).await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(r.challenge, None);
    assert_eq!(
        r.body,
        "Service Unavailable: the OIDC issuer is unavailable\n"
    );
}

#[test]
fn errors_map_to_statuses_and_challenges() {
    let cases = [
        (AuthError::MissingToken, 401, r#"Bearer realm="kontinuum""#),
        (
            AuthError::NotBearer,
            401,
            r#"Bearer realm="kontinuum", error="invalid_request", error_description="authorization is not a single bearer token""#,
        ),
        (
            AuthError::InvalidToken(TokenError::Audience),
            401,
            r#"Bearer realm="kontinuum", error="invalid_token", error_description="token audience does not include the client id""#,
        ),
        (
            AuthError::Forbidden,
            403,
            r#"Bearer realm="kontinuum", error="insufficient_scope", error_description="the bearer is not a member of an admin group""#,
        ),
    ];
    for (err, status, challenge) in cases {
        assert_eq!(err.status().as_u16(), status, "{err}");
        assert_eq!(err.www_authenticate(), challenge);
        let response = err.to_response();
        assert_eq!(response.headers()[WWW_AUTHENTICATE], challenge);
        assert_eq!(response.headers()["cache-control"], "no-store");
    }
}

mod fuzz {
    use http::{HeaderMap, HeaderValue};
    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// Arbitrary Authorization header bytes never panic the bearer extraction, and
        /// what it returns is always a non-empty token without whitespace.
        #[test]
        fn arbitrary_authorization_headers(value in prop::collection::vec(any::<u8>(), 0..200)) {
            let mut headers = HeaderMap::new();
            if let Ok(v) = HeaderValue::from_bytes(&value) {
                headers.insert(AUTHORIZATION, v);
            }
            if let Ok(token) = bearer_token(&headers) {
                prop_assert!(!token.is_empty());
                prop_assert!(!token.contains(|c: char| c.is_ascii_whitespace()));
                let lower = String::from_utf8_lossy(&value).to_ascii_lowercase();
                prop_assert!(lower.starts_with("bearer "));
            }
        }
    }
}
