//! Our small async wrapper around the `helm` CLI.
//!
//! * Arguments are a vector, never a command line split on spaces.
//! * Values go to helm's stdin (`-f -`) as JSON (which is YAML), never into arguments.
//! * Every call has an explicit timeout; on expiry the process is killed.
//! * The downstream kubeconfig is written to a temporary file (mode 0600) that is removed
//!   when the call ends; it is never logged, and the operator's own `KUBECONFIG` never
//!   reaches helm (the environment is cleared).
//! * Helm's cache, config and data directories live under one writable directory, so helm
//!   works on a read-only root filesystem.
//! * A failure keeps the end of helm's stderr in the error's `stderr` field, never in its
//!   `Display`: helm can echo chart values there, and `Display` reaches condition messages,
//!   Events and info+ logs. The stderr is logged once, at debug, where the call fails.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::Deserialize;
use tokio::io::AsyncWriteExt as _;

use crate::resolve::{ChartRef, InstallRequest};

/// Label, on a Helm release (and so on its storage Secret), holding the desired-state hash
/// the revision was made from.
pub const HASH_LABEL: &str = "kontinuum.sh/desired-hash";

/// How much of helm's stderr an error keeps (the end, where the cause is).
const STDERR_LIMIT: usize = 4096;

/// Environment variables passed through to helm (proxies for air-gapped sites).
const PASS_ENV: &[&str] = &[
    "PATH",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
];

/// A helm call that did not succeed.
#[derive(Debug, thiserror::Error)]
pub enum HelmError {
    /// helm could not be started.
    #[error("starting {bin}")]
    Spawn {
        /// The binary.
        bin: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Writing the temporary kubeconfig or helm's directories failed.
    #[error("preparing helm's files")]
    Files(#[source] std::io::Error),
    /// helm did not finish in time and was killed.
    #[error("helm {verb} timed out after {timeout:?} and was killed")]
    Timeout {
        /// The helm command (`upgrade`, `template`, ...).
        verb: &'static str,
        /// The limit.
        timeout: Duration,
    },
    /// helm exited non-zero. The message names the call and its exit status only; helm's
    /// output (which may hold values) is in `stderr` and the operator's debug log.
    #[error("helm {verb} failed ({status}); the operator's log has helm's output")]
    Failed {
        /// The helm command.
        verb: &'static str,
        /// Exit status.
        status: String,
        /// The end of helm's stderr.
        stderr: String,
    },
    /// helm's output could not be parsed.
    #[error("helm {verb} printed unexpected output: {message}")]
    Output {
        /// The helm command.
        verb: &'static str,
        /// What was wrong.
        message: String,
    },
}

/// Counts of helm invocations by verb, for metrics and benchmarks.
#[derive(Debug, Default)]
pub struct Invocations {
    upgrade: AtomicU64,
    template: AtomicU64,
    uninstall: AtomicU64,
    rollback: AtomicU64,
    history: AtomicU64,
}

impl Invocations {
    fn counter(&self, verb: &str) -> Option<&AtomicU64> {
        match verb {
            "upgrade" => Some(&self.upgrade),
            "template" => Some(&self.template),
            "uninstall" => Some(&self.uninstall),
            "rollback" => Some(&self.rollback),
            "history" => Some(&self.history),
            _ => None,
        }
    }

    /// `(verb, count)` for every verb.
    pub fn snapshot(&self) -> Vec<(&'static str, u64)> {
        ["upgrade", "template", "uninstall", "rollback", "history"]
            .into_iter()
            .map(|v| (v, self.counter(v).map_or(0, |c| c.load(Ordering::Relaxed))))
            .collect()
    }
}

/// The helm CLI.
#[derive(Clone, Debug)]
pub struct Helm {
    bin: PathBuf,
    home: PathBuf,
    timeout: Duration,
    invocations: Arc<Invocations>,
    metrics: Option<Arc<kontinuum_operator_common::metrics::ControllerMetrics>>,
}

/// One entry of `helm history -o json`.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct HistoryEntry {
    /// Revision number.
    pub revision: i64,
    /// `deployed`, `failed`, `pending-install`, `pending-upgrade`, `superseded`, ...
    pub status: String,
    /// `<chart>-<version>`.
    #[serde(default)]
    pub chart: String,
    /// Description of the revision.
    #[serde(default)]
    pub description: String,
}

impl Helm {
    /// A wrapper calling `bin` (a path, or a name looked up on `PATH`), keeping helm's
    /// cache/config/data under `home`, killing any call after `timeout`.
    pub fn new(bin: impl Into<PathBuf>, home: impl Into<PathBuf>, timeout: Duration) -> Self {
        Self {
            bin: bin.into(),
            home: home.into(),
            timeout,
            invocations: Arc::new(Invocations::default()),
            metrics: None,
        }
    }

    /// Also counts every invocation in `metrics` (`external_calls_total{system="helm"}`).
    #[must_use]
    pub fn with_metrics(
        mut self,
        metrics: Arc<kontinuum_operator_common::metrics::ControllerMetrics>,
    ) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// The invocation counters.
    pub fn invocations(&self) -> Arc<Invocations> {
        self.invocations.clone()
    }

    /// The call timeout.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// `helm upgrade --install` without `--wait`, values on stdin, the desired-state hash
    /// as a release label. Creates the namespace.
    pub async fn upgrade_install(
        &self,
        kubeconfig: &str,
        request: &InstallRequest,
    ) -> Result<(), HelmError> {
        let args = upgrade_args(request, self.timeout);
        let values = serde_json::to_vec(&request.values).unwrap_or_default();
        self.run("upgrade", args, Some(&values), Some(kubeconfig))
            .await
            .map(drop)
    }

    /// `helm template` of the request (CRDs included, hooks and tests excluded), for
    /// `kube_version`. Returns the rendered manifests.
    pub async fn template(
        &self,
        request: &InstallRequest,
        kube_version: &str,
    ) -> Result<String, HelmError> {
        let args = template_args(request, kube_version);
        let values = serde_json::to_vec(&request.values).unwrap_or_default();
        self.run("template", args, Some(&values), None).await
    }

    /// The release's history, newest last; empty if the release does not exist.
    pub async fn history(
        &self,
        kubeconfig: &str,
        release: &str,
        namespace: &str,
    ) -> Result<Vec<HistoryEntry>, HelmError> {
        let args = strings(&[
            "history",
            release,
            "--namespace",
            namespace,
            "--max",
            "20",
            "-o",
            "json",
        ]);
        match self.run("history", args, None, Some(kubeconfig)).await {
            Ok(out) => serde_json::from_str(&out).map_err(|e| HelmError::Output {
                verb: "history",
                message: e.to_string(),
            }),
            Err(HelmError::Failed { stderr, .. }) if stderr.contains("release: not found") => {
                Ok(Vec::new())
            }
            Err(e) => Err(e),
        }
    }

    /// `helm uninstall` (a missing release is success).
    pub async fn uninstall(
        &self,
        kubeconfig: &str,
        release: &str,
        namespace: &str,
    ) -> Result<(), HelmError> {
        self.release_command(
            "uninstall",
            release,
            namespace,
            &["--ignore-not-found"],
            kubeconfig,
        )
        .await
    }

    /// `helm rollback` to the previous revision (to end a pending upgrade).
    pub async fn rollback(
        &self,
        kubeconfig: &str,
        release: &str,
        namespace: &str,
    ) -> Result<(), HelmError> {
        self.release_command("rollback", release, namespace, &[], kubeconfig)
            .await
    }

    /// `helm <verb> <release> --namespace <namespace> <extra> --timeout <timeout>`.
    async fn release_command(
        &self,
        verb: &'static str,
        release: &str,
        namespace: &str,
        extra: &[&str],
        kubeconfig: &str,
    ) -> Result<(), HelmError> {
        let timeout = format!("{}s", self.timeout.as_secs());
        let mut args = strings(&[verb, release, "--namespace", namespace]);
        args.extend(strings(extra));
        args.extend(strings(&["--timeout", &timeout]));
        self.run(verb, args, None, Some(kubeconfig)).await.map(drop)
    }

    fn prepare_home(&self) -> Result<[(String, PathBuf); 3], HelmError> {
        let dirs = [
            ("HELM_CACHE_HOME".to_string(), self.home.join("cache")),
            ("HELM_CONFIG_HOME".to_string(), self.home.join("config")),
            ("HELM_DATA_HOME".to_string(), self.home.join("data")),
        ];
        for (_, dir) in &dirs {
            create_private_dir(dir).map_err(HelmError::Files)?;
        }
        create_private_dir(&self.home.join("tmp")).map_err(HelmError::Files)?;
        Ok(dirs)
    }

    async fn run(
        &self,
        verb: &'static str,
        args: Vec<OsString>,
        stdin: Option<&[u8]>,
        kubeconfig: Option<&str>,
    ) -> Result<String, HelmError> {
        if let Some(counter) = self.invocations.counter(verb) {
            counter.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(metrics) = &self.metrics {
            metrics.external_call("helm", verb);
        }
        let dirs = self.prepare_home()?;
        // Held until the call ends; removed on drop.
        let kubeconfig_file = match kubeconfig {
            Some(yaml) => Some(write_private_file(&self.home.join("tmp"), yaml)?),
            None => None,
        };
        let mut command = tokio::process::Command::new(&self.bin);
        command.env_clear();
        for name in PASS_ENV {
            if let Some(value) = std::env::var_os(name) {
                command.env(name, value);
            }
        }
        command
            .env("HOME", &self.home)
            .env("TMPDIR", self.home.join("tmp"));
        for (name, dir) in &dirs {
            command.env(name, dir);
        }
        command.args(&args);
        if let Some(file) = &kubeconfig_file {
            command.arg("--kubeconfig").arg(file.path());
        }
        command
            .stdin(if stdin.is_some() {
                std::process::Stdio::piped()
            } else {
                std::process::Stdio::null()
            })
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        let mut child = command.spawn().map_err(|source| HelmError::Spawn {
            bin: self.bin.display().to_string(),
            source,
        })?;
        let writer = match (stdin, child.stdin.take()) {
            (Some(data), Some(mut pipe)) => {
                let data = data.to_vec();
                Some(tokio::spawn(async move {
                    // A failed write shows up as helm's own error about its input.
                    let _ = pipe.write_all(&data).await;
                    let _ = pipe.shutdown().await;
                }))
            }
            _ => None,
        };
        let started = std::time::Instant::now();
        // On timeout the future, and with it the child, is dropped: kill_on_drop kills it.
        let output = tokio::time::timeout(self.timeout, child.wait_with_output())
            .await
            .map_err(|_| HelmError::Timeout {
                verb,
                timeout: self.timeout,
            })?
            .map_err(|source| HelmError::Spawn {
                bin: self.bin.display().to_string(),
                source,
            })?;
        if let Some(writer) = writer {
            writer.abort();
        }
        drop(kubeconfig_file);
        tracing::debug!(
            verb,
            elapsed_ms = started.elapsed().as_millis(),
            success = output.status.success(),
            "helm finished"
        );
        if !output.status.success() {
            let stderr = tail(&String::from_utf8_lossy(&output.stderr), STDERR_LIMIT);
            // Debug only: helm's output may echo values.
            tracing::debug!(verb, stderr = %stderr, "helm failed");
            return Err(HelmError::Failed {
                verb,
                status: output.status.to_string(),
                stderr,
            });
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }
}

fn strings(args: &[&str]) -> Vec<OsString> {
    args.iter().map(OsString::from).collect()
}

fn chart_args(chart: &ChartRef, args: &mut Vec<OsString>) {
    args.push(chart.name.clone().into());
    if let Some(repo) = &chart.repo {
        args.push("--repo".into());
        args.push(repo.clone().into());
    }
    if let Some(version) = &chart.version {
        args.push("--version".into());
        args.push(version.clone().into());
    }
}

/// The arguments of `helm upgrade --install` for a request (without `--kubeconfig`).
pub fn upgrade_args(request: &InstallRequest, timeout: Duration) -> Vec<OsString> {
    let mut args = strings(&["upgrade", "--install", &request.release]);
    chart_args(&request.chart, &mut args);
    args.extend(strings(&[
        "--namespace",
        &request.namespace,
        "--create-namespace",
        "--values",
        "-",
        "--labels",
        &format!("{HASH_LABEL}={}", request.hash),
        "--description",
        &format!("kontinuum addon-installer, desired state {}", request.hash),
        "--history-max",
        "10",
        "--timeout",
        &format!("{}s", timeout.as_secs()),
    ]));
    args
}

/// The arguments of `helm template` for a request.
pub fn template_args(request: &InstallRequest, kube_version: &str) -> Vec<OsString> {
    let mut args = strings(&["template", &request.release]);
    chart_args(&request.chart, &mut args);
    args.extend(strings(&[
        "--namespace",
        &request.namespace,
        "--values",
        "-",
        "--include-crds",
        "--no-hooks",
        "--skip-tests",
        "--kube-version",
        kube_version,
    ]));
    args
}

fn tail(text: &str, limit: usize) -> String {
    let text = text.trim();
    if text.len() <= limit {
        return text.to_string();
    }
    let mut start = text.len() - limit;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    format!("…{}", &text[start..])
}

fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt as _;
    match std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
    {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e),
    }
}

/// A file only the owner can read (tempfile creates it 0600), removed when dropped.
fn write_private_file(dir: &Path, content: &str) -> Result<tempfile::NamedTempFile, HelmError> {
    use std::io::Write as _;
    let mut file = tempfile::Builder::new()
        .prefix("kubeconfig-")
        .tempfile_in(dir)
        .map_err(HelmError::Files)?;
    file.write_all(content.as_bytes())
        .map_err(HelmError::Files)?;
    file.flush().map_err(HelmError::Files)?;
    Ok(file)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use kontinuum_crds::v1alpha2::ProvisioningMethod;
    use serde_json::json;

    use super::*;

    fn request() -> InstallRequest {
        InstallRequest {
            release: "cilium".into(),
            namespace: "kube-system".into(),
            chart: ChartRef {
                repo: Some("http://127.0.0.1:1/charts".into()),
                name: "cilium".into(),
                version: Some("1.20.1".into()),
            },
            method: ProvisioningMethod::HelmUpgradeInstall,
            values: json!({ "a": "with spaces and 'quotes'" })
                .as_object()
                .cloned()
                .unwrap(),
            hash: "abc".into(),
        }
    }

    fn args_str(args: &[OsString]) -> Vec<String> {
        args.iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn upgrade_never_waits_and_reads_values_from_stdin() {
        let args = args_str(&upgrade_args(&request(), Duration::from_secs(90)));
        assert_eq!(&args[..4], ["upgrade", "--install", "cilium", "cilium"]);
        assert!(!args.iter().any(|a| a.starts_with("--wait")), "{args:?}");
        let pos = |flag: &str| args.iter().position(|a| a == flag).unwrap();
        assert_eq!(args[pos("--values") + 1], "-");
        assert_eq!(args[pos("--repo") + 1], "http://127.0.0.1:1/charts");
        assert_eq!(args[pos("--version") + 1], "1.20.1");
        assert_eq!(args[pos("--labels") + 1], "kontinuum.sh/desired-hash=abc");
        assert_eq!(args[pos("--timeout") + 1], "90s");
        assert!(args.contains(&"--create-namespace".to_string()));
        assert!(
            !args.iter().any(|a| a.contains("spaces")),
            "values never go into arguments"
        );
    }

    #[test]
    fn template_includes_crds_and_excludes_hooks() {
        let mut r = request();
        r.chart = ChartRef {
            repo: None,
            name: "oci://registry/charts/x".into(),
            version: None,
        };
        let args = args_str(&template_args(&r, "v1.37.0"));
        assert_eq!(
            &args[..3],
            ["template", "cilium", "oci://registry/charts/x"]
        );
        for flag in ["--include-crds", "--no-hooks", "--skip-tests"] {
            assert!(args.contains(&flag.to_string()), "{flag}");
        }
        assert!(!args.contains(&"--repo".to_string()));
        assert!(!args.contains(&"--version".to_string()));
    }

    #[test]
    fn tail_keeps_the_end_on_a_char_boundary() {
        assert_eq!(tail("  short \n", 10), "short");
        let long = format!("{}é-end", "x".repeat(100));
        let t = tail(&long, 6);
        assert!(t.ends_with("é-end") || t.ends_with("-end"), "{t}");
    }

    /// Tests that write and run fake helm scripts take turns: a script being written while
    /// another test forks would make exec fail with "text file busy".
    static FAKE_HELM: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

    /// A fake helm (a shell script) shows what the wrapper really passes.
    fn fake_helm(dir: &Path, body: &str) -> PathBuf {
        let path = dir.join("helm");
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    #[tokio::test]
    async fn values_go_through_stdin_and_the_kubeconfig_is_private_and_removed() {
        let _turn = FAKE_HELM.lock().await;
        let dir = tempfile::tempdir().unwrap();
        let record = dir.path().join("record");
        let bin = fake_helm(
            dir.path(),
            &format!(
                r#"out={record}
cat > "$out.stdin"
printf '%s\n' "$@" > "$out.args"
while [ $# -gt 0 ]; do
  if [ "$1" = --kubeconfig ]; then stat -c %a "$2" > "$out.mode"; cat "$2" > "$out.kubeconfig"; echo "$2" > "$out.path"; fi
  shift
done
env > "$out.env""#,
                record = record.display()
            ),
        );
        let helm = Helm::new(&bin, dir.path().join("home"), Duration::from_secs(10));
        helm.upgrade_install("apiVersion: v1\nkind: Config\n", &request())
            .await
            .unwrap();
        let read =
            |ext: &str| std::fs::read_to_string(format!("{}.{ext}", record.display())).unwrap();
        let stdin: serde_json::Value = serde_json::from_str(&read("stdin")).unwrap();
        assert_eq!(stdin["a"], "with spaces and 'quotes'");
        assert_eq!(read("mode").trim(), "600");
        assert_eq!(read("kubeconfig"), "apiVersion: v1\nkind: Config\n");
        assert!(
            !Path::new(read("path").trim()).exists(),
            "the kubeconfig file is removed after the call"
        );
        let env = read("env");
        assert!(env.contains(&format!(
            "HELM_CACHE_HOME={}",
            dir.path().join("home/cache").display()
        )));
        assert!(env.contains("HELM_DATA_HOME="), "{env}");
        assert!(
            !env.contains("KUBECONFIG="),
            "the hub kubeconfig never reaches helm"
        );
        assert_eq!(
            helm.invocations().snapshot()[0],
            ("upgrade", 1),
            "invocations are counted by verb"
        );
    }

    #[tokio::test]
    async fn failures_keep_stderr_and_hung_calls_are_killed() {
        let _turn = FAKE_HELM.lock().await;
        let dir = tempfile::tempdir().unwrap();
        let bin = fake_helm(
            dir.path(),
            "echo 'Error: chart \"nope\" not found' >&2; exit 1",
        );
        let helm = Helm::new(&bin, dir.path().join("home"), Duration::from_secs(10));
        let err = helm.template(&request(), "v1.37.0").await.unwrap_err();
        let HelmError::Failed { stderr, .. } = &err else {
            panic!("{err}");
        };
        assert!(stderr.contains("chart \"nope\" not found"), "{stderr}");
        // helm's output may echo values: never in the text that reaches conditions.
        let text = kontinuum_operator_common::error::chain(&err);
        assert!(!text.contains("nope"), "{text}");
        assert!(
            text.starts_with("helm template failed (exit status: 1)"),
            "{text}"
        );

        let pidfile = dir.path().join("pid");
        let slow = fake_helm(
            dir.path(),
            &format!("echo $$ > {}; exec sleep 30", pidfile.display()),
        );
        let helm = Helm::new(&slow, dir.path().join("home"), Duration::from_millis(500));
        let started = std::time::Instant::now();
        let err = helm.template(&request(), "v1.37.0").await.unwrap_err();
        assert!(
            matches!(
                err,
                HelmError::Timeout {
                    verb: "template",
                    ..
                }
            ),
            "{err}"
        );
        assert!(started.elapsed() < Duration::from_secs(5));
        let pid = std::fs::read_to_string(&pidfile).unwrap();
        let proc_path = format!("/proc/{}", pid.trim());
        kontinuum_wait_gone(&proc_path).await;
    }

    /// The killed process disappears (is reaped) promptly.
    async fn kontinuum_wait_gone(proc_path: &str) {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            let alive = std::fs::read_to_string(format!("{proc_path}/stat"))
                .is_ok_and(|s| !s.contains(") Z "));
            if !alive {
                return;
            }
            assert!(std::time::Instant::now() < deadline, "helm was not killed");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    #[tokio::test]
    async fn a_missing_release_has_an_empty_history() {
        let _turn = FAKE_HELM.lock().await;
        let dir = tempfile::tempdir().unwrap();
        let bin = fake_helm(dir.path(), "echo 'Error: release: not found' >&2; exit 1");
        let helm = Helm::new(&bin, dir.path().join("home"), Duration::from_secs(10));
        assert!(helm.history("k", "r", "ns").await.unwrap().is_empty());
        let ok = fake_helm(
            dir.path(),
            r#"echo '[{"revision":1,"updated":"x","status":"superseded","chart":"c-1","app_version":"1","description":"Install complete"},{"revision":2,"updated":"y","status":"deployed","chart":"c-2","app_version":"2","description":"Upgrade complete"}]'"#,
        );
        let helm = Helm::new(&ok, dir.path().join("home"), Duration::from_secs(10));
        let history = helm.history("k", "r", "ns").await.unwrap();
        assert_eq!(history.len(), 2);
        assert_eq!(history[1].status, "deployed");
        assert_eq!(history[1].chart, "c-2");
    }
}
