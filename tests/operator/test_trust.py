"""The trust boundary, from a tenant's side: what a run may not do to another run, and
what a replay decision believes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from agentrun_devtools.controlplane import ControlPlane

from agentrun.vocabulary import Phase, Reason, ReplayPhase, ReplayReason
from tests.harness import HAPPY, Operator, System, agent_run, email_then_wait, in_namespace
from tests.replays import create_replay, get_replay, wait_decided


def _pods(system: System, namespace: str, run: str) -> list[str]:
    done = system.kubectl("get", "pods", "-n", namespace, "-l", f"agentrun.dev/run={run}",
                          "-o", "json")
    return [p["metadata"]["name"] for p in json.loads(done.stdout)["items"]]


@pytest.fixture
def strict(crds: ControlPlane, dev_node: object, store_url: str, solo_namespace: str,
           tmp_path: Path) -> Iterator[System]:
    """An operator as the chart runs it: without --allow-scripted-model."""
    operator = Operator(crds, store_url, tmp_path / "op", (f"--namespace={solo_namespace}",),
                        scripted=False).start()
    try:
        yield System(crds, store_url, operator)
    finally:
        operator.stop()


def test_the_scripted_model_is_refused_without_the_flag(
    strict: System, solo_namespace: str
) -> None:
    strict.apply(in_namespace(agent_run("puppet", HAPPY), solo_namespace))
    run = strict.wait_phase(solo_namespace, "puppet", Phase.FAILED, Phase.SUCCEEDED)
    status = run["status"]
    assert (status["phase"], status["reason"]) == (Phase.FAILED, Reason.MODEL_NOT_ALLOWED)
    assert "--allow-scripted-model" in status["message"]
    assert status["toolsExecuted"] == []
    assert _pods(strict, solo_namespace, "puppet") == []
    assert strict.emails("puppet") == []
    # Attempts to spare change nothing: the same spec is refused the same way.
    strict.apply(in_namespace(agent_run("puppet-again", HAPPY, retry={"maxAttempts": 3}),
                              solo_namespace))
    run = strict.wait_phase(solo_namespace, "puppet-again", Phase.FAILED, Phase.SUCCEEDED)
    assert (run["status"]["reason"], run["status"]["attempts"]) == (
        Reason.MODEL_NOT_ALLOWED, 1)


def test_a_second_live_run_on_one_session_is_refused(system: System, namespace: str) -> None:
    system.apply(in_namespace(agent_run("first-turn", email_then_wait(30), trigger="chat",
                                        sessionId="chat-busy"), namespace))
    system.wait_phase(namespace, "first-turn", Phase.RUNNING)
    system.apply(in_namespace(agent_run("second-turn", HAPPY, trigger="chat",
                                        sessionId="chat-busy"), namespace))
    run = system.wait_phase(namespace, "second-turn", Phase.FAILED, Phase.SUCCEEDED)
    status = run["status"]
    assert (status["phase"], status["reason"]) == (Phase.FAILED, Reason.SESSION_BUSY)
    assert "in use by the live run first-turn" in status["message"]
    assert status["toolsExecuted"] == []
    assert _pods(system, namespace, "second-turn") == []
    assert system.emails("second-turn") == []


def test_a_session_belongs_to_its_agent_and_user(system: System, namespace: str) -> None:
    system.apply(in_namespace(agent_run("alices-turn", [{"text": "Hello Alice."}],
                                        trigger="chat", sessionId="chat-own", userId="alice"),
                              namespace))
    assert system.wait_phase(namespace, "alices-turn", Phase.SUCCEEDED, Phase.FAILED)[
        "status"]["phase"] == Phase.SUCCEEDED
    # Alice's next turn continues it...
    system.apply(in_namespace(agent_run("alices-next", [{"text": "Again."}], trigger="chat",
                                        sessionId="chat-own", userId="alice"), namespace))
    assert system.wait_phase(namespace, "alices-next", Phase.SUCCEEDED, Phase.FAILED)[
        "status"]["phase"] == Phase.SUCCEEDED
    # ...Mallory's may not.
    system.apply(in_namespace(agent_run("mallorys-turn", HAPPY, trigger="chat",
                                        sessionId="chat-own", userId="mallory"), namespace))
    run = system.wait_phase(namespace, "mallorys-turn", Phase.FAILED, Phase.SUCCEEDED)
    status = run["status"]
    assert (status["phase"], status["reason"]) == (Phase.FAILED, Reason.SESSION_NOT_OWNED)
    assert "belongs to agent support-agent, user alice" in status["message"]
    assert status["toolsExecuted"] == []
    assert system.emails("mallorys-turn") == []


def test_a_replay_believes_the_store_not_a_patched_status(
    system: System, namespace: str
) -> None:
    system.apply(in_namespace(agent_run("patched", email_then_wait(60)), namespace))
    running = system.wait_phase(namespace, "patched", Phase.RUNNING)
    system.wait_ledger(running["metadata"]["uid"], "send_email")
    system.evict(namespace, "patched-1")
    failed = system.wait_run(namespace, "patched", lambda r: (r.get("status") or {}).get(
        "toolsExecuted") is not None and r["status"].get("phase") == Phase.FAILED)
    assert failed["status"]["toolsExecuted"] == ["send_email"]
    # Someone allowed to write the status claims the run called nothing.
    system.kubectl("patch", "agentrun", "patched", "-n", namespace, "--subresource=status",
                   "--type=merge", "-p", json.dumps({"status": {"toolsExecuted": []}}))
    assert system.run(namespace, "patched")["status"]["toolsExecuted"] == []
    create_replay(system, namespace, "patched-again", "patched")
    replay = wait_decided(system, namespace, "patched-again")
    status = replay["status"]
    assert (status["phase"], status["reason"]) == (ReplayPhase.REFUSED,
                                                   ReplayReason.TOOLS_EXECUTED)
    assert "send_email" in status["message"]
    assert get_replay(system, namespace, "patched-again")["status"]["toolsExecuted"] == [
        "send_email"]
