//! `fidelity-gen OUT_DIR ENDPOINT_IP HOSTNAME`: writes `controlplane.yaml` (a controlplane
//! machine config for Talos v1.13.8 whose cluster endpoint is ENDPOINT_IP) and `talosconfig`
//! (the os:admin identity, exactly as `talosctl` would read it) into OUT_DIR.
//!
//! Only the config generation is ours; the fidelity test talks to the emulator with the
//! independent Python client generated from the official Talos protos.

use std::path::PathBuf;

use kontinuum_talos_config::{
    ConfigInput, InstallDisk, MachineType, SecretsBundle, TalosVersion, admin_talosconfig,
    render_machine_config,
};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [out, endpoint, hostname] = args.as_slice() else {
        return Err("usage: fidelity-gen OUT_DIR ENDPOINT_IP HOSTNAME".into());
    };
    let out = PathBuf::from(out);
    std::fs::create_dir_all(&out)?;
    let version = TalosVersion::parse("v1.13.8")?;
    let now = jiff::Timestamp::now();
    let bundle = SecretsBundle::generate_with_rsa_bits(&mut rand_core::OsRng, now, &version, 2048)?;
    let mut input = ConfigInput::new("fidelity", endpoint.clone(), version, "1.36.2");
    input.install_disk = InstallDisk::Path("/dev/sda".into());
    let config = render_machine_config(&input, &bundle, MachineType::ControlPlane, hostname)?;
    std::fs::write(out.join("controlplane.yaml"), config.expose())?;
    let admin = admin_talosconfig(
        &bundle,
        "fidelity",
        std::slice::from_ref(endpoint),
        &[],
        now,
        &mut rand_core::OsRng,
    )?;
    std::fs::write(out.join("talosconfig"), admin.talosconfig.expose())?;
    Ok(())
}
