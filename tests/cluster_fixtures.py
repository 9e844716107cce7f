"""Fixtures for tests against the real control plane (kube-apiserver + etcd +
kube-controller-manager + kube-scheduler), started once per test session."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from agentrun_devtools import transcript_api
from agentrun_devtools.cluster import start_dev_node
from agentrun_devtools.controlplane import REPO, ControlPlane
from agentrun_devtools.postgres import Postgres
from agentrun_devtools.processes import Child, free_port, pids_alive
from agentrun_devtools.transcript_api import TranscriptEndpoint

from agentrun import store
from tests.harness import Operator, System, delete_namespace
from tests.receiver.receiver import Receiver, grant_the_charts_rights

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
    """Server-side applies crds/ and waits until every CRD is Established."""
    plane.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(directory))
    plane.kubectl(
        "wait", "--for=condition=Established", "--timeout=60s",
        "crd/agentruns.agentrun.dev", "crd/agentrunreplays.agentrun.dev",
        "crd/agentrunapprovals.agentrun.dev",
        "crd/agentrunschedules.agentrun.dev", "crd/agents.agentrun.dev",
        "crd/agentruntriggers.agentrun.dev",
    )
    # Established is not yet served: just after it, a create can still be answered 503
    # ("Kind=AgentRun not found") while the API server builds the kind's handler. A
    # server-side dry run of one AgentRun (admission included) says when it is.
    probe = json.dumps({"apiVersion": "agentrun.dev/v1alpha1", "kind": "AgentRun",
                        "metadata": {"name": "served-probe", "namespace": "default"},
                        "spec": {"agent": "support-agent", "input": {"text": "probe"}}})
    deadline = time.monotonic() + 60
    while True:
        done = plane.kubectl("create", "--dry-run=server", "-f", "-", input=probe,
                             check=False)
        if done.returncode == 0:
            return
        assert time.monotonic() < deadline, f"AgentRuns not served in 60 s: {done.stderr}"
        time.sleep(0.2)


@pytest.fixture(scope="session")
def crds(control_plane: ControlPlane) -> ControlPlane:
    """The control plane with agentrun's CRDs and admission policy installed."""
    apply_crds(control_plane)
    return control_plane


def fresh_namespace(plane: ControlPlane, prefix: str) -> Iterator[str]:
    """Yields a new namespace, `prefix` and a number; deletes it (without waiting) after."""
    name = f"{prefix}{next(_namespaces)}"
    plane.kubectl("create", "namespace", name)
    try:
        yield name
    finally:
        delete_namespace(plane, name)


@pytest.fixture
def namespace(control_plane: ControlPlane) -> Iterator[str]:
    """A fresh namespace for one test, deleted (without waiting) afterwards."""
    yield from fresh_namespace(control_plane, "t")


# -- the whole system: development node, store, operator --------------------------------------

# The session operator leaves namespaces named solo-* alone: tests that need an operator
# with other settings (a short stale limit, a restart) start their own there.
SESSION_OPERATOR_ARGS = (
    "--namespace=!solo-*",
    "--toleration-seconds=6",
    "--check-interval=1",
)


@pytest.fixture(scope="session")
def dev_node(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[
        Child]:
    node = start_dev_node(control_plane, tmp_path_factory.mktemp("pods"))
    try:
        yield node
    finally:
        node.stop()


@pytest.fixture(scope="session")
def store_url(postgres: Postgres) -> str:
    """The run store of the end-to-end tests (real Postgres), shared by all its clients,
    migrated as the operator migrates it at start-up: a test that starts the store API
    before any operator (tests/operator/test_leader.py) finds its tables."""
    url = postgres.create_database("system")
    asyncio.run(store.migrate(url))
    return url


@pytest.fixture(scope="session")
def transcript_endpoint(control_plane: ControlPlane) -> TranscriptEndpoint:
    """Where the session's store API serves the transcript API (this host's address: the
    API server's EndpointSlice may not name a loopback one)."""
    return TranscriptEndpoint(control_plane.host_address, free_port())


@pytest.fixture(scope="session")
def receiver_port() -> int:
    """Where the session's trigger receiver listens (the session operator writes it into
    triggers' status.url, whether or not a test started the receiver)."""
    return free_port()


@pytest.fixture(scope="session")
def receiver(crds: ControlPlane, receiver_port: int,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[Receiver]:
    """The session's trigger receiver (tests/receiver/receiver.py)."""
    grant_the_charts_rights(crds)
    process = Receiver(crds, tmp_path_factory.mktemp("receiver"), port=receiver_port).start()
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture(scope="session")
def operator(crds: ControlPlane, dev_node: Child, store_url: str,
             transcript_endpoint: TranscriptEndpoint, receiver_port: int,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[Operator]:
    """The session operator, and beside it the session's store API, its own process (as
    `make run` and the chart run them), which also serves the transcript API, registered
    with the API server (APIService v1alpha1.store.agentrun.dev) while it lives."""
    process = Operator(crds, store_url, tmp_path_factory.mktemp("operator"),
                       (*SESSION_OPERATOR_ARGS, f"--receiver-url=https://127.0.0.1:{receiver_port}"),
                       transcript_listen=transcript_endpoint.listen).start()
    transcript_api.register(crds, transcript_endpoint)
    try:
        yield process
    finally:
        # First: an APIService nobody serves would hold up namespace deletion.
        transcript_api.unregister(crds)
        process.stop()


@pytest.fixture
def system(crds: ControlPlane, store_url: str, operator: Operator) -> System:
    if operator.child is None or not operator.child.alive():
        operator.start()
    return System(crds, store_url, operator)


@pytest.fixture
def solo_namespace(control_plane: ControlPlane) -> Iterator[str]:
    """A namespace the session operator ignores (for a test's own operator)."""
    yield from fresh_namespace(control_plane, "solo-")
