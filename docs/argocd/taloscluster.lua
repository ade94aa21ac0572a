-- Argo CD health check of kontinuum.sh/v1alpha2 TalosCluster, the part particular to the kind.
-- generate.sh appends common.lua and writes the whole script into argocd-cm.yaml as the key
-- resource.customizations.health.kontinuum.sh_TalosCluster.

local kind = {
  controller = "talos-bootstrapper",
  gates = { "Bootstrapped", "KubeconfigAvailable", "ControlPlaneReady", "AddonsReady" },
  -- Reasons only True conditions carry: Ready, Bootstrapped, KubeconfigAvailable, Healthy,
  -- AddonsInstalled, ConfigUpToDate (also a condition outside the gates: a config roll does
  -- not make the cluster unhealthy, but a halted one is told by ReconfigureFailed),
  -- EndpointConfigured and SingleControlPlane (EndpointShared=True). EndpointShared is outside
  -- the gates too: EndpointIsOneMachine (several control planes behind the first one's
  -- address) is a warning about a working cluster, never on Ready, so it is not a verdict.
  -- TeardownDeadlineExceeded is an Event reason, never a condition's.
  reasons = {
    Reconciling = "Progressing",
    WaitingForInstances = "Progressing",
    StaleSecret = "Progressing",
    Bootstrapping = "Progressing",
    WaitingForCni = "Progressing",
    AddonNotHealthy = "Progressing",
    Deleting = "Progressing",
    ResettingInstances = "Progressing",
    Reconfiguring = "Progressing",
    SecretsBundleMissing = "Degraded",
    -- The operator's RBAC refuses a call it needs: a person must fix its Role.
    Forbidden = "Degraded",
    UnsupportedTalosVersion = "Degraded",
    ConfigFailed = "Degraded",
    IdentityChanged = "Degraded",
    BootstrapFailed = "Degraded",
    Unhealthy = "Degraded",
    AddonInstallFailed = "Degraded",
    ReconfigureFailed = "Degraded",
  },
  -- Reasons of Deleting that say resetting or releasing a member failed; it is retried until
  -- the deadline the message names.
  teardown_failed = { TeardownFailed = true },
  -- A TalosCluster cannot be switched off.
  suspended = nil,
}
