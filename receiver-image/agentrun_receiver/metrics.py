"""Prometheus metrics of the receiver (served on --metrics-port when it is set).

Label values are bounded: a namespace and trigger only once the trigger was found (a
delivery to a name that does not exist, or before the API server could say, is counted
with both empty), and a result from TriggerResult.ALL.
"""

from __future__ import annotations

from prometheus_client import Counter, disable_created_metrics, start_http_server

disable_created_metrics()

EVENTS = Counter(
    "agentrun_trigger_events_total",
    "Deliveries to triggers, by namespace, trigger and result (created, duplicate, "
    "unauthorized, too_large, malformed, rate_limited, unavailable, conflict).",
    ["namespace", "trigger", "result"])


def serve(port: int) -> None:
    if port:
        start_http_server(port)
