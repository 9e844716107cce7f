"""kopf handlers: what is watched, and which lifecycle step each change calls.

Handlers are registered on a registry built from the configuration (the check interval is
configuration), and stay a few lines each: the work is in lifecycle.py and replay.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Any

import kopf

from agentrun import store
from agentrun.vocabulary import (
    ANNOTATION_FORCE_REPLAY,
    GROUP,
    LABEL_RUN,
    REPLAY_PLURAL,
    RUN_PLURAL,
    VERSION,
    Phase,
)
from agentrun_operator import lifecycle, metrics, replay, retention, store_api
from agentrun_operator.config import OperatorConfig
from agentrun_operator.kube import Kube
from agentrun_operator.lifecycle import Context

log = logging.getLogger("agentrun.operator")
FINALIZER = f"{GROUP}/finalizer"


def _needs_check(status: kopf.Status, **_: Any) -> bool:
    """Live runs, and settled ones whose toolsExecuted is still unknown (null)."""
    phase = status.get("phase")
    if phase in Phase.LIVE:
        return True
    return phase in Phase.TERMINAL and "toolsExecuted" in status and \
        status.get("toolsExecuted") is None


def register(config: OperatorConfig) -> kopf.OperatorRegistry:
    """Every handler of the operator, on a fresh registry."""
    registry = kopf.OperatorRegistry()

    # A fresh registry has none of kopf's default login handlers: say how to log in
    # (in-cluster ServiceAccount or kubeconfig, as the kubernetes client does).
    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        return kopf.login_via_client(**kwargs)

    @kopf.on.startup(registry=registry)
    async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
        settings.persistence.finalizer = FINALIZER
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage()
        settings.watching.server_timeout = 300
        settings.posting.level = logging.INFO
        await store.migrate(config.database_url)
        metrics.serve(config.metrics_port)
        kube = Kube()
        running = config
        memo.store_api = None
        if config.store_api_listen:
            # Its own small pool: runner traffic never waits behind the operator's.
            memo.store_api_engine = store.make_engine(
                config.database_url, pool_size=store_api.POOL_SIZE,
                max_overflow=store_api.POOL_OVERFLOW)
            memo.store_api = await store_api.serve(
                config.store_api_listen, memo.store_api_engine, kube.api,
                audience=config.store_api_audience)
            if not config.store_api_url:
                running = dataclasses.replace(config, store_api_url=memo.store_api.url)
        memo.ctx = Context(config=running, engine=store.make_engine(config.database_url),
                           kube=kube)
        memo.purge = asyncio.create_task(retention.purge_daily(memo.ctx))
        log.info("event=started store=%s store_api=%s namespaces=%s",
                 store.redact(config.database_url), running.store_api_url,
                 ",".join(config.namespaces) or "*")

    @kopf.on.cleanup(registry=registry)
    async def cleanup(memo: kopf.Memo, **_: Any) -> None:
        memo.purge.cancel()
        if memo.store_api is not None:
            await memo.store_api.stop()
            await memo.store_api_engine.dispose()
        await memo.ctx.engine.dispose()

    @kopf.on.create(GROUP, VERSION, RUN_PLURAL, registry=registry)
    async def created(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        await lifecycle.launch(memo.ctx, body)

    @kopf.on.resume(GROUP, VERSION, RUN_PLURAL, registry=registry)
    async def resumed(body: kopf.Body, status: kopf.Status, memo: kopf.Memo, **_: Any) -> None:
        # A run whose pod was created is followed by the pod watch and the check timer;
        # creating its pod again (it may have vanished meanwhile) would be a second copy.
        if not status.get("podName"):
            await lifecycle.launch(memo.ctx, body)

    @kopf.on.delete(GROUP, VERSION, RUN_PLURAL, registry=registry)
    async def deleted(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        await lifecycle.cancel(memo.ctx, body)

    @kopf.timer(GROUP, VERSION, RUN_PLURAL, interval=config.check_interval,
                when=_needs_check, registry=registry)
    async def check(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        await lifecycle.check(memo.ctx, body)

    @kopf.on.event("", "v1", "pods", labels={LABEL_RUN: kopf.PRESENT}, registry=registry)
    async def pod_event(type: str, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        # Errors here are not retried by kopf: the check timer is the net under them.
        try:
            await lifecycle.observe_pod(memo.ctx, body, gone=type == "DELETED")
        except Exception:
            log.exception("event=pod-event-failed pod=%s/%s", body.metadata.namespace,
                          body.metadata.name)

    @kopf.on.event("", "v1", "nodes", registry=registry)
    async def node_event(type: str, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        await lifecycle.observe_node(memo.ctx, body, gone=type == "DELETED")

    # -- AgentRunReplay: decided on creation, and again when the force annotation is added
    # to a Refused one (replay.reconcile leaves Approved ones, and unforced Refused ones, be).

    @kopf.on.create(GROUP, VERSION, REPLAY_PLURAL, registry=registry)
    async def replay_created(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        await replay.reconcile(memo.ctx, body)

    @kopf.on.update(GROUP, VERSION, REPLAY_PLURAL, id="replay-forced", registry=registry,
                    field=("metadata", "annotations", ANNOTATION_FORCE_REPLAY))
    async def replay_forced(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        await replay.reconcile(memo.ctx, body)

    @kopf.on.resume(GROUP, VERSION, REPLAY_PLURAL, registry=registry)
    async def replay_resumed(body: kopf.Body, status: kopf.Status, memo: kopf.Memo,
                             **_: Any) -> None:
        # Only undecided ones: a force added while we were down comes as an update.
        if not status.get("phase"):
            await replay.reconcile(memo.ctx, body)

    return registry
