"""What the write-ahead tool ledger costs per tool call: straight to Postgres (the anchor)
beside through the store API (what runner pods do), in one run.

    .venv/bin/python bench/ledger.py [--writes 500] [--warmup 50] [--first 50]
                                     [--calls 21] [--runs 25] [--out PATH]

Starts its own throwaway Postgres (fsync=off, as the test server), a real control plane
with agentrun's CRDs, a namespace, and a real `agentrun-store-api` process for the store;
runner identities are real: an AgentRun, its attempt's pod (never scheduled) and a token
bound to that pod by TokenRequest, exactly what the store API verifies in a cluster
(tests/runner_world.py). Then:

1. the ledger write of one tool call (open_call + close_call), `--writes` calls after
   `--warmup`, interleaved call by call: straight to Postgres (store.open_call/close_call
   on an engine) and through the store API (StoreClient, token cached); p50/p95/p99 and
   the ratio API/direct (the goal: within 1.5x), with the store API's own time (its
   Server-Timing header) for the split. The attempt's liveness is no separate read: each
   ledger write checks it in its own statement, as the direct write does. Interleaved with
   them, the HTTP floor: the same two requests (sizes, token, TLS, aiohttp on both ends)
   to a bare aiohttp server in its own process that stores nothing (`--echo-server`), what
   any store API over HTTPS costs on this machine before it does any work; and the same
   server writing each row straight (store.open_call / close_call, no token, no checks):
   what a store API in its own process, in Python over TLS, takes before its own work;
2. the first call with a token the store API has not verified yet (`--first` each): a new
   attempt's pod and token (TokenReview + pod read), and a refreshed token of a known pod
   (TokenReview only), beside the next, cached, call and a TokenReview alone;
3. the tool call round trip through ADK (scripted model -> function-call event appended to
   the session -> tool -> response event), timed between consecutive tool calls (each
   interval holds one close and one open), `--runs` runs x (`--calls` - 1) intervals per
   variant, variants interleaved run by run: with sessions straight in the database (as
   before: only the ledger varies) without a ledger, with the direct-database ledger and
   with the ledger through the store API; and with sessions through the store API too
   (everything a runner does now) without and with the ledger (the goal: within 1.2x).
   The ledger's close goes on its way while the tool's answer goes back to the model, riding
   on the next call's open (the runner's WriteAheadLedger), and is flushed before the run
   ends; with the ledger through the store API and sessions through it too, the model's
   turn that calls the tool rides on that open as well (StoreSessionService with
   turns_ride_on_open, as runners have it).

The output goes to stdout and to `--out` (default ~/.cache/agentrun/bench/ledger-<time>.txt
as docs/development.md says; `--out -` for stdout only).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import itertools
import os
import shutil
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from aiohttp import web

ROOT = Path(__file__).resolve().parent.parent
for extra in (ROOT / "devtools", ROOT / "runner-image", ROOT / "store-api-image", ROOT):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

from agentrun_devtools.controlplane import ControlPlane  # noqa: E402
from agentrun_devtools.postgres import Postgres  # noqa: E402
from agentrun_devtools.stats import results_file, write_results  # noqa: E402
from agentrun_runner.ledger import WriteAheadLedger  # noqa: E402
from agentrun_runner.retries import CallWatch, ModelRetries  # noqa: E402
from agentrun_runner.scripted import ScriptedLlm  # noqa: E402
from agentrun_runner.store_client import StoreClient, StoreSessionService  # noqa: E402
from google.adk.agents import LlmAgent  # noqa: E402
from google.adk.apps.app import App  # noqa: E402
from google.adk.plugins.base_plugin import BasePlugin  # noqa: E402
from google.adk.runners import Runner  # noqa: E402
from google.adk.sessions.base_session_service import BaseSessionService  # noqa: E402
from google.adk.sessions.database_session_service import DatabaseSessionService  # noqa: E402
from google.genai import types  # noqa: E402
from sqlalchemy.ext.asyncio import AsyncEngine  # noqa: E402

from agentrun import store  # noqa: E402
from agentrun.vocabulary import STORE_AUDIENCE  # noqa: E402
from tests.cluster_fixtures import apply_crds  # noqa: E402
from tests.runner_world import Identity, RunnerWorld  # noqa: E402

NAMESPACE = "solo-bench-ledger"
AGENT = "bench-agent"
USER = "bench"
DIGEST = store.args_digest({"to": "x@example.com", "body": "hello"})


# -- figures ---------------------------------------------------------------------------------


def percentiles(values: list[float]) -> dict[str, float]:
    q = statistics.quantiles(values, n=100, method="inclusive")
    return {"p50": statistics.median(values), "p95": q[94], "p99": q[98]}


def row(label: str, values: list[float], *extra: str) -> str:
    p = percentiles(values)
    return (f"| {label} | " + " | ".join(f"{p[k] * 1000:.2f} ms" for k in ("p50", "p95", "p99"))
            + "".join(f" | {e}" for e in extra) + " |")


def ratio_row(label: str, num: list[float], den: list[float]) -> str:
    a, b = percentiles(num), percentiles(den)
    return f"| {label} | " + " | ".join(f"{a[k] / b[k]:.2f}" for k in ("p50", "p95", "p99")) + " |"


def p50(values: list[float]) -> float:
    return statistics.median(values)


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


class Report:
    """Lines to stdout as they come, and to the results file at the end."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def __call__(self, line: str = "") -> None:
        self.lines.append(line)
        print(line, flush=True)


# -- runs and their identities ---------------------------------------------------------------


@dataclass
class Attempt:
    """Attempt 1 of a run, written down as the operator writes it before the pod."""

    uid: str
    name: str
    session_id: str
    identity: Identity | None = None


async def new_attempt(engine: AsyncEngine, world: RunnerWorld | None, tag: str) -> Attempt:
    """With `world`: an AgentRun, its attempt's pod and a token bound to it (for the store
    API); without: the store's rows only (for the direct variants)."""
    if world is not None:
        name, uid = world.agent_run(tag, agent=AGENT, user_id=USER)
    else:
        uid = str(uuid.uuid4())
        name = f"run-{tag}-{uid[:8]}"
    attempt = Attempt(uid, name, f"{uid}-1")
    digest = await store.put_input(engine, "bench", {},
                                  key=await store.installation_key(engine))
    await store.record_run(engine, uid, NAMESPACE, name, AGENT, "manual", USER, digest)
    await store.start_attempt(engine, uid, 1, attempt.session_id, f"{name}-1")
    if world is not None:
        attempt.identity = world.identity(name, uid, 1)
    return attempt


class DirectLedgerStore:
    """The store calls WriteAheadLedger makes, straight on an engine (the ledger before
    the store API): the same plugin, only the transport differs."""

    def __init__(self, engine: AsyncEngine, uid: str, attempt: int) -> None:
        self.engine, self.uid, self.attempt = engine, uid, attempt

    async def record_invocation(self, invocation_id: str) -> None:
        await store.record_invocation(self.engine, self.uid, self.attempt, invocation_id)

    async def open_call(self, seq: int, tool: str, call_id: str | None, digest: str,
                        effect: str | None = None, key: str | None = None,
                        closes: Sequence[tuple[int, str, Any]] = ()) -> list[int]:
        return await store.open_call(self.engine, self.uid, self.attempt, seq, tool, call_id,
                                     digest, effect, key,
                                     [store.CallClose(*c) for c in closes])

    async def close_call(self, seq: int, outcome: str, result: Any = None) -> None:
        await store.close_call(self.engine, self.uid, self.attempt, seq, outcome, result)


class TimedStoreClient(StoreClient):
    """A StoreClient that keeps the store API's own time per request (its Server-Timing
    header), in seconds."""

    def __init__(self, url: str, token_file: Path, ca: str | None = None) -> None:
        super().__init__(url, token_file, ca)
        self.served: list[float] = []

    def _answered(self, status: int, headers: Mapping[str, str]) -> None:
        value = headers.get("Server-Timing", "")
        if "dur=" in value:
            self.served.append(float(value.split("dur=")[1].split(";")[0]) / 1000)


# -- the HTTP floor: a bare aiohttp server over TLS, storing nothing ---------------------------


def echo_server(cert: str, key: str, database_url: str | None = None,
                uid: str | None = None) -> int:
    """`--echo-server CERT KEY [DATABASE_URL RUN_UID]`: answers every POST with `{}` after
    reading its JSON body, over TLS with the store API's certificate; prints its port,
    serves until stdin closes. With a database, it also writes what the body says straight
    (store.open_call for `POST /v1/ledger`, store.close_call for `.../{seq}/close`, attempt
    1 of RUN_UID) and nothing else: no token, no checks, no quotas."""

    async def serve() -> None:
        engine = store.make_engine(database_url) if database_url else None

        async def answer(request: web.Request) -> web.Response:
            data = await request.json()
            if engine is not None and uid is not None:
                path = request.match_info["path"]
                if path.endswith("/close"):
                    await store.close_call(engine, uid, 1, int(path.split("/")[-2]),
                                           data["outcome"], data.get("result"))
                else:
                    await store.open_call(engine, uid, 1, data["seq"], data["tool"],
                                          data.get("callId"), data["argsDigest"])
            return web.json_response({})

        app = web.Application()
        app.router.add_post("/{path:.*}", answer)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(cert, key)
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
        await site.start()
        print(site._server.sockets[0].getsockname()[1], flush=True)  # type: ignore[union-attr]
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
        await runner.cleanup()
        if engine is not None:
            await engine.dispose()

    asyncio.run(serve())
    return 0


@contextlib.contextmanager
def started_echo_server(world: RunnerWorld, *writes_to: str) -> Any:
    """The floor's server, in its own process as the store API is: its URL. `writes_to`:
    the database URL and run uid it writes the ledger rows to, when it writes them."""
    tls = world.plane.store_api_tls
    assert tls is not None
    child = subprocess.Popen([sys.executable, __file__, "--echo-server", str(tls.cert),
                              str(tls.key), *writes_to], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        port = int(child.stdout.readline())
        yield f"https://127.0.0.1:{port}"
    finally:
        assert child.stdin is not None
        child.stdin.close()
        try:
            child.wait(10)
        except subprocess.TimeoutExpired:
            child.kill()


# -- 1. the ledger write per tool call -------------------------------------------------------


@dataclass
class Writes:
    direct: list[float]
    api: list[float]
    api_server: list[float]  # both requests' Server-Timing, summed
    floor: list[float]  # the same two requests to the echo server
    bare: list[float]  # ...to the echo server that writes them straight


def store_ca(world: RunnerWorld) -> str:
    """The CA of the store API's certificate, as runners get it (AGENTRUN_STORE_CA)."""
    tls = world.plane.store_api_tls
    assert tls is not None
    return tls.ca.read_text()


async def ledger_writes(engine: AsyncEngine, world: RunnerWorld, url: str, api_url: str,
                        n: int, warmup: int) -> Writes:
    direct_run = await new_attempt(engine, None, "direct")
    bare_run = await new_attempt(engine, None, "bare")
    api_run = await new_attempt(engine, world, "api")
    assert api_run.identity is not None
    client = TimedStoreClient(api_url, api_run.identity.token_file, store_ca(world))
    served = client.served
    out = Writes([], [], [], [], [])
    with started_echo_server(world) as echo_url, \
            started_echo_server(world, url, bare_run.uid) as bare_url:
        # The same client, so the same two requests (token, bodies, headers), to the echo.
        floor = StoreClient(echo_url, api_run.identity.token_file, store_ca(world))
        bare = StoreClient(bare_url, api_run.identity.token_file, store_ca(world))
        try:
            await client.begin()  # the runner's first call: the token is verified here
            for seq in range(1, warmup + n + 1):
                t0 = time.perf_counter()
                await store.open_call(engine, direct_run.uid, 1, seq, "send_email",
                                      f"c{seq}", DIGEST)
                await store.close_call(engine, direct_run.uid, 1, seq, "ok")
                t1 = time.perf_counter()
                del served[:]
                await client.open_call(seq, "send_email", f"c{seq}", DIGEST)
                await client.close_call(seq, "ok")
                t2 = time.perf_counter()
                await floor.open_call(seq, "send_email", f"c{seq}", DIGEST)
                await floor.close_call(seq, "ok")
                t3 = time.perf_counter()
                await bare.open_call(seq, "send_email", f"c{seq}", DIGEST)
                await bare.close_call(seq, "ok")
                t4 = time.perf_counter()
                if seq > warmup:
                    out.direct.append(t1 - t0)
                    out.api.append(t2 - t1)
                    out.api_server.append(sum(served))
                    out.floor.append(t3 - t2)
                    out.bare.append(t4 - t3)
        finally:
            await client.close()
            await floor.close()
            await bare.close()
    written = await store.ledger(engine, bare_run.uid)
    assert len(written) == warmup + n and all(r.finished_at for r in written), \
        "the writing floor did not write every row"
    return out


# -- 2. the first call with a token not yet verified -----------------------------------------


@dataclass
class FirstCalls:
    new_pod: list[float]
    new_pod_next: list[float]
    refreshed: list[float]
    refreshed_next: list[float]
    review: list[float]


async def first_calls(engine: AsyncEngine, world: RunnerWorld, api_url: str, work: Path,
                      n: int) -> FirstCalls:
    token_file = work / "first-call.token"
    token_file.write_text("-")
    # One client, its connection kept: what is timed is the store API's side.
    client = StoreClient(api_url, token_file, store_ca(world))
    out = FirstCalls([], [], [], [], [])
    try:
        warm = await new_attempt(engine, world, "warm")
        assert warm.identity is not None
        token_file.write_text(warm.identity.token)
        await client.begin()

        async def pair(seq: int) -> tuple[float, float]:
            t0 = time.perf_counter()
            await client.open_call(seq, "send_email", f"c{seq}", DIGEST)
            t1 = time.perf_counter()
            await client.close_call(seq, "ok")
            t2 = time.perf_counter()
            await client.open_call(seq + 1, "send_email", f"c{seq + 1}", DIGEST)
            t3 = time.perf_counter()
            await client.close_call(seq + 1, "ok")
            return t1 - t0, t3 - t2

        # A new attempt: its pod and its token, both unknown to the store API.
        for i in range(n):
            attempt = await new_attempt(engine, world, f"first{i}")
            assert attempt.identity is not None
            token_file.write_text(attempt.identity.token)
            first, cached = await pair(1)
            out.new_pod.append(first)
            out.new_pod_next.append(cached)

        # The kubelet's refresh: a new token bound to the same pod (the pod read is cached
        # by pod uid, so only TokenReview is new). Also what a token costs once its 30 s
        # in the cache are over.
        known = await new_attempt(engine, world, "refresh")
        assert known.identity is not None
        token_file.write_text(known.identity.token)
        await client.open_call(1, "send_email", "c1", DIGEST)
        await client.close_call(1, "ok")
        seq = 2
        for _ in range(n):
            token_file.write_text(world.token(world.namespace, known.identity.pod,
                                              known.identity.pod_uid, STORE_AUDIENCE))
            first, cached = await pair(seq)
            seq += 2
            out.refreshed.append(first)
            out.refreshed_next.append(cached)

        # TokenReview alone, from here, for tokens the API server has not seen either
        # (the kubernetes client the store API uses, synchronously as in its thread).
        for _ in range(n):
            token = world.token(world.namespace, known.identity.pod, known.identity.pod_uid,
                                STORE_AUDIENCE)
            review = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                      "spec": {"token": token, "audiences": [STORE_AUDIENCE]}}
            t0 = time.perf_counter()
            world.auth.create_token_review(review, _preload_content=False)
            out.review.append(time.perf_counter() - t0)
    finally:
        await client.close()
    return out


# -- 3. the tool call round trip through ADK -------------------------------------------------

_stamps: list[float] = []


async def noop_tool(customer: str) -> dict[str, str]:
    """A tool that does nothing, so that only the machinery is measured."""
    _stamps.append(time.perf_counter())
    return {"customer": customer}


@dataclass(frozen=True)
class Variant:
    label: str
    sessions_via_api: bool
    ledger: str  # "none", "direct" or "api"


VARIANTS = (
    Variant("sessions in the database, no ledger (anchor)", False, "none"),
    Variant("sessions in the database, ledger straight to Postgres (before)", False, "direct"),
    Variant("sessions in the database, ledger through the store API", False, "api"),
    Variant("sessions through the store API, no ledger", True, "none"),
    Variant("sessions through the store API, ledger through the store API (runners now)",
            True, "api"),
)


async def adk_run(engine: AsyncEngine, world: RunnerWorld, api_url: str, variant: Variant,
                  calls: int) -> list[float]:
    """Seconds between consecutive tool calls of one run of `calls` tool calls."""
    needs_api = variant.sessions_via_api or variant.ledger == "api"
    attempt = await new_attempt(engine, world if needs_api else None, "adk")
    client: StoreClient | None = None
    if needs_api:
        assert attempt.identity is not None
        client = StoreClient(api_url, attempt.identity.token_file, store_ca(world))
        # As a runner does first: its token verified (and cached) before the agent starts.
        await client.begin()
    else:
        await store.begin_attempt(engine, attempt.uid, 1, store.session_app(NAMESPACE, AGENT),
                                  USER, attempt.session_id)
    script: list[dict[str, Any]] = [
        {"call": "noop_tool", "args": {"customer": str(i)}} for i in range(calls)]
    script.append({"text": "done"})
    model = ScriptedLlm(script=script)
    agent = LlmAgent(name="bench_agent", instruction="bench", tools=[noop_tool], model=model)
    sessions: BaseSessionService = (
        StoreSessionService(client, turns_ride_on_open=variant.ledger == "api")
        if variant.sessions_via_api and client is not None
        else DatabaseSessionService(db_engine=engine))
    plugins: list[BasePlugin] = [ModelRetries({agent.name: model}, CallWatch())]
    if variant.ledger == "api":
        assert client is not None
        plugins.append(WriteAheadLedger(client))
    elif variant.ledger == "direct":
        plugins.append(WriteAheadLedger(
            cast(StoreClient, DirectLedgerStore(engine, attempt.uid, 1))))
    runner = Runner(app=App(name=AGENT, root_agent=agent, plugins=plugins),
                    session_service=sessions)
    ledgers = [p for p in plugins if isinstance(p, WriteAheadLedger)]
    try:
        await sessions.create_session(app_name=AGENT, user_id=USER,
                                      session_id=attempt.session_id)
        message = types.Content(role="user", parts=[types.Part(text="go")])
        del _stamps[:]
        async for _ in runner.run_async(user_id=USER, session_id=attempt.session_id,
                                        new_message=message):
            pass
        if len(_stamps) != calls:
            raise RuntimeError(f"{variant.label}: {len(_stamps)} tool calls, not {calls}")
        return [b - a for a, b in itertools.pairwise(_stamps)]
    finally:
        for ledger in ledgers:  # as the runner does before it reports the outcome
            await ledger.flush()
        await runner.close()
        if client is not None:
            await client.close()


# -- the whole bench -------------------------------------------------------------------------


async def bench(engine: AsyncEngine, world: RunnerWorld, url: str, api_url: str, work: Path,
                args: argparse.Namespace, say: Report) -> None:
    w = await ledger_writes(engine, world, url, api_url, args.writes, args.warmup)
    say(f"\nLedger write per tool call (open_call + close_call, two commits), {args.writes} "
        f"calls after {args.warmup} warm-up, interleaved call by call")
    say("| | p50 | p95 | p99 |\n|---|---|---|---|")
    say(row("straight to Postgres (store.open_call + close_call; anchor)", w.direct))
    say(row("through the store API (StoreClient -> agentrun-store-api, token cached)", w.api))
    say(ratio_row("ratio API / direct", w.api, w.direct))
    say(row("the HTTP floor: the same two requests to a bare aiohttp server over TLS that "
            "stores nothing", w.floor))
    say(row("the floor with the write: the same two requests to that bare server in its own "
            "process, writing each row straight (store.open_call / close_call, nothing else)",
            w.bare))
    say(ratio_row("ratio floor with the write / direct", w.bare, w.direct))
    added = p50(w.api) - p50(w.direct)
    say(f"\nthe store API adds {added * 1000:.2f} ms per tool call (p50 difference), "
        f"{added * 500:.2f} ms per request; of the API's two requests:")
    say(f"- inside the store API (Server-Timing, both requests): p50 "
        f"{p50(w.api_server) * 1000:.2f} ms, against {p50(w.direct) * 1000:.2f} ms for the "
        f"two writes straight (the liveness check is in each write's own statement)")
    say(f"- outside it (HTTP, JSON, client and event loops): p50 "
        f"{(p50(w.api) - p50(w.api_server)) * 1000:.2f} ms for the two requests")
    say(f"- the HTTP floor alone (two requests to a server that stores nothing): p50 "
        f"{p50(w.floor) * 1000:.2f} ms; the straight write plus that floor, the least any store "
        f"API over HTTPS could take here: {(p50(w.direct) + p50(w.floor)) / p50(w.direct):.2f}x "
        f"the straight write; the store API's own work over both (its handlers, "
        f"authentication, quotas, its engine): "
        f"{(p50(w.api) - p50(w.direct) - p50(w.floor)) * 1000:.2f} ms")
    say(f"- the floor with the write (an HTTPS hop to a process that writes straight, nothing "
        f"else): p50 {p50(w.bare) * 1000:.2f} ms, {p50(w.bare) / p50(w.direct):.2f}x the "
        f"straight write: what any store API in its own process, in Python over TLS, takes "
        f"here before its own checks; the store API over it (its token, quotas, checks, "
        f"answers): {(p50(w.api) - p50(w.bare)) * 1000:.2f} ms per tool call")
    say(f"\nledger write through the store API / straight (p50): "
        f"{p50(w.api) / p50(w.direct):.2f}x (goal: at most 1.50x)")

    f = await first_calls(engine, world, api_url, work, args.first)
    say(f"\nFirst call with a token the store API has not verified (open_call alone, "
        f"{args.first} each; the token and the pod are then cached for 30 s)")
    say("| | p50 | p95 | p99 |\n|---|---|---|---|")
    say(row("new attempt: new pod + new token (TokenReview + pod read + check + insert)",
            f.new_pod))
    say(row("  its next call (cached)", f.new_pod_next))
    say(row("refreshed token of a known pod (TokenReview + check + insert)", f.refreshed))
    say(row("  its next call (cached)", f.refreshed_next))
    say(row("TokenReview alone (kubernetes client -> kube-apiserver, fresh token)", f.review))
    new_pod = p50(f.new_pod) - p50(f.new_pod_next)
    refreshed = p50(f.refreshed) - p50(f.refreshed_next)
    say(f"\nfirst call over cached (p50): new pod +{new_pod * 1000:.2f} ms, refreshed token "
        f"+{refreshed * 1000:.2f} ms (TokenReview); the pod read is the difference")

    for variant in VARIANTS:  # warm-up: plans, pools, ADK's first-use costs
        await adk_run(engine, world, api_url, variant, 5)
    trips: dict[Variant, list[float]] = {v: [] for v in VARIANTS}
    for _ in range(args.runs):  # interleaved, so that drift hits all alike
        for variant in VARIANTS:
            trips[variant].extend(await adk_run(engine, world, api_url, variant, args.calls))
    n = args.runs * (args.calls - 1)
    say(f"\nTool call round trip through ADK, per tool call (between consecutive tool calls: "
        f"one close + one open each), {args.runs} runs x {args.calls - 1} = {n} per variant")
    say("| | p50 | p95 | p99 | ratio to its no-ledger (p50) |\n|---|---|---|---|---|")
    anchor_db, anchor_api = trips[VARIANTS[0]], trips[VARIANTS[3]]
    for variant in VARIANTS:
        base = anchor_api if variant.sessions_via_api else anchor_db
        say(row(variant.label, trips[variant], f"{p50(trips[variant]) / p50(base):.2f}"))
    now = trips[VARIANTS[4]]
    say(f"\nrunners now (sessions and ledger through the store API) / the same without the "
        f"ledger (p50): {p50(now) / p50(anchor_api):.2f}x (goal: at most 1.20x)")
    db_api, db_direct = trips[VARIANTS[2]], trips[VARIANTS[1]]
    say(f"\nledger through the store API over the direct ledger (sessions alike): p50 "
        f"{p50(db_api) / p50(db_direct):.2f}x (+{(p50(db_api) - p50(db_direct)) * 1000:.2f} ms"
        " per tool call)")


def main() -> int:
    if sys.argv[1:2] == ["--echo-server"]:
        return echo_server(*sys.argv[2:6])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--writes", type=int, default=500,
                        help="ledger writes per variant, after the warm-up")
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--first", type=int, default=50,
                        help="first calls with an unverified token, per kind")
    parser.add_argument("--calls", type=int, default=21, help="tool calls per ADK run")
    parser.add_argument("--runs", type=int, default=25, help="ADK runs per variant")
    parser.add_argument("--out", help="results file (default ~/.cache/agentrun/bench/"
                                      "ledger-<time>.txt; '-' for stdout only)")
    args = parser.parse_args()
    if args.calls < 2 or args.writes < 2 or args.first < 2:
        parser.error("--calls, --writes and --first must be at least 2")
    if args.runs * (args.calls - 1) < 2:
        parser.error("--runs x (--calls - 1), the round trips per variant, must be at least 2")
    out = results_file("ledger", args.out)

    say = Report()
    work = Path(tempfile.mkdtemp(prefix="agentrun-bench-ledger-"))
    ok = False
    with contextlib.ExitStack() as stack:
        try:
            plane = ControlPlane(work / "cp").start()
            stack.callback(plane.stop)
            pg = Postgres().start()
            stack.callback(pg.stop)
            apply_crds(plane)
            url = pg.create_database("bench")
            asyncio.run(store.migrate(url))
            world = RunnerWorld(plane, NAMESPACE, work)
            stack.callback(world.stop)
            world.create_namespace(NAMESPACE)
            api = world.store_api(url)
            say(f"bench/ledger.py, {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, "
                f"{os.cpu_count()} CPUs: Postgres {pg.port} (fsync=off, as the test server), "
                f"kube-apiserver {plane.server}, agentrun-store-api {api.url} (its own "
                f"process); load average {load()}")

            async def go() -> None:
                engine = store.make_engine(url)
                try:
                    await bench(engine, world, url, api.url, work, args, say)
                finally:
                    await engine.dispose()

            asyncio.run(go())
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
