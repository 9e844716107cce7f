"""Kueue on the development cluster and in tests: its controller manager as a process on
this host, its CRDs and webhooks served to the cluster's API server.

    python -m agentrun_devtools.kueue up   [--state .local]   # `make kueue`
    python -m agentrun_devtools.kueue down [--state .local]   # `make dev-cluster-down` too

The binary and the manifests come from Kueue's own Go module (devtools/kueue/build.sh,
cached). What is installed is Kueue's, rendered here as its kustomization would render it
(namespace kueue-system, names prefixed kueue-), with these differences from a stock
install (docs/kueue.md):

- Only the webhooks of Kueue's own kinds and of its pod and batch/job integrations; the
  pod and Job webhooks carry an objectSelector: only objects labelled
  kueue.x-k8s.io/queue-name go through them, so nothing else on the cluster depends on
  Kueue being up. The batch/job integration is there for bench/queues.py's anchor (Jobs
  through the same ClusterQueue as runs). The integrations of other kinds (Deployments,
  JobSets, ...) are not enabled and their webhooks not installed.
- Configuration: integrations.frameworks ["pod", "batch/job"], manageJobsWithoutQueueName
  false, no leader election, no visibility server.
- Kueue runs on this host, not in a pod. The API server reaches its webhooks as it reaches
  the transcript API (agentrun_devtools.transcript_api): the Service kueue-webhook-service
  has no selector, an EndpointSlice names this host's address, and the API server (with
  --enable-aggregator-routing) dials it itself. The serving certificate is made here
  (agentrun_devtools.certs), for the Service's names, and the caBundle of every webhook
  and conversion webhook is its CA: what cert-manager's CA injector does in a cluster, so
  Kueue's own certificate management is off.
- Kueue reads its metrics certificate from a fixed path, /etc/kueue/metrics/certs, when
  its own certificate management is off. That path is made in a private mount namespace
  of the process (an overlay of /etc whose upper layer is in the state directory), so
  nothing on the host changes.
- Kueue acts with the cluster's admin credentials, as kube-controller-manager and
  kube-scheduler do here.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from agentrun_devtools.certs import PKI
from agentrun_devtools.controlplane import REPO, ControlPlane, built
from agentrun_devtools.processes import (
    Child,
    ProcessDied,
    free_port,
    running_pid,
    stop_pid,
    wait_for,
)
from agentrun_devtools.transcript_api import host_address, host_service

BUILD_SCRIPT = REPO / "devtools" / "kueue" / "build.sh"

NAMESPACE = "kueue-system"
SERVICE = "kueue-webhook-service"
SERVICE_NAMES = (SERVICE, f"{SERVICE}.{NAMESPACE}", f"{SERVICE}.{NAMESPACE}.svc",
                 f"{SERVICE}.{NAMESPACE}.svc.cluster.local")
MUTATING = "kueue-mutating-webhook-configuration"
VALIDATING = "kueue-validating-webhook-configuration"
GROUP = "kueue.x-k8s.io"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
POD_FINALIZER = "kueue.x-k8s.io/managed"
METRICS_CERTS = Path("kueue/metrics/certs")  # under /etc, where Kueue reads them
# The namespaces Kueue's own kustomization keeps its pod webhooks away from.
EXCLUDED_NAMESPACES = ("kube-system", NAMESPACE)


def binaries() -> Path:
    """The directory holding the kueue binary (its manifests in ../config), building it on
    first use."""
    return built(BUILD_SCRIPT, "AGENTRUN_KUEUE_BIN")


@dataclass(frozen=True)
class Endpoint:
    """Where the API server reaches Kueue's webhook server: this host's address, a port."""

    address: str
    port: int


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


# The kinds of the integrations enabled here, as (API group, resource) in a webhook's rules.
_INTEGRATED = (("", "pods"), ("batch", "jobs"))


def _integration_webhook(webhook: dict[str, Any]) -> bool:
    """A webhook of the pod or the batch/job integration."""
    return any(resource in (r.get("resources") or []) and group in (r.get("apiGroups") or [])
               for r in webhook.get("rules") or [] for group, resource in _INTEGRATED)


def _kueues_own(webhook: dict[str, Any]) -> bool:
    return all(r.get("apiGroups") == [GROUP] for r in webhook.get("rules") or [])


def manifests(config: Path, endpoint: Endpoint, ca_pem: str) -> list[dict[str, Any]]:
    """Kueue's CRDs and webhooks as this module installs them (see the module's
    docstring), from the module's config/components (`config`), with `ca_pem` as every
    caBundle."""
    bundle = base64.b64encode(ca_pem.encode()).decode()
    service_ref = {"name": SERVICE, "namespace": NAMESPACE, "port": 443}
    labels = {"app.kubernetes.io/name": "kueue", "app.kubernetes.io/component": "webhook"}
    out = host_service(NAMESPACE, SERVICE, "webhook", endpoint.address, endpoint.port, labels)
    # The CRDs, with the conversion webhooks their kustomization patches in.
    crd_dir = config / "crd"
    kustomization = yaml.safe_load((crd_dir / "kustomization.yaml").read_text())
    converted = set()
    for patch in kustomization.get("patches") or []:
        for doc in _docs(crd_dir / patch["path"]):
            converted.add(doc["metadata"]["name"])
    for resource in kustomization["resources"]:
        for crd in _docs(crd_dir / resource):
            if crd["metadata"]["name"] in converted:
                crd["spec"]["conversion"] = {"strategy": "Webhook", "webhook": {
                    "clientConfig": {"service": {**service_ref, "path": "/convert"},
                                     "caBundle": bundle},
                    "conversionReviewVersions": ["v1"]}}
            out.append(crd)
    # The webhooks of Kueue's own kinds and of its pod and batch/job integrations.
    for configuration in _docs(config / "webhook" / "manifests.yaml"):
        kept = []
        for webhook in configuration.get("webhooks") or []:
            if not (_kueues_own(webhook) or _integration_webhook(webhook)):
                continue
            path = webhook["clientConfig"]["service"]["path"]
            webhook["clientConfig"] = {"service": {**service_ref, "path": path},
                                       "caBundle": bundle}
            if _integration_webhook(webhook):
                webhook["namespaceSelector"] = {"matchExpressions": [{
                    "key": "kubernetes.io/metadata.name", "operator": "NotIn",
                    "values": list(EXCLUDED_NAMESPACES)}]}
                webhook["objectSelector"] = {"matchExpressions": [{
                    "key": QUEUE_LABEL, "operator": "Exists"}]}
            kept.append(webhook)
        configuration["metadata"] = {
            "name": f"kueue-{configuration['metadata']['name']}", "labels": labels}
        configuration["webhooks"] = kept
        out.append(configuration)
    return out


def configuration(webhook: Endpoint, cert_dir: Path, health_port: int,
                  metrics_port: int) -> dict[str, Any]:
    """Kueue's Configuration (config.kueue.x-k8s.io/v1beta2) for the development cluster."""
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2", "kind": "Configuration",
        "namespace": NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "metrics": {"bindAddress": f"127.0.0.1:{metrics_port}"},
        "webhook": {"port": webhook.port, "host": webhook.address, "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "manageJobsWithoutQueueName": False,
        "integrations": {"frameworks": ["pod", "batch/job"]},
        "clientConnection": {"qps": 50, "burst": 100},
    }


class Kueue:
    """Kueue's controller manager against one cluster, its CRDs and webhooks installed."""

    def __init__(self, root: Path, kubeconfig: Path, kubectl: Path, address: str, *,
                 bin_dir: Path | None = None) -> None:
        self.root = root
        self.kubeconfig = kubeconfig
        self._kubectl = kubectl
        self.address = address
        self.bin = bin_dir or binaries()
        self.config = self.bin.parent / "config"
        self.child: Child | None = None
        self.health_port = 0
        self.startup_seconds = 0.0

    @classmethod
    def on(cls, plane: ControlPlane, root: Path) -> Kueue:
        return cls(root, plane.kubeconfig, plane.bin / "kubectl", plane.host_address)

    def kubectl(self, *args: str, input: str | None = None, check: bool = True,
                timeout: float = 120) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([str(self._kubectl), f"--kubeconfig={self.kubeconfig}", *args],
                              input=input, capture_output=True, text=True, timeout=timeout)
        if check and done.returncode != 0:
            raise subprocess.CalledProcessError(done.returncode, done.args, done.stdout,
                                                done.stderr)
        return done

    # -- lifecycle ---------------------------------------------------------------------

    def start(self, timeout: float = 180) -> Kueue:
        """Installs Kueue's CRDs and webhooks, starts its controller manager, and returns
        once the API server reaches its webhooks."""
        if not self.address:
            raise RuntimeError("this host has no non-loopback IPv4 address: the API server "
                               "cannot be pointed at Kueue's webhooks (an EndpointSlice may "
                               "not name a loopback address)")
        began = time.monotonic()
        self.root.mkdir(parents=True, exist_ok=True)
        endpoint = Endpoint(self.address, free_port())
        pki = PKI(self.root / "pki", name="kueue-dev-ca")
        cert_dir = self.root / "webhook-certs"
        cert_dir.mkdir(exist_ok=True)
        cert, key = pki.issue("webhook", SERVICE, server=True,
                              hosts=(*SERVICE_NAMES, endpoint.address))
        shutil.copy(cert, cert_dir / "tls.crt")
        shutil.copy(key, cert_dir / "tls.key")
        # /etc/kueue/metrics/certs inside the process's own view of /etc (see run_argv).
        upper, work = self.root / "etc" / "upper", self.root / "etc" / "work"
        metrics_dir = upper / METRICS_CERTS
        metrics_dir.mkdir(parents=True, exist_ok=True)
        work.mkdir(parents=True, exist_ok=True)
        metrics_cert, metrics_key = pki.issue("metrics", "kueue-metrics", server=True,
                                              hosts=("127.0.0.1", "localhost"))
        shutil.copy(metrics_cert, metrics_dir / "tls.crt")
        shutil.copy(metrics_key, metrics_dir / "tls.key")
        self.health_port = free_port()
        config_file = self.root / "config.yaml"
        config_file.write_text(yaml.safe_dump(configuration(
            endpoint, cert_dir, self.health_port, free_port())))

        self.install(endpoint, pki.ca_cert.read_text())
        self.child = Child("kueue", run_argv(self.bin / "kueue", config_file, self.kubeconfig,
                                             upper, work),
                           self.root / "kueue.log",
                           env={**os.environ, "KUBECONFIG": str(self.kubeconfig)})
        try:
            wait_for(self._ready, timeout=timeout, what="Kueue's controller manager",
                     interval=0.5)
            wait_for(self._webhooks_answer, timeout=timeout, what="Kueue's webhooks",
                     interval=0.5)
        except BaseException:
            tail = self.child.log_tail(40)
            self.stop()
            raise RuntimeError(f"Kueue did not start; its log:\n{tail}") from None
        self.startup_seconds = time.monotonic() - began
        return self

    def install(self, endpoint: Endpoint, ca_pem: str) -> None:
        items = manifests(self.config, endpoint, ca_pem)
        self.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-",
                     input=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
        crds = [f"crd/{d['metadata']['name']}" for d in items
                if d["kind"] == "CustomResourceDefinition"]
        self.kubectl("wait", "--for=condition=Established", "--timeout=60s", *crds)

    def _ready(self) -> bool:
        assert self.child is not None
        if not self.child.alive():
            raise ProcessDied(f"kueue exited:\n{self.child.log_tail()}")
        with urllib.request.urlopen(f"http://127.0.0.1:{self.health_port}/readyz",
                                    timeout=2) as response:
            return bool(response.status == 200)

    def _webhooks_answer(self) -> bool:
        """A server-side dry run of a ResourceFlavor goes through Kueue's webhooks."""
        probe = {"apiVersion": f"{GROUP}/v1beta2", "kind": "ResourceFlavor",
                 "metadata": {"name": "webhook-probe"}}
        return self.kubectl("create", "--dry-run=server", "-f", "-", input=json.dumps(probe),
                            check=False).returncode == 0

    def stop(self) -> None:
        """Stops the controller manager (its CRDs and webhooks stay: see uninstall)."""
        if self.child is not None:
            self.child.stop()
            self.child = None

    def uninstall(self) -> None:
        """What an admin does when Kueue goes: its webhook configurations first (nothing
        must call a server that is gone), then Kueue's finalizer off every pod that still
        carries it (Kueue is no longer there to remove it; such a pod, deleted, would stay
        Terminating). Its CRDs and their objects stay."""
        self.kubectl("delete", "mutatingwebhookconfiguration", MUTATING, "--ignore-not-found",
                     check=False)
        self.kubectl("delete", "validatingwebhookconfiguration", VALIDATING,
                     "--ignore-not-found", check=False)
        self.kubectl("delete", "service", SERVICE, "-n", NAMESPACE, "--ignore-not-found",
                     check=False)
        self.kubectl("delete", "endpointslice", f"{SERVICE}-host", "-n", NAMESPACE,
                     "--ignore-not-found", check=False)
        release_pods(self)


def release_pods(kueue: Kueue) -> list[str]:
    """Removes Kueue's finalizer from every pod that carries it; returns their names."""
    done = kueue.kubectl("get", "pods", "-A", "-o", "json", check=False)
    if done.returncode != 0:
        return []
    released = []
    for pod in json.loads(done.stdout).get("items") or []:
        meta = pod["metadata"]
        finalizers = meta.get("finalizers") or []
        if POD_FINALIZER not in finalizers:
            continue
        patch = [{"op": "test", "path": "/metadata/finalizers", "value": finalizers},
                 {"op": "replace", "path": "/metadata/finalizers",
                  "value": [f for f in finalizers if f != POD_FINALIZER]}]
        kueue.kubectl("patch", "pod", meta["name"], "-n", meta["namespace"], "--type=json",
                      "-p", json.dumps(patch), check=False)
        released.append(f"{meta['namespace']}/{meta['name']}")
    return released


def run_argv(binary: Path, config_file: Path, kubeconfig: Path, upper: Path,
             work: Path) -> list[str]:
    """The command that runs Kueue with /etc/kueue/metrics/certs in place: a private mount
    namespace (a user namespace too when not root) where /etc is an overlay whose upper
    layer holds that directory; nothing of the host's /etc changes."""
    mount = (f"mount -t overlay overlay -o lowerdir=/etc,upperdir={upper},workdir={work} /etc"
             " && exec \"$0\" \"$@\"")
    unshare: list[str] = ["unshare", "--mount", "--propagation", "private"]
    if os.geteuid() != 0:
        unshare[1:1] = ["--user", "--map-root-user"]
    return [*unshare, "sh", "-c", mount, str(binary), f"--config={config_file}",
            f"--kubeconfig={kubeconfig}", "--feature-gates=VisibilityOnDemand=false",
            "--zap-log-level=info"]


# -- `make kueue` on the development cluster ----------------------------------------------


class _Paths:
    def __init__(self, state: Path) -> None:
        self.state = state
        self.root = state / "kueue"
        self.pid = state / "kueue.pid"
        self.ready = state / "kueue.ready"
        self.log = state / "kueue-supervisor.log"
        self.kubeconfig = state / "kubeconfig"
        self.kubectl = state / "bin" / "kubectl"


def serve(paths: _Paths) -> None:
    """The supervisor `make kueue` leaves running: Kueue until SIGTERM, then it stops it
    and takes its webhooks out of the cluster."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    shutil.rmtree(paths.root, ignore_errors=True)
    kueue = Kueue(paths.root, paths.kubeconfig, paths.kubectl, host_address())
    try:
        kueue.start()
        paths.ready.write_text("ready\n")
        print(f"Kueue ready in {kueue.startup_seconds:.1f}s; its log: "
              f"{paths.root / 'kueue.log'}", flush=True)
        while not stop.wait(1.0):
            if kueue.child is None or not kueue.child.alive():
                print(f"kueue exited:\n{kueue.child.log_tail() if kueue.child else ''}",
                      flush=True)
                break
    finally:
        paths.ready.unlink(missing_ok=True)
        kueue.stop()
        kueue.uninstall()


def up(paths: _Paths) -> int:
    if not paths.kubeconfig.exists() or not paths.kubectl.exists():
        print(f"no development cluster in {paths.state}: run `make dev-cluster` first",
              file=sys.stderr)
        return 1
    if running_pid(paths.pid) and paths.ready.exists():
        print("Kueue already running on the development cluster")
        return 0
    down(paths, quiet=True)
    bin_dir = binaries()  # build (or find cached) in the foreground, with its output
    began = time.monotonic()
    with open(paths.log, "ab") as log:
        supervisor = subprocess.Popen(
            [sys.executable, "-m", "agentrun_devtools.kueue", "serve",
             f"--state={paths.state}"], stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
            env={**os.environ, "AGENTRUN_KUEUE_BIN": str(bin_dir),
                 "PYTHONPATH": os.pathsep.join(p for p in (
                     str(REPO / "devtools"), os.environ.get("PYTHONPATH", "")) if p)})
    paths.pid.write_text(str(supervisor.pid))

    def ready() -> bool:
        if supervisor.poll() is not None:
            raise ProcessDied(f"Kueue did not start; see {paths.log}:\n"
                              + "\n".join(paths.log.read_text().splitlines()[-30:]))
        return paths.ready.exists()

    wait_for(ready, timeout=240, what="Kueue", interval=0.25)
    print(f"Kueue up in {time.monotonic() - began:.1f}s: its CRDs and webhooks are served "
          "(pod integration, for pods labelled kueue.x-k8s.io/queue-name); "
          "docs/kueue.md shows a ClusterQueue and a LocalQueue to create")
    return 0


def down(paths: _Paths, *, quiet: bool = False) -> int:
    pid = running_pid(paths.pid)
    if pid:
        stop_pid(pid, timeout=60, what="Kueue shutdown", group=True)
    for path in (paths.pid, paths.ready):
        path.unlink(missing_ok=True)
    shutil.rmtree(paths.root, ignore_errors=True)
    if pid and not quiet:
        print("Kueue stopped; its webhooks were removed from the cluster")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Kueue on the agentrun development cluster")
    parser.add_argument("command", choices=["up", "down", "serve"])
    parser.add_argument("--state", type=Path, default=REPO / ".local")
    args = parser.parse_args(argv)
    paths = _Paths(args.state.resolve())
    if args.command == "up":
        return up(paths)
    if args.command == "down":
        return down(paths)
    serve(paths)
    return 0


if __name__ == "__main__":
    sys.exit(main())
