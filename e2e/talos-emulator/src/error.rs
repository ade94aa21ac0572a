//! Errors of the emulator's edges (files, sockets, certificates, the test bed).

/// An emulator failure, saying what we were doing.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{what}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{what}")]
    Pki {
        what: &'static str,
        #[source]
        source: rcgen::Error,
    },
    #[error("{what}")]
    Tls {
        what: &'static str,
        #[source]
        source: rustls::Error,
    },
    #[error("{what}")]
    Secrets {
        what: &'static str,
        #[source]
        source: Box<kontinuum_talos_config::SecretsError>,
    },
    #[error("the os ca certificate is not usable")]
    InvalidCa,
    #[error("the stored state of machine {address} is unreadable")]
    State {
        address: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("the stored config of machine {address} no longer parses")]
    StoredConfig {
        address: String,
        #[source]
        source: Box<kontinuum_talos_config::ConfigError>,
    },
    #[error("no os ca key is known for this worker's cluster yet")]
    NoOsCaKey,
    #[error("test bed")]
    Testbed(#[source] Box<kontinuum_testbed::Error>),
    #[error("invalid emulator settings: {0}")]
    Settings(&'static str),
}

impl Error {
    /// Stable CamelCase reason.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Io { .. } => "Io",
            Self::Pki { .. } => "Pki",
            Self::Tls { .. } => "Tls",
            Self::Secrets { .. } => "Secrets",
            Self::InvalidCa => "InvalidCa",
            Self::State { .. } => "State",
            Self::StoredConfig { .. } => "StoredConfig",
            Self::NoOsCaKey => "NoOsCaKey",
            Self::Testbed(_) => "Testbed",
            Self::Settings(_) => "Settings",
        }
    }
}
