"""The replay handler itself, called directly against the real API server and store, in a
namespace no operator watches (solo-*): what a restarted operator finds, made exact.

An operator killed between creating the replay run and writing the replay's status leaves
behind: the approval recorded in the store, the new AgentRun, and a replay with no status.
kopf then runs the handler again. We reproduce that state exactly (first call, then the
status removed) instead of racing a SIGKILL against the handler, and check that the second
call creates no second run and writes the same decision.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, TypeVar

from agentrun_operator.kube import Conflict
from agentrun_operator.reconcile import Context
from agentrun_operator.replay import reconcile

from agentrun import store
from agentrun.vocabulary import Phase, ReplayPhase, ReplayReason
from tests.harness import System, agent_run, as_operator, in_namespace
from tests.replays import (
    REPLAYS,
    create_replay,
    get_replay,
    replay_runs,
    unique_text,
)

T = TypeVar("T")


def settled_original(system: System, namespace: str, name: str, tools: Any) -> None:
    """An AgentRun settled Failed with `tools`, on a snapshot in the store (nobody runs it:
    no operator watches this namespace, so we write its run row and status as the
    operator would; the decision reads the run row)."""
    text = unique_text()
    async def snapshot(e: Any) -> str:
        return await store.put_input(e, text, key=await store.installation_key(e))

    digest = system.store(snapshot)
    system.apply(in_namespace(agent_run(name, [{"text": "x"}], text=text), namespace))
    uid = system.run(namespace, name)["metadata"]["uid"]

    async def record(e: Any) -> None:
        await store.record_run(e, uid, namespace, name, "support-agent", "manual", "default",
                               digest)
        await store.settle(e, uid, 1, "failed", "Evicted", "evicted", tools)

    system.store(record)
    status = {"phase": Phase.FAILED, "reason": "Evicted", "message": "evicted",
              "inputDigest": digest, "attempts": 1, "toolsExecuted": tools}
    system.kubectl("patch", "-n", namespace, f"agentrun/{name}", "--subresource=status",
                   "--type=merge", "-p", json.dumps({"status": status}))
    if tools is None:  # a merge patch cannot write null; the operator uses a JSON patch too
        system.kubectl("patch", "-n", namespace, f"agentrun/{name}", "--subresource=status",
                       "--type=json", "-p", json.dumps(
                           [{"op": "add", "path": "/status/toolsExecuted", "value": None}]))


def test_handler_that_runs_again_creates_one_run(system: System, solo_namespace: str) -> None:
    ns = solo_namespace
    settled_original(system, ns, "lost", [])
    create_replay(system, ns, "lost-again", "lost")

    as_operator(system, lambda ctx: reconcile(ctx, get_replay(system, ns, "lost-again")))
    first = get_replay(system, ns, "lost-again")["status"]
    assert (first["phase"], first["reason"]) == (ReplayPhase.APPROVED,
                                                 ReplayReason.NO_TOOLS_EXECUTED)

    # The operator "died" before the status write: the run exists, the status does not.
    system.kubectl("patch", "-n", ns, f"{REPLAYS}/lost-again", "--subresource=status",
                   "--type=json", "-p", json.dumps([{"op": "remove", "path": "/status"}]))
    assert "status" not in get_replay(system, ns, "lost-again")

    as_operator(system, lambda ctx: reconcile(ctx, get_replay(system, ns, "lost-again")))
    second = get_replay(system, ns, "lost-again")["status"]
    assert (second["phase"], second["reason"], second["replayRunName"]) == (
        first["phase"], first["reason"], first["replayRunName"])
    assert [r["metadata"]["name"] for r in replay_runs(system, ns, "lost")] == [
        first["replayRunName"]]


def test_handler_running_twice_at_once_creates_one_run(
        system: System, solo_namespace: str) -> None:
    ns = solo_namespace
    settled_original(system, ns, "doubled", [])
    create_replay(system, ns, "doubled-again", "doubled")
    body = get_replay(system, ns, "doubled-again")

    async def twice(ctx: Context) -> list[Any]:
        return await asyncio.gather(reconcile(ctx, body), reconcile(ctx, body),
                                    return_exceptions=True)

    results = as_operator(system, twice)
    # Both decide the same; the second status write carries the replay as both read it,
    # and loses (Conflict: a worker would look again, and find it decided).
    assert all(r is None or isinstance(r, Conflict) for r in results), results
    status = get_replay(system, ns, "doubled-again")["status"]
    assert status["phase"] == ReplayPhase.APPROVED
    assert [r["metadata"]["name"] for r in replay_runs(system, ns, "doubled")] == [
        status["replayRunName"]]


def test_null_tools_executed_is_tool_state_unknown(system: System, solo_namespace: str) -> None:
    """toolsExecuted null, as the operator writes it when the run store could not be read
    (here no operator's safety net will read it back: nobody watches this namespace)."""
    ns = solo_namespace
    settled_original(system, ns, "unread", None)
    assert system.run(ns, "unread")["status"]["toolsExecuted"] is None
    create_replay(system, ns, "unread-again", "unread")
    as_operator(system, lambda ctx: reconcile(ctx, get_replay(system, ns, "unread-again")))
    status = get_replay(system, ns, "unread-again")["status"]
    assert (status["phase"], status["reason"]) == (ReplayPhase.REFUSED,
                                                   ReplayReason.TOOL_STATE_UNKNOWN)
    assert status["toolsExecuted"] is None
    assert replay_runs(system, ns, "unread") == []
