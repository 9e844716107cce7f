-- Argo CD health of an AgentRunSchedule (docs/gitops.md). A schedule the operator keeps is
-- Healthy; a suspended one is Suspended (it starts nothing until spec.suspend is false); one
-- whose schedule or time zone cannot be parsed is Degraded (Stalled, InvalidSchedule): it
-- starts nothing until its spec is fixed. Until the operator has observed the current
-- generation, Progressing. The runs it starts have their own health.
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
if status == nil then
  health.status = "Progressing"
  health.message = "Waiting for the operator to pick up the schedule"
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
local running = ""
for i, name in ipairs(status.active or {}) do
  if i == 1 then
    running = " (live: " .. name
  else
    running = running .. ", " .. name
  end
end
if running ~= "" then
  running = running .. ")"
end
if stalled ~= nil and stalled.status == "True" then
  health.status = "Degraded"
  health.message = said(stalled, "The schedule is stalled")
elseif obj.spec ~= nil and obj.spec.suspend == true then
  health.status = "Suspended"
  health.message = "Suspended: no run is started until spec.suspend is false" .. running
elseif ready ~= nil and ready.status == "True" then
  health.status = "Healthy"
  health.message = said(ready, "Scheduled") .. running
else
  health.status = "Progressing"
  health.message = "Waiting for the operator to schedule the next slot"
end
return health
