"""Alembic environment for the run store: online only, on a connection handed in by
`agentrun.store.migrate` (never a URL of its own)."""

from __future__ import annotations

from typing import Any

from alembic import context

from agentrun.store.schema import OUR_TABLES, metadata

VERSION_TABLE = "agentrun_alembic_version"


def _ours(obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any) -> bool:
    # ADK's tables (sessions, events, ...) share the database; autogenerate must ignore them.
    return not (type_ == "table" and name not in OUR_TABLES)


def run_migrations_online() -> None:
    connection = context.config.attributes["connection"]
    context.configure(
        connection=connection,
        target_metadata=metadata,
        version_table=VERSION_TABLE,
        include_object=_ours,
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()


run_migrations_online()
