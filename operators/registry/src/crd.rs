//! Keeps the `kontinuums.kontinuum.sh` CRD's `spec.conversion` pointing at this registry's
//! conversion webhook: strategy `Webhook`, review versions `[v1]`, the client config
//! (`--webhook-service` in `--namespace`, or `--webhook-url`) and the CA bundle
//! (`--webhook-ca`, re-read on every check).
//!
//! * Owns: `spec.conversion` of that one CRD (server-side apply, field manager
//!   [`FIELD_MANAGER`], forced).
//! * Triggered by: a watch of that CRD alone (field selector on its name), so a stanza
//!   stripped or changed by someone else is restored at once; and a periodic check that
//!   picks up a rotated CA file.
//! * Never: touches any other field or CRD; runs when the webhook is off (no serving
//!   certificate), so a cluster without one keeps whatever the chart set.

use std::path::PathBuf;
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::ByteString;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceConversion, CustomResourceDefinition, ServiceReference, WebhookClientConfig,
    WebhookConversion,
};
use kontinuum_operator_common::shutdown::Shutdown;
use kube::api::{Patch, PatchParams};
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Api, Client};
use tracing::{info, warn};

use crate::hub::{API_TIMEOUT, FIELD_MANAGER};
use crate::metrics::Metrics;

/// The CRD whose conversion is kept.
pub const CRD_NAME: &str = "kontinuums.kontinuum.sh";

/// The webhook's path.
pub const CONVERT_PATH: &str = "/convert";

/// How often the CA file is re-read even when the CRD does not change.
pub const RECHECK: Duration = Duration::from_secs(30);

/// Where the API server reaches the webhook.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// A Service (name, namespace, port); the path is [`CONVERT_PATH`].
    Service {
        /// Service name.
        name: String,
        /// Its namespace.
        namespace: String,
        /// Its port.
        port: i32,
    },
    /// A URL (out-of-cluster runs).
    Url(String),
}

/// The conversion stanza the CRD should have.
pub fn desired(target: &Target, ca_bundle: Option<Vec<u8>>) -> CustomResourceConversion {
    let client_config = match target {
        Target::Service {
            name,
            namespace,
            port,
        } => WebhookClientConfig {
            ca_bundle: ca_bundle.map(ByteString),
            service: Some(ServiceReference {
                name: name.clone(),
                namespace: namespace.clone(),
                path: Some(CONVERT_PATH.to_owned()),
                port: Some(*port),
            }),
            url: None,
        },
        Target::Url(url) => WebhookClientConfig {
            ca_bundle: ca_bundle.map(ByteString),
            service: None,
            url: Some(url.clone()),
        },
    };
    CustomResourceConversion {
        strategy: "Webhook".to_owned(),
        webhook: Some(WebhookConversion {
            client_config: Some(client_config),
            conversion_review_versions: vec!["v1".to_owned()],
        }),
    }
}

/// Whether `current` already is `desired`.
pub fn holds(
    current: Option<&CustomResourceConversion>,
    desired: &CustomResourceConversion,
) -> bool {
    current == Some(desired)
}

/// The server-side apply body that sets `conversion` and nothing else.
pub fn patch(conversion: &CustomResourceConversion) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": { "name": CRD_NAME },
        "spec": { "conversion": conversion },
    })
}

/// What [`keep`] needs.
#[derive(Clone, Debug)]
pub struct Wiring {
    /// Where the webhook is reached.
    pub target: Target,
    /// The CA bundle file, re-read on every check.
    pub ca_file: Option<PathBuf>,
}

impl Wiring {
    fn conversion(&self) -> Result<CustomResourceConversion, std::io::Error> {
        let ca = self.ca_file.as_ref().map(std::fs::read).transpose()?;
        Ok(desired(&self.target, ca))
    }
}

/// Checks `crd` and applies the stanza when it differs. Returns whether it wrote.
async fn check(
    api: &Api<CustomResourceDefinition>,
    crd: &CustomResourceDefinition,
    wiring: &Wiring,
    metrics: &Metrics,
) -> bool {
    let conversion = match wiring.conversion() {
        Ok(c) => c,
        Err(err) => {
            warn!(
                error = &err as &dyn std::error::Error,
                "reading the webhook CA bundle failed; the CRD is left as it is"
            );
            return false;
        }
    };
    if holds(crd.spec.conversion.as_ref(), &conversion) {
        return false;
    }
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let body = patch(&conversion);
    match tokio::time::timeout(
        API_TIMEOUT,
        api.patch(CRD_NAME, &params, &Patch::Apply(&body)),
    )
    .await
    {
        Ok(Ok(_)) => {
            metrics.write("crd");
            info!(crd = CRD_NAME, "conversion webhook wired into the CRD");
            true
        }
        Ok(Err(err)) => {
            metrics.failure("CrdPatchFailed");
            warn!(
                error = &err as &dyn std::error::Error,
                "wiring the conversion webhook into the CRD failed"
            );
            false
        }
        Err(_) => {
            metrics.failure("CrdPatchFailed");
            warn!("wiring the conversion webhook into the CRD timed out");
            false
        }
    }
}

/// Keeps the CRD's conversion stanza true until `shutdown`.
pub async fn keep(
    client: Client,
    wiring: Wiring,
    metrics: std::sync::Arc<Metrics>,
    shutdown: Shutdown,
) {
    let api: Api<CustomResourceDefinition> = Api::all(client);
    let config = watcher::Config::default().fields(&format!("metadata.name={CRD_NAME}"));
    let mut stream = std::pin::pin!(
        watcher(api.clone(), config)
            .default_backoff()
            .applied_objects()
    );
    let mut ticker = tokio::time::interval(RECHECK);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last: Option<CustomResourceDefinition> = None;
    loop {
        tokio::select! {
            () = shutdown.wait() => return,
            event = stream.next() => match event {
                Some(Ok(crd)) => {
                    check(&api, &crd, &wiring, &metrics).await;
                    last = Some(crd);
                }
                Some(Err(err)) => warn!(
                    error = &err as &dyn std::error::Error,
                    "watching the Kontinuum CRD failed; retrying"
                ),
                None => return,
            },
            _ = ticker.tick() => {
                if let Some(crd) = &last {
                    check(&api, crd, &wiring, &metrics).await;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_service_target_points_at_convert() {
        let c = desired(
            &Target::Service {
                name: "kontinuum-registry-webhook".into(),
                namespace: "kontinuum-system".into(),
                port: 443,
            },
            Some(b"PEM".to_vec()),
        );
        let json = serde_json::to_value(&c).unwrap();
        assert_eq!(json["strategy"], "Webhook");
        assert_eq!(
            json["webhook"]["conversionReviewVersions"],
            serde_json::json!(["v1"])
        );
        let cc = &json["webhook"]["clientConfig"];
        assert_eq!(cc["service"]["path"], "/convert");
        assert_eq!(cc["service"]["port"], 443);
        assert_eq!(cc["service"]["namespace"], "kontinuum-system");
        assert_eq!(cc["caBundle"], "UEVN");
        assert!(cc.get("url").is_none());
    }

    #[test]
    fn a_stripped_or_changed_stanza_does_not_hold() {
        let target = Target::Url("https://127.0.0.1:9443/convert".into());
        let want = desired(&target, None);
        assert!(holds(Some(&want.clone()), &want));
        assert!(!holds(None, &want));
        let none = CustomResourceConversion {
            strategy: "None".into(),
            webhook: None,
        };
        assert!(!holds(Some(&none), &want));
        assert!(!holds(
            Some(&desired(&target, Some(b"other CA".to_vec()))),
            &want
        ));
        let body = patch(&want);
        assert_eq!(body["metadata"]["name"], CRD_NAME);
        assert_eq!(body["spec"].as_object().unwrap().len(), 1);
    }
}
