"""`kubectl agentrun schedule trigger`: a run of a schedule now, named like a slot."""

from __future__ import annotations

import time

from agentrun.scheduled import belongs_to, scheduled_run
from agentrun.vocabulary import (
    LABEL_SCHEDULE,
    SCHEDULE_PLURAL,
    ConcurrencyPolicy,
    Phase,
)
from agentrun_kubectl.cluster import OK, REFUSED, Cluster, Failure


def trigger(cluster: Cluster, name: str) -> int:
    """A run of schedule `name` now: named like a slot (`<schedule>-<now, Unix seconds>`),
    with the schedule's labels and ownerReference, as its creator (admission checks what
    its template uses, as for any run). Refused while a run of the schedule is live unless
    its concurrencyPolicy is Allow: a trigger is never the way round Forbid."""
    schedule = cluster.get(SCHEDULE_PLURAL, name)
    if schedule is None:
        raise Failure(f"AgentRunSchedule {name} does not exist in namespace {cluster.namespace}")
    policy = (schedule.get("spec") or {}).get("concurrencyPolicy") or ConcurrencyPolicy.FORBID
    live = sorted(r["metadata"]["name"] for r in cluster.list_runs(f"{LABEL_SCHEDULE}={name}")
                  if belongs_to(schedule, r)
                  and (r.get("status") or {}).get("phase") not in Phase.TERMINAL)
    if live and policy != ConcurrencyPolicy.ALLOW:
        raise Failure(f"AgentRunSchedule {name} has a live run ({', '.join(live)}) and its "
                      f"concurrencyPolicy is {policy}: wait for it to settle, or cancel it "
                      f"(kubectl agentrun cancel {live[0]})", REFUSED)
    created = cluster.create_run(scheduled_run(schedule, int(time.time())))
    if created is None:
        raise Failure(f"a run of AgentRunSchedule {name} for this second exists already; "
                      "try again in a second")
    print(f"agentrun/{created['metadata']['name']} created (AgentRunSchedule {name}, now)")
    return OK

