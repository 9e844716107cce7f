"""Model retries that never repeat a side effect.

- An empty turn (no text, no function call) is retried once.
- A rate limit (429 / RESOURCE_EXHAUSTED) is retried at most twice, after the delay the
  server asks for (capped at 60 s), but ONLY while no function call has been seen in
  this invocation. After one, the run stops with RateLimitedAfterToolCall: whether to go
  on is a human's decision, because the world has already been touched.
The same code handles a real Gemini 429, the scripted model's {"error": 429}, and the 429
of a provider reached through LiteLLM or the Anthropic client.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Any

from google.adk.agents.callback_context import CallbackContext
from google.adk.agents.run_config import StreamingMode
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.plugins.base_plugin import BasePlugin
from google.genai import errors, types

MAX_RATE_LIMIT_RETRIES = 2
MAX_EMPTY_RETRIES = 1
MAX_RETRY_DELAY_SECONDS = 60.0
_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*s?\s*$")


class RateLimitedAfterToolCall(RuntimeError):
    """The model hit a rate limit after a function call was seen in this invocation."""

    def __init__(self, tools: list[str], cause: BaseException) -> None:
        called = ", ".join(tools) if tools else "a tool"
        super().__init__(
            f"The model hit a rate limit after this run had already called {called}; "
            "retrying automatically could repeat that side effect, so the run stopped. "
            "A human must decide: check what the tool did, then replay (force) or not."
        )
        self.tools = tools
        self.__cause__ = cause


class EmptyModelTurn(RuntimeError):
    """The model answered with neither text nor a function call, twice in a row."""

    def __init__(self) -> None:
        super().__init__(
            "The model returned an empty turn (no text, no function call) twice in a row, "
            "so the run has no answer. Check the model and the prompt, then replay."
        )


def causes(error: BaseException) -> Iterator[BaseException]:
    """`error`, then what caused it, and so on (each once)."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def rate_limit_of(error: BaseException) -> BaseException | None:
    """The rate-limit error in `error`'s chain, if any: the Gemini API's 429 /
    RESOURCE_EXHAUSTED, or another provider's HTTP 429 (LiteLLM's and the OpenAI and
    Anthropic clients' RateLimitError carry `status_code` 429)."""
    for e in causes(error):
        if isinstance(e, errors.APIError):
            if e.code == 429 or str(e.status or "").upper() == "RESOURCE_EXHAUSTED":
                return e
        elif getattr(e, "status_code", None) == 429:
            return e
    return None


def retry_delay(error: BaseException) -> float | None:
    """The delay the server asked for, in seconds: google.rpc.RetryInfo `retryDelay` in a
    Gemini error, else an HTTP `Retry-After` (in seconds) on the error's response."""
    if isinstance(error, errors.APIError):
        details: Any = error.details
        if isinstance(details, dict):
            details = details.get("error", details).get("details")
        for item in details if isinstance(details, list) else []:
            if isinstance(item, dict) and "retryDelay" in item:
                match = _DURATION.match(str(item["retryDelay"]))
                if match:
                    return float(match.group(1))
        return None
    headers = getattr(getattr(error, "response", None), "headers", None)
    after = headers.get("retry-after") if headers is not None else None
    match = _DURATION.match(str(after)) if after is not None else None
    return float(match.group(1)) if match else None


def _has_call(content: types.Content | None) -> bool:
    return bool(content and any(p.function_call for p in content.parts or []))


def _is_empty(response: LlmResponse) -> bool:
    parts = response.content.parts if response.content and response.content.parts else []
    return not any((p.text and p.text.strip()) or p.function_call for p in parts)


def calls_in_current_turn(contents: list[types.Content]) -> list[str]:
    """Names of the function calls after the latest user message (the current invocation
    of a chat session; earlier turns' calls belong to earlier runs)."""
    start = 0
    for i, content in enumerate(contents):
        parts = content.parts or []
        if content.role == "user" and not any(p.function_response for p in parts):
            start = i + 1
    return [
        p.function_call.name or "?"
        for c in contents[start:]
        for p in c.parts or []
        if p.function_call is not None
    ]


class CallWatch:
    """Function calls this runner process has seen (one process = one invocation), and
    the failures our own code raised inside ADK: ADK turns an exception into an error
    event, and the runner needs the original to report the right reason."""

    def __init__(self) -> None:
        self.tools: list[str] = []
        self.failures: list[BaseException] = []

    def failed(self, error: BaseException) -> BaseException:
        self.failures.append(error)
        return error

    def saw(self, response: LlmResponse) -> None:
        if response.content:
            for p in response.content.parts or []:
                if p.function_call is not None:
                    self.tools.append(p.function_call.name or "?")


class ModelRetries(BasePlugin):
    """The retry rules above, as an ADK plugin.

    Not a wrapper around the model: ADK decides from the model's class how to build its
    requests (it keeps its own `adk-*` function-call ids only for providers that pair tool
    calls with their results by id, such as LiteLlm and AnthropicLlm), and a wrapper would
    hide that class. ADK hands a failed model call to `on_model_error_callback` and every
    answer to `after_model_callback`; a retry calls the agent's own model again with the
    same request, and its answer takes the failed or empty one's place.
    """

    def __init__(
        self,
        models: Mapping[str, BaseLlm],
        watch: CallWatch,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        super().__init__(name="agentrun_model_retries")
        # Agent name -> the model ADK calls for it (the runner resolved them).
        self.models = dict(models)
        self.watch = watch
        self.sleep = sleep
        self._requests: dict[str, LlmRequest] = {}
        # The answer a retry produced: ADK shows it to after_model_callback too, where it
        # must not be judged (or counted) twice.
        self._settled: LlmResponse | None = None

    async def before_model_callback(
        self, *, callback_context: CallbackContext, llm_request: LlmRequest
    ) -> LlmResponse | None:
        # after_model_callback is not given the request; an empty turn is asked again
        # with it (by agent: agents of a ParallelAgent call their models side by side).
        self._requests[callback_context.agent_name] = llm_request
        return None

    async def on_model_error_callback(
        self, *, callback_context: CallbackContext, llm_request: LlmRequest, error: Exception
    ) -> LlmResponse | None:
        if rate_limit_of(error) is None:
            return None
        try:
            return await self._retry(callback_context, llm_request, error=error, empty=0)
        except Exception as given_up:
            if given_up is error:
                return None  # ADK raises the model's own error, unwrapped
            raise

    async def after_model_callback(
        self, *, callback_context: CallbackContext, llm_response: LlmResponse
    ) -> LlmResponse | None:
        if llm_response.partial or llm_response.error_code:
            return None
        if llm_response is self._settled:
            self._settled = None
            return None
        request = self._requests.get(callback_context.agent_name)
        if not _is_empty(llm_response) or request is None:
            self.watch.saw(llm_response)
            return None
        return await self._retry(callback_context, request, error=None, empty=0)

    async def _retry(
        self, context: CallbackContext, request: LlmRequest, *, error: Exception | None,
        empty: int,
    ) -> LlmResponse:
        """Asks the model again until it answers, or a rule says stop (then raises)."""
        rate_limited = 0
        while True:
            if error is not None:
                limit = rate_limit_of(error)
                if limit is None:
                    raise error
                called = self.watch.tools or calls_in_current_turn(request.contents)
                if called:
                    raise self.watch.failed(RateLimitedAfterToolCall(called, error)) from error
                if rate_limited >= MAX_RATE_LIMIT_RETRIES:
                    raise error
                rate_limited += 1
                delay = retry_delay(limit)
                if delay is None:
                    delay = 2.0**rate_limited
                await self.sleep(min(delay, MAX_RETRY_DELAY_SECONDS))
            else:
                if empty >= MAX_EMPTY_RETRIES:
                    raise self.watch.failed(EmptyModelTurn())
                empty += 1
            try:
                answer = await self._ask(context, request)
            except Exception as again:
                error = again
                continue
            error = None
            if answer is not None and not _is_empty(answer):
                self.watch.saw(answer)
                self._settled = answer
                return answer

    async def _ask(self, context: CallbackContext, request: LlmRequest) -> LlmResponse | None:
        """One more call of the agent's model: its final (non-partial) answer, if any."""
        model = self.models.get(context.agent_name)
        if model is None:
            raise LookupError(f"no model known for agent {context.agent_name!r}")
        config = context.run_config
        stream = bool(config and config.streaming_mode == StreamingMode.SSE)
        final = [r async for r in model.generate_content_async(request, stream)
                 if not r.partial]
        return final[-1] if final else None
