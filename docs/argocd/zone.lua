-- Argo CD health check of kontinuum.sh/v1alpha2 Zone, the part particular to the kind.
-- generate.sh appends common.lua and writes the whole script into argocd-cm.yaml as the key
-- resource.customizations.health.kontinuum.sh_Zone.

local kind = {
  controller = "zone-installer",
  gates = { "ClusterReady", "Installed", "RegistryJoined" },
  -- Reasons only True conditions carry: Ready, ClusterReady, Installed, RegistryJoined.
  -- TeardownDeadlineExceeded is an Event reason, never a condition's.
  reasons = {
    Reconciling = "Progressing",
    TalosClusterNotFound = "Progressing",
    WaitingForTalosCluster = "Progressing",
    DownstreamNotReady = "Progressing",
    NoVersionFound = "Progressing",
    WaitingForCertificate = "Progressing",
    WaitingForRegistry = "Progressing",
    Deleting = "Progressing",
    FanOutFailed = "Degraded",
    -- The operator's RBAC refuses a call it needs: a person must fix its Role.
    Forbidden = "Degraded",
    SeedInstanceClaimed = "Degraded",
    NoStorageSecretFound = "Degraded",
    NoAuthMode = "Degraded",
    InstallFailed = "Degraded",
    GatewayClassNotFound = "Degraded",
    IdentityRevoked = "Degraded",
  },
  -- Reasons of Deleting (or Teardown) that say a teardown step failed; it is retried until
  -- the deadline the message names.
  teardown_failed = { DownstreamTeardownFailed = true, TalosClusterDeleteFailed = true },
  -- A Zone cannot be switched off.
  suspended = nil,
}
