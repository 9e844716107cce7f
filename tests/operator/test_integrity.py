"""Runner integrity, from the operator's side: what a runner says cannot erase what it did,
the operator deletes only pods it created, automatic session ids are reserved, and a
replay runs only what its requester may use."""

from __future__ import annotations

import json
from typing import Any

from agentrun_devtools.processes import wait_for
from sqlalchemy.ext.asyncio import AsyncEngine

from agentrun import store
from agentrun.vocabulary import (
    ANNOTATION_CREATED_BY,
    Phase,
    Reason,
    ReplayPhase,
    ReplayReason,
    RunStatus,
)
from tests.harness import System, agent_run, in_namespace
from tests.replays import create_replay, get_replay, wait_decided


def test_a_runner_saying_nothing_ran_after_a_recorded_call_does_not_erase_it(
        system: System, namespace: str) -> None:
    """The runner's own account (here written into the store as an older store API would
    have let it: InputUnavailable, one of the reasons that used to settle with [] unread)
    names the reason; the ledger and the session still say what ran."""
    script = [{"call": "send_email", "args": {"to": "c@example.com", "body": "hi",
                                              "delay_seconds": 5}},
              {"error": 500}]
    system.apply(in_namespace(agent_run("liar", script), namespace))
    uid = system.wait_phase(namespace, "liar", Phase.RUNNING)["metadata"]["uid"]
    system.wait_ledger(uid, "send_email")

    async def lie(engine: AsyncEngine) -> bool:
        return await store.record_outcome(engine, uid, 1, RunStatus.FAILED,
                                          Reason.INPUT_UNAVAILABLE, "nothing ran, honest")

    assert system.store(lie)
    run = system.wait_run(namespace, "liar", lambda r: (r.get("status") or {}).get(
        "phase") == Phase.FAILED and r["status"].get("toolsExecuted") is not None)
    assert run["status"]["reason"] == Reason.INPUT_UNAVAILABLE  # its word, as a label
    assert run["status"]["toolsExecuted"] == ["send_email"]  # not its word: counted
    assert len(system.emails("liar")) == 1
    create_replay(system, namespace, "liar-again", "liar")
    replay = wait_decided(system, namespace, "liar-again")
    assert (replay["status"]["phase"], replay["status"]["reason"]) == (
        ReplayPhase.REFUSED, ReplayReason.TOOLS_EXECUTED)
    assert "send_email" in replay["status"]["message"]


def _pod(system: System, namespace: str, name: str) -> dict[str, Any] | None:
    return system.get("pod", namespace, name)


def test_a_pod_of_the_attempts_name_the_run_does_not_own_survives_its_retry_and_deletion(
        system: System, namespace: str) -> None:
    # Someone else's pod, named as the run's second attempt would be (never scheduled).
    bare = {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "squatted-2", "namespace": namespace},
            "spec": {"nodeSelector": {"agentrun.dev/no-such-node": "x"},
                     "containers": [{"name": "c", "image": "busybox"}]}}
    system.apply(bare)
    uid = _pod(system, namespace, "squatted-2")["metadata"]["uid"]  # type: ignore[index]
    # Attempt 1 fails before any tool, so attempt 2 is due: its pod's name is taken.
    system.apply(in_namespace(agent_run("squatted", [{"error": 500}],
                                        retry={"maxAttempts": 2}), namespace))
    run = system.wait_run(namespace, "squatted", lambda r: (r.get("status") or {}).get(
        "attempts") == 2 and r["status"].get("reason") == Reason.POD_CREATE_FAILED)
    assert run["status"]["phase"] == Phase.PENDING
    assert "A pod named squatted-2 already exists" in run["status"]["message"]
    assert "not this run's runner" in run["status"]["message"]
    system.kubectl("delete", "agentrun", "squatted", "-n", namespace, "--timeout=60s")
    assert system.get("agentrun", namespace, "squatted") is None
    found = _pod(system, namespace, "squatted-2")
    assert found is not None and found["metadata"]["uid"] == uid
    assert not found["metadata"].get("deletionTimestamp")


def test_an_automatic_session_id_of_another_run_is_refused(
        system: System, namespace: str) -> None:
    system.apply(in_namespace(agent_run("owner", [{"text": "hello"}]), namespace))
    owner = system.wait_phase(namespace, "owner", Phase.SUCCEEDED, Phase.FAILED)
    automatic = owner["status"]["sessionId"]
    assert automatic == f"{owner['metadata']['uid']}-1"
    # Its next attempt's session too: reserved before it exists.
    for name, session in (("borrower", automatic),
                          ("claimer", f"{owner['metadata']['uid']}-2")):
        system.apply(in_namespace(agent_run(name, [{"text": "mine now"}], trigger="chat",
                                            sessionId=session), namespace))
        run = system.wait_phase(namespace, name, Phase.FAILED, Phase.SUCCEEDED)
        status = run["status"]
        assert (status["phase"], status["reason"]) == (Phase.FAILED, Reason.SESSION_NOT_OWNED)
        assert "automatic session id" in status["message"]
        assert status["toolsExecuted"] == []
        assert system.get("pod", namespace, f"{name}-1") is None


def _bind_editor(system: System, namespace: str, user: str) -> None:
    system.kubectl("create", "rolebinding", f"{user}-edits", "-n", namespace,
                   "--clusterrole=agentrun-edit", f"--user={user}")


def test_a_replay_is_authorized_for_its_requester(system: System, namespace: str) -> None:
    """sam holds agentrun-edit only: he may not read the Secret the first run reads, so his
    replay of it is refused NotAuthorized (the operator would otherwise read it for him);
    his replay of a run that names no Secret is approved."""
    _bind_editor(system, namespace, "sam")
    system.kubectl("create", "secret", "generic", "crm", "-n", namespace,
                   "--from-literal=token=s3cret")
    secretive = agent_run("secretive", [{"error": 500}])
    secretive["spec"]["env"].append({"name": "CRM_TOKEN", "valueFrom": {
        "secretKeyRef": {"name": "crm", "key": "token"}}})
    system.apply(in_namespace(secretive, namespace))
    system.apply(in_namespace(agent_run("plain", [{"error": 500}]), namespace))
    for name in ("secretive", "plain"):
        run = system.wait_run(namespace, name, lambda r: (r.get("status") or {}).get(
            "phase") == Phase.FAILED and r["status"].get("toolsExecuted") == [])
        assert run["status"]["reason"] == Reason.AGENT_ERROR

    create_replay(system, namespace, "secretive-again", "secretive", as_user="sam")
    replay = wait_decided(system, namespace, "secretive-again")
    annotations = replay["metadata"]["annotations"]
    assert annotations["agentrun.dev/requested-by"] == "sam"  # written by admission
    status = replay["status"]
    assert (status["phase"], status["reason"]) == (ReplayPhase.REFUSED,
                                                   ReplayReason.NOT_AUTHORIZED)
    assert f"sam may not get secrets/crm in namespace {namespace}" in status["message"]
    assert "env var CRM_TOKEN" in status["message"]

    create_replay(system, namespace, "plain-again", "plain", as_user="sam")
    replay = wait_decided(system, namespace, "plain-again")
    assert (replay["status"]["phase"], replay["status"]["reason"]) == (
        ReplayPhase.APPROVED, ReplayReason.NO_TOOLS_EXECUTED)
    # The replay run is sam's (four eyes: he asked for it, so he may not approve its
    # calls), whoever created the original; the operator wrote it with its own identity.
    wait_for(lambda: bool((get_replay(system, namespace, "plain-again").get("status") or {})
                          .get("replayRunName")), timeout=60, what="the replay run")
    replayed = system.run(namespace, get_replay(system, namespace, "plain-again")[
        "status"]["replayRunName"])
    assert replayed["metadata"]["annotations"][ANNOTATION_CREATED_BY] == "sam"
    original = system.run(namespace, "plain")["metadata"]["annotations"]
    assert original[ANNOTATION_CREATED_BY] not in ("sam", "")


def test_the_requester_annotations_cannot_be_written_by_hand(
        system: System, namespace: str) -> None:
    _bind_editor(system, namespace, "sam")
    forged = {"apiVersion": "agentrun.dev/v1alpha1", "kind": "AgentRunReplay",
              "metadata": {"name": "forged", "namespace": namespace,
                           "annotations": {"agentrun.dev/requested-by": "admin"}},
              "spec": {"runName": "whatever"}}
    # Admission writes who asks over what the manifest says.
    system.kubectl("create", "-f", "-", input=json.dumps(forged), as_user="sam")
    made = system.get("agentrunreplays.agentrun.dev", namespace, "forged")
    assert made is not None
    assert made["metadata"]["annotations"]["agentrun.dev/requested-by"] == "sam"
    changed = system.kubectl("annotate", "agentrunreplay", "forged", "-n", namespace,
                             "--overwrite", "agentrun.dev/requested-by=admin",
                             as_user="sam", check=False)
    assert changed.returncode != 0
    assert "say who asked for the replay and never change" in changed.stderr
