"""How the operator and the store API write their logs: one event per line, either
key=value text (the default) or one JSON object (`--log-format json`).

Every line of ours is already `event=... run=ns/name attempt=2 ...`; in JSON those pairs
become fields of the object, next to time, level, logger and message (the whole line, so
that a search for the text finds it in either format). A value written with %r (a
message with spaces, an error) is read back as the string it was; numbers, None, True,
False and lists become JSON numbers, null, booleans and arrays.
"""

from __future__ import annotations

import ast
import datetime
import json
import logging
import re
import sys
from typing import Any

FORMATS = ("text", "json")
TEXT = "ts=%(asctime)s level=%(levelname)s logger=%(name)s %(message)s"
# The object's own keys; a pair of the same name is kept with a trailing underscore.
RESERVED = frozenset({"time", "level", "logger", "message", "exception"})

_KEY = re.compile(r"(?:^|(?<=\s))([A-Za-z_][A-Za-z0-9_.-]*)=")
_INT = re.compile(r"-?\d+")
_OPENING = {"(": ")", "[": "]", "{": "}"}


def fields(message: str) -> dict[str, Any]:
    """The key=value pairs of one log line, in order (text that is not a pair is left
    out: it stays in the message)."""
    found: dict[str, Any] = {}
    at = 0
    while True:
        match = _KEY.search(message, at)
        if match is None:
            return found
        raw, at = _value(message, match.end())
        found[match.group(1)] = _decode(raw)


def _value(text: str, start: int) -> tuple[str, int]:
    """The value starting at `start`, up to the first blank outside quotes and brackets
    (an exception's repr, `OperationalError('connection refused')`, is one value)."""
    closing: list[str] = []
    quote = ""
    i = start
    while i < len(text):
        c = text[i]
        if quote:
            if c == "\\":
                i += 1
            elif c == quote:
                quote = ""
        elif c in "'\"":
            quote = c
        elif c in _OPENING:
            closing.append(_OPENING[c])
        elif closing and c == closing[-1]:
            closing.pop()
        elif c.isspace() and not closing:
            break
        i += 1
    return text[start:i], i


def _decode(raw: str) -> Any:
    if _INT.fullmatch(raw):
        return int(raw)
    if raw in ("None", "True", "False") or (raw[:1] in "'\"[" and raw[-1:] in "'\"]"
                                             and len(raw) > 1):
        try:
            value = ast.literal_eval(raw)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            return raw
        if value is None or isinstance(value, str | bool | int | float | list):
            return value
    return raw


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time (UTC, RFC 3339 with milliseconds), level, logger,
    message, the message's key=value pairs, and the traceback of an exception."""

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        stamp = datetime.datetime.fromtimestamp(record.created, datetime.UTC)
        line: dict[str, Any] = {
            "time": stamp.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname, "logger": record.name, "message": message,
        }
        for key, value in fields(message).items():
            line[f"{key}_" if key in RESERVED else key] = value
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        elif record.stack_info:
            line["exception"] = self.formatStack(record.stack_info)
        return json.dumps(line, default=str, ensure_ascii=False)


def configure(log_format: str, level: int = logging.INFO) -> None:
    """The process's logging: to stderr, in `log_format` ("text" or "json")."""
    if log_format not in FORMATS:
        raise ValueError(f"log format must be one of {', '.join(FORMATS)}, not {log_format!r}")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(TEXT))
    logging.basicConfig(level=level, handlers=[handler], force=True)
