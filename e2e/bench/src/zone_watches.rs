//! What the addon-installer's downstream pod watches cost per zone cluster: the real
//! `pod_watch::PodWatches`, in this process, watching N "zone clusters" — N cluster keys
//! whose kubeconfigs all point at one real API server (a control plane per zone cannot be
//! started N times on this machine; each watch still builds its own client, connection and
//! pod cache, which is what a zone costs). Memory is this process's RSS before and after,
//! so only the watches' own cost is in the delta.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use addon_installer::pod_watch::{PodWatches, Target};
use anyhow::{Context as _, bail};
use k8s_openapi::api::core::v1::Pod;
use kontinuum_crds::v1alpha2::Addon;
use kontinuum_e2e::namespace;
use kontinuum_e2e::testbed::{ControlPlane, ControlPlaneConfig, Tools, unique_dir};
use kube::api::{Api, PostParams};
use kube::runtime::reflector::ObjectRef;

use crate::procfs;
use crate::report::{Environment, Report, Section, Table};
use crate::say;
use crate::stats::{fmt_duration, fmt_kib};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Zone clusters watched at each step, cumulative (comma-separated, ascending).
    #[arg(long, value_delimiter = ',', default_value = "100,200,400")]
    clusters: Vec<usize>,
    /// Pods in the watched namespace (each zone cluster's cache holds them all).
    #[arg(long, default_value_t = 10)]
    pods: usize,
    /// Times the largest step's number of zones is stopped and watched again under new
    /// names.
    #[arg(long, default_value_t = 4)]
    cycles: usize,
    /// Where to write the Markdown report.
    #[arg(long, default_value = "bench-results/zone-watches.md")]
    out: PathBuf,
    /// Give up on a step after this many seconds.
    #[arg(long, default_value_t = 300)]
    timeout_seconds: u64,
}

fn rss_kib() -> u64 {
    procfs::memory(std::process::id()).map_or(0, |m| m.rss_kib)
}

/// A pod that stays Pending (nothing schedules it), so every watch sees an unhealthy Addon
/// after its first list and says so: that is how the benchmark knows a watch has synced.
fn pending_pod(name: &str) -> anyhow::Result<Pod> {
    Ok(serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": { "name": name, "labels": { "app.kubernetes.io/name": "bench" } },
        "spec": {
            "nodeSelector": { "kontinuum.sh/bench": "nowhere" },
            "containers": [{ "name": "c", "image": "example.invalid/bench:1" }]
        }
    }))?)
}

struct Step {
    clusters: usize,
    rss_kib: u64,
    synced_in: Duration,
}

/// Runs the benchmark and returns the rendered report.
pub async fn run(args: Args) -> anyhow::Result<String> {
    let limit = Duration::from_secs(args.timeout_seconds);
    let environment = Environment::capture();
    let tools = Tools::locate().context("locating the test-bed tools (KONTINUUM_TESTBED_BIN)")?;
    say("starting a control plane (every zone cluster's API server)");
    let cp = ControlPlane::start(&tools, ControlPlaneConfig::new(unique_dir("bench-watches")))
        .await
        .context("starting the control plane")?;
    let client = cp.client();
    let ns = namespace(&client, "bench-watches").await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    for i in 0..args.pods {
        pods.create(&PostParams::default(), &pending_pod(&format!("p-{i}"))?)
            .await?;
    }
    let target = Target {
        namespace: ns.clone(),
        selectors: vec!["app.kubernetes.io/name=bench".into()],
    };

    let (trigger, mut triggered) = tokio::sync::mpsc::unbounded_channel::<ObjectRef<Addon>>();
    let watches = PodWatches::new(trigger, Duration::from_secs(10));
    // Settle the allocator and the runtime before the baseline.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let baseline = rss_kib();
    let mut steps = Vec::new();
    let mut started_so_far = 0;
    for &clusters in &args.clusters {
        if clusters <= started_so_far {
            bail!("--clusters must ascend: {clusters} after {started_so_far}");
        }
        say(&format!("watching {clusters} zone clusters"));
        let synced_in = watch_and_sync(
            &watches,
            &mut triggered,
            cp.kubeconfig_yaml(),
            &target,
            ("zone", started_so_far..clusters),
            limit,
        )
        .await?;
        steps.push(Step {
            clusters,
            rss_kib: settled_rss().await,
            synced_in,
        });
        started_so_far = clusters;
    }
    say("stopping every watch");
    unwatch(&watches, "zone", 0..started_so_far)?;
    let stopped = settled_rss().await;
    // The same number of zones again and again, under new names: freed memory is reused
    // (the allocator keeps what it freed) and nothing accumulates from cycle to cycle.
    let mut again = Vec::new();
    for cycle in 1..=args.cycles {
        say(&format!(
            "cycle {cycle}: watching {started_so_far} other zone clusters"
        ));
        let prefix = format!("again{cycle}");
        watch_and_sync(
            &watches,
            &mut triggered,
            cp.kubeconfig_yaml(),
            &target,
            (&prefix, 0..started_so_far),
            limit,
        )
        .await?;
        again.push(settled_rss().await);
        unwatch(&watches, &prefix, 0..started_so_far)?;
    }
    let after = Churn {
        stopped,
        again,
        clusters: started_so_far,
    };
    render(&args, environment, baseline, &after, &steps).write_to(&args.out)
}

struct Churn {
    stopped: u64,
    /// RSS with the other zones watched, one per cycle.
    again: Vec<u64>,
    clusters: usize,
}

async fn settled_rss() -> u64 {
    tokio::time::sleep(Duration::from_secs(5)).await;
    rss_kib()
}

/// Starts the watches of `prefix-i` for `range` and waits until each has listed.
async fn watch_and_sync(
    watches: &PodWatches,
    triggered: &mut tokio::sync::mpsc::UnboundedReceiver<ObjectRef<Addon>>,
    kubeconfig: &str,
    target: &Target,
    (prefix, range): (&str, std::ops::Range<usize>),
    limit: Duration,
) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let expected = range.len();
    let total = watches.clusters() + expected;
    for i in range {
        // Registered as healthy: the first list shows Pending pods, which triggers.
        watches.watch(
            &format!("bench/{prefix}-{i}"),
            kubeconfig,
            ObjectRef::new(&format!("{prefix}-{i}")).within("bench"),
            target.clone(),
            true,
        );
    }
    let mut synced = std::collections::HashSet::new();
    while synced.len() < expected {
        let remaining = limit.saturating_sub(started.elapsed());
        match tokio::time::timeout(remaining, triggered.recv()).await {
            Ok(Some(addon)) => {
                synced.insert(addon.name);
            }
            Ok(None) => bail!("the pod watches' trigger closed"),
            Err(_) => bail!(
                "only {} of {expected} new watches synced within {limit:?}",
                synced.len()
            ),
        }
    }
    let synced_in = started.elapsed();
    if watches.clusters() != total {
        bail!("{} clusters watched, not {total}", watches.clusters());
    }
    Ok(synced_in)
}

fn unwatch(
    watches: &PodWatches,
    prefix: &str,
    range: std::ops::Range<usize>,
) -> anyhow::Result<()> {
    for i in range {
        watches.unwatch(&ObjectRef::new(&format!("{prefix}-{i}")).within("bench"));
    }
    if watches.clusters() != 0 {
        bail!(
            "{} clusters still watched after unwatch",
            watches.clusters()
        );
    }
    Ok(())
}

fn render(
    args: &Args,
    environment: Environment,
    baseline: u64,
    churn: &Churn,
    steps: &[Step],
) -> Report {
    let peak = steps.last().map_or(0, |s| s.rss_kib);
    let mut table = Table::new(&[
        "zone clusters watched",
        "RSS of the watching process",
        "over the baseline",
        "per zone cluster",
        "new watches synced in",
    ]);
    for step in steps {
        let over = step.rss_kib.saturating_sub(baseline);
        table.row(vec![
            step.clusters.to_string(),
            fmt_kib(step.rss_kib),
            fmt_kib(over),
            fmt_kib(over / u64::try_from(step.clusters).unwrap_or(1).max(1)),
            fmt_duration(step.synced_in),
        ]);
    }
    let mut report = Report::new(
        "addon-installer: memory of the downstream pod watches per zone cluster",
        environment,
    );
    report.push(
        Section::new("Results")
            .text(format!(
                "The addon-installer's own `PodWatches`, in the benchmark process, watching the \
                 pods of one namespace ({} Pending pods) in N zone clusters: N cluster keys whose \
                 kubeconfigs point at one real API server (the test bed; one control plane per \
                 zone does not fit this machine). Each watch builds its own client, TLS \
                 connection and trimmed pod cache, as for a real zone. A watch counts as synced \
                 when its first list made it ask for the Addon's reconcile. RSS is this \
                 process's VmRSS 5 s after each step; the baseline {} is before any watch. \
                 Every watch stopped (none left): {}, the allocator keeping what it freed; \
                 then, {} times, {} other zone clusters watched and stopped: RSS with them \
                 {} against {} for the first ones.",
                args.pods,
                fmt_kib(baseline),
                fmt_kib(churn.stopped),
                churn.again.len(),
                churn.clusters,
                churn
                    .again
                    .iter()
                    .map(|kib| fmt_kib(*kib))
                    .collect::<Vec<_>>()
                    .join(", "),
                fmt_kib(peak),
            ))
            .table(table),
    );
    report
}
