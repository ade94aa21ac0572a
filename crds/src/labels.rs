//! Label and annotation keys, and the values Kontinuum writes into them.

/// Label: region of an object, on seed Instances (and whatever else belongs to one zone).
/// An InstancePool created for a zone selects Instances by this label and [`ZONE`].
pub const REGION: &str = "kontinuum.sh/region";

/// Label: zone of an object, within its [`REGION`].
pub const ZONE: &str = "kontinuum.sh/zone";

/// Label: name of the InstancePool that claimed an Instance. Written only by the
/// pool-claimer, with a compare-and-set (resourceVersion precondition) so that two pools
/// never claim the same machine.
pub const CLAIMED_BY: &str = "kontinuum.sh/claimed-by";

/// Annotation: on an Instance, the host name the user typed before it was resolved to an IP
/// address.
pub const HOSTNAME: &str = "kontinuum.sh/hostname";

/// Annotation: on an Instance whose machine now presents a different TLS identity (reason
/// `IdentityChanged`), the new identity the user accepts; instance-discovery then records
/// it and treats the machine as discovered again.
pub const ACCEPT_IDENTITY: &str = "kontinuum.sh/accept-identity";
/// Annotation: on a Zone, requests a rotation of the zone's identity when set to a value
/// other than the one last handled (`status.identityRotation`); after deleting the hub's
/// identity Secret (a revocation), it also re-admits the zone with a new identity.
pub const ROTATE_IDENTITY: &str = "kontinuum.sh/rotate-identity";

/// Annotation: on the zone agent's pod template, the SHA-256 thumbprint of its identity
/// certificate, so that a rotation restarts the agent exactly once.
pub const IDENTITY_THUMBPRINT: &str = "kontinuum.sh/identity-thumbprint";

/// Annotation: on a hub identity Secret during a rotation's overlap window, the instant
/// (RFC 3339) after which its older certificate is dropped.
pub const IDENTITY_OVERLAP_UNTIL: &str = "kontinuum.sh/identity-overlap-until";

/// Label: the name of the application (`kontinuum` on the zone agent's objects).
pub const APP_NAME: &str = "app.kubernetes.io/name";

/// Label: the instance of the application (for an Addon's workloads, the Helm release).
pub const APP_INSTANCE: &str = "app.kubernetes.io/instance";

/// Label: the tool that manages an object.
pub const APP_MANAGED_BY: &str = "app.kubernetes.io/managed-by";

/// Label: the component within the application.
pub const APP_COMPONENT: &str = "app.kubernetes.io/component";

/// Label: the higher-level application an object is part of.
pub const APP_PART_OF: &str = "app.kubernetes.io/part-of";

/// Value of [`APP_NAME`], [`APP_MANAGED_BY`] and [`APP_PART_OF`] on objects Kontinuum creates.
pub const KONTINUUM: &str = "kontinuum";
