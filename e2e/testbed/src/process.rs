//! Child processes of a control plane: logs to files, killed with the test.
//!
//! Every component runs under `setpriv --pdeathsig KILL`, so the kernel kills it when the
//! thread that started it dies, even if the test binary panics or is killed; and in its own
//! process group, so a terminal's Ctrl-C reaches the harness, which stops the components in
//! order. `kill_on_drop` covers a `ControlPlane` dropped without `stop()`.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::process::{Child, Command};

use crate::Error;

/// How long a component gets to exit after SIGTERM before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// One running component.
pub struct Component {
    name: &'static str,
    child: Child,
    log: PathBuf,
}

impl Component {
    /// Starts `bin` with `args`, appending stdout and stderr to `<log_dir>/<name>.log`.
    pub fn spawn(
        name: &'static str,
        bin: &Path,
        args: &[String],
        log_dir: &Path,
    ) -> Result<Self, Error> {
        Self::spawn_logged(name, name, bin, args, log_dir)
    }

    /// Like [`Component::spawn`], logging to `<log_dir>/<log_stem>.log` (for several
    /// components of one kind, such as hostlets).
    pub fn spawn_logged(
        name: &'static str,
        log_stem: &str,
        bin: &Path,
        args: &[String],
        log_dir: &Path,
    ) -> Result<Self, Error> {
        let log = log_dir.join(format!("{log_stem}.log"));
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .map_err(|source| Error::Io {
                what: format!("opening {}", log.display()),
                source,
            })?;
        let err_file = file.try_clone().map_err(|source| Error::Io {
            what: format!("opening {}", log.display()),
            source,
        })?;
        let child = Command::new("setpriv")
            .arg("--pdeathsig")
            .arg("KILL")
            .arg("--")
            .arg(bin)
            .args(args)
            .stdin(Stdio::null())
            .stdout(file)
            .stderr(err_file)
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .map_err(|source| Error::Io {
                what: format!("starting {name}"),
                source,
            })?;
        Ok(Self { name, child, log })
    }

    /// The component's name.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Fails if the process has exited, quoting the end of its log.
    pub fn check_alive(&mut self) -> Result<(), Error> {
        match self.child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => Err(Error::Exited {
                component: self.name,
                status: status.to_string(),
                log_tail: tail(&self.log, 15),
            }),
            Err(source) => Err(Error::Io {
                what: format!("waiting for {}", self.name),
                source,
            }),
        }
    }

    /// SIGTERM, then SIGKILL after a grace period.
    pub async fn stop(&mut self) {
        if let Some(pid) = self.child.id().and_then(|id| i32::try_from(id).ok()) {
            // An error here means the process is already gone, which is what we want.
            let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
        }
        if tokio::time::timeout(STOP_GRACE, self.child.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                component = self.name,
                "component ignored SIGTERM; killing it"
            );
            let _ = self.child.kill().await;
        }
    }
}

/// The last `lines` lines of a log file (empty if it cannot be read).
pub fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
