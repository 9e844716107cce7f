"""Prometheus metrics of the operator (served on --metrics-port when it is set)."""

from __future__ import annotations

from prometheus_client import Counter, start_http_server

RUNS_SETTLED = Counter(
    "agentrun_runs_settled_total",
    "Run attempts settled by this operator, by phase and reason.",
    ["phase", "reason"],
)
ATTEMPTS_RETRIED = Counter(
    "agentrun_attempts_retried_total",
    "New attempts started because the failed one provably called no tool.",
    ["after"],
)
TOOLS_UNKNOWN = Counter(
    "agentrun_tools_unknown_total",
    "Runs settled while the run store could not be read (toolsExecuted null).",
)


def serve(port: int) -> None:
    """Starts the /metrics endpoint on `port` (0: none)."""
    if port:
        start_http_server(port)
