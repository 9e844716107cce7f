"""decide(): the replay decision table of docs/api.md, row by row, then every force combination.

Hold api.md's "Decision rules" table next to TABLE below: one row here per row there, in the
same order (first match wins), each without the force annotation. FORCE then crosses every
row with the annotation: the rows marked "force overrides? yes" turn Approved/Forced, the
others keep their refusal.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from agentrun_operator.decide import Original, decide, is_forced

from agentrun.vocabulary import ANNOTATION_FORCE_REPLAY, Phase, ReplayPhase, ReplayReason

DIGEST = "sha256:" + "ab" * 32
FORCE = f"Annotate {ANNOTATION_FORCE_REPLAY}=true to run it again anyway."


def run(phase: str = Phase.FAILED, tools: list[str] | None = None, *,
        input_available: bool = True, digest: str | None = DIGEST) -> Original:
    return Original(phase=phase, tools_executed=tools, input_digest=digest,
                    input_available=input_available, reason="Evicted")


@dataclass(frozen=True)
class Row:
    name: str  # api.md's "the original run" column
    original: Original | None
    already_replayed_by: str | None
    phase: str
    reason: str
    says: tuple[str, ...]  # phrases the message must contain
    force_overrides: bool | None  # api.md's last column; None: "—" (already approved)


TABLE = [
    Row("does not exist", None, None, ReplayPhase.REFUSED, ReplayReason.RUN_NOT_FOUND,
        ("AgentRun triage-42 does not exist", "spec.runName"), False),
    Row("Pending", run(Phase.PENDING), None, ReplayPhase.REFUSED, ReplayReason.ORIGINAL_RUNNING,
        ("still Pending", "wait for it to settle"), False),
    Row("Running", run(Phase.RUNNING), None, ReplayPhase.REFUSED, ReplayReason.ORIGINAL_RUNNING,
        ("still Running", "wait for it to settle", "never allowed"), False),
    Row("its input snapshot is gone", run(Phase.FAILED, [], input_available=False), None,
        ReplayPhase.REFUSED, ReplayReason.INPUT_GONE,
        (f"input snapshot {DIGEST}", "gone", "partial input", "even when forced"), False),
    Row("Succeeded", run(Phase.SUCCEEDED, ["send_email"]), None, ReplayPhase.REFUSED,
        ReplayReason.ORIGINAL_SUCCEEDED,
        ("succeeded (it called send_email)", "side effects already happened", FORCE), True),
    Row("Failed, toolsExecuted null", run(Phase.FAILED, None), None, ReplayPhase.REFUSED,
        ReplayReason.TOOL_STATE_UNKNOWN,
        ("before failing is unknown", "could not be read", FORCE), True),
    Row("Cancelled, toolsExecuted null", run(Phase.CANCELLED, None), None, ReplayPhase.REFUSED,
        ReplayReason.TOOL_STATE_UNKNOWN, ("before being cancelled is unknown", FORCE), True),
    Row("Failed, toolsExecuted non-empty", run(Phase.FAILED, ["send_email", "update_crm"]),
        None, ReplayPhase.REFUSED, ReplayReason.TOOLS_EXECUTED,
        ("This run already called send_email, update_crm before failing: a replay would call "
         f"them again. {FORCE}",), True),
    Row("Cancelled, toolsExecuted non-empty", run(Phase.CANCELLED, ["send_email"]), None,
        ReplayPhase.REFUSED, ReplayReason.TOOLS_EXECUTED,
        ("already called send_email before being cancelled", FORCE), True),
    Row("another non-forced replay of it was already approved", run(Phase.FAILED, []),
        "triage-42-again", ReplayPhase.REFUSED, ReplayReason.ALREADY_REPLAYED,
        ("AgentRunReplay triage-42-again was approved", "only one replay", FORCE), True),
    Row("Failed, toolsExecuted []", run(Phase.FAILED, []), None, ReplayPhase.APPROVED,
        ReplayReason.NO_TOOLS_EXECUTED, ("called no tool", "safe"), None),
    Row("Cancelled, toolsExecuted []", run(Phase.CANCELLED, []), None, ReplayPhase.APPROVED,
        ReplayReason.NO_TOOLS_EXECUTED, ("called no tool",), None),
]


@pytest.mark.parametrize("row", TABLE, ids=[r.name for r in TABLE])
def test_decision_table(row: Row) -> None:
    decision = decide("triage-42", row.original, already_replayed_by=row.already_replayed_by,
                      forced=False)
    assert (decision.phase, decision.reason) == (row.phase, row.reason)
    for phrase in row.says:
        assert phrase in decision.message
    assert decision.approved == (row.phase == ReplayPhase.APPROVED)


@pytest.mark.parametrize("row", TABLE, ids=[r.name for r in TABLE])
def test_force_on_every_row(row: Row) -> None:
    """With the annotation: "yes" rows turn Approved/Forced, "no" rows keep their refusal,
    an approval stays the approval it was (forcing a safe replay changes nothing)."""
    decision = decide("triage-42", row.original, already_replayed_by=row.already_replayed_by,
                      forced=True)
    if row.force_overrides is True:
        assert (decision.phase, decision.reason) == (ReplayPhase.APPROVED, ReplayReason.FORCED)
        assert decision.forced
        # The forced approval still says what was overridden, without the advice to force.
        assert f"over {row.reason}" in decision.message
        assert FORCE not in decision.message
    else:
        assert (decision.phase, decision.reason) == (row.phase, row.reason)
        assert not decision.forced


def test_forced_replay_of_a_run_that_sent_an_email_names_it() -> None:
    decision = decide("evict-1", run(Phase.FAILED, ["send_email"]), already_replayed_by=None,
                      forced=True)
    assert decision.message == (
        f"Forced with {ANNOTATION_FORCE_REPLAY}=true over ToolsExecuted: This run already "
        "called send_email before failing: a replay would call them again.")


def test_first_match_wins() -> None:
    """A live run with unknown tools is OriginalRunning; a gone input beats succeeded."""
    assert decide("r", run(Phase.RUNNING, None), already_replayed_by="x",
                  forced=True).reason == ReplayReason.ORIGINAL_RUNNING
    assert decide("r", run(Phase.SUCCEEDED, [], input_available=False),
                  already_replayed_by=None, forced=True).reason == ReplayReason.INPUT_GONE
    assert decide("r", run(Phase.FAILED, ["send_email"]), already_replayed_by="x",
                  forced=False).reason == ReplayReason.TOOLS_EXECUTED


def test_a_run_without_a_snapshot_is_input_gone() -> None:
    decision = decide("r", run(Phase.FAILED, [], digest=None, input_available=False),
                      already_replayed_by=None, forced=True)
    assert decision.reason == ReplayReason.INPUT_GONE
    assert "has no input snapshot" in decision.message


def test_a_run_without_status_yet_is_pending() -> None:
    decision = decide("r", run(""), already_replayed_by=None, forced=False)
    assert decision.reason == ReplayReason.ORIGINAL_RUNNING
    assert "still Pending" in decision.message


@pytest.mark.parametrize(("annotations", "forced"), [
    (None, False),
    ({}, False),
    ({ANNOTATION_FORCE_REPLAY: "true"}, True),
    ({ANNOTATION_FORCE_REPLAY: "True"}, True),
    ({ANNOTATION_FORCE_REPLAY: "false"}, False),
    ({ANNOTATION_FORCE_REPLAY: "yes"}, False),
    ({ANNOTATION_FORCE_REPLAY: ""}, False),
    ({"other": "true"}, False),
])
def test_what_counts_as_the_force_annotation(annotations: dict[str, str] | None,
                                             forced: bool) -> None:
    assert is_forced(annotations) is forced
