"""What GitOps tools read on the objects the running operator writes (api.md "Conditions for
GitOps tools"; docs/gitops.md): every status version of a run, as a watch delivers it, has
Ready/Reconciling (and Stalled once failed) in line with its phase and observedGeneration
equal to the generation; kstatus (cli-utils' own, through tests/kstatus.py) and the chart's
Argo CD health checks (in Argo CD's own code, from the argocd-cm patch the chart ships,
through tests/chart/argocd.py) read each version as the table says.

These fail, with a message naming the missing condition, for as long as the operator
writes only Succeeded/ToolsExecuted/Approved: kstatus then reads every version as Current
("Resource is current"), a run that failed included.
"""

from __future__ import annotations

import json
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from agentrun_devtools.processes import wait_for

from agentrun.vocabulary import (
    GROUP,
    REPLAY_PLURAL,
    RUN_PLURAL,
    VERSION,
    Phase,
    Reason,
    ReplayPhase,
    ReplayReason,
)
from tests import kstatus
from tests.chart.argocd import health
from tests.harness import HAPPY, System, agent_run, in_namespace
from tests.replays import create_replay, wait_decided

# phase -> (Ready, Reconciling, Stalled or None, kstatus, Argo CD), from api.md.
EXPECTED: dict[str, tuple[str, str, str | None, str, str]] = {
    "": ("Unknown", "True", None, kstatus.IN_PROGRESS, "Progressing"),
    Phase.PENDING: ("False", "True", None, kstatus.IN_PROGRESS, "Progressing"),
    Phase.RUNNING: ("False", "True", None, kstatus.IN_PROGRESS, "Progressing"),
    Phase.SUCCEEDED: ("True", "False", None, kstatus.CURRENT, "Healthy"),
    Phase.FAILED: ("False", "False", "True", kstatus.FAILED, "Degraded"),
    Phase.CANCELLED: ("False", "False", "True", kstatus.FAILED, "Degraded"),
}
EXPECTED_REPLAY: dict[str, tuple[str, str, str | None, str, str]] = {
    "": ("Unknown", "True", None, kstatus.IN_PROGRESS, "Progressing"),
    ReplayPhase.PENDING: ("False", "True", None, kstatus.IN_PROGRESS, "Progressing"),
    ReplayPhase.APPROVED: ("True", "False", None, kstatus.CURRENT, "Healthy"),
    ReplayPhase.REFUSED: ("False", "False", "True", kstatus.FAILED, "Degraded"),
}


@contextmanager
def versions(system: System, namespace: str, plural: str, name: str
             ) -> Iterator[list[dict[str, Any]]]:
    """Every version of the object written while the block runs, in order: a watch from
    the resourceVersion of a list made before the block, so that it misses nothing however
    late it connects; read until it has delivered the version current at the end."""
    path = f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{plural}"
    selector = f"fieldSelector=metadata.name%3D{name}"
    since = json.loads(system.kubectl("get", "--raw", f"{path}?{selector}").stdout
                       )["metadata"]["resourceVersion"]
    plane = system.plane
    watch = subprocess.Popen(
        [str(plane.bin / "kubectl"), f"--kubeconfig={plane.kubeconfig}", "get", "--raw",
         f"{path}?{selector}&watch=true&resourceVersion={since}"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    seen: list[dict[str, Any]] = []

    def read() -> None:
        assert watch.stdout is not None
        for line in watch.stdout:
            event = json.loads(line)
            if event["type"] in ("ADDED", "MODIFIED"):
                seen.append(event["object"])

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        yield seen
        last = json.loads(system.kubectl("get", f"{plural}.{GROUP}", name, "-n", namespace,
                                         "-o", "json").stdout)["metadata"]["resourceVersion"]
        wait_for(lambda: any(v["metadata"]["resourceVersion"] == last for v in seen),
                 timeout=30, what=f"the watch of {name} to deliver version {last}")
    finally:
        watch.terminate()
        watch.wait(timeout=30)


def _conditions(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in (obj.get("status") or {}).get("conditions") or []}


def check_version(obj: dict[str, Any], table: dict[str, tuple[str, str, str | None, str, str]],
                  kind: str) -> None:
    """One status version against api.md's row for its phase."""
    status = obj.get("status") or {}
    phase = status.get("phase") or ""
    ready, reconciling, stalled, verdict, argo = table[phase]
    where = f"{kind} {obj['metadata']['name']} in phase {phase or '(none)'}"
    found = _conditions(obj)
    for kind_, value in (("Ready", ready), ("Reconciling", reconciling), ("Stalled", stalled)):
        if value is None:
            assert found.get(kind_, {}).get("status") != "True", f"{where}: {kind_} True"
            continue
        assert kind_ in found, (
            f"{where}: the operator sets no {kind_} condition (api.md wants {kind_}={value});"
            f" conditions: {sorted(found)}")
        assert found[kind_]["status"] == value, f"{where}: {kind_} {found[kind_]}"
    if stalled:
        assert found["Stalled"]["reason"] == status.get("reason"), found["Stalled"]
    assert status.get("observedGeneration") == obj["metadata"]["generation"], (
        f"{where}: status.observedGeneration {status.get('observedGeneration')!r}, "
        f"generation {obj['metadata']['generation']}")
    assert kstatus.compute(obj).status == verdict, f"{where}: {kstatus.compute(obj)}"
    assert health(obj)[0] == argo, f"{where}: Argo CD {health(obj)}"


def test_a_run_is_in_progress_until_it_succeeds_then_current(
        system: System, namespace: str) -> None:
    with versions(system, namespace, RUN_PLURAL, "steady") as seen:
        system.apply(in_namespace(agent_run("steady", HAPPY), namespace))
        run = system.wait_phase(namespace, "steady", Phase.SUCCEEDED, Phase.FAILED)
        assert run["status"]["phase"] == Phase.SUCCEEDED, run["status"]
    written = [v for v in seen if v.get("status")]
    phases = [v["status"].get("phase") for v in written]
    assert Phase.SUCCEEDED in phases and (Phase.PENDING in phases or Phase.RUNNING in phases), (
        phases)
    for version in written:
        check_version(version, EXPECTED, "AgentRun")
    # Before its first status write, kstatus cannot tell (docs/gitops.md).
    assert all(kstatus.compute(v).status == kstatus.CURRENT for v in seen if not v.get("status"))


def test_a_failed_run_is_stalled_with_its_reason(system: System, namespace: str) -> None:
    with versions(system, namespace, RUN_PLURAL, "empty-handed") as seen:
        system.apply(in_namespace(
            agent_run("empty-handed", [{"empty": True}, {"empty": True}]), namespace))
        run = system.wait_phase(namespace, "empty-handed", Phase.FAILED, Phase.SUCCEEDED)
        assert run["status"]["reason"] == Reason.AGENT_ERROR, run["status"]
    for version in [v for v in seen if v.get("status")]:
        check_version(version, EXPECTED, "AgentRun")
    result = kstatus.compute(run)
    assert (result.status, result.message) == (kstatus.FAILED, run["status"]["message"])


def test_replays_are_current_when_approved_and_failed_when_refused(
        system: System, namespace: str) -> None:
    system.apply(in_namespace(agent_run("done-once", HAPPY), namespace))
    system.apply(in_namespace(
        agent_run("no-tools", [{"empty": True}, {"empty": True}]), namespace))
    system.wait_phase(namespace, "done-once", Phase.SUCCEEDED)
    system.wait_phase(namespace, "no-tools", Phase.FAILED)

    with versions(system, namespace, REPLAY_PLURAL, "done-once-again") as refused_seen:
        create_replay(system, namespace, "done-once-again", "done-once")
        refused = wait_decided(system, namespace, "done-once-again")
    with versions(system, namespace, REPLAY_PLURAL, "no-tools-again") as approved_seen:
        create_replay(system, namespace, "no-tools-again", "no-tools")
        approved = wait_decided(system, namespace, "no-tools-again")

    assert (refused["status"]["phase"], refused["status"]["reason"]) == (
        ReplayPhase.REFUSED, ReplayReason.ORIGINAL_SUCCEEDED), refused["status"]
    assert (approved["status"]["phase"], approved["status"]["reason"]) == (
        ReplayPhase.APPROVED, ReplayReason.NO_TOOLS_EXECUTED), approved["status"]
    for version in [v for v in [*refused_seen, *approved_seen] if v.get("status")]:
        check_version(version, EXPECTED_REPLAY, "AgentRunReplay")
    assert kstatus.compute(refused).message == refused["status"]["message"]
