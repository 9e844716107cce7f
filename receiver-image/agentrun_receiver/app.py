"""The receiver's HTTP server: POST /v1/triggers/<namespace>/<name> starts the trigger's run
for the event delivered, once per event identity.

One delivery, in order (checks.py says each refusal):

1. the trigger, read from the API server (404 if there is none; 503 if it cannot be read);
2. suspended: 503; Content-Length over maxBodyBytes: 413, the body not read; the body, read
   up to that many bytes;
3. the Secret spec.auth names (503 while it is missing: the sender delivers again once it
   is there), then the signature or token: 401;
4. the event: its identity and its file event.json, or 400;
5. deduplication: the run `<trigger>-<first 10 hex of sha256(identity)>` exists: 200
   `duplicate` with its name if its label and event-id annotation are this event's, 409 if
   not;
6. maxRunsPerMinute: 429 with Retry-After;
7. the ConfigMap `<run>-event` (the event, owned by the trigger until its run exists), then
   the run, then the ConfigMap handed to the run: 201 `created`. Two deliveries of one
   event at once both write the ConfigMap and both create the run: one of each wins, the
   other finds the winner's and answers `duplicate`.

Whenever the API server does not answer, the receiver answers 503 with Retry-After, having
accepted nothing: the sender's redelivery is the queue.
"""

from __future__ import annotations

import datetime
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from kubernetes.client.exceptions import ApiException

from agentrun import triggered
from agentrun.vocabulary import (
    ANNOTATION_EVENT_ID,
    EVENT_FILE,
    LABEL_TRIGGER,
    RECEIVER_PATH,
    TriggerResult,
)
from agentrun_receiver import checks, metrics
from agentrun_receiver.checks import RETRY_AFTER_SECONDS, Event, Refusal
from agentrun_receiver.counters import Counters
from agentrun_receiver.kube import Conflict, Kube, Unavailable
from agentrun_receiver.ratelimit import Window

log = logging.getLogger("agentrun.receiver")

# The largest body any trigger may allow (the CRD's maximum of maxBodyBytes).
MAX_BODY_BYTES = 1048576


@dataclass
class Receiver:
    kube: Kube
    counters: Counters
    window: Window = field(default_factory=Window)


@dataclass(frozen=True)
class Answer:
    status: int
    result: str
    message: str
    run: str = ""
    retry_after: int | None = None

    def response(self) -> web.Response:
        body: dict[str, Any] = {"result": self.result, "message": self.message}
        if self.run:
            body["run"] = self.run
        headers = {"Retry-After": str(self.retry_after)} if self.retry_after else {}
        return web.json_response(body, status=self.status, headers=headers)


def _refused(refusal: Refusal) -> Answer:
    return Answer(refusal.status, refusal.result, refusal.message,
                  retry_after=refusal.retry_after)


def _unavailable(problem: Exception) -> Answer:
    return Answer(503, TriggerResult.UNAVAILABLE, (
        f"The receiver cannot reach the Kubernetes API server ({problem}); nothing was "
        "accepted: deliver this event again."), retry_after=RETRY_AFTER_SECONDS)


async def deliver(receiver: Receiver, request: web.Request) -> web.Response:
    namespace, name = request.match_info["namespace"], request.match_info["name"]
    started = time.perf_counter()
    counted = ("", "")
    try:
        trigger = await receiver.kube.trigger(namespace, name)
        if trigger is None:
            answer = Answer(404, "not_found", (
                f"There is no AgentRunTrigger {name} in namespace {namespace}."))
        else:
            counted = (namespace, name)
            answer = await _deliver(receiver, request, trigger)
    except Unavailable as e:
        answer = _unavailable(e)
    if answer.result in TriggerResult.ALL:
        metrics.EVENTS.labels(*counted, answer.result).inc()
    log.info("event=delivery trigger=%s/%s status=%s result=%s run=%s seconds=%.3f", namespace,
             name, answer.status, answer.result, answer.run or "-",
             time.perf_counter() - started)
    return answer.response()


async def _deliver(receiver: Receiver, request: web.Request, trigger: dict[str, Any]
                   ) -> Answer:
    meta, spec = trigger["metadata"], trigger.get("spec") or {}
    namespace, name = meta["namespace"], meta["name"]
    if spec.get("suspend"):
        return _refused(checks.suspended(namespace, name))
    limit = int(spec.get("maxBodyBytes") or triggered.DEFAULT_MAX_BODY_BYTES)
    refusal = checks.too_large(request.content_length, limit)
    if refusal is not None:
        return _refused(refusal)
    body = await request.content.read(limit + 1)
    refusal = checks.too_large(len(body), limit, read=True)
    if refusal is not None:
        return _refused(refusal)
    try:
        auth, identity = triggered.auth_of(spec), triggered.identity_of(spec)
    except triggered.InvalidTrigger as e:
        return Answer(503, TriggerResult.UNAVAILABLE, (
            f"AgentRunTrigger {namespace}/{name} cannot be read ({e}); no run was started: "
            "deliver this event again once it is fixed."), retry_after=RETRY_AFTER_SECONDS)
    secret = await receiver.kube.secret_value(namespace, auth.secret, auth.key)
    if secret is None:
        return Answer(503, TriggerResult.UNAVAILABLE, (
            f"The trigger's Secret {auth.secret} (key {auth.key}) is not there, so no "
            "delivery can be checked; no run was started: deliver this event again once "
            "it is."), retry_after=RETRY_AFTER_SECONDS)
    headers = {k: v for k, v in request.headers.items()}
    refusal = checks.unauthorized(auth, secret, headers, body)
    if refusal is not None:
        return _refused(refusal)
    now = datetime.datetime.now(datetime.UTC)
    event = checks.read_event(identity, headers, body)
    if isinstance(event, Refusal):
        receiver.counters.add((namespace, name), duplicate=False, when=now)
        return _refused(event)
    answer = await _once(receiver, trigger, event)
    receiver.counters.add((namespace, name), duplicate=answer.result == TriggerResult.DUPLICATE,
                          when=now)
    return answer


def _duplicate(run: dict[str, Any], trigger: str, event: Event) -> Answer:
    name = run["metadata"]["name"]
    if triggered.is_event_of(run, trigger, event.identity):
        return Answer(200, TriggerResult.DUPLICATE, (
            f"This event already started AgentRun {name}; no other run was started."), name)
    return Answer(409, TriggerResult.CONFLICT, (
        f"AgentRun {name} exists and is not this event's run (its {LABEL_TRIGGER} label or "
        f"{ANNOTATION_EVENT_ID} annotation says otherwise); no run was started: delete or "
        "rename that run, then deliver this event again."), name)


async def _once(receiver: Receiver, trigger: dict[str, Any], event: Event) -> Answer:
    """Steps 5 to 7 of the module's docstring."""
    meta, spec = trigger["metadata"], trigger.get("spec") or {}
    namespace, name = meta["namespace"], meta["name"]
    run_name = triggered.run_name(name, event.identity)
    found = await receiver.kube.run(namespace, run_name)
    if found is not None:
        return _duplicate(found, name, event)
    at = time.monotonic()
    wait = receiver.window.take((namespace, name), int(
        spec.get("maxRunsPerMinute") or triggered.DEFAULT_MAX_RUNS_PER_MINUTE), at)
    if wait is not None:
        return Answer(429, TriggerResult.RATE_LIMITED, (
            f"AgentRunTrigger {namespace}/{name} has started maxRunsPerMinute "
            f"({spec.get('maxRunsPerMinute')}) runs in the last minute; no run was started: "
            f"deliver this event again in {wait} s."), retry_after=wait)
    try:
        answer = await _create(receiver, trigger, run_name, event)
    except BaseException:
        receiver.window.give_back((namespace, name), at)
        raise
    if answer.result != TriggerResult.CREATED:
        receiver.window.give_back((namespace, name), at)
    return answer


async def _create(receiver: Receiver, trigger: dict[str, Any], run_name: str,
                  event: Event) -> Answer:
    meta = trigger["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    configmap = triggered.event_configmap(run_name)
    try:
        written = await _write_event(receiver, trigger, run_name, event)
    except Conflict:
        # Written at this moment by another delivery of the event, or someone's else.
        existing = await receiver.kube.configmap(namespace, configmap)
        if existing is not None and not triggered.is_event_of(existing, name, event.identity):
            return Answer(409, TriggerResult.CONFLICT, (
                f"ConfigMap {configmap} exists and is not this event's (its {LABEL_TRIGGER} "
                f"label or {ANNOTATION_EVENT_ID} annotation says otherwise); no run was "
                "started: delete it, then deliver this event again."))
        written = existing
    except ApiException as e:
        if e.status == 422:  # too large for a ConfigMap, as written
            return Answer(413, TriggerResult.TOO_LARGE, (
                "The event is too large to keep as the run's input file (a ConfigMap holds "
                "at most 1 MiB); no run was started."))
        raise
    manifest = triggered.triggered_run(trigger, run_name, event.identity)
    try:
        run = await receiver.kube.create_run(manifest)
    except Conflict:
        found = await receiver.kube.run(namespace, run_name)
        if found is None:  # deleted just now: the sender's next delivery finds out
            return _unavailable(RuntimeError(f"AgentRun {run_name} was deleted meanwhile"))
        return _duplicate(found, name, event)
    if written is not None:
        await _hand_over(receiver, run, written)
    return Answer(201, TriggerResult.CREATED, f"Started AgentRun {run_name} for this event.",
                  run_name)


async def _write_event(receiver: Receiver, trigger: dict[str, Any], run_name: str,
                       event: Event) -> dict[str, Any] | None:
    """Creates the ConfigMap `<run>-event` (raises Conflict when it exists), owned by the
    trigger until its run exists: a receiver that stops in between leaves nothing behind
    the trigger's life."""
    meta = trigger["metadata"]
    try:
        text, binary = {EVENT_FILE: event.file.decode()}, None
    except UnicodeDecodeError:
        import base64

        text, binary = None, {EVENT_FILE: base64.b64encode(event.file).decode()}
    manifest: dict[str, Any] = {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": triggered.event_configmap(run_name), "namespace": meta["namespace"],
                     "labels": {LABEL_TRIGGER: meta["name"]},
                     "annotations": {ANNOTATION_EVENT_ID: event.identity},
                     "ownerReferences": [{**triggered.owner(trigger), "controller": False}]},
        # Written once: what the run snapshots is what arrived.
        "immutable": True}
    if text is not None:
        manifest["data"] = text
    else:
        manifest["binaryData"] = binary
    return await receiver.kube.create_configmap(manifest)


async def _hand_over(receiver: Receiver, run: dict[str, Any], configmap: dict[str, Any]
                     ) -> None:
    """The ConfigMap is the run's from now on (deleted with it): best effort, said in the
    log when it fails (it then goes with the trigger)."""
    meta = run["metadata"]
    owners = [{"apiVersion": run["apiVersion"], "kind": run["kind"], "name": meta["name"],
               "uid": meta["uid"], "controller": True}]
    try:
        await receiver.kube.hand_over(meta["namespace"], configmap["metadata"]["name"],
                                      configmap["metadata"]["uid"], owners)
    except (Unavailable, Conflict, ApiException) as e:
        log.warning("event=event-configmap-not-handed-over run=%s/%s error=%s",
                    meta["namespace"], meta["name"], e)


def make_app(receiver: Receiver) -> web.Application:
    app = web.Application(client_max_size=MAX_BODY_BYTES + 1)

    async def handle(request: web.Request) -> web.Response:
        return await deliver(receiver, request)

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def not_allowed(_: web.Request) -> web.Response:
        return web.json_response({"message": "Deliver events with POST."}, status=405,
                                 headers={"Allow": "POST"})

    app.router.add_post(RECEIVER_PATH + "/{namespace}/{name}", handle)
    app.router.add_get(RECEIVER_PATH + "/{namespace}/{name}", not_allowed)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/livez", healthz)
    return app
