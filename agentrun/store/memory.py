"""Long-term memory in the run store: an ADK memory service (ADK ships none for
Postgres), scoped per (agent, user), keyword search, entries that expire.

The store API's (it needs google-adk); the operator purges expired entries without ADK
(agentrun.store.retention)."""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from google.adk.memory.base_memory_service import BaseMemoryService, SearchMemoryResponse
from google.adk.memory.memory_entry import MemoryEntry
from google.genai import types
from sqlalchemy import delete, func, or_, select
from sqlalchemy.ext.asyncio import AsyncEngine

from agentrun.store.schema import memory
from agentrun.vocabulary import DEFAULT_MEMORY_TTL_DAYS

if TYPE_CHECKING:
    from google.adk.events.event import Event
    from google.adk.sessions.session import Session

_WORD = re.compile(r"\w+", re.UNICODE)
# Words too common to say anything about relevance.
_STOP_WORDS = frozenset(
    ("a", "an", "and", "are", "as", "at", "be", "by", "for", "from", "has", "have", "in",
     "is", "it", "of", "on", "or", "that", "the", "this", "to", "was", "were", "will",
     "with", "you", "your")
)
MAX_RESULTS = 20


def keywords(query: str) -> list[str]:
    """The distinct lowercase words of a query worth searching for, in order."""
    seen: dict[str, None] = {}
    for word in _WORD.findall(query.lower()):
        if len(word) > 1 and word not in _STOP_WORDS:
            seen.setdefault(word, None)
    return list(seen)


def memory_entries(events: Sequence[Event]) -> list[tuple[str | None, str]]:
    """(author, text) of each event memory keeps: its text parts, thoughts left out;
    events without text keep nothing."""
    found = [(event.author, _text_of(event.content)) for event in events]
    return [(author, text) for author, text in found if text]


def _text_of(content: types.Content | None) -> str:
    if content is None or not content.parts:
        return ""
    return " ".join(p.text for p in content.parts if p.text and not p.thought).strip()


def _escape_like(word: str) -> str:
    return word.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


class StoreMemoryService(BaseMemoryService):
    """ADK memory in the run store. ADK's app_name is our agent; user_id is spec.userId.

    A memory written for (agent, user) is only ever returned to that same agent and user.
    A search looks for at most `max_words` keywords (one LIKE each), the first ones.
    """

    def __init__(self, engine: AsyncEngine, ttl_days: int = DEFAULT_MEMORY_TTL_DAYS,
                 max_words: int = 64) -> None:
        self._engine = engine
        self._ttl = timedelta(days=ttl_days)
        self._max_words = max_words

    async def add_entries(
        self,
        app_name: str,
        user_id: str,
        session_id: str | None,
        entries: Sequence[tuple[str | None, str]],
    ) -> None:
        """Stores (author, text) entries for (app, user), expiring after the TTL."""
        entries = [(author, text) for author, text in entries if text]
        if not entries:
            return
        now = datetime.now(UTC)
        async with self._engine.begin() as conn:
            await conn.execute(
                memory.insert(),
                [
                    {
                        "id": uuid.uuid4().hex, "agent": app_name, "user_id": user_id,
                        "session_id": session_id, "author": author, "text": text,
                        "created_at": now, "expires_at": now + self._ttl,
                    }
                    for author, text in entries
                ],
            )

    async def add_session_to_memory(self, session: Session) -> None:
        await self.add_events_to_memory(
            app_name=session.app_name, user_id=session.user_id,
            events=session.events, session_id=session.id,
        )

    async def add_events_to_memory(
        self,
        *,
        app_name: str,
        user_id: str,
        events: Sequence[Event],
        session_id: str | None = None,
        custom_metadata: Mapping[str, object] | None = None,
    ) -> None:
        await self.add_entries(app_name, user_id, session_id, memory_entries(events))

    async def add_memory(
        self,
        *,
        app_name: str,
        user_id: str,
        memories: Sequence[MemoryEntry],
        custom_metadata: Mapping[str, object] | None = None,
    ) -> None:
        await self.add_entries(
            app_name, user_id, None, [(m.author, _text_of(m.content)) for m in memories]
        )

    async def search_memory(
        self, *, app_name: str, user_id: str, query: str
    ) -> SearchMemoryResponse:
        words = keywords(query)[:self._max_words]
        if not words:
            return SearchMemoryResponse()
        lowered = func.lower(memory.c.text)
        stmt = (
            select(memory)
            .where(
                memory.c.agent == app_name,
                memory.c.user_id == user_id,
                memory.c.expires_at > datetime.now(UTC),
                or_(*(lowered.like(f"%{_escape_like(w)}%", escape="\\") for w in words)),
            )
            .order_by(memory.c.created_at.desc())
            .limit(MAX_RESULTS)
        )
        async with self._engine.connect() as conn:
            rows = (await conn.execute(stmt)).all()
        return SearchMemoryResponse(
            memories=[
                MemoryEntry(
                    id=row.id,
                    author=row.author,
                    timestamp=row.created_at.isoformat(),
                    content=types.Content(
                        role="model" if row.author and row.author != "user" else "user",
                        parts=[types.Part(text=row.text)],
                    ),
                )
                for row in rows
            ]
        )

    async def delete_memory(
        self, *, app_name: str, user_id: str, memory_id: str | None = None
    ) -> None:
        stmt = delete(memory).where(memory.c.agent == app_name, memory.c.user_id == user_id)
        if memory_id is not None:
            stmt = stmt.where(memory.c.id == memory_id)
        async with self._engine.begin() as conn:
            await conn.execute(stmt)
