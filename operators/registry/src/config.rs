//! The configuration an installation publishes in its `Kontinuum` (`status.config`): what
//! other components need to know about it (DNS domain, gRPC endpoint, ACME settings, auth
//! mode, log settings), read from the same `KONTINUUM_*` variables the installation runs
//! with. Never a secret: the storage DSN loses its user and password, and no OIDC client
//! secret exists to publish. Pure: the environment is passed in as a lookup function.

use kontinuum_crds::v1alpha2::{
    AcmeConfig, DnsConfig, GrpcConfig, KontinuumConfig, LogConfig, OidcConfig, ServerConfig,
};
use kontinuum_operator_common::args::{LogFormat, LogLevel};

use crate::record::strip_userinfo;

/// The OIDC client ID when `KONTINUUM_OIDC_CLIENT_ID` is unset (reference section 7.1).
pub const DEFAULT_OIDC_CLIENT_ID: &str = "kontinuum";

/// Where the installation runs: its region and zone (none on the hub) and log settings.
#[derive(Clone, Copy, Debug)]
pub struct Location<'a> {
    /// The zone's region; `None` on the hub.
    pub region: Option<&'a str>,
    /// The zone; `None` on the hub.
    pub zone: Option<&'a str>,
    /// The log level it runs with.
    pub log_level: LogLevel,
    /// The log format it runs with.
    pub log_format: LogFormat,
}

/// Go's `strconv.ParseBool`, the reference's boolean syntax.
pub fn parse_bool(value: &str) -> Option<bool> {
    match value {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// The published configuration, from the environment `get` (an empty variable is unset).
pub fn published(get: impl Fn(&str) -> Option<String>, at: Location<'_>) -> KontinuumConfig {
    let var = |name: &str| get(name).filter(|v| !v.trim().is_empty());
    let issuer = var("KONTINUUM_OIDC_ISSUER_URL");
    let oidc = issuer.map(|issuer| OidcConfig {
        enabled: Some(true),
        issuer_url: Some(issuer),
        client_id: Some(
            var("KONTINUUM_OIDC_CLIENT_ID").unwrap_or_else(|| DEFAULT_OIDC_CLIENT_ID.into()),
        ),
        redirect_url: var("KONTINUUM_OIDC_REDIRECT_URL"),
        admin_groups: var("KONTINUUM_OIDC_ADMIN_GROUPS")
            .map(|groups| {
                groups
                    .split(',')
                    .map(str::trim)
                    .filter(|g| !g.is_empty())
                    .map(ToOwned::to_owned)
                    .collect()
            })
            .unwrap_or_default(),
    });
    let grpc = GrpcConfig {
        endpoint: var("KONTINUUM_SERVER_GRPC_ENDPOINT"),
        insecure_tls_skip_verify: var("KONTINUUM_SERVER_GRPC_INSECURE_TLS_SKIP_VERIFY")
            .and_then(|v| parse_bool(&v)),
    };
    let acme = AcmeConfig {
        email: var("KONTINUUM_ACME_EMAIL"),
        server: var("KONTINUUM_ACME_SERVER"),
    };
    KontinuumConfig {
        server: Some(ServerConfig {
            addr: var("KONTINUUM_SERVER_ADDR"),
            storage: var("KONTINUUM_SERVER_STORAGE").map(|dsn| strip_userinfo(&dsn)),
            region: at.region.map(ToOwned::to_owned),
            zone: at.zone.map(ToOwned::to_owned),
            dns: var("KONTINUUM_SERVER_DNS_DOMAIN").map(|domain| DnsConfig {
                domain: Some(domain),
            }),
            grpc: (grpc != GrpcConfig::default()).then_some(grpc),
        }),
        log: Some(LogConfig {
            level: Some(level_name(at.log_level).into()),
            format: Some(format_name(at.log_format).into()),
        }),
        insecure_allow_anonymous: if oidc.is_some() {
            None
        } else {
            var("KONTINUUM_INSECURE_ALLOW_ANONYMOUS").and_then(|v| parse_bool(&v))
        },
        oidc,
        acme: (acme != AcmeConfig::default()).then_some(acme),
    }
}

fn level_name(level: LogLevel) -> &'static str {
    match level {
        LogLevel::Debug => "debug",
        LogLevel::Info => "info",
        LogLevel::Warn => "warn",
        LogLevel::Error => "error",
    }
}

fn format_name(format: LogFormat) -> &'static str {
    match format {
        LogFormat::Json => "json",
        LogFormat::Console => "console",
        LogFormat::Text => "text",
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |name| map.get(name).cloned()
    }

    const HUB: Location<'static> = Location {
        region: None,
        zone: None,
        log_level: LogLevel::Info,
        log_format: LogFormat::Json,
    };

    #[test]
    fn oidc_mode_is_published_without_secrets() {
        let config = published(
            env(&[
                ("KONTINUUM_OIDC_ISSUER_URL", "https://id.example"),
                ("KONTINUUM_OIDC_ADMIN_GROUPS", "ops, platform,,"),
                ("KONTINUUM_INSECURE_ALLOW_ANONYMOUS", "false"),
                (
                    "KONTINUUM_SERVER_STORAGE",
                    "postgres://k:hunter2@db:5432/kontinuum",
                ),
                ("KONTINUUM_SERVER_DNS_DOMAIN", "zones.example.com"),
                ("KONTINUUM_SERVER_GRPC_ENDPOINT", "hub.example.com:443"),
                ("KONTINUUM_ACME_EMAIL", "ops@example.com"),
                ("KONTINUUM_OIDC_CLIENT_SECRET", "never-published"),
            ]),
            HUB,
        );
        let oidc = config.oidc.clone().unwrap();
        assert_eq!(oidc.enabled, Some(true));
        assert_eq!(oidc.client_id.as_deref(), Some(DEFAULT_OIDC_CLIENT_ID));
        assert_eq!(oidc.admin_groups, ["ops", "platform"]);
        assert_eq!(config.insecure_allow_anonymous, None);
        let server = config.server.clone().unwrap();
        assert_eq!(
            server.storage.as_deref(),
            Some("postgres://db:5432/kontinuum")
        );
        assert_eq!(
            server.dns.unwrap().domain.as_deref(),
            Some("zones.example.com")
        );
        assert_eq!(
            server.grpc.unwrap().endpoint.as_deref(),
            Some("hub.example.com:443")
        );
        assert_eq!(server.region, None);
        assert_eq!(
            config.acme.clone().unwrap().email.as_deref(),
            Some("ops@example.com")
        );
        let text = serde_json::to_string(&config).unwrap();
        assert!(
            !text.contains("hunter2") && !text.contains("never-published"),
            "{text}"
        );
    }

    #[test]
    fn anonymous_mode_and_location_are_published() {
        let config = published(
            env(&[
                ("KONTINUUM_INSECURE_ALLOW_ANONYMOUS", "true"),
                ("KONTINUUM_SERVER_DNS_DOMAIN", ""),
            ]),
            Location {
                region: Some("eu"),
                zone: Some("1a"),
                log_level: LogLevel::Debug,
                log_format: LogFormat::Text,
            },
        );
        assert_eq!(config.insecure_allow_anonymous, Some(true));
        assert_eq!(config.oidc, None);
        assert_eq!(config.acme, None);
        let server = config.server.unwrap();
        assert_eq!(server.dns, None, "empty means unset");
        assert_eq!(server.grpc, None);
        assert_eq!(server.region.as_deref(), Some("eu"));
        let log = config.log.unwrap();
        assert_eq!(
            (log.level.as_deref(), log.format.as_deref()),
            (Some("debug"), Some("text"))
        );
    }

    #[test]
    fn bools_parse_like_go() {
        for t in ["1", "t", "T", "TRUE", "true", "True"] {
            assert_eq!(parse_bool(t), Some(true));
        }
        for f in ["0", "f", "F", "FALSE", "false", "False"] {
            assert_eq!(parse_bool(f), Some(false));
        }
        assert_eq!(parse_bool("yes"), None);
    }
}
