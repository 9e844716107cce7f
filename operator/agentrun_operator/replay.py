"""An AgentRunReplay: gather the facts, call the pure decision (decide.py), act on it.

Approval creates a NEW AgentRun (the original is never modified) named after the replay,
deterministically, so that a handler that runs again after an operator restart finds the
run it created instead of creating a second one. The approval itself is recorded in the
store first, atomically (one non-forced approval per original, see store.approve_replay);
a handler that runs again reads that record back and finishes the same approval.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from collections.abc import Callable, Mapping
from typing import Any

from kubernetes.client.exceptions import ApiException

from agentrun import agents, history, store
from agentrun.vocabulary import (
    ANNOTATION_CREATED_BY,
    ANNOTATION_INPUT_DIGEST,
    ANNOTATION_REQUESTED_BY,
    API_VERSION,
    LABEL_REPLAY_OF,
    REPLAY_PLURAL,
    RUN_KIND,
    Condition,
    Phase,
    ReplayPhase,
    ReplayReason,
)
from agentrun_operator import authorize, events, metrics
from agentrun_operator import status as st
from agentrun_operator.controller import Context, now
from agentrun_operator.decide import (
    Decision,
    Journal,
    Original,
    decide,
    decide_resume,
    is_forced,
    replay_decided,
)
from agentrun_operator.journal import journal_of
from agentrun_operator.kube import api_message

log = logging.getLogger("agentrun.operator")

# A run's name is also a label value and its pods are `<run>-<attempt>`: keep it short.
_MAX_RUN_NAME = 60
# The spec fields a replay run does not take over: it runs in a fresh session, and its
# replayOf names the run it replays (set below).
_NOT_COPIED = ("sessionId", "replayOf")


def replay_run_name(replay: Mapping[str, Any]) -> str:
    """The new AgentRun's name: the replay's name and a digest of its uid. Deterministic
    (a retried handler finds its own run) and distinct from any run a user named."""
    meta = replay["metadata"]
    suffix = hashlib.sha256(meta["uid"].encode()).hexdigest()[:5]
    base = meta["name"][: _MAX_RUN_NAME - len(suffix) - 1].rstrip("-.")
    return f"{base}-{suffix}"


def replay_run(
    replay: Mapping[str, Any], original: Mapping[str, Any], name: str, digest: str
) -> dict[str, Any]:
    """The replay run's manifest: the original's spec on the original's input snapshot
    (named by digest: its ConfigMaps may be gone by now), in a fresh session, for the same
    user. Its creator (agentrun.dev/created-by) is the replay's requester, as admission
    recorded them: they asked for it, so they may not approve its calls."""
    meta = replay["metadata"]
    run_name = original["metadata"]["name"]
    spec = {k: v for k, v in (original.get("spec") or {}).items() if k not in _NOT_COPIED}
    spec["replayOf"] = run_name
    if (replay.get("spec") or {}).get("limits"):
        # A resume with raised (or lowered) limits: they replace the original's.
        spec["limits"] = dict(replay["spec"]["limits"])
    annotations = {ANNOTATION_INPUT_DIGEST: digest}
    requester = (meta.get("annotations") or {}).get(ANNOTATION_REQUESTED_BY)
    if requester:
        annotations[ANNOTATION_CREATED_BY] = requester
    return {
        "apiVersion": API_VERSION,
        "kind": RUN_KIND,
        "metadata": {
            "name": name,
            "namespace": meta["namespace"],
            "labels": {LABEL_REPLAY_OF: run_name},
            "annotations": annotations,
        },
        "spec": spec,
    }


async def archived_run(ctx: Context, namespace: str, name: str) -> dict[str, Any] | None:
    """The most recent run of that name the store recorded, as an AgentRun (its spec,
    labels and attempts as recorded at launch), once its AgentRun has left the API server
    (history.md); None when there is none, or its record predates recorded specs."""
    recorded = await store.latest_named(ctx.engine, namespace, name)
    if recorded is None or not recorded.spec:
        return None
    meta: dict[str, Any] = {"name": recorded.name, "namespace": recorded.namespace,
                            "uid": recorded.uid}
    if recorded.labels:
        meta["labels"] = dict(recorded.labels)
    return {"apiVersion": API_VERSION, "kind": RUN_KIND, "metadata": meta,
            "spec": dict(recorded.spec),
            "status": {"phase": history.PHASE_OF[recorded.status], "attempts": recorded.attempts}}


async def original_facts(ctx: Context, original: Mapping[str, Any] | None) -> Original | None:
    """What decide() needs to know about the run to replay; None if it does not exist.

    Read from the store, by the run's uid: its tools, its snapshot, how it ended. The
    AgentRun's status is a copy anyone allowed to write it could change. The one thing
    the status adds is liveness: the run is live if either says so (between an attempt's
    settle and the next attempt's start, only the status still says Running).
    """
    if original is None:
        return None
    recorded = await store.get_run(ctx.engine, original["metadata"]["uid"])
    shown = (original.get("status") or {}).get("phase") or Phase.PENDING
    if recorded is None:  # not written down yet: the operator has not launched it
        return Original(phase=Phase.PENDING, tools_executed=None, input_digest=None,
                        input_available=False, reason="")
    phase = history.PHASE_OF[recorded.status]
    if shown in Phase.LIVE and phase in Phase.TERMINAL:
        phase = shown
    digest = recorded.input_digest
    available = bool(digest) and await store.get_input(ctx.engine, str(digest)) is not None
    tools = recorded.tools_executed
    return Original(phase=phase, tools_executed=None if tools is None else list(tools),
                    input_digest=digest or None, input_available=available,
                    reason=recorded.reason or "")


async def reconcile_replay(ctx: Context, namespace: str, name: str) -> float | None:
    """The work queue's entry point: the replay as the watch last showed it."""
    replay = ctx.replays.get((namespace, name))
    if replay is None and ctx.pods is None:  # no caches (a step called directly)
        replay = await ctx.kube.read_replay(namespace, name)
    if replay is None:
        return None
    return await reconcile(ctx, replay)


async def reconcile(ctx: Context, replay: Mapping[str, Any]) -> float | None:
    """Decides a replay (while it is undecided, and again when the force annotation is
    added to a Refused one) and applies the decision. An Approved replay whose run exists
    is final. Returns when to try again (a run that could not be created yet)."""
    meta, spec, status = replay["metadata"], replay.get("spec") or {}, replay.get("status") or {}
    forced = is_forced(meta.get("annotations"))
    if replay_decided(replay):
        return None
    run_name = spec["runName"]
    original = await ctx.kube.read_run(meta["namespace"], run_name)
    archived = original is None
    if archived:
        original = await archived_run(ctx, meta["namespace"], run_name)
    facts = await original_facts(ctx, original)
    new_name = replay_run_name(replay)
    journal = None
    if spec.get("resume") and original is not None and facts is not None:
        last = int((original.get("status") or {}).get("attempts") or 1)
        journal = await journal_of(ctx.engine, original["metadata"]["uid"], last)

    recorded = await store.get_replay_approval(ctx.engine, meta["uid"])
    # Asked of the authorizer while undecided: once approved, the approval stands.
    unauthorized = None if recorded is not None or original is None else \
        await authorize.missing(ctx.kube, replay, original,
                                await _agent_secrets(ctx, original))

    def decide_now(already_replayed_by: str | None) -> Decision:
        """The plain replay's table, or the resume's (spec.resume)."""
        if journal is not None:
            return decide_resume(run_name, facts, journal,
                                 already_replayed_by=already_replayed_by, forced=forced,
                                 unauthorized=unauthorized)
        if spec.get("resume"):  # no original to read a journal of
            return decide_resume(run_name, facts, Journal(False),
                                 already_replayed_by=already_replayed_by, forced=forced,
                                 unauthorized=unauthorized)
        return decide(run_name, facts, already_replayed_by=already_replayed_by, forced=forced,
                      unauthorized=unauthorized)

    if recorded is not None:
        # This handler ran before and approved: finish that approval, decide nothing anew.
        decision = Decision(ReplayPhase.APPROVED, recorded.reason, recorded.message)
        tools = recorded.tools_executed
    else:
        decision = decide_now(None)
        tools = None if facts is None or facts.tools_executed is None else list(
            facts.tools_executed)
        if decision.approved:
            decision = await _claim(ctx, replay, original, facts, decision, new_name,
                                    decide_now, resume=bool(spec.get("resume")))

    if decision.approved:
        if original is not None and facts is not None and facts.input_digest:
            try:
                await _create_run(ctx, replay_run(replay, original, new_name,
                                                  facts.input_digest))
            except ApiException as e:
                return await _run_not_created(ctx, replay, decision, facts, tools, new_name,
                                              e.status, e.reason, api_message(e))
            except NotOurRun as e:
                return await _run_not_created(ctx, replay, decision, facts, tools, new_name,
                                              409, "Conflict", str(e))
        elif await ctx.kube.read_run(meta["namespace"], new_name) is None:
            # Approved before, but the original (or its snapshot's name) vanished before
            # its run was created: say so rather than create a run on nothing.
            decision = decide_now(None)
    if forced and not decision.approved:
        # A forcer asked and it still is a refusal: the status says the annotation was
        # examined, so it changes (and its Event tells the forcer) once.
        decision = dataclasses.replace(decision, message=f"{decision.message} {FORCE_SEEN}")
    if not decision.approved and _says_already(status, decision):
        # Decided so already: a forced replay that stays refused is looked at again on
        # every change of it, its own status write included. One status write and one
        # Event per decision, not per look (else each write brings the next).
        return None
    # Logged as decided before the status write, which a replica that decided the same
    # at the same moment may lose (Conflict): the decision itself went through the store.
    _log(replay, decision, new_name if decision.approved else None)
    await _write_status(ctx, replay, decision, facts, tools,
                        new_name if decision.approved else None)
    metrics.REPLAY_DECISIONS.labels(decision.phase, decision.reason).inc()
    events.post(replay, decision.reason, decision.message
                + (f" Created AgentRun {new_name}." if decision.approved else ""),
                warning=not decision.approved)
    if decision.approved and original is not None and not archived:
        events.post(original, "Replayed", f"AgentRunReplay {meta['name']} was approved "
                    f"({decision.reason}): AgentRun {new_name} runs it again on the same input.")
    return None


async def _run_not_created(
    ctx: Context, replay: Mapping[str, Any], decision: Decision, facts: Original | None,
    tools: list[str] | None, new_name: str, status: int, why: str, said: str,
) -> float | None:
    """The API server refused the replay run. The replay says so (Approved Unknown,
    RunCreationFailed, the server's message) instead of the operator's log alone. Invalid
    (422/400): it never will be created; the approval is released, so that another replay
    is not refused AlreadyReplayed for a run that never existed. Anything else (forbidden:
    the operator runs with a credential the replayOf policy refuses; the server): retried
    with backoff. A run of that name that is not this replay's (409) never goes away by
    itself either."""
    meta = replay["metadata"]
    permanent = status in (400, 409, 422)
    if permanent:
        await store.release_replay(ctx.engine, meta["uid"])
        message = (f"Approved ({decision.reason}), but the replay run {new_name} cannot be "
                   f"created ({status} {why}): {said}. The approval was released; create a "
                   "new AgentRunReplay once that is resolved.")
    else:
        message = (f"Approved ({decision.reason}), but the replay run {new_name} could not be "
                   f"created ({status} {why}): {said}. Retrying with backoff"
                   + ("; the operator must run with its own credential (ServiceAccount "
                      "agentrun-operator, or a member of group agentrun:operators), which "
                      "the replayOf admission policy lets create replay runs" if status == 403
                      else "") + ".")
    failed = Decision(ReplayPhase.REFUSED if permanent else ReplayPhase.PENDING,
                      ReplayReason.RUN_CREATION_FAILED, message)
    await _write_status(ctx, replay, failed, facts, tools, None, condition_status="Unknown")
    metrics.REPLAY_DECISIONS.labels(failed.phase, failed.reason).inc()
    events.post(replay, ReplayReason.RUN_CREATION_FAILED, message, warning=True)
    log.warning("event=replay-run-not-created replay=%s/%s status=%s message=%r",
                meta["namespace"], meta["name"], status, said)
    if permanent:
        return None
    return ctx.queue.failed(("replay", meta["namespace"], meta["name"]))


async def _claim(
    ctx: Context, replay: Mapping[str, Any], original: Mapping[str, Any] | None,
    facts: Original | None, decision: Decision, new_name: str,
    decide_now: Callable[[str | None], Decision], *, resume: bool,
) -> Decision:
    """Records the approval atomically. When another replay already holds the original's
    one non-forced approval, decides again knowing it: AlreadyReplayed, or Forced."""
    assert original is not None and facts is not None
    meta = replay["metadata"]

    async def record(d: Decision) -> store.Claim:
        return await store.approve_replay(
            ctx.engine, uid=meta["uid"], namespace=meta["namespace"], name=meta["name"],
            run_uid=original["metadata"]["uid"], run_name=original["metadata"]["name"],
            forced=d.forced, reason=d.reason, message=d.message, replay_run_name=new_name,
            tools_executed=facts.tools_executed, resume=resume)

    claim = await record(decision)
    if claim.granted:
        return Decision(ReplayPhase.APPROVED, claim.approval.reason, claim.approval.message)
    decision = decide_now(claim.approval.name)
    if decision.approved:  # forced: not limited, but recorded
        claim = await record(decision)
        return Decision(ReplayPhase.APPROVED, claim.approval.reason, claim.approval.message)
    return decision


async def _agent_secrets(ctx: Context, original: Mapping[str, Any]) -> list[agents.SecretRef]:
    """The Secret headers of the Agent snapshot the original pinned (none for an image
    agent, or a snapshot gone: its replay run then fails AgentNotFound before any pod)."""
    recorded = await store.get_run(ctx.engine, original["metadata"]["uid"])
    if recorded is None or not recorded.agent_digest:
        return []
    snapshot = await store.get_agent(ctx.engine, recorded.agent_digest)
    return agents.secret_refs(snapshot) if snapshot is not None else []


class NotOurRun(Exception):
    """An AgentRun of the replay run's name exists and is not this replay's."""


async def _create_run(ctx: Context, manifest: Mapping[str, Any]) -> None:
    """Creates the replay run; finding it already there (a retried reconcile) is success,
    as long as it is this replay's run."""
    if await ctx.kube.create_run(manifest):
        return
    meta = manifest["metadata"]
    found = await ctx.kube.read_run(meta["namespace"], meta["name"])
    if found is None:  # deleted between the create and the read: try again
        raise RuntimeError(f"AgentRun {meta['name']} exists and does not; trying again")
    ours = ((found.get("spec") or {}).get("replayOf") == manifest["spec"]["replayOf"]
            and (found["metadata"].get("annotations") or {}).get(ANNOTATION_INPUT_DIGEST)
            == meta["annotations"][ANNOTATION_INPUT_DIGEST])
    if not ours:
        raise NotOurRun(f"AgentRun {meta['name']} already exists and is not this replay's run")


FORCE_SEEN = "The force annotation was examined: it does not change this refusal."


def _says_already(status: Mapping[str, Any], decision: Decision) -> bool:
    return (status.get("phase"), status.get("reason"), status.get("message")) == (
        decision.phase, decision.reason, decision.message)


async def _write_status(
    ctx: Context, replay: Mapping[str, Any], decision: Decision, facts: Original | None,
    tools: list[str] | None, new_name: str | None, *, condition_status: str | None = None,
) -> None:
    meta, previous = replay["metadata"], replay.get("status") or {}
    moment = now()
    before = list(previous.get("conditions") or [])
    condition = st.condition(Condition.APPROVED, condition_status or (
        "True" if decision.approved else "False"), decision.reason, decision.message, moment,
        before)
    patch = st.with_gitops_conditions({
        "phase": decision.phase, "reason": decision.reason, "message": decision.message,
        "decidedAt": st.stamp(moment),
        "conditions": [condition, *[c for c in before if c.get("type") in st.GITOPS_TYPES]],
    }, meta.get("generation"), moment)
    # toolsExecuted is a copy of the original's at decision time: only a settled original
    # has one (null: unknown, which is said, not left out).
    if facts is not None and facts.phase in Phase.TERMINAL:
        patch["toolsExecuted"] = tools
    if new_name is not None:
        patch["replayRunName"] = new_name
    if meta.get("resourceVersion"):
        # Only if the replay is still as we read it: a stale decision loses.
        written = await ctx.kube.replace_status(REPLAY_PLURAL, replay, {**previous, **patch})
        ctx.keep(ctx.replays, written)
    else:
        await ctx.kube.patch_replay_status(meta["namespace"], meta["name"], patch)


def _log(replay: Mapping[str, Any], decision: Decision, new_name: str | None) -> None:
    meta = replay["metadata"]
    log.info("event=replay-decided replay=%s/%s run=%s phase=%s reason=%s replay_run=%s",
             meta["namespace"], meta["name"], (replay.get("spec") or {}).get("runName"),
             decision.phase, decision.reason, new_name or "-")
