"""Fixtures for the tests of crds/ and samples/: the `crds` fixture (tests/cluster_fixtures.py)
installs crds/, and `policies` waits until the admission policies in it are in force."""

from __future__ import annotations

import time

import pytest

from tests.crds.kube import (
    PROBE_NAMESPACE,
    PROBE_USER,
    Kubectl,
    apply,
    replay_manifest,
    run_manifest,
)


@pytest.fixture
def namespace(solo_namespace: str) -> str:
    """A fresh namespace the session operator leaves alone: these tests read back what the
    API server stored, and the session operator, once a test elsewhere has started it (the
    order of a run is not theirs to choose), would settle their runs."""
    return solo_namespace


@pytest.fixture(scope="session")
def policies(crds: Kubectl) -> Kubectl:
    """The control plane once both admission policies refuse what they should.

    A ValidatingAdmissionPolicy created together with the CRD it matches is not enforced at
    once: the API server first has to load it and learn the new resource. Until then it
    admits everything, so a test could pass a forbidden request through. Probe with server
    dry-runs (admission runs, nothing is stored) until both policies answer.
    """
    crds.kubectl("create", "namespace", PROBE_NAMESPACE)
    crds.kubectl(
        "create",
        "rolebinding",
        "probe",
        "-n",
        PROBE_NAMESPACE,
        "--clusterrole=agentrun-edit",
        f"--user={PROBE_USER}",
    )
    probes = [
        (replay_manifest("probe", force="true"), "agentrun-force-replay"),
        (run_manifest("probe", replayOf="probe"), "agentrun-replay-of"),
    ]
    deadline = time.monotonic() + 120
    for manifest, policy in probes:
        while True:
            done = apply(
                crds, PROBE_NAMESPACE, manifest, as_user=PROBE_USER, extra=("--dry-run=server",)
            )
            if done.returncode != 0 and f"ValidatingAdmissionPolicy '{policy}'" in done.stderr:
                break
            assert time.monotonic() < deadline, (
                f"policy {policy} still not enforced after 120s: {done.stdout}{done.stderr}"
            )
            time.sleep(0.5)
    return crds
