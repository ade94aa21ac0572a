//! A long-running child process of a benchmark (a store, a proxy): its output goes to a log
//! file, it dies with the benchmark (`setpriv --pdeathsig KILL`, kill-on-drop), and `stop`
//! ends it gracefully (SIGTERM, then SIGKILL after a grace period).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::process::Command;

/// A running child process.
pub struct Child {
    name: String,
    process: tokio::process::Child,
    pid: u32,
    /// Where its stdout and stderr go.
    pub log: PathBuf,
}

impl Child {
    /// Starts `bin args...`, appending its output to `log`.
    pub fn spawn(name: &str, bin: &Path, args: &[String], log: PathBuf) -> anyhow::Result<Self> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .with_context(|| format!("opening {}", log.display()))?;
        let child = Command::new("setpriv")
            .args(["--pdeathsig", "KILL", "--"])
            .arg(bin)
            .args(args)
            .stdin(Stdio::null())
            .stdout(file.try_clone().context("duplicating a log handle")?)
            .stderr(file)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {name} ({})", bin.display()))?;
        let pid = child.id().context("the child has no pid")?;
        Ok(Self {
            name: name.to_owned(),
            process: child,
            pid,
            log,
        })
    }

    /// Its process id (`setpriv` execs the binary, so this is the binary's own).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Fails, quoting the end of its log, if it has exited.
    pub fn check_alive(&mut self) -> anyhow::Result<()> {
        match self.process.try_wait()? {
            Some(status) => Err(self.exited(status)),
            None => Ok(()),
        }
    }

    /// Polls `ready` every 20 ms until it holds, failing if the process exits or `limit`
    /// passes first.
    pub async fn wait_until<F, Fut>(
        &mut self,
        what: &str,
        limit: Duration,
        mut ready: F,
    ) -> anyhow::Result<()>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = bool>,
    {
        let start = Instant::now();
        loop {
            self.check_alive()?;
            if ready().await {
                return Ok(());
            }
            if start.elapsed() > limit {
                bail!(
                    "{} did not {what} within {limit:?}; end of {}:\n{}",
                    self.name,
                    self.log.display(),
                    tail(&self.log)
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until the process exits; fails, quoting the end of its log, unless it exited
    /// successfully. Cancel-safe (a `select!` branch).
    pub async fn wait_success(&mut self) -> anyhow::Result<()> {
        let status = self
            .process
            .wait()
            .await
            .with_context(|| format!("waiting for {}", self.name))?;
        if status.success() {
            Ok(())
        } else {
            Err(self.exited(status))
        }
    }

    /// That it exited with `status`, quoting the end of its log.
    fn exited(&self, status: std::process::ExitStatus) -> anyhow::Error {
        anyhow::anyhow!(
            "{} exited ({status}); end of {}:\n{}",
            self.name,
            self.log.display(),
            tail(&self.log)
        )
    }

    /// SIGTERM, then SIGKILL after `grace`.
    pub async fn stop(mut self, grace: Duration) {
        if let Ok(pid) = i32::try_from(self.pid) {
            // An error means it is gone already.
            let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
        }
        if tokio::time::timeout(grace, self.process.wait())
            .await
            .is_err()
        {
            let _ = self.process.kill().await;
        }
    }
}

/// The last lines of a log file.
fn tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}
