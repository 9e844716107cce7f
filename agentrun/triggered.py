"""A trigger's run: its name from the event's identity, its labels, owner and spec, made from
the AgentRunTrigger; and how the trigger's spec reads (its auth, its identity).

Shared by the receiver (which makes the runs) and the operator (which shows the trigger's
status and keeps its runs for its dedupe window). Standard library only.

An event's run is named `<trigger>-<first 10 hex of sha256(identity)>`: a redelivery of the
event, or a second receiver replica given it at the same time, finds the name taken (409)
and the run already there; the API server's name uniqueness is the deduplication.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agentrun.vocabulary import (
    ANNOTATION_CREATED_BY,
    ANNOTATION_EVENT_ID,
    ANNOTATION_TEMPLATE_BY,
    API_VERSION,
    EVENT_FILE,
    LABEL_TRIGGER,
    RUN_KIND,
    TRIGGER_KIND,
    Trigger,
    TriggerIdentity,
)

# The defaults the CRD writes (a trigger read before defaulting, or from a test, says the
# same).
DEFAULT_MAX_BODY_BYTES = 262144
DEFAULT_MAX_RUNS_PER_MINUTE = 60
DEFAULT_DEDUPE_WINDOW_SECONDS = 259200
DEFAULT_SIGNATURE_HEADER = "X-Signature-256"
# An event's identity is kept whole on its run (annotation agentrun.dev/event-id), so it is
# bounded: longer ones are refused as malformed.
MAX_IDENTITY_BYTES = 4096
# How many hex digits of the identity's digest name the run (40 bits: two events of one
# trigger share a name once in about a million million).
NAME_DIGEST_HEX = 10


def run_name(trigger: str, identity: str) -> str:
    """The run of `trigger`'s event whose identity is `identity`."""
    digest = hashlib.sha256(identity.encode()).hexdigest()[:NAME_DIGEST_HEX]
    return f"{trigger}-{digest}"


def event_configmap(run: str) -> str:
    """The ConfigMap holding the event of run `run` (its input file event.json)."""
    return f"{run}-event"


@dataclass(frozen=True)
class Auth:
    """How a delivery proves who sent it: `kind` hmac or bearer, with the Secret's key."""

    kind: str  # "hmac" | "bearer"
    secret: str
    key: str
    header: str = ""  # hmac: the header carrying "sha256=<hex>"


@dataclass(frozen=True)
class Identity:
    """What makes two deliveries one event (spec.identity): `form` is one of
    TriggerIdentity's words, `name` the header or the JSON pointer."""

    form: str
    name: str = ""

    def describe(self) -> str:
        if self.form == TriggerIdentity.CLOUDEVENTS:
            return "the CloudEvent's source and id"
        if self.form == TriggerIdentity.HEADER:
            return f"the header {self.name}"
        return f"the body's {self.name}"


class InvalidTrigger(ValueError):
    """A trigger whose spec cannot be read (one admission would have refused)."""


def auth_of(spec: Mapping[str, Any]) -> Auth:
    """spec.auth, read; raises InvalidTrigger unless it names exactly one way."""
    auth = spec.get("auth") or {}
    forms = [k for k in ("hmac", "bearer") if auth.get(k)]
    if len(forms) != 1:
        raise InvalidTrigger("spec.auth needs exactly one of hmac or bearer")
    kind = forms[0]
    ref = auth[kind].get("secretKeyRef") or {}
    if not ref.get("name") or not ref.get("key"):
        raise InvalidTrigger(f"spec.auth.{kind}.secretKeyRef needs a name and a key")
    header = str(auth[kind].get("header") or DEFAULT_SIGNATURE_HEADER) if kind == "hmac" \
        else ""
    return Auth(kind, str(ref["name"]), str(ref["key"]), header)


def identity_of(spec: Mapping[str, Any]) -> Identity:
    """spec.identity, read; raises InvalidTrigger for anything but its three forms."""
    given = spec.get("identity")
    if given == TriggerIdentity.CLOUDEVENTS:
        return Identity(TriggerIdentity.CLOUDEVENTS)
    if isinstance(given, Mapping) and len(given) == 1:
        ((form, name),) = given.items()
        if form == TriggerIdentity.HEADER and isinstance(name, str) and name:
            return Identity(form, name)
        if form == TriggerIdentity.JSON_POINTER and isinstance(name, str) and \
                name.startswith("/"):
            return Identity(form, name)
    raise InvalidTrigger(
        f"spec.identity {given!r} is not \"cloudevents\", {{header: NAME}} or "
        "{jsonPointer: /PATH}")


def triggered_run(trigger: Mapping[str, Any], name: str, identity: str) -> dict[str, Any]:
    """The AgentRun of `trigger`'s event: the template's metadata and spec, the label
    agentrun.dev/trigger, the annotation agentrun.dev/event-id, a controller ownerReference
    to the trigger (deleting it deletes its runs, whose records the store keeps), trigger
    `event`, the event as its input file event.json (from the ConfigMap <run>-event the
    receiver wrote first), and as its creator (agentrun.dev/created-by) the user who last
    wrote the template."""
    meta, spec = trigger["metadata"], trigger.get("spec") or {}
    template = spec.get("runTemplate") or {}
    template_meta = template.get("metadata") or {}
    run_spec = dict(template.get("spec") or {})
    given = dict(run_spec.get("input") or {})
    given["files"] = [*(given.get("files") or []), {
        "name": EVENT_FILE, "configMapKeyRef": {"name": event_configmap(name),
                                                "key": EVENT_FILE}}]
    run_spec["input"] = given
    run_spec["trigger"] = Trigger.EVENT
    # Who created the run is who last wrote the template (admission wrote it on the
    # trigger), never what the template says: the receiver creates the run with its own
    # identity, which admission lets set agentrun.dev/created-by.
    annotations = {k: v for k, v in (template_meta.get("annotations") or {}).items()
                   if k != ANNOTATION_CREATED_BY}
    author = (meta.get("annotations") or {}).get(ANNOTATION_TEMPLATE_BY)
    if author:
        annotations[ANNOTATION_CREATED_BY] = author
    annotations[ANNOTATION_EVENT_ID] = identity
    return {"apiVersion": API_VERSION, "kind": RUN_KIND, "metadata": {
        "name": name, "namespace": meta["namespace"],
        "labels": {**(template_meta.get("labels") or {}), LABEL_TRIGGER: meta["name"]},
        "annotations": annotations,
        "ownerReferences": [owner(trigger)],
    }, "spec": run_spec}


def owner(trigger: Mapping[str, Any]) -> dict[str, Any]:
    """The controller ownerReference of a trigger's runs."""
    meta = trigger["metadata"]
    return {"apiVersion": API_VERSION, "kind": TRIGGER_KIND, "name": meta["name"],
            "uid": meta["uid"], "controller": True}


def is_event_of(obj: Mapping[str, Any], trigger: str, identity: str) -> bool:
    """Whether `obj` (a run, or its event ConfigMap) was made for this trigger's event: its
    label names the trigger and its annotation the identity. A run someone else created
    under that name is not."""
    meta = obj.get("metadata") or {}
    return (meta.get("labels") or {}).get(LABEL_TRIGGER) == trigger and \
        (meta.get("annotations") or {}).get(ANNOTATION_EVENT_ID) == identity


def dedupe_window(spec: Mapping[str, Any]) -> int:
    """spec.dedupeWindowSeconds, with the CRD's default."""
    return int(spec.get("dedupeWindowSeconds", DEFAULT_DEDUPE_WINDOW_SECONDS))
