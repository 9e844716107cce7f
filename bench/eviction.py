"""Eviction-to-Failed latency: agentrun beside the Kubernetes Job controller, in one run.

    .venv/bin/python bench/eviction.py [--trials 30] [--background N] [--check-interval S]
                                       [--out PATH]

Starts the real control plane (kube-controller-manager runs the Job controller), the
development node, a throwaway Postgres store and the operator. Then, alternating:

- agentrun: an AgentRun whose send_email recorded its email and is still waiting; the
  Eviction API is called on its runner pod (from this process, with the Python client);
  we time from the eviction call returning to
  the AgentRun status showing phase Failed with toolsExecuted set;
- the anchor: a Job (backoffLimit 0, a podFailurePolicy that fails the Job on
  DisruptionTarget) whose pod runs `sleep`; the same eviction; we time until the Job
  shows the pod as failed (status.failed >= 1).

Both are timed by a watch opened before the eviction (no polling delay). The figures
are p50/p95/p99 and the ratio agentrun/Job at each: below 1 means agentrun knew sooner.

Under load (`--background N`): before the trials, N live runs are created in namespace
bench-background, each asking for more CPU (resources.requests.cpu "100") than the
development node has (64). Where their pods go is `--background-pods`:

- `bound` (the default): to a second node, park-node, registered by this process with
  room for exactly N pods and its Lease renewed every 2 s, which runs nothing: the
  pods stay Pending with a node, as pods waiting on a busy kubelet do, and the run says
  PodCreated. The trial runs' pods, asking for nothing, only fit on the development node
  (park-node is full). Live runs on nodes, what a cluster has.
- `gated`: held by a scheduling gate (bench.agentrun.dev/hold) that a
  MutatingAdmissionPolicy of this benchmark adds to every runner pod created in
  bench-background; kube-scheduler leaves a gated pod alone, so the figures measure the
  operator among N live runs, not the scheduler's retries. The run says PodCreated. With
  `--rest-window S`, the operator is measured at rest before the trials (RSS and CPU over
  S seconds with nothing changing, as bench/scale.py does; goals at 20,000: <= 400 MB,
  <= 2% of a core): `--background 20000 --background-pods gated --rest-window 330` is
  the 20,000-live-runs figure of docs/operator.md.
- `unschedulable`: nowhere; their pods stay Unschedulable. kube-scheduler then retries
  every one of them each time an assigned pod is deleted (a trial's eviction), on the
  same two cores (a probe of 2026-12-01, no operator: 2,000 unschedulable pods, 10
  assigned pods created and deleted in 30 s, made kube-scheduler take 20,000 schedule
  attempts and 15% of a core, against 0.2% with nothing happening).

We wait until every run says so and the operator has gone quiet, then run the trials
as above. The
operator runs with its default flags unless `--check-interval` is given (its resync, a
safety net under the watches, re-queues every live run each interval). Reported beside
the figures: the CPU of the operator, the development node and the control plane over
the trials, the operator's uptime at each trial (to place its resyncs), and how many
background runs and pods changed during the trials.

The output goes to stdout and to `--out` (default eviction-<time>.txt, or
eviction-background<N>-<pods>-<time>.txt, in ~/.cache/agentrun/bench/ as
docs/development.md says; `--out -` for stdout only).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for extra in (ROOT / "devtools", ROOT):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

import asyncio  # noqa: E402

from agentrun_devtools.cluster import start_dev_node  # noqa: E402
from agentrun_devtools.controlplane import ControlPlane  # noqa: E402
from agentrun_devtools.postgres import Postgres  # noqa: E402
from agentrun_devtools.processes import wait_for  # noqa: E402
from agentrun_devtools.stats import results_file  # noqa: E402
from kubernetes import client, config, watch  # noqa: E402

from agentrun import store  # noqa: E402
from tests.cluster_fixtures import apply_crds  # noqa: E402
from tests.harness import Operator, System, agent_run, email_then_wait  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scale import (  # noqa: E402
    listed_pods,
    listed_runs,
    measure,
    versions,
    wait_live,
    wait_quiet,
)
from throughput import (  # noqa: E402
    CLK_TCK,
    Report,
    agentrun_maker,
    api_client,
    child_pid,
    cpu_ticks,
    create_many,
    create_namespace,
    load,
)

NAMESPACE = "bench"
BACKGROUND = "bench-background"
HOLD_GATE = "bench.agentrun.dev/hold"
REASON = {"bound": "PodCreated", "gated": "PodCreated", "unschedulable": "Unschedulable"}
_core: Any = None  # CoreV1Api of the admin, set in main()


def _watch_until(list_fn: Callable[..., Any], name: str, done: Callable[[dict[str, Any]], bool],
                 ready: threading.Event, result: dict[str, float], **kw: Any) -> None:
    stream = watch.Watch()
    ready.set()
    for event in stream.stream(list_fn, field_selector=f"metadata.name={name}",
                               timeout_seconds=120, **kw):
        obj = event["object"]
        if not isinstance(obj, dict):
            obj = client.ApiClient().sanitize_for_serialization(obj)
        if done(obj):
            result["at"] = time.monotonic()
            stream.stop()
            return


def timed_eviction(core: client.CoreV1Api, pod_namespace: str, pod: str,
                   list_fn: Callable[..., Any], name: str,
                   done: Callable[[dict[str, Any]], bool], **kw: Any) -> float:
    """Seconds from the Eviction API's answer for `pod` to a watch on `name` (opened
    before the eviction, through `list_fn`) seeing `done`."""
    ready, result = threading.Event(), dict[str, float]()
    watcher = threading.Thread(target=_watch_until,
                               args=(list_fn, name, done, ready, result), kwargs=kw)
    watcher.start()
    ready.wait(10)
    time.sleep(0.2)  # the watch request is on its way
    # The Eviction API from this process (what `kubectl drain` calls), on a connection
    # already open: the clock starts when the API server has answered, not when a kubectl
    # process has also exited (on a loaded machine that alone can take 100 ms).
    core.create_namespaced_pod_eviction(pod, pod_namespace, {
        "apiVersion": "policy/v1", "kind": "Eviction",
        "metadata": {"name": pod, "namespace": pod_namespace}}, _preload_content=False)
    evicted = time.monotonic()
    watcher.join(130)
    if "at" not in result:
        raise RuntimeError(f"{name}: no terminal status seen")
    return result["at"] - evicted


def agentrun_trial(system: System, custom: client.CustomObjectsApi, i: int) -> float:
    name = f"run-{i}"
    manifest = agent_run(name, email_then_wait(600))
    manifest["metadata"]["namespace"] = NAMESPACE
    system.apply(manifest)
    uid = system.wait_phase(NAMESPACE, name, "Running")["metadata"]["uid"]
    system.wait_ledger(uid, "send_email")

    def failed(obj: dict[str, Any]) -> bool:
        status = obj.get("status") or {}
        return status.get("phase") == "Failed" and "toolsExecuted" in status

    return timed_eviction(_core, NAMESPACE, f"{name}-1",
                          custom.list_namespaced_custom_object, name, failed,
                          group="agentrun.dev", version="v1alpha1", namespace=NAMESPACE,
                          plural="agentruns")


def job_trial(system: System, batch: client.BatchV1Api, i: int) -> float:
    name = f"job-{i}"
    system.kubectl("apply", "-f", "-", input=json.dumps({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "backoffLimit": 0,
            "podFailurePolicy": {"rules": [{"action": "FailJob", "onPodConditions": [
                {"type": "DisruptionTarget"}]}]},
            "template": {"spec": {"restartPolicy": "Never", "containers": [
                {"name": "work", "image": "busybox", "command": ["sleep", "600"]}]}},
        }}))

    def pod_running() -> bool:
        done = system.kubectl("get", "pods", "-n", NAMESPACE, "-l", f"job-name={name}", "-o",
                              "jsonpath={.items[*].status.phase} {.items[*].metadata.name}")
        parts = done.stdout.split()
        return len(parts) == 2 and parts[0] == "Running"

    wait_for(pod_running, timeout=60, what=f"{name} pod running")
    pod = system.kubectl("get", "pods", "-n", NAMESPACE, "-l", f"job-name={name}", "-o",
                         "jsonpath={.items[0].metadata.name}").stdout

    def failed(obj: dict[str, Any]) -> bool:
        return int((obj.get("status") or {}).get("failed") or 0) >= 1

    return timed_eviction(_core, NAMESPACE, pod, batch.list_namespaced_job, name, failed,
                          namespace=NAMESPACE)


def percentiles(values: list[float]) -> dict[str, float]:
    if len(values) < 2:
        return dict.fromkeys(("p50", "p95", "p99", "max"), values[0] if values else float("nan"))
    q = statistics.quantiles(values, n=100, method="inclusive")
    return {"p50": statistics.median(values), "p95": q[94], "p99": q[98], "max": max(values)}


def latency_table(say: Report, ours: list[float], jobs: list[float]) -> None:
    a, j = percentiles(ours), percentiles(jobs)
    keys = ("p50", "p95", "p99", "max")
    say("| | p50 | p95 | p99 | max |\n|---|---|---|---|---|")
    say("| agentrun (Failed + toolsExecuted) | " +
        " | ".join(f"{a[k] * 1000:.0f} ms" for k in keys) + " |")
    say("| Job controller (status.failed) | " +
        " | ".join(f"{j[k] * 1000:.0f} ms" for k in keys) + " |")
    say("| ratio agentrun / Job | " + " | ".join(f"{a[k] / j[k]:.2f}" for k in keys) + " |")


class ParkNode:
    """A node with room for `pods` pods that runs nothing: registered here, Ready, its
    Lease renewed every 2 s (so the node lifecycle controller keeps it Ready), deleted
    on stop."""

    NAME = "park-node"

    def __init__(self, api: client.ApiClient, pods: int) -> None:
        self.core, self.leases = client.CoreV1Api(api), client.CoordinationV1Api(api)
        self.pods = pods
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._renew, daemon=True)

    def start(self) -> ParkNode:
        room = {"cpu": "1000000", "memory": "1000Ti", "pods": str(self.pods)}
        self.core.create_node({"metadata": {"name": self.NAME, "labels": {
            "kubernetes.io/hostname": self.NAME}}})
        self.core.patch_node_status(self.NAME, {"status": {
            "capacity": room, "allocatable": room,
            "conditions": [self._ready()]}})
        self.leases.create_namespaced_lease("kube-node-lease", {
            "metadata": {"name": self.NAME}, "spec": {
                "holderIdentity": self.NAME, "leaseDurationSeconds": 40,
                "renewTime": self._micro()}})
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.core.delete_node(self.NAME)

    @staticmethod
    def _micro() -> str:
        return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")

    def _ready(self) -> dict[str, str]:
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return {"type": "Ready", "status": "True", "reason": "KubeletReady",
                "message": "parked: runs nothing", "lastHeartbeatTime": now,
                "lastTransitionTime": now}

    def _renew(self) -> None:
        while not self._stop.wait(2.0):
            try:
                self.leases.patch_namespaced_lease(self.NAME, "kube-node-lease", {
                    "spec": {"renewTime": self._micro()}})
            except Exception as e:  # the next renewal tries again
                print(f"park-node lease renewal failed: {e}", file=sys.stderr)


def hold_pods(plane: Any, namespace: str) -> None:
    """Every runner pod created in `namespace` from now on carries a scheduling gate no one
    removes: a MutatingAdmissionPolicy (the API server's own admission, no webhook)."""
    name = "bench-hold-runner-pods"
    plane.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List",
                                                        "items": [{
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail", "reinvocationPolicy": "Never",
            "matchConstraints": {
                "namespaceSelector": {"matchLabels": {
                    "kubernetes.io/metadata.name": namespace}},
                "objectSelector": {"matchExpressions": [
                    {"key": "agentrun.dev/run", "operator": "Exists"}]},
                "resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                                   "operations": ["CREATE"], "resources": ["pods"]}]},
            "mutations": [{"patchType": "ApplyConfiguration", "applyConfiguration": {
                "expression": "Object{spec: Object.spec{schedulingGates: "
                              f"[Object.spec.schedulingGates{{name: '{HOLD_GATE}'}}]}}}}"}}]}},
        {"apiVersion": "admissionregistration.k8s.io/v1",
         "kind": "MutatingAdmissionPolicyBinding", "metadata": {"name": name},
         "spec": {"policyName": name}}]}))
    # The API server loads a new policy in the background: wait until a pod created now
    # would carry the gate (a server-side dry run), or the first runs' pods escape it.
    core = client.CoreV1Api(api_client(plane, 1))
    probe = {"metadata": {"name": "hold-probe", "labels": {"agentrun.dev/run": "probe"}},
             "spec": {"containers": [{"name": "c", "image": "busybox"}]}}

    def held() -> bool:
        made = core.create_namespaced_pod(namespace, probe, dry_run="All")
        return any(g.name == HOLD_GATE for g in made.spec.scheduling_gates or [])

    wait_for(held, timeout=60, interval=0.5, what=f"{name} in effect")


def background(plane: Any, operator: Operator, n: int, say: Report, *, pods: str) -> float:
    """`n` live runs whose pods cannot go on the development node (they ask for more CPU
    than it has), bound to park-node, held by a scheduling gate or unschedulable, and the
    operator quiet again; returns the seconds until every run was live."""
    api = api_client(plane, 12)
    create_namespace(plane, BACKGROUND)
    if pods == "gated":
        hold_pods(plane, BACKGROUND)
    began = time.monotonic()
    create_many(agentrun_maker(api, BACKGROUND, prefix="bg",
                               resources={"requests": {"cpu": "100"}}), range(n), 8)
    say(f"{n} background runs created in {time.monotonic() - began:.0f} s")
    reason = REASON[pods]
    wait_live(api, BACKGROUND, n, say, reason=reason)
    if pods == "bound":
        wait_for(lambda: sum(1 for p in listed_pods(api, BACKGROUND)
                             if (p.get("spec") or {}).get("nodeName") == ParkNode.NAME) >= n,
                 timeout=900, interval=5, what=f"{n} background pods bound to park-node")
    if pods == "gated":
        held = sum(1 for p in listed_pods(api, BACKGROUND)
                   if any(g.get("name") == HOLD_GATE
                          for g in (p.get("spec") or {}).get("schedulingGates") or []))
        if held < n:
            raise RuntimeError(f"only {held}/{n} background pods carry {HOLD_GATE}")
    live = time.monotonic() - began
    assert operator.child is not None
    quiet, calm = wait_quiet(operator.child.pid, operator.child.log_path)
    where = {"bound": ", pods on park-node", "gated": f", pods held by {HOLD_GATE}"}
    say(f"{n} background runs live (Pending, {reason}{where.get(pods, '')}) after "
        f"{live:.0f} s; operator {'quiet' if calm else 'NOT quiet'} {quiet:.0f} s later; "
        f"load average {load()}")
    return live


def peak_rss_mb(pid: int) -> float:
    """VmHWM of `pid`: the most resident memory it has had since it started."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=30)
    parser.add_argument("--background", type=int, default=0,
                        help="live runs in another namespace during the trials")
    parser.add_argument("--background-pods", choices=("bound", "gated", "unschedulable"),
                        default="bound", help="where the background runs' pods are")
    parser.add_argument("--rest-window", type=float, default=0.0,
                        help="with --background: seconds the operator is measured at rest "
                             "among the background runs before the trials (0: not measured)")
    parser.add_argument("--check-interval", type=float,
                        help="the operator's --check-interval (default: its own, 300 s)")
    parser.add_argument("--out", help="results file (default ~/.cache/agentrun/bench/"
                                      "eviction[-background<N>-<pods>]-<time>.txt; '-' for "
                                      "stdout only)")
    args = parser.parse_args()
    out = results_file(f"eviction-background{args.background}-{args.background_pods}"
                       if args.background else "eviction", args.out)
    say = Report()

    work = Path(tempfile.mkdtemp(prefix="agentrun-bench-"))
    plane = ControlPlane(work / "cp").start()
    pg = Postgres().start()
    node = operator = None
    park: ParkNode | None = None
    ok = False
    try:
        apply_crds(plane)
        node = start_dev_node(plane, work / "pods")
        url = pg.create_database("bench")
        asyncio.run(store.migrate(url))
        flags = () if args.check_interval is None else (
            f"--check-interval={args.check_interval:g}",)
        started = time.monotonic()
        operator = Operator(plane, url, work, flags).start()
        system = System(plane, url, operator)
        say(f"bench/eviction.py, {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, "
            f"{os.cpu_count()} CPUs, {args.trials} trials, {args.background} background runs, "
            f"operator flags {' '.join(flags) or '(defaults)'}; load average {load()}")
        if args.background:
            if args.background_pods == "bound":
                park = ParkNode(api_client(plane, 4), args.background).start()
            live = background(plane, operator, args.background, say,
                              pods=args.background_pods)
            if args.rest_window > 0:
                rest = measure(plane, operator, api_client(plane, 4), args.background, live,
                               args.rest_window, started, namespace=BACKGROUND)
                assert operator.child is not None
                say(f"\noperator at rest among {args.background} live runs, "
                    f"{args.rest_window:.0f} s with {rest.changed} objects changed"
                    f"{'' if rest.quiet else ' (it had not gone quiet)'}: RSS {rest.rss_mb:.0f} MB "
                    f"(max {rest.rss_max_mb:.0f} in the window, "
                    f"{peak_rss_mb(operator.child.pid):.0f} since it started), CPU "
                    f"{rest.cpu:.2f}% of a core (busiest second {rest.cpu_max_1s:.0f}%; main "
                    f"thread {rest.main_thread:.2f}%, others {rest.other_threads:.2f}%); "
                    f"kube-apiserver {rest.apiserver:.1f}%, etcd {rest.etcd:.1f}%, "
                    f"kube-scheduler {rest.scheduler:.1f}%, kcm {rest.kcm:.1f}%; operator log "
                    f"lines {rest.log_lines}; load average {rest.load}")
        plane.kubectl("create", "namespace", NAMESPACE)
        wait_for(lambda: plane.kubectl("get", "sa", "default", "-n", NAMESPACE,
                                       check=False).returncode == 0, timeout=30, what="sa")
        api = config.new_client_from_config(config_file=str(plane.kubeconfig))
        custom, batch = client.CustomObjectsApi(api), client.BatchV1Api(api)
        global _core
        _core = client.CoreV1Api(api)
        ours: list[float] = []
        jobs: list[float] = []
        watched = {"operator": operator.child.pid if operator.child else 0,
                   "devnode": node.pid, **{name: child_pid(plane, name) for name in (
                       "kube-apiserver", "kube-scheduler", "kube-controller-manager", "etcd")}}
        before = versions(api, BACKGROUND) if args.background else {}
        ticks0 = {name: cpu_ticks(pid) for name, pid in watched.items()}
        began = time.monotonic()
        for i in range(args.trials):
            ours.append(agentrun_trial(system, custom, i))
            jobs.append(job_trial(system, batch, i))
            say(f"trial {i + 1:2d}: agentrun {ours[-1] * 1000:7.1f} ms   "
                f"Job {jobs[-1] * 1000:7.1f} ms   (operator up {time.monotonic() - started:.0f} s)")
        spent = time.monotonic() - began
        say(f"\nCPU over the {spent:.0f} s of trials, % of one core: " + ", ".join(
            f"{name} {(cpu_ticks(pid) - ticks0[name]) * 100 / CLK_TCK / spent:.1f}"
            for name, pid in watched.items()) + f" (the operator resyncs every live run every "
            f"~{args.check_interval or 300:g} s, jittered +-10%)")
        if args.background:
            after = versions(api, BACKGROUND)
            changed = Counter(kind for kind, _ in set(before) | set(after)
                              if before.get((kind, _)) != after.get((kind, _)))
            reason = REASON[args.background_pods]
            still = sum(1 for r in listed_runs(api, BACKGROUND)
                        if (r.get("status") or {}).get("reason") == reason)
            say(f"background: {still}/{args.background} runs still Pending {reason} after "
                f"the trials; changed during the trials: {changed.get('run', 0)} runs, "
                f"{changed.get('pod', 0)} pods")
        say(f"\nEviction API call returned -> terminal status visible, {args.trials} "
            f"evictions each, {args.background} other live runs")
        latency_table(say, ours, jobs)
        say(f"\nload average at the end {load()} (other processes share these CPUs)")
        ok = True
    finally:
        if park is not None:
            park.stop()
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
