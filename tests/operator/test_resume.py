"""Resume (spec.retry.resume): a failed attempt is continued from its journal, never
repeating what finished, and an Effectful call in doubt is not run again."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agentrun_devtools.controlplane import ControlPlane

from agentrun import store
from agentrun.vocabulary import Condition, Phase, Reason, ReplayReason
from tests.harness import Operator, System, agent_run, in_namespace

EMAIL = {"to": "customer-42@example.com", "body": "Refund on its way"}
RESUME = {"maxAttempts": 2, "resume": True}


@pytest.fixture(params=["postgres", "sqlite"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[System, str]]:
    """The session's operator on Postgres, or one of its own on the embedded SQLite store
    (the development cluster's default)."""
    if request.param == "postgres":
        yield request.getfixturevalue("system"), request.getfixturevalue("namespace")
        return
    plane: ControlPlane = request.getfixturevalue("crds")
    request.getfixturevalue("dev_node")
    namespace: str = request.getfixturevalue("solo_namespace")
    url = f"sqlite:///{tmp_path / 'agentrun.db'}"
    operator = Operator(plane, url, tmp_path / "op", (f"--namespace={namespace}",)).start()
    try:
        yield System(plane, url, operator), namespace
    finally:
        operator.stop()


def _ledger(system: System, uid: str) -> list[store.LedgerEntry]:
    return system.store(lambda e: store.ledger(e, uid))


def _wait_finished(system: System, uid: str, tool: str) -> None:
    from agentrun_devtools.processes import wait_for

    wait_for(lambda: any(e.tool == tool and e.finished_at is not None
                         for e in _ledger(system, uid)), timeout=60,
             what=f"{tool} finished on the ledger", interval=0.1)


def _condition(run: dict[str, Any], type_: str) -> dict[str, Any]:
    return next(c for c in run["status"]["conditions"] if c["type"] == type_)


def test_evicted_while_thinking_after_send_email_resumes_without_repeating_it(
    where: tuple[System, str]
) -> None:
    system, namespace = where
    script = [{"call": "read_message"}, {"call": "send_email", "args": EMAIL},
              {"sleep": 8}, {"call": "update_crm", "args": {"customer": "42",
                                                            "status": "refunded"}},
              {"text": "Refunded and told the customer."}]
    system.apply(in_namespace(agent_run("thinker", script, retry=RESUME), namespace))
    run = system.wait_phase(namespace, "thinker", Phase.RUNNING)
    _wait_finished(system, run["metadata"]["uid"], "send_email")
    system.evict(namespace, "thinker-1")
    run = system.wait_phase(namespace, "thinker", Phase.SUCCEEDED, Phase.FAILED, timeout=120)
    status = run["status"]
    assert status["phase"] == Phase.SUCCEEDED, status
    assert (status["attempts"], status["resumedAttempts"]) == (2, [2])
    assert status["toolsExecuted"] == ["read_message", "send_email", "update_crm"]
    assert len(system.emails("thinker")) == 1
    assert [r.tool for r in system.store(lambda e: store.outbox(e, "thinker"))].count(
        "update_crm") == 1
    assert _condition(run, Condition.RESUMABLE)["status"] == "True"


def test_evicted_while_an_idempotent_call_is_in_doubt_runs_it_again_with_its_key(
    where: tuple[System, str]
) -> None:
    system, namespace = where
    script = [{"call": "send_email", "args": {**EMAIL, "delay_seconds": 6}},
              {"text": "Emailed."}]
    system.apply(in_namespace(agent_run("doubtful", script, retry=RESUME), namespace))
    run = system.wait_phase(namespace, "doubtful", Phase.RUNNING)
    system.wait_ledger(run["metadata"]["uid"], "send_email")
    system.evict(namespace, "doubtful-1")
    run = system.wait_phase(namespace, "doubtful", Phase.SUCCEEDED, Phase.FAILED, timeout=120)
    assert run["status"]["phase"] == Phase.SUCCEEDED, run["status"]
    assert run["status"]["resumedAttempts"] == [2]
    entries = [e for e in _ledger(system, run["metadata"]["uid"]) if e.tool == "send_email"]
    assert [e.attempt for e in entries] == [1, 2]
    assert entries[0].idempotency_key == entries[1].idempotency_key  # the same logical call
    assert len(system.emails("doubtful")) == 1  # the world deduped it by that key


def test_evicted_while_an_effectful_call_is_in_doubt_is_not_resumed(
    where: tuple[System, str]
) -> None:
    system, namespace = where
    script = [{"call": "charge_card", "args": {"customer": "42", "amount": 10,
                                               "delay_seconds": 30}},
              {"text": "Charged."}]
    system.apply(in_namespace(agent_run("charger", script, retry=RESUME), namespace))
    run = system.wait_phase(namespace, "charger", Phase.RUNNING)
    system.wait_ledger(run["metadata"]["uid"], "charge_card")
    system.evict(namespace, "charger-1")
    run = system.wait_run(namespace, "charger", lambda r: (r.get("status") or {}).get(
        "phase") == Phase.FAILED and any(c["type"] == Condition.RESUMABLE
                                         for c in r["status"].get("conditions") or []))
    status = run["status"]
    assert (status["reason"], status["attempts"]) == (Reason.EVICTED, 1)
    resumable = _condition(run, Condition.RESUMABLE)
    assert (resumable["status"], resumable["reason"]) == ("False",
                                                          ReplayReason.TOOL_CALL_IN_DOUBT)
    assert "called charge_card (call 1, at " in resumable["message"]
    assert "charge_card is Effectful" in resumable["message"]
    charges = [r for r in system.store(lambda e: store.outbox(e, "charger"))
               if r.tool == "charge_card"]
    assert len(charges) == 1


def test_a_call_that_finished_but_never_reached_the_session_is_answered_from_the_ledger(
    system: System, namespace: str
) -> None:
    script = [{"call": "update_crm", "args": {"customer": "42", "status": "refunded"}},
              {"text": "Updated."}]
    # The runner dies right after update_crm's end is on the ledger, before ADK writes its
    # response into the session (a runner test hook).
    manifest = agent_run("half-told", script, retry=RESUME,
                         env=[{"name": "AGENTRUN_TEST_CRASH_AFTER_CLOSE",
                               "value": "update_crm"}])
    system.apply(in_namespace(manifest, namespace))
    run = system.wait_phase(namespace, "half-told", Phase.SUCCEEDED, Phase.FAILED,
                            timeout=120)
    status = run["status"]
    assert status["phase"] == Phase.SUCCEEDED, status
    assert (status["attempts"], status["resumedAttempts"]) == (2, [2])
    entries = _ledger(system, run["metadata"]["uid"])
    assert [(e.attempt, e.tool, e.outcome) for e in entries] == [
        (1, "update_crm", "ok"), (2, "update_crm", "journal")]
    crm = [r for r in system.store(lambda e: store.outbox(e, "half-told"))
           if r.tool == "update_crm"]
    assert len(crm) == 1  # answered from the ledger: it ran once
    assert status["toolsExecuted"] == ["update_crm"]


def test_kubectl_agentrun_tools_shows_effects_keys_and_how_calls_ended(
    system: System, namespace: str
) -> None:
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = [{"call": "update_crm", "args": {"customer": "42", "status": "refunded"}},
              {"text": "Updated."}]
    manifest = agent_run("told-twice", script, retry=RESUME,
                         env=[{"name": "AGENTRUN_TEST_CRASH_AFTER_CLOSE",
                               "value": "update_crm"}])
    system.apply(in_namespace(manifest, namespace))
    system.wait_phase(namespace, "told-twice", Phase.SUCCEEDED, Phase.FAILED, timeout=120)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}"
           f"{os.environ.get('PATH', '')}", "KUBECONFIG": str(system.plane.kubeconfig),
           "DATABASE_URL": system.store_url}
    shown = subprocess.run([str(system.plane.bin / "kubectl"), "agentrun", "tools",
                            "told-twice", "-n", namespace], env=env, capture_output=True,
                           text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    lines = [ln.split() for ln in shown.stdout.splitlines()[1:]]
    assert lines[0][:5] == ["ATTEMPT", "#", "TOOL", "EFFECT", "KEY"]
    assert lines[1][:4] == ["1", "1", "update_crm", "Effectful"]
    assert lines[2][:4] == ["2", "1", "update_crm", "Effectful"]
    assert lines[1][4] == lines[2][4] and lines[1][4].startswith("agentrun-")
    assert "ran: ok at" in shown.stdout
    assert "answered from the journal (not run again)" in shown.stdout
