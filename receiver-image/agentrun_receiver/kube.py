"""The receiver's calls to the Kubernetes API: get a trigger and the Secret it names, get or
create a run and its event ConfigMap, hand the ConfigMap to its run, and add to a trigger's
counters. Nothing else: that is all its ServiceAccount may do.

The client is the synchronous kubernetes client, called in threads. A call the API server
does not answer (refused, timed out, 5xx, 429) raises Unavailable: the receiver then
answers 503 with Retry-After and has accepted nothing, so the sender's redelivery is the
queue.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Callable, Mapping
from typing import Any

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from agentrun.vocabulary import GROUP, RUN_PLURAL, TRIGGER_PLURAL, VERSION

# (connect, read) seconds: an API server that does not answer in that time is unavailable.
TIMEOUT = (3.0, 10.0)
# A JSON merge patch: lists (ownerReferences) are replaced whole, and a resourceVersion or
# uid in the body is a precondition.
MERGE_PATCH = "application/merge-patch+json"


class Unavailable(Exception):
    """The API server could not be reached, or did not let the receiver do its part."""


class Conflict(Exception):
    """A write lost to another (a name taken, a stale resourceVersion)."""


def _message(e: ApiException) -> str:
    import json

    try:
        return str(json.loads(e.body or "{}").get("message") or e.reason)
    except ValueError:
        return str(e.reason)


class Kube:
    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        self.custom = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)

    async def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            return await asyncio.to_thread(fn, *args, _request_timeout=TIMEOUT, **kwargs)
        except ApiException as e:
            if e.status == 409:
                raise Conflict(_message(e)) from e
            if e.status is not None and (e.status >= 500 or e.status in (401, 403, 429)):
                raise Unavailable(f"the API server answered {e.status}: {_message(e)}") from e
            raise
        except (urllib3.exceptions.HTTPError, OSError) as e:
            raise Unavailable(f"the API server cannot be reached ({type(e).__name__})") from e

    async def _maybe(self, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return await self._call(fn, *args)
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    async def trigger(self, namespace: str, name: str) -> dict[str, Any] | None:
        found: dict[str, Any] | None = await self._maybe(
            self.custom.get_namespaced_custom_object, GROUP, VERSION, namespace,
            TRIGGER_PLURAL, name)
        return found

    async def secret_value(self, namespace: str, name: str, key: str) -> bytes | None:
        """The value of `key` in Secret `name`; None when the Secret or the key is not
        there."""
        secret = await self._maybe(self.core.read_namespaced_secret, name, namespace)
        data = (secret.data or {}) if secret is not None else {}
        return base64.b64decode(data[key]) if key in data else None

    async def run(self, namespace: str, name: str) -> dict[str, Any] | None:
        found: dict[str, Any] | None = await self._maybe(
            self.custom.get_namespaced_custom_object, GROUP, VERSION, namespace, RUN_PLURAL,
            name)
        return found

    async def create_run(self, manifest: Mapping[str, Any]) -> dict[str, Any]:
        """Creates the run; raises Conflict when its name is taken."""
        created: dict[str, Any] = await self._call(
            self.custom.create_namespaced_custom_object, GROUP, VERSION,
            manifest["metadata"]["namespace"], RUN_PLURAL, dict(manifest))
        return created

    async def configmap(self, namespace: str, name: str) -> dict[str, Any] | None:
        found = await self._maybe(self.core.read_namespaced_config_map, name, namespace)
        if found is None:
            return None
        data: dict[str, Any] = self.api.sanitize_for_serialization(found)
        return data

    async def create_configmap(self, manifest: Mapping[str, Any]) -> dict[str, Any]:
        """Creates the ConfigMap; raises Conflict when its name is taken."""
        created = await self._call(self.core.create_namespaced_config_map,
                                   manifest["metadata"]["namespace"], dict(manifest))
        data: dict[str, Any] = self.api.sanitize_for_serialization(created)
        return data

    async def hand_over(self, namespace: str, name: str, uid: str,
                        owners: list[dict[str, Any]]) -> None:
        """Sets the ConfigMap's owners (its run), if it is still the one written (uid)."""
        await self._call(self.core.patch_namespaced_config_map, name, namespace,
                         {"metadata": {"uid": uid, "ownerReferences": owners}},
                         _content_type=MERGE_PATCH)

    async def count(self, namespace: str, name: str, received: int, duplicates: int,
                    last: str) -> None:
        """Adds to the trigger's status.received and duplicates and sets lastEventTime,
        with the resourceVersion it read as the precondition (raises Conflict when another
        writer came first)."""
        trigger = await self.trigger(namespace, name)
        if trigger is None:
            return
        status = trigger.get("status") or {}
        patch = {"metadata": {"resourceVersion": trigger["metadata"]["resourceVersion"]},
                 "status": {"received": int(status.get("received") or 0) + received,
                            "duplicates": int(status.get("duplicates") or 0) + duplicates,
                            "lastEventTime": max(last, str(status.get("lastEventTime") or ""))}}
        await self._call(self.custom.patch_namespaced_custom_object_status, GROUP, VERSION,
                         namespace, TRIGGER_PLURAL, name, patch, _content_type=MERGE_PATCH)
