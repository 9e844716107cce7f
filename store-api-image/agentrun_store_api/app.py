"""The store API as an aiohttp application, and `serve()`: what `agentrun-store-api`
runs, and what the operator runs in its own process on the development cluster."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from kubernetes import client
from sqlalchemy.ext.asyncio import AsyncEngine

from agentrun import store
from agentrun.vocabulary import STORE_AUDIENCE
from agentrun_store_api import metrics
from agentrun_store_api.auth import Authority, Caller
from agentrun_store_api.limits import MAX_BODY
from agentrun_store_api.refusal import Refused
from agentrun_store_api.routes import ROUTES, Route, Routes
from agentrun_store_api.tls import ServingCertificate

log = logging.getLogger("agentrun.store_api")

Handler = Callable[[web.Request, Caller], Awaitable[Any]]


@dataclass
class Readiness:
    """Whether the store is at the schema this code knows; why not, if not."""

    ready: bool = True
    why: str = ""

    async def wait_for_schema(self, engine: AsyncEngine, interval: float = 2.0) -> None:
        """Not ready until the operator has migrated the store (it alone migrates)."""
        self.ready = False
        while True:
            try:
                await store.check_schema(engine)
                self.ready, self.why = True, ""
                log.info("event=store-ready")
                return
            except Exception as e:
                self.why = f"the run store is not ready: {e}"
                log.warning("event=store-not-ready error=%r", e)
            await asyncio.sleep(interval)


def _serving(route: Route, authority: Authority, readiness: Readiness,
             handler: Handler) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """`handler` behind authentication and the store's readiness."""
    async def serve(request: web.Request) -> web.StreamResponse:
        started = time.perf_counter()
        caller: Caller | None = None
        try:
            if not readiness.ready:
                raise Refused(503, readiness.why or "the run store is not ready")
            caller = await authority.caller(request)
            result = await handler(request, caller)
            response: web.StreamResponse = web.json_response(
                {} if result is None else result, dumps=_dumps)
        except Refused as e:
            response = web.json_response({"error": e.message}, status=e.status)
            log.info("event=refused route=%s status=%s run=%s message=%r", route.name,
                     e.status, caller.run_name if caller else "-", e.message)
        except json.JSONDecodeError as e:
            response = web.json_response({"error": f"the body is not JSON: {e}"}, status=400)
        except Exception as e:  # the store may be down: say so, the runner decides
            log.exception("event=store-api-failed route=%s", route.name)
            metrics.STORE_API_ERRORS.labels(route.name).inc()
            response = web.json_response(
                {"error": f"the run store could not serve {request.path}: "
                          f"{type(e).__name__}: {e}"}, status=503)
        elapsed = time.perf_counter() - started
        if route.ledger:
            metrics.LEDGER_WRITE_DURATION.labels(route.ledger, str(response.status)).observe(
                elapsed)
        response.headers["Server-Timing"] = f"store;dur={elapsed * 1000:.2f}"
        return response

    return serve


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), default=str)


def application(authority: Authority, routes: Routes,
                readiness: Readiness | None = None) -> web.Application:
    """The store API's routes (routes.ROUTES), each behind authentication and readiness,
    and its two probes."""
    app = web.Application(client_max_size=MAX_BODY)
    ready = readiness or Readiness()

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
            route, authority, ready, getattr(routes, route.name)))
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
    app = application(Authority(api, engine, audience, namespaces), Routes(engine), readiness)
    runner = web.AppRunner(app, access_log=None)
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
