"""The operator's caches and its own writes' answers (no cluster): an answer that comes
back after the watch showed its object deleted must not bring the object back, or every
resync looks at it again and writes to it (404) for as long as the operator lives."""

from __future__ import annotations

import asyncio
import time
from typing import Any, cast

import kopf
from agentrun_operator import namespaces
from agentrun_operator.controller import DELETED_KEPT_SECONDS
from agentrun_operator.handlers import _observe, _whole, keeps_gone, prune_gone
from agentrun_operator.reconcile import FINALIZER, Context


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


class _Namespaces:
    """What namespaces.look() asks of the API server, as a table."""

    def __init__(self, existing: set[str], terminating: set[str], version: int,
                 runs: dict[str, tuple[list[dict[str, Any]], int]]) -> None:
        self.existing, self.terminating, self.version, self.runs = (
            existing, terminating, version, runs)

    async def namespaces(self) -> tuple[set[str], set[str], int]:
        return self.existing, self.terminating, self.version

    async def list_runs_versioned(self, namespace: str) -> tuple[list[dict[str, Any]], int]:
        return self.runs[namespace]


def _run(namespace: str, name: str, version: int, *, deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"namespace": namespace, "name": name, "uid": f"uid-{name}",
                            "resourceVersion": str(version)}
    if deleting:
        meta |= {"deletionTimestamp": "2026-12-06T00:00:00Z", "finalizers": [FINALIZER]}
    return {"metadata": meta, "spec": {}, "status": {"phase": "Succeeded"}}


def test_the_runs_of_namespaces_kopf_no_longer_watches() -> None:
    ctx = _context()
    for run in (_run("gone", "a", 5), _run("made-again", "b", 20), _run("live", "c", 3),
                _run("ending", "released", 7)):
        ctx.runs[(run["metadata"]["namespace"], run["metadata"]["name"])] = run
    ctx.kube = cast(Any, _Namespaces(
        existing={"live", "ending"}, terminating={"ending"}, version=10,
        runs={"ending": ([_run("ending", "held", 8, deleting=True)], 12)}))
    asyncio.run(namespaces.look(ctx, lambda ns: ns != "elsewhere"))
    # Gone with its namespace (listed before it changed last): out of the cache, and its
    # write's answer does not bring it back.
    assert ("gone", "a") not in ctx.runs
    ctx.remember(_run("gone", "a", 6))
    assert ("gone", "a") not in ctx.runs
    # Newer than the namespaces' list (a namespace made again since): kept.
    assert ("made-again", "b") in ctx.runs and ("live", "c") in ctx.runs
    # Of the namespace being deleted: the run we hold, cached and queued; one no longer
    # listed there, out.
    assert ctx.runs[("ending", "held")]["metadata"]["deletionTimestamp"]
    assert ("run", "ending", "held") in ctx.queue._queued
    assert ("ending", "released") not in ctx.runs


def test_deletions_are_remembered_ten_minutes(monkeypatch: Any) -> None:
    ctx, clock = _context(), [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    ctx.note_deleted("old")
    clock[0] += 300
    ctx.note_deleted("newer")
    clock[0] += DELETED_KEPT_SECONDS - 299  # "old" is past ten minutes, "newer" is not
    ctx.note_deleted("newest")
    assert list(ctx.deleted) == ["newer", "newest"]


def test_a_deleted_run_takes_what_the_caches_kept_for_its_attempts_with_it() -> None:
    ctx = _context()
    for key in (("t1", "triage-1"), ("t1", "triage-2"), ("t1", "other-1")):
        ctx.gone[key] = {"metadata": {"name": key[1]}}
        ctx.expected[key] = 1.0
    ctx.usage_written[("t1", "triage")] = 1.0
    ctx.forget_run({"metadata": {"namespace": "t1", "name": "triage"},
                    "status": {"attempts": 2}})
    assert set(ctx.gone) == {("t1", "other-1")}
    assert set(ctx.expected) == {("t1", "other-1")}
    assert not ctx.usage_written


def _owner(uid: str, phase: str) -> dict[str, Any]:
    return {"metadata": {"namespace": "t1", "name": "triage", "uid": uid},
            "status": {"phase": phase}}


def _pod(owner_uid: str) -> dict[str, Any]:
    return {"metadata": {"namespace": "t1", "name": "triage-1",
                         "labels": {"agentrun.dev/run": "triage"},
                         "ownerReferences": [{"uid": owner_uid}]}}


def test_a_deleted_pod_is_kept_for_its_live_run_or_a_run_not_seen_yet_only() -> None:
    assert keeps_gone(_owner("u1", "Running"), _pod("u1"))
    # The operator just started: kopf has not listed the runs yet, the pod informer has.
    assert keeps_gone(None, _pod("u1"))
    assert not keeps_gone(_owner("u1", "Succeeded"), _pod("u1"))  # settled: never read
    assert not keeps_gone(_owner("u2", "Running"), _pod("u1"))  # a run of the same name, anew


def test_a_resync_drops_the_deleted_pods_of_runs_that_settled_or_went() -> None:
    ctx = _context()
    ctx.gone[("t1", "triage-1")] = _pod("u1")
    ctx.runs[("t1", "triage")] = _owner("u1", "Running")
    prune_gone(ctx)
    assert ("t1", "triage-1") in ctx.gone
    ctx.runs[("t1", "triage")] = _owner("u1", "Failed")
    prune_gone(ctx)
    assert not ctx.gone
    ctx.gone[("t1", "triage-1")] = _pod("u1")
    del ctx.runs[("t1", "triage")]
    prune_gone(ctx)
    assert not ctx.gone
