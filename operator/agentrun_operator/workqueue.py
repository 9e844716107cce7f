"""A work queue of object keys, client-go's shape: events only add keys; workers take them.

A key is never handed to two workers at once; a key added while it is being worked on is
worked on again once that worker is done (the "dirty" set), so no change is lost and no
two reconciles of one run overlap. Keys added many times before a worker takes them are
worked on once. `add_after` schedules a key (a deadline, a backoff); `failed` backs a key
off exponentially until `forget`.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)

BACKOFF_BASE = 0.05
BACKOFF_MAX = 60.0


class WorkQueue(Generic[K]):
    def __init__(self) -> None:
        self._ready: asyncio.Queue[K] = asyncio.Queue()
        self._queued: set[K] = set()  # in _ready, not taken yet
        self._active: set[K] = set()  # taken by a worker
        self._dirty: set[K] = set()  # added again while active
        self._timers: dict[K, asyncio.TimerHandle] = {}
        self._failures: dict[K, int] = {}

    def __len__(self) -> int:
        return len(self._queued) + len(self._dirty)

    def add(self, key: K) -> None:
        if key in self._active:
            self._dirty.add(key)
        elif key not in self._queued:
            self._queued.add(key)
            self._ready.put_nowait(key)

    def add_after(self, key: K, delay: float) -> None:
        """Adds `key` after `delay` seconds; an earlier schedule of the same key wins."""
        if delay <= 0:
            self.add(key)
            return
        loop = asyncio.get_running_loop()
        due = loop.time() + delay
        timer = self._timers.get(key)
        if timer is not None and not timer.cancelled() and timer.when() <= due:
            return
        if timer is not None:
            timer.cancel()

        def fire() -> None:
            self._timers.pop(key, None)
            self.add(key)

        self._timers[key] = loop.call_at(due, fire)

    def failed(self, key: K) -> float:
        """Schedules `key` again with exponential backoff (jittered); returns the delay."""
        n = self._failures.get(key, 0)
        self._failures[key] = n + 1
        delay = min(BACKOFF_MAX, BACKOFF_BASE * 2 ** n) * random.uniform(0.8, 1.2)
        self.add_after(key, delay)
        return delay

    def forget(self, key: K) -> None:
        self._failures.pop(key, None)

    async def get(self) -> K:
        key = await self._ready.get()
        self._queued.discard(key)
        self._active.add(key)
        return key

    def done(self, key: K) -> None:
        self._active.discard(key)
        if key in self._dirty:
            self._dirty.discard(key)
            self.add(key)
