"""One approval per original: at most one non-forced replay of a run is ever approved, even
when replays are created at the same instant, or two operator replicas handle them. The
store enforces it (a unique constraint, see agentrun/store/replays.py), not memory."""

from __future__ import annotations

import json
import threading
from collections import Counter
from pathlib import Path

from agentrun_devtools.processes import wait_for
from agentrun_kubectl.replay import replay_manifest

from agentrun.vocabulary import ReplayPhase, ReplayReason
from tests.harness import Operator, System
from tests.replays import evicted_before_any_tool, replay_runs, wait_decided


def create_at_once(system: System, namespace: str, names: list[str], run_name: str) -> None:
    """Creates the replays from as many threads, released together."""
    gate = threading.Barrier(len(names))
    errors: list[BaseException] = []

    def create(name: str) -> None:
        manifest = replay_manifest(name, run_name)
        manifest["metadata"]["namespace"] = namespace
        body = json.dumps(manifest)
        gate.wait()
        try:
            system.kubectl("create", "-f", "-", input=body)
        except BaseException as e:  # reported below, in the test's thread
            errors.append(e)

    threads = [threading.Thread(target=create, args=(n,)) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def assert_one_approved(system: System, namespace: str, names: list[str],
                        original: str) -> None:
    decided = {n: wait_decided(system, namespace, n)["status"] for n in names}
    reasons = Counter(s["reason"] for s in decided.values())
    assert reasons == {ReplayReason.NO_TOOLS_EXECUTED: 1,
                       ReplayReason.ALREADY_REPLAYED: len(names) - 1}, decided
    winner = next(n for n, s in decided.items() if s["phase"] == ReplayPhase.APPROVED)
    for name, status in decided.items():
        if name != winner:
            assert f"AgentRunReplay {winner} was approved" in status["message"]
    runs = replay_runs(system, namespace, original)
    assert [r["metadata"]["name"] for r in runs] == [decided[winner]["replayRunName"]]


def test_replays_created_at_the_same_instant(system: System, namespace: str) -> None:
    evicted_before_any_tool(system, namespace, "popular", sleep=30)
    names = [f"popular-{i}" for i in range(4)]
    create_at_once(system, namespace, names, "popular")
    assert_one_approved(system, namespace, names, "popular")


def test_two_operator_replicas(system: System, solo_namespace: str, tmp_path: Path) -> None:
    """Two operator processes both handle every replay of the namespace (no leader)."""
    ns = solo_namespace
    args = (f"--namespace={ns}", "--toleration-seconds=6", "--check-interval=1")
    first = Operator(system.plane, system.store_url, tmp_path / "a", args).start()
    second: Operator | None = None
    try:
        solo = System(system.plane, system.store_url, first)
        evicted_before_any_tool(solo, ns, "shared", sleep=30)
        second = Operator(system.plane, system.store_url, tmp_path / "b", args).start()
        names = ["shared-a", "shared-b", "shared-c"]
        create_at_once(solo, ns, names, "shared")
        assert_one_approved(solo, ns, names, "shared")
        # Both replicas did decide (each logs its decisions).
        for replica in (first, second):
            wait_for(lambda r=replica: "event=replay-decided replay=" + ns in r.log(),
                     timeout=30, what="a decision in each replica's log")
    finally:
        if second is not None:
            second.stop()
        first.stop()
