"""The real node (containerd + runc + bridge CNI + kubelet + kube-proxy + CoreDNS) joined
to a control plane of its own: pods run from an image built here, reach a Service by its
DNS name, are OOM-killed by their memory limit and evicted through the Eviction API; and
stopping the node leaves nothing on the host.

The tests share one node, in file order; the last one stops it. They skip (with the
reason) only where a real node cannot run at all (not root, no memory cgroup, no Go).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agentrun_devtools.controlplane import ControlPlane
from agentrun_devtools.processes import wait_for
from agentrun_devtools.realnode import (
    BRIDGE,
    RealNode,
    build_image,
    host_paths,
    leftovers,
    sysctl_changes,
    unavailable,
)

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.realnode,
    pytest.mark.skipif(unavailable() is not None, reason=str(unavailable())),
]

IMAGE = "localhost/agentrun-test-busybox:1"
BUSYBOX = Path("/bin/busybox")


class _Node:
    def __init__(self, plane: ControlPlane, node: RealNode) -> None:
        self.plane, self.node = plane, node
        self.pids: list[int] = []
        self.stopped = False


def busybox_archive(directory: Path) -> Path:
    """Debian's busybox-static alone in an image, every applet linked in /bin."""
    if not BUSYBOX.exists():
        pytest.fail(f"{BUSYBOX} missing: devtools/realnode/build.sh installs busybox-static")
    rootfs = directory / "rootfs"
    (rootfs / "bin").mkdir(parents=True)
    (rootfs / "tmp").mkdir()
    shutil.copy2(BUSYBOX, rootfs / "bin" / "busybox")
    applets = subprocess.run([str(BUSYBOX), "--list"], capture_output=True, text=True,
                             check=True).stdout.split()
    for applet in applets:
        if applet != "busybox":
            (rootfs / "bin" / applet).symlink_to("busybox")
    return build_image(IMAGE, directory / "busybox.oci.tar", rootfs,
                       entrypoint=[], cmd=["/bin/sh"])


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Node]:
    # A control plane of its own: the session's has the development node, and its
    # scheduler would place other tests' pods here.
    plane = ControlPlane(tmp_path_factory.mktemp("real-cp")).start()
    # One real node per machine: wait for one that another run has going.
    state = _Node(plane, RealNode(plane, tmp_path_factory.mktemp("real-node"), lock_wait=600))
    try:
        state.node.start()
        state.pids = state.node.pids()
        print(f"real node Ready in {state.node.startup_seconds:.1f}s")
        names = state.node.import_image(busybox_archive(tmp_path_factory.mktemp("images")))
        assert IMAGE in names
        yield state
    finally:
        if not state.stopped:
            state.node.stop(check=False)
        plane.stop()


def _apply(plane: ControlPlane, *objects: dict[str, Any]) -> None:
    plane.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List",
                                                          "items": list(objects)}))


def _pod(name: str, script: str, *, labels: dict[str, str] | None = None,
         restart: str = "Never", resources: dict[str, Any] | None = None,
         grace: int = 30) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": labels or {}},
        "spec": {
            "nodeName": "real-node",
            "restartPolicy": restart,
            "terminationGracePeriodSeconds": grace,
            "containers": [{
                "name": "main",
                "image": IMAGE,
                "imagePullPolicy": "Never",
                "command": ["/bin/sh", "-c", script],
                "resources": resources or {},
            }],
        },
    }


def _get(plane: ControlPlane, kind: str, name: str) -> dict[str, Any]:
    return dict(json.loads(plane.kubectl("get", kind, name, "-o", "json").stdout))


def _phase(plane: ControlPlane, name: str) -> str:
    return str(_get(plane, "pod", name).get("status", {}).get("phase", ""))


def _wait_phase(plane: ControlPlane, name: str, phases: set[str], timeout: float) -> str:
    wait_for(lambda: _phase(plane, name) in phases, timeout=timeout,
             what=f"pod {name} in {sorted(phases)}", interval=0.5)
    return _phase(plane, name)


def test_node_is_ready_with_the_real_runtime(real: _Node) -> None:
    node = _get(real.plane, "node", "real-node")
    info = node["status"]["nodeInfo"]
    assert info["containerRuntimeVersion"].startswith("containerd://")
    assert info["kubeletVersion"] == "v1.37.2"
    assert {"type": "InternalIP", "address": "10.88.0.1"} in node["status"]["addresses"]


def test_pod_reaches_a_service_by_its_dns_name(real: _Node) -> None:
    plane = real.plane
    _apply(plane,
           _pod("web", "mkdir -p /tmp/www && echo served-by-web > /tmp/www/index.html && "
                       "exec httpd -f -p 8080 -h /tmp/www",
                labels={"app": "web"}, restart="Always", grace=1),
           {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"selector": {"app": "web"},
                     "ports": [{"port": 80, "targetPort": 8080}]}})
    _wait_phase(plane, "web", {"Running"}, timeout=90)
    cluster_ip = _get(plane, "service", "web")["spec"]["clusterIP"]
    # The short name goes through the pod's search path (default.svc.cluster.local).
    # (busybox's nc, not its wget: that one crashes in an image without a libc.)
    _apply(plane, _pod("client", "nslookup web.default.svc.cluster.local; "
                                 "for i in $(seq 30); do "
                                 "printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 2 web 80 "
                                 "| grep served-by && exit 0; sleep 1; done; exit 1"))
    phase = _wait_phase(plane, "client", {"Succeeded", "Failed"}, timeout=120)
    logs = plane.kubectl("logs", "client").stdout
    assert phase == "Succeeded", logs
    assert cluster_ip in logs  # nslookup's answer: the Service's ClusterIP
    assert "served-by-web" in logs
    resolv = plane.kubectl("exec", "web", "--", "cat", "/etc/resolv.conf").stdout
    assert "nameserver 10.88.0.1" in resolv
    plane.kubectl("delete", "pod", "client", "web", "--wait=true", "--timeout=60s")


def test_a_pod_over_its_memory_limit_is_oom_killed(real: _Node) -> None:
    plane = real.plane
    # dd reads 64 MiB of zeros into one buffer: the whole buffer becomes resident.
    _apply(plane, _pod("hog", "exec dd if=/dev/zero of=/dev/null bs=64M count=1",
                       resources={"limits": {"memory": "32Mi"},
                                  "requests": {"memory": "32Mi"}}))
    phase = _wait_phase(plane, "hog", {"Succeeded", "Failed"}, timeout=90)
    status = _get(plane, "pod", "hog")["status"]
    terminated = status["containerStatuses"][0]["state"]["terminated"]
    assert (phase, terminated["reason"], terminated["exitCode"]) == ("Failed", "OOMKilled", 137)
    plane.kubectl("delete", "pod", "hog", "--wait=true", "--timeout=60s")


def test_the_eviction_api_removes_a_pod(real: _Node) -> None:
    plane = real.plane
    _apply(plane, _pod("victim", "exec sleep 3600", grace=2))
    _wait_phase(plane, "victim", {"Running"}, timeout=90)
    uid = _get(plane, "pod", "victim")["metadata"]["uid"]
    assert real.node.crictl("ps", "--label", f"io.kubernetes.pod.uid={uid}", "-q").stdout
    eviction = {"apiVersion": "policy/v1", "kind": "Eviction",
                "metadata": {"name": "victim", "namespace": "default"}}
    plane.kubectl("create", "--raw", "/api/v1/namespaces/default/pods/victim/eviction",
                  "-f", "-", input=json.dumps(eviction))
    wait_for(lambda: plane.kubectl("get", "pod", "victim", check=False).returncode != 0
             and "NotFound" in plane.kubectl("get", "pod", "victim", check=False).stderr,
             timeout=60, what="evicted pod gone", interval=0.5)
    # The kubelet really stopped it: no running container and no ready sandbox of that
    # pod in containerd (kubelet's garbage collection removes them later).
    label = f"io.kubernetes.pod.uid={uid}"
    wait_for(lambda: not real.node.crictl("ps", "--label", label, "-q").stdout.strip()
             and not real.node.crictl("pods", "--label", label, "--state=ready",
                                      "-q").stdout.strip(),
             timeout=30, what="the evicted pod's containers stopped")


def test_a_second_real_node_is_refused_and_leaves_the_first_alone(
        real: _Node, tmp_path: Path) -> None:
    second = RealNode(real.plane, tmp_path / "second", bin_dir=real.node.bin)
    with pytest.raises(RuntimeError, match="already running on this machine"):
        second.start()
    assert Path("/sys/class/net", BRIDGE).exists()
    assert real.node.crictl("info").returncode == 0
    ready = real.plane.kubectl("get", "node", "real-node", "-o",
                               "jsonpath={.status.conditions[?(@.type=='Ready')].status}")
    assert ready.stdout == "True"


def test_stop_leaves_nothing_behind(real: _Node) -> None:
    # Something to clean up: a running pod with its sandbox, veth, mounts and cgroups.
    _apply(real.plane, _pod("left-running", "exec sleep 3600", grace=30))
    _wait_phase(real.plane, "left-running", {"Running"}, timeout=90)
    assert Path("/sys/class/net", BRIDGE, "brif").exists()
    began = time.monotonic()
    real.stopped = True
    real.node.stop()  # raises if anything is left
    print(f"real node stopped in {time.monotonic() - began:.1f}s")
    assert leftovers(real.node.root) == []
    assert real.node.sysctls_before  # what start found, once it held the machine
    assert sysctl_changes(real.node.sysctls_before) == {}
    assert not [p for p in real.pids if Path(f"/proc/{p}").exists()
                and "Z" not in Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1][:3]]
    assert host_paths() == real.node.paths_before
