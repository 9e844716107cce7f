"""The transcript API's latency for a 200-entry run, through the Kubernetes API server.

    .venv/bin/python bench/transcript.py [--trials 50] [--out -]

Starts the real control plane (the API server with its front-proxy flags and aggregator
routing), the development node, a throwaway Postgres store and the operator serving the
transcript API, registered as APIService v1alpha1.store.agentrun.dev. One AgentRun of the
scripted model makes 99 tool calls and answers: its Transcript has 200 entries (the input,
99 calls and their 99 results, the answer). Then, as a user bound to agentrun-view with a
client certificate of the cluster's CA, each trial times

- GET .../transcripts/NAME through the API server (one kept-alive connection, as a
  client-go program has; the API server authenticates and authorizes the user, then proxies
  to the transcript API with its front-proxy certificate);
- the same request as kubectl prints it (`kubectl get transcripts... -o json`, a new process
  each time: what a user waits for);
- the same GET sent straight to the transcript API with the front-proxy certificate (what
  the API server's hop adds is the difference);
- the store's part alone: reading the facts and building the entries, in this process;
- ?follow=true of the settled run, until its stream ends.

p50 and p95 of each. A user's SubjectAccessReview is kept 10 s, so most trials ask none.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import http.client
import json
import os
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for extra in (ROOT / "devtools", ROOT):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

from agentrun_devtools import transcript_api  # noqa: E402
from agentrun_devtools.cluster import start_dev_node  # noqa: E402
from agentrun_devtools.controlplane import ControlPlane  # noqa: E402
from agentrun_devtools.postgres import Postgres  # noqa: E402
from agentrun_devtools.processes import free_port  # noqa: E402
from agentrun_devtools.stats import pct, results_file, write_results  # noqa: E402
from agentrun_devtools.transcript_api import TranscriptEndpoint  # noqa: E402

from agentrun import store  # noqa: E402
from agentrun.transcript import entries_of  # noqa: E402
from tests.cluster_fixtures import apply_crds  # noqa: E402
from tests.harness import Operator, System, agent_run, in_namespace  # noqa: E402

NAMESPACE = "bench-transcript"
RUN = "long-talk"
CALLS = 99


def row(what: str, values: list[float]) -> str:
    return f"| {what} | {pct(values, .5) * 1000:.1f} ms | {pct(values, .95) * 1000:.1f} ms |"


def _context(ca: Path, cert: Path, key: Path) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(ca))
    context.load_cert_chain(str(cert), str(key))
    return context


def _get(connection: http.client.HTTPSConnection, path: str,
         headers: dict[str, str] | None = None) -> tuple[float, dict[str, Any]]:
    began = time.perf_counter()
    connection.request("GET", path, headers=headers or {})
    response = connection.getresponse()
    body = response.read()
    took = time.perf_counter() - began
    assert response.status == 200, (response.status, body[:500])
    return took, json.loads(body)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", type=int, default=50)
    p.add_argument("--out", help="results file (default ~/.cache/agentrun/bench/"
                             "transcript-<time>.txt; '-' for stdout only)")
    args = p.parse_args(argv)
    out = results_file("transcript", args.out)
    work = Path(tempfile.mkdtemp(prefix="agentrun-bench-transcript-"))
    postgres = Postgres().start()
    plane = ControlPlane(work / "cp").start()
    node = operator = None
    try:
        apply_crds(plane)
        node = start_dev_node(plane, work / "pods")
        url = postgres.create_database("bench")
        endpoint = TranscriptEndpoint(plane.host_address, free_port())
        operator = Operator(plane, url, work / "op", transcript_listen=endpoint.listen).start()
        transcript_api.register(plane, endpoint)
        transcript_api.wait_available(plane)
        system = System(plane, url, operator)
        plane.kubectl("create", "namespace", NAMESPACE)
        plane.kubectl("create", "rolebinding", "reader-view", "-n", NAMESPACE,
                      "--clusterrole=agentrun-view", "--user=reader")
        reader = plane.issue_kubeconfig("reader", "reader")

        script: list[dict[str, Any]] = [{"call": "read_message", "args": {},
                                         "usage": {"inputTokens": 50, "outputTokens": 5}}
                                        for _ in range(CALLS)]
        script.append({"text": "Read it 99 times; the customer wants a refund."})
        system.apply(in_namespace(agent_run(RUN, script), NAMESPACE))
        system.wait_phase(NAMESPACE, RUN, "Succeeded", "Failed", timeout=600)
        uid = system.run(NAMESPACE, RUN)["metadata"]["uid"]
        path = f"/apis/store.agentrun.dev/v1alpha1/namespaces/{NAMESPACE}/transcripts/{RUN}"

        user = json.loads(reader.read_text())["users"][0]["user"]
        through = http.client.HTTPSConnection(
            "127.0.0.1", plane.port, timeout=60, context=_context(
                plane.ca_cert, Path(user["client-certificate"]), Path(user["client-key"])))
        front = plane.front_proxy
        tls = plane.store_api_tls
        assert front is not None and tls is not None
        # Dialled by address: the store API's certificate names this host's address too.
        direct = http.client.HTTPSConnection(endpoint.address, endpoint.port, timeout=60,
                                             context=_context(tls.ca, front.cert, front.key))
        as_reader = {"X-Remote-User": "reader", "X-Remote-Group": "system:authenticated"}
        _, first = _get(through, path)
        entries = len(first["entries"])
        assert entries == 2 * CALLS + 2, entries

        api_server: list[float] = []
        straight: list[float] = []
        kubectl: list[float] = []
        builds: list[float] = []
        follows: list[float] = []
        env = {**os.environ, "KUBECONFIG": str(reader)}
        for _ in range(args.trials):
            took, _ = _get(through, path)
            api_server.append(took)
            took, _ = _get(direct, path, as_reader)
            straight.append(took)
            began = time.perf_counter()
            done = subprocess.run([str(plane.bin / "kubectl"), "get",
                                   "transcripts.store.agentrun.dev", RUN, "-n", NAMESPACE,
                                   "-o", "json"], env=env, capture_output=True, check=True)
            kubectl.append(time.perf_counter() - began)
            assert len(json.loads(done.stdout)["entries"]) == entries
            began = time.perf_counter()
            through.request("GET", path + "?follow=true")
            response = through.getresponse()
            lines = response.read().splitlines()
            follows.append(time.perf_counter() - began)
            assert len(lines) == entries, len(lines)

        async def build() -> None:
            engine = store.make_engine(url)
            try:
                for _ in range(args.trials):
                    began = time.perf_counter()
                    facts = await store.transcript_facts(engine, uid)
                    assert facts is not None and len(entries_of(facts)) == entries
                    builds.append(time.perf_counter() - began)
            finally:
                await engine.dispose()

        asyncio.run(build())
        load = os.getloadavg()
        lines = [
            f"bench/transcript.py, {args.trials} trials, one run of {entries} entries "
            f"({CALLS} tool calls), Postgres store, "
            f"{datetime.datetime.now(datetime.UTC):%Y-%m-%dT%H:%MZ}, load average "
            f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}",
            "",
            "| GET the Transcript | p50 | p95 |",
            "|---|---|---|",
            row("through the API server (kept-alive connection)", api_server),
            row("kubectl get transcripts... -o json (a new process each time)", kubectl),
            row("straight to the transcript API (front-proxy certificate)", straight),
            row("the store's part (read the facts, build the entries)", builds),
            row("?follow=true of the settled run, to the stream's end", follows),
            "",
            f"Body {len(json.dumps(first))} bytes of JSON.",
        ]
        text = "\n".join(lines) + "\n"
        print(text)
        write_results(text, out)
    finally:
        if operator is not None:
            transcript_api.unregister(plane)
            operator.stop()
        if node is not None:
            node.stop()
        plane.stop()
        postgres.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
