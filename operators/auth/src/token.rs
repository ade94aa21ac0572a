//! The pure verification of one OIDC bearer token (a JWT in JWS compact form) against a
//! set of the issuer's keys: no I/O, the clock passed in, so every rule is unit-tested and
//! fuzzed. [`crate::OidcVerifier`] adds fetching and caching of the keys around it.
//!
//! A token is accepted only when all of these hold:
//! * at most [`MAX_TOKEN_LEN`] bytes, three base64url parts of JSON;
//! * header `alg` is `RS256`, `ES256` or `EdDSA` (never `none`, never `HS*`), no `crit`;
//! * a key of the issuer with that algorithm (and the header's `kid`, when it has one)
//!   verifies the signature;
//! * `iss` equals the configured issuer exactly; `aud` contains the client id;
//! * `sub` is present and not empty;
//! * `exp` is present and in the future; `nbf` and `iat`, when present, are not in the
//!   future; each with [`LEEWAY_SECS`] of clock skew.
//!
//! Errors are [`TokenError`]s: a short reason, never the token or any key material.

use serde::Deserialize;

use crate::jwk::{Algorithm, KeySet};
use crate::jws::{self, Audience, JwsError, TimeError, Times};

/// Clock skew allowed on `exp`, `nbf` and `iat`, in seconds.
pub const LEEWAY_SECS: i64 = 60;
/// Longer tokens are refused before any decoding.
pub const MAX_TOKEN_LEN: usize = 16 * 1024;

/// Why a token was refused. The `Display` text is short, safe to return to the caller,
/// and contains neither double quotes nor backslashes (it goes into a `WWW-Authenticate`
/// quoted string).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    /// Longer than [`MAX_TOKEN_LEN`].
    #[error("token is too long")]
    TooLong,
    /// Not a JWS in compact form with JSON header and claims.
    #[error("malformed token")]
    Malformed,
    /// `alg` is not one we accept.
    #[error("token algorithm must be RS256, ES256 or EdDSA")]
    Algorithm,
    /// The header lists critical extensions, none of which we implement.
    #[error("token has unsupported critical header parameters")]
    Critical,
    /// `iss` is not the configured issuer.
    #[error("token was not issued by the configured issuer")]
    Issuer,
    /// No key of the issuer has the token's `kid` and algorithm.
    #[error("token is signed with a key the issuer does not publish")]
    UnknownKey,
    /// No candidate key verifies the signature.
    #[error("token signature is invalid")]
    BadSignature,
    /// `aud` does not contain the client id.
    #[error("token audience does not include the client id")]
    Audience,
    /// `sub` is missing or empty.
    #[error("token has no subject")]
    MissingSubject,
    /// No `exp`.
    #[error("token has no expiry")]
    MissingExpiry,
    /// `exp` has passed (beyond the leeway).
    #[error("token has expired")]
    Expired,
    /// `nbf` or `iat` is in the future (beyond the leeway).
    #[error("token is not valid yet")]
    NotYetValid,
}

impl TokenError {
    /// Stable CamelCase, for metrics and logs.
    pub fn reason(self) -> &'static str {
        match self {
            Self::TooLong => "TooLong",
            Self::Malformed => "Malformed",
            Self::Algorithm => "Algorithm",
            Self::Critical => "CriticalHeader",
            Self::Issuer => "Issuer",
            Self::UnknownKey => "UnknownKey",
            Self::BadSignature => "BadSignature",
            Self::Audience => "Audience",
            Self::MissingSubject => "MissingSubject",
            Self::MissingExpiry => "MissingExpiry",
            Self::Expired => "Expired",
            Self::NotYetValid => "NotYetValid",
        }
    }
}

impl From<JwsError> for TokenError {
    fn from(e: JwsError) -> Self {
        match e {
            JwsError::TooLong => Self::TooLong,
            JwsError::Malformed => Self::Malformed,
        }
    }
}

impl From<TimeError> for TokenError {
    fn from(e: TimeError) -> Self {
        match e {
            TimeError::MissingExpiry => Self::MissingExpiry,
            TimeError::Malformed => Self::Malformed,
            TimeError::Expired => Self::Expired,
            TimeError::NotYetValid => Self::NotYetValid,
        }
    }
}

/// What a verified token tells about its bearer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerifiedClaims {
    /// `sub`.
    pub subject: String,
    /// `email`, when it is a string.
    pub email: Option<String>,
    /// `groups`: an array of strings (or a single string); other shapes count as none.
    pub groups: Vec<String>,
    /// `exp`, unix seconds.
    pub expires_at: i64,
}

/// What the verifier expects of every token.
#[derive(Clone, Copy, Debug)]
pub struct Expectations<'a> {
    /// `iss` must equal this exactly.
    pub issuer: &'a str,
    /// `aud` must contain this (the OIDC client id).
    pub audience: &'a str,
}

#[derive(Deserialize)]
struct Claims {
    #[serde(default)]
    iss: Option<String>,
    #[serde(default)]
    sub: Option<String>,
    #[serde(default)]
    aud: Option<Audience>,
    #[serde(default)]
    exp: Option<f64>,
    #[serde(default)]
    nbf: Option<f64>,
    #[serde(default)]
    iat: Option<f64>,
    #[serde(default)]
    email: Option<serde_json::Value>,
    #[serde(default)]
    groups: Option<serde_json::Value>,
}

/// A token taken apart, with an acceptable algorithm and parsed claims, but whose
/// signature and claims are not checked yet. Nothing in it may be trusted, but its `kid`,
/// `alg` and `iss` tell a verifier which keys to look for (and whether looking is worth it).
pub struct Unverified<'a> {
    compact: jws::Compact<'a>,
    alg: Algorithm,
    claims: Claims,
}

impl std::fmt::Debug for Unverified<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The token is a credential: show only what selects a key.
        f.debug_struct("Unverified")
            .field("alg", &self.alg)
            .field("kid", &self.compact.header.kid)
            .finish_non_exhaustive()
    }
}

impl<'a> Unverified<'a> {
    /// Takes `token` apart. Never panics, whatever the input.
    pub fn parse(token: &'a str) -> Result<Self, TokenError> {
        let compact = jws::split(token, MAX_TOKEN_LEN)?;
        let alg = Algorithm::from_name(&compact.header.alg).ok_or(TokenError::Algorithm)?;
        if compact.header.crit.is_some() {
            return Err(TokenError::Critical);
        }
        let claims: Claims =
            serde_json::from_slice(&compact.payload).map_err(|_| TokenError::Malformed)?;
        Ok(Self {
            compact,
            alg,
            claims,
        })
    }

    /// The header's algorithm.
    pub fn algorithm(&self) -> Algorithm {
        self.alg
    }

    /// The header's key id.
    pub fn kid(&self) -> Option<&str> {
        self.compact.header.kid.as_deref()
    }

    /// Whether the (unverified) `iss` is `issuer`: a token that fails this is refused
    /// without looking for keys.
    pub fn check_issuer(&self, issuer: &str) -> Result<(), TokenError> {
        if self.claims.iss.as_deref() == Some(issuer) {
            Ok(())
        } else {
            Err(TokenError::Issuer)
        }
    }

    /// Whether `keys` has a key this token could be verified with.
    pub fn has_candidate(&self, keys: &KeySet) -> bool {
        keys.has_candidate(self.kid(), self.alg)
    }

    /// Verifies the signature with `keys`, then the claims, at `now` (unix seconds).
    pub fn verify(
        &self,
        keys: &KeySet,
        expect: &Expectations<'_>,
        now: i64,
    ) -> Result<VerifiedClaims, TokenError> {
        self.check_issuer(expect.issuer)?;
        // The signature first: nothing else in an unsigned token is worth believing.
        let mut candidates = keys.candidates(self.kid(), self.alg).peekable();
        if candidates.peek().is_none() {
            return Err(TokenError::UnknownKey);
        }
        if !candidates.any(|k| k.verify(self.compact.signing_input, &self.compact.signature)) {
            return Err(TokenError::BadSignature);
        }
        let claims = &self.claims;
        if !claims
            .aud
            .as_ref()
            .is_some_and(|a| a.contains(expect.audience))
        {
            return Err(TokenError::Audience);
        }
        let subject = claims
            .sub
            .as_deref()
            .filter(|s| !s.is_empty())
            .ok_or(TokenError::MissingSubject)?;
        let times = Times {
            exp: claims.exp,
            nbf: claims.nbf,
            iat: claims.iat,
        };
        let expires_at = times.check(now, LEEWAY_SECS)?;
        Ok(VerifiedClaims {
            subject: subject.to_string(),
            email: claims
                .email
                .as_ref()
                .and_then(serde_json::Value::as_str)
                .map(str::to_string),
            groups: groups(claims.groups.as_ref()),
            expires_at,
        })
    }
}

fn groups(value: Option<&serde_json::Value>) -> Vec<String> {
    match value {
        Some(serde_json::Value::String(one)) => vec![one.clone()],
        Some(serde_json::Value::Array(all)) => all
            .iter()
            .filter_map(serde_json::Value::as_str)
            .map(str::to_string)
            .collect(),
        _ => Vec::new(),
    }
}

/// Verifies `token` against `keys` at `now` (unix seconds): [`Unverified::parse`], then
/// [`Unverified::verify`].
pub fn verify(
    token: &str,
    keys: &KeySet,
    expect: &Expectations<'_>,
    now: i64,
) -> Result<VerifiedClaims, TokenError> {
    Unverified::parse(token)?.verify(keys, expect, now)
}
