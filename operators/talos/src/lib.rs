//! Kontinuum's Talos API client.
//!
//! * [`TalosClient::connect_maintenance`]: a machine in maintenance mode. TLS without server
//!   verification (the certificate comes from an ephemeral in-memory CA) and without a client
//!   certificate; the server certificate is captured as [`PeerCertificate`] fingerprints.
//! * [`TalosClient::connect`]: a configured machine. mTLS with a [`ClientIdentity`] (the
//!   `os:admin` certificate of the cluster's talosconfig), server verified against its CA.
//! * [`TalosClient::with_node`]: route calls through a control-plane endpoint to another node
//!   (single-valued `node` metadata).
//!
//! Every call is bounded by [`Timeouts`]; failures are [`Error`]s with a stable
//! [`ErrorKind`] (`reason()`, `is_transient()`). Pure helpers live in [`kubeconfig`]
//! (gzip'd tar extraction) and [`discovery`] (COSI YAML specs to Instance status types).

mod client;
pub mod discovery;
mod endpoint;
mod error;
pub mod kubeconfig;
mod tls;

pub use client::{
    ApplyMode, ApplyOutcome, BootstrapOutcome, MAX_MESSAGE_SIZE, ResetOptions, TalosClient,
    Timeouts, Version,
};
pub use discovery::Discovery;
pub use endpoint::{DEFAULT_PORT, Endpoint};
pub use error::{Error, ErrorKind, IdentityError, ProtocolError, RemoteStatus, Rpc};
pub use kubeconfig::Kubeconfig;
pub use tls::{ClientIdentity, PeerCertificate};
