"""The transcript API: store.agentrun.dev/v1alpha1 `transcripts`, a Kubernetes aggregated API.

Served on its own listener (`serve_transcripts`, the chart's port 8443), beside the
runners' store API and sharing nothing with it but the store: the Kubernetes API server
registers it (APIService v1alpha1.store.agentrun.dev) and proxies users' requests to it,
as it does for metrics-server. Every request must come through that proxy
(frontproxy.FrontProxy: its client certificate, the user it names) and is authorized by
the API server (access.AccessReviews: a SubjectAccessReview, verb get or list on
transcripts in the namespace). Users need their kubeconfig only:

    kubectl get transcripts.store.agentrun.dev triage-42 -n support -o yaml
    kubectl agentrun transcript triage-42 -n support -f      # ?follow=true

A Transcript is one per AgentRun, of the same name (the AgentRun is read from the API
server: its uid names the run in the store, its phase says whether it is over). With
?follow=true the entries are streamed, one JSON object per line (as pod logs are), while
the run is live; the stream ends when the run settles, or after FOLLOW_SECONDS, under the
API server's own request timeout (60 s by default: a GET that is not a watch is cut there),
and the follower asks again (kubectl agentrun transcript -f does).

Bounded: a list is paginated as the API server's own lists are (`limit`, at most
LIST_LIMIT, and `continue`, the API server's token for the AgentRuns) and holds runs'
summaries (phase, usage, the answer's first words), never their entries; one user holds at
most FOLLOWS_PER_USER follow streams at once (429 with Retry-After beyond); a follow reads
only what is new each second (store.transcript_facts_after).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from aiohttp import web
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from sqlalchemy.ext.asyncio import AsyncEngine

from agentrun import store
from agentrun.transcript import (
    Follower,
    TranscriptFacts,
    entries_of,
    preview,
    summary,
    transcript,
)
from agentrun.vocabulary import (
    GROUP,
    RUN_PLURAL,
    TRANSCRIPT_API_VERSION,
    TRANSCRIPT_GROUP,
    TRANSCRIPT_KIND,
    TRANSCRIPT_PLURAL,
    TRANSCRIPT_SINGULAR,
    TRANSCRIPT_VERSION,
    VERSION,
    Phase,
)
from agentrun_store_api.access import Access, AccessReviews, AccessUnknown
from agentrun_store_api.app import Served, split_listen
from agentrun_store_api.frontproxy import FrontProxy, NotAuthenticated, User
from agentrun_store_api.tls import ServingCertificate

log = logging.getLogger("agentrun.store_api")

# The transcript API's own database pool (users' reads never take a runner's connection).
TRANSCRIPT_POOL_SIZE = 2
# A followed transcript is read again this often while its run is live.
FOLLOW_POLL_SECONDS = 1.0
# A follow stream ends after this long (the follower asks again): under the Kubernetes API
# server's default --request-timeout of 60 s, which cuts any GET that is not a watch.
FOLLOW_SECONDS = 45.0
FOLLOW_CONTENT_TYPE = "application/x-ndjson"
# Follow streams one user holds at once: a person follows a run or two; each stream is a
# read of the store every second.
FOLLOWS_PER_USER = 4
# ...and asks again after this long once refused (a stream ends within FOLLOW_SECONDS).
FOLLOW_RETRY_SECONDS = 5
# A page of a list: what kubectl asks for (--chunk-size, 500 by default) at most; a list
# without `limit` gets this much and a `continue`.
LIST_LIMIT = 500
PREFIX = f"/apis/{TRANSCRIPT_GROUP}/{TRANSCRIPT_VERSION}"
RESOURCE = f"{TRANSCRIPT_PLURAL}.{TRANSCRIPT_GROUP}"
# What the API server's OpenAPI aggregation asks an aggregated API for.
OPENAPI_PATHS = ("/openapi/v2", "/openapi/v3")


# -- what discovery says ----------------------------------------------------------------


def api_group() -> dict[str, Any]:
    version = {"groupVersion": TRANSCRIPT_API_VERSION, "version": TRANSCRIPT_VERSION}
    return {"kind": "APIGroup", "apiVersion": "v1", "name": TRANSCRIPT_GROUP,
            "versions": [version], "preferredVersion": version}


def api_resources() -> dict[str, Any]:
    return {"kind": "APIResourceList", "apiVersion": "v1",
            "groupVersion": TRANSCRIPT_API_VERSION,
            "resources": [{"name": TRANSCRIPT_PLURAL, "singularName": TRANSCRIPT_SINGULAR,
                           "namespaced": True, "kind": TRANSCRIPT_KIND,
                           "verbs": ["get", "list"]}]}


# -- Kubernetes Status objects ------------------------------------------------------------


class Answered(Exception):
    """A request answered with a Kubernetes Status (an error)."""

    def __init__(self, code: int, reason: str, message: str, name: str = "",
                 retry_after: int | None = None) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.name = code, reason, message, name
        self.retry_after = retry_after

    def response(self) -> web.Response:
        details: dict[str, Any] = {"group": TRANSCRIPT_GROUP, "kind": TRANSCRIPT_PLURAL}
        if self.name:
            details["name"] = self.name
        headers = {}
        if self.retry_after is not None:
            details["retryAfterSeconds"] = self.retry_after
            headers["Retry-After"] = str(self.retry_after)
        return web.json_response(
            {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
             "message": self.message, "reason": self.reason, "details": details,
             "code": self.code}, status=self.code, headers=headers)


def forbidden(user: User, access: Access, reason: str) -> Answered:
    """The API server's own wording of a 403."""
    subject = f'{RESOURCE} "{access.name}"' if access.name else RESOURCE
    where = f'in the namespace "{access.namespace}"' if access.namespace else \
        "at the cluster scope"
    said = f'User "{user.name}" cannot {access.verb} resource "{TRANSCRIPT_PLURAL}" in API ' \
           f'group "{TRANSCRIPT_GROUP}" {where}'
    if access.path:
        subject, said = "forbidden", f'User "{user.name}" cannot {access.verb} path ' \
                                     f'"{access.path}"'
    return Answered(403, "Forbidden", f"{subject} is forbidden: {said}"
                    + (f": {reason}" if reason else ""), access.name)


def not_found(name: str) -> Answered:
    return Answered(404, "NotFound", f'{RESOURCE} "{name}" not found', name)


# -- the server ---------------------------------------------------------------------------


Handler = Callable[[web.Request, User], Awaitable[web.StreamResponse]]


class Transcripts:
    """The transcript API's handlers: who asks (the front proxy), may they (the API server),
    and the Transcripts of AgentRuns (the API server's runs, the store's records)."""

    def __init__(self, engine: AsyncEngine, api: client.ApiClient, proxy: FrontProxy,
                 reviews: AccessReviews) -> None:
        self.engine, self.proxy, self.reviews = engine, proxy, reviews
        self._runs: Any = client.CustomObjectsApi(api)
        # Follow streams open now, by user.
        self._follows: dict[str, int] = {}

    def application(self) -> web.Application:
        app = web.Application(middlewares=[self._answering])
        for path, handler in ((f"{PREFIX}/namespaces/{{namespace}}/{TRANSCRIPT_PLURAL}/{{name}}",
                               self.one),
                              (f"{PREFIX}/namespaces/{{namespace}}/{TRANSCRIPT_PLURAL}",
                               self.many),
                              (f"{PREFIX}/{TRANSCRIPT_PLURAL}", self.many),
                              (PREFIX, self.discovery), (f"/apis/{TRANSCRIPT_GROUP}",
                                                         self.discovery),
                              ("/apis", self.discovery)):
            app.router.add_get(path, self._as_user(handler), allow_head=False)
        app.router.add_route("*", "/{tail:.*}", self._as_user(self.unknown))
        return app

    @web.middleware
    async def _answering(self, request: web.Request,
                         handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                         ) -> web.StreamResponse:
        started = time.perf_counter()
        try:
            response = await handler(request)
        except Answered as e:
            response = e.response()
            # The API server asks every aggregated API for its OpenAPI documents each
            # minute; there are none here (404), and that is no news for the log.
            quiet = e.code == 404 and request.path.startswith(OPENAPI_PATHS)
            log.log(logging.DEBUG if quiet else logging.INFO,
                    "event=transcript-refused path=%s code=%s message=%r", request.path,
                    e.code, e.message)
        except Exception as e:  # the store or the API server failed: say so, not how
            log.error("event=transcript-failed path=%s error=%r", request.path, e, exc_info=e)
            response = Answered(503, "ServiceUnavailable",
                                "the transcript API could not read the run store or the "
                                "AgentRun; retry").response()
        if not response.prepared:
            response.headers["Server-Timing"] = \
                f"transcript;dur={(time.perf_counter() - started) * 1000:.2f}"
        return response

    def _as_user(self, handler: Handler) -> Callable[[web.Request], Awaitable[
            web.StreamResponse]]:
        async def serve(request: web.Request) -> web.StreamResponse:
            ssl_object = request.transport.get_extra_info("ssl_object") \
                if request.transport is not None else None
            peer = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
            try:
                user = self.proxy.user(peer, request.headers)
            except NotAuthenticated as e:
                raise Answered(401, "Unauthorized", str(e)) from e
            return await handler(request, user)

        return serve

    async def _authorize(self, user: User, access: Access) -> None:
        try:
            verdict = await self.reviews.verdict(user, access)
        except AccessUnknown as e:
            raise Answered(503, "ServiceUnavailable", str(e)) from e
        if not verdict.allowed:
            raise forbidden(user, access, verdict.reason)

    # -- discovery ---------------------------------------------------------------------

    async def discovery(self, request: web.Request, user: User) -> web.StreamResponse:
        await self._authorize(user, Access("get", path=request.path))
        if request.path == "/apis":
            return web.json_response({"kind": "APIGroupList", "apiVersion": "v1",
                                      "groups": [api_group()]})
        if request.path == PREFIX:
            return web.json_response(api_resources())
        return web.json_response(api_group())

    async def unknown(self, request: web.Request, user: User) -> web.StreamResponse:
        if request.method != "GET":
            raise Answered(405, "MethodNotAllowed",
                           f"the transcript API serves only get and list; {request.method} "
                           f"{request.path} is not allowed")
        raise Answered(404, "NotFound", f"the transcript API has no {request.path}")

    # -- transcripts -------------------------------------------------------------------

    async def one(self, request: web.Request, user: User) -> web.StreamResponse:
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        _no_watch(request)
        await self._authorize(user, Access("get", TRANSCRIPT_GROUP, TRANSCRIPT_VERSION,
                                           TRANSCRIPT_PLURAL, namespace, name))
        if request.query.get("follow") in ("true", "1"):
            held = self._follows.get(user.name, 0)
            if held >= FOLLOWS_PER_USER:
                raise Answered(429, "TooManyRequests",
                               f"{user.name} follows {held} transcripts already, the most one "
                               f"user may at once: end one, or retry in "
                               f"{FOLLOW_RETRY_SECONDS} s", name,
                               retry_after=FOLLOW_RETRY_SECONDS)
            self._follows[user.name] = held + 1
            try:
                return await self._follow(request, namespace, name)
            finally:
                self._follows[user.name] -= 1
                if not self._follows[user.name]:
                    del self._follows[user.name]
        run = await self._run(namespace, name)
        if run is None:
            raise not_found(name)
        shown = await self._transcript(run)
        if _wants_table(request):
            return web.json_response(_table([shown]))
        return web.json_response(shown)

    async def many(self, request: web.Request, user: User) -> web.StreamResponse:
        namespace = request.match_info.get("namespace", "")
        _no_watch(request)
        await self._authorize(user, Access("list", TRANSCRIPT_GROUP, TRANSCRIPT_VERSION,
                                           TRANSCRIPT_PLURAL, namespace))
        selector = request.query.get("labelSelector") or None
        try:
            asked = int(request.query.get("limit") or LIST_LIMIT)
        except ValueError:
            raise Answered(400, "BadRequest", "limit must be a whole number") from None
        limit = LIST_LIMIT if asked <= 0 else min(asked, LIST_LIMIT)
        listed = await asyncio.to_thread(self._list_runs, namespace, selector, limit,
                                         request.query.get("continue") or None)
        shown = [await self._summary(r) for r in listed.get("items") or []]
        if _wants_table(request):
            table = _table(shown)
            table["metadata"] = _list_meta(listed)
            return web.json_response(table)
        return web.json_response({"kind": f"{TRANSCRIPT_KIND}List",
                                  "apiVersion": TRANSCRIPT_API_VERSION,
                                  "metadata": _list_meta(listed), "items": shown})

    async def _follow(self, request: web.Request, namespace: str, name: str
                      ) -> web.StreamResponse:
        """Entries as they come, one JSON object per line, until the run settles (or for
        FOLLOW_SECONDS); an entry whose state changes is sent again."""
        run = await self._run(namespace, name)
        if run is None:
            raise not_found(name)
        response = web.StreamResponse(headers={"Content-Type": FOLLOW_CONTENT_TYPE,
                                               "Cache-Control": "no-cache"})
        await response.prepare(request)
        follower = Follower()
        ends = time.monotonic() + FOLLOW_SECONDS
        facts: TranscriptFacts | None = None
        since = datetime.now(UTC)
        try:
            while True:
                # The whole run once, then only what is new (or may have changed) since.
                read_at = datetime.now(UTC)
                uid = run["metadata"]["uid"]
                facts = await store.transcript_facts(self.engine, uid) if facts is None \
                    else await store.transcript_facts_after(self.engine, uid, facts, since)
                since = read_at
                news = follower.news(entries_of(facts)) if facts is not None else []
                if news:
                    await response.write("".join(json.dumps(e) + "\n" for e in news).encode())
                if _phase(run) in Phase.TERMINAL or time.monotonic() >= ends:
                    break
                await asyncio.sleep(FOLLOW_POLL_SECONDS)
                again = await self._run(namespace, name)
                if again is None or again["metadata"]["uid"] != run["metadata"]["uid"]:
                    break  # deleted (or replaced by another run of the name): nothing follows
                run = again
        except (ConnectionResetError, asyncio.CancelledError):
            log.info("event=transcript-follow-left run=%s/%s", namespace, name)
            raise
        except Exception as e:  # the stream has begun: it ends here, the follower asks again
            log.error("event=transcript-follow-failed run=%s/%s error=%r", namespace, name,
                      e, exc_info=e)
        await response.write_eof()
        return response

    async def _summary(self, run: dict[str, Any]) -> dict[str, Any]:
        return summary(run, await store.transcript_summary(self.engine,
                                                           run["metadata"]["uid"]))

    async def _transcript(self, run: dict[str, Any]) -> dict[str, Any]:
        return transcript(run, await store.transcript_facts(self.engine,
                                                            run["metadata"]["uid"]))

    async def _run(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            found: Any = await asyncio.to_thread(
                self._runs.get_namespaced_custom_object, GROUP, VERSION, namespace,
                RUN_PLURAL, name)
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        return dict(found)

    def _list_runs(self, namespace: str, selector: str | None, limit: int,
                   token: str | None) -> dict[str, Any]:
        """One page of the AgentRuns, as the API server pages them (its own `continue`
        token: a tampered or expired one is the API server's 410 or 400)."""
        kwargs: dict[str, Any] = {"limit": limit}
        if selector:
            kwargs["label_selector"] = selector
        if token:
            kwargs["_continue"] = token
        if namespace:
            listed: Any = self._runs.list_namespaced_custom_object(
                GROUP, VERSION, namespace, RUN_PLURAL, **kwargs)
        else:
            listed = self._runs.list_cluster_custom_object(GROUP, VERSION, RUN_PLURAL,
                                                           **kwargs)
        return dict(listed)


def _list_meta(listed: dict[str, Any]) -> dict[str, Any]:
    """The list's metadata as the API server gave it for the AgentRuns' page."""
    meta = listed.get("metadata") or {}
    shown: dict[str, Any] = {"resourceVersion": str(meta.get("resourceVersion") or "")}
    if meta.get("continue"):
        shown["continue"] = meta["continue"]
    if meta.get("remainingItemCount") is not None:
        shown["remainingItemCount"] = meta["remainingItemCount"]
    return shown


def _no_watch(request: web.Request) -> None:
    if request.query.get("watch") in ("true", "1"):
        raise Answered(405, "MethodNotAllowed",
                       f"{RESOURCE} cannot be watched; follow one with ?follow=true")


def _phase(run: dict[str, Any]) -> str:
    return str((run.get("status") or {}).get("phase") or Phase.PENDING)


def _wants_table(request: web.Request) -> bool:
    """kubectl's human output asks for a Table (the API server passes its Accept on)."""
    return "as=Table" in request.headers.get("Accept", "")


def _age(created: str | None, now: datetime) -> str:
    if not created:
        return "<unknown>"
    seconds = int((now - datetime.fromisoformat(created.replace("Z", "+00:00")))
                  .total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= 2 * size:
            return f"{seconds // size}{unit}"
    return f"{max(seconds, 0)}s"


def _table(transcripts: list[dict[str, Any]]) -> dict[str, Any]:
    """A meta.k8s.io Table of transcripts, for `kubectl get`."""
    now = datetime.now(UTC)
    columns = [("Name", "string", "name", "The AgentRun's name"),
               ("Phase", "string", "", "The AgentRun's phase"),
               ("Model-Calls", "integer", "", "Model calls of the run's attempts"),
               ("Tool-Calls", "integer", "", "Tool calls of the run's attempts"),
               ("Result", "string", "", "The answer's first words"),
               ("Age", "string", "", "Since the AgentRun was created")]
    rows = []
    for t in transcripts:
        # A whole transcript (get) or a summary (list): the same columns, from either.
        meta, used, result = t["metadata"], t.get("usage") or {}, t.get("result") or {}
        answer = result.get("text") or result.get("preview") or ""
        rows.append({"cells": [meta.get("name"), t["run"]["phase"], used.get("modelCalls", 0),
                               used.get("toolCalls", 0), preview(answer),
                               _age(meta.get("creationTimestamp"), now)],
                     "object": {"kind": "PartialObjectMetadata",
                                "apiVersion": "meta.k8s.io/v1", "metadata": meta}})
    return {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {"resourceVersion": ""},
            "columnDefinitions": [{"name": n, "type": k, "format": f, "description": d,
                                   "priority": 0} for n, k, f, d in columns],
            "rows": rows}


async def serve_transcripts(listen: str, engine: AsyncEngine, api: client.ApiClient, *,
                            tls: ServingCertificate) -> Served:
    """Starts the transcript API on `listen` (HOST:PORT), over TLS with `tls` (whose names
    the APIService's Service has), asking clients for the front proxy's certificate."""
    proxy = FrontProxy(api)
    await proxy.refresh()
    proxy.serve_on(tls.context)
    app = Transcripts(engine, api, proxy, AccessReviews(api)).application()
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    host, port = split_listen(listen)
    site = web.TCPSite(runner, host, port, ssl_context=tls.context)
    await site.start()
    sockets = getattr(site._server, "sockets", None) or []
    bound = sockets[0].getsockname()[1] if sockets else port
    shown = f"[{host}]" if ":" in host else host
    url = f"https://{shown}:{bound}"
    log.info("event=transcript-api-listening url=%s", url)
    return Served(runner, url, asyncio.create_task(proxy.follow()),
                  asyncio.create_task(tls.follow()))
