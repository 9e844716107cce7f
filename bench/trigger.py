"""Triggers: events accepted per second by the trigger receiver, and the time from a
delivery to its AgentRun existing, beside `kubectl create` of the same runs.

    .venv/bin/python bench/trigger.py [--events 500] [--threads 8] [--redeliveries 0.1]
                                      [--out PATH]

One control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler), the
CRDs and admission policies of crds/, no node, no operator (a run that exists is the
figure; what the operator does with it is timed by bench/throughput.py).

1. receiver: `agentrun-receiver` as tests/receiver runs it (its own process, its own
   identity and the chart's rights, TLS). An AgentRunTrigger of CloudEvents identity with an
   HMAC signature and maxRunsPerMinute high enough never to refuse. `--events` CloudEvents
   (made and bound to HTTP by CloudEvents' own SDK, binary mode, signed) are delivered
   `--threads` at a time; a share `--redeliveries` of them is delivered again later in the
   same stream (each answered 200 duplicate). A watch opened before the first delivery
   notes when each AgentRun appears.
2. kubectl: the same runs (the receiver's manifest of each event, `agentrun.triggered`, and
   its ConfigMap `<run>-event`, as one List) with `kubectl create -f -`, one process a run,
   `--threads` at a time, the redelivered share created again (refused AlreadyExists), in
   another namespace: what a script that starts runs from events without a receiver does.
3. client: the same two creates per run through the API with one client's kept
   connections (no process per run), in a third namespace: the floor of what a run's
   creation costs, without the receiver's checks, its duplicate read and its hand-over.

For each half: events accepted per second (distinct runs over the time from the first
request to the last run's appearance), and p50/p99 from a request's start to its run in
the watch; the ratios of each anchor to the receiver (above 1: the receiver is faster). Every answer
of the receiver is counted by its result; any answer other than created or duplicate
fails the benchmark. Figures only: no goal is asserted. The output goes to stdout and to
`--out` (default ~/.cache/agentrun/bench/trigger-<time>.txt; `--out -` for stdout only).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
for extra in (BENCH, BENCH.parent / "devtools", BENCH.parent):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

from agentrun_devtools.controlplane import ControlPlane  # noqa: E402
from agentrun_devtools.stats import pct as percentile  # noqa: E402
from agentrun_devtools.stats import results_file  # noqa: E402
from kubernetes import client  # noqa: E402
from kubernetes.client.exceptions import ApiException  # noqa: E402
from throughput import Report, api_client, create_namespace, load  # noqa: E402

from agentrun import triggered  # noqa: E402
from agentrun.vocabulary import EVENT_FILE, GROUP, RUN_PLURAL, VERSION  # noqa: E402
from tests.cluster_fixtures import apply_crds  # noqa: E402
from tests.receiver.receiver import Receiver, grant_the_charts_rights  # noqa: E402
from tests.triggers import (  # noqa: E402
    binary,
    cloudevent,
    deliver,
    secret_manifest,
    signed,
    trigger_manifest,
)

TRIGGER = "bench"
SOURCE = "/bench/events"


class RunWatch:
    """When each AgentRun of a namespace first appeared in a watch (time.monotonic())."""

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self.custom: Any = client.CustomObjectsApi(api)
        self.namespace = namespace
        self.seen: dict[str, float] = {}
        self.listed = threading.Event()
        self._stop = threading.Event()
        self._response: Any = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> RunWatch:
        self._thread.start()
        if not self.listed.wait(30):
            raise RuntimeError("AgentRun watch did not start")
        return self

    def stop(self) -> None:
        self._stop.set()
        with contextlib.suppress(Exception):
            if self._response is not None:
                self._response.shutdown()

    def wait(self, names: set[str], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not names <= self.seen.keys():
            if self.error is not None:
                raise self.error
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(names - self.seen.keys())} of {len(names)} runs "
                                   f"not in the watch after {timeout:.0f}s")
            time.sleep(0.05)

    def _run(self) -> None:
        try:
            listed = self.custom.list_namespaced_custom_object(
                GROUP, VERSION, self.namespace, RUN_PLURAL, _preload_content=False)
            body = json.loads(listed.data)
            version = body["metadata"]["resourceVersion"]
            self.listed.set()
            self._response = response = self.custom.list_namespaced_custom_object(
                GROUP, VERSION, self.namespace, RUN_PLURAL, watch=True,
                resource_version=version, timeout_seconds=3600, _preload_content=False)
            for line in response:
                event = json.loads(line)
                if event.get("type") == "ADDED":
                    self.seen.setdefault(event["object"]["metadata"]["name"],
                                         time.monotonic())
                if self._stop.is_set():
                    return
        except Exception as e:
            if not self._stop.is_set():
                self.error = e
                self.listed.set()


def stream(events: int, share: float, seed: int) -> list[int]:
    """The order of deliveries: each event once, and `share` of them again, each after
    its first delivery (about `events / 10` later, as a sender's retry comes)."""
    rng = random.Random(seed)
    order = list(range(events))
    for event in rng.sample(range(events), int(events * share)):
        at = order.index(event) + 1 + rng.randint(events // 20, events // 5)
        order.insert(min(at, len(order)), event)
    return order


class Half:
    """One half's figures: when each event's first request began, the answers, the span."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.sent: dict[str, float] = {}  # run -> when its event's first request began
        self.answers: Counter[str] = Counter()
        self.lock = threading.Lock()

    def note(self, run: str, began: float, answer: str) -> None:
        with self.lock:
            self.sent.setdefault(run, began)
            self.answers[answer] += 1

    def figures(self, watch: RunWatch) -> tuple[float, list[float]]:
        """(runs per second, latencies in seconds)."""
        first = min(self.sent.values())
        last = max(watch.seen[r] for r in self.sent)
        latencies = sorted(watch.seen[r] - began for r, began in self.sent.items())
        return len(self.sent) / (last - first), latencies


def deliveries(receiver: Receiver, namespace: str, order: list[int], threads: int,
               half: Half) -> None:
    url = receiver.url(namespace, TRIGGER)

    def one(event: int) -> None:
        body, headers = binary(cloudevent(f"evt-{event}", SOURCE, {"n": event}))
        headers = signed(body, headers)
        began = time.monotonic()
        for _attempt in range(5):
            answer = deliver(url, body, headers, ca=receiver.ca, timeout=60)
            if answer.status not in (429, 503):
                break
            time.sleep(float(answer.headers.get("Retry-After") or 1))
        result = str(answer.body.get("result"))
        if result not in ("created", "duplicate"):
            raise RuntimeError(f"event {event}: {answer.status} {answer.body}")
        half.note(str(answer.body["run"]), began, result)

    _in_threads(one, order, threads)


def kubectl_creates(plane: ControlPlane, trigger: dict[str, Any], order: list[int],
                    threads: int, half: Half) -> None:
    namespace = trigger["metadata"]["namespace"]

    def one(event: int) -> None:
        identity = f"{SOURCE}\nevt-{event}"
        name = triggered.run_name(TRIGGER, identity)
        body, _ = binary(cloudevent(f"evt-{event}", SOURCE, {"n": event}))
        configmap = {"apiVersion": "v1", "kind": "ConfigMap",
                     "metadata": {"name": triggered.event_configmap(name),
                                  "namespace": namespace},
                     "immutable": True, "data": {EVENT_FILE: body.decode()}}
        run = triggered.triggered_run(trigger, name, identity)
        manifest = json.dumps({"apiVersion": "v1", "kind": "List",
                               "items": [configmap, run]})
        began = time.monotonic()
        done = subprocess.run([str(plane.bin / "kubectl"), "--kubeconfig", str(plane.kubeconfig),
                               "create", "-f", "-"], input=manifest, text=True,
                              capture_output=True, check=False)
        if done.returncode == 0:
            half.note(name, began, "created")
        elif "AlreadyExists" in done.stderr or "already exists" in done.stderr:
            half.note(name, began, "duplicate")
        else:
            raise RuntimeError(f"kubectl create of {name}: {done.stderr}")

    _in_threads(one, order, threads)


def client_creates(api: client.ApiClient, trigger: dict[str, Any], order: list[int],
                   threads: int, half: Half) -> None:
    """The same two creates through the API with a kept connection pool (no process per
    run): what the receiver's own requests cost, without its checks."""
    namespace = trigger["metadata"]["namespace"]
    core: Any = client.CoreV1Api(api)
    custom: Any = client.CustomObjectsApi(api)

    def one(event: int) -> None:
        identity = f"{SOURCE}\nevt-{event}"
        name = triggered.run_name(TRIGGER, identity)
        body, _ = binary(cloudevent(f"evt-{event}", SOURCE, {"n": event}))
        began = time.monotonic()
        try:
            core.create_namespaced_config_map(namespace, {
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": triggered.event_configmap(name)},
                "immutable": True, "data": {EVENT_FILE: body.decode()}},
                _preload_content=False).release_conn()
            custom.create_namespaced_custom_object(
                GROUP, VERSION, namespace, RUN_PLURAL,
                triggered.triggered_run(trigger, name, identity),
                _preload_content=False).release_conn()
        except ApiException as e:
            if e.status != 409:
                raise
            half.note(name, began, "duplicate")
            return
        half.note(name, began, "created")

    _in_threads(one, order, threads)


def _in_threads(one: Callable[[int], None], order: list[int], threads: int) -> None:
    with ThreadPoolExecutor(threads) as pool:
        for done in pool.map(one, order):
            del done


def summary(half: Half, rate: float, latencies: list[float]) -> str:
    return (f"  {half.name}: {len(half.sent)} runs, {rate:.1f} events/s accepted; request to "
            f"run p50 {statistics.median(latencies) * 1000:.0f} ms, p99 "
            f"{percentile(latencies, 0.99) * 1000:.0f} ms, max {latencies[-1] * 1000:.0f} ms; "
            f"answers {dict(sorted(half.answers.items()))}")


def bench(events: int, threads: int, share: float, say: Report, keep: bool) -> bool:
    work = Path(tempfile.mkdtemp(prefix="agentrun-bench-trigger-"))
    ok = False
    with contextlib.ExitStack() as stack:
        try:
            plane = ControlPlane(work / "cp").start()
            stack.callback(plane.stop)
            apply_crds(plane)
            grant_the_charts_rights(plane)
            api = api_client(plane, threads + 4)
            order = stream(events, share, seed=1)
            say(f"load average {load()}; {len(order)} deliveries of {events} events "
                f"({len(order) - events} again), {threads} at a time")
            figures = {}
            for half_name in ("receiver", "kubectl", "client"):
                namespace = f"trigger-bench-{half_name}"
                create_namespace(plane, namespace)
                plane.kubectl("apply", "-n", namespace, "-f", "-",
                              input=json.dumps(secret_manifest()))
                plane.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(
                    trigger_manifest(TRIGGER, maxRunsPerMinute=100_000)))
                trigger = json.loads(plane.kubectl(
                    "get", "agentruntrigger", TRIGGER, "-n", namespace, "-o", "json").stdout)
                watch = RunWatch(api, namespace).start()
                stack.callback(watch.stop)
                half = Half(half_name)
                if half_name == "receiver":
                    receiver = Receiver(plane, work / "receiver").start()
                    stack.callback(receiver.stop)
                    deliveries(receiver, namespace, order, threads, half)
                elif half_name == "kubectl":
                    kubectl_creates(plane, trigger, order, threads, half)
                else:
                    client_creates(api, trigger, order, threads, half)
                watch.wait(set(half.sent), timeout=300)
                rate, latencies = half.figures(watch)
                figures[half_name] = (rate, latencies)
                say(summary(half, rate, latencies))
            say("")
            r_rate, r_lat = figures["receiver"]
            for anchor in ("kubectl", "client"):
                a_rate, a_lat = figures[anchor]
                say(f"receiver / {anchor}: events per second {r_rate / a_rate:.2f}x; "
                    f"{anchor} / receiver p50 "
                    f"{statistics.median(a_lat) / statistics.median(r_lat):.2f}x, p99 "
                    f"{percentile(a_lat, 0.99) / percentile(r_lat, 0.99):.2f}x "
                    "(above 1: the receiver is faster)")
            ok = True
        finally:
            if not ok:
                print(f"bench failed; logs kept in {work}", file=sys.stderr)
    if ok and not keep:
        shutil.rmtree(work, ignore_errors=True)
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=500)
    parser.add_argument("--threads", type=int, default=8, help="concurrent deliveries")
    parser.add_argument("--redeliveries", type=float, default=0.1,
                        help="share of the events delivered twice")
    parser.add_argument("--keep", action="store_true", help="keep the receiver's log")
    parser.add_argument("--out", help="results file (default ~/.cache/agentrun/bench/"
                                      "trigger-<time>.txt; '-' for stdout only)")
    args = parser.parse_args()
    out = results_file("trigger", args.out)
    say = Report()
    say(f"bench/trigger.py, {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, "
        f"{os.cpu_count()} CPUs, {args.events} events, {args.redeliveries:.0%} delivered "
        "again; no node, no operator")
    if not bench(args.events, args.threads, args.redeliveries, say, args.keep):
        return 1
    say(f"load average at the end {load()} (other processes share these CPUs)")
    say.write(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
