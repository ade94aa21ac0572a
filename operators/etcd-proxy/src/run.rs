//! The two subcommands' arguments and their `run` functions: wiring only (logging, signals,
//! the admin server, the trust-store watch, TLS, the listener); the behaviour lives in
//! [`proxy`](crate::proxy) and [`relay`](crate::relay).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use clap::{Args, Parser, Subcommand};
use http::Uri;
use kontinuum_operator_common::admin::{self, Readiness};
use kontinuum_operator_common::args::{LogFormat, LogLevel};
use kontinuum_operator_common::shutdown::Shutdown;
use kontinuum_operator_common::telemetry;
use kontinuum_proto::etcd::etcdserverpb::kv_server::KvServer;
use kontinuum_proto::etcd::etcdserverpb::lease_server::LeaseServer;
use kontinuum_proto::etcd::etcdserverpb::watch_server::WatchServer;
use kube::config::{KubeConfigOptions, Kubeconfig};
use prometheus_client::registry::Registry;
use tracing::{info, warn};

use crate::listen::{self, Listen};
use crate::metrics::Metrics;
use crate::proxy::Proxy;
use crate::relay::Relay;
use crate::store::Store;
use crate::tls::{self, ReloadingCert, TlsError, Trust};
use crate::token::Signer;
use crate::zones::{self, Zones};

/// Requests larger than etcd's own limit (1.5 MiB plus framing) are refused early.
const MAX_REQUEST_BYTES: usize = 4 * 1024 * 1024;

/// `etcd-proxy`: the zone-scoped etcd v3 proxy and its relay.
#[derive(Parser, Debug)]
#[command(
    version,
    about = "Kontinuum's zone-scoped etcd v3 gRPC proxy and its zone-side relay"
)]
pub struct Cli {
    /// What to run.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Hub side: serve etcd v3 KV/Watch/Lease to zones, authenticated and zone-scoped.
    Serve(ServeArgs),
    /// Zone side: a local, unauthenticated etcd v3 endpoint forwarding to the hub's proxy.
    Relay(RelayArgs),
}

/// Logging flags, as every Kontinuum binary has them.
#[derive(Args, Debug, Clone)]
pub struct LogArgs {
    /// Log level.
    #[arg(long, env = "KONTINUUM_LOG_LEVEL", value_enum, default_value_t = LogLevel::Warn)]
    pub log_level: LogLevel,
    /// Log format.
    #[arg(long, env = "KONTINUUM_LOG_FORMAT", value_enum, default_value_t = LogFormat::Json)]
    pub log_format: LogFormat,
}

/// `etcd-proxy serve`.
#[derive(Args, Debug, Clone)]
pub struct ServeArgs {
    /// Address to serve gRPC on (`host:port`, or `unix:///path`).
    #[arg(
        long,
        env = "KONTINUUM_ETCD_PROXY_LISTEN",
        default_value = "0.0.0.0:2379"
    )]
    pub listen: Listen,
    /// A store endpoint (`http://host:port` or `https://host:port`); repeat, or separate
    /// with commas, for several.
    #[arg(
        long = "store",
        env = "KONTINUUM_ETCD_PROXY_STORE",
        value_delimiter = ',',
        required = true
    )]
    pub store: Vec<Uri>,
    /// Serving certificate (PEM chain); re-read when the file changes.
    #[arg(long, env = "KONTINUUM_ETCD_PROXY_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// Serving key (PEM); re-read when the file changes.
    #[arg(long, env = "KONTINUUM_ETCD_PROXY_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Serve without TLS (only behind something that terminates TLS for it).
    #[arg(
        long,
        env = "KONTINUUM_ETCD_PROXY_PLAINTEXT",
        conflicts_with = "tls_cert",
        required_unless_present = "tls_cert"
    )]
    pub plaintext: bool,
    /// CA bundle that signed the store's serving certificate (`https://` stores); the
    /// system's roots when unset.
    #[arg(long, env = "KONTINUUM_ETCD_PROXY_STORE_CA")]
    pub store_ca: Option<PathBuf>,
    /// Client certificate for the store.
    #[arg(long, env = "KONTINUUM_ETCD_PROXY_STORE_CERT", requires = "store_key")]
    pub store_cert: Option<PathBuf>,
    /// Client key for the store.
    #[arg(long, env = "KONTINUUM_ETCD_PROXY_STORE_KEY", requires = "store_cert")]
    pub store_key: Option<PathBuf>,
    /// Namespace of the zone identity Secrets; every namespace when unset.
    #[arg(long, env = "KONTINUUM_WATCH_NAMESPACE")]
    pub namespace: Option<String>,
    /// Kubeconfig of the hub; in-cluster configuration when unset.
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Address of the admin server (`/healthz`, `/readyz`, `/metrics`).
    #[arg(long, env = "KONTINUUM_ADMIN_ADDR", default_value = "0.0.0.0:8080")]
    pub admin_addr: SocketAddr,
    /// Threads serving calls; one per CPU when unset. Fewer threads spend less CPU per call
    /// where the proxy shares its CPUs with busy neighbours (see bench-results/etcd-proxy.md).
    #[arg(
        long,
        env = "KONTINUUM_ETCD_PROXY_WORKER_THREADS",
        value_parser = clap::value_parser!(u16).range(1..)
    )]
    pub worker_threads: Option<u16>,
    /// Logging.
    #[command(flatten)]
    pub log: LogArgs,
}

impl Command {
    /// The async runtime this command runs on. The relay serves one zone's agent over one
    /// hub connection, so it runs on one thread, which costs it less CPU per call than
    /// handing work between threads; `serve` uses `--worker-threads`.
    pub fn runtime(&self) -> std::io::Result<tokio::runtime::Runtime> {
        let mut builder = match self {
            Self::Serve(args) => {
                let mut builder = tokio::runtime::Builder::new_multi_thread();
                if let Some(n) = args.worker_threads {
                    builder.worker_threads(usize::from(n));
                }
                builder
            }
            Self::Relay(_) => tokio::runtime::Builder::new_current_thread(),
        };
        builder.enable_all().build()
    }
}

/// `etcd-proxy relay`.
#[derive(Args, Debug, Clone)]
pub struct RelayArgs {
    /// Local address to serve on: `unix:///path` or a loopback `host:port`.
    #[arg(
        long,
        env = "KONTINUUM_RELAY_LISTEN",
        default_value = "unix:///tmp/kontinuum-storage-relay.sock"
    )]
    pub listen: Listen,
    /// The hub's proxy: `https://host:port` (or `host:port`).
    #[arg(long, env = "KONTINUUM_RELAY_ENDPOINT")]
    pub endpoint: String,
    /// CA bundle that signed the proxy's certificate; the system's roots when unset.
    #[arg(long, env = "KONTINUUM_RELAY_CA")]
    pub ca: Option<PathBuf>,
    /// Do not verify the proxy's certificate (tests and emergencies only).
    #[arg(
        long,
        env = "KONTINUUM_RELAY_INSECURE_SKIP_VERIFY",
        conflicts_with = "ca"
    )]
    pub insecure_skip_verify: bool,
    /// Directory holding the zone identity: `tls.key` (PKCS#8 PEM ed25519) and `tls.crt`.
    #[arg(
        long,
        env = "KONTINUUM_RELAY_IDENTITY_DIR",
        default_value = "/etc/kontinuum/etcd-identity"
    )]
    pub identity_dir: PathBuf,
    /// The zone's name, `<region>-<zone>` (the tokens' `iss` and `sub`).
    #[arg(long, env = "KONTINUUM_RELAY_ZONE")]
    pub zone: String,
    /// Address of the relay's admin server (`/healthz`, `/readyz`, `/metrics`).
    #[arg(
        long,
        env = "KONTINUUM_RELAY_ADMIN_ADDR",
        default_value = "127.0.0.1:8081"
    )]
    pub admin_addr: SocketAddr,
    /// Logging.
    #[command(flatten)]
    pub log: LogArgs,
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
    /// The hub kubeconfig could not be used.
    #[error("loading the hub's Kubernetes configuration")]
    Kubeconfig(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// A TLS configuration could not be built.
    #[error("setting up TLS")]
    Tls(#[source] TlsError),
    /// An endpoint is not usable.
    #[error("invalid endpoint {endpoint}: {why}")]
    Endpoint {
        /// The endpoint.
        endpoint: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// The zone's key could not be read or used.
    #[error("loading the zone key {path}")]
    Key {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The listener could not be bound.
    #[error("listening on {listen}")]
    Bind {
        /// The address.
        listen: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The gRPC server failed.
    #[error("serving gRPC")]
    Serve(#[source] tonic::transport::Error),
}

fn init_logging(log: &LogArgs) -> Result<(), RunError> {
    telemetry::init(log.log_level, log.log_format, env!("CARGO_CRATE_NAME"))
        .map_err(|e| RunError::Telemetry(e.to_string()))
}

async fn hub_client(kubeconfig: Option<&PathBuf>) -> Result<kube::Client, RunError> {
    let boxed = |e: Box<dyn std::error::Error + Send + Sync>| RunError::Kubeconfig(e);
    let config = match kubeconfig {
        Some(path) => {
            let kubeconfig = Kubeconfig::read_from(path).map_err(|e| boxed(Box::new(e)))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .map_err(|e| boxed(Box::new(e)))?
        }
        None => kube::Config::infer()
            .await
            .map_err(|e| boxed(Box::new(e)))?,
    };
    kube::Client::try_from(config).map_err(|e| boxed(Box::new(e)))
}

fn spawn_admin(addr: SocketAddr, readiness: Readiness, registry: Registry, shutdown: Shutdown) {
    let router = admin::router(readiness, Arc::new(registry));
    tokio::spawn(async move {
        if let Err(err) = admin::serve(addr, router, shutdown.clone()).await {
            warn!(
                error = &err as &dyn std::error::Error,
                "admin server failed"
            );
            shutdown.trigger(kontinuum_operator_common::shutdown::Reason::Fatal(
                "admin server failed".into(),
            ));
        }
    });
}

fn grpc_server() -> tonic::transport::Server {
    tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(std::time::Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(std::time::Duration::from_secs(10)))
}

/// Runs `etcd-proxy serve` until SIGTERM/SIGINT.
pub async fn serve(args: ServeArgs) -> Result<(), RunError> {
    init_logging(&args.log)?;
    let shutdown = Shutdown::on_signals().map_err(RunError::Signals)?;
    info!(
        version = env!("CARGO_PKG_VERSION"),
        namespace = args.namespace.as_deref().unwrap_or("<all>"),
        "starting etcd-proxy serve"
    );
    for uri in &args.store {
        if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.host().is_none() {
            return Err(RunError::Endpoint {
                endpoint: uri.to_string(),
                why: "a store endpoint must be http://host:port or https://host:port",
            });
        }
    }
    let serving = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => {
            let cert = ReloadingCert::new(cert.clone(), key.clone()).map_err(RunError::Tls)?;
            Some(tls::server_config(Arc::new(cert)).map_err(RunError::Tls)?)
        }
        _ => None,
    };
    let store_tls = if args.store.iter().any(|u| u.scheme_str() == Some("https")) {
        let trust = args.store_ca.clone().map_or(Trust::System, Trust::CaFile);
        let identity = args.store_cert.as_deref().zip(args.store_key.as_deref());
        Some(tls::client_config(&trust, identity).map_err(RunError::Tls)?)
    } else {
        None
    };
    let store = Arc::new(Store::new(&args.store, store_tls));

    let mut registry = Registry::default();
    let metrics = Metrics::proxy(&mut registry);
    let readiness = Readiness::new(false);
    spawn_admin(
        args.admin_addr,
        readiness.clone(),
        registry,
        shutdown.clone(),
    );

    // Serve nothing before the trust store is complete: a zone must never be refused (or
    // admitted) because the list is half-read.
    let client = hub_client(args.kubeconfig.as_ref()).await?;
    let zones = Arc::new(Zones::default());
    let (synced_tx, synced_rx) = tokio::sync::oneshot::channel();
    tokio::spawn(zones::watch_identities(
        client,
        args.namespace.clone(),
        Arc::clone(&zones),
        readiness,
        synced_tx,
        shutdown.clone(),
    ));
    tokio::select! {
        () = shutdown.wait() => return Ok(()),
        _ = synced_rx => {}
    }

    let (incoming, local) = listen::bind(&args.listen, serving)
        .await
        .map_err(|source| RunError::Bind {
            listen: args.listen.to_string(),
            source,
        })?;
    info!(addr = %local, "serving etcd v3 to zones");
    let proxy = Proxy::new(zones, store, metrics);
    grpc_server()
        .add_service(KvServer::new(proxy.clone()).max_decoding_message_size(MAX_REQUEST_BYTES))
        .add_service(WatchServer::new(proxy.clone()).max_decoding_message_size(MAX_REQUEST_BYTES))
        .add_service(LeaseServer::new(proxy).max_decoding_message_size(MAX_REQUEST_BYTES))
        .serve_with_incoming_shutdown(incoming, async move { shutdown.wait().await })
        .await
        .map_err(RunError::Serve)
}

/// The hub endpoint as an `https://` URI (`host:port` means `https://host:port`).
pub fn hub_uri(endpoint: &str) -> Result<Uri, RunError> {
    let invalid = |why| RunError::Endpoint {
        endpoint: endpoint.to_string(),
        why,
    };
    let full = if endpoint.contains("://") {
        endpoint.to_string()
    } else {
        format!("https://{endpoint}")
    };
    let uri: Uri = full.parse().map_err(|_| invalid("not a URI"))?;
    if uri.scheme_str() != Some("https") {
        return Err(invalid("the hub is reached over TLS only: use https://"));
    }
    if uri.host().is_none() {
        return Err(invalid("no host"));
    }
    Ok(uri)
}

/// Runs `etcd-proxy relay` until SIGTERM/SIGINT.
pub async fn relay(args: RelayArgs) -> Result<(), RunError> {
    init_logging(&args.log)?;
    let shutdown = Shutdown::on_signals().map_err(RunError::Signals)?;
    info!(version = env!("CARGO_PKG_VERSION"), zone = %args.zone, "starting etcd-proxy relay");
    let key_path = args.identity_dir.join("tls.key");
    let pem = std::fs::read(&key_path).map_err(|e| RunError::Key {
        path: key_path.clone(),
        source: Box::new(e),
    })?;
    let signer = Signer::from_pkcs8_pem(&pem, args.zone.clone()).map_err(|e| RunError::Key {
        path: key_path.clone(),
        source: Box::new(e),
    })?;
    let cert_path = args.identity_dir.join("tls.crt");
    if let Ok(bundle) = std::fs::read(&cert_path)
        && !crate::identity::trusted_keys(&bundle)
            .iter()
            .any(|k| k.key == signer.public_key())
    {
        warn!(cert = %cert_path.display(), "tls.crt does not hold the key of tls.key; the hub will refuse this zone");
    }

    let uri = hub_uri(&args.endpoint)?;
    let trust = if args.insecure_skip_verify {
        warn!("the hub's certificate is not verified (--insecure-skip-verify)");
        Trust::InsecureSkipVerify
    } else {
        args.ca.clone().map_or(Trust::System, Trust::CaFile)
    };
    let client_tls = tls::client_config(&trust, None).map_err(RunError::Tls)?;
    let hub = tls::channel(uri, tls::Connector::new(Some(client_tls)));

    let mut registry = Registry::default();
    let metrics = Metrics::relay(&mut registry);
    let readiness = Readiness::new(false);
    readiness.set_synced();
    spawn_admin(args.admin_addr, readiness, registry, shutdown.clone());

    let (incoming, local) =
        listen::bind(&args.listen, None)
            .await
            .map_err(|source| RunError::Bind {
                listen: args.listen.to_string(),
                source,
            })?;
    info!(addr = %local, "relaying etcd v3 to the hub");
    let relay = Relay::new(hub, Arc::new(signer), metrics);
    grpc_server()
        .add_service(KvServer::new(relay.clone()).max_decoding_message_size(MAX_REQUEST_BYTES))
        .add_service(WatchServer::new(relay.clone()).max_decoding_message_size(MAX_REQUEST_BYTES))
        .add_service(LeaseServer::new(relay).max_decoding_message_size(MAX_REQUEST_BYTES))
        .serve_with_incoming_shutdown(incoming, async move { shutdown.wait().await })
        .await
        .map_err(RunError::Serve)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serve_needs_a_store_and_tls_or_an_explicit_plaintext() {
        let ok = Cli::try_parse_from([
            "etcd-proxy",
            "serve",
            "--store",
            "http://127.0.0.1:2379,http://127.0.0.2:2379",
            "--tls-cert",
            "c",
            "--tls-key",
            "k",
        ])
        .unwrap();
        let Command::Serve(args) = ok.command else {
            panic!("not serve")
        };
        assert_eq!(args.store.len(), 2);
        assert_eq!(args.listen.to_string(), "0.0.0.0:2379");
        assert!(
            Cli::try_parse_from(["etcd-proxy", "serve", "--tls-cert", "c", "--tls-key", "k"])
                .is_err()
        );
        assert!(Cli::try_parse_from(["etcd-proxy", "serve", "--store", "http://a:1"]).is_err());
        assert!(
            Cli::try_parse_from([
                "etcd-proxy",
                "serve",
                "--store",
                "http://a:1",
                "--plaintext"
            ])
            .is_ok()
        );
        assert!(
            Cli::try_parse_from([
                "etcd-proxy",
                "serve",
                "--store",
                "http://a:1",
                "--tls-cert",
                "c"
            ])
            .is_err()
        );
    }

    #[test]
    fn relay_flags_parse() {
        let cli = Cli::try_parse_from([
            "etcd-proxy",
            "relay",
            "--endpoint",
            "hub.example:443",
            "--zone",
            "eu-1a",
            "--listen",
            "unix:///tmp/r.sock",
        ])
        .unwrap();
        let Command::Relay(args) = cli.command else {
            panic!("not relay")
        };
        assert_eq!(args.listen, Listen::Unix("/tmp/r.sock".into()));
        assert_eq!(
            args.identity_dir,
            PathBuf::from("/etc/kontinuum/etcd-identity")
        );
        assert!(
            Cli::try_parse_from([
                "etcd-proxy",
                "relay",
                "--endpoint",
                "h:1",
                "--zone",
                "z",
                "--ca",
                "x",
                "--insecure-skip-verify",
            ])
            .is_err()
        );
    }

    #[test]
    fn the_hub_is_reached_over_tls_only() {
        assert_eq!(
            hub_uri("hub.example:443").unwrap().to_string(),
            "https://hub.example:443/"
        );
        assert!(hub_uri("https://127.0.0.1:9").is_ok());
        assert!(hub_uri("http://127.0.0.1:9").is_err());
        assert!(hub_uri("https://").is_err());
    }
}
