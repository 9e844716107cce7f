"""The write-ahead tool ledger, and what the store knows about the tools an attempt called.

A ledger row is committed BEFORE its tool runs: the call counts, not the answer. Together
with ADK's session events (ADK commits the model's function_call event before the tool
runs) it answers the one question a replay needs: did this attempt touch the world?
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import bindparam, exists, select, update
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from agentrun.ledger import LedgerEntry
from agentrun.store import adk_tables as adk
from agentrun.store.schema import approvals, attempts, tool_calls
from agentrun.vocabulary import LedgerOutcome, RunStatus


class AttemptSettled(RuntimeError):
    """The operator already settled this attempt: no tool may start in it any more."""

    def __init__(self, message: str, status: str) -> None:
        super().__init__(message)
        self.status = status  # how it was settled (vocabulary.RunStatus)


@dataclass(frozen=True)
class CallClose:
    """The end of an earlier call of the attempt, carried by the next call's open."""

    seq: int
    outcome: str  # vocabulary.LedgerOutcome
    result: Any = None


async def open_call(
    engine: AsyncEngine,
    uid: str,
    attempt: int,
    seq: int,
    tool: str,
    call_id: str | None,
    digest: str,
    effect: str | None = None,
    idempotency_key: str | None = None,
    closes: Sequence[CallClose] = (),
) -> list[int]:
    """Inserts and commits the ledger row of a call that is about to run. Raises if the
    row could not be committed: the caller must then not run the tool (fail closed).

    `closes`, ends of earlier calls of the attempt, are written in the same transaction
    (one commit for a tool call's open and its predecessor's close), each only if its row
    is still open; returns the seqs it closed.

    The ledger is also a fence: once the operator has settled the attempt (the pod was
    evicted, deleted, its node lost...), a runner that is still alive for its grace
    period may not start another tool, or the toolsExecuted the operator reported would
    be incomplete. The row goes in first, then the attempt's status is read under a
    share lock: a concurrent `settle_counting` either sees this row, or this call sees
    the attempt settled and rolls back (AttemptSettled), its closes with it.
    """
    closed: list[int] = []
    async with engine.begin() as conn:
        for close in closes:
            done = await conn.execute(
                update(tool_calls)
                .where(tool_calls.c.run_uid == uid, tool_calls.c.attempt == attempt,
                       tool_calls.c.seq == close.seq, tool_calls.c.finished_at.is_(None))
                .values(finished_at=datetime.now(UTC), outcome=close.outcome,
                        result=close.result))
            if done.rowcount == 1:
                closed.append(close.seq)
        await conn.execute(
            tool_calls.insert().values(
                run_uid=uid, attempt=attempt, seq=seq, tool=tool, call_id=call_id,
                args_digest=digest, started_at=datetime.now(UTC), effect=effect,
                idempotency_key=idempotency_key,
            )
        )
        status = (
            await conn.execute(
                select(attempts.c.status)
                .where(attempts.c.run_uid == uid, attempts.c.attempt == attempt)
                .with_for_update(read=True)
            )
        ).scalar_one_or_none()
        if status is not None and status not in RunStatus.LIVE:
            await conn.rollback()
            raise AttemptSettled(
                f"attempt {attempt} of run {uid} was already settled ({status}) by the "
                f"operator; {tool} was not started", status
            )
    return closed


async def close_call(engine: AsyncEngine, uid: str, attempt: int, seq: int, outcome: str,
                     result: Any = None) -> bool:
    """Marks an open ledger row finished with its outcome (vocabulary.LedgerOutcome).

    Only an open row: a finished one is never rewritten. Returns whether a row was closed.

    Fenced as `open_call` is, in the same statement: the row is closed only while the
    attempt is live, its status read under a share lock, so a concurrent `settle_counting`
    either counts the call closed or sees this close refused (AttemptSettled). What the
    operator counted at settle time is what the ledger says afterwards.
    """
    live = (
        select(attempts.c.run_uid)
        .where(attempts.c.run_uid == uid, attempts.c.attempt == attempt,
               attempts.c.status.in_(RunStatus.LIVE))
        .with_for_update(read=True)
    )
    async with engine.begin() as conn:
        done = await conn.execute(
            update(tool_calls)
            .where(
                tool_calls.c.run_uid == uid,
                tool_calls.c.attempt == attempt,
                tool_calls.c.seq == seq,
                tool_calls.c.finished_at.is_(None),
                exists(live),
            )
            .values(finished_at=datetime.now(UTC), outcome=outcome, result=result)
        )
        if done.rowcount == 1:
            return True
        # Why not: only on this path, so that a close that lands costs one statement.
        status = (
            await conn.execute(
                select(attempts.c.status)
                .where(attempts.c.run_uid == uid, attempts.c.attempt == attempt)
            )
        ).scalar_one_or_none()
    if status is not None and status not in RunStatus.LIVE:
        raise AttemptSettled(
            f"attempt {attempt} of run {uid} was already settled ({status}) by the "
            f"operator; call {seq} stays as the operator counted it", status
        )
    return False


async def ledger(engine: AsyncEngine, uid: str) -> list[LedgerEntry]:
    """Every ledger row of a run, by attempt then call order (`kubectl agentrun tools`)."""
    async with engine.connect() as conn:
        return await ledger_on(conn, uid)


# Built once (see runs._RUN): every settled run's sync reads it.
_LEDGER = select(tool_calls).where(tool_calls.c.run_uid == bindparam("p_uid")).order_by(
    tool_calls.c.attempt, tool_calls.c.seq)


async def ledger_on(conn: AsyncConnection, uid: str) -> list[LedgerEntry]:
    """ledger, read on `conn`."""
    return [_entry(r) for r in await conn.execute(_LEDGER, {"p_uid": uid})]


def _entry(r: Any) -> LedgerEntry:
    return LedgerEntry(
        attempt=r.attempt, seq=r.seq, tool=r.tool, call_id=r.call_id,
        args_digest=r.args_digest, started_at=r.started_at, finished_at=r.finished_at,
        outcome=r.outcome, effect=r.effect, idempotency_key=r.idempotency_key,
        result=r.result,
    )


@dataclass(frozen=True)
class _Call:
    tool: str
    call_id: str | None
    at: float  # epoch seconds: when the call was made (event) or began (ledger)
    order: int  # position within its source, to break ties (parallel calls)


def function_calls_of(event_data: Mapping[str, Any]) -> list[tuple[str, str | None]]:
    """(name, id) of each function call in one stored ADK event, in part order."""
    content = event_data.get("content") or {}
    calls = []
    for part in content.get("parts") or []:
        call = part.get("function_call") if isinstance(part, Mapping) else None
        if call and call.get("name"):
            calls.append((str(call["name"]), call.get("id")))
    return calls


# ADK's own table, by column name (adk_tables): reading never creates or migrates it.
# Built once (see runs._RUN): every eviction of a run that reached a model call reads it.
_SESSION_EVENTS = select(adk.events.c.timestamp, adk.events.c.event_data).where(
    *adk.events_of(bindparam("p_app"), bindparam("p_user"), bindparam("p_session")),
    adk.events.c.invocation_id == bindparam("p_invocation"),
).order_by(adk.events.c.timestamp, adk.events.c.id)


async def _session_calls(
    conn: AsyncConnection, app_name: str, user_id: str, session_id: str, invocation_id: str
) -> list[_Call]:
    rows = await conn.execute(_SESSION_EVENTS, {
        "p_app": app_name, "p_user": user_id, "p_session": session_id,
        "p_invocation": invocation_id})
    calls: list[_Call] = []
    for row in rows:
        data = row.event_data
        if not isinstance(data, Mapping):
            continue
        stamp = data.get("timestamp")
        at = float(stamp) if isinstance(stamp, int | float) else _epoch(row.timestamp)
        for name, call_id in function_calls_of(data):
            calls.append(_Call(name, call_id, at, len(calls)))
    return calls


def _epoch(value: Any) -> float:
    if isinstance(value, datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        return value.timestamp()
    if isinstance(value, str):
        return _epoch(datetime.fromisoformat(value))
    return 0.0


def union_in_call_order(session: list[_Call], ledgered: list[_Call]) -> list[str]:
    """The tools of both records, each call once (matched by call id), in call order."""
    merged: dict[str, _Call] = {}
    for i, call in enumerate(session):
        merged[call.call_id or f"session#{i}"] = call
    for call in ledgered:
        key = call.call_id or f"ledger#{call.order}"
        if key not in merged:
            merged[key] = call
    ordered = sorted(merged.values(), key=lambda c: (c.at, c.order))
    return [c.tool for c in ordered]


async def tools_executed(engine: AsyncEngine, uid: str, attempt: int) -> list[str] | None:
    """The tools attempt `attempt` of run `uid` called, in call order, repeats kept.

    The union of the ledger and the ADK session's function_call events of this attempt
    (its invocation: in a chat session, earlier turns are not counted). Both records read
    -> the list, possibly []; either unreadable -> None (unknown). Never [] unread.
    """
    try:
        async with engine.connect() as conn:
            return await tools_on(conn, uid, attempt)
    except UNREADABLE:
        return None


# What reading the store can raise when it cannot be read.
UNREADABLE = (SQLAlchemyError, OSError, ValueError, TimeoutError)


async def tools_on(conn: AsyncConnection, uid: str, attempt: int) -> list[str]:
    """`tools_executed` on an open connection (inside the caller's transaction)."""
    return (await counted_on(conn, uid, attempt)).tools


@dataclass(frozen=True)
class Counted:
    """An attempt's tools (tools_on), and the attempt it resumed, as its row says: its
    number, and the run it belongs to when that is another run (a replay's fork)."""

    tools: list[str]
    resumes_attempt: int | None
    resumes_run_uid: str | None


async def counted_on(conn: AsyncConnection, uid: str, attempt: int, *,
                     ledger: Sequence[LedgerEntry] | None = None,
                     waited: set[str] | None = None, row: Any = None) -> Counted:
    """tools_on, with what the attempt's row says it resumed. What the caller read already
    in its transaction is not read again: the run's `ledger`, the call ids of the
    attempt that `waited` for a decision, the attempt's `row` (its session, invocation,
    what it resumes)."""
    if ledger is None:
        ledger = await _attempt_ledger_on(conn, uid, attempt)
    own = [e for e in ledger if e.attempt == attempt]
    ledgered = [_Call(e.tool, e.call_id, _epoch(e.started_at), e.seq) for e in own
                # Answered from the journal (it ran in an earlier attempt, not in this one)
                # or denied by its approver: not run in this attempt.
                if e.outcome is None or e.outcome not in LedgerOutcome.NOT_RUN]
    if row is None:
        row = (await conn.execute(
            select(attempts.c.app_name, attempts.c.user_id, attempts.c.session_id,
                   attempts.c.invocation_id, attempts.c.resumes_attempt,
                   attempts.c.resumes_run_uid, attempts.c.runner_started_at)
            .where(attempts.c.run_uid == uid, attempts.c.attempt == attempt))).one_or_none()
    if waited is None:
        # Calls of this attempt that waited for a decision: asked for (so in the session),
        # never started in it. An approved one runs, and counts, in the attempt that
        # follows.
        waited = {r.call_id for r in await conn.execute(
            select(approvals.c.call_id).where(approvals.c.run_uid == uid,
                                              approvals.c.attempt == attempt))}
    session: list[_Call] = []
    # No invocation recorded: the runner never reached its first model call (it
    # records the invocation before it), so the session holds no call of ours.
    if row is not None and row.invocation_id is not None:
        session = await _session_calls(
            conn, row.app_name, row.user_id, row.session_id, row.invocation_id
        )
        if row.resumes_attempt is not None:
            # A resumed attempt continues the invocation of the one it resumes: only the
            # calls made since it started are its own.
            since = _epoch(row.runner_started_at) if row.runner_started_at else 0.0
            session = [c for c in session if c.at >= since]
            ledgered_ids = {c.call_id for c in ledgered}
            journalled = {e.call_id for e in own if e.outcome == LedgerOutcome.JOURNAL}
            session = [c for c in session
                       if c.call_id in ledgered_ids or c.call_id not in journalled]
    session = [c for c in session if c.call_id not in waited]
    return Counted(union_in_call_order(session, ledgered),
                   row.resumes_attempt if row is not None else None,
                   row.resumes_run_uid if row is not None else None)


async def _attempt_ledger_on(conn: AsyncConnection, uid: str, attempt: int
                             ) -> list[LedgerEntry]:
    rows = await conn.execute(
        select(tool_calls).where(tool_calls.c.run_uid == uid, tool_calls.c.attempt == attempt)
        .order_by(tool_calls.c.seq))
    return [_entry(r) for r in rows]


@dataclass(frozen=True)
class JournalEntry:
    """A call of the run's journal: the last word of the ledger on it (its attempt, its
    effect and key, whether it finished, its result), and whether its response reached
    the session."""

    seq: int
    attempt: int
    tool: str
    call_id: str | None
    effect: str | None
    idempotency_key: str | None
    started_at: datetime
    finished: bool
    result: Any
    answered: bool


async def journal(engine: AsyncEngine, uid: str, attempts_of_session: list[int],
                  app_name: str, user_id: str, session_id: str) -> list[JournalEntry] | None:
    """The journal of a session (the given attempts of run `uid` used it): each call once,
    by call id, in call order. A call that finished in any attempt is finished; a call
    answered from the journal is the earlier call. None when the session's events cannot
    be read (or are gone)."""
    try:
        async with engine.connect() as conn:
            rows = list(await conn.execute(
                select(tool_calls).where(tool_calls.c.run_uid == uid,
                                         tool_calls.c.attempt.in_(attempts_of_session))
                .order_by(tool_calls.c.attempt, tool_calls.c.seq)))
            events = await conn.execute(select(adk.events.c.event_data).where(
                *adk.events_of(app_name, user_id, session_id)))
            answered: set[str] = set()
            count = 0
            for (data,) in events:
                count += 1
                for part in ((data or {}).get("content") or {}).get("parts") or []:
                    response = part.get("function_response") if isinstance(part, Mapping) \
                        else None
                    if response and response.get("id"):
                        answered.add(str(response["id"]))
    except UNREADABLE:
        return None
    if count == 0:
        return None
    calls: dict[str, JournalEntry] = {}
    for r in rows:
        key = r.call_id or f"{r.attempt}#{r.seq}"
        if r.outcome == LedgerOutcome.JOURNAL:
            continue
        before = calls.get(key)
        finished = r.finished_at is not None or bool(before and before.finished)
        calls[key] = JournalEntry(
            seq=before.seq if before else r.seq, attempt=r.attempt, tool=r.tool,
            call_id=r.call_id, effect=r.effect, idempotency_key=r.idempotency_key,
            started_at=before.started_at if before else r.started_at, finished=finished,
            result=r.result if r.finished_at is not None else (before.result if before
                                                               else None),
            answered=bool(r.call_id) and r.call_id in answered)
    return list(calls.values())
