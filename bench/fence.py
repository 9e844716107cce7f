"""The store's part of an eviction's sync, in the operator's CPU: what one eviction costs
the process before any wait, beside a floor of ten round trips, in one run.

    .venv/bin/python bench/fence.py [--evictions 300] [--warmup 20] [--out PATH]

Starts a throwaway Postgres (fsync=off, as the test server), migrates it, makes ADK's
session tables (as the first runner does), and writes `--evictions` + `--warmup` runs the
way a runner leaves one that is evicted mid-run: the run and its attempt, the attempt's
invocation, a session, and one recorded tool call. Then, one eviction after another on an
engine warmed as the operator's is (`store.warm`), each timed on this thread's CPU clock
(time.thread_time) and on the wall clock:

1. agentrun: what the operator's sync of an evicted pod asks of the store: run_state's
   read of the run's and the attempt's rows, then the fence (settle_then_state: the
   attempt settled, its tools counted from the ledger, the approvals and the session's
   events, the run settled, and what the settled run publishes read back), one
   transaction;
2. the floor, interleaved eviction by eviction: ten round trips on the same engine, each
   statement `SELECT 1`, in the shape that sync had when this benchmark was written (two
   reads outside a transaction, then BEGIN, eight statements, COMMIT; the two reads are
   one statement since): what the driver and the engine cost before any statement does
   anything. The floor stays the same from one version of the code to the next, so the
   ratio compares them on one scale.

The figures: p50/p99 of each, in ms, and the ratio agentrun/floor. Both run on an idle
machine: contention (bench/eviction.py) multiplies the CPU time into wall time, so the CPU
is what the store's part can cut.

The output goes to stdout and to `--out` (default ~/.cache/agentrun/bench/fence-<time>.txt
as docs/development.md says; `--out -` for stdout only).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for extra in (ROOT / "devtools", ROOT):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

from agentrun_devtools.postgres import Postgres  # noqa: E402
from agentrun_devtools.stats import pct, results_file, write_results  # noqa: E402
from google.adk.sessions import DatabaseSessionService  # noqa: E402
from sqlalchemy import text  # noqa: E402
from sqlalchemy.ext.asyncio import AsyncEngine  # noqa: E402

from agentrun import store  # noqa: E402
from agentrun.store.engine import autocommit  # noqa: E402
from agentrun.vocabulary import RunStatus  # noqa: E402

APP, USER = "bench/support-agent", "bob"
_ONE = text("SELECT 1")


async def _evicted(e: AsyncEngine, sessions: DatabaseSessionService, uid: str) -> None:
    """A run as an eviction finds it: live, one call recorded, its session started."""
    await store.record_run(e, uid, "bench", uid, "support-agent", "manual", USER, None)
    await store.start_attempt(e, uid, 1, f"{uid}-1", f"{uid}-1")
    await sessions.create_session(app_name=APP, user_id=USER, session_id=f"{uid}-1")
    await store.record_invocation(e, uid, 1, f"{uid}-invocation")
    await store.open_call(e, uid, 1, 1, "send_email", "c1", store.args_digest({}))


async def _agentrun(e: AsyncEngine, uid: str) -> None:
    before = await store.run_state(e, uid, 1)
    assert before.attempt is not None and before.attempt.status in RunStatus.LIVE
    state = await store.settle_then_state(e, uid, 1, RunStatus.FAILED, "Evicted", "bench",
                                          count=True, approvals=True, published=True)
    assert state is not None and state.run is not None, uid
    assert state.run.tools_executed == ["send_email"], state.run


async def _floor(e: AsyncEngine) -> None:
    async with autocommit(e) as conn:
        for _ in range(2):
            (await conn.execute(_ONE)).one()
    async with e.connect() as conn, conn.begin():
        for _ in range(8):
            (await conn.execute(_ONE)).one()


async def _timed(step: object) -> tuple[float, float]:
    cpu, wall = time.thread_time(), time.perf_counter()
    await step  # type: ignore[misc]
    return 1000 * (time.thread_time() - cpu), 1000 * (time.perf_counter() - wall)


async def measure(url: str, evictions: int, warmup: int) -> dict[str, list[tuple[float, float]]]:
    await store.migrate(url)
    e = store.make_engine(url, pool_size=4, max_overflow=0)
    try:
        sessions = DatabaseSessionService(db_engine=e)
        uids = [f"fence-{i}" for i in range(evictions + warmup)]
        for uid in uids:
            await _evicted(e, sessions, uid)
        assert await store.warm(e), "the warm-up did not read the session's events"
        times: dict[str, list[tuple[float, float]]] = {"agentrun": [], "floor": []}
        for i, uid in enumerate(uids):
            a = await _timed(_agentrun(e, uid))
            f = await _timed(_floor(e))
            if i >= warmup:
                times["agentrun"].append(a)
                times["floor"].append(f)
        return times
    finally:
        await e.dispose()


def report(times: dict[str, list[tuple[float, float]]], evictions: int) -> str:
    lines = ["| per eviction, ms | CPU p50 | CPU p99 | wall p50 | wall p99 |",
             "|---|---|---|---|---|"]
    figures = {}
    for name, label in (("agentrun", "agentrun: run_state read + fence"),
                        ("floor", "floor: ten round trips of SELECT 1")):
        cpu = [c for c, _ in times[name]]
        wall = [w for _, w in times[name]]
        figures[name] = (pct(cpu, 0.5), pct(cpu, 0.99), pct(wall, 0.5), pct(wall, 0.99))
        lines.append(f"| {label} | " + " | ".join(f"{v:.2f}" for v in figures[name]) + " |")
    ratio = [a / f for a, f in zip(figures["agentrun"], figures["floor"], strict=True)]
    lines.append("| ratio agentrun / floor | " + " | ".join(f"{r:.2f}" for r in ratio) + " |")
    head = (f"bench/fence.py, {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, "
            f"{os.cpu_count()} CPUs, {evictions} evictions, Postgres, one at a time")
    return "\n".join([head, "", *lines])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--evictions", type=int, default=300)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--out", help="results file (default ~/.cache/agentrun/bench/"
                             "fence-<time>.txt; '-' for stdout only)")
    args = p.parse_args(argv)
    out = results_file("fence", args.out)
    pg = Postgres().start()
    try:
        times = asyncio.run(measure(pg.url, args.evictions, args.warmup))
    finally:
        pg.stop()
    text_ = report(times, args.evictions)
    print(text_, flush=True)
    write_results(text_, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
