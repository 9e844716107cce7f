"""The sample agents' side effects (emails sent, CRM updates) as rows anyone can count."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from agentrun.store.dialect import upsert_insert
from agentrun.store.schema import sample_outbox


@dataclass(frozen=True)
class OutboxRow:
    run_name: str | None
    run_uid: str | None
    attempt: int | None
    tool: str
    args: dict[str, Any]
    created_at: datetime
    idempotency_key: str | None = None


async def record_side_effect(
    engine: AsyncEngine,
    tool: str,
    args: Mapping[str, Any],
    run_name: str | None,
    run_uid: str | None,
    attempt: int | None,
    idempotency_key: str | None = None,
) -> bool:
    """Commits one side effect of a sample tool (the "world" the tool touched). With an
    idempotency key, the same key twice is one row (as an email provider dedupes by its
    Idempotency-Key): returns whether this call made the row."""
    async with engine.begin() as conn:
        result = await conn.execute(
            upsert_insert(conn, sample_outbox).values(
                run_name=run_name, run_uid=run_uid, attempt=attempt, tool=tool,
                args=dict(args), created_at=datetime.now(UTC),
                idempotency_key=idempotency_key,
            ).on_conflict_do_nothing().returning(sample_outbox.c.id)
        )
        return result.first() is not None


async def outbox(engine: AsyncEngine, run_name: str | None = None) -> list[OutboxRow]:
    """The side effects recorded so far, oldest first; only `run_name`'s when given."""
    stmt = select(sample_outbox).order_by(sample_outbox.c.id)
    if run_name is not None:
        stmt = stmt.where(sample_outbox.c.run_name == run_name)
    async with engine.connect() as conn:
        return [
            OutboxRow(
                run_name=r.run_name, run_uid=r.run_uid, attempt=r.attempt, tool=r.tool,
                args=dict(r.args), created_at=r.created_at,
                idempotency_key=r.idempotency_key,
            )
            for r in await conn.execute(stmt)
        ]
