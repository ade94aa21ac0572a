//! What every operator binary does around its controllers, written once: logging, the hub
//! client, the shutdown signal, the admin server with its metrics, leader election, and the
//! exit status. A `main` parses its arguments and hands its controllers to [`main`].

use std::future::Future;
use std::sync::Arc;

use kube::Client;
use prometheus_client::registry::Registry;

use crate::admin::{self, Readiness};
use crate::args::{ClientError, CommonArgs};
use crate::events::Events;
use crate::leader::Leadership;
use crate::metrics::ControllerMetrics;
use crate::shutdown::{Reason, Shutdown};
use crate::telemetry;

/// What a controller gets from the runtime.
pub struct Runtime {
    /// Hub client.
    pub client: Client,
    /// Reconcile metrics, registered under the controller's name.
    pub metrics: Arc<ControllerMetrics>,
    /// Event publisher, reporting as `<controller>.kontinuum.sh` and this replica.
    pub events: Events,
    /// `/readyz`: the controller reports its watches' sync here.
    pub readiness: Readiness,
    /// The process's shutdown signal.
    pub shutdown: Shutdown,
}

/// Why an operator stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum OperatorError {
    /// Logging could not be set up.
    #[error("setting up logging: {0}")]
    Telemetry(String),
    /// The hub could not be reached or configured.
    #[error("connecting to the hub")]
    Client(#[source] ClientError),
    /// Signal handlers could not be installed.
    #[error("installing signal handlers")]
    Signals(#[source] std::io::Error),
    /// Leader election could not start.
    #[error("starting leader election")]
    Leader(#[source] crate::leader::LeaderError),
    /// The admin server failed.
    #[error("admin server")]
    Admin(#[source] std::io::Error),
    /// Something the process cannot run without failed (e.g. the leader lease was lost).
    #[error("stopped: {0}")]
    Fatal(String),
}

/// Runs an operator: sets up logging, the client, signals, the admin server and leader
/// election, then `controllers` once this replica may act, until SIGTERM/SIGINT. Returns an
/// error (a non-zero exit) when it stopped for a fatal reason.
pub async fn main<F, Fut>(
    args: &CommonArgs,
    controller: &'static str,
    crate_target: &str,
    controllers: F,
) -> Result<(), OperatorError>
where
    F: FnOnce(Runtime) -> Fut,
    Fut: Future<Output = ()>,
{
    telemetry::init(args.log_level, args.log_format, crate_target)
        .map_err(|e| OperatorError::Telemetry(e.to_string()))?;
    let identity = args.identity();
    tracing::info!(
        controller,
        namespace = ?args.namespace,
        identity = %identity,
        leader_elect = args.leader.leader_elect,
        "starting"
    );
    let client = args.client().await.map_err(OperatorError::Client)?;
    let shutdown = Shutdown::on_signals().map_err(OperatorError::Signals)?;
    let readiness = Readiness::new(args.leader.leader_elect);
    let mut registry = Registry::default();
    let metrics = ControllerMetrics::register(&mut registry, controller);
    let server = admin::router(readiness.clone(), Arc::new(registry));
    let admin = tokio::spawn(admin::serve(args.admin_addr, server, shutdown.clone()));
    let mut leadership = Leadership::start(
        client.clone(),
        &args.leader,
        controller,
        identity.clone(),
        readiness.clone(),
        shutdown.clone(),
        args.namespace.as_deref(),
    )
    .await
    .map_err(OperatorError::Leader)?;
    tokio::select! {
        () = leadership.acquired() => {
            let events = Events::new(client.clone(), controller, Some(identity));
            controllers(Runtime { client, metrics, events, readiness, shutdown: shutdown.clone() }).await;
        }
        () = shutdown.wait() => {}
    }
    shutdown.trigger(Reason::Signal);
    match admin.await {
        Ok(result) => result.map_err(OperatorError::Admin)?,
        Err(join) => {
            return Err(OperatorError::Fatal(format!(
                "the admin server task failed: {join}"
            )));
        }
    }
    match shutdown.reason() {
        Some(Reason::Fatal(why)) => Err(OperatorError::Fatal(why)),
        _ => Ok(()),
    }
}

/// Drains a controller's result stream (`Controller::run`) until it ends. Failures were
/// already logged, counted and backed off by the error policy; what is left (e.g. an object
/// that vanished) is logged at debug.
pub async fn drain<S, T, E>(results: S)
where
    S: futures::Stream<Item = Result<T, E>>,
    E: std::error::Error + 'static,
{
    use futures::StreamExt as _;
    results
        .for_each_concurrent(None, |result| async move {
            if let Err(error) = result {
                tracing::debug!(
                    error = &error as &dyn std::error::Error,
                    "reconcile did not finish"
                );
            }
        })
        .await;
}
