"""Every row of api.md's replay decision table, end to end: real runs (the scripted model on
the development node) settle the way the row says, an AgentRunReplay is created as a user
would, and the tests read what the user reads (status, message, Events, the runs created).
"""

from __future__ import annotations

import time
from typing import Any

from agentrun_devtools.processes import wait_for
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from agentrun import store
from agentrun.vocabulary import (
    ANNOTATION_FORCE_REPLAY,
    ANNOTATION_INPUT_DIGEST,
    LABEL_REPLAY_OF,
    Condition,
    Phase,
    ReplayPhase,
    ReplayReason,
)
from tests.harness import System
from tests.replays import (
    condition,
    create_replay,
    events,
    evicted_after_send_email,
    evicted_before_any_tool,
    replay_runs,
    start,
    unique_text,
    wait_decided,
)

FORCE_HINT = f"Annotate {ANNOTATION_FORCE_REPLAY}=true to run it again anyway."
DONE = [{"text": "Nothing to do."}]


def assert_refused(replay: dict[str, Any], reason: str, *phrases: str) -> None:
    status = replay["status"]
    assert (status["phase"], status["reason"]) == (ReplayPhase.REFUSED, reason), status
    for phrase in phrases:
        assert phrase in status["message"], status["message"]
    approved = condition(replay, Condition.APPROVED)
    assert (approved["status"], approved["reason"]) == ("False", reason)
    assert "replayRunName" not in status
    assert status["decidedAt"]


# -- one test per row ---------------------------------------------------------------------


def test_run_not_found(system: System, namespace: str) -> None:
    create_replay(system, namespace, "ghost-again", "ghost")
    replay = wait_decided(system, namespace, "ghost-again")
    assert_refused(replay, ReplayReason.RUN_NOT_FOUND, "AgentRun ghost does not exist")
    assert "toolsExecuted" not in replay["status"]
    # `kubectl describe` shows the decision as a Warning Event.
    seen = [(e["type"], e["reason"]) for e in events(system, namespace, "ghost-again")]
    assert ("Warning", ReplayReason.RUN_NOT_FOUND) in seen


def test_running_original_is_refused_and_force_does_not_change_that(
        system: System, namespace: str) -> None:
    start(system, namespace, "busy", [{"sleep": 120}, {"text": "done"}])
    system.wait_phase(namespace, "busy", Phase.RUNNING)
    create_replay(system, namespace, "busy-again", "busy")
    replay = wait_decided(system, namespace, "busy-again")
    assert_refused(replay, ReplayReason.ORIGINAL_RUNNING, "AgentRun busy is still Running",
                   "wait for it to settle")

    # A forcer adds the annotation: the replay is examined again, and refused again.
    system.kubectl("annotate", "-n", namespace, "agentrunreplay/busy-again",
                   f"{ANNOTATION_FORCE_REPLAY}=true")

    def refusals() -> int:
        return sum(e["reason"] == ReplayReason.ORIGINAL_RUNNING
                   for e in events(system, namespace, "busy-again"))

    wait_for(lambda: refusals() == 2, timeout=30, what="second OriginalRunning decision")
    replay = wait_decided(system, namespace, "busy-again")
    assert_refused(replay, ReplayReason.ORIGINAL_RUNNING, "Forcing does not change this",
                   "The force annotation was examined")
    assert replay_runs(system, namespace, "busy") == []
    # ... and examined once: its own status write brings no further decision (each would
    # be another status write and another Event, twice a second).
    version = replay["metadata"]["resourceVersion"]
    time.sleep(3)
    assert refusals() == 2
    assert wait_decided(system, namespace, "busy-again")["metadata"]["resourceVersion"] == version
    system.kubectl("delete", "-n", namespace, "agentrun/busy", "--wait=false")


def test_input_snapshot_gone_is_refused_even_when_forced(system: System, namespace: str) -> None:
    start(system, namespace, "forgotten", DONE)
    run = system.wait_phase(namespace, "forgotten", Phase.SUCCEEDED, Phase.FAILED)
    digest = run["status"]["inputDigest"]
    assert system.store(lambda e: store.delete_input(e, digest))

    create_replay(system, namespace, "forgotten-again", "forgotten")
    create_replay(system, namespace, "forgotten-forced", "forgotten", force=True)
    for name in ("forgotten-again", "forgotten-forced"):
        assert_refused(wait_decided(system, namespace, name), ReplayReason.INPUT_GONE,
                       f"input snapshot {digest}", "partial input", "even when forced")
    assert replay_runs(system, namespace, "forgotten") == []


def test_succeeded_original_is_refused(system: System, namespace: str) -> None:
    start(system, namespace, "done", DONE)
    system.wait_phase(namespace, "done", Phase.SUCCEEDED)
    create_replay(system, namespace, "done-again", "done")
    replay = wait_decided(system, namespace, "done-again")
    assert_refused(replay, ReplayReason.ORIGINAL_SUCCEEDED, "AgentRun done succeeded",
                   "side effects already happened", FORCE_HINT)
    assert replay["status"]["toolsExecuted"] == []


def test_unknown_tools_are_refused(system: System, namespace: str) -> None:
    """toolsExecuted unknown, as after a run store that could not be read.

    The decision reads the store, so that is where we make it unknown (NULL), as a settle
    that could not count leaves it; the status keeps its [] (the operator's safety net
    acts on a null status, and would race this test). tests/operator/replay/test_handler.py covers
    the null through the handler.
    """
    run = evicted_before_any_tool(system, namespace, "murky")

    async def forget(engine: AsyncEngine) -> None:
        async with engine.begin() as conn:
            await conn.execute(text("UPDATE runs SET tools_executed = NULL WHERE uid = :u"),
                               {"u": run["metadata"]["uid"]})

    system.store(forget)
    create_replay(system, namespace, "murky-again", "murky")
    replay = wait_decided(system, namespace, "murky-again")
    assert_refused(replay, ReplayReason.TOOL_STATE_UNKNOWN,
                   "Whether AgentRun murky called any tool before failing is unknown",
                   FORCE_HINT)
    assert replay["status"]["toolsExecuted"] is None


def test_tools_executed_are_refused_naming_them(system: System, namespace: str) -> None:
    evicted_after_send_email(system, namespace, "mailed")
    create_replay(system, namespace, "mailed-again", "mailed")
    replay = wait_decided(system, namespace, "mailed-again")
    assert_refused(replay, ReplayReason.TOOLS_EXECUTED,
                   "This run already called send_email before failing: a replay "
                   "would call them again.", FORCE_HINT)
    assert replay["status"]["toolsExecuted"] == ["send_email"]
    assert replay_runs(system, namespace, "mailed") == []
    assert len(system.emails("mailed")) == 1


def test_no_tools_is_approved_and_the_replay_runs_on_the_snapshot(
        system: System, namespace: str) -> None:
    """Approved NoToolsExecuted: a NEW run on the original's snapshot (its ConfigMap is
    gone by then), in a fresh session, for the same user; the original is untouched."""
    system.kubectl("create", "configmap", "tickets", "-n", namespace,
                   "--from-literal=42.txt=Refund for order 42, please.")
    evicted_before_any_tool(system, namespace, "quiet", userId="alice",
                            input={"text": unique_text(), "files": [
                                {"name": "ticket.txt",
                                 "configMapKeyRef": {"name": "tickets", "key": "42.txt"}}]})
    system.kubectl("delete", "configmap", "tickets", "-n", namespace)
    before = system.run(namespace, "quiet")

    create_replay(system, namespace, "quiet-again", "quiet")
    replay = wait_decided(system, namespace, "quiet-again")
    status = replay["status"]
    assert (status["phase"], status["reason"]) == (ReplayPhase.APPROVED,
                                                   ReplayReason.NO_TOOLS_EXECUTED), status
    assert "AgentRun quiet (Evicted) called no tool" in status["message"]
    assert condition(replay, Condition.APPROVED)["status"] == "True"
    assert status["toolsExecuted"] == []
    name = status["replayRunName"]
    assert name.startswith("quiet-again-")
    assert [r["metadata"]["name"] for r in replay_runs(system, namespace, "quiet")] == [name]

    again = system.wait_phase(namespace, name, Phase.SUCCEEDED, Phase.FAILED, timeout=120)
    assert again["status"]["phase"] == Phase.SUCCEEDED, again["status"]
    assert again["spec"]["replayOf"] == "quiet"
    assert again["metadata"]["labels"][LABEL_REPLAY_OF] == "quiet"
    assert again["spec"]["userId"] == "alice"
    assert again["spec"]["input"] == before["spec"]["input"]
    assert again["status"]["inputDigest"] == before["status"]["inputDigest"]
    assert again["metadata"]["annotations"][ANNOTATION_INPUT_DIGEST] == (
        before["status"]["inputDigest"])
    assert again["status"]["sessionId"] != before["status"]["sessionId"]
    assert again["status"]["toolsExecuted"] == []

    after = system.run(namespace, "quiet")
    assert (after["spec"], after["status"]) == (before["spec"], before["status"])
    assert any(e["reason"] == "Replayed" for e in events(system, namespace, "quiet"))
    assert any(e["reason"] == ReplayReason.NO_TOOLS_EXECUTED and e["type"] == "Normal"
               for e in events(system, namespace, "quiet-again"))


def test_a_second_replay_of_the_same_run_is_already_replayed(
        system: System, namespace: str) -> None:
    evicted_before_any_tool(system, namespace, "twice")
    create_replay(system, namespace, "twice-1", "twice")
    first = wait_decided(system, namespace, "twice-1")
    assert first["status"]["phase"] == ReplayPhase.APPROVED
    create_replay(system, namespace, "twice-2", "twice")
    assert_refused(wait_decided(system, namespace, "twice-2"), ReplayReason.ALREADY_REPLAYED,
                   "AgentRunReplay twice-1 was approved", FORCE_HINT)
    assert len(replay_runs(system, namespace, "twice")) == 1
