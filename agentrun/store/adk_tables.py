"""ADK's session tables as the store reads and writes them without ADK.

ADK's DatabaseSessionService creates and owns these tables (its schema v1, which ADK 2.x
writes): the store API serves sessions through ADK itself, and the operator, which
carries no ADK, reads and copies them here by column name. Only the columns the store
uses are declared; nothing here creates or alters a table.

JSON columns are JSONB on Postgres and JSON text elsewhere, as ADK stores them.
Timestamps are naive UTC, as ADK stores them.
"""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import Column, DateTime, Dialect, MetaData, String, Table, Text
from sqlalchemy.dialects import postgresql
from sqlalchemy.types import TypeDecorator, TypeEngine


class StoredJSON(TypeDecorator[dict[str, Any]]):
    """A JSON object column: JSONB on Postgres, JSON text on other databases."""

    impl = Text
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        if dialect.name == "postgresql":
            return dialect.type_descriptor(postgresql.JSONB())
        return dialect.type_descriptor(Text())

    def process_bind_param(self, value: dict[str, Any] | None,
                           dialect: Dialect) -> dict[str, Any] | str | None:
        if value is None or dialect.name == "postgresql":
            return value
        return json.dumps(value)

    def process_result_value(self, value: Any, dialect: Dialect) -> dict[str, Any] | None:
        if value is None or dialect.name == "postgresql":
            return value
        decoded = json.loads(value)
        return decoded if isinstance(decoded, dict) else None


_adk = MetaData()

sessions = Table(
    "sessions", _adk,
    Column("app_name", String(128), primary_key=True),
    Column("user_id", String(128), primary_key=True),
    Column("id", String(128), primary_key=True),
    Column("state", StoredJSON),
    Column("create_time", DateTime),
    Column("update_time", DateTime),
)

events = Table(
    "events", _adk,
    Column("id", String(128), primary_key=True),
    Column("app_name", String(128), primary_key=True),
    Column("user_id", String(128), primary_key=True),
    Column("session_id", String(128), primary_key=True),
    Column("invocation_id", String(256)),
    Column("timestamp", DateTime),
    Column("event_data", StoredJSON),
)


def session_is(app_name: str, user_id: str, session_id: str) -> tuple[Any, ...]:
    """The `where` of one session's row."""
    return (sessions.c.app_name == app_name, sessions.c.user_id == user_id,
            sessions.c.id == session_id)


def events_of(app_name: Any, user_id: Any, session_id: Any) -> tuple[Any, ...]:
    """The `where` of one session's events (values, or bound parameters by name)."""
    return (events.c.app_name == app_name, events.c.user_id == user_id,
            events.c.session_id == session_id)
