"""The whole system for end-to-end tests: control plane + CRDs, development node, real
Postgres store, and the operator as a real process (`agentrun-operator`)."""

from __future__ import annotations

import asyncio
import functools
import json
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar

from agentrun_devtools.controlplane import REPO, ControlPlane
from agentrun_devtools.processes import Child, ProcessDied, free_port, wait_for
from kubernetes import config as kube_config
from kubernetes import watch
from kubernetes.client import CoreV1Api, CustomObjectsApi
from kubernetes.client.exceptions import ApiException
from sqlalchemy.ext.asyncio import AsyncEngine

from agentrun import store
from agentrun.vocabulary import GROUP, VERSION
from tests.runner_world import StoreAPIProcess

T = TypeVar("T")


class Operator:
    """`agentrun-operator` as a child process, restartable and killable, and beside it its
    store API (`agentrun-store-api`, a process of its own as in the chart), unless `args`
    name one started elsewhere (--store-api-url). The store API outlives a killed or
    restarted operator, as the chart's Deployment does; `stop` stops both."""

    def __init__(self, plane: ControlPlane, store_url: str, log_dir: Path,
                 args: Sequence[str] = (), *, scripted: bool = True,
                 kubeconfig: Path | None = None, transcript_listen: str = "",
                 store_api_metrics_port: int = 0) -> None:
        self.plane, self.store_url, self.log_dir, self.args = plane, store_url, log_dir, args
        # The tests drive runs with the scripted model, which an operator honours only
        # when told to.
        self.scripted = scripted
        # Its credential: the operator's own (group agentrun:operators) unless told.
        self.kubeconfig = kubeconfig or plane.operator_kubeconfig
        self.child: Child | None = None
        self.starts = 0
        # Its store API: one address for its life, restarts included (runner pods keep the
        # URL they were given), serving the transcript API too when told where.
        elsewhere = [a.split("=", 1)[1] for a in args if a.startswith("--store-api-url=")]
        self.store_api: StoreAPIProcess | None = None
        self.store_api_listen = "" if elsewhere else f"127.0.0.1:{free_port()}"
        self.store_api_url = elsewhere[-1] if elsewhere else f"https://{self.store_api_listen}"
        self.transcript_listen = transcript_listen
        self.store_api_metrics_port = store_api_metrics_port
        self.store_api_starts = 0

    def start(self, *, wait: bool = True) -> Operator:
        """Starts it (and its store API, unless that still runs); unless told not to wait,
        returns once it says `event=started` and its store API is ready."""
        self.starts += 1
        if self.store_api_listen and (self.store_api is None
                                      or not self.store_api.child.alive()):
            self.store_api_starts += 1
            self.store_api = StoreAPIProcess(
                self.plane, self.store_url,
                self.log_dir / f"store-api-{self.store_api_starts}.log",
                listen=self.store_api_listen, transcript_listen=self.transcript_listen,
                metrics_port=self.store_api_metrics_port)
        tls = self.plane.store_api_tls
        assert tls is not None
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig),
               "DATABASE_URL": self.store_url}
        self.child = Child(
            "operator",
            [str(Path(sys.executable).parent / "agentrun-operator"),
             f"--store-api-url={self.store_api_url}", f"--store-api-ca-file={tls.ca}",
             *(["--allow-scripted-model"] if self.scripted else []), *self.args],
            self.log_dir / f"operator-{self.starts}.log", env=env)
        if wait:
            self.wait_started()
        return self

    def wait_started(self) -> None:
        marker = "event=started"

        def ready() -> bool:
            assert self.child is not None
            if not self.child.alive():
                raise ProcessDied(f"the operator exited:\n{self.child.log_tail()}")
            return marker in self.child.log_path.read_text(errors="replace")

        wait_for(ready, timeout=60, what="operator")
        # Ready once the operator has migrated the store (it alone migrates).
        if self.store_api is not None:
            self.store_api.wait_ready()

    def kill(self) -> None:
        """SIGKILL: no cleanup, no finalizer work, as a crashed operator."""
        assert self.child is not None
        os.kill(self.child.pid, signal.SIGKILL)
        self.child.process.wait(10)
        self.child.stop()

    def stop(self) -> None:
        if self.child is not None:
            self.child.stop()
            self.child = None
        if self.store_api is not None:
            self.store_api.stop()
            self.store_api = None

    def log(self) -> str:
        return "\n".join(p.read_text(errors="replace")
                         for p in sorted(self.log_dir.glob("operator-*.log")))


class System:
    """What a test drives: kubectl, the store, waiting for a run's status."""

    def __init__(self, plane: ControlPlane, store_url: str, operator: Operator) -> None:
        self.plane, self.store_url, self.operator = plane, store_url, operator

    def kubectl(self, *args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
        return self.plane.kubectl(*args, **kw)

    def apply(self, manifest: dict[str, Any]) -> None:
        self.kubectl("apply", "--server-side", "-f", "-", input=json.dumps(manifest))

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        done = self.kubectl("get", kind, name, "-n", namespace, "-o", "json", check=False)
        return json.loads(done.stdout) if done.returncode == 0 else None

    def run(self, namespace: str, name: str) -> dict[str, Any]:
        found = self.get(f"agentruns.{GROUP}", namespace, name)
        assert found is not None, f"AgentRun {namespace}/{name} not found"
        return found

    def wait_run(self, namespace: str, name: str, check: Callable[[dict[str, Any]], bool],
                 *, timeout: float = 90, what: str = "") -> dict[str, Any]:
        """Until `check(run)` holds (an error it raises counts as "not yet"); returns the
        run. Watches the one AgentRun rather than polling it: a kubectl process every
        0.1 s cost as much CPU as the operator under test, with two test processes on two
        cores."""
        seen: dict[str, Any] = {}
        for seen in watch_object(self.plane, "agentruns", namespace, name, timeout=timeout):
            try:
                if check(seen):
                    return seen
            except Exception:
                continue
        raise AssertionError(
            f"{what or f'AgentRun {name}'} not ready after {timeout:.0f}s; last status: "
            f"{json.dumps(seen.get('status'), indent=1)}\n"
            f"operator log tail:\n{self.operator.log()[-4000:]}")

    def wait_phase(self, namespace: str, name: str, *phases: str,
                   timeout: float = 90) -> dict[str, Any]:
        return self.wait_run(
            namespace, name, lambda r: (r.get("status") or {}).get("phase") in phases,
            timeout=timeout, what=f"AgentRun {name} in {phases}")

    def wait_pod_running(self, namespace: str, pod: str, timeout: float = 60) -> None:
        def running() -> bool:
            found = self.get("pod", namespace, pod)
            return bool(found) and (found.get("status") or {}).get("phase") == "Running"

        wait_for(running, timeout=timeout, what=f"pod {pod} running")

    def evict(self, namespace: str, pod: str) -> None:
        """The Eviction API (what `kubectl drain` uses): DisruptionTarget, then deletion."""
        body = json.dumps({"apiVersion": "policy/v1", "kind": "Eviction",
                           "metadata": {"name": pod, "namespace": namespace}})
        self.kubectl("create", "--raw", f"/api/v1/namespaces/{namespace}/pods/{pod}/eviction",
                     "-f", "-", input=body)

    def store(self, fn: Callable[[AsyncEngine], Awaitable[T]]) -> T:
        """Runs `fn(engine)` against the run store (a fresh engine and event loop)."""

        async def go() -> T:
            engine = store.make_engine(self.store_url)
            try:
                return await fn(engine)
            finally:
                await engine.dispose()

        return asyncio.run(go())

    def emails(self, run_name: str | None = None, uid: str | None = None) -> list[Any]:
        """The emails runs named `run_name` sent, in any namespace (the store is the
        session's); only the run `uid`'s when given."""
        rows = self.store(lambda e: store.outbox(e, run_name))
        return [r for r in rows if r.tool == "send_email" and uid in (None, r.run_uid)]

    def wait_ledger(self, uid: str, tool: str, timeout: float = 60) -> None:
        """Until the run's ledger holds a call of `tool` (it was called, not answered)."""
        def called() -> bool:
            return any(e.tool == tool for e in self.store(lambda en: store.ledger(en, uid)))

        wait_for(called, timeout=timeout, what=f"ledger row for {tool}", interval=0.1)


class HasKubeconfig(Protocol):
    kubeconfig: Path


@functools.cache
def _custom_objects(kubeconfig: Path) -> CustomObjectsApi:
    return CustomObjectsApi(kube_config.new_client_from_config(config_file=str(kubeconfig)))


def delete_namespace(plane: HasKubeconfig, name: str) -> None:
    """Deletes a test's namespace without waiting, and sees that it goes: its AgentRuns
    are deleted and our finalizer taken off them first. An operator that is no longer
    running (a test's own, stopped) holds its runs' finalizers, as it must; a namespace
    held by them stays Terminating, and the namespace controller goes through every kind
    in it (and the aggregated API's) every 15 s until the session ends: with a few dozen
    such namespaces, that was the API server's busiest client."""
    api = _custom_objects(plane.kubeconfig)

    def unless_gone(call: Callable[..., Any], *args: Any) -> Any:
        try:
            return call(*args, _request_timeout=30)
        except ApiException as e:
            if e.status != 404:  # 404: gone, or no AgentRun kind (a plane without the CRDs)
                raise
            return None

    unless_gone(api.delete_collection_namespaced_custom_object, GROUP, VERSION, name,
                "agentruns")
    listed = unless_gone(api.list_namespaced_custom_object, GROUP, VERSION, name, "agentruns")
    for run in (listed or {}).get("items") or []:
        if run["metadata"].get("finalizers"):
            unless_gone(api.patch_namespaced_custom_object, GROUP, VERSION, name, "agentruns",
                        run["metadata"]["name"], {"metadata": {"finalizers": None}})
    unless_gone(CoreV1Api(api.api_client).delete_namespace, name)


def watch_object(plane: ControlPlane, plural: str, namespace: str, name: str, *,
                 timeout: float) -> Iterator[dict[str, Any]]:
    """Each state of one agentrun.dev object, as the API server has it now and then as it
    changes, for `timeout` seconds ({} while it does not exist). A list, then a watch from
    its resourceVersion; a watch the server ends or expires (410) is started again from a
    new list, so no change in between is missed."""
    api = _custom_objects(plane.kubeconfig)
    selector = f"metadata.name={name}"
    deadline = time.monotonic() + timeout
    while (remaining := deadline - time.monotonic()) > 0:
        listing: dict[str, Any] = api.list_namespaced_custom_object(
            GROUP, VERSION, namespace, plural, field_selector=selector,
            _request_timeout=30)
        yield (listing["items"] or [{}])[0]
        stream = watch.Watch()
        try:
            event: dict[str, Any]
            for event in stream.stream(
                    api.list_namespaced_custom_object, GROUP, VERSION, namespace, plural,
                    field_selector=selector,
                    resource_version=listing["metadata"]["resourceVersion"],
                    timeout_seconds=max(1, math.ceil(remaining)),
                    _request_timeout=remaining + 10):
                if event["type"] == "ERROR":
                    break
                yield {} if event["type"] == "DELETED" else event["object"]
                if time.monotonic() > deadline:
                    return
        except ApiException as e:
            if e.status != 410:
                raise
        finally:
            stream.stop()


def as_operator(system: System, fn: Callable[[Any], Awaitable[T]], **config: Any) -> T:
    """Runs `fn(ctx)` with an operator Context of its own (the operator's credential, the
    store), to call a lifecycle or replay step directly, exactly when a test wants it."""
    from agentrun_operator.config import OperatorConfig
    from agentrun_operator.kube import Kube
    from agentrun_operator.reconcile import Context
    from kubernetes import config as kube_config

    async def go() -> T:
        api = kube_config.new_client_from_config(
            config_file=str(system.plane.operator_kubeconfig))
        engine = store.make_engine(system.store_url)
        # The runner pods it creates reach the store through the session operator's store
        # API (the same store), and may use the scripted model, as the tests' runs do.
        config.setdefault("store_api_url", system.operator.store_api_url)
        config.setdefault("allow_scripted_model", True)
        ctx = Context(config=OperatorConfig(database_url=system.store_url, **config),
                      engine=engine, kube=Kube(api))
        try:
            return await fn(ctx)
        finally:
            await engine.dispose()
            api.close()

    return asyncio.run(go())


def agent_run(name: str, script: list[dict[str, Any]] | None = None, *,
              agent: str = "support-agent", text: str = "Customer 42 asks for a refund",
              **spec: Any) -> dict[str, Any]:
    """An AgentRun manifest on the scripted model (deterministic, offline)."""
    body: dict[str, Any] = {"agent": agent, "input": {"text": text}, **spec}
    if script is not None:
        body["model"] = "scripted"
        body.setdefault("env", []).append({"name": "AGENTRUN_SCRIPT",
                                           "value": json.dumps(script)})
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "AgentRun",
            "metadata": {"name": name}, "spec": body}


def in_namespace(manifest: dict[str, Any], namespace: str) -> dict[str, Any]:
    manifest["metadata"]["namespace"] = namespace
    return manifest


HAPPY = [
    {"call": "read_message", "args": {}},
    {"call": "send_email", "args": {"to": "customer-42@example.com", "body": "Refund on its way"}},
    {"call": "update_crm", "args": {"customer": "42", "status": "refunded"}},
    {"text": "Refunded customer 42 and told them."},
]


def email_then_wait(seconds: int = 60) -> list[dict[str, Any]]:
    """send_email records its email, then waits before answering: acted, not answered."""
    return [{"call": "send_email", "args": {"to": "customer-42@example.com",
                                            "body": "Refund on its way",
                                            "delay_seconds": seconds}},
            {"text": "done"}]


__all__ = ["HAPPY", "REPO", "Operator", "System", "agent_run", "email_then_wait",
           "in_namespace"]
