"""The console's guard (who may reach it at all) and the cost chart's series: pure
decisions, one row a case, as the tables in guard.py and views.py say them."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from agentrun_kubectl.console import guard, views
from agentrun_kubectl.console.guard import Request, Verdict

PORT, TOKEN = 8089, "s3cret-token"
HOST = f"127.0.0.1:{PORT}"


def req(method: str = "GET", host: str | None = HOST, query: str | None = None,
        cookie: str | None = TOKEN, origin: str | None = None,
        site: str | None = None) -> Request:
    return Request(method, host, query, cookie, origin, site)


@pytest.mark.parametrize(("request_", "verdict"), [
    # Host: only this console's own names and port (DNS rebinding).
    (req(host="evil.example:8089"), Verdict.WRONG_HOST),
    (req(host="127.0.0.1:8090"), Verdict.WRONG_HOST),
    (req(host=None), Verdict.WRONG_HOST),
    (req(host="127.0.0.1"), Verdict.WRONG_HOST),
    (req(host="LOCALHOST:8089"), Verdict.SERVE),
    (req(host="evil.example:8089", query=TOKEN), Verdict.WRONG_HOST),
    # The URL's token is exchanged for the cookie, on a GET only.
    (req(cookie=None, query=TOKEN), Verdict.EXCHANGE),
    (req(cookie=None, query="wrong"), Verdict.UNAUTHORIZED),
    (req(method="POST", cookie=None, query=TOKEN, origin=f"http://{HOST}"),
     Verdict.UNAUTHORIZED),
    # Without the cookie, nothing.
    (req(cookie=None), Verdict.UNAUTHORIZED),
    (req(cookie="wrong"), Verdict.UNAUTHORIZED),
    (req(cookie=""), Verdict.UNAUTHORIZED),
    (req(), Verdict.SERVE),
    # A state change: the cookie and a same-origin header.
    (req(method="POST"), Verdict.CROSS_SITE),
    (req(method="POST", origin="http://evil.example"), Verdict.CROSS_SITE),
    (req(method="POST", origin=f"http://127.0.0.1:{PORT + 1}"), Verdict.CROSS_SITE),
    (req(method="POST", origin="null"), Verdict.CROSS_SITE),
    (req(method="POST", site="cross-site"), Verdict.CROSS_SITE),
    (req(method="POST", origin="http://evil.example", site="same-origin"), Verdict.CROSS_SITE),
    (req(method="POST", origin=f"http://{HOST}"), Verdict.SERVE),
    (req(method="POST", origin=f"http://localhost:{PORT}"), Verdict.SERVE),
    (req(method="POST", site="same-origin"), Verdict.SERVE),
    (req(method="DELETE", site="same-site"), Verdict.CROSS_SITE),
    (req(method="POST", cookie=None, origin=f"http://{HOST}"), Verdict.UNAUTHORIZED),
])
def test_the_guard(request_: Request, verdict: Verdict) -> None:
    assert guard.admit(request_, port=PORT, token=TOKEN) is verdict


def test_the_cookie_name_carries_the_port() -> None:
    assert guard.cookie_name(8089) != guard.cookie_name(8090)
    assert "8089" in guard.cookie_name(8089)


def record(ns: str, agent: str, created: str, cost: int | None) -> dict[str, Any]:
    usage = {} if cost is None else {"costMicroUSD": cost}
    return {"metadata": {"namespace": ns, "name": "r", "creationTimestamp": created},
            "spec": {"agent": agent}, "status": {"phase": "Succeeded", "usage": usage}}


def test_cost_per_namespace_and_agent_per_day_counts_unpriced_runs_apart() -> None:
    now = datetime(2026, 5, 10, 12, tzinfo=UTC)
    shown = views.cost_series([
        record("support", "triage", "2026-05-10T09:00:00Z", 1500),
        record("support", "triage", "2026-05-10T10:00:00Z", 500),
        record("support", "triage", "2026-05-08T10:00:00Z", 250),
        record("support", "triage", "2026-05-09T10:00:00Z", None),  # no price: unknown
        record("billing", "refund", "2026-05-09T23:59:59Z", 7),
        record("billing", "refund", "2026-05-01T10:00:00Z", 99),  # before the window
    ], days=3, now=now)
    assert shown["days"] == ["2026-05-08", "2026-05-09", "2026-05-10"]
    assert shown["series"] == [
        {"namespace": "billing", "agent": "refund", "costMicroUSD": [0, 7, 0],
         "totalMicroUSD": 7, "runs": 1, "unpricedRuns": 0},
        {"namespace": "support", "agent": "triage", "costMicroUSD": [250, 0, 2000],
         "totalMicroUSD": 2250, "runs": 4, "unpricedRuns": 1},
    ]


def test_a_run_under_kueue_shows_its_queue_and_one_without_shows_none() -> None:
    run: dict[str, Any] = {"metadata": {"name": "a", "namespace": "n",
                                        "labels": {"kueue.x-k8s.io/queue-name": "team"}},
                           "status": {"phase": "Pending", "conditions": [
                               {"type": "Admitted", "status": "False", "reason": "Queued",
                                "message": "waiting for quota"}]}}
    assert views.run_row(run)["queue"] == {"queue": "team", "admitted": "False",
                                           "reason": "Queued", "message": "waiting for quota"}
    plain = {"metadata": {"name": "b", "namespace": "n"}, "status": {"phase": "Running"}}
    assert views.run_row(plain)["queue"] is None
