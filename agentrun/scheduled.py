"""A schedule's run: its name, labels, owner and spec, made from the AgentRunSchedule.

Shared by the operator (each slot's run) and `kubectl agentrun schedule trigger` (a run now,
named like a slot, so that it reads like any other run of the schedule). Standard library
only.

A slot's run is named `<schedule>-<slot time as Unix seconds>`: a restarted operator or a
second replica that tries to create it again is told it exists (409) and finds it.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any

from agentrun.vocabulary import (
    ANNOTATION_CREATED_BY,
    ANNOTATION_TEMPLATE_BY,
    API_VERSION,
    LABEL_SCHEDULE,
    RUN_KIND,
    SCHEDULE_KIND,
    Trigger,
)


def run_name(schedule: str, slot: datetime.datetime | int) -> str:
    """The run of `schedule`'s slot at `slot` (a time, or its Unix seconds)."""
    seconds = slot if isinstance(slot, int) else int(slot.timestamp())
    return f"{schedule}-{seconds}"


def slot_of(schedule: str, run: str) -> int | None:
    """The slot (Unix seconds) a run of `schedule` is named after, if it is."""
    prefix = f"{schedule}-"
    tail = run[len(prefix):] if run.startswith(prefix) else ""
    return int(tail) if tail.isdigit() else None


def scheduled_run(schedule: Mapping[str, Any], slot: datetime.datetime | int) -> dict[str, Any]:
    """The AgentRun of `schedule`'s slot: the template's metadata and spec, the label
    agentrun.dev/schedule, an ownerReference to the schedule (its controller: deleting the
    schedule deletes its runs, whose records the store keeps), trigger `schedule`, and as its
    creator (agentrun.dev/created-by) the user who last wrote the template."""
    meta, spec = schedule["metadata"], schedule.get("spec") or {}
    template = spec.get("runTemplate") or {}
    template_meta = template.get("metadata") or {}
    metadata: dict[str, Any] = {
        "name": run_name(meta["name"], slot),
        "namespace": meta["namespace"],
        "labels": {**(template_meta.get("labels") or {}), LABEL_SCHEDULE: meta["name"]},
        "ownerReferences": [{"apiVersion": API_VERSION, "kind": SCHEDULE_KIND,
                             "name": meta["name"], "uid": meta["uid"], "controller": True}],
    }
    # Who created the run is who last wrote the template (admission wrote it on the
    # schedule), never what the template says: the operator creates the run with its own
    # identity, which admission lets set agentrun.dev/created-by.
    annotations = {k: v for k, v in (template_meta.get("annotations") or {}).items()
                   if k != ANNOTATION_CREATED_BY}
    author = (meta.get("annotations") or {}).get(ANNOTATION_TEMPLATE_BY)
    if author:
        annotations[ANNOTATION_CREATED_BY] = author
    if annotations:
        metadata["annotations"] = annotations
    return {"apiVersion": API_VERSION, "kind": RUN_KIND, "metadata": metadata,
            "spec": {**(template.get("spec") or {}), "trigger": Trigger.SCHEDULE}}


def belongs_to(schedule: Mapping[str, Any], run: Mapping[str, Any]) -> bool:
    """Whether `run` is this schedule's own (its controller is the schedule's uid): a run
    of the same name that is not, is never taken for the slot's."""
    uid = schedule["metadata"]["uid"]
    return any(o.get("uid") == uid and o.get("controller")
               for o in (run.get("metadata") or {}).get("ownerReferences") or [])
