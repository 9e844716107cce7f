"""What each page of the console shows, made from what the API server answered: pure
functions from objects (AgentRuns, AgentRunReplays, schedules, triggers, RunRecords) to
the rows the pages draw. No I/O here; `server.py` reads, these shape."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from agentrun.vocabulary import (
    ANNOTATION_CREATED_BY,
    ANNOTATION_FORCE_REPLAY,
    LABEL_REPLAY_OF,
    Condition,
    Phase,
)


def _conditions(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c.get("type"): c for c in (obj.get("status") or {}).get("conditions") or []}


def queue(run: dict[str, Any]) -> dict[str, Any] | None:
    """Where a run stands in its Kueue queue (the `Admitted` condition): None when the run
    is not queued by Kueue at all."""
    admitted = _conditions(run).get(Condition.ADMITTED)
    queue_name = ((run.get("metadata") or {}).get("labels") or {}).get(
        "kueue.x-k8s.io/queue-name")
    if admitted is None and queue_name is None:
        return None
    return {"queue": queue_name, "admitted": (admitted or {}).get("status"),
            "reason": (admitted or {}).get("reason"), "message": (admitted or {}).get("message")}


def run_row(run: dict[str, Any]) -> dict[str, Any]:
    """One line of the runs page."""
    meta, spec, status = run["metadata"], run.get("spec") or {}, run.get("status") or {}
    usage = status.get("usage") or {}
    return {
        "namespace": meta["namespace"], "name": meta["name"], "uid": meta.get("uid"),
        "agent": spec.get("agent"), "phase": status.get("phase") or Phase.PENDING,
        "reason": status.get("reason"), "message": status.get("message"),
        "toolsExecuted": status.get("toolsExecuted"), "attempts": status.get("attempts", 0),
        "costMicroUSD": usage.get("costMicroUSD"), "usage": usage or None,
        "live": (status.get("phase") or Phase.PENDING) in Phase.LIVE,
        "queue": queue(run), "created": meta.get("creationTimestamp"),
        "createdBy": (meta.get("annotations") or {}).get(ANNOTATION_CREATED_BY),
        "replayOf": spec.get("replayOf") or (meta.get("labels") or {}).get(LABEL_REPLAY_OF),
        "pendingApproval": status.get("pendingApproval"),
    }


def run_page(run: dict[str, Any], replays: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """A run's page: its row, its whole status, its calls (status.toolCalls: effect, key,
    outcome) and the replays of it with their decisions in the operator's own words."""
    status = run.get("status") or {}
    name = run["metadata"]["name"]
    return {
        **run_row(run),
        "spec": run.get("spec") or {},
        "conditions": status.get("conditions") or [],
        "result": status.get("result"),
        "calls": status.get("toolCalls"),
        "callsOmitted": status.get("toolCallsOmitted"),
        "replays": sorted((replay_row(r) for r in replays if
                           (r.get("spec") or {}).get("runName") == name),
                          key=lambda r: r["created"] or "", reverse=True),
    }


def replay_row(replay: dict[str, Any]) -> dict[str, Any]:
    meta, spec, status = replay["metadata"], replay.get("spec") or {}, replay.get("status") or {}
    return {
        "name": meta["name"], "created": meta.get("creationTimestamp"),
        "resume": bool(spec.get("resume")), "note": spec.get("note"),
        "forced": (meta.get("annotations") or {}).get(ANNOTATION_FORCE_REPLAY) == "true",
        "phase": status.get("phase"), "reason": status.get("reason"),
        "message": status.get("message"), "toolsExecuted": status.get("toolsExecuted",
                                                                     "unset"),
        "replayRunName": status.get("replayRunName"), "decidedAt": status.get("decidedAt"),
    }


def _last(runs: list[dict[str, Any]]) -> dict[str, Any] | None:
    if not runs:
        return None
    newest = max(runs, key=lambda r: r["metadata"].get("creationTimestamp") or "")
    return {"name": newest["metadata"]["name"],
            "phase": (newest.get("status") or {}).get("phase") or Phase.PENDING,
            "created": newest["metadata"].get("creationTimestamp")}


def _ready(obj: dict[str, Any]) -> dict[str, Any] | None:
    ready = _conditions(obj).get(Condition.READY) or _conditions(obj).get(Condition.STALLED)
    return None if ready is None else {k: ready.get(k) for k in
                                       ("type", "status", "reason", "message")}


def schedule_row(schedule: dict[str, Any], runs: list[dict[str, Any]]) -> dict[str, Any]:
    """A schedule with its last run (the newest of its runs still in the API server) and
    its next slot (status.nextScheduleTime)."""
    meta, spec, status = (schedule["metadata"], schedule.get("spec") or {},
                          schedule.get("status") or {})
    return {
        "namespace": meta["namespace"], "name": meta["name"],
        "schedule": spec.get("schedule"), "timeZone": spec.get("timeZone") or "UTC",
        "suspend": bool(spec.get("suspend")),
        "concurrencyPolicy": spec.get("concurrencyPolicy"),
        "agent": ((spec.get("runTemplate") or {}).get("spec") or {}).get("agent"),
        "lastScheduleTime": status.get("lastScheduleTime"),
        "lastSuccessfulTime": status.get("lastSuccessfulTime"),
        "next": status.get("nextScheduleTime"), "active": status.get("active") or [],
        "skipped": status.get("skipped", 0), "missed": status.get("missed", 0),
        "lastRun": _last(runs), "condition": _ready(schedule),
    }


def trigger_row(trigger: dict[str, Any], runs: list[dict[str, Any]]) -> dict[str, Any]:
    """A trigger with its last run and what its receiver counted. Its next run is the next
    event's: there is no time to show."""
    meta, spec, status = (trigger["metadata"], trigger.get("spec") or {},
                          trigger.get("status") or {})
    return {
        "namespace": meta["namespace"], "name": meta["name"],
        "suspend": bool(spec.get("suspend")),
        "agent": ((spec.get("runTemplate") or {}).get("spec") or {}).get("agent"),
        "url": status.get("url"), "received": status.get("received", 0),
        "duplicates": status.get("duplicates", 0),
        "lastEventTime": status.get("lastEventTime"), "lastRun": _last(runs),
        "condition": _ready(trigger),
    }


def _day(stamp: str | None) -> str | None:
    if not stamp:
        return None
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).astimezone(UTC).strftime(
            "%Y-%m-%d")
    except ValueError:
        return None


def cost_series(records: Iterable[dict[str, Any]], *, days: int, now: datetime
                ) -> dict[str, Any]:
    """Cost per (namespace, agent) per day over the last `days` days, from the run
    archive's RunRecords (runs.store.agentrun.dev: runs deleted by their TTL count too),
    each run on the day it was created. Runs whose model has no price are counted apart:
    their cost is unknown, never zero."""
    labels = [(now - timedelta(days=days - 1 - i)).astimezone(UTC).strftime("%Y-%m-%d")
              for i in range(days)]
    index = {day: i for i, day in enumerate(labels)}
    cost: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0] * days)
    unpriced: dict[tuple[str, str], int] = defaultdict(int)
    runs: dict[tuple[str, str], int] = defaultdict(int)
    for record in records:
        day = _day((record.get("metadata") or {}).get("creationTimestamp"))
        if day not in index:
            continue
        key = (record["metadata"].get("namespace") or "",
               (record.get("spec") or {}).get("agent") or "")
        runs[key] += 1
        spent = ((record.get("status") or {}).get("usage") or {}).get("costMicroUSD")
        if spent is None:
            unpriced[key] += 1
            cost[key]
        else:
            cost[key][index[day]] += int(spent)
    series = [{"namespace": ns, "agent": agent, "costMicroUSD": values,
               "totalMicroUSD": sum(values), "runs": runs[(ns, agent)],
               "unpricedRuns": unpriced[(ns, agent)]}
              for (ns, agent), values in sorted(cost.items())]
    return {"days": labels, "series": series}
