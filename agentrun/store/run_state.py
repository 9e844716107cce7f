"""What the operator reads of one run in one transaction, and what it writes to start an
attempt in one.

A sync of a run reads the store once (`run_state`: the run's row, the attempt's, and as
asked its approvals, ledger, answer and usage), and a start writes it once (`launch_attempt`: the
input snapshot and the run's row when launching, the session claim, the attempt's row):
one round trip where there were five or six, each of them a pool checkout and a
transaction of its own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from agentrun.ledger import LedgerEntry
from agentrun.store.approvals import Approval, approvals_on
from agentrun.store.engine import autocommit
from agentrun.store.inputs import put_input_on
from agentrun.store.ledger import UNREADABLE, counted_on, ledger_on
from agentrun.store.outcome import Result, Usage, result_on, usage_on
from agentrun.store.runs import (
    Attempt,
    Run,
    attempt_on,
    record_invocation_on,
    record_run_on,
    run_and_attempt_on,
    set_attempt_tools_on,
    settle_attempt_on,
    settle_counting_on,
    settle_on,
    settle_run_on,
    start_attempt_on,
    with_resumed_on,
)
from agentrun.store.sessions import SessionClaim, claim_session_on
from agentrun.vocabulary import RunStatus


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
    (`published`: ledger, answer and usage), or its usage alone (`usage`). Outside a
    transaction (each statement sees what is committed when it runs, as it would inside
    one at READ COMMITTED): no BEGIN and ROLLBACK around the reads."""
    async with autocommit(engine) as conn:
        return await run_state_on(conn, uid, attempt, previous=previous, approvals=approvals,
                                  published=published, usage=usage)


async def run_state_on(conn: AsyncConnection, uid: str, attempt: int, *,
                       previous: bool = False, approvals: bool = False,
                       published: bool = False, usage: bool = False) -> RunState:
    """run_state on `conn`, in the caller's transaction."""
    run, row = await run_and_attempt_on(conn, uid, attempt)
    return await _rest_on(conn, uid, attempt, RunState(
        run=run, attempt=row,
        approvals=tuple(await approvals_on(conn, uid)) if approvals else (),
        ledger=tuple(await ledger_on(conn, uid)) if published else None),
        previous=previous, published=published, usage=usage)


async def _rest_on(conn: AsyncConnection, uid: str, attempt: int, state: RunState, *,
                   previous: bool, published: bool, usage: bool) -> RunState:
    """`state` with the attempt before, the answer and the usage, as asked."""
    return dataclasses.replace(
        state,
        previous=await attempt_on(conn, uid, attempt - 1)
        if previous and attempt > 1 else None,
        result=await result_on(conn, uid) if published else None,
        usage=await usage_on(conn, uid) if published or usage else None)


async def settle_then_state(engine: AsyncEngine, uid: str, attempt: int, status: str,
                            reason: str | None, message: str | None, *, count: bool,
                            previous: bool = False, approvals: bool = False,
                            published: bool = False, usage: bool = False
                            ) -> RunState | None:
    """The fence, then what it leaves: attempt `attempt` settled (first writer wins; its
    tools counted when `count`, as settle_counting does, else none), then the run as
    run_state reads it. One transaction on one checkout, each row read once: the ledger
    and the approvals that count the tools are those the run then shows, the rows the
    settle writes come back from its own statements. Raises if the settle failed; None
    if only the read after it did (the fence stands).

    Anything in that transaction unreadable (an ADK table not there yet, say) rolls it
    back, and the careful path follows on the same connection: the settle with its count
    in a savepoint (the attempt settled, tools unknown, when the count cannot be read),
    committed, then the reads."""
    async with engine.connect() as conn:
        try:
            async with conn.begin():
                return await _settled_state_on(
                    conn, uid, attempt, status, reason, message, count=count,
                    previous=previous, approvals=approvals, published=published,
                    usage=usage)
        except UNREADABLE:
            if conn.invalidated:
                raise
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


async def _settled_state_on(conn: AsyncConnection, uid: str, attempt: int, status: str,
                            reason: str | None, message: str | None, *, count: bool,
                            previous: bool, approvals: bool, published: bool, usage: bool
                            ) -> RunState:
    """settle_then_state's one transaction, on `conn`: the attempt's row settled first (the
    row lock that fences the ledger), then the run's ledger, approvals and session read
    (the count), the tools written, the run's row settled."""
    ended = dict(status=status, reason=reason, message=message, finished_at=datetime.now(UTC))
    row = await settle_attempt_on(conn, uid, attempt, ended, tools=None if count else [])
    if row is None and await attempt_on(conn, uid, attempt) is not None:
        # Another writer settled it first: their account stands, read as it is.
        return await run_state_on(conn, uid, attempt, previous=previous,
                                  approvals=approvals, published=published, usage=usage)
    ledger = tuple(await ledger_on(conn, uid)) if count or published else None
    asked = tuple(await approvals_on(conn, uid)) if count or approvals else ()
    tools: list[str] | None = []
    if count:
        counted = await counted_on(conn, uid, attempt, ledger=ledger, row=row, waited={
            a.call_id for a in asked if a.attempt == attempt})
        tools = await with_resumed_on(conn, uid, counted)
        if row is not None:
            row = await set_attempt_tools_on(conn, uid, attempt, tools)
    run = await settle_run_on(conn, uid, attempt, ended, tools, won=row is not None)
    return await _rest_on(conn, uid, attempt, RunState(
        run=run, attempt=row, approvals=asked if approvals else (),
        ledger=ledger if published else None),
        previous=previous, published=published, usage=usage)


# A run that cannot be one of Kubernetes' (their uids are UUIDs): warm's, never committed.
_WARM_UID = "agentrun-warm-up"


async def warm(engine: AsyncEngine) -> bool:
    """Runs the statements of an eviction's sync once, on a run of its own written in a
    transaction that is rolled back: run_state's reads, then the fence with its count
    (the attempt's session events included) and what the run then shows
    (settle_then_state). SQLAlchemy compiles a statement's SQL the first time it runs and
    keeps it: without this, the first eviction after a start pays for that (20 ms of CPU
    for a settle that costs 8 once compiled, on a 2-core machine). Nothing is left in the
    store.

    Returns False when the session's events could not be read (ADK creates its tables
    when the first runner starts): the same sync then runs again without them, and the
    first eviction of a run that reached a model call compiles that one read. Raises
    what else the store raises."""
    try:
        await _warm(engine, invocation=True)
        return True
    except UNREADABLE:
        await _warm(engine, invocation=False)
        return False


async def _warm(engine: AsyncEngine, *, invocation: bool) -> None:
    async with engine.connect() as conn:
        transaction = await conn.begin()
        try:
            await record_run_on(conn, _WARM_UID, "agentrun-warm-up", "warm-up", "warm-up",
                                "warm-up", "warm-up", None)
            await start_attempt_on(conn, _WARM_UID, 1, "warm-up", "warm-up-1")
            if invocation:  # the runner records it before its first model call
                await record_invocation_on(conn, _WARM_UID, 1, "warm-up")
            await run_state_on(conn, _WARM_UID, 1, previous=True, approvals=True,
                               published=True, usage=True)
            await _settled_state_on(conn, _WARM_UID, 1, RunStatus.FAILED, None, None,
                                    count=True, previous=True, approvals=True,
                                    published=True, usage=True)
        finally:
            await transaction.rollback()


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
