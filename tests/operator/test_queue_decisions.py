"""Queues (api.md, "Queues"), the pure parts: what a runner pod's gate and its Workload
say about the run (queue_status), when the stale limit counts, which attempts do not count
against retry.maxAttempts, and the runner pod's Kueue labels and resources."""

from __future__ import annotations

import datetime
from typing import Any

import pytest
from agentrun_operator import queue
from agentrun_operator.config import OperatorConfig, parse, runner_resources_of
from agentrun_operator.pods import runner_pod

from agentrun.vocabulary import Condition, Kueue, Phase, Reason

NOW = datetime.datetime(2026, 11, 30, 12, 0, 0, tzinfo=datetime.UTC)
KUEUE_SAYS = ("couldn't assign flavors to pod set main: insufficient unused quota for cpu "
              "in flavor default-flavor, 100m more needed")


def stamp(seconds_ago: float) -> str:
    return (NOW - datetime.timedelta(seconds=seconds_ago)).strftime("%Y-%m-%dT%H:%M:%SZ")


def pod(*, gated: bool = True, queue_name: str | None = "team-a") -> dict[str, Any]:
    labels = {"agentrun.dev/run": "triage-42"}
    if queue_name:
        labels[Kueue.LABEL_QUEUE_NAME] = queue_name
    spec: dict[str, Any] = {"nodeName": None}
    if gated:
        spec["schedulingGates"] = [{"name": Kueue.ADMISSION_GATE}]
    return {"metadata": {"name": "triage-42-1", "namespace": "support", "labels": labels},
            "spec": spec, "status": {"phase": "Pending"}}


def workload(*conditions: tuple[str, str, str, str],
             cluster_queue: str | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {"conditions": [
        {"type": t, "status": s, "reason": r, "message": m, "lastTransitionTime": stamp(5)}
        for t, s, r, m in conditions]}
    if cluster_queue:
        status["admission"] = {"clusterQueue": cluster_queue}
    return queue.slim_workload({
        "metadata": {"name": "pod-triage-42-1-1a2b3", "namespace": "support",
                     "ownerReferences": [{"apiVersion": "v1", "kind": "Pod",
                                          "name": "triage-42-1", "uid": "p-1"}]},
        "status": status})


PENDING = workload((Kueue.QUOTA_RESERVED, "False", "Pending", KUEUE_SAYS))
INADMISSIBLE = workload((Kueue.QUOTA_RESERVED, "False", "Inadmissible",
                         "LocalQueue team-a doesn't exist"))
CHECKS = workload((Kueue.QUOTA_RESERVED, "True", "QuotaReserved",
                   "Quota reserved in ClusterQueue team-a-cq"),
                  (Kueue.ADMITTED, "False", "NoChecks", "The workload has pending checks"))
ADMITTED = workload((Kueue.QUOTA_RESERVED, "True", "QuotaReserved", "Quota reserved"),
                    (Kueue.ADMITTED, "True", "Admitted", "The workload is admitted"),
                    cluster_queue="team-a-cq")

CASES: list[tuple[str, dict[str, Any], dict[str, Any] | None, bool | None, str, str]] = [
    # (row, pod, its Workload, Admitted (None: not held by Kueue), reason, message part)
    ("no queue label, no gate: not Kueue's", pod(gated=False, queue_name=None), None,
     None, "", ""),
    ("gated, no Workload yet", pod(), None, False, "WorkloadNotCreated",
     "has not created the pod's Workload"),
    ("gated, quota not reserved: Kueue's own message", pod(), PENDING, False, "Pending",
     KUEUE_SAYS),
    ("gated, its LocalQueue missing: Kueue's own message", pod(), INADMISSIBLE, False,
     "Inadmissible", "LocalQueue team-a doesn't exist"),
    ("gated, quota reserved, admission checks pending", pod(), CHECKS, False, "NoChecks",
     "pending checks"),
    ("gated, Workload admitted (the gate is being removed): admitted", pod(), ADMITTED,
     True, "Admitted", "The workload is admitted"),
    ("gate removed: admitted, by the Workload's words", pod(gated=False), ADMITTED, True,
     "Admitted", "The workload is admitted"),
    ("gate removed, Workload not seen: admitted all the same", pod(gated=False), None,
     True, "Admitted", "Kueue admitted the runner pod"),
]


@pytest.mark.parametrize(("row", "the_pod", "the_workload", "admitted", "reason", "said"),
                         CASES, ids=[c[0] for c in CASES])
def test_admission(row: str, the_pod: dict[str, Any], the_workload: dict[str, Any] | None,
                   admitted: bool | None, reason: str, said: str) -> None:
    found = queue.admission(the_pod, the_workload)
    if admitted is None:
        assert found is None
        return
    assert found is not None
    assert (found.admitted, found.reason) == (admitted, reason)
    assert said in found.message
    assert found.queue == "team-a"


def test_a_queued_run_shows_pending_queued_with_kueues_message() -> None:
    changes = queue.queue_status(pod(), PENDING, {"phase": Phase.PENDING,
                                                  "reason": Reason.POD_CREATED}, NOW)
    assert changes is not None
    assert (changes["phase"], changes["reason"]) == (Phase.PENDING, Reason.QUEUED)
    assert "waits in LocalQueue team-a" in changes["message"]
    assert KUEUE_SAYS in changes["message"]
    admitted = next(c for c in changes["conditions"] if c["type"] == Condition.ADMITTED)
    assert (admitted["status"], admitted["reason"], admitted["message"]) == (
        "False", "Pending", KUEUE_SAYS)
    # Shown once: the same facts again write nothing.
    assert queue.queue_status(pod(), PENDING, changes, NOW) is None
    # Kueue's message changes: shown again.
    later = queue.queue_status(pod(), INADMISSIBLE, changes, NOW)
    assert later is not None and "LocalQueue team-a doesn't exist" in later["message"]


def test_an_admitted_run_shows_admitted_true_and_keeps_its_phase() -> None:
    queued = queue.queue_status(pod(), PENDING, {"phase": Phase.PENDING}, NOW)
    assert queued is not None
    changes = queue.queue_status(pod(gated=False), ADMITTED, queued,
                                 NOW + datetime.timedelta(seconds=30))
    assert changes is not None and set(changes) == {"conditions"}
    admitted = next(c for c in changes["conditions"] if c["type"] == Condition.ADMITTED)
    assert admitted["status"] == "True"
    assert admitted["lastTransitionTime"] == "2026-11-30T12:00:30Z"
    assert queue.queue_status(pod(gated=False), ADMITTED, {**queued, **changes}, NOW) is None


def test_a_run_without_a_queue_gets_no_queue_status() -> None:
    assert queue.queue_status(pod(gated=False, queue_name=None), None,
                              {"phase": Phase.PENDING}, NOW) is None


def test_queue_time_does_not_count_toward_the_stale_limit() -> None:
    created = stamp(7200)
    # Queued two hours, admitted 60 s ago: the stale clock starts at the admission.
    status = {"conditions": [{"type": Condition.ADMITTED, "status": "True",
                              "lastTransitionTime": stamp(60)}]}
    assert queue.stale_clock(status, created) == NOW - datetime.timedelta(seconds=60)
    # Not in a queue: from its start, else its creation, as before.
    assert queue.stale_clock({}, created) == NOW - datetime.timedelta(seconds=7200)
    assert queue.stale_clock({"startedAt": stamp(30)}, created) == \
        NOW - datetime.timedelta(seconds=30)
    # Admitted, then started later: from the start.
    assert queue.stale_clock({**status, "startedAt": stamp(10)}, created) == \
        NOW - datetime.timedelta(seconds=10)
    # Admitted False (queued again) is no admission.
    queued = {"conditions": [{"type": Condition.ADMITTED, "status": "False",
                              "lastTransitionTime": stamp(60)}]}
    assert queue.stale_clock(queued, created) == NOW - datetime.timedelta(seconds=7200)


@pytest.mark.parametrize(("before", "attempt", "reason", "expected"), [
    ([], 1, Reason.PREEMPTED, [1]),
    ([1], 2, Reason.AGENT_ERROR, [1]),
    ([1], 2, Reason.PREEMPTED, [1, 2]),
    ([1, 3], 3, Reason.EVICTED, [1]),  # an older status' entry for n is not kept
    ([], 2, Reason.EVICTED, []),
])
def test_preempted_attempts_are_listed(before: list[int], attempt: int, reason: str,
                                       expected: list[int]) -> None:
    assert queue.preempted_attempts({"preemptedAttempts": before}, attempt,
                                    reason) == expected


def test_the_next_attempt_after_a_preemption_says_who_preempted() -> None:
    note = queue.preemption_note(Reason.PREEMPTED, "The runner pod was preempted (by Kueue).")
    assert note == (" The runner pod was preempted (by Kueue). A preemption does not count "
                    "against retry.maxAttempts.")
    assert queue.preemption_note(Reason.EVICTED, "The runner pod was evicted.") == ""


def run(labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "triage-42", "namespace": "support", "uid": "u-1",
                         "labels": labels or {}},
            "spec": {"agent": "support-agent", **spec}}


def test_a_queued_runs_pods_carry_its_queue_and_priority() -> None:
    manifest = runner_pod(run({Kueue.LABEL_QUEUE_NAME: "team-a",
                               Kueue.LABEL_PRIORITY_CLASS: "urgent", "team": "support"}),
                          2, "s-2", "sha256:x", OperatorConfig())
    labels = manifest["metadata"]["labels"]
    assert labels[Kueue.LABEL_QUEUE_NAME] == "team-a"
    assert labels[Kueue.LABEL_PRIORITY_CLASS] == "urgent"
    assert "team" not in labels  # only Kueue's labels are passed on
    plain = runner_pod(run(), 1, "s-1", "sha256:x", OperatorConfig())
    assert not set(plain["metadata"]["labels"]) & set(Kueue.LABELS)


def test_runner_pods_request_the_configured_resources_unless_the_run_says() -> None:
    default = runner_pod(run(), 1, "s", "sha256:x", OperatorConfig())
    assert default["spec"]["containers"][0]["resources"] == {
        "requests": {"cpu": "100m", "memory": "256Mi"}}
    own = {"requests": {"cpu": "2"}, "limits": {"memory": "1Gi"}}
    assert runner_pod(run(resources=own), 1, "s", "sha256:x", OperatorConfig())[
        "spec"]["containers"][0]["resources"] == own
    none = runner_pod(run(), 1, "s", "sha256:x", OperatorConfig(runner_resources={}))
    assert "resources" not in none["spec"]["containers"][0]


def test_the_runner_resources_flag() -> None:
    config = parse(["--store-api-listen=", "--store-api-url=https://store:8080",
                    '--runner-resources={"requests":{"cpu":"250m"},"limits":{"memory":"1Gi"}}'])
    assert config.runner_resources == {"requests": {"cpu": "250m"},
                                       "limits": {"memory": "1Gi"}}
    assert runner_resources_of("{}") == {}
    for bad, said in (("[1]", "must be an object"), ('{"cpu": "1"}', "only requests"),
                      ('{"requests": "1"}', "must map"), ("{", "not JSON")):
        with pytest.raises(ValueError, match=said):
            runner_resources_of(bad)
