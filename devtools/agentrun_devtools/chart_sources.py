"""The chart's files that are made from others (`make chart-crds`): crds/ stays the one
source of the CRDs, admission policies and ClusterRoles (`make install` applies it), and
the chart ships copies of them; the Argo CD health checks are written once, as Lua files
in Argo CD's own layout, and the argocd-cm patch is made from them. In crds/ itself, the
runTemplate.spec of an AgentRunSchedule and of an AgentRunTrigger is the AgentRun spec,
made from the AgentRun CRD.

`python -m agentrun_devtools.chart_sources` writes them; tests/chart/test_chart_sources.py
fails when a file on disk differs from what this would write.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

import yaml

from agentrun_devtools.controlplane import REPO

CRDS = REPO / "crds"
CHART = REPO / "charts" / "agentrun"
ARGOCD = CHART / "argocd"
ARGOCD_PATCH = ARGOCD / "argocd-cm-patch.yaml"
COMMAND = "make chart-crds"
RUN_CRD = CRDS / "agentrun.dev_agentruns.yaml"
SCHEDULE_CRD = CRDS / "agentrun.dev_agentrunschedules.yaml"
TRIGGER_CRD = CRDS / "agentrun.dev_agentruntriggers.yaml"
# The kinds whose spec.runTemplate.spec is an AgentRun spec.
TEMPLATED_CRDS = (SCHEDULE_CRD, TRIGGER_CRD)
_BEGIN = "# BEGIN the AgentRun spec"
_END = "# END the AgentRun spec"


def template_spec() -> dict[str, Any]:
    """The AgentRun spec's schema as a schedule's or a trigger's runTemplate.spec: the same
    fields and rules, less what makes a run's spec a record (it is immutable) and trigger's
    default (a schedule's runs are trigger schedule, a trigger's event; the template's own
    rule refuses any other)."""
    crd = yaml.safe_load(RUN_CRD.read_text())
    spec: dict[str, Any] = copy.deepcopy(
        crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"])
    spec["description"] = ("The spec of each run: an AgentRun spec, with the AgentRun "
                           "spec's rules (it may change: each run takes it as it is then).")
    spec["x-kubernetes-validations"] = [r for r in spec.get("x-kubernetes-validations", [])
                                        if r.get("rule") != "self == oldSelf"]
    spec["properties"]["trigger"].pop("default", None)
    return spec


def templated_crd(path: Path) -> bytes:
    """A CRD of TEMPLATED_CRDS with the AgentRun spec between its marks."""
    lines = path.read_text().splitlines()
    begin = next(i for i, line in enumerate(lines) if line.strip().startswith(_BEGIN))
    end = next(i for i, line in enumerate(lines) if line.strip() == _END)
    indent = " " * (len(lines[begin]) - len(lines[begin].lstrip()))
    dumped = yaml.safe_dump({"spec": template_spec()}, sort_keys=False, width=88,
                            allow_unicode=True)
    block = [f"{indent}{line}" if line else "" for line in dumped.splitlines()]
    header = [line for line in lines[begin:end] if line.strip().startswith("#")]
    return ("\n".join([*lines[:begin], *header, *block, *lines[end:]]) + "\n").encode()


def sources() -> dict[Path, bytes]:
    """crds/ as `make install` applies it: every file as it is, the schedule's and the
    trigger's CRDs with their runTemplate.spec made from the AgentRun CRD."""
    return {p: templated_crd(p) if p in TEMPLATED_CRDS else p.read_bytes()
            for p in sorted(CRDS.glob("*.yaml"))}


def _header(source: Path) -> str:
    return (f"# Generated from crds/{source.name} by `{COMMAND}`: edit that file, not "
            "this copy.\n")


def _copied(source: Path, content: bytes) -> bytes:
    return _header(source).encode() + content


def _guarded(source: Path, content: bytes) -> bytes:
    """A template of `source` in which each object is rendered only when the release may
    own it (agentrun.ours): absent from the cluster, or already this release's. What
    `make install` applied stays `make install`'s (it keeps it current, as it does the
    CRDs), so `make install` then `helm install` do not collide."""
    parts = []
    for doc in content.decode().split("\n---\n"):
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
    for source, content in sources().items():
        if source.name.startswith("agentrun.dev_"):
            out[CHART / "crds" / source.name] = _copied(source, content)
        else:
            out[CHART / "templates" / source.name] = _guarded(source, content)
    return out


def argocd_patch() -> bytes:
    """A merge patch of Argo CD's argocd-cm carrying every health check, under the keys
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
    return {**{p: templated_crd(p) for p in TEMPLATED_CRDS}, **copies(),
            ARGOCD_PATCH: argocd_patch()}


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
