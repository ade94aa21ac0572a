use super::*;

const CONFIG: &str = "version: v1alpha1
machine:
  type: controlplane
cluster:
  clusterName: blue
  controlPlane:
    endpoint: https://127.70.0.1:7443
  network:
    podSubnets: [10.32.0.0/16, fd00:10:32::/56]
    serviceSubnets: [10.112.0.0/12]
    cni:
      name: none
  etcd:
    ca:
      crt: LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCg==
      key: LS0tLS1CRUdJTiBFQyBQUklWQVRFIEtFWS0tLS0tCg==
  aggregatorCA:
    crt: LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCg==
    key: LS0tLS1CRUdJTiBFQyBQUklWQVRFIEtFWS0tLS0tCg==
  serviceAccount:
    key: LS0tLS1CRUdJTiBSU0EgUFJJVkFURSBLRVktLS0tLQo=
  allowSchedulingOnControlPlanes: false
---
apiVersion: v1alpha1
kind: HostnameConfig
hostname: cp
";

#[test]
fn reads_what_the_control_plane_needs() {
    let s = read(CONFIG.as_bytes()).unwrap();
    assert_eq!(s.cluster_name.as_deref(), Some("blue"));
    assert_eq!(
        s.etcd_ca.as_ref().map(|c| c.cert_pem.as_str()),
        Some("-----BEGIN CERTIFICATE-----\n")
    );
    assert!(s.aggregator_ca.is_some());
    assert_eq!(
        s.service_account_key.as_ref().map(Sensitive::expose),
        Some("-----BEGIN RSA PRIVATE KEY-----\n")
    );
    assert!(!s.allow_scheduling_on_control_planes);
    assert_eq!(s.api_port(Ipv4Addr::new(127, 70, 0, 1)), 7443);
    assert_eq!(
        s.api_port(Ipv4Addr::new(127, 70, 0, 2)),
        6443,
        "endpoint elsewhere"
    );
    let (pods, services, ignored) = s.networks();
    assert_eq!(pods, Some("10.32.0.0/16"));
    assert_eq!(services, Some("10.112.0.0/12"));
    assert_eq!(
        ignored,
        ["cluster.network.podSubnets fd00:10:32::/56 (one IPv4 network per cluster is emulated)"]
    );
}

#[test]
fn talos_defaults_and_what_cannot_be_honoured() {
    let s = read(b"machine: {type: worker}\ncluster:\n  controlPlane:\n    endpoint: https://127.70.0.1\n    localAPIServerPort: 6444\n").unwrap();
    assert!(!s.allow_scheduling_on_control_planes, "Talos' default");
    assert_eq!(s.api_port(Ipv4Addr::new(127, 70, 0, 9)), 6444);
    let s = read(b"cluster:\n  controlPlane:\n    endpoint: https://127.70.0.1\n  network:\n    cni: {name: flannel}\n").unwrap();
    assert_eq!(s.api_port(Ipv4Addr::new(127, 70, 0, 1)), 443);
    let (pods, services, ignored) = s.networks();
    assert_eq!((pods, services), (None, None));
    assert_eq!(
        ignored,
        ["cluster.network.cni.name flannel (no CNI is installed)"]
    );
    let (_, _, ignored) = read(b"cluster: {}\n").unwrap().networks();
    assert_eq!(
        ignored,
        ["cluster.network.cni (Talos' default, flannel; no CNI is installed)"]
    );
    assert!(read(b"cluster:\n  serviceAccount: {key: '%%%'}\n").is_err());
}

#[test]
fn reads_the_shared_ip_of_either_form() {
    assert_eq!(read(CONFIG.as_bytes()).unwrap().shared_vip, None);
    let typed = format!(
        "{CONFIG}---\napiVersion: v1alpha1\nkind: Layer2VIPConfig\nname: 127.70.0.100\nlink: eth0\n"
    );
    assert_eq!(
        read(typed.as_bytes()).unwrap().shared_vip,
        Some("127.70.0.100".parse().unwrap())
    );
    let legacy = CONFIG.replace(
        "  type: controlplane\n",
        "  type: controlplane\n  network:\n    interfaces:\n      - interface: eth0\n        dhcp: true\n        vip:\n          ip: 127.70.0.101\n",
    );
    assert_eq!(
        read(legacy.as_bytes()).unwrap().shared_vip,
        Some("127.70.0.101".parse().unwrap())
    );
}
