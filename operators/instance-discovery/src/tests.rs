//! Pure tests of the status and the probe order.

use kontinuum_crds::v1alpha2::InstanceSpec;

use super::*;

fn instance() -> Instance {
    let mut i = Instance::new(
        "eu-west-1a-6d99cbd08f",
        InstanceSpec {
            interfaces: vec!["192.0.2.10".into()],
            ..InstanceSpec::default()
        },
    );
    i.metadata.generation = Some(2);
    i
}

fn probe(identity: &str) -> Probe {
    Probe {
        version: Some("v1.13.8".into()),
        interfaces: vec![InterfaceStatus {
            name: "eth0".into(),
            mac_address: Some("02:00:00:00:00:01".into()),
            addresses: vec!["192.0.2.10/24".into()],
        }],
        disks: vec![DiskStatus {
            name: "sda".into(),
            size_bytes: Some(1 << 30),
            ..DiskStatus::default()
        }],
        identity: Some(identity.into()),
    }
}

fn found(identity: &str) -> Outcome {
    Outcome::Found {
        address: "192.0.2.10".into(),
        probe: probe(identity),
    }
}

fn at(second: i64) -> Timestamp {
    Timestamp::from_second(second).unwrap()
}

fn discovered(s: &InstanceStatus) -> (String, String, String) {
    let c = conditions::get(&s.conditions, "Discovered").unwrap();
    (c.status.clone(), c.reason.clone(), c.message.clone())
}

#[test]
fn a_found_machine_is_recorded_and_discovered() {
    let s = status(&instance(), &found("abc"), None, at(100));
    assert_eq!(
        discovered(&s),
        (
            "True".into(),
            "Discovered".into(),
            "discovered via 192.0.2.10".into()
        )
    );
    assert!(conditions::is_true(&s.conditions, "Ready"));
    assert_eq!(s.identity.as_deref(), Some("abc"));
    assert_eq!(
        s.talos.as_ref().and_then(|t| t.version.as_deref()),
        Some("v1.13.8")
    );
    assert_eq!(s.interfaces.len(), 1);
    assert_eq!(s.disks.len(), 1);
    assert_eq!(s.address.as_deref(), Some("192.0.2.10"));
    assert_eq!(s.last_seen_time, Some(Time(at(100))));
    assert_eq!(s.observed_generation, Some(2));
}

#[test]
fn a_steady_machine_needs_no_write_until_last_seen_is_stale() {
    let mut i = instance();
    i.status = Some(status(&i, &found("abc"), None, at(100)));
    let again = status(&i, &found("abc"), None, at(160));
    assert_eq!(
        Some(&again),
        i.status.as_ref(),
        "one minute later nothing changed"
    );
    let later = status(&i, &found("abc"), None, at(100 + 600));
    assert_eq!(
        later.last_seen_time,
        Some(Time(at(700))),
        "refreshed after LAST_SEEN_RESOLUTION"
    );
}

#[test]
fn a_vanished_machine_goes_undiscovered_and_keeps_what_was_seen() {
    let mut i = instance();
    i.status = Some(status(&i, &found("abc"), None, at(100)));
    let s = status(
        &i,
        &Outcome::Failed {
            tried: 1,
            last: "192.0.2.10: connection refused".into(),
        },
        None,
        at(200),
    );
    let (st, reason, message) = discovered(&s);
    assert_eq!((st.as_str(), reason.as_str()), ("False", "ProbeFailed"));
    assert_eq!(
        message,
        "all 1 candidate(s) failed, last error: 192.0.2.10: connection refused"
    );
    assert_eq!(s.interfaces.len(), 1, "the last known interfaces stay");
    assert_eq!(s.last_seen_time, Some(Time(at(100))));
    assert!(!conditions::is_true(&s.conditions, "Ready"));
    // And back.
    let mut i2 = i.clone();
    i2.status = Some(s);
    let back = status(&i2, &found("abc"), None, at(300));
    assert_eq!(discovered(&back).0, "True");
    let ltt = conditions::get(&back.conditions, "Discovered")
        .unwrap()
        .last_transition_time
        .clone();
    assert_eq!(ltt, Time(at(300)));
}

#[test]
fn no_interfaces_is_reported() {
    let mut i = instance();
    i.spec.interfaces.clear();
    let s = status(&i, &Outcome::NoInterfaces, None, at(1));
    assert_eq!(
        discovered(&s),
        (
            "False".into(),
            "NoInterfaces".into(),
            "spec.interfaces is empty".into()
        )
    );
}

#[test]
fn a_new_identity_is_flagged_until_accepted() {
    let mut i = instance();
    i.status = Some(status(&i, &found("old"), None, at(100)));
    let swapped = status(&i, &found("new"), None, at(200));
    let (st, reason, message) = discovered(&swapped);
    assert_eq!((st.as_str(), reason.as_str()), ("False", "IdentityChanged"));
    assert!(
        message.contains("kontinuum.sh/accept-identity=new"),
        "{message}"
    );
    assert_eq!(
        swapped.identity.as_deref(),
        Some("old"),
        "the recorded identity stays until accepted"
    );
    let accepted = status(&i, &found("new"), Some("new"), at(300));
    assert_eq!(discovered(&accepted).0, "True");
    assert_eq!(accepted.identity.as_deref(), Some("new"));
}

#[tokio::test]
async fn addresses_are_tried_in_order_until_one_answers() {
    let prober: Prober = Arc::new(|address: String, _| {
        Box::pin(async move {
            if address == "10.0.0.2" {
                Ok(probe("x"))
            } else {
                Err(ProbeError(format!("refused by {address}")))
            }
        })
    });
    let addresses = vec!["10.0.0.1".to_string(), "10.0.0.2".into(), "10.0.0.3".into()];
    let outcome = probe_all(&prober, &addresses, Duration::from_millis(100)).await;
    assert!(
        matches!(outcome, Outcome::Found { ref address, .. } if address == "10.0.0.2"),
        "{outcome:?}"
    );
    let none = probe_all(&prober, &addresses[..1], Duration::from_millis(100)).await;
    assert_eq!(
        none,
        Outcome::Failed {
            tried: 1,
            last: "10.0.0.1: refused by 10.0.0.1".into()
        }
    );
    assert_eq!(
        probe_all(&prober, &[], Duration::from_millis(100)).await,
        Outcome::NoInterfaces
    );
}

#[tokio::test]
async fn a_prober_that_ignores_its_bound_is_cut_off() {
    let prober: Prober = Arc::new(|_, _| Box::pin(async { std::future::pending().await }));
    let outcome = tokio::time::timeout(
        Duration::from_secs(5),
        probe_all(
            &prober,
            &["10.0.0.9".to_string()],
            Duration::from_millis(50),
        ),
    )
    .await
    .unwrap();
    assert!(matches!(outcome, Outcome::Failed { .. }), "{outcome:?}");
}

fn pinned(identity: &str) -> Instance {
    let mut i = instance();
    i.spec.identity = Some(identity.into());
    i
}

#[test]
fn a_pinned_instance_records_only_the_pinned_machine() {
    // First discovery, another machine answers: nothing is recorded.
    let s = status(&pinned("abc"), &found("evil"), None, at(100));
    let (st, reason, message) = discovered(&s);
    assert_eq!((st.as_str(), reason.as_str()), ("False", "IdentityChanged"));
    assert!(
        message.contains("presents identity evil, not spec.identity abc"),
        "{message}"
    );
    assert_eq!(s.identity, None);
    assert_eq!(s.address, None);
    assert!(s.interfaces.is_empty());

    // The accept annotation does not override the user's pin.
    let s = status(&pinned("abc"), &found("evil"), Some("evil"), at(100));
    assert_eq!(discovered(&s).1, "IdentityChanged");

    // The pinned machine: discovered and recorded.
    let s = status(&pinned("abc"), &found("abc"), None, at(100));
    assert_eq!(discovered(&s).0, "True");
    assert_eq!(s.identity.as_deref(), Some("abc"));

    // A machine without a readable key never matches a pin.
    let mut no_key = probe("abc");
    no_key.identity = None;
    let outcome = Outcome::Found {
        address: "192.0.2.10".into(),
        probe: no_key,
    };
    let s = status(&pinned("abc"), &outcome, None, at(100));
    assert_eq!(discovered(&s).1, "IdentityChanged");
}

fn ready(s: &InstanceStatus) -> (String, String) {
    let c = conditions::get(&s.conditions, "Ready").unwrap();
    (c.status.clone(), c.reason.clone())
}

/// Conditions as (type, status, reason).
type Rows<'a> = &'a [(&'a str, &'a str, &'a str)];

/// A claimed Instance carrying the talos-bootstrapper's conditions.
fn claimed(bootstrapper: Rows<'_>) -> Instance {
    let mut i = instance();
    i.status = Some(status(&i, &found("abc"), None, at(100)));
    i.metadata
        .labels
        .get_or_insert_default()
        .insert(CLAIMED_BY.into(), "eu-1a-control-plane".into());
    let status = i.status.as_mut().unwrap();
    for (type_, s, reason) in bootstrapper {
        let c = Condition {
            type_: (*type_).into(),
            status: (*s).into(),
            reason: (*reason).into(),
            message: format!("{type_} is {s}"),
            last_transition_time: Time(at(120)),
            observed_generation: None,
        };
        conditions::set(&mut status.conditions, c, &Time(at(120)));
    }
    i
}

#[test]
fn a_claimed_instance_is_ready_when_the_bootstrappers_gates_are() {
    let rows: [(Rows<'_>, (&str, &str)); 6] = [
        // Claimed, not visited yet: Discovered no longer counts.
        (&[], ("Unknown", "Reconciling")),
        (
            &[("Configured", "False", "ConfigRejected")],
            ("False", "ConfigRejected"),
        ),
        // A worker: configured and joined.
        (
            &[
                ("Configured", "True", "ConfigApplied"),
                ("Joined", "True", "Joined"),
            ],
            ("True", "Ready"),
        ),
        // A control plane waits for its health check too.
        (
            &[
                ("Configured", "True", "ConfigApplied"),
                ("Joined", "True", "Joined"),
                ("Healthy", "Unknown", "Reconciling"),
            ],
            ("Unknown", "Reconciling"),
        ),
        (
            &[
                ("Configured", "True", "ConfigApplied"),
                ("Joined", "True", "Joined"),
                ("Healthy", "False", "Unhealthy"),
            ],
            ("False", "Unhealthy"),
        ),
        (
            &[
                ("Configured", "True", "ConfigApplied"),
                ("Joined", "True", "Joined"),
                ("Healthy", "True", "Healthy"),
            ],
            ("True", "Ready"),
        ),
    ];
    for (bootstrapper, (s, reason)) in rows {
        let i = claimed(bootstrapper);
        let next = summary(&i, at(130));
        assert_eq!(ready(&next), (s.into(), reason.into()), "{bootstrapper:?}");
        // Nothing of the discovery changes, and only Discovered and Ready are sent.
        assert_eq!(discovered(&next).0, "True");
        assert_eq!(next.address.as_deref(), Some("192.0.2.10"));
        let sent: Vec<_> = owned(&next)
            .conditions
            .into_iter()
            .map(|c| c.type_)
            .collect();
        assert_eq!(sent, ["Discovered", "Ready"]);
    }
}

#[test]
fn a_deleting_instance_is_not_ready() {
    let mut i = claimed(&[
        ("Configured", "True", "ConfigApplied"),
        ("Joined", "True", "Joined"),
    ]);
    i.metadata.deletion_timestamp = Some(Time(at(125)));
    assert_eq!(
        ready(&summary(&i, at(130))),
        ("False".into(), "Deleting".into())
    );
}
