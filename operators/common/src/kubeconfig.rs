//! Clients for downstream (zone) clusters from a kubeconfig document, as stored in a
//! TalosCluster's kubeconfig Secret, with explicit connect, read and write timeouts: a zone
//! cluster that stops answering fails the call instead of hanging a reconcile.

use std::time::Duration;

use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

/// Why no client could be built. The parser's own messages are not kept: they may quote
/// part of the document, which holds credentials, and this text reaches conditions.
#[derive(Debug, thiserror::Error)]
pub enum KubeconfigError {
    /// Not a kubeconfig document.
    #[error("the cluster's kubeconfig is not a kubeconfig document")]
    Parse,
    /// No usable context, cluster or user.
    #[error("the cluster's kubeconfig has no usable context, cluster or user")]
    Config,
    /// Building the client failed.
    #[error("building a client for the cluster")]
    Client(#[source] kube::Error),
}

impl KubeconfigError {
    /// Stable CamelCase reason.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Parse | Self::Config => "InvalidKubeconfig",
            Self::Client(_) => "ClientFailed",
        }
    }
}

/// A client for the cluster `kubeconfig` (YAML) describes, its current context, with
/// connect, read and write timeouts of `timeout`.
pub async fn client(kubeconfig: &str, timeout: Duration) -> Result<Client, KubeconfigError> {
    let parsed = Kubeconfig::from_yaml(kubeconfig).map_err(|_| KubeconfigError::Parse)?;
    let mut config = Config::from_custom_kubeconfig(parsed, &KubeConfigOptions::default())
        .await
        .map_err(|_| KubeconfigError::Config)?;
    config.connect_timeout = Some(timeout);
    config.read_timeout = Some(timeout);
    config.write_timeout = Some(timeout);
    Client::try_from(config).map_err(KubeconfigError::Client)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn refuses_garbage_without_quoting_it() {
        let Err(err) = client("password: hunter2\n: :", Duration::from_secs(1)).await else {
            panic!("garbage accepted");
        };
        assert_eq!(err.reason(), "InvalidKubeconfig");
        assert!(!err.to_string().contains("hunter2"));
        let Err(empty) = client("apiVersion: v1\nkind: Config\n", Duration::from_secs(1)).await
        else {
            panic!("an empty kubeconfig accepted");
        };
        assert!(matches!(empty, KubeconfigError::Config), "{empty}");
    }
}
