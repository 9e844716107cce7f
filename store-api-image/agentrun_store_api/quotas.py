"""What one attempt may still write, and how many of its requests are served at once.

The store API counts what each attempt wrote through it. It starts from what the store
holds (store.attempt_usage, read once when it first counts for the attempt: after a
restart, or when another replica served the attempt before), and then counts itself, so a
quota costs no query per request. With several replicas each counts what it serves on top
of what it read: an attempt spread over N replicas may write up to N times a quota, never
more.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass, fields

from sqlalchemy.ext.asyncio import AsyncEngine

from agentrun import store
from agentrun.attempt import AttemptIdentity
from agentrun_store_api import limits
from agentrun_store_api.refusal import OverQuota, Refused


@dataclass(frozen=True)
class Usage:
    """Rows and bytes of one attempt (store.AttemptUsage's fields); also an amount to add."""

    events: int = 0
    event_bytes: int = 0
    result_bytes: int = 0
    outbox_rows: int = 0
    memory_entries: int = 0
    memory_bytes: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))

    def __sub__(self, other: Usage) -> Usage:
        return Usage(*(max(0, getattr(self, f.name) - getattr(other, f.name))
                       for f in fields(self)))


# Each quota: its field, its limit, what it counts (as the refusal says it), in bytes?
QUOTAS: tuple[tuple[str, int, str, bool], ...] = (
    ("events", limits.EVENTS_PER_ATTEMPT, "session events", False),
    ("event_bytes", limits.EVENT_BYTES_PER_ATTEMPT, "of session events", True),
    ("result_bytes", limits.RESULT_BYTES_PER_ATTEMPT, "of tool results", True),
    ("outbox_rows", limits.OUTBOX_ROWS_PER_ATTEMPT, "outbox rows", False),
    ("memory_entries", limits.MEMORY_ENTRIES_PER_ATTEMPT, "memory entries", False),
    ("memory_bytes", limits.MEMORY_BYTES_PER_ATTEMPT, "of memory", True),
)


def over_quota(used: Usage, more: Usage) -> str | None:
    """The first quota `more` would take `used` past, said as the refusal says it (the
    limit, and what the attempt has used), or None when all of it fits."""
    for name, limit, what, in_bytes in QUOTAS:
        asked, had = getattr(more, name), getattr(used, name)
        if asked and had + asked > limit:
            return (f"one attempt may write at most {_amount(limit, in_bytes)} {what} "
                    f"through the store API, and this one has written "
                    f"{_amount(had, in_bytes)} already")
    return None


def _amount(value: int, in_bytes: bool) -> str:
    return limits.shown(value) if in_bytes else f"{value:,}"


class Spent:
    """Seconds spent serving, decayed by half every `limits.SHARE_HALF_LIFE_SECONDS`."""

    def __init__(self) -> None:
        self._seconds = 0.0
        self._at = time.monotonic()

    def at(self, now: float) -> float:
        self._seconds *= 0.5 ** ((now - self._at) / limits.SHARE_HALF_LIFE_SECONDS)
        self._at = now
        return self._seconds

    def add(self, seconds: float, now: float) -> None:
        self._seconds = self.at(now) + seconds


def fair_pause(mine: float, everyone: float, others_here: bool) -> float:
    """How long an attempt waits before its next request: nothing unless other attempts'
    requests are here now (served or waiting) and its part of the store API's recent time
    (`mine` of `everyone`) is over limits.FAIR_SHARE; then up to limits.FAIR_PAUSE_SECONDS,
    the more the larger its part."""
    if not others_here or everyone <= 0:
        return 0.0
    share = mine / everyone
    if share <= limits.FAIR_SHARE:
        return 0.0
    return limits.FAIR_PAUSE_SECONDS * min(1.0, (share - limits.FAIR_SHARE)
                                           / (1 - limits.FAIR_SHARE))


class _Attempt:
    """One attempt's counts, its turn at the store and the time it took there."""

    def __init__(self) -> None:
        self.used: Usage | None = None  # None: not read from the store yet
        self.reading = asyncio.Lock()
        self.turn = asyncio.Semaphore(limits.IN_FLIGHT_PER_ATTEMPT)
        self.waiting = 0
        self.spent = Spent()
        # Over its fair share while others are here, an attempt is served one request at
        # a time (fair_pause): its other places wait behind this.
        self.lane = asyncio.Lock()


class Quotas:
    """The attempts' counts and turns, the most recently used `limits.CACHE_ENTRIES`."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine
        self._attempts: OrderedDict[tuple[str, int], _Attempt] = OrderedDict()
        self._spent = Spent()  # everyone's
        # The attempts with requests here now (in the store or waiting), and how many.
        self._here: dict[tuple[str, int], int] = {}

    def _of(self, caller: AttemptIdentity) -> _Attempt:
        key = (caller.run_uid, caller.attempt)
        found = self._attempts.get(key)
        if found is None:
            found = self._attempts[key] = _Attempt()
            while len(self._attempts) > limits.CACHE_ENTRIES:
                self._attempts.popitem(last=False)
        else:
            self._attempts.move_to_end(key)
        return found

    @contextlib.asynccontextmanager
    async def turn(self, caller: AttemptIdentity) -> AsyncIterator[None]:
        """One of the attempt's `IN_FLIGHT_PER_ATTEMPT` places at the store, waiting for
        it in order; refused 429 when too many of its requests wait already."""
        attempt = self._of(caller)
        if attempt.turn.locked() and attempt.waiting >= limits.WAITING_PER_ATTEMPT:
            raise Refused(429, f"attempt {caller.attempt} of run {caller.run_name} has "
                               f"{limits.IN_FLIGHT_PER_ATTEMPT} requests in the store and "
                               f"{attempt.waiting} waiting, the most one attempt may: send "
                               "fewer at once")
        key = (caller.run_uid, caller.attempt)
        self._here[key] = self._here.get(key, 0) + 1
        try:
            attempt.waiting += 1
            try:
                await attempt.turn.acquire()
            finally:
                attempt.waiting -= 1
            try:
                now = time.monotonic()
                pause = fair_pause(attempt.spent.at(now), self._spent.at(now),
                                   len(self._here) > 1)
                if pause:
                    await asyncio.sleep(pause)
                # A request that need not pause still waits behind one that did.
                async with attempt.lane if pause or attempt.lane.locked() \
                        else contextlib.nullcontext():
                    started = time.monotonic()
                    try:
                        yield
                    finally:
                        done = time.monotonic()
                        attempt.spent.add(done - started, done)
                        self._spent.add(done - started, done)
            finally:
                attempt.turn.release()
        finally:
            self._here[key] -= 1
            if not self._here[key]:
                del self._here[key]

    async def check(self, caller: AttemptIdentity, more: Usage) -> None:
        """Refuses (429) what would exceed a quota, counting nothing: before the work of
        reading and parsing a request that `take` would refuse anyway."""
        attempt = await self._read(caller)
        why = over_quota(attempt.used or Usage(), more)
        if why is not None:
            raise OverQuota(f"attempt {caller.attempt} of run {caller.run_name}: {why}; "
                               "this request was not stored")

    async def _read(self, caller: AttemptIdentity) -> _Attempt:
        attempt = self._of(caller)
        if attempt.used is None:
            async with attempt.reading:
                if attempt.used is None:
                    held = await store.attempt_usage(self._engine, caller.run_uid,
                                                     caller.attempt)
                    attempt.used = Usage(**{f.name: getattr(held, f.name)
                                            for f in fields(Usage)})
        return attempt

    async def take(self, caller: AttemptIdentity, more: Usage) -> None:
        """Counts `more` as written by the attempt, or refuses it (429) with the quota it
        would exceed. A write that then fails gives it back (`give_back`)."""
        attempt = await self._read(caller)
        assert attempt.used is not None
        why = over_quota(attempt.used, more)
        if why is not None:
            raise OverQuota(f"attempt {caller.attempt} of run {caller.run_name}: {why}; "
                               "this request was not stored")
        attempt.used = attempt.used + more

    def give_back(self, caller: AttemptIdentity, more: Usage) -> None:
        attempt = self._attempts.get((caller.run_uid, caller.attempt))
        if attempt is not None and attempt.used is not None:
            attempt.used = attempt.used - more

    def forget(self, caller: AttemptIdentity) -> None:
        """The attempt is settled: it writes nothing more."""
        self._attempts.pop((caller.run_uid, caller.attempt), None)

