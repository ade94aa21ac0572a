//! Probes, as a kubelet runs them: `httpGet` (2xx/3xx is success; HTTPS only checks that
//! the port accepts connections, the hostlet has no TLS client for probes), `tcpSocket`,
//! and `exec` (the command runs in a fresh copy of the container's namespace, as the
//! container's user; exit code 0 is success). `grpc` probes are not supported and fail.
//! [`Tracker`] applies the thresholds.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// Which probe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `startupProbe`.
    Startup,
    /// `readinessProbe`.
    Readiness,
    /// `livenessProbe`.
    Liveness,
}

impl Kind {
    /// `Startup`, `Readiness`, `Liveness` (as in a kubelet's event messages).
    pub fn name(self) -> &'static str {
        match self {
            Self::Startup => "Startup",
            Self::Readiness => "Readiness",
            Self::Liveness => "Liveness",
        }
    }
}

/// A probe's timing, defaults filled in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    /// `initialDelaySeconds` (0).
    pub initial_delay: Duration,
    /// `periodSeconds` (10).
    pub period: Duration,
    /// `timeoutSeconds` (1).
    pub timeout: Duration,
    /// `successThreshold` (1).
    pub success_threshold: u32,
    /// `failureThreshold` (3).
    pub failure_threshold: u32,
}

impl Timing {
    /// The timing of `probe`.
    pub fn of(probe: &Probe) -> Self {
        let secs = |v: Option<i32>, default: u64| {
            Duration::from_secs(v.and_then(|v| u64::try_from(v).ok()).unwrap_or(default))
        };
        let count = |v: Option<i32>, default: u32| {
            v.and_then(|v| u32::try_from(v).ok())
                .filter(|v| *v > 0)
                .unwrap_or(default)
        };
        Self {
            initial_delay: secs(probe.initial_delay_seconds, 0),
            period: secs(probe.period_seconds, 10).max(Duration::from_secs(1)),
            timeout: secs(probe.timeout_seconds, 1).max(Duration::from_secs(1)),
            success_threshold: count(probe.success_threshold, 1),
            failure_threshold: count(probe.failure_threshold, 3),
        }
    }
}

/// Consecutive results and the state they give.
#[derive(Clone, Debug)]
pub struct Tracker {
    timing: Timing,
    successes: u32,
    failures: u32,
    state: bool,
}

impl Tracker {
    /// A tracker starting at `initial` (readiness and startup: false; liveness: true).
    pub fn new(timing: Timing, initial: bool) -> Self {
        Self {
            timing,
            successes: 0,
            failures: 0,
            state: initial,
        }
    }

    /// Records one result; returns the state (success/healthy or not).
    pub fn record(&mut self, success: bool) -> bool {
        if success {
            self.successes += 1;
            self.failures = 0;
            if self.successes >= self.timing.success_threshold {
                self.state = true;
            }
        } else {
            self.failures += 1;
            self.successes = 0;
            if self.failures >= self.timing.failure_threshold {
                self.state = false;
            }
        }
        self.state
    }

    /// The current state.
    pub fn state(&self) -> bool {
        self.state
    }
}

/// Where and how to probe one container.
#[derive(Clone, Debug)]
pub struct Target {
    /// The pod's IP.
    pub pod_ip: String,
    /// The container (for named ports).
    pub container: Container,
    /// The container's exec spec file (for exec probes; argv replaced).
    pub exec_spec: Option<crate::container::ExecSpec>,
    /// Where exec-probe specs are written.
    pub spec_path: std::path::PathBuf,
}

/// Runs a probe once; `Err` holds the failure message.
pub async fn run_once(probe: &Probe, target: &Target, timeout: Duration) -> Result<(), String> {
    let fut = async {
        if let Some(http) = &probe.http_get {
            let host = http
                .host
                .clone()
                .filter(|h| !h.is_empty())
                .unwrap_or_else(|| target.pod_ip.clone());
            let port = resolve_port(&http.port, &target.container)?;
            let path = http.path.clone().unwrap_or_else(|| "/".into());
            let headers: Vec<(String, String)> = http
                .http_headers
                .iter()
                .flatten()
                .map(|h| (h.name.clone(), h.value.clone()))
                .collect();
            if http.scheme.as_deref() == Some("HTTPS") {
                return tcp(&host, port).await;
            }
            http_get(&host, port, &path, &headers).await
        } else if let Some(tcp_socket) = &probe.tcp_socket {
            let host = tcp_socket
                .host
                .clone()
                .filter(|h| !h.is_empty())
                .unwrap_or_else(|| target.pod_ip.clone());
            let port = resolve_port(&tcp_socket.port, &target.container)?;
            tcp(&host, port).await
        } else if let Some(exec) = &probe.exec {
            exec_probe(exec.command.as_deref().unwrap_or_default(), target).await
        } else {
            Err("unsupported probe type (grpc probes are not supported by the hostlet)".into())
        }
    };
    match tokio::time::timeout(timeout, fut).await {
        Ok(r) => r,
        Err(_) => Err(format!("probe timed out after {timeout:?}")),
    }
}

/// A probe port: a number or the name of a container port.
pub fn resolve_port(port: &IntOrString, container: &Container) -> Result<u16, String> {
    match port {
        IntOrString::Int(p) => u16::try_from(*p).map_err(|_| format!("invalid port {p}")),
        IntOrString::String(name) => {
            if let Ok(p) = name.parse::<u16>() {
                return Ok(p);
            }
            container
                .ports
                .iter()
                .flatten()
                .find(|p| p.name.as_deref() == Some(name.as_str()))
                .and_then(|p| u16::try_from(p.container_port).ok())
                .ok_or_else(|| format!("container has no port named {name}"))
        }
    }
}

async fn connect(host: &str, port: u16) -> Result<tokio::net::TcpStream, String> {
    let addr: SocketAddr = match host.parse::<std::net::IpAddr>() {
        Ok(ip) => SocketAddr::new(ip, port),
        Err(_) => tokio::net::lookup_host((host, port))
            .await
            .map_err(|e| format!("resolving {host}: {e}"))?
            .next()
            .ok_or_else(|| format!("no address for {host}"))?,
    };
    tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| format!("dial tcp {addr}: {e}"))
}

async fn tcp(host: &str, port: u16) -> Result<(), String> {
    connect(host, port).await.map(|_| ())
}

async fn http_get(
    host: &str,
    port: u16,
    path: &str,
    headers: &[(String, String)],
) -> Result<(), String> {
    let mut stream = connect(host, port).await?;
    let mut request = format!(
        "GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUser-Agent: kube-probe/hostlet\r\nAccept: */*\r\nConnection: close\r\n"
    );
    for (k, v) in headers {
        let _ = write!(request, "{k}: {v}\r\n");
    }
    request.push_str("\r\n");
    stream
        .write_all(request.as_bytes())
        .await
        .map_err(|e| format!("writing the request: {e}"))?;
    let mut buf = vec![0_u8; 512];
    let mut len = 0;
    while len < buf.len() {
        let n = stream
            .read(&mut buf[len..])
            .await
            .map_err(|e| format!("reading the response: {e}"))?;
        if n == 0 {
            break;
        }
        len += n;
        if buf[..len].contains(&b'\n') {
            break;
        }
    }
    let text = String::from_utf8_lossy(&buf[..len]);
    let status = text
        .lines()
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse::<u16>().ok())
        .ok_or_else(|| "malformed HTTP response".to_string())?;
    if (200..400).contains(&status) {
        Ok(())
    } else {
        Err(format!("HTTP probe failed with statuscode: {status}"))
    }
}

async fn exec_probe(command: &[String], target: &Target) -> Result<(), String> {
    let Some(base) = &target.exec_spec else {
        return Err("the container is not running".into());
    };
    let mut spec = base.clone();
    spec.program = None;
    spec.argv = command.to_vec();
    spec.marker = None;
    spec.parent_pid = i32::try_from(std::process::id()).unwrap_or_default();
    crate::container::write_spec(&target.spec_path, &spec)
        .map_err(|e| format!("writing the probe spec: {e}"))?;
    let output = probe_command(&target.spec_path)
        .output()
        .await
        .map_err(|e| format!("running the probe: {e}"))?;
    if output.status.success() {
        Ok(())
    } else {
        let mut text = String::from_utf8_lossy(&output.stdout).into_owned();
        text.push_str(&String::from_utf8_lossy(&output.stderr));
        let text: String = text.chars().take(1024).collect();
        Err(format!(
            "command {command:?} exited with {}: {}",
            output.status,
            text.trim()
        ))
    }
}

fn probe_command(spec: &Path) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new("/proc/self/exe");
    cmd.arg(crate::container::SUBCOMMAND)
        .arg("--spec")
        .arg(spec)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    cmd
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timing(success: u32, failure: u32) -> Timing {
        Timing {
            initial_delay: Duration::ZERO,
            period: Duration::from_secs(1),
            timeout: Duration::from_secs(1),
            success_threshold: success,
            failure_threshold: failure,
        }
    }

    #[test]
    fn thresholds_need_consecutive_results() {
        let mut t = Tracker::new(timing(2, 3), false);
        assert!(!t.record(true));
        assert!(!t.record(false));
        assert!(!t.record(true));
        assert!(t.record(true), "two successes in a row");
        assert!(t.record(false));
        assert!(t.record(false));
        assert!(!t.record(false), "three failures in a row");
        assert!(!t.state());
    }

    #[test]
    fn defaults_are_kubernetes_defaults() {
        let t = Timing::of(&Probe::default());
        assert_eq!(t.period, Duration::from_secs(10));
        assert_eq!(t.timeout, Duration::from_secs(1));
        assert_eq!((t.success_threshold, t.failure_threshold), (1, 3));
    }

    #[test]
    fn named_ports_resolve_through_the_container() {
        let c: Container = serde_json::from_value(serde_json::json!({
            "name": "c", "ports": [{ "name": "http", "containerPort": 8080 }]
        }))
        .unwrap();
        assert_eq!(
            resolve_port(&IntOrString::String("http".into()), &c),
            Ok(8080)
        );
        assert_eq!(resolve_port(&IntOrString::Int(81), &c), Ok(81));
        assert!(resolve_port(&IntOrString::String("nope".into()), &c).is_err());
    }

    #[tokio::test]
    async fn http_probes_judge_the_status_code() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            for code in [200, 503] {
                let (mut s, _) = listener.accept().await.unwrap();
                let mut buf = [0_u8; 1024];
                let _ = s.read(&mut buf).await.unwrap();
                let reply = format!("HTTP/1.1 {code} X\r\nContent-Length: 0\r\n\r\n");
                s.write_all(reply.as_bytes()).await.unwrap();
            }
        });
        assert_eq!(http_get("127.0.0.1", port, "/", &[]).await, Ok(()));
        let err = http_get("127.0.0.1", port, "/", &[]).await.unwrap_err();
        assert!(err.contains("503"), "{err}");
        assert!(
            http_get("127.0.0.1", port, "/", &[]).await.is_err(),
            "closed port"
        );
    }
}
