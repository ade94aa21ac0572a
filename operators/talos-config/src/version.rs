//! Talos versions and the config contracts this crate can generate for.
//!
//! Talos' machinery generates configs against a *version contract* (the `major.minor` of
//! the target Talos). Only the contracts in [`Contract`] are supported: every other version
//! is refused with [`VersionError::Unsupported`] rather than silently generating a config
//! for the wrong contract (machinery itself would happily emit a "current" config for
//! `v1.99.0`).
//!
//! | contract | differences in what we render |
//! | --- | --- |
//! | v1.12 | `machine.network: {}` is still emitted in the v1alpha1 document; the `HostnameConfig` document exists (≥ 1.12) and carries the fixed hostname |
//! | v1.13 | `machine.network` is no longer emitted (network settings live in separate documents); everything else as v1.12 |
//!
//! Both contracts share: RSA-4096 service-account key, secretbox encryption,
//! `grubUseUKICmdline`, KubePrism, host DNS, disk quota support, the
//! exclude-from-external-load-balancers label, the PodSecurity admission and audit
//! defaults, and no `features.rbac`/`apidCheckExtKeyUsage` (hidden since 1.12).
//!
//! v1.14 is refused on purpose: its contract moves kubelet, API server, discovery and
//! identity settings into separate documents, which this generator does not implement.

use std::fmt;
use std::str::FromStr;

/// A Talos version such as `v1.13.8` (a pre-release suffix like `-beta.1` is kept).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TalosVersion {
    major: u32,
    minor: u32,
    patch: u32,
    pre: Option<String>,
}

/// The version contracts (Talos `major.minor`) this crate generates configs for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Contract {
    /// Talos v1.12.x.
    V1_12,
    /// Talos v1.13.x (the current stable line).
    V1_13,
}

/// A Talos version that cannot be parsed or is not supported.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VersionError {
    /// Not of the form `vMAJOR.MINOR.PATCH[-pre]`.
    #[error("invalid talos version {version:?}: expected vMAJOR.MINOR.PATCH")]
    Invalid {
        /// The rejected input.
        version: String,
    },
    /// Well-formed, but not a contract this crate generates for.
    #[error("talos version {version} is not supported (supported: v1.12.x, v1.13.x)")]
    Unsupported {
        /// The rejected version.
        version: String,
    },
}

impl VersionError {
    /// Stable CamelCase reason, for conditions and metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Invalid { .. } => "InvalidTalosVersion",
            Self::Unsupported { .. } => "UnsupportedTalosVersion",
        }
    }
}

impl TalosVersion {
    /// Parses `v1.13.8`, `1.13.8` or `v1.13.0-beta.1`. Any version parses; whether it is
    /// supported is decided by [`TalosVersion::contract`].
    pub fn parse(input: &str) -> Result<Self, VersionError> {
        let invalid = || VersionError::Invalid {
            version: input.to_owned(),
        };
        let rest = input.strip_prefix('v').unwrap_or(input);
        let (core, pre) = match rest.split_once('-') {
            Some((core, pre)) => (core, Some(pre)),
            None => (rest, None),
        };
        let mut parts = core.split('.');
        let mut number = || -> Result<u32, VersionError> {
            let part = parts.next().ok_or_else(invalid)?;
            if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) || part.len() > 6 {
                return Err(invalid());
            }
            part.parse().map_err(|_| invalid())
        };
        let (major, minor, patch) = (number()?, number()?, number()?);
        if parts.next().is_some() {
            return Err(invalid());
        }
        if let Some(pre) = pre
            && (pre.is_empty()
                || !pre
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-'))
        {
            return Err(invalid());
        }
        Ok(Self {
            major,
            minor,
            patch,
            pre: pre.map(str::to_owned),
        })
    }

    /// The contract to generate for, or [`VersionError::Unsupported`].
    pub fn contract(&self) -> Result<Contract, VersionError> {
        match (self.major, self.minor) {
            (1, 12) => Ok(Contract::V1_12),
            (1, 13) => Ok(Contract::V1_13),
            _ => Err(VersionError::Unsupported {
                version: self.to_string(),
            }),
        }
    }
}

impl FromStr for TalosVersion {
    type Err = VersionError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl fmt::Display for TalosVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "v{}.{}.{}", self.major, self.minor, self.patch)?;
        if let Some(pre) = &self.pre {
            write!(f, "-{pre}")?;
        }
        Ok(())
    }
}

impl Contract {
    /// `machine.network: {}` is emitted only up to contract 1.12.
    pub(crate) fn emits_empty_machine_network(self) -> bool {
        self <= Self::V1_12
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_displays() {
        let v = TalosVersion::parse("v1.13.8").unwrap();
        assert_eq!(v.to_string(), "v1.13.8");
        assert_eq!(v.contract().unwrap(), Contract::V1_13);
        let v: TalosVersion = "1.12.0-beta.1".parse().unwrap();
        assert_eq!(v.to_string(), "v1.12.0-beta.1");
        assert_eq!(v.contract().unwrap(), Contract::V1_12);
    }

    #[test]
    fn rejects_garbage() {
        for bad in [
            "",
            "v",
            "garbage",
            "v1.13",
            "v1.13.8.1",
            "v1..8",
            "v1.13.x",
            "v1.13.8-",
            "v1.13.8-a b",
            "v-1.13.8",
            "vv1.13.8",
        ] {
            let err = TalosVersion::parse(bad).unwrap_err();
            assert_eq!(err.reason(), "InvalidTalosVersion", "{bad}");
        }
    }

    #[test]
    fn refuses_unsupported_contracts() {
        for old in ["v1.9.0", "v1.11.5", "v1.14.0", "v2.0.0", "v0.13.0"] {
            let err = TalosVersion::parse(old).unwrap().contract().unwrap_err();
            assert_eq!(
                err,
                VersionError::Unsupported {
                    version: old.to_owned()
                }
            );
            assert_eq!(err.reason(), "UnsupportedTalosVersion");
            assert!(err.to_string().contains(old));
        }
    }
}
