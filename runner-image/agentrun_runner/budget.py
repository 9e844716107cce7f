"""A run's limits (spec.limits), enforced before each model call and each tool call, and
the usage that counts against them, reported to the store after each model call.

The count is the whole run's: what the store recorded for the run's earlier attempts (and,
for a manual resume, for the run it resumes) is where this attempt starts (the store API
says so at `begin`); the runner adds its own calls as they happen. One attempt runs at a
time, so the sum it keeps is the store's. A limit reached stops the run before the call:
the 51st model call is not made, the 21st tool call is not started (no ledger row, no
effect), and the run fails `BudgetExceeded` with the journal intact, so it can be resumed
with raised limits.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agentrun_runner.prices import Price, price_of
from agentrun_runner.stops import AttemptStop


@dataclass(frozen=True)
class Limits:
    """spec.limits; None: no limit of that kind."""

    max_model_calls: int | None = None
    max_tool_calls: int | None = None
    max_tokens: int | None = None
    max_cost_micro_usd: int | None = None

    @classmethod
    def parse(cls, raw: str) -> Limits:
        """spec.limits as the operator passes it (JSON); ValueError when malformed."""
        data = json.loads(raw) if raw else {}
        if not isinstance(data, dict):
            raise ValueError("the limits must be a JSON object")

        def field(name: str) -> int | None:
            value = data.get(name)
            if value is None:
                return None
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"limits.{name} must be a non-negative integer")
            return value

        return cls(field("maxModelCalls"), field("maxToolCalls"), field("maxTokens"),
                   field("maxCostMicroUSD"))


@dataclass
class Counted:
    """The run's usage so far (cost None: some call's price is unknown)."""

    model_calls: int = 0
    tool_calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_micro_usd: int | None = 0

    @classmethod
    def of(cls, data: Mapping[str, Any] | None) -> Counted:
        """The usage the store API reports (its camelCase fields)."""
        data = data or {}
        cost = data.get("costMicroUSD", 0)
        return cls(int(data.get("modelCalls") or 0), int(data.get("toolCalls") or 0),
                   int(data.get("inputTokens") or 0), int(data.get("outputTokens") or 0),
                   None if cost is None else int(cost))

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens


class BudgetExceeded(AttemptStop):
    """A limit of spec.limits was reached: the call it guards was not made."""


def _calls(n: int, what: str) -> str:
    return f"{n:,} {what}" + ("" if n == 1 else "s")


def unpriced(limits: Limits, models: list[str],
             overrides: Mapping[str, Price]) -> str | None:
    """Why a cost limit cannot be kept (a model of the run has no known price), or None."""
    if limits.max_cost_micro_usd is None:
        return None
    for model in models:
        if price_of(model, overrides) is None:
            return (f"spec.limits.maxCostMicroUSD is set, and model {model} has no known "
                    "price (LiteLLM's price map does not list it, nor does the operator's "
                    "modelPrices), so its cost cannot be limited; no model call was made. "
                    f"Give {model} a price in the chart's modelPrices, or drop the limit.")
    return None


class Budget:
    """The run's limits against its usage; raises BudgetExceeded before a call past one."""

    def __init__(self, limits: Limits, counted: Counted,
                 overrides: Mapping[str, Price] | None = None) -> None:
        self.limits = limits
        self.counted = counted
        self._overrides = dict(overrides or {})

    def _reached(self) -> str:
        c = self.counted
        spent = f"{c.tokens:,} tokens"
        if c.cost_micro_usd is not None and self.limits.max_cost_micro_usd is not None:
            spent += f", {c.cost_micro_usd:,} micro-USD"
        return f"after {_calls(c.model_calls, 'model call')} ({spent})"

    def before_model(self) -> None:
        """Raises when the next model call would go past a limit."""
        c, lim = self.counted, self.limits
        for name, limit, used in (("maxModelCalls", lim.max_model_calls, c.model_calls),
                                  ("maxTokens", lim.max_tokens, c.tokens),
                                  ("maxCostMicroUSD", lim.max_cost_micro_usd,
                                   c.cost_micro_usd)):
            if limit is not None and used is not None and used >= limit:
                raise BudgetExceeded(f"{name} {limit:,} reached {self._reached()}; no "
                                     "further call was made.")

    def before_tools(self, tools: list[str]) -> None:
        """Raises when the tool calls a model response asks for would go past
        maxToolCalls: checked before the response reaches the session, so that none of
        them is in the record as called (all or nothing, for calls asked for together)."""
        limit = self.limits.max_tool_calls
        if limit is not None and tools and self.counted.tool_calls + len(tools) > limit:
            asked = ", ".join(tools)
            raise BudgetExceeded(
                f"maxToolCalls {limit:,} reached after "
                f"{_calls(self.counted.tool_calls, 'tool call')} ({self._reached()}); "
                f"{asked} {'was' if len(tools) == 1 else 'were'} not started.")

    def tool_started(self, tool: str) -> None:
        """Counts a tool call that starts (a call the journal answers does not); one that
        would go past maxToolCalls (a call in doubt run again on resume) raises instead."""
        self.before_tools([tool])
        self.counted.tool_calls += 1

    def model_called(self, model: str, input_tokens: int, output_tokens: int) -> int | None:
        """Counts one model call; returns its cost (None: the model has no known price)."""
        price = price_of(model, self._overrides)
        cost = None if price is None else price.micro_usd(input_tokens, output_tokens)
        c = self.counted
        c.model_calls += 1
        c.input_tokens += input_tokens
        c.output_tokens += output_tokens
        c.cost_micro_usd = None if cost is None or c.cost_micro_usd is None else \
            c.cost_micro_usd + cost
        return cost
