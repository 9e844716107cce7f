"""The chart's Argo CD health checks (charts/agentrun/argocd, Argo CD's resource_customizations
layout) give, in Argo CD's own health code (tests/chart/argocd.py) and read from the
argocd-cm patch the chart ships, for every case of their health_test.yaml, the status and
message written there; the cases cover every phase; the sandbox is Argo CD's (what it does
not open fails as it fails there); and kstatus (Flux) reads the same objects as
docs/gitops.md says."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests import kstatus
from tests.chart import argocd
from tests.chart.argocd import ARGOCD_CM, CUSTOMIZATIONS, SANDBOX, health, health_tests

KINDS = argocd.kinds()
# Where Argo CD reads the scripts from: the argocd-cm patch as shipped, and the health.lua
# sources it is generated from (tests/chart/test_chart_sources.py keeps the two equal).
SCRIPTS = {"argocd-cm": ARGOCD_CM, "health.lua": CUSTOMIZATIONS}


def _kind_dir(kind: str, root: Path = CUSTOMIZATIONS) -> Path:
    return root / kind


def _listed(root: Path) -> list[tuple[str, str, dict[str, str]]]:
    """(kind, inputPath, healthStatus) of every case, as the health_test.yaml files say."""
    found = []
    for kind in argocd.kinds(root):
        tests = yaml.safe_load((_kind_dir(kind, root) / "health_test.yaml").read_text())["tests"]
        found += [(kind, case["inputPath"], case["healthStatus"]) for case in tests]
    return found


def _judged(root: Path, scripts: Path, kind: str, input_path: str) -> argocd.Case:
    report = health_tests(root, scripts)
    (case,) = [c for c in report.cases if (c.kind, c.input_path) == (kind, input_path)]
    return case


def _load(kind: str, path: str) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((_kind_dir(kind) / path).read_text())
    return loaded


def test_the_interpreter_is_argo_cds_at_the_pinned_version() -> None:
    go_mod = (argocd.REPO / "devtools" / "peers" / "argocd-health" / "go.mod").read_text()
    pinned = re.search(r"^\s*github\.com/argoproj/argo-cd/v3 (v\S+)$", go_mod, re.M)
    assert pinned, "devtools/peers/argocd-health/go.mod pins no argo-cd/v3"
    assert health_tests(CUSTOMIZATIONS, ARGOCD_CM).argocd == pinned[1]


@pytest.mark.parametrize("scripts", SCRIPTS.values(), ids=SCRIPTS.keys())
def test_argo_cd_judged_every_case_listed(scripts: Path) -> None:
    report = health_tests(CUSTOMIZATIONS, scripts)
    assert report.errors == ()
    assert sorted((c.kind, c.input_path) for c in report.cases) == sorted(
        (k, p) for k, p, _ in _listed(CUSTOMIZATIONS))


@pytest.mark.parametrize("scripts", SCRIPTS.values(), ids=SCRIPTS.keys())
@pytest.mark.parametrize(("kind", "input_path", "expected"), _listed(CUSTOMIZATIONS),
                         ids=[f"{k}-{Path(p).stem}" for k, p, _ in _listed(CUSTOMIZATIONS)])
def test_health_test_yaml_case(scripts: Path, kind: str, input_path: str,
                               expected: dict[str, str]) -> None:
    case = _judged(CUSTOMIZATIONS, scripts, kind, input_path)
    assert case.expected == expected, "Argo CD reads health_test.yaml otherwise"
    assert (case.health, case.error) == (expected, ""), case


# api.md "Conditions for GitOps tools", as Argo CD health and as kstatus status. `created`
# has no status at all; `observed` is the operator's first write (no phase yet: Ready
# Unknown, Reconciling True); `unobserved` describes an older generation.
PHASES = {
    "agentrun.dev/AgentRun": {
        "created": ("Progressing", kstatus.CURRENT),
        "observed": ("Progressing", kstatus.IN_PROGRESS),
        "pending": ("Progressing", kstatus.IN_PROGRESS),
        "running": ("Progressing", kstatus.IN_PROGRESS),
        # Ready False, nothing reconciling, nothing stalled: kstatus reads InProgress.
        "waiting": ("Suspended", kstatus.IN_PROGRESS),
        "succeeded": ("Healthy", kstatus.CURRENT),
        "failed": ("Degraded", kstatus.FAILED),
        "cancelled": ("Degraded", kstatus.FAILED),
        "unobserved": ("Progressing", kstatus.IN_PROGRESS),
    },
    "agentrun.dev/AgentRunReplay": {
        "created": ("Progressing", kstatus.CURRENT),
        "pending": ("Progressing", kstatus.IN_PROGRESS),
        "approved": ("Healthy", kstatus.CURRENT),
        "refused": ("Degraded", kstatus.FAILED),
    },
    "agentrun.dev/AgentRunSchedule": {
        "created": ("Progressing", kstatus.CURRENT),
        "unobserved": ("Progressing", kstatus.IN_PROGRESS),
        "scheduled": ("Healthy", kstatus.CURRENT),
        "running": ("Healthy", kstatus.CURRENT),
        "suspended": ("Suspended", kstatus.CURRENT),
        "invalid": ("Degraded", kstatus.FAILED),
    },
    # docs/triggers.md: Listening, Suspended, or Stalled with the reason (its Secret, its
    # spec); the receiver may write its counters before the operator writes conditions.
    "agentrun.dev/AgentRunTrigger": {
        "created": ("Progressing", kstatus.CURRENT),
        "unobserved": ("Progressing", kstatus.IN_PROGRESS),
        "listening": ("Healthy", kstatus.CURRENT),
        "suspended": ("Suspended", kstatus.CURRENT),
        "secret-missing": ("Degraded", kstatus.FAILED),
        "invalid": ("Degraded", kstatus.FAILED),
    },
    # docs/agents.md: Ready, or Stalled with the reason (the definition, or a Secret).
    "agentrun.dev/Agent": {
        "created": ("Progressing", kstatus.CURRENT),
        "valid": ("Healthy", kstatus.CURRENT),
        "invalid": ("Degraded", kstatus.FAILED),
        "secret-missing": ("Degraded", kstatus.FAILED),
        "unobserved": ("Progressing", kstatus.IN_PROGRESS),
    },
}


@pytest.mark.parametrize("kind", KINDS)
def test_every_phase_has_a_case_and_every_case_its_testdata(kind: str) -> None:
    assert kind in PHASES, f"{kind} has a health check: list its phases in PHASES"
    listed = {Path(p).stem: e["status"] for k, p, e in _listed(CUSTOMIZATIONS) if k == kind}
    on_disk = {p.stem for p in (_kind_dir(kind) / "testdata").glob("*.yaml")}
    assert set(listed) == on_disk == set(PHASES[kind])
    assert listed == {name: argo for name, (argo, _) in PHASES[kind].items()}


@pytest.mark.parametrize(("kind", "name"), [(k, n) for k in KINDS for n in PHASES.get(k, {})])
def test_kstatus_reads_the_testdata_as_gitops_md_says(kind: str, name: str) -> None:
    result = kstatus.compute(_load(kind, f"testdata/{name}.yaml"))
    assert result.status == PHASES[kind][name][1], result


def test_kstatus_failed_says_why() -> None:
    failed = _load("agentrun.dev/AgentRun", "testdata/failed.yaml")
    result = kstatus.compute(failed)
    assert result.message == failed["status"]["message"]
    assert [(c.type, c.reason) for c in result.conditions] == [("Stalled", "Evicted")]


# The sandbox: scripts (tests/chart/argocd_sandbox, never shipped) that reach for what Argo
# CD does not open for an argocd-cm customization, each with the Unknown and Lua error Argo
# CD shows for it in its health_test.yaml, beside one using what it does open.
@pytest.mark.parametrize(("kind", "input_path", "expected"), _listed(SANDBOX),
                         ids=[k.rpartition("/")[2] for k, _, _ in _listed(SANDBOX)])
def test_the_sandbox_is_argo_cds(kind: str, input_path: str, expected: dict[str, str]) -> None:
    case = _judged(SANDBOX, SANDBOX, kind, input_path)
    assert case.health == expected, case
    if expected["status"] == "Unknown":
        assert case.error.endswith(expected["message"]), case
    else:
        assert case.error == "", case


def test_the_sandbox_refuses_io_os_and_string() -> None:
    refused = {k.rpartition("/")[2]: e["message"] for k, _, e in _listed(SANDBOX)
               if e["status"] == "Unknown"}
    assert refused.keys() == {"UsesIo", "UsesOs", "UsesString"}
    assert health_tests(SANDBOX, SANDBOX).errors == ()


def test_use_open_libs_in_argocd_cm_opens_them(tmp_path: Path) -> None:
    """The same script, with resource.customizations.useOpenLibs set for its kind, has the
    string library: the sandbox comes from argocd-cm, as in Argo CD."""
    script = (SANDBOX / "example.com" / "UsesString" / "health.lua").read_text()
    probe = yaml.safe_load((SANDBOX / "example.com" / "UsesString" / "testdata" / "probe.yaml"
                            ).read_text())
    argocd_cm = tmp_path / "argocd-cm.yaml"
    argocd_cm.write_text(yaml.safe_dump({"data": {
        "resource.customizations.health.example.com_UsesString": script,
        "resource.customizations.useOpenLibs.example.com_UsesString": "true"}}))
    assert health(probe, argocd_cm) == ("Healthy", "probe")
    assert health(probe, SANDBOX)[0] == "Unknown"


def test_text_reaches_a_script_exactly() -> None:
    text = 'quote " backslash \\ newline\n ünïcode'
    def echo(status: str) -> dict[str, Any]:
        return {"apiVersion": "example.com/v1", "kind": "Echo", "metadata": {"name": "e"},
                "spec": {"status": status, "text": text, "list": ["a", "b"], "count": 7,
                         "gone": None}}

    assert health(echo("Healthy"), SANDBOX) == ("Healthy", f"{text}b7")
    # A status Argo CD does not know is its Unknown, whatever the script said.
    assert health(echo(text), SANDBOX) == ("Unknown", "Lua returned an invalid health status")
