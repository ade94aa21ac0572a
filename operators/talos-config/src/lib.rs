//! Talos secrets bundles, machine configs and admin talosconfigs — pure code, no network.
//!
//! * [`SecretsBundle`]: every CA, key and token of a cluster, in Talos' algorithms and
//!   encodings, serialisable to machinery's JSON layout for a Kubernetes Secret; never
//!   logged (`Debug` is redacted, secrets are [`Sensitive`]).
//! * [`render_machine_config`]: controlplane and worker configs for a supported Talos
//!   version ([`TalosVersion::contract`]): CNI `none`, kube-proxy disabled, scheduling on
//!   control planes, KubePrism on 7445, an install disk selector or path, and a separate
//!   `HostnameConfig` document with a fixed hostname.
//! * [`parse_machine_config`]: reads a config back and rejects what Talos would (the
//!   emulator's `ApplyConfiguration` uses it).
//! * [`PatchedConfig`]: a rendered config with patches merged as Talos' strategic merge
//!   does (the caller validates the result).
//! * [`admin_talosconfig`]: the `os:admin` Ed25519 client identity and its talosconfig.
//!
//! Functions take the clock (`now`) and the RNG as arguments: nothing here reads the time,
//! and all key material comes from the RNG passed in (use `rand_core::OsRng` in
//! production; a seeded RNG makes tests reproducible).

mod config;
mod parse;
mod patch;
mod pki;
mod schema;
mod secrets;
mod talosconfig;
mod version;

pub use config::{
    ConfigError, ConfigInput, DEFAULT_DNS_DOMAIN, DEFAULT_POD_SUBNET, DEFAULT_SERVICE_SUBNET,
    DiskSelector, InstallDisk, KUBEPRISM_PORT, KUBERNETES_API_PORT, MachineConfig, MachineType,
    render_machine_config,
};
pub use parse::{MAX_CONFIG_BYTES, ParsedCa, ParsedConfig, parse_machine_config};
pub use patch::{PatchError, PatchedConfig};
pub use pki::{private_key_pkcs8_der, standard_private_key_pem};
pub use secrets::{CertAndKey, SERVICE_ACCOUNT_RSA_BITS, SecretsBundle, SecretsError, Sensitive};
pub use talosconfig::{
    ADMIN_CERT_VALIDITY, ADMIN_ROLE, AdminIdentity, AdminTalosconfig, admin_talosconfig,
};
pub use version::{Contract, TalosVersion, VersionError};

#[cfg(test)]
mod tests;
