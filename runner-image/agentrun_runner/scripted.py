"""The `scripted` model: deterministic, offline runs from a JSON script in $AGENTRUN_SCRIPT.

One entry is consumed per model call (a retried call consumes the next one):
  {"call": "send_email", "args": {...}}   a function call
  {"text": "..."}                         a final answer
  {"sleep": 30}                           the model takes 30 s; the next entry is the answer
  {"error": 429, "retry_delay": 1}        the same error a real Gemini 429 raises
  {"empty": true}                         an empty turn (no text, no call)
Each answering entry may carry "usage": {"inputTokens": N, "outputTokens": M}, reported
as the model's usage (default 100 and 10).
A script that runs out answers with its last text.

A resumed attempt continues its script: on its first call, the model skips the entries
the request's history already answered (one per model turn of the current user turn).
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.genai import errors, types
from pydantic import PrivateAttr

from agentrun.vocabulary import ENV_SCRIPT, ENV_SCRIPT_TRANSCRIPT, SCRIPTED_MODEL

DEFAULT_RETRY_DELAY_SECONDS = 1.0
# What a script entry without "usage" counts (api.md: 100 input, 10 output tokens).
DEFAULT_USAGE = {"inputTokens": 100, "outputTokens": 10}


class ScriptError(ValueError):
    """$AGENTRUN_SCRIPT is missing or malformed."""


def parse_script(raw: str | None) -> list[dict[str, Any]]:
    """The script entries, validated; raises ScriptError with what is wrong."""
    if not raw:
        raise ScriptError(f"model {SCRIPTED_MODEL!r} needs a JSON list in ${ENV_SCRIPT}")
    try:
        script = json.loads(raw)
    except json.JSONDecodeError as e:
        raise ScriptError(f"${ENV_SCRIPT} is not valid JSON: {e}") from e
    if not isinstance(script, list) or not all(isinstance(e, dict) for e in script):
        raise ScriptError(f"${ENV_SCRIPT} must be a JSON list of objects")
    known = {"call", "text", "sleep", "error", "empty"}
    for i, entry in enumerate(script):
        if not known & entry.keys():
            raise ScriptError(f"${ENV_SCRIPT} entry {i} has none of {sorted(known)}: {entry}")
    return script


def model_turns(contents: list[types.Content]) -> int:
    """The model's turns since the user last said something (function responses are not
    the user speaking): what a resumed invocation's history already holds."""
    turns = 0
    for content in contents:
        if content.role == "user" and any(p.text for p in content.parts or []):
            turns = 0
        elif content.role == "model":
            turns += 1
    return turns


def resume_position(script: list[dict[str, Any]], turns: int) -> int:
    """The script entry after `turns` answered ones (calls and texts; the sleeps, errors
    and empty turns between them were played already too)."""
    position = answered = 0
    while position < len(script) and answered < turns:
        if "call" in script[position] or "text" in script[position]:
            answered += 1
        position += 1
    return position


def rate_limit_error(retry_delay: float) -> errors.ClientError:
    """A 429 shaped like the Gemini API's (status RESOURCE_EXHAUSTED, RetryInfo detail)."""
    return errors.ClientError(
        429,
        {
            "error": {
                "code": 429,
                "message": "Resource has been exhausted (e.g. check quota).",
                "status": "RESOURCE_EXHAUSTED",
                "details": [
                    {
                        "@type": "type.googleapis.com/google.rpc.RetryInfo",
                        "retryDelay": f"{retry_delay:g}s",
                    }
                ],
            }
        },
    )


def _api_error(code: int) -> errors.APIError:
    body = {"error": {"code": code, "message": f"scripted error {code}", "status": "ERROR"}}
    if code >= 500:
        return errors.ServerError(code, body)
    return errors.ClientError(code, body)


class ScriptedLlm(BaseLlm):
    """A BaseLlm that answers from a script instead of a model."""

    model: str = SCRIPTED_MODEL
    script: list[dict[str, Any]]
    transcript: str | None = None
    # Set when the attempt resumes a journal: the script goes on where the history ends.
    resuming: bool = False
    _position: int = PrivateAttr(default=0)
    _started: bool = PrivateAttr(default=False)

    @classmethod
    def from_env(cls, *, resuming: bool = False) -> ScriptedLlm:
        return cls(
            script=parse_script(os.environ.get(ENV_SCRIPT)),
            transcript=os.environ.get(ENV_SCRIPT_TRANSCRIPT) or None,
            resuming=resuming,
        )

    def _next(self) -> dict[str, Any] | None:
        if self._position >= len(self.script):
            return None
        entry = self.script[self._position]
        self._position += 1
        return entry

    def _last_text(self) -> str:
        texts = [e["text"] for e in self.script if "text" in e]
        return str(texts[-1]) if texts else ""

    def _record(self, llm_request: LlmRequest) -> None:
        if not self.transcript:
            return
        contents = [c.model_dump(mode="json", exclude_none=True) for c in llm_request.contents]
        with Path(self.transcript).open("a", encoding="utf-8") as f:
            f.write(json.dumps({"contents": contents}) + "\n")

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        self._record(llm_request)
        if self.resuming and not self._started:
            self._position = resume_position(self.script, model_turns(llm_request.contents))
        self._started = True
        entry = self._next()
        while entry is not None and "sleep" in entry:
            await asyncio.sleep(float(entry["sleep"]))
            entry = self._next()
        if entry is None:
            yield _text(self._last_text(), {})
        elif "error" in entry:
            code = int(entry["error"])
            if code == 429:
                raise rate_limit_error(float(entry.get("retry_delay", DEFAULT_RETRY_DELAY_SECONDS)))
            raise _api_error(code)
        elif entry.get("empty"):
            yield _answer([], entry)
        elif "call" in entry:
            call = types.FunctionCall(
                name=str(entry["call"]),
                args=dict(entry.get("args") or {}),
                id=f"scripted-{uuid.uuid4().hex[:12]}",
            )
            yield _answer([types.Part(function_call=call)], entry)
        else:
            yield _text(str(entry["text"]), entry)


def _answer(parts: list[types.Part], entry: dict[str, Any]) -> LlmResponse:
    # The usage the entry says, as a model reports it (so that tests of usage and limits
    # are exact): DEFAULT_USAGE without one.
    said = entry.get("usage") or {}
    prompt = int(said.get("inputTokens", DEFAULT_USAGE["inputTokens"]))
    output = int(said.get("outputTokens", DEFAULT_USAGE["outputTokens"]))
    usage = types.GenerateContentResponseUsageMetadata(
        prompt_token_count=prompt, candidates_token_count=output,
        total_token_count=prompt + output)
    return LlmResponse(content=types.Content(role="model", parts=parts), usage_metadata=usage)


def _text(text: str, entry: dict[str, Any]) -> LlmResponse:
    return _answer([types.Part(text=text)], entry)
