"""What the operator reads of one run in one transaction, and what it writes to start an
attempt in one.

A sync of a run reads the store once (`run_state`: the run's row, the attempt's, and as
asked its approvals, ledger, answer and usage), and a start writes it once (`launch_attempt`: the
input snapshot and the run's row when launching, the session claim, the attempt's row):
one round trip where there were five or six, each of them a pool checkout and a
transaction of its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from agentrun.ledger import LedgerEntry
from agentrun.store.approvals import Approval, approvals_on
from agentrun.store.inputs import put_input_on
from agentrun.store.ledger import ledger_on
from agentrun.store.outcome import Result, Usage, result_on, usage_on
from agentrun.store.runs import (
    Attempt,
    Run,
    attempt_on,
    record_run_on,
    run_on,
    settle_counting_on,
    settle_on,
    start_attempt_on,
)
from agentrun.store.sessions import SessionClaim, claim_session_on


@dataclass(frozen=True)
class RunState:
    """One run as the store holds it. Parts not asked for are None (approvals: empty)."""

    run: Run | None
    attempt: Attempt | None  # the attempt asked about, with the runner's own outcome
    previous: Attempt | None = None  # the attempt before it, when asked
    approvals: tuple[Approval, ...] = ()
    ledger: tuple[LedgerEntry, ...] | None = None
    result: Result | None = None
    usage: Usage | None = None


async def run_state(engine: AsyncEngine, uid: str, attempt: int, *, previous: bool = False,
                    approvals: bool = False, published: bool = False,
                    usage: bool = False) -> RunState:
    """Run `uid` and its attempt `attempt`, and as asked: the attempt before (`previous`),
    its calls that waited for a decision (`approvals`), what a settled run publishes
    (`published`: ledger, answer and usage), or its usage alone (`usage`)."""
    async with engine.connect() as conn:
        return await run_state_on(conn, uid, attempt, previous=previous, approvals=approvals,
                                  published=published, usage=usage)


async def run_state_on(conn: AsyncConnection, uid: str, attempt: int, *,
                       previous: bool = False, approvals: bool = False,
                       published: bool = False, usage: bool = False) -> RunState:
    """run_state on `conn`, in the caller's transaction."""
    return RunState(
        run=await run_on(conn, uid),
        attempt=await attempt_on(conn, uid, attempt),
        previous=await attempt_on(conn, uid, attempt - 1)
        if previous and attempt > 1 else None,
        approvals=tuple(await approvals_on(conn, uid)) if approvals else (),
        ledger=tuple(await ledger_on(conn, uid)) if published else None,
        result=await result_on(conn, uid) if published else None,
        usage=await usage_on(conn, uid) if published or usage else None)


async def settle_then_state(engine: AsyncEngine, uid: str, attempt: int, status: str,
                            reason: str | None, message: str | None, *, count: bool,
                            previous: bool = False, approvals: bool = False,
                            published: bool = False, usage: bool = False
                            ) -> RunState | None:
    """The fence, then what it leaves, on one connection: attempt `attempt` settled (first
    writer wins; its tools counted when `count`, as settle_counting does, else none) and
    committed, then the run as run_state reads it. One checkout where an eviction took two
    before its status could be written. Raises if the settle failed; None if only the
    read after it did (the fence stands)."""
    async with engine.connect() as conn:
        async with conn.begin():
            if count:
                await settle_counting_on(conn, uid, attempt, status, reason, message)
            else:
                await settle_on(conn, uid, attempt, status, reason, message, [])
        try:
            return await run_state_on(conn, uid, attempt, previous=previous,
                                      approvals=approvals, published=published, usage=usage)
        except Exception:  # the caller reads again, and knows it does not know
            return None


@dataclass(frozen=True)
class Snapshot:
    """An input to write down with the run: its digest (inputs.input_digest), text, files."""

    digest: str
    text: str
    files: Mapping[str, bytes]


async def launch_attempt(engine: AsyncEngine, uid: str, attempt: int, session_id: str,
                         pod_name: str, *, namespace: str, agent: str, user_id: str,
                         resumes_attempt: int | None = None,
                         resumes_run_uid: str | None = None,
                         record: Mapping[str, Any] | None = None,
                         snapshot: Snapshot | None = None) -> SessionClaim:
    """Starts attempt `attempt` of run `uid` in one transaction: first, when launching,
    its input `snapshot` and its row (`record`: record_run's arguments after the engine);
    then the claim of its session, and, only when granted, the attempt's row
    (start_attempt). A refused claim still leaves the run written down."""
    async with engine.begin() as conn:
        await _record_on(conn, record, snapshot)
        claim = await claim_session_on(conn, namespace=namespace, session_id=session_id,
                                       agent=agent, user_id=user_id, run_uid=uid)
        if claim.granted:
            await start_attempt_on(conn, uid, attempt, session_id, pod_name, resumes_attempt,
                                   resumes_run_uid)
        return claim


async def record_launch(engine: AsyncEngine, record: Mapping[str, Any],
                        snapshot: Snapshot | None = None) -> None:
    """Writes a run down (`record`: record_run's arguments after the engine) with its input
    `snapshot`, in one transaction: a launch refused before its attempt starts."""
    async with engine.begin() as conn:
        await _record_on(conn, record, snapshot)


async def _record_on(conn: AsyncConnection, record: Mapping[str, Any] | None,
                     snapshot: Snapshot | None) -> None:
    if snapshot is not None:
        await put_input_on(conn, snapshot.digest, snapshot.text, snapshot.files)
    if record is not None:
        await record_run_on(conn, **record)
