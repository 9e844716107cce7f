"""Content-addressed Agent snapshots (agentrun.agents): written by the operator at a run's
launch, read by the store API for that run's runner, and by the operator for its pods'
Secret headers and a replay's authorization. A snapshot is never changed or deleted: a
replay or resume of a run months later builds the agent that ran."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from agentrun.agents import snapshot_digest
from agentrun.store.dialect import upsert_insert
from agentrun.store.engine import autocommit
from agentrun.store.schema import agent_snapshots, attempts, runs
from agentrun.vocabulary import Reason


async def put_agent(engine: AsyncEngine, snapshot: Mapping[str, Any]) -> str:
    """Stores a snapshot and returns its digest; the same snapshot again is a no-op."""
    digest = snapshot_digest(snapshot)
    async with engine.begin() as conn:
        await conn.execute(
            upsert_insert(conn, agent_snapshots)
            .values(digest=digest, root=str(snapshot["root"]), snapshot=dict(snapshot),
                    created_at=datetime.now(UTC))
            .on_conflict_do_nothing()
        )
    return digest


async def get_agent(engine: AsyncEngine, digest: str) -> dict[str, Any] | None:
    """The snapshot with this digest, or None."""
    async with autocommit(engine) as conn:
        found = (await conn.execute(select(agent_snapshots.c.snapshot).where(
            agent_snapshots.c.digest == digest))).scalar_one_or_none()
    return None if found is None else dict(found)


async def image_refusal(engine: AsyncEngine, digest: str) -> str | None:
    """The runner's word that the snapshot cannot be built in its image (a function the
    image does not ship as a tool, a tool filter its server does not serve): the message
    of the latest outcome a runner reported for a run pinning `digest`, when that outcome
    is AgentInvalid. The operator cannot see the image; this is how the Agent learns it."""
    async with engine.connect() as conn:
        row = (await conn.execute(
            select(attempts.c.outcome_reason, attempts.c.outcome_message)
            .join(runs, runs.c.uid == attempts.c.run_uid)
            .where(runs.c.agent_digest == digest, attempts.c.outcome_status.is_not(None))
            .order_by(attempts.c.outcome_at.desc()).limit(1))).one_or_none()
    if row is None or row.outcome_reason != Reason.AGENT_INVALID:
        return None
    return str(row.outcome_message or "")
