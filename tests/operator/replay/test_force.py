"""Force, end to end: the admission policy decides who may write the annotation, the
operator only reads it.

What force means, exactly: the replay of a run that already sent an email runs the agent
again, and the agent sends the email again. The test counts the emails in the run store's
`sample_outbox`: one from the original, one more from the forced replay.
"""

from __future__ import annotations

import pytest
from agentrun_devtools.controlplane import ControlPlane
from agentrun_devtools.processes import wait_for

from agentrun.vocabulary import (
    ANNOTATION_FORCE_REPLAY,
    FORCER_CLUSTER_ROLE,
    Condition,
    Phase,
    ReplayPhase,
    ReplayReason,
)
from tests.harness import System
from tests.replays import (
    FORCE_REFUSAL,
    condition,
    create_replay,
    events,
    evicted_after_send_email,
    get_replay,
    replay_runs,
    wait_decided,
)

ALICE = "alice"  # may create replays (agentrun-edit), may not force
BOB = "bob"  # may also force (agentrun-replay-forcer in the namespace)


@pytest.fixture
def people(policies: ControlPlane, namespace: str) -> str:
    policies.kubectl("create", "rolebinding", "editors", "-n", namespace,
                     "--clusterrole=agentrun-edit", f"--user={ALICE}", f"--user={BOB}")
    policies.kubectl("create", "rolebinding", "forcers", "-n", namespace,
                     f"--clusterrole={FORCER_CLUSTER_ROLE}", f"--user={BOB}")
    return namespace


def test_only_a_forcer_can_force_and_force_sends_the_email_again(
        system: System, people: str) -> None:
    ns = people
    evicted_after_send_email(system, ns, "refund", delay=15)
    assert len(system.emails("refund")) == 1

    create_replay(system, ns, "refund-again", "refund", as_user=ALICE)
    replay = wait_decided(system, ns, "refund-again")
    assert replay["status"]["reason"] == ReplayReason.TOOLS_EXECUTED

    # Alice follows the advice in the message, and the API server says why she cannot.
    denied = system.kubectl("annotate", "-n", ns, "agentrunreplay/refund-again",
                            f"{ANNOTATION_FORCE_REPLAY}=true", as_user=ALICE, check=False)
    assert denied.returncode != 0
    assert FORCE_REFUSAL in denied.stderr
    assert f"(alice may not add it in namespace {ns})" in denied.stderr
    assert ANNOTATION_FORCE_REPLAY not in (
        get_replay(system, ns, "refund-again")["metadata"].get("annotations") or {})
    assert get_replay(system, ns, "refund-again")["status"]["phase"] == ReplayPhase.REFUSED

    # Bob may: the Refused replay is examined again and turns Approved, reason Forced.
    system.kubectl("annotate", "-n", ns, "agentrunreplay/refund-again",
                   f"{ANNOTATION_FORCE_REPLAY}=true", as_user=BOB)

    wait_for(lambda: get_replay(system, ns, "refund-again")["status"]["phase"]
             == ReplayPhase.APPROVED, timeout=60, what="forced approval")
    replay = get_replay(system, ns, "refund-again")
    status = replay["status"]
    assert status["reason"] == ReplayReason.FORCED
    assert status["message"].startswith(
        f"Forced with {ANNOTATION_FORCE_REPLAY}=true over ToolsExecuted: This run already "
        "called send_email")
    assert status["toolsExecuted"] == ["send_email"]
    approval = condition(replay, Condition.APPROVED)
    assert (approval["status"], approval["reason"]) == ("True", ReplayReason.FORCED)
    assert [e["reason"] for e in events(system, ns, "refund-again")].count(
        ReplayReason.FORCED) == 1

    # The forced replay runs the agent again, and the agent sends the email again.
    name = status["replayRunName"]
    assert [r["metadata"]["name"] for r in replay_runs(system, ns, "refund")] == [name]
    again = system.wait_phase(ns, name, Phase.SUCCEEDED, Phase.FAILED, timeout=120)
    assert again["status"]["phase"] == Phase.SUCCEEDED, again["status"]
    assert again["status"]["toolsExecuted"] == ["send_email"]
    assert len(system.emails("refund")) == 1
    assert len(system.emails(name)) == 1
    assert {e.args["to"] for e in system.emails("refund") + system.emails(name)} == {
        "customer-42@example.com"}
