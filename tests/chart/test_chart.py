"""The Helm chart renders and the real API server accepts every object it renders."""

from __future__ import annotations

import subprocess

import pytest
from agentrun_devtools.controlplane import REPO, ControlPlane

CHART = REPO / "charts" / "agentrun"


def helm(plane: ControlPlane, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(plane.bin / "helm"), *args], capture_output=True, text=True)


def render(plane: ControlPlane, namespace: str = "agentrun-system", *sets: str) -> str:
    done = helm(plane, "template", "agentrun", str(CHART), "--namespace", namespace,
                "--kube-version", "v1.37.2", "--include-crds",
                *[a for s in sets for a in ("--set", s)])
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_chart_lints(control_plane: ControlPlane) -> None:
    done = helm(control_plane, "lint", str(CHART), "--namespace", "agentrun-system",
                "--kube-version", "v1.37.2", "--set", "postgres.enabled=true")
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("values", [
    ("postgres.enabled=true", "networkPolicy.enabled=true"),
    ("database.url=postgresql+psycopg://u@db:5432/agentrun", "operator.namespaces={a,b}"),
])
def test_rendered_objects_are_accepted_by_the_api_server(
        crds: ControlPlane, values: tuple[str, ...]) -> None:
    crds.kubectl("create", "namespace", "agentrun-system", check=False)
    manifest = render(crds, "agentrun-system", *values)
    done = crds.kubectl("apply", "--dry-run=server", "-n", "agentrun-system", "-f", "-",
                        input=manifest, check=False)
    assert done.returncode == 0, done.stderr
    for kind in ("deployment.apps/agentrun-operator", "clusterrole.rbac.authorization.k8s.io/"
                 "agentrun-replay-forcer", "validatingadmissionpolicy.admissionregistration"
                 ".k8s.io/agentrun-force-replay"):
        assert kind in done.stdout


def test_chart_refuses_another_namespace_and_a_missing_store(control_plane: ControlPlane) -> None:
    elsewhere = helm(control_plane, "template", "agentrun", str(CHART), "--namespace", "x",
                     "--kube-version", "v1.37.2", "--set", "postgres.enabled=true")
    assert elsewhere.returncode != 0
    assert "install agentrun into the namespace agentrun-system" in elsewhere.stderr
    no_store = helm(control_plane, "template", "agentrun", str(CHART), "--namespace",
                    "agentrun-system", "--kube-version", "v1.37.2")
    assert no_store.returncode != 0
    assert "agentrun needs a durable run store" in no_store.stderr
