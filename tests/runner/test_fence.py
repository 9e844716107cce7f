"""The ledger is a fence: once the operator settles an attempt, a runner still alive in
its grace period cannot start another tool, and every call started before is counted."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from agentrun import store
from agentrun.vocabulary import RunStatus
from tests.runner.conftest import query


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


def test_racing_calls_are_either_counted_or_refused(pg_store: str) -> None:
    """Many tool calls racing one settle on Postgres: every call that got into the
    ledger is in the settled toolsExecuted, and every other one was refused."""

    async def go(e: AsyncEngine) -> None:
        await _attempt(e, "f2")

        async def call(seq: int) -> bool:
            try:
                await store.open_call(e, "f2", 1, seq, f"tool{seq}", f"c{seq}",
                                      store.args_digest({}))
            except store.AttemptSettled:
                return False
            return True

        calls = [asyncio.create_task(call(i)) for i in range(1, 21)]
        await asyncio.sleep(0.005)
        settled = await store.settle_counting(e, "f2", 1, RunStatus.FAILED, "Evicted", "x")
        admitted = [i + 1 for i, ok in enumerate(await asyncio.gather(*calls)) if ok]
        assert settled.won and settled.tools_executed is not None
        assert sorted(settled.tools_executed) == sorted(f"tool{i}" for i in admitted)
        assert sorted(x.seq for x in await store.ledger(e, "f2")) == admitted

    query(pg_store, go)
