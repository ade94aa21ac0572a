//! Starting one container process.
//!
//! The workspace forbids `unsafe`, so there is no `pre_exec` hook: instead the hostlet
//! re-executes itself as `hostlet exec-container --spec <file>` ([`exec_container`]),
//! which enters a private mount (and UTS) namespace, bind-mounts the pod's volumes and the
//! image's files at their in-container paths, drops privileges, asks the kernel to kill it
//! when the hostlet dies, and `execve`s the container's program, so the process the hostlet
//! waits for IS the container's process.

use std::convert::Infallible;
use std::ffi::CString;
use std::io::Write as _;
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::process::Stdio;

use nix::mount::{MsFlags, mount};
use nix::sched::{CloneFlags, unshare};
use nix::sys::signal::Signal;
use nix::unistd::{Gid, Uid, getppid, setgid, setgroups, setuid};
use serde::{Deserialize, Serialize};

/// The name of the hidden subcommand.
pub const SUBCOMMAND: &str = "exec-container";

/// What the marker file holds once the program is about to be executed.
pub const MARKER_EXEC: &str = "exec\n";

/// Everything `exec-container` needs, written by the hostlet as JSON (mode 0600: it holds
/// the container's environment).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ExecSpec {
    /// The host file to execute; `None` searches `argv[0]` along the container's `PATH`
    /// inside the namespace (exec probes).
    pub program: Option<PathBuf>,
    /// The argv.
    pub argv: Vec<String>,
    /// The environment.
    pub env: Vec<(String, String)>,
    /// The working directory (created if missing, as runc does).
    pub working_dir: String,
    /// Bind mounts, in order.
    pub mounts: Vec<MountSpec>,
    /// The hostname (the pod's name).
    pub hostname: String,
    /// User id.
    pub uid: u32,
    /// Primary group id.
    pub gid: u32,
    /// Supplementary groups (fsGroup and supplementalGroups).
    pub groups: Vec<u32>,
    /// Set `no_new_privs` (allowPrivilegeEscalation: false).
    pub no_new_privs: bool,
    /// Remount `/` read-only (readOnlyRootFilesystem).
    pub read_only_root: bool,
    /// The hostlet's pid: if it is gone by the time we are ready, do not run.
    pub parent_pid: i32,
    /// A file that gets [`MARKER_EXEC`] just before `execve` (to tell a start failure from
    /// the program's own exit).
    pub marker: Option<PathBuf>,
}

/// One bind mount.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MountSpec {
    /// Host path.
    pub source: PathBuf,
    /// Path inside the container.
    pub target: PathBuf,
    /// Mount read-only.
    pub read_only: bool,
}

/// Errors of `exec-container`; printed to the container's log.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// The spec could not be read.
    #[error("reading container spec {path}")]
    Spec {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The spec is not valid JSON.
    #[error("parsing container spec")]
    SpecJson(#[source] serde_json::Error),
    /// A system call failed.
    #[error("{what}")]
    Sys {
        /// What we were doing.
        what: String,
        /// The cause.
        #[source]
        source: nix::Error,
    },
    /// A file operation failed.
    #[error("{what}")]
    Io {
        /// What we were doing.
        what: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A string held a NUL byte.
    #[error("{0} contains a NUL byte")]
    Nul(String),
    /// The program was not found.
    #[error("executable file {0} not found in $PATH")]
    NotFound(String),
    /// The hostlet died while we were getting ready.
    #[error("the hostlet exited")]
    Orphaned,
}

impl ExecError {
    /// A stable CamelCase reason.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Spec { .. } | Self::SpecJson(_) => "SpecInvalid",
            Self::Sys { .. } | Self::Io { .. } => "SetupFailed",
            Self::Nul(_) => "InvalidString",
            Self::NotFound(_) => "NotFound",
            Self::Orphaned => "Orphaned",
        }
    }
}

fn sys(what: impl Into<String>) -> impl FnOnce(nix::Error) -> ExecError {
    let what = what.into();
    move |source| ExecError::Sys { what, source }
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> ExecError {
    let what = what.into();
    move |source| ExecError::Io { what, source }
}

/// Writes a spec file readable by root only.
pub fn write_spec(path: &Path, spec: &ExecSpec) -> std::io::Result<()> {
    let json = serde_json::to_vec(spec).map_err(std::io::Error::other)?;
    let tmp = path.with_extension("tmp");
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .and_then(|mut f| f.write_all(&json))?;
    std::fs::rename(&tmp, path)
}

/// A command that runs `exec-container` with `spec`: in its own process group, stdin from
/// `/dev/null`, stdout and stderr appended to `log`, killed if the handle is dropped.
pub fn command(spec: &Path, log: &Path) -> std::io::Result<tokio::process::Command> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)?;
    let err = file.try_clone()?;
    // /proc/self/exe is this very binary, even if it was rebuilt or removed since.
    let mut cmd = tokio::process::Command::new("/proc/self/exe");
    cmd.arg(SUBCOMMAND)
        .arg("--spec")
        .arg(spec)
        .stdin(Stdio::null())
        .stdout(file)
        .stderr(err)
        .process_group(0)
        .kill_on_drop(true);
    Ok(cmd)
}

/// The body of `hostlet exec-container`: only returns on failure.
pub fn exec_container(spec_path: &Path) -> Result<Infallible, ExecError> {
    let text = std::fs::read(spec_path).map_err(|source| ExecError::Spec {
        path: spec_path.to_path_buf(),
        source,
    })?;
    let spec: ExecSpec = serde_json::from_slice(&text).map_err(ExecError::SpecJson)?;
    // Opened while still root; written as the very last step.
    let mut marker = match &spec.marker {
        Some(path) => Some(
            std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(path)
                .map_err(io(format!("opening {}", path.display())))?,
        ),
        None => None,
    };
    let result = enter(&spec);
    if let (Err(e), Some(m)) = (&result, marker.as_mut()) {
        let _ = writeln!(m, "failed: {e}");
    }
    let program = result?;
    let argv = cstrings(&spec.argv)?;
    let env: Vec<String> = spec.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let env = cstrings(&env)?;
    let path = CString::new(program.as_os_str().as_encoded_bytes())
        .map_err(|_| ExecError::Nul(program.display().to_string()))?;
    if let Some(m) = marker.as_mut() {
        m.write_all(MARKER_EXEC.as_bytes())
            .map_err(io("writing the start marker"))?;
    }
    let err = nix::unistd::execve(&path, &argv, &env)
        .map_err(sys(format!("executing {}", program.display())));
    if let Some(m) = marker.as_mut() {
        let _ = writeln!(m, "failed: execve");
    }
    err
}

/// Sets up the namespace and credentials; returns the program to execute.
fn enter(spec: &ExecSpec) -> Result<PathBuf, ExecError> {
    unshare(CloneFlags::CLONE_NEWNS | CloneFlags::CLONE_NEWUTS)
        .map_err(sys("unsharing the mount namespace"))?;
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(sys("making / private"))?;
    nix::unistd::sethostname(&spec.hostname).map_err(sys("setting the hostname"))?;
    // Open every source before mounting anything: a mount (say an emptyDir at `/work`) may
    // hide the host path of a later source (`/work/main/target/...`).
    let mut sources = Vec::with_capacity(spec.mounts.len());
    for m in &spec.mounts {
        sources.push(Source::open(&m.source)?);
    }
    for (m, source) in spec.mounts.iter().zip(&sources) {
        bind(m, source)?;
    }
    let workdir = Path::new(&spec.working_dir);
    if !workdir.exists() {
        std::fs::create_dir_all(workdir)
            .map_err(io(format!("creating working dir {}", workdir.display())))?;
    }
    if spec.read_only_root {
        mount(
            None::<&str>,
            "/",
            None::<&str>,
            MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY,
            None::<&str>,
        )
        .map_err(sys("remounting / read-only"))?;
    }
    let groups: Vec<Gid> = spec.groups.iter().map(|g| Gid::from_raw(*g)).collect();
    setgroups(&groups).map_err(sys("setting supplementary groups"))?;
    setgid(Gid::from_raw(spec.gid)).map_err(sys("setting the group id"))?;
    setuid(Uid::from_raw(spec.uid)).map_err(sys("setting the user id"))?;
    if spec.no_new_privs {
        nix::sys::prctl::set_no_new_privs().map_err(sys("setting no_new_privs"))?;
    }
    nix::unistd::chdir(workdir).map_err(sys(format!(
        "changing to working dir {}",
        workdir.display()
    )))?;
    // Changing credentials clears the parent-death signal, so set it last; and check that
    // the hostlet did not die before it was set.
    nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(sys("setting pdeathsig"))?;
    if getppid().as_raw() != spec.parent_pid {
        return Err(ExecError::Orphaned);
    }
    if let Some(p) = &spec.program {
        return Ok(p.clone());
    }
    let name = spec.argv.first().cloned().unwrap_or_default();
    let path = spec
        .env
        .iter()
        .rev()
        .find(|(k, _)| k == "PATH")
        .map_or(crate::image_map::DEFAULT_PATH, |(_, v)| v.as_str());
    search_path(&name, path).ok_or(ExecError::NotFound(name))
}

/// A mount source held open (`O_PATH`), mounted through `/proc/self/fd/<n>`.
struct Source {
    fd: std::os::fd::OwnedFd,
    is_dir: bool,
}

impl Source {
    fn open(path: &Path) -> Result<Self, ExecError> {
        let is_dir = path
            .metadata()
            .map_err(io(format!("mount source {}", path.display())))?
            .is_dir();
        let fd = nix::fcntl::open(
            path,
            nix::fcntl::OFlag::O_PATH | nix::fcntl::OFlag::O_CLOEXEC,
            nix::sys::stat::Mode::empty(),
        )
        .map_err(sys(format!("opening mount source {}", path.display())))?;
        Ok(Self { fd, is_dir })
    }

    fn proc_path(&self) -> PathBuf {
        use std::os::fd::AsRawFd as _;
        PathBuf::from(format!("/proc/self/fd/{}", self.fd.as_raw_fd()))
    }
}

fn bind(m: &MountSpec, source: &Source) -> Result<(), ExecError> {
    let source_is_dir = source.is_dir;
    if m.source == m.target && !m.read_only {
        return Ok(());
    }
    // A missing mount point is created on the host file system (the mount namespace is
    // private, the file system is not): an empty directory, or an empty file with no
    // permissions, which PATH lookups of host processes skip.
    if !m.target.exists() {
        if source_is_dir {
            std::fs::create_dir_all(&m.target)
                .map_err(io(format!("creating mount point {}", m.target.display())))?;
        } else {
            if let Some(parent) = m.target.parent() {
                std::fs::create_dir_all(parent)
                    .map_err(io(format!("creating {}", parent.display())))?;
            }
            std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o000)
                .open(&m.target)
                .map_err(io(format!("creating mount point {}", m.target.display())))?;
        }
    }
    mount(
        Some(&source.proc_path()),
        &m.target,
        None::<&str>,
        MsFlags::MS_BIND | MsFlags::MS_REC,
        None::<&str>,
    )
    .map_err(sys(format!(
        "bind-mounting {} at {}",
        m.source.display(),
        m.target.display()
    )))?;
    if m.read_only {
        mount(
            None::<&str>,
            &m.target,
            None::<&str>,
            MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY,
            None::<&str>,
        )
        .map_err(sys(format!("remounting {} read-only", m.target.display())))?;
    }
    Ok(())
}

/// The first executable `<dir>/<name>` along `path` (or `name` itself if it has a slash).
pub fn search_path(name: &str, path: &str) -> Option<PathBuf> {
    let executable = |p: &Path| {
        p.metadata()
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if name.is_empty() {
        return None;
    }
    if name.contains('/') {
        let p = PathBuf::from(name);
        return executable(&p).then_some(p);
    }
    path.split(':')
        .filter(|d| !d.is_empty())
        .map(|d| Path::new(d).join(name))
        .find(|p| executable(p))
}

fn cstrings(items: &[String]) -> Result<Vec<CString>, ExecError> {
    items
        .iter()
        .map(|s| CString::new(s.as_bytes()).map_err(|_| ExecError::Nul(s.clone())))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_search_finds_executables_only() {
        assert_eq!(
            search_path("sh", "/nonexistent:/bin"),
            Some(PathBuf::from("/bin/sh"))
        );
        assert_eq!(search_path("/bin/sh", ""), Some(PathBuf::from("/bin/sh")));
        assert_eq!(search_path("passwd", "/etc"), None);
        assert_eq!(search_path("", "/bin"), None);
    }

    #[test]
    fn specs_round_trip_through_a_root_only_file() {
        let dir = std::env::temp_dir().join(format!("hostlet-spec-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("c.spec.json");
        let spec = ExecSpec {
            argv: vec!["sh".into()],
            env: vec![("A".into(), "b".into())],
            ..ExecSpec::default()
        };
        write_spec(&path, &spec).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let back: ExecSpec = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(back.env, spec.env);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
