"""What one attempt has written so far, for the store API's per-attempt quotas.

The store API counts what it serves; when it first serves an attempt (after a restart, or
another replica served it before) it starts from what the store holds, read here once.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import Text, cast, func, inspect, select
from sqlalchemy.ext.asyncio import AsyncEngine

from agentrun.store import adk_tables as adk
from agentrun.store.schema import attempts, memory, runs, sample_outbox, tool_calls


@dataclass(frozen=True)
class AttemptUsage:
    """Rows and bytes one attempt wrote: session events (appended since the attempt
    started), journalled tool results, sample outbox rows and memory entries."""

    events: int = 0
    event_bytes: int = 0
    result_bytes: int = 0
    outbox_rows: int = 0
    memory_entries: int = 0
    memory_bytes: int = 0


async def attempt_usage(engine: AsyncEngine, uid: str, attempt: int) -> AttemptUsage:
    """What attempt `attempt` of run `uid` wrote, as the store holds it. Session events
    and memory entries count from the attempt's start: a chat session's earlier turns, or
    the attempt a resume continues, are not this attempt's."""
    async with engine.connect() as conn:
        where = (await conn.execute(
            select(attempts.c.app_name, attempts.c.user_id, attempts.c.session_id,
                   attempts.c.started_at, attempts.c.runner_started_at, runs.c.name)
            .select_from(attempts.outerjoin(runs, runs.c.uid == attempts.c.run_uid))
            .where(attempts.c.run_uid == uid, attempts.c.attempt == attempt)
        )).one_or_none()
        if where is None or where.app_name is None or where.session_id is None:
            return AttemptUsage()
        since = where.started_at or where.runner_started_at or datetime.now(UTC)
        # ADK keeps its timestamps naive, in UTC.
        naive = since.astimezone(UTC).replace(tzinfo=None) if since.tzinfo else since
        events, event_bytes = 0, 0
        # ADK creates its tables when its session service is first used: maybe not yet.
        if await conn.run_sync(lambda c: inspect(c).has_table(adk.events.name)):
            events, event_bytes = (await conn.execute(
                select(func.count(), func.coalesce(func.sum(func.length(
                    cast(adk.events.c.event_data, Text))), 0))
                .where(*adk.events_of(where.app_name, where.user_id, where.session_id),
                       adk.events.c.timestamp >= naive)
            )).one()
        result_bytes = (await conn.execute(
            select(func.coalesce(func.sum(func.length(cast(tool_calls.c.result, Text))), 0))
            .where(tool_calls.c.run_uid == uid, tool_calls.c.attempt == attempt)
        )).scalar_one()
        outbox_rows = (await conn.execute(
            select(func.count()).select_from(sample_outbox)
            .where(sample_outbox.c.run_name == where.name, sample_outbox.c.run_uid == uid,
                   sample_outbox.c.attempt == attempt)
        )).scalar_one()
        memory_entries, memory_bytes = (await conn.execute(
            select(func.count(), func.coalesce(func.sum(func.length(memory.c.text)), 0))
            .where(memory.c.agent == where.app_name, memory.c.user_id == where.user_id,
                   memory.c.session_id == where.session_id, memory.c.created_at >= since)
        )).one()
    return AttemptUsage(events=int(events), event_bytes=int(event_bytes),
                        result_bytes=int(result_bytes), outbox_rows=int(outbox_rows),
                        memory_entries=int(memory_entries), memory_bytes=int(memory_bytes))
