"""The store's half of "one approval per original": atomic in the database, on real Postgres
(many connections racing) and on SQLite (the development cluster's embedded store)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from agentrun import store
from agentrun.vocabulary import ReplayReason

pytestmark = pytest.mark.postgres


@pytest.fixture(params=["postgres", "sqlite"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "postgres":
        found: str = request.getfixturevalue("postgres_url")
    else:
        found = f"sqlite:///{tmp_path / 'agentrun.db'}"
    asyncio.run(store.migrate(found))
    return found


def approve(engine: AsyncEngine, name: str, run_uid: str = "run-1", *,
            forced: bool = False) -> Any:
    return store.approve_replay(
        engine, uid=f"uid-{name}", namespace="support", name=name, run_uid=run_uid,
        run_name="triage-42", forced=forced,
        reason=ReplayReason.FORCED if forced else ReplayReason.NO_TOOLS_EXECUTED,
        message="approved", replay_run_name=f"{name}-run", tools_executed=[])


def check(url: str, fn: Any) -> Any:
    async def go() -> Any:
        engine = store.make_engine(url, pool_size=10, max_overflow=10)
        try:
            return await fn(engine)
        finally:
            await engine.dispose()

    return asyncio.run(go())


def test_twenty_replays_racing_for_one_run_make_one_approval(url: str) -> None:
    async def go(engine: AsyncEngine) -> None:
        claims = await asyncio.gather(*(approve(engine, f"r{i}") for i in range(20)))
        winners = [c for c in claims if c.granted]
        assert len(winners) == 1
        winner = winners[0].approval
        # Every loser is told who holds the approval.
        assert {c.approval.name for c in claims} == {winner.name}
        assert [a.name for a in await store.replays_of(engine, "run-1")] == [winner.name]

    check(url, go)


def test_approval_is_idempotent_per_replay(url: str) -> None:
    """A retried handler gets back what the first call recorded, and still holds it."""
    async def go(engine: AsyncEngine) -> None:
        first = await approve(engine, "again")
        second = await approve(engine, "again")
        assert first.granted and second.granted
        assert first.approval == second.approval
        recorded = await store.get_replay_approval(engine, "uid-again")
        assert recorded is not None and recorded.replay_run_name == "again-run"
        assert not (await approve(engine, "later")).granted

    check(url, go)


def test_forced_replays_are_not_limited_but_recorded(url: str) -> None:
    async def go(engine: AsyncEngine) -> None:
        assert (await approve(engine, "safe")).granted
        forced = await asyncio.gather(*(approve(engine, f"f{i}", forced=True)
                                        for i in range(5)))
        assert all(c.granted for c in forced)
        recorded = await store.replays_of(engine, "run-1")
        assert sorted(a.name for a in recorded) == ["f0", "f1", "f2", "f3", "f4", "safe"]
        assert sum(not a.forced for a in recorded) == 1
        # Other runs have their own slot.
        assert (await approve(engine, "other", run_uid="run-2")).granted
        assert await store.get_replay_approval(engine, "uid-never") is None

    check(url, go)
