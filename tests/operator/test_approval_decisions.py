"""judge(): what an AgentRunApproval does, row by row (api.md, "Approval"), and how the
call a run waits for is shown on it."""

from __future__ import annotations

import datetime
from dataclasses import dataclass, replace

import pytest
from agentrun_operator.approval import call_text, judge, pending_status

from agentrun.store import Approval
from agentrun.vocabulary import ApprovalPhase, ApprovalReason

AT = datetime.datetime(2026, 3, 2, 10, 41, 5, tzinfo=datetime.UTC)
DIGEST = "sha256:" + "ab" * 32
WAITING = Approval(run_uid="u", call_id="c2", attempt=1, seq=2, tool="charge_card",
                   args='{"amount":120,"customer":"42"}', args_digest=DIGEST,
                   requested_at=AT, expires_at=AT + datetime.timedelta(days=1),
                   decision=None, approver=None, note=None, decided_at=None,
                   approval_name=None)
DECIDED = replace(WAITING, decision="Approve", approver="alice", decided_at=AT)


def spec(seq: int = 2, digest: str = DIGEST, decision: str = "Approve") -> dict[str, object]:
    return {"runName": "triage-42", "seq": seq, "argsDigest": digest, "decision": decision,
            "approver": "bob"}


@dataclass(frozen=True)
class Row:
    name: str
    spec: dict[str, object]
    run_exists: bool
    pending: Approval | None
    decided: tuple[Approval, ...]
    phase: str
    reason: str
    says: str
    creator: str | None = None  # the run's agentrun.dev/created-by
    allow_self: bool = False  # the chart's approval.allowSelfApproval


TABLE = [
    Row("the run does not exist", spec(), False, None, (), ApprovalPhase.REJECTED,
        ApprovalReason.RUN_NOT_FOUND, "AgentRun triage-42 does not exist"),
    Row("the call was decided already", spec(), True, None, (DECIDED,),
        ApprovalPhase.REJECTED, ApprovalReason.ALREADY_DECIDED,
        "was already decided: Approve by alice"),
    Row("the run waits for nothing", spec(), True, None, (), ApprovalPhase.REJECTED,
        ApprovalReason.NOT_PENDING, "it waits for no approval"),
    Row("the run waits for another call", spec(seq=3), True, WAITING, (),
        ApprovalPhase.REJECTED, ApprovalReason.NOT_PENDING,
        "it waits for call 2 (charge_card)"),
    Row("other arguments", spec(digest="sha256:" + "cd" * 32), True, WAITING, (),
        ApprovalPhase.REJECTED, ApprovalReason.ARGS_MISMATCH,
        "approves exactly the arguments it names"),
    Row("the waiting call, approved", spec(), True, WAITING, (), ApprovalPhase.ACCEPTED,
        ApprovalReason.DECIDED, "is approved by bob"),
    Row("the waiting call, denied", spec(decision="Deny"), True, WAITING, (),
        ApprovalPhase.ACCEPTED, ApprovalReason.DECIDED, "is denied by bob"),
    # Four eyes: bob created the run, so bob's decision is refused, the call still waits.
    Row("the run's creator approves", spec(), True, WAITING, (), ApprovalPhase.REJECTED,
        ApprovalReason.SELF_APPROVAL, "bob created AgentRun triage-42 and may not decide",
        creator="bob"),
    Row("the run's creator denies", spec(decision="Deny"), True, WAITING, (),
        ApprovalPhase.REJECTED, ApprovalReason.SELF_APPROVAL, "The call stays pending",
        creator="bob"),
    Row("the creator, where self-approval is allowed", spec(), True, WAITING, (),
        ApprovalPhase.ACCEPTED, ApprovalReason.DECIDED, "is approved by bob", creator="bob",
        allow_self=True),
    Row("another user's run", spec(), True, WAITING, (), ApprovalPhase.ACCEPTED,
        ApprovalReason.DECIDED, "is approved by bob", creator="carol"),
    Row("a run that records no creator", spec(), True, WAITING, (), ApprovalPhase.ACCEPTED,
        ApprovalReason.DECIDED, "is approved by bob", creator=None),
    # Who decides comes before what: the creator is told so even for the wrong digest.
    Row("the creator, other arguments", spec(digest="sha256:" + "cd" * 32), True, WAITING,
        (), ApprovalPhase.REJECTED, ApprovalReason.SELF_APPROVAL, "four eyes",
        creator="bob"),
    # A later wait of the same seq (another attempt) is a call of its own.
    Row("a new wait of an already decided seq", spec(), True,
        replace(WAITING, attempt=3, call_id="c9"), (DECIDED,), ApprovalPhase.ACCEPTED,
        ApprovalReason.DECIDED, "is approved by bob"),
]


@pytest.mark.parametrize("row", TABLE, ids=[r.name for r in TABLE])
def test_judge(row: Row) -> None:
    verdict = judge(row.spec, "triage-42", row.run_exists, row.pending, row.decided,
                    row.creator, row.allow_self)
    assert (verdict.phase, verdict.reason) == (row.phase, row.reason)
    assert row.says in verdict.message
    assert verdict.decides == (row.reason == ApprovalReason.DECIDED)


def test_the_pending_call_shows_its_arguments_cut_at_1024_bytes() -> None:
    shown = pending_status(WAITING)
    assert shown == {"attempt": 1, "seq": 2, "tool": "charge_card", "argsDigest": DIGEST,
                     "args": '{"amount":120,"customer":"42"}', "argsTruncated": False,
                     "requestedAt": "2026-03-02T10:41:05Z",
                     "expiresAt": "2026-03-03T10:41:05Z"}
    long = pending_status(replace(WAITING, args='{"note":"' + "é" * 1000 + '"}'))
    assert long["argsTruncated"] is True and len(long["args"].encode()) <= 1024
    assert call_text(WAITING) == 'charge_card(amount=120, customer="42")'
