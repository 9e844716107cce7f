-- Argo CD health of an Agent (docs/agents.md). An Agent has nothing in progress once the
-- operator has looked at its generation: Healthy when Ready (its definition resolves and
-- its Secrets exist), Degraded when Stalled, with the reason and what to fix.
local health = {}

local function condition(status, kind)
  for _, c in ipairs(status.conditions or {}) do
    if c.type == kind then
      return c
    end
  end
  return nil
end

local function said(c)
  if c.reason ~= nil and c.message ~= nil and c.message ~= "" then
    return c.reason .. ": " .. c.message
  end
  return c.message or c.reason
end

local status = obj.status
if status == nil then
  health.status = "Progressing"
  health.message = "Waiting for the operator to resolve the Agent"
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
  health.message = said(stalled)
elseif ready ~= nil and ready.status == "True" then
  health.status = "Healthy"
  health.message = said(ready)
else
  health.status = "Progressing"
  health.message = "Waiting for the operator to resolve the Agent"
end
return health
