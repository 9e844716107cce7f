"""One level-based reconcile per AgentRun: read the world, take the one next action.

The Job controller's `syncJob` is the model. Pod, node and AgentRun events, resyncs and
deadlines only put the run's key on the work queue (workqueue.py); a worker then calls
`reconcile_run`, which reads the AgentRun (the cache kopf's watch keeps), its runner pod
(the pod informer, filtered server-side), the pod's node (the node informer) and, when
it matters, the store's attempt row, and takes ONE step:

    deleting              -> stop the pod, record Cancelled with the tools, drop the finalizer
    no finalizer          -> add it
    live, agentrun.dev/cancel
                          -> cancel in place: settle (the fence), stop the pod, Cancelled
    settled               -> fill a toolsExecuted the store could not count; delete pods
                             past their time-to-live
    not launched          -> snapshot the input, write the run down, Pending
    attempt n, no pod     -> create it (or, if the store says it was created, the pod is
                             gone: the runner's own account, else PodDeleted / PodLost)
    pod says it ended     -> settle (the fence), then retry or show the end
    pod runs              -> Running
    pod waits             -> say why (unschedulable, a Secret missing, ...)
    past the stale limit  -> Stale

and returns when to look again (a deadline), if ever. Every write carries a precondition
(the AgentRun's resourceVersion; first writer wins in the store), so a stale reconcile
(another replica, an older event) loses with Conflict and is simply run again on the
newer state. There is no branch for "the operator stopped between X and Y": the next
reconcile reads where things stand and goes on from there.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kubernetes.client.exceptions import ApiException
from sqlalchemy.ext.asyncio import AsyncEngine

from agentrun import agents, effects, history, store
from agentrun.vocabulary import (
    ANNOTATION_CANCEL,
    ANNOTATION_CANCEL_NOTE,
    APPROVAL_PLURAL,
    DEFAULT_USER_ID,
    GROUP,
    LABEL_RUN,
    REPLAY_PLURAL,
    RUN_PLURAL,
    SCRIPTED_MODEL,
    ApprovalDecision,
    Condition,
    Phase,
    Reason,
    RunStatus,
)
from agentrun_operator import events, metrics, ttl
from agentrun_operator import queue as queues
from agentrun_operator import status as st
from agentrun_operator.agents import pin as agent_pin
from agentrun_operator.classify import Outcome, classify
from agentrun_operator.config import OperatorConfig
from agentrun_operator.decide import (
    ANSWERED,
    FINISHED,
    IN_DOUBT,
    Decision,
    Journal,
    JournalCall,
    Original,
    cancel_requested,
    decide_resume,
    replay_decided,
)
from agentrun_operator.informer import Informer, Informers, Key
from agentrun_operator.kube import InputForbidden, InputMissing, Kube, api_message
from agentrun_operator.pods import automatic_session_owner, pod_name, runner_pod, session_id_for
from agentrun_operator.workqueue import WorkQueue

log = logging.getLogger("agentrun.operator")

FINALIZER = f"{GROUP}/finalizer"
_STORE_STATUS = {Phase.SUCCEEDED: RunStatus.SUCCEEDED, Phase.FAILED: RunStatus.FAILED,
                 Phase.CANCELLED: RunStatus.CANCELLED}
_PHASE_OF = {v: k for k, v in _STORE_STATUS.items()}
# Ends the operator decides from what it saw itself (no container ran: the image; no pod
# was created: the input, the model, the session, an invalid pod). The runner's own account
# never replaces them. toolsExecuted is still counted from the ledger and the session, as
# for every end: a reason is a label, never evidence that nothing ran.
_OPERATORS_OWN = frozenset({Reason.IMAGE_PULL_FAILED, Reason.INPUT_UNAVAILABLE,
                            Reason.MODEL_NOT_ALLOWED, Reason.SESSION_BUSY,
                            Reason.SESSION_NOT_OWNED, Reason.POD_INVALID})
# Ends after which the pod may still be running, and must be stopped (after the settle,
# which fences the ledger first).
_STOP_POD = frozenset({Reason.IMAGE_PULL_FAILED, Reason.DEADLINE_EXCEEDED, Reason.STALE,
                       Reason.CANCEL_REQUESTED})
# A pod we created is in the pod informer within this long, or it was deleted.
EXPECTATION_SECONDS = 30.0
# Unknown tools are read again this often, until the store answers.
UNKNOWN_TOOLS_RETRY = 5.0
# A run whose time to live is up waits this long for an undecided replay of it.
EXPIRE_WAIT = 1.0
# A node that is not Ready is looked at this often (its pods fail NodeLost after a grace).
NODE_RECHECK = 1.0

RunKey = tuple[str, str, str]  # ("run" | "replay" | "schedule", namespace, name)


def now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


@dataclass
class Context:
    """What every reconcile shares: configuration, the store, the API, the caches."""

    config: OperatorConfig
    engine: AsyncEngine
    kube: Kube
    queue: WorkQueue[RunKey] = field(default_factory=WorkQueue)
    # AgentRuns (slimmed), AgentRunReplays and AgentRunSchedules as kopf's watch last saw
    # them.
    runs: dict[Key, dict[str, Any]] = field(default_factory=dict)
    replays: dict[Key, dict[str, Any]] = field(default_factory=dict)
    approvals: dict[Key, dict[str, Any]] = field(default_factory=dict)
    schedules: dict[Key, dict[str, Any]] = field(default_factory=dict)
    # The runs carrying each schedule's label (agentrun.dev/schedule), by name: the
    # schedule's reconcile reads its runs here, not by a walk of every run.
    schedule_runs: dict[Key, set[str]] = field(default_factory=dict)
    # Whether every run of a schedule was listed since this replica started leading: until
    # then, a schedule asks the API server for its runs before it starts one.
    schedule_runs_listed: bool = False
    agents: dict[Key, dict[str, Any]] = field(default_factory=dict)
    # AgentRunTriggers: their status is written here, and their runs are kept at least
    # their dedupeWindowSeconds (ttl.dedupe_left).
    triggers: dict[Key, dict[str, Any]] = field(default_factory=dict)
    pods: Informer | Informers | None = None
    nodes: Informer | None = None
    # Kueue's Workloads (workloads.Workloads), once Kueue's CRDs are found served.
    workloads: Any = None
    # Pods we created and the pod informer has not shown yet: (namespace, pod) -> when.
    expected: dict[Key, float] = field(default_factory=dict)
    # The last state of runner pods deleted while we were watching.
    gone: dict[Key, dict[str, Any]] = field(default_factory=dict)
    service_accounts: set[Key] = field(default_factory=set)
    # When each live run's usage was last written to its status (throttle: USAGE_EVERY).
    usage_written: dict[Key, float] = field(default_factory=dict)
    _input_key: bytes | None = None

    async def input_key(self) -> bytes:
        """The key of input digests: the configured one, else the installation's."""
        if self._input_key is None:
            self._input_key = self.config.input_digest_key or await store.installation_key(
                self.engine)
        return self._input_key

    # -- facts -----------------------------------------------------------------------------

    async def run(self, namespace: str, name: str) -> dict[str, Any] | None:
        found = self.runs.get((namespace, name))
        if found is None and self.pods is None:  # no caches (a step called directly)
            found = await self.kube.read_run(namespace, name)
        return found

    def remember(self, obj: Mapping[str, Any]) -> None:
        """A write's answer is newer than what the watch showed us so far."""
        if obj:
            meta = obj["metadata"]
            self.runs[(meta["namespace"], meta["name"])] = slim_run(obj)

    async def pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        if self.pods is not None and self.pods.synced.is_set():
            return self.pods.get((namespace, name))
        return await self.kube.read_pod(namespace, name)

    async def node(self, name: str) -> dict[str, Any] | None:
        if not name:
            return None
        if self.nodes is not None and self.nodes.synced.is_set():
            return self.nodes.get(("", name))
        return await self.kube.read_node(name)

    def workload_of(self, pod: dict[str, Any]) -> dict[str, Any] | None:
        """The Workload Kueue made for a runner pod, if Kueue runs here and made one."""
        return self.workloads.of(pod) if self.workloads is not None else None

    def pods_of(self, namespace: str, run: str) -> list[dict[str, Any]]:
        if self.pods is None:
            return []
        return [p for (ns, _), p in self.pods.objects.items() if ns == namespace and
                (p["metadata"].get("labels") or {}).get(LABEL_RUN) == run]


# -- slim copies for the caches ------------------------------------------------------------


def slim_run(obj: Mapping[str, Any]) -> dict[str, Any]:
    """An AgentRun without what no reconcile reads: its input, once it is snapshotted
    (until then the launch needs it, and reads it here rather than from the API)."""
    meta = obj.get("metadata") or {}
    launched = bool((obj.get("status") or {}).get("inputDigest"))
    spec = {k: v for k, v in (obj.get("spec") or {}).items() if k != "input" or not launched}
    # ownerReferences: a schedule's runs are its own (its uid as their controller).
    keep = ("name", "namespace", "uid", "resourceVersion", "generation", "creationTimestamp",
            "deletionTimestamp", "finalizers", "labels", "annotations", "ownerReferences")
    return {"apiVersion": obj.get("apiVersion"), "kind": obj.get("kind"),
            "metadata": {k: meta[k] for k in keep if k in meta}, "spec": spec,
            "status": dict(obj.get("status") or {})}


def slim_pod(obj: Mapping[str, Any]) -> dict[str, Any]:
    """A runner pod as classify() and the reconcile read it."""
    meta = obj.get("metadata") or {}
    keep = ("name", "namespace", "uid", "resourceVersion", "deletionTimestamp", "labels",
            "annotations", "ownerReferences", "creationTimestamp")
    spec = obj.get("spec") or {}
    kept: dict[str, Any] = {"nodeName": spec.get("nodeName")}
    if spec.get("schedulingGates"):  # Kueue's admission gate (queue.py)
        kept["schedulingGates"] = spec["schedulingGates"]
    return {"metadata": {k: meta[k] for k in keep if k in meta}, "spec": kept,
            "status": dict(obj.get("status") or {})}


def slim_node(obj: Mapping[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    return {"metadata": {k: meta[k] for k in ("name", "uid", "resourceVersion") if k in meta},
            "status": {"conditions": status.get("conditions") or []}}


# -- the reconcile ---------------------------------------------------------------------------


def current_attempt(status: Mapping[str, Any]) -> int:
    """The attempt the run's status is about (1 before any is recorded)."""
    return int(status.get("attempts") or 1)


def owns(run: Mapping[str, Any], pod: Mapping[str, Any]) -> bool:
    uid = run["metadata"]["uid"]
    return any(o.get("uid") == uid for o in (pod.get("metadata") or {}).get(
        "ownerReferences") or [])


def _log(run: Mapping[str, Any], event: str, **fields: Any) -> None:
    meta = run["metadata"]
    extra = " ".join(f"{k}={v!r}" if isinstance(v, str) and " " in v else f"{k}={v}"
                     for k, v in fields.items())
    log.info("event=%s run=%s/%s %s", event, meta["namespace"], meta["name"], extra)


def _since(stamp: str | None) -> datetime.datetime | None:
    if not stamp:
        return None
    return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00"))


async def reconcile_run(ctx: Context, namespace: str, name: str) -> float | None:
    """Takes the one next step of AgentRun `namespace/name`; returns in how many seconds
    to look again (None: only when something changes). Raises kube.Conflict when a write
    lost to a newer one."""
    run = await ctx.run(namespace, name)
    if run is None:
        return None
    meta, status = run["metadata"], run.get("status") or {}
    if meta.get("deletionTimestamp"):
        return await _cancel(ctx, run)
    if FINALIZER not in (meta.get("finalizers") or []):
        patched = await ctx.kube.patch_finalizers(
            RUN_PLURAL, run, [*(meta.get("finalizers") or []), FINALIZER])
        if not patched:
            return None  # gone
        ctx.remember(patched)
        # Straight on with the object the patch returned (one reconcile, not two).
        run = slim_run(patched)
        meta, status = run["metadata"], run.get("status") or {}
    phase = status.get("phase")
    if phase not in Phase.TERMINAL and cancel_requested(meta.get("annotations")):
        return await _cancel_in_place(ctx, run)
    if phase in Phase.TERMINAL:
        return await _settled(ctx, run)
    if phase == Phase.WAITING:
        return await _waiting(ctx, run)
    if not phase or not status.get("inputDigest"):
        return await _launch(ctx, run)
    return await _follow(ctx, run)


async def _write(ctx: Context, run: Mapping[str, Any], changes: Mapping[str, Any]) -> None:
    """One status write: the run's status with `changes` (None values are written as
    null), only if the run is still as we read it."""
    status = st.with_gitops_conditions({**(run.get("status") or {}), **changes},
                                       run["metadata"].get("generation"), now())
    ctx.remember(await ctx.kube.replace_status(RUN_PLURAL, run, status))


# -- launching ---------------------------------------------------------------------------------


async def _launch(ctx: Context, run: Mapping[str, Any]) -> float | None:
    """Snapshot the input and write the run down (before any pod), then Pending."""
    meta, spec = run["metadata"], run.get("spec") or {}
    if spec.get("model") == SCRIPTED_MODEL and not ctx.config.allow_scripted_model:
        return await _refuse(ctx, run, 1, Reason.MODEL_NOT_ALLOWED, (
            "spec.model: scripted is turned off on this operator: it lets whoever creates "
            "a run choose every tool call and its arguments. Use a real model, or start the "
            "operator with --allow-scripted-model (development clusters and tests only). "
            "No pod was started."))
    # The snapshot's digest as the store recorded it, never as a status shows it.
    recorded = await store.get_run(ctx.engine, meta["uid"])
    digest = recorded.input_digest if recorded is not None else None
    agent_digest = recorded.agent_digest if recorded is not None else None
    if not digest:
        # The Agent first: a definition that cannot run refuses the run before its input
        # is copied. Pinned once, with the input: every attempt, resume and replay of the
        # run builds this snapshot, whatever the Agent says later.
        pinned = await agent_pin(ctx, run)
        if pinned.refusal is not None:
            return await _refuse(ctx, run, 1, *pinned.refusal)
        agent_digest = pinned.digest
        full = run
        if "input" not in spec:  # a copy made without it: read the run itself
            found = await ctx.kube.read_run(meta["namespace"], meta["name"])
            if found is None or found["metadata"]["uid"] != meta["uid"]:
                return None
            full = found
        try:
            digest = await _snapshot(ctx, full)
        except InputMissing as e:
            return await _refuse(ctx, run, 1, Reason.INPUT_UNAVAILABLE,
                                 f"{e} No pod was started; fix the input and create the run "
                                 "again.")
        except InputForbidden as e:
            message = f"The input cannot be read yet: {e}. No pod was started."
            if (run.get("status") or {}).get("message") != message:
                await _write(ctx, run, st.live_status(
                    Phase.PENDING, Reason.INPUT_FORBIDDEN, message, now(),
                    run.get("status") or {}, observedGeneration=meta.get("generation")))
                events.post(run, Reason.INPUT_FORBIDDEN, message, warning=True)
            return ctx.queue.failed(("run", meta["namespace"], meta["name"]))
        if digest is None:
            return await _refuse(ctx, run, 1, Reason.INPUT_UNAVAILABLE, _replay_gone(spec))
        await _record_run(ctx, run, digest, agent_digest)
    pinned_too = f" and the Agent as {agent_digest}" if agent_digest else ""
    events.post(run, Reason.CREATED,
                f"Input snapshotted as {digest}{pinned_too}; run recorded.")
    launching = {"inputDigest": digest, **({"agentDigest": agent_digest} if agent_digest
                                            else {})}
    # Straight on to the first pod: its status write says both (one write, not two).
    return await _start_attempt(ctx, run, current_attempt(run.get("status") or {}),
                                launching=launching, digest=digest)


async def _record_run(ctx: Context, run: Mapping[str, Any], digest: str | None,
                      agent_digest: str | None = None) -> None:
    """The run's row in the store (idempotent): written before anything runs."""
    meta, spec = run["metadata"], run.get("spec") or {}
    await store.record_run(
        ctx.engine, meta["uid"], meta["namespace"], meta["name"], spec["agent"],
        spec.get("trigger") or "manual", spec.get("userId") or DEFAULT_USER_ID, digest,
        replay_of=spec.get("replayOf"), agent_digest=agent_digest,
        labels=meta.get("labels"), annotations=history.kept_annotations(meta.get("annotations")),
        spec=spec)


async def _snapshot(ctx: Context, run: Mapping[str, Any]) -> str | None:
    """Copies the input (text and every file) into the store. A replay runs on the
    original's snapshot, found through the approval that created it (the store's record,
    which only the operator writes), never through anything a user could edit; None if
    that is gone."""
    meta, spec = run["metadata"], run.get("spec") or {}
    if spec.get("replayOf"):
        approval = await store.approval_of_replay_run(ctx.engine, meta["namespace"],
                                                      meta["name"])
        original = None
        if approval is not None and approval.run_name == spec["replayOf"]:
            original = await store.get_run(ctx.engine, approval.run_uid)
        digest = original.input_digest if original is not None else None
        if digest and await store.get_input(ctx.engine, digest) is not None:
            return digest
        return None
    source = spec.get("input") or {}
    files = await ctx.kube.read_input_files(meta["namespace"], source.get("files") or [])
    return await store.put_input(ctx.engine, source.get("text") or "", files,
                                 key=await ctx.input_key())


def _replay_gone(spec: Mapping[str, Any]) -> str:
    return (f"The input snapshot of the original run {spec.get('replayOf')} is gone from the "
            "run store, or no approved AgentRunReplay created this run; no pod was started.")


async def _refuse(ctx: Context, run: Mapping[str, Any], attempt: int, reason: str,
                  message: str) -> float | None:
    """Fails a run before its pod exists (nothing ran), with the run written down."""
    await _record_run(ctx, run, (run.get("status") or {}).get("inputDigest"))
    return await _finish(ctx, run, attempt, Outcome(Phase.FAILED, reason, message))


# -- following the current attempt -------------------------------------------------------------


async def _follow(ctx: Context, run: Mapping[str, Any]) -> float | None:
    meta, status = run["metadata"], run.get("status") or {}
    attempt = current_attempt(status)
    pname = pod_name(meta["name"], attempt)
    key = (meta["namespace"], pname)
    pod = await ctx.pod(*key)
    if pod is not None and not owns(run, pod):
        return await _name_taken(ctx, run, pod)
    if pod is None:
        return await _no_pod(ctx, run, attempt, key)
    ctx.expected.pop(key, None)
    node = await ctx.node((pod.get("spec") or {}).get("nodeName") or "")
    outcome = classify(pod, node, now(), ctx.config.node_lost_grace)
    if outcome is not None and outcome.terminal:
        return await _finish(ctx, run, attempt, outcome)
    if await _show_queue(ctx, run, pod):
        return 0
    held: float | None = None
    if outcome is not None and outcome.phase == Phase.RUNNING:
        if status.get("phase") == Phase.PENDING:
            message = f"Runner pod {pname} is running."
            await _write(ctx, run, st.live_status(
                Phase.RUNNING, Reason.STARTED, message, now(), status,
                startedAt=status.get("startedAt") or st.stamp(now())))
            events.post(run, Reason.STARTED, message)
            return 0
        held = await _live_usage(ctx, run)
    else:
        waiting = st.pod_waiting(pod)
        if waiting is not None and (status.get("reason"), status.get("message")) != waiting:
            await _write(ctx, run, st.live_status(Phase.PENDING, *waiting, now(), status))
            events.post(run, waiting[0], waiting[1], warning=True)
            return 0
    left = _next_look(ctx, run, node, pod)
    if left <= 0:
        return await _finish(ctx, run, attempt, Outcome(
            Phase.FAILED, Reason.STALE, st.stale_message(ctx.config.stale_after)))
    return left if held is None else min(left, held)


async def _show_queue(ctx: Context, run: Mapping[str, Any], pod: dict[str, Any]) -> bool:
    """Kueue's admission of the attempt's pod, on the run when it changed (queue.py):
    Pending/Queued with Admitted False and Kueue's message, or Admitted True. Returns
    whether it wrote."""
    changes = queues.queue_status(pod, ctx.workload_of(pod), run.get("status") or {}, now())
    if changes is None:
        return False
    before = (run.get("status") or {}).get("reason")
    await _write(ctx, run, changes)
    if changes.get("reason") == Reason.QUEUED and before != Reason.QUEUED:
        events.post(run, Reason.QUEUED, changes["message"])
    elif "reason" not in changes:
        events.post(run, Condition.ADMITTED, next(
            c["message"] for c in changes["conditions"] if c["type"] == Condition.ADMITTED))
    return True


def _next_look(ctx: Context, run: Mapping[str, Any], node: Mapping[str, Any] | None,
               pod: Mapping[str, Any] | None = None) -> float:
    """When to look again without an event: the stale deadline (not counted while the
    attempt waits in Kueue's queue), or soon for a silent node (its pods fail NodeLost
    once the grace has passed)."""
    meta, status = run["metadata"], run.get("status") or {}
    if pod is not None and queues.gated(pod):
        return ctx.config.stale_after.total_seconds()
    started = queues.stale_clock(status, meta.get("creationTimestamp")) or now()
    left = (started + ctx.config.stale_after - now()).total_seconds()
    if left > 0 and node is not None and not st.node_ready(node):
        left = min(left, NODE_RECHECK)
    return left


async def _no_pod(ctx: Context, run: Mapping[str, Any], attempt: int, key: Key) -> float | None:
    """The current attempt has no pod: not created yet (create it), or created and gone."""
    meta = run["metadata"]
    expected = ctx.expected.get(key)
    if expected is not None and time.monotonic() - expected < EXPECTATION_SECONDS:
        # Created a moment ago; the watch has not shown it yet (its event will queue the
        # run; the expectation's end is the safety net).
        return EXPECTATION_SECONDS - (time.monotonic() - expected)
    row = await store.get_attempt(ctx.engine, meta["uid"], attempt)
    if row is not None and row.status not in RunStatus.LIVE:
        # Settled already (by us, before the status write was lost or lost a race).
        return await _after_settle(ctx, run, attempt, _PHASE_OF[row.status],
                                   row.reason or "", row.message or "", row.tools_executed)
    if row is None or row.pod_uid is None:
        if _next_look(ctx, run, None) <= 0:  # never got a pod within the stale limit
            return await _finish(ctx, run, attempt, Outcome(
                Phase.FAILED, Reason.STALE, st.stale_message(ctx.config.stale_after)))
        return await _start_attempt(ctx, run, attempt)
    # The pod was created, and our cache has no pod: ask the API server itself before
    # concluding anything (a replica whose watch lags behind must not call it lost).
    if ctx.pods is not None:
        found = await ctx.kube.read_pod(*key)
        if found is not None and owns(run, found):
            return 0.5
    # It is gone: how the runner said it ended, if it did.
    last = ctx.gone.get(key)  # dropped once the attempt is settled (_after_settle)
    if last is not None:
        outcome = classify(last, None, now(), ctx.config.node_lost_grace)
        if outcome is None or not outcome.terminal:
            outcome = Outcome(Phase.FAILED, Reason.POD_DELETED,
                              "The runner pod was deleted while the run was running.")
    else:
        outcome = _recorded(row.outcome) or Outcome(
            Phase.FAILED, Reason.POD_LOST,
            "The runner pod no longer exists and no outcome was recorded.")
    return await _finish(ctx, run, attempt, outcome)


async def _start_attempt(ctx: Context, run: Mapping[str, Any], attempt: int,
                         launching: Mapping[str, Any] | None = None,
                         digest: str | None = None) -> float | None:
    """Writes attempt `attempt` down, then creates its pod. `launching`: the status fields
    of a run being launched (written with the pod's, in the same status write); `digest`:
    its input snapshot, when the caller has just recorded it."""
    launching = dict(launching or {})
    meta, spec, status = run["metadata"], run.get("spec") or {}, run.get("status") or {}
    name = pod_name(meta["name"], attempt)
    session = session_id_for(run, attempt)
    resumes: int | None = None
    resumes_run: str | None = None
    if attempt in (status.get("resumedAttempts") or []):
        # A resumed attempt continues the session of the attempt before it.
        earlier = await store.get_attempt(ctx.engine, meta["uid"], attempt - 1)
        if earlier is not None and earlier.session_id:
            session, resumes = earlier.session_id, attempt - 1
    elif attempt == 1 and spec.get("replayOf"):
        approval = await store.approval_of_replay_run(ctx.engine, meta["namespace"],
                                                      meta["name"])
        if approval is not None and approval.resume:
            # A manual resume: continue a copy (fork) of the original's last attempt's
            # session; the original's session, ledger and run stay as they are.
            original = await store.get_run(ctx.engine, approval.run_uid)
            last = await store.get_attempt(ctx.engine, approval.run_uid,
                                           original.attempts if original else 1)
            if last is None or not last.session_id or not last.app_name:
                return await _finish(ctx, run, attempt, Outcome(
                    Phase.FAILED, Reason.INPUT_UNAVAILABLE,
                    f"The journal of {spec['replayOf']} is gone; nothing to resume. No pod "
                    "was started."))
            await store.fork_session(ctx.engine, app_name=last.app_name,
                                     user_id=last.user_id or "", source=last.session_id,
                                     target=session)
            resumes, resumes_run = last.attempt, approval.run_uid
    reserved_for = automatic_session_owner(str(spec.get("sessionId") or ""))
    if reserved_for is not None and reserved_for != meta["uid"]:
        return await _finish(ctx, run, attempt, Outcome(Phase.FAILED, Reason.SESSION_NOT_OWNED, (
            f"Session {session} is an automatic session id (<run uid>-<attempt>) of another "
            "run: those are reserved for their run. Name a session of your own in "
            "spec.sessionId. No pod was started.")))
    claim = await store.claim_session(
        ctx.engine, namespace=meta["namespace"], session_id=session, agent=spec["agent"],
        user_id=spec.get("userId") or DEFAULT_USER_ID, run_uid=meta["uid"])
    if not claim.granted:
        if claim.busy_with:
            return await _finish(ctx, run, attempt, Outcome(Phase.FAILED, Reason.SESSION_BUSY, (
                f"Session {session} is in use by the live run {claim.busy_with}: two runs "
                "on one session would interleave their turns. Create this run again once "
                f"{claim.busy_with} has settled. No pod was started.")))
        return await _finish(ctx, run, attempt, Outcome(Phase.FAILED, Reason.SESSION_NOT_OWNED, (
            f"Session {session} in namespace {meta['namespace']} belongs to "
            f"{claim.owned_by}; only chat turns of the same agent and userId continue it. "
            "Use another sessionId. No pod was started.")))
    recorded = await store.get_run(ctx.engine, meta["uid"])
    if not digest:
        digest = recorded.input_digest if recorded is not None else None
    if not digest:
        return await _launch(ctx, run)
    # The pinned Agent's Secret headers become env from those Secrets (valueFrom: the
    # kubelet puts the values in, the operator never reads them).
    agent_digest = recorded.agent_digest if recorded is not None else None
    snapshot = await store.get_agent(ctx.engine, agent_digest) if agent_digest else None
    if agent_digest and snapshot is None:
        return await _finish(ctx, run, attempt, Outcome(Phase.FAILED, Reason.AGENT_NOT_FOUND, (
            f"The Agent snapshot {agent_digest} this run pinned is gone from the run store; "
            "no pod was started.")))
    await store.start_attempt(ctx.engine, meta["uid"], attempt, session, name, resumes,
                              resumes_run)
    account = spec.get("serviceAccountName")
    if not account and (meta["namespace"], ctx.config.runner_service_account) not in \
            ctx.service_accounts:
        await ctx.kube.ensure_service_account(meta["namespace"],
                                              ctx.config.runner_service_account)
        ctx.service_accounts.add((meta["namespace"], ctx.config.runner_service_account))
    try:
        created = await ctx.kube.create_pod(runner_pod(
            run, attempt, session, digest, ctx.config, agent_digest=agent_digest,
            agent_env=agents.secret_env(snapshot) if snapshot is not None else ()))
    except ApiException as e:
        return await _create_refused(ctx, run, attempt, name, e, launching)
    if created is not None:
        metrics.ATTEMPTS_STARTED.inc()
    if created is None:
        existing = await ctx.kube.read_pod(meta["namespace"], name)
        if existing is None:
            return 2.0  # deleted between the create and the read: try again
        if not owns(run, existing):
            return await _name_taken(ctx, run, existing, launching)
        created = existing
    await store.record_pod(ctx.engine, meta["uid"], attempt, created["metadata"]["uid"])
    ctx.expected[(meta["namespace"], name)] = time.monotonic()
    ctx.queue.forget(("run", meta["namespace"], meta["name"]))
    if (status.get("podName"), status.get("sessionId")) != (name, session) or \
            status.get("reason") == Reason.POD_CREATE_FAILED or launching:
        await _write(ctx, run, st.live_status(
            Phase.PENDING, Reason.POD_CREATED, f"Created runner pod {name} (attempt "
            f"{attempt}).", now(), status, podName=name, sessionId=session, attempts=attempt,
            **launching))
    _log(run, "pod-created", attempt=attempt, pod=name)
    events.post(run, Reason.POD_CREATED, f"Created runner pod {name} (attempt {attempt}).")
    return EXPECTATION_SECONDS  # the pod's watch event queues the run before that


# A pod that holds the attempt's name and is not the run's is looked at this often.
NAME_TAKEN_RECHECK = 5.0


async def _name_taken(ctx: Context, run: Mapping[str, Any], pod: Mapping[str, Any],
                      launching: Mapping[str, Any] | None = None) -> float:
    """A pod named like the attempt's runner exists and is not the run's. A pod of an
    earlier AgentRun of the same name (deleted and applied again) that is still going away
    is simply waited for. Any other is not ours to delete: the run waits, Pending, and
    says so."""
    meta, status = run["metadata"], run.get("status") or {}
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return 2.0
    name = pod["metadata"]["name"]
    message = (f"A pod named {name} already exists in namespace {meta['namespace']} and is "
               "not this run's runner (no ownerReference to this AgentRun); the run waits "
               "for the name to be free. Delete that pod, or create the run under another "
               "name. Nothing ran.")
    if (status.get("reason"), status.get("message")) != (Reason.POD_CREATE_FAILED, message) \
            or launching:
        await _write(ctx, run, st.live_status(Phase.PENDING, Reason.POD_CREATE_FAILED,
                                              message, now(), status, **(launching or {})))
        events.post(run, Reason.POD_CREATE_FAILED, message, warning=True)
    return NAME_TAKEN_RECHECK


async def _create_refused(ctx: Context, run: Mapping[str, Any], attempt: int, name: str,
                          e: ApiException,
                          launching: Mapping[str, Any] | None = None) -> float | None:
    """The API server refused the runner pod. Invalid (422/400): it never will, the run
    fails at once. Anything else (a quota, a webhook, forbidden, the server itself): the
    run stays Pending, says why, and the create is tried again with backoff. No attempt
    is spent: nothing ran."""
    meta, status = run["metadata"], run.get("status") or {}
    said = api_message(e)
    if e.status in (400, 422):
        return await _finish(ctx, run, attempt, Outcome(
            Phase.FAILED, Reason.POD_INVALID,
            f"The API server refused runner pod {name} as invalid: {said}. Nothing ran; fix "
            "the run's spec and create it again."))
    message = (f"Runner pod {name} could not be created ({e.status} {e.reason}): {said}. "
               "Retrying with backoff; no attempt is used up.")
    if (status.get("reason"), status.get("message")) != (Reason.POD_CREATE_FAILED, message) \
            or launching:
        await _write(ctx, run, st.live_status(Phase.PENDING, Reason.POD_CREATE_FAILED,
                                              message, now(), status, attempts=attempt,
                                              **(launching or {})))
        events.post(run, Reason.POD_CREATE_FAILED, message, warning=True)
    return ctx.queue.failed(("run", meta["namespace"], meta["name"]))


def _recorded(recorded: store.Outcome | None, fallback: str | None = None) -> Outcome | None:
    """How the runner itself recorded the attempt's end, if it did. Only a reason the
    runner may give (or the store API's own InputUnavailable) is taken as it is; any
    other is an agent error: the store API refuses them, and an older row is no
    exception."""
    if recorded is not None and recorded.status == RunStatus.SUCCEEDED:
        return Outcome(Phase.SUCCEEDED, Reason.SUCCEEDED,
                       recorded.message or fallback or "The agent finished.")
    if recorded is not None and recorded.status == RunStatus.FAILED:
        reason = recorded.reason if recorded.reason in Reason.RECORDED else Reason.AGENT_ERROR
        return Outcome(Phase.FAILED, reason, recorded.message or fallback or
                       "The runner failed.")
    return None


async def _stop_pod(ctx: Context, run: Mapping[str, Any], attempt: int,
                    row: store.Attempt | None = None) -> None:
    """Deletes the attempt's runner pod, and only the pod this run created: the delete
    carries the pod's uid as a precondition (the one the store recorded, else the cached
    pod's if the run owns it). A pod of that name that is not the run's (created by
    someone who may not delete pods themselves) is never touched."""
    meta = run["metadata"]
    name = pod_name(meta["name"], attempt)
    uid = row.pod_uid if row is not None else None
    if uid is None:
        try:
            found = await store.get_attempt(ctx.engine, meta["uid"], attempt)
            uid = found.pod_uid if found is not None else None
        except Exception as e:  # the store may be down: the cache may still know the pod
            log.warning("event=store-pod-uid-unreadable run=%s error=%r", meta["name"], e)
            metrics.STORE_ERRORS.labels("pod_uid").inc()
    if uid is None:
        cached = await ctx.pod(meta["namespace"], name)
        uid = cached["metadata"]["uid"] if cached is not None and owns(run, cached) else None
    if uid is not None:
        await ctx.kube.delete_pod(meta["namespace"], name, uid)


# -- an attempt ends ------------------------------------------------------------------------


async def _finish(ctx: Context, run: Mapping[str, Any], attempt: int,
                  outcome: Outcome) -> float | None:
    """Settles the attempt in the store (first writer wins; the settle fences the ledger
    and counts the tools), then shows what the store holds: a retry, or the end."""
    meta = run["metadata"]
    outcome = await _with_runner_account(ctx, meta["uid"], attempt, outcome)
    tools: list[str] | None
    try:
        # Always counted, whatever the reason says: a runner that reports "nothing ran"
        # after a recorded call must not erase it (the ledger and the session decide).
        await store.settle_counting(ctx.engine, meta["uid"], attempt,
                                    _STORE_STATUS[outcome.phase], outcome.reason,
                                    outcome.message)
        row = await store.get_attempt(ctx.engine, meta["uid"], attempt)
    except Exception as e:
        # The store cannot be reached: the run's status is the record, tools unknown,
        # until the store answers again (_settled reads them then).
        log.warning("event=store-settle-failed run=%s error=%r", meta["name"], e)
        metrics.STORE_ERRORS.labels("settle").inc()
        row = None
        tools = None
    else:
        if row is not None and row.status not in RunStatus.LIVE:
            # Whoever settled first: their account stands.
            outcome = Outcome(_PHASE_OF[row.status], row.reason or outcome.reason,
                              row.message or outcome.message)
            tools = row.tools_executed
        else:  # no attempt row (refused before it was written): the run row is settled
            recorded = await store.get_run(ctx.engine, meta["uid"])
            tools = recorded.tools_executed if recorded is not None else None
    if outcome.reason in _STOP_POD:
        await _stop_pod(ctx, run, attempt, row)
    return await _after_settle(ctx, run, attempt, outcome.phase, outcome.reason,
                               outcome.message, tools)


async def _after_settle(ctx: Context, run: Mapping[str, Any], attempt: int, phase: str,
                        reason: str, message: str, tools: list[str] | None) -> float | None:
    spec, status = run.get("spec") or {}, run.get("status") or {}
    # The attempt's last pod, cached or (deleted, as by an eviction) as last seen.
    key = (run["metadata"]["namespace"], pod_name(run["metadata"]["name"], attempt))
    gone = ctx.gone.pop(key, None)
    last_pod = (ctx.pods.get(key) if ctx.pods is not None else None) or gone
    if phase == Phase.FAILED and reason == Reason.AWAITING_APPROVAL:
        waiting = await store.pending_approval(ctx.engine, run["metadata"]["uid"], attempt)
        if waiting is not None:
            return await _wait(ctx, run, attempt, waiting, tools)
        # It said so and wrote no call down: an agent error like any other.
        reason, message = Reason.AGENT_ERROR, (
            f"{message} The runner said a call waits for an approval, and none was written "
            "down: the run cannot wait for it.")
    # Attempts that followed an approval's decision, and preempted ones, are not counted
    # against maxAttempts.
    preempted = queues.preempted_attempts(status, attempt, reason)
    kept = {"preemptedAttempts": preempted} if preempted else {}
    spent = attempt - await _decided_calls(ctx, run["metadata"]["uid"], attempt) \
        - len(preempted)
    resume = await _resume_decision(ctx, run, attempt, phase, reason, tools, spent)
    if resume is not None and resume.approved:
        following = attempt + 1
        said = f"Attempt {attempt} failed ({reason}); attempt {following} resumes it. " \
            + resume.message + queues.preemption_note(reason, message)
        changes = st.live_status(Phase.PENDING, Reason.RESUMING, said, now(), status,
                                 attempts=following, resumedAttempts=[
                                     *(status.get("resumedAttempts") or []), following],
                                 **kept)
        changes["conditions"] = [
            *[c for c in changes["conditions"] if c.get("type") != st.Condition.RESUMABLE],
            st.resumable_condition(True, resume.reason, resume.message, now(), status)]
        await _write(ctx, run, changes)
        events.post(run, Reason.RESUMING, said)
        _log(run, "resume", attempt=following, after=reason)
        metrics.resumed(reason)
        return 0
    if st.should_retry(spec, spent, phase, reason, tools):
        following = attempt + 1
        said = (f"Attempt {attempt} failed ({reason}) before calling any tool; starting "
                f"attempt {following}.") + queues.preemption_note(reason, message)
        await _write(ctx, run, st.live_status(Phase.PENDING, Reason.RETRYING, said, now(),
                                              status, attempts=following, **kept))
        events.post(run, Reason.RETRYING, said, warning=True)
        _log(run, "retry", attempt=following, after=reason)
        metrics.retried(reason)
        return 0
    settled = st.settled_status(phase, reason, message, tools, now(), status, attempts=attempt,
                                **kept, **await _published_ledger(ctx, run, tools),
                                **await _outcome(ctx, run))
    if resume is not None:  # asked to resume, and refused: say why, on the run
        settled["conditions"] = [
            *[c for c in settled["conditions"] if c.get("type") != st.Condition.RESUMABLE],
            st.resumable_condition(False, resume.reason, resume.message, now(), status)]
        events.post(run, resume.reason, f"Not resumed: {resume.message}", warning=True)
    await _write(ctx, run, settled)
    _log(run, "settled", attempt=attempt, phase=phase, reason=reason, tools=tools)
    metrics.settled(phase, reason, tools, last_pod)
    told = "unknown (the run store could not be read)" if tools is None else (
        ", ".join(tools) or "none")
    events.post(run, reason, f"{message} Tools executed: {told}.",
                warning=phase != Phase.SUCCEEDED)
    return 0


async def _outcome(ctx: Context, run: Mapping[str, Any]) -> dict[str, Any]:
    """status.result (the agent's answer, if it gave one) and status.usage of a run that
    ends, from the store; neither when the store cannot be read (the rest of the status
    says what happened)."""
    uid = run["metadata"]["uid"]
    ctx.usage_written.pop((run["metadata"]["namespace"], run["metadata"]["name"]), None)
    try:
        result = await store.get_result(ctx.engine, uid)
        used = await store.run_usage(ctx.engine, uid)
    except Exception as e:
        log.warning("event=store-outcome-failed run=%s error=%r", run["metadata"]["name"], e)
        metrics.STORE_ERRORS.labels("outcome").inc()
        return {}
    shown: dict[str, Any] = {"usage": st.usage_status(used)}
    if result is not None:
        shown["result"] = st.result_status(result.text, result.digest, result.json)
    return shown


# A live run's usage is written to its status at most this often.
USAGE_EVERY = 5.0


async def _live_usage(ctx: Context, run: Mapping[str, Any]) -> float | None:
    """Writes a running run's usage to its status when it changed, at most once per
    USAGE_EVERY seconds; returns when to look again for a change held back, if one was."""
    meta, status = run["metadata"], run.get("status") or {}
    try:
        used = st.usage_status(await store.run_usage(ctx.engine, meta["uid"]))
    except Exception as e:  # the usage can wait for the store; the run cannot
        log.warning("event=store-usage-failed run=%s error=%r", meta["name"], e)
        metrics.STORE_ERRORS.labels("usage").inc()
        return None
    if used == status.get("usage"):
        return None
    key = (meta["namespace"], meta["name"])
    waited = time.monotonic() - ctx.usage_written.get(key, float("-inf"))
    if waited < USAGE_EVERY:
        return USAGE_EVERY - waited
    await _write(ctx, run, {"usage": used})
    ctx.usage_written[key] = time.monotonic()
    return None


# -- waiting for an approval -----------------------------------------------------------


async def _wait(ctx: Context, run: Mapping[str, Any], attempt: int, waiting: store.Approval,
                tools: list[str] | None) -> float | None:
    """The attempt ended because a call waits for a decision: the run shows Waiting (no pod
    runs meanwhile) and says how to decide; its deadline is the call's expiry."""
    from agentrun_operator.approval import call_text, pending_status

    status = run.get("status") or {}
    name = run["metadata"]["name"]
    message = (f"{call_text(waiting)} (call {waiting.seq}) waits for an approval, until "
               f"{st.stamp(waiting.expires_at)}: approve or deny it with kubectl agentrun "
               f"approve {name} [--deny] (an AgentRunApproval, which only an agentrun-approver "
               "may create). No pod runs meanwhile.")
    changes = st.live_status(Phase.WAITING, Reason.AWAITING_APPROVAL, message, now(), status,
                             attempts=attempt, pendingApproval=pending_status(waiting),
                             toolsExecuted=tools,
                             **await _published_ledger(ctx, run, tools),
                             **await _outcome(ctx, run))
    changes["conditions"] = [
        *[c for c in changes["conditions"] if c.get("type") not in (
            st.Condition.APPROVAL_PENDING, st.Condition.TOOLS_EXECUTED)],
        st.tools_condition(tools, now(), status.get("conditions") or []),
        st.approval_condition(True, Reason.AWAITING_APPROVAL, message, now(), status)]
    await _write(ctx, run, changes)
    events.post(run, Reason.AWAITING_APPROVAL, message)
    _log(run, "awaiting-approval", attempt=attempt, tool=waiting.tool, seq=waiting.seq)
    # Its runner has exited; its pod goes too (a wait may last a day: nothing of it stays
    # on a node). The run store keeps what it did.
    await _stop_pod(ctx, run, attempt)
    return max(0.0, (waiting.expires_at - now()).total_seconds())


async def _waiting(ctx: Context, run: Mapping[str, Any]) -> float | None:
    """A run waits for a decision: once decided (or expired, which denies it as
    `timeout`), the next attempt resumes the journal and runs (or denies) the call. That
    attempt is not counted against retry.maxAttempts: the run did not fail."""
    meta, status = run["metadata"], run.get("status") or {}
    attempt = current_attempt(status)
    asked = status.get("pendingApproval") or {}
    waited = next((a for a in await store.approvals_of(ctx.engine, meta["uid"])
                   if a.attempt == attempt and a.seq == asked.get("seq")), None)
    if waited is None:  # nothing the store knows to wait for: the run failed after all
        return await _after_settle(ctx, run, attempt, Phase.FAILED, Reason.AGENT_ERROR,
                                   "The call this run waited for is not in the run store.",
                                   status.get("toolsExecuted"))
    if waited.pending:
        left = (waited.expires_at - now()).total_seconds()
        if left > 0:
            return left
        timeout = (waited.expires_at - waited.requested_at).total_seconds()
        await store.decide(ctx.engine, meta["uid"], waited.call_id, ApprovalDecision.DENY,
                           ApprovalDecision.TIMEOUT_APPROVER,
                           f"no decision within {int(timeout)} s", None)
        metrics.approval_decided(waited, ApprovalDecision.DENY, now())
        return 0
    following = attempt + 1
    said = "approved" if waited.decision == ApprovalDecision.APPROVE else "denied"
    message = (f"{waited.tool} (call {waited.seq}) was {said} by {waited.approver}; attempt "
               f"{following} resumes the run" + (
                   " and makes the call." if said == "approved" else
                   ", and the model is told it was denied."))
    changes = st.live_status(Phase.PENDING, Reason.RESUMING, message, now(), status,
                             attempts=following, pendingApproval=None,
                             resumedAttempts=[*(status.get("resumedAttempts") or []),
                                              following])
    changes["conditions"] = [
        *[c for c in changes["conditions"] if c.get("type") != st.Condition.APPROVAL_PENDING],
        st.approval_condition(False, "Approved" if said == "approved" else "Denied", message,
                              now(), status)]
    await _write(ctx, run, changes)
    events.post(run, Reason.RESUMING, message)
    _log(run, "approval-decided", attempt=following, decision=waited.decision,
         approver=waited.approver)
    return 0


async def _published_ledger(ctx: Context, run: Mapping[str, Any],
                            tools: list[str] | None) -> dict[str, Any]:
    """status.toolCalls of a settled run, from the store's ledger (none when the store
    could not be read: toolsExecuted is null then, and is filled in later). Read even when
    no tool ran: a call its approver denied is on the ledger (outcome denied), never in
    toolsExecuted, and toolCalls is the ledger of every attempt."""
    if tools is None:
        return {}
    try:
        return st.tool_calls(await store.ledger(ctx.engine, run["metadata"]["uid"]))
    except Exception as e:
        log.warning("event=store-ledger-failed run=%s error=%r", run["metadata"]["name"], e)
        metrics.STORE_ERRORS.labels("ledger").inc()
        return {}


# Failures after which spec.retry.resume does not resume (api.md, "Automatic resume").
_NOT_RESUMED = frozenset({Reason.SUCCEEDED, Reason.CANCELLED, *st.NOT_RETRIED})


async def _decided_calls(ctx: Context, uid: str, attempt: int) -> int:
    """How many of the run's attempts before `attempt` ended waiting for a decision that
    came (each is followed by one more attempt, which does not count)."""
    try:
        return sum(1 for a in await store.approvals_of(ctx.engine, uid)
                   if not a.pending and a.attempt < attempt)
    except Exception as e:  # counted as attempts: a retry may then be refused, never doubled
        log.warning("event=store-approvals-unreadable uid=%s error=%r", uid, e)
        metrics.STORE_ERRORS.labels("approvals").inc()
        return 0


async def _resume_decision(ctx: Context, run: Mapping[str, Any], attempt: int, phase: str,
                           reason: str, tools: list[str] | None,
                           spent: int | None = None) -> Decision | None:
    """With spec.retry.resume, whether the failed attempt is resumed: the same decision as
    a manual resume (decide.decide_resume), on the run itself. None when resume does not
    apply (not asked for, no attempt left, nothing ran: a plain retry then starts over)."""
    spec = run.get("spec") or {}
    retry = spec.get("retry") or {}
    if not retry.get("resume") or phase != Phase.FAILED or reason in _NOT_RESUMED:
        return None
    if (attempt if spent is None else spent) >= int(retry.get("maxAttempts") or 1) \
            or tools == []:
        return None
    status = run.get("status") or {}
    digest = status.get("inputDigest")
    original = Original(phase=phase, tools_executed=tools, input_digest=digest,
                        input_available=bool(digest), reason=reason)
    journal = await journal_of(ctx.engine, run["metadata"]["uid"], attempt)
    return decide_resume(run["metadata"]["name"], original, journal,
                         already_replayed_by=None, forced=False)


async def journal_of(engine: AsyncEngine, uid: str, attempt: int) -> Journal:
    """The journal of attempt `attempt`'s session, as the resume decision reads it."""
    try:
        row = await store.get_attempt(engine, uid, attempt)
        if row is None or row.invocation_id is None or row.session_id is None:
            return Journal(False)
        same_session = [row.attempt]
        for earlier in range(1, attempt):
            found = await store.get_attempt(engine, uid, earlier)
            if found is not None and found.session_id == row.session_id:
                same_session.append(earlier)
        entries = await store.journal(engine, uid, sorted(same_session), row.app_name or "",
                                      row.user_id or "", row.session_id)
    except Exception as e:
        log.warning("event=journal-unreadable uid=%s attempt=%s error=%r", uid, attempt, e)
        metrics.STORE_ERRORS.labels("journal").inc()
        return Journal(False)
    if entries is None:
        return Journal(False)
    return Journal(True, tuple(JournalCall(
        seq=e.seq, tool=e.tool, effect=e.effect or effects.EFFECTFUL,
        state=ANSWERED if e.answered else FINISHED if e.finished else IN_DOUBT,
        called_at=e.started_at, key=e.idempotency_key or "") for e in entries))


async def _with_runner_account(ctx: Context, uid: str, attempt: int,
                               outcome: Outcome) -> Outcome:
    """The runner's own account of a plain exit (its reason and message) is more precise
    than an exit code; the cluster's account of a disruption wins over the runner's, unless
    the runner had recorded that the agent finished: what happened to its pod after the
    answer (an eviction while the process exits) changes nothing the run did."""
    if outcome.reason in _OPERATORS_OWN:
        return outcome
    try:
        recorded = await store.get_outcome(ctx.engine, uid, attempt)
    except Exception as e:  # the store may be down: the pod's account stands
        log.warning("event=outcome-unreadable uid=%s attempt=%s error=%r", uid, attempt, e)
        metrics.STORE_ERRORS.labels("outcome").inc()
        return outcome
    told = _recorded(recorded, outcome.message)
    if told is not None and told.phase == Phase.SUCCEEDED:
        return told
    if outcome.reason not in (Reason.AGENT_ERROR, Reason.SUCCEEDED):
        return outcome
    return told if told is not None and told.phase == outcome.phase else outcome


# -- settled runs -------------------------------------------------------------------------------


async def _settled(ctx: Context, run: Mapping[str, Any]) -> float | None:
    """A settled run: its tools known (read again until the store answers), and its pods
    deleted once their time to live has passed (the ledger keeps the story)."""
    status = run.get("status") or {}
    if "toolsExecuted" in status and status["toolsExecuted"] is None:
        tools = await _count_unknown(ctx, run)
        if tools is None:
            return UNKNOWN_TOOLS_RETRY
        conditions = [c for c in status.get("conditions") or []
                      if c.get("type") != st.Condition.TOOLS_EXECUTED]
        await _write(ctx, run, {"toolsExecuted": tools,
                                "conditions": [*conditions, st.tools_condition(tools, now())],
                                **await _published_ledger(ctx, run, tools)})
        events.post(run, "ToolsExecutedKnown", "The run store is readable again: tools "
                    f"executed: {', '.join(tools) or 'none'}.")
        return 0
    return await _collect_pods(ctx, run)


async def _count_unknown(ctx: Context, run: Mapping[str, Any]) -> list[str] | None:
    """The tools of a settled attempt whose count failed; None while the store cannot say."""
    meta, status = run["metadata"], run.get("status") or {}
    attempt = current_attempt(status)
    try:
        # The store may never have heard of the end (it was down): settle it there now,
        # which fences the ledger and counts; else read what it holds.
        settled = await store.settle_counting(
            ctx.engine, meta["uid"], attempt, _STORE_STATUS[status["phase"]],
            status.get("reason"), status.get("message"))
        tools = settled.tools_executed if settled.won else await store.tools_executed(
            ctx.engine, meta["uid"], attempt)
        if tools is not None:
            await store.set_tools_executed(ctx.engine, meta["uid"], attempt, tools)
        return tools
    except Exception as e:
        log.warning("event=store-fill-failed run=%s error=%r", meta["name"], e)
        metrics.STORE_ERRORS.labels("count_tools").inc()
        return None


async def _collect_pods(ctx: Context, run: Mapping[str, Any]) -> float | None:
    """A settled run's pods go when their time to live is up, the run itself when its own
    is (ttl.py); returns when the nearer of the two is due, None when nothing is left."""
    meta = run["metadata"]
    since = ttl.settled_at(run)
    # A pod already deleting is not deleted again (Kueue's finalizer may hold it while
    # Kueue is down).
    pods = [p for p in ctx.pods_of(meta["namespace"], meta["name"]) if owns(run, p)
            and not p["metadata"].get("deletionTimestamp")]
    pods_left = ttl.seconds_left(since, ctx.config.pod_ttl_after_finished, now()) if pods \
        else None
    if pods_left is not None and pods_left <= 0:
        for pod in pods:
            await ctx.kube.delete_pod(meta["namespace"], pod["metadata"]["name"],
                                      pod["metadata"]["uid"])
        pods_left = None
    run_left = ttl.at_least(ttl.seconds_left(
        since, ttl.run_ttl(run.get("spec") or {}, ctx.config.run_ttl_after_finished), now()),
        ttl.dedupe_left(run, ctx.triggers, now()))
    if run_left is not None and run_left <= 0:
        return await _expire(ctx, run)
    due = [left for left in (pods_left, run_left) if left is not None]
    return min(due) if due else None


async def _expire(ctx: Context, run: Mapping[str, Any]) -> float | None:
    """The run's time to live is up: its decided replays and its approvals go (they hold
    no ownerReference to it), then the run (only if it is still this run; its finalizer
    lets it go at once, the store's record stays). A replay not decided yet keeps the run
    until it is: its request is never lost."""
    meta = run["metadata"]
    ns, name = meta["namespace"], meta["name"]
    replays = [r for (rns, _), r in list(ctx.replays.items())
               if rns == ns and (r.get("spec") or {}).get("runName") == name]
    if any(not replay_decided(r) for r in replays):
        return EXPIRE_WAIT
    for plural, objects in ((REPLAY_PLURAL, replays), (APPROVAL_PLURAL, [
            a for (ans, _), a in list(ctx.approvals.items())
            if ans == ns and (a.get("spec") or {}).get("runName") == name])):
        for obj in objects:
            await ctx.kube.delete_object(plural, ns, obj["metadata"]["name"],
                                         obj["metadata"]["uid"])
    if await ctx.kube.delete_run(ns, name, meta["uid"]):
        _log(run, "expired", phase=(run.get("status") or {}).get("phase"))
        metrics.RUNS_EXPIRED.inc()
    return None


# -- cancellation ----------------------------------------------------------------------------


async def _cancel(ctx: Context, run: Mapping[str, Any]) -> float | None:
    """The run is being deleted: stop its pod, record Cancelled with the tools, then let
    it go. The finalizer stays until the store holds the tools."""
    meta, status = run["metadata"], run.get("status") or {}
    finalizers = meta.get("finalizers") or []
    if FINALIZER not in finalizers:
        return None
    attempt = current_attempt(status)
    tools: list[str] | None
    if status.get("phase") in Phase.TERMINAL and status.get("toolsExecuted") is not None:
        tools = list(status["toolsExecuted"])
    elif status.get("phase") in Phase.TERMINAL or not status.get("phase"):
        tools = [] if not status.get("phase") else await _count_unknown(ctx, run)
        if not status.get("phase"):
            # Never launched: nothing ran; the store learns it was cancelled, if it knows it.
            try:
                await store.settle(ctx.engine, meta["uid"], attempt, RunStatus.CANCELLED,
                                   Reason.CANCELLED, "Deleted before it started.", [])
            except Exception as e:
                log.warning("event=store-cancel-failed run=%s error=%r", meta["name"], e)
                metrics.STORE_ERRORS.labels("cancel").inc()
                tools = None
    else:
        await _stop_pod(ctx, run, attempt)
        try:
            settled = await store.settle_counting(
                ctx.engine, meta["uid"], attempt, RunStatus.CANCELLED, Reason.CANCELLED,
                "The AgentRun was deleted while it was live; its pod was stopped.")
            tools = settled.tools_executed
            if settled.won:
                _log(run, "cancelled", attempt=attempt, tools=tools)
            else:
                tools = await store.tools_executed(ctx.engine, meta["uid"], attempt)
            if tools is not None:
                await store.set_tools_executed(ctx.engine, meta["uid"], attempt, tools)
        except Exception as e:
            log.warning("event=store-cancel-failed run=%s error=%r", meta["name"], e)
            metrics.STORE_ERRORS.labels("cancel").inc()
            tools = None
    if tools is None:
        return UNKNOWN_TOOLS_RETRY  # the store cannot be read: keep the finalizer
    await ctx.kube.patch_finalizers(RUN_PLURAL, run, [f for f in finalizers if f != FINALIZER])
    return None


# A note on a cancel request is cut to this length in the run's message.
CANCEL_NOTE_CHARS = 512


async def _cancel_in_place(ctx: Context, run: Mapping[str, Any]) -> float | None:
    """Cancel in place (annotation agentrun.dev/cancel): the run ends as any run ends, and
    stays. The attempt is settled first (the fence: no tool starts after it, every call
    started before is counted), then its pod is stopped (with its uid as precondition);
    the run shows Cancelled, CancelRequested, with toolsExecuted. A runner that had
    already recorded its answer keeps it (Succeeded): the cancel came too late to stop it.
    A run not launched yet is written down and settled with nothing run."""
    meta, status = run["metadata"], run.get("status") or {}
    note = (meta.get("annotations") or {}).get(ANNOTATION_CANCEL_NOTE, "").strip()
    message = f"Cancelled on request ({ANNOTATION_CANCEL})" + (
        f": {note[:CANCEL_NOTE_CHARS]}" if note else "") + "."
    if status.get("phase") == Phase.WAITING:
        return await _cancel_waiting(ctx, run, message)
    if not status.get("phase") or not status.get("inputDigest"):
        await _record_run(ctx, run, status.get("inputDigest"))
        message += " It had not started: nothing ran."
    else:
        message += " Its runner pod was stopped."
    _log(run, "cancel-requested", attempt=current_attempt(status))
    return await _finish(ctx, run, current_attempt(status), Outcome(
        Phase.CANCELLED, Reason.CANCEL_REQUESTED, message))


async def _cancel_waiting(ctx: Context, run: Mapping[str, Any], message: str) -> float | None:
    """A run that waits for an approval is cancelled: its attempt ended already (no pod
    runs), so the call it waits for is denied (a later approval finds it decided, and it
    never runs), the run row in the store is closed Cancelled, and the status says so."""
    meta, status = run["metadata"], run.get("status") or {}
    attempt = current_attempt(status)
    waiting = await store.pending_approval(ctx.engine, meta["uid"], attempt)
    if waiting is not None:
        await store.decide(ctx.engine, meta["uid"], waiting.call_id, ApprovalDecision.DENY,
                           "cancel", "the run was cancelled while it waited", None)
    tools = status.get("toolsExecuted")
    if tools is None:
        tools = await store.tools_executed(ctx.engine, meta["uid"], attempt)
    message += " It was waiting for an approval, which it no longer needs: the call never ran."
    await store.close_run(ctx.engine, meta["uid"], attempt, RunStatus.CANCELLED,
                          Reason.CANCEL_REQUESTED, message)
    settled = st.settled_status(Phase.CANCELLED, Reason.CANCEL_REQUESTED, message, tools,
                                now(), status, attempts=attempt, pendingApproval=None,
                                **await _published_ledger(ctx, run, tools),
                                **await _outcome(ctx, run))
    settled["conditions"] = [
        *[c for c in settled["conditions"] if c.get("type") != st.Condition.APPROVAL_PENDING],
        st.approval_condition(False, Reason.CANCEL_REQUESTED, message, now(), status)]
    await _write(ctx, run, settled)
    events.post(run, Reason.CANCEL_REQUESTED, message, warning=True)
    _log(run, "settled", attempt=attempt, phase=Phase.CANCELLED,
         reason=Reason.CANCEL_REQUESTED, tools=tools)
    return 0


# -- workers ------------------------------------------------------------------------------------


Reconciler = Callable[[Context, str, str], Awaitable[float | None]]


async def work(ctx: Context, reconcilers: Mapping[str, Reconciler]) -> None:
    """One worker: takes keys off the queue until cancelled; each key's kind names the
    reconcile of its kind (`reconcile_run` for "run", and the others' handlers give)."""
    from agentrun_operator.kube import Conflict

    every = {"run": reconcile_run, **reconcilers}
    while True:
        key = await ctx.queue.get()
        kind, namespace, name = key
        started, result = time.perf_counter(), "ok"
        try:
            again = await every[kind](ctx, namespace, name)
        except asyncio.CancelledError:
            ctx.queue.done(key)
            raise
        except Conflict:
            # A newer write won: the watch brings that state; look again soon anyway.
            again, result = 0.2, "conflict"
        except Exception:
            log.exception("event=reconcile-failed kind=%s object=%s/%s", kind, namespace, name)
            again, result = ctx.queue.failed(key), "error"
        metrics.RECONCILE_DURATION.labels(kind, result).observe(time.perf_counter() - started)
        ctx.queue.done(key)
        if again is not None:
            ctx.queue.add_after(key, again)
