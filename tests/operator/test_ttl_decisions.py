"""A settled run's time to live and when a replay has nothing left to decide (pure)."""

from __future__ import annotations

import datetime
from typing import Any

import pytest
from agentrun_operator.decide import replay_decided
from agentrun_operator.ttl import run_ttl, seconds_left, settled_at

from agentrun.vocabulary import ANNOTATION_FORCE_REPLAY, ReplayPhase, ReplayReason

NOW = datetime.datetime(2026, 12, 4, 12, 0, 0, tzinfo=datetime.UTC)
HOUR = datetime.timedelta(hours=1)


@pytest.mark.parametrize(("spec", "default", "kept_for"), [
    ({}, None, None),                                    # neither: kept
    ({}, HOUR, HOUR),                                    # the installation's default
    ({"ttlSecondsAfterFinished": 5}, HOUR, datetime.timedelta(seconds=5)),  # its own wins
    ({"ttlSecondsAfterFinished": 0}, HOUR, datetime.timedelta(0)),  # 0 is a time to live
    ({"ttlSecondsAfterFinished": 7200}, None, 2 * HOUR),
])
def test_a_runs_own_ttl_wins_over_the_default(
    spec: dict[str, Any], default: datetime.timedelta | None,
    kept_for: datetime.timedelta | None,
) -> None:
    assert run_ttl(spec, default) == kept_for


@pytest.mark.parametrize(("since", "ttl", "left"), [
    (NOW, None, None),                                   # no time to live: never
    (None, HOUR, None),                                  # nothing to count from: never
    (NOW, HOUR, 3600.0),
    (NOW - HOUR, HOUR, 0.0),                             # due now
    (NOW - 2 * HOUR, HOUR, -3600.0),                     # overdue (an operator was down)
    (NOW, datetime.timedelta(0), 0.0),
])
def test_seconds_left(since: datetime.datetime | None, ttl: datetime.timedelta | None,
                      left: float | None) -> None:
    assert seconds_left(since, ttl, NOW) == left


def test_a_run_settled_at_its_finished_at_else_its_creation() -> None:
    created, finished = "2026-12-04T10:00:00Z", "2026-12-04T11:00:00Z"
    run = {"metadata": {"creationTimestamp": created}, "status": {"finishedAt": finished}}
    assert settled_at(run) == NOW - HOUR
    assert settled_at({"metadata": {"creationTimestamp": created}, "status": {}}) == (
        NOW - 2 * HOUR)
    assert settled_at({"metadata": {}}) is None


def _replay(phase: str | None, reason: str | None = None, run: str | None = None,
            forced: bool = False) -> dict[str, Any]:
    status = {k: v for k, v in (("phase", phase), ("reason", reason),
                                ("replayRunName", run)) if v}
    annotations = {ANNOTATION_FORCE_REPLAY: "true"} if forced else {}
    return {"metadata": {"annotations": annotations}, "status": status}


@pytest.mark.parametrize(("replay", "decided"), [
    (_replay(None), False),                                          # not looked at yet
    (_replay(ReplayPhase.APPROVED, ReplayReason.NO_TOOLS_EXECUTED), False),  # run not made
    (_replay(ReplayPhase.APPROVED, ReplayReason.NO_TOOLS_EXECUTED, "r-replay"), True),
    (_replay(ReplayPhase.REFUSED, ReplayReason.TOOLS_EXECUTED), True),
    (_replay(ReplayPhase.REFUSED, ReplayReason.TOOLS_EXECUTED, forced=True), False),  # again
    (_replay(ReplayPhase.REFUSED, ReplayReason.RUN_CREATION_FAILED, forced=True), True),
])
def test_a_replay_is_decided_when_nothing_is_left_to_decide(
    replay: dict[str, Any], decided: bool
) -> None:
    assert replay_decided(replay) is decided


@pytest.mark.parametrize(("text", "days"), [
    ("90d", 90.0), ("36h", 1.5), ("30m", 30 / 1440), ("0", 0.0), ("1.5d", 1.5),
])
def test_the_store_retention_reads_days_hours_and_minutes(text: str, days: float) -> None:
    from agentrun_operator.config import retention_of

    assert retention_of(text) == datetime.timedelta(days=days)


@pytest.mark.parametrize("text", ["90", "2w", "d", "-3d "])
def test_a_retention_it_cannot_read_says_what_it_takes(text: str) -> None:
    import argparse

    from agentrun_operator.config import retention_of

    with pytest.raises(argparse.ArgumentTypeError, match="such as 90d, 36h or 30m"):
        retention_of(text)
