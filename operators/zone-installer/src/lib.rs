//! zone-installer: reconciles Zones, on the hub.
//!
//! * Reconciles: `Zone`.
//! * Owns: the Zone's status (conditions `ClusterReady`, `Installed`, `RegistryJoined`,
//!   `Ready`, `Deleting`; `identityThumbprint`, `identityRotation`, `endpoint`) under field
//!   manager [`FIELD_MANAGER`]; finalizer [`FINALIZER`]; the fan-out of `spec.seed` (the
//!   TalosCluster and InstancePool named like the Zone, the seed Instances' labels and
//!   interfaces), owned Zone → TalosCluster → InstancePool, Instances never owned; the hub
//!   identity Secret `<zone>-identity` (certificates only, owned by the Zone); in the zone
//!   cluster, the footprint ([`footprint`]) with the zone's private key.
//! * Triggered by: Zone spec, deletion, finalizer and `kontinuum.sh/rotate-identity`
//!   changes (not its own status writes); its TalosCluster (same name); Instances dialled at
//!   a seed address; Kontinuum objects of its region and zone; its identity Secret
//!   (deleting it revokes the zone); requeues at the registry heartbeat's expiry and the
//!   end of an identity overlap window; a resync (drift repair downstream).
//! * Never: writes a TalosCluster's status, claims an Instance, re-issues an identity the
//!   hub revoked (a rotation request does), stores the zone's private key on the hub.
//!
//! Steps of one reconcile: observe (stores, identity Secrets, the zone cluster's identity
//! Secret), plan (pure: [`fanout`], [`identity`], [`status`], [`footprint::render`]), act
//! (server-side apply of what differs only), report (one status write, skipped when
//! unchanged; Events for transitions).

#![warn(missing_docs)]

pub mod config;
pub mod controller;
pub mod fanout;
pub mod footprint;
pub mod identity;
pub mod status;

pub use config::{Args, Settings};
pub use controller::run;

/// The controller's name (metrics prefix, events, the default leader Lease).
pub const CONTROLLER: &str = "zone-installer";
/// Field manager of everything this controller writes, on the hub and downstream.
pub const FIELD_MANAGER: &str = footprint::FIELD_MANAGER;
/// Finalizer that removes the footprint and deletes the TalosCluster.
pub const FINALIZER: &str = kontinuum_crds::finalizers::ZONE_INSTALLER;
