"""Session-wide real parts: a Postgres server and (see tests/cluster_fixtures.py) a
Kubernetes control plane. Each is started once per test session and stopped at its end,
leaving no process behind."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from agentrun_devtools.postgres import Postgres

pytest_plugins = ["tests.cluster_fixtures"]


@pytest.fixture(scope="session")
def postgres() -> Iterator[Postgres]:
    """A real Postgres server (Debian's binaries) on a free port, for the whole session."""
    server = Postgres().start()
    try:
        yield server
    finally:
        server.stop()


_databases = iter(range(1, 1_000_000))


@pytest.fixture
def postgres_url(postgres: Postgres) -> str:
    """A fresh, empty database on the session's Postgres server (SQLAlchemy URL)."""
    return postgres.create_database(f"t{next(_databases)}")
