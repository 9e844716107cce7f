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


def _condition(
    type_: str, status: str, reason: str, message: str, now: datetime.datetime,
    previous: Sequence[Mapping[str, Any]],
) -> dict[str, Any]:
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
        return _condition(Condition.TOOLS_EXECUTED, "Unknown", Condition.TOOL_STATE_UNKNOWN,
                          "The run store could not be read; which tools ran is not known yet.",
                          now, previous)
    if not tools:
        return _condition(Condition.TOOLS_EXECUTED, "False", Condition.NO_TOOL_CALLS,
                          "No tool was called.", now, previous)
    return _condition(Condition.TOOLS_EXECUTED, "True", Condition.TOOL_CALLS_RECORDED,
                      ", ".join(tools), now, previous)


def succeeded_condition(
    phase: str, reason: str, message: str, now: datetime.datetime,
    previous: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """Succeeded: Unknown while pending/running, True on success, False on failure/cancel."""
    value = {Phase.SUCCEEDED: "True", Phase.FAILED: "False", Phase.CANCELLED: "False"}.get(
        phase, "Unknown")
    return _condition(Condition.SUCCEEDED, value, reason, message, now, previous)


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
    conditions = [_condition(Condition.READY, ready, reason, message, now, previous),
                  _condition(Condition.RECONCILING, reconciling, reason, message, now,
                             previous)]
    if stalled:
        conditions.append(_condition(Condition.STALLED, "True", reason, message, now,
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
    conditions = [_condition(Condition.READY, ready, reason, message, now, previous),
                  _condition(Condition.RECONCILING, "False", reason, message, now, previous)]
    if stalled:
        conditions.append(_condition(Condition.STALLED, "True", reason, message, now,
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


# Failures another attempt cannot mend: the same spec meets the same refusal again.
NOT_RETRIED = frozenset({
    Reason.DEADLINE_EXCEEDED, Reason.INPUT_UNAVAILABLE, Reason.STALE,
    Reason.IMAGE_PULL_FAILED, Reason.MODEL_NOT_ALLOWED, Reason.POD_INVALID,
    Reason.SESSION_BUSY, Reason.SESSION_NOT_OWNED,
    # The run pinned its agent at launch: another attempt builds the same one.
    Reason.AGENT_NOT_FOUND, Reason.AGENT_INVALID,
    # The resumed attempt would open the same call under the same arguments again.
    Reason.APPROVAL_MISMATCH,
    # The run's spec.tools loosens what the Agent or the image declares: it always will.
    Reason.POLICY_VIOLATION,
})


def should_retry(
    spec: Mapping[str, Any], attempt: int, phase: str, reason: str,
    tools: Sequence[str] | None,
) -> bool:
    """A new attempt only when the failed one provably called no tool (`[]`, never None),
    attempts remain, and trying again can help (not for a spent deadline, a missing
    input, a stale run or an image that will not pull)."""
    if phase != Phase.FAILED or tools is None or len(tools) != 0:
        return False
    if reason in NOT_RETRIED:
        return False
    max_attempts = int(((spec.get("retry") or {}).get("maxAttempts")) or 1)
    return attempt < max_attempts


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
    for condition in status.get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False" \
                and condition.get("reason") == "Unschedulable":
            return (Reason.POD_UNSCHEDULABLE,
                    f"Runner pod {name} cannot be scheduled: "
                    f"{condition.get('message') or 'no node fits it'}. It stays Pending "
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
    return _condition(Condition.RESUMABLE, "True" if resumable else "False", reason, message,
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
    return _condition(Condition.APPROVAL_PENDING, "True" if pending else "False", reason,
                      message, now, list(previous.get("conditions") or []))
