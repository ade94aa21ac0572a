//! The connection to the hub: a client from the kubeconfig (or in-cluster configuration),
//! the namespace kubectl would use, and a deadline on every call.

use std::future::Future;
use std::path::Path;
use std::time::Duration;

use kube::Client;
use kube::config::{Config, KubeConfigOptions, Kubeconfig};

use crate::cli::{DEFAULT_NAMESPACE, GlobalArgs};
use crate::error::Error;

/// A client for the hub and the namespace the command works in.
#[derive(Clone)]
pub struct Hub {
    /// The client.
    pub client: Client,
    /// The namespace of the Kontinuum objects.
    pub namespace: String,
    /// The limit of one API call (`--request-timeout`).
    pub request_timeout: Duration,
}

impl Hub {
    /// Connects as kubectl would: `--kubeconfig`, else `$KUBECONFIG`, else
    /// `~/.kube/config`, else the in-cluster configuration; `--context`, else the current
    /// context. The namespace is `-n`, else the context's, else [`DEFAULT_NAMESPACE`].
    pub async fn connect(global: &GlobalArgs) -> Result<Self, Error> {
        let (mut config, context_namespace) = match load_kubeconfig(global.kubeconfig.as_deref()) {
            Ok(kubeconfig) => {
                let namespace = context_namespace(&kubeconfig, global.context.as_deref());
                let options = KubeConfigOptions {
                    context: global.context.clone(),
                    cluster: None,
                    user: None,
                };
                let config = Config::from_custom_kubeconfig(kubeconfig, &options)
                    .await
                    .map_err(|source| Error::Kubeconfig {
                        path: global.kubeconfig.clone(),
                        source,
                    })?;
                (config, namespace)
            }
            Err(err) if global.kubeconfig.is_some() || global.context.is_some() => {
                return Err(err);
            }
            Err(err) => match Config::incluster() {
                Ok(config) => (config, None),
                // Outside a cluster, the kubeconfig problem is the one to report.
                Err(_) => return Err(err),
            },
        };
        // Bounded connection set-up; each request is bounded by [`Hub::call`], while watch
        // streams keep kube's long read timeout (they are bounded by `--timeout`).
        config.connect_timeout = Some(global.request_timeout);
        let client = Client::try_from(config).map_err(Error::Client)?;
        Ok(Self {
            client,
            namespace: global
                .namespace
                .clone()
                .or(context_namespace)
                .unwrap_or_else(|| DEFAULT_NAMESPACE.to_owned()),
            request_timeout: global.request_timeout,
        })
    }

    /// Runs one API call with the request timeout; `what` says what it was doing.
    pub async fn call<T>(
        &self,
        what: impl Fn() -> String,
        call: impl Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, Error> {
        match tokio::time::timeout(self.request_timeout, call).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(source)) => Err(Error::Api {
                what: what(),
                source,
            }),
            Err(_) => Err(Error::CallTimeout {
                what: what(),
                limit: self.request_timeout,
            }),
        }
    }
}

/// The namespace the command works in without connecting (for `--dry-run=client`): `-n`,
/// else the kubeconfig context's, else [`DEFAULT_NAMESPACE`]. An unreadable kubeconfig is
/// an error only when `--kubeconfig` or `--context` named one.
pub fn offline_namespace(global: &GlobalArgs) -> Result<String, Error> {
    if let Some(namespace) = &global.namespace {
        return Ok(namespace.clone());
    }
    match load_kubeconfig(global.kubeconfig.as_deref()) {
        Ok(kubeconfig) => Ok(context_namespace(&kubeconfig, global.context.as_deref())
            .unwrap_or_else(|| DEFAULT_NAMESPACE.to_owned())),
        Err(err) if global.kubeconfig.is_some() || global.context.is_some() => Err(err),
        Err(_) => Ok(DEFAULT_NAMESPACE.to_owned()),
    }
}

fn load_kubeconfig(path: Option<&Path>) -> Result<Kubeconfig, Error> {
    match path {
        Some(path) => Kubeconfig::read_from(path).map_err(|source| Error::Kubeconfig {
            path: Some(path.to_owned()),
            source,
        }),
        None => Kubeconfig::read().map_err(|source| Error::Kubeconfig { path: None, source }),
    }
}

/// The namespace set on `context` (else the current context) of `kubeconfig`, if any.
pub fn context_namespace(kubeconfig: &Kubeconfig, context: Option<&str>) -> Option<String> {
    let name = context.or(kubeconfig.current_context.as_deref())?;
    kubeconfig
        .contexts
        .iter()
        .find(|c| c.name == name)
        .and_then(|c| c.context.as_ref())
        .and_then(|c| c.namespace.clone())
        .filter(|n| !n.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    const KUBECONFIG: &str = "
apiVersion: v1
kind: Config
current-context: hub
contexts:
- name: hub
  context: { cluster: hub, user: admin, namespace: zones }
- name: plain
  context: { cluster: hub, user: admin }
clusters:
- name: hub
  cluster: { server: 'https://127.0.0.1:6443' }
users:
- name: admin
  user: { token: secret }
";

    #[test]
    fn the_namespace_comes_from_the_chosen_context() {
        let kubeconfig = Kubeconfig::from_yaml(KUBECONFIG).unwrap();
        assert_eq!(
            context_namespace(&kubeconfig, None).as_deref(),
            Some("zones")
        );
        assert_eq!(context_namespace(&kubeconfig, Some("plain")), None);
        assert_eq!(context_namespace(&kubeconfig, Some("missing")), None);
    }

    #[test]
    fn offline_namespace_prefers_the_flag_then_the_context_then_the_default() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config");
        std::fs::write(&path, KUBECONFIG).unwrap();
        let global = |namespace: Option<&str>, context: Option<&str>| GlobalArgs {
            kubeconfig: Some(path.clone()),
            context: context.map(str::to_owned),
            namespace: namespace.map(str::to_owned),
            request_timeout: Duration::from_secs(30),
        };
        assert_eq!(offline_namespace(&global(Some("x"), None)).unwrap(), "x");
        assert_eq!(offline_namespace(&global(None, None)).unwrap(), "zones");
        assert_eq!(
            offline_namespace(&global(None, Some("plain"))).unwrap(),
            DEFAULT_NAMESPACE
        );
        let missing = GlobalArgs {
            kubeconfig: Some(dir.path().join("nope")),
            ..global(None, None)
        };
        let err = offline_namespace(&missing).unwrap_err();
        assert_eq!(err.exit_code(), 1);
        assert!(err.one_line().contains("nope"), "{}", err.one_line());
    }
}
