"""Runs of the real runner program for the runner tests: an AgentRun written down in a
store as the operator writes it before the pod (`prepare_run`), the env the operator's pod
gives the runner, the runner launched as a subprocess with it, and what it left in the
store. The runs live in the session's RunnerWorld, which the `runner_world` fixture
(tests/store_fixtures.py) hands over with `use_world`."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from sqlalchemy.ext.asyncio import AsyncEngine

from agentrun import store
from agentrun.vocabulary import ENV_DATABASE_URL, ENV_SCRIPT, SCRIPTED_MODEL, RunnerEnv
from tests.runner_world import Identity, RunnerWorld

T = TypeVar("T")
RUNNER_TIMEOUT = 120


def query(url: str, fn: Callable[[AsyncEngine], Awaitable[T]]) -> T:
    """Runs `fn(engine)` against the store at `url` on a fresh engine and loop."""

    async def go() -> T:
        engine = store.make_engine(url)
        try:
            return await fn(engine)
        finally:
            await engine.dispose()

    return asyncio.run(go())


_world: RunnerWorld | None = None


def use_world(runner_world: RunnerWorld | None) -> None:
    """Where the runs live from now on (None: nowhere)."""
    global _world
    _world = runner_world


def world() -> RunnerWorld:
    assert _world is not None, "runner tests need the runner_world fixture (via *_store)"
    return _world


@dataclass
class Run:
    """One AgentRun as the operator would have written it down before the pod."""

    url: str
    uid: str
    name: str
    digest: str
    agent: str = "support-agent"
    user_id: str = "alice"
    session_id: str | None = None
    namespace: str = ""
    identities: dict[int, Identity] = field(default_factory=dict)
    agent_digest: str | None = None

    def session_for(self, attempt: int) -> str:
        return self.session_id or f"{self.uid}-{attempt}"

    @property
    def app(self) -> str:
        """The ADK app name of its sessions (qualified by namespace)."""
        return store.session_app(self.namespace, self.agent)

    def identity(self, attempt: int = 1) -> Identity:
        """Attempt `attempt` written down (as the operator does) with its pod and token."""
        if attempt not in self.identities:
            if attempt > 1:
                query(self.url, lambda e: store.start_attempt(
                    e, self.uid, attempt, self.session_for(attempt), f"{self.name}-{attempt}"))
            self.identities[attempt] = world().identity(self.name, self.uid, attempt,
                                                        namespace=self.namespace)
        return self.identities[attempt]


def prepare_run(
    url: str,
    tag: str,
    text: str = "Customer 42 asks for a refund",
    *,
    agent: str = "support-agent",
    user_id: str = "alice",
    session_id: str | None = None,
    trigger: str = "manual",
    files: dict[str, bytes] | None = None,
    namespace: str | None = None,
    agent_snapshot: dict[str, Any] | None = None,
) -> Run:
    """An AgentRun, then put_input + record_run (with the Agent snapshot it pins, if any)
    + start_attempt(1) and its pod, as the operator does."""
    ns = namespace or world().namespace
    name, uid = world().agent_run(tag, agent=agent, user_id=user_id, session_id=session_id,
                                  namespace=ns)
    run = Run(url, uid, name, "", agent, user_id, session_id, ns)

    async def go(engine: AsyncEngine) -> str:
        digest = await store.put_input(engine, text, files or {},
                                      key=await store.installation_key(engine))
        pinned = await store.put_agent(engine, agent_snapshot) if agent_snapshot else None
        run.agent_digest = pinned
        await store.record_run(engine, uid, ns, run.name, agent, trigger, user_id, digest,
                               agent_digest=pinned)
        await store.start_attempt(engine, uid, 1, run.session_for(1), f"{run.name}-1")
        return digest

    run.digest = query(url, go)
    run.identity(1)
    return run


def runner_env(run: Run, script: list[dict[str, Any]] | None, attempt: int = 1,
               **extra: str) -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items()
        if not k.startswith("AGENTRUN_") and k != ENV_DATABASE_URL
    }
    env.update({
        # The store's API (started, and waited for, on first use; one started on purpose
        # for a store that is not ready is used as it is).
        RunnerEnv.STORE_URL: (world().apis.get(run.url) or world().store_api(run.url)).url,
        RunnerEnv.STORE_TOKEN_FILE: str(run.identity(attempt).token_file),
        RunnerEnv.STORE_CA: world().plane.store_api_tls.ca.read_text(),  # type: ignore[union-attr]
        RunnerEnv.ALLOW_SCRIPTED_MODEL: "true",
        RunnerEnv.NAMESPACE: run.namespace,
        RunnerEnv.RUN_NAME: run.name,
        RunnerEnv.RUN_UID: run.uid,
        RunnerEnv.ATTEMPT: str(attempt),
        RunnerEnv.AGENT: run.agent,
        RunnerEnv.USER_ID: run.user_id,
        RunnerEnv.SESSION_ID: run.session_for(attempt),
        RunnerEnv.INPUT_DIGEST: run.digest,
        RunnerEnv.TRIGGER: "chat" if run.session_id else "manual",
        RunnerEnv.AGENT_DIGEST: run.agent_digest or "",
    })
    if script is not None:
        env[RunnerEnv.MODEL] = SCRIPTED_MODEL
        env[ENV_SCRIPT] = json.dumps(script)
    env.update(extra)
    return env


# The runner program with its store client's not-ready window set (store_client's
# NOT_READY_SECONDS, 60 s): what the runner does once the window is over is the same
# however long it was, and a test that waits it out need not spend a minute on it.
_WITH_NOT_READY_WINDOW = (
    "import runpy, sys; from agentrun_runner import store_client; "
    "store_client.NOT_READY_SECONDS = float(sys.argv.pop(1)); "
    "runpy.run_module('agentrun_runner', run_name='__main__', alter_sys=True)")


def launch(env: dict[str, str], args: list[str] | None = None, *,
           not_ready_seconds: float | None = None) -> subprocess.CompletedProcess[str]:
    """The real runner program, as a subprocess (`python -m agentrun_runner`);
    `not_ready_seconds`: how long its store client waits for a store API that says its
    store is not ready (_WITH_NOT_READY_WINDOW)."""
    program = ["-m", "agentrun_runner"] if not_ready_seconds is None else [
        "-c", _WITH_NOT_READY_WINDOW, str(not_ready_seconds)]
    return subprocess.run(
        [sys.executable, *program, *(args or [])],
        env=env, capture_output=True, text=True, timeout=RUNNER_TIMEOUT,
    )


def run_runner(run: Run, script: list[dict[str, Any]] | None, attempt: int = 1,
               **extra: str) -> subprocess.CompletedProcess[str]:
    return launch(runner_env(run, script, attempt, **extra))


# -- what the tests send and read -------------------------------------------------------------

EMAIL = {"to": "c42@example.com", "body": "Your refund is on its way."}


def explain(done: subprocess.CompletedProcess[str]) -> str:
    return f"exit {done.returncode}\nstderr:\n{done.stderr[-4000:]}"


def outcome(run: Run, attempt: int = 1) -> store.Outcome | None:
    return query(run.url, lambda e: store.get_outcome(e, run.uid, attempt))


def tools(run: Run, attempt: int = 1) -> list[str] | None:
    return query(run.url, lambda e: store.tools_executed(e, run.uid, attempt))


def snapshot_of(url: str, **spec: Any) -> dict[str, Any]:
    """An Agent snapshot: agent triage, its MCP server crm at `url`, and `spec`."""
    return {"root": "triage", "agents": {"triage": {
        "instruction": "Look the customer up before you answer.",
        "mcpServers": [{"name": "crm", "url": url}], **spec}}}
