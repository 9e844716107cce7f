"""agentrun installed the way a platform team installs it, on a real node.

One cluster for the whole session: the launcher's control plane (etcd, kube-apiserver,
kube-controller-manager, kube-scheduler) and a real node (containerd, runc, a bridge CNI,
kubelet, kube-proxy, CoreDNS: agentrun_devtools.realnode). Then the README's "Install on
your cluster", typed as written (with KUBECONFIG pointing at this cluster): `make images`,
the archives loaded into the node's containerd, `make install`, `helm install` with the
trial Postgres. Every runner, operator, store API and Postgres process is a container.

The trial Postgres keeps its data on a PersistentVolume this fixture makes (a hostPath
under the session's directory, owned by the image's postgres uid): the cluster has no
volume provisioner.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentrun_devtools import realnode
from agentrun_devtools.controlplane import REPO, ControlPlane
from agentrun_devtools.processes import wait_for

RELEASE_NAMESPACE = "agentrun-system"
TENANTS = ("shop", "bank")
POSTGRES_UID = 999


def readme_install_block() -> list[str]:
    """The commands of README's "Install on your cluster" (its first sh block)."""
    text = (REPO / "README.md").read_text()
    section = text.split("## Install on your cluster", 1)[1].split("\n## ", 1)[0]
    block = re.findall(r"```sh\n(.*?)```", section, re.S)[0]
    joined = block.replace("\\\n", " ")
    return [line.split("  #", 1)[0].strip() for line in joined.splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


@dataclass
class Cluster:
    plane: ControlPlane
    node: realnode.RealNode
    env: dict[str, str]
    timings: dict[str, float] = field(default_factory=dict)

    def kubectl(self, *args: str, as_user: str | None = None, input: str | None = None,
                check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        argv = [str(self.plane.bin / "kubectl"), *(["--as", as_user] if as_user else []),
                *args]
        done = subprocess.run(argv, input=input, env=self.env, capture_output=True,
                              text=True, timeout=timeout)
        if check and done.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)}: {done.stderr or done.stdout}")
        return done

    def apply(self, namespace: str, obj: dict[str, Any], *, as_user: str | None = None) -> None:
        self.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(obj),
                     as_user=as_user)

    def get(self, kind: str, name: str, namespace: str) -> dict[str, Any]:
        done = self.kubectl("get", kind, name, "-n", namespace, "-o", "json", check=False)
        return json.loads(done.stdout) if done.returncode == 0 else {}

    def wait(self, what: str, check: Callable[[], bool], timeout: float = 180) -> None:
        wait_for(check, timeout=timeout, what=what, interval=0.5)

    def wait_phase(self, kind: str, name: str, namespace: str, phases: tuple[str, ...],
                   timeout: float = 180) -> dict[str, Any]:
        seen: dict[str, Any] = {}

        def reached() -> bool:
            seen.update(self.get(kind, name, namespace))
            return (seen.get("status") or {}).get("phase") in phases

        try:
            self.wait(f"{kind} {namespace}/{name} {'/'.join(phases)}", reached, timeout)
        except TimeoutError as e:
            raise AssertionError(f"{e}; status: {json.dumps(seen.get('status'))}") from e
        return seen

    def store_url(self) -> str:
        """The trial Postgres, as this host reaches it: the Secret's URL with the Service's
        ClusterIP (kube-proxy's rules serve the host's own connections too)."""
        secret = self.get("secret", "agentrun-postgres", RELEASE_NAMESPACE)
        import base64
        url = base64.b64decode(secret["data"]["url"]).decode()
        service = self.get("service", "agentrun-postgres", RELEASE_NAMESPACE)
        ip = service["spec"]["clusterIP"]
        return re.sub(r"@[^:/]+", f"@{ip}", url, count=1)

    def emails(self, *runs: str) -> int:
        """The sample agents' emails sent by these runs, counted in the store."""
        rows = self.query("SELECT count(*) FROM sample_outbox WHERE tool = 'send_email' "
                          "AND run_name = ANY(%s)", list(runs))
        return int(rows[0][0])

    def node_not_ready(self) -> list[str]:
        """The Events saying the node went NotReady (the node controller's, on the Node
        and on each pod of it): a node that stops reporting is not what any test here is
        about, and it takes every pod out of its Services' endpoints while it lasts."""
        done = self.kubectl("get", "events", "-A", "--field-selector=reason=NodeNotReady",
                            "-o", "json")
        return [f"{e['metadata']['namespace']} {e['involvedObject']['kind']}/"
                f"{e['involvedObject']['name']}: {e.get('message')} "
                f"(last {e.get('lastTimestamp') or e.get('eventTime')})"
                for e in json.loads(done.stdout)["items"]]

    def release_report(self) -> str:
        """What the cluster says about the release when something did not work: its pods
        (restarts, readiness, each container's last state), endpoints, Events,
        kube-proxy's rules for its Services and the tail of each pod's log."""
        def out(*args: str) -> str:
            done = self.kubectl(*args, check=False)
            return (done.stdout or done.stderr).strip()

        pods = self.kubectl("get", "pods", "-n", RELEASE_NAMESPACE, "-o", "json",
                            check=False)
        states, logs = [], []
        for pod in (json.loads(pods.stdout)["items"] if pods.returncode == 0 else []):
            name = pod["metadata"]["name"]
            for status in (pod.get("status") or {}).get("containerStatuses") or []:
                states.append(f"  {name}/{status['name']}: ready {status.get('ready')}, "
                              f"restarts {status.get('restartCount')}, last state "
                              f"{json.dumps(status.get('lastState') or {})}")
            logs.append(f"log of {name} (tail):\n"
                        f"{out('logs', '-n', RELEASE_NAMESPACE, name, '--tail=15')}")
        iptables = subprocess.run(["iptables-save", "-t", "nat"], capture_output=True,
                                  text=True, check=False).stdout
        rules = "\n".join(line for line in iptables.splitlines()
                          if f"{RELEASE_NAMESPACE}/" in line)
        return "\n".join([
            f"pods in {RELEASE_NAMESPACE}:\n"
            f"{out('get', 'pods', '-n', RELEASE_NAMESPACE, '-o', 'wide')}",
            "containers:\n" + "\n".join(states),
            f"endpoints in {RELEASE_NAMESPACE}:\n"
            f"{out('get', 'endpointslices', '-n', RELEASE_NAMESPACE, '-o', 'wide')}",
            f"events in {RELEASE_NAMESPACE}:\n"
            f"{out('get', 'events', '-n', RELEASE_NAMESPACE, '--sort-by=.lastTimestamp')}",
            f"kube-proxy nat rules for {RELEASE_NAMESPACE}'s Services:\n{rules or '(none)'}",
            *logs,
        ])

    def query(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        import psycopg
        url = self.store_url().replace("postgresql+psycopg://", "postgresql://")
        with psycopg.connect(url, connect_timeout=10) as conn:
            return list(conn.execute(sql, params).fetchall())


EMAIL: dict[str, Any] = {"to": "customer-42@example.com", "body": "Your refund is on its way."}


def run_manifest(name: str, script: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    """A support-agent AgentRun on the offline scripted model, playing `script`."""
    return {"apiVersion": "agentrun.dev/v1alpha1", "kind": "AgentRun",
            "metadata": {"name": name},
            "spec": {"agent": "support-agent", "userId": "customer-42", "model": "scripted",
                     "input": {"text": "Customer 42 asks for a refund of order 42."},
                     "env": [{"name": "AGENTRUN_SCRIPT", "value": json.dumps(script)}],
                     **spec}}


def _sh(command: str, env: dict[str, str], timings: dict[str, float], *,
        timeout: float = 3600) -> str:
    began = time.monotonic()
    done = subprocess.run(["bash", "-c", f"set -euo pipefail\n{command}"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)
    timings[" ".join(command.split()[:2])] = time.monotonic() - began
    if done.returncode != 0:
        raise AssertionError(f"{command}\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}")
    return done.stdout


def _postgres_volume(plane: ControlPlane, root: Path) -> None:
    data = root / "postgres-pv"
    data.mkdir(parents=True, exist_ok=True)
    os.chown(data, POSTGRES_UID, POSTGRES_UID)
    data.chmod(0o700)
    manifest = {"apiVersion": "v1", "kind": "PersistentVolume",
                "metadata": {"name": "agentrun-e2e-postgres"},
                "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                         "persistentVolumeReclaimPolicy": "Retain",
                         "hostPath": {"path": str(data), "type": "Directory"}}}
    plane.kubectl("apply", "-f", "-", input=json.dumps(manifest))


def _tenants(plane: ControlPlane) -> None:
    """Two tenant namespaces; alice may edit runs in shop, bob in bank, olga may also
    force replays in shop."""
    for ns, user in (("shop", "alice"), ("bank", "bob")):
        plane.kubectl("create", "namespace", ns)
        plane.kubectl("create", "rolebinding", f"{user}-edit", "-n", ns,
                      "--clusterrole=agentrun-edit", f"--user={user}")
        plane.kubectl("create", "rolebinding", "olga-edit", "-n", ns,
                      "--clusterrole=agentrun-edit", "--user=olga")
    plane.kubectl("create", "rolebinding", "olga-force", "-n", "shop",
                  "--clusterrole=agentrun-replay-forcer", "--user=olga")


@contextmanager
def installed(root: Path) -> Iterator[Cluster]:
    """The control plane, the real node and agentrun installed by the README's commands,
    under `root`; everything stopped (and asserted gone) on the way out."""
    timings: dict[str, float] = {}
    began = time.monotonic()
    plane = ControlPlane(root / "cp").start()
    node: realnode.RealNode | None = None
    try:
        timings["control plane start"] = time.monotonic() - began
        node = realnode.RealNode(plane, root / "node").start()
        timings["real node start"] = node.startup_seconds
        env = {**os.environ, "KUBECONFIG": str(plane.kubeconfig),
               "PATH": os.pathsep.join([str(plane.bin), str(REPO / ".venv" / "bin"),
                                        os.environ.get("PATH", "")])}
        env.pop("DATABASE_URL", None)
        commands = readme_install_block()
        assert commands[0] == "make images", commands
        listed = _sh(commands[0], env, timings)
        # `make images` prints `name<TAB>archive<TAB>size` per image (after make's own
        # echo of the command).
        archives = [Path(line.split("\t")[1]) for line in listed.splitlines()
                    if line.count("\t") >= 2]
        assert len(archives) == 5 and all(a.is_file() for a in archives), listed
        for archive in archives:
            node.import_image(archive)
        _postgres_volume(plane, root)
        for command in commands[1:]:
            _sh(command, env, timings, timeout=900)
        _tenants(plane)
        yield Cluster(plane, node, env, timings)
    finally:
        if node is not None:
            node.stop()
        plane.stop()
