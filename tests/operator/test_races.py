"""The operator's own steps racing each other, made exact: reconciles are called directly
(with the operator's credential and store) in a namespace no operator watches, so that
the race happens every time instead of once in a while."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from agentrun_operator import reconcile
from agentrun_operator.classify import Outcome
from agentrun_operator.kube import Conflict
from agentrun_operator.reconcile import Context

from agentrun import store
from agentrun.vocabulary import Phase, Reason
from tests.harness import System, agent_run, as_operator, in_namespace


async def drive(ctx: Context, namespace: str, name: str, passes: int = 12) -> None:
    """Reconciles on fresh reads until the run has nothing left to do right now."""
    for _ in range(passes):
        ctx.runs.clear()
        try:
            again = await reconcile.reconcile_run(ctx, namespace, name)
        except Conflict:
            continue
        if again is None or again > 0:
            return


def test_three_observers_of_one_eviction_start_one_retry(
        system: System, solo_namespace: str) -> None:
    """Two reconciles that each saw the end of attempt 1 in the pod, and a third that
    reads the run as it was before, all act on that one eviction at once (three replicas,
    or a stale event and a resync). Exactly one settles it and starts attempt 2; the
    others lose their writes and must not report the run Failed over that retry."""
    ns = solo_namespace
    script = [{"sleep": 60}, {"text": "done"}]
    system.apply(in_namespace(agent_run("raced", script, retry={"maxAttempts": 2}), ns))
    as_operator(system, lambda ctx: drive(ctx, ns, "raced"),
                runner_service_account="default")
    system.wait_pod_running(ns, "raced-1")
    as_operator(system, lambda ctx: drive(ctx, ns, "raced"),
                runner_service_account="default")
    stale_view = system.run(ns, "raced")
    assert stale_view["status"]["phase"] == Phase.RUNNING
    # The evicted pod stays readable (deleting, with its DisruptionTarget) while the three
    # act: the one that reads it must see this eviction, not a pod already gone.
    held = json.dumps({"metadata": {"finalizers": ["agentrun.dev/test-hold"]}})
    system.kubectl("patch", "pod", "raced-1", "-n", ns, "--type=merge", "-p", held)
    try:
        _race(system, ns, stale_view)
    finally:
        system.kubectl("patch", "pod", "raced-1", "-n", ns, "--type=merge",
                       "-p", json.dumps({"metadata": {"finalizers": None}}), check=False)


def _race(system: System, ns: str, stale_view: dict[str, Any]) -> None:
    system.evict(ns, "raced-1")
    evicted = Outcome(Phase.FAILED, Reason.EVICTED, "The runner pod was evicted.")

    async def race(ctx: Context) -> list[Any]:
        def observer() -> Context:
            seen = Context(config=ctx.config, engine=ctx.engine, kube=ctx.kube)
            seen.runs[(ns, "raced")] = reconcile.slim_run(stale_view)
            return seen

        return await asyncio.gather(
            reconcile._finish(observer(), stale_view, 1, evicted),
            reconcile._finish(observer(), stale_view, 1, evicted),
            reconcile.reconcile_run(observer(), ns, "raced"),
            return_exceptions=True)

    results = as_operator(system, race, runner_service_account="default")
    losers = [r for r in results if isinstance(r, Conflict)]
    assert len(losers) == 2, results  # one write won; the stale ones lost, none overwrote
    status = system.run(ns, "raced")["status"]
    assert (status["phase"], status["attempts"], status["reason"]) == (
        Phase.PENDING, 2, Reason.RETRYING), status

    as_operator(system, lambda ctx: drive(ctx, ns, "raced"),
                runner_service_account="default")
    status = system.run(ns, "raced")["status"]
    assert (status["phase"], status["attempts"], status["podName"]) == (
        Phase.PENDING, 2, "raced-2"), status
    pods = json.loads(system.kubectl("get", "pods", "-n", ns, "-o", "json").stdout)["items"]
    names = {p["metadata"]["name"] for p in pods}
    assert "raced-2" in names and names <= {"raced-1", "raced-2"}  # raced-1 may be gone
    attempts = system.store(lambda e: store.get_attempt(e, stale_view["metadata"]["uid"], 1))
    assert attempts is not None and attempts.reason == Reason.EVICTED
    assert attempts.tools_executed == []
