"""The store API's pure decisions, row by row as api.md's "Runner integrity" reads: what a
runner may say about its outcome and its journal, what a TokenReview answer proves, and
which quota a write would exceed."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import Any

import pytest
from agentrun_store_api import limits
from agentrun_store_api.auth import review_refusal
from agentrun_store_api.quotas import Quotas, Usage, fair_pause, over_quota
from agentrun_store_api.routes import ROUTES, refusal_of_journal_close, refusal_of_outcome

from agentrun import store
from agentrun.attempt import AttemptIdentity
from agentrun.vocabulary import STORE_AUDIENCE, Reason, RunStatus


@pytest.mark.parametrize(("status", "reason", "refused"), [
    # The runner's own words.
    (RunStatus.SUCCEEDED, None, None),
    (RunStatus.FAILED, Reason.AGENT_ERROR, None),
    (RunStatus.FAILED, Reason.RATE_LIMITED_AFTER_TOOL_CALL, None),
    (RunStatus.FAILED, Reason.BUDGET_EXCEEDED, None),
    (RunStatus.FAILED, Reason.AWAITING_APPROVAL, None),
    # What only the operator (or the store API) observes; several mean "nothing ran".
    (RunStatus.FAILED, Reason.INPUT_UNAVAILABLE, "'InputUnavailable' is not one"),
    (RunStatus.FAILED, Reason.SESSION_BUSY, "'SessionBusy' is not one"),
    (RunStatus.FAILED, Reason.MODEL_NOT_ALLOWED, "the operator decides it"),
    (RunStatus.FAILED, Reason.EVICTED,
     "one of its own reasons (AgentError, AgentInvalid, AgentNotFound, ApprovalMismatch, "
         "AwaitingApproval"),
    (RunStatus.FAILED, Reason.IMAGE_PULL_FAILED, "is not one"),
    (RunStatus.FAILED, "NoSuchReason", "is not one"),
    (RunStatus.FAILED, None, "a failure names its reason"),
    (RunStatus.SUCCEEDED, Reason.AGENT_ERROR, "a success carries no reason"),
    ("cancelled", None, "status must be succeeded or failed"),
])
def test_what_a_runner_may_report(status: str, reason: str | None, refused: str | None) -> None:
    said = refusal_of_outcome(status, reason)
    if refused is None:
        assert said is None
    else:
        assert said is not None and refused in said, said


def _row(seq: int, tool: str, call_id: str | None) -> store.LedgerEntry:
    return store.LedgerEntry(attempt=2, seq=seq, tool=tool, call_id=call_id,
                             args_digest="sha256:x", started_at=datetime.now(UTC),
                             finished_at=None, outcome=None)


def _journalled(call_id: str, tool: str, finished: bool) -> store.JournalEntry:
    return store.JournalEntry(seq=1, attempt=1, tool=tool, call_id=call_id, effect=None,
                              idempotency_key=None, started_at=datetime.now(UTC),
                              finished=finished, result={"ok": True}, answered=False)


JOURNAL = [_journalled("c1", "send_email", True), _journalled("c2", "update_crm", False)]


@pytest.mark.parametrize(("resuming", "call", "refused"), [
    (True, _row(1, "send_email", "c1"), None),
    # Not a resumed attempt: it has no journal to answer from.
    (False, _row(1, "send_email", "c1"), "resumes none"),
    # In the journal, but never finished there: it is in doubt, not answered.
    (True, _row(1, "update_crm", "c2"), "holds as finished"),
    # Not in the journal at all: it ran here.
    (True, _row(1, "send_email", "c9"), "holds as finished"),
    (True, _row(1, "send_email", None), "call id none"),
    # The journal's call id under another tool: it would erase a send_email.
    (True, _row(1, "read_message", "c1"), "was send_email"),
    # No such row: the close itself answers that (409, not an open call).
    (True, None, None),
])
def test_when_a_call_is_answered_from_the_journal(
        resuming: bool, call: store.LedgerEntry | None, refused: str | None) -> None:
    said = refusal_of_journal_close(resuming, call, JOURNAL)
    if refused is None:
        assert said is None
    else:
        assert said is not None and refused in said, said


POD_USER = {"username": "system:serviceaccount:team-a:default",
            "extra": {"authentication.kubernetes.io/pod-name": ["run-1-1"],
                      "authentication.kubernetes.io/pod-uid": ["u-1"]}}


@pytest.mark.parametrize(("status", "code", "said"), [
    ({"authenticated": True, "audiences": [STORE_AUDIENCE], "user": POD_USER}, None, ""),
    ({"authenticated": False, "error": "token expired"}, 401, "token expired"),
    # Authenticated, but the API server did not confirm our audience.
    ({"authenticated": True, "user": POD_USER}, 401, "did not confirm its audience"),
    ({"authenticated": True, "audiences": ["https://kubernetes.default.svc"],
      "user": POD_USER}, 401, "did not confirm its audience"),
    # A ServiceAccount token not bound to a pod; a user that is no ServiceAccount.
    ({"authenticated": True, "audiences": [STORE_AUDIENCE],
      "user": {"username": "system:serviceaccount:team-a:default"}}, 403, "not bound to a pod"),
    ({"authenticated": True, "audiences": [STORE_AUDIENCE],
      "user": {**POD_USER, "username": "alice"}}, 403, "not bound to a pod"),
])
def test_what_a_token_review_proves(status: dict[str, Any], code: int | None,
                                    said: str) -> None:
    refused = review_refusal(status, STORE_AUDIENCE)
    if code is None:
        assert refused is None
    else:
        assert refused is not None and refused.status == code and said in refused.message


@pytest.mark.parametrize(("used", "more", "said"), [
    (Usage(), Usage(events=1, event_bytes=100), None),
    (Usage(events=limits.EVENTS_PER_ATTEMPT - 1), Usage(events=1), None),
    (Usage(events=limits.EVENTS_PER_ATTEMPT), Usage(events=1),
     "at most 4,000 session events through the store API, and this one has written 4,000"),
    (Usage(event_bytes=limits.EVENT_BYTES_PER_ATTEMPT - 10), Usage(events=1, event_bytes=11),
     "at most 128 MiB of session events"),
    (Usage(result_bytes=limits.RESULT_BYTES_PER_ATTEMPT), Usage(result_bytes=1),
     "64 MiB of tool results"),
    (Usage(outbox_rows=limits.OUTBOX_ROWS_PER_ATTEMPT), Usage(outbox_rows=1), "outbox rows"),
    (Usage(memory_entries=3_999), Usage(memory_entries=2), "4,000 memory entries"),
    (Usage(memory_bytes=limits.MEMORY_BYTES_PER_ATTEMPT), Usage(memory_bytes=1),
     "16 MiB of memory"),
    # Nothing asked of a quota that is full: that quota does not refuse.
    (Usage(outbox_rows=limits.OUTBOX_ROWS_PER_ATTEMPT), Usage(events=1), None),
])
def test_which_quota_a_write_would_exceed(used: Usage, more: Usage, said: str | None) -> None:
    got = over_quota(used, more)
    if said is None:
        assert got is None
    else:
        assert got is not None and said in got, got


@pytest.mark.parametrize(("mine", "everyone", "others", "pause"), [
    # Alone, an attempt goes as fast as it can.
    (1.0, 1.0, False, 0.0),
    # With others, up to its fair share it does not wait...
    (0.5, 1.0, True, 0.0),
    (0.1, 1.0, True, 0.0),
    # ...past it, the more of the time it took, the longer.
    (0.75, 1.0, True, limits.FAIR_PAUSE_SECONDS / 2),
    (1.0, 1.0, True, limits.FAIR_PAUSE_SECONDS),
    # Nothing spent yet by anyone.
    (0.0, 0.0, True, 0.0),
])
def test_a_runner_taking_most_of_the_store_apis_time_waits_its_share(
        mine: float, everyone: float, others: bool, pause: float) -> None:
    assert fair_pause(mine, everyone, others) == pytest.approx(pause)


def _caller(run_uid: str) -> AttemptIdentity:
    return AttemptIdentity(namespace="team-a", pod=f"{run_uid}-1", run_name=run_uid,
                           run_uid=run_uid, attempt=1, agent="support-agent", user_id="u",
                           session_id="s", app_name="team-a/support-agent", input_digest=None)


def test_a_runner_over_its_share_is_served_one_request_at_a_time_while_others_wait() -> None:
    """Its IN_FLIGHT_PER_ATTEMPT places become one while it is over its share and another
    attempt is here; alone, or within its share, it keeps them all."""

    async def most_at_once(flooder_over: bool, other_here: bool) -> int:
        quotas = Quotas(engine=None)  # type: ignore[arg-type]  # turn() reads no store
        flooder, other = _caller("flooder"), _caller("other")
        if flooder_over:
            now = time.monotonic()
            quotas._of(flooder).spent.add(1.0, now)
            quotas._spent.add(1.0, now)
        inside, most = 0, 0
        release = asyncio.Event()

        async def held() -> None:  # the other attempt's request, in the store meanwhile
            async with quotas.turn(other):
                await release.wait()

        async def request() -> None:
            nonlocal inside, most
            async with quotas.turn(flooder):
                inside += 1
                most = max(most, inside)
                await asyncio.sleep(0.005)
                inside -= 1

        holder = asyncio.create_task(held()) if other_here else None
        await asyncio.sleep(0)
        await asyncio.gather(*(request() for _ in range(4)))
        release.set()
        if holder is not None:
            await holder
        return most

    assert limits.IN_FLIGHT_PER_ATTEMPT == 2
    assert [asyncio.run(most_at_once(over, here)) for over, here in (
        (True, True), (True, False), (False, True))] == [1, 2, 2]


def test_a_real_runs_first_event_fits_and_every_route_has_a_body_limit() -> None:
    # 16 input files of 1 MiB, base64, in the first event: inside the event's limit.
    assert 16 * 4 * ((limits.MiB + 2) // 3) < limits.EVENT_BYTES
    assert {r.name for r in ROUTES} == set(limits.BODY_BYTES)
    assert all(limits.BODY_BYTES[r.name] == 0 for r in ROUTES if r.method in ("GET", "DELETE"))
    assert limits.IN_FLIGHT_PER_ATTEMPT < limits.POOL_SIZE
    assert [limits.shown(n) for n in (300, 16 * 1024, 32 * limits.MiB, 1536)] == [
        "300 bytes", "16 KiB", "32 MiB", "1.5 KiB"]
