"""Replays for end-to-end tests: AgentRunReplays created as a user creates them, read back
until the operator decides, and the originals they replay, settled the way a row of
api.md's replay decision table needs (real runs of the scripted model, evicted on the
development node)."""

from __future__ import annotations

import itertools
import json
import time
from typing import Any

from agentrun_devtools.processes import wait_for
from agentrun_kubectl.replay import replay_manifest

from agentrun.vocabulary import (
    GROUP,
    LABEL_REPLAY_OF,
    Phase,
    Reason,
    ReplayPhase,
)
from tests.harness import System, agent_run, email_then_wait, in_namespace

REPLAYS = f"agentrunreplays.{GROUP}"
RUNS = f"agentruns.{GROUP}"
FORCE_REFUSAL = (
    "Only principals allowed verb 'force' on agentrunreplays may set agentrun.dev/force-replay;"
    " ask a cluster admin to bind ClusterRole agentrun-replay-forcer"
)
_texts = itertools.count(1)


def unique_text() -> str:
    """An input text no other test uses: snapshots are content-addressed, and a test that
    deletes its snapshot must not take another test's with it."""
    return f"Customer 42 asks for a refund (replay test input #{next(_texts)}, {time.time()})"


def create_replay(system: System, namespace: str, name: str, run_name: str, *,
                  force: bool = False, as_user: str | None = None) -> None:
    manifest = replay_manifest(name, run_name, force=force)
    manifest["metadata"]["namespace"] = namespace
    system.kubectl("create", "-f", "-", input=json.dumps(manifest), as_user=as_user)


def get_replay(system: System, namespace: str, name: str) -> dict[str, Any]:
    found = system.get(REPLAYS, namespace, name)
    assert found is not None, f"AgentRunReplay {namespace}/{name} not found"
    return found


def wait_decided(system: System, namespace: str, name: str, *,
                 timeout: float = 60) -> dict[str, Any]:
    """Until the replay is Approved or Refused; returns it."""
    seen: dict[str, Any] = {}

    def decided() -> bool:
        nonlocal seen
        seen = get_replay(system, namespace, name)
        return (seen.get("status") or {}).get("phase") in (ReplayPhase.APPROVED,
                                                          ReplayPhase.REFUSED)

    try:
        wait_for(decided, timeout=timeout, what=f"AgentRunReplay {name} decided", interval=0.1)
    except TimeoutError as e:
        raise AssertionError(f"{e}; last: {json.dumps(seen, indent=1)}\noperator log tail:\n"
                             f"{system.operator.log()[-4000:]}") from e
    return seen


def replay_runs(system: System, namespace: str, original: str) -> list[dict[str, Any]]:
    """The AgentRuns that replay `original` (label agentrun.dev/replay-of)."""
    done = system.kubectl("get", RUNS, "-n", namespace, "-l", f"{LABEL_REPLAY_OF}={original}",
                          "-o", "json")
    return list(json.loads(done.stdout)["items"])


def events(system: System, namespace: str, name: str) -> list[dict[str, Any]]:
    """The Events about object `name`, as `kubectl describe` lists them."""
    done = system.kubectl("get", "events", "-n", namespace, "--field-selector",
                          f"involvedObject.name={name}", "-o", "json")
    return list(json.loads(done.stdout)["items"])


def condition(obj: dict[str, Any], type_: str) -> dict[str, Any]:
    found = [c for c in (obj.get("status") or {}).get("conditions") or []
             if c["type"] == type_]
    assert found, f"no {type_} condition in {obj.get('status')}"
    return dict(found[0])


# -- originals to replay ----------------------------------------------------------------------


def start(system: System, namespace: str, name: str, script: list[dict[str, Any]],
          **spec: Any) -> None:
    spec.setdefault("text", unique_text())
    system.apply(in_namespace(agent_run(name, script, **spec), namespace))


def evicted_before_any_tool(system: System, namespace: str, name: str,
                            sleep: int = 8, **spec: Any) -> dict[str, Any]:
    """A run evicted while its model still thinks: Failed/Evicted, toolsExecuted []."""
    start(system, namespace, name, [{"sleep": sleep}, {"text": "Nothing was needed."}], **spec)
    system.wait_phase(namespace, name, Phase.RUNNING)
    system.wait_pod_running(namespace, f"{name}-1")
    system.evict(namespace, f"{name}-1")
    run = system.wait_phase(namespace, name, Phase.FAILED, Phase.SUCCEEDED)
    assert (run["status"]["reason"], run["status"]["toolsExecuted"]) == (Reason.EVICTED, [])
    return run


def evicted_after_send_email(system: System, namespace: str, name: str,
                             delay: int = 60) -> dict[str, Any]:
    """A run evicted while send_email waits to answer: the email went out."""
    start(system, namespace, name, email_then_wait(delay))
    uid = system.wait_phase(namespace, name, Phase.RUNNING)["metadata"]["uid"]
    system.wait_ledger(uid, "send_email")
    system.evict(namespace, f"{name}-1")
    run = system.wait_phase(namespace, name, Phase.FAILED, Phase.SUCCEEDED)
    assert run["status"]["toolsExecuted"] == ["send_email"], run["status"]
    return run
