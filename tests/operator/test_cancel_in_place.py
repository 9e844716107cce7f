"""Cancel in place: a live run annotated agentrun.dev/cancel ends Cancelled (CancelRequested)
with its pod stopped and its tools counted, fenced like any end, and the object stays; a
cancelled run is replayed by the usual rules."""

from __future__ import annotations

import json

from agentrun_devtools.processes import wait_for

from agentrun import store
from agentrun.vocabulary import (
    ANNOTATION_CANCEL,
    ANNOTATION_CANCEL_NOTE,
    Phase,
    Reason,
    ReplayReason,
    RunStatus,
)
from tests.harness import System, agent_run, email_then_wait, in_namespace
from tests.kubectl_plugin import plugin
from tests.replays import create_replay, wait_decided


def _pod_gone(system: System, namespace: str, pod: str) -> bool:
    return system.get("pod", namespace, pod) is None


def test_a_running_run_annotated_cancel_ends_cancelled_and_stays(
        system: System, namespace: str) -> None:
    # send_email records its email, then takes a minute to answer: it acted, and the run
    # is still going when it is cancelled.
    system.apply(in_namespace(agent_run("cancelled-mail", email_then_wait(60)), namespace))
    uid = system.wait_phase(namespace, "cancelled-mail", Phase.RUNNING)["metadata"]["uid"]
    system.wait_ledger(uid, "send_email")

    system.kubectl("annotate", "agentrun", "cancelled-mail", "-n", namespace,
                   f"{ANNOTATION_CANCEL}=true",
                   f"{ANNOTATION_CANCEL_NOTE}=the customer called: no email please")
    run = system.wait_phase(namespace, "cancelled-mail", Phase.CANCELLED, Phase.FAILED,
                            Phase.SUCCEEDED, timeout=60)

    status = run["status"]
    assert (status["phase"], status["reason"]) == (Phase.CANCELLED, Reason.CANCEL_REQUESTED)
    assert status["toolsExecuted"] == ["send_email"]
    assert "Cancelled on request (agentrun.dev/cancel): the customer called: no email please." \
        in status["message"]
    assert "Its runner pod was stopped." in status["message"]
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Succeeded"]["status"] == "False"
    assert conditions["Stalled"]["reason"] == Reason.CANCEL_REQUESTED
    # The pod is stopped, the object stays, and the store holds the same end.
    wait_for(lambda: _pod_gone(system, namespace, "cancelled-mail-1"), timeout=30,
             what="the runner pod stopped")
    assert system.run(namespace, "cancelled-mail")["status"]["phase"] == Phase.CANCELLED
    recorded = system.store(lambda e: store.get_run(e, uid))
    assert recorded is not None
    assert (recorded.status, recorded.reason) == (RunStatus.CANCELLED, Reason.CANCEL_REQUESTED)
    assert recorded.tools_executed == ["send_email"]
    assert len(system.emails("cancelled-mail")) == 1
    events = json.loads(system.kubectl(
        "get", "events", "-n", namespace, "--field-selector", "involvedObject.name=cancelled-mail",
        "-o", "json").stdout)["items"]
    assert any(e["reason"] == Reason.CANCEL_REQUESTED and "Tools executed: send_email" in
               e["message"] for e in events), [e["reason"] for e in events]
    # Its replay is refused as for any run that called a tool.
    create_replay(system, namespace, "cancelled-again", "cancelled-mail")
    decided = wait_decided(system, namespace, "cancelled-again")
    assert decided["status"]["reason"] == ReplayReason.TOOLS_EXECUTED
    assert "already called send_email before being cancelled" in decided["status"]["message"]


def test_kubectl_agentrun_cancel_before_any_tool_then_a_replay_is_approved(
        system: System, namespace: str) -> None:
    system.apply(in_namespace(agent_run("idle-thinking", [{"sleep": 60}, {"text": "done"}]),
                              namespace))
    system.wait_phase(namespace, "idle-thinking", Phase.RUNNING)
    system.wait_pod_running(namespace, "idle-thinking-1")

    done = plugin(system, "cancel", "idle-thinking", "-n", namespace, "--note", "not needed")
    assert done.returncode == 0, done.stderr
    assert "agentrun/idle-thinking annotated agentrun.dev/cancel=true" in done.stdout
    run = system.wait_phase(namespace, "idle-thinking", Phase.CANCELLED, Phase.FAILED,
                            Phase.SUCCEEDED, timeout=60)
    assert (run["status"]["reason"], run["status"]["toolsExecuted"]) == (
        Reason.CANCEL_REQUESTED, [])
    assert "not needed" in run["status"]["message"]
    wait_for(lambda: _pod_gone(system, namespace, "idle-thinking-1"), timeout=30,
             what="the runner pod stopped")
    again = plugin(system, "cancel", "idle-thinking", "-n", namespace)
    assert "already Cancelled; nothing to cancel" in again.stdout

    create_replay(system, namespace, "idle-thinking-again", "idle-thinking")
    assert wait_decided(system, namespace, "idle-thinking-again")["status"]["reason"] == \
        ReplayReason.NO_TOOLS_EXECUTED


def test_a_settled_run_annotated_cancel_stays_as_it_ended(system: System,
                                                          namespace: str) -> None:
    system.apply(in_namespace(agent_run("quick", [{"text": "done"}]), namespace))
    system.wait_phase(namespace, "quick", Phase.SUCCEEDED, Phase.FAILED)
    system.kubectl("annotate", "agentrun", "quick", "-n", namespace,
                   f"{ANNOTATION_CANCEL}=true")
    # The annotation's event is reconciled, and changes nothing.
    wait_for(lambda: ANNOTATION_CANCEL in (system.run(namespace, "quick")["metadata"].get(
        "annotations") or {}), timeout=10, what="the annotation")
    assert system.run(namespace, "quick")["status"]["phase"] == Phase.SUCCEEDED
