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
