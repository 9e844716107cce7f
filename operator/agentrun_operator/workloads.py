"""Kueue's Workloads of runner pods: an informer, started only once Kueue's CRDs exist.

A runner pod of a run in a queue is held by Kueue's scheduling gate until its Workload is
admitted; the Workload's QuotaReserved condition says why it waits. This informer keeps
every Workload (slimmed: queue.slim_workload) and an index from each to the pod that owns
it, and puts the pod's run on the work queue when its Workload changes: no polling per run.

The cluster may have no Kueue (then nothing is watched), or get it later: `start` is called
at start-up, on every resync, and when a runner pod shows Kueue's gate, and starts the
informer the first time the Workload CRD is found served. A Kueue removed later leaves the
informer listing 404s, which it logs and retries; the runs then say they wait for Kueue
without its words.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from agentrun.vocabulary import Kueue
from agentrun_operator.informer import Informer, Informers, Key, key_of
from agentrun_operator.queue import owner_pod, slim_workload

log = logging.getLogger("agentrun.operator")


class Workloads:
    """The Workloads of the watched namespaces, by the pod that owns each."""

    def __init__(self, api: client.ApiClient, *, named: list[str],
                 watched: Callable[[str], bool], on_pod: Callable[[Key], None]) -> None:
        self._api = api
        self._named = named
        self._watched = watched
        self._on_pod = on_pod
        self.informer: Informer | Informers | None = None
        self.version = ""
        # (namespace, pod name) -> (namespace, Workload name)
        self._by_pod: dict[Key, Key] = {}
        self._checking: asyncio.Lock | None = None
        self._look: asyncio.Task[bool] | None = None

    @property
    def running(self) -> bool:
        return self.informer is not None

    def of(self, pod: dict[str, Any]) -> dict[str, Any] | None:
        """The Workload Kueue made for `pod` (None: none seen, or no Kueue here)."""
        if self.informer is None:
            return None
        meta = pod.get("metadata") or {}
        found = self._by_pod.get((str(meta.get("namespace") or ""), str(meta.get("name"))))
        workload = self.informer.get(found) if found is not None else None
        if workload is None:
            return None
        owner = owner_pod(workload)
        # A Workload of an earlier pod of the same name (a run deleted and created again)
        # is not this pod's.
        if owner is not None and owner[1] and meta.get("uid") and owner[1] != meta["uid"]:
            return None
        return workload

    def _changed(self, workload: dict[str, Any], deleted: bool) -> None:
        owner = owner_pod(workload)
        if owner is None:
            return
        key = key_of(workload)
        pod_key = (key[0], owner[0])
        if deleted:
            if self._by_pod.get(pod_key) == key:
                del self._by_pod[pod_key]
        else:
            self._by_pod[pod_key] = key
        self._on_pod(pod_key)

    async def served_version(self) -> str:
        """The Workload version this cluster serves, of those read ("" = no Kueue, or the
        operator may not read its CRD)."""
        ext = client.ApiextensionsV1Api(self._api)
        try:
            crd = await asyncio.to_thread(ext.read_custom_resource_definition,
                                          Kueue.WORKLOAD_CRD)
        except ApiException as e:
            if e.status not in (403, 404):
                log.warning("event=kueue-check-failed status=%s reason=%s", e.status,
                            e.reason)
            return ""
        served = {v.name for v in crd.spec.versions or [] if v.served}
        return next((v for v in Kueue.WORKLOAD_VERSIONS if v in served), "")

    async def start(self) -> bool:
        """Starts the informer if Kueue's Workloads are served and it is not running yet;
        returns whether it runs."""
        if self.informer is not None:
            return True
        self._checking = self._checking or asyncio.Lock()
        async with self._checking:
            if self.informer is not None:
                return True
            version = await self.served_version()
            if not version:
                return False
            api = client.CustomObjectsApi(self._api)
            try:  # may we read them? (the chart grants it; a hand-made role may not)
                if self._named:
                    await asyncio.to_thread(api.list_namespaced_custom_object, Kueue.GROUP,
                                            version, self._named[0], Kueue.WORKLOAD_PLURAL,
                                            limit=1)
                else:
                    await asyncio.to_thread(api.list_cluster_custom_object, Kueue.GROUP,
                                            version, Kueue.WORKLOAD_PLURAL, limit=1)
            except ApiException as e:
                log.warning("event=kueue-workloads-unreadable status=%s: runs in a queue "
                            "show Kueue's gate without its words; grant the operator get, "
                            "list and watch on workloads.kueue.x-k8s.io (the chart does)",
                            e.status)
                return False
            if self._named:
                self.informer = Informers([
                    Informer(f"workloads-{ns}", functools.partial(
                        api.list_namespaced_custom_object, Kueue.GROUP, version, ns,
                        Kueue.WORKLOAD_PLURAL), slim=slim_workload, on_change=self._changed)
                    for ns in self._named]).start()
            else:
                self.informer = Informer(
                    "workloads", functools.partial(api.list_cluster_custom_object,
                                                   Kueue.GROUP, version,
                                                   Kueue.WORKLOAD_PLURAL),
                    slim=slim_workload, on_change=self._changed,
                    watched=self._watched).start()
            self.version = version
            log.info("event=kueue-found version=%s: runs in a queue show Kueue's admission",
                     version)
            return True

    def look(self) -> None:
        """Looks for Kueue's Workloads in the background (one look at a time)."""
        if self.informer is None and (self._look is None or self._look.done()):
            self._look = asyncio.create_task(self.start())

    def stop(self) -> None:
        if self._look is not None:
            self._look.cancel()
        if self.informer is not None:
            self.informer.stop()
