"""Namespaced ADK sessions: their keys, who owns them, and who is using them now.

ADK keys a session by (app, user, session id). Runs in different namespaces may use the
same agent, userId and sessionId, so every ADK app name the store uses is qualified by
the namespace (`<namespace>/<agent>`): the same words in two namespaces name two
sessions, two memories, two app states. Within a namespace a session belongs to the run
that first used it, for that run's agent and user; chat turns of the same agent and user
continue it, and only one live run may use it at a time.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from agentrun.store.dialect import upsert_insert
from agentrun.store.schema import runs, session_owners
from agentrun.vocabulary import RunStatus


def session_app(namespace: str, agent: str) -> str:
    """The ADK app name of `agent` in `namespace` (at most 63 + 1 + 63 characters, within
    ADK's 128-character keys)."""
    return f"{namespace}/{agent}"


@dataclass(frozen=True)
class SessionClaim:
    """The answer of `claim_session`: `granted`, or why not (the owner's or the holder's
    run, by name, for the message)."""

    granted: bool
    busy_with: str | None = None  # the name of the live run that holds the session
    owned_by: str | None = None  # the owner's agent/user when they differ from ours


async def claim_session(
    engine: AsyncEngine,
    *,
    namespace: str,
    session_id: str,
    agent: str,
    user_id: str,
    run_uid: str,
) -> SessionClaim:
    """Lets run `run_uid` use session `session_id` of `namespace`, atomically.

    Granted when the session is new (this run then owns it), or owned for the same agent
    and user and not held by another live run. Idempotent for the run that holds it.
    """
    now = datetime.now(UTC)
    key = (session_owners.c.namespace == namespace, session_owners.c.session_id == session_id)
    async with engine.begin() as conn:
        await conn.execute(
            upsert_insert(conn, session_owners).values(
                namespace=namespace, session_id=session_id, agent=agent, user_id=user_id,
                owner_run_uid=run_uid, holder_run_uid=run_uid, updated_at=now,
            ).on_conflict_do_nothing()
        )
        # A row lock on Postgres: two runs claiming at once are decided one after the
        # other (SQLite serialises writers anyway).
        row = (await conn.execute(select(session_owners).where(*key).with_for_update())).one()
        if (row.agent, row.user_id) != (agent, user_id):
            return SessionClaim(False, owned_by=f"agent {row.agent}, user {row.user_id}")
        if row.holder_run_uid not in (None, run_uid):
            holder = (await conn.execute(
                select(runs.c.name, runs.c.status).where(runs.c.uid == row.holder_run_uid)
            )).one_or_none()
            if holder is not None and holder.status in RunStatus.LIVE:
                return SessionClaim(False, busy_with=holder.name)
        await conn.execute(
            update(session_owners).where(*key).values(holder_run_uid=run_uid, updated_at=now))
    return SessionClaim(True)
