"""The Helm chart renders, the real API server accepts every object it renders, and what it
renders keeps the trust boundary: runner pods get no database credential and reach only the
store API; the operator reads Secrets only where it watches. That the chart's admission
policies are those of crds/ is tests/chart/test_chart_sources.py."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from agentrun_devtools.controlplane import ControlPlane
from cryptography import x509

from tests.chart.helm import CHART, NAMESPACE

STORE_URL = f"https://agentrun-store.{NAMESPACE}.svc:8080"
Objects = dict[tuple[str, str, str | None], dict[str, Any]]


def helm(plane: ControlPlane, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(plane.bin / "helm"), *args], capture_output=True, text=True)


def render(plane: ControlPlane, namespace: str = NAMESPACE, *sets: str) -> str:
    done = helm(plane, "template", "agentrun", str(CHART), "--namespace", namespace,
                "--kube-version", "v1.37.2", "--include-crds",
                *[a for s in sets for a in ("--set", s)])
    assert done.returncode == 0, done.stderr
    return done.stdout


def objects(plane: ControlPlane, *sets: str) -> Objects:
    """The rendered objects by (kind, name, namespace)."""
    docs = [d for d in yaml.safe_load_all(render(plane, NAMESPACE, *sets)) if d]
    return {(d["kind"], d["metadata"]["name"], d["metadata"].get("namespace")): d for d in docs}


def container(found: Objects, deployment: str) -> dict[str, Any]:
    spec = found[("Deployment", deployment, NAMESPACE)]["spec"]["template"]["spec"]
    first: dict[str, Any] = spec["containers"][0]
    return first


def test_chart_lints(control_plane: ControlPlane) -> None:
    done = helm(control_plane, "lint", str(CHART), "--namespace", NAMESPACE,
                "--kube-version", "v1.37.2", "--set", "postgres.enabled=true")
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("values", [
    ("postgres.enabled=true", "networkPolicy.enabled=true",
     "runner.allowedImages={registry.example.com/agents/*}"),
    ("database.url=postgresql+psycopg://u@db:5432/agentrun", "operator.namespaces={a,b}",
     "operator.allowScriptedModel=true", "storeApi.replicas=1"),
])
def test_rendered_objects_are_accepted_by_the_api_server(
        crds: ControlPlane, values: tuple[str, ...]) -> None:
    for namespace in (NAMESPACE, "a", "b"):
        crds.kubectl("create", "namespace", namespace, check=False)
    manifest = render(crds, NAMESPACE, *values)
    done = crds.kubectl("apply", "--dry-run=server", "-f", "-", input=manifest, check=False)
    assert done.returncode == 0, done.stderr
    for kind in ("deployment.apps/agentrun-operator", "deployment.apps/agentrun-store",
                 "service/agentrun-store", "clusterrole.rbac.authorization.k8s.io/"
                 "agentrun-replay-forcer", "validatingadmissionpolicy.admissionregistration"
                 ".k8s.io/agentrun-force-replay", "validatingadmissionpolicy."
                 "admissionregistration.k8s.io/agentrun-run-references",
                 "role.rbac.authorization.k8s.io/agentrun-operator-leader",
                 "rolebinding.rbac.authorization.k8s.io/agentrun-operator-leader",
                 "poddisruptionbudget.policy/agentrun-operator"):
        assert kind in done.stdout


def test_chart_refuses_another_namespace_and_a_missing_store(control_plane: ControlPlane) -> None:
    elsewhere = helm(control_plane, "template", "agentrun", str(CHART), "--namespace", "x",
                     "--kube-version", "v1.37.2", "--set", "postgres.enabled=true")
    assert elsewhere.returncode != 0
    assert "install agentrun into the namespace agentrun-system" in elsewhere.stderr
    no_store = helm(control_plane, "template", "agentrun", str(CHART), "--namespace",
                    NAMESPACE, "--kube-version", "v1.37.2")
    assert no_store.returncode != 0
    assert "agentrun needs a durable run store" in no_store.stderr


# -- the store API and the operator ----------------------------------------------------------


def test_the_store_api_speaks_tls_with_a_certificate_of_the_release(
        control_plane: ControlPlane) -> None:
    """The chart's own CA by default: the certificate proves the Service's names and
    chains to ca.crt, which the operator (not the store API's key) is given for runners."""
    from cryptography import x509

    found = objects(control_plane, "postgres.enabled=true")
    secret = found[("Secret", "agentrun-store-tls", NAMESPACE)]
    assert secret["type"] == "kubernetes.io/tls"
    cert = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    ca = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["ca.crt"]))
    cert.verify_directly_issued_by(ca)
    names = cert.extensions.get_extension_for_class(
        x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    assert f"agentrun-store.{NAMESPACE}.svc" in names
    store = container(found, "agentrun-store")
    assert "--tls-cert-file=/var/run/secrets/agentrun.dev/store-tls/tls.crt" in store["args"]
    assert store["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    assert store["livenessProbe"]["httpGet"]["scheme"] == "HTTPS"
    operator = container(found, "agentrun-operator")
    assert "--store-api-ca-file=/var/run/secrets/agentrun.dev/store-ca/ca.crt" in \
        operator["args"]
    volumes = found[("Deployment", "agentrun-operator", NAMESPACE)]["spec"]["template"][
        "spec"]["volumes"]
    store_ca = next(v for v in volumes if v["name"] == "store-ca")
    assert store_ca["secret"]["items"] == [{"key": "ca.crt", "path": "ca.crt"}]
    # cert-manager issues it instead: no Secret of the chart, the same Secret name.
    managed = objects(control_plane, "postgres.enabled=true",
                      "storeApi.certManager.enabled=true")
    assert ("Secret", "agentrun-store-tls", NAMESPACE) not in managed
    certificate = managed[("Certificate", "agentrun-store-tls", NAMESPACE)]["spec"]
    assert certificate["secretName"] == "agentrun-store-tls"
    assert f"agentrun-store.{NAMESPACE}.svc" in certificate["dnsNames"]
    assert certificate["issuerRef"] == {"name": "agentrun-store-ca", "kind": "Issuer"}
    assert managed[("Certificate", "agentrun-store-ca", NAMESPACE)]["spec"]["isCA"] is True


def test_the_store_api_is_its_own_deployment_service_and_rights(
        control_plane: ControlPlane) -> None:
    found = objects(control_plane, "postgres.enabled=true")

    deployment = found[("Deployment", "agentrun-store", NAMESPACE)]
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == "agentrun-store"
    store = container(found, "agentrun-store")
    # Its own image: ADK's session service, which the operator's image does not carry.
    assert store["image"] == "agentrun/store-api:dev"
    assert container(found, "agentrun-operator")["image"] == "agentrun/operator:dev"
    chosen = objects(control_plane, "postgres.enabled=true",
                     "storeApi.image=registry.example.com/agentrun/store-api:1")
    assert container(chosen, "agentrun-store")["image"] == \
        "registry.example.com/agentrun/store-api:1"
    assert store["command"] == ["agentrun-store-api"]
    assert "--listen=0.0.0.0:8080" in store["args"]
    assert "--audience=agentrun.dev/store" in store["args"]
    # Ready at the schema it knows; alive while it serves (waiting for a migration is no
    # reason to restart it).
    assert store["readinessProbe"]["httpGet"]["path"] == "/healthz"
    assert store["livenessProbe"]["httpGet"]["path"] == "/livez"
    assert store["securityContext"] == container(found, "agentrun-operator")["securityContext"]
    assert store["resources"]["limits"]["memory"]
    # It reads the database URL the way the operator does.
    assert [e for e in store["env"] if e["name"] == "DATABASE_URL"] == [
        e for e in container(found, "agentrun-operator")["env"] if e["name"] == "DATABASE_URL"]

    service = found[("Service", "agentrun-store", NAMESPACE)]["spec"]
    assert [(p["name"], p["port"], p["targetPort"]) for p in service["ports"]] == [
        ("store", 8080, "store"), ("transcripts", 443, "transcripts")]
    assert service["selector"] == deployment["spec"]["selector"]["matchLabels"]

    delegator = found[("ClusterRoleBinding", "agentrun-store-auth-delegator", None)]
    assert delegator["roleRef"]["name"] == "system:auth-delegator"
    assert delegator["subjects"] == [
        {"kind": "ServiceAccount", "name": "agentrun-store", "namespace": NAMESPACE}]
    assert found[("ClusterRole", "agentrun-store", None)]["rules"] == STORE_API_RULES


# A runner's token names its pod (its run and attempt); a transcript names its AgentRun.
STORE_API_RULES = [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]},
                   {"apiGroups": ["agentrun.dev"], "resources": ["agentruns"],
                    "verbs": ["get", "list"]}]


@pytest.mark.parametrize("cert_manager", [False, True], ids=["own-ca", "cert-manager"])
def test_the_transcript_api_is_registered_with_the_store_apis_ca(
        control_plane: ControlPlane, cert_manager: bool) -> None:
    found = objects(control_plane, "postgres.enabled=true",
                    f"storeApi.certManager.enabled={str(cert_manager).lower()}")
    store = container(found, "agentrun-store")
    assert "--transcript-listen=0.0.0.0:8443" in store["args"]
    assert {"name": "transcripts", "containerPort": 8443} in store["ports"]
    registered = found[("APIService", "v1alpha1.store.agentrun.dev", None)]
    spec = registered["spec"]
    assert (spec["group"], spec["version"]) == ("store.agentrun.dev", "v1alpha1")
    assert spec["service"] == {"name": "agentrun-store", "namespace": NAMESPACE, "port": 443}
    assert "insecureSkipTLSVerify" not in spec
    if cert_manager:
        assert "caBundle" not in spec
        assert registered["metadata"]["annotations"] == {
            "cert-manager.io/inject-ca-from": f"{NAMESPACE}/agentrun-store-tls"}
        assert found[("Certificate", "agentrun-store-tls", NAMESPACE)]["spec"][
            "secretName"] == "agentrun-store-tls"
    else:
        secret = found[("Secret", "agentrun-store-tls", NAMESPACE)]
        assert spec["caBundle"] == secret["data"]["ca.crt"]
        # The API server verifies the Service's name <service>.<namespace>.svc.
        cert = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
        names = cert.extensions.get_extension_for_class(
            x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
        assert f"agentrun-store.{NAMESPACE}.svc" in names
    reader = found[("RoleBinding", "agentrun-store-authentication-reader", "kube-system")]
    assert reader["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                 "name": "extension-apiserver-authentication-reader"}
    assert reader["subjects"] == [
        {"kind": "ServiceAccount", "name": "agentrun-store", "namespace": NAMESPACE}]


def test_the_operator_sends_runners_to_the_store_api_and_holds_no_runner_secret(
        control_plane: ControlPlane) -> None:
    found = objects(control_plane, "postgres.enabled=true")

    args = container(found, "agentrun-operator")["args"]
    assert "--store-api-listen=" in args
    assert f"--store-api-url={STORE_URL}" in args
    assert "--allow-scripted-model" not in args
    assert not [a for a in args if a.startswith("--database-secret")]
    # No Secret for runners, in any namespace; the database URL is read by two pods only.
    assert not [k for k in found if k[0] == "Secret" and k[1] == "agentrun-store"]
    readers = [k[:2] for k, d in found.items() if {"name": "agentrun-postgres", "key": "url"}
               in _secret_key_refs(d)]
    assert sorted(readers) == [("Deployment", "agentrun-operator"),
                               ("Deployment", "agentrun-store")]

    scripted = objects(control_plane, "postgres.enabled=true", "operator.allowScriptedModel=true")
    assert "--allow-scripted-model" in container(scripted, "agentrun-operator")["args"]
    # Four eyes hold unless the installation says one person may approve their own runs.
    assert "--allow-self-approval" not in args
    alone = objects(control_plane, "postgres.enabled=true", "approval.allowSelfApproval=true")
    assert "--allow-self-approval" in container(alone, "agentrun-operator")["args"]


def test_runner_pods_request_the_chart_runner_resources(control_plane: ControlPlane) -> None:
    """runner.resources reaches the operator, which gives it to every runner pod whose run
    sets no spec.resources (what the scheduler and Kueue's quotas count)."""
    def flag(*sets: str) -> Any:
        args = container(objects(control_plane, "postgres.enabled=true", *sets),
                         "agentrun-operator")["args"]
        [given] = [a for a in args if a.startswith("--runner-resources=")]
        return json.loads(given.split("=", 1)[1])

    assert flag() == {"requests": {"cpu": "100m", "memory": "256Mi"}}
    # A number is a quantity too (the operator reads it as one).
    assert flag("runner.resources.requests.cpu=1", "runner.resources.limits.memory=1Gi") == {
        "requests": {"cpu": 1, "memory": "256Mi"}, "limits": {"memory": "1Gi"}}
    refused = helm(control_plane, "template", "agentrun", str(CHART), "--namespace", NAMESPACE,
                   "--set", "postgres.enabled=true", "--set", "runner.resources.cpu=1")
    assert refused.returncode != 0 and "resources" in refused.stderr


def _env(found: Objects, deployment: str, name: str) -> dict[str, Any]:
    [entry] = [e for e in container(found, deployment)["env"] if e["name"] == name]
    return entry


def test_the_operator_runs_two_replicas_one_elected_by_a_lease(
        control_plane: ControlPlane) -> None:
    found = objects(control_plane, "postgres.enabled=true")

    deployment = found[("Deployment", "agentrun-operator", NAMESPACE)]["spec"]
    assert deployment["replicas"] == 2
    # A new replica starts as a standby; the old leader hands the Lease over as it stops.
    assert deployment["strategy"]["type"] == "RollingUpdate"
    args = container(found, "agentrun-operator")["args"]
    assert f"--leader-election-namespace={NAMESPACE}" in args
    assert "--leader-election-seconds=15" in args
    # The Lease's holderIdentity names the pod.
    assert _env(found, "agentrun-operator", "POD_NAME")["valueFrom"] == {
        "fieldRef": {"fieldPath": "metadata.name"}}
    # A drain leaves one replica running.
    budget = found[("PodDisruptionBudget", "agentrun-operator", NAMESPACE)]["spec"]
    assert budget["minAvailable"] == 1
    assert budget["selector"] == deployment["selector"]
    # The reconciler's own settings, at their defaults.
    for flag in ("--check-interval=300", "--workers=8", "--pod-ttl-after-finished=3600"):
        assert flag in args, flag

    single = objects(control_plane, "postgres.enabled=true", "operator.replicas=1",
                     "operator.leaderElectionSeconds=30", "operator.workers=16",
                     "operator.podTTLAfterFinishedSeconds=-1",
                     "operator.checkIntervalSeconds=60")
    assert single[("Deployment", "agentrun-operator", NAMESPACE)]["spec"]["replicas"] == 1
    assert ("PodDisruptionBudget", "agentrun-operator", NAMESPACE) not in single
    args = container(single, "agentrun-operator")["args"]
    # Still elected: a second replica started by hand (kubectl scale) stands by.
    assert f"--leader-election-namespace={NAMESPACE}" in args
    for flag in ("--leader-election-seconds=30", "--workers=16",
                 "--pod-ttl-after-finished=-1", "--check-interval=60"):
        assert flag in args, flag


def test_the_lease_role_is_the_operators_own_lease_in_the_release_namespace(
        control_plane: ControlPlane) -> None:
    found = objects(control_plane, "postgres.enabled=true")
    role = found[("Role", "agentrun-operator-leader", NAMESPACE)]
    assert role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
         "resourceNames": ["agentrun-operator"], "verbs": ["get", "update"]}]
    binding = found[("RoleBinding", "agentrun-operator-leader", NAMESPACE)]
    assert binding["roleRef"]["name"] == "agentrun-operator-leader"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "agentrun-operator", "namespace": NAMESPACE}]
    # No ClusterRole grants leases.
    assert not [k for k, d in found.items() if k[0] == "ClusterRole" and any(
        "leases" in r.get("resources", []) for r in d.get("rules", []))]


def _secret_key_refs(tree: Any) -> list[Any]:
    """Every secretKeyRef anywhere in a rendered object."""
    if isinstance(tree, dict):
        return [v for k, v in tree.items() if k == "secretKeyRef"] + [
            r for v in tree.values() for r in _secret_key_refs(v)]
    if isinstance(tree, list):
        return [r for v in tree for r in _secret_key_refs(v)]
    return []


def _reads_secrets(role: dict[str, Any]) -> bool:
    return any("secrets" in r.get("resources", []) and "get" in r.get("verbs", [])
               for r in role.get("rules", []))


def _namespaced_resources(plane: ControlPlane) -> set[str]:
    """Every namespaced resource the API server serves (`kubectl api-resources`), by
    plural name, our kinds included."""
    done = plane.kubectl("api-resources", "--namespaced=true", "-o", "name")
    return {line.split(".")[0] for line in done.stdout.split()}


def test_the_operator_reads_secrets_cluster_wide_only_when_it_watches_everything(
        control_plane: ControlPlane) -> None:
    everywhere = objects(control_plane, "postgres.enabled=true")
    # The operator (input files) and the trigger receiver (the Secret a trigger's auth
    # names), and no one else.
    assert {k[1] for k, d in everywhere.items() if k[0] == "ClusterRole" and _reads_secrets(d)
            } == {"agentrun-operator-namespaced", "agentrun-receiver"}

    listed = objects(control_plane, "postgres.enabled=true", "operator.namespaces={team-a,team-b}")
    assert not [k for k, d in listed.items() if k[0] == "ClusterRole" and _reads_secrets(d)]
    for namespace in ("team-a", "team-b"):
        assert _reads_secrets(listed[("Role", "agentrun-operator", namespace)])
        binding = listed[("RoleBinding", "agentrun-operator", namespace)]
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "agentrun-operator", "namespace": NAMESPACE}]
        # The store API reads pods and AgentRuns there, and nowhere else.
        assert listed[("Role", "agentrun-store", namespace)]["rules"] == STORE_API_RULES
    assert ("ClusterRole", "agentrun-store", None) not in listed
    assert "--namespace=team-a" in container(listed, "agentrun-store")["args"]


def test_with_namespaces_no_cluster_role_of_the_release_grants_a_namespaced_resource(
        control_plane: ControlPlane) -> None:
    """operator.namespaces set: each namespaced right the operator and the store API hold
    (runs, pods, ServiceAccounts, Secrets, ConfigMaps, Events...) is a Role in those
    namespaces; the release's ClusterRoles keep only cluster-scoped resources. (The
    ClusterRoles for people, agentrun-edit and the like, are bound per namespace by whoever
    grants them, and auth-delegator is Kubernetes' own.)"""
    namespaced = _namespaced_resources(control_plane)
    assert {"pods", "secrets", "configmaps", "serviceaccounts", "events",
            "agentruns"} <= namespaced  # the list is real
    listed = objects(control_plane, "postgres.enabled=true", "operator.namespaces={team-a,team-b}")
    bound = {d["roleRef"]["name"] for k, d in listed.items() if k[0] == "ClusterRoleBinding"}
    for (kind, name, _), role in listed.items():
        if kind != "ClusterRole" or name not in bound:
            continue
        granted = {r.split("/")[0] for rule in role.get("rules", [])
                   for r in rule.get("resources", [])}
        assert not granted & namespaced, (name, granted & namespaced)
    for namespace in ("team-a", "team-b"):
        rules = listed[("Role", "agentrun-operator", namespace)]["rules"]
        granted = {r for rule in rules for r in rule["resources"]}
        assert {"agentruns", "agentrunreplays", "agentrunschedules", "pods",
                "serviceaccounts", "events", "secrets", "configmaps"} <= granted
    # Without the list, the same rights are one ClusterRole, bound cluster-wide.
    everywhere = objects(control_plane, "postgres.enabled=true")
    rules = everywhere[("ClusterRole", "agentrun-operator-namespaced", None)]["rules"]
    assert rules == listed[("Role", "agentrun-operator", "team-a")]["rules"]


# -- NetworkPolicies -------------------------------------------------------------------------


def test_network_policies_let_only_runners_reach_the_store_and_nothing_else_reach_postgres(
        control_plane: ControlPlane) -> None:
    found = objects(control_plane, "postgres.enabled=true")  # networkPolicy.enabled by default

    postgres = found[("NetworkPolicy", "agentrun-postgres", NAMESPACE)]["spec"]
    [rule] = postgres["ingress"]
    assert rule["ports"] == [{"port": 5432}]
    [peer] = rule["from"]
    assert "namespaceSelector" not in peer  # the release namespace only
    assert {"key": "app.kubernetes.io/component", "operator": "In",
            "values": ["operator", "store-api"]} in peer["podSelector"]["matchExpressions"]

    store = found[("NetworkPolicy", "agentrun-store", NAMESPACE)]["spec"]
    assert store["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "store-api"
    runners = store["ingress"][0]
    assert runners["ports"] == [{"port": 8080}]
    assert runners["from"] == [{"namespaceSelector": {}, "podSelector": {
        "matchExpressions": [{"key": "agentrun.dev/run", "operator": "Exists"}]}}]
    # Anything else that may connect does so on the transcript API's port (the API server,
    # which no selector names; only its front-proxy certificate is served there) and the
    # metrics port only.
    assert store["ingress"][1:] == [{"ports": [{"port": 8443}]}, {"ports": [{"port": 9090}]}]

    operator = found[("NetworkPolicy", "agentrun-operator", NAMESPACE)]["spec"]
    assert operator["ingress"] == [{"ports": [{"port": 9090}]}]

    off = objects(control_plane, "postgres.enabled=true", "networkPolicy.enabled=false")
    assert not [k for k in off if k[0] == "NetworkPolicy"]


# -- the image allow-list --------------------------------------------------------------------

ALLOWED = "runner.allowedImages={registry.example.com/agents/*,tools/runner:1.2}"


def _run(name: str, image: str | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"agent": "support-agent", "input": {"text": "hello"}}
    if image is not None:
        spec["image"] = image
    return {"apiVersion": "agentrun.dev/v1alpha1", "kind": "AgentRun",
            "metadata": {"name": name}, "spec": spec}


def _dry_run(plane: ControlPlane, namespace: str, manifest: dict[str, Any]
             ) -> subprocess.CompletedProcess[str]:
    return plane.kubectl("apply", "--server-side", "--dry-run=server", "-n", namespace,
                         "-f", "-", input=json.dumps(manifest), check=False)


@pytest.fixture
def allow_list(crds: ControlPlane) -> Iterator[ControlPlane]:
    """The chart's allow-list policy, as rendered, in force on the control plane; removed,
    and no longer in force, afterwards (other tests choose their images freely)."""
    found = objects(crds, "postgres.enabled=true", ALLOWED)
    rendered = [found[(kind, "agentrun-allowed-images", None)] for kind in (
        "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")]
    manifest = "---\n".join(yaml.safe_dump(d) for d in rendered)
    crds.kubectl("create", "namespace", "allow-list", check=False)
    crds.kubectl("apply", "-f", "-", input=manifest)
    _until(lambda: "agentrun-allowed-images" in _dry_run(
        crds, "allow-list", _run("probe", "elsewhere/x:1")).stderr, "enforced")
    try:
        yield crds
    finally:
        crds.kubectl("delete", "-f", "-", input=manifest, check=False)
        _until(lambda: _dry_run(crds, "allow-list", _run("probe", "elsewhere/x:1")).returncode
               == 0, "no longer enforced")


def _until(condition: Callable[[], bool], what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"agentrun-allowed-images not {what} in {timeout}s"
        time.sleep(0.5)


def test_without_an_allow_list_no_policy_is_rendered(control_plane: ControlPlane) -> None:
    found = objects(control_plane, "postgres.enabled=true")
    assert ("ValidatingAdmissionPolicy", "agentrun-allowed-images", None) not in found


def test_an_image_outside_the_allow_list_is_refused(allow_list: ControlPlane) -> None:
    done = _dry_run(allow_list, "allow-list", _run("triage-42", "docker.io/someone/runner:1"))

    assert done.returncode != 0
    assert (
        "ValidatingAdmissionPolicy 'agentrun-allowed-images' with binding"
        " 'agentrun-allowed-images' denied request: AgentRun spec.image"
        " docker.io/someone/runner:1 is not one of the runner images this cluster allows"
        " (registry.example.com/agents/*, tools/runner:1.2, agentrun/runner:dev; an entry"
        " ending in * is a prefix); leave spec.image unset for the default runner image, or"
        " ask a cluster admin to add it to the chart value runner.allowedImages"
    ) in done.stderr
    # A prefix is not a substring: the tag must be the listed one exactly.
    assert _dry_run(allow_list, "allow-list", _run("t", "tools/runner:1.20")).returncode != 0


@pytest.mark.parametrize("image", [
    "registry.example.com/agents/support:7", "tools/runner:1.2", "agentrun/runner:dev", None,
], ids=["prefix", "exact", "the-default-runner-image", "no-image"])
def test_an_allowed_image_or_none_is_accepted(allow_list: ControlPlane, image: str | None
                                             ) -> None:
    done = _dry_run(allow_list, "allow-list", _run("triage-42", image))
    assert done.returncode == 0, done.stderr


def _schedule(name: str, image: str | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"agent": "support-agent", "input": {"text": "Triage the queue"}}
    if image is not None:
        spec["image"] = image
    return {"apiVersion": "agentrun.dev/v1alpha1", "kind": "AgentRunSchedule",
            "metadata": {"name": name},
            "spec": {"schedule": "@every 1h", "runTemplate": {"spec": spec}}}


def test_a_schedule_whose_runs_would_run_an_image_outside_the_list_is_refused(
        allow_list: ControlPlane) -> None:
    # The operator creates a schedule's runs (it is exempt): the template is checked
    # when the schedule is written, for whoever writes it.
    done = _dry_run(allow_list, "allow-list", _schedule("nightly", "docker.io/someone/runner:1"))
    assert done.returncode != 0
    assert (
        "denied request: AgentRunSchedule spec.runTemplate.spec.image"
        " docker.io/someone/runner:1 is not one of the runner images this cluster allows"
        " (registry.example.com/agents/*, tools/runner:1.2, agentrun/runner:dev; an entry"
        " ending in * is a prefix); leave spec.runTemplate.spec.image unset for the default"
        " runner image, or ask a cluster admin to add it to the chart value"
        " runner.allowedImages"
    ) in done.stderr
    for image in ("registry.example.com/agents/support:7", None):
        accepted = _dry_run(allow_list, "allow-list", _schedule("nightly", image))
        assert accepted.returncode == 0, accepted.stderr
    # A template changed later to another image is refused the same way.
    allow_list.kubectl("apply", "--server-side", "-n", "allow-list", "-f", "-",
                       input=json.dumps(_schedule("nightly", "tools/runner:1.2")))
    try:
        changed = _dry_run(allow_list, "allow-list", _schedule("nightly", "elsewhere/x:1"))
        assert changed.returncode != 0
        assert "AgentRunSchedule spec.runTemplate.spec.image elsewhere/x:1 is not one" \
            in changed.stderr
    finally:
        allow_list.kubectl("delete", "agentrunschedules.agentrun.dev", "nightly", "-n",
                           "allow-list", check=False)


# -- the cluster's tool policy (toolPolicy) ----------------------------------------------------

TOOL_POLICY = ("toolPolicy[0].name=charge_card", "toolPolicy[0].approval=Required",
               "toolPolicy[1].name=update_crm", "toolPolicy[1].effect=Idempotent")


def test_a_tool_policy_reaches_the_operator_and_admission(control_plane: ControlPlane) -> None:
    found = objects(control_plane, "postgres.enabled=true", *TOOL_POLICY)
    [given] = [a for a in container(found, "agentrun-operator")["args"]
               if a.startswith("--tool-policy=")]
    assert json.loads(given.removeprefix("--tool-policy=")) == [
        {"name": "charge_card", "approval": "Required"},
        {"name": "update_crm", "effect": "Idempotent"}]
    assert ("ValidatingAdmissionPolicy", "agentrun-tool-policy", None) in found
    none = objects(control_plane, "postgres.enabled=true")
    assert not [a for a in container(none, "agentrun-operator")["args"]
                if a.startswith("--tool-policy")]
    assert ("ValidatingAdmissionPolicy", "agentrun-tool-policy", None) not in none


@pytest.fixture
def tool_policy(crds: ControlPlane) -> Iterator[ControlPlane]:
    """The chart's tool-policy admission, as rendered, in force on the control plane;
    removed, and no longer in force, afterwards."""
    found = objects(crds, "postgres.enabled=true", *TOOL_POLICY)
    rendered = [found[(kind, "agentrun-tool-policy", None)] for kind in (
        "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")]
    manifest = "---\n".join(yaml.safe_dump(d) for d in rendered)
    crds.kubectl("create", "namespace", "tool-policy", check=False)
    crds.kubectl("apply", "-f", "-", input=manifest)
    probe = _tools_run("probe", [{"name": "charge_card", "approval": "None"}])
    _until(lambda: "agentrun-tool-policy" in _dry_run(crds, "tool-policy", probe).stderr,
           "enforced")
    try:
        yield crds
    finally:
        crds.kubectl("delete", "-f", "-", input=manifest, check=False)
        _until(lambda: _dry_run(crds, "tool-policy", probe).returncode == 0,
               "no longer enforced")


def _tools_run(name: str, tools: list[dict[str, str]]) -> dict[str, Any]:
    run = _run(name, None)
    run["spec"]["tools"] = tools
    return run


@pytest.mark.parametrize(("kind", "entries", "said"), [
    ("AgentRun", [{"name": "charge_card", "approval": "None"}],
     "AgentRun spec.tools loosens the tool policy of this cluster (the chart value "
     "toolPolicy) for charge_card: the policy says charge_card approval Required"),
    ("AgentRun", [{"name": "lookup", "effect": "ReadOnly"},
                  {"name": "update_crm", "effect": "ReadOnly"}],
     "AgentRun spec.tools loosens the tool policy of this cluster (the chart value "
     "toolPolicy) for update_crm: the policy says update_crm Idempotent"),
    ("AgentRunSchedule", [{"name": "charge_card", "approval": "None"}],
     "AgentRunSchedule spec.runTemplate.spec.tools loosens the tool policy of this cluster"),
    ("Agent", [{"name": "update_crm", "effect": "ReadOnly", "approval": "Required"}],
     "Agent spec.effects loosens the tool policy of this cluster"),
], ids=["a run lifts an approval", "a run names a less strict effect",
        "a schedule's template", "an Agent's effects"])
def test_what_loosens_the_tool_policy_is_refused_at_admission(
        tool_policy: ControlPlane, kind: str, entries: list[dict[str, str]],
        said: str) -> None:
    done = _dry_run(tool_policy, "tool-policy", _with_entries(kind, entries))
    assert done.returncode != 0
    assert said in done.stderr, done.stderr
    assert "never lift an approval or name a less strict effect" in done.stderr


@pytest.mark.parametrize("kind", ["AgentRun", "AgentRunSchedule", "Agent"])
def test_what_tightens_the_tool_policy_or_names_other_tools_is_admitted(
        tool_policy: ControlPlane, kind: str) -> None:
    entries = [{"name": "charge_card", "effect": "Effectful", "approval": "Required"},
               {"name": "update_crm", "effect": "Effectful"},
               {"name": "lookup", "effect": "ReadOnly", "approval": "None"}]
    done = _dry_run(tool_policy, "tool-policy", _with_entries(kind, entries))
    assert done.returncode == 0, done.stderr


def _with_entries(kind: str, entries: list[dict[str, str]]) -> dict[str, Any]:
    if kind == "AgentRun":
        return _tools_run("triage-42", entries)
    if kind == "AgentRunSchedule":
        schedule = _schedule("nightly", None)
        schedule["spec"]["runTemplate"]["spec"]["tools"] = entries
        return schedule
    return {"apiVersion": "agentrun.dev/v1alpha1", "kind": "Agent",
            "metadata": {"name": "triage"},
            "spec": {"instruction": "Look the customer up.", "effects": entries}}


# -- a real install and upgrade ---------------------------------------------------------------


@pytest.fixture(scope="module")
def bare_plane(control_plane: ControlPlane) -> Iterator[ControlPlane]:
    """A control plane of its own: the session's already holds the cluster-scoped objects of
    crds/ (installed by kubectl), which helm refuses to take over. Nothing needs a node: the
    objects only have to exist."""
    plane = ControlPlane(Path(tempfile.mkdtemp(prefix="agentrun-helm-")), bin_dir=control_plane.bin,
                         controller_manager=False, scheduler=False).start()
    try:
        yield plane
    finally:
        plane.stop()


def _helm_on(plane: ControlPlane, *args: str) -> subprocess.CompletedProcess[str]:
    done = helm(plane, *args, "--kubeconfig", str(plane.kubeconfig), "--namespace", NAMESPACE)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def _postgres_secret(plane: ControlPlane) -> dict[str, str]:
    found = json.loads(plane.kubectl("get", "secret", "agentrun-postgres", "-n", NAMESPACE,
                                     "-o", "json").stdout)
    return {k: base64.b64decode(v).decode() for k, v in found["data"].items()}


def test_the_generated_postgres_password_is_kept_across_upgrades_and_reinstalls(
        bare_plane: ControlPlane) -> None:
    _helm_on(bare_plane, "install", "agentrun", str(CHART), "--create-namespace",
             "--set", "postgres.enabled=true")
    first = _postgres_secret(bare_plane)
    assert len(first["password"]) == 32 and first["password"] != "agentrun"
    assert f":{first['password']}@agentrun-postgres.{NAMESPACE}.svc:5432/" in first["url"]

    _helm_on(bare_plane, "upgrade", "agentrun", str(CHART), "--set", "postgres.enabled=true",
             "--set", "storeApi.replicas=3")
    assert _postgres_secret(bare_plane) == first
    assert json.loads(bare_plane.kubectl(
        "get", "deployment", "agentrun-store", "-n", NAMESPACE, "-o", "json").stdout
    )["spec"]["replicas"] == 3

    # The data volume outlives an uninstall; so does the password that opens it.
    _helm_on(bare_plane, "uninstall", "agentrun", "--wait")
    assert _postgres_secret(bare_plane) == first
    _helm_on(bare_plane, "install", "agentrun", str(CHART), "--set", "postgres.enabled=true")
    assert _postgres_secret(bare_plane) == first

    _helm_on(bare_plane, "uninstall", "agentrun", "--wait")
    bare_plane.kubectl("delete", "secret", "agentrun-postgres", "agentrun-input-digest-key",
                       "-n", NAMESPACE)


def _input_digest_key(plane: ControlPlane) -> str:
    return str(json.loads(plane.kubectl(
        "get", "secret", "agentrun-input-digest-key", "-n", NAMESPACE, "-o", "json").stdout
    )["data"]["key"])


def test_the_input_digest_key_and_store_certificate_are_kept_across_upgrades(
        bare_plane: ControlPlane) -> None:
    _helm_on(bare_plane, "install", "agentrun", str(CHART), "--create-namespace",
             "--set", "postgres.enabled=true")
    first = _input_digest_key(bare_plane)
    assert len(base64.b64decode(first)) == 48
    deployment = json.loads(bare_plane.kubectl(
        "get", "deployment", "agentrun-operator", "-n", NAMESPACE, "-o", "json").stdout)
    pod = deployment["spec"]["template"]["spec"]
    assert {"name": "input-digest-key", "secret": {
        "secretName": "agentrun-input-digest-key", "defaultMode": 0o400}} in pod["volumes"]
    assert "--input-digest-key-file=/var/run/secrets/agentrun.dev/input-digest/key" in \
        pod["containers"][0]["args"]
    serving = json.loads(bare_plane.kubectl(
        "get", "secret", "agentrun-store-tls", "-n", NAMESPACE, "-o", "json").stdout)["data"]
    _helm_on(bare_plane, "upgrade", "agentrun", str(CHART), "--set", "postgres.enabled=true")
    assert _input_digest_key(bare_plane) == first
    # So is the store API's certificate (runners of running pods hold its CA).
    assert json.loads(bare_plane.kubectl(
        "get", "secret", "agentrun-store-tls", "-n", NAMESPACE, "-o", "json").stdout
    )["data"] == serving
    _helm_on(bare_plane, "uninstall", "agentrun", "--wait")
    assert _input_digest_key(bare_plane) == first
    _helm_on(bare_plane, "install", "agentrun", str(CHART), "--set", "postgres.enabled=true")
    assert _input_digest_key(bare_plane) == first
    _helm_on(bare_plane, "uninstall", "agentrun", "--wait")
    for secret in ("agentrun-postgres", "agentrun-input-digest-key"):
        bare_plane.kubectl("delete", "secret", secret, "-n", NAMESPACE, "--ignore-not-found")


# -- the operator's rights, as the API server's authorizer sees them ---------------------------

OPERATOR_SA = f"system:serviceaccount:{NAMESPACE}:agentrun-operator"
# What the operator's code calls, as `kubectl auth can-i` arguments (beside -n/-A), and
# whether the chart must allow it. "tenant" is any namespace runs live in.
OPERATOR_RIGHTS: list[tuple[tuple[str, ...], bool]] = [
    (("create", "events", "-n", "tenant"), True),
    (("create", "events.events.k8s.io", "-n", "tenant"), True),
    (("get", "leases.coordination.k8s.io/agentrun-operator", "-n", NAMESPACE), True),
    (("update", "leases.coordination.k8s.io/agentrun-operator", "-n", NAMESPACE), True),
    (("create", "leases.coordination.k8s.io", "-n", NAMESPACE), True),
    # The Lease and nothing else: not another one, not elsewhere.
    (("update", "leases.coordination.k8s.io/someone-else", "-n", NAMESPACE), False),
    (("get", "leases.coordination.k8s.io/agentrun-operator", "-n", "tenant"), False),
    (("create", "leases.coordination.k8s.io", "-n", "tenant"), False),
    (("list", "pods", "-A"), True),
    (("watch", "pods", "-A"), True),
    (("create", "pods", "-n", "tenant"), True),  # also its start-up dry run
    (("delete", "pods", "-n", "tenant"), True),
    (("get", "nodes"), True),
    (("list", "nodes"), True),
    (("watch", "nodes"), True),
    (("create", "serviceaccounts", "-n", "tenant"), True),
    (("get", "serviceaccounts", "-n", "tenant"), True),
    (("list", "agentruns.agentrun.dev", "-A"), True),
    (("watch", "agentruns.agentrun.dev", "-A"), True),
    # patch: the finalizer; a replaced run's agentrun.dev/cancel (Replace).
    (("patch", "agentruns.agentrun.dev", "-n", "tenant"), True),
    (("create", "agentruns.agentrun.dev", "-n", "tenant"), True),  # replay runs, dry run
    (("update", "agentruns.agentrun.dev", "--subresource=status", "-n", "tenant"), True),
    (("update", "agentrunreplays.agentrun.dev", "--subresource=status", "-n", "tenant"),
     True),
    (("patch", "agentrunreplays.agentrun.dev", "--subresource=status", "-n", "tenant"),
     True),
    (("watch", "agentrunreplays.agentrun.dev", "-A"), True),
    (("list", "agentrunschedules.agentrun.dev", "-A"), True),
    (("watch", "agentrunschedules.agentrun.dev", "-A"), True),
    (("update", "agentrunschedules.agentrun.dev", "--subresource=status", "-n", "tenant"),
     True),
    # A schedule's settled runs beyond its history limits; a settled run past its time to
    # live, with its replays and approvals (ttl.py).
    (("delete", "agentruns.agentrun.dev", "-n", "tenant"), True),
    (("delete", "agentrunreplays.agentrun.dev", "-n", "tenant"), True),
    (("delete", "agentrunapprovals.agentrun.dev", "-n", "tenant"), True),
    (("get", "secrets", "-n", "tenant"), True),  # input files (operator.namespaces empty)
    (("get", "configmaps", "-n", "tenant"), True),
    # Approvals: watched, their verdict written; never created (people decide).
    (("watch", "agentrunapprovals.agentrun.dev", "-A"), True),
    (("update", "agentrunapprovals.agentrun.dev", "--subresource=status", "-n", "tenant"),
     True),
    (("create", "agentrunapprovals.agentrun.dev", "-n", "tenant"), False),
    # A replay is decided for its requester (replay.py asks the authorizer about them).
    (("create", "subjectaccessreviews.authorization.k8s.io"), True),
    # The CRD that says whether Kueue is installed (workloads.py).
    (("get", "customresourcedefinitions.apiextensions.k8s.io/workloads.kueue.x-k8s.io"),
     True),
    # Nothing it does not need.
    (("delete", "agentrunschedules.agentrun.dev", "-n", "tenant"), False),
    (("list", "secrets", "-n", "tenant"), False),
    (("delete", "nodes"), False),
]


# Kueue's Workloads: why a run's attempt waits in its queue (workloads.py). Kueue is not
# installed here, and `kubectl auth can-i` answers "no" for a kind the server does not
# serve, so these are asked of the authorizer directly: (verb, namespace or "", allowed).
KUEUE_RIGHTS: list[tuple[str, str, bool]] = [
    ("list", "", True), ("watch", "", True), ("get", "tenant", True),
    ("update", "tenant", False), ("delete", "tenant", False),
]


def _may_workloads(plane: ControlPlane, verb: str, namespace: str) -> bool:
    review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
              "spec": {"user": OPERATOR_SA, "groups": ["system:serviceaccounts",
                                                       f"system:serviceaccounts:{NAMESPACE}"],
                       "resourceAttributes": {"verb": verb, "group": "kueue.x-k8s.io",
                                              "resource": "workloads",
                                              "namespace": namespace}}}
    done = plane.kubectl("create", "-f", "-", "-o", "json", input=json.dumps(review))
    return bool(json.loads(done.stdout)["status"].get("allowed"))


def _can_i(plane: ControlPlane, *args: str) -> bool:
    done = plane.kubectl("auth", "can-i", *args, f"--as={OPERATOR_SA}", check=False)
    return done.stdout.strip() == "yes"


@pytest.fixture
def installed(bare_plane: ControlPlane) -> Iterator[ControlPlane]:
    """The chart installed for real (helm install) on the control plane of its own,
    uninstalled afterwards."""
    _helm_on(bare_plane, "install", "agentrun", str(CHART), "--create-namespace",
             "--set", "postgres.enabled=true")
    try:
        yield bare_plane
    finally:
        _helm_on(bare_plane, "uninstall", "agentrun", "--wait")
        bare_plane.kubectl("delete", "secret", "agentrun-postgres",
                           "agentrun-input-digest-key", "-n", NAMESPACE, "--ignore-not-found")


def test_the_installed_chart_lets_the_operator_do_what_its_code_calls(
        installed: ControlPlane) -> None:
    # The authorizer sees new bindings a moment after they are written.
    deadline = time.monotonic() + 60
    while not _can_i(installed, "create", "leases.coordination.k8s.io", "-n", NAMESPACE):
        assert time.monotonic() < deadline, "the operator's Lease Role not in force in 60s"
        time.sleep(0.5)
    wrong = [" ".join(args) + (" is refused" if allowed else " is allowed")
             for args, allowed in OPERATOR_RIGHTS if _can_i(installed, *args) != allowed]
    wrong += [f"{verb} workloads.kueue.x-k8s.io in {namespace or 'all namespaces'}"
              + (" is refused" if allowed else " is allowed")
              for verb, namespace, allowed in KUEUE_RIGHTS
              if _may_workloads(installed, verb, namespace) != allowed]
    assert not wrong, f"{OPERATOR_SA}: " + "; ".join(wrong)
    # The Deployment as installed: two replicas (no pods here: nothing schedules them).
    deployment = json.loads(installed.kubectl(
        "get", "deployment", "agentrun-operator", "-n", NAMESPACE, "-o", "json").stdout)
    assert deployment["spec"]["replicas"] == 2


def test_the_notes_warn_when_only_the_operator_image_is_changed(
        control_plane: ControlPlane) -> None:
    # An install from a private registry that predates the store API's own image sets
    # operator.image only: its store API would then pull a default it cannot reach.
    def notes(*sets: str) -> str:
        done = subprocess.run(
            [str(control_plane.bin / "helm"), "install", "agentrun", str(CHART),
             # A dry run changes nothing; --take-ownership only skips the check against
             # the ClusterRoles other tests applied on this shared control plane.
             "--namespace", NAMESPACE, "--dry-run=client", "--take-ownership",
             "--set", "postgres.enabled=true",
             *[a for s in sets for a in ("--set", s)]],
            capture_output=True, text=True,
            env={**os.environ, "KUBECONFIG": str(control_plane.kubeconfig)})
        assert done.returncode == 0, done.stderr
        return done.stdout.split("\nNOTES:\n", 1)[1]

    private = "operator.image=registry.example.com/agentrun/operator:1"
    warned = notes(private)
    assert "WARNING: operator.image is registry.example.com/agentrun/operator:1" in warned
    assert "set storeApi.image" in warned
    assert "WARNING" not in notes(private,
                                  "storeApi.image=registry.example.com/agentrun/store-api:1")
    assert "WARNING" not in notes()


def _with_namespaces(rights: list[tuple[tuple[str, ...], bool]], watched: str,
                     other: str) -> list[tuple[tuple[str, ...], bool]]:
    """OPERATOR_RIGHTS for an operator limited to namespace `watched`: each namespaced
    right holds there, and in no other namespace, nor across all of them."""
    limited: list[tuple[tuple[str, ...], bool]] = []
    for args, allowed in rights:
        if "-n" in args and args[args.index("-n") + 1] == "tenant":
            limited.append((tuple(watched if a == "tenant" else a for a in args), allowed))
            limited.append((tuple(other if a == "tenant" else a for a in args), False))
        elif "-A" in args:
            limited.append((args, False))
            limited.append(((*[a for a in args if a != "-A"], "-n", watched), allowed))
        else:
            limited.append((args, allowed))
    return limited


def test_with_namespaces_the_installed_chart_grants_the_operator_rights_there_only(
        bare_plane: ControlPlane) -> None:
    for namespace in ("team-a", "team-b"):
        bare_plane.kubectl("create", "namespace", namespace, check=False)
    _helm_on(bare_plane, "install", "agentrun", str(CHART), "--create-namespace",
             "--set", "postgres.enabled=true", "--set", "operator.namespaces={team-a}")
    try:
        deadline = time.monotonic() + 60
        while not _can_i(bare_plane, "create", "pods", "-n", "team-a"):
            assert time.monotonic() < deadline, "the operator's Role not in force in 60s"
            time.sleep(0.5)
        wrong = [" ".join(args) + (" is refused" if allowed else " is allowed")
                 for args, allowed in _with_namespaces(OPERATOR_RIGHTS, "team-a", "team-b")
                 if _can_i(bare_plane, *args) != allowed]
        assert not wrong, f"{OPERATOR_SA}: " + "; ".join(wrong)
    finally:
        _helm_on(bare_plane, "uninstall", "agentrun", "--wait")
        bare_plane.kubectl("delete", "secret", "agentrun-postgres",
                           "agentrun-input-digest-key", "-n", NAMESPACE, "--ignore-not-found")
