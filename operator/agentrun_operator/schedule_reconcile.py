"""An AgentRunSchedule: gather the facts, call the pure decision (schedule.py), act on it.

One step of the same level-based reconciler and work queue as runs and replays (key
("schedule", namespace, name)). Schedule events, the events of its runs (label
agentrun.dev/schedule) and the deadline of its next slot (`add_after`, never a poll) put
the key on the queue; a worker then reads the schedule (the cache kopf's watch keeps), its
runs (the same cache, found through an index by label) and the clock, asks
`schedule_decide`, and takes the one action it returns:

    create   -> the slot's AgentRun `<schedule>-<slot Unix seconds>`: a replica or a
                restarted operator that tries again gets 409 and finds it
    cancel   -> annotate the live runs agentrun.dev/cancel (Replace): cancel in place
    prune    -> delete settled runs beyond the history limits (uid precondition)
    record, skip, miss, pass, wait, stall, nothing
             -> only the status says it

then writes the schedule's whole status if it changed (its resourceVersion as the
precondition: a stale reconcile loses with Conflict and runs again on the newer state) and
returns when the next slot comes due.

The cache of runs may lag behind kopf's watch just after the operator starts, and a live
run it has not seen must not let Forbid start a second one: a replica that starts leading
lists every run of a schedule once (`list_schedule_runs`) before its workers start; if
that list fails, each schedule lists its own runs from the API server before it creates one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kubernetes.client.exceptions import ApiException

from agentrun.scheduled import belongs_to, scheduled_run
from agentrun.vocabulary import (
    ANNOTATION_CANCEL,
    ANNOTATION_CANCEL_NOTE,
    LABEL_SCHEDULE,
    SCHEDULE_PLURAL,
    ScheduleReason,
)
from agentrun_operator import events, metrics
from agentrun_operator.controller import Context, now, slim_run
from agentrun_operator.kube import api_message
from agentrun_operator.schedule import (
    CANCEL,
    CREATE,
    MISS,
    PASS,
    PRUNE,
    RECORD,
    SKIP,
    STALL,
    ScheduleDecision,
    run_facts,
    schedule_decide,
    schedule_facts,
    schedule_status,
)
from agentrun_operator.slots import InvalidSchedule, Slots, parse

log = logging.getLogger("agentrun.operator")

# Woken this long after a slot's time, so that the slot has come due by the clock.
WAKE_AFTER_SLOT = 0.01


def index_run(ctx: Context, run: Mapping[str, Any], deleted: bool) -> str | None:
    """Keeps ctx.schedule_runs in step with a run's watch event; returns the schedule it
    belongs to (by label), whose key then goes on the queue."""
    meta = run.get("metadata") or {}
    schedule = (meta.get("labels") or {}).get(LABEL_SCHEDULE)
    if not schedule:
        return None
    names = ctx.schedule_runs.setdefault((meta.get("namespace") or "", schedule), set())
    if deleted:
        names.discard(meta.get("name") or "")
    else:
        names.add(meta.get("name") or "")
    return str(schedule)


async def list_schedule_runs(ctx: Context, named: Sequence[str],
                             watched: Callable[[str], bool]) -> None:
    """Every run of a schedule in the watched namespaces, into the cache and the index
    (by the label agentrun.dev/schedule: one list per namespace `named` outright, else one
    for the cluster, kept to the `watched` namespaces)."""
    selector = LABEL_SCHEDULE
    try:
        found = [r for ns in named for r in await ctx.kube.list_runs(ns, selector)] if named \
            else [r for r in await ctx.kube.list_runs_everywhere(selector)
                  if watched(r["metadata"].get("namespace") or "")]
    except Exception as e:  # leading goes on: each schedule lists its own runs instead
        log.warning("event=schedule-runs-not-listed error=%r", e)
        ctx.schedule_runs_listed = False
        return
    for run in found:
        if (run["metadata"]["namespace"], run["metadata"]["name"]) not in ctx.runs:
            ctx.remember(run)
        index_run(ctx, run, False)
    ctx.schedule_runs_listed = True
    log.info("event=schedule-runs-listed runs=%s", len(found))


def runs_of(ctx: Context, schedule: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The schedule's own runs in the cache (its label, and it as their controller)."""
    meta = schedule["metadata"]
    names = ctx.schedule_runs.get((meta["namespace"], meta["name"]), set())
    found = []
    for name in sorted(names):
        run = ctx.runs.get((meta["namespace"], name))
        if run is not None and belongs_to(schedule, run):
            found.append(run)
    return found


def _log(schedule: Mapping[str, Any], event: str, **fields: Any) -> None:
    meta = schedule["metadata"]
    extra = " ".join(f"{k}={v!r}" if isinstance(v, str) and " " in v else f"{k}={v}"
                     for k, v in fields.items())
    log.info("event=%s schedule=%s/%s %s", event, meta["namespace"], meta["name"], extra)


def _slots(schedule: Mapping[str, Any]) -> Slots | InvalidSchedule:
    spec = schedule.get("spec") or {}
    try:
        return parse(spec.get("schedule"), spec.get("timeZone"))
    except InvalidSchedule as e:
        return e


async def reconcile_schedule(ctx: Context, namespace: str, name: str) -> float | None:
    """Takes the one next step of AgentRunSchedule `namespace/name`; returns in how many
    seconds to look again (its next slot). Raises kube.Conflict when a write lost."""
    schedule = ctx.schedules.get((namespace, name))
    if schedule is None and ctx.pods is None:  # no caches (a step called directly)
        schedule = await ctx.kube.read_schedule(namespace, name)
    if schedule is None or (schedule.get("metadata") or {}).get("deletionTimestamp"):
        return None
    slots = _slots(schedule)
    facts = schedule_facts(schedule)
    runs = runs_of(ctx, schedule) if ctx.pods is not None else await _listed(ctx, schedule)
    moment = now()
    decision = schedule_decide(facts, [run_facts(name, r) for r in runs], moment, slots)
    if decision.action == CREATE and ctx.pods is not None and not ctx.schedule_runs_listed:
        # Decide again on the API server's own list before starting anything.
        runs = await _listed(ctx, schedule)
        decision = schedule_decide(facts, [run_facts(name, r) for r in runs], moment, slots)
    if decision.action == CREATE:
        done = await _create(ctx, schedule, decision)
        if done is None:
            return ctx.queue.failed(("schedule", namespace, name))
        decision, created = done
        if created is not None:
            runs = [*runs, created]
    elif decision.action == CANCEL:
        await _cancel(ctx, schedule, runs, decision)
    elif decision.action == PRUNE:
        await _prune(ctx, schedule, runs, decision)
    previous = schedule.get("status") or {}
    status = schedule_status(facts, [run_facts(name, r) for r in runs], decision, moment,
                             previous)
    if status != previous:
        ctx.keep(ctx.schedules, await ctx.kube.replace_status(SCHEDULE_PLURAL, schedule, status))
        _told(schedule, decision, previous)
    # What follows a cancel or a delete comes with the runs' own events.
    again = decision.look_again
    return None if again is None else max(
        0.0, (again - now()).total_seconds()) + WAKE_AFTER_SLOT


async def _listed(ctx: Context, schedule: Mapping[str, Any]) -> list[dict[str, Any]]:
    meta = schedule["metadata"]
    listed = await ctx.kube.list_runs(meta["namespace"], f"{LABEL_SCHEDULE}={meta['name']}")
    for run in listed:
        ctx.remember(run)
        index_run(ctx, run, False)
    return [r for r in listed if belongs_to(schedule, r)]


async def _create(ctx: Context, schedule: Mapping[str, Any], decision: ScheduleDecision
                  ) -> tuple[ScheduleDecision, dict[str, Any] | None] | None:
    """Creates the slot's run. Already there and the schedule's: recorded as created. There
    and not the schedule's (someone took the name): the slot is missed, and said so. The
    API server refusing: said on the schedule (an Event), retried with backoff (None)."""
    assert decision.slot is not None
    meta = schedule["metadata"]
    manifest = scheduled_run(schedule, decision.slot)
    run = manifest["metadata"]["name"]
    try:
        created = await ctx.kube.create_run(manifest)
    except ApiException as e:
        said = (f"AgentRun {run} for the slot of {decision.slot.isoformat()} could not be "
                f"created ({e.status} {e.reason}): {api_message(e)}. Retrying with backoff.")
        events.post(schedule, ScheduleReason.RUN_CREATION_FAILED, said, warning=True)
        log.warning("event=schedule-run-not-created schedule=%s/%s run=%s status=%s "
                    "message=%r", meta["namespace"], meta["name"], run, e.status,
                    api_message(e))
        return None
    if created is None:
        found = await ctx.kube.read_run(meta["namespace"], run)
        if found is None:
            return None  # deleted between the create and the read: again
        if not belongs_to(schedule, found):
            said = (f"Missed the slot of {decision.slot.isoformat()}: AgentRun {run} already "
                    "exists and is not this schedule's run; no run was started.")
            events.post(schedule, ScheduleReason.RUN_CREATION_FAILED, said, warning=True)
            return ScheduleDecision(MISS, said, decision.slot, (), decision.passed_over,
                                    decision.next_slot), None
        ctx.remember(found)
        index_run(ctx, found, False)
        return ScheduleDecision(RECORD, "", decision.slot, (run,), decision.passed_over,
                                decision.next_slot), slim_run(found)
    lag = (now() - decision.slot).total_seconds()
    ctx.remember(created)
    index_run(ctx, created, False)
    metrics.SCHEDULE_START_DELAY.observe(max(lag, 0.0))
    metrics.SCHEDULE_SLOTS.labels("created").inc()
    if decision.passed_over:
        metrics.SCHEDULE_SLOTS.labels("missed").inc(decision.passed_over)
    _log(schedule, "schedule-run-created", run=run, slot=int(decision.slot.timestamp()),
         lag=f"{lag:.3f}", passed_over=decision.passed_over)
    events.post(schedule, ScheduleReason.RUN_CREATED, decision.message + (
        f" {decision.passed_over} earlier slots came due while the operator could not act "
        "and were missed." if decision.passed_over else ""))
    return decision, slim_run(created)


async def _cancel(ctx: Context, schedule: Mapping[str, Any], runs: Sequence[Mapping[str, Any]],
                  decision: ScheduleDecision) -> None:
    """Replace: cancel each live run in place (the run's own reconcile fences and stops it,
    and keeps it, Cancelled)."""
    meta = schedule["metadata"]
    assert decision.slot is not None
    note = (f"replaced by the slot of {decision.slot.isoformat()} of AgentRunSchedule "
            f"{meta['name']} (concurrencyPolicy Replace)")
    asked = {ANNOTATION_CANCEL: "true", ANNOTATION_CANCEL_NOTE: note}
    for run in runs:
        run_meta = run["metadata"]
        if run_meta["name"] in decision.runs and await ctx.kube.annotate_run(
                meta["namespace"], run_meta["name"], run_meta["uid"], asked):
            # The cache shows it at once: the next look waits instead of asking again.
            key = (meta["namespace"], run_meta["name"])
            cached = ctx.runs.get(key)
            if cached is not None:
                ctx.runs[key] = {**cached, "metadata": {**cached["metadata"], "annotations": {
                    **(cached["metadata"].get("annotations") or {}), **asked}}}
    _log(schedule, "schedule-replacing", runs=",".join(decision.runs),
         slot=int(decision.slot.timestamp()))
    events.post(schedule, ScheduleReason.REPLACING, decision.message)


async def _prune(ctx: Context, schedule: Mapping[str, Any], runs: Sequence[Mapping[str, Any]],
                 decision: ScheduleDecision) -> None:
    """Deletes the settled runs beyond the history limits (each only if it is still the run
    the decision saw); their finalizer keeps each until the store holds its record."""
    meta = schedule["metadata"]
    for run in runs:
        if run["metadata"]["name"] in decision.runs:
            await ctx.kube.delete_run(meta["namespace"], run["metadata"]["name"],
                                      run["metadata"]["uid"])
    _log(schedule, "schedule-runs-deleted", runs=",".join(decision.runs))
    events.post(schedule, ScheduleReason.RUN_DELETED, decision.message)


def _told(schedule: Mapping[str, Any], decision: ScheduleDecision,
          previous: Mapping[str, Any]) -> None:
    """The Event and log line of what only the status shows (once: it is posted when the
    status changed)."""
    slot = decision.slot
    if decision.action == SKIP and slot is not None:
        metrics.SCHEDULE_SLOTS.labels("skipped").inc()
        metrics.SCHEDULE_SLOTS.labels("missed").inc(decision.passed_over)
        _log(schedule, "schedule-slot-skipped", slot=int(slot.timestamp()),
             live=",".join(decision.runs))
        events.post(schedule, ScheduleReason.SLOT_SKIPPED, decision.message)
    elif decision.action == MISS and slot is not None:
        metrics.SCHEDULE_SLOTS.labels("missed").inc(decision.passed_over + 1)
        _log(schedule, "schedule-slot-missed", slot=int(slot.timestamp()),
             passed_over=decision.passed_over)
        events.post(schedule, ScheduleReason.SLOT_MISSED, decision.message + (
            f" {decision.passed_over} earlier slots were missed too."
            if decision.passed_over else ""), warning=True)
    elif decision.action == PASS:
        metrics.SCHEDULE_SLOTS.labels("passed").inc()
    elif decision.action == STALL:
        stalled = [c for c in previous.get("conditions") or [] if c.get("type") == "Stalled"
                   and c.get("status") == "True" and c.get("message") == decision.message]
        if not stalled:
            _log(schedule, "schedule-invalid", message=decision.message)
            events.post(schedule, ScheduleReason.INVALID_SCHEDULE, decision.message,
                        warning=True)
