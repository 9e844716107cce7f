"""When a settled run, and its pods, leave the API server.

batch/v1 Job's `ttlSecondsAfterFinished` is the model: a settled run is deleted that long
after it settled (`status.finishedAt`). The run's own `spec.ttlSecondsAfterFinished` wins;
else the installation's default (the chart's `runs.ttlSecondsAfterFinished`), applied here
and never written into the spec; neither: the run is kept. Its record stays in the store,
which serves it as history. Runner pods have a time to live of their own
(`--pod-ttl-after-finished`): pods hold logs, runs hold the answer, so pods may go first.

Pure: the reconcile reads the facts, this says how long is left, the reconcile acts.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any


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
