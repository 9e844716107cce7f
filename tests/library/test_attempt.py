"""Who an attempt is, on both sides of the wire: what the store API says is what the runner
reads, under the JSON names runners of every release read."""

from __future__ import annotations

from dataclasses import replace

from agentrun.attempt import AttemptIdentity, AttemptStart

KNOWN = AttemptIdentity(
    namespace="team-a", run_name="triage-42", run_uid="uid-42", attempt=2,
    agent="support-agent", user_id="alice", session_id="uid-42-2", input_digest="hmac:ab",
    pod="triage-42-2", app_name="team-a/support-agent", resumes_attempt=1,
    resumes_run_uid="uid-7")


def test_the_wire_names_the_identity_as_runners_read_it() -> None:
    assert KNOWN.to_wire() == {
        "namespace": "team-a", "runName": "triage-42", "runUid": "uid-42", "attempt": 2,
        "agent": "support-agent", "userId": "alice", "sessionId": "uid-42-2",
        "inputDigest": "hmac:ab"}


def test_the_runner_reads_what_the_store_api_told_without_the_stores_own_facts() -> None:
    told = AttemptIdentity.from_wire(KNOWN.to_wire())
    assert told == replace(KNOWN, pod=None, app_name="", resumes_attempt=None,
                           resumes_run_uid=None)
    # A runner's own identity (from its environment) compares with it field by field.
    assert (told.run_uid, told.attempt) == (KNOWN.run_uid, KNOWN.attempt)


def test_an_attempts_start_travels_whole() -> None:
    start = AttemptStart(
        identity=replace(KNOWN, pod=None, app_name="", resumes_attempt=None,
                         resumes_run_uid=None),
        root_run_uid="uid-1", resume_invocation="e-9",
        usage={"modelCalls": 3, "toolCalls": 1, "inputTokens": 10, "outputTokens": 2,
               "costMicroUSD": None},
        decisions={"call-1": {"decision": "Approve", "approver": "ann", "note": None}})
    wire = start.to_wire()
    assert list(wire) == ["namespace", "runName", "runUid", "attempt", "agent", "userId",
                          "sessionId", "inputDigest", "rootRunUid", "resumeInvocation",
                          "usage", "decisions"]
    assert AttemptStart.from_wire(wire) == start


def test_a_start_without_its_optional_parts_reads_as_a_first_run_from_nothing() -> None:
    bare = {"namespace": "team-a", "runName": "triage-42", "runUid": "uid-42",
            "attempt": "1", "agent": "support-agent", "userId": "alice",
            "sessionId": "uid-42-1"}
    start = AttemptStart.from_wire(bare)
    assert start.identity.attempt == 1 and start.identity.input_digest is None
    assert start.root_run_uid == "uid-42"  # its own lineage
    assert (start.resume_invocation, start.usage, start.decisions) == (None, {}, {})
