//! The pure, algorithm-independent pieces of JWT handling: splitting a JWS in compact form
//! (RFC 7515 section 7.1), decoding its base64url JSON parts, JSON NumericDates, the `aud`
//! claim (a string or an array of strings), and the time rules on `exp`, `nbf` and `iat`.
//!
//! Nothing here checks a signature or knows about OIDC, so any verifier can use it (the
//! etcd-proxy's EdDSA zone tokens do the same splitting and time checks). Every function
//! is total: arbitrary input gives an error, never a panic.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::Deserialize;

/// Why a JWS could not be taken apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum JwsError {
    /// Longer than the caller's limit (checked before any decoding).
    #[error("token is too long")]
    TooLong,
    /// Not three base64url parts, or a part is not the JSON it should be.
    #[error("malformed token")]
    Malformed,
}

/// The protected header fields a verifier looks at. Unknown fields are ignored; `jku`,
/// `x5u` and `jwk` in particular are never followed: keys come only from the verifier's
/// own trust source.
#[derive(Clone, Debug, Deserialize)]
pub struct Header {
    /// The signature algorithm.
    pub alg: String,
    /// The key id, if any.
    #[serde(default)]
    pub kid: Option<String>,
    /// Critical extensions; a verifier that implements none must refuse a token that has
    /// any (RFC 7515 section 4.1.11).
    #[serde(default)]
    pub crit: Option<serde_json::Value>,
}

/// A JWS in compact form, taken apart but not verified.
#[derive(Clone, Debug)]
pub struct Compact<'a> {
    /// The decoded protected header.
    pub header: Header,
    /// The decoded payload bytes (the claims JSON of a JWT).
    pub payload: Vec<u8>,
    /// `<header b64>.<payload b64>`: the bytes the signature covers.
    pub signing_input: &'a [u8],
    /// The decoded signature.
    pub signature: Vec<u8>,
}

/// Splits `token` into its three parts and decodes them. Tokens longer than `max_len`
/// bytes are refused before any decoding.
pub fn split(token: &str, max_len: usize) -> Result<Compact<'_>, JwsError> {
    if token.len() > max_len {
        return Err(JwsError::TooLong);
    }
    let mut parts = token.split('.');
    let (Some(header_b64), Some(payload_b64), Some(signature_b64), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(JwsError::Malformed);
    };
    let header: Header = decode_json(header_b64)?;
    let payload = decode(payload_b64)?;
    let signature = decode(signature_b64)?;
    let signing_input = &token.as_bytes()[..header_b64.len() + 1 + payload_b64.len()];
    Ok(Compact {
        header,
        payload,
        signing_input,
        signature,
    })
}

/// Decodes one unpadded base64url part.
pub fn decode(part: &str) -> Result<Vec<u8>, JwsError> {
    URL_SAFE_NO_PAD
        .decode(part)
        .map_err(|_| JwsError::Malformed)
}

/// Decodes one base64url part holding JSON.
pub fn decode_json<T: for<'de> Deserialize<'de>>(part: &str) -> Result<T, JwsError> {
    serde_json::from_slice(&decode(part)?).map_err(|_| JwsError::Malformed)
}

/// The `aud` claim: one string or an array of strings (RFC 7519 section 4.1.3).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum Audience {
    /// A single audience.
    One(String),
    /// Several audiences.
    Many(Vec<String>),
}

impl Audience {
    /// Whether `wanted` is one of the audiences (exact comparison).
    pub fn contains(&self, wanted: &str) -> bool {
        match self {
            Self::One(a) => a == wanted,
            Self::Many(all) => all.iter().any(|a| a == wanted),
        }
    }
}

/// A JSON NumericDate as whole seconds; `None` when not a finite number in range.
pub fn numeric_date(value: f64) -> Option<i64> {
    // Beyond ±2^53 a float no longer holds whole seconds; such dates are nonsense anyway.
    const LIMIT: f64 = 9_007_199_254_740_992.0;
    if !value.is_finite() || value.abs() > LIMIT {
        return None;
    }
    #[allow(clippy::cast_possible_truncation)]
    Some(value.floor() as i64)
}

/// Why the times of a token are not acceptable now.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TimeError {
    /// There is no `exp`.
    #[error("token has no expiry")]
    MissingExpiry,
    /// A time claim is not a usable NumericDate.
    #[error("malformed token")]
    Malformed,
    /// `exp` has passed, beyond the leeway.
    #[error("token has expired")]
    Expired,
    /// `nbf` or `iat` is in the future, beyond the leeway.
    #[error("token is not valid yet")]
    NotYetValid,
}

/// The time claims of a token, as they were in the JSON.
#[derive(Clone, Copy, Debug, Default, PartialEq, Deserialize)]
pub struct Times {
    /// `exp`.
    #[serde(default)]
    pub exp: Option<f64>,
    /// `nbf`.
    #[serde(default)]
    pub nbf: Option<f64>,
    /// `iat`.
    #[serde(default)]
    pub iat: Option<f64>,
}

impl Times {
    /// Checks the times at `now` (unix seconds) with `leeway` seconds of clock skew: `exp`
    /// must be present and not passed, `nbf` and `iat` (when present) not in the future.
    /// Returns `exp` in whole seconds.
    pub fn check(&self, now: i64, leeway: i64) -> Result<i64, TimeError> {
        let exp = self.exp.ok_or(TimeError::MissingExpiry)?;
        let exp = numeric_date(exp).ok_or(TimeError::Malformed)?;
        if now >= exp.saturating_add(leeway) {
            return Err(TimeError::Expired);
        }
        for not_before in [self.nbf, self.iat].into_iter().flatten() {
            let not_before = numeric_date(not_before).ok_or(TimeError::Malformed)?;
            if not_before > now.saturating_add(leeway) {
                return Err(TimeError::NotYetValid);
            }
        }
        Ok(exp)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b64(s: &str) -> String {
        URL_SAFE_NO_PAD.encode(s)
    }

    #[test]
    fn splits_a_compact_jws() {
        let token = format!(
            "{}.{}.{}",
            b64(r#"{"alg":"ES256","kid":"k1","typ":"JWT"}"#),
            b64(r#"{"sub":"a"}"#),
            b64("sig")
        );
        let c = split(&token, 1024).unwrap();
        assert_eq!(c.header.alg, "ES256");
        assert_eq!(c.header.kid.as_deref(), Some("k1"));
        assert_eq!(c.payload, br#"{"sub":"a"}"#);
        assert_eq!(c.signature, b"sig");
        assert_eq!(
            c.signing_input,
            token.rsplit_once('.').unwrap().0.as_bytes()
        );
    }

    #[test]
    fn refuses_what_is_not_a_compact_jws() {
        let good_header = b64(r#"{"alg":"ES256"}"#);
        let cases = [
            ("empty", String::new(), JwsError::Malformed),
            (
                "two parts",
                format!("{good_header}.e30"),
                JwsError::Malformed,
            ),
            (
                "four parts",
                format!("{good_header}.e30.AA.AA"),
                JwsError::Malformed,
            ),
            (
                "padding",
                format!("{good_header}.e30=.AA"),
                JwsError::Malformed,
            ),
            (
                "standard alphabet",
                format!("{good_header}.e30.A+/A"),
                JwsError::Malformed,
            ),
            (
                "header not JSON",
                format!("{}.e30.AA", b64("nope")),
                JwsError::Malformed,
            ),
            (
                "header without alg",
                format!("{}.e30.AA", b64("{}")),
                JwsError::Malformed,
            ),
            (
                "duplicate alg",
                format!("{}.e30.AA", b64(r#"{"alg":"ES256","alg":"none"}"#)),
                JwsError::Malformed,
            ),
            (
                "kid not a string",
                format!("{}.e30.AA", b64(r#"{"alg":"x","kid":1}"#)),
                JwsError::Malformed,
            ),
            ("too long", "a".repeat(101), JwsError::TooLong),
        ];
        for (name, token, want) in cases {
            assert_eq!(split(&token, 100).err(), Some(want), "{name}");
        }
    }

    #[test]
    fn audience_is_a_string_or_an_array() {
        let one: Audience = serde_json::from_str(r#""kontinuum""#).unwrap();
        let many: Audience = serde_json::from_str(r#"["a","kontinuum"]"#).unwrap();
        assert!(one.contains("kontinuum") && many.contains("kontinuum"));
        assert!(!one.contains("kontinuu") && !many.contains("b"));
        assert!(serde_json::from_str::<Audience>("1").is_err());
    }

    #[test]
    fn time_rules_with_leeway() {
        const NOW: i64 = 1_800_000_000;
        let t = |exp: Option<i64>, nbf: Option<i64>, iat: Option<i64>| Times {
            #[allow(clippy::cast_precision_loss)]
            exp: exp.map(|v| v as f64),
            #[allow(clippy::cast_precision_loss)]
            nbf: nbf.map(|v| v as f64),
            #[allow(clippy::cast_precision_loss)]
            iat: iat.map(|v| v as f64),
        };
        assert_eq!(t(Some(NOW + 10), None, None).check(NOW, 60), Ok(NOW + 10));
        assert_eq!(t(Some(NOW - 59), None, None).check(NOW, 60), Ok(NOW - 59));
        assert_eq!(
            t(Some(NOW - 60), None, None).check(NOW, 60),
            Err(TimeError::Expired)
        );
        assert_eq!(
            t(None, None, None).check(NOW, 60),
            Err(TimeError::MissingExpiry)
        );
        let exp = Some(NOW + 600);
        assert!(
            t(exp, Some(NOW + 60), Some(NOW + 60))
                .check(NOW, 60)
                .is_ok()
        );
        assert_eq!(
            t(exp, Some(NOW + 61), None).check(NOW, 60),
            Err(TimeError::NotYetValid)
        );
        assert_eq!(
            t(exp, None, Some(NOW + 61)).check(NOW, 60),
            Err(TimeError::NotYetValid)
        );
        let nan = Times {
            exp: Some(f64::NAN),
            ..Times::default()
        };
        assert_eq!(nan.check(NOW, 60), Err(TimeError::Malformed));
        let huge = Times {
            exp: Some(1e300),
            ..Times::default()
        };
        assert_eq!(huge.check(NOW, 60), Err(TimeError::Malformed));
        // Fractions are allowed and floored.
        assert_eq!(numeric_date(1.9), Some(1));
    }
}
