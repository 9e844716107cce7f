"""Model retries that never repeat a side effect (the rules, on a scripted model driven
by ADK's own Runner, the plugin installed as the runner installs it)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from agentrun_runner.retries import (
    MAX_RETRY_DELAY_SECONDS,
    CallWatch,
    EmptyModelTurn,
    ModelRetries,
    RateLimitedAfterToolCall,
    calls_in_current_turn,
    rate_limit_of,
    retry_delay,
)
from agentrun_runner.scripted import ScriptedLlm, rate_limit_error
from google.adk.agents.callback_context import CallbackContext
from google.adk.agents.invocation_context import InvocationContext
from google.adk.agents.llm_agent import LlmAgent
from google.adk.apps.app import App
from google.adk.models.llm_request import LlmRequest
from google.adk.runners import Runner
from google.adk.sessions.in_memory_session_service import InMemorySessionService
from google.genai import types

SENT: list[str] = []


def send_email(to: str) -> dict[str, str]:
    """Sends an email."""
    SENT.append(to)
    return {"status": "sent"}


class Model:
    """A scripted agent and its retry plugin, run turn by turn in one session."""

    def __init__(self, script: list[dict[str, Any]],
                 sessions: InMemorySessionService | None = None) -> None:
        self.slept: list[float] = []

        async def sleep(seconds: float) -> None:
            self.slept.append(seconds)

        self.llm = ScriptedLlm(script=script)
        self.agent = LlmAgent(name="agent", instruction="help", tools=[send_email],
                              model=self.llm)
        self.plugin = ModelRetries({self.agent.name: self.llm}, CallWatch(), sleep=sleep)
        self.sessions = sessions or InMemorySessionService()
        self.runner = Runner(app=App(name="retries", root_agent=self.agent,
                                     plugins=[self.plugin]),
                             session_service=self.sessions)

    def turn(self, text: str = "refund please") -> str:
        """One user message; the final answer's text (raises what the run raised)."""

        async def go() -> str:
            if await self.sessions.get_session(app_name="retries", user_id="u",
                                               session_id="s") is None:
                await self.sessions.create_session(app_name="retries", user_id="u",
                                                   session_id="s")
            answer = ""
            message = types.Content(role="user", parts=[types.Part(text=text)])
            async for event in self.runner.run_async(user_id="u", session_id="s",
                                                     new_message=message):
                if event.error_code:
                    # As the runner does: ADK reports a failure as an error event; the
                    # rules' own failures were kept.
                    if self.plugin.watch.failures:
                        raise self.plugin.watch.failures[0]
                    raise RuntimeError(f"{event.error_code}: {event.error_message}")
                if event.is_final_response() and event.content:
                    answer = "".join(p.text or "" for p in event.content.parts or [])
            return answer

        return asyncio.run(go())


def test_429_before_any_call_is_retried_twice_with_the_server_delay() -> None:
    model = Model([{"error": 429, "retry_delay": 7}, {"error": 429, "retry_delay": 90},
                   {"text": "ok"}])
    assert model.turn() == "ok"
    assert model.slept == [7, MAX_RETRY_DELAY_SECONDS]


def test_a_third_429_is_not_retried() -> None:
    model = Model([{"error": 429}] * 3 + [{"text": "never"}])
    with pytest.raises(RuntimeError, match="RESOURCE_EXHAUSTED"):
        model.turn()
    assert len(model.slept) == 2


def test_429_after_a_function_call_in_this_invocation_is_not_retried() -> None:
    SENT.clear()
    model = Model([{"call": "send_email", "args": {"to": "x"}}, {"error": 429}])
    with pytest.raises(RateLimitedAfterToolCall, match="send_email") as stop:
        model.turn()
    assert model.plugin.watch.failures == [stop.value]
    assert model.slept == []
    assert SENT == ["x"]


def test_429_after_a_call_seen_only_in_the_request_is_not_retried() -> None:
    # A resumed invocation: this process has seen no call, but the request's current turn
    # holds one.
    turn = [
        types.Content(role="user", parts=[types.Part(text="refund")]),
        types.Content(role="model", parts=[types.Part(
            function_call=types.FunctionCall(name="update_crm", args={}))]),
        types.Content(role="user", parts=[types.Part(
            function_response=types.FunctionResponse(name="update_crm", response={}))]),
    ]
    model = Model([{"text": "never"}])

    async def go() -> None:
        session = await model.sessions.create_session(app_name="retries", user_id="u")
        context = CallbackContext(InvocationContext(
            session_service=model.sessions, invocation_id="e-1", agent=model.agent,
            session=session))
        await model.plugin.on_model_error_callback(
            callback_context=context, llm_request=LlmRequest(contents=turn),
            error=rate_limit_error(1))

    with pytest.raises(RateLimitedAfterToolCall, match="update_crm"):
        asyncio.run(go())
    assert model.slept == []


def test_calls_of_earlier_chat_turns_do_not_count() -> None:
    history = [
        types.Content(role="user", parts=[types.Part(text="turn 1")]),
        types.Content(role="model", parts=[types.Part(
            function_call=types.FunctionCall(name="send_email", args={}))]),
        types.Content(role="user", parts=[types.Part(
            function_response=types.FunctionResponse(name="send_email", response={}))]),
        types.Content(role="model", parts=[types.Part(text="sent")]),
        types.Content(role="user", parts=[types.Part(text="turn 2")]),
    ]
    assert calls_in_current_turn(history) == []
    assert calls_in_current_turn(history[:3]) == ["send_email"]
    # The same session, turn by turn, each in its own runner process.
    first = Model([{"call": "send_email", "args": {"to": "x"}}, {"text": "sent"}])
    assert first.turn("turn 1") == "sent"
    second = Model([{"error": 429, "retry_delay": 0}, {"text": "ok"}], first.sessions)
    assert second.turn("turn 2") == "ok"
    assert second.slept == [0]


def test_an_empty_turn_is_retried_once_then_fails() -> None:
    model = Model([{"empty": True}, {"text": "second try"}])
    assert model.turn() == "second try"
    model = Model([{"empty": True}, {"empty": True}, {"text": "never"}])
    with pytest.raises(EmptyModelTurn):
        model.turn()


def test_an_empty_turn_then_a_429_is_retried_after_the_delay() -> None:
    model = Model([{"empty": True}, {"error": 429, "retry_delay": 3}, {"text": "ok"}])
    assert model.turn() == "ok"
    assert model.slept == [3]


def test_the_scripted_429_reads_like_gemini() -> None:
    error = rate_limit_error(12)
    assert rate_limit_of(RuntimeError("wrapped")) is None
    wrapped = RuntimeError("model failed")
    wrapped.__cause__ = error
    assert rate_limit_of(wrapped) is error
    assert (error.code, error.status) == (429, "RESOURCE_EXHAUSTED")
    assert retry_delay(error) == 12.0


def test_a_script_that_runs_out_answers_with_its_last_text() -> None:
    model = Model([{"text": "first"}, {"text": "last"}])
    assert [model.turn() for _ in range(3)] == ["first", "last", "last"]


def test_a_resumed_script_continues_after_the_turns_its_history_holds() -> None:
    from agentrun_runner.scripted import model_turns, resume_position
    from google.genai import types

    script = [{"call": "read_message"}, {"sleep": 1}, {"call": "send_email"},
              {"error": 429}, {"text": "done"}]
    user = types.Content(role="user", parts=[types.Part(text="refund please")])
    model = types.Content(role="model", parts=[types.Part(text="...")])
    answer = types.Content(role="user", parts=[types.Part(function_response=(
        types.FunctionResponse(name="read_message", response={})))])
    assert model_turns([user]) == 0
    assert model_turns([user, model, answer]) == 1
    assert model_turns([user, model, answer, model, answer]) == 2
    # An earlier chat turn does not count: the user spoke since.
    assert model_turns([user, model, user, model, answer]) == 1
    assert resume_position(script, 0) == 0
    assert resume_position(script, 1) == 1  # the sleep before send_email is still to come
    assert resume_position(script, 2) == 3  # the 429 after it is played again


def test_a_providers_429_through_litellm_or_anthropic_is_a_rate_limit() -> None:
    import anthropic
    import httpx
    import litellm

    request = httpx.Request("POST", "http://127.0.0.1:1/v1/chat/completions")
    limited = httpx.Response(429, headers={"retry-after": "3"}, request=request)
    for error in (
        litellm.RateLimitError("slow down", llm_provider="openai", model="m", response=limited),
        anthropic.RateLimitError("slow down", response=limited, body=None),
    ):
        wrapped = RuntimeError("model failed")
        wrapped.__cause__ = error
        assert rate_limit_of(wrapped) is error
        assert retry_delay(error) == 3.0
    other = httpx.Response(500, request=request)
    assert rate_limit_of(anthropic.InternalServerError("down", response=other, body=None)) is None
