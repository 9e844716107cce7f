"""A work queue of object keys, client-go's shape: events only add keys; workers take them.

A key is never handed to two workers at once; a key added while it is being worked on is
worked on again once that worker is done (the "dirty" set), so no change is lost and no
two reconciles of one run overlap. Keys added many times before a worker takes them are
worked on once. `add_after` schedules a key (a deadline, a backoff); `failed` backs a key
off exponentially until `forget`.

Two lanes, as controller-runtime's priority queue has them: what a watch event or a
deadline adds goes first; what the resync sweep and the watch's initial list add
(`later=True`: every live run at once, 20,000 keys at 20,000 live runs) is taken only
when nothing else waits. An eviction's key does not wait behind a sweep. A key waiting in
the later lane that an event adds again moves to the first.
"""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)

BACKOFF_BASE = 0.05
BACKOFF_MAX = 60.0


NOW, LATER = 0, 1  # the lanes


class WorkQueue(Generic[K]):
    def __init__(self) -> None:
        # (lane, order, key); an entry whose key has since moved to the first lane, or
        # been taken, is skipped when it comes up.
        self._ready: asyncio.PriorityQueue[tuple[int, int, K]] = asyncio.PriorityQueue()
        self._order = itertools.count()
        self._queued: dict[K, int] = {}  # in _ready, not taken yet: its lane
        self._active: set[K] = set()  # taken by a worker
        self._dirty: set[K] = set()  # added again while active
        self._timers: dict[K, asyncio.TimerHandle] = {}
        self._failures: dict[K, int] = {}

    def __len__(self) -> int:
        return len(self._queued) + len(self._dirty)

    def add(self, key: K, *, later: bool = False) -> None:
        """Puts `key` on the queue: first, or with `later` behind everything else."""
        lane = LATER if later else NOW
        if key in self._active:
            self._dirty.add(key)
        elif self._queued.get(key, LATER + 1) > lane:
            self._queued[key] = lane
            self._ready.put_nowait((lane, next(self._order), key))

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
        while True:
            lane, _, key = await self._ready.get()
            if self._queued.get(key) == lane:
                break
        del self._queued[key]
        self._active.add(key)
        return key

    def done(self, key: K) -> None:
        self._active.discard(key)
        if key in self._dirty:
            self._dirty.discard(key)
            self.add(key)
