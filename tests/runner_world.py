"""The store API for tests that run the runner without the operator: a real
`agentrun-store-api` process per store, and real runner identities (an AgentRun, its
attempt's pod, and a projected-style token bound to that pod by the API server's
TokenRequest), exactly what the store API verifies in a cluster."""

from __future__ import annotations

import atexit
import itertools
import json
import os
import re
import shutil
import ssl
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrun_devtools.controlplane import ControlPlane
from agentrun_devtools.forkserver import Forks
from agentrun_devtools.processes import Child, ProcessDied, wait_for
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from agentrun.vocabulary import (
    API_VERSION,
    GROUP,
    LABEL_ATTEMPT,
    LABEL_RUN,
    RUN_KIND,
    RUN_PLURAL,
    STORE_AUDIENCE,
    VERSION,
)

# What the tests' clients trust: the CA of every store API this module started (its
# certificate is the control plane's store API pair, ControlPlane.store_api_tls).
TRUST = ssl.create_default_context()
# Test pods are never scheduled: they exist only for their identity (a token is bound to
# a pod object, not to a process).
UNSCHEDULED = "agentrun-tests-unscheduled"
_names = itertools.count(1)
# The store API processes of this test session are forked from one that imported the store
# API once (agentrun_devtools.forkserver): 2.4 s of CPU each instead, for a test session
# that starts one per store.
STORE_API_FORKS = Forks(Path(sys.executable), "agentrun_store_api.main",
                        Path(tempfile.gettempdir()) / f"agentrun-forks-{os.getpid()}", flags=(),
                        # What main.py imports, not main.py itself: `-m` runs it as
                        # __main__, and a copy under its own name would run it twice.
                        preload=("agentrun_store_api.app", "agentrun_store_api.routes",
                                 "agentrun_store_api.transcripts", "agentrun_store_api.tls",
                                 "kubernetes.config", "kubernetes.client",
                                 "google.adk.sessions.database_session_service",
                                 "google.adk.events.event", "google.adk.sessions.session"))


@atexit.register
def _stop_store_api_forks() -> None:
    """The session's fork servers, their socket directories and their logs go with it."""
    STORE_API_FORKS.stop()
    shutil.rmtree(STORE_API_FORKS.work, ignore_errors=True)


class StoreAPIProcess:
    """`agentrun-store-api` on loopback (a free port unless `listen` names one), for one
    store; with `transcript_listen`, the transcript API too."""

    def __init__(self, plane: ControlPlane, database_url: str, log_path: Path, *,
                 metrics_port: int = 0, listen: str = "127.0.0.1:0",
                 transcript_listen: str = "", args: Sequence[str] = ()) -> None:
        tls = plane.store_api_tls
        assert tls is not None
        TRUST.load_verify_locations(cafile=str(tls.ca))
        env = {**os.environ, "KUBECONFIG": str(plane.operator_kubeconfig)}
        self.child = Child(
            "store-api",
            [str(Path(sys.executable).parent / "agentrun-store-api"), "--listen", listen,
             "--database-url", database_url, "--tls-cert-file", str(tls.cert),
             "--tls-private-key-file", str(tls.key), f"--metrics-port={metrics_port}",
             f"--transcript-listen={transcript_listen}", *args],
            log_path, env=env, forks=STORE_API_FORKS.for_env(env))
        self.log_path, self.metrics_port = log_path, metrics_port
        self.url = ""

        def listening() -> bool:
            if not self.child.alive():
                raise ProcessDied(f"agentrun-store-api exited:\n{self.child.log_tail()}")
            found = re.search(r"event=store-api-listening url=(\S+)",
                              log_path.read_text(errors="replace"))
            if found:
                self.url = found.group(1)
            return bool(found)

        wait_for(listening, timeout=60, what="store API")

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/healthz", timeout=2,
                                        context=TRUST) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def wait_ready(self) -> StoreAPIProcess:
        wait_for(self.healthy, timeout=60, what="store API ready")
        return self

    def stop(self) -> None:
        self.child.stop()

    def metric(self, sample: str, **labels: str) -> float:
        """One sample of its /metrics (0 when it was never written)."""
        from prometheus_client.parser import text_string_to_metric_families

        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as r:
            text = r.read().decode()
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == sample and s.labels == labels:
                    return float(s.value)
        return 0.0


@dataclass
class Identity:
    """One attempt's pod and the token bound to it."""

    pod: str
    pod_uid: str
    token: str
    token_file: Path


class RunnerWorld:
    """A namespace where runs exist as AgentRuns no operator acts on, with their pods."""

    def __init__(self, plane: ControlPlane, namespace: str, work: Path) -> None:
        self.plane, self.namespace, self.work = plane, namespace, work
        api = config.new_client_from_config(config_file=str(plane.kubeconfig))
        self.core: Any = client.CoreV1Api(api)
        self.custom: Any = client.CustomObjectsApi(api)
        self.auth: Any = client.AuthenticationV1Api(api)
        self.apis: dict[str, StoreAPIProcess] = {}

    def store_api(self, database_url: str, *, ready: bool = True,
                  args: Sequence[str] = ()) -> StoreAPIProcess:
        """The store's API (started on first use, with `args` then)."""
        found = self.apis.get(database_url)
        if found is None:
            found = self.apis[database_url] = StoreAPIProcess(
                self.plane, database_url, self.work / f"store-api-{len(self.apis) + 1}.log",
                args=args)
        return found.wait_ready() if ready else found

    def stop(self) -> None:
        for api in self.apis.values():
            api.stop()

    def agent_run(self, tag: str, *, agent: str = "support-agent", user_id: str = "alice",
                  session_id: str | None = None, namespace: str | None = None) -> tuple[
                      str, str]:
        """Creates an AgentRun (name, uid) in the namespace; nothing acts on it."""
        name = f"run-{tag}-{next(_names)}"
        spec: dict[str, Any] = {"agent": agent, "input": {"text": "-"}, "userId": user_id}
        if session_id:
            spec["sessionId"] = session_id
        body = {"apiVersion": API_VERSION, "kind": RUN_KIND, "metadata": {"name": name},
                "spec": spec}
        made = self.custom.create_namespaced_custom_object(
            GROUP, VERSION, namespace or self.namespace, RUN_PLURAL, body)
        return name, made["metadata"]["uid"]

    def identity(self, run_name: str, run_uid: str, attempt: int, *,
                 namespace: str | None = None, audience: str = STORE_AUDIENCE) -> Identity:
        """The pod `<run>-<attempt>` (controlled by the AgentRun) and its bound token."""
        ns = namespace or self.namespace
        pod_name = f"{run_name}-{attempt}"
        body = {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": pod_name, "labels": {LABEL_RUN: run_name, LABEL_ATTEMPT: str(attempt)},
                "ownerReferences": [{"apiVersion": API_VERSION, "kind": RUN_KIND,
                                     "name": run_name, "uid": run_uid, "controller": True}],
            },
            "spec": {"schedulerName": UNSCHEDULED, "automountServiceAccountToken": False,
                     "serviceAccountName": "default",
                     "containers": [{"name": "runner", "image": "agentrun/runner:dev"}]},
        }
        # A pod made in a namespace whose default ServiceAccount is not there yet is left
        # with none, and a token of "default" is then refused for it ("cannot bind token
        # ... to pod running with different serviceaccount name"): wait for the account.
        self._default_account(ns)
        try:
            pod = self.core.create_namespaced_pod(ns, body)
            pod_uid = pod.metadata.uid
        except ApiException as e:
            if e.status != 409:
                raise
            pod_uid = self.core.read_namespaced_pod(pod_name, ns).metadata.uid
        token = self.token(ns, pod_name, pod_uid, audience)
        path = self.work / f"{ns}-{pod_name}-{next(_names)}.token"
        path.write_text(token)
        return Identity(pod_name, pod_uid, token, path)

    def _default_account(self, namespace: str) -> None:
        deadline = time.monotonic() + 30
        while True:
            try:
                self.core.read_namespaced_service_account("default", namespace)
                return
            except ApiException as e:
                # The default ServiceAccount appears shortly after its namespace.
                if e.status != 404 or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def token(self, namespace: str, pod: str, pod_uid: str, audience: str) -> str:
        """TokenRequest for the namespace's default ServiceAccount, bound to the pod (what
        a kubelet does for a projected token volume)."""
        request = {"spec": {"audiences": [audience], "expirationSeconds": 3600,
                            "boundObjectRef": {"apiVersion": "v1", "kind": "Pod",
                                               "name": pod, "uid": pod_uid}}}
        deadline = time.monotonic() + 30
        while True:
            try:
                done = self.core.create_namespaced_service_account_token(
                    "default", namespace, request)
                return str(done.status.token)
            except ApiException as e:
                # The default ServiceAccount appears shortly after its namespace.
                if e.status != 404 or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def delete_pod(self, pod: str, namespace: str | None = None) -> None:
        self.core.delete_namespaced_pod(pod, namespace or self.namespace,
                                        grace_period_seconds=0)

    def create_namespace(self, name: str) -> str:
        # The session operator acts on every namespace but solo-*: a runner world's
        # namespace anywhere else would have its AgentRuns started by it (a pod of the
        # same name with the operator's ServiceAccount, and this world's token refused).
        if not name.startswith("solo-"):
            raise ValueError(f"a runner world's namespace is named solo-*, not {name!r}")
        self.core.create_namespace({"metadata": {"name": name}})
        return name


def call(url: str, method: str, path: str, token: str | None, body: Any = None,
         raw: bytes | None = None) -> tuple[int, Any]:
    """One request to the store API, as a runner (or an impostor) would send it: the HTTP
    status and the decoded answer."""
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    request = urllib.request.Request(f"{url}{path}", data=data, method=method)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=30, context=TRUST) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        answer = e.read() or b"{}"
        try:
            return e.code, json.loads(answer)
        except ValueError:  # the HTTP server's own plain-text answers (404, 405)
            return e.code, {"error": answer.decode(errors="replace")}
