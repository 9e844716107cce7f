"""A budget and an approval as a real runner meets them, on Postgres and on SQLite: what the
store holds afterwards is what the operator builds the status from."""

from __future__ import annotations

import json

import pytest

from agentrun import store
from agentrun.vocabulary import ApprovalDecision, Reason, RunnerEnv, RunnerExit
from tests.runner.runs import EMAIL, prepare_run, query, run_runner

pytestmark = pytest.mark.postgres


def _sent(url: str, name: str) -> list[str]:
    return [r.tool for r in query(url, lambda e: store.outbox(e, name))]


def test_max_model_calls_stops_before_the_third_call(any_store: str) -> None:
    run = prepare_run(any_store, "budget-1")
    done = run_runner(run, [{"call": "read_message"}, {"call": "send_email", "args": EMAIL},
                            {"call": "update_crm"}, {"text": "never"}],
                      **{RunnerEnv.LIMITS: json.dumps({"maxModelCalls": 2})})
    assert done.returncode == RunnerExit.BUDGET_EXCEEDED, done.stderr[-3000:]
    got = query(any_store, lambda e: store.get_outcome(e, run.uid, 1))
    assert got is not None and got.reason == Reason.BUDGET_EXCEEDED, got
    assert "maxModelCalls" in (got.message or ""), got
    used = query(any_store, lambda e: store.run_usage(e, run.uid))
    assert (used.model_calls, used.tool_calls) == (2, 2)
    # The third model call was never made, so update_crm never ran.
    assert _sent(any_store, run.name) == ["send_email"]
    assert query(any_store, lambda e: store.tools_executed(e, run.uid, 1)) == [
        "read_message", "send_email"]


def test_a_required_call_is_written_down_and_not_run(any_store: str) -> None:
    run = prepare_run(any_store, "approve-1")
    tools = [{"name": "send_email", "effect": "Effectful", "approval": "Required"}]
    done = run_runner(run, [{"call": "send_email", "args": EMAIL}, {"text": "sent"}],
                      **{RunnerEnv.TOOLS: json.dumps(tools)})
    assert done.returncode == RunnerExit.AWAITING_APPROVAL, done.stderr[-3000:]
    got = query(any_store, lambda e: store.get_outcome(e, run.uid, 1))
    assert got is not None and got.reason == Reason.AWAITING_APPROVAL, got
    waiting = query(any_store, lambda e: store.pending_approval(e, run.uid))
    assert waiting is not None and (waiting.tool, json.loads(waiting.args)) == (
        "send_email", EMAIL)
    assert _sent(any_store, run.name) == []
    # First writer wins: a second decision of the same call changes nothing.
    assert query(any_store, lambda e: store.decide(
        e, run.uid, waiting.call_id, ApprovalDecision.APPROVE, "ann", "ok", "a-1")) is True
    assert query(any_store, lambda e: store.decide(
        e, run.uid, waiting.call_id, ApprovalDecision.DENY, "bob", None, "a-2")) is False
    [decided] = query(any_store, lambda e: store.approvals_of(e, run.uid))
    assert (decided.decision, decided.approver) == (ApprovalDecision.APPROVE, "ann")
    assert query(any_store, lambda e: store.pending_approval(e, run.uid)) is None
