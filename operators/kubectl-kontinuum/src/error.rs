//! The plugin's errors: each has a stable reason and an exit code, and prints as one line.

use std::path::PathBuf;
use std::time::Duration;

/// Everything that can make a command fail.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A flag's value is invalid; the message names the flag.
    #[error("{flag}: {message}")]
    Invalid {
        /// The flag, e.g. `--region`.
        flag: &'static str,
        /// What is wrong with its value.
        message: String,
    },
    /// The command line could not be parsed (clap's message, on one line).
    #[error("{0}")]
    Usage(String),
    /// The kubeconfig could not be read or used.
    #[error("loading the kubeconfig{}", path.as_ref().map(|p| format!(" {}", p.display())).unwrap_or_default())]
    Kubeconfig {
        /// The file, when one was named.
        path: Option<PathBuf>,
        /// The cause.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// Neither a kubeconfig nor an in-cluster configuration was found.
    #[error("no kubeconfig found (use --kubeconfig or $KUBECONFIG)")]
    NoConfig(#[source] kube::config::InClusterError),
    /// The client could not be built.
    #[error("building the Kubernetes client")]
    Client(#[source] kube::Error),
    /// A call to the API server failed.
    #[error("{what}")]
    Api {
        /// What we were doing, e.g. `applying Zone eu-west-1a`.
        what: String,
        /// The cause.
        #[source]
        source: kube::Error,
    },
    /// A call to the API server did not answer in time.
    #[error("{what}: no answer from the API server within {limit:?}")]
    CallTimeout {
        /// What we were doing.
        what: String,
        /// The limit (`--request-timeout`).
        limit: Duration,
    },
    /// An object the command needs does not exist (yet).
    #[error("{0}")]
    NotFound(String),
    /// The zone's kubeconfig, as stored on the hub, cannot be used.
    #[error("{0}")]
    ZoneKubeconfig(String),
    /// `--wait` gave up at `--timeout`; the message names the blocking condition.
    #[error("{0}")]
    WaitTimeout(String),
    /// A local file could not be read or written.
    #[error("{what} {}", path.display())]
    File {
        /// What we were doing, e.g. `writing`.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Writing to stdout or stderr failed (e.g. a closed pipe).
    #[error("writing output")]
    Output(#[source] std::io::Error),
    /// Encoding an object or a kubeconfig failed.
    #[error("encoding {0}")]
    Encode(String),
}

impl Error {
    /// Stable CamelCase category.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Invalid { .. } => "InvalidValue",
            Self::Usage(_) => "Usage",
            Self::Kubeconfig { .. } | Self::NoConfig(_) | Self::Client(_) => "KubeconfigError",
            Self::Api { .. } => "ApiError",
            Self::CallTimeout { .. } => "ApiTimeout",
            Self::NotFound(_) => "NotFound",
            Self::ZoneKubeconfig(_) => "InvalidZoneKubeconfig",
            Self::WaitTimeout(_) => "WaitTimeout",
            Self::File { .. } => "FileError",
            Self::Output(_) => "OutputError",
            Self::Encode(_) => "EncodeError",
        }
    }

    /// The process exit code: 1 usage, validation or local problem; 2 API error;
    /// 3 timeout.
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Invalid { .. }
            | Self::Usage(_)
            | Self::Kubeconfig { .. }
            | Self::NoConfig(_)
            | Self::Client(_)
            | Self::File { .. }
            | Self::Output(_)
            | Self::Encode(_) => 1,
            Self::Api { .. } | Self::NotFound(_) | Self::ZoneKubeconfig(_) => 2,
            Self::CallTimeout { .. } | Self::WaitTimeout(_) => 3,
        }
    }

    /// The error and its causes on one line: `error: <what>: <cause>: <cause>`, with any
    /// line breaks inside a message folded into spaces.
    pub fn one_line(&self) -> String {
        // The API server's own words, without kube's debug dump of the Status.
        if let Self::Api {
            what,
            source: kube::Error::Api(status),
        } = self
        {
            return fold_lines(&format!(
                "error: {what}: {} ({}, {})",
                status.message, status.reason, status.code
            ));
        }
        let mut text = format!("error: {self}");
        let mut source = std::error::Error::source(self);
        while let Some(cause) = source {
            let cause_text = cause.to_string();
            // kube errors repeat their source's text in their own; skip exact repeats.
            if !text.ends_with(&cause_text) {
                text.push_str(": ");
                text.push_str(&cause_text);
            }
            source = cause.source();
        }
        fold_lines(&text)
    }
}

/// Folds a multi-line text into one line, collapsing runs of whitespace.
pub fn fold_lines(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_follow_the_help() {
        let invalid = Error::Invalid {
            flag: "--region",
            message: "bad".into(),
        };
        assert_eq!(invalid.exit_code(), 1);
        assert_eq!(invalid.one_line(), "error: --region: bad");
        assert_eq!(Error::NotFound("zone x not found".into()).exit_code(), 2);
        assert_eq!(Error::WaitTimeout("late".into()).exit_code(), 3);
        let call = Error::CallTimeout {
            what: "getting Zone a-b".into(),
            limit: Duration::from_secs(30),
        };
        assert_eq!(call.exit_code(), 3);
        assert_eq!(call.reason(), "ApiTimeout");
    }

    #[test]
    fn one_line_folds_causes_and_newlines() {
        let err = Error::File {
            what: "writing",
            path: PathBuf::from("/x/y"),
            source: std::io::Error::other("disk\nfull"),
        };
        assert_eq!(err.one_line(), "error: writing /x/y: disk full");
    }
}
