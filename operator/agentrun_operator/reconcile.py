"""The run controller: gather the facts of an AgentRun, ask the pure decision (run.py),
take the one step it returns.

The Job controller's `syncJob` is the model. Pod, node and AgentRun events, resyncs and
deadlines only put the run's key on the work queue (workqueue.py); a worker then calls
`reconcile_run`, which reads the AgentRun (the cache kopf's watch keeps), its runner pod
(the pod informer, filtered server-side), the pod's node (the node informer) and, only
when the decision needs it (`run.reads`), what the store holds of the run, in one read;
`run.decide_run` (whose docstring holds the table of steps) says what to do, and `act`
does it, with `run.run_status` building the one status write and its Events.

Every write carries a precondition (the AgentRun's resourceVersion; the pod's uid on a
delete; first writer wins in the store), so a stale reconcile (another replica, an older
event) loses with Conflict and is simply run again on the newer state. There is no branch
for "the operator stopped between X and Y": the next reconcile reads where things stand
and goes on from there.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Mapping
from typing import Any

from kubernetes.client.exceptions import ApiException

from agentrun import agents, history, store
from agentrun.vocabulary import (
    APPROVAL_PLURAL,
    DEFAULT_USER_ID,
    LABEL_TRIGGER,
    REPLAY_PLURAL,
    RUN_PLURAL,
    ApprovalDecision,
    Phase,
    Reason,
    RunStatus,
)
from agentrun_operator import events, metrics, ttl
from agentrun_operator.agents import pin as agent_pin
from agentrun_operator.classify import Outcome
from agentrun_operator.controller import Context, now, slim_node, slim_pod, slim_run
from agentrun_operator.journal import journal_of
from agentrun_operator.kube import InputForbidden, InputMissing, api_message
from agentrun_operator.pods import pod_name, runner_pod
from agentrun_operator.run import (
    EXPECTATION_SECONDS,
    FENCES,
    FINALIZER,
    SETTLED_READS,
    UNKNOWN,
    UNKNOWN_TOOLS_RETRY,
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
    Reads,
    Release,
    RunFacts,
    RunStep,
    Settle,
    Show,
    Start,
    Tools,
    Usage,
    Wait,
    account,
    create_refused,
    created,
    current_attempt,
    decide_run,
    name_taken,
    owns,
    reads,
    refused,
    resume_applies,
    run_status,
    say,
    start_of,
)

log = logging.getLogger("agentrun.operator")

# Re-exported for callers that take a step directly (tests, tools).
__all__ = ["FINALIZER", "Context", "reconcile_run", "slim_node", "slim_pod", "slim_run"]

_STORE_STATUS = {Phase.SUCCEEDED: RunStatus.SUCCEEDED, Phase.FAILED: RunStatus.FAILED,
                 Phase.CANCELLED: RunStatus.CANCELLED}
# Fences one sync takes at most (a settle, then the count another writer's settle left).
_FENCES_PER_SYNC = 3


def _log(run: Mapping[str, Any], event: str, **fields: Any) -> None:
    meta = run["metadata"]
    extra = " ".join(f"{k}={v!r}" if isinstance(v, str) and " " in v else f"{k}={v}"
                     for k, v in fields.items())
    log.info("event=%s run=%s/%s %s", event, meta["namespace"], meta["name"], extra)


def _key(facts: RunFacts) -> tuple[str, str, str]:
    return ("run", facts.meta["namespace"], facts.name)


async def reconcile_run(ctx: Context, namespace: str, name: str) -> float | None:
    """Takes the one next step of AgentRun `namespace/name`; returns in how many seconds
    to look again (None: only when something changes). Raises kube.Conflict when a write
    lost to a newer one."""
    run = await ctx.run(namespace, name)
    if run is None:
        return None
    facts = await gather(ctx, run)
    return await act(ctx, facts, decide_run(facts, now(), ctx.config))


# -- the facts ----------------------------------------------------------------------------


async def gather(ctx: Context, run: Mapping[str, Any], *, after_fence: bool = False,
                 unsettled: Outcome | None = None,
                 state: store.RunState | None = None) -> RunFacts:
    """What one sync knows: the caches, then the store as far as the decision needs it
    (everything a settled attempt shows, `after_fence`; `state` when the fence read it
    already)."""
    meta, status = run["metadata"], run.get("status") or {}
    namespace = meta["namespace"]
    attempt = current_attempt(status)
    key = (namespace, pod_name(meta["name"], attempt))
    phase = status.get("phase")
    pod = node = workload = None
    if phase not in Phase.TERMINAL and phase != Phase.WAITING and (
            status.get("inputDigest") or meta.get("deletionTimestamp")):
        pod = await ctx.pod(*key)
        if pod is not None:
            node = await ctx.node((pod.get("spec") or {}).get("nodeName") or "")
            if owns(run, pod):
                ctx.expected.pop(key, None)
                workload = ctx.workload_of(pod)
    expected = ctx.expected.get(key)
    written = ctx.usage_written.get((namespace, meta["name"]))
    facts = RunFacts(
        run=run, pod=pod, node=node, workload=workload, gone=ctx.gone.get(key),
        created_ago=None if expected is None else time.monotonic() - expected,
        usage_written_ago=None if written is None else time.monotonic() - written,
        unsettled=unsettled)
    if phase in Phase.TERMINAL:
        facts = _settled_caches(ctx, facts)
    if state is not None:
        return await _with_store(ctx, facts, state)
    wanted = SETTLED_READS if after_fence else reads(facts, now(), ctx.config)
    if wanted is None:
        return facts
    return await _read_store(ctx, facts, wanted)


def _settled_caches(ctx: Context, facts: RunFacts) -> RunFacts:
    """A settled run's own pods (their time to live), and, once its own time to live may
    be up, its replays and approvals."""
    meta = facts.meta
    # A pod already deleting is not deleted again (Kueue's finalizer may hold it while
    # Kueue is down).
    pods = tuple(p for p in ctx.pods_of(meta["namespace"], facts.name)
                 if owns(facts.run, p) and not p["metadata"].get("deletionTimestamp"))
    if ttl.run_ttl(facts.spec, ctx.config.run_ttl_after_finished) is None:
        return dataclasses.replace(facts, pods=pods)
    ns, name = meta["namespace"], facts.name
    trigger = (meta.get("labels") or {}).get(LABEL_TRIGGER)
    found = ctx.triggers.get((ns, trigger)) if trigger else None
    replays = tuple(r for (rns, _), r in list(ctx.replays.items())
                    if rns == ns and (r.get("spec") or {}).get("runName") == name)
    approvals = tuple(a for (ans, _), a in list(ctx.approvals.items())
                      if ans == ns and (a.get("spec") or {}).get("runName") == name)
    return dataclasses.replace(facts, pods=pods, replays=replays, approvals=approvals,
                               triggers={(ns, str(trigger)): found} if found else {})


async def _read_store(ctx: Context, facts: RunFacts, wanted: Reads) -> RunFacts:
    """The store's part of the facts, in one read; UNKNOWN when it cannot be read."""
    uid = facts.meta["uid"]
    try:
        state: store.RunState | Any = await store.run_state(
            ctx.engine, uid, facts.attempt, previous=wanted.previous,
            approvals=wanted.approvals, published=wanted.published, usage=wanted.usage)
    except Exception as e:  # the store may be down: the decision knows it does not know
        log.warning("event=store-unreadable run=%s error=%r", facts.name, e)
        metrics.STORE_ERRORS.labels("facts").inc()
        return dataclasses.replace(facts, store=UNKNOWN)
    return await _with_store(ctx, facts, state)


async def _with_store(ctx: Context, facts: RunFacts, state: store.RunState) -> RunFacts:
    """The facts with what the store said, and what that says to look at next."""
    uid = facts.meta["uid"]
    facts = dataclasses.replace(facts, store=state)
    row = state.attempt
    if facts.pod is None and ctx.pods is not None and facts.launched and row is not None \
            and row.pod_uid is not None and row.status in RunStatus.LIVE and (
                facts.created_ago is None or facts.created_ago >= EXPECTATION_SECONDS):
        # The store says the pod was created and our cache has none: ask the API server
        # itself before concluding anything.
        found = await ctx.kube.read_pod(facts.meta["namespace"], facts.pod_name)
        facts = dataclasses.replace(facts, pod_elsewhere=found is not None and owns(
            facts.run, found))
    if resume_applies(facts):
        facts = dataclasses.replace(facts, journal=await journal_of(ctx.engine, uid,
                                                                      facts.attempt))
    return facts


# -- the step -----------------------------------------------------------------------------


async def act(ctx: Context, facts: RunFacts, step: RunStep) -> float | None:
    """Takes `step`; returns when to look again."""
    taken: list[type] = []
    while isinstance(step, FENCES):
        # The store first: then decide again on what it holds. The same fence twice (its
        # write did not take: the store cannot count yet) waits for a later sync.
        if type(step) in taken or len(taken) == _FENCES_PER_SYNC:
            return UNKNOWN_TOOLS_RETRY
        taken.append(type(step))
        facts = await _fence(ctx, facts, step)
        step = decide_run(facts, now(), ctx.config)
    match step:
        case Nothing():
            return ctx.queue.failed(_key(facts)) if step.backoff else step.again
        case AddFinalizer():
            meta = facts.meta
            patched = await ctx.kube.patch_finalizers(
                RUN_PLURAL, facts.run, [*(meta.get("finalizers") or []), FINALIZER])
            if not patched:
                return None  # gone
            ctx.remember(patched)
            return 0
        case Release():
            if step.stop_pod:
                await _stop_pod(ctx, facts)
            meta = facts.meta
            await ctx.kube.patch_finalizers(RUN_PLURAL, facts.run, [
                f for f in meta.get("finalizers") or [] if f != FINALIZER])
            return None
        case Launch():
            return await _launch(ctx, facts, step)
        case Start():
            return await _start(ctx, facts, step)
        case DeletePods():
            for pod in step.pods:
                await ctx.kube.delete_pod(facts.meta["namespace"], pod["metadata"]["name"],
                                          pod["metadata"]["uid"])
            return step.again
        case Expire():
            return await _expire(ctx, facts, step)
        case Live() | Wait() | Finish() | Tools() | InQueue() | Usage():
            return await show(ctx, facts, step)
    raise AssertionError(f"no action for {step!r}")


async def _fence(ctx: Context, facts: RunFacts, step: Settle | Count | Deny | CancelWait
                 ) -> RunFacts:
    """The store write a step begins with; returns the facts as they are after it."""
    meta, status = facts.meta, facts.status
    uid, attempt = meta["uid"], facts.attempt
    unsettled = None
    state: store.RunState | None = None
    match step:
        case Settle():
            o = step.outcome
            if step.record:
                await _record_run(ctx, facts.run, status.get("inputDigest"))
            if o.reason == Reason.CANCEL_REQUESTED:
                _log(facts.run, "cancel-requested", attempt=attempt)
            try:
                # Counted whatever the reason says: a runner that reports "nothing ran"
                # after a recorded call must not erase it (the ledger and the session
                # decide). Whoever settled first: their account stands. What the run
                # then shows is read on the same connection.
                state = await store.settle_then_state(
                    ctx.engine, uid, attempt, _STORE_STATUS[o.phase], o.reason, o.message,
                    count=step.count, previous=SETTLED_READS.previous,
                    approvals=SETTLED_READS.approvals, published=SETTLED_READS.published,
                    usage=SETTLED_READS.usage)
            except Exception as e:
                # The store cannot be reached: the run's status is the record, tools
                # unknown, until the store answers again.
                log.warning("event=store-settle-failed run=%s error=%r", facts.name, e)
                metrics.STORE_ERRORS.labels("settle").inc()
                unsettled = o
        case Count():
            o = step.outcome
            try:
                # The store may never have heard of the end (it was down): settle it there
                # now, which fences the ledger and counts; else count what it holds.
                settled = await store.settle_counting(
                    ctx.engine, uid, attempt, _STORE_STATUS[o.phase], o.reason, o.message)
                tools = settled.tools_executed if settled.won else \
                    await store.tools_executed(ctx.engine, uid, attempt)
                if tools is not None:
                    await store.set_tools_executed(ctx.engine, uid, attempt, tools)
            except Exception as e:
                log.warning("event=store-fill-failed run=%s error=%r", facts.name, e)
                metrics.STORE_ERRORS.labels("count_tools").inc()
        case Deny():
            await store.decide(ctx.engine, uid, step.call.call_id, ApprovalDecision.DENY,
                               step.approver, step.note, None)
            metrics.approval_decided(step.call, ApprovalDecision.DENY, now())
        case CancelWait():
            # Its attempt ended already (no pod runs): the call it waits for is denied (a
            # later approval finds it decided, and it never runs), its run row closed.
            if step.call is not None:
                await store.decide(ctx.engine, uid, step.call.call_id, ApprovalDecision.DENY,
                                   "cancel", "the run was cancelled while it waited", None)
            await store.close_run(ctx.engine, uid, attempt, RunStatus.CANCELLED,
                                  Reason.CANCEL_REQUESTED, step.message)
    return await gather(ctx, facts.run, after_fence=True, unsettled=unsettled, state=state)


async def show(ctx: Context, facts: RunFacts, step: Show) -> float | None:
    """The one status write of the sync, only when the status changes, with its Events."""
    run = facts.run
    key = (facts.meta["namespace"], facts.name)
    if isinstance(step, Finish) and step.stop_pod:
        await _stop_pod(ctx, facts)  # after the settle, which fenced the ledger first
    status, said = run_status(facts, step, now())
    changed = status != facts.status
    if changed:
        ctx.remember(await ctx.kube.replace_status(RUN_PLURAL, run, status))
        for event in said:
            events.post(run, event.reason, event.message, warning=event.warning)
        _told(ctx, facts, step)
    if isinstance(step, Wait):
        # Its runner has exited; its pod goes too (a wait may last a day: nothing of it
        # stays on a node). The run store keeps what it did.
        await _stop_pod(ctx, facts)
        return max(0.0, (step.call.expires_at - now()).total_seconds())
    if isinstance(step, Usage):
        ctx.usage_written[key] = time.monotonic()
        return None
    if isinstance(step, Live):
        if step.backoff:
            return ctx.queue.failed(_key(facts))
        return step.again if changed or step.again else None
    return 0 if changed else None


def _told(ctx: Context, facts: RunFacts, step: Show) -> None:
    """The log line and metrics of a status that changed."""
    run, attempt = facts.run, facts.attempt
    ns, name = facts.meta["namespace"], facts.name
    pod_key = (ns, facts.pod_name)
    last_pod = None
    if isinstance(step, Finish | Wait) or (
            isinstance(step, Live) and step.reason in (Reason.RETRYING, Reason.RESUMING)):
        # The attempt's last pod, cached or (deleted, as by an eviction) as last seen; the
        # attempt is settled, its last state no longer needed.
        gone = ctx.gone.pop(pod_key, None)
        last_pod = (ctx.pods.get(pod_key) if ctx.pods is not None else None) or gone
    if isinstance(step, Finish):
        ctx.usage_written.pop((ns, name), None)
        _log(run, "settled", attempt=attempt, phase=step.phase, reason=step.reason,
             tools=step.tools)
        metrics.settled(step.phase, step.reason,
                        None if step.tools is None else list(step.tools), last_pod)
    elif isinstance(step, Wait):
        ctx.usage_written.pop((ns, name), None)
        _log(run, "awaiting-approval", attempt=attempt, tool=step.call.tool,
             seq=step.call.seq)
    elif isinstance(step, Live) and step.reason == Reason.RETRYING:
        _log(run, "retry", attempt=attempt + 1, after=step.after)
        metrics.retried(step.after)
    elif isinstance(step, Live) and step.decided is not None:
        _log(run, "approval-decided", attempt=attempt + 1, decision=step.decided.decision,
             approver=step.decided.approver)
    elif isinstance(step, Live) and step.reason == Reason.RESUMING:
        _log(run, "resume", attempt=attempt + 1, after=step.after)
        metrics.resumed(step.after)


async def _stop_pod(ctx: Context, facts: RunFacts) -> None:
    """Deletes attempt n's runner pod, and only the pod this run created: the delete
    carries the pod's uid as a precondition (the one the store recorded, else the cached
    pod's if the run owns it). A pod of that name that is not the run's (created by
    someone who may not delete pods themselves) is never touched."""
    known = facts.known
    uid = known.attempt.pod_uid if known is not None and known.attempt is not None else None
    if uid is None:
        cached = facts.pod if facts.pod is not None else await ctx.pod(
            facts.meta["namespace"], facts.pod_name)
        uid = cached["metadata"]["uid"] if cached is not None and owns(
            facts.run, cached) else None
    if uid is not None:
        await ctx.kube.delete_pod(facts.meta["namespace"], facts.pod_name, uid)


# -- launching and starting ------------------------------------------------------------------


def _record(run: Mapping[str, Any], digest: str | None,
            agent_digest: str | None = None) -> dict[str, Any]:
    """record_run's arguments: the run's row in the store, written before anything runs."""
    meta, spec = run["metadata"], run.get("spec") or {}
    return {"uid": meta["uid"], "namespace": meta["namespace"], "name": meta["name"],
            "agent": spec["agent"], "trigger": spec.get("trigger") or "manual",
            "user_id": spec.get("userId") or DEFAULT_USER_ID, "input_digest": digest,
            "replay_of": spec.get("replayOf"), "agent_digest": agent_digest,
            "labels": meta.get("labels"),
            "annotations": history.kept_annotations(meta.get("annotations")), "spec": spec}


async def _record_run(ctx: Context, run: Mapping[str, Any], digest: str | None,
                      agent_digest: str | None = None) -> None:
    """The run's row in the store (idempotent)."""
    await store.record_run(ctx.engine, **_record(run, digest, agent_digest))


@dataclasses.dataclass(frozen=True)
class _Launching:
    """What a launch writes with attempt 1: the run's row, its input, its status fields."""

    record: dict[str, Any] | None
    snapshot: store.Snapshot | None
    fields: dict[str, Any]
    agent_digest: str | None


async def _launch(ctx: Context, facts: RunFacts, step: Launch) -> float | None:
    """Pin the Agent and snapshot the input (written down with attempt 1, in one
    transaction), then start attempt 1."""
    run, spec, meta = facts.run, facts.spec, facts.meta
    known = facts.known
    if step.recorded and known is not None and known.run is not None:
        digest, agent_digest = known.run.input_digest, known.run.agent_digest
        record, snapshot = None, None
    else:
        # The Agent first: a definition that cannot run refuses the run before its input
        # is copied. Pinned once, with the input: every attempt, resume and replay of the
        # run builds this snapshot, whatever the Agent says later.
        pinned = await agent_pin(ctx, run)
        if pinned.refusal is not None:
            return await _end(ctx, facts, refused(*pinned.refusal, record=True))
        agent_digest = pinned.digest
        full = run
        if "input" not in spec:  # a copy made without it: read the run itself
            found = await ctx.kube.read_run(meta["namespace"], meta["name"])
            if found is None or found["metadata"]["uid"] != meta["uid"]:
                return None
            full = found
        try:
            digest, snapshot = await _snapshot(ctx, full)
        except InputMissing as e:
            return await _end(ctx, facts, refused(Reason.INPUT_UNAVAILABLE, say(
                f"{Reason.INPUT_UNAVAILABLE}/missing", problem=e), record=True))
        except InputForbidden as e:
            return await show(ctx, facts, Live(
                Phase.PENDING, Reason.INPUT_FORBIDDEN, say(Reason.INPUT_FORBIDDEN, problem=e),
                backoff=True))
        if digest is None:
            return await _end(ctx, facts, refused(Reason.INPUT_UNAVAILABLE, say(
                f"{Reason.INPUT_UNAVAILABLE}/replay", original=spec.get("replayOf")),
                record=True))
        record = _record(run, digest, agent_digest)
    launching = _Launching(record, snapshot, {
        "inputDigest": digest, **({"agentDigest": agent_digest} if agent_digest else {})},
        agent_digest)
    begun = start_of(facts, facts.attempt)
    if isinstance(begun, Settle):
        return await _end(ctx, facts, begun, launching)
    return await _start(ctx, facts, begun, launching)


async def _snapshot(ctx: Context, run: Mapping[str, Any]
                    ) -> tuple[str | None, store.Snapshot | None]:
    """The run's input snapshot: its digest, and what to write (the text and every file,
    copied now). A replay runs on the original's snapshot, found through the approval that
    created it (the store's record, which only the operator writes), never through
    anything a user could edit; no digest if that is gone."""
    meta, spec = run["metadata"], run.get("spec") or {}
    if spec.get("replayOf"):
        approval = await store.approval_of_replay_run(ctx.engine, meta["namespace"],
                                                      meta["name"])
        original = None
        if approval is not None and approval.run_name == spec["replayOf"]:
            original = await store.get_run(ctx.engine, approval.run_uid)
        digest = original.input_digest if original is not None else None
        if digest and await store.get_input(ctx.engine, digest) is not None:
            return digest, None
        return None, None
    source = spec.get("input") or {}
    files = await ctx.kube.read_input_files(meta["namespace"], source.get("files") or [])
    text = source.get("text") or ""
    digest = store.input_digest(text, files, key=await ctx.input_key())
    return digest, store.Snapshot(digest, text, files)


async def _start(ctx: Context, facts: RunFacts, step: Start,
                 launching: _Launching | None = None) -> float | None:
    """Writes attempt `step.attempt` down (with the run itself when launching), then
    creates its pod; shows Pending, PodCreated (with the launch's fields: one write)."""
    run, meta, spec = facts.run, facts.meta, facts.spec
    attempt, session = step.attempt, step.session
    resumes, resumes_run = step.resumes, None
    name = pod_name(meta["name"], attempt)
    if attempt == 1 and spec.get("replayOf"):
        approval = await store.approval_of_replay_run(ctx.engine, meta["namespace"],
                                                      meta["name"])
        if approval is not None and approval.resume:
            # A manual resume: continue a copy (fork) of the original's last attempt's
            # session; the original's session, ledger and run stay as they are.
            original = await store.get_run(ctx.engine, approval.run_uid)
            last = await store.get_attempt(ctx.engine, approval.run_uid,
                                           original.attempts if original else 1)
            if last is None or not last.session_id or not last.app_name:
                return await _end(ctx, facts, refused(Reason.INPUT_UNAVAILABLE, say(
                    f"{Reason.INPUT_UNAVAILABLE}/journal", original=spec["replayOf"])),
                    launching)
            await store.fork_session(ctx.engine, app_name=last.app_name,
                                     user_id=last.user_id or "", source=last.session_id,
                                     target=session)
            resumes, resumes_run = last.attempt, approval.run_uid
    known = facts.known
    agent_digest = launching.agent_digest if launching is not None else (
        known.run.agent_digest if known is not None and known.run is not None else None)
    digest = launching.fields["inputDigest"] if launching is not None else (
        known.run.input_digest if known is not None and known.run is not None else None)
    # The pinned Agent's Secret headers become env from those Secrets (valueFrom: the
    # kubelet puts the values in, the operator never reads them).
    snapshot = await store.get_agent(ctx.engine, agent_digest) if agent_digest else None
    if agent_digest and snapshot is None:
        return await _end(ctx, facts, refused(Reason.AGENT_NOT_FOUND, say(
            Reason.AGENT_NOT_FOUND, digest=agent_digest)), launching)
    claim = await store.launch_attempt(
        ctx.engine, meta["uid"], attempt, session, name, namespace=meta["namespace"],
        agent=spec["agent"], user_id=spec.get("userId") or DEFAULT_USER_ID,
        resumes_attempt=resumes, resumes_run_uid=resumes_run,
        record=launching.record if launching is not None else None,
        snapshot=launching.snapshot if launching is not None else None)
    fields = launching.fields if launching is not None else {}
    if launching is not None:
        pinned = f" and the Agent as {agent_digest}" if agent_digest else ""
        events.post(run, Reason.CREATED, say(Reason.CREATED, digest=digest, pinned=pinned))
    if not claim.granted:
        if claim.busy_with:
            return await _end(ctx, facts, refused(Reason.SESSION_BUSY, say(
                Reason.SESSION_BUSY, session=session, holder=claim.busy_with)))
        return await _end(ctx, facts, refused(Reason.SESSION_NOT_OWNED, say(
            f"{Reason.SESSION_NOT_OWNED}/owned", session=session,
            namespace=meta["namespace"], owner=claim.owned_by)))
    account_name = spec.get("serviceAccountName")
    runner_account = (meta["namespace"], ctx.config.runner_service_account)
    if not account_name and runner_account not in ctx.service_accounts:
        # One worker asks; the others launching in this namespace wait for its answer.
        async with ctx.service_account_locks.setdefault(runner_account, asyncio.Lock()):
            if runner_account not in ctx.service_accounts:
                await ctx.kube.ensure_service_account(*runner_account)
                ctx.service_accounts.add(runner_account)
    try:
        made = await ctx.kube.create_pod(runner_pod(
            run, attempt, session, str(digest), ctx.config, agent_digest=agent_digest,
            agent_env=agents.secret_env(snapshot) if snapshot is not None else ()))
    except ApiException as e:
        answer = create_refused(facts, step, int(e.status or 0), str(e.reason),
                                api_message(e), fields)
        if isinstance(answer, Settle):
            return await _end(ctx, facts, answer)
        assert isinstance(answer, Live)
        return await show(ctx, facts, answer)
    if made is not None:
        metrics.ATTEMPTS_STARTED.inc()
    else:
        existing = await ctx.kube.read_pod(meta["namespace"], name)
        if existing is None:
            return 2.0  # deleted between the create and the read: try again
        if not owns(run, existing):
            taken = name_taken(facts, existing, fields)
            return await show(ctx, facts, taken) if isinstance(taken, Live) else \
                await act(ctx, facts, taken)
        made = existing
    await store.record_pod(ctx.engine, meta["uid"], attempt, made["metadata"]["uid"])
    ctx.expected[(meta["namespace"], name)] = time.monotonic()
    ctx.queue.forget(_key(facts))
    _log(run, "pod-created", attempt=attempt, pod=name)
    return await show(ctx, facts, created(facts, step, fields))


async def _end(ctx: Context, facts: RunFacts, settle: Settle,
               launching: _Launching | None = None) -> float | None:
    """A launch or start refused before its pod: the run (written down first, with its
    input when launching) ends, as any run ends."""
    if launching is not None and launching.record is not None:
        await store.record_launch(ctx.engine, launching.record, launching.snapshot)
        settle = dataclasses.replace(settle, record=False)
    return await act(ctx, facts, settle)


# -- expiry ------------------------------------------------------------------------------------


async def _expire(ctx: Context, facts: RunFacts, step: Expire) -> float | None:
    """The run's time to live is up: its decided replays and its approvals go (they hold
    no ownerReference to it), then the run (only if it is still this run; its finalizer
    lets it go at once, the store's record stays)."""
    meta = facts.meta
    ns = meta["namespace"]
    for plural, objects in ((REPLAY_PLURAL, step.replays), (APPROVAL_PLURAL, step.approvals)):
        for obj in objects:
            await ctx.kube.delete_object(plural, ns, obj["metadata"]["name"],
                                         obj["metadata"]["uid"])
    if await ctx.kube.delete_run(ns, facts.name, meta["uid"]):
        _log(facts.run, "expired", phase=facts.phase)
        metrics.RUNS_EXPIRED.inc()
    return None


# -- steps taken directly (tests, tools) --------------------------------------------------------


async def _with_runner_account(ctx: Context, uid: str, attempt: int,
                               outcome: Outcome) -> Outcome:
    """The cluster's `outcome` of attempt `attempt`, weighed against the runner's own
    account as the store holds it (run.account)."""
    recorded: store.Outcome | Any | None
    try:
        recorded = await store.get_outcome(ctx.engine, uid, attempt)
    except Exception as e:  # the store may be down: the pod's account stands
        log.warning("event=outcome-unreadable uid=%s attempt=%s error=%r", uid, attempt, e)
        metrics.STORE_ERRORS.labels("outcome").inc()
        recorded = UNKNOWN
    return account(outcome, recorded)


async def _finish(ctx: Context, run: Mapping[str, Any], attempt: int,
                  outcome: Outcome) -> float | None:
    """Ends attempt `attempt` (the run's current one) with the cluster's `outcome`, as a
    sync that saw it would: weighed against the runner's account, settled, shown."""
    assert attempt == current_attempt(run.get("status") or {})
    told = await _with_runner_account(ctx, run["metadata"]["uid"], attempt, outcome)
    # The fence needs only the run: the facts are gathered after it.
    return await act(ctx, RunFacts(run=run), Settle(told))

