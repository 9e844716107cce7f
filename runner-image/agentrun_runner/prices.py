"""What a model call costs: LiteLLM's published price map, overridden per model by the
operator's `modelPrices` (AGENTRUN_MODEL_PRICES).

The map is read as the data file LiteLLM ships (its bundled copy), without importing
LiteLLM: importing it takes seconds, which every runner would pay before its first model
call, most of them for a Gemini model that never goes through LiteLLM.
"""

from __future__ import annotations

import importlib.util
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

# LiteLLM's bundled copy of its price map, beside its package.
_MAP_FILE = "model_prices_and_context_window_backup.json"


@dataclass(frozen=True)
class Price:
    """US dollars per million tokens, input and output."""

    input_per_million: float
    output_per_million: float

    def micro_usd(self, input_tokens: int, output_tokens: int) -> int:
        """The cost of one call in millionths of a dollar (a dollar per million tokens is
        a micro-dollar per token), rounded up: an estimate never below what was spent."""
        return math.ceil(input_tokens * self.input_per_million
                         + output_tokens * self.output_per_million - 1e-9)


@cache
def litellm_map() -> Mapping[str, Any]:
    """LiteLLM's price map, {} when LiteLLM is not installed (a runner image of its own)."""
    found = importlib.util.find_spec("litellm")
    if found is None or not found.origin:
        return {}
    path = Path(found.origin).parent / _MAP_FILE
    try:
        loaded = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def _from_map(entry: Any) -> Price | None:
    if not isinstance(entry, Mapping):
        return None
    per_in, per_out = entry.get("input_cost_per_token"), entry.get("output_cost_per_token")
    if not isinstance(per_in, int | float) or not isinstance(per_out, int | float):
        return None
    return Price(per_in * 1e6, per_out * 1e6)


def parse_overrides(raw: str) -> dict[str, Price]:
    """`modelPrices` as the operator passes it: {model: {inputUSDPerMillionTokens,
    outputUSDPerMillionTokens}} (JSON). Raises ValueError saying what is wrong."""
    if not raw:
        return {}
    data = json.loads(raw)
    if not isinstance(data, dict):
        raise ValueError("modelPrices must be an object of models")
    prices = {}
    for model, price in data.items():
        try:
            prices[str(model)] = Price(float(price["inputUSDPerMillionTokens"]),
                                       float(price["outputUSDPerMillionTokens"]))
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"modelPrices.{model} needs inputUSDPerMillionTokens and "
                             f"outputUSDPerMillionTokens as numbers: {e}") from e
    return prices


def price_of(model: str, overrides: Mapping[str, Price] | None = None) -> Price | None:
    """The price of `model`, or None when nobody knows it. The override first; then the
    map under the model's own name, then without its provider prefix (`openai/gpt-4o` is
    `gpt-4o` there), then as Gemini's API names it (`gemini/gemini-2.5-flash`)."""
    if overrides and model in overrides:
        return overrides[model]
    table = litellm_map()
    names = [model]
    if "/" in model:
        names.append(model.split("/", 1)[1])
    names.append(f"gemini/{model}")
    for name in names:
        found = _from_map(table.get(name))
        if found is not None:
            return found
    return None
