-- Argo CD health check of kontinuum.sh/v1alpha2 Kontinuum, the part particular to the kind.
-- generate.sh appends common.lua and writes the whole script into argocd-cm.yaml as the key
-- resource.customizations.health.kontinuum.sh_Kontinuum.

local kind = {
  controller = "registry",
  gates = { "Heartbeating" },
  -- Reasons only True conditions carry: Ready, HeartbeatReceived.
  reasons = {
    Reconciling = "Progressing",
    Deleting = "Progressing",
    HeartbeatStale = "Degraded",
  },
  -- Removing an entry from the registry has no step that can fail.
  teardown_failed = {},
  -- A registry entry cannot be switched off.
  suspended = nil,
}
