"""Structured logs: one event per line, key=value, with run name and attempt on each."""

from __future__ import annotations

import logging
import sys
from datetime import UTC, datetime
from typing import Any

_context: dict[str, Any] = {}
_logger = logging.getLogger("agentrun.runner")


def _quote(value: Any) -> str:
    text = str(value)
    if text == "" or any(c in text for c in ' "=\n\t'):
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    return text


def format_event(event: str, level: str, fields: dict[str, Any]) -> str:
    """One log line: `ts=... level=... event=... run=... attempt=... key=value ...`."""
    stamp = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    merged = {"ts": stamp, "level": level, "event": event, **_context, **fields}
    return " ".join(f"{k}={_quote(v)}" for k, v in merged.items() if v is not None)


class _KeyValueFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        fields: dict[str, Any] = getattr(record, "fields", {})
        event = getattr(record, "event", None)
        if event is None:  # a library's log record
            fields = {"logger": record.name, "msg": record.getMessage()}
            event = "library"
        line = format_event(event, record.levelname.lower(), fields)
        if record.exc_info and record.exc_info[1] is not None:
            line += " error=" + _quote(f"{type(record.exc_info[1]).__name__}: {record.exc_info[1]}")
        return line


def setup(level: int = logging.INFO) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_KeyValueFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)
    _logger.setLevel(level)


def bind(**fields: Any) -> None:
    """Fields added to every later line (run, attempt, agent)."""
    _context.update(fields)


def info(event: str, **fields: Any) -> None:
    _logger.info(event, extra={"event": event, "fields": fields})


def warning(event: str, **fields: Any) -> None:
    _logger.warning(event, extra={"event": event, "fields": fields})


def error(event: str, **fields: Any) -> None:
    _logger.error(event, extra={"event": event, "fields": fields})
