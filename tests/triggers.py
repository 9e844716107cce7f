"""AgentRunTriggers in tests: their manifests, their Secrets, and deliveries to the receiver
signed as a sender signs them (GitHub's `sha256=<hex>`, a bearer token, CloudEvents in
binary and structured mode through CloudEvents' own SDK)."""

from __future__ import annotations

import hashlib
import hmac
import json
import ssl
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrun.vocabulary import API_VERSION, TRIGGER_KIND

SECRET = "ticket-hook"
SECRET_KEY = "secret"
SIGNING_KEY = "s3cret-shared-with-the-sender"
SIGNATURE_HEADER = "X-Signature-256"


def trigger_manifest(name: str = "new-ticket", *, auth: Mapping[str, Any] | None = None,
                     identity: Any = "cloudevents", **spec: Any) -> dict[str, Any]:
    """An AgentRunTrigger; `spec` replaces the minimal valid spec's fields."""
    body: dict[str, Any] = {
        "auth": dict(auth) if auth is not None else {"hmac": {
            "secretKeyRef": {"name": SECRET, "key": SECRET_KEY}, "header": SIGNATURE_HEADER}},
        "identity": identity,
        "runTemplate": {"spec": {"agent": "support-agent",
                                 "input": {"text": "Triage this ticket"}}},
    }
    body.update(spec)
    return {"apiVersion": API_VERSION, "kind": TRIGGER_KIND, "metadata": {"name": name},
            "spec": body}


def secret_manifest(name: str = SECRET, value: str = SIGNING_KEY) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name},
            "stringData": {SECRET_KEY: value}}


def signature(body: bytes, key: str = SIGNING_KEY) -> str:
    """What a sender puts in the signature header: GitHub's form."""
    return "sha256=" + hmac.new(key.encode(), body, hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class Answer:
    status: int
    headers: Mapping[str, str]
    body: dict[str, Any]


def deliver(url: str, body: bytes, headers: Mapping[str, str], *, ca: Path,
            timeout: float = 30) -> Answer:
    """POSTs one delivery and returns the receiver's answer, whatever its status."""
    context = ssl.create_default_context(cafile=str(ca))
    request = urllib.request.Request(url, data=body, method="POST", headers=dict(headers))
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=context) as r:
            return Answer(r.status, dict(r.headers), json.loads(r.read() or b"{}"))
    except urllib.error.HTTPError as e:
        raw = e.read()
        return Answer(e.code, dict(e.headers), json.loads(raw) if raw else {})


def cloudevent(event_id: str = "ticket-1001", source: str = "/helpdesk/tickets",
               data: Any = None, **attributes: Any) -> Any:
    """A CloudEvent made with CloudEvents' own SDK."""
    from cloudevents.core.v1.event import CloudEvent

    return CloudEvent({"id": event_id, "source": source, "type": "com.example.ticket.opened",
                       "datacontenttype": "application/json", **attributes},
                      data if data is not None else {"ticket": 1001, "subject": "Refund"})


def binary(event: Any) -> tuple[bytes, dict[str, str]]:
    """The event in CloudEvents' binary HTTP mode (the SDK's own binding)."""
    from cloudevents.core.bindings import http

    message = http.to_binary_event(event)
    return message.body, dict(message.headers)


def structured(event: Any) -> tuple[bytes, dict[str, str]]:
    """The event in CloudEvents' structured HTTP mode (the SDK's own binding)."""
    from cloudevents.core.bindings import http

    message = http.to_structured_event(event)
    return message.body, dict(message.headers)


def signed(body: bytes, headers: Mapping[str, str], key: str = SIGNING_KEY
           ) -> dict[str, str]:
    return {**headers, SIGNATURE_HEADER: signature(body, key)}
