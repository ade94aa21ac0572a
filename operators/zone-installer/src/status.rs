//! The Zone's conditions, pure: what each step observed becomes a [`Verdict`], and the
//! verdicts become the status ([`status`]), with `Ready` summarised from the gates
//! (`ClusterReady`, `Installed`, `RegistryJoined`, in that order) and never latched.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kontinuum_crds::conditions::{self, ConditionStatus};
use kontinuum_crds::reasons::{TalosClusterCondition, ZoneCondition as Cond, ZoneReason as Reason};
use kontinuum_crds::v1alpha2::{Kontinuum, TalosCluster, Zone, ZoneStatus};
use kube::ResourceExt as _;

use crate::footprint::{CertificateState, Observed};

/// One condition's status, reason and message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// True, False or Unknown.
    pub status: ConditionStatus,
    /// The reason token.
    pub reason: Reason,
    /// For humans; no secrets, no timestamps that change on every reconcile.
    pub message: String,
}

impl Verdict {
    /// A verdict.
    pub fn new(status: ConditionStatus, reason: Reason, message: impl Into<String>) -> Self {
        Self {
            status,
            reason,
            message: message.into(),
        }
    }

    /// `Unknown`/`Reconciling`: not evaluated in this reconcile.
    pub fn not_evaluated(why: impl Into<String>) -> Self {
        Self::new(ConditionStatus::Unknown, Reason::Reconciling, why)
    }

    /// Whether the condition is True.
    pub fn is_true(&self) -> bool {
        self.status == ConditionStatus::True
    }
}

/// Pure: `ClusterReady` from the zone's TalosCluster (found by the Zone's name) and the
/// seed refusals of the fan-out.
pub fn cluster_ready(name: &str, cluster: Option<&TalosCluster>, refused: Option<&str>) -> Verdict {
    if let Some(message) = refused {
        return Verdict::new(ConditionStatus::False, Reason::SeedInstanceClaimed, message);
    }
    let Some(cluster) = cluster else {
        return Verdict::new(
            ConditionStatus::False,
            Reason::TalosClusterNotFound,
            format!("no TalosCluster named {name:?} found yet"),
        );
    };
    if cluster.metadata.deletion_timestamp.is_some() {
        return Verdict::new(
            ConditionStatus::False,
            Reason::WaitingForTalosCluster,
            format!("TalosCluster {name} is being deleted"),
        );
    }
    let ready = cluster
        .status
        .as_ref()
        .and_then(|s| conditions::get(&s.conditions, TalosClusterCondition::Ready));
    match ready {
        Some(c) if c.status == ConditionStatus::True.as_str() => Verdict::new(
            ConditionStatus::True,
            Reason::ClusterReady,
            format!("TalosCluster {name} is Ready"),
        ),
        Some(c) => Verdict::new(
            ConditionStatus::False,
            Reason::WaitingForTalosCluster,
            format!(
                "waiting for TalosCluster {name} to become Ready ({}: {})",
                c.reason, c.message
            ),
        ),
        None => Verdict::new(
            ConditionStatus::False,
            Reason::WaitingForTalosCluster,
            format!("waiting for TalosCluster {name} to become Ready (not reported yet)"),
        ),
    }
}

/// Pure: `Installed` from what the footprint's apply observed in the zone cluster. `host`
/// is the zone endpoint (with a domain).
pub fn installed(observed: &Observed, host: Option<&str>, gateway_class: &str) -> Verdict {
    if let Some(class) = &observed.gateway_class_missing {
        return Verdict::new(
            ConditionStatus::False,
            Reason::GatewayClassNotFound,
            format!(
                "GatewayClass {class} does not exist in the zone cluster, so Gateway kontinuum is not programmed and {} is not exposed (the operator's --gateway-class is {gateway_class})",
                host.unwrap_or("the zone endpoint")
            ),
        );
    }
    match (&observed.certificate, host) {
        (Some(CertificateState::Ready), Some(host)) => Verdict::new(
            ConditionStatus::True,
            Reason::Installed,
            format!("zone agent installed and served at https://{host}"),
        ),
        (Some(CertificateState::NotReady { reason, message }), _) => Verdict::new(
            ConditionStatus::False,
            Reason::WaitingForCertificate,
            format!(
                "waiting for cert-manager to issue the certificate of {} ({reason}: {message})",
                host.unwrap_or("the zone endpoint")
            ),
        ),
        _ => Verdict::new(
            ConditionStatus::True,
            Reason::Installed,
            "zone agent installed (no spec.domain and no --dns-domain: network exposure skipped)",
        ),
    }
}

/// Pure: `RegistryJoined` from the hub's Kontinuum objects: True while one with this
/// region and zone heartbeated within `ttl` of `now`. Also returns when that stops being
/// true (the newest heartbeat plus `ttl`), to requeue at that instant.
pub fn registry_joined(
    region: &str,
    zone: &str,
    kontinuums: &[&Kontinuum],
    now: Timestamp,
    ttl: Duration,
) -> (Verdict, Option<Timestamp>) {
    let ttl = SignedDuration::try_from(ttl).unwrap_or(SignedDuration::MAX);
    let newest = kontinuums
        .iter()
        .filter(|k| {
            k.spec.region.as_deref() == Some(region) && k.spec.zone.as_deref() == Some(zone)
        })
        .filter_map(|k| {
            let beat = k.status.as_ref()?.last_heartbeat_time.as_ref()?.0;
            Some((beat, k.name_any()))
        })
        .max();
    let waiting =
        |why: String| Verdict::new(ConditionStatus::False, Reason::WaitingForRegistry, why);
    match newest {
        None => (
            waiting(format!(
                "waiting for the zone agent of {region}/{zone} to register in the hub's registry"
            )),
            None,
        ),
        Some((beat, name)) => match beat.checked_add(ttl).ok().filter(|until| *until > now) {
            Some(until) => (
                Verdict::new(
                    ConditionStatus::True,
                    Reason::RegistryJoined,
                    format!("Kontinuum {name} of this zone is registered and heartbeating"),
                ),
                Some(until),
            ),
            None => (
                waiting(format!(
                    "Kontinuum {name} of this zone has not heartbeated within the registry TTL of {}s",
                    ttl.as_secs()
                )),
                None,
            ),
        },
    }
}

/// What one reconcile found, step by step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    /// `ClusterReady`.
    pub cluster_ready: Verdict,
    /// `Installed`.
    pub installed: Verdict,
    /// `RegistryJoined`.
    pub registry_joined: Verdict,
    /// The thumbprint of the identity in use (kept when not evaluated).
    pub identity_thumbprint: Option<String>,
    /// The rotation annotation value handled.
    pub identity_rotation: Option<String>,
    /// The zone endpoint's host name.
    pub endpoint: Option<String>,
    /// Whether every step succeeded (then `observedGeneration` is recorded).
    pub complete: bool,
}

/// Pure: the Zone's status after a reconcile that produced `report`. `Deleting` is dropped
/// (the Zone is not being deleted); `Ready` is the summary of the gates.
pub fn status(zone: &Zone, report: &Report, now: &Time) -> ZoneStatus {
    let generation = zone.metadata.generation;
    let mut status = zone.status.clone().unwrap_or_default();
    for (type_, verdict) in [
        (Cond::ClusterReady, &report.cluster_ready),
        (Cond::Installed, &report.installed),
        (Cond::RegistryJoined, &report.registry_joined),
    ] {
        conditions::set(
            &mut status.conditions,
            conditions::new(
                type_,
                verdict.status,
                verdict.reason,
                verdict.message.clone(),
                generation,
            ),
            now,
        );
    }
    conditions::remove(&mut status.conditions, Cond::Deleting);
    let ready = conditions::ready(&status.conditions, Cond::READY_GATES, false, generation);
    conditions::set(&mut status.conditions, ready, now);
    status
        .identity_thumbprint
        .clone_from(&report.identity_thumbprint);
    status
        .identity_rotation
        .clone_from(&report.identity_rotation);
    status.endpoint.clone_from(&report.endpoint);
    if report.complete {
        status.observed_generation = generation;
    }
    status
}

/// Pure: the status while the Zone is torn down: `Deleting=True` with `reason` and
/// `message`, `Ready=False/Deleting` repeating it.
pub fn deleting(zone: &Zone, reason: Reason, message: String, now: &Time) -> ZoneStatus {
    let mut status = zone.status.clone().unwrap_or_default();
    conditions::set_deleting(
        &mut status.conditions,
        Cond::READY_GATES,
        reason,
        message,
        zone.metadata.generation,
        now,
    );
    status
}

/// The teardown deadline: `deletionTimestamp + timeout`.
pub fn teardown_deadline(zone: &Zone, timeout: Duration) -> Option<Timestamp> {
    kontinuum_operator_common::finalizer::deadline(zone, timeout)
}

/// The condition types whose status or reason differ between `before` and `after`, with
/// their new condition: the transitions to announce as Events.
pub fn transitions<'a>(
    before: Option<&ZoneStatus>,
    after: &'a ZoneStatus,
) -> Vec<&'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    after
        .conditions
        .iter()
        .filter(|c| c.type_ != Cond::Ready.as_str())
        .filter(|c| {
            before
                .and_then(|b| conditions::get(&b.conditions, &c.type_))
                .is_none_or(|old| old.status != c.status || old.reason != c.reason)
        })
        .filter(|c| c.reason != Reason::Reconciling.as_str())
        .collect()
}

/// Whether a reason reports a failure a human should notice (a Warning Event).
pub fn is_failure(reason: &str) -> bool {
    [
        Reason::FanOutFailed,
        Reason::SeedInstanceClaimed,
        Reason::NoStorageSecretFound,
        Reason::NoAuthMode,
        Reason::InstallFailed,
        Reason::GatewayClassNotFound,
        Reason::IdentityRevoked,
        Reason::DownstreamTeardownFailed,
        Reason::TalosClusterDeleteFailed,
        Reason::TeardownDeadlineExceeded,
    ]
    .iter()
    .any(|r| r.as_str() == reason)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ConditionStatus::{False, True, Unknown};
    use serde_json::json;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(seconds).unwrap()
    }

    fn zone() -> Zone {
        serde_json::from_value(json!({
            "apiVersion": "kontinuum.sh/v1alpha2", "kind": "Zone",
            "metadata": { "name": "eu-a", "namespace": "ns", "generation": 4 },
            "spec": { "region": "eu", "zone": "a" },
        }))
        .unwrap()
    }

    fn cluster(ready: Option<(&str, &str)>, deleting: bool) -> TalosCluster {
        let mut c: TalosCluster = serde_json::from_value(json!({
            "apiVersion": "kontinuum.sh/v1alpha2", "kind": "TalosCluster",
            "metadata": { "name": "eu-a", "namespace": "ns" },
            "spec": { "controlPlane": { "poolRef": { "name": "eu-a" } } },
        }))
        .unwrap();
        if let Some((status, reason)) = ready {
            c.status = Some(
                serde_json::from_value(json!({ "conditions": [{
                "type": "Ready", "status": status, "reason": reason, "message": "m",
                "lastTransitionTime": "2026-01-01T00:00:00Z" }] }))
                .unwrap(),
            );
        }
        if deleting {
            c.metadata.deletion_timestamp = Some(Time(at(1)));
        }
        c
    }

    fn kontinuum(region: &str, zone: &str, beat: Option<i64>) -> Kontinuum {
        let mut k: Kontinuum = serde_json::from_value(json!({
            "apiVersion": "kontinuum.sh/v1alpha2", "kind": "Kontinuum",
            "metadata": { "name": format!("{region}-{zone}-agent") },
            "spec": { "region": region, "zone": zone },
        }))
        .unwrap();
        if let Some(s) = beat {
            k.status = Some(kontinuum_crds::v1alpha2::KontinuumStatus {
                last_heartbeat_time: Some(Time(at(s))),
                ..Default::default()
            });
        }
        k
    }

    #[test]
    fn cluster_ready_table() {
        let table: [(Option<TalosCluster>, Option<&str>, ConditionStatus, Reason); 6] = [
            (None, None, False, Reason::TalosClusterNotFound),
            (
                Some(cluster(None, false)),
                None,
                False,
                Reason::WaitingForTalosCluster,
            ),
            (
                Some(cluster(Some(("False", "AddonsNotReady")), false)),
                None,
                False,
                Reason::WaitingForTalosCluster,
            ),
            (
                Some(cluster(Some(("True", "Ready")), true)),
                None,
                False,
                Reason::WaitingForTalosCluster,
            ),
            (
                Some(cluster(Some(("True", "Ready")), false)),
                None,
                True,
                Reason::ClusterReady,
            ),
            (
                Some(cluster(Some(("True", "Ready")), false)),
                Some("Instance x is claimed"),
                False,
                Reason::SeedInstanceClaimed,
            ),
        ];
        for (c, refused, status, reason) in table {
            let v = cluster_ready("eu-a", c.as_ref(), refused);
            assert_eq!((v.status, v.reason), (status, reason), "{v:?}");
        }
        let v = cluster_ready(
            "eu-a",
            Some(&cluster(Some(("False", "AddonsNotReady")), false)),
            None,
        );
        assert!(v.message.contains("AddonsNotReady"), "{}", v.message);
    }

    #[test]
    fn installed_table() {
        let observed = |gateway: Option<&str>, cert: Option<CertificateState>| Observed {
            gateway_class_missing: gateway.map(str::to_owned),
            certificate: cert,
            agent_available: true,
        };
        let not_ready = CertificateState::NotReady {
            reason: "Pending".into(),
            message: "issuing".into(),
        };
        let host = Some("a.eu.example.com");
        let table = [
            (
                observed(None, None),
                None,
                True,
                Reason::Installed,
                "network exposure skipped",
            ),
            (
                observed(None, Some(CertificateState::Ready)),
                host,
                True,
                Reason::Installed,
                "https://a.eu.example.com",
            ),
            (
                observed(None, Some(not_ready.clone())),
                host,
                False,
                Reason::WaitingForCertificate,
                "Pending: issuing",
            ),
            (
                observed(Some("cilium"), Some(not_ready)),
                host,
                False,
                Reason::GatewayClassNotFound,
                "GatewayClass cilium does not exist",
            ),
            (
                observed(Some("cilium"), Some(CertificateState::Ready)),
                host,
                False,
                Reason::GatewayClassNotFound,
                "not exposed",
            ),
        ];
        for (o, host, status, reason, text) in table {
            let v = installed(&o, host, "cilium");
            assert_eq!((v.status, v.reason), (status, reason), "{v:?}");
            assert!(v.message.contains(text), "{}", v.message);
        }
    }

    #[test]
    fn registry_joined_expires_and_is_never_latched() {
        let ttl = Duration::from_secs(300);
        let mine = kontinuum("eu", "a", Some(1000));
        let other_zone = kontinuum("eu", "b", Some(1290));
        let silent = kontinuum("eu", "a", None);
        let (v, until) = registry_joined("eu", "a", &[&other_zone, &silent], at(1100), ttl);
        assert_eq!((v.status, v.reason), (False, Reason::WaitingForRegistry));
        assert_eq!(until, None);
        let (v, until) = registry_joined("eu", "a", &[&mine, &other_zone], at(1100), ttl);
        assert_eq!((v.status, v.reason), (True, Reason::RegistryJoined));
        assert_eq!(until, Some(at(1300)), "requeue at the expiry instant");
        let (v, until) = registry_joined("eu", "a", &[&mine], at(1300), ttl);
        assert_eq!((v.status, v.reason), (False, Reason::WaitingForRegistry));
        assert!(v.message.contains("300s"), "{}", v.message);
        assert_eq!(until, None);
        let newer = kontinuum("eu", "a", Some(1250));
        let (v, until) = registry_joined("eu", "a", &[&mine, &newer], at(1300), ttl);
        assert!(v.is_true());
        assert_eq!(until, Some(at(1550)));
    }

    fn report(c: Verdict, i: Verdict, r: Verdict, complete: bool) -> Report {
        Report {
            cluster_ready: c,
            installed: i,
            registry_joined: r,
            identity_thumbprint: Some("ab".into()),
            identity_rotation: None,
            endpoint: None,
            complete,
        }
    }

    #[test]
    fn ready_follows_the_first_gate_that_is_not_true() {
        let now = Time(at(10));
        let t = |r| Verdict::new(True, r, "ok");
        let waiting = Verdict::new(False, Reason::WaitingForRegistry, "waiting for the agent");
        let s = status(
            &zone(),
            &report(t(Reason::ClusterReady), t(Reason::Installed), waiting, true),
            &now,
        );
        let ready = conditions::get(&s.conditions, "Ready").unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", "WaitingForRegistry")
        );
        assert_eq!(s.observed_generation, Some(4));
        assert_eq!(s.identity_thumbprint.as_deref(), Some("ab"));

        let mut z = zone();
        z.status = Some(s);
        let all = status(
            &z,
            &report(
                t(Reason::ClusterReady),
                t(Reason::Installed),
                t(Reason::RegistryJoined),
                true,
            ),
            &Time(at(20)),
        );
        let ready = conditions::get(&all.conditions, "Ready").unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("True", "Ready")
        );
        assert_eq!(ready.last_transition_time, Time(at(20)));

        z.status = Some(all);
        let lost = Verdict::new(False, Reason::WaitingForRegistry, "gone");
        let again = status(
            &z,
            &report(t(Reason::ClusterReady), t(Reason::Installed), lost, false),
            &Time(at(30)),
        );
        assert_eq!(
            conditions::status(&again.conditions, "Ready"),
            False,
            "never latched"
        );
        let unknown = status(
            &zone(),
            &report(
                Verdict::not_evaluated("x"),
                Verdict::not_evaluated("y"),
                Verdict::not_evaluated("z"),
                false,
            ),
            &now,
        );
        assert_eq!(conditions::status(&unknown.conditions, "Ready"), Unknown);
        assert_eq!(
            unknown.observed_generation, None,
            "incomplete reconciles do not record the generation"
        );
        for c in ["ClusterReady", "Installed", "RegistryJoined", "Ready"] {
            assert!(
                conditions::get(&unknown.conditions, c).is_some(),
                "{c} written on the first visit"
            );
        }
    }

    #[test]
    fn deleting_status_and_transitions() {
        let now = Time(at(10));
        let s = deleting(
            &zone(),
            Reason::Deleting,
            "removing the footprint".into(),
            &now,
        );
        assert_eq!(conditions::status(&s.conditions, "Deleting"), True);
        let ready = conditions::get(&s.conditions, "Ready").unwrap();
        assert_eq!(
            (
                ready.status.as_str(),
                ready.reason.as_str(),
                ready.message.as_str()
            ),
            ("False", "Deleting", "removing the footprint")
        );
        let changed = transitions(None, &s);
        assert_eq!(changed.len(), 1);
        assert!(transitions(Some(&s), &s).is_empty());
        assert!(is_failure("IdentityRevoked") && !is_failure("Installed"));
        let mut z = zone();
        z.metadata.deletion_timestamp = Some(Time(at(100)));
        assert_eq!(
            teardown_deadline(&z, Duration::from_secs(900)),
            Some(at(1000))
        );
    }
}
