"""A run only tightens (pure): who may say what a tool does, and who may not loosen it.

Sources of a tool's effect and approval, most trusted first: the chart's policy (the chart
value `toolPolicy`, the operator's `--tool-policy`), the runner image's code (`@read_only`,
`@idempotent`, `@effectful`, `@requires_approval`, ADK's `require_confirmation`), the
Agent's `effects`, the run's `spec.tools`. A less trusted source may add an approval or a
stricter effect; it may not lift an approval a more trusted one requires, nor make an
effect less strict (`ReadOnly` < `Idempotent` < `Effectful`). A tool no more trusted source
speaks of may be declared by anyone, as before. Once no source loosens another, what
applies is the strictest of what was said (`effective`).

Admission refuses what loosens the chart's policy (the chart's `agentrun-tool-policy`); the
operator decides it at launch for what it knows (the chart's policy, the Agent's effects
and the run's spec.tools); the runner decides it again with the image's code, before the
first model call. A violation fails the run `PolicyViolation`, toolsExecuted `[]`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from agentrun import effects
from agentrun.vocabulary import Approval

CHART: Final = "the chart's policy"
CODE: Final = "the runner image's code"
AGENT: Final = "the Agent's effects"
RUN: Final = "the run's spec.tools"


@dataclass(frozen=True)
class Declared:
    """What one source says of one tool: its effect class, and whether its calls wait
    for an approval (True: Required; False: None said outright; None: nothing said)."""

    source: str
    effect: str | None = None
    approval: bool | None = None


@dataclass(frozen=True)
class Violation:
    """A less trusted source loosening what a more trusted one declared of a tool."""

    tool: str
    source: str
    contradicts: str
    what: str

    @property
    def message(self) -> str:
        return (f"{self.source} {self.what} for the tool {self.tool}, which {self.contradicts} "
                f"declares stricter: a less trusted source may only add an approval or a "
                "stricter effect, never lift one. No tool was called; remove or tighten the "
                "entry and create the run again.")


def violation(tool: str, said: Sequence[Declared]) -> Violation | None:
    """The first loosening among `said` (most trusted first), if any."""
    for i, lesser in enumerate(said):
        for greater in said[:i]:
            if greater.approval is True and lesser.approval is False:
                return Violation(tool, lesser.source, greater.source,
                                 f"says approval {Approval.NONE}")
            above = effects.STRICTNESS.get(greater.effect or "")
            below = effects.STRICTNESS.get(lesser.effect or "")
            if above is not None and below is not None and below < above:
                return Violation(tool, lesser.source, greater.source,
                                 f"says {lesser.effect} (where it says {greater.effect})")
    return None


def of_rules(source: str, rules: Iterable[Mapping[str, Any]]) -> dict[str, Declared]:
    """spec.tools entries (the run's, or an Agent's effects), by tool name."""
    found: dict[str, Declared] = {}
    for rule in rules:
        approval = rule.get("approval")
        found[str(rule.get("name") or "")] = Declared(
            source, rule.get("effect") or None,
            None if approval is None else approval == Approval.REQUIRED)
    return found


def agent_rules(snapshot: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """Every Agent's `effects` of a snapshot (agentrun.agents keeps one rule per tool)."""
    return [rule for spec in (snapshot.get("agents") or {}).values()
            for rule in spec.get("effects") or []]


def effective(said: Sequence[Declared]) -> Declared:
    """What applies to a tool of which `said` was said (each source's word, any order), once
    none loosens another: the strictest effect said, and approval Required when any source
    requires one, None when one said None and none requires one, else nothing (the source
    of the answer: the source of its effect, if any)."""
    stated = [d for d in said if d.effect in effects.STRICTNESS]
    strictest = max(stated, key=lambda d: effects.STRICTNESS[d.effect or ""], default=None)
    approvals = [d.approval for d in said if d.approval is not None]
    return Declared(strictest.source if strictest else "", strictest.effect if strictest
                    else None, (True in approvals) if approvals else None)


def first_violation(sources: Sequence[Mapping[str, Declared]]) -> Violation | None:
    """The first loosening over every tool any source names (`sources`: each source's
    declarations by tool name, most trusted first), tools in name order."""
    tools = sorted({name for declared in sources for name in declared})
    for tool in tools:
        found = violation(tool, [declared[tool] for declared in sources if tool in declared])
        if found is not None:
            return found
    return None


def rules_problem(raw: str) -> str:
    """What is wrong with the chart's policy (JSON: a list of {name, effect, approval,
    approvalTimeoutSeconds}, as a run's spec.tools), or "" (the operator refuses to start
    with it; the runner reads it the same way)."""
    import json

    if not raw.strip():
        return ""
    try:
        data = json.loads(raw)
    except ValueError as e:
        return f"not JSON: {e}"
    if not isinstance(data, list):
        return "must be a list of {name, effect, approval}"
    for i, rule in enumerate(data):
        if not isinstance(rule, dict) or not isinstance(rule.get("name"), str) or not rule[
                "name"]:
            return f"entry {i} needs a name"
        if set(rule) - {"name", "effect", "approval", "approvalTimeoutSeconds"}:
            return (f"entry {rule['name']} has {', '.join(sorted(set(rule) - {'name'}))}; an "
                    "entry has name, effect, approval and approvalTimeoutSeconds")
        if rule.get("effect") is None and rule.get("approval") is None:
            return f"entry {rule['name']} says neither an effect nor an approval"
        if rule.get("effect") is not None and rule["effect"] not in effects.ALL:
            return f"entry {rule['name']}: effect must be one of {', '.join(effects.ALL)}"
        if rule.get("approval") is not None and rule["approval"] not in (
                Approval.REQUIRED, Approval.NONE):
            return (f"entry {rule['name']}: approval must be {Approval.REQUIRED} or "
                    f"{Approval.NONE}")
        timeout = rule.get("approvalTimeoutSeconds")
        if timeout is not None and (not isinstance(timeout, int) or isinstance(timeout, bool)
                                    or timeout < 1):
            return f"entry {rule['name']}: approvalTimeoutSeconds must be a whole number >= 1"
    return ""


def chart_rules(raw: str) -> list[Mapping[str, Any]]:
    """The chart's policy (`rules_problem` holds), as spec.tools entries; [] when empty."""
    import json

    if rules_problem(raw):
        raise ValueError(f"the chart's tool policy: {rules_problem(raw)}")
    return list(json.loads(raw)) if raw.strip() else []
