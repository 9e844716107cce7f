"""Churn: one run a second with a time to live, beside the Job controller's TTL, in one run.

    .venv/bin/python bench/churn.py [--minutes 30] [--ttl 60] [--every 1] [--out PATH]

One control plane (kube-controller-manager runs the Job and TTL-after-finished
controllers), the development node, a throwaway Postgres store and the operator with its
default flags. For `--minutes`, every `--every` seconds, two objects are created in
namespace `churn`, side by side:

- an AgentRun (noop-agent on the scripted model, input "hi") with
  `spec.ttlSecondsAfterFinished: --ttl`; it settles Succeeded within seconds, and the
  operator deletes it `--ttl` seconds after `status.finishedAt`;
- a Job (backoffLimit 0, one container running `true`) with
  `spec.ttlSecondsAfterFinished: --ttl`; kube-controller-manager's TTL-after-finished
  controller deletes it `--ttl` seconds after `status.completionTime`.

A watch on each kind (opened before the first create, resumed from its last
resourceVersion) records when each object settled and when it was deleted. Every 10 s
we sample how many of each are in etcd (what the watch holds), how many of those are
settled, and the resident memory of the operator and of kube-controller-manager.

Reported, agentrun beside the Job controller and as ratios:
- objects in etcd once the churn is steady (from `--ttl` + 60 s on): mean and max. With
  one object a second and a TTL of 60 s, about 60 plus the seconds a run takes to
  settle; what matters is that it stays bounded, not growing with the minutes;
- how late the deletes came: deletion seen minus (settled + TTL), p50 / p99 / max.
  Both settle stamps have second precision, so each figure may be up to 1 s high;
- created, settled and deleted counts, and objects whose delete was never seen;
- RSS: the operator's (and kube-controller-manager's, which runs every controller of
  the control plane) at the steady start and at the end, the highest, and the slope of
  a least-squares line over the steady samples, in MB per 10 minutes. Flat is a slope
  near 0 that does not grow with the minutes;
- CPU over the steady part, % of one core: operator, development node,
  kube-controller-manager, kube-apiserver, etcd.

The runs' records stay in the store (history beyond etcd): the bench reports how many
the store holds at the end.

The output goes to stdout and to `--out` (default ~/.cache/agentrun/bench/
churn-<time>.txt as docs/development.md says; `--out -` for stdout only).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
for extra in (BENCH, BENCH.parent / "devtools", BENCH.parent):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

from agentrun_devtools.cluster import start_dev_node  # noqa: E402
from agentrun_devtools.controlplane import ControlPlane  # noqa: E402
from agentrun_devtools.postgres import Postgres  # noqa: E402
from agentrun_devtools.stats import results_file  # noqa: E402
from eviction import percentiles  # noqa: E402
from kubernetes import client, watch  # noqa: E402
from kubernetes.client.exceptions import ApiException  # noqa: E402
from sqlalchemy import text  # noqa: E402
from sqlalchemy.ext.asyncio import create_async_engine  # noqa: E402
from throughput import (  # noqa: E402
    CLK_TCK,
    Report,
    api_client,
    child_pid,
    cpu_ticks,
    create_namespace,
    load,
    rss_kib,
    run_manifest,
)
from urllib3.exceptions import ProtocolError  # noqa: E402

from agentrun import store  # noqa: E402
from agentrun.vocabulary import GROUP, RUN_PLURAL, VERSION  # noqa: E402
from tests.cluster_fixtures import apply_crds  # noqa: E402
from tests.harness import Operator  # noqa: E402

NAMESPACE = "churn"
SAMPLE_SECONDS = 10.0


def stamp(value: Any) -> float | None:
    """An RFC 3339 timestamp as seconds since the epoch; None when absent."""
    if not value:
        return None
    return datetime.datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()


def run_settled(obj: dict[str, Any]) -> float | None:
    status = obj.get("status") or {}
    return stamp(status.get("finishedAt")) if status.get("phase") in (
        "Succeeded", "Failed", "Cancelled") else None


def job_settled(obj: dict[str, Any]) -> float | None:
    status = obj.get("status") or {}
    done = stamp(status.get("completionTime"))
    if done is None:  # a failed Job has no completionTime: its Failed condition's time
        for c in status.get("conditions") or []:
            if c.get("type") == "Failed" and c.get("status") == "True":
                done = stamp(c.get("lastTransitionTime"))
    return done


@dataclass
class Tracked:
    """One kind's objects as its watch has shown them."""

    kind: str
    settled_of: Callable[[dict[str, Any]], float | None]
    live: dict[str, float | None] = field(default_factory=dict)  # name -> settled at
    settled: dict[str, float] = field(default_factory=dict)
    deleted: dict[str, float] = field(default_factory=dict)  # name -> wall clock seen
    relists: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def saw(self, kind: str, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        with self.lock:
            if kind == "DELETED":
                self.live.pop(name, None)
                self.deleted.setdefault(name, time.time())
            else:
                done = self.settled_of(obj)
                self.live[name] = done
                if done is not None:
                    self.settled.setdefault(name, done)

    def counts(self) -> tuple[int, int]:
        with self.lock:
            return len(self.live), sum(1 for v in self.live.values() if v is not None)


def follow(tracked: Tracked, list_fn: Callable[..., Any], stop: threading.Event,
           **kw: Any) -> None:
    """Keeps `tracked` up to date from a watch, resumed from its last resourceVersion
    (listed again after a 410)."""
    version = ""
    while not stop.is_set():
        if not version:
            listed = client.ApiClient().sanitize_for_serialization(list_fn(**kw))
            version = listed["metadata"]["resourceVersion"]
            with tracked.lock:
                tracked.live = {}
            for item in listed.get("items") or []:
                tracked.saw("ADDED", item)
            tracked.relists += 1
        try:
            stream = watch.Watch()
            for event in stream.stream(list_fn, resource_version=version,
                                       timeout_seconds=60, allow_watch_bookmarks=True, **kw):
                obj = event["object"]
                if not isinstance(obj, dict):
                    obj = client.ApiClient().sanitize_for_serialization(obj)
                version = obj["metadata"]["resourceVersion"]
                if event["type"] != "BOOKMARK":
                    tracked.saw(event["type"], obj)
                if stop.is_set():
                    stream.stop()
        except ApiException as e:
            if e.status != 410:
                raise
            version = ""
        except ProtocolError:  # the connection closed under the watch: resume it
            time.sleep(0.5)


def job_manifest(name: str, ttl: int) -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"backoffLimit": 0, "ttlSecondsAfterFinished": ttl,
                     "template": {"spec": {"restartPolicy": "Never", "containers": [
                         {"name": "work", "image": "busybox", "command": ["true"]}]}}}}


def slope_per_10min(samples: list[tuple[float, float]]) -> float:
    """The least-squares slope of (seconds, MB) samples, in MB per 10 minutes."""
    if len(samples) < 2:
        return float("nan")
    return statistics.linear_regression([t for t, _ in samples],
                                        [v for _, v in samples]).slope * 600


@dataclass
class Sample:
    at: float  # seconds since the first create
    runs: int
    runs_settled: int
    jobs: int
    jobs_settled: int
    operator_mb: float
    kcm_mb: float


def store_runs(url: str) -> int:
    async def count() -> int:
        engine = create_async_engine(url)
        try:
            async with engine.connect() as conn:
                return int((await conn.execute(text("SELECT count(*) FROM runs"))).scalar_one())
        finally:
            await engine.dispose()

    return asyncio.run(count())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0, help="how long the churn lasts")
    parser.add_argument("--ttl", type=int, default=60, help="ttlSecondsAfterFinished of both")
    parser.add_argument("--every", type=float, default=1.0, help="seconds between creates")
    parser.add_argument("--out", help="results file (default ~/.cache/agentrun/bench/"
                                      "churn-<time>.txt; '-' for stdout only)")
    args = parser.parse_args()
    out = results_file("churn", args.out)
    say = Report()
    work = Path(tempfile.mkdtemp(prefix="agentrun-bench-churn-"))
    plane = ControlPlane(work / "cp").start()
    pg = Postgres().start()
    node = operator = None
    stop = threading.Event()
    threads: list[threading.Thread] = []
    ok = False
    try:
        apply_crds(plane)
        node = start_dev_node(plane, work / "pods")
        url = pg.create_database("bench")
        asyncio.run(store.migrate(url))
        operator = Operator(plane, url, work).start()
        assert operator.child is not None
        create_namespace(plane, NAMESPACE)
        api = api_client(plane, 8)
        custom, batch = client.CustomObjectsApi(api), client.BatchV1Api(api)
        runs = Tracked("AgentRun", run_settled)
        jobs = Tracked("Job", job_settled)
        # Each watch on a connection pool of its own: a stream holds its connection.
        threads = [
            threading.Thread(target=follow, args=(
                runs, client.CustomObjectsApi(api_client(plane, 2)).list_namespaced_custom_object,
                stop), kwargs={"group": GROUP, "version": VERSION, "namespace": NAMESPACE,
                               "plural": RUN_PLURAL}, daemon=True),
            threading.Thread(target=follow, args=(
                jobs, client.BatchV1Api(api_client(plane, 2)).list_namespaced_job, stop),
                kwargs={"namespace": NAMESPACE}, daemon=True)]
        for t in threads:
            t.start()
        pids = {"operator": operator.child.pid, "devnode": node.pid,
                **{name: child_pid(plane, name) for name in (
                    "kube-controller-manager", "kube-apiserver", "etcd")}}
        say(f"bench/churn.py, {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, "
            f"{os.cpu_count()} CPUs, {args.minutes:g} minutes, one AgentRun and one Job "
            f"every {args.every:g} s, ttlSecondsAfterFinished {args.ttl} on both; operator "
            f"with default flags; load average {load()}")
        total = int(args.minutes * 60 / args.every)
        steady_from = args.ttl + 60.0
        began = time.monotonic()
        samples: list[Sample] = []
        ticks0: dict[str, int] = {}
        steady_began = 0.0
        next_sample = 0.0
        failures = 0
        for i in range(total):
            due = began + i * args.every
            while (left := due - time.monotonic()) > 0:
                time.sleep(min(left, 0.25))
            try:
                custom.create_namespaced_custom_object(
                    GROUP, VERSION, NAMESPACE, RUN_PLURAL,
                    run_manifest(f"run-{i}", NAMESPACE, ttlSecondsAfterFinished=args.ttl),
                    _preload_content=False).read()
                batch.create_namespaced_job(NAMESPACE, job_manifest(f"job-{i}", args.ttl),
                                            _preload_content=False).read()
            except ApiException as e:
                failures += 1
                say(f"  create {i} failed: {e.status} {e.reason}")
            at = time.monotonic() - began
            if at >= next_sample:
                next_sample = at + SAMPLE_SECONDS
                r, rs = runs.counts()
                j, js = jobs.counts()
                samples.append(Sample(at, r, rs, j, js, rss_kib(pids["operator"]) / 1024,
                                      rss_kib(pids["kube-controller-manager"]) / 1024))
                if not ticks0 and at >= steady_from:
                    ticks0 = {n: cpu_ticks(p) for n, p in pids.items()}
                    steady_began = time.monotonic()
                if len(samples) % 30 == 1:
                    s = samples[-1]
                    say(f"  {at:5.0f} s: {i + 1} created; in etcd {s.runs} runs "
                        f"({s.runs_settled} settled), {s.jobs} Jobs ({s.jobs_settled} "
                        f"settled); RSS operator {s.operator_mb:.0f} MB, kcm "
                        f"{s.kcm_mb:.0f} MB; load {load()}")
        spent = time.monotonic() - steady_began if ticks0 else 0.0
        cpu = {n: (cpu_ticks(p) - ticks0[n]) * 100 / CLK_TCK / spent
               for n, p in pids.items()} if ticks0 else {}
        # The last objects settle and reach their TTL: wait for them, so every delete is
        # counted (at most TTL + 120 s).
        deadline = time.monotonic() + args.ttl + 120
        while time.monotonic() < deadline and (runs.counts()[0] or jobs.counts()[0]):
            time.sleep(2)
        stop.set()
        steady = [s for s in samples if s.at >= steady_from]
        say(f"\n{total} of each created over {args.minutes:g} minutes ({failures} creates "
            f"failed); steady from {steady_from:.0f} s on ({len(steady)} samples every "
            f"{SAMPLE_SECONDS:.0f} s); load average {load()}")

        def late(t: Tracked) -> list[float]:
            return [t.deleted[n] - (t.settled[n] + args.ttl) for n in t.deleted
                    if n in t.settled]

        rows = []

        def row(what: str, ours: float, theirs: float, fmt: str = "{:.0f}",
                ratio: bool = True) -> None:
            r = f"{ours / theirs:.2f}" if ratio and theirs else ""
            rows.append(f"| {what} | {fmt.format(ours)} | {fmt.format(theirs)} | {r} |")

        row("created", total, total, ratio=False)
        row("settled (seen by the watch)", len(runs.settled), len(jobs.settled), ratio=False)
        row("deleted (seen by the watch)", len(runs.deleted), len(jobs.deleted), ratio=False)
        row("still in etcd after the wait", runs.counts()[0], jobs.counts()[0], ratio=False)
        if steady:
            row("in etcd, steady: mean", statistics.fmean(s.runs for s in steady),
                statistics.fmean(s.jobs for s in steady), "{:.1f}")
            row("in etcd, steady: max", max(s.runs for s in steady),
                max(s.jobs for s in steady))
            row("in etcd, steady: settled, mean",
                statistics.fmean(s.runs_settled for s in steady),
                statistics.fmean(s.jobs_settled for s in steady), "{:.1f}")
        ours_late, jobs_late = percentiles(late(runs)), percentiles(late(jobs))
        for label in ("p50", "p99", "max"):
            row(f"delete after settled + TTL, {label} (s)", ours_late[label], jobs_late[label],
                "{:.2f}")
        if steady:
            first, last = steady[0], steady[-1]
            say("")
            row_rss = [
                f"| operator RSS at {first.at:.0f} s / at {last.at:.0f} s / max | "
                f"{first.operator_mb:.0f} / {last.operator_mb:.0f} / "
                f"{max(s.operator_mb for s in steady):.0f} MB | kube-controller-manager: "
                f"{first.kcm_mb:.0f} / {last.kcm_mb:.0f} / {max(s.kcm_mb for s in steady):.0f}"
                " MB | |",
                f"| RSS slope over the steady part (least squares) | "
                f"{slope_per_10min([(s.at, s.operator_mb) for s in steady]):+.1f} MB / 10 min |"
                f" {slope_per_10min([(s.at, s.kcm_mb) for s in steady]):+.1f} MB / 10 min | |"]
            rows += row_rss
        say("| | agentrun (operator) | Job controller (kube-controller-manager) | ratio |")
        say("|---|---|---|---|")
        for line in rows:
            say(line)
        if cpu:
            say(f"\nCPU over the steady part ({spent:.0f} s), % of one core: " + ", ".join(
                f"{n} {v:.1f}" for n, v in cpu.items()) + " (kube-controller-manager runs "
                "every controller, the Job and TTL controllers among them; the development "
                "node runs both kinds' pods)")
        say(f"the store holds {store_runs(url)} run records (history stays when the "
            f"AgentRuns go); watches listed {runs.relists} / {jobs.relists} times")
        ok = True
    finally:
        stop.set()
        if operator is not None:
            operator.stop()
        if node is not None:
            node.stop()
        pg.stop()
        plane.stop()
        if not ok:
            print(f"bench failed; logs kept in {work}", file=sys.stderr)
    if ok:
        say.write(out)
        shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
