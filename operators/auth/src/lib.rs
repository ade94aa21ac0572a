//! Kontinuum's auth modes and OIDC bearer-token verification.
//!
//! Every Kontinuum installation runs in exactly one auth mode (DESIGN.md section 4,
//! reference section 7.3), read from the environment by [`AuthMode::from_env`]:
//!
//! * **OIDC**: `KONTINUUM_OIDC_ISSUER_URL` (an `https` URL), `KONTINUUM_OIDC_CLIENT_ID`
//!   (default `kontinuum`), `KONTINUUM_OIDC_REDIRECT_URL` (optional), and
//!   `KONTINUUM_OIDC_ADMIN_GROUPS` (comma-separated, at least one). Requests carry
//!   `Authorization: Bearer <ID token>`, verified by [`OidcVerifier`] against the keys the
//!   issuer publishes (discovery document, then JWKS).
//! * **anonymous**: `KONTINUUM_INSECURE_ALLOW_ANONYMOUS=true`, an explicit opt-in; every
//!   request is allowed.
//!
//! Neither, or both, is a start-up error naming the variables.
//!
//! An HTTP server puts its routes behind the mode with an [`Authenticator`]:
//!
//! ```no_run
//! # async fn serve() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use axum::{Router, middleware, routing::get};
//! use kontinuum_auth::{AuthMode, Authenticator, require_auth};
//!
//! let mode = AuthMode::from_env(|name| std::env::var(name).ok())?;
//! let auth = Authenticator::new(mode, Duration::from_secs(10))?;
//! let app: Router = Router::new()
//!     .route("/status", get(|| async { "ok" }))
//!     .route_layer(middleware::from_fn_with_state(auth, require_auth))
//!     .route("/healthz", get(|| async { "ok" }));
//! # let _ = app; Ok(()) }
//! ```
//!
//! Modules, from the bottom up: [`jws`] (compact JWS splitting and the time rules, pure and
//! shareable), [`jwk`] (JWKS parsing and signature checks with ring), [`token`] (the pure
//! verification of one token against a key set), [`oidc`] (discovery, JWKS fetching and
//! caching over HTTPS), [`mode`] (the environment) and [`authn`] (HTTP: bearer extraction,
//! `401`/`403`/`503` responses, the axum middleware). With the `testing` feature, `testing`
//! holds an in-process HTTPS OIDC issuer for tests.

pub mod authn;
pub mod jwk;
pub mod jws;
pub mod mode;
pub mod oidc;
pub mod token;

mod http_client;

#[cfg(feature = "testing")]
pub mod testing;

pub use authn::{AuthError, Authenticator, Identity, require_auth};
pub use jwk::{Algorithm, JwksError, KeySet, PublicKey};
pub use mode::{AuthMode, AuthModeError, OidcSettings, UrlProblem};
pub use oidc::{Clock, FetchError, OidcError, OidcVerifier, SystemClock};
pub use token::{Expectations, TokenError, Unverified, VerifiedClaims};
