-- Argo CD health of an AgentRun (docs/gitops.md). A run that is still going is
-- Progressing, one that succeeded is Healthy, one that failed or was cancelled is Degraded:
-- it will not change by itself, someone has to look (and maybe replay it). One that waits
-- for a human's approval of a tool call is Suspended, saying which call.
-- The phase decides; a status without a phase (the operator has seen the run but not yet
-- given it one) falls back to the Ready and Stalled conditions of api.md.
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
  health.message = "Waiting for the operator to pick up the run"
  return health
end

local generation = obj.metadata and obj.metadata.generation
if generation ~= nil and status.observedGeneration ~= nil
    and status.observedGeneration < generation then
  health.status = "Progressing"
  health.message = "Waiting for the operator to observe generation " .. generation
  return health
end

-- Spelled out, not string.lower(phase): Argo CD runs an argocd-cm customization without
-- Lua's string library (useOpenLibs is off unless argocd-cm turns it on), and the fallback
-- message is built even when the status has its own.
local in_words = {Pending = "pending", Running = "running", Failed = "failed",
                  Cancelled = "cancelled"}

local phase = status.phase
if phase == "Succeeded" then
  health.status = "Healthy"
  health.message = said(status, "The run succeeded")
elseif phase == "Failed" or phase == "Cancelled" then
  health.status = "Degraded"
  health.message = said(status, "The run " .. in_words[phase])
elseif phase == "Pending" or phase == "Running" then
  health.status = "Progressing"
  health.message = said(status, "The run is " .. in_words[phase])
elseif phase == "Waiting" then
  health.status = "Suspended"
  local pending = status.pendingApproval or {}
  health.message = said(status, "The run waits for an approval of " ..
                        (pending.tool or "a tool call"))
else
  local stalled = condition(status, "Stalled")
  local ready = condition(status, "Ready")
  if stalled ~= nil and stalled.status == "True" then
    health.status = "Degraded"
    health.message = said(stalled, "The run is stalled")
  elseif ready ~= nil and ready.status == "True" then
    health.status = "Healthy"
    health.message = said(ready, "The run is ready")
  else
    health.status = "Progressing"
    health.message = "Waiting for the operator to start the run"
  end
end
return health
