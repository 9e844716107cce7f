"""Manifests and kubectl helpers for the tests of crds/ and samples/ against the real
kube-apiserver.

The fixtures `control_plane`, `crds` and `namespace` come from tests/cluster_fixtures.py.
Manifests are sent as JSON (which is YAML) through `kubectl apply --server-side`, the way a
user or a GitOps pipeline sends them, and the tests read what kubectl prints back.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from typing import Any, Protocol

from agentrun.vocabulary import API_VERSION, REPLAY_KIND, RUN_KIND, SCHEDULE_KIND

# Who the `policies` fixture (tests/crds/conftest.py) probes the admission policies as.
PROBE_NAMESPACE = "agentrun-policy-probe"
PROBE_USER = "policy-probe"


class Kubectl(Protocol):
    def kubectl(
        self,
        *args: str,
        input: str | None = None,
        as_user: str | None = None,
        as_groups: Sequence[str] = (),
        check: bool = True,
    ) -> subprocess.CompletedProcess[str]: ...


def run_manifest(name: str, **spec: Any) -> dict[str, Any]:
    """An AgentRun manifest; `spec` replaces the minimal valid spec's fields."""
    return {
        "apiVersion": API_VERSION,
        "kind": RUN_KIND,
        "metadata": {"name": name},
        "spec": {
            "agent": "support-agent",
            "input": {"text": "Customer 42 asks for a refund"},
            **spec,
        },
    }


def replay_manifest(
    name: str, run_name: str | None = "triage-42", *, force: str | None = None, **spec: Any
) -> dict[str, Any]:
    """An AgentRunReplay manifest, with the force annotation when `force` is given."""
    metadata: dict[str, Any] = {"name": name}
    if force is not None:
        metadata["annotations"] = {"agentrun.dev/force-replay": force}
    body: dict[str, Any] = dict(spec)
    if run_name is not None:
        body["runName"] = run_name
    return {"apiVersion": API_VERSION, "kind": REPLAY_KIND, "metadata": metadata, "spec": body}


def schedule_manifest(name: str = "nightly", **spec: Any) -> dict[str, Any]:
    """An AgentRunSchedule; `spec` replaces the minimal valid spec's fields."""
    body: dict[str, Any] = {"schedule": "0 2 * * *", "runTemplate": {
        "spec": {"agent": "support-agent", "input": {"text": "Triage the overnight queue"}}}}
    body.update(spec)
    return {"apiVersion": API_VERSION, "kind": SCHEDULE_KIND, "metadata": {"name": name},
            "spec": body}


def apply(
    plane: Kubectl,
    namespace: str,
    manifest: dict[str, Any],
    *,
    as_user: str | None = None,
    as_groups: Sequence[str] = (),
    check: bool = False,
    extra: Sequence[str] = (),
) -> subprocess.CompletedProcess[str]:
    """`kubectl apply --server-side` of one manifest; returns kubectl's result."""
    return plane.kubectl(
        "apply",
        "--server-side",
        "--field-manager=agentrun-tests",
        "-n",
        namespace,
        *extra,
        "-f",
        "-",
        input=json.dumps(manifest),
        as_user=as_user,
        as_groups=as_groups,
        check=check,
    )


def get(plane: Kubectl, namespace: str, resource: str) -> dict[str, Any] | None:
    """The object as the API server stores it, or None when it does not exist."""
    done = plane.kubectl("get", resource, "-n", namespace, "-o", "json", check=False)
    if done.returncode != 0:
        assert "NotFound" in done.stderr, done.stderr
        return None
    found: dict[str, Any] = json.loads(done.stdout)
    return found


def refused(done: subprocess.CompletedProcess[str]) -> str:
    """The message a refused request printed (fails the test if it was accepted)."""
    assert done.returncode != 0, f"expected a refusal, got: {done.stdout}"
    return done.stderr


def stored(plane: Kubectl, namespace: str, resource: str) -> dict[str, Any]:
    """The object as the API server stores it; it must exist."""
    found = get(plane, namespace, resource)
    assert found is not None, f"{resource} does not exist in {namespace}"
    return found


def table(plane: Kubectl, *args: str) -> list[dict[str, str]]:
    """`kubectl get ...` as a user reads it: one dict per row, keyed by the column headers.

    kubectl left-aligns each cell under its header, so a cell is the text between the start
    of its header and the start of the next one (cells may contain spaces: `<no value>`).
    """
    lines = plane.kubectl("get", *args).stdout.splitlines()
    header = lines[0]
    names = header.split()
    starts = []
    at = 0
    for name in names:
        at = header.index(name, at)
        starts.append(at)
        at += len(name)
    bounds = [*starts[1:], None]
    cells = list(zip(names, starts, bounds, strict=True))
    return [{name: line[start:end].strip() for name, start, end in cells} for line in lines[1:]]
