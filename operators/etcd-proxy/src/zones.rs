//! The proxy's trust store: every zone identity Secret of the hub, kept current by one watch
//! (narrowed by the field selector `type=kontinuum.sh/zone-identity`), indexed by zone name.
//! Built the linkerd way (STYLE.md section 3.1): the watch feeds an index, the gRPC server
//! reads it; no API call per RPC. A deleted Secret is out of the index as soon as its watch
//! event arrives; open streams of that zone are told through [`Zones::changes`].
//!
//! A zone name claimed by two Secrets (in two namespaces, possibly with labels that split
//! `eu-1-a` as `eu`/`1-a` and `eu-1`/`a`) is ambiguous and trusted by neither: fail closed.

use std::collections::HashMap;
use std::sync::{Arc, PoisonError, RwLock};

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Secret;
use kontinuum_operator_common::admin::{Readiness, track_sync};
use kontinuum_operator_common::shutdown::Shutdown;
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Api, Client, ResourceExt as _};
use tokio::sync::watch;
use tracing::{debug, info, warn};

use crate::identity::{SECRET_TYPE, ZoneIdentity};
use crate::token::TrustedKey;

/// `namespace/name` of a Secret.
type ObjectKey = (String, String);

/// What a zone name resolves to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Lookup {
    /// Exactly one valid identity.
    Found(Arc<ZoneIdentity>),
    /// No identity: unknown zone, or revoked.
    Unknown,
    /// Several Secrets claim the name.
    Ambiguous,
}

#[derive(Default)]
struct State {
    objects: HashMap<ObjectKey, Arc<ZoneIdentity>>,
    by_zone: HashMap<String, Vec<ObjectKey>>,
}

impl State {
    fn insert(&mut self, key: ObjectKey, identity: ZoneIdentity) {
        self.remove(&key);
        self.by_zone
            .entry(identity.name.clone())
            .or_default()
            .push(key.clone());
        self.objects.insert(key, Arc::new(identity));
    }

    fn remove(&mut self, key: &ObjectKey) {
        if let Some(old) = self.objects.remove(key)
            && let Some(keys) = self.by_zone.get_mut(&old.name)
        {
            keys.retain(|k| k != key);
            if keys.is_empty() {
                self.by_zone.remove(&old.name);
            }
        }
    }
}

/// The index of zone identities. Cheap to share; reads never wait on the API server.
pub struct Zones {
    state: RwLock<State>,
    changed: watch::Sender<u64>,
}

impl Default for Zones {
    fn default() -> Self {
        Self {
            state: RwLock::default(),
            changed: watch::channel(0).0,
        }
    }
}

impl std::fmt::Debug for Zones {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Zones").finish_non_exhaustive()
    }
}

fn object_key(secret: &Secret) -> ObjectKey {
    (secret.namespace().unwrap_or_default(), secret.name_any())
}

impl Zones {
    /// What `zone` resolves to now.
    pub fn lookup(&self, zone: &str) -> Lookup {
        let state = self.state.read().unwrap_or_else(PoisonError::into_inner);
        match state.by_zone.get(zone).map(Vec::as_slice) {
            Some([key]) => state
                .objects
                .get(key)
                .map_or(Lookup::Unknown, |id| Lookup::Found(Arc::clone(id))),
            Some([_, _, ..]) => Lookup::Ambiguous,
            _ => Lookup::Unknown,
        }
    }

    /// The keys `zone` may sign with (none when unknown or ambiguous).
    pub fn keys(&self, zone: &str) -> Option<Vec<TrustedKey>> {
        match self.lookup(zone) {
            Lookup::Found(id) => Some(id.keys.clone()),
            Lookup::Unknown | Lookup::Ambiguous => None,
        }
    }

    /// Whether `identity` (as resolved when a stream opened) still holds, with `key` still
    /// among its keys.
    pub fn still_trusts(&self, identity: &ZoneIdentity, key: &[u8; 32]) -> bool {
        match self.lookup(&identity.name) {
            Lookup::Found(now) => {
                now.scope == identity.scope && now.keys.iter().any(|k| &k.key == key)
            }
            Lookup::Unknown | Lookup::Ambiguous => false,
        }
    }

    /// Ticks on every change of the index.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// Adds or replaces a Secret (one that does not hold together removes its old entry).
    pub fn apply(&self, secret: &Secret) {
        let key = object_key(secret);
        let parsed = ZoneIdentity::from_secret(secret);
        {
            let mut state = self.state.write().unwrap_or_else(PoisonError::into_inner);
            match parsed {
                Ok(identity) => {
                    debug!(zone = %identity.name, keys = identity.keys.len(), "zone identity loaded");
                    state.insert(key, identity);
                }
                Err(err) => {
                    warn!(secret = %format!("{}/{}", key.0, key.1), reason = err.reason(),
                          error = &err as &dyn std::error::Error, "ignoring zone identity secret");
                    state.remove(&key);
                }
            }
        }
        self.changed.send_modify(|n| *n += 1);
    }

    /// Removes a Secret.
    pub fn delete(&self, secret: &Secret) {
        let key = object_key(secret);
        self.state
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&key);
        self.changed.send_modify(|n| *n += 1);
    }

    /// Replaces everything with a fresh list (the end of a watch's initial list or re-list).
    pub fn replace_all(&self, secrets: &[Secret]) {
        let mut fresh = State::default();
        for secret in secrets {
            if let Ok(identity) = ZoneIdentity::from_secret(secret) {
                fresh.insert(object_key(secret), identity);
            }
        }
        let zones = fresh.by_zone.len();
        *self.state.write().unwrap_or_else(PoisonError::into_inner) = fresh;
        self.changed.send_modify(|n| *n += 1);
        info!(zones, "zone identities synced");
    }
}

/// Keeps `zones` current from the hub until `shutdown`. `namespace` narrows the watch (all
/// namespaces when `None`). `readiness` turns ready after the initial list; `synced` fires
/// once, then too.
pub async fn watch_identities(
    client: Client,
    namespace: Option<String>,
    zones: Arc<Zones>,
    readiness: Readiness,
    synced: tokio::sync::oneshot::Sender<()>,
    shutdown: Shutdown,
) {
    let api: Api<Secret> = match namespace.as_deref() {
        Some(ns) => Api::namespaced(client, ns),
        None => Api::all(client),
    };
    let config = watcher::Config::default().fields(&format!("type={SECRET_TYPE}"));
    let events = track_sync(watcher(api, config).default_backoff(), &readiness);
    let mut events = std::pin::pin!(events);
    let mut synced = Some(synced);
    let mut buffer: Vec<Secret> = Vec::new();
    loop {
        let event = tokio::select! {
            () = shutdown.wait() => return,
            event = events.next() => event,
        };
        match event {
            None => return,
            Some(Ok(watcher::Event::Init)) => buffer.clear(),
            Some(Ok(watcher::Event::InitApply(secret))) => buffer.push(secret),
            Some(Ok(watcher::Event::InitDone)) => {
                zones.replace_all(&buffer);
                buffer.clear();
                if let Some(tx) = synced.take() {
                    let _ = tx.send(());
                }
            }
            Some(Ok(watcher::Event::Apply(secret))) => zones.apply(&secret),
            Some(Ok(watcher::Event::Delete(secret))) => zones.delete(&secret),
            Some(Err(err)) => {
                warn!(
                    error = &err as &dyn std::error::Error,
                    "watching zone identities failed; retrying"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::ByteString;
    use kube::api::ObjectMeta;

    use super::*;
    use crate::identity::{CERT_KEY, labels};

    fn secret(ns: &str, region: &str, zone: &str) -> Secret {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
        let cert = rcgen::CertificateParams::new(vec!["z".into()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        Secret {
            metadata: ObjectMeta {
                name: Some(format!("{region}-{zone}-identity")),
                namespace: Some(ns.into()),
                labels: Some(labels(region, zone)),
                ..Default::default()
            },
            type_: Some(SECRET_TYPE.into()),
            data: Some(BTreeMap::from([(
                CERT_KEY.to_string(),
                ByteString(cert.pem().into_bytes()),
            )])),
            ..Default::default()
        }
    }

    #[test]
    fn apply_delete_and_relist() {
        let zones = Zones::default();
        let mut changes = zones.changes();
        let a = secret("hub", "eu", "1a");
        zones.apply(&a);
        assert!(changes.has_changed().unwrap());
        changes.mark_unchanged();
        let Lookup::Found(id) = zones.lookup("eu-1a") else {
            panic!("not found")
        };
        assert!(zones.still_trusts(&id, &id.keys[0].key));
        assert_eq!(zones.lookup("eu-1ab"), Lookup::Unknown);

        zones.delete(&a);
        assert_eq!(zones.lookup("eu-1a"), Lookup::Unknown);
        assert!(!zones.still_trusts(&id, &id.keys[0].key));
        assert!(changes.has_changed().unwrap());

        zones.replace_all(&[a.clone(), secret("hub", "eu", "1b")]);
        assert!(matches!(zones.lookup("eu-1b"), Lookup::Found(_)));
        zones.replace_all(&[]);
        assert_eq!(zones.lookup("eu-1a"), Lookup::Unknown);
    }

    #[test]
    fn a_rotated_key_is_no_longer_trusted_by_open_streams() {
        let zones = Zones::default();
        let old = secret("hub", "eu", "1a");
        zones.apply(&old);
        let Lookup::Found(id) = zones.lookup("eu-1a") else {
            panic!("not found")
        };
        zones.apply(&secret("hub", "eu", "1a"));
        assert!(!zones.still_trusts(&id, &id.keys[0].key));
    }

    #[test]
    fn ambiguous_zone_names_are_trusted_by_nobody() {
        let zones = Zones::default();
        zones.apply(&secret("hub", "eu", "1a"));
        zones.apply(&secret("other", "eu", "1a"));
        assert_eq!(zones.lookup("eu-1a"), Lookup::Ambiguous);
        assert!(zones.keys("eu-1a").is_none());
        zones.delete(&secret("other", "eu", "1a"));
        assert!(matches!(zones.lookup("eu-1a"), Lookup::Found(_)));
        // Same zone name, split differently into region and zone.
        zones.apply(&secret("hub", "eu", "1-a"));
        assert!(matches!(zones.lookup("eu-1-a"), Lookup::Found(_)));
        zones.apply(&secret("other", "eu-1", "a"));
        assert_eq!(zones.lookup("eu-1-a"), Lookup::Ambiguous);
    }

    #[test]
    fn a_broken_update_removes_the_old_trust() {
        let zones = Zones::default();
        let mut s = secret("hub", "eu", "1a");
        zones.apply(&s);
        s.data = None;
        zones.apply(&s);
        assert_eq!(zones.lookup("eu-1a"), Lookup::Unknown);
    }
}
