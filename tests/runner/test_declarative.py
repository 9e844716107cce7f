"""The runner builds an Agent snapshot with ADK's own classes and calls a real MCP server
(the `mcp` SDK over streamable HTTP) through the ledger: the effect from the server's
annotations, the call's idempotency key in the Idempotency-Key header, Secret headers from
the pod's env, and the runner's own reasons when the Agent cannot run."""

from __future__ import annotations

from typing import Any

import pytest

from agentrun import agents, effects, store
from agentrun.vocabulary import Reason, RunnerExit
from tests.mcp_server import CrmServer
from tests.runner.runs import (
    Run,
    explain,
    outcome,
    prepare_run,
    query,
    run_runner,
    snapshot_of,
    tools,
)

pytestmark = pytest.mark.postgres


def ledger(run: Run) -> list[store.LedgerEntry]:
    return query(run.url, lambda e: store.ledger(e, run.uid))


def test_a_read_only_mcp_tool_is_called_once_through_the_ledger(
        pg_store: str, crm: CrmServer) -> None:
    run = prepare_run(pg_store, "mcp-read", agent="triage",
                      agent_snapshot=snapshot_of(crm.url))
    done = run_runner(run, [{"call": "lookup_customer", "args": {"customer": "42"}},
                            {"text": "Ada is on the pro plan."}])
    assert done.returncode == RunnerExit.SUCCESS, explain(done)
    (call,) = crm.calls()
    assert (call["tool"], call["args"]) == ("lookup_customer", {"customer": "42"})
    (entry,) = ledger(run)
    assert (entry.tool, entry.effect, entry.outcome) == ("lookup_customer", effects.READ_ONLY,
                                                          "ok")
    # The call's key reached the server as Idempotency-Key, the ledger's own.
    assert call["idempotencyKey"] == entry.idempotency_key and entry.idempotency_key
    assert entry.result and entry.result["structuredContent"]["name"] == "Ada Lovelace"
    assert tools(run) == ["lookup_customer"]


def test_effects_come_from_the_annotations_then_the_agent_then_the_run(
        pg_store: str, crm: CrmServer) -> None:
    snapshot = snapshot_of(crm.url, effects=[{"name": "close_account", "effect": "Idempotent"}],
                           tools=[{"function": "sample_tools.refund_policy"}])
    run = prepare_run(pg_store, "mcp-effects", agent="triage", agent_snapshot=snapshot)
    done = run_runner(run, [{"call": "update_ticket", "args": {"ticket": "7", "status": "x"}},
                            {"call": "close_account", "args": {"customer": "43"}},
                            {"call": "lookup_customer", "args": {"customer": "42"}},
                            {"call": "refund_policy", "args": {"order": "42"}},
                            {"text": "Done."}],
                      AGENTRUN_TOOLS='[{"name": "lookup_customer", "effect": "Effectful"}]')
    assert done.returncode == RunnerExit.SUCCESS, explain(done)
    entries = ledger(run)
    assert [(e.tool, e.effect) for e in entries] == [
        ("update_ticket", effects.IDEMPOTENT),   # the server's idempotentHint
        ("close_account", effects.IDEMPOTENT),   # the Agent's spec.effects over destructiveHint
        ("lookup_customer", effects.EFFECTFUL),  # the run's spec.tools over readOnlyHint
        ("refund_policy", effects.READ_ONLY),    # a function of the image, its @read_only
    ]
    assert entries[3].result == {"order": "42", "refundable": True, "within_days": 30}
    keys = [c["idempotencyKey"] for c in crm.calls()]
    assert len(set(keys)) == 3 and all(keys)  # one key per call


def test_secret_headers_are_read_from_the_env_the_operator_sets(
        pg_store: str, crm: CrmServer) -> None:
    headers = [{"name": "Authorization",
                "valueFrom": {"secretKeyRef": {"name": "crm", "key": "token"}}}]
    snapshot = snapshot_of(crm.url)
    snapshot["agents"]["triage"]["mcpServers"][0]["headers"] = headers
    run = prepare_run(pg_store, "mcp-secret", agent="triage", agent_snapshot=snapshot)
    script = [{"call": "lookup_customer", "args": {"customer": "43"}}, {"text": "ok"}]
    done = run_runner(run, script)
    assert done.returncode == RunnerExit.AGENT_INVALID, explain(done)
    got = outcome(run)
    assert got is not None and got.reason == Reason.AGENT_INVALID
    env = agents.header_env("triage", "crm", "Authorization")
    assert f"${env}" in str(got.message)
    assert crm.calls() == [] and tools(run) == []
    again = prepare_run(pg_store, "mcp-secret-2", agent="triage", agent_snapshot=snapshot)
    done = run_runner(again, script, **{env: "Bearer s3cret"})
    assert done.returncode == RunnerExit.SUCCESS, explain(done)
    assert len(crm.calls()) == 1


def test_an_mcp_server_that_does_not_answer_fails_the_run_before_any_tool(
        pg_store: str) -> None:
    run = prepare_run(pg_store, "mcp-down", agent="triage",
                      agent_snapshot=snapshot_of("http://127.0.0.1:9/mcp"))
    done = run_runner(run, [{"call": "lookup_customer", "args": {"customer": "42"}},
                            {"text": "never"}])
    assert done.returncode == RunnerExit.TOOL_SERVER_UNAVAILABLE, explain(done)
    got = outcome(run)
    assert got is not None and got.reason == Reason.TOOL_SERVER_UNAVAILABLE
    assert "MCP server crm of Agent triage (http://127.0.0.1:9/mcp) did not answer" in str(
        got.message)
    assert "no tool was called" in str(got.message)
    assert tools(run) == [] and ledger(run) == []


def _unbuildable(url: str, case: str) -> dict[str, Any]:
    snapshot = snapshot_of(url)
    if case == "a function the image lacks":
        snapshot["agents"]["triage"]["tools"] = [{"function": "no_such_module.lookup"}]
    else:
        snapshot["agents"]["triage"]["mcpServers"][0]["toolFilter"] = ["lookup_customer",
                                                                      "refund_order"]
    return snapshot


@pytest.mark.parametrize(("case", "said"), [
    ("a function the image lacks",
     "the function no_such_module.lookup is not a tool of the runner image"),
    ("a tool filter naming what the server does not serve",
     "names refund_order in toolFilter, which the server does not offer"),
])
def test_an_agent_the_runner_cannot_build_fails_agent_invalid(
        pg_store: str, crm: CrmServer, case: str, said: str) -> None:
    run = prepare_run(pg_store, "mcp-invalid", agent="triage",
                      agent_snapshot=_unbuildable(crm.url, case))
    done = run_runner(run, [{"call": "lookup_customer", "args": {"customer": "42"}},
                            {"text": "never"}])
    assert done.returncode == RunnerExit.AGENT_INVALID, explain(done)
    got = outcome(run)
    assert got is not None and got.reason == Reason.AGENT_INVALID
    assert said in str(got.message), got.message
    assert crm.calls() == [] and tools(run) == []


def test_a_run_of_a_snapshot_gone_from_the_store_fails_agent_not_found(
        pg_store: str, crm: CrmServer) -> None:
    run = prepare_run(pg_store, "mcp-gone", agent="triage", agent_snapshot=snapshot_of(crm.url))
    query(pg_store, lambda e: _drop_snapshot(e, str(run.agent_digest)))
    done = run_runner(run, [{"text": "never"}])
    assert done.returncode == RunnerExit.AGENT_NOT_FOUND, explain(done)
    got = outcome(run)
    assert got is not None and got.reason == Reason.AGENT_NOT_FOUND
    assert tools(run) == []


async def _drop_snapshot(engine: Any, digest: str) -> None:
    from sqlalchemy import delete

    from agentrun.store.schema import agent_snapshots

    async with engine.begin() as conn:
        await conn.execute(delete(agent_snapshots).where(agent_snapshots.c.digest == digest))
