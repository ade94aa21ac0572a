//! Pod IPs and declared ports.
//!
//! Pods share the host's network namespace. By default every pod's IP is the node's own
//! address (host networking); with a pod CIDR (a loopback range such as `127.20.1.0/24`,
//! which Linux answers on without configuration) each pod gets an address of its own,
//! chosen deterministically from its uid and released when the pod is gone.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

/// Errors of IP allocation.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum IpamError {
    /// The CIDR could not be parsed.
    #[error("invalid pod CIDR {0} (want a.b.c.d/n with 8 <= n <= 30)")]
    InvalidCidr(String),
    /// Every address is taken.
    #[error("pod CIDR {0} is exhausted")]
    Exhausted(String),
}

impl IpamError {
    /// A stable CamelCase reason.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::InvalidCidr(_) => "InvalidPodCidr",
            Self::Exhausted(_) => "PodCidrExhausted",
        }
    }
}

/// An IPv4 range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cidr {
    network: u32,
    prefix: u8,
}

impl Cidr {
    /// Parses `a.b.c.d/n`.
    pub fn parse(text: &str) -> Result<Self, IpamError> {
        let bad = || IpamError::InvalidCidr(text.to_string());
        let (addr, prefix) = text.split_once('/').ok_or_else(bad)?;
        let addr: Ipv4Addr = addr.trim().parse().map_err(|_| bad())?;
        let prefix: u8 = prefix.trim().parse().map_err(|_| bad())?;
        if !(8..=30).contains(&prefix) {
            return Err(bad());
        }
        let mask = u32::MAX << (32 - prefix);
        Ok(Self {
            network: u32::from(addr) & mask,
            prefix,
        })
    }

    /// Usable host addresses (network and broadcast excluded).
    fn hosts(self) -> u32 {
        (1_u32 << (32 - self.prefix)) - 2
    }

    fn host(self, index: u32) -> Ipv4Addr {
        Ipv4Addr::from(self.network + 1 + index)
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", Ipv4Addr::from(self.network), self.prefix)
    }
}

/// Gives each pod (by uid) an IP.
#[derive(Debug)]
pub struct Ipam {
    node_ip: Ipv4Addr,
    cidr: Option<Cidr>,
    by_pod: BTreeMap<String, Ipv4Addr>,
}

impl Ipam {
    /// Pod IPs from `cidr`, or the node's IP for every pod when `None`.
    pub fn new(node_ip: Ipv4Addr, cidr: Option<Cidr>) -> Self {
        Self {
            node_ip,
            cidr,
            by_pod: BTreeMap::new(),
        }
    }

    /// The node's IP.
    pub fn node_ip(&self) -> Ipv4Addr {
        self.node_ip
    }

    /// The pod's IP: the one it already has, or a new one. `host_network` pods (and every
    /// pod without a CIDR) get the node's IP. The first choice is a hash of the uid, then
    /// the next free address; the node's own address is never handed out.
    pub fn allocate(&mut self, uid: &str, host_network: bool) -> Result<Ipv4Addr, IpamError> {
        let Some(cidr) = self.cidr.filter(|_| !host_network) else {
            return Ok(self.node_ip);
        };
        if let Some(ip) = self.by_pod.get(uid) {
            return Ok(*ip);
        }
        let hosts = cidr.hosts();
        let start = fnv1a(uid.as_bytes()) % hosts;
        for i in 0..hosts {
            let ip = cidr.host((start + i) % hosts);
            if ip != self.node_ip && !self.by_pod.values().any(|v| *v == ip) {
                self.by_pod.insert(uid.to_string(), ip);
                return Ok(ip);
            }
        }
        Err(IpamError::Exhausted(cidr.to_string()))
    }

    /// Frees the pod's IP.
    pub fn release(&mut self, uid: &str) {
        self.by_pod.remove(uid);
    }
}

fn fnv1a(bytes: &[u8]) -> u32 {
    let mut hash: u32 = 0x811c_9dc5;
    for b in bytes {
        hash ^= u32::from(*b);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    hash
}

/// One declared port: what it occupies on the node.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct PortKey {
    /// The address.
    pub ip: Ipv4Addr,
    /// The port.
    pub port: i32,
    /// `TCP`, `UDP` or `SCTP`.
    pub protocol: String,
}

impl std::fmt::Display for PortKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{} on {}", self.port, self.protocol, self.ip)
    }
}

/// Ports held by the pods of this node.
#[derive(Debug, Default)]
pub struct Ports {
    held: BTreeMap<PortKey, String>,
}

impl Ports {
    /// Reserves every key for `owner`, or names the first key someone else holds (and
    /// reserves nothing).
    pub fn reserve(&mut self, owner: &str, keys: &[PortKey]) -> Result<(), (PortKey, String)> {
        for key in keys {
            if let Some(other) = self.held.get(key).filter(|o| *o != owner) {
                return Err((key.clone(), other.clone()));
            }
        }
        for key in keys {
            self.held.insert(key.clone(), owner.to_string());
        }
        Ok(())
    }

    /// Frees everything `owner` holds.
    pub fn release(&mut self, owner: &str) {
        self.held.retain(|_, o| o != owner);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidrs_parse_and_reject_nonsense() {
        assert_eq!(
            Cidr::parse("127.20.1.7/24").unwrap().to_string(),
            "127.20.1.0/24"
        );
        for bad in [
            "127.0.0.0",
            "127.0.0.0/31",
            "x/24",
            "127.0.0.0/a",
            "1.2.3.4/4",
        ] {
            assert!(Cidr::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn without_a_cidr_every_pod_gets_the_node_ip() {
        let node = Ipv4Addr::new(127, 0, 0, 9);
        let mut ipam = Ipam::new(node, None);
        assert_eq!(ipam.allocate("a", false).unwrap(), node);
        assert_eq!(ipam.allocate("b", false).unwrap(), node);
    }

    #[test]
    fn allocation_is_deterministic_distinct_stable_and_released() {
        let node = Ipv4Addr::new(127, 20, 1, 1);
        let cidr = Cidr::parse("127.20.1.0/29").unwrap(); // 6 hosts, one is the node
        let mut ipam = Ipam::new(node, Some(cidr));
        let mut other = Ipam::new(node, Some(cidr));
        let a = ipam.allocate("uid-a", false).unwrap();
        assert_eq!(other.allocate("uid-a", false).unwrap(), a, "deterministic");
        assert_eq!(ipam.allocate("uid-a", false).unwrap(), a, "stable");
        assert_eq!(ipam.allocate("uid-h", true).unwrap(), node, "host network");
        let mut seen = vec![a];
        for uid in ["b", "c", "d", "e"] {
            let ip = ipam.allocate(uid, false).unwrap();
            assert!(!seen.contains(&ip) && ip != node, "{ip} reused");
            assert!(u32::from(ip) > u32::from(Ipv4Addr::new(127, 20, 1, 0)));
            assert!(u32::from(ip) < u32::from(Ipv4Addr::new(127, 20, 1, 7)));
            seen.push(ip);
        }
        assert!(matches!(
            ipam.allocate("f", false),
            Err(IpamError::Exhausted(_))
        ));
        ipam.release("c");
        assert!(ipam.allocate("f", false).is_ok());
    }

    #[test]
    fn ports_clash_across_owners_only() {
        let key = |port| PortKey {
            ip: Ipv4Addr::LOCALHOST,
            port,
            protocol: "TCP".into(),
        };
        let mut ports = Ports::default();
        ports.reserve("a", &[key(80), key(81)]).unwrap();
        ports.reserve("a", &[key(80)]).unwrap();
        let (clash, owner) = ports.reserve("b", &[key(82), key(81)]).unwrap_err();
        assert_eq!((clash, owner.as_str()), (key(81), "a"));
        // Nothing was reserved for b.
        ports.reserve("c", &[key(82)]).unwrap();
        ports.release("a");
        ports.reserve("b", &[key(80), key(81)]).unwrap();
    }
}
