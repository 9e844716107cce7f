-- Argo CD health of an AgentRunTrigger (docs/triggers.md). A trigger the operator keeps is
-- Healthy: each event delivered to status.url starts one run; a suspended one is Suspended
-- (deliveries are answered 503 until spec.suspend is false); one whose Secret is missing or
-- whose spec cannot be read is Degraded (Stalled, with the reason): no delivery can start a
-- run until it is fixed. Until the operator has observed the current generation,
-- Progressing. The runs it starts have their own health.
-- Base Lua only (no string, table, os or io library): what any Argo CD gives an argocd-cm
-- health check.
local health = {}

local function said(c, fallback)
  if c.reason ~= nil and c.message ~= nil and c.message ~= "" then
    return c.reason .. ": " .. c.message
  end
  return c.message or c.reason or fallback
end

local function condition(status, kind)
  for _, c in ipairs(status.conditions or {}) do
    if c.type == kind then
      return c
    end
  end
  return nil
end

local status = obj.status
if status == nil or status.conditions == nil then
  health.status = "Progressing"
  health.message = "Waiting for the operator to pick up the trigger"
  return health
end

local generation = obj.metadata and obj.metadata.generation
if generation ~= nil and (status.observedGeneration == nil
    or status.observedGeneration < generation) then
  health.status = "Progressing"
  health.message = "Waiting for the operator to observe generation " .. generation
  return health
end

local stalled = condition(status, "Stalled")
local ready = condition(status, "Ready")
if stalled ~= nil and stalled.status == "True" then
  health.status = "Degraded"
  health.message = said(stalled, "The trigger is stalled")
elseif obj.spec ~= nil and obj.spec.suspend == true then
  health.status = "Suspended"
  health.message = "Suspended: deliveries are answered 503 until spec.suspend is false"
elseif ready ~= nil and ready.status == "True" then
  health.status = "Healthy"
  health.message = said(ready, "Listening")
else
  health.status = "Progressing"
  health.message = "Waiting for the operator to look at the trigger"
end
return health
