//! CPU profiles of running processes with Linux `perf` (sampling, no call graphs): where a
//! process spends its CPU, by symbol and by coarse category (cryptography, TLS, HTTP/2,
//! runtime, allocator, kernel...). Optional: without `perf` on `PATH`, there is no profile.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context as _, bail};
use tokio::process::Command;

/// The token's cryptography: ed25519 and SHA-512 in ring (its C and assembly symbols, with
/// or without the `ring_core_<version>__` prefix).
const ED25519: &str = "ed25519 and SHA-512 (token signing and verification)";
const ED25519_PREFIXES: &[&str] = &[
    "ge_",
    "fe_",
    "fe4_",
    "sc_",
    "x25519",
    "fiat_curve25519",
    "slide",
    "sha512",
];

/// Categories after [`ED25519`], first match wins: (name, symbol substrings).
const CATEGORIES: &[(&str, &[&str])] = &[
    (
        "TLS (rustls, AES-GCM)",
        &["rustls", "aes_", "gcm", "ghash", "chacha", "poly1305"],
    ),
    // Before the crates its symbols name in their generic parameters.
    (
        "etcd-proxy's own code (authz, relay, proxy)",
        &["etcd_proxy"],
    ),
    (
        "gRPC and protobuf (tonic, prost)",
        &["tonic", "prost", "etcdserverpb", "kontinuum_proto"],
    ),
    ("JSON and base64 (token encoding)", &["serde", "base64"]),
    (
        "HTTP/2 (h2, hyper, http, bytes)",
        &["h2::", "hyper", "http::", "bytes::"],
    ),
    ("async runtime (tokio)", &["tokio"]),
    ("metrics and tracing", &["prometheus", "tracing"]),
    (
        "libc (syscall wrappers, clock, epoll)",
        &[
            "syscall",
            "epoll",
            "__send",
            "__recv",
            "__libc",
            "clock_gettime",
            "pthread",
            "__GI_",
        ],
    ),
    (
        "memory (malloc, free, memcpy)",
        &[
            "malloc",
            "free",
            "memmove",
            "memcpy",
            "memset",
            "memcmp",
            "_int_",
            "unlink_chunk",
            "realloc",
        ],
    ),
];

/// The kernel's share is its own category.
const KERNEL: &str = "kernel (syscalls, scheduling, loopback TCP, unix sockets)";
const OTHER: &str = "other";

/// A flat profile.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Profile {
    /// Share of samples per category, largest first (percent).
    pub categories: Vec<(&'static str, f64)>,
    /// The heaviest symbols (percent, `[k]`/`[.]` symbol).
    pub top: Vec<(f64, String)>,
}

/// Whether `perf` can be run.
pub async fn available() -> bool {
    Command::new("perf")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .await
        .is_ok_and(|s| s.success())
}

/// Samples `pid` for `duration` into `data` (`perf record -F 999`).
pub async fn record(pid: u32, duration: Duration, data: &Path) -> anyhow::Result<()> {
    let out = Command::new("perf")
        .args(["record", "-F", "999", "-o"])
        .arg(data)
        .args(["-p", &pid.to_string(), "--", "sleep"])
        .arg(format!("{}", duration.as_secs_f64()))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(duration + Duration::from_secs(30), out)
        .await
        .context("perf record did not finish")??;
    if !out.status.success() {
        bail!(
            "perf record failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Reads a recording back as a flat profile by symbol.
pub async fn report(data: &Path, top: usize) -> anyhow::Result<Profile> {
    let out = Command::new("perf")
        .args(["report", "--no-children", "--sort", "sym", "--stdio", "-i"])
        .arg(data)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(60), out)
        .await
        .context("perf report did not finish")??;
    if !out.status.success() {
        bail!("perf report failed");
    }
    Ok(parse(&String::from_utf8_lossy(&out.stdout), top))
}

/// The category of one symbol (`kernel` says whether it is a `[k]` one).
fn category(symbol: &str, kernel: bool) -> &'static str {
    if kernel {
        return KERNEL;
    }
    let bare = symbol
        .strip_prefix("ring_core_")
        .and_then(|s| s.split_once("__").map(|(_, rest)| rest))
        .unwrap_or(symbol);
    if ED25519_PREFIXES.iter().any(|p| bare.starts_with(p)) || symbol.contains("ed25519") {
        return ED25519;
    }
    CATEGORIES
        .iter()
        .find(|(_, needles)| needles.iter().any(|n| symbol.contains(n)))
        .map_or(OTHER, |(name, _)| name)
}

/// Parses `perf report --no-children --sort sym --stdio` output: lines
/// `  12.58%  [.] symbol` (or `[k]`).
pub fn parse(text: &str, top: usize) -> Profile {
    let mut rows: Vec<(f64, bool, String)> = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        let Some((percent, rest)) = line.split_once('%') else {
            continue;
        };
        let Ok(percent) = percent.trim().parse::<f64>() else {
            continue;
        };
        let rest = rest.trim();
        let (kernel, symbol) = if let Some(s) = rest.strip_prefix("[k]") {
            (true, s.trim())
        } else if let Some(s) = rest.strip_prefix("[.]") {
            (false, s.trim())
        } else {
            continue;
        };
        rows.push((percent, kernel, symbol.to_owned()));
    }
    let mut sums: Vec<(&'static str, f64)> = Vec::new();
    for (percent, kernel, symbol) in &rows {
        let name = category(symbol, *kernel);
        match sums.iter_mut().find(|(n, _)| *n == name) {
            Some((_, sum)) => *sum += percent,
            None => sums.push((name, *percent)),
        }
    }
    sums.sort_by(|a, b| b.1.total_cmp(&a.1));
    rows.sort_by(|a, b| b.0.total_cmp(&a.0));
    Profile {
        categories: sums,
        top: rows
            .into_iter()
            .take(top)
            .map(|(p, kernel, symbol)| {
                (
                    p,
                    format!("{} {symbol}", if kernel { "[k]" } else { "[.]" }),
                )
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generic_symbols_go_to_the_outer_crate() {
        assert_eq!(
            category(
                "<etcd_proxy::proxy::Proxy as kontinuum_proto::etcd::etcdserverpb::kv_server::Kv>::range",
                false
            ),
            "etcd-proxy's own code (authz, relay, proxy)"
        );
        assert_eq!(
            category(
                "<kontinuum_proto::etcd::etcdserverpb::kv_server::KvServer<T> as tower_service::Service<http::request::Request<B>>>::call",
                false
            ),
            "gRPC and protobuf (tonic, prost)"
        );
        assert_eq!(
            category("ring_core_0_17_14__aes_gcm_dec_update_vaes_avx2", false),
            "TLS (rustls, AES-GCM)"
        );
        assert_eq!(
            category("ring_core_0_17_14__sha512_block_data_order_nohw", false),
            ED25519
        );
        assert_eq!(category("tcp_sendmsg", true), KERNEL);
    }

    #[test]
    fn symbols_fall_into_categories() {
        let text = "# Samples: 2K of event 'cpu-clock'\n#\n\
            12.58%  [.] ge_double_scalarmult_vartime\n\
            10.00%  [.] ring_core_0_17_14__x25519_ge_scalarmult_base_adx\n\
             5.12%  [k] finish_task_switch.isra.0\n\
             3.37%  [.] __memmove_avx512_unaligned_erms\n\
             1.13%  [.] h2::hpack::huffman::decode::decode\n\
             0.50%  [.] <rustls::conn::ConnectionCommon<T>>::process_new_packets\n\
             0.40%  [.] tokio::runtime::scheduler::multi_thread::worker::Context::run\n\
             0.30%  [.] something_else\n\
             0.20%  [.] core::cell::unsafe_fe_cell\n\
            \n";
        let p = parse(text, 3);
        assert_eq!(p.categories[0].0, ED25519);
        assert!((p.categories[0].1 - 22.58).abs() < 1e-9);
        assert_eq!(p.categories[1], (KERNEL, 5.12));
        let names: Vec<&str> = p.categories.iter().map(|(n, _)| *n).collect();
        for wanted in [
            "HTTP/2 (h2, hyper, http, bytes)",
            "TLS (rustls, AES-GCM)",
            "async runtime (tokio)",
            "memory (malloc, free, memcpy)",
            OTHER,
        ] {
            assert!(names.contains(&wanted), "{wanted} in {names:?}");
        }
        let other = p.categories.iter().find(|(n, _)| *n == OTHER).unwrap().1;
        assert!((other - 0.5).abs() < 1e-9, "{other}");
        assert_eq!(p.top.len(), 3);
        assert_eq!(p.top[0].1, "[.] ge_double_scalarmult_vartime");
        assert_eq!(parse("nothing here", 5), Profile::default());
    }
}
