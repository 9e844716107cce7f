"""`kubectl agentrun approve` shows the whole arguments of the call it decides, read from
the transcript as the current user, and refuses (a sentence, no approval) whatever it
could not show in full or whose digest is not the one the approval would name."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
from pathlib import Path
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


def _paged(tmp_path: Path, pager: str, lines: int) -> tuple[int, str, str]:
    """_show_long of `lines` lines in a process whose output is a terminal of 10 lines,
    with PAGER `pager`: its exit code (0 shown, 1 refused), what the terminal got, and
    what it said on stderr."""
    text = "\n".join(f"line {i}" for i in range(lines))
    child = ("import sys\n"
             "from agentrun_kubectl.approve import Failure, _show_long\n"
             "try:\n"
             f"    _show_long({text!r}, 'call 2 (send_email) of AgentRun padded')\n"
             "except Failure as e:\n"
             "    print(e, file=sys.stderr)\n"
             "    sys.exit(1)\n")
    primary, secondary = pty.openpty()
    try:
        done = subprocess.run([sys.executable, "-c", child], stdin=subprocess.DEVNULL,
                              stdout=secondary, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "PAGER": pager, "LINES": "10",
                                   "COLUMNS": "80"}, timeout=60)
        os.close(secondary)
        secondary = -1
        seen = b""
        while True:
            try:
                chunk = os.read(primary, 65536)
            except OSError:  # the terminal's other side is closed: all was read
                break
            if not chunk:
                break
            seen += chunk
    finally:
        os.close(primary)
        if secondary >= 0:
            os.close(secondary)
    return done.returncode, seen.decode(), done.stderr


def test_long_arguments_go_through_the_pager_whole(tmp_path: Path) -> None:
    kept = tmp_path / "paged"
    code, seen, said = _paged(tmp_path, f"cat > {kept}", 200)
    assert code == 0, said
    assert kept.read_text().splitlines() == [f"line {i}" for i in range(200)]
    # Short ones are printed as they are.
    code, seen, said = _paged(tmp_path, "exit 3", 3)
    assert code == 0 and "line 2" in seen, said


@pytest.mark.parametrize("pager", ["exit 3", "no-such-pager-here"])
def test_a_pager_that_could_not_show_them_refuses(tmp_path: Path, pager: str) -> None:
    code, _, said = _paged(tmp_path, pager, 200)
    assert code == 1
    assert "Not deciding call 2 (send_email) of AgentRun padded: the pager" in said
    assert "nothing is approved unseen" in said
