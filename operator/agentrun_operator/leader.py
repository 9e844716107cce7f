"""Leader election on a coordination.k8s.io Lease: one replica acts, the others stand by.

Every replica watches and keeps its caches warm; only the holder of the Lease reconciles.
The holder renews it every `renew` seconds; a standby takes it over once it has not been
renewed for `duration` seconds (the holder died, or lost the API server). Taking over and
renewing are writes with the Lease's resourceVersion as precondition, so two standbys
cannot both win. A holder that cannot renew in time steps down before its lease runs out.

Leadership is an optimisation of who does the work, not the safety of the work: a
replica that still believes it leads for a moment after losing the Lease writes with
preconditions (resourceVersion on AgentRun status, first writer wins in the store), so a
stale write loses instead of overwriting.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

log = logging.getLogger("agentrun.operator")

LEASE_NAME = "agentrun-operator"


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _stamp(t: datetime.datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse(value: str | None) -> datetime.datetime | None:
    if not value:
        return None
    return datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))


def identity() -> str:
    """This replica's name in the Lease: the pod (host) name and the process."""
    return f"{os.environ.get('POD_NAME') or socket.gethostname()}-{os.getpid()}"


class LeaderElection:
    def __init__(self, api: client.ApiClient, namespace: str, *, me: str | None = None,
                 duration: float = 15.0, renew: float = 5.0, retry: float = 1.0) -> None:
        self._coordination: Any = client.CoordinationV1Api(api)
        self.namespace = namespace
        self.me = me or identity()
        self.duration, self.renew, self.retry = duration, renew, retry
        self.leading = asyncio.Event()
        self._renewed_at = 0.0
        self._seen: tuple[Any, Any] = (None, None)
        self._seen_at = 0.0

    async def run(self, on_start: Callable[[], Awaitable[None]],
                  on_stop: Callable[[], Awaitable[None]]) -> None:
        """Campaigns forever: `on_start` when this replica takes the lease, `on_stop`
        when it loses it."""
        loop = asyncio.get_running_loop()
        while True:
            try:
                held = await asyncio.to_thread(self._try_acquire_or_renew)
            except Exception as e:
                log.warning("event=lease-error lease=%s/%s error=%r", self.namespace,
                            LEASE_NAME, e)
                held = False
            if held:
                self._renewed_at = loop.time()
                if not self.leading.is_set():
                    self.leading.set()
                    log.info("event=leading lease=%s/%s identity=%s", self.namespace,
                             LEASE_NAME, self.me)
                    await on_start()
            elif self.leading.is_set() and loop.time() - self._renewed_at > \
                    self.duration - self.renew:
                # Step down before the lease runs out, not after someone took it.
                self.leading.clear()
                log.warning("event=stepped-down lease=%s/%s identity=%s", self.namespace,
                            LEASE_NAME, self.me)
                await on_stop()
            await asyncio.sleep(self.renew if self.leading.is_set() else self.retry)

    def _try_acquire_or_renew(self) -> bool:
        now = _now()
        try:
            lease = self._coordination.read_namespaced_lease(
                LEASE_NAME, self.namespace, _preload_content=False)
        except ApiException as e:
            if e.status != 404:
                raise
            body = {"metadata": {"name": LEASE_NAME, "namespace": self.namespace},
                    "spec": {"holderIdentity": self.me, "leaseDurationSeconds":
                             int(self.duration), "acquireTime": _stamp(now),
                             "renewTime": _stamp(now), "leaseTransitions": 0}}
            try:
                self._coordination.create_namespaced_lease(self.namespace, body)
            except ApiException as e2:
                if e2.status == 409:
                    return False
                raise
            return True
        import json

        found = json.loads(lease.data)
        spec = found.get("spec") or {}
        mine = spec.get("holderIdentity") == self.me
        # Expiry is timed on our own clock, from when we last saw the holder renew (as
        # client-go does): the holder's renewTime is its clock, and clocks may disagree.
        seen = (spec.get("holderIdentity"), spec.get("renewTime"))
        if seen != self._seen:
            self._seen, self._seen_at = seen, time.monotonic()
        silent = time.monotonic() - self._seen_at > float(
            spec.get("leaseDurationSeconds") or self.duration)
        if not mine and spec.get("holderIdentity") and not silent:
            return False
        spec = {**spec, "holderIdentity": self.me, "renewTime": _stamp(now),
                "leaseDurationSeconds": int(self.duration)}
        if not mine:
            spec["acquireTime"] = _stamp(now)
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
        # resourceVersion in the body: the replace is refused (409) if anyone wrote the
        # lease since we read it.
        body = {"metadata": {"name": LEASE_NAME, "namespace": self.namespace,
                             "resourceVersion": found["metadata"]["resourceVersion"]},
                "spec": spec}
        try:
            self._coordination.replace_namespaced_lease(LEASE_NAME, self.namespace, body)
        except ApiException as e:
            if e.status == 409:
                return False
            raise
        return True

    def release(self) -> None:
        """Gives the lease up at a clean stop, so a standby need not wait it out."""
        try:
            lease = self._coordination.read_namespaced_lease(LEASE_NAME, self.namespace)
            if lease.spec.holder_identity != self.me:
                return
            lease.spec.holder_identity = None
            lease.spec.renew_time = None
            self._coordination.replace_namespaced_lease(LEASE_NAME, self.namespace, lease)
        except Exception as e:
            log.warning("event=lease-release-failed error=%r", e)
