"""`kubectl agentrun tools`: the ledger of each attempt of a run, published on the settled
run or read from the run store itself."""

from __future__ import annotations

import asyncio
from datetime import datetime
from pathlib import Path
from typing import Any

from agentrun.ledger import LedgerEntry
from agentrun.vocabulary import (
    ENV_DATABASE_URL,
    RUN_PLURAL,
    LedgerOutcome,
    Phase,
)
from agentrun_kubectl.cluster import ERROR, OK, Cluster, Failure


def tools(cluster: Cluster, run: str, database_url: str | None) -> int:
    """The ledger of each attempt of `run`: tool, when it was called, whether it answered:
    the run's published status.toolCalls, or the run store itself given `database_url`."""
    found = cluster.get(RUN_PLURAL, run)
    if found is None:
        raise Failure(f"AgentRun {run} does not exist in namespace {cluster.namespace}")
    status = found.get("status") or {}
    if database_url:
        _check_store(database_url)
        entries = asyncio.run(_ledger(database_url, found["metadata"]["uid"]))
    elif "toolCalls" in status:
        entries = [_published(c) for c in status["toolCalls"]]
    elif status.get("phase") in Phase.TERMINAL:
        raise Failure(f"AgentRun {run} has no published ledger (status.toolCalls): the run "
                      "store could not be read when it settled, or an older operator settled "
                      f"it. Set {ENV_DATABASE_URL} to read the store.")
    else:
        raise Failure(f"AgentRun {run} is {status.get('phase') or 'Pending'}: its ledger is "
                      "published on the run when it settles. To see the calls of a run still "
                      f"going, set {ENV_DATABASE_URL} to the run store.", code=ERROR)
    told = status.get("toolsExecuted")
    if status.get("phase") in Phase.TERMINAL:
        summary = "unknown" if told is None else ", ".join(told) or "none"
    else:
        summary = "not settled yet (the ledger below is what was called so far)"
    print(f"AgentRun {run}: {status.get('phase', 'Pending')}"
          + (f" ({status['reason']})" if status.get("reason") else "")
          + f", attempts {status.get('attempts', 0)}, toolsExecuted: {summary}")
    if not entries:
        print("  no tool call in the ledger")
        return OK
    omitted = status.get("toolCallsOmitted") if not database_url else None
    rows = [("ATTEMPT", "#", "TOOL", "EFFECT", "KEY", "CALLED AT", "ENDED")]
    for e in entries:
        rows.append((str(e.attempt), str(e.seq), e.tool, e.effect or "-",
                     (e.idempotency_key or "-")[:18], _stamp(e.started_at), _ended(e)))
    widths = [max(len(r[i]) for r in rows) for i in range(6)]
    for r in rows:
        print("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)) + "  " + r[6])
    if omitted:
        print(f"  ... and {omitted} more calls (the run store keeps them all)")
    return OK


def _published(call: dict[str, Any]) -> LedgerEntry:
    """A status.toolCalls entry, as the store's ledger row it was published from."""
    def when(value: str | None) -> datetime | None:
        return datetime.fromisoformat(value.replace("Z", "+00:00")) if value else None

    return LedgerEntry(
        attempt=int(call["attempt"]), seq=int(call["seq"]), tool=call["tool"], call_id=None,
        args_digest="", started_at=when(call.get("calledAt")) or datetime.min,
        finished_at=when(call.get("endedAt")), outcome=call.get("outcome"),
        effect=call.get("effect"), idempotency_key=call.get("idempotencyKey"))


def _ended(entry: LedgerEntry) -> str:
    """How a call ended: it ran (and how), it was answered from the journal (it ran in an
    earlier attempt, and a resume did not run it again), or nobody knows (in doubt)."""
    if entry.outcome == LedgerOutcome.JOURNAL:
        return "answered from the journal (not run again)"
    if entry.outcome == LedgerOutcome.DENIED:
        return "denied by its approver (never run)"
    if entry.finished_at is None:
        return "no (called, never answered): in doubt"
    return f"ran: {entry.outcome or 'ok'} at {_stamp(entry.finished_at)}"


async def _ledger(url: str, uid: str) -> list[LedgerEntry]:
    from agentrun import store

    engine = store.make_engine(url, pool_size=1, max_overflow=0)
    try:
        return await store.ledger(engine, uid)
    finally:
        await engine.dispose()


def _check_store(url: str) -> None:
    """Reading the store itself needs its database layer: agentrun[kubectl,store]."""
    try:
        from sqlalchemy.engine import make_url
    except ModuleNotFoundError as e:
        raise Failure(f"{ENV_DATABASE_URL} reads the run store, which needs the store's "
                      f"database layer ({e.name} is not installed): pip install "
                      "'agentrun[kubectl,store]', or unset it to read status.toolCalls "
                      "from the API server") from e
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite" and not Path(parsed.database or "").exists():
        raise Failure(f"no run store at {parsed.database}: set {ENV_DATABASE_URL} to the "
                      "operator's store (postgresql+psycopg://... or sqlite:///path)")


def _stamp(value: Any) -> str:
    return value.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z" if value else "-"

