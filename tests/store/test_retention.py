"""Retention: ADK events past N days are purged in batches; sessions keep their shell and
our ledger and run rows stay, so an old run's tools are still known."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from agentrun import store
from tests.runner.runs import prepare_run, query, run_runner

SCRIPT = [{"call": "read_message", "args": {}}, {"text": "done"}]


def test_old_events_are_purged_and_the_rest_kept(any_store: str) -> None:
    old = prepare_run(any_store, "old-run")
    new = prepare_run(any_store, "new-run")
    assert run_runner(old, SCRIPT).returncode == 0
    assert run_runner(new, SCRIPT).returncode == 0

    async def go(e: AsyncEngine) -> None:
        async with e.begin() as conn:
            await conn.execute(text("UPDATE events SET timestamp = :t WHERE session_id = :s"),
                               {"t": "2000-01-01 00:00:00", "s": old.session_for(1)})
            counts = dict((await conn.execute(text(
                "SELECT session_id, count(*) FROM events GROUP BY session_id"))).all())
        assert counts[old.session_for(1)] >= 2
        purged = await store.purge_old_events(e, timedelta(days=90), batch=1)
        assert purged == counts[old.session_for(1)]
        async with e.connect() as conn:
            left = dict((await conn.execute(text(
                "SELECT session_id, count(*) FROM events GROUP BY session_id"))).all())
            sessions = {r[0] for r in await conn.execute(text("SELECT id FROM sessions"))}
        assert old.session_for(1) not in left
        assert left[new.session_for(1)] == counts[new.session_for(1)]
        assert {old.session_for(1), new.session_for(1)} <= sessions  # shells stay
        assert [x.tool for x in await store.ledger(e, old.uid)] == ["read_message"]
        assert await store.purge_old_events(e, timedelta(days=90)) == 0

    query(any_store, go)
