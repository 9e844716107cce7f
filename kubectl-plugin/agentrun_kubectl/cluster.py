"""The cluster as the plugin's user sees it: their kubeconfig (or --as), the agentrun kinds
in one namespace, the aggregated API store.agentrun.dev, and the API server's own words
when it refuses."""

from __future__ import annotations

import copy
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from agentrun.vocabulary import (
    GROUP,
    REPLAY_PLURAL,
    RUN_PLURAL,
    TRANSCRIPT_API_SERVICE,
    TRANSCRIPT_GROUP,
    TRANSCRIPT_PLURAL,
    TRANSCRIPT_VERSION,
    VERSION,
)

SA_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")

OK, REFUSED, ERROR = 0, 1, 2
# How long a 503 of the aggregated API is waited out: longer than the aggregator's 30 s
# between looks at an unavailable APIService.
UNAVAILABLE_WAIT = 45.0


class Failure(Exception):
    """Something the user must fix; printed without a traceback."""

    def __init__(self, message: str, code: int = ERROR, status: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.status = status  # the API server's HTTP status, when it answered


# -- the cluster --------------------------------------------------------------------------


class Cluster:
    """The two kinds, in one namespace, through the official client."""

    def __init__(self, kubeconfig: str | None, context: str | None,
                 namespace: str | None, as_user: str | None = None,
                 as_group: str | None = None) -> None:
        try:
            if kubeconfig or context or not SA_NAMESPACE.exists():
                config.load_kube_config(config_file=kubeconfig, context=context)
                contexts, current = config.list_kube_config_contexts(config_file=kubeconfig)
                if context:
                    current = next(c for c in contexts if c["name"] == context)
                default_ns = (current.get("context") or {}).get("namespace") or "default"
            else:
                config.load_incluster_config()
                default_ns = SA_NAMESPACE.read_text().strip()
        except (config.ConfigException, OSError, StopIteration) as e:
            raise Failure(f"cannot find a cluster to talk to: {e}") from e
        self.namespace = namespace or default_ns
        if as_user:
            # Impersonation, as kubectl's --as/--as-group (kubectl passes no flag it placed
            # before a plugin's name; these go after it).
            configuration = client.Configuration.get_default_copy()
            api = client.ApiClient(configuration)
            api.set_default_header("Impersonate-User", as_user)
            if as_group:
                api.set_default_header("Impersonate-Group", as_group)
            client.Configuration.set_default(configuration)
            self._api_client = api
        else:
            self._api_client = client.ApiClient()
        self.api = client.CustomObjectsApi(self._api_client)

    def at(self, namespace: str) -> Cluster:
        """The same user and connection, in another namespace (the console's many)."""
        other = copy.copy(self)
        other.namespace = namespace
        return other

    @property
    def api_client(self) -> client.ApiClient:
        """The connection every request of this user goes through (--as included)."""
        return self._api_client

    def get(self, plural: str, name: str) -> dict[str, Any] | None:
        try:
            found: Any = self.api.get_namespaced_custom_object(
                GROUP, VERSION, self.namespace, plural, name)
        except ApiException as e:
            if e.status == 404:
                return None
            raise Failure(api_message(e)) from e
        return dict(found)

    def create_replay(self, manifest: dict[str, Any]) -> dict[str, Any]:
        try:
            created: Any = self.api.create_namespaced_custom_object(
                GROUP, VERSION, self.namespace, REPLAY_PLURAL, manifest)
        except ApiException as e:
            raise Failure(api_message(e), REFUSED if e.status in (403, 422) else ERROR) from e
        return dict(created)

    def create(self, plural: str, manifest: dict[str, Any]) -> dict[str, Any]:
        try:
            created: Any = self.api.create_namespaced_custom_object(
                GROUP, VERSION, self.namespace, plural, manifest)
        except ApiException as e:
            raise Failure(api_message(e), REFUSED if e.status in (403, 409, 422) else ERROR) \
                from e
        return dict(created)

    def whoami(self) -> str:
        """The current user's name, as the API server authenticates it (SelfSubjectReview)."""
        review: Any = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
        try:
            done: Any = client.AuthenticationV1Api(
                self._api_client).create_self_subject_review(review)
        except ApiException as e:
            raise Failure(api_message(e)) from e
        return str(done.status.user_info.username)

    def serves(self, plural: str) -> bool:
        """Whether the API server serves this agentrun kind (its CRD is installed), from
        discovery, which every user may read: a list of an absent kind by a user without
        rights is answered 403, not 404."""
        found = self._read(f"/apis/{GROUP}/{VERSION}", [])
        return any(r.get("name") == plural for r in found.get("resources") or [])

    def transcript_path(self, run: str) -> str:
        return (f"/apis/{TRANSCRIPT_GROUP}/{TRANSCRIPT_VERSION}/namespaces/{self.namespace}/"
                f"{TRANSCRIPT_PLURAL}/{run}")

    def transcript(self, run: str, uid: str | None = None) -> dict[str, Any]:
        """The run's Transcript, through the API server as the current user (with `uid`:
        that run of the name, its AgentRun deleted or not)."""
        return self._read(self.transcript_path(run), _by_uid(uid))

    def follow(self, run: str, uid: str | None = None) -> Any:
        """The streamed entries of a live run (`?follow=true`): a response to read by line."""
        return self._call(self.transcript_path(run), [("follow", "true"), *_by_uid(uid)],
                          stream=True)

    def records(self, query: list[tuple[str, str]], *, everywhere: bool) -> Iterator[
            dict[str, Any]]:
        """The run archive's RunRecords (runs.store.agentrun.dev), newest first, every page
        of them."""
        where = "" if everywhere else f"/namespaces/{self.namespace}"
        path = f"/apis/{TRANSCRIPT_GROUP}/{TRANSCRIPT_VERSION}{where}/runs"
        token = ""
        while True:
            page = self._read(path, [*query, *([("continue", token)] if token else [])])
            yield from page.get("items") or []
            token = (page.get("metadata") or {}).get("continue") or ""
            if not token:
                return

    def _read(self, path: str, query: list[tuple[str, str]]) -> dict[str, Any]:
        response = self._call(path, query)
        try:
            body: dict[str, Any] = json.loads(response.read() or b"{}")
        finally:
            response.response.release_conn()
        return body

    def _call(self, path: str, query: list[tuple[str, str]], *, stream: bool = False) -> Any:
        """GET `path` of the aggregated API. The API server answers 503 while its aggregator
        has not found the transcript API available (just installed, or the store API just
        started: it looks again every 30 s, and at once when the Service's endpoints
        change): that is waited out for UNAVAILABLE_WAIT seconds, saying so once."""
        api = self.api_client  # --as and --as-group hold here too
        deadline = time.monotonic() + UNAVAILABLE_WAIT
        told = False
        while True:
            serialized = api.param_serialize(
                method="GET", resource_path=path, query_params=query,
                header_params={"Accept": "application/json"}, auth_settings=["BearerToken"])
            try:
                # Connect in 10 s; a followed stream may be quiet as long as its run thinks.
                response = api.call_api(*serialized,
                                        _request_timeout=(10, None if stream else 60))
            except (ApiException, OSError) as e:
                raise Failure(f"cannot reach the Kubernetes API server: {e}") from e
            if response.status == 200:
                return response
            body = response.read()
            response.response.release_conn()
            try:
                message = json.loads(body).get("message")
            except ValueError:
                message = None
            said = f"Error from server ({response.reason}): " \
                f"{(message or body.decode(errors='replace')).strip()}"
            if response.status != 503:
                raise Failure(said, REFUSED if response.status in (403, 404) else ERROR,
                              response.status)
            if time.monotonic() >= deadline:
                raise Failure(f"{said}; {self._transcript_api_state()}")
            if not told:
                print(f"{said}: the API server has not found the transcript API available "
                      f"yet ({self._transcript_api_state()}); trying again for up to "
                      f"{UNAVAILABLE_WAIT:.0f} s", file=sys.stderr)
                told = True
            time.sleep(1.0)

    def _transcript_api_state(self) -> str:
        """The transcript APIService's Available condition, as far as the user may read it."""
        name = f"APIService {TRANSCRIPT_API_SERVICE}"
        try:
            found: Any = client.ApiregistrationV1Api(self._api_client).read_api_service(
                TRANSCRIPT_API_SERVICE)
        except ApiException as e:
            return f"{name}: not readable by you ({e.status}); a cluster admin can run " \
                f"`kubectl get apiservice {TRANSCRIPT_API_SERVICE}`"
        except OSError as e:
            return f"{name}: not readable ({e})"
        available = next((c for c in (found.status.conditions or []) if c.type == "Available"),
                         None)
        if available is None:
            return f"{name}: no Available condition yet"
        return f"{name} Available={available.status} {available.reason}: {available.message}"

    def annotate_replay(self, name: str, annotations: dict[str, str]) -> None:
        self.annotate(REPLAY_PLURAL, name, annotations)

    def annotate(self, plural: str, name: str, annotations: dict[str, str]) -> None:
        try:
            self.api.patch_namespaced_custom_object(
                GROUP, VERSION, self.namespace, plural, name,
                {"metadata": {"annotations": annotations}})
        except ApiException as e:
            raise Failure(api_message(e), REFUSED if e.status in (403, 422) else ERROR) from e

    def create_run(self, manifest: dict[str, Any]) -> dict[str, Any] | None:
        """Creates an AgentRun; None when one of that name exists already."""
        try:
            created: Any = self.api.create_namespaced_custom_object(
                GROUP, VERSION, self.namespace, RUN_PLURAL, manifest)
        except ApiException as e:
            if e.status == 409:
                return None
            raise Failure(api_message(e), REFUSED if e.status in (403, 422) else ERROR) from e
        return dict(created)

    def list_runs(self, label_selector: str) -> list[dict[str, Any]]:
        try:
            found: Any = self.api.list_namespaced_custom_object(
                GROUP, VERSION, self.namespace, RUN_PLURAL, label_selector=label_selector)
        except ApiException as e:
            raise Failure(api_message(e)) from e
        return list(found.get("items") or [])


def api_message(e: ApiException) -> str:
    """The API server's own sentence (an admission policy's message, for one)."""
    try:
        message = json.loads(e.body or "{}").get("message")
    except ValueError:
        message = None
    return f"Error from server ({e.reason}): {message or e.body or e}"



def _by_uid(uid: str | None) -> list[tuple[str, str]]:
    return [("fieldSelector", f"metadata.uid={uid}")] if uid else []

