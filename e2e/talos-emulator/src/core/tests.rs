use std::sync::OnceLock;

use kontinuum_talos_config::{
    ConfigInput, InstallDisk, MachineType, SecretsBundle, TalosVersion, render_machine_config,
};

use super::*;

fn facts() -> Facts {
    Facts {
        index: 2,
        address: Ipv4Addr::new(127, 63, 0, 3),
    }
}

fn bundle(n: usize) -> &'static SecretsBundle {
    static BUNDLES: OnceLock<Vec<SecretsBundle>> = OnceLock::new();
    &BUNDLES.get_or_init(|| {
        let version = TalosVersion::parse("v1.13.8").unwrap();
        (0..2)
            .map(|_| {
                SecretsBundle::generate_with_rsa_bits(
                    &mut rand_core::OsRng,
                    jiff::Timestamp::now(),
                    &version,
                    2048,
                )
                .unwrap()
            })
            .collect()
    })[n]
}

fn config(n: usize, kind: MachineType, hostname: &str, endpoint: &str) -> Vec<u8> {
    let mut input = ConfigInput::new(
        "emu",
        endpoint,
        TalosVersion::parse("v1.13.8").unwrap(),
        "1.36.2",
    );
    input.install_disk = InstallDisk::Path("/dev/sda".into());
    render_machine_config(&input, bundle(n), kind, hostname)
        .unwrap()
        .expose()
        .as_bytes()
        .to_vec()
}

fn invalid(r: Result<ParsedConfig, Refusal>) -> String {
    match r {
        Err(Refusal::InvalidArgument(m)) => m,
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
}

#[test]
fn authorization_follows_talos_table() {
    use Access::{Admin, Apply, Operator, Read};
    let m = Mode::Maintenance;
    let c = Mode::Configured;
    assert!(authorize(m, &[], Read).is_ok());
    assert!(authorize(m, &[], Apply).is_ok());
    assert!(authorize(m, &[], Admin).is_err());
    assert!(authorize(c, &[], Read).is_err());
    assert!(authorize(c, &[Role::Reader], Read).is_ok());
    assert!(authorize(c, &[Role::Reader], Admin).is_err());
    assert!(authorize(c, &[Role::Operator], Apply).is_err());
    assert!(authorize(c, &[Role::Admin], Admin).is_ok());
    assert!(authorize(c, &[Role::Admin], Apply).is_ok());
    // Reboot: admin or operator, never a reader, never in maintenance mode.
    assert!(authorize(m, &[], Operator).is_err());
    assert!(authorize(c, &[Role::Reader], Operator).is_err());
    assert!(authorize(c, &[Role::Operator], Operator).is_ok());
    assert!(authorize(c, &[Role::Admin], Operator).is_ok());
    assert!(authorize(c, &[Role::Operator], Admin).is_err());
    assert_eq!(Role::parse("os:admin"), Some(Role::Admin));
    assert_eq!(Role::parse("system:masters"), None);
}

#[test]
fn facts_are_deterministic() {
    let f = facts();
    assert_eq!(f.mac(), "52:54:00:00:00:03");
    assert_eq!(f.cidr(), "127.63.0.3/24");
    assert_eq!(f.default_hostname(), "talos-127-63-0-3");
    assert_eq!(f.disk().serial, "EMU000003");
    let big = Facts {
        index: 0x01_0203 - 1,
        ..f
    };
    assert_eq!(big.mac(), "52:54:00:01:02:03");
}

#[test]
fn resources_parse_with_the_client_discovery() {
    use kontinuum_proto::talos::cosi::resource::{Metadata, Resource, Spec};
    let wrap = |spec: resources::CosiSpec| Resource {
        metadata: Some(Metadata {
            id: spec.id,
            version: "1".into(),
            phase: "running".into(),
            ..Default::default()
        }),
        spec: Some(Spec {
            proto_spec: spec.proto,
            yaml_spec: spec.yaml,
        }),
    };
    let f = facts();
    let links: Vec<_> = resources::links(&f).into_iter().map(wrap).collect();
    let addrs: Vec<_> = resources::addresses(&f).into_iter().map(wrap).collect();
    let disks: Vec<_> = resources::disks(&f).into_iter().map(wrap).collect();
    let ifaces = kontinuum_talos::discovery::interfaces(&links, &addrs).unwrap();
    assert_eq!(ifaces.len(), 2);
    assert_eq!(ifaces[0].name, "eth0");
    assert_eq!(ifaces[0].mac_address.as_deref(), Some("52:54:00:00:00:03"));
    assert_eq!(ifaces[0].addresses, vec!["127.63.0.3/24".to_owned()]);
    assert_eq!(ifaces[1].mac_address, None);
    let disks = kontinuum_talos::discovery::disks(&disks).unwrap();
    assert_eq!(disks.len(), 1);
    assert_eq!(disks[0].dev_path.as_deref(), Some("/dev/sda"));
    assert_eq!(disks[0].serial.as_deref(), Some("EMU000003"));
    assert_eq!(disks[0].size_bytes, Some(107_374_182_400));
    assert_eq!(disks[0].model.as_deref(), Some("QEMU HARDDISK"));
}

/// `proto_spec` decodes (as Talos' typed clients decode it) to what `yaml_spec` says.
#[test]
fn resources_fill_proto_spec_consistently_with_yaml_spec() {
    use prost::Message as _;
    use resources::{AddressStatusSpec, DiskSpec, LinkStatusSpec};
    let f = facts();
    let links = resources::links(&f);
    let eth0 = LinkStatusSpec::decode(links[0].proto.as_slice()).unwrap();
    assert_eq!(links[0].id, "eth0");
    assert_eq!(eth0.index, 2);
    assert_eq!(eth0.r#type, 1, "ARPHRD_ETHER");
    assert_eq!(eth0.hardware_addr, vec![0x52, 0x54, 0x00, 0x00, 0x00, 0x03]);
    assert_eq!(eth0.permanent_addr, eth0.hardware_addr);
    assert_eq!(eth0.broadcast_addr, vec![0xff; 6]);
    assert_eq!(
        eth0.flags,
        0x1 | 0x2 | 0x40 | 0x1000 | 0x1_0000,
        "UP,BROADCAST,RUNNING,MULTICAST,LOWER_UP"
    );
    assert_eq!(
        (eth0.mtu, eth0.operational_state, eth0.speed_megabits),
        (1500, 6, 1000)
    );
    assert_eq!((eth0.port, eth0.duplex), (255, 1), "Other, Full");
    assert_eq!(eth0.driver, "virtio_net");
    assert!(links[0].yaml.contains("hardwareAddr: 52:54:00:00:00:03\n"));
    let lo = LinkStatusSpec::decode(links[1].proto.as_slice()).unwrap();
    assert_eq!(
        (lo.index, lo.r#type, lo.flags, lo.mtu),
        (1, 772, 0x1 | 0x8 | 0x40, 65536)
    );

    let addresses = resources::addresses(&f);
    let a = AddressStatusSpec::decode(addresses[0].proto.as_slice()).unwrap();
    assert_eq!(addresses[0].id, "eth0/127.63.0.3/24");
    let prefix = a.address.unwrap();
    assert_eq!((prefix.ip, prefix.prefix_length), (vec![127, 63, 0, 3], 24));
    assert_eq!(a.local.unwrap().ip, vec![127, 63, 0, 3]);
    assert_eq!((a.link_index, a.link_name.as_str()), (2, "eth0"));
    assert_eq!((a.family, a.scope, a.flags, a.priority), (2, 0, 0x80, 1024));
    let lo = AddressStatusSpec::decode(addresses[1].proto.as_slice()).unwrap();
    assert_eq!((lo.scope, lo.link_name.as_str()), (254, "lo"));
    assert!(addresses[1].yaml.contains("scope: host\n"));

    let disks = resources::disks(&f);
    let d = DiskSpec::decode(disks[0].proto.as_slice()).unwrap();
    assert_eq!((d.dev_path.as_str(), d.size), ("/dev/sda", DISK_SIZE));
    assert_eq!(
        (d.model.as_str(), d.serial.as_str()),
        ("QEMU HARDDISK", "EMU000003")
    );
    assert_eq!(d.symlinks.len(), 1);
    assert!(disks[0].yaml.contains(&format!("size: {DISK_SIZE}\n")));
    assert!(
        disks[0]
            .yaml
            .contains(&format!("pretty_size: {}\n", d.pretty_size))
    );
}

#[test]
fn bad_configs_are_invalid_arguments() {
    let f = facts();
    assert!(invalid(validate_config(b"", &f, &[])).contains("v1alpha1 document is required"));
    invalid(validate_config(b"\x00\xff garbage: [", &f, &[]));
    invalid(validate_config(b"just: a map\n", &f, &[]));
    let big = vec![b'#'; 1024 * 1024 + 1];
    invalid(validate_config(&big, &f, &[]));
    // A config without machine.token.
    let good = String::from_utf8(config(0, MachineType::ControlPlane, "cp", "127.63.0.3")).unwrap();
    let no_token: String = good
        .lines()
        .filter(|l| !l.trim_start().starts_with("token:"))
        .fold(String::new(), |acc, l| acc + l + "\n");
    invalid(validate_config(no_token.as_bytes(), &f, &[]));
    // An install disk the machine does not have.
    let other_disk = good.replace("disk: /dev/sda", "disk: /dev/nvme9n1");
    assert!(invalid(validate_config(other_disk.as_bytes(), &f, &[])).contains("no disks"));
    assert!(validate_config(good.as_bytes(), &f, &[]).is_ok());
}

/// What only the strict decoder catches (the generator's parser ignores unknown keys).
#[test]
fn configs_are_decoded_strictly_like_talos() {
    let f = facts();
    let good = String::from_utf8(config(0, MachineType::ControlPlane, "cp", "127.63.0.3")).unwrap();
    let misspelled = good.replace(
        "allowSchedulingOnControlPlanes: true",
        "allowSchedulingOnControlPlane: true",
    );
    assert!(kontinuum_talos_config::parse_machine_config(misspelled.as_bytes()).is_ok());
    let message = invalid(validate_config(misspelled.as_bytes(), &f, &[]));
    assert!(
        message.starts_with("failed to parse config: error decoding document /v1alpha1/"),
        "{message}"
    );
    assert!(
        message
            .contains(".cluster.allowSchedulingOnControlPlane: unknown keys found during decoding"),
        "{message}"
    );
    let wrong_type = good.replace("persist: true", "persist: \"true\"");
    assert!(
        invalid(validate_config(wrong_type.as_bytes(), &f, &[]))
            .contains("cannot unmarshal !!str into bool")
    );
    let bad_cni = good.replace("name: none", "name: cilium");
    let message = invalid(validate_config(bad_cni.as_bytes(), &f, &[]));
    assert!(
        message.starts_with("configuration validation failed: 1 error occurred:"),
        "{message}"
    );
    // The emulator runs Talos v1.13: Kubernetes 1.37 is too new for it.
    let too_new = good.replace(":v1.36.2", ":v1.37.0");
    assert!(
        invalid(validate_config(too_new.as_bytes(), &f, &[]))
            .contains("too new to be used with Talos v1.13")
    );
    assert_eq!(
        kontinuum_talos_validate::Contract::from_version(crate::TALOS_TAG),
        Ok(CONTRACT)
    );
}

#[test]
fn workers_must_belong_to_the_cluster_they_point_at() {
    let f = facts();
    let cp = validate_config(
        &config(0, MachineType::ControlPlane, "cp", "127.63.0.1"),
        &f,
        &[],
    )
    .unwrap();
    let known = [KnownControlPlane {
        address: Ipv4Addr::new(127, 63, 0, 1),
        cluster_id: cp.cluster_id.clone(),
        kubernetes_ca_pem: cp.kubernetes_ca.cert_pem.clone(),
        os_ca_pem: cp.os_ca.cert_pem.clone(),
    }];
    let same = config(0, MachineType::Worker, "w1", "127.63.0.1");
    let parsed = validate_config(&same, &f, &known).unwrap();
    assert_eq!(parsed.machine_type, MachineType::Worker);
    let other = config(1, MachineType::Worker, "w1", "127.63.0.1");
    assert!(invalid(validate_config(&other, &f, &known)).contains("cluster"));
    // Pointing elsewhere, with an unknown cluster id: nothing to compare with.
    let elsewhere = config(1, MachineType::Worker, "w1", "127.63.0.9");
    assert!(validate_config(&elsewhere, &f, &known).is_ok());
}

#[test]
fn lifecycle_of_a_control_plane() {
    let f = facts();
    let parsed = validate_config(
        &config(0, MachineType::ControlPlane, "cp-1", "127.63.0.3"),
        &f,
        &[],
    )
    .unwrap();
    let mut core = Core::new();
    assert_eq!(core.mode, Mode::Maintenance);
    assert_eq!(
        core.bootstrap(),
        Err(Refusal::FailedPrecondition(
            "bootstrap is not available yet".into()
        ))
    );
    core.apply(parsed.clone()).unwrap();
    assert_eq!((core.mode, core.generation), (Mode::Configured, 1));
    assert_eq!(core.hostname(&f), "cp-1");
    assert!(matches!(
        core.apply(parsed.clone()),
        Err(Refusal::Unimplemented(_))
    ));
    core.bootstrap().unwrap();
    assert!(matches!(core.bootstrap(), Err(Refusal::AlreadyExists(_))));

    let plan = plan_reset(&["STATE".into(), "EPHEMERAL".into()], &[], 0).unwrap();
    let effects = core.reset(&plan, &f).unwrap();
    assert_eq!(
        effects,
        Effects {
            stop_control_plane: true,
            leave_cluster: effects.leave_cluster.clone(),
            wipe_config: true,
            forget_identity: false,
        }
    );
    assert!(
        effects.leave_cluster.is_some(),
        "a control plane that joined another's etcd leaves that cluster"
    );
    assert_eq!((core.mode, core.generation), (Mode::Maintenance, 2));
    assert!(core.config.is_none() && !core.bootstrapped);
    assert!(matches!(
        core.reset(&plan, &f),
        Err(Refusal::FailedPrecondition(_))
    ));

    // Second cycle, then a full wipe forgets the identity.
    core.apply(parsed).unwrap();
    core.bootstrap().unwrap();
    let full = plan_reset(&[], &[], 0).unwrap();
    assert!(core.reset(&full, &f).unwrap().forget_identity);
}

#[test]
fn worker_reset_leaves_and_reboot_keeps_config() {
    let f = facts();
    let parsed = validate_config(
        &config(0, MachineType::Worker, "w-1", "127.63.0.1"),
        &f,
        &[],
    )
    .unwrap();
    let id = parsed.cluster_id.clone();
    let mut core = Core::new();
    core.apply(parsed).unwrap();
    assert!(matches!(core.bootstrap(), Err(Refusal::Unimplemented(_))));
    let effects = core.reboot_to_maintenance();
    assert!(!effects.stop_control_plane && !effects.wipe_config);
    assert_eq!(core.mode, Mode::Maintenance);
    assert!(core.config.is_some(), "config stays on disk");
    assert!(core.active_config().is_none());

    let mut core = Core::restored(core.config.clone(), true);
    assert_eq!(core.mode, Mode::Configured);
    let plan = plan_reset(&["STATE".into(), "EPHEMERAL".into()], &[], 0).unwrap();
    let effects = core.reset(&plan, &f).unwrap();
    assert_eq!(effects.leave_cluster, Some((id, "w-1".to_owned())));
}

#[test]
fn reset_requests_are_validated() {
    assert!(plan_reset(&["STATE".into()], &["/dev/sdb".into()], 1).is_err());
    assert!(plan_reset(&["STATE".into()], &[], 2).is_err());
    assert!(matches!(
        plan_reset(&["NOPE".into()], &[], 0),
        Err(Refusal::InvalidArgument(_))
    ));
    assert!(plan_reset(&["EPHEMERAL".into()], &[], 0).is_err());
    assert!(
        !plan_reset(&["STATE".into(), "EPHEMERAL".into()], &[], 0)
            .unwrap()
            .full_wipe
    );
}

#[test]
fn endpoint_hosts() {
    assert_eq!(endpoint_host("https://10.0.0.1:6443"), Some("10.0.0.1"));
    assert_eq!(endpoint_host("https://[fd00::1]:6443"), Some("fd00::1"));
    assert_eq!(endpoint_host("https://api.example"), Some("api.example"));
    assert_eq!(endpoint_host("http://x"), None);
}

#[test]
fn upgrade_images_are_parsed_like_references() {
    for (image, version) in [
        ("ghcr.io/siderolabs/installer:v1.13.9", "v1.13.9"),
        (
            "registry.local:5000/installer:v1.14.0-beta.1",
            "v1.14.0-beta.1",
        ),
        (
            "factory.talos.dev/metal-installer/376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba:v1.12.0",
            "v1.12.0",
        ),
        (
            "ghcr.io/siderolabs/installer:v1.13.9@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
            "v1.13.9",
        ),
    ] {
        assert_eq!(upgrade_version(image), Ok(version.to_owned()), "{image}");
    }
    for bad in [
        "",
        "ghcr.io/siderolabs/Installer:v1.13.9",
        "ghcr.io//installer:v1.13.9",
        "ghcr.io/siderolabs/installer:v1.13.9:x",
        "ghcr.io/siderolabs/installer:-v1",
        "ghcr.io/siderolabs/installer:v1.13.9@sha256:xyz",
        "ghcr.io:port/installer:v1.13.9",
        "not an image",
    ] {
        assert!(
            matches!(upgrade_version(bad), Err(Refusal::InvalidArgument(_))),
            "{bad:?}: {:?}",
            upgrade_version(bad)
        );
    }
    for unversioned in [
        "ghcr.io/siderolabs/installer",
        "ghcr.io/siderolabs/installer:latest",
        "ghcr.io/siderolabs/installer:v1.13",
        "ghcr.io/siderolabs/installer:v1.13.9-",
    ] {
        assert!(
            matches!(upgrade_version(unversioned), Err(Refusal::Unimplemented(_))),
            "{unversioned:?}"
        );
    }
}

#[test]
fn upgrade_installs_the_version_and_a_full_wipe_forgets_it() {
    let mut core = Core::new();
    assert!(matches!(
        core.upgrade("v1.13.9".to_owned()),
        Err(Refusal::FailedPrecondition(_))
    ));
    let parsed = || {
        validate_config(
            &config(0, MachineType::ControlPlane, "cp", "127.63.0.3"),
            &facts(),
            &[],
        )
        .unwrap()
    };
    core.apply(parsed()).unwrap();
    core.bootstrap().unwrap();
    let generation = core.generation;
    core.upgrade("v1.13.9".to_owned()).unwrap();
    assert_eq!(core.installed.as_deref(), Some("v1.13.9"));
    assert_eq!(core.mode, Mode::Configured);
    assert!(core.bootstrapped, "etcd data survives an upgrade");
    assert_eq!(
        core.generation,
        generation + 1,
        "connections made before are stale"
    );
    core.reset(&ResetPlan { full_wipe: false }, &facts())
        .unwrap();
    assert_eq!(core.installed.as_deref(), Some("v1.13.9"), "BOOT is kept");
    core.apply(parsed()).unwrap();
    core.reset(&ResetPlan { full_wipe: true }, &facts())
        .unwrap();
    assert_eq!(core.installed, None);
}

#[test]
fn a_running_machine_reboots_only_for_what_does_not_apply_live() {
    let base = String::from_utf8(config(0, MachineType::Worker, "w-1", "127.63.0.1")).unwrap();
    let with = |from: &str, to: &str| {
        assert!(base.contains(from), "{from}");
        base.replacen(from, to, 1)
    };
    // Live: the cluster section, kubelet, registries, sysctls (a new key), install.
    let live = [
        with("clusterName: ", "clusterName: x"),
        with(
            "kubelet:\n",
            "sysctls:\n    net.core.somaxconn: '1'\n  kubelet:\n",
        ),
        with("wipe: false", "wipe: true"),
    ];
    for new in &live {
        assert!(!needs_reboot(&base, new), "{new}");
    }
    // Not live: the machine's environment, a missing v1alpha1 document.
    let env = with(
        "kubelet:\n",
        "env:\n    HTTP_PROXY: http://proxy.example\n  kubelet:\n",
    );
    assert!(needs_reboot(&base, &env));
    assert!(needs_reboot(
        &base,
        "apiVersion: v1alpha1\nkind: HostnameConfig\nhostname: w\n"
    ));
    assert!(!needs_reboot(&base, &base));
}
