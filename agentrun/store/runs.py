"""Runs and their attempts: written down before anything runs, settled exactly once.

Who writes what:
- the operator: `record_run` (before the pod), `start_attempt` (before each pod), and
  `settle` when the attempt ends (first writer wins);
- the runner: `begin_attempt` and `record_invocation` (which ADK session and turn this
  attempt uses, so that `tools_executed` can read it back), then `record_outcome`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import and_, bindparam, case, or_, select, update
from sqlalchemy.engine import Row
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from agentrun.attempt import AttemptIdentity
from agentrun.store.dialect import upsert_insert
from agentrun.store.engine import autocommit
from agentrun.store.ledger import UNREADABLE, AttemptSettled, Counted, counted_on
from agentrun.store.schema import attempts, runs
from agentrun.store.sessions import session_app
from agentrun.vocabulary import RunStatus


class RunNotRecorded(LookupError):
    """An attempt was started for a run uid the store has never seen."""


class InvocationRecorded(RuntimeError):
    """The attempt's invocation was recorded already, as another one."""


@dataclass(frozen=True)
class Run:
    uid: str
    namespace: str
    name: str
    agent: str
    trigger: str
    user_id: str
    input_digest: str | None
    replay_of: str | None
    status: str
    reason: str | None
    message: str | None
    attempts: int
    tools_executed: list[str] | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    # The Agent snapshot the run pinned (agent_snapshots); None: an image agent.
    agent_digest: str | None = None
    # The AgentRun's spec, labels and annotations when it was launched.
    spec: dict[str, Any] | None = None
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None


@dataclass(frozen=True)
class Outcome:
    """What the runner itself reported at the end of an attempt."""

    status: str  # RunStatus.SUCCEEDED or RunStatus.FAILED
    reason: str | None
    message: str | None
    recorded_at: datetime | None


@dataclass(frozen=True)
class Attempt:
    run_uid: str
    attempt: int
    pod_name: str | None
    pod_uid: str | None
    resumes_attempt: int | None
    resumes_run_uid: str | None
    app_name: str | None
    user_id: str | None
    session_id: str | None
    invocation_id: str | None
    status: str
    reason: str | None
    message: str | None
    tools_executed: list[str] | None
    outcome: Outcome | None
    started_at: datetime | None
    runner_started_at: datetime | None
    finished_at: datetime | None


def _now() -> datetime:
    return datetime.now(UTC)


def _run(row: Any) -> Run:  # a Row, or _Columns
    return Run(
        uid=row.uid, namespace=row.namespace, name=row.name, agent=row.agent,
        trigger=row.trigger, user_id=row.user_id, input_digest=row.input_digest,
        replay_of=row.replay_of, status=row.status, reason=row.reason, message=row.message,
        attempts=row.attempts, tools_executed=row.tools_executed, created_at=row.created_at,
        started_at=row.started_at, finished_at=row.finished_at,
        agent_digest=row.agent_digest, spec=row.spec, labels=row.labels,
        annotations=row.annotations,
    )


def _outcome(row: Any) -> Outcome | None:
    if row.outcome_status is None:
        return None
    return Outcome(
        status=row.outcome_status, reason=row.outcome_reason,
        message=row.outcome_message, recorded_at=row.outcome_at,
    )


def _attempt(row: Any) -> Attempt:  # a Row, or _Columns
    return Attempt(
        run_uid=row.run_uid, attempt=row.attempt, pod_name=row.pod_name,
        pod_uid=row.pod_uid, resumes_attempt=row.resumes_attempt,
        resumes_run_uid=row.resumes_run_uid, app_name=row.app_name,
        user_id=row.user_id, session_id=row.session_id,
        invocation_id=row.invocation_id, status=row.status, reason=row.reason,
        message=row.message, tools_executed=row.tools_executed, outcome=_outcome(row),
        started_at=row.started_at, runner_started_at=row.runner_started_at,
        finished_at=row.finished_at,
    )


def _attempt_key(uid: str, attempt: int) -> list[Any]:
    return [attempts.c.run_uid == uid, attempts.c.attempt == attempt]


# The statements every sync that reads the store and every fence run, built once with
# their values as named parameters: SQLAlchemy otherwise builds each again on every call
# and computes its cache key (about a third of the CPU such a statement costs the
# operator). `_ENDED` are the parameters of an end (status, reason, message, finished_at).
_KEY = [attempts.c.run_uid == bindparam("p_uid"), attempts.c.attempt == bindparam("p_attempt")]
_ENDED: dict[str, Any] = {
    name: bindparam(f"p_{name}") for name in ("status", "reason", "message", "finished_at")}
_RUN = select(runs).where(runs.c.uid == bindparam("p_uid"))
_ATTEMPT = select(attempts).where(*_KEY)
_SETTLE_ATTEMPT = update(attempts).where(*_KEY, attempts.c.status.in_(RunStatus.LIVE)).values(
    tools_executed=bindparam("p_tools"), **_ENDED).returning(*attempts.c)
_SET_ATTEMPT_TOOLS = update(attempts).where(*_KEY).values(
    tools_executed=bindparam("p_tools")).returning(*attempts.c)
_SETTLE_RUN = update(runs).where(
    runs.c.uid == bindparam("p_uid"), runs.c.attempts <= bindparam("p_attempt"),
    runs.c.status.in_(RunStatus.LIVE),
).values(attempts=bindparam("p_attempt"), updated_at=bindparam("p_finished_at"),
         tools_executed=bindparam("p_tools"), **_ENDED)
_SETTLE_RUN_RETURNING = _SETTLE_RUN.returning(*runs.c)
# The run's row and one attempt's in one statement: each joined to a one-row key, so
# either may be missing, as with two reads.
_KEYED = select(bindparam("p_uid", type_=runs.c.uid.type).label("uid")).subquery("keyed")
_RUN_AND_ATTEMPT = select(*runs.c, *attempts.c).select_from(
    _KEYED.outerjoin(runs, runs.c.uid == _KEYED.c.uid).outerjoin(attempts, and_(
        attempts.c.run_uid == _KEYED.c.uid, attempts.c.attempt == bindparam("p_attempt"))))


class _Columns:
    """One table's part of a row that joined several, by the table's own column names."""

    __slots__ = ("_mapping", "_table")

    def __init__(self, row: Row[Any], table: Any) -> None:
        self._mapping, self._table = row._mapping, table

    def __getattr__(self, name: str) -> Any:
        return self._mapping[self._table.c[name]]


def _ended(uid: str, attempt: int, ended: Mapping[str, Any], tools: list[str] | None
           ) -> dict[str, Any]:
    """The parameters of _SETTLE_ATTEMPT and _SETTLE_RUN."""
    return {"p_uid": uid, "p_attempt": attempt, "p_tools": tools,
            **{f"p_{name}": ended[name] for name in _ENDED}}


async def record_run(
    engine: AsyncEngine,
    uid: str,
    namespace: str,
    name: str,
    agent: str,
    trigger: str,
    user_id: str,
    input_digest: str | None,
    replay_of: str | None = None,
    agent_digest: str | None = None,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    spec: Mapping[str, Any] | None = None,
) -> bool:
    """Writes the run down (status pending), with the Agent snapshot it pinned, if it names
    an Agent, and the AgentRun's spec, labels and annotations (kept for its history, and
    for a replay once the AgentRun is deleted). Idempotent:
    an operator that restarts and records the same uid again changes nothing (the first
    record's snapshot stands). Returns whether the row was new."""
    async with engine.begin() as conn:
        return await record_run_on(
            conn, uid, namespace, name, agent, trigger, user_id, input_digest,
            replay_of=replay_of, agent_digest=agent_digest, labels=labels,
            annotations=annotations, spec=spec)


async def record_run_on(
    conn: AsyncConnection,
    uid: str,
    namespace: str,
    name: str,
    agent: str,
    trigger: str,
    user_id: str,
    input_digest: str | None,
    replay_of: str | None = None,
    agent_digest: str | None = None,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    spec: Mapping[str, Any] | None = None,
) -> bool:
    """record_run, on `conn` (a launch writes the run and its first attempt together)."""
    now = _now()
    result = await conn.execute(
        upsert_insert(conn, runs)
        .values(
            uid=uid, namespace=namespace, name=name, agent=agent, trigger=trigger,
            user_id=user_id, input_digest=input_digest, replay_of=replay_of,
            agent_digest=agent_digest, status=RunStatus.PENDING, attempts=0,
            created_at=now, updated_at=now,
            spec=dict(spec) if spec else None,
            labels=dict(labels) if labels else None,
            annotations=dict(annotations) if annotations else None,
        )
        .on_conflict_do_nothing()
        .returning(runs.c.uid)
    )
    return result.first() is not None


async def start_attempt(
    engine: AsyncEngine, uid: str, attempt: int, session_id: str, pod_name: str,
    resumes_attempt: int | None = None, resumes_run_uid: str | None = None,
) -> None:
    """Writes attempt `attempt` down before its pod is created, and marks the run running.

    Idempotent. Starting an attempt that was already settled changes nothing, and an
    older attempt never takes the run back from a newer one.
    """
    async with engine.begin() as conn:
        await start_attempt_on(conn, uid, attempt, session_id, pod_name, resumes_attempt,
                               resumes_run_uid)


async def start_attempt_on(
    conn: AsyncConnection, uid: str, attempt: int, session_id: str, pod_name: str,
    resumes_attempt: int | None = None, resumes_run_uid: str | None = None,
) -> None:
    """start_attempt, on `conn`."""
    now = _now()
    run = (
        await conn.execute(
            select(runs.c.namespace, runs.c.agent, runs.c.user_id).where(runs.c.uid == uid))
    ).one_or_none()
    if run is None:
        raise RunNotRecorded(f"run {uid} was never recorded (record_run first)")
    await conn.execute(
        upsert_insert(conn, attempts)
        .values(
            run_uid=uid, attempt=attempt, pod_name=pod_name,
            app_name=session_app(run.namespace, run.agent),
            user_id=run.user_id, session_id=session_id, status=RunStatus.PENDING,
            started_at=now, resumes_attempt=resumes_attempt,
            resumes_run_uid=resumes_run_uid,
        )
        .on_conflict_do_nothing()
    )
    await conn.execute(
        update(runs)
        .where(
            runs.c.uid == uid,
            or_(
                runs.c.attempts < attempt,
                and_(runs.c.attempts == attempt, runs.c.status == RunStatus.PENDING),
            ),
        )
        .values(
            attempts=attempt, status=RunStatus.RUNNING, reason=None, message=None,
            tools_executed=None, finished_at=None,
            started_at=case((runs.c.started_at.is_(None), now), else_=runs.c.started_at),
            updated_at=now,
        )
    )


async def record_pod(engine: AsyncEngine, uid: str, attempt: int, pod_uid: str) -> None:
    """The attempt's pod exists (created, or found ours after a lost answer): one
    statement, committed by itself."""
    async with autocommit(engine) as conn:
        await conn.execute(
            update(attempts).where(*_attempt_key(uid, attempt), attempts.c.pod_uid.is_(None))
            .values(pod_uid=pod_uid))


async def begin_attempt(
    engine: AsyncEngine, uid: str, attempt: int, app_name: str, user_id: str, session_id: str
) -> None:
    """The runner's first write (through the store API, which passes the values the
    operator recorded): which ADK session this attempt uses. Creates the attempt row when
    no operator did (store tests)."""
    now = _now()
    async with engine.begin() as conn:
        stmt = upsert_insert(conn, attempts).values(
            run_uid=uid, attempt=attempt, app_name=app_name, user_id=user_id,
            session_id=session_id, status=RunStatus.RUNNING, runner_started_at=now,
        )
        await conn.execute(
            stmt.on_conflict_do_update(
                index_elements=[attempts.c.run_uid, attempts.c.attempt],
                set_={
                    "app_name": app_name,
                    "user_id": user_id,
                    "session_id": session_id,
                    "runner_started_at": now,
                    "status": case(
                        (attempts.c.status == RunStatus.PENDING, RunStatus.RUNNING),
                        else_=attempts.c.status,
                    ),
                },
            )
        )


async def record_invocation(
    engine: AsyncEngine, uid: str, attempt: int, invocation_id: str
) -> None:
    """Records the ADK invocation of this attempt's turn, before its first model call:
    only that invocation's session events belong to this attempt. Written once: a second
    invocation could otherwise re-point which session events count for the attempt."""
    async with engine.begin() as conn:
        await record_invocation_on(conn, uid, attempt, invocation_id)


async def record_invocation_on(conn: AsyncConnection, uid: str, attempt: int,
                               invocation_id: str) -> None:
    """record_invocation, in the caller's transaction."""
    result = await conn.execute(
        update(attempts).where(
            *_attempt_key(uid, attempt),
            or_(attempts.c.invocation_id.is_(None), attempts.c.invocation_id == invocation_id),
        ).values(invocation_id=invocation_id)
    )
    if result.rowcount == 1:
        return
    found = (await conn.execute(
        select(attempts.c.invocation_id).where(*_attempt_key(uid, attempt))
    )).one_or_none()
    if found is None:
        raise RunNotRecorded(f"attempt {attempt} of run {uid} was never begun")
    raise InvocationRecorded(f"attempt {attempt} of run {uid} already recorded invocation "
                             f"{found.invocation_id}; its session events are that turn's")


async def record_outcome(
    engine: AsyncEngine,
    uid: str,
    attempt: int,
    status: str,
    reason: str | None = None,
    message: str | None = None,
) -> bool:
    """The runner's last write: how the attempt ended as the runner saw it
    (RunStatus.SUCCEEDED, or RunStatus.FAILED with a vocabulary.Reason and a message).
    Only the first report counts; returns whether this one did."""
    async with engine.begin() as conn:
        result = await conn.execute(
            update(attempts)
            .where(*_attempt_key(uid, attempt), attempts.c.outcome_status.is_(None))
            .values(
                outcome_status=status, outcome_reason=reason, outcome_message=message,
                outcome_at=_now(),
            )
        )
    return result.rowcount == 1


async def get_outcome(engine: AsyncEngine, uid: str, attempt: int) -> Outcome | None:
    """What the runner reported for this attempt, or None if it reported nothing."""
    async with autocommit(engine) as conn:
        result = await conn.execute(select(attempts).where(*_attempt_key(uid, attempt)))
        row = result.one_or_none()
    return None if row is None else _outcome(row)


async def settle(
    engine: AsyncEngine,
    uid: str,
    attempt: int,
    status: str,
    reason: str | None,
    message: str | None,
    tools_executed: Sequence[str] | None,
) -> bool:
    """Settles an attempt, and the run if this is its current attempt. First writer wins.

    Updates only rows still pending or running, so that a second operator replica or a
    late pod event cannot overwrite an outcome; returns whether this call settled it.
    `tools_executed` None means unknown (fill it later with `set_tools_executed`).
    """
    tools = None if tools_executed is None else list(tools_executed)
    async with engine.begin() as conn:
        return await settle_on(conn, uid, attempt, status, reason, message, tools)


@dataclass(frozen=True)
class Settled:
    """What `settle_counting` did: whether it settled the attempt, and its tools."""

    won: bool
    tools_executed: list[str] | None


async def settle_counting(
    engine: AsyncEngine,
    uid: str,
    attempt: int,
    status: str,
    reason: str | None,
    message: str | None,
) -> Settled:
    """Settles an attempt and counts its tools in one transaction: the fence.

    The attempt is marked settled first (a row lock); only then are the ledger and the
    session read. A runner still alive in its grace period cannot start another tool
    after this (open_call sees the attempt settled and refuses), and every call it
    started before is counted. If the records cannot be read, the attempt is still
    settled, with tools unknown (None). Returns Settled(won=False, None) when someone
    else settled the attempt first.
    """
    async with engine.begin() as conn:
        return await settle_counting_on(conn, uid, attempt, status, reason, message)


async def settle_counting_on(conn: AsyncConnection, uid: str, attempt: int, status: str,
                             reason: str | None, message: str | None) -> Settled:
    """settle_counting on `conn`, in the caller's transaction."""
    if not await settle_on(conn, uid, attempt, status, reason, message, None):
        return Settled(False, None)
    tools: list[str] | None
    try:
        async with conn.begin_nested():
            tools = await with_resumed_on(conn, uid, await counted_on(conn, uid, attempt))
    except UNREADABLE:
        tools = None
    if tools is not None:
        await conn.execute(
            update(attempts).where(*_attempt_key(uid, attempt)).values(tools_executed=tools)
        )
        await conn.execute(
            update(runs)
            .where(runs.c.uid == uid, runs.c.attempts == attempt)
            .values(tools_executed=tools)
        )
    return Settled(True, tools)


async def with_resumed_on(conn: AsyncConnection, uid: str, counted: Counted
                          ) -> list[str] | None:
    """The tools an attempt's end publishes: its own calls, after those of the attempt it
    resumed (the run's toolsExecuted is every call that really ran, across them); None
    when the resumed attempt's are unknown. (No attempt row: refused before its pod,
    nothing resumed. A replay run resuming its original's fork counts only its own.)"""
    resumed, elsewhere = counted.resumes_attempt, counted.resumes_run_uid
    if resumed is None or elsewhere is not None:
        return counted.tools
    before = (await conn.execute(
        select(attempts.c.tools_executed).where(*_attempt_key(uid, resumed))
    )).scalar_one_or_none()
    return None if before is None else [*before, *counted.tools]


async def settle_on(
    conn: AsyncConnection,
    uid: str,
    attempt: int,
    status: str,
    reason: str | None,
    message: str | None,
    tools: list[str] | None,
) -> bool:
    ended = dict(status=status, reason=reason, message=message, finished_at=_now())
    # The live attempt's row is settled (the common case: one statement); when none was
    # settled, whether the row exists says if another writer won or no attempt was ever
    # written down (a run refused before its pod: the run's row alone).
    won = await settle_attempt_on(conn, uid, attempt, ended, tools) is not None
    if not won and (
        await conn.execute(select(attempts.c.status).where(*_attempt_key(uid, attempt)))
    ).one_or_none() is not None:
        return False  # another writer settled it first
    result = await conn.execute(_SETTLE_RUN, _ended(uid, attempt, ended, tools))
    return won or result.rowcount == 1


async def settle_attempt_on(conn: AsyncConnection, uid: str, attempt: int,
                            ended: Mapping[str, Any], tools: list[str] | None
                            ) -> Attempt | None:
    """The attempt's row settled (`ended`: status, reason, message, finished_at) if it is
    still live: the row lock of the fence. Returns the row as written, or None (settled
    by another writer, or never written)."""
    row = (await conn.execute(_SETTLE_ATTEMPT, _ended(uid, attempt, ended, tools))
           ).one_or_none()
    return None if row is None else _attempt(row)


async def set_attempt_tools_on(conn: AsyncConnection, uid: str, attempt: int,
                               tools: list[str] | None) -> Attempt | None:
    """The settled attempt's tools, once counted; returns its row as written."""
    row = (await conn.execute(_SET_ATTEMPT_TOOLS, {
        "p_uid": uid, "p_attempt": attempt, "p_tools": tools})).one_or_none()
    return None if row is None else _attempt(row)


async def settle_run_on(conn: AsyncConnection, uid: str, attempt: int,
                        ended: Mapping[str, Any], tools: list[str] | None, *, won: bool
                        ) -> Run | None:
    """The run's row settled with its attempt `attempt` (`ended`, and its tools) if it is
    still live at that attempt or before; when this writer `won` the attempt's row and
    the run's was ended already (closed while it waited), its tools at least. Returns the
    run's row as it is after."""
    row = (await conn.execute(_SETTLE_RUN_RETURNING,
                              _ended(uid, attempt, ended, tools))).one_or_none()
    if row is None and won and tools is not None:
        row = (await conn.execute(
            update(runs).where(runs.c.uid == uid, runs.c.attempts == attempt)
            .values(tools_executed=tools).returning(*runs.c))).one_or_none()
    return _run(row) if row is not None else await run_on(conn, uid)


async def close_run(engine: AsyncEngine, uid: str, attempt: int, status: str,
                    reason: str | None, message: str | None) -> bool:
    """Ends a run whose current attempt was settled already (it ended waiting for an
    approval, and the run is cancelled while it waits): the run row says how the run
    ended. Returns whether the row was the run's at that attempt."""
    async with engine.begin() as conn:
        done = await conn.execute(
            update(runs).where(runs.c.uid == uid, runs.c.attempts == attempt)
            .values(status=status, reason=reason, message=message, finished_at=_now(),
                    updated_at=_now()))
    return done.rowcount == 1


async def set_tools_executed(
    engine: AsyncEngine, uid: str, attempt: int, tools_executed: Sequence[str]
) -> bool:
    """Fills an unknown (NULL) tools_executed once it can be read; never overwrites a
    known one. Returns whether anything was filled."""
    tools = list(tools_executed)
    async with engine.begin() as conn:
        a = await conn.execute(
            update(attempts)
            .where(*_attempt_key(uid, attempt), attempts.c.tools_executed.is_(None))
            .values(tools_executed=tools)
        )
        r = await conn.execute(
            update(runs)
            .where(
                runs.c.uid == uid,
                runs.c.attempts == attempt,
                runs.c.status.in_(RunStatus.TERMINAL),
                runs.c.tools_executed.is_(None),
            )
            .values(tools_executed=tools, updated_at=_now())
        )
    return a.rowcount + r.rowcount > 0


async def get_run(engine: AsyncEngine, uid: str) -> Run | None:
    async with autocommit(engine) as conn:
        return await run_on(conn, uid)


async def run_on(conn: AsyncConnection, uid: str) -> Run | None:
    """The run's row, read on `conn` (one read of several in a transaction)."""
    row = (await conn.execute(_RUN, {"p_uid": uid})).one_or_none()
    return None if row is None else _run(row)


async def ensure_live(engine: AsyncEngine, uid: str, attempt: int) -> None:
    """Raises AttemptSettled once the operator settled the attempt (one never written
    passes): the store API's liveness check, one primary-key read."""
    async with autocommit(engine) as conn:
        status = (await conn.execute(
            select(attempts.c.status).where(*_attempt_key(uid, attempt))
        )).scalar_one_or_none()
    if status is not None and status not in RunStatus.LIVE:
        raise AttemptSettled(f"attempt {attempt} of run {uid} was already settled ({status}) "
                             "by the operator", status)


async def get_attempt(engine: AsyncEngine, uid: str, attempt: int) -> Attempt | None:
    async with autocommit(engine) as conn:
        return await attempt_on(conn, uid, attempt)


async def run_and_attempt_on(conn: AsyncConnection, uid: str, attempt: int
                             ) -> tuple[Run | None, Attempt | None]:
    """run_on and attempt_on in one statement (one round trip where there were two)."""
    row = (await conn.execute(_RUN_AND_ATTEMPT, {"p_uid": uid, "p_attempt": attempt})).one()
    return (None if row._mapping[runs.c.uid] is None else _run(_Columns(row, runs)),
            None if row._mapping[attempts.c.run_uid] is None
            else _attempt(_Columns(row, attempts)))


async def attempt_on(conn: AsyncConnection, uid: str, attempt: int) -> Attempt | None:
    """The attempt's row, read on `conn`."""
    row = (await conn.execute(_ATTEMPT, {"p_uid": uid, "p_attempt": attempt})).one_or_none()
    return None if row is None else _attempt(row)


async def attempt_identity(engine: AsyncEngine, uid: str,
                           attempt: int) -> tuple[AttemptIdentity, str] | None:
    """Who attempt `attempt` of run `uid` is, as the operator wrote it down (its run, pod
    and session never change once written), and its status when read (for the store
    API); None when the store has no record of it."""
    async with autocommit(engine) as conn:
        row = (await conn.execute(
            select(runs.c.namespace, runs.c.name, runs.c.agent, runs.c.user_id,
                   runs.c.input_digest, attempts.c.pod_name, attempts.c.app_name,
                   attempts.c.session_id, attempts.c.status, attempts.c.resumes_attempt,
                   attempts.c.resumes_run_uid)
            .join(attempts, attempts.c.run_uid == runs.c.uid)
            .where(*_attempt_key(uid, attempt))
        )).one_or_none()
    if row is None:
        return None
    return AttemptIdentity(
        namespace=row.namespace, run_name=row.name, run_uid=uid, attempt=attempt,
        agent=row.agent, user_id=row.user_id, session_id=row.session_id or "",
        input_digest=row.input_digest, pod=row.pod_name,
        app_name=row.app_name or session_app(row.namespace, row.agent),
        resumes_attempt=row.resumes_attempt, resumes_run_uid=row.resumes_run_uid), row.status
