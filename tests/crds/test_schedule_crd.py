"""AgentRunSchedule on the real API server: what admission refuses (with what it says), the
defaults it stores, the columns kubectl prints, and that its runTemplate is an AgentRun spec
with the AgentRun spec's own rules (and may change, where a run's spec may not)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.crds.kube import Kubectl, apply, refused, schedule_manifest, stored, table

pytestmark = pytest.mark.cluster


def with_template(**spec: Any) -> dict[str, Any]:
    manifest = schedule_manifest()
    manifest["spec"]["runTemplate"]["spec"].update(spec)
    return manifest


def _labelled(labels: dict[str, str]) -> dict[str, Any]:
    manifest = schedule_manifest()
    manifest["spec"]["runTemplate"]["metadata"] = {"labels": labels}
    return manifest


def _without_agent() -> dict[str, Any]:
    manifest = schedule_manifest()
    del manifest["spec"]["runTemplate"]["spec"]["agent"]
    return manifest


REFUSED = [
    pytest.param(schedule_manifest("n" * 53), "AgentRunSchedule names must be at most 52 "
                 "characters: each slot's run is named <schedule>-<slot time as Unix seconds>",
                 id="name-longer-than-52"),
    pytest.param(schedule_manifest(concurrencyPolicy="Queue"),
                 'spec.concurrencyPolicy: Unsupported value: "Queue": supported values: '
                 '"Forbid", "Allow", "Replace"', id="policy-not-in-enum"),
    pytest.param(schedule_manifest(startingDeadlineSeconds=-1),
                 "spec.startingDeadlineSeconds: Invalid value: -1", id="negative-deadline"),
    pytest.param(schedule_manifest(successfulRunsHistoryLimit=-1),
                 "spec.successfulRunsHistoryLimit: Invalid value: -1", id="negative-history"),
    pytest.param(schedule_manifest(schedule=""), "spec.schedule: Invalid value: \"\"",
                 id="empty-schedule"),
    # The AgentRun spec's own rules, on the template.
    pytest.param(_without_agent(), "spec.runTemplate.spec.agent: Required value: spec.agent is "
                 "required: the name of the agent to run", id="template-without-agent"),
    pytest.param(with_template(agent="Support_Agent"), "spec.agent must be a non-empty name "
                 "of lower-case letters", id="template-agent-not-a-name"),
    pytest.param(with_template(env=[{"name": "AGENTRUN_RUN_NAME", "value": "x"}]),
                 "spec.env may not set AGENTRUN_RUN_NAME: the operator sets it on every runner",
                 id="template-env-the-operator-sets"),
    pytest.param(with_template(retry={"maxAttempts": 11}),
                 "spec.retry.maxAttempts must be between 1 and 10", id="template-retry"),
    # The template's own.
    pytest.param(with_template(replayOf="triage-42"), "spec.runTemplate.spec.replayOf is set "
                 "only by the operator, on a replay run", id="template-replay-of"),
    pytest.param(with_template(trigger="manual"), "spec.runTemplate.spec.trigger is schedule "
                 "for every run a schedule starts; leave it out", id="template-trigger"),
    pytest.param(_labelled({"agentrun.dev/schedule": "other"}),
                 "labels under agentrun.dev/ are the operator's", id="template-our-labels"),
]


@pytest.mark.parametrize(("manifest", "message"), REFUSED)
def test_admission_refuses_with_what_is_wrong(crds: Kubectl, namespace: str,
                                              manifest: dict[str, Any], message: str) -> None:
    assert message in refused(apply(crds, namespace, manifest))


def test_the_defaults_and_the_columns(crds: Kubectl, namespace: str) -> None:
    apply(crds, namespace, schedule_manifest(timeZone="Europe/Paris"), check=True)
    spec = stored(crds, namespace, "agentrunschedule/nightly")["spec"]
    assert (spec["concurrencyPolicy"], spec["suspend"], spec["successfulRunsHistoryLimit"],
            spec["failedRunsHistoryLimit"]) == ("Forbid", False, 3, 3)
    assert spec["timeZone"] == "Europe/Paris"
    # A template takes the AgentRun spec's defaults, except trigger (schedule, always).
    assert "trigger" not in spec["runTemplate"]["spec"]
    [row] = table(crds, "ars", "-n", namespace)
    assert list(row) == ["NAME", "SCHEDULE", "SUSPEND", "ACTIVE", "LAST-SCHEDULE", "NEXT",
                         "AGE"]
    assert (row["NAME"], row["SCHEDULE"], row["SUSPEND"]) == ("nightly", "0 2 * * *", "false")
    [wide] = table(crds, "agentrunschedules", "-n", namespace, "-o", "wide")
    assert (wide["POLICY"], wide["ZONE"]) == ("Forbid", "Europe/Paris")


def test_the_template_may_change(crds: Kubectl, namespace: str) -> None:
    apply(crds, namespace, schedule_manifest(), check=True)
    changed = copy.deepcopy(schedule_manifest(schedule="@every 10m"))
    changed["spec"]["runTemplate"]["spec"]["input"]["text"] = "Triage the weekend queue"
    apply(crds, namespace, changed, check=True)
    spec = stored(crds, namespace, "agentrunschedule/nightly")["spec"]
    assert spec["runTemplate"]["spec"]["input"]["text"] == "Triage the weekend queue"
    assert spec["schedule"] == "@every 10m"
