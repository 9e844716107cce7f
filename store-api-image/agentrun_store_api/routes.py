"""What a runner may do: one handler per route, each with the caller its token speaks
for, and the table of routes (`ROUTES`: paths are the client's contract, runner
store_client; names are the metrics labels and the log field)."""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

from agentrun import effects, store
from agentrun.store.memory import StoreMemoryService
from agentrun.vocabulary import (
    DEFAULT_MEMORY_TTL_DAYS,
    ENV_MEMORY_TTL_DAYS,
    LedgerOutcome,
    RunStatus,
)
from agentrun_store_api.auth import Caller
from agentrun_store_api.refusal import Refused


@dataclass(frozen=True)
class Route:
    """One route: its name (the handler's, the metrics label and the log field), method
    and path; `ledger`, the ledger write it is (its handling time is measured)."""

    name: str
    method: str
    path: str
    ledger: str = ""


ROUTES = (
    Route("whoami", "GET", "/v1/attempt"),
    Route("begin", "POST", "/v1/attempt/begin"),
    Route("invocation", "POST", "/v1/attempt/invocation"),
    Route("outcome", "POST", "/v1/attempt/outcome"),
    Route("input", "GET", "/v1/input"),
    Route("agent", "GET", "/v1/agent"),
    Route("create_session", "POST", "/v1/sessions"),
    Route("list_sessions", "GET", "/v1/sessions"),
    Route("get_session", "GET", "/v1/sessions/{session}"),
    Route("delete_session", "DELETE", "/v1/sessions/{session}"),
    Route("append_event", "POST", "/v1/sessions/{session}/events"),
    Route("ledger", "GET", "/v1/ledger"),
    Route("journal", "GET", "/v1/journal"),
    Route("open_call", "POST", "/v1/ledger", ledger="open"),
    Route("close_call", "POST", "/v1/ledger/{seq}/close", ledger="close"),
    Route("add_memory", "POST", "/v1/memory/events"),
    Route("search_memory", "POST", "/v1/memory/search"),
    Route("record_side_effect", "POST", "/v1/outbox"),
)


async def body_of(request: web.Request) -> dict[str, Any]:
    data = await request.json(loads=json.loads) if request.can_read_body else {}
    if not isinstance(data, dict):
        raise Refused(400, "the body must be a JSON object")
    return data


def field(data: Mapping[str, Any], name: str, kind: type, *, optional: bool = False) -> Any:
    value = data.get(name)
    if value is None and optional:
        return None
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        raise Refused(400, f"field {name!r} must be a {kind.__name__}")
    return value


class Routes:
    """What a runner may do, each with the caller its token speaks for."""

    def __init__(self, engine: AsyncEngine) -> None:
        from google.adk.sessions.database_session_service import DatabaseSessionService

        self.engine = engine
        self.sessions = DatabaseSessionService(db_engine=engine)
        ttl = int(os.environ.get(ENV_MEMORY_TTL_DAYS) or DEFAULT_MEMORY_TTL_DAYS)
        self.memory = StoreMemoryService(engine, ttl_days=ttl)

    # -- the attempt -------------------------------------------------------------------

    async def whoami(self, _: web.Request, caller: Caller) -> dict[str, Any]:
        return {"namespace": caller.namespace, "runName": caller.run_name,
                "runUid": caller.run_uid, "attempt": caller.attempt, "agent": caller.agent,
                "userId": caller.user_id, "sessionId": caller.session_id,
                "inputDigest": caller.input_digest,
                # Idempotency keys are the lineage's: a replay run's are its original's.
                "rootRunUid": await store.lineage_root(self.engine, caller.run_uid),
                "resumeInvocation": await self._resume_invocation(caller)}

    async def _resume_invocation(self, caller: Caller) -> str | None:
        """The invocation this attempt continues, when it resumes an earlier one."""
        if caller.resumes_attempt is None:
            return None
        earlier = await store.get_attempt(self.engine, caller.resumes_run_uid or caller.run_uid,
                                          caller.resumes_attempt)
        return earlier.invocation_id if earlier is not None else None

    async def journal(self, _: web.Request, caller: Caller) -> dict[str, Any]:
        """The calls of the session this attempt resumes, for answering from the journal
        those that finished."""
        if caller.resumes_attempt is None:
            return {"calls": []}
        if caller.resumes_run_uid:  # a fork of another run's session: that run's ledger
            source = await store.get_attempt(self.engine, caller.resumes_run_uid,
                                             caller.resumes_attempt)
            entries = await store.journal(
                self.engine, caller.resumes_run_uid, list(range(1, caller.resumes_attempt + 1)),
                caller.app_name, caller.user_id,
                source.session_id if source and source.session_id else caller.session_id) or []
        else:
            entries = await store.journal(self.engine, caller.run_uid,
                                          list(range(1, caller.attempt)), caller.app_name,
                                          caller.user_id, caller.session_id) or []
        return {"calls": [{"seq": e.seq, "attempt": e.attempt, "tool": e.tool,
                           "callId": e.call_id, "effect": e.effect,
                           "idempotencyKey": e.idempotency_key, "finished": e.finished,
                           "answered": e.answered, "result": e.result} for e in entries]}

    async def begin(self, request: web.Request, caller: Caller) -> dict[str, Any]:
        await store.begin_attempt(self.engine, caller.run_uid, caller.attempt,
                                  caller.app_name, caller.user_id, caller.session_id)
        return await self.whoami(request, caller)

    async def invocation(self, request: web.Request, caller: Caller) -> None:
        data = await body_of(request)
        try:
            await store.record_invocation(self.engine, caller.run_uid, caller.attempt,
                                          field(data, "invocationId", str))
        except store.InvocationRecorded as e:
            raise Refused(409, str(e)) from e

    async def outcome(self, request: web.Request, caller: Caller) -> dict[str, Any]:
        data = await body_of(request)
        status = field(data, "status", str)
        if status not in (RunStatus.SUCCEEDED, RunStatus.FAILED):
            raise Refused(400, f"status must be {RunStatus.SUCCEEDED} or {RunStatus.FAILED}")
        counted = await store.record_outcome(
            self.engine, caller.run_uid, caller.attempt, status,
            field(data, "reason", str, optional=True),
            field(data, "message", str, optional=True))
        return {"recorded": counted}

    async def input(self, _: web.Request, caller: Caller) -> dict[str, Any]:
        snapshot = None
        if caller.input_digest:
            snapshot = await store.get_input(self.engine, caller.input_digest)
        if snapshot is None:
            raise Refused(404, f"the input snapshot {caller.input_digest or '(none)'} of run "
                               f"{caller.run_name} is not in the run store")
        return {"digest": snapshot.digest, "text": snapshot.text,
                "files": {n: base64.b64encode(c).decode() for n, c in snapshot.files.items()}}

    async def agent(self, _: web.Request, caller: Caller) -> dict[str, Any]:
        """The Agent snapshot the run pinned at launch (from the store's record of the run
        the token speaks for, never from anything the runner says)."""
        run = await store.get_run(self.engine, caller.run_uid)
        digest = run.agent_digest if run is not None else None
        snapshot = await store.get_agent(self.engine, digest) if digest else None
        if snapshot is None:
            raise Refused(404, f"run {caller.run_name} pinned no Agent snapshot"
                          + (f" ({digest} is not in the run store)" if digest else ""))
        return {"digest": digest, "snapshot": snapshot}

    # -- its session -------------------------------------------------------------------

    def _own_session(self, caller: Caller, session_id: str) -> None:
        if session_id != caller.session_id:
            raise Refused(403, f"attempt {caller.attempt} of run {caller.run_name} may use "
                               f"only its own session {caller.session_id}, not {session_id}")

    def _session_json(self, session: Any, caller: Caller) -> dict[str, Any]:
        # The runner knows its app by the agent's name; the namespaced key stays here.
        data: dict[str, Any] = json.loads(session.model_dump_json(exclude_none=True))
        data["app_name"] = caller.agent
        return data

    async def create_session(self, request: web.Request, caller: Caller) -> dict[str, Any]:
        from google.adk.errors.already_exists_error import AlreadyExistsError

        data = await body_of(request)
        session_id = field(data, "sessionId", str, optional=True) or caller.session_id
        self._own_session(caller, session_id)
        try:
            session = await self.sessions.create_session(
                app_name=caller.app_name, user_id=caller.user_id, session_id=session_id,
                state=field(data, "state", dict, optional=True))
        except AlreadyExistsError as e:
            raise Refused(409, f"session {session_id} exists already") from e
        return self._session_json(session, caller)

    async def get_session(self, request: web.Request, caller: Caller) -> dict[str, Any]:
        from google.adk.sessions.base_session_service import GetSessionConfig

        session_id = request.match_info["session"]
        self._own_session(caller, session_id)
        query = request.query
        config = None
        if "numRecentEvents" in query or "afterTimestamp" in query:
            try:
                config = GetSessionConfig(
                    num_recent_events=int(query["numRecentEvents"])
                    if "numRecentEvents" in query else None,
                    after_timestamp=float(query["afterTimestamp"])
                    if "afterTimestamp" in query else None)
            except ValueError as e:
                raise Refused(400, f"bad session query: {e}") from e
        session = await self.sessions.get_session(
            app_name=caller.app_name, user_id=caller.user_id, session_id=session_id,
            config=config)
        if session is None:
            raise Refused(404, f"session {session_id} does not exist yet")
        return self._session_json(session, caller)

    async def list_sessions(self, _: web.Request, caller: Caller) -> dict[str, Any]:
        listed = await self.sessions.list_sessions(app_name=caller.app_name,
                                                   user_id=caller.user_id)
        return {"sessions": [self._session_json(s, caller) for s in listed.sessions
                             if s.id == caller.session_id]}

    async def delete_session(self, request: web.Request, caller: Caller) -> None:
        raise Refused(403, f"a runner may not delete sessions: session "
                           f"{request.match_info['session']} is part of the record of run "
                           f"{caller.run_name}")

    async def append_event(self, request: web.Request, caller: Caller) -> dict[str, Any]:
        from google.adk.events.event import Event
        from google.adk.sessions.session import Session

        session_id = request.match_info["session"]
        self._own_session(caller, session_id)
        event = Event.model_validate_json(await request.read())
        # One live run per session (store.claim_session), so the stale-writer check ADK
        # does against its in-memory copy has nothing to protect here: the runner holds
        # the session object, the store holds the truth, and this append goes on it.
        shell = Session(id=session_id, app_name=caller.app_name, user_id=caller.user_id,
                        last_update_time=float("inf"))
        await self.sessions.append_event(shell, event)
        return {"id": event.id}

    # -- its ledger --------------------------------------------------------------------

    async def open_call(self, request: web.Request, caller: Caller) -> None:
        data = await body_of(request)
        seq, tool = field(data, "seq", int), field(data, "tool", str)
        call_id = field(data, "callId", str, optional=True)
        digest = field(data, "argsDigest", str)
        effect = field(data, "effect", str, optional=True)
        if effect is not None and effect not in effects.ALL:
            raise Refused(400, f"effect must be one of {', '.join(effects.ALL)}")
        try:
            await store.open_call(self.engine, caller.run_uid, caller.attempt, seq, tool,
                                  call_id, digest, effect,
                                  field(data, "idempotencyKey", str, optional=True))
        except store.AttemptSettled as e:
            raise Refused(409, str(e)) from e
        except IntegrityError as e:
            # The same call sent again (its first answer was lost) is the same row;
            # anything else under this seq is a rewrite, which the ledger never allows.
            if not await self._same_call(caller, seq, tool, call_id, digest):
                raise Refused(409, f"call {seq} of attempt {caller.attempt} is already on "
                                   "the ledger as another call; ledger rows are never "
                                   "rewritten") from e

    async def _same_call(self, caller: Caller, seq: int, tool: str, call_id: str | None,
                         digest: str) -> bool:
        rows = await store.ledger(self.engine, caller.run_uid)
        return any(r.attempt == caller.attempt and r.seq == seq and r.tool == tool
                   and r.call_id == call_id and r.args_digest == digest for r in rows)

    async def close_call(self, request: web.Request, caller: Caller) -> None:
        data = await body_of(request)
        outcome = field(data, "outcome", str)
        if outcome not in (LedgerOutcome.OK, LedgerOutcome.ERROR, LedgerOutcome.JOURNAL):
            raise Refused(400, f"outcome must be {LedgerOutcome.OK}, {LedgerOutcome.ERROR} or "
                               f"{LedgerOutcome.JOURNAL}")
        try:
            seq = int(request.match_info["seq"])
        except ValueError as e:
            raise Refused(400, "the call's seq must be a number") from e
        if not await store.close_call(self.engine, caller.run_uid, caller.attempt, seq,
                                      outcome, data.get("result")):
            raise Refused(409, f"call {seq} of attempt {caller.attempt} of run "
                               f"{caller.run_name} is not an open call of this attempt; "
                               "a finished call is never rewritten")

    async def ledger(self, _: web.Request, caller: Caller) -> dict[str, Any]:
        rows = await store.ledger(self.engine, caller.run_uid)
        return {"calls": [{"seq": r.seq, "tool": r.tool, "callId": r.call_id,
                           "finished": r.finished_at is not None, "outcome": r.outcome}
                          for r in rows if r.attempt == caller.attempt]}

    # -- memory and the sample outbox --------------------------------------------------

    async def add_memory(self, request: web.Request, caller: Caller) -> None:
        from google.adk.events.event import Event

        data = await body_of(request)
        events = [Event.model_validate_json(json.dumps(e)) for e in field(data, "events", list)]
        await self.memory.add_events_to_memory(
            app_name=caller.app_name, user_id=caller.user_id, events=events,
            session_id=caller.session_id)

    async def search_memory(self, request: web.Request, caller: Caller) -> dict[str, Any]:
        data = await body_of(request)
        found = await self.memory.search_memory(
            app_name=caller.app_name, user_id=caller.user_id,
            query=field(data, "query", str))
        return json.loads(found.model_dump_json(exclude_none=True))

    async def record_side_effect(self, request: web.Request, caller: Caller) -> dict[str, Any]:
        data = await body_of(request)
        made = await store.record_side_effect(
            self.engine, field(data, "tool", str), field(data, "args", dict),
            run_name=caller.run_name, run_uid=caller.run_uid, attempt=caller.attempt,
            idempotency_key=field(data, "idempotencyKey", str, optional=True))
        return {"recorded": made}


