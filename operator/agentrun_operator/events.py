"""Kubernetes Events on our objects (what `kubectl describe` shows), posted through kopf."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

import kopf

from agentrun.vocabulary import API_VERSION, REPLAY_KIND, RUN_KIND


def post(obj: Mapping[str, Any], reason: str, message: str, *, warning: bool = False) -> None:
    """Posts an Event on an AgentRun or AgentRunReplay (told apart by its spec)."""
    meta = obj["metadata"]
    kind = REPLAY_KIND if "runName" in (obj.get("spec") or {}) else RUN_KIND
    ref = kopf.Body({"apiVersion": API_VERSION, "kind": kind,
                     "metadata": {"name": meta["name"], "namespace": meta["namespace"],
                                  "uid": meta["uid"]}})
    # Outside a running operator (a test calling a step directly) kopf has no event queue;
    # the status says the same.
    with contextlib.suppress(LookupError):
        (kopf.warn if warning else kopf.info)(ref, reason=reason, message=message)
