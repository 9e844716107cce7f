"""Throughput: N AgentRuns -> N runner pods beside N batch/v1 Jobs -> N pods, in one run.

    .venv/bin/python bench/throughput.py [--n 2000] [--threads 8] [--variant FLAGS]...
                                         [--keep] [--out PATH]

One control plane (etcd, kube-apiserver, kube-controller-manager with the Job controller,
kube-scheduler) and no node: every pod stays Pending (Unschedulable), so only the
controllers are timed, not a kubelet. A throwaway Postgres store and the operator.

1. agentrun: N AgentRuns (noop-agent, a one-line script, input "hi") are created with
   `--threads` concurrent API calls in namespace tp-agentrun-1; we time from the first
   create call to the N-th runner pod appearing in a pod watch opened before it (every
   pod exists in the API). Then the namespace is deleted and we wait until it is gone
   (the operator releases every run's finalizer), and the operator is stopped.
2. Jobs: N Jobs (backoffLimit 0, one `sleep` pod each) created the same way in namespace
   tp-jobs; we time from the first create call to the N-th pod in the watch.

The figures: seconds each, pods per second, and the ratio Job time / agentrun time
(above 1: agentrun is faster). kube-controller-manager runs with its default client
rate limits (--kube-api-qps 20, --kube-api-burst 30), as a cluster's does by default.
For the account of where the time goes, each half also reports the API requests it
caused per object (kube-apiserver's apiserver_request_duration_seconds count and mean,
by verb and resource, whoever the client, watches left out; scraped before and after),
the store's transactions per object (pg_stat_database), and the operator's CPU over its
half. `--variant FLAGS` (repeatable) runs one agentrun half per
variant, each with a fresh operator started with FLAGS (e.g. --variant "" --variant
"--workers=32"), one after the other, each cleaned up before the next.

The output goes to stdout and to `--out` (default
~/.cache/agentrun/bench/throughput-<time>.txt as docs/development.md says; `--out -` for
stdout only). The helpers here (creating many objects, counting pods as a
watch shows them, CPU and memory from /proc) are shared with bench/scale.py and
bench/eviction.py.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for extra in (ROOT / "devtools", ROOT):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

from agentrun_devtools.controlplane import ControlPlane  # noqa: E402
from agentrun_devtools.postgres import Postgres  # noqa: E402
from agentrun_devtools.processes import wait_for  # noqa: E402
from agentrun_devtools.stats import results_file, write_results  # noqa: E402
from agentrun_operator.informer import watch_lines  # noqa: E402
from kubernetes import client, config  # noqa: E402
from kubernetes.client.exceptions import ApiException  # noqa: E402

from agentrun import store  # noqa: E402
from agentrun.vocabulary import GROUP, LABEL_RUN, RUN_PLURAL, VERSION  # noqa: E402
from tests.cluster_fixtures import apply_crds  # noqa: E402
from tests.harness import Operator, agent_run  # noqa: E402

SCRIPT = [{"text": "hi"}]
CLK_TCK = os.sysconf("SC_CLK_TCK")


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


class Report:
    """Lines to stdout as they come, and to the results file at the end."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def __call__(self, line: str = "") -> None:
        self.lines.append(line)
        print(line, flush=True)

    def write(self, out: Path | None) -> None:
        write_results("\n".join(self.lines), out)


# -- the API ------------------------------------------------------------------------------


def api_client(plane: ControlPlane, pool: int = 16) -> client.ApiClient:
    configuration = client.Configuration()
    config.load_kube_config(config_file=str(plane.kubeconfig),
                            client_configuration=configuration)
    configuration.connection_pool_maxsize = pool
    return client.ApiClient(configuration)


def create_namespace(plane: ControlPlane, name: str) -> None:
    plane.kubectl("create", "namespace", name)
    wait_for(lambda: plane.kubectl("get", "sa", "default", "-n", name,
                                   check=False).returncode == 0, timeout=60,
             what=f"namespace {name} default ServiceAccount")


def delete_namespace(plane: ControlPlane, name: str, timeout: float = 900) -> float:
    """Deletes `name` and waits until it is gone; returns the seconds it took. Its
    AgentRuns first, waiting for the operator to release them (the namespace controller
    would poll for them with its backoff)."""
    began = time.monotonic()
    plane.kubectl("delete", f"{RUN_PLURAL}.{GROUP}", "--all", "-n", name, "--wait=false",
                  timeout=300)

    def no_runs() -> bool:
        left = plane.kubectl("get", f"{RUN_PLURAL}.{GROUP}", "-n", name, "-o", "name",
                             "--chunk-size=0", timeout=120)
        return not left.stdout.strip()

    wait_for(no_runs, timeout=timeout, what=f"AgentRuns of {name} gone", interval=1)
    plane.kubectl("delete", "namespace", name, "--wait=false")
    wait_for(lambda: plane.kubectl("get", "namespace", name, check=False).returncode != 0,
             timeout=timeout, what=f"namespace {name} gone", interval=1)
    return time.monotonic() - began


def create_many(make: Callable[[int], None], indices: range, threads: int) -> None:
    """Calls make(i) for every i, `threads` at a time; a refused call (429, 5xx, a
    dropped connection) is tried again."""

    def one(i: int) -> None:
        for attempt in range(8):
            try:
                make(i)
                return
            except ApiException as e:
                if e.status == 409:  # created by an earlier try whose answer was lost
                    return
                if e.status not in (429, 500, 502, 503, 504) or attempt == 7:
                    raise
            except Exception:
                if attempt == 7:
                    raise
            time.sleep(0.2 * 2 ** attempt)

    with ThreadPoolExecutor(threads) as pool:
        for done in pool.map(one, indices):
            del done


def run_manifest(name: str, namespace: str, **spec: Any) -> dict[str, Any]:
    manifest = agent_run(name, SCRIPT, agent="noop-agent", text="hi", **spec)
    manifest["metadata"]["namespace"] = namespace
    return manifest


def agentrun_maker(api: client.ApiClient, namespace: str, prefix: str = "run",
                   **spec: Any) -> Callable[[int], None]:
    custom: Any = client.CustomObjectsApi(api)

    def make(i: int) -> None:
        response = custom.create_namespaced_custom_object(
            GROUP, VERSION, namespace, RUN_PLURAL, run_manifest(f"{prefix}-{i}", namespace,
                                                                **spec),
            _preload_content=False)
        response.release_conn()

    return make


def job_manifest(name: str) -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
            "spec": {"backoffLimit": 0, "template": {"spec": {
                "restartPolicy": "Never", "containers": [
                    {"name": "work", "image": "busybox", "command": ["sleep", "600"]}]}}}}


def job_maker(api: client.ApiClient, namespace: str) -> Callable[[int], None]:
    batch: Any = client.BatchV1Api(api)

    def make(i: int) -> None:
        response = batch.create_namespaced_job(namespace, job_manifest(f"job-{i}"),
                                               _preload_content=False)
        response.release_conn()

    return make


class PodCounter:
    """The distinct pods of a namespace (matching a label selector) as a watch shows
    them, with the time the `target`-th one arrived. Raw JSON, no typed models."""

    def __init__(self, api: client.ApiClient, namespace: str, selector: str,
                 target: int) -> None:
        self.core: Any = client.CoreV1Api(api)
        self.namespace, self.selector, self.target = namespace, selector, target
        self.names: set[str] = set()
        self.reached_at: float | None = None
        self.reached = threading.Event()
        self.listed = threading.Event()
        self._stop = threading.Event()
        self._response: Any = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> PodCounter:
        self._thread.start()
        if not self.listed.wait(30):
            raise RuntimeError("pod watch did not start")
        return self

    def stop(self) -> None:
        self._stop.set()
        with contextlib.suppress(Exception):
            if self._response is not None:
                self._response.shutdown()

    def wait(self, timeout: float) -> float:
        if not self.reached.wait(timeout):
            raise TimeoutError(f"{len(self.names)}/{self.target} pods after {timeout:.0f}s")
        assert self.reached_at is not None
        return self.reached_at

    def _see(self, name: str) -> None:
        self.names.add(name)
        if self.reached_at is None and len(self.names) >= self.target:
            self.reached_at = time.monotonic()
            self.reached.set()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                listed = self.core.list_namespaced_pod(
                    self.namespace, label_selector=self.selector, _preload_content=False)
                body = json.loads(listed.data)
                for item in body.get("items") or []:
                    self._see(item["metadata"]["name"])
                version = body["metadata"]["resourceVersion"]
                self.listed.set()
                self._response = response = self.core.list_namespaced_pod(
                    self.namespace, label_selector=self.selector, watch=True,
                    resource_version=version, timeout_seconds=3600,
                    _preload_content=False)
                try:
                    for line in watch_lines(response):
                        event = json.loads(line)
                        if event.get("type") in ("ADDED", "MODIFIED"):
                            self._see(event["object"]["metadata"]["name"])
                        if self.reached.is_set() and self._stop.is_set():
                            return
                finally:
                    response.release_conn()
        except Exception as e:
            if not self._stop.is_set():
                self.error = e
                self.listed.set()


# -- /proc --------------------------------------------------------------------------------


def tree(pid: int) -> list[int]:
    """`pid` and its descendants."""
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        for task in Path(f"/proc/{p}/task").glob("*"):
            with contextlib.suppress(OSError):
                todo.extend(int(c) for c in (task / "children").read_text().split())
    return found


def cpu_ticks(pid: int, children: bool = True) -> int:
    """utime + stime of `pid` (and its descendants), in clock ticks."""
    total = 0
    for p in tree(pid) if children else [pid]:
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
    return total


def thread_ticks(pid: int) -> dict[int, int]:
    """utime + stime of every thread of `pid`, by thread id."""
    out = {}
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            out[int(task.name)] = int(fields[11]) + int(fields[12])
    return out


def rss_kib(pid: int) -> int:
    """VmRSS of `pid` and its descendants, in KiB."""
    total = 0
    for p in tree(pid):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
    return total


def child_pid(plane: ControlPlane, name: str) -> int:
    return next(c.pid for c in plane.children if c.name == name)


# -- what the half cost -------------------------------------------------------------------

Requests = dict[tuple[str, str], tuple[float, float]]  # (verb, resource) -> (count, seconds)


def api_requests(plane: ControlPlane) -> Requests:
    """kube-apiserver's request counts and total seconds by (verb, resource[/sub])."""
    text = plane.kubectl("get", "--raw", "/metrics", timeout=60).stdout
    out: dict[tuple[str, str], list[float]] = {}
    for line in text.splitlines():
        name, _, rest = line.partition("{")
        if name not in ("apiserver_request_duration_seconds_count",
                        "apiserver_request_duration_seconds_sum"):
            continue
        labels_text, _, value = rest.rpartition("} ")
        labels = dict(part.split("=", 1) for part in labels_text.split(",") if "=" in part)
        labels = {k: v.strip('"') for k, v in labels.items()}
        if labels.get("verb") == "WATCH":
            continue
        resource = labels.get("resource", "")
        if labels.get("subresource"):
            resource += "/" + labels["subresource"]
        key = (labels.get("verb", ""), resource)
        slot = out.setdefault(key, [0.0, 0.0])
        slot[0 if name.endswith("_count") else 1] += float(value)
    return {k: (v[0], v[1]) for k, v in out.items()}


def refusals(plane: ControlPlane) -> dict[tuple[str, str, str], float]:
    """kube-apiserver's answers other than 2xx, by (verb, resource[/sub], code)."""
    text = plane.kubectl("get", "--raw", "/metrics", timeout=60).stdout
    out: dict[tuple[str, str, str], float] = {}
    for line in text.splitlines():
        name, _, rest = line.partition("{")
        if name != "apiserver_request_total":
            continue
        labels_text, _, value = rest.rpartition("} ")
        labels = {k: v.strip('"') for k, v in (
            part.split("=", 1) for part in labels_text.split(",") if "=" in part)}
        code = labels.get("code", "")
        if labels.get("verb") == "WATCH" or code.startswith("2"):
            continue
        resource = labels.get("resource", "")
        if labels.get("subresource"):
            resource += "/" + labels["subresource"]
        key = (labels.get("verb", ""), resource, code)
        out[key] = out.get(key, 0.0) + float(value)
    return out


def refusal_line(n: int, before: dict[tuple[str, str, str], float],
                 after: dict[tuple[str, str, str], float]) -> str:
    counted = sorted(((k, v - before.get(k, 0.0)) for k, v in after.items()
                      if v - before.get(k, 0.0) > 0), key=lambda kv: -kv[1])
    return "  answered other than 2xx, per object: " + (", ".join(
        f"{verb} {resource} {code} {count / n:.2f}" for (verb, resource, code), count
        in counted) or "none")


def request_delta(before: Requests, after: Requests) -> Requests:
    out = {}
    for key, (count, seconds) in after.items():
        c0, s0 = before.get(key, (0.0, 0.0))
        if count - c0 > 0:
            out[key] = (count - c0, seconds - s0)
    return out


def transactions(pg: Postgres, database: str) -> int:
    done = subprocess.run(
        [str(pg._bin / "psql"), "-h", "127.0.0.1", "-p", str(pg.port), "-U", "agentrun",
         "-d", database, "-Atc",
         f"select xact_commit + xact_rollback from pg_stat_database where datname = "
         f"'{database}'"], check=True, capture_output=True, text=True)
    return int(done.stdout.strip() or 0)


def cost_lines(label: str, n: int, requests: Requests, xacts: int | None) -> list[str]:
    rows = [f"  {label}: API requests per object (all clients; mean latency)",
            "  | verb resource | per object | mean |", "  |---|---|---|"]
    total = 0.0
    for (verb, resource), (count, seconds) in sorted(requests.items(),
                                                      key=lambda kv: -kv[1][0]):
        total += count
        if count / n >= 0.05:
            rows.append(f"  | {verb} {resource} | {count / n:.2f} | "
                        f"{seconds / count * 1000:.0f} ms |")
    rows.append(f"  | all (not watches) | {total / n:.2f} | |")
    if xacts is not None:
        rows.append(f"  store transactions per object: {xacts / n:.1f}")
    return rows


# -- the bench ----------------------------------------------------------------------------


def timed_half(plane: ControlPlane, api: client.ApiClient, namespace: str, selector: str,
               make: Callable[[int], None], n: int, threads: int) -> tuple[float, float]:
    """(seconds until every create call returned, seconds until the N-th pod)."""
    create_namespace(plane, namespace)
    counter = PodCounter(api, namespace, selector, n).start()
    try:
        began = time.monotonic()
        create_many(make, range(n), threads)
        created = time.monotonic()
        at = counter.wait(1800)
        if counter.error is not None:
            raise counter.error
        return created - began, at - began
    finally:
        counter.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=8, help="concurrent create calls")
    parser.add_argument("--variant", action="append", default=[],
                        help="operator flags, space-separated, for one agentrun half "
                             "(repeatable: one half each, in order; default: one half with "
                             "the operator's defaults)")
    parser.add_argument("--keep", action="store_true",
                        help="keep the work directory (the operator's log) afterwards")
    parser.add_argument("--out", help="results file (default ~/.cache/agentrun/bench/"
                                      "throughput-<time>.txt; '-' for stdout only)")
    args = parser.parse_args()
    out = results_file("throughput", args.out)
    say = Report()
    work = Path(tempfile.mkdtemp(prefix="agentrun-bench-throughput-"))
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
            api = api_client(plane, args.threads + 4)
            variants = [tuple(v.split()) for v in args.variant] or [()]
            say(f"bench/throughput.py, {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} "
                f"UTC, {os.cpu_count()} CPUs, N={args.n}, {args.threads} concurrent creates; "
                f"no node (pods stay Pending); operator flags: " +
                " | ".join(" ".join(v) or "(defaults)" for v in variants) +
                f"; load average {load()}")
            rows: list[tuple[str, float, float]] = []
            for i, flags in enumerate(variants):
                label = f"agentrun {' '.join(flags)}".strip()
                namespace = f"tp-agentrun-{i + 1}"
                operator = Operator(plane, url, work, flags).start()
                stack.callback(operator.stop)
                assert operator.child is not None
                say(f"\n{label}: N AgentRuns -> N runner pods")
                r0, x0, c0 = api_requests(plane), transactions(pg, "bench"), cpu_ticks(
                    operator.child.pid)
                f0 = refusals(plane)
                a_created, a_pods = timed_half(plane, api, namespace, LABEL_RUN,
                                               agentrun_maker(api, namespace), args.n,
                                               args.threads)
                op_cpu = (cpu_ticks(operator.child.pid) - c0) * 100 / CLK_TCK / a_pods
                time.sleep(2)  # the store's statistics are flushed within a second
                a_cost = request_delta(r0, api_requests(plane))
                a_xacts = transactions(pg, "bench") - x0
                say(f"  creates returned after {a_created:.1f} s, all {args.n} pods after "
                    f"{a_pods:.1f} s; operator CPU {op_cpu:.0f}% of a core over it; load "
                    f"average {load()}")
                for line in cost_lines(label, args.n, a_cost, a_xacts):
                    say(line)
                say(refusal_line(args.n, f0, refusals(plane)))
                discarded = operator.child.log_path.read_text(errors="replace").count(
                    "Connection pool is full")
                say(f"  operator log: {discarded} 'Connection pool is full, discarding "
                    "connection' warnings (each a connection closed, to be opened anew)")
                cleanup = delete_namespace(plane, namespace)
                operator.stop()
                say(f"  namespace deleted (every finalizer released) in {cleanup:.1f} s; "
                    "operator stopped")
                rows.append((label, a_created, a_pods))

            say("\nJob controller: N Jobs -> N pods")
            r0, f0 = api_requests(plane), refusals(plane)
            j_created, j_pods = timed_half(plane, api, "tp-jobs", "job-name",
                                           job_maker(api, "tp-jobs"), args.n, args.threads)
            j_cost = request_delta(r0, api_requests(plane))
            say(f"  creates returned after {j_created:.1f} s, all {args.n} pods after "
                f"{j_pods:.1f} s; load average {load()}")
            for line in cost_lines("Jobs", args.n, j_cost, None):
                say(line)
            say(refusal_line(args.n, f0, refusals(plane)))

            say(f"\nFirst create call -> all N={args.n} pods exist in the API")
            say("| | creates returned | all pods | pods/s | ratio Job / this |\n"
                "|---|---|---|---|---|")
            for label, created, pods in rows:
                say(f"| {label} | {created:.1f} s | {pods:.1f} s | {args.n / pods:.1f} | "
                    f"{j_pods / pods:.2f} |")
            say(f"| Job controller | {j_created:.1f} s | {j_pods:.1f} s | "
                f"{args.n / j_pods:.1f} | |")
            say(f"\nload average at the end {load()} (other processes share these CPUs)")
            ok = True
        finally:
            if not ok:
                print(f"bench failed; logs kept in {work}", file=sys.stderr)
    if ok:
        say.write(out)
        if args.keep:
            print(f"logs kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
