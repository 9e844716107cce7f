"""A settled run's time to live (spec.ttlSecondsAfterFinished, else the operator's
--run-ttl-after-finished): the run leaves the API server with its replays and approvals,
its record stays in the store; an operator that was down when a time to live ran out
deletes the run when it is back, once."""

from __future__ import annotations

import json
from pathlib import Path

from agentrun_devtools.controlplane import ControlPlane
from agentrun_devtools.processes import wait_for

from agentrun import store
from agentrun.vocabulary import GROUP, VERSION, Phase, ReplayPhase, ReplayReason, RunStatus
from tests.harness import HAPPY, Operator, System, agent_run, in_namespace
from tests.replays import create_replay, wait_decided

APPROVALS = f"agentrunapprovals.{GROUP}"
# Sends its email, then the model fails: Failed, with a tool executed.
MAILED_THEN_FAILED = [
    {"call": "send_email", "args": {"to": "customer-42@example.com", "body": "Refund on its way"}},
    {"error": 400},
]
REPLAYS = f"agentrunreplays.{GROUP}"


def _approval(namespace: str, name: str, run: str, approver: str) -> dict[str, object]:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "AgentRunApproval",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"runName": run, "seq": 1, "argsDigest": "sha256:" + "0" * 64,
                     "decision": "Approve", "approver": approver}}


def _gone(system: System, kind: str, namespace: str, name: str) -> bool:
    return system.get(kind, namespace, name) is None


def _expired_lines(*operators: Operator, run: str) -> list[str]:
    """The operators' log lines saying they deleted `run` (namespace/name)."""
    return [line for op in operators for line in op.log().splitlines()
            if "event=expired" in line and f" run={run} " in f"{line} "]


def test_a_run_past_its_ttl_leaves_with_its_replay_and_approvals_and_its_record_stays(
    crds: ControlPlane, dev_node: object, store_url: str, solo_namespace: str, tmp_path: Path
) -> None:
    ns = solo_namespace
    operator = Operator(crds, store_url, tmp_path / "op", (f"--namespace={ns}",)).start()
    system = System(crds, store_url, operator)
    try:
        system.apply(in_namespace(agent_run("ttl-mailed", MAILED_THEN_FAILED,
                                            ttlSecondsAfterFinished=5), ns))
        system.apply(in_namespace(agent_run("ttl-kept", HAPPY), ns))
        run = system.wait_run(ns, "ttl-mailed", lambda r: r["status"]["phase"] == Phase.FAILED
                              and r["status"]["toolsExecuted"] is not None)
        assert run["status"]["toolsExecuted"] == ["send_email"], run["status"]
        uid = run["metadata"]["uid"]
        # A replay of it is decided while it is still there; an approval names it.
        create_replay(system, ns, "ttl-again", "ttl-mailed")
        replay = wait_decided(system, ns, "ttl-again")
        assert (replay["status"]["phase"], replay["status"]["reason"]) == (
            ReplayPhase.REFUSED, ReplayReason.TOOLS_EXECUTED)
        system.kubectl("create", "-f", "-", input=json.dumps(
            _approval(ns, "ttl-mailed-1", "ttl-mailed", "ttl-boss")), as_user="ttl-boss",
            as_groups=["system:masters"])

        wait_for(lambda: _gone(system, f"agentruns.{GROUP}", ns, "ttl-mailed"), timeout=60,
                 what="the run deleted after its time to live")
        assert _gone(system, REPLAYS, ns, "ttl-again")
        assert _gone(system, APPROVALS, ns, "ttl-mailed-1")
        assert len(_expired_lines(operator, run=f"{ns}/ttl-mailed")) == 1, operator.log()[-3000:]
        # The record, the ledger and the email stay.
        record = system.store(lambda e: store.get_run(e, uid))
        assert record is not None and record.status == RunStatus.FAILED
        assert record.tools_executed == ["send_email"]
        assert len(system.emails("ttl-mailed")) == 1
        # A replay names the deleted run: decided from the store's record by the same
        # table, and a forced one runs again on the input snapshot.
        create_replay(system, ns, "ttl-after", "ttl-mailed")
        after = wait_decided(system, ns, "ttl-after")
        assert (after["status"]["phase"], after["status"]["reason"]) == (
            ReplayPhase.REFUSED, ReplayReason.TOOLS_EXECUTED), after["status"]
        create_replay(system, ns, "ttl-forced", "ttl-mailed", force=True)
        forced = wait_decided(system, ns, "ttl-forced")
        assert forced["status"]["phase"] == ReplayPhase.APPROVED, forced["status"]
        again = system.wait_run(ns, forced["status"]["replayRunName"], lambda r: r[
            "status"]["phase"] in Phase.TERMINAL and r["status"]["toolsExecuted"] is not None)
        assert again["status"]["toolsExecuted"] == ["send_email"], again["status"]
        assert again["spec"]["replayOf"] == "ttl-mailed"
        assert again["status"]["inputDigest"] == run["status"]["inputDigest"]
        assert len(system.emails(again["metadata"]["name"])) == 1
        # A deleted run that called no tool: its replay is approved.
        system.apply(in_namespace(agent_run("ttl-quiet", [{"error": 400}],
                                            ttlSecondsAfterFinished=2), ns))
        system.wait_phase(ns, "ttl-quiet", Phase.FAILED)
        wait_for(lambda: _gone(system, f"agentruns.{GROUP}", ns, "ttl-quiet"), timeout=60,
                 what="the quiet run deleted after its time to live")
        create_replay(system, ns, "ttl-quiet-again", "ttl-quiet")
        quiet = wait_decided(system, ns, "ttl-quiet-again")
        assert (quiet["status"]["phase"], quiet["status"]["reason"]) == (
            ReplayPhase.APPROVED, ReplayReason.NO_TOOLS_EXECUTED), quiet["status"]
        # No default here: a run without a time to live stays.
        kept = system.wait_phase(ns, "ttl-kept", Phase.SUCCEEDED, Phase.FAILED)
        assert "ttlSecondsAfterFinished" not in kept["spec"]
        assert not _expired_lines(operator, run=f"{ns}/ttl-kept")
    finally:
        operator.stop()


def test_the_default_applies_without_a_spec_write_and_a_restart_deletes_each_run_once(
    crds: ControlPlane, dev_node: object, store_url: str, solo_namespace: str, tmp_path: Path
) -> None:
    ns = solo_namespace
    args = (f"--namespace={ns}", "--run-ttl-after-finished=8")
    first = Operator(crds, store_url, tmp_path / "op1", args).start()
    system = System(crds, store_url, first)
    try:
        system.apply(in_namespace(agent_run("ttl-by-default", HAPPY), ns))
        system.apply(in_namespace(agent_run("ttl-own", HAPPY, ttlSecondsAfterFinished=3600),
                                  ns))
        for name in ("ttl-by-default", "ttl-own"):
            run = system.wait_phase(ns, name, Phase.SUCCEEDED, Phase.FAILED)
            assert run["status"]["phase"] == Phase.SUCCEEDED, run["status"]
        # The default is the operator's, never written into the run.
        assert "ttlSecondsAfterFinished" not in system.run(ns, "ttl-by-default")["spec"]
    finally:
        first.stop()
    assert not _expired_lines(first, run=f"{ns}/ttl-by-default"), first.log()[-3000:]
    # Down past the time to live: the run is still there.
    finished = system.run(ns, "ttl-by-default")["status"]["finishedAt"]
    wait_for(lambda: _seconds_since(finished) > 9, timeout=30, what="the TTL run out")
    assert system.get(f"agentruns.{GROUP}", ns, "ttl-by-default") is not None

    second = Operator(crds, store_url, tmp_path / "op2", args).start()
    system = System(crds, store_url, second)
    try:
        wait_for(lambda: _gone(system, f"agentruns.{GROUP}", ns, "ttl-by-default"), timeout=60,
                 what="the run past its TTL deleted by the restarted operator")
        expired = _expired_lines(first, second, run=f"{ns}/ttl-by-default")
        assert len(expired) == 1, second.log()[-3000:]
        assert system.run(ns, "ttl-own")["status"]["phase"] == Phase.SUCCEEDED
        assert not _expired_lines(first, second, run=f"{ns}/ttl-own")
    finally:
        second.stop()


def _seconds_since(stamp: str) -> float:
    import datetime

    then = datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    return (datetime.datetime.now(datetime.UTC) - then).total_seconds()
