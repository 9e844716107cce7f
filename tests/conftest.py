"""Session-wide real parts: a Postgres server and (see tests/cluster_fixtures.py) a
Kubernetes control plane. Each is started once per test session and stopped at its end,
leaving no process behind."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from agentrun_devtools.postgres import Postgres

pytest_plugins = ["tests.cluster_fixtures", "tests.store_fixtures"]

# make test runs two pytest processes (pytest-xdist, --dist loadfile --no-loadscope-reorder):
# a file at a time, handed out in the order below, the longest first, so that no long file
# starts last and runs alone at the end. xdist gives each process two files to begin with,
# the first process the first and the third: the demo's and the README's flows, which hold
# the machine's dev-cluster lock (the_machines_dev_cluster), run one after the other in
# one process instead of one process waiting on the other's lock.
_LONGEST_FIRST = ("tests/devtools/test_demo.py", "tests/operator/test_schedules.py",
                  "tests/devtools/test_readme.py", "tests/store_api/test_store_api_limits.py",
                  "tests/operator/test_transcript.py", "tests/operator/test_restarts.py",
                  "tests/operator/replay/test_manual_resume.py",
                  "tests/runner/test_litellm_provider.py",
                  "tests/kubectl/test_console_browser.py")
# ... and last, the files that wait for a build no other file needs: Kueue's controller
# manager. On a new machine .ci/run builds it in the background while the tests run (after
# the peers, which many files need); a Kueue test handed out early held its process in the
# build's lock for 20 minutes of a cold run (1,207 s of setup), leaving one process to run
# everything else. Handed out last, it finds Kueue built.
_AFTER_THE_BUILDS = ("tests/operator/test_queues.py",)


def _file_of(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


# What a test needs is told by its fixtures, not by its folder: a test that uses the control
# plane is marked `cluster`, one that uses the Postgres server `postgres`.
_NEEDS = {"control_plane": "cluster", "postgres": "postgres"}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        for fixture, marker in _NEEDS.items():
            if fixture in getattr(item, "fixturenames", ()):
                item.add_marker(marker)
    rank = {path: i for i, path in enumerate(_LONGEST_FIRST)}
    rank.update({path: len(_LONGEST_FIRST) + 1 + i for i, path in enumerate(_AFTER_THE_BUILDS)})
    items.sort(key=lambda item: rank.get(_file_of(item), len(_LONGEST_FIRST)))  # stable otherwise


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
