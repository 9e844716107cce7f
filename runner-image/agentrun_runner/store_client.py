"""The runner's side of the store API: the run store, reached without a database credential.

Every request carries the pod's projected ServiceAccount token (re-read from its file each
time: the kubelet refreshes it in place). The store API decides from that token which
attempt of which run this is; nothing here names a run. On top of the plain calls sit the
two ADK services the runner needs: a session service (`StoreSessionService`) and a memory
service (`StoreMemoryService`).
"""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from google.adk.events.event import Event
from google.adk.memory.base_memory_service import BaseMemoryService, SearchMemoryResponse
from google.adk.sessions.base_session_service import (
    BaseSessionService,
    GetSessionConfig,
    ListSessionsResponse,
)
from google.adk.sessions.session import Session

from agentrun.attempt import AttemptStart
from agentrun.vocabulary import RunnerEnv
from agentrun_runner import logs
from agentrun_runner.stops import AttemptStop

# A store API that restarts is back within seconds; a request that never left (connection
# refused) is sent again, for about 8 s in all (then the run fails saying so: a store API
# that is not there at all should show on the run soon, not after minutes). A request
# that may have arrived is never repeated blindly: the ledger decides what a repeated call
# means (store API open_call). Only one that means the same however often it arrives (a
# read, a delete, the attempt's begin: an upsert) is sent again when the store API went
# away before it answered (its process ended mid-request).
CONNECT_RETRIES = 5
CONNECT_BACKOFF_SECONDS = 0.25
CONNECT_BACKOFF_MAX_SECONDS = 4.0
TIMEOUT_SECONDS = 30.0
# A store API that says 503 with Retry-After did nothing of the request: the store is not
# at its schema yet (the operator migrates it as it starts, beside it). Any request is sent
# again after the time it asks for, for at most this long in all; then the run fails
# saying what the store API said.
NOT_READY_SECONDS = 60.0
NOT_READY_WAIT_MAX_SECONDS = 5.0
# The model's turn that calls tools rides on the first open of its calls, one request where
# there were two, when it is at most this large (the store API takes 64 KiB, measured its
# own way); a larger one is appended alone.
CARRIED_TURN_BYTES = 48 * 1024


class StoreRefused(RuntimeError):
    """The store API answered, and said no (or failed): its status and its sentence."""

    def __init__(self, status: int, message: str, reason: str | None = None) -> None:
        super().__init__(f"the store API refused ({status}): {message}")
        self.status = status
        self.message = message
        # The run's failure reason when the refusal names one (ApprovalMismatch).
        self.reason = reason


def _retry_after(value: str | None) -> float | None:
    """Retry-After in seconds (the store API sends a number), at most
    NOT_READY_WAIT_MAX_SECONDS; None when absent or not a number."""
    try:
        seconds = float(value) if value is not None else None
    except ValueError:
        return None
    return None if seconds is None or seconds < 0 else min(seconds, NOT_READY_WAIT_MAX_SECONDS)


class StoreUnreachable(RuntimeError):
    """The store API could not be reached at all."""


@dataclass(frozen=True)
class Snapshot:
    digest: str
    text: str
    files: dict[str, bytes] = field(default_factory=dict)


def verifying(ca: str | None) -> ssl.SSLContext:
    """How the store API's certificate is checked: against `ca` (PEM, from the operator)
    when given, else the image's trusted roots; its name always."""
    if ca:
        try:
            return ssl.create_default_context(cadata=ca)
        except (ssl.SSLError, ValueError) as e:
            raise StoreUnreachable(f"the store API's CA ({RunnerEnv.STORE_CA}) is not a PEM "
                                   f"certificate: {e}") from e
    return ssl.create_default_context()


class StoreClient:
    """HTTPS calls to the store API, one method per route.

    Over aiohttp: each tool call is two requests on the runner's critical path (the
    ledger), and aiohttp's client takes about a third of httpx's time per request here
    (bench/ledger.py), sending a request's headers and body in one write."""

    def __init__(self, url: str, token_file: Path | str, ca: str | None = None) -> None:
        self.url = url.rstrip("/")
        if not self.url.startswith("https://"):
            # The token and the session would travel in the clear.
            raise StoreUnreachable(f"the store API must be reached over https, not {self.url}")
        self.token_file = Path(token_file)
        # How the store API's certificate is checked: the CA the operator gives the pod.
        self._ssl = verifying(ca)
        self._session: aiohttp.ClientSession | None = None
        # Model turns that call tools, held for the first open to carry (hold_turn), and
        # the lock they land under: nothing sent after a turn reaches the store before it.
        self._turns: list[tuple[str, bytes]] = []
        self._landing = asyncio.Lock()
        # Why a held turn may not have landed: no call after it may be opened. And why one
        # surely did not (the store refused it alone): no later event may be appended.
        self._turn_lost: BaseException | None = None
        self._turn_refused: StoreRefused | None = None

    def _http(self) -> aiohttp.ClientSession:
        # Made on first use: an aiohttp session belongs to the loop it was made in.
        # trust_env off: the run's environment chooses neither a proxy for the store API
        # (spec.env may set HTTPS_PROXY and the like for the model's traffic, and a proxy
        # of the run's creator would be handed the store token with every request) nor the
        # certificates it is checked against.
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=TIMEOUT_SECONDS), trust_env=False,
                connector=aiohttp.TCPConnector(ssl=self._ssl))
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    def _answered(self, status: int, headers: Mapping[str, str]) -> None:
        """Each answer, as it comes (a benchmark reads the store API's Server-Timing)."""

    def _token(self) -> str:
        try:
            return self.token_file.read_text().strip()
        except OSError as e:
            raise StoreUnreachable(
                f"the store token {self.token_file} cannot be read ({e.strerror}): runner "
                "pods get it as a projected ServiceAccount token volume") from e

    async def request(self, method: str, path: str, body: Any = None, *,
                      raw: bytes | None = None, params: Mapping[str, Any] | None = None,
                      missing_ok: bool = False, repeatable: bool = False) -> Any:
        await self._land()
        return await self._send(method, path, body, raw=raw, params=params,
                                missing_ok=missing_ok, repeatable=repeatable)

    # -- held turns --------------------------------------------------------------------------

    def hold_turn(self, session_id: str, raw: bytes) -> None:
        """Holds the model's turn `raw` (an event of session `session_id` that calls tools)
        for the open of its first call to carry (open_call): the open is the next request
        of a runner whose ledger records every call. It lands before anything sent after it
        all the same: carried, or appended alone before any other request goes."""
        self._turns.append((session_id, raw))

    async def _land(self) -> None:
        """Every turn held before now lands (or is lost) before what follows is sent."""
        if self._turns or self._landing.locked():
            async with self._landing:
                await self._turns_alone()

    async def _turns_alone(self) -> None:
        """Appends every held turn alone, in order (under `_landing`). A turn that does not
        land fails no request but the ones that would build on it: the opens of its calls
        (`_no_turn_lost`) and, when the store refused it, the session's later events; the
        attempt's own reports (its outcome, usage) still go."""
        while self._turns:
            session_id, raw = self._turns[0]
            try:
                await self._send("POST", f"/v1/sessions/{session_id}/events", raw=raw)
            except BaseException as e:
                self._turns.clear()
                self._turn_lost = e
                if not isinstance(e, Exception):  # cancelled: nothing after it is opened
                    raise
                if isinstance(e, StoreRefused) and 400 <= e.status < 500:
                    self._turn_refused = e
                logs.warning("session.turn_lost", session=session_id,
                             error=f"{type(e).__name__}: {e}")
                return
            self._turns.pop(0)

    async def append_event(self, session_id: str, raw: bytes) -> None:
        """Appends an event alone, after every turn held before it; refused after a turn
        the store refused, which the event would follow in the stored session. (A turn
        whose fate is unknown, its request failed on the way or in the store, may be there:
        what follows goes, as it did when every event was appended alone.)"""
        await self._land()
        if self._turn_refused is not None:
            raise StoreUnreachable(
                "a model's turn that calls tools was refused by the store, so no later "
                "event is stored either (the session would lack the turn it follows): "
                f"{type(self._turn_refused).__name__}: {self._turn_refused}")
        await self._send("POST", f"/v1/sessions/{session_id}/events", raw=raw)

    async def _send(self, method: str, path: str, body: Any = None, *,
                    raw: bytes | None = None, params: Mapping[str, Any] | None = None,
                    missing_ok: bool = False, repeatable: bool = False) -> Any:
        """One request. `repeatable` (and every GET or DELETE): it may be sent again when
        the store API went away before answering, as it means the same twice. Any request
        is sent again after a 503 with Retry-After (the store API did none of it), for
        NOT_READY_SECONDS at most."""
        repeatable = repeatable or method in ("GET", "DELETE")
        headers = {"Authorization": f"Bearer {self._token()}"}
        content = raw if raw is not None else (
            None if body is None else json.dumps(body).encode())
        if content is not None:
            headers["Content-Type"] = "application/json"
        query = {k: str(v) for k, v in params.items()} if params else None
        clock = asyncio.get_running_loop().time
        deadline = clock() + NOT_READY_SECONDS
        while True:
            status, answer, retry_after = await self._send_once(
                method, path, content, headers, query, repeatable)
            wait = _retry_after(retry_after) if status == 503 else None
            if wait is None or clock() + wait > deadline:
                break
            logs.warning("store.not_ready", path=path, retry_after=wait)
            await asyncio.sleep(wait)
        if status == 404 and missing_ok:
            return None
        try:
            data = json.loads(answer) if answer else {}
        except ValueError:
            data = {"error": answer[:500].decode(errors="replace")}
        if not isinstance(data, dict):
            data = {"error": str(data)[:500]}
        if status >= 400:
            reason = data.get("reason")
            raise StoreRefused(status, str(data.get("error") or data),
                               reason if isinstance(reason, str) else None)
        return data

    async def _send_once(self, method: str, path: str, content: bytes | None,
                         headers: Mapping[str, str], query: Mapping[str, str] | None,
                         repeatable: bool) -> tuple[int, bytes, str | None]:
        """The request, sent again only when it never left (or when `repeatable` and the
        store API went away before answering); its status, body and Retry-After."""
        for attempt in range(CONNECT_RETRIES + 1):
            try:
                async with self._http().request(method, self.url + path, data=content,
                                                headers=headers, params=query) as response:
                    status, answer = response.status, await response.read()
                    self._answered(status, response.headers)
                    return status, answer, response.headers.get("Retry-After")
            except aiohttp.ClientConnectorError as e:  # it never left
                if attempt == CONNECT_RETRIES:
                    raise StoreUnreachable(
                        f"the store API at {self.url} cannot be reached: {e}") from e
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as e:
                if not repeatable or attempt == CONNECT_RETRIES:
                    raise StoreUnreachable(f"the store API at {self.url} failed: "
                                           f"{type(e).__name__}: {e}") from e
            except (aiohttp.ClientError, TimeoutError) as e:
                raise StoreUnreachable(f"the store API at {self.url} failed: "
                                       f"{type(e).__name__}: {e}") from e
            await asyncio.sleep(min(CONNECT_BACKOFF_MAX_SECONDS,
                                    CONNECT_BACKOFF_SECONDS * 2 ** attempt))
        raise AssertionError("unreachable: the last attempt returns or raises")

    # -- the attempt -----------------------------------------------------------------------

    async def begin(self) -> AttemptStart:
        """The runner's first call: records that it started, and who it is."""
        return AttemptStart.from_wire(
            await self.request("POST", "/v1/attempt/begin", {}, repeatable=True))

    async def record_invocation(self, invocation_id: str) -> None:
        await self.request("POST", "/v1/attempt/invocation", {"invocationId": invocation_id})

    async def record_outcome(self, status: str, reason: str | None = None,
                             message: str | None = None) -> bool:
        data = await self.request("POST", "/v1/attempt/outcome",
                                  {"status": status, "reason": reason, "message": message})
        return bool(data.get("recorded"))

    async def report_usage(self, model: str, input_tokens: int, output_tokens: int,
                           cost_micro_usd: int | None) -> None:
        """One model call's usage, as the model reported it, and its cost (None: the
        model has no known price)."""
        await self.request("POST", "/v1/usage", {
            "model": model, "inputTokens": input_tokens, "outputTokens": output_tokens,
            "costMicroUSD": cost_micro_usd})

    async def request_approval(self, seq: int, tool: str, call_id: str,
                               args: Mapping[str, Any], digest: str,
                               timeout_seconds: int) -> None:
        """Writes down that this call waits for a decision (never started): not after
        the model's turn that calls it was lost, as no open is."""
        await self._land()
        self._no_turn_lost(tool)
        await self._send("POST", "/v1/approvals", {
            "seq": seq, "tool": tool, "callId": call_id, "args": dict(args),
            "argsDigest": digest, "timeoutSeconds": timeout_seconds})

    async def record_result(self, text: str, parsed: Any = None) -> None:
        """The agent's final answer, whole (and the parsed object of an output schema)."""
        await self.request("POST", "/v1/attempt/result", {"text": text, "json": parsed})

    async def input(self) -> Snapshot | None:
        data = await self.request("GET", "/v1/input", missing_ok=True)
        if data is None:
            return None
        return Snapshot(digest=data["digest"], text=data["text"],
                        files={n: base64.b64decode(c) for n, c in data["files"].items()})

    async def agent(self) -> dict[str, Any] | None:
        """The Agent snapshot this run pinned (agentrun.agents), or None."""
        data = await self.request("GET", "/v1/agent", missing_ok=True)
        return None if data is None else dict(data)

    # -- the ledger ------------------------------------------------------------------------

    async def open_call(self, seq: int, tool: str, call_id: str | None, digest: str,
                        effect: str | None = None, key: str | None = None,
                        closes: Sequence[tuple[int, str, Any]] = ()) -> list[int]:
        """Records a call before it runs; `closes`, (seq, outcome, result) of earlier calls
        on their way, go in the same commit. Returns the seqs those closed."""
        body: dict[str, Any] = {"seq": seq, "tool": tool, "callId": call_id,
                                "argsDigest": digest, "effect": effect, "idempotencyKey": key}
        if closes:
            body["closes"] = [{"seq": s, "outcome": o, "result": r} for s, o, r in closes]
        data = await self._open_after_turns(tool, body)
        return [int(s) for s in data.get("closed") or []]

    async def _open_after_turns(self, tool: str, body: dict[str, Any]) -> Any:
        """Sends an open after every turn held before it, carrying the one turn of a model
        that just called tools."""
        if self._turns or self._landing.locked():
            async with self._landing:
                self._no_turn_lost(tool)
                if len(self._turns) == 1 and len(self._turns[0][1]) <= CARRIED_TURN_BYTES:
                    # The turn rides on this open: the store appends it first, then records
                    # the call, each in its own commit, as if they had come one by one.
                    (session_id, raw), = self._turns
                    self._turns.clear()
                    body["turn"] = {"sessionId": session_id, "event": json.loads(raw)}
                    try:
                        return await self._send("POST", "/v1/ledger", raw=json.dumps(
                            body, ensure_ascii=False, separators=(",", ":")).encode())
                    except BaseException as e:
                        self._turn_lost = e
                        raise
                await self._turns_alone()
        self._no_turn_lost(tool)
        return await self._send("POST", "/v1/ledger", body)

    def _no_turn_lost(self, tool: str) -> None:
        if self._turn_lost is not None:
            raise StoreUnreachable(
                f"the model's turn that calls {tool} was not stored, so {tool} is not "
                f"recorded either: {type(self._turn_lost).__name__}: {self._turn_lost}")

    async def close_call(self, seq: int, outcome: str, result: Any = None) -> None:
        await self.request("POST", f"/v1/ledger/{seq}/close",
                           {"outcome": outcome, "result": result})

    async def journal(self) -> dict[str, dict[str, Any]]:
        """The calls of the session this attempt resumes, by call id."""
        data = await self.request("GET", "/v1/journal")
        return {c["callId"]: c for c in data.get("calls") or [] if c.get("callId")}

    async def record_side_effect(self, tool: str, args: Mapping[str, Any],
                                 idempotency_key: str | None = None) -> bool:
        """The sample agents' "world": a row in the store's sample outbox (one per
        idempotency key). Returns whether this call made the row."""
        data = await self.request("POST", "/v1/outbox", {"tool": tool, "args": dict(args),
                                                         "idempotencyKey": idempotency_key})
        return bool(data.get("recorded"))


# The process's client, for the sample tools (set by the runner when it starts).
_current: StoreClient | None = None


def set_current(client: StoreClient | None) -> None:
    global _current
    _current = client


def current() -> StoreClient:
    """The runner's store client (tools that record in the store, like the samples')."""
    if _current is None:
        raise StoreUnreachable("no store client: tools that use the run store run inside "
                               "agentrun-runner")
    return _current


def _session(data: Any) -> Session:
    # Through JSON, not a dict: inline file bytes travel base64-encoded, which only
    # ADK's JSON validation decodes.
    return Session.model_validate_json(json.dumps(data))


class StoreSessionService(BaseSessionService):
    """ADK sessions in the run store, through the store API.

    The store API keys every session by namespace and lets an attempt touch only its own;
    the names ADK passes here (app = agent, user, session id) are checked there, not
    trusted here.
    """

    def __init__(self, client: StoreClient, stops: Sequence[BaseException] = (), *,
                 turns_ride_on_open: bool = False) -> None:
        self._client = client
        # With the write-ahead ledger: the model's turn that calls tools is held for the
        # first call's open to carry (StoreClient.hold_turn), one request where there were
        # two on the way to every tool.
        self._turns_ride_on_open = turns_ride_on_open
        # The failures the runner's plugins raised (watch.failures): a stop among them
        # marks its error event as the runner's own.
        self._stops = stops

    async def create_session(self, *, app_name: str, user_id: str,
                             state: dict[str, Any] | None = None,
                             session_id: str | None = None) -> Session:
        from google.adk.errors.already_exists_error import AlreadyExistsError

        try:
            data = await self._client.request("POST", "/v1/sessions",
                                              {"sessionId": session_id, "state": state})
        except StoreRefused as e:
            if e.status == 409:
                raise AlreadyExistsError(e.message) from e
            raise
        return _session(data)

    async def get_session(self, *, app_name: str, user_id: str, session_id: str,
                          config: GetSessionConfig | None = None) -> Session | None:
        params: dict[str, Any] = {}
        if config is not None and config.num_recent_events is not None:
            params["numRecentEvents"] = config.num_recent_events
        if config is not None and config.after_timestamp is not None:
            params["afterTimestamp"] = config.after_timestamp
        data = await self._client.request("GET", f"/v1/sessions/{session_id}",
                                          params=params or None, missing_ok=True)
        return None if data is None else _session(data)

    async def list_sessions(self, *, app_name: str,
                            user_id: str | None = None) -> ListSessionsResponse:
        data = await self._client.request("GET", "/v1/sessions")
        return ListSessionsResponse(
            sessions=[_session(s) for s in data.get("sessions") or []])

    async def delete_session(self, *, app_name: str, user_id: str, session_id: str) -> None:
        await self._client.request("DELETE", f"/v1/sessions/{session_id}")

    async def append_event(self, session: Session, event: Event) -> Event:
        if event.partial:
            return event
        if event.error_code and not event.content and any(
                isinstance(f, AttemptStop) for f in self._stops):
            # The error event of the runner's own stop (stops.py): not the conversation's,
            # kept out of the journal, which then ends where it stood.
            return event
        # ADK's bookkeeping on the in-memory session first (temp state stays here and is
        # trimmed from what is stored), then the event goes to the store.
        self._apply_temp_state(session, event)
        event = self._trim_temp_delta_state(event)
        raw = event.model_dump_json(exclude_none=True).encode()
        if self._turns_ride_on_open and event.get_function_calls():
            self._client.hold_turn(session.id, raw)
        else:
            await self._client.append_event(session.id, raw)
        return self._commit_event_to_session(session, event)


class StoreMemoryService(BaseMemoryService):
    """Long-term memory of this run's (namespace, agent, user), through the store API."""

    def __init__(self, client: StoreClient) -> None:
        self._client = client

    async def add_session_to_memory(self, session: Session) -> None:
        await self.add_events_to_memory(app_name=session.app_name, user_id=session.user_id,
                                        events=session.events, session_id=session.id)

    async def add_events_to_memory(self, *, app_name: str, user_id: str,
                                   events: Sequence[Event], session_id: str | None = None,
                                   custom_metadata: Mapping[str, object] | None = None) -> None:
        await self._client.request("POST", "/v1/memory/events", {
            "events": [json.loads(e.model_dump_json(exclude_none=True)) for e in events]})

    async def search_memory(self, *, app_name: str, user_id: str,
                            query: str) -> SearchMemoryResponse:
        data = await self._client.request("POST", "/v1/memory/search", {"query": query})
        return SearchMemoryResponse.model_validate_json(json.dumps(data))
