"""The chart's trigger receiver: its own Deployment, ServiceAccount, rights, Service,
NetworkPolicy and TLS pair; the operator told where it is (status.url); the admission
policies exempting it by the name it runs as; and runner.allowedImages applied to a
trigger's template on the real API server (its runs are the receiver's, exempt)."""

from __future__ import annotations

import base64
import json
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from agentrun_devtools.controlplane import ControlPlane
from cryptography import x509

from tests.chart.helm import ARGS, CHART, NAMESPACE, helm
from tests.triggers import trigger_manifest

Objects = dict[tuple[str, str, str | None], dict[str, Any]]
RECEIVER_SA = f"system:serviceaccount:{NAMESPACE}:agentrun-receiver"
# A trigger and its Secret, read; its counters added to; a run and its event's ConfigMap
# created, the ConfigMap handed to the run. No list, no pods, no store.
RECEIVER_RULES = [
    {"apiGroups": ["agentrun.dev"], "resources": ["agentruntriggers"], "verbs": ["get"]},
    {"apiGroups": ["agentrun.dev"], "resources": ["agentruntriggers/status"],
     "verbs": ["get", "patch"]},
    {"apiGroups": ["agentrun.dev"], "resources": ["agentruns"], "verbs": ["get", "create"]},
    {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "create", "patch"]},
    {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]},
]


def objects(*sets: str) -> Objects:
    done = helm("template", "agentrun", str(CHART), *ARGS, "--set", "postgres.enabled=true",
                *[a for s in sets for a in ("--set", s)])
    assert done.returncode == 0, done.stderr
    docs = [d for d in yaml.safe_load_all(done.stdout) if d]
    return {(d["kind"], d["metadata"]["name"], d["metadata"].get("namespace")): d for d in docs}


def container(found: Objects, deployment: str) -> dict[str, Any]:
    first: dict[str, Any] = found[("Deployment", deployment, NAMESPACE)]["spec"]["template"][
        "spec"]["containers"][0]
    return first


def test_the_receiver_is_its_own_deployment_service_and_rights() -> None:
    found = objects()
    deployment = found[("Deployment", "agentrun-receiver", NAMESPACE)]
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "agentrun-receiver"
    assert ("ServiceAccount", "agentrun-receiver", NAMESPACE) in found
    receiver = container(found, "agentrun-receiver")
    assert (receiver["image"], receiver["command"]) == ("agentrun/receiver:dev",
                                                        ["agentrun-receiver"])
    assert "--listen=0.0.0.0:8443" in receiver["args"]
    assert receiver["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "deliveries",
                                                     "scheme": "HTTPS"}
    assert receiver["securityContext"] == container(found, "agentrun-operator")[
        "securityContext"]
    # No store credential of any kind.
    assert "env" not in receiver
    assert not [v for v in pod["volumes"] if "store" in json.dumps(v)]
    chosen = objects("receiver.image=registry.example.com/agentrun/receiver:1")
    assert container(chosen, "agentrun-receiver")["image"] == \
        "registry.example.com/agentrun/receiver:1"
    service = found[("Service", "agentrun-receiver", NAMESPACE)]["spec"]
    assert [(p["port"], p["targetPort"]) for p in service["ports"]] == [(443, "deliveries")]
    assert service["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert found[("ClusterRole", "agentrun-receiver", None)]["rules"] == RECEIVER_RULES
    binding = found[("ClusterRoleBinding", "agentrun-receiver", None)]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "agentrun-receiver",
                                    "namespace": NAMESPACE}]


def test_with_namespaces_the_receiver_has_rights_there_only() -> None:
    listed = objects("operator.namespaces={team-a,team-b}")
    assert ("ClusterRole", "agentrun-receiver", None) not in listed
    for namespace in ("team-a", "team-b"):
        assert listed[("Role", "agentrun-receiver", namespace)]["rules"] == RECEIVER_RULES
        assert listed[("RoleBinding", "agentrun-receiver", namespace)]["subjects"] == [
            {"kind": "ServiceAccount", "name": "agentrun-receiver", "namespace": NAMESPACE}]


@pytest.mark.parametrize("cert_manager", [False, True], ids=["own-ca", "cert-manager"])
def test_the_receiver_speaks_tls_with_a_certificate_of_the_release(cert_manager: bool) -> None:
    found = objects(f"receiver.certManager.enabled={str(cert_manager).lower()}")
    name = f"agentrun-receiver.{NAMESPACE}.svc"
    if cert_manager:
        assert ("Secret", "agentrun-receiver-tls", NAMESPACE) not in found
        certificate = found[("Certificate", "agentrun-receiver-tls", NAMESPACE)]["spec"]
        assert name in certificate["dnsNames"]
        assert certificate["secretName"] == "agentrun-receiver-tls"
    else:
        secret = found[("Secret", "agentrun-receiver-tls", NAMESPACE)]
        cert = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
        ca = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["ca.crt"]))
        cert.verify_directly_issued_by(ca)
        assert name in cert.extensions.get_extension_for_class(
            x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
        # Its own CA, not the store API's: whoever verifies deliveries' endpoint is given
        # nothing of the store's.
        store = found[("Secret", "agentrun-store-tls", NAMESPACE)]["data"]["ca.crt"]
        assert secret["data"]["ca.crt"] != store
    volumes = found[("Deployment", "agentrun-receiver", NAMESPACE)]["spec"]["template"][
        "spec"]["volumes"]
    tls = next(v for v in volumes if v["name"] == "tls")
    assert tls["secret"]["secretName"] == "agentrun-receiver-tls"


@pytest.mark.parametrize(("sets", "url"), [
    ((), f"https://agentrun-receiver.{NAMESPACE}.svc"),
    (("receiver.url=https://hooks.example.com",), "https://hooks.example.com"),
    (("receiver.enabled=false",), None),
], ids=["its-service", "an-ingress", "no-receiver"])
def test_the_operator_is_told_where_senders_reach_the_receiver(sets: tuple[str, ...],
                                                               url: str | None) -> None:
    found = objects(*sets)
    args = container(found, "agentrun-operator")["args"]
    given = [a.split("=", 1)[1] for a in args if a.startswith("--receiver-url=")]
    assert given == ([url] if url else [])
    assert (("Deployment", "agentrun-receiver", NAMESPACE) in found) is (url is not None)


def test_helm_refuses_a_receiver_url_that_is_not_one() -> None:
    done = helm("template", "agentrun", str(CHART), *ARGS, "--set", "postgres.enabled=true",
                "--set", "receiver.url=hooks.example.com")
    assert done.returncode != 0 and "/receiver/url" in done.stderr, done.stderr


def test_the_network_policy_opens_the_deliveries_port_only() -> None:
    found = objects()
    policy = found[("NetworkPolicy", "agentrun-receiver", NAMESPACE)]["spec"]
    assert policy["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "receiver"
    assert policy["ingress"] == [{"ports": [{"port": 8443}]}, {"ports": [{"port": 9090}]}]


def test_every_policy_that_exempts_the_receiver_names_its_service_account() -> None:
    found = objects("runner.allowedImages={a/*}")
    account = found[("Deployment", "agentrun-receiver", NAMESPACE)]["spec"]["template"][
        "spec"]["serviceAccountName"]
    assert f"system:serviceaccount:{NAMESPACE}:{account}" == RECEIVER_SA
    exempting = {(k[0], k[1]) for k, d in found.items()
                 if k[0].endswith("AdmissionPolicy") and RECEIVER_SA in json.dumps(d)}
    assert exempting == {
        ("ValidatingAdmissionPolicy", "agentrun-run-references"),
        ("ValidatingAdmissionPolicy", "agentrun-allowed-images"),
        ("ValidatingAdmissionPolicy", "agentrun-run-creator"),
        ("MutatingAdmissionPolicy", "agentrun-run-creator")}
    # ...and the same policies exempt the group a receiver run outside the cluster is in.
    for kind, name in exempting:
        assert "'agentrun:receivers' in request.userInfo" in json.dumps(
            found[(kind, name, None)]), name
    # Never where only the operator may act: a replay run is the operator's alone.
    assert RECEIVER_SA not in json.dumps(found[("ValidatingAdmissionPolicy",
                                                "agentrun-replay-of", None)])


# -- runner.allowedImages on a trigger's template, on the real API server ----------------------

ALLOWED = "runner.allowedImages={registry.example.com/agents/*}"


def _dry_run(plane: ControlPlane, namespace: str, manifest: dict[str, Any]) -> str:
    done = plane.kubectl("apply", "--server-side", "--dry-run=server", "-n", namespace, "-f",
                         "-", input=json.dumps(manifest), check=False)
    return "accepted" if done.returncode == 0 else done.stderr


def _with_image(image: str) -> dict[str, Any]:
    manifest = trigger_manifest()
    manifest["spec"]["runTemplate"]["spec"]["image"] = image
    return manifest


@pytest.fixture
def allow_list(crds: ControlPlane) -> Iterator[ControlPlane]:
    found = objects(ALLOWED)
    rendered = [found[(kind, "agentrun-allowed-images", None)] for kind in (
        "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")]
    manifest = "---\n".join(yaml.safe_dump(d) for d in rendered)
    crds.kubectl("create", "namespace", "trigger-images", check=False)
    crds.kubectl("apply", "-f", "-", input=manifest)
    deadline = time.monotonic() + 120
    while "agentrun-allowed-images" not in _dry_run(crds, "trigger-images",
                                                    _with_image("elsewhere/x:1")):
        assert time.monotonic() < deadline, "agentrun-allowed-images not enforced"
        time.sleep(0.5)
    try:
        yield crds
    finally:
        crds.kubectl("delete", "-f", "-", input=manifest, check=False)
        deadline = time.monotonic() + 120
        while _dry_run(crds, "trigger-images", _with_image("elsewhere/x:1")) != "accepted":
            assert time.monotonic() < deadline, "agentrun-allowed-images still enforced"
            time.sleep(0.5)


def test_a_trigger_whose_runs_would_run_an_image_outside_the_list_is_refused(
        allow_list: ControlPlane) -> None:
    said = _dry_run(allow_list, "trigger-images", _with_image("elsewhere/x:1"))
    assert re.search(r"AgentRunTrigger spec\.runTemplate\.spec\.image elsewhere/x:1 is not one "
                     r"of the runner images this\s+cluster allows", said), said
    assert _dry_run(allow_list, "trigger-images",
                    _with_image("registry.example.com/agents/a:1")) == "accepted"
    assert _dry_run(allow_list, "trigger-images", trigger_manifest()) == "accepted"
