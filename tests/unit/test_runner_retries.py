"""Model retries that never repeat a side effect (the rules, on a scripted model)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from agentrun_runner.retries import (
    MAX_RETRY_DELAY_SECONDS,
    CallWatch,
    EmptyModelTurn,
    GuardedLlm,
    RateLimitedAfterToolCall,
    calls_in_current_turn,
    rate_limit_of,
    retry_delay,
)
from agentrun_runner.scripted import ScriptedLlm, rate_limit_error
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.genai import errors, types


def guarded(script: list[dict[str, Any]]) -> tuple[GuardedLlm, list[float]]:
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    model = GuardedLlm.wrap(ScriptedLlm(script=script), CallWatch())
    model.sleep = sleep
    return model, slept


def call(model: GuardedLlm, contents: list[types.Content] | None = None) -> list[LlmResponse]:
    async def go() -> list[LlmResponse]:
        request = LlmRequest(contents=contents or [])
        return [r async for r in model.generate_content_async(request)]

    return asyncio.run(go())


def text_of(responses: list[LlmResponse]) -> str:
    return "".join(p.text or "" for r in responses if r.content for p in r.content.parts or [])


def test_429_before_any_call_is_retried_twice_with_the_server_delay() -> None:
    model, slept = guarded([{"error": 429, "retry_delay": 7}, {"error": 429, "retry_delay": 90},
                            {"text": "ok"}])
    assert text_of(call(model)) == "ok"
    assert slept == [7, MAX_RETRY_DELAY_SECONDS]


def test_a_third_429_is_not_retried() -> None:
    model, _ = guarded([{"error": 429}] * 3 + [{"text": "never"}])
    with pytest.raises(errors.ClientError):
        call(model)


def test_429_after_a_function_call_in_this_invocation_is_not_retried() -> None:
    model, slept = guarded([{"call": "send_email", "args": {"to": "x"}}, {"error": 429}])
    call(model)
    with pytest.raises(RateLimitedAfterToolCall, match="send_email"):
        call(model)
    assert slept == []


def test_429_after_a_call_seen_only_in_the_request_is_not_retried() -> None:
    turn = [
        types.Content(role="user", parts=[types.Part(text="refund")]),
        types.Content(role="model", parts=[types.Part(
            function_call=types.FunctionCall(name="update_crm", args={}))]),
        types.Content(role="user", parts=[types.Part(
            function_response=types.FunctionResponse(name="update_crm", response={}))]),
    ]
    model, _ = guarded([{"error": 429}])
    with pytest.raises(RateLimitedAfterToolCall, match="update_crm"):
        call(model, turn)


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
    model, _ = guarded([{"error": 429, "retry_delay": 0}, {"text": "ok"}])
    assert text_of(call(model, history)) == "ok"


def test_an_empty_turn_is_retried_once_then_fails() -> None:
    model, _ = guarded([{"empty": True}, {"text": "second try"}])
    assert text_of(call(model)) == "second try"
    model, _ = guarded([{"empty": True}, {"empty": True}, {"text": "never"}])
    with pytest.raises(EmptyModelTurn):
        call(model)


def test_the_scripted_429_reads_like_gemini() -> None:
    error = rate_limit_error(12)
    assert rate_limit_of(RuntimeError("wrapped")) is None
    wrapped = RuntimeError("model failed")
    wrapped.__cause__ = error
    assert rate_limit_of(wrapped) is error
    assert (error.code, error.status) == (429, "RESOURCE_EXHAUSTED")
    assert retry_delay(error) == 12.0


def test_a_script_that_runs_out_answers_with_its_last_text() -> None:
    model, _ = guarded([{"text": "first"}, {"text": "last"}])
    assert [text_of(call(model)) for _ in range(3)] == ["first", "last", "last"]


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
