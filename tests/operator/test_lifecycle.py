"""AgentRun lifecycle end to end: real control plane, real Postgres, the development node,
real runner processes on the scripted model, the operator as a process."""

from __future__ import annotations

from agentrun.vocabulary import Condition, Phase, Reason
from tests.harness import HAPPY, System, agent_run, email_then_wait, in_namespace


def conditions(run: dict) -> dict[str, dict]:
    return {c["type"]: c for c in run["status"].get("conditions") or []}


def test_happy_path(system: System, namespace: str) -> None:
    system.apply(in_namespace(agent_run("triage-42", HAPPY), namespace))
    run = system.wait_phase(namespace, "triage-42", Phase.SUCCEEDED, Phase.FAILED)
    status = run["status"]
    assert status["phase"] == Phase.SUCCEEDED, status
    assert status["toolsExecuted"] == ["read_message", "send_email", "update_crm"]
    assert status["podName"] == "triage-42-1"
    assert status["attempts"] == 1
    assert status["inputDigest"].startswith("sha256:")
    assert conditions(run)[Condition.SUCCEEDED]["status"] == "True"
    assert conditions(run)[Condition.TOOLS_EXECUTED]["status"] == "True"
    assert len(system.emails("triage-42")) == 1
    pod = system.get("pod", namespace, "triage-42-1")
    assert pod is not None
    assert pod["metadata"]["labels"]["agentrun.dev/run"] == "triage-42"
    assert pod["metadata"]["ownerReferences"][0]["uid"] == run["metadata"]["uid"]
    assert pod["spec"]["automountServiceAccountToken"] is False


def test_eviction_while_send_email_waits(system: System, namespace: str) -> None:
    system.apply(in_namespace(agent_run("evict-1", email_then_wait(60)), namespace))
    uid = system.wait_phase(namespace, "evict-1", Phase.RUNNING)["metadata"]["uid"]
    system.wait_ledger(uid, "send_email")
    system.evict(namespace, "evict-1-1")
    run = system.wait_phase(namespace, "evict-1", Phase.FAILED, Phase.SUCCEEDED)
    assert run["status"]["reason"] == Reason.EVICTED, run["status"]
    assert run["status"]["toolsExecuted"] == ["send_email"]
    assert conditions(run)[Condition.TOOLS_EXECUTED]["status"] == "True"
    assert len(system.emails("evict-1")) == 1
