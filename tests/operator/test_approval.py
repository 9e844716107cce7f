"""Approval before an effect: a call that needs one waits (no pod), an approver decides
with an AgentRunApproval, the call runs once or is denied, with real runners, real RBAC and
admission, and the operator restarted while a run waits."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from agentrun_devtools.processes import wait_for
from sqlalchemy import update

from agentrun import store
from agentrun.store.schema import approvals
from agentrun.vocabulary import (
    ANNOTATION_CREATED_BY,
    ANNOTATION_TEMPLATE_BY,
    API_VERSION,
    APPROVER_CLUSTER_ROLE,
    GROUP,
    LABEL_SCHEDULE,
    SCHEDULE_KIND,
    ApprovalPhase,
    ApprovalReason,
    LedgerOutcome,
    Phase,
    Reason,
    ReplayReason,
)
from tests.approvals import CHARGE, REQUIRED, SCRIPT, approval, create_as, waiting
from tests.harness import Operator, System, agent_run, delete_namespace, in_namespace

APPROVALS = f"agentrunapprovals.{GROUP}"
SCHEDULES = f"agentrunschedules.{GROUP}"


def bind(system: System, namespace: str, user: str, role: str) -> None:
    system.kubectl("create", "rolebinding", f"{user}-{role}", "-n", namespace,
                   f"--clusterrole={role}", f"--user={user}")


@pytest.fixture
def people(system: System, namespace: str) -> str:
    """ann may approve (agentrun-approver); sam may only edit (agentrun-edit)."""
    bind(system, namespace, "ann", APPROVER_CLUSTER_ROLE)
    bind(system, namespace, "sam", "agentrun-edit")
    return namespace


def settled(system: System, namespace: str, name: str) -> dict[str, Any]:
    return system.wait_run(namespace, name, lambda r: (r.get("status") or {}).get(
        "phase") in (Phase.SUCCEEDED, Phase.FAILED) and r["status"].get(
        "toolsExecuted") is not None)["status"]


def verdict(system: System, namespace: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = {}

    def judged() -> bool:
        nonlocal found
        found = system.get(APPROVALS, namespace, name) or {}
        return bool((found.get("status") or {}).get("phase"))

    deadline = time.monotonic() + 60
    while not judged():
        assert time.monotonic() < deadline, f"AgentRunApproval {name} not judged: {found}"
        time.sleep(0.2)
    return dict(found["status"])


def charges(system: System, run: str) -> list[Any]:
    return [r for r in system.store(lambda e: store.outbox(e, run)) if r.tool == "charge_card"]


def live_pods(system: System, namespace: str, run: str) -> list[str]:
    done = system.kubectl("get", "pods", "-n", namespace, "-l", f"agentrun.dev/run={run}",
                          "-o", "json")
    return [p["metadata"]["name"] for p in json.loads(done.stdout)["items"]]


def test_a_required_call_waits_without_a_pod_and_runs_once_when_approved(
        system: System, people: str) -> None:
    ns = people
    system.apply(in_namespace(agent_run("pay", SCRIPT, tools=REQUIRED), ns))
    run = waiting(system, ns, "pay")
    status = run["status"]
    assert status["reason"] == Reason.AWAITING_APPROVAL
    pending = status["pendingApproval"]
    assert (pending["tool"], pending["seq"], pending["attempt"]) == ("charge_card", 2, 1)
    assert json.loads(pending["args"]) == CHARGE
    assert pending["argsDigest"] == store.args_digest(CHARGE)
    assert status["toolsExecuted"] == ["read_message"]  # charge_card asked for, not run
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["ApprovalPending"]["status"] == "True"
    assert (conditions["Ready"]["status"], conditions["Reconciling"]["status"]) == (
        "False", "False")
    assert charges(system, "pay") == []
    # No compute while a human decides: the attempt's pod is gone.
    system.wait_run(ns, "pay", lambda r: live_pods(system, ns, "pay") == [])

    done = create_as(system, "ann", approval(ns, "pay-call-2", "pay", pending, "ann",
                                             note="customer confirmed"))
    assert done.returncode == 0, done.stderr
    assert (verdict(system, ns, "pay-call-2")["reason"]) == ApprovalReason.DECIDED
    status = settled(system, ns, "pay")
    assert status["phase"] == Phase.SUCCEEDED, status
    assert status["toolsExecuted"] == ["read_message", "charge_card"]
    assert len(charges(system, "pay")) == 1
    assert status["attempts"] == 2
    assert "pendingApproval" not in status or status["pendingApproval"] is None
    # A second approval of the decided call is rejected, and changes nothing.
    again = create_as(system, "ann", approval(ns, "pay-call-2-again", "pay", pending, "ann",
                                              decision="Deny"))
    assert again.returncode == 0, again.stderr
    assert verdict(system, ns, "pay-call-2-again")["reason"] == ApprovalReason.ALREADY_DECIDED
    assert len(charges(system, "pay")) == 1


def test_a_denied_call_never_runs_and_the_model_is_told(
        system: System, people: str) -> None:
    ns = people
    system.apply(in_namespace(agent_run("no-pay", SCRIPT, tools=REQUIRED), ns))
    pending = waiting(system, ns, "no-pay")["status"]["pendingApproval"]
    done = create_as(system, "ann", approval(ns, "no-pay-call-2", "no-pay", pending, "ann",
                                             decision="Deny", note="not this month"))
    assert done.returncode == 0, done.stderr
    status = settled(system, ns, "no-pay")
    assert status["phase"] == Phase.SUCCEEDED, status  # the run goes on
    assert status["toolsExecuted"] == ["read_message"]
    assert charges(system, "no-pay") == []
    uid = system.run(ns, "no-pay")["metadata"]["uid"]
    denied = [e for e in system.store(lambda e: store.ledger(e, uid)) if e.tool == "charge_card"]
    assert [(e.outcome, e.result) for e in denied] == [
        (LedgerOutcome.DENIED, {"error": "denied by ann: not this month"})]


def test_admission_keeps_approvals_to_approvers_deciding_as_themselves(
        system: System, people: str) -> None:
    ns = people
    system.apply(in_namespace(agent_run("guarded", SCRIPT, tools=REQUIRED), ns))
    pending = waiting(system, ns, "guarded")["status"]["pendingApproval"]
    forged = create_as(system, "ann", approval(ns, "forged", "guarded", pending, "bob"))
    assert forged.returncode != 0
    assert "spec.approver must be your own user name: ann may not decide as bob" in \
        forged.stderr
    editor = create_as(system, "sam", approval(ns, "by-sam", "guarded", pending, "sam"))
    assert editor.returncode != 0 and "forbidden" in editor.stderr.lower()
    # Another namespace's approver may not approve here.
    other = system.kubectl("create", "namespace", f"{ns}-other", check=False)
    assert other.returncode == 0, other.stderr
    try:
        bind(system, f"{ns}-other", "olga", APPROVER_CLUSTER_ROLE)
        foreign = create_as(system, "olga", approval(ns, "by-olga", "guarded", pending, "olga"))
        assert foreign.returncode != 0 and "forbidden" in foreign.stderr.lower()
    finally:
        delete_namespace(system.plane, f"{ns}-other")
    assert system.run(ns, "guarded")["status"]["phase"] == Phase.WAITING
    assert charges(system, "guarded") == []


def test_an_approval_of_other_arguments_is_rejected_and_the_run_keeps_waiting(
        system: System, people: str) -> None:
    ns = people
    system.apply(in_namespace(agent_run("exact", SCRIPT, tools=REQUIRED), ns))
    pending = waiting(system, ns, "exact")["status"]["pendingApproval"]
    other = store.args_digest({"customer": "42", "amount": 12000})
    done = create_as(system, "ann", approval(ns, "exact-wrong", "exact", pending, "ann",
                                             digest=other))
    assert done.returncode == 0, done.stderr
    said = verdict(system, ns, "exact-wrong")
    assert (said["phase"], said["reason"]) == (ApprovalPhase.REJECTED,
                                               ApprovalReason.ARGS_MISMATCH)
    time.sleep(2)  # nothing happens: it waits (no timed bound: a state that must hold)
    assert system.run(ns, "exact")["status"]["phase"] == Phase.WAITING
    assert charges(system, "exact") == []


def test_the_timeout_denies(system: System, people: str) -> None:
    ns = people
    tools = [{"name": "charge_card", "approval": "Required", "approvalTimeoutSeconds": 3}]
    system.apply(in_namespace(agent_run("too-late", SCRIPT, tools=tools), ns))
    waiting(system, ns, "too-late")
    status = settled(system, ns, "too-late")
    assert status["phase"] == Phase.SUCCEEDED and status["toolsExecuted"] == ["read_message"]
    assert charges(system, "too-late") == []
    uid = system.run(ns, "too-late")["metadata"]["uid"]
    decided = system.store(lambda e: store.approvals_of(e, uid))
    assert [(a.decision, a.approver) for a in decided] == [("Deny", "timeout")]


def test_adks_own_require_confirmation_waits_the_same_way(
        system: System, people: str) -> None:
    ns = people
    script = [{"call": "issue_refund", "args": {"customer": "42", "amount": 30}},
              {"text": "Refunded."}]
    system.apply(in_namespace(agent_run("refund", script), ns))
    pending = waiting(system, ns, "refund")["status"]["pendingApproval"]
    assert pending["tool"] == "issue_refund"
    done = create_as(system, "ann", approval(ns, "refund-call-1", "refund", pending, "ann"))
    assert done.returncode == 0, done.stderr
    status = settled(system, ns, "refund")
    assert status["phase"] == Phase.SUCCEEDED, status
    assert status["toolsExecuted"] == ["issue_refund"]
    refunds = [r for r in system.store(lambda e: store.outbox(e, "refund"))
               if r.tool == "issue_refund"]
    assert len(refunds) == 1


def test_a_restarted_operator_loses_no_wait_and_decides_nothing_twice(
        system: System, people: str) -> None:
    ns = people
    system.apply(in_namespace(agent_run("patient", SCRIPT, tools=REQUIRED), ns))
    pending = waiting(system, ns, "patient")["status"]["pendingApproval"]
    system.operator.kill()
    try:
        done = create_as(system, "ann", approval(ns, "patient-call-2", "patient", pending,
                                                 "ann"))
        assert done.returncode == 0, done.stderr
        second = create_as(system, "ann", approval(ns, "patient-call-2-b", "patient",
                                                   pending, "ann", decision="Deny"))
        assert second.returncode == 0, second.stderr
    finally:
        system.operator.start()
    reasons = {verdict(system, ns, "patient-call-2")["reason"],
               verdict(system, ns, "patient-call-2-b")["reason"]}
    assert reasons == {ApprovalReason.DECIDED, ApprovalReason.ALREADY_DECIDED}
    status = settled(system, ns, "patient")
    uid = system.run(ns, "patient")["metadata"]["uid"]
    decided = system.store(lambda e: store.approvals_of(e, uid))
    assert len(decided) == 1 and decided[0].decision is not None
    ran = len(charges(system, "patient"))
    assert ran == (1 if decided[0].decision == "Approve" else 0)
    assert status["phase"] == Phase.SUCCEEDED


def test_an_approved_call_evicted_in_doubt_follows_the_resume_rules(
        system: System, people: str) -> None:
    ns = people
    script = [{"call": "charge_card", "args": {**CHARGE, "delay_seconds": 60}},
              {"text": "Charged."}]
    system.apply(in_namespace(agent_run("charge-doubtful", script, tools=REQUIRED,
                                        retry={"maxAttempts": 3, "resume": True}), ns))
    pending = waiting(system, ns, "charge-doubtful")["status"]["pendingApproval"]
    done = create_as(system, "ann", approval(ns, "charge-doubtful-call-1", "charge-doubtful",
                                             pending, "ann"))
    assert done.returncode == 0, done.stderr
    system.wait_run(ns, "charge-doubtful", lambda r: len(charges(system, "charge-doubtful")) == 1)
    system.wait_pod_running(ns, "charge-doubtful-2")
    system.evict(ns, "charge-doubtful-2")
    status = settled(system, ns, "charge-doubtful")
    assert (status["phase"], status["reason"]) == (Phase.FAILED, Reason.EVICTED)
    assert status["toolsExecuted"] == ["charge_card"]
    resumable = {c["type"]: c for c in status["conditions"]}["Resumable"]
    assert (resumable["status"], resumable["reason"]) == ("False",
                                                          ReplayReason.TOOL_CALL_IN_DOUBT)
    assert len(charges(system, "charge-doubtful")) == 1


def test_a_waiting_run_cancelled_in_place_never_makes_its_call(
        system: System, people: str) -> None:
    ns = people
    system.apply(in_namespace(agent_run("abandoned", SCRIPT, tools=REQUIRED), ns))
    pending = waiting(system, ns, "abandoned")["status"]["pendingApproval"]
    system.kubectl("annotate", "agentrun", "abandoned", "-n", ns, "agentrun.dev/cancel=true")
    status = settled_or_cancelled(system, ns, "abandoned")
    assert (status["phase"], status["reason"]) == (Phase.CANCELLED, "CancelRequested")
    assert status["toolsExecuted"] == ["read_message"]
    assert "the call never ran" in status["message"]
    late = create_as(system, "ann", approval(ns, "abandoned-call-2", "abandoned", pending,
                                             "ann"))
    assert late.returncode == 0, late.stderr
    assert verdict(system, ns, "abandoned-call-2")["reason"] == ApprovalReason.ALREADY_DECIDED
    assert charges(system, "abandoned") == []
    assert system.run(ns, "abandoned")["status"]["phase"] == Phase.CANCELLED


def settled_or_cancelled(system: System, namespace: str, name: str) -> dict[str, Any]:
    return system.wait_run(namespace, name, lambda r: (r.get("status") or {}).get(
        "phase") in (Phase.SUCCEEDED, Phase.FAILED, Phase.CANCELLED))["status"]


# -- four eyes, and what an approval approves ------------------------------------------------


@pytest.fixture
def eve(system: System, people: str) -> str:
    """eve may both edit (create runs) and approve in the namespace."""
    bind(system, people, "eve", "agentrun-edit")
    bind(system, people, "eve", APPROVER_CLUSTER_ROLE)
    return people


def test_the_runs_creator_cannot_approve_its_call_another_approver_can(
        system: System, eve: str) -> None:
    ns = eve
    made = create_as(system, "eve", in_namespace(agent_run("mine", SCRIPT, tools=REQUIRED), ns))
    assert made.returncode == 0, made.stderr
    run = waiting(system, ns, "mine")
    assert run["metadata"]["annotations"][ANNOTATION_CREATED_BY] == "eve"
    pending = run["status"]["pendingApproval"]

    done = create_as(system, "eve", approval(ns, "mine-by-eve", "mine", pending, "eve"))
    assert done.returncode == 0, done.stderr  # admission cannot see the run: the operator
    said = verdict(system, ns, "mine-by-eve")
    assert (said["phase"], said["reason"]) == (ApprovalPhase.REJECTED,
                                               ApprovalReason.SELF_APPROVAL)
    assert "eve created AgentRun mine and may not decide its calls" in said["message"]
    # The call stays pending: ann's approval below decides it (it would be NotPending or
    # AlreadyDecided had eve's decided anything).
    still = system.run(ns, "mine")["status"]
    assert still["phase"] == Phase.WAITING
    assert still["pendingApproval"]["seq"] == pending["seq"]
    assert charges(system, "mine") == []

    done = create_as(system, "ann", approval(ns, "mine-by-ann", "mine", pending, "ann"))
    assert done.returncode == 0, done.stderr
    assert verdict(system, ns, "mine-by-ann")["reason"] == ApprovalReason.DECIDED
    status = settled(system, ns, "mine")
    assert status["phase"] == Phase.SUCCEEDED, status
    assert len(charges(system, "mine")) == 1


def test_nobody_writes_or_changes_who_created_a_run(system: System, eve: str) -> None:
    ns = eve
    forged = in_namespace(agent_run("forged", SCRIPT, tools=REQUIRED), ns)
    forged["metadata"]["annotations"] = {ANNOTATION_CREATED_BY: "ann"}
    made = create_as(system, "eve", forged)
    # The mutating policy writes the requester over it; the run is eve's.
    assert made.returncode == 0, made.stderr
    assert system.run(ns, "forged")["metadata"]["annotations"][ANNOTATION_CREATED_BY] == "eve"
    changed = system.kubectl("annotate", "--overwrite", "agentrun", "forged", "-n", ns,
                             f"{ANNOTATION_CREATED_BY}=ann", check=False)
    assert changed.returncode != 0
    assert "agentrun.dev/created-by says who created the run and never changes" in (
        changed.stderr)
    removed = system.kubectl("annotate", "agentrun", "forged", "-n", ns,
                             f"{ANNOTATION_CREATED_BY}-", as_user="eve", check=False)
    assert removed.returncode != 0
    assert "agentrun.dev/created-by says who created the run and never changes" in (
        removed.stderr)
    assert system.run(ns, "forged")["metadata"]["annotations"][ANNOTATION_CREATED_BY] == "eve"


def test_a_schedules_runs_are_created_by_who_last_wrote_its_template(
        system: System, eve: str) -> None:
    """eve writes a schedule (a forged template-by is written over, and nobody changes it
    by hand); the run the operator creates of it is eve's, so she may not approve its
    call; dave rewriting the template makes the next runs his."""
    ns = eve
    bind(system, ns, "dave", "agentrun-edit")
    schedule = {"apiVersion": API_VERSION, "kind": SCHEDULE_KIND, "metadata": {
        "name": "eves", "namespace": ns, "annotations": {ANNOTATION_TEMPLATE_BY: "ann"}},
        "spec": {"schedule": "@every 10s", "concurrencyPolicy": "Forbid", "runTemplate": {
            "spec": agent_run("x", SCRIPT, tools=REQUIRED)["spec"]}}}
    made = create_as(system, "eve", schedule)
    assert made.returncode == 0, made.stderr

    def template_by() -> str:
        found = system.get(SCHEDULES, ns, "eves") or {}
        return str((found["metadata"].get("annotations") or {}).get(ANNOTATION_TEMPLATE_BY))

    assert template_by() == "eve"
    changed = system.kubectl("annotate", "--overwrite", SCHEDULES, "eves", "-n", ns,
                             f"{ANNOTATION_TEMPLATE_BY}=ann", as_user="dave", check=False)
    assert changed.returncode != 0
    assert "template-by says who last wrote spec.runTemplate and changes only with it" in (
        changed.stderr)

    def first_run() -> str | None:
        done = system.kubectl("get", "agentruns", "-n", ns, "-l", f"{LABEL_SCHEDULE}=eves",
                              "-o", "json")
        names = sorted(r["metadata"]["name"] for r in json.loads(done.stdout)["items"])
        return names[0] if names else None

    wait_for(lambda: first_run() is not None, timeout=60, what="the schedule's first run")
    system.kubectl("patch", SCHEDULES, "eves", "-n", ns, "--type=merge", "-p",
                   '{"spec": {"suspend": true}}')
    name = first_run()
    assert name is not None
    run = waiting(system, ns, name)
    # The operator created it, and wrote who last wrote the template, not itself (the
    # CRD refuses agentrun.dev/ annotations in a template).
    assert run["metadata"]["annotations"][ANNOTATION_CREATED_BY] == "eve"
    pending = run["status"]["pendingApproval"]
    done = create_as(system, "eve", approval(ns, f"{name}-by-eve", name, pending, "eve"))
    assert done.returncode == 0, done.stderr
    said = verdict(system, ns, f"{name}-by-eve")
    assert (said["phase"], said["reason"]) == (ApprovalPhase.REJECTED,
                                               ApprovalReason.SELF_APPROVAL)
    done = create_as(system, "ann", approval(ns, f"{name}-by-ann", name, pending, "ann"))
    assert done.returncode == 0, done.stderr
    assert verdict(system, ns, f"{name}-by-ann")["reason"] == ApprovalReason.DECIDED

    # dave rewrites the template: admission writes him in, whatever he says.
    patch = {"metadata": {"annotations": {ANNOTATION_TEMPLATE_BY: "eve"}},
             "spec": {"runTemplate": {"spec": {"input": {"text": "Charge it again"}}}}}
    done = system.kubectl("patch", SCHEDULES, "eves", "-n", ns, "--type=merge", "-p",
                          json.dumps(patch), as_user="dave", check=False)
    assert done.returncode == 0, done.stderr
    assert template_by() == "dave"


def test_where_self_approval_is_allowed_the_creator_may_approve(
        crds: Any, dev_node: object, store_url: str, solo_namespace: str,
        tmp_path: Path) -> None:
    operator = Operator(crds, store_url, tmp_path / "op", (
        f"--namespace={solo_namespace}", "--allow-self-approval")).start()
    system = System(crds, store_url, operator)
    try:
        ns = solo_namespace
        bind(system, ns, "eve", "agentrun-edit")
        bind(system, ns, "eve", APPROVER_CLUSTER_ROLE)
        made = create_as(system, "eve", in_namespace(agent_run("alone", SCRIPT,
                                                               tools=REQUIRED), ns))
        assert made.returncode == 0, made.stderr
        pending = waiting(system, ns, "alone")["status"]["pendingApproval"]
        done = create_as(system, "eve", approval(ns, "alone-by-eve", "alone", pending, "eve"))
        assert done.returncode == 0, done.stderr
        assert verdict(system, ns, "alone-by-eve")["reason"] == ApprovalReason.DECIDED
        status = settled(system, ns, "alone")
        assert status["phase"] == Phase.SUCCEEDED, status
        assert len(charges(system, "alone")) == 1
    finally:
        operator.stop()


def test_a_run_whose_only_call_was_denied_publishes_the_denial(
        system: System, people: str) -> None:
    ns = people
    script = [{"call": "charge_card", "args": CHARGE}, {"text": "Not charged."}]
    system.apply(in_namespace(agent_run("only-denied", script, tools=REQUIRED), ns))
    pending = waiting(system, ns, "only-denied")["status"]["pendingApproval"]
    done = create_as(system, "ann", approval(ns, "only-denied-1", "only-denied", pending,
                                             "ann", decision="Deny"))
    assert done.returncode == 0, done.stderr
    status = settled(system, ns, "only-denied")
    assert (status["phase"], status["toolsExecuted"]) == (Phase.SUCCEEDED, [])
    assert [(c["tool"], c["outcome"]) for c in status["toolCalls"]] == [
        ("charge_card", LedgerOutcome.DENIED)]
    assert charges(system, "only-denied") == []


def test_a_call_opened_under_other_arguments_than_approved_never_runs(
        system: System, people: str) -> None:
    """The store compares the approved digest when the call opens: here the approval
    approves a digest the runner's call does not have (as if the arguments had changed
    between the wait and the resumed attempt), so the open is refused, the run ends
    Failed ApprovalMismatch and the tool never runs."""
    ns = people
    system.apply(in_namespace(agent_run("switched", SCRIPT, tools=REQUIRED), ns))
    run = waiting(system, ns, "switched")
    pending, uid = run["status"]["pendingApproval"], run["metadata"]["uid"]
    other = store.args_digest({"customer": "7", "amount": 12000})

    async def approve_other(engine: Any) -> None:
        async with engine.begin() as conn:
            await conn.execute(update(approvals).where(approvals.c.run_uid == uid)
                               .values(args_digest=other))

    system.store(approve_other)
    done = create_as(system, "ann", approval(ns, "switched-1", "switched", pending, "ann",
                                             digest=other))
    assert done.returncode == 0, done.stderr
    assert verdict(system, ns, "switched-1")["reason"] == ApprovalReason.DECIDED
    status = settled(system, ns, "switched")
    assert (status["phase"], status["reason"]) == (Phase.FAILED, Reason.APPROVAL_MISMATCH)
    assert f"with arguments {other}" in status["message"]
    assert status["toolsExecuted"] == ["read_message"]
    assert charges(system, "switched") == []
