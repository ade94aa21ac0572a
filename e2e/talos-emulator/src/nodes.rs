//! How the machines of a bootstrapped cluster become Kubernetes Nodes.
//!
//! By default each one is a **hostlet** node (`e2e/hostlet`, the test bed's kubelet): named
//! after the machine's hostname, its InternalIP the machine's address, the pods bound to it
//! run as real host processes when their image is in the image map and are pretended
//! Running/Ready (as KWOK does) otherwise. So our own image runs for real inside a downstream
//! cluster with no extra flags, while addon charts (Cilium, cert-manager) stay pretended.
//!
//! * The `hostlet` binary is found next to the emulator's own executable (`target/<profile>/`;
//!   from a test executable in `target/<profile>/deps/`, one directory up).
//! * The default image map maps our image ([`OUR_IMAGE`], any tag: the chart's
//!   `image.repository` default) `/usr/local/bin/<name>` to every executable found there, and
//!   `/usr/local/bin/helm` to the test bed's helm.
//! * Each machine's pods get addresses of their own from a loopback range ([`pod_cidr`]), so
//!   pods of our operators, which all bind `$(POD_IP):8080` by default, never clash.
//!
//! [`NodeAgent::Kwok`] keeps the KWOK nodes of before; when the hostlet binary cannot be found
//! (or its node does not come up) the emulator falls back to a KWOK node and logs a warning.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

/// The repository of our image: any tag maps to the binaries next to the emulator.
pub const OUR_IMAGE: &str = "kontinuum";
/// Where our image keeps its binaries.
pub const IMAGE_BIN_DIR: &str = "/usr/local/bin";
/// The hostlet's executable name.
pub const HOSTLET_BINARY: &str = "hostlet";
/// File name of the default image map, in the emulator's state directory.
pub const IMAGE_MAP_FILE: &str = "image-map.json";
/// Prefix length of each machine's pod range: 62 pod addresses per node.
pub const POD_PREFIX: u8 = 26;

/// What runs a cluster machine's Node.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum NodeAgent {
    /// A hostlet: our images run for real, others are pretended Running/Ready.
    #[default]
    Hostlet,
    /// A KWOK node: every pod is pretended Running/Ready.
    Kwok,
}

impl std::str::FromStr for NodeAgent {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "hostlet" => Ok(Self::Hostlet),
            "kwok" => Ok(Self::Kwok),
            other => Err(format!(
                "unknown node agent {other:?} (want hostlet or kwok)"
            )),
        }
    }
}

/// How bootstrapped clusters get their nodes. The default: hostlet nodes, the binary and our
/// binaries found next to the emulator's executable.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeSettings {
    /// Hostlet or KWOK nodes.
    pub agent: NodeAgent,
    /// The `hostlet` binary (`None`: next to the emulator's executable).
    pub hostlet_binary: Option<PathBuf>,
    /// An image map file in the hostlet's format (`None`: [`default_image_map`], written to
    /// `<dir>/image-map.json`).
    pub image_map: Option<PathBuf>,
}

/// The node agent as resolved on first use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Agent {
    Kwok,
    Hostlet { binary: PathBuf, image_map: PathBuf },
}

/// The directory of the emulator's executable, or its parent when that is `deps/` (a test
/// executable in `target/<profile>/deps/`): where the workspace's binaries are.
pub fn binary_dir() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?;
    if dir.file_name().is_some_and(|n| n == "deps") {
        dir.parent().map(Path::to_path_buf)
    } else {
        Some(dir.to_path_buf())
    }
}

/// The executables directly in `dir`, by name (names with a dot, such as `libx.so`, are not
/// binaries of ours).
pub fn executables(dir: &Path) -> BTreeMap<String, PathBuf> {
    use std::os::unix::fs::PermissionsExt as _;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return BTreeMap::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let name = entry.file_name().to_str()?.to_owned();
            let path = entry.path();
            let meta = std::fs::metadata(&path).ok()?;
            (!name.contains('.') && meta.is_file() && meta.permissions().mode() & 0o111 != 0)
                .then_some((name, path))
        })
        .collect()
}

/// The default image map (the hostlet's format, as JSON): [`OUR_IMAGE`] with
/// `/usr/local/bin/<name>` → each of `binaries`, plus `/usr/local/bin/helm` → `helm`.
pub fn default_image_map(
    binaries: &BTreeMap<String, PathBuf>,
    helm: Option<&Path>,
) -> serde_json::Value {
    let mut files: BTreeMap<String, String> = binaries
        .iter()
        .map(|(name, path)| {
            (
                format!("{IMAGE_BIN_DIR}/{name}"),
                path.to_string_lossy().into_owned(),
            )
        })
        .collect();
    if let Some(helm) = helm {
        files.insert(
            format!("{IMAGE_BIN_DIR}/helm"),
            helm.to_string_lossy().into_owned(),
        );
    }
    serde_json::json!({ "images": [{ "image": OUR_IMAGE, "files": files }] })
}

/// The pod range of machine `index` of an emulator whose machines start at `first`: the
/// `index`-th /26 of `127.<b>.128.0/17`, where `b` is `first`'s second octet (test machines
/// live in the low half, `127.<b>.0-3.x`). `None` (pods on the node's IP) when `first` is not
/// a loopback address, the ranges run out, or a range would hold a machine's address.
/// Emulators sharing a second octet share the ranges: give each its own.
pub fn pod_cidr(first: Ipv4Addr, machines: usize, index: usize) -> Option<String> {
    let [a, b, _, _] = first.octets();
    if a != 127 {
        return None;
    }
    let size = 1_u32 << (32 - POD_PREFIX);
    let offset = u32::try_from(index).ok()?.checked_mul(size)?;
    if offset >= 1 << 15 {
        return None;
    }
    let network = u32::from(Ipv4Addr::new(127, b, 128, 0)) + offset;
    let low = u32::from(first);
    let high = low.checked_add(u32::try_from(machines.checked_sub(1)?).ok()?)?;
    if low < network + size && network <= high {
        return None;
    }
    Some(format!("{}/{POD_PREFIX}", Ipv4Addr::from(network)))
}

/// Resolves `settings` for an emulator with state directory `dir`: the hostlet binary and the
/// image map (the default one is written there), or KWOK, with a warning when hostlets were
/// asked for but cannot run.
pub(crate) fn resolve(settings: &NodeSettings, dir: &Path, helm: Option<&Path>) -> Agent {
    if settings.agent == NodeAgent::Kwok {
        return Agent::Kwok;
    }
    let bin_dir = binary_dir();
    let binary = settings
        .hostlet_binary
        .clone()
        .or_else(|| bin_dir.as_ref().map(|d| d.join(HOSTLET_BINARY)));
    let Some(binary) = binary.filter(|b| b.is_file()) else {
        tracing::warn!(
            dir = ?bin_dir,
            "hostlet binary not found (build it: cargo build -p kontinuum-hostlet); machines join as kwok nodes"
        );
        return Agent::Kwok;
    };
    let image_map = if let Some(map) = &settings.image_map {
        map.clone()
    } else {
        let binaries = bin_dir.as_deref().map(executables).unwrap_or_default();
        let path = dir.join(IMAGE_MAP_FILE);
        if let Err(err) = write_image_map(&path, &binaries, helm.filter(|h| h.is_file())) {
            tracing::warn!(
                error = &err as &dyn std::error::Error,
                "writing the image map failed; machines join as kwok nodes"
            );
            return Agent::Kwok;
        }
        path
    };
    tracing::info!(hostlet = %binary.display(), image_map = %image_map.display(), "machines join as hostlet nodes");
    Agent::Hostlet { binary, image_map }
}

fn write_image_map(
    path: &Path,
    binaries: &BTreeMap<String, PathBuf>,
    helm: Option<&Path>,
) -> std::io::Result<()> {
    let bytes = serde_json::to_vec_pretty(&default_image_map(binaries, helm))
        .map_err(std::io::Error::other)?;
    std::fs::write(path, bytes)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn each_machine_gets_its_own_pod_range_away_from_the_machines() {
        let first = Ipv4Addr::new(127, 61, 0, 1);
        assert_eq!(pod_cidr(first, 3, 0).as_deref(), Some("127.61.128.0/26"));
        assert_eq!(pod_cidr(first, 3, 1).as_deref(), Some("127.61.128.64/26"));
        assert_eq!(pod_cidr(first, 3, 4).as_deref(), Some("127.61.129.0/26"));
        assert_eq!(
            pod_cidr(first, 1000, 511).as_deref(),
            Some("127.61.255.192/26")
        );
        // Out of ranges, not loopback, or overlapping the machines: the node's IP.
        assert_eq!(pod_cidr(first, 1000, 512), None);
        assert_eq!(pod_cidr(Ipv4Addr::new(10, 0, 0, 1), 1, 0), None);
        assert_eq!(pod_cidr(Ipv4Addr::new(127, 61, 128, 10), 1, 0), None);
        assert_eq!(pod_cidr(Ipv4Addr::new(127, 61, 127, 250), 10, 0), None);
    }

    #[test]
    fn the_default_map_holds_every_executable_and_helm() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = std::env::temp_dir().join(format!("emu-image-map-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        for (name, mode) in [
            ("pool-claimer", 0o755),
            ("hostlet", 0o755),
            ("notes", 0o644),
            ("libx.so", 0o755),
        ] {
            let path = dir.join(name);
            std::fs::write(&path, b"").unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        }
        let found = executables(&dir);
        assert_eq!(
            found.keys().collect::<Vec<_>>(),
            ["hostlet", "pool-claimer"]
        );
        let map = default_image_map(&found, Some(Path::new("/cache/bin/helm")));
        assert_eq!(map["images"][0]["image"], OUR_IMAGE);
        let files = map["images"][0]["files"].as_object().unwrap();
        assert_eq!(files.len(), 3);
        assert_eq!(
            files["/usr/local/bin/pool-claimer"],
            dir.join("pool-claimer").to_string_lossy().as_ref()
        );
        assert_eq!(files["/usr/local/bin/helm"], "/cache/bin/helm");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_missing_hostlet_falls_back_to_kwok() {
        let settings = NodeSettings {
            hostlet_binary: Some(PathBuf::from("/nonexistent/hostlet")),
            ..NodeSettings::default()
        };
        assert_eq!(
            resolve(&settings, Path::new("/nonexistent"), None),
            Agent::Kwok
        );
        let kwok = NodeSettings {
            agent: NodeAgent::Kwok,
            ..NodeSettings::default()
        };
        assert_eq!(resolve(&kwok, Path::new("/nonexistent"), None), Agent::Kwok);
        assert_eq!("kwok".parse::<NodeAgent>(), Ok(NodeAgent::Kwok));
        assert_eq!("hostlet".parse::<NodeAgent>(), Ok(NodeAgent::Hostlet));
        assert!("docker".parse::<NodeAgent>().is_err());
    }

    #[test]
    fn the_binary_dir_skips_deps() {
        // This unit test runs from target/<profile>/deps/.
        let dir = binary_dir().unwrap();
        assert_ne!(dir.file_name().unwrap(), "deps");
    }
}
