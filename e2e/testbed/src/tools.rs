//! Where the test-bed binaries live.
//!
//! They are built from the pinned Go modules in `e2e/testbed/tools/` by `build-tools.sh`
//! into a cache outside the checkout. `KONTINUUM_TESTBED_BIN` points at that `bin`
//! directory (the Makefile sets it); without it the script is run, which is a no-op when
//! the cache is warm and prints the directory.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::Error;

/// Environment variable naming the directory that holds the built tools.
pub const BIN_ENV: &str = "KONTINUUM_TESTBED_BIN";

/// The script that builds (or finds) the tools.
pub const BUILD_SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/build-tools.sh");

/// The directory of test-bed binaries.
#[derive(Clone, Debug)]
pub struct Tools {
    bin: PathBuf,
}

impl Tools {
    /// Uses `KONTINUUM_TESTBED_BIN`, or runs the build script to find (or build) the tools.
    pub fn locate() -> Result<Self, Error> {
        let bin = match std::env::var_os(BIN_ENV) {
            Some(dir) if !dir.is_empty() => PathBuf::from(dir),
            _ => {
                let out = Command::new("bash")
                    .arg(BUILD_SCRIPT)
                    .output()
                    .map_err(|source| Error::Io {
                        what: "running build-tools.sh".into(),
                        source,
                    })?;
                if !out.status.success() {
                    return Err(Error::Tools(format!(
                        "build-tools.sh failed: {}",
                        String::from_utf8_lossy(&out.stderr).trim()
                    )));
                }
                let stdout = String::from_utf8_lossy(&out.stdout);
                PathBuf::from(stdout.lines().last().unwrap_or_default().trim())
            }
        };
        Self::at(bin)
    }

    /// Uses the given directory, checking that every tool the control plane needs is there.
    pub fn at(bin: impl Into<PathBuf>) -> Result<Self, Error> {
        let tools = Self { bin: bin.into() };
        for name in [
            "etcd",
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler",
            "kwok",
        ] {
            let path = tools.path(name);
            if !path.is_file() {
                return Err(Error::Tools(format!("{} is missing", path.display())));
            }
        }
        Ok(tools)
    }

    /// The bin directory.
    pub fn dir(&self) -> &Path {
        &self.bin
    }

    /// The path of one tool, e.g. `kubectl` or `helm`.
    pub fn path(&self, name: &str) -> PathBuf {
        self.bin.join(name)
    }

    /// The KWOK stage files (node-initialize, heartbeat, pod-ready, pod-complete, pod-delete).
    pub fn kwok_stages(&self) -> Result<Vec<PathBuf>, Error> {
        let dir = self.bin.join("kwok-stages");
        let entries = std::fs::read_dir(&dir).map_err(|source| Error::Io {
            what: format!("reading {}", dir.display()),
            source,
        })?;
        let mut stages: Vec<PathBuf> = entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
            .collect();
        stages.sort();
        if stages.is_empty() {
            return Err(Error::Tools(format!("no KWOK stages in {}", dir.display())));
        }
        Ok(stages)
    }
}
