//! Typed errors of the Talos client, with a stable [`ErrorKind`] per failure.
//!
//! [`Error::kind`] gives the category (`reason()` is its CamelCase name, for condition
//! reasons and metric labels); [`Error::is_transient`] says whether retrying can help.

use std::error::Error as StdError;
use std::fmt;
use std::io;
use std::time::Duration;

use tonic::Code;

type BoxError = Box<dyn StdError + Send + Sync>;

/// The RPC an error came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rpc {
    Version,
    ApplyConfiguration,
    Bootstrap,
    Kubeconfig,
    Reset,
    HealthCheck,
    CosiGet,
    CosiList,
}

impl fmt::Display for Rpc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Version => "MachineService/Version",
            Self::ApplyConfiguration => "MachineService/ApplyConfiguration",
            Self::Bootstrap => "MachineService/Bootstrap",
            Self::Kubeconfig => "MachineService/Kubeconfig",
            Self::Reset => "MachineService/Reset",
            Self::HealthCheck => "ClusterService/HealthCheck",
            Self::CosiGet => "cosi State/Get",
            Self::CosiList => "cosi State/List",
        })
    }
}

/// The category of a failure. Stable: [`ErrorKind::reason`] is API.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// Bad input on our side: endpoint, node name or client identity.
    InvalidInput,
    /// No TCP connection (refused, no route, DNS).
    Unreachable,
    /// The connect or call bound passed (ours or the server's `DeadlineExceeded`).
    TimedOut,
    /// The TLS handshake failed: the server's certificate did not verify against the CA, or
    /// the server refused our client certificate. Transient, because a machine that is still
    /// rebooting out of maintenance mode presents its maintenance certificate for a while.
    Tls,
    /// The machine refused the request as invalid (`InvalidArgument`, `OutOfRange`), e.g. a
    /// rejected machine config.
    InvalidArgument,
    /// `AlreadyExists`, e.g. Bootstrap on a node whose etcd already has data.
    AlreadyExists,
    /// `PermissionDenied`/`Unauthenticated`: the caller's role does not allow this call.
    PermissionDenied,
    /// `FailedPrecondition`: the machine is not ready for this yet (time not synced, another
    /// apply in progress, ...).
    FailedPrecondition,
    /// `NotFound`.
    NotFound,
    /// `Unavailable`, `Cancelled`, `Aborted`, `ResourceExhausted`: try again later.
    Unavailable,
    /// `Unimplemented`: wrong kind of machine or mode (e.g. HealthCheck in maintenance mode).
    Unimplemented,
    /// `Internal`, `Unknown`, `DataLoss`: the machine failed for its own reasons.
    Internal,
    /// The reply could not be used (empty, malformed, bad archive or YAML).
    Protocol,
    /// A pinned maintenance connection met another machine: its certificate's public key is
    /// not the recorded identity. Not transient: a human must accept the new machine (or
    /// put the old one back).
    IdentityMismatch,
}

impl ErrorKind {
    /// Stable CamelCase name, for condition reasons and metric labels.
    pub fn reason(self) -> &'static str {
        match self {
            Self::InvalidInput => "InvalidInput",
            Self::Unreachable => "Unreachable",
            Self::TimedOut => "TimedOut",
            Self::Tls => "TlsHandshakeFailed",
            Self::InvalidArgument => "InvalidArgument",
            Self::AlreadyExists => "AlreadyExists",
            Self::PermissionDenied => "PermissionDenied",
            Self::FailedPrecondition => "FailedPrecondition",
            Self::NotFound => "NotFound",
            Self::Unavailable => "Unavailable",
            Self::Unimplemented => "Unimplemented",
            Self::Internal => "Internal",
            Self::Protocol => "ProtocolError",
            Self::IdentityMismatch => "IdentityMismatch",
        }
    }

    /// Whether retrying the same call later can succeed.
    pub fn is_transient(self) -> bool {
        matches!(
            self,
            Self::Unreachable
                | Self::TimedOut
                | Self::Tls
                | Self::FailedPrecondition
                | Self::Unavailable
                | Self::Internal
        )
    }

    /// The category of a gRPC status code.
    pub fn from_code(code: Code) -> Self {
        match code {
            Code::InvalidArgument | Code::OutOfRange => Self::InvalidArgument,
            Code::AlreadyExists => Self::AlreadyExists,
            Code::PermissionDenied | Code::Unauthenticated => Self::PermissionDenied,
            Code::FailedPrecondition => Self::FailedPrecondition,
            Code::NotFound => Self::NotFound,
            Code::DeadlineExceeded => Self::TimedOut,
            Code::Unavailable | Code::Cancelled | Code::Aborted | Code::ResourceExhausted => {
                Self::Unavailable
            }
            Code::Unimplemented => Self::Unimplemented,
            Code::Internal | Code::Unknown | Code::DataLoss => Self::Internal,
            Code::Ok => Self::Protocol,
        }
    }

    /// The category of a transport failure: a TLS error anywhere in the chain wins, then I/O
    /// errors; `fallback` otherwise.
    pub(crate) fn from_transport(err: &(dyn StdError + 'static), fallback: Self) -> Self {
        let mut next = Some(err);
        while let Some(e) = next {
            if e.is::<rustls::Error>() {
                return Self::Tls;
            }
            if let Some(io) = e.downcast_ref::<io::Error>() {
                if io
                    .get_ref()
                    .is_some_and(<dyn StdError + Send + Sync>::is::<rustls::Error>)
                {
                    return Self::Tls;
                }
                // h2 re-creates I/O errors from kind and text, losing the rustls type; a TLS
                // alert from the peer (e.g. CertificateRequired) then only shows in the text.
                if io.kind() == io::ErrorKind::InvalidData && io.to_string().contains("alert") {
                    return Self::Tls;
                }
                return match io.kind() {
                    io::ErrorKind::TimedOut => Self::TimedOut,
                    io::ErrorKind::ConnectionRefused
                    | io::ErrorKind::ConnectionReset
                    | io::ErrorKind::ConnectionAborted
                    // The peer closed the connection mid-call, e.g. a server that refused
                    // our client certificate after a TLS 1.3 handshake.
                    | io::ErrorKind::BrokenPipe
                    | io::ErrorKind::HostUnreachable
                    | io::ErrorKind::NetworkUnreachable
                    | io::ErrorKind::AddrNotAvailable
                    | io::ErrorKind::NotFound => Self::Unreachable,
                    _ => fallback,
                };
            }
            next = e.source();
        }
        fallback
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.reason())
    }
}

/// A Talos client failure, saying what we were doing and to which endpoint.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid Talos endpoint {endpoint:?}")]
    InvalidEndpoint { endpoint: String },

    #[error("invalid node name {node:?} for metadata routing")]
    InvalidNode { node: String },

    #[error("invalid Talos client identity")]
    Identity(#[source] IdentityError),

    #[error("building the TLS client configuration failed")]
    TlsConfig(#[source] rustls::Error),

    #[error("connecting to Talos API at {endpoint} failed ({kind})")]
    Connect {
        endpoint: String,
        kind: ErrorKind,
        #[source]
        source: BoxError,
    },

    #[error(
        "nothing was sent: the machine at {endpoint} presents identity {presented}, not the recorded {expected} (another machine answers at this address)"
    )]
    IdentityMismatch {
        endpoint: String,
        expected: String,
        presented: String,
    },

    #[error("connecting to Talos API at {endpoint} timed out after {after:?}")]
    ConnectTimedOut { endpoint: String, after: Duration },

    #[error("{rpc} on {target} timed out after {after:?}")]
    TimedOut {
        rpc: Rpc,
        target: String,
        after: Duration,
    },

    #[error("{rpc} on {target} failed ({kind})")]
    Rpc {
        rpc: Rpc,
        target: String,
        kind: ErrorKind,
        #[source]
        status: Box<RemoteStatus>,
    },

    #[error("{rpc} on {target} returned an unusable reply")]
    Protocol {
        rpc: Rpc,
        target: String,
        #[source]
        source: ProtocolError,
    },
}

impl Error {
    /// The category of this failure.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::InvalidEndpoint { .. }
            | Self::InvalidNode { .. }
            | Self::Identity(_)
            | Self::TlsConfig(_) => ErrorKind::InvalidInput,
            Self::Connect { kind, .. } | Self::Rpc { kind, .. } => *kind,
            Self::ConnectTimedOut { .. } | Self::TimedOut { .. } => ErrorKind::TimedOut,
            Self::Protocol { .. } => ErrorKind::Protocol,
            Self::IdentityMismatch { .. } => ErrorKind::IdentityMismatch,
        }
    }

    /// Stable CamelCase reason, see [`ErrorKind::reason`].
    pub fn reason(&self) -> &'static str {
        self.kind().reason()
    }

    /// Whether retrying later can succeed, see [`ErrorKind::is_transient`].
    pub fn is_transient(&self) -> bool {
        self.kind().is_transient()
    }

    /// Whether the call may have taken effect on the machine although it failed: its
    /// deadline passed, or the connection broke after the request went out (the machine
    /// may have acted and rebooted, or its answer was lost). False when nothing was sent
    /// (connect, TLS, identity pin) or when the machine itself answered with a status: a
    /// call that must happen exactly once is only retried blindly when this is false.
    pub fn outcome_unknown(&self) -> bool {
        match self {
            Self::TimedOut { .. } => true,
            Self::Rpc { kind, status, .. } => {
                *kind == ErrorKind::TimedOut || StdError::source(&status.0).is_some()
            }
            _ => false,
        }
    }

    /// The gRPC status the machine answered with, if the failure was a status.
    pub fn status(&self) -> Option<&tonic::Status> {
        match self {
            Self::Rpc { status, .. } => Some(&status.0),
            _ => None,
        }
    }

    pub(crate) fn rpc(rpc: Rpc, target: &str, status: tonic::Status) -> Self {
        let by_code = ErrorKind::from_code(status.code());
        // Transport failures arrive as Unavailable/Unknown statuses with the cause as source.
        let kind = match (status.code(), StdError::source(&status)) {
            // tonic enforces the `grpc-timeout` we send on the client side too.
            (Code::Cancelled, Some(_)) if status.message() == "Timeout expired" => {
                ErrorKind::TimedOut
            }
            (Code::Unavailable | Code::Unknown | Code::Internal, Some(src)) => {
                ErrorKind::from_transport(src, by_code)
            }
            _ => by_code,
        };
        // Debug only: the machine's text can echo the config it refused.
        tracing::debug!(%rpc, target, code = ?status.code(), message = status.message(), "talos call failed");
        Self::Rpc {
            rpc,
            target: target.to_owned(),
            kind,
            status: Box::new(RemoteStatus(status)),
        }
    }

    pub(crate) fn protocol(rpc: Rpc, target: &str, source: ProtocolError) -> Self {
        Self::Protocol {
            rpc,
            target: target.to_owned(),
            source,
        }
    }
}

/// The gRPC status a machine answered with. Its `Display` names the code only: the machine's
/// message can echo machine-config values (a refused config is quoted back), and error text
/// reaches condition messages, Events and info+ logs. The message is logged at debug where
/// the error is made, and is available through [`Error::status`]. Its source is the
/// transport cause, if any (a connection refused, a TLS alert), which holds no values.
#[derive(Debug)]
pub struct RemoteStatus(pub tonic::Status);

impl fmt::Display for RemoteStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the machine answered {:?}; the operator's debug log has its message",
            self.0.code()
        )
    }
}

impl StdError for RemoteStatus {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        StdError::source(&self.0)
    }
}

/// A client identity (CA, certificate, key) that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error("CA bundle holds no PEM certificate")]
    NoCaCertificate,
    #[error("CA certificate is not usable as a trust anchor")]
    InvalidCaCertificate(#[source] rustls::Error),
    #[error("client certificate PEM holds no certificate")]
    NoClientCertificate,
    #[error("PEM could not be parsed")]
    Pem(#[source] rustls::pki_types::pem::Error),
    #[error("client private key PEM holds no usable private key")]
    InvalidPrivateKey,
    #[error("client certificate and key were refused by rustls")]
    Rejected(#[source] rustls::Error),
}

/// A reply that could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ProtocolError {
    #[error("reply carried no message")]
    EmptyReply,
    #[error("kubeconfig archive could not be read")]
    Kubeconfig(#[source] crate::kubeconfig::KubeconfigError),
    #[error("resource {id:?} has no spec")]
    MissingSpec { id: String },
    #[error("spec of resource {id:?} is not valid YAML of the expected shape")]
    Spec {
        id: String,
        #[source]
        source: Box<serde_saphyr::Error>,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_deadline_or_a_broken_transport_leaves_the_outcome_unknown() {
        let answered = Error::rpc(Rpc::Bootstrap, "n", tonic::Status::unavailable("busy"));
        assert!(!answered.outcome_unknown(), "the machine answered");
        let broken = Error::rpc(
            Rpc::Bootstrap,
            "n",
            tonic::Status::from_error(Box::new(io::Error::new(
                io::ErrorKind::ConnectionReset,
                "reset",
            ))),
        );
        assert!(broken.outcome_unknown(), "the connection broke mid-call");
        let deadline = Error::rpc(Rpc::Bootstrap, "n", tonic::Status::deadline_exceeded("x"));
        assert!(deadline.outcome_unknown());
        let timed_out = Error::TimedOut {
            rpc: Rpc::Bootstrap,
            target: "n".into(),
            after: Duration::from_secs(1),
        };
        assert!(timed_out.outcome_unknown());
        let connect = Error::Connect {
            endpoint: "n".into(),
            kind: ErrorKind::Unreachable,
            source: Box::new(io::Error::other("refused")),
        };
        assert!(!connect.outcome_unknown(), "nothing was sent");
    }

    #[test]
    fn status_codes_map_to_kinds_and_transience() {
        let cases = [
            (Code::InvalidArgument, ErrorKind::InvalidArgument, false),
            (Code::AlreadyExists, ErrorKind::AlreadyExists, false),
            (Code::PermissionDenied, ErrorKind::PermissionDenied, false),
            (Code::Unauthenticated, ErrorKind::PermissionDenied, false),
            (
                Code::FailedPrecondition,
                ErrorKind::FailedPrecondition,
                true,
            ),
            (Code::Unavailable, ErrorKind::Unavailable, true),
            (Code::DeadlineExceeded, ErrorKind::TimedOut, true),
            (Code::Unimplemented, ErrorKind::Unimplemented, false),
            (Code::NotFound, ErrorKind::NotFound, false),
            (Code::Unknown, ErrorKind::Internal, true),
        ];
        for (code, kind, transient) in cases {
            let err = Error::rpc(
                Rpc::Bootstrap,
                "10.0.0.1:50000",
                tonic::Status::new(code, "x"),
            );
            assert_eq!(err.kind(), kind, "{code:?}");
            assert_eq!(err.is_transient(), transient, "{code:?}");
            assert_eq!(err.status().map(tonic::Status::code), Some(code));
        }
        let err = Error::rpc(
            Rpc::Bootstrap,
            "n",
            tonic::Status::already_exists("etcd data"),
        );
        assert_eq!(err.reason(), "AlreadyExists");
        assert_eq!(
            err.to_string(),
            "MachineService/Bootstrap on n failed (AlreadyExists)"
        );
    }

    #[test]
    fn the_machines_text_stays_out_of_the_error_chain() {
        let err = Error::rpc(
            Rpc::Bootstrap,
            "n",
            tonic::Status::invalid_argument("config: cluster.secret \"s3cr3t\" is invalid"),
        );
        let mut text = err.to_string();
        let mut next = StdError::source(&err);
        while let Some(e) = next {
            text.push_str(&e.to_string());
            next = e.source();
        }
        assert!(!text.contains("s3cr3t"), "{text}");
        assert!(text.contains("InvalidArgument"), "{text}");
        assert_eq!(
            err.status().map(tonic::Status::message),
            Some("config: cluster.secret \"s3cr3t\" is invalid")
        );
    }

    #[test]
    fn transport_causes_are_classified() {
        let refused = io::Error::from(io::ErrorKind::ConnectionRefused);
        assert_eq!(
            ErrorKind::from_transport(&refused, ErrorKind::Internal),
            ErrorKind::Unreachable
        );
        let closed = io::Error::new(io::ErrorKind::BrokenPipe, "stream closed");
        assert_eq!(
            ErrorKind::from_transport(&closed, ErrorKind::Internal),
            ErrorKind::Unreachable
        );
        let tls = io::Error::new(io::ErrorKind::InvalidData, rustls::Error::DecryptError);
        assert_eq!(
            ErrorKind::from_transport(&tls, ErrorKind::Internal),
            ErrorKind::Tls
        );
        let status = tonic::Status::from_error(Box::new(tls));
        let err = Error::rpc(Rpc::Version, "n", status);
        assert_eq!(err.kind(), ErrorKind::Tls);
        let alert = io::Error::new(
            io::ErrorKind::InvalidData,
            "received fatal alert: CertificateRequired".to_owned(),
        );
        assert_eq!(
            ErrorKind::from_transport(&alert, ErrorKind::Internal),
            ErrorKind::Tls
        );
        let other = io::Error::other("boom");
        assert_eq!(
            ErrorKind::from_transport(&other, ErrorKind::Internal),
            ErrorKind::Internal
        );
    }

    #[test]
    fn input_errors_are_permanent() {
        let err = Error::InvalidEndpoint {
            endpoint: "x y".into(),
        };
        assert_eq!((err.reason(), err.is_transient()), ("InvalidInput", false));
    }
}
