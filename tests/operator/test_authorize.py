"""A replay is authorized for its requester: what a run uses (pure), who asked (the
annotations admission writes), and where NotAuthorized sits in both decision tables."""

from __future__ import annotations

import pytest
from agentrun_operator.authorize import Requester, Use, refusal, requester_of, uses
from agentrun_operator.decide import Journal, Original, decide, decide_resume

from agentrun import agents
from agentrun.vocabulary import (
    ANNOTATION_REQUESTED_BY,
    ANNOTATION_REQUESTED_BY_GROUPS,
    Phase,
    ReplayPhase,
    ReplayReason,
)

SPEC = {
    "agent": "support-agent",
    "input": {"text": "hi", "files": [
        {"name": "invoice.pdf", "secretKeyRef": {"name": "invoices", "key": "42"}},
        {"name": "notes.txt", "configMapKeyRef": {"name": "notes", "key": "42"}},
        {"name": "again.pdf", "secretKeyRef": {"name": "invoices", "key": "43"}}]},
    "env": [{"name": "OPENAI_API_KEY", "valueFrom": {"secretKeyRef": {"name": "openai",
                                                                       "key": "key"}}},
            {"name": "MODE", "value": "fast"},
            {"name": "REGION", "valueFrom": {"configMapKeyRef": {"name": "notes", "key": "r"}}},
            {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
    "image": "registry.example.com/agents/triage:1",
    "serviceAccountName": "triage",
}


def test_uses_lists_each_secret_configmap_and_pod_right_once_in_spec_order() -> None:
    assert uses(SPEC) == [
        Use("get", "secrets", "invoices", "input file 'invoice.pdf'"),
        Use("get", "configmaps", "notes", "input file 'notes.txt'"),
        Use("get", "secrets", "openai", "env var OPENAI_API_KEY"),
        Use("create", "pods", "", "spec.image"),
    ]


def test_a_run_of_an_agent_also_uses_the_secrets_of_the_snapshot_it_pinned() -> None:
    snapshot = {"root": "triage", "agents": {"triage": {"mcpServers": [
        {"name": "crm", "url": "http://crm", "headers": [
            {"name": "Authorization", "valueFrom": {"secretKeyRef": {"name": "crm",
                                                                      "key": "token"}}},
            {"name": "X-Again", "valueFrom": {"secretKeyRef": {"name": "openai",
                                                                "key": "other"}}}]}]}}}
    assert uses({**SPEC, "image": None, "serviceAccountName": None},
                agents.secret_refs(snapshot))[-2:] == [
        Use("get", "secrets", "openai", "env var OPENAI_API_KEY"),  # named once, where first
        Use("get", "secrets", "crm", "Agent triage mcpServers crm header Authorization"),
    ]


def test_a_run_naming_nothing_uses_nothing() -> None:
    assert uses({"agent": "support-agent", "input": {"text": "hi"},
                 "env": [{"name": "AGENTRUN_SCRIPT", "value": "[]"}]}) == []


def test_the_requester_is_read_from_the_annotations_admission_writes() -> None:
    assert requester_of({ANNOTATION_REQUESTED_BY: "alice",
                         ANNOTATION_REQUESTED_BY_GROUPS: "team-a,system:authenticated"}) == \
        Requester("alice", ("team-a", "system:authenticated"))
    assert requester_of({ANNOTATION_REQUESTED_BY: "bob"}) == Requester("bob", ())
    assert requester_of({}) is None and requester_of(None) is None


def test_a_refusal_names_the_missing_permission_and_where_the_run_names_it() -> None:
    said = refusal(Requester("sam", ()), Use("get", "secrets", "openai", "env var KEY"),
                   "support", "triage-42")
    assert "sam may not get secrets/openai in namespace support" in said
    assert "which the replay run of triage-42 would read (env var KEY)" in said
    said = refusal(Requester("sam", ()), Use("create", "pods", "", "spec.image"), "support",
                   "triage-42")
    assert "sam may not create pods in namespace support" in said and "spec.image" in said


FAILED = Original(phase=Phase.FAILED, tools_executed=[], input_digest="hmac-sha256:ab",
                  input_available=True, reason="Evicted")
WHY = "sam may not get secrets/openai in namespace support."


@pytest.mark.parametrize("forced", [False, True])
def test_not_authorized_comes_after_run_not_found_and_force_never_overrides_it(
        forced: bool) -> None:
    assert decide("triage-42", None, already_replayed_by=None, forced=forced,
                  unauthorized=WHY).reason == ReplayReason.RUN_NOT_FOUND
    for original in (FAILED, Original(phase=Phase.RUNNING, tools_executed=None,
                                      input_digest=None, input_available=False)):
        decision = decide("triage-42", original, already_replayed_by=None, forced=forced,
                          unauthorized=WHY)
        assert (decision.phase, decision.reason) == (ReplayPhase.REFUSED,
                                                     ReplayReason.NOT_AUTHORIZED)
        assert decision.message.startswith(WHY)
        assert "Forcing does not change this" in decision.message
    resume = decide_resume("triage-42", FAILED, Journal(True), already_replayed_by=None,
                           forced=forced, unauthorized=WHY)
    assert (resume.phase, resume.reason) == (ReplayPhase.REFUSED, ReplayReason.NOT_AUTHORIZED)


def test_an_authorized_requester_meets_the_usual_table() -> None:
    decision = decide("triage-42", FAILED, already_replayed_by=None, forced=False,
                      unauthorized=None)
    assert (decision.phase, decision.reason) == (ReplayPhase.APPROVED,
                                                 ReplayReason.NO_TOOLS_EXECUTED)
