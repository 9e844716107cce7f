"""Eviction-to-Failed latency on the real node: agentrun beside the Job controller.

    sudo .venv/bin/python bench/eviction_realnode.py [--trials 10] [--out PATH]

(needs root and the real node: `bash devtools/realnode/build.sh`; `make bench-real-node`
does both.) The cluster is the one `make test-e2e` installs (e2e/install.py): the
control plane, the real node (containerd, runc, kubelet, kube-proxy), and agentrun from
the README's "Install on your cluster": its images, `make install`, `helm install` with
the trial Postgres. Every runner, the operator, the store API and Postgres are
containers. Then, alternating in namespace shop:

- agentrun: an AgentRun whose send_email has recorded its email (read from Postgres) and
  is still waiting; the Eviction API is called on its runner pod; we time from the call
  returning to the AgentRun status showing phase Failed with toolsExecuted;
- the anchor: a Job (backoffLimit 0, a podFailurePolicy failing the Job on
  DisruptionTarget) whose container, from the runner image, exits at once on SIGTERM (a
  bare `sleep` as PID 1 ignores it and the Job would wait out the 30 s grace period); the
  same eviction; we time until the Job counts the pod failed (status.failed >= 1). The
  Job controller waits for the pod to be terminal, so its figure includes the kubelet
  stopping the container and reporting it: what a Job on a real node costs.

Both are timed by a watch opened before the eviction. A trial whose run never reaches
Running with its email recorded is reported with what the cluster said (the run's
status, the runner's log, the store API's pod and endpoints, kube-proxy's rules) and
counted; the trials go on.

The output goes to stdout and to `--out` (default
~/.cache/agentrun/bench/eviction-realnode-<time>.txt as docs/development.md says; `--out -`
for stdout only).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for extra in (ROOT / "devtools", ROOT, Path(__file__).resolve().parent):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

from agentrun_devtools.stats import results_file  # noqa: E402
from eviction import latency_table, timed_eviction  # noqa: E402
from kubernetes import client, config  # noqa: E402
from throughput import Report, load  # noqa: E402

from e2e.install import (  # noqa: E402
    EMAIL,
    RELEASE_NAMESPACE,
    Cluster,
    installed,
    run_manifest,
)

NAMESPACE = "shop"


class TrialFailed(Exception):
    pass


def diagnosis(cluster: Cluster, run: str) -> str:
    """What the cluster says when a runner did not get going."""
    log = cluster.kubectl("logs", "-n", NAMESPACE, f"{run}-1", "--tail=30", check=False)
    return "\n".join([
        f"run status: {json.dumps(cluster.get('agentrun', run, NAMESPACE).get('status'))}",
        f"runner log (tail):\n{(log.stdout or log.stderr).strip()}",
        cluster.release_report(),
    ])


def system_pods(cluster: Cluster) -> dict[str, dict[str, Any]]:
    """The release's pods: restarts, readiness and each container's memory working set
    (crictl stats on the node), by pod name."""
    listed = json.loads(cluster.kubectl("get", "pods", "-n", RELEASE_NAMESPACE, "-o",
                                        "json").stdout)["items"]
    stats = json.loads(cluster.node.crictl("stats", "-o", "json").stdout or "{}")
    memory = {}
    for entry in stats.get("stats") or []:
        labels = (entry.get("attributes") or {}).get("labels") or {}
        pod = labels.get("io.kubernetes.pod.name")
        working = ((entry.get("memory") or {}).get("workingSetBytes") or {}).get("value")
        if pod and working is not None:
            memory[pod] = int(working)
    found = {}
    for pod in listed:
        statuses = (pod.get("status") or {}).get("containerStatuses") or []
        found[pod["metadata"]["name"]] = {
            "restarts": sum(int(c.get("restartCount") or 0) for c in statuses),
            "ready": all(c.get("ready") for c in statuses),
            "memory": memory.get(pod["metadata"]["name"])}
    return found


def agentrun_trial(cluster: Cluster, core: client.CoreV1Api, custom: client.CustomObjectsApi,
                   i: int) -> float:
    name = f"lat-{i}"
    cluster.apply(NAMESPACE, run_manifest(name, [
        {"call": "send_email", "args": {**EMAIL, "delay_seconds": 300}},
        {"text": "Told the customer."}]))
    try:
        cluster.wait_phase("agentrun", name, NAMESPACE, ("Running",), timeout=240)
        cluster.wait("the email in the store", lambda: cluster.emails(name) >= 1,
                     timeout=240)
    except (AssertionError, TimeoutError) as e:
        raise TrialFailed(f"{name}: {e}\n{diagnosis(cluster, name)}") from e

    def failed(obj: dict[str, Any]) -> bool:
        status = obj.get("status") or {}
        return status.get("phase") == "Failed" and "toolsExecuted" in status

    return timed_eviction(core, NAMESPACE, f"{name}-1", custom.list_namespaced_custom_object,
                          name, failed, group="agentrun.dev", version="v1alpha1",
                          namespace=NAMESPACE, plural="agentruns")


def job_trial(cluster: Cluster, core: client.CoreV1Api, batch: client.BatchV1Api,
              i: int) -> float:
    name = f"job-{i}"
    cluster.apply(NAMESPACE, {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
        "spec": {"backoffLimit": 0, "podFailurePolicy": {"rules": [{
            "action": "FailJob", "onPodConditions": [{"type": "DisruptionTarget"}]}]},
            "template": {"spec": {"restartPolicy": "Never", "containers": [{
                "name": "work", "image": "agentrun/runner:dev",
                "command": ["/bin/sh", "-c", "trap 'exit 143' TERM; sleep 300 & wait"]}]}}}})
    pod = ""

    def running() -> bool:
        nonlocal pod
        listed = core.list_namespaced_pod(NAMESPACE, label_selector=f"job-name={name}",
                                          _preload_content=False)
        for p in json.loads(listed.data)["items"]:  # type: ignore[attr-defined]
            if (p.get("status") or {}).get("phase") == "Running":
                pod = p["metadata"]["name"]
                return True
        return False

    cluster.wait(f"{name}'s pod running", running, timeout=120)
    return timed_eviction(core, NAMESPACE, pod, batch.list_namespaced_job, name,
                          lambda obj: int((obj.get("status") or {}).get("failed") or 0) >= 1,
                          namespace=NAMESPACE)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--out", help="results file (default ~/.cache/agentrun/bench/"
                                      "eviction-realnode-<time>.txt; '-' for stdout only)")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("the real node needs root", file=sys.stderr)
        return 2
    out = results_file("eviction-realnode", args.out)
    say = Report()
    root = Path(tempfile.mkdtemp(prefix="agentrun-bench-realnode-"))
    ok = False
    try:
        with installed(root) as cluster:
            now = datetime.datetime.now(datetime.UTC)
            say(f"bench/eviction_realnode.py, {now:%Y-%m-%d %H:%M} UTC, {os.cpu_count()} "
                f"CPUs, {args.trials} trials; the real node "
                f"(containerd, runc, kubelet), agentrun installed by helm; load average "
                f"{load()}")
            say("set-up: " + ", ".join(f"{k} {v:.0f} s" for k, v in cluster.timings.items()))
            api = config.new_client_from_config(config_file=str(cluster.plane.kubeconfig))
            core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
            batch = client.BatchV1Api(api)
            ours: list[float] = []
            jobs: list[float] = []
            failures: list[str] = []
            before = system_pods(cluster)
            for i in range(args.trials):
                measured: float | None = None
                try:
                    measured = agentrun_trial(cluster, core, custom, i)
                    mine = f"agentrun {measured * 1000:7.1f} ms"
                except TrialFailed as e:
                    failures.append(str(e))
                    mine = "agentrun  FAILED (below)"
                # The Job's eviction runs either way (the trials stay alternated), and
                # counts only beside an agentrun figure: both sides are the same trials.
                job = job_trial(cluster, core, batch, i)
                if measured is not None:
                    ours.append(measured)
                    jobs.append(job)
                say(f"trial {i + 1:2d}: {mine}   Job {job * 1000:7.1f} ms"
                    + ("" if measured is not None else " (unpaired, not counted)"))
            say(f"\nreal node: Eviction API call returned -> terminal status visible, "
                f"{len(ours)} paired trials (an agentrun and a Job eviction each)")
            latency_table(say, ours, jobs)
            after = system_pods(cluster)
            say(f"\n{RELEASE_NAMESPACE} pods over the trials (restarts; memory working set "
                "before -> after):")
            restarted = 0
            for pod in sorted(set(before) | set(after)):
                earlier, later = before.get(pod) or {}, after.get(pod) or {}
                restarts = int(later.get("restarts") or 0) - int(earlier.get("restarts") or 0)
                restarted += max(restarts, 0)
                mb = [f"{m / 2**20:.0f} MiB" if m else "-" for m in (
                    earlier.get("memory"), later.get("memory"))]
                say(f"  {pod}: {restarts} restarts, ready {later.get('ready')}, "
                    f"{mb[0]} -> {mb[1]}")
            say(f"\nruns that never got going: {len(failures)} of {args.trials}")
            for failure in failures:
                say(f"\n{failure}")
            went = cluster.node_not_ready()
            say(f"\nthe node went NotReady: {len(went)} Events" + "".join(
                f"\n  {line}" for line in went))
            say(f"\nload average at the end {load()} (other processes share these CPUs)")
            ok = not failures and not restarted and not went
    finally:
        shutil.rmtree(root, ignore_errors=True)
    say.write(out)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
