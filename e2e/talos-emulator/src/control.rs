//! The HTTP control interface (on loopback) for fault injection:
//!
//! * `POST /machines/<address>/fault` with `{"fault":"hang","seconds":5}`, `{"fault":"refuse"}`,
//!   `{"fault":"unavailable"}`, `{"fault":"reboot"}`, `{"fault":"replace"}` (a new maintenance
//!   key: another machine at this address), the armed, one-shot fault points
//!   `{"fault":"hang-after-bootstrap","seconds":60}`, `{"fault":"reboot-after-bootstrap"}`,
//!   `{"fault":"drop-after-apply"}`, `{"fault":"refuse-after-apply"}`, `{"fault":"power-off"}`, or
//!   `{"fault":"clear"}` → `204`;
//!   `404` for an unknown machine, `400` for a bad body.
//! * `GET /machines` → one line `<address> <port> <mode>` per machine.
//! * `GET /machines/<address>/calls` → the machine's recent ApplyConfiguration, Bootstrap,
//!   Kubeconfig, HealthCheck, Reboot and Upgrade calls as a JSON array of [`CallRecord`](crate::CallRecord)
//!   (arrival and end in Unix milliseconds), oldest first; `404` for an unknown machine.
//! * `GET /machines/<address>/config` → the machine config the machine runs (YAML, with the
//!   cluster's keys: the interface is on loopback, for tests); `404` for an unknown machine
//!   or one in maintenance mode.

use std::fmt::Write as _;
use std::sync::Weak;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use tokio::net::TcpListener;

use crate::machine::Shared;
use crate::{Fault, FaultError, Mode};

/// Serves the control interface until the process ends.
pub(crate) async fn serve(listener: TcpListener, shared: Weak<Shared>) {
    let app = Router::new()
        .route("/machines", get(list))
        .route("/machines/{address}/fault", post(fault))
        .route("/machines/{address}/calls", get(calls))
        .route("/machines/{address}/config", get(config))
        .with_state(shared);
    if let Err(err) = axum::serve(listener, app).await {
        tracing::warn!(
            error = &err as &dyn std::error::Error,
            "control interface ended"
        );
    }
}

async fn list(State(shared): State<Weak<Shared>>) -> (StatusCode, String) {
    let Some(shared) = shared.upgrade() else {
        return (StatusCode::SERVICE_UNAVAILABLE, String::new());
    };
    let mut out = String::new();
    for m in &shared.machines {
        let mode = match m.mode() {
            Mode::Maintenance => "maintenance",
            Mode::Configured => "configured",
        };
        let addr = m.socket_addr();
        let _ = writeln!(out, "{} {} {mode}", addr.ip(), addr.port());
    }
    (StatusCode::OK, out)
}

async fn calls(
    State(shared): State<Weak<Shared>>,
    Path(address): Path<String>,
) -> (StatusCode, String) {
    let Some(shared) = shared.upgrade() else {
        return (StatusCode::SERVICE_UNAVAILABLE, String::new());
    };
    match crate::find(&shared, &address) {
        Some(machine) => (
            StatusCode::OK,
            serde_json::to_string(&machine.calls()).unwrap_or_default(),
        ),
        None => (StatusCode::NOT_FOUND, format!("no machine at {address}\n")),
    }
}

async fn config(
    State(shared): State<Weak<Shared>>,
    Path(address): Path<String>,
) -> (StatusCode, String) {
    let Some(shared) = shared.upgrade() else {
        return (StatusCode::SERVICE_UNAVAILABLE, String::new());
    };
    match crate::find(&shared, &address).map(|m| m.running_config()) {
        Some(Some(config)) => (StatusCode::OK, config),
        Some(None) => (
            StatusCode::NOT_FOUND,
            format!("{address} runs no config (maintenance mode)\n"),
        ),
        None => (StatusCode::NOT_FOUND, format!("no machine at {address}\n")),
    }
}

async fn fault(
    State(shared): State<Weak<Shared>>,
    Path(address): Path<String>,
    body: String,
) -> (StatusCode, String) {
    let Some(shared) = shared.upgrade() else {
        return (StatusCode::SERVICE_UNAVAILABLE, String::new());
    };
    let fault: Fault = match serde_json::from_str(&body) {
        Ok(f) => f,
        Err(e) => return (StatusCode::BAD_REQUEST, format!("bad fault: {e}\n")),
    };
    match crate::inject(&shared, &address, fault).await {
        Ok(()) => (StatusCode::NO_CONTENT, String::new()),
        Err(e @ FaultError::UnknownMachine(_)) => (StatusCode::NOT_FOUND, format!("{e}\n")),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("{}\n", kontinuum_testbed::error_chain(&e)),
        ),
    }
}
