"""A LiteLLM model (`openai/<name>`) end to end: the real runner program against a fake
OpenAI-compatible server on loopback, which speaks the chat-completions wire format and
checks what a real provider checks: every tool result names the call it answers, by the
id that call was given.

The second case is a server that leaves a tool call's id empty (some OpenAI-compatible
servers do): ADK gives the call an `adk-` id of its own, and keeps it in later requests
only when it sees that the model is a LiteLlm (a provider that pairs calls and results by
id). A wrapper around the model hides that, ADK strips the id, and the call and its
result can no longer be paired.

Then the provider's own 429s: retried while no tool has been called, and the run stopped
(RateLimitedAfterToolCall) once one has.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

from agentrun import store
from agentrun.vocabulary import Reason, RunnerEnv, RunnerExit
from tests.runner.runs import EMAIL, Run, launch, prepare_run, query, runner_env

pytestmark = pytest.mark.postgres

API_KEY = "sk-test-from-a-secret"


@dataclass
class FakeProvider:
    """/v1/chat/completions: first a call of send_email, then (once its result is paired
    with it) a final answer."""

    call_id: str = "call_refund_1"
    # Rate limits: the first `limited` requests are answered 429, and with
    # `limited_after_call` every request that carries a tool result is too.
    limited: int = 0
    limited_after_call: bool = False
    requests: list[dict[str, Any]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    url: str = ""

    async def completions(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append(body)
        if request.headers.get("Authorization") != f"Bearer {API_KEY}":
            return self.refuse(401, f"bad key: {request.headers.get('Authorization')!r}")
        if body.get("stream"):
            return self.refuse(400, "this server does not stream")
        tools = [t["function"]["name"] for t in body.get("tools") or []]
        if "send_email" not in tools:
            return self.refuse(400, f"send_email is not among the tools: {tools}")
        messages = body["messages"]
        results = [m for m in messages if m.get("role") == "tool"]
        if len(self.requests) <= self.limited or (results and self.limited_after_call):
            return web.json_response(
                {"error": {"message": "Rate limit reached for requests", "type": "requests",
                           "code": "rate_limit_exceeded"}},
                status=429, headers={"retry-after": "0"})
        if not results:
            return self.answer({"role": "assistant", "content": None, "tool_calls": [{
                "id": self.call_id, "type": "function",
                "function": {"name": "send_email", "arguments": json.dumps(EMAIL)}}]},
                "tool_calls")
        calls = [c for m in messages if m.get("role") == "assistant"
                 for c in m.get("tool_calls") or []]
        asked = [c.get("id") for c in calls]
        answered = [m.get("tool_call_id") for m in results]
        if len(asked) != 1 or not asked[0] or answered != asked:
            return self.refuse(400, f"tool results {answered} do not pair with calls {asked}")
        return self.answer({"role": "assistant", "content": "Emailed the customer."}, "stop")

    def refuse(self, status: int, problem: str) -> web.Response:
        self.problems.append(problem)
        return web.json_response({"error": {"message": problem, "type": "invalid_request_error",
                                            "code": None}}, status=status)

    def answer(self, message: dict[str, Any], finish: str) -> web.Response:
        return web.json_response({
            "id": f"chatcmpl-{len(self.requests)}", "object": "chat.completion",
            "created": int(time.time()), "model": "fake-model",
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": 12, "completion_tokens": 7, "total_tokens": 19},
        })


@pytest.fixture
def provider(request: pytest.FixtureRequest) -> Iterator[FakeProvider]:
    """The fake provider on a free loopback port, served from its own thread."""
    fake = FakeProvider(**getattr(request, "param", {}))
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    app = web.Application()
    app.router.add_post("/v1/chat/completions", fake.completions)
    runner = web.AppRunner(app)

    def serve() -> None:
        asyncio.set_event_loop(loop)

        async def start() -> None:
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            fake.url = f"http://127.0.0.1:{port}/v1"
            ready.set()

        loop.run_until_complete(start())
        loop.run_forever()
        loop.run_until_complete(runner.cleanup())
        loop.close()

    thread = threading.Thread(target=serve, name="fake-provider", daemon=True)
    thread.start()
    assert ready.wait(30), "the fake provider did not start"
    try:
        yield fake
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)


def run_through_litellm(run: Run, provider: FakeProvider) -> subprocess.CompletedProcess[str]:
    env = runner_env(run, None)
    env.update({
        RunnerEnv.MODEL: "openai/fake-model",
        # What LiteLLM reads for the openai provider; in a cluster they come from
        # spec.env (the key from a Secret).
        "OPENAI_API_BASE": provider.url,
        "OPENAI_API_KEY": API_KEY,
        "NO_PROXY": "127.0.0.1,localhost",
        "no_proxy": "127.0.0.1,localhost",
    })
    return launch(env)


@pytest.mark.parametrize("provider", [{"call_id": "call_refund_1"}, {"call_id": ""}],
                         indirect=True, ids=["provider-id", "no-provider-id"])
def test_an_openai_model_through_litellm_calls_a_tool_and_pairs_its_result(
    pg_store: str, provider: FakeProvider
) -> None:
    run = prepare_run(pg_store, "litellm-1")
    done = run_through_litellm(run, provider)
    assert done.returncode == RunnerExit.SUCCESS, (
        f"exit {done.returncode}; provider saw: {provider.problems}\n{done.stderr[-4000:]}")
    assert provider.problems == []
    assert len(provider.requests) == 2

    # The function-call id survived: the second request pairs the result with the call.
    second = provider.requests[1]["messages"]
    call = next(c for m in second if m.get("role") == "assistant"
                for c in m.get("tool_calls") or [])
    result = next(m for m in second if m.get("role") == "tool")
    assert call["function"]["name"] == "send_email"
    assert result["tool_call_id"] == call["id"]
    if provider.call_id:
        assert call["id"] == provider.call_id
    else:
        assert call["id"].startswith("adk-")
    assert json.loads(result["content"]) == {"status": "sent", "to": EMAIL["to"]}

    # The tool ran once, and the ledger recorded it under that same call id.
    sent = [r for r in query(pg_store, lambda e: store.outbox(e, run.name))
            if r.tool == "send_email"]
    assert len(sent) == 1
    entries = query(pg_store, lambda e: store.ledger(e, run.uid))
    assert [(x.tool, x.outcome) for x in entries] == [("send_email", "ok")]
    assert entries[0].call_id == call["id"]
    got = query(pg_store, lambda e: store.get_outcome(e, run.uid, 1))
    assert got is not None and got.status == "succeeded"
    assert query(pg_store, lambda e: store.tools_executed(e, run.uid, 1)) == ["send_email"]


# The OpenAI client retries a 429 twice by itself (3 requests per model call) before
# LiteLLM raises its RateLimitError; the runner's rules take it from there.


@pytest.mark.parametrize("provider", [{"limited": 3}], indirect=True)
def test_a_providers_rate_limit_before_any_call_is_retried(
    pg_store: str, provider: FakeProvider
) -> None:
    run = prepare_run(pg_store, "litellm-429")
    done = run_through_litellm(run, provider)
    assert done.returncode == RunnerExit.SUCCESS, done.stderr[-4000:]
    # 3 refused (one model call), then the call of send_email and the answer.
    assert len(provider.requests) == 5
    assert query(pg_store, lambda e: store.tools_executed(e, run.uid, 1)) == ["send_email"]


@pytest.mark.parametrize("provider", [{"limited_after_call": True}], indirect=True)
def test_a_providers_rate_limit_after_a_call_stops_the_run(
    pg_store: str, provider: FakeProvider
) -> None:
    run = prepare_run(pg_store, "litellm-429-after")
    done = run_through_litellm(run, provider)
    assert done.returncode == RunnerExit.RATE_LIMITED_AFTER_TOOL_CALL, done.stderr[-4000:]
    got = query(pg_store, lambda e: store.get_outcome(e, run.uid, 1))
    assert got is not None and got.reason == Reason.RATE_LIMITED_AFTER_TOOL_CALL
    assert got.message and "send_email" in got.message
    # The model was not asked again after the client's own retries gave up.
    assert len(provider.requests) == 1 + 3
    sent = [r for r in query(pg_store, lambda e: store.outbox(e, run.name))
            if r.tool == "send_email"]
    assert len(sent) == 1
