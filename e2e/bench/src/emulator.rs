//! The `talos-emulator` binary as a child process, so that its memory can be read from
//! `/proc/<pid>` apart from the benchmark's own.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use tokio::io::{AsyncBufReadExt as _, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

/// How to start the emulator.
#[derive(Clone, Debug)]
pub struct Options {
    pub binary: PathBuf,
    pub machines: usize,
    pub first_address: Ipv4Addr,
    pub port: u16,
    pub dir: PathBuf,
    pub log_level: String,
    /// Give up waiting for the `listening` lines after this long.
    pub start_timeout: Duration,
}

/// Start-up figures.
#[derive(Clone, Copy, Debug)]
pub struct Startup {
    /// Spawn to the first `listening` line.
    pub first_listening: Duration,
    /// Spawn to the last `listening` line.
    pub all_listening: Duration,
}

/// A running emulator.
pub struct EmulatorProcess {
    child: Child,
    pid: u32,
    /// The Talos API address of every machine, in order.
    pub addresses: Vec<SocketAddr>,
    /// The HTTP fault-injection interface.
    pub control: Option<SocketAddr>,
    pub startup: Startup,
    pub log: PathBuf,
    _stdout: Lines<BufReader<ChildStdout>>,
}

/// The `talos-emulator` next to this executable (`target/<profile>/`), else on `PATH`.
pub fn default_binary() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|dir| dir.join("talos-emulator")))
        .filter(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from("talos-emulator"))
}

impl EmulatorProcess {
    /// Spawns the emulator (stderr to `<dir>/emulator.log`) and waits for every `listening`
    /// line and the `control` line.
    pub async fn start(options: &Options) -> anyhow::Result<Self> {
        std::fs::create_dir_all(&options.dir)
            .with_context(|| format!("creating {}", options.dir.display()))?;
        let log = options.dir.join("emulator.log");
        let stderr =
            std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let started = Instant::now();
        let mut child = Command::new(&options.binary)
            .arg("--machines")
            .arg(options.machines.to_string())
            .arg("--first-address")
            .arg(options.first_address.to_string())
            .arg("--port")
            .arg(options.port.to_string())
            .arg("--api-port")
            .arg("0")
            .arg("--dir")
            .arg(options.dir.join("machines"))
            .arg("--log-level")
            .arg(&options.log_level)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| {
                format!(
                    "starting {} (build it: cargo build --release -p talos-emulator, or pass --emulator-bin)",
                    options.binary.display()
                )
            })?;
        let pid = child.id().context("the emulator exited at once")?;
        let stdout = child.stdout.take().context("no stdout pipe")?;
        let mut lines = BufReader::new(stdout).lines();

        let mut addresses = Vec::with_capacity(options.machines);
        let mut first_listening = None;
        let mut all_listening = None;
        let mut control = None;
        let deadline = tokio::time::Instant::now() + options.start_timeout;
        while all_listening.is_none() || control.is_none() {
            let line = match tokio::time::timeout_at(deadline, lines.next_line()).await {
                Ok(line) => line.context("reading the emulator's stdout")?,
                Err(_) => bail!(
                    "the emulator printed {} of {} listening lines in {:?}; see {}",
                    addresses.len(),
                    options.machines,
                    options.start_timeout,
                    log.display()
                ),
            };
            let Some(line) = line else {
                let status = child.wait().await.ok();
                bail!(
                    "the emulator ended ({status:?}) after {} listening lines; see {}",
                    addresses.len(),
                    log.display()
                );
            };
            if let Some(addr) = line.strip_prefix("listening ") {
                let addr: SocketAddr = addr
                    .trim()
                    .parse()
                    .with_context(|| format!("bad line {line:?}"))?;
                addresses.push(addr);
                first_listening.get_or_insert_with(|| started.elapsed());
                if addresses.len() == options.machines {
                    all_listening = Some(started.elapsed());
                }
            } else if let Some(addr) = line.strip_prefix("control ") {
                control = Some(
                    addr.trim()
                        .parse()
                        .with_context(|| format!("bad line {line:?}"))?,
                );
                if all_listening.is_none() {
                    bail!(
                        "control line after {} of {} listening lines",
                        addresses.len(),
                        options.machines
                    );
                }
            }
        }
        Ok(Self {
            child,
            pid,
            addresses,
            control,
            startup: Startup {
                first_listening: first_listening.unwrap_or_default(),
                all_listening: all_listening.unwrap_or_default(),
            },
            log,
            _stdout: lines,
        })
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The machines' IPv4 addresses, in order.
    pub fn ipv4_addresses(&self) -> anyhow::Result<Vec<Ipv4Addr>> {
        self.addresses
            .iter()
            .map(|a| match a.ip() {
                std::net::IpAddr::V4(v4) => Ok(v4),
                std::net::IpAddr::V6(_) => bail!("IPv6 emulator address {a}"),
            })
            .collect()
    }

    /// SIGTERM (the emulator stops its control planes gracefully), SIGKILL after `grace`.
    pub async fn stop(mut self, grace: Duration) -> anyhow::Result<()> {
        if let Ok(pid) = i32::try_from(self.pid) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
        if let Ok(status) = tokio::time::timeout(grace, self.child.wait()).await {
            status.context("waiting for the emulator")?;
        } else {
            self.child
                .kill()
                .await
                .context("killing the emulator after its grace period")?;
            bail!(
                "the emulator did not stop within {grace:?} of SIGTERM; killed (control-plane children may be left)"
            );
        }
        Ok(())
    }
}

/// The state directory of one run: `<base>/<prefix>-<pid>-<n>`, `base` being the test bed's
/// (`KONTINUUM_TESTBED_DIR` or `target/testbed`), whose housekeeping frees old etcd data.
pub fn run_dir(prefix: &str, dir: Option<&Path>) -> PathBuf {
    dir.map_or_else(|| kontinuum_testbed::unique_dir(prefix), Path::to_path_buf)
}

/// `port` if it can be bound on `address` now, else a free one there.
pub fn usable_port(address: Ipv4Addr, port: u16) -> anyhow::Result<u16> {
    if std::net::TcpListener::bind((address, port)).is_ok() {
        return Ok(port);
    }
    let listener = std::net::TcpListener::bind((address, 0))
        .with_context(|| format!("binding {address}:0"))?;
    Ok(listener
        .local_addr()
        .context("reading a local address")?
        .port())
}
