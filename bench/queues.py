"""Queues: N AgentRuns through a Kueue ClusterQueue with room for 10 runner pods, beside N
batch/v1 Jobs through the same ClusterQueue, on one control plane, in one run.

    .venv/bin/python bench/queues.py [--n 200] [--slots 10] [--work 2] [--out PATH]

One control plane (etcd, kube-apiserver, kube-controller-manager with the Job controller,
kube-scheduler), the development node (it runs every pod bound to it as a process), a
throwaway Postgres store, the operator, and Kueue itself (agentrun_devtools.kueue: its
controller manager from its Go module, with the pod and batch/job integrations). One
ClusterQueue whose CPU quota holds `--slots` pods of 100m (a runner pod's default request;
each Job's pod asks the same 100m CPU and 256Mi), with a LocalQueue `team` in each of the
two namespaces.

1. agentrun: N AgentRuns labelled kueue.x-k8s.io/queue-name=team, each a scripted model
   that waits `--work` seconds and answers, created with 8 concurrent API calls. Kueue
   admits each run's runner pod (its Workload) as quota frees.
2. Jobs: N Jobs labelled the same way, each one pod running `sleep WORK`. Kueue suspends
   each at creation and unsuspends it once its Workload is admitted.

Timed per object, by watches opened before the first create (this process's clock):
create call -> its Workload seen Admitted (admission latency: the wait in the queue, plus,
for a run, the operator making its pod), and first create -> the N-th object finished
(throughput: runs Succeeded; Jobs Complete). Each half asserts that every object
finished well and that no more than `--slots` Workloads were admitted at once. The
figures: p50/p99 of admission latency and objects per second, and the ratios Job /
agentrun for each (the table says which way is better).

The output goes to stdout and to `--out` (default ~/.cache/agentrun/bench/queues-<time>.txt
as docs/development.md says; `--out -` for stdout only).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BENCH = Path(__file__).resolve().parent
for extra in (BENCH, ROOT / "devtools", ROOT):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

from agentrun_devtools.cluster import start_dev_node  # noqa: E402
from agentrun_devtools.controlplane import ControlPlane  # noqa: E402
from agentrun_devtools.kueue import Kueue  # noqa: E402
from agentrun_devtools.postgres import Postgres  # noqa: E402
from agentrun_devtools.processes import wait_for  # noqa: E402
from agentrun_devtools.stats import pct, results_file, write_results  # noqa: E402
from kubernetes import client, watch  # noqa: E402
from throughput import api_client, create_many, create_namespace  # noqa: E402

from agentrun.vocabulary import GROUP, RUN_PLURAL, VERSION  # noqa: E402
from agentrun.vocabulary import Kueue as K  # noqa: E402
from tests.cluster_fixtures import apply_crds  # noqa: E402
from tests.harness import Operator, agent_run  # noqa: E402

QUEUE = "team"
CLUSTER_QUEUE = "bench"
THREADS = 8
REQUESTS = {"cpu": "100m", "memory": "256Mi"}


def _apply_queue(plane: ControlPlane, namespaces: list[str], slots: int) -> None:
    flavor = {"apiVersion": f"{K.GROUP}/v1beta2", "kind": "ResourceFlavor",
              "metadata": {"name": "bench-flavor"}}
    cluster_queue = {
        "apiVersion": f"{K.GROUP}/v1beta2", "kind": "ClusterQueue",
        "metadata": {"name": CLUSTER_QUEUE},
        "spec": {"namespaceSelector": {}, "resourceGroups": [{
            "coveredResources": ["cpu", "memory"], "flavors": [{
                "name": "bench-flavor", "resources": [
                    {"name": "cpu", "nominalQuota": f"{slots * 100}m"},
                    {"name": "memory", "nominalQuota": f"{slots * 256 * 4}Mi"}]}]}]}}
    items = [flavor, cluster_queue] + [
        {"apiVersion": f"{K.GROUP}/v1beta2", "kind": "LocalQueue",
         "metadata": {"name": QUEUE, "namespace": ns}, "spec": {"clusterQueue": CLUSTER_QUEUE}}
        for ns in namespaces]
    for item in items:
        plane.kubectl("apply", "-f", "-", input=json.dumps(item))


def _conditions(obj: dict[str, Any]) -> dict[str, str]:
    return {c["type"]: c["status"] for c in (obj.get("status") or {}).get("conditions") or []}


Seen = Callable[[str, dict[str, Any], float], None]


class Watcher:
    """A watch of a list in a thread, calling `seen(event type, object as JSON, time)` for
    every event with this process's clock; listed first, so that it is watching before the
    constructor returns, and reopened from the last resourceVersion if it ends."""

    def __init__(self, stream: Callable[..., Any], seen: Seen, **kwargs: Any) -> None:
        self.stream, self.seen, self.kwargs = stream, seen, kwargs
        self.stopping = threading.Event()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        self.ready.wait(30)

    def _events(self) -> Iterator[tuple[str, dict[str, Any]]]:
        listed = self.stream(**self.kwargs)
        if not isinstance(listed, dict):  # a typed list (Jobs)
            listed = client.ApiClient().sanitize_for_serialization(listed)
        version = listed["metadata"]["resourceVersion"]
        self.ready.set()
        while not self.stopping.is_set():
            w = watch.Watch()
            for event in w.stream(self.stream, resource_version=version, timeout_seconds=30,
                                  allow_watch_bookmarks=True, **self.kwargs):
                obj = event["raw_object"]
                version = obj["metadata"]["resourceVersion"]
                if event["type"] != "BOOKMARK":
                    yield event["type"], obj
                if self.stopping.is_set():
                    w.stop()
                    return

    def _run(self) -> None:
        try:
            for kind, obj in self._events():
                self.seen(kind, obj, time.monotonic())
        except Exception:
            if not self.stopping.is_set():  # a watch cut by the control plane's stop is not
                raise

    def stop(self) -> None:
        self.stopping.set()


class Half:
    """One side's clocks: create calls, Workloads admitted and finished, objects done."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self.created: dict[str, float] = {}
        self.admitted: dict[str, float] = {}  # owner name -> first seen Admitted
        self.running: set[str] = set()  # Workloads admitted and not finished
        self.most_at_once = 0
        self.finished: dict[str, tuple[float, bool]] = {}  # object -> (seen, well)
        self.lock = threading.Lock()

    def workload(self, kind: str, obj: dict[str, Any], at: float) -> None:
        if obj["metadata"]["namespace"] != self.namespace:
            return
        owner = next((r["name"] for r in obj["metadata"].get("ownerReferences") or []), None)
        if owner is None:
            return
        conditions = _conditions(obj)
        key = obj["metadata"]["name"]
        with self.lock:
            if (kind != "DELETED" and conditions.get("Admitted") == "True"
                    and conditions.get("Finished") != "True"):
                self.admitted.setdefault(owner, at)
                self.running.add(key)
                self.most_at_once = max(self.most_at_once, len(self.running))
            else:
                self.running.discard(key)


def run_half(half: Half, n: int, make: Callable[[int], None],
             owner_of: Callable[[int], str], timeout: float) -> float:
    """Creates the N objects; returns the seconds from the first create call to the N-th
    finished object."""
    began = time.monotonic()

    def timed(i: int) -> None:
        half.created.setdefault(owner_of(i), time.monotonic())
        make(i)

    create_many(timed, range(n), THREADS)
    wait_for(lambda: len(half.finished) >= n, timeout=timeout,
             what=f"{n} objects finished in {half.namespace}", interval=0.5)
    return max(seen for seen, _ in half.finished.values()) - began


def summary(label: str, half: Half, n: int, seconds: float,
            key_of: Callable[[str], str]) -> dict[str, float]:
    bad = [name for name, (_, well) in half.finished.items() if not well]
    assert not bad, f"{label}: not finished well: {bad[:5]}"
    latency = [half.admitted[owner] - half.created[key_of(owner)] for owner in half.admitted]
    assert len(latency) >= n, f"{label}: {len(latency)} of {n} seen admitted"
    return {"p50": pct(latency, 0.5), "p99": pct(latency, 0.99), "seconds": seconds,
            "per_second": n / seconds, "most": half.most_at_once}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=200)
    p.add_argument("--slots", type=int, default=10)
    p.add_argument("--work", type=float, default=2.0, help="seconds each object works")
    p.add_argument("--out", help="results file (default ~/.cache/agentrun/bench/"
                             "queues-<time>.txt; '-' for stdout only)")
    args = p.parse_args(argv)
    out = results_file("queues", args.out)
    timeout = 600 + args.n * args.work * 4 / args.slots
    work = Path(tempfile.mkdtemp(prefix="agentrun-bench-queue-"))
    postgres = Postgres().start()
    plane = ControlPlane(work / "cp").start()
    node = operator = kueue = None
    watchers: list[Watcher] = []
    try:
        apply_crds(plane)
        kueue = Kueue.on(plane, work / "kueue").start()
        node = start_dev_node(plane, work / "pods")
        operator = Operator(plane, postgres.create_database("bench"), work / "op").start()
        runs_ns, jobs_ns = "bench-queue-runs", "bench-queue-jobs"
        for ns in (runs_ns, jobs_ns):
            create_namespace(plane, ns)
        _apply_queue(plane, [runs_ns, jobs_ns], args.slots)
        api = api_client(plane)
        custom: Any = client.CustomObjectsApi(api)
        batch: Any = client.BatchV1Api(api)
        runs, jobs = Half(runs_ns), Half(jobs_ns)

        def workloads(kind: str, obj: dict[str, Any], at: float) -> None:
            runs.workload(kind, obj, at)
            jobs.workload(kind, obj, at)

        def run_seen(kind: str, obj: dict[str, Any], at: float) -> None:
            phase = (obj.get("status") or {}).get("phase")
            if phase in ("Succeeded", "Failed"):
                runs.finished.setdefault(obj["metadata"]["name"], (at, phase == "Succeeded"))

        def job_seen(kind: str, obj: dict[str, Any], at: float) -> None:
            conditions = _conditions(obj)
            if conditions.get("Complete") == "True" or conditions.get("Failed") == "True":
                jobs.finished.setdefault(obj["metadata"]["name"],
                                         (at, conditions.get("Complete") == "True"))

        watchers = [
            Watcher(custom.list_cluster_custom_object, workloads, group=K.GROUP,
                    version="v1beta2", plural="workloads"),
            Watcher(custom.list_namespaced_custom_object, run_seen, group=GROUP,
                    version=VERSION, namespace=runs_ns, plural=RUN_PLURAL),
            Watcher(batch.list_namespaced_job, job_seen, namespace=jobs_ns)]

        script = [{"sleep": args.work}, {"text": "done"}]

        def make_run(i: int) -> None:
            manifest = agent_run(f"run-{i}", script)
            manifest["metadata"]["namespace"] = runs_ns
            manifest["metadata"]["labels"] = {K.LABEL_QUEUE_NAME: QUEUE}
            custom.create_namespaced_custom_object(GROUP, VERSION, runs_ns, RUN_PLURAL,
                                                   manifest, _preload_content=False
                                                   ).release_conn()

        def make_job(i: int) -> None:
            manifest = {
                "apiVersion": "batch/v1", "kind": "Job",
                "metadata": {"name": f"job-{i}", "labels": {K.LABEL_QUEUE_NAME: QUEUE}},
                "spec": {"backoffLimit": 0, "template": {"spec": {
                    "restartPolicy": "Never", "containers": [{
                        "name": "work", "image": "busybox",
                        "command": ["sleep", f"{args.work:g}"],
                        "resources": {"requests": REQUESTS}}]}}}}
            batch.create_namespaced_job(jobs_ns, manifest, _preload_content=False
                                        ).release_conn()

        # A runner pod is named <run>-<attempt>; a Job's Workload is owned by the Job.
        run_seconds = run_half(runs, args.n, make_run, lambda i: f"run-{i}", timeout)
        job_seconds = run_half(jobs, args.n, make_job, lambda i: f"job-{i}", timeout)
        r = summary("agentrun", runs, args.n, run_seconds, lambda pod: pod.rsplit("-", 1)[0])
        j = summary("Jobs", jobs, args.n, job_seconds, lambda job: job)
        for label, s in (("agentrun", r), ("Jobs", j)):
            assert s["most"] <= args.slots, f"{label}: {s['most']} admitted at once"
        load = os.getloadavg()
        lines = [
            f"bench/queues.py, {args.n} runs and {args.n} Jobs through one ClusterQueue with "
            f"room for {args.slots} pods, each working {args.work:g}s, "
            f"{datetime.datetime.now(datetime.UTC):%Y-%m-%dT%H:%MZ}, "
            f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}",
            "",
            "| | AgentRuns | Jobs | ratio Jobs / agentrun |",
            "|---|---|---|---|",
            f"| create -> admitted, p50 | {r['p50']:.2f} s | {j['p50']:.2f} s | "
            f"{j['p50'] / r['p50']:.2f} |",
            f"| create -> admitted, p99 | {r['p99']:.2f} s | {j['p99']:.2f} s | "
            f"{j['p99'] / r['p99']:.2f} |",
            f"| first create -> last finished | {r['seconds']:.1f} s | {j['seconds']:.1f} s | "
            f"{j['seconds'] / r['seconds']:.2f} |",
            f"| finished per second | {r['per_second']:.2f} | {j['per_second']:.2f} | "
            f"{j['per_second'] / r['per_second']:.2f} |",
            f"| most Workloads admitted at once | {r['most']:.0f} | {j['most']:.0f} | |",
            "",
            "Ratios are Job / agentrun: for latency and time, above 1 means agentrun is "
            "faster; for finished per second, above 1 means Jobs are faster. Every run "
            "Succeeded and every Job Completed (asserted), and the queue never had more "
            "admitted than its room (asserted).",
        ]
        text = "\n".join(lines) + "\n"
        print(text)
        write_results(text, out)
    finally:
        for w in watchers:
            w.stop()
        if operator is not None:
            operator.stop()
        if node is not None:
            node.stop()
        if kueue is not None:
            kueue.stop()
        plane.stop()
        postgres.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
