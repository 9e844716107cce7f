"""Resume: how soon an evicted run goes on, and what resuming saves over starting over.

    .venv/bin/python bench/resume.py [--trials 20] [--out -]

Starts the real control plane, the development node, a throwaway Postgres store and the
operator. Each trial: an AgentRun with `retry: {maxAttempts: 2, resume: true}` whose script
is read_message, send_email, a model that thinks for THINK seconds, update_crm, an answer;
once send_email has answered, the Eviction API is called on its runner pod, and we time

- eviction -> resumed attempt Running: from the eviction call returning until the run's
  status shows attempt 2 (resumedAttempts [2]) in phase Running;
- the resumed attempt's remaining time: from the eviction until Succeeded;

beside the same script started over (a fresh run of the whole script, as a forced replay
would): from its creation until Succeeded. Both clocks start the same way: when the
kubectl process that made the request (the eviction, the apply) has returned. The
figures are p50/p95, and the ratio of the resumed attempt's remaining time to a restart's.
Polling every 10 ms through the API. Each resumed run's outbox is counted at the end: one
email and one CRM update per run, or the bench fails.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
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
from kubernetes import client, config  # noqa: E402

from agentrun import store  # noqa: E402
from agentrun.vocabulary import GROUP, RUN_PLURAL, VERSION  # noqa: E402
from tests.cluster_fixtures import apply_crds  # noqa: E402
from tests.harness import Operator, System, agent_run, in_namespace  # noqa: E402

NAMESPACE = "bench-resume"
THINK = 3


def script() -> list[dict[str, Any]]:
    return [{"call": "read_message"},
            {"call": "send_email", "args": {"to": "c@example.com", "body": "Refund"}},
            {"sleep": THINK},
            {"call": "update_crm", "args": {"customer": "42", "status": "refunded"}},
            {"text": "Done."}]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", type=int, default=20)
    p.add_argument("--out", help="results file (default ~/.cache/agentrun/bench/"
                             "resume-<time>.txt; '-' for stdout only)")
    args = p.parse_args(argv)
    out = results_file("resume", args.out)
    work = Path(tempfile.mkdtemp(prefix="agentrun-bench-resume-"))
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
        api = client.CustomObjectsApi(config.new_client_from_config(str(plane.kubeconfig)))

        def status(name: str) -> dict[str, Any]:
            found = api.get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, RUN_PLURAL, name)
            return dict(found.get("status") or {})

        running: list[float] = []
        remaining: list[float] = []
        restart: list[float] = []
        for i in range(args.trials):
            name = f"resumed-{i}"
            system.apply(in_namespace(agent_run(name, script(), retry={
                "maxAttempts": 2, "resume": True}), NAMESPACE))
            system.wait_phase(NAMESPACE, name, "Running")
            uid = system.run(NAMESPACE, name)["metadata"]["uid"]
            wait_for(lambda u=uid: any(e.tool == "send_email" and e.finished_at is not None
                                       for e in system.store(lambda en: store.ledger(en, u))),
                     timeout=60, what="send_email answered", interval=0.02)
            system.evict(NAMESPACE, f"{name}-1")
            evicted = time.monotonic()
            seen_running = False
            while True:
                s = status(name)
                if s.get("attempts") == 2 and s.get("phase") == "Running" and not seen_running:
                    seen_running = True
                    running.append(time.monotonic() - evicted)
                if s.get("phase") in ("Succeeded", "Failed"):
                    remaining.append(time.monotonic() - evicted)
                    assert s["phase"] == "Succeeded" and s.get("resumedAttempts") == [2], s
                    break
                time.sleep(0.01)
            fresh = f"restarted-{i}"
            system.apply(in_namespace(agent_run(fresh, script()), NAMESPACE))
            began = time.monotonic()  # as `evicted`: once the kubectl process returned
            while (s := status(fresh)).get("phase") not in ("Succeeded", "Failed"):
                time.sleep(0.01)
            restart.append(time.monotonic() - began)
            # Timed to the same end as the resumed run's: Succeeded, never a failure.
            assert s["phase"] == "Succeeded", s
        # What the line below says: the resumed attempt repeated no tool.
        effects = Counter((r.run_name, r.tool) for r in system.store(lambda e: store.outbox(e))
                          if r.run_name and r.run_name.startswith("resumed-")
                          and r.tool in ("send_email", "update_crm"))
        expected = {(f"resumed-{i}", tool): 1 for i in range(args.trials)
                    for tool in ("send_email", "update_crm")}
        assert effects == expected, f"side effects per resumed run: {dict(effects)}"
        load = os.getloadavg()
        lines = [
            f"bench/resume.py, {args.trials} trials, think {THINK}s, "
            f"{datetime.datetime.now(datetime.UTC):%Y-%m-%dT%H:%MZ}, "
            f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}",
            "",
            "| | p50 | p95 |",
            "|---|---|---|",
            f"| eviction -> resumed attempt Running | {pct(running, .5) * 1000:.0f} ms | "
            f"{pct(running, .95) * 1000:.0f} ms |",
            f"| resumed attempt, eviction -> Succeeded | {pct(remaining, .5):.2f} s | "
            f"{pct(remaining, .95):.2f} s |",
            f"| the same script started over, created -> Succeeded | {pct(restart, .5):.2f} s |"
            f" {pct(restart, .95):.2f} s |",
            f"| ratio resumed / started over | {pct(remaining, .5) / pct(restart, .5):.2f} | "
            f"{pct(remaining, .95) / pct(restart, .95):.2f} |",
            "",
            f"mean eviction -> Running {statistics.mean(running) * 1000:.0f} ms; the resumed "
            "attempt repeats no tool (one email, one CRM update per run, asserted).",
        ]
        text = "\n".join(lines) + "\n"
        print(text)
        write_results(text, out)
    finally:
        if operator is not None:
            operator.stop()
        if node is not None:
            node.stop()
        plane.stop()
        postgres.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
