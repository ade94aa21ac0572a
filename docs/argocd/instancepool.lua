-- Argo CD health check of kontinuum.sh/v1alpha2 InstancePool, the part particular to the kind.
-- generate.sh appends common.lua and writes the whole script into argocd-cm.yaml as the key
-- resource.customizations.health.kontinuum.sh_InstancePool.

local kind = {
  controller = "pool-claimer",
  -- (InsufficientCapacity is Claimed's inverse, kept for tools that alert on it; Claimed
  -- carries the same verdict.)
  gates = { "Claimed" },
  -- InsufficientCapacity waits for matching Instances to be discovered, which machines
  -- booting into maintenance mode resolve.
  -- Reasons only True conditions carry: Ready, AllClaimed.
  reasons = {
    Reconciling = "Progressing",
    InsufficientCapacity = "Progressing",
    Deleting = "Progressing",
    ClaimFailed = "Degraded",
    -- The operator's RBAC refuses a call it needs: a person must fix its Role.
    Forbidden = "Degraded",
    InvalidSelector = "Degraded",
  },
  -- Reasons of Deleting that say releasing an Instance failed (retried).
  teardown_failed = { ReleaseFailed = true },
  -- A pool cannot be switched off (replicas: 0 releases every Instance and is Healthy).
  suspended = nil,
}
