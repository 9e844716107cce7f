"""`kubectl agentrun approve` shows the whole arguments of the call it decides, read from
the transcript as the current user, and refuses (a sentence, no approval) whatever it
could not show in full or whose digest is not the one the approval would name."""

from __future__ import annotations

from typing import Any

import pytest
from agentrun_kubectl.approve import whole_arguments
from agentrun_kubectl.cluster import REFUSED, Failure

from agentrun.effects import args_digest
from agentrun.vocabulary import TRANSCRIPT_AUTHOR, EntryKind

ARGS = {"body": "x" * 1900, "to": "attacker@evil.example"}
PENDING = {"attempt": 1, "seq": 2, "tool": "send_email", "argsDigest": args_digest(ARGS)}


def asked(args: Any, **more: Any) -> dict[str, Any]:
    return {"kind": EntryKind.APPROVAL, "author": TRANSCRIPT_AUTHOR, "attempt": 1, "seq": 2,
            "tool": "send_email", "args": args, **more}


class Cluster:
    """The one call whole_arguments makes: the run's transcript, as the user."""

    def __init__(self, entries: list[dict[str, Any]] | None = None,
                 refused: str | None = None) -> None:
        self.entries, self.refused = entries, refused

    def transcript(self, run: str) -> dict[str, Any]:
        if self.refused:
            raise Failure(self.refused, REFUSED)
        return {"run": {"name": run}, "entries": self.entries or []}


def test_the_whole_arguments_come_from_the_transcript() -> None:
    cluster = Cluster([asked(ARGS)])
    assert whole_arguments(cluster, "padded", PENDING) == ARGS  # type: ignore[arg-type]


@pytest.mark.parametrize(("cluster", "says"), [
    (Cluster(refused="Error from server (Forbidden): transcripts ... is forbidden"),
     "cannot be read from its transcript (Error from server (Forbidden)"),
    (Cluster([]), "its transcript does not hold its arguments"),
    # The same seq of another attempt is another call.
    (Cluster([asked(ARGS, attempt=3)]), "its transcript does not hold its arguments"),
    # The decision (author: the approver) carries no arguments.
    (Cluster([asked(None, author="ann")]), "its transcript does not hold its arguments"),
    (Cluster([asked({**ARGS, "to": "customer@example.com"})]),
     f"not {args_digest(ARGS)} (what an approval would approve)"),
], ids=["transcript forbidden", "no entry", "another attempt", "only the decision",
        "other arguments"])
def test_what_it_cannot_show_whole_it_refuses_to_approve(cluster: Cluster, says: str) -> None:
    with pytest.raises(Failure) as refused:
        whole_arguments(cluster, "padded", PENDING)  # type: ignore[arg-type]
    assert refused.value.code == REFUSED
    assert "Not deciding call 2 (send_email) of AgentRun padded" in str(refused.value)
    assert says in str(refused.value)
    assert "nothing is approved unseen" in str(refused.value)
