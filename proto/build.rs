//! Compiles `talos/**/*.proto` and `etcd/**/*.proto` with the pure-Rust `protox` compiler (no
//! `protoc` needed) and generates prost messages plus tonic clients and servers into
//! `OUT_DIR/talos.rs` and `OUT_DIR/etcd.rs`.

use std::error::Error;

const TALOS_PROTOS: &[&str] = &[
    "talos/common/common.proto",
    "talos/machine/machine.proto",
    "talos/cluster/cluster.proto",
    "talos/storage/storage.proto",
    "talos/cosi/resource.proto",
    "talos/cosi/state.proto",
    "talos/google/rpc/status.proto",
];

const ETCD_PROTOS: &[&str] = &["etcdserverpb/rpc.proto", "mvccpb/kv.proto"];

fn main() -> Result<(), Box<dyn Error>> {
    println!("cargo:rerun-if-changed=talos");
    println!("cargo:rerun-if-changed=etcd");
    let fds = protox::compile(TALOS_PROTOS, ["talos"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .build_transport(false)
        // Servers (the emulator, test fakes) answer `Unimplemented` for methods they skip.
        .generate_default_stubs(true)
        // These carry machine configs and kubeconfigs: Debug is implemented by hand, redacted.
        .skip_debug([".machine.ApplyConfigurationRequest", ".common.Data"])
        // `skip_debug` also matches the nested enum, which must keep its derived Debug.
        .enum_attribute(
            ".machine.ApplyConfigurationRequest.Mode",
            "#[derive(Debug)]",
        )
        .include_file("talos.rs")
        .compile_fds(fds)?;

    let fds = protox::compile(ETCD_PROTOS, ["etcd"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .build_transport(false)
        // etcd-proxy and its relay serve KV, Watch and Lease; fakes implement what they need.
        .generate_default_stubs(true)
        .include_file("etcd.rs")
        .compile_fds(fds)?;
    Ok(())
}
