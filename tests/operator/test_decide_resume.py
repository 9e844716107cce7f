"""The resume decision, row for row as api.md's "Manual resume" table, and with force."""

from __future__ import annotations

import datetime

import pytest
from agentrun_operator.decide import (
    ANSWERED,
    FINISHED,
    IN_DOUBT,
    Journal,
    JournalCall,
    Original,
    decide_resume,
)

from agentrun import effects
from agentrun.vocabulary import Phase, ReplayPhase, ReplayReason

AT = datetime.datetime(2026, 12, 1, 10, 41, 7, tzinfo=datetime.UTC)


def failed(tools: list[str] | None = None, **kw: object) -> Original:
    return Original(phase=kw.get("phase", Phase.FAILED),  # type: ignore[arg-type]
                    tools_executed=tools, input_digest="sha256:ab",
                    input_available=bool(kw.get("input", True)), reason="Evicted")


def call(seq: int, tool: str, effect: str, state: str) -> JournalCall:
    return JournalCall(seq=seq, tool=tool, effect=effect, state=state, called_at=AT,
                       key=effects.key_for("root", f"adk-{seq}"))


EMAIL_ANSWERED = call(1, "send_email", effects.IDEMPOTENT, ANSWERED)
CRM_FINISHED = call(2, "update_crm", effects.EFFECTFUL, FINISHED)
CHARGE_IN_DOUBT = call(2, "charge_card", effects.EFFECTFUL, IN_DOUBT)
EMAIL_IN_DOUBT = call(1, "send_email", effects.IDEMPOTENT, IN_DOUBT)
LOOKUP_IN_DOUBT = call(1, "read_message", effects.READ_ONLY, IN_DOUBT)
OK = Journal(True, (EMAIL_ANSWERED,))

ROWS = [
    # (id, original, journal, already_replayed_by, phase, reason, forcible)
    ("does not exist", None, OK, None, ReplayPhase.REFUSED, ReplayReason.RUN_NOT_FOUND,
     False),
    ("pending", failed(phase=Phase.PENDING), OK, None, ReplayPhase.REFUSED,
     ReplayReason.ORIGINAL_RUNNING, False),
    ("running", failed(phase=Phase.RUNNING), OK, None, ReplayPhase.REFUSED,
     ReplayReason.ORIGINAL_RUNNING, False),
    ("input snapshot gone", failed(["send_email"], input=False), OK, None,
     ReplayPhase.REFUSED, ReplayReason.INPUT_GONE, False),
    ("journal gone", failed(["send_email"]), Journal(False), None, ReplayPhase.REFUSED,
     ReplayReason.JOURNAL_UNAVAILABLE, False),
    ("toolsExecuted null", failed(None), OK, None, ReplayPhase.REFUSED,
     ReplayReason.JOURNAL_UNAVAILABLE, False),
    ("succeeded", failed(["send_email"], phase=Phase.SUCCEEDED), OK, None,
     ReplayPhase.REFUSED, ReplayReason.ORIGINAL_SUCCEEDED, False),
    ("Effectful call in doubt", failed(["send_email", "charge_card"]),
     Journal(True, (EMAIL_ANSWERED, CHARGE_IN_DOUBT)), None, ReplayPhase.REFUSED,
     ReplayReason.TOOL_CALL_IN_DOUBT, True),
    ("already replayed", failed(["send_email"]), OK, "first-replay", ReplayPhase.REFUSED,
     ReplayReason.ALREADY_REPLAYED, True),
    ("answered and finished calls only", failed(["send_email", "update_crm"]),
     Journal(True, (EMAIL_ANSWERED, CRM_FINISHED)), None, ReplayPhase.APPROVED,
     ReplayReason.RESUMABLE, None),
    ("Idempotent call in doubt", failed(["send_email"]), Journal(True, (EMAIL_IN_DOUBT,)),
     None, ReplayPhase.APPROVED, ReplayReason.RESUMABLE, None),
    ("ReadOnly call in doubt", failed(["read_message"]), Journal(True, (LOOKUP_IN_DOUBT,)),
     None, ReplayPhase.APPROVED, ReplayReason.RESUMABLE, None),
    ("no call at all", failed([]), Journal(True, ()), None, ReplayPhase.APPROVED,
     ReplayReason.RESUMABLE, None),
    # Cancelled in place (CancelRequested) is resumed by the same rules as any end.
    ("cancelled in place, calls finished", failed(["send_email"], phase=Phase.CANCELLED),
     OK, None, ReplayPhase.APPROVED, ReplayReason.RESUMABLE, None),
    ("cancelled in place, an Effectful call in doubt",
     failed(["charge_card"], phase=Phase.CANCELLED), Journal(True, (CHARGE_IN_DOUBT,)), None,
     ReplayPhase.REFUSED, ReplayReason.TOOL_CALL_IN_DOUBT, True),
]


@pytest.mark.parametrize(("original", "journal", "replayed", "phase", "reason", "forcible"),
                         [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_the_table(original: Original | None, journal: Journal, replayed: str | None,
                   phase: str, reason: str, forcible: bool | None) -> None:
    plain = decide_resume("triage-42", original, journal, already_replayed_by=replayed,
                          forced=False)
    assert (plain.phase, plain.reason) == (phase, reason)
    forced = decide_resume("triage-42", original, journal, already_replayed_by=replayed,
                           forced=True)
    if forcible is None:  # approved anyway: force changes nothing
        assert (forced.phase, forced.reason) == (phase, reason)
    elif forcible:
        assert (forced.phase, forced.reason) == (ReplayPhase.APPROVED, ReplayReason.FORCED)
    else:
        assert (forced.phase, forced.reason) == (phase, reason)


def test_the_model_sentence_of_a_call_in_doubt() -> None:
    decided = decide_resume("triage-42", failed(["send_email", "charge_card"]),
                            Journal(True, (EMAIL_ANSWERED, CHARGE_IN_DOUBT)),
                            already_replayed_by=None, forced=False)
    assert decided.message == (
        "AgentRun triage-42 called charge_card (call 2, at 10:41:07Z) and never recorded its "
        "end: it may or may not have happened, and charge_card is Effectful. Check whether "
        "it happened; annotate agentrun.dev/force-replay=true to resume and call it again.")


def test_the_approval_lists_what_is_not_repeated_and_what_runs_again_with_its_key() -> None:
    decided = decide_resume("triage-42", failed(["send_email", "update_crm"]),
                            Journal(True, (CRM_FINISHED, EMAIL_IN_DOUBT)),
                            already_replayed_by=None, forced=False)
    assert "not repeated: update_crm (call 2)" in decided.message
    assert "run again, in doubt: send_email (call 1, Idempotent, key agentrun-" in \
        decided.message
