-- Argo CD health check of kontinuum.sh/v1alpha2 Instance, the part particular to the kind.
-- generate.sh appends common.lua and writes the whole script into argocd-cm.yaml as the key
-- resource.customizations.health.kontinuum.sh_Instance.

local kind = {
  -- Who summarises the status: instance-discovery, from its own Discovered while the
  -- Instance is free and from talos-bootstrapper's conditions once a pool claimed it.
  controller = "instance-discovery",
  -- The conditions that gate Ready: Discovered for a free Instance; Configured and Joined
  -- for one claimed by a pool (maintenance mode no longer answers then), and Healthy too on
  -- a control plane (the only members that carry it).
  gates = function(o)
    local labels = o.metadata.labels or {}
    local claimed = labels["kontinuum.sh/claimed-by"]
    if claimed ~= nil and claimed ~= "" then
      local conditions = (o.status or {}).conditions or {}
      for _, c in ipairs(conditions) do
        if c.type == "Healthy" then
          return { "Configured", "Joined", "Healthy" }
        end
      end
      return { "Configured", "Joined" }
    end
    return { "Discovered" }
  end,
  -- Reasons only True conditions carry: Ready, Discovered, ConfigApplied, Joined, Healthy.
  reasons = {
    Reconciling = "Progressing",
    WaitingForControlPlane = "Progressing",
    Deleting = "Progressing",
    Resetting = "Progressing",
    NoInterfaces = "Degraded",
    -- The operator's RBAC refuses a call it needs: a person must fix its Role.
    Forbidden = "Degraded",
    ProbeFailed = "Degraded",
    IdentityChanged = "Degraded",
    ConfigRejected = "Degraded",
    InvalidConfigPatch = "Degraded",
    IdentityUnknown = "Degraded",
    TalosApiUnreachable = "Degraded",
    Unhealthy = "Degraded",
  },
  -- Reasons of Deleting that say the machine's reset failed; it is retried until the
  -- deadline the message names.
  teardown_failed = { ResetFailed = true },
  -- An Instance cannot be switched off.
  suspended = nil,
}
