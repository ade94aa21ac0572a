//! `kontinuum-bench addons`: the addon-installer (issue 6, acceptance 8). A real hub and,
//! per run, a real downstream cluster with a KWOK node; the fixture charts from a local
//! chart repository through `--chart-mirror`; the real helm behind a wrapper script that
//! logs every invocation's verb. Measures the time from the kubeconfig becoming available
//! (the TalosCluster's Secret and `status.secretRef` written, the three built-ins already
//! seeded) until all three built-ins are `Ready`, and the helm invocations per Addon over
//! a window of steady-state resyncs at a short interval, scaled to an hour at the default
//! interval.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use kontinuum_e2e::addons::{
    ADDON_INSTALLER_ROLE, ChartRepo, addon_ready, downstream_cluster, install_addon_installer_role,
    reconciles, seed_builtin, seed_cluster, start_addon_installer,
};
use kontinuum_e2e::testbed::{ControlPlane, ControlPlaneConfig, Tools, unique_dir};
use kontinuum_e2e::{install_kontinuum_crds, namespace, service_account_kubeconfig_for};

use crate::report::{Environment, Report, Section, Table};
use crate::say;
use crate::stats::fmt_duration;

const BUILTINS: [&str; 3] = ["gateway-api-crds", "cilium", "cert-manager"];
/// The default resync interval (`--resync-interval`), for scaling to an hour.
const DEFAULT_RESYNC: Duration = Duration::from_secs(300);

/// Arguments of `kontinuum-bench addons`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Clusters brought up one after the other (each: a fresh downstream cluster).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Resync interval during the steady-state window, in seconds.
    #[arg(long, default_value_t = 1)]
    resync_seconds: u64,
    /// Length of the steady-state window, in seconds.
    #[arg(long, default_value_t = 60)]
    window_seconds: u64,
    /// Where to write the Markdown report.
    #[arg(long, default_value = "bench-results/addons.md")]
    out: PathBuf,
    /// Give up on a run after this many seconds.
    #[arg(long, default_value_t = 300)]
    timeout_seconds: u64,
}

/// The helm wrapper's log: one verb per line.
fn verbs(log: &Path) -> Vec<String> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

fn by_verb(verbs: &[String]) -> String {
    let mut counts = std::collections::BTreeMap::<&str, usize>::new();
    for v in verbs {
        *counts.entry(v.as_str()).or_default() += 1;
    }
    if counts.is_empty() {
        return "none".into();
    }
    counts
        .iter()
        .map(|(v, n)| format!("{v} {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

struct Run {
    to_ready: Duration,
    install_verbs: Vec<String>,
    window_verbs: Vec<String>,
    window_reconciles: u64,
}

/// Runs the benchmark and returns the rendered report.
#[allow(
    clippy::too_many_lines,
    reason = "one linear script: set up, measured runs, report"
)]
pub async fn run(args: Args) -> anyhow::Result<String> {
    let limit = Duration::from_secs(args.timeout_seconds);
    let environment = Environment::capture();
    let tools = Tools::locate().context("locating the test-bed tools (KONTINUUM_TESTBED_BIN)")?;
    let bin = std::env::current_exe()?.with_file_name("addon-installer");
    if !bin.is_file() {
        bail!(
            "{} is missing: build it with `cargo build --release -p addon-installer`",
            bin.display()
        );
    }
    say("starting the hub");
    let hub_cp = ControlPlane::start(&tools, ControlPlaneConfig::new(unique_dir("bench-addons")))
        .await
        .context("starting the hub")?;
    let hub = hub_cp.client();
    install_kontinuum_crds(&hub).await?;
    install_addon_installer_role(&hub).await?;
    let repo = ChartRepo::serve(&tools).await?;
    let work = unique_dir("bench-addons-helm");
    std::fs::create_dir_all(&work)?;

    let mut runs = Vec::new();
    for i in 0..args.runs.max(1) {
        say(&format!("run {}: starting a downstream cluster", i + 1));
        let down = downstream_cluster(&tools, "bench-addons-down").await?;
        let ns = namespace(&hub, "bench-addons").await?;
        let kubeconfig = service_account_kubeconfig_for(
            &hub,
            hub_cp.kubeconfig_yaml(),
            hub_cp.dir(),
            &ns,
            "addon-installer",
            ADDON_INSTALLER_ROLE,
        )
        .await?;
        let log = work.join(format!("helm-{i}.log"));
        let wrapper = work.join(format!("helm-{i}"));
        std::fs::write(
            &wrapper,
            format!(
                "#!/bin/sh\necho \"$1\" >> '{}'\nexec '{}' \"$@\"\n",
                log.display(),
                tools.path("helm").display()
            ),
        )?;
        let mut perms = std::fs::metadata(&wrapper)?.permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
        std::fs::set_permissions(&wrapper, perms)?;
        let resync = format!("{}s", args.resync_seconds.max(1));
        let wrapper_arg = wrapper.to_string_lossy().into_owned();
        let operator = start_addon_installer(
            &bin,
            &kubeconfig,
            &ns,
            &repo.url,
            &[
                "--helm",
                &wrapper_arg,
                "--resync-interval",
                &resync,
                "--retry-interval",
                "1s",
            ],
        )
        .await?;
        let mut names = Vec::new();
        for release in BUILTINS {
            names.push(seed_builtin(&hub, &ns, "bench", release).await?);
        }
        say(&format!("run {}: kubeconfig available", i + 1));
        let start = Instant::now();
        seed_cluster(&hub, &ns, "bench", down.kubeconfig_yaml(), 1).await?;
        loop {
            let mut all = true;
            for name in &names {
                all &= addon_ready(&hub, &ns, name)
                    .await?
                    .is_some_and(|(s, _, _)| s == "True");
            }
            if all {
                break;
            }
            if start.elapsed() > limit {
                bail!(
                    "the built-ins were not Ready within {limit:?}; log: {}",
                    operator.log.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let to_ready = start.elapsed();
        let install_verbs = verbs(&log);
        say(&format!(
            "run {}: Ready after {}; steady state for {} s",
            i + 1,
            fmt_duration(to_ready),
            args.window_seconds
        ));
        let r0 = reconciles(&operator.metrics().await?);
        // A measurement window, not a wait for a condition: resyncs run during it.
        tokio::time::sleep(Duration::from_secs(args.window_seconds)).await;
        let r1 = reconciles(&operator.metrics().await?);
        let all_verbs = verbs(&log);
        runs.push(Run {
            to_ready,
            window_verbs: all_verbs[install_verbs.len()..].to_vec(),
            install_verbs,
            window_reconciles: r1.saturating_sub(r0),
        });
        drop(operator);
        down.stop().await;
    }

    let mut report = Report::new(
        "addon-installer: built-ins to Ready, helm invocations",
        environment,
    );
    let mut ready = Table::new(&[
        "run",
        "kubeconfig → 3 built-ins Ready",
        "helm invocations until Ready",
    ]);
    for (i, r) in runs.iter().enumerate() {
        ready.row(vec![
            (i + 1).to_string(),
            fmt_duration(r.to_ready),
            format!("{} ({})", r.install_verbs.len(), by_verb(&r.install_verbs)),
        ]);
    }
    report.push(
        Section::new("Time from kubeconfig available to all three built-ins Ready")
            .text(
                "The three built-in Addons are seeded first (release name only, like the \
                 talos-bootstrapper); the clock starts when the TalosCluster's kubeconfig \
                 Secret and status.secretRef are written and stops when gateway-api-crds \
                 (wave 50, KubectlApply), cilium and cert-manager (wave 100, Helm) are all \
                 Ready: CRDs Established and every pod Running and Ready on the KWOK node. \
                 Fixture charts from a local repository; the real helm.",
            )
            .table(ready),
    );
    let mut steady = Table::new(&[
        "run",
        "window",
        "reconciles in window",
        "resyncs per Addon",
        "helm invocations in window",
        "per Addon per resync",
        "per Addon per hour at 5 min",
    ]);
    #[allow(clippy::cast_precision_loss, reason = "small counts")]
    for (i, r) in runs.iter().enumerate() {
        let per_addon_resyncs = r.window_reconciles as f64 / BUILTINS.len() as f64;
        let per_resync = if per_addon_resyncs > 0.0 {
            r.window_verbs.len() as f64 / BUILTINS.len() as f64 / per_addon_resyncs
        } else {
            0.0
        };
        let per_hour = per_resync * (3600.0 / DEFAULT_RESYNC.as_secs_f64());
        steady.row(vec![
            (i + 1).to_string(),
            format!("{} s at {} s", args.window_seconds, args.resync_seconds),
            r.window_reconciles.to_string(),
            format!("{per_addon_resyncs:.0}"),
            format!("{} ({})", r.window_verbs.len(), by_verb(&r.window_verbs)),
            format!("{per_resync:.3}"),
            format!("{per_hour:.2}"),
        ]);
    }
    report.push(
        Section::new("helm invocations per Addon over an hour of resyncs")
            .text(
                "After the built-ins are Ready the operator resyncs at a short interval for a \
                 window; every helm invocation is logged by a wrapper script around the real \
                 helm. A resync reads the release record (Helm's storage Secrets, through the \
                 Kubernetes API) and the cached rendering, and probes CRDs and pods; helm runs \
                 only when the desired state changed or the release is not deployed. The last \
                 column scales the per-resync figure to one hour at the default 5 min interval \
                 (12 resyncs).",
            )
            .table(steady),
    );
    let rendered = report.write_to(&args.out)?;
    drop(repo);
    hub_cp.stop().await;
    Ok(rendered)
}
