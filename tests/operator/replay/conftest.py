"""Replay tests: the `system` (operator process, control plane, development node, Postgres)
and `namespace` fixtures come from tests/cluster_fixtures.py, the replay's helpers from
tests/replays.py; here are `policies`, which waits until the force-replay admission policy
is in force."""

from __future__ import annotations

import json
import subprocess
import time

import pytest
from agentrun_devtools.controlplane import ControlPlane
from agentrun_kubectl.replay import replay_manifest


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
