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
