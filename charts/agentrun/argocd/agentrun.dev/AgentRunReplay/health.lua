-- Argo CD health of an AgentRunReplay (docs/gitops.md). Pending is Progressing; Approved
-- is Healthy (the replay run it created has its own health); Refused is Degraded: a
-- refusal is final until someone acts on its message (for most reasons, by adding the
-- force annotation).
-- The phase decides; a status without a phase falls back to the Ready and Stalled
-- conditions of api.md.
local health = {}

local function said(status, fallback)
  if status.reason ~= nil and status.message ~= nil and status.message ~= "" then
    return status.reason .. ": " .. status.message
  end
  return status.message or status.reason or fallback
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
  health.message = "Waiting for the operator to decide on the replay"
  return health
end

local generation = obj.metadata and obj.metadata.generation
if generation ~= nil and status.observedGeneration ~= nil
    and status.observedGeneration < generation then
  health.status = "Progressing"
  health.message = "Waiting for the operator to observe generation " .. generation
  return health
end

local phase = status.phase
if phase == "Approved" then
  health.status = "Healthy"
  if status.replayRunName ~= nil then
    health.message = said(status, "Approved") .. " (replay run " .. status.replayRunName .. ")"
  else
    health.message = said(status, "Approved")
  end
elseif phase == "Refused" then
  health.status = "Degraded"
  health.message = said(status, "Refused")
elseif phase == "Pending" then
  health.status = "Progressing"
  health.message = said(status, "Waiting for the operator to decide on the replay")
else
  local stalled = condition(status, "Stalled")
  local ready = condition(status, "Ready")
  if stalled ~= nil and stalled.status == "True" then
    health.status = "Degraded"
    health.message = said(stalled, "Refused")
  elseif ready ~= nil and ready.status == "True" then
    health.status = "Healthy"
    health.message = said(ready, "Approved")
  else
    health.status = "Progressing"
    health.message = "Waiting for the operator to decide on the replay"
  end
end
return health
