"""The trust boundary, from a runner's side: two namespaces, two teams, one store API.

Every request below is one a runner (or agent code inside it) could send with the token
its pod holds; each answer is asserted as the store API gave it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from google.adk.events.event import Event
from google.genai import types
from sqlalchemy.ext.asyncio import AsyncEngine

from agentrun import effects, store
from agentrun.vocabulary import ENV_SCRIPT_TRANSCRIPT, ApprovalDecision, Reason, RunStatus
from tests.runner.runs import Run, prepare_run, query, run_runner
from tests.runner_world import RunnerWorld, call

pytestmark = pytest.mark.postgres


def _event(text: str, invocation: str = "inv-1") -> bytes:
    event = Event(author="user", invocation_id=invocation,
                  content=types.Content(role="user", parts=[types.Part(text=text)]))
    return event.model_dump_json(exclude_none=True).encode()


def _team(url: str, world: RunnerWorld, tag: str, namespace: str, secret: str) -> Run:
    """A run of one team that has used the store API: its session with one event, one
    finished ledger call, one memory."""
    run = prepare_run(url, tag, f"{secret} input", session_id=f"chat-{tag}",
                      namespace=namespace)
    api, token = world.store_api(url).url, run.identity(1).token
    assert call(api, "POST", "/v1/attempt/begin", token, {})[0] == 200
    assert call(api, "POST", "/v1/sessions", token, {"sessionId": run.session_id})[0] == 200
    assert call(api, "POST", f"/v1/sessions/{run.session_id}/events", token,
                raw=_event(f"{secret} said in the session"))[0] == 200
    assert call(api, "POST", "/v1/ledger", token, {"seq": 1, "tool": "send_email",
                                                    "callId": "c1", "argsDigest": "sha256:1"}
                )[0] == 200
    assert call(api, "POST", "/v1/ledger/1/close", token, {"outcome": "ok"})[0] == 200
    memory = json.loads(_event(f"{secret} remembered"))
    assert call(api, "POST", "/v1/memory/events", token, {"events": [memory]})[0] == 200
    return run


def test_a_runner_reaches_its_own_records_and_nothing_of_another_team(
    pg_store: str, runner_world: RunnerWorld
) -> None:
    team_b = runner_world.create_namespace(f"solo-team-b-{runner_world.namespace[-6:]}")
    a = _team(pg_store, runner_world, "team-a", runner_world.namespace, "ALPHA")
    b = _team(pg_store, runner_world, "team-b", team_b, "BRAVO")
    api, token = runner_world.store_api(pg_store).url, a.identity(1).token

    # Its own: the input, the session, the ledger, the memory.
    status, got = call(api, "GET", "/v1/input", token)
    assert (status, got["text"]) == (200, "ALPHA input")
    status, session = call(api, "GET", f"/v1/sessions/{a.session_id}", token)
    assert status == 200
    assert [e["content"]["parts"][0]["text"] for e in session["events"]] == [
        "ALPHA said in the session"]
    status, ledger = call(api, "GET", "/v1/ledger", token)
    assert (status, [c["tool"] for c in ledger["calls"]]) == (200, ["send_email"])

    # B's session, by its id: refused, and no append lands in it.
    status, got = call(api, "GET", f"/v1/sessions/{b.session_id}", token)
    assert status == 403 and f"only its own session {a.session_id}" in got["error"]
    status, got = call(api, "POST", f"/v1/sessions/{b.session_id}/events", token,
                       raw=_event("ALPHA was here"))
    assert status == 403
    status, got = call(api, "POST", "/v1/sessions", token, {"sessionId": b.session_id})
    assert status == 403
    # Listing shows its own session only.
    status, listed = call(api, "GET", "/v1/sessions", token)
    assert (status, [s["id"] for s in listed["sessions"]]) == (200, [a.session_id])
    # B's memory is not A's to find, even with B's words.
    status, found = call(api, "POST", "/v1/memory/search", token, {"query": "BRAVO"})
    assert (status, found.get("memories", [])) == (200, [])
    status, found = call(api, "POST", "/v1/memory/search", token, {"query": "BRAVO remembered"})
    assert status == 200 and "BRAVO" not in json.dumps(found)
    status, found = call(api, "POST", "/v1/memory/search", token, {"query": "ALPHA remembered"})
    assert status == 200 and len(found["memories"]) == 1

    # Nothing is deleted or rewritten, not even its own.
    status, got = call(api, "DELETE", f"/v1/sessions/{a.session_id}", token)
    assert status == 403 and "may not delete sessions" in got["error"]
    status, got = call(api, "POST", "/v1/ledger/1/close", token, {"outcome": "error"})
    assert status == 409 and "never rewritten" in got["error"]
    status, got = call(api, "POST", "/v1/ledger", token, {"seq": 1, "tool": "read_message",
                                                          "callId": "c9",
                                                          "argsDigest": "sha256:9"})
    assert status == 409 and "never rewritten" in got["error"]
    assert call(api, "DELETE", "/v1/ledger", token)[0] == 405
    assert call(api, "DELETE", "/v1/ledger/1", token)[0] in (404, 405)
    # The same call sent again (a lost answer) is the same row, not a second one.
    assert call(api, "POST", "/v1/ledger", token, {"seq": 1, "tool": "send_email",
                                                    "callId": "c1",
                                                    "argsDigest": "sha256:1"})[0] == 200

    # What the store holds afterwards: both ledgers and B's session exactly as written.
    def ledger_of(run: Run) -> list[tuple[str, str | None]]:
        rows = query(pg_store, lambda e: store.ledger(e, run.uid))
        return [(r.tool, r.outcome) for r in rows]

    assert ledger_of(a) == [("send_email", "ok")]
    assert ledger_of(b) == [("send_email", "ok")]
    status, b_session = call(api, "GET", f"/v1/sessions/{b.session_id}", b.identity(1).token)
    assert status == 200
    assert [e["content"]["parts"][0]["text"] for e in b_session["events"]] == [
        "BRAVO said in the session"]


def test_tokens_that_do_not_speak_for_a_live_attempt_are_refused(
    pg_store: str, runner_world: RunnerWorld
) -> None:
    run = prepare_run(pg_store, "tokens")
    api = runner_world.store_api(pg_store).url

    status, got = call(api, "GET", "/v1/input", None)
    assert status == 401 and "Bearer" in got["error"]
    status, got = call(api, "GET", "/v1/input", "not-a-token")
    assert status == 401
    # A token for the Kubernetes API server (its default audience) is worth nothing here.
    me = run.identity(1)
    api_token = runner_world.token(run.namespace, me.pod, me.pod_uid, "https://kubernetes"
                                   ".default.svc")
    status, got = call(api, "GET", "/v1/input", api_token)
    assert status == 401 and "agentrun.dev/store" in got["error"]
    # A pod that is not an agentrun runner pod (no AgentRun controls it).
    stray = runner_world.core.create_namespaced_pod(run.namespace, {
        "metadata": {"name": "stray", "labels": {"agentrun.dev/run": run.name,
                                                 "agentrun.dev/attempt": "1"}},
        "spec": {"schedulerName": "agentrun-tests-unscheduled",
                 "containers": [{"name": "c", "image": "x"}]}})
    stray_token = runner_world.token(run.namespace, "stray", stray.metadata.uid,
                                     "agentrun.dev/store")
    status, got = call(api, "GET", "/v1/input", stray_token)
    assert status == 403 and "not an agentrun runner pod" in got["error"]

    # The attempt's own token works while the attempt is live...
    assert call(api, "GET", "/v1/input", me.token)[0] == 200
    # ...and not once the operator has settled it (evicted, deleted, lost...).
    settled = query(pg_store, lambda e: store.settle_counting(
        e, run.uid, 1, RunStatus.FAILED, "Evicted", "evicted"))
    assert settled.won
    status, got = call(api, "GET", "/v1/input", me.token)
    assert status == 403 and "settled" in got["error"] and "no longer accepted" in got["error"]
    status, got = call(api, "POST", "/v1/ledger", me.token, {"seq": 1, "tool": "send_email",
                                                             "callId": "c1",
                                                             "argsDigest": "sha256:1"})
    assert status == 403
    assert query(pg_store, lambda e: store.ledger(e, run.uid)) == []


def test_a_run_naming_another_namespaces_session_gets_its_own(
    pg_store: str, runner_world: RunnerWorld, tmp_path: Path
) -> None:
    team_b = runner_world.create_namespace(f"solo-chat-b-{runner_world.namespace[-6:]}")
    b = prepare_run(pg_store, "chat-b", "BRAVO asks about order 9", user_id="alice",
                    session_id="chat-7", namespace=team_b)
    assert run_runner(b, [{"text": "BRAVO answered."}]).returncode == 0

    async def events(e: AsyncEngine, app: str) -> list[Any]:
        from sqlalchemy import text

        async with e.connect() as conn:
            rows = await conn.execute(text(
                "SELECT event_data FROM events WHERE app_name = :a AND user_id = 'alice' "
                "AND session_id = 'chat-7' ORDER BY timestamp, id"), {"a": app})
            return [r[0] for r in rows]

    before = query(pg_store, lambda e: events(e, b.app))
    assert len(before) == 2

    # Same agent, userId and sessionId in namespace A: another session.
    transcript = tmp_path / "model.jsonl"
    a = prepare_run(pg_store, "chat-a", "ALPHA asks", user_id="alice", session_id="chat-7")
    done = run_runner(a, [{"text": "ALPHA answered."}],
                      **{ENV_SCRIPT_TRANSCRIPT: str(transcript)})
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.dumps(json.loads(transcript.read_text().splitlines()[0])["contents"])
    assert "ALPHA asks" in seen and "BRAVO" not in seen
    assert query(pg_store, lambda e: events(e, b.app)) == before
    assert len(query(pg_store, lambda e: events(e, a.app))) == 2


def test_an_approved_call_opens_only_with_the_arguments_approved(
    pg_store: str, runner_world: RunnerWorld
) -> None:
    """An approval approves exactly the arguments it names: a runner that opens the
    approved call under other arguments is refused (ApprovalMismatch), nothing is on the
    ledger, and the call opens with the approved ones."""
    run = prepare_run(pg_store, "approved", namespace=runner_world.namespace)
    api = runner_world.store_api(pg_store).url
    first = run.identity(1).token
    assert call(api, "POST", "/v1/attempt/begin", first, {})[0] == 200
    # ~2 KB of arguments, the decisive part after byte 1,024 (what status shows).
    approved = {"account": "a" * 1500, "amount": 120, "to": "customer-42"}
    other = {**approved, "to": "attacker-7"}
    status, said = call(api, "POST", "/v1/approvals", first, {
        "seq": 1, "tool": "transfer", "callId": "c1", "args": approved,
        "argsDigest": effects.args_digest(approved), "timeoutSeconds": 3600})
    assert status == 200, said
    assert call(api, "POST", "/v1/attempt/outcome", first, {
        "status": RunStatus.FAILED, "reason": Reason.AWAITING_APPROVAL,
        "message": "transfer waits"})[0] == 200
    assert query(pg_store, lambda e: store.decide(e, run.uid, "c1", ApprovalDecision.APPROVE,
                                                  "ann", None, "approved-1"))

    second = run.identity(2).token
    assert call(api, "POST", "/v1/attempt/begin", second, {})[0] == 200
    status, said = call(api, "POST", "/v1/ledger", second, {
        "seq": 1, "tool": "transfer", "callId": "c1",
        "argsDigest": effects.args_digest(other)})
    assert status == 409, said
    assert said["reason"] == Reason.APPROVAL_MISMATCH
    assert "ann approved call c1 with arguments " + effects.args_digest(approved) in (
        said["error"])
    assert "the tool was not run" in said["error"]
    assert query(pg_store, lambda e: store.ledger(e, run.uid)) == []
    # The approved arguments open it; the runner may then report the mismatch's reason.
    status, said = call(api, "POST", "/v1/ledger", second, {
        "seq": 1, "tool": "transfer", "callId": "c1",
        "argsDigest": effects.args_digest(approved)})
    assert status == 200, said
    assert [r.args_digest for r in query(pg_store, lambda e: store.ledger(e, run.uid))] == [
        effects.args_digest(approved)]
