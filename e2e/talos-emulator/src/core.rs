//! The pure state machine of one emulated machine: modes, what each RPC may do in each mode,
//! config validation and the effects of Apply, Bootstrap, Reset and a reboot. No I/O; the
//! server (`machine.rs`) performs the effects this module returns.

use std::net::Ipv4Addr;

use kontinuum_talos_config::{
    ConfigError, DiskSelector, InstallDisk, MachineType, ParsedConfig, parse_machine_config,
};
use kontinuum_talos_validate::Contract;

/// The Talos release line the emulator claims to run (`TALOS_TAG`): the contract configs are
/// validated against (its Kubernetes range, the document kinds it knows).
pub const CONTRACT: Contract = Contract::V1_13;

/// The gRPC-level outcome of a refused call; the edge maps it to a `tonic::Status`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    InvalidArgument(String),
    PermissionDenied(String),
    AlreadyExists(String),
    FailedPrecondition(String),
    Unimplemented(String),
}

impl Refusal {
    /// The status the machine answers with.
    pub fn into_status(self) -> tonic::Status {
        match self {
            Self::InvalidArgument(m) => tonic::Status::invalid_argument(m),
            Self::PermissionDenied(m) => tonic::Status::permission_denied(m),
            Self::AlreadyExists(m) => tonic::Status::already_exists(m),
            Self::FailedPrecondition(m) => tonic::Status::failed_precondition(m),
            Self::Unimplemented(m) => tonic::Status::unimplemented(m),
        }
    }
}

/// Roles carried in a client certificate's Organization.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Admin,
    Operator,
    Reader,
}

impl Role {
    /// The role named by an Organization value; unknown values are ignored (as Talos does).
    pub fn parse(organization: &str) -> Option<Self> {
        match organization {
            "os:admin" => Some(Self::Admin),
            "os:operator" => Some(Self::Operator),
            "os:reader" => Some(Self::Reader),
            _ => None,
        }
    }
}

/// What an RPC needs (Talos' authorization table, reduced to what we serve).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Version, COSI Get/List, Disks, HealthCheck: admin, operator, reader.
    Read,
    /// ApplyConfiguration: admin; anyone in maintenance mode.
    Apply,
    /// Bootstrap, Kubeconfig, Reset, Upgrade: admin only.
    Admin,
    /// Reboot: admin or operator.
    Operator,
}

/// The two API modes of a machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// No config: self-signed TLS, no client certificate, every caller is `os:reader`.
    Maintenance,
    /// A config is applied: mTLS against its OS CA.
    Configured,
}

/// Authorizes a call. `roles` are the client certificate's roles (configured mode).
pub fn authorize(mode: Mode, roles: &[Role], access: Access) -> Result<(), Refusal> {
    let allowed = match (mode, access) {
        (Mode::Maintenance, Access::Read | Access::Apply) => true,
        // Every maintenance-mode caller is os:reader (Talos v1.13 merged the maintenance API
        // into the regular one, so Reboot and Upgrade are refused by the authorizer).
        (Mode::Maintenance, Access::Admin | Access::Operator) => false,
        (Mode::Configured, Access::Read) => !roles.is_empty(),
        (Mode::Configured, Access::Apply | Access::Admin) => roles.contains(&Role::Admin),
        (Mode::Configured, Access::Operator) => {
            roles.contains(&Role::Admin) || roles.contains(&Role::Operator)
        }
    };
    if allowed {
        Ok(())
    } else {
        Err(Refusal::PermissionDenied("not authorized".to_owned()))
    }
}

/// Fixed facts of one emulated machine, derived from its index and address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Facts {
    /// 0-based position among the emulator's machines.
    pub index: usize,
    /// The machine's address (all its services listen here).
    pub address: Ipv4Addr,
}

/// The one disk every machine has.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiskFacts {
    pub name: String,
    pub dev_path: String,
    pub model: String,
    pub serial: String,
    pub size: u64,
    pub disk_type: &'static str,
}

/// Prefix length of the emulated machine network.
pub const PREFIX_LENGTH: u8 = 24;
/// The emulated disk's size: 100 GiB.
pub const DISK_SIZE: u64 = 100 * 1024 * 1024 * 1024;

impl Facts {
    /// `52:54:00:xx:yy:zz`, the low 24 bits being `index + 1`.
    pub fn mac(&self) -> String {
        let n = (self.index + 1) & 0x00ff_ffff;
        format!(
            "52:54:00:{:02x}:{:02x}:{:02x}",
            (n >> 16) & 0xff,
            (n >> 8) & 0xff,
            n & 0xff
        )
    }

    /// `<address>/24`.
    pub fn cidr(&self) -> String {
        format!("{}/{PREFIX_LENGTH}", self.address)
    }

    /// The hostname a machine reports when its config sets none, e.g. `talos-127-10-0-1`.
    pub fn default_hostname(&self) -> String {
        format!("talos-{}", self.address.to_string().replace('.', "-"))
    }

    /// The disk: `/dev/sda`, a QEMU model, a serial from the index, 100 GiB, an SSD.
    pub fn disk(&self) -> DiskFacts {
        DiskFacts {
            name: "sda".to_owned(),
            dev_path: "/dev/sda".to_owned(),
            model: "QEMU HARDDISK".to_owned(),
            serial: format!("EMU{:06}", self.index + 1),
            size: DISK_SIZE,
            disk_type: "ssd",
        }
    }
}

/// Sections of the `v1alpha1` document a running machine takes without a reboot (Talos'
/// documentation: "reboot if the change can't be applied without a reboot"; this is the
/// emulator's reading of which can, from Talos' controllers that watch them): the whole
/// `cluster` section, and these under `machine`. Typed documents all apply live.
const LIVE_MACHINE_SECTIONS: &[&str] = &[
    "network",
    "sysctls",
    "sysfs",
    "certSANs",
    "logging",
    "kubelet",
    "registries",
    "time",
    "nodeLabels",
    "nodeAnnotations",
    "nodeTaints",
    "features",
    "install",
    "udev",
    "pods",
    "seccompProfiles",
];

/// Whether changing a running machine's config from `old` to `new` (both already
/// validated) needs a reboot: something outside `LIVE_MACHINE_SECTIONS` and `cluster`
/// differs in the `v1alpha1` document. Unreadable input counts as needing one.
pub fn needs_reboot(old: &str, new: &str) -> bool {
    fn rest(yaml: &str) -> Option<serde_json::Value> {
        let documents: Vec<serde_json::Value> = serde_saphyr::from_multiple(yaml).ok()?;
        let mut main = documents
            .into_iter()
            .find(|d| d.is_object() && d.get("kind").is_none())?;
        let map = main.as_object_mut()?;
        map.remove("cluster");
        if let Some(machine) = map.get_mut("machine").and_then(|m| m.as_object_mut()) {
            for section in LIVE_MACHINE_SECTIONS {
                machine.remove(*section);
            }
        }
        Some(main)
    }
    match (rest(old), rest(new)) {
        (Some(a), Some(b)) => a != b,
        _ => true,
    }
}

/// What the emulator knows about a configured control plane of another (or this) machine,
/// for checking that a worker config belongs to its cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KnownControlPlane {
    pub address: Ipv4Addr,
    pub cluster_id: Option<String>,
    pub kubernetes_ca_pem: String,
    pub os_ca_pem: String,
}

/// Checks a config as Talos' ApplyConfiguration would in maintenance mode — first strictly,
/// with the emulator's own decoder (`kontinuum-talos-validate`: unknown keys, wrong types,
/// missing or invalid fields, as Talos' config loader and `Validate` refuse them), then
/// extracts what the emulator needs with the generator's parser, then Talos'
/// RuntimeValidate (the install disk must exist) — plus the emulator's cluster consistency
/// check: a worker whose endpoint is a known control plane (or whose cluster id is known)
/// must carry that cluster's id and CAs.
pub fn validate_config(
    bytes: &[u8],
    facts: &Facts,
    control_planes: &[KnownControlPlane],
) -> Result<ParsedConfig, Refusal> {
    kontinuum_talos_validate::validate(bytes, CONTRACT).map_err(|problems| {
        Refusal::InvalidArgument(kontinuum_talos_validate::describe(&problems))
    })?;
    let parsed = parse_machine_config(bytes).map_err(|e| Refusal::InvalidArgument(describe(&e)))?;
    check_install_disk(&parsed.install_disk, &facts.disk())?;
    if parsed.machine_type == MachineType::Worker {
        let endpoint_host = endpoint_host(&parsed.cluster_endpoint);
        let related = control_planes.iter().filter(|cp| {
            Some(cp.address.to_string().as_str()) == endpoint_host
                || (cp.cluster_id.is_some() && cp.cluster_id == parsed.cluster_id)
        });
        for cp in related {
            if cp.cluster_id != parsed.cluster_id
                || cp.kubernetes_ca_pem.trim() != parsed.kubernetes_ca.cert_pem.trim()
                || cp.os_ca_pem.trim() != parsed.os_ca.cert_pem.trim()
            {
                return Err(Refusal::InvalidArgument(format!(
                    "config does not belong to the cluster of control plane {}",
                    cp.address
                )));
            }
        }
    }
    Ok(parsed)
}

/// The error and its sources, one line (configs hold secrets, but `ConfigError` never
/// carries them: it names fields).
fn describe(err: &ConfigError) -> String {
    let mut out = format!("invalid machine config: {err}");
    let mut source = std::error::Error::source(err);
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

/// The host of `https://host:port/...`.
pub fn endpoint_host(url: &str) -> Option<&str> {
    let rest = url.strip_prefix("https://")?;
    let authority = rest.split('/').next()?;
    if let Some(v6) = authority.strip_prefix('[') {
        return v6.split(']').next();
    }
    Some(authority.rsplit_once(':').map_or(authority, |(h, _)| h))
}

/// Talos' RuntimeValidate: the install disk must exist ("no disks matched the expression").
fn check_install_disk(install: &InstallDisk, disk: &DiskFacts) -> Result<(), Refusal> {
    let matches = match install {
        InstallDisk::Path(path) => *path == disk.dev_path,
        InstallDisk::Selector(selector) => selector_matches(selector, disk),
    };
    if matches {
        Ok(())
    } else {
        Err(Refusal::InvalidArgument(
            "install disk: no disks matched the expression".to_owned(),
        ))
    }
}

fn selector_matches(selector: &DiskSelector, disk: &DiskFacts) -> bool {
    let glob = |pattern: &str, value: &str| match pattern.strip_suffix('*') {
        Some(prefix) => value.starts_with(prefix),
        None => pattern == value,
    };
    selector
        .model
        .as_deref()
        .is_none_or(|m| glob(m, &disk.model))
        && selector.serial.as_deref().is_none_or(|s| s == disk.serial)
        && selector
            .name
            .as_deref()
            .is_none_or(|n| n == disk.name || n == disk.dev_path)
        && selector
            .disk_type
            .as_deref()
            .is_none_or(|t| t == disk.disk_type)
        && selector.wwid.is_none()
        && selector.bus_path.as_deref().is_none_or(|b| b == "*")
}

/// The Talos version an Upgrade installs: the tag of its installer image
/// (`<registry>/<path>/installer:vX.Y.Z`, optionally `@sha256:<digest>`). A reference that is
/// not a valid image reference is refused with `InvalidArgument`, as Talos refuses an image it
/// cannot parse; a valid one whose tag is no Talos version (`latest`, none) cannot be
/// emulated, since the emulator does not pull images to read their version.
pub fn upgrade_version(image: &str) -> Result<String, Refusal> {
    let invalid = |why: &str| {
        Refusal::InvalidArgument(format!("error validating installer image {image:?}: {why}"))
    };
    let (name, digest) = match image.split_once('@') {
        Some((name, digest)) => (name, Some(digest)),
        None => (image, None),
    };
    if let Some(digest) = digest {
        let hex = digest
            .strip_prefix("sha256:")
            .ok_or_else(|| invalid("invalid digest"))?;
        if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(invalid("invalid digest"));
        }
    }
    // A tag follows the last `:` after the last `/` (a `:` before it is a registry port).
    let last_slash = name.rfind('/').map_or(0, |i| i + 1);
    let (path, tag) = match name[last_slash..].rfind(':') {
        Some(i) => (&name[..last_slash + i], Some(&name[last_slash + i + 1..])),
        None => (name, None),
    };
    if !valid_repository(path) {
        return Err(invalid("invalid reference format"));
    }
    let tag_ok = |t: &str| {
        (1..=128).contains(&t.len())
            && t.bytes()
                .next()
                .is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_')
            && t.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.' || b == b'-')
    };
    match tag {
        Some(t) if !tag_ok(t) => Err(invalid("invalid reference format")),
        Some(t) if is_talos_version(t) => Ok(t.to_owned()),
        _ => Err(Refusal::Unimplemented(format!(
            "the emulator upgrades only to installer images tagged with a Talos version (vX.Y.Z), not {image:?}"
        ))),
    }
}

/// `[registry[:port]/]component(/component)*`, each component lowercase alphanumerics
/// joined by `.`, `_`, `__` or dashes (the distribution reference grammar).
fn valid_repository(path: &str) -> bool {
    let mut parts: Vec<&str> = path.split('/').collect();
    if parts.len() > 1 {
        let first = parts[0];
        if first.contains('.') || first.contains(':') || first == "localhost" {
            let (host, port) = first.split_once(':').unwrap_or((first, "0"));
            let host_ok = !host.is_empty()
                && host.split('.').all(|l| {
                    !l.is_empty() && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                });
            if !host_ok || port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) {
                return false;
            }
            parts.remove(0);
        }
    }
    !parts.is_empty()
        && parts.iter().all(|c| {
            let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
            let bytes = c.as_bytes();
            !bytes.is_empty()
                && bytes.first().is_some_and(|b| alnum(*b))
                && bytes.last().is_some_and(|b| alnum(*b))
                && bytes
                    .iter()
                    .all(|b| alnum(*b) || matches!(b, b'.' | b'_' | b'-'))
                && !c.contains("..")
                && !c.contains("___")
        })
}

/// `vX.Y.Z` with an optional pre-release (`v1.14.0-beta.1`).
fn is_talos_version(tag: &str) -> bool {
    let Some(rest) = tag.strip_prefix('v') else {
        return false;
    };
    let (core, pre_ok) = match rest.split_once('-') {
        Some((core, pre)) => (core, !pre.is_empty()),
        None => (rest, true),
    };
    let numbers: Vec<&str> = core.split('.').collect();
    pre_ok
        && numbers.len() == 3
        && numbers
            .iter()
            .all(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// A machine's state as the core sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Core {
    /// Current API mode.
    pub mode: Mode,
    /// The config on disk (STATE). Kept across a reboot into maintenance mode.
    pub config: Option<ParsedConfig>,
    /// Bootstrap was called (etcd has data).
    pub bootstrapped: bool,
    /// Bumped on every mode change: connections of an older generation belong to a machine
    /// that has since rebooted, and are answered Unavailable.
    pub generation: u64,
    /// The Talos version an Upgrade installed (`None`: the one the machine booted with).
    pub installed: Option<String>,
}

/// What Reset or a reboot asks the edge to do, besides the state change.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Effects {
    /// Stop this machine's control plane (it ran etcd and the API server).
    pub stop_control_plane: bool,
    /// Remove this worker's Node from its cluster: (cluster id, node name).
    pub leave_cluster: Option<(Option<String>, String)>,
    /// Delete the config file (STATE wiped).
    pub wipe_config: bool,
    /// Forget the maintenance identity (full wipe).
    pub forget_identity: bool,
}

/// A validated Reset request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResetPlan {
    /// Empty partition list: the whole system disk.
    pub full_wipe: bool,
}

const SYSTEM_LABELS: [&str; 6] = ["STATE", "EPHEMERAL", "META", "BOOT", "EFI", "BIOS"];

/// Validates a Reset request's partitions (mode: 0 ALL, 1 SYSTEM_DISK, 2 USER_DISKS).
pub fn plan_reset(
    labels: &[String],
    user_disks: &[String],
    mode: i32,
) -> Result<ResetPlan, Refusal> {
    if mode == 1 && !user_disks.is_empty() {
        return Err(Refusal::InvalidArgument(
            "user disks cannot be wiped in system disk mode".to_owned(),
        ));
    }
    if mode == 2 && !labels.is_empty() {
        return Err(Refusal::InvalidArgument(
            "system partitions cannot be wiped in user disks mode".to_owned(),
        ));
    }
    if let Some(bad) = labels.iter().find(|l| !SYSTEM_LABELS.contains(&l.as_str())) {
        return Err(Refusal::InvalidArgument(format!(
            "unknown system partition label {bad:?}"
        )));
    }
    if !labels.is_empty() && !labels.iter().any(|l| l == "STATE") {
        return Err(Refusal::Unimplemented(
            "the emulator only resets with STATE wiped".to_owned(),
        ));
    }
    Ok(ResetPlan {
        full_wipe: labels.is_empty(),
    })
}

impl Core {
    /// A new machine in maintenance mode.
    pub fn new() -> Self {
        Self {
            mode: Mode::Maintenance,
            config: None,
            bootstrapped: false,
            generation: 0,
            installed: None,
        }
    }

    /// A restored machine: configured if a config is on disk and it was configured.
    pub fn restored(config: Option<ParsedConfig>, configured: bool) -> Self {
        let mode = if configured && config.is_some() {
            Mode::Configured
        } else {
            Mode::Maintenance
        };
        Self {
            mode,
            config,
            bootstrapped: false,
            generation: 0,
            installed: None,
        }
    }

    /// The hostname: from the config, else the default.
    pub fn hostname(&self, facts: &Facts) -> String {
        self.config
            .as_ref()
            .and_then(|c| c.hostname.clone())
            .unwrap_or_else(|| facts.default_hostname())
    }

    /// The active config (configured mode only).
    pub fn active_config(&self) -> Option<&ParsedConfig> {
        match self.mode {
            Mode::Configured => self.config.as_ref(),
            Mode::Maintenance => None,
        }
    }

    /// ApplyConfiguration with an already validated config.
    pub fn apply(&mut self, config: ParsedConfig) -> Result<(), Refusal> {
        match self.mode {
            Mode::Maintenance => {
                self.config = Some(config);
                self.mode = Mode::Configured;
                self.bootstrapped = false;
                self.generation += 1;
                Ok(())
            }
            Mode::Configured => Err(Refusal::Unimplemented(
                "the emulator does not reconfigure a configured machine".to_owned(),
            )),
        }
    }

    /// ApplyConfiguration on a configured machine: the new config replaces the running one
    /// (the cluster, its etcd data and the mode are kept). A config for another cluster or
    /// of another machine type is refused: the emulator does not move a running machine.
    pub fn reconfigure(&mut self, config: ParsedConfig) -> Result<(), Refusal> {
        let Some(current) = self.active_config() else {
            return Err(Refusal::FailedPrecondition(
                "reconfiguring needs a configured machine".to_owned(),
            ));
        };
        if current.machine_type != config.machine_type
            || current.cluster_id != config.cluster_id
            || current.os_ca.cert_pem.trim() != config.os_ca.cert_pem.trim()
            || current.kubernetes_ca.cert_pem.trim() != config.kubernetes_ca.cert_pem.trim()
        {
            return Err(Refusal::Unimplemented(
                "the emulator does not move a configured machine to another cluster or role"
                    .to_owned(),
            ));
        }
        self.config = Some(config);
        Ok(())
    }

    /// Bootstrap: control planes only, once.
    pub fn bootstrap(&mut self) -> Result<(), Refusal> {
        let Some(config) = self.active_config() else {
            return Err(Refusal::FailedPrecondition(
                "bootstrap is not available yet".to_owned(),
            ));
        };
        if !config.machine_type.is_control_plane() {
            return Err(Refusal::Unimplemented(
                "bootstrap is only available on control plane nodes".to_owned(),
            ));
        }
        if self.bootstrapped {
            return Err(Refusal::AlreadyExists(
                "etcd data directory is not empty".to_owned(),
            ));
        }
        self.bootstrapped = true;
        Ok(())
    }

    /// Reset (already planned): back to maintenance mode with STATE and EPHEMERAL gone.
    pub fn reset(&mut self, plan: &ResetPlan, facts: &Facts) -> Result<Effects, Refusal> {
        let Some(config) = self.active_config() else {
            return Err(Refusal::FailedPrecondition(
                "reset needs a configured machine".to_owned(),
            ));
        };
        let control_plane = config.machine_type.is_control_plane();
        let effects = Effects {
            stop_control_plane: control_plane,
            // A control plane that bootstrapped stops its cluster; any other leaves the
            // cluster it joined.
            leave_cluster: Some((config.cluster_id.clone(), self.hostname(facts))),
            wipe_config: true,
            forget_identity: plan.full_wipe,
        };
        self.mode = Mode::Maintenance;
        self.config = None;
        self.bootstrapped = false;
        self.generation += 1;
        if plan.full_wipe {
            // BOOT is gone too: the machine boots its boot media's version again.
            self.installed = None;
        }
        Ok(effects)
    }

    /// Upgrade: the installer's version becomes the installed one, and the machine reboots
    /// into it (configured, its config and etcd data kept). Refused on a machine that is not
    /// configured, which Talos cannot upgrade in place.
    pub fn upgrade(&mut self, version: String) -> Result<(), Refusal> {
        if self.active_config().is_none() {
            return Err(Refusal::FailedPrecondition(
                "upgrade needs an installed, configured machine".to_owned(),
            ));
        }
        self.installed = Some(version);
        self.reboot_in_place();
        Ok(())
    }

    /// A reboot that keeps everything (config, mode, etcd data): only connections made
    /// before it are stale.
    pub fn reboot_in_place(&mut self) {
        self.generation += 1;
    }

    /// A reboot into maintenance mode: processes stop, the config stays on disk, and the
    /// machine's Node stays registered (a rebooted kubelet does not delete its Node).
    pub fn reboot_to_maintenance(&mut self) -> Effects {
        let stop_control_plane = self
            .active_config()
            .is_some_and(|c| c.machine_type.is_control_plane());
        self.mode = Mode::Maintenance;
        self.bootstrapped = false;
        self.generation += 1;
        Effects {
            stop_control_plane,
            ..Effects::default()
        }
    }
}

impl Default for Core {
    fn default() -> Self {
        Self::new()
    }
}

pub mod resources;

#[cfg(test)]
mod tests;
