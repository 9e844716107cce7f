"""`make dev-cluster` / `make dev-cluster-down`: the development cluster in the background.

    python -m agentrun_devtools.cluster up   [--state .local] [--node dev|real]
    python -m agentrun_devtools.cluster down [--state .local]
    python -m agentrun_devtools.cluster status

`up` starts a supervisor process in the background that runs the control plane (etcd,
kube-apiserver, kube-controller-manager, kube-scheduler) and a node, writes the admin
kubeconfig to .local/kubeconfig and links kubectl and helm into .local/bin/. It registers
the transcript API (APIService v1alpha1.store.agentrun.dev, agentrun_devtools.transcript_api)
at this host's address and a free port, written to .local/store-api/transcript-api-listen,
where `make run`'s store API serves it (the Makefile reads it), and the trigger
receiver's serving pair and credential (.local/receiver/, .local/receiver.kubeconfig), which
`make run` starts it with. The node is
the development node `dev-node` by default; with `--node real`, the real node `real-node`
(containerd, kubelet, kube-proxy, CoreDNS: agentrun_devtools.realnode, state in
.local/realnode). Running `up` twice is harmless. `down` stops the supervisor (which stops
everything it started), undoes what a real node left on the host if the supervisor could
not, and removes the cluster's state, including the embedded store .local/agentrun.db.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from agentrun.vocabulary import RECEIVER_GROUP
from agentrun_devtools import kueue, realnode, runner_launcher, transcript_api
from agentrun_devtools.certs import PKI
from agentrun_devtools.controlplane import REPO, ControlPlane, binaries
from agentrun_devtools.processes import (
    Child,
    ProcessDied,
    free_port,
    running_pid,
    stop_pid,
    wait_for,
)

DEFAULT_STATE = REPO / ".local"


def devtools_env() -> dict[str, str]:
    """This environment, with the development tooling importable (it is not installed)."""
    path = os.pathsep.join(
        p for p in (str(REPO / "devtools"), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path}


def start_dev_node(plane: ControlPlane, work_dir: Path) -> Child:
    """Starts the development node against `plane` and waits until the node is Ready.

    The node starts each runner through the launcher (agentrun_devtools.runner_launcher),
    first on its pods' PATH; it is built here first, so that a machine without a C compiler
    is told so now rather than in the node's log."""
    runner_launcher.build(Path(sys.executable))
    node = Child(
        "devnode",
        [sys.executable, "-m", "agentrun_devtools.devnode",
         f"--kubeconfig={plane.kubeconfig}", f"--work-dir={work_dir}"],
        work_dir / "devnode.log",
        env=devtools_env(),
    )

    def ready() -> bool:
        if not node.alive():
            raise ProcessDied(f"development node exited:\n{node.log_tail()}")
        done = plane.kubectl(
            "get", "node", "dev-node", "-o",
            "jsonpath={.status.conditions[?(@.type=='Ready')].status}", check=False)
        return done.stdout.strip() == "True"

    wait_for(ready, timeout=60, what="development node")
    return node


class _Paths:
    def __init__(self, state: Path) -> None:
        self.state = state
        self.cluster = state / "cluster"
        self.kubeconfig = state / "kubeconfig"
        self.operator_kubeconfig = state / "operator.kubeconfig"
        self.bin = state / "bin"
        self.pid = state / "cluster.pid"
        self.ready = state / "cluster.ready"
        self.log = state / "cluster.log"
        self.pods = state / "pods"
        self.store = state / "agentrun.db"
        self.operator_pid = state / "operator.pid"
        self.operator_log = state / "operator.log"
        self.store_api_pid = state / "store-api.pid"
        self.store_api_log = state / "store-api.log"
        self.receiver_pid = state / "receiver.pid"
        self.receiver_log = state / "receiver.log"
        self.realnode = state / "realnode"
        self.store_api_tls = state / "store-api"
        self.receiver = state / "receiver"
        self.receiver_kubeconfig = state / "receiver.kubeconfig"


def _running(paths: _Paths) -> int | None:
    return running_pid(paths.pid)


def serve(paths: _Paths, node_kind: str = "dev") -> None:
    """The supervisor: runs everything until SIGTERM, then stops everything."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    plane = ControlPlane(paths.cluster).start()
    node: Child | None = None
    real: realnode.RealNode | None = None
    try:
        for source, target in ((plane.kubeconfig, paths.kubeconfig),
                               (plane.operator_kubeconfig, paths.operator_kubeconfig)):
            shutil.copy(source, target)
            target.chmod(0o600)
        # The store API's pair and CA, where `make run` gives them to the store API and the
        # operator (the CA, for runner pods) from this checkout.
        tls = plane.store_api_tls
        assert tls is not None
        paths.store_api_tls.mkdir(parents=True, exist_ok=True)
        for source, name in ((tls.ca, "ca.crt"), (tls.cert, "tls.crt"), (tls.key, "tls.key")):
            shutil.copy(source, paths.store_api_tls / name)
            (paths.store_api_tls / name).chmod(0o600)
        _receiver_files(plane, paths)
        # The transcript API: the API server proxies to where the store API serves it.
        endpoint = transcript_api.TranscriptEndpoint(plane.host_address, free_port())
        transcript_api.register(plane, endpoint)
        (paths.store_api_tls / "transcript-api-listen").write_text(endpoint.listen + "\n")
        paths.bin.mkdir(parents=True, exist_ok=True)
        for tool in ("kubectl", "helm"):
            link = paths.bin / tool
            with contextlib.suppress(FileNotFoundError):
                link.unlink()
            link.symlink_to(plane.bin / tool)
        if node_kind == "real":
            real = realnode.RealNode(plane, paths.realnode).start()
            print(f"real node {real.name} Ready in {real.startup_seconds:.1f}s", flush=True)
        else:
            node = start_dev_node(plane, paths.pods)
        paths.ready.write_text(f"{plane.server}\n")
        print(f"control plane ready in {plane.startup_seconds:.1f}s at {plane.server}",
              flush=True)
        while not stop.wait(1.0):
            watched = [*plane.children, *([node] if node else []),
                       *(real.children if real else [])]
            for child in watched:
                if not child.alive():
                    print(f"{child.name} exited:\n{child.log_tail()}", flush=True)
                    stop.set()
    finally:
        paths.ready.unlink(missing_ok=True)
        if node is not None:
            node.stop()
        if real is not None:
            real.stop(check=False)
        plane.stop()


def _receiver_files(plane: ControlPlane, paths: _Paths) -> None:
    """What `make run` starts the trigger receiver with: its own CA and a certificate for
    this host's loopback (status.url is https://127.0.0.1:<port>/...), and a credential in
    the group agentrun:receivers, which the admission policies exempt as they exempt the
    receiver's ServiceAccount in a cluster (and, like the operator's, in system:masters:
    the development cluster has no chart to give it its rights)."""
    pki = PKI(paths.receiver, name="agentrun-receiver-ca")
    pki.issue("tls", "agentrun-receiver", server=True, hosts=("127.0.0.1", "localhost"))
    (paths.receiver / "ca.key").unlink()
    issued = plane.issue_kubeconfig("receiver", "agentrun-receiver",
                                    ("system:masters", RECEIVER_GROUP))
    shutil.copy(issued, paths.receiver_kubeconfig)
    paths.receiver_kubeconfig.chmod(0o600)


def up(paths: _Paths, node_kind: str = "dev") -> int:
    if _running(paths) and paths.ready.exists():
        print(f"development cluster already running; KUBECONFIG={paths.kubeconfig}")
        return 0
    if _running(paths):
        down(paths)
    paths.state.mkdir(parents=True, exist_ok=True)
    bin_dir = binaries()  # build (or find cached) binaries in the foreground, with output
    node_args = []
    if node_kind == "real":
        reason = realnode.unavailable()
        if reason:
            print(f"no real node here: {reason}", file=sys.stderr)
            return 1
        node_args = ["--node=real", f"--realnode-bin-dir={realnode.binaries()}"]
    began = time.monotonic()
    with open(paths.log, "ab") as log:
        supervisor = subprocess.Popen(
            [sys.executable, "-m", "agentrun_devtools.cluster", "serve",
             f"--state={paths.state}", f"--bin-dir={bin_dir}", *node_args],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, env=devtools_env(),
        )
    paths.pid.write_text(str(supervisor.pid))

    def ready() -> bool:
        if supervisor.poll() is not None:
            raise ProcessDied(f"the development cluster did not start; see {paths.log}:\n"
                               + "\n".join(paths.log.read_text().splitlines()[-30:]))
        return paths.ready.exists()

    wait_for(ready, timeout=300 if node_kind == "real" else 180,
             what="development cluster", interval=0.25)
    node_name = realnode.NODE_NAME if node_kind == "real" else "dev-node"
    print(f"development cluster up in {time.monotonic() - began:.1f}s "
          f"(control plane, scheduler, controller manager, node {node_name})")
    print(f"  export KUBECONFIG={paths.kubeconfig}")
    print(f"  export PATH={paths.bin}:$PATH")
    return 0


def _stop_programs(paths: _Paths) -> None:
    """The operator, the store API and the trigger receiver the demo started in the
    background (pids in <state>/operator.pid, store-api.pid and receiver.pid)."""
    for what, pid_file, log in (("operator", paths.operator_pid, paths.operator_log),
                                ("store API", paths.store_api_pid, paths.store_api_log),
                                ("receiver", paths.receiver_pid, paths.receiver_log)):
        try:
            pid = int(pid_file.read_text())
        except (OSError, ValueError):
            continue
        stop_pid(pid, timeout=20, what=f"{what} shutdown")
        pid_file.unlink(missing_ok=True)
        log.unlink(missing_ok=True)


def down(paths: _Paths) -> int:
    _stop_programs(paths)
    # `make kueue`'s Kueue, before the API server it serves goes.
    kueue.down(kueue._Paths(paths.state), quiet=True)
    pid = _running(paths)
    if pid:
        stop_pid(pid, timeout=90, what="cluster shutdown", group=True)
    if paths.realnode.exists():
        # The supervisor undoes the real node's host changes itself; this is for the
        # one that was killed before it could.
        try:
            realnode.cleanup(paths.realnode)
        except RuntimeError as e:  # another real node holds the machine
            print(f"the real node's host changes were not undone: {e}", file=sys.stderr)
        for line in realnode.leftovers(paths.realnode):
            print(f"the real node left: {line}", file=sys.stderr)
    for path in (paths.cluster, paths.pods, paths.bin, paths.receiver):
        shutil.rmtree(path, ignore_errors=True)
    for path in (paths.kubeconfig, paths.operator_kubeconfig, paths.receiver_kubeconfig,
                 paths.pid, paths.ready, paths.store,
                 Path(f"{paths.store}-wal"), Path(f"{paths.store}-shm")):
        path.unlink(missing_ok=True)
    print("development cluster stopped and its state removed")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="the agentrun development cluster")
    parser.add_argument("command", choices=["up", "down", "status", "serve"])
    parser.add_argument("--state", type=Path, default=DEFAULT_STATE)
    parser.add_argument("--node", choices=["dev", "real"], default="dev",
                        help="dev: the development node (default); real: containerd + kubelet")
    parser.add_argument("--bin-dir", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--realnode-bin-dir", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    paths = _Paths(args.state.resolve())
    if args.command == "up":
        return up(paths, args.node)
    if args.command == "down":
        return down(paths)
    if args.command == "serve":
        if args.bin_dir:
            os.environ["AGENTRUN_CONTROLPLANE_BIN"] = str(args.bin_dir)
        if args.realnode_bin_dir:
            os.environ["AGENTRUN_REALNODE_BIN"] = str(args.realnode_bin_dir)
        serve(paths, args.node)
        return 0
    running = _running(paths) and paths.ready.exists()
    print("running" if running else "not running")
    return 0 if running else 1


if __name__ == "__main__":
    sys.exit(main())
