"""Live usage: which running runs' usage changed, so that their reconcile writes it.

The runner reports each model call's usage to the store; nothing about that reaches the
operator's watches. Rather than look at every live run every few seconds, the leader asks
the store, every USAGE_EVERY seconds, which runs' usage changed since the last time (one
indexed read whatever the number of runs) and queues those; their reconcile writes the
new figures, at most once per USAGE_EVERY per run (run.py).
"""

from __future__ import annotations

import asyncio
import datetime
import logging

from agentrun import store
from agentrun.vocabulary import Phase
from agentrun_operator import metrics
from agentrun_operator.controller import Context, now
from agentrun_operator.run import USAGE_EVERY

log = logging.getLogger("agentrun.operator")

# The store's clock (the store API's hosts stamp the rows) may be behind ours: each read
# reaches this far back before the last one (a run queued twice writes once).
CLOCK_SLACK = datetime.timedelta(seconds=10)


async def watch(ctx: Context, every: float = USAGE_EVERY) -> None:
    """Queues the live runs whose usage changed, every `every` seconds, until cancelled."""
    since = now()
    while True:
        await asyncio.sleep(every)
        asked = now()
        try:
            changed = await store.usage_changed_since(ctx.engine, since - CLOCK_SLACK)
        except Exception as e:
            log.warning("event=store-usage-failed error=%r", e)
            metrics.STORE_ERRORS.labels("usage").inc()
            continue
        since = asked
        if not changed:
            continue
        for (namespace, name), run in list(ctx.runs.items()):
            if run["metadata"].get("uid") in changed and \
                    (run.get("status") or {}).get("phase") == Phase.RUNNING:
                ctx.queue.add(("run", namespace, name))
