//! Memory and CPU time of processes, and the host's CPU, read from `/proc` (Linux only).

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

/// Clock ticks per second of `/proc` CPU times (`USER_HZ`, 100 on every Linux we run on).
const TICKS_PER_SECOND: u64 = 100;

/// Memory figures of one process (`/proc/<pid>/status`), in KiB.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcMemory {
    pub pid: u32,
    /// `/proc/<pid>/comm`.
    pub name: String,
    /// Resident set size now.
    pub rss_kib: u64,
    /// Peak resident set size.
    pub hwm_kib: u64,
    pub threads: u64,
}

/// Reads one process; `None` if it is gone.
pub fn memory(pid: u32) -> Option<ProcMemory> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let mut out = parse_status(&status);
    out.pid = pid;
    if let Ok(comm) = std::fs::read_to_string(format!("/proc/{pid}/comm")) {
        comm.trim().clone_into(&mut out.name);
    }
    Some(out)
}

/// The `VmRSS`, `VmHWM` and `Threads` fields of a `/proc/<pid>/status` text (`Name` as well).
pub fn parse_status(status: &str) -> ProcMemory {
    let mut out = ProcMemory::default();
    for line in status.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let number = || {
            value
                .split_whitespace()
                .next()
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
        };
        match key {
            "Name" => value.trim().clone_into(&mut out.name),
            "VmRSS" => out.rss_kib = number(),
            "VmHWM" => out.hwm_kib = number(),
            "Threads" => out.threads = number(),
            _ => {}
        }
    }
    out
}

/// The parent pid from a `/proc/<pid>/stat` line (the field after the `(comm)`, which may
/// itself contain spaces and parentheses).
pub fn parse_ppid(stat: &str) -> Option<u32> {
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// CPU time (user + system, all threads) of a process, from `/proc/<pid>/stat`; `None` if
/// it is gone. Resolution: one clock tick (10 ms).
pub fn cpu_time(pid: u32) -> Option<Duration> {
    parse_cpu_time(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// `utime + stime` of a `/proc/<pid>/stat` line.
pub fn parse_cpu_time(stat: &str) -> Option<Duration> {
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(Duration::from_millis(ticks * 1000 / TICKS_PER_SECOND))
}

/// The host's CPU counters (the `cpu` line of `/proc/stat`), in clock ticks summed over
/// every CPU.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HostCpu {
    /// Every tick counted.
    pub total: u64,
    /// Ticks spent neither idle nor waiting for I/O.
    pub busy: u64,
}

impl HostCpu {
    /// Reads `/proc/stat` (all zero if it cannot be read).
    pub fn read() -> Self {
        std::fs::read_to_string("/proc/stat")
            .ok()
            .and_then(|s| Self::parse(&s))
            .unwrap_or_default()
    }

    /// The aggregate `cpu` line of a `/proc/stat` text.
    pub fn parse(stat: &str) -> Option<Self> {
        let line = stat.lines().find(|l| l.starts_with("cpu "))?;
        let values: Vec<u64> = line
            .split_whitespace()
            .skip(1)
            .map(|v| v.parse().ok())
            .collect::<Option<_>>()?;
        // user nice system idle iowait irq softirq steal [guest guest_nice, already in user]
        let total: u64 = values.iter().take(8).sum();
        let idle = values.get(3)? + values.get(4).copied().unwrap_or(0);
        Some(Self {
            total,
            busy: total.saturating_sub(idle),
        })
    }

    /// The busy share of the time between `earlier` and `self`, 0.0 to 1.0.
    pub fn busy_since(self, earlier: Self) -> f64 {
        let total = self.total.saturating_sub(earlier.total);
        if total == 0 {
            return 0.0;
        }
        #[allow(clippy::cast_precision_loss, reason = "tick counts far below 2^52")]
        let share = self.busy.saturating_sub(earlier.busy) as f64 / total as f64;
        share
    }
}

/// `root` and every live descendant, root first, then breadth first.
pub fn tree(root: u32) -> Vec<ProcMemory> {
    let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for entry in entries.filter_map(Result::ok) {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            let stat_path = Path::new("/proc").join(pid.to_string()).join("stat");
            if let Some(ppid) = std::fs::read_to_string(stat_path)
                .ok()
                .as_deref()
                .and_then(parse_ppid)
            {
                children.entry(ppid).or_default().push(pid);
            }
        }
    }
    let mut order = vec![root];
    let mut next = 0;
    while next < order.len() {
        if let Some(kids) = children.get(&order[next]) {
            let mut kids = kids.clone();
            kids.sort_unstable();
            order.extend(kids);
        }
        next += 1;
    }
    order.into_iter().filter_map(memory).collect()
}

/// Machine facts for a report: logical CPUs, CPU model, total memory.
#[derive(Clone, Debug, Default)]
pub struct Host {
    pub cpus: usize,
    pub cpu_model: String,
    pub mem_total_kib: u64,
    pub kernel: String,
    /// `/proc/loadavg` (1, 5, 15 minutes) when read: other work skews the figures.
    pub loadavg: String,
}

impl Host {
    pub fn read() -> Self {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        Self {
            cpus: std::thread::available_parallelism().map_or(0, std::num::NonZeroUsize::get),
            cpu_model: field(&cpuinfo, "model name").unwrap_or_else(|| "unknown".to_owned()),
            mem_total_kib: field(&meminfo, "MemTotal")
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
                .unwrap_or(0),
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .map_or_else(|_| "unknown".to_owned(), |k| k.trim().to_owned()),
            loadavg: std::fs::read_to_string("/proc/loadavg")
                .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
                .unwrap_or_default(),
        }
    }
}

/// The value of the first `key : value` line.
fn field(text: &str, key: &str) -> Option<String> {
    text.lines().find_map(|line| {
        let (k, v) = line.split_once(':')?;
        (k.trim() == key).then(|| v.trim().to_owned())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_fields() {
        let status = "Name:\ttalos-emulator\nVmPeak:\t  900 kB\nVmHWM:\t   51234 kB\nVmRSS:\t   40000 kB\nThreads:\t3\n";
        let m = parse_status(status);
        assert_eq!(m.name, "talos-emulator");
        assert_eq!(m.rss_kib, 40000);
        assert_eq!(m.hwm_kib, 51234);
        assert_eq!(m.threads, 3);
    }

    #[test]
    fn ppid_after_awkward_comm() {
        assert_eq!(parse_ppid("42 (a) b (c)) S 7 42 42 0"), Some(7));
        assert_eq!(parse_ppid("1 (init) S 0 1 1"), Some(0));
        assert_eq!(parse_ppid("garbage"), None);
    }

    #[test]
    fn cpu_fields() {
        let stat = "42 (etcd proxy) S 1 42 42 0 -1 4194304 100 0 0 0 250 37 0 0 20 0 9 0";
        assert_eq!(parse_cpu_time(stat), Some(Duration::from_millis(2_870)));
        assert_eq!(parse_cpu_time("nonsense"), None);
        assert!(cpu_time(std::process::id()).is_some());
        let host = HostCpu::parse("cpu  100 5 20 800 50 1 2 0 0 0\ncpu0 1 2 3 4\n").unwrap();
        assert_eq!(
            host,
            HostCpu {
                total: 978,
                busy: 128
            }
        );
        let later = HostCpu {
            total: 1178,
            busy: 278,
        };
        assert!((later.busy_since(host) - 0.75).abs() < 1e-9);
        assert!(host.busy_since(host).abs() < f64::EPSILON);
    }

    #[test]
    fn own_tree_has_self() {
        let me = std::process::id();
        let t = tree(me);
        assert_eq!(t.first().map(|m| m.pid), Some(me));
        assert!(t[0].rss_kib > 0);
    }

    #[test]
    fn cpuinfo_field() {
        let text = "processor\t: 0\nmodel name\t: Some CPU @ 2.0GHz\n";
        assert_eq!(
            field(text, "model name").as_deref(),
            Some("Some CPU @ 2.0GHz")
        );
        assert_eq!(field(text, "flags"), None);
    }
}
