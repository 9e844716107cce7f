"""The facts of a run's transcript: its attempts, the ADK session events of each attempt's
turn (ADK's own table, by column name), its ledger, its approvals, its answer and its usage.
agentrun.transcript turns them into the conversation."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from agentrun.store import adk_tables as adk
from agentrun.store.approvals import approvals_of
from agentrun.store.ledger import ledger
from agentrun.store.outcome import get_result, run_usage
from agentrun.store.schema import attempts, runs
from agentrun.transcript import AttemptFacts, TranscriptFacts


async def transcript_facts(engine: AsyncEngine, uid: str) -> TranscriptFacts | None:
    """What the store knows of run `uid`'s conversation; None when it has no record of
    the run (the operator has not written it down yet)."""
    async with engine.connect() as conn:
        if (await conn.execute(select(runs.c.uid).where(runs.c.uid == uid))).first() is None:
            return None
        tried = [AttemptFacts(
            attempt=r.attempt, app_name=r.app_name, user_id=r.user_id,
            session_id=r.session_id, invocation_id=r.invocation_id,
            resumes_attempt=r.resumes_attempt, resumes_run_uid=r.resumes_run_uid,
            runner_started_at=r.runner_started_at, status=r.status, reason=r.reason,
            message=r.message, finished_at=r.finished_at,
        ) for r in await conn.execute(
            select(attempts).where(attempts.c.run_uid == uid).order_by(attempts.c.attempt))]
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
