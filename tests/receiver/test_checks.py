"""The receiver's checks (receiver-image/agentrun_receiver/checks.py), pure: what each
refuses with what status and sentence, and what an event's identity and file are. Events
are made and sent with CloudEvents' own SDK (tests/triggers.py)."""

from __future__ import annotations

import datetime
import json
from typing import Any

import pytest
from agentrun_receiver.checks import Event, Refusal, read_event, too_large, unauthorized
from agentrun_receiver.ratelimit import Window

from agentrun.triggered import Auth, Identity, run_name
from agentrun.vocabulary import TriggerIdentity, TriggerResult
from tests.triggers import SIGNING_KEY, binary, cloudevent, signature, structured

HMAC = Auth("hmac", "ticket-hook", "secret", "X-Signature-256")
BEARER = Auth("bearer", "ticket-hook", "token")
CLOUDEVENTS = Identity(TriggerIdentity.CLOUDEVENTS)
BODY = b'{"action": "opened", "ticket": {"id": 1001}}'


@pytest.mark.parametrize(("auth", "headers", "said"), [
    (HMAC, {"X-Signature-256": signature(BODY)}, None),
    (HMAC, {"x-signature-256": signature(BODY).upper().replace("SHA256=", "sha256=")}, None),
    (HMAC, {}, "The delivery has no X-Signature-256 header; sign the raw body"),
    (HMAC, {"X-Signature-256": signature(BODY, "another-key")},
     "The X-Signature-256 signature does not match the body"),
    (HMAC, {"X-Signature-256": signature(BODY + b" ")}, "does not match the body"),
    (HMAC, {"X-Signature-256": signature(BODY)[7:]}, "does not match the body"),  # no sha256=
    (BEARER, {"Authorization": f"Bearer {SIGNING_KEY}"}, None),
    (BEARER, {"Authorization": f"bearer {SIGNING_KEY}"}, None),
    (BEARER, {}, "The delivery has no bearer token"),
    (BEARER, {"Authorization": f"Basic {SIGNING_KEY}"}, "The delivery has no bearer token"),
    (BEARER, {"Authorization": "Bearer guess"}, "The bearer token is not this trigger's token."),
], ids=["hmac", "hmac-any-case", "hmac-missing", "hmac-wrong-key", "hmac-other-body",
        "hmac-bare-hex", "bearer", "bearer-lower-case", "bearer-missing", "basic",
        "bearer-wrong"])
def test_a_delivery_proves_its_sender(auth: Auth, headers: dict[str, str],
                                      said: str | None) -> None:
    refusal = unauthorized(auth, SIGNING_KEY.encode(), headers, BODY)
    if said is None:
        assert refusal is None
    else:
        assert refusal is not None and (refusal.status, refusal.result) == (
            401, TriggerResult.UNAUTHORIZED)
        assert said in refusal.message


def test_a_body_over_the_limit_is_refused_by_its_length() -> None:
    assert too_large(None, 10) is None and too_large(10, 10) is None
    refusal = too_large(11, 10)
    assert refusal is not None and (refusal.status, refusal.result, refusal.message) == (
        413, TriggerResult.TOO_LARGE,
        "The body is 11 bytes, over this trigger's maxBodyBytes (10); no run was started.")
    read = too_large(11, 10, read=True)
    assert read is not None and "more than 10 bytes" in read.message


def _event(result: Event | Refusal) -> Event:
    assert isinstance(result, Event), result
    return result


def _refusal(result: Event | Refusal) -> Refusal:
    assert isinstance(result, Refusal), result
    assert (result.status, result.result) == (400, TriggerResult.MALFORMED)
    assert result.message.endswith("No run was started.")
    return result


def test_one_cloudevent_in_either_mode_is_one_event() -> None:
    event = cloudevent(time=datetime.datetime(2026, 12, 5, 12, tzinfo=datetime.UTC))
    from_binary = _event(read_event(CLOUDEVENTS, *reversed(binary(event))))
    from_structured = _event(read_event(CLOUDEVENTS, *reversed(structured(event))))
    assert from_binary.identity == from_structured.identity == "/helpdesk/tickets\nticket-1001"
    # event.json is the whole event in the structured format, whatever mode it came in.
    assert json.loads(from_binary.file) == json.loads(from_structured.file) == {
        "id": "ticket-1001", "source": "/helpdesk/tickets",
        "type": "com.example.ticket.opened", "specversion": "1.0",
        "datacontenttype": "application/json", "time": "2026-12-05T12:00:00Z",
        "data": {"ticket": 1001, "subject": "Refund"}}


def test_an_event_without_a_time_gets_none_in_its_file() -> None:
    body, headers = structured(cloudevent())
    sent = json.loads(body)
    del sent["time"]
    event = _event(read_event(CLOUDEVENTS, headers, json.dumps(sent).encode()))
    assert "time" not in json.loads(event.file)


def _without(headers: dict[str, str], name: str) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() != name}


def _structured_without(attribute: str) -> tuple[dict[str, str], bytes]:
    body, headers = structured(cloudevent())
    sent = json.loads(body)
    del sent[attribute]
    return headers, json.dumps(sent).encode()


@pytest.mark.parametrize(("headers", "body", "said"), [
    # The SDK would fill a missing id with a random one: every redelivery a new run.
    (_without(binary(cloudevent())[1], "ce-id"), binary(cloudevent())[0],
     "The CloudEvent has no ce-id: a CloudEvent's source and id identify it"),
    (_without(binary(cloudevent())[1], "ce-source"), binary(cloudevent())[0],
     "The CloudEvent has no ce-source"),
    (*_structured_without("id"), "The CloudEvent has no id: a CloudEvent's source and id"),
    (*_structured_without("source"), "The CloudEvent has no source"),
    (*_structured_without("type"), "The CloudEvent is not valid: "),
    ({"Content-Type": "application/cloudevents+json"}, b"{not json",
     "The structured CloudEvent is not JSON"),
    ({"Content-Type": "application/cloudevents+json"}, b"[1]",
     "The structured CloudEvent is not a JSON object."),
    ({"Content-Type": "application/json"}, BODY, "The delivery is not a CloudEvent: send it "
     "in binary mode (ce-id, ce-source, ce-type and ce-specversion headers) or structured"),
    ({"Content-Type": "application/cloudevents-batch+json"}, b"[]",
     "Batched CloudEvents are not accepted"),
    ({**binary(cloudevent())[1], "ce-specversion": "0.9"}, binary(cloudevent())[0],
     "The CloudEvent is not valid: "),
], ids=["binary-no-id", "binary-no-source", "structured-no-id", "structured-no-source",
        "no-type", "not-json", "not-an-object", "plain-json", "batch", "unknown-specversion"])
def test_a_malformed_cloudevent_is_refused_saying_why(headers: dict[str, str], body: bytes,
                                                       said: str) -> None:
    assert said in _refusal(read_event(CLOUDEVENTS, headers, body)).message


@pytest.mark.parametrize(("identity", "headers", "body", "expected"), [
    (Identity(TriggerIdentity.HEADER, "X-GitHub-Delivery"),
     {"x-github-delivery": "72d3162e-cc78-11e3"}, BODY, "72d3162e-cc78-11e3"),
    (Identity(TriggerIdentity.JSON_POINTER, "/ticket/id"), {}, BODY, "1001"),
    (Identity(TriggerIdentity.JSON_POINTER, "/action"), {}, BODY, "opened"),
    # Anything but a string as canonical JSON: the same value however it was written.
    (Identity(TriggerIdentity.JSON_POINTER, "/ticket"), {},
     b'{"ticket": {"z": 1, "a": [1, "\\u00e9"]}}', '{"a":[1,"\u00e9"],"z":1}'),
    (Identity(TriggerIdentity.JSON_POINTER, "/m~1id"), {}, b'{"m/id": "x"}', "x"),
], ids=["header", "pointer-number", "pointer-string", "pointer-object", "pointer-escaped"])
def test_a_plain_webhook_is_identified_and_kept_as_received(
        identity: Identity, headers: dict[str, str], body: bytes, expected: str) -> None:
    event = _event(read_event(identity, headers, body))
    assert (event.identity, event.file) == (expected, body)


@pytest.mark.parametrize(("identity", "headers", "body", "said"), [
    (Identity(TriggerIdentity.HEADER, "X-GitHub-Delivery"), {}, BODY,
     "The delivery has no X-GitHub-Delivery header, which identifies its event"),
    (Identity(TriggerIdentity.JSON_POINTER, "/ticket/id"), {}, b"not json",
     "The body is not JSON"),
    (Identity(TriggerIdentity.JSON_POINTER, "/message/id"), {}, BODY,
     "The body has nothing at /message/id"),
    (Identity(TriggerIdentity.JSON_POINTER, "/m"), {}, b'{"m": ""}', "is empty"),
    (Identity(TriggerIdentity.HEADER, "X-Id"), {"X-Id": "x" * 4097}, BODY,
     "The event's identity is 4097 bytes, over 4096."),
], ids=["no-header", "not-json", "nothing-there", "empty", "too-long"])
def test_a_plain_webhook_without_its_identity_is_refused(
        identity: Identity, headers: dict[str, str], body: bytes, said: str) -> None:
    assert said in _refusal(read_event(identity, headers, body)).message


def test_the_run_is_named_after_the_identity() -> None:
    name = run_name("new-ticket", "/helpdesk/tickets\nticket-1001")
    assert name.startswith("new-ticket-") and len(name) == len("new-ticket-") + 10
    assert name == run_name("new-ticket", "/helpdesk/tickets\nticket-1001")
    assert name != run_name("new-ticket", "/helpdesk/tickets\nticket-1002")
    assert len(run_name("n" * 52, "x")) == 63  # a label value's limit


def test_the_rate_window() -> None:
    window: Any = Window()
    assert [window.take("t", 2, 0.0), window.take("t", 2, 1.0)] == [None, None]
    assert window.take("t", 2, 30.0) == 30  # the first place frees at 60 s
    assert window.take("other", 2, 30.0) is None  # each trigger its own
    window.give_back("t", 1.0)  # that event started no run after all
    assert window.take("t", 2, 30.5) is None
    assert window.take("t", 2, 60.0) is None  # the place of 0.0 is free again
