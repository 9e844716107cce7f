"""Argo CD health checks, run by Argo CD's own code: devtools/peers/argocd-health (built by
devtools/peers/build.sh, `make peers`) reads the customizations through Argo CD's settings
manager and judges each object with gitops-engine's GetResourceHealth and util/lua, in
gopher-lua with the libraries Argo CD opens for an argocd-cm customization: base, table,
package and `require("os")` with only time and date; no string, math or io, and no global
`os`, unless argocd-cm sets resource.customizations.useOpenLibs for the kind.

A script that fails there is shown by Argo CD as Unknown with the Lua error as message;
`health` and `health_tests` report it the same way, never as a Python exception."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrun_devtools import peers
from agentrun_devtools.controlplane import REPO

CUSTOMIZATIONS = REPO / "charts" / "agentrun" / "argocd"
# How the chart ships the checks (generated from CUSTOMIZATIONS by `make chart-crds`).
ARGOCD_CM = CUSTOMIZATIONS / "argocd-cm-patch.yaml"
# Scripts that reach for what Argo CD does not open, in the same layout (never shipped).
SANDBOX = Path(__file__).resolve().parent / "argocd_sandbox"


def kinds(root: Path = CUSTOMIZATIONS) -> list[str]:
    """The "<group>/<Kind>" of every health.lua under `root` (Argo CD's layout)."""
    return sorted(f"{p.parent.parent.name}/{p.parent.name}" for p in root.glob("*/*/health.lua"))


def _source(scripts: Path) -> list[str]:
    # A directory is a resource_customizations tree; a file, an argocd-cm ConfigMap.
    return ["--customizations" if scripts.is_dir() else "--argocd-cm", str(scripts)]


@dataclass(frozen=True)
class Case:
    """One case of a health_test.yaml as Argo CD judged it."""

    kind: str
    input_path: str
    expected: dict[str, str] | None
    health: dict[str, str] | None
    error: str


@dataclass(frozen=True)
class Report:
    """What argocd-health said of a tree of health_test.yaml files."""

    argocd: str  # the argo-cd module version it was built from
    cases: tuple[Case, ...]
    errors: tuple[str, ...]  # files it could not read


@functools.cache
def health_tests(root: Path, scripts: Path) -> Report:
    """Every case of every <group>/<Kind>/health_test.yaml under `root`, judged with the
    health checks of `scripts` (an argocd-cm file, or a customizations tree)."""
    (report,) = peers.run("argocd-health", [*_source(scripts), "--tests", str(root)])
    cases = tuple(Case(c["kind"], c["inputPath"], c["expected"], c["health"], c.get("error", ""))
                  for c in report["cases"])
    return Report(report["argocd"], cases, tuple(report["errors"]))


@functools.cache
def _session(scripts: Path) -> peers.Session:
    # One argocd-health per source of scripts, read once: the scripts are not expected to
    # change while the tests run.
    return peers.Session("argocd-health", _source(scripts))


def health(obj: dict[str, Any], scripts: Path = ARGOCD_CM) -> tuple[str, str]:
    """(status, message) as Argo CD shows `obj` (a decoded object) with the health checks
    of `scripts`, by default the argocd-cm patch the chart ships."""
    answer = _session(scripts).ask(obj)
    if answer["health"] is None:
        raise LookupError(f"no health check in {scripts} for {obj.get('apiVersion')} "
                          f"{obj.get('kind')}: {answer.get('error', '')}")
    return answer["health"].get("status", ""), answer["health"].get("message", "")
