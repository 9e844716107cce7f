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

import yaml

from agentrun_devtools.controlplane import REPO

CRDS = REPO / "crds"
CHART = REPO / "charts" / "agentrun"
ARGOCD = CHART / "argocd"
ARGOCD_PATCH = ARGOCD / "argocd-cm-patch.yaml"
COMMAND = "make chart-crds"


def _header(source: Path) -> str:
    return (f"# Generated from crds/{source.name} by `{COMMAND}`: edit that file, not "
            "this copy.\n")


def _copied(source: Path) -> bytes:
    return _header(source).encode() + source.read_bytes()


def _guarded(source: Path) -> bytes:
    """A template of `source` in which each object is rendered only when the release may
    own it (agentrun.ours): absent from the cluster, or already this release's. What
    `make install` applied stays `make install`'s (it keeps it current, as it does the
    CRDs), so `make install` then `helm install` do not collide."""
    parts = []
    for doc in source.read_text().split("\n---\n"):
        body = "\n".join(line for line in doc.splitlines() if not line.startswith("#"))
        found = yaml.safe_load(body)
        if not found:
            parts.append(doc)
            continue
        ref = (f'(list . "{found["apiVersion"]}" "{found["kind"]}" '
               f'"{found["metadata"]["name"]}")')
        parts.append(f"{{{{ if include \"agentrun.ours\" {ref} -}}}}\n{doc.rstrip()}\n"
                     "{{ end -}}")
    return (_header(source) + "\n---\n".join(parts) + "\n").encode()


def copies() -> dict[Path, bytes]:
    """The chart's copy of every file of crds/: the CRDs in the chart's crds/ (Helm installs
    them once and never upgrades them), the rest as templates, guarded (_guarded)."""
    out = {}
    for source in sorted(CRDS.glob("*.yaml")):
        if source.name.startswith("agentrun.dev_"):
            out[CHART / "crds" / source.name] = _copied(source)
        else:
            out[CHART / "templates" / source.name] = _guarded(source)
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
