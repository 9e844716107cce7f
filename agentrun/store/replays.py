"""Approved replays: who replayed which run, into which new run, and whether it was forced.

`approve_replay` is the one place that enforces "at most one non-forced replay of a run is
ever approved". It is atomic in the database (a unique constraint on the original's uid
for non-forced approvals), so two AgentRunReplays created at the same instant, or handled
by two operator replicas, cannot both win; an in-memory check could not promise that.
Forced approvals are not limited, and each is recorded too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.engine import Row
from sqlalchemy.ext.asyncio import AsyncEngine

from agentrun.store.dialect import upsert_insert
from agentrun.store.schema import replays


@dataclass(frozen=True)
class ReplayApproval:
    """One approved AgentRunReplay, as recorded when it was approved."""

    uid: str
    namespace: str
    name: str
    run_uid: str
    run_name: str
    forced: bool
    reason: str
    message: str
    replay_run_name: str
    tools_executed: list[str] | None
    decided_at: datetime
    resume: bool = False


@dataclass(frozen=True)
class Claim:
    """The answer of `approve_replay`: `granted` when this replay holds the approval (now,
    or since an earlier call for the same replay uid); otherwise `approval` is the other
    replay's non-forced approval of the same run."""

    granted: bool
    approval: ReplayApproval


class ReplayRace(RuntimeError):
    """Neither this replay nor another holds the approval after a refused insert."""


def _approval(row: Row[Any]) -> ReplayApproval:
    return ReplayApproval(
        uid=row.uid, namespace=row.namespace, name=row.name, run_uid=row.run_uid,
        run_name=row.run_name, forced=row.forced, reason=row.reason, message=row.message,
        replay_run_name=row.replay_run_name, tools_executed=row.tools_executed,
        decided_at=row.decided_at, resume=bool(row.resume),
    )


async def approve_replay(
    engine: AsyncEngine,
    *,
    uid: str,
    namespace: str,
    name: str,
    run_uid: str,
    run_name: str,
    forced: bool,
    reason: str,
    message: str,
    replay_run_name: str,
    tools_executed: Sequence[str] | None,
    resume: bool = False,
) -> Claim:
    """Records the approval of replay `uid` of run `run_uid`, atomically.

    A non-forced approval takes the run's one slot (unique constraint); a forced one takes
    none. Idempotent per replay uid: a handler that runs again gets back what the first
    call recorded (granted). When another replay already holds the run's slot, nothing is
    recorded and that replay's approval comes back (not granted).
    """
    values = dict(
        uid=uid, namespace=namespace, name=name, run_uid=run_uid, run_name=run_name,
        forced=forced, unforced_run_uid=None if forced else run_uid, reason=reason,
        message=message, replay_run_name=replay_run_name,
        tools_executed=None if tools_executed is None else list(tools_executed),
        decided_at=datetime.now(UTC), resume=resume,
    )
    async with engine.begin() as conn:
        # No conflict target: either constraint (this replay's uid, or the run's slot)
        # makes the insert a no-op. On Postgres a concurrent insert of the same slot waits
        # for the first transaction and then does nothing; SQLite serialises writers.
        inserted = (await conn.execute(
            upsert_insert(conn, replays).values(**values).on_conflict_do_nothing()
            .returning(replays.c.uid)
        )).first()
        if inserted is not None:
            row = (await conn.execute(select(replays).where(replays.c.uid == uid))).one()
            return Claim(granted=True, approval=_approval(row))
        ours = (await conn.execute(select(replays).where(replays.c.uid == uid))).one_or_none()
        if ours is not None:
            return Claim(granted=True, approval=_approval(ours))
        holder = (await conn.execute(
            select(replays).where(replays.c.unforced_run_uid == run_uid))).one_or_none()
    if holder is None:
        raise ReplayRace(f"replay {namespace}/{name} of run {run_uid} was neither recorded "
                         "nor refused by another approval; try again")
    return Claim(granted=False, approval=_approval(holder))


async def get_replay_approval(engine: AsyncEngine, uid: str) -> ReplayApproval | None:
    """The recorded approval of replay `uid`, or None if it was never approved."""
    async with engine.connect() as conn:
        row = (await conn.execute(select(replays).where(replays.c.uid == uid))).one_or_none()
    return None if row is None else _approval(row)


async def replays_of(engine: AsyncEngine, run_uid: str) -> list[ReplayApproval]:
    """Every approved replay of run `run_uid` (forced ones included), oldest first."""
    async with engine.connect() as conn:
        rows = await conn.execute(
            select(replays).where(replays.c.run_uid == run_uid)
            .order_by(replays.c.decided_at, replays.c.uid))
        return [_approval(r) for r in rows]


async def approval_of_replay_run(
    engine: AsyncEngine, namespace: str, replay_run_name: str
) -> ReplayApproval | None:
    """The approval that created the replay run `namespace/replay_run_name`, if any.

    A replay run's input is the original's snapshot: the operator finds it through this
    record (which only the operator writes), never through anything on the AgentRun that
    a user could edit before the run starts.
    """
    async with engine.connect() as conn:
        row = (await conn.execute(
            select(replays).where(replays.c.namespace == namespace,
                                  replays.c.replay_run_name == replay_run_name)
            .order_by(replays.c.decided_at.desc()).limit(1))).one_or_none()
    return None if row is None else _approval(row)


async def release_replay(engine: AsyncEngine, uid: str) -> bool:
    """Withdraws the approval of replay `uid` (its run could never be created), freeing
    the original's one non-forced slot. Returns whether there was one."""
    async with engine.begin() as conn:
        result = await conn.execute(delete(replays).where(replays.c.uid == uid))
    return bool(result.rowcount)


async def lineage_root(engine: AsyncEngine, uid: str, depth: int = 32) -> str:
    """The first run of `uid`'s lineage: following each replay run to the run it replays
    (through the approvals, which only the operator writes)."""
    from agentrun.store.schema import runs

    current = uid
    for _ in range(depth):
        async with engine.connect() as conn:
            row = (await conn.execute(
                select(runs.c.namespace, runs.c.name, runs.c.replay_of)
                .where(runs.c.uid == current))).one_or_none()
            if row is None or not row.replay_of:
                return current
            approval = (await conn.execute(
                select(replays.c.run_uid).where(replays.c.namespace == row.namespace,
                                                replays.c.replay_run_name == row.name)
            )).first()
        if approval is None:
            return current
        current = approval.run_uid
    return current
