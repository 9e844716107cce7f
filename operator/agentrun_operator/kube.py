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

from agentrun.vocabulary import (
    AGENT_PLURAL,
    GROUP,
    REPLAY_PLURAL,
    RUN_PLURAL,
    SCHEDULE_PLURAL,
    VERSION,
)


class InputMissing(Exception):
    """An input file's ConfigMap/Secret (or key) does not exist."""


class InputForbidden(Exception):
    """The operator may not read an input file's ConfigMap/Secret (its RBAC, not the
    run's fault: it may be granted later)."""


class Conflict(Exception):
    """A write lost to a newer one (resourceVersion precondition): read again, decide
    again."""


def api_message(e: ApiException) -> str:
    """The API server's own sentence for a refusal."""
    try:
        return str(json.loads(e.body or "{}").get("message") or e.reason)
    except ValueError:
        return str(e.reason)


def _json(response: Any) -> dict[str, Any]:
    return dict(json.loads(response.data))


def resource_version(obj: Mapping[str, Any]) -> int:
    """An object's (or a list's) resourceVersion as a number (etcd's revision: what a list
    at that version cannot have seen is newer), 0 when it is not one."""
    version = str((obj.get("metadata") or {}).get("resourceVersion") or "")
    return int(version) if version.isdigit() else 0


class Kube:
    """A thin async façade over the Kubernetes API for what the operator does."""

    def __init__(self, api: client.ApiClient | None = None, pool: int = 10) -> None:
        if api is None:
            try:
                config.load_incluster_config()
            except config.ConfigException:
                config.load_kube_config()
            # The connection pool is sized when the client is made, not later: as many
            # connections as threads may call at once (else each extra call opens, and
            # throws away, a TLS connection of its own).
            configuration = client.Configuration.get_default_copy()
            configuration.connection_pool_maxsize = pool
            api = client.ApiClient(configuration)
        self.api = api
        # Untyped: the calls here take plain dicts and mostly return raw responses.
        self.core: Any = client.CoreV1Api(api)
        self.custom: Any = client.CustomObjectsApi(api)
        self.authorization: Any = client.AuthorizationV1Api(api)

    # -- runs and replays ----------------------------------------------------------------

    async def read_run(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await self._read(self.custom.get_namespaced_custom_object, GROUP, VERSION,
                                namespace, RUN_PLURAL, name)

    async def read_custom(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        """An object of one of our kinds (`plural`), or None."""
        return await self._read(self.custom.get_namespaced_custom_object, GROUP, VERSION,
                                namespace, plural, name)

    async def read_replay(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await self._read(self.custom.get_namespaced_custom_object, GROUP, VERSION,
                                namespace, REPLAY_PLURAL, name)

    async def read_schedule(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await self._read(self.custom.get_namespaced_custom_object, GROUP, VERSION,
                                namespace, SCHEDULE_PLURAL, name)

    async def create_run(self, manifest: Mapping[str, Any]) -> dict[str, Any] | None:
        """Creates an AgentRun and returns it; None if one of that name exists already."""
        ns = manifest["metadata"]["namespace"]
        try:
            response = await asyncio.to_thread(
                self.custom.create_namespaced_custom_object, GROUP, VERSION, ns, RUN_PLURAL,
                dict(manifest), _preload_content=False)
        except ApiException as e:
            if e.status == 409:
                return None
            raise
        return _json(response)

    async def annotate_run(self, namespace: str, name: str, uid: str,
                           annotations: Mapping[str, str]) -> bool:
        """Merges `annotations` into AgentRun `name`, only if it is still the run `uid`
        (a precondition the API server checks). Returns whether it was annotated."""
        body = {"metadata": {"uid": uid, "annotations": dict(annotations)}}
        try:
            await asyncio.to_thread(self.custom.patch_namespaced_custom_object, GROUP,
                                    VERSION, namespace, RUN_PLURAL, name, body)
        except ApiException as e:
            if e.status in (404, 409):  # 409: another run of that name
                return False
            raise
        return True

    async def delete_run(self, namespace: str, name: str, uid: str) -> bool:
        """Deletes AgentRun `name` only if it is still the run `uid`. Its finalizer then
        keeps it until the store holds its record. Returns whether this call deleted it."""
        return await self.delete_object(RUN_PLURAL, namespace, name, uid)

    async def delete_object(self, plural: str, namespace: str, name: str, uid: str) -> bool:
        """Deletes our kind's object `name` only if it is still the object `uid`. Returns
        whether this call deleted it (False: gone already, or another of that name)."""
        body = {"preconditions": {"uid": uid}}
        try:
            await asyncio.to_thread(self.custom.delete_namespaced_custom_object, GROUP,
                                    VERSION, namespace, plural, name, body=body)
        except ApiException as e:
            if e.status in (404, 409):
                return False
            raise
        return True

    async def list_runs(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        return (await self.list_runs_versioned(namespace, label_selector))[0]

    async def list_runs_everywhere(self, label_selector: str) -> list[dict[str, Any]]:
        response = await asyncio.to_thread(
            self.custom.list_cluster_custom_object, GROUP, VERSION, RUN_PLURAL,
            label_selector=label_selector, _preload_content=False)
        return list(_json(response).get("items") or [])

    async def namespaces(self) -> tuple[set[str], set[str], int]:
        """The namespaces, those of them being deleted, and the list's resourceVersion."""
        response = await asyncio.to_thread(self.core.list_namespace, _preload_content=False)
        listed = _json(response)
        items = listed.get("items") or []
        return ({n["metadata"]["name"] for n in items},
                {n["metadata"]["name"] for n in items if n["metadata"].get("deletionTimestamp")},
                int((listed.get("metadata") or {}).get("resourceVersion") or 0))

    async def list_runs_versioned(self, namespace: str, label_selector: str = ""
                                  ) -> tuple[list[dict[str, Any]], int]:
        """The runs of `namespace` (by label), and the list's resourceVersion."""
        response = await asyncio.to_thread(
            self.custom.list_namespaced_custom_object, GROUP, VERSION, namespace, RUN_PLURAL,
            label_selector=label_selector, _preload_content=False)
        listed = _json(response)
        return list(listed.get("items") or []), resource_version(listed)

    async def list_agents(self, namespace: str) -> tuple[list[dict[str, Any]], int]:
        """The Agents of a namespace, as they are now (none where the kind is not served:
        an install from before Agents), and the list's resourceVersion (0: unknown)."""
        try:
            response = await asyncio.to_thread(
                self.custom.list_namespaced_custom_object, GROUP, VERSION, namespace,
                AGENT_PLURAL, _preload_content=False)
        except ApiException as e:
            if e.status == 404:
                return [], 0
            raise
        listed = _json(response)
        return list(listed.get("items") or []), resource_version(listed)

    async def secret_keys(self, namespace: str, name: str) -> set[str] | None:
        """The keys of a Secret (None: it does not exist); its values are not kept."""
        found = await self._read(self.core.read_namespaced_secret, name, namespace)
        return None if found is None else set((found.get("data") or {}).keys())

    async def patch_run_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        await self._patch_status(RUN_PLURAL, namespace, name, status)

    async def replace_status(self, plural: str, obj: Mapping[str, Any],
                             status: Mapping[str, Any]) -> dict[str, Any]:
        """Writes the whole status of `obj` as `status`, only if `obj` is still the newest
        (its resourceVersion is the precondition): one write per transition, nulls
        included, and a stale writer gets Conflict instead of overwriting."""
        meta = obj["metadata"]
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": obj.get("kind"),
                "metadata": {"name": meta["name"], "namespace": meta["namespace"],
                             "resourceVersion": meta["resourceVersion"]},
                "status": dict(status)}
        try:
            response = await asyncio.to_thread(
                self.custom.replace_namespaced_custom_object_status, GROUP, VERSION,
                meta["namespace"], plural, meta["name"], body, _preload_content=False)
        except ApiException as e:
            if e.status == 409:
                raise Conflict(api_message(e)) from e
            raise
        return _json(response)

    async def patch_finalizers(self, plural: str, obj: Mapping[str, Any],
                               finalizers: Sequence[str]) -> dict[str, Any]:
        """Sets metadata.finalizers, only if `obj` is still the newest (JSON patch test)."""
        meta = obj["metadata"]
        ops = [{"op": "test", "path": "/metadata/resourceVersion",
                "value": meta["resourceVersion"]},
               {"op": "add", "path": "/metadata/finalizers", "value": list(finalizers)}]
        try:
            response = await asyncio.to_thread(
                self.custom.patch_namespaced_custom_object, GROUP, VERSION, meta["namespace"],
                plural, meta["name"], ops, _content_type="application/json-patch+json",
                _preload_content=False)
        except ApiException as e:
            if e.status in (409, 422):  # 422: the test op failed (someone wrote first)
                raise Conflict(api_message(e)) from e
            if e.status == 404:
                return {}
            raise
        return _json(response)

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

    async def create_pod(self, manifest: Mapping[str, Any]) -> dict[str, Any] | None:
        """Creates a pod and returns it; None if one of that name exists already."""
        ns = manifest["metadata"]["namespace"]
        try:
            response = await asyncio.to_thread(self.core.create_namespaced_pod, ns,
                                               dict(manifest), _preload_content=False)
        except ApiException as e:
            if e.status == 409:
                return None
            raise
        return _json(response)

    async def dry_run_create_pod(self, manifest: Mapping[str, Any]) -> None:
        """Server-side dry run of a pod create (admission included); raises if refused."""
        await asyncio.to_thread(self.core.create_namespaced_pod,
                                manifest["metadata"]["namespace"], dict(manifest),
                                dry_run="All")

    async def dry_run_create_run(self, manifest: Mapping[str, Any]) -> None:
        await asyncio.to_thread(self.custom.create_namespaced_custom_object, GROUP, VERSION,
                                manifest["metadata"]["namespace"], RUN_PLURAL, dict(manifest),
                                dry_run="All")

    async def read_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await self._read(self.core.read_namespaced_pod, name, namespace)

    async def list_pods(
        self, *, label_selector: str, field_selector: str = ""
    ) -> list[dict[str, Any]]:
        response = await asyncio.to_thread(
            self.core.list_pod_for_all_namespaces, label_selector=label_selector,
            field_selector=field_selector, _preload_content=False)
        return list(_json(response).get("items") or [])

    async def delete_pod(self, namespace: str, name: str, uid: str) -> bool:
        """Deletes pod `name` only if it is still the pod `uid` (a precondition the API
        server checks): a pod of that name someone else created is left alone. Returns
        whether this call deleted it."""
        body = {"preconditions": {"uid": uid}}
        try:
            await asyncio.to_thread(self.core.delete_namespaced_pod, name, namespace,
                                    body=body)
        except ApiException as e:
            if e.status in (404, 409):  # 409: the precondition failed (another pod)
                return False
            raise
        return True

    async def read_node(self, name: str) -> dict[str, Any] | None:
        return await self._read(self.core.read_node, name)

    async def ensure_service_account(self, namespace: str, name: str) -> None:
        """The runner's ServiceAccount: no API access, no token mounted."""
        body = {"metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by":
                                                      "agentrun"}},
                "automountServiceAccountToken": False}
        await self._create(self.core.create_namespaced_service_account, namespace, body)

    # -- authorization -----------------------------------------------------------------------

    async def may(self, user: str, groups: Sequence[str], verb: str, resource: str,
                  namespace: str, name: str = "") -> bool:
        """Whether the authorizer allows `user` (with `groups`) to `verb` the core
        `resource` (named `name`, or any) in `namespace`: a SubjectAccessReview."""
        attributes: dict[str, Any] = {"namespace": namespace, "verb": verb, "group": "",
                                      "resource": resource}
        if name:
            attributes["name"] = name
        review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                  "spec": {"user": user, "groups": list(groups),
                           "resourceAttributes": attributes}}
        response = await asyncio.to_thread(
            self.authorization.create_subject_access_review, review, _preload_content=False)
        return bool((_json(response).get("status") or {}).get("allowed"))

    # -- inputs ----------------------------------------------------------------------------

    async def read_input_files(
        self, namespace: str, files: Sequence[Mapping[str, Any]]
    ) -> dict[str, bytes]:
        """Copies every input file's bytes out of its ConfigMap or Secret."""
        out: dict[str, bytes] = {}
        for f in files:
            if f.get("configMapKeyRef"):
                ref, kind = f["configMapKeyRef"], "ConfigMap"
                obj = await self._read_input(self.core.read_namespaced_config_map, kind,
                                             ref["name"], namespace)
                if obj is not None and ref["key"] in (obj.get("data") or {}):
                    out[f["name"]] = obj["data"][ref["key"]].encode()
                    continue
                if obj is not None and ref["key"] in (obj.get("binaryData") or {}):
                    out[f["name"]] = base64.b64decode(obj["binaryData"][ref["key"]])
                    continue
            else:
                ref, kind = f["secretKeyRef"], "Secret"
                obj = await self._read_input(self.core.read_namespaced_secret, kind,
                                             ref["name"], namespace)
                if obj is not None and ref["key"] in (obj.get("data") or {}):
                    out[f["name"]] = base64.b64decode(obj["data"][ref["key"]])
                    continue
            what = f"{kind} {namespace}/{ref['name']}"
            raise InputMissing(
                f"input file {f['name']!r} cannot be read: "
                + (f"{what} does not exist" if obj is None
                   else f"{what} has no key {ref['key']!r}"))
        return out

    async def _read_input(self, method: Any, kind: str, name: str,
                          namespace: str) -> dict[str, Any] | None:
        try:
            return await self._read(method, name, namespace)
        except ApiException as e:
            if e.status == 403:
                raise InputForbidden(
                    f"the operator may not read {kind} {namespace}/{name} "
                    f"({api_message(e)}); grant it get on {kind.lower()}s in {namespace}, "
                    "or watch only namespaces it may read") from e
            raise

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
