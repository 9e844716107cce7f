"""The run archive: every run the store has recorded, whether or not its AgentRun is still
in the API server (a settled run leaves after its time to live; its record stays).

Newest first, in pages: a page ends at a keyset (created_at, uid) the next one starts
after, so a page is the same however many runs are recorded meanwhile (new ones come
before the first page, never inside a later one). Conditions on columns are SQL; label
selectors are applied to each row as it is read (labels are a JSON column), and a page is
filled from as many rows as that takes, up to SCAN_ROWS per request.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, or_, select
from sqlalchemy.ext.asyncio import AsyncEngine

from agentrun.store.runs import Run, _run
from agentrun.store.schema import runs

# Rows read per request at most while a label selector filters them out: a page may come
# back short (with a continue token) rather than walk the whole archive in one request.
SCAN_ROWS = 5000
_BATCH = 200
# The columns a field condition may name.
COLUMNS = {"name": runs.c.name, "uid": runs.c.uid, "agent": runs.c.agent,
           "status": runs.c.status, "namespace": runs.c.namespace}

Keyset = tuple[datetime.datetime, str]


@dataclass(frozen=True)
class Field:
    """A condition on a column: `column` == value (or != when `equal` is False)."""

    column: str
    value: str
    equal: bool = True


@dataclass(frozen=True)
class Page:
    records: list[Run]
    after: Keyset | None  # where the next page starts; None: this was the last


async def run_records(
    engine: AsyncEngine,
    namespace: str | None,
    *,
    fields: Sequence[Field] = (),
    since: datetime.datetime | None = None,
    matches: Callable[[Run], bool] | None = None,
    limit: int = 500,
    after: Keyset | None = None,
) -> Page:
    """One page of the recorded runs (of `namespace`, or every namespace), newest first:
    at most `limit` that satisfy `fields`, were created at or after `since`, and that
    `matches` accepts; starting after the keyset `after`."""
    conditions: list[Any] = []
    if namespace:
        conditions.append(runs.c.namespace == namespace)
    for f in fields:
        column = COLUMNS[f.column]
        conditions.append(column == f.value if f.equal else column != f.value)
    if since is not None:
        conditions.append(runs.c.created_at >= since)
    found: list[Run] = []
    scanned = 0
    async with engine.connect() as conn:
        while True:
            keyset = [] if after is None else [_older_than(after)]
            rows = (await conn.execute(
                select(runs).where(*conditions, *keyset)
                .order_by(runs.c.created_at.desc(), runs.c.uid.desc()).limit(_BATCH)
            )).all()
            for row in rows:
                scanned += 1
                record = _run(row)
                after = (record.created_at, record.uid)
                if matches is None or matches(record):
                    found.append(record)
                    if len(found) == limit:
                        more = await _any_after(conn, conditions, after)
                        return Page(found, after if more else None)
            if len(rows) < _BATCH:
                return Page(found, None)
            if scanned >= SCAN_ROWS:
                return Page(found, after)


def _older_than(after: Keyset) -> Any:
    """Records after `after` in the archive's order (newest first): older, or as old with
    a smaller uid."""
    return or_(runs.c.created_at < after[0],
               and_(runs.c.created_at == after[0], runs.c.uid < after[1]))


async def _any_after(conn: Any, conditions: list[Any], after: Keyset) -> bool:
    row = (await conn.execute(
        select(runs.c.uid).where(*conditions, _older_than(after)).limit(1)
    )).first()
    return row is not None


async def latest_named(engine: AsyncEngine, namespace: str, name: str) -> Run | None:
    """The most recent run of that name in the namespace (a name is used again once its
    AgentRun is deleted)."""
    async with engine.connect() as conn:
        row = (await conn.execute(
            select(runs).where(runs.c.namespace == namespace, runs.c.name == name)
            .order_by(runs.c.created_at.desc(), runs.c.uid.desc()).limit(1)
        )).one_or_none()
    return None if row is None else _run(row)
