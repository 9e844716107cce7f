"""The controller: what every reconcile shares (configuration, the store, the API, the
caches), and the workers that take keys off the work queue.

Every kind's reconcile (reconcile.py for AgentRuns, replay.py, approval.py,
schedule_reconcile.py, trigger_reconcile.py, agents.py) takes a `Context` and is handed to
`work` by the handlers; this module imports none of them, so nothing here depends on a
kind and no module imports back from another kind's reconcile.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from agentrun import store
from agentrun.vocabulary import LABEL_RUN
from agentrun_operator import metrics
from agentrun_operator.config import OperatorConfig
from agentrun_operator.informer import Informer, Informers, Key
from agentrun_operator.kube import Conflict, Kube
from agentrun_operator.pods import pod_name
from agentrun_operator.workqueue import WorkQueue

log = logging.getLogger("agentrun.operator")

RunKey = tuple[str, str, str]  # (kind: "run" | "replay" | ..., namespace, name)
DELETED_KEPT_SECONDS = 600.0


def now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


@dataclass
class Context:
    """What every reconcile shares: configuration, the store, the API, the caches."""

    config: OperatorConfig
    engine: AsyncEngine
    kube: Kube
    queue: WorkQueue[RunKey] = field(default_factory=WorkQueue)
    # AgentRuns (slimmed), AgentRunReplays and AgentRunSchedules as kopf's watch last saw
    # them.
    runs: dict[Key, dict[str, Any]] = field(default_factory=dict)
    replays: dict[Key, dict[str, Any]] = field(default_factory=dict)
    approvals: dict[Key, dict[str, Any]] = field(default_factory=dict)
    schedules: dict[Key, dict[str, Any]] = field(default_factory=dict)
    # The runs carrying each schedule's label (agentrun.dev/schedule), by name: the
    # schedule's reconcile reads its runs here, not by a walk of every run.
    schedule_runs: dict[Key, set[str]] = field(default_factory=dict)
    # Whether every run of a schedule was listed since this replica started leading: until
    # then, a schedule asks the API server for its runs before it starts one.
    schedule_runs_listed: bool = False
    agents: dict[Key, dict[str, Any]] = field(default_factory=dict)
    # The newest list of each namespace's Agents a launch asked the API server for, by the
    # list's resourceVersion: it serves the launches of runs created before it was answered
    # (agents.agents_for). Dropped when an Agent of the namespace changes (the next launch
    # there lists again) and when the namespace is gone.
    agent_lists: dict[str, tuple[int, dict[str, dict[str, Any]]]] = field(
        default_factory=dict)
    # AgentRunTriggers: their status is written here, and their runs are kept at least
    # their dedupeWindowSeconds (ttl.dedupe_left).
    triggers: dict[Key, dict[str, Any]] = field(default_factory=dict)
    pods: Informer | Informers | None = None
    nodes: Informer | None = None
    # Kueue's Workloads (workloads.Workloads), once Kueue's CRDs are found served.
    workloads: Any = None
    # Pods we created and the pod informer has not shown yet: (namespace, pod) -> when.
    expected: dict[Key, float] = field(default_factory=dict)
    # The last state of runner pods deleted while we were watching.
    gone: dict[Key, dict[str, Any]] = field(default_factory=dict)
    service_accounts: set[Key] = field(default_factory=set)
    service_account_locks: dict[Key, asyncio.Lock] = field(default_factory=dict)
    # When each live run's usage was last written to its status (the throttle of
    # run.USAGE_EVERY), by monotonic clock.
    usage_written: dict[Key, float] = field(default_factory=dict)
    # The uids of objects the watch showed deleted (by monotonic clock): a write's answer
    # that comes back after its object's DELETED event is not cached (keep()), or the
    # object would be looked at, and written to (404), by every resync from then on.
    deleted: dict[str, float] = field(default_factory=dict)
    _input_key: bytes | None = None

    async def input_key(self) -> bytes:
        """The key of input digests: the configured one, else the installation's."""
        if self._input_key is None:
            self._input_key = self.config.input_digest_key or await store.installation_key(
                self.engine)
        return self._input_key

    # -- facts -----------------------------------------------------------------------------

    async def run(self, namespace: str, name: str) -> dict[str, Any] | None:
        found = self.runs.get((namespace, name))
        if found is None and self.pods is None:  # no caches (a step called directly)
            found = await self.kube.read_run(namespace, name)
        return found

    def remember(self, obj: Mapping[str, Any]) -> None:
        """A write's answer is newer than what the watch showed us so far."""
        if obj:
            self.keep(self.runs, obj, slim_run(obj))

    def keep(self, cache: dict[Key, dict[str, Any]], written: Mapping[str, Any],
             copy: dict[str, Any] | None = None) -> None:
        """Caches our write's answer (`copy`: what to cache of it, else all of it), unless
        the watch has shown that object deleted meanwhile."""
        meta = written.get("metadata") or {}
        if meta.get("uid") in self.deleted:
            return
        cache[(meta.get("namespace") or "", meta["name"])] = (
            copy if copy is not None else dict(written))

    def note_deleted(self, uid: str) -> None:
        """Object `uid` is deleted (kept ten minutes: a write's answer comes back within a
        request's timeout). Noted in time order, so the oldest go first."""
        moment = time.monotonic()
        self.deleted[uid] = moment
        while moment - next(iter(self.deleted.values())) > DELETED_KEPT_SECONDS:
            del self.deleted[next(iter(self.deleted))]

    def forget_run(self, run: Mapping[str, Any]) -> None:
        """A deleted run: what the caches kept for its attempts goes with it."""
        meta, status = run.get("metadata") or {}, run.get("status") or {}
        namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
        self.usage_written.pop((namespace, name), None)
        for attempt in range(1, int(status.get("attempts") or 0) + 2):
            pod = (namespace, pod_name(name, attempt))
            self.gone.pop(pod, None)
            self.expected.pop(pod, None)

    async def pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        if self.pods is not None and self.pods.synced.is_set():
            return self.pods.get((namespace, name))
        return await self.kube.read_pod(namespace, name)

    async def node(self, name: str) -> dict[str, Any] | None:
        if not name:
            return None
        if self.nodes is not None and self.nodes.synced.is_set():
            return self.nodes.get(("", name))
        return await self.kube.read_node(name)

    def workload_of(self, pod: Mapping[str, Any]) -> dict[str, Any] | None:
        """The Workload Kueue made for a runner pod, if Kueue runs here and made one."""
        return self.workloads.of(pod) if self.workloads is not None else None

    def pods_of(self, namespace: str, run: str) -> list[dict[str, Any]]:
        if self.pods is None:
            return []
        return [p for (ns, _), p in self.pods.objects.items() if ns == namespace and
                (p["metadata"].get("labels") or {}).get(LABEL_RUN) == run]


def newer(cached: Mapping[str, Any] | None, seen: Mapping[str, Any]) -> bool:
    """Whether `seen` is not older than what we hold (our own write's answer may be ahead
    of the watch). resourceVersions are opaque; compare them only when both are numbers."""
    if cached is None:
        return True
    a = str(cached["metadata"].get("resourceVersion") or "")
    b = str(seen["metadata"].get("resourceVersion") or "")
    return not (a.isdigit() and b.isdigit() and int(b) < int(a))


# -- slim copies for the caches ------------------------------------------------------------

# Characters: names, reasons, times, label values; not messages. Unique values (a uid, a
# resourceVersion) are shared too: it costs a slot in the interpreter's table, which
# frees them with their last object on the interpreter the images ship (3.11; CPython
# 3.12.0 to 3.12.5 kept every interned string for good).
SHARED_UP_TO = 64


def compact(value: Any) -> Any:
    """A copy of a decoded JSON value whose keys and short strings are the interpreter's
    one shared copy (sys.intern). Every object decoded from the API brings its own copy of
    every key ("metadata", "lastTransitionTime", ...) and of values that repeat across
    objects (a namespace, a phase, a reason, a condition type): at 20,000 live runs those
    copies were half of what the caches hold."""
    kind = type(value)
    if kind is str:
        return sys.intern(value) if len(value) <= SHARED_UP_TO else value
    if kind is dict or isinstance(value, Mapping):
        return {sys.intern(k) if type(k) is str else k: compact(v) for k, v in value.items()}
    if kind is list:
        return [compact(v) for v in value]
    return value


def slim_run(obj: Mapping[str, Any]) -> dict[str, Any]:
    """An AgentRun without what no reconcile reads: its input, once it is snapshotted
    (until then the launch needs it, and reads it here rather than from the API)."""
    meta = obj.get("metadata") or {}
    launched = bool((obj.get("status") or {}).get("inputDigest"))
    spec = {k: v for k, v in (obj.get("spec") or {}).items() if k != "input" or not launched}
    # ownerReferences: a schedule's runs are its own (its uid as their controller).
    keep = ("name", "namespace", "uid", "resourceVersion", "generation", "creationTimestamp",
            "deletionTimestamp", "finalizers", "labels", "annotations", "ownerReferences")
    return compact({"apiVersion": obj.get("apiVersion"), "kind": obj.get("kind"),
                    "metadata": {k: meta[k] for k in keep if k in meta}, "spec": spec,
                    "status": obj.get("status") or {}})


def slim_pod(obj: Mapping[str, Any]) -> dict[str, Any]:
    """A runner pod as classify() and the reconcile read it."""
    meta = obj.get("metadata") or {}
    keep = ("name", "namespace", "uid", "resourceVersion", "deletionTimestamp", "labels",
            "annotations", "ownerReferences", "creationTimestamp")
    spec = obj.get("spec") or {}
    kept: dict[str, Any] = {"nodeName": spec.get("nodeName")}
    if spec.get("schedulingGates"):  # Kueue's admission gate (queue.py)
        kept["schedulingGates"] = spec["schedulingGates"]
    return compact({"metadata": {k: meta[k] for k in keep if k in meta}, "spec": kept,
                    "status": obj.get("status") or {}})


def slim_node(obj: Mapping[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    return compact({"metadata": {k: meta[k] for k in ("name", "uid", "resourceVersion")
                                 if k in meta},
                    "status": {"conditions": status.get("conditions") or []}})


# -- workers ------------------------------------------------------------------------------------


Reconciler = Callable[[Context, str, str], Awaitable[float | None]]


async def work(ctx: Context, reconcilers: Mapping[str, Reconciler]) -> None:
    """One worker: takes keys off the queue until cancelled; each key's kind names its
    reconcile in `reconcilers` ("run", "replay", "approval", "schedule", "trigger",
    "agent")."""
    while True:
        key = await ctx.queue.get()
        kind, namespace, name = key
        started, result = time.perf_counter(), "ok"
        try:
            again = await reconcilers[kind](ctx, namespace, name)
        except asyncio.CancelledError:
            ctx.queue.done(key)
            raise
        except Conflict:
            # A newer write won: the watch brings that state; look again soon anyway.
            again, result = 0.2, "conflict"
        except Exception:
            log.exception("event=reconcile-failed kind=%s object=%s/%s", kind, namespace, name)
            again, result = ctx.queue.failed(key), "error"
        metrics.RECONCILE_DURATION.labels(kind, result).observe(time.perf_counter() - started)
        ctx.queue.done(key)
        if again is not None:
            ctx.queue.add_after(key, again)
