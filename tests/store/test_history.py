"""The run archive in the store (store/history.py, agentrun/history.py), on Postgres and
SQLite: newest first in keyset pages, column conditions in SQL, label selectors over the
labels a run had at launch, and a name's most recent run."""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Iterator
from pathlib import Path
from typing import TypeVar

import pytest
from sqlalchemy import update
from sqlalchemy.ext.asyncio import AsyncEngine

from agentrun import history, store
from agentrun.store.schema import runs
from agentrun.vocabulary import RunStatus
from tests.runner.runs import query

T = TypeVar("T")
T0 = datetime.datetime(2026, 12, 1, 9, 0, tzinfo=datetime.UTC)


@pytest.fixture(params=["postgres", "sqlite"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    url = request.getfixturevalue("postgres_url") if request.param == "postgres" else \
        f"sqlite:///{tmp_path / 'agentrun.db'}"
    asyncio.run(store.migrate(url))
    yield url


async def _record(engine: AsyncEngine, uid: str, namespace: str, name: str, minute: int,
                  *, labels: dict[str, str] | None = None, agent: str = "support-agent",
                  status: str = RunStatus.SUCCEEDED) -> None:
    await store.record_run(engine, uid, namespace, name, agent, "manual", "alice", None,
                           labels=labels, annotations={"team": "a"})
    async with engine.begin() as conn:
        await conn.execute(update(runs).where(runs.c.uid == uid).values(
            created_at=T0 + datetime.timedelta(minutes=minute), status=status))


def test_pages_are_newest_first_and_continue_where_they_ended(store_url: str) -> None:
    async def go(e: AsyncEngine) -> None:
        for i in range(25):
            await _record(e, f"uid-{i:03d}", "team-a", f"run-{i}", i,
                          labels={"tier": "gold" if i % 5 == 0 else "bronze"})
        await _record(e, "uid-b", "team-b", "run-b", 30)
        seen, after, pages = [], None, 0
        while True:
            page = await store.run_records(e, "team-a", limit=10, after=after)
            seen += [r.name for r in page.records]
            pages += 1
            after = history.decode_continue(history.encode_continue(page.after))
            if page.after is None:
                break
        assert pages == 3
        assert seen == [f"run-{i}" for i in range(24, -1, -1)]  # newest first, each once
        # A page that ends exactly at the last record says there is no more.
        whole = await store.run_records(e, "team-a", limit=25)
        assert len(whole.records) == 25 and whole.after is None
        # Every namespace: team-b's run too.
        assert (await store.run_records(e, None, limit=1)).records[0].name == "run-b"

    query(store_url, go)


def test_selectors_filter_in_the_store(store_url: str) -> None:
    async def go(e: AsyncEngine) -> None:
        for i in range(12):
            await _record(e, f"u{i:02d}", "team-a", f"run-{i}", i,
                          labels={"tier": "gold" if i % 4 == 0 else "bronze"},
                          status=RunStatus.FAILED if i % 3 == 0 else RunStatus.SUCCEEDED,
                          agent="triage" if i == 7 else "support-agent")
        gold = history.label_selector("tier=gold")
        page = await store.run_records(e, "team-a", limit=2,
                                       matches=lambda r: gold(r.labels or {}))
        assert [r.name for r in page.records] == ["run-8", "run-4"] and page.after
        rest = await store.run_records(e, "team-a", limit=2, after=page.after,
                                       matches=lambda r: gold(r.labels or {}))
        assert [r.name for r in rest.records] == ["run-0"] and rest.after is None
        failed = await store.run_records(
            e, "team-a", fields=history.field_selector("status.phase=Failed"), limit=50)
        assert [r.name for r in failed.records] == ["run-9", "run-6", "run-3", "run-0"]
        not_support = await store.run_records(
            e, "team-a", fields=history.field_selector("spec.agent!=support-agent"))
        assert [r.name for r in not_support.records] == ["run-7"]
        by_uid = await store.run_records(
            e, None, fields=history.field_selector("metadata.uid=u05"))
        assert [r.name for r in by_uid.records] == ["run-5"]
        since = await store.run_records(e, "team-a",
                                        since=T0 + datetime.timedelta(minutes=10))
        assert [r.name for r in since.records] == ["run-11", "run-10"]
        record = history.record(by_uid.records[0])
        assert record["kind"] == "RunRecord" and record["status"]["phase"] == "Succeeded"
        assert record["metadata"]["labels"] == {"tier": "bronze"}
        assert record["metadata"]["annotations"] == {"team": "a"}

    query(store_url, go)


def test_a_name_used_again_serves_its_most_recent_run(store_url: str) -> None:
    async def go(e: AsyncEngine) -> None:
        await _record(e, "first", "team-a", "nightly", 1)
        await _record(e, "second", "team-a", "nightly", 2)
        await _record(e, "elsewhere", "team-b", "nightly", 3)
        found = await store.latest_named(e, "team-a", "nightly")
        assert found is not None and found.uid == "second"
        assert await store.latest_named(e, "team-a", "other") is None

    query(store_url, go)


def test_retention_deletes_old_records_with_their_rows_and_keeps_the_rest(
    store_url: str,
) -> None:
    from sqlalchemy import func, select

    from agentrun.store.schema import attempts, inputs, tool_calls

    old = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=100)

    async def go(e: AsyncEngine) -> None:
        key = await store.installation_key(e)
        digests = {}
        for name in ("old-settled", "old-live", "new-settled"):
            digests[name] = await store.put_input(e, f"input of {name}", key=key)
            await store.record_run(e, name, "team-a", name, "support-agent", "manual",
                                   "alice", digests[name])
            await store.start_attempt(e, name, 1, f"s-{name}", f"{name}-1")
            await store.open_call(e, name, 1, 1, "send_email", "c1", "sha256:" + "0" * 64)
        orphan = await store.put_input(e, "a snapshot no record names", key=key)
        async with e.begin() as conn:
            await conn.execute(update(runs).where(runs.c.uid.in_(["old-settled", "old-live"]))
                               .values(created_at=old))
            await conn.execute(update(runs).where(runs.c.uid == "old-settled").values(
                status=RunStatus.SUCCEEDED, finished_at=old))
            await conn.execute(update(runs).where(runs.c.uid == "new-settled").values(
                status=RunStatus.FAILED))
            await conn.execute(update(inputs).values(created_at=old))

        assert await store.purge_old_runs(e, datetime.timedelta(days=90), batch=1) == 1
        kept = {r.uid for r in (await store.run_records(e, "team-a")).records}
        assert kept == {"old-live", "new-settled"}  # a live run is never purged
        async with e.connect() as conn:
            calls = {r[0] for r in await conn.execute(select(tool_calls.c.run_uid))}
            tried = {r[0] for r in await conn.execute(select(attempts.c.run_uid))}
            snapshots = {r[0] for r in await conn.execute(select(inputs.c.digest))}
            assert (await conn.execute(select(func.count()).select_from(runs))).scalar() == 2
        assert calls == tried == {"old-live", "new-settled"}
        assert snapshots == {digests["old-live"], digests["new-settled"]}
        assert orphan not in snapshots
        assert await store.purge_old_runs(e, datetime.timedelta(days=90)) == 0

    query(store_url, go)


def test_one_retention_pass_on_a_store_no_run_has_used_and_with_a_step_failing(
    store_url: str,
) -> None:
    """store.purge: ADK's events table is made by the store API's first session, so a new
    store has none; that is nothing to purge, not a failure. A step that fails (here the
    memory table is gone) is reported and does not hold back the others."""
    from sqlalchemy import inspect, text

    old = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=100)

    async def go(e: AsyncEngine) -> None:
        async with e.connect() as conn:
            assert not await conn.run_sync(lambda c: inspect(c).has_table("events"))
        for uid in ("old-1", "old-2"):
            await store.record_run(e, uid, "team-a", uid, "support-agent", "manual", "alice",
                                   None)
        async with e.begin() as conn:
            await conn.execute(update(runs).where(runs.c.uid == "old-1").values(
                status=RunStatus.SUCCEEDED, created_at=old, finished_at=old))
        assert await store.purge(e, datetime.timedelta(days=90)) == {
            "runs": 1, "events": 0, "memories": 0}

        async with e.begin() as conn:
            await conn.execute(update(runs).where(runs.c.uid == "old-2").values(
                status=RunStatus.FAILED, created_at=old, finished_at=old))
            await conn.execute(text("DROP TABLE memory"))
        done = await store.purge(e, datetime.timedelta(days=90))
        assert (done["runs"], done["events"]) == (1, 0)
        assert isinstance(done["memories"], Exception)
        assert (await store.run_records(e, "team-a")).records == []

    query(store_url, go)
