"""What a runner may do: one handler per route, each with the caller its token speaks
for, and the table of routes (`ROUTES`: paths are the client's contract, runner
store_client; names are the metrics labels, the log field and the keys of the body limits
in limits.BODY_BYTES).

Nothing a runner says about what was counted is believed: it reports its outcome only with
one of its own reasons (`refusal_of_outcome`), a call is closed `journal` only when the
journal of the session it resumes answered that call (`refusal_of_journal_close`), and
"the input is not there" is the store API's own observation, recorded by it.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from aiohttp import web
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

from agentrun import effects, store
from agentrun.attempt import AttemptIdentity, AttemptStart
from agentrun.store.memory import StoreMemoryService, keywords, memory_entries
from agentrun.vocabulary import (
    DEFAULT_MEMORY_TTL_DAYS,
    ENV_MEMORY_TTL_DAYS,
    ApprovalDecision,
    LedgerOutcome,
    Reason,
    RunStatus,
)
from agentrun_store_api import limits, metrics
from agentrun_store_api.quotas import Quotas, Usage
from agentrun_store_api.refusal import OverQuota, Refused


@dataclass(frozen=True)
class Route:
    """One route: its name (the handler's, the metrics label, the log field and the key of
    its body limit), method and path; `ledger`, the ledger write it is (its handling time
    is measured); `fenced`, whether its own statement refuses a settled attempt (so no
    separate liveness read is made); `takes`, what each request of it counts against the
    attempt's quotas at least, so that one they would refuse anyway is refused before
    anything is read."""

    name: str
    method: str
    path: str
    ledger: str = ""
    fenced: bool = False
    takes: Usage | None = None  # what each request of it counts at least (quotas.check)


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
    Route("append_event", "POST", "/v1/sessions/{session}/events", takes=Usage(events=1)),
    Route("ledger", "GET", "/v1/ledger"),
    Route("journal", "GET", "/v1/journal"),
    Route("open_call", "POST", "/v1/ledger", ledger="open", fenced=True),
    Route("close_call", "POST", "/v1/ledger/{seq}/close", ledger="close", fenced=True),
    Route("add_memory", "POST", "/v1/memory/events"),
    Route("search_memory", "POST", "/v1/memory/search"),
    Route("record_side_effect", "POST", "/v1/outbox", takes=Usage(outbox_rows=1)),
    Route("usage", "POST", "/v1/usage"),
    Route("result", "POST", "/v1/attempt/result"),
    Route("request_approval", "POST", "/v1/approvals"),
)
BY_NAME = {r.name: r for r in ROUTES}


# -- what a runner may say ------------------------------------------------------------------


def refusal_of_outcome(status: str, reason: str | None) -> str | None:
    """Why the store API refuses a runner's report of its outcome, or None: a success
    with no reason, or a failure with one of the runner's own reasons
    (vocabulary.Reason.RUNNER_REPORTED). Every other reason is the operator's to decide:
    many of them mean "nothing ran", and no runner may say that of itself."""
    own = ", ".join(sorted(Reason.RUNNER_REPORTED))
    if status == RunStatus.SUCCEEDED:
        return None if reason is None else (
            f"a success carries no reason, not {reason!r}")
    if status != RunStatus.FAILED:
        return f"status must be {RunStatus.SUCCEEDED} or {RunStatus.FAILED}, not {status!r}"
    if reason is None:
        return f"a failure names its reason, one of the runner's own: {own}"
    if reason not in Reason.RUNNER_REPORTED:
        return (f"a runner reports a failure only with one of its own reasons ({own}); "
                f"{reason!r} is not one: the operator decides it from what it observes")
    return None


def refusal_of_journal_close(resuming: bool, call: store.LedgerEntry | None,
                             journal: Sequence[store.JournalEntry]) -> str | None:
    """Why a `journal` close of `call` (this attempt's ledger row) is refused, or None:
    only a resuming attempt answers a call from the journal, and only a call the journal
    of the session it resumes holds as finished (same call id, same tool). A journal
    close is left out of toolsExecuted, so anything else would erase a call."""
    if not resuming:
        return ("a call is answered from the journal only in an attempt that resumes "
                "another; this attempt resumes none")
    if call is None:
        return None  # no such open row: the close itself says so
    finished = {e.call_id: e for e in journal if e.call_id and e.finished}
    earlier = finished.get(call.call_id) if call.call_id else None
    if earlier is None:
        return (f"call {call.seq} ({call.tool}, call id {call.call_id or 'none'}) is not a "
                "call the journal of the resumed session holds as finished: it ran here, "
                "and closes ok or error")
    if earlier.tool != call.tool:
        return (f"call {call.seq} is {call.tool}, but the journal's call {call.call_id} "
                f"was {earlier.tool}")
    return None


# -- bodies ---------------------------------------------------------------------------------


async def read_body(request: web.Request) -> bytes:
    """The request's body, refused 413 past its route's limit (limits.BODY_BYTES): said
    by Content-Length before it is read, and counted while it is read."""
    name = request.match_info.route.name or ""
    limit = limits.BODY_BYTES.get(name, 0)
    declared = request.content_length
    if declared is not None and declared > limit:
        raise too_large(name, limit, declared)
    if not request.body_exists:
        return b""
    if declared is not None:  # within the limit: aiohttp reads exactly that much
        return await request.read()
    chunks: list[bytes] = []
    seen = 0
    async for chunk in request.content.iter_chunked(64 * limits.KiB):
        seen += len(chunk)
        if seen > limit:
            raise too_large(name, limit, None)
        chunks.append(chunk)
    return b"".join(chunks)


def too_large(name: str, limit: int, size: int | None) -> Refused:
    """413, naming the route and its limit."""
    route = BY_NAME.get(name)
    where = f"{route.method} {route.path}" if route else "this route"
    takes = f"a body of at most {limits.shown(limit)}" if limit else "no body"
    this = f"; this one is {limits.shown(size)}" if size is not None else ""
    return Refused(413, f"{where} takes {takes}{this}")


async def body_of(request: web.Request) -> dict[str, Any]:
    raw = await read_body(request)
    try:
        data = json.loads(raw) if raw else {}
    except ValueError as e:  # not JSON, or not UTF-8
        raise Refused(400, f"the body is not JSON: {e}") from e
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


def _events(raw: list[Any]) -> list[Any]:
    from google.adk.events.event import Event
    from pydantic import ValidationError

    try:
        return [Event.model_validate_json(json.dumps(e)) for e in raw]
    except ValidationError as e:
        raise not_an_event(e) from e


def not_an_event(error: Any) -> Refused:
    """400 for a body that is not an ADK event: where, and what is wrong (never the
    value itself)."""
    first = error.errors(include_input=False)[0] if error.error_count() else {}
    where = ".".join(str(p) for p in first.get("loc") or ()) or "the event"
    return Refused(400, f"not an ADK event: {error.error_count()} error(s), the first at "
                        f"{where}: {first.get('msg', 'invalid')}")


class Routes:
    """What a runner may do, each with the caller its token speaks for."""

    def __init__(self, engine: AsyncEngine, quotas: Quotas | None = None) -> None:
        from google.adk.sessions.database_session_service import DatabaseSessionService

        self.engine = engine
        self.quotas = quotas or Quotas(engine)
        self.sessions = DatabaseSessionService(db_engine=engine)
        ttl = int(os.environ.get(ENV_MEMORY_TTL_DAYS) or DEFAULT_MEMORY_TTL_DAYS)
        self.memory = StoreMemoryService(engine, ttl_days=ttl, max_words=limits.QUERY_WORDS)

    # -- the attempt -------------------------------------------------------------------

    async def whoami(self, _: web.Request, caller: AttemptIdentity) -> dict[str, Any]:
        used = await store.run_usage(self.engine, caller.run_uid,
                                     before_attempt=caller.attempt)
        decided = [a for a in await store.approvals_of(self.engine, caller.run_uid)
                   if not a.pending]
        return AttemptStart(
            identity=caller,
            root_run_uid=await store.lineage_root(self.engine, caller.run_uid),
            resume_invocation=await self._resume_invocation(caller),
            usage={"modelCalls": used.model_calls, "toolCalls": used.tool_calls,
                   "inputTokens": used.input_tokens, "outputTokens": used.output_tokens,
                   "costMicroUSD": used.cost_micro_usd},
            decisions={a.call_id: {"decision": a.decision, "approver": a.approver,
                                   "note": a.note} for a in decided}).to_wire()

    async def _resume_invocation(self, caller: AttemptIdentity) -> str | None:
        """The invocation this attempt continues, when it resumes an earlier one."""
        if caller.resumes_attempt is None:
            return None
        earlier = await store.get_attempt(self.engine, caller.resumes_run_uid or caller.run_uid,
                                          caller.resumes_attempt)
        return earlier.invocation_id if earlier is not None else None

    async def _journal_entries(self, caller: AttemptIdentity) -> list[store.JournalEntry]:
        """The journal of the session this attempt resumes (none if it resumes none)."""
        if caller.resumes_attempt is None:
            return []
        if caller.resumes_run_uid:  # a fork of another run's session: that run's ledger
            source = await store.get_attempt(self.engine, caller.resumes_run_uid,
                                             caller.resumes_attempt)
            return await store.journal(
                self.engine, caller.resumes_run_uid, list(range(1, caller.resumes_attempt + 1)),
                caller.app_name, caller.user_id,
                source.session_id if source and source.session_id else caller.session_id) or []
        return await store.journal(self.engine, caller.run_uid, list(range(1, caller.attempt)),
                                   caller.app_name, caller.user_id, caller.session_id) or []

    async def journal(self, _: web.Request, caller: AttemptIdentity) -> dict[str, Any]:
        """The calls of the session this attempt resumes, for answering from the journal
        those that finished."""
        entries = await self._journal_entries(caller)
        return {"calls": [{"seq": e.seq, "attempt": e.attempt, "tool": e.tool,
                           "callId": e.call_id, "effect": e.effect,
                           "idempotencyKey": e.idempotency_key, "finished": e.finished,
                           "answered": e.answered, "result": e.result} for e in entries]}

    async def begin(self, request: web.Request, caller: AttemptIdentity) -> dict[str, Any]:
        await read_body(request)
        await store.begin_attempt(self.engine, caller.run_uid, caller.attempt,
                                  caller.app_name, caller.user_id, caller.session_id)
        return await self.whoami(request, caller)

    async def invocation(self, request: web.Request, caller: AttemptIdentity) -> None:
        data = await body_of(request)
        try:
            await store.record_invocation(self.engine, caller.run_uid, caller.attempt,
                                          field(data, "invocationId", str))
        except store.InvocationRecorded as e:
            raise Refused(409, str(e)) from e

    async def outcome(self, request: web.Request, caller: AttemptIdentity) -> dict[str, Any]:
        data = await body_of(request)
        status = field(data, "status", str)
        reason = field(data, "reason", str, optional=True)
        refused = refusal_of_outcome(status, reason)
        if refused is not None:
            raise Refused(400, refused)
        counted = await store.record_outcome(
            self.engine, caller.run_uid, caller.attempt, status, reason,
            field(data, "message", str, optional=True))
        return {"recorded": counted}

    async def input(self, _: web.Request, caller: AttemptIdentity) -> dict[str, Any]:
        snapshot = None
        if caller.input_digest:
            snapshot = await store.get_input(self.engine, caller.input_digest)
        if snapshot is None:
            message = (f"the input snapshot {caller.input_digest or '(none)'} of run "
                       f"{caller.run_name} is not in the run store")
            # Its own observation, not the runner's word: the runner may not say that
            # nothing ran (vocabulary.Reason.RUNNER_REPORTED). First report wins, as ever.
            await store.record_outcome(
                self.engine, caller.run_uid, caller.attempt, RunStatus.FAILED,
                Reason.INPUT_UNAVAILABLE,
                f"The input snapshot {caller.input_digest or '(none)'} is not in the run "
                "store: the store API could not give the runner its input.")
            raise Refused(404, message)
        return {"digest": snapshot.digest, "text": snapshot.text,
                "files": {n: base64.b64encode(c).decode() for n, c in snapshot.files.items()}}

    async def agent(self, _: web.Request, caller: AttemptIdentity) -> dict[str, Any]:
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

    def _own_session(self, caller: AttemptIdentity, session_id: str) -> None:
        if session_id != caller.session_id:
            raise Refused(403, f"attempt {caller.attempt} of run {caller.run_name} may use "
                               f"only its own session {caller.session_id}, not {session_id}")

    def _session_json(self, session: Any, caller: AttemptIdentity) -> dict[str, Any]:
        # The runner knows its app by the agent's name; the namespaced key stays here.
        data: dict[str, Any] = json.loads(session.model_dump_json(exclude_none=True))
        data["app_name"] = caller.agent
        return data

    async def create_session(self, request: web.Request, caller: AttemptIdentity) -> dict[str, Any]:
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

    async def get_session(self, request: web.Request, caller: AttemptIdentity) -> dict[str, Any]:
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

    async def list_sessions(self, _: web.Request, caller: AttemptIdentity) -> dict[str, Any]:
        listed = await self.sessions.list_sessions(app_name=caller.app_name,
                                                   user_id=caller.user_id)
        return {"sessions": [self._session_json(s, caller) for s in listed.sessions
                             if s.id == caller.session_id]}

    async def delete_session(self, request: web.Request, caller: AttemptIdentity) -> None:
        raise Refused(403, f"a runner may not delete sessions: session "
                           f"{request.match_info['session']} is part of the record of run "
                           f"{caller.run_name}")

    async def append_event(self, request: web.Request, caller: AttemptIdentity) -> dict[str, Any]:
        from google.adk.events.event import Event
        from pydantic import ValidationError

        session_id = request.match_info["session"]
        self._own_session(caller, session_id)
        raw = await read_body(request)
        try:
            event = Event.model_validate_json(raw)
        except ValidationError as e:
            raise not_an_event(e) from e
        more = Usage(events=1, event_bytes=len(raw))
        await self.quotas.take(caller, more)
        try:
            await self._append(caller, session_id, event)
        except BaseException:
            self.quotas.give_back(caller, more)
            raise
        return {"id": event.id}

    async def _append(self, caller: AttemptIdentity, session_id: str, event: Any) -> None:
        from google.adk.sessions.session import Session

        # One live run per session (store.claim_session), so the stale-writer check ADK
        # does against its in-memory copy has nothing to protect here: the runner holds
        # the session object, the store holds the truth, and this append goes on it.
        shell = Session(id=session_id, app_name=caller.app_name, user_id=caller.user_id,
                        last_update_time=float("inf"))
        await self.sessions.append_event(shell, event)

    def _carried_turn(self, caller: AttemptIdentity,
                      data: Mapping[str, Any]) -> tuple[str, Any, int]:
        """The model's turn an open carries (the event whose function call this is, held
        by the runner for this request): its session, the event, its size. Checked as an
        append is."""
        from google.adk.events.event import Event
        from pydantic import ValidationError

        turn = field(data, "turn", dict)
        session_id = field(turn, "sessionId", str)
        self._own_session(caller, session_id)
        # Measured as its UTF-8 bytes, as the runner measures it and as an event appended
        # alone is counted (escaped, a non-ASCII turn would count up to six times over).
        raw = json.dumps(field(turn, "event", dict), separators=(",", ":"),
                         ensure_ascii=False).encode()
        if len(raw) > limits.CARRIED_EVENT_BYTES:
            raise Refused(413, f"a carried turn may be {limits.shown(limits.CARRIED_EVENT_BYTES)} "
                               f"at most; this one is {limits.shown(len(raw))}: append it alone")
        try:
            event = Event.model_validate_json(raw)
        except ValidationError as e:
            raise not_an_event(e) from e
        if not event.get_function_calls():
            raise Refused(400, "an open carries only the model's turn that calls tools; "
                               "append any other event alone")
        return session_id, event, len(raw)

    # -- its ledger --------------------------------------------------------------------

    def _carried(self, data: Mapping[str, Any]) -> list[store.CallClose]:
        """The closes an open carries: ok or error (a journal close goes alone, checked),
        each result small enough to be carried."""
        raw = field(data, "closes", list, optional=True) or []
        if len(raw) > limits.CLOSES_PER_OPEN:
            raise Refused(413, f"an open carries at most {limits.CLOSES_PER_OPEN} closes; "
                               f"this one carries {len(raw)}")
        closes = []
        for item in raw:
            if not isinstance(item, dict):
                raise Refused(400, "each of 'closes' must be an object")
            outcome = field(item, "outcome", str)
            if outcome not in (LedgerOutcome.OK, LedgerOutcome.ERROR):
                raise Refused(400, f"a carried close is {LedgerOutcome.OK} or "
                                   f"{LedgerOutcome.ERROR}; a {outcome} close goes alone")
            result = item.get("result")
            size = len(json.dumps(result, separators=(",", ":"))) if result is not None else 0
            if size > limits.CARRIED_RESULT_BYTES:
                raise Refused(413, f"a carried close's result may be "
                                   f"{limits.shown(limits.CARRIED_RESULT_BYTES)} at most; "
                                   f"this one is {limits.shown(size)}: close it alone")
            closes.append(store.CallClose(field(item, "seq", int), outcome, result))
        return closes

    async def open_call(self, request: web.Request, caller: AttemptIdentity) -> dict[str, Any]:
        data = await body_of(request)
        closes = self._carried(data)
        seq, tool = field(data, "seq", int), field(data, "tool", str)
        call_id = field(data, "callId", str, optional=True)
        digest = field(data, "argsDigest", str)
        effect = field(data, "effect", str, optional=True)
        if effect is not None and effect not in effects.ALL:
            raise Refused(400, f"effect must be one of {', '.join(effects.ALL)}")
        if seq < 1:
            raise Refused(400, "a call's seq counts from 1")
        # The runner numbers its calls from 1: bounding seq bounds the rows, uncounted.
        if seq > limits.LEDGER_ROWS_PER_ATTEMPT:
            raise OverQuota(f"call {seq} of attempt {caller.attempt} of run "
                               f"{caller.run_name}: one attempt may record at most "
                               f"{limits.LEDGER_ROWS_PER_ATTEMPT:,} tool calls; the tool was "
                               "not recorded, so it must not run")
        key = field(data, "idempotencyKey", str, optional=True)
        if call_id:
            await self._as_approved(caller, seq, tool, call_id, digest)
        turn = self._carried_turn(caller, data) if data.get("turn") is not None else None
        more = Usage(result_bytes=sum(len(json.dumps(c.result, separators=(",", ":")))
                                      for c in closes if c.result is not None))
        if turn is not None:
            # The open is fenced by its own statement, the turn's append is not: the
            # attempt must be live before the turn goes into its session, as for an append.
            await store.ensure_live(self.engine, caller.run_uid, caller.attempt)
            appended = Usage(events=1, event_bytes=turn[2])
            await self.quotas.take(caller, more + appended)
            # The turn first, in its own commit, as if appended alone just before: a call
            # is never on the ledger before the model's turn that made it is in the
            # session. Should the open then fail, the turn stays, as it would have.
            try:
                await self._append(caller, turn[0], turn[1])
            except BaseException:
                self.quotas.give_back(caller, more + appended)
                raise
        else:
            await self.quotas.take(caller, more)
        try:
            closed = await store.open_call(self.engine, caller.run_uid, caller.attempt, seq,
                                           tool, call_id, digest, effect, key, closes)
        except IntegrityError as e:
            # The same call sent again (its first answer was lost) is the same row;
            # anything else under this seq is a rewrite, which the ledger never allows.
            if not await self._same_call(caller, seq, tool, call_id, digest):
                self.quotas.give_back(caller, more)
                raise Refused(409, f"call {seq} of attempt {caller.attempt} is already on "
                                   "the ledger as another call; ledger rows are never "
                                   "rewritten") from e
            # Its closes went back with the insert: they land on their own.
            closed = [c.seq for c in closes if await store.close_call(
                self.engine, caller.run_uid, caller.attempt, c.seq, c.outcome, c.result)]
        except BaseException:
            self.quotas.give_back(caller, more)
            raise
        return {"closed": closed}

    async def _as_approved(self, caller: AttemptIdentity, seq: int, tool: str, call_id: str,
                           digest: str) -> None:
        """An approval approves exactly the arguments it names (their digest): the call
        opened under an approved call's id must have them, or it is refused and the run
        ends ApprovalMismatch. Checked here, where the call opens, not by the runner."""
        approved = next((a for a in await store.approvals_of(self.engine, caller.run_uid)
                         if a.call_id == call_id and a.decision == ApprovalDecision.APPROVE),
                        None)
        if approved is not None and approved.args_digest != digest:
            raise Refused(409, f"call {seq} ({tool}) of attempt {caller.attempt} of run "
                               f"{caller.run_name} opens with arguments {digest}, but "
                               f"{approved.approver} approved call {call_id} with arguments "
                               f"{approved.args_digest}: an approval approves exactly the "
                               "arguments it names, so the tool was not run",
                          reason=Reason.APPROVAL_MISMATCH)

    async def _call(self, caller: AttemptIdentity, seq: int) -> store.LedgerEntry | None:
        rows = await store.ledger(self.engine, caller.run_uid)
        return next((r for r in rows if r.attempt == caller.attempt and r.seq == seq), None)

    async def _same_call(self, caller: AttemptIdentity, seq: int, tool: str, call_id: str | None,
                         digest: str) -> bool:
        row = await self._call(caller, seq)
        return row is not None and (row.tool, row.call_id, row.args_digest) == (
            tool, call_id, digest)

    async def close_call(self, request: web.Request, caller: AttemptIdentity) -> None:
        data = await body_of(request)
        outcome = field(data, "outcome", str)
        allowed = (LedgerOutcome.OK, LedgerOutcome.ERROR, LedgerOutcome.JOURNAL,
                   LedgerOutcome.DENIED)
        if outcome not in allowed:
            raise Refused(400, f"outcome must be one of {', '.join(allowed)}")
        try:
            seq = int(request.match_info["seq"])
        except ValueError as e:
            raise Refused(400, "the call's seq must be a number") from e
        if outcome == LedgerOutcome.JOURNAL:
            resuming = caller.resumes_attempt is not None
            refused = refusal_of_journal_close(
                resuming, await self._call(caller, seq) if resuming else None,
                await self._journal_entries(caller) if resuming else [])
            if refused is not None:
                raise Refused(409, refused)
        if outcome == LedgerOutcome.DENIED:
            # Left out of toolsExecuted: only a call its approver denied closes so.
            call = await self._call(caller, seq)
            denied = {a.call_id for a in await store.approvals_of(self.engine, caller.run_uid)
                      if a.decision == ApprovalDecision.DENY}
            if call is None or call.call_id not in denied:
                raise Refused(409, f"call {seq} of attempt {caller.attempt} was not denied by "
                                   "an approver: it closes ok or error")
        result = data.get("result")
        size = len(json.dumps(result, separators=(",", ":"))) if result is not None else 0
        if size > limits.RESULT_BYTES:
            raise Refused(413, f"a tool result is journalled up to "
                               f"{limits.shown(limits.RESULT_BYTES)}; this one is "
                               f"{limits.shown(size)}")
        more = Usage(result_bytes=size)
        await self.quotas.take(caller, more)
        try:
            closed = await store.close_call(self.engine, caller.run_uid, caller.attempt, seq,
                                            outcome, result)
        except BaseException:
            self.quotas.give_back(caller, more)
            raise
        if not closed:
            self.quotas.give_back(caller, more)
            raise Refused(409, f"call {seq} of attempt {caller.attempt} of run "
                               f"{caller.run_name} is not an open call of this attempt; "
                               "a finished call is never rewritten")

    async def ledger(self, _: web.Request, caller: AttemptIdentity) -> dict[str, Any]:
        rows = await store.ledger(self.engine, caller.run_uid)
        return {"calls": [{"seq": r.seq, "tool": r.tool, "callId": r.call_id,
                           "finished": r.finished_at is not None, "outcome": r.outcome}
                          for r in rows if r.attempt == caller.attempt]}

    # -- memory and the sample outbox --------------------------------------------------

    async def add_memory(self, request: web.Request, caller: AttemptIdentity) -> None:
        data = await body_of(request)
        entries = memory_entries(_events(field(data, "events", list)))
        more = Usage(memory_entries=len(entries),
                     memory_bytes=sum(len(text.encode()) for _, text in entries))
        await self.quotas.take(caller, more)
        try:
            await self.memory.add_entries(caller.app_name, caller.user_id,
                                          caller.session_id, entries)
        except BaseException:
            self.quotas.give_back(caller, more)
            raise

    async def search_memory(self, request: web.Request, caller: AttemptIdentity) -> dict[str, Any]:
        data = await body_of(request)
        query = field(data, "query", str)
        size = len(query.encode())
        if size > limits.QUERY_BYTES:
            raise Refused(413, f"a memory query may be {limits.shown(limits.QUERY_BYTES)} at "
                               f"most; this one is {limits.shown(size)}")
        words = len(keywords(query))
        if words > limits.QUERY_WORDS:
            raise Refused(413, f"a memory query may search for {limits.QUERY_WORDS} words at "
                               f"most (stop words aside); this one has {words:,}")
        found = await self.memory.search_memory(
            app_name=caller.app_name, user_id=caller.user_id, query=query)
        return json.loads(found.model_dump_json(exclude_none=True))

    # -- its outcome: model usage, the answer, calls that wait ----------------------------

    async def usage(self, request: web.Request, caller: AttemptIdentity) -> None:
        """One model call's usage, as the model reported it to the runner."""
        data = await body_of(request)
        model = field(data, "model", str)
        numbers = [field(data, name, int) for name in ("inputTokens", "outputTokens")]
        cost = field(data, "costMicroUSD", int, optional=True)
        if not 0 < len(model) <= 256 or min([*numbers, cost or 0]) < 0:
            raise Refused(400, "a usage report names its model (at most 256 characters) "
                               "and counts of 0 or more")
        try:
            calls = await store.add_usage(self.engine, caller.run_uid, caller.attempt, model,
                                          numbers[0], numbers[1], cost,
                                          max_models=limits.MODEL_NAMES_PER_RUN)
        except store.TooManyModels as e:
            raise OverQuota(f"run {caller.run_name} reported the usage of {e.models} model "
                            f"names: one run may report at most {limits.MODEL_NAMES_PER_RUN}; "
                            "this report was not stored") from None
        if calls > limits.MODEL_CALLS_PER_ATTEMPT:
            raise Refused(429, f"attempt {caller.attempt} of run {caller.run_name} reported "
                               f"{calls:,} model calls: one attempt may report at most "
                               f"{limits.MODEL_CALLS_PER_ATTEMPT:,}")
        label = metrics.model_label(model)
        who = (caller.namespace, metrics.agent_label(caller.namespace, caller.agent), label)
        metrics.MODEL_CALLS.labels(*who).inc()
        metrics.MODEL_TOKENS.labels(*who, "input").inc(numbers[0])
        metrics.MODEL_TOKENS.labels(*who, "output").inc(numbers[1])
        if cost is not None:
            metrics.MODEL_COST.labels(*who).inc(cost)

    async def result(self, request: web.Request, caller: AttemptIdentity) -> dict[str, Any]:
        """The agent's final answer, whole (the first report of the attempt counts)."""
        data = await body_of(request)
        text = field(data, "text", str)
        parsed = data.get("json")
        for what, size in (("answer", len(text.encode())), ("answer's object", len(
                json.dumps(parsed, separators=(",", ":"))) if parsed is not None else 0)):
            if size > limits.ANSWER_BYTES:
                raise Refused(413, f"an {what} is kept up to "
                                   f"{limits.shown(limits.ANSWER_BYTES)}; this one is "
                                   f"{limits.shown(size)}")
        return {"recorded": await store.record_result(self.engine, caller.run_uid,
                                                      caller.attempt, text, parsed)}

    async def request_approval(self, request: web.Request,
                               caller: AttemptIdentity) -> dict[str, Any]:
        """A call that waits for a human's decision: written down, never started. Its
        digest must be that of its arguments (what an approval approves)."""
        data = await body_of(request)
        seq, tool = field(data, "seq", int), field(data, "tool", str)
        call_id, args = field(data, "callId", str), field(data, "args", dict)
        digest = field(data, "argsDigest", str)
        if digest != effects.args_digest(args):
            raise Refused(400, f"argsDigest {digest} is not the digest of the call's "
                               f"arguments ({effects.args_digest(args)})")
        timeout = field(data, "timeoutSeconds", int)
        if not 1 <= timeout <= limits.APPROVAL_SECONDS:
            raise Refused(400, f"timeoutSeconds must be between 1 and "
                               f"{limits.APPROVAL_SECONDS:,}")
        try:
            waiting = await store.request_approval(
                self.engine, caller.run_uid, caller.attempt, seq, call_id, tool,
                json.dumps(args, sort_keys=True, separators=(",", ":"), default=repr), digest,
                datetime.now(UTC) + timedelta(seconds=timeout),
                max_pending=limits.PENDING_APPROVALS_PER_ATTEMPT)
        except store.TooManyPending as e:
            raise OverQuota(f"attempt {caller.attempt} of run {caller.run_name} has {e.pending} "
                            "calls waiting for a decision: one attempt may have at most "
                            f"{limits.PENDING_APPROVALS_PER_ATTEMPT}; this call was not "
                            "written down") from None
        if (waiting.attempt, waiting.seq, waiting.tool, waiting.args_digest) != (
                caller.attempt, seq, tool, digest):
            raise Refused(409, f"call {call_id} of run {caller.run_name} waited already, as "
                               f"call {waiting.seq} ({waiting.tool}) of attempt "
                               f"{waiting.attempt}")
        return {"expiresAt": waiting.expires_at.isoformat()}

    async def record_side_effect(self, request: web.Request,
                                 caller: AttemptIdentity) -> dict[str, Any]:
        data = await body_of(request)
        tool, args = field(data, "tool", str), field(data, "args", dict)
        more = Usage(outbox_rows=1)
        await self.quotas.take(caller, more)
        try:
            made = await store.record_side_effect(
                self.engine, tool, args, run_name=caller.run_name, run_uid=caller.run_uid,
                attempt=caller.attempt,
                idempotency_key=field(data, "idempotencyKey", str, optional=True))
        except BaseException:
            self.quotas.give_back(caller, more)
            raise
        if not made:  # the same key again: no new row
            self.quotas.give_back(caller, more)
        return {"recorded": made}
