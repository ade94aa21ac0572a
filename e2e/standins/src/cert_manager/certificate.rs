//! The certificate controller of the cert-manager stand-in.
//!
//! Reconciles: `Certificate`s (`cert-manager.io/v1`).
//! Owns: the `spec.secretName` Secret's type, data (`tls.crt`, `tls.key`, `ca.crt`), the
//! `cert-manager.io/*` annotations and `secretTemplate` labels/annotations (field manager
//! [`FIELD_MANAGER`]); the Certificate's `status` conditions `Ready` and `Issuing`,
//! `notBefore`, `notAfter`, `renewalTime` and `revision`.
//! Triggered by: Certificate changes; Secrets (metadata) named by a Certificate's
//! `secretName`; ClusterIssuer and Issuer changes (mapped to the Certificates naming them).
//! Never: signs with an issuer that does not exist or is not `Ready` (that Certificate is
//! `Ready=False`, reason `IssuerNotFound` / `IssuerNotReady`, and gets no Secret); deletes
//! a Secret (as cert-manager, the Secret outlives its Certificate unless owner references are
//! asked for).
//!
//! A stored certificate is kept while it matches the spec (names, CA flag), was issued by
//! the referenced issuer (the `cert-manager.io/issuer-*` annotations), holds a key that
//! belongs to it, and has not reached its renewal time; otherwise a fresh key and
//! certificate are issued (`rotationPolicy: Always`, cert-manager's default since v1.18).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kontinuum_crds::conditions::{self, ConditionStatus};
use kontinuum_operator_common::error::ReconcileError;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Resource as _, ResourceExt as _};

use super::types::{
    Certificate, CertificateStatus, ClusterIssuer, GROUP, Issuer, IssuerConfig, parse_go_duration,
};
use super::{Ctx, FIELD_MANAGER, RESYNC};
use crate::pki::{self, CaKeyPair, CertificateInfo, CertificateRequest, KeyAlgorithm, Signer};

/// Condition type of an issuance in progress (cert-manager's).
pub const ISSUING: &str = "Issuing";
/// `Ready=True`: the stored certificate is current.
pub const REASON_READY: &str = "Ready";
/// The referenced issuer does not exist (or is of a group the stand-in does not serve).
pub const REASON_ISSUER_NOT_FOUND: &str = "IssuerNotFound";
/// The referenced issuer exists but is not `Ready`.
pub const REASON_ISSUER_NOT_READY: &str = "IssuerNotReady";
/// `spec.privateKey` asks for a key cert-manager would refuse.
pub const REASON_INVALID_KEY_SPEC: &str = "InvalidPrivateKeySpec";
/// A name in the spec cannot be put in a certificate.
pub const REASON_INVALID_SPEC: &str = "InvalidSpec";

/// Annotation: the Certificate a Secret was issued for.
pub const ANNOTATION_CERTIFICATE_NAME: &str = "cert-manager.io/certificate-name";
/// Annotation: the issuer's name.
pub const ANNOTATION_ISSUER_NAME: &str = "cert-manager.io/issuer-name";
/// Annotation: the issuer's kind.
pub const ANNOTATION_ISSUER_KIND: &str = "cert-manager.io/issuer-kind";
/// Annotation: the issuer's group.
pub const ANNOTATION_ISSUER_GROUP: &str = "cert-manager.io/issuer-group";
/// Annotation: the common name.
pub const ANNOTATION_COMMON_NAME: &str = "cert-manager.io/common-name";
/// Annotation: the DNS names, comma separated.
pub const ANNOTATION_ALT_NAMES: &str = "cert-manager.io/alt-names";
/// Annotation: the IP addresses, comma separated.
pub const ANNOTATION_IP_SANS: &str = "cert-manager.io/ip-sans";
/// Annotation: the URIs, comma separated.
pub const ANNOTATION_URI_SANS: &str = "cert-manager.io/uri-sans";
/// Label cert-manager puts on the Secrets it writes.
pub const LABEL_FAO: &str = "controller.cert-manager.io/fao";

/// cert-manager's default lifetime (90 days).
pub const DEFAULT_DURATION_SECONDS: i64 = 2160 * 3600;

/// Errors of the certificate reconcile.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The Certificate has no namespace.
    #[error("the certificate has no namespace")]
    MissingNamespace,
    /// Reading the Certificate itself failed.
    #[error("reading the certificate")]
    Get(#[source] kube::Error),
    /// Reading a Secret failed.
    #[error("reading secret {secret}")]
    GetSecret {
        /// `namespace/name`.
        secret: String,
        /// The cause.
        #[source]
        source: kube::Error,
    },
    /// The issuer's signing key pair is unusable (its issuer will say so too).
    #[error("the signing key pair of issuer {issuer} is unusable: {why}")]
    Signer {
        /// `Kind/name`.
        issuer: String,
        /// Why (no key material).
        why: String,
    },
    /// Signing failed.
    #[error("issuing the certificate")]
    Issue(#[source] pki::PkiError),
    /// Writing the Secret failed.
    #[error("writing secret {secret}")]
    WriteSecret {
        /// `namespace/name`.
        secret: String,
        /// The cause.
        #[source]
        source: kube::Error,
    },
    /// Writing the status failed.
    #[error("writing the certificate status")]
    PatchStatus(#[source] kube::Error),
}

impl ReconcileError for Error {
    fn reason(&self) -> &'static str {
        match self {
            Self::MissingNamespace => "MissingNamespace",
            Self::Get(_) => "GetFailed",
            Self::GetSecret { .. } => "SecretReadFailed",
            Self::Signer { .. } => "SignerUnusable",
            Self::Issue(_) => "IssueFailed",
            Self::WriteSecret { .. } => "SecretWriteFailed",
            Self::PatchStatus(_) => "StatusPatchFailed",
        }
    }
}

/// What was observed of the referenced issuer.
#[derive(Clone, Debug, PartialEq)]
pub enum IssuerState {
    /// It does not exist (or is not served by the stand-in); the message says which.
    NotFound(String),
    /// It exists but is not `Ready`; the message says which.
    NotReady(String),
    /// It is `Ready`, with its configuration.
    Ready(IssuerConfig),
}

/// What was observed of the Certificate's Secret.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StoredSecret {
    /// The stored certificate, if `tls.crt` parses.
    pub certificate: Option<CertificateInfo>,
    /// Whether `tls.key` belongs to `tls.crt`.
    pub key_matches: bool,
    /// The `cert-manager.io/issuer-{name,kind,group}` annotations.
    pub issuer: (String, String, String),
}

/// Pure: the decision of one reconcile.
#[derive(Clone, Debug, PartialEq)]
pub enum Plan {
    /// The stored certificate is current; renew at the given time (Unix seconds).
    Keep {
        /// The stored certificate.
        certificate: CertificateInfo,
        /// When to renew.
        renewal: i64,
    },
    /// Issue a new certificate (the reason is cert-manager's `Issuing` reason).
    Issue {
        /// Why (`DoesNotExist`, `SecretMismatch`, ...).
        reason: &'static str,
        /// What to put in it.
        request: CertificateRequest,
        /// Key algorithm.
        algorithm: KeyAlgorithm,
        /// The issuer's configuration.
        issuer: IssuerConfig,
    },
    /// Issuance is needed but cannot happen now; `Ready=False` with this reason.
    Blocked {
        /// The `Issuing` reason (why issuance is needed).
        issuing: &'static str,
        /// The `Ready` reason (why it cannot happen).
        reason: &'static str,
        /// The `Ready` message.
        message: String,
    },
}

/// The lifetime and renew-before of a Certificate, in seconds, with cert-manager's defaults.
pub fn lifetime(cert: &Certificate) -> (i64, i64) {
    let duration = cert
        .spec
        .duration
        .as_deref()
        .and_then(parse_go_duration)
        .filter(|d| *d > 0)
        .unwrap_or(DEFAULT_DURATION_SECONDS);
    let renew_before = cert
        .spec
        .renew_before
        .as_deref()
        .and_then(parse_go_duration)
        .filter(|r| *r > 0 && *r < duration)
        .unwrap_or(duration / 3);
    (duration, renew_before)
}

/// The issuer's `Kind.group/name`, as cert-manager names it in messages.
pub fn issuer_display(cert: &Certificate) -> String {
    let r = &cert.spec.issuer_ref;
    format!("{}.{}/{}", r.kind(), r.group(), r.name)
}

/// Pure: why a stored certificate must be (re)issued, as cert-manager's `Issuing` reason,
/// or `None` when it is current.
pub fn issuance_reason(
    cert: &Certificate,
    request: &CertificateRequest,
    secret: Option<&StoredSecret>,
    now: i64,
) -> Option<&'static str> {
    let Some(secret) = secret else {
        return Some("DoesNotExist");
    };
    let Some(stored) = secret.certificate.as_ref() else {
        return Some("MissingData");
    };
    if !secret.key_matches {
        return Some("InvalidKeyPair");
    }
    let r = &cert.spec.issuer_ref;
    if secret.issuer != (r.name.clone(), r.kind().to_owned(), r.group().to_owned()) {
        return Some("IncorrectIssuer");
    }
    let mut dns = request.dns_names.clone();
    dns.sort();
    dns.dedup();
    let mut ips = request.ip_addresses.clone();
    ips.sort();
    let mut uris = request.uris.clone();
    uris.sort();
    let cn = request.common_name.clone().filter(|c| !c.is_empty());
    if stored.dns_names != dns
        || stored.ip_addresses != ips
        || stored.uris != uris
        || stored.common_name != cn
        || stored.is_ca != request.is_ca
    {
        return Some("SecretMismatch");
    }
    if now >= stored.not_after {
        return Some("Expired");
    }
    let (_, renew_before) = lifetime(cert);
    if now >= stored.not_after - renew_before {
        return Some("Renewing");
    }
    None
}

/// Pure: what a Certificate's spec asks to be issued, valid from `now`.
pub fn request(cert: &Certificate, now: i64) -> Result<CertificateRequest, String> {
    let (duration, _) = lifetime(cert);
    let ip_addresses = cert
        .spec
        .ip_addresses
        .iter()
        .map(|ip| {
            ip.parse::<IpAddr>()
                .map_err(|_| format!("invalid IP address {ip:?}"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let dns_names = cert.spec.dns_names.clone();
    if dns_names.is_empty()
        && ip_addresses.is_empty()
        && cert.spec.uris.is_empty()
        && cert
            .spec
            .common_name
            .as_deref()
            .unwrap_or_default()
            .is_empty()
    {
        return Err("at least one of commonName, dnsNames, ipAddresses or uris must be set".into());
    }
    Ok(CertificateRequest {
        common_name: cert.spec.common_name.clone().filter(|c| !c.is_empty()),
        dns_names,
        ip_addresses,
        uris: cert.spec.uris.clone(),
        is_ca: cert.spec.is_ca,
        not_before: now,
        not_after: now + duration,
    })
}

/// Pure: the decision for a Certificate given its issuer and Secret.
pub fn plan(
    cert: &Certificate,
    issuer: &IssuerState,
    secret: Option<&StoredSecret>,
    now: i64,
) -> Plan {
    let request = match request(cert, now) {
        Ok(r) => r,
        Err(message) => {
            return Plan::Blocked {
                issuing: "Failed",
                reason: REASON_INVALID_SPEC,
                message,
            };
        }
    };
    let Some(reason) = issuance_reason(cert, &request, secret, now) else {
        // issuance_reason returned None, so the stored certificate exists.
        if let Some(certificate) = secret.and_then(|s| s.certificate.clone()) {
            let (_, renew_before) = lifetime(cert);
            let renewal = certificate.not_after - renew_before;
            return Plan::Keep {
                certificate,
                renewal,
            };
        }
        return Plan::Blocked {
            issuing: "MissingData",
            reason: "MissingData",
            message: "the stored certificate could not be read".into(),
        };
    };
    let key = cert.spec.private_key.clone().unwrap_or_default();
    let Some(algorithm) = KeyAlgorithm::from_spec(key.algorithm.as_deref(), key.size) else {
        return Plan::Blocked {
            issuing: "Failed",
            reason: REASON_INVALID_KEY_SPEC,
            message: format!(
                "unsupported private key algorithm {:?} with size {:?}",
                key.algorithm, key.size
            ),
        };
    };
    match issuer {
        IssuerState::NotFound(message) => Plan::Blocked {
            issuing: reason,
            reason: REASON_ISSUER_NOT_FOUND,
            message: message.clone(),
        },
        IssuerState::NotReady(message) => Plan::Blocked {
            issuing: reason,
            reason: REASON_ISSUER_NOT_READY,
            message: message.clone(),
        },
        IssuerState::Ready(config) => Plan::Issue {
            reason,
            request,
            algorithm,
            issuer: config.clone(),
        },
    }
}

fn time_of(seconds: i64) -> Option<Time> {
    Timestamp::from_second(seconds).ok().map(Time)
}

/// Pure: the status after `plan` was carried out. `issued` is the certificate written this
/// reconcile (for `Plan::Issue`).
pub fn desired_status(
    cert: &Certificate,
    plan: &Plan,
    issued: Option<(&CertificateInfo, i64)>,
    now: &Time,
) -> CertificateStatus {
    let current = cert.status.clone().unwrap_or_default();
    let generation = cert.metadata.generation;
    let mut conds: Vec<Condition> = current
        .conditions
        .iter()
        .filter(|c| c.type_ == conditions::READY || c.type_ == ISSUING)
        .cloned()
        .collect();
    let mut status = CertificateStatus {
        revision: current.revision,
        not_before: current.not_before.clone(),
        not_after: current.not_after.clone(),
        renewal_time: current.renewal_time.clone(),
        ..CertificateStatus::default()
    };
    let ready_true = conditions::new(
        conditions::READY,
        ConditionStatus::True,
        REASON_READY,
        "Certificate is up to date and has not expired",
        generation,
    );
    let current_certificate = match (plan, issued) {
        (
            Plan::Keep {
                certificate,
                renewal,
            },
            _,
        ) => Some((certificate, *renewal)),
        (Plan::Issue { .. }, Some((certificate, renewal))) => Some((certificate, renewal)),
        _ => None,
    };
    if let Some((certificate, renewal)) = current_certificate {
        conditions::set(&mut conds, ready_true, now);
        conditions::remove(&mut conds, ISSUING);
        status.not_before = time_of(certificate.not_before);
        status.not_after = time_of(certificate.not_after);
        status.renewal_time = time_of(renewal);
        if matches!(plan, Plan::Issue { .. }) {
            status.revision = Some(current.revision.unwrap_or(0) + 1);
        }
    } else {
        let (issuing, ready) = match plan {
            Plan::Blocked {
                issuing,
                reason,
                message,
            } => (
                *issuing,
                Some(conditions::new(
                    conditions::READY,
                    ConditionStatus::False,
                    *reason,
                    message.clone(),
                    generation,
                )),
            ),
            Plan::Issue { reason, .. } => (*reason, None),
            Plan::Keep { .. } => ("", None),
        };
        if let Some(ready) = ready {
            conditions::set(&mut conds, ready, now);
        }
        conditions::set(
            &mut conds,
            conditions::new(
                ISSUING,
                ConditionStatus::True,
                issuing,
                issuing_message(issuing),
                generation,
            ),
            now,
        );
    }
    status.conditions = conds;
    status
}

fn issuing_message(reason: &str) -> &'static str {
    match reason {
        "DoesNotExist" => "Issuing certificate as Secret does not exist",
        "MissingData" => "Issuing certificate as Secret does not contain a certificate",
        "InvalidKeyPair" => {
            "Issuing certificate as Secret contains a private key that does not match the certificate"
        }
        "IncorrectIssuer" => {
            "Issuing certificate as Secret was previously issued by another issuer"
        }
        "SecretMismatch" => "Issuing certificate as Secret does not match the Certificate spec",
        "Expired" => "Issuing certificate as Secret contains an expired certificate",
        "Renewing" => "Renewing certificate as renewal was scheduled",
        _ => "The certificate cannot be issued",
    }
}

/// The observe step: the issuer's state from the stores.
pub fn observe_issuer(cert: &Certificate, namespace: &str, ctx: &Ctx) -> IssuerState {
    let r = &cert.spec.issuer_ref;
    let display = issuer_display(cert);
    if r.group() != GROUP {
        return IssuerState::NotFound(format!(
            "Referenced issuer {display} is of a group the cert-manager stand-in does not serve"
        ));
    }
    let found = match r.kind() {
        "ClusterIssuer" => ctx
            .cluster_issuers
            .get(&ObjectRef::<ClusterIssuer>::new(&r.name))
            .map(|i| {
                (
                    i.spec.config.clone(),
                    i.status.clone(),
                    i.metadata.generation,
                )
            }),
        "Issuer" => ctx
            .issuers
            .get(&ObjectRef::<Issuer>::new(&r.name).within(namespace))
            .map(|i| {
                (
                    i.spec.config.clone(),
                    i.status.clone(),
                    i.metadata.generation,
                )
            }),
        other => {
            return IssuerState::NotFound(format!(
                "Referenced issuer kind {other:?} is not Issuer or ClusterIssuer"
            ));
        }
    };
    let Some((config, status, generation)) = found else {
        return IssuerState::NotFound(format!("Referenced {display} not found"));
    };
    let ready = status
        .as_ref()
        .and_then(|s| conditions::get(&s.conditions, conditions::READY));
    match ready {
        Some(c)
            if c.status == "True"
                && c.observed_generation.is_none_or(|g| Some(g) == generation) =>
        {
            IssuerState::Ready(config)
        }
        _ => IssuerState::NotReady(format!(
            "Referenced {display} does not have a Ready status condition"
        )),
    }
}

/// The observe step: the Certificate's Secret.
pub async fn observe_secret(
    ctx: &Ctx,
    namespace: &str,
    name: &str,
) -> Result<Option<StoredSecret>, Error> {
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), namespace);
    let secret = crate::with_timeout(api.get_opt(name))
        .await
        .map_err(|source| Error::GetSecret {
            secret: format!("{namespace}/{name}"),
            source,
        })?;
    Ok(secret.map(|s| stored_secret(&s)))
}

/// What a Secret says about the certificate in it.
pub fn stored_secret(secret: &Secret) -> StoredSecret {
    let data = secret.data.clone().unwrap_or_default();
    let cert = data.get("tls.crt").map(|b| b.0.clone()).unwrap_or_default();
    let key = data.get("tls.key").map(|b| b.0.clone()).unwrap_or_default();
    let annotations = secret.annotations();
    let annotation = |k: &str| annotations.get(k).cloned().unwrap_or_default();
    StoredSecret {
        certificate: pki::inspect(&cert).ok(),
        key_matches: pki::key_matches(&cert, &key),
        issuer: (
            annotation(ANNOTATION_ISSUER_NAME),
            annotation(ANNOTATION_ISSUER_KIND),
            annotation(ANNOTATION_ISSUER_GROUP),
        ),
    }
}

/// Pure: the Secret to apply for an issued certificate.
pub fn secret_for(cert: &Certificate, namespace: &str, issued: &pki::Issued) -> Secret {
    let r = &cert.spec.issuer_ref;
    let template = cert.spec.secret_template.clone().unwrap_or_default();
    let mut annotations = template.annotations;
    let join = |v: &[String]| v.join(",");
    annotations.extend([
        (ANNOTATION_CERTIFICATE_NAME.to_owned(), cert.name_any()),
        (ANNOTATION_ISSUER_NAME.to_owned(), r.name.clone()),
        (ANNOTATION_ISSUER_KIND.to_owned(), r.kind().to_owned()),
        (ANNOTATION_ISSUER_GROUP.to_owned(), r.group().to_owned()),
        (
            ANNOTATION_COMMON_NAME.to_owned(),
            cert.spec.common_name.clone().unwrap_or_default(),
        ),
        (ANNOTATION_ALT_NAMES.to_owned(), join(&cert.spec.dns_names)),
        (ANNOTATION_IP_SANS.to_owned(), join(&cert.spec.ip_addresses)),
        (ANNOTATION_URI_SANS.to_owned(), join(&cert.spec.uris)),
    ]);
    let mut labels = template.labels;
    labels.insert(LABEL_FAO.to_owned(), "true".to_owned());
    let data: BTreeMap<String, ByteString> = [
        ("tls.crt", &issued.cert_pem),
        ("tls.key", &issued.key_pem),
        ("ca.crt", &issued.ca_pem),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), ByteString(v.as_bytes().to_vec())))
    .collect();
    Secret {
        metadata: ObjectMeta {
            name: Some(cert.spec.secret_name.clone()),
            namespace: Some(namespace.to_owned()),
            annotations: Some(annotations),
            labels: Some(labels),
            ..ObjectMeta::default()
        },
        type_: Some("kubernetes.io/tls".to_owned()),
        data: Some(data),
        ..Secret::default()
    }
}

/// The signer of an issuer configuration (the `ca` Secret read now; the `acme` test CA).
async fn signer_key_pair(
    config: &IssuerConfig,
    cert: &Certificate,
    namespace: &str,
    ctx: &Ctx,
) -> Result<Option<Arc<CaKeyPair>>, Error> {
    if config.self_signed.is_some() {
        return Ok(None);
    }
    let display = issuer_display(cert);
    if let Some(ca) = &config.ca {
        let secret_ns = if cert.spec.issuer_ref.kind() == "ClusterIssuer" {
            ctx.settings.cluster_resource_namespace.as_str()
        } else {
            namespace
        };
        let api: Api<Secret> = Api::namespaced(ctx.client.clone(), secret_ns);
        let secret = crate::with_timeout(api.get(&ca.secret_name))
            .await
            .map_err(|source| Error::GetSecret {
                secret: format!("{secret_ns}/{}", ca.secret_name),
                source,
            })?;
        return super::issuer::ca_key_pair(&secret)
            .map(|pair| Some(Arc::new(pair)))
            .map_err(|why| Error::Signer {
                issuer: display,
                why,
            });
    }
    if config.acme.is_some() {
        return ctx
            .settings
            .acme_ca
            .clone()
            .map(Some)
            .ok_or_else(|| Error::Signer {
                issuer: display,
                why: "no test CA was given".into(),
            });
    }
    Err(Error::Signer {
        issuer: display,
        why: "unsupported issuer type".into(),
    })
}

/// Reconciles one Certificate: observe → plan → act → report.
pub(super) async fn apply(cert: &Certificate, ctx: &Ctx) -> Result<Action, Error> {
    let namespace = cert.namespace().ok_or(Error::MissingNamespace)?;
    // 1. observe
    let issuer_state = observe_issuer(cert, &namespace, ctx);
    let secret = observe_secret(ctx, &namespace, &cert.spec.secret_name).await?;
    let now = Timestamp::now();
    // 2. plan
    let plan = plan(cert, &issuer_state, secret.as_ref(), now.as_second());
    tracing::debug!(?plan, "planned");
    // 3. act
    let mut issued_info = None;
    if let Plan::Issue {
        reason,
        request,
        algorithm,
        issuer,
    } = &plan
    {
        let signer = signer_key_pair(issuer, cert, &namespace, ctx).await?;
        let request = request.clone();
        let algorithm = *algorithm;
        // Key generation (RSA especially) is CPU work: keep it off the reactor.
        let issued = tokio::task::spawn_blocking(move || {
            let signer = match signer.as_deref() {
                Some(ca) => Signer::Ca(ca),
                None => Signer::SelfSigned,
            };
            pki::issue(&request, algorithm, &signer)
        })
        .await
        .map_err(|_| Error::Issue(pki::PkiError::Generate("any")))?
        .map_err(Error::Issue)?;
        let secret = secret_for(cert, &namespace, &issued);
        let api: Api<Secret> = Api::namespaced(ctx.client.clone(), &namespace);
        crate::with_timeout(api.patch(
            &cert.spec.secret_name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&secret),
        ))
        .await
        .map_err(|source| Error::WriteSecret {
            secret: format!("{namespace}/{}", cert.spec.secret_name),
            source,
        })?;
        let info = pki::inspect(issued.cert_pem.as_bytes()).map_err(Error::Issue)?;
        let (_, renew_before) = lifetime(cert);
        tracing::info!(reason, secret = %cert.spec.secret_name, "issued certificate");
        // An Event that cannot be published in time is not worth failing the reconcile.
        let _ = tokio::time::timeout(
            crate::API_TIMEOUT,
            ctx.events.normal(
                &cert.object_ref(&()),
                "Issuing",
                "Issue",
                "The certificate has been successfully issued".to_owned(),
            ),
        )
        .await;
        issued_info = Some((info.clone(), info.not_after - renew_before));
    }
    // 4. report
    let status = desired_status(
        cert,
        &plan,
        issued_info.as_ref().map(|(i, r)| (i, *r)),
        &Time(now),
    );
    let api: Api<Certificate> = Api::namespaced(ctx.client.clone(), &namespace);
    crate::with_timeout(kontinuum_operator_common::status::apply_status(
        &api,
        &cert.name_any(),
        FIELD_MANAGER,
        cert.status.as_ref(),
        &status,
    ))
    .await
    .map_err(Error::PatchStatus)?;
    let ready = |s: Option<&CertificateStatus>| {
        s.and_then(|s| conditions::get(&s.conditions, conditions::READY))
            .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
    };
    if let Some((state, reason, message)) = ready(Some(&status))
        && state == "False"
        && ready(cert.status.as_ref()).map(|(s, r, _)| (s, r)) != Some((state, reason.clone()))
    {
        let _ = tokio::time::timeout(
            crate::API_TIMEOUT,
            ctx.events
                .warning(&cert.object_ref(&()), &reason, "Issue", message),
        )
        .await;
    }
    let renewal = match (&plan, &issued_info) {
        (Plan::Keep { renewal, .. }, _) | (_, Some((_, renewal))) => Some(*renewal),
        _ => None,
    };
    Ok(match renewal {
        Some(renewal) => {
            let wait = u64::try_from(renewal.saturating_sub(now.as_second())).unwrap_or(0);
            Action::requeue(Duration::from_secs(wait.clamp(1, RESYNC.as_secs())))
        }
        // Waiting for the issuer: its changes trigger this Certificate.
        _ => Action::requeue(RESYNC),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cert_manager::types::{CertificateSpec, IssuerRef, PrivateKeySpec};

    const NOW: i64 = 1_800_000_000;

    fn cert(names: &[&str]) -> Certificate {
        let mut c = Certificate::new(
            "web",
            CertificateSpec {
                secret_name: "web-tls".into(),
                issuer_ref: IssuerRef {
                    name: "root".into(),
                    kind: Some("ClusterIssuer".into()),
                    group: None,
                },
                dns_names: names.iter().map(|n| (*n).to_owned()).collect(),
                private_key: Some(PrivateKeySpec {
                    algorithm: Some("ECDSA".into()),
                    size: None,
                }),
                ..CertificateSpec::default()
            },
        );
        c.metadata.namespace = Some("ns".into());
        c.metadata.generation = Some(3);
        c
    }

    fn self_signed() -> IssuerState {
        IssuerState::Ready(IssuerConfig {
            self_signed: Some(serde_json::json!({})),
            ..IssuerConfig::default()
        })
    }

    fn stored_for(c: &Certificate, at: i64) -> StoredSecret {
        let Plan::Issue {
            request, algorithm, ..
        } = plan(c, &self_signed(), None, at)
        else {
            panic!("expected issuance");
        };
        let issued = pki::issue(&request, algorithm, &Signer::SelfSigned).unwrap();
        stored_secret(&secret_for(c, "ns", &issued))
    }

    #[test]
    fn a_missing_secret_is_issued_when_the_issuer_is_ready() {
        let c = cert(&["a.example.com"]);
        let p = plan(&c, &self_signed(), None, NOW);
        let Plan::Issue {
            reason, request, ..
        } = &p
        else {
            panic!("{p:?}");
        };
        assert_eq!(*reason, "DoesNotExist");
        assert_eq!(request.dns_names, ["a.example.com"]);
        assert_eq!(
            request.not_after - request.not_before,
            DEFAULT_DURATION_SECONDS
        );
    }

    #[test]
    fn a_missing_or_unready_issuer_blocks_issuance() {
        let c = cert(&["a.example.com"]);
        for (issuer, reason) in [
            (
                IssuerState::NotFound("gone".into()),
                REASON_ISSUER_NOT_FOUND,
            ),
            (
                IssuerState::NotReady("not yet".into()),
                REASON_ISSUER_NOT_READY,
            ),
        ] {
            let p = plan(&c, &issuer, None, NOW);
            assert!(
                matches!(&p, Plan::Blocked { reason: r, .. } if *r == reason),
                "{p:?}"
            );
            let status = desired_status(&c, &p, None, &Time(Timestamp::UNIX_EPOCH));
            let ready = conditions::get(&status.conditions, "Ready").unwrap();
            assert_eq!(
                (ready.status.as_str(), ready.reason.as_str()),
                ("False", reason)
            );
            assert_eq!(ready.observed_generation, Some(3));
            assert!(conditions::is_true(&status.conditions, ISSUING));
            assert_eq!(status.revision, None);
        }
    }

    #[test]
    fn a_current_certificate_is_kept_whatever_the_issuer_state() {
        let c = cert(&["a.example.com"]);
        let stored = stored_for(&c, NOW);
        for issuer in [self_signed(), IssuerState::NotReady("down".into())] {
            let p = plan(&c, &issuer, Some(&stored), NOW + 60);
            let Plan::Keep { renewal, .. } = p else {
                panic!("{p:?}");
            };
            assert_eq!(renewal, NOW + DEFAULT_DURATION_SECONDS * 2 / 3);
        }
    }

    #[test]
    fn changed_dns_names_are_reissued() {
        let c = cert(&["a.example.com"]);
        let stored = stored_for(&c, NOW);
        let changed = cert(&["a.example.com", "b.example.com"]);
        let p = plan(&changed, &self_signed(), Some(&stored), NOW + 60);
        assert!(
            matches!(
                p,
                Plan::Issue {
                    reason: "SecretMismatch",
                    ..
                }
            ),
            "{p:?}"
        );
    }

    #[test]
    fn a_certificate_of_another_issuer_or_past_renewal_is_reissued() {
        let c = cert(&["a.example.com"]);
        let mut stored = stored_for(&c, NOW);
        let renewal = NOW + DEFAULT_DURATION_SECONDS * 2 / 3;
        let p = plan(&c, &self_signed(), Some(&stored), renewal);
        assert!(
            matches!(
                p,
                Plan::Issue {
                    reason: "Renewing",
                    ..
                }
            ),
            "{p:?}"
        );
        let p = plan(
            &c,
            &self_signed(),
            Some(&stored),
            NOW + DEFAULT_DURATION_SECONDS,
        );
        assert!(
            matches!(
                p,
                Plan::Issue {
                    reason: "Expired",
                    ..
                }
            ),
            "{p:?}"
        );
        stored.issuer.0 = "other".into();
        let p = plan(&c, &self_signed(), Some(&stored), NOW + 60);
        assert!(
            matches!(
                p,
                Plan::Issue {
                    reason: "IncorrectIssuer",
                    ..
                }
            ),
            "{p:?}"
        );
        stored.key_matches = false;
        let p = plan(&c, &self_signed(), Some(&stored), NOW + 60);
        assert!(
            matches!(
                p,
                Plan::Issue {
                    reason: "InvalidKeyPair",
                    ..
                }
            ),
            "{p:?}"
        );
    }

    #[test]
    fn issuing_sets_ready_times_and_bumps_the_revision() {
        let c = cert(&["a.example.com"]);
        let stored = stored_for(&c, NOW);
        let info = stored.certificate.clone().unwrap();
        let p = plan(&c, &self_signed(), None, NOW);
        let status = desired_status(
            &c,
            &p,
            Some((&info, NOW + 10)),
            &Time(Timestamp::UNIX_EPOCH),
        );
        assert!(conditions::is_true(&status.conditions, "Ready"));
        assert!(conditions::get(&status.conditions, ISSUING).is_none());
        assert_eq!(status.revision, Some(1));
        assert_eq!(status.not_before.unwrap().0.as_second(), NOW);
        assert_eq!(status.renewal_time.unwrap().0.as_second(), NOW + 10);
    }

    #[test]
    fn keeping_is_idempotent() {
        let mut c = cert(&["a.example.com"]);
        let stored = stored_for(&c, NOW);
        let p = plan(&c, &self_signed(), Some(&stored), NOW + 60);
        let t = Time(Timestamp::from_second(NOW).unwrap());
        let first = desired_status(&c, &p, None, &t);
        c.status = Some(first.clone());
        let t2 = Time(Timestamp::from_second(NOW + 120).unwrap());
        let second = desired_status(
            &c,
            &plan(&c, &self_signed(), Some(&stored), NOW + 120),
            None,
            &t2,
        );
        assert_eq!(first, second);
    }

    #[test]
    fn the_secret_carries_cert_manager_annotations() {
        let mut c = cert(&["a.example.com", "b.example.com"]);
        c.spec.common_name = Some("a.example.com".into());
        let issued = pki::issue(
            &request(&c, NOW).unwrap(),
            KeyAlgorithm::EcdsaP256,
            &Signer::SelfSigned,
        )
        .unwrap();
        let s = secret_for(&c, "ns", &issued);
        assert_eq!(s.type_.as_deref(), Some("kubernetes.io/tls"));
        let a = s.metadata.annotations.clone().unwrap();
        assert_eq!(a[ANNOTATION_CERTIFICATE_NAME], "web");
        assert_eq!(a[ANNOTATION_ISSUER_KIND], "ClusterIssuer");
        assert_eq!(a[ANNOTATION_ISSUER_GROUP], "cert-manager.io");
        assert_eq!(a[ANNOTATION_ALT_NAMES], "a.example.com,b.example.com");
        let data = s.data.unwrap();
        assert!(
            data.contains_key("tls.crt")
                && data.contains_key("tls.key")
                && data.contains_key("ca.crt")
        );
    }

    #[test]
    fn invalid_specs_are_reported() {
        let mut c = cert(&[]);
        let p = plan(&c, &self_signed(), None, NOW);
        assert!(
            matches!(
                p,
                Plan::Blocked {
                    reason: REASON_INVALID_SPEC,
                    ..
                }
            ),
            "{p:?}"
        );
        c.spec.dns_names = vec!["a".into()];
        c.spec.private_key = Some(PrivateKeySpec {
            algorithm: Some("RSA".into()),
            size: Some(512),
        });
        let p = plan(&c, &self_signed(), None, NOW);
        assert!(
            matches!(
                p,
                Plan::Blocked {
                    reason: REASON_INVALID_KEY_SPEC,
                    ..
                }
            ),
            "{p:?}"
        );
    }
}
