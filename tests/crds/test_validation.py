"""Invalid AgentRuns and AgentRunReplays are refused by the API server, with a message that
says what is wrong. One row per rule in crds/ (see docs/api.md, "Validation"); each row is
the manifest a user might send and a fragment of what kubectl then prints.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from tests.crds.kube import Kubectl, apply, get, refused, replay_manifest, run_manifest

pytestmark = pytest.mark.cluster


def _file(name: str, **source: Any) -> dict[str, Any]:
    return {"name": name, **source}


CM = {"configMapKeyRef": {"name": "invoices", "key": "42.pdf"}}
SECRET = {"secretKeyRef": {"name": "contracts", "key": "42.pdf"}}


def _without(manifest: dict[str, Any], key: str) -> dict[str, Any]:
    del manifest["spec"][key]
    return manifest


@dataclass(frozen=True)
class Case:
    id: str
    manifest: dict[str, Any]
    message: str
    # When set, this valid object is created first and `manifest` is the change to it.
    before: dict[str, Any] | None = None


CASES = [
    # -- AgentRun: agent
    Case(
        "missing agent",
        _without(run_manifest("r"), "agent"),
        "spec.agent: Required value: spec.agent is required: the name of the agent to run",
    ),
    Case(
        "empty agent",
        run_manifest("r", agent=""),
        "spec.agent must be a non-empty name of lower-case letters, digits and '-'",
    ),
    Case(
        "agent not a DNS label",
        run_manifest("r", agent="Support_Agent"),
        'spec.agent: Invalid value: "Support_Agent": spec.agent must be a non-empty name',
    ),
    Case(
        "agent too long",
        run_manifest("r", agent="a" * 64),
        "spec.agent: Too long: may not be more than 63",
    ),
    # -- AgentRun: input
    Case(
        "missing input",
        _without(run_manifest("r"), "input"),
        "spec.input: Required value: spec.input is required, with text, files, or both",
    ),
    Case(
        "no text and no files",
        run_manifest("r", input={}),
        "spec.input needs text, files, or both; it has neither",
    ),
    Case(
        "empty text and empty files",
        run_manifest("r", input={"text": "", "files": []}),
        "spec.input needs text, files, or both; it has neither",
    ),
    Case(
        "oversize text",
        run_manifest("r", input={"text": "x" * 65537}),
        "spec.input.text: Too long: may not be more than 65536",
    ),
    Case(
        "too many files",
        run_manifest("r", input={"files": [_file(f"f{i}", **CM) for i in range(17)]}),
        "spec.input.files: Too many: 17: must have at most 16 items",
    ),
    Case(
        "file with configMapKeyRef and secretKeyRef",
        run_manifest("r", input={"files": [_file("invoice.pdf", **CM, **SECRET)]}),
        "spec.input.files[0]: Invalid value: each file in spec.input.files needs exactly one"
        " source: either configMapKeyRef or secretKeyRef",
    ),
    Case(
        "file with neither source",
        run_manifest("r", input={"files": [_file("invoice.pdf")]}),
        "needs exactly one source: either configMapKeyRef or secretKeyRef",
    ),
    Case(
        "duplicate file names",
        run_manifest("r", input={"files": [_file("a.pdf", **CM), _file("a.pdf", **SECRET)]}),
        "spec.input.files: Invalid value: spec.input.files must have unique names",
    ),
    Case(
        "file name with '/'",
        run_manifest("r", input={"files": [_file("../etc/passwd", **CM)]}),
        'spec.input.files[0].name: Invalid value: "../etc/passwd": a file name in'
        " spec.input.files must be a plain name: no '/', and not '.' or '..'",
    ),
    Case(
        "file name '..'",
        run_manifest("r", input={"files": [_file("..", **CM)]}),
        "must be a plain name: no '/', and not '.' or '..'",
    ),
    Case(
        "configMapKeyRef without key",
        run_manifest("r", input={"files": [_file("a", configMapKeyRef={"name": "x"})]}),
        "spec.input.files[0].configMapKeyRef.key: Required value",
    ),
    # -- AgentRun: trigger, user, retry, deadline
    Case(
        "unknown trigger",
        run_manifest("r", trigger="cron"),
        'spec.trigger: Unsupported value: "cron": supported values: "manual", "schedule",'
        ' "chat", "workflow", "webhook", "event"',
    ),
    Case(
        "empty userId",
        run_manifest("r", userId=""),
        'spec.userId: Invalid value: "": spec.userId in body should be at least 1 chars long',
    ),
    Case(
        "maxAttempts 0",
        run_manifest("r", retry={"maxAttempts": 0}),
        "spec.retry.maxAttempts: Invalid value: 0: spec.retry.maxAttempts must be between 1 and 10",
    ),
    Case(
        "maxAttempts 11",
        run_manifest("r", retry={"maxAttempts": 11}),
        "spec.retry.maxAttempts: Invalid value: 11: spec.retry.maxAttempts must be between"
        " 1 and 10",
    ),
    Case(
        "activeDeadlineSeconds 0",
        run_manifest("r", activeDeadlineSeconds=0),
        "spec.activeDeadlineSeconds: Invalid value: 0: spec.activeDeadlineSeconds must be a"
        " positive number of seconds",
    ),
    Case(
        "negative activeDeadlineSeconds",
        run_manifest("r", activeDeadlineSeconds=-5),
        "spec.activeDeadlineSeconds must be a positive number of seconds",
    ),
    # -- AgentRun: env
    Case(
        "env with value and valueFrom",
        run_manifest(
            "r",
            env=[
                {
                    "name": "A",
                    "value": "x",
                    "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}},
                }
            ],
        ),
        "spec.env[0]: Invalid value: an entry in spec.env has either value or valueFrom, not both",
    ),
    Case(
        "env valueFrom with two sources",
        run_manifest(
            "r",
            env=[
                {
                    "name": "A",
                    "valueFrom": {
                        "secretKeyRef": {"name": "s", "key": "k"},
                        "configMapKeyRef": {"name": "c", "key": "k"},
                    },
                }
            ],
        ),
        "valueFrom in spec.env needs exactly one of secretKeyRef, configMapKeyRef or fieldRef",
    ),
    Case(
        "env name the operator sets",
        run_manifest("r", env=[{"name": "AGENTRUN_RUN_NAME", "value": "someone-else"}]),
        "spec.env may not set AGENTRUN_RUN_NAME: the operator sets it on every runner",
    ),
    Case(
        "env pointing the runner at another store",
        run_manifest("r", env=[{"name": "DATABASE_URL", "value": "sqlite:///tmp/x.db"}]),
        "spec.env may not set DATABASE_URL",
    ),
    Case(
        "env fieldRef outside the downward API",
        run_manifest("r", env=[{"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "spec.x"}}}]),
        "fieldRef.fieldPath must be a field the downward API exposes",
    ),
    Case(
        "too many env entries",
        run_manifest("r", env=[{"name": f"E{i}", "value": "v"} for i in range(65)]),
        "spec.env: Too many: 65: must have at most 64 items",
    ),
    Case(
        "env name with '='",
        run_manifest("r", env=[{"name": "A=B", "value": "x"}]),
        "spec.env names must not contain '='",
    ),
    Case(
        "serviceAccountName not a name",
        run_manifest("r", serviceAccountName="Runner Account"),
        "spec.serviceAccountName must be a valid ServiceAccount name",
    ),
    # -- AgentRun: resources
    Case(
        "request above limit",
        run_manifest("r", resources={"requests": {"memory": "2Gi"}, "limits": {"memory": "1Gi"}}),
        "spec.resources.requests must not exceed spec.resources.limits",
    ),
    Case(
        "not a quantity",
        run_manifest("r", resources={"limits": {"memory": "lots"}}),
        "spec.resources.limits values must be quantities such as 500m, 1, 256Mi or 2Gi",
    ),
    # -- AgentRun: the object as a whole
    Case(
        "unknown spec field (typo)",
        run_manifest("r", agnet="support-agent"),
        ".spec.agnet: field not declared in schema",
    ),
    Case(
        "name longer than a label value",
        run_manifest("r" * 64),
        "AgentRun names must be at most 63 characters: the name is used as a label value",
    ),
    Case(
        "spec change after creation",
        run_manifest("r", userId="bob"),
        "spec is immutable: an AgentRun records what was asked; create a new AgentRun",
        before=run_manifest("r", userId="alice"),
    ),
    Case(
        "user-set replayOf (even a cluster admin)",
        run_manifest("r", replayOf="triage-42"),
        "spec.replayOf is set only by the agentrun operator (admin is not it); to run"
        " triage-42 again, create an AgentRunReplay with spec.runName: triage-42",
    ),
    # -- AgentRunReplay
    Case(
        "replay without runName",
        replay_manifest("rr", None, note="please"),
        "spec.runName: Required value: spec.runName is required: the name of the AgentRun"
        " to replay",
    ),
    Case(
        "replay runName not a name",
        replay_manifest("rr", "Triage 42"),
        "spec.runName must be the name of an AgentRun in this namespace",
    ),
    Case(
        "replay runName change",
        replay_manifest("rr", "triage-43"),
        'spec.runName: Invalid value: "triage-43": spec.runName is immutable: create a new'
        " AgentRunReplay to replay another run",
        before=replay_manifest("rr", "triage-42"),
    ),
    Case(
        "oversize replay note",
        replay_manifest("rr", note="n" * 4097),
        "spec.note: Too long: may not be more than 4096",
    ),
    Case(
        "replay resume change",
        replay_manifest("rr", resume=True),
        "spec.resume is immutable; create a new AgentRunReplay instead",
        before=replay_manifest("rr", resume=False),
    ),
    # -- AgentRun: tools (effect overrides)
    Case(
        "tool effect not a class",
        run_manifest("r", tools=[{"name": "send_email", "effect": "Harmless"}]),
        'spec.tools[0].effect: Unsupported value: "Harmless": supported values: '
        '"ReadOnly", "Idempotent", "Effectful"',
    ),
    Case(
        "tool named twice",
        run_manifest("r", tools=[{"name": "send_email", "effect": "Idempotent"},
                                 {"name": "send_email", "effect": "Effectful"}]),
        '.spec.tools: duplicate entries for key [name="send_email"]',
    ),
    Case(
        "tool without effect or approval",
        run_manifest("r", tools=[{"name": "send_email"}]),
        "each entry of spec.tools says an effect, an approval, or both",
    ),
    Case(
        "too many tools",
        run_manifest("r", tools=[{"name": f"t{i}", "effect": "ReadOnly"} for i in range(65)]),
        "spec.tools: Too many: 65: must have at most 64 items",
    ),
    Case(
        "retry resume not a boolean",
        run_manifest("r", retry={"maxAttempts": 2, "resume": "yes"}),
        ".spec.retry.resume: expected boolean, got &{yes}",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_invalid_manifest_is_refused_with_its_message(
    policies: Kubectl, namespace: str, case: Case
) -> None:
    crds = policies
    kind = case.manifest["kind"].lower()
    name = case.manifest["metadata"]["name"]
    if case.before is not None:
        apply(crds, namespace, case.before, check=True)
    stored_before = get(crds, namespace, f"{kind}/{name}")

    message = refused(apply(crds, namespace, case.manifest))

    assert case.message in message
    # Refused means nothing changed: not created, or still as it was.
    assert get(crds, namespace, f"{kind}/{name}") == stored_before
