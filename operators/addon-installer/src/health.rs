//! The pod-health probe and the CRD gate, as the reference describes them. The verdicts
//! are pure functions over what was read; [`crate::downstream`] does the reading.

use std::fmt::Write as _;

use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use kube::ResourceExt as _;

use crate::manifests::CrdInfo;

/// The label selectors that find a release's pods and workloads:
/// `app.kubernetes.io/instance=<release>` and, when it is a valid label value,
/// `helm.sh/chart=<chart>-<version>`.
pub fn selectors(release: &str, chart: &str, version: Option<&str>) -> Vec<String> {
    let mut out = vec![format!("app.kubernetes.io/instance={release}")];
    if let Some(version) = version {
        let value = format!("{chart}-{version}").replace('+', "_");
        if is_label_value(&value) {
            out.push(format!("helm.sh/chart={value}"));
        }
    }
    out
}

fn is_label_value(value: &str) -> bool {
    value.len() <= 63
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && value
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric())
        && value
            .chars()
            .last()
            .is_some_and(|c| c.is_ascii_alphanumeric())
}

/// The verdict on a release's pods (already deduplicated by UID): `None` if healthy, else
/// why not, naming the first unhealthy pod (by name). `workloads` is how many Jobs,
/// CronJobs, Deployments, DaemonSets and StatefulSets match the selectors: zero pods is
/// healthy only when there are none.
pub fn pods_verdict(pods: &[Pod], workloads: usize) -> Option<String> {
    if pods.is_empty() {
        return (workloads > 0).then(|| "no pods found yet".to_string());
    }
    let mut sorted: Vec<&Pod> = pods.iter().collect();
    sorted.sort_by_key(|p| p.name_any());
    sorted.into_iter().find_map(pod_problem)
}

/// Why one pod is not healthy: healthy is `Succeeded`, or `Running` with `Ready=True`.
pub fn pod_problem(pod: &Pod) -> Option<String> {
    let id = format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any());
    let status = pod.status.clone().unwrap_or_default();
    let phase = status.phase.clone().unwrap_or_else(|| "Pending".into());
    let conditions = status.conditions.clone().unwrap_or_default();
    let ready = conditions.iter().find(|c| c.type_ == "Ready");
    match phase.as_str() {
        "Succeeded" => None,
        "Running" => match ready {
            Some(c) if c.status == "True" => None,
            Some(_) => Some(format!(
                "{id} is Running but not Ready{}",
                container_detail(status.container_statuses.as_deref().unwrap_or_default())
            )),
            None => Some(format!("{id} is Running with no PodReady condition yet")),
        },
        _ => {
            let mut message = format!("{id} is {phase}");
            if let Some(c) = conditions
                .iter()
                .find(|c| c.status != "True" && c.message.as_deref().is_some_and(|m| !m.is_empty()))
            {
                let _ = write!(
                    message,
                    ": {}={}: {}",
                    c.type_,
                    c.status,
                    c.message.as_deref().unwrap_or_default()
                );
            }
            let init = status
                .init_container_statuses
                .as_deref()
                .unwrap_or_default()
                .iter()
                .map(init_detail)
                .collect::<Vec<_>>();
            if !init.is_empty() {
                message.push_str("; ");
                message.push_str(&init.join("; "));
            }
            Some(message)
        }
    }
}

/// `: container <name> is not ready (...)` for the first container that is not ready.
fn container_detail(statuses: &[ContainerStatus]) -> String {
    statuses
        .iter()
        .find(|c| !c.ready)
        .map(|c| format!(": container {} is not ready ({})", c.name, state_detail(c)))
        .unwrap_or_default()
}

fn init_detail(c: &ContainerStatus) -> String {
    format!("{} {}", c.name, state_detail(c))
}

/// `is waiting: <Reason>[: msg][ (restarted N times)][; last exit C: R[: msg]]`,
/// `is running (started at T)` or `exited C: R[: msg]`.
fn state_detail(c: &ContainerStatus) -> String {
    let state = c.state.clone().unwrap_or_default();
    if let Some(w) = state.waiting {
        let mut s = format!("is waiting: {}", w.reason.unwrap_or_default());
        if let Some(m) = w.message.filter(|m| !m.is_empty()) {
            let _ = write!(s, ": {m}");
        }
        if c.restart_count > 0 {
            let _ = write!(s, " (restarted {} times)", c.restart_count);
        }
        if let Some(t) = c.last_state.as_ref().and_then(|l| l.terminated.as_ref()) {
            let _ = write!(
                s,
                "; last exit {}: {}",
                t.exit_code,
                t.reason.clone().unwrap_or_default()
            );
            if let Some(m) = t.message.as_ref().filter(|m| !m.is_empty()) {
                let _ = write!(s, ": {m}");
            }
        }
        s
    } else if let Some(r) = state.running {
        match r.started_at {
            Some(t) => format!("is running (started at {})", t.0),
            None => "is running".to_string(),
        }
    } else if let Some(t) = state.terminated {
        let mut s = format!("exited {}: {}", t.exit_code, t.reason.unwrap_or_default());
        if let Some(m) = t.message.filter(|m| !m.is_empty()) {
            let _ = write!(s, ": {m}");
        }
        s
    } else {
        "has no state yet".to_string()
    }
}

/// What the CRD gate found for one CRD.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CrdState {
    /// Not on the cluster.
    Missing,
    /// Present, `Established` not True.
    NotEstablished,
    /// Established, but this served `group/version, Kind` is not in discovery.
    NotDiscoverable(String),
    /// Established and every served version discoverable.
    Ready,
}

/// The CRD gate's verdict: `None` when every CRD is ready, else the first problem, e.g.
/// `<crd>: crd not found yet`.
pub fn crd_verdict(states: &[(CrdInfo, CrdState)]) -> Option<String> {
    states.iter().find_map(|(crd, state)| match state {
        CrdState::Ready => None,
        CrdState::Missing => Some(format!("{}: crd not found yet", crd.name)),
        CrdState::NotEstablished => Some(format!("{}: crd not Established yet", crd.name)),
        CrdState::NotDiscoverable(gvk) => Some(format!("{}: {gvk} not discoverable yet", crd.name)),
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pod(name: &str, status: &serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": { "name": name, "namespace": "kube-system", "uid": name },
            "status": status
        }))
        .unwrap()
    }

    #[test]
    fn selectors_follow_the_reference() {
        assert_eq!(
            selectors("cilium", "cilium", Some("1.20.1")),
            [
                "app.kubernetes.io/instance=cilium",
                "helm.sh/chart=cilium-1.20.1"
            ]
        );
        assert_eq!(
            selectors("x", "c", Some("1.0.0+build")),
            [
                "app.kubernetes.io/instance=x",
                "helm.sh/chart=c-1.0.0_build"
            ]
        );
        assert_eq!(selectors("x", "c", None).len(), 1);
        let long = "v".repeat(70);
        assert_eq!(
            selectors("x", "c", Some(&long)).len(),
            1,
            "invalid label values are skipped"
        );
    }

    #[test]
    fn running_and_ready_or_succeeded_is_healthy() {
        let ready = pod(
            "a",
            &json!({ "phase": "Running", "conditions": [{ "type": "Ready", "status": "True" }] }),
        );
        let done = pod("b", &json!({ "phase": "Succeeded" }));
        assert_eq!(pods_verdict(&[ready, done], 2), None);
    }

    #[test]
    fn a_not_ready_pod_is_named_with_its_container() {
        let ready = pod(
            "a",
            &json!({ "phase": "Running", "conditions": [{ "type": "Ready", "status": "True" }] }),
        );
        let not_ready = pod(
            "cilium-x7",
            &json!({
                "phase": "Running",
                "conditions": [{ "type": "Ready", "status": "False" }],
                "containerStatuses": [{
                    "name": "cilium-agent", "ready": false, "restartCount": 3, "image": "i", "imageID": "",
                    "state": { "waiting": { "reason": "CrashLoopBackOff", "message": "back-off" } },
                    "lastState": { "terminated": { "exitCode": 1, "reason": "Error" } }
                }]
            }),
        );
        assert_eq!(
            pods_verdict(&[ready, not_ready], 1).unwrap(),
            "kube-system/cilium-x7 is Running but not Ready: container cilium-agent is not ready \
             (is waiting: CrashLoopBackOff: back-off (restarted 3 times); last exit 1: Error)"
        );
        let no_condition = pod("c", &json!({ "phase": "Running" }));
        assert_eq!(
            pod_problem(&no_condition).unwrap(),
            "kube-system/c is Running with no PodReady condition yet"
        );
    }

    #[test]
    fn pending_pods_report_conditions_and_init_containers() {
        let pending = pod(
            "p",
            &json!({
                "phase": "Pending",
                "conditions": [{ "type": "PodScheduled", "status": "False", "message": "0/1 nodes are available" }],
                "initContainerStatuses": [
                    { "name": "init", "ready": false, "restartCount": 0, "image": "i", "imageID": "",
                      "state": { "terminated": { "exitCode": 2, "reason": "Error", "message": "boom" } } },
                    { "name": "wait", "ready": false, "restartCount": 0, "image": "i", "imageID": "",
                      "state": { "running": { "startedAt": "2026-01-01T00:00:00Z" } } }
                ]
            }),
        );
        assert_eq!(
            pod_problem(&pending).unwrap(),
            "kube-system/p is Pending: PodScheduled=False: 0/1 nodes are available; \
             init exited 2: Error: boom; wait is running (started at 2026-01-01T00:00:00Z)"
        );
    }

    #[test]
    fn zero_pods_is_healthy_only_without_workloads() {
        assert_eq!(pods_verdict(&[], 0), None);
        assert_eq!(pods_verdict(&[], 1).unwrap(), "no pods found yet");
    }

    #[test]
    fn the_crd_gate_names_the_first_problem() {
        let crd = |n: &str| CrdInfo {
            name: n.into(),
            group: "g".into(),
            kind: "K".into(),
            served: vec!["v1".into()],
        };
        assert_eq!(crd_verdict(&[]), None);
        assert_eq!(crd_verdict(&[(crd("a"), CrdState::Ready)]), None);
        assert_eq!(
            crd_verdict(&[(crd("a"), CrdState::Ready), (crd("b"), CrdState::Missing)]).unwrap(),
            "b: crd not found yet"
        );
        assert_eq!(
            crd_verdict(&[(crd("a"), CrdState::NotEstablished)]).unwrap(),
            "a: crd not Established yet"
        );
        assert_eq!(
            crd_verdict(&[(crd("a"), CrdState::NotDiscoverable("g/v1, Kind=K".into()))]).unwrap(),
            "a: g/v1, Kind=K not discoverable yet"
        );
    }
}
