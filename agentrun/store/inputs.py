"""Content-addressed input snapshots: the text and the bytes of every file, copied before
the pod starts, so that a replay runs on exactly what the original saw."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

from sqlalchemy import delete, select
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from agentrun.store.dialect import upsert_insert
from agentrun.store.schema import input_files, inputs, installation

# Keyed: a plain sha256 of the input on the AgentRun's status would let anyone who may read
# the run confirm a guess of an input file's bytes (a Secret's, say) by hashing it.
DIGEST_PREFIX = "hmac-sha256:"
INPUT_DIGEST_KEY = "input-digest-key"


@dataclass(frozen=True)
class Input:
    """One snapshotted input."""

    digest: str
    text: str
    files: dict[str, bytes] = field(default_factory=dict)
    created_at: datetime | None = None


def input_digest(text: str, files: Mapping[str, bytes] | None = None, *, key: bytes) -> str:
    """`hmac-sha256:<hex>` over the text and the files (sorted by name), length-prefixed so
    that no two different inputs can encode to the same bytes, keyed by the installation's
    input digest key (`installation_key`)."""
    h = hmac.new(key, b"agentrun-input-v2\n", hashlib.sha256)

    def chunk(data: bytes) -> None:
        h.update(len(data).to_bytes(8, "big"))
        h.update(data)

    chunk(text.encode("utf-8"))
    for name in sorted(files or {}):
        chunk(name.encode("utf-8"))
        chunk(bytes((files or {})[name]))
    return DIGEST_PREFIX + h.hexdigest()


async def installation_key(engine: AsyncEngine, name: str = INPUT_DIGEST_KEY) -> bytes:
    """A secret of this installation, made once (32 random bytes) and kept in the store:
    the input digests' key when the operator is not given one (the chart gives it from a
    Secret). Concurrent first calls agree: the first insert wins, every caller reads it."""
    async with engine.begin() as conn:
        await conn.execute(
            upsert_insert(conn, installation)
            .values(name=name, value=secrets.token_bytes(32), created_at=datetime.now(UTC))
            .on_conflict_do_nothing()
        )
        value = (await conn.execute(
            select(installation.c.value).where(installation.c.name == name))).scalar_one()
    return bytes(value)


async def put_input(
    engine: AsyncEngine, text: str, files: Mapping[str, bytes] | None = None, *, key: bytes
) -> str:
    """Snapshots an input and returns its digest (keyed by `key`); putting the same input
    again is a no-op."""
    files = dict(files or {})
    digest = input_digest(text, files, key=key)
    async with engine.begin() as conn:
        await put_input_on(conn, digest, text, files)
    return digest


async def put_input_on(conn: AsyncConnection, digest: str, text: str,
                       files: Mapping[str, bytes]) -> None:
    """Writes the snapshot `digest` (its `input_digest`) on `conn`, unless it exists."""
    await conn.execute(
        upsert_insert(conn, inputs)
        .values(digest=digest, text=text, created_at=datetime.now(UTC))
        .on_conflict_do_nothing()
    )
    for name, content in sorted(files.items()):
        await conn.execute(
            upsert_insert(conn, input_files)
            .values(digest=digest, name=name, content=bytes(content), size=len(content))
            .on_conflict_do_nothing()
        )


async def get_input(engine: AsyncEngine, digest: str) -> Input | None:
    """The snapshot with this digest, or None when it is gone (or never existed)."""
    async with engine.connect() as conn:
        row = (
            await conn.execute(select(inputs).where(inputs.c.digest == digest))
        ).one_or_none()
        if row is None:
            return None
        files = {
            r.name: bytes(r.content)
            for r in await conn.execute(
                select(input_files.c.name, input_files.c.content)
                .where(input_files.c.digest == digest)
                .order_by(input_files.c.name)
            )
        }
    return Input(digest=digest, text=row.text, files=files, created_at=row.created_at)


async def delete_input(engine: AsyncEngine, digest: str) -> bool:
    """Deletes a snapshot (retention, or tests of "input gone"); True if it existed."""
    async with engine.begin() as conn:
        await conn.execute(delete(input_files).where(input_files.c.digest == digest))
        result = await conn.execute(delete(inputs).where(inputs.c.digest == digest))
    return result.rowcount > 0
