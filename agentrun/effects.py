"""Tool effects and idempotency keys: what a tool does to the world, said once.

Every tool has one effect class:

- `ReadOnly`: touches nothing (a lookup); an in-doubt call of it runs again on resume.
- `Idempotent`: running it twice with the same idempotency key has the effect of once;
  an in-doubt call runs again with the same key.
- `Effectful` (the default): anything else; an in-doubt call is not run again, and the
  resume is refused `ToolCallInDoubt` unless forced.

How a tool says so, first match wins: the AgentRun's `spec.tools` (a platform team's
override), a declaration in the agent's code (`@read_only`, `@idempotent`), an MCP tool's
annotations (`readOnlyHint` -> ReadOnly, `idempotentHint` -> Idempotent), else Effectful.

Idempotency keys come from stable intent, never from generated content: inside a tool,
`idempotency_key(tool_context)` is the key of this logical call, the same every time this
recorded call is run (in the original attempt, in an attempt that resumes it, in a resumed
replay run of it) and different for every other call. It derives from the root run of the
lineage and the call's identity in the journal, never from the arguments (a model
rewrites those).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from typing import Any, Final, TypeVar

READ_ONLY: Final = "ReadOnly"
IDEMPOTENT: Final = "Idempotent"
EFFECTFUL: Final = "Effectful"
ALL: Final = (READ_ONLY, IDEMPOTENT, EFFECTFUL)

# Where a declaration lives on the tool's function.
_ATTRIBUTE: Final = "__agentrun_effect__"
# The root run of this process's lineage (set by the runner from the store API).
_lineage: list[str] = []

F = TypeVar("F", bound=Callable[..., Any])


def read_only(func: F) -> F:
    """Declares a tool function ReadOnly: it touches nothing."""
    setattr(func, _ATTRIBUTE, READ_ONLY)
    return func


def idempotent(func: F) -> F:
    """Declares a tool function Idempotent: it passes `idempotency_key(tool_context)` to
    whatever dedupes (an Idempotency-Key header, a message id, a unique column)."""
    setattr(func, _ATTRIBUTE, IDEMPOTENT)
    return func


# Where a tool function says its calls wait for a human's decision.
_APPROVAL: Final = "__agentrun_requires_approval__"


def requires_approval(func: F) -> F:
    """Declares that each call of a tool function waits for an AgentRunApproval before it
    runs (a run's spec.tools[].approval overrides this either way)."""
    setattr(func, _APPROVAL, True)
    return func


def declares_approval(tool: Any) -> bool:
    """Whether an ADK tool's function was declared `requires_approval`."""
    return any(getattr(holder, _APPROVAL, False) is True
               for holder in (tool, getattr(tool, "func", None)))


def _hint(annotations: Any, *names: str) -> bool:
    for name in names:
        value = annotations.get(name) if isinstance(annotations, Mapping) else getattr(
            annotations, name, None)
        if value is True:
            return True
    return False


def effect_of(tool: Any, overrides: Mapping[str, str] | None = None) -> str:
    """The effect class of an ADK tool (a FunctionTool, an MCP tool, any BaseTool)."""
    name = str(getattr(tool, "name", "") or "")
    if overrides and overrides.get(name) in ALL:
        return str(overrides[name])
    for holder in (tool, getattr(tool, "func", None)):
        declared = getattr(holder, _ATTRIBUTE, None)
        if declared in ALL:
            return str(declared)
    mcp = getattr(tool, "_mcp_tool", None)
    annotations = getattr(mcp, "annotations", None) if mcp is not None else None
    if annotations is not None:
        if _hint(annotations, "readOnlyHint", "read_only_hint"):
            return READ_ONLY
        if _hint(annotations, "idempotentHint", "idempotent_hint"):
            return IDEMPOTENT
    return EFFECTFUL


def key_for(root_run_uid: str, call_id: str) -> str:
    """The idempotency key of recorded call `call_id` in the lineage of `root_run_uid`."""
    digest = hashlib.sha256(f"agentrun-idempotency-v1\n{root_run_uid}\n{call_id}".encode())
    return f"agentrun-{digest.hexdigest()[:40]}"


def bind_lineage(root_run_uid: str) -> None:
    """The runner says which lineage its calls belong to (the root run's uid)."""
    _lineage[:] = [root_run_uid]


def idempotency_key(tool_context: Any) -> str:
    """The key of the call this tool is making now (see the module docstring): the root
    run of the lineage and the call's id in the journal (the model's function call, which
    a resumed attempt or a forked session keeps)."""
    call_id = getattr(tool_context, "function_call_id", None)
    if not _lineage or not call_id:
        raise LookupError("no idempotency key: tools get one when agentrun-runner runs them")
    return key_for(_lineage[0], str(call_id))


def args_digest(args: Mapping[str, Any]) -> str:
    """`sha256:<hex>` of a call's arguments, canonical JSON (the ledger keeps no values:
    they may be personal data). The runner and the store compute it alike."""
    encoded = json.dumps(args, sort_keys=True, separators=(",", ":"), default=repr)
    return "sha256:" + hashlib.sha256(encoded.encode("utf-8")).hexdigest()
