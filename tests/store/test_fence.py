"""The ledger is a fence: once the operator settles an attempt, a runner still alive in
its grace period cannot start another tool, and every call started before is counted."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncEngine

from agentrun import store
from agentrun.store import schema
from agentrun.vocabulary import RunStatus
from tests.runner.runs import query


async def _attempt(e: AsyncEngine, uid: str) -> None:
    await store.record_run(e, uid, "ns", uid, "support-agent", "manual", "bob", None)
    await store.start_attempt(e, uid, 1, f"{uid}-1", f"{uid}-1")


def test_no_tool_starts_after_settle(any_store: str) -> None:
    async def go(e: AsyncEngine) -> None:
        await _attempt(e, "f1")
        await store.open_call(e, "f1", 1, 1, "send_email", "c1", store.args_digest({}))
        settled = await store.settle_counting(e, "f1", 1, RunStatus.FAILED, "Evicted", "x")
        assert settled == store.Settled(True, ["send_email"])
        with pytest.raises(store.AttemptSettled, match="update_crm was not started"):
            await store.open_call(e, "f1", 1, 2, "update_crm", "c2", store.args_digest({}))
        assert [x.tool for x in await store.ledger(e, "f1")] == ["send_email"]
        assert await store.tools_executed(e, "f1", 1) == ["send_email"]
        # A second settle (another replica, a late event) loses and learns nothing new.
        late = await store.settle_counting(e, "f1", 1, RunStatus.SUCCEEDED, None, None)
        assert late == store.Settled(False, None)
        run = await store.get_run(e, "f1")
        assert run is not None
        assert (run.status, run.tools_executed) == (RunStatus.FAILED, ["send_email"])

    query(any_store, go)


def test_warming_runs_an_evictions_statements_and_leaves_nothing(any_store: str) -> None:
    """store.warm runs what an eviction's sync runs (run_state, then the fence with its
    count, the session's events included once ADK has made its tables, and what the run
    then shows) on a run of its own, in a transaction rolled back: the eviction that
    follows compiles no statement of its own, and the store holds nothing of the
    warm-up."""
    from google.adk.sessions.database_session_service import DatabaseSessionService

    async def evict(e: AsyncEngine, uid: str) -> None:
        """The operator's sync of an evicted run: its reads, then the fence."""
        await store.open_call(e, uid, 1, 1, "send_email", "c1", store.args_digest({}))
        cache = e.sync_engine._compiled_cache
        assert cache is not None
        compiled = set(cache)
        before = await store.run_state(e, uid, 1, approvals=True)
        assert before.attempt is not None and before.attempt.status in RunStatus.LIVE
        state = await store.settle_then_state(e, uid, 1, RunStatus.FAILED, "Evicted", "x",
                                              count=True, approvals=True, published=True)
        assert state is not None and state.run is not None
        assert (state.run.status, state.run.tools_executed) == (RunStatus.FAILED,
                                                                ["send_email"])
        assert set(cache) == compiled

    async def go(e: AsyncEngine) -> None:
        # Before the first runner, ADK's tables are not there: warm says so, and runs the
        # rest (a run that never reached a model call reads no session events).
        await _attempt(e, "w1")
        assert not await store.warm(e)
        await evict(e, "w1")
        # Once ADK has made them, the session's events are read as well.
        await DatabaseSessionService(db_engine=e).create_session(
            app_name="ns/support-agent", user_id="bob", session_id="w2-1")
        fresh = store.make_engine(any_store)
        try:
            await _attempt(fresh, "w2")
            await store.record_invocation(fresh, "w2", 1, "i2")
            assert await store.warm(fresh)
            await evict(fresh, "w2")
        finally:
            await fresh.dispose()
        async with e.connect() as conn:
            for table in ("runs", "attempts"):
                assert (await conn.execute(text(f"SELECT count(*) FROM {table}"))
                        ).scalar_one() == 2, table

    query(any_store, go)


def test_the_fence_and_what_it_leaves_are_read_on_one_connection(any_store: str) -> None:
    """settle_then_state: the settle commits first (the fence holds whatever the read
    after it does), then the run reads as run_state reads it, the settle's count in it."""

    async def go(e: AsyncEngine) -> None:
        await _attempt(e, "f5")
        await store.open_call(e, "f5", 1, 1, "send_email", "c1", store.args_digest({}))
        state = await store.settle_then_state(e, "f5", 1, RunStatus.FAILED, "Evicted", "x",
                                              count=True, approvals=True, published=True)
        assert state is not None and state.run is not None and state.attempt is not None
        assert (state.run.status, state.run.tools_executed) == (RunStatus.FAILED,
                                                                ["send_email"])
        assert (state.attempt.status, state.attempt.reason) == (RunStatus.FAILED, "Evicted")
        assert state.ledger is not None and [x.tool for x in state.ledger] == ["send_email"]
        with pytest.raises(store.AttemptSettled):
            await store.open_call(e, "f5", 1, 2, "update_crm", "c2", store.args_digest({}))
        # Second (a late event): it loses, and reads the first one's account.
        late = await store.settle_then_state(e, "f5", 1, RunStatus.SUCCEEDED, None, None,
                                             count=False)
        assert late is not None and late.run is not None and late.ledger is None
        assert (late.run.status, late.run.tools_executed) == (RunStatus.FAILED,
                                                              ["send_email"])
        # Not counting: the attempt ends with no tools.
        await _attempt(e, "f6")
        quiet = await store.settle_then_state(e, "f6", 1, RunStatus.FAILED, "ImagePull", "y",
                                              count=False)
        assert quiet is not None and quiet.run is not None
        assert quiet.run.tools_executed == []

    query(any_store, go)


def test_no_call_is_closed_after_settle(any_store: str) -> None:
    """A close after the settle would rewrite what the operator counted (a journal close
    takes a call out of toolsExecuted): refused in the close's own statement."""

    async def go(e: AsyncEngine) -> None:
        await _attempt(e, "f3")
        for seq, call_id in ((1, "c1"), (2, "c2")):
            await store.open_call(e, "f3", 1, seq, "send_email", call_id, store.args_digest({}))
        assert await store.close_call(e, "f3", 1, 1, "ok", {"sent": True})
        assert (await store.settle_counting(e, "f3", 1, RunStatus.FAILED, "Evicted", "x")).won
        with pytest.raises(store.AttemptSettled, match="call 2 stays as the operator counted") \
                as refused:
            await store.close_call(e, "f3", 1, 2, "journal")
        assert refused.value.status == RunStatus.FAILED
        assert [(x.seq, x.outcome) for x in await store.ledger(e, "f3")] == [(1, "ok"), (2, None)]
        # A close of a row that is not open stays a plain "no" while the attempt is live.
        await _attempt(e, "f4")
        assert not await store.close_call(e, "f4", 1, 9, "ok")

    query(any_store, go)


def test_calls_at_the_fence_when_the_settle_comes_are_counted_and_later_ones_refused(
        pg_store: str) -> None:
    """Tool calls racing one settle on Postgres, the race held still so that its outcome
    is known: ten calls have written their ledger rows and wait at the fence (the attempt's
    row, held by another writer's transaction) when the settle comes and waits behind
    them. All ten are admitted and counted in toolsExecuted; ten calls after the settle
    are all refused. Exactly that split: a fence that admitted every call, or refused
    every call, or counted before the calls in flight had landed, fails it."""
    in_flight = 10

    async def go(e: AsyncEngine) -> None:
        await _attempt(e, "f2")
        # One connection per call in flight, the settle's, and the one holding the row.
        wide = store.make_engine(pg_store, pool_size=in_flight + 2, max_overflow=0)

        async def call(seq: int) -> bool:
            try:
                await store.open_call(wide, "f2", 1, seq, f"tool{seq}", f"c{seq}",
                                      store.args_digest({}))
            except store.AttemptSettled:
                return False
            return True

        async def until_waiting(count: int, what: str) -> None:
            """Until `count` statements of this database wait for a lock."""
            deadline = asyncio.get_running_loop().time() + 30
            while True:
                async with e.connect() as conn:
                    waiting = (await conn.execute(text(
                        "select count(*) from pg_stat_activity where datname = "
                        "current_database() and wait_event_type = 'Lock'"))).scalar_one()
                if waiting >= count:
                    return
                assert asyncio.get_running_loop().time() < deadline, \
                    f"{waiting} of {count} statements wait: {what}"
                await asyncio.sleep(0.02)

        try:
            async with wide.connect() as holder:
                # Held as any writer of the attempt holds it (FOR NO KEY UPDATE: an UPDATE
                # of its status): the calls' share lock, and the settle, wait for it.
                await holder.execute(
                    select(schema.attempts.c.status)
                    .where(schema.attempts.c.run_uid == "f2", schema.attempts.c.attempt == 1)
                    .with_for_update(key_share=True))
                calls = [asyncio.create_task(call(seq)) for seq in range(1, in_flight + 1)]
                await until_waiting(in_flight, "the calls at the fence")
                settling = asyncio.create_task(store.settle_counting(
                    wide, "f2", 1, RunStatus.FAILED, "Evicted", "x"))
                await until_waiting(in_flight + 1, "the calls, then the settle")
                await holder.commit()
            settled = await settling
            admitted = await asyncio.gather(*calls)
            late = [await call(seq) for seq in range(in_flight + 1, 2 * in_flight + 1)]
        finally:
            await wide.dispose()
        assert admitted == [True] * in_flight
        assert late == [False] * in_flight
        assert settled.won and settled.tools_executed is not None
        assert sorted(settled.tools_executed) == sorted(
            f"tool{seq}" for seq in range(1, in_flight + 1))
        assert [x.seq for x in await store.ledger(e, "f2")] == list(range(1, in_flight + 1))

    query(pg_store, go)
