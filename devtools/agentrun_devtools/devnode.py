"""The development node: the one stand-in for a real part.

It plays a kubelet for tests and the local demo, never for production. It registers the
Node `dev-node`, renews its Lease and Ready condition, runs each pod bound to it as local
processes (the first container's command, args and env; images are ignored; a command
`agentrun-runner` finds the runner's launcher first on PATH, as in the runner image:
agentrun_devtools.runner_launcher; that process is forked from a runner that imported
google-adk once, with the environment and command line the launcher would give it, so that
a pod does not pay 1.6 s of CPU for its imports: `Runners`, `--no-fork-runners` to start
each through the launcher), and reports
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

Volumes. A process cannot have mounts, so a `projected` volume that the container mounts
is written out as files under `<pod work dir>/volumes/<volume name>/`, with the sources a
kubelet projects:

- `serviceAccountToken`: a TokenRequest, as a kubelet makes it, for the pod's
  ServiceAccount (`default` if none), with the source's audience (none: the API server's
  default audiences), its expirationSeconds (default 3600) and the Pod as bound object,
  so that the token dies with the pod. It is requested again once 80% of its lifetime
  has passed or it is 24 hours old (`refresh_due`), and rewritten atomically, until the
  process ends or the pod is forgotten;
- `configMap` and `secret`: every key, or the listed items, `optional` honoured. They are
  written when the pod starts and not updated afterwards (a kubelet does update them);
- `downwardAPI`: `fieldRef` items (metadata.name, namespace, uid, labels, annotations);
  a `resourceFieldRef` item, or a `clusterTrustBundle` or `podCertificate` source, is a
  mount failure ("not supported by the development node").

Every file is written with mode 0600, whatever `defaultMode` says: only this node's user
reads them. Other volume types (emptyDir, a plain secret or configMap volume, ...) are not
materialized: their mountPaths stay as they are (a runner's `/tmp` is the host's `/tmp`).

Mount paths are mapped through the environment (`mapped_env`): a value of one of the
container's env variables that equals a projected volume's mountPath, or starts with it
followed by `/`, is rewritten with the volume's local directory (with the mount's subPath)
in its place; the longest matching mountPath wins. Nothing else (command, args,
workingDir) is rewritten.

`$(VAR)` in env values, command and args is expanded as a kubelet expands it, by the
kubelet's own code (devtools/peers/kubelet-expansion over
k8s.io/kubernetes/third_party/forked/golang/expansion, at the control plane's release): a
value sees only the variables declared before it, `$$` is a literal `$`, an undefined
reference stays as written, and command and args see the whole env. So a pod whose env
would expand a Secret into a tenant's text does so here too.

When a kubelet cannot start a container, neither does this node, and it reports what a
kubelet reports, retrying every RETRY_SECONDS and on every event of the pod:

- a volume that cannot be set up (the TokenRequest fails, e.g. the ServiceAccount was
  deleted; a ConfigMap or Secret is missing): the pod stays Pending, the container waiting
  in ContainerCreating, and a Warning Event FailedMount carries the error;
- an env variable whose secretKeyRef or configMapKeyRef names a missing object or key
  (not `optional`): the pod stays Pending, the container waiting in
  CreateContainerConfigError with the kubelet's message (`secret "x" not found`,
  `couldn't find key k in Secret ns/x`), and a Warning Event Failed.

`envFrom` is not read, and an env `resourceFieldRef` is not resolved (the variable is
left out).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import datetime
import json
import logging
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import urllib3
from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException

from agentrun.vocabulary import (
    ANNOTATION_SIMULATE,
    SIMULATE_LOST,
    SIMULATE_NODE_PRESSURE_EVICTION,
    SIMULATE_OOM,
)
from agentrun_devtools import forkserver, peers, runner_launcher
from agentrun_devtools.forkserver import Forked
from agentrun_devtools.processes import child_setup, signal_group, start_ticks

log = logging.getLogger("devnode")

NODE_NAME = "dev-node"
LEASE_NAMESPACE = "kube-node-lease"
LEASE_SECONDS = 40
RENEW_SECONDS = 1.0
STATUS_SECONDS = 5.0
KUBELET_VERSION = "v1.37.2"
# An image with this tag is reported as one that cannot be pulled (ErrImagePull).
UNPULLABLE_TAG = ":unpullable"
# How often deadlines, projected tokens and pods that could not start are looked at.
TICK_SECONDS = 0.5
# A pod whose volumes or env could not be set up is tried again after this long (a
# kubelet backs off further; a test should not wait for it).
RETRY_SECONDS = 1.0
# A kubelet renews a projected token once 80% of its lifetime has passed, or once it is 24
# hours old (pkg/kubelet/token/token_manager.go, requiresRefresh).
TOKEN_REFRESH_FRACTION = 0.8
TOKEN_MAX_AGE = datetime.timedelta(hours=24)
DEFAULT_TOKEN_SECONDS = 3600
# Where a projected volume's files go, under the pod's work directory.
VOLUMES_DIR = "volumes"


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _stamp(t: datetime.datetime | None = None) -> str:
    return (t or _now()).strftime("%Y-%m-%dT%H:%M:%SZ")


def refresh_due(issued_at: datetime.datetime, expires_at: datetime.datetime,
                now: datetime.datetime) -> bool:
    """Whether a projected token issued at `issued_at` and valid until `expires_at` is to
    be requested again at `now`: once TOKEN_REFRESH_FRACTION of its lifetime has passed,
    or once it is TOKEN_MAX_AGE old, whichever comes first, as a kubelet decides (without
    its random jitter of up to 10 seconds, so that the decision is the same every time)."""
    lifetime = expires_at - issued_at
    return now >= issued_at + min(lifetime * TOKEN_REFRESH_FRACTION, TOKEN_MAX_AGE)


# How a kubelet reports a container it can no longer find (a node-pressure eviction, a
# node back from a power loss): terminated, exit 137.
UNLOCATED: dict[str, Any] = {
    "exitCode": 137, "reason": "ContainerStatusUnknown",
    "message": "The container could not be located when the pod was terminated"}


def _terminated_container(proc: PodProcess, terminated: dict[str, Any],
                          **extra: Any) -> dict[str, Any]:
    """The containerStatuses entry of a pod's container that has ended."""
    return {"name": proc.container, "ready": False, "started": False, "restartCount": 0,
            "image": "", "imageID": "", **extra, "state": {"terminated": terminated}}


def _under(value: str, mount_path: str) -> bool:
    return value == mount_path or value.startswith(mount_path + "/")


def mapped_env(env: Mapping[str, str], mounts: Mapping[str, Path]) -> dict[str, str]:
    """The container's env as the process sees it: a process has no mounts, so a value
    that names a mountPath (equal to it, or starting with it followed by `/`) gets the
    local directory that stands for that mount in its place. The longest matching
    mountPath wins, as the innermost of nested mounts does; other values are unchanged."""
    paths = sorted(((p.rstrip("/"), local) for p, local in mounts.items() if p.rstrip("/")),
                   key=lambda pair: len(pair[0]), reverse=True)
    out = {}
    for name, value in env.items():
        for mount_path, local in paths:
            if _under(value, mount_path):
                value = str(local) + value[len(mount_path):]
                break
        out[name] = value
    return out


class MountFailed(Exception):
    """A volume cannot be set up; a kubelet leaves the pod in ContainerCreating and says
    why in a FailedMount Event."""

    def __init__(self, volume: str, message: str) -> None:
        super().__init__(message)
        self.volume = volume


class ContainerConfigError(Exception):
    """The container's configuration (its env) cannot be made; a kubelet reports the
    container waiting in CreateContainerConfigError with this message."""


# What a request to the API server may fail with: an answer, or no answer at all (the API
# server restarting). A kubelet reports either as the reason a container cannot start.
_API_ERRORS = (ApiException, urllib3.exceptions.HTTPError, OSError)


def _api_message(e: Exception) -> str:
    """The API server's own message for a failed request (`serviceaccounts "x" not
    found`), or what kept the request from being answered."""
    if not isinstance(e, ApiException):
        return str(e)
    try:
        message = json.loads(e.body or "{}").get("message")
    except (ValueError, AttributeError):
        message = None
    return str(message or e.reason or e)


def _write_file(path: Path, data: bytes) -> None:
    """Writes `data` to `path` (mode 0600) atomically: a reader sees the old content or
    the new one, never a part (a renewed token is written over the one in use)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    temporary = path.with_name(f".{path.name}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    os.replace(temporary, path)


@dataclass
class ProjectedToken:
    """One serviceAccountToken file of a pod, with what it takes to request it again."""

    path: Path
    service_account: str
    audience: str
    expiration_seconds: int
    issued_at: datetime.datetime
    expires_at: datetime.datetime
    # After a failed renewal, not before this (the old token stays until it expires).
    retry_at: datetime.datetime | None = None


@dataclass
class Blocked:
    """A pod whose volumes or env could not be set up: its newest object, what was last
    reported about it, and when to try again."""

    pod: Any
    reported: tuple[str, str] | None
    retry_at: float


@dataclass
class PodProcess:
    """One pod's process on this node."""

    namespace: str
    name: str
    uid: str
    container: str
    process: subprocess.Popen[bytes] | Forked
    log_path: Path
    started_at: datetime.datetime
    deadline: datetime.datetime | None
    # Set once the node decided how this process ends (deletion, eviction, oom, deadline):
    # the exit is then reported that way instead of as a plain exit code.
    ending: str | None = None
    reported: bool = False
    tokens: list[ProjectedToken] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    # When the process started (processes.start_ticks): its group is signalled only while
    # its number is not another's.
    started_ticks: int | None = None


class DevNode:
    """Registers the node, runs its pods, and reports their status."""

    def __init__(self, api: client.ApiClient, work_dir: Path, extra_path: str = "", *,
                 runners: Runners | None = None) -> None:
        # The client types every field Optional; the API server fills what we read.
        self.core: Any = client.CoreV1Api(api)
        self.coordination: Any = client.CoordinationV1Api(api)
        self.work_dir = work_dir
        self.extra_path = extra_path
        self.runners = runners
        self.pods: dict[str, PodProcess] = {}  # by pod uid
        self.finished: set[str] = set()  # uids whose status we reported as terminal
        # Pods whose containers died with the node (simulated power loss), reported when
        # the node is back.
        self.vanished: dict[str, PodProcess] = {}
        self.blocked: dict[str, Blocked] = {}  # by pod uid: could not start yet, retried
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
                    self.events.put(("back", None))
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
        """Handles every pod change, process exit and tick, one at a time, in order. A
        tick comes every TICK_SECONDS even while events keep coming."""
        last_tick = time.monotonic()
        while not self.stopping.is_set():
            try:
                kind, item = self.events.get(timeout=TICK_SECONDS)
            except queue.Empty:
                pass
            else:
                self._handle(kind, item)
            if time.monotonic() - last_tick >= TICK_SECONDS:
                last_tick = time.monotonic()
                self._handle("tick", None)

    def _handle(self, kind: str, item: Any) -> None:
        try:
            if kind == "pod":
                self._on_pod(item)
            elif kind == "deleted":
                self._forget(item.metadata.uid, kill=True)
            elif kind == "exited":
                self._on_exit(item)
            elif kind == "lost":
                # Power lost: every container dies. Back, a kubelet does not restart a
                # restartPolicy Never container it can no longer find; it reports it
                # terminated (ContainerStatusUnknown) and the pod Failed.
                for proc in list(self.pods.values()):
                    self._kill(proc, signal.SIGKILL)
                    self.finished.add(proc.uid)
                    self.vanished[proc.uid] = proc
                self.pods.clear()
                self.blocked.clear()
            elif kind == "back":
                for proc in list(self.vanished.values()):
                    self._report_vanished(proc)
                self.vanished.clear()
            elif kind == "tick" and not self.lost:
                self._check_deadlines()
                self._retry_blocked()
                self._refresh_tokens()
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
        pod_dir = self.work_dir / f"{namespace}_{name}_{uid[:8]}"
        pod_dir.mkdir(parents=True, exist_ok=True)
        # A kubelet mounts the volumes first, then makes the container's configuration.
        try:
            mounts, tokens = self._mount_volumes(pod, container, pod_dir)
        except MountFailed as e:
            # A kubelet that cannot fetch a token (or a ConfigMap, a Secret) for a projected
            # volume does not put that in the pod's status: the container waits in
            # ContainerCreating and the error is in a FailedMount Event. We report exactly
            # that, not CreateContainerConfigError, so that whatever reads the pod here
            # sees what it will see on a real cluster.
            self._block(pod, container, "ContainerCreating", "", event=(
                "FailedMount", f'MountVolume.SetUp failed for volume "{e.volume}" : {e}'),
                about_container=False)
            return
        try:
            env, argv = self._env(pod, container, mounts)
        except ContainerConfigError as e:
            self._block(pod, container, "CreateContainerConfigError", str(e),
                        event=("Failed", f"Error: {e}"), about_container=True)
            return
        self.blocked.pop(uid, None)
        log_path = pod_dir / f"{container.name}.log"
        started = _now()
        deadline = None
        if pod.spec.active_deadline_seconds:
            deadline = started + datetime.timedelta(seconds=pod.spec.active_deadline_seconds)
        try:
            if not argv:
                raise FileNotFoundError("the container has no command: images are not run here")
            process = self._spawn(argv, env, Path(container.working_dir or pod_dir), log_path)
        except (OSError, ValueError) as e:
            log.warning("event=start-failed pod=%s/%s error=%r", namespace, name, e)
            self._report_start_failure(pod, container.name, str(e))
            return
        proc = PodProcess(namespace, name, uid, container.name, process, log_path,
                          started, deadline, tokens=tokens,
                          started_ticks=start_ticks(process.pid))
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

    def _spawn(self, argv: list[str], env: dict[str, str], cwd: Path,
               log_path: Path) -> subprocess.Popen[bytes] | Forked:
        """The container's process: forked from the imported runner when the command is
        the runner's launcher (what the launcher would start, started the quick way),
        else started as any program is."""
        if self.runners is not None:
            forked = self.runners.spawn(argv, env, cwd, log_path)
            if forked is not None:
                return forked
        with open(log_path, "ab") as out:
            return subprocess.Popen(
                argv, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, preexec_fn=child_setup())

    def _wait(self, proc: PodProcess) -> None:
        proc.process.wait()
        self.events.put(("exited", proc))

    def _on_exit(self, proc: PodProcess) -> None:
        if proc.reported or self.lost:
            return
        proc.reported = True
        code = proc.process.returncode
        assert code is not None  # reported only once the process has exited
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
            terminated.update(UNLOCATED)
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
        status["containerStatuses"] = [_terminated_container(
            proc, terminated, containerID=f"devnode://{proc.process.pid}")]
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
            log.info("event=deletion-confirmed pod=%s/%s", namespace, name)
        self._forget(uid, kill=False)

    def _forget(self, uid: str, *, kill: bool) -> None:
        """The pod is gone: its process too, its tokens are no longer renewed, and a pod
        that could not start is no longer retried."""
        proc = self.pods.pop(uid, None)
        if proc is not None and kill and proc.process.poll() is None:
            self._kill(proc, signal.SIGKILL)
        self.finished.discard(uid)
        self.blocked.pop(uid, None)

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

    def _report_vanished(self, proc: PodProcess) -> None:
        """A container that died with the node, as a kubelet back from a power loss shows
        it: terminated, ContainerStatusUnknown, exit 137; the pod Failed."""
        log.info("event=vanished pod=%s/%s", proc.namespace, proc.name)
        self._patch_status(proc.namespace, proc.name, {
            "phase": "Failed", "conditions": self._conditions(ready=False),
            "containerStatuses": [_terminated_container(proc, {
                **UNLOCATED, "startedAt": _stamp(proc.started_at), "finishedAt": _stamp()})],
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

    def _block(self, pod: Any, container: Any, reason: str, message: str, *,
               event: tuple[str, str], about_container: bool) -> None:
        """The container cannot start yet: report it waiting in `reason`, the pod Pending,
        and say why in an Event (about the pod, or `about_container`), once per distinct
        cause; try again later."""
        uid = pod.metadata.uid
        previous = self.blocked.get(uid)
        blocked = Blocked(pod, previous.reported if previous else None,
                          time.monotonic() + RETRY_SECONDS)
        self.blocked[uid] = blocked
        cause = (reason, event[1])
        if blocked.reported == cause:
            return
        log.info("event=container-not-started pod=%s/%s reason=%s message=%r",
                 pod.metadata.namespace, pod.metadata.name, reason, event[1])
        self._post_event(pod, container.name if about_container else None, *event)
        waiting = {"reason": reason, **({"message": message} if message else {})}
        self._patch_status(pod.metadata.namespace, pod.metadata.name, {
            "phase": "Pending", "hostIP": "127.0.0.1", "hostIPs": [{"ip": "127.0.0.1"}],
            "startTime": _stamp(pod.status.start_time) if pod.status.start_time else _stamp(),
            "conditions": self._conditions(ready=False),
            "containerStatuses": [{
                "name": container.name, "ready": False, "restartCount": 0,
                "image": container.image or "", "imageID": "", "started": False,
                "state": {"waiting": waiting},
            }],
        })
        blocked.reported = cause

    def _retry_blocked(self) -> None:
        """As a kubelet's pod worker does, try again to start what could not start (a
        ServiceAccount, Secret or ConfigMap created meanwhile lets it)."""
        now = time.monotonic()
        for blocked in list(self.blocked.values()):
            if blocked.retry_at <= now:
                self._start(blocked.pod)

    def _post_event(self, pod: Any, container: str | None, reason: str, message: str) -> None:
        """A Warning Event about the pod (or, with `container`, one of its containers),
        as a kubelet records it."""
        now = _now()
        involved = {"apiVersion": "v1", "kind": "Pod", "namespace": pod.metadata.namespace,
                    "name": pod.metadata.name, "uid": pod.metadata.uid}
        if container is not None:
            involved["fieldPath"] = f"spec.containers{{{container}}}"
        body = {
            "metadata": {"name": f"{pod.metadata.name}.{time.time_ns():x}",
                         "namespace": pod.metadata.namespace},
            "involvedObject": involved,
            "reason": reason, "message": message, "type": "Warning",
            "source": {"component": "kubelet", "host": NODE_NAME},
            "reportingComponent": "kubelet", "reportingInstance": NODE_NAME,
            "firstTimestamp": _stamp(now), "lastTimestamp": _stamp(now), "count": 1,
        }
        try:
            self.core.create_namespaced_event(pod.metadata.namespace, body)
        except ApiException as e:
            log.warning("event=event-failed pod=%s/%s status=%s", pod.metadata.namespace,
                        pod.metadata.name, e.status)

    # -- volumes -----------------------------------------------------------------------

    def _mount_volumes(self, pod: Any, container: Any,
                       pod_dir: Path) -> tuple[dict[str, Path], list[ProjectedToken]]:
        """Writes out every projected volume the container mounts; returns each mount's
        local directory by mountPath, and the tokens to renew. Raises MountFailed."""
        volumes = {v.name: v for v in pod.spec.volumes or []}
        mounts: dict[str, Path] = {}
        tokens: list[ProjectedToken] = []
        written: set[str] = set()
        for mount in container.volume_mounts or []:
            volume = volumes.get(mount.name)
            if volume is None or volume.projected is None:
                continue  # not materialized: the mountPath stays as it is
            local = pod_dir / VOLUMES_DIR / volume.name
            if volume.name not in written:
                tokens += self._project(pod, volume.name, volume.projected.sources or [], local)
                written.add(volume.name)
            mounts[mount.mount_path] = local / mount.sub_path if mount.sub_path else local
        return mounts, tokens

    def _project(self, pod: Any, volume: str, sources: list[Any],
                 local: Path) -> list[ProjectedToken]:
        tokens: list[ProjectedToken] = []
        files: dict[str, bytes] = {}
        for source in sources:
            if source.service_account_token is not None:
                projection = source.service_account_token
                token = ProjectedToken(
                    local / projection.path, pod.spec.service_account_name or "default",
                    projection.audience or "",
                    projection.expiration_seconds or DEFAULT_TOKEN_SECONDS, _now(), _now())
                meta = pod.metadata
                try:
                    files[projection.path] = self._request_token(
                        meta.namespace, meta.name, meta.uid, token).encode()
                except _API_ERRORS as e:
                    raise MountFailed(volume, f"failed to fetch token: {_api_message(e)}") from e
                tokens.append(token)
            elif source.config_map is not None:
                files.update(self._project_keys(pod, volume, source.config_map, "configmap"))
            elif source.secret is not None:
                files.update(self._project_keys(pod, volume, source.secret, "secret"))
            elif source.downward_api is not None:
                for item in source.downward_api.items or []:
                    if item.field_ref is None:
                        raise MountFailed(volume, "resourceFieldRef is not supported by the "
                                                  "development node")
                    files[item.path] = self._field(pod, item.field_ref.field_path).encode()
            else:
                raise MountFailed(volume, "this projected volume source is not supported by "
                                          "the development node")
        for path, data in files.items():
            try:
                _write_file(local / path, data)
            except OSError as e:
                raise MountFailed(volume, str(e)) from e
        return tokens

    def _project_keys(self, pod: Any, volume: str, source: Any,
                      kind: str) -> dict[str, bytes]:
        """The files of a configMap or secret projection: every key, or the listed items."""
        ns, optional = pod.metadata.namespace, bool(source.optional)
        try:
            if kind == "secret":
                obj = self.core.read_namespaced_secret(source.name, ns)
                data = {k: base64.b64decode(v) for k, v in (obj.data or {}).items()}
            else:
                obj = self.core.read_namespaced_config_map(source.name, ns)
                data = {k: v.encode() for k, v in (obj.data or {}).items()}
                data.update({k: base64.b64decode(v) for k, v in (obj.binary_data or {}).items()})
        except _API_ERRORS as e:
            missing = isinstance(e, ApiException) and e.status == 404
            if missing and optional:
                return {}
            message = f'{kind} "{source.name}" not found' if missing else _api_message(e)
            raise MountFailed(volume, message) from e
        if not source.items:
            return data
        files = {}
        for item in source.items:
            if item.key in data:
                files[item.path] = data[item.key]
            elif not optional:
                raise MountFailed(volume, f"{kind} references non-existent "
                                          f"{'secret' if kind == 'secret' else 'config'} key: "
                                          f"{item.key}")
        return files

    def _request_token(self, namespace: str, name: str, uid: str,
                       token: ProjectedToken) -> str:
        """A TokenRequest as a kubelet makes it for a projected volume: the pod's
        ServiceAccount, the source's audience (none: the API server's defaults), bound to
        the Pod so that it stops authenticating once the pod is gone."""
        spec: dict[str, Any] = {
            "expirationSeconds": token.expiration_seconds,
            "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": name, "uid": uid},
        }
        if token.audience:
            spec["audiences"] = [token.audience]
        answer = self.core.create_namespaced_service_account_token(
            token.service_account, namespace,
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec})
        # The API server may grant another lifetime than asked; the kubelet dates the
        # token from what was granted, and so do we.
        granted = answer.spec.expiration_seconds or token.expiration_seconds
        token.expires_at = answer.status.expiration_timestamp
        token.issued_at = token.expires_at - datetime.timedelta(seconds=granted)
        token.retry_at = None
        return str(answer.status.token)

    def _refresh_tokens(self) -> None:
        """Renews the projected tokens of running processes that are due (`refresh_due`),
        each file rewritten atomically; a failed renewal keeps the old token and is tried
        again after RETRY_SECONDS."""
        now = _now()
        for proc in list(self.pods.values()):
            if proc.process.poll() is not None:
                continue
            for token in proc.tokens:
                if not refresh_due(token.issued_at, token.expires_at, now) or (
                        token.retry_at is not None and now < token.retry_at):
                    continue
                try:
                    _write_file(token.path, self._request_token(
                        proc.namespace, proc.name, proc.uid, token).encode())
                    log.info("event=token-renewed pod=%s/%s path=%s expires=%s",
                             proc.namespace, proc.name, token.path, _stamp(token.expires_at))
                except _API_ERRORS as e:
                    token.retry_at = now + datetime.timedelta(seconds=RETRY_SECONDS)
                    log.warning("event=token-renewal-failed pod=%s/%s error=%r",
                                proc.namespace, proc.name, _api_message(e))

    # -- small pieces ------------------------------------------------------------------

    def _env(self, pod: Any, container: Any,
             mounts: Mapping[str, Path]) -> tuple[dict[str, str], list[str]]:
        """The process's environment and argv: a few basics, then the container's env with
        `valueFrom` resolved, `$(VAR)` expanded in env, command and args by the kubelet's
        own code (peers.expand), and mountPaths mapped (`mapped_env`). Raises
        ContainerConfigError where a kubelet reports CreateContainerConfigError."""
        env = {
            "PATH": os.pathsep.join(p for p in (self.extra_path, os.environ.get("PATH", "")) if p),
            "HOME": os.environ.get("HOME", "/tmp"),
            "LANG": "C.UTF-8",
            "PYTHONUNBUFFERED": "1",
            "HOSTNAME": pod.metadata.name,
        }
        listed: list[tuple[str, str, bool]] = []
        for var in container.env or []:
            if var.value_from is not None:
                value = self._resolve(pod, var.value_from)
                if value is not None:
                    listed.append((var.name, value, True))
            else:
                listed.append((var.name, var.value or "", False))
        expanded = peers.expand(listed, container.command or [], container.args or [])
        # As in the container runtime, a later duplicate wins.
        declared = dict(expanded.env)
        return ({**env, **mapped_env(declared, mounts)},
                [*expanded.command, *expanded.args])

    def _resolve(self, pod: Any, source: Any) -> str | None:
        """One env valueFrom, with a kubelet's messages for what is missing; None for a
        missing optional reference (the variable is left out, as a kubelet does)."""
        ns = pod.metadata.namespace
        for kind, ref in (("Secret", source.secret_key_ref),
                          ("ConfigMap", source.config_map_key_ref)):
            if ref is None:
                continue
            try:
                if kind == "Secret":
                    data = {k: base64.b64decode(v).decode() for k, v in
                            (self.core.read_namespaced_secret(ref.name, ns).data or {}).items()}
                else:
                    data = self.core.read_namespaced_config_map(ref.name, ns).data or {}
            except _API_ERRORS as e:
                missing = isinstance(e, ApiException) and e.status == 404
                if missing and ref.optional:
                    return None
                raise ContainerConfigError(f'{kind.lower()} "{ref.name}" not found'
                                           if missing else _api_message(e)) from e
            if ref.key in data:
                return str(data[ref.key])
            if ref.optional:
                return None
            raise ContainerConfigError(f"couldn't find key {ref.key} in {kind} {ns}/{ref.name}")
        if source.field_ref is not None:
            return self._field(pod, source.field_ref.field_path)
        return None

    @staticmethod
    def _field(pod: Any, path: str) -> str:
        """A downward API fieldRef, for env and for downwardAPI volume items."""
        meta = pod.metadata
        for prefix, values in (("metadata.labels", meta.labels or {}),
                               ("metadata.annotations", meta.annotations or {})):
            if path == prefix:
                return "\n".join(f"{k}={json.dumps(v)}" for k, v in sorted(values.items()))
            if path.startswith(prefix + "['") and path.endswith("']"):
                return str(values.get(path[len(prefix) + 2:-2], ""))
        return {
            "metadata.name": meta.name, "metadata.namespace": meta.namespace,
            "metadata.uid": meta.uid, "spec.nodeName": NODE_NAME,
            "status.podIP": "127.0.0.1", "status.hostIP": "127.0.0.1",
            "status.podIPs": "127.0.0.1", "status.hostIPs": "127.0.0.1",
            "spec.serviceAccountName": pod.spec.service_account_name or "",
        }.get(path, "")

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
        signal_group(proc.process.pid, proc.started_ticks, sig)

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
        if self.runners is not None:
            self.runners.stop()


class Runners:
    """Runner processes forked from a runner that has imported google-adk once
    (agentrun_devtools.forkserver): a runner pod's process costs a fork instead of 1.6 s of
    CPU of imports, and is otherwise what the launcher would start: the launcher's
    environment and command line (runner_launcher.launched_env, launched_argv: /proc shows
    them), Python isolated, unbuffered, writing no bytecode."""

    # What an attempt imports after its first line (inside the runner's functions), so that
    # no forked runner imports it again.
    PRELOAD = ("agentrun_runner.main", "agentrun_runner.compaction", "agentrun_runner.ledger",
               "agentrun_runner.retries", "agentrun_runner.scripted", "agentrun_runner.usage",
               "agentrun_runner.declarative", "agentrun_runner.agents", "agentrun.agents",
               "google.adk.runners", "google.adk.agents.llm_agent", "google.adk.apps.app",
               "google.adk.models.registry", "google.adk.tools.function_tool",
               "google.adk.tools.tool_confirmation", "google.adk.tools.mcp_tool.mcp_toolset",
               "google.adk.agents.config_agent_utils")

    def __init__(self, python: Path, launcher: Path, work_dir: Path) -> None:
        self.python, self.launcher = python, launcher
        self.path = runner_launcher.runner_path(python)
        self.server = forkserver.ForkServer(
            python, runner_launcher.MODULE, work_dir, preload=self.PRELOAD,
            flags=runner_launcher.PYTHON_FLAGS,
            env={"PATH": self.path, "LANG": "C.UTF-8", "HOME": os.environ.get("HOME", "/tmp")})

    def start(self) -> Runners:
        self.server.start()
        return self

    def spawn(self, argv: list[str], env: dict[str, str], cwd: Path,
              log_path: Path) -> forkserver.Forked | None:
        """The process, if `argv` starts the runner's launcher; None otherwise (or when the
        server is gone: the caller then starts the launcher itself)."""
        found = shutil.which(argv[0], path=env.get("PATH", "")) if argv else None
        if found is None or Path(found).resolve() != self.launcher.resolve():
            return None
        try:
            return self.server.spawn(
                [runner_launcher.MODULE, *argv[1:]], env=runner_launcher.launched_env(
                    env, self.path), cwd=cwd, log_path=log_path,
                shown_argv=runner_launcher.launched_argv(self.python, argv[1:]))
        except forkserver.Unavailable as e:
            log.warning("event=fork-unavailable error=%r", str(e))
            return None

    def stop(self) -> None:
        self.server.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--work-dir", required=True, type=Path,
                        help="where each pod's working directory and log go")
    parser.add_argument("--fork-runners", action=argparse.BooleanOptionalAction, default=True,
                        help="fork runner processes from an imported runner (default) instead "
                             "of starting each through the launcher")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    python = Path(sys.executable)
    try:
        launcher = runner_launcher.build(python)
    except runner_launcher.LauncherUnavailable as e:
        parser.exit(1, f"devnode: {e}\n")
    # Built (or found) before the first pod, so a missing Go toolchain fails here, once.
    peers.expansion_binary()
    api = config.new_client_from_config(config_file=args.kubeconfig)
    runners: Runners | None = None
    if args.fork_runners:
        try:
            runners = Runners(python, launcher, args.work_dir).start()
        except forkserver.Unavailable as e:
            log.warning("event=fork-unavailable error=%r: runners start through the launcher",
                        str(e))
    # The launcher's directory first: the operator's command `agentrun-runner` then starts
    # the runner isolated, as in the runner image, not pip's console script beside Python.
    node = DevNode(api, args.work_dir,
                   extra_path=os.pathsep.join((str(launcher.parent), str(python.parent))),
                   runners=runners)
    signal.signal(signal.SIGTERM, lambda *_: node.stopping.set())
    node.run()


if __name__ == "__main__":
    main()
