"""The store tells the operator what only a runner can see: that an Agent snapshot cannot be
built in the image (its latest run of it failed AgentInvalid), so the Agent says so."""

from __future__ import annotations

import asyncio
from pathlib import Path

from agentrun import store
from agentrun.vocabulary import Reason, RunStatus

SNAPSHOT = {"root": "triage", "agents": {"triage": {
    "instruction": "x", "tools": [{"function": "my_tools.refund"}]}}}
REFUSED = "the function my_tools.refund is not a tool of the runner image"


def test_the_latest_runner_outcome_of_a_snapshot_decides(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'agentrun.db'}"

    async def go() -> list[str | None]:
        await store.migrate(url)
        engine = store.make_engine(url)
        try:
            digest = await store.put_agent(engine, SNAPSHOT)
            seen = [await store.image_refusal(engine, digest)]  # no run of it yet

            async def run_of(uid: str, status: str, reason: str | None, message: str) -> None:
                await store.record_run(engine, uid, "ns", uid, "triage", "manual", "alice",
                                       None, agent_digest=digest)
                await store.start_attempt(engine, uid, 1, f"s-{uid}", f"{uid}-1")
                await store.record_outcome(engine, uid, 1, status, reason, message)
                seen.append(await store.image_refusal(engine, digest))

            await run_of("r1", RunStatus.FAILED, Reason.AGENT_INVALID, REFUSED)
            await run_of("r2", RunStatus.FAILED, Reason.AGENT_ERROR, "the model failed")
            await run_of("r3", RunStatus.FAILED, Reason.AGENT_INVALID, REFUSED)
            await run_of("r4", RunStatus.SUCCEEDED, None, "")  # the image was fixed
            seen.append(await store.image_refusal(engine, "sha256:other"))
            return seen
        finally:
            await engine.dispose()

    assert asyncio.run(go()) == [None, REFUSED, None, REFUSED, None, None]
