"""One tenant floods the store API; how long do another tenant's ledger writes take then,
against the same writes to an idle store API (api.md, Runner integrity: "the other
tenants' requests keep their latency")?

    .venv/bin/python bench/store_flood.py [--writes 1000] [--warmup 30] [--pause 0.01]
                                          [--connections 8] [--out PATH]

Starts its own throwaway Postgres (fsync=off, as the test server), a real control plane
with agentrun's CRDs, two namespaces (two tenants) and a real `agentrun-store-api`
process; runner identities are real (an AgentRun, its attempt's pod, a token bound to it
by TokenRequest: tests/runner_world.py). Then:

1. idle, before: tenant B's runner writes `--writes` ledger rows (open_call + close_call
   through StoreClient, as a runner's ledger does), one after the other with `--pause`
   seconds between them (a runner does something between two tool calls), after
   `--warmup`;
2. flood: tenant A's runner (another process, `--connections` connections at once) sends
   what one runner could: 10,000 session events (its quota is 4,000: the rest are
   refused), and among them 16 MiB bodies where a ledger row belongs and 300,000-word
   memory queries (one of each per 100 requests). B starts once the flooder says its
   first request was answered (the flood is under way, not assumed to be after a sleep),
   writes ledger rows all along, at least `--writes`, and every one it begins before A's
   last request was answered counts (B moves to a new run of its tenant before one
   attempt's 2,000 rows are used up);
3. idle, after: the same as 1 once the flooder has exited, so that the anchor is the
   idle store API on both sides of the flood (the machine's load drifts).

It prints B's p50/p95/p99 idle before, idle after, their pooled figure (the anchor) and
the flood's, with the flood's ratio to the anchor (the goal: p99 within 2x), and what
A's requests got. A figure, not an assertion: tests/store_api/test_store_api_limits.py checks
the refusals themselves. The output goes to stdout and to `--out` (default
~/.cache/agentrun/bench/store-flood-<time>.txt as docs/development.md says; `--out -` for
stdout only).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import itertools
import json
import os
import shutil
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

ROOT = Path(__file__).resolve().parent.parent
for extra in (ROOT / "devtools", ROOT / "runner-image", ROOT / "store-api-image", ROOT):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

import httpx  # noqa: E402
from agentrun_devtools.stats import results_file, write_results  # noqa: E402

from agentrun import store  # noqa: E402

if TYPE_CHECKING:
    from tests.runner_world import RunnerWorld

MiB = 1024 * 1024
EVENTS = 10_000
DIGEST = store.args_digest({"to": "x@example.com", "body": "hello"})


def percentiles(values: list[float]) -> dict[str, float]:
    q = statistics.quantiles(values, n=100, method="inclusive")
    return {"p50": statistics.median(values), "p95": q[94], "p99": q[98]}


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


class Report:
    """Lines to stdout as they come, and to the results file at the end."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def __call__(self, line: str = "") -> None:
        self.lines.append(line)
        print(line, flush=True)


# -- the flooding runner (its own process) --------------------------------------------------


def events(n: int) -> list[bytes]:
    """`n` distinct ADK events, made before the flood: the flooder's own work would
    otherwise take these two CPUs from the store API it floods."""
    from google.adk.events.event import Event
    from google.genai import types

    made = Event(author="user", invocation_id="inv-flood",
                 content=types.Content(role="user", parts=[types.Part(text="event")]))
    template = json.loads(made.model_dump_json(exclude_none=True))
    out = []
    for i in range(n):
        template["id"], template["content"]["parts"][0]["text"] = f"flood-{i}", f"event {i}"
        out.append(json.dumps(template).encode())
    return out


def flood(url: str, token_file: Path, session: str, connections: int, ca: Path) -> int:
    """Sends what one runner could, `connections` at once, until it has sent EVENTS
    events; prints what its requests got (JSON) at the end."""
    token = token_file.read_text().strip()
    auth = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    big = b"x" * (16 * MiB)
    query = json.dumps({"query": " ".join(f"w{i}" for i in range(300_000))}).encode()
    made = events(EVENTS + EVENTS // 49 + 1)  # the last one is the first sent, alone
    stamps: dict[str, float] = {}
    got: Counter[str] = Counter()
    lock = threading.Lock()
    sent = iter(range(EVENTS + EVENTS // 49))  # 98 events in each 100 requests

    def one(client: httpx.Client) -> None:
        for i in sent:
            # Mostly events (the first 10,000 fill the quota), with the big ones among them.
            if i % 100 == 0:
                what, path, body = "16 MiB body", "/v1/ledger", big
            elif i % 100 == 50:
                what, path, body = "300,000-word query", "/v1/memory/search", query
            else:
                what, path, body = "event", f"/v1/sessions/{session}/events", made[i]
            try:
                code = str(client.post(path, content=body, headers=auth).status_code)
            except httpx.HTTPError as e:
                code = type(e).__name__
            with lock:
                got[f"{what} {code}"] += 1
                if what == "event" and code == "429" and "quota spent at" not in stamps:
                    stamps["quota spent at"] = time.time()

    def first(client: httpx.Client) -> None:
        # One request answered, then the word to the bench that the flood is under way.
        try:
            code = str(client.post(f"/v1/sessions/{session}/events", content=made[-1],
                                   headers=auth).status_code)
        except httpx.HTTPError as e:
            code = type(e).__name__
        got[f"event {code}"] += 1
        print(json.dumps({"flooding": time.time()}), flush=True)

    with httpx.Client(base_url=url, timeout=60, verify=ssl.create_default_context(cafile=ca),
                      limits=httpx.Limits(max_connections=connections)) as client, \
            ThreadPoolExecutor(connections) as pool:
        first(client)
        for f in [pool.submit(one, client) for _ in range(connections)]:
            f.result()
        stamps["ended at"] = time.time()  # the last request answered
    print(json.dumps({"got": dict(got), **stamps}), flush=True)
    return 0


# -- the runs ---------------------------------------------------------------------------------


def begun(world: RunnerWorld, api_url: str, url: str, tag: str,
          namespace: str) -> tuple[str, Path, str]:
    """A run of `namespace` recorded in the store at `url`, its first attempt begun through
    the store API at `api_url` and its session created: (run name, token file, session)."""
    from tests.runner_world import call

    name, uid = world.agent_run(tag, namespace=namespace)
    session = f"{uid}-1"

    async def record() -> None:
        engine = store.make_engine(url)
        try:
            digest = await store.put_input(engine, "bench", {},
                                           key=await store.installation_key(engine))
            await store.record_run(engine, uid, namespace, name, "support-agent", "manual",
                                   "bench", digest)
            await store.start_attempt(engine, uid, 1, session, f"{name}-1")
        finally:
            await engine.dispose()

    asyncio.run(record())
    me = world.identity(name, uid, 1, namespace=namespace)
    assert call(api_url, "POST", "/v1/attempt/begin", me.token, {})[0] == 200
    assert call(api_url, "POST", "/v1/sessions", me.token, {"sessionId": session})[0] == 200
    return name, me.token_file, session


# -- tenant B's ledger writes ----------------------------------------------------------------


ROWS_PER_WRITER = 1_900  # under the store API's 2,000 per attempt


async def ledger_writes(url: str, writers: Iterator[Path], n: int, warmup: int,
                        pause: float, going: Callable[[], bool] = lambda: False, *,
                        ca: str | None = None) -> list[tuple[float, float]]:
    """(when, seconds) of each ledger write (open + close) of at least `n` calls after
    `warmup`, and more while `going()`; each writer (an attempt's token file) writes
    ROWS_PER_WRITER."""
    from agentrun_runner.store_client import StoreClient

    out: list[tuple[float, float]] = []
    done = 0
    while done < warmup + n or going():
        client = StoreClient(url, next(writers), ca)
        try:
            for seq in range(1, ROWS_PER_WRITER + 1):
                if done >= warmup + n and not going():
                    break
                t0 = time.perf_counter()
                await client.open_call(seq, "send_email", f"c{seq}", DIGEST)
                await client.close_call(seq, "ok", {"sent": True})
                # A writer's first calls verify its token (bench/ledger.py times those).
                if done >= warmup and seq > 2:
                    out.append((time.time(), time.perf_counter() - t0))
                done += 1
                await asyncio.sleep(pause)
        finally:
            await client.close()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--writes", type=int, default=1000,
                        help="tenant B's ledger writes per phase, after the warm-up (the "
                             "idle p99 is the anchor: of 1,000, ten are above it)")
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--pause", type=float, default=0.01,
                        help="seconds between two of B's ledger writes")
    parser.add_argument("--connections", type=int, default=8,
                        help="the flooding runner's requests at once")
    parser.add_argument("--out", help="results file (default ~/.cache/agentrun/bench/"
                                      "store-flood-<time>.txt; '-' for stdout only)")
    parser.add_argument("--flooder", nargs=4, metavar=("URL", "TOKEN_FILE", "SESSION", "CA"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.flooder:
        url, token_file, session, ca = args.flooder
        return flood(url, Path(token_file), session, args.connections, Path(ca))
    if args.writes < 100:
        parser.error("--writes must be at least 100 (a p99 of fewer says little)")
    out = results_file("store-flood", args.out)

    from agentrun_devtools.controlplane import ControlPlane
    from agentrun_devtools.postgres import Postgres

    from tests.cluster_fixtures import apply_crds
    from tests.runner_world import RunnerWorld

    say = Report()
    work = Path(tempfile.mkdtemp(prefix="agentrun-bench-flood-"))
    ok = False
    with contextlib.ExitStack() as stack:
        try:
            plane = ControlPlane(work / "cp").start()
            stack.callback(plane.stop)
            pg = Postgres().start()
            stack.callback(pg.stop)
            apply_crds(plane)
            url = pg.create_database("flood")
            asyncio.run(store.migrate(url))
            world = RunnerWorld(plane, "solo-bench-flood-a", work)
            stack.callback(world.stop)
            world.create_namespace("solo-bench-flood-a")
            world.create_namespace("solo-bench-flood-b")
            api = world.store_api(url)

            def runner(tag: str, namespace: str) -> tuple[Path, str]:
                """An attempt begun, its session created: (token file, session id)."""
                _, token_file, session = begun(world, api.url, url, tag, namespace)
                return token_file, session

            flooder_token, flooder_session = runner("flooder", "solo-bench-flood-a")
            # Enough of B's runs for the longest flood this machine has seen, and more made
            # should it last longer.
            made = [runner(f"writer{i}", "solo-bench-flood-b")[0] for i in range(6)]
            writers = itertools.chain(made, (runner(f"writer{i}", "solo-bench-flood-b")[0]
                                             for i in itertools.count(len(made))))
            say(f"bench/store_flood.py, {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} "
                f"UTC, {os.cpu_count()} CPUs: Postgres {pg.port} (fsync=off), "
                f"agentrun-store-api {api.url} (its own process); load average {load()}")

            tls = plane.store_api_tls
            assert tls is not None
            idle = asyncio.run(ledger_writes(api.url, writers, args.writes, args.warmup,
                                             args.pause, ca=tls.ca.read_text()))
            flooder = subprocess.Popen(
                [sys.executable, __file__, "--connections", str(args.connections),
                 "--flooder", api.url, str(flooder_token), flooder_session, str(tls.ca)],
                stdout=subprocess.PIPE, text=True)
            try:
                # The flood under way: the flooder's first request has been answered (its
                # imports and the events it makes first take a few seconds).
                sign = flooder.stdout.readline() if flooder.stdout else ""
                if "flooding" not in sign:
                    raise RuntimeError(f"the flooder did not start: {sign!r}")
                started = time.monotonic()
                flooded = asyncio.run(ledger_writes(
                    api.url, writers, args.writes, args.warmup, args.pause,
                    going=lambda: flooder.poll() is None, ca=tls.ca.read_text()))
                lasted = time.monotonic() - started
                report, _ = flooder.communicate(timeout=600)
            finally:
                if flooder.poll() is None:
                    flooder.kill()
            told = json.loads(report.strip().splitlines()[-1]) if report.strip() else {}
            got, spent, ended = told.get("got", {}), told.get("quota spent at"), \
                told.get("ended at")
            if ended is None:
                raise RuntimeError(f"the flooder did not say when it ended: {report!r}")
            # B writes until the flooder's process is gone: a write begun after A's last
            # request was answered was not written during the flood.
            tail = [(t, took) for t, took in flooded if t - took > ended]
            flooded = [(t, took) for t, took in flooded if t - took <= ended]
            after = asyncio.run(ledger_writes(api.url, writers, args.writes, args.warmup,
                                              args.pause, ca=tls.ca.read_text()))

            say(f"\nTenant B's ledger write (open_call + close_call through StoreClient; in "
                f"brackets the ratio to idle): "
                f"{len(idle)} idle, then {len(flooded)} while tenant A floods with "
                f"{args.connections} connections ({len(tail)} more once A's last request "
                f"was answered, not counted), then {len(after)} idle again, each after "
                f"{args.warmup} warm-up; the anchor is both idle runs pooled")
            say("| | p50 | p95 | p99 |\n|---|---|---|---|")
            a = percentiles([s for _, s in idle + after])
            b = percentiles([s for _, s in flooded])
            for label, part in (("idle, before the flood", idle),
                                ("idle, after the flood", after)):
                c = percentiles([s for _, s in part])
                say(f"| {label} | " + " | ".join(
                    f"{c[k] * 1000:.2f} ms ({c[k] / a[k]:.2f})"
                    for k in ("p50", "p95", "p99")) + " |")
            say("| idle, pooled (anchor) | " + " | ".join(
                f"{a[k] * 1000:.2f} ms" for k in ("p50", "p95", "p99")) + " |")
            say("| during the flood | " + " | ".join(
                f"{b[k] * 1000:.2f} ms" for k in ("p50", "p95", "p99")) + " |")
            say("| ratio flood / anchor | " + " | ".join(
                f"{b[k] / a[k]:.2f}" for k in ("p50", "p95", "p99")) + " |")
            if spent is not None:
                for label, part in (
                        ("while A's 4,000 events are stored", [s for t, s in flooded
                                                              if t < spent]),
                        ("once A's quota is spent (429s)", [s for t, s in flooded
                                                            if t >= spent])):
                    if len(part) >= 100:
                        c = percentiles(part)
                        say(f"| {label} ({len(part)}) | " + " | ".join(
                            f"{c[k] * 1000:.2f} ms ({c[k] / a[k]:.2f})"
                            for k in ("p50", "p95", "p99")) + " |")
            say(f"\np99 ratio {b['p99'] / a['p99']:.2f} (goal: at most 2.00)")
            total = sum(got.values())
            say(f"\nTenant A's requests ({total} in {lasted:.1f} s, "
                f"{total / max(lasted, 1e-9):.0f}/s), by what they were and what they got:")
            for key in sorted(got):
                say(f"- {key}: {got[key]}")
            say(f"\nload average at the end {load()} (other processes share these CPUs)")
            ok = True
        finally:
            if not ok:
                print(f"bench failed; logs kept in {work}", file=sys.stderr)
    if ok:
        shutil.rmtree(work, ignore_errors=True)
        write_results("\n".join(say.lines), out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
