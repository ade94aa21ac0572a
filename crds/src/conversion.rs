//! Pure conversions of [`Kontinuum`](crate::v1alpha2::Kontinuum) between `v1alpha1` and
//! `v1alpha2` (the hub), for the conversion webhook the registry serves.
//!
//! | `v1alpha1` | `v1alpha2` |
//! | --- | --- |
//! | `metadata` | `metadata` (unchanged) |
//! | `spec.region`, `spec.zone` | `spec.region`, `spec.zone` |
//! | `spec.role` | `status.role` |
//! | `status.lastHeartbeatTime` | `status.lastHeartbeatTime` |
//! | — | `status.conditions`, `observedGeneration`, `version`, `secretRef`, `config` |
//!
//! Up-conversion is lossless. Down-conversion drops the status fields `v1alpha1` cannot
//! represent; that is safe because the API server never takes status from a main-resource
//! write, so a `v1alpha1` client that reads and writes an object back keeps them. When a
//! `v1alpha2` object has no `status.role` yet, its role is derived from the spec
//! ([`KontinuumRole::for_location`](crate::v1alpha2::KontinuumRole::for_location)).

use crate::{v1alpha1, v1alpha2};

impl From<v1alpha1::KontinuumRole> for v1alpha2::KontinuumRole {
    fn from(role: v1alpha1::KontinuumRole) -> Self {
        match role {
            v1alpha1::KontinuumRole::ControlPlane => Self::ControlPlane,
            v1alpha1::KontinuumRole::Worker => Self::Worker,
        }
    }
}

impl From<v1alpha2::KontinuumRole> for v1alpha1::KontinuumRole {
    fn from(role: v1alpha2::KontinuumRole) -> Self {
        match role {
            v1alpha2::KontinuumRole::ControlPlane => Self::ControlPlane,
            v1alpha2::KontinuumRole::Worker => Self::Worker,
        }
    }
}

impl From<v1alpha1::Kontinuum> for v1alpha2::Kontinuum {
    fn from(old: v1alpha1::Kontinuum) -> Self {
        let v1alpha1::Kontinuum {
            metadata,
            spec,
            status,
        } = old;
        Self {
            metadata,
            spec: v1alpha2::KontinuumSpec {
                region: spec.region,
                zone: spec.zone,
            },
            status: Some(v1alpha2::KontinuumStatus {
                role: Some(spec.role.into()),
                last_heartbeat_time: status.and_then(|s| s.last_heartbeat_time),
                ..v1alpha2::KontinuumStatus::default()
            }),
        }
    }
}

impl From<v1alpha2::Kontinuum> for v1alpha1::Kontinuum {
    fn from(new: v1alpha2::Kontinuum) -> Self {
        let v1alpha2::Kontinuum {
            metadata,
            spec,
            status,
        } = new;
        let role = status.as_ref().and_then(|s| s.role).unwrap_or_else(|| {
            v1alpha2::KontinuumRole::for_location(spec.region.as_deref(), spec.zone.as_deref())
        });
        let last_heartbeat_time = status.and_then(|s| s.last_heartbeat_time);
        Self {
            metadata,
            spec: v1alpha1::KontinuumSpec {
                role: role.into(),
                region: spec.region,
                zone: spec.zone,
            },
            status: last_heartbeat_time.map(|time| v1alpha1::KontinuumStatus {
                last_heartbeat_time: Some(time),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
    use k8s_openapi::jiff::Timestamp;

    use super::*;
    use crate::conditions::{self, ConditionStatus};
    use crate::v1alpha2::{KontinuumConfig, LocalRef, ServerConfig};

    fn metadata() -> ObjectMeta {
        ObjectMeta {
            name: Some("hub-7f9c".into()),
            namespace: Some("kontinuum-system".into()),
            labels: Some([("app.kubernetes.io/name".into(), "kontinuum".into())].into()),
            resource_version: Some("42".into()),
            uid: Some("8d3c0e5e-3f8e-4f0e-9d7e-2b4a1c0d9e11".into()),
            ..ObjectMeta::default()
        }
    }

    fn heartbeat() -> Time {
        Time(Timestamp::from_second(1_790_000_000).unwrap())
    }

    fn old(
        role: v1alpha1::KontinuumRole,
        region: Option<&str>,
        zone: Option<&str>,
    ) -> v1alpha1::Kontinuum {
        v1alpha1::Kontinuum {
            metadata: metadata(),
            spec: v1alpha1::KontinuumSpec {
                role,
                region: region.map(Into::into),
                zone: zone.map(Into::into),
            },
            status: Some(v1alpha1::KontinuumStatus {
                last_heartbeat_time: Some(heartbeat()),
            }),
        }
    }

    #[test]
    fn v1alpha1_round_trips_through_v1alpha2() {
        let cases = [
            old(v1alpha1::KontinuumRole::ControlPlane, None, None),
            old(v1alpha1::KontinuumRole::Worker, Some("eu"), Some("west-1a")),
            old(v1alpha1::KontinuumRole::ControlPlane, Some(""), Some("")),
            v1alpha1::Kontinuum {
                status: None,
                ..old(v1alpha1::KontinuumRole::Worker, Some("us"), Some("east-2"))
            },
        ];
        for original in cases {
            let hub = v1alpha2::Kontinuum::from(original.clone());
            assert_eq!(v1alpha1::Kontinuum::from(hub), original);
        }
    }

    #[test]
    fn up_conversion_moves_the_role_to_the_status() {
        let hub = v1alpha2::Kontinuum::from(old(
            v1alpha1::KontinuumRole::Worker,
            Some("eu"),
            Some("west-1a"),
        ));
        assert_eq!(hub.metadata, metadata());
        assert_eq!(hub.spec.region.as_deref(), Some("eu"));
        assert_eq!(hub.spec.zone.as_deref(), Some("west-1a"));
        let status = hub.status.unwrap();
        assert_eq!(status.role, Some(v1alpha2::KontinuumRole::Worker));
        assert_eq!(status.last_heartbeat_time, Some(heartbeat()));
    }

    fn hub(region: Option<&str>, zone: Option<&str>) -> v1alpha2::Kontinuum {
        let mut status = v1alpha2::KontinuumStatus {
            observed_generation: Some(3),
            role: Some(v1alpha2::KontinuumRole::for_location(region, zone)),
            last_heartbeat_time: Some(heartbeat()),
            version: Some("v0.3.0".into()),
            secret_ref: Some(LocalRef::new("kontinuum-hub-7f9c")),
            config: Some(KontinuumConfig {
                server: Some(ServerConfig {
                    addr: Some(":8080".into()),
                    ..ServerConfig::default()
                }),
                ..KontinuumConfig::default()
            }),
            ..v1alpha2::KontinuumStatus::default()
        };
        conditions::set(
            &mut status.conditions,
            conditions::new(
                "Heartbeating",
                ConditionStatus::True,
                "HeartbeatReceived",
                "",
                Some(3),
            ),
            &heartbeat(),
        );
        v1alpha2::Kontinuum {
            metadata: metadata(),
            spec: v1alpha2::KontinuumSpec {
                region: region.map(Into::into),
                zone: zone.map(Into::into),
            },
            status: Some(status),
        }
    }

    /// Everything `v1alpha1` can represent survives a round trip from the hub version.
    #[test]
    fn v1alpha2_round_trips_what_v1alpha1_can_represent() {
        for original in [hub(None, None), hub(Some("eu"), Some("west-1a"))] {
            let back = v1alpha2::Kontinuum::from(v1alpha1::Kontinuum::from(original.clone()));
            assert_eq!(back.metadata, original.metadata);
            assert_eq!(back.spec, original.spec);
            let (back, original) = (back.status.unwrap(), original.status.unwrap());
            assert_eq!(back.role, original.role);
            assert_eq!(back.last_heartbeat_time, original.last_heartbeat_time);
            // Dropped on the way down, by design (see the module doc).
            assert!(back.conditions.is_empty() && back.version.is_none() && back.config.is_none());
        }
    }

    #[test]
    fn down_conversion_derives_a_missing_role_from_the_spec() {
        let mut worker = hub(Some("eu"), Some("west-1a"));
        worker.status = None;
        let old = v1alpha1::Kontinuum::from(worker);
        assert_eq!(old.spec.role, v1alpha1::KontinuumRole::Worker);
        assert_eq!(old.status, None);

        let mut control_plane = hub(Some(""), Some(""));
        control_plane.status = None;
        assert_eq!(
            v1alpha1::Kontinuum::from(control_plane).spec.role,
            v1alpha1::KontinuumRole::ControlPlane
        );
    }

    #[test]
    fn down_conversion_keeps_a_recorded_role() {
        let mut odd = hub(Some("eu"), Some("west-1a"));
        if let Some(status) = odd.status.as_mut() {
            status.role = Some(v1alpha2::KontinuumRole::ControlPlane);
        }
        assert_eq!(
            v1alpha1::Kontinuum::from(odd).spec.role,
            v1alpha1::KontinuumRole::ControlPlane
        );
    }
}
