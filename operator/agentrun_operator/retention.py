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
        try:
            events = await store.purge_old_events(ctx.engine, ctx.config.retention)
            records = await store.purge_old_runs(ctx.engine, ctx.config.retention)
            memories = await store.purge_expired_memory(ctx.engine)
            log.info("event=retention-purge runs=%s events=%s memories=%s", records, events,
                     memories)
        except Exception as e:  # the store may be down: try again tomorrow
            log.warning("event=retention-purge-failed error=%r", e)
        await asyncio.sleep(DAY.total_seconds())
