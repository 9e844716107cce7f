"""What the retention purge (the chart's store.retention) costs the runners writing the
ledger meanwhile: ledger writes of live runs with no purge (the anchor) beside the same
writes while the purge deletes `--records` settled runs past retention, in one run.

    .venv/bin/python bench/purge.py [--records 100000] [--live 20] [--writes 1500]
                                    [--batch 500] [--out PATH]

Starts its own throwaway Postgres (fsync=off, as the test server) and migrates a store.
Seeds `--records` runs settled 120 days ago, each as a run leaves its record: the run, one
attempt, two ledger rows, a result and a usage row (the rows purge_old_runs deletes with
it), in set-based inserts. Then `--live` live runs, each with its attempt, whose ledger is
written call by call (store.open_call + store.close_call straight on an engine: what the
store API does for a runner, without the HTTP around it).

1. anchor: `--writes` ledger writes (open + close) round-robin over the live runs, no purge;
2. during the purge: the purge runs in its own process (the operator's retention loop is
   not in the store API's process either), store.purge_old_runs with a retention of 90 days
   and `--batch` runs per transaction, as the operator calls it; ledger writes go on until
   it ends (at least `--writes`);
3. anchor again, after the purge (the store is smaller: a check that the first anchor was
   not an outlier).

Reports p50/p95/p99/max of each phase, the ratios during/anchor, the purge's time and rate,
and that every settled record went and no live run's row did. The goal: the purge never
holds the ledger's locks for long, so ledger p99 during a purge stays within a few
milliseconds of the anchor's.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for extra in (ROOT / "devtools", ROOT):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

from agentrun_devtools.postgres import Postgres  # noqa: E402
from agentrun_devtools.stats import results_file, write_results  # noqa: E402
from sqlalchemy import func, select, text  # noqa: E402
from sqlalchemy.ext.asyncio import AsyncEngine  # noqa: E402

from agentrun import store  # noqa: E402
from agentrun.store.schema import attempts, results, runs, tool_calls, usage  # noqa: E402
from agentrun.vocabulary import LedgerOutcome  # noqa: E402

NAMESPACE = "bench-purge"
DIGEST = store.args_digest({"to": "x@example.com", "body": "hello"})
RETENTION = datetime.timedelta(days=90)

# Settled runs 120 days ago, with what a settled run leaves: generate_series makes them in
# the database itself (seconds for 100,000, where one insert each would take minutes).
SEED = (
    """INSERT INTO runs (uid, namespace, name, agent, trigger, user_id, status,
           attempts, tools_executed, created_at, started_at, finished_at, updated_at)
       SELECT 'old-' || i, :ns, 'old-' || i, 'bench-agent', 'manual', 'bench', 'Succeeded',
           1, '["send_email"]', now() - interval '120 days', now() - interval '120 days',
           now() - interval '120 days', now() - interval '120 days'
       FROM generate_series(1, :n) AS i""",
    """INSERT INTO attempts (run_uid, attempt, pod_name, status)
       SELECT 'old-' || i, 1, 'old-' || i || '-1', 'Succeeded' FROM generate_series(1, :n) AS i""",
    """INSERT INTO tool_calls (run_uid, attempt, seq, tool, args_digest, started_at,
           finished_at, outcome)
       SELECT 'old-' || i, 1, s, 'send_email', :digest, now() - interval '120 days',
           now() - interval '120 days', 'ok'
       FROM generate_series(1, :n) AS i, generate_series(1, 2) AS s""",
    """INSERT INTO results (run_uid, attempt, text, digest, created_at)
       SELECT 'old-' || i, 1, 'Sent.', :digest, now() - interval '120 days'
       FROM generate_series(1, :n) AS i""",
    """INSERT INTO usage (run_uid, attempt, model, model_calls, input_tokens,
           output_tokens, cost_micro_usd, priced, updated_at)
       SELECT 'old-' || i, 1, 'gemini-2.5-flash', 2, 1200, 80, 450, true,
           now() - interval '120 days'
       FROM generate_series(1, :n) AS i""",
)


def percentiles(values: list[float]) -> dict[str, float]:
    q = statistics.quantiles(values, n=100, method="inclusive")
    return {"p50": statistics.median(values), "p95": q[94], "p99": q[98], "max": max(values)}


def row(label: str, values: list[float]) -> str:
    p = percentiles(values)
    return (f"| {label} | {len(values)} | "
            + " | ".join(f"{p[k] * 1000:.2f} ms" for k in ("p50", "p95", "p99", "max")) + " |")


def ratio_row(label: str, num: list[float], den: list[float]) -> str:
    a, b = percentiles(num), percentiles(den)
    return (f"| {label} | | "
            + " | ".join(f"{a[k] / b[k]:.2f}" for k in ("p50", "p95", "p99", "max")) + " |")


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


async def seed(engine: AsyncEngine, n: int) -> None:
    for table in (runs, attempts, tool_calls, results, usage):
        assert f"INSERT INTO {table.name} " in "".join(SEED), table.name  # named alike
    async with engine.begin() as conn:
        for statement in SEED:
            await conn.execute(text(statement), {"n": n, "ns": NAMESPACE, "digest": DIGEST})
    async with engine.begin() as conn:
        await conn.execute(text("ANALYZE"))


async def live_runs(engine: AsyncEngine, count: int) -> list[str]:
    key = await store.installation_key(engine)
    digest = await store.put_input(engine, "bench", {}, key=key)
    uids = []
    for i in range(count):
        uid = str(uuid.uuid4())
        await store.record_run(engine, uid, NAMESPACE, f"live-{i}", "bench-agent", "manual",
                               "bench", digest)
        await store.start_attempt(engine, uid, 1, f"{uid}-1", f"live-{i}-1")
        uids.append(uid)
    return uids


class Ledger:
    """Ledger writes round-robin over the live runs, each run's calls numbered in order."""

    def __init__(self, engine: AsyncEngine, uids: list[str]) -> None:
        self.engine, self.uids = engine, uids
        self.next_seq = dict.fromkeys(uids, 0)
        self.turn = 0

    async def write(self) -> float:
        uid = self.uids[self.turn % len(self.uids)]
        self.turn += 1
        self.next_seq[uid] += 1
        seq = self.next_seq[uid]
        started = time.perf_counter()
        await store.open_call(self.engine, uid, 1, seq, "send_email", f"call-{seq}", DIGEST)
        await store.close_call(self.engine, uid, 1, seq, LedgerOutcome.OK, {"sent": True})
        return time.perf_counter() - started


async def counts(engine: AsyncEngine) -> tuple[int, int, int]:
    async with engine.connect() as conn:
        old = await conn.scalar(select(func.count()).select_from(runs).where(
            runs.c.uid.like("old-%")))
        old_calls = await conn.scalar(select(func.count()).select_from(tool_calls).where(
            tool_calls.c.run_uid.like("old-%")))
        live_calls = await conn.scalar(select(func.count()).select_from(tool_calls).where(
            tool_calls.c.run_uid.not_like("old-%")))
    return int(old or 0), int(old_calls or 0), int(live_calls or 0)


async def bench(url: str, args: argparse.Namespace, say: Report) -> None:
    engine = store.make_engine(url)
    try:
        started = time.perf_counter()
        await seed(engine, args.records)
        say(f"seeded {args.records:,} settled runs (each with an attempt, 2 ledger rows, a "
            f"result and a usage row, settled 120 days ago) in "
            f"{time.perf_counter() - started:.1f} s")
        ledger = Ledger(engine, await live_runs(engine, args.live))
        for _ in range(50):  # warm-up: connections, plans
            await ledger.write()

        before = [await ledger.write() for _ in range(args.writes)]

        purge = subprocess.Popen([sys.executable, __file__, "--purge-only", url,
                                  "--batch", str(args.batch)],
                                 stdout=subprocess.PIPE, text=True)
        during: list[float] = []
        while purge.poll() is None or len(during) < args.writes:
            during.append(await ledger.write())
        out, _ = purge.communicate()
        assert purge.returncode == 0, out
        deleted, seconds = out.split()
        after = [await ledger.write() for _ in range(args.writes)]
        old, old_calls, live_calls = await counts(engine)
    finally:
        await engine.dispose()

    say(f"purge: {int(deleted):,} runs in {float(seconds):.1f} s "
        f"({int(deleted) / float(seconds):,.0f} runs/s, {args.batch} a transaction); "
        f"left of them: {old} runs, {old_calls} ledger rows; live runs' ledger rows "
        f"{live_calls:,} (every write's row kept: {live_calls == ledger.turn})")
    say("")
    say("| ledger write (open + close), live runs | writes | p50 | p95 | p99 | max |")
    say("|---|---|---|---|---|---|")
    say(row("anchor: no purge", before))
    say(row("during the purge", during))
    say(row("after the purge", after))
    say(ratio_row("during / anchor", during, before))
    say(ratio_row("after / anchor", after, before))


class Report:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def __call__(self, line: str = "") -> None:
        self.lines.append(line)
        print(line, flush=True)


async def purge_only(url: str, batch: int) -> None:
    engine = store.make_engine(url)
    try:
        started = time.perf_counter()
        deleted = await store.purge_old_runs(engine, RETENTION, batch=batch)
        print(deleted, time.perf_counter() - started, flush=True)
    finally:
        await engine.dispose()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--live", type=int, default=20)
    parser.add_argument("--writes", type=int, default=1500)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--purge-only", metavar="URL", help=argparse.SUPPRESS)
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.purge_only:
        asyncio.run(purge_only(args.purge_only, args.batch))
        return 0
    out = results_file("purge", args.out)

    say = Report()
    work = Path(tempfile.mkdtemp(prefix="agentrun-bench-purge-"))
    ok = False
    with contextlib.ExitStack() as stack:
        try:
            pg = Postgres().start()
            stack.callback(pg.stop)
            url = pg.create_database("bench")
            asyncio.run(store.migrate(url))
            say(f"bench/purge.py, {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, "
                f"{os.cpu_count()} CPUs: Postgres {pg.port} (fsync=off, as the test server); "
                f"load average {load()}")
            asyncio.run(bench(url, args, say))
            say(f"\nload average at the end {load()} (other processes share these CPUs)")
            ok = True
        finally:
            if not ok:
                print(f"bench failed; files kept in {work}", file=sys.stderr)
    if ok:
        shutil.rmtree(work, ignore_errors=True)
        write_results("\n".join(say.lines), out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
