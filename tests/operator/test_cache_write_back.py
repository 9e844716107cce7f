"""The operator's caches and its own writes' answers (no cluster): an answer that comes
back after the watch showed its object deleted must not bring the object back, or every
resync looks at it again and writes to it (404) for as long as the operator lives."""

from __future__ import annotations

from typing import Any, cast

import kopf
from agentrun_operator.handlers import _observe, _whole
from agentrun_operator.reconcile import Context


def _context() -> Context:
    return Context(config=cast(Any, None), engine=cast(Any, None), kube=cast(Any, None))


def _schedule(uid: str, version: str) -> dict[str, Any]:
    return {"apiVersion": "agentrun.dev/v1alpha1", "kind": "AgentRunSchedule",
            "metadata": {"namespace": "t1", "name": "nightly", "uid": uid,
                         "resourceVersion": version},
            "spec": {}, "status": {"lastScheduleTime": version}}


def test_a_write_answered_after_the_deletion_is_not_cached() -> None:
    ctx = _context()
    _observe(ctx, ctx.schedules, "schedule", "ADDED", kopf.Body(_schedule("u1", "5")), _whole)
    ctx.keep(ctx.schedules, _schedule("u1", "6"))  # our status write, answered
    assert ctx.schedules[("t1", "nightly")]["metadata"]["resourceVersion"] == "6"
    _observe(ctx, ctx.schedules, "schedule", "DELETED", kopf.Body(_schedule("u1", "7")),
             _whole)
    ctx.keep(ctx.schedules, _schedule("u1", "8"))  # a write sent before, answered after
    assert ("t1", "nightly") not in ctx.schedules


def test_a_new_object_of_the_same_name_is_cached() -> None:
    ctx = _context()
    _observe(ctx, ctx.schedules, "schedule", "DELETED", kopf.Body(_schedule("u1", "7")),
             _whole)
    ctx.keep(ctx.schedules, _schedule("u2", "9"))  # created again: another uid
    assert ctx.schedules[("t1", "nightly")]["metadata"]["uid"] == "u2"
    run = {"metadata": {"namespace": "t1", "name": "nightly-1", "uid": "r1",
                        "resourceVersion": "10"}, "spec": {}, "status": {}}
    ctx.remember(run)  # a run this operator created, before the watch shows it
    assert ("t1", "nightly-1") in ctx.runs
