"""The model's turn that calls tools rides on the first call's open: one request where there
were two on the way to every tool, and still the turn is in the session before the call is
on the ledger, and nothing sent after the turn reaches the store before it.

Against a real store API and Postgres, with real runner identities of two namespaces.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Mapping
from typing import Any

import pytest
from agentrun_runner.store_client import StoreClient, StoreSessionService, StoreUnreachable
from google.adk.events.event import Event
from google.adk.sessions.session import Session
from google.genai import types
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from agentrun import store
from agentrun.store import adk_tables as adk
from agentrun.vocabulary import RunStatus
from tests.runner.runs import Run, prepare_run, query
from tests.runner_world import RunnerWorld, call

pytestmark = pytest.mark.postgres


def _turn(call_id: str, tool: str = "send_email", **args: Any) -> Event:
    return Event(author="support-agent", invocation_id="inv-1", content=types.Content(
        role="model", parts=[types.Part(function_call=types.FunctionCall(
            id=call_id, name=tool, args=args))]))


def _said(event: Event) -> dict[str, Any]:
    return dict(json.loads(event.model_dump_json(exclude_none=True)))


def _open(seq: int, call_id: str, **more: Any) -> dict[str, Any]:
    return {"seq": seq, "tool": "send_email", "callId": call_id,
            "argsDigest": f"sha256:{seq}", **more}


def _begun(url: str, world: RunnerWorld, tag: str, namespace: str) -> tuple[Run, str, str]:
    """A run whose runner has begun and created its session: (run, store API, token)."""
    run = prepare_run(url, tag, session_id=f"chat-{tag}", namespace=namespace)
    api, token = world.store_api(url).url, run.identity(1).token
    assert call(api, "POST", "/v1/attempt/begin", token, {})[0] == 200
    assert call(api, "POST", "/v1/sessions", token, {"sessionId": run.session_id})[0] == 200
    return run, api, token


def _session(run: Run, session_id: str) -> Session:
    """Session `session_id` as the run's runner holds it (its app and user)."""
    return Session(id=session_id, app_name=run.agent, user_id=run.user_id)


def _calls_in_session(api: str, token: str, session_id: str) -> list[str]:
    status, session = call(api, "GET", f"/v1/sessions/{session_id}", token)
    assert status == 200
    return [p["function_call"]["id"] for e in session["events"]
            for p in e["content"]["parts"] if "function_call" in p]


def _ledger(url: str, run: Run) -> list[tuple[int, str | None]]:
    return [(r.seq, r.call_id) for r in query(url, lambda e: store.ledger(e, run.uid))]


def test_an_open_carries_its_turn_into_its_own_session_only(
    pg_store: str, runner_world: RunnerWorld
) -> None:
    other_ns = runner_world.create_namespace(f"solo-turn-b-{runner_world.namespace[-6:]}")
    a, api, token = _begun(pg_store, runner_world, "turn-a", runner_world.namespace)
    b, _, b_token = _begun(pg_store, runner_world, "turn-b", other_ns)

    # Carried: the turn lands in the session, the call on the ledger.
    turn = {"sessionId": a.session_id, "event": _said(_turn("c1", to="bob"))}
    assert call(api, "POST", "/v1/ledger", token, _open(1, "c1", turn=turn)) == (
        200, {"closed": []})
    assert _calls_in_session(api, token, a.session_id) == ["c1"]
    assert _ledger(pg_store, a) == [(1, "c1")]

    # A turn into another team's session: refused before anything is written, there or
    # on the caller's ledger.
    foreign = {"sessionId": b.session_id, "event": _said(_turn("c2"))}
    status, got = call(api, "POST", "/v1/ledger", token, _open(2, "c2", turn=foreign))
    assert status == 403 and f"only its own session {a.session_id}" in got["error"]
    assert _calls_in_session(api, b_token, b.session_id) == []
    assert _ledger(pg_store, a) == [(1, "c1")]

    # Only a turn that calls tools rides; anything else is appended alone.
    said = Event(author="user", invocation_id="inv-1", content=types.Content(
        role="user", parts=[types.Part(text="hello")]))
    status, got = call(api, "POST", "/v1/ledger", token,
                       _open(2, "c2", turn={"sessionId": a.session_id, "event": _said(said)}))
    assert status == 400 and "only the model's turn that calls tools" in got["error"]
    # Not an event at all.
    status, got = call(api, "POST", "/v1/ledger", token, _open(2, "c2", turn={
        "sessionId": a.session_id, "event": {"content": "not parts"}}))
    assert status == 400 and "not an ADK event" in got["error"]
    # Too large to ride.
    big = {"sessionId": a.session_id, "event": _said(_turn("c2", body="x" * 70_000))}
    status, got = call(api, "POST", "/v1/ledger", token, _open(2, "c2", turn=big))
    assert status == 413 and "append it alone" in got["error"]
    assert _ledger(pg_store, a) == [(1, "c1")]
    assert _calls_in_session(api, token, a.session_id) == ["c1"]
    # Its size is its UTF-8 bytes, as the runner measures it: 40 KB of Cyrillic rides (as
    # escaped JSON it would be 120 KB).
    cyrillic = {"sessionId": a.session_id, "event": _said(_turn("c2", body="щ" * 20_000))}
    assert call(api, "POST", "/v1/ledger", token, _open(2, "c2", turn=cyrillic)) == (
        200, {"closed": []})
    assert _calls_in_session(api, token, a.session_id) == ["c1", "c2"]
    stored = query(pg_store, lambda e: _events_stored(e, a.session_id))

    # Once the operator settled the attempt, its turn does not reach the session either:
    # the open's own statement fences the call, and the turn is checked before it lands.
    assert query(pg_store, lambda e: store.settle_counting(
        e, a.uid, 1, RunStatus.FAILED, "Evicted", "evicted")).won
    late = {"sessionId": a.session_id, "event": _said(_turn("c3"))}
    status, got = call(api, "POST", "/v1/ledger", token, _open(3, "c3", turn=late))
    assert status == 403 and "is settled (failed)" in got["error"]
    assert _ledger(pg_store, a) == [(1, "c1"), (2, "c2")]
    assert query(pg_store, lambda e: _events_stored(e, a.session_id)) == stored == 2


async def _events_stored(engine: AsyncEngine, session_id: str) -> int:
    async with engine.connect() as conn:
        return int((await conn.execute(select(func.count()).select_from(adk.events).where(
            adk.events.c.session_id == session_id))).scalar_one())


class CountingClient(StoreClient):
    """A StoreClient that writes down each answer's request as it is sent."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.sent: list[str] = []

    async def _send(self, method: str, path: str, body: Any = None, **kwargs: Any) -> Any:
        self.sent.append(f"{method} {path}")
        return await super()._send(method, path, body, **kwargs)


async def _failure(pending: Awaitable[Any]) -> str:
    """What awaiting `pending` raised, as "Type: message"; it must raise."""
    try:
        await pending
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    raise AssertionError("it was expected to fail, and did not")


def _client(world: RunnerWorld, url: str, run: Run) -> CountingClient:
    tls = world.plane.store_api_tls
    assert tls is not None
    return CountingClient(world.store_api(url).url, run.identity(1).token_file,
                          tls.ca.read_text())


def test_a_held_turn_lands_first_carried_or_alone(
    pg_store: str, runner_world: RunnerWorld
) -> None:
    run, api, token = _begun(pg_store, runner_world, "held", runner_world.namespace)
    assert run.session_id is not None
    session = _session(run, run.session_id)

    async def go() -> Mapping[str, list[str]]:
        client = _client(runner_world, pg_store, run)
        sessions = StoreSessionService(client, turns_ride_on_open=True)
        seen: dict[str, list[str]] = {}
        try:
            # Held: nothing sent yet; the open carries it, one request for both.
            await sessions.append_event(session, _turn("c1"))
            seen["held"] = list(client.sent)
            seen["held in store"] = _calls_in_session(api, token, run.session_id or "")
            await client.open_call(1, "send_email", "c1", "sha256:1")
            seen["carried"] = list(client.sent)
            # Held, then something else is sent first: the turn goes alone, before it.
            await sessions.append_event(session, _turn("c2"))
            await client.close_call(1, "ok", {"sent": True})
            seen["alone"] = list(client.sent[1:])
            seen["session"] = _calls_in_session(api, token, run.session_id or "")
            # A turn that is not a call goes at once, as always.
            await sessions.append_event(session, Event(
                author="support-agent", invocation_id="inv-1", content=types.Content(
                    role="model", parts=[types.Part(text="done")])))
            seen["text"] = list(client.sent[3:])
        finally:
            await client.close()
        return seen

    seen = asyncio.run(go())
    assert seen["held"] == [] and seen["held in store"] == []
    assert seen["carried"] == ["POST /v1/ledger"]
    assert seen["alone"] == [f"POST /v1/sessions/{run.session_id}/events",
                             "POST /v1/ledger/1/close"]
    assert seen["session"] == ["c1", "c2"]
    assert seen["text"] == [f"POST /v1/sessions/{run.session_id}/events"]
    assert _ledger(pg_store, run) == [(1, "c1")]


def test_no_call_is_opened_after_its_turn_failed_to_land(
    pg_store: str, runner_world: RunnerWorld
) -> None:
    run, api, token = _begun(pg_store, runner_world, "lost", runner_world.namespace)
    assert run.session_id is not None
    # The turn names another session than the attempt's own: the store refuses it.
    stray = _session(run, "not-this-runs-session")

    async def go() -> list[str]:
        client = _client(runner_world, pg_store, run)
        sessions = StoreSessionService(client, turns_ride_on_open=True)
        errors = []
        try:
            await sessions.append_event(stray, _turn("c1"))
            for seq in (1, 2):  # the carrying open, then a parallel call's own
                errors.append(await _failure(
                    client.open_call(seq, "send_email", f"c{seq}", f"sha256:{seq}")))
            # Everything else still goes: the runner must still report how it ended.
            await client.request("GET", "/v1/ledger")
        finally:
            await client.close()
        return errors

    errors = asyncio.run(go())
    assert len(errors) == 2
    assert "StoreRefused" in errors[0] and "only its own session" in errors[0]
    assert errors[1].startswith(StoreUnreachable.__name__)
    assert "the model's turn that calls send_email was not stored" in errors[1]
    assert _ledger(pg_store, run) == []
    assert _calls_in_session(api, token, run.session_id) == []


def test_a_turn_that_fails_alone_fails_only_what_builds_on_it(
    pg_store: str, runner_world: RunnerWorld
) -> None:
    run, api, token = _begun(pg_store, runner_world, "alone", runner_world.namespace)
    assert run.session_id is not None
    stray, own = _session(run, "not-this-runs-session"), _session(run, run.session_id)

    async def go() -> tuple[Any, list[str]]:
        client = _client(runner_world, pg_store, run)
        sessions = StoreSessionService(client, turns_ride_on_open=True)
        errors = []
        try:
            await sessions.append_event(stray, _turn("c1"))
            # Not an open: the turn is appended alone first, is refused, and this request
            # is answered all the same (the runner's own reports must still go).
            ledger = await client.request("GET", "/v1/ledger")
            errors.append(await _failure(sessions.append_event(own, Event(
                author="user", invocation_id="inv-1",
                content=types.Content(role="user", parts=[types.Part(text="next")])))))
            errors.append(await _failure(client.open_call(1, "send_email", "c1", "sha256:1")))
            # A decision asked for a call of the lost turn is not recorded either.
            errors.append(await _failure(
                client.request_approval(1, "send_email", "c1", {}, "sha256:1", 60)))
        finally:
            await client.close()
        return ledger, errors

    ledger, errors = asyncio.run(go())
    assert ledger == {"calls": []}
    assert len(errors) == 3
    assert errors[2] == errors[1]
    assert errors[0].startswith(StoreUnreachable.__name__)
    assert "refused by the store, so no later event is stored either" in errors[0]
    assert "only its own session" in errors[0]
    assert "the model's turn that calls send_email was not stored" in errors[1]
    assert _ledger(pg_store, run) == []
    status, session = call(api, "GET", f"/v1/sessions/{run.session_id}", token)
    assert status == 200 and session["events"] == []
