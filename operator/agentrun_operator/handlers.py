"""kopf handlers: what is watched, and how each change reaches the work queue.

Every handler is a few lines of in-memory work: remember the object, put its key on the
queue. The reconciles (reconcile.py for AgentRuns, replay.py for AgentRunReplays,
schedule_reconcile.py for AgentRunSchedules, trigger_reconcile.py for AgentRunTriggers) run in
the workers started here, only on the replica that holds the leader Lease when leader
election is on. kopf is asked to watch and to post Events, and nothing else: there are
no change-detecting handlers on our kinds, so kopf writes no progress or diff-base
annotations into them (the spec is immutable; the reconcile reads the state it needs).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import kopf
from kubernetes import client
from sqlalchemy.exc import SQLAlchemyError

from agentrun import store
from agentrun.vocabulary import (
    AGENT_PLURAL,
    APPROVAL_PLURAL,
    GROUP,
    LABEL_RUN,
    REPLAY_PLURAL,
    RUN_PLURAL,
    SCHEDULE_PLURAL,
    TRIGGER_PLURAL,
    VERSION,
    Phase,
    Reason,
    ReplayPhase,
)
from agentrun_operator import (
    events,
    heap,
    metrics,
    namespaces,
    retention,
    startup_checks,
    usage,
)
from agentrun_operator.agents import reconcile_agent, slim_agent
from agentrun_operator.approval import reconcile_approval
from agentrun_operator.config import OperatorConfig
from agentrun_operator.controller import Context, newer, slim_node, slim_pod, slim_run, work
from agentrun_operator.informer import Informer, Informers, key_of
from agentrun_operator.kube import Kube
from agentrun_operator.leader import LeaderElection
from agentrun_operator.queue import gated
from agentrun_operator.reconcile import reconcile_run
from agentrun_operator.replay import reconcile_replay
from agentrun_operator.run import owns
from agentrun_operator.schedule_reconcile import index_run, list_schedule_runs, reconcile_schedule
from agentrun_operator.status import node_ready
from agentrun_operator.trigger_reconcile import reconcile_trigger
from agentrun_operator.workloads import Workloads

log = logging.getLogger("agentrun.operator")
# Threads for the (synchronous) Kubernetes client: reconciles, informers and the store
# API's TokenReviews share them; asyncio's default of a few would queue them up.
API_THREADS = 32


def _needs_look(run: Mapping[str, Any]) -> bool:
    """Runs a resync looks at: live ones, and settled ones with something left to do."""
    status = run.get("status") or {}
    phase = status.get("phase")
    return phase not in Phase.TERMINAL or status.get("toolsExecuted", []) is None or \
        bool((run.get("metadata") or {}).get("deletionTimestamp"))


# The wait for the store at start-up: first retry after STORE_WAIT_FIRST s, doubling up to
# STORE_WAIT_LONGEST s.
STORE_WAIT_FIRST = 0.5
STORE_WAIT_LONGEST = 10.0
# How long the start-up warm-up of the store may take before the operator goes on without it.
WARM_TIMEOUT = 30.0


async def migrate_when_reachable(url: str) -> None:
    """Migrates the store, waiting for it as long as it cannot be reached.

    A fresh install starts the operator and its database together, and the operator is
    often first. Failing the start-up handler would leave the retry to kopf, 60 s later;
    instead this retries with a short backoff, and says so each time (the store, without
    its password, and the error), so that an operator pointed at a wrong or absent
    database says why it does nothing.
    """
    delay = STORE_WAIT_FIRST
    while True:
        try:
            await store.migrate(url)
            return
        except (SQLAlchemyError, OSError, TimeoutError) as e:
            metrics.STORE_ERRORS.labels("migrate").inc()
            log.warning("event=store-unreachable store=%s retry_in=%.1fs error=%r",
                        store.redact(url), delay, e)
            await asyncio.sleep(delay)
            delay = min(delay * 2, STORE_WAIT_LONGEST)


def register(config: OperatorConfig) -> kopf.OperatorRegistry:
    """Every handler of the operator, on a fresh registry."""
    registry = kopf.OperatorRegistry()

    # A fresh registry has none of kopf's default login handlers: say how to log in
    # (in-cluster ServiceAccount or kubeconfig, as the kubernetes client does).
    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        return kopf.login_via_client(**kwargs)

    @kopf.on.startup(registry=registry)
    async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
        settings.watching.server_timeout = 300
        settings.posting.level = logging.INFO
        loop = asyncio.get_running_loop()
        loop.set_default_executor(ThreadPoolExecutor(API_THREADS, "kube"))
        metrics.serve(config.metrics_port)
        await migrate_when_reachable(config.database_url)
        kube = Kube(pool=API_THREADS + events.EVENT_THREADS)
        events.configure(kube.api)
        # A connection for each worker and two more (the usage poll, a purge's batch),
        # kept open: an overflow connection, opened for a burst of launches and closed
        # after each use, cost more (a server process started, statements prepared
        # again) than the statements it ran.
        ctx = memo.ctx = Context(config=config, engine=store.make_engine(
            config.database_url, pool_size=config.workers + 2, max_overflow=0), kube=kube)
        # The statements of an eviction's sync, compiled before the first eviction needs them.
        try:
            if not await asyncio.wait_for(store.warm(ctx.engine), timeout=WARM_TIMEOUT):
                log.info("event=store-warm-partial reason=no-session-tables")
        except (SQLAlchemyError, OSError, ValueError, TimeoutError) as e:
            # The first eviction compiles them instead.
            metrics.STORE_ERRORS.labels("warm").inc()
            log.warning("event=store-warm-failed error=%r", e)
        # Read at scrape time, in the server's thread: a copy in one step (no iteration
        # of a dict the event loop changes meanwhile).
        metrics.watch(lambda: list(ctx.runs.values()), lambda: len(ctx.queue))
        core = client.CoreV1Api(kube.api)
        watched = kopf_namespace_filter(config.namespaces)

        def on_pod(pod: dict[str, Any], deleted: bool) -> None:
            run = (pod["metadata"].get("labels") or {}).get(LABEL_RUN)
            if not run:
                return
            key = key_of(pod)
            if deleted and keeps_gone(ctx.runs.get((key[0], run)), pod):
                ctx.gone[key] = pod
            elif not ctx.workloads.running and gated(pod):
                # Kueue holds this pod and its Workloads are not watched yet: Kueue was
                # installed after this operator started.
                ctx.workloads.look()
            ctx.queue.add(("run", key[0], run))

        def on_workload_pod(key: tuple[str, str]) -> None:
            pod = ctx.pods.get(key) if ctx.pods is not None else None
            run = ((pod or {}).get("metadata", {}).get("labels") or {}).get(LABEL_RUN)
            if run:
                ctx.queue.add(("run", key[0], run))

        readiness: dict[str, bool] = {}

        def on_node(node: dict[str, Any], deleted: bool) -> None:
            # Only a change of Ready matters to runs (a node's heartbeats are many).
            name = node["metadata"]["name"]
            ready = not deleted and node_ready(node)
            if readiness.get(name, True) == ready and name in readiness:
                return
            readiness[name] = ready
            if ctx.pods is None:
                return
            for pod in ctx.pods.objects.values():
                if (pod.get("spec") or {}).get("nodeName") == name:
                    run = (pod["metadata"].get("labels") or {}).get(LABEL_RUN)
                    if run:
                        ctx.queue.add(("run", pod["metadata"]["namespace"], run))

        # Runner pods only, filtered by the API server; nodes (few) all. Namespaces named
        # outright are listed one by one (the operator may then hold a Role in each and
        # nothing cluster-wide); patterns need the cluster-wide list, filtered here.
        named = named_namespaces(config.namespaces)
        memo.tasks = []
        ctx.workloads = Workloads(kube.api, named=named, watched=watched,
                                  on_pod=on_workload_pod)
        if named:
            ctx.pods = Informers([
                Informer(f"pods-{ns}", functools.partial(core.list_namespaced_pod, ns),
                         slim=slim_pod, on_change=on_pod, label_selector=LABEL_RUN)
                for ns in named]).start()
        else:
            ctx.pods = Informer("pods", core.list_pod_for_all_namespaces, slim=slim_pod,
                                on_change=on_pod, label_selector=LABEL_RUN,
                                watched=watched).start()
        ctx.nodes = Informer("nodes", core.list_node, slim=slim_node,
                             on_change=on_node).start()
        await asyncio.wait_for(asyncio.gather(ctx.pods.synced.wait(), ctx.nodes.synced.wait()),
                               timeout=120)
        # Kueue's Workloads, if Kueue is installed (else looked for again on each resync).
        if await ctx.workloads.start():
            with contextlib.suppress(TimeoutError):  # the runs say "queued" meanwhile
                await asyncio.wait_for(ctx.workloads.informer.synced.wait(), timeout=60)

        async def lead() -> None:
            # The leader alone acts: the reconciles and the daily purge. First the runs of
            # schedules, listed once, so that no schedule is looked at on a cache that
            # kopf's watch has not filled yet (it then keeps them current).
            await list_schedule_runs(ctx, named, watched)
            memo.workers = [asyncio.create_task(work(ctx, {"run": reconcile_run,
                                                           "replay": reconcile_replay,
                                                           "approval": reconcile_approval,
                                                           "schedule": reconcile_schedule,
                                                           "trigger": reconcile_trigger,
                                                           "agent": reconcile_agent}))
                            for _ in range(config.workers)]
            memo.workers.append(asyncio.create_task(retention.purge_daily(ctx)))
            if config.namespaces:
                memo.workers.append(asyncio.create_task(namespaces.follow(ctx, watched)))
            memo.workers.append(asyncio.create_task(usage.watch(ctx)))
            resync_all(ctx)
            # Agents once when leading starts, not on every resync: their watch events and
            # their own recheck (a missing Secret) keep them current.
            for namespace, name in list(ctx.agents):
                ctx.queue.add(("agent", namespace, name))

        async def step_down() -> None:
            for task in memo.workers:
                task.cancel()
            memo.workers = []

        memo.workers = []
        memo.election = None
        if config.leader_election_namespace:
            memo.election = LeaderElection(kube.api, config.leader_election_namespace,
                                           duration=config.leader_election_seconds,
                                           renew=config.leader_election_seconds / 3)
            memo.tasks.append(asyncio.create_task(memo.election.run(lead, step_down)))
        else:
            await lead()
        memo.tasks.append(asyncio.create_task(_resync_forever(ctx)))
        memo.tasks.append(asyncio.create_task(_settle_forever()))
        memo.tasks.append(asyncio.create_task(startup_checks.check(ctx)))
        log.info("event=started store=%s store_api=%s namespaces=%s workers=%s election=%s",
                 store.redact(config.database_url), config.store_api_url,
                 ",".join(config.namespaces) or "*", config.workers,
                 config.leader_election_namespace or "off")

    @kopf.on.cleanup(registry=registry)
    async def cleanup(memo: kopf.Memo, **_: Any) -> None:
        for task in [*memo.workers, *memo.tasks]:
            task.cancel()
        for task in [*memo.workers, *memo.tasks]:
            with contextlib.suppress(BaseException):
                await task
        if memo.election is not None:
            await asyncio.to_thread(memo.election.release)
        memo.ctx.pods.stop()
        memo.ctx.nodes.stop()
        memo.ctx.workloads.stop()
        await memo.ctx.engine.dispose()

    @kopf.on.event(GROUP, VERSION, RUN_PLURAL, registry=registry)
    async def run_event(type: str, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        _observe(memo.ctx, memo.ctx.runs, "run", type, body, slim_run)
        if type == "DELETED":
            memo.ctx.forget_run(body)
        # A runner found the Agent's snapshot cannot be built in its image (a function it
        # does not ship as a tool): the Agent looks again, and says so (agents.py).
        status = body.get("status") or {}
        if status.get("reason") == Reason.AGENT_INVALID and status.get("agentDigest"):
            memo.ctx.queue.add(("agent", body.metadata.namespace or "",
                                str((body.get("spec") or {}).get("agent") or "")))
        # A schedule's run changed: its schedule looks again (Forbid, Replace, history).
        schedule = index_run(memo.ctx, body, type == "DELETED")
        if schedule:
            memo.ctx.queue.add(("schedule", body.metadata.namespace or "", schedule))

    @kopf.on.event(GROUP, VERSION, REPLAY_PLURAL, registry=registry)
    async def replay_event(type: str, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        _observe(memo.ctx, memo.ctx.replays, "replay", type, body, _whole)

    @kopf.on.event(GROUP, VERSION, APPROVAL_PLURAL, registry=registry)
    async def approval_event(type: str, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        _observe(memo.ctx, memo.ctx.approvals, "approval", type, body, _whole)

    @kopf.on.event(GROUP, VERSION, SCHEDULE_PLURAL, registry=registry)
    async def schedule_event(type: str, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        _observe(memo.ctx, memo.ctx.schedules, "schedule", type, body, _whole)

    @kopf.on.event(GROUP, VERSION, TRIGGER_PLURAL, registry=registry)
    async def trigger_event(type: str, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        _observe(memo.ctx, memo.ctx.triggers, "trigger", type, body, _whole)

    @kopf.on.event(GROUP, VERSION, AGENT_PLURAL, registry=registry)
    async def agent_event(type: str, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        ctx = memo.ctx
        _observe(ctx, ctx.agents, "agent", type, body, slim_agent)
        # A parent's digest covers its sub-agents, and a deleted sub-agent makes its parent
        # invalid: every Agent of the namespace is looked at again (they are few).
        namespace = body.metadata.namespace or ""
        # A launch from now on takes the Agents as they are now, not a list made before.
        ctx.agent_lists.pop(namespace, None)
        for (ns, name) in list(ctx.agents):
            if ns == namespace:
                ctx.queue.add(("agent", ns, name))

    return registry


def _whole(body: Mapping[str, Any]) -> dict[str, Any]:
    return {"apiVersion": body.get("apiVersion"), "kind": body.get("kind"),
            "metadata": dict(body.get("metadata") or {}), "spec": dict(body.get("spec") or {}),
            "status": dict(body.get("status") or {})}


def _observe(ctx: Context, cache: dict[tuple[str, str], dict[str, Any]], kind: str, type: str,
             body: kopf.Body, copy: Callable[[Mapping[str, Any]], dict[str, Any]]) -> None:
    """A watch event: the cache keeps the newest copy (our own write's answer may be ahead
    of the watch), and the object's key goes on the work queue."""
    key = (body.metadata.namespace or "", body.metadata.name or "")
    if type == "DELETED":
        cache.pop(key, None)
        if body.metadata.uid:
            ctx.note_deleted(body.metadata.uid)
        return
    seen = copy(body)
    if newer(cache.get(key), seen):
        cache[key] = seen
    # kopf's initial list (type None) brings every object at once: behind any change.
    ctx.queue.add((kind, *key), later=type is None)


def keeps_gone(run: Mapping[str, Any] | None, pod: Mapping[str, Any]) -> bool:
    """Whether a deleted runner pod's last state is kept: for the live run that owns it
    (how its attempt ended), or for a run not seen yet (kopf lists the runs after the pod
    informer has started). A settled run never reads it again: kept, it would stay for
    good once runs leave by their TTL."""
    if run is None:
        return True
    return owns(run, pod) and (run.get("status") or {}).get("phase") not in Phase.TERMINAL


def prune_gone(ctx: Context) -> None:
    """The deleted pods kept for runs that settled or went meanwhile (at a resync, long
    after kopf listed the runs)."""
    for key, pod in list(ctx.gone.items()):
        run = (pod["metadata"].get("labels") or {}).get(LABEL_RUN)
        owner = ctx.runs.get((key[0], run)) if run else None
        if owner is None or not keeps_gone(owner, pod):
            del ctx.gone[key]


def resync_all(ctx: Context) -> None:
    """Every run and replay with something possibly left to do, and every schedule and
    trigger, on the queue's later lane (a change that comes meanwhile goes first)."""
    for (namespace, name), run in list(ctx.runs.items()):
        if _needs_look(run):
            ctx.queue.add(("run", namespace, name), later=True)
    for (namespace, name), approval in list(ctx.approvals.items()):
        if not (approval.get("status") or {}).get("phase"):
            ctx.queue.add(("approval", namespace, name), later=True)
    for (namespace, name), replay in list(ctx.replays.items()):
        phase = (replay.get("status") or {}).get("phase")
        if phase != ReplayPhase.APPROVED or not (replay.get("status") or {}).get(
                "replayRunName"):
            ctx.queue.add(("replay", namespace, name), later=True)
    for namespace, name in list(ctx.schedules):
        ctx.queue.add(("schedule", namespace, name), later=True)
    for namespace, name in list(ctx.triggers):
        ctx.queue.add(("trigger", namespace, name), later=True)


async def _resync_forever(ctx: Context) -> None:
    """The safety net under the watches: every run looked at again now and then
    (jittered, so that replicas and restarts do not sweep in step)."""
    while True:
        await asyncio.sleep(ctx.config.check_interval * random.uniform(0.9, 1.1))
        if ctx.workloads is not None and not ctx.workloads.running:
            await ctx.workloads.start()  # Kueue may have been installed since
        prune_gone(ctx)
        resync_all(ctx)


async def _settle_forever() -> None:
    """Every SETTLE_EVERY seconds, what has lived that long leaves the garbage collector's
    sight (heap.py): a full collection then walks at most that long's new objects."""
    settler = heap.Settler()
    while True:
        await asyncio.sleep(heap.SETTLE_EVERY)
        settler.settle()


def kopf_namespace_filter(patterns: tuple[str, ...]) -> Any:
    """The namespaces kopf watches, as a predicate: the same glob patterns, `!` to
    exclude (kopf's own syntax), so that the pod informer follows the same namespaces."""
    import fnmatch

    if not patterns:
        return lambda _: True
    includes = [p for p in patterns if not p.startswith("!")]
    excludes = [p[1:] for p in patterns if p.startswith("!")]

    def watched(namespace: str) -> bool:
        if any(fnmatch.fnmatchcase(namespace, p) for p in excludes):
            return False
        return not includes or any(fnmatch.fnmatchcase(namespace, p) for p in includes)

    return watched


def named_namespaces(patterns: tuple[str, ...]) -> list[str]:
    """The namespaces to watch when every one is named outright (no glob, no `!`); empty
    when all are watched or any pattern is used."""
    if not patterns or any(p.startswith("!") or any(c in p for c in "*?[") for p in patterns):
        return []
    return list(patterns)
