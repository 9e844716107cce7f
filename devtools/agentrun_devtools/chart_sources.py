"""The chart's files that are made from others (`make chart-crds`): crds/ stays the one
source of the CRDs, admission policies and ClusterRoles (`make install` applies it), and
the chart ships copies of them; the Argo CD health checks are written once, as Lua files
in Argo CD's own layout, and the argocd-cm patch is made from them.

`python -m agentrun_devtools.chart_sources` writes them; tests/chart/test_chart_sources.py
fails when a file on disk differs from what this would write.
"""

from __future__ import annotations

import sys
from pathlib import Path

from agentrun_devtools.controlplane import REPO

CRDS = REPO / "crds"
CHART = REPO / "charts" / "agentrun"
ARGOCD = CHART / "argocd"
ARGOCD_PATCH = ARGOCD / "argocd-cm-patch.yaml"
COMMAND = "make chart-crds"


def _copied(source: Path) -> bytes:
    header = (f"# Generated from crds/{source.name} by `{COMMAND}`: edit that file, not "
              "this copy.\n")
    return header.encode() + source.read_bytes()


def copies() -> dict[Path, bytes]:
    """The chart's copy of every file of crds/: the CRDs in the chart's crds/ (Helm installs
    them once and never upgrades them), the rest as templates."""
    out = {}
    for source in sorted(CRDS.glob("*.yaml")):
        is_crd = source.name.startswith("agentrun.dev_")
        out[CHART / ("crds" if is_crd else "templates") / source.name] = _copied(source)
    return out


def argocd_patch() -> bytes:
    """A merge patch of Argo CD's argocd-cm carrying both health checks, under the keys
    Argo CD reads (resource.customizations.health.<group>_<kind>)."""
    lines = [f"# Generated from charts/agentrun/argocd/*/*/health.lua by `{COMMAND}`.",
             "# kubectl patch configmap argocd-cm -n argocd --type merge \\",
             "#   --patch-file charts/agentrun/argocd/argocd-cm-patch.yaml",
             "data:"]
    for script in sorted(ARGOCD.glob("*/*/health.lua")):
        group, kind = script.parent.parent.name, script.parent.name
        lines.append(f"  resource.customizations.health.{group}_{kind}: |")
        lines += [f"    {line}" if line else "" for line in script.read_text().splitlines()]
    return ("\n".join(lines) + "\n").encode()


def generated() -> dict[Path, bytes]:
    """Every generated file of the chart and its content."""
    return {**copies(), ARGOCD_PATCH: argocd_patch()}


def main() -> int:
    for path, content in generated().items():
        if path.is_symlink():
            path.unlink()
        if not path.exists() or path.read_bytes() != content:
            path.write_bytes(content)
            print(f"wrote {path.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
