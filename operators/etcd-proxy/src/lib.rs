//! `etcd-proxy`: how zones reach the Kontinuum store without hub credentials (DESIGN.md
//! section 3, issue 11). One binary, two halves:
//!
//! * `etcd-proxy serve` (hub): an etcd v3 gRPC server (`KV`, `Watch`, `Lease`) in front of the
//!   store. Every call carries `authorization: Bearer <JWT>`, signed by the zone's ed25519
//!   key ([`token`]); the zone's certificates come from the hub's identity Secrets, kept in a
//!   watched index ([`zones`], [`identity`]). Each call is then authorized ([`authz`]): a zone
//!   touches only keys under `/kontinuum.sh/zones/<region>/<zone>/` and only leases it
//!   granted; the rest is `PermissionDenied` and never reaches the store ([`proxy`]).
//! * `etcd-proxy relay` (zone): a local, unauthenticated etcd v3 endpoint that forwards every
//!   call to the proxy over TLS with a freshly signed token, and keeps the local client's
//!   Watch and LeaseKeepAlive streams alive across hub reconnects ([`relay`]).
//!
//! Owns: no Kubernetes object (it only reads identity Secrets); in the store, the lease
//! ownership records under `/kontinuum.sh/proxy/leases/`. Never: gives a zone access to
//! another zone's keys or leases, or to the store's address.
//!
//! Built the linkerd way (STYLE.md section 3.1): a watch feeds an index, the tonic server
//! reads it; the decisions ([`token::verify`], [`authz`]) are pure functions.
#![warn(missing_docs)]

pub mod authz;
pub mod identity;
pub mod listen;
pub mod metrics;
pub mod proxy;
pub mod relay;
pub mod run;
pub mod store;
pub mod tls;
pub mod token;
pub mod zones;
