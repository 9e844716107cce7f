"""What the write-ahead tool ledger costs per tool call, on a local Postgres.

    .venv/bin/python bench/ledger.py [--inserts 2000] [--calls 20] [--runs 5] [--url URL]

Starts a throwaway Postgres (agentrun_devtools.postgres) unless --url is given, then:
1. the write-ahead insert+commit alone (store.open_call), p50/p99, and its close;
2. a tool call round trip through ADK (scripted model -> function call event committed to
   the session -> tool -> response event), with and without the ledger plugin, per call,
   p50/p99 over runs, and the ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for extra in (ROOT / "devtools", ROOT / "runner-image", ROOT):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

from agentrun_runner.ledger import WriteAheadLedger  # noqa: E402
from agentrun_runner.retries import CallWatch, GuardedLlm  # noqa: E402
from agentrun_runner.scripted import ScriptedLlm  # noqa: E402
from google.adk.agents import LlmAgent  # noqa: E402
from google.adk.apps.app import App  # noqa: E402
from google.adk.plugins.base_plugin import BasePlugin  # noqa: E402
from google.adk.runners import Runner  # noqa: E402
from google.adk.sessions.database_session_service import DatabaseSessionService  # noqa: E402
from google.genai import types  # noqa: E402
from sqlalchemy.ext.asyncio import AsyncEngine  # noqa: E402

from agentrun import store  # noqa: E402


def pct(samples: list[float], p: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"


async def bench_inserts(engine: AsyncEngine, n: int) -> tuple[list[float], list[float]]:
    uid = f"bench-{uuid.uuid4().hex[:8]}"
    digest = store.args_digest({"to": "x@example.com", "body": "hello"})
    opens, closes = [], []
    for seq in range(1, n + 1):
        t0 = time.perf_counter()
        await store.open_call(engine, uid, 1, seq, "send_email", f"call-{seq}", digest)
        t1 = time.perf_counter()
        await store.close_call(engine, uid, 1, seq, "ok")
        t2 = time.perf_counter()
        opens.append(t1 - t0)
        closes.append(t2 - t1)
    return opens, closes


async def noop_tool(customer: str) -> dict[str, str]:
    """A tool that does nothing, so that only the machinery is measured."""
    return {"customer": customer}


async def one_run(engine: AsyncEngine, calls: int, with_ledger: bool) -> float:
    """Seconds per tool call for one run of `calls` tool calls."""
    uid = f"bench-{uuid.uuid4().hex[:8]}"
    script = [{"call": "noop_tool", "args": {"customer": str(i)}} for i in range(calls)]
    script.append({"text": "done"})
    agent = LlmAgent(name="bench_agent", instruction="bench", tools=[noop_tool],
                     model=GuardedLlm.wrap(ScriptedLlm(script=script), CallWatch()))
    sessions = DatabaseSessionService(db_engine=engine)
    plugins: list[BasePlugin] = [WriteAheadLedger(engine, uid, 1)] if with_ledger else []
    runner = Runner(app=App(name="bench-agent", root_agent=agent, plugins=plugins),
                    session_service=sessions)
    await store.begin_attempt(engine, uid, 1, "bench-agent", "bench", uid)
    await sessions.create_session(app_name="bench-agent", user_id="bench", session_id=uid)
    message = types.Content(role="user", parts=[types.Part(text="go")])
    t0 = time.perf_counter()
    async for _ in runner.run_async(user_id="bench", session_id=uid, new_message=message):
        pass
    elapsed = time.perf_counter() - t0
    await runner.close()
    return elapsed / calls


async def main_async(url: str, inserts: int, calls: int, runs: int) -> None:
    await store.migrate(url)
    engine = store.make_engine(url)
    try:
        await bench_inserts(engine, 50)  # warm the pool and the plans
        opens, closes = await bench_inserts(engine, inserts)
        await one_run(engine, 5, True)
        await one_run(engine, 5, False)
        with_ledger: list[float] = []
        without: list[float] = []
        for _ in range(runs):  # interleaved, so that drift hits both alike
            without.append(await one_run(engine, calls, False))
            with_ledger.append(await one_run(engine, calls, True))
    finally:
        await engine.dispose()

    print(f"write-ahead insert+commit ({inserts} calls): p50 {ms(pct(opens, 50))}, "
          f"p99 {ms(pct(opens, 99))}")
    print(f"finish update+commit      ({inserts} calls): p50 {ms(pct(closes, 50))}, "
          f"p99 {ms(pct(closes, 99))}")
    w50, o50 = statistics.median(with_ledger), statistics.median(without)
    print(f"tool call round trip through ADK ({runs} runs x {calls} calls, per call):")
    print(f"  without ledger: p50 {ms(o50)}, p99 {ms(pct(without, 99))}")
    print(f"  with ledger:    p50 {ms(w50)}, p99 {ms(pct(with_ledger, 99))}")
    print(f"  ratio with/without (p50): {w50 / o50:.2f}x  (+{ms(w50 - o50)} per call)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inserts", type=int, default=2000)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--url", help="an existing store (default: a throwaway Postgres)")
    args = parser.parse_args()
    if args.url:
        asyncio.run(main_async(args.url, args.inserts, args.calls, args.runs))
        return
    from agentrun_devtools.postgres import Postgres

    server = Postgres().start()
    try:
        print(f"postgres: {server.url} (fsync=off, as the test server)")
        asyncio.run(main_async(server.url, args.inserts, args.calls, args.runs))
    finally:
        server.stop()


if __name__ == "__main__":
    main()
