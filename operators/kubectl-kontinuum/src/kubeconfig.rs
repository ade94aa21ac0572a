//! `zone kubeconfig --merge`, pure: the zone cluster's admin kubeconfig merged into the
//! user's as a cluster, user and context all named after the zone.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use kube::config::{Context, Kubeconfig, NamedAuthInfo, NamedCluster, NamedContext};

/// Why a zone kubeconfig could not be merged.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum MergeError {
    /// The zone kubeconfig has no usable context.
    #[error("the zone's kubeconfig has no context to merge")]
    NoContext,
    /// A context names a cluster or user the file does not define.
    #[error("the zone's kubeconfig context {context:?} refers to a missing {what} {name:?}")]
    Dangling {
        /// The context.
        context: String,
        /// `cluster` or `user`.
        what: &'static str,
        /// The missing entry.
        name: String,
    },
}

/// Merges the current context of `zone` (else its only context) into `user` as the
/// cluster, user and context `name`, replacing entries of that name (so re-running is
/// idempotent). The user's current context is kept; it is set to `name` only when the
/// file had none.
pub fn merge(
    mut user: Kubeconfig,
    zone: &Kubeconfig,
    name: &str,
) -> Result<Kubeconfig, MergeError> {
    let context = zone
        .current_context
        .as_deref()
        .and_then(|current| zone.contexts.iter().find(|c| c.name == current))
        .or_else(|| (zone.contexts.len() == 1).then(|| &zone.contexts[0]))
        .ok_or(MergeError::NoContext)?;
    let inner = context.context.as_ref().ok_or(MergeError::NoContext)?;
    let dangling = |what: &'static str, missing: &str| MergeError::Dangling {
        context: context.name.clone(),
        what,
        name: missing.to_owned(),
    };
    let cluster = zone
        .clusters
        .iter()
        .find(|c| c.name == inner.cluster)
        .ok_or_else(|| dangling("cluster", &inner.cluster))?;
    let auth = match &inner.user {
        None => None,
        Some(user_name) => Some(
            zone.auth_infos
                .iter()
                .find(|a| &a.name == user_name)
                .ok_or_else(|| dangling("user", user_name))?,
        ),
    };

    user.clusters.retain(|c| c.name != name);
    user.clusters.push(NamedCluster {
        name: name.to_owned(),
        ..cluster.clone()
    });
    user.auth_infos.retain(|a| a.name != name);
    if let Some(auth) = auth {
        user.auth_infos.push(NamedAuthInfo {
            name: name.to_owned(),
            ..auth.clone()
        });
    }
    user.contexts.retain(|c| c.name != name);
    user.contexts.push(NamedContext {
        name: name.to_owned(),
        context: Some(Context {
            cluster: name.to_owned(),
            user: auth.map(|_| name.to_owned()),
            namespace: inner.namespace.clone(),
            extensions: None,
            other: inner.other.clone(),
        }),
        other: context.other.clone(),
    });
    if user.current_context.as_deref().is_none_or(str::is_empty) {
        user.current_context = Some(name.to_owned());
    }
    if user.api_version.is_none() {
        user.api_version = Some("v1".to_owned());
    }
    if user.kind.is_none() {
        user.kind = Some("Config".to_owned());
    }
    Ok(user)
}

/// The user's kubeconfig file to merge into, as kubectl picks the file to write: the
/// `--kubeconfig` flag, else the first entry of `$KUBECONFIG`, else `~/.kube/config`.
pub fn user_kubeconfig_path(
    flag: Option<&Path>,
    env: Option<&OsStr>,
    home: Option<&Path>,
) -> Option<PathBuf> {
    if let Some(path) = flag {
        return Some(path.to_owned());
    }
    if let Some(first) =
        env.and_then(|v| std::env::split_paths(v).find(|p| !p.as_os_str().is_empty()))
    {
        return Some(first);
    }
    home.map(|h| h.join(".kube").join("config"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const ZONE: &str = "
apiVersion: v1
kind: Config
current-context: admin@eu-a
contexts:
- name: admin@eu-a
  context: { cluster: eu-a, user: admin@eu-a, namespace: default }
clusters:
- name: eu-a
  cluster: { server: 'https://192.0.2.10:6443', certificate-authority-data: Q0E= }
users:
- name: admin@eu-a
  user: { client-certificate-data: Y2VydA==, client-key-data: a2V5 }
";

    const USER: &str = "
apiVersion: v1
kind: Config
current-context: hub
contexts:
- name: hub
  context: { cluster: hub, user: hub }
- name: eu-a
  context: { cluster: stale, user: stale }
clusters:
- name: hub
  cluster: { server: 'https://127.0.0.1:6443' }
- name: eu-a
  cluster: { server: 'https://198.51.100.1:6443' }
users:
- name: hub
  user: { token: t }
";

    fn yaml(k: &Kubeconfig) -> serde_json::Value {
        serde_json::to_value(k).unwrap()
    }

    #[test]
    fn merging_adds_one_context_named_after_the_zone() {
        let user = Kubeconfig::from_yaml(USER).unwrap();
        let zone = Kubeconfig::from_yaml(ZONE).unwrap();
        let merged = merge(user, &zone, "eu-a").unwrap();
        let json = yaml(&merged);
        assert_eq!(json["current-context"], "hub", "the user's context is kept");
        let contexts = json["contexts"].as_array().unwrap();
        assert_eq!(contexts.len(), 2);
        assert_eq!(contexts[1]["name"], "eu-a");
        assert_eq!(contexts[1]["context"]["cluster"], "eu-a");
        assert_eq!(contexts[1]["context"]["user"], "eu-a");
        assert_eq!(contexts[1]["context"]["namespace"], "default");
        let clusters = json["clusters"].as_array().unwrap();
        assert_eq!(clusters.len(), 2);
        assert_eq!(clusters[1]["cluster"]["server"], "https://192.0.2.10:6443");
        assert_eq!(clusters[1]["cluster"]["certificate-authority-data"], "Q0E=");
        let users = json["users"].as_array().unwrap();
        assert_eq!(users.len(), 2);
        assert_eq!(users[1]["name"], "eu-a");
        assert_eq!(users[1]["user"]["client-key-data"], "a2V5");

        // Idempotent: merging again changes nothing.
        let again = merge(merged.clone(), &zone, "eu-a").unwrap();
        assert_eq!(yaml(&again), json);
    }

    #[test]
    fn an_empty_user_kubeconfig_gets_the_zone_as_current_context() {
        let zone = Kubeconfig::from_yaml(ZONE).unwrap();
        let merged = merge(Kubeconfig::default(), &zone, "eu-a").unwrap();
        assert_eq!(merged.current_context.as_deref(), Some("eu-a"));
        assert_eq!(merged.kind.as_deref(), Some("Config"));
        // And it round-trips through YAML as kube reads it.
        let text = serde_saphyr::to_string(&merged).unwrap();
        let back = Kubeconfig::from_yaml(&text).unwrap();
        assert_eq!(yaml(&back), yaml(&merged));
    }

    #[test]
    fn broken_zone_kubeconfigs_are_refused() {
        assert_eq!(
            merge(Kubeconfig::default(), &Kubeconfig::default(), "x").unwrap_err(),
            MergeError::NoContext
        );
        let zone =
            Kubeconfig::from_yaml(&ZONE.replace("cluster: eu-a,", "cluster: gone,")).unwrap();
        assert!(matches!(
            merge(Kubeconfig::default(), &zone, "x").unwrap_err(),
            MergeError::Dangling {
                what: "cluster",
                ..
            }
        ));
    }

    #[test]
    fn the_target_file_is_chosen_like_kubectl() {
        let home = Path::new("/home/u");
        assert_eq!(
            user_kubeconfig_path(Some(Path::new("/f")), Some(OsStr::new("/a:/b")), Some(home)),
            Some(PathBuf::from("/f"))
        );
        assert_eq!(
            user_kubeconfig_path(None, Some(OsStr::new("/a:/b")), Some(home)),
            Some(PathBuf::from("/a"))
        );
        assert_eq!(
            user_kubeconfig_path(None, None, Some(home)),
            Some(PathBuf::from("/home/u/.kube/config"))
        );
        assert_eq!(user_kubeconfig_path(None, Some(OsStr::new("")), None), None);
    }
}
