"""Approvals for end-to-end tests: a run whose charge_card call needs one (the scripted
model's script and the run's spec.tools), waiting for it, and the AgentRunApproval an
approver creates with their own credential."""

from __future__ import annotations

import json
from typing import Any

from agentrun.vocabulary import GROUP, VERSION, Phase
from tests.harness import System

CHARGE = {"customer": "42", "amount": 120}
SCRIPT = [{"call": "read_message", "args": {}}, {"call": "charge_card", "args": CHARGE},
          {"text": "Charged customer 42."}]
REQUIRED = [{"name": "charge_card", "effect": "Effectful", "approval": "Required"}]


def waiting(system: System, namespace: str, name: str) -> dict[str, Any]:
    return system.wait_run(namespace, name, lambda r: (r.get("status") or {}).get(
        "phase") == Phase.WAITING)


def approval(namespace: str, name: str, run: str, pending: dict[str, Any], approver: str,
             decision: str = "Approve", note: str | None = None,
             digest: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"runName": run, "seq": pending["seq"],
                            "argsDigest": digest or pending["argsDigest"],
                            "decision": decision, "approver": approver}
    if note:
        spec["note"] = note
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "AgentRunApproval",
            "metadata": {"name": name, "namespace": namespace}, "spec": spec}


def create_as(system: System, user: str, manifest: dict[str, Any]) -> Any:
    return system.kubectl("create", "-f", "-", input=json.dumps(manifest), as_user=user,
                          check=False)
