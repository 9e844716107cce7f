"""classify(pod, node, now): one row per way a runner pod ends (the API's reasons table)."""

from __future__ import annotations

import datetime
from typing import Any

import pytest
from agentrun_operator.classify import classify

from agentrun.vocabulary import Phase, Reason

NOW = datetime.datetime(2026, 11, 30, 12, 0, 0, tzinfo=datetime.UTC)
GRACE = datetime.timedelta(seconds=30)


def ago(seconds: int) -> str:
    return (NOW - datetime.timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


def pod(
    phase: str = "Running",
    *,
    deleting: bool = False,
    disruption: str | None = None,
    kueue: str | None = None,
    reason: str | None = None,
    message: str | None = None,
    terminated: dict[str, Any] | None = None,
    waiting: str | None = None,
) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase, "conditions": [
        {"type": "Ready", "status": "True" if phase == "Running" else "False"}]}
    if disruption:
        status["conditions"].append({"type": "DisruptionTarget", "status": "True",
                                     "reason": disruption, "message": "because"})
    if kueue:
        # What Kueue's pod integration writes before it deletes a pod it stops.
        status["conditions"].append({"type": "TerminationTarget", "status": "True",
                                     "reason": kueue, "message": "Preempted to accommodate "
                                     "a workload (UID: 0f1e) due to prioritization in the "
                                     "ClusterQueue"})
    if reason:
        status["reason"] = reason
    if message:
        status["message"] = message
    state: dict[str, Any] = {"running": {"startedAt": ago(10)}}
    if terminated is not None:
        state = {"terminated": terminated}
    elif waiting:
        state = {"waiting": {"reason": waiting, "message": "pull access denied"}}
    status["containerStatuses"] = [{"name": "runner", "state": state}]
    meta: dict[str, Any] = {"name": "triage-42-1", "namespace": "support"}
    if deleting:
        meta["deletionTimestamp"] = ago(0)
    return {"metadata": meta, "spec": {"nodeName": "dev-node"}, "status": status}


def node(ready: str = "True", since: int = 3600) -> dict[str, Any]:
    return {"metadata": {"name": "dev-node"}, "status": {"conditions": [
        {"type": "Ready", "status": ready, "reason": "NodeStatusUnknown",
         "lastTransitionTime": ago(since)}]}}


def exited(code: int, reason: str = "Error", message: str = "") -> dict[str, Any]:
    return {"exitCode": code, "reason": reason, "message": message}


CASES: list[tuple[str, dict[str, Any], dict[str, Any] | None, str | None, str | None]] = [
    # (row, pod, node, expected phase, expected reason)
    ("Eviction API: DisruptionTarget EvictionByEvictionAPI + deletion",
     pod(deleting=True, disruption="EvictionByEvictionAPI"), node(), Phase.FAILED, Reason.EVICTED),
    ("kubelet eviction: DisruptionTarget TerminationByKubelet + phase Failed",
     pod("Failed", disruption="TerminationByKubelet", reason="Evicted",
         terminated=exited(137, "ContainerStatusUnknown")), node(), Phase.FAILED, Reason.EVICTED),
    ("kubelet eviction without the condition: phase Failed, reason Evicted",
     pod("Failed", reason="Evicted", message="The node was low on resource: memory."),
     node(), Phase.FAILED, Reason.EVICTED),
    ("preemption: DisruptionTarget PreemptionByScheduler + deletion",
     pod(deleting=True, disruption="PreemptionByScheduler"), node(), Phase.FAILED,
     Reason.PREEMPTED),
    ("Kueue preemption: TerminationTarget WorkloadEvictedDueToPreempted + deletion",
     pod(deleting=True, kueue="WorkloadEvictedDueToPreempted"), node(), Phase.FAILED,
     Reason.PREEMPTED),
    ("Kueue eviction, pod already failed with SIGTERM's exit code: still Preempted",
     pod("Failed", deleting=True, kueue="WorkloadEvictedDueToPreempted",
         terminated=exited(143)), node(), Phase.FAILED, Reason.PREEMPTED),
    ("Kueue deactivation: TerminationTarget WorkloadEvictedDueToDeactivated + deletion",
     pod(deleting=True, kueue="WorkloadEvictedDueToDeactivated"), node(), Phase.FAILED,
     Reason.PREEMPTED),
    ("Kueue: ClusterQueue stopped (WorkloadEvictedDueToClusterQueueStopped) + deletion",
     pod(deleting=True, kueue="WorkloadEvictedDueToClusterQueueStopped"), node(),
     Phase.FAILED, Reason.PREEMPTED),
    ("Kueue: pods-ready timeout (WorkloadEvictedDueToPodsReadyTimeout) + deletion",
     pod(deleting=True, kueue="WorkloadEvictedDueToPodsReadyTimeout"), node(),
     Phase.FAILED, Reason.PREEMPTED),
    ("Kueue stops the pod of a deleted Workload: PodDeleted, not a preemption",
     pod(deleting=True, kueue="WorkloadDeleted"), node(), Phase.FAILED, Reason.POD_DELETED),
    ("TerminationTarget alone (Kueue has not deleted it yet): nothing final",
     pod(kueue="WorkloadEvictedDueToPreempted"), node(), Phase.RUNNING, Reason.STARTED),
    ("Kueue eviction of a pod that had already succeeded: success",
     pod("Succeeded", deleting=True, kueue="WorkloadEvictedDueToPreempted",
         terminated=exited(0, "Completed")), node(), Phase.SUCCEEDED, Reason.SUCCEEDED),
    ("taint manager: DisruptionTarget DeletionByTaintManager + deletion",
     pod(deleting=True, disruption="DeletionByTaintManager"), node("Unknown", 40),
     Phase.FAILED, Reason.NODE_LOST),
    ("pod GC: DisruptionTarget DeletionByPodGC + deletion",
     pod(deleting=True, disruption="DeletionByPodGC"), node("Unknown", 400), Phase.FAILED,
     Reason.NODE_LOST),
    ("DisruptionTarget alone (may be cleared again): nothing final",
     pod(disruption="EvictionByEvictionAPI"), node(), Phase.RUNNING, Reason.STARTED),
    ("DisruptionTarget alone on a pod that then succeeds: success",
     pod("Succeeded", disruption="PreemptionByScheduler", terminated=exited(0, "Completed")),
     node(), Phase.SUCCEEDED, Reason.SUCCEEDED),
    ("OOM: container terminated OOMKilled, exit 137",
     pod("Failed", terminated=exited(137, "OOMKilled")), node(), Phase.FAILED,
     Reason.OOM_KILLED),
    ("non-zero exit: AgentError",
     pod("Failed", terminated=exited(1, "Error", "Traceback...\nValueError: boom")), node(),
     Phase.FAILED, Reason.AGENT_ERROR),
    ("phase Failed with no container status: AgentError",
     pod("Failed", terminated=None), None, Phase.FAILED, Reason.AGENT_ERROR),
    ("image cannot be pulled: ImagePullFailed",
     pod("Pending", waiting="ImagePullBackOff"), node(), Phase.FAILED, Reason.IMAGE_PULL_FAILED),
    ("bad image name: ImagePullFailed",
     pod("Pending", waiting="InvalidImageName"), node(), Phase.FAILED, Reason.IMAGE_PULL_FAILED),
    ("deadline: phase Failed, reason DeadlineExceeded",
     pod("Failed", reason="DeadlineExceeded", terminated=exited(137)), node(), Phase.FAILED,
     Reason.DEADLINE_EXCEEDED),
    ("deleted by hand while running: PodDeleted",
     pod(deleting=True), node(), Phase.FAILED, Reason.POD_DELETED),
    ("deleted by hand, runner already gone with SIGTERM's exit code: still PodDeleted",
     pod("Failed", deleting=True, terminated=exited(143)), node(), Phase.FAILED,
     Reason.POD_DELETED),
    ("success, then deleted: stays Succeeded",
     pod("Succeeded", deleting=True, terminated=exited(0, "Completed")), node(),
     Phase.SUCCEEDED, Reason.SUCCEEDED),
    ("node Ready Unknown past the grace: NodeLost",
     pod(), node("Unknown", 31), Phase.FAILED, Reason.NODE_LOST),
    ("node Ready False past the grace: NodeLost",
     pod(), node("False", 120), Phase.FAILED, Reason.NODE_LOST),
    ("node Ready Unknown within the grace: still running",
     pod(), node("Unknown", 5), Phase.RUNNING, Reason.STARTED),
    ("success: exit 0",
     pod("Succeeded", terminated=exited(0, "Completed")), node(), Phase.SUCCEEDED,
     Reason.SUCCEEDED),
    ("running: Running, not terminal", pod(), node(), Phase.RUNNING, Reason.STARTED),
    ("not started yet: nothing", pod("Pending", terminated=None), node(), None, None),
]


@pytest.mark.parametrize(("row", "the_pod", "the_node", "phase", "reason"), CASES,
                         ids=[c[0] for c in CASES])
def test_classify(row: str, the_pod: dict[str, Any], the_node: dict[str, Any] | None,
                  phase: str | None, reason: str | None) -> None:
    outcome = classify(the_pod, the_node, NOW, GRACE)
    if phase is None:
        assert outcome is None
        return
    assert outcome is not None
    assert (outcome.phase, outcome.reason) == (phase, reason)
    assert outcome.message.endswith(".")


def test_every_failure_reason_a_pod_can_show_is_covered() -> None:
    """The pod-side reasons of the API's table all appear in CASES."""
    covered = {c[4] for c in CASES}
    pod_side = {Reason.EVICTED, Reason.PREEMPTED, Reason.NODE_LOST, Reason.POD_DELETED,
                Reason.OOM_KILLED, Reason.IMAGE_PULL_FAILED, Reason.DEADLINE_EXCEEDED,
                Reason.AGENT_ERROR}
    assert pod_side <= covered


def test_messages_say_what_to_do() -> None:
    oom = classify(pod("Failed", terminated=exited(137, "OOMKilled")), node(), NOW, GRACE)
    assert oom is not None and "spec.resources.limits.memory" in oom.message
    agent = classify(pod("Failed", terminated=exited(1, "Error", "x\nValueError: boom\n")),
                     node(), NOW, GRACE)
    assert agent is not None and "ValueError: boom" in agent.message
    lost = classify(pod(), node("Unknown", 45), NOW, GRACE)
    assert lost is not None and "dev-node" in lost.message and "45s" in lost.message


def test_a_preemption_says_who_preempted() -> None:
    """Kueue's eviction and the scheduler's preemption are both Preempted; the message
    names which, with the preemptor's own words."""
    by_kueue = classify(pod(deleting=True, kueue="WorkloadEvictedDueToPreempted"), node(),
                        NOW, GRACE)
    by_scheduler = classify(pod(deleting=True, disruption="PreemptionByScheduler"), node(),
                            NOW, GRACE)
    assert by_kueue is not None and by_scheduler is not None
    assert "by Kueue, which evicted its Workload: WorkloadEvictedDueToPreempted: " \
        "Preempted to accommodate a workload" in by_kueue.message
    assert "by the scheduler, for a higher-priority pod: PreemptionByScheduler" \
        in by_scheduler.message
    stopped = classify(pod(deleting=True, kueue="WorkloadDeleted"), node(), NOW, GRACE)
    assert stopped is not None and "by Kueue: WorkloadDeleted" in stopped.message
