//! A pod's status from what the hostlet knows of its containers, computed as a kubelet
//! computes it (phase, conditions, container states). Pure: the caller passes the clock.

use std::collections::BTreeMap;

use jiff::Timestamp;
use serde_json::{Value, json};

/// A point in time with whole seconds, as the API stores it.
pub fn now() -> Timestamp {
    let t = Timestamp::now();
    Timestamp::from_second(t.as_second()).unwrap_or(t)
}

/// A terminated container instance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Terminated {
    /// Exit code (128 + signal when killed by a signal).
    pub exit_code: i32,
    /// The signal that killed it.
    pub signal: Option<i32>,
    /// `Completed`, `Error` or `StartError`.
    pub reason: String,
    /// Details.
    pub message: Option<String>,
    /// When it started.
    pub started_at: Timestamp,
    /// When it finished.
    pub finished_at: Timestamp,
    /// `hostlet://<pid>`.
    pub container_id: String,
}

/// A container's current state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum State {
    /// Not running: `ContainerCreating`, `CrashLoopBackOff`, `ImageNotMapped`, ...
    Waiting {
        /// Reason.
        reason: String,
        /// Message.
        message: Option<String>,
    },
    /// Running since.
    Running {
        /// Start time.
        started_at: Timestamp,
    },
    /// Terminated for good.
    Terminated(Terminated),
}

/// Everything reported about one container.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerState {
    /// Name.
    pub name: String,
    /// Image.
    pub image: String,
    /// Current state.
    pub state: State,
    /// The previous instance.
    pub last: Option<Terminated>,
    /// Restarts so far.
    pub restart_count: i32,
    /// Readiness.
    pub ready: bool,
    /// `started` (startup probe passed).
    pub started: bool,
    /// `hostlet://<pid>` while running.
    pub container_id: Option<String>,
}

impl ContainerState {
    /// A container waiting to be created.
    pub fn creating(name: &str, image: &str) -> Self {
        Self {
            name: name.to_string(),
            image: image.to_string(),
            state: State::Waiting {
                reason: "ContainerCreating".into(),
                message: None,
            },
            last: None,
            restart_count: 0,
            ready: false,
            started: false,
            container_id: None,
        }
    }

    fn succeeded(&self) -> bool {
        matches!(&self.state, State::Terminated(t) if t.exit_code == 0)
    }
}

/// The pod as the hostlet sees it.
#[derive(Clone, Debug)]
pub struct PodView<'a> {
    /// `Always`, `OnFailure` or `Never`.
    pub restart_policy: &'a str,
    /// Init containers.
    pub init: &'a [ContainerState],
    /// App containers.
    pub containers: &'a [ContainerState],
    /// A pod-level rejection: phase `Failed` with this reason and message.
    pub rejected: Option<(&'a str, &'a str)>,
    /// The pod's IP, once assigned.
    pub pod_ip: Option<&'a str>,
    /// The node's IP.
    pub host_ip: &'a str,
    /// When the hostlet accepted the pod.
    pub start_time: Timestamp,
    /// Volumes set up and IP assigned.
    pub sandbox_ready: bool,
    /// Every readiness gate condition is True.
    pub gates_ready: bool,
}

/// The pod's phase.
pub fn phase(view: &PodView<'_>) -> &'static str {
    if view.rejected.is_some() {
        return "Failed";
    }
    let init_failed = view
        .init
        .iter()
        .any(|c| matches!(&c.state, State::Terminated(t) if t.exit_code != 0));
    if init_failed && view.restart_policy == "Never" {
        return "Failed";
    }
    if !view.init.iter().all(ContainerState::succeeded) {
        return "Pending";
    }
    let (mut waiting, mut running, mut stopped, mut succeeded) = (0, 0, 0, 0);
    for c in view.containers {
        match &c.state {
            State::Running { .. } => running += 1,
            State::Terminated(t) => {
                stopped += 1;
                if t.exit_code == 0 {
                    succeeded += 1;
                }
            }
            State::Waiting { .. } => match &c.last {
                Some(last) => {
                    stopped += 1;
                    if last.exit_code == 0 {
                        succeeded += 1;
                    }
                }
                None => waiting += 1,
            },
        }
    }
    if waiting > 0 {
        "Pending"
    } else if running > 0 {
        "Running"
    } else if stopped > 0 {
        if view.restart_policy == "Always" {
            "Running"
        } else if stopped == succeeded {
            "Succeeded"
        } else if view.restart_policy == "Never" {
            "Failed"
        } else {
            "Running"
        }
    } else {
        "Pending"
    }
}

/// Last transition times of the pod's conditions, kept across status computations.
pub type Transitions = BTreeMap<String, (bool, Timestamp)>;

/// The `status` object to patch (strategic merge: conditions merge by type).
pub fn status_json(view: &PodView<'_>, transitions: &mut Transitions, now: Timestamp) -> Value {
    let phase = phase(view);
    let terminal = matches!(phase, "Succeeded" | "Failed");
    let unready: Vec<&str> = view
        .containers
        .iter()
        .filter(|c| !c.ready)
        .map(|c| c.name.as_str())
        .collect();
    let uninitialised: Vec<&str> = view
        .init
        .iter()
        .filter(|c| !c.succeeded())
        .map(|c| c.name.as_str())
        .collect();
    let mut condition = |type_: &str, ok: bool, reason: &str, message: String| {
        let entry = transitions.entry(type_.to_string()).or_insert((ok, now));
        if entry.0 != ok {
            *entry = (ok, now);
        }
        let mut c = json!({
            "type": type_,
            "status": if ok { "True" } else { "False" },
            "lastTransitionTime": entry.1.to_string(),
            "lastProbeTime": null,
        });
        // The status is written with a strategic merge patch, which merges conditions by
        // type: a True condition must delete the reason and message of its False past
        // (null deletes a key), or "containers with unready status" would outlive the fix.
        if ok {
            c["reason"] = Value::Null;
            c["message"] = Value::Null;
        } else {
            c["reason"] = reason.into();
            c["message"] = message.into();
        }
        c
    };
    let containers_ready = unready.is_empty() && !terminal;
    let list = |names: &[&str]| format!("[{}]", names.join(" "));
    let (ready_reason, ready_message) = if terminal {
        ("PodCompleted", String::new())
    } else {
        (
            "ContainersNotReady",
            format!("containers with unready status: {}", list(&unready)),
        )
    };
    let conditions = vec![
        condition(
            "PodReadyToStartContainers",
            view.sandbox_ready && !terminal,
            "",
            String::new(),
        ),
        condition(
            "Initialized",
            uninitialised.is_empty(),
            "ContainersNotInitialized",
            format!(
                "containers with incomplete status: {}",
                list(&uninitialised)
            ),
        ),
        condition(
            "ContainersReady",
            containers_ready,
            ready_reason,
            ready_message.clone(),
        ),
        condition(
            "Ready",
            containers_ready && view.gates_ready,
            ready_reason,
            if containers_ready {
                "the status of pod readiness gate is not \"True\"".into()
            } else {
                ready_message
            },
        ),
    ];
    let mut status = json!({
        "phase": phase,
        "hostIP": view.host_ip,
        "hostIPs": [{ "ip": view.host_ip }],
        "startTime": view.start_time.to_string(),
        "conditions": conditions,
        "containerStatuses": view.containers.iter().map(container_json).collect::<Vec<_>>(),
    });
    if !view.init.is_empty() {
        status["initContainerStatuses"] = view.init.iter().map(container_json).collect();
    }
    if let Some(ip) = view.pod_ip {
        status["podIP"] = ip.into();
        status["podIPs"] = json!([{ "ip": ip }]);
    }
    if let Some((reason, message)) = view.rejected {
        status["reason"] = reason.into();
        status["message"] = message.into();
    }
    status
}

fn terminated_json(t: &Terminated) -> Value {
    let mut v = json!({
        "exitCode": t.exit_code,
        "reason": t.reason,
        "startedAt": t.started_at.to_string(),
        "finishedAt": t.finished_at.to_string(),
        "containerID": t.container_id,
    });
    if let Some(s) = t.signal {
        v["signal"] = s.into();
    }
    if let Some(m) = &t.message {
        v["message"] = m.clone().into();
    }
    v
}

fn container_json(c: &ContainerState) -> Value {
    let state = match &c.state {
        State::Waiting { reason, message } => {
            let mut w = json!({ "reason": reason });
            if let Some(m) = message {
                w["message"] = m.clone().into();
            }
            json!({ "waiting": w })
        }
        State::Running { started_at } => {
            json!({ "running": { "startedAt": started_at.to_string() } })
        }
        State::Terminated(t) => json!({ "terminated": terminated_json(t) }),
    };
    let mut v = json!({
        "name": c.name,
        "image": c.image,
        "imageID": format!("hostlet://{}", c.image),
        "ready": c.ready,
        "started": c.started,
        "restartCount": c.restart_count,
        "state": state,
        "lastState": c.last.as_ref().map_or_else(|| json!({}), |t| json!({ "terminated": terminated_json(t) })),
    });
    if let Some(id) = &c.container_id {
        v["containerID"] = id.clone().into();
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(code: i32) -> Terminated {
        Terminated {
            exit_code: code,
            signal: None,
            reason: if code == 0 { "Completed" } else { "Error" }.into(),
            message: None,
            started_at: Timestamp::UNIX_EPOCH,
            finished_at: Timestamp::UNIX_EPOCH,
            container_id: "hostlet://1".into(),
        }
    }

    fn c(state: State, last: Option<Terminated>) -> ContainerState {
        ContainerState {
            state,
            last,
            ..ContainerState::creating("c", "img")
        }
    }

    fn running() -> State {
        State::Running {
            started_at: Timestamp::UNIX_EPOCH,
        }
    }

    fn backoff() -> State {
        State::Waiting {
            reason: "CrashLoopBackOff".into(),
            message: None,
        }
    }

    fn view<'a>(
        policy: &'a str,
        init: &'a [ContainerState],
        cs: &'a [ContainerState],
    ) -> PodView<'a> {
        PodView {
            restart_policy: policy,
            init,
            containers: cs,
            rejected: None,
            pod_ip: Some("127.0.0.2"),
            host_ip: "127.0.0.1",
            start_time: Timestamp::UNIX_EPOCH,
            sandbox_ready: true,
            gates_ready: true,
        }
    }

    #[test]
    fn phases_follow_the_kubelet() {
        let creating = [ContainerState::creating("c", "i")];
        assert_eq!(phase(&view("Always", &[], &creating)), "Pending");
        assert_eq!(
            phase(&view("Always", &[], &[c(running(), None)])),
            "Running"
        );
        assert_eq!(
            phase(&view("Always", &[], &[c(backoff(), Some(t(1)))])),
            "Running"
        );
        assert_eq!(
            phase(&view("Never", &[], &[c(State::Terminated(t(0)), None)])),
            "Succeeded"
        );
        assert_eq!(
            phase(&view("Never", &[], &[c(State::Terminated(t(2)), None)])),
            "Failed"
        );
        assert_eq!(
            phase(&view("OnFailure", &[], &[c(State::Terminated(t(0)), None)])),
            "Succeeded"
        );
        assert_eq!(
            phase(&view("OnFailure", &[], &[c(backoff(), Some(t(1)))])),
            "Running"
        );
        let init_running = [c(running(), None)];
        assert_eq!(phase(&view("Always", &init_running, &creating)), "Pending");
        let init_failed = [c(State::Terminated(t(1)), None)];
        assert_eq!(phase(&view("Never", &init_failed, &creating)), "Failed");
        let mut v = view("Always", &[], &creating);
        v.rejected = Some(("NodePorts", "Pod was rejected"));
        assert_eq!(phase(&v), "Failed");
    }

    #[test]
    fn conditions_keep_their_transition_times() {
        let mut tr = Transitions::new();
        let t0 = Timestamp::from_second(1_000).unwrap();
        let t1 = Timestamp::from_second(2_000).unwrap();
        let mut ready = c(running(), None);
        let cs = [ready.clone()];
        let s = status_json(&view("Always", &[], &cs), &mut tr, t0);
        let cond = |s: &Value, ty: &str| {
            s["conditions"]
                .as_array()
                .unwrap()
                .iter()
                .find(|c| c["type"] == ty)
                .unwrap()
                .clone()
        };
        assert_eq!(cond(&s, "Ready")["status"], "False");
        assert_eq!(
            cond(&s, "Ready")["message"],
            "containers with unready status: [c]"
        );
        let again = status_json(&view("Always", &[], &cs), &mut tr, t1);
        assert_eq!(s, again, "nothing changed, nothing to write");
        ready.ready = true;
        let cs = [ready];
        let s = status_json(&view("Always", &[], &cs), &mut tr, t1);
        assert_eq!(cond(&s, "Ready")["status"], "True");
        assert_eq!(cond(&s, "Ready")["lastTransitionTime"], t1.to_string());
        // Explicit nulls: the strategic merge patch deletes the False past's reason and
        // message instead of keeping them beside `status: True`.
        let ready = cond(&s, "Ready");
        assert_eq!(ready.get("message"), Some(&Value::Null));
        assert_eq!(ready.get("reason"), Some(&Value::Null));
        assert_eq!(
            cond(&s, "Initialized")["lastTransitionTime"],
            t0.to_string()
        );
        assert_eq!(s["podIP"], "127.0.0.2");
        assert_eq!(
            s["containerStatuses"][0]["state"]["running"]["startedAt"],
            Timestamp::UNIX_EPOCH.to_string()
        );
    }
}
