"""From a request's token to the one live attempt it speaks for, or a refusal.

Three steps, each cached where what it learns cannot change: TokenReview (who the token
is: a ServiceAccount token bound to a pod), the pod (its labels and its controller, an
AgentRun: which attempt of which run), and the store (that attempt as the operator
recorded it, and whether it is still live).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from sqlalchemy.ext.asyncio import AsyncEngine

from agentrun import store
from agentrun.vocabulary import (
    LABEL_ATTEMPT,
    LABEL_RUN,
    RUN_KIND,
    TOKEN_EXTRA_POD_NAME,
    TOKEN_EXTRA_POD_UID,
    RunStatus,
)
from agentrun_store_api.limits import CACHE_ENTRIES, TOKEN_CACHE_SECONDS
from agentrun_store_api.refusal import Refused


@dataclass(frozen=True)
class Caller:
    """The one attempt a request speaks for, as the store and the API server know it."""

    namespace: str
    pod: str
    run_name: str
    run_uid: str
    attempt: int
    agent: str
    user_id: str
    session_id: str
    app_name: str  # the namespaced ADK app name (store.session_app)
    input_digest: str | None
    resumes_attempt: int | None = None
    resumes_run_uid: str | None = None


@dataclass(frozen=True)
class BoundPod:
    namespace: str
    name: str
    uid: str


class TokenReviewer:
    """Who a token is: TokenReview with our audience, bound to a pod. Cached briefly."""

    def __init__(self, api: client.ApiClient, audience: str) -> None:
        # Untyped: the calls below take plain dicts and return raw responses.
        self._auth: Any = client.AuthenticationV1Api(api)
        self._audience = audience
        self._cache: dict[str, tuple[float, BoundPod]] = {}

    async def pod_of(self, token: str) -> BoundPod:
        key = hashlib.sha256(token.encode()).hexdigest()
        hit = self._cache.get(key)
        if hit is not None and hit[0] > time.monotonic():
            return hit[1]
        review = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                  "spec": {"token": token, "audiences": [self._audience]}}
        try:
            done = await asyncio.to_thread(
                self._auth.create_token_review, review, _preload_content=False)
        except ApiException as e:
            raise Refused(503, f"the store API could not verify the token with the "
                               f"Kubernetes API server ({e.status} {e.reason}); retry") from e
        status = json.loads(done.data).get("status") or {}
        if not status.get("authenticated"):
            raise Refused(401, "the token is not valid for the store API (audience "
                               f"{self._audience}): {status.get('error') or 'not authenticated'}"
                               "; runner pods present their projected store token")
        user = status.get("user") or {}
        extra = user.get("extra") or {}
        names, uids = extra.get(TOKEN_EXTRA_POD_NAME) or [], extra.get(TOKEN_EXTRA_POD_UID) or []
        username = str(user.get("username") or "")
        parts = username.split(":")
        if not names or not uids or len(parts) != 4 or parts[:2] != ["system", "serviceaccount"]:
            raise Refused(403, f"{username or 'the caller'} presented a token that is not "
                               "bound to a pod; the store API serves runner pods only")
        bound = BoundPod(namespace=parts[2], name=str(names[0]), uid=str(uids[0]))
        self._cache[key] = (time.monotonic() + TOKEN_CACHE_SECONDS, bound)
        if len(self._cache) > CACHE_ENTRIES:
            now = time.monotonic()
            self._cache = {k: v for k, v in self._cache.items() if v[0] > now}
        return bound


class Authority:
    """From a request's token to the one live attempt it speaks for, or a refusal."""

    def __init__(self, api: client.ApiClient, engine: AsyncEngine, audience: str,
                 namespaces: tuple[str, ...] = ()) -> None:
        self._tokens = TokenReviewer(api, audience)
        self._core: Any = client.CoreV1Api(api)
        self._engine = engine
        self._namespaces = namespaces
        # The pod's labels and controller, by pod uid (a pod's owner never changes).
        self._pods: dict[str, tuple[float, str, int, str]] = {}

    async def caller(self, request: web.Request) -> Caller:
        header = request.headers.get("Authorization", "")
        if not header.startswith("Bearer ") or not header[7:].strip():
            raise Refused(401, "no token: runner pods send their projected store token as "
                               "'Authorization: Bearer <token>'")
        bound = await self._tokens.pod_of(header[7:].strip())
        if self._namespaces and bound.namespace not in self._namespaces:
            raise Refused(403, f"namespace {bound.namespace} is not served by this store API")
        run_name, attempt, run_uid = await self._runner_of(bound)
        found = await store.attempt_identity(self._engine, run_uid, attempt)
        if found is None or found.namespace != bound.namespace or found.run_name != run_name:
            raise Refused(403, f"pod {bound.namespace}/{bound.name} names attempt {attempt} "
                               f"of run {run_name}, which the run store has no record of")
        if found.pod_name != bound.name:
            raise Refused(403, f"pod {bound.namespace}/{bound.name} is not the pod of attempt "
                               f"{attempt} of run {run_name} ({found.pod_name})")
        if found.status not in RunStatus.LIVE:
            raise Refused(403, f"attempt {attempt} of run {run_name} is settled "
                               f"({found.status}): its token is no longer accepted")
        return Caller(namespace=found.namespace, pod=bound.name, run_name=run_name,
                      run_uid=run_uid, attempt=attempt, agent=found.agent,
                      user_id=found.user_id, session_id=found.session_id or "",
                      app_name=found.app_name or store.session_app(found.namespace, found.agent),
                      input_digest=found.input_digest, resumes_attempt=found.resumes_attempt,
                      resumes_run_uid=found.resumes_run_uid)

    async def _runner_of(self, bound: BoundPod) -> tuple[str, int, str]:
        hit = self._pods.get(bound.uid)
        if hit is not None and hit[0] > time.monotonic():
            return hit[1], hit[2], hit[3]
        try:
            response = await asyncio.to_thread(
                self._core.read_namespaced_pod, bound.name, bound.namespace,
                _preload_content=False)
        except ApiException as e:
            if e.status == 404:
                raise Refused(403, f"pod {bound.namespace}/{bound.name} no longer exists") from e
            raise Refused(503, f"the store API could not read pod {bound.namespace}/"
                               f"{bound.name} ({e.status} {e.reason}); retry") from e
        pod = json.loads(response.data)
        meta = pod.get("metadata") or {}
        if meta.get("uid") != bound.uid:
            raise Refused(403, f"pod {bound.namespace}/{bound.name} was replaced; the token "
                               "belongs to its predecessor")
        labels = meta.get("labels") or {}
        owner = next((o for o in meta.get("ownerReferences") or []
                      if o.get("controller") and o.get("kind") == RUN_KIND), None)
        raw_attempt = str(labels.get(LABEL_ATTEMPT) or "")
        if owner is None or not labels.get(LABEL_RUN) or not raw_attempt.isdigit() \
                or owner.get("name") != labels[LABEL_RUN]:
            raise Refused(403, f"pod {bound.namespace}/{bound.name} is not an agentrun runner "
                               "pod (no AgentRun controls it)")
        found = (str(labels[LABEL_RUN]), int(raw_attempt), str(owner["uid"]))
        self._pods[bound.uid] = (time.monotonic() + TOKEN_CACHE_SECONDS, *found)
        if len(self._pods) > CACHE_ENTRIES:
            now = time.monotonic()
            self._pods = {k: v for k, v in self._pods.items() if v[0] > now}
        return found
