"""Tool effects: who says what a tool does, first match wins; keys from intent only."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from google.adk.tools.function_tool import FunctionTool

from agentrun import effects


async def lookup() -> str:
    return "x"


@effects.read_only
async def declared_read() -> str:
    return "x"


@effects.idempotent
async def declared_idem() -> str:
    return "x"


def mcp(name: str, **hints: Any) -> Any:
    """An MCP tool as ADK wraps it: its protocol description in `_mcp_tool`."""
    return SimpleNamespace(name=name, _mcp_tool=SimpleNamespace(
        annotations=SimpleNamespace(**hints)))


@pytest.mark.parametrize(("tool", "overrides", "effect"), [
    pytest.param(FunctionTool(lookup), None, effects.EFFECTFUL, id="undeclared: Effectful"),
    pytest.param(FunctionTool(declared_read), None, effects.READ_ONLY, id="@read_only"),
    pytest.param(FunctionTool(declared_idem), None, effects.IDEMPOTENT, id="@idempotent"),
    pytest.param(FunctionTool(declared_read), {"declared_read": effects.EFFECTFUL},
                 effects.EFFECTFUL, id="spec.tools overrides the code"),
    pytest.param(FunctionTool(lookup), {"lookup": effects.READ_ONLY}, effects.READ_ONLY,
                 id="spec.tools declares an undeclared tool"),
    pytest.param(FunctionTool(lookup), {"other": effects.READ_ONLY}, effects.EFFECTFUL,
                 id="an override of another tool changes nothing"),
    pytest.param(mcp("search", readOnlyHint=True), None, effects.READ_ONLY,
                 id="MCP readOnlyHint"),
    pytest.param(mcp("put", idempotentHint=True), None, effects.IDEMPOTENT,
                 id="MCP idempotentHint"),
    pytest.param(mcp("put", readOnlyHint=True, idempotentHint=True), None, effects.READ_ONLY,
                 id="MCP both hints: ReadOnly"),
    pytest.param(mcp("send", readOnlyHint=False, idempotentHint=None), None,
                 effects.EFFECTFUL, id="MCP hints false or absent: Effectful"),
    pytest.param(mcp("search", readOnlyHint=True), {"search": effects.EFFECTFUL},
                 effects.EFFECTFUL, id="spec.tools overrides MCP"),
])
def test_effect_of(tool: Any, overrides: dict[str, str] | None, effect: str) -> None:
    assert effects.effect_of(tool, overrides) == effect


def test_keys_depend_on_the_lineage_and_the_call_never_the_arguments() -> None:
    effects.bind_lineage("root-uid")
    first = SimpleNamespace(function_call_id="adk-1", args={"to": "a"})
    again = SimpleNamespace(function_call_id="adk-1", args={"to": "b"})  # rewritten args
    other = SimpleNamespace(function_call_id="adk-2", args={"to": "a"})
    assert effects.idempotency_key(first) == effects.idempotency_key(again)
    assert effects.idempotency_key(first) != effects.idempotency_key(other)
    effects.bind_lineage("another-root")
    assert effects.idempotency_key(first) != effects.key_for("root-uid", "adk-1")
    with pytest.raises(LookupError):
        effects.idempotency_key(SimpleNamespace(function_call_id=None))
