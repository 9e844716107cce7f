"""When a settled run, and its pods, leave the API server.

batch/v1 Job's `ttlSecondsAfterFinished` is the model: a settled run is deleted that long
after it settled (`status.finishedAt`). The run's own `spec.ttlSecondsAfterFinished` wins;
else the installation's default (the chart's `runs.ttlSecondsAfterFinished`), applied here
and never written into the spec; neither: the run is kept. Its record stays in the store,
which serves it as history. Runner pods have a time to live of their own
(`--pod-ttl-after-finished`): pods hold logs, runs hold the answer, so pods may go first.

A trigger's run is kept at least its trigger's `dedupeWindowSeconds` after it was created,
whatever its time to live: a redelivery of its event within that window must find it (the
run's name is the deduplication), or it would start a second run.

Pure: the reconcile reads the facts, this says how long is left, the reconcile acts.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any

from agentrun.triggered import dedupe_window
from agentrun.vocabulary import LABEL_TRIGGER, TRIGGER_KIND


def run_ttl(spec: Mapping[str, Any],
            default: datetime.timedelta | None) -> datetime.timedelta | None:
    """How long a settled run is kept: its spec's ttlSecondsAfterFinished, else the
    installation's default; None: kept."""
    own = spec.get("ttlSecondsAfterFinished")
    if own is not None:
        return datetime.timedelta(seconds=int(own))
    return default


def settled_at(run: Mapping[str, Any]) -> datetime.datetime | None:
    """When the run settled: status.finishedAt, else (a status written without it) when
    it was created; None when neither can be read."""
    stamp = (run.get("status") or {}).get("finishedAt") or (
        run.get("metadata") or {}).get("creationTimestamp")
    if not stamp:
        return None
    return datetime.datetime.fromisoformat(str(stamp).replace("Z", "+00:00"))


def seconds_left(since: datetime.datetime | None, ttl: datetime.timedelta | None,
                 now: datetime.datetime) -> float | None:
    """Seconds until something settled at `since` with time to live `ttl` goes (zero or
    less: now); None: never (no time to live, or no time to count from)."""
    if ttl is None or since is None:
        return None
    return (since + ttl - now).total_seconds()


def dedupe_left(run: Mapping[str, Any], triggers: Mapping[tuple[str, str], Mapping[str, Any]],
                now: datetime.datetime) -> float | None:
    """Seconds until a trigger's run has been kept its trigger's dedupeWindowSeconds since
    it was created; None for a run that is no trigger's (its controller must be the
    trigger its label names: a run that only carries the label is not kept). A trigger not
    in `triggers` yet (a cache still filling) counts as the CRD's default window: deleting
    a trigger deletes its runs anyway, so only a run kept too long can come of it."""
    meta = run.get("metadata") or {}
    name = (meta.get("labels") or {}).get(LABEL_TRIGGER)
    created = meta.get("creationTimestamp")
    owner = next((o for o in meta.get("ownerReferences") or [] if o.get("controller")), None)
    if not name or not created or owner is None or owner.get("kind") != TRIGGER_KIND or \
            owner.get("name") != name:
        return None
    trigger = triggers.get((meta.get("namespace") or "", name))
    if trigger is not None and (trigger.get("metadata") or {}).get("uid") != owner.get("uid"):
        return None  # another trigger of that name, made since
    since = datetime.datetime.fromisoformat(str(created).replace("Z", "+00:00"))
    window = datetime.timedelta(seconds=dedupe_window(
        (trigger or {}).get("spec") or {}))
    return (since + window - now).total_seconds()


def at_least(left: float | None, floor: float | None) -> float | None:
    """A time to live `left` that may not end before `floor`; None (kept) stays None."""
    if left is None or floor is None:
        return left
    return max(left, floor)
