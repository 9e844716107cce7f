"""What one runner cannot do to the store API, from the runner's side: flood it (bodies,
memory queries, events), speak for the operator (a reason that means "nothing ran", a call
answered from a journal it has not got), cost a TokenReview per bad token, or read SQL in
an error. Every request below is one a runner (or code inside it) could send with the
token its pod holds, to the real `agentrun-store-api`; every answer is asserted as given.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import socket
import ssl
import time
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from agentrun_devtools.processes import free_port
from agentrun_runner.store_client import StoreClient, StoreRefused
from agentrun_store_api import limits
from google.adk.events.event import Event
from google.genai import types
from sqlalchemy import func, select, text
from sqlalchemy.ext.asyncio import AsyncEngine

from agentrun import store
from agentrun.store import adk_tables as adk
from agentrun.vocabulary import Reason, RunStatus
from tests.runner.runs import Run, prepare_run, query
from tests.runner_world import TRUST, RunnerWorld, StoreAPIProcess, call

pytestmark = pytest.mark.postgres

MiB = 1024 * 1024


def _event(text: str) -> bytes:
    event = Event(author="user", invocation_id="inv-1",
                  content=types.Content(role="user", parts=[types.Part(text=text)]))
    return event.model_dump_json(exclude_none=True).encode()


def _begun(url: str, world: RunnerWorld, tag: str, **kwargs: Any) -> tuple[Run, str, str]:
    """A run whose runner has begun and created its session: (run, store API, token)."""
    run = prepare_run(url, tag, **kwargs)
    api, token = world.store_api(url).url, run.identity(1).token
    assert call(api, "POST", "/v1/attempt/begin", token, {})[0] == 200
    assert call(api, "POST", "/v1/sessions", token, {"sessionId": run.session_for(1)})[0] == 200
    return run, api, token


def _events_of(url: str, run: Run, attempt: int = 1) -> int:
    async def count(e: AsyncEngine) -> int:
        async with e.connect() as conn:
            return int((await conn.execute(select(func.count()).where(
                *adk.events_of(run.app, run.user_id, run.session_for(attempt))))).scalar_one())
    return query(url, count)


def _too_large(api: str, path: str, token: str, raw: bytes) -> tuple[int, str, str]:
    """A body over its route's limit, sent as the runner's client sends it: whole, reading
    the answer even when the store API stops reading the body (it closes the connection
    after a refusal of a large unread body). The status, the sentence and the answer's
    Connection header."""
    with httpx.Client(base_url=api, timeout=30, verify=TRUST) as client:
        r = client.post(path, content=raw, headers={"Authorization": f"Bearer {token}",
                                                    "Content-Type": "application/json"})
    return r.status_code, r.json()["error"], r.headers.get("connection", "")


def test_a_flooding_runner_gets_413_and_429_with_sentences(
    pg_store: str, runner_world: RunnerWorld
) -> None:
    run, api, token = _begun(pg_store, runner_world, "flood")
    session = run.session_for(1)

    # A 16 MiB body where a few hundred bytes belong: refused from its Content-Length.
    assert _too_large(api, "/v1/ledger", token, b"x" * (16 * MiB)) == (
        413, "POST /v1/ledger takes a body of at most 216 KiB; this one is 16 MiB", "close")
    status, error, _ = _too_large(api, "/v1/attempt/outcome", token, b" " * (16 * MiB))
    assert status == 413 and "POST /v1/attempt/outcome takes a body of at most 64 KiB" \
        in error
    # ...and counted while read, when no Content-Length says it first (chunked).
    with httpx.Client(base_url=api, timeout=30, verify=TRUST) as client:
        answer = client.post("/v1/ledger", headers={"Authorization": f"Bearer {token}"},
                             content=iter([b"x" * (64 * 1024)] * 8))
    assert answer.status_code == 413, answer.text
    assert answer.json()["error"] == "POST /v1/ledger takes a body of at most 216 KiB"

    # A 300,000-word memory query: far over the route's body limit.
    words = " ".join(f"w{i}" for i in range(300_000))
    status, error, _ = _too_large(api, "/v1/memory/search", token,
                                  json.dumps({"query": words}).encode())
    assert status == 413 and error.startswith(
        "POST /v1/memory/search takes a body of at most 32 KiB; this one is "), error
    # Under the body limit, over the words a search looks for (one LIKE each).
    status, got = call(api, "POST", "/v1/memory/search", token,
                       {"query": " ".join(f"w{i}" for i in range(100))})
    assert (status, got["error"]) == (413, "a memory query may search for 64 words at most "
                                           "(stop words aside); this one has 100")
    # A real one is served.
    status, got = call(api, "POST", "/v1/memory/search", token,
                       {"query": "what did the customer ask about the refund"})
    assert status == 200, got

    # 10,000 session events, four at a time: the first 4,000 are stored, then 429.
    def append(i: int, client: httpx.Client) -> tuple[int, str]:
        r = client.post(f"/v1/sessions/{session}/events", content=_event(f"event {i}"),
                        headers={"Authorization": f"Bearer {token}",
                                 "Content-Type": "application/json"})
        return r.status_code, r.json().get("error", "")

    with httpx.Client(base_url=api, timeout=60, verify=TRUST,
                      limits=httpx.Limits(max_connections=4)) as client, \
            ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda i: append(i, client), range(10_000)))
    codes = Counter(code for code, _ in answers)
    assert codes == {200: limits.EVENTS_PER_ATTEMPT, 429: 10_000 - limits.EVENTS_PER_ATTEMPT}
    refusal = next(error for code, error in answers if code == 429)
    assert refusal == (f"attempt 1 of run {run.name}: one attempt may write at most 4,000 "
                       "session events through the store API, and this one has written "
                       "4,000 already; this request was not stored")
    assert _events_of(pg_store, run) == limits.EVENTS_PER_ATTEMPT
    # A turn an open carries is an event like any other: past the quota, neither it nor
    # the call it carries is written.
    turn = Event(author="support-agent", invocation_id="inv-1", content=types.Content(
        role="model", parts=[types.Part(function_call=types.FunctionCall(
            id="c0", name="send_email", args={}))]))
    status, got = call(api, "POST", "/v1/ledger", token, {
        "seq": 1, "tool": "send_email", "callId": "c0", "argsDigest": "sha256:0",
        "turn": {"sessionId": session,
                 "event": json.loads(turn.model_dump_json(exclude_none=True))}})
    assert status == 429 and "at most 4,000 session events" in got["error"], got
    assert _events_of(pg_store, run) == limits.EVENTS_PER_ATTEMPT
    assert query(pg_store, lambda e: store.ledger(e, run.uid)) == []

    # A ledger row past the most an attempt may record: 429, and nothing written.
    status, got = call(api, "POST", "/v1/ledger", token, {
        "seq": limits.LEDGER_ROWS_PER_ATTEMPT + 1, "tool": "send_email", "callId": "c",
        "argsDigest": "sha256:1"})
    assert status == 429 and "at most 2,000 tool calls" in got["error"]
    # A tool result over what the journal keeps: 413.
    assert call(api, "POST", "/v1/ledger", token, {"seq": 1, "tool": "read_message",
                                                    "callId": "c1", "argsDigest": "sha256:1"}
                )[0] == 200
    status, got = call(api, "POST", "/v1/ledger/1/close", token,
                       {"outcome": "ok", "result": {"text": "x" * (1 * MiB + 1)}})
    assert status == 413 and "a tool result is journalled up to 1 MiB" in got["error"], got
    assert [r.seq for r in query(pg_store, lambda e: store.ledger(e, run.uid))] == [1]

    # Through all of it, the flooder's neighbour is served as ever.
    other, _, other_token = _begun(pg_store, runner_world, "neighbour")
    assert call(api, "POST", f"/v1/sessions/{other.session_for(1)}/events", other_token,
                raw=_event("hello"))[0] == 200


@contextlib.contextmanager
def _connected(api: str) -> Iterator[ssl.SSLSocket]:
    """One TLS connection to the store API, verified as a runner verifies it; a read that
    waits 10 s fails."""
    url = urllib.parse.urlsplit(api)
    assert url.hostname is not None and url.port is not None
    with socket.create_connection((url.hostname, url.port), timeout=10) as plain, \
            TRUST.wrap_socket(plain, server_hostname=url.hostname) as conn:
        yield conn


def _head(method: str, path: str, token: str, length: int) -> bytes:
    return (f"{method} {path} HTTP/1.1\r\nHost: store\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n").encode()


def _answer_on(conn: ssl.SSLSocket, method: str) -> tuple[int, str | None, Any]:
    """The next answer on `conn`: its status, its Connection header, its JSON."""
    answer = http.client.HTTPResponse(conn, method=method)  # type: ignore[arg-type]
    answer.begin()
    return answer.status, answer.getheader("Connection"), json.loads(answer.read())


def test_a_large_body_refused_unread_is_never_read(
    pg_store: str, runner_world: RunnerWorld
) -> None:
    """Refusing a body costs the store API no more than its headers: 16 MiB announced where
    216 KiB belong is answered after its headers and 1 KiB of it, with Connection: close,
    and the connection closes there (the HTTP server would otherwise read the other 16 MiB
    to keep it). A small refused body that comes after the refusal is read and dropped, and
    its connection serves the runner's next request; one that does not come is not waited
    for past limits.DRAIN_SECONDS."""
    _, api, token = _begun(pg_store, runner_world, "unread")
    with _connected(api) as conn:
        conn.sendall(_head("POST", "/v1/ledger", token, 16 * MiB) + b"x" * 1024)
        assert _answer_on(conn, "POST") == (413, "close", {
            "error": "POST /v1/ledger takes a body of at most 216 KiB; this one is 16 MiB"})
        conn.settimeout(2)  # aiohttp would otherwise read on for 10 s to keep it
        assert conn.recv(1) == b""  # closed: the rest of the body was not waited for
    with _connected(api) as conn:
        # The body comes after the headers, once the refusal is decided: read, not lost.
        conn.sendall(_head("POST", "/v1/attempt/begin", token, 8 * 1024))
        time.sleep(0.2)
        conn.sendall(b" " * 8 * 1024)
        status, connection, got = _answer_on(conn, "POST")
        assert (status, connection) == (413, None), got
        assert got["error"] == ("POST /v1/attempt/begin takes a body of at most 4 KiB; this "
                                "one is 8 KiB")
        conn.sendall(f"GET /v1/ledger HTTP/1.1\r\nHost: store\r\nAuthorization: Bearer "
                     f"{token}\r\n\r\n".encode())
        assert _answer_on(conn, "GET") == (200, None, {"calls": []})
    with _connected(api) as conn:
        # ...and one that never comes does not hold the answer: it comes, with the close.
        conn.sendall(_head("POST", "/v1/attempt/begin", token, 8 * 1024))
        assert _answer_on(conn, "POST")[:2] == (413, "close")


async def _runner_sends(api: str, world: RunnerWorld, run: Run, path: str,
                        raw: bytes) -> StoreRefused:
    tls = world.plane.store_api_tls
    assert tls is not None
    client = StoreClient(api, run.identity(1).token_file, tls.ca.read_text())
    try:
        with pytest.raises(StoreRefused) as refused:
            await client.request("POST", path, raw=raw)
        return refused.value
    finally:
        await client.close()


def test_the_runners_client_reads_the_refusal_of_a_body_never_read(
    pg_store: str, runner_world: RunnerWorld
) -> None:
    """The runner's own client (aiohttp) gets the sentence of a large body's refusal,
    though the store API closes the connection without reading that body."""
    run, api, _ = _begun(pg_store, runner_world, "unread-runner")
    for size, shown in ((300 * 1024, "300 KiB"), (16 * MiB, "16 MiB"), (40 * MiB, "40 MiB")):
        refused = asyncio.run(_runner_sends(api, runner_world, run, "/v1/ledger",
                                            b"x" * size))
        assert (refused.status, refused.message) == (
            413, f"POST /v1/ledger takes a body of at most 216 KiB; this one is {shown}")


def test_an_open_carries_the_closes_of_earlier_calls(
    pg_store: str, runner_world: RunnerWorld
) -> None:
    run, api, token = _begun(pg_store, runner_world, "carried")

    def open_call(seq: int, closes: list[dict[str, Any]]) -> tuple[int, Any]:
        return call(api, "POST", "/v1/ledger", token, {
            "seq": seq, "tool": "send_email", "callId": f"c{seq}", "argsDigest": "sha256:1",
            "closes": closes})

    assert open_call(1, []) == (200, {"closed": []})
    # Call 2's open closes call 1, in the same commit; a close of a row that is not open
    # (9) closes nothing and says so.
    assert open_call(2, [{"seq": 1, "outcome": "ok", "result": {"sent": True}},
                         {"seq": 9, "outcome": "ok"}]) == (200, {"closed": [1]})
    # What an open may not carry: a journal close (checked alone), a large result, many.
    status, got = open_call(3, [{"seq": 2, "outcome": "journal"}])
    assert (status, got["error"]) == (400, "a carried close is ok or error; a journal "
                                           "close goes alone")
    status, got = open_call(3, [{"seq": 2, "outcome": "ok", "result": "x" * 17_000}])
    assert status == 413 and "a carried close's result may be 16 KiB at most" in got["error"]
    status, got = open_call(3, [{"seq": 2, "outcome": "ok"}] * 9)
    assert (status, got["error"]) == (413, "an open carries at most 8 closes; this one "
                                           "carries 9")
    # A settled attempt: the open is refused, and the close it carried with it.
    assert query(pg_store, lambda e: store.settle_counting(
        e, run.uid, 1, RunStatus.FAILED, Reason.EVICTED, "evicted")).won
    status, got = open_call(3, [{"seq": 2, "outcome": "ok"}])
    assert status == 403 and "is settled (failed)" in got["error"], got
    rows = query(pg_store, lambda e: store.ledger(e, run.uid))
    assert [(r.seq, r.outcome, r.result) for r in rows] == [
        (1, "ok", {"sent": True}), (2, None, None)]


def test_a_runner_may_not_report_what_only_the_operator_observes(
    pg_store: str, runner_world: RunnerWorld
) -> None:
    run, api, token = _begun(pg_store, runner_world, "reasons")
    assert call(api, "POST", "/v1/ledger", token, {"seq": 1, "tool": "send_email",
                                                    "callId": "c1", "argsDigest": "sha256:1"}
                )[0] == 200
    for reason in (Reason.INPUT_UNAVAILABLE, Reason.SESSION_BUSY, Reason.EVICTED):
        status, got = call(api, "POST", "/v1/attempt/outcome", token,
                           {"status": RunStatus.FAILED, "reason": reason, "message": "-"})
        assert status == 400, got
        assert got["error"] == (
            "a runner reports a failure only with one of its own reasons "
            f"({', '.join(sorted(Reason.RUNNER_REPORTED))}); {reason!r} is not one: "
            "the operator decides it from what it observes")
    assert query(pg_store, lambda e: store.get_outcome(e, run.uid, 1)) is None
    # Its own reasons are its to report.
    status, got = call(api, "POST", "/v1/attempt/outcome", token,
                       {"status": RunStatus.FAILED, "reason": Reason.AGENT_ERROR,
                        "message": "the agent raised"})
    assert (status, got) == (200, {"recorded": True})
    outcome = query(pg_store, lambda e: store.get_outcome(e, run.uid, 1))
    assert outcome is not None and outcome.reason == Reason.AGENT_ERROR


def test_input_unavailable_is_the_store_apis_own_observation(
    pg_store: str, runner_world: RunnerWorld
) -> None:
    run, api, token = _begun(pg_store, runner_world, "noinput")
    query(pg_store, lambda e: store.delete_input(e, run.digest))
    status, got = call(api, "GET", "/v1/input", token)
    assert status == 404 and "is not in the run store" in got["error"]
    outcome = query(pg_store, lambda e: store.get_outcome(e, run.uid, 1))
    assert outcome is not None
    assert (outcome.status, outcome.reason) == (RunStatus.FAILED, Reason.INPUT_UNAVAILABLE)


def test_a_journal_close_is_only_for_what_the_resumed_journal_answered(
    pg_store: str, runner_world: RunnerWorld
) -> None:
    run, api, token = _begun(pg_store, runner_world, "journal", session_id="chat-journal")
    session = run.session_for(1)
    assert call(api, "POST", f"/v1/sessions/{session}/events", token,
                raw=_event("send the email"))[0] == 200
    for seq, tool, call_id in ((1, "send_email", "c1"), (2, "update_crm", "c2")):
        assert call(api, "POST", "/v1/ledger", token, {
            "seq": seq, "tool": tool, "callId": call_id, "argsDigest": "sha256:1"})[0] == 200
    # Not a resuming attempt: no journal to answer from, whatever the call.
    status, got = call(api, "POST", "/v1/ledger/1/close", token, {"outcome": "journal"})
    assert (status, got["error"]) == (409, "a call is answered from the journal only in an "
                                           "attempt that resumes another; this attempt "
                                           "resumes none")
    assert call(api, "POST", "/v1/ledger/1/close", token,
                {"outcome": "ok", "result": {"sent": True}})[0] == 200
    # update_crm (c2) stays open: in doubt. The operator settles attempt 1...
    assert query(pg_store, lambda e: store.settle_counting(
        e, run.uid, 1, RunStatus.FAILED, Reason.EVICTED, "evicted")).won
    # ...and its token cannot close anything any more (the fence, in the close itself).
    status, got = call(api, "POST", "/v1/ledger/2/close", token, {"outcome": "ok"})
    assert status == 403 and "is settled (failed)" in got["error"], got

    # Attempt 2 resumes attempt 1 in the same session.
    query(pg_store, lambda e: store.start_attempt(e, run.uid, 2, session, f"{run.name}-2",
                                                  resumes_attempt=1))
    token2 = run.identity(2).token
    assert call(api, "POST", "/v1/attempt/begin", token2, {})[0] == 200
    for seq, tool, call_id in ((1, "send_email", "c1"), (2, "read_message", "c1"),
                               (3, "update_crm", "c2"), (4, "send_email", "c9")):
        assert call(api, "POST", "/v1/ledger", token2, {
            "seq": seq, "tool": tool, "callId": call_id, "argsDigest": "sha256:1"})[0] == 200
    # c1 finished in attempt 1: answered from the journal.
    assert call(api, "POST", "/v1/ledger/1/close", token2, {"outcome": "journal",
                                                             "result": {"sent": True}}
                )[0] == 200
    refused = {seq: call(api, "POST", f"/v1/ledger/{seq}/close", token2,
                         {"outcome": "journal"}) for seq in (2, 3, 4)}
    assert refused[2] == (409, {"error": "call 2 is read_message, but the journal's call c1 "
                                         "was send_email"})
    for seq, call_id in ((3, "c2"), (4, "c9")):
        assert refused[seq][0] == 409
        assert f"call {seq} (" in refused[seq][1]["error"]
        assert f"call id {call_id}) is not a call the journal of the resumed session holds " \
               "as finished" in refused[seq][1]["error"]
    rows = query(pg_store, lambda e: store.ledger(e, run.uid))
    assert [(r.attempt, r.seq, r.outcome) for r in rows] == [
        (1, 1, "ok"), (1, 2, None), (2, 1, "journal"), (2, 2, None), (2, 3, None),
        (2, 4, None)]


@pytest.fixture
def counted_store_api(pg_store: str, runner_world: RunnerWorld,
                      tmp_path: Path) -> Iterator[StoreAPIProcess]:
    """Its own `agentrun-store-api`, with /metrics: TokenReviews are counted there."""
    api = StoreAPIProcess(runner_world.plane, pg_store, tmp_path / "store-api.log",
                          metrics_port=free_port()).wait_ready()
    try:
        yield api
    finally:
        api.stop()


def test_refused_tokens_cost_one_token_review(
    pg_store: str, runner_world: RunnerWorld, counted_store_api: StoreAPIProcess
) -> None:
    api = counted_store_api
    run = prepare_run(pg_store, "reviews")
    reviews = "agentrun_store_api_token_reviews_total"
    # Shaped like a JWT, signed by no one: the API server refuses it, once.
    forged = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ4In0.c2lnbmF0dXJl"
    answers = [call(api.url, "GET", "/v1/input", forged) for _ in range(50)]
    status, got = answers[0]
    assert answers == [answers[0]] * 50
    assert status == 401 and "not valid for the store API" in got["error"]
    assert api.metric(reviews, result="refused") == 1
    # Not even shaped like one: refused without asking.
    for _ in range(20):
        assert call(api.url, "GET", "/v1/input", "not-a-token")[0] == 401
    assert api.metric(reviews, result="refused") == 1
    # A token for the API server's own audience: refused, once.
    me = run.identity(1)
    wrong = runner_world.token(run.namespace, me.pod, me.pod_uid,
                               "https://kubernetes.default.svc")
    for _ in range(20):
        assert call(api.url, "GET", "/v1/input", wrong)[0] == 401
    assert api.metric(reviews, result="refused") == 2
    # The runner's own token: one review, however many requests.
    for _ in range(20):
        assert call(api.url, "GET", "/v1/input", me.token)[0] == 200
    assert api.metric(reviews, result="authenticated") == 1
    assert api.metric("agentrun_store_api_refusals_total", route="input", code="401") == 90


def test_errors_carry_no_sql_parameters_or_hosts(
    pg_store: str, runner_world: RunnerWorld, counted_store_api: StoreAPIProcess
) -> None:
    api = counted_store_api
    run = prepare_run(pg_store, "nosql")
    token = run.identity(1).token
    assert call(api.url, "POST", "/v1/attempt/begin", token, {})[0] == 200
    # A body that is not an ADK event is the runner's mistake: 400, saying where and what,
    # never the value it sent.
    status, got = call(api.url, "POST", f"/v1/sessions/{run.session_for(1)}/events", token,
                       {"content": {"parts": "SELECT secret FROM users"}})
    assert status == 400 and got["error"].startswith("not an ADK event: "), got
    assert "SELECT" not in got["error"] and "secret" not in json.dumps(got), got

    async def break_the_ledger(e: AsyncEngine) -> None:
        async with e.begin() as conn:
            await conn.execute(text("ALTER TABLE tool_calls RENAME TO tool_calls_gone"))

    query(pg_store, break_the_ledger)
    status, got = call(api.url, "POST", "/v1/ledger", token, {
        "seq": 1, "tool": "send_email", "callId": "c-secret-1", "argsDigest": "sha256:42"})
    assert status == 503, got
    said = got["error"]
    assert said.startswith("the run store could not serve POST /v1/ledger (error ")
    assert said.endswith(" in the store API's log); retry")
    for leak in ("tool_calls", "INSERT", "SELECT", "c-secret-1", "sha256:42", "127.0.0.1",
                 "postgres", "psycopg", "Error"):
        assert leak not in said, (leak, said)
    # The log has it, under the reference the runner was given.
    ref = said.split("(error ")[1].split(" ")[0]
    logged = api.log_path.read_text()
    line = next(x for x in logged.splitlines() if f"ref={ref}" in x)
    assert "event=store-api-failed route=open_call" in line and "tool_calls" in logged
    assert api.metric("agentrun_store_api_errors_total", route="open_call") == 1


def _label_values(api: StoreAPIProcess, family: str, label: str) -> set[str]:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{api.metrics_port}/metrics",
                                timeout=10) as r:
        text_ = r.read().decode()
    return {s.labels[label] for f in text_string_to_metric_families(text_)
            for s in f.samples if s.name == family and label in s.labels}


def test_a_runner_flooding_approvals_and_model_names_gets_429_and_bounded_labels(
    pg_store: str, runner_world: RunnerWorld, counted_store_api: StoreAPIProcess
) -> None:
    api = counted_store_api
    run = prepare_run(pg_store, "names")
    token = run.identity(1).token
    assert call(api.url, "POST", "/v1/attempt/begin", token, {})[0] == 200

    # New call ids, each a call waiting for a decision: the quota, then 429.
    def wait_for_decision(i: int) -> tuple[int, Any]:
        args = {"to": f"customer-{i}@example.com", "body": "x" * 1000}
        return call(api.url, "POST", "/v1/approvals", token, {
            "seq": i + 1, "tool": "send_email", "callId": f"flood-{i}", "args": args,
            "argsDigest": store.args_digest(args), "timeoutSeconds": 3600})

    answers = [wait_for_decision(i) for i in range(limits.PENDING_APPROVALS_PER_ATTEMPT + 10)]
    codes = [status for status, _ in answers]
    assert codes == [200] * limits.PENDING_APPROVALS_PER_ATTEMPT + [429] * 10, answers[-1]
    assert answers[-1][1]["error"] == (
        f"attempt 1 of run {run.name} has {limits.PENDING_APPROVALS_PER_ATTEMPT} calls "
        f"waiting for a decision: one attempt may have at most "
        f"{limits.PENDING_APPROVALS_PER_ATTEMPT}; this call was not written down")
    pending = query(pg_store, lambda e: store.approvals_of(e, run.uid))
    assert len(pending) == limits.PENDING_APPROVALS_PER_ATTEMPT
    # The same call asked again (its first answer lost) is the same wait, not a new one.
    assert wait_for_decision(0)[0] == 200

    # Usage of ever new model names: the cap on names, then 429; the names it took are
    # labels only when the price map knows them (gemini-2.5-flash), else `other`.
    def report(model: str) -> tuple[int, Any]:
        return call(api.url, "POST", "/v1/usage", token,
                    {"model": model, "inputTokens": 10, "outputTokens": 5})

    assert report("gemini-2.5-flash")[0] == 200
    flood = [report(f"made-up-{i}") for i in range(limits.MODEL_NAMES_PER_RUN + 20)]
    taken = limits.MODEL_NAMES_PER_RUN - 1
    assert [s for s, _ in flood] == [200] * taken + [429] * 21, flood[-1]
    assert flood[-1][1]["error"] == (
        f"run {run.name} reported the usage of {limits.MODEL_NAMES_PER_RUN} model names: "
        f"one run may report at most {limits.MODEL_NAMES_PER_RUN}; this report was not "
        "stored")
    # A name the run has already reported is still counted.
    assert report("made-up-0")[0] == 200
    assert _label_values(api, "agentrun_model_calls_total", "model") == {
        "gemini-2.5-flash", "other"}
    assert api.metric("agentrun_model_calls_total", namespace=run.namespace,
                      agent="support-agent", model="other") == taken + 1
