"""The operator's own steps racing each other, made exact: the lifecycle functions are
called directly (with the operator's credential and store) in a namespace no operator
watches, so that the race happens every time instead of once in a while."""

from __future__ import annotations

import asyncio
import json
from typing import TypeVar

from agentrun_operator import lifecycle
from agentrun_operator.classify import Outcome
from agentrun_operator.lifecycle import Context

from agentrun import store
from agentrun.vocabulary import Phase, Reason
from tests.harness import System, agent_run, as_operator, in_namespace

T = TypeVar("T")


def test_three_observers_of_one_eviction_start_one_retry(
        system: System, solo_namespace: str) -> None:
    """The pod event, the safety-net timer and a node re-check all see the same end of
    attempt 1 at once, each holding the run as it was before. Exactly one settles it and
    starts attempt 2; the others must not report the run Failed over that retry."""
    ns = solo_namespace
    script = [{"sleep": 60}, {"text": "done"}]
    system.apply(in_namespace(agent_run("raced", script, retry={"maxAttempts": 2}), ns))
    before = system.run(ns, "raced")
    as_operator(system, lambda ctx: lifecycle.launch(ctx, before),
                runner_service_account="default")
    system.wait_pod_running(ns, "raced-1")
    stale_view = system.run(ns, "raced")
    system.evict(ns, "raced-1")
    evicted = Outcome(Phase.FAILED, Reason.EVICTED, "The runner pod was evicted.")

    async def race(ctx: Context) -> None:
        await asyncio.gather(
            lifecycle.finish_attempt(ctx, stale_view, 1, evicted),
            lifecycle.finish_attempt(ctx, stale_view, 1, evicted),
            lifecycle.check(ctx, stale_view),
        )

    as_operator(system, race, runner_service_account="default")
    status = system.run(ns, "raced")["status"]
    assert (status["phase"], status["attempts"], status["podName"]) == (
        Phase.PENDING, 2, "raced-2"), status
    assert status["reason"] == Reason.RETRYING
    pods = json.loads(system.kubectl("get", "pods", "-n", ns, "-o", "json").stdout)["items"]
    names = {p["metadata"]["name"] for p in pods}
    assert "raced-2" in names and names <= {"raced-1", "raced-2"}  # raced-1 may be gone
    attempts = system.store(lambda e: store.get_attempt(e, before["metadata"]["uid"], 1))
    assert attempts is not None and attempts.reason == Reason.EVICTED
    assert attempts.tools_executed == []
