"""History compaction: large payloads in old function responses leave the model request.

A tool that returned a base64 file or a data blob would otherwise be re-sent on every
later model call of the run, costing tokens and sometimes the context window. The latest
content is never touched: the model must see what it just received.
"""

from __future__ import annotations

from typing import Any

from google.adk.agents.callback_context import CallbackContext
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.plugins.base_plugin import BasePlugin
from google.genai import types

STRIP_AT_CHARS = 4000


def strip_large_strings(value: Any, limit: int = STRIP_AT_CHARS) -> tuple[Any, bool]:
    """`value` with every string of `limit`+ characters replaced by `<stripped: N chars>`,
    at any depth; and whether anything was replaced. The input is not modified."""
    if isinstance(value, str):
        if len(value) >= limit:
            return f"<stripped: {len(value)} chars>", True
        return value, False
    if isinstance(value, dict):
        changed = False
        out: dict[Any, Any] = {}
        for k, v in value.items():
            out[k], c = strip_large_strings(v, limit)
            changed = changed or c
        return (out, True) if changed else (value, False)
    if isinstance(value, list | tuple):
        items = [strip_large_strings(v, limit) for v in value]
        if any(c for _, c in items):
            return type(value)(v for v, _ in items), True
        return value, False
    return value, False


def compact_content(content: types.Content, limit: int = STRIP_AT_CHARS) -> types.Content:
    """The content with large strings stripped from its function responses (a copy if
    anything changed; the same object otherwise, so session events are never mutated)."""
    if not content.parts:
        return content
    parts = []
    changed = False
    for part in content.parts:
        response = part.function_response
        if response is not None and response.response is not None:
            stripped, c = strip_large_strings(response.response, limit)
            if c:
                part = part.model_copy(
                    update={"function_response": response.model_copy(update={"response": stripped})}
                )
                changed = True
        parts.append(part)
    return content.model_copy(update={"parts": parts}) if changed else content


def compact_history(
    contents: list[types.Content], limit: int = STRIP_AT_CHARS
) -> list[types.Content]:
    """Every content but the latest, compacted; the latest as it is."""
    if len(contents) <= 1:
        return list(contents)
    return [compact_content(c, limit) for c in contents[:-1]] + [contents[-1]]


class CompactionPlugin(BasePlugin):
    def __init__(self, limit: int = STRIP_AT_CHARS) -> None:
        super().__init__(name="agentrun_compaction")
        self.limit = limit

    async def before_model_callback(
        self, *, callback_context: CallbackContext, llm_request: LlmRequest
    ) -> LlmResponse | None:
        llm_request.contents = compact_history(llm_request.contents, self.limit)
        return None
