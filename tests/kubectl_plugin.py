"""`kubectl agentrun`, run through kubectl itself: the plugin found on PATH as the console
script kubectl-agentrun, against a test system's cluster and (unless told not to) store."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.harness import System

BIN = Path(sys.executable).parent  # where the console script kubectl-agentrun lives


def plugin(system: System, *args: str,
           store: bool = True) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
           "KUBECONFIG": str(system.plane.kubeconfig), "DATABASE_URL": system.store_url}
    if not store:
        del env["DATABASE_URL"]
    return subprocess.run([str(system.plane.bin / "kubectl"), "agentrun", *args], env=env,
                          capture_output=True, text=True, timeout=120)
