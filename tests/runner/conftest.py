"""Runner tests: a migrated store (real Postgres, or SQLite where cheap) and the real
runner program launched as a subprocess, the way the operator's pod would launch it."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from agentrun import store
from agentrun.vocabulary import ENV_DATABASE_URL, ENV_SCRIPT, SCRIPTED_MODEL, RunnerEnv

T = TypeVar("T")
RUNNER_TIMEOUT = 120


def query(url: str, fn: Callable[[AsyncEngine], Awaitable[T]]) -> T:
    """Runs `fn(engine)` against the store at `url` on a fresh engine and loop."""

    async def go() -> T:
        engine = store.make_engine(url)
        try:
            return await fn(engine)
        finally:
            await engine.dispose()

    return asyncio.run(go())


@pytest.fixture
def pg_store(postgres_url: str) -> str:
    """A fresh Postgres database, migrated as the operator migrates it at start-up."""
    asyncio.run(store.migrate(postgres_url))
    return postgres_url


@pytest.fixture
def sqlite_store(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'agentrun.db'}"
    asyncio.run(store.migrate(url))
    return url


@pytest.fixture(params=["postgres", "sqlite"])
def any_store(request: pytest.FixtureRequest) -> Iterator[str]:
    yield request.getfixturevalue("pg_store" if request.param == "postgres" else "sqlite_store")


@dataclass
class Run:
    """One AgentRun as the operator would have written it down before the pod."""

    url: str
    uid: str
    name: str
    digest: str
    agent: str = "support-agent"
    user_id: str = "alice"
    session_id: str | None = None

    def session_for(self, attempt: int) -> str:
        return self.session_id or f"{self.uid}-{attempt}"


def prepare_run(
    url: str,
    uid: str,
    text: str = "Customer 42 asks for a refund",
    *,
    agent: str = "support-agent",
    user_id: str = "alice",
    session_id: str | None = None,
    trigger: str = "manual",
    files: dict[str, bytes] | None = None,
) -> Run:
    """put_input + record_run + start_attempt(1), as the operator does."""
    run = Run(url, uid, f"run-{uid}", "", agent, user_id, session_id)

    async def go(engine: AsyncEngine) -> str:
        digest = await store.put_input(engine, text, files or {})
        await store.record_run(engine, uid, "support", run.name, agent, trigger, user_id, digest)
        await store.start_attempt(engine, uid, 1, run.session_for(1), f"{run.name}-1")
        return digest

    run.digest = query(url, go)
    return run


def runner_env(run: Run, script: list[dict[str, Any]] | None, attempt: int = 1,
               **extra: str) -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items()
        if not k.startswith("AGENTRUN_") and k != ENV_DATABASE_URL
    }
    env.update({
        ENV_DATABASE_URL: run.url,
        RunnerEnv.NAMESPACE: "support",
        RunnerEnv.RUN_NAME: run.name,
        RunnerEnv.RUN_UID: run.uid,
        RunnerEnv.ATTEMPT: str(attempt),
        RunnerEnv.AGENT: run.agent,
        RunnerEnv.USER_ID: run.user_id,
        RunnerEnv.SESSION_ID: run.session_for(attempt),
        RunnerEnv.INPUT_DIGEST: run.digest,
        RunnerEnv.TRIGGER: "chat" if run.session_id else "manual",
    })
    if script is not None:
        env[RunnerEnv.MODEL] = SCRIPTED_MODEL
        env[ENV_SCRIPT] = json.dumps(script)
    env.update(extra)
    return env


def launch(env: dict[str, str], args: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    """The real runner program, as a subprocess (`python -m agentrun_runner`)."""
    return subprocess.run(
        [sys.executable, "-m", "agentrun_runner", *(args or [])],
        env=env, capture_output=True, text=True, timeout=RUNNER_TIMEOUT,
    )


def run_runner(run: Run, script: list[dict[str, Any]] | None, attempt: int = 1,
               **extra: str) -> subprocess.CompletedProcess[str]:
    return launch(runner_env(run, script, attempt, **extra))
