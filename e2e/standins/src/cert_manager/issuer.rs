//! The issuer controller of the cert-manager stand-in.
//!
//! Reconciles: `ClusterIssuer`s and `Issuer`s (`cert-manager.io/v1`).
//! Owns: their `status.conditions[type=Ready]`, with field manager [`FIELD_MANAGER`].
//! Triggered by: issuer changes; Secrets (metadata) in the namespace a `ca` issuer reads its
//! key pair from (the cluster resource namespace for ClusterIssuers, the Issuer's own
//! namespace for Issuers).
//! Never: writes an issuer's spec, or any Secret (a `ca` issuer's Secret is the user's).
//!
//! Readiness follows cert-manager's issuer setup: `selfSigned` is always usable (`IsReady`);
//! `ca` when its Secret holds a matching `tls.crt`/`tls.key` (`KeyPairVerified`, else
//! `ErrGetKeyPair` / `ErrInvalidKeyPair`); `acme` only when the stand-in was given a test CA
//! (`ACMEAccountRegistered`, else `ErrRegisterACMEAccount`: no ACME server is reachable).

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kontinuum_crds::conditions::{self, ConditionStatus};
use kontinuum_operator_common::error::ReconcileError;
use kube::runtime::controller::Action;
use kube::{Api, Resource, ResourceExt as _};

use super::types::{IssuerConfig, IssuerStatus};
use super::{Ctx, FIELD_MANAGER, RESYNC};
use crate::pki::CaKeyPair;

/// cert-manager's reason for a usable self-signed issuer.
pub const REASON_IS_READY: &str = "IsReady";
/// cert-manager's reason for a CA issuer whose key pair was read and verified.
pub const REASON_KEY_PAIR_VERIFIED: &str = "KeyPairVerified";
/// cert-manager's reason for a CA issuer whose Secret could not be read.
pub const REASON_ERR_GET_KEY_PAIR: &str = "ErrGetKeyPair";
/// cert-manager's reason for a CA issuer whose Secret holds no usable key pair.
pub const REASON_ERR_INVALID_KEY_PAIR: &str = "ErrInvalidKeyPair";
/// cert-manager's reason for a registered ACME account.
pub const REASON_ACME_REGISTERED: &str = "ACMEAccountRegistered";
/// cert-manager's reason for an ACME account that could not be registered.
pub const REASON_ACME_FAILED: &str = "ErrRegisterACMEAccount";
/// The stand-in's reason for issuer types it does not implement (vault, venafi, none).
pub const REASON_UNSUPPORTED: &str = "UnsupportedIssuerType";

/// Errors of the issuer reconcile.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Reading the issuer itself failed.
    #[error("reading the issuer")]
    Get(#[source] kube::Error),
    /// Reading a `ca` issuer's Secret failed (other than not found).
    #[error("reading secret {secret}")]
    GetSecret {
        /// `namespace/name`.
        secret: String,
        /// The cause.
        #[source]
        source: kube::Error,
    },
    /// Writing the status failed.
    #[error("writing the issuer status")]
    PatchStatus(#[source] kube::Error),
}

impl ReconcileError for Error {
    fn reason(&self) -> &'static str {
        match self {
            Self::Get(_) => "GetFailed",
            Self::GetSecret { .. } => "SecretReadFailed",
            Self::PatchStatus(_) => "StatusPatchFailed",
        }
    }
}

/// What the observe step found about a `ca` issuer's Secret.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CaSecret {
    /// The Secret does not exist.
    Missing,
    /// It exists but holds no usable key pair (why, without key material).
    Invalid(String),
    /// It holds a certificate and the matching key.
    Valid,
}

/// Pure: the `Ready` condition of an issuer from its configuration, what was observed of a
/// `ca` issuer's Secret, and whether the stand-in has a test CA for `acme`.
pub fn ready_condition(
    config: &IssuerConfig,
    secret_name: Option<&str>,
    ca_secret: Option<&CaSecret>,
    has_acme_ca: bool,
    generation: Option<i64>,
) -> Condition {
    let (status, reason, message) = if config.self_signed.is_some() {
        (ConditionStatus::True, REASON_IS_READY, String::new())
    } else if config.ca.is_some() {
        let name = secret_name.unwrap_or_default();
        match ca_secret {
            Some(CaSecret::Valid) => (
                ConditionStatus::True,
                REASON_KEY_PAIR_VERIFIED,
                "Signing CA verified".to_owned(),
            ),
            Some(CaSecret::Invalid(why)) => (
                ConditionStatus::False,
                REASON_ERR_INVALID_KEY_PAIR,
                format!("Invalid signing key pair: secret {name:?}: {why}"),
            ),
            Some(CaSecret::Missing) | None => (
                ConditionStatus::False,
                REASON_ERR_GET_KEY_PAIR,
                format!("Error getting keypair for CA issuer: secret {name:?} not found"),
            ),
        }
    } else if config.acme.is_some() {
        if has_acme_ca {
            (
                ConditionStatus::True,
                REASON_ACME_REGISTERED,
                "The ACME account was registered with the ACME server".to_owned(),
            )
        } else {
            (
                ConditionStatus::False,
                REASON_ACME_FAILED,
                "Failed to register ACME account: the cert-manager stand-in has no test CA \
                 (--acme-ca-cert/--acme-ca-key) and cannot reach an ACME server"
                    .to_owned(),
            )
        }
    } else {
        (
            ConditionStatus::False,
            REASON_UNSUPPORTED,
            "The cert-manager stand-in supports selfSigned, ca and acme issuers only".to_owned(),
        )
    };
    conditions::new(conditions::READY, status, reason, message, generation)
}

/// Pure: the status to write, keeping `lastTransitionTime` when the status did not flip.
pub fn desired_status(
    current: Option<&IssuerStatus>,
    ready: Condition,
    now: &Time,
) -> IssuerStatus {
    let mut conditions: Vec<Condition> = current
        .map(|s| s.conditions.clone())
        .unwrap_or_default()
        .into_iter()
        .filter(|c| c.type_ == conditions::READY)
        .collect();
    conditions::set(&mut conditions, ready, now);
    IssuerStatus { conditions }
}

/// Reads and checks a `ca` issuer's Secret.
pub async fn observe_ca_secret(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> Result<CaSecret, Error> {
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let secret = crate::with_timeout(api.get_opt(name))
        .await
        .map_err(|source| Error::GetSecret {
            secret: format!("{namespace}/{name}"),
            source,
        })?;
    let Some(secret) = secret else {
        return Ok(CaSecret::Missing);
    };
    Ok(match ca_key_pair(&secret) {
        Ok(_) => CaSecret::Valid,
        Err(why) => CaSecret::Invalid(why),
    })
}

/// The CA key pair in a Secret (`tls.crt`, `tls.key`), or why there is none.
pub fn ca_key_pair(secret: &Secret) -> Result<CaKeyPair, String> {
    let data = secret.data.as_ref();
    let cert = data.and_then(|d| d.get("tls.crt"));
    let key = data.and_then(|d| d.get("tls.key"));
    match (cert, key) {
        (Some(cert), Some(key)) => CaKeyPair::from_pem(&cert.0, &key.0).map_err(|e| e.to_string()),
        _ => Err("it must hold tls.crt and tls.key".to_owned()),
    }
}

/// Reconciles one ClusterIssuer or Issuer: `namespace` is where a `ca` Secret is read from.
pub(super) async fn apply<K>(
    issuer: &K,
    config: &IssuerConfig,
    current: Option<&IssuerStatus>,
    api: &Api<K>,
    secret_namespace: &str,
    ctx: &Ctx,
) -> Result<Action, Error>
where
    K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    // 1. observe
    let secret_name = config.ca.as_ref().map(|ca| ca.secret_name.as_str());
    let ca_secret = match secret_name {
        Some(name) => Some(observe_ca_secret(&ctx.client, secret_namespace, name).await?),
        None => None,
    };
    // 2. plan
    let ready = ready_condition(
        config,
        secret_name,
        ca_secret.as_ref(),
        ctx.settings.acme_ca.is_some(),
        issuer.meta().generation,
    );
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let status = desired_status(current, ready, &now);
    // 3./4. report
    let written = crate::with_timeout(kontinuum_operator_common::status::apply_status(
        api,
        &issuer.name_any(),
        FIELD_MANAGER,
        current,
        &status,
    ))
    .await
    .map_err(Error::PatchStatus)?;
    if written {
        let ready = conditions::get(&status.conditions, conditions::READY);
        tracing::info!(
            kind = K::kind(&()).as_ref(),
            ready = ready.map(|c| c.status.as_str()),
            reason = ready.map(|c| c.reason.as_str()),
            "issuer status changed"
        );
    }
    Ok(Action::requeue(RESYNC))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cert_manager::types::{AcmeIssuer, CaIssuer};

    fn self_signed() -> IssuerConfig {
        IssuerConfig {
            self_signed: Some(serde_json::json!({})),
            ..IssuerConfig::default()
        }
    }

    fn ca() -> IssuerConfig {
        IssuerConfig {
            ca: Some(CaIssuer {
                secret_name: "root".into(),
            }),
            ..IssuerConfig::default()
        }
    }

    fn acme() -> IssuerConfig {
        IssuerConfig {
            acme: Some(AcmeIssuer::default()),
            ..IssuerConfig::default()
        }
    }

    #[test]
    fn self_signed_is_always_ready() {
        let c = ready_condition(&self_signed(), None, None, false, Some(2));
        assert_eq!((c.status.as_str(), c.reason.as_str()), ("True", "IsReady"));
        assert_eq!(c.observed_generation, Some(2));
    }

    #[test]
    fn ca_needs_its_secret() {
        let c = ready_condition(&ca(), Some("root"), Some(&CaSecret::Missing), false, None);
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("False", "ErrGetKeyPair")
        );
        assert!(c.message.contains("\"root\""), "{}", c.message);
        let c = ready_condition(
            &ca(),
            Some("root"),
            Some(&CaSecret::Invalid("bad".into())),
            false,
            None,
        );
        assert_eq!(c.reason, "ErrInvalidKeyPair");
        let c = ready_condition(&ca(), Some("root"), Some(&CaSecret::Valid), false, None);
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("True", "KeyPairVerified")
        );
    }

    #[test]
    fn acme_needs_the_test_ca() {
        let c = ready_condition(&acme(), None, None, false, None);
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("False", "ErrRegisterACMEAccount")
        );
        let c = ready_condition(&acme(), None, None, true, None);
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("True", "ACMEAccountRegistered")
        );
    }

    #[test]
    fn unsupported_types_are_not_ready() {
        let c = ready_condition(&IssuerConfig::default(), None, None, true, None);
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("False", REASON_UNSUPPORTED)
        );
    }

    #[test]
    fn the_transition_time_moves_only_on_a_flip() {
        use k8s_openapi::jiff::Timestamp;
        let t1 = Time(Timestamp::from_second(1_000).unwrap());
        let t2 = Time(Timestamp::from_second(2_000).unwrap());
        let first = desired_status(
            None,
            ready_condition(
                &ca(),
                Some("root"),
                Some(&CaSecret::Missing),
                false,
                Some(1),
            ),
            &t1,
        );
        let same = desired_status(
            Some(&first),
            ready_condition(
                &ca(),
                Some("root"),
                Some(&CaSecret::Missing),
                false,
                Some(1),
            ),
            &t2,
        );
        assert_eq!(
            same, first,
            "nothing changed: the same status, nothing to write"
        );
        let flipped = desired_status(
            Some(&first),
            ready_condition(&ca(), Some("root"), Some(&CaSecret::Valid), false, Some(1)),
            &t2,
        );
        assert_eq!(flipped.conditions[0].last_transition_time, t2);
    }
}
