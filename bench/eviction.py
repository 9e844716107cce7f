"""Eviction-to-Failed latency: agentrun beside the Kubernetes Job controller, in one run.

    .venv/bin/python bench/eviction.py [--trials 30]

Starts the real control plane (kube-controller-manager runs the Job controller), the
development node, a throwaway Postgres store and the operator. Then, alternating:

- agentrun: an AgentRun whose send_email recorded its email and is still waiting; the
  Eviction API is called on its runner pod; we time from the eviction call returning to
  the AgentRun status showing phase Failed with toolsExecuted set;
- the anchor: a Job (backoffLimit 0, a podFailurePolicy that fails the Job on
  DisruptionTarget) whose pod runs `sleep`; the same eviction; we time until the Job
  shows the pod as failed (status.failed >= 1).

Both are timed by a watch opened before the eviction (no polling delay). The figures
are p50/p95/p99 and the ratio agentrun/Job at each: below 1 means agentrun knew sooner.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
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
from kubernetes import client, config, watch  # noqa: E402

from agentrun import store  # noqa: E402
from tests.cluster_fixtures import apply_crds  # noqa: E402
from tests.harness import Operator, System, agent_run, email_then_wait  # noqa: E402

NAMESPACE = "bench"


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


def _timed_eviction(system: System, pod: str, list_fn: Callable[..., Any], name: str,
                    done: Callable[[dict[str, Any]], bool], **kw: Any) -> float:
    ready, result = threading.Event(), {}
    watcher = threading.Thread(target=_watch_until,
                               args=(list_fn, name, done, ready, result), kwargs=kw)
    watcher.start()
    ready.wait(10)
    time.sleep(0.2)  # the watch request is on its way
    system.evict(NAMESPACE, pod)
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

    return _timed_eviction(system, f"{name}-1",
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

    return _timed_eviction(system, pod, batch.list_namespaced_job, name, failed,
                           namespace=NAMESPACE)


def percentiles(values: list[float]) -> dict[str, float]:
    q = statistics.quantiles(values, n=100, method="inclusive")
    return {"p50": statistics.median(values), "p95": q[94], "p99": q[98]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=30)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="agentrun-bench-"))
    plane = ControlPlane(work / "cp").start()
    pg = Postgres().start()
    node = operator = None
    try:
        apply_crds(plane)
        node = start_dev_node(plane, work / "pods")
        url = pg.create_database("bench")
        asyncio.run(store.migrate(url))
        operator = Operator(plane, url, work, ("--check-interval=5",)).start()
        system = System(plane, url, operator)
        plane.kubectl("create", "namespace", NAMESPACE)
        wait_for(lambda: plane.kubectl("get", "sa", "default", "-n", NAMESPACE,
                                       check=False).returncode == 0, timeout=30, what="sa")
        api = config.new_client_from_config(config_file=str(plane.kubeconfig))
        custom, batch = client.CustomObjectsApi(api), client.BatchV1Api(api)
        ours: list[float] = []
        jobs: list[float] = []
        for i in range(args.trials):
            ours.append(agentrun_trial(system, custom, i))
            jobs.append(job_trial(system, batch, i))
            print(f"trial {i + 1:2d}: agentrun {ours[-1] * 1000:7.1f} ms   "
                  f"Job {jobs[-1] * 1000:7.1f} ms", flush=True)
        a, j = percentiles(ours), percentiles(jobs)
        print(f"\nEviction API call returned -> terminal status visible, {args.trials} "
              "evictions each")
        print("| | p50 | p95 | p99 |\n|---|---|---|---|")
        print("| agentrun (Failed + toolsExecuted) | " +
              " | ".join(f"{a[k] * 1000:.0f} ms" for k in ("p50", "p95", "p99")) + " |")
        print("| Job controller (status.failed) | " +
              " | ".join(f"{j[k] * 1000:.0f} ms" for k in ("p50", "p95", "p99")) + " |")
        print("| ratio agentrun / Job | " +
              " | ".join(f"{a[k] / j[k]:.2f}" for k in ("p50", "p95", "p99")) + " |")
    finally:
        if operator is not None:
            operator.stop()
        if node is not None:
            node.stop()
        pg.stop()
        plane.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
