//! Finalizers, one per controller: `kontinuum.sh/<controller>`.
//!
//! A controller adds its finalizer only when there is something outside the Kubernetes
//! garbage-collection graph to clean up (Talos machines, Helm releases, downstream objects).
//! Each finalizer's cleanup is bounded: a visible deadline, then the finalizer is removed.

/// On InstancePools: releases every claimed Instance (removes `kontinuum.sh/claimed-by`).
pub const POOL_CLAIMER: &str = "kontinuum.sh/pool-claimer";

/// On TalosClusters: resets the members (workers, then the control plane) and releases or
/// deletes their Instances, as `spec.teardown.unregisterInstances` says.
pub const TALOS_BOOTSTRAPPER: &str = "kontinuum.sh/talos-bootstrapper";

/// On Instances claimed by a pool that a TalosCluster uses: resets the machine back to
/// maintenance mode before the Instance goes away. Owned by the `instance-reset`
/// controller of the talos-bootstrapper.
pub const INSTANCE_RESET: &str = "kontinuum.sh/instance-reset";

/// On Zones: removes the zone's downstream footprint, then deletes its TalosCluster.
pub const ZONE_INSTALLER: &str = "kontinuum.sh/zone-installer";

/// On Addons: uninstalls the release from the downstream cluster when the Addon is deleted
/// while its cluster still exists.
pub const ADDON_INSTALLER: &str = "kontinuum.sh/addon-installer";

/// Every finalizer Kontinuum uses.
pub const ALL: [&str; 5] = [
    POOL_CLAIMER,
    TALOS_BOOTSTRAPPER,
    INSTANCE_RESET,
    ZONE_INSTALLER,
    ADDON_INSTALLER,
];
