"""Kubernetes Events on our objects (what `kubectl describe` shows), from component
`agentrun-operator`.

Events are posted in the background, never in a reconcile's way (an eviction's Failed is
not held up by its Event), through the operator's API client, once `configure` has been
called; before that (a step called directly in a test) the status says the same. They go
out on threads of their own (EVENT_THREADS): a burst of launches posts three Events a run,
and on the threads the reconciles share they would queue ahead of every pod create and
status write (the Job controller's event recorder is asynchronous for the same reason).
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kubernetes import client

from agentrun.vocabulary import API_VERSION, REPLAY_KIND, RUN_KIND

log = logging.getLogger("agentrun.operator")
COMPONENT = "agentrun-operator"

# Threads that post Events (the API client's connection pool holds as many more).
EVENT_THREADS = 4

_core: Any = None
_threads: ThreadPoolExecutor | None = None
_pending: set[asyncio.Task[None]] = set()


def configure(api: client.ApiClient | None) -> None:
    """Where Events go (None: nowhere)."""
    global _core, _threads
    _core = None if api is None else client.CoreV1Api(api)
    if _threads is None and api is not None:
        _threads = ThreadPoolExecutor(EVENT_THREADS, "events")


def post(obj: Mapping[str, Any], reason: str, message: str, *, warning: bool = False) -> None:
    """Posts an Event on one of our objects (its kind, else an AgentRun or AgentRunReplay
    told apart by its spec)."""
    if _core is None:
        return
    meta = obj["metadata"]
    kind = str(obj.get("kind") or (
        REPLAY_KIND if "runName" in (obj.get("spec") or {}) else RUN_KIND))
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    body = {
        "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
        "involvedObject": {"apiVersion": API_VERSION, "kind": kind, "name": meta["name"],
                           "namespace": meta["namespace"], "uid": meta["uid"]},
        "reason": reason, "message": message[:1024],
        "type": "Warning" if warning else "Normal",
        "source": {"component": COMPONENT}, "reportingComponent": COMPONENT,
        "firstTimestamp": now, "lastTimestamp": now, "count": 1,
    }
    task = asyncio.get_running_loop().create_task(_send(meta["namespace"], body))
    _pending.add(task)
    task.add_done_callback(_pending.discard)


def _create(namespace: str, body: dict[str, Any]) -> None:
    # The answer is read (the connection goes back to the pool) but not turned into
    # client models: nothing looks at it, and decoding it cost more than the request.
    response = _core.create_namespaced_event(namespace, body, _preload_content=False)
    response.drain_conn()
    response.release_conn()


async def _send(namespace: str, body: dict[str, Any]) -> None:
    try:
        await asyncio.get_running_loop().run_in_executor(_threads, _create, namespace, body)
    except Exception as e:  # an Event is a courtesy; the status is the record
        log.warning("event=event-post-failed reason=%s error=%r", body["reason"], e)
