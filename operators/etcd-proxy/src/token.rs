//! The bearer token a zone presents on every call: a JWS in compact form, signed with the
//! zone's ed25519 key (`alg: EdDSA`), claims `iss = sub = <zone name>`, `aud` containing
//! [`AUDIENCE`], `iat`, `nbf`, `exp` (DESIGN.md section 3, issue 11).
//!
//! [`verify`] is pure: the clock and the zone's trusted keys are passed in, so every rule is
//! unit-tested (and fuzzed with proptest) without a cluster. [`Signer`] is the relay's half.
//!
//! Failures are typed ([`TokenError`]) with a stable `reason()` for metrics and a short
//! message for the caller; an unknown zone and a bad signature read the same, so an
//! unauthenticated caller learns nothing about which zones or keys exist.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::signature::{ED25519, Ed25519KeyPair, KeyPair as _, UnparsedPublicKey};
use serde::{Deserialize, Serialize};

/// The audience every token must name.
pub const AUDIENCE: &str = "kontinuum-etcd-proxy";
/// Clock skew allowed on `exp`, `nbf` and `iat`, in seconds.
pub const LEEWAY_SECS: i64 = 30;
/// The longest lifetime (`exp - iat`) a token may claim, in seconds.
pub const MAX_LIFETIME_SECS: i64 = 600;
/// Longer tokens are refused before any decoding.
pub const MAX_TOKEN_LEN: usize = 8 * 1024;
/// The only accepted `alg`.
const ALGORITHM: &str = "EdDSA";

/// An ed25519 public key a zone may sign with, with the validity window of the certificate
/// it came from (unix seconds).
#[derive(Clone, PartialEq, Eq)]
pub struct TrustedKey {
    /// The raw 32-byte ed25519 public key.
    pub key: [u8; 32],
    /// The certificate's `notBefore`.
    pub not_before: i64,
    /// The certificate's `notAfter`.
    pub not_after: i64,
}

impl std::fmt::Debug for TrustedKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Public, but there is no reason to spread key material through logs.
        f.debug_struct("TrustedKey")
            .field("not_before", &self.not_before)
            .field("not_after", &self.not_after)
            .finish_non_exhaustive()
    }
}

/// Why a token was refused. The `Display` text is what the caller sees.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    /// No `authorization` metadata.
    #[error("missing authorization metadata")]
    Missing,
    /// `authorization` is not `Bearer <token>`.
    #[error("authorization is not a bearer token")]
    NotBearer,
    /// Not three base64url parts of JSON, or too long.
    #[error("malformed token")]
    Malformed,
    /// `alg` is not exactly `EdDSA`.
    #[error("token algorithm must be EdDSA")]
    Algorithm,
    /// The header lists critical extensions, none of which we implement.
    #[error("token has unsupported critical header parameters")]
    Critical,
    /// `sub` or `iss` is missing or empty.
    #[error("token has no subject")]
    MissingSubject,
    /// `iss != sub`.
    #[error("token issuer must equal its subject")]
    IssuerMismatch,
    /// `aud` does not contain [`AUDIENCE`].
    #[error("token audience does not include kontinuum-etcd-proxy")]
    Audience,
    /// No `exp`.
    #[error("token has no expiry")]
    MissingExpiry,
    /// No `iat`, so its lifetime is unknown.
    #[error("token has no issue time")]
    MissingIssuedAt,
    /// `exp` has passed (beyond the leeway).
    #[error("token has expired")]
    Expired,
    /// `nbf` or `iat` is in the future (beyond the leeway).
    #[error("token is not valid yet")]
    NotYetValid,
    /// `exp - iat` exceeds [`MAX_LIFETIME_SECS`].
    #[error("token lifetime exceeds 10 minutes")]
    LifetimeTooLong,
    /// No zone of that name is trusted.
    #[error("token is not signed by a known zone identity")]
    UnknownZone,
    /// The signature matches none of the zone's keys.
    #[error("token is not signed by a known zone identity")]
    BadSignature,
}

impl TokenError {
    /// Stable CamelCase, for the `reason` label of `authn_failures_total`.
    pub fn reason(self) -> &'static str {
        match self {
            Self::Missing => "MissingToken",
            Self::NotBearer => "NotBearer",
            Self::Malformed => "Malformed",
            Self::Algorithm => "Algorithm",
            Self::Critical => "CriticalHeader",
            Self::MissingSubject => "MissingSubject",
            Self::IssuerMismatch => "IssuerMismatch",
            Self::Audience => "Audience",
            Self::MissingExpiry => "MissingExpiry",
            Self::MissingIssuedAt => "MissingIssuedAt",
            Self::Expired => "Expired",
            Self::NotYetValid => "NotYetValid",
            Self::LifetimeTooLong => "LifetimeTooLong",
            Self::UnknownZone => "UnknownZone",
            Self::BadSignature => "BadSignature",
        }
    }
}

#[derive(Deserialize)]
struct Header {
    alg: String,
    #[serde(default)]
    crit: Option<serde_json::Value>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Audience {
    One(String),
    Many(Vec<String>),
}

impl Audience {
    fn contains(&self, wanted: &str) -> bool {
        match self {
            Self::One(a) => a == wanted,
            Self::Many(all) => all.iter().any(|a| a == wanted),
        }
    }
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
}

/// What a valid token proves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verified {
    /// The zone (`sub`).
    pub zone: String,
    /// The key that verified the signature (so a stream can notice its revocation).
    pub key: [u8; 32],
    /// `exp`, unix seconds.
    pub expires: i64,
}

/// Extracts the token from an `authorization` metadata value (`Bearer <token>`).
pub fn bearer(value: Option<&[u8]>) -> Result<&str, TokenError> {
    let value = value.ok_or(TokenError::Missing)?;
    let value = std::str::from_utf8(value).map_err(|_| TokenError::NotBearer)?;
    let (scheme, token) = value.split_once(' ').ok_or(TokenError::NotBearer)?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err(TokenError::NotBearer);
    }
    let token = token.trim();
    if token.is_empty() {
        return Err(TokenError::NotBearer);
    }
    Ok(token)
}

/// Verifies `token` at `now` (unix seconds). `keys_of(zone)` returns the keys the zone named
/// by `sub` may sign with, or `None` for an unknown zone. Never panics, whatever the input.
pub fn verify<K>(
    token: &str,
    now: i64,
    keys_of: impl FnOnce(&str) -> Option<K>,
) -> Result<Verified, TokenError>
where
    K: AsRef<[TrustedKey]>,
{
    verify_claims(token, now, keys_of).map(|(verified, _)| verified)
}

/// [`verify`], with the later of `iat` and `nbf` (what a cached token is checked against).
fn verify_claims<K>(
    token: &str,
    now: i64,
    keys_of: impl FnOnce(&str) -> Option<K>,
) -> Result<(Verified, i64), TokenError>
where
    K: AsRef<[TrustedKey]>,
{
    if token.len() > MAX_TOKEN_LEN {
        return Err(TokenError::Malformed);
    }
    let mut parts = token.split('.');
    let (Some(header_b64), Some(claims_b64), Some(signature_b64), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(TokenError::Malformed);
    };
    let header: Header = decode_json(header_b64)?;
    if header.alg != ALGORITHM {
        return Err(TokenError::Algorithm);
    }
    if header.crit.is_some() {
        return Err(TokenError::Critical);
    }
    let claims: Claims = decode_json(claims_b64)?;
    let signature = URL_SAFE_NO_PAD
        .decode(signature_b64)
        .map_err(|_| TokenError::Malformed)?;

    let sub = claims
        .sub
        .as_deref()
        .filter(|s| !s.is_empty())
        .ok_or(TokenError::MissingSubject)?;
    if claims.iss.as_deref() != Some(sub) {
        return Err(TokenError::IssuerMismatch);
    }

    // The signature first: nothing else in an unsigned token is worth believing.
    let keys = keys_of(sub).ok_or(TokenError::UnknownZone)?;
    let signed = &token.as_bytes()[..header_b64.len() + 1 + claims_b64.len()];
    let key = keys
        .as_ref()
        .iter()
        .filter(|k| k.not_before - LEEWAY_SECS <= now && now <= k.not_after + LEEWAY_SECS)
        .find(|k| {
            UnparsedPublicKey::new(&ED25519, &k.key[..])
                .verify(signed, &signature)
                .is_ok()
        })
        .ok_or(TokenError::BadSignature)?;

    if !claims.aud.as_ref().is_some_and(|a| a.contains(AUDIENCE)) {
        return Err(TokenError::Audience);
    }
    let exp = seconds(claims.exp).ok_or(TokenError::MissingExpiry)?;
    let iat = seconds(claims.iat).ok_or(TokenError::MissingIssuedAt)?;
    if now >= exp.saturating_add(LEEWAY_SECS) {
        return Err(TokenError::Expired);
    }
    if iat > now.saturating_add(LEEWAY_SECS) {
        return Err(TokenError::NotYetValid);
    }
    let mut valid_from = iat;
    if let Some(nbf) = claims.nbf {
        let nbf = seconds(Some(nbf)).ok_or(TokenError::Malformed)?;
        if nbf > now.saturating_add(LEEWAY_SECS) {
            return Err(TokenError::NotYetValid);
        }
        valid_from = valid_from.max(nbf);
    }
    if exp.saturating_sub(iat) > MAX_LIFETIME_SECS {
        return Err(TokenError::LifetimeTooLong);
    }
    let verified = Verified {
        zone: sub.to_string(),
        key: key.key,
        expires: exp,
    };
    Ok((verified, valid_from))
}

/// A JSON NumericDate as whole seconds; `None` when absent or not a finite number in range.
fn seconds(value: Option<f64>) -> Option<i64> {
    // Beyond ±2^53 a float no longer holds whole seconds; such dates are nonsense anyway.
    const LIMIT: f64 = 9_007_199_254_740_992.0;
    let value = value?;
    if !value.is_finite() || value.abs() > LIMIT {
        return None;
    }
    #[allow(clippy::cast_possible_truncation)]
    Some(value.floor() as i64)
}

fn decode_json<T: for<'de> Deserialize<'de>>(part: &str) -> Result<T, TokenError> {
    let bytes = URL_SAFE_NO_PAD
        .decode(part)
        .map_err(|_| TokenError::Malformed)?;
    serde_json::from_slice(&bytes).map_err(|_| TokenError::Malformed)
}

/// Errors loading a zone's signing key.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// The file is not a PEM `PRIVATE KEY`.
    #[error("the key is not a PEM PRIVATE KEY")]
    NotPem,
    /// The PKCS#8 document is not an ed25519 key.
    #[error("the key is not a PKCS#8 ed25519 key")]
    NotEd25519,
}

/// Signs the relay's tokens with the zone's ed25519 key.
pub struct Signer {
    key: Ed25519KeyPair,
    zone: String,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signer")
            .field("zone", &self.zone)
            .finish_non_exhaustive()
    }
}

#[derive(Serialize)]
struct OutHeader<'a> {
    alg: &'a str,
    typ: &'a str,
}

#[derive(Serialize)]
struct OutClaims<'a> {
    iss: &'a str,
    sub: &'a str,
    aud: [&'a str; 1],
    iat: i64,
    nbf: i64,
    exp: i64,
}

impl Signer {
    /// Loads a PKCS#8 PEM ed25519 key (`tls.key` of the zone's identity Secret).
    pub fn from_pkcs8_pem(pem: &[u8], zone: impl Into<String>) -> Result<Self, KeyError> {
        let der = crate::identity::pem_blocks(pem, "PRIVATE KEY")
            .into_iter()
            .next()
            .ok_or(KeyError::NotPem)?;
        let key =
            Ed25519KeyPair::from_pkcs8_maybe_unchecked(&der).map_err(|_| KeyError::NotEd25519)?;
        Ok(Self {
            key,
            zone: zone.into(),
        })
    }

    /// The zone this signer speaks for.
    pub fn zone(&self) -> &str {
        &self.zone
    }

    /// The raw public key.
    pub fn public_key(&self) -> [u8; 32] {
        let mut out = [0u8; 32];
        out.copy_from_slice(self.key.public_key().as_ref());
        out
    }

    /// A token issued at `now` (unix seconds), valid for `lifetime_secs`.
    pub fn sign(&self, now: i64, lifetime_secs: i64) -> String {
        let claims = OutClaims {
            iss: &self.zone,
            sub: &self.zone,
            aud: [AUDIENCE],
            iat: now,
            nbf: now,
            exp: now.saturating_add(lifetime_secs),
        };
        self.sign_raw(
            &OutHeader {
                alg: ALGORITHM,
                typ: "JWT",
            },
            &claims,
        )
    }

    /// Signs any header and claims (tests build bad tokens with it).
    pub fn sign_raw(&self, header: &impl Serialize, claims: &impl Serialize) -> String {
        // Serializing these plain structs and maps cannot fail; an empty object would be
        // refused by the proxy anyway.
        let header = serde_json::to_vec(header).unwrap_or_default();
        let claims = serde_json::to_vec(claims).unwrap_or_default();
        let mut token = URL_SAFE_NO_PAD.encode(header);
        token.push('.');
        token.push_str(&URL_SAFE_NO_PAD.encode(claims));
        let signature = self.key.sign(token.as_bytes());
        token.push('.');
        token.push_str(&URL_SAFE_NO_PAD.encode(signature.as_ref()));
        token
    }
}

/// Tokens already verified, so that a token presented again costs a map lookup instead of
/// an ed25519 verification. The relay's tokens are deterministic (ed25519 signatures are,
/// and the claims change once a second), so its calls within one second carry the same
/// bytes.
///
/// What the cache keeps is only what the token's bytes decide once and for all (the
/// signature by that key, `alg`, `aud`, `iss == sub`, the lifetime). On every hit, what can
/// change is checked again, as [`verify`] checks it: the key must still be one of the
/// zone's trusted keys and inside its certificate's validity (so revoking or rotating an
/// identity takes effect on the next call), `exp` must not have passed and `nbf`/`iat` must
/// not be in the future. Only tokens that passed [`verify`] are entered; the cache holds at
/// most `capacity` of them, dropping expired ones first.
pub struct VerifiedTokens {
    entries: std::sync::Mutex<std::collections::HashMap<Box<str>, Entry>>,
    capacity: usize,
}

struct Entry {
    verified: Verified,
    /// The later of `iat` and `nbf`.
    valid_from: i64,
}

impl std::fmt::Debug for VerifiedTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Tokens are credentials: never print them.
        f.debug_struct("VerifiedTokens")
            .field("len", &self.len())
            .field("capacity", &self.capacity)
            .finish_non_exhaustive()
    }
}

impl VerifiedTokens {
    /// An empty cache holding at most `capacity` tokens.
    pub fn new(capacity: usize) -> Self {
        Self {
            entries: std::sync::Mutex::new(std::collections::HashMap::new()),
            capacity,
        }
    }

    /// Tokens held now.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no token is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<Box<str>, Entry>> {
        self.entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// [`verify`], answered from the cache when `token` was verified before.
    pub fn verify<K>(
        &self,
        token: &str,
        now: i64,
        keys_of: impl FnOnce(&str) -> Option<K>,
    ) -> Result<Verified, TokenError>
    where
        K: AsRef<[TrustedKey]>,
    {
        if token.len() > MAX_TOKEN_LEN {
            return Err(TokenError::Malformed);
        }
        let hit = self
            .lock()
            .get(token)
            .map(|e| (e.verified.clone(), e.valid_from));
        if let Some((verified, valid_from)) = hit {
            let keys = keys_of(&verified.zone).ok_or(TokenError::UnknownZone)?;
            let still_trusted = keys.as_ref().iter().any(|k| {
                k.key == verified.key
                    && k.not_before - LEEWAY_SECS <= now
                    && now <= k.not_after + LEEWAY_SECS
            });
            if !still_trusted {
                return Err(TokenError::BadSignature);
            }
            if now >= verified.expires.saturating_add(LEEWAY_SECS) {
                return Err(TokenError::Expired);
            }
            if valid_from > now.saturating_add(LEEWAY_SECS) {
                return Err(TokenError::NotYetValid);
            }
            return Ok(verified);
        }
        let (verified, valid_from) = verify_claims(token, now, keys_of)?;
        let mut entries = self.lock();
        if entries.len() >= self.capacity {
            entries.retain(|_, e| now < e.verified.expires.saturating_add(LEEWAY_SECS));
            if entries.len() >= self.capacity {
                entries.clear();
            }
        }
        if self.capacity > 0 {
            entries.insert(
                token.into(),
                Entry {
                    verified: verified.clone(),
                    valid_from,
                },
            );
        }
        Ok(verified)
    }
}

/// Seconds since the Unix epoch.
pub fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use ring::rand::SystemRandom;
    use serde_json::json;

    use super::*;

    const NOW: i64 = 1_800_000_000;

    fn signer(zone: &str) -> Signer {
        let pkcs8 = Ed25519KeyPair::generate_pkcs8(&SystemRandom::new()).unwrap();
        let pem = format!(
            "-----BEGIN PRIVATE KEY-----\n{}\n-----END PRIVATE KEY-----\n",
            base64::engine::general_purpose::STANDARD.encode(pkcs8.as_ref())
        );
        Signer::from_pkcs8_pem(pem.as_bytes(), zone).unwrap()
    }

    fn trusted(s: &Signer) -> Vec<TrustedKey> {
        vec![TrustedKey {
            key: s.public_key(),
            not_before: NOW - 3600,
            not_after: NOW + 3600,
        }]
    }

    fn check(s: &Signer, token: &str) -> Result<Verified, TokenError> {
        let keys = trusted(s);
        verify(token, NOW, |zone| (zone == s.zone()).then_some(keys))
    }

    fn claims(lifetime: i64) -> serde_json::Value {
        json!({"iss": "eu-1a", "sub": "eu-1a", "aud": [AUDIENCE], "iat": NOW, "nbf": NOW,
               "exp": NOW + lifetime})
    }

    fn header() -> serde_json::Value {
        json!({"alg": "EdDSA", "typ": "JWT"})
    }

    #[test]
    fn a_fresh_token_verifies() {
        let s = signer("eu-1a");
        let v = check(&s, &s.sign(NOW, 300)).unwrap();
        assert_eq!(v.zone, "eu-1a");
        assert_eq!(v.key, s.public_key());
        assert_eq!(v.expires, NOW + 300);
        // Within the leeway on either side.
        assert!(check(&s, &s.sign(NOW + 29, 300)).is_ok());
        assert!(check(&s, &s.sign(NOW - 300 - 29, 300)).is_ok());
        // A single string audience is valid JWT too.
        let mut c = claims(300);
        c["aud"] = json!(AUDIENCE);
        assert!(check(&s, &s.sign_raw(&header(), &c)).is_ok());
    }

    #[test]
    fn every_rule_refuses_with_its_reason() {
        let s = signer("eu-1a");
        let other = signer("eu-1a");
        let with = |f: &dyn Fn(&mut serde_json::Value)| {
            let mut c = claims(300);
            f(&mut c);
            s.sign_raw(&header(), &c)
        };
        let cases: Vec<(&str, String, TokenError)> = vec![
            ("garbage", "not a token".into(), TokenError::Malformed),
            ("two parts", "a.b".into(), TokenError::Malformed),
            (
                "four parts",
                format!("{}.x", s.sign(NOW, 60)),
                TokenError::Malformed,
            ),
            ("expired", s.sign(NOW - 400, 300), TokenError::Expired),
            (
                "not yet valid",
                s.sign(NOW + 60, 300),
                TokenError::NotYetValid,
            ),
            (
                "nbf in the future",
                with(&|c| c["nbf"] = json!(NOW + 31)),
                TokenError::NotYetValid,
            ),
            ("too long", s.sign(NOW, 601), TokenError::LifetimeTooLong),
            (
                "no exp",
                with(&|c| {
                    c.as_object_mut().unwrap().remove("exp");
                }),
                TokenError::MissingExpiry,
            ),
            (
                "no iat",
                with(&|c| {
                    c.as_object_mut().unwrap().remove("iat");
                }),
                TokenError::MissingIssuedAt,
            ),
            ("wrong key", other.sign(NOW, 300), TokenError::BadSignature),
            (
                "alg none",
                format!(
                    "{}.{}.",
                    URL_SAFE_NO_PAD.encode(br#"{"alg":"none"}"#),
                    URL_SAFE_NO_PAD.encode(claims(300).to_string())
                ),
                TokenError::Algorithm,
            ),
            (
                "wrong audience",
                with(&|c| c["aud"] = json!(["kube"])),
                TokenError::Audience,
            ),
            (
                "no audience",
                with(&|c| {
                    c.as_object_mut().unwrap().remove("aud");
                }),
                TokenError::Audience,
            ),
            (
                "iss != sub",
                with(&|c| c["iss"] = json!("eu-1b")),
                TokenError::IssuerMismatch,
            ),
            (
                "no sub",
                with(&|c| {
                    c.as_object_mut().unwrap().remove("sub");
                }),
                TokenError::MissingSubject,
            ),
            (
                "unknown zone",
                with(&|c| {
                    c["iss"] = json!("eu-1ab");
                    c["sub"] = json!("eu-1ab");
                }),
                TokenError::UnknownZone,
            ),
            (
                "exp not a number",
                with(&|c| c["exp"] = json!("tomorrow")),
                TokenError::Malformed,
            ),
            (
                "crit",
                s.sign_raw(&json!({"alg": "EdDSA", "crit": ["b64"]}), &claims(300)),
                TokenError::Critical,
            ),
        ];
        for (name, token, want) in cases {
            assert_eq!(check(&s, &token), Err(want), "{name}");
        }
    }

    #[test]
    fn hs256_keyed_with_the_public_key_is_refused() {
        let s = signer("eu-1a");
        let signing_input = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(br#"{"alg":"HS256","typ":"JWT"}"#),
            URL_SAFE_NO_PAD.encode(claims(300).to_string())
        );
        let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &s.public_key());
        let tag = ring::hmac::sign(&key, signing_input.as_bytes());
        let token = format!("{signing_input}.{}", URL_SAFE_NO_PAD.encode(tag.as_ref()));
        assert_eq!(check(&s, &token), Err(TokenError::Algorithm));
        // Even with the header claiming EdDSA, an HMAC tag is not an ed25519 signature.
        let forged = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(br#"{"alg":"EdDSA"}"#),
            URL_SAFE_NO_PAD.encode(claims(300).to_string())
        );
        let tag = ring::hmac::sign(&key, forged.as_bytes());
        let token = format!("{forged}.{}", URL_SAFE_NO_PAD.encode(tag.as_ref()));
        assert_eq!(check(&s, &token), Err(TokenError::BadSignature));
    }

    #[test]
    fn every_flipped_signature_bit_is_refused() {
        let s = signer("eu-1a");
        let token = s.sign(NOW, 300);
        let (input, sig) = token.rsplit_once('.').unwrap();
        let sig = URL_SAFE_NO_PAD.decode(sig).unwrap();
        for bit in 0..sig.len() * 8 {
            let mut flipped = sig.clone();
            flipped[bit / 8] ^= 1 << (bit % 8);
            let bad = format!("{input}.{}", URL_SAFE_NO_PAD.encode(&flipped));
            assert_eq!(check(&s, &bad), Err(TokenError::BadSignature), "bit {bit}");
        }
    }

    #[test]
    fn a_key_outside_its_certificate_validity_is_not_trusted() {
        let s = signer("eu-1a");
        let keys = vec![TrustedKey {
            key: s.public_key(),
            not_before: NOW - 7200,
            not_after: NOW - 3600,
        }];
        let got = verify(&s.sign(NOW, 300), NOW, |_| Some(keys));
        assert_eq!(got, Err(TokenError::BadSignature));
    }

    #[test]
    fn a_rotated_zone_accepts_either_key() {
        let old = signer("eu-1a");
        let new = signer("eu-1a");
        let mut keys = trusted(&old);
        keys.extend(trusted(&new));
        for s in [&old, &new] {
            let v = verify(&s.sign(NOW, 300), NOW, |_| Some(keys.clone())).unwrap();
            assert_eq!(v.key, s.public_key());
        }
    }

    #[test]
    fn bearer_metadata_is_parsed_strictly() {
        assert_eq!(bearer(None), Err(TokenError::Missing));
        assert_eq!(bearer(Some(b"Bearer abc")), Ok("abc"));
        assert_eq!(bearer(Some(b"bearer abc")), Ok("abc"));
        assert_eq!(bearer(Some(b"Basic abc")), Err(TokenError::NotBearer));
        assert_eq!(bearer(Some(b"Bearer ")), Err(TokenError::NotBearer));
        assert_eq!(bearer(Some(b"abc")), Err(TokenError::NotBearer));
        assert_eq!(
            bearer(Some(&[0xff, 0x20, 0x41])),
            Err(TokenError::NotBearer)
        );
    }

    #[test]
    fn messages_do_not_tell_unknown_zones_from_bad_signatures() {
        assert_eq!(
            TokenError::UnknownZone.to_string(),
            TokenError::BadSignature.to_string()
        );
        assert_ne!(
            TokenError::UnknownZone.reason(),
            TokenError::BadSignature.reason()
        );
    }

    #[test]
    fn signing_is_deterministic_within_a_second() {
        // What lets the relay reuse a token within its second and the proxy cache it.
        let s = signer("eu-1a");
        assert_eq!(s.sign(NOW, 300), s.sign(NOW, 300));
        assert_ne!(s.sign(NOW, 300), s.sign(NOW + 1, 300));
    }

    #[test]
    fn a_cached_token_is_checked_again_for_what_can_change() {
        let s = signer("eu-1a");
        let other = signer("eu-1a");
        let keys = trusted(&s);
        let cache = VerifiedTokens::new(16);
        let token = s.sign(NOW, 300);
        let ok = |now| cache.verify(&token, now, |_| Some(keys.clone()));
        assert_eq!(ok(NOW).unwrap(), check(&s, &token).unwrap());
        assert_eq!(cache.len(), 1);
        assert!(ok(NOW + 1).is_ok());
        assert_eq!(cache.len(), 1, "the same token is one entry");

        // Revoked (no such zone now), rotated away, or the certificate expired: refused.
        let none: Option<Vec<TrustedKey>> = None;
        assert_eq!(
            cache.verify(&token, NOW, |_| none.clone()),
            Err(TokenError::UnknownZone)
        );
        assert_eq!(
            cache.verify(&token, NOW, |_| Some(trusted(&other))),
            Err(TokenError::BadSignature)
        );
        let ended = vec![TrustedKey {
            key: s.public_key(),
            not_before: NOW - 3600,
            not_after: NOW - 60,
        }];
        assert_eq!(
            cache.verify(&token, NOW, |_| Some(ended.clone())),
            Err(TokenError::BadSignature)
        );
        // Expired, or (the clock went back) not valid yet.
        assert_eq!(ok(NOW + 300 + LEEWAY_SECS), Err(TokenError::Expired));
        assert_eq!(ok(NOW - LEEWAY_SECS - 1), Err(TokenError::NotYetValid));
        // And still admitted when nothing changed.
        assert!(ok(NOW + 2).is_ok());
    }

    #[test]
    fn refused_tokens_are_never_cached() {
        let s = signer("eu-1a");
        let keys = trusted(&s);
        let cache = VerifiedTokens::new(16);
        let mut flipped = s.sign(NOW, 300).into_bytes();
        let last = flipped.len() - 2;
        flipped[last] = if flipped[last] == b'A' { b'B' } else { b'A' };
        let flipped = String::from_utf8(flipped).unwrap();
        for token in [flipped.as_str(), "garbage", &s.sign(NOW, 700)] {
            for _ in 0..2 {
                assert!(cache.verify(token, NOW, |_| Some(keys.clone())).is_err());
            }
        }
        assert!(cache.is_empty());
        // Nor one signed by a key the zone does not hold, later verified against a key
        // that would verify a different token.
        let other = signer("eu-1a");
        let foreign = other.sign(NOW, 300);
        assert!(cache.verify(&foreign, NOW, |_| Some(keys.clone())).is_err());
        assert!(cache.is_empty());
    }

    #[test]
    fn the_cache_is_bounded_and_drops_expired_tokens_first() {
        let s = signer("eu-1a");
        let keys = trusted(&s);
        let cache = VerifiedTokens::new(3);
        let at = |iat: i64, now: i64| {
            cache
                .verify(&s.sign(iat, 60), now, |_| Some(keys.clone()))
                .unwrap()
        };
        at(NOW, NOW);
        at(NOW + 1, NOW + 1);
        at(NOW + 100, NOW + 100);
        assert_eq!(cache.len(), 3);
        // Full: the two expired by NOW + 100 go, the live one stays.
        at(NOW + 101, NOW + 101);
        assert_eq!(cache.len(), 2);
        // Full of live tokens: the cache starts again rather than grow.
        at(NOW + 102, NOW + 102);
        at(NOW + 103, NOW + 103);
        assert!(cache.len() <= 3);
        assert!(
            cache
                .verify(&s.sign(NOW + 103, 60), NOW + 103, |_| Some(keys.clone()))
                .is_ok()
        );
        assert!(
            VerifiedTokens::new(0)
                .verify(&s.sign(NOW, 60), NOW, |_| Some(keys.clone()))
                .is_ok()
        );
    }

    mod fuzz {
        use proptest::prelude::*;

        use super::*;

        // Cases: proptest's default (256), or `PROPTEST_CASES` for a long run.
        proptest! {
            /// The cache answers exactly as `verify` would, whatever the sequence of tokens,
            /// clocks and trusted keys (revocation, rotation, expiry included).
            #[test]
            fn the_cache_answers_as_verify_does(
                calls in prop::collection::vec(
                    (0usize..6, -700i64..700, 0usize..4),
                    1..24,
                ),
            ) {
                let s = signer("eu-1a");
                let other = signer("eu-1a");
                let mut flipped = s.sign(NOW, 300).into_bytes();
                let last = flipped.len() - 2;
                flipped[last] = if flipped[last] == b'A' { b'B' } else { b'A' };
                let tokens = [
                    s.sign(NOW, 300),
                    s.sign(NOW - 200, 60),
                    s.sign(NOW + 200, 300),
                    s.sign(NOW, 700),
                    other.sign(NOW, 300),
                    String::from_utf8(flipped).unwrap(),
                ];
                let key_sets: [Option<Vec<TrustedKey>>; 4] = [
                    Some(trusted(&s)),
                    Some(trusted(&other)),
                    None,
                    Some(vec![TrustedKey {
                        key: s.public_key(),
                        not_before: NOW - 3600,
                        not_after: NOW,
                    }]),
                ];
                let cache = VerifiedTokens::new(4);
                for (token, offset, keys) in calls {
                    let (token, now, keys) = (&tokens[token], NOW + offset, &key_sets[keys]);
                    prop_assert_eq!(
                        cache.verify(token, now, |_| keys.clone()),
                        verify(token, now, |_| keys.clone())
                    );
                }
            }

            /// Arbitrary strings never panic the parser, and nothing unsigned is accepted.
            #[test]
            fn arbitrary_tokens_never_panic_nor_pass(token in ".{0,400}") {
                let s = signer("eu-1a");
                prop_assert!(check(&s, &token).is_err());
            }

            /// Structured garbage: three base64url parts of arbitrary bytes or JSON.
            #[test]
            fn arbitrary_parts_never_panic_nor_pass(
                header in prop::collection::vec(any::<u8>(), 0..64),
                claims_json in r#"\{("[a-z]{1,4}":(-?[0-9]{1,20}(\.[0-9]{1,3})?|"[a-z-]{0,8}"|\[("[a-z-]{0,21}",?){0,3}\]|null|true),?){0,8}\}"#,
                sig in prop::collection::vec(any::<u8>(), 0..80),
                alg_eddsa in any::<bool>(),
            ) {
                let s = signer("eu-1a");
                let header = if alg_eddsa {
                    br#"{"alg":"EdDSA"}"#.to_vec()
                } else {
                    header
                };
                let token = format!(
                    "{}.{}.{}",
                    URL_SAFE_NO_PAD.encode(header),
                    URL_SAFE_NO_PAD.encode(claims_json),
                    URL_SAFE_NO_PAD.encode(sig)
                );
                prop_assert!(check(&s, &token).is_err());
            }

            /// A signed token with arbitrary times: accepted exactly when every time rule holds.
            #[test]
            fn time_rules_hold(iat_off in -2000i64..2000, life in -100i64..1000) {
                let s = signer("eu-1a");
                let iat = NOW + iat_off;
                let exp = iat + life;
                let got = check(&s, &s.sign(iat, life));
                let valid = NOW < exp + LEEWAY_SECS
                    && iat <= NOW + LEEWAY_SECS
                    && life <= MAX_LIFETIME_SECS;
                prop_assert_eq!(got.is_ok(), valid, "iat {} exp {}", iat, exp);
            }
        }
    }
}
