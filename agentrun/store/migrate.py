"""Schema migrations, run programmatically: the operator calls `migrate` at start-up;
runners only check (`check_schema`) and never create our tables themselves."""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import text
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.ext.asyncio import AsyncEngine

from agentrun.store.engine import is_postgres, make_engine, redact

MIGRATIONS = Path(__file__).parent / "migrations"
VERSION_TABLE = "agentrun_alembic_version"
# Serialises concurrent migrations on Postgres (two operator replicas starting together).
_ADVISORY_LOCK_KEY = 0x61676E7472756E  # "agntrun"


# Alembic keeps its `op`/`context` proxies in module globals: one migration at a time per
# process (across processes, the advisory lock or the retry below takes over).
_in_process: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = (
    weakref.WeakKeyDictionary()
)


def _process_lock() -> asyncio.Lock:
    loop = asyncio.get_running_loop()
    lock = _in_process.get(loop)
    if lock is None:
        lock = _in_process[loop] = asyncio.Lock()
    return lock


class StoreNotReady(RuntimeError):
    """The store is reachable but not migrated to the schema this code expects.

    `said` is the same without where the store is, for those who may not know that
    (the store API tells runners)."""

    def __init__(self, message: str, said: str = "") -> None:
        super().__init__(message)
        self.said = said or message


def _config() -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    return config


def head_revision() -> str:
    """The newest schema revision this code knows."""
    head = ScriptDirectory.from_config(_config()).get_current_head()
    assert head is not None
    return head


def _upgrade(connection: Connection) -> None:
    config = _config()
    config.attributes["connection"] = connection
    command.upgrade(config, "head")


def _current_revision(connection: Connection) -> str | None:
    context = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
    return context.get_current_revision()


async def migrate_engine(engine: AsyncEngine) -> None:
    """Upgrades the store behind `engine` to the newest schema; idempotent."""
    async with _process_lock():
        await _migrate_engine(engine)


async def _migrate_engine(engine: AsyncEngine) -> None:
    if is_postgres(engine):
        async with engine.connect() as conn:
            await conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": _ADVISORY_LOCK_KEY})
            await conn.commit()
            try:
                await conn.run_sync(_upgrade)
                await conn.commit()
            finally:
                with contextlib.suppress(DBAPIError):
                    await conn.rollback()
                    await conn.execute(
                        text("SELECT pg_advisory_unlock(:k)"), {"k": _ADVISORY_LOCK_KEY}
                    )
                    await conn.commit()
        return
    # SQLite has no advisory locks: tolerate the race. A loser fails on a table the
    # winner just created, and its retry finds the schema at head (a no-op).
    for attempt in range(10):
        try:
            async with engine.begin() as conn:
                await conn.run_sync(_upgrade)
            return
        except (OperationalError, DBAPIError):
            if attempt == 9:
                raise
            await asyncio.sleep(0.2 * (attempt + 1))


async def migrate(url: str) -> None:
    """Upgrades the store at `url` to the newest schema (Alembic `upgrade head`).

    Idempotent and safe when several processes call it at once. The operator calls it at
    start-up; tests call it for each fresh database.
    """
    engine = make_engine(url, pool_size=1, max_overflow=0)
    try:
        await migrate_engine(engine)
    finally:
        await engine.dispose()


async def check_schema(engine: AsyncEngine) -> None:
    """Raises StoreNotReady unless the store is at the schema revision this code expects.

    The runner calls this instead of creating tables: creating them silently would hide a
    runner pointed at the wrong database.
    """
    async with engine.connect() as conn:
        current = await conn.run_sync(_current_revision)
    head = head_revision()
    if current is None:
        why = ("has no agentrun tables: the operator creates them at start-up "
               "(agentrun.store.migrate); start it first")
        raise StoreNotReady(f"the run store at {redact(str(engine.url))} {why}",
                            f"the run store {why}")
    if current != head:
        raise StoreNotReady(
            f"the run store is at schema revision {current}, this runner expects {head}: "
            "upgrade the operator (it migrates at start-up) or use a matching runner image"
        )
