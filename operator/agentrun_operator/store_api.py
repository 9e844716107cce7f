"""The store API: the run store as runner pods may see it, and nothing more.

Runner pods hold no database credential. Each presents a projected ServiceAccount token
with the store's own audience (vocabulary.STORE_AUDIENCE); the API verifies it with a
TokenReview, follows the pod it is bound to (its labels and its controller, an AgentRun)
to one attempt of one run, and checks in the store that this attempt is the pod's and is
still live. Everything a request may touch is derived from that attempt; nothing in a
request names another run, session, namespace or ledger row:

- its input snapshot (read);
- its own ADK session (create, read, append events; never delete);
- its ledger (append a call before the tool runs, close its own open calls; never
  delete or rewrite a row);
- long-term memory of its (namespace, agent, user);
- the sample agents' outbox (the "world" of the sample tools), stamped with the run;
- its outcome.

A token of a settled attempt, of a deleted pod, of another audience, or of a pod that is
not an agentrun runner is refused with a message that says why. The database pool lives
here, capped (every runner was once a client of its own; now none is).

It runs inside the operator process (the development cluster: `--store-api-listen`), or
on its own as `agentrun-store-api` (the chart: its own Deployment, scaled horizontally).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import hashlib
import json
import logging
import os
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

from agentrun import effects, store
from agentrun.store.memory import StoreMemoryService
from agentrun.vocabulary import (
    DEFAULT_MEMORY_TTL_DAYS,
    ENV_MEMORY_TTL_DAYS,
    LABEL_ATTEMPT,
    LABEL_RUN,
    RUN_KIND,
    STORE_AUDIENCE,
    TOKEN_EXTRA_POD_NAME,
    TOKEN_EXTRA_POD_UID,
    LedgerOutcome,
    RunStatus,
)
from agentrun_operator import logs, metrics

log = logging.getLogger("agentrun.store_api")

# The store API's own pool: every request of every runner goes through it, so it is the
# one place where the number of database connections is decided.
POOL_SIZE = 5
POOL_OVERFLOW = 0
# A verified token is trusted for this long before TokenReview is asked again; the
# attempt's liveness is checked in the store on every request regardless.
TOKEN_CACHE_SECONDS = 30.0
MAX_BODY = 16 * 1024 * 1024


class Refused(Exception):
    """A request the store API will not serve: an HTTP status and one sentence."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class Caller:
    """The one attempt a request speaks for, as the store and the API server know it."""

    namespace: str
    pod: str
    run_name: str
    run_uid: str
    attempt: int
    agent: str
    user_id: str
    session_id: str
    app_name: str  # the namespaced ADK app name (store.session_app)
    input_digest: str | None
    resumes_attempt: int | None = None
    resumes_run_uid: str | None = None


@dataclass(frozen=True)
class BoundPod:
    namespace: str
    name: str
    uid: str


class TokenReviewer:
    """Who a token is: TokenReview with our audience, bound to a pod. Cached briefly."""

    def __init__(self, api: client.ApiClient, audience: str) -> None:
        # Untyped: the calls below take plain dicts and return raw responses.
        self._auth: Any = client.AuthenticationV1Api(api)
        self._audience = audience
        self._cache: dict[str, tuple[float, BoundPod]] = {}

    async def pod_of(self, token: str) -> BoundPod:
        key = hashlib.sha256(token.encode()).hexdigest()
        hit = self._cache.get(key)
        if hit is not None and hit[0] > time.monotonic():
            return hit[1]
        review = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                  "spec": {"token": token, "audiences": [self._audience]}}
        try:
            done = await asyncio.to_thread(
                self._auth.create_token_review, review, _preload_content=False)
        except ApiException as e:
            raise Refused(503, f"the store API could not verify the token with the "
                               f"Kubernetes API server ({e.status} {e.reason}); retry") from e
        status = json.loads(done.data).get("status") or {}
        if not status.get("authenticated"):
            raise Refused(401, "the token is not valid for the store API (audience "
                               f"{self._audience}): {status.get('error') or 'not authenticated'}"
                               "; runner pods present their projected store token")
        user = status.get("user") or {}
        extra = user.get("extra") or {}
        names, uids = extra.get(TOKEN_EXTRA_POD_NAME) or [], extra.get(TOKEN_EXTRA_POD_UID) or []
        username = str(user.get("username") or "")
        parts = username.split(":")
        if not names or not uids or len(parts) != 4 or parts[:2] != ["system", "serviceaccount"]:
            raise Refused(403, f"{username or 'the caller'} presented a token that is not "
                               "bound to a pod; the store API serves runner pods only")
        bound = BoundPod(namespace=parts[2], name=str(names[0]), uid=str(uids[0]))
        self._cache[key] = (time.monotonic() + TOKEN_CACHE_SECONDS, bound)
        if len(self._cache) > 10_000:
            now = time.monotonic()
            self._cache = {k: v for k, v in self._cache.items() if v[0] > now}
        return bound


class Authority:
    """From a request's token to the one live attempt it speaks for, or a refusal."""

    def __init__(self, api: client.ApiClient, engine: AsyncEngine, audience: str,
                 namespaces: tuple[str, ...] = ()) -> None:
        self._tokens = TokenReviewer(api, audience)
        self._core: Any = client.CoreV1Api(api)
        self._engine = engine
        self._namespaces = namespaces
        # The pod's labels and controller, by pod uid (a pod's owner never changes).
        self._pods: dict[str, tuple[float, str, int, str]] = {}

    async def caller(self, request: web.Request) -> Caller:
        header = request.headers.get("Authorization", "")
        if not header.startswith("Bearer ") or not header[7:].strip():
            raise Refused(401, "no token: runner pods send their projected store token as "
                               "'Authorization: Bearer <token>'")
        bound = await self._tokens.pod_of(header[7:].strip())
        if self._namespaces and bound.namespace not in self._namespaces:
            raise Refused(403, f"namespace {bound.namespace} is not served by this store API")
        run_name, attempt, run_uid = await self._runner_of(bound)
        found = await store.attempt_identity(self._engine, run_uid, attempt)
        if found is None or found.namespace != bound.namespace or found.run_name != run_name:
            raise Refused(403, f"pod {bound.namespace}/{bound.name} names attempt {attempt} "
                               f"of run {run_name}, which the run store has no record of")
        if found.pod_name != bound.name:
            raise Refused(403, f"pod {bound.namespace}/{bound.name} is not the pod of attempt "
                               f"{attempt} of run {run_name} ({found.pod_name})")
        if found.status not in RunStatus.LIVE:
            raise Refused(403, f"attempt {attempt} of run {run_name} is settled "
                               f"({found.status}): its token is no longer accepted")
        return Caller(namespace=found.namespace, pod=bound.name, run_name=run_name,
                      run_uid=run_uid, attempt=attempt, agent=found.agent,
                      user_id=found.user_id, session_id=found.session_id or "",
                      app_name=found.app_name or store.session_app(found.namespace, found.agent),
                      input_digest=found.input_digest, resumes_attempt=found.resumes_attempt,
                      resumes_run_uid=found.resumes_run_uid)

    async def _runner_of(self, bound: BoundPod) -> tuple[str, int, str]:
        hit = self._pods.get(bound.uid)
        if hit is not None and hit[0] > time.monotonic():
            return hit[1], hit[2], hit[3]
        try:
            response = await asyncio.to_thread(
                self._core.read_namespaced_pod, bound.name, bound.namespace,
                _preload_content=False)
        except ApiException as e:
            if e.status == 404:
                raise Refused(403, f"pod {bound.namespace}/{bound.name} no longer exists") from e
            raise Refused(503, f"the store API could not read pod {bound.namespace}/"
                               f"{bound.name} ({e.status} {e.reason}); retry") from e
        pod = json.loads(response.data)
        meta = pod.get("metadata") or {}
        if meta.get("uid") != bound.uid:
            raise Refused(403, f"pod {bound.namespace}/{bound.name} was replaced; the token "
                               "belongs to its predecessor")
        labels = meta.get("labels") or {}
        owner = next((o for o in meta.get("ownerReferences") or []
                      if o.get("controller") and o.get("kind") == RUN_KIND), None)
        raw_attempt = str(labels.get(LABEL_ATTEMPT) or "")
        if owner is None or not labels.get(LABEL_RUN) or not raw_attempt.isdigit() \
                or owner.get("name") != labels[LABEL_RUN]:
            raise Refused(403, f"pod {bound.namespace}/{bound.name} is not an agentrun runner "
                               "pod (no AgentRun controls it)")
        found = (str(labels[LABEL_RUN]), int(raw_attempt), str(owner["uid"]))
        self._pods[bound.uid] = (time.monotonic() + TOKEN_CACHE_SECONDS, *found)
        if len(self._pods) > 10_000:
            now = time.monotonic()
            self._pods = {k: v for k, v in self._pods.items() if v[0] > now}
        return found


# -- the routes ------------------------------------------------------------------------------

Handler = Callable[[web.Request, Caller], Awaitable[Any]]


@dataclass
class Readiness:
    """Whether the store is at the schema this code knows; why not, if not."""

    ready: bool = True
    why: str = ""

    async def wait_for_schema(self, engine: AsyncEngine, interval: float = 2.0) -> None:
        """Not ready until the operator has migrated the store (it alone migrates)."""
        self.ready = False
        while True:
            try:
                await store.check_schema(engine)
                self.ready, self.why = True, ""
                log.info("event=store-ready")
                return
            except Exception as e:
                self.why = f"the run store is not ready: {e}"
                log.warning("event=store-not-ready error=%r", e)
            await asyncio.sleep(interval)


def _route(authority: Authority, readiness: Readiness, handler: Handler,
           ledger: str = "") -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """`handler` behind authentication and the store's readiness; `ledger`: the ledger
    write it is (its handling time is measured)."""
    async def serve(request: web.Request) -> web.StreamResponse:
        started = time.perf_counter()
        caller: Caller | None = None
        try:
            if not readiness.ready:
                raise Refused(503, readiness.why or "the run store is not ready")
            caller = await authority.caller(request)
            result = await handler(request, caller)
            response: web.StreamResponse = web.json_response(
                {} if result is None else result, dumps=_dumps)
        except Refused as e:
            response = web.json_response({"error": e.message}, status=e.status)
            log.info("event=refused path=%s status=%s run=%s message=%r", request.path,
                     e.status, caller.run_name if caller else "-", e.message)
        except json.JSONDecodeError as e:
            response = web.json_response({"error": f"the body is not JSON: {e}"}, status=400)
        except Exception as e:  # the store may be down: say so, the runner decides
            log.exception("event=store-api-failed path=%s", request.path)
            metrics.STORE_ERRORS.labels(handler.__name__).inc()
            response = web.json_response(
                {"error": f"the run store could not serve {request.path}: "
                          f"{type(e).__name__}: {e}"}, status=503)
        elapsed = time.perf_counter() - started
        if ledger:
            metrics.LEDGER_WRITE_DURATION.labels(ledger, str(response.status)).observe(elapsed)
        response.headers["Server-Timing"] = f"store;dur={elapsed * 1000:.2f}"
        return response

    return serve


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), default=str)


async def _body(request: web.Request) -> dict[str, Any]:
    data = await request.json(loads=json.loads) if request.can_read_body else {}
    if not isinstance(data, dict):
        raise Refused(400, "the body must be a JSON object")
    return data


def _field(data: Mapping[str, Any], name: str, kind: type, *, optional: bool = False) -> Any:
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
        data = await _body(request)
        try:
            await store.record_invocation(self.engine, caller.run_uid, caller.attempt,
                                          _field(data, "invocationId", str))
        except store.InvocationRecorded as e:
            raise Refused(409, str(e)) from e

    async def outcome(self, request: web.Request, caller: Caller) -> dict[str, Any]:
        data = await _body(request)
        status = _field(data, "status", str)
        if status not in (RunStatus.SUCCEEDED, RunStatus.FAILED):
            raise Refused(400, f"status must be {RunStatus.SUCCEEDED} or {RunStatus.FAILED}")
        counted = await store.record_outcome(
            self.engine, caller.run_uid, caller.attempt, status,
            _field(data, "reason", str, optional=True),
            _field(data, "message", str, optional=True))
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

        data = await _body(request)
        session_id = _field(data, "sessionId", str, optional=True) or caller.session_id
        self._own_session(caller, session_id)
        try:
            session = await self.sessions.create_session(
                app_name=caller.app_name, user_id=caller.user_id, session_id=session_id,
                state=_field(data, "state", dict, optional=True))
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
        data = await _body(request)
        seq, tool = _field(data, "seq", int), _field(data, "tool", str)
        call_id = _field(data, "callId", str, optional=True)
        digest = _field(data, "argsDigest", str)
        effect = _field(data, "effect", str, optional=True)
        if effect is not None and effect not in effects.ALL:
            raise Refused(400, f"effect must be one of {', '.join(effects.ALL)}")
        try:
            await store.open_call(self.engine, caller.run_uid, caller.attempt, seq, tool,
                                  call_id, digest, effect,
                                  _field(data, "idempotencyKey", str, optional=True))
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
        data = await _body(request)
        outcome = _field(data, "outcome", str)
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

        data = await _body(request)
        events = [Event.model_validate_json(json.dumps(e)) for e in _field(data, "events", list)]
        await self.memory.add_events_to_memory(
            app_name=caller.app_name, user_id=caller.user_id, events=events,
            session_id=caller.session_id)

    async def search_memory(self, request: web.Request, caller: Caller) -> dict[str, Any]:
        data = await _body(request)
        found = await self.memory.search_memory(
            app_name=caller.app_name, user_id=caller.user_id,
            query=_field(data, "query", str))
        return json.loads(found.model_dump_json(exclude_none=True))

    async def record_side_effect(self, request: web.Request, caller: Caller) -> dict[str, Any]:
        data = await _body(request)
        made = await store.record_side_effect(
            self.engine, _field(data, "tool", str), _field(data, "args", dict),
            run_name=caller.run_name, run_uid=caller.run_uid, attempt=caller.attempt,
            idempotency_key=_field(data, "idempotencyKey", str, optional=True))
        return {"recorded": made}


def application(authority: Authority, routes: Routes,
                readiness: Readiness | None = None) -> web.Application:
    """The store API's routes (paths are the client's contract: runner store_client)."""
    app = web.Application(client_max_size=MAX_BODY)
    ready = readiness or Readiness()

    async def healthz(_: web.Request) -> web.Response:
        if not ready.ready:
            return web.json_response({"ok": False, "error": ready.why}, status=503)
        return web.json_response({"ok": True})

    def on(handler: Handler, ledger: str = "") -> Callable[
            [web.Request], Awaitable[web.StreamResponse]]:
        return _route(authority, ready, handler, ledger)

    async def livez(_: web.Request) -> web.Response:
        # Alive is not ready: a store API waiting for its schema (or its database) is
        # healthy, and restarting it would not bring the schema sooner.
        return web.json_response({"ok": True})

    app.router.add_get("/healthz", healthz)
    app.router.add_get("/livez", livez)
    app.router.add_get("/v1/attempt", on(routes.whoami))
    app.router.add_post("/v1/attempt/begin", on(routes.begin))
    app.router.add_post("/v1/attempt/invocation", on(routes.invocation))
    app.router.add_post("/v1/attempt/outcome", on(routes.outcome))
    app.router.add_get("/v1/input", on(routes.input))
    app.router.add_post("/v1/sessions", on(routes.create_session))
    app.router.add_get("/v1/sessions", on(routes.list_sessions))
    app.router.add_get("/v1/sessions/{session}", on(routes.get_session))
    app.router.add_delete("/v1/sessions/{session}", on(routes.delete_session))
    app.router.add_post("/v1/sessions/{session}/events", on(routes.append_event))
    app.router.add_get("/v1/ledger", on(routes.ledger))
    app.router.add_get("/v1/journal", on(routes.journal))
    app.router.add_post("/v1/ledger", on(routes.open_call, "open"))
    app.router.add_post("/v1/ledger/{seq}/close", on(routes.close_call, "close"))
    app.router.add_post("/v1/memory/events", on(routes.add_memory))
    app.router.add_post("/v1/memory/search", on(routes.search_memory))
    app.router.add_post("/v1/outbox", on(routes.record_side_effect))
    return app


@dataclass
class Served:
    """A running store API: where it listens, and how to stop it."""

    runner: web.AppRunner
    url: str
    waiting: asyncio.Task[None] | None = None

    async def stop(self) -> None:
        if self.waiting is not None:
            self.waiting.cancel()
        await self.runner.cleanup()


def split_listen(listen: str) -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"--listen must be HOST:PORT, not {listen!r}")
    return host.strip("[]"), int(port)


async def serve(listen: str, engine: AsyncEngine, api: client.ApiClient, *,
                audience: str = STORE_AUDIENCE, namespaces: tuple[str, ...] = (),
                check_schema: bool = False) -> Served:
    """Starts the store API on `listen` (HOST:PORT; port 0 picks a free one). With
    `check_schema`, it answers 503 until the store is at the schema this code knows."""
    host, port = split_listen(listen)
    readiness = Readiness()
    waiting = None
    if check_schema:
        readiness.ready, readiness.why = False, "the run store has not been checked yet"
        waiting = asyncio.create_task(readiness.wait_for_schema(engine))
    app = application(Authority(api, engine, audience, namespaces), Routes(engine), readiness)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    server = site._server
    sockets = getattr(server, "sockets", None) or []
    bound = sockets[0].getsockname()[1] if sockets else port
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{bound}"
    log.info("event=store-api-listening url=%s audience=%s", url, audience)
    return Served(runner, url, waiting)


# -- `agentrun-store-api`: the store API on its own -----------------------------------------


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="agentrun-store-api",
        description="Serves the run store to runner pods, authenticated by their projected "
                    "ServiceAccount tokens.")
    p.add_argument("--listen", default=os.environ.get("AGENTRUN_STORE_API_LISTEN",
                                                      "0.0.0.0:8080"))
    p.add_argument("--database-url", default=os.environ.get("DATABASE_URL", ""),
                   help="SQLAlchemy URL of the run store (env DATABASE_URL)")
    p.add_argument("--audience", default=os.environ.get("AGENTRUN_STORE_AUDIENCE",
                                                        STORE_AUDIENCE))
    p.add_argument("--namespace", action="append", dest="namespaces",
                   default=[n for n in os.environ.get("AGENTRUN_NAMESPACES", "").split(",")
                            if n],
                   help="serve runner pods of this namespace only (repeatable; default all)")
    p.add_argument("--metrics-port", type=int,
                   default=int(os.environ.get("AGENTRUN_METRICS_PORT", "0")))
    p.add_argument("--log-format", choices=logs.FORMATS,
                   default=os.environ.get("AGENTRUN_LOG_FORMAT", "text"),
                   help="text (key=value) or json (one object per line)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    logs.configure(args.log_format)
    if not store.is_durable(args.database_url):
        print("agentrun-store-api: set --database-url (or DATABASE_URL) to the run store",
              file=sys.stderr)
        return 2
    from kubernetes import config as kube_config

    try:
        kube_config.load_incluster_config()
    except kube_config.ConfigException:
        kube_config.load_kube_config()
    metrics.serve(args.metrics_port)

    async def run() -> None:
        engine = store.make_engine(args.database_url, pool_size=POOL_SIZE,
                                   max_overflow=POOL_OVERFLOW)
        # The operator migrates; the store API serves only a store at the schema it knows.
        served = await serve(args.listen, engine, client.ApiClient(), audience=args.audience,
                             namespaces=tuple(args.namespaces), check_schema=True)
        try:
            await asyncio.Event().wait()
        finally:
            await served.stop()
            await engine.dispose()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
