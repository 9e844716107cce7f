"""`kubectl agentrun console`: the web console, served on 127.0.0.1 by the plugin itself.

Every request it makes to the cluster is the user's own (their kubeconfig, or --as), as
`kubectl proxy` makes them: the API server's RBAC and admission, and the four-eyes rule,
apply unchanged, and an approval's record of who approved is the API server's. Nothing is
installed in the cluster. The page is the built front end (`console/static`, shipped in
the package); its JSON comes from `/api/...` below, each answer shaped by `views.py`.
Who may reach it at all is `guard.py`'s decision.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import signal
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import urllib3
from aiohttp import web
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from agentrun.vocabulary import (
    ANNOTATION_CANCEL,
    ANNOTATION_CANCEL_NOTE,
    API_VERSION,
    APPROVAL_KIND,
    APPROVAL_PLURAL,
    GROUP,
    LABEL_SCHEDULE,
    LABEL_TRIGGER,
    REPLAY_PLURAL,
    RUN_PLURAL,
    SCHEDULE_PLURAL,
    TRANSCRIPT_GROUP,
    TRANSCRIPT_VERSION,
    TRIGGER_PLURAL,
    VERSION,
    ApprovalDecision,
    Phase,
    ReplayPhase,
)
from agentrun_kubectl.approve import whole_arguments
from agentrun_kubectl.cluster import Cluster, Failure, api_message
from agentrun_kubectl.console import guard, views
from agentrun_kubectl.replay import replay_manifest

STATIC = Path(__file__).parent / "static"
PAGES = ("/runs", "/approvals", "/schedules", "/triggers", "/cost")
# How long an action waits for the operator's answer before it says it has none yet.
DECISION_WAIT = 20.0
COST_DAYS = 14

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Refused(Exception):
    """The API server's (or the operator's) refusal, passed to the page in its own words."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _refused(e: ApiException) -> Refused:
    return Refused(e.status or 502, api_message(e))


@dataclass
class Listed:
    """Objects of one kind in the namespaces the user may list them, and the API server's
    words for each namespace where the user may not."""

    items: list[dict[str, Any]] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)


class KindAbsent(Exception):
    """The kind is not served by this cluster (its CRD is not installed)."""


class Reader:
    """The cluster as this user sees it, over many namespaces (blocking calls: the server
    runs each in a thread)."""

    def __init__(self, cluster: Cluster, namespaces: list[str]) -> None:
        self.cluster = cluster
        self.asked = namespaces  # --namespace flags and the context's namespace
        self.custom = cluster.api
        self.core = client.CoreV1Api(cluster.api_client)

    def namespaces(self) -> list[str]:
        """Those the user may list, else (and also) the flags and the context's."""
        found = set(self.asked)
        with contextlib.suppress(ApiException):
            found |= {str(n.metadata.name) for n in self.core.list_namespace().items
                      if n.metadata is not None}
        return sorted(found)

    def listed(self, plural: str, label_selector: str | None = None) -> Listed:
        """Everywhere at once when the user may; else namespace by namespace, keeping the
        API server's refusal for each namespace the user may not list."""
        kw: dict[str, Any] = {"label_selector": label_selector} if label_selector else {}
        try:
            found: Any = self.custom.list_cluster_custom_object(GROUP, VERSION, plural, **kw)
            return Listed(list(found.get("items") or []))
        except ApiException as e:
            if e.status == 404:
                raise KindAbsent(plural) from e
            if e.status != 403:
                raise _refused(e) from e
        listed = Listed()
        for ns in self.namespaces():
            try:
                found = self.custom.list_namespaced_custom_object(GROUP, VERSION, ns, plural,
                                                                  **kw)
            except ApiException as e:
                if e.status == 404:
                    raise KindAbsent(plural) from e
                listed.refused[ns] = api_message(e)
                continue
            listed.items.extend(found.get("items") or [])
        return listed

    def get(self, namespace: str, plural: str, name: str) -> dict[str, Any]:
        try:
            found: Any = self.custom.get_namespaced_custom_object(GROUP, VERSION, namespace,
                                                                  plural, name)
        except ApiException as e:
            raise _refused(e) from e
        return dict(found)

    def list_in(self, namespace: str, plural: str) -> list[dict[str, Any]]:
        try:
            found: Any = self.custom.list_namespaced_custom_object(GROUP, VERSION, namespace,
                                                                   plural)
        except ApiException as e:
            raise _refused(e) from e
        return list(found.get("items") or [])

    def records(self, since: str) -> Listed:
        """The run archive (runs.store.agentrun.dev), everywhere when the user may list it
        cluster-wide, else in each namespace; every page of it."""
        def pages(cluster: Cluster, everywhere: bool) -> Iterator[dict[str, Any]]:
            return cluster.records([("since", since)], everywhere=everywhere)

        try:
            return Listed(list(pages(self.cluster, True)))
        except Failure as e:
            if e.status != 403:
                raise Refused(e.status or 502, str(e)) from e
        listed = Listed()
        for ns in self.namespaces():
            try:
                listed.items.extend(pages(self.cluster.at(ns), False))
            except Failure as e:
                listed.refused[ns] = str(e)
        return listed


# -- actions, each as the user --------------------------------------------------------------


def _wait(get: Callable[[], dict[str, Any]], done: Callable[[dict[str, Any]], bool],
          wait: float) -> dict[str, Any] | None:
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        found = get()
        if done(found):
            return found
        time.sleep(0.3)
    return None


def replay(reader: Reader, ns: str, run: str, *, resume: bool, force: bool,
           note: str | None) -> dict[str, Any]:
    """An AgentRunReplay of `run`, created as the user; the operator's decision in its own
    words (or that none came yet)."""
    try:
        made: Any = reader.custom.create_namespaced_custom_object(
            GROUP, VERSION, ns, REPLAY_PLURAL,
            replay_manifest(None, run, force=force, note=note, resume=resume))
    except ApiException as e:
        raise _refused(e) from e
    name = made["metadata"]["name"]
    decided = _wait(lambda: reader.get(ns, REPLAY_PLURAL, name), lambda r: (r.get(
        "status") or {}).get("phase") in (ReplayPhase.APPROVED, ReplayPhase.REFUSED),
        DECISION_WAIT)
    row = views.replay_row(decided or made)
    kind = "resume" if resume else "replay"
    if decided is None:
        row["said"] = (f"AgentRunReplay {name} created; the operator has not decided it yet "
                       f"(is it running?)")
    else:
        row["said"] = f"{row['phase']} ({row['reason']}): {row['message']}"
    row["kind"] = kind
    return row


def cancel(reader: Reader, ns: str, run: str, note: str | None) -> dict[str, Any]:
    found = reader.get(ns, RUN_PLURAL, run)
    phase = (found.get("status") or {}).get("phase")
    if phase in Phase.TERMINAL:
        return {"said": f"AgentRun {run} is already {phase}; nothing to cancel"}
    annotations = {ANNOTATION_CANCEL: "true"}
    if note:
        annotations[ANNOTATION_CANCEL_NOTE] = note
    try:
        reader.custom.patch_namespaced_custom_object(
            GROUP, VERSION, ns, RUN_PLURAL, run, {"metadata": {"annotations": annotations}})
    except ApiException as e:
        raise _refused(e) from e
    return {"said": f"agentrun/{run} annotated {ANNOTATION_CANCEL}=true; the operator stops "
                    "it and keeps it (Cancelled)"}


def decide(reader: Reader, ns: str, run: str, *, decision: str, note: str | None,
           seq: int, digest: str) -> dict[str, Any]:
    """An AgentRunApproval of the call `run` waits for, created as the user, naming the user
    (the API server checks it is them) and the digest of the arguments the page showed.
    Nothing is decided that the user could not be shown whole, nor a call other than the
    one they saw."""
    found = reader.get(ns, RUN_PLURAL, run)
    status = found.get("status") or {}
    pending = status.get("pendingApproval")
    if status.get("phase") != Phase.WAITING or not pending:
        raise Refused(409, f"AgentRun {run} waits for no approval now: it is "
                           f"{status.get('phase') or Phase.PENDING}")
    if int(pending["seq"]) != seq or pending.get("argsDigest") != digest:
        raise Refused(409, f"AgentRun {run} now waits for another call (call {pending['seq']},"
                           f" {pending['tool']}) than the one shown; look at it again")
    cluster = reader.cluster.at(ns)
    try:
        whole_arguments(cluster, run, pending)
        user = cluster.whoami()
    except Failure as e:
        raise Refused(403, str(e)) from e
    spec: dict[str, Any] = {"runName": run, "seq": seq, "argsDigest": digest,
                            "decision": decision, "approver": user}
    if note:
        spec["note"] = note
    manifest = {"apiVersion": API_VERSION, "kind": APPROVAL_KIND,
                "metadata": {"generateName": f"{run}-call-{seq}-"}, "spec": spec}
    try:
        made: Any = reader.custom.create_namespaced_custom_object(
            GROUP, VERSION, ns, APPROVAL_PLURAL, manifest)
    except ApiException as e:
        raise _refused(e) from e
    name = made["metadata"]["name"]
    judged = _wait(lambda: reader.get(ns, APPROVAL_PLURAL, name),
                   lambda a: bool((a.get("status") or {}).get("phase")), DECISION_WAIT)
    verdict = (judged or {}).get("status") or {}
    said = (f"{verdict['phase']} ({verdict.get('reason')}): {verdict.get('message')}"
            if verdict else f"AgentRunApproval {name} created ({decision} by {user}); the "
            "operator has not judged it yet")
    return {"name": name, "approver": user, "decision": decision,
            "phase": verdict.get("phase"), "reason": verdict.get("reason"),
            "message": verdict.get("message"), "said": said}


def transcript(reader: Reader, ns: str, run: str) -> dict[str, Any]:
    try:
        return reader.cluster.at(ns).transcript(run)
    except Failure as e:
        raise Refused(e.status or 502, str(e)) from e


def approvals(reader: Reader) -> dict[str, Any]:
    """Every call waiting for a decision that the user may see, with its whole arguments
    read from the run's transcript as the user (or why they cannot be shown)."""
    listed = reader.listed(RUN_PLURAL)
    pending = []
    for run in listed.items:
        status = run.get("status") or {}
        if status.get("phase") != Phase.WAITING or not status.get("pendingApproval"):
            continue
        row = views.run_row(run)
        call = status["pendingApproval"]
        try:
            row["args"] = whole_arguments(reader.cluster.at(row["namespace"]), row["name"],
                                          call)
        except Failure as e:
            row["argsError"] = str(e)
        pending.append(row)
    pending.sort(key=lambda r: (r["pendingApproval"].get("requestedAt") or ""))
    return {"pending": pending, "refused": listed.refused}


def by_owner(runs: list[dict[str, Any]], label: str) -> dict[tuple[str, str], list[
        dict[str, Any]]]:
    owned: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for run in runs:
        owner = ((run.get("metadata") or {}).get("labels") or {}).get(label)
        if owner:
            owned.setdefault((run["metadata"]["namespace"], owner), []).append(run)
    return owned


def schedules(reader: Reader) -> dict[str, Any]:
    listed = reader.listed(SCHEDULE_PLURAL)
    runs = by_owner(reader.listed(RUN_PLURAL, LABEL_SCHEDULE).items, LABEL_SCHEDULE)
    rows = [views.schedule_row(s, runs.get((s["metadata"]["namespace"],
                                            s["metadata"]["name"]), []))
            for s in listed.items]
    return {"schedules": sorted(rows, key=lambda r: (r["namespace"], r["name"])),
            "refused": listed.refused}


def triggers(reader: Reader) -> dict[str, Any]:
    try:
        if not reader.cluster.serves(TRIGGER_PLURAL):
            raise KindAbsent(TRIGGER_PLURAL)
        listed = reader.listed(TRIGGER_PLURAL)
    except Failure as e:
        raise Refused(e.status or 502, str(e)) from e
    except KindAbsent:
        return {"available": False, "triggers": [], "refused": {},
                "said": f"This cluster serves no AgentRunTrigger ({TRIGGER_PLURAL}.{GROUP} is "
                        "not installed)."}
    runs = by_owner(reader.listed(RUN_PLURAL, LABEL_TRIGGER).items, LABEL_TRIGGER)
    rows = [views.trigger_row(t, runs.get((t["metadata"]["namespace"],
                                           t["metadata"]["name"]), []))
            for t in listed.items]
    return {"available": True, "triggers": sorted(rows, key=lambda r: (r["namespace"],
                                                                        r["name"])),
            "refused": listed.refused}


def cost(reader: Reader, days: int) -> dict[str, Any]:
    listed = reader.records(f"{days * 24}h")
    return {**views.cost_series(listed.items, days=days, now=datetime.now(UTC)),
            "refused": listed.refused,
            "source": f"runs.{TRANSCRIPT_GROUP}/{TRANSCRIPT_VERSION}"}


def runs(reader: Reader) -> dict[str, Any]:
    listed = reader.listed(RUN_PLURAL)
    rows = sorted((views.run_row(r) for r in listed.items),
                  key=lambda r: r["created"] or "", reverse=True)
    return {"runs": rows, "refused": listed.refused}


def run_page(reader: Reader, ns: str, name: str) -> dict[str, Any]:
    run = reader.get(ns, RUN_PLURAL, name)
    try:
        replays = reader.list_in(ns, REPLAY_PLURAL)
        refused = None
    except Refused as e:
        replays, refused = [], str(e)
    page = views.run_page(run, replays)
    page["replaysRefused"] = refused
    return page


# -- the web server ----------------------------------------------------------------------------


def _json(body: Any, status: int = 200) -> web.Response:
    return web.json_response(body, status=status, dumps=lambda o: json.dumps(o, default=str))


class Console:
    """The console of one user on one port."""

    def __init__(self, cluster: Cluster, namespaces: list[str], port: int,
                 token: str | None = None, static: Path = STATIC) -> None:
        self.reader = Reader(cluster, namespaces)
        self.port = port
        self.token = token or secrets.token_urlsafe(32)
        self.static = static
        self.user: str | None = None
        self.streams: set[Any] = set()  # followed transcripts, cut when the console stops

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/runs?token={self.token}"

    @web.middleware
    async def guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        verdict = guard.admit(guard.Request(
            method=request.method, host=request.headers.get("Host"),
            query_token=request.query.get("token"),
            cookie=request.cookies.get(guard.cookie_name(self.port)),
            origin=request.headers.get("Origin"),
            fetch_site=request.headers.get("Sec-Fetch-Site")), port=self.port, token=self.token)
        if verdict is guard.Verdict.EXCHANGE:
            query = {k: v for k, v in request.query.items() if k != "token"}
            target = request.rel_url.with_query(query)
            response = web.HTTPSeeOther(str(target))
            response.set_cookie(guard.cookie_name(self.port), self.token, httponly=True,
                                samesite="Strict", path="/")
            self._harden(response)
            raise response
        if verdict is not guard.Verdict.SERVE:
            status = 401 if verdict is guard.Verdict.UNAUTHORIZED else 403
            said = guard.SAID[verdict].format(port=self.port)
            answer: web.StreamResponse = _json({"error": said, "status": status}, status)
        else:
            answer = await handler(request)
        self._harden(answer)
        return answer

    @staticmethod
    def _harden(response: web.StreamResponse) -> None:
        if response.prepared:
            return
        response.headers.setdefault(
            "Content-Security-Policy", "default-src 'self'; img-src 'self' data:; "
            "style-src 'self' 'unsafe-inline'; frame-ancestors 'none'; base-uri 'none'")
        response.headers.setdefault("X-Frame-Options", "DENY")
        response.headers.setdefault("Referrer-Policy", "no-referrer")
        response.headers.setdefault("X-Content-Type-Options", "nosniff")
        response.headers.setdefault("Cache-Control", "no-store")

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self.guard])
        r = app.router
        r.add_get("/", self.home)
        for page in PAGES:
            r.add_get(page, self.page)
        r.add_get("/runs/{ns}/{name}", self.page)
        r.add_get("/api/session", self.session)
        r.add_get("/api/runs", self.call(lambda q: runs(self.reader)))
        r.add_get("/api/approvals", self.call(lambda q: approvals(self.reader)))
        r.add_get("/api/schedules", self.call(lambda q: schedules(self.reader)))
        r.add_get("/api/triggers", self.call(lambda q: triggers(self.reader)))
        r.add_get("/api/cost", self.call(lambda q: cost(self.reader, _days(q))))
        r.add_get("/api/runs/{ns}/{name}", self.call(
            lambda q: run_page(self.reader, q.match_info["ns"], q.match_info["name"])))
        r.add_get("/api/runs/{ns}/{name}/transcript", self.call(
            lambda q: transcript(self.reader, q.match_info["ns"], q.match_info["name"])))
        r.add_get("/api/runs/{ns}/{name}/follow", self.follow)
        r.add_post("/api/runs/{ns}/{name}/{action}", self.act)
        if (self.static / "assets").is_dir():
            r.add_static("/assets", self.static / "assets")
        return app

    def call(self, read: Callable[[web.Request], dict[str, Any]]) -> Handler:
        async def handler(request: web.Request) -> web.StreamResponse:
            try:
                return _json(await asyncio.to_thread(read, request))
            except Refused as e:
                return _json({"error": str(e), "status": e.status}, e.status)
            except (urllib3.exceptions.HTTPError, OSError) as e:
                said = f"cannot reach the Kubernetes API server: {e}"
                return _json({"error": said, "status": 502}, 502)
        return handler

    async def home(self, request: web.Request) -> web.StreamResponse:
        raise web.HTTPSeeOther("/runs")

    async def page(self, request: web.Request) -> web.StreamResponse:
        index = self.static / "index.html"
        if not index.exists():
            return web.Response(status=500, content_type="text/plain", text=(
                f"The console's pages are not built ({index} is missing): in a checkout, "
                "`make console` builds them."))
        return web.FileResponse(index, headers={"Content-Type": "text/html; charset=utf-8"})

    async def session(self, request: web.Request) -> web.StreamResponse:
        def read() -> dict[str, Any]:
            if self.user is None:
                try:
                    self.user = self.reader.cluster.whoami()
                except Failure as e:
                    raise Refused(502, str(e)) from e
            return {"user": self.user, "namespaces": self.reader.namespaces(),
                    "port": self.port}
        return await self.call(lambda q: read())(request)

    async def act(self, request: web.Request) -> web.StreamResponse:
        ns, name, action = (request.match_info[k] for k in ("ns", "name", "action"))
        try:
            body = await request.json()
        except ValueError:
            body = {}
        if not isinstance(body, dict):
            body = {}
        note = str(body["note"]) if body.get("note") else None

        def perform() -> dict[str, Any]:
            if action in ("replay", "resume"):
                return replay(self.reader, ns, name, resume=action == "resume",
                              force=bool(body.get("force")), note=note)
            if action == "cancel":
                return cancel(self.reader, ns, name, note)
            if action in ("approve", "deny"):
                try:
                    seq, digest = int(body["seq"]), str(body["argsDigest"])
                except (KeyError, TypeError, ValueError) as e:
                    raise Refused(400, "an approval names the call (seq) and the digest of "
                                       "the arguments shown (argsDigest)") from e
                return decide(self.reader, ns, name, seq=seq, digest=digest, note=note,
                              decision=ApprovalDecision.DENY if action == "deny"
                              else ApprovalDecision.APPROVE)
            raise Refused(404, f"no action {action!r}")
        return await self.call(lambda q: perform())(request)

    async def follow(self, request: web.Request) -> web.StreamResponse:
        """The run's transcript entries as they come (?follow=true of the aggregated API,
        as the user), one JSON entry a line, until the run settles or the page goes."""
        ns, name = request.match_info["ns"], request.match_info["name"]
        try:
            upstream = await asyncio.to_thread(self.reader.cluster.at(ns).follow, name)
        except Failure as e:
            return _json({"error": str(e), "status": e.status or 502}, e.status or 502)
        response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        self._harden(response)
        await response.prepare(request)
        lines = iter(upstream.response)
        self.streams.add(upstream.response)
        try:
            while True:
                read = asyncio.ensure_future(asyncio.to_thread(next, lines, None))
                while not read.done():
                    await asyncio.wait({read}, timeout=1.0)
                    if request.transport is None or request.transport.is_closing():
                        upstream.response.shutdown()
                        return response
                line = read.result()
                if line is None:
                    break
                if line.strip():
                    await response.write(line if line.endswith(b"\n") else line + b"\n")
        except (OSError, ConnectionError):
            pass
        finally:
            self.streams.discard(upstream.response)
            with contextlib.suppress(Exception):
                upstream.response.release_conn()
        with contextlib.suppress(ConnectionError, RuntimeError):
            await response.write_eof()
        return response


def _days(request: web.Request) -> int:
    try:
        return max(1, min(90, int(request.query.get("days", COST_DAYS))))
    except ValueError:
        return COST_DAYS


async def serve(console: Console, *, ready: Callable[[str], None]) -> None:
    """Serves until cancelled (Ctrl-C)."""
    # Ctrl-C stops a local page at once: a request still in flight after a second (a
    # slow API server's answer, a followed transcript) is cut, not waited for a minute.
    runner = web.AppRunner(console.app(), access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", console.port)
    await site.start()
    ready(console.url)
    # Ctrl-C (and a plain kill) stop it, also where it was started with SIGINT ignored (a
    # background job of a script inherits that, and Python then raises no
    # KeyboardInterrupt): asyncio's handlers replace an inherited SIG_IGN.
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        await stop.wait()
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
        # A thread reading a followed transcript would hold the exit until its run says
        # something: cut them.
        for stream in list(console.streams):
            with contextlib.suppress(Exception):
                stream.shutdown()
        await runner.cleanup()
