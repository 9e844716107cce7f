"""Retention: ADK session events are purged after N days (default 90), in batches;
memory entries when they expire.

Sessions keep their shell (the sessions row); the ledger and our run rows are kept, so
toolsExecuted of an old run stays what it was when it was settled.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import delete, select, tuple_
from sqlalchemy.ext.asyncio import AsyncEngine

from agentrun.store.adk_tables import events as _events
from agentrun.store.schema import memory

DEFAULT_EVENT_RETENTION_DAYS = 90

_key = (_events.c.id, _events.c.app_name, _events.c.user_id, _events.c.session_id)


async def purge_old_events(
    engine: AsyncEngine,
    older_than: timedelta = timedelta(days=DEFAULT_EVENT_RETENTION_DAYS),
    batch: int = 1000,
) -> int:
    """Deletes ADK events older than `older_than`, `batch` rows per transaction (short
    transactions: runners write events meanwhile). Returns how many were deleted."""
    # ADK writes its timestamps as naive UTC: compare like with like (an aware cutoff
    # would be shifted by a Postgres session whose TimeZone is not UTC).
    cutoff = (datetime.now(UTC) - older_than).replace(tzinfo=None)
    deleted = 0
    while True:
        async with engine.begin() as conn:
            keys = [tuple(row) for row in await conn.execute(
                select(*_key).where(_events.c.timestamp < cutoff).limit(batch))]
            if not keys:
                return deleted
            await conn.execute(delete(_events).where(tuple_(*_key).in_(keys)))
        deleted += len(keys)


async def purge_expired_memory(engine: AsyncEngine, now: datetime | None = None) -> int:
    """Deletes memory entries past their expiry; returns how many."""
    async with engine.begin() as conn:
        result = await conn.execute(
            delete(memory).where(memory.c.expires_at <= (now or datetime.now(UTC))))
    return int(result.rowcount or 0)
