"""Prometheus metrics of the store API (served on --metrics-port when it is set).

No name here is one of the operator's: a dashboard reads both programs' without telling
them apart. Every label value is a word of ours (a
route's name from routes.ROUTES, an HTTP status), never a request path. docs/operator.md
has the table; the chart's dashboard reads only these names.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Iterable
from functools import cache
from pathlib import Path

from prometheus_client import Counter, Histogram, disable_created_metrics, start_http_server

# No `_created` series beside every counter: nothing here reads them.
disable_created_metrics()
# A ledger row takes a few milliseconds; a store that hangs, up to the client's 30 s.
_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
            30.0)

LEDGER_WRITE_DURATION = Histogram(
    "agentrun_ledger_write_duration_seconds",
    "Store API handling time of a ledger write (open: POST /v1/ledger, close: POST "
    "/v1/ledger/{seq}/close), authentication included, by operation and HTTP code.",
    ["operation", "code"],
    buckets=_BUCKETS,
)
STORE_API_ERRORS = Counter(
    "agentrun_store_api_errors_total",
    "Store API requests the run store failed (answered 503), by route.",
    ["route"],
)
REFUSALS = Counter(
    "agentrun_store_api_refusals_total",
    "Store API requests refused, by route and HTTP code (401/403: the token; 400/404/409: "
    "the request; 413: too large; 429: over a limit of the attempt; 503: not now).",
    ["route", "code"],
)
TOKEN_REVIEWS = Counter(
    "agentrun_store_api_token_reviews_total",
    "TokenReviews the store API asked the Kubernetes API server for, by result "
    "(authenticated, refused, failed); refused tokens are then answered from memory.",
    ["result"],
)


# A run's model usage, as its runner reports each call (agentrun_store_api.routes.usage):
# namespace and agent as the store recorded them for the attempt (an agent's name a label
# for the first few of a namespace: agent_label), the model as the runner names it, as a
# label only when the price map or the chart's modelPrices knows it (model_label): a
# runner names its model, a tenant its Agents, and the label set must stay bounded.
MODEL_CALLS = Counter(
    "agentrun_model_calls_total", "Model calls of runs, by namespace, agent and model.",
    ["namespace", "agent", "model"])
MODEL_TOKENS = Counter(
    "agentrun_model_tokens_total",
    "Tokens of runs' model calls, from the model's own usage report, by namespace, agent, "
    "model and kind (input, output).", ["namespace", "agent", "model", "kind"])
MODEL_COST = Counter(
    "agentrun_model_cost_micro_usd_total",
    "Estimated cost of runs' model calls in millionths of a US dollar (calls of a model "
    "with no known price are not counted), by namespace, agent and model.",
    ["namespace", "agent", "model"])


# LiteLLM's bundled price map, read as data (LiteLLM is never imported here).
_LITELLM_MAP = "model_prices_and_context_window_backup.json"
# The chart's modelPrices names (price_models), on top of the map's.
_PRICED: set[str] = set()


# The store API image carries the map alone, copied from LiteLLM's wheel (its Dockerfile);
# elsewhere (a development checkout) it is LiteLLM's own file.
_IMAGE_MAP = Path(sys.prefix) / "share" / "agentrun" / "model_prices.json"


@cache
def _litellm_models() -> frozenset[str]:
    path = _IMAGE_MAP
    if not path.exists():
        found = importlib.util.find_spec("litellm")
        if found is None or not found.origin:
            return frozenset()
        path = Path(found.origin).parent / _LITELLM_MAP
    try:
        loaded = json.loads(path.read_text())
    except (OSError, ValueError):
        return frozenset()
    return frozenset(str(k) for k in loaded) if isinstance(loaded, dict) else frozenset()


def price_models(names: Iterable[str]) -> None:
    """The chart's modelPrices names: labelled as they are, like the price map's."""
    _PRICED.update(names)


def price_models_of(raw: str) -> list[str]:
    """The model names of a modelPrices JSON ({model: {...}}), [] when there is none."""
    data = json.loads(raw) if raw else {}
    return [str(k) for k in data] if isinstance(data, dict) else []


def model_label(model: str) -> str:
    """A model's name as a label value, from a bounded set: the name when the chart's
    modelPrices or LiteLLM's price map holds it, or holds it as Gemini's API names it
    (`gemini/<model>`); the map's name without a provider prefix the map does not know
    (`any/gpt-4o` is `gpt-4o`, as the runner prices it: a prefix is not a new label);
    else `other`. A runner names its model: whatever it sends, the labels are at most
    the names of those two lists."""
    if not 0 < len(model) <= 64 or not all(c.isalnum() or c in "._/:@-" for c in model):
        return "other"
    known = _litellm_models()
    if model in _PRICED or model in known or f"gemini/{model}" in known:
        return model
    bare = model.split("/", 1)[1] if "/" in model else ""
    if bare in _PRICED or bare in known:
        return bare
    return "other"


# Agent names one namespace's usage is labelled with; past them, `other`. An agent's name is
# its creator's to choose (every new Agent a new name), so the label set is bounded here.
AGENT_LABELS_PER_NAMESPACE = 64
_AGENTS: dict[str, set[str]] = {}


def agent_label(namespace: str, agent: str) -> str:
    """An agent's name as a label value: the first AGENT_LABELS_PER_NAMESPACE names one
    namespace reports usage of (since the store API started) as they are, then `other`."""
    seen = _AGENTS.setdefault(namespace, set())
    if agent in seen:
        return agent
    if len(seen) < AGENT_LABELS_PER_NAMESPACE:
        seen.add(agent)
        return agent
    return "other"


def serve(port: int) -> None:
    """Serves /metrics on `port` (0: not at all)."""
    if port:
        start_http_server(port)
