"""A real Kubernetes control plane on loopback, for tests and the development cluster.

etcd, kube-apiserver, kube-controller-manager and kube-scheduler are built from the Go
module proxy by devtools/controlplane/build.sh (cached outside the checkout) and started
here the way controller-runtime's envtest starts them: free loopback ports, a throwaway
PKI, an admin client certificate (O=system:masters) in a kubeconfig. Every process is a
`Child`, so nothing outlives the launcher.

The API server is an aggregator as a kubeadm cluster's is: a front-proxy CA of its own
(--requestheader-client-ca-file, the names and headers kubeadm gives it, published in
kube-system/extension-apiserver-authentication), the client certificate it proxies with
(--proxy-client-cert-file), and --enable-aggregator-routing=true (it dials an APIService's
endpoints itself: there is no kube-proxy). agentrun_devtools.transcript_api registers the
transcript API on it.
"""

from __future__ import annotations

import json
import os
import shutil
import ssl
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from agentrun_devtools import transcript_api
from agentrun_devtools.certs import PKI
from agentrun_devtools.processes import Child, ProcessDied, free_port, wait_for

REPO = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO / "devtools" / "controlplane" / "build.sh"

# A node that stops reporting is marked NotReady after this long (the default is 40s);
# runner pods then leave it after their short unreachable/not-ready tolerations.
NODE_MONITOR_GRACE = "8s"
NODE_MONITOR_PERIOD = "1s"


def built(script: Path, override: str) -> Path:
    """The directory a build script (devtools/*/build.sh) prints on its last line,
    building on first use; the environment variable `override` names one instead."""
    given = os.environ.get(override)
    if given:
        return Path(given)
    done = subprocess.run(["bash", str(script)], check=True, stdout=subprocess.PIPE, text=True)
    return Path(done.stdout.strip().splitlines()[-1])


def binaries() -> Path:
    """The directory with the control plane binaries, building them on first use."""
    return built(BUILD_SCRIPT, "AGENTRUN_CONTROLPLANE_BIN")


@dataclass(frozen=True)
class ServingPair:
    """A serving certificate, its key, and the CA its clients verify it with (PEM files)."""

    ca: Path
    cert: Path
    key: Path

    def operator_flags(self) -> list[str]:
        """An operator's flags for serving the store API with this pair, and for telling
        its runners the CA."""
        return [f"--store-api-tls-cert-file={self.cert}",
                f"--store-api-tls-key-file={self.key}", f"--store-api-ca-file={self.ca}"]


class ControlPlane:
    """etcd + kube-apiserver (+ kube-controller-manager, kube-scheduler) on loopback."""

    def __init__(
        self,
        root: Path | None = None,
        *,
        bin_dir: Path | None = None,
        controller_manager: bool = True,
        scheduler: bool = True,
    ) -> None:
        self.root = root or Path(tempfile.mkdtemp(prefix="agentrun-cp-"))
        self.bin = bin_dir or binaries()
        self.with_controller_manager = controller_manager
        self.with_scheduler = scheduler
        self.children: list[Child] = []
        self.kubeconfig = self.root / "kubeconfig"
        self.operator_kubeconfig = self.root / "operator.kubeconfig"
        self.port = 0
        self.startup_seconds = 0.0
        self.pki: PKI | None = None
        # The store API's own CA and serving certificate, for the store API served by the
        # operators started against this plane (`make dev-cluster` copies them to
        # .local/store-api/; tests hand them over as flags).
        self.store_api_tls: ServingPair | None = None
        # The API server's front proxy: the CA aggregated API servers verify it with, and
        # the client certificate it proxies users' requests with.
        self.front_proxy: ServingPair | None = None
        # This host's own address, where the transcript API is reached (store_api_tls
        # names it).
        self.host_address = transcript_api.host_address()

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    # -- lifecycle -----------------------------------------------------------------

    def start(self) -> ControlPlane:
        began = time.monotonic()
        try:
            self._start()
        except BaseException as e:
            logs = "\n".join(f"--- {c.name} ---\n{c.log_tail(15)}" for c in self.children)
            self.stop()
            if isinstance(e, Exception):
                raise RuntimeError(f"the control plane did not start: {e}\n{logs}") from e
            raise
        self.startup_seconds = time.monotonic() - began
        return self

    def _start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        pki = self.pki = PKI(self.root / "pki")
        serving = pki.issue(
            "apiserver", "kube-apiserver", server=True,
            hosts=("127.0.0.1", "localhost", "10.0.0.1", "kubernetes",
                   "kubernetes.default", "kubernetes.default.svc"),
        )
        admin = pki.issue("admin", "admin", organizations=("system:masters",))
        # The operator's identity: the admission policy lets only the group
        # agentrun:operators set spec.replayOf (in a cluster: its ServiceAccount).
        operator = pki.issue("operator", "agentrun-operator",
                             organizations=("system:masters", "agentrun:operators"))
        # What the API server shows a kubelet (logs, exec) on a real node.
        kubelet_client = pki.issue("apiserver-kubelet-client", "kube-apiserver-kubelet-client",
                                   organizations=("system:masters",))
        sa_public, sa_private = pki.service_account_keys()
        store_pki = PKI(self.root / "store-api", name="agentrun-store-api-ca")
        # Runners reach it on loopback; the API server reaches the transcript API at this
        # host's address, verifying the name of the APIService's Service.
        cert, key = store_pki.issue(
            "tls", "agentrun-store", server=True,
            hosts=("127.0.0.1", "localhost", "::1",
                   *((self.host_address,) if self.host_address else ()),
                   *transcript_api.SERVICE_NAMES))
        self.store_api_tls = ServingPair(store_pki.ca_cert, cert, key)
        front_pki = PKI(self.root / "front-proxy", name="front-proxy-ca")
        proxy_cert, proxy_key = front_pki.issue("front-proxy-client", "front-proxy-client")
        self.front_proxy = ServingPair(front_pki.ca_cert, proxy_cert, proxy_key)

        etcd_port, etcd_peer = free_port(), free_port()
        etcd = self._spawn("etcd", [
            "--name=default",
            f"--data-dir={self.root / 'etcd'}",
            f"--listen-client-urls=http://127.0.0.1:{etcd_port}",
            f"--advertise-client-urls=http://127.0.0.1:{etcd_port}",
            f"--listen-peer-urls=http://127.0.0.1:{etcd_peer}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{etcd_peer}",
            f"--initial-cluster=default=http://127.0.0.1:{etcd_peer}",
            "--unsafe-no-fsync=true",
            "--log-level=warn",
        ])
        wait_for(lambda: self._http_ok(etcd, f"http://127.0.0.1:{etcd_port}/health"),
                 timeout=60, what="etcd")

        self.port = free_port()
        apiserver = self._spawn("kube-apiserver", [
            f"--etcd-servers=http://127.0.0.1:{etcd_port}",
            f"--cert-dir={self.root / 'apiserver-certs'}",
            f"--tls-cert-file={serving[0]}",
            f"--tls-private-key-file={serving[1]}",
            f"--client-ca-file={pki.ca_cert}",
            f"--secure-port={self.port}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            # Node + NodeRestriction: a real kubelet (devtools/agentrun_devtools/realnode.py)
            # acts as system:node:<name> and may touch only its own Node and pods. The
            # development node acts as the admin and is not affected.
            "--authorization-mode=Node,RBAC",
            "--enable-admission-plugins=NodeRestriction",
            f"--kubelet-client-certificate={kubelet_client[0]}",
            f"--kubelet-client-key={kubelet_client[1]}",
            # A real node's Hostname address is its node name, which nothing resolves.
            "--kubelet-preferred-address-types=InternalIP,Hostname",
            "--service-cluster-ip-range=10.0.0.0/24",
            "--allow-privileged=true",
            "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-account-key-file={sa_public}",
            f"--service-account-signing-key-file={sa_private}",
            "--endpoint-reconciler-type=none",
            # The aggregation layer, with kubeadm's names and headers.
            f"--requestheader-client-ca-file={front_pki.ca_cert}",
            "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={proxy_cert}",
            f"--proxy-client-key-file={proxy_key}",
            "--enable-aggregator-routing=true",
            "--v=1",
        ])
        self._write_kubeconfig(self.kubeconfig, admin, pki.ca_cert)
        self._write_kubeconfig(self.operator_kubeconfig, operator, pki.ca_cert)
        wait_for(lambda: self._readyz(apiserver, admin, pki.ca_cert),
                 timeout=120, what="kube-apiserver")

        # What kube-controller-manager and kube-scheduler share: admin credentials for
        # everything, no leader election, their own serving port on loopback.
        component = [
            f"--kubeconfig={self.kubeconfig}",
            f"--authentication-kubeconfig={self.kubeconfig}",
            f"--authorization-kubeconfig={self.kubeconfig}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            "--v=1",
        ]
        if self.with_controller_manager:
            self._spawn("kube-controller-manager", [
                *component,
                f"--secure-port={free_port()}",
                f"--root-ca-file={pki.ca_cert}",
                f"--service-account-private-key-file={sa_private}",
                f"--node-monitor-grace-period={NODE_MONITOR_GRACE}",
                f"--node-monitor-period={NODE_MONITOR_PERIOD}",
            ])
        if self.with_scheduler:
            self._spawn("kube-scheduler", [*component, f"--secure-port={free_port()}"])
        if self.with_controller_manager:
            # Pods need the namespace's default ServiceAccount, which the controller
            # manager creates: wait for it so that the first test does not race it.
            wait_for(lambda: self.kubectl("get", "serviceaccount", "default",
                                          "-n", "default", check=False).returncode == 0,
                     timeout=60, what="kube-controller-manager (default ServiceAccount)")

    def stop(self) -> None:
        """Stops every process, newest first, and removes the state directory."""
        for child in reversed(self.children):
            child.stop()
        self.children.clear()
        shutil.rmtree(self.root, ignore_errors=True)

    def pids(self) -> list[int]:
        return [c.pid for c in self.children]

    @property
    def ca_cert(self) -> Path:
        return self.root / "pki" / "ca.crt"

    def issue_kubeconfig(self, stem: str, user: str, groups: tuple[str, ...] = ()) -> Path:
        """A kubeconfig (<root>/<stem>.kubeconfig) with a client certificate from this
        plane's CA for `user` in `groups`, e.g. a kubelet's system:node:<name>."""
        if self.pki is None:
            raise RuntimeError("the control plane has not been started")
        path = self.root / f"{stem}.kubeconfig"
        self._write_kubeconfig(path, self.pki.issue(stem, user, organizations=groups),
                               self.pki.ca_cert)
        return path

    # -- clients -------------------------------------------------------------------

    def kubectl(
        self,
        *args: str,
        input: str | None = None,
        as_user: str | None = None,
        as_groups: Sequence[str] = (),
        check: bool = True,
        timeout: float = 60,
    ) -> subprocess.CompletedProcess[str]:
        """Runs kubectl as the admin (or impersonating `as_user`/`as_groups`)."""
        argv = [str(self.bin / "kubectl"), f"--kubeconfig={self.kubeconfig}"]
        if as_user:
            argv.append(f"--as={as_user}")
        argv += [f"--as-group={g}" for g in as_groups]
        done = subprocess.run(
            [*argv, *args], input=input, capture_output=True, text=True, timeout=timeout
        )
        if check and done.returncode != 0:
            raise subprocess.CalledProcessError(
                done.returncode, done.args, done.stdout, done.stderr
            )
        return done

    # -- internals -----------------------------------------------------------------

    def _spawn(self, name: str, args: list[str]) -> Child:
        child = Child(name, [str(self.bin / name), *args], self.root / "logs" / f"{name}.log",
                      env={**os.environ})
        self.children.append(child)
        return child

    @staticmethod
    def _http_ok(child: Child, url: str) -> bool:
        if not child.alive():
            raise ProcessDied(f"{child.name} exited:\n{child.log_tail()}")
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)

    def _readyz(self, child: Child, admin: tuple[Path, Path], ca: Path) -> bool:
        if not child.alive():
            raise ProcessDied(f"{child.name} exited:\n{child.log_tail()}")
        context = ssl.create_default_context(cafile=str(ca))
        context.load_cert_chain(str(admin[0]), str(admin[1]))
        with urllib.request.urlopen(f"{self.server}/readyz", timeout=2, context=context) as r:
            return bool(r.status == 200)

    def _write_kubeconfig(self, path: Path, user: tuple[Path, Path], ca: Path) -> None:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "agentrun-dev", "cluster": {
                "server": self.server, "certificate-authority": str(ca)}}],
            "users": [{"name": "admin", "user": {
                "client-certificate": str(user[0]), "client-key": str(user[1])}}],
            "contexts": [{"name": "agentrun-dev", "context": {
                "cluster": "agentrun-dev", "user": "admin", "namespace": "default"}}],
            "current-context": "agentrun-dev",
        }
        # JSON is YAML; kubectl and the Python client read it as a kubeconfig.
        path.write_text(json.dumps(config, indent=2))
        path.chmod(0o600)
