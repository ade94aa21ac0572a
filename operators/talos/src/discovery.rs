//! Discovery: COSI network and block resources mapped into the Instance status types.
//!
//! Talos fills both `spec.proto_spec` and `spec.yaml_spec`; we parse the YAML, which needs
//! no Talos resource protos. Mapping (as the Go predecessor did):
//! interface name = LinkStatus id, MAC = `hardwareAddr`, addresses = every AddressStatus
//! `address` (CIDR) grouped by `linkName`; disks from `Disks.block.talos.dev`.

use std::collections::BTreeMap;

use kontinuum_crds::v1alpha2::{DiskStatus, InterfaceStatus};
use kontinuum_proto::talos::cosi::resource::Resource;
use serde::Deserialize;
use serde::de::DeserializeOwned;

use crate::error::ProtocolError;

/// COSI namespace of the network resources.
pub const NETWORK_NAMESPACE: &str = "network";
/// COSI type of links (id = link name).
pub const LINK_STATUS_TYPE: &str = "LinkStatuses.net.talos.dev";
/// COSI type of addresses (id = `<link>/<ip>/<prefix>`).
pub const ADDRESS_STATUS_TYPE: &str = "AddressStatuses.net.talos.dev";
/// COSI namespace of the block resources.
pub const RUNTIME_NAMESPACE: &str = "runtime";
/// COSI type of disks (id = device name).
pub const DISK_TYPE: &str = "Disks.block.talos.dev";

/// What a maintenance-mode probe learns about a machine's hardware.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Discovery {
    /// Network interfaces, sorted by name.
    pub interfaces: Vec<InterfaceStatus>,
    /// Disks, sorted by name.
    pub disks: Vec<DiskStatus>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct LinkSpec {
    #[serde(default)]
    hardware_addr: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct AddressSpec {
    address: String,
    link_name: String,
}

#[derive(Deserialize)]
struct DiskSpec {
    #[serde(default)]
    size: Option<u64>,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    serial: Option<String>,
    #[serde(default)]
    transport: Option<String>,
    #[serde(default)]
    rotational: Option<bool>,
    #[serde(default)]
    readonly: Option<bool>,
    #[serde(default)]
    cdrom: Option<bool>,
    #[serde(default)]
    dev_path: Option<String>,
}

/// A resource's id and parsed YAML spec.
fn spec<T: DeserializeOwned>(resource: &Resource) -> Result<(String, T), ProtocolError> {
    let id = resource
        .metadata
        .as_ref()
        .map(|m| m.id.clone())
        .unwrap_or_default();
    let Some(spec) = resource.spec.as_ref().filter(|s| !s.yaml_spec.is_empty()) else {
        return Err(ProtocolError::MissingSpec { id });
    };
    match serde_saphyr::from_str(&spec.yaml_spec) {
        Ok(parsed) => Ok((id, parsed)),
        Err(source) => Err(ProtocolError::Spec {
            id,
            source: Box::new(source),
        }),
    }
}

fn non_empty(s: Option<String>) -> Option<String> {
    s.filter(|s| !s.trim().is_empty())
}

/// Interfaces from LinkStatus and AddressStatus resources. An all-zero hardware address (the
/// loopback's) is reported as none; addresses of links not listed are dropped.
pub fn interfaces(
    links: &[Resource],
    addresses: &[Resource],
) -> Result<Vec<InterfaceStatus>, ProtocolError> {
    let mut by_name = BTreeMap::new();
    for link in links {
        let (name, spec) = spec::<LinkSpec>(link)?;
        let mac = non_empty(spec.hardware_addr)
            .filter(|mac| mac.chars().any(|c| c.is_ascii_hexdigit() && c != '0'));
        by_name.insert(
            name.clone(),
            InterfaceStatus {
                name,
                mac_address: mac,
                addresses: Vec::new(),
            },
        );
    }
    for address in addresses {
        let (_, spec) = spec::<AddressSpec>(address)?;
        if let Some(iface) = by_name.get_mut(&spec.link_name)
            && !iface.addresses.contains(&spec.address)
        {
            iface.addresses.push(spec.address);
        }
    }
    Ok(by_name.into_values().collect())
}

/// Disks from `Disks.block.talos.dev` resources. Loop devices are skipped; a CD-ROM counts
/// as read-only.
pub fn disks(resources: &[Resource]) -> Result<Vec<DiskStatus>, ProtocolError> {
    let mut disks = Vec::new();
    for resource in resources {
        let (name, spec) = spec::<DiskSpec>(resource)?;
        if name.starts_with("loop") {
            continue;
        }
        let readonly = match (spec.readonly, spec.cdrom) {
            (None, None) => None,
            (ro, cd) => Some(ro.unwrap_or(false) || cd.unwrap_or(false)),
        };
        disks.push(DiskStatus {
            dev_path: non_empty(spec.dev_path),
            model: non_empty(spec.model),
            serial: non_empty(spec.serial),
            size_bytes: spec.size.and_then(|s| i64::try_from(s).ok()),
            transport: non_empty(spec.transport),
            rotational: spec.rotational,
            readonly,
            name,
        });
    }
    disks.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(disks)
}

#[cfg(test)]
pub(crate) mod tests {
    use kontinuum_proto::talos::cosi::resource::{Metadata, Spec};

    use super::*;

    pub(crate) fn resource(namespace: &str, ty: &str, id: &str, yaml: &str) -> Resource {
        Resource {
            metadata: Some(Metadata {
                namespace: namespace.into(),
                r#type: ty.into(),
                id: id.into(),
                version: "1".into(),
                phase: "running".into(),
                ..Default::default()
            }),
            spec: Some(Spec {
                proto_spec: vec![],
                yaml_spec: yaml.into(),
            }),
        }
    }

    pub(crate) fn link(id: &str, mac: &str) -> Resource {
        let yaml = format!(
            "index: 2\ntype: ether\nlinkIndex: 0\nflags: UP,BROADCAST\nhardwareAddr: {mac}\n\
             broadcastAddr: ff:ff:ff:ff:ff:ff\nmtu: 1500\noperationalState: up\nkind: \"\"\n"
        );
        resource(NETWORK_NAMESPACE, LINK_STATUS_TYPE, id, &yaml)
    }

    pub(crate) fn address(link: &str, cidr: &str) -> Resource {
        let yaml = format!(
            "address: {cidr}\nlocal: {ip}\nlinkIndex: 2\nlinkName: {link}\nfamily: inet4\n\
             scope: global\nflags: permanent\npriority: 1024\n",
            ip = cidr.split('/').next().unwrap()
        );
        resource(
            NETWORK_NAMESPACE,
            ADDRESS_STATUS_TYPE,
            &format!("{link}/{cidr}"),
            &yaml,
        )
    }

    pub(crate) fn disk(id: &str) -> Resource {
        let yaml = format!(
            "size: 10737418240\nio_size: 512\nsector_size: 512\nreadonly: false\ncdrom: false\n\
             model: QEMU HARDDISK\nserial: QM0001\nmodalias: virtio:d00000002v00001AF4\n\
             bus_path: /pci0000:00/0000:00:04.0/virtio2\nsub_system: /sys/class/block\n\
             transport: virtio\nrotational: true\ndev_path: /dev/{id}\npretty_size: 11 GB\n\
             secondary_disks: []\nsymlinks:\n  - /dev/disk/by-id/virtio-QM0001\n"
        );
        resource(RUNTIME_NAMESPACE, DISK_TYPE, id, &yaml)
    }

    #[test]
    fn links_and_addresses_become_interfaces() {
        let links = [
            link("lo", "00:00:00:00:00:00"),
            link("eth0", "52:54:00:12:34:56"),
        ];
        let addrs = [
            address("eth0", "192.0.2.10/24"),
            address("lo", "127.0.0.1/8"),
            address("eth0", "2001:db8::10/64"),
            address("eth0", "192.0.2.10/24"),
            address("bond9", "198.51.100.1/24"),
        ];
        let got = interfaces(&links, &addrs).unwrap();
        assert_eq!(
            got,
            vec![
                InterfaceStatus {
                    name: "eth0".into(),
                    mac_address: Some("52:54:00:12:34:56".into()),
                    addresses: vec!["192.0.2.10/24".into(), "2001:db8::10/64".into()],
                },
                InterfaceStatus {
                    name: "lo".into(),
                    mac_address: None,
                    addresses: vec!["127.0.0.1/8".into()],
                },
            ]
        );
    }

    #[test]
    fn disks_are_mapped_and_loops_skipped() {
        let mut cd = disk("sr0");
        if let Some(spec) = cd.spec.as_mut() {
            spec.yaml_spec = "size: 0\ncdrom: true\ndev_path: /dev/sr0\nmodel: \"\"\n".into();
        }
        let got = disks(&[disk("vda"), disk("loop0"), cd]).unwrap();
        assert_eq!(
            got,
            vec![
                DiskStatus {
                    name: "sr0".into(),
                    dev_path: Some("/dev/sr0".into()),
                    size_bytes: Some(0),
                    readonly: Some(true),
                    ..Default::default()
                },
                DiskStatus {
                    name: "vda".into(),
                    dev_path: Some("/dev/vda".into()),
                    model: Some("QEMU HARDDISK".into()),
                    serial: Some("QM0001".into()),
                    size_bytes: Some(10_737_418_240),
                    transport: Some("virtio".into()),
                    rotational: Some(true),
                    readonly: Some(false),
                },
            ]
        );
    }

    #[test]
    fn bad_specs_are_protocol_errors() {
        let mut missing = link("eth0", "x");
        missing.spec = None;
        assert!(matches!(
            interfaces(&[missing], &[]),
            Err(ProtocolError::MissingSpec { id }) if id == "eth0"
        ));
        let bad = resource(
            NETWORK_NAMESPACE,
            ADDRESS_STATUS_TYPE,
            "a",
            "linkName: [unclosed",
        );
        assert!(matches!(
            interfaces(&[], &[bad]),
            Err(ProtocolError::Spec { .. })
        ));
    }
}
