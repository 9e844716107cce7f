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
server: its uid names the run in the store, its phase says whether it is over; once the
AgentRun is deleted, the store's most recent record of the name, or the one
?fieldSelector=metadata.uid=<uid> names). The same API serves the run archive, `runs`
(kind RunRecord, agentrun/history.py): every run the store recorded, newest first, in
keyset pages, with label and field selectors applied here (docs/history.md). With
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
from datetime import UTC, datetime, timedelta
from typing import Any

from aiohttp import web
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from sqlalchemy.ext.asyncio import AsyncEngine

from agentrun import history, store
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
RECORDS = f"{history.RECORD_PLURAL}.{TRANSCRIPT_GROUP}"
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
                           "verbs": ["get", "list"]},
                          {"name": history.RECORD_PLURAL,
                           "singularName": history.RECORD_SINGULAR, "namespaced": True,
                           "kind": history.RECORD_KIND, "verbs": ["get", "list"]}]}


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
    plural = access.resource or TRANSCRIPT_PLURAL
    resource = f"{plural}.{TRANSCRIPT_GROUP}"
    subject = f'{resource} "{access.name}"' if access.name else resource
    where = f'in the namespace "{access.namespace}"' if access.namespace else \
        "at the cluster scope"
    said = f'User "{user.name}" cannot {access.verb} resource "{plural}" in API ' \
           f'group "{TRANSCRIPT_GROUP}" {where}'
    if access.path:
        subject, said = "forbidden", f'User "{user.name}" cannot {access.verb} path ' \
                                     f'"{access.path}"'
    return Answered(403, "Forbidden", f"{subject} is forbidden: {said}"
                    + (f": {reason}" if reason else ""), access.name)


def not_found(name: str, resource: str = RESOURCE) -> Answered:
    return Answered(404, "NotFound", f'{resource} "{name}" not found', name)


def bad_request(message: str) -> Answered:
    return Answered(400, "BadRequest", message)


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
        records = history.RECORD_PLURAL
        for path, handler in ((f"{PREFIX}/namespaces/{{namespace}}/{TRANSCRIPT_PLURAL}/{{name}}",
                               self.one),
                              (f"{PREFIX}/namespaces/{{namespace}}/{TRANSCRIPT_PLURAL}",
                               self.many),
                              (f"{PREFIX}/{TRANSCRIPT_PLURAL}", self.many),
                              (f"{PREFIX}/namespaces/{{namespace}}/{records}/{{name}}",
                               self.record),
                              (f"{PREFIX}/namespaces/{{namespace}}/{records}", self.records),
                              (f"{PREFIX}/{records}", self.records),
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
        run = await self._run(namespace, name, _uid_selected(request))
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
        limit = _limit(request)
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
        run = await self._run(namespace, name, _uid_selected(request))
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

    async def _run(self, namespace: str, name: str, uid: str | None = None
                   ) -> dict[str, Any] | None:
        """AgentRun `name` as the API server has it, else its record in the store (the
        most recent run of that name: its AgentRun has been deleted); with `uid`, that run
        of the name only."""
        found = await self._agent_run(namespace, name)
        if found is not None and uid in (None, found["metadata"]["uid"]):
            return found
        recorded = await self._recorded(namespace, name, uid)
        return None if recorded is None else history.as_run(recorded)

    async def _agent_run(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            found: Any = await asyncio.to_thread(
                self._runs.get_namespaced_custom_object, GROUP, VERSION, namespace,
                RUN_PLURAL, name)
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        return dict(found)

    async def _recorded(self, namespace: str, name: str, uid: str | None) -> store.Run | None:
        """The store's record of run `name` in `namespace` (by uid, or the name's latest).
        A uid of another namespace's run, or of another name, is not found: the caller
        was authorized for this namespace and name only."""
        if uid is None:
            return await store.latest_named(self.engine, namespace, name)
        recorded = await store.get_run(self.engine, uid)
        if recorded is None or (recorded.namespace, recorded.name) != (namespace, name):
            return None
        return recorded

    # -- the archive: runs.store.agentrun.dev (history.py) ------------------------------

    async def record(self, request: web.Request, user: User) -> web.StreamResponse:
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        _no_watch(request, history.RECORD_PLURAL)
        await self._authorize(user, Access("get", TRANSCRIPT_GROUP, TRANSCRIPT_VERSION,
                                           history.RECORD_PLURAL, namespace, name))
        recorded = await self._recorded(namespace, name, _uid_selected(request))
        if recorded is None:
            raise not_found(name, RECORDS)
        live = await self._agent_run(namespace, name)
        shown = history.record(
            recorded, await store.transcript_summary(self.engine, recorded.uid),
            in_api_server=live is not None and live["metadata"]["uid"] == recorded.uid)
        if _wants_table(request):
            return web.json_response(_record_table([shown]))
        return web.json_response(shown)

    async def records(self, request: web.Request, user: User) -> web.StreamResponse:
        namespace = request.match_info.get("namespace", "")
        _no_watch(request, history.RECORD_PLURAL)
        await self._authorize(user, Access("list", TRANSCRIPT_GROUP, TRANSCRIPT_VERSION,
                                           history.RECORD_PLURAL, namespace))
        try:
            labels = history.label_selector(request.query.get("labelSelector"))
            fields = history.field_selector(request.query.get("fieldSelector"))
            after = history.decode_continue(request.query.get("continue"))
            since = _since(request.query.get("since"))
        except history.BadSelector as e:
            raise bad_request(str(e)) from None
        page = await store.run_records(self.engine, namespace or None, fields=fields,
                                       since=since, matches=lambda r: labels(r.labels or {}),
                                       limit=_limit(request), after=after)
        shown = [history.record(r, await store.transcript_summary(self.engine, r.uid))
                 for r in page.records]
        meta: dict[str, Any] = {"resourceVersion": ""}
        if page.after is not None:
            meta["continue"] = history.encode_continue(page.after)
        if _wants_table(request):
            table = _record_table(shown)
            table["metadata"] = meta
            return web.json_response(table)
        return web.json_response({"kind": f"{history.RECORD_KIND}List",
                                  "apiVersion": TRANSCRIPT_API_VERSION, "metadata": meta,
                                  "items": shown})

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


def _no_watch(request: web.Request, plural: str = TRANSCRIPT_PLURAL) -> None:
    if request.query.get("watch") in ("true", "1"):
        hint = "; follow one with ?follow=true" if plural == TRANSCRIPT_PLURAL else ""
        raise Answered(405, "MethodNotAllowed",
                       f"{plural}.{TRANSCRIPT_GROUP} cannot be watched{hint}")


def _limit(request: web.Request) -> int:
    """A page's size: `limit`, at most LIST_LIMIT (none or 0: LIST_LIMIT)."""
    try:
        asked = int(request.query.get("limit") or LIST_LIMIT)
    except ValueError:
        raise bad_request("limit must be a whole number") from None
    return LIST_LIMIT if asked <= 0 else min(asked, LIST_LIMIT)


def _uid_selected(request: web.Request) -> str | None:
    """The uid a get names with ?fieldSelector=metadata.uid=<uid> (any other run of the
    name than its most recent), else None."""
    try:
        fields = history.field_selector(request.query.get("fieldSelector"))
    except history.BadSelector as e:
        raise bad_request(str(e)) from None
    uids = [f.value for f in fields if f.column == "uid" and f.equal]
    if len(fields) != len(uids) or len(uids) > 1:
        raise bad_request("a get selects a run only by metadata.uid=<uid>")
    return uids[0] if uids else None


def _since(value: str | None) -> datetime | None:
    """`since` (RFC 3339, or a duration such as 24h, 30m, 7d: that long ago)."""
    if not value:
        return None
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    if value[-1:] in units and value[:-1].isdigit():
        return datetime.now(UTC) - timedelta(seconds=int(value[:-1]) * units[value[-1]])
    try:
        at = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise history.BadSelector(
            f"since {value!r} is neither a time (RFC 3339) nor a duration (24h)") from None
    return at if at.tzinfo else at.replace(tzinfo=UTC)


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
    rows: list[tuple[list[Any], dict[str, Any]]] = []
    for t in transcripts:
        # A whole transcript (get) or a summary (list): the same columns, from either.
        meta, used, result = t["metadata"], t.get("usage") or {}, t.get("result") or {}
        answer = result.get("text") or result.get("preview") or ""
        rows.append(([meta.get("name"), t["run"]["phase"], used.get("modelCalls", 0),
                      used.get("toolCalls", 0), preview(answer),
                      _age(meta.get("creationTimestamp"), now)], meta))
    return _k8s_table(columns, rows)


def _k8s_table(columns: list[tuple[str, str, str, str]],
               rows: list[tuple[list[Any], dict[str, Any]]]) -> dict[str, Any]:
    """A meta.k8s.io Table: its columns (name, type, format, description) and its rows
    (cells, the object's metadata)."""
    return {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {"resourceVersion": ""},
            "columnDefinitions": [{"name": n, "type": k, "format": f, "description": d,
                                   "priority": 0} for n, k, f, d in columns],
            "rows": [{"cells": cells, "object": {"kind": "PartialObjectMetadata",
                                                 "apiVersion": "meta.k8s.io/v1",
                                                 "metadata": meta}}
                     for cells, meta in rows]}


def _record_table(records: list[dict[str, Any]]) -> dict[str, Any]:
    """A meta.k8s.io Table of RunRecords, for `kubectl get runs.store.agentrun.dev`."""
    now = datetime.now(UTC)
    columns = [("Name", "string", "name", "The run's name"),
               ("Phase", "string", "", "How the run ended (or where it is)"),
               ("Reason", "string", "", "Why"),
               ("Tools-Executed", "string", "", "The tools the run called"),
               ("Agent", "string", "", "The agent it ran"),
               ("Age", "string", "", "Since the run was created")]
    rows: list[tuple[list[Any], dict[str, Any]]] = []
    for r in records:
        meta, status = r["metadata"], r["status"]
        tools = status.get("toolsExecuted")
        rows.append(([meta["name"], status.get("phase"), status.get("reason") or "",
                      "<unknown>" if tools is None else ",".join(tools) or "<none>",
                      r["spec"].get("agent"), _age(meta.get("creationTimestamp"), now)], meta))
    return _k8s_table(columns, rows)


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
