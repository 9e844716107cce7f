"""Ready / Reconciling / Stalled by phase, as api.md "Conditions for GitOps tools" says."""

from __future__ import annotations

import datetime

import pytest
from agentrun_operator import status as st

from agentrun.vocabulary import Condition, Phase

T0 = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
T1 = T0 + datetime.timedelta(minutes=5)


def by_type(conditions: list[dict]) -> dict[str, str]:
    return {c["type"]: c["status"] for c in conditions}


@pytest.mark.parametrize(("phase", "expected"), [
    ("", {"Ready": "Unknown", "Reconciling": "True"}),
    (Phase.PENDING, {"Ready": "False", "Reconciling": "True"}),
    (Phase.RUNNING, {"Ready": "False", "Reconciling": "True"}),
    (Phase.SUCCEEDED, {"Ready": "True", "Reconciling": "False"}),
    (Phase.FAILED, {"Ready": "False", "Reconciling": "False", "Stalled": "True"}),
    (Phase.CANCELLED, {"Ready": "False", "Reconciling": "False", "Stalled": "True"}),
    ("Approved", {"Ready": "True", "Reconciling": "False"}),
    ("Refused", {"Ready": "False", "Reconciling": "False", "Stalled": "True"}),
])
def test_conditions_by_phase(phase: str, expected: dict[str, str]) -> None:
    assert by_type(st.gitops_conditions(phase, "Why", "said", T0)) == expected


def test_stalled_carries_the_runs_reason_and_message() -> None:
    stalled = next(c for c in st.gitops_conditions(Phase.FAILED, "Evicted", "evicted", T0)
                   if c["type"] == Condition.STALLED)
    assert (stalled["reason"], stalled["message"]) == ("Evicted", "evicted")


def test_every_write_keeps_other_conditions_and_sets_observed_generation() -> None:
    pending = st.with_gitops_conditions(
        st.live_status(Phase.PENDING, "PodCreated", "waiting", T0, {}), 1, T0)
    assert pending["observedGeneration"] == 1
    assert by_type(pending["conditions"]) == {
        "Succeeded": "Unknown", "Ready": "False", "Reconciling": "True"}
    running = st.with_gitops_conditions(
        st.live_status(Phase.RUNNING, "Started", "running", T1, pending), 1, T1)
    ready = {c["type"]: c for c in running["conditions"]}[Condition.READY]
    assert ready["lastTransitionTime"] == st.stamp(T0), "Ready stayed False: no transition"
    failed = st.with_gitops_conditions(
        st.settled_status(Phase.FAILED, "Evicted", "gone", ["send_email"], T1, running), 1, T1)
    assert by_type(failed["conditions"]) == {
        "Succeeded": "False", "ToolsExecuted": "True", "Ready": "False",
        "Reconciling": "False", "Stalled": "True"}
    reconciling = {c["type"]: c for c in failed["conditions"]}[Condition.RECONCILING]
    assert reconciling["lastTransitionTime"] == st.stamp(T1)


def test_the_published_ledger_keeps_call_order_and_says_what_it_left_out() -> None:
    from agentrun.store import LedgerEntry

    def entry(seq: int, finished: bool) -> LedgerEntry:
        return LedgerEntry(attempt=1, seq=seq, tool="send_email", call_id=None,
                           args_digest="sha256:x", started_at=T0,
                           finished_at=T1 if finished else None,
                           outcome="ok" if finished else None, effect="Idempotent",
                           idempotency_key=f"k{seq}")

    few = st.tool_calls([entry(1, True), entry(2, False)])
    assert few == {"toolCalls": [
        {"attempt": 1, "seq": 1, "tool": "send_email", "effect": "Idempotent",
         "idempotencyKey": "k1", "calledAt": st.stamp(T0), "endedAt": st.stamp(T1),
         "outcome": "ok"},
        {"attempt": 1, "seq": 2, "tool": "send_email", "effect": "Idempotent",
         "idempotencyKey": "k2", "calledAt": st.stamp(T0)}]}
    many = st.tool_calls([entry(i, True) for i in range(1, st.TOOL_CALLS_SHOWN + 8)])
    assert [c["seq"] for c in many["toolCalls"]] == list(range(1, st.TOOL_CALLS_SHOWN + 1))
    assert many["toolCallsOmitted"] == 7
    assert st.tool_calls([]) == {"toolCalls": []}
