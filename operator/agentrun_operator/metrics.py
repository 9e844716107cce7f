"""Prometheus metrics of the operator (served on --metrics-port when it is set; the store
API, a program of its own, serves its own, agentrun_store_api.metrics). docs/operator.md
has the table; the chart's dashboard reads only these names."""

from __future__ import annotations

import datetime
from collections import Counter as Tally
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from prometheus_client import (
    REGISTRY,
    Counter,
    Histogram,
    disable_created_metrics,
    start_http_server,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from agentrun.vocabulary import Phase, Reason

# No `_created` series beside every counter: nothing here reads them.
disable_created_metrics()
# Latencies from a few milliseconds (a ledger row) to minutes (a slow eviction).
_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
            120.0, 300.0)
# Ends that are the cluster taking the pod away: counted as evictions.
EVICTIONS = frozenset({Reason.EVICTED, Reason.PREEMPTED})

RUNS_SETTLED = Counter(
    "agentrun_runs_settled_total",
    "Runs settled by this operator (the end shown in their status), by phase and reason.",
    ["phase", "reason"],
)
RUNS_EXPIRED = Counter(
    "agentrun_runs_expired_total",
    "Settled runs deleted from the API server when their time to live was up "
    "(ttlSecondsAfterFinished); their records stay in the store.",
)
ATTEMPTS_STARTED = Counter(
    "agentrun_attempts_started_total",
    "Runner pods created, one per attempt.",
)
ATTEMPTS_RETRIED = Counter(
    "agentrun_attempts_retried_total",
    "New attempts started from scratch because the failed one provably called no tool, "
    "by the reason the failed attempt ended with.",
    ["reason"],
)
ATTEMPTS_RESUMED = Counter(
    "agentrun_attempts_resumed_total",
    "Failed attempts resumed by the next one (spec.retry.resume), by the reason the "
    "failed attempt ended with.",
    ["reason"],
)
EVICTIONS_TOTAL = Counter(
    "agentrun_evictions_total",
    "Attempts ended by the cluster taking their pod away (Evicted, Preempted), whether "
    "the run then failed, was retried or was resumed.",
    ["reason"],
)
EVICTION_TO_FAILED = Histogram(
    "agentrun_eviction_to_failed_seconds",
    "From the pod's DisruptionTarget condition (else its deletionTimestamp) to the "
    "return of the status write that shows the run Failed.",
    ["reason"],
    buckets=_BUCKETS,
)
REPLAY_DECISIONS = Counter(
    "agentrun_replay_decisions_total",
    "AgentRunReplay decisions written to their status, by phase and reason.",
    ["phase", "reason"],
)
SCHEDULE_SLOTS = Counter(
    "agentrun_schedule_slots_total",
    "AgentRunSchedule slots that came due, by what became of them: created (a run was "
    "started), skipped (Forbid, a run was live), missed (past startingDeadlineSeconds, or "
    "passed over after downtime), passed (suspended).",
    ["outcome"],
)
SCHEDULE_START_DELAY = Histogram(
    "agentrun_schedule_start_delay_seconds",
    "From a slot's time to the return of the create of its AgentRun.",
    buckets=_BUCKETS,
)
TOOLS_UNKNOWN = Counter(
    "agentrun_tools_unknown_total",
    "Runs settled while the run store could not be read (toolsExecuted null).",
)
STORE_ERRORS = Counter(
    "agentrun_store_errors_total",
    "Run store operations that failed (the store unreachable or refusing), by operation.",
    ["operation"],
)
RECONCILE_DURATION = Histogram(
    "agentrun_reconcile_duration_seconds",
    "Time of one reconcile, by kind (run, replay) and result (ok, conflict, error).",
    ["kind", "result"],
    buckets=_BUCKETS,
)



class _Caches(Collector):
    """Gauges read from the operator's caches at scrape time (nothing to keep in step);
    none until `watch` says where from (the store API on its own has no caches)."""

    def __init__(self) -> None:
        self.runs: Callable[[], Iterable[Mapping[str, Any]]] | None = None
        self.depth: Callable[[], int] = lambda: 0

    def describe(self) -> Iterator[GaugeMetricFamily]:
        # One sample per family, so that what describes them says their labels too.
        return self._families({}, 0, {"": 0})

    def collect(self) -> Iterator[GaugeMetricFamily]:
        if self.runs is None:
            return iter(())
        runs = list(self.runs())
        phases = Tally(str((r.get("status") or {}).get("phase") or Phase.PENDING)
                       for r in runs)
        waiting = Tally(str(r["metadata"].get("namespace") or "") for r in runs
                        if (r.get("status") or {}).get("phase") == Phase.WAITING)
        return self._families(phases, self.depth(), waiting)

    def _families(self, phases: Mapping[str, int], depth: int,
                  waiting: Mapping[str, int]) -> Iterator[GaugeMetricFamily]:
        runs = GaugeMetricFamily(
            "agentrun_runs", "AgentRuns in the operator's cache, by phase (a run not "
            "launched yet counts as Pending).", labels=["phase"])
        for phase in sorted({*Phase.LIVE, *Phase.TERMINAL, *phases}):
            runs.add_metric([phase], phases.get(phase, 0))
        yield runs
        yield GaugeMetricFamily(
            "agentrun_workqueue_depth", "Keys waiting on the work queue (not being worked "
            "on).", value=depth)
        pending = GaugeMetricFamily(
            "agentrun_approvals_pending", "AgentRuns waiting for an approval of a tool "
            "call, by namespace.", labels=["namespace"])
        for namespace, count in sorted(waiting.items()):
            pending.add_metric([namespace], count)
        yield pending


_CACHES = _Caches()
REGISTRY.register(_CACHES)


def watch(runs: Callable[[], Iterable[Mapping[str, Any]]], depth: Callable[[], int]) -> None:
    """Where the gauges of runs by phase and of the queue depth are read from."""
    _CACHES.runs, _CACHES.depth = runs, depth


def retried(reason: str) -> None:
    ATTEMPTS_RETRIED.labels(reason).inc()
    _ended(reason)


def resumed(reason: str) -> None:
    ATTEMPTS_RESUMED.labels(reason).inc()
    _ended(reason)


def settled(phase: str, reason: str, tools: list[str] | None,
            pod: Mapping[str, Any] | None) -> None:
    """A run's end was written to its status just now; `pod` is its last pod as cached."""
    RUNS_SETTLED.labels(phase, reason).inc()
    if tools is None:
        TOOLS_UNKNOWN.inc()
    _ended(reason)
    if phase == Phase.FAILED and reason in EVICTIONS and pod is not None:
        began = disruption_began(pod)
        if began is not None:
            elapsed = (datetime.datetime.now(datetime.UTC) - began).total_seconds()
            EVICTION_TO_FAILED.labels(reason).observe(max(0.0, elapsed))


def _ended(reason: str) -> None:
    if reason in EVICTIONS:
        EVICTIONS_TOTAL.labels(reason).inc()


def disruption_began(pod: Mapping[str, Any]) -> datetime.datetime | None:
    """When the cluster began taking `pod` away: its DisruptionTarget condition's
    lastTransitionTime, else its deletionTimestamp (None: neither is there)."""
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "DisruptionTarget" and condition.get("status") == "True":
            stamp = condition.get("lastTransitionTime")
            if stamp:
                return _parse(stamp)
    stamp = (pod.get("metadata") or {}).get("deletionTimestamp")
    return _parse(stamp) if stamp else None


def _parse(stamp: Any) -> datetime.datetime:
    if isinstance(stamp, datetime.datetime):
        return stamp if stamp.tzinfo else stamp.replace(tzinfo=datetime.UTC)
    return datetime.datetime.fromisoformat(str(stamp).replace("Z", "+00:00"))


def serve(port: int) -> None:
    """Starts the /metrics endpoint on `port` (0: none)."""
    if port:
        start_http_server(port)


APPROVAL_WAIT = Histogram(
    "agentrun_approval_wait_seconds",
    "From a tool call asking for an approval to its decision, by decision (Approve, Deny; "
    "a timeout is a Deny).", ["decision"],
    buckets=(1, 5, 15, 30, 60, 300, 900, 1800, 3600, 4 * 3600, 12 * 3600, 86400, 7 * 86400))


def approval_decided(waiting: Any, decision: str, when: datetime.datetime) -> None:
    """A call's wait ended with `decision` (waiting: a store.Approval)."""
    APPROVAL_WAIT.labels(decision).observe(
        max(0.0, (when - waiting.requested_at).total_seconds()))
