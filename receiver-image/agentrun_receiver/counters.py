"""A trigger's status.received, duplicates and lastEventTime, kept by the receiver.

Deliveries only add to counters in memory; one writer per trigger then adds them to the
trigger's status, with the resourceVersion it read as the precondition (the operator
writes the same status whole, its conditions and url, with its own precondition: whoever
writes second reads again). A burst of deliveries costs one write, not one each; a write
that fails (the API server gone) is tried again, its counts kept.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from dataclasses import dataclass

from agentrun_receiver.kube import Conflict, Kube, Unavailable

log = logging.getLogger("agentrun.receiver")

# A writer waits this long for the deliveries of a burst before it writes.
GATHER_SECONDS = 0.2
RETRY_SECONDS = (0.2, 1.0, 5.0)
Key = tuple[str, str]


@dataclass
class _Pending:
    received: int = 0
    duplicates: int = 0
    last: str = ""


class Counters:
    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        self._pending: dict[Key, _Pending] = {}
        self._writers: dict[Key, asyncio.Task[None]] = {}

    def add(self, key: Key, *, duplicate: bool, when: datetime.datetime) -> None:
        pending = self._pending.setdefault(key, _Pending())
        pending.received += 1
        pending.duplicates += int(duplicate)
        pending.last = max(pending.last, when.strftime("%Y-%m-%dT%H:%M:%SZ"))
        if key not in self._writers:
            self._writers[key] = asyncio.create_task(self._write(key))

    async def _write(self, key: Key) -> None:
        tries = 0
        try:
            while key in self._pending:
                await asyncio.sleep(GATHER_SECONDS if tries == 0 else
                                    RETRY_SECONDS[min(tries, len(RETRY_SECONDS)) - 1])
                pending = self._pending.pop(key)
                try:
                    await self.kube.count(*key, pending.received, pending.duplicates,
                                          pending.last)
                    tries = 0
                except (Conflict, Unavailable) as e:
                    self._merge(key, pending)
                    tries += 1
                    if not isinstance(e, Conflict):
                        log.warning("event=trigger-status-not-written trigger=%s/%s error=%r",
                                    *key, e)
                except Exception as e:
                    # The trigger was refused the write for good (it is being deleted...):
                    # its counts are dropped, said once.
                    log.warning("event=trigger-status-dropped trigger=%s/%s error=%r", *key, e)
        finally:
            self._writers.pop(key, None)

    def _merge(self, key: Key, pending: _Pending) -> None:
        now = self._pending.setdefault(key, _Pending())
        now.received += pending.received
        now.duplicates += pending.duplicates
        now.last = max(now.last, pending.last)

    async def flush(self) -> None:
        """Waits for every writer (at shutdown)."""
        for task in list(self._writers.values()):
            await asyncio.gather(task, return_exceptions=True)
