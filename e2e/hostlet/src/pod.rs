//! One pod's worker: admission (image map, IP, ports), volumes, init containers, app
//! containers with probes and restarts, status writes, and termination on deletion.
//!
//! The worker task owns the pod's status and its deletion; a lifecycle task runs the
//! containers. They share [`Shared`]: the container states, and a `Notify` the lifecycle
//! pokes whenever something changed so the worker writes `pods/status` (only when it
//! differs from what was last written). Deletion (or the hostlet stopping) is a deadline
//! sent on a watch channel: each container gets SIGTERM at once and SIGKILL at the deadline.

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Container, ObjectReference, Pod, Probe, Secret};
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::events::{Event, EventType};
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use tokio::sync::{Notify, mpsc, watch};
use tokio::task::JoinSet;
use tracing::Instrument as _;

use crate::backoff::Backoff;
use crate::container::{self, ExecSpec, MountSpec};
use crate::env::{self, EnvInputs, Fetched, PodFacts};
use crate::ipam::PortKey;
use crate::probe::{self, Kind, Target, Timing, Tracker};
use crate::status::{self, ContainerState, PodView, State, Terminated, Transitions};
use crate::volumes::{self, Materialised, Owner, Tokens};
use crate::{API_TIMEOUT, Context, SHUTDOWN_GRACE, Unmapped, api};

/// The default `terminationGracePeriodSeconds`.
const DEFAULT_GRACE: i64 = 30;
/// Longest wait between retries of a status write, a deletion or a container's config.
const MAX_RETRY: Duration = Duration::from_secs(30);

/// Which container of the pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Slot {
    Init(usize),
    App(usize),
}

/// How a container ended for good.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    Succeeded,
    Failed,
    Stopped,
}

#[derive(Debug, Default)]
struct PodState {
    init: Vec<ContainerState>,
    containers: Vec<ContainerState>,
    rejected: Option<(String, String)>,
    pod_ip: Option<Ipv4Addr>,
    sandbox_ready: bool,
    volumes: BTreeMap<String, Materialised>,
}

impl PodState {
    fn slot(&mut self, slot: Slot) -> Option<&mut ContainerState> {
        match slot {
            Slot::Init(i) => self.init.get_mut(i),
            Slot::App(i) => self.containers.get_mut(i),
        }
    }
}

struct Shared {
    ctx: Arc<Context>,
    uid: String,
    namespace: String,
    name: String,
    dir: PathBuf,
    start_time: jiff::Timestamp,
    state: Mutex<PodState>,
    notify: Notify,
    done: AtomicBool,
    pod_rx: watch::Receiver<Option<Pod>>,
    reference: ObjectReference,
}

impl Shared {
    fn pod(&self) -> Option<Pod> {
        self.pod_rx.borrow().clone()
    }

    fn state(&self) -> MutexGuard<'_, PodState> {
        // A poisoned lock only means a task panicked mid-update; the data is still usable.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn update(&self, slot: Slot, f: impl FnOnce(&mut ContainerState)) {
        if let Some(c) = self.state().slot(slot) {
            f(c);
        }
        self.notify.notify_one();
    }

    fn event(&self, type_: EventType, reason: &str, action: &str, note: &str) {
        let recorder = self.ctx.recorder.clone();
        let reference = self.reference.clone();
        let event = Event {
            type_,
            reason: reason.to_string(),
            note: Some(note.chars().take(1000).collect()),
            action: action.to_string(),
            secondary: None,
        };
        tokio::spawn(async move {
            match tokio::time::timeout(API_TIMEOUT, recorder.publish(&event, &reference)).await {
                Ok(Ok(())) => {}
                Ok(Err(err)) => tracing::debug!(
                    error = &err as &dyn std::error::Error,
                    "publishing an event failed"
                ),
                Err(_) => tracing::debug!("publishing an event timed out"),
            }
        });
    }

    fn pod_label(&self) -> String {
        format!("{}_{}({})", self.name, self.namespace, self.uid)
    }

    fn owner(&self) -> String {
        format!("{}/{} ({})", self.namespace, self.name, self.uid)
    }

    fn log_path(&self, container: &str) -> PathBuf {
        self.dir.join(format!("{container}.log"))
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn grace_of(pod: &Pod) -> Duration {
    let secs = pod
        .metadata
        .deletion_grace_period_seconds
        .or_else(|| {
            pod.spec
                .as_ref()
                .and_then(|s| s.termination_grace_period_seconds)
        })
        .unwrap_or(DEFAULT_GRACE);
    Duration::from_secs(u64::try_from(secs).unwrap_or(0))
}

fn pod_phase(pod: &Pod) -> Option<&str> {
    pod.status.as_ref().and_then(|s| s.phase.as_deref())
}

/// The worker of one pod, until the pod is gone (or the hostlet stops).
pub(crate) async fn run(ctx: Arc<Context>, pod_rx: watch::Receiver<Option<Pod>>) {
    let object_ref = pod_rx
        .borrow()
        .as_ref()
        .map(|p| {
            format!(
                "{}/{}",
                p.metadata.namespace.clone().unwrap_or_default(),
                p.metadata.name.clone().unwrap_or_default()
            )
        })
        .unwrap_or_default();
    let span = tracing::info_span!("pod", object.ref = %object_ref);
    worker(ctx, pod_rx).instrument(span).await;
}

// One loop owning the pod's status and deletion; splitting it would scatter its state.
#[allow(clippy::too_many_lines)]
async fn worker(ctx: Arc<Context>, mut pod_rx: watch::Receiver<Option<Pod>>) {
    let Some(pod) = pod_rx.borrow_and_update().clone() else {
        return;
    };
    let namespace = pod.metadata.namespace.clone().unwrap_or_default();
    let name = pod.metadata.name.clone().unwrap_or_default();
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let dir = ctx
        .config
        .dir
        .join("pods")
        .join(format!("{namespace}_{name}_{uid}"));
    if let Err(err) = std::fs::create_dir_all(&dir) {
        tracing::warn!(
            error = &err as &dyn std::error::Error,
            "creating the pod directory failed"
        );
    }
    let spec = pod.spec.clone().unwrap_or_default();
    let state = PodState {
        init: spec
            .init_containers
            .iter()
            .flatten()
            .map(|c| ContainerState::creating(&c.name, c.image.as_deref().unwrap_or_default()))
            .collect(),
        containers: spec
            .containers
            .iter()
            .map(|c| ContainerState::creating(&c.name, c.image.as_deref().unwrap_or_default()))
            .collect(),
        ..PodState::default()
    };
    let reference = ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        name: Some(name.clone()),
        namespace: Some(namespace.clone()),
        uid: Some(uid.clone()),
        ..ObjectReference::default()
    };
    let shared = Arc::new(Shared {
        ctx: ctx.clone(),
        uid,
        namespace,
        name,
        dir,
        start_time: status::now(),
        state: Mutex::new(state),
        notify: Notify::new(),
        done: AtomicBool::new(false),
        pod_rx: pod_rx.clone(),
        reference,
    });
    // A pod that already finished (before a hostlet restart) is not run again.
    let finished = matches!(pod_phase(&pod), Some("Succeeded" | "Failed"));
    let (stop_tx, stop_rx) = watch::channel::<Option<Instant>>(None);
    if finished {
        shared.done.store(true, Ordering::SeqCst);
    } else {
        let s = shared.clone();
        tokio::spawn(
            async move {
                Box::pin(lifecycle(&s, stop_rx)).await;
                s.done.store(true, Ordering::SeqCst);
                s.notify.notify_one();
            }
            .in_current_span(),
        );
    }
    let mut transitions = Transitions::new();
    let mut last_written: Option<serde_json::Value> = None;
    let mut retry_at: Option<tokio::time::Instant> = None;
    let mut retry_delay = Duration::from_secs(1);
    let (mut deleting, mut gone, mut shutting_down, mut released) = (false, false, false, false);
    if pod.metadata.deletion_timestamp.is_some() {
        deleting = true;
        stop_tx.send_replace(Some(Instant::now() + grace_of(&pod)));
    }
    loop {
        let far = tokio::time::Instant::now() + Duration::from_secs(3600);
        tokio::select! {
            changed = pod_rx.changed(), if !gone && !shutting_down => {
                if changed.is_err() {
                    shutting_down = true;
                    let grace = shared.pod().map_or(SHUTDOWN_GRACE, |p| grace_of(&p).min(SHUTDOWN_GRACE));
                    stop_tx.send_replace(Some(Instant::now() + grace));
                } else {
                    let latest = pod_rx.borrow_and_update().clone();
                    match latest {
                        None => {
                            gone = true;
                            stop_tx.send_replace(Some(Instant::now()));
                        }
                        Some(p) if p.metadata.deletion_timestamp.is_some() && !deleting => {
                            deleting = true;
                            let grace = grace_of(&p);
                            tracing::info!(grace_s = grace.as_secs(), "pod deleted; stopping its containers");
                            stop_tx.send_replace(Some(Instant::now() + grace));
                        }
                        Some(_) => {}
                    }
                }
            }
            () = shared.notify.notified() => {}
            () = tokio::time::sleep_until(retry_at.unwrap_or(far)), if retry_at.is_some() => {
                retry_at = None;
            }
        }
        let done = shared.done.load(Ordering::SeqCst);
        if !gone && !shutting_down && retry_at.is_none() {
            match write_status(&shared, &mut transitions, &mut last_written).await {
                Ok(()) => retry_delay = Duration::from_secs(1),
                Err(err) => {
                    tracing::warn!(
                        error = &err as &dyn std::error::Error,
                        "writing the pod status failed; retrying"
                    );
                    retry_at = Some(tokio::time::Instant::now() + retry_delay);
                    retry_delay = (retry_delay * 2).min(MAX_RETRY);
                }
            }
        }
        if !done {
            continue;
        }
        if !released {
            released = true;
            lock(&ctx.ports).release(&shared.owner());
        }
        if gone || shutting_down {
            break;
        }
        if deleting && retry_at.is_none() {
            match delete(&shared).await {
                Ok(()) => break,
                Err(err) => {
                    tracing::warn!(
                        error = &err as &dyn std::error::Error,
                        "deleting the pod failed; retrying"
                    );
                    retry_at = Some(tokio::time::Instant::now() + retry_delay);
                    retry_delay = (retry_delay * 2).min(MAX_RETRY);
                }
            }
        }
    }
    lock(&ctx.ipam).release(&shared.uid);
    if !shutting_down {
        cleanup(&shared);
    }
}

/// Final deletion, as a kubelet does once the containers are gone: grace 0, this uid only.
async fn delete(shared: &Shared) -> Result<(), crate::Error> {
    let pods: Api<Pod> = Api::namespaced(shared.ctx.client.clone(), &shared.namespace);
    let params = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: Some(shared.uid.clone()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api::call(
        format!("deleting pod {}/{}", shared.namespace, shared.name),
        pods.delete(&shared.name, &params),
    )
    .await
    {
        Ok(_) => {
            tracing::info!("deleted pod");
            Ok(())
        }
        Err(e) if e.is_not_found() => Ok(()),
        Err(crate::Error::Kube {
            source: kube::Error::Api(s),
            ..
        }) if s.code == 409 => Ok(()),
        Err(e) => Err(e),
    }
}

/// Removes what holds secrets (volumes, container specs); logs stay.
fn cleanup(shared: &Shared) {
    let _ = std::fs::remove_dir_all(shared.dir.join("volumes"));
    if let Ok(entries) = std::fs::read_dir(&shared.dir) {
        for entry in entries.filter_map(Result::ok) {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.ends_with(".spec.json") || name.ends_with(".probe.json") {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }
}

async fn write_status(
    shared: &Shared,
    transitions: &mut Transitions,
    last_written: &mut Option<serde_json::Value>,
) -> Result<(), crate::Error> {
    let Some(pod) = shared.pod() else {
        return Ok(());
    };
    let gates_ready = pod
        .spec
        .as_ref()
        .and_then(|s| s.readiness_gates.as_ref())
        .is_none_or(|gates| {
            gates.iter().all(|g| {
                pod.status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|cs| {
                        cs.iter()
                            .any(|c| c.type_ == g.condition_type && c.status == "True")
                    })
            })
        });
    let restart_policy = pod
        .spec
        .as_ref()
        .and_then(|s| s.restart_policy.clone())
        .unwrap_or_else(|| "Always".into());
    let host_ip = shared.ctx.config.node_ip.to_string();
    let status = {
        let state = shared.state();
        let pod_ip = state.pod_ip.map(|ip| ip.to_string());
        let view = PodView {
            restart_policy: &restart_policy,
            init: &state.init,
            containers: &state.containers,
            rejected: state
                .rejected
                .as_ref()
                .map(|(r, m)| (r.as_str(), m.as_str())),
            pod_ip: pod_ip.as_deref(),
            host_ip: &host_ip,
            start_time: shared.start_time,
            sandbox_ready: state.sandbox_ready,
            gates_ready,
        };
        status::status_json(&view, transitions, status::now())
    };
    if last_written.as_ref() == Some(&status) {
        return Ok(());
    }
    let pods: Api<Pod> = Api::namespaced(shared.ctx.client.clone(), &shared.namespace);
    let patch = serde_json::json!({ "status": status });
    api::call(
        format!(
            "patching the status of pod {}/{}",
            shared.namespace, shared.name
        ),
        pods.patch_status(
            &shared.name,
            &PatchParams::default(),
            &Patch::Strategic(&patch),
        ),
    )
    .await?;
    tracing::debug!(phase = %status["phase"], "wrote pod status");
    *last_written = Some(status);
    Ok(())
}

/// Waits for `delay` unless a stop comes first; true if stopped.
async fn wait_or_stop(stop: &mut watch::Receiver<Option<Instant>>, delay: Duration) -> bool {
    if stop.borrow_and_update().is_some() {
        return true;
    }
    tokio::select! {
        () = tokio::time::sleep(delay) => stop.borrow().is_some(),
        r = stop.changed() => r.is_err() || stop.borrow().is_some(),
    }
}

enum Admission {
    Admitted,
    Pretend,
    Rejected,
    NotMapped,
}

fn all_containers(pod: &Pod) -> Vec<Container> {
    pod.spec
        .as_ref()
        .map(|s| {
            s.init_containers
                .iter()
                .flatten()
                .chain(s.containers.iter())
                .cloned()
                .collect()
        })
        .unwrap_or_default()
}

fn admit(shared: &Shared, pod: &Pod) -> Admission {
    let ctx = &shared.ctx;
    let unmapped: Vec<(String, String)> = all_containers(pod)
        .iter()
        .filter_map(|c| {
            let image = c.image.clone().unwrap_or_default();
            ctx.config
                .image_map
                .entry(&image)
                .is_none()
                .then(|| (c.name.clone(), image))
        })
        .collect();
    if !unmapped.is_empty() && ctx.config.unmapped == Unmapped::Refuse {
        let mut state = shared.state();
        for (name, image) in &unmapped {
            let message = format!("image {image} is not in the hostlet's image map");
            let PodState {
                init, containers, ..
            } = &mut *state;
            let wanted = State::Waiting {
                reason: "ImageNotMapped".into(),
                message: Some(message),
            };
            let mut changed = false;
            for c in init.iter_mut().chain(containers.iter_mut()) {
                if c.name == *name && c.state != wanted {
                    c.state = wanted.clone();
                    changed = true;
                }
            }
            // Once per refusal, not on every update of the pod.
            if changed {
                shared.event(
                    EventType::Warning,
                    "Failed",
                    "Pull",
                    &format!("Failed to map image \"{image}\": not in the hostlet's image map"),
                );
            }
        }
        drop(state);
        shared.notify.notify_one();
        return Admission::NotMapped;
    }
    let host_network = pod.spec.as_ref().and_then(|s| s.host_network) == Some(true);
    let ip = match lock(&ctx.ipam).allocate(&shared.uid, host_network) {
        Ok(ip) => ip,
        Err(e) => {
            let mut state = shared.state();
            state.rejected = Some((e.reason().into(), format!("Pod was rejected: {e}")));
            drop(state);
            shared.notify.notify_one();
            return Admission::Rejected;
        }
    };
    let keys = port_keys(pod, ip, ctx.config.node_ip);
    if let Err((key, other)) = lock(&ctx.ports).reserve(&shared.owner(), &keys) {
        let message = format!("Pod was rejected: port {key} is already used by pod {other}");
        shared.event(EventType::Warning, "NodePorts", "Admit", &message);
        let mut state = shared.state();
        state.rejected = Some(("NodePorts".into(), message));
        drop(state);
        lock(&ctx.ipam).release(&shared.uid);
        shared.notify.notify_one();
        return Admission::Rejected;
    }
    shared.state().pod_ip = Some(ip);
    if unmapped.is_empty() {
        Admission::Admitted
    } else {
        Admission::Pretend
    }
}

/// What the pod's declared ports occupy: each containerPort on the pod's IP, and each
/// hostPort on its hostIP (or the node's).
fn port_keys(pod: &Pod, pod_ip: Ipv4Addr, node_ip: Ipv4Addr) -> Vec<PortKey> {
    let mut keys = BTreeSet::new();
    for c in all_containers(pod) {
        for p in c.ports.iter().flatten() {
            let protocol = p.protocol.clone().unwrap_or_else(|| "TCP".into());
            keys.insert(PortKey {
                ip: pod_ip,
                port: p.container_port,
                protocol: protocol.clone(),
            });
            if let Some(host_port) = p.host_port.filter(|hp| *hp > 0) {
                let ip = p
                    .host_ip
                    .as_deref()
                    .and_then(|h| h.parse().ok())
                    .filter(|ip: &Ipv4Addr| !ip.is_unspecified())
                    .unwrap_or(node_ip);
                keys.insert(PortKey {
                    ip,
                    port: host_port,
                    protocol,
                });
            }
        }
    }
    keys.into_iter().collect()
}

/// Admission, volumes, init containers, then the app containers until they end.
async fn lifecycle(shared: &Arc<Shared>, mut stop: watch::Receiver<Option<Instant>>) {
    let mut pod_rx = shared.pod_rx.clone();
    loop {
        let Some(pod) = shared.pod() else { return };
        match admit(shared, &pod) {
            Admission::Admitted => break,
            Admission::Rejected => return,
            Admission::Pretend => {
                pretend(shared);
                let _ = stop.wait_for(Option::is_some).await;
                return;
            }
            Admission::NotMapped => {
                // The image of a pod may change; look again when it does.
                tokio::select! {
                    r = pod_rx.changed() => if r.is_err() { return },
                    _ = stop.wait_for(Option::is_some) => return,
                }
            }
        }
    }
    let Some(mut tokens) = set_up_volumes(shared, &mut stop).await else {
        return;
    };
    let Some(pod) = shared.pod() else { return };
    let spec = pod.spec.clone().unwrap_or_default();
    for i in 0..spec.init_containers.as_ref().map_or(0, Vec::len) {
        match run_container(shared.clone(), Slot::Init(i), stop.clone()).await {
            Outcome::Succeeded => {}
            Outcome::Failed | Outcome::Stopped => return,
        }
    }
    let mut set = JoinSet::new();
    for i in 0..spec.containers.len() {
        set.spawn(run_container(shared.clone(), Slot::App(i), stop.clone()).in_current_span());
    }
    let mut next_sync = tokio::time::Instant::now() + volumes::SYNC_PERIOD;
    loop {
        tokio::select! {
            r = set.join_next() => if r.is_none() { return },
            () = tokio::time::sleep_until(next_sync) => {
                next_sync = tokio::time::Instant::now() + volumes::SYNC_PERIOD;
                if let Some(pod) = shared.pod() {
                    match materialise(shared, &pod, &mut tokens).await {
                        Ok(v) => shared.state().volumes = v,
                        Err(err) => tracing::warn!(error = &err as &dyn std::error::Error, "re-syncing volumes failed"),
                    }
                }
                if let Some(at) = tokens.next_refresh() {
                    next_sync = next_sync.min(tokio::time::Instant::from_std(at));
                }
            }
        }
    }
}

fn pretend(shared: &Shared) {
    let now = status::now();
    let mut state = shared.state();
    state.sandbox_ready = true;
    for c in &mut state.init {
        c.state = State::Terminated(Terminated {
            exit_code: 0,
            signal: None,
            reason: "Completed".into(),
            message: None,
            started_at: now,
            finished_at: now,
            container_id: "hostlet://pretend".into(),
        });
    }
    for c in &mut state.containers {
        c.state = State::Running { started_at: now };
        c.ready = true;
        c.started = true;
        c.container_id = Some("hostlet://pretend".into());
    }
    drop(state);
    shared.notify.notify_one();
}

fn facts<'a>(shared: &Shared, pod: &'a Pod) -> PodFacts<'a> {
    let ip = shared
        .state()
        .pod_ip
        .unwrap_or(shared.ctx.config.node_ip)
        .to_string();
    PodFacts {
        pod,
        pod_ips: vec![ip],
        host_ip: shared.ctx.config.node_ip.to_string(),
        node_cpu_milli: shared.ctx.node_cpu_milli,
        node_memory: shared.ctx.node_memory,
    }
}

async fn materialise(
    shared: &Shared,
    pod: &Pod,
    tokens: &mut Tokens,
) -> Result<BTreeMap<String, Materialised>, volumes::VolumeError> {
    let owner = Owner {
        fs_group: pod
            .spec
            .as_ref()
            .and_then(|s| s.security_context.as_ref())
            .and_then(|s| s.fs_group)
            .and_then(|g| u32::try_from(g).ok()),
    };
    let facts = facts(shared, pod);
    volumes::materialise(
        &shared.ctx.client,
        &facts,
        &shared.dir.join("volumes"),
        owner,
        tokens,
    )
    .await
}

/// Sets up the volumes, retrying until they are (or the pod stops).
async fn set_up_volumes(
    shared: &Shared,
    stop: &mut watch::Receiver<Option<Instant>>,
) -> Option<Tokens> {
    let mut tokens = Tokens::default();
    let mut delay = Duration::from_secs(1);
    let mut last_message = String::new();
    loop {
        let pod = shared.pod()?;
        match materialise(shared, &pod, &mut tokens).await {
            Ok(v) => {
                let mut state = shared.state();
                state.volumes = v;
                state.sandbox_ready = true;
                let PodState {
                    init, containers, ..
                } = &mut *state;
                for c in init.iter_mut().chain(containers.iter_mut()) {
                    c.state = State::Waiting {
                        reason: "ContainerCreating".into(),
                        message: None,
                    };
                }
                drop(state);
                shared.notify.notify_one();
                return Some(tokens);
            }
            Err(err) => {
                let message = crate_error_chain(&err);
                if message != last_message {
                    tracing::warn!(
                        error = &err as &dyn std::error::Error,
                        "setting up volumes failed; retrying"
                    );
                    shared.event(EventType::Warning, "FailedMount", "Mount", &message);
                    let mut state = shared.state();
                    let PodState {
                        init, containers, ..
                    } = &mut *state;
                    for c in init.iter_mut().chain(containers.iter_mut()) {
                        c.state = State::Waiting {
                            reason: "ContainerCreating".into(),
                            message: Some(message.clone()),
                        };
                    }
                    drop(state);
                    shared.notify.notify_one();
                    last_message = message;
                }
                if wait_or_stop(stop, delay).await {
                    return None;
                }
                delay = (delay * 2).min(MAX_RETRY);
            }
        }
    }
}

fn crate_error_chain(err: &dyn std::error::Error) -> String {
    let mut out = err.to_string();
    let mut source = err.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

fn container_of(pod: &Pod, slot: Slot) -> Option<Container> {
    let spec = pod.spec.as_ref()?;
    match slot {
        Slot::Init(i) => spec.init_containers.as_ref()?.get(i).cloned(),
        Slot::App(i) => spec.containers.get(i).cloned(),
    }
}

/// Runs one container until it ends for good: restarts by policy with back-off.
#[allow(clippy::too_many_lines)]
async fn run_container(
    shared: Arc<Shared>,
    slot: Slot,
    mut stop: watch::Receiver<Option<Instant>>,
) -> Outcome {
    let mut backoff = Backoff::new(shared.ctx.config.initial_backoff);
    let mut config_delay = Duration::from_secs(1);
    let mut first = true;
    loop {
        if stop.borrow_and_update().is_some() {
            return Outcome::Stopped;
        }
        let Some(pod) = shared.pod() else {
            return Outcome::Stopped;
        };
        let Some(container) = container_of(&pod, slot) else {
            return Outcome::Failed;
        };
        let policy = pod
            .spec
            .as_ref()
            .and_then(|s| s.restart_policy.clone())
            .unwrap_or_else(|| "Always".into());
        let spec = match prepare(&shared, &pod, &container).await {
            Ok(spec) => spec,
            Err((reason, message)) => {
                shared.event(
                    EventType::Warning,
                    "Failed",
                    "Create",
                    &format!("Error: {message}"),
                );
                shared.update(slot, |c| {
                    c.state = State::Waiting {
                        reason,
                        message: Some(message),
                    };
                });
                if wait_or_stop(&mut stop, config_delay).await {
                    return Outcome::Stopped;
                }
                config_delay = (config_delay * 2).min(Duration::from_secs(10));
                continue;
            }
        };
        config_delay = Duration::from_secs(1);
        let spec_path = shared.dir.join(format!("{}.spec.json", container.name));
        let marker = shared.dir.join(format!("{}.marker", container.name));
        let _ = std::fs::remove_file(&marker);
        let spawned = container::write_spec(&spec_path, &spec)
            .and_then(|()| container::command(&spec_path, &shared.log_path(&container.name)))
            .and_then(|mut cmd| cmd.spawn());
        let mut child = match spawned {
            Ok(child) => child,
            Err(err) => {
                let message = format!("starting container {}: {err}", container.name);
                shared.event(EventType::Warning, "Failed", "Start", &message);
                shared.update(slot, |c| {
                    c.state = State::Waiting {
                        reason: "RunContainerError".into(),
                        message: Some(message),
                    };
                });
                if wait_or_stop(&mut stop, backoff.after_exit(Duration::ZERO)).await {
                    return Outcome::Stopped;
                }
                continue;
            }
        };
        let pid = child.id().and_then(|p| i32::try_from(p).ok()).unwrap_or(0);
        let container_id = format!("hostlet://{pid}");
        let started_at = status::now();
        let started_instant = Instant::now();
        let has_startup = container.startup_probe.is_some();
        let has_readiness = container.readiness_probe.is_some();
        shared.update(slot, |c| {
            if !first {
                c.restart_count += 1;
            }
            c.state = State::Running { started_at };
            c.container_id = Some(container_id.clone());
            c.started = !has_startup;
            c.ready = !has_startup && !has_readiness && matches!(slot, Slot::App(_));
        });
        first = false;
        tracing::info!(container = %container.name, pid, "started container");
        shared.event(
            EventType::Normal,
            "Started",
            "Start",
            &format!("Started container {}", container.name),
        );
        let end = supervise(
            &shared, slot, &pod, &container, &spec, &mut child, pid, &mut stop,
        )
        .await;
        // Whatever the process left behind in its process group dies with it, as in a
        // container whose init process exits.
        if pid > 0 {
            let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
        }
        let marker_text = std::fs::read_to_string(&marker).unwrap_or_default();
        let terminated = terminated(&end, &marker_text, started_at, &container_id);
        let success = terminated.exit_code == 0;
        tracing::info!(container = %container.name, exit_code = terminated.exit_code, reason = %terminated.reason, "container exited");
        let restart = !end.stopped
            && match slot {
                Slot::Init(_) => !success && policy != "Never",
                Slot::App(_) => match policy.as_str() {
                    "Never" => false,
                    "OnFailure" => !success,
                    _ => true,
                },
            };
        if !restart {
            shared.update(slot, |c| {
                c.state = State::Terminated(terminated);
                c.ready = false;
                c.container_id = None;
            });
            return if end.stopped {
                Outcome::Stopped
            } else if success {
                Outcome::Succeeded
            } else {
                Outcome::Failed
            };
        }
        let delay = backoff.after_exit(started_instant.elapsed());
        let message = format!(
            "back-off {}s restarting failed container={} pod={}",
            delay.as_secs(),
            container.name,
            shared.pod_label()
        );
        shared.event(
            EventType::Warning,
            "BackOff",
            "Start",
            &format!(
                "Back-off restarting failed container {} in pod {}",
                container.name,
                shared.pod_label()
            ),
        );
        let last = terminated.clone();
        shared.update(slot, |c| {
            c.state = State::Waiting {
                reason: "CrashLoopBackOff".into(),
                message: Some(message),
            };
            c.last = Some(last);
            c.ready = false;
            c.started = false;
            c.container_id = None;
        });
        if wait_or_stop(&mut stop, delay).await {
            shared.update(slot, |c| {
                c.state = State::Terminated(terminated);
            });
            return Outcome::Stopped;
        }
    }
}

struct End {
    status: Option<std::process::ExitStatus>,
    stopped: bool,
}

fn terminated(end: &End, marker: &str, started_at: jiff::Timestamp, id: &str) -> Terminated {
    use std::os::unix::process::ExitStatusExt as _;
    let finished_at = status::now();
    let (exit_code, signal) = match end.status {
        Some(s) => match (s.code(), s.signal()) {
            (Some(code), _) => (code, None),
            (None, Some(sig)) => (128 + sig, Some(sig)),
            (None, None) => (128, None),
        },
        None => (128, None),
    };
    let exec_reached = marker.starts_with(container::MARKER_EXEC) && !marker.contains("failed:");
    if !exec_reached && end.status.is_some() && !end.stopped {
        let detail = marker
            .lines()
            .find_map(|l| l.strip_prefix("failed: "))
            .unwrap_or("the container could not be set up; see its log");
        return Terminated {
            exit_code: 128,
            signal: None,
            reason: "StartError".into(),
            message: Some(detail.to_string()),
            started_at,
            finished_at,
            container_id: id.to_string(),
        };
    }
    Terminated {
        exit_code,
        signal,
        reason: if exit_code == 0 { "Completed" } else { "Error" }.into(),
        message: None,
        started_at,
        finished_at,
        container_id: id.to_string(),
    }
}

/// Watches one running process: its exit, its probes, and stop requests.
#[allow(clippy::too_many_arguments, clippy::too_many_lines)]
async fn supervise(
    shared: &Shared,
    slot: Slot,
    pod: &Pod,
    container: &Container,
    spec: &ExecSpec,
    child: &mut tokio::process::Child,
    pid: i32,
    stop: &mut watch::Receiver<Option<Instant>>,
) -> End {
    let target = Target {
        pod_ip: shared
            .state()
            .pod_ip
            .unwrap_or(shared.ctx.config.node_ip)
            .to_string(),
        container: container.clone(),
        exec_spec: Some(spec.clone()),
        spec_path: shared.dir.join(format!("{}.probe.json", container.name)),
    };
    let (tx, mut rx) = mpsc::channel::<(Kind, Result<(), String>)>(16);
    let mut probes = JoinSet::new();
    let is_app = matches!(slot, Slot::App(_));
    let startup = container.startup_probe.clone().filter(|_| is_app);
    let readiness = container.readiness_probe.clone().filter(|_| is_app);
    let liveness = container.liveness_probe.clone().filter(|_| is_app);
    let mut startup_tracker = startup.as_ref().map(|p| Tracker::new(Timing::of(p), false));
    let mut readiness_tracker = readiness
        .as_ref()
        .map(|p| Tracker::new(Timing::of(p), false));
    let mut liveness_tracker = liveness.as_ref().map(|p| Tracker::new(Timing::of(p), true));
    let mut startup_failures = 0_u32;
    let spawn_probe = |set: &mut JoinSet<()>, kind: Kind, probe: &Option<Probe>| {
        if let Some(p) = probe.clone() {
            // Each probe writes its own exec spec: two exec probes must not share a file.
            let mut target = target.clone();
            target.spec_path = shared.dir.join(format!(
                "{}.{}.probe.json",
                container.name,
                kind.name().to_lowercase()
            ));
            set.spawn(probe_loop(kind, p, target, tx.clone()));
        }
    };
    if startup.is_some() {
        spawn_probe(&mut probes, Kind::Startup, &startup);
    } else {
        spawn_probe(&mut probes, Kind::Readiness, &readiness);
        spawn_probe(&mut probes, Kind::Liveness, &liveness);
    }
    let grace_of_probe = |p: &Option<Probe>| {
        p.as_ref()
            .and_then(|p| p.termination_grace_period_seconds)
            .map_or_else(
                || grace_of(pod),
                |s| Duration::from_secs(u64::try_from(s).unwrap_or(0)),
            )
    };
    let mut kill_at: Option<tokio::time::Instant> = None;
    let mut stopped = false;
    let far = tokio::time::Instant::now() + Duration::from_secs(365 * 24 * 3600);
    let term = |deadline: Instant, kill_at: &mut Option<tokio::time::Instant>| {
        let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
        let at = tokio::time::Instant::from_std(deadline);
        *kill_at = Some(kill_at.map_or(at, |k| k.min(at)));
    };
    if let Some(deadline) = *stop.borrow_and_update() {
        stopped = true;
        term(deadline, &mut kill_at);
    }
    let status = loop {
        tokio::select! {
            status = child.wait() => break status.ok(),
            changed = stop.changed(), if !stopped => {
                let deadline = if changed.is_err() { Some(Instant::now()) } else { *stop.borrow_and_update() };
                if let Some(deadline) = deadline {
                    stopped = true;
                    shared.event(EventType::Normal, "Killing", "Kill", &format!("Stopping container {}", container.name));
                    term(deadline, &mut kill_at);
                }
            }
            () = tokio::time::sleep_until(kill_at.unwrap_or(far)), if kill_at.is_some() => {
                tracing::info!(container = %container.name, "grace period over; killing container");
                let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
                kill_at = None;
            }
            Some((kind, result)) = rx.recv() => {
                if let Err(message) = &result {
                    shared.event(EventType::Warning, "Unhealthy", "Probe", &format!("{} probe failed: {message}", kind.name()));
                }
                let ok = result.is_ok();
                match kind {
                    Kind::Startup => {
                        let Some(tracker) = startup_tracker.as_mut() else { continue };
                        if tracker.record(ok) {
                            probes.abort_all();
                            startup_tracker = None;
                            spawn_probe(&mut probes, Kind::Readiness, &readiness);
                            spawn_probe(&mut probes, Kind::Liveness, &liveness);
                            let ready = readiness.is_none();
                            shared.update(slot, |c| { c.started = true; c.ready = ready; });
                        } else if !ok {
                            startup_failures += 1;
                            let threshold = startup.as_ref().map_or(3, |p| Timing::of(p).failure_threshold);
                            if startup_failures >= threshold && kill_at.is_none() {
                                shared.event(EventType::Normal, "Killing", "Kill", &format!("Container {} failed startup probe, will be restarted", container.name));
                                term(Instant::now() + grace_of_probe(&startup), &mut kill_at);
                            }
                        }
                    }
                    Kind::Readiness => {
                        if let Some(tracker) = readiness_tracker.as_mut() {
                            let ready = tracker.record(ok);
                            shared.update(slot, |c| c.ready = ready);
                        }
                    }
                    Kind::Liveness => {
                        if let Some(tracker) = liveness_tracker.as_mut()
                            && !tracker.record(ok)
                            && kill_at.is_none()
                        {
                            shared.event(EventType::Normal, "Killing", "Kill", &format!("Container {} failed liveness probe, will be restarted", container.name));
                            term(Instant::now() + grace_of_probe(&liveness), &mut kill_at);
                            liveness_tracker = Some(Tracker::new(Timing::of(liveness.as_ref().unwrap_or(&Probe::default())), true));
                        }
                    }
                }
            }
        }
    };
    probes.abort_all();
    End { status, stopped }
}

async fn probe_loop(
    kind: Kind,
    probe: Probe,
    target: Target,
    tx: mpsc::Sender<(Kind, Result<(), String>)>,
) {
    let timing = Timing::of(&probe);
    tokio::time::sleep(timing.initial_delay).await;
    loop {
        let result = probe::run_once(&probe, &target, timing.timeout).await;
        if tx.send((kind, result)).await.is_err() {
            return;
        }
        tokio::time::sleep(timing.period).await;
    }
}

/// Builds the exec spec of a container: env, program, user, mounts.
#[allow(clippy::too_many_lines)]
async fn prepare(
    shared: &Shared,
    pod: &Pod,
    container: &Container,
) -> Result<ExecSpec, (String, String)> {
    let ctx = &shared.ctx;
    let config_error = |m: String| ("CreateContainerConfigError".to_string(), m);
    let image = container.image.clone().unwrap_or_default();
    let entry = ctx.config.image_map.entry(&image).ok_or_else(|| {
        (
            "ImageNotMapped".to_string(),
            format!("image {image} is not in the hostlet's image map"),
        )
    })?;
    // Env first: the program is looked up along the container's PATH.
    let fetched = fetch_env_objects(shared, container)
        .await
        .map_err(|e| config_error(crate_error_chain(&e)))?;
    let facts = facts(shared, pod);
    let mut runtime: Vec<(String, String)> = entry
        .env
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if !entry.env.contains_key("PATH") {
        runtime.push(("PATH".into(), crate::image_map::DEFAULT_PATH.into()));
    }
    runtime.push(("HOSTNAME".into(), shared.name.clone()));
    let (uid, gid, groups) = identity(pod, container, entry.user.unwrap_or(0));
    runtime.push(("HOME".into(), if uid == 0 { "/root" } else { "/" }.into()));
    let (host, port) = (&ctx.config.api_host, ctx.config.api_port);
    let service = vec![
        ("KUBERNETES_SERVICE_HOST".to_string(), host.clone()),
        ("KUBERNETES_SERVICE_PORT".to_string(), port.to_string()),
        (
            "KUBERNETES_SERVICE_PORT_HTTPS".to_string(),
            port.to_string(),
        ),
        (
            "KUBERNETES_PORT".to_string(),
            format!("tcp://{host}:{port}"),
        ),
        (
            format!("KUBERNETES_PORT_{port}_TCP"),
            format!("tcp://{host}:{port}"),
        ),
        (format!("KUBERNETES_PORT_{port}_TCP_PROTO"), "tcp".into()),
        (format!("KUBERNETES_PORT_{port}_TCP_PORT"), port.to_string()),
        (format!("KUBERNETES_PORT_{port}_TCP_ADDR"), host.clone()),
    ];
    let envs = env::build(
        &facts,
        &EnvInputs {
            container,
            runtime,
            service,
            fetched: &fetched,
        },
    )
    .map_err(|e| config_error(e.to_string()))?;
    let command = env::expand_all(container.command.as_deref().unwrap_or_default(), &envs);
    let args = env::expand_all(container.args.as_deref().unwrap_or_default(), &envs);
    let path = envs
        .iter()
        .rev()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| v.as_str());
    let resolved = ctx
        .config
        .image_map
        .resolve(&image, &command, &args, path)
        .map_err(|e| (e.reason().to_string(), e.to_string()))?;
    check_non_root(pod, container, uid, shared).map_err(config_error)?;
    let mut mounts = Vec::new();
    for (inside, host) in &resolved.files {
        if host.exists() {
            mounts.push(MountSpec {
                source: host.clone(),
                target: PathBuf::from(inside),
                read_only: true,
            });
        } else if *host != resolved.program {
            tracing::warn!(file = %host.display(), "a mapped image file does not exist; not mounting it");
        }
    }
    let volumes = shared.state().volumes.clone();
    let mut volume_mounts = Vec::new();
    for vm in container.volume_mounts.iter().flatten() {
        let volume = volumes
            .get(&vm.name)
            .ok_or_else(|| config_error(format!("volume {} is not defined by the pod", vm.name)))?;
        let mut source = volume.path.clone();
        if let Some(sub) = vm.sub_path.as_deref().filter(|s| !s.is_empty()) {
            let escapes = std::path::Path::new(sub)
                .components()
                .any(|c| !matches!(c, std::path::Component::Normal(_)));
            if escapes {
                return Err(config_error(format!("invalid subPath {sub}")));
            }
            source = source.join(sub);
            if !source.exists() && !volume.read_only {
                std::fs::create_dir_all(&source)
                    .map_err(|e| config_error(format!("creating subPath {sub}: {e}")))?;
            }
        }
        volume_mounts.push(MountSpec {
            source,
            target: PathBuf::from(&vm.mount_path),
            read_only: vm.read_only == Some(true) || volume.read_only,
        });
    }
    // Parents before children, as runtimes mount them.
    volume_mounts.sort_by_key(|m| m.target.components().count());
    mounts.extend(volume_mounts);
    // Executed at its in-image path (the bind mount), as a runtime would: the pod's own
    // mounts may hide the host path (an emptyDir at /tmp over a build under /tmp).
    let program = resolved
        .files
        .iter()
        .find(|(_, host)| **host == resolved.program && host.exists())
        .map_or_else(
            || resolved.program.clone(),
            |(inside, _)| PathBuf::from(inside),
        );
    let sc = container.security_context.as_ref();
    Ok(ExecSpec {
        program: Some(program),
        argv: resolved.argv,
        env: envs,
        working_dir: container
            .working_dir
            .clone()
            .filter(|w| !w.is_empty())
            .unwrap_or(resolved.working_dir),
        mounts,
        hostname: shared.name.clone(),
        uid,
        gid,
        groups,
        no_new_privs: sc.and_then(|s| s.allow_privilege_escalation) == Some(false),
        read_only_root: sc.and_then(|s| s.read_only_root_filesystem) == Some(true),
        parent_pid: i32::try_from(std::process::id()).unwrap_or_default(),
        marker: Some(shared.dir.join(format!("{}.marker", container.name))),
    })
}

/// uid, gid and supplementary groups of a container, as a runtime sets them.
fn identity(pod: &Pod, container: &Container, image_user: u32) -> (u32, u32, Vec<u32>) {
    let psc = pod.spec.as_ref().and_then(|s| s.security_context.as_ref());
    let csc = container.security_context.as_ref();
    let id = |v: Option<i64>| v.and_then(|v| u32::try_from(v).ok());
    let uid = id(csc.and_then(|s| s.run_as_user))
        .or_else(|| id(psc.and_then(|s| s.run_as_user)))
        .unwrap_or(image_user);
    let gid = id(csc.and_then(|s| s.run_as_group))
        .or_else(|| id(psc.and_then(|s| s.run_as_group)))
        .unwrap_or(0);
    let mut groups = BTreeSet::new();
    if let Some(g) = id(psc.and_then(|s| s.fs_group)) {
        groups.insert(g);
    }
    for g in psc
        .and_then(|s| s.supplemental_groups.clone())
        .unwrap_or_default()
    {
        if let Some(g) = id(Some(g)) {
            groups.insert(g);
        }
    }
    groups.insert(gid);
    (uid, gid, groups.into_iter().collect())
}

fn check_non_root(
    pod: &Pod,
    container: &Container,
    uid: u32,
    shared: &Shared,
) -> Result<(), String> {
    let psc = pod.spec.as_ref().and_then(|s| s.security_context.as_ref());
    let csc = container.security_context.as_ref();
    let non_root = csc
        .and_then(|s| s.run_as_non_root)
        .or_else(|| psc.and_then(|s| s.run_as_non_root))
        == Some(true);
    if !non_root || uid != 0 {
        return Ok(());
    }
    let explicit =
        csc.and_then(|s| s.run_as_user).is_some() || psc.and_then(|s| s.run_as_user).is_some();
    Err(if explicit {
        format!(
            "container's runAsUser breaks non-root policy (pod: \"{}\", container: {})",
            shared.pod_label(),
            container.name
        )
    } else {
        format!(
            "container has runAsNonRoot and image will run as root (pod: \"{}\", container: {})",
            shared.pod_label(),
            container.name
        )
    })
}

async fn fetch_env_objects(
    shared: &Shared,
    container: &Container,
) -> Result<Fetched, crate::Error> {
    let (secrets, config_maps) = env::referenced(container);
    let mut fetched = Fetched::default();
    let client = &shared.ctx.client;
    for name in secrets {
        if let Entry::Vacant(slot) = fetched.secrets.entry(name) {
            let s = api::get_opt::<Secret>(client, &shared.namespace, slot.key()).await?;
            slot.insert(s.map(volumes::secret_data));
        }
    }
    for name in config_maps {
        if let Entry::Vacant(slot) = fetched.config_maps.entry(name) {
            let c = api::get_opt::<ConfigMap>(client, &shared.namespace, slot.key()).await?;
            slot.insert(c.map(volumes::config_map_data));
        }
    }
    Ok(fetched)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(json: serde_json::Value) -> Pod {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn ports_occupy_the_pod_ip_and_host_ports_the_node() {
        let p = pod(serde_json::json!({
            "spec": { "containers": [{ "name": "c", "ports": [
                { "containerPort": 8080 },
                { "containerPort": 53, "protocol": "UDP", "hostPort": 5353 },
            ]}]}
        }));
        let pod_ip = Ipv4Addr::new(127, 1, 0, 5);
        let node = Ipv4Addr::new(127, 1, 0, 1);
        let keys: Vec<String> = port_keys(&p, pod_ip, node)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            keys,
            [
                "5353/UDP on 127.1.0.1",
                "53/UDP on 127.1.0.5",
                "8080/TCP on 127.1.0.5"
            ]
        );
    }

    #[test]
    fn identity_follows_container_then_pod_then_image() {
        let p = pod(serde_json::json!({
            "spec": {
                "securityContext": { "runAsUser": 1000, "fsGroup": 2000, "supplementalGroups": [3000] },
                "containers": [{ "name": "c", "securityContext": { "runAsGroup": 10 } }]
            }
        }));
        let c = &p.spec.as_ref().unwrap().containers[0];
        assert_eq!(identity(&p, c, 5), (1000, 10, vec![10, 2000, 3000]));
        let bare = pod(serde_json::json!({ "spec": { "containers": [{ "name": "c" }] } }));
        let c = &bare.spec.as_ref().unwrap().containers[0];
        assert_eq!(identity(&bare, c, 65532), (65532, 0, vec![0]));
    }
}
