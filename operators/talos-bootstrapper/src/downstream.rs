//! The cluster's own API server, reached with the admin kubeconfig the control plane hands
//! out: the proof that etcd was bootstrapped when the record of a Bootstrap call is
//! ambiguous. Every call is bounded by the Talos RPC timeout.

use kontinuum_talos::ClientIdentity;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

use crate::plan::Member;
use crate::{Ctx, Error};

/// Why the API server could not be asked.
#[derive(Debug, thiserror::Error)]
pub enum DownstreamError {
    /// The kubeconfig the machine returned is not usable.
    #[error("the kubeconfig from {instance} is not usable: {reason}")]
    Kubeconfig {
        /// The endpoint member.
        instance: String,
        /// Why.
        reason: String,
    },
    /// The API server did not answer in time or refused.
    #[error("the cluster's API server did not answer")]
    Unanswered(#[source] kube::Error),
    /// The API server did not answer within the bound.
    #[error("the cluster's API server did not answer within {0:?}")]
    TimedOut(std::time::Duration),
}

/// Ok when the cluster's API server answers a version request.
pub async fn api_server_answers(
    ctx: &Ctx,
    endpoint: &Member,
    identity: &ClientIdentity,
) -> Result<(), Error> {
    let kubeconfig = ctx.machines.kubeconfig(endpoint, identity).await?;
    let unusable = |reason: String| {
        Error::Downstream(Box::new(DownstreamError::Kubeconfig {
            instance: endpoint.name.clone(),
            reason,
        }))
    };
    let text = String::from_utf8(kubeconfig).map_err(|e| unusable(e.to_string()))?;
    let parsed = Kubeconfig::from_yaml(&text).map_err(|e| unusable(e.to_string()))?;
    let bound = ctx.settings.dialer.timeouts.rpc;
    let mut config = Config::from_custom_kubeconfig(parsed, &KubeConfigOptions::default())
        .await
        .map_err(|e| unusable(e.to_string()))?;
    config.connect_timeout = Some(ctx.settings.dialer.timeouts.connect);
    config.read_timeout = Some(bound);
    let client = Client::try_from(config).map_err(|e| unusable(e.to_string()))?;
    ctx.metrics.external_call("downstream", "version");
    match tokio::time::timeout(bound, client.apiserver_version()).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(Error::Downstream(Box::new(DownstreamError::Unanswered(e)))),
        Err(_) => Err(Error::Downstream(Box::new(DownstreamError::TimedOut(
            bound,
        )))),
    }
}
