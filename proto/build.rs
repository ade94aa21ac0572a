//! Compiles `talos/**/*.proto` with the pure-Rust `protox` compiler (no `protoc` needed) and
//! generates prost messages plus tonic clients and servers into `OUT_DIR/talos.rs`.

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

fn main() -> Result<(), Box<dyn Error>> {
    println!("cargo:rerun-if-changed=talos");
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
    Ok(())
}
