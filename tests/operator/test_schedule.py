"""schedule_decide(): an AgentRunSchedule's next action, row by row, then its status.

Hold the table of operator/agentrun_operator/schedule.py (and api.md's "AgentRunSchedule",
with batch/v1 CronJob's semantics) next to TABLE below: one row per rule, in the same order
(first match wins), and the CronJob cases (downtime, a starting deadline) beside them.
Every row runs `@every 10s` (slots at whole multiples of ten seconds) unless it says.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field, replace

import pytest
from agentrun_operator.schedule import (
    CANCEL,
    CREATE,
    MISS,
    NOTHING,
    PASS,
    PRUNE,
    RECORD,
    SKIP,
    STALL,
    WAIT,
    Schedule,
    ScheduledRun,
    run_facts,
    schedule_decide,
    schedule_facts,
    schedule_status,
)
from agentrun_operator.slots import InvalidSchedule, Slots, parse

from agentrun.scheduled import scheduled_run
from agentrun.vocabulary import (
    ANNOTATION_CREATED_BY,
    ANNOTATION_TEMPLATE_BY,
    ConcurrencyPolicy,
    Phase,
    ScheduleReason,
)

T0 = datetime.datetime(2026, 7, 10, 12, 0, 0, tzinfo=datetime.UTC)  # a slot of @every 10s
SECONDS = datetime.timedelta(seconds=1)


def at(seconds: float) -> datetime.datetime:
    return T0 + seconds * SECONDS


def schedule(**fields: object) -> Schedule:
    """Created a minute before T0, its last slot dealt with at T0 - 10 s."""
    base = Schedule(name="nightly", created=at(-60), generation=1, observed_generation=1,
                    last_slot=at(-10), last_schedule=at(-10))
    return replace(base, **fields)  # type: ignore[arg-type]


def run(slot: float, phase: str = Phase.SUCCEEDED, **fields: object) -> ScheduledRun:
    when = at(slot)
    base = ScheduledRun(name=f"nightly-{int(when.timestamp())}", uid=f"uid-{slot}",
                        phase=phase, created=when, slot=when,
                        finished=None if phase in Phase.LIVE else when + 25 * SECONDS)
    return replace(base, **fields)  # type: ignore[arg-type]


def name(slot: float) -> str:
    return f"nightly-{int(at(slot).timestamp())}"


@dataclass(frozen=True)
class Row:
    name: str
    schedule: Schedule
    runs: tuple[ScheduledRun, ...]
    now: float  # seconds after T0
    action: str
    slot: float | None = None  # the slot acted on
    runs_named: tuple[float, ...] | None = None  # the runs the action names, by their slot
    passed_over: int = 0
    says: tuple[str, ...] = ()
    every: str = "@every 10s"
    extra: dict[str, object] = field(default_factory=dict)


TABLE = [
    Row("its schedule cannot be parsed", schedule(), (), 0.5, STALL, every="61 * * * *",
        says=("spec.schedule '61 * * * *' cannot be parsed: Bad minute",
              "; no run is started until it is fixed")),
    Row("suspended: the slot passes, not started, not counted", schedule(suspend=True),
        (), 0.5, PASS, slot=0, says=("passed while the schedule is suspended",)),
    Row("suspended, nothing came due", schedule(suspend=True, last_slot=at(0)), (), 5,
        NOTHING),
    Row("no slot came due", schedule(last_slot=at(0)), (run(0),), 5, NOTHING),
    Row("no slot came due, settled runs beyond the history limits: oldest first",
        schedule(last_slot=at(0), successful_limit=1, failed_limit=1),
        (run(-40), run(-30, Phase.FAILED), run(-20, Phase.CANCELLED), run(-10), run(0)), 5,
        PRUNE, runs_named=(-40, -30, -10),
        says=("beyond the history limits (successful 1, failed 1)",
              "the run store keeps their records")),
    Row("history limits never take a live run", schedule(last_slot=at(0), successful_limit=0,
                                                         failed_limit=0),
        (run(-10, Phase.RUNNING), run(0, Phase.PENDING), run(-20, Phase.FAILED)), 5, PRUNE,
        runs_named=(-20,)),
    Row("history limits leave a run being deleted alone",
        schedule(last_slot=at(0), failed_limit=0),
        (run(-20, Phase.FAILED, deleting=True),), 5, NOTHING),
    Row("the slot's run exists (a replica created it): record it", schedule(), (run(0,
        Phase.PENDING),), 0.5, RECORD, slot=0, runs_named=(0,)),
    Row("past startingDeadlineSeconds: missed", schedule(starting_deadline=5 * SECONDS), (),
        7, MISS, slot=0, says=("Missed the slot of 2026-07-10T12:00:00Z: it came due 7s ago, "
                               "more than startingDeadlineSeconds (5)",)),
    Row("a run is live, Forbid: skipped", schedule(), (run(-10, Phase.RUNNING),), 0.5, SKIP,
        slot=0, runs_named=(-10,), says=(f"{name(-10)} is still live and concurrencyPolicy "
                                         "is Forbid",)),
    Row("a run is live and just created (no phase yet), Forbid: skipped", schedule(),
        (run(-10, ""),), 0.5, SKIP, slot=0, runs_named=(-10,)),
    Row("a run is live, Replace, not asked to stop: cancel it in place",
        schedule(policy=ConcurrencyPolicy.REPLACE), (run(-10, Phase.RUNNING),), 0.5, CANCEL,
        runs_named=(-10,), says=("in place", "concurrencyPolicy Replace")),
    Row("a run is live, Replace, asked to stop: wait for it to settle",
        schedule(policy=ConcurrencyPolicy.REPLACE),
        (run(-10, Phase.RUNNING, cancel_requested=True),), 0.5, WAIT, runs_named=(-10,)),
    Row("the replaced run settled: create the slot's", schedule(
        policy=ConcurrencyPolicy.REPLACE), (run(-10, Phase.CANCELLED, cancel_requested=True),),
        2, CREATE, slot=0, runs_named=(0,)),
    Row("a run is live, Allow: create beside it", schedule(policy=ConcurrencyPolicy.ALLOW),
        (run(-10, Phase.RUNNING),), 0.5, CREATE, slot=0, runs_named=(0,)),
    Row("none live: create", schedule(), (run(-10),), 0.5, CREATE, slot=0, runs_named=(0,),
        says=(f"Created AgentRun {name(0)} for the slot of 2026-07-10T12:00:00Z",)),
    Row("the first slot after creation", schedule(created=at(-3), last_slot=None,
                                                  last_schedule=None, observed_generation=None),
        (), 0.5, CREATE, slot=0, runs_named=(0,)),
    # After downtime (CronJob): the latest slot only; the ones before it counted missed.
    Row("down for 45 s, no deadline: the latest slot starts, three before it missed",
        schedule(), (), 45, CREATE, slot=40, runs_named=(40,), passed_over=4),
    Row("down for 45 s, within the deadline", schedule(starting_deadline=10 * SECONDS), (),
        45, CREATE, slot=40, runs_named=(40,), passed_over=4),
    Row("down for 45 s, past the deadline: the latest is missed too",
        schedule(starting_deadline=3 * SECONDS), (), 45, MISS, slot=40, passed_over=4),
    Row("down for 45 s, a run live, Forbid: skipped, those before missed", schedule(),
        (run(-10, Phase.RUNNING),), 45, SKIP, slot=40, runs_named=(-10,), passed_over=4),
    Row("the spec changed since last seen: what came due before is not counted",
        schedule(generation=2), (), 45, CREATE, slot=40, runs_named=(40,), passed_over=0),
    Row("a daily schedule, a day down", schedule(last_slot=at(-86400)), (), 30, CREATE,
        slot=0, every="0 12 * * *", runs_named=(0,), passed_over=0),
]


def _slots(every: str) -> Slots | InvalidSchedule:
    try:
        return parse(every)
    except InvalidSchedule as e:
        return e


@pytest.mark.parametrize("row", TABLE, ids=[r.name for r in TABLE])
def test_decision_table(row: Row) -> None:
    decision = schedule_decide(row.schedule, row.runs, at(row.now), _slots(row.every))
    assert decision.action == row.action, decision
    if row.slot is not None:
        assert decision.slot == at(row.slot)
    if row.runs_named is not None:
        assert decision.runs == tuple(name(s) for s in row.runs_named)
    assert decision.passed_over == row.passed_over
    for phrase in row.says:
        assert phrase in decision.message


def test_the_next_slot_is_when_to_look_again() -> None:
    decision = schedule_decide(schedule(last_slot=at(0)), (), at(5), parse("@every 10s"))
    assert decision.next_slot == decision.look_again == at(10)
    waiting = schedule_decide(schedule(policy=ConcurrencyPolicy.REPLACE,
                                       starting_deadline=3 * SECONDS),
                              (run(-10, Phase.RUNNING, cancel_requested=True),), at(0.5),
                              parse("@every 10s"))
    assert waiting.action == WAIT
    # The settle of the replaced run brings the schedule back; by the deadline, it is missed.
    assert waiting.look_again == at(4)


# -- the status ---------------------------------------------------------------------------------


def _status(row_schedule: Schedule, runs: tuple[ScheduledRun, ...], now: float,
            every: str = "@every 10s") -> dict[str, object]:
    decision = schedule_decide(row_schedule, runs, at(now), _slots(every))
    return schedule_status(row_schedule, runs, decision, at(now), {})


def test_a_created_run_is_active_and_scheduled() -> None:
    status = _status(schedule(), (run(-40),), 0.5)
    assert status["lastScheduleTime"] == status["lastSlotTime"] == "2026-07-10T12:00:00Z"
    assert status["active"] == [name(0)]
    assert status["nextScheduleTime"] == "2026-07-10T12:00:10Z"
    assert status["lastSuccessfulTime"] == "2026-07-10T11:59:45Z"
    assert (status["skipped"], status["missed"], status["observedGeneration"]) == (0, 0, 1)
    ready, reconciling = status["conditions"]  # type: ignore[misc]
    assert (ready["type"], ready["status"], ready["reason"]) == (
        "Ready", "True", ScheduleReason.SCHEDULED)
    assert ready["message"] == "The next slot comes due at 2026-07-10T12:00:10Z."
    assert (reconciling["type"], reconciling["status"]) == ("Reconciling", "False")


def test_a_skip_is_counted_once_and_the_last_schedule_stays() -> None:
    status = _status(schedule(skipped=2), (run(-10, Phase.RUNNING),), 0.5)
    assert (status["skipped"], status["missed"]) == (3, 0)
    assert status["lastSlotTime"] == "2026-07-10T12:00:00Z"
    assert status["lastScheduleTime"] == "2026-07-10T11:59:50Z"
    assert status["active"] == [name(-10)]


def test_missed_counts_the_latest_and_those_before_it() -> None:
    status = _status(schedule(starting_deadline=3 * SECONDS, missed=1), (), 45)
    assert status["missed"] == 1 + 4 + 1
    assert status["lastSlotTime"] == "2026-07-10T12:00:40Z"


def test_suspended_has_no_next_slot_and_says_so() -> None:
    status = _status(schedule(suspend=True), (), 0.5)
    assert "nextScheduleTime" not in status
    assert status["lastSlotTime"] == "2026-07-10T12:00:00Z"
    ready = status["conditions"][0]  # type: ignore[index]
    assert (ready["status"], ready["reason"]) == ("True", ScheduleReason.SUSPENDED)


def test_an_invalid_schedule_is_stalled_with_the_parsers_message() -> None:
    status = _status(schedule(), (), 0.5, every="@every 5s")
    conditions = {c["type"]: c for c in status["conditions"]}  # type: ignore[attr-defined]
    assert conditions["Stalled"]["status"] == "True"
    assert conditions["Stalled"]["reason"] == ScheduleReason.INVALID_SCHEDULE
    assert "@every 5s is shorter than the floor of 10s" in conditions["Stalled"]["message"]
    assert conditions["Ready"]["status"] == "False"
    assert "nextScheduleTime" not in status


def test_facts_from_the_objects() -> None:
    obj = {"metadata": {"name": "nightly", "creationTimestamp": "2026-07-10T11:59:00Z",
                        "generation": 3, "uid": "u"},
           "spec": {"schedule": "@every 10s", "concurrencyPolicy": "Replace",
                    "startingDeadlineSeconds": 30, "suspend": True,
                    "successfulRunsHistoryLimit": 1, "failedRunsHistoryLimit": 0},
           "status": {"observedGeneration": 2, "lastSlotTime": "2026-07-10T12:00:00Z",
                      "skipped": 4, "missed": 5}}
    facts = schedule_facts(obj)
    assert facts == Schedule(
        name="nightly", created=at(-60), generation=3, policy="Replace",
        starting_deadline=30 * SECONDS, suspend=True, successful_limit=1, failed_limit=0,
        observed_generation=2, last_slot=at(0), skipped=4, missed=5)
    seen = run_facts("nightly", {"metadata": {
        "name": name(0), "uid": "r", "creationTimestamp": "2026-07-10T12:00:00Z",
        "annotations": {"agentrun.dev/cancel": "true"}}, "status": {"phase": "Running"}})
    assert seen.slot == at(0) and seen.cancel_requested and seen.live
    other = run_facts("nightly", {"metadata": {"name": "nightly-by-hand", "uid": "x",
                                               "creationTimestamp": "2026-07-10T12:00:03Z"}})
    assert other.slot is None and other.when == at(3) and other.live


def test_a_schedules_run_is_created_by_who_last_wrote_its_template() -> None:
    """Four eyes hold for scheduled runs: the run carries the schedule's
    agentrun.dev/template-by as its agentrun.dev/created-by, whatever the template's own
    annotations say (the operator, which creates it, may set created-by)."""
    schedule = {"metadata": {"name": "nightly", "namespace": "support", "uid": "s-1",
                             "annotations": {ANNOTATION_TEMPLATE_BY: "dave"}},
                "spec": {"runTemplate": {
                    "metadata": {"annotations": {ANNOTATION_CREATED_BY: "someone-else",
                                                 "team": "support"}},
                    "spec": {"agent": "support-agent"}}}}
    run = scheduled_run(schedule, 1_700_000_000)
    assert run["metadata"]["annotations"] == {ANNOTATION_CREATED_BY: "dave", "team": "support"}
    # A schedule admission never saw (no template-by): no creator, not the template's word.
    unknown = {**schedule, "metadata": {**schedule["metadata"], "annotations": {}}}
    assert scheduled_run(unknown, 1_700_000_000)["metadata"]["annotations"] == {
        "team": "support"}
