"""What does an AgentRunSchedule do now? One pure decision, and the status that shows it.

`schedule_decide(schedule, runs, now, slots)` takes the facts the reconcile gathered (the
schedule's spec and status, the AgentRuns that carry its label, the clock, the parsed
slots) and returns the one next action, and when the next slot comes due. No I/O happens
here; tests/operator/test_schedule.py holds the table, one row per rule below.

The slot in question is the latest that came due since the last one dealt with
(status.lastSlotTime, else the schedule's creation). Rules, first match wins:

| the schedule | action |
| --- | --- |
| its schedule or time zone cannot be parsed | stall (`Stalled` `InvalidSchedule`) |
| suspended | pass the slot (not started, not counted) |
| no slot came due | prune runs beyond the history limits, else nothing |
| the slot's run exists (a replica or an earlier try created it) | record it |
| `startingDeadlineSeconds` has passed since the slot | miss it (counted in `missed`) |
| a run is live, Forbid | skip the slot (counted in `skipped`) |
| a run is live, Replace, not yet asked to stop | cancel the live runs in place |
| a run is live, Replace, asked to stop | wait for it to settle |
| otherwise (none live, or Allow) | create the slot's run |

After downtime at most the latest slot that came due is started, as CronJob does; the
slots before it are counted in `missed`. Slots that came due before the operator saw a
change of the spec are not counted (a new expression has no history), and a suspended
schedule passes its slots as they come, so that resuming it starts none of the past.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from agentrun.scheduled import run_name, slot_of
from agentrun.vocabulary import (
    ConcurrencyPolicy,
    Phase,
    ScheduleReason,
)
from agentrun_operator import status as st
from agentrun_operator.decide import cancel_requested
from agentrun_operator.slots import COUNT_LIMIT, InvalidSchedule, Slots

DEFAULT_HISTORY = 3


@dataclass(frozen=True)
class Schedule:
    """The facts of an AgentRunSchedule the decision reads."""

    name: str
    created: datetime.datetime
    generation: int
    policy: str = ConcurrencyPolicy.FORBID
    starting_deadline: datetime.timedelta | None = None
    suspend: bool = False
    successful_limit: int = DEFAULT_HISTORY
    failed_limit: int = DEFAULT_HISTORY
    # status
    observed_generation: int | None = None
    last_slot: datetime.datetime | None = None
    last_schedule: datetime.datetime | None = None
    last_successful: datetime.datetime | None = None
    skipped: int = 0
    missed: int = 0


@dataclass(frozen=True)
class ScheduledRun:
    """One AgentRun of the schedule, as the cache shows it."""

    name: str
    uid: str
    phase: str  # "" before the operator gave it one
    created: datetime.datetime
    slot: datetime.datetime | None = None  # from its name, when it is named like a slot
    finished: datetime.datetime | None = None
    cancel_requested: bool = False
    deleting: bool = False

    @property
    def live(self) -> bool:
        return self.phase not in Phase.TERMINAL

    @property
    def when(self) -> datetime.datetime:
        return self.slot or self.created


# The actions.
STALL = "stall"
PASS = "pass"
RECORD = "record"
MISS = "miss"
SKIP = "skip"
CANCEL = "cancel"
WAIT = "wait"
CREATE = "create"
PRUNE = "prune"
NOTHING = "nothing"


@dataclass(frozen=True)
class ScheduleDecision:
    action: str
    message: str = ""
    slot: datetime.datetime | None = None  # the slot acted on
    runs: tuple[str, ...] = ()  # the run created or recorded; the live ones; those to delete
    passed_over: int = 0  # slots before `slot` that came due and got no run (counted missed)
    next_slot: datetime.datetime | None = None  # the next slot to come due
    # When to look again, if earlier than the next slot (a replaced run's deadline).
    recheck: datetime.datetime | None = None

    @property
    def look_again(self) -> datetime.datetime | None:
        return _earliest(self.next_slot, self.recheck)

    @property
    def deals_with_slot(self) -> bool:
        return self.action in (PASS, RECORD, MISS, SKIP, CREATE)


def _earliest(*moments: datetime.datetime | None) -> datetime.datetime | None:
    known = [m for m in moments if m is not None]
    return min(known) if known else None


def _at(moment: datetime.datetime) -> str:
    return st.stamp(moment)


def _prune(schedule: Schedule, runs: Sequence[ScheduledRun]) -> tuple[str, ...]:
    """Settled runs beyond the history limits, oldest first; never a live one."""
    settled = sorted((r for r in runs if not r.live and not r.deleting),
                     key=lambda r: (r.when, r.name), reverse=True)
    succeeded = [r for r in settled if r.phase == Phase.SUCCEEDED]
    failed = [r for r in settled if r.phase != Phase.SUCCEEDED]
    beyond = succeeded[max(schedule.successful_limit, 0):] + failed[
        max(schedule.failed_limit, 0):]
    return tuple(r.name for r in sorted(beyond, key=lambda r: (r.when, r.name)))


def schedule_decide(schedule: Schedule, runs: Sequence[ScheduledRun], now: datetime.datetime,
                    slots: Slots | InvalidSchedule) -> ScheduleDecision:
    """The one next action of `schedule` at `now` (the module's table, first match wins),
    and the next slot to look again at."""
    if isinstance(slots, InvalidSchedule):
        return ScheduleDecision(STALL, f"{slots}; no run is started until it is fixed.")
    next_slot = slots.after(now)
    since = schedule.last_slot or schedule.created
    due = slots.due(since, now)
    # A spec the operator has not seen yet: what came due under it before has no history.
    changed = schedule.observed_generation is not None and \
        schedule.observed_generation < schedule.generation
    passed_over = 0 if changed else due.before
    slot = due.latest
    decided = replace(ScheduleDecision(NOTHING), next_slot=next_slot, slot=slot,
                      passed_over=passed_over)
    if schedule.suspend:
        if slot is None:
            return decided
        return replace(decided, action=PASS, passed_over=0,
                       message=f"The slot of {_at(slot)} passed while the schedule is "
                               "suspended; no run was started.")
    if slot is None:
        pruned = _prune(schedule, runs)
        if pruned:
            return replace(decided, action=PRUNE, runs=pruned, message=(
                f"Deleted {', '.join(pruned)}: settled runs beyond the history limits "
                f"(successful {schedule.successful_limit}, failed "
                f"{schedule.failed_limit}); the run store keeps their records."))
        return decided
    name = run_name(schedule.name, slot)
    if any(r.name == name for r in runs):
        return replace(decided, action=RECORD, runs=(name,))
    late = now - slot
    if schedule.starting_deadline is not None and late > schedule.starting_deadline:
        return replace(decided, action=MISS, message=(
            f"Missed the slot of {_at(slot)}: it came due {int(late.total_seconds())}s ago, "
            f"more than startingDeadlineSeconds "
            f"({int(schedule.starting_deadline.total_seconds())}); no run was started."))
    live = tuple(r.name for r in sorted(runs, key=lambda r: (r.when, r.name)) if r.live)
    if live and schedule.policy == ConcurrencyPolicy.FORBID:
        return replace(decided, action=SKIP, runs=live, message=(
            f"Skipped the slot of {_at(slot)}: {', '.join(live)} "
            f"{'is' if len(live) == 1 else 'are'} still live and concurrencyPolicy is "
            "Forbid."))
    if live and schedule.policy == ConcurrencyPolicy.REPLACE:
        asked = tuple(r.name for r in runs if r.live and not r.cancel_requested)
        if asked:
            return replace(decided, action=CANCEL, runs=asked, message=(
                f"Cancelling {', '.join(asked)} in place for the slot of {_at(slot)} "
                "(concurrencyPolicy Replace); its run starts once "
                f"{'it is' if len(asked) == 1 else 'they are'} settled."))
        # The settle of the live run brings the schedule back; by its deadline, the slot
        # is missed.
        recheck = None if schedule.starting_deadline is None else \
            slot + schedule.starting_deadline + datetime.timedelta(seconds=1)
        return replace(decided, action=WAIT, runs=live, recheck=recheck, message=(
            f"Waiting for {', '.join(live)} to settle before starting the slot of "
            f"{_at(slot)} (concurrencyPolicy Replace)."))
    return replace(decided, action=CREATE, runs=(name,),
                   message=f"Created AgentRun {name} for the slot of {_at(slot)}.")


# -- the status that shows it ----------------------------------------------------------------


def _latest(*moments: datetime.datetime | None) -> datetime.datetime | None:
    known = [m for m in moments if m is not None]
    return max(known) if known else None


def schedule_status(schedule: Schedule, runs: Sequence[ScheduledRun],
                    decision: ScheduleDecision, now: datetime.datetime,
                    previous: Mapping[str, Any]) -> dict[str, Any]:
    """The schedule's whole status once `decision` is carried out: what it dealt with, the
    live runs, the counters, the next slot, and the GitOps conditions."""
    slot = decision.slot if decision.deals_with_slot else None
    started = decision.action in (CREATE, RECORD)
    missed = schedule.missed + (decision.passed_over if slot is not None else 0) + (
        1 if decision.action == MISS else 0)
    live = {r.name for r in runs if r.live}
    if started:
        live |= set(decision.runs)
    succeeded = _latest(*(r.finished for r in runs if r.phase == Phase.SUCCEEDED))
    status: dict[str, Any] = {k: v for k, v in previous.items() if k not in (
        "lastSlotTime", "lastScheduleTime", "lastSuccessfulTime", "nextScheduleTime",
        "active", "skipped", "missed", "conditions", "observedGeneration")}
    last_slot = _latest(slot, schedule.last_slot)
    last_schedule = _latest(slot if started else None, schedule.last_schedule)
    last_successful = _latest(succeeded, schedule.last_successful)
    for key, moment in (("lastSlotTime", last_slot), ("lastScheduleTime", last_schedule),
                        ("lastSuccessfulTime", last_successful)):
        if moment is not None:
            status[key] = _at(moment)
    stalled = decision.action == STALL
    if not stalled and not schedule.suspend and decision.next_slot is not None:
        status["nextScheduleTime"] = _at(decision.next_slot)
    status["active"] = sorted(live)
    status["skipped"] = schedule.skipped + (1 if decision.action == SKIP else 0)
    status["missed"] = missed
    status["observedGeneration"] = schedule.generation
    if stalled:
        reason, message = ScheduleReason.INVALID_SCHEDULE, decision.message
    elif schedule.suspend:
        reason, message = ScheduleReason.SUSPENDED, (
            "Suspended: no run is started until spec.suspend is false.")
    else:
        reason = ScheduleReason.SCHEDULED
        message = f"The next slot comes due at {status['nextScheduleTime']}." \
            if status.get("nextScheduleTime") else "Scheduled."
    status["conditions"] = st.schedule_conditions(
        stalled, reason, message, now, list(previous.get("conditions") or []))
    return status


def _moment(value: Any) -> datetime.datetime | None:
    if not value:
        return None
    return datetime.datetime.fromisoformat(str(value).replace("Z", "+00:00"))


def schedule_facts(obj: Mapping[str, Any]) -> Schedule:
    """An AgentRunSchedule object, as the decision reads it."""
    meta, spec, status = obj["metadata"], obj.get("spec") or {}, obj.get("status") or {}
    deadline = spec.get("startingDeadlineSeconds")
    return Schedule(
        name=meta["name"], created=_moment(meta.get("creationTimestamp")) or
        datetime.datetime.now(datetime.UTC), generation=int(meta.get("generation") or 1),
        policy=spec.get("concurrencyPolicy") or ConcurrencyPolicy.FORBID,
        starting_deadline=None if deadline is None else datetime.timedelta(
            seconds=int(deadline)),
        suspend=bool(spec.get("suspend")),
        successful_limit=int(spec.get("successfulRunsHistoryLimit", DEFAULT_HISTORY)),
        failed_limit=int(spec.get("failedRunsHistoryLimit", DEFAULT_HISTORY)),
        observed_generation=None if status.get("observedGeneration") is None else int(
            status["observedGeneration"]),
        last_slot=_moment(status.get("lastSlotTime")),
        last_schedule=_moment(status.get("lastScheduleTime")),
        last_successful=_moment(status.get("lastSuccessfulTime")),
        skipped=int(status.get("skipped") or 0), missed=int(status.get("missed") or 0))


def run_facts(schedule_name: str, run: Mapping[str, Any]) -> ScheduledRun:
    """An AgentRun of the schedule, as the decision reads it."""
    meta, status = run["metadata"], run.get("status") or {}
    slot = slot_of(schedule_name, meta["name"])
    return ScheduledRun(
        name=meta["name"], uid=meta.get("uid", ""), phase=status.get("phase") or "",
        created=_moment(meta.get("creationTimestamp")) or datetime.datetime.now(datetime.UTC),
        slot=None if slot is None else datetime.datetime.fromtimestamp(slot, datetime.UTC),
        finished=_moment(status.get("finishedAt")),
        cancel_requested=cancel_requested(meta.get("annotations")),
        deleting=bool(meta.get("deletionTimestamp")))


__all__ = ["COUNT_LIMIT", "Schedule", "ScheduleDecision", "ScheduledRun", "schedule_decide",
           "schedule_facts", "schedule_status"]
