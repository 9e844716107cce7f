"""Tool effects and idempotency keys: what a tool does to the world, said once.

Every tool has one effect class:

- `ReadOnly`: touches nothing (a lookup); an in-doubt call of it runs again on resume.
- `Idempotent`: running it twice with the same idempotency key has the effect of once;
  an in-doubt call runs again with the same key.
- `Effectful` (the default): anything else; an in-doubt call is not run again, and the
  resume is refused `ToolCallInDoubt` unless forced.

How a tool says so: the agent's code (`@read_only`, `@idempotent`, `@effectful`), the
Agent's `effects`, the AgentRun's `spec.tools`, an MCP tool's annotations (`readOnlyHint`
-> ReadOnly, `idempotentHint` -> Idempotent), else Effectful. A less trusted source may
only make a tool stricter than a more trusted one said (agentrun.policy: the launch
refuses a run that loosens), so once the policy holds the run's word is the strictest and
is applied first.

Each of these decorators also marks a function as a tool the image ships: an Agent's
`tools[].function` resolves only to a function of the runner image's agents directory so
marked (`@tool` marks one that declares nothing else), never to any importable callable.

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


# Where a function says it is a tool the image ships (any decorator below sets it).
_TOOL: Final = "__agentrun_tool__"
# Order of strictness: a less trusted source may move a tool only rightwards.
STRICTNESS: Final[Mapping[str, int]] = {READ_ONLY: 0, IDEMPOTENT: 1, EFFECTFUL: 2}


def tool(func: F) -> F:
    """Marks a function as a tool of the image that an Agent may name in
    `tools[].function`, declaring nothing else (its effect is Effectful unless a source
    says otherwise)."""
    setattr(func, _TOOL, True)
    return func


def is_tool(func: Any) -> bool:
    """Whether a function was marked as a tool by one of this module's decorators."""
    return getattr(func, _TOOL, False) is True


def read_only(func: F) -> F:
    """Declares a tool function ReadOnly: it touches nothing."""
    setattr(func, _ATTRIBUTE, READ_ONLY)
    return tool(func)


def idempotent(func: F) -> F:
    """Declares a tool function Idempotent: it passes `idempotency_key(tool_context)` to
    whatever dedupes (an Idempotency-Key header, a message id, a unique column)."""
    setattr(func, _ATTRIBUTE, IDEMPOTENT)
    return tool(func)


def effectful(func: F) -> F:
    """Declares a tool function Effectful (as an undeclared one is), so that no Agent or
    run may call it ReadOnly or Idempotent: an in-doubt call of it is never run again."""
    setattr(func, _ATTRIBUTE, EFFECTFUL)
    return tool(func)


# Where a tool function says its calls wait for a human's decision.
_APPROVAL: Final = "__agentrun_requires_approval__"


def requires_approval(func: F) -> F:
    """Declares that each call of a tool function waits for an AgentRunApproval before it
    runs (no Agent or run can lift it: agentrun.policy)."""
    setattr(func, _APPROVAL, True)
    return tool(func)


def declared_effect(tool: Any) -> str | None:
    """The effect class the code of an ADK tool (or a function) declares, if any."""
    for holder in (tool, getattr(tool, "func", None)):
        declared = getattr(holder, _ATTRIBUTE, None)
        if declared in ALL:
            return str(declared)
    return None


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
    declared = declared_effect(tool)
    if declared is not None:
        return declared
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
