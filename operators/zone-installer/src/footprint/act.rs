//! The acts against the zone cluster: server-side apply, read back, delete. One call per
//! object, each bounded by the caller's timeout; every error names the object.

use std::future::Future;
use std::time::Duration;

use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams,
};
use serde_json::Value;
use tracing::debug;

use super::{
    CA_CONFIG_MAP, CertificateState, DEPLOYMENT, ENV_CONFIG_MAP, ENV_SECRET, Error, FIELD_MANAGER,
    IDENTITY_SECRET, NAMESPACE, NETWORK, Observed, SERVICE, TLS_SECRET, TeardownProgress,
};

/// A kind the footprint writes or reads, with what the API needs to address it.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Kind {
    /// `group/version` (`v1` for the core group).
    pub api_version: &'static str,
    /// The kind's name (`Deployment`).
    pub name: &'static str,
    /// Its resource (plural).
    pub plural: &'static str,
    /// Namespaced or cluster-scoped.
    pub namespaced: bool,
    /// Served only when a CRD is installed (Gateway API, cert-manager).
    pub crd: bool,
}

const fn kind(
    api_version: &'static str,
    name: &'static str,
    plural: &'static str,
    namespaced: bool,
    crd: bool,
) -> Kind {
    Kind {
        api_version,
        name,
        plural,
        namespaced,
        crd,
    }
}

pub(super) const NAMESPACE_KIND: Kind = kind("v1", "Namespace", "namespaces", false, false);
pub(super) const SECRET: Kind = kind("v1", "Secret", "secrets", true, false);
pub(super) const CONFIG_MAP: Kind = kind("v1", "ConfigMap", "configmaps", true, false);
pub(super) const SERVICE_KIND: Kind = kind("v1", "Service", "services", true, false);
pub(super) const DEPLOYMENT_KIND: Kind = kind("apps/v1", "Deployment", "deployments", true, false);
pub(super) const CLUSTER_ISSUER: Kind = kind(
    "cert-manager.io/v1",
    "ClusterIssuer",
    "clusterissuers",
    false,
    true,
);
pub(super) const CERTIFICATE: Kind = kind(
    "cert-manager.io/v1",
    "Certificate",
    "certificates",
    true,
    true,
);
pub(super) const GATEWAY: Kind = kind(
    "gateway.networking.k8s.io/v1",
    "Gateway",
    "gateways",
    true,
    true,
);
pub(super) const HTTP_ROUTE: Kind = kind(
    "gateway.networking.k8s.io/v1",
    "HTTPRoute",
    "httproutes",
    true,
    true,
);
pub(super) const GATEWAY_CLASS: Kind = kind(
    "gateway.networking.k8s.io/v1",
    "GatewayClass",
    "gatewayclasses",
    false,
    true,
);

/// Every kind the footprint may apply.
const KINDS: [&Kind; 9] = [
    &NAMESPACE_KIND,
    &SECRET,
    &CONFIG_MAP,
    &SERVICE_KIND,
    &DEPLOYMENT_KIND,
    &CLUSTER_ISSUER,
    &CERTIFICATE,
    &GATEWAY,
    &HTTP_ROUTE,
];

impl Kind {
    fn resource(&self) -> ApiResource {
        let (group, version) = self
            .api_version
            .split_once('/')
            .unwrap_or(("", self.api_version));
        ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk(group, version, self.name),
            self.plural,
        )
    }

    fn api(&self, client: &kube::Client, namespace: Option<&str>) -> Api<DynamicObject> {
        let resource = self.resource();
        match namespace {
            Some(ns) if self.namespaced => Api::namespaced_with(client.clone(), ns, &resource),
            _ => Api::all_with(client.clone(), &resource),
        }
    }
}

/// One object to address: its kind, name and (for namespaced kinds) namespace.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Target<'a> {
    pub kind: &'static Kind,
    pub name: &'a str,
    pub namespace: Option<&'a str>,
}

/// The object at `index` as a [`Target`], or why it cannot be applied. Pure.
pub(super) fn target(index: usize, object: &Value) -> Result<Target<'_>, Error> {
    let invalid = |why: &str| Error::InvalidObject {
        index,
        why: why.to_owned(),
    };
    let api_version = object["apiVersion"]
        .as_str()
        .ok_or_else(|| invalid("no apiVersion"))?;
    let kind_name = object["kind"].as_str().ok_or_else(|| invalid("no kind"))?;
    let kind = KINDS
        .iter()
        .copied()
        .find(|k| k.api_version == api_version && k.name == kind_name)
        .ok_or_else(|| invalid(&format!("unsupported kind {api_version} {kind_name}")))?;
    let name = object["metadata"]["name"]
        .as_str()
        .filter(|n| !n.is_empty())
        .ok_or_else(|| invalid("no metadata.name"))?;
    let namespace = object["metadata"]["namespace"].as_str();
    if kind.namespaced && namespace.is_none_or(str::is_empty) {
        return Err(invalid(&format!("{kind_name} {name} has no namespace")));
    }
    Ok(Target {
        kind,
        name,
        namespace: namespace.filter(|_| kind.namespaced),
    })
}

/// Runs one API call under `timeout`.
async fn bounded<T>(
    timeout: Duration,
    action: &'static str,
    kind: &Kind,
    name: &str,
    call: impl Future<Output = Result<T, kube::Error>>,
) -> Result<Result<T, kube::Error>, Error> {
    tokio::time::timeout(timeout, call)
        .await
        .map_err(|_| Error::Timeout {
            action,
            kind: kind.name.to_owned(),
            name: name.to_owned(),
            after: timeout,
        })
}

/// A kube error as ours: transport failures are `Unreachable`, the API server's answers
/// go through `answered`.
fn classify(
    err: kube::Error,
    action: &'static str,
    kind: &Kind,
    name: &str,
    answered: impl FnOnce(String, String, kube::Error) -> Error,
) -> Error {
    match err {
        kube::Error::Api(_)
        | kube::Error::SerdeError(_)
        | kube::Error::BuildRequest(_)
        | kube::Error::FromUtf8(_) => answered(kind.name.to_owned(), name.to_owned(), err),
        source => Error::Unreachable {
            action,
            kind: kind.name.to_owned(),
            name: name.to_owned(),
            source: Box::new(source),
        },
    }
}

/// Whether a 404 from applying `kind` means the API server does not serve the kind at
/// all (rather than, say, a missing namespace). Pure.
pub(super) fn is_missing_api(kind: &Kind, status: &kube::core::Status) -> bool {
    let missing_namespace = status
        .details
        .as_ref()
        .is_some_and(|d| d.kind == "namespaces");
    kind.crd && status.code == 404 && !missing_namespace
}

async fn apply_one(
    client: &kube::Client,
    index: usize,
    object: &Value,
    timeout: Duration,
) -> Result<(), Error> {
    let target = target(index, object)?;
    let api = target.kind.api(client, target.namespace);
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let result = bounded(
        timeout,
        "applying",
        target.kind,
        target.name,
        api.patch(target.name, &params, &Patch::Apply(object)),
    )
    .await?;
    match result {
        Ok(_) => {
            debug!(kind = target.kind.name, name = target.name, "applied");
            Ok(())
        }
        Err(kube::Error::Api(status)) if is_missing_api(target.kind, &status) => {
            Err(Error::CrdMissing {
                kind: target.kind.name.to_owned(),
                api_version: target.kind.api_version.to_owned(),
            })
        }
        Err(err) => Err(classify(
            err,
            "applying",
            target.kind,
            target.name,
            |kind, name, source| Error::Apply {
                kind,
                name,
                source: Box::new(source),
            },
        )),
    }
}

/// Server-side applies every rendered object with [`FIELD_MANAGER`] (force), in order,
/// each call bounded by `timeout`; a kind whose CRD is missing downstream (Gateway API,
/// cert-manager) is [`Error::CrdMissing`] naming the kind. Then [`observe`]s.
pub async fn apply(
    client: &kube::Client,
    objects: &[Value],
    timeout: Duration,
) -> Result<Observed, Error> {
    for (index, object) in objects.iter().enumerate() {
        apply_one(client, index, object, timeout).await?;
    }
    observe(client, objects, timeout).await
}

/// Reads one object; `None` when it does not exist.
async fn read(
    client: &kube::Client,
    kind: &Kind,
    name: &str,
    namespace: Option<&str>,
    timeout: Duration,
) -> Result<Option<Value>, Error> {
    let api = kind.api(client, namespace);
    let found = bounded(timeout, "reading", kind, name, api.get_opt(name))
        .await?
        .map_err(|err| {
            classify(err, "reading", kind, name, |kind, name, source| {
                Error::Observe {
                    kind,
                    name,
                    source: Box::new(source),
                }
            })
        })?;
    Ok(found.and_then(|obj| serde_json::to_value(obj).ok()))
}

/// Whether a Deployment (as JSON) has an available replica. Pure.
pub(super) fn deployment_available(deployment: &Value) -> bool {
    deployment["status"]["availableReplicas"]
        .as_i64()
        .is_some_and(|n| n >= 1)
}

/// A Certificate's readiness from its `Ready` condition (as JSON). A condition observed
/// for an older generation does not count: the spec changed since. Pure.
pub(super) fn certificate_state(certificate: &Value) -> CertificateState {
    let ready = certificate["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready"));
    let Some(ready) = ready else {
        return CertificateState::NotReady {
            reason: "Pending".into(),
            message: "cert-manager has not reported on the certificate yet".into(),
        };
    };
    let generation = certificate["metadata"]["generation"].as_i64();
    let seen = ready["observedGeneration"].as_i64();
    if let (Some(generation), Some(seen)) = (generation, seen)
        && seen < generation
    {
        return CertificateState::NotReady {
            reason: "Outdated".into(),
            message: "cert-manager has not processed the certificate's current spec yet".into(),
        };
    }
    if ready["status"] == "True" {
        return CertificateState::Ready;
    }
    let text = |field: &str, default: &str| {
        ready[field]
            .as_str()
            .filter(|s| !s.is_empty())
            .unwrap_or(default)
            .to_owned()
    };
    CertificateState::NotReady {
        reason: text("reason", "NotReady"),
        message: text("message", "the certificate is not ready"),
    }
}

/// Reads back what tells whether the footprint works: the Deployment's availability, the
/// Gateway's GatewayClass and the Certificate's readiness, for the objects in `objects`
/// (the output of [`render`](super::render)). Each read bounded by `timeout`.
pub async fn observe(
    client: &kube::Client,
    objects: &[Value],
    timeout: Duration,
) -> Result<Observed, Error> {
    let mut observed = Observed {
        gateway_class_missing: None,
        certificate: None,
        agent_available: false,
    };
    for (index, object) in objects.iter().enumerate() {
        let target = target(index, object)?;
        if *target.kind == DEPLOYMENT_KIND && target.name == DEPLOYMENT {
            let live = read(client, target.kind, target.name, target.namespace, timeout).await?;
            observed.agent_available = live.as_ref().is_some_and(deployment_available);
        } else if *target.kind == GATEWAY {
            if let Some(class) = object["spec"]["gatewayClassName"].as_str() {
                let live = read(client, &GATEWAY_CLASS, class, None, timeout).await?;
                if live.is_none() {
                    observed.gateway_class_missing = Some(class.to_owned());
                }
            }
        } else if *target.kind == CERTIFICATE {
            let live = read(client, target.kind, target.name, target.namespace, timeout).await?;
            observed.certificate = Some(live.as_ref().map_or_else(
                || CertificateState::NotReady {
                    reason: "NotFound".into(),
                    message: format!("certificate {} does not exist", target.name),
                },
                certificate_state,
            ));
        }
    }
    Ok(observed)
}

/// One deletion of the teardown.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Step<'a> {
    pub kind: &'static Kind,
    pub name: &'a str,
    pub namespace: Option<&'a str>,
}

/// The footprint's objects in reverse install order, the namespace last. Pure.
pub(super) fn teardown_steps(namespace: &str) -> Vec<Step<'_>> {
    let ns = Some(namespace);
    let step = |kind: &'static Kind, name: &'static str| Step {
        kind,
        name,
        namespace: if kind.namespaced { ns } else { None },
    };
    vec![
        step(&HTTP_ROUTE, NETWORK),
        step(&CERTIFICATE, NETWORK),
        step(&GATEWAY, NETWORK),
        step(&CLUSTER_ISSUER, NETWORK),
        step(&SERVICE_KIND, SERVICE),
        step(&DEPLOYMENT_KIND, DEPLOYMENT),
        step(&CONFIG_MAP, CA_CONFIG_MAP),
        step(&CONFIG_MAP, ENV_CONFIG_MAP),
        step(&SECRET, ENV_SECRET),
        step(&SECRET, IDENTITY_SECRET),
        step(&SECRET, TLS_SECRET),
        Step {
            kind: &NAMESPACE_KIND,
            name: namespace,
            namespace: None,
        },
    ]
}

/// Deletes one object; whether it still exists afterwards (finalizers, a terminating
/// namespace). A missing object or a missing CRD counts as gone.
async fn delete_one(
    client: &kube::Client,
    step: &Step<'_>,
    timeout: Duration,
) -> Result<bool, Error> {
    let api = step.kind.api(client, step.namespace);
    let result = bounded(
        timeout,
        "deleting",
        step.kind,
        step.name,
        api.delete(step.name, &DeleteParams::background()),
    )
    .await?;
    match result {
        // Returned with a deletion timestamp: finalizers still run.
        Ok(outcome) => Ok(outcome
            .left()
            .is_some_and(|obj| obj.metadata.deletion_timestamp.is_some())),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(false),
        // A namespace being emptied answers a second delete with a conflict.
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(true),
        Err(err) => Err(classify(
            err,
            "deleting",
            step.kind,
            step.name,
            |kind, name, source| Error::Delete {
                kind,
                name,
                source: Box::new(source),
            },
        )),
    }
}

/// Deletes the footprint in [`NAMESPACE`]: see [`teardown_in`].
pub async fn teardown(client: &kube::Client, timeout: Duration) -> Result<TeardownProgress, Error> {
    teardown_in(client, NAMESPACE, timeout).await
}

/// Deletes the footprint in `namespace` in reverse install order (HTTPRoute, Certificate,
/// Gateway, ClusterIssuer, Service, Deployment, ConfigMaps/Secrets, Namespace), tolerating
/// NotFound and a missing CRD, each call bounded by `timeout`. Idempotent: call again until
/// [`TeardownProgress::Done`], which means the namespace is gone too.
pub async fn teardown_in(
    client: &kube::Client,
    namespace: &str,
    timeout: Duration,
) -> Result<TeardownProgress, Error> {
    let mut remaining = Vec::new();
    for step in teardown_steps(namespace) {
        if delete_one(client, &step, timeout).await? {
            remaining.push(format!("{}/{}", step.kind.name, step.name));
        }
    }
    if remaining.is_empty() {
        debug!(namespace, "zone footprint removed");
        Ok(TeardownProgress::Done)
    } else {
        debug!(namespace, ?remaining, "zone footprint being removed");
        Ok(TeardownProgress::InProgress { remaining })
    }
}
