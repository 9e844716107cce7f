"""The store API as an aiohttp application, and `serve()`: what `agentrun-store-api`
runs."""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from kubernetes import client
from sqlalchemy.ext.asyncio import AsyncEngine

from agentrun import store
from agentrun.attempt import AttemptIdentity
from agentrun.vocabulary import STORE_AUDIENCE
from agentrun_store_api import limits, metrics
from agentrun_store_api.auth import Authority
from agentrun_store_api.quotas import Quotas
from agentrun_store_api.refusal import NotReady, OverQuota, Refused
from agentrun_store_api.routes import ROUTES, Route, Routes, too_large
from agentrun_store_api.tls import ServingCertificate

log = logging.getLogger("agentrun.store_api")

Handler = Callable[[web.Request, AttemptIdentity], Awaitable[Any]]


@dataclass
class Readiness:
    """Whether the store is at the schema this code knows; why not, if not (in words a
    runner may read: the details, hosts included, go to the log)."""

    ready: bool = True
    why: str = ""

    async def wait_for_schema(self, engine: AsyncEngine, interval: float = 2.0) -> None:
        """Not ready until the operator has migrated the store (it alone migrates). Looked
        at again soon at first (an operator started beside it migrates within a second or
        two), then every `interval`."""
        self.ready = False
        delay = interval / 8
        while True:
            try:
                await store.check_schema(engine)
                self.ready, self.why = True, ""
                log.info("event=store-ready")
                return
            except store.StoreNotReady as e:
                self.why = e.said
                log.warning("event=store-not-ready error=%r", e)
            except Exception as e:
                self.why = "the run store cannot be reached by the store API yet"
                log.warning("event=store-not-ready error=%r", e)
            await asyncio.sleep(delay)
            delay = min(delay * 2, interval)


def _answer(status: int, body: Any) -> web.Response:
    return web.json_response(body, status=status, dumps=_dumps)


class RefusalLog:
    """Refusals as log lines: at most one a second for the same run, route and status
    (a flood's refusals would otherwise be a flood of lines, written by the store API's
    one loop); the next line says how many were left out (`unlogged=`)."""

    def __init__(self) -> None:
        self._last: OrderedDict[tuple[str, str, int], tuple[float, int]] = OrderedDict()

    def __call__(self, route: Route, refusal: Refused, caller: AttemptIdentity | None) -> None:
        key = (_run_of(caller), route.name, refusal.status)
        now = time.monotonic()
        last, unlogged = self._last.get(key, (0.0, 0))
        if now - last < 1.0:
            self._last[key] = (last, unlogged + 1)
            return
        log.info("event=refused route=%s status=%s run=%s message=%r unlogged=%s", route.name,
                 refusal.status, key[0], refusal.message, unlogged)
        self._last[key] = (now, 0)
        self._last.move_to_end(key)
        while len(self._last) > limits.CACHE_ENTRIES:
            self._last.popitem(last=False)


def _serving(route: Route, authority: Authority, quotas: Quotas, readiness: Readiness,
             said: RefusalLog,
             handler: Handler) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """`handler` behind its body limit, the store's readiness, authentication, and the
    attempt's turn at the store; every answer it gives a runner is ours to word."""
    limit = limits.BODY_BYTES[route.name]

    async def serve(request: web.Request) -> web.StreamResponse:
        started = time.perf_counter()
        caller: AttemptIdentity | None = None
        try:
            declared = request.content_length
            if declared is not None and declared > limit:
                # Before the token: a body too large is refused unread, whoever sends it.
                raise too_large(route.name, limit, declared)
            if not readiness.ready:
                raise NotReady(readiness.why or "the run store is not ready")
            caller = await authority.caller(request)
            async with quotas.turn(caller):
                try:
                    if route.takes is not None:
                        await quotas.check(caller, route.takes)
                    if not route.fenced:
                        await authority.check_live(caller)
                    result = await handler(request, caller)
                except OverQuota:
                    await asyncio.sleep(limits.OVER_QUOTA_PAUSE_SECONDS)
                    raise
            response = _answer(200, {} if result is None else result)
        except store.AttemptSettled as e:  # a fenced write found the attempt settled
            assert caller is not None
            quotas.forget(caller)
            response = _refused(route, authority.settled(caller, e.status), caller, said)
        except Refused as e:
            response = _refused(route, e, caller, said)
        except Exception as e:  # the store may be down: say so, the runner decides
            # The runner is told which route and a reference, never the error itself: it
            # may hold SQL, parameters or the database's host. The log has it all.
            ref = secrets.token_hex(4)
            log.error("event=store-api-failed route=%s ref=%s run=%s error=%r", route.name,
                      ref, _run_of(caller), e, exc_info=e)
            metrics.STORE_API_ERRORS.labels(route.name).inc()
            metrics.REFUSALS.labels(route.name, "503").inc()
            response = _answer(503, {"error": f"the run store could not serve {route.method} "
                                              f"{route.path} (error {ref} in the store API's "
                                              "log); retry"})
        if request.body_exists and not request.content.is_eof():
            await _unread(request, response)
        elapsed = time.perf_counter() - started
        if route.ledger:
            metrics.LEDGER_WRITE_DURATION.labels(route.ledger, str(response.status)).observe(
                elapsed)
        response.headers["Server-Timing"] = f"store;dur={elapsed * 1000:.2f}"
        return response

    return serve


async def _unread(request: web.Request, response: web.Response) -> None:
    """The rest of a refused request's body: read and dropped when it is small (about
    limits.DRAIN_BYTES at most) and comes within limits.DRAIN_SECONDS, so the connection
    serves the runner's next request; else not read: the answer says Connection: close,
    and the connection closes once it is sent (the server lingers over none of it: serve()
    sets lingering_time=0)."""
    declared = request.content_length
    if declared is None or declared <= limits.DRAIN_BYTES:
        dropped = 0
        try:
            async with asyncio.timeout(limits.DRAIN_SECONDS):
                while dropped <= limits.DRAIN_BYTES and not request.content.is_eof():
                    dropped += len(await request.content.readany())
        except Exception:  # too slow, or the runner went: the connection is not reused
            pass
        if request.content.is_eof():
            return
    response.force_close()


def _refused(route: Route, refusal: Refused, caller: AttemptIdentity | None,
             said: RefusalLog) -> web.Response:
    metrics.REFUSALS.labels(route.name, str(refusal.status)).inc()
    said(route, refusal, caller)
    body = {"error": refusal.message}
    if refusal.reason:
        body["reason"] = refusal.reason
    response = _answer(refusal.status, body)
    if isinstance(refusal, NotReady):
        response.headers["Retry-After"] = str(NotReady.RETRY_AFTER_SECONDS)
    return response


def _run_of(caller: AttemptIdentity | None) -> str:
    return f"{caller.namespace}/{caller.run_name}" if caller else "-"


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), default=str)


def application(authority: Authority, routes: Routes,
                readiness: Readiness | None = None) -> web.Application:
    """The store API's routes (routes.ROUTES), each behind authentication and readiness,
    and its two probes."""
    app = web.Application(client_max_size=limits.MAX_BODY)
    ready = readiness or Readiness()
    said = RefusalLog()

    async def healthz(_: web.Request) -> web.Response:
        if not ready.ready:
            return web.json_response({"ok": False, "error": ready.why}, status=503)
        return web.json_response({"ok": True})

    async def livez(_: web.Request) -> web.Response:
        # Alive is not ready: a store API waiting for its schema (or its database) is
        # healthy, and restarting it would not bring the schema sooner.
        return web.json_response({"ok": True})

    app.router.add_get("/healthz", healthz)
    app.router.add_get("/livez", livez)
    for route in ROUTES:
        app.router.add_route(route.method, route.path, _serving(
            route, authority, routes.quotas, ready, said, getattr(routes, route.name)),
            name=route.name)
    return app


@dataclass
class Served:
    """A running store API: where it listens, and how to stop it."""

    runner: web.AppRunner
    url: str
    waiting: asyncio.Task[None] | None = None
    following: asyncio.Task[None] | None = None

    async def stop(self) -> None:
        for task in (self.waiting, self.following):
            if task is not None:
                task.cancel()
        await self.runner.cleanup()


def split_listen(listen: str) -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"--listen must be HOST:PORT, not {listen!r}")
    return host.strip("[]"), int(port)


async def serve(listen: str, engine: AsyncEngine, api: client.ApiClient, *,
                tls: ServingCertificate, audience: str = STORE_AUDIENCE,
                namespaces: tuple[str, ...] = (), check_schema: bool = False) -> Served:
    """Starts the store API on `listen` (HOST:PORT; port 0 picks a free one), over TLS
    with `tls` (there is no plain HTTP: a runner's token and its session travel on it).
    With `check_schema`, it answers 503 until the store is at the schema this code
    knows."""
    host, port = split_listen(listen)
    readiness = Readiness()
    waiting = None
    if check_schema:
        readiness.ready, readiness.why = False, "the run store has not been checked yet"
        waiting = asyncio.create_task(readiness.wait_for_schema(engine))
    app = application(Authority(api, engine, audience, namespaces),
                      Routes(engine, Quotas(engine)), readiness)
    # lingering_time=0: a body left unread after its answer is not read to its end to keep
    # the connection (aiohttp would, for up to 10 s); _unread has decided by then.
    runner = web.AppRunner(app, access_log=None, lingering_time=0)
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=tls.context)
    await site.start()
    server = site._server
    sockets = getattr(server, "sockets", None) or []
    bound = sockets[0].getsockname()[1] if sockets else port
    shown = f"[{host}]" if ":" in host else host
    url = f"https://{shown}:{bound}"
    log.info("event=store-api-listening url=%s audience=%s", url, audience)
    return Served(runner, url, waiting, asyncio.create_task(tls.follow()))
