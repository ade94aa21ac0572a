//! Condition types and reasons, one pair of enums per kind. They are API: a token is renamed
//! only with a version bump.
//!
//! Rules (STYLE 3.3): every type has positive polarity (True is good); `Ready` on every kind
//! is a summary of its gates ([`conditions::ready`](crate::conditions::ready)); `Deleting` is
//! True while cleanup runs and its message says what it waits for; a controller writes all
//! of its types as `Unknown`/`Reconciling` on its first visit. The rustdoc of each variant
//! is its documentation; where a token differs from the Go predecessor's, the doc says so.

use std::fmt;
use std::str::FromStr;

/// A string that is not a token of the vocabulary it was parsed as.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{token:?} is not a known {vocabulary}")]
pub struct UnknownToken {
    /// The vocabulary, e.g. `ZoneReason`.
    pub vocabulary: &'static str,
    /// The string that was parsed.
    pub token: String,
}

/// Defines a vocabulary enum whose variants are written to the API as their own names.
macro_rules! vocabulary {
    ($(#[$meta:meta])* pub enum $name:ident { $($(#[$vmeta:meta])* $variant:ident,)+ }) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name {
            $($(#[$vmeta])* $variant,)+
        }

        impl $name {
            /// Every token, in declaration order.
            pub const ALL: &'static [Self] = &[$(Self::$variant),+];

            /// The CamelCase token written to the API.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $(Self::$variant => stringify!($variant),)+
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                self.as_str()
            }
        }

        impl FromStr for $name {
            type Err = UnknownToken;

            fn from_str(token: &str) -> Result<Self, Self::Err> {
                Self::ALL
                    .iter()
                    .copied()
                    .find(|variant| variant.as_str() == token)
                    .ok_or_else(|| UnknownToken {
                        vocabulary: stringify!($name),
                        token: token.to_owned(),
                    })
            }
        }
    };
}

vocabulary! {
    /// Condition types of a [`Zone`](crate::v1alpha2::Zone). Owner: zone-installer.
    pub enum ZoneCondition {
        /// The zone's TalosCluster (named like the Zone) exists and is `Ready`.
        ClusterReady,
        /// The zone agent and its footprint are installed in the zone's cluster and, when
        /// `spec.domain` is set, its certificate has been issued.
        Installed,
        /// A `Kontinuum` with this zone's region and zone heartbeats in the hub's registry.
        RegistryJoined,
        /// Summary: `ClusterReady`, `Installed` and `RegistryJoined` are True and the Zone is
        /// not being deleted. Never latched.
        Ready,
        /// True while teardown runs (downstream footprint, then the TalosCluster); the
        /// message says what it waits for and until when. Replaces the predecessor's
        /// negative-polarity `Teardown` type.
        Deleting,
    }
}

impl ZoneCondition {
    /// The conditions that gate `Ready`, in the order they are checked.
    pub const READY_GATES: &'static [Self] =
        &[Self::ClusterReady, Self::Installed, Self::RegistryJoined];
}

vocabulary! {
    /// Reasons of a [`Zone`](crate::v1alpha2::Zone)'s conditions.
    pub enum ZoneReason {
        /// First visit: the condition has not been evaluated yet (status `Unknown`).
        Reconciling,
        /// `Ready=True`: every gate is True.
        Ready,
        /// `ClusterReady=False`: no TalosCluster named like the Zone exists yet.
        TalosClusterNotFound,
        /// `ClusterReady=False`: the TalosCluster exists but is not `Ready`.
        WaitingForTalosCluster,
        /// `ClusterReady=True`: the TalosCluster is `Ready`.
        ClusterReady,
        /// `ClusterReady=False`: creating the objects `spec.seed` describes (TalosCluster,
        /// InstancePool, seed Instances) failed.
        FanOutFailed,
        /// `ClusterReady=False`: an Instance with a seed address is claimed by another
        /// InstancePool; the message names it. It is never taken over.
        SeedInstanceClaimed,
        /// `Installed=False`: the cluster's kubeconfig is not available yet.
        DownstreamNotReady,
        /// `Installed=False`: the zone's identity or store DSN could not be issued, e.g. the
        /// hub has no `KONTINUUM_SERVER_GRPC_ENDPOINT`.
        NoStorageSecretFound,
        /// `Installed=False`: no registered Kontinuum reports a version to install.
        NoVersionFound,
        /// `Installed=False`: creating or updating a downstream object failed.
        InstallFailed,
        /// `Installed=False`: waiting for cert-manager to issue the zone's certificate.
        WaitingForCertificate,
        /// `Installed=False`: the GatewayClass the zone's Gateway names does not exist in the
        /// zone cluster, so the zone endpoint is not exposed.
        GatewayClassNotFound,
        /// `Installed=False`: the hub's identity Secret of the zone was deleted, which
        /// revokes the zone; it is not re-issued until a rotation is requested with the
        /// `kontinuum.sh/rotate-identity` annotation.
        IdentityRevoked,
        /// `Installed=False`: the hub has no auth mode to mirror into the zone (neither
        /// `KONTINUUM_OIDC_ISSUER_URL` nor `KONTINUUM_INSECURE_ALLOW_ANONYMOUS=true`), and a
        /// zone agent refuses to start without one.
        NoAuthMode,
        /// `Installed=True`: the zone agent is installed (and served at its host name when
        /// `spec.domain` is set).
        Installed,
        /// `RegistryJoined=False`: the zone agent has not registered itself yet, or its
        /// registration expired.
        WaitingForRegistry,
        /// `RegistryJoined=True`: the zone agent is registered and heartbeating.
        RegistryJoined,
        /// `Deleting=True`, `Ready=False`: teardown is running.
        Deleting,
        /// `Deleting=True`: removing the downstream footprint failed; retried until the
        /// deadline in the message.
        DownstreamTeardownFailed,
        /// `Deleting=True`: deleting the TalosCluster failed; retried until the deadline.
        TalosClusterDeleteFailed,
        /// Teardown gave up at its deadline and removed the finalizer (Event reason).
        TeardownDeadlineExceeded,
        /// The operator's RBAC refuses a call it needs (an API 403 from the hub or the
        /// zone cluster); the message names the verb and resource when known. Retried with
        /// the normal backoff (a Role fix needs no spec change), but reported as this rather
        /// than as waiting.
        Forbidden,
    }
}

vocabulary! {
    /// Condition types of an [`Instance`](crate::v1alpha2::Instance).
    pub enum InstanceCondition {
        /// The machine answered in Talos maintenance mode on one of `spec.interfaces`, and
        /// its interfaces, disks and identity are in the status. Owner: instance-discovery,
        /// which stops probing once the Instance is claimed.
        Discovered,
        /// The machine accepted its machine configuration. Owner: talos-bootstrapper.
        Configured,
        /// The machine answers with its configured identity as a member of its cluster.
        /// Owner: talos-bootstrapper.
        Joined,
        /// A control-plane member only: the cluster's Talos health check passes with this
        /// machine included (`Unknown` until the first check). Owner: talos-bootstrapper.
        Healthy,
        /// Summary of the gates of [`InstanceCondition::ready_gates`], False while the
        /// Instance is being deleted. Owner: instance-discovery, for free and claimed
        /// Instances alike (it stops probing a claimed one, not summarising it).
        Ready,
        /// True while the machine is being reset before the Instance goes away. Owner: the
        /// instance-reset controller.
        Deleting,
    }
}

impl InstanceCondition {
    /// The conditions that gate `Ready`: `Discovered` for a free Instance; `Configured` and
    /// `Joined` for one claimed by a pool (maintenance mode no longer answers then), and
    /// `Healthy` too for a control-plane member (one that carries `Healthy`).
    pub const fn ready_gates(claimed: bool, control_plane: bool) -> &'static [Self] {
        match (claimed, control_plane) {
            (false, _) => &[Self::Discovered],
            (true, false) => &[Self::Configured, Self::Joined],
            (true, true) => &[Self::Configured, Self::Joined, Self::Healthy],
        }
    }
}

vocabulary! {
    /// Reasons of an [`Instance`](crate::v1alpha2::Instance)'s conditions.
    pub enum InstanceReason {
        /// First visit: the condition has not been evaluated yet (status `Unknown`).
        Reconciling,
        /// `Ready=True`: every gate is True.
        Ready,
        /// `Discovered=True`: the machine answered in maintenance mode.
        Discovered,
        /// `Discovered=False`: `spec.interfaces` is empty.
        NoInterfaces,
        /// `Discovered=False`: every address in `spec.interfaces` failed to answer.
        ProbeFailed,
        /// `Discovered=False`: the machine at the address presents a different TLS identity
        /// than `status.identity` (or `spec.identity`): another machine (or a reinstalled
        /// one) took its place. `Configured=False`: the same, found in the handshake of the
        /// connection a machine config was to be sent over; nothing was sent.
        IdentityChanged,
        /// `Configured=True`: the machine configuration was applied.
        ConfigApplied,
        /// `Configured=False`: the machine refused its configuration.
        ConfigRejected,
        /// `Configured=False`: a machine-config patch (the cluster's, the pool's or the
        /// Instance's; the message names which, and the field) cannot be merged or makes the
        /// config one Talos refuses. Nothing was sent; fixing the patch retries.
        InvalidConfigPatch,
        /// `Configured=False`: the Instance has no identity (neither `spec.identity` nor
        /// `status.identity`), so no configuration is sent to it.
        IdentityUnknown,
        /// `Configured`/`Joined`=Unknown: the configured Talos API stopped answering.
        TalosApiUnreachable,
        /// `Joined=False`: a worker waits for its cluster's control plane to be ready.
        WaitingForControlPlane,
        /// `Joined=True`: the machine answers as a member of its cluster.
        Joined,
        /// `Healthy=True` on a control-plane member: the cluster health check passes with it.
        Healthy,
        /// `Healthy=False` on a control-plane member: the periodic health check fails.
        Unhealthy,
        /// `Deleting=True`, `Ready=False`: the Instance is being deleted.
        Deleting,
        /// `Deleting=True`: the machine is being reset to maintenance mode.
        Resetting,
        /// `Deleting=True`: resetting the machine failed; retried until the deadline in the
        /// message.
        ResetFailed,
        /// The operator's RBAC refuses a call it needs (an API 403 from the hub or the
        /// zone cluster); the message names the verb and resource when known. Retried with
        /// the normal backoff (a Role fix needs no spec change), but reported as this rather
        /// than as waiting.
        Forbidden,
    }
}

vocabulary! {
    /// Condition types of an [`InstancePool`](crate::v1alpha2::InstancePool). Owner:
    /// pool-claimer.
    pub enum InstancePoolCondition {
        /// `spec.replicas` Instances are claimed.
        Claimed,
        /// Fewer matching, `Discovered`, unclaimed Instances exist than `spec.replicas` needs:
        /// the exact inverse of `Claimed`. Kept under the predecessor's name (negative
        /// polarity, True is bad) because tools and runbooks alert on it.
        InsufficientCapacity,
        /// Summary: `Claimed` is True and the pool is not being deleted.
        Ready,
        /// True while claimed Instances are being released before the pool goes away.
        Deleting,
    }
}

impl InstancePoolCondition {
    /// The conditions that gate `Ready`.
    pub const READY_GATES: &'static [Self] = &[Self::Claimed];
}

vocabulary! {
    /// Reasons of an [`InstancePool`](crate::v1alpha2::InstancePool)'s conditions.
    pub enum InstancePoolReason {
        /// First visit: the condition has not been evaluated yet (status `Unknown`).
        Reconciling,
        /// `Ready=True`: every gate is True.
        Ready,
        /// `Claimed=True`: `spec.replicas` Instances are claimed (the predecessor's
        /// `Claimed`).
        AllClaimed,
        /// `Claimed=False`: fewer matching, `Discovered`, unclaimed Instances exist than
        /// needed (the predecessor's `CandidatesExhausted`).
        InsufficientCapacity,
        /// `Claimed=False`: writing the claim label failed for a reason other than losing
        /// the race to another pool.
        ClaimFailed,
        /// `Ready=False`: `spec.selector` cannot be evaluated (e.g. an unknown operator).
        InvalidSelector,
        /// `Deleting=True`: releasing a claimed Instance failed; retried.
        ReleaseFailed,
        /// `Deleting=True`, `Ready=False`: the pool is releasing its Instances.
        Deleting,
        /// The operator's RBAC refuses a call it needs (an API 403 from the hub or the
        /// zone cluster); the message names the verb and resource when known. Retried with
        /// the normal backoff (a Role fix needs no spec change), but reported as this rather
        /// than as waiting.
        Forbidden,
    }
}

vocabulary! {
    /// Condition types of a [`TalosCluster`](crate::v1alpha2::TalosCluster). Owner:
    /// talos-bootstrapper.
    pub enum TalosClusterCondition {
        /// etcd was bootstrapped on the first control-plane member (set once).
        Bootstrapped,
        /// The admin kubeconfig is stored in the Secret of `status.secretRef`.
        KubeconfigAvailable,
        /// The Cilium Addon is `Ready` and the Talos cluster health check passes.
        ControlPlaneReady,
        /// Every enabled Addon of the cluster is `Ready`.
        AddonsReady,
        /// Summary of the four above. Never latched: it turns False again when an Addon or
        /// the control plane degrades.
        Ready,
        /// True while the members are reset and released (or unregistered).
        Deleting,
        /// Every configured, joined member runs the machine config its cluster, pool and
        /// Instance patches give now. A changed patch is re-applied in place, one machine at
        /// a time, workers first and control planes last; this does not gate `Ready` (the
        /// cluster keeps serving while it rolls).
        ConfigUpToDate,
        /// The Kubernetes API endpoint survives the loss of any one control-plane machine:
        /// `spec.controlPlane.endpoint` is set, or there is only one control plane (nothing
        /// to share). False when several control planes share the first one's address. Not
        /// a `Ready` gate: a warning for a person.
        EndpointShared,
    }
}

impl TalosClusterCondition {
    /// The conditions that gate `Ready`, in the order they are checked.
    pub const READY_GATES: &'static [Self] = &[
        Self::Bootstrapped,
        Self::KubeconfigAvailable,
        Self::ControlPlaneReady,
        Self::AddonsReady,
    ];
}

vocabulary! {
    /// Reasons of a [`TalosCluster`](crate::v1alpha2::TalosCluster)'s conditions.
    pub enum TalosClusterReason {
        /// First visit: the condition has not been evaluated yet (status `Unknown`).
        Reconciling,
        /// `Ready=True`: every gate is True.
        Ready,
        /// The control-plane pool has no claimed, `Discovered` Instance yet.
        WaitingForInstances,
        /// `status.secretRef` names a Secret that no longer exists. The secrets bundle is
        /// never regenerated (machines trust its CAs): a human must restore it.
        SecretsBundleMissing,
        /// The requested Talos version (`spec.talos.version`, or one a machine reports) has
        /// no machine-config contract this operator can render.
        UnsupportedTalosVersion,
        /// A Secret of the same name, owned by an earlier cluster of the same name, still
        /// exists; waiting for the garbage collector to remove it.
        StaleSecret,
        /// A machine configuration could not be rendered or applied; the message names the
        /// Instance.
        ConfigFailed,
        /// `Bootstrapped=False`: another machine than the one discovered answers at the
        /// endpoint member's address (its key is not the Instance's identity); no
        /// configuration was sent. The message names the Instance and both identities.
        IdentityChanged,
        /// Bootstrap is in progress: the API server is not reachable, or the control plane
        /// is not healthy yet.
        Bootstrapping,
        /// `Bootstrapped=True`: etcd bootstrap completed.
        Bootstrapped,
        /// `Bootstrapped=False`: the Bootstrap call failed; retried.
        BootstrapFailed,
        /// `KubeconfigAvailable=True`: the kubeconfig is stored.
        KubeconfigAvailable,
        /// `ControlPlaneReady=True`: the control plane is healthy.
        Healthy,
        /// `ControlPlaneReady=False`: the control plane was healthy and its health check
        /// now fails.
        Unhealthy,
        /// `ControlPlaneReady=False`: waiting for the Cilium Addon (the cluster has no CNI
        /// until it runs).
        WaitingForCni,
        /// `AddonsReady=False`: an enabled Addon is not `Ready`; the message names it.
        AddonNotHealthy,
        /// `AddonsReady=False`: an enabled Addon failed to install.
        AddonInstallFailed,
        /// `AddonsReady=True`: every enabled Addon is installed and healthy.
        AddonsInstalled,
        /// `Deleting=True`, `Ready=False`: teardown is running.
        Deleting,
        /// `Deleting=True`: members are being reset to maintenance mode.
        ResettingInstances,
        /// `Deleting=True`: resetting or releasing a member failed; retried until the
        /// deadline in the message.
        TeardownFailed,
        /// Teardown gave up at its deadline and removed the finalizer (Event reason).
        TeardownDeadlineExceeded,
        /// `ConfigUpToDate=True`: every configured, joined member runs its current config.
        ConfigUpToDate,
        /// `ConfigUpToDate=False`: a changed config is being applied to the member the
        /// message names (or the roll waits for one to come back from a reboot).
        Reconfiguring,
        /// `ConfigUpToDate=False`: a member refused its changed config, or a changed patch
        /// makes it invalid (nothing sent); the roll halted there, the other members keep
        /// what they run. Fixing the patch resumes it.
        ReconfigureFailed,
        /// `EndpointShared=True`: `spec.controlPlane.endpoint` names the endpoint.
        EndpointConfigured,
        /// `EndpointShared=True`: one control plane, whose address is the endpoint.
        SingleControlPlane,
        /// `EndpointShared=False`: several control planes, and the endpoint is the first
        /// one's address: when it stops, every kubeconfig points at a dead address.
        EndpointIsOneMachine,
        /// The operator's RBAC refuses a call it needs (an API 403 from the hub or the
        /// zone cluster); the message names the verb and resource when known. Retried with
        /// the normal backoff (a Role fix needs no spec change), but reported as this rather
        /// than as waiting.
        Forbidden,
    }
}

vocabulary! {
    /// Condition types of an [`Addon`](crate::v1alpha2::Addon). Owner: addon-installer.
    pub enum AddonCondition {
        /// The release is installed (Helm upgrade --install, or rendered and applied) at the
        /// current generation.
        Installed,
        /// The chart's CRDs are established and its workloads are ready.
        Healthy,
        /// Summary: `Installed` and `Healthy` are True and the Addon is not being deleted.
        Ready,
        /// True while the release is uninstalled from the downstream cluster.
        Deleting,
    }
}

impl AddonCondition {
    /// The conditions that gate `Ready`, in the order they are checked.
    pub const READY_GATES: &'static [Self] = &[Self::Installed, Self::Healthy];
}

vocabulary! {
    /// Reasons of an [`Addon`](crate::v1alpha2::Addon)'s conditions.
    pub enum AddonReason {
        /// First visit: the condition has not been evaluated yet (status `Unknown`).
        Reconciling,
        /// `Ready=True`: every gate is True.
        Ready,
        /// `spec.enabled` is false: nothing is installed or changed.
        Disabled,
        /// `Installed=False`: the cluster's kubeconfig is not available yet.
        WaitingForKubeconfig,
        /// `Installed=False`: an Addon this one depends on (`spec.dependsOn`, or a lower
        /// `spec.lifecycle.priority` on the same cluster) is not `Ready` yet.
        WaitingForDependency,
        /// `Installed=Unknown`: an install or upgrade is running.
        Installing,
        /// `Installed=False`: resolving the chart or values, or installing, failed.
        InstallFailed,
        /// `Installed=True`: the release is installed.
        Installed,
        /// `Healthy=False`: a CRD of the chart is missing, not Established, or not served.
        CRDsNotReady,
        /// `Healthy=False`: a workload of the release is not ready; the message names it.
        NotHealthy,
        /// `Healthy=True`: CRDs established, workloads ready.
        Healthy,
        /// `Deleting=True`, `Ready=False`: the release is being uninstalled.
        Deleting,
        /// `Deleting=True`: uninstalling failed; retried until the deadline in the message.
        UninstallFailed,
        /// The operator's RBAC refuses a call it needs (an API 403 from the hub or the
        /// zone cluster); the message names the verb and resource when known. Retried with
        /// the normal backoff (a Role fix needs no spec change), but reported as this rather
        /// than as waiting.
        Forbidden,
        /// `Healthy=Unknown` (and `Installed=False` if it was not True): the zone cluster
        /// does not answer (connection refused, reset or timed out); the message says what
        /// was being done. Retried with backoff; the release is left as it is.
        ClusterUnreachable,
    }
}

vocabulary! {
    /// Condition types of a [`Kontinuum`](crate::v1alpha2::Kontinuum). Owner: registry.
    pub enum KontinuumCondition {
        /// The installation heartbeats within the registry's time-to-live.
        Heartbeating,
        /// Summary: `Heartbeating` is True and the entry is not being deleted.
        Ready,
        /// True while the entry is being removed from the registry.
        Deleting,
    }
}

impl KontinuumCondition {
    /// The conditions that gate `Ready`.
    pub const READY_GATES: &'static [Self] = &[Self::Heartbeating];
}

vocabulary! {
    /// Reasons of a [`Kontinuum`](crate::v1alpha2::Kontinuum)'s conditions.
    pub enum KontinuumReason {
        /// First visit: the condition has not been evaluated yet (status `Unknown`).
        Reconciling,
        /// `Ready=True`: every gate is True.
        Ready,
        /// `Heartbeating=True`: the last heartbeat is recent.
        HeartbeatReceived,
        /// `Heartbeating=False`: no heartbeat within the time-to-live; the entry is about to
        /// be removed.
        HeartbeatStale,
        /// `Deleting=True`, `Ready=False`: the entry is being removed.
        Deleting,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_the_variant_names() {
        assert_eq!(
            ZoneReason::TalosClusterNotFound.as_str(),
            "TalosClusterNotFound"
        );
        assert_eq!(AddonReason::CRDsNotReady.to_string(), "CRDsNotReady");
        assert_eq!(
            "IdentityChanged".parse::<InstanceReason>(),
            Ok(InstanceReason::IdentityChanged)
        );
        let err = "Nope".parse::<AddonReason>().unwrap_err();
        assert_eq!(err.to_string(), "\"Nope\" is not a known AddonReason");
    }

    fn assert_vocabulary(tokens: &[&str]) {
        let mut seen = std::collections::BTreeSet::new();
        for token in tokens {
            assert!(seen.insert(*token), "duplicate token {token}");
            assert!(
                token.starts_with(|c: char| c.is_ascii_uppercase())
                    && token.chars().all(|c| c.is_ascii_alphanumeric()),
                "{token} is not CamelCase"
            );
        }
    }

    #[test]
    fn every_vocabulary_is_camel_case_and_unique() {
        assert_vocabulary(
            &ZoneCondition::ALL
                .iter()
                .map(|v| v.as_str())
                .collect::<Vec<_>>(),
        );
        assert_vocabulary(
            &ZoneReason::ALL
                .iter()
                .map(|v| v.as_str())
                .collect::<Vec<_>>(),
        );
        assert_vocabulary(
            &InstanceCondition::ALL
                .iter()
                .map(|v| v.as_str())
                .collect::<Vec<_>>(),
        );
        assert_vocabulary(
            &InstanceReason::ALL
                .iter()
                .map(|v| v.as_str())
                .collect::<Vec<_>>(),
        );
        assert_vocabulary(
            &InstancePoolReason::ALL
                .iter()
                .map(|v| v.as_str())
                .collect::<Vec<_>>(),
        );
        assert_vocabulary(
            &TalosClusterReason::ALL
                .iter()
                .map(|v| v.as_str())
                .collect::<Vec<_>>(),
        );
        assert_vocabulary(
            &AddonReason::ALL
                .iter()
                .map(|v| v.as_str())
                .collect::<Vec<_>>(),
        );
        assert_vocabulary(
            &KontinuumReason::ALL
                .iter()
                .map(|v| v.as_str())
                .collect::<Vec<_>>(),
        );
    }

    /// Every kind has `Ready` and `Deleting`, and every reason enum has the tokens the
    /// shared helpers write: `Reconciling`, `Ready`, `Deleting`.
    #[test]
    fn every_kind_has_the_lifecycle_vocabulary() {
        let types: [&[&str]; 5] = [
            &ZoneCondition::ALL
                .iter()
                .map(|v| v.as_str())
                .collect::<Vec<_>>(),
            &InstanceCondition::ALL
                .iter()
                .map(|v| v.as_str())
                .collect::<Vec<_>>(),
            &InstancePoolCondition::ALL
                .iter()
                .map(|v| v.as_str())
                .collect::<Vec<_>>(),
            &TalosClusterCondition::ALL
                .iter()
                .map(|v| v.as_str())
                .collect::<Vec<_>>(),
            &AddonCondition::ALL
                .iter()
                .map(|v| v.as_str())
                .collect::<Vec<_>>(),
        ];
        for tokens in types {
            assert!(tokens.contains(&"Ready") && tokens.contains(&"Deleting"));
        }
        assert!(KontinuumCondition::ALL.contains(&KontinuumCondition::Ready));
        let reasons: [Vec<&str>; 6] = [
            ZoneReason::ALL.iter().map(|v| v.as_str()).collect(),
            InstanceReason::ALL.iter().map(|v| v.as_str()).collect(),
            InstancePoolReason::ALL.iter().map(|v| v.as_str()).collect(),
            TalosClusterReason::ALL.iter().map(|v| v.as_str()).collect(),
            AddonReason::ALL.iter().map(|v| v.as_str()).collect(),
            KontinuumReason::ALL.iter().map(|v| v.as_str()).collect(),
        ];
        for tokens in reasons {
            for required in ["Reconciling", "Ready", "Deleting"] {
                assert!(
                    tokens.contains(&required),
                    "{required} missing from {tokens:?}"
                );
            }
        }
    }

    /// The reference's condition reasons (section 2) all have a token here, or a documented
    /// replacement.
    #[test]
    fn covers_the_reference_reasons() {
        let zone = [
            "TalosClusterNotFound",
            "WaitingForTalosCluster",
            "ClusterReady",
            "DownstreamNotReady",
            "NoStorageSecretFound",
            "NoVersionFound",
            "InstallFailed",
            "WaitingForCertificate",
            "Installed",
            "WaitingForRegistry",
            "RegistryJoined",
            "DownstreamTeardownFailed",
            "TalosClusterDeleteFailed",
        ];
        for token in zone {
            assert!(token.parse::<ZoneReason>().is_ok(), "{token}");
        }
        let instance = [
            "Discovered",
            "NoInterfaces",
            "ProbeFailed",
            "ConfigApplied",
            "Joined",
            "Healthy",
            "Unhealthy",
        ];
        for token in instance {
            assert!(token.parse::<InstanceReason>().is_ok(), "{token}");
        }
        let cluster = [
            "WaitingForInstances",
            "Bootstrapping",
            "Healthy",
            "Bootstrapped",
            "AddonNotHealthy",
            "AddonsInstalled",
            "AddonInstallFailed",
            "KubeconfigAvailable",
        ];
        for token in cluster {
            assert!(token.parse::<TalosClusterReason>().is_ok(), "{token}");
        }
        for token in [
            "InstallFailed",
            "CRDsNotReady",
            "NotHealthy",
            "Healthy",
            "WaitingForDependency",
        ] {
            assert!(token.parse::<AddonReason>().is_ok(), "{token}");
        }
        // Replaced by positive-polarity names: Claimed/CandidatesExhausted.
        assert!("InsufficientCapacity".parse::<InstancePoolReason>().is_ok());
        assert!("AllClaimed".parse::<InstancePoolReason>().is_ok());
    }
}
