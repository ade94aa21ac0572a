//! HTTP requests behind the auth mode: [`Authenticator`] (built from an [`AuthMode`]),
//! [`AuthError`] and its response, and the axum middleware [`require_auth`].
//!
//! * Anonymous mode allows every request (`Ok(None)`).
//! * OIDC mode requires exactly one `Authorization: Bearer <token>` header whose token the
//!   [`OidcVerifier`] accepts ([`Authenticator::authenticate`]), and, for
//!   [`Authenticator::authorize`], a bearer who is a member of one of the configured admin
//!   groups: the only users the reference's admin authorizer lets in where no Kubernetes
//!   RBAC applies, as on a zone agent's endpoint.
//!
//! Responses (RFC 6750): `401` with `WWW-Authenticate: Bearer realm="kontinuum"` when the
//! token is missing, plus `error="invalid_request"` or `error="invalid_token"` and a short
//! `error_description` when it is malformed or refused; `403` with
//! `error="insufficient_scope"` for a valid token outside the admin groups; `503` when the
//! issuer's keys cannot be fetched (the client is not at fault, and may retry). The token is
//! never logged or echoed.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http::header::{AUTHORIZATION, CACHE_CONTROL, CONTENT_TYPE, WWW_AUTHENTICATE};
use http::{HeaderMap, HeaderValue, StatusCode};
use tracing::{debug, warn};

use crate::mode::{ANONYMOUS_WARNING, AuthMode};
use crate::oidc::{OidcError, OidcVerifier};
use crate::token::{TokenError, VerifiedClaims};

/// The `realm` of our `WWW-Authenticate` challenges.
pub const REALM: &str = "kontinuum";

/// Why a request is refused.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// No `Authorization` header.
    #[error("missing bearer token")]
    MissingToken,
    /// The `Authorization` header is not one `Bearer <token>`.
    #[error("authorization is not a single bearer token")]
    NotBearer,
    /// The token is refused.
    #[error("invalid bearer token: {0}")]
    InvalidToken(TokenError),
    /// The bearer is in none of the admin groups.
    #[error("the bearer is not a member of an admin group")]
    Forbidden,
    /// The issuer's keys could not be fetched.
    #[error("the OIDC issuer is unavailable")]
    IssuerUnavailable(#[source] OidcError),
}

impl From<OidcError> for AuthError {
    fn from(e: OidcError) -> Self {
        match e {
            OidcError::Token(t) => Self::InvalidToken(t),
            other => Self::IssuerUnavailable(other),
        }
    }
}

impl AuthError {
    /// Stable CamelCase, for metrics and logs.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::MissingToken => "MissingToken",
            Self::NotBearer => "NotBearer",
            Self::InvalidToken(t) => t.reason(),
            Self::Forbidden => "NotAnAdmin",
            Self::IssuerUnavailable(e) => e.reason(),
        }
    }

    /// `401`, `403` or `503`.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::MissingToken | Self::NotBearer | Self::InvalidToken(_) => {
                StatusCode::UNAUTHORIZED
            }
            Self::Forbidden => StatusCode::FORBIDDEN,
            Self::IssuerUnavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// The `WWW-Authenticate` challenge (RFC 6750 section 3) for this refusal.
    pub fn www_authenticate(&self) -> HeaderValue {
        let (error, description) = match self {
            Self::MissingToken | Self::IssuerUnavailable(_) => (None, None),
            Self::NotBearer => (Some("invalid_request"), Some(self.to_string())),
            Self::InvalidToken(t) => (Some("invalid_token"), Some(t.to_string())),
            Self::Forbidden => (Some("insufficient_scope"), Some(self.to_string())),
        };
        let mut value = format!("Bearer realm=\"{REALM}\"");
        if let Some(error) = error {
            let _ = write!(value, ", error=\"{error}\"");
        }
        if let Some(description) = description {
            // Our messages are fixed text; keep the quoted-string valid whatever they say.
            let description: String = description
                .chars()
                .filter(|c| *c != '"' && *c != '\\' && (' '..='~').contains(c))
                .collect();
            let _ = write!(value, ", error_description=\"{description}\"");
        }
        HeaderValue::from_str(&value).unwrap_or_else(|_| HeaderValue::from_static("Bearer"))
    }

    /// The HTTP response: the status, the challenge on `401` and `403`, `no-store`, and a
    /// one-line plain-text body with the reason.
    pub fn to_response(&self) -> http::Response<String> {
        let status = self.status();
        let mut response = http::Response::new(format!(
            "{}: {self}\n",
            status.canonical_reason().unwrap_or("refused")
        ));
        *response.status_mut() = status;
        let headers = response.headers_mut();
        headers.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
        if matches!(status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN) {
            headers.insert(WWW_AUTHENTICATE, self.www_authenticate());
        }
        response
    }
}

impl IntoResponse for AuthError {
    fn into_response(self) -> Response {
        self.to_response().into_response()
    }
}

/// The bearer token of `headers`: exactly one `Authorization` header, scheme `Bearer`
/// (any case), one space, a non-empty token without whitespace.
pub fn bearer_token(headers: &HeaderMap) -> Result<&str, AuthError> {
    let mut values = headers.get_all(AUTHORIZATION).iter();
    let value = values.next().ok_or(AuthError::MissingToken)?;
    if values.next().is_some() {
        return Err(AuthError::NotBearer);
    }
    let value = value.to_str().map_err(|_| AuthError::NotBearer)?;
    let (scheme, token) = value.split_once(' ').ok_or(AuthError::NotBearer)?;
    if !scheme.eq_ignore_ascii_case("bearer")
        || token.is_empty()
        || token.contains(|c: char| c.is_ascii_whitespace())
    {
        return Err(AuthError::NotBearer);
    }
    Ok(token)
}

enum Inner {
    Anonymous,
    Oidc {
        verifier: Box<OidcVerifier>,
        admin_groups: Vec<String>,
    },
}

/// Decides whether a request may pass, per the installation's auth mode. Cheap to clone.
#[derive(Clone)]
pub struct Authenticator {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &*self.inner {
            Inner::Anonymous => f.write_str("Authenticator(anonymous)"),
            Inner::Oidc {
                verifier,
                admin_groups,
            } => f
                .debug_struct("Authenticator")
                .field("verifier", verifier)
                .field("admin_groups", admin_groups)
                .finish(),
        }
    }
}

impl Authenticator {
    /// The authenticator of `mode`, with `timeout` on every call to the OIDC issuer. In
    /// anonymous mode, logs the reference's start-up warning once.
    pub fn new(mode: AuthMode, timeout: Duration) -> Result<Self, OidcError> {
        Self::with_ca(mode, timeout, None)
    }

    /// As [`new`](Self::new), also trusting the PEM CA bundle `ca_pem` for the issuer
    /// (a private issuer, or tests).
    pub fn with_ca(
        mode: AuthMode,
        timeout: Duration,
        ca_pem: Option<&[u8]>,
    ) -> Result<Self, OidcError> {
        match mode {
            AuthMode::Anonymous => Ok(Self::anonymous()),
            AuthMode::Oidc(settings) => {
                let mut verifier = OidcVerifier::new(&settings, timeout)?;
                if let Some(pem) = ca_pem {
                    verifier = verifier.with_ca(pem)?;
                }
                Ok(Self::oidc(verifier, settings.admin_groups))
            }
        }
    }

    /// Anonymous mode: every request passes. Logs the reference's warning.
    pub fn anonymous() -> Self {
        warn!("{ANONYMOUS_WARNING}");
        Self {
            inner: Arc::new(Inner::Anonymous),
        }
    }

    /// OIDC mode with a ready verifier (custom clock, refresh interval, CA...).
    pub fn oidc(verifier: OidcVerifier, admin_groups: Vec<String>) -> Self {
        Self {
            inner: Arc::new(Inner::Oidc {
                verifier: Box::new(verifier),
                admin_groups,
            }),
        }
    }

    /// Whether every request passes.
    pub fn is_anonymous(&self) -> bool {
        matches!(&*self.inner, Inner::Anonymous)
    }

    /// The verifier, in OIDC mode.
    pub fn verifier(&self) -> Option<&OidcVerifier> {
        match &*self.inner {
            Inner::Anonymous => None,
            Inner::Oidc { verifier, .. } => Some(verifier),
        }
    }

    /// Who is calling: `Ok(None)` in anonymous mode, the verified claims of the bearer
    /// token in OIDC mode.
    pub async fn authenticate(
        &self,
        headers: &HeaderMap,
    ) -> Result<Option<VerifiedClaims>, AuthError> {
        match &*self.inner {
            Inner::Anonymous => Ok(None),
            Inner::Oidc { verifier, .. } => {
                let token = bearer_token(headers)?;
                Ok(Some(verifier.verify(token).await?))
            }
        }
    }

    /// [`authenticate`](Self::authenticate), and in OIDC mode the bearer must be a member
    /// of an admin group ([`AuthError::Forbidden`] otherwise).
    pub async fn authorize(
        &self,
        headers: &HeaderMap,
    ) -> Result<Option<VerifiedClaims>, AuthError> {
        let claims = self.authenticate(headers).await?;
        if let (Inner::Oidc { admin_groups, .. }, Some(claims)) = (&*self.inner, &claims)
            && !claims.groups.iter().any(|g| admin_groups.contains(g))
        {
            return Err(AuthError::Forbidden);
        }
        Ok(claims)
    }
}

/// Who made a request that passed [`require_auth`]: `None` in anonymous mode. Inserted as a
/// request extension.
#[derive(Clone, Debug)]
pub struct Identity(pub Option<VerifiedClaims>);

/// axum middleware: [`Authenticator::authorize`]s the request, then runs the route with an
/// [`Identity`] extension, or answers with the [`AuthError`]'s response. Install it with
/// `router.route_layer(axum::middleware::from_fn_with_state(authenticator, require_auth))`
/// (see the [crate-level example](crate)).
pub async fn require_auth(
    State(auth): State<Authenticator>,
    mut request: Request,
    next: Next,
) -> Response {
    match auth.authorize(request.headers()).await {
        Ok(identity) => {
            request.extensions_mut().insert(Identity(identity));
            next.run(request).await
        }
        Err(err) => {
            if let AuthError::IssuerUnavailable(source) = &err {
                warn!(
                    reason = err.reason(),
                    error = source as &dyn std::error::Error,
                    "refused a request: the OIDC issuer is unavailable"
                );
            } else {
                debug!(reason = err.reason(), "refused a request");
            }
            err.into_response()
        }
    }
}
