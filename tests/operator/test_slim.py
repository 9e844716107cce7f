"""The caches' copies: what they keep, and that two objects decoded apart share their
repeated strings (controller.compact)."""

from __future__ import annotations

import json
from typing import Any

from agentrun_operator.controller import SHARED_UP_TO, compact, slim_pod, slim_run


def decoded_run(name: str) -> dict[str, Any]:
    """An AgentRun as its own JSON document decodes (each one its own strings)."""
    return json.loads(json.dumps({
        "apiVersion": "agentrun.dev/v1alpha1", "kind": "AgentRun",
        "metadata": {"name": name, "namespace": "tenant-a", "uid": f"uid-{name}",
                     "resourceVersion": "7", "managedFields": [{"manager": "kubectl"}]},
        "spec": {"agent": "support-agent", "input": {"text": "hi"}},
        "status": {"phase": "Pending", "reason": "PodCreated", "inputDigest": "d",
                   "message": f"Created runner pod {name}-1 (attempt 1). " + "x" * SHARED_UP_TO,
                   "conditions": [{"type": "Ready", "status": "False",
                                   "reason": "PodCreated"}]}}))


def test_two_runs_decoded_apart_share_keys_and_short_values_but_not_long_ones() -> None:
    a, b = slim_run(decoded_run("a")), slim_run(decoded_run("b"))
    key_a = next(k for k in a["status"] if k == "phase")
    key_b = next(k for k in b["status"] if k == "phase")
    assert key_a is key_b
    assert a["metadata"]["namespace"] is b["metadata"]["namespace"]
    assert a["status"]["conditions"][0]["reason"] is b["status"]["conditions"][0]["reason"]
    # A long string is left alone: a message is mostly the run's own, and sharing it would
    # only cost the interpreter's table.
    long_a, long_b = (compact(json.loads(json.dumps({"m": "x" * (SHARED_UP_TO + 1)})))["m"]
                      for _ in range(2))
    assert long_a == long_b and long_a is not long_b


def test_a_slim_run_is_what_it_was_without_what_no_reconcile_reads() -> None:
    run = decoded_run("a")
    slim = slim_run(run)
    assert "managedFields" not in slim["metadata"]
    assert "input" not in slim["spec"]  # launched (inputDigest): the input is snapshotted
    assert slim["status"] == run["status"]
    assert slim["metadata"]["uid"] == "uid-a"


def test_the_cached_copy_does_not_change_with_the_object_it_was_made_from() -> None:
    run = decoded_run("a")
    slim = slim_run(run)
    run["status"]["conditions"][0]["status"] = "True"
    run["status"]["phase"] = "Running"
    assert slim["status"]["conditions"][0]["status"] == "False"
    assert slim["status"]["phase"] == "Pending"


def test_compact_keeps_every_json_value_as_it_was() -> None:
    value = {"a": [1, 2.5, None, True, "s", {"b": "y" * (SHARED_UP_TO + 1)}], "c": {}}
    assert compact(value) == value


def test_a_slim_pod_keeps_its_gates_and_status() -> None:
    pod = json.loads(json.dumps({
        "metadata": {"name": "a-1", "namespace": "tenant-a", "labels": {"agentrun.dev/run": "a"}},
        "spec": {"nodeName": None, "schedulingGates": [{"name": "kueue.x-k8s.io/admission"}],
                 "containers": [{"name": "runner"}]},
        "status": {"phase": "Pending"}}))
    assert slim_pod(pod) == {
        "metadata": {"name": "a-1", "namespace": "tenant-a", "labels": {"agentrun.dev/run": "a"}},
        "spec": {"nodeName": None, "schedulingGates": [{"name": "kueue.x-k8s.io/admission"}]},
        "status": {"phase": "Pending"}}
