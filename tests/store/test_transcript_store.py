"""A run's transcript as the store reads it (store.transcript_facts, then
agentrun.transcript.entries_of), on Postgres and on SQLite, from what real runners wrote:
ADK's events by column name (JSONB on one, JSON text on the other), the ledger, the answer,
the usage. The API server's side is tests/operator/test_transcript.py."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from agentrun import store
from agentrun.transcript import entries_of, transcript
from agentrun.vocabulary import ENV_TEST_CRASH_IN, EntryKind, EntryState, Reason, RunStatus
from tests.runner.runs import EMAIL, explain, prepare_run, query, run_runner

pytestmark = pytest.mark.postgres


def shown(url: str, uid: str, name: str) -> dict[str, Any]:
    facts = query(url, lambda e: store.transcript_facts(e, uid))
    assert facts is not None
    return transcript({"metadata": {"name": name, "uid": uid}}, facts)


def test_a_finished_run_reads_the_same_on_either_store(any_store: str) -> None:
    run = prepare_run(any_store, "told-1")
    done = run_runner(run, [{"call": "read_message", "usage": {"inputTokens": 7,
                                                              "outputTokens": 1}},
                            {"call": "send_email", "args": EMAIL},
                            {"text": "Emailed the customer."}])
    assert done.returncode == 0, explain(done)
    found = shown(any_store, run.uid, run.name)
    assert [(e["kind"], e.get("tool"), e.get("state")) for e in found["entries"]] == [
        (EntryKind.INPUT, None, None),
        (EntryKind.TOOL_CALL, "read_message", EntryState.FINISHED),
        (EntryKind.TOOL_RESULT, "read_message", EntryState.FINISHED),
        (EntryKind.TOOL_CALL, "send_email", EntryState.FINISHED),
        (EntryKind.TOOL_RESULT, "send_email", EntryState.FINISHED),
        (EntryKind.TEXT, None, None)]
    entries = found["entries"]
    assert entries[0]["text"] == "Customer 42 asks for a refund"
    assert entries[3]["args"] == EMAIL and entries[3]["seq"] == 2
    assert entries[4]["result"] == {"status": "sent", "to": EMAIL["to"]}
    assert found["result"]["text"] == "Emailed the customer."
    assert found["usage"] == {"modelCalls": 3, "toolCalls": 2, "inputTokens": 207,
                              "outputTokens": 21}


def test_a_call_is_in_doubt_once_its_attempt_is_settled(any_store: str) -> None:
    run = prepare_run(any_store, "killed-1")
    done = run_runner(run, [{"call": "send_email", "args": EMAIL}, {"text": "never"}],
                      **{ENV_TEST_CRASH_IN: "send_email"})
    assert done.returncode == 137, explain(done)
    # The runner is gone, its attempt not settled yet: the call may still be running.
    live = entries_of(query(any_store, lambda e: store.transcript_facts(e, run.uid)))
    assert [(e.kind, e.state) for e in live] == [(EntryKind.INPUT, None),
                                                 (EntryKind.TOOL_CALL, None)]
    query(any_store, lambda e: store.settle_counting(
        e, run.uid, 1, RunStatus.FAILED, Reason.AGENT_ERROR, "The runner failed (exit 137)."))
    found = shown(any_store, run.uid, run.name)
    call, error = found["entries"][1:]
    assert (call["kind"], call["state"], call["args"]) == (EntryKind.TOOL_CALL,
                                                           EntryState.IN_DOUBT, EMAIL)
    assert (error["kind"], error["author"], error["text"]) == (
        EntryKind.ERROR, "agentrun", "The runner failed (exit 137).")
    assert "result" not in found


def test_a_run_the_store_has_no_record_of(any_store: str) -> None:
    assert query(any_store, lambda e: store.transcript_facts(e, "no-such-uid")) is None


def test_a_follower_reads_only_what_is_new(any_store: str) -> None:
    """store.transcript_facts_after, as a follow asks each second: what it returns is what
    a whole read returns, and a fact it already holds (events read before, a ledger row
    finished before the last read) is not read again."""
    run = prepare_run(any_store, "followed-1")
    before = query(any_store, lambda e: store.transcript_facts(e, run.uid))
    assert before is not None
    read_at = datetime.now(UTC)
    done = run_runner(run, [{"call": "read_message"}, {"call": "send_email", "args": EMAIL},
                            {"text": "Emailed the customer."}])
    assert done.returncode == 0, explain(done)
    whole = query(any_store, lambda e: store.transcript_facts(e, run.uid))
    assert whole is not None
    caught_up = query(any_store, lambda e: store.transcript_facts_after(
        e, run.uid, before, read_at))
    assert entries_of(caught_up) == entries_of(whole)
    assert caught_up.result == whole.result and caught_up.usage == whole.usage

    # Facts it holds already: marked, to see whether they come from the store again.
    (turn,) = whole.events
    marked_event = {**whole.events[turn][0], "marker": "held"}
    marked_call = dataclasses.replace(whole.ledger[0], result={"marker": "held"})
    held = dataclasses.replace(
        whole, events={turn: [marked_event, *whole.events[turn][1:]]},
        ledger=[marked_call, *whole.ledger[1:]])
    # As if the last read were now (everything finished before it, margin and all).
    later = datetime.now(UTC) + store.transcript.CHANGED_MARGIN + timedelta(seconds=5)
    again = query(any_store, lambda e: store.transcript_facts_after(e, run.uid, held, later))
    assert again.events[turn][0] == marked_event
    assert len(again.events[turn]) == len(whole.events[turn])
    assert again.ledger[0].result == {"marker": "held"}
    assert [(c.attempt, c.seq) for c in again.ledger] == [(c.attempt, c.seq)
                                                          for c in whole.ledger]
