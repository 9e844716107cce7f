"""From a request's token to the one live attempt it speaks for, or a refusal.

Three steps, each remembered where what it learns cannot change: TokenReview (who the
token is: a ServiceAccount token bound to a pod), the pod (its labels and its controller,
an AgentRun: which attempt of which run), and the store (that attempt as the operator
recorded it: its run, pod and session never change once written). What does change, whether
the attempt is still live, is read on every request, in the attempt's turn at the store
(so that one runner's requests never hold more than their share of the pool): by the
ledger writes in their own statement (store.open_call, store.close_call: the fence), by
the other routes as one primary-key read before they act (`check_live`).

A refusal of the token (401, 403) is remembered briefly too: a flood of one bad token
costs one TokenReview.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from aiohttp import web
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from sqlalchemy.ext.asyncio import AsyncEngine

from agentrun import store
from agentrun.attempt import AttemptIdentity
from agentrun.vocabulary import (
    LABEL_ATTEMPT,
    LABEL_RUN,
    RUN_KIND,
    TOKEN_EXTRA_POD_NAME,
    TOKEN_EXTRA_POD_UID,
    RunStatus,
)
from agentrun_store_api import limits, metrics
from agentrun_store_api.refusal import Refused

K = TypeVar("K")
V = TypeVar("V")
# A JWT: three base64url parts (the signature may be empty only for unsigned ones, which
# the API server refuses anyway).
_JWT = re.compile(r"[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*")


class Remembered(Generic[K, V]):
    """What was learnt, each for its own time, the most recent `limits.CACHE_ENTRIES`."""

    def __init__(self) -> None:
        self._entries: OrderedDict[K, tuple[float, V]] = OrderedDict()

    def get(self, key: K) -> V | None:
        hit = self._entries.get(key)
        if hit is None:
            return None
        if hit[0] <= time.monotonic():
            del self._entries[key]
            return None
        return hit[1]

    def put(self, key: K, value: V, seconds: float) -> None:
        self._entries[key] = (time.monotonic() + seconds, value)
        self._entries.move_to_end(key)
        while len(self._entries) > limits.CACHE_ENTRIES:
            self._entries.popitem(last=False)

    def drop(self, key: K) -> None:
        self._entries.pop(key, None)


@dataclass(frozen=True)
class BoundPod:
    namespace: str
    name: str
    uid: str


def settled_refusal(caller: AttemptIdentity, status: str) -> Refused:
    """What a settled attempt's token is told, whichever route found it settled."""
    return Refused(403, f"attempt {caller.attempt} of run {caller.run_name} is settled "
                        f"({status}): its token is no longer accepted")


def review_refusal(status: dict[str, Any], audience: str) -> Refused | None:
    """What a TokenReview answer says against the token: not authenticated, not for our
    audience, or not a ServiceAccount token bound to a pod. None: it is one."""
    if not status.get("authenticated"):
        return Refused(401, "the token is not valid for the store API (audience "
                            f"{audience}): {status.get('error') or 'not authenticated'}; "
                            "runner pods present their projected store token")
    # An API server that ignored the audiences asked for answers without them: the token
    # may be one for the API server itself.
    if audience not in (status.get("audiences") or []):
        return Refused(401, f"the token is not valid for the store API: the API server did "
                            f"not confirm its audience {audience}; runner pods present "
                            "their projected store token")
    user = status.get("user") or {}
    extra = user.get("extra") or {}
    names, uids = extra.get(TOKEN_EXTRA_POD_NAME) or [], extra.get(TOKEN_EXTRA_POD_UID) or []
    parts = str(user.get("username") or "").split(":")
    if not names or not uids or len(parts) != 4 or parts[:2] != ["system", "serviceaccount"]:
        return Refused(403, f"{user.get('username') or 'the caller'} presented a token that "
                            "is not bound to a pod; the store API serves runner pods only")
    return None


class TokenReviewer:
    """Who a token is: TokenReview with our audience, bound to a pod."""

    def __init__(self, api: client.ApiClient, audience: str) -> None:
        # Untyped: the calls below take plain dicts and return raw responses.
        self._auth: Any = client.AuthenticationV1Api(api)
        self._audience = audience
        self._known: Remembered[str, BoundPod] = Remembered()
        self._reviews = asyncio.Semaphore(limits.TOKEN_REVIEWS_IN_FLIGHT)

    async def pod_of(self, token: str, key: str) -> BoundPod:
        """The pod `token` (whose sha256 is `key`) is bound to, or a refusal."""
        known = self._known.get(key)
        if known is not None:
            return known
        if len(token) > limits.TOKEN_BYTES or not _JWT.fullmatch(token):
            raise Refused(401, "the token is not a ServiceAccount token (a JWT); runner pods "
                               "present their projected store token")
        review = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                  "spec": {"token": token, "audiences": [self._audience]}}
        try:
            async with self._reviews:
                done = await asyncio.to_thread(
                    self._auth.create_token_review, review, _preload_content=False)
        except ApiException as e:
            metrics.TOKEN_REVIEWS.labels("failed").inc()
            raise Refused(503, f"the store API could not verify the token with the "
                               f"Kubernetes API server ({e.status} {e.reason}); retry") from e
        status = json.loads(done.data).get("status") or {}
        refused = review_refusal(status, self._audience)
        metrics.TOKEN_REVIEWS.labels("refused" if refused else "authenticated").inc()
        if refused is not None:
            raise refused
        user = status["user"]
        bound = BoundPod(namespace=str(user["username"]).split(":")[2],
                         name=str(user["extra"][TOKEN_EXTRA_POD_NAME][0]),
                         uid=str(user["extra"][TOKEN_EXTRA_POD_UID][0]))
        self._known.put(key, bound, limits.TOKEN_CACHE_SECONDS)
        return bound


class Authority:
    """From a request's token to the one live attempt it speaks for, or a refusal."""

    def __init__(self, api: client.ApiClient, engine: AsyncEngine, audience: str,
                 namespaces: tuple[str, ...] = ()) -> None:
        self._tokens = TokenReviewer(api, audience)
        self._core: Any = client.CoreV1Api(api)
        self._engine = engine
        self._namespaces = namespaces
        self._refused: Remembered[str, Refused] = Remembered()
        # The pod's run and attempt, by pod uid (a pod's owner and labels never change...
        # for the pod's lifetime: rechecked after TOKEN_CACHE_SECONDS, it may be gone).
        self._pods: Remembered[str, tuple[str, int, str]] = Remembered()
        # Attempts as the operator wrote them down, and those known settled (for good).
        self._attempts: Remembered[tuple[str, int], tuple[AttemptIdentity, str]] = \
            Remembered()
        self._settled: Remembered[tuple[str, int], str] = Remembered()

    async def caller(self, request: web.Request) -> AttemptIdentity:
        """The attempt the request's token speaks for, with no read of the store once the
        attempt is known. Whether it is still live is `check_live`'s (or the route's own
        statement's) to say, in the attempt's turn at the store."""
        header = request.headers.get("Authorization", "")
        token = header[7:].strip() if header.startswith("Bearer ") else ""
        if not token:
            raise Refused(401, "no token: runner pods send their projected store token as "
                               "'Authorization: Bearer <token>'")
        key = hashlib.sha256(token.encode()).hexdigest()
        refused = self._refused.get(key)
        if refused is not None:
            raise refused
        try:
            caller = await self._caller(token, key)
            # Known settled: refused without a query.
            self._known_live(caller)
        except Refused as e:
            if e.status in (401, 403):
                self._refused.put(key, e, limits.REFUSED_TOKEN_SECONDS)
            raise
        return caller

    def settled(self, caller: AttemptIdentity, status: str) -> Refused:
        """A route found the attempt settled: remember it, and say so."""
        self._settled.put((caller.run_uid, caller.attempt), status, _FOR_GOOD)
        return settled_refusal(caller, status)

    async def _caller(self, token: str, key: str) -> AttemptIdentity:
        bound = await self._tokens.pod_of(token, key)
        if self._namespaces and bound.namespace not in self._namespaces:
            raise Refused(403, f"namespace {bound.namespace} is not served by this store API")
        run_name, attempt, run_uid = await self._runner_of(bound)
        found = self._attempts.get((run_uid, attempt))
        if found is None:
            found = await store.attempt_identity(self._engine, run_uid, attempt)
            if found is not None and found[1] in RunStatus.LIVE:
                self._attempts.put((run_uid, attempt), found, _FOR_GOOD)
        if found is None or found[0].namespace != bound.namespace \
                or found[0].run_name != run_name:
            raise Refused(403, f"pod {bound.namespace}/{bound.name} names attempt {attempt} "
                               f"of run {run_name}, which the run store has no record of")
        caller, status = found
        if caller.pod != bound.name:
            raise Refused(403, f"pod {bound.namespace}/{bound.name} is not the pod of attempt "
                               f"{attempt} of run {run_name} ({caller.pod})")
        if status not in RunStatus.LIVE:
            raise self.settled(caller, status)
        return caller

    def _known_live(self, caller: AttemptIdentity) -> None:
        status = self._settled.get((caller.run_uid, caller.attempt))
        if status is not None:
            raise settled_refusal(caller, status)

    async def check_live(self, caller: AttemptIdentity) -> None:
        """Refuses (403) a settled attempt: one primary-key read, for the routes whose own
        statements do not check it."""
        try:
            await store.ensure_live(self._engine, caller.run_uid, caller.attempt)
        except store.AttemptSettled as e:
            raise self.settled(caller, e.status) from e

    async def _runner_of(self, bound: BoundPod) -> tuple[str, int, str]:
        hit = self._pods.get(bound.uid)
        if hit is not None:
            return hit
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
        self._pods.put(bound.uid, found, limits.TOKEN_CACHE_SECONDS)
        return found


# What never changes is kept until the cache needs the room (a day stands for "for good":
# an attempt lives hours at most).
_FOR_GOOD = 86_400.0
