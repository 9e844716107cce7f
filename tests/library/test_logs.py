"""`--log-format json`: one JSON object per line, the key=value pairs of our lines as
fields; the flag and AGENTRUN_LOG_FORMAT reach both programs."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from agentrun_operator import config
from agentrun_store_api import main as store_api

from agentrun import logs


@pytest.mark.parametrize(("line", "expected"), [
    ("event=settled run=ns/triage attempt=2 phase=Failed reason=Evicted tools=['send_email']",
     {"event": "settled", "run": "ns/triage", "attempt": 2, "phase": "Failed",
      "reason": "Evicted", "tools": ["send_email"]}),
    ("event=refused path=/v1/ledger status=409 run=- message='the ledger never rewrites'",
     {"event": "refused", "path": "/v1/ledger", "status": 409, "run": "-",
      "message": "the ledger never rewrites"}),
    ("event=store-settle-failed run=a error=OperationalError('connection refused (5432)')",
     {"event": "store-settle-failed", "run": "a",
      "error": "OperationalError('connection refused (5432)')"}),
    ("event=started store=postgresql+psycopg://u:***@db/x?sslmode=require tools=None",
     {"event": "started", "store": "postgresql+psycopg://u:***@db/x?sslmode=require",
      "tools": None}),
    ("event=settled tools=[] pod=\"it's 1\"", {"event": "settled", "tools": [], "pod": "it's 1"}),
    ("Namespace t1: the operator cannot create pods", {}),
])
def test_fields_of_a_line(line: str, expected: dict[str, Any]) -> None:
    assert logs.fields(line) == expected


def _record(message: str, *args: Any, exc: bool = False) -> logging.LogRecord:
    info = None
    if exc:
        try:
            raise RuntimeError("boom")
        except RuntimeError:
            import sys
            info = sys.exc_info()
    return logging.LogRecord("agentrun.operator", logging.WARNING, __file__, 1, message, args,
                             info)


def test_one_object_per_line_with_the_fields() -> None:
    line = logs.JsonFormatter().format(_record(
        "event=%s run=%s/%s attempt=%s message=%r", "retry", "ns", "think-1", 2,
        "Attempt 1 failed\nbefore any tool"))
    assert "\n" not in line
    got = json.loads(line)
    assert got["level"] == "WARNING" and got["logger"] == "agentrun.operator"
    assert got["time"].endswith("Z") and "T" in got["time"]
    assert got["message"].startswith("event=retry run=ns/think-1 attempt=2 ")
    assert (got["event"], got["run"], got["attempt"]) == ("retry", "ns/think-1", 2)
    # A field named like one of the object's own keys does not replace it.
    assert got["message_"] == "Attempt 1 failed\nbefore any tool"


def test_an_exception_is_one_field_of_the_same_line() -> None:
    line = logs.JsonFormatter().format(_record("event=reconcile-failed kind=run", exc=True))
    assert "\n" not in line
    got = json.loads(line)
    assert got["event"] == "reconcile-failed"
    assert "RuntimeError: boom" in got["exception"]


def test_the_operator_flag_and_its_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    base = ["--store-api-listen=", "--store-api-url=https://store:8080"]
    assert config.parse(base).log_format == "text"
    assert config.parse([*base, "--log-format=json"]).log_format == "json"
    monkeypatch.setenv("AGENTRUN_LOG_FORMAT", "json")
    assert config.parse(base).log_format == "json"
    with pytest.raises(SystemExit):
        config.parse([*base, "--log-format=yaml"])


@pytest.fixture
def root_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


@pytest.mark.parametrize("how", ["flag", "env"])
def test_the_store_api_logs_json_from_main(
        how: str, root_logging: None, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("DATABASE_URL", raising=False)
    argv = ["--log-format=json"] if how == "flag" else []
    if how == "env":
        monkeypatch.setenv("AGENTRUN_LOG_FORMAT", "json")
    assert store_api.main(argv) == 2  # no run store: it stops there, logging configured
    logging.getLogger("agentrun.store_api").info("event=store-ready replicas=%s", 2)
    lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("{")]
    assert [json.loads(x)["event"] for x in lines] == ["store-ready"]
    assert json.loads(lines[0])["replicas"] == 2


def test_text_stays_the_default(root_logging: None, monkeypatch: pytest.MonkeyPatch,
                                capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("DATABASE_URL", raising=False)
    monkeypatch.delenv("AGENTRUN_LOG_FORMAT", raising=False)
    assert store_api.main([]) == 2
    logging.getLogger("agentrun.store_api").info("event=store-ready")
    err = capsys.readouterr().err
    assert "level=INFO logger=agentrun.store_api event=store-ready" in err
