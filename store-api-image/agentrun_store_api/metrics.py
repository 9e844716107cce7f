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


def serve(port: int) -> None:
    """Serves /metrics on `port` (0: not at all)."""
    if port:
        start_http_server(port)
