"""The development node: the one stand-in for a real part.

It plays a kubelet for tests and the local demo, never for production. It registers the
Node `dev-node`, renews its Lease and Ready condition, runs each pod bound to it as local
processes (the first container's command, args and env; images are ignored), and reports
pod status the way a kubelet does: Running, then Succeeded/Failed with the exit code;
graceful deletion (SIGTERM, grace period, SIGKILL, then a grace-0 delete); the pod's
activeDeadlineSeconds. It also simulates a kubelet's bad days on request, through the
annotation `dev.agentrun.dev/simulate` (see docs/development.md):

- on a pod, `node-pressure-eviction`: kill it, report phase Failed, reason Evicted and
  DisruptionTarget TerminationByKubelet, as a kubelet under memory pressure does;
- on a pod, `oom`: kill it, report the container terminated OOMKilled, exit code 137;
- on the node, `lost`: stop renewing the Lease and status and kill every process, as a
  node that lost power. Removing the annotation brings the node back.

Images are never pulled, but one whose tag is `:unpullable` plays an image that cannot
be: the pod stays Pending, its container waiting in ErrImagePull.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException

from agentrun.vocabulary import (
    ANNOTATION_SIMULATE,
    SIMULATE_LOST,
    SIMULATE_NODE_PRESSURE_EVICTION,
    SIMULATE_OOM,
)
from agentrun_devtools.processes import child_setup

log = logging.getLogger("devnode")

NODE_NAME = "dev-node"
LEASE_NAMESPACE = "kube-node-lease"
LEASE_SECONDS = 40
RENEW_SECONDS = 1.0
STATUS_SECONDS = 5.0
KUBELET_VERSION = "v1.37.2"
# An image with this tag is reported as one that cannot be pulled (ErrImagePull).
UNPULLABLE_TAG = ":unpullable"


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _stamp(t: datetime.datetime | None = None) -> str:
    return (t or _now()).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class PodProcess:
    """One pod's process on this node."""

    namespace: str
    name: str
    uid: str
    container: str
    process: subprocess.Popen[bytes]
    log_path: Path
    started_at: datetime.datetime
    deadline: datetime.datetime | None
    # Set once the node decided how this process ends (deletion, eviction, oom, deadline):
    # the exit is then reported that way instead of as a plain exit code.
    ending: str | None = None
    reported: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)


class DevNode:
    """Registers the node, runs its pods, and reports their status."""

    def __init__(self, api: client.ApiClient, work_dir: Path, extra_path: str = "") -> None:
        # The client types every field Optional; the API server fills what we read.
        self.core: Any = client.CoreV1Api(api)
        self.coordination: Any = client.CoordinationV1Api(api)
        self.work_dir = work_dir
        self.extra_path = extra_path
        self.pods: dict[str, PodProcess] = {}  # by pod uid
        self.finished: set[str] = set()  # uids whose status we reported as terminal
        self.lost = False
        self.stopping = threading.Event()
        self.events: queue.Queue[tuple[str, Any]] = queue.Queue()

    # -- node registration and heartbeats --------------------------------------------

    def register(self) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": NODE_NAME,
                "labels": {
                    "kubernetes.io/hostname": NODE_NAME,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    "agentrun.dev/development-node": "true",
                },
            },
            "spec": {},
        }
        try:
            self.core.create_node(body)
        except ApiException as e:
            if e.status != 409:
                raise
        self._post_status()

    def _post_status(self) -> None:
        now = _stamp()
        ready = {
            "type": "Ready", "status": "True", "reason": "KubeletReady",
            "message": "development node is posting ready status",
            "lastHeartbeatTime": now,
        }
        current = self.core.read_node(NODE_NAME)
        was_ready = any(
            c.type == "Ready" and c.status == "True" for c in (current.status.conditions or [])
        )
        if not was_ready:
            ready["lastTransitionTime"] = now
        capacity = {"cpu": "64", "memory": "256Gi", "pods": "1000", "ephemeral-storage": "1Ti"}
        status = {
            "conditions": [
                ready,
                *[
                    {"type": t, "status": "False", "reason": f"KubeletHas{r}",
                     "message": "development node", "lastHeartbeatTime": now,
                     **({} if was_ready else {"lastTransitionTime": now})}
                    for t, r in (("MemoryPressure", "SufficientMemory"),
                                 ("DiskPressure", "NoDiskPressure"),
                                 ("PIDPressure", "SufficientPID"))
                ],
            ],
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"},
                          {"type": "Hostname", "address": NODE_NAME}],
            "capacity": capacity,
            "allocatable": capacity,
            "nodeInfo": {
                "kubeletVersion": KUBELET_VERSION, "kubeProxyVersion": "",
                "operatingSystem": "linux", "architecture": "amd64",
                "containerRuntimeVersion": "agentrun-devnode://1", "osImage": "local processes",
                "kernelVersion": os.uname().release, "machineID": "", "systemUUID": "",
                "bootID": "",
            },
        }
        self.core.patch_node_status(NODE_NAME, {"status": status})

    def _renew_lease(self) -> None:
        now = _now().strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        spec = {"holderIdentity": NODE_NAME, "leaseDurationSeconds": LEASE_SECONDS,
                "renewTime": now}
        try:
            self.coordination.patch_namespaced_lease(NODE_NAME, LEASE_NAMESPACE, {"spec": spec})
        except ApiException as e:
            if e.status != 404:
                raise
            node = self.core.read_node(NODE_NAME)
            self.coordination.create_namespaced_lease(LEASE_NAMESPACE, {
                "metadata": {"name": NODE_NAME, "ownerReferences": [{
                    "apiVersion": "v1", "kind": "Node", "name": NODE_NAME,
                    "uid": node.metadata.uid}]},
                "spec": spec,
            })

    def heartbeat_loop(self) -> None:
        last_status = 0.0
        while not self.stopping.is_set():
            try:
                node = self.core.read_node(NODE_NAME)
                lost = (node.metadata.annotations or {}).get(ANNOTATION_SIMULATE) == SIMULATE_LOST
                if lost and not self.lost:
                    log.info("event=node-lost node=%s", NODE_NAME)
                    self.lost = True
                    self.events.put(("lost", None))
                elif not lost and self.lost:
                    log.info("event=node-back node=%s", NODE_NAME)
                    self.lost = False
                    last_status = 0.0
                    # Pods changed while we were silent (deleted, evicted): look again.
                    for pod in self.core.list_pod_for_all_namespaces(
                            field_selector=f"spec.nodeName={NODE_NAME}").items:
                        self.events.put(("pod", pod))
                if not self.lost:
                    self._renew_lease()
                    if time.monotonic() - last_status > STATUS_SECONDS or not any(
                        c.type == "Ready" and c.status == "True"
                        for c in (node.status.conditions or [])
                    ):
                        self._post_status()
                        last_status = time.monotonic()
            except Exception as e:  # the API server may be restarting; keep beating
                log.warning("event=heartbeat-failed error=%r", e)
            self.stopping.wait(RENEW_SECONDS)

    # -- pods --------------------------------------------------------------------------

    def watch_loop(self) -> None:
        selector = f"spec.nodeName={NODE_NAME}"
        while not self.stopping.is_set():
            try:
                listed = self.core.list_pod_for_all_namespaces(field_selector=selector)
                for pod in listed.items:
                    self.events.put(("pod", pod))
                version = listed.metadata.resource_version
                stream = watch.Watch()
                for event in stream.stream(
                    self.core.list_pod_for_all_namespaces, field_selector=selector,
                    resource_version=version, timeout_seconds=300,
                ):
                    if self.stopping.is_set():
                        stream.stop()
                        break
                    self.events.put(("deleted" if event["type"] == "DELETED" else "pod",
                                     event["object"]))
            except Exception as e:
                if not self.stopping.is_set():
                    log.warning("event=watch-restart error=%r", e)
                    time.sleep(0.5)

    def work_loop(self) -> None:
        """Handles every pod change, process exit and tick, one at a time, in order."""
        while not self.stopping.is_set():
            try:
                kind, item = self.events.get(timeout=0.5)
            except queue.Empty:
                kind, item = "tick", None
            try:
                if kind == "pod":
                    self._on_pod(item)
                elif kind == "deleted":
                    self._forget(item.metadata.uid, kill=True)
                elif kind == "exited":
                    self._on_exit(item)
                elif kind == "lost":
                    for proc in list(self.pods.values()):
                        self._kill(proc, signal.SIGKILL)
                    self.pods.clear()
                elif kind == "tick":
                    self._check_deadlines()
            except Exception as e:
                log.exception("event=work-failed kind=%s error=%r", kind, e)

    def _on_pod(self, pod: Any) -> None:
        if self.lost:
            return
        uid = pod.metadata.uid
        proc = self.pods.get(uid)
        simulate = (pod.metadata.annotations or {}).get(ANNOTATION_SIMULATE)
        if pod.metadata.deletion_timestamp is not None:
            self._on_deleting(pod, proc)
            return
        if uid in self.finished or pod.status.phase in ("Succeeded", "Failed"):
            return
        if proc is None:
            self._start(pod)
            return
        if simulate in (SIMULATE_NODE_PRESSURE_EVICTION, SIMULATE_OOM) and proc.ending is None:
            proc.ending = simulate
            log.info("event=simulate what=%s pod=%s/%s", simulate, proc.namespace, proc.name)
            self._kill(proc, signal.SIGKILL)

    def _on_deleting(self, pod: Any, proc: PodProcess | None) -> None:
        uid = pod.metadata.uid
        if proc is None or proc.process.poll() is not None:
            # Nothing runs (never started, or already reported): confirm the deletion.
            self._confirm_deletion(pod.metadata.namespace, pod.metadata.name, uid)
            return
        if proc.ending is None:
            proc.ending = "deleted"
            grace = pod.metadata.deletion_grace_period_seconds
            grace = 30 if grace is None else grace
            log.info("event=terminate pod=%s/%s grace=%s", proc.namespace, proc.name, grace)
            self._kill(proc, signal.SIGTERM if grace > 0 else signal.SIGKILL)
            if grace > 0:
                def escalate() -> None:
                    if proc.process.poll() is None:
                        self._kill(proc, signal.SIGKILL)
                threading.Timer(grace, escalate).start()

    def _start(self, pod: Any) -> None:
        container = pod.spec.containers[0]
        namespace, name, uid = pod.metadata.namespace, pod.metadata.name, pod.metadata.uid
        if (container.image or "").endswith(UNPULLABLE_TAG):
            self._report_pull_failure(pod, container)
            return
        argv = [*(container.command or []), *(container.args or [])]
        env = self._env(pod, container)
        pod_dir = self.work_dir / f"{namespace}_{name}_{uid[:8]}"
        pod_dir.mkdir(parents=True, exist_ok=True)
        log_path = pod_dir / f"{container.name}.log"
        started = _now()
        deadline = None
        if pod.spec.active_deadline_seconds:
            deadline = started + datetime.timedelta(seconds=pod.spec.active_deadline_seconds)
        try:
            if not argv:
                raise FileNotFoundError("the container has no command: images are not run here")
            with open(log_path, "ab") as out:
                process = subprocess.Popen(
                    argv, env=env, cwd=container.working_dir or pod_dir, stdout=out,
                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    preexec_fn=child_setup(),
                )
        except (OSError, ValueError) as e:
            log.warning("event=start-failed pod=%s/%s error=%r", namespace, name, e)
            self._report_start_failure(pod, container.name, str(e))
            return
        proc = PodProcess(namespace, name, uid, container.name, process, log_path,
                          started, deadline)
        self.pods[uid] = proc
        log.info("event=started pod=%s/%s pid=%s", namespace, name, process.pid)
        self._patch_status(namespace, name, {
            "phase": "Running",
            "hostIP": "127.0.0.1", "hostIPs": [{"ip": "127.0.0.1"}],
            "podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}],
            "startTime": _stamp(started),
            "conditions": self._conditions(ready=True),
            "containerStatuses": [{
                "name": container.name, "image": container.image or "", "imageID": "",
                "containerID": f"devnode://{process.pid}", "ready": True, "started": True,
                "restartCount": 0, "state": {"running": {"startedAt": _stamp(started)}},
            }],
        })
        threading.Thread(target=self._wait, args=(proc,), daemon=True).start()

    def _wait(self, proc: PodProcess) -> None:
        proc.process.wait()
        self.events.put(("exited", proc))

    def _on_exit(self, proc: PodProcess) -> None:
        if proc.reported or self.lost:
            return
        proc.reported = True
        code = proc.process.returncode
        exit_code = 128 - code if code < 0 else code  # killed by signal N -> 128+N
        finished = _now()
        terminated: dict[str, Any] = {
            "exitCode": exit_code, "startedAt": _stamp(proc.started_at),
            "finishedAt": _stamp(finished), "containerID": f"devnode://{proc.process.pid}",
            "reason": "Completed" if exit_code == 0 else "Error",
        }
        status: dict[str, Any] = {"phase": "Succeeded" if exit_code == 0 else "Failed"}
        conditions = self._conditions(ready=False)
        if proc.ending == SIMULATE_OOM:
            terminated.update(reason="OOMKilled", exitCode=137)
            status["phase"] = "Failed"
        elif proc.ending == SIMULATE_NODE_PRESSURE_EVICTION:
            terminated.update(reason="ContainerStatusUnknown", exitCode=137,
                              message="The container could not be located when the pod was "
                                      "terminated")
            status.update(
                phase="Failed", reason="Evicted",
                message="The node was low on resource: memory. Threshold quantity: 100Mi, "
                        "available: 50Mi. ",
            )
            conditions.append({
                "type": "DisruptionTarget", "status": "True", "reason": "TerminationByKubelet",
                "message": "The node was low on resource: memory.",
                "lastTransitionTime": _stamp(finished),
            })
        elif proc.ending == "deadline":
            status.update(phase="Failed", reason="DeadlineExceeded",
                          message="Pod was active on the node longer than the specified "
                                  "deadline")
        elif proc.ending == "deleted" and exit_code != 0:
            status["phase"] = "Failed"
        if exit_code != 0 and "message" not in terminated:
            tail = self._log_tail(proc.log_path)
            if tail:
                terminated["message"] = tail
        status["conditions"] = conditions
        status["containerStatuses"] = [{
            "name": proc.container, "ready": False, "started": False, "restartCount": 0,
            "image": "", "imageID": "", "containerID": f"devnode://{proc.process.pid}",
            "state": {"terminated": terminated},
        }]
        log.info("event=exited pod=%s/%s code=%s phase=%s ending=%s", proc.namespace,
                 proc.name, exit_code, status["phase"], proc.ending)
        self.finished.add(proc.uid)
        self._patch_status(proc.namespace, proc.name, status)
        if proc.ending == "deleted":
            self._confirm_deletion(proc.namespace, proc.name, proc.uid)
            self.pods.pop(proc.uid, None)

    def _check_deadlines(self) -> None:
        now = _now()
        for proc in list(self.pods.values()):
            if proc.deadline and now >= proc.deadline and proc.ending is None \
                    and proc.process.poll() is None:
                proc.ending = "deadline"
                log.info("event=deadline pod=%s/%s", proc.namespace, proc.name)
                self._kill(proc, signal.SIGKILL)

    def _confirm_deletion(self, namespace: str, name: str, uid: str) -> None:
        with contextlib.suppress(ApiException):
            self.core.delete_namespaced_pod(
                name, namespace, grace_period_seconds=0,
                body=client.V1DeleteOptions(grace_period_seconds=0,
                                            preconditions=client.V1Preconditions(uid=uid)),
            )
        self._forget(uid, kill=False)

    def _forget(self, uid: str, *, kill: bool) -> None:
        proc = self.pods.pop(uid, None)
        if proc is not None and kill and proc.process.poll() is None:
            self._kill(proc, signal.SIGKILL)
        self.finished.discard(uid)

    def _report_pull_failure(self, pod: Any, container: Any) -> None:
        """Images are never pulled here; one tagged UNPULLABLE_TAG plays an image that
        cannot be: the pod stays Pending with the container waiting in ErrImagePull."""
        self.finished.add(pod.metadata.uid)
        log.info("event=image-pull-failed pod=%s/%s image=%s", pod.metadata.namespace,
                 pod.metadata.name, container.image)
        self._patch_status(pod.metadata.namespace, pod.metadata.name, {
            "phase": "Pending", "hostIP": "127.0.0.1",
            "conditions": self._conditions(ready=False),
            "containerStatuses": [{
                "name": container.name, "ready": False, "restartCount": 0,
                "image": container.image, "imageID": "", "started": False,
                "state": {"waiting": {
                    "reason": "ErrImagePull",
                    "message": f'failed to pull image "{container.image}": not found'}},
            }],
        })

    def _report_start_failure(self, pod: Any, container: str, message: str) -> None:
        self.finished.add(pod.metadata.uid)
        self._patch_status(pod.metadata.namespace, pod.metadata.name, {
            "phase": "Failed", "startTime": _stamp(),
            "conditions": self._conditions(ready=False),
            "containerStatuses": [{
                "name": container, "ready": False, "restartCount": 0, "image": "",
                "imageID": "", "state": {"terminated": {
                    "exitCode": 128, "reason": "StartError", "message": message,
                    "startedAt": _stamp(), "finishedAt": _stamp()}},
            }],
        })

    # -- small pieces ------------------------------------------------------------------

    def _env(self, pod: Any, container: Any) -> dict[str, str]:
        env = {
            "PATH": os.pathsep.join(p for p in (self.extra_path, os.environ.get("PATH", "")) if p),
            "HOME": os.environ.get("HOME", "/tmp"),
            "LANG": "C.UTF-8",
            "PYTHONUNBUFFERED": "1",
            "HOSTNAME": pod.metadata.name,
        }
        for var in container.env or []:
            if var.value is not None:
                env[var.name] = var.value
            elif var.value_from is not None:
                value = self._resolve(pod, var.value_from)
                if value is not None:
                    env[var.name] = value
        return env

    def _resolve(self, pod: Any, source: Any) -> str | None:
        import base64

        ns = pod.metadata.namespace
        try:
            if source.secret_key_ref is not None:
                ref = source.secret_key_ref
                data = self.core.read_namespaced_secret(ref.name, ns).data or {}
                return base64.b64decode(data[ref.key]).decode() if ref.key in data else None
            if source.config_map_key_ref is not None:
                ref = source.config_map_key_ref
                return (self.core.read_namespaced_config_map(ref.name, ns).data or {}).get(ref.key)
        except ApiException:
            return None
        if source.field_ref is not None:
            path = source.field_ref.field_path
            return {
                "metadata.name": pod.metadata.name, "metadata.namespace": ns,
                "metadata.uid": pod.metadata.uid, "spec.nodeName": NODE_NAME,
                "status.podIP": "127.0.0.1", "status.hostIP": "127.0.0.1",
                "spec.serviceAccountName": pod.spec.service_account_name or "",
            }.get(path)
        return None

    @staticmethod
    def _conditions(*, ready: bool) -> list[dict[str, Any]]:
        now = _stamp()
        value = "True" if ready else "False"
        return [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
            {"type": "Initialized", "status": "True", "lastTransitionTime": now},
            {"type": "ContainersReady", "status": value, "lastTransitionTime": now},
            {"type": "Ready", "status": value, "lastTransitionTime": now},
        ]

    def _patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        try:
            self.core.patch_namespaced_pod_status(name, namespace, {"status": status})
        except ApiException as e:
            if e.status != 404:
                log.warning("event=status-failed pod=%s/%s status=%s", namespace, name, e.status)

    @staticmethod
    def _kill(proc: PodProcess, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.process.pid, sig)

    @staticmethod
    def _log_tail(path: Path, limit: int = 2048) -> str:
        try:
            data = path.read_bytes()[-limit:]
        except OSError:
            return ""
        return data.decode(errors="replace").strip()

    # -- running -----------------------------------------------------------------------

    def run(self) -> None:
        self.register()
        self._renew_lease()
        threads = [threading.Thread(target=t, daemon=True, name=t.__name__)
                   for t in (self.heartbeat_loop, self.watch_loop)]
        for t in threads:
            t.start()
        try:
            self.work_loop()
        finally:
            self.shutdown()

    def shutdown(self) -> None:
        self.stopping.set()
        for proc in list(self.pods.values()):
            self._kill(proc, signal.SIGKILL)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--work-dir", required=True, type=Path,
                        help="where each pod's working directory and log go")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    api = config.new_client_from_config(config_file=args.kubeconfig)
    node = DevNode(api, args.work_dir, extra_path=str(Path(sys.executable).parent))
    signal.signal(signal.SIGTERM, lambda *_: node.stopping.set())
    node.run()


if __name__ == "__main__":
    main()
