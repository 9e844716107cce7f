"""What a delivery says, and whether it may start a run: the receiver's checks, pure.

The receiver (app.py) asks them in the contract's order, reading from the API server only
what the next one needs, and answers the first refusal:

| check | refusal |
| --- | --- |
| the trigger is suspended | 503 `unavailable`, Retry-After |
| Content-Length over maxBodyBytes (the body not read), or a longer body | 413 `too_large` |
| no signature or token, or a wrong one | 401 `unauthorized` |
| not an event the trigger can read (its identity cannot be found) | 400 `malformed` |
| (deduplication: a redelivery is answered 200 `duplicate`, or 409 `conflict`) | |
| more new events this minute than maxRunsPerMinute | 429 `rate_limited`, Retry-After |

Each refusal is one sentence that says what was wrong and what the sender can do, and
none of them has created anything: every write comes after the last check.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agentrun.triggered import MAX_IDENTITY_BYTES, Auth, Identity
from agentrun.vocabulary import TriggerIdentity, TriggerResult

# A sender told 503 or 429 tries again after this many seconds (suspended, unreachable).
RETRY_AFTER_SECONDS = 30
STRUCTURED = "application/cloudevents+json"
BATCH = "application/cloudevents-batch+json"


@dataclass(frozen=True)
class Refusal:
    """An answer that starts no run: its HTTP status, its metric result and its sentence."""

    status: int
    result: str
    message: str
    retry_after: int | None = None


@dataclass(frozen=True)
class Event:
    """An event the trigger can read: its identity (which names its run) and the bytes of
    its input file event.json."""

    identity: str
    file: bytes


def suspended(namespace: str, name: str) -> Refusal:
    return Refusal(503, TriggerResult.UNAVAILABLE, (
        f"AgentRunTrigger {namespace}/{name} is suspended (spec.suspend); no run was "
        "started: deliver this event again once it is resumed."), RETRY_AFTER_SECONDS)


def too_large(size: int | None, limit: int, *, read: bool = False) -> Refusal | None:
    """413 when the body is (or, by its Content-Length, would be) over `limit` bytes."""
    if size is None or size <= limit:
        return None
    said = f"{size} bytes" if not read else f"more than {limit} bytes"
    return Refusal(413, TriggerResult.TOO_LARGE, (
        f"The body is {said}, over this trigger's maxBodyBytes ({limit}); no run was "
        "started."))


def unauthorized(auth: Auth, secret: bytes, headers: Mapping[str, str],
                 body: bytes) -> Refusal | None:
    """401 unless the delivery carries the right HMAC-SHA256 of its raw body
    ("sha256=<hex>" in the configured header, GitHub's form) or the right bearer token.
    Compared in constant time."""
    if auth.kind == "hmac":
        given = _header(headers, auth.header)
        if not given:
            return Refusal(401, TriggerResult.UNAUTHORIZED, (
                f"The delivery has no {auth.header} header; sign the raw body with the "
                f"trigger's secret and send \"sha256=<hex of HMAC-SHA256>\" in it."))
        expected = "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()
        if not hmac.compare_digest(given.strip().lower().encode(), expected.encode()):
            return Refusal(401, TriggerResult.UNAUTHORIZED, (
                f"The {auth.header} signature does not match the body: sign the raw body, "
                "as sent, with the trigger's secret (\"sha256=<hex of HMAC-SHA256>\")."))
        return None
    given = _header(headers, "Authorization")
    scheme, _, token = given.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return Refusal(401, TriggerResult.UNAUTHORIZED, (
            "The delivery has no bearer token; send \"Authorization: Bearer <token>\" with "
            "the trigger's token."))
    if not hmac.compare_digest(token.strip().encode(), secret.strip()):
        return Refusal(401, TriggerResult.UNAUTHORIZED,
                       "The bearer token is not this trigger's token.")
    return None


def _header(headers: Mapping[str, str], name: str) -> str:
    wanted = name.lower()
    return next((v for k, v in headers.items() if k.lower() == wanted), "")


def malformed(message: str) -> Refusal:
    return Refusal(400, TriggerResult.MALFORMED, message + " No run was started.")


def read_event(identity: Identity, headers: Mapping[str, str], body: bytes) -> Event | Refusal:
    """The event a delivery carries, as `identity` reads it, or why it cannot be read.

    CloudEvents (binary or structured mode, CloudEvents' own SDK): the identity is
    `source + "\\n" + id`, both required in the request as sent (the SDK would fill a
    missing id with a random one, and every redelivery would start a run), and event.json
    is the whole event in the structured JSON format, whatever mode it came in. A header:
    its value. A JSON pointer: the value there, a string as it is, anything else as
    canonical JSON. For those two, event.json is the body as received."""
    if identity.form == TriggerIdentity.CLOUDEVENTS:
        return _cloudevent(headers, body)
    if identity.form == TriggerIdentity.HEADER:
        value = _header(headers, identity.name)
        if not value:
            return malformed(f"The delivery has no {identity.name} header, which identifies "
                             "its event for this trigger.")
        return _identified(value, body)
    try:
        document = json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        return malformed(f"The body is not JSON ({e}), so {identity.describe()} cannot "
                         "identify its event.")
    import jsonpointer

    try:
        found = jsonpointer.resolve_pointer(document, identity.name)
    except jsonpointer.JsonPointerException as e:
        return malformed(f"The body has nothing at {identity.name} ({e}), which identifies "
                         "its event for this trigger.")
    value = found if isinstance(found, str) else json.dumps(
        found, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    if value == "":
        return malformed(f"The body's {identity.name} is empty; it identifies its event.")
    return _identified(value, body)


def _identified(value: str, file: bytes) -> Event | Refusal:
    if len(value.encode()) > MAX_IDENTITY_BYTES:
        return malformed(f"The event's identity is {len(value.encode())} bytes, over "
                         f"{MAX_IDENTITY_BYTES}.")
    return Event(value, file)


def _cloudevent(headers: Mapping[str, str], body: bytes) -> Event | Refusal:
    from cloudevents.core.bindings import http
    from cloudevents.core.exceptions import BaseCloudEventException
    from cloudevents.core.formats.json import JSONFormat

    lowered = {k.lower(): v for k, v in headers.items()}
    content_type = lowered.get("content-type", "").split(";")[0].strip().lower()
    binary = any(k.startswith(http.CE_PREFIX) for k in lowered)
    if binary:
        raw: dict[str, Any] = {k[len(http.CE_PREFIX):]: v for k, v in lowered.items()
                               if k.startswith(http.CE_PREFIX)}
    elif content_type == BATCH:
        return malformed("Batched CloudEvents are not accepted: deliver each event on its "
                         "own, in binary or structured mode.")
    elif content_type == STRUCTURED:
        try:
            parsed = json.loads(body)
        except (ValueError, UnicodeDecodeError) as e:
            return malformed(f"The structured CloudEvent is not JSON ({e}).")
        if not isinstance(parsed, dict):
            return malformed("The structured CloudEvent is not a JSON object.")
        raw = parsed
    else:
        return malformed("The delivery is not a CloudEvent: send it in binary mode (ce-id, "
                         "ce-source, ce-type and ce-specversion headers) or structured mode "
                         f"(Content-Type {STRUCTURED}).")
    missing = [a for a in ("id", "source") if not isinstance(raw.get(a), str) or not raw[a]]
    if missing:
        where = " and ".join(f"ce-{a}" if binary else a for a in missing)
        return malformed(f"The CloudEvent has no {where}: a CloudEvent's source and id "
                         "identify it, and this trigger starts one run per event.")
    message = http.HTTPMessage(headers=lowered, body=body)
    try:
        event = http.from_binary(message, JSONFormat()) if binary else \
            http.from_structured(message, JSONFormat())
        written = JSONFormat().write(event)
    except (BaseCloudEventException, ValueError, TypeError, UnicodeDecodeError) as e:
        return malformed(f"The CloudEvent is not valid: {e}.")
    if "time" not in raw:
        # The SDK stamps an event that has no time with the time it read it: event.json is
        # the event as the sender made it.
        as_json = json.loads(written)
        as_json.pop("time", None)
        written = json.dumps(as_json).encode()
    return _identified(f"{event.get_source()}\n{event.get_id()}", written)
