//! The issuer's signing keys: a JWK Set (RFC 7517) parsed into the keys we can verify with,
//! and the signature check itself (ring).
//!
//! Three algorithms only, each tied to one key type so that a header cannot make us use a
//! key the wrong way: `RS256` (RSA, 2048 to 8192 bits, PKCS#1 v1.5 with SHA-256), `ES256`
//! (EC P-256 with SHA-256, signature `r || s`) and `EdDSA` (OKP Ed25519). `none` and the
//! `HS*` family are never accepted: a verifier holding only public keys must never treat a
//! key as an HMAC secret.
//!
//! Keys that we cannot or must not use are skipped, not errors: encryption keys (`use:
//! enc`), keys for other algorithms (`RS512`, P-384...), malformed entries. A JWKS may list
//! at most [`MAX_KEYS`] keys.

use std::fmt;

use ring::signature::{
    ECDSA_P256_SHA256_FIXED, ED25519, RSA_PKCS1_2048_8192_SHA256, RsaPublicKeyComponents,
    UnparsedPublicKey,
};
use serde::Deserialize;

use crate::jws;

/// The most keys a JWKS may hold; more is refused (each unmatched token would try them all).
pub const MAX_KEYS: usize = 64;
/// The smallest accepted RSA modulus, in bits.
pub const MIN_RSA_BITS: usize = 2048;
/// The largest accepted RSA modulus, in bits.
pub const MAX_RSA_BITS: usize = 8192;

/// A signature algorithm we accept.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// RSASSA-PKCS1-v1_5 with SHA-256.
    Rs256,
    /// ECDSA on P-256 with SHA-256.
    Es256,
    /// Ed25519.
    EdDsa,
}

impl Algorithm {
    /// Every accepted algorithm.
    pub const ALL: [Self; 3] = [Self::Rs256, Self::Es256, Self::EdDsa];

    /// The algorithm a JWS header's `alg` names, if we accept it. Exact, case-sensitive.
    pub fn from_name(alg: &str) -> Option<Self> {
        match alg {
            "RS256" => Some(Self::Rs256),
            "ES256" => Some(Self::Es256),
            "EdDSA" => Some(Self::EdDsa),
            _ => None,
        }
    }

    /// The `alg` name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Rs256 => "RS256",
            Self::Es256 => "ES256",
            Self::EdDsa => "EdDSA",
        }
    }

    /// The JWK `kty` this algorithm's keys have.
    pub fn key_type(self) -> &'static str {
        match self {
            Self::Rs256 => "RSA",
            Self::Es256 => "EC",
            Self::EdDsa => "OKP",
        }
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Clone, PartialEq, Eq)]
enum Material {
    /// Big-endian modulus without leading zeros, and exponent.
    Rsa { n: Vec<u8>, e: Vec<u8> },
    /// The uncompressed point `04 || x || y`.
    P256 { point: Vec<u8> },
    /// The raw public key.
    Ed25519 { x: Vec<u8> },
}

/// One public key of the issuer, usable with exactly one [`Algorithm`].
#[derive(Clone, PartialEq, Eq)]
pub struct PublicKey {
    kid: Option<String>,
    alg: Algorithm,
    material: Material,
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Public, but there is no reason to spread key material through logs.
        f.debug_struct("PublicKey")
            .field("kid", &self.kid)
            .field("alg", &self.alg)
            .finish_non_exhaustive()
    }
}

/// The JWK members we read; everything else is ignored.
#[derive(Deserialize)]
struct RawJwk {
    kty: String,
    #[serde(default)]
    kid: Option<String>,
    #[serde(default)]
    alg: Option<String>,
    #[serde(default, rename = "use")]
    use_: Option<String>,
    #[serde(default)]
    key_ops: Option<Vec<String>>,
    #[serde(default)]
    crv: Option<String>,
    #[serde(default)]
    n: Option<String>,
    #[serde(default)]
    e: Option<String>,
    #[serde(default)]
    x: Option<String>,
    #[serde(default)]
    y: Option<String>,
}

impl PublicKey {
    /// A key from one JWK (a JSON object), or `None` when it is not a signature key we can
    /// use.
    pub fn from_jwk(jwk: &serde_json::Value) -> Option<Self> {
        let raw = RawJwk::deserialize(jwk).ok()?;
        Self::from_raw(raw)
    }

    fn from_raw(raw: RawJwk) -> Option<Self> {
        if raw.use_.as_deref().is_some_and(|u| u != "sig") {
            return None;
        }
        if raw
            .key_ops
            .as_ref()
            .is_some_and(|ops| !ops.iter().any(|op| op == "verify"))
        {
            return None;
        }
        let alg = match raw.kty.as_str() {
            "RSA" => Algorithm::Rs256,
            "EC" => Algorithm::Es256,
            "OKP" => Algorithm::EdDsa,
            _ => return None,
        };
        // A key that names its algorithm may be used with that one only.
        if raw.alg.as_deref().is_some_and(|a| a != alg.name()) {
            return None;
        }
        let b64 = |v: Option<&String>| v.and_then(|s| jws::decode(s).ok());
        let material = match alg {
            Algorithm::Rs256 => {
                let n = b64(raw.n.as_ref())?;
                let e = b64(raw.e.as_ref())?;
                let n = strip_leading_zeros(&n);
                let e = strip_leading_zeros(&e);
                // Without leading zeros, the first byte (if any) has at most 7 leading zero bits.
                let bits = n.len() * 8 - n.first()?.leading_zeros() as usize;
                if !(MIN_RSA_BITS..=MAX_RSA_BITS).contains(&bits) || e.is_empty() || e.len() > 4 {
                    return None;
                }
                Material::Rsa {
                    n: n.to_vec(),
                    e: e.to_vec(),
                }
            }
            Algorithm::Es256 => {
                if raw.crv.as_deref() != Some("P-256") {
                    return None;
                }
                let x = b64(raw.x.as_ref())?;
                let y = b64(raw.y.as_ref())?;
                if x.len() != 32 || y.len() != 32 {
                    return None;
                }
                let mut point = Vec::with_capacity(65);
                point.push(4);
                point.extend_from_slice(&x);
                point.extend_from_slice(&y);
                Material::P256 { point }
            }
            Algorithm::EdDsa => {
                if raw.crv.as_deref() != Some("Ed25519") {
                    return None;
                }
                let x = b64(raw.x.as_ref())?;
                if x.len() != 32 {
                    return None;
                }
                Material::Ed25519 { x }
            }
        };
        Some(Self {
            kid: raw.kid,
            alg,
            material,
        })
    }

    /// The key id, if the JWK had one.
    pub fn kid(&self) -> Option<&str> {
        self.kid.as_deref()
    }

    /// The one algorithm this key verifies.
    pub fn algorithm(&self) -> Algorithm {
        self.alg
    }

    /// Whether `signature` is this key's signature of `message`.
    pub fn verify(&self, message: &[u8], signature: &[u8]) -> bool {
        match &self.material {
            Material::Rsa { n, e } => RsaPublicKeyComponents { n, e }
                .verify(&RSA_PKCS1_2048_8192_SHA256, message, signature)
                .is_ok(),
            Material::P256 { point } => UnparsedPublicKey::new(&ECDSA_P256_SHA256_FIXED, point)
                .verify(message, signature)
                .is_ok(),
            Material::Ed25519 { x } => UnparsedPublicKey::new(&ED25519, x)
                .verify(message, signature)
                .is_ok(),
        }
    }
}

fn strip_leading_zeros(bytes: &[u8]) -> &[u8] {
    let first = bytes.iter().position(|b| *b != 0).unwrap_or(bytes.len());
    &bytes[first..]
}

/// Why a JWKS document was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum JwksError {
    /// Not a JSON object with a `keys` array.
    #[error("the JWKS is not a JSON object with a keys array")]
    NotAJwks,
    /// More than [`MAX_KEYS`] keys.
    #[error("the JWKS lists more than 64 keys")]
    TooManyKeys,
}

/// The usable keys of one JWKS.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeySet {
    keys: Vec<PublicKey>,
    skipped: usize,
}

#[derive(Deserialize)]
struct RawJwks {
    keys: Vec<serde_json::Value>,
}

impl KeySet {
    /// Parses a JWKS document (`{"keys": [...]}`). Keys we cannot use are skipped and
    /// counted in [`KeySet::skipped`].
    pub fn from_jwks_json(bytes: &[u8]) -> Result<Self, JwksError> {
        let raw: RawJwks = serde_json::from_slice(bytes).map_err(|_| JwksError::NotAJwks)?;
        if raw.keys.len() > MAX_KEYS {
            return Err(JwksError::TooManyKeys);
        }
        let total = raw.keys.len();
        let keys: Vec<PublicKey> = raw.keys.iter().filter_map(PublicKey::from_jwk).collect();
        Ok(Self {
            skipped: total - keys.len(),
            keys,
        })
    }

    /// A key set of the given keys.
    pub fn new(keys: Vec<PublicKey>) -> Self {
        Self { keys, skipped: 0 }
    }

    /// The usable keys.
    pub fn keys(&self) -> &[PublicKey] {
        &self.keys
    }

    /// How many keys of the document were skipped as unusable.
    pub fn skipped(&self) -> usize {
        self.skipped
    }

    /// Whether there is no usable key.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The keys a token with this header may be verified with: the algorithm must match,
    /// and so must the key id when the token names one. (Without a `kid`, every key of the
    /// algorithm is a candidate, as RFC 7515 allows.)
    pub fn candidates<'a>(
        &'a self,
        kid: Option<&'a str>,
        alg: Algorithm,
    ) -> impl Iterator<Item = &'a PublicKey> + 'a {
        self.keys
            .iter()
            .filter(move |k| k.alg == alg && (kid.is_none() || k.kid.as_deref() == kid))
    }

    /// Whether any key could verify a token with this header.
    pub fn has_candidate(&self, kid: Option<&str>, alg: Algorithm) -> bool {
        self.candidates(kid, alg).next().is_some()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn b64(bytes: &[u8]) -> String {
        base64::Engine::encode(&base64::engine::general_purpose::URL_SAFE_NO_PAD, bytes)
    }

    fn ec(kid: &str) -> serde_json::Value {
        json!({"kty": "EC", "crv": "P-256", "kid": kid, "x": b64(&[1; 32]), "y": b64(&[2; 32])})
    }

    fn rsa(bits: usize) -> serde_json::Value {
        let mut n = vec![0xff; bits / 8];
        n.insert(0, 0); // a leading zero, as some encoders write it
        json!({"kty": "RSA", "kid": "r", "n": b64(&n), "e": "AQAB"})
    }

    #[test]
    fn keys_are_tied_to_one_algorithm() {
        let set = KeySet::from_jwks_json(
            json!({"keys": [
                ec("e"),
                rsa(2048),
                {"kty": "OKP", "crv": "Ed25519", "kid": "o", "x": b64(&[3; 32])},
            ]})
            .to_string()
            .as_bytes(),
        )
        .unwrap();
        assert_eq!(set.keys().len(), 3);
        assert_eq!(set.skipped(), 0);
        let algs: Vec<_> = set.keys().iter().map(PublicKey::algorithm).collect();
        assert_eq!(algs, [Algorithm::Es256, Algorithm::Rs256, Algorithm::EdDsa]);
        assert!(set.has_candidate(Some("e"), Algorithm::Es256));
        // The right kid with the wrong algorithm is no candidate.
        assert!(!set.has_candidate(Some("e"), Algorithm::Rs256));
        assert!(!set.has_candidate(Some("x"), Algorithm::Es256));
        assert_eq!(set.candidates(None, Algorithm::Rs256).count(), 1);
    }

    #[test]
    fn unusable_keys_are_skipped() {
        let skipped = [
            json!({"kty": "oct", "k": "c2VjcmV0"}),
            json!({"kty": "RSA", "alg": "RS512", "n": rsa(2048)["n"], "e": "AQAB"}),
            json!({"kty": "RSA", "use": "enc", "n": rsa(2048)["n"], "e": "AQAB"}),
            json!({"kty": "RSA", "key_ops": ["encrypt"], "n": rsa(2048)["n"], "e": "AQAB"}),
            rsa(1024),
            json!({"kty": "RSA", "n": rsa(2048)["n"], "e": b64(&[1; 5])}),
            json!({"kty": "EC", "crv": "P-384", "x": b64(&[1; 48]), "y": b64(&[2; 48])}),
            json!({"kty": "EC", "crv": "P-256", "x": b64(&[1; 31]), "y": b64(&[2; 32])}),
            json!({"kty": "EC", "crv": "P-256", "alg": "ES384", "x": b64(&[1; 32]), "y": b64(&[2; 32])}),
            json!({"kty": "OKP", "crv": "Ed448", "x": b64(&[3; 57])}),
            json!({"kty": "OKP", "crv": "Ed25519", "x": "not base64!"}),
            json!({"kty": "EC"}),
            json!("not an object"),
        ];
        let doc = json!({ "keys": skipped });
        let set = KeySet::from_jwks_json(doc.to_string().as_bytes()).unwrap();
        assert!(set.is_empty(), "{set:?}");
        assert_eq!(set.skipped(), skipped.len());
    }

    #[test]
    fn refuses_what_is_not_a_jwks() {
        for doc in ["", "[]", r#"{"keys": {}}"#, r#"{"key": []}"#, "null"] {
            assert_eq!(
                KeySet::from_jwks_json(doc.as_bytes()),
                Err(JwksError::NotAJwks),
                "{doc}"
            );
        }
        let many: Vec<_> = (0..=MAX_KEYS).map(|i| ec(&i.to_string())).collect();
        let doc = json!({ "keys": many }).to_string();
        assert_eq!(
            KeySet::from_jwks_json(doc.as_bytes()),
            Err(JwksError::TooManyKeys)
        );
    }

    #[test]
    fn debug_shows_no_key_material() {
        let key = PublicKey::from_jwk(&ec("e")).unwrap();
        let shown = format!("{key:?}");
        assert!(
            shown.contains("Es256") && !shown.contains("point"),
            "{shown}"
        );
    }
}
