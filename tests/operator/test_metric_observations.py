"""What an attempt's end adds to the metrics: evictions counted whatever follows, and the
eviction-to-Failed latency measured from when the cluster began taking the pod away."""

from __future__ import annotations

import datetime
from typing import Any

import pytest
from agentrun_operator import metrics
from prometheus_client import REGISTRY

from agentrun.vocabulary import Phase, Reason


def _value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def _ago(seconds: float) -> str:
    then = datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=seconds)
    return then.strftime("%Y-%m-%dT%H:%M:%SZ")


def _pod(condition_age: float | None, deleted_age: float | None) -> dict[str, Any]:
    pod: dict[str, Any] = {"metadata": {}, "status": {"conditions": []}}
    if condition_age is not None:
        pod["status"]["conditions"].append({"type": "DisruptionTarget", "status": "True",
                                            "reason": "EvictionByEvictionAPI",
                                            "lastTransitionTime": _ago(condition_age)})
    if deleted_age is not None:
        pod["metadata"]["deletionTimestamp"] = _ago(deleted_age)
    return pod


@pytest.mark.parametrize(("ages", "low", "high"), [
    ((10, 4), 10, 12),  # the condition, not the later deletion
    ((None, 4), 4, 6),  # no condition (the kubelet's own eviction): the deletion
], ids=["condition", "deletion"])
def test_an_evicted_run_failed_observes_the_latency(ages: tuple[float | None, float | None],
                                                    low: float, high: float) -> None:
    # Stamped now, not when the module was collected (a long session runs it much later).
    pod = _pod(*ages)
    count = "agentrun_eviction_to_failed_seconds_count"
    total = "agentrun_eviction_to_failed_seconds_sum"
    before = _value(count, reason=Reason.EVICTED), _value(total, reason=Reason.EVICTED)
    metrics.settled(Phase.FAILED, Reason.EVICTED, ["send_email"], pod)
    assert _value(count, reason=Reason.EVICTED) == before[0] + 1
    assert low <= _value(total, reason=Reason.EVICTED) - before[1] < high


@pytest.mark.parametrize(("phase", "reason", "pod"), [
    (Phase.FAILED, Reason.EVICTED, None),  # gone from the cache: nothing to measure from
    (Phase.FAILED, Reason.EVICTED, _pod(None, None)),
    (Phase.FAILED, Reason.POD_DELETED, _pod(None, 3)),  # not an eviction
    (Phase.SUCCEEDED, Reason.SUCCEEDED, _pod(5, 3)),
])
def test_other_ends_observe_nothing(phase: str, reason: str,
                                    pod: dict[str, Any] | None) -> None:
    seen = {r: _value("agentrun_eviction_to_failed_seconds_count", reason=r)
            for r in (Reason.EVICTED, Reason.POD_DELETED, Reason.SUCCEEDED)}
    metrics.settled(phase, reason, [], pod)
    assert seen == {r: _value("agentrun_eviction_to_failed_seconds_count", reason=r)
                    for r in seen}


def test_evictions_count_retried_resumed_and_failed_attempts() -> None:
    before = _value("agentrun_evictions_total", reason=Reason.PREEMPTED)
    metrics.retried(Reason.PREEMPTED)
    metrics.resumed(Reason.PREEMPTED)
    metrics.settled(Phase.FAILED, Reason.PREEMPTED, None, None)
    metrics.retried(Reason.AGENT_ERROR)
    assert _value("agentrun_evictions_total", reason=Reason.PREEMPTED) == before + 3
    assert _value("agentrun_evictions_total", reason=Reason.AGENT_ERROR) == 0
