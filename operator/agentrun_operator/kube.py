"""The operator's Kubernetes calls, each one small async function.

The official client is synchronous; each call runs in a worker thread so that kopf's
event loop never blocks. Objects come back as plain dicts in the API's own JSON form
(camelCase), which is what the pure decisions take.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Mapping, Sequence
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from agentrun.vocabulary import GROUP, REPLAY_PLURAL, RUN_PLURAL, VERSION


class InputMissing(Exception):
    """An input file's ConfigMap/Secret (or key) cannot be read."""


def _json(response: Any) -> dict[str, Any]:
    return dict(json.loads(response.data))


class Kube:
    """A thin async façade over the Kubernetes API for what the operator does."""

    def __init__(self, api: client.ApiClient | None = None) -> None:
        if api is None:
            try:
                config.load_incluster_config()
            except config.ConfigException:
                config.load_kube_config()
            api = client.ApiClient()
        self.api = api
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)

    # -- runs and replays ----------------------------------------------------------------

    async def read_run(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await self._read(self.custom.get_namespaced_custom_object, GROUP, VERSION,
                                namespace, RUN_PLURAL, name)

    async def read_replay(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await self._read(self.custom.get_namespaced_custom_object, GROUP, VERSION,
                                namespace, REPLAY_PLURAL, name)

    async def create_run(self, manifest: Mapping[str, Any]) -> bool:
        """Creates an AgentRun; False if one of that name exists already."""
        ns = manifest["metadata"]["namespace"]
        return await self._create(self.custom.create_namespaced_custom_object, GROUP, VERSION,
                                  ns, RUN_PLURAL, dict(manifest))

    async def list_runs(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        response = await asyncio.to_thread(
            self.custom.list_namespaced_custom_object, GROUP, VERSION, namespace, RUN_PLURAL,
            label_selector=label_selector, _preload_content=False)
        return list(_json(response).get("items") or [])

    async def patch_run_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        await self._patch_status(RUN_PLURAL, namespace, name, status)

    async def patch_replay_status(
        self, namespace: str, name: str, status: Mapping[str, Any]
    ) -> None:
        await self._patch_status(REPLAY_PLURAL, namespace, name, status)

    async def _patch_status(
        self, plural: str, namespace: str, name: str, status: Mapping[str, Any]
    ) -> None:
        # A JSON merge patch cannot write null (null means "remove"), yet a null
        # toolsExecuted ("unknown") must be said, not left out: those go by JSON patch,
        # and first, so that no reader sees the new phase beside an older value. Only an
        # object with no status yet takes the merge patch first (it creates the status).
        merge = {k: v for k, v in status.items() if v is not None}
        nulls = [{"op": "add", "path": f"/status/{k}", "value": None}
                 for k, v in status.items() if v is None]

        def patch(body: Any, content_type: str | None = None) -> None:
            self.custom.patch_namespaced_custom_object_status(
                GROUP, VERSION, namespace, plural, name, body, _content_type=content_type)

        json_patch = "application/json-patch+json"
        if not nulls:
            await asyncio.to_thread(patch, {"status": merge})
            return
        try:
            await asyncio.to_thread(patch, nulls, json_patch)
        except ApiException as e:
            if e.status != 422:  # 422: there is no /status to add to yet
                raise
            await asyncio.to_thread(patch, {"status": merge})
            await asyncio.to_thread(patch, nulls, json_patch)
            return
        await asyncio.to_thread(patch, {"status": merge})

    # -- pods ------------------------------------------------------------------------------

    async def create_pod(self, manifest: Mapping[str, Any]) -> bool:
        """Creates a pod; False if it exists already (a retried handler: 409 means done)."""
        ns = manifest["metadata"]["namespace"]
        return await self._create(self.core.create_namespaced_pod, ns, dict(manifest))

    async def read_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await self._read(self.core.read_namespaced_pod, name, namespace)

    async def list_pods(
        self, *, label_selector: str, field_selector: str = ""
    ) -> list[dict[str, Any]]:
        response = await asyncio.to_thread(
            self.core.list_pod_for_all_namespaces, label_selector=label_selector,
            field_selector=field_selector, _preload_content=False)
        return list(_json(response).get("items") or [])

    async def delete_pod(self, namespace: str, name: str) -> None:
        try:
            await asyncio.to_thread(self.core.delete_namespaced_pod, name, namespace)
        except ApiException as e:
            if e.status != 404:
                raise

    async def read_node(self, name: str) -> dict[str, Any] | None:
        return await self._read(self.core.read_node, name)

    async def ensure_service_account(self, namespace: str, name: str) -> None:
        """The runner's ServiceAccount: no API access, no token mounted."""
        body = {"metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by":
                                                      "agentrun"}},
                "automountServiceAccountToken": False}
        await self._create(self.core.create_namespaced_service_account, namespace, body)

    # -- inputs ----------------------------------------------------------------------------

    async def read_input_files(
        self, namespace: str, files: Sequence[Mapping[str, Any]]
    ) -> dict[str, bytes]:
        """Copies every input file's bytes out of its ConfigMap or Secret."""
        out: dict[str, bytes] = {}
        for f in files:
            if f.get("configMapKeyRef"):
                ref, kind = f["configMapKeyRef"], "ConfigMap"
                obj = await self._read(self.core.read_namespaced_config_map, ref["name"],
                                       namespace)
                if obj is not None and ref["key"] in (obj.get("data") or {}):
                    out[f["name"]] = obj["data"][ref["key"]].encode()
                    continue
                if obj is not None and ref["key"] in (obj.get("binaryData") or {}):
                    out[f["name"]] = base64.b64decode(obj["binaryData"][ref["key"]])
                    continue
            else:
                ref, kind = f["secretKeyRef"], "Secret"
                obj = await self._read(self.core.read_namespaced_secret, ref["name"], namespace)
                if obj is not None and ref["key"] in (obj.get("data") or {}):
                    out[f["name"]] = base64.b64decode(obj["data"][ref["key"]])
                    continue
            what = f"{kind} {namespace}/{ref['name']}"
            raise InputMissing(
                f"input file {f['name']!r} cannot be read: "
                + (f"{what} does not exist" if obj is None
                   else f"{what} has no key {ref['key']!r}"))
        return out

    # -- internals -------------------------------------------------------------------------

    async def _read(self, method: Any, *args: Any) -> dict[str, Any] | None:
        try:
            response = await asyncio.to_thread(method, *args, _preload_content=False)
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        return _json(response)

    async def _create(self, method: Any, *args: Any) -> bool:
        try:
            await asyncio.to_thread(method, *args)
        except ApiException as e:
            if e.status == 409:
                return False
            raise
        return True
