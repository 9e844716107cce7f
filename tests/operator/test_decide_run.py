"""decide_run(): an AgentRun's next step, row by row, then the status that shows it.

Hold api.md's run tables next to TABLE ("Failure reasons", the `retry` field, "Automatic
resume", "Approval", "Cancel in place", "Queues" for Kueue's admission and preemption,
"History beyond etcd" for the time to live, "Triggers" for a trigger's dedupe window, the
finalizer of "Cancelled") and operator/agentrun_operator/run.py's own table: each row
names the line it ticks. No cluster and no store: the facts are built here as a sync
would read them.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from agentrun_operator.config import OperatorConfig
from agentrun_operator.decide import ANSWERED, IN_DOUBT, Journal, JournalCall
from agentrun_operator.run import (
    FINALIZER,
    UNKNOWN,
    AddFinalizer,
    CancelWait,
    Count,
    DeletePods,
    Deny,
    Expire,
    Finish,
    InQueue,
    Launch,
    Live,
    Nothing,
    Release,
    RunFacts,
    RunStep,
    Settle,
    Start,
    Tools,
    Usage,
    Wait,
    decide_run,
    reads,
    run_status,
    should_retry,
)

from agentrun import effects, store
from agentrun.ledger import LedgerEntry
from agentrun.vocabulary import (
    ANNOTATION_CANCEL,
    ANNOTATION_CANCEL_NOTE,
    ApprovalDecision,
    Condition,
    Kueue,
    Phase,
    Reason,
    RunStatus,
)

T0 = datetime.datetime(2026, 7, 10, 12, 0, 0, tzinfo=datetime.UTC)
UID = "0b0e7f4c-1111-4a4a-8888-000000000001"
CONFIG = OperatorConfig(allow_scripted_model=True, run_ttl_after_finished=None)
STAMP = "2026-07-10T11:59:00Z"  # a minute before T0


def at(seconds: float) -> datetime.datetime:
    return T0 + datetime.timedelta(seconds=seconds)


# -- facts, as a sync reads them ----------------------------------------------------------


def agent_run(phase: str = Phase.RUNNING, reason: str = Reason.STARTED, attempts: int = 1, *,
              retry: Mapping[str, Any] | None = None, finalizer: bool = True,
              deleting: bool = False, annotations: Mapping[str, str] | None = None,
              status: Mapping[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    """An AgentRun `triage-42`, launched (input snapshotted) unless its phase is ""."""
    meta: dict[str, Any] = {"name": "triage-42", "namespace": "support", "uid": UID,
                            "resourceVersion": "7", "generation": 1,
                            "creationTimestamp": STAMP,
                            "finalizers": [FINALIZER] if finalizer else [],
                            "annotations": dict(annotations or {})}
    if deleting:
        meta["deletionTimestamp"] = "2026-07-10T11:59:59Z"
    shown: dict[str, Any] = {}
    if phase:
        shown = {"phase": phase, "reason": reason, "message": "...", "attempts": attempts,
                 "inputDigest": "hmac-sha256:abc", "podName": f"triage-42-{attempts}",
                 "startedAt": STAMP}
    shown.update(status or {})
    return {"apiVersion": "agentrun.dev/v1alpha1", "kind": "AgentRun", "metadata": meta,
            "spec": {"agent": "support-agent", "retry": dict(retry or {}), **spec},
            "status": shown}


def pod(phase: str = "Running", attempt: int = 1, *, ours: bool = True,
        conditions: tuple[dict[str, Any], ...] = (), deleting: bool = False,
        reason: str | None = None, terminated: Mapping[str, Any] | None = None,
        waiting: str | None = None, node: str = "node-1") -> dict[str, Any]:
    """Attempt `attempt`'s runner pod as the informer keeps it."""
    meta: dict[str, Any] = {"name": f"triage-42-{attempt}", "namespace": "support",
                            "uid": f"pod-{attempt}",
                            "ownerReferences": [{"uid": UID if ours else "another"}]}
    if deleting:
        meta["deletionTimestamp"] = "2026-07-10T11:59:59Z"
    status: dict[str, Any] = {"phase": phase, "conditions": list(conditions)}
    if reason:
        status["reason"] = reason
    if terminated is not None:
        status["containerStatuses"] = [{"state": {"terminated": dict(terminated)}}]
    if waiting is not None:
        status["containerStatuses"] = [{"state": {"waiting": {"reason": waiting,
                                                               "message": "no such image"}}}]
    return {"metadata": meta, "spec": {"nodeName": node}, "status": status}


def queued_pod(*, gated: bool = True, phase: str = "Pending") -> dict[str, Any]:
    """Attempt 1's runner pod in LocalQueue team-a: Kueue's gate on it until admitted."""
    held = pod(phase)
    held["metadata"]["labels"] = {Kueue.LABEL_QUEUE_NAME: "team-a"}
    if gated:
        held["spec"] = {"nodeName": None, "schedulingGates": [{"name": Kueue.ADMISSION_GATE}]}
    return held


def workload(admitted: bool) -> dict[str, Any]:
    """The Workload Kueue made for attempt 1's pod: quota not reserved, or admitted."""
    said = [{"type": Kueue.QUOTA_RESERVED, "status": "False", "reason": "Pending",
             "message": "insufficient unused quota for cpu in flavor default-flavor"}]
    if admitted:
        said = [{"type": Kueue.QUOTA_RESERVED, "status": "True", "reason": "QuotaReserved",
                 "message": "Quota reserved"},
                {"type": Kueue.ADMITTED, "status": "True", "reason": "Admitted",
                 "message": "The workload is admitted"}]
    return {"metadata": {"name": "pod-triage-42-1", "namespace": "support",
                         "ownerReferences": [{"kind": "Pod", "name": "triage-42-1",
                                              "uid": "pod-1"}]},
            "status": {"conditions": said, "admission": {"clusterQueue": "team-a-cq"}}}


def kueue_stopped(cause: str) -> dict[str, Any]:
    """Attempt 1's pod as Kueue leaves it when it stops it: TerminationTarget, deleting."""
    return pod("Running", deleting=True, conditions=(
        {"type": Kueue.TERMINATION_TARGET, "status": "True", "reason": cause,
         "message": "Preempted to accommodate a workload (UID: w-2) due to prioritization "
                    "in the ClusterQueue"},))


def shown(run_facts: RunFacts, now: datetime.datetime = T0) -> RunFacts:
    """The facts of the next sync, once the step decided on `run_facts` was shown."""
    step = decide_run(run_facts, now, CONFIG)
    assert isinstance(step, Live | Wait | Finish | Tools | InQueue | Usage), step
    status, _ = run_status(run_facts, step, now)
    return replace(run_facts, run={**run_facts.run, "status": status})


def triggered(run: dict[str, Any], *, owned: bool = True) -> dict[str, Any]:
    """`run` as AgentRunTrigger `orders` made it (its label, and its controller)."""
    meta = run["metadata"]
    meta["labels"] = {"agentrun.dev/trigger": "orders"}
    if owned:
        meta["ownerReferences"] = [{"kind": "AgentRunTrigger", "name": "orders",
                                    "uid": "trigger-1", "controller": True}]
    return run


ORDERS = {("support", "orders"): {"metadata": {"name": "orders", "uid": "trigger-1"},
                                  "spec": {"dedupeWindowSeconds": 600}}}


def disrupted(cause: str) -> dict[str, Any]:
    return pod("Failed", conditions=({"type": "DisruptionTarget", "status": "True",
                                      "reason": cause, "message": "the cluster said so"},))


NODE = {"metadata": {"name": "node-1"}, "status": {"conditions": [
    {"type": "Ready", "status": "True", "lastTransitionTime": STAMP}]}}


def silent_node(for_seconds: float) -> dict[str, Any]:
    since = (T0 - datetime.timedelta(seconds=for_seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"metadata": {"name": "node-1"}, "status": {"conditions": [
        {"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown",
         "lastTransitionTime": since}]}}


def attempt_row(status: str = RunStatus.RUNNING, attempt: int = 1, *, reason: str | None = None,
                tools: list[str] | None = None, pod_uid: str | None = "pod-1",
                outcome: tuple[str, str | None] | None = None,
                session: str = f"{UID}-1") -> store.Attempt:
    """The store's row of attempt `attempt`; `outcome`: what the runner recorded."""
    said = None if outcome is None else store.Outcome(outcome[0], outcome[1], "said", T0)
    return store.Attempt(
        run_uid=UID, attempt=attempt, pod_name=f"triage-42-{attempt}", pod_uid=pod_uid,
        resumes_attempt=None, resumes_run_uid=None, app_name="support/support-agent",
        user_id="default", session_id=session, invocation_id="inv-1", status=status,
        reason=reason, message=None if reason is None else f"{reason} happened",
        tools_executed=tools, outcome=said, started_at=T0, runner_started_at=T0,
        finished_at=None)


def run_row(status: str = RunStatus.RUNNING, attempts: int = 1, *,
            reason: str | None = None, digest: str | None = "hmac-sha256:abc",
            tools: list[str] | None = None) -> store.Run:
    return store.Run(
        uid=UID, namespace="support", name="triage-42", agent="support-agent",
        trigger="manual", user_id="default", input_digest=digest, replay_of=None,
        status=status, reason=reason, message=None if reason is None else f"{reason} said",
        attempts=attempts, tools_executed=tools, created_at=T0, started_at=T0,
        finished_at=None)


def call(seq: int = 2, attempt: int = 1, *, decision: str | None = None,
         expires: float = 3600) -> store.Approval:
    return store.Approval(
        run_uid=UID, call_id=f"call-{seq}", attempt=attempt, seq=seq, tool="charge_card",
        args='{"customer": 42, "amount": 10}', args_digest="sha256:args",
        requested_at=at(-60), expires_at=at(expires), decision=decision,
        approver=None if decision is None else "alice", note=None,
        decided_at=None if decision is None else T0, approval_name=None)


LEDGER = (LedgerEntry(attempt=1, seq=1, tool="send_email", call_id="c1", args_digest="d",
                      started_at=at(-30), finished_at=at(-29), outcome="ok",
                      effect=effects.IDEMPOTENT, idempotency_key="k1"),)


_DEFAULT_RUN = run_row()


def state(attempt: store.Attempt | None = None, run: store.Run | None = _DEFAULT_RUN, *,
          approvals: tuple[store.Approval, ...] = (), previous: store.Attempt | None = None,
          published: bool = True, usage: store.Usage | None = None) -> store.RunState:
    return store.RunState(
        run=run, attempt=attempt, previous=previous,
        approvals=approvals, ledger=LEDGER if published else None,
        result=store.Result(1, "Refund done.", None, "sha256:answer", T0) if published
        else None,
        usage=usage if usage is not None else (store.Usage(2, 1, 100, 10, None)
                                               if published else None))


def ended(status: str, reason: str, tools: list[str] | None, attempt: int = 1,
          **fields: Any) -> store.Attempt:
    """An attempt the store settled (first writer's account)."""
    return attempt_row(status, attempt, reason=reason, tools=tools, **fields)


def facts(run: dict[str, Any], **fields: Any) -> RunFacts:
    return RunFacts(run=run, **fields)


# -- what a step is, in a row ---------------------------------------------------------------


def summary(step: RunStep) -> tuple[Any, ...]:
    """The parts of a step a row states."""
    match step:
        case Nothing():
            return ("Nothing", step.again, step.backoff)
        case AddFinalizer():
            return ("AddFinalizer",)
        case Release():
            return ("Release", step.stop_pod)
        case Settle():
            return ("Settle", step.outcome.phase, step.outcome.reason, step.record)
        case Count():
            return ("Count",)
        case Deny():
            return ("Deny", step.approver)
        case CancelWait():
            return ("CancelWait",)
        case Launch():
            return ("Launch", step.recorded)
        case Start():
            return ("Start", step.attempt, step.session)
        case Live():
            return ("Live", step.phase, step.reason, step.fields.get("attempts"))
        case Wait():
            return ("Wait", step.call.seq)
        case Finish():
            return ("Finish", step.phase, step.reason,
                    None if step.tools is None else list(step.tools),
                    None if step.refused is None else step.refused.reason, step.stop_pod)
        case Tools():
            return ("Tools", list(step.tools))
        case InQueue():
            return ("InQueue", step.admitted)
        case Usage():
            return ("Usage",)
        case DeletePods():
            return ("DeletePods", len(step.pods))
        case Expire():
            return ("Expire",)
    raise AssertionError(step)


@dataclass(frozen=True)
class Row:
    name: str  # the api.md line (or run.py rule) it ticks
    facts: RunFacts
    step: tuple[Any, ...]
    says: tuple[str, ...] = ()  # in the step's message (Settle, Live, Finish)
    config: OperatorConfig = CONFIG
    now: datetime.datetime = T0
    extra: dict[str, Any] = field(default_factory=dict)


RETRY2 = {"maxAttempts": 2}
RESUME3 = {"maxAttempts": 3, "resume": True}
LIVE = agent_run()
JOURNAL_DONE = Journal(True, (JournalCall(1, "send_email", effects.IDEMPOTENT, ANSWERED, at(-30),
                                          "k1"),))
JOURNAL_IN_DOUBT = Journal(True, (JournalCall(2, "charge_card", effects.EFFECTFUL, IN_DOUBT,
                                              at(-20)),))
UNSCHEDULABLE = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                 "message": "0/1 nodes are available: 1 Insufficient cpu"}

TABLE = [
    # -- Failure reasons (api.md "AgentRun": the reasons table), the pod's account -----
    Row("Evicted: DisruptionTarget EvictionByEvictionAPI",
        facts(LIVE, pod=disrupted("EvictionByEvictionAPI"), node=NODE,
              store=state(attempt_row(), published=False)),
        ("Settle", Phase.FAILED, Reason.EVICTED, False), says=("evicted",)),
    Row("Evicted: DisruptionTarget TerminationByKubelet",
        facts(LIVE, pod=disrupted("TerminationByKubelet"), node=NODE,
              store=state(attempt_row(), published=False)),
        ("Settle", Phase.FAILED, Reason.EVICTED, False)),
    Row("Evicted: the kubelet's node-pressure eviction",
        facts(LIVE, pod=pod("Failed", reason="Evicted"), node=NODE,
              store=state(attempt_row(), published=False)),
        ("Settle", Phase.FAILED, Reason.EVICTED, False)),
    Row("Preempted: DisruptionTarget PreemptionByScheduler",
        facts(LIVE, pod=disrupted("PreemptionByScheduler"), node=NODE,
              store=state(attempt_row(), published=False)),
        ("Settle", Phase.FAILED, Reason.PREEMPTED, False), says=("preempted",)),
    Row("NodeLost: the node Ready Unknown past the grace",
        facts(LIVE, pod=pod(), node=silent_node(120),
              store=state(attempt_row(), published=False)),
        ("Settle", Phase.FAILED, Reason.NODE_LOST, False), says=("stopped reporting",)),
    Row("NodeLost: DisruptionTarget DeletionByTaintManager",
        facts(LIVE, pod=disrupted("DeletionByTaintManager"), node=NODE,
              store=state(attempt_row(), published=False)),
        ("Settle", Phase.FAILED, Reason.NODE_LOST, False)),
    Row("NodeLost: DisruptionTarget DeletionByPodGC",
        facts(LIVE, pod=disrupted("DeletionByPodGC"), node=NODE,
              store=state(attempt_row(), published=False)),
        ("Settle", Phase.FAILED, Reason.NODE_LOST, False)),
    Row("PodDeleted: the runner pod deleted while the run was running",
        facts(LIVE, pod=pod(deleting=True), node=NODE,
              store=state(attempt_row(), published=False)),
        ("Settle", Phase.FAILED, Reason.POD_DELETED, False)),
    Row("PodDeleted: gone, its last state seen deleting",
        facts(LIVE, gone=pod(deleting=True), store=state(attempt_row(), published=False)),
        ("Settle", Phase.FAILED, Reason.POD_DELETED, False),
        says=("deleted while the run was running",)),
    Row("PodLost: gone, never seen gone, no outcome recorded",
        facts(LIVE, store=state(attempt_row(), published=False)),
        ("Settle", Phase.FAILED, Reason.POD_LOST, False),
        says=("no longer exists and no outcome was recorded",)),
    Row("PodLost, but the runner recorded its end: the runner's account",
        facts(LIVE, store=state(attempt_row(outcome=(RunStatus.SUCCEEDED, None)),
                                published=False)),
        ("Settle", Phase.SUCCEEDED, Reason.SUCCEEDED, False)),
    Row("OOMKilled: the runner container was OOM-killed",
        facts(LIVE, pod=pod("Failed", terminated={"reason": "OOMKilled", "exitCode": 137}),
              node=NODE, store=state(attempt_row(), published=False)),
        ("Settle", Phase.FAILED, Reason.OOM_KILLED, False), says=("raise spec.resources",)),
    Row("ImagePullFailed: the runner image cannot be pulled",
        facts(agent_run(Phase.PENDING, Reason.POD_CREATED),
              pod=pod("Pending", waiting="ErrImagePull"), node=NODE,
              store=state(attempt_row(), published=False)),
        ("Settle", Phase.FAILED, Reason.IMAGE_PULL_FAILED, False)),
    Row("ImagePullFailed, settled: the end (nothing ran), its pod stopped, never retried",
        facts(agent_run(Phase.PENDING, Reason.POD_CREATED, retry={"maxAttempts": 3}),
              pod=pod("Pending", waiting="ErrImagePull"), node=NODE,
              store=state(ended(RunStatus.FAILED, Reason.IMAGE_PULL_FAILED, []))),
        ("Finish", Phase.FAILED, Reason.IMAGE_PULL_FAILED, [], None, True)),
    Row("InputUnavailable: never retried (the same spec meets the same refusal)",
        facts(agent_run(retry={"maxAttempts": 3}), store=state(
            ended(RunStatus.FAILED, Reason.INPUT_UNAVAILABLE, [], pod_uid=None))),
        ("Finish", Phase.FAILED, Reason.INPUT_UNAVAILABLE, [], None, False)),
    Row("DeadlineExceeded: activeDeadlineSeconds passed (the kubelet's account)",
        facts(LIVE, pod=pod("Failed", reason="DeadlineExceeded"), node=NODE,
              store=state(attempt_row(), published=False)),
        ("Settle", Phase.FAILED, Reason.DEADLINE_EXCEEDED, False)),
    Row("DeadlineExceeded, settled: the end, its pod stopped, not retried",
        facts(agent_run(retry={"maxAttempts": 3}), pod=pod("Failed", reason="DeadlineExceeded"),
              node=NODE, store=state(ended(RunStatus.FAILED, Reason.DEADLINE_EXCEEDED, []))),
        ("Finish", Phase.FAILED, Reason.DEADLINE_EXCEEDED, [], None, True)),
    Row("RateLimitedAfterToolCall: the runner's reason of a plain exit",
        facts(LIVE, pod=pod("Failed", terminated={"exitCode": 1}), node=NODE,
              store=state(attempt_row(outcome=(RunStatus.FAILED,
                                               Reason.RATE_LIMITED_AFTER_TOOL_CALL)),
                          published=False)),
        ("Settle", Phase.FAILED, Reason.RATE_LIMITED_AFTER_TOOL_CALL, False)),
    Row("RateLimitedAfterToolCall, settled with a tool called: not retried",
        facts(agent_run(retry={"maxAttempts": 3}), pod=pod("Failed", terminated={"exitCode": 1}),
              node=NODE, store=state(ended(RunStatus.FAILED,
                                           Reason.RATE_LIMITED_AFTER_TOOL_CALL,
                                           ["send_email"]))),
        ("Finish", Phase.FAILED, Reason.RATE_LIMITED_AFTER_TOOL_CALL, ["send_email"], None,
         False)),
    Row("AgentError: the runner exited non-zero, nothing recorded",
        facts(LIVE, pod=pod("Failed", terminated={"exitCode": 3, "message": "boom"}),
              node=NODE, store=state(attempt_row(), published=False)),
        ("Settle", Phase.FAILED, Reason.AGENT_ERROR, False), says=("exit code 3: boom",)),
    Row("AgentError cannot be claimed over a disruption: the cluster's account stands",
        facts(LIVE, pod=disrupted("EvictionByEvictionAPI"), node=NODE,
              store=state(attempt_row(outcome=(RunStatus.FAILED, Reason.AGENT_ERROR)),
                          published=False)),
        ("Settle", Phase.FAILED, Reason.EVICTED, False)),
    Row("an answer recorded before the eviction stands: Succeeded",
        facts(LIVE, pod=disrupted("EvictionByEvictionAPI"), node=NODE,
              store=state(attempt_row(outcome=(RunStatus.SUCCEEDED, None)), published=False)),
        ("Settle", Phase.SUCCEEDED, Reason.SUCCEEDED, False)),
    Row("a reason no runner may give is an agent error",
        facts(LIVE, pod=pod("Failed", terminated={"exitCode": 1}), node=NODE,
              store=state(attempt_row(outcome=(RunStatus.FAILED, Reason.IMAGE_PULL_FAILED)),
                          published=False)),
        ("Settle", Phase.FAILED, Reason.AGENT_ERROR, False)),
    Row("the store cannot be read: the cluster's account stands, settled anyway",
        facts(LIVE, pod=disrupted("EvictionByEvictionAPI"), node=NODE, store=UNKNOWN),
        ("Settle", Phase.FAILED, Reason.EVICTED, False)),
    Row("Succeeded: the runner exited 0",
        facts(LIVE, pod=pod("Succeeded", terminated={"exitCode": 0}), node=NODE,
              store=state(attempt_row(), published=False)),
        ("Settle", Phase.SUCCEEDED, Reason.SUCCEEDED, False)),
    Row("Stale: running past the stale limit with no completion",
        facts(LIVE, pod=pod(), node=NODE, store=state(attempt_row(), published=False)),
        ("Settle", Phase.FAILED, Reason.STALE, False), now=at(7 * 3600),
        says=("no completion was recorded within 6h; its actual outcome is unknown",)),
    Row("Stale: never got a pod within the stale limit",
        facts(agent_run(Phase.PENDING, Reason.RETRYING, 2, retry=RETRY2),
              store=state(None, published=False)),
        ("Settle", Phase.FAILED, Reason.STALE, False), now=at(7 * 3600)),
    Row("Stale, settled: the end, its pod stopped",
        facts(LIVE, pod=pod(), node=NODE,
              store=state(ended(RunStatus.FAILED, Reason.STALE, []))),
        ("Finish", Phase.FAILED, Reason.STALE, [], None, True), now=at(7 * 3600)),

    # -- retry.maxAttempts: a new attempt ONLY when the failed one called no tool ----------
    Row("retry: Failed, toolsExecuted [], attempts left -> attempt 2, Retrying",
        facts(agent_run(retry=RETRY2), store=state(ended(RunStatus.FAILED, Reason.EVICTED, []))),
        ("Live", Phase.PENDING, Reason.RETRYING, 2),
        says=("Attempt 1 failed (Evicted) before calling any tool; starting attempt 2.",)),
    Row("retry: maxAttempts 1 (the default) -> the end",
        facts(LIVE, store=state(ended(RunStatus.FAILED, Reason.EVICTED, []))),
        ("Finish", Phase.FAILED, Reason.EVICTED, [], None, False)),
    Row("retry: a tool was called -> the end, never a second attempt",
        facts(agent_run(retry={"maxAttempts": 5}),
              store=state(ended(RunStatus.FAILED, Reason.EVICTED, ["send_email"]))),
        ("Finish", Phase.FAILED, Reason.EVICTED, ["send_email"], None, False)),
    Row("retry: tools unknown (null) is never none -> the end",
        facts(agent_run(retry={"maxAttempts": 5}),
              store=state(ended(RunStatus.FAILED, Reason.EVICTED, None))),
        ("Finish", Phase.FAILED, Reason.EVICTED, None, None, False)),
    Row("retry: attempts spent -> the end",
        facts(agent_run(Phase.RUNNING, Reason.STARTED, 2, retry=RETRY2),
              store=state(ended(RunStatus.FAILED, Reason.EVICTED, [], 2))),
        ("Finish", Phase.FAILED, Reason.EVICTED, [], None, False)),
    Row("retry: an attempt after an approval's decision does not count",
        facts(agent_run(Phase.RUNNING, Reason.STARTED, 2, retry=RETRY2),
              store=state(ended(RunStatus.FAILED, Reason.EVICTED, [], 2),
                          approvals=(call(attempt=1, decision=ApprovalDecision.APPROVE),))),
        ("Live", Phase.PENDING, Reason.RETRYING, 3)),
    Row("Preempted: Kueue evicted the pod's Workload (TerminationTarget, deleting)",
        facts(LIVE, pod=kueue_stopped("WorkloadEvictedDueToPreempted"), node=NODE,
              store=state(attempt_row(), published=False)),
        ("Settle", Phase.FAILED, Reason.PREEMPTED, False),
        says=("by Kueue, which evicted its Workload: WorkloadEvictedDueToPreempted",)),
    Row("PodDeleted: Kueue stopped the pod for another reason",
        facts(LIVE, pod=kueue_stopped("WorkloadDeleted"), node=NODE,
              store=state(attempt_row(), published=False)),
        ("Settle", Phase.FAILED, Reason.POD_DELETED, False), says=("by Kueue: WorkloadDeleted",)),
    Row("preemption: toolsExecuted [] -> a new attempt whatever maxAttempts says, not counted",
        facts(LIVE, store=state(ended(RunStatus.FAILED, Reason.PREEMPTED, []))),
        ("Live", Phase.PENDING, Reason.RETRYING, 2),
        says=("Attempt 1 failed (Preempted) before calling any tool; starting attempt 2.",
              "Preempted happened",
              "A preemption does not count against retry.maxAttempts.")),
    Row("preemption: a tool called, spec.retry.resume -> Resuming, not counted",
        facts(agent_run(retry={"resume": True}), journal=JOURNAL_DONE,
              store=state(ended(RunStatus.FAILED, Reason.PREEMPTED, ["send_email"]))),
        ("Live", Phase.PENDING, Reason.RESUMING, 2),
        says=("attempt 2 resumes it.", "does not count against retry.maxAttempts")),
    Row("preemption: a tool called, no resume -> Failed, Preempted, published whole",
        facts(agent_run(retry={"maxAttempts": 5}),
              store=state(ended(RunStatus.FAILED, Reason.PREEMPTED, ["send_email"]))),
        ("Finish", Phase.FAILED, Reason.PREEMPTED, ["send_email"], None, False)),
    Row("retry: an earlier preempted attempt does not count",
        facts(agent_run(Phase.RUNNING, Reason.STARTED, 2, retry=RETRY2,
                        status={"preemptedAttempts": [1]}),
              store=state(ended(RunStatus.FAILED, Reason.EVICTED, [], 2))),
        ("Live", Phase.PENDING, Reason.RETRYING, 3)),
    Row("retry: a success is never retried",
        facts(agent_run(retry={"maxAttempts": 5}),
              store=state(ended(RunStatus.SUCCEEDED, Reason.SUCCEEDED, []))),
        ("Finish", Phase.SUCCEEDED, Reason.SUCCEEDED, [], None, False)),

    # -- Automatic resume: spec.retry.resume ----------------------------------------------
    Row("resume: a failed attempt that called a tool, the journal allows it -> Resuming",
        facts(agent_run(retry=RESUME3), journal=JOURNAL_DONE,
              store=state(ended(RunStatus.FAILED, Reason.EVICTED, ["send_email"]))),
        ("Live", Phase.PENDING, Reason.RESUMING, 2),
        says=("Attempt 1 failed (Evicted); attempt 2 resumes it.", "not repeated: send_email")),
    Row("resume: an Effectful call in doubt -> Failed, Resumable False ToolCallInDoubt",
        facts(agent_run(retry=RESUME3), journal=JOURNAL_IN_DOUBT,
              store=state(ended(RunStatus.FAILED, Reason.EVICTED, ["charge_card"]))),
        ("Finish", Phase.FAILED, Reason.EVICTED, ["charge_card"], "ToolCallInDoubt", False)),
    Row("resume: the journal gone -> Failed, Resumable False JournalUnavailable",
        facts(agent_run(retry=RESUME3), journal=Journal(False),
              store=state(ended(RunStatus.FAILED, Reason.EVICTED, ["send_email"]))),
        ("Finish", Phase.FAILED, Reason.EVICTED, ["send_email"], "JournalUnavailable",
         False)),
    Row("resume: InputUnavailable is not resumed",
        facts(agent_run(retry=RESUME3), journal=JOURNAL_DONE,
              store=state(ended(RunStatus.FAILED, Reason.INPUT_UNAVAILABLE, ["send_email"]))),
        ("Finish", Phase.FAILED, Reason.INPUT_UNAVAILABLE, ["send_email"], None, False)),
    Row("resume: toolsExecuted [] -> a plain retry starts over",
        facts(agent_run(retry=RESUME3), journal=JOURNAL_DONE,
              store=state(ended(RunStatus.FAILED, Reason.EVICTED, []))),
        ("Live", Phase.PENDING, Reason.RETRYING, 2)),
    Row("resume: no attempt left -> the end",
        facts(agent_run(Phase.RUNNING, Reason.STARTED, 3, retry=RESUME3),
              journal=JOURNAL_DONE,
              store=state(ended(RunStatus.FAILED, Reason.EVICTED, ["send_email"], 3))),
        ("Finish", Phase.FAILED, Reason.EVICTED, ["send_email"], None, False)),
    Row("resume: a resumed attempt starts on the session of the one before",
        facts(agent_run(Phase.PENDING, Reason.RESUMING, 2, retry=RESUME3,
                        status={"resumedAttempts": [2]}),
              store=state(None, previous=ended(RunStatus.FAILED, Reason.EVICTED,
                                                ["send_email"]), published=False)),
        ("Start", 2, f"{UID}-1")),

    # -- Approval: a human decides before an effect ---------------------------------------
    Row("approval: the attempt ended AwaitingApproval, the call written down -> Waiting",
        facts(LIVE, store=state(ended(RunStatus.FAILED, Reason.AWAITING_APPROVAL, []),
                                approvals=(call(),))),
        ("Wait", 2)),
    Row("approval: AwaitingApproval and no call written down -> an agent error",
        facts(LIVE, store=state(ended(RunStatus.FAILED, Reason.AWAITING_APPROVAL, []))),
        ("Finish", Phase.FAILED, Reason.AGENT_ERROR, [], None, False),
        says=("none was written down",)),
    Row("approval: Waiting, undecided -> nothing until it expires",
        facts(agent_run(Phase.WAITING, Reason.AWAITING_APPROVAL,
                        status={"pendingApproval": {"seq": 2}}),
              store=state(None, approvals=(call(expires=90),), published=False)),
        ("Nothing", 90.0, False)),
    Row("approval: Waiting, expired -> denied by the timeout",
        facts(agent_run(Phase.WAITING, Reason.AWAITING_APPROVAL,
                        status={"pendingApproval": {"seq": 2}}),
              store=state(None, approvals=(call(expires=-1),), published=False)),
        ("Deny", ApprovalDecision.TIMEOUT_APPROVER)),
    Row("approval: Approved -> attempt 2 resumes and makes the call",
        facts(agent_run(Phase.WAITING, Reason.AWAITING_APPROVAL,
                        status={"pendingApproval": {"seq": 2}}),
              store=state(None, approvals=(call(decision=ApprovalDecision.APPROVE),),
                          published=False)),
        ("Live", Phase.PENDING, Reason.RESUMING, 2),
        says=("charge_card (call 2) was approved by alice; attempt 2 resumes the run and "
              "makes the call.",)),
    Row("approval: Denied -> attempt 2 resumes, the model is told",
        facts(agent_run(Phase.WAITING, Reason.AWAITING_APPROVAL,
                        status={"pendingApproval": {"seq": 2}}),
              store=state(None, approvals=(call(decision=ApprovalDecision.DENY),),
                          published=False)),
        ("Live", Phase.PENDING, Reason.RESUMING, 2), says=("the model is told it was denied",)),
    Row("approval: Waiting, the call gone from the store -> an agent error",
        facts(agent_run(Phase.WAITING, Reason.AWAITING_APPROVAL,
                        status={"pendingApproval": {"seq": 2}, "toolsExecuted": []}),
              store=state(None, published=False)),
        ("Finish", Phase.FAILED, Reason.AGENT_ERROR, [], None, False),
        says=("not in the run store",)),
    Row("approval: Waiting, the store cannot be read -> backoff",
        facts(agent_run(Phase.WAITING, Reason.AWAITING_APPROVAL), store=UNKNOWN),
        ("Nothing", None, True)),

    # -- Cancel in place: agentrun.dev/cancel --------------------------------------------
    Row("cancel: a live run -> settled CancelRequested (the fence), with the note",
        facts(agent_run(annotations={ANNOTATION_CANCEL: "true",
                                     ANNOTATION_CANCEL_NOTE: "wrong customer"}),
              pod=pod(), node=NODE, store=state(attempt_row(), published=False)),
        ("Settle", Phase.CANCELLED, Reason.CANCEL_REQUESTED, False),
        says=("Cancelled on request (agentrun.dev/cancel): wrong customer. Its runner pod "
              "was stopped.",)),
    Row("cancel: the runner had recorded its answer -> it stands (Succeeded)",
        facts(agent_run(annotations={ANNOTATION_CANCEL: "true"}), pod=pod(), node=NODE,
              store=state(attempt_row(outcome=(RunStatus.SUCCEEDED, None)), published=False)),
        ("Settle", Phase.SUCCEEDED, Reason.SUCCEEDED, False)),
    Row("cancel: not launched yet -> written down and settled, nothing ran",
        facts(agent_run("", annotations={ANNOTATION_CANCEL: "true"}),
              store=state(None, run=None, published=False)),
        ("Settle", Phase.CANCELLED, Reason.CANCEL_REQUESTED, True),
        says=("It had not started: nothing ran.",)),
    Row("cancel, settled: Cancelled, its pod stopped, toolsExecuted counted",
        facts(agent_run(annotations={ANNOTATION_CANCEL: "true"}), pod=pod(), node=NODE,
              store=state(ended(RunStatus.CANCELLED, Reason.CANCEL_REQUESTED,
                                ["send_email"]))),
        ("Finish", Phase.CANCELLED, Reason.CANCEL_REQUESTED, ["send_email"], None, True)),
    Row("cancel: a waiting run -> its call denied, its run closed",
        facts(agent_run(Phase.WAITING, Reason.AWAITING_APPROVAL,
                        annotations={ANNOTATION_CANCEL: "true"}),
              store=state(ended(RunStatus.FAILED, Reason.AWAITING_APPROVAL, []),
                          run=run_row(RunStatus.FAILED, reason=Reason.AWAITING_APPROVAL),
                          approvals=(call(),))),
        ("CancelWait",)),
    Row("cancel: a waiting run, closed -> Cancelled, ApprovalPending False",
        facts(agent_run(Phase.WAITING, Reason.AWAITING_APPROVAL,
                        annotations={ANNOTATION_CANCEL: "true"}),
              store=state(ended(RunStatus.FAILED, Reason.AWAITING_APPROVAL, []),
                          run=run_row(RunStatus.CANCELLED, reason=Reason.CANCEL_REQUESTED),
                          approvals=(call(decision=ApprovalDecision.DENY),))),
        ("Finish", Phase.CANCELLED, Reason.CANCEL_REQUESTED, [], None, False),
        says=("the call never ran",)),
    Row("cancel: a settled run is not cancelled again",
        facts(agent_run(Phase.SUCCEEDED, Reason.SUCCEEDED, status={"toolsExecuted": []},
                        annotations={ANNOTATION_CANCEL: "true"})),
        ("Nothing", None, False)),

    # -- Cancelled: deleting a run (the finalizer stays until the store holds the tools) ----
    Row("a run without the finalizer gets it", facts(agent_run("", finalizer=False)),
        ("AddFinalizer",)),
    Row("deleted, live: settled Cancelled (the fence)",
        facts(agent_run(deleting=True), pod=pod(), node=NODE,
              store=state(attempt_row(), published=False)),
        ("Settle", Phase.CANCELLED, Reason.CANCELLED, False),
        says=("deleted while it was live",)),
    Row("deleted, settled in the store with its tools: released, its pod stopped",
        facts(agent_run(deleting=True), pod=pod(), node=NODE,
              store=state(ended(RunStatus.CANCELLED, Reason.CANCELLED, ["send_email"]))),
        ("Release", True)),
    Row("deleted, the store cannot be read: the finalizer stays",
        facts(agent_run(deleting=True), pod=pod(), node=NODE, store=UNKNOWN),
        ("Nothing", 5.0, False)),
    Row("deleted after it settled, tools known: released",
        facts(agent_run(Phase.FAILED, Reason.EVICTED, deleting=True,
                        status={"toolsExecuted": []})),
        ("Release", False)),
    Row("deleted after it settled, tools unknown: counted first",
        facts(agent_run(Phase.FAILED, Reason.EVICTED, deleting=True,
                        status={"toolsExecuted": None}),
              store=state(ended(RunStatus.FAILED, Reason.EVICTED, None), published=False)),
        ("Count",)),
    Row("deleted before it was launched, unknown to the store: released",
        facts(agent_run("", deleting=True), store=state(None, run=None, published=False)),
        ("Release", False)),
    Row("deleted before it was launched, recorded: settled Cancelled, nothing ran",
        facts(agent_run("", deleting=True),
              store=state(None, run=run_row(RunStatus.PENDING, 0), published=False)),
        ("Settle", Phase.CANCELLED, Reason.CANCELLED, False),
        says=("Deleted before it started.",)),
    Row("deleted without our finalizer: nothing", facts(agent_run(deleting=True,
                                                                  finalizer=False)),
        ("Nothing", None, False)),

    # -- the launch (api.md: written down, with its input, before anything runs) ------------
    Row("not launched: pin, snapshot, write down, start attempt 1",
        facts(agent_run(""), store=state(None, run=None, published=False)),
        ("Launch", False)),
    Row("not launched, the store recorded it (the status write was lost): start attempt 1",
        facts(agent_run(""), store=state(None, run=run_row(RunStatus.PENDING, 0),
                                         published=False)),
        ("Launch", True)),
    Row("not launched, the store cannot be read: backoff",
        facts(agent_run(""), store=UNKNOWN), ("Nothing", None, True)),
    Row("spec.model scripted on an operator that refuses it: ModelNotAllowed",
        facts(agent_run("", model="scripted"), store=state(None, run=None, published=False)),
        ("Settle", Phase.FAILED, Reason.MODEL_NOT_ALLOWED, True),
        config=OperatorConfig(allow_scripted_model=False), says=("--allow-scripted-model",)),
    Row("a launch refused before (status lost): its end is shown",
        facts(agent_run(""), store=state(None, run=run_row(
            RunStatus.FAILED, 1, reason=Reason.SESSION_BUSY, tools=[]))),
        ("Finish", Phase.FAILED, Reason.SESSION_BUSY, [], None, False)),
    Row("an automatic session id of another run: SessionNotOwned",
        facts(agent_run(Phase.PENDING, Reason.RETRYING, 2, retry=RETRY2,
                        sessionId="0b0e7f4c-2222-4a4a-8888-000000000002-1"),
              store=state(None, published=False)),
        ("Settle", Phase.FAILED, Reason.SESSION_NOT_OWNED, False),
        says=("reserved for their run",)),

    # -- following attempt n -------------------------------------------------------------
    Row("no pod, never created: start attempt 2",
        facts(agent_run(Phase.PENDING, Reason.RETRYING, 2, retry=RETRY2),
              store=state(None, published=False)),
        ("Start", 2, f"{UID}-2")),
    Row("no pod, created a moment ago: wait for the informer",
        facts(agent_run(Phase.PENDING, Reason.POD_CREATED), created_ago=5.0),
        ("Nothing", 25.0, False)),
    Row("no pod in the cache, the API server has it: look again in a moment",
        facts(agent_run(Phase.PENDING, Reason.POD_CREATED), pod_elsewhere=True,
              store=state(attempt_row(RunStatus.PENDING), published=False)),
        ("Nothing", 0.5, False)),
    Row("a pod of the attempt's name that is not the run's: Pending, PodCreateFailed",
        facts(agent_run(Phase.PENDING, Reason.POD_CREATED), pod=pod(ours=False), node=NODE),
        ("Live", Phase.PENDING, Reason.POD_CREATE_FAILED, None),
        says=("is not this run's runner",)),
    Row("a pod of an earlier run of the name, going away: waited for",
        facts(agent_run(Phase.PENDING, Reason.POD_CREATED),
              pod=pod(ours=False, deleting=True), node=NODE),
        ("Nothing", 2.0, False)),
    Row("the pod runs: Running, Started",
        facts(agent_run(Phase.PENDING, Reason.POD_CREATED), pod=pod(), node=NODE),
        ("Live", Phase.RUNNING, Reason.STARTED, None), says=("triage-42-1 is running",)),
    Row("the pod waits, unschedulable: Pending, saying why",
        facts(agent_run(Phase.PENDING, Reason.POD_CREATED),
              pod=pod("Pending", conditions=(UNSCHEDULABLE,)), node=None),
        ("Live", Phase.PENDING, Reason.POD_UNSCHEDULABLE, None),
        says=("cannot be scheduled: 0/1 nodes are available",)),
    Row("Kueue holds the pod (its gate), quota not reserved: Pending, Queued",
        facts(agent_run(Phase.PENDING, Reason.POD_CREATED), pod=queued_pod(),
              workload=workload(False)),
        ("InQueue", False)),
    Row("Kueue holds the pod, no Workload yet: Pending, Queued",
        facts(agent_run(Phase.PENDING, Reason.POD_CREATED), pod=queued_pod()),
        ("InQueue", False)),
    Row("queued and shown: nothing, and never Stale while Kueue holds it",
        shown(facts(agent_run(Phase.PENDING, Reason.POD_CREATED), pod=queued_pod(),
                    workload=workload(False))),
        ("Nothing", 6 * 3600.0, False), now=at(7 * 3600)),
    Row("Kueue admitted the pod: Admitted True",
        facts(agent_run(Phase.PENDING, Reason.QUEUED), pod=queued_pod(gated=False),
              workload=workload(True)),
        ("InQueue", True)),
    Row("admitted long after the start: the stale limit counts from the admission",
        shown(facts(agent_run(Phase.RUNNING, Reason.STARTED), pod=queued_pod(
            gated=False, phase="Running"), node=NODE, workload=workload(True)), at(3600)),
        ("Nothing", 3600.0, False), now=at(6 * 3600)),
    Row("the pod runs, its usage changed, last shown 10 s ago: the usage",
        facts(LIVE, pod=pod(), node=NODE, usage_written_ago=10.0,
              store=state(attempt_row(), published=False, usage=store.Usage(3, 1, 10, 1))),
        ("Usage",)),
    Row("the pod runs, its usage changed, last shown 1 s ago: held back",
        facts(LIVE, pod=pod(), node=NODE, usage_written_ago=1.0,
              store=state(attempt_row(), published=False, usage=store.Usage(3, 1, 10, 1))),
        ("Nothing", 4.0, False)),
    Row("the pod's node is not Ready, within the grace: looked at every second",
        facts(LIVE, pod=pod(), node=silent_node(3)), ("Nothing", 1.0, False),
        config=replace(CONFIG, node_lost_grace=datetime.timedelta(seconds=40))),
    Row("the pod runs: nothing until the stale deadline",
        facts(LIVE, pod=pod(), node=NODE), ("Nothing", 6 * 3600 - 60.0, False)),
    Row("the store settled attempt n and the status did not say it: shown",
        facts(LIVE, store=state(ended(RunStatus.FAILED, Reason.OOM_KILLED, []))),
        ("Finish", Phase.FAILED, Reason.OOM_KILLED, [], None, False)),

    # -- a settled run: its tools, its pods and its own time to live -----------------------
    Row("settled, toolsExecuted null, the store has them now: shown",
        facts(agent_run(Phase.FAILED, Reason.EVICTED, status={"toolsExecuted": None}),
              store=state(ended(RunStatus.FAILED, Reason.EVICTED, ["send_email"]))),
        ("Tools", ["send_email"])),
    Row("settled, toolsExecuted null, never counted: count them",
        facts(agent_run(Phase.FAILED, Reason.EVICTED, status={"toolsExecuted": None}),
              store=state(attempt_row())),
        ("Count",)),
    Row("settled, toolsExecuted null, the store cannot be read: again in 5 s",
        facts(agent_run(Phase.FAILED, Reason.EVICTED, status={"toolsExecuted": None}),
              store=UNKNOWN),
        ("Nothing", 5.0, False)),
    Row("settled, its pods past their time to live (1h): deleted",
        facts(agent_run(Phase.SUCCEEDED, Reason.SUCCEEDED,
                        status={"toolsExecuted": [], "finishedAt": STAMP}),
              pods=(pod("Succeeded"),)),
        ("DeletePods", 1), now=at(3600)),
    Row("settled, its pods within their time to live: nothing until then",
        facts(agent_run(Phase.SUCCEEDED, Reason.SUCCEEDED,
                        status={"toolsExecuted": [], "finishedAt": STAMP}),
              pods=(pod("Succeeded"),)),
        ("Nothing", 3540.0, False)),
    Row("ttlSecondsAfterFinished passed: its replays, approvals, then the run",
        facts(agent_run(Phase.SUCCEEDED, Reason.SUCCEEDED, ttlSecondsAfterFinished=30,
                        status={"toolsExecuted": [], "finishedAt": STAMP})),
        ("Expire",)),
    Row("ttlSecondsAfterFinished passed, a replay of it undecided: waits for it",
        facts(agent_run(Phase.FAILED, Reason.EVICTED, ttlSecondsAfterFinished=30,
                        status={"toolsExecuted": [], "finishedAt": STAMP}),
              replays=({"metadata": {"name": "again"}, "spec": {"runName": "triage-42"},
                        "status": {}},)),
        ("Nothing", 1.0, False)),
    Row("runs.ttlSecondsAfterFinished, the installation's default: applies",
        facts(agent_run(Phase.FAILED, Reason.EVICTED,
                        status={"toolsExecuted": [], "finishedAt": STAMP})),
        ("Expire",), config=replace(CONFIG, run_ttl_after_finished=datetime.timedelta(
            seconds=30))),
    Row("a trigger's run past its time to live, within the dedupe window: kept until then",
        facts(triggered(agent_run(Phase.SUCCEEDED, Reason.SUCCEEDED, ttlSecondsAfterFinished=30,
                                  status={"toolsExecuted": [], "finishedAt": STAMP})),
              triggers=ORDERS),
        ("Nothing", 540.0, False)),
    Row("a trigger's run past its time to live and its dedupe window: expired",
        facts(triggered(agent_run(Phase.SUCCEEDED, Reason.SUCCEEDED, ttlSecondsAfterFinished=30,
                                  status={"toolsExecuted": [], "finishedAt": STAMP})),
              triggers=ORDERS),
        ("Expire",), now=at(600)),
    Row("a run that only carries a trigger's label is not kept for it",
        facts(triggered(agent_run(Phase.SUCCEEDED, Reason.SUCCEEDED, ttlSecondsAfterFinished=30,
                                  status={"toolsExecuted": [], "finishedAt": STAMP}),
                        owned=False), triggers=ORDERS),
        ("Expire",)),
    Row("settled, nothing left: nothing",
        facts(agent_run(Phase.SUCCEEDED, Reason.SUCCEEDED,
                        status={"toolsExecuted": [], "finishedAt": STAMP})),
        ("Nothing", None, False)),
]


def _message(step: RunStep) -> str:
    match step:
        case Settle():
            return step.outcome.message
        case Live() | Finish():
            return step.message
    return ""


@pytest.mark.parametrize("row", TABLE, ids=[r.name for r in TABLE])
def test_decide_run(row: Row) -> None:
    step = decide_run(row.facts, row.now, row.config)
    assert summary(step) == row.step, step
    for fragment in row.says:
        assert fragment in _message(step), _message(step)


def test_the_table_names_each_row_once() -> None:
    names = [r.name for r in TABLE]
    assert len(names) == len(set(names))


# -- should_retry, on its own ------------------------------------------------------------------

NOT_RETRIED = (Reason.DEADLINE_EXCEEDED, Reason.INPUT_UNAVAILABLE, Reason.STALE,
               Reason.IMAGE_PULL_FAILED, Reason.MODEL_NOT_ALLOWED, Reason.POD_INVALID,
               Reason.SESSION_BUSY, Reason.SESSION_NOT_OWNED, Reason.AGENT_NOT_FOUND,
               Reason.AGENT_INVALID, Reason.APPROVAL_MISMATCH, Reason.POLICY_VIOLATION)


@pytest.mark.parametrize(("spent", "phase", "reason", "tools", "retried"), [
    (1, Phase.FAILED, Reason.EVICTED, [], True),
    (1, Phase.FAILED, Reason.AGENT_ERROR, [], True),
    (1, Phase.FAILED, Reason.PREEMPTED, [], True),
    (2, Phase.FAILED, Reason.EVICTED, [], True),
    (3, Phase.FAILED, Reason.EVICTED, [], False),  # maxAttempts 3 spent
    (1, Phase.FAILED, Reason.EVICTED, ["send_email"], False),
    (1, Phase.FAILED, Reason.EVICTED, None, False),  # unknown is never none
    (1, Phase.SUCCEEDED, Reason.SUCCEEDED, [], False),
    (1, Phase.CANCELLED, Reason.CANCEL_REQUESTED, [], False),
    *[(1, Phase.FAILED, reason, [], False) for reason in NOT_RETRIED],
])
def test_should_retry(spent: int, phase: str, reason: str, tools: list[str] | None,
                      retried: bool) -> None:
    assert should_retry({"retry": {"maxAttempts": 3}}, spent, phase, reason, tools) is retried


def test_should_retry_defaults_to_one_attempt() -> None:
    assert not should_retry({}, 1, Phase.FAILED, Reason.EVICTED, [])


# -- what a sync reads of the store ------------------------------------------------------------


@pytest.mark.parametrize(("name", "run_facts", "store_read"), [
    ("a pod that waits: the caches suffice",
     facts(agent_run(Phase.PENDING, Reason.POD_CREATED), pod=pod("Pending"), node=NODE), False),
    ("a pod that runs, its run Pending: the caches suffice",
     facts(agent_run(Phase.PENDING, Reason.POD_CREATED), pod=pod(), node=NODE), False),
    ("a pod that runs, its run Running: the usage", facts(LIVE, pod=pod(), node=NODE), True),
    ("a pod that runs, marked for eviction, not deleted yet: its end comes next",
     facts(LIVE, pod=pod(conditions=({"type": "DisruptionTarget", "status": "True",
                                      "reason": "EvictionByEvictionAPI"},)), node=NODE),
     False),
    ("a pod that ended: the store's account", facts(LIVE, pod=disrupted(
        "EvictionByEvictionAPI"), node=NODE), True),
    ("no pod, created a moment ago: the caches suffice",
     facts(LIVE, created_ago=1.0), False),
    ("no pod: the store says whether it was created", facts(LIVE), True),
    ("a settled run with its tools: the caches suffice",
     facts(agent_run(Phase.FAILED, Reason.EVICTED, status={"toolsExecuted": []})), False),
    ("a settled run, tools unknown: the store",
     facts(agent_run(Phase.FAILED, Reason.EVICTED, status={"toolsExecuted": None})), True),
    ("not launched: the store's record", facts(agent_run("")), True),
])
def test_a_store_read_only_where_the_decision_needs_it(name: str, run_facts: RunFacts,
                                                       store_read: bool) -> None:
    assert (reads(run_facts, T0, CONFIG) is not None) is store_read, name


# -- the status that shows it ------------------------------------------------------------------


def conditions(status: Mapping[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}


def test_a_settled_run_is_published_whole_in_one_write() -> None:
    """api.md "Outcome": phase, toolsExecuted, toolCalls, result and usage together."""
    f = facts(LIVE, store=state(ended(RunStatus.SUCCEEDED, Reason.SUCCEEDED, ["send_email"])))
    step = decide_run(f, T0, CONFIG)
    assert isinstance(step, Finish)
    status, events = run_status(f, step, T0)
    assert status["phase"] == Phase.SUCCEEDED
    assert status["toolsExecuted"] == ["send_email"]
    assert [c["tool"] for c in status["toolCalls"]] == ["send_email"]
    assert status["result"]["text"] == "Refund done."
    assert status["usage"]["modelCalls"] == 2
    assert status["finishedAt"] == "2026-07-10T12:00:00Z"
    assert conditions(status)[Condition.SUCCEEDED] == ("True", Reason.SUCCEEDED)
    assert conditions(status)[Condition.TOOLS_EXECUTED] == ("True", Condition.TOOL_CALLS_RECORDED)
    assert conditions(status)[Condition.READY] == ("True", Reason.SUCCEEDED)
    assert [(e.reason, e.warning) for e in events] == [(Reason.SUCCEEDED, False)]
    assert events[0].message.endswith("Tools executed: send_email.")


def test_an_end_the_store_could_not_be_told_publishes_no_part_of_the_ledger() -> None:
    """toolsExecuted null (unknown) and nothing beside it: the ledger, the answer and the
    usage come together with the tools, once the store answers (the Tools step)."""
    evicted = facts(LIVE, store=UNKNOWN, unsettled=decide_settle_outcome())
    step = decide_run(evicted, T0, CONFIG)
    assert summary(step) == ("Finish", Phase.FAILED, Reason.EVICTED, None, None, False)
    assert isinstance(step, Finish)
    status, events = run_status(evicted, step, T0)
    assert status["toolsExecuted"] is None
    assert not {"toolCalls", "result", "usage"} & set(status)
    assert conditions(status)[Condition.TOOLS_EXECUTED] == ("Unknown",
                                                           Condition.TOOL_STATE_UNKNOWN)
    assert "unknown (the run store could not be read)" in events[0].message


def decide_settle_outcome() -> Any:
    step = decide_run(facts(LIVE, pod=disrupted("EvictionByEvictionAPI"), node=NODE,
                            store=state(attempt_row(), published=False)), T0, CONFIG)
    assert isinstance(step, Settle)
    return step.outcome


def test_the_tools_known_at_last_come_with_the_ledger_answer_and_usage() -> None:
    f = facts(agent_run(Phase.FAILED, Reason.EVICTED, status={"toolsExecuted": None}),
              store=state(ended(RunStatus.FAILED, Reason.EVICTED, ["send_email"])))
    step = decide_run(f, T0, CONFIG)
    assert isinstance(step, Tools)
    status, events = run_status(f, step, T0)
    assert status["toolsExecuted"] == ["send_email"]
    assert {"toolCalls", "result", "usage"} <= set(status)
    assert [e.reason for e in events] == ["ToolsExecutedKnown"]


@pytest.mark.parametrize(("name", "run_facts", "ready", "reconciling", "stalled"), [
    ("Pending", facts(agent_run(Phase.PENDING, Reason.POD_CREATED), pod=pod(), node=NODE),
     "False", "True", None),
    ("Waiting", facts(LIVE, store=state(ended(RunStatus.FAILED, Reason.AWAITING_APPROVAL, []),
                                        approvals=(call(),))), "False", "False", None),
    ("Succeeded", facts(LIVE, store=state(ended(RunStatus.SUCCEEDED, Reason.SUCCEEDED, []))),
     "True", "False", None),
    ("Failed", facts(LIVE, store=state(ended(RunStatus.FAILED, Reason.EVICTED, []))),
     "False", "False", "True"),
])
def test_the_gitops_conditions_follow_the_phase(name: str, run_facts: RunFacts, ready: str,
                                                reconciling: str, stalled: str | None) -> None:
    """api.md "Conditions for GitOps tools": one row per phase."""
    step = decide_run(run_facts, T0, CONFIG)
    assert isinstance(step, Live | Wait | Finish), step
    status, _ = run_status(run_facts, step, T0)
    shown = conditions(status)
    assert shown[Condition.READY][0] == ready, name
    assert shown[Condition.RECONCILING][0] == reconciling, name
    assert (shown.get(Condition.STALLED) or (None,))[0] == stalled, name


def test_waiting_shows_the_call_and_says_how_to_decide() -> None:
    f = facts(LIVE, store=state(ended(RunStatus.FAILED, Reason.AWAITING_APPROVAL, []),
                                approvals=(call(),)))
    step = decide_run(f, T0, CONFIG)
    assert isinstance(step, Wait)
    status, events = run_status(f, step, T0)
    assert (status["phase"], status["reason"]) == (Phase.WAITING, Reason.AWAITING_APPROVAL)
    assert status["pendingApproval"]["seq"] == 2
    assert conditions(status)[Condition.APPROVAL_PENDING] == ("True", Reason.AWAITING_APPROVAL)
    assert "kubectl agentrun approve triage-42 [--deny]" in events[0].message


def test_a_refused_resume_says_why_on_the_run() -> None:
    f = facts(agent_run(retry=RESUME3), journal=JOURNAL_IN_DOUBT,
              store=state(ended(RunStatus.FAILED, Reason.EVICTED, ["charge_card"])))
    step = decide_run(f, T0, CONFIG)
    assert isinstance(step, Finish)
    status, events = run_status(f, step, T0)
    assert conditions(status)[Condition.RESUMABLE] == ("False", "ToolCallInDoubt")
    assert [(e.reason, e.warning) for e in events] == [("ToolCallInDoubt", True),
                                                       (Reason.EVICTED, True)]
    assert events[0].message.startswith("Not resumed: AgentRun triage-42 called charge_card")


def test_a_status_that_would_not_change_is_not_written() -> None:
    """One write per sync, only when something changed: the same waiting reason, shown
    again, builds the same status."""
    waiting = facts(agent_run(Phase.PENDING, Reason.POD_CREATED),
                    pod=pod("Pending", conditions=(UNSCHEDULABLE,)))
    step = decide_run(waiting, T0, CONFIG)
    assert isinstance(step, Live)
    shown, _ = run_status(waiting, step, T0)
    again = replace(waiting, run={**waiting.run, "status": shown})
    assert summary(decide_run(again, at(5), CONFIG))[0] == "Nothing"


def test_preempted_attempts_are_listed_on_the_run() -> None:
    """status.preemptedAttempts: the attempt that follows a preemption, and the end, list
    every preempted attempt (none counts against retry.maxAttempts)."""
    retried = facts(LIVE, store=state(ended(RunStatus.FAILED, Reason.PREEMPTED, [])))
    step = decide_run(retried, T0, CONFIG)
    assert isinstance(step, Live)
    status, events = run_status(retried, step, T0)
    assert (status["phase"], status["reason"], status["attempts"]) == (
        Phase.PENDING, Reason.RETRYING, 2)
    assert status["preemptedAttempts"] == [1]
    assert [(e.reason, e.warning) for e in events] == [(Reason.RETRYING, True)]
    again = facts(agent_run(Phase.RUNNING, Reason.STARTED, 2, status={
        "preemptedAttempts": [1]}), store=state(ended(RunStatus.FAILED, Reason.PREEMPTED,
                                                      ["send_email"], 2)))
    end = decide_run(again, T0, CONFIG)
    assert isinstance(end, Finish)
    status, _ = run_status(again, end, T0)
    assert (status["phase"], status["reason"]) == (Phase.FAILED, Reason.PREEMPTED)
    assert status["preemptedAttempts"] == [1, 2]
    assert status["toolsExecuted"] == ["send_email"]


def test_a_queued_run_says_why_in_kueues_words_then_admitted() -> None:
    """api.md "Queues": Pending, Queued and Admitted False with Kueue's message while the
    pod is gated (one Queued Event); Admitted True once admitted (an Admitted Event), the
    phase left to the pod's start."""
    waiting = facts(agent_run(Phase.PENDING, Reason.POD_CREATED), pod=queued_pod(),
                    workload=workload(False))
    step = decide_run(waiting, T0, CONFIG)
    assert isinstance(step, InQueue)
    status, events = run_status(waiting, step, T0)
    assert (status["phase"], status["reason"]) == (Phase.PENDING, Reason.QUEUED)
    assert "insufficient unused quota for cpu" in status["message"]
    assert conditions(status)[Condition.ADMITTED] == ("False", "Pending")
    assert [e.reason for e in events] == [Reason.QUEUED]
    admitted = replace(waiting, run={**waiting.run, "status": status},
                       pod=queued_pod(gated=False), workload=workload(True))
    step = decide_run(admitted, at(30), CONFIG)
    assert isinstance(step, InQueue)
    status, events = run_status(admitted, step, at(30))
    assert (status["phase"], status["reason"]) == (Phase.PENDING, Reason.QUEUED)
    assert conditions(status)[Condition.ADMITTED] == ("True", "Admitted")
    assert [(e.reason, e.message) for e in events] == [(Condition.ADMITTED,
                                                        "The workload is admitted")]
