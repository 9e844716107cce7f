"""Store URLs and engines.

Users write sync-looking URLs (`postgresql+psycopg://...`, `sqlite:///path`); everything
in the store is async, so URLs are normalised to the async driver of the same database
(psycopg 3 async, aiosqlite). ADK's session tables and ours live in the same database.
"""

from __future__ import annotations

import select
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from sqlalchemy import event, exc
from sqlalchemy.engine import URL, make_url
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

DEFAULT_POOL_SIZE = 3
DEFAULT_MAX_OVERFLOW = 2
# Several runner processes and the operator share one SQLite file in the development
# cluster: wait for the writer lock instead of failing at once.
SQLITE_BUSY_TIMEOUT_MS = 30_000

_POSTGRES_DRIVERS = {"", "psycopg", "psycopg2", "psycopg_async", "pg8000"}
_SQLITE_DRIVERS = {"", "pysqlite", "aiosqlite"}


class UnsupportedStoreURL(ValueError):
    """The URL names a database the run store does not support."""


def _parse(url: str) -> URL:
    if url.startswith("postgres://"):  # Heroku-style alias
        url = "postgresql://" + url[len("postgres://"):]
    return make_url(url)


def async_url(url: str) -> str:
    """The same database, with the async driver the store uses (psycopg or aiosqlite)."""
    parsed = _parse(url)
    backend, driver = parsed.get_backend_name(), parsed.get_driver_name()
    if backend == "postgresql":
        if parsed.drivername != "postgresql" and driver not in _POSTGRES_DRIVERS:
            return parsed.render_as_string(hide_password=False)  # e.g. asyncpg: keep it
        return parsed.set(drivername="postgresql+psycopg").render_as_string(hide_password=False)
    if backend == "sqlite":
        return parsed.set(drivername="sqlite+aiosqlite").render_as_string(hide_password=False)
    raise UnsupportedStoreURL(
        f"unsupported store URL scheme {parsed.drivername!r}: use postgresql+psycopg://... "
        "or sqlite:///path"
    )


def session_service_url(url: str) -> str:
    """The URL to give ADK's DatabaseSessionService for this store (same database).

    ADK requires an async driver and falls back to a synchronous one when the URL names
    none, so hand it the normalised async URL.
    """
    return async_url(url)


def is_durable(url: str | None) -> bool:
    """Whether `url` names a store that outlives the process (not in-memory SQLite)."""
    if not url or not url.strip():
        return False
    try:
        parsed = _parse(url.strip())
    except Exception:
        return False
    if parsed.get_backend_name() == "sqlite":
        database = parsed.database or ""
        if database in ("", ":memory:") or database.startswith("file::memory:"):
            return False
        if parsed.query.get("mode") == "memory":
            return False
    return True


def redact(url: str) -> str:
    """The URL without its password, for messages and logs."""
    try:
        return _parse(url).render_as_string(hide_password=True)
    except Exception:
        return "<unparseable url>"


def _on_sqlite_connect(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    # WAL lets the operator read while a runner writes; busy_timeout makes writers queue.
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


def _closed_by_the_server(_dbapi_connection: Any, record: Any, _proxy: Any) -> None:
    """A pooled Postgres connection is checked before use without a round trip (where
    SQLAlchemy's pool_pre_ping sends one on every checkout). A connection in the pool is
    idle, so anything the server sent on it since is its last word: a shutdown's
    "terminating connection", or the close itself. One poll of its socket; a connection
    found so is replaced, as one failing a ping is (the pool tries a fresh one)."""
    conn = record.driver_connection
    try:
        if conn is None or conn.closed or conn.broken:
            raise exc.DisconnectionError("the connection is closed")
        fd = conn.pgconn.socket
    except exc.DisconnectionError:
        raise
    except Exception as e:  # psycopg: the connection has no socket any more
        raise exc.DisconnectionError(f"the connection is unusable: {e}") from e
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLERR | select.POLLHUP)
    if poller.poll(0):
        raise exc.DisconnectionError("the server closed the connection, or is closing it")


def make_engine(
    url: str,
    pool_size: int = DEFAULT_POOL_SIZE,
    max_overflow: int = DEFAULT_MAX_OVERFLOW,
    **kwargs: Any,
) -> AsyncEngine:
    """An async engine for the store at `url`, its pool capped small.

    Every runner pod is a client of the same database, so the defaults (3 + 2 overflow)
    are deliberately low; the operator may ask for more.
    """
    target = async_url(url)
    backend = make_url(target).get_backend_name()
    options: dict[str, Any] = {"pool_size": pool_size, "max_overflow": max_overflow}
    psycopg = backend == "postgresql" and make_url(target).get_driver_name() == "psycopg"
    if backend == "postgresql":
        options["pool_recycle"] = 1800
        options["pool_pre_ping"] = not psycopg  # psycopg's: _closed_by_the_server
    else:
        options["connect_args"] = {"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000}
    options.update(kwargs)
    engine = create_async_engine(target, **options)
    if backend == "sqlite":
        event.listen(engine.sync_engine, "connect", _on_sqlite_connect)
    elif psycopg:
        event.listen(engine.sync_engine, "checkout", _closed_by_the_server)
    return engine


@asynccontextmanager
async def autocommit(engine: AsyncEngine) -> AsyncIterator[AsyncConnection]:
    """A connection whose every statement commits itself: no BEGIN, COMMIT or ROLLBACK
    round trips. For a write that is one statement, or reads that need no snapshot
    beyond each statement's own (a transaction at READ COMMITTED gives them no more)."""
    async with engine.connect() as conn:
        yield await conn.execution_options(isolation_level="AUTOCOMMIT")


def is_sqlite(engine: AsyncEngine) -> bool:
    return engine.dialect.name == "sqlite"


def is_postgres(engine: AsyncEngine) -> bool:
    return engine.dialect.name == "postgresql"
