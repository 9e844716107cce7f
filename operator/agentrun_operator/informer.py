"""An informer: a list + watch of one kind, filtered by the API server, kept in memory.

The operator needs every runner pod and every node, and nothing else: the pod watch is
filtered server-side by the label selector `agentrun.dev/run` (a client-side filter would
still bring every pod event of the cluster into the process). Objects are kept slimmed
(only the fields the decisions read) and decoded once from the raw JSON stream; the
typed client's model objects cost several times the memory and CPU.

The list and the watch run in a thread of their own (the Kubernetes client is
synchronous); every change is applied to the cache on the event loop, then `on_change`
is called there with the object (and whether it was deleted).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from kubernetes.client.exceptions import ApiException

log = logging.getLogger("agentrun.operator")

Key = tuple[str, str]  # (namespace, name); namespace "" for cluster-scoped objects
Slim = Callable[[Mapping[str, Any]], dict[str, Any]]
OnChange = Callable[[dict[str, Any], bool], None]

WATCH_TIMEOUT_SECONDS = 300


def key_of(obj: Mapping[str, Any]) -> Key:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def watch_lines(response: Any) -> Iterator[bytes]:
    """The lines of a watch response (one JSON event each), as they arrive."""
    buffer = b""
    for chunk in response.stream(amt=65536, decode_content=True):
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            if line.strip():
                yield line
    if buffer.strip():
        yield buffer


class Informer:
    """The objects one list function returns, up to date, by (namespace, name)."""

    def __init__(self, name: str, list_fn: Callable[..., Any], *, slim: Slim,
                 on_change: OnChange, label_selector: str = "",
                 watched: Callable[[str], bool] = lambda _: True) -> None:
        self.name = name
        self._list = list_fn
        self._slim = slim
        self._on_change = on_change
        self._selector = label_selector
        self._watched = watched
        self.objects: dict[Key, dict[str, Any]] = {}
        self.synced = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        self._stopping = threading.Event()
        self._response: Any = None
        self._thread = threading.Thread(target=self._run, name=f"informer-{name}", daemon=True)

    def start(self) -> Informer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        response = self._response
        if response is not None:
            try:
                response.shutdown()
            except Exception:
                response.release_conn()

    def get(self, key: Key) -> dict[str, Any] | None:
        return self.objects.get(key)

    # -- on the event loop ---------------------------------------------------------------

    def _replace(self, items: list[dict[str, Any]]) -> None:
        fresh = {key_of(o): o for o in items}
        gone = [o for k, o in self.objects.items() if k not in fresh]
        self.objects = fresh
        for obj in gone:
            self._on_change(obj, True)
        for obj in items:
            self._on_change(obj, False)
        self.synced.set()

    def _apply(self, kind: str, obj: dict[str, Any]) -> None:
        key = key_of(obj)
        if kind == "DELETED":
            self.objects.pop(key, None)
            self._on_change(obj, True)
        else:
            self.objects[key] = obj
            self._on_change(obj, False)

    # -- in the informer's thread ----------------------------------------------------------

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                version = self._relist()
                while not self._stopping.is_set() and version:
                    version = self._watch(version)
            except Exception as e:
                if self._stopping.is_set():
                    return
                log.warning("event=informer-restart informer=%s error=%r", self.name, e)
                time.sleep(1)

    def _relist(self) -> str:
        response = self._list(label_selector=self._selector, _preload_content=False)
        body = json.loads(response.data)
        items = [self._slim(o) for o in body.get("items") or []
                 if self._watched(str((o.get("metadata") or {}).get("namespace") or ""))]
        self._loop.call_soon_threadsafe(self._replace, items)
        return str((body.get("metadata") or {}).get("resourceVersion") or "")

    def _watch(self, version: str) -> str:
        """One watch call; returns the version to go on from ("" = list again)."""
        try:
            self._response = response = self._list(
                label_selector=self._selector, watch=True, resource_version=version,
                allow_watch_bookmarks=True, timeout_seconds=WATCH_TIMEOUT_SECONDS,
                _preload_content=False)
        except ApiException as e:
            if e.status == 410:
                return ""
            raise
        try:
            for line in watch_lines(response):
                event = json.loads(line)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    # 410 Gone: our version is too old; anything else: start over too.
                    log.info("event=informer-relist informer=%s status=%s", self.name,
                             obj.get("code"))
                    return ""
                version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                if kind == "BOOKMARK":
                    continue
                if not self._watched(str((obj.get("metadata") or {}).get("namespace") or "")):
                    continue
                self._loop.call_soon_threadsafe(self._apply, kind, self._slim(obj))
        finally:
            self._response = None
            response.release_conn()
        return version


class AllSynced:
    """Set once every one of several informers has listed (an asyncio.Event's reading
    side, for a group)."""

    def __init__(self, events: list[asyncio.Event]) -> None:
        self._events = events

    def is_set(self) -> bool:
        return all(e.is_set() for e in self._events)

    async def wait(self) -> bool:
        await asyncio.gather(*(e.wait() for e in self._events))
        return True


class Informers:
    """One informer per namespace, read as one. With `operator.namespaces` set the operator
    holds its rights there only (a Role in each), so it lists and watches each of them,
    never the whole cluster."""

    def __init__(self, informers: list[Informer]) -> None:
        self._informers = informers
        self.synced = AllSynced([i.synced for i in informers])

    @property
    def objects(self) -> dict[Key, dict[str, Any]]:
        if len(self._informers) == 1:
            return self._informers[0].objects
        merged: dict[Key, dict[str, Any]] = {}
        for informer in self._informers:
            merged.update(informer.objects)
        return merged

    def get(self, key: Key) -> dict[str, Any] | None:
        for informer in self._informers:
            found = informer.get(key)
            if found is not None:
                return found
        return None

    def start(self) -> Informers:
        for informer in self._informers:
            informer.start()
        return self

    def stop(self) -> None:
        for informer in self._informers:
            informer.stop()
