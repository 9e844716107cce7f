"""cli-utils' kstatus (through tests/kstatus.py, which runs it) on the cases its rules
distinguish, one row per rule and per ordering between rules: what tests/kstatus.py's
docstring says cli-utils does is what it does."""

from __future__ import annotations

from typing import Any

import pytest

from tests import kstatus


def cr(status: dict[str, Any] | None = None, generation: int | None = 3,
       **metadata: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "x", "namespace": "ns", **metadata}
    if generation is not None:
        meta["generation"] = generation
    obj: dict[str, Any] = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": meta}
    if status is not None:
        obj["status"] = status
    return obj


def cond(kind: str, status: str, reason: str = "Why", message: str = "said") -> dict[str, str]:
    return {"type": kind, "status": status, "reason": reason, "message": message}


CASES = [
    ("no status at all", cr(), kstatus.CURRENT, "Resource is current"),
    ("empty status", cr({}), kstatus.CURRENT, "Resource is current"),
    ("conditions that kstatus does not read", cr({"conditions": [cond("Available", "False")]}),
     kstatus.CURRENT, "Resource is current"),
    ("being deleted, whatever the conditions",
     cr({"conditions": [cond("Stalled", "True")]}, deletionTimestamp="2026-01-01T00:00:00Z"),
     kstatus.TERMINATING, "Resource scheduled for deletion"),
    ("generation not observed yet", cr({"observedGeneration": 2,
                                        "conditions": [cond("Ready", "True")]}),
     kstatus.IN_PROGRESS, "Widget generation is 3, but latest observed generation is 2"),
    ("observed generation ahead also counts", cr({"observedGeneration": 4}),
     kstatus.IN_PROGRESS, "Widget generation is 3, but latest observed generation is 4"),
    ("no observedGeneration: no evidence", cr({"conditions": [cond("Ready", "True")]}),
     kstatus.CURRENT, "Resource is Ready"),
    ("no generation: observedGeneration not compared",
     cr({"observedGeneration": 1}, generation=None), kstatus.CURRENT, "Resource is current"),
    ("Reconciling True", cr({"observedGeneration": 3, "conditions": [
        cond("Reconciling", "True", "Progressing", "working")]}),
     kstatus.IN_PROGRESS, "working"),
    ("Reconciling False says nothing", cr({"conditions": [cond("Reconciling", "False")]}),
     kstatus.CURRENT, "Resource is current"),
    ("Stalled True", cr({"conditions": [cond("Stalled", "True", "Broke", "it broke")]}),
     kstatus.FAILED, "it broke"),
    ("Stalled True beats Ready True", cr({"conditions": [
        cond("Ready", "True"), cond("Stalled", "True", "Broke", "it broke")]}),
     kstatus.FAILED, "it broke"),
    ("Reconciling and Stalled both True: the first listed wins", cr({"conditions": [
        cond("Stalled", "True", "Broke", "it broke"), cond("Reconciling", "True", "R", "r")]}),
     kstatus.FAILED, "it broke"),
    ("Reconciling listed first wins", cr({"conditions": [
        cond("Reconciling", "True", "R", "r"), cond("Stalled", "True", "Broke", "it broke")]}),
     kstatus.IN_PROGRESS, "r"),
    ("Ready False", cr({"conditions": [cond("Ready", "False", "Waiting", "not yet")]}),
     kstatus.IN_PROGRESS, "not yet"),
    ("Ready Unknown", cr({"conditions": [cond("Ready", "Unknown", "Waiting", "who knows")]}),
     kstatus.IN_PROGRESS, "who knows"),
    ("Ready with a status outside True/False/Unknown is passed over", cr({"conditions": [
        cond("Ready", "Maybe"), cond("Ready", "True")]}), kstatus.CURRENT, "Resource is Ready"),
    ("Ready False and Stalled False: not failed, in progress", cr({"conditions": [
        cond("Ready", "False", "Failing", "f"), cond("Stalled", "False")]}),
     kstatus.IN_PROGRESS, "f"),
]


@pytest.mark.parametrize(("obj", "status", "message"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_compute(obj: dict[str, Any], status: str, message: str) -> None:
    result = kstatus.compute(obj)
    assert (result.status, result.message) == (status, message)


def test_in_progress_and_failed_carry_the_condition_kstatus_would_add() -> None:
    progress = kstatus.compute(cr({"observedGeneration": 2}))
    assert progress.conditions == [kstatus.Condition(
        "Reconciling", "True", "LatestGenerationNotObserved", progress.message)]
    failed = kstatus.compute(cr({"conditions": [cond("Stalled", "True", "Broke", "it broke")]}))
    assert failed.conditions == [kstatus.Condition("Stalled", "True", "Broke", "it broke")]
    assert kstatus.compute(cr({"conditions": [cond("Ready", "True")]})).conditions == []


@pytest.mark.parametrize("obj", [
    cr({"observedGeneration": "3"}),
    cr({"observedGeneration": 3.0}),
    cr({"conditions": {"type": "Ready"}}),
    cr({"conditions": [{"type": "Ready", "status": True}]}),
], ids=["generation-as-string", "generation-as-float", "conditions-not-a-list",
        "status-not-a-string"])
def test_malformed_status_is_an_error_as_in_kstatus(obj: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        kstatus.compute(obj)


def test_kinds_with_a_rule_of_their_own_are_judged_by_it() -> None:
    # A Deployment without a status has fewer replicas than its spec's default of 1 (the
    # Deployment rule in core.go), where the generic rules would have said Current.
    deployment = kstatus.compute({"apiVersion": "apps/v1", "kind": "Deployment",
                                  "metadata": {"name": "d"}})
    assert (deployment.status, deployment.message) == (kstatus.IN_PROGRESS, "Replicas: 0/1")
    assert deployment.conditions == [kstatus.Condition(
        "Reconciling", "True", "LessReplicas", "Replicas: 0/1")]
    # ...but the generic rules still come first, as in Compute.
    gone = {"apiVersion": "v1", "kind": "Pod", "metadata": {"deletionTimestamp": "t"}}
    assert kstatus.compute(gone).status == kstatus.TERMINATING
