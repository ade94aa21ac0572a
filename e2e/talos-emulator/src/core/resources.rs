//! The COSI resources a machine serves, each as real Talos fills `cosi.resource.Spec`: the
//! spec's protobuf encoding (`proto_spec`, what typed Go clients such as `talosctl` and
//! Omni decode) and its YAML (`yaml_spec`, what `talosctl get -o yaml` prints), rendered
//! from one value so the two always agree.
//!
//! The protobuf messages are the Talos resource definitions
//! (`talos.resource.definitions.network.LinkStatusSpec`, `...network.AddressStatusSpec`,
//! `...block.DiskSpec`), declared here with prost for the fields the emulator sets; field
//! numbers and enum values from `reference/talos-wire.md` section 3.2 and Talos'
//! `api/resource/definitions/*.proto`. YAML keys are camelCase for network resources and
//! snake_case for block ones, as Talos prints them.

use std::net::Ipv4Addr;

use kontinuum_proto::talos::common::{NetIp, NetIpPrefix};
use prost::Message as _;

use super::Facts;

/// One resource's id and both renderings of its spec.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CosiSpec {
    /// `metadata.id`.
    pub id: String,
    /// `spec.yaml_spec`.
    pub yaml: String,
    /// `spec.proto_spec`.
    pub proto: Vec<u8>,
}

/// `network.LinkStatusSpec` (the fields the emulator sets).
#[derive(Clone, PartialEq, prost::Message)]
pub struct LinkStatusSpec {
    #[prost(uint32, tag = "1")]
    pub index: u32,
    /// `nethelpers.LinkType` (ARPHRD_*): ether 1, loopback 772.
    #[prost(int32, tag = "2")]
    pub r#type: i32,
    #[prost(uint32, tag = "3")]
    pub link_index: u32,
    /// `nethelpers.LinkFlags` (IFF_*).
    #[prost(uint32, tag = "4")]
    pub flags: u32,
    #[prost(bytes = "vec", tag = "5")]
    pub hardware_addr: Vec<u8>,
    #[prost(bytes = "vec", tag = "6")]
    pub broadcast_addr: Vec<u8>,
    #[prost(uint32, tag = "7")]
    pub mtu: u32,
    #[prost(string, tag = "8")]
    pub queue_disc: String,
    /// `nethelpers.OperationalState`: unknown 0, up 6.
    #[prost(int32, tag = "10")]
    pub operational_state: i32,
    #[prost(string, tag = "11")]
    pub kind: String,
    #[prost(string, tag = "12")]
    pub slave_kind: String,
    #[prost(string, tag = "13")]
    pub bus_path: String,
    #[prost(string, tag = "15")]
    pub driver: String,
    #[prost(bool, tag = "22")]
    pub link_state: bool,
    #[prost(int64, tag = "23")]
    pub speed_megabits: i64,
    /// `nethelpers.Port`: other 255.
    #[prost(int32, tag = "24")]
    pub port: i32,
    /// `nethelpers.Duplex`: full 1.
    #[prost(int32, tag = "25")]
    pub duplex: i32,
    #[prost(bytes = "vec", tag = "30")]
    pub permanent_addr: Vec<u8>,
}

/// `network.AddressStatusSpec`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct AddressStatusSpec {
    #[prost(message, optional, tag = "1")]
    pub address: Option<NetIpPrefix>,
    #[prost(message, optional, tag = "2")]
    pub local: Option<NetIp>,
    #[prost(uint32, tag = "6")]
    pub link_index: u32,
    #[prost(string, tag = "7")]
    pub link_name: String,
    /// `nethelpers.Family`: inet4 2.
    #[prost(int32, tag = "8")]
    pub family: i32,
    /// `nethelpers.Scope`: global 0, host 254.
    #[prost(int32, tag = "9")]
    pub scope: i32,
    /// `nethelpers.AddressFlags` (IFA_F_*): permanent 0x80.
    #[prost(uint32, tag = "10")]
    pub flags: u32,
    #[prost(uint32, tag = "11")]
    pub priority: u32,
}

/// `block.DiskSpec`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct DiskSpec {
    #[prost(uint64, tag = "1")]
    pub size: u64,
    #[prost(uint64, tag = "2")]
    pub io_size: u64,
    #[prost(uint64, tag = "3")]
    pub sector_size: u64,
    #[prost(bool, tag = "4")]
    pub readonly: bool,
    #[prost(string, tag = "5")]
    pub model: String,
    #[prost(string, tag = "6")]
    pub serial: String,
    #[prost(string, tag = "7")]
    pub modalias: String,
    #[prost(string, tag = "9")]
    pub bus_path: String,
    #[prost(string, tag = "10")]
    pub sub_system: String,
    #[prost(string, tag = "11")]
    pub transport: String,
    #[prost(bool, tag = "12")]
    pub rotational: bool,
    #[prost(bool, tag = "13")]
    pub cdrom: bool,
    #[prost(string, tag = "14")]
    pub dev_path: String,
    #[prost(string, tag = "15")]
    pub pretty_size: String,
    #[prost(string, repeated, tag = "18")]
    pub symlinks: Vec<String>,
}

const IFF_UP: u32 = 0x1;
const IFF_BROADCAST: u32 = 0x2;
const IFF_LOOPBACK: u32 = 0x8;
const IFF_RUNNING: u32 = 0x40;
const IFF_MULTICAST: u32 = 0x1000;
const IFF_LOWER_UP: u32 = 0x1_0000;
const ARPHRD_ETHER: i32 = 1;
const ARPHRD_LOOPBACK: i32 = 772;
const OPER_STATE_UNKNOWN: i32 = 0;
const OPER_STATE_UP: i32 = 6;
const PORT_OTHER: i32 = 255;
const DUPLEX_FULL: i32 = 1;
const FAMILY_INET4: i32 = 2;
const SCOPE_GLOBAL: i32 = 0;
const SCOPE_HOST: i32 = 254;
const IFA_F_PERMANENT: u32 = 0x80;
const ADDRESS_PRIORITY: u32 = 1024;

/// `aa:bb:cc:dd:ee:ff` → 6 bytes (zeros for anything malformed).
fn mac_bytes(mac: &str) -> Vec<u8> {
    let bytes: Vec<u8> = mac
        .split(':')
        .filter_map(|b| u8::from_str_radix(b, 16).ok())
        .collect();
    if bytes.len() == 6 { bytes } else { vec![0; 6] }
}

/// Every LinkStatus: `eth0` and `lo`.
pub fn links(facts: &Facts) -> Vec<CosiSpec> {
    let mac = facts.mac();
    let eth0 = LinkStatusSpec {
        index: 2,
        r#type: ARPHRD_ETHER,
        link_index: 0,
        flags: IFF_UP | IFF_BROADCAST | IFF_RUNNING | IFF_MULTICAST | IFF_LOWER_UP,
        hardware_addr: mac_bytes(&mac),
        broadcast_addr: vec![0xff; 6],
        mtu: 1500,
        queue_disc: "pfifo_fast".to_owned(),
        operational_state: OPER_STATE_UP,
        kind: String::new(),
        slave_kind: String::new(),
        bus_path: "0000:00:03.0".to_owned(),
        driver: "virtio_net".to_owned(),
        link_state: true,
        speed_megabits: 1000,
        port: PORT_OTHER,
        duplex: DUPLEX_FULL,
        permanent_addr: mac_bytes(&mac),
    };
    let lo = LinkStatusSpec {
        index: 1,
        r#type: ARPHRD_LOOPBACK,
        flags: IFF_UP | IFF_LOOPBACK | IFF_RUNNING,
        hardware_addr: vec![0; 6],
        broadcast_addr: vec![0; 6],
        mtu: 65536,
        queue_disc: "noqueue".to_owned(),
        operational_state: OPER_STATE_UNKNOWN,
        link_state: true,
        ..LinkStatusSpec::default()
    };
    vec![
        CosiSpec {
            id: "eth0".to_owned(),
            yaml: format!(
                "index: 2\ntype: ether\nlinkIndex: 0\nflags: UP,BROADCAST,RUNNING,MULTICAST,LOWER_UP\n\
                 hardwareAddr: {mac}\npermanentAddr: {mac}\nbroadcastAddr: ff:ff:ff:ff:ff:ff\n\
                 mtu: 1500\nqueueDisc: pfifo_fast\noperationalState: up\nkind: \"\"\n\
                 slaveKind: \"\"\nbusPath: \"0000:00:03.0\"\ndriver: virtio_net\n\
                 linkState: true\nspeedMbit: 1000\nport: Other\nduplex: Full\n"
            ),
            proto: eth0.encode_to_vec(),
        },
        CosiSpec {
            id: "lo".to_owned(),
            yaml: "index: 1\ntype: loopback\nlinkIndex: 0\nflags: UP,LOOPBACK,RUNNING\n\
                   hardwareAddr: 00:00:00:00:00:00\nbroadcastAddr: 00:00:00:00:00:00\n\
                   mtu: 65536\nqueueDisc: noqueue\noperationalState: unknown\nkind: \"\"\n\
                   slaveKind: \"\"\nlinkState: true\n"
                .to_owned(),
            proto: lo.encode_to_vec(),
        },
    ]
}

/// Every AddressStatus: the machine's CIDR on `eth0`, loopback on `lo`.
pub fn addresses(facts: &Facts) -> Vec<CosiSpec> {
    let entry = |link: &str, ip: Ipv4Addr, prefix: u8, index: u32, scope: (&str, i32)| {
        let spec = AddressStatusSpec {
            address: Some(NetIpPrefix {
                ip: ip.octets().to_vec(),
                prefix_length: i32::from(prefix),
            }),
            local: Some(NetIp {
                ip: ip.octets().to_vec(),
            }),
            link_index: index,
            link_name: link.to_owned(),
            family: FAMILY_INET4,
            scope: scope.1,
            flags: IFA_F_PERMANENT,
            priority: ADDRESS_PRIORITY,
        };
        CosiSpec {
            id: format!("{link}/{ip}/{prefix}"),
            yaml: format!(
                "address: {ip}/{prefix}\nlocal: {ip}\nlinkIndex: {index}\nlinkName: {link}\n\
                 family: inet4\nscope: {}\nflags: permanent\npriority: {ADDRESS_PRIORITY}\n",
                scope.0
            ),
            proto: spec.encode_to_vec(),
        }
    };
    vec![
        entry(
            "eth0",
            facts.address,
            super::PREFIX_LENGTH,
            2,
            ("global", SCOPE_GLOBAL),
        ),
        entry("lo", Ipv4Addr::LOCALHOST, 8, 1, ("host", SCOPE_HOST)),
    ]
}

/// Every Disk.
pub fn disks(facts: &Facts) -> Vec<CosiSpec> {
    let d = facts.disk();
    let pretty = format!("{} GB", d.size / 1_000_000_000);
    let bus_path = "/pci0000:00/0000:00:05.0/virtio3/host0/target0:0:0/0:0:0:0";
    let symlink = format!("/dev/disk/by-id/scsi-0QEMU_QEMU_HARDDISK_{}", d.serial);
    let spec = DiskSpec {
        size: d.size,
        io_size: 512,
        sector_size: 512,
        readonly: false,
        model: d.model.clone(),
        serial: d.serial.clone(),
        modalias: "scsi:t-0x00".to_owned(),
        bus_path: bus_path.to_owned(),
        sub_system: "/sys/class/block".to_owned(),
        transport: "scsi".to_owned(),
        rotational: false,
        cdrom: false,
        dev_path: d.dev_path.clone(),
        pretty_size: pretty.clone(),
        symlinks: vec![symlink.clone()],
    };
    vec![CosiSpec {
        id: d.name.clone(),
        yaml: format!(
            "size: {size}\nio_size: 512\nsector_size: 512\nreadonly: false\ncdrom: false\n\
             model: {model}\nserial: {serial}\nmodalias: scsi:t-0x00\n\
             bus_path: {bus_path}\n\
             sub_system: /sys/class/block\ntransport: scsi\nrotational: false\n\
             dev_path: {dev}\npretty_size: {pretty}\nsecondary_disks: []\n\
             symlinks:\n  - {symlink}\n",
            size = d.size,
            model = d.model,
            serial = d.serial,
            dev = d.dev_path,
        ),
        proto: spec.encode_to_vec(),
    }]
}
