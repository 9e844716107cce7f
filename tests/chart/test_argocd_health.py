"""The chart's Argo CD health checks (charts/agentrun/argocd, Argo CD's resource_customizations
layout) give, for every case of their health_test.yaml, the status and message written
there; the cases cover every phase; and kstatus (Flux) reads the same objects as
docs/gitops.md says."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests import kstatus
from tests.chart.argocd import CUSTOMIZATIONS, KINDS, LUA, health, lua_literal


def _kind_dir(kind: str) -> Path:
    return CUSTOMIZATIONS / "agentrun.dev" / kind


def _cases() -> list[tuple[str, str, dict[str, str]]]:
    found = []
    for kind in KINDS:
        listed = yaml.safe_load((_kind_dir(kind) / "health_test.yaml").read_text())["tests"]
        found += [(kind, case["inputPath"], case["healthStatus"]) for case in listed]
    return found


def _load(kind: str, path: str) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((_kind_dir(kind) / path).read_text())
    return loaded


def test_a_lua_interpreter_is_there() -> None:
    assert shutil.which(LUA), "no lua5.4: install Debian's lua5.4 (.ci/run does)"


@pytest.mark.parametrize(("kind", "input_path", "expected"), _cases(),
                         ids=[f"{k}-{Path(p).stem}" for k, p, _ in _cases()])
def test_health_test_yaml_case(kind: str, input_path: str, expected: dict[str, str]) -> None:
    status, message = health(_kind_dir(kind) / "health.lua", _load(kind, input_path))
    assert {"status": status, "message": message} == expected


# api.md "Conditions for GitOps tools", as Argo CD health and as kstatus status. `created`
# has no status at all; `observed` is the operator's first write (no phase yet: Ready
# Unknown, Reconciling True); `unobserved` describes an older generation.
PHASES = {
    "AgentRun": {
        "created": ("Progressing", kstatus.CURRENT),
        "observed": ("Progressing", kstatus.IN_PROGRESS),
        "pending": ("Progressing", kstatus.IN_PROGRESS),
        "running": ("Progressing", kstatus.IN_PROGRESS),
        "succeeded": ("Healthy", kstatus.CURRENT),
        "failed": ("Degraded", kstatus.FAILED),
        "cancelled": ("Degraded", kstatus.FAILED),
        "unobserved": ("Progressing", kstatus.IN_PROGRESS),
    },
    "AgentRunReplay": {
        "created": ("Progressing", kstatus.CURRENT),
        "pending": ("Progressing", kstatus.IN_PROGRESS),
        "approved": ("Healthy", kstatus.CURRENT),
        "refused": ("Degraded", kstatus.FAILED),
    },
    "AgentRunSchedule": {
        "created": ("Progressing", kstatus.CURRENT),
        "unobserved": ("Progressing", kstatus.IN_PROGRESS),
        "scheduled": ("Healthy", kstatus.CURRENT),
        "running": ("Healthy", kstatus.CURRENT),
        "suspended": ("Suspended", kstatus.CURRENT),
        "invalid": ("Degraded", kstatus.FAILED),
    },
}


@pytest.mark.parametrize("kind", KINDS)
def test_every_phase_has_a_case_and_every_case_its_testdata(kind: str) -> None:
    listed = {Path(p).stem: e["status"] for k, p, e in _cases() if k == kind}
    on_disk = {p.stem for p in (_kind_dir(kind) / "testdata").glob("*.yaml")}
    assert set(listed) == on_disk == set(PHASES[kind])
    assert listed == {name: argo for name, (argo, _) in PHASES[kind].items()}


@pytest.mark.parametrize(("kind", "name"), [(k, n) for k in KINDS for n in PHASES[k]])
def test_kstatus_reads_the_testdata_as_gitops_md_says(kind: str, name: str) -> None:
    result = kstatus.compute(_load(kind, f"testdata/{name}.yaml"))
    assert result.status == PHASES[kind][name][1], result


def test_kstatus_failed_says_why() -> None:
    failed = _load("AgentRun", "testdata/failed.yaml")
    result = kstatus.compute(failed)
    assert result.message == failed["status"]["message"]
    assert [(c.type, c.reason) for c in result.conditions] == [("Stalled", "Evicted")]


def test_the_scripts_keep_to_what_argo_cd_offers(tmp_path: Path) -> None:
    """A script that calls os or io (which Argo CD does not open) fails here too."""
    script = tmp_path / "health.lua"
    script.write_text('local hs = {status = os.getenv("HOME")}\nreturn hs\n')
    with pytest.raises(AssertionError, match="os"):
        health(script, {})


def test_lua_literal_keeps_text_exactly(tmp_path: Path) -> None:
    script = tmp_path / "health.lua"
    script.write_text("return {status = obj.s, message = obj.list[2] .. obj.n}\n")
    text = 'quote " backslash \\ newline\n ünïcode'
    assert health(script, {"s": text, "list": ["a", "b"], "n": 7, "gone": None}) == (
        text, "b7")
    assert lua_literal({"k": None}) == "{}"
