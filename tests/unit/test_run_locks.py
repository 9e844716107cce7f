"""One decision at a time per run, and no lock kept for runs nobody is deciding about."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

from agentrun_operator.lifecycle import Context


def test_one_decision_at_a_time_per_run_and_no_leftover_locks() -> None:
    ctx = Context(config=Any, engine=Any, kube=Any)  # type: ignore[arg-type]
    inside: dict[str, int] = {"a": 0, "b": 0}
    most: dict[str, int] = {"a": 0, "b": 0}

    async def decide(uid: str) -> None:
        async with ctx.lock(uid):
            inside[uid] += 1
            most[uid] = max(most[uid], inside[uid])
            await asyncio.sleep(0.005)
            inside[uid] -= 1

    async def main() -> None:
        await asyncio.gather(*(decide(uid) for uid in ("a", "b") * 5))

    asyncio.run(main())
    assert most == {"a": 1, "b": 1}
    gc.collect()
    assert len(ctx.locks) == 0
