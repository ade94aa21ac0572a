//! The two subcommands' arguments and their `run` functions: wiring only (logging, signals,
//! the admin server, TLS, leader election, the listeners). Behaviour lives in
//! [`hub`](mod@crate::hub), [`mirror`](crate::mirror), [`crd`], [`webhook`],
//! [`zone`](mod@crate::zone) and [`zone_http`].
//!
//! Every flag has a `KONTINUUM_*` (or Kubernetes downward-API) variable; a bad value stops
//! the binary at start-up with a message naming it.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use etcd_proxy::run::LogArgs;
use etcd_proxy::store::Store;
use etcd_proxy::tls::{self, ReloadingCert, TlsError, Trust};
use http::Uri;
use k8s_openapi::jiff::Timestamp;
use kontinuum_auth::{AuthMode, AuthModeError, Authenticator, OidcError};
use kontinuum_operator_common::admin::{self, Readiness};
use kontinuum_operator_common::args::{ClientError, LeaderArgs};
use kontinuum_operator_common::events::Events;
use kontinuum_operator_common::leader::Leadership;
use kontinuum_operator_common::shutdown::{Reason, Shutdown};
use kontinuum_operator_common::telemetry;
use kube::config::{KubeConfigOptions, Kubeconfig};
use prometheus_client::registry::Registry;
use tracing::{info, warn};

use crate::config::{self, Location};
use crate::crd::{self, Target, Wiring};
use crate::hub::{self, Hub};
use crate::metrics::Metrics;
use crate::plan::HubEntry;
use crate::record::{RegistrationKey, valid_name, whole_seconds};
use crate::webhook;
use crate::zone::{self, Agent, AgentState, StoreAddr};
use crate::zone_http::{self, Endpoint};
use crate::{CONTROLLER, VERSION};

/// Deadline of every call to the OIDC issuer.
pub const OIDC_TIMEOUT: Duration = Duration::from_secs(10);

/// `registry`: the hub's registry and the zone agent.
#[derive(Parser, Debug)]
#[command(
    version,
    about = "Kontinuum's registry: the hub's Kontinuum entries and conversion webhook, and the zone agent"
)]
pub struct Cli {
    /// What to run.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Hub side: heartbeat the hub's Kontinuum, mirror zone registrations from the store,
    /// sweep stale entries, serve the Kontinuum conversion webhook.
    Hub(HubArgs),
    /// Zone side: register this zone through the relay and serve the zone endpoint.
    Zone(ZoneArgs),
}

/// `registry hub`.
#[derive(Args, Debug, Clone)]
pub struct HubArgs {
    /// Kubeconfig of the hub; in-cluster configuration when unset.
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Address of the admin server (`/healthz`, `/readyz`, `/metrics`).
    #[arg(long, env = "KONTINUUM_ADMIN_ADDR", default_value = "0.0.0.0:8080")]
    pub admin_addr: SocketAddr,
    /// Logging.
    #[command(flatten)]
    pub log: LogArgs,
    /// Leader election.
    #[command(flatten)]
    pub leader: LeaderArgs,
    /// Namespace the Kontinuum objects are written to.
    #[arg(long, env = "POD_NAMESPACE", default_value = "kontinuum-system")]
    pub namespace: String,
    /// Name of the hub's own Kontinuum.
    #[arg(long, env = "KONTINUUM_REGISTRY_NAME", default_value = "hub",
          value_parser = object_name)]
    pub name: String,
    /// A store endpoint (`http://host:port` or `https://host:port`); repeat, or separate
    /// with commas, for several.
    #[arg(long = "store", env = "KONTINUUM_REGISTRY_STORE", value_delimiter = ',',
          required = true, value_parser = store_endpoint)]
    pub store: Vec<Uri>,
    /// CA bundle of the store's serving certificate (`https://` stores); the system's
    /// roots when unset.
    #[arg(long, env = "KONTINUUM_REGISTRY_STORE_CA")]
    pub store_ca: Option<PathBuf>,
    /// Client certificate for the store.
    #[arg(long, env = "KONTINUUM_REGISTRY_STORE_CERT", requires = "store_key")]
    pub store_cert: Option<PathBuf>,
    /// Client key for the store.
    #[arg(long, env = "KONTINUUM_REGISTRY_STORE_KEY", requires = "store_cert")]
    pub store_key: Option<PathBuf>,
    /// Heartbeat period of the hub's own Kontinuum, in seconds.
    #[arg(long, env = "KONTINUUM_REGISTRY_HEARTBEAT_SECONDS", default_value_t = 60,
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub heartbeat_seconds: u64,
    /// An entry whose last heartbeat is this old is deleted, in seconds.
    #[arg(long, env = "KONTINUUM_REGISTRY_TTL_SECONDS", default_value_t = 300,
          value_parser = clap::value_parser!(u64).range(2..=31_536_000))]
    pub ttl_seconds: u64,
    /// Address of the conversion webhook (HTTPS `POST /convert`).
    #[arg(
        long,
        env = "KONTINUUM_REGISTRY_WEBHOOK_ADDR",
        default_value = "0.0.0.0:9443"
    )]
    pub webhook_addr: SocketAddr,
    /// The webhook's serving certificate (PEM); re-read when it changes. Without it the
    /// webhook is off and the CRD is left alone.
    #[arg(
        long,
        env = "KONTINUUM_REGISTRY_WEBHOOK_CERT",
        requires = "webhook_key"
    )]
    pub webhook_cert: Option<PathBuf>,
    /// The webhook's serving key (PEM); re-read when it changes.
    #[arg(
        long,
        env = "KONTINUUM_REGISTRY_WEBHOOK_KEY",
        requires = "webhook_cert"
    )]
    pub webhook_key: Option<PathBuf>,
    /// CA bundle (PEM) written into the CRD's `caBundle`; re-read periodically.
    #[arg(long, env = "KONTINUUM_REGISTRY_WEBHOOK_CA")]
    pub webhook_ca: Option<PathBuf>,
    /// Service (in `--namespace`) through which the API server reaches the webhook.
    #[arg(
        long,
        env = "KONTINUUM_REGISTRY_WEBHOOK_SERVICE",
        conflicts_with = "webhook_url"
    )]
    pub webhook_service: Option<String>,
    /// Port of `--webhook-service`.
    #[arg(long, env = "KONTINUUM_REGISTRY_WEBHOOK_SERVICE_PORT", default_value_t = 443,
          value_parser = clap::value_parser!(i32).range(1..=65_535))]
    pub webhook_service_port: i32,
    /// URL through which the API server reaches the webhook (out-of-cluster runs), e.g.
    /// `https://127.0.0.1:9443/convert`.
    #[arg(long, env = "KONTINUUM_REGISTRY_WEBHOOK_URL")]
    pub webhook_url: Option<String>,
}

/// `registry zone`.
#[derive(Args, Debug, Clone)]
pub struct ZoneArgs {
    /// The zone's region (a DNS-1123 label).
    #[arg(long, env = "KONTINUUM_SERVER_REGION", value_parser = region_label)]
    pub region: String,
    /// The zone (a DNS-1123 label).
    #[arg(long, env = "KONTINUUM_SERVER_ZONE", value_parser = zone_label)]
    pub zone: String,
    /// The registration's name (a DNS-1123 label); `POD_NAME`, else the host name.
    #[arg(long, env = "KONTINUUM_REGISTRY_NAME")]
    pub name: Option<String>,
    /// The store, through the relay: `unix:///path`, or a loopback `host:port`.
    #[arg(
        long,
        env = "KONTINUUM_REGISTRY_STORE",
        default_value = "unix:///tmp/kontinuum-storage-relay.sock"
    )]
    pub store: StoreAddr,
    /// Time-to-live of the registration's lease, in seconds.
    #[arg(long, env = "KONTINUUM_REGISTRY_LEASE_TTL_SECONDS", default_value_t = 30,
          value_parser = clap::value_parser!(i64).range(2..=3600))]
    pub lease_ttl_seconds: i64,
    /// How often the registration's value is rewritten, in seconds.
    #[arg(long, env = "KONTINUUM_REGISTRY_HEARTBEAT_SECONDS", default_value_t = 10,
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub heartbeat_seconds: u64,
    /// Address of the zone endpoint (`/healthz`, `/readyz`, `/version`, `/status`); `:port`
    /// means every address.
    #[arg(long, env = "KONTINUUM_SERVER_ADDR", default_value = "0.0.0.0:8080",
          value_parser = listen_addr)]
    pub addr: SocketAddr,
    /// Address of the admin server (`/metrics`).
    #[arg(long, env = "KONTINUUM_ADMIN_ADDR", default_value = "0.0.0.0:9090")]
    pub admin_addr: SocketAddr,
    /// An extra CA bundle (PEM) trusted for the OIDC issuer (a private issuer).
    #[arg(long, env = "KONTINUUM_OIDC_CA_FILE")]
    pub oidc_ca: Option<PathBuf>,
    /// Logging.
    #[command(flatten)]
    pub log: LogArgs,
}

fn label(value: &str, variable: &str) -> Result<String, String> {
    if valid_name(value) {
        Ok(value.to_owned())
    } else {
        Err(format!(
            "{variable} must be a DNS-1123 label (lowercase alphanumerics and '-', at most 63 characters)"
        ))
    }
}

fn region_label(value: &str) -> Result<String, String> {
    label(value, "KONTINUUM_SERVER_REGION")
}

fn zone_label(value: &str) -> Result<String, String> {
    label(value, "KONTINUUM_SERVER_ZONE")
}

fn object_name(value: &str) -> Result<String, String> {
    if kontinuum_crds::names::is_dns1123_subdomain(value) {
        Ok(value.to_owned())
    } else {
        Err("KONTINUUM_REGISTRY_NAME must be a DNS-1123 subdomain".into())
    }
}

fn store_endpoint(value: &str) -> Result<Uri, String> {
    let uri: Uri = value.parse().map_err(|_| {
        "KONTINUUM_REGISTRY_STORE: expected http://host:port or https://host:port".to_owned()
    })?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.host().is_none() {
        return Err(
            "KONTINUUM_REGISTRY_STORE: expected http://host:port or https://host:port".into(),
        );
    }
    Ok(uri)
}

fn listen_addr(value: &str) -> Result<SocketAddr, String> {
    let full = match value.strip_prefix(':') {
        Some(port) => format!("0.0.0.0:{port}"),
        None => value.to_owned(),
    };
    full.parse()
        .map_err(|_| "KONTINUUM_SERVER_ADDR: expected host:port (an IP address) or :port".into())
}

/// Why a subcommand stopped.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// Logging could not be set up.
    #[error("setting up logging: {0}")]
    Telemetry(String),
    /// Signal handlers could not be installed.
    #[error("installing signal handlers")]
    Signals(#[source] std::io::Error),
    /// The hub could not be reached or configured.
    #[error("connecting to the hub")]
    Client(#[source] ClientError),
    /// A TLS configuration could not be built.
    #[error("setting up TLS")]
    Tls(#[source] TlsError),
    /// A listener could not be bound.
    #[error("listening on {addr}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The flags or variables do not fit together.
    #[error("{0}")]
    Config(String),
    /// No auth mode, or two (reference section 7.3).
    #[error("choosing the auth mode")]
    AuthMode(#[source] AuthModeError),
    /// The OIDC verifier could not be built.
    #[error("setting up OIDC")]
    Oidc(#[source] OidcError),
    /// Leader election could not start.
    #[error("starting leader election")]
    Leader(#[source] kontinuum_operator_common::leader::LeaderError),
    /// Something the process cannot run without failed.
    #[error("stopped: {0}")]
    Fatal(String),
}

fn init_logging(log: &LogArgs) -> Result<(), RunError> {
    telemetry::init(log.log_level, log.log_format, env!("CARGO_CRATE_NAME"))
        .map_err(|e| RunError::Telemetry(e.to_string()))
}

fn spawn_admin(addr: SocketAddr, readiness: Readiness, registry: Registry, shutdown: Shutdown) {
    let router = admin::router(readiness, Arc::new(registry));
    tokio::spawn(async move {
        if let Err(err) = admin::serve(addr, router, shutdown.clone()).await {
            warn!(
                error = &err as &dyn std::error::Error,
                "admin server failed"
            );
            shutdown.trigger(Reason::Fatal("admin server failed".into()));
        }
    });
}

async fn hub_client(kubeconfig: Option<&PathBuf>) -> Result<kube::Client, RunError> {
    let config = match kubeconfig {
        Some(path) => {
            let err = |source| {
                RunError::Client(ClientError::Kubeconfig {
                    path: path.clone(),
                    source,
                })
            };
            let kubeconfig = Kubeconfig::read_from(path).map_err(err)?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .map_err(err)?
        }
        None => kube::Config::infer()
            .await
            .map_err(|e| RunError::Client(ClientError::Infer(e)))?,
    };
    kube::Client::try_from(config).map_err(|e| RunError::Client(ClientError::Build(e)))
}

fn identity(args: &LeaderArgs) -> String {
    args.identity.clone().unwrap_or_else(host_name)
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map_or_else(|_| "unknown".to_owned(), |h| h.trim().to_owned())
}

fn exit(shutdown: &Shutdown) -> Result<(), RunError> {
    match shutdown.reason() {
        Some(Reason::Fatal(why)) => Err(RunError::Fatal(why)),
        _ => Ok(()),
    }
}

/// Where the webhook is reached, from the flags (`None`: the webhook is off).
fn webhook_target(args: &HubArgs) -> Result<Option<Target>, RunError> {
    if args.webhook_cert.is_none() {
        return Ok(None);
    }
    match (&args.webhook_service, &args.webhook_url) {
        (Some(name), None) => Ok(Some(Target::Service {
            name: name.clone(),
            namespace: args.namespace.clone(),
            port: args.webhook_service_port,
        })),
        (None, Some(url)) => {
            if !url.starts_with("https://") {
                return Err(RunError::Config(
                    "KONTINUUM_REGISTRY_WEBHOOK_URL must be an https:// URL".into(),
                ));
            }
            Ok(Some(Target::Url(url.clone())))
        }
        _ => Err(RunError::Config(
            "with KONTINUUM_REGISTRY_WEBHOOK_CERT set, set KONTINUUM_REGISTRY_WEBHOOK_SERVICE or KONTINUUM_REGISTRY_WEBHOOK_URL (where the API server reaches the webhook)".into(),
        )),
    }
}

/// Binds the conversion webhook and serves it in a task until `shutdown`.
async fn start_webhook(
    addr: SocketAddr,
    cert: &std::path::Path,
    key: &std::path::Path,
    metrics: &Arc<Metrics>,
    shutdown: &Shutdown,
) -> Result<tokio::task::JoinHandle<std::io::Result<()>>, RunError> {
    let cert = ReloadingCert::new(cert.to_path_buf(), key.to_path_buf()).map_err(RunError::Tls)?;
    let tls = webhook::tls_config(Arc::new(cert)).map_err(RunError::Tls)?;
    let (server, _) = webhook::bind(addr, tls, Arc::clone(metrics), shutdown.clone())
        .await
        .map_err(|source| RunError::Bind { addr, source })?;
    Ok(tokio::spawn(server))
}

/// Runs `registry hub` until SIGTERM/SIGINT.
pub async fn hub(args: HubArgs) -> Result<(), RunError> {
    init_logging(&args.log)?;
    if args.ttl_seconds <= args.heartbeat_seconds {
        return Err(RunError::Config(
            "KONTINUUM_REGISTRY_TTL_SECONDS must be greater than KONTINUUM_REGISTRY_HEARTBEAT_SECONDS".into(),
        ));
    }
    let target = webhook_target(&args)?;
    let identity = identity(&args.leader);
    info!(
        version = VERSION,
        namespace = %args.namespace,
        name = %args.name,
        identity = %identity,
        leader_elect = args.leader.leader_elect,
        webhook = target.is_some(),
        "starting registry hub"
    );
    let shutdown = Shutdown::on_signals().map_err(RunError::Signals)?;
    let store_tls = if args.store.iter().any(|u| u.scheme_str() == Some("https")) {
        let trust = args.store_ca.clone().map_or(Trust::System, Trust::CaFile);
        let identity = args.store_cert.as_deref().zip(args.store_key.as_deref());
        Some(tls::client_config(&trust, identity).map_err(RunError::Tls)?)
    } else {
        None
    };
    let store = Arc::new(Store::new(&args.store, store_tls));
    let client = hub_client(args.kubeconfig.as_ref()).await?;

    let mut registry = Registry::default();
    let metrics = Metrics::register(&mut registry);
    // Readiness is the webhook's (every replica serves it); the leader's work does not
    // gate it, so that standby replicas stay behind the webhook Service.
    let readiness = Readiness::new(false);
    spawn_admin(
        args.admin_addr,
        readiness.clone(),
        registry,
        shutdown.clone(),
    );

    let webhook = match (&target, &args.webhook_cert, &args.webhook_key) {
        (Some(_), Some(cert), Some(key)) => {
            Some(start_webhook(args.webhook_addr, cert, key, &metrics, &shutdown).await?)
        }
        _ => None,
    };
    readiness.set_synced();

    let mut leadership = Leadership::start(
        client.clone(),
        &args.leader,
        CONTROLLER,
        identity.clone(),
        readiness,
        shutdown.clone(),
        Some(&args.namespace),
    )
    .await
    .map_err(RunError::Leader)?;
    tokio::select! {
        () = leadership.acquired() => {
            if let Some(target) = target {
                tokio::spawn(crd::keep(
                    client.clone(),
                    Wiring { target, ca_file: args.webhook_ca.clone() },
                    Arc::clone(&metrics),
                    shutdown.clone(),
                ));
            }
            let config = config::published(
                |name| std::env::var(name).ok(),
                Location {
                    region: None,
                    zone: None,
                    log_level: args.log.log_level,
                    log_format: args.log.log_format,
                },
            );
            let hub = Hub {
                events: Events::new(client.clone(), CONTROLLER, Some(identity)),
                client,
                namespace: args.namespace.clone(),
                entry: HubEntry {
                    name: args.name.clone(),
                    last_heartbeat: whole_seconds(Timestamp::now()),
                    version: VERSION.to_owned(),
                    config,
                },
                heartbeat: Duration::from_secs(args.heartbeat_seconds),
                ttl_seconds: i64::try_from(args.ttl_seconds).unwrap_or(i64::MAX),
                store,
                metrics,
            };
            hub::lead(hub, shutdown.clone()).await;
        }
        () = shutdown.wait() => {}
    }
    if let Some(webhook) = webhook {
        let _ = webhook.await;
    }
    exit(&shutdown)
}

/// The zone agent's registration name: `--name`, else `POD_NAME`, else the host name's
/// first label, lowercased.
fn registration_name(args: &ZoneArgs) -> Result<String, RunError> {
    let pod = || std::env::var("POD_NAME").ok().filter(|n| !n.is_empty());
    let (name, variable) = if let Some(name) = &args.name {
        (name.clone(), "KONTINUUM_REGISTRY_NAME")
    } else if let Some(pod) = pod() {
        (pod, "POD_NAME")
    } else {
        let host = host_name();
        let first = host.split('.').next().unwrap_or_default().to_lowercase();
        (first, "the host name")
    };
    if valid_name(&name) {
        Ok(name)
    } else {
        Err(RunError::Config(format!(
            "the registration name from {variable} ({name:?}) is not a DNS-1123 label; set KONTINUUM_REGISTRY_NAME"
        )))
    }
}

/// Runs `registry zone` until SIGTERM/SIGINT.
pub async fn zone(args: ZoneArgs) -> Result<(), RunError> {
    init_logging(&args.log)?;
    // Exactly one auth mode, or nothing starts (reference section 7.3).
    let mode = AuthMode::from_env(|name| std::env::var(name).ok()).map_err(RunError::AuthMode)?;
    let ca = match &args.oidc_ca {
        Some(path) => Some(std::fs::read(path).map_err(|e| {
            RunError::Config(format!(
                "reading KONTINUUM_OIDC_CA_FILE {}: {e}",
                path.display()
            ))
        })?),
        None => None,
    };
    let name = registration_name(&args)?;
    let key = RegistrationKey::new(&args.region, &args.zone, &name)
        .map_err(|e| RunError::Config(e.to_string()))?;
    info!(
        version = VERSION,
        key = %key.key(),
        store = %args.store,
        auth = mode.name(),
        "starting registry zone"
    );
    let auth = Authenticator::with_ca(mode, OIDC_TIMEOUT, ca.as_deref()).map_err(RunError::Oidc)?;
    let shutdown = Shutdown::on_signals().map_err(RunError::Signals)?;

    let mut registry = Registry::default();
    let metrics = Metrics::register(&mut registry);
    let readiness = Readiness::new(false);
    readiness.set_synced();
    spawn_admin(args.admin_addr, readiness, registry, shutdown.clone());

    let state = Arc::new(Mutex::new(AgentState::default()));
    let endpoint = Arc::new(Endpoint {
        key: key.clone(),
        version: VERSION.to_owned(),
        lease_ttl: args.lease_ttl_seconds,
        state: Arc::clone(&state),
    });
    let listener = tokio::net::TcpListener::bind(args.addr)
        .await
        .map_err(|source| RunError::Bind {
            addr: args.addr,
            source,
        })?;
    info!(addr = %args.addr, "zone endpoint listening");
    let server = {
        let shutdown = shutdown.clone();
        axum::serve(listener, zone_http::router(endpoint, auth))
            .with_graceful_shutdown(async move { shutdown.wait().await })
    };
    let server = tokio::spawn(async move {
        if let Err(err) = server.await {
            warn!(
                error = &err as &dyn std::error::Error,
                "zone endpoint failed"
            );
        }
    });

    let config = config::published(
        |name| std::env::var(name).ok(),
        Location {
            region: Some(&args.region),
            zone: Some(&args.zone),
            log_level: args.log.log_level,
            log_format: args.log.log_format,
        },
    );
    let agent = Agent {
        key,
        version: VERSION.to_owned(),
        config,
        lease_ttl: args.lease_ttl_seconds,
        heartbeat: Duration::from_secs(args.heartbeat_seconds),
    };
    zone::run(
        zone::channel(&args.store),
        agent,
        state,
        metrics,
        shutdown.clone(),
    )
    .await;
    let _ = server.await;
    exit(&shutdown)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hub_args(extra: &[&str]) -> Result<HubArgs, clap::Error> {
        let mut argv = vec!["registry", "hub", "--store", "http://127.0.0.1:2379"];
        argv.extend_from_slice(extra);
        Cli::try_parse_from(argv).map(|cli| match cli.command {
            Command::Hub(parsed) => parsed,
            Command::Zone(_) => unreachable!(),
        })
    }

    #[test]
    fn hub_defaults_follow_the_contract() {
        let args = hub_args(&[]).unwrap();
        assert_eq!(args.name, "hub");
        assert_eq!(args.namespace, "kontinuum-system");
        assert_eq!(args.heartbeat_seconds, 60);
        assert_eq!(args.ttl_seconds, 300);
        assert_eq!(args.webhook_addr.port(), 9443);
        assert_eq!(args.webhook_service_port, 443);
        assert_eq!(args.admin_addr.port(), 8080);
        assert_eq!(webhook_target(&args).unwrap(), None);
    }

    #[test]
    fn hub_flags_are_checked() {
        assert!(
            Cli::try_parse_from(["registry", "hub"]).is_err(),
            "--store is required"
        );
        let err = hub_args(&["--store", "ftp://x"]).unwrap_err().to_string();
        assert!(err.contains("KONTINUUM_REGISTRY_STORE"), "{err}");
        let args = hub_args(&["--store", "http://a:1,https://b:2"]).unwrap();
        assert_eq!(args.store.len(), 3, "repeated and comma-separated");
        assert!(
            hub_args(&["--webhook-cert", "c"]).is_err(),
            "cert needs key"
        );
        assert!(
            hub_args(&[
                "--webhook-url",
                "https://x/convert",
                "--webhook-service",
                "s"
            ])
            .is_err()
        );
        let args = hub_args(&["--webhook-cert", "c", "--webhook-key", "k"]).unwrap();
        let err = webhook_target(&args).unwrap_err().to_string();
        assert!(err.contains("KONTINUUM_REGISTRY_WEBHOOK_SERVICE"), "{err}");
        let args = hub_args(&[
            "--webhook-cert",
            "c",
            "--webhook-key",
            "k",
            "--webhook-service",
            "reg",
            "--namespace",
            "ns",
        ])
        .unwrap();
        assert_eq!(
            webhook_target(&args).unwrap(),
            Some(Target::Service {
                name: "reg".into(),
                namespace: "ns".into(),
                port: 443
            })
        );
        let err = hub_args(&["--name", "Not_A_Name"]).unwrap_err().to_string();
        assert!(err.contains("KONTINUUM_REGISTRY_NAME"), "{err}");
    }

    fn zone_args(extra: &[&str]) -> Result<ZoneArgs, clap::Error> {
        let mut argv = vec!["registry", "zone", "--region", "eu", "--zone", "west-1a"];
        argv.extend_from_slice(extra);
        Cli::try_parse_from(argv).map(|cli| match cli.command {
            Command::Zone(parsed) => parsed,
            Command::Hub(_) => unreachable!(),
        })
    }

    #[test]
    fn zone_defaults_follow_the_contract() {
        let args = zone_args(&[]).unwrap();
        assert_eq!(
            args.store,
            StoreAddr::Unix("/tmp/kontinuum-storage-relay.sock".into())
        );
        assert_eq!(args.lease_ttl_seconds, 30);
        assert_eq!(args.heartbeat_seconds, 10);
        assert_eq!(args.addr.to_string(), "0.0.0.0:8080");
        assert_eq!(args.admin_addr.port(), 9090);
        let args = zone_args(&["--name", "agent-0"]).unwrap();
        assert_eq!(registration_name(&args).unwrap(), "agent-0");
        let args = zone_args(&["--name", "Agent.0"]).unwrap();
        let err = registration_name(&args).unwrap_err().to_string();
        assert!(err.contains("KONTINUUM_REGISTRY_NAME"), "{err}");
    }

    #[test]
    fn zone_flags_are_checked_naming_the_variable() {
        let err = Cli::try_parse_from(["registry", "zone", "--region", "EU", "--zone", "a"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("KONTINUUM_SERVER_REGION"), "{err}");
        assert!(Cli::try_parse_from(["registry", "zone", "--region", "eu"]).is_err());
        let args = zone_args(&["--addr", ":8081", "--store", "127.0.0.1:2379"]).unwrap();
        assert_eq!(args.addr.to_string(), "0.0.0.0:8081");
        let err = zone_args(&["--addr", "nowhere"]).unwrap_err().to_string();
        assert!(err.contains("KONTINUUM_SERVER_ADDR"), "{err}");
        assert!(zone_args(&["--lease-ttl-seconds", "1"]).is_err());
    }
}
