"""The interpreter's cyclic garbage collector, and the caches it need not walk.

CPython frees an object when its last reference goes; the cyclic collector is only for
objects that refer to each other in a circle. A full collection walks every container it
tracks, and nothing else in the process runs meanwhile: at 20,000 live runs the caches
hold about 300,000 such containers (15 per run and its pod), and a full collection took
about 0.3 s on a 2-core machine (the modules the operator imports add 130,000 more and
50 ms). An eviction whose pod event came during one waited for it: one eviction in 30
took 523 ms among 20,000 live runs (bench/eviction.py, gated).

The caches are trees decoded from JSON: never part of a circle, freed by reference
counting when a newer copy replaces them. So what has lived a minute is moved out of the
collector's sight (`gc.freeze`: the permanent generation), as are the
imported modules at start-up; a full collection then walks only what is newer. A circle
that became garbage after it was frozen would be kept, so once an hour everything is
looked at again (`gc.unfreeze`, one full collection, `gc.freeze`): one pause of the old
size an hour instead of one whenever the collector's own thresholds chose.

Every collection of the oldest generation, and any collection that took 50 ms or more, is
logged (`event=gc`), with what it walked and how long the process stood still.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("agentrun.operator")

LOGGED_FROM = 0.05  # seconds: a collection this long is logged whatever its generation
WHOLE_EVERY = 3600.0  # seconds between the full collections over everything
SETTLE_EVERY = 60.0  # seconds between two freezes of what is alive


def watch() -> Callable[[str, dict[str, Any]], None]:
    """Logs the collections that matter (see the module), from now on; returns the
    callback (gc.callbacks.remove takes it away)."""
    began = [0.0]

    def collected(phase: str, info: dict[str, Any]) -> None:
        # Runs inside the collector: no locks but logging's (re-entrant), no metrics.
        if phase == "start":
            began[0] = time.perf_counter()
            return
        took = time.perf_counter() - began[0]
        generation = info.get("generation")
        if generation == 2 or took >= LOGGED_FROM:
            log.info("event=gc generation=%s seconds=%.3f collected=%s frozen=%d", generation,
                     took, info.get("collected"), gc.get_freeze_count())

    gc.callbacks.append(collected)
    return collected


class Settler:
    """Moves what has lived long enough out of the collector's sight (see the module)."""

    def __init__(self) -> None:
        self._whole_at = time.monotonic()

    def settle(self) -> None:
        """Everything alive now leaves the collector's sight; once an hour, after one
        collection over everything (unfrozen first)."""
        moment = time.monotonic()
        if moment - self._whole_at >= WHOLE_EVERY:
            self._whole_at = moment
            gc.unfreeze()
            gc.collect()
        else:
            gc.collect(1)  # the young generations' garbage first: cheap, and not frozen
        gc.freeze()
