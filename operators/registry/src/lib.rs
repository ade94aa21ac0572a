//! `registry`: Kontinuum's registry of running installations (DESIGN.md sections 2 and 3,
//! issue 11). One binary, two halves:
//!
//! * `registry hub` (the hub, leader-elected): keeps the hub's own `Kontinuum` (role
//!   `ControlPlane`, heartbeat, version, published config), mirrors every zone registration
//!   of the Kontinuum store into a `Kontinuum` `<region>.<zone>.<name>` (one list + watch of
//!   `/kontinuum.sh/zones/`, [`mirror`]), deletes entries whose registration is gone or
//!   whose heartbeat is older than the time-to-live ([`plan`], [`hub`]), and serves the
//!   `v1alpha1` ↔ `v1alpha2` conversion webhook on every replica ([`webhook`]), keeping the
//!   CRD's `spec.conversion` pointed at it ([`crd`]).
//! * `registry zone` (the zone agent, next to `etcd-proxy relay`): registers its zone under
//!   `/kontinuum.sh/zones/<region>/<zone>/registry/<name>` on a lease it keeps alive,
//!   heartbeats into the value, withdraws on SIGTERM ([`zone`]), and serves the zone
//!   endpoint behind the installation's auth mode ([`zone_http`]).
//!
//! The key layout and the value are in [`record`]; the published config in [`config`].
//! Decisions are pure functions ([`record`], [`plan`], [`crd::desired`],
//! [`webhook::convert_object`]); the rest is wiring.
#![warn(missing_docs)]

pub mod config;
pub mod crd;
pub mod hub;
pub mod metrics;
pub mod mirror;
pub mod plan;
pub mod record;
pub mod run;
pub mod webhook;
pub mod zone;
pub mod zone_http;

/// The controller's name (metrics prefix, events, the default leader Lease).
pub const CONTROLLER: &str = "registry";

/// This build's version, published in every `Kontinuum` it writes.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
