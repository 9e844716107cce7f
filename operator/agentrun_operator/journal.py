"""The journal of an attempt, read from the store as the resume decision
(decide.decide_resume) takes it: for the automatic resume of a run (reconcile.py) and for
a manual resume (replay.py)."""

from __future__ import annotations

import logging

from sqlalchemy.ext.asyncio import AsyncEngine

from agentrun import effects, store
from agentrun_operator import metrics
from agentrun_operator.decide import ANSWERED, FINISHED, IN_DOUBT, Journal, JournalCall

log = logging.getLogger("agentrun.operator")


async def journal_of(engine: AsyncEngine, uid: str, attempt: int) -> Journal:
    """The journal of attempt `attempt`'s session (every attempt of the run that used the
    same session), or an unavailable one when it is gone or cannot be read."""
    try:
        row = await store.get_attempt(engine, uid, attempt)
        if row is None or row.invocation_id is None or row.session_id is None:
            return Journal(False)
        same_session = [row.attempt]
        for earlier in range(1, attempt):
            found = await store.get_attempt(engine, uid, earlier)
            if found is not None and found.session_id == row.session_id:
                same_session.append(earlier)
        entries = await store.journal(engine, uid, sorted(same_session), row.app_name or "",
                                      row.user_id or "", row.session_id)
    except Exception as e:
        log.warning("event=journal-unreadable uid=%s attempt=%s error=%r", uid, attempt, e)
        metrics.STORE_ERRORS.labels("journal").inc()
        return Journal(False)
    if entries is None:
        return Journal(False)
    return Journal(True, tuple(JournalCall(
        seq=e.seq, tool=e.tool, effect=e.effect or effects.EFFECTFUL,
        state=ANSWERED if e.answered else FINISHED if e.finished else IN_DOUBT,
        called_at=e.started_at, key=e.idempotency_key or "") for e in entries))
