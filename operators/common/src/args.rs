//! Arguments every operator takes. Each flag can also be set through its environment
//! variable (shown by `--help`); a bad value stops the binary at start-up.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

/// The arguments shared by all operators; flatten them into a binary's own.
#[derive(Args, Clone, Debug)]
pub struct CommonArgs {
    /// Kubeconfig of the hub; in-cluster configuration when unset.
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,

    /// Namespace to watch; every namespace when unset.
    #[arg(long, env = "KONTINUUM_WATCH_NAMESPACE")]
    pub namespace: Option<String>,

    /// Address of the admin server (`/healthz`, `/readyz`, `/metrics`).
    #[arg(long, env = "KONTINUUM_ADMIN_ADDR", default_value = "0.0.0.0:8080")]
    pub admin_addr: SocketAddr,

    /// Log level.
    #[arg(long, env = "KONTINUUM_LOG_LEVEL", value_enum, default_value_t = LogLevel::Info)]
    pub log_level: LogLevel,

    /// Log format.
    #[arg(long, env = "KONTINUUM_LOG_FORMAT", value_enum, default_value_t = LogFormat::Json)]
    pub log_format: LogFormat,

    /// Leader election.
    #[command(flatten)]
    pub leader: LeaderArgs,
}

/// Leader election arguments.
#[derive(Args, Clone, Debug)]
pub struct LeaderArgs {
    /// Act only while holding a coordination Lease, so that replicas never act at once. On
    /// by default (a rollout or a stuck node can briefly run two pods);
    /// `--leader-elect=false` for a process that is known to run alone.
    #[arg(long, env = "KONTINUUM_LEADER_ELECT", default_value_t = true,
          action = clap::ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_missing_value = "true")]
    pub leader_elect: bool,

    /// Name of the Lease; the operator's name when unset.
    #[arg(long, env = "KONTINUUM_LEASE_NAME")]
    pub lease_name: Option<String>,

    /// Namespace of the Lease: the pod's namespace (`POD_NAMESPACE`, from the downward
    /// API). When unset: the in-cluster ServiceAccount's namespace, else the watched
    /// namespace (`--namespace`); never a fixed name.
    #[arg(long, env = "POD_NAMESPACE")]
    pub lease_namespace: Option<String>,

    /// How long a Lease is valid without renewal, in seconds.
    #[arg(long, env = "KONTINUUM_LEASE_DURATION_SECONDS", default_value_t = 15,
          value_parser = clap::value_parser!(u64).range(2..=3600))]
    pub lease_duration_seconds: u64,

    /// This replica's identity in the Lease; the pod name (`POD_NAME`) or host name.
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
}

/// Where an in-cluster pod finds its own namespace (the ServiceAccount volume).
pub const SERVICE_ACCOUNT_NAMESPACE_FILE: &str =
    "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

/// Leader election is on but no namespace for its Lease is known.
#[derive(Debug, thiserror::Error)]
#[error(
    "leader election needs the Lease's namespace: set POD_NAMESPACE (the chart sets it from \
     the pod) or --lease-namespace, or watch one namespace (--namespace), or turn election \
     off with --leader-elect=false"
)]
pub struct NoLeaseNamespace;

impl LeaderArgs {
    /// The Lease's namespace: `--lease-namespace`/`POD_NAMESPACE`, else the namespace in
    /// `service_account_file` (in-cluster), else `watched` (the one namespace the
    /// operator watches).
    pub fn namespace(
        &self,
        service_account_file: &std::path::Path,
        watched: Option<&str>,
    ) -> Result<String, NoLeaseNamespace> {
        let nonempty = |s: &str| {
            let s = s.trim();
            (!s.is_empty()).then(|| s.to_owned())
        };
        self.lease_namespace
            .as_deref()
            .and_then(nonempty)
            .or_else(|| {
                std::fs::read_to_string(service_account_file)
                    .ok()
                    .as_deref()
                    .and_then(nonempty)
            })
            .or_else(|| watched.and_then(nonempty))
            .ok_or(NoLeaseNamespace)
    }
}

/// Log levels, as in `KONTINUUM_LOG_LEVEL`.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogLevel {
    /// Plans and decisions.
    Debug,
    /// Real state changes.
    Info,
    /// Failures that will be retried, degraded operation.
    Warn,
    /// A human must act.
    Error,
}

/// Log formats, as in `KONTINUUM_LOG_FORMAT`.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    /// One JSON object per line.
    Json,
    /// Human-readable lines, coloured on a terminal.
    Console,
    /// Human-readable lines, never coloured.
    Text,
}

/// Errors building a client.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The kubeconfig file could not be read or used.
    #[error("loading kubeconfig {path}")]
    Kubeconfig {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// Neither a kubeconfig nor an in-cluster configuration was found.
    #[error("inferring the Kubernetes configuration")]
    Infer(#[source] kube::config::InferConfigError),
    /// The client could not be built.
    #[error("building the Kubernetes client")]
    Build(#[source] kube::Error),
}

impl CommonArgs {
    /// A client for the hub: `--kubeconfig` when given, else the in-cluster configuration.
    pub async fn client(&self) -> Result<Client, ClientError> {
        let config = match &self.kubeconfig {
            Some(path) => {
                let err = |source| ClientError::Kubeconfig {
                    path: path.clone(),
                    source,
                };
                let kubeconfig = Kubeconfig::read_from(path).map_err(err)?;
                Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                    .await
                    .map_err(err)?
            }
            None => Config::infer().await.map_err(ClientError::Infer)?,
        };
        Client::try_from(config).map_err(ClientError::Build)
    }

    /// The identity for leases and event reporting: `--identity`, else the host name.
    pub fn identity(&self) -> String {
        self.leader.identity.clone().unwrap_or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map_or_else(|_| "unknown".to_string(), |h| h.trim().to_string())
        })
    }
}

/// Parses a duration flag of the operators: `250ms`, `15s`, `5m`, `1h` or a plain number of
/// seconds; zero is refused.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let n: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration like 15s, 5m or 1h"))?;
    let d = match unit {
        "ms" => Duration::from_millis(n),
        "" | "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n.saturating_mul(60)),
        "h" => Duration::from_secs(n.saturating_mul(3600)),
        _ => return Err(format!("{text:?} has an unknown unit (use ms, s, m or h)")),
    };
    if d.is_zero() {
        return Err("a duration must be positive".into());
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        common: CommonArgs,
    }

    #[test]
    fn defaults_follow_the_reference() {
        let cli = Cli::try_parse_from(["op"]).unwrap();
        assert_eq!(cli.common.log_level, LogLevel::Info);
        assert_eq!(cli.common.log_format, LogFormat::Json);
        assert_eq!(cli.common.admin_addr.port(), 8080);
        assert!(
            cli.common.leader.leader_elect,
            "leader election is on by default"
        );
        assert!(cli.common.namespace.is_none());
    }

    #[test]
    fn leader_election_can_be_turned_off_only_explicitly() {
        let off = Cli::try_parse_from(["op", "--leader-elect=false"]).unwrap();
        assert!(!off.common.leader.leader_elect);
        let on = Cli::try_parse_from(["op", "--leader-elect"]).unwrap();
        assert!(on.common.leader.leader_elect);
        let on = Cli::try_parse_from(["op", "--leader-elect=true"]).unwrap();
        assert!(on.common.leader.leader_elect);
        let err = Cli::try_parse_from(["op", "--leader-elect=maybe"])
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("--leader-elect"), "{err}");
    }

    #[test]
    fn the_lease_namespace_is_the_pods_never_a_fixed_name() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing");
        let file = dir.path().join("namespace");
        std::fs::write(&file, "from-service-account\n").unwrap();
        let parse = |args: &[&str]| {
            let mut all = vec!["op"];
            all.extend_from_slice(args);
            Cli::try_parse_from(all).unwrap().common.leader
        };
        let explicit = parse(&["--lease-namespace", "pods-ns"]);
        assert_eq!(
            explicit.namespace(&file, Some("watched")).unwrap(),
            "pods-ns"
        );
        let unset = parse(&[]);
        assert_eq!(
            unset.namespace(&file, Some("watched")).unwrap(),
            "from-service-account"
        );
        assert_eq!(
            unset.namespace(&missing, Some("watched")).unwrap(),
            "watched"
        );
        let err = unset.namespace(&missing, None).unwrap_err().to_string();
        assert!(err.contains("POD_NAMESPACE"), "{err}");
        let blank = parse(&["--lease-namespace", " "]);
        assert!(
            blank.namespace(&missing, None).is_err(),
            "a blank value is unset"
        );
    }

    #[test]
    fn bad_values_are_refused_naming_the_flag() {
        let err = Cli::try_parse_from(["op", "--log-level", "loud"])
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("--log-level"), "{err}");
        let err = Cli::try_parse_from(["op", "--lease-duration-seconds", "1"])
            .err()
            .unwrap();
        assert!(
            err.to_string().contains("--lease-duration-seconds"),
            "{err}"
        );
    }

    #[test]
    fn flags_parse() {
        let cli = Cli::try_parse_from([
            "op",
            "--log-format",
            "text",
            "--namespace",
            "zones",
            "--leader-elect",
            "--identity",
            "replica-1",
            "--admin-addr",
            "127.0.0.1:9000",
        ])
        .unwrap();
        assert_eq!(cli.common.log_format, LogFormat::Text);
        assert_eq!(cli.common.namespace.as_deref(), Some("zones"));
        assert!(cli.common.leader.leader_elect);
        assert_eq!(cli.common.identity(), "replica-1");
        assert_eq!(cli.common.admin_addr.to_string(), "127.0.0.1:9000");
    }
}
