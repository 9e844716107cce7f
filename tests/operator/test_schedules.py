"""AgentRunSchedule end to end: `@every 10s` with runs of about 25 s under each
concurrencyPolicy, suspend, history limits, `kubectl agentrun schedule trigger`; then the
operator killed for longer than a slot, and two replicas acting on one schedule.

The scripted model makes a run last: `{"sleep": 25}` is a model that thinks for 25 s. The
store's timestamps (recorded, settled) say when each run was live, to the millisecond.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from agentrun_devtools.processes import wait_for

from agentrun import store
from agentrun.scheduled import slot_of
from agentrun.vocabulary import (
    API_VERSION,
    LABEL_SCHEDULE,
    SCHEDULE_KIND,
    Phase,
    Reason,
    RunStatus,
    Trigger,
)
from tests.harness import Operator, System
from tests.kubectl_plugin import plugin

SCHEDULES = "agentrunschedules.agentrun.dev"
LONG = [{"sleep": 25}, {"text": "done"}]
QUICK = [{"text": "done"}]


def schedule_manifest(name: str, script: list[dict[str, Any]], *, every: str = "@every 10s",
                      **spec: Any) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": SCHEDULE_KIND, "metadata": {"name": name},
            "spec": {"schedule": every, **spec, "runTemplate": {
                "metadata": {"labels": {"team": "support"}},
                "spec": {"agent": "support-agent", "model": "scripted",
                         "input": {"text": "Triage the queue"},
                         "env": [{"name": "AGENTRUN_SCRIPT", "value": json.dumps(script)}]}}}}


def create(system: System, namespace: str, manifest: dict[str, Any]) -> None:
    manifest["metadata"]["namespace"] = namespace
    system.apply(manifest)


def schedule_of(system: System, namespace: str, name: str) -> dict[str, Any]:
    found = system.get(SCHEDULES, namespace, name)
    assert found is not None
    return found


def runs_of(system: System, namespace: str, name: str) -> list[dict[str, Any]]:
    done = system.kubectl("get", "agentruns", "-n", namespace, "-l", f"{LABEL_SCHEDULE}={name}",
                          "-o", "json")
    return sorted(json.loads(done.stdout)["items"], key=lambda r: r["metadata"]["name"])


def live(runs: list[dict[str, Any]]) -> list[str]:
    return [r["metadata"]["name"] for r in runs
            if (r.get("status") or {}).get("phase") not in Phase.TERMINAL]


def stop(system: System, namespace: str, name: str) -> None:
    system.kubectl("patch", SCHEDULES, name, "-n", namespace, "--type=merge", "-p",
                   '{"spec": {"suspend": true}}')


def watch(system: System, namespace: str, name: str, until: Callable[[list[dict[str, Any]],
          dict[str, Any]], bool], *, timeout: float, what: str) -> list[list[str]]:
    """Samples the schedule's runs and status until `until` holds; returns, per sample,
    the live runs."""
    seen: list[list[str]] = []

    def check() -> bool:
        runs = runs_of(system, namespace, name)
        seen.append(live(runs))
        return until(runs, schedule_of(system, namespace, name).get("status") or {})

    try:
        wait_for(check, timeout=timeout, what=what, interval=0.3)
    except TimeoutError as e:
        raise AssertionError(f"{e}; status {schedule_of(system, namespace, name).get('status')}"
                             f"\n{system.operator.log()[-3000:]}") from e
    return seen


def live_intervals(system: System, runs: list[dict[str, Any]]) -> list[tuple[float, float]]:
    """[recorded, settled] of each run in the store (settled: now, while live)."""
    out = []
    for r in runs:
        row = system.store(lambda e, uid=r["metadata"]["uid"]: store.get_run(e, uid))
        assert row is not None, r["metadata"]["name"]
        end = row.finished_at.timestamp() if row.finished_at else time.time()
        out.append((row.created_at.timestamp(), end))
    return sorted(out)


def test_forbid_never_has_two_live_runs_and_counts_the_skipped_slots(
        system: System, namespace: str) -> None:
    create(system, namespace, schedule_manifest("forbid", LONG))
    samples = watch(system, namespace, "forbid",
                    lambda runs, status: len(runs) >= 2 and status.get("skipped", 0) >= 2,
                    timeout=90, what="two runs and two skipped slots")
    stop(system, namespace, "forbid")
    assert max(len(s) for s in samples) == 1, [s for s in samples if len(s) > 1]
    runs = runs_of(system, namespace, "forbid")
    intervals = live_intervals(system, runs)
    for (_, end), (start, _) in itertools.pairwise(intervals):
        assert start >= end, intervals  # each starts after the one before settled
    first = runs[0]
    assert first["metadata"]["labels"] == {LABEL_SCHEDULE: "forbid", "team": "support"}
    [owner] = first["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["controller"]) == (SCHEDULE_KIND, "forbid",
                                                                   True)
    assert first["spec"]["trigger"] == Trigger.SCHEDULE
    assert slot_of("forbid", first["metadata"]["name"]) is not None
    status = schedule_of(system, namespace, "forbid")["status"]
    assert status["lastScheduleTime"] and status["missed"] == 0
    events = json.loads(system.kubectl(
        "get", "events", "-n", namespace, "--field-selector", "involvedObject.name=forbid",
        "-o", "json").stdout)["items"]
    skipped = [e for e in events if e["reason"] == "SlotSkipped"]
    assert skipped and "is still live and concurrencyPolicy is Forbid" in skipped[0]["message"]
    assert any(e["reason"] == "RunCreated" for e in events)


def test_allow_overlaps(system: System, namespace: str) -> None:
    create(system, namespace, schedule_manifest("allow", LONG, concurrencyPolicy="Allow"))
    samples = watch(system, namespace, "allow", lambda runs, _: len(live(runs)) >= 2,
                    timeout=60, what="two live runs at once")
    stop(system, namespace, "allow")
    # The sample in which two were live: runs of two different slots of this schedule.
    overlapping = sorted(samples[-1])[:2]
    slots = [slot_of("allow", name) for name in overlapping]
    assert None not in slots and len(set(slots)) == len(slots), overlapping
    by_name = {r["metadata"]["name"]: r for r in runs_of(system, namespace, "allow")}
    for name in overlapping:
        assert by_name[name]["metadata"]["labels"][LABEL_SCHEDULE] == "allow", name
        [owner] = by_name[name]["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"]) == (SCHEDULE_KIND, "allow"), name
    # The store saw them live at once: the later one recorded before the earlier settled.
    (_, first_end), (second_start, _) = live_intervals(
        system, [by_name[name] for name in overlapping])
    assert second_start < first_end, overlapping
    # The schedule's status lists both as active while they are (each runs about 25 s).
    wait_for(lambda: set(overlapping) <= set(
        (schedule_of(system, namespace, "allow").get("status") or {}).get("active") or []),
        timeout=20, what=f"status.active to list {overlapping}")
    assert schedule_of(system, namespace, "allow")["status"]["skipped"] == 0


def test_replace_cancels_the_live_run_in_place_then_starts_the_slots(
        system: System, namespace: str) -> None:
    script = [{"call": "read_message", "args": {}}, *LONG]
    create(system, namespace, schedule_manifest("replace", script,
                                                concurrencyPolicy="Replace"))
    watch(system, namespace, "replace",
          lambda runs, _: any((r.get("status") or {}).get("phase") == Phase.CANCELLED
                              for r in runs) and len(runs) >= 2,
          timeout=90, what="a replaced run and its successor")
    stop(system, namespace, "replace")
    runs = runs_of(system, namespace, "replace")
    [replaced, *_] = [r for r in runs if r["status"].get("phase") == Phase.CANCELLED]
    status = replaced["status"]
    assert status["reason"] == Reason.CANCEL_REQUESTED
    assert "replaced by the slot of" in status["message"]
    assert "of AgentRunSchedule replace (concurrencyPolicy Replace)" in status["message"]
    # Recorded as cancelled, with what it had called.
    row = system.store(lambda e: store.get_run(e, replaced["metadata"]["uid"]))
    assert row is not None and row.status == RunStatus.CANCELLED
    assert status["toolsExecuted"] == row.tools_executed
    # Never two live: the next one was recorded once the replaced one had settled.
    intervals = live_intervals(system, runs)
    for (_, end), (start, _) in itertools.pairwise(intervals):
        assert start >= end, intervals  # each starts after the one before settled


def test_suspend_stops_new_runs_at_once_and_history_deletes_only_settled_runs(
        system: System, namespace: str) -> None:
    # Runs of 12 s every 10 s beside each other (Allow), none kept once settled.
    create(system, namespace, schedule_manifest(
        "history", [{"sleep": 12}, {"text": "done"}], concurrencyPolicy="Allow",
        successfulRunsHistoryLimit=0, failedRunsHistoryLimit=0))
    uids: dict[str, str] = {}

    def two_gone(runs: list[dict[str, Any]], _: dict[str, Any]) -> bool:
        uids.update({r["metadata"]["name"]: r["metadata"]["uid"] for r in runs})
        return len(set(uids) - {r["metadata"]["name"] for r in runs}) >= 2

    watch(system, namespace, "history", two_gone, timeout=90, what="two runs deleted")
    stop(system, namespace, "history")
    # The schedule is suspended from the moment the operator sees it.
    wait_for(lambda: (schedule_of(system, namespace, "history").get("status") or {}).get(
        "conditions", [{}])[0].get("reason") == "Suspended", timeout=10, what="Suspended")
    assert "nextScheduleTime" not in schedule_of(system, namespace, "history")["status"]
    before = {r["metadata"]["name"] for r in runs_of(system, namespace, "history")} | set(uids)
    time.sleep(21)  # two slots
    after = {r["metadata"]["name"] for r in runs_of(system, namespace, "history")}
    assert not after - before, after - before
    # Every run the history limits took had settled on its own (a live run deleted is
    # recorded cancelled, "deleted while it was live"), and the store keeps its record.
    gone = set(uids) - after
    assert len(gone) >= 2
    for name in gone:
        row = system.store(lambda e, uid=uids[name]: store.get_run(e, uid))
        assert row is not None, name
        assert row.status == RunStatus.SUCCEEDED, (name, row.status, row.message)


def test_kubectl_agentrun_schedule_trigger(system: System, namespace: str) -> None:
    create(system, namespace, schedule_manifest("weekly", QUICK, every="0 3 * * 0"))
    done = plugin(system, "schedule", "trigger", "weekly", "-n", namespace)
    assert done.returncode == 0, done.stderr
    [run] = runs_of(system, namespace, "weekly")
    assert f"agentrun/{run['metadata']['name']} created" in done.stdout
    assert slot_of("weekly", run["metadata"]["name"]) is not None
    assert run["spec"]["trigger"] == Trigger.SCHEDULE
    assert run["metadata"]["ownerReferences"][0]["name"] == "weekly"
    system.wait_phase(namespace, run["metadata"]["name"], Phase.SUCCEEDED, Phase.FAILED)
    # The schedule shows it among its runs, as any other (its last success).
    wait_for(lambda: bool((schedule_of(system, namespace, "weekly").get("status") or {}).get(
        "lastSuccessfulTime")), timeout=20, what="lastSuccessfulTime")
    # While a run is live, Forbid refuses a trigger.
    create(system, namespace, schedule_manifest("slow", LONG, every="0 3 * * 0"))
    assert plugin(system, "schedule", "trigger", "slow", "-n", namespace).returncode == 0
    refused = plugin(system, "schedule", "trigger", "slow", "-n", namespace)
    assert refused.returncode == 1
    assert "has a live run" in refused.stderr and "concurrencyPolicy is Forbid" in \
        refused.stderr


def test_an_invalid_schedule_is_stalled_with_the_parsers_message(
        system: System, namespace: str) -> None:
    create(system, namespace, schedule_manifest("bad", QUICK, every="61 * * * *"))

    def stalled() -> bool:
        status = schedule_of(system, namespace, "bad").get("status") or {}
        return any(c["type"] == "Stalled" and c["status"] == "True"
                   for c in status.get("conditions") or [])

    wait_for(stalled, timeout=20, what="Stalled")
    conditions = {c["type"]: c for c in schedule_of(system, namespace, "bad")["status"][
        "conditions"]}
    assert conditions["Stalled"]["reason"] == "InvalidSchedule"
    assert "spec.schedule '61 * * * *' cannot be parsed: Bad minute" in \
        conditions["Stalled"]["message"]
    assert conditions["Ready"]["status"] == "False"
    events = json.loads(system.kubectl(
        "get", "events", "-n", namespace, "--field-selector", "involvedObject.name=bad",
        "-o", "json").stdout)["items"]
    assert [e["type"] for e in events if e["reason"] == "InvalidSchedule"] == ["Warning"]
    # Fixed: scheduled again.
    system.kubectl("patch", SCHEDULES, "bad", "-n", namespace, "--type=merge", "-p",
                   '{"spec": {"schedule": "@every 1h"}}')
    wait_for(lambda: "Stalled" not in {c["type"] for c in (schedule_of(
        system, namespace, "bad").get("status") or {}).get("conditions") or []}, timeout=20,
        what="no longer Stalled")


# -- the operator down, and two replicas ---------------------------------------------------


def _slot_after(period: int, moment: float) -> float:
    return (int(moment) // period + 1) * period


def _wait_until(moment: float) -> None:
    time.sleep(max(0.0, moment - time.time()))


@pytest.fixture
def own_operator(system: System, solo_namespace: str, tmp_path: Path) -> Operator:
    return Operator(system.plane, system.store_url, tmp_path / "own",
                    (f"--namespace={solo_namespace}", "--check-interval=30"))


def test_after_downtime_at_most_the_latest_slot_starts_within_its_deadline(
        system: System, solo_namespace: str, own_operator: Operator) -> None:
    """@every 30s. The operator is killed after slot S0's run settled and comes back 8 s
    after S2: the schedule without a deadline starts S2 (late) and counts S1 missed; the one
    with a deadline of 5 s starts neither and counts both."""
    ns, period = solo_namespace, 30
    solo = System(system.plane, system.store_url, own_operator.start())
    try:
        start = _slot_after(period, time.time() + 3)
        _wait_until(start - 2)
        for name, extra in (("late", {}), ("strict", {"startingDeadlineSeconds": 5})):
            create(solo, ns, schedule_manifest(name, QUICK, every=f"@every {period}s", **extra))
        for name in ("late", "strict"):
            # Settled before the operator goes: a live run would make Forbid skip S2.
            watch(solo, ns, name, lambda runs, _: len(runs) == 1 and not live(runs),
                  timeout=25, what=f"{name}'s first run settled")
        own_operator.kill()
        _wait_until(start + 2 * period + 8)
        own_operator.start()
        s2 = int(start + 2 * period)
        for name in ("late", "strict"):
            watch(solo, ns, name, lambda _, status: status.get("lastSlotTime") ==
                  time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(s2)), timeout=20,
                  what=f"{name} dealt with the slot of {s2}")
        late = [slot_of("late", r["metadata"]["name"]) for r in runs_of(solo, ns, "late")]
        assert late == [int(start), s2]
        assert schedule_of(solo, ns, "late")["status"]["missed"] == 1
        strict = [slot_of("strict", r["metadata"]["name"]) for r in runs_of(solo, ns, "strict")]
        assert strict == [int(start)]
        assert schedule_of(solo, ns, "strict")["status"]["missed"] == 2
        assert "schedule-slot-missed schedule=" + ns + "/strict" in own_operator.log()
    finally:
        for name in ("late", "strict"):
            stop(solo, ns, name)
        own_operator.stop()


def test_two_replicas_never_start_a_slot_twice(system: System, solo_namespace: str,
                                               tmp_path: Path) -> None:
    """Two operator processes, no leader election: both act on every slot."""
    ns = solo_namespace
    args = (f"--namespace={ns}", "--check-interval=30")
    first = Operator(system.plane, system.store_url, tmp_path / "a", args).start()
    second = Operator(system.plane, system.store_url, tmp_path / "b", args).start()
    try:
        solo = System(system.plane, system.store_url, first)
        create(solo, ns, schedule_manifest("twice", QUICK, concurrencyPolicy="Allow"))
        create(solo, ns, schedule_manifest("forbid-twice", LONG))
        watch(solo, ns, "twice", lambda runs, _: len(runs) >= 3, timeout=60,
              what="three slots")
        for name in ("twice", "forbid-twice"):
            stop(solo, ns, name)
        runs = runs_of(solo, ns, "twice")
        slots = [slot_of("twice", r["metadata"]["name"]) for r in runs]
        assert len(set(slots)) == len(slots) and None not in slots
        created = (first.log() + second.log()).count(
            f"event=schedule-run-created schedule={ns}/twice ")
        assert created == len(runs), (created, [r["metadata"]["name"] for r in runs])
        for run in runs:
            done = solo.wait_phase(ns, run["metadata"]["name"], Phase.SUCCEEDED, Phase.FAILED)
            assert done["status"]["attempts"] == 1
        # Forbid with both replicas: never two live.
        intervals = live_intervals(solo, runs_of(solo, ns, "forbid-twice"))
        for (_, end), (start, _) in itertools.pairwise(intervals):
            assert start >= end, intervals  # each starts after the one before settled
    finally:
        first.stop()
        second.stop()
