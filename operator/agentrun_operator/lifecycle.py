"""An AgentRun's life: launch an attempt, follow its pod, settle it, retry it safely,
cancel it, and the safety net that keeps any run from being stuck.

The decisions are pure (classify.py, status.py); this module gathers the facts (the
store, the API server) and applies what they decide. Every step is idempotent, because
kopf may run a handler again after an operator restart.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import logging
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import kopf
from kubernetes.client.exceptions import ApiException
from sqlalchemy.ext.asyncio import AsyncEngine

from agentrun import store
from agentrun.vocabulary import (
    DEFAULT_USER_ID,
    LABEL_ATTEMPT,
    LABEL_RUN,
    SCRIPTED_MODEL,
    Phase,
    Reason,
    RunStatus,
)
from agentrun_operator import events, metrics
from agentrun_operator import status as st
from agentrun_operator.classify import Outcome, classify
from agentrun_operator.config import OperatorConfig
from agentrun_operator.kube import InputMissing, Kube
from agentrun_operator.pods import pod_name, runner_pod, session_id_for

log = logging.getLogger("agentrun.operator")

_STORE_STATUS = {Phase.SUCCEEDED: RunStatus.SUCCEEDED, Phase.FAILED: RunStatus.FAILED,
                 Phase.CANCELLED: RunStatus.CANCELLED}
# Ends decided before any runner could act: no container ran (the image), or no pod was
# ever created (the input, the model, the session). toolsExecuted is [] without counting.
_NOTHING_RAN = frozenset({Reason.IMAGE_PULL_FAILED, Reason.INPUT_UNAVAILABLE,
                          Reason.MODEL_NOT_ALLOWED, Reason.SESSION_BUSY,
                          Reason.SESSION_NOT_OWNED})


@dataclass
class Context:
    """What every handler shares: configuration, the store, the API, the nodes seen."""

    config: OperatorConfig
    engine: AsyncEngine
    kube: Kube
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    node_checks: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    # One decision at a time per run (by uid): the pod watch, the safety-net timer and a
    # node re-check may all see the same end at once, and the loser must see the winner's
    # result (a retry already started), not act on the run it read before.
    # Weak: a run's lock lives only while someone holds or waits for it.
    locks: weakref.WeakValueDictionary[str, asyncio.Lock] = field(
        default_factory=weakref.WeakValueDictionary)

    def lock(self, uid: str) -> asyncio.Lock:
        found = self.locks.get(uid)
        if found is None:
            found = self.locks[uid] = asyncio.Lock()
        return found


def current_attempt(status: Mapping[str, Any]) -> int:
    """The attempt the run's status is about (1 before any is recorded)."""
    return int(status.get("attempts") or 1)


def _is_current(status: Mapping[str, Any], attempt: int) -> bool:
    """`attempt` is still the run's attempt, and the run is not settled: the question every
    step asks again before acting, since another step may have acted meanwhile."""
    return current_attempt(status) == attempt and status.get("phase") not in Phase.TERMINAL


def now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _log(run: Mapping[str, Any], event: str, **fields: Any) -> None:
    meta = run["metadata"]
    extra = " ".join(f"{k}={v!r}" if isinstance(v, str) and " " in v else f"{k}={v}"
                     for k, v in fields.items())
    log.info("event=%s run=%s/%s %s", event, meta["namespace"], meta["name"], extra)


# -- launch ---------------------------------------------------------------------------------


async def launch(ctx: Context, run: Mapping[str, Any]) -> None:
    """Snapshot the input, write the run down, and start its current attempt's pod."""
    meta, spec, status = run["metadata"], run.get("spec") or {}, run.get("status") or {}
    if status.get("phase") in Phase.TERMINAL:
        return
    if spec.get("model") == SCRIPTED_MODEL and not ctx.config.allow_scripted_model:
        await _refuse_launch(ctx, run, Reason.MODEL_NOT_ALLOWED, (
            "spec.model: scripted is turned off on this operator: it lets whoever creates "
            "a run choose every tool call and its arguments. Use a real model, or start the "
            "operator with --allow-scripted-model (development clusters and tests only). "
            "No pod was started."))
        return
    # The snapshot's digest as the store recorded it, never as the status shows it.
    recorded = await store.get_run(ctx.engine, meta["uid"])
    digest = recorded.input_digest if recorded is not None and recorded.input_digest \
        else await _snapshot(ctx, run)
    if digest is None:
        return  # settled InputUnavailable
    await _record_run(ctx, run, digest)
    if not status.get("phase"):
        await ctx.kube.patch_run_status(meta["namespace"], meta["name"], st.live_status(
            Phase.PENDING, Reason.CREATED, "The input was snapshotted and the run recorded.",
            now(), status, inputDigest=digest, attempts=1,
            observedGeneration=meta.get("generation")))
        events.post(run, Reason.CREATED, f"Input snapshotted as {digest}; run recorded.")
    await start_attempt(ctx, run, current_attempt(status), digest)


async def _record_run(ctx: Context, run: Mapping[str, Any], digest: str | None) -> None:
    """The run's row in the store (idempotent): written before anything runs."""
    meta, spec = run["metadata"], run.get("spec") or {}
    await store.record_run(
        ctx.engine, meta["uid"], meta["namespace"], meta["name"], spec["agent"],
        spec.get("trigger") or "manual", spec.get("userId") or "default", digest,
        replay_of=spec.get("replayOf"))


async def _snapshot(ctx: Context, run: Mapping[str, Any]) -> str | None:
    """Copies the input (text and every file) into the store; None if a file is missing,
    in which case the run is settled InputUnavailable before any pod exists."""
    meta, spec = run["metadata"], run.get("spec") or {}
    source = spec.get("input") or {}
    if spec.get("replayOf"):
        return await _replay_snapshot(ctx, run)
    try:
        files = await ctx.kube.read_input_files(meta["namespace"], source.get("files") or [])
    except InputMissing as e:
        await _refuse_launch(ctx, run, Reason.INPUT_UNAVAILABLE,
                             f"{e} No pod was started; fix the input and create the run "
                             "again.")
        return None
    return await store.put_input(ctx.engine, source.get("text") or "", files)


async def _refuse_launch(ctx: Context, run: Mapping[str, Any], reason: str, message: str,
                         attempt: int = 1) -> None:
    """Fails a run before its pod exists (nothing ran), with the run written down."""
    await _record_run(ctx, run, None)
    await settle(ctx, run, attempt, Outcome(Phase.FAILED, reason, message))


async def _replay_snapshot(ctx: Context, run: Mapping[str, Any]) -> str | None:
    """A replay runs on the original's snapshot, found through the approval that created
    this run (the store's record, which only the operator writes), never through anything
    on the AgentRun a user could edit before it starts. Never a run on partial input."""
    meta, spec = run["metadata"], run.get("spec") or {}
    approval = await store.approval_of_replay_run(ctx.engine, meta["namespace"], meta["name"])
    original = None
    if approval is not None and approval.run_name == spec["replayOf"]:
        original = await store.get_run(ctx.engine, approval.run_uid)
    digest = original.input_digest if original is not None else None
    if digest and await store.get_input(ctx.engine, digest) is not None:
        return digest
    what = (f"The input snapshot {digest} of the original run {spec['replayOf']} is gone "
            "from the run store" if digest else
            f"No approved AgentRunReplay of {spec['replayOf']} created this run, so it has "
            "no input to run on")
    await _refuse_launch(ctx, run, Reason.INPUT_UNAVAILABLE, f"{what}; no pod was started.")
    return None


async def start_attempt(ctx: Context, run: Mapping[str, Any], attempt: int, digest: str) -> None:
    meta, spec = run["metadata"], run.get("spec") or {}
    name = pod_name(meta["name"], attempt)
    session = session_id_for(run, attempt)
    claim = await store.claim_session(
        ctx.engine, namespace=meta["namespace"], session_id=session, agent=spec["agent"],
        user_id=spec.get("userId") or DEFAULT_USER_ID, run_uid=meta["uid"])
    if not claim.granted:
        if claim.busy_with:
            reason, message = Reason.SESSION_BUSY, (
                f"Session {session} is in use by the live run {claim.busy_with}: two runs "
                "on one session would interleave their turns. Create this run again once "
                f"{claim.busy_with} has settled. No pod was started.")
        else:
            reason, message = Reason.SESSION_NOT_OWNED, (
                f"Session {session} in namespace {meta['namespace']} belongs to "
                f"{claim.owned_by}; only chat turns of the same agent and userId continue "
                "it. Use another sessionId. No pod was started.")
        await settle(ctx, run, attempt, Outcome(Phase.FAILED, reason, message))
        return
    await store.start_attempt(ctx.engine, meta["uid"], attempt, session, name)
    if not spec.get("serviceAccountName"):
        await ctx.kube.ensure_service_account(meta["namespace"],
                                              ctx.config.runner_service_account)
    # podName is written before the pod is created: if the operator stops in between, the
    # safety net finds the named pod missing (PodLost, nothing ran) instead of creating
    # the same attempt's pod a second time later.
    await ctx.kube.patch_run_status(meta["namespace"], meta["name"], {
        "podName": name, "sessionId": session, "attempts": attempt, "inputDigest": digest})
    try:
        created = await ctx.kube.create_pod(
            runner_pod(run, attempt, session, digest, ctx.config))
    except ApiException as e:
        events.post(run, "PodCreateFailed", f"Runner pod {name} could not be created: "
                    f"{_api_message(e)}. Retrying; the run fails Stale if it never starts.",
               warning=True)
        raise
    if not created:
        existing = await ctx.kube.read_pod(meta["namespace"], name)
        if existing is not None and not _owns(run, existing):
            # A pod of an earlier AgentRun of the same name (deleted and applied again) is
            # still terminating: wait for it rather than follow it.
            raise kopf.TemporaryError(f"pod {name} still belongs to an earlier AgentRun "
                                      "of this name; waiting for it to go", delay=2)
    if created:
        _log(run, "pod-created", attempt=attempt, pod=name)
        events.post(run, Reason.POD_CREATED, f"Created runner pod {name} (attempt {attempt}).")


# -- following the pod ------------------------------------------------------------------------


async def observe_pod(
    ctx: Context, pod: Mapping[str, Any], *, gone: bool = False
) -> Outcome | None:
    """Acts on what a runner pod says, and returns it. `gone`: the pod was just deleted
    from the API."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    run_name, attempt = labels.get(LABEL_RUN), int(labels.get(LABEL_ATTEMPT) or 0)
    if not run_name or not attempt:
        return None
    node = ctx.nodes.get((pod.get("spec") or {}).get("nodeName") or "")
    outcome = classify(pod, node, now(), ctx.config.node_lost_grace)
    if gone and (outcome is None or not outcome.terminal):
        outcome = Outcome(Phase.FAILED, Reason.POD_DELETED,
                          "The runner pod was deleted while the run was running.")
    if outcome is None:
        return None
    run = await ctx.kube.read_run(meta["namespace"], run_name)
    if run is None or not _owns(run, pod):
        return outcome
    status = run.get("status") or {}
    if not _is_current(status, attempt):
        return outcome
    if outcome.terminal:
        await finish_attempt(ctx, run, attempt, outcome)
    elif status.get("phase") == Phase.PENDING and outcome.phase == Phase.RUNNING:
        await _mark_running(ctx, run, attempt, meta["name"])
    return outcome


async def _mark_running(ctx: Context, run: Mapping[str, Any], attempt: int, pod: str) -> None:
    meta = run["metadata"]
    async with ctx.lock(meta["uid"]):
        fresh = await ctx.kube.read_run(meta["namespace"], meta["name"])
        status = (fresh or {}).get("status") or {}
        if status.get("phase") != Phase.PENDING or not _is_current(status, attempt):
            return  # settled (or retried) meanwhile: Running would overwrite that
        await ctx.kube.patch_run_status(meta["namespace"], meta["name"], st.live_status(
            Phase.RUNNING, Reason.STARTED, f"Runner pod {pod} is running.", now(), status,
            startedAt=status.get("startedAt") or st.stamp(now())))
    events.post(run, Reason.STARTED, f"Runner pod {pod} is running.")


def _api_message(e: ApiException) -> str:
    try:
        return str(json.loads(e.body or "{}").get("message") or e.reason)
    except ValueError:
        return str(e.reason)


def _owns(run: Mapping[str, Any], pod: Mapping[str, Any]) -> bool:
    uid = run["metadata"]["uid"]
    return any(o.get("uid") == uid for o in (pod.get("metadata") or {}).get(
        "ownerReferences") or [])


async def finish_attempt(
    ctx: Context, run: Mapping[str, Any], attempt: int, outcome: Outcome
) -> None:
    """An attempt ended: learn what the runner recorded, settle it (which fences the
    ledger and counts the tools), then either start the next attempt or show the end."""
    meta = run["metadata"]
    async with ctx.lock(meta["uid"]):
        fresh = await ctx.kube.read_run(meta["namespace"], meta["name"])
        if fresh is None or fresh["metadata"]["uid"] != meta["uid"]:
            return
        if not _is_current(fresh.get("status") or {}, attempt):
            return  # already decided while we waited
        await _finish(ctx, fresh, attempt, outcome)


async def _finish(ctx: Context, run: Mapping[str, Any], attempt: int, outcome: Outcome) -> None:
    meta = run["metadata"]
    outcome = await _with_runner_account(ctx, meta["uid"], attempt, outcome)
    won, tools = await _settle_store(ctx, run, attempt, outcome)
    if outcome.reason in (Reason.IMAGE_PULL_FAILED, Reason.DEADLINE_EXCEEDED, Reason.STALE):
        # Stopped after settling: the settle fenced the ledger first.
        await ctx.kube.delete_pod(meta["namespace"], pod_name(meta["name"], attempt))
    if not won:
        # Someone else settled this attempt first; their outcome stands. Show it.
        await _show_store_outcome(ctx, run, attempt)
        return
    deleting = meta.get("deletionTimestamp") is not None
    if not deleting and st.should_retry(run.get("spec") or {}, attempt, outcome.phase,
                                        outcome.reason, tools):
        await _retry(ctx, run, attempt, outcome)
        return
    await _show_settled(ctx, run, attempt, outcome, tools)


async def _with_runner_account(
    ctx: Context, uid: str, attempt: int, outcome: Outcome
) -> Outcome:
    """The runner's own account of a plain exit (its reason and message) is more precise
    than an exit code; the cluster's account of a disruption wins over the runner's."""
    if outcome.reason not in (Reason.AGENT_ERROR, Reason.SUCCEEDED):
        return outcome
    try:
        recorded = await store.get_outcome(ctx.engine, uid, attempt)
    except Exception as e:  # the store may be down: the pod's account stands
        log.warning("event=outcome-unreadable uid=%s attempt=%s error=%r", uid, attempt, e)
        return outcome
    told = _recorded(recorded, outcome.message)
    return told if told is not None and told.phase == outcome.phase else outcome


def _recorded(recorded: store.Outcome | None, fallback: str | None = None) -> Outcome | None:
    """How the runner itself recorded the attempt's end, if it did (its message, else
    `fallback`, else a plain one)."""
    if recorded is not None and recorded.status == RunStatus.SUCCEEDED:
        return Outcome(Phase.SUCCEEDED, Reason.SUCCEEDED,
                       recorded.message or fallback or "The agent finished.")
    if recorded is not None and recorded.status == RunStatus.FAILED:
        return Outcome(Phase.FAILED, recorded.reason or Reason.AGENT_ERROR,
                       recorded.message or fallback or "The runner failed.")
    return None


async def _tools(ctx: Context, uid: str, attempt: int) -> list[str] | None:
    """toolsExecuted of an attempt; None (unknown) when the store cannot be read."""
    try:
        return await store.tools_executed(ctx.engine, uid, attempt)
    except Exception as e:
        log.warning("event=tools-unreadable uid=%s attempt=%s error=%r", uid, attempt, e)
        return None


async def _settle_store(
    ctx: Context, run: Mapping[str, Any], attempt: int, outcome: Outcome,
) -> tuple[bool, list[str] | None]:
    """Settles the attempt in the store (first writer wins) and counts its tools in the
    same transaction. Returns (won, tools). When the store cannot be reached, the run's
    own status is the record, with tools unknown, until the safety net catches up."""
    uid = run["metadata"]["uid"]
    try:
        if outcome.reason in _NOTHING_RAN:
            won = await store.settle(ctx.engine, uid, attempt, _STORE_STATUS[outcome.phase],
                                     outcome.reason, outcome.message, [])
            return won, []
        settled = await store.settle_counting(ctx.engine, uid, attempt,
                                              _STORE_STATUS[outcome.phase], outcome.reason,
                                              outcome.message)
        return settled.won, settled.tools_executed
    except Exception as e:
        log.warning("event=store-settle-failed run=%s error=%r", run["metadata"]["name"], e)
        return True, None


async def settle(ctx: Context, run: Mapping[str, Any], attempt: int, outcome: Outcome) -> None:
    """Writes a terminal outcome to the store (if still live there) and to the status."""
    won, tools = await _settle_store(ctx, run, attempt, outcome)
    if won:
        await _show_settled(ctx, run, attempt, outcome, tools)
    else:
        await _show_store_outcome(ctx, run, attempt)


async def _show_settled(
    ctx: Context, run: Mapping[str, Any], attempt: int, outcome: Outcome,
    tools: list[str] | None,
) -> None:
    meta = run["metadata"]
    patch = st.settled_status(outcome.phase, outcome.reason, outcome.message, tools, now(),
                              run.get("status") or {}, attempts=attempt)
    await ctx.kube.patch_run_status(meta["namespace"], meta["name"], patch)
    _log(run, "settled", attempt=attempt, phase=outcome.phase, reason=outcome.reason,
         tools=tools)
    metrics.RUNS_SETTLED.labels(outcome.phase, outcome.reason).inc()
    if tools is None:
        metrics.TOOLS_UNKNOWN.inc()
    told = "unknown (the run store could not be read)" if tools is None else (
        ", ".join(tools) or "none")
    events.post(run, outcome.reason, f"{outcome.message} Tools executed: {told}.",
                warning=outcome.phase != Phase.SUCCEEDED)


async def _show_store_outcome(ctx: Context, run: Mapping[str, Any], attempt: int) -> None:
    found = await store.get_attempt(ctx.engine, run["metadata"]["uid"], attempt)
    if found is None or found.status in RunStatus.LIVE:
        return
    phase = {v: k for k, v in _STORE_STATUS.items()}[found.status]
    status = run.get("status") or {}
    if current_attempt(status) != attempt or status.get("phase") not in Phase.LIVE:
        return
    meta = run["metadata"]
    await ctx.kube.patch_run_status(meta["namespace"], meta["name"], st.settled_status(
        phase, found.reason or "", found.message or "", found.tools_executed, now(), status,
        attempts=attempt))


async def _retry(ctx: Context, run: Mapping[str, Any], attempt: int, outcome: Outcome) -> None:
    meta = run["metadata"]
    following = attempt + 1
    message = (f"Attempt {attempt} failed ({outcome.reason}) before calling any tool; "
               f"starting attempt {following}.")
    status = run.get("status") or {}
    await ctx.kube.patch_run_status(meta["namespace"], meta["name"], st.live_status(
        Phase.PENDING, Reason.RETRYING, message, now(), status, attempts=following))
    events.post(run, Reason.RETRYING, message, warning=True)
    _log(run, "retry", attempt=following, after=outcome.reason)
    metrics.ATTEMPTS_RETRIED.labels(outcome.reason).inc()
    fresh = {**run, "status": {**status, "attempts": following}}
    await start_attempt(ctx, fresh, following, status.get("inputDigest") or "")


# -- the safety net ---------------------------------------------------------------------------


async def check(ctx: Context, run: Mapping[str, Any]) -> None:
    """The periodic check of one run: never stuck, never unknown for longer than needed.

    Live run: its pod must exist (missing with no outcome -> PodLost); its pod is
    classified again (events may have been missed); past the stale limit -> Stale.
    Settled run with toolsExecuted unknown: read it again and fill it in.
    """
    meta, status = run["metadata"], run.get("status") or {}
    phase = status.get("phase")
    if phase in Phase.TERMINAL:
        if "toolsExecuted" in status and status["toolsExecuted"] is None:
            await _fill_unknown_tools(ctx, run)
        return
    if phase not in Phase.LIVE:
        return
    attempt = current_attempt(status)
    if status.get("podName"):
        expected = pod_name(meta["name"], attempt)
        pod = await ctx.kube.read_pod(meta["namespace"], expected)
        if pod is None and status["podName"] != expected:
            # The operator stopped between starting attempt n and naming its pod (the
            # status still names attempt n-1's): create it now. Idempotent.
            await start_attempt(ctx, run, attempt, status.get("inputDigest") or "")
            return
        if pod is None:
            await finish_attempt(ctx, run, attempt, await _lost_pod_outcome(ctx, run, attempt))
            return
        # What the pod says comes first: a run that ended while nobody watched ended so,
        # even if that was past the stale limit.
        said = await observe_pod(ctx, pod)
        if said is not None and said.terminal:
            return
    # A pod that never starts never sets startedAt: count from the run's creation then.
    started = status.get("startedAt") or meta.get("creationTimestamp")
    if started:
        since = datetime.datetime.fromisoformat(started.replace("Z", "+00:00"))
        if now() - since > ctx.config.stale_after:
            await finish_attempt(ctx, run, attempt, Outcome(
                Phase.FAILED, Reason.STALE, st.stale_message(ctx.config.stale_after)))


async def _lost_pod_outcome(ctx: Context, run: Mapping[str, Any], attempt: int) -> Outcome:
    """The pod is gone. If the runner recorded how it ended, that stands; else PodLost."""
    recorded = await store.get_outcome(ctx.engine, run["metadata"]["uid"], attempt)
    return _recorded(recorded) or Outcome(
        Phase.FAILED, Reason.POD_LOST,
        "The runner pod no longer exists and no outcome was recorded.")


async def _fill_unknown_tools(ctx: Context, run: Mapping[str, Any]) -> list[str] | None:
    """Counts the tools of a settled run whose tools were unknown; None if still unknown."""
    meta, status = run["metadata"], run.get("status") or {}
    attempt = current_attempt(status)
    try:
        # The store may never have heard of the end (it was down): settle it there now,
        # which fences the ledger and counts; else just read what it holds.
        settled = await store.settle_counting(
            ctx.engine, meta["uid"], attempt, _STORE_STATUS[status["phase"]],
            status.get("reason"), status.get("message"))
        tools = settled.tools_executed if settled.won else await _tools(
            ctx, meta["uid"], attempt)
        if tools is None:
            return None
        await store.set_tools_executed(ctx.engine, meta["uid"], attempt, tools)
    except Exception as e:
        log.warning("event=store-fill-failed run=%s error=%r", meta["name"], e)
        return None
    conditions = [c for c in status.get("conditions") or []
                  if c.get("type") != st.Condition.TOOLS_EXECUTED]
    await ctx.kube.patch_run_status(meta["namespace"], meta["name"], {
        "toolsExecuted": tools,
        "conditions": [*conditions, st.tools_condition(tools, now())]})
    events.post(run, "ToolsExecutedKnown",
                f"The run store is readable again: tools executed: {', '.join(tools) or 'none'}.")
    return tools


# -- cancellation -----------------------------------------------------------------------------


async def cancel(ctx: Context, run: Mapping[str, Any]) -> None:
    """The run is being deleted: stop its pod and record Cancelled (with the tools).

    The finalizer stays until the store holds the tools: a settled run whose tools are
    still unknown is counted now, and a store that cannot be read is tried again.
    """
    meta = run["metadata"]
    async with ctx.lock(meta["uid"]):
        fresh = await ctx.kube.read_run(meta["namespace"], meta["name"]) or run
        status = fresh.get("status") or {}
        attempt = current_attempt(status)
        tools: list[str] | None
        if status.get("phase") in Phase.TERMINAL:
            if "toolsExecuted" not in status or status["toolsExecuted"] is not None:
                return
            tools = await _fill_unknown_tools(ctx, fresh)
        else:
            if status.get("podName"):
                await ctx.kube.delete_pod(meta["namespace"], status["podName"])
            outcome = Outcome(Phase.CANCELLED, Reason.CANCELLED,
                              "The AgentRun was deleted while it was live; its pod was "
                              "stopped.")
            won, tools = await _settle_store(ctx, fresh, attempt, outcome)
            if won:
                _log(fresh, "cancelled", attempt=attempt, tools=tools)
            if tools is None:
                # Settled before (by us, when the tools could not be read): count now.
                tools = await _tools(ctx, meta["uid"], attempt)
                if tools is not None:
                    try:
                        await store.set_tools_executed(ctx.engine, meta["uid"], attempt, tools)
                    except Exception:
                        tools = None
    if tools is None:
        raise kopf.TemporaryError("the run store cannot be read; the run's tools are not "
                                  "recorded yet, retrying", delay=5)


# -- nodes ---------------------------------------------------------------------------------


async def observe_node(ctx: Context, node: Mapping[str, Any], *, gone: bool = False) -> None:
    """Remembers the node; when it stops being Ready, re-examines its runner pods once the
    grace has passed (pods on a silent node change no more, so no pod event would come)."""
    name = node["metadata"]["name"]
    if gone:
        ctx.nodes.pop(name, None)
        return
    ctx.nodes[name] = dict(node)
    ready: Mapping[str, Any] = next((c for c in (node.get("status") or {}).get("conditions") or []
                  if c.get("type") == "Ready"), {})
    if ready.get("status") == "True":
        task = ctx.node_checks.pop(name, None)
        if task is not None:
            task.cancel()
        return
    if name not in ctx.node_checks or ctx.node_checks[name].done():
        ctx.node_checks[name] = asyncio.create_task(_recheck_node(ctx, name))


async def _recheck_node(ctx: Context, name: str) -> None:
    await asyncio.sleep(ctx.config.node_lost_grace.total_seconds() + 0.2)
    pods = await ctx.kube.list_pods(label_selector=LABEL_RUN,
                                    field_selector=f"spec.nodeName={name}")
    for pod in pods:
        try:
            await observe_pod(ctx, pod)
        except Exception:
            log.exception("event=node-recheck-failed node=%s", name)
