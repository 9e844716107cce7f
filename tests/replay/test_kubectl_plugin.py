"""`kubectl agentrun replay|tools|why`, run through kubectl itself (the plugin found on
PATH as kubectl-agentrun), against the session's cluster, operator and store."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from agentrun.vocabulary import ANNOTATION_FORCE_REPLAY
from tests.harness import System
from tests.replay.conftest import get_replay
from tests.replay.test_decisions import evicted_after_send_email

BIN = Path(sys.executable).parent  # where the console script kubectl-agentrun lives


def plugin(system: System, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
           "KUBECONFIG": str(system.plane.kubeconfig), "DATABASE_URL": system.store_url}
    return subprocess.run([str(system.plane.bin / "kubectl"), "agentrun", *args], env=env,
                          capture_output=True, text=True, timeout=120)


def test_tools_replay_and_why(system: System, namespace: str) -> None:
    evicted_after_send_email(system, namespace, "plugged", delay=15)

    tools = plugin(system, "tools", "plugged", "-n", namespace)
    assert tools.returncode == 0, tools.stderr
    assert "AgentRun plugged: Failed (Evicted), attempts 1, toolsExecuted: send_email" in (
        tools.stdout)
    ledger = [line.split() for line in tools.stdout.splitlines()[1:]]
    assert ledger[0][:3] == ["ATTEMPT", "#", "TOOL"]
    assert (ledger[1][0], ledger[1][2]) == ("1", "send_email")
    assert "no (called, never answered)" in tools.stdout

    refused = plugin(system, "replay", "plugged", "-n", namespace, "--name", "plugged-again",
                     "--note", "customer says nothing arrived")
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "agentrunreplay/plugged-again created" in refused.stdout
    assert "AgentRunReplay plugged-again of AgentRun plugged: Refused (ToolsExecuted)" in (
        refused.stdout)
    assert "already called send_email before failing" in refused.stdout
    assert "note:           customer says nothing arrived" in refused.stdout

    forced = plugin(system, "replay", "plugged", "-n", namespace, "--name", "plugged-again",
                    "--force")
    assert forced.returncode == 0, forced.stdout + forced.stderr
    assert f"agentrunreplay/plugged-again annotated {ANNOTATION_FORCE_REPLAY}=true" in (
        forced.stdout)
    assert "Approved (Forced)" in forced.stdout
    run_name = get_replay(system, namespace, "plugged-again")["status"]["replayRunName"]
    assert f"replay run:     {run_name}" in forced.stdout

    why = plugin(system, "why", "plugged-again", "-n", namespace)
    assert why.returncode == 0, why.stderr
    assert "Approved (Forced)" in why.stdout
    assert f"force:          {ANNOTATION_FORCE_REPLAY}=true" in why.stdout
    assert "tools executed: send_email (by plugged, at decision time)" in why.stdout

    missing = plugin(system, "why", "nope", "-n", namespace)
    assert missing.returncode == 2
    assert f"AgentRunReplay nope does not exist in namespace {namespace}" in missing.stderr
