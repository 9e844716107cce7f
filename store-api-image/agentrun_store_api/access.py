"""May this user do this? The Kubernetes API server decides (RBAC, or whatever authorizer the
cluster runs): the transcript API asks it with a SubjectAccessReview for each request, as
every aggregated API server does, and keeps the answer briefly (the store API's
ServiceAccount holds system:auth-delegator, which allows creating them)."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from agentrun_store_api.frontproxy import User

# An answer is kept this long (both ways): a role granted or taken away counts within it.
ALLOWED_SECONDS = 10.0
DENIED_SECONDS = 10.0
# Answers kept before the expired ones are dropped.
KEPT_ANSWERS = 10_000


@dataclass(frozen=True)
class Access:
    """What a request asks to do: a verb on a resource (in a namespace, by name), or on a
    path that is not a resource (discovery)."""

    verb: str
    group: str = ""
    version: str = ""
    resource: str = ""
    namespace: str = ""
    name: str = ""
    path: str = ""

    def review(self, user: User) -> dict[str, Any]:
        """The SubjectAccessReview asking about `user` doing this."""
        spec: dict[str, Any] = {"user": user.name, "groups": list(user.groups)}
        if user.uid:
            spec["uid"] = user.uid
        if user.extra:
            spec["extra"] = {k: list(v) for k, v in user.extra.items()}
        if self.path:
            spec["nonResourceAttributes"] = {"path": self.path, "verb": self.verb}
        else:
            spec["resourceAttributes"] = {
                k: v for k, v in (("verb", self.verb), ("group", self.group),
                                  ("version", self.version), ("resource", self.resource),
                                  ("namespace", self.namespace), ("name", self.name)) if v}
        return {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                "spec": spec}


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    reason: str = ""


class AccessUnknown(Exception):
    """The API server could not be asked; the request is not served (503)."""


class AccessReviews:
    """SubjectAccessReviews, with their answers kept ALLOWED_SECONDS / DENIED_SECONDS."""

    def __init__(self, api: client.ApiClient) -> None:
        self._authorization: Any = client.AuthorizationV1Api(api)
        self._kept: dict[str, tuple[float, Verdict]] = {}

    async def verdict(self, user: User, access: Access) -> Verdict:
        body = access.review(user)
        key = json.dumps(body["spec"], sort_keys=True)
        hit = self._kept.get(key)
        if hit is not None and hit[0] > time.monotonic():
            return hit[1]
        try:
            done = await asyncio.to_thread(self._authorization.create_subject_access_review,
                                           body, _preload_content=False)
        except ApiException as e:
            raise AccessUnknown(f"the Kubernetes API server could not be asked whether "
                                f"{user.name} may {access.verb} ({e.status} {e.reason})") from e
        except Exception as e:  # unreachable: nobody is let in on a guess
            raise AccessUnknown(f"the Kubernetes API server could not be asked whether "
                                f"{user.name} may {access.verb}; retry") from e
        status = json.loads(done.data).get("status") or {}
        verdict = Verdict(bool(status.get("allowed")) and not status.get("denied"),
                          str(status.get("reason") or ""))
        ttl = ALLOWED_SECONDS if verdict.allowed else DENIED_SECONDS
        self._kept[key] = (time.monotonic() + ttl, verdict)
        if len(self._kept) > KEPT_ANSWERS:
            now = time.monotonic()
            self._kept = {k: v for k, v in self._kept.items() if v[0] > now}
        return verdict
