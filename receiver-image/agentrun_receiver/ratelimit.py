"""maxRunsPerMinute: how many new events a trigger may start runs for in any 60 seconds.

A sliding window per trigger, in this process (each receiver replica counts its own). A
new event takes a place before its run is created and gives it back if no run was created
after all (a duplicate found late, the API server gone), so that deliveries at the same
moment cannot all pass the check before any of them is counted.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Hashable

WINDOW_SECONDS = 60.0


class Window:
    def __init__(self) -> None:
        self._taken: dict[Hashable, collections.deque[float]] = {}

    def take(self, key: Hashable, limit: int, now: float) -> int | None:
        """Takes a place for a new event of `key` at `now` (seconds); returns None when it
        got one, else the seconds until one frees (Retry-After)."""
        taken = self._taken.setdefault(key, collections.deque())
        while taken and taken[0] <= now - WINDOW_SECONDS:
            taken.popleft()
        if len(taken) >= limit:
            return max(1, math.ceil(taken[0] + WINDOW_SECONDS - now))
        taken.append(now)
        return None

    def give_back(self, key: Hashable, at: float) -> None:
        """The place taken at `at` for `key` was not used."""
        taken = self._taken.get(key)
        if taken is not None and at in taken:
            taken.remove(at)
