//! The registration of a zone agent in the Kontinuum store: where it lives (the key layout)
//! and what it holds (the value). Pure: no I/O, no clock (times are passed in).
//!
//! * Key: `/kontinuum.sh/zones/<region>/<zone>/registry/<name>`, each of region, zone and
//!   name a DNS-1123 label ([`RegistrationKey`]). The etcd-proxy lets a zone write only under
//!   its own `/kontinuum.sh/zones/<region>/<zone>/`, so the region and zone in the key are
//!   authorized by the proxy; nothing else in the key or the value is.
//! * Value: JSON [`Registration`]:
//!   `{"name","region","zone","version","lastHeartbeatTime","config"}`.
//! * The hub mirrors a registration into the `Kontinuum` named `<region>.<zone>.<name>`
//!   ([`RegistrationKey::object_name`]), whose spec comes from the key alone.
//!
//! The value is zone-controlled input: [`Mirrored::from_value`] bounds and validates every
//! field it copies, and drops what it cannot trust.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kontinuum_crds::names::{MAX_LABEL_LEN, is_dns1123_label};
use kontinuum_crds::v1alpha2::{KontinuumConfig, ServerConfig};
use serde::{Deserialize, Serialize};

/// Every zone's keys live under this prefix.
pub const ZONES_PREFIX: &str = "/kontinuum.sh/zones/";

/// The path segment between a zone's prefix and a registration name.
pub const REGISTRY_SEGMENT: &str = "registry";

/// The largest registration value the hub reads; larger ones are refused.
pub const MAX_VALUE_BYTES: usize = 16 * 1024;

/// The longest `version` copied from a value.
pub const MAX_VERSION_LEN: usize = 64;

/// The longest string copied into the published config from a value.
pub const MAX_CONFIG_STRING_LEN: usize = 512;

/// The most admin groups copied from a value.
pub const MAX_ADMIN_GROUPS: usize = 32;

/// A registration key that is not what it should be.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// A part is not a DNS-1123 label.
    #[error(
        "{what} {value:?} is not a DNS-1123 label (lowercase alphanumerics and '-', at most 63 characters)"
    )]
    NotDnsLabel {
        /// `region`, `zone` or `name`.
        what: &'static str,
        /// The offending value.
        value: String,
    },
}

/// Where one registration lives: region, zone and name, all DNS-1123 labels.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RegistrationKey {
    region: String,
    zone: String,
    name: String,
}

impl RegistrationKey {
    /// A key for `name` in `region`/`zone`; each must be a DNS-1123 label.
    pub fn new(region: &str, zone: &str, name: &str) -> Result<Self, KeyError> {
        for (what, value) in [("region", region), ("zone", zone), ("name", name)] {
            if !is_dns1123_label(value) {
                return Err(KeyError::NotDnsLabel {
                    what,
                    value: value.to_owned(),
                });
            }
        }
        Ok(Self {
            region: region.to_owned(),
            zone: zone.to_owned(),
            name: name.to_owned(),
        })
    }

    /// Parses a store key. Only `/kontinuum.sh/zones/<region>/<zone>/registry/<name>` with
    /// three DNS-1123 labels matches; anything else (other keys of a zone, a trailing slash,
    /// an extra segment, bytes that are not UTF-8) is `None`.
    pub fn parse(key: &[u8]) -> Option<Self> {
        let key = std::str::from_utf8(key).ok()?;
        let rest = key.strip_prefix(ZONES_PREFIX)?;
        let mut parts = rest.split('/');
        let (region, zone, segment, name) =
            (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() || segment != REGISTRY_SEGMENT {
            return None;
        }
        Self::new(region, zone, name).ok()
    }

    /// The region.
    pub fn region(&self) -> &str {
        &self.region
    }

    /// The zone.
    pub fn zone(&self) -> &str {
        &self.zone
    }

    /// The registration's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The zone's own prefix, `/kontinuum.sh/zones/<region>/<zone>/`.
    pub fn zone_prefix(&self) -> String {
        format!("{ZONES_PREFIX}{}/{}/", self.region, self.zone)
    }

    /// The store key.
    pub fn key(&self) -> String {
        format!("{}{REGISTRY_SEGMENT}/{}", self.zone_prefix(), self.name)
    }

    /// The mirrored `Kontinuum`'s name: `<region>.<zone>.<name>` (a DNS-1123 subdomain of at
    /// most 191 characters, since each part is a label).
    pub fn object_name(&self) -> String {
        format!("{}.{}.{}", self.region, self.zone, self.name)
    }
}

/// `range_end` for an etcd range over every key starting with `prefix`.
pub fn prefix_range_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // Every byte was 0xff: the range runs to the end of the keyspace.
    vec![0]
}

/// The value a zone agent writes under its key.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Registration {
    /// The registration's name (the last key segment).
    pub name: String,
    /// The zone's region.
    pub region: String,
    /// The zone.
    pub zone: String,
    /// Build version of the agent.
    pub version: String,
    /// When the agent last heartbeated (RFC 3339).
    pub last_heartbeat_time: Time,
    /// The agent's published, non-confidential configuration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<KontinuumConfig>,
}

impl Registration {
    /// The value for `key`, heartbeating at `now`.
    pub fn new(
        key: &RegistrationKey,
        version: &str,
        now: Timestamp,
        config: Option<KontinuumConfig>,
    ) -> Self {
        Self {
            name: key.name.clone(),
            region: key.region.clone(),
            zone: key.zone.clone(),
            version: version.to_owned(),
            last_heartbeat_time: Time(whole_seconds(now)),
            config,
        }
    }

    /// The JSON bytes written to the store.
    pub fn to_value(&self) -> Vec<u8> {
        // Serializing plain strings and maps cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }
}

/// `t` truncated to whole seconds, the precision of a Kubernetes `Time` (anything finer is
/// lost in the API and would make every comparison with a read-back value differ).
pub fn whole_seconds(t: Timestamp) -> Timestamp {
    Timestamp::from_second(t.as_second()).unwrap_or(t)
}

/// Why a value is not mirrored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ValueError {
    /// Longer than [`MAX_VALUE_BYTES`].
    #[error("the registration value is larger than {MAX_VALUE_BYTES} bytes")]
    TooLarge,
    /// Not a JSON object.
    #[error("the registration value is not a JSON object")]
    NotJson,
}

impl ValueError {
    /// A stable token for logs and metrics.
    pub fn reason(self) -> &'static str {
        match self {
            Self::TooLarge => "TooLarge",
            Self::NotJson => "NotJson",
        }
    }
}

/// A registration as the hub mirrors it: the key (authorized by the proxy) and what could
/// be trusted of the value.
#[derive(Clone, Debug, PartialEq)]
pub struct Mirrored {
    /// Where it lives; the mirrored object's spec comes from here.
    pub key: RegistrationKey,
    /// The store revision of the value (a sweep deletes the key only at this revision).
    pub mod_revision: i64,
    /// The agent's version, when the value holds a plausible one.
    pub version: Option<String>,
    /// The last heartbeat: the value's time, never later than when the hub saw it.
    pub last_heartbeat: Timestamp,
    /// The published config, bounded, with the region and zone of the key.
    pub config: Option<KontinuumConfig>,
    /// The value named another region, zone or name than its key (ignored).
    pub mismatched: bool,
}

/// The parts of a value the hub reads; anything missing or malformed is dropped on its own.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawValue {
    #[serde(default)]
    name: Option<serde_json::Value>,
    #[serde(default)]
    region: Option<serde_json::Value>,
    #[serde(default)]
    zone: Option<serde_json::Value>,
    #[serde(default)]
    version: Option<serde_json::Value>,
    #[serde(default)]
    last_heartbeat_time: Option<serde_json::Value>,
    #[serde(default)]
    config: Option<serde_json::Value>,
}

impl Mirrored {
    /// Reads the value stored under `key` at `mod_revision`, which the hub saw at
    /// `observed`. The region and zone always come from the key; the heartbeat time is
    /// never later than `observed` (a zone's clock cannot keep its entry fresh), and falls
    /// back to it when the value has none.
    pub fn from_value(
        key: RegistrationKey,
        value: &[u8],
        mod_revision: i64,
        observed: Timestamp,
    ) -> Result<Self, ValueError> {
        if value.len() > MAX_VALUE_BYTES {
            return Err(ValueError::TooLarge);
        }
        let object: serde_json::Value =
            serde_json::from_slice(value).map_err(|_| ValueError::NotJson)?;
        if !object.is_object() {
            return Err(ValueError::NotJson);
        }
        let raw: RawValue = serde_json::from_value(object).map_err(|_| ValueError::NotJson)?;
        let observed = whole_seconds(observed);
        let claims = |v: &Option<serde_json::Value>, expected: &str| {
            v.as_ref()
                .and_then(serde_json::Value::as_str)
                .is_some_and(|s| s != expected)
        };
        let mismatched = claims(&raw.name, &key.name)
            || claims(&raw.region, &key.region)
            || claims(&raw.zone, &key.zone);
        let version = raw
            .version
            .as_ref()
            .and_then(serde_json::Value::as_str)
            .filter(|v| plausible_version(v))
            .map(ToOwned::to_owned);
        let last_heartbeat = raw
            .last_heartbeat_time
            .as_ref()
            .and_then(serde_json::Value::as_str)
            .and_then(|s| s.parse::<Timestamp>().ok())
            .map_or(observed, |t| whole_seconds(t).min(observed));
        let config = raw
            .config
            .and_then(|c| serde_json::from_value::<KontinuumConfig>(c).ok())
            .map(|c| bound_config(c, &key));
        Ok(Self {
            key,
            mod_revision,
            version,
            last_heartbeat,
            config,
            mismatched,
        })
    }
}

fn plausible_version(v: &str) -> bool {
    !v.is_empty()
        && v.len() <= MAX_VERSION_LEN
        && v.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '+' | '_'))
}

/// A string copied from a value: bounded, printable, or dropped.
fn bounded(s: Option<String>) -> Option<String> {
    s.filter(|s| s.len() <= MAX_CONFIG_STRING_LEN && !s.chars().any(char::is_control))
}

/// The published config of a zone, with every string bounded, credentials removed from the
/// storage DSN, and the region and zone of the key (whatever the value claimed).
pub fn bound_config(config: KontinuumConfig, key: &RegistrationKey) -> KontinuumConfig {
    let KontinuumConfig {
        server,
        log,
        oidc,
        insecure_allow_anonymous,
        acme,
    } = config;
    let server = server.unwrap_or_default();
    let server = ServerConfig {
        addr: bounded(server.addr),
        storage: bounded(server.storage).map(|s| strip_userinfo(&s)),
        region: Some(key.region.clone()),
        zone: Some(key.zone.clone()),
        dns: server.dns.map(|mut d| {
            d.domain = bounded(d.domain);
            d
        }),
        grpc: server.grpc.map(|mut g| {
            g.endpoint = bounded(g.endpoint);
            g
        }),
    };
    KontinuumConfig {
        server: Some(server),
        log: log.map(|mut l| {
            l.level = bounded(l.level);
            l.format = bounded(l.format);
            l
        }),
        oidc: oidc.map(|mut o| {
            o.issuer_url = bounded(o.issuer_url);
            o.client_id = bounded(o.client_id);
            o.redirect_url = bounded(o.redirect_url);
            o.admin_groups = std::mem::take(&mut o.admin_groups)
                .into_iter()
                .filter_map(|g| bounded(Some(g)))
                .take(MAX_ADMIN_GROUPS)
                .collect();
            o
        }),
        insecure_allow_anonymous,
        acme: acme.map(|mut a| {
            a.email = bounded(a.email);
            a.server = bounded(a.server);
            a
        }),
    }
}

/// A DSN without its user and password (`scheme://user:pw@host/..` → `scheme://host/..`).
pub fn strip_userinfo(dsn: &str) -> String {
    let Some((scheme, rest)) = dsn.split_once("://") else {
        return dsn.to_owned();
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    match authority.rfind('@') {
        Some(at) => format!("{scheme}://{}{tail}", &authority[at + 1..]),
        None => dsn.to_owned(),
    }
}

/// Whether `name` may be a registration name (a DNS-1123 label).
pub fn valid_name(name: &str) -> bool {
    name.len() <= MAX_LABEL_LEN && is_dns1123_label(name)
}

#[cfg(test)]
mod tests {
    use kontinuum_crds::v1alpha2::{AcmeConfig, DnsConfig, OidcConfig};
    use proptest::prelude::*;

    use super::*;

    fn key() -> RegistrationKey {
        RegistrationKey::new("eu", "west-1a", "agent-0").unwrap()
    }

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(s).unwrap()
    }

    #[test]
    fn keys_round_trip_and_name_the_object() {
        let k = key();
        assert_eq!(k.key(), "/kontinuum.sh/zones/eu/west-1a/registry/agent-0");
        assert_eq!(k.zone_prefix(), "/kontinuum.sh/zones/eu/west-1a/");
        assert_eq!(k.object_name(), "eu.west-1a.agent-0");
        assert_eq!(RegistrationKey::parse(k.key().as_bytes()), Some(k));
    }

    #[test]
    fn only_registration_keys_parse() {
        for bad in [
            "/kontinuum.sh/zones/eu/west-1a/registry/",
            "/kontinuum.sh/zones/eu/west-1a/registry/agent/x",
            "/kontinuum.sh/zones/eu/west-1a/registry/agent/",
            "/kontinuum.sh/zones/eu/west-1a/other/agent",
            "/kontinuum.sh/zones/eu/registry/agent",
            "/kontinuum.sh/zones//west-1a/registry/agent",
            "/kontinuum.sh/zones/EU/west-1a/registry/agent",
            "/kontinuum.sh/zones/eu/west_1a/registry/agent",
            "/kontinuum.sh/zones/eu/west-1a/registry/-agent",
            "/kontinuum.sh/zones/eu/west-1a/registry/a.b",
            "kontinuum.sh/zones/eu/west-1a/registry/agent",
            "/kontinuum.sh/proxy/leases/1",
            "/kontinuum.sh/zones/eu/west-1a/registry/agent\n",
        ] {
            assert_eq!(RegistrationKey::parse(bad.as_bytes()), None, "{bad:?}");
        }
        let long = "a".repeat(64);
        let key = format!("/kontinuum.sh/zones/eu/{long}/registry/x");
        assert_eq!(RegistrationKey::parse(key.as_bytes()), None);
        assert_eq!(RegistrationKey::parse(&[0xff, 0xfe]), None);
        assert!(RegistrationKey::new("eu", "1a", "Agent").is_err());
    }

    #[test]
    fn range_ends_cover_the_prefix() {
        assert_eq!(prefix_range_end(b"/a/"), b"/a0".to_vec());
        assert_eq!(prefix_range_end(&[b'a', 0xff]), b"b".to_vec());
        assert_eq!(prefix_range_end(&[0xff]), vec![0]);
    }

    #[test]
    fn values_round_trip() {
        let config = KontinuumConfig {
            acme: Some(AcmeConfig {
                email: Some("ops@example.com".into()),
                server: None,
            }),
            ..KontinuumConfig::default()
        };
        let value = Registration::new(&key(), "0.1.0", at(1_800_000_000), Some(config.clone()));
        let json: serde_json::Value = serde_json::from_slice(&value.to_value()).unwrap();
        assert_eq!(json["lastHeartbeatTime"], "2027-01-15T08:00:00Z");
        assert_eq!(json["name"], "agent-0");
        let m = Mirrored::from_value(key(), &value.to_value(), 7, at(1_800_000_005)).unwrap();
        assert_eq!(m.version.as_deref(), Some("0.1.0"));
        assert_eq!(m.last_heartbeat, at(1_800_000_000));
        assert_eq!(m.mod_revision, 7);
        assert!(!m.mismatched);
        let server = m.config.as_ref().unwrap().server.as_ref().unwrap();
        assert_eq!(server.region.as_deref(), Some("eu"));
        assert_eq!(
            m.config.unwrap().acme.unwrap().email.as_deref(),
            Some("ops@example.com")
        );
    }

    #[test]
    fn the_key_wins_over_what_the_value_claims() {
        let value = serde_json::json!({
            "name": "other", "region": "us", "zone": "east-1", "version": "1.0.0",
            "lastHeartbeatTime": "2027-01-15T08:00:00Z",
            "config": {"server": {"region": "us", "zone": "east-1"}},
        });
        let m = Mirrored::from_value(key(), value.to_string().as_bytes(), 1, at(1_900_000_000))
            .unwrap();
        assert!(m.mismatched);
        assert_eq!(m.key, key());
        let server = m.config.unwrap().server.unwrap();
        assert_eq!(
            (server.region.as_deref(), server.zone.as_deref()),
            (Some("eu"), Some("west-1a"))
        );
    }

    #[test]
    fn values_are_bounded() {
        let observed = at(1_800_000_000);
        // A heartbeat from the future is clamped to when the hub saw it; none at all, too.
        let future = serde_json::json!({"lastHeartbeatTime": "2100-01-01T00:00:00Z"});
        let m = Mirrored::from_value(key(), future.to_string().as_bytes(), 1, observed).unwrap();
        assert_eq!(m.last_heartbeat, observed);
        let m = Mirrored::from_value(key(), b"{}", 1, observed).unwrap();
        assert_eq!(
            (m.last_heartbeat, m.version, m.config),
            (observed, None, None)
        );

        let hostile = serde_json::json!({
            "version": "v1 <script>",
            "lastHeartbeatTime": 12,
            "config": {
                "server": {"storage": "postgres://user:secret@db:5432/k", "addr": "x".repeat(600)},
                "oidc": {"adminGroups": (0..100).map(|i| format!("g{i}")).collect::<Vec<_>>(),
                         "issuerURL": "https://id.example\u{7}"},
                "log": {"level": "info"},
            },
        });
        let m = Mirrored::from_value(key(), hostile.to_string().as_bytes(), 1, observed).unwrap();
        assert_eq!(m.version, None);
        assert_eq!(m.last_heartbeat, observed);
        let config = m.config.unwrap();
        let server = config.server.unwrap();
        assert_eq!(server.storage.as_deref(), Some("postgres://db:5432/k"));
        assert_eq!(server.addr, None);
        let oidc = config.oidc.unwrap();
        assert_eq!(oidc.admin_groups.len(), MAX_ADMIN_GROUPS);
        assert_eq!(oidc.issuer_url, None);
        assert_eq!(config.log.unwrap().level.as_deref(), Some("info"));

        // A config of the wrong shape is dropped, the registration kept.
        let wrong = serde_json::json!({"config": {"oidc": {"adminGroups": "all"}}});
        let m = Mirrored::from_value(key(), wrong.to_string().as_bytes(), 1, observed).unwrap();
        assert_eq!(m.config, None);

        assert_eq!(
            Mirrored::from_value(key(), b"not json", 1, observed),
            Err(ValueError::NotJson)
        );
        assert_eq!(
            Mirrored::from_value(key(), b"[1]", 1, observed),
            Err(ValueError::NotJson)
        );
        let big = vec![b' '; MAX_VALUE_BYTES + 1];
        assert_eq!(
            Mirrored::from_value(key(), &big, 1, observed),
            Err(ValueError::TooLarge)
        );
    }

    #[test]
    fn userinfo_is_stripped() {
        assert_eq!(strip_userinfo("grpc://eu-1a@hub:443"), "grpc://hub:443");
        assert_eq!(
            strip_userinfo("postgres://u:p@w@db/x?a=b@c"),
            "postgres://db/x?a=b@c"
        );
        assert_eq!(strip_userinfo("sqlite://k.db"), "sqlite://k.db");
        assert_eq!(strip_userinfo("no scheme"), "no scheme");
    }

    #[test]
    fn whole_seconds_truncates() {
        let t: Timestamp = "2027-01-15T08:00:00.75Z".parse().unwrap();
        assert_eq!(whole_seconds(t), at(1_800_000_000));
    }

    #[test]
    fn bound_config_keeps_sane_values() {
        let config = KontinuumConfig {
            server: Some(ServerConfig {
                dns: Some(DnsConfig {
                    domain: Some("zones.example.com".into()),
                }),
                ..ServerConfig::default()
            }),
            oidc: Some(OidcConfig {
                enabled: Some(true),
                issuer_url: Some("https://id.example".into()),
                admin_groups: vec!["admins".into()],
                ..OidcConfig::default()
            }),
            ..KontinuumConfig::default()
        };
        let bound = bound_config(config.clone(), &key());
        assert_eq!(bound.oidc, config.oidc);
        assert_eq!(
            bound.server.unwrap().dns.unwrap().domain.as_deref(),
            Some("zones.example.com")
        );
    }

    fn label() -> impl Strategy<Value = String> {
        "[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"
    }

    proptest! {
        #[test]
        fn built_keys_parse_back(region in label(), zone in label(), name in label()) {
            let key = RegistrationKey::new(&region, &zone, &name).unwrap();
            prop_assert_eq!(RegistrationKey::parse(key.key().as_bytes()), Some(key.clone()));
            prop_assert!(key.object_name().len() <= 191);
            prop_assert!(kontinuum_crds::names::is_dns1123_subdomain(&key.object_name()));
        }

        #[test]
        fn parsed_keys_are_exactly_their_own_key(bytes in proptest::collection::vec(any::<u8>(), 0..120)) {
            if let Some(key) = RegistrationKey::parse(&bytes) {
                prop_assert_eq!(key.key().into_bytes(), bytes);
            }
        }

        #[test]
        fn parsed_keys_from_near_misses_are_exact(
            region in label(), zone in label(), name in "[a-zA-Z0-9._/-]{0,70}"
        ) {
            let raw = format!("{ZONES_PREFIX}{region}/{zone}/registry/{name}");
            match RegistrationKey::parse(raw.as_bytes()) {
                Some(key) => {
                    prop_assert!(valid_name(&name));
                    prop_assert_eq!(key.key(), raw);
                }
                None => prop_assert!(!valid_name(&name)),
            }
        }

        #[test]
        fn any_value_is_read_without_panicking(value in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = Mirrored::from_value(key(), &value, 1, at(1_800_000_000));
        }

        #[test]
        fn mirrored_heartbeats_never_pass_the_observation(secs in 0i64..4_000_000_000) {
            let t = at(secs);
            let value = format!("{{\"lastHeartbeatTime\":\"{t}\"}}");
            let observed = at(1_800_000_000);
            let m = Mirrored::from_value(key(), value.as_bytes(), 1, observed).unwrap();
            prop_assert!(m.last_heartbeat <= observed);
        }
    }
}
