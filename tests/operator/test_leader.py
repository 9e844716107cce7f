"""Two operator replicas, one active (the Lease holder), one standing by: the active one
is SIGKILLed mid-run, the standby takes over, and no run is doubled, lost or overwritten."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from agentrun_devtools.controlplane import ControlPlane
from agentrun_devtools.processes import wait_for

from agentrun.vocabulary import Phase, Reason
from tests.harness import HAPPY, Operator, System, agent_run, email_then_wait, in_namespace
from tests.runner_world import StoreAPIProcess

LEASE_SECONDS = 6


def _holder(system: System, namespace: str) -> str:
    done = system.kubectl("get", "lease", "agentrun-operator", "-n", namespace, "-o", "json",
                          check=False)
    if done.returncode:
        return ""
    return str((json.loads(done.stdout).get("spec") or {}).get("holderIdentity") or "")


@pytest.fixture
def pair(crds: ControlPlane, dev_node: object, store_url: str, solo_namespace: str,
         tmp_path: Path) -> Iterator[tuple[System, Operator, Operator]]:
    """Two replicas as the chart runs them: the store API on its own (runner pods keep
    reaching it whichever replica dies), one Lease."""
    api = StoreAPIProcess(crds, store_url, tmp_path / "store-api.log").wait_ready()
    args = (f"--namespace={solo_namespace}", f"--leader-election-namespace={solo_namespace}",
            f"--leader-election-seconds={LEASE_SECONDS}", "--check-interval=30",
            "--store-api-listen=", f"--store-api-url={api.url}")
    first = Operator(crds, store_url, tmp_path / "a", args).start()
    second = Operator(crds, store_url, tmp_path / "b", args).start()
    try:
        yield System(crds, store_url, first), first, second
    finally:
        first.stop()
        second.stop()
        api.stop()


def _holds(operator: Operator, holder: str) -> bool:
    return operator.child is not None and holder.endswith(f"-{operator.child.pid}")


def _pods(system: System, namespace: str, run: str) -> list[str]:
    done = system.kubectl("get", "pods", "-n", namespace, "-l", f"agentrun.dev/run={run}",
                          "-o", "json")
    return sorted(p["metadata"]["name"] for p in json.loads(done.stdout)["items"])


def test_the_standby_takes_over_when_the_active_operator_is_killed(
    pair: tuple[System, Operator, Operator], solo_namespace: str
) -> None:
    system, first, second = pair
    ns = solo_namespace
    wait_for(lambda: bool(_holder(system, ns)), timeout=30, what="a leader")
    holder = _holder(system, ns)
    active, standby = (first, second) if _holds(first, holder) else (second, first)
    assert _holds(active, holder), holder
    # Only the leader acts: the standby logs no reconcile.
    system.apply(in_namespace(agent_run("steady", HAPPY), ns))
    assert system.wait_phase(ns, "steady", Phase.SUCCEEDED, Phase.FAILED)["status"][
        "phase"] == Phase.SUCCEEDED
    assert "event=pod-created" in active.log()
    assert "event=pod-created" not in standby.log()

    # Mid-run: one run waiting in send_email, one still thinking, one not yet started.
    system.apply(in_namespace(agent_run("mailing", email_then_wait(8)), ns))
    system.apply(in_namespace(agent_run("thinking", [{"sleep": 8}, *HAPPY]), ns))
    system.wait_phase(ns, "mailing", Phase.RUNNING)
    system.wait_phase(ns, "thinking", Phase.RUNNING)
    active.kill()
    system.apply(in_namespace(agent_run("after", HAPPY), ns))

    wait_for(lambda: _holds(standby, _holder(system, ns)), timeout=LEASE_SECONDS * 4,
             what="the standby holding the lease")
    for name in ("mailing", "thinking", "after"):
        run = system.wait_phase(ns, name, Phase.SUCCEEDED, Phase.FAILED, timeout=120)
        assert run["status"]["phase"] == Phase.SUCCEEDED, (name, run["status"])
        assert run["status"]["attempts"] == 1, (name, run["status"])
        assert _pods(system, ns, name) == [f"{name}-1"], name
    assert len(system.emails("mailing")) == 1
    assert len(system.emails("thinking")) == 1
    assert system.run(ns, "thinking")["status"]["toolsExecuted"] == [
        "read_message", "send_email", "update_crm"]
    assert "event=leading" in standby.log()
    assert system.run(ns, "after")["status"]["reason"] == Reason.SUCCEEDED
