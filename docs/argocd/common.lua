-- ---- Common to every Kontinuum kind: docs/argocd/common.lua, which generate.sh appends to
-- each <kind>.lua. The contract it reads is in docs/gitops.md. Lua 5.1, as Argo CD's
-- gopher-lua runs it: base, string and table functions only. It reads the kind's table `kind`:
--   controller       who writes the status;
--   gates            the conditions that gate Ready, in the order the operator checks them
--                    (or a function of the object giving them);
--   reasons          the verdict of a reason on a condition that is not True. Progressing:
--                    resolves without a person. Degraded: failed or refused, a person must
--                    look. Suspended: switched off. A reason it does not name waits;
--   teardown_failed  the reasons of Deleting (set to true) that say a teardown step failed;
--   suspended        nil, or a function of the object giving why it is switched off (nil
--                    when it is not).

local function find(conditions, wanted)
  for _, c in ipairs(conditions) do
    if c.type == wanted then
      return c
    end
  end
  return nil
end

local function explain(c)
  local text = c.type .. "=" .. (c.status or "Unknown")
  if c.reason ~= nil and c.reason ~= "" then
    text = text .. " " .. c.reason
  end
  if c.message ~= nil and c.message ~= "" then
    text = text .. ": " .. c.message
  end
  return text
end

local hs = {}
local status = obj.status or {}
local conditions = status.conditions or {}
local generation = obj.metadata.generation

-- 1. Deleting: the operator's cleanup runs behind its finalizer. Its Deleting condition (the
--    predecessor's Teardown) says what it waits for and until when; a failed step is Degraded.
if obj.metadata.deletionTimestamp ~= nil then
  local c = find(conditions, "Deleting") or find(conditions, "Teardown")
  hs.status = "Progressing"
  if c ~= nil and kind.teardown_failed[c.reason] then
    hs.status = "Degraded"
  end
  if c ~= nil and c.message ~= nil and c.message ~= "" then
    hs.message = "Deleting: " .. c.message
  else
    hs.message = "Deleting: waiting for finalizers " .. table.concat(obj.metadata.finalizers or {}, ", ")
  end
  return hs
end

-- 2. Switched off by its spec.
if kind.suspended ~= nil then
  local why = kind.suspended(obj)
  if why ~= nil then
    hs.status = "Suspended"
    hs.message = why
    return hs
  end
end

-- 3. No verdict yet.
local ready = find(conditions, "Ready")
if ready == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for " .. kind.controller .. " to report Ready"
  return hs
end

-- 4. A verdict about an older spec: the operator has not seen the current generation yet.
local seen = ready.observedGeneration or status.observedGeneration
if generation ~= nil and (seen == nil or seen < generation) then
  hs.status = "Progressing"
  hs.message = "Waiting for " .. kind.controller .. " to observe generation " .. generation
  if seen ~= nil then
    hs.message = hs.message .. " (Ready is of generation " .. seen .. ")"
  end
  return hs
end

-- 5. A gate of Ready that failed is Degraded, even when an earlier gate still waits.
local gates = kind.gates
if type(gates) == "function" then
  gates = gates(obj)
end
for _, wanted in ipairs(gates) do
  local c = find(conditions, wanted)
  if c ~= nil and c.status ~= "True" and kind.reasons[c.reason] == "Degraded" then
    hs.status = "Degraded"
    hs.message = explain(c)
    return hs
  end
end

-- 6. Ready=True: Healthy once the whole reconcile of this generation succeeded
--    (status.observedGeneration moves only after a reconcile in which every step succeeded).
if ready.status == "True" then
  if generation ~= nil and status.observedGeneration ~= nil and status.observedGeneration < generation then
    hs.status = "Progressing"
    hs.message = "Ready, but generation " .. generation .. " is not fully reconciled yet"
    return hs
  end
  hs.status = "Healthy"
  hs.message = ready.message or "Ready"
  return hs
end

-- 7. Ready=False or Unknown: its reason (the first gate that is not True) decides; a reason
--    this script does not know waits.
hs.status = kind.reasons[ready.reason] or "Progressing"
hs.message = explain(ready)
return hs
