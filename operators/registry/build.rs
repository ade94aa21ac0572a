//! Tells the integration tests where the `etcd-proxy` binary is.
//!
//! The tests reuse etcd-proxy's own test support (`operators/etcd-proxy/tests/support`,
//! `#[path]`-included), which names its binary with `env!("CARGO_BIN_EXE_etcd-proxy")`;
//! Cargo defines that only for etcd-proxy's own tests, so it is defined here, for this
//! package, as the `etcd-proxy` built into the same target directory. Build it first:
//! `cargo build -p etcd-proxy` (`make test` and `cargo test --workspace` do).

use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    // OUT_DIR is <target>/<profile>/build/registry-<hash>/out.
    let out = PathBuf::from(std::env::var_os("OUT_DIR").unwrap_or_default());
    let profile_dir = out
        .ancestors()
        .nth(3)
        .map(PathBuf::from)
        .unwrap_or_default();
    let bin = profile_dir.join("etcd-proxy");
    println!("cargo:rustc-env=CARGO_BIN_EXE_etcd-proxy={}", bin.display());
}
