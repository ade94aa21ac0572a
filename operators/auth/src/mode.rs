//! The auth mode of an installation, from the environment (reference section 7.3).
//!
//! | `KONTINUUM_INSECURE_ALLOW_ANONYMOUS` | `KONTINUUM_OIDC_ISSUER_URL` | result |
//! | --- | --- | --- |
//! | false or unset | set | OIDC |
//! | false or unset | unset | error: neither is set |
//! | true | unset | anonymous (logged as a warning at start-up) |
//! | true | set | error: incompatible |
//! | not a boolean | any | error: must be a boolean |
//!
//! An empty variable counts as unset. Booleans are Go's `strconv.ParseBool` set (`1`, `t`,
//! `T`, `TRUE`, `true`, `True`, `0`, `f`, `F`, `FALSE`, `false`, `False`). With OIDC, the
//! issuer must be an `https` URL (`http` only for a loopback host, for tests), without user
//! information, query or fragment, and `KONTINUUM_OIDC_ADMIN_GROUPS` must name at least one
//! group. Every error message names the variable to fix.

use std::net::IpAddr;

use http::Uri;

/// Explicit opt-in to anonymous access.
pub const ANONYMOUS_ENV: &str = "KONTINUUM_INSECURE_ALLOW_ANONYMOUS";
/// The OIDC issuer; setting it enables OIDC.
pub const ISSUER_URL_ENV: &str = "KONTINUUM_OIDC_ISSUER_URL";
/// The OIDC client id, the audience of accepted tokens.
pub const CLIENT_ID_ENV: &str = "KONTINUUM_OIDC_CLIENT_ID";
/// The OIDC redirect (PKCE callback) URL.
pub const REDIRECT_URL_ENV: &str = "KONTINUUM_OIDC_REDIRECT_URL";
/// Comma-separated groups whose members are administrators.
pub const ADMIN_GROUPS_ENV: &str = "KONTINUUM_OIDC_ADMIN_GROUPS";
/// The client id when [`CLIENT_ID_ENV`] is unset.
pub const DEFAULT_CLIENT_ID: &str = "kontinuum";
/// Logged once at start-up in anonymous mode.
pub const ANONYMOUS_WARNING: &str = "Starting with anonymous access allowed";

/// The one auth mode of an installation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AuthMode {
    /// `KONTINUUM_INSECURE_ALLOW_ANONYMOUS=true`: every request is allowed.
    Anonymous,
    /// Bearer ID tokens of an OIDC issuer.
    Oidc(OidcSettings),
}

/// OIDC configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OidcSettings {
    /// The issuer, exactly as tokens and the discovery document name it.
    pub issuer_url: String,
    /// The client id: accepted tokens have it in `aud`.
    pub client_id: String,
    /// The redirect URL registered at the issuer, when set (used by browser logins).
    pub redirect_url: Option<String>,
    /// Members of any of these groups are administrators; never empty.
    pub admin_groups: Vec<String>,
}

/// Why a URL was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum UrlProblem {
    /// Not an absolute URL with a scheme and a host.
    #[error("not an absolute URL")]
    NotAUrl,
    /// Neither `https`, nor `http` to a loopback host.
    #[error("must use https (http is allowed only for a loopback host)")]
    Scheme,
    /// `user:password@` in the authority.
    #[error("must not contain user information")]
    UserInfo,
    /// A `?query` or `#fragment`.
    #[error("must not have a query or fragment")]
    QueryOrFragment,
}

impl UrlProblem {
    /// Stable CamelCase, for logs.
    pub fn reason(self) -> &'static str {
        match self {
            Self::NotAUrl => "NotAUrl",
            Self::Scheme => "InsecureScheme",
            Self::UserInfo => "UserInfo",
            Self::QueryOrFragment => "QueryOrFragment",
        }
    }
}

/// Why the environment does not define exactly one valid auth mode.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AuthModeError {
    /// Neither mode is chosen.
    #[error("neither KONTINUUM_OIDC_ISSUER_URL nor KONTINUUM_INSECURE_ALLOW_ANONYMOUS=true is set")]
    NoneSet,
    /// Both modes are chosen.
    #[error(
        "KONTINUUM_INSECURE_ALLOW_ANONYMOUS=true is incompatible with KONTINUUM_OIDC_ISSUER_URL being set"
    )]
    BothSet,
    /// The anonymous flag is not a Go boolean.
    #[error("KONTINUUM_INSECURE_ALLOW_ANONYMOUS must be a boolean")]
    AnonymousNotBoolean,
    /// OIDC without admin groups.
    #[error(
        "KONTINUUM_OIDC_ADMIN_GROUPS must name at least one group when KONTINUUM_OIDC_ISSUER_URL is set"
    )]
    AdminGroupRequired,
    /// The issuer is not an acceptable URL.
    #[error("KONTINUUM_OIDC_ISSUER_URL is invalid: {0}")]
    IssuerUrl(UrlProblem),
    /// The redirect URL is not an acceptable URL.
    #[error("KONTINUUM_OIDC_REDIRECT_URL is invalid: {0}")]
    RedirectUrl(UrlProblem),
}

impl AuthModeError {
    /// Stable CamelCase, for logs.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::NoneSet => "NoAuthMode",
            Self::BothSet => "ConflictingAuthModes",
            Self::AnonymousNotBoolean => "AnonymousNotBoolean",
            Self::AdminGroupRequired => "AdminGroupRequired",
            Self::IssuerUrl(_) => "InvalidIssuerUrl",
            Self::RedirectUrl(_) => "InvalidRedirectUrl",
        }
    }
}

impl AuthMode {
    /// Reads the mode through `get` (usually `|name| std::env::var(name).ok()`). An empty
    /// value counts as unset.
    pub fn from_env(get: impl Fn(&str) -> Option<String>) -> Result<AuthMode, AuthModeError> {
        let var = |name: &str| get(name).filter(|v| !v.is_empty());
        let anonymous = match var(ANONYMOUS_ENV) {
            None => false,
            Some(v) => parse_go_bool(&v).ok_or(AuthModeError::AnonymousNotBoolean)?,
        };
        let issuer = var(ISSUER_URL_ENV);
        let issuer_url = match (anonymous, issuer) {
            (true, Some(_)) => return Err(AuthModeError::BothSet),
            (true, None) => return Ok(AuthMode::Anonymous),
            (false, None) => return Err(AuthModeError::NoneSet),
            (false, Some(issuer)) => issuer,
        };
        check_url(&issuer_url).map_err(AuthModeError::IssuerUrl)?;
        let redirect_url = var(REDIRECT_URL_ENV);
        if let Some(url) = &redirect_url {
            check_redirect_url(url).map_err(AuthModeError::RedirectUrl)?;
        }
        let admin_groups = split_groups(&var(ADMIN_GROUPS_ENV).unwrap_or_default());
        if admin_groups.is_empty() {
            return Err(AuthModeError::AdminGroupRequired);
        }
        Ok(AuthMode::Oidc(OidcSettings {
            issuer_url,
            client_id: var(CLIENT_ID_ENV).unwrap_or_else(|| DEFAULT_CLIENT_ID.to_string()),
            redirect_url,
            admin_groups,
        }))
    }

    /// `anonymous` or `oidc`: what an installation publishes about itself (never a secret).
    pub fn name(&self) -> &'static str {
        match self {
            Self::Anonymous => "anonymous",
            Self::Oidc(_) => "oidc",
        }
    }

    /// Whether every request is allowed.
    pub fn is_anonymous(&self) -> bool {
        matches!(self, Self::Anonymous)
    }
}

/// Go's `strconv.ParseBool`.
pub fn parse_go_bool(value: &str) -> Option<bool> {
    match value {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// The groups of a comma-separated list, trimmed, empty entries dropped.
pub fn split_groups(value: &str) -> Vec<String> {
    value
        .split(',')
        .map(str::trim)
        .filter(|g| !g.is_empty())
        .map(str::to_string)
        .collect()
}

/// Checks an issuer or JWKS URL: absolute, `https` (or `http` to a loopback host), no user
/// information, query or fragment.
pub fn check_url(url: &str) -> Result<(), UrlProblem> {
    if url.contains(['?', '#']) {
        return Err(UrlProblem::QueryOrFragment);
    }
    let uri = parse_absolute(url)?;
    match uri.scheme_str() {
        Some("https") => Ok(()),
        Some("http") if uri.host().is_some_and(is_loopback) => Ok(()),
        _ => Err(UrlProblem::Scheme),
    }
}

/// Checks a redirect URL: absolute `http` or `https`, no user information or fragment.
fn check_redirect_url(url: &str) -> Result<(), UrlProblem> {
    if url.contains('#') {
        return Err(UrlProblem::QueryOrFragment);
    }
    let uri = parse_absolute(url)?;
    match uri.scheme_str() {
        Some("https" | "http") => Ok(()),
        _ => Err(UrlProblem::Scheme),
    }
}

fn parse_absolute(url: &str) -> Result<Uri, UrlProblem> {
    let uri: Uri = url.parse().map_err(|_| UrlProblem::NotAUrl)?;
    let authority = uri.authority().ok_or(UrlProblem::NotAUrl)?;
    if uri.scheme().is_none() || uri.host().is_none_or(str::is_empty) {
        return Err(UrlProblem::NotAUrl);
    }
    if authority.as_str().contains('@') {
        return Err(UrlProblem::UserInfo);
    }
    Ok(uri)
}

/// `localhost`, `127.0.0.0/8` or `::1`.
fn is_loopback(host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn mode(vars: &[(&str, &str)]) -> Result<AuthMode, AuthModeError> {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
            .collect();
        AuthMode::from_env(|name| vars.get(name).cloned())
    }

    const ISSUER: &str = "https://id.example.com/realms/k";

    fn oidc(issuer: &str, groups: &[&str]) -> AuthMode {
        AuthMode::Oidc(OidcSettings {
            issuer_url: issuer.to_string(),
            client_id: DEFAULT_CLIENT_ID.to_string(),
            redirect_url: None,
            admin_groups: groups.iter().map(ToString::to_string).collect(),
        })
    }

    type Row = (
        &'static str,
        Vec<(&'static str, &'static str)>,
        Result<AuthMode, &'static str>,
    );

    /// Every row of reference section 7.3, with the exact messages.
    #[test]
    fn the_reference_table() {
        let g = (ADMIN_GROUPS_ENV, "admins");
        let cases: Vec<Row> = vec![
            (
                "false + issuer = OIDC",
                vec![(ANONYMOUS_ENV, "false"), (ISSUER_URL_ENV, ISSUER), g],
                Ok(oidc(ISSUER, &["admins"])),
            ),
            (
                "unset + issuer = OIDC",
                vec![(ISSUER_URL_ENV, ISSUER), g],
                Ok(oidc(ISSUER, &["admins"])),
            ),
            (
                "false, no issuer",
                vec![(ANONYMOUS_ENV, "false")],
                Err(
                    "neither KONTINUUM_OIDC_ISSUER_URL nor KONTINUUM_INSECURE_ALLOW_ANONYMOUS=true is set",
                ),
            ),
            (
                "nothing at all",
                vec![],
                Err(
                    "neither KONTINUUM_OIDC_ISSUER_URL nor KONTINUUM_INSECURE_ALLOW_ANONYMOUS=true is set",
                ),
            ),
            (
                "empty values are unset",
                vec![
                    (ANONYMOUS_ENV, ""),
                    (ISSUER_URL_ENV, ""),
                    (ADMIN_GROUPS_ENV, ""),
                ],
                Err(
                    "neither KONTINUUM_OIDC_ISSUER_URL nor KONTINUUM_INSECURE_ALLOW_ANONYMOUS=true is set",
                ),
            ),
            (
                "true, no issuer = anonymous",
                vec![(ANONYMOUS_ENV, "true")],
                Ok(AuthMode::Anonymous),
            ),
            (
                "true + empty issuer = anonymous",
                vec![(ANONYMOUS_ENV, "true"), (ISSUER_URL_ENV, "")],
                Ok(AuthMode::Anonymous),
            ),
            (
                "true + issuer",
                vec![(ANONYMOUS_ENV, "true"), (ISSUER_URL_ENV, ISSUER), g],
                Err(
                    "KONTINUUM_INSECURE_ALLOW_ANONYMOUS=true is incompatible with KONTINUUM_OIDC_ISSUER_URL being set",
                ),
            ),
            (
                "unparsable, no issuer",
                vec![(ANONYMOUS_ENV, "yes")],
                Err("KONTINUUM_INSECURE_ALLOW_ANONYMOUS must be a boolean"),
            ),
            (
                "unparsable + issuer",
                vec![(ANONYMOUS_ENV, "on"), (ISSUER_URL_ENV, ISSUER), g],
                Err("KONTINUUM_INSECURE_ALLOW_ANONYMOUS must be a boolean"),
            ),
            (
                "padded boolean",
                vec![(ANONYMOUS_ENV, " true")],
                Err("KONTINUUM_INSECURE_ALLOW_ANONYMOUS must be a boolean"),
            ),
        ];
        for (name, vars, want) in cases {
            let got = mode(&vars).map_err(|e| e.to_string());
            assert_eq!(got, want.map_err(str::to_string), "{name}");
        }
    }

    #[test]
    fn go_booleans() {
        for v in ["1", "t", "T", "TRUE", "true", "True"] {
            assert_eq!(mode(&[(ANONYMOUS_ENV, v)]), Ok(AuthMode::Anonymous), "{v}");
        }
        for v in ["0", "f", "F", "FALSE", "false", "False"] {
            assert_eq!(
                mode(&[(ANONYMOUS_ENV, v)]),
                Err(AuthModeError::NoneSet),
                "{v}"
            );
        }
        for v in ["yes", "no", "on", "off", "tRUE", "2", "true\n", "truee"] {
            assert_eq!(
                mode(&[(ANONYMOUS_ENV, v)]),
                Err(AuthModeError::AnonymousNotBoolean),
                "{v}"
            );
        }
    }

    #[test]
    fn oidc_settings_and_defaults() {
        let got = mode(&[
            (ISSUER_URL_ENV, ISSUER),
            (CLIENT_ID_ENV, "zone-ui"),
            (REDIRECT_URL_ENV, "https://1a.eu.example.com/app"),
            (ADMIN_GROUPS_ENV, " platform , ,ops,"),
        ]);
        assert_eq!(
            got,
            Ok(AuthMode::Oidc(OidcSettings {
                issuer_url: ISSUER.to_string(),
                client_id: "zone-ui".to_string(),
                redirect_url: Some("https://1a.eu.example.com/app".to_string()),
                admin_groups: vec!["platform".to_string(), "ops".to_string()],
            }))
        );
        // An empty client id is the default.
        let got = mode(&[
            (ISSUER_URL_ENV, ISSUER),
            (CLIENT_ID_ENV, ""),
            (ADMIN_GROUPS_ENV, "a"),
        ]);
        let Ok(AuthMode::Oidc(settings)) = got else {
            panic!("{got:?}")
        };
        assert_eq!(settings.client_id, "kontinuum");
        assert_eq!(settings.redirect_url, None);
        assert_eq!(AuthMode::Oidc(settings).name(), "oidc");
        assert_eq!(AuthMode::Anonymous.name(), "anonymous");
    }

    #[test]
    fn oidc_needs_an_admin_group() {
        let want = Err(AuthModeError::AdminGroupRequired);
        assert_eq!(mode(&[(ISSUER_URL_ENV, ISSUER)]), want);
        assert_eq!(
            mode(&[(ISSUER_URL_ENV, ISSUER), (ADMIN_GROUPS_ENV, "")]),
            want
        );
        assert_eq!(
            mode(&[(ISSUER_URL_ENV, ISSUER), (ADMIN_GROUPS_ENV, " , ,")]),
            want
        );
        assert_eq!(
            AuthModeError::AdminGroupRequired.to_string(),
            "KONTINUUM_OIDC_ADMIN_GROUPS must name at least one group when KONTINUUM_OIDC_ISSUER_URL is set"
        );
    }

    #[test]
    fn issuer_urls() {
        let ok = [
            "https://id.example.com",
            "https://id.example.com/",
            "https://id.example.com:8443/realms/kontinuum",
            "http://127.0.0.1:5556/dex",
            "http://127.7.0.3:5556",
            "http://localhost:5556",
            "http://[::1]:5556",
        ];
        for url in ok {
            let got = mode(&[(ISSUER_URL_ENV, url), (ADMIN_GROUPS_ENV, "a")]);
            assert!(got.is_ok(), "{url}: {got:?}");
        }
        let bad = [
            ("id.example.com", UrlProblem::NotAUrl),
            ("/realms/k", UrlProblem::NotAUrl),
            ("https://", UrlProblem::NotAUrl),
            ("not a url", UrlProblem::NotAUrl),
            ("http://id.example.com", UrlProblem::Scheme),
            ("http://10.0.0.1:5556", UrlProblem::Scheme),
            ("http://localhost.example.com", UrlProblem::Scheme),
            ("ftp://id.example.com", UrlProblem::Scheme),
            ("https://user:pw@id.example.com", UrlProblem::UserInfo),
            (
                "https://id.example.com/?realm=k",
                UrlProblem::QueryOrFragment,
            ),
            ("https://id.example.com/#k", UrlProblem::QueryOrFragment),
        ];
        for (url, problem) in bad {
            let got = mode(&[(ISSUER_URL_ENV, url), (ADMIN_GROUPS_ENV, "a")]);
            assert_eq!(got, Err(AuthModeError::IssuerUrl(problem)), "{url}");
        }
        assert_eq!(
            AuthModeError::IssuerUrl(UrlProblem::Scheme).to_string(),
            "KONTINUUM_OIDC_ISSUER_URL is invalid: must use https (http is allowed only for a loopback host)"
        );
    }

    #[test]
    fn redirect_urls() {
        let with = |url: &str| {
            mode(&[
                (ISSUER_URL_ENV, ISSUER),
                (ADMIN_GROUPS_ENV, "a"),
                (REDIRECT_URL_ENV, url),
            ])
        };
        assert!(with("http://localhost:8080/app").is_ok());
        assert!(with("https://1a.eu.example.com/app?x=1").is_ok());
        assert_eq!(
            with("app"),
            Err(AuthModeError::RedirectUrl(UrlProblem::NotAUrl))
        );
        assert_eq!(
            with("javascript://x/alert"),
            Err(AuthModeError::RedirectUrl(UrlProblem::Scheme))
        );
        assert_eq!(
            with("https://example.com/app#x").unwrap_err().to_string(),
            "KONTINUUM_OIDC_REDIRECT_URL is invalid: must not have a query or fragment"
        );
    }
}
