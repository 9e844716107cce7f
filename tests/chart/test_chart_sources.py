"""Chart hygiene: the chart's copies of crds/ and its argocd-cm patch are what `make
chart-crds` makes (no drift, no symlinks); values.schema.json describes every value of
values.yaml and makes Helm refuse a wrong one; the chart names the operator's identity the
way the admission policies exempt it."""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from agentrun_devtools import chart_sources
from agentrun_devtools.controlplane import REPO, ControlPlane

from tests.chart.helm import ARGS, CHART, NAMESPACE, helm
from tests.harness import delete_namespace

# -- generated files -------------------------------------------------------------------------


@pytest.mark.parametrize("path", sorted(chart_sources.generated()),
                         ids=lambda p: str(p.relative_to(REPO)))
def test_generated_file_is_up_to_date(path: Path) -> None:
    name = path.relative_to(REPO)
    assert not path.is_symlink(), f"{name} is a symlink; run `{chart_sources.COMMAND}`"
    assert path.exists(), f"{name} is missing; run `{chart_sources.COMMAND}`"
    assert path.read_bytes() == chart_sources.generated()[path], (
        f"{name} differs from its source; run `{chart_sources.COMMAND}` (and edit the "
        "source, never the copy)")


def test_every_file_of_crds_is_in_the_chart_under_its_name() -> None:
    shipped = {p.name for p in chart_sources.copies()}
    assert shipped == {p.name for p in (REPO / "crds").glob("*.yaml")}
    assert {p.parent.name for p in chart_sources.copies() if p.name.startswith("agentrun.dev_")
            } == {"crds"}


def test_the_argocd_patch_carries_each_health_check_exactly() -> None:
    data = yaml.safe_load(chart_sources.ARGOCD_PATCH.read_text())["data"]
    scripts = sorted(chart_sources.ARGOCD.glob("agentrun.dev/*/health.lua"))
    assert {p.parent.name for p in scripts} >= {"AgentRun", "AgentRunReplay", "AgentRunSchedule"}
    assert data == {f"resource.customizations.health.agentrun.dev_{p.parent.name}": p.read_text()
                    for p in scripts}


def test_the_argocd_patch_applies_to_an_argocd_cm(control_plane: ControlPlane) -> None:
    """As docs/gitops.md says to apply it, on a real API server."""
    namespace = f"argocd-{uuid.uuid4().hex[:6]}"
    control_plane.kubectl("create", "namespace", namespace)
    try:
        control_plane.kubectl("create", "configmap", "argocd-cm", "-n", namespace,
                              "--from-literal=url=https://argocd.example.com")
        control_plane.kubectl("patch", "configmap", "argocd-cm", "-n", namespace,
                              "--type", "merge", "--patch-file", str(chart_sources.ARGOCD_PATCH))
        found = json.loads(control_plane.kubectl(
            "get", "configmap", "argocd-cm", "-n", namespace, "-o", "json").stdout)["data"]
        expected = yaml.safe_load(chart_sources.ARGOCD_PATCH.read_text())["data"]
        assert found == {"url": "https://argocd.example.com", **expected}
    finally:
        delete_namespace(control_plane, namespace)


# -- values.schema.json ----------------------------------------------------------------------


def _schema() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((CHART / "values.schema.json").read_text())
    return loaded


def _leaves(values: dict[str, Any], prefix: str = "") -> set[str]:
    """The dotted paths of values.yaml down to where the schema stops (resources are one
    value: a container's resources)."""
    out = set()
    for key, value in values.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value and key != "resources":  # {}: a map value
            out |= _leaves(value, path + ".")
        else:
            out.add(path)
    return out


def _described(schema: dict[str, Any], prefix: str = "") -> set[str]:
    out = set()
    for key, sub in schema.get("properties", {}).items():
        path = f"{prefix}{key}"
        out |= _described(sub, path + ".") if sub.get("type") == "object" and \
            "properties" in sub and key != "resources" else {path}
    return out


def test_the_schema_describes_every_value_and_nothing_else() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert _described(_schema()) == _leaves(values)


def test_helm_lint_and_template_accept_the_defaults() -> None:
    # The defaults and the one choice a user must make (a run store).
    lint = helm("lint", str(CHART), *ARGS, "--set", "postgres.enabled=true")
    assert lint.returncode == 0, lint.stdout + lint.stderr
    assert "symbolic link" not in lint.stderr
    rendered = helm("template", "agentrun", str(CHART), *ARGS, "--set", "postgres.enabled=true")
    assert rendered.returncode == 0, rendered.stderr


@pytest.mark.parametrize("values", [
    ("operator.replicas=1", "operator.namespaces={team-a,team-b}", "storeApi.replicas=3",
     "operator.podTTLAfterFinishedSeconds=-1", "operator.imagePullPolicy=Always",
     "runner.allowedImages={registry.example.com/agents/*}", "metrics.enabled=false",
     "database.url=postgresql+psycopg://u@db:5432/agentrun", "postgres.storage=10Gi",
     "operator.resources.limits.cpu=2"),
    ("database.existingSecret=db", "database.existingSecretKey=dsn",
     "networkPolicy.enabled=false", "operator.allowScriptedModel=true",
     "approval.allowSelfApproval=true"),
], ids=["many", "existing-secret"])
def test_the_schema_accepts_what_the_chart_documents(values: tuple[str, ...]) -> None:
    done = helm("template", "agentrun", str(CHART), *ARGS, "--set", "postgres.enabled=true",
                *[a for v in values for a in ("--set", v)])
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(("value", "said"), [
    ("operator.replicas=two", "at '/operator/replicas': got string, want integer"),
    ("operator.replicas=0", "at '/operator/replicas': minimum: got 0, want 1"),
    ("postgres.enabled=yes", "at '/postgres/enabled': got string, want boolean"),
    ("operator.imagePullPolicy=Sometimes", "at '/operator/imagePullPolicy'"),
    ("operator.namespaces=team-a", "at '/operator/namespaces': got string, want array"),
    ("operator.namespaces={Team_A}", "at '/operator/namespaces/0'"),
    ("metrics.port=70000", "at '/metrics/port': maximum"),
    ("oprator.replicas=2", "additional properties 'oprator' not allowed"),
    ("operator.replica=2", "additional properties 'replica' not allowed"),
    ("operator.resources.request.cpu=1", "additional properties 'request' not allowed"),
], ids=lambda v: v.split("=")[0] if "=" in v else "")
def test_helm_refuses_a_wrong_value_naming_it(value: str, said: str) -> None:
    for command in ("template", "lint"):
        args = ["template", "agentrun"] if command == "template" else ["lint"]
        done = helm(*args, str(CHART), *ARGS, "--set", "postgres.enabled=true",
                    "--set", value)
        assert done.returncode != 0, f"helm {command} accepted {value}"
        assert said in done.stdout + done.stderr, done.stdout + done.stderr


# -- the operator's identity -----------------------------------------------------------------

OPERATOR_SA = f"system:serviceaccount:{NAMESPACE}:agentrun-operator"
RECEIVER_SA = f"system:serviceaccount:{NAMESPACE}:agentrun-receiver"


def test_every_place_names_the_operator_as_the_policies_exempt_it() -> None:
    rendered = helm("template", "agentrun", str(CHART), *ARGS, "--set", "postgres.enabled=true",
                    "--set", "runner.allowedImages={a/*}", "--set", "operator.namespaces={a}")
    assert rendered.returncode == 0, rendered.stderr
    docs = [d for d in yaml.safe_load_all(rendered.stdout) if d]
    [deployment] = [d for d in docs if d["kind"] == "Deployment"
                    and d["metadata"]["name"] == "agentrun-operator"]
    account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    identity = f"system:serviceaccount:{NAMESPACE}:{account}"
    assert identity == OPERATOR_SA
    assert ("ServiceAccount", account, NAMESPACE) in {
        (d["kind"], d["metadata"]["name"], d["metadata"].get("namespace")) for d in docs}
    # Every binding of an operator role names that ServiceAccount.
    bindings = [d for d in docs if d["kind"] in ("RoleBinding", "ClusterRoleBinding")
                and d["roleRef"]["name"].startswith("agentrun-operator")]
    assert len(bindings) == 3, [b["metadata"]["name"] for b in bindings]
    for binding in bindings:
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}], binding
    # Every admission policy that exempts the operator exempts that identity.
    policies = [d for d in docs if d["kind"] in ("ValidatingAdmissionPolicy",
                                                  "MutatingAdmissionPolicy")]
    exempted = {(p["kind"], p["metadata"]["name"]): set(re.findall(
        r"system:serviceaccount:[^'\"]+", json.dumps(p))) for p in policies}
    assert {name for name, found in exempted.items() if found} == {
        ("ValidatingAdmissionPolicy", "agentrun-replay-of"),
        ("ValidatingAdmissionPolicy", "agentrun-run-references"),
        ("ValidatingAdmissionPolicy", "agentrun-allowed-images"),
        # Who created a run: the operator writes it itself on the runs it creates.
        ("ValidatingAdmissionPolicy", "agentrun-run-creator"),
        ("MutatingAdmissionPolicy", "agentrun-run-creator")}
    # The trigger receiver is exempt beside it, by its own name (test_receiver_chart.py).
    assert all(found <= {identity, RECEIVER_SA} for found in exempted.values()), exempted


# -- the Kubernetes version the chart needs ------------------------------------------------

# The first Kubernetes release that serves each admission kind the chart renders as
# admissionregistration.k8s.io/v1 (GA): ValidatingAdmissionPolicy 1.30 (KEP-3488),
# MutatingAdmissionPolicy 1.36 (KEP-3962).
ADMISSION_V1_SINCE = {"ValidatingAdmissionPolicy": (1, 30),
                      "ValidatingAdmissionPolicyBinding": (1, 30),
                      "MutatingAdmissionPolicy": (1, 36),
                      "MutatingAdmissionPolicyBinding": (1, 36)}


def test_the_charts_kube_version_serves_every_admission_policy_it_renders() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    floor = re.fullmatch(r">=\s*(\d+)\.(\d+)\.\d+(-0)?", chart["kubeVersion"])
    assert floor, chart["kubeVersion"]
    # Every optional policy on (the allow-list, the tool policy), so that all are counted.
    rendered = helm("template", "agentrun", str(CHART), *ARGS, "--set", "postgres.enabled=true",
                    "--set", "runner.allowedImages={registry.example.com/agents/*}",
                    "--set", "toolPolicy[0].name=x", "--set", "toolPolicy[0].approval=Required")
    assert rendered.returncode == 0, rendered.stderr
    kinds = {(d["apiVersion"], d["kind"]) for d in yaml.safe_load_all(rendered.stdout)
             if d and d["apiVersion"].startswith("admissionregistration.k8s.io/")}
    assert ("admissionregistration.k8s.io/v1", "MutatingAdmissionPolicy") in kinds
    assert {v for v, _ in kinds} == {"admissionregistration.k8s.io/v1"}
    needed = max(ADMISSION_V1_SINCE[k] for _, k in kinds if k in ADMISSION_V1_SINCE)
    assert (int(floor.group(1)), int(floor.group(2))) >= needed
    # Helm refuses a cluster older than that, saying why.
    older = helm("template", "agentrun", str(CHART), "--namespace", NAMESPACE,
                 "--kube-version", "v1.35.4", "--set", "postgres.enabled=true")
    assert older.returncode != 0 and "kubeVersion" in older.stderr, older.stderr
