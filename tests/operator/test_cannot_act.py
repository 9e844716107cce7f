"""When the operator cannot act, the run says so (status, Events), soon, and nothing is
spent or lost: a pod create refused (quota, invalid), a pod that cannot start, a runner
that cannot reach the store."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from agentrun_devtools.controlplane import ControlPlane

from agentrun.vocabulary import Phase, Reason
from tests.harness import HAPPY, Operator, System, agent_run, in_namespace


def _events(system: System, namespace: str, name: str) -> list[dict[str, str]]:
    done = system.kubectl("get", "events", "-n", namespace, "--field-selector",
                          f"involvedObject.name={name}", "-o", "json")
    return [{"reason": e.get("reason", ""), "message": e.get("message", ""),
             "type": e.get("type", ""), "component": (e.get("source") or {}).get("component",
                                                                                 "")}
            for e in json.loads(done.stdout)["items"]]


def test_a_pod_quota_keeps_the_run_pending_with_the_reason_then_it_runs(
    system: System, namespace: str
) -> None:
    system.apply({"apiVersion": "v1", "kind": "ResourceQuota",
                  "metadata": {"name": "no-pods", "namespace": namespace},
                  "spec": {"hard": {"pods": "0"}}})
    system.apply(in_namespace(agent_run("quota", HAPPY, retry={"maxAttempts": 2}), namespace))
    run = system.wait_run(namespace, "quota", lambda r: (r.get("status") or {}).get(
        "reason") == Reason.POD_CREATE_FAILED, timeout=20)
    status = run["status"]
    assert status["phase"] == Phase.PENDING
    assert "exceeded quota: no-pods" in status["message"]
    assert "no attempt is used up" in status["message"]
    assert any(e["reason"] == Reason.POD_CREATE_FAILED and e["type"] == "Warning" and
               e["component"] == "agentrun-operator" and "exceeded quota" in e["message"]
               for e in _events(system, namespace, "quota"))
    system.kubectl("delete", "resourcequota", "no-pods", "-n", namespace)
    run = system.wait_phase(namespace, "quota", Phase.SUCCEEDED, Phase.FAILED, timeout=120)
    assert run["status"]["phase"] == Phase.SUCCEEDED, run["status"]
    assert run["status"]["attempts"] == 1  # the refusals spent no attempt
    assert len(system.emails("quota")) == 1


def test_an_invalid_pod_fails_the_run_at_once_with_the_servers_message(
    system: System, namespace: str
) -> None:
    # The AgentRun is valid; the pod is not (an extended resource must be whole).
    manifest = agent_run("invalid", HAPPY, resources={"limits": {"example.com/widget": "0.5"}})
    system.apply(in_namespace(manifest, namespace))
    run = system.wait_phase(namespace, "invalid", Phase.FAILED, Phase.SUCCEEDED, timeout=20)
    status = run["status"]
    assert (status["reason"], status["toolsExecuted"]) == (Reason.POD_INVALID, [])
    assert "must be an integer" in status["message"]
    assert status["attempts"] == 1


def test_a_pod_whose_secret_is_missing_says_so_within_seconds(
    system: System, namespace: str
) -> None:
    manifest = agent_run("no-secret", HAPPY, env=[{"name": "MODEL_KEY", "valueFrom": {
        "secretKeyRef": {"name": "model-key", "key": "key"}}}])
    system.apply(in_namespace(manifest, namespace))
    run = system.wait_run(namespace, "no-secret", lambda r: (r.get("status") or {}).get(
        "reason") == Reason.POD_WAITING, timeout=10)
    assert run["status"]["phase"] == Phase.PENDING
    assert "CreateContainerConfigError" in run["status"]["message"]
    assert 'secret "model-key" not found' in run["status"]["message"]
    # Fixed by its owner, it runs.
    system.kubectl("create", "secret", "generic", "model-key", "-n", namespace,
                   "--from-literal=key=k")
    run = system.wait_phase(namespace, "no-secret", Phase.SUCCEEDED, Phase.FAILED, timeout=60)
    assert run["status"]["phase"] == Phase.SUCCEEDED, run["status"]


@pytest.fixture
def cut_off(crds: ControlPlane, dev_node: object, store_url: str, solo_namespace: str,
            tmp_path: Path) -> Iterator[System]:
    """An operator that tells runner pods a store API address where nothing listens."""
    operator = Operator(crds, store_url, tmp_path / "op", (
        f"--namespace={solo_namespace}", "--store-api-url=https://127.0.0.1:9")).start()
    try:
        yield System(crds, store_url, operator)
    finally:
        operator.stop()


def test_a_runner_that_cannot_reach_the_store_says_so(
    cut_off: System, solo_namespace: str
) -> None:
    cut_off.apply(in_namespace(agent_run("cut-off", HAPPY), solo_namespace))
    run = cut_off.wait_phase(solo_namespace, "cut-off", Phase.FAILED, Phase.SUCCEEDED,
                             timeout=30)
    status = run["status"]
    assert status["reason"] == Reason.AGENT_ERROR
    assert "store API" in status["message"] and "127.0.0.1:9" in status["message"]
    assert status["toolsExecuted"] == []
    assert cut_off.emails("cut-off") == []
