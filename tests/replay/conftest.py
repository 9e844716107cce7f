"""Replay tests: the `system` (operator process, control plane, development node, Postgres)
and `namespace` fixtures come from tests/cluster_fixtures.py; here are the replay's own
helpers, and `policies`, which waits until the force-replay admission policy is in force."""

from __future__ import annotations

import fcntl
import itertools
import json
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
from agentrun_devtools.controlplane import ControlPlane
from agentrun_devtools.processes import wait_for

from agentrun.kubectl_plugin import replay_manifest
from agentrun.vocabulary import (
    GROUP,
    LABEL_REPLAY_OF,
    ReplayPhase,
)
from tests.harness import System

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


@pytest.fixture(scope="session")
def policies(crds: ControlPlane) -> ControlPlane:
    """The control plane once the force-replay policy refuses what it should.

    A ValidatingAdmissionPolicy created together with its CRD is enforced only after the API
    server has loaded it (a few seconds); until then a forbidden annotation would pass.
    Probe with a server dry-run (admission runs, nothing is stored) until it is refused.
    """
    probe_ns, probe_user = "replay-policy-probe", "replay-probe"
    crds.kubectl("create", "namespace", probe_ns, check=False)
    crds.kubectl("create", "rolebinding", "probe", "-n", probe_ns,
                 "--clusterrole=agentrun-edit", f"--user={probe_user}", check=False)
    manifest = replay_manifest("probe", "probe", force=True)
    deadline = time.monotonic() + 120
    while True:
        done: subprocess.CompletedProcess[str] = crds.kubectl(
            "create", "--dry-run=server", "-n", probe_ns, "-f", "-",
            input=json.dumps(manifest), as_user=probe_user, check=False)
        if done.returncode != 0 and "agentrun-force-replay" in done.stderr:
            return crds
        assert time.monotonic() < deadline, f"force policy not enforced: {done.stderr}"
        time.sleep(0.5)


@pytest.fixture
def the_machines_dev_cluster() -> Iterator[None]:
    """Held by the tests that type the README's and the demo's commands as a newcomer does
    (make dev-cluster, make run, make demo): those serve on the fixed addresses a newcomer
    gets (the store API on 127.0.0.1:8089), so two test processes must not run them at
    once. A lock on the machine, not on the session: make test runs two sessions."""
    with open("/tmp/agentrun-tests-dev-cluster.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield
