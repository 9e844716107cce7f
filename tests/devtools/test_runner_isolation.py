"""A runner started with code-loading variables by other means than an AgentRun (whose
admission refuses them: tests/crds/test_loader_env.py) still runs none of that code: the
launcher it starts through removes the variables and starts Python isolated.

Each test starts the same program twice with the same variables: through `agentrun-runner`,
which gets as far as its own first refusal and plants nothing; and as Python started
directly, which runs every planted vector (so that the first half proves something).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from agentrun_devtools import runner_launcher
from agentrun_devtools.controlplane import ControlPlane
from agentrun_devtools.processes import Child, wait_for

from tests.loader_vectors import (
    BYPASS,
    RUNNER_ENV,
    RUNNER_REFUSAL,
    RUNNER_REFUSAL_EXIT,
    Vectors,
    plant,
)


@pytest.fixture
def vectors(tmp_path: Path) -> Vectors:
    return plant(tmp_path / "planted")


def test_the_launcher_run_directly_runs_none_of_the_planted_code(
        vectors: Vectors, tmp_path: Path) -> None:
    launcher = runner_launcher.build(Path(sys.executable))
    env = {"HOME": str(tmp_path), "LANG": "C.UTF-8", "PATH": os.environ["PATH"],
           **RUNNER_ENV, **vectors.env}

    done = subprocess.run([str(launcher)], env=env, cwd=tmp_path, capture_output=True,
                          text=True, stdin=subprocess.DEVNULL, timeout=120)

    assert done.returncode == RUNNER_REFUSAL_EXIT, done.stderr
    assert RUNNER_REFUSAL in done.stderr
    assert vectors.created() == []

    subprocess.run([sys.executable, *BYPASS], env=env, cwd=tmp_path, capture_output=True,
                   stdin=subprocess.DEVNULL, timeout=120)
    assert vectors.created() == sorted(vectors.markers)


def test_isolated_python_finds_the_runner_and_the_sample_agents_of_the_checkout(
        tmp_path: Path) -> None:
    # What the launcher runs on the development node: -I keeps the working directory off
    # sys.path, and reads no PYTHON* variable (the devtools' PYTHONPATH among them); the
    # checkout's editable install and runner-image/agents are found without.
    probe = ("import agentrun_runner.agents as a\n"
             "where = a.default_agents_dir()\n"
             "print(where, *(a.load_agent(where, n).name\n"
             "               for n in ('support-agent', 'noop-agent')))")
    done = subprocess.run([sys.executable, "-I", "-c", probe], cwd=tmp_path, capture_output=True,
                          text=True, env={"PATH": os.environ["PATH"], "PYTHONPATH": "/nowhere"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(runner_launcher.REPO / "runner-image" / "agents"),
                                   "support_agent", "noop_agent"]


def _pod(name: str, command: list[str], env: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": {
        "nodeName": "dev-node", "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "containers": [{"name": "runner", "image": "agentrun/runner:dev", "command": command,
                        "env": [{"name": k, "value": v} for k, v in env.items()]}]}}


def _finished(plane: ControlPlane, namespace: str, name: str) -> dict[str, Any]:
    """The container's terminated state once the pod has ended."""
    state: dict[str, Any] = {}

    def ended() -> bool:
        nonlocal state
        pod = json.loads(plane.kubectl("get", "pod", name, "-n", namespace, "-o", "json").stdout)
        statuses = (pod.get("status") or {}).get("containerStatuses") or [{}]
        state = (statuses[0].get("state") or {}).get("terminated") or {}
        return bool(state)

    wait_for(ended, timeout=120, what=f"pod {name} ended")
    return state


def test_a_runner_pod_made_by_hand_on_the_development_node_runs_none_of_it(
        control_plane: ControlPlane, dev_node: Child, namespace: str,
        vectors: Vectors) -> None:
    """The admin may create pods; one with the runner's command (the operator's default,
    `agentrun-runner`) and the variables, which no AgentRun could carry."""
    env = {**RUNNER_ENV, **vectors.env}
    control_plane.kubectl("create", "-n", namespace, "-f", "-",
                          input=json.dumps(_pod("by-hand", ["agentrun-runner"], env)))

    ended = _finished(control_plane, namespace, "by-hand")

    assert ended["exitCode"] == RUNNER_REFUSAL_EXIT, ended
    assert RUNNER_REFUSAL in ended.get("message", ""), ended
    assert vectors.created() == []

    control_plane.kubectl("create", "-n", namespace, "-f", "-",
                          input=json.dumps(_pod("bypass", [sys.executable, *BYPASS], env)))
    _finished(control_plane, namespace, "bypass")
    assert vectors.created() == sorted(vectors.markers)
