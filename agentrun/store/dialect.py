"""The one dialect difference the store needs: INSERT ... ON CONFLICT, spelled per
database (both Postgres and SQLite support it, through different SQLAlchemy insert types)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Table
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection


def upsert_insert(conn: AsyncConnection, table: Table) -> Any:
    """An insert construct of `conn`'s dialect, which has `on_conflict_do_*`."""
    if conn.dialect.name == "postgresql":
        return postgresql.insert(table)
    if conn.dialect.name == "sqlite":
        return sqlite.insert(table)
    raise NotImplementedError(f"the run store does not support {conn.dialect.name}")
