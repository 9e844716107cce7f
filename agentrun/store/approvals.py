"""Approvals: a tool call that waits for a human's decision before it runs.

The runner writes the call down when the model asks for it (its arguments, their digest,
when it expires), does not start it, and ends its attempt. A decision is written once
(`decide`: the first valid AgentRunApproval, or the timeout, wins; every later one loses),
and the attempt that resumes the run reads it: approved, the call runs through the ledger;
denied, the model is told so and the call never runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import bindparam, func, select, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from agentrun.store.dialect import upsert_insert
from agentrun.store.schema import approvals


@dataclass(frozen=True)
class Approval:
    """One call that waits (decision None) or was decided."""

    run_uid: str
    call_id: str
    attempt: int
    seq: int
    tool: str
    args: str  # the arguments as JSON, whole
    args_digest: str
    requested_at: datetime
    expires_at: datetime
    decision: str | None
    approver: str | None
    note: str | None
    decided_at: datetime | None
    approval_name: str | None

    @property
    def pending(self) -> bool:
        return self.decision is None


def _approval(row: object) -> Approval:
    return Approval(**{c: getattr(row, c) for c in Approval.__dataclass_fields__})


class TooManyPending(Exception):
    """The attempt has as many calls waiting for a decision as it may: nothing written."""

    def __init__(self, pending: int) -> None:
        super().__init__(pending)
        self.pending = pending


async def request_approval(engine: AsyncEngine, uid: str, attempt: int, seq: int,
                           call_id: str, tool: str, args: str, digest: str,
                           expires_at: datetime, max_pending: int | None = None) -> Approval:
    """Writes down that call `call_id` waits for a decision (once: the same call asked
    again, by a runner whose first answer was lost, is the same wait). Returns it. With
    `max_pending`, a new call of an attempt that has that many waiting already raises
    TooManyPending (each waiting call is a row of up to its arguments' size)."""
    async with engine.begin() as conn:
        if max_pending is not None:
            known = (await conn.execute(select(approvals.c.call_id).where(
                approvals.c.run_uid == uid, approvals.c.call_id == call_id))).first()
            if known is None:
                pending = int((await conn.execute(
                    select(func.count()).select_from(approvals).where(
                        approvals.c.run_uid == uid, approvals.c.attempt == attempt,
                        approvals.c.decision.is_(None)))).scalar_one())
                if pending >= max_pending:
                    raise TooManyPending(pending)
        await conn.execute(
            upsert_insert(conn, approvals).values(
                run_uid=uid, call_id=call_id, attempt=attempt, seq=seq, tool=tool, args=args,
                args_digest=digest, requested_at=datetime.now(UTC), expires_at=expires_at)
            .on_conflict_do_nothing())
        row = (await conn.execute(select(approvals).where(
            approvals.c.run_uid == uid, approvals.c.call_id == call_id))).one()
    return _approval(row)


async def approvals_of(engine: AsyncEngine, uid: str) -> list[Approval]:
    """Every call of run `uid` that waited or waits, in the order they were asked for."""
    async with engine.connect() as conn:
        return await approvals_on(conn, uid)


# Built once (see runs._RUN): every settled run's sync reads it.
_APPROVALS = select(approvals).where(approvals.c.run_uid == bindparam("p_uid")).order_by(
    approvals.c.attempt, approvals.c.seq)


async def approvals_on(conn: AsyncConnection, uid: str) -> list[Approval]:
    """approvals_of, read on `conn`."""
    return [_approval(r) for r in await conn.execute(_APPROVALS, {"p_uid": uid})]


async def pending_approval(engine: AsyncEngine, uid: str,
                           attempt: int | None = None) -> Approval | None:
    """The call of run `uid` (of `attempt`, if given) that waits for a decision, if any."""
    where = [approvals.c.run_uid == uid, approvals.c.decision.is_(None)]
    if attempt is not None:
        where.append(approvals.c.attempt == attempt)
    async with engine.connect() as conn:
        row = (await conn.execute(select(approvals).where(*where)
                                  .order_by(approvals.c.attempt.desc(), approvals.c.seq)
                                  .limit(1))).one_or_none()
    return None if row is None else _approval(row)


async def decide(engine: AsyncEngine, uid: str, call_id: str, decision: str, approver: str,
                 note: str | None, approval_name: str | None) -> bool:
    """Decides a waiting call; True when this decision is the one (first writer wins: a
    call already decided keeps its decision)."""
    async with engine.begin() as conn:
        done = await conn.execute(
            update(approvals)
            .where(approvals.c.run_uid == uid, approvals.c.call_id == call_id,
                   approvals.c.decision.is_(None))
            .values(decision=decision, approver=approver, note=note,
                    decided_at=datetime.now(UTC), approval_name=approval_name))
    return done.rowcount == 1
