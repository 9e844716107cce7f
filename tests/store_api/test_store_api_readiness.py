"""A store API started before its store is at the schema (the operator migrates it as it
starts, beside it): every route answers 503 with Retry-After, before reading the token, and
serves once the store is migrated."""

from __future__ import annotations

import asyncio
from pathlib import Path

from agentrun_store_api.app import Readiness, application
from agentrun_store_api.auth import Authority
from agentrun_store_api.quotas import Quotas
from agentrun_store_api.refusal import NotReady
from agentrun_store_api.routes import Routes
from aiohttp.test_utils import TestClient, TestServer
from kubernetes import client

from agentrun import store
from agentrun.vocabulary import STORE_AUDIENCE


def test_not_ready_says_when_to_ask_again_then_serves(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'store.db'}"

    async def go() -> None:
        engine = store.make_engine(url)
        readiness = Readiness()
        waiting = asyncio.create_task(readiness.wait_for_schema(engine, interval=0.05))
        app = application(Authority(client.ApiClient(), engine, STORE_AUDIENCE),
                          Routes(engine, Quotas(engine)), readiness)
        async with TestClient(TestServer(app)) as http:
            answer = await http.post("/v1/attempt/begin", json={},
                                     headers={"Authorization": "Bearer not-a-token"})
            assert answer.status == 503
            assert answer.headers["Retry-After"] == str(NotReady.RETRY_AFTER_SECONDS)
            said = await answer.json()
            assert "run store" in said["error"], said
            await store.migrate(url)
            await asyncio.wait_for(waiting, 10)
            # Ready: the same request now reaches the token check (and is refused there,
            # without Retry-After: this token is nobody's).
            answer = await http.post("/v1/attempt/begin", json={},
                                     headers={"Authorization": "Bearer not-a-token"})
            assert answer.status != 503 and "Retry-After" not in answer.headers, (
                answer.status, await answer.text())
        await engine.dispose()

    asyncio.run(go())
