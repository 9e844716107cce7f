"""What a runner pod (and its node) says about the run: one pure decision.

`classify(pod, node, now, node_lost_grace)` takes the pod and its node as the API server
returns them (plain dicts, as kopf hands them over) and returns the run's outcome, or
None while the pod says nothing final yet. No I/O happens here; the table of cases lives
in tests/operator/test_classify.py. The Job controller's pod failure policy matching is the
model: first the disruption the cluster itself declared, then what the kubelet reported,
then what the container's exit says.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agentrun.vocabulary import Kueue, Phase, Reason

# DisruptionTarget reasons (pod condition, GA in Kubernetes 1.31) -> run reason.
_DISRUPTIONS: Mapping[str, str] = {
    "EvictionByEvictionAPI": Reason.EVICTED,
    "TerminationByKubelet": Reason.EVICTED,
    "PreemptionByScheduler": Reason.PREEMPTED,
    "DeletionByTaintManager": Reason.NODE_LOST,
    "DeletionByPodGC": Reason.NODE_LOST,
}

_IMAGE_PULL_REASONS = frozenset({
    "ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull",
    "RegistryUnavailable", "ImageInspectError",
})

@dataclass(frozen=True)
class Outcome:
    """How an attempt ended (or, for RUNNING, that it now runs)."""

    phase: str
    reason: str
    message: str

    @property
    def terminal(self) -> bool:
        return self.phase in Phase.TERMINAL


def _conditions(obj: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    return {c.get("type", ""): c for c in (obj.get("status") or {}).get("conditions") or []}


def _true(pod: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    """The pod's condition `kind` when its status is True."""
    condition = _conditions(pod).get(kind)
    return condition if condition and condition.get("status") == "True" else None


def _parse_time(value: str | None) -> datetime.datetime | None:
    if not value:
        return None
    return datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))


def _terminated(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        terminated = (status.get("state") or {}).get("terminated")
        if terminated:
            return dict(terminated)
    return None


def _waiting_reason(pod: Mapping[str, Any]) -> tuple[str, str] | None:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        waiting = (status.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in _IMAGE_PULL_REASONS:
            return waiting["reason"], waiting.get("message") or ""
    return None


def marked_for_stop(pod: Mapping[str, Any]) -> bool:
    """The cluster has said it will stop the pod (DisruptionTarget, or Kueue's
    TerminationTarget): its deletion, and so its end, follow a moment later."""
    return any(_true(pod, kind) for kind in ("DisruptionTarget", Kueue.TERMINATION_TARGET))


def match_disruption(pod: Mapping[str, Any]) -> Outcome | None:
    """A DisruptionTarget condition, acted on only together with a deletion or phase Failed
    (the disruption controller may set it and later clear it on a pod that lives on)."""
    condition = _true(pod, "DisruptionTarget")
    if condition is None:
        return None
    deleting = (pod.get("metadata") or {}).get("deletionTimestamp") is not None
    failed = (pod.get("status") or {}).get("phase") == "Failed"
    if not (deleting or failed):
        return None
    cause = condition.get("reason", "")
    reason = _DISRUPTIONS.get(cause)
    if reason is None:
        return None
    detail = f"{cause}: {condition.get('message') or cause}"
    if reason == Reason.PREEMPTED:
        detail = f"by the scheduler, for a higher-priority pod: {detail}"
    return Outcome(Phase.FAILED, reason, _message(reason, detail))


def match_queue_eviction(pod: Mapping[str, Any]) -> Outcome | None:
    """Kueue stopped the pod: it sets the condition TerminationTarget, then deletes the pod.
    An eviction of its Workload (WorkloadEvictedDueTo<why>: preempted, deactivated, its
    ClusterQueue stopped, pods-ready timeout) is a preemption: not the run's fault. Any
    other stop (its Workload deleted, ...) is a deletion, with Kueue's reason. Acted on
    only with the deletion or phase Failed, as DisruptionTarget is."""
    condition = _true(pod, Kueue.TERMINATION_TARGET)
    if condition is None:
        return None
    deleting = (pod.get("metadata") or {}).get("deletionTimestamp") is not None
    phase = (pod.get("status") or {}).get("phase")
    # A pod that had already succeeded was stopped after its end: the end stands.
    if phase == "Succeeded" or not (deleting or phase == "Failed"):
        return None
    cause = str(condition.get("reason") or "")
    said = str(condition.get("message") or "").strip().rstrip(".")
    detail = f"{cause}: {said}" if said else cause or "no reason given"
    if cause.startswith(Kueue.EVICTED_REASON_PREFIX):
        return Outcome(Phase.FAILED, Reason.PREEMPTED,
                       _message(Reason.PREEMPTED, f"by Kueue, which evicted its Workload: "
                                                  f"{detail}"))
    return Outcome(Phase.FAILED, Reason.POD_DELETED,
                   _message(Reason.POD_DELETED, f"by Kueue: {detail}"))


def match_kubelet_eviction(pod: Mapping[str, Any]) -> Outcome | None:
    """The kubelet's own eviction (node pressure): phase Failed, reason Evicted."""
    status = pod.get("status") or {}
    if status.get("phase") == "Failed" and status.get("reason") == "Evicted":
        return Outcome(Phase.FAILED, Reason.EVICTED,
                       _message(Reason.EVICTED, status.get("message") or "node pressure"))
    return None


def match_deadline(pod: Mapping[str, Any]) -> Outcome | None:
    """The kubelet killed the pod at its activeDeadlineSeconds."""
    status = pod.get("status") or {}
    if status.get("phase") == "Failed" and status.get("reason") == "DeadlineExceeded":
        return Outcome(Phase.FAILED, Reason.DEADLINE_EXCEEDED,
                       _message(Reason.DEADLINE_EXCEEDED, status.get("message") or ""))
    return None


def match_oom(pod: Mapping[str, Any]) -> Outcome | None:
    """The runner container was OOM-killed."""
    terminated = _terminated(pod)
    if terminated is None or terminated.get("reason") != "OOMKilled":
        return None
    return Outcome(Phase.FAILED, Reason.OOM_KILLED,
                   _message(Reason.OOM_KILLED, f"exit code {terminated.get('exitCode')}"))


def match_success(pod: Mapping[str, Any]) -> Outcome | None:
    """The runner exited 0 (a success stays a success even if the pod is deleted later)."""
    terminated = _terminated(pod)
    phase = (pod.get("status") or {}).get("phase")
    if phase == "Succeeded" or (terminated is not None and terminated.get("exitCode") == 0):
        return Outcome(Phase.SUCCEEDED, Reason.SUCCEEDED, "The agent finished.")
    return None


def match_failed_exit(pod: Mapping[str, Any]) -> Outcome | None:
    """The runner exited non-zero, or the pod failed without a container status."""
    status = pod.get("status") or {}
    terminated = _terminated(pod)
    if terminated is None:
        if status.get("phase") != "Failed":
            return None
        detail = status.get("message") or "the pod failed before its container reported"
        return Outcome(Phase.FAILED, Reason.AGENT_ERROR, _message(Reason.AGENT_ERROR, detail))
    detail = f"exit code {terminated.get('exitCode')}"
    if terminated.get("message"):
        detail += f": {_last_line(terminated['message'])}"
    return Outcome(Phase.FAILED, Reason.AGENT_ERROR, _message(Reason.AGENT_ERROR, detail))


def match_image_pull(pod: Mapping[str, Any]) -> Outcome | None:
    """The runner image cannot be pulled: nothing ran, so no tool can have run."""
    waiting = _waiting_reason(pod)
    if waiting is None:
        return None
    reason, detail = waiting
    return Outcome(Phase.FAILED, Reason.IMAGE_PULL_FAILED,
                   _message(Reason.IMAGE_PULL_FAILED, f"{reason}: {detail}".rstrip(": ")))


def match_node_lost(
    node: Mapping[str, Any] | None, now: datetime.datetime, grace: datetime.timedelta
) -> Outcome | None:
    """The pod's node stopped reporting: Ready False/Unknown for longer than `grace`."""
    if node is None:
        return None
    ready = _conditions(node).get("Ready")
    if ready is None or ready.get("status") == "True":
        return None
    since = _parse_time(ready.get("lastTransitionTime"))
    if since is None or now - since < grace:
        return None
    name = (node.get("metadata") or {}).get("name", "?")
    seconds = int((now - since).total_seconds())
    return Outcome(Phase.FAILED, Reason.NODE_LOST, _message(
        Reason.NODE_LOST,
        f"node {name} has been Ready={ready.get('status')} for {seconds}s "
        f"({ready.get('reason') or 'no reason given'})"))


def match_deletion(pod: Mapping[str, Any]) -> Outcome | None:
    """Somebody deleted the runner pod while the run was running."""
    if (pod.get("metadata") or {}).get("deletionTimestamp") is None:
        return None
    return Outcome(Phase.FAILED, Reason.POD_DELETED, _message(Reason.POD_DELETED, ""))


def classify(
    pod: Mapping[str, Any],
    node: Mapping[str, Any] | None,
    now: datetime.datetime,
    node_lost_grace: datetime.timedelta,
) -> Outcome | None:
    """What this pod, on this node, says about its run.

    Returns a terminal Outcome (Succeeded, or Failed with a reason from the API's table),
    an Outcome with phase Running once the container runs, or None while nothing is known.
    First match wins: the cluster's declared disruption, and Kueue's (its eviction of the
    pod's Workload is a preemption); the kubelet's eviction and
    deadline; an OOM kill; success; a deletion nobody explained (before the exit code,
    which after a deletion is only the SIGTERM's echo); a non-zero exit; an image that
    cannot be pulled; the node's silence.
    """
    for match in (match_disruption, match_queue_eviction, match_kubelet_eviction,
                  match_deadline, match_oom, match_success, match_deletion, match_failed_exit,
                  match_image_pull):
        outcome = match(pod)
        if outcome is not None:
            return outcome
    lost = match_node_lost(node, now, node_lost_grace)
    if lost is not None:
        return lost
    if (pod.get("status") or {}).get("phase") == "Running":
        return Outcome(Phase.RUNNING, Reason.STARTED, "The runner pod is running.")
    return None


# What to do next, by reason: said once here so every message carries the same advice.
_ADVICE: Mapping[str, str] = {
    Reason.EVICTED: "The runner pod was evicted",
    Reason.PREEMPTED: "The runner pod was preempted",
    Reason.NODE_LOST: "The runner pod's node stopped reporting",
    Reason.POD_DELETED: "The runner pod was deleted while the run was running",
    Reason.OOM_KILLED: "The runner ran out of memory; raise spec.resources.limits.memory",
    Reason.IMAGE_PULL_FAILED: "The runner image cannot be pulled; check spec.image and "
                              "image pull access",
    Reason.DEADLINE_EXCEEDED: "The run exceeded spec.activeDeadlineSeconds",
    Reason.AGENT_ERROR: "The runner failed",
}


def _message(reason: str, detail: str) -> str:
    head = _ADVICE.get(reason, reason)
    return f"{head} ({detail})." if detail else f"{head}."


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""
