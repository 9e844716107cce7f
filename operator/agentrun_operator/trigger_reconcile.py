"""An AgentRunTrigger: gather the facts, call the pure decision (trigger.py), write the status.

One step of the same level-based reconciler and work queue as runs, replays and schedules
(key ("trigger", namespace, name)). Trigger events put the key on the queue (kopf's watch
keeps the cache); a worker reads the trigger from that cache and the keys of the Secret its
spec.auth names (Secrets are not watched: a trigger waiting for one is looked at again
every SECRET_RECHECK seconds), asks `trigger_decide`, and writes the trigger's whole status
if it changed (its resourceVersion as the precondition: the receiver adds to the same
status's counters, and whoever writes second reads again).

The operator makes no run of a trigger: the receiver does, as each event arrives.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from kubernetes.client.exceptions import ApiException

from agentrun.vocabulary import TRIGGER_PLURAL, Condition
from agentrun_operator import events
from agentrun_operator.controller import Context, now
from agentrun_operator.trigger import (
    secret_state_of,
    trigger_decide,
    trigger_facts,
    trigger_status,
)

log = logging.getLogger("agentrun.operator")


async def reconcile_trigger(ctx: Context, namespace: str, name: str) -> float | None:
    """Brings AgentRunTrigger `namespace/name`'s status in line with what it says now;
    returns when to look again (a Secret that is missing), if ever. Raises kube.Conflict
    when the write lost."""
    trigger = ctx.triggers.get((namespace, name))
    if trigger is None and ctx.pods is None:  # no caches (a step called directly)
        trigger = await ctx.kube.read_custom(TRIGGER_PLURAL, namespace, name)
    if trigger is None or (trigger.get("metadata") or {}).get("deletionTimestamp"):
        return None
    facts = trigger_facts(trigger, "", ctx.config.receiver_url)
    if not facts.problem:
        try:
            keys: set[str] | str | None = await ctx.kube.secret_keys(namespace, facts.secret)
        except ApiException as e:
            keys = f"{e.status} {e.reason}"
        facts = trigger_facts(trigger, secret_state_of(keys, facts.key),
                              ctx.config.receiver_url)
    decision = trigger_decide(facts)
    previous = trigger.get("status") or {}
    status = trigger_status(facts, decision, now(), previous)
    if status != previous:
        written = await ctx.kube.replace_status(TRIGGER_PLURAL, trigger, status)
        ctx.keep(ctx.triggers, written)
        _told(written, previous, status)
    return decision.recheck


def _told(trigger: Mapping[str, Any], previous: Mapping[str, Any],
          status: Mapping[str, Any]) -> None:
    """An Event and a log line when the Ready condition says something new."""
    ready = next(c for c in status["conditions"] if c["type"] == Condition.READY)
    was: Mapping[str, Any] = next((c for c in previous.get("conditions") or []
                                   if c.get("type") == Condition.READY), {})
    if (was.get("reason"), was.get("message")) == (ready["reason"], ready["message"]):
        return
    meta = trigger["metadata"]
    log.info("event=trigger-reconciled trigger=%s/%s ready=%s reason=%s url=%s",
             meta["namespace"], meta["name"], ready["status"], ready["reason"],
             status.get("url") or "-")
    events.post(trigger, ready["reason"], ready["message"], warning=ready["status"] != "True")
