"""The development node mounts projected volumes the way a kubelet does, as files a process
can read: a bound ServiceAccount token with its own audience (what runner pods use to
reach the store API), checked with a real TokenReview; and it refuses to start a
container whose volumes or env cannot be made, as a kubelet does, until they can."""

from __future__ import annotations

import datetime
import json
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from agentrun_devtools import devnode
from agentrun_devtools.controlplane import ControlPlane
from agentrun_devtools.processes import Child, wait_for
from kubernetes import config

STORE_AUDIENCE = "agentrun.dev/store"
STORE_MOUNT = "/var/run/secrets/agentrun.dev/store"
SA_MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
API_AUDIENCE = "https://kubernetes.default.svc"  # the API server's --service-account-issuer

# What the runner does with its token: read the file its env names.
PRINT_TOKEN = ("import json, os; path = os.environ['AGENTRUN_STORE_TOKEN_FILE']; "
               "print(json.dumps({'path': path, 'token': open(path).read()}))")

STORE_TOKEN_VOLUME = {"name": "store-token", "projected": {"sources": [{"serviceAccountToken": {
    "audience": STORE_AUDIENCE, "expirationSeconds": 3600, "path": "token"}}]}}


def pod_manifest(name: str, program: str, *, env: list[dict[str, Any]] | None = None,
                 service_account: str | None = None, store_token: bool = False,
                 automount: bool = False, gated: bool = False) -> dict[str, Any]:
    """A pod whose one container runs `program` with this interpreter (the development
    node runs commands as local processes), shaped like a runner pod."""
    volumes: list[dict[str, Any]] = [{"name": "tmp", "emptyDir": {}}]
    mounts: list[dict[str, Any]] = [{"name": "tmp", "mountPath": "/tmp"}]
    env = list(env or [])
    if store_token:
        volumes.append(STORE_TOKEN_VOLUME)
        mounts.append({"name": "store-token", "mountPath": STORE_MOUNT, "readOnly": True})
        env.append({"name": "AGENTRUN_STORE_TOKEN_FILE", "value": f"{STORE_MOUNT}/token"})
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": automount,
        "containers": [{"name": "runner", "image": "agentrun/runner:dev",
                        "command": [sys.executable, "-c", program], "env": env,
                        "volumeMounts": mounts}],
        "volumes": volumes,
    }
    if service_account:
        spec["serviceAccountName"] = service_account
    if gated:
        # Held back from the scheduler until the test lets it go to dev-node.
        spec["schedulingGates"] = [{"name": "agentrun.dev/test"}]
    else:
        spec["nodeName"] = "dev-node"
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def create(plane: ControlPlane, namespace: str, manifest: dict[str, Any]) -> None:
    plane.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(manifest))


def get_pod(plane: ControlPlane, namespace: str, name: str) -> dict[str, Any]:
    return dict(json.loads(plane.kubectl("get", "pod", name, "-n", namespace,
                                         "-o", "json").stdout))


def wait_pod(plane: ControlPlane, namespace: str, name: str,
             check: Callable[[dict[str, Any]], bool], what: str,
             timeout: float = 30) -> dict[str, Any]:
    seen: dict[str, Any] = {}

    def ok() -> bool:
        nonlocal seen
        seen = get_pod(plane, namespace, name)
        return check(seen)

    try:
        wait_for(ok, timeout=timeout, what=what)
    except TimeoutError as e:
        raise AssertionError(f"{e}; last status: {json.dumps(seen.get('status'), indent=1)}"
                             ) from e
    return seen


def phase(pod: dict[str, Any]) -> str:
    return str((pod.get("status") or {}).get("phase"))


def waiting(pod: dict[str, Any]) -> dict[str, Any]:
    statuses = (pod.get("status") or {}).get("containerStatuses") or [{}]
    return dict((statuses[0].get("state") or {}).get("waiting") or {})


def pod_dir(dev_node: Child, namespace: str, name: str) -> Path:
    """The pod's work directory on the development node (its log, its volumes)."""
    found = list(dev_node.log_path.parent.glob(f"{namespace}_{name}_*"))
    assert len(found) == 1, found
    return found[0]


def output(dev_node: Child, namespace: str, name: str) -> str:
    return (pod_dir(dev_node, namespace, name) / "runner.log").read_text()


def token_review(plane: ControlPlane, token: str, audiences: list[str]) -> dict[str, Any]:
    body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
            "spec": {"token": token, "audiences": audiences}}
    done = plane.kubectl("create", "-o", "json", "-f", "-", input=json.dumps(body))
    return dict(json.loads(done.stdout)["status"])


def events(plane: ControlPlane, namespace: str, name: str) -> list[dict[str, Any]]:
    done = plane.kubectl("get", "events", "-n", namespace, "-o", "json",
                         f"--field-selector=involvedObject.name={name}")
    return list(json.loads(done.stdout)["items"])


def test_store_token_is_a_bound_token_of_the_pod(
        control_plane: ControlPlane, dev_node: Child, namespace: str) -> None:
    plane = control_plane
    plane.kubectl("create", "serviceaccount", "runner", "-n", namespace)
    create(plane, namespace, pod_manifest("reads-token", PRINT_TOKEN, service_account="runner",
                                          store_token=True))
    pod = wait_pod(plane, namespace, "reads-token", lambda p: phase(p) in ("Succeeded", "Failed"),
                   "pod reads-token finished")
    assert phase(pod) == "Succeeded", pod["status"]

    seen = json.loads(output(dev_node, namespace, "reads-token"))
    token_file = pod_dir(dev_node, namespace, "reads-token") / "volumes" / "store-token" / "token"
    assert seen["path"] == str(token_file)  # the mountPath, mapped to the node's directory
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    token = seen["token"]

    review = token_review(plane, token, [STORE_AUDIENCE])
    assert review.get("authenticated") is True, review
    assert review["audiences"] == [STORE_AUDIENCE]
    assert review["user"]["username"] == f"system:serviceaccount:{namespace}:runner"
    extra = review["user"]["extra"]
    assert extra["authentication.kubernetes.io/pod-name"] == ["reads-token"]
    assert extra["authentication.kubernetes.io/pod-uid"] == [pod["metadata"]["uid"]]

    other = token_review(plane, token, [API_AUDIENCE])
    assert other.get("authenticated") is not True, other
    assert "audience" in other.get("error", ""), other

    plane.kubectl("delete", "pod", "reads-token", "-n", namespace, "--timeout=30s")
    # The API server checks a bound token's pod: gone, the token is dead (once its cache of
    # successful authentications, 10 seconds, has let go of it).
    wait_for(lambda: token_review(plane, token, [STORE_AUDIENCE]).get("authenticated") is not True,
             timeout=30, what="the deleted pod's token no longer authenticated")


def test_default_service_account_volume(
        control_plane: ControlPlane, dev_node: Child, namespace: str) -> None:
    """The volume the API server adds to a pod that automounts its ServiceAccount token:
    a token for the API server's own audience, the cluster's CA (a ConfigMap source), the
    namespace (a downwardAPI source), all under the one mapped directory."""
    program = ("import json, os; d = os.environ['SA_DIR']; "
               "print(json.dumps({n: open(os.path.join(d, n)).read() "
               "for n in ('token', 'ca.crt', 'namespace')}))")
    plane = control_plane
    create(plane, namespace, pod_manifest("default-sa", program, automount=True,
                                          env=[{"name": "SA_DIR", "value": SA_MOUNT}]))
    pod = wait_pod(plane, namespace, "default-sa", lambda p: phase(p) in ("Succeeded", "Failed"),
                   "pod default-sa finished")
    assert phase(pod) == "Succeeded", pod["status"]
    seen = json.loads(output(dev_node, namespace, "default-sa"))
    assert seen["namespace"] == namespace
    assert seen["ca.crt"].startswith("-----BEGIN CERTIFICATE-----")
    review = token_review(plane, seen["token"], [API_AUDIENCE])
    assert review.get("authenticated") is True, review
    assert review["user"]["username"] == f"system:serviceaccount:{namespace}:default"


def test_missing_secret_holds_the_container_until_it_exists(
        control_plane: ControlPlane, dev_node: Child, namespace: str) -> None:
    plane = control_plane
    env = [{"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "later",
                                                               "key": "password"}}}]
    create(plane, namespace, pod_manifest(
        "needs-secret", "import os; print('password=' + os.environ['PASSWORD'])", env=env))

    pod = wait_pod(plane, namespace, "needs-secret",
                   lambda p: waiting(p).get("reason") == "CreateContainerConfigError",
                   "needs-secret waiting in CreateContainerConfigError")
    assert phase(pod) == "Pending"
    assert waiting(pod)["message"] == 'secret "later" not found'
    assert not (pod_dir(dev_node, namespace, "needs-secret") / "runner.log").exists()
    assert any(e["reason"] == "Failed" and e["type"] == "Warning"
               and e["message"] == 'Error: secret "later" not found'
               for e in events(plane, namespace, "needs-secret"))

    plane.kubectl("create", "secret", "generic", "later", "-n", namespace,
                  "--from-literal=other=x")
    pod = wait_pod(plane, namespace, "needs-secret",
                   lambda p: "couldn't find key" in waiting(p).get("message", ""),
                   "needs-secret waiting for its key")
    assert waiting(pod) == {"reason": "CreateContainerConfigError",
                            "message": f"couldn't find key password in Secret {namespace}/later"}
    assert phase(pod) == "Pending"

    plane.kubectl("patch", "secret", "later", "-n", namespace, "-p",
                  json.dumps({"stringData": {"password": "s3cret"}}))
    pod = wait_pod(plane, namespace, "needs-secret",
                   lambda p: phase(p) in ("Succeeded", "Failed"), "needs-secret finished")
    assert phase(pod) == "Succeeded", pod["status"]
    assert list(pod["status"]["containerStatuses"][0]["state"]) == ["terminated"]
    assert output(dev_node, namespace, "needs-secret").strip() == "password=s3cret"


def test_missing_optional_secret_leaves_the_variable_out(
        control_plane: ControlPlane, dev_node: Child, namespace: str) -> None:
    env = [{"name": "PASSWORD", "valueFrom": {"secretKeyRef": {
        "name": "absent", "key": "password", "optional": True}}}]
    create(control_plane, namespace, pod_manifest(
        "optional", "import os; print('PASSWORD' in os.environ)", env=env))
    pod = wait_pod(control_plane, namespace, "optional",
                   lambda p: phase(p) in ("Succeeded", "Failed"), "pod optional finished")
    assert phase(pod) == "Succeeded", pod["status"]
    assert output(dev_node, namespace, "optional").strip() == "False"


def test_token_for_a_deleted_service_account_waits_in_container_creating(
        control_plane: ControlPlane, dev_node: Child, namespace: str) -> None:
    """The API server admits a pod only if its ServiceAccount exists, so the account is
    deleted while the pod is held back from scheduling; on the node the TokenRequest
    fails, as a kubelet's would, and succeeds once the account is back."""
    plane = control_plane
    plane.kubectl("create", "serviceaccount", "gone", "-n", namespace)
    create(plane, namespace, pod_manifest("orphan", PRINT_TOKEN, service_account="gone",
                                          store_token=True, gated=True))
    plane.kubectl("delete", "serviceaccount", "gone", "-n", namespace)
    plane.kubectl("patch", "pod", "orphan", "-n", namespace, "--type=json", "-p",
                  json.dumps([{"op": "remove", "path": "/spec/schedulingGates"}]))

    pod = wait_pod(plane, namespace, "orphan",
                   lambda p: waiting(p).get("reason") == "ContainerCreating",
                   "orphan waiting in ContainerCreating")
    assert pod["spec"]["nodeName"] == "dev-node"
    assert phase(pod) == "Pending"
    assert not (pod_dir(dev_node, namespace, "orphan") / "runner.log").exists()
    failed_mounts = [e["message"] for e in events(plane, namespace, "orphan")
                     if e["reason"] == "FailedMount"]
    assert failed_mounts == ['MountVolume.SetUp failed for volume "store-token" : '
                             'failed to fetch token: serviceaccounts "gone" not found']

    plane.kubectl("create", "serviceaccount", "gone", "-n", namespace)
    pod = wait_pod(plane, namespace, "orphan", lambda p: phase(p) in ("Succeeded", "Failed"),
                   "orphan finished")
    assert phase(pod) == "Succeeded", pod["status"]
    token = json.loads(output(dev_node, namespace, "orphan"))["token"]
    review = token_review(plane, token, [STORE_AUDIENCE])
    assert review.get("authenticated") is True, review
    assert review["user"]["username"] == f"system:serviceaccount:{namespace}:gone"


def test_a_due_token_is_renewed_in_place(
        control_plane: ControlPlane, namespace: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A node of the test's own, on a pod the session's node never sees (held back from
    scheduling); the clock is moved past 80% of the token's hour instead of waiting."""
    plane = control_plane
    plane.kubectl("create", "serviceaccount", "runner", "-n", namespace)
    create(plane, namespace, pod_manifest("renews", "import time; time.sleep(120)",
                                          service_account="runner", store_token=True,
                                          gated=True))
    api = config.new_client_from_config(config_file=str(plane.kubeconfig))
    node = devnode.DevNode(api, tmp_path)
    try:
        pod = node.core.read_namespaced_pod("renews", namespace)
        node._on_pod(pod)
        token_file = next(tmp_path.glob(f"{namespace}_renews_*")) / "volumes" / "store-token" \
            / "token"
        first, first_inode = token_file.read_text(), token_file.stat().st_ino

        node._handle("tick", None)
        assert token_file.read_text() == first  # not due yet

        later = devnode._now() + datetime.timedelta(minutes=49)
        monkeypatch.setattr(devnode, "_now", lambda: later)
        node._handle("tick", None)
        renewed = token_file.read_text()
        assert renewed != first
        assert token_file.stat().st_ino != first_inode  # replaced whole, not rewritten
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        review = token_review(plane, renewed, [STORE_AUDIENCE])
        assert review.get("authenticated") is True, review
        assert review["user"]["extra"]["authentication.kubernetes.io/pod-name"] == ["renews"]
    finally:
        node.shutdown()
        api.close()
