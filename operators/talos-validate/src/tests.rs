//! Unit tests over a hand-written config: each test breaks one thing and checks the problem
//! names the document, the path and what is wrong, as Talos would.

use crate::*;

/// A complete control-plane config in the shape Talos v1.13 generates (base64 values are
/// placeholders: the validator checks the encoding, not the PEM inside).
const CONTROL_PLANE: &str = "\
version: v1alpha1
debug: false
persist: true
machine:
  type: controlplane
  token: abcdef.0123456789abcdef
  ca:
    crt: Q1JU
    key: S0VZ
  certSANs: []
  kubelet:
    image: ghcr.io/siderolabs/kubelet:v1.36.2
    defaultRuntimeSeccompProfileEnabled: true
    disableManifestsDirectory: true
  install:
    diskSelector: {}
    image: ghcr.io/siderolabs/installer:v1.13.8
    wipe: false
    grubUseUKICmdline: true
  features:
    diskQuotaSupport: true
    kubePrism:
      enabled: true
      port: 7445
    hostDNS:
      enabled: true
      forwardKubeDNSToHost: true
  nodeLabels:
    node.kubernetes.io/exclude-from-external-load-balancers: \"\"
cluster:
  id: aWQ=
  secret: c2VjcmV0
  controlPlane:
    endpoint: https://10.0.0.10:6443
  clusterName: demo
  network:
    cni:
      name: none
    dnsDomain: cluster.local
    podSubnets:
    - 10.244.0.0/16
    serviceSubnets:
    - 10.96.0.0/12
  token: abcdef.0123456789abcdef
  secretboxEncryptionSecret: c2VjcmV0Ym94
  ca:
    crt: Q1JU
    key: S0VZ
  aggregatorCA:
    crt: Q1JU
    key: S0VZ
  serviceAccount:
    key: S0VZ
  apiServer:
    image: registry.k8s.io/kube-apiserver:v1.36.2
    certSANs: []
  controllerManager:
    image: registry.k8s.io/kube-controller-manager:v1.36.2
  proxy:
    disabled: true
  scheduler:
    image: registry.k8s.io/kube-scheduler:v1.36.2
  discovery:
    enabled: true
    registries:
      kubernetes:
        disabled: true
      service: {}
  etcd:
    ca:
      crt: Q1JU
      key: S0VZ
  allowSchedulingOnControlPlanes: true
---
apiVersion: v1alpha1
kind: HostnameConfig
hostname: node-1
";

const WORKER: &str = "\
version: v1alpha1
debug: false
persist: true
machine:
  type: worker
  token: abcdef.0123456789abcdef
  ca:
    crt: Q1JU
    key: \"\"
  kubelet:
    image: ghcr.io/siderolabs/kubelet:v1.32.0
  install:
    disk: /dev/sda
cluster:
  id: aWQ=
  secret: c2VjcmV0
  controlPlane:
    endpoint: https://cp.example:6443
  clusterName: demo
  network:
    cni:
      name: none
    dnsDomain: cluster.local
    podSubnets: [10.244.0.0/16]
    serviceSubnets: [10.96.0.0/12]
  token: abcdef.0123456789abcdef
  ca:
    crt: Q1JU
    key: \"\"
";

fn ok(config: &str) -> Validated {
    match validate(config.as_bytes(), Contract::V1_13) {
        Ok(v) => v,
        Err(problems) => panic!("refused:\n{}", describe(&problems)),
    }
}

fn refused(config: &str) -> Vec<Problem> {
    refused_as(config, Contract::V1_13)
}

fn refused_as(config: &str, contract: Contract) -> Vec<Problem> {
    validate(config.as_bytes(), contract).expect_err("config was accepted")
}

/// Replaces exactly one occurrence.
fn edit(config: &str, from: &str, to: &str) -> String {
    assert_eq!(config.matches(from).count(), 1, "{from:?} must occur once");
    config.replacen(from, to, 1)
}

/// The single problem of a refused config.
fn only(problems: &[Problem]) -> &Problem {
    assert_eq!(problems.len(), 1, "{problems:#?}");
    &problems[0]
}

#[test]
fn fixtures_are_valid() {
    let v = ok(CONTROL_PLANE);
    assert_eq!(v.machine_type, MachineType::ControlPlane);
    assert_eq!(v.documents.len(), 2);
    assert_eq!(v.documents[1].kind, "HostnameConfig");
    assert!(v.warnings.is_empty());
    assert_eq!(ok(WORKER).machine_type, MachineType::Worker);
}

#[test]
fn misspelled_key_is_refused_like_talos() {
    let config = edit(
        CONTROL_PLANE,
        "allowSchedulingOnControlPlanes: true",
        "allowSchedulingOnControlPlane: true",
    );
    let problems = refused(&config);
    let p = only(&problems);
    assert_eq!(p.kind, ProblemKind::UnknownKey);
    assert_eq!(p.path, ".cluster.allowSchedulingOnControlPlane");
    assert_eq!(p.document.label(), "v1alpha1");
    assert_eq!(p.line, Some(73));
    let message = describe(&problems);
    assert!(
        message
            .starts_with("failed to parse config: error decoding document /v1alpha1/ (line 1): "),
        "{message}"
    );
    assert!(
        message.contains("unknown keys found during decoding"),
        "{message}"
    );
    assert!(
        message.contains(".cluster.allowSchedulingOnControlPlane"),
        "{message}"
    );
}

#[test]
fn unknown_keys_are_found_at_every_depth_and_in_typed_documents() {
    for (from, to, path) in [
        (
            "    image: ghcr.io/siderolabs/kubelet",
            "    imag: ghcr.io/siderolabs/kubelet",
            ".machine.kubelet.imag",
        ),
        (
            "      port: 7445",
            "      prot: 7445",
            ".machine.features.kubePrism.prot",
        ),
        ("debug: false", "debugg: false", ".debugg"),
        (
            "      service: {}",
            "      service: {endpiont: https://x}",
            ".cluster.discovery.registries.service.endpiont",
        ),
        ("hostname: node-1", "hostName: node-1", ".hostName"),
        (
            "  certSANs: []\n  kubelet:",
            "  certSANs: []\n  kubelets: {}\n  kubelet:",
            ".machine.kubelets",
        ),
    ] {
        let problems = refused(&edit(CONTROL_PLANE, from, to));
        let p = only(&problems);
        assert_eq!(
            (p.kind, p.path.as_str()),
            (ProblemKind::UnknownKey, path),
            "{p}"
        );
    }
    // Keys inside maps and embedded Kubernetes objects are free.
    ok(&edit(
        CONTROL_PLANE,
        "    certSANs: []\n  controllerManager",
        "    certSANs: []\n    extraArgs: {anything: goes}\n    auditPolicy: {apiVersion: audit.k8s.io/v1, kind: Policy, rules: [{level: None}]}\n  controllerManager",
    ));
}

#[test]
fn wrong_types_are_refused_without_echoing_values() {
    for (from, to, path, needle) in [
        (
            "persist: true",
            "persist: maybe",
            ".persist",
            "cannot unmarshal !!str into bool",
        ),
        (
            "      port: 7445",
            "      port: \"7445\"",
            ".machine.features.kubePrism.port",
            "cannot unmarshal !!str into int",
        ),
        (
            "  certSANs: []\n  kubelet",
            "  certSANs: foo\n  kubelet",
            ".machine.certSANs",
            "cannot unmarshal !!str into []string",
        ),
        (
            "    crt: Q1JU\n    key: S0VZ\n  certSANs",
            "    crt: not base64!\n    key: S0VZ\n  certSANs",
            ".machine.ca.crt",
            "illegal base64 data",
        ),
        (
            "    wipe: false",
            "    wipe: [false]",
            ".machine.install.wipe",
            "cannot unmarshal !!seq into bool",
        ),
        (
            "  clusterName: demo",
            "  clusterName: {name: demo}",
            ".cluster.clusterName",
            "cannot unmarshal !!map into string",
        ),
        (
            "    diskSelector: {}",
            "    diskSelector: {size: huge}",
            ".machine.install.diskSelector.size",
            "failed to parse disk size",
        ),
        (
            "  allowSchedulingOnControlPlanes: true",
            "  allowSchedulingOnControlPlanes: true\n  adminKubeconfig: {certLifetime: 5}",
            ".cluster.adminKubeconfig.certLifetime",
            "cannot unmarshal !!int into time.Duration",
        ),
        (
            "      port: 7445",
            "      port: 99999999999999999999",
            ".machine.features.kubePrism.port",
            "cannot unmarshal !!float into int",
        ),
    ] {
        let config = edit(CONTROL_PLANE, from, to);
        let problems = validate(config.as_bytes(), Contract::V1_13).unwrap_err();
        let p = problems
            .iter()
            .find(|p| p.path == path)
            .unwrap_or_else(|| panic!("no problem at {path}: {problems:#?}"));
        assert_eq!(p.kind, ProblemKind::WrongType, "{p}");
        assert!(p.message.contains(needle), "{p}");
        assert!(
            !p.message.contains("maybe") && !p.message.contains("not base64"),
            "{p}"
        );
    }
    // yaml.v3 takes YAML 1.1 booleans for a typed bool, octal file modes, and
    // integral floats.
    ok(&edit(CONTROL_PLANE, "persist: true", "persist: yes"));
}

#[test]
fn secrets_are_never_echoed() {
    let secret = "c2VjcmV0Ym94";
    let config = edit(
        CONTROL_PLANE,
        "  secretboxEncryptionSecret: c2VjcmV0Ym94",
        "  secretboxEncryptionSecrett: c2VjcmV0Ym94",
    );
    let problems = refused(&config);
    let message = describe(&problems);
    assert!(message.contains("secretboxEncryptionSecrett"), "{message}");
    assert!(!message.contains(secret), "{message}");
    let config = edit(
        CONTROL_PLANE,
        "  token: abcdef.0123456789abcdef\n  secretbox",
        "  token: [abcdef.0123456789abcdef]\n  secretbox",
    );
    let message = describe(&refused(&config));
    assert!(!message.contains("0123456789abcdef"), "{message}");
}

#[test]
fn syntax_errors_and_odd_documents() {
    let problems = refused("this: is: not a machine config");
    assert_eq!(only(&problems).kind, ProblemKind::Syntax);
    assert!(describe(&problems).starts_with("failed to parse config: "));
    assert_eq!(only(&refused("- a\n- b\n")).kind, ProblemKind::Syntax);
    let problems = refused("foo: bar\n");
    assert_eq!(only(&problems).message, "missing kind");
    let problems = refused(&format!(
        "{CONTROL_PLANE}---\nkind: HostnameConfig\nhostname: x\n"
    ));
    assert!(
        problems.iter().any(|p| p.message == "missing apiVersion"),
        "{problems:#?}"
    );
    let problems = refused(&edit(
        CONTROL_PLANE,
        "persist: true",
        "persist: true\npersist: false",
    ));
    assert!(
        only(&problems)
            .message
            .contains("already defined at line 3")
    );
    assert_eq!(only(&refused("")).kind, ProblemKind::Missing);
    let big = "a".repeat(MAX_CONFIG_BYTES + 1);
    assert!(only(&refused(&big)).message.contains("more than"));
    assert_eq!(
        only(&validate(b"\xff\xfe", Contract::V1_13).unwrap_err()).message,
        "config is not UTF-8"
    );
}

#[test]
fn documents_required_unknown_and_duplicated() {
    let problems = refused("apiVersion: v1alpha1\nkind: HostnameConfig\nhostname: a\n");
    let p = only(&problems);
    assert_eq!(p.kind, ProblemKind::Missing);
    assert!(p.message.contains("v1alpha1 document is required"));

    let problems = refused(&format!("{CONTROL_PLANE}---\n{CONTROL_PLANE}"));
    assert!(problems.iter().any(|p| {
        p.kind == ProblemKind::DuplicateDocument
            && p.message
                .starts_with("duplicate document /v1alpha1/ is not allowed")
    }));

    let problems = refused(&format!(
        "{CONTROL_PLANE}---\napiVersion: v1alpha1\nkind: FooConfig\n"
    ));
    let p = only(&problems);
    assert_eq!(p.kind, ProblemKind::UnknownDocument);
    assert_eq!(p.message, "\"FooConfig\" \"v1alpha1\": not registered");

    let problems = refused(&format!(
        "{CONTROL_PLANE}---\napiVersion: v1alpha2\nkind: HostnameConfig\nhostname: a\n"
    ));
    assert!(only(&problems).message.contains("not registered"));

    let problems = refused(&format!(
        "{CONTROL_PLANE}---\napiVersion: v1alpha1\nkind: UserVolumeConfig\nname: data\n"
    ));
    assert!(only(&problems).message.contains("does not model"));

    let mirror = "---\napiVersion: v1alpha1\nkind: RegistryMirrorConfig\nname: ghcr.io\nendpoints:\n- url: https://mirror.example\n";
    let mirrors = format!("{CONTROL_PLANE}{mirror}");
    assert_eq!(ok(&mirrors).documents.len(), 3);
    let problems = refused_as(&mirrors.replace("v1.36.2", "v1.35.0"), Contract::V1_12);
    assert!(
        only(&problems).message.contains("exists since Talos v1.13"),
        "{problems:#?}"
    );
    // Two mirrors with different names are fine, the same name twice is not.
    ok(&format!(
        "{mirrors}{}",
        mirror.replace("ghcr.io", "docker.io")
    ));
    let problems = refused(&format!("{mirrors}{mirror}"));
    assert_eq!(only(&problems).kind, ProblemKind::DuplicateDocument);
}

#[test]
fn machine_type_and_keys_per_role() {
    // As in Talos, an unknown type is not a control plane: its etcd section is refused too.
    let problems = refused(&edit(CONTROL_PLANE, "type: controlplane", "type: master"));
    let p = &problems[0];
    assert_eq!(
        (p.path.as_str(), p.message.as_str()),
        (".machine.type", "unknown machine type \"master\"")
    );
    assert_eq!(p.line, Some(5));
    assert_eq!(problems[1].path, ".cluster.etcd");

    let joined = ok(&edit(WORKER, "type: worker", "type: join"));
    assert_eq!(joined.machine_type, MachineType::Worker);
    assert_eq!(
        joined.warnings,
        vec![r#"use "worker" instead of "join" for machine type"#]
    );

    let problems = refused(&edit(
        CONTROL_PLANE,
        "  ca:\n    crt: Q1JU\n    key: S0VZ\n  aggregatorCA",
        "  ca:\n    crt: Q1JU\n  aggregatorCA",
    ));
    let p = only(&problems);
    assert_eq!(p.path, ".cluster.ca.key");
    assert_eq!(p.kind, ProblemKind::Missing);

    let problems = refused(&edit(
        CONTROL_PLANE,
        "    crt: Q1JU\n    key: S0VZ\n  certSANs",
        "    crt: Q1JU\n  certSANs",
    ));
    assert_eq!(
        only(&problems).message,
        "issuing CA key is required for controlplane nodes (.machine.ca.key)"
    );

    let problems = refused(&edit(
        WORKER,
        "    crt: Q1JU\n    key: \"\"\n  kubelet",
        "    crt: Q1JU\n    key: S0VZ\n  kubelet",
    ));
    assert_eq!(only(&problems).path, ".machine.ca.key");

    // The cluster CA is the last thing in the worker fixture.
    let keyed = format!("{}key: S0VZ\n", WORKER.strip_suffix("key: \"\"\n").unwrap());
    let problems = refused(&keyed);
    assert_eq!(
        only(&problems).message,
        "issuing Kubernetes API CA key is not allowed on non-controlplane nodes (.cluster.ca)"
    );

    let problems = refused(&format!(
        "{WORKER}  etcd:\n    ca: {{crt: Q1JU, key: S0VZ}}\n"
    ));
    assert_eq!(
        only(&problems).message,
        "etcd config is only allowed on control plane machines"
    );

    let problems = refused(&edit(
        CONTROL_PLANE,
        "  etcd:\n    ca:\n      crt: Q1JU\n      key: S0VZ\n",
        "",
    ));
    assert_eq!(only(&problems).path, ".cluster.etcd");
    let problems = refused(&edit(
        CONTROL_PLANE,
        "  secretboxEncryptionSecret: c2VjcmV0Ym94\n",
        "",
    ));
    assert_eq!(
        only(&problems).message,
        "etcd encryption config is required for control plane machines"
    );
}

#[test]
fn cluster_network_endpoint_and_cni() {
    for (from, to, path, message) in [
        (
            "name: none",
            "name: cilium",
            ".cluster.network.cni.name",
            r#"cni name should be one of ["flannel", "custom", "none"]"#,
        ),
        (
            "      name: none",
            "      name: none\n      urls: [https://x/cni.yaml]",
            ".cluster.network.cni.urls",
            "\"urls\" field should be empty for \"none\" CNI",
        ),
        (
            "      name: none",
            "      name: custom\n      urls: [\"https://x:0/cni.yaml\"]",
            ".cluster.network.cni.urls[0]",
            "port number must be between 1 and 65535",
        ),
        (
            "endpoint: https://10.0.0.10:6443",
            "endpoint: 10.0.0.10:6443",
            ".cluster.controlPlane.endpoint",
            "invalid controlplane endpoint: first path segment in URL cannot contain colon",
        ),
        (
            "endpoint: https://10.0.0.10:6443",
            "endpoint: https://:6443",
            ".cluster.controlPlane.endpoint",
            "invalid controlplane endpoint: hostname must not be blank",
        ),
        (
            "    - 10.244.0.0/16",
            "    - 10.244.0.0/33",
            ".cluster.network.podSubnets[0]",
            "invalid CIDR address: 10.244.0.0/33 (fails at runtime in Talos)",
        ),
        (
            "    - 10.96.0.0/12",
            "    - 10.96.0.0",
            ".cluster.network.serviceSubnets[0]",
            "invalid CIDR address: 10.96.0.0 (fails at runtime in Talos)",
        ),
        (
            "dnsDomain: cluster.local",
            "dnsDomain: cluster..local",
            ".cluster.network.dnsDomain",
            "\"cluster..local\" is not a valid DNS name",
        ),
        (
            "      service: {}",
            "      service: {endpoint: \"https://discovery.example/v1\"}",
            ".cluster.discovery.registries.service.endpoint",
            "cluster discovery service path should be empty",
        ),
        (
            "  id: aWQ=\n",
            "",
            ".cluster.id",
            "cluster discovery service requires .cluster.id",
        ),
        (
            "  controlPlane:\n    endpoint: https://10.0.0.10:6443\n",
            "",
            ".cluster.controlPlane.endpoint",
            "cluster controlplane endpoint is required",
        ),
    ] {
        let problems = refused(&edit(CONTROL_PLANE, from, to));
        let p = only(&problems);
        assert_eq!((p.path.as_str(), p.message.as_str()), (path, message));
    }
    // CNI rules apply to control planes only (as in Talos).
    ok(&edit(WORKER, "name: none", "name: cilium"));
    ok(&edit(
        CONTROL_PLANE,
        "endpoint: https://10.0.0.10:6443",
        "endpoint: https://[fd00::1]:6443",
    ));
    ok(&edit(
        CONTROL_PLANE,
        "      name: none",
        "      name: custom\n      urls: [https://x/cni.yaml]",
    ));
}

#[test]
fn install_rules() {
    let problems = refused(&edit(WORKER, "  install:\n    disk: /dev/sda\n", ""));
    assert_eq!(
        only(&problems).message,
        r#"install instructions are required in "metal" mode"#
    );
    let problems = refused(&edit(WORKER, "    disk: /dev/sda", "    image: installer"));
    assert_eq!(
        only(&problems).message,
        "either install disk or diskSelector should be defined"
    );
    let problems = refused(&edit(
        CONTROL_PLANE,
        "    diskSelector: {}",
        "    diskSelector: {type: floppy}",
    ));
    assert_eq!(only(&problems).path, ".machine.install.diskSelector.type");
    let problems = refused(&edit(
        CONTROL_PLANE,
        "    wipe: false",
        "    wipe: false\n    extraKernelArgs: [console=ttyS0]",
    ));
    assert_eq!(
        only(&problems).message,
        "install.extraKernelArgs and install.grubUseUKICmdline can't be used together"
    );
    ok(&edit(
        CONTROL_PLANE,
        "    diskSelector: {}",
        "    diskSelector: {size: '>= 100GB', type: ssd, model: 'QEMU*'}",
    ));
}

#[test]
fn other_v1alpha1_rules() {
    for (from, to, path) in [
        ("persist: true", "persist: false", ".persist"),
        ("version: v1alpha1", "version: v1alpha2", ".version"),
        (
            "      enabled: true\n      forwardKubeDNSToHost",
            "      enabled: false\n      forwardKubeDNSToHost",
            ".machine.features.hostDNS.forwardKubeDNSToHost",
        ),
        (
            "    node.kubernetes.io/exclude-from-external-load-balancers: \"\"",
            "    Bad_Prefix/x: \"\"",
            ".machine.nodeLabels.Bad_Prefix/x",
        ),
        (
            "  nodeLabels:",
            "  nodeTaints: {dedicated: 'gpu:Sometimes'}\n  nodeLabels:",
            ".machine.nodeTaints.dedicated",
        ),
        (
            "  nodeLabels:",
            "  network:\n    interfaces:\n    - interface: eth0\n      addresses: [10.0.0.1/40]\n  nodeLabels:",
            ".machine.network.interfaces[0].addresses[0]",
        ),
        (
            "  nodeLabels:",
            "  kubelet2: {}\n  nodeLabels:",
            ".machine.kubelet2",
        ),
        (
            "    image: registry.k8s.io/kube-scheduler:v1.36.2",
            "    image: registry.k8s.io/kube-scheduler:v1.37.0",
            ".cluster.scheduler.image",
        ),
        (
            "    image: ghcr.io/siderolabs/kubelet:v1.36.2",
            "    image: ghcr.io/siderolabs/kubelet:latest",
            ".machine.kubelet.image",
        ),
        (
            "  nodeLabels:",
            "  registries:\n    mirrors:\n      docker.io:\n  nodeLabels:",
            ".machine.registries.mirrors.docker.io",
        ),
        (
            "  allowSchedulingOnControlPlanes: true",
            "  allowSchedulingOnControlPlanes: true\n  inlineManifests: [{name: a, contents: x}, {name: a, contents: y}]",
            ".cluster.inlineManifests[1].name",
        ),
    ] {
        let problems = refused(&edit(CONTROL_PLANE, from, to));
        assert!(
            problems.iter().any(|p| p.path == path),
            "{from:?} -> no problem at {path}: {problems:#?}"
        );
    }
    let problems = refused_as(CONTROL_PLANE, Contract::V1_12);
    assert_eq!(problems.len(), 4, "{problems:#?}");
    assert!(
        problems[0]
            .message
            .contains("1.36.2 is too new to be used with Talos v1.12")
    );
}

#[test]
fn typed_document_rules() {
    for (doc, path, message) in [
        (
            "kind: HostnameConfig\nauto: stable\nhostname: a",
            ".auto",
            "'auto' and 'hostname' cannot be set at the same time",
        ),
        (
            "kind: HostnameConfig\nauto: talos-addr",
            ".auto",
            "invalid value for 'auto': talos-addr",
        ),
        (
            "kind: HostnameConfig",
            "",
            "either 'auto' or 'hostname' must be set",
        ),
        (
            "kind: ResolverConfig\nnameservers: [{address: 1.1.1}]",
            ".nameservers[0].address",
            "nameserver address must be a valid IP: entry 0",
        ),
        (
            "kind: TimeSyncConfig\nntp: {servers: [pool.ntp.org]}\nptp: {devices: [/dev/ptp0]}",
            "",
            "only one of ntp or ptp configuration can be specified",
        ),
        (
            "kind: StaticHostConfig\nname: host\nhostnames: [a]",
            ".name",
            "name must be a valid IP address",
        ),
        (
            "kind: StaticHostConfig\nname: 10.0.0.1",
            ".hostnames",
            "at least one hostname is required",
        ),
        (
            "kind: Layer2VIPConfig\nname: 10.0.0.5",
            ".link",
            "link must be specified",
        ),
        (
            "kind: RegistryMirrorConfig\nname: docker.io\nendpoints: [{url: 'ftp://m'}]",
            ".endpoints[0].url",
            "endpoints[0].url has unsupported scheme: \"ftp\"",
        ),
        (
            "kind: KmsgLogConfig\nname: remote\nurl: tcp://10.0.0.1",
            ".url",
            "url port is required",
        ),
        (
            "kind: EventSinkConfig\nendpoint: host",
            ".endpoint",
            "endpoint must be host:port",
        ),
        (
            "kind: ExtensionServiceConfig\nname: nut\nconfigFiles: [{content: x}]",
            ".configFiles[0].mountPath",
            "extension mount path is required for extension \"nut\"",
        ),
        (
            "kind: TrustedRootsConfig\ncertificates: x",
            ".name",
            "name must be specified",
        ),
    ] {
        let config = edit(
            CONTROL_PLANE,
            "---\napiVersion: v1alpha1\nkind: HostnameConfig\nhostname: node-1\n",
            &format!("---\napiVersion: v1alpha1\n{doc}\n"),
        );
        let problems = refused(&config);
        let p = only(&problems);
        assert_eq!(
            (p.path.as_str(), p.message.as_str()),
            (path, message),
            "{doc}"
        );
    }
}

#[test]
fn typed_documents_accepted_and_conflicts() {
    ok(&edit(
        CONTROL_PLANE,
        "hostname: node-1",
        "auto: \"off\"\nhostname: node-1",
    ));
    ok(&edit(CONTROL_PLANE, "hostname: node-1", "auto: stable"));
    ok(&format!(
        "{CONTROL_PLANE}---\napiVersion: v1alpha1\nkind: ResolverConfig\nnameservers: [{{address: 10.0.0.1}}]\nsearchDomains: {{domains: [example.org], disableDefault: true}}\n\
         ---\napiVersion: v1alpha1\nkind: TimeSyncConfig\nbootTimeout: 2m\nntp: {{servers: [pool.ntp.org]}}\n\
         ---\napiVersion: v1alpha1\nkind: StaticHostConfig\nname: 10.0.0.2\nhostnames: [registry.local]\n\
         ---\napiVersion: v1alpha1\nkind: KmsgLogConfig\nname: remote\nurl: udp://10.0.0.1:514\n\
         ---\napiVersion: v1alpha1\nkind: ExtensionServiceConfig\nname: nut\nenvironment: [A=b]\n"
    ));
    // Conflicts with the v1alpha1 document.
    let problems = refused(&edit(
        CONTROL_PLANE,
        "  nodeLabels:",
        "  network: {hostname: other}\n  nodeLabels:",
    ));
    let p = only(&problems);
    assert_eq!(
        (p.kind, p.message.as_str()),
        (
            ProblemKind::Conflict,
            "static hostname is already set in v1alpha1 config"
        )
    );
    assert_eq!(p.document.label(), "HostnameConfig");
}

#[test]
fn describe_joins_validation_problems_like_go_multierror() {
    let config = edit(
        &edit(CONTROL_PLANE, "persist: true", "persist: false"),
        "name: none",
        "name: cilium",
    );
    let problems = refused(&config);
    assert_eq!(problems.len(), 2);
    let message = describe(&problems);
    assert!(
        message.starts_with(
            "configuration validation failed: 2 errors occurred:\n\t* v1alpha1: .cluster.network.cni.name: "
        ),
        "{message}"
    );
    assert!(
        message.contains("\n\t* v1alpha1: .persist: .persist should be enabled (line 3)"),
        "{message}"
    );
    assert!(message.ends_with("\n\n"));
    assert_eq!(problems[0].kind.reason(), "InvalidField");
}

#[test]
fn contracts() {
    assert_eq!(Contract::from_version("v1.13.8"), Ok(Contract::V1_13));
    assert_eq!(Contract::from_version("1.12"), Ok(Contract::V1_12));
    assert_eq!(
        Contract::from_version("v1.12.0-beta.1"),
        Ok(Contract::V1_12)
    );
    assert!(Contract::from_version("v1.14.0").is_err());
    assert!(Contract::from_version("v1.1").is_err());
    assert!(Contract::V1_12 < Contract::V1_13);
}

#[test]
fn allow_lists_figures() {
    let v1alpha1 = allowed_keys("v1alpha1").unwrap();
    let sections = v1alpha1.iter().filter(|p| !p.contains('.')).count();
    let typed: usize = modeled_kinds()
        .iter()
        .map(|k| allowed_keys(k).unwrap().len())
        .sum();
    println!(
        "allow-lists: v1alpha1 {} key paths ({} top-level sections), {} typed kinds with {} key paths",
        v1alpha1.len(),
        sections,
        modeled_kinds().len(),
        typed
    );
    for must in [
        "machine.install.diskSelector.size",
        "machine.network.interfaces[].vlans[].vip.ip",
        "machine.registries.mirrors.*.endpoints",
        "cluster.apiServer.admissionControl[].configuration",
        "cluster.discovery.registries.service.endpoint",
        "cluster.allowSchedulingOnControlPlanes",
    ] {
        assert!(v1alpha1.iter().any(|p| p == must), "{must}");
    }
    assert!(allowed_keys("NoSuchConfig").is_none());
    assert!(v1alpha1.len() > 250, "{}", v1alpha1.len());
}
