"""Replays across an operator restart: a force annotation added while no operator runs is
acted on when one starts again; decided replays are left as they are."""

from __future__ import annotations

from pathlib import Path

from agentrun_devtools.processes import wait_for

from agentrun.vocabulary import ANNOTATION_FORCE_REPLAY, Phase, ReplayPhase, ReplayReason
from tests.harness import Operator, System, agent_run, in_namespace
from tests.replays import create_replay, events, get_replay, unique_text, wait_decided


def test_force_added_while_the_operator_was_down(
        system: System, solo_namespace: str, tmp_path: Path) -> None:
    ns = solo_namespace
    operator = Operator(system.plane, system.store_url, tmp_path,
                        (f"--namespace={ns}", "--check-interval=1")).start()
    solo = System(system.plane, system.store_url, operator)
    try:
        solo.apply(in_namespace(agent_run("done", [{"text": "ok"}], text=unique_text()), ns))
        solo.wait_phase(ns, "done", Phase.SUCCEEDED)
        create_replay(solo, ns, "done-again", "done")
        create_replay(solo, ns, "done-later", "done")
        assert wait_decided(solo, ns, "done-again")["status"]["reason"] == (
            ReplayReason.ORIGINAL_SUCCEEDED)
        assert wait_decided(solo, ns, "done-later")["status"]["reason"] == (
            ReplayReason.ORIGINAL_SUCCEEDED)

        operator.stop()
        solo.kubectl("annotate", "-n", ns, "agentrunreplay/done-again",
                     f"{ANNOTATION_FORCE_REPLAY}=true")
        operator.start()

        def forced() -> bool:
            return get_replay(solo, ns, "done-again")["status"]["phase"] == (
                ReplayPhase.APPROVED)

        wait_for(forced, timeout=60, what="the force acted on after the restart")
        assert get_replay(solo, ns, "done-again")["status"]["reason"] == ReplayReason.FORCED
        # The other, unforced and refused, was not decided again.
        later = [e for e in events(solo, ns, "done-later")
                 if e["reason"] == ReplayReason.ORIGINAL_SUCCEEDED]
        assert len(later) == 1
    finally:
        operator.stop()
