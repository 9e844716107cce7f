"""Namespaces being deleted, when the operator is given namespaces to watch.

Given namespaces (`--namespace`), kopf watches each on its own, and stops watching one once
its deletion has begun (or never starts, when the operator starts after that): the
deletions of its runs never reach us, our finalizer stays on them, and the namespace stays
Terminating for ever. Every FOLLOW_EVERY_SECONDS the leader lists the namespaces: the runs
we hold in a watched one being deleted are cached and queued as the watch would show them,
and what the caches hold of a namespace that is gone leaves them (no watch says so).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from agentrun_operator.controller import Context, newer, slim_run
from agentrun_operator.kube import resource_version
from agentrun_operator.reconcile import FINALIZER

log = logging.getLogger("agentrun.operator")

# The namespace controller looks at a namespace being deleted every 15 s too.
FOLLOW_EVERY_SECONDS = 15.0


async def look(ctx: Context, watched: Callable[[str], bool]) -> None:
    """One round: the namespaces as the API server has them, then each watched one being
    deleted, its runs. Nothing newer than a list (a namespace made again since) is
    dropped for missing from it."""
    existing, terminating, version = await ctx.kube.namespaces()
    for cache in (ctx.runs, ctx.replays, ctx.approvals, ctx.schedules, ctx.triggers,
                  ctx.agents):
        _drop(ctx, cache, [k for k, obj in cache.items() if watched(k[0])
                           and k[0] not in existing and resource_version(obj) <= version])
    for gone in [ns for ns in ctx.agent_lists if watched(ns) and ns not in existing]:
        ctx.agent_lists.pop(gone, None)  # made again since: its next launch lists anew
    for namespace in sorted(ns for ns in terminating if watched(ns)):
        listed, version = await ctx.kube.list_runs_versioned(namespace)
        names = {r["metadata"]["name"] for r in listed}
        _drop(ctx, ctx.runs, [k for k, obj in ctx.runs.items() if k[0] == namespace
                              and k[1] not in names and resource_version(obj) <= version])
        for run in listed:
            meta = run["metadata"]
            if meta.get("deletionTimestamp") and FINALIZER in (meta.get("finalizers") or []):
                if newer(ctx.runs.get((namespace, meta["name"])), run):
                    ctx.keep(ctx.runs, run, slim_run(run))
                ctx.queue.add(("run", namespace, meta["name"]))


def _drop(ctx: Context, cache: dict[tuple[str, str], dict[str, Any]],
          gone: list[tuple[str, str]]) -> None:
    for key in gone:
        obj = cache.pop(key, None)
        uid = ((obj or {}).get("metadata") or {}).get("uid")
        if uid:
            ctx.note_deleted(uid)  # a write's answer on its way does not bring it back


async def follow(ctx: Context, watched: Callable[[str], bool]) -> None:
    """look() every FOLLOW_EVERY_SECONDS, for as long as this replica leads."""
    while True:
        try:
            await look(ctx, watched)
        except Exception as e:  # the API server away, say: the next round
            log.warning("event=namespaces-not-followed error=%r", e)
        await asyncio.sleep(FOLLOW_EVERY_SECONDS)
