//! Building the objects the plugin writes (one Zone, or one Instance) from the command line,
//! validated with the crds crate's naming rules so that a bad value is refused before
//! anything is sent, with a message naming the flag. The API server's schema stays the
//! authority: whatever these checks miss, it refuses.

use std::collections::BTreeMap;

use kontinuum_crds::MAX_CONFIG_PATCHES;
use kontinuum_crds::labels;
use kontinuum_crds::names::{self, NameError};
use kontinuum_crds::v1alpha2::{
    ConfigPatch, ControlPlaneEndpoint, Instance, InstanceSpec, SharedVip, Teardown, Zone,
    ZoneClusterTemplate, ZoneSeed, ZoneSpec,
};
use kube::api::ObjectMeta;
use serde::Serialize;

use crate::cli::{InstanceAddArgs, OutputFormat, ZoneAddArgs};
use crate::error::Error;

/// The most seed addresses a Zone takes (the CRD's `maxItems`).
pub const MAX_SEED_ADDRESSES: usize = 32;

/// The pattern of `spec.cluster.talosVersion` and `kubernetesVersion` in the Zone CRD,
/// checked here by hand (a unit test keeps the two in step).
pub const VERSION_PATTERN: &str = "^v[0-9]+[.][0-9]+[.][0-9]+(-[0-9A-Za-z.-]+)?$";

/// Builds the Zone `zone add` applies, in `namespace`.
pub fn zone(args: &ZoneAddArgs, namespace: &str) -> Result<Zone, Error> {
    let name = names::zone_name(&args.region, &args.zone).map_err(|e| name_error(&e))?;
    if !names::is_dns1123_label(namespace) {
        return Err(invalid(
            "--namespace",
            format!("{namespace:?} is not a DNS-1123 label"),
        ));
    }
    let domain = match args.domain.as_deref() {
        None => None,
        Some(domain) => Some(check_domain(domain, &args.region, &args.zone)?),
    };
    let mut addresses: Vec<String> = Vec::new();
    for address in &args.talos_addresses {
        let normalized = names::normalize_address(address).map_err(|e| {
            invalid(
                "--talos-address",
                match e {
                    NameError::Empty { .. } => "an address must not be empty".to_owned(),
                    _ => format!("{address:?} is neither an IP address nor a DNS name"),
                },
            )
        })?;
        if !addresses.contains(&normalized) {
            addresses.push(normalized);
        }
    }
    if addresses.len() > MAX_SEED_ADDRESSES {
        return Err(invalid(
            "--talos-address",
            format!(
                "at most {MAX_SEED_ADDRESSES} addresses, got {}",
                addresses.len()
            ),
        ));
    }
    let talos_version = check_version("--talos-version", args.talos_version.as_deref())?;
    let kubernetes_version =
        check_version("--kubernetes-version", args.kubernetes_version.as_deref())?;
    if let Some(replicas) = args.control_plane_replicas
        && replicas < 1
    {
        return Err(invalid(
            "--control-plane-replicas",
            format!("must be at least 1, got {replicas}"),
        ));
    }
    let endpoint = match (&args.endpoint, args.vip) {
        (_, Some(ip)) => {
            if args.vip_link.is_empty()
                || args.vip_link.len() > 15
                || args.vip_link.contains(['/', ':'])
                || args.vip_link.contains(char::is_whitespace)
            {
                return Err(invalid(
                    "--vip-link",
                    format!("{:?} is not a link name", args.vip_link),
                ));
            }
            Some(ControlPlaneEndpoint {
                host: None,
                vip: Some(SharedVip {
                    ip: ip.to_string(),
                    link: args.vip_link.clone(),
                }),
            })
        }
        (Some(host), None) => Some(ControlPlaneEndpoint {
            host: Some(names::normalize_address(host).map_err(|_| {
                invalid(
                    "--endpoint",
                    format!("{host:?} is neither an IP address nor a DNS name"),
                )
            })?),
            vip: None,
        }),
        (None, None) => None,
    };
    let cluster = ZoneClusterTemplate {
        talos_version,
        kubernetes_version,
        control_plane_replicas: args.control_plane_replicas,
        config_patches: read_patches(&args.patches)?,
        endpoint,
    };
    let spec = ZoneSpec {
        region: args.region.clone(),
        zone: args.zone.clone(),
        domain,
        seed: (!addresses.is_empty()).then_some(ZoneSeed {
            talos_addresses: addresses,
        }),
        cluster: (cluster != ZoneClusterTemplate::default()).then_some(cluster),
        teardown: args.unregister_instances_on_delete.then_some(Teardown {
            unregister_instances: true,
        }),
    };
    let mut zone = Zone::new(&name, spec);
    zone.metadata.namespace = Some(namespace.to_owned());
    Ok(zone)
}

/// Builds the Instance `instance add` applies, in `namespace`.
pub fn instance(args: &InstanceAddArgs, namespace: &str) -> Result<Instance, Error> {
    let address = names::normalize_address(&args.address).map_err(|_| {
        invalid(
            "--address",
            format!("{:?} is neither an IP address nor a DNS name", args.address),
        )
    })?;
    let location = match (&args.region, &args.zone) {
        (Some(region), Some(zone)) => {
            names::zone_name(region, zone).map_err(|e| name_error(&e))?;
            Some((region.clone(), zone.clone()))
        }
        _ => None,
    };
    let name = match (&args.name, &location) {
        (Some(name), _) => {
            if !names::is_dns1123_label(name) {
                return Err(invalid(
                    "--name",
                    format!(
                        "{name:?} is not a DNS-1123 label (it becomes the machine's host name)"
                    ),
                ));
            }
            name.clone()
        }
        (None, Some((region, zone))) => {
            names::seed_instance_name(region, zone, &address).map_err(|e| name_error(&e))?
        }
        (None, None) => {
            return Err(invalid(
                "--name",
                "required unless --region and --zone are given".to_owned(),
            ));
        }
    };
    let labels = location.map(|(region, zone)| {
        BTreeMap::from([
            (labels::REGION.to_owned(), region),
            (labels::ZONE.to_owned(), zone),
        ])
    });
    Ok(Instance {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: Some(namespace.to_owned()),
            labels,
            ..ObjectMeta::default()
        },
        spec: InstanceSpec {
            interfaces: vec![address],
            ..InstanceSpec::default()
        },
        status: None,
    })
}

/// The manifest of `object` as a Git repository wants it: apiVersion, kind, metadata (name,
/// namespace, labels) and spec; never a status or a server-set field.
pub fn render<T: Serialize>(object: &T, format: OutputFormat) -> Result<String, Error> {
    match format {
        OutputFormat::Yaml => {
            serde_saphyr::to_string(object).map_err(|e| Error::Encode(format!("YAML: {e}")))
        }
        OutputFormat::Json => serde_json::to_string_pretty(object)
            .map(|mut text| {
                text.push('\n');
                text
            })
            .map_err(|e| Error::Encode(format!("JSON: {e}"))),
    }
}

fn check_domain(domain: &str, region: &str, zone: &str) -> Result<String, Error> {
    let domain = domain.strip_suffix('.').unwrap_or(domain);
    if !names::is_dns1123_subdomain(domain) {
        return Err(invalid(
            "--domain",
            format!("{domain:?} is not a DNS-1123 subdomain (lowercase labels separated by dots)"),
        ));
    }
    let host = format!("{zone}.{region}.{domain}");
    if host.len() > names::MAX_OBJECT_NAME_LEN {
        return Err(invalid(
            "--domain",
            format!(
                "too long: the zone's host name {host:?} would be {} characters, more than {}",
                host.len(),
                names::MAX_OBJECT_NAME_LEN
            ),
        ));
    }
    Ok(domain.to_owned())
}

fn check_version(flag: &'static str, version: Option<&str>) -> Result<Option<String>, Error> {
    let Some(version) = version else {
        return Ok(None);
    };
    if is_version(version) {
        Ok(Some(version.to_owned()))
    } else {
        Err(invalid(
            flag,
            format!("{version:?} is not a version such as v1.13.0"),
        ))
    }
}

/// Whether `text` matches [`VERSION_PATTERN`]: `v<major>.<minor>.<patch>` with an optional
/// `-<pre-release>` of alphanumerics, dots and dashes, at most 32 characters.
pub fn is_version(text: &str) -> bool {
    let Some(rest) = text.strip_prefix('v') else {
        return false;
    };
    let (core, pre) = match rest.split_once('-') {
        Some((core, pre)) => (core, Some(pre)),
        None => (rest, None),
    };
    let numbers: Vec<&str> = core.split('.').collect();
    text.len() <= 32
        && numbers.len() == 3
        && numbers
            .iter()
            .all(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        && pre.is_none_or(|pre| {
            !pre.is_empty()
                && pre
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-')
        })
}

/// Maps a crds naming error to the flag the user typed.
fn name_error(err: &NameError) -> Error {
    let flag = match err {
        NameError::Empty { what } | NameError::NotDnsLabel { what, .. } => match *what {
            "region" => "--region",
            "zone" => "--zone",
            _ => "--name",
        },
        NameError::InvalidAddress { .. } => "--address",
        NameError::TooLong { what, .. } if *what == "zone name" => "--region/--zone",
        NameError::TooLong { .. } | NameError::NotDnsSubdomain { .. } => "--name",
    };
    let message = match err {
        NameError::TooLong { name, max, .. } if flag == "--region/--zone" => format!(
            "the zone name {name:?} is {} characters long; region and zone together may have at most {max} (the seed machines' host names add a hash)",
            name.len()
        ),
        other => other.to_string(),
    };
    invalid(flag, message)
}

/// The most bytes one `--patch` file may hold.
const MAX_PATCH_FILE_BYTES: u64 = 64 * 1024;

/// Reads `--patch` files: every YAML document of each, in order, must be a mapping.
fn read_patches(paths: &[std::path::PathBuf]) -> Result<Vec<ConfigPatch>, Error> {
    let mut patches = Vec::new();
    for path in paths {
        let shown = path.display();
        let size = std::fs::metadata(path)
            .map_err(|e| invalid("--patch", format!("{shown}: {e}")))?
            .len();
        if size > MAX_PATCH_FILE_BYTES {
            return Err(invalid(
                "--patch",
                format!("{shown}: {size} bytes, more than the {MAX_PATCH_FILE_BYTES} allowed"),
            ));
        }
        let text = std::fs::read_to_string(path)
            .map_err(|e| invalid("--patch", format!("{shown}: {e}")))?;
        let documents: Vec<serde_json::Value> = serde_saphyr::from_multiple(&text)
            .map_err(|e| invalid("--patch", format!("{shown}: not YAML: {e}")))?;
        for (i, document) in documents.into_iter().enumerate() {
            match document {
                serde_json::Value::Null => {}
                serde_json::Value::Object(map) if !map.is_empty() => patches.push(map),
                _ => {
                    return Err(invalid(
                        "--patch",
                        format!("{shown}: document {} is not a YAML mapping", i + 1),
                    ));
                }
            }
        }
    }
    if patches.len() > MAX_CONFIG_PATCHES as usize {
        return Err(invalid(
            "--patch",
            format!(
                "at most {MAX_CONFIG_PATCHES} patch documents, got {}",
                patches.len()
            ),
        ));
    }
    Ok(patches)
}

fn invalid(flag: &'static str, message: String) -> Error {
    Error::Invalid { flag, message }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use kube::CustomResourceExt as _;

    use super::*;

    fn add(region: &str, zone: &str) -> ZoneAddArgs {
        ZoneAddArgs {
            region: region.into(),
            zone: zone.into(),
            talos_addresses: vec![],
            domain: None,
            talos_version: None,
            kubernetes_version: None,
            control_plane_replicas: None,
            patches: vec![],
            endpoint: None,
            vip: None,
            vip_link: "eth0".into(),
            unregister_instances_on_delete: false,
            force_conflicts: false,
            dry_run: None,
            output: None,
            wait: false,
            timeout: Duration::from_secs(900),
        }
    }

    #[allow(clippy::needless_pass_by_value)]
    fn message(err: Error) -> String {
        err.one_line()
    }

    #[test]
    fn endpoint_becomes_the_zone_clusters_endpoint_and_a_bad_one_is_refused() {
        let mut args = add("eu", "west-1a");
        args.endpoint = Some("API.West-1a.Example.".into());
        let added = zone(&args, "kontinuum-system").unwrap();
        assert_eq!(
            added.spec.cluster.unwrap().endpoint.and_then(|e| e.host),
            Some("api.west-1a.example".to_owned())
        );
        args.endpoint = Some("not a host".into());
        let err = message(zone(&args, "kontinuum-system").unwrap_err());
        assert!(err.contains("--endpoint"), "{err}");
        let plain = zone(&add("eu", "west-1a"), "kontinuum-system").unwrap();
        assert!(plain.spec.cluster.is_none());

        let mut args = add("eu", "west-1a");
        args.vip = Some("192.0.2.100".parse().unwrap());
        args.vip_link = "enp1s0".into();
        let endpoint = zone(&args, "kontinuum-system")
            .unwrap()
            .spec
            .cluster
            .unwrap()
            .endpoint
            .unwrap();
        assert_eq!(endpoint.host, None);
        assert_eq!(
            endpoint.vip,
            Some(SharedVip {
                ip: "192.0.2.100".into(),
                link: "enp1s0".into()
            })
        );
        args.vip_link = "en p1".into();
        let err = message(zone(&args, "kontinuum-system").unwrap_err());
        assert!(err.contains("--vip-link"), "{err}");
    }

    #[test]
    fn patch_files_become_the_zone_clusters_config_patches_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let mirror = dir.path().join("mirror.yaml");
        std::fs::write(
            &mirror,
            "machine:\n  registries:\n    mirrors:\n      docker.io:\n        endpoints: [https://mirror.example]\n---\napiVersion: v1alpha1\nkind: HostnameConfig\n$patch: delete\n",
        )
        .unwrap();
        let disk = dir.path().join("disk.yaml");
        std::fs::write(&disk, "machine: {install: {disk: /dev/sda}}\n").unwrap();
        let mut args = add("eu", "west-1a");
        args.patches = vec![mirror.clone(), disk];
        let zone = zone(&args, "kontinuum-system").unwrap();
        let patches = zone.spec.cluster.unwrap().config_patches;
        let got: Vec<_> = patches
            .iter()
            .map(|p| p.keys().cloned().collect::<Vec<_>>())
            .collect();
        assert_eq!(
            got,
            [
                vec!["machine"],
                vec!["$patch", "apiVersion", "kind"],
                vec!["machine"]
            ]
        );
        assert_eq!(patches[2]["machine"]["install"]["disk"], "/dev/sda");

        let list = dir.path().join("list.yaml");
        std::fs::write(&list, "- op: add\n  path: /machine/x\n").unwrap();
        let refused = |path: &std::path::Path| {
            let mut args = add("eu", "west-1a");
            args.patches = vec![path.to_owned()];
            message(zone_refused(&args))
        };
        assert!(
            refused(&list).contains("--patch")
                && refused(&list).contains("document 1 is not a YAML mapping")
        );
        assert!(refused(&dir.path().join("missing.yaml")).contains("missing.yaml"));
        let many = dir.path().join("many.yaml");
        std::fs::write(&many, "a: 1\n---\n".repeat(17)).unwrap();
        assert!(refused(&many).contains("at most 16 patch documents, got 17"));
    }

    fn zone_refused(args: &ZoneAddArgs) -> Error {
        zone(args, "kontinuum-system").unwrap_err()
    }

    #[test]
    fn a_minimal_zone_is_just_its_identity() {
        let zone = zone(&add("eu", "west-1a"), "kontinuum-system").unwrap();
        let yaml = render(&zone, OutputFormat::Yaml).unwrap();
        assert_eq!(
            yaml,
            "apiVersion: kontinuum.sh/v1alpha2\nkind: Zone\nmetadata:\n  name: eu-west-1a\n  namespace: kontinuum-system\nspec:\n  region: eu\n  zone: west-1a\n"
        );
    }

    #[test]
    fn every_flag_lands_in_the_spec() {
        let mut args = add("eu", "west-1a");
        args.talos_addresses = vec![
            "192.0.2.10".into(),
            "Node-1.Example.COM.".into(),
            "192.0.2.10".into(),
        ];
        args.domain = Some("example.com".into());
        args.talos_version = Some("v1.13.0".into());
        args.kubernetes_version = Some("v1.32.0-rc.1".into());
        args.control_plane_replicas = Some(3);
        args.unregister_instances_on_delete = true;
        let zone = zone(&args, "hub").unwrap();
        let json: serde_json::Value =
            serde_json::from_str(&render(&zone, OutputFormat::Json).unwrap()).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "apiVersion": "kontinuum.sh/v1alpha2",
                "kind": "Zone",
                "metadata": { "name": "eu-west-1a", "namespace": "hub" },
                "spec": {
                    "region": "eu",
                    "zone": "west-1a",
                    "domain": "example.com",
                    "seed": { "talosAddresses": ["192.0.2.10", "node-1.example.com"] },
                    "cluster": {
                        "talosVersion": "v1.13.0",
                        "kubernetesVersion": "v1.32.0-rc.1",
                        "controlPlaneReplicas": 3
                    },
                    "teardown": { "unregisterInstances": true }
                }
            })
        );
    }

    #[test]
    fn bad_values_name_their_flag() {
        let cases: Vec<(ZoneAddArgs, &str)> = vec![
            (
                add("EU", "a"),
                "error: --region: region \"EU\" is not a DNS-1123 label",
            ),
            (add("eu", ""), "error: --zone: zone must not be empty"),
            (
                add(&"r".repeat(30), &"z".repeat(30)),
                "error: --region/--zone: the zone name",
            ),
            (
                ZoneAddArgs {
                    talos_addresses: vec!["10.0.0.256".into()],
                    ..add("eu", "a")
                },
                "error: --talos-address: \"10.0.0.256\" is neither",
            ),
            (
                ZoneAddArgs {
                    domain: Some("Example_com".into()),
                    ..add("eu", "a")
                },
                "error: --domain:",
            ),
            (
                ZoneAddArgs {
                    talos_version: Some("1.13".into()),
                    ..add("eu", "a")
                },
                "error: --talos-version: \"1.13\" is not a version",
            ),
            (
                ZoneAddArgs {
                    kubernetes_version: Some("v1.32".into()),
                    ..add("eu", "a")
                },
                "error: --kubernetes-version:",
            ),
            (
                ZoneAddArgs {
                    control_plane_replicas: Some(0),
                    ..add("eu", "a")
                },
                "error: --control-plane-replicas: must be at least 1, got 0",
            ),
            (
                ZoneAddArgs {
                    talos_addresses: (0..33).map(|i| format!("192.0.2.{i}")).collect(),
                    ..add("eu", "a")
                },
                "error: --talos-address: at most 32 addresses, got 33",
            ),
        ];
        for (args, expected) in cases {
            let got = message(zone(&args, "kontinuum-system").unwrap_err());
            assert!(
                got.starts_with(expected),
                "{got:?} should start with {expected:?}"
            );
            assert!(!got.contains('\n'));
        }
        let got = message(zone(&add("eu", "a"), "Bad_NS").unwrap_err());
        assert!(got.starts_with("error: --namespace:"), "{got}");
    }

    #[test]
    fn the_version_check_matches_the_crd_pattern() {
        let crd = serde_json::to_value(Zone::crd()).unwrap();
        let cluster = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
            ["properties"]["cluster"]["properties"];
        assert_eq!(cluster["talosVersion"]["pattern"], VERSION_PATTERN);
        assert_eq!(cluster["kubernetesVersion"]["pattern"], VERSION_PATTERN);
        assert_eq!(cluster["talosVersion"]["maxLength"], 32);
        for ok in ["v1.13.0", "v10.0.12", "v1.2.3-alpha.1", "v1.2.3-rc-1"] {
            assert!(is_version(ok), "{ok}");
        }
        for bad in [
            "1.2.3", "v1.2", "v1.2.3.4", "v1.2.x", "v1.2.3-", "v1..3", "v1.2.3+b",
        ] {
            assert!(!is_version(bad), "{bad}");
        }
    }

    #[test]
    fn instances_take_the_seed_name_of_their_zone() {
        let args = InstanceAddArgs {
            address: "192.0.2.10".into(),
            name: None,
            region: Some("eu".into()),
            zone: Some("west-1a".into()),
            force_conflicts: false,
        };
        let instance = instance(&args, "kontinuum-system").unwrap();
        assert_eq!(
            instance.metadata.name.as_deref(),
            Some("eu-west-1a-6d99cbd08f")
        );
        let yaml = render(&instance, OutputFormat::Yaml).unwrap();
        assert!(yaml.contains("kontinuum.sh/region: eu"), "{yaml}");
        assert!(yaml.contains("interfaces:\n  - \"192.0.2.10\""), "{yaml}");
        assert!(!yaml.contains("status"), "{yaml}");
    }

    #[test]
    fn an_instance_without_zone_needs_a_name() {
        let mut args = InstanceAddArgs {
            address: "192.0.2.10".into(),
            name: None,
            region: None,
            zone: None,
            force_conflicts: false,
        };
        let err = message(instance(&args, "ns").unwrap_err());
        assert_eq!(
            err,
            "error: --name: required unless --region and --zone are given"
        );
        args.name = Some("rack1-node3".into());
        let instance = instance(&args, "ns").unwrap();
        assert_eq!(instance.metadata.labels, None);
        args.name = Some("Rack1".into());
        assert!(message(super::instance(&args, "ns").unwrap_err()).starts_with("error: --name:"));
        args.address = "node_1".into();
        assert!(
            message(super::instance(&args, "ns").unwrap_err()).starts_with("error: --address:")
        );
    }
}
