//! The zone-installer's settings: flags, each with its `KONTINUUM_*` variable (set by the
//! chart), checked at start-up so that a bad value stops the binary with a message naming
//! the variable ([`Args::settings`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::ValueEnum;
use kontinuum_auth::AuthMode;
use kontinuum_crds::names::is_dns1123_subdomain;

use crate::footprint::{self, IssuerKind};

/// Let's Encrypt's production directory, the default ACME server.
pub const LETS_ENCRYPT: &str = "https://acme-v02.api.letsencrypt.org/directory";

/// Where the zone endpoint's certificate comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum IssuerChoice {
    /// ACME with an HTTP-01 solver through the zone's Gateway.
    Acme,
    /// A self-signed certificate (private sites, tests).
    SelfSigned,
    /// A CA from the Secret named by `--zone-ca-secret`.
    Ca,
}

/// The zone-installer's command-line arguments (besides the common ones).
#[derive(clap::Args, Clone, Debug)]
#[allow(
    clippy::struct_field_names,
    reason = "the flags' names, as clap derives them"
)]
pub struct Args {
    /// `host:port` of the hub's public etcd-proxy endpoint, written into every zone's DSN.
    /// Unset: zones are not installed (`Installed=False/NoStorageSecretFound`).
    #[arg(long, env = "KONTINUUM_SERVER_GRPC_ENDPOINT")]
    pub hub_grpc_endpoint: Option<String>,

    /// Base DNS domain of zones without `spec.domain`: a zone is published at
    /// `<zone>.<region>.<domain>`. Unset: no network exposure for those zones.
    #[arg(long, env = "KONTINUUM_SERVER_DNS_DOMAIN")]
    pub dns_domain: Option<String>,

    /// Account e-mail of the ACME issuer.
    #[arg(long, env = "KONTINUUM_ACME_EMAIL", default_value = "")]
    pub acme_email: String,

    /// Directory URL of the ACME issuer.
    #[arg(long, env = "KONTINUUM_ACME_SERVER", default_value = LETS_ENCRYPT)]
    pub acme_server: String,

    /// Issuer of the zone endpoint's certificate.
    #[arg(long, env = "KONTINUUM_ZONE_ISSUER", value_enum, default_value_t = IssuerChoice::Acme)]
    pub zone_issuer: IssuerChoice,

    /// With `--zone-issuer ca`: the `kubernetes.io/tls` Secret (in cert-manager's cluster
    /// resource namespace of each zone) holding the CA.
    #[arg(long, env = "KONTINUUM_ZONE_CA_SECRET")]
    pub zone_ca_secret: Option<String>,

    /// GatewayClass of the zone's Gateway.
    #[arg(long, env = "KONTINUUM_ZONE_GATEWAY_CLASS", default_value = "cilium")]
    pub gateway_class: String,

    /// Image of the zone agent (the image of the hub's operators).
    #[arg(long, env = "KONTINUUM_ZONE_AGENT_IMAGE", default_value = concat!("kontinuum:", env!("CARGO_PKG_VERSION")))]
    pub agent_image: String,

    /// `imagePullPolicy` of the zone agent; the API server's default when unset.
    #[arg(long, env = "KONTINUUM_ZONE_AGENT_IMAGE_PULL_POLICY")]
    pub agent_image_pull_policy: Option<String>,

    /// PEM file of the CA the zone's relay trusts for the hub proxy's serving certificate;
    /// the system roots when unset.
    #[arg(long, env = "KONTINUUM_PROXY_CA_FILE")]
    pub proxy_ca_file: Option<PathBuf>,

    /// How recent a zone's heartbeat must be for `RegistryJoined`, e.g. `5m`.
    #[arg(long, env = "KONTINUUM_ZONE_REGISTRY_TTL", default_value = "5m", value_parser = parse_duration)]
    pub registry_ttl: Duration,

    /// How long both certificates are trusted after an identity rotation.
    #[arg(long, env = "KONTINUUM_ZONE_IDENTITY_OVERLAP", default_value = "10m", value_parser = parse_duration)]
    pub identity_overlap: Duration,

    /// How long after a Zone's deletion its teardown is retried before the finalizer is
    /// removed anyway.
    #[arg(long, env = "KONTINUUM_ZONE_TEARDOWN_TIMEOUT", default_value = "15m", value_parser = parse_duration)]
    pub teardown_timeout: Duration,

    /// Timeout of each call to a zone cluster.
    #[arg(long, env = "KONTINUUM_ZONE_DOWNSTREAM_TIMEOUT", default_value = "15s", value_parser = parse_duration)]
    pub downstream_timeout: Duration,

    /// Requeue interval while waiting on a zone cluster (certificate, teardown).
    #[arg(long, env = "KONTINUUM_ZONE_RETRY_INTERVAL", default_value = "15s", value_parser = parse_duration)]
    pub retry_interval: Duration,

    /// Steady-state resync: re-applies the footprint (drift repair).
    #[arg(long, env = "KONTINUUM_ZONE_RESYNC_INTERVAL", default_value = "5m", value_parser = parse_duration)]
    pub resync_interval: Duration,

    /// The hub's anonymous auth mode, mirrored into zones (`true` or `false`).
    #[arg(long, env = "KONTINUUM_INSECURE_ALLOW_ANONYMOUS")]
    pub insecure_allow_anonymous: Option<String>,

    /// The hub's OIDC issuer, mirrored into zones.
    #[arg(long, env = "KONTINUUM_OIDC_ISSUER_URL")]
    pub oidc_issuer_url: Option<String>,

    /// The hub's OIDC client id, mirrored into zones.
    #[arg(long, env = "KONTINUUM_OIDC_CLIENT_ID")]
    pub oidc_client_id: Option<String>,

    /// The hub's OIDC admin groups (comma-separated), mirrored into zones.
    #[arg(long, env = "KONTINUUM_OIDC_ADMIN_GROUPS")]
    pub oidc_admin_groups: Option<String>,

    /// The hub's OIDC client secret, mirrored into zones (their `kontinuum-env` Secret).
    #[arg(long, env = "KONTINUUM_OIDC_CLIENT_SECRET", hide_env_values = true)]
    pub oidc_client_secret: Option<String>,

    /// PEM file of the CA the hub trusts for a private OIDC issuer (the variable
    /// kontinuum-auth reads): its certificates are mirrored into every zone (ConfigMap
    /// `kontinuum-ca`, mounted for the agent). The system roots when unset.
    #[arg(long, env = "KONTINUUM_OIDC_CA_FILE")]
    pub oidc_ca_file: Option<PathBuf>,
}

pub use kontinuum_operator_common::args::parse_duration;

/// A setting that stops the binary, naming the variable to fix.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A value is malformed.
    #[error("{variable}: {problem}")]
    Invalid {
        /// The variable (its flag says the same).
        variable: &'static str,
        /// What is wrong.
        problem: String,
    },
    /// The mirrored auth mode is not exactly one valid mode.
    #[error("the hub's auth mode, mirrored into zones")]
    Auth(#[source] kontinuum_auth::AuthModeError),
}

/// The controller's settings.
#[derive(Clone, Debug)]
pub struct Settings {
    /// What the footprint is rendered with. Its `hub_grpc_endpoint` is empty when
    /// [`Settings::hub_grpc_endpoint`] is `None`.
    pub footprint: footprint::Settings,
    /// The hub's gRPC endpoint, when configured.
    pub hub_grpc_endpoint: Option<String>,
    /// Why the hub has no auth mode to mirror into zones (`None`: it has one).
    pub auth_missing: Option<String>,
    /// The default DNS domain of zones.
    pub dns_domain: Option<String>,
    /// Heartbeat freshness for `RegistryJoined`.
    pub registry_ttl: Duration,
    /// Identity rotation overlap.
    pub identity_overlap: Duration,
    /// Teardown deadline after deletion.
    pub teardown_timeout: Duration,
    /// Bound of each call to a zone cluster.
    pub downstream_timeout: Duration,
    /// Requeue while waiting on a zone cluster.
    pub retry: Duration,
    /// Steady-state resync.
    pub resync: Duration,
}

impl Args {
    /// Checks the arguments and builds the settings (reads `--proxy-ca-file` and
    /// `--oidc-ca-file`: each must hold at least one PEM certificate).
    pub fn settings(&self) -> Result<Settings, ConfigError> {
        let invalid =
            |variable: &'static str, problem: String| ConfigError::Invalid { variable, problem };
        let hub_grpc_endpoint = nonempty(self.hub_grpc_endpoint.as_deref());
        if let Some(endpoint) = &hub_grpc_endpoint {
            check_endpoint(endpoint).map_err(|p| invalid("KONTINUUM_SERVER_GRPC_ENDPOINT", p))?;
        }
        let dns_domain =
            nonempty(self.dns_domain.as_deref()).map(|d| d.trim_end_matches('.').to_owned());
        if let Some(domain) = &dns_domain
            && !is_dns1123_subdomain(domain)
        {
            return Err(invalid(
                "KONTINUUM_SERVER_DNS_DOMAIN",
                format!("{domain:?} is not a DNS subdomain"),
            ));
        }
        let issuer = match self.zone_issuer {
            IssuerChoice::Acme => {
                if !self.acme_server.starts_with("https://")
                    && !self.acme_server.starts_with("http://")
                {
                    return Err(invalid(
                        "KONTINUUM_ACME_SERVER",
                        format!("{:?} is not an http(s) URL", self.acme_server),
                    ));
                }
                IssuerKind::Acme {
                    email: self.acme_email.clone(),
                    server: self.acme_server.clone(),
                }
            }
            IssuerChoice::SelfSigned => IssuerKind::SelfSigned,
            IssuerChoice::Ca => IssuerKind::Ca {
                secret_name: nonempty(self.zone_ca_secret.as_deref()).ok_or_else(|| {
                    invalid(
                        "KONTINUUM_ZONE_CA_SECRET",
                        "must name a Secret when KONTINUUM_ZONE_ISSUER is ca".into(),
                    )
                })?,
            },
        };
        if self.gateway_class.is_empty() || !is_dns1123_subdomain(&self.gateway_class) {
            return Err(invalid(
                "KONTINUUM_ZONE_GATEWAY_CLASS",
                format!("{:?} is not a GatewayClass name", self.gateway_class),
            ));
        }
        if self.agent_image.trim().is_empty() {
            return Err(invalid(
                "KONTINUUM_ZONE_AGENT_IMAGE",
                "must not be empty".into(),
            ));
        }
        let proxy_ca_pem = self
            .proxy_ca_file
            .as_deref()
            .map(|path| read_ca(path, "KONTINUUM_PROXY_CA_FILE"))
            .transpose()?;
        let oidc_ca_pem = self
            .oidc_ca_file
            .as_deref()
            .map(|path| read_ca(path, "KONTINUUM_OIDC_CA_FILE"))
            .transpose()?;
        let auth_env = self.auth_env();
        // No mode at all is a hub not configured for zones yet: it runs, and every Zone says
        // what to set (Installed=False/NoAuthMode). A wrong or conflicting mode stops it.
        let auth_missing = match AuthMode::from_env(|name| auth_env.get(name).cloned()) {
            Ok(_) => None,
            Err(e @ kontinuum_auth::AuthModeError::NoneSet) => Some(e.to_string()),
            Err(e) => return Err(ConfigError::Auth(e)),
        };
        Ok(Settings {
            footprint: footprint::Settings {
                agent_image: self.agent_image.clone(),
                image_pull_policy: nonempty(self.agent_image_pull_policy.as_deref()),
                hub_grpc_endpoint: hub_grpc_endpoint.clone().unwrap_or_default(),
                proxy_ca_pem,
                oidc_ca_pem,
                auth_env,
                gateway_class: self.gateway_class.clone(),
                issuer,
            },
            hub_grpc_endpoint,
            auth_missing,
            dns_domain,
            registry_ttl: self.registry_ttl,
            identity_overlap: self.identity_overlap,
            teardown_timeout: self.teardown_timeout,
            downstream_timeout: self.downstream_timeout,
            retry: self.retry_interval,
            resync: self.resync_interval,
        })
    }

    /// The hub's auth mode as variables, mirrored into zones: the flags above (or their
    /// variables), empty values left out.
    pub fn auth_env(&self) -> BTreeMap<String, String> {
        [
            (
                kontinuum_auth::mode::ANONYMOUS_ENV,
                &self.insecure_allow_anonymous,
            ),
            (kontinuum_auth::mode::ISSUER_URL_ENV, &self.oidc_issuer_url),
            (kontinuum_auth::mode::CLIENT_ID_ENV, &self.oidc_client_id),
            (
                kontinuum_auth::mode::ADMIN_GROUPS_ENV,
                &self.oidc_admin_groups,
            ),
            ("KONTINUUM_OIDC_CLIENT_SECRET", &self.oidc_client_secret),
        ]
        .into_iter()
        .filter_map(|(name, value)| nonempty(value.as_deref()).map(|v| (name.to_owned(), v)))
        .collect()
    }
}

/// The PEM text of a CA file: readable, holding at least one `CERTIFICATE` block, each a
/// valid X.509 certificate, else an error naming `variable`.
fn read_ca(path: &Path, variable: &'static str) -> Result<String, ConfigError> {
    let invalid = |problem: String| ConfigError::Invalid { variable, problem };
    let text = std::fs::read_to_string(path)
        .map_err(|e| invalid(format!("reading {}: {e}", path.display())))?;
    let ders = crate::identity::certificates(text.as_bytes());
    if ders.is_empty() {
        return Err(invalid(format!(
            "{} holds no PEM certificate",
            path.display()
        )));
    }
    if let Some(index) = ders
        .iter()
        .position(|der| x509_parser::parse_x509_certificate(der).is_err())
    {
        return Err(invalid(format!(
            "{}: certificate {} is not a valid X.509 certificate",
            path.display(),
            index + 1
        )));
    }
    Ok(text)
}

fn nonempty(value: Option<&str>) -> Option<String> {
    value
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .map(str::to_owned)
}

/// `host:port`, port a number from 1 to 65535.
fn check_endpoint(endpoint: &str) -> Result<(), String> {
    let problem = || format!("{endpoint:?} is not host:port");
    let (host, port) = endpoint.rsplit_once(':').ok_or_else(problem)?;
    let port: u16 = port.parse().map_err(|_| problem())?;
    if host.is_empty() || port == 0 || endpoint.contains("://") || endpoint.contains('/') {
        return Err(problem());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::*;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    fn parse(extra: &[&str]) -> Args {
        let mut argv = vec!["zone-installer", "--insecure-allow-anonymous", "true"];
        argv.extend_from_slice(extra);
        Cli::try_parse_from(argv).unwrap().args
    }

    fn problem(extra: &[&str]) -> String {
        parse(extra).settings().unwrap_err().to_string()
    }

    #[test]
    fn defaults() {
        let s = parse(&[]).settings().unwrap();
        assert_eq!(s.hub_grpc_endpoint, None);
        assert_eq!(s.footprint.gateway_class, "cilium");
        assert_eq!(s.registry_ttl, Duration::from_secs(300));
        assert_eq!(s.identity_overlap, Duration::from_secs(600));
        assert_eq!(s.teardown_timeout, Duration::from_secs(900));
        assert_eq!(
            s.footprint.issuer,
            IssuerKind::Acme {
                email: String::new(),
                server: LETS_ENCRYPT.into()
            }
        );
        assert_eq!(
            s.footprint.auth_env,
            BTreeMap::from([("KONTINUUM_INSECURE_ALLOW_ANONYMOUS".into(), "true".into())])
        );
    }

    #[test]
    fn bad_values_name_their_variable() {
        let cases: [(&[&str], &str); 6] = [
            (
                &["--hub-grpc-endpoint", "https://hub"],
                "KONTINUUM_SERVER_GRPC_ENDPOINT",
            ),
            (
                &["--hub-grpc-endpoint", "hub:0"],
                "KONTINUUM_SERVER_GRPC_ENDPOINT",
            ),
            (
                &["--dns-domain", "Not_A_Domain"],
                "KONTINUUM_SERVER_DNS_DOMAIN",
            ),
            (&["--zone-issuer", "ca"], "KONTINUUM_ZONE_CA_SECRET"),
            (
                &["--proxy-ca-file", "/nonexistent/ca.pem"],
                "KONTINUUM_PROXY_CA_FILE",
            ),
            (&["--acme-server", "ftp://x"], "KONTINUUM_ACME_SERVER"),
        ];
        for (args, variable) in cases {
            let text = problem(args);
            assert!(text.starts_with(variable), "{args:?}: {text}");
        }
        let ok = parse(&[
            "--hub-grpc-endpoint",
            "hub.example.com:443",
            "--zone-issuer",
            "ca",
            "--zone-ca-secret",
            "zone-ca",
        ])
        .settings()
        .unwrap();
        assert_eq!(ok.footprint.hub_grpc_endpoint, "hub.example.com:443");
        assert_eq!(
            ok.footprint.issuer,
            IssuerKind::Ca {
                secret_name: "zone-ca".into()
            }
        );
    }

    #[test]
    fn the_auth_mode_is_at_most_one_and_its_absence_is_reported_not_fatal() {
        let none = Cli::try_parse_from(["zone-installer"]).unwrap().args;
        let missing = none.settings().unwrap().auth_missing.unwrap();
        assert!(missing.contains("KONTINUUM_OIDC_ISSUER_URL"), "{missing}");
        let both = parse(&["--oidc-issuer-url", "https://id.example.com"]);
        assert!(both.settings().is_err());
        let oidc = Cli::try_parse_from([
            "zone-installer",
            "--oidc-issuer-url",
            "https://id.example.com",
            "--oidc-admin-groups",
            "admins",
            "--oidc-client-secret",
            "s3cret",
        ])
        .unwrap()
        .args;
        let settings = oidc.settings().unwrap();
        assert_eq!(settings.footprint.auth_env.len(), 3);
        assert!(
            !format!("{settings:?}").contains("s3cret"),
            "secrets are not printed"
        );
    }

    /// A file in a fresh directory of the test's own.
    fn file(name: &str, content: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "zone-installer-config-{}-{name}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("ca.pem");
        std::fs::write(&path, content).unwrap();
        path
    }

    #[test]
    fn the_oidc_ca_file_is_read_validated_and_mirrored() {
        let ca = crate::identity::issue("oidc-ca").unwrap();
        let good = file("good", &ca.cert_pem);
        let oidc = |path: &Path| {
            Cli::try_parse_from([
                "zone-installer",
                "--oidc-issuer-url",
                "https://id.example.com",
                "--oidc-admin-groups",
                "admins",
                "--oidc-ca-file",
                &path.to_string_lossy(),
            ])
            .unwrap()
            .args
            .settings()
        };
        let settings = oidc(&good).unwrap();
        assert_eq!(
            settings.footprint.oidc_ca_pem.as_deref(),
            Some(ca.cert_pem.as_str())
        );
        assert_eq!(settings.footprint.proxy_ca_pem, None);
        assert!(
            !settings
                .footprint
                .auth_env
                .contains_key("KONTINUUM_OIDC_CA_FILE"),
            "the hub's path is not mirrored as a variable"
        );
        let shown = format!("{settings:?}");
        assert!(shown.contains(&ca.thumbprint()), "{shown}");
        assert!(!shown.contains("BEGIN CERTIFICATE"), "{shown}");

        let missing = Path::new("/nonexistent/oidc-ca.pem");
        let no_pem = file("nopem", "just text\n");
        let key_only = file(
            "key",
            "-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIA==\n-----END PRIVATE KEY-----\n",
        );
        let garbage = file(
            "garbage",
            "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n",
        );
        for (path, why) in [
            (missing, "reading"),
            (no_pem.as_path(), "no PEM certificate"),
            (key_only.as_path(), "no PEM certificate"),
            (garbage.as_path(), "not a valid X.509"),
        ] {
            let text = oidc(path).unwrap_err().to_string();
            assert!(text.starts_with("KONTINUUM_OIDC_CA_FILE: "), "{text}");
            assert!(text.contains(why), "{text}");
        }
        // The same validation for the proxy CA, naming its own variable.
        let text = problem(&["--proxy-ca-file", &garbage.to_string_lossy()]);
        assert!(text.starts_with("KONTINUUM_PROXY_CA_FILE: "), "{text}");
        for path in [good, no_pem, key_only, garbage] {
            let _ = std::fs::remove_dir_all(path.parent().unwrap());
        }
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("5d").is_err());
    }
}
