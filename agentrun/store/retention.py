"""Retention (one setting, the chart's store.retention, default 90 days): ADK session
events older than it, and the records of runs settled longer ago than it (the run, its
attempts, ledger, results, usage, approvals and replay approvals), then the input
snapshots no record names any more; memory entries when they expire. All in batches, each
its own short transaction: runners write the ledger meanwhile, and a batch never holds
locks on anything but the rows it deletes.

Sessions keep their shell (the sessions row: a chat's later runs may continue it).
Within retention, the ledger and our run rows are kept, so toolsExecuted of a run stays
what it was when it was settled, and a replay of it is decided from them.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import delete, func, inspect, select, tuple_
from sqlalchemy.ext.asyncio import AsyncEngine

from agentrun.store.adk_tables import events as _events
from agentrun.store.schema import (
    approvals,
    attempts,
    inputs,
    memory,
    replays,
    results,
    runs,
    tool_calls,
    usage,
)
from agentrun.vocabulary import RunStatus

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
    async with engine.connect() as conn:
        # ADK makes its tables when the store API first makes a session: a store no run
        # has used yet has no events to purge.
        if not await conn.run_sync(lambda c: inspect(c).has_table(_events.name)):
            return 0
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


# The tables whose rows belong to one run, by their run_uid column; deleted with it.
_OF_A_RUN = (tool_calls, results, usage, approvals, replays, attempts)


async def purge_old_runs(engine: AsyncEngine, older_than: timedelta, batch: int = 500) -> int:
    """Deletes the records of runs settled more than `older_than` ago (and what belongs to
    each), `batch` runs per transaction; then the input snapshots older than that which no
    record names. Returns how many runs were deleted. Live runs are never touched."""
    cutoff = datetime.now(UTC) - older_than
    settled = runs.c.status.not_in(sorted(RunStatus.LIVE))
    ended = func.coalesce(runs.c.finished_at, runs.c.created_at) < cutoff
    deleted = 0
    while True:
        async with engine.begin() as conn:
            uids = [row[0] for row in await conn.execute(
                select(runs.c.uid).where(settled, ended).limit(batch))]
            if not uids:
                break
            for table in _OF_A_RUN:
                await conn.execute(delete(table).where(table.c.run_uid.in_(uids)))
            await conn.execute(delete(runs).where(runs.c.uid.in_(uids)))
        deleted += len(uids)
    await _purge_unnamed_inputs(engine, cutoff, batch)
    return deleted


async def _purge_unnamed_inputs(engine: AsyncEngine, cutoff: datetime, batch: int) -> int:
    """Input snapshots taken before `cutoff` that no run's record names (a snapshot just
    taken for a run being launched is newer than any cutoff)."""
    named = select(runs.c.input_digest).where(runs.c.input_digest.is_not(None))
    deleted = 0
    while True:
        async with engine.begin() as conn:
            digests = [row[0] for row in await conn.execute(
                select(inputs.c.digest).where(inputs.c.created_at < cutoff,
                                              inputs.c.digest.not_in(named)).limit(batch))]
            if not digests:
                return deleted
            # input_files go with them (ON DELETE CASCADE; SQLite: foreign keys on).
            await conn.execute(delete(inputs).where(inputs.c.digest.in_(digests)))
        deleted += len(digests)


async def purge(engine: AsyncEngine, older_than: timedelta,
                now: datetime | None = None) -> dict[str, int | Exception]:
    """One retention pass: the records of runs settled longer ago than `older_than`, ADK
    events older than it, and expired memory. Each step runs on its own (one failing, the
    store briefly down say, does not skip the others). Returns, per step, how many rows it
    deleted or the exception it ended with."""
    steps = {"runs": lambda: purge_old_runs(engine, older_than),
             "events": lambda: purge_old_events(engine, older_than),
             "memories": lambda: purge_expired_memory(engine, now)}
    done: dict[str, int | Exception] = {}
    for name, step in steps.items():
        try:
            done[name] = await step()
        except Exception as e:  # reported per step by the caller
            done[name] = e
    return done
