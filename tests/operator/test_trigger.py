"""trigger_decide(): an AgentRunTrigger's verdict, row by row, then its status; and how long
a trigger's run is kept (its dedupe window, whatever its time to live).

Hold the table of operator/agentrun_operator/trigger.py (and api.md's "Triggers") next to
TABLE below: one row per rule, in the same order (first match wins). The status each
verdict writes is then read by cli-utils' own kstatus (tests/kstatus.py), as Flux reads it.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass, replace
from typing import Any

import pytest
from agentrun_operator.trigger import (
    MISSING,
    NO_KEY,
    PRESENT,
    SECRET_RECHECK,
    TriggerFacts,
    secret_state_of,
    trigger_decide,
    trigger_facts,
    trigger_status,
)
from agentrun_operator.ttl import at_least, dedupe_left

from agentrun.vocabulary import LABEL_TRIGGER, TriggerReason
from tests import kstatus
from tests.triggers import trigger_manifest

NOW = datetime.datetime(2026, 12, 5, 12, 0, 0, tzinfo=datetime.UTC)
URL = "https://receiver.example.com"
BASE = TriggerFacts(namespace="support", name="new-ticket", generation=2,
                    secret="ticket-hook", key="secret", receiver_url=URL,
                    agent="support-agent")


@dataclass(frozen=True)
class Row:
    name: str
    facts: TriggerFacts
    ready: bool
    stalled: bool
    reason: str
    says: str
    recheck: float | None = None


TABLE = [
    Row("spec cannot be read", replace(BASE, problem="spec.auth needs exactly one of hmac "
        "or bearer"), False, True, TriggerReason.INVALID,
        "spec.auth needs exactly one of hmac or bearer; every delivery is answered 503"),
    Row("its Secret is missing", replace(BASE, secret_state=MISSING), False, True,
        TriggerReason.SECRET_NOT_FOUND, "Secret ticket-hook does not exist, which spec.auth "
        "names: no delivery can be checked, and each is answered 503", SECRET_RECHECK),
    Row("its Secret has no such key", replace(BASE, secret_state=NO_KEY), False, True,
        TriggerReason.SECRET_NOT_FOUND, "Secret ticket-hook has no key secret", SECRET_RECHECK),
    Row("its Secret cannot be read", replace(BASE, secret_state="403 Forbidden"), False, True,
        TriggerReason.SECRET_NOT_FOUND,
        "the operator cannot read Secret ticket-hook (403 Forbidden)", SECRET_RECHECK),
    Row("a missing Secret beats suspend", replace(BASE, secret_state=MISSING, suspend=True),
        False, True, TriggerReason.SECRET_NOT_FOUND, "does not exist", SECRET_RECHECK),
    Row("suspended", replace(BASE, suspend=True), True, False, TriggerReason.SUSPENDED,
        f"Deliveries at {URL}/v1/triggers/support/new-ticket are answered 503"),
    Row("listening", BASE, True, False, TriggerReason.LISTENING,
        f"Each event delivered at {URL}/v1/triggers/support/new-ticket starts one "
        "run of support-agent, however often it is delivered."),
    Row("listening, the receiver's address unknown", replace(BASE, receiver_url=""), True,
        False, TriggerReason.LISTENING, "start it with --receiver-url"),
]


@pytest.mark.parametrize("row", TABLE, ids=[r.name for r in TABLE])
def test_the_table(row: Row) -> None:
    decision = trigger_decide(row.facts)
    assert (decision.ready, decision.stalled, decision.reason) == (
        row.ready, row.stalled, row.reason)
    assert row.says in decision.message
    assert decision.recheck == row.recheck
    assert decision.url == (f"{row.facts.receiver_url}/v1/triggers/support/new-ticket"
                            if row.facts.receiver_url else "")


@pytest.mark.parametrize("row", TABLE, ids=[r.name for r in TABLE])
def test_the_status_as_kstatus_reads_it(row: Row) -> None:
    previous = {"received": 12, "duplicates": 3, "lastEventTime": "2026-12-05T11:00:00Z",
                "url": "stale"}
    status = trigger_status(row.facts, trigger_decide(row.facts), NOW, previous)
    # The receiver's counters stay as they are; the rest is the operator's.
    assert (status["received"], status["duplicates"], status["lastEventTime"]) == (
        12, 3, "2026-12-05T11:00:00Z")
    assert status["observedGeneration"] == 2
    assert status.get("url") == (trigger_decide(row.facts).url or None)
    conditions = {c["type"]: c["status"] for c in status["conditions"]}
    assert conditions == {"Ready": "True" if row.ready else "False", "Reconciling": "False",
                          **({"Stalled": "True"} if row.stalled else {})}
    obj = {"apiVersion": "agentrun.dev/v1alpha1", "kind": "AgentRunTrigger",
           "metadata": {"name": "new-ticket", "namespace": "support", "generation": 2},
           "status": status}
    verdict = kstatus.compute(obj)
    assert verdict.status == (kstatus.FAILED if row.stalled else kstatus.CURRENT)
    # A spec the operator has not looked at yet is in progress.
    obj["metadata"]["generation"] = 3
    assert kstatus.compute(obj).status == kstatus.IN_PROGRESS


def test_the_facts_of_a_trigger() -> None:
    obj = trigger_manifest(suspend=True)
    obj["metadata"].update(namespace="support", generation=4)
    facts = trigger_facts(obj, PRESENT, URL)
    assert (facts.secret, facts.key, facts.suspend, facts.generation, facts.agent,
            facts.problem) == ("ticket-hook", "secret", True, 4, "support-agent", "")
    bad = trigger_manifest(identity={"jsonPointer": "no-slash"})
    bad["metadata"]["namespace"] = "support"
    assert "is not \"cloudevents\"" in trigger_facts(bad, PRESENT, URL).problem
    assert (secret_state_of(None, "k"), secret_state_of({"a"}, "k"),
            secret_state_of({"k"}, "k"), secret_state_of("403 Forbidden", "k")) == (
        MISSING, NO_KEY, PRESENT, "403 Forbidden")


# -- a trigger's runs are kept at least its dedupe window ---------------------------------------

TRIGGER: dict[str, Any] = {"metadata": {"name": "new-ticket", "namespace": "support",
                                        "uid": "u-1"},
                           "spec": {"dedupeWindowSeconds": 3600}}
HOUR = 3600.0


def _run(created: datetime.datetime, *, label: str | None = "new-ticket",
         owner_uid: str = "u-1", owner_kind: str = "AgentRunTrigger") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "new-ticket-0123456789", "namespace": "support",
                            "creationTimestamp": created.strftime("%Y-%m-%dT%H:%M:%SZ"),
                            "ownerReferences": [{"kind": owner_kind, "name": "new-ticket",
                                                 "uid": owner_uid, "controller": True}]}
    if label:
        meta["labels"] = {LABEL_TRIGGER: label}
    return {"metadata": meta}


@pytest.mark.parametrize(("run", "triggers", "left"), [
    (_run(NOW), {("support", "new-ticket"): TRIGGER}, HOUR),  # its window, from its creation
    (_run(NOW - datetime.timedelta(hours=2)), {("support", "new-ticket"): TRIGGER}, -HOUR),
    (_run(NOW, label=None), {("support", "new-ticket"): TRIGGER}, None),  # no trigger's
    (_run(NOW, owner_kind="AgentRunSchedule"), {("support", "new-ticket"): TRIGGER}, None),
    (_run(NOW, owner_uid="u-2"), {("support", "new-ticket"): TRIGGER}, None),  # another's
    (_run(NOW), {}, 259200.0),  # its trigger not seen yet: the CRD's default window
], ids=["in-window", "window-past", "not-labelled", "a-schedule-owns-it",
        "an-earlier-trigger-of-that-name", "trigger-not-cached-yet"])
def test_a_trigger_run_is_kept_its_dedupe_window(
        run: dict[str, Any], triggers: dict[tuple[str, str], Any], left: float | None) -> None:
    assert dedupe_left(run, triggers, NOW) == left


@pytest.mark.parametrize(("ttl_left", "floor", "kept"), [
    (None, HOUR, None),      # no time to live: kept anyway
    (10.0, HOUR, HOUR),      # a short TTL waits for the window
    (2 * HOUR, HOUR, 2 * HOUR),  # a long TTL is not shortened
    (10.0, None, 10.0),      # no trigger: the TTL alone
    (0.0, -HOUR, 0.0),       # both past: due now
])
def test_the_window_is_a_floor_under_the_ttl(ttl_left: float | None, floor: float | None,
                                             kept: float | None) -> None:
    assert at_least(ttl_left, floor) == kept
