"""A request the store API will not serve, as the runner is told."""

from __future__ import annotations


class Refused(Exception):
    """A request the store API will not serve: an HTTP status and one sentence, and, when
    the refusal ends the run with a reason of its own, that reason (the runner reports it)."""

    def __init__(self, status: int, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.reason = reason


class NotReady(Refused):
    """503 with Retry-After: the store is not at this code's schema yet (the operator
    migrates it as it starts). Nothing of the request was done: the runner sends it again."""

    RETRY_AFTER_SECONDS = 1

    def __init__(self, message: str) -> None:
        super().__init__(503, message)


class OverQuota(Refused):
    """429: the attempt has written all a quota allows (asking again will not help)."""

    def __init__(self, message: str) -> None:
        super().__init__(429, message)
