"""What does an AgentRunTrigger say now? One pure decision, and the status that shows it.

The receiver (receiver-image/agentrun_receiver) makes a trigger's runs; the operator keeps
what the trigger says about itself: where to send (status.url, from the receiver's address
it was given), whether deliveries can start runs (the conditions), and which generation it
looked at. `trigger_decide(facts)` takes what the reconcile gathered (the trigger's spec, its
Secret, the receiver's address) and returns the conditions' verdict; no I/O happens here.
tests/operator/test_trigger.py holds the table, one row per rule below.

Rules, first match wins:

| the trigger | Ready | Stalled | reason |
| --- | --- | --- | --- |
| spec.auth or spec.identity cannot be read | False | True | `InvalidTrigger` |
| its auth Secret (or its key) is missing or cannot be read | False | True | `SecretNotFound` |
| suspended | True | - | `Suspended`: deliveries are answered 503 |
| otherwise | True | - | `Listening` |

A trigger waiting for its Secret is looked at again every 30 s (Secrets are not watched).
Reconciling is False once the operator has looked (a trigger converges on nothing between
two events), and `observedGeneration` says which spec it looked at. status.received,
duplicates and lastEventTime are the receiver's (it adds to them as deliveries arrive): the
operator keeps them as they are.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agentrun import triggered
from agentrun.vocabulary import RECEIVER_PATH, TriggerReason
from agentrun_operator import status as st

# A trigger whose Secret is missing is looked at again this often.
SECRET_RECHECK = 30.0
# What the receiver writes in the status, which the operator keeps.
RECEIVER_FIELDS = ("received", "duplicates", "lastEventTime")

PRESENT = "present"
MISSING = "missing"
NO_KEY = "no-key"


@dataclass(frozen=True)
class TriggerFacts:
    """The facts of an AgentRunTrigger the decision reads."""

    namespace: str
    name: str
    generation: int
    suspend: bool = False
    problem: str = ""  # why spec.auth or spec.identity cannot be read ("" when they can)
    secret: str = ""
    key: str = ""
    # PRESENT, MISSING, NO_KEY, or why the operator could not read it ("403 Forbidden").
    secret_state: str = PRESENT
    receiver_url: str = ""  # where the receiver is served ("" when the operator was not told)
    agent: str = ""


@dataclass(frozen=True)
class TriggerDecision:
    ready: bool
    stalled: bool
    reason: str
    message: str
    url: str = ""
    recheck: float | None = None


def url_of(receiver_url: str, namespace: str, name: str) -> str:
    """Where senders deliver to trigger `namespace/name`."""
    return f"{receiver_url.rstrip('/')}{RECEIVER_PATH}/{namespace}/{name}" if receiver_url \
        else ""


def trigger_decide(facts: TriggerFacts) -> TriggerDecision:
    """The trigger's verdict (the module's table, first match wins)."""
    url = url_of(facts.receiver_url, facts.namespace, facts.name)
    if facts.problem:
        return TriggerDecision(False, True, TriggerReason.INVALID, (
            f"{facts.problem}; every delivery is answered 503 until the trigger is fixed."),
            url)
    if facts.secret_state != PRESENT:
        missing = {MISSING: f"Secret {facts.secret} does not exist",
                   NO_KEY: f"Secret {facts.secret} has no key {facts.key}"}.get(
            facts.secret_state,
            f"the operator cannot read Secret {facts.secret} ({facts.secret_state})")
        return TriggerDecision(False, True, TriggerReason.SECRET_NOT_FOUND, (
            f"{missing}, which spec.auth names: no delivery can be checked, and each is "
            "answered 503 (its sender delivers it again) until the Secret is there."), url,
            SECRET_RECHECK)
    where = f"at {url}" if url else (
        "at the receiver (its address is not known to the operator: start it with "
        "--receiver-url to have status.url say it)")
    if facts.suspend:
        return TriggerDecision(True, False, TriggerReason.SUSPENDED, (
            f"Deliveries {where} are answered 503 and start no run until spec.suspend is "
            "false."), url)
    return TriggerDecision(True, False, TriggerReason.LISTENING, (
        f"Each event delivered {where} starts one run of {facts.agent or 'its agent'}, "
        "however often it is delivered."), url)


def trigger_status(facts: TriggerFacts, decision: TriggerDecision, now: datetime.datetime,
                   previous: Mapping[str, Any]) -> dict[str, Any]:
    """The trigger's whole status: the receiver's counters as they are, the url, the
    observed generation and the GitOps conditions."""
    status: dict[str, Any] = {k: previous[k] for k in RECEIVER_FIELDS if k in previous}
    if decision.url:
        status["url"] = decision.url
    status["observedGeneration"] = facts.generation
    status["conditions"] = st.schedule_conditions(
        decision.stalled, decision.reason, decision.message, now,
        list(previous.get("conditions") or []))
    return status


def trigger_facts(obj: Mapping[str, Any], secret_state: str, receiver_url: str
                  ) -> TriggerFacts:
    """An AgentRunTrigger object, with what was found of its Secret, as the decision reads
    it."""
    meta, spec = obj["metadata"], obj.get("spec") or {}
    problem, secret, key = "", "", ""
    try:
        auth = triggered.auth_of(spec)
        triggered.identity_of(spec)
        secret, key = auth.secret, auth.key
    except triggered.InvalidTrigger as e:
        problem = str(e)
    template = (spec.get("runTemplate") or {}).get("spec") or {}
    return TriggerFacts(
        namespace=meta["namespace"], name=meta["name"],
        generation=int(meta.get("generation") or 1), suspend=bool(spec.get("suspend")),
        problem=problem, secret=secret, key=key, secret_state=secret_state,
        receiver_url=receiver_url, agent=str(template.get("agent") or ""))


def secret_state_of(keys: set[str] | str | None, key: str) -> str:
    """What the Secret's keys (None: no Secret; a string: why it could not be read) say
    about `key`."""
    if isinstance(keys, str):
        return keys
    if keys is None:
        return MISSING
    return PRESENT if key in keys else NO_KEY
