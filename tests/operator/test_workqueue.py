"""The work queue: a key is never worked on twice at once, and no change is lost."""

from __future__ import annotations

import asyncio
import itertools

from agentrun_operator.workqueue import WorkQueue


def test_keys_added_many_times_are_worked_on_once() -> None:
    async def go() -> list[str]:
        q: WorkQueue[str] = WorkQueue()
        for key in ("a", "b", "a", "a", "b"):
            q.add(key)
        taken = [await q.get(), await q.get()]
        assert len(q) == 0
        return taken

    assert asyncio.run(go()) == ["a", "b"]


def test_a_key_added_while_worked_on_comes_back_after_done_not_before() -> None:
    async def go() -> None:
        q: WorkQueue[str] = WorkQueue()
        q.add("a")
        assert await q.get() == "a"
        q.add("a")  # a change arrives while a worker holds "a"
        q.add("b")
        assert await q.get() == "b"  # "a" is not handed to a second worker
        try:
            await asyncio.wait_for(q.get(), timeout=0.05)
            raise AssertionError("a key was handed out while it was being worked on")
        except TimeoutError:
            pass
        q.done("a")
        assert await asyncio.wait_for(q.get(), timeout=1) == "a"

    asyncio.run(go())


def test_add_after_keeps_the_earliest_schedule() -> None:
    async def go() -> str:
        q: WorkQueue[str] = WorkQueue()
        q.add_after("a", 30)
        q.add_after("a", 0.01)
        q.add_after("a", 60)
        return await asyncio.wait_for(q.get(), timeout=1)

    assert asyncio.run(go()) == "a"


def test_failures_back_off_exponentially_until_forgotten() -> None:
    async def go() -> list[float]:
        q: WorkQueue[str] = WorkQueue()
        delays = [q.failed("a") for _ in range(5)]
        q.forget("a")
        delays.append(q.failed("a"))
        return delays

    delays = asyncio.run(go())
    assert all(b > a for a, b in itertools.pairwise(delays[:5]))
    assert delays[5] < delays[1]


async def nothing_more(q: WorkQueue[str]) -> None:
    """No key is handed out again (a stale entry of a key taken before)."""
    try:
        extra = await asyncio.wait_for(q.get(), timeout=0.05)
    except TimeoutError:
        return
    raise AssertionError(f"{extra} was handed out twice")


def test_a_sweep_waits_behind_every_change_and_a_changed_key_leaves_it() -> None:
    async def go() -> list[str]:
        q: WorkQueue[str] = WorkQueue()
        for key in ("s1", "s2", "evicted", "s3"):  # a resync sweep, the last key changed
            q.add(key, later=True)
        q.add("evicted")  # its pod's eviction: the first lane
        q.add("new")
        q.add("s2", later=True)  # swept twice: still once, still later
        taken = [await q.get() for _ in range(5)]
        assert len(q) == 0
        await nothing_more(q)
        return taken

    assert asyncio.run(go()) == ["evicted", "new", "s1", "s2", "s3"]


def test_a_key_swept_again_after_it_was_taken_comes_back_once() -> None:
    async def go() -> list[str]:
        q: WorkQueue[str] = WorkQueue()
        q.add("a", later=True)
        q.add("a")
        assert await q.get() == "a"  # by the first lane; its later entry is stale
        q.done("a")
        q.add("a", later=True)
        q.add("b", later=True)
        taken = [await q.get(), await q.get()]
        await nothing_more(q)
        return taken

    assert asyncio.run(go()) == ["a", "b"]
