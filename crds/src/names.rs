//! Object names: one rule, used by the operators and the plugin alike.
//!
//! * A Zone, its TalosCluster and its InstancePool are all named `<region>-<zone>`
//!   ([`zone_name`]): a Zone's TalosCluster is found by that name alone.
//! * A seed Instance is `<region>-<zone>-<hash>` ([`seed_instance_name`]), where `<hash>` is
//!   the first [`SEED_HASH_LEN`] hex digits of the SHA-256 of its normalised address: the same
//!   address gives the same object, so re-running `zone add` is idempotent.
//! * A built-in Addon is `<cluster>-<release>` ([`builtin_addon_name`]).
//!
//! Lengths are bounded so that every derived name stays usable where it ends up: a pool name
//! is the value of the `kontinuum.sh/claimed-by` label (at most 63 characters), and an
//! Instance name becomes the machine's host name (at most 63 characters too). Hence a zone
//! name is at most [`MAX_ZONE_NAME_LEN`] characters; the Zone CRD enforces the same limit.

use std::net::IpAddr;

use sha2::{Digest, Sha256};

/// The longest object name (a DNS-1123 subdomain).
pub const MAX_OBJECT_NAME_LEN: usize = 253;

/// The longest label value, DNS-1123 label and host name.
pub const MAX_LABEL_LEN: usize = 63;

/// The longest Helm release name.
pub const MAX_RELEASE_NAME_LEN: usize = 53;

/// How many hex digits of the address hash a seed Instance name carries.
pub const SEED_HASH_LEN: usize = 10;

/// The longest zone name, `<region>-<zone>`: a seed Instance name built from it must still
/// be a valid host name.
pub const MAX_ZONE_NAME_LEN: usize = MAX_LABEL_LEN - 1 - SEED_HASH_LEN;

/// Why a name could not be built.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    /// An input was empty.
    #[error("{what} must not be empty")]
    Empty {
        /// Which input.
        what: &'static str,
    },
    /// An input is not a DNS-1123 label.
    #[error(
        "{what} {value:?} is not a DNS-1123 label (lowercase alphanumerics and '-', at most 63 characters)"
    )]
    NotDnsLabel {
        /// Which input.
        what: &'static str,
        /// The offending value.
        value: String,
    },
    /// An input is not a DNS-1123 subdomain.
    #[error(
        "{what} {value:?} is not a DNS-1123 subdomain (dot-separated DNS-1123 labels, at most 253 characters)"
    )]
    NotDnsSubdomain {
        /// Which input.
        what: &'static str,
        /// The offending value.
        value: String,
    },
    /// An address is neither an IP address nor a DNS name.
    #[error("address {value:?} is neither an IP address nor a DNS name")]
    InvalidAddress {
        /// The offending value.
        value: String,
    },
    /// A built name is longer than where it is used allows.
    #[error("{what} {name:?} is {} characters long, more than the {max} allowed", name.len())]
    TooLong {
        /// Which name.
        what: &'static str,
        /// The name that was built.
        name: String,
        /// The limit.
        max: usize,
    },
}

impl NameError {
    /// Stable CamelCase category, for logs, Events and condition reasons.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Empty { .. } => "EmptyName",
            Self::NotDnsLabel { .. } | Self::NotDnsSubdomain { .. } => "InvalidName",
            Self::InvalidAddress { .. } => "InvalidAddress",
            Self::TooLong { .. } => "NameTooLong",
        }
    }
}

/// `<region>-<zone>`: the name of a Zone, its TalosCluster and its InstancePool.
pub fn zone_name(region: &str, zone: &str) -> Result<String, NameError> {
    check_label("region", region)?;
    check_label("zone", zone)?;
    bounded("zone name", format!("{region}-{zone}"), MAX_ZONE_NAME_LEN)
}

/// The SHA-256 of `bytes`, as 64 lowercase hex digits (hashes and thumbprints in names,
/// labels and status fields).
pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .flat_map(|byte| [byte >> 4, byte & 0x0f])
        .map(|nibble| char::from_digit(u32::from(nibble), 16).unwrap_or('0'))
        .collect()
}

/// `<region>-<zone>-<hash>`: the name of the seed Instance for `address` in a zone.
///
/// `<hash>` is the first [`SEED_HASH_LEN`] lowercase hex digits of the SHA-256 of
/// [`normalize_address`]`(address)`. This is API: changing it would make `zone add` create a
/// second Instance for a machine it already registered.
pub fn seed_instance_name(region: &str, zone: &str, address: &str) -> Result<String, NameError> {
    let zone_name = zone_name(region, zone)?;
    let digest = sha256_hex(normalize_address(address)?.as_bytes());
    let hash = &digest[..SEED_HASH_LEN];
    bounded(
        "instance name",
        format!("{zone_name}-{hash}"),
        MAX_LABEL_LEN,
    )
}

/// `<cluster>-<release>`: the name of a built-in Addon of a TalosCluster.
pub fn builtin_addon_name(cluster: &str, release: &str) -> Result<String, NameError> {
    check_subdomain("cluster name", cluster)?;
    check_label("release name", release)?;
    bounded(
        "addon name",
        format!("{cluster}-{release}"),
        MAX_OBJECT_NAME_LEN,
    )
}

/// The canonical text of an address to dial: an IP address in its canonical form
/// (`2001:DB8:0::1` becomes `2001:db8::1`), or a DNS name in lowercase without a trailing
/// dot. Surrounding whitespace is ignored.
pub fn normalize_address(address: &str) -> Result<String, NameError> {
    let trimmed = address.trim();
    if trimmed.is_empty() {
        return Err(NameError::Empty { what: "address" });
    }
    if let Ok(ip) = trimmed.parse::<IpAddr>() {
        return Ok(ip.to_string());
    }
    let name = trimmed
        .strip_suffix('.')
        .unwrap_or(trimmed)
        .to_ascii_lowercase();
    let digits_and_dots = name.bytes().all(|b| b.is_ascii_digit() || b == b'.');
    if digits_and_dots || !is_dns1123_subdomain(&name) {
        return Err(NameError::InvalidAddress {
            value: address.to_owned(),
        });
    }
    Ok(name)
}

/// Whether `value` is a DNS-1123 label: 1 to 63 lowercase alphanumerics or `-`, starting
/// and ending with an alphanumeric.
pub fn is_dns1123_label(value: &str) -> bool {
    let bytes = value.as_bytes();
    let alnum = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    !bytes.is_empty()
        && bytes.len() <= MAX_LABEL_LEN
        && bytes.first().is_some_and(alnum)
        && bytes.last().is_some_and(alnum)
        && bytes.iter().all(|b| alnum(b) || *b == b'-')
}

/// Whether `value` is a DNS-1123 subdomain as Kubernetes checks object names: at most 253
/// characters of dot-separated labels, each of lowercase alphanumerics or `-`, starting and
/// ending with an alphanumeric. (Kubernetes does not limit the length of each label.)
pub fn is_dns1123_subdomain(value: &str) -> bool {
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    value.len() <= MAX_OBJECT_NAME_LEN
        && value.split('.').all(|label| {
            let bytes = label.as_bytes();
            bytes.first().is_some_and(|b| alnum(*b))
                && bytes.last().is_some_and(|b| alnum(*b))
                && bytes.iter().all(|b| alnum(*b) || *b == b'-')
        })
}

fn check_label(what: &'static str, value: &str) -> Result<(), NameError> {
    if value.is_empty() {
        Err(NameError::Empty { what })
    } else if is_dns1123_label(value) {
        Ok(())
    } else {
        Err(NameError::NotDnsLabel {
            what,
            value: value.to_owned(),
        })
    }
}

fn check_subdomain(what: &'static str, value: &str) -> Result<(), NameError> {
    if value.is_empty() {
        Err(NameError::Empty { what })
    } else if is_dns1123_subdomain(value) {
        Ok(())
    } else {
        Err(NameError::NotDnsSubdomain {
            what,
            value: value.to_owned(),
        })
    }
}

fn bounded(what: &'static str, name: String, max: usize) -> Result<String, NameError> {
    if name.len() > max {
        Err(NameError::TooLong { what, name, max })
    } else {
        Ok(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zone_name_joins_region_and_zone() {
        assert_eq!(zone_name("eu", "west-1a").unwrap(), "eu-west-1a");
    }

    #[test]
    fn zone_name_refuses_bad_parts() {
        assert_eq!(
            zone_name("", "a").unwrap_err(),
            NameError::Empty { what: "region" }
        );
        assert!(matches!(
            zone_name("EU", "a"),
            Err(NameError::NotDnsLabel { what: "region", .. })
        ));
        assert!(matches!(
            zone_name("eu", "a.b"),
            Err(NameError::NotDnsLabel { what: "zone", .. })
        ));
    }

    #[test]
    fn zone_name_is_short_enough_for_a_seed_host_name() {
        let region = "r".repeat(25);
        assert!(zone_name(&region, &"z".repeat(26)).is_ok()); // 52 characters
        let err = zone_name(&region, &"z".repeat(27)).unwrap_err();
        assert_eq!(err.reason(), "NameTooLong");
        assert!(
            err.to_string()
                .contains("53 characters long, more than the 52")
        );
    }

    /// Pinned: these names are API. If this test fails, the hash changed and `zone add` would
    /// register already-known machines a second time.
    #[test]
    fn seed_instance_names_are_pinned() {
        let cases = [
            ("192.0.2.10", "eu-west-1a-6d99cbd08f"),
            ("2001:db8::1", "eu-west-1a-5afd19e856"),
            ("node-1.example.com", "eu-west-1a-052246cf91"),
        ];
        for (address, expected) in cases {
            assert_eq!(
                seed_instance_name("eu", "west-1a", address).unwrap(),
                expected,
                "address {address}"
            );
        }
    }

    #[test]
    fn seed_instance_name_normalises_the_address() {
        let canonical = seed_instance_name("eu", "west-1a", "2001:db8::1").unwrap();
        for spelling in ["2001:DB8:0:0::1", " 2001:db8::1\n", "2001:0db8::0001"] {
            assert_eq!(
                seed_instance_name("eu", "west-1a", spelling).unwrap(),
                canonical
            );
        }
        let canonical = seed_instance_name("eu", "west-1a", "node-1.example.com").unwrap();
        assert_eq!(
            seed_instance_name("eu", "west-1a", "Node-1.Example.COM.").unwrap(),
            canonical
        );
    }

    #[test]
    fn seed_instance_name_is_a_host_name() {
        let name = seed_instance_name(&"r".repeat(25), &"z".repeat(26), "192.0.2.10").unwrap();
        assert_eq!(name.len(), MAX_LABEL_LEN);
        assert!(is_dns1123_label(&name));
    }

    #[test]
    fn seed_instance_name_refuses_bad_addresses() {
        for address in ["", "  ", "10.0.0.256", "1.2.3", "node_1", "-node", "a..b"] {
            let err = seed_instance_name("eu", "west-1a", address).unwrap_err();
            assert!(
                matches!(
                    err,
                    NameError::Empty { .. } | NameError::InvalidAddress { .. }
                ),
                "{address:?}: {err}"
            );
        }
    }

    #[test]
    fn builtin_addon_name_joins_cluster_and_release() {
        assert_eq!(
            builtin_addon_name("eu-west-1a", "cilium").unwrap(),
            "eu-west-1a-cilium"
        );
        assert!(builtin_addon_name("eu-west-1a", "Cilium").is_err());
        assert!(builtin_addon_name("", "cilium").is_err());
        let long = format!("{}.{}", "a".repeat(63), "b".repeat(63));
        let long = format!("{long}.{long}"); // 255 characters
        assert!(matches!(
            builtin_addon_name(&long, "cilium"),
            Err(NameError::NotDnsSubdomain { .. })
        ));
        let long = format!(
            "{}.{}.{}.{}",
            "a".repeat(63),
            "b".repeat(63),
            "c".repeat(63),
            "d".repeat(55)
        );
        assert!(matches!(
            builtin_addon_name(&long, "cilium"),
            Err(NameError::TooLong { .. })
        ));
    }

    #[test]
    fn dns_checks() {
        for ok in ["a", "a-b", "0", &"a".repeat(63)] {
            assert!(is_dns1123_label(ok), "{ok}");
        }
        for bad in ["", "-a", "a-", "A", "a.b", "a_b", &"a".repeat(64)] {
            assert!(!is_dns1123_label(bad), "{bad}");
        }
        assert!(is_dns1123_subdomain("a.b-c.d"));
        assert!(is_dns1123_subdomain(&"a".repeat(64)));
        assert!(!is_dns1123_subdomain(&"a".repeat(254)));
        assert!(!is_dns1123_subdomain("a..b"));
        assert!(!is_dns1123_subdomain(".a"));
    }
}
