"""A run in Kueue's queue: what its runner pod and the pod's Workload say (pure).

Kueue's pod integration admits each runner pod of a run labelled
`kueue.x-k8s.io/queue-name`: its webhook puts the scheduling gate `kueue.x-k8s.io/admission`
on the pod, Kueue makes a Workload for it (owned by the pod), and removes the gate once the
Workload is admitted against its ClusterQueue's quota. While gated, the Workload's
`QuotaReserved` condition says why it waits, in Kueue's own words. These functions turn
that into the run's status: phase Pending, reason Queued and condition Admitted False while
gated; Admitted True once admitted. No I/O here; the rows are in
tests/operator/test_queue_status.py.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agentrun.vocabulary import Condition, Kueue, Phase, Reason
from agentrun_operator import status as st


@dataclass(frozen=True)
class Admission:
    """Where the attempt's pod stands in Kueue's queue: admitted or not, and Kueue's own
    reason and message for it."""

    admitted: bool
    reason: str
    message: str
    queue: str


def _conditions(obj: Mapping[str, Any] | None) -> dict[str, Mapping[str, Any]]:
    return {str(c.get("type")): c for c in ((obj or {}).get("status") or {}).get(
        "conditions") or []}


def gated(pod: Mapping[str, Any]) -> bool:
    """Whether the pod still carries Kueue's admission gate (the scheduler leaves it alone
    until Kueue removes it)."""
    return any(g.get("name") == Kueue.ADMISSION_GATE
               for g in (pod.get("spec") or {}).get("schedulingGates") or [])


def queue_of(pod: Mapping[str, Any]) -> str:
    """The LocalQueue the pod is labelled for ("" for a pod not in a queue)."""
    return str(((pod.get("metadata") or {}).get("labels") or {}).get(
        Kueue.LABEL_QUEUE_NAME) or "")


def admission(pod: Mapping[str, Any], workload: Mapping[str, Any] | None) -> Admission | None:
    """Kueue's admission of the runner pod, or None for a pod Kueue does not hold (no queue
    label, no gate). The gate is the pod's own truth; the Workload says why, or by which
    ClusterQueue it was admitted. A Workload Kueue has admitted whose gate is still being
    removed counts as admitted."""
    queue = queue_of(pod)
    if not queue and not gated(pod):
        return None
    conditions = _conditions(workload)
    admitted = conditions.get(Kueue.ADMITTED) or {}
    if not gated(pod) or admitted.get("status") == "True":
        cluster_queue = str(((workload or {}).get("status") or {}).get("admission", {}).get(
            "clusterQueue") or "")
        said = str(admitted.get("message") or "").strip()
        where = f" to ClusterQueue {cluster_queue}" if cluster_queue else ""
        return Admission(True, str(admitted.get("reason") or Kueue.ADMITTED),
                         said or f"Kueue admitted the runner pod{where}.", queue)
    if workload is None:
        return Admission(False, "WorkloadNotCreated",
                         "Kueue has not created the pod's Workload yet.", queue)
    reserved = conditions.get(Kueue.QUOTA_RESERVED) or {}
    if reserved.get("status") == "True":
        # Quota is reserved; admission checks (a ProvisioningRequest, MultiKueue) remain.
        return Admission(False, str(admitted.get("reason") or "AdmissionChecksPending"),
                         str(admitted.get("message") or reserved.get("message") or
                             "Quota is reserved; the admission checks have not passed yet."),
                         queue)
    return Admission(False, str(reserved.get("reason") or "Pending"),
                     str(reserved.get("message") or
                         "Kueue has not reserved quota for the Workload yet."), queue)


def queued_message(pod_name: str, found: Admission) -> str:
    """The run's message while its attempt waits in the queue."""
    said = found.message.strip()
    said = said if said.endswith(".") else f"{said}."
    return (f"Runner pod {pod_name} waits in LocalQueue {found.queue or '?'} for Kueue's "
            f"admission: {said} Nothing runs until Kueue admits it; queue time counts "
            "toward neither activeDeadlineSeconds nor the stale limit.")


def admitted_condition(found: Admission, now: datetime.datetime,
                       previous: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Admitted: False with Kueue's reason and message while queued, True once admitted."""
    value = "True" if found.admitted else "False"
    before = next((c for c in previous if c.get("type") == Condition.ADMITTED), None)
    since = st.stamp(now)
    if before is not None and before.get("status") == value and before.get(
            "lastTransitionTime"):
        since = before["lastTransitionTime"]
    return {"type": Condition.ADMITTED, "status": value, "reason": found.reason,
            "message": found.message, "lastTransitionTime": since}


def queue_status(pod: Mapping[str, Any], workload: Mapping[str, Any] | None,
                 status: Mapping[str, Any], now: datetime.datetime) -> dict[str, Any] | None:
    """The status changes a live run's pod's place in the queue calls for, or None when
    there are none (a pod Kueue does not hold, or what it says is already shown). Queued:
    phase Pending, reason Queued, condition Admitted False with Kueue's own reason and
    message. Admitted: condition Admitted True; phase, reason and message stay as they
    are (the pod's start says Running)."""
    found = admission(pod, workload)
    if found is None:
        return None
    previous = list(status.get("conditions") or [])
    condition = admitted_condition(found, now, previous)
    shown = next((c for c in previous if c.get("type") == Condition.ADMITTED), None)
    same = shown is not None and all(shown.get(k) == condition[k]
                                     for k in ("status", "reason", "message"))
    pod_name = str((pod.get("metadata") or {}).get("name") or "?")
    if found.admitted:
        if same:
            return None
        return {"conditions": [*[c for c in previous if c.get("type") != Condition.ADMITTED],
                               condition]}
    message = queued_message(pod_name, found)
    if same and (status.get("phase"), status.get("reason"), status.get("message")) == (
            Phase.PENDING, Reason.QUEUED, message):
        return None
    changes = st.live_status(Phase.PENDING, Reason.QUEUED, message, now, status)
    changes["conditions"] = [
        *[c for c in changes["conditions"] if c.get("type") != Condition.ADMITTED], condition]
    return changes


def _moment(stamp: Any) -> datetime.datetime | None:
    if not stamp:
        return None
    return datetime.datetime.fromisoformat(str(stamp).replace("Z", "+00:00"))


def stale_clock(status: Mapping[str, Any], created: Any) -> datetime.datetime | None:
    """When the stale limit starts counting for the current attempt: the run's start (or
    creation), or its attempt's admission by Kueue if that came later. Queue time is not
    running time: a run queued for hours is not Stale when it is admitted."""
    started = _moment(status.get("startedAt") or created)
    admitted = next((c for c in status.get("conditions") or []
                     if c.get("type") == Condition.ADMITTED and c.get("status") == "True"),
                    None)
    since = _moment((admitted or {}).get("lastTransitionTime"))
    if started is None or (since is not None and since > started):
        return since
    return started


def preempted_attempts(status: Mapping[str, Any], attempt: int, reason: str) -> list[int]:
    """The run's preempted attempts (status.preemptedAttempts), with attempt `attempt` if
    it just ended Preempted: none of them counts against retry.maxAttempts."""
    earlier = [int(a) for a in status.get("preemptedAttempts") or [] if int(a) < attempt]
    return [*earlier, attempt] if reason == Reason.PREEMPTED else earlier


def preemption_note(reason: str, message: str) -> str:
    """What the run's message adds when the next attempt follows a preemption: who
    preempted it (the attempt's end, `message`), and that it does not count."""
    if reason != Reason.PREEMPTED:
        return ""
    said = message.strip()
    return (f" {said}" if said else "") + \
        " A preemption does not count against retry.maxAttempts."


def slim_workload(obj: Mapping[str, Any]) -> dict[str, Any]:
    """A Workload as the queue status reads it: its owner pod, the conditions of its
    admission, and its ClusterQueue."""
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    owners = [{"kind": o.get("kind"), "name": o.get("name"), "uid": o.get("uid")}
              for o in meta.get("ownerReferences") or [] if o.get("kind") == "Pod"]
    kept = {Kueue.QUOTA_RESERVED, Kueue.ADMITTED, "Evicted", "Finished"}
    conditions = [{k: c.get(k) for k in ("type", "status", "reason", "message",
                                         "lastTransitionTime")}
                  for c in status.get("conditions") or [] if c.get("type") in kept]
    slim: dict[str, Any] = {
        "metadata": {**{k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion")
                        if k in meta}, "ownerReferences": owners},
        "status": {"conditions": conditions}}
    cluster_queue = (status.get("admission") or {}).get("clusterQueue")
    if cluster_queue:
        slim["status"]["admission"] = {"clusterQueue": cluster_queue}
    return slim


def owner_pod(workload: Mapping[str, Any]) -> tuple[str, str] | None:
    """(name, uid) of the pod a Workload was made for, if a pod owns it."""
    for owner in (workload.get("metadata") or {}).get("ownerReferences") or []:
        if owner.get("kind") == "Pod" and owner.get("name"):
            return str(owner["name"]), str(owner.get("uid") or "")
    return None
