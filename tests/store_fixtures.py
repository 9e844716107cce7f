"""Stores for the tests that run the runner without the operator (tests/runner,
tests/store, tests/store_api): a migrated store (real Postgres, or SQLite where cheap), a
real store API in front of it, and the real runner program launched as a subprocess, the
way the operator's pod would launch it, presenting a token bound to its attempt's pod (the
runs and the runner's launch are tests/runner/runs.py's)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from agentrun_devtools.controlplane import ControlPlane

from agentrun import store
from tests.harness import delete_namespace
from tests.runner import runs
from tests.runner_world import RunnerWorld


@pytest.fixture(scope="session")
def runner_world(crds: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[
        RunnerWorld]:
    """Where runner tests' runs live: AgentRuns in a namespace no operator acts on, their
    attempts' pods (never scheduled) and tokens bound to them, and one real store API per
    store."""
    world = RunnerWorld(crds, f"solo-runners-{os.getpid()}", tmp_path_factory.mktemp("runners"))
    world.create_namespace(world.namespace)
    runs.use_world(world)
    try:
        yield world
    finally:
        runs.use_world(None)
        world.stop()
        delete_namespace(crds, world.namespace)


@pytest.fixture
def pg_store(postgres_url: str, runner_world: RunnerWorld) -> str:
    """A fresh Postgres database, migrated as the operator migrates it at start-up."""
    asyncio.run(store.migrate(postgres_url))
    return postgres_url


@pytest.fixture
def sqlite_store(tmp_path: Path, runner_world: RunnerWorld) -> str:
    url = f"sqlite:///{tmp_path / 'agentrun.db'}"
    asyncio.run(store.migrate(url))
    return url


@pytest.fixture(params=["postgres", "sqlite"])
def any_store(request: pytest.FixtureRequest) -> Iterator[str]:
    yield request.getfixturevalue("pg_store" if request.param == "postgres" else "sqlite_store")
