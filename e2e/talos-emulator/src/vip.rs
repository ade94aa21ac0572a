//! Talos' shared (virtual) IP, as its VIP operator runs it: the control planes of a running
//! cluster whose config names a shared IP (a `Layer2VIPConfig`) campaign in an etcd
//! election; the winner puts the address on its link. Here the winner's address is a
//! listener on `<shared IP>:<endpoint port>` (a loopback address) forwarding every
//! connection to the cluster's API server, and the election is decided by this task:
//!
//! * the first candidate by address wins while there is no holder;
//! * a holder that stops campaigning gracefully (its config reset or replaced, a reboot)
//!   resigns: another takes over at the next tick;
//! * a holder that powers off ([`crate::Fault::PowerOff`]) cannot resign: its listener is
//!   gone at once (the address with the machine), but its lease keeps the election until
//!   the lease's TTL has passed. Talos' operator opens its etcd session with the client's
//!   default TTL, 60 s ([`DEFAULT_LEASE_TTL_MS`]); [`crate::Emulator::set_vip_lease_ttl`]
//!   shortens it for tests.
//!
//! The emulator runs one API server per cluster (on the machine that bootstrapped), which
//! stands for every control plane's: a powered-off control plane's share of it is not
//! modelled, only who holds the address.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;

use crate::machine::{Shared, lock};

/// etcd's `concurrency.NewSession` default lease TTL, which Talos' VIP operator keeps.
pub(crate) const DEFAULT_LEASE_TTL_MS: u64 = 60_000;

/// How often the election is looked at.
const TICK: Duration = Duration::from_millis(100);

/// One shared IP's holder: the machine and its listener (with every forwarded connection).
struct Holder {
    machine: Ipv4Addr,
    upstream: SocketAddr,
    task: JoinHandle<()>,
}

impl Drop for Holder {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Runs the elections until the emulator is dropped.
pub(crate) async fn run(shared: Weak<Shared>) {
    let mut holders: BTreeMap<IpAddr, Holder> = BTreeMap::new();
    // A shared IP whose holder powered off: nobody may take it before this instant.
    let mut leases: BTreeMap<IpAddr, Instant> = BTreeMap::new();
    loop {
        tokio::time::sleep(TICK).await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        // Candidates by shared IP, in address order.
        let mut candidates: BTreeMap<IpAddr, Vec<(Ipv4Addr, u16, SocketAddr)>> = BTreeMap::new();
        for machine in &shared.machines {
            if let Some((vip, port, upstream)) = machine.vip_candidate().await {
                candidates
                    .entry(vip)
                    .or_default()
                    .push((machine.facts.address, port, upstream));
            }
        }
        let now = Instant::now();
        let ttl = Duration::from_millis(shared.vip_lease_ttl_ms.load(Ordering::Relaxed));
        // Holders that no longer campaign lose the address.
        holders.retain(|vip, holder| {
            let campaigning = candidates.get(vip).is_some_and(|c| {
                c.iter()
                    .any(|(m, _, up)| *m == holder.machine && *up == holder.upstream)
            });
            if !campaigning {
                let powered_off = shared
                    .machines
                    .iter()
                    .find(|m| m.facts.address == holder.machine)
                    .is_some_and(|m| m.faults.borrow().powered_off);
                if powered_off {
                    leases.insert(*vip, now + ttl);
                }
                tracing::info!(vip = %vip, holder = %holder.machine, powered_off, "the shared IP's holder stopped campaigning");
            }
            campaigning
        });
        leases.retain(|_, until| *until > now);
        for (vip, list) in &candidates {
            if holders.contains_key(vip) || leases.contains_key(vip) {
                continue;
            }
            let Some(&(machine, port, upstream)) = list.first() else {
                continue;
            };
            match TcpListener::bind((*vip, port)).await {
                Ok(listener) => {
                    tracing::info!(vip = %vip, holder = %machine, "the shared IP is held");
                    let task = tokio::spawn(forward(listener, upstream));
                    holders.insert(
                        *vip,
                        Holder {
                            machine,
                            upstream,
                            task,
                        },
                    );
                }
                Err(e) => {
                    tracing::warn!(vip = %vip, error = %e, "binding the shared IP failed; retrying");
                }
            }
        }
        *lock(&shared.vip_holders) = holders.iter().map(|(v, h)| (*v, h.machine)).collect();
    }
}

/// Forwards every connection to `listener` to `upstream`; aborting it closes them all.
async fn forward(listener: TcpListener, upstream: SocketAddr) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((mut down, _)) = accepted else { continue };
                connections.spawn(async move {
                    if let Ok(mut up) = TcpStream::connect(upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut down, &mut up).await;
                    }
                });
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

/// Who holds `vip` now.
pub(crate) fn holder(shared: &Arc<Shared>, vip: IpAddr) -> Option<Ipv4Addr> {
    lock(&shared.vip_holders).get(&vip).copied()
}
