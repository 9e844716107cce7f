"""What the operator leaves on objects, and says at start-up: no kopf bookkeeping on
AgentRuns, runner pods cleaned up after their time to live, and a wrong credential named
in one line before any replay is refused."""

from __future__ import annotations

import json
from pathlib import Path

from agentrun_devtools.controlplane import ControlPlane
from agentrun_devtools.processes import wait_for

from agentrun.vocabulary import Phase
from tests.harness import HAPPY, Operator, System, agent_run, in_namespace


def _pods(system: System, namespace: str, run: str) -> list[str]:
    done = system.kubectl("get", "pods", "-n", namespace, "-l", f"agentrun.dev/run={run}",
                          "-o", "json")
    return [p["metadata"]["name"] for p in json.loads(done.stdout)["items"]]


def test_runs_carry_no_kopf_bookkeeping_and_pods_go_after_their_ttl(
    crds: ControlPlane, dev_node: object, store_url: str, solo_namespace: str, tmp_path: Path
) -> None:
    operator = Operator(crds, store_url, tmp_path / "op", (
        f"--namespace={solo_namespace}", "--pod-ttl-after-finished=2")).start()
    system = System(crds, store_url, operator)
    try:
        system.apply(in_namespace(agent_run("tidy", HAPPY), solo_namespace))
        run = system.wait_phase(solo_namespace, "tidy", Phase.SUCCEEDED, Phase.FAILED)
        assert run["status"]["phase"] == Phase.SUCCEEDED
        annotations = run["metadata"].get("annotations") or {}
        assert not [k for k in annotations if k.startswith("kopf.zalando.org")], annotations
        assert run["metadata"]["finalizers"] == ["agentrun.dev/finalizer"]
        # The pod stays for its time to live, then goes; the run and its record stay.
        wait_for(lambda: _pods(system, solo_namespace, "tidy") == [], timeout=30,
                 what="the settled run's pod deleted after its TTL")
        assert system.run(solo_namespace, "tidy")["status"]["phase"] == Phase.SUCCEEDED
        assert len(system.emails("tidy")) == 1
    finally:
        operator.stop()


def test_a_wrong_credential_is_named_at_start_up(
    crds: ControlPlane, dev_node: object, store_url: str, solo_namespace: str, tmp_path: Path
) -> None:
    # The admin's kubeconfig: allowed everything, except what the replayOf policy keeps
    # for the operator.
    operator = Operator(crds, store_url, tmp_path / "op", (f"--namespace={solo_namespace}",),
                        kubeconfig=crds.kubeconfig).start()
    try:
        wait_for(lambda: "event=startup-check" in operator.log(), timeout=30,
                 what="the start-up check")
        lines = [ln for ln in operator.log().splitlines() if "startup-check-failed" in ln]
        assert len(lines) == 1, operator.log()[-3000:]
        assert "create replay runs" in lines[0] and f"namespace={solo_namespace}" in lines[0]
        assert "spec.replayOf is set only by the agentrun operator" in lines[0]
        assert "group agentrun:operators" in lines[0]
    finally:
        operator.stop()
