"""The development tooling's tests: `the_machines_dev_cluster`, for the tests that type the
README's and the demo's commands."""

from __future__ import annotations

import fcntl
from collections.abc import Iterator

import pytest


@pytest.fixture
def the_machines_dev_cluster() -> Iterator[None]:
    """Held by the tests that type the README's and the demo's commands as a newcomer does
    (make dev-cluster, make run, make demo): those serve on the fixed addresses a newcomer
    gets (the store API on 127.0.0.1:8089), so two test processes must not run them at
    once. A lock on the machine, not on the session: make test runs two sessions."""
    with open("/tmp/agentrun-tests-dev-cluster.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield
