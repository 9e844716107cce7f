"""A run's outcome beside its tools: the agent's final answer, and what its model calls used.

The runner reports both through the store API: the answer once, when the agent gives it
(the whole text, and the parsed object when the agent declares an output schema), and
each model call's usage as the model reported it (tokens, and the cost the runner priced
it at). Tool calls are not the runner's to report: they are counted from the ledger.

A run's usage is summed over its attempts, and a run that resumes another run's journal
(a manual resume) continues that run's count: its limits are about the whole
conversation, not only the part this run made.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import bindparam, false, func, null, or_, select
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from agentrun.store.dialect import upsert_insert
from agentrun.store.schema import attempts, results, tool_calls, usage
from agentrun.vocabulary import LedgerOutcome


@dataclass(frozen=True)
class Result:
    """The final answer of an attempt, whole."""

    attempt: int
    text: str
    json: Any
    digest: str
    created_at: datetime


@dataclass(frozen=True)
class Usage:
    """What model and tool calls used. `cost_micro_usd` None: some call's model has no
    known price, so the cost is unknown (never a partial sum)."""

    model_calls: int = 0
    tool_calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_micro_usd: int | None = 0

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def plus(self, other: Usage) -> Usage:
        cost = None if self.cost_micro_usd is None or other.cost_micro_usd is None else \
            self.cost_micro_usd + other.cost_micro_usd
        return Usage(self.model_calls + other.model_calls, self.tool_calls + other.tool_calls,
                     self.input_tokens + other.input_tokens,
                     self.output_tokens + other.output_tokens, cost)


def answer_digest(text: str) -> str:
    """`sha256:<hex>` of the whole answer (status.result.digest): the answer is the agent's
    output, not an input, so it needs no key."""
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


async def record_result(engine: AsyncEngine, uid: str, attempt: int, text: str,
                        parsed: Any = None) -> bool:
    """The attempt's final answer (the first report counts); returns whether this one did."""
    async with engine.begin() as conn:
        done = await conn.execute(
            upsert_insert(conn, results)
            .values(run_uid=uid, attempt=attempt, text=text, json=parsed,
                    digest=answer_digest(text), created_at=datetime.now(UTC))
            .on_conflict_do_nothing()
            .returning(results.c.attempt))
        return done.first() is not None


async def get_result(engine: AsyncEngine, uid: str) -> Result | None:
    """The run's answer: that of its latest attempt that gave one."""
    async with engine.connect() as conn:
        return await result_on(conn, uid)


# Built once (see runs._RUN): every settled run's sync reads it.
_RESULT = select(results).where(results.c.run_uid == bindparam("p_uid")).order_by(
    results.c.attempt.desc()).limit(1)


async def result_on(conn: AsyncConnection, uid: str) -> Result | None:
    """get_result, read on `conn`."""
    row = (await conn.execute(_RESULT, {"p_uid": uid})).one_or_none()
    if row is None:
        return None
    return Result(row.attempt, row.text, row.json, row.digest, row.created_at)


class TooManyModels(Exception):
    """The run has reported usage of as many distinct model names as it may: nothing
    written (each name is a usage row of every attempt that reports it)."""

    def __init__(self, models: int) -> None:
        super().__init__(models)
        self.models = models


async def add_usage(engine: AsyncEngine, uid: str, attempt: int, model: str,
                    input_tokens: int, output_tokens: int,
                    cost_micro_usd: int | None, max_models: int | None = None) -> int:
    """Adds one model call of `model` to the attempt's usage; `cost_micro_usd` None: the
    model has no known price. Returns the attempt's model calls of that model so far.
    With `max_models`, a model name new to the run once the run has reported that many
    distinct names raises TooManyModels."""
    now = datetime.now(UTC)
    async with engine.begin() as conn:
        if max_models is not None:
            names = {str(n) for n in (await conn.execute(
                select(usage.c.model).where(usage.c.run_uid == uid).distinct())).scalars()}
            if model not in names and len(names) >= max_models:
                raise TooManyModels(len(names))
        stmt = upsert_insert(conn, usage).values(
            run_uid=uid, attempt=attempt, model=model, model_calls=1,
            input_tokens=input_tokens, output_tokens=output_tokens,
            cost_micro_usd=cost_micro_usd or 0, priced=cost_micro_usd is not None,
            updated_at=now)
        await conn.execute(stmt.on_conflict_do_update(
            index_elements=[usage.c.run_uid, usage.c.attempt, usage.c.model],
            set_={"model_calls": usage.c.model_calls + 1,
                  "input_tokens": usage.c.input_tokens + input_tokens,
                  "output_tokens": usage.c.output_tokens + output_tokens,
                  "cost_micro_usd": usage.c.cost_micro_usd + (cost_micro_usd or 0),
                  "priced": usage.c.priced if cost_micro_usd is not None else false(),
                  "updated_at": now}))
        return int((await conn.execute(select(usage.c.model_calls).where(
            usage.c.run_uid == uid, usage.c.attempt == attempt,
            usage.c.model == model))).scalar_one())


@functools.cache
def _usage_statement(before: bool, resumed: bool) -> Any:
    """_usage_of's statement, built once for each shape (see runs._RUN): parameters p_uid,
    and p_before when `before`."""
    uid: Any = bindparam("p_uid")
    where = [usage.c.run_uid == uid]
    calls = [tool_calls.c.run_uid == uid,
             or_(tool_calls.c.outcome.is_(None),
                 tool_calls.c.outcome.not_in(LedgerOutcome.NOT_RUN))]
    if before:
        where.append(usage.c.attempt < bindparam("p_before"))
        calls.append(tool_calls.c.attempt < bindparam("p_before"))
    of = select(attempts.c.resumes_run_uid).where(
        attempts.c.run_uid == uid, attempts.c.resumes_run_uid.is_not(None)
    ).order_by(attempts.c.attempt).limit(1).scalar_subquery() if resumed else null()
    return select(
        func.coalesce(func.sum(usage.c.model_calls), 0),
        func.coalesce(func.sum(usage.c.input_tokens), 0),
        func.coalesce(func.sum(usage.c.output_tokens), 0),
        func.coalesce(func.sum(usage.c.cost_micro_usd), 0),
        func.count().filter(~usage.c.priced),
        select(func.count()).where(*calls).scalar_subquery(),
        of).where(*where)


async def _usage_of(conn: AsyncConnection, uid: str, before: int | None, *,
                    resumed: bool = False) -> tuple[Usage, str | None]:
    """The usage of run `uid`'s attempts (those before attempt `before`, if given), and,
    with `resumed`, the run whose journal it resumes: one statement."""
    parameters: dict[str, Any] = {"p_uid": uid}
    if before is not None:
        parameters["p_before"] = before
    row = (await conn.execute(_usage_statement(before is not None, resumed), parameters)
           ).one()
    return Usage(int(row[0]), int(row[5]), int(row[1]), int(row[2]),
                 None if row[4] else int(row[3])), row[6]


async def run_usage(engine: AsyncEngine, uid: str, *, before_attempt: int | None = None
                    ) -> Usage:
    """What run `uid` used: its attempts (before `before_attempt`, if given), and, when it
    resumes another run's journal, that run's whole count first."""
    async with engine.connect() as conn:
        return await usage_on(conn, uid, before_attempt=before_attempt)


async def usage_on(conn: AsyncConnection, uid: str, *, before_attempt: int | None = None
                   ) -> Usage:
    """run_usage, read on `conn`."""
    own, resumed = await _usage_of(conn, uid, before_attempt, resumed=True)
    if resumed is None:
        return own
    return (await _usage_of(conn, str(resumed), None))[0].plus(own)


async def usage_changed_since(engine: AsyncEngine, since: datetime) -> set[str]:
    """The runs whose usage changed after `since` (one indexed read for all live runs)."""
    async with engine.connect() as conn:
        rows = await conn.execute(
            select(usage.c.run_uid).where(usage.c.updated_at > since).distinct())
        return {str(r[0]) for r in rows}

