"""A run's outcome and its approvals: what live usage costs in status writes, and how soon an
approved call starts.

    .venv/bin/python bench/outcome.py [--runs 10] [--approvals 20] [--out -]

Starts the real control plane, the development node, a throwaway Postgres store and the
operator (the way the tests do). Two measurements:

- **Status writes per run.** RUNS runs of a script whose model makes one call every
  STEP seconds for about LIFE seconds (each call reports its usage), beside RUNS runs of a
  script that answers at once (no live usage to write: the writes a run costs anyway). A
  watch opened before the runs counts every change of each run's status (resourceVersion)
  and which of them changed nothing but status.usage, the same way for both kinds, until
  it has seen each run's latest resourceVersion. Goal: usage adds at most one write per
  5 s of a run's life.
- **Approval -> approved call started.** APPROVALS runs whose one call needs an approval,
  each approved as soon as it waits (an AgentRunApproval, as `kubectl agentrun approve`
  creates it): from the approval's creation until the call's ledger row in the resumed
  attempt (started_at, the store's clock, on this machine). That is the resume path's cost:
  the operator's verdict, the run's next attempt, its pod, a runner starting, ADK resuming
  the invocation. p50/p95.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile
import threading
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for extra in (ROOT / "devtools", ROOT):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

from agentrun_devtools.cluster import start_dev_node  # noqa: E402
from agentrun_devtools.controlplane import ControlPlane  # noqa: E402
from agentrun_devtools.postgres import Postgres  # noqa: E402
from agentrun_devtools.processes import wait_for  # noqa: E402
from agentrun_devtools.stats import pct, results_file, write_results  # noqa: E402
from kubernetes import client, config, watch  # noqa: E402

from agentrun import store  # noqa: E402
from agentrun.vocabulary import GROUP, RUN_PLURAL, VERSION  # noqa: E402
from tests.cluster_fixtures import apply_crds  # noqa: E402
from tests.harness import Operator, System, agent_run, in_namespace  # noqa: E402

NAMESPACE = "bench-outcome"
STEP = 2.0
LIFE = 30.0


def living() -> list[dict[str, Any]]:
    """A model call every STEP seconds for about LIFE seconds, then the answer."""
    steps: list[dict[str, Any]] = []
    for _ in range(int(LIFE / STEP)):
        steps += [{"call": "read_message", "args": {}}, {"sleep": STEP}]
    return [*steps, {"text": "done"}]


class Writes:
    """Every status change of the namespace's runs, counted per run as it happens."""

    def __init__(self, api: Any) -> None:
        self.api = api
        self.total: dict[str, int] = defaultdict(int)
        self.usage_only: dict[str, int] = defaultdict(int)
        self.last: dict[str, dict[str, Any]] = {}
        self.seen: dict[str, str] = {}  # each run's resourceVersion last seen
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Writes:
        self.thread.start()
        return self

    def _run(self) -> None:
        w = watch.Watch()
        while not self.stop.is_set():
            # Each stream goes on from where the last one ended: a change between two
            # streams is seen as itself, not folded into the next one's listing.
            since = {"resource_version": w.resource_version} if w.resource_version else {}
            for event in w.stream(self.api.list_namespaced_custom_object, GROUP, VERSION,
                                  NAMESPACE, RUN_PLURAL, timeout_seconds=5, **since):
                obj = event["object"]
                name = obj["metadata"]["name"]
                status = obj.get("status") or {}
                before = self.last.get(name)
                if status and status != before:
                    self.total[name] += 1
                    if before is not None and {k: v for k, v in status.items()
                                               if k not in ("usage", "conditions")} == {
                            k: v for k, v in before.items()
                            if k not in ("usage", "conditions")} and \
                            status.get("usage") != before.get("usage"):
                        self.usage_only[name] += 1
                self.last[name] = status
                self.seen[name] = obj["metadata"]["resourceVersion"]
                if self.stop.is_set():
                    return

    def caught_up(self, names: list[str]) -> bool:
        """Whether the watch has seen each run as the API server has it now."""
        return all(self.seen.get(name) == self.api.get_namespaced_custom_object(
            GROUP, VERSION, NAMESPACE, RUN_PLURAL, name)["metadata"]["resourceVersion"]
            for name in names)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--approvals", type=int, default=20)
    p.add_argument("--out", help="results file (default ~/.cache/agentrun/bench/"
                             "outcome-<time>.txt; '-' for stdout only)")
    args = p.parse_args(argv)
    out = results_file("outcome", args.out)
    work = Path(tempfile.mkdtemp(prefix="agentrun-bench-outcome-"))
    postgres = Postgres().start()
    plane = ControlPlane(work / "cp").start()
    node = operator = None
    try:
        apply_crds(plane)
        node = start_dev_node(plane, work / "pods")
        url = postgres.create_database("bench")
        operator = Operator(plane, url, work / "op").start()
        system = System(plane, url, operator)
        plane.kubectl("create", "namespace", NAMESPACE)
        plane.kubectl("create", "rolebinding", "approvers", "-n", NAMESPACE,
                      "--clusterrole=agentrun-approver", "--user=ann")
        api = client.CustomObjectsApi(config.new_client_from_config(str(plane.kubeconfig)))
        writes = Writes(api).start()

        def settle(name: str) -> dict[str, Any]:
            return system.wait_phase(NAMESPACE, name, "Succeeded", "Failed", timeout=300)

        lives: dict[str, float] = {}
        for kind, make in (("quick", lambda: [{"text": "done"}]), ("living", living)):
            for i in range(args.runs):
                system.apply(in_namespace(agent_run(f"{kind}-{i}", make()), NAMESPACE))
            for i in range(args.runs):
                run = settle(f"{kind}-{i}")["status"]
                started = datetime.datetime.fromisoformat(run["startedAt"].replace("Z", "+00:00"))
                ended = datetime.datetime.fromisoformat(run["finishedAt"].replace("Z", "+00:00"))
                lives[f"{kind}-{i}"] = (ended - started).total_seconds()
        # Every write of these runs counted: the watch is at each run's resourceVersion.
        wait_for(lambda: writes.caught_up(list(lives)), timeout=60,
                 what="the watch at every run's last write", interval=0.2)
        writes.stop.set()

        waits: list[float] = []
        required = [{"name": "charge_card", "effect": "Effectful", "approval": "Required"}]
        script = [{"call": "charge_card", "args": {"customer": "42", "amount": 1}},
                  {"text": "Charged."}]
        for i in range(args.approvals):
            name = f"pay-{i}"
            system.apply(in_namespace(agent_run(name, script, tools=required), NAMESPACE))
            pending = system.wait_run(NAMESPACE, name, lambda r: (r.get("status") or {}).get(
                "phase") == "Waiting", timeout=120)["status"]["pendingApproval"]
            approval = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "AgentRunApproval",
                        "metadata": {"name": f"{name}-call-1", "namespace": NAMESPACE},
                        "spec": {"runName": name, "seq": pending["seq"],
                                 "argsDigest": pending["argsDigest"], "decision": "Approve",
                                 "approver": "ann"}}
            asked = datetime.datetime.now(datetime.UTC)
            system.kubectl("create", "-f", "-", input=json.dumps(approval), as_user="ann")
            uid = system.run(NAMESPACE, name)["metadata"]["uid"]

            def started(u: str = uid) -> bool:
                return any(e.tool == "charge_card" and e.attempt == 2
                           for e in system.store(lambda en: store.ledger(en, u)))

            wait_for(started, timeout=120, what=f"{name}'s approved call", interval=0.02)
            row = next(e for e in system.store(lambda en, u=uid: store.ledger(en, u))
                       if e.tool == "charge_card" and e.attempt == 2)
            waits.append((row.started_at - asked).total_seconds())
            settle(name)

        load = os.getloadavg()
        quick = [writes.total[f"quick-{i}"] for i in range(args.runs)]
        alive = [writes.total[f"living-{i}"] for i in range(args.runs)]
        usage_only = [writes.usage_only[f"living-{i}"] for i in range(args.runs)]
        # Counted as for the living runs, not assumed to be none.
        quick_usage_only = [writes.usage_only[f"quick-{i}"] for i in range(args.runs)]
        per_5s = [usage_only[i] / (lives[f"living-{i}"] / 5) for i in range(args.runs)]
        lines = [
            f"bench/outcome.py, {datetime.datetime.now(datetime.UTC):%Y-%m-%dT%H:%MZ}, "
            f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}",
            "",
            f"Status writes per run ({args.runs} runs each; a living run makes a model call "
            f"every {STEP:g} s for ~{LIFE:g} s):",
            "",
            "| | writes per run (mean) | of which usage only | run life (mean) |",
            "|---|---|---|---|",
            f"| answers at once | {sum(quick) / len(quick):.1f} | "
            f"{sum(quick_usage_only) / len(quick_usage_only):.1f} | "
            f"{sum(lives[f'quick-{i}'] for i in range(args.runs)) / args.runs:.1f} s |",
            f"| living | {sum(alive) / len(alive):.1f} | "
            f"{sum(usage_only) / len(usage_only):.1f} | "
            f"{sum(lives[f'living-{i}'] for i in range(args.runs)) / args.runs:.1f} s |",
            "",
            f"usage-only writes per 5 s of a run's life: max {max(per_5s):.2f}, mean "
            f"{sum(per_5s) / len(per_5s):.2f} (goal: at most 1)",
            "",
            f"Approval -> approved call started ({args.approvals} approvals): p50 "
            f"{pct(waits, .5):.2f} s, p95 {pct(waits, .95):.2f} s, max {max(waits):.2f} s",
        ]
        text = "\n".join(lines) + "\n"
        print(text)
        write_results(text, out)
        return 0
    finally:
        if operator is not None:
            operator.stop()
        if node is not None:
            node.stop()
        plane.stop()
        postgres.stop()


if __name__ == "__main__":
    sys.exit(main())
