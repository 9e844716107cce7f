"""Prometheus metrics of the store API (served on --metrics-port when it is set).

Served inside the operator on the development cluster, they join the operator's on its
registry: no name here is one of the operator's. Every label value is a word of ours (a
route's name from routes.ROUTES, an HTTP status), never a request path. docs/operator.md
has the table; the chart's dashboard reads only these names.
"""

from __future__ import annotations

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
# namespace and agent as the store recorded them for the attempt, the model as the runner
# names it (models.model_label keeps that label to a bounded word).
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


def model_label(model: str) -> str:
    """A model's name as a label value: at most 64 characters of [A-Za-z0-9._/:@-],
    else `other` (a runner names its model; a label must not grow without bound)."""
    if 0 < len(model) <= 64 and all(c.isalnum() or c in "._/:@-" for c in model):
        return model
    return "other"


def serve(port: int) -> None:
    """Serves /metrics on `port` (0: not at all)."""
    if port:
        start_http_server(port)
