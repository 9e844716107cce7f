"""The daily purge (--retention, the chart's store.retention): the records of runs settled
longer ago, ADK session events older than it, and expired long-term memory."""

from __future__ import annotations

import asyncio
import datetime
import logging

from agentrun import store
from agentrun_operator.controller import Context

log = logging.getLogger("agentrun.operator")
DAY = datetime.timedelta(days=1)


async def purge_daily(ctx: Context) -> None:
    """Runs until cancelled: a purge shortly after start, then one a day."""
    if ctx.config.retention <= datetime.timedelta(0):
        return
    await asyncio.sleep(60)  # let the start-up work go first
    while True:
        await purge_once(ctx)
        await asyncio.sleep(DAY.total_seconds())


async def purge_once(ctx: Context) -> None:
    """One pass, logged: what each step deleted, and each step that failed (the store may
    be down: that step is tried again tomorrow, the others are not held back by it)."""
    done = await store.purge(ctx.engine, ctx.config.retention)
    log.info("event=retention-purge %s", " ".join(
        f"{step}={n}" for step, n in done.items() if not isinstance(n, Exception)))
    for step, n in done.items():
        if isinstance(n, Exception):
            log.warning("event=retention-purge-failed step=%s error=%r", step, n)
