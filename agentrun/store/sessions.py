"""Namespaced ADK sessions: their keys, who owns them, and who is using them now.

ADK keys a session by (app, user, session id). Runs in different namespaces may use the
same agent, userId and sessionId, so every ADK app name the store uses is qualified by
the namespace (`<namespace>/<agent>`): the same words in two namespaces name two
sessions, two memories, two app states. Within a namespace a session belongs to the run
that first used it, for that run's agent and user; chat turns of the same agent and user
continue it, and only one live run may use it at a time.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from agentrun.store import adk_tables as adk
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
    async with engine.begin() as conn:
        return await claim_session_on(conn, namespace=namespace, session_id=session_id,
                                      agent=agent, user_id=user_id, run_uid=run_uid)


async def claim_session_on(
    conn: AsyncConnection,
    *,
    namespace: str,
    session_id: str,
    agent: str,
    user_id: str,
    run_uid: str,
) -> SessionClaim:
    """claim_session, on `conn` (in the transaction that starts the attempt)."""
    now = datetime.now(UTC)
    key = (session_owners.c.namespace == namespace, session_owners.c.session_id == session_id)
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


async def fork_session(engine: AsyncEngine, *, app_name: str, user_id: str, source: str,
                       target: str) -> bool:
    """Copies session `source` into a new session `target` (same app and user): its state
    and its events, with their ids, invocation ids, authors and times, so that the copy's
    last invocation can be continued while the source stays exactly as it was. Events
    without content (those that only mark an error or an end) are left out: ADK would read
    an invocation ending in one as finished. App- and user-scoped state is not copied: the
    copy shares it, as every session of that app and user does.

    One transaction, on ADK's own tables by column name (agentrun.store.adk_tables): a
    fork is whole or absent. Returns False when `target` exists already (forked before,
    or by another replica at the same moment)."""
    try:
        async with engine.begin() as conn:
            original = (await conn.execute(select(adk.sessions).where(
                *adk.session_is(app_name, user_id, source)))).one_or_none()
            if original is None:
                raise LookupError(f"session {source} of {app_name} is gone; nothing to fork")
            if (await conn.execute(select(adk.sessions.c.id).where(
                    *adk.session_is(app_name, user_id, target)))).first() is not None:
                return False
            copied = [copy for row in await conn.execute(
                select(adk.events).where(*adk.events_of(app_name, user_id, source))
                .order_by(adk.events.c.timestamp, adk.events.c.id))
                if (copy := _event_copy(row, target)) is not None]
            now = datetime.now(UTC).replace(tzinfo=None)
            await conn.execute(insert(adk.sessions).values(
                app_name=app_name, user_id=user_id, id=target,
                state=_session_scoped(original.state or {}), create_time=now,
                update_time=copied[-1]["timestamp"] if copied else now))
            if copied:
                await conn.execute(insert(adk.events), copied)
    except IntegrityError:
        # Another replica's fork of the same source committed first: then the target is
        # there now. Anything else is not "forked before".
        async with engine.connect() as conn:
            if (await conn.execute(select(adk.sessions.c.id).where(
                    *adk.session_is(app_name, user_id, target)))).first() is None:
                raise
        return False
    return True


_SHARED_STATE = ("app:", "user:", "temp:")


def _session_scoped(state: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in state.items() if not k.startswith(_SHARED_STATE)}


def _event_copy(row: Any, target: str) -> dict[str, Any] | None:
    """The events row for `target`, or None for an event left out of a fork."""
    data = dict(row.event_data or {})
    if data.get("content") is None:
        return None
    actions = data.get("actions")
    if isinstance(actions, Mapping) and isinstance(actions.get("state_delta"), Mapping):
        data["actions"] = {**actions, "state_delta": _session_scoped(actions["state_delta"])}
    return {"id": row.id, "app_name": row.app_name, "user_id": row.user_id,
            "session_id": target, "invocation_id": row.invocation_id,
            "timestamp": row.timestamp, "event_data": data}
