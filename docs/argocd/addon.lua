-- Argo CD health check of kontinuum.sh/v1alpha2 Addon, the part particular to the kind.
-- generate.sh appends common.lua and writes the whole script into argocd-cm.yaml as the key
-- resource.customizations.health.kontinuum.sh_Addon.

local kind = {
  controller = "addon-installer",
  gates = { "Installed", "Healthy" },
  -- Reasons only True conditions carry: Ready, Installed, Healthy.
  reasons = {
    Reconciling = "Progressing",
    WaitingForKubeconfig = "Progressing",
    WaitingForDependency = "Progressing",
    Installing = "Progressing",
    CRDsNotReady = "Progressing",
    NotHealthy = "Progressing",
    Deleting = "Progressing",
    Disabled = "Suspended",
    InstallFailed = "Degraded",
    -- The operator's RBAC refuses a call it needs: a person must fix its Role.
    Forbidden = "Degraded",
    -- The zone cluster does not answer (Healthy is Unknown): retried, but nobody can tell
    -- whether the release still runs until it answers again.
    ClusterUnreachable = "Degraded",
  },
  -- Reasons of Deleting that say uninstalling the release failed; it is retried until the
  -- deadline the message names.
  teardown_failed = { UninstallFailed = true },
  -- spec.enabled: false keeps the Addon but uninstalls its release.
  suspended = function(o)
    if o.spec ~= nil and o.spec.enabled == false then
      return "Disabled: spec.enabled is false, the release is not installed"
    end
    return nil
  end,
}
