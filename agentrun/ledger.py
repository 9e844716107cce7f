"""One tool call as the ledger saw it: the record the run store reads, the operator
publishes in status.toolCalls and the kubectl plugin shows (the standard library only)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any


@dataclass(frozen=True)
class LedgerEntry:
    """One tool call as the ledger saw it. `finished_at` None: the tool never answered."""

    attempt: int
    seq: int
    tool: str
    call_id: str | None
    args_digest: str
    started_at: datetime
    finished_at: datetime | None
    outcome: str | None
    effect: str | None = None
    idempotency_key: str | None = None
    result: Any = None
