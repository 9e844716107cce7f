"""AgentRun status, built from facts (pure): phase, reason, message, and the two conditions.

Tekton converts a pod into a TaskRun status in one function; this is ours. The handlers
only gather the facts and write what these functions return.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from typing import Any

from agentrun.vocabulary import Condition, Phase, Reason


def stamp(now: datetime.datetime) -> str:
    return now.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def condition(
    type_: str, status: str, reason: str, message: str, now: datetime.datetime,
    previous: Sequence[Mapping[str, Any]],
) -> dict[str, Any]:
    """A condition of any of our kinds; its lastTransitionTime stays while its status does."""
    before = next((c for c in previous if c.get("type") == type_), None)
    since = stamp(now)
    if before is not None and before.get("status") == status and before.get(
            "lastTransitionTime"):
        since = before["lastTransitionTime"]
    return {"type": type_, "status": status, "reason": reason, "message": message,
            "lastTransitionTime": since}


def tools_condition(
    tools: Sequence[str] | None, now: datetime.datetime,
    previous: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """ToolsExecuted: True (some, named), False (checked: none), Unknown (could not check)."""
    if tools is None:
        return condition(Condition.TOOLS_EXECUTED, "Unknown", Condition.TOOL_STATE_UNKNOWN,
                          "The run store could not be read; which tools ran is not known yet.",
                          now, previous)
    if not tools:
        return condition(Condition.TOOLS_EXECUTED, "False", Condition.NO_TOOL_CALLS,
                          "No tool was called.", now, previous)
    return condition(Condition.TOOLS_EXECUTED, "True", Condition.TOOL_CALLS_RECORDED,
                      ", ".join(tools), now, previous)


def succeeded_condition(
    phase: str, reason: str, message: str, now: datetime.datetime,
    previous: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """Succeeded: Unknown while pending/running, True on success, False on failure/cancel."""
    value = {Phase.SUCCEEDED: "True", Phase.FAILED: "False", Phase.CANCELLED: "False"}.get(
        phase, "Unknown")
    return condition(Condition.SUCCEEDED, value, reason, message, now, previous)


# (Ready, Reconciling, Stalled) by phase, on both kinds; api.md "Conditions for GitOps tools".
_GITOPS: Mapping[str, tuple[str, str, bool]] = {
    Phase.PENDING: ("False", "True", False), Phase.RUNNING: ("False", "True", False),
    # Waiting for a human: not ready, and nothing to reconcile until they decide (kstatus:
    # InProgress; Argo CD's health check: Suspended).
    Phase.WAITING: ("False", "False", False),
    Phase.SUCCEEDED: ("True", "False", False),
    Phase.FAILED: ("False", "False", True), Phase.CANCELLED: ("False", "False", True),
    # AgentRunReplay phases.
    "Approved": ("True", "False", False), "Refused": ("False", "False", True),
    # AgentRunApproval phases.
    "Accepted": ("True", "False", False), "Rejected": ("False", "False", True),
}
GITOPS_TYPES = frozenset({Condition.READY, Condition.RECONCILING, Condition.STALLED})


def gitops_conditions(
    phase: str, reason: str, message: str, now: datetime.datetime,
    previous: Sequence[Mapping[str, Any]] = (),
) -> list[dict[str, Any]]:
    """Ready, Reconciling and, once nothing more will happen but failure, Stalled: what
    kstatus and Argo CD decide from. An unknown phase is still being reconciled."""
    ready, reconciling, stalled = _GITOPS.get(phase, ("Unknown", "True", False))
    reason = reason or phase or "Reconciling"
    conditions = [condition(Condition.READY, ready, reason, message, now, previous),
                  condition(Condition.RECONCILING, reconciling, reason, message, now,
                             previous)]
    if stalled:
        conditions.append(condition(Condition.STALLED, "True", reason, message, now,
                                     previous))
    return conditions


def schedule_conditions(
    stalled: bool, reason: str, message: str, now: datetime.datetime,
    previous: Sequence[Mapping[str, Any]] = (),
) -> list[dict[str, Any]]:
    """An AgentRunSchedule's conditions: Ready True while its slots are kept (suspended
    included: it does what it was told); Stalled True, Ready False, when its schedule or
    time zone cannot be parsed (nothing changes until its spec does). Never Reconciling
    once observed: a schedule is not converging on anything between two slots."""
    ready = "False" if stalled else "True"
    conditions = [condition(Condition.READY, ready, reason, message, now, previous),
                  condition(Condition.RECONCILING, "False", reason, message, now, previous)]
    if stalled:
        conditions.append(condition(Condition.STALLED, "True", reason, message, now,
                                     previous))
    return conditions


def with_gitops_conditions(status: Mapping[str, Any], generation: int | None,
                           now: datetime.datetime) -> dict[str, Any]:
    """`status` with its Ready/Reconciling/Stalled conditions brought in line with its phase,
    and observedGeneration: every status write goes through here."""
    before = list(status.get("conditions") or [])
    kept = [c for c in before if c.get("type") not in GITOPS_TYPES]
    written = {**status, "conditions": [*kept, *gitops_conditions(
        status.get("phase") or "", status.get("reason") or "", status.get("message") or "",
        now, before)]}
    if generation is not None:
        written["observedGeneration"] = generation
    return written


def live_status(
    phase: str, reason: str, message: str, now: datetime.datetime,
    previous: Mapping[str, Any], **fields: Any,
) -> dict[str, Any]:
    """A Pending/Running status patch (toolsExecuted is not known while the run is live)."""
    before = list(previous.get("conditions") or [])
    return {
        "phase": phase, "reason": reason, "message": message, **fields,
        "conditions": [succeeded_condition(phase, reason, message, now, before),
                       *[c for c in before if c.get("type") in (
                           Condition.TOOLS_EXECUTED, Condition.RESUMABLE,
                           Condition.APPROVAL_PENDING, Condition.ADMITTED, *GITOPS_TYPES)]],
    }


def settled_status(
    phase: str, reason: str, message: str, tools: Sequence[str] | None,
    now: datetime.datetime, previous: Mapping[str, Any], **fields: Any,
) -> dict[str, Any]:
    """The status patch of a run that ended (Succeeded, Failed or Cancelled)."""
    before = list(previous.get("conditions") or [])
    return {
        "phase": phase, "reason": reason, "message": message,
        "toolsExecuted": None if tools is None else list(tools),
        "finishedAt": stamp(now), **fields,
        "conditions": [succeeded_condition(phase, reason, message, now, before),
                       tools_condition(tools, now, before),
                       *[c for c in before if c.get("type") in (
                           Condition.RESUMABLE, Condition.APPROVAL_PENDING,
                           Condition.ADMITTED, *GITOPS_TYPES)]],
    }


# At most this many tool calls are published on a run (status.toolCalls); the store keeps
# them all, and status.toolCallsOmitted says how many more there were.
TOOL_CALLS_SHOWN = 50


def tool_calls(entries: Sequence[Any]) -> dict[str, Any]:
    """The ledger of a settled run as its status publishes it (what `kubectl agentrun
    tools` shows without a database credential): one entry per call, in call order, the
    first TOOL_CALLS_SHOWN of them. `entries`: store.LedgerEntry rows."""
    shown = [{k: v for k, v in {
        "attempt": e.attempt, "seq": e.seq, "tool": e.tool, "effect": e.effect,
        "idempotencyKey": e.idempotency_key, "calledAt": stamp(e.started_at),
        "endedAt": stamp(e.finished_at) if e.finished_at is not None else None,
        "outcome": e.outcome}.items() if v is not None} for e in entries[:TOOL_CALLS_SHOWN]]
    published: dict[str, Any] = {"toolCalls": shown}
    if len(entries) > TOOL_CALLS_SHOWN:
        published["toolCallsOmitted"] = len(entries) - TOOL_CALLS_SHOWN
    return published


def stale_message(limit: datetime.timedelta) -> str:
    """The Stale message, with the figure of the configured limit ("6h", "90s", ...)."""
    seconds = int(limit.total_seconds())
    if seconds % 3600 == 0:
        figure = f"{seconds // 3600}h"
    elif seconds % 60 == 0:
        figure = f"{seconds // 60}m"
    else:
        figure = f"{seconds}s"
    return f"no completion was recorded within {figure}; its actual outcome is unknown"


def node_ready(node: Mapping[str, Any]) -> bool:
    """Whether a node's Ready condition is True."""
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (node.get("status") or {}).get("conditions") or [])


def pod_waiting(pod: Mapping[str, Any]) -> tuple[str, str] | None:
    """Why a runner pod that has not started waits, as (reason, message) for a Pending run:
    the scheduler cannot place it, or its container cannot be created (a Secret its env
    names is missing, a volume cannot be mounted). None when there is nothing to say."""
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    name = meta.get("name", "?")
    for scheduled in status.get("conditions") or []:
        if scheduled.get("type") == "PodScheduled" and scheduled.get("status") == "False" \
                and scheduled.get("reason") == "Unschedulable":
            return (Reason.POD_UNSCHEDULABLE,
                    f"Runner pod {name} cannot be scheduled: "
                    f"{scheduled.get('message') or 'no node fits it'}. It stays Pending "
                    "until a node fits it; nothing has run.")
    for container in status.get("containerStatuses") or []:
        waiting = (container.get("state") or {}).get("waiting") or {}
        why = waiting.get("reason")
        if why and why not in ("ContainerCreating", "PodInitializing"):
            detail = f": {waiting['message']}" if waiting.get("message") else ""
            return (Reason.POD_WAITING,
                    f"Runner pod {name} cannot start its container ({why}{detail}). It "
                    "stays Pending until that is fixed; nothing has run.")
    return None


def resumable_condition(resumable: bool, reason: str, message: str, now: datetime.datetime,
                        previous: Mapping[str, Any]) -> dict[str, Any]:
    """Resumable: True when a failed attempt was resumed, False (with the refusal's reason
    and message) when spec.retry.resume asked for it and the journal did not allow it."""
    return condition(Condition.RESUMABLE, "True" if resumable else "False", reason, message,
                      now, list(previous.get("conditions") or []))


# status.result: the first RESULT_BYTES of the answer, and its object when it serialises
# to at most RESULT_JSON_BYTES (the status lives in etcd beside everything else); the store
# and the transcript keep the whole. PREVIEW_CHARS of it for the printer column.
RESULT_BYTES = 4096
RESULT_JSON_BYTES = 16 * 1024
PREVIEW_CHARS = 60


def utf8_prefix(text: str, limit: int) -> str:
    """The longest prefix of `text` whose UTF-8 encoding fits in `limit` bytes: a cut never
    splits a character."""
    encoded = text.encode("utf-8")
    if len(encoded) <= limit:
        return text
    return encoded[:limit].decode("utf-8", errors="ignore")


def preview(text: str) -> str:
    """The answer's first words on one line, for `kubectl get ar -o wide`."""
    line = " ".join(text.split())
    if len(line) <= PREVIEW_CHARS:
        return line
    cut = line[:PREVIEW_CHARS].rsplit(" ", 1)[0] or line[:PREVIEW_CHARS]
    return cut + "…"


def result_status(text: str, digest: str, parsed: Any = None) -> dict[str, Any]:
    """status.result of an answer (`digest` is of the whole of `text`)."""
    import json

    shown = utf8_prefix(text, RESULT_BYTES)
    result: dict[str, Any] = {"text": shown, "truncated": shown != text, "digest": digest,
                              "preview": preview(text)}
    if parsed is not None and len(json.dumps(parsed, separators=(",", ":")).encode()) \
            <= RESULT_JSON_BYTES:
        result["json"] = parsed
    return result


def usage_status(usage: Any) -> dict[str, Any]:
    """status.usage of a store.Usage (costMicroUSD absent when a model had no price)."""
    shown: dict[str, Any] = {"modelCalls": usage.model_calls, "toolCalls": usage.tool_calls,
                             "inputTokens": usage.input_tokens,
                             "outputTokens": usage.output_tokens}
    if usage.cost_micro_usd is not None:
        shown["costMicroUSD"] = usage.cost_micro_usd
    return shown


def approval_condition(pending: bool, reason: str, message: str, now: datetime.datetime,
                       previous: Mapping[str, Any]) -> dict[str, Any]:
    """ApprovalPending: True while a call waits for a decision; False once decided."""
    return condition(Condition.APPROVAL_PENDING, "True" if pending else "False", reason,
                      message, now, list(previous.get("conditions") or []))


# status.pendingApproval.args: the first ARGS_SHOWN bytes of the arguments' JSON.
ARGS_SHOWN = 1024


def pending_status(waiting: Any) -> dict[str, Any]:
    """status.pendingApproval of the call a run waits for (a store.Approval)."""
    args = waiting.args
    shown = utf8_prefix(args, ARGS_SHOWN)
    return {"attempt": waiting.attempt, "seq": waiting.seq, "tool": waiting.tool,
            "argsDigest": waiting.args_digest, "args": shown, "argsTruncated": shown != args,
            "requestedAt": stamp(waiting.requested_at),
            "expiresAt": stamp(waiting.expires_at)}


def call_text(waiting: Any, limit: int = 200) -> str:
    """`tool(arg=value, ...)` of a store.Approval, shortened, for messages and Events."""
    import json

    try:
        args = json.loads(waiting.args)
        inner = ", ".join(f"{k}={json.dumps(v)}" for k, v in args.items())
    except (ValueError, AttributeError):
        inner = waiting.args
    said = f"{waiting.tool}({inner})"
    return said if len(said) <= limit else said[: limit - 1] + "…"
