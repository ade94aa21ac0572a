//! Parsing of Talos API endpoints (`10.0.0.1`, `10.0.0.1:50000`, `[fd00::1]:50000`, `node-a`).

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;

use crate::error::Error;

/// The Talos API (apid) port, in maintenance and configured mode alike.
pub const DEFAULT_PORT: u16 = 50000;

/// Where a Talos API listens. The host is also the TLS server name, so for a configured node
/// an IP endpoint must be one of the IP SANs of its certificate.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Endpoint {
    host: String,
    port: u16,
}

impl Endpoint {
    /// An endpoint from a host (IP literal or DNS name, without brackets) and port.
    pub fn new(host: impl Into<String>, port: u16) -> Result<Self, Error> {
        let host = host.into();
        let valid = !host.is_empty()
            && host
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '_'));
        if !valid || (host.contains(':') && host.parse::<IpAddr>().is_err()) {
            return Err(Error::InvalidEndpoint { endpoint: host });
        }
        Ok(Self { host, port })
    }

    /// The host: an IP literal or a DNS name.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The TCP port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The URI the gRPC channel uses for `:authority`/`:scheme`.
    pub(crate) fn uri(&self) -> String {
        format!("https://{self}")
    }
}

impl FromStr for Endpoint {
    type Err = Error;

    /// Accepts `host`, `host:port`, an IPv4/IPv6 literal, or `[v6]:port`; the port defaults to
    /// [`DEFAULT_PORT`].
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let invalid = || Error::InvalidEndpoint {
            endpoint: s.to_owned(),
        };
        if let Ok(ip) = s.parse::<IpAddr>() {
            return Self::new(ip.to_string(), DEFAULT_PORT);
        }
        if let Ok(addr) = s.parse::<SocketAddr>() {
            return Self::new(addr.ip().to_string(), addr.port());
        }
        if let Some(v6) = s.strip_prefix('[').and_then(|r| r.strip_suffix(']')) {
            return Self::new(v6, DEFAULT_PORT);
        }
        match s.rsplit_once(':') {
            Some((host, port)) => Self::new(host, port.parse().map_err(|_| invalid())?),
            None => Self::new(s, DEFAULT_PORT),
        }
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_usual_forms() {
        let cases = [
            ("10.0.0.1", "10.0.0.1", 50000),
            ("10.0.0.1:123", "10.0.0.1", 123),
            ("fd00::1", "fd00::1", 50000),
            ("[fd00::1]", "fd00::1", 50000),
            ("[fd00::1]:7", "fd00::1", 7),
            ("node-a.example", "node-a.example", 50000),
            ("node-a:8", "node-a", 8),
        ];
        for (input, host, port) in cases {
            let ep: Endpoint = input.parse().unwrap();
            assert_eq!((ep.host(), ep.port()), (host, port), "{input}");
        }
        assert_eq!(
            "[fd00::1]:7".parse::<Endpoint>().unwrap().to_string(),
            "[fd00::1]:7"
        );
        assert_eq!(
            "10.0.0.1".parse::<Endpoint>().unwrap().uri(),
            "https://10.0.0.1:50000"
        );
    }

    #[test]
    fn rejects_garbage() {
        for input in ["", "a b", "host:port", "http://x", "fd00::zz", ":50000"] {
            assert!(input.parse::<Endpoint>().is_err(), "{input}");
        }
    }
}
