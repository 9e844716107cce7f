"""One viewer opens 200 transcript follows at once; how long do another tenant's ledger
writes take then, against the same writes to an idle store API (api.md, Tenant policy:
"a user holds at most a few follow streams at once (429 with Retry-After beyond)")?

    .venv/bin/python bench/follow_flood.py [--follows 200] [--seconds 60] [--writes 1000]
                                           [--warmup 30] [--pause 0.01] [--out PATH]

Starts its own throwaway Postgres (fsync=off, as the test server), a real control plane
with agentrun's CRDs and the front-proxy flags an aggregated API needs, and one real
`agentrun-store-api` process serving both what the chart's store API serves: the runners'
routes (TLS, tokens bound to pods by TokenRequest: tests/runner_world.py) and the transcript
API (`--transcript-listen`, registered as APIService v1alpha1.store.agentrun.dev, reached
through the API server). Two tenants, two namespaces:

- tenant A's viewer (a client certificate of the cluster's CA, bound to agentrun-view in
  A's namespace) follows a live run of A: `--follows` threads in their own process, each
  with a kept-alive connection to the API server, each asking GET
  .../transcripts/RUN?follow=true and reading the stream to its end, again and again. The
  transcript API holds FOLLOWS_PER_USER of them (each reads the store and the AgentRun
  every second) and answers the rest 429 with Retry-After;
- tenant B's runner writes ledger rows (open_call + close_call through StoreClient, as a
  runner's ledger does, `--pause` seconds apart), as bench/store_flood.py does.

Phases, one after the other in this one run, B writing all along:

1. idle, before: B's `--writes` ledger writes, after `--warmup`;
2. follows, polite: the viewer's threads wait the Retry-After a 429 names before asking
   again (what a client that reads the header does), for `--seconds`;
3. follows, at once: the refused threads ask again at once (a viewer who ignores the
   header), for `--seconds`;
4. idle, after: as 1, once the viewer's process has exited: the anchor is the idle store
   API on both sides (the machine's load drifts).

It prints B's p50/p95/p99 in each phase, the pooled idle anchor and each flood's ratio to
it (the goal: p99 within 2x), and what the viewer's requests got (streams held at most at
once, 200s, 429s and their Retry-After). A figure, not an assertion:
tests/operator/test_transcript.py checks the 429s themselves. The output goes to stdout
and to `--out` (default ~/.cache/agentrun/bench/follow-flood-<time>.txt; `--out -` for
stdout only).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import http.client
import itertools
import json
import os
import shutil
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for extra in (ROOT / "devtools", ROOT / "runner-image", ROOT / "store-api-image", ROOT):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

from agentrun_devtools.stats import results_file, write_results  # noqa: E402
from store_flood import Report, begun, ledger_writes, load, percentiles  # noqa: E402

from agentrun import store  # noqa: E402

VIEWER = "viewer"
A, B = "solo-bench-follow-a", "solo-bench-follow-b"


# -- the viewer (its own process) ---------------------------------------------------------


def follow(server: str, port: int, ca: str, cert: str, key: str, path: str, follows: int,
           seconds: float, at_once: bool) -> int:
    """`follows` threads following `path` through the API server for `seconds`; prints
    the word that every thread had its first answer, then what the requests got (JSON)."""
    context = ssl.create_default_context(cafile=ca)
    context.load_cert_chain(cert, key)
    got: Counter[str] = Counter()
    retry_after: Counter[str] = Counter()
    lock = threading.Lock()
    held = [0, 0]  # now, most at once
    answered = threading.Barrier(follows + 1)
    deadline = time.monotonic() + seconds
    connections: list[http.client.HTTPSConnection] = []

    def one() -> None:
        connection = http.client.HTTPSConnection(server, port, timeout=120, context=context)
        with lock:
            connections.append(connection)
        first = True
        while time.monotonic() < deadline:
            try:
                connection.request("GET", path)
                response = connection.getresponse()
                code = str(response.status)
                if response.status == 200:
                    with lock:
                        held[0] += 1
                        held[1] = max(held[1], held[0])
                    if first:
                        first = False
                        answered.wait()
                    try:
                        response.read()  # the stream, to its end (the run's or FOLLOW_SECONDS)
                    finally:
                        with lock:
                            held[0] -= 1
                else:
                    response.read()
                    wait = response.getheader("Retry-After") or ""
                    with lock:
                        retry_after[wait] += 1
                    if first:
                        first = False
                        answered.wait()
                    if not at_once and wait.isdigit():
                        time.sleep(min(float(wait), max(0.0, deadline - time.monotonic())))
            # A stream still held at the deadline is closed under its reader (its
            # response's file is gone then: AttributeError).
            except (OSError, http.client.HTTPException, AttributeError) as e:
                code = type(e).__name__
                if time.monotonic() >= deadline:
                    break
                connection.close()
                connection = http.client.HTTPSConnection(server, port, timeout=120,
                                                         context=context)
                with lock:
                    connections.append(connection)
            with lock:
                got[code] += 1
        if first:
            answered.wait()

    threads = [threading.Thread(target=one, daemon=True) for _ in range(follows)]
    for t in threads:
        t.start()
    answered.wait()
    print(json.dumps({"following": time.time()}), flush=True)
    time.sleep(max(0.0, deadline - time.monotonic()))
    with lock:
        for connection in connections:  # the streams still held end here
            with contextlib.suppress(OSError):
                connection.close()
    for t in threads:
        t.join(timeout=10)
    print(json.dumps({"got": dict(got), "retryAfter": dict(retry_after),
                      "heldAtOnce": held[1]}), flush=True)
    return 0


# -- the bench ------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--follows", type=int, default=200,
                        help="follow requests the viewer keeps going at once")
    parser.add_argument("--seconds", type=float, default=60.0,
                        help="how long each flood phase lasts (longer than a stream's "
                             "45 s, so held streams end and are asked for again)")
    parser.add_argument("--writes", type=int, default=1000,
                        help="tenant B's ledger writes per idle phase, after the warm-up "
                             "(and at least as many in each flood phase)")
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--pause", type=float, default=0.01,
                        help="seconds between two of B's ledger writes")
    parser.add_argument("--out", help="results file (default ~/.cache/agentrun/bench/"
                                      "follow-flood-<time>.txt; '-' for stdout only)")
    parser.add_argument("--viewer", nargs=7, help=argparse.SUPPRESS,
                        metavar=("SERVER", "PORT", "CA", "CERT", "KEY", "PATH", "MODE"))
    args = parser.parse_args()
    if args.viewer:
        server, port, ca, cert, key, path, mode = args.viewer
        return follow(server, int(port), ca, cert, key, path, args.follows, args.seconds,
                      at_once=mode == "at-once")
    if args.writes < 100:
        parser.error("--writes must be at least 100 (a p99 of fewer says little)")
    out = results_file("follow-flood", args.out)

    from agentrun_devtools import transcript_api
    from agentrun_devtools.controlplane import ControlPlane
    from agentrun_devtools.postgres import Postgres
    from agentrun_devtools.processes import free_port
    from agentrun_devtools.transcript_api import TranscriptEndpoint
    from agentrun_store_api.transcripts import FOLLOWS_PER_USER

    from tests.cluster_fixtures import apply_crds
    from tests.runner_world import RunnerWorld

    say = Report()
    work = Path(tempfile.mkdtemp(prefix="agentrun-bench-follow-"))
    ok = False
    with contextlib.ExitStack() as stack:
        try:
            plane = ControlPlane(work / "cp").start()
            stack.callback(plane.stop)
            pg = Postgres().start()
            stack.callback(pg.stop)
            apply_crds(plane)
            url = pg.create_database("follow")
            asyncio.run(store.migrate(url))
            for namespace in (A, B):
                plane.kubectl("create", "namespace", namespace)
            world = RunnerWorld(plane, A, work)
            stack.callback(world.stop)
            endpoint = TranscriptEndpoint(plane.host_address, free_port())
            api = world.store_api(url, args=[f"--transcript-listen={endpoint.listen}"])
            transcript_api.register(plane, endpoint)
            stack.callback(transcript_api.unregister, plane)
            transcript_api.wait_available(plane)

            def attempt(tag: str, namespace: str) -> tuple[str, Path]:
                """A run recorded in the store, its first attempt begun: (name, token)."""
                name, token_file, _ = begun(world, api.url, url, tag, namespace)
                return name, token_file

            # A's live run, the one followed (its AgentRun has no phase yet: live).
            followed, _ = attempt("followed", A)
            made = [attempt(f"writer{i}", B)[1] for i in range(6)]
            writers = itertools.chain(made, (attempt(f"writer{i}", B)[1]
                                             for i in itertools.count(len(made))))
            plane.kubectl("create", "rolebinding", f"{VIEWER}-view", "-n", A,
                          "--clusterrole=agentrun-view", f"--user={VIEWER}")
            user = json.loads(plane.issue_kubeconfig(VIEWER, VIEWER).read_text())[
                "users"][0]["user"]
            path = (f"/apis/store.agentrun.dev/v1alpha1/namespaces/{A}/transcripts/"
                    f"{followed}?follow=true")
            say(f"bench/follow_flood.py, {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M}"
                f" UTC, {os.cpu_count()} CPUs: Postgres {pg.port} (fsync=off), "
                f"agentrun-store-api {api.url} and its transcript API (its own process), "
                f"{args.follows} follows by one viewer, {FOLLOWS_PER_USER} held per user; "
                f"load average {load()}")

            tls = plane.store_api_tls
            assert tls is not None
            ca = tls.ca.read_text()

            def writes() -> list[tuple[float, float]]:
                return asyncio.run(ledger_writes(api.url, writers, args.writes, args.warmup,
                                                 args.pause, ca=ca))

            def flood(mode: str) -> tuple[list[tuple[float, float]], dict[str, object]]:
                viewer = subprocess.Popen(
                    [sys.executable, __file__, "--follows", str(args.follows), "--seconds",
                     str(args.seconds), "--viewer", "127.0.0.1", str(plane.port),
                     str(plane.ca_cert), user["client-certificate"], user["client-key"], path,
                     mode], stdout=subprocess.PIPE, text=True)
                try:
                    # Under way: every follow had its first answer (200 or 429).
                    sign = viewer.stdout.readline() if viewer.stdout else ""
                    if "following" not in sign:
                        raise RuntimeError(f"the viewer did not start: {sign!r}")
                    during = asyncio.run(ledger_writes(
                        api.url, writers, args.writes, args.warmup, args.pause,
                        going=lambda: viewer.poll() is None, ca=ca))
                    report, _ = viewer.communicate(timeout=300)
                finally:
                    if viewer.poll() is None:
                        viewer.kill()
                told = json.loads(report.strip().splitlines()[-1]) if report.strip() else {}
                return during, told

            idle = writes()
            polite, polite_told = flood("polite")
            at_once, at_once_told = flood("at-once")
            after = writes()

            say(f"\nTenant B's ledger write (open_call + close_call through StoreClient; in "
                f"brackets the ratio to idle): {len(idle)} idle, {len(polite)} while the "
                f"viewer's refused follows wait their Retry-After, {len(at_once)} while they "
                f"ask again at once, {len(after)} idle again, each after {args.warmup} "
                "warm-up; the anchor is both idle runs pooled")
            say("| | p50 | p95 | p99 |\n|---|---|---|---|")
            anchor = percentiles([s for _, s in idle + after])
            for label, part in (("idle, before", idle), ("idle, after", after)):
                c = percentiles([s for _, s in part])
                say(f"| {label} | " + " | ".join(
                    f"{c[k] * 1000:.2f} ms ({c[k] / anchor[k]:.2f})"
                    for k in ("p50", "p95", "p99")) + " |")
            say("| idle, pooled (anchor) | " + " | ".join(
                f"{anchor[k] * 1000:.2f} ms" for k in ("p50", "p95", "p99")) + " |")
            for label, part in ((f"{args.follows} follows, Retry-After waited", polite),
                                (f"{args.follows} follows, asked again at once", at_once)):
                c = percentiles([s for _, s in part])
                say(f"| {label} | " + " | ".join(
                    f"{c[k] * 1000:.2f} ms ({c[k] / anchor[k]:.2f})"
                    for k in ("p50", "p95", "p99")) + " |")
            for label, told in (("Retry-After waited", polite_told),
                                ("asked again at once", at_once_told)):
                got = told.get("got") or {}
                assert isinstance(got, dict)
                total = sum(got.values())
                say(f"\nThe viewer's requests, {label} ({total} in {args.seconds:.0f} s, "
                    f"{total / args.seconds:.0f}/s): streams held at most at once "
                    f"{told.get('heldAtOnce')}; by answer: "
                    + ", ".join(f"{k}: {v}" for k, v in sorted(got.items()))
                    + f"; Retry-After said: {told.get('retryAfter')}")
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
