"""An AgentRunApproval: a human's decision on one call a run waits for.

`judge(...)` is the pure decision (tests/operator/test_approval_decisions.py holds its table); the
reconcile gathers the facts (the AgentRun, the call it waits for in the store), calls it,
writes the decision into the store when it is the one (first valid approval wins, atomically
in the store: `store.decide`), and shows the verdict. The run's own reconcile then resumes
it (run.py: a decided call resumes the run). An approval is decided once: its status is final.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agentrun import store
from agentrun.vocabulary import (
    ANNOTATION_CREATED_BY,
    APPROVAL_PLURAL,
    ApprovalDecision,
    ApprovalPhase,
    ApprovalReason,
)
from agentrun_operator import events, metrics
from agentrun_operator import status as st
from agentrun_operator.controller import Context, now

# The status of the call a run waits for is built with the run's (status.py).
from agentrun_operator.status import ARGS_SHOWN as ARGS_SHOWN
from agentrun_operator.status import call_text as call_text
from agentrun_operator.status import pending_status as pending_status

log = logging.getLogger("agentrun.operator")

@dataclass(frozen=True)
class Verdict:
    """phase (ApprovalPhase), reason (ApprovalReason) and one sentence."""

    phase: str
    reason: str
    message: str

    @property
    def decides(self) -> bool:
        return self.reason == ApprovalReason.DECIDED


def judge(spec: Mapping[str, Any], run_name: str, run_exists: bool,
          pending: store.Approval | None, decided: Sequence[store.Approval],
          creator: str | None = None, allow_self: bool = False) -> Verdict:
    """What an AgentRunApproval with `spec` does (api.md, "Approval" and "Tenant policy"),
    first match wins: no such run; its approver created the run (four eyes, unless
    `allow_self`); the call it names is not the one waiting (decided already, or never
    asked for); the arguments it approves are not the call's; else it decides the call.
    `pending`: the call the run waits for; `decided`: its calls decided before; `creator`:
    the run's agentrun.dev/created-by (None: not recorded, as on runs older than it)."""
    seq, digest = int(spec.get("seq") or 0), str(spec.get("argsDigest") or "")
    if not run_exists:
        return Verdict(ApprovalPhase.REJECTED, ApprovalReason.RUN_NOT_FOUND,
                       f"AgentRun {run_name} does not exist in this namespace: check "
                       "spec.runName.")
    approver = str(spec.get("approver") or "")
    if creator and approver == creator and not allow_self:
        return Verdict(ApprovalPhase.REJECTED, ApprovalReason.SELF_APPROVAL,
                       f"{approver} created AgentRun {run_name} and may not decide its calls: "
                       "another approver must (four eyes). The call stays pending. An "
                       "installation run by one person sets the chart value "
                       "approval.allowSelfApproval: true.")
    if pending is None or pending.seq != seq:
        done = next((a for a in reversed(decided) if a.seq == seq), None)
        if done is not None and (pending is None or done.attempt >= pending.attempt):
            return Verdict(ApprovalPhase.REJECTED, ApprovalReason.ALREADY_DECIDED,
                           f"Call {seq} ({done.tool}) of AgentRun {run_name} was already "
                           f"decided: {done.decision} by {done.approver}. One decision per "
                           "call; the first valid one stands.")
        waiting = (f"it waits for call {pending.seq} ({pending.tool})" if pending is not None
                   else "it waits for no approval")
        return Verdict(ApprovalPhase.REJECTED, ApprovalReason.NOT_PENDING,
                       f"AgentRun {run_name} does not wait for an approval of call {seq}: "
                       f"{waiting}. See its status.pendingApproval.")
    if digest != pending.args_digest:
        return Verdict(ApprovalPhase.REJECTED, ApprovalReason.ARGS_MISMATCH,
                       f"spec.argsDigest {digest or '(none)'} is not the digest of the "
                       f"arguments of call {seq} ({pending.tool}), {pending.args_digest}: "
                       "an approval approves exactly the arguments it names. The run keeps "
                       "waiting; look at status.pendingApproval and decide again.")
    said = "approved" if spec.get("decision") == ApprovalDecision.APPROVE else "denied"
    return Verdict(ApprovalPhase.ACCEPTED, ApprovalReason.DECIDED,
                   f"Call {seq} ({pending.tool}) of AgentRun {run_name} is {said} by "
                   f"{spec.get('approver')}; the run goes on.")


async def reconcile_approval(ctx: Context, namespace: str, name: str) -> float | None:
    """The work queue's entry point for AgentRunApprovals."""
    approval = ctx.approvals.get((namespace, name))
    if approval is None and ctx.pods is None:  # no caches (a step called directly)
        approval = await ctx.kube.read_custom(APPROVAL_PLURAL, namespace, name)
    if approval is None or (approval.get("status") or {}).get("phase"):
        return None  # gone, or decided: final
    spec = approval.get("spec") or {}
    run_name = str(spec.get("runName") or "")
    run = await ctx.run(namespace, run_name)
    if run is None:
        # Not in the cache is not gone: a replica that has just started leading may judge an
        # approval before the watch has shown it the run. Rejected RunNotFound is final, so
        # it is said only of a run the API server does not have.
        run = await ctx.kube.read_run(namespace, run_name)
    pending = decided = None
    if run is not None:
        uid = run["metadata"]["uid"]
        pending = await store.pending_approval(ctx.engine, uid)
        decided = [a for a in await store.approvals_of(ctx.engine, uid) if not a.pending]
    creator = ((run or {}).get("metadata", {}).get("annotations") or {}).get(
        ANNOTATION_CREATED_BY)
    verdict = judge(spec, run_name, run is not None, pending, decided or [], creator,
                    ctx.config.allow_self_approval)
    if verdict.decides:
        assert run is not None and pending is not None
        won = await store.decide(ctx.engine, run["metadata"]["uid"], pending.call_id,
                                 str(spec["decision"]), str(spec["approver"]),
                                 spec.get("note"), name)
        if not won:  # another approval (or the timeout) decided it a moment before
            decided = [a for a in await store.approvals_of(ctx.engine, run["metadata"]["uid"])
                       if not a.pending]
            verdict = judge(spec, run_name, True, None, decided, creator,
                            ctx.config.allow_self_approval)
        else:
            ctx.queue.add(("run", namespace, run_name))
            events.post(run, "ApprovalDecided", verdict.message)
            metrics.approval_decided(pending, str(spec["decision"]), now())
    await _show(ctx, approval, verdict)
    log.info("event=approval-judged approval=%s/%s run=%s phase=%s reason=%s", namespace,
             name, run_name, verdict.phase, verdict.reason)
    return None


async def _show(ctx: Context, approval: Mapping[str, Any], verdict: Verdict) -> None:
    meta = approval["metadata"]
    status = st.with_gitops_conditions(
        {"phase": verdict.phase, "reason": verdict.reason, "message": verdict.message,
         "decidedAt": st.stamp(now())}, meta.get("generation"), now())
    written = await ctx.kube.replace_status(APPROVAL_PLURAL, approval, status)
    ctx.keep(ctx.approvals, written)
    events.post(approval, verdict.reason, verdict.message,
                warning=verdict.phase == ApprovalPhase.REJECTED)

