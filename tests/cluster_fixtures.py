"""Fixtures for tests against the real control plane (kube-apiserver + etcd +
kube-controller-manager + kube-scheduler), started once per test session."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentrun_devtools.controlplane import REPO, ControlPlane
from agentrun_devtools.processes import pids_alive

CRDS = REPO / "crds"
_namespaces = itertools.count(1)


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """The session's control plane; stopping it must leave no process behind."""
    plane = ControlPlane(tmp_path_factory.mktemp("control-plane")).start()
    pids = plane.pids()
    try:
        yield plane
    finally:
        plane.stop()
        left = pids_alive(pids)
        assert not left, f"control plane processes still alive after stop: {left}"


def apply_crds(plane: ControlPlane, directory: Path = CRDS) -> None:
    """Server-side applies crds/ and waits until both CRDs are Established."""
    plane.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(directory))
    plane.kubectl(
        "wait", "--for=condition=Established", "--timeout=60s",
        "crd/agentruns.agentrun.dev", "crd/agentrunreplays.agentrun.dev",
    )


@pytest.fixture(scope="session")
def crds(control_plane: ControlPlane) -> ControlPlane:
    """The control plane with agentrun's CRDs and admission policy installed."""
    apply_crds(control_plane)
    return control_plane


@pytest.fixture
def namespace(control_plane: ControlPlane) -> Iterator[str]:
    """A fresh namespace for one test, deleted (without waiting) afterwards."""
    name = f"t{next(_namespaces)}"
    control_plane.kubectl("create", "namespace", name)
    try:
        yield name
    finally:
        control_plane.kubectl("delete", "namespace", name, "--wait=false", check=False)
