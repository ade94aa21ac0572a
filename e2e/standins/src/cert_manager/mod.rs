//! The cert-manager STAND-IN (`cert-manager-standin`): cert-manager itself cannot run in
//! Kontinuum's test bed (and its ACME issuer needs the internet), so e2e runs this in its
//! place against the real cert-manager CRDs. It honours only what real cert-manager would:
//! issuers become `Ready` when they are usable ([`issuer`]), and a Certificate gets its
//! Secret only from a `Ready` issuer ([`certificate`]). `acme` issuers sign from a test CA
//! given on the command line instead of talking to an ACME server.
//!
//! Field manager [`FIELD_MANAGER`]; everything it writes is listed in the module docs of
//! the two controllers.

pub mod certificate;
pub mod issuer;
pub mod types;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kontinuum_operator_common::admin::{Readiness, track_sync};
use kontinuum_operator_common::backoff::{Backoff, object_key};
use kontinuum_operator_common::error::{ReconcileError, retry_after_backoff};
use kontinuum_operator_common::events::Events;
use kontinuum_operator_common::metrics::ControllerMetrics;
use kontinuum_operator_common::shutdown::Shutdown;
use kube::core::PartialObjectMeta;
use kube::runtime::controller::Action;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{Controller, WatchStreamExt as _, watcher};
use kube::{Api, Client, ResourceExt as _};

use crate::pki::CaKeyPair;
use types::{Certificate, ClusterIssuer, Issuer};

/// The controller name (metrics, events, logs).
pub const CONTROLLER: &str = "cert-manager-standin";
/// The field manager of every write.
pub const FIELD_MANAGER: &str = "cert-manager-standin.kontinuum.sh";
/// Safety-net resync of objects in a steady state.
pub const RESYNC: Duration = Duration::from_secs(600);

/// Command-line arguments of `cert-manager-standin` (besides the common ones).
#[derive(clap::Args, Clone, Debug)]
pub struct Args {
    /// Namespace of the Secrets ClusterIssuers refer to (cert-manager's
    /// `--cluster-resource-namespace`).
    #[arg(
        long,
        env = "CLUSTER_RESOURCE_NAMESPACE",
        default_value = "cert-manager"
    )]
    pub cluster_resource_namespace: String,
    /// Certificate (PEM) of the test CA that signs certificates of `acme` issuers. Without
    /// it (and `--acme-ca-key`), `acme` issuers are never Ready.
    #[arg(long, requires = "acme_ca_key")]
    pub acme_ca_cert: Option<PathBuf>,
    /// Private key (PEM) of the test CA.
    #[arg(long, requires = "acme_ca_cert")]
    pub acme_ca_key: Option<PathBuf>,
    /// Accepted for compatibility with cert-manager's controller (`--v=2`, as its chart and
    /// the fixture chart pass it), so the stand-in can run from their Deployment; ignored:
    /// use `--log-level`.
    #[arg(long = "v", value_name = "LEVEL")]
    pub klog_verbosity: Option<u8>,
    /// Accepted for compatibility with cert-manager's `--enable-gateway-api`; ignored (the
    /// stand-in solves no HTTP-01 challenges).
    #[arg(long)]
    pub enable_gateway_api: bool,
}

/// Why the stand-in cannot start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A test CA file could not be read.
    #[error("reading {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The test CA is unusable.
    #[error("the test CA (--acme-ca-cert/--acme-ca-key) is unusable")]
    Ca(#[source] crate::pki::PkiError),
}

impl Args {
    /// The settings, reading the test CA files.
    pub fn settings(&self) -> Result<Settings, StartError> {
        let read = |path: &PathBuf| {
            std::fs::read(path).map_err(|source| StartError::Read {
                path: path.clone(),
                source,
            })
        };
        let acme_ca = match (&self.acme_ca_cert, &self.acme_ca_key) {
            (Some(cert), Some(key)) => Some(Arc::new(
                CaKeyPair::from_pem(&read(cert)?, &read(key)?).map_err(StartError::Ca)?,
            )),
            _ => None,
        };
        Ok(Settings {
            cluster_resource_namespace: self.cluster_resource_namespace.clone(),
            acme_ca,
        })
    }
}

/// What the controllers are configured with.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Where ClusterIssuers' Secrets live.
    pub cluster_resource_namespace: String,
    /// The test CA signing for `acme` issuers, if given.
    pub acme_ca: Option<Arc<CaKeyPair>>,
}

/// Shared by the controllers.
pub struct Ctx {
    /// The cluster's client.
    pub client: Client,
    /// Settings.
    pub settings: Settings,
    /// Every ClusterIssuer.
    pub cluster_issuers: Store<ClusterIssuer>,
    /// Every Issuer.
    pub issuers: Store<Issuer>,
    /// Reconcile metrics.
    pub metrics: Arc<ControllerMetrics>,
    /// Per-object retry backoff.
    pub backoff: Backoff,
    /// Events for issuances and for Certificates that become not Ready.
    pub events: Events,
}

/// The error policy: log, count by reason, retry after the object's backoff. (Its
/// signature is kube-runtime's, hence the `Arc`s taken by value.)
#[allow(clippy::needless_pass_by_value)]
fn error_policy<K, E>(object: Arc<K>, err: &E, ctx: Arc<Ctx>) -> Action
where
    K: kube::ResourceExt,
    E: ReconcileError,
{
    retry_after_backoff(
        &object_key(object.as_ref()),
        err,
        &ctx.metrics,
        &ctx.backoff,
    )
}

/// The object as the API server has it now. The watch cache may not hold this
/// controller's own last status write yet, and a status computed from a stale copy would undo
/// it (server-side apply drops the fields a manager stops sending).
async fn fresh<K>(api: &Api<K>, name: &str) -> Result<Option<K>, kube::Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    crate::with_timeout(api.get_opt(name)).await
}

async fn reconcile_cluster_issuer(
    issuer: Arc<ClusterIssuer>,
    ctx: Arc<Ctx>,
) -> Result<Action, issuer::Error> {
    let _timer = ctx.metrics.reconcile_timer();
    let api: Api<ClusterIssuer> = Api::all(ctx.client.clone());
    let Some(current) = fresh(&api, &issuer.name_any())
        .await
        .map_err(issuer::Error::Get)?
    else {
        return Ok(Action::await_change());
    };
    let namespace = ctx.settings.cluster_resource_namespace.clone();
    let result = issuer::apply(
        &current,
        &current.spec.config,
        current.status.as_ref(),
        &api,
        &namespace,
        &ctx,
    )
    .await;
    if result.is_ok() {
        ctx.backoff.reset(&object_key(issuer.as_ref()));
    }
    result
}

async fn reconcile_issuer(issuer: Arc<Issuer>, ctx: Arc<Ctx>) -> Result<Action, issuer::Error> {
    let _timer = ctx.metrics.reconcile_timer();
    let namespace = issuer.namespace().unwrap_or_default();
    let api: Api<Issuer> = Api::namespaced(ctx.client.clone(), &namespace);
    let Some(current) = fresh(&api, &issuer.name_any())
        .await
        .map_err(issuer::Error::Get)?
    else {
        return Ok(Action::await_change());
    };
    let result = issuer::apply(
        &current,
        &current.spec.config,
        current.status.as_ref(),
        &api,
        &namespace,
        &ctx,
    )
    .await;
    if result.is_ok() {
        ctx.backoff.reset(&object_key(issuer.as_ref()));
    }
    result
}

async fn reconcile_certificate(
    cert: Arc<Certificate>,
    ctx: Arc<Ctx>,
) -> Result<Action, certificate::Error> {
    let _timer = ctx.metrics.reconcile_timer();
    let namespace = cert
        .namespace()
        .ok_or(certificate::Error::MissingNamespace)?;
    let api: Api<Certificate> = Api::namespaced(ctx.client.clone(), &namespace);
    let Some(current) = fresh(&api, &cert.name_any())
        .await
        .map_err(certificate::Error::Get)?
    else {
        return Ok(Action::await_change());
    };
    let result = certificate::apply(&current, &ctx).await;
    if result.is_ok() {
        ctx.backoff.reset(&object_key(cert.as_ref()));
    }
    result
}

/// Watches `api` into a store, counting the watch for `/readyz`; the stream of changed
/// objects drives a controller.
fn reflected<K>(
    api: Api<K>,
    readiness: &Readiness,
) -> (
    Store<K>,
    impl futures::Stream<Item = Result<K, watcher::Error>> + Send + use<K>,
)
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let (store, writer) = reflector::store();
    let stream = track_sync(
        watcher(api, watcher::Config::default()).default_backoff(),
        readiness,
    )
    .reflect(writer)
    .applied_objects();
    (store, stream)
}

/// Mapper: the ClusterIssuers whose `ca` Secret is `namespace/name` (ClusterIssuer Secrets
/// live in the cluster resource namespace).
pub fn cluster_issuers_using(
    issuers: &[Arc<ClusterIssuer>],
    resource_namespace: &str,
    namespace: Option<&str>,
    name: &str,
) -> Vec<ObjectRef<ClusterIssuer>> {
    if namespace != Some(resource_namespace) {
        return Vec::new();
    }
    issuers
        .iter()
        .filter(|i| {
            i.spec
                .config
                .ca
                .as_ref()
                .is_some_and(|ca| ca.secret_name == name)
        })
        .map(|i| ObjectRef::from_obj(i.as_ref()))
        .collect()
}

/// Mapper: the Issuers whose `ca` Secret is `namespace/name`.
pub fn issuers_using(
    issuers: &[Arc<Issuer>],
    namespace: Option<&str>,
    name: &str,
) -> Vec<ObjectRef<Issuer>> {
    issuers
        .iter()
        .filter(|i| i.namespace().as_deref() == namespace)
        .filter(|i| {
            i.spec
                .config
                .ca
                .as_ref()
                .is_some_and(|ca| ca.secret_name == name)
        })
        .map(|i| ObjectRef::from_obj(i.as_ref()))
        .collect()
}

/// Mapper: the Certificates writing Secret `namespace/name`.
pub fn certificates_writing(
    certificates: &[Arc<Certificate>],
    namespace: Option<&str>,
    name: &str,
) -> Vec<ObjectRef<Certificate>> {
    certificates
        .iter()
        .filter(|c| c.namespace().as_deref() == namespace && c.spec.secret_name == name)
        .map(|c| ObjectRef::from_obj(c.as_ref()))
        .collect()
}

/// Mapper: the Certificates naming issuer `kind` `name` (`namespace` for an Issuer).
pub fn certificates_of_issuer(
    certificates: &[Arc<Certificate>],
    kind: &str,
    namespace: Option<&str>,
    name: &str,
) -> Vec<ObjectRef<Certificate>> {
    certificates
        .iter()
        .filter(|c| {
            let r = &c.spec.issuer_ref;
            r.group() == types::GROUP
                && r.kind() == kind
                && r.name == name
                && (kind == "ClusterIssuer" || c.namespace().as_deref() == namespace)
        })
        .map(|c| ObjectRef::from_obj(c.as_ref()))
        .collect()
}

/// Runs the issuer and certificate controllers until `shutdown`.
pub async fn run(
    client: Client,
    settings: Settings,
    metrics: Arc<ControllerMetrics>,
    events: Events,
    readiness: Readiness,
    shutdown: Shutdown,
) {
    let (cluster_issuers, cluster_issuer_changes) =
        reflected(Api::<ClusterIssuer>::all(client.clone()), &readiness);
    let (issuers, issuer_changes) = reflected(Api::<Issuer>::all(client.clone()), &readiness);
    let (certificates, certificate_changes) =
        reflected(Api::<Certificate>::all(client.clone()), &readiness);
    let ctx = Arc::new(Ctx {
        client: client.clone(),
        settings: settings.clone(),
        cluster_issuers: cluster_issuers.clone(),
        issuers: issuers.clone(),
        metrics,
        backoff: Backoff::default(),
        events,
    });
    let watch = || watcher::Config::default();
    let secrets = || {
        watcher(
            Api::<PartialObjectMeta<Secret>>::all(client.clone()),
            watch(),
        )
        .default_backoff()
        .applied_objects()
    };

    let by_secret = cluster_issuers.clone();
    let resource_ns = settings.cluster_resource_namespace.clone();
    let cluster_issuer_controller =
        Controller::for_stream(cluster_issuer_changes, cluster_issuers.clone())
            .watches_stream(secrets(), move |s| {
                cluster_issuers_using(
                    &by_secret.state(),
                    &resource_ns,
                    s.namespace().as_deref(),
                    &s.name_any(),
                )
            })
            .graceful_shutdown_on(wait(shutdown.clone()))
            .run(reconcile_cluster_issuer, error_policy, ctx.clone());

    let by_secret = issuers.clone();
    let issuer_controller = Controller::for_stream(issuer_changes, issuers.clone())
        .watches_stream(secrets(), move |s| {
            issuers_using(&by_secret.state(), s.namespace().as_deref(), &s.name_any())
        })
        .graceful_shutdown_on(wait(shutdown.clone()))
        .run(reconcile_issuer, error_policy, ctx.clone());

    let (by_secret, by_cluster_issuer, by_issuer) = (
        certificates.clone(),
        certificates.clone(),
        certificates.clone(),
    );
    let certificate_controller = Controller::for_stream(certificate_changes, certificates)
        .watches_stream(secrets(), move |s| {
            certificates_writing(&by_secret.state(), s.namespace().as_deref(), &s.name_any())
        })
        .watches_stream(
            watcher(Api::<ClusterIssuer>::all(client.clone()), watch())
                .default_backoff()
                .applied_objects(),
            move |i| {
                certificates_of_issuer(
                    &by_cluster_issuer.state(),
                    "ClusterIssuer",
                    None,
                    &i.name_any(),
                )
            },
        )
        .watches_stream(
            watcher(Api::<Issuer>::all(client.clone()), watch())
                .default_backoff()
                .applied_objects(),
            move |i| {
                certificates_of_issuer(
                    &by_issuer.state(),
                    "Issuer",
                    i.namespace().as_deref(),
                    &i.name_any(),
                )
            },
        )
        .graceful_shutdown_on(wait(shutdown.clone()))
        .run(reconcile_certificate, error_policy, ctx);

    tokio::join!(
        kontinuum_operator_common::operator::drain(cluster_issuer_controller),
        kontinuum_operator_common::operator::drain(issuer_controller),
        kontinuum_operator_common::operator::drain(certificate_controller),
    );
}

async fn wait(shutdown: Shutdown) {
    shutdown.wait().await;
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::*;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    #[test]
    fn cert_manager_chart_flags_are_accepted_and_the_test_ca_needs_both_files() {
        let cli = Cli::try_parse_from(["x", "--v=2", "--enable-gateway-api"]).unwrap();
        assert_eq!(cli.args.cluster_resource_namespace, "cert-manager");
        assert!(cli.args.settings().unwrap().acme_ca.is_none());
        assert!(Cli::try_parse_from(["x", "--acme-ca-cert", "ca.crt"]).is_err());
        let cli = Cli::try_parse_from([
            "x",
            "--acme-ca-cert",
            "/nope.crt",
            "--acme-ca-key",
            "/nope.key",
        ])
        .unwrap();
        assert!(matches!(cli.args.settings(), Err(StartError::Read { .. })));
    }

    fn objects<T: serde::de::DeserializeOwned>(values: Vec<serde_json::Value>) -> Vec<Arc<T>> {
        values
            .into_iter()
            .map(|v| Arc::new(serde_json::from_value(v).unwrap()))
            .collect()
    }

    #[test]
    fn secrets_and_issuers_map_to_the_objects_using_them() {
        let certs: Vec<Arc<Certificate>> = objects(vec![
            serde_json::json!({ "metadata": { "name": "a", "namespace": "x" }, "spec": {
                "secretName": "a-tls", "issuerRef": { "name": "root", "kind": "ClusterIssuer" } } }),
            serde_json::json!({ "metadata": { "name": "b", "namespace": "y" }, "spec": {
                "secretName": "a-tls", "issuerRef": { "name": "root" } } }),
        ]);
        let names = |refs: Vec<ObjectRef<Certificate>>| {
            refs.into_iter().map(|r| r.name).collect::<Vec<_>>()
        };
        assert_eq!(
            names(certificates_writing(&certs, Some("x"), "a-tls")),
            ["a"]
        );
        assert_eq!(
            names(certificates_of_issuer(
                &certs,
                "ClusterIssuer",
                None,
                "root"
            )),
            ["a"]
        );
        assert_eq!(
            names(certificates_of_issuer(&certs, "Issuer", Some("y"), "root")),
            ["b"]
        );
        assert!(certificates_of_issuer(&certs, "Issuer", Some("x"), "root").is_empty());

        let cluster: Vec<Arc<ClusterIssuer>> = objects(vec![serde_json::json!({
            "metadata": { "name": "ca" }, "spec": { "ca": { "secretName": "root-ca" } } })]);
        assert_eq!(
            cluster_issuers_using(&cluster, "cert-manager", Some("cert-manager"), "root-ca").len(),
            1
        );
        assert!(cluster_issuers_using(&cluster, "cert-manager", Some("x"), "root-ca").is_empty());
        let namespaced: Vec<Arc<Issuer>> = objects(vec![serde_json::json!({
            "metadata": { "name": "ca", "namespace": "x" }, "spec": { "ca": { "secretName": "root-ca" } } })]);
        assert_eq!(issuers_using(&namespaced, Some("x"), "root-ca").len(), 1);
        assert!(issuers_using(&namespaced, Some("y"), "root-ca").is_empty());
    }
}
