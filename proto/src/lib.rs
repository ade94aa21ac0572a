//! Kontinuum's own subset of the Talos wire protocol, compiled to Rust.
//!
//! The `.proto` files under `proto/talos/` declare only what Kontinuum uses; their package,
//! service, message and field names and numbers match real Talos v1.13 (facts from
//! `reference/talos-wire.md`). `build.rs` compiles them with `protox` (pure Rust, no `protoc`)
//! and `tonic-prost-build`, with both clients and servers (servers default every method to
//! `Unimplemented`, so a fake implements only what it needs).
//!
//! Module layout mirrors the proto packages, under [`talos`]:
//!
//! | module | proto package | what |
//! |---|---|---|
//! | [`talos::machine`] | `machine` | `MachineService`: Version, ApplyConfiguration, Bootstrap, Kubeconfig, Reset |
//! | [`talos::cluster`] | `cluster` | `ClusterService/HealthCheck` |
//! | [`talos::storage`] | `storage` | `StorageService/Disks` |
//! | [`talos::common`] | `common` | shared messages (`Metadata`, `Data`, `NetIPPrefix`, ...) |
//! | [`talos::cosi::resource`] | `cosi.resource` | COSI `State` Get/List and the `Resource` messages |
//! | [`talos::google::rpc`] | `google.rpc` | `Status`, as carried in `common.Metadata` |
//!
//! `google.protobuf` well-known types map to [`prost_types`] (`Empty` is `()`).
//!
//! The etcd v3 subset under `proto/etcd/` (the `KV`, `Watch` and `Lease` services that
//! etcd-proxy serves and relays) has its own top-level module, [`etcd`]:
//!
//! | module | proto package | what |
//! |---|---|---|
//! | [`etcd::etcdserverpb`] | `etcdserverpb` | `KV`, `Watch`, `Lease` and their messages |
//! | [`etcd::mvccpb`] | `mvccpb` | `KeyValue`, `Event` |

pub use prost;
pub use prost_types;
pub use tonic;

/// Generated code for the Talos API (see the crate docs for the module layout).
#[allow(
    missing_docs,
    clippy::all,
    clippy::pedantic,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]
pub mod talos {
    include!(concat!(env!("OUT_DIR"), "/talos.rs"));
}

/// Generated code for the etcd v3 API subset (see the crate docs for the module layout).
#[allow(
    missing_docs,
    clippy::all,
    clippy::pedantic,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]
pub mod etcd {
    include!(concat!(env!("OUT_DIR"), "/etcd.rs"));
}

mod redacted {
    //! Hand-written `Debug` for messages that carry secrets (machine configs, kubeconfigs).
    use std::fmt;

    use crate::talos::{common, machine};

    impl fmt::Debug for machine::ApplyConfigurationRequest {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.debug_struct("ApplyConfigurationRequest")
                .field(
                    "data",
                    &format_args!("<{} bytes redacted>", self.data.len()),
                )
                .field("mode", &self.mode())
                .field("dry_run", &self.dry_run)
                .field("try_mode_timeout", &self.try_mode_timeout)
                .finish()
        }
    }

    impl fmt::Debug for common::Data {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.debug_struct("Data")
                .field("metadata", &self.metadata)
                .field(
                    "bytes",
                    &format_args!("<{} bytes redacted>", self.bytes.len()),
                )
                .finish()
        }
    }
}

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::talos::{common, cosi, machine};

    #[test]
    fn debug_of_secret_carrying_messages_is_redacted() {
        let req = machine::ApplyConfigurationRequest {
            data: b"machine: {ca: {key: SECRET}}".to_vec(),
            ..Default::default()
        };
        let text = format!("{req:?}");
        assert!(!text.contains("SECRET"), "{text}");
        assert!(text.contains("28 bytes redacted"), "{text}");
        let data = common::Data {
            metadata: None,
            bytes: b"SECRET".to_vec(),
        };
        assert!(!format!("{data:?}").contains("SECRET"));
    }

    /// Field numbers are the wire contract: encode known values and check the exact bytes.
    #[test]
    fn wire_numbers_match_talos() {
        let req = machine::ApplyConfigurationRequest {
            data: b"x".to_vec(),
            mode: machine::apply_configuration_request::Mode::NoReboot.into(),
            dry_run: true,
            try_mode_timeout: None,
        };
        // data=1 (len 1), mode=4 varint 2, dry_run=5 varint 1
        assert_eq!(req.encode_to_vec(), [0x0a, 1, b'x', 0x20, 2, 0x28, 1]);

        let reset = machine::ResetRequest {
            graceful: true,
            reboot: true,
            system_partitions_to_wipe: vec![machine::ResetPartitionSpec {
                label: "STATE".into(),
                wipe: true,
            }],
            user_disks_to_wipe: vec![],
            mode: 0,
        };
        let mut expected = vec![0x08, 1, 0x10, 1, 0x1a, 9, 0x0a, 5];
        expected.extend_from_slice(b"STATE");
        expected.extend_from_slice(&[0x10, 1]);
        assert_eq!(reset.encode_to_vec(), expected);

        let list = cosi::resource::ListRequest {
            namespace: "n".into(),
            r#type: "t".into(),
            options: None,
        };
        assert_eq!(list.encode_to_vec(), [0x0a, 1, b'n', 0x12, 1, b't']);

        let spec = cosi::resource::Spec {
            proto_spec: vec![],
            yaml_spec: "a".into(),
        };
        assert_eq!(spec.encode_to_vec(), [0x12, 1, b'a']);
    }

    /// etcd field numbers that are easy to get wrong: `Compare.range_end` is 64,
    /// `WatchResponse.events` is 11, and the lease messages' `TTL`/`ID` order differs.
    #[test]
    fn etcd_wire_numbers_match_etcd() {
        use super::etcd::etcdserverpb as pb;
        let cmp = pb::Compare {
            key: b"k".to_vec(),
            range_end: b"z".to_vec(),
            target_union: Some(pb::compare::TargetUnion::Version(1)),
            ..Default::default()
        };
        // key=3, version=4 varint 1, range_end=64 (tag 0x82 0x04)
        assert_eq!(
            cmp.encode_to_vec(),
            [0x1a, 1, b'k', 0x20, 1, 0x82, 0x04, 1, b'z']
        );
        let grant = pb::LeaseGrantRequest { ttl: 5, id: 7 };
        assert_eq!(grant.encode_to_vec(), [0x08, 5, 0x10, 7]);
        let watch = pb::WatchResponse {
            watch_id: 1,
            events: vec![super::etcd::mvccpb::Event::default()],
            ..Default::default()
        };
        assert_eq!(watch.encode_to_vec(), [0x10, 1, 0x5a, 0]);
        let create = pb::WatchCreateRequest {
            watch_id: 3,
            fragment: true,
            ..Default::default()
        };
        assert_eq!(create.encode_to_vec(), [0x38, 3, 0x40, 1]);
    }

    #[test]
    fn etcd_service_paths_match_etcd() {
        use super::etcd::etcdserverpb::kv_server::SERVICE_NAME as KV;
        use super::etcd::etcdserverpb::lease_server::SERVICE_NAME as LEASE;
        use super::etcd::etcdserverpb::watch_server::SERVICE_NAME as WATCH;
        assert_eq!(KV, "etcdserverpb.KV");
        assert_eq!(WATCH, "etcdserverpb.Watch");
        assert_eq!(LEASE, "etcdserverpb.Lease");
    }

    #[test]
    fn service_paths_match_talos() {
        // The generated clients hard-code `/<package>.<Service>/<Method>`; the server names
        // are what a router matches on.
        use super::talos::cluster::cluster_service_server::SERVICE_NAME as CLUSTER;
        use super::talos::cosi::resource::state_server::SERVICE_NAME as STATE;
        use super::talos::machine::machine_service_server::SERVICE_NAME as MACHINE;
        use super::talos::storage::storage_service_server::SERVICE_NAME as STORAGE;
        assert_eq!(MACHINE, "machine.MachineService");
        assert_eq!(CLUSTER, "cluster.ClusterService");
        assert_eq!(STATE, "cosi.resource.State");
        assert_eq!(STORAGE, "storage.StorageService");
    }
}
