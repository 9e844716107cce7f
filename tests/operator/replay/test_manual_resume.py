"""Manual resume (AgentRunReplay spec.resume): the replay run continues a fork of the
original's session, running only what is left; an Effectful call in doubt is refused
unless a forcer forces, and then it runs again (what force means here)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from agentrun_devtools.controlplane import ControlPlane
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from agentrun import store
from agentrun.vocabulary import (
    ANNOTATION_FORCE_REPLAY,
    FORCER_CLUSTER_ROLE,
    GROUP,
    VERSION,
    Phase,
    ReplayPhase,
    ReplayReason,
)
from tests.harness import System, agent_run, in_namespace
from tests.replays import FORCE_REFUSAL, get_replay, wait_decided

ALICE, BOB = "alice", "bob"


@pytest.fixture
def people(policies: ControlPlane, namespace: str) -> str:
    policies.kubectl("create", "rolebinding", "editors", "-n", namespace,
                     "--clusterrole=agentrun-edit", f"--user={ALICE}", f"--user={BOB}")
    policies.kubectl("create", "rolebinding", "forcers", "-n", namespace,
                     f"--clusterrole={FORCER_CLUSTER_ROLE}", f"--user={BOB}")
    return namespace


def resume(system: System, namespace: str, name: str, run: str, as_user: str) -> None:
    manifest = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "AgentRunReplay",
                "metadata": {"name": name, "namespace": namespace},
                "spec": {"runName": run, "resume": True}}
    system.kubectl("create", "-f", "-", input=json.dumps(manifest), as_user=as_user)


def session_events(system: System, app: str, session: str) -> list[Any]:
    async def read(e: AsyncEngine) -> list[Any]:
        async with e.connect() as conn:
            rows = await conn.execute(text(
                "SELECT id, event_data FROM events WHERE app_name = :a AND session_id = :s "
                "ORDER BY timestamp, id"), {"a": app, "s": session})
            return [(r[0], r[1]) for r in rows]

    return system.store(read)


def evicted(system: System, namespace: str, name: str, script: list[dict[str, Any]],
            wait: Any) -> dict[str, Any]:
    system.apply(in_namespace(agent_run(name, script), namespace))
    run = system.wait_phase(namespace, name, Phase.RUNNING)
    wait(run["metadata"]["uid"])
    system.evict(namespace, f"{name}-1")
    return system.wait_run(namespace, name, lambda r: (r.get("status") or {}).get(
        "phase") == Phase.FAILED and r["status"].get("toolsExecuted") is not None)


def test_a_manual_resume_runs_only_what_is_left_on_a_fork(system: System, people: str) -> None:
    ns = people
    script = [{"call": "read_message"},
              {"call": "send_email", "args": {"to": "c42@example.com", "body": "Refund"}},
              {"sleep": 30},
              {"call": "update_crm", "args": {"customer": "42", "status": "refunded"}},
              {"text": "Done."}]

    def answered(uid: str) -> None:
        from agentrun_devtools.processes import wait_for

        wait_for(lambda: any(e.tool == "send_email" and e.finished_at is not None
                             for e in system.store(lambda en: store.ledger(en, uid))),
                 timeout=60, what="send_email answered")

    original = evicted(system, ns, "mailer", script, answered)
    assert original["status"]["toolsExecuted"] == ["read_message", "send_email"]
    app, session = store.session_app(ns, "support-agent"), original["status"]["sessionId"]
    before = session_events(system, app, session)

    resume(system, ns, "mailer-resume", "mailer", as_user=ALICE)
    replay = wait_decided(system, ns, "mailer-resume")
    status = replay["status"]
    assert (status["phase"], status["reason"]) == (ReplayPhase.APPROVED,
                                                   ReplayReason.RESUMABLE), status
    assert "not repeated: read_message (call 1), send_email (call 2)" in status["message"]
    resumed = system.wait_phase(ns, status["replayRunName"], Phase.SUCCEEDED, Phase.FAILED,
                                timeout=120)
    assert resumed["status"]["phase"] == Phase.SUCCEEDED, resumed["status"]
    assert resumed["status"]["toolsExecuted"] == ["update_crm"]  # only what was left
    assert resumed["status"]["sessionId"] != session  # a fork
    emails = [r for r in system.store(lambda e: store.outbox(e)) if r.tool == "send_email"
              and r.run_name in ("mailer", status["replayRunName"])]
    assert len(emails) == 1
    assert session_events(system, app, session) == before  # the original is untouched
    assert system.run(ns, "mailer")["status"]["phase"] == Phase.FAILED


def test_an_effectful_call_in_doubt_is_refused_and_only_a_forcer_forces_it(
    system: System, people: str
) -> None:
    ns = people
    script = [{"call": "charge_card", "args": {"customer": "42", "amount": 10,
                                               "delay_seconds": 30}},
              {"text": "Charged."}]
    evicted(system, ns, "charged", script,
            lambda uid: system.wait_ledger(uid, "charge_card"))
    resume(system, ns, "charged-resume", "charged", as_user=ALICE)
    replay = wait_decided(system, ns, "charged-resume")
    status = replay["status"]
    assert (status["phase"], status["reason"]) == (ReplayPhase.REFUSED,
                                                   ReplayReason.TOOL_CALL_IN_DOUBT)
    assert "AgentRun charged called charge_card (call 1, at " in status["message"]
    assert "annotate agentrun.dev/force-replay=true to resume and call it again" in \
        status["message"]
    denied = system.kubectl("annotate", "-n", ns, "agentrunreplay/charged-resume",
                            f"{ANNOTATION_FORCE_REPLAY}=true", as_user=ALICE, check=False)
    assert denied.returncode != 0 and FORCE_REFUSAL in denied.stderr
    system.kubectl("annotate", "-n", ns, "agentrunreplay/charged-resume",
                   f"{ANNOTATION_FORCE_REPLAY}=true", as_user=BOB)

    def forced() -> bool:
        return (get_replay(system, ns, "charged-resume").get("status") or {}).get(
            "reason") == ReplayReason.FORCED

    from agentrun_devtools.processes import wait_for

    wait_for(forced, timeout=60, what="the forced resume approved")
    run_name = get_replay(system, ns, "charged-resume")["status"]["replayRunName"]
    system.wait_phase(ns, run_name, Phase.SUCCEEDED, Phase.FAILED, timeout=120)
    charges = [r for r in system.store(lambda e: store.outbox(e))
               if r.tool == "charge_card" and r.run_name in ("charged", run_name)]
    assert len(charges) == 2  # forced: the in-doubt charge ran again


def test_nothing_to_resume_and_a_purged_journal_are_refused(
    system: System, people: str
) -> None:
    ns = people
    system.apply(in_namespace(agent_run("finished", [{"call": "read_message"},
                                                     {"text": "Done."}]), ns))
    done = system.wait_phase(ns, "finished", Phase.SUCCEEDED, Phase.FAILED)
    assert done["status"]["phase"] == Phase.SUCCEEDED
    resume(system, ns, "finished-resume", "finished", as_user=ALICE)
    status = wait_decided(system, ns, "finished-resume")["status"]
    assert (status["phase"], status["reason"]) == (ReplayPhase.REFUSED,
                                                   ReplayReason.ORIGINAL_SUCCEEDED)
    assert "nothing left to resume" in status["message"]

    original = evicted(system, ns, "forgotten", [
        {"call": "send_email", "args": {"to": "c42@example.com", "body": "Refund"}},
        {"sleep": 30}, {"text": "Done."}],
        lambda uid: system.wait_ledger(uid, "send_email"))
    app, session = store.session_app(ns, "support-agent"), original["status"]["sessionId"]

    async def purge(e: AsyncEngine) -> None:  # as retention does once events are old
        async with e.begin() as conn:
            await conn.execute(text("DELETE FROM events WHERE app_name = :a AND "
                                    "session_id = :s"), {"a": app, "s": session})

    system.store(purge)
    resume(system, ns, "forgotten-resume", "forgotten", as_user=BOB)
    system.kubectl("annotate", "-n", ns, "agentrunreplay/forgotten-resume",
                   f"{ANNOTATION_FORCE_REPLAY}=true", as_user=BOB)
    status = wait_decided(system, ns, "forgotten-resume")["status"]
    # Not forcible: there is nothing to continue from; a plain replay starts over.
    assert (status["phase"], status["reason"]) == (ReplayPhase.REFUSED,
                                                   ReplayReason.JOURNAL_UNAVAILABLE)
    assert "a plain replay starts over instead" in status["message"]
