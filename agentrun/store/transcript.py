"""The facts of a run's transcript: its attempts, the ADK session events of each attempt's
turn (ADK's own table, by column name), its ledger, its approvals, its answer and its usage.
agentrun.transcript turns them into the conversation."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, or_, select
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from agentrun.ledger import LedgerEntry
from agentrun.store import adk_tables as adk
from agentrun.store.approvals import Approval, approvals_of
from agentrun.store.ledger import ledger
from agentrun.store.outcome import Result, Usage, get_result, run_usage
from agentrun.store.schema import approvals, attempts, results, runs, tool_calls
from agentrun.transcript import AttemptFacts, TranscriptFacts


async def transcript_facts(engine: AsyncEngine, uid: str) -> TranscriptFacts | None:
    """What the store knows of run `uid`'s conversation; None when it has no record of
    the run (the operator has not written it down yet)."""
    async with engine.connect() as conn:
        if (await conn.execute(select(runs.c.uid).where(runs.c.uid == uid))).first() is None:
            return None
        tried = await _attempts_of(conn, uid)
        events: dict[tuple[str, str, str, str], list[Mapping[str, Any]]] = {}
        # Only once a runner recorded its turn does ADK's table hold anything of this run
        # (on a fresh store the table may not exist before that).
        for turn in dict.fromkeys(a.turn for a in tried if a.turn is not None):
            app, user, session, invocation = turn
            rows = await conn.execute(
                select(adk.events.c.event_data)
                .where(*adk.events_of(app, user, session),
                       adk.events.c.invocation_id == invocation)
                .order_by(adk.events.c.timestamp, adk.events.c.id))
            events[turn] = [r.event_data for r in rows if isinstance(r.event_data, Mapping)]
    return TranscriptFacts(attempts=tried, events=events, ledger=await ledger(engine, uid),
                           approvals=await approvals_of(engine, uid),
                           result=await get_result(engine, uid),
                           usage=await run_usage(engine, uid))


async def _attempts_of(conn: AsyncConnection, uid: str) -> list[AttemptFacts]:
    """Run `uid`'s attempts, in order: what both a whole read and a follower's read ask."""
    return [AttemptFacts(
        attempt=r.attempt, app_name=r.app_name, user_id=r.user_id,
        session_id=r.session_id, invocation_id=r.invocation_id,
        resumes_attempt=r.resumes_attempt, resumes_run_uid=r.resumes_run_uid,
        runner_started_at=r.runner_started_at, status=r.status, reason=r.reason,
        message=r.message, finished_at=r.finished_at,
    ) for r in await conn.execute(
        select(attempts).where(attempts.c.run_uid == uid).order_by(attempts.c.attempt))]


# A ledger row or approval that changed this long before the previous read began is one
# that read saw: the margin covers a write whose transaction took its time to commit.
CHANGED_MARGIN = timedelta(seconds=30)


async def transcript_facts_after(engine: AsyncEngine, uid: str, known: TranscriptFacts,
                                 since: datetime) -> TranscriptFacts:
    """`known` (read at `since` or later) brought up to date by reading only what is new
    or may have changed: the attempts (a row each), the events appended to each turn after
    those known, the ledger rows and approvals still open or changed since, a newer
    attempt's answer, and the usage's sums. A follower asks every second; it never reads
    every fact of the run again."""
    changed = since - CHANGED_MARGIN
    async with engine.connect() as conn:
        tried = await _attempts_of(conn, uid)
        events: dict[tuple[str, str, str, str], list[Mapping[str, Any]]] = {}
        for turn in dict.fromkeys(a.turn for a in tried if a.turn is not None):
            app, user, session, invocation = turn
            had = list(known.events.get(turn) or [])
            # Events are only appended: the ones after those already read, in order.
            rows = await conn.execute(
                select(adk.events.c.event_data)
                .where(*adk.events_of(app, user, session),
                       adk.events.c.invocation_id == invocation)
                .order_by(adk.events.c.timestamp, adk.events.c.id).offset(len(had)))
            events[turn] = had + [r.event_data for r in rows
                                  if isinstance(r.event_data, Mapping)]
        calls = {(e.attempt, e.seq): e for e in known.ledger}
        for r in await conn.execute(select(tool_calls).where(
                tool_calls.c.run_uid == uid,
                or_(tool_calls.c.finished_at.is_(None), tool_calls.c.finished_at >= changed,
                    tool_calls.c.started_at >= changed))):
            calls[(r.attempt, r.seq)] = LedgerEntry(
                attempt=r.attempt, seq=r.seq, tool=r.tool, call_id=r.call_id,
                args_digest=r.args_digest, started_at=r.started_at,
                finished_at=r.finished_at, outcome=r.outcome, effect=r.effect,
                idempotency_key=r.idempotency_key, result=r.result)
        waited = {a.call_id: a for a in known.approvals}
        for r in await conn.execute(select(approvals).where(
                approvals.c.run_uid == uid,
                or_(approvals.c.decision.is_(None), approvals.c.requested_at >= changed,
                    approvals.c.decided_at >= changed))):
            waited[r.call_id] = Approval(**{c: getattr(r, c)
                                            for c in Approval.__dataclass_fields__})
        result = known.result
        newer = (await conn.execute(
            select(results).where(results.c.run_uid == uid,
                                  results.c.attempt > (result.attempt if result else 0))
            .order_by(results.c.attempt.desc()).limit(1))).one_or_none()
        if newer is not None:
            result = Result(newer.attempt, newer.text, newer.json, newer.digest,
                            newer.created_at)
    return TranscriptFacts(
        attempts=tried, events=events,
        ledger=[calls[k] for k in sorted(calls)],
        approvals=sorted(waited.values(), key=lambda a: (a.attempt, a.seq)),
        result=result, usage=await run_usage(engine, uid))


# Characters of the answer a list's summary reads (its preview shows fewer).
SUMMARY_ANSWER_CHARS = 256


@dataclass(frozen=True)
class TranscriptSummary:
    """What a list shows of a run: its answer's first characters and its usage."""

    answer: str | None  # None: no answer yet
    answer_attempt: int | None
    usage: Usage


async def transcript_summary(engine: AsyncEngine, uid: str) -> TranscriptSummary | None:
    """Run `uid`'s summary, from a few rows (never its events, ledger results or whole
    answer); None when the store has no record of the run."""
    async with engine.connect() as conn:
        if (await conn.execute(select(runs.c.uid).where(runs.c.uid == uid))).first() is None:
            return None
        row = (await conn.execute(
            select(results.c.attempt, func.substr(results.c.text, 1, SUMMARY_ANSWER_CHARS))
            .where(results.c.run_uid == uid).order_by(results.c.attempt.desc()).limit(1)
        )).one_or_none()
    return TranscriptSummary(answer=None if row is None else str(row[1]),
                             answer_attempt=None if row is None else int(row[0]),
                             usage=await run_usage(engine, uid))
