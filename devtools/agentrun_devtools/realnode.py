"""A real node without Docker: containerd + runc + a bridge CNI + kubelet + kube-proxy +
CoreDNS, joined to the launcher's control plane as the Node `real-node`.

    node = RealNode(plane).start()      # waits until the Node is Ready
    node.import_image(Path("operator.oci.tar"))
    ...
    node.stop()                         # raises if anything was left behind

    python -m agentrun_devtools.realnode import-image --state .local img.tar ...
    python -m agentrun_devtools.realnode cleanup --state .local

The binaries come from devtools/realnode/build.sh (cached outside the checkout). What is
relaxed for this kind of machine (a VM with cgroup v1, no systemd, no CAP_SYS_RESOURCE,
no registry) is said next to each setting and in docs/real-node.md.

Everything the node changes on the host is kept under its state directory where the
components allow it, and undone on stop where they do not: the bridge cni0 and the pods'
veths and network namespaces, containerd's shims and the containers' processes, kubelet's
and containerd's mounts, kubelet's cgroups, the KUBE-*/CNI-* iptables chains, the sysctls
kubelet, kube-proxy and the bridge plugin set, the shims' socket directory
/run/agentrun-realnode and kubelet's /var/log/containers. `stop()` checks each of those
(`leftovers`) and raises if one remains. What start changes is recorded in
<state>/host.json first, so that `cleanup(state)` can undo it even after the owner was
killed.

Only one real node runs on a machine at a time (a lock in /run/lock): the bridge, the
iptables chains and the kube-proxy rules are the host's, not the state directory's.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from agentrun_devtools.controlplane import REPO, ControlPlane, built
from agentrun_devtools.processes import Child, ProcessDied, free_port, wait_for

BUILD_SCRIPT = REPO / "devtools" / "realnode" / "build.sh"

NODE_NAME = "real-node"
BRIDGE = "cni0"
# The pod network. The controller manager allocates no node CIDRs (no
# --allocate-node-cidrs), so the bridge plugin's host-local IPAM owns this range.
POD_CIDR = "10.88.0.0/16"
# The bridge's own address: the node's InternalIP, and where kubelet, CoreDNS and the
# API server's forwarder listen. It exists only on this host, so nothing of the node is
# reachable from outside the machine.
GATEWAY = "10.88.0.1"
PAUSE_IMAGE = "localhost/pause:3.10"
CLUSTER_DOMAIN = "cluster.local"
# The control plane's --service-cluster-ip-range.
SERVICE_CIDR = "10.0.0.0/24"
K8S_NAMESPACE = "k8s.io"  # containerd's namespace for the CRI

LOCK = Path("/run/lock/agentrun-realnode.lock")
CONTAINERD_RUN = Path("/run/containerd")  # containerd's default state; ours is elsewhere
# The shims' sockets: containerd wants their directory's path at most 42 characters long,
# too short for a state directory under /tmp.
SHIM_SOCKETS = Path("/run/agentrun-realnode")
CONTAINER_LOGS = Path("/var/log/containers")  # kubelet's, not configurable
# kubelet's device manager socket is always /var/lib/kubelet/device-plugins/kubelet.sock,
# whatever --root-dir says.
KUBELET_DEFAULT_ROOT = Path("/var/lib/kubelet")
DEVICE_SOCKET = KUBELET_DEFAULT_ROOT / "device-plugins" / "kubelet.sock"
# containerd's CNI library caches each attachment's result here, not configurable.
CNI_CACHE = Path("/var/lib/cni")
CNI_NETWORKS = ("real-node", "cni-loopback")  # ours and containerd's loopback
CGROUP_ROOT = Path("/sys/fs/cgroup")
CHAIN_PREFIXES = ("KUBE-", "CNI-")

# Everything kubelet (vm.*, kernel.*), kube-proxy (conntrack, route_localnet) and the
# bridge plugin (ip_forward) may set: read before start, written back on stop.
SYSCTLS = (
    "net/ipv4/ip_forward",
    "net/ipv4/conf/all/forwarding",
    "net/ipv4/conf/default/forwarding",
    "net/ipv4/conf/all/route_localnet",
    "net/ipv6/conf/all/forwarding",
    "net/ipv6/conf/default/forwarding",
    "net/bridge/bridge-nf-call-iptables",
    "net/bridge/bridge-nf-call-ip6tables",
    "net/netfilter/nf_conntrack_max",
    "net/netfilter/nf_conntrack_tcp_timeout_established",
    "net/netfilter/nf_conntrack_tcp_timeout_close_wait",
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
)


def binaries() -> Path:
    """The directory with the real node's binaries, building them on first use."""
    return built(BUILD_SCRIPT, "AGENTRUN_REALNODE_BIN")


def unavailable() -> str | None:
    """Why a real node cannot run on this machine, or None when it can."""
    if os.geteuid() != 0:
        return "a real node needs root (network namespaces, mounts, iptables, cgroups)"
    if not (CGROUP_ROOT / "memory").is_dir() and not (CGROUP_ROOT / "cgroup.controllers").exists():
        return "no memory cgroup controller"
    if shutil.which("go") is None:
        return "no Go toolchain to build containerd and kubelet"
    return None


# -- images ---------------------------------------------------------------------------


def build_image(tag: str, out: Path, rootfs: Path, *, entrypoint: Sequence[str],
                cmd: Sequence[str] = ()) -> Path:
    """Packages the directory `rootfs` as a one-layer image `tag` in the OCI archive `out`,
    with buildah. Storage is a throwaway directory with the vfs driver: no mounts, nothing
    in /var/lib/containers."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="agentrun-buildah-") as scratch:
        base = ["buildah", f"--root={scratch}/root", f"--runroot={scratch}/run",
                "--storage-driver=vfs"]

        def buildah(*args: str) -> str:
            done = subprocess.run([*base, *args], capture_output=True, text=True)
            if done.returncode != 0:
                raise RuntimeError(f"buildah {' '.join(args)} failed:\n{done.stderr}")
            return done.stdout.strip()

        container = buildah("from", "--pull=never", "scratch")
        try:
            buildah("add", container, f"{rootfs}/.", "/")
            buildah("config", f"--entrypoint={json.dumps(list(entrypoint))}",
                    f"--cmd={json.dumps(list(cmd))}" if cmd else "--cmd=",
                    "--os=linux", "--arch=amd64", container)
            tmp = out.with_name(f".{out.name}.tmp")
            tmp.unlink(missing_ok=True)
            buildah("commit", "--format=oci", "--rm", container, f"oci-archive:{tmp}:{tag}")
            tmp.rename(out)
        except BaseException:
            subprocess.run([*base, "rm", container], capture_output=True)
            raise
    return out


def pause_archive(bin_dir: Path) -> Path:
    """The sandbox image (the static pause binary alone), built once per bin directory."""
    out = bin_dir.parent / "images" / "pause.oci.tar"
    if out.exists():
        return out
    with tempfile.TemporaryDirectory(prefix="agentrun-pause-") as rootfs:
        shutil.copy2(bin_dir / "pause", Path(rootfs) / "pause")
        return build_image(PAUSE_IMAGE, out, Path(rootfs), entrypoint=["/pause"])


def import_image(bin_dir: Path, socket: Path, archive: Path) -> list[str]:
    """Imports an OCI (or docker) archive into containerd's CRI namespace, unpacked for
    the pods' snapshotter; returns the image names it brought."""
    done = subprocess.run(
        [str(bin_dir / "ctr"), f"--address={socket}", f"--namespace={K8S_NAMESPACE}",
         "images", "import", "--local", str(archive)],
        capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"ctr images import {archive} failed:\n{done.stderr}")
    return re.findall(r"^unpacking (\S+) ", done.stdout, re.MULTILINE)


# -- host state -----------------------------------------------------------------------


def _read_sysctl(name: str) -> str | None:
    try:
        return (Path("/proc/sys") / name).read_text().strip()
    except OSError:
        return None


def _write_sysctl(name: str, value: str) -> None:
    with contextlib.suppress(OSError):
        (Path("/proc/sys") / name).write_text(value)


def _run(*argv: str, check: bool = False, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, check=check,
                          timeout=timeout)


def _chains(family: str) -> dict[str, list[str]]:
    """Table -> the KUBE-*/CNI-* chains in it, for `iptables` or `ip6tables` (whichever
    backend the command is: kubelet and kube-proxy call the same one)."""
    found: dict[str, list[str]] = {}
    for table in ("filter", "nat", "mangle", "raw"):
        done = _run(family, "-w", "-t", table, "-S")
        names = [line.split()[1] for line in done.stdout.splitlines()
                 if line.startswith("-N ") and line.split()[1].startswith(CHAIN_PREFIXES)]
        if names:
            found[table] = names
    return found


def _remove_chains(family: str) -> None:
    """Deletes every KUBE-*/CNI-* chain and each rule that jumps to one."""
    for table, names in _chains(family).items():
        ours = set(names)
        for line in _run(family, "-w", "-t", table, "-S").stdout.splitlines():
            parts = shlex.split(line)
            if (len(parts) > 2 and parts[0] == "-A" and parts[1] not in ours
                    and any(p in ours for p in parts[2:])):
                _run(family, "-w", "-t", table, "-D", *parts[1:])
        for name in names:
            _run(family, "-w", "-t", table, "-F", name)
        for name in names:
            _run(family, "-w", "-t", table, "-X", name)


def _mounts_under(paths: Iterable[Path]) -> list[str]:
    """Mount points at or below any of `paths`, deepest first."""
    prefixes = [str(p) for p in paths]
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if any(point == p or point.startswith(p + "/") for p in prefixes):
            found.append(point)
    return sorted(set(found), key=lambda p: p.count("/"), reverse=True)


def _pids_referring_to(root: Path) -> list[int]:
    """Processes whose command line names a path inside `root` (our children and
    containerd's shims, whose -address is our socket)."""
    needle = os.fsencode(str(root))
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def _pod_cgroups() -> list[Path]:
    """kubelet's cgroups (kubepods and below) in every hierarchy, deepest first."""
    found: list[Path] = []
    for hierarchy in CGROUP_ROOT.iterdir():
        top = hierarchy / "kubepods"
        if top.is_dir():
            found += [Path(d) for d, _, _ in os.walk(top)]
    return sorted(found, key=lambda p: len(p.parts), reverse=True)


def _pod_pids() -> list[int]:
    pids: set[int] = set()
    for cgroup in _pod_cgroups():
        with contextlib.suppress(OSError, ValueError):
            pids.update(int(p) for p in (cgroup / "cgroup.procs").read_text().split())
    return sorted(pids)


def _kill(pids: Iterable[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def _link_exists(name: str) -> bool:
    return Path("/sys/class/net", name).exists()


def _veths_on_bridge() -> list[str]:
    brif = Path("/sys/class/net", BRIDGE, "brif")
    return sorted(p.name for p in brif.iterdir()) if brif.is_dir() else []


class _Record:
    """What start changed on the host, in <state>/host.json, written before each change so
    that cleanup() knows what to undo even when the owner died half-way."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.data: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}

    def set(self, key: str, value: Any) -> None:
        self.data[key] = value
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=2))
        tmp.rename(self.path)

    def get(self, key: str, default: Any = None) -> Any:
        return self.data.get(key, default)


# -- the node -------------------------------------------------------------------------


class RealNode:
    """containerd + kubelet + kube-proxy + CoreDNS on this host, as the Node `real-node`
    of `plane`."""

    def __init__(self, plane: ControlPlane, root: Path | None = None, *,
                 bin_dir: Path | None = None, ready_timeout: float = 120,
                 lock_wait: float = 0) -> None:
        self.plane = plane
        self.root = (root or Path(tempfile.mkdtemp(prefix="agentrun-node-"))).resolve()
        self.bin = bin_dir or binaries()
        self.ready_timeout = ready_timeout
        # How long start waits for another real node on this machine to stop.
        self.lock_wait = lock_wait
        self.name = NODE_NAME
        self.children: list[Child] = []
        self.socket = self.root / "containerd" / "containerd.sock"
        self.startup_seconds = 0.0
        # The host as start found it, once it held the machine (for checks after stop).
        self.sysctls_before: dict[str, str | None] = {}
        self.paths_before: dict[str, bool] = {}
        self._lock: IO[str] | None = None

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> RealNode:
        began = time.monotonic()
        try:
            self._start()
        except BaseException as e:
            logs = "\n".join(f"--- {c.name} ---\n{c.log_tail(20)}" for c in self.children)
            with contextlib.suppress(Exception):
                self.stop(check=False)
            if isinstance(e, Exception):
                raise RuntimeError(f"the real node did not start: {e}\n{logs}") from e
            raise
        self.startup_seconds = time.monotonic() - began
        return self

    def stop(self, *, check: bool = True) -> None:
        """Stops every process and undoes every host change, then removes the state
        directory. Raises RuntimeError naming what was left behind (with `check`)."""
        if self._lock is None:
            # Never started (e.g. another real node holds the machine): the host's bridge,
            # chains and pods are not ours to undo.
            for child in self.children:
                child.stop()
            self.children.clear()
            return
        # The Node goes first, so that the control plane forgets its pods at once.
        if self.plane.pki is not None and self.plane.port:
            self.plane.kubectl("delete", "node", self.name, "--ignore-not-found",
                               "--wait=false", check=False, timeout=20)
        cleanup(self.root, self.bin, self.children, locked=True)
        self.children.clear()
        self._lock.close()
        self._lock = None
        if check:
            left = leftovers(self.root)
            if left:
                raise RuntimeError("the real node left behind:\n  " + "\n  ".join(left))

    def pids(self) -> list[int]:
        return [c.pid for c in self.children]

    # -- clients -----------------------------------------------------------------------

    def import_image(self, archive: Path) -> list[str]:
        """Imports an OCI archive (e.g. from `make images`) for the node's pods."""
        return import_image(self.bin, self.socket, archive)

    def crictl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = _run(*_crictl(self.root, self.bin), *args)
        if check and done.returncode != 0:
            raise subprocess.CalledProcessError(done.returncode, done.args, done.stdout,
                                                done.stderr)
        return done

    # -- internals ---------------------------------------------------------------------

    def _start(self) -> None:
        if self.plane.pki is None:
            raise RuntimeError("the control plane is not running")
        self._lock = _take_lock(self.root, self.lock_wait)
        self.root.mkdir(parents=True, exist_ok=True)
        for family in ("iptables", "ip6tables"):
            if _chains(family):
                raise RuntimeError(
                    f"{family} already has KUBE-*/CNI-* chains ({_chains(family)}): another "
                    "Kubernetes node ran here; `python -m agentrun_devtools.realnode cleanup "
                    "--state DIR` removes what a crashed one left")
        if _link_exists(BRIDGE):
            raise RuntimeError(f"the interface {BRIDGE} exists already")

        record = _Record(self.root / "host.json")
        record.set("bin", str(self.bin))
        record.set("sysctls", read_sysctls())
        self.sysctls_before = record.get("sysctls")
        self.paths_before = host_paths()
        record.set("created", [str(p) for p in (CONTAINERD_RUN, CONTAINER_LOGS,
                                                KUBELET_DEFAULT_ROOT, CNI_CACHE)
                               if not p.exists()])
        record.set("bridge", BRIDGE)
        self._bridge()

        pause = pause_archive(self.bin)
        node_kubeconfig = self.plane.issue_kubeconfig(
            "real-node", f"system:node:{self.name}", ("system:nodes",))
        # kube-proxy's own identity: the default ClusterRoleBinding system:node-proxier
        # names the user system:kube-proxy.
        proxy_kubeconfig = self.plane.issue_kubeconfig("kube-proxy", "system:kube-proxy")

        self._containerd()
        self.import_image(pause)
        self._api_forwarder()
        self._coredns()
        kubelet = self._kubelet(node_kubeconfig)
        # kube-proxy after the Node exists: it reads the node's IPs once, and exits (to be
        # restarted) when they change from none to some.
        self._wait_node(kubelet, "registered", lambda _: True)
        self._kube_proxy(proxy_kubeconfig)
        self._wait_node(kubelet, "Ready", lambda status: status == "True")

    def _spawn(self, name: str, argv: list[str]) -> Child:
        # The bin directory first: kubelet and containerd look plugins and shims up there.
        env = {**os.environ, "PATH": f"{self.bin}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
        child = Child(name, argv, self.root / "logs" / f"{name}.log", env=env)
        self.children.append(child)
        return child

    def _alive(self, child: Child) -> None:
        if not child.alive():
            raise ProcessDied(f"{child.name} exited:\n{child.log_tail()}")

    def _bridge(self) -> None:
        """The pod bridge, made before any pod so that CoreDNS, kubelet and the API
        forwarder can listen on its address from the start. The bridge plugin adopts it."""
        _run("ip", "link", "add", BRIDGE, "type", "bridge", check=True)
        _run("ip", "addr", "add", f"{GATEWAY}/{POD_CIDR.split('/')[1]}", "dev", BRIDGE,
             check=True)
        _run("ip", "link", "set", BRIDGE, "up", check=True)

    def _containerd(self) -> None:
        base = self.root / "containerd"
        cni = self.root / "cni"
        (cni / "net.d").mkdir(parents=True, exist_ok=True)
        (cni / "net.d" / "10-real-node.conflist").write_text(json.dumps({
            "cniVersion": "1.0.0",
            "name": "real-node",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": BRIDGE,
                    "isGateway": True,
                    # No masquerading: nothing leaves this host, and without it the
                    # plugin adds no CNI-* chains.
                    "ipMasq": False,
                    # A pod reaches itself through its own Service.
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": POD_CIDR, "gateway": GATEWAY}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "dataDir": str(cni / "ipam"),
                    },
                },
                {"type": "portmap", "capabilities": {"portMappings": True}},
            ],
        }, indent=2))
        config = f"""\
version = 4
root = "{base / 'root'}"
state = "{base / 'state'}"
# Plugins that write outside root/state or that no pod here uses.
disabled_plugins = [
  "io.containerd.nri.v1.nri",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.blockfile",
  "io.containerd.snapshotter.v1.erofs",
  "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.internal.v1.tracing",
]

# Nothing from /etc/containerd.
imports = []

[plugins."io.containerd.server.v1.grpc"]
  address = "{self.socket}"

[plugins."io.containerd.server.v1.ttrpc"]
  address = "{self.socket}.ttrpc"

[plugins."io.containerd.server.v1.debug"]
  address = ""

[plugins."io.containerd.server.v1.metrics"]
  address = ""

# The shims' sockets (by default in /run/containerd/s).
[plugins."io.containerd.shim.v1.manager"]
  socket_dir = "{SHIM_SOCKETS / 's'}"

[plugins."io.containerd.internal.v1.opt"]
  path = "{base / 'opt'}"

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"

# No registry is reachable: the sandbox image is imported, and pinned so that kubelet's
# image garbage collection keeps it.
[plugins."io.containerd.cri.v1.images".pinned_images]
  sandbox = "{PAUSE_IMAGE}"

[plugins."io.containerd.cri.v1.runtime"]
  # Root lacks CAP_SYS_RESOURCE here, so lowering a process's oom_score_adj fails
  # ("failed to update /proc/self/oom_score_adj: Permission denied"): keep a
  # container's at least at containerd's own.
  restrict_oom_score_adj = true
  # Pods' network namespaces are mounted under our state directory, not /run/netns.
  netns_mounts_under_state_dir = true

[plugins."io.containerd.cri.v1.runtime".cni]
  bin_dirs = ["{self.bin}"]
  conf_dir = "{cni / 'net.d'}"

[plugins."io.containerd.cri.v1.runtime".containerd]
  default_runtime_name = "runc"

[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
  # Debian's runc (`go install` of runc is refused: replace directives in its go.mod).
  BinaryName = "/usr/sbin/runc"
  # PID 1 is not systemd: runc makes cgroups itself (kubelet: cgroupDriver cgroupfs).
  SystemdCgroup = false
  Root = "{base / 'runc'}"

[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
"""
        (base).mkdir(parents=True, exist_ok=True)
        (base / "config.toml").write_text(config)
        containerd = self._spawn("containerd", [
            str(self.bin / "containerd"), f"--config={base / 'config.toml'}",
            "--log-level=warn"])

        def up() -> bool:
            self._alive(containerd)
            return self.crictl("info", check=False).returncode == 0

        wait_for(up, timeout=60, what="containerd", interval=0.25)

    def _api_forwarder(self) -> None:
        """The API server listens on loopback only, which pods cannot reach: a forwarder on
        the bridge, and the `kubernetes` Service's endpoints pointing at it (the control
        plane runs with --endpoint-reconciler-type=none). Pods then reach the API at
        https://kubernetes.default.svc (10.0.0.1, in the serving certificate)."""
        port = self.plane.port
        forwarder = self._spawn("api-forwarder", [
            "socat", f"TCP-LISTEN:{port},bind={GATEWAY},reuseaddr,fork",
            f"TCP:127.0.0.1:{port}"])
        slice_ = {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {"name": "kubernetes", "namespace": "default", "labels": {
                "kubernetes.io/service-name": "kubernetes",
                "endpointslice.kubernetes.io/managed-by": "realnode.agentrun.dev"}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": [GATEWAY], "conditions": {"ready": True}}],
            "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
        }
        self.plane.kubectl("apply", "-f", "-", input=json.dumps(slice_))
        self._alive(forwarder)

    def _coredns(self) -> None:
        ready_port = free_port()
        corefile = self.root / "coredns" / "Corefile"
        corefile.parent.mkdir(parents=True, exist_ok=True)
        # Only the cluster's names: there is no network beyond this machine to forward
        # anything else to, so other names fail (SERVFAIL) at once.
        corefile.write_text(f"""\
.:53 {{
    bind {GATEWAY}
    errors
    ready 127.0.0.1:{ready_port}
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        kubeconfig {self.plane.kubeconfig}
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 5
    }}
}}
""")
        coredns = self._spawn("coredns", [str(self.bin / "coredns"), f"-conf={corefile}"])

        def ready() -> bool:
            self._alive(coredns)
            with urllib.request.urlopen(f"http://127.0.0.1:{ready_port}/ready",
                                        timeout=2) as r:
                return bool(r.status == 200)

        wait_for(ready, timeout=60, what="CoreDNS")

    def _kube_proxy(self, kubeconfig: Path) -> None:
        health = free_port()
        config = self.root / "kube-proxy.yaml"
        config.write_text(json.dumps({
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "clientConnection": {"kubeconfig": str(kubeconfig)},
            "hostnameOverride": self.name,
            "mode": "iptables",
            "clusterCIDR": POD_CIDR,
            "bindAddress": GATEWAY,
            "healthzBindAddress": f"127.0.0.1:{health}",
            "metricsBindAddress": f"127.0.0.1:{free_port()}",
            # Leave the host's conntrack table size and timeouts as they are.
            "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s",
                          "tcpCloseWaitTimeout": "0s"},
            # NodePorts on 127.0.0.1 would need net.ipv4.conf.all.route_localnet=1.
            "iptables": {"localhostNodePorts": False},
            "nodePortAddresses": [f"{GATEWAY}/32"],
        }, indent=2))
        proxy = self._spawn("kube-proxy", [
            str(self.bin / "kube-proxy"), f"--config={config}", "--v=1"])

        def healthy() -> bool:
            self._alive(proxy)
            with urllib.request.urlopen(f"http://127.0.0.1:{health}/livez", timeout=2) as r:
                return bool(r.status == 200)

        wait_for(healthy, timeout=60, what="kube-proxy")

    def _wait_node(self, kubelet: Child, what: str, ok: Callable[[str], bool]) -> None:
        def check() -> bool:
            self._alive(kubelet)
            done = self.plane.kubectl(
                "get", "node", self.name, "-o",
                "jsonpath={.status.conditions[?(@.type=='Ready')].status}", check=False)
            return done.returncode == 0 and ok(done.stdout.strip())

        wait_for(check, timeout=self.ready_timeout, what=f"node {self.name} {what}",
                 interval=0.5)

    def _kubelet(self, kubeconfig: Path) -> Child:
        state = self.root / "kubelet"
        state.mkdir(parents=True, exist_ok=True)
        config = self.root / "kubelet.yaml"
        config.write_text(json.dumps({
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "containerRuntimeEndpoint": f"unix://{self.socket}",
            "imageServiceEndpoint": f"unix://{self.socket}",
            # The machine has cgroup v1 (hybrid: v1 controllers, an empty cgroup2 at
            # /sys/fs/cgroup/unified); kubelet refuses cgroup v1 unless told not to.
            "failCgroupV1": False,
            # No systemd as PID 1: kubelet and runc manage cgroupfs directly.
            "cgroupDriver": "cgroupfs",
            # kubelet raises its open-files limit to 1,000,000 by default; without
            # CAP_SYS_RESOURCE it cannot go past the hard limit, 20000 here.
            "maxOpenFiles": 20000,
            # Its own oom_score_adj (-999 by default) cannot be lowered without
            # CAP_SYS_RESOURCE either; 0 leaves it where it is, without a warning.
            "oomScoreAdj": 0,
            # kubelet sets vm.overcommit_memory, kernel.panic, kernel.panic_on_oops and the
            # kernel.keys limits to its defaults rather than refusing to start; the node
            # writes the host's values back on stop (see SYSCTLS).
            "protectKernelDefaults": False,
            "address": GATEWAY,
            "port": free_port(),
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": free_port(),
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": True},
                "x509": {"clientCAFile": str(self.plane.ca_cert)},
            },
            "authorization": {"mode": "Webhook"},
            "clusterDomain": CLUSTER_DOMAIN,
            # CoreDNS runs as a host process on the bridge, not behind a Service.
            "clusterDNS": [GATEWAY],
            "podLogsDir": str(self.root / "pod-logs"),
            "volumePluginDir": str(state / "volume-plugins"),
            "registerNode": True,
            "rotateCertificates": False,
            "serverTLSBootstrap": False,
            "nodeStatusUpdateFrequency": "2s",
            "nodeStatusReportFrequency": "10s",
            # The launcher's controller manager marks a node NotReady after 8 s without a
            # heartbeat (controlplane.NODE_MONITOR_GRACE; the default is 40 s), and the
            # kubelet renews its Lease every quarter of this duration (10 s by default):
            # then the node flapped to Unknown every few heartbeats, which marks every pod
            # on it not ready, empties the Services' endpoints (a client of the store was
            # refused) and starts the taint manager's eviction clocks. 8 s renews every
            # 2 s: four heartbeats per grace period, the defaults' ratio.
            "nodeLeaseDurationSeconds": 8,
            "syncFrequency": "10s",
            "fileCheckFrequency": "10s",
            "imageMinimumGCAge": "24h",
            # The host's disk is shared with everything else on the machine (build
            # caches, other clusters): kubelet's default thresholds are percentages of it
            # (imagefs.available < 15%, image GC from 85% used), which a busy development
            # machine crosses without this node using much. Then it evicts every pod
            # (DiskPressure) and garbage-collects the imported images, which no registry
            # can bring back. Absolute thresholds, and no image GC.
            "evictionHard": {"memory.available": "100Mi", "nodefs.available": "2Gi",
                             "imagefs.available": "2Gi", "nodefs.inodesFree": "5%"},
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "failSwapOn": False,
            "resolvConf": "/etc/resolv.conf",
            "logging": {"format": "text"},
        }, indent=2))
        return self._spawn("kubelet", [
            str(self.bin / "kubelet"), f"--config={config}", f"--kubeconfig={kubeconfig}",
            f"--root-dir={state}", f"--cert-dir={state / 'pki'}",
            f"--hostname-override={self.name}", f"--node-ip={GATEWAY}", "--v=1"])


def _crictl(root: Path, bin_dir: Path) -> list[str]:
    """crictl against the node's containerd, with a config of its own (else it looks for
    /etc/crictl.yaml and warns)."""
    config = root / "crictl.yaml"
    if not config.exists():
        socket = root / "containerd" / "containerd.sock"
        config.write_text(json.dumps({"runtime-endpoint": f"unix://{socket}",
                                      "image-endpoint": f"unix://{socket}"}))
    return [str(bin_dir / "crictl"), f"--config={config}"]


def _take_lock(root: Path, wait: float = 0) -> IO[str]:
    """The machine's real-node lock, waiting up to `wait` seconds for it."""
    LOCK.parent.mkdir(parents=True, exist_ok=True)
    handle = open(LOCK, "a+")  # noqa: SIM115 - held until stop
    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() < deadline:
                time.sleep(1)
                continue
            handle.seek(0)
            holder = handle.read().strip()
            handle.close()
            raise RuntimeError(
                f"a real node is already running on this machine ({holder})") from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"pid {os.getpid()} state {root}\n")
    handle.flush()
    return handle


# -- teardown -------------------------------------------------------------------------


def cleanup(root: Path, bin_dir: Path | None = None, children: Sequence[Child] = (), *,
            locked: bool = False) -> None:
    """Undoes everything a real node with state directory `root` did on the host, whether
    it is still running (its `children` given, the machine's lock held: `locked`) or its
    owner died, then removes `root`. Safe to run twice. Refuses (RuntimeError) while
    another real node holds the machine: the bridge, chains and pods would be its own."""
    root = root.resolve()
    if not locked:
        with _take_lock(root):
            cleanup(root, bin_dir, children, locked=True)
        return
    record = _Record(root / "host.json")
    if bin_dir is None and record.get("bin"):
        bin_dir = Path(record.get("bin"))
    socket = root / "containerd" / "containerd.sock"
    by_name = {c.name: c for c in children}

    if "kubelet" in by_name:
        by_name["kubelet"].stop(grace=10)
    # Pods first, through containerd while it runs: CNI DEL releases each pod's address,
    # veth and network namespace; the shims unmount the containers' rootfs.
    if bin_dir is not None and socket.exists():
        with contextlib.suppress(subprocess.TimeoutExpired):
            _run(*_crictl(root, bin_dir), "--timeout=20s", "rmp", "--all", "--force",
                 timeout=90)
    for name in ("kube-proxy", "coredns", "api-forwarder", "containerd"):
        if name in by_name:
            by_name[name].stop(grace=10)
    for child in children:
        child.stop()
    if bin_dir is not None:
        # kube-proxy's own undo of its iptables rules (all modes).
        with contextlib.suppress(subprocess.TimeoutExpired):
            _run(str(bin_dir / "kube-proxy"), "--cleanup", "--v=0", timeout=60)

    # Whatever still runs: shims and our servers (their argv names `root`), and the
    # containers' processes (in kubelet's cgroups).
    for _ in range(3):
        strays = _pids_referring_to(root) + _pod_pids()
        if not strays:
            break
        _kill(strays)
        time.sleep(0.5)

    for point in _mounts_under([root]):
        if _run("umount", point).returncode != 0:
            _run("umount", "--lazy", point)
    if _link_exists(BRIDGE):
        for veth in _veths_on_bridge():
            _run("ip", "link", "del", veth)
        _run("ip", "link", "del", BRIDGE)
    for family in ("iptables", "ip6tables"):
        _remove_chains(family)
    for cgroup in _pod_cgroups():
        with contextlib.suppress(OSError):
            cgroup.rmdir()
    for name, value in (record.get("sysctls") or {}).items():
        if value is not None and _read_sysctl(name) != value:
            _write_sysctl(name, value)

    created = [Path(p) for p in record.get("created", [])]
    for path in [*created, SHIM_SOCKETS]:
        shutil.rmtree(path, ignore_errors=True)
    for link in _our_container_logs(root):
        link.unlink()
    for path in _our_host_files():
        path.unlink(missing_ok=True)

    if not _mounts_under([root]):
        shutil.rmtree(root, ignore_errors=True)


def _our_container_logs(root: Path) -> list[Path]:
    """kubelet's links in /var/log/containers to logs under `root`."""
    if not CONTAINER_LOGS.is_dir():
        return []
    return [link for link in CONTAINER_LOGS.iterdir()
            if link.is_symlink() and os.readlink(link).startswith(str(root))]


def _our_host_files() -> list[Path]:
    """Files a real node leaves in fixed places: kubelet's device socket, cached CNI
    results of its network (only one real node runs at a time)."""
    found = [DEVICE_SOCKET] if DEVICE_SOCKET.exists() or DEVICE_SOCKET.is_symlink() else []
    results = CNI_CACHE / "results"
    if results.is_dir():
        found += [p for p in results.iterdir() if p.name.startswith(CNI_NETWORKS)]
    return found


def leftovers(root: Path) -> list[str]:
    """What a stopped real node with state directory `root` left on the host; empty
    when nothing."""
    root = root.resolve()
    found = []
    pids = _pids_referring_to(root)
    if pids:
        found.append(f"processes naming {root}: {pids}")
    if _pod_pids():
        found.append(f"processes in kubepods cgroups: {_pod_pids()}")
    if _pod_cgroups():
        found.append(f"cgroups: {[str(c) for c in _pod_cgroups()[:5]]}")
    mounts = _mounts_under([root, CONTAINERD_RUN, CONTAINER_LOGS, SHIM_SOCKETS])
    if mounts:
        found.append(f"mounts: {mounts}")
    if SHIM_SOCKETS.exists():
        found.append(f"shim socket directory {SHIM_SOCKETS}")
    if _link_exists(BRIDGE):
        found.append(f"interface {BRIDGE} (ports {_veths_on_bridge()})")
    veths = [p.name for p in Path("/sys/class/net").iterdir() if p.name.startswith("veth")]
    if veths:
        found.append(f"veth interfaces: {veths}")
    for family in ("iptables", "ip6tables"):
        if _chains(family):
            found.append(f"{family} chains: {_chains(family)}")
    if _our_container_logs(root):
        found.append(f"container log links: {_our_container_logs(root)}")
    if _our_host_files():
        found.append(f"files: {[str(p) for p in _our_host_files()]}")
    if root.exists():
        found.append(f"state directory {root}")
    return found


def sysctl_changes(before: Mapping[str, str | None]) -> dict[str, tuple[str | None, str | None]]:
    """The SYSCTLS whose value now differs from `before`: name -> (before, now)."""
    now = {name: _read_sysctl(name) for name in SYSCTLS}
    return {n: (before.get(n), now[n]) for n in SYSCTLS if before.get(n) != now[n]}


def read_sysctls() -> dict[str, str | None]:
    return {name: _read_sysctl(name) for name in SYSCTLS}


# Where containerd, kubelet and the CNI plugins write by default: each either is kept
# under the state directory by the node's configuration or removed on stop.
HOST_PATHS = ("/run/containerd", "/var/lib/containerd", "/var/log/containers",
              "/var/log/pods", "/var/lib/kubelet", "/var/lib/cni", "/run/netns",
              "/var/run/nri", "/opt/containerd", "/etc/containerd")


def host_paths() -> dict[str, bool]:
    """Which of HOST_PATHS exist."""
    return {p: os.path.lexists(p) for p in HOST_PATHS}


# -- command line ---------------------------------------------------------------------


def _node_root(state: Path) -> Path:
    """Where `cluster up --node real` keeps the node's state."""
    return state.resolve() / "realnode"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="the agentrun real node")
    sub = parser.add_subparsers(dest="command", required=True)
    imp = sub.add_parser("import-image",
                         help="import OCI archives into the running real node's containerd")
    imp.add_argument("--state", type=Path, default=REPO / ".local")
    imp.add_argument("archives", type=Path, nargs="+")
    clean = sub.add_parser("cleanup", help="undo what a real node left on the host")
    clean.add_argument("--state", type=Path, default=REPO / ".local")
    args = parser.parse_args(argv)
    root = _node_root(args.state)
    if args.command == "import-image":
        socket = root / "containerd" / "containerd.sock"
        if not socket.exists():
            print(f"no real node running under {args.state} ({socket} missing)",
                  file=sys.stderr)
            return 1
        bin_dir = Path(_Record(root / "host.json").get("bin") or binaries())
        for archive in args.archives:
            names = import_image(bin_dir, socket, archive.resolve())
            print(f"{archive}: {', '.join(names) or '(no image names)'}")
        return 0
    try:
        cleanup(root)
    except RuntimeError as e:
        print(e, file=sys.stderr)
        return 1
    left = leftovers(root)
    for line in left:
        print(f"left: {line}", file=sys.stderr)
    return 1 if left else 0


if __name__ == "__main__":
    sys.exit(main())
