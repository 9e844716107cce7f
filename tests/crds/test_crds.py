"""The CRDs install, are served under the names api.md fixes, print the columns a user reads
with `kubectl get`, default what api.md says they default, and keep every status field the
operator writes (nothing pruned; `toolsExecuted` keeps its three states apart).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from agentrun.vocabulary import GROUP, REPLAY_PLURAL, RUN_PLURAL, VERSION
from tests.crds.kube import Kubectl, apply, replay_manifest, run_manifest, stored, table

pytestmark = pytest.mark.cluster


def _header(plane: Kubectl, *args: str) -> list[str]:
    out = plane.kubectl("get", *args).stdout
    return out.splitlines()[0].split()


def _set_status(plane: Kubectl, namespace: str, resource: str, status: dict[str, Any]) -> None:
    """Writes the status the way a controller does: a full update of the status subresource
    (a merge patch could not write `null`, it would delete the key)."""
    current = json.loads(plane.kubectl("get", resource, "-n", namespace, "-o", "json").stdout)
    current["status"] = status
    plane.kubectl(
        "replace", "--subresource=status", "-n", namespace, "-f", "-", input=json.dumps(current)
    )


@pytest.mark.parametrize("plural", [RUN_PLURAL, REPLAY_PLURAL])
def test_crd_is_established_with_the_contract_names(crds: Kubectl, plural: str) -> None:
    crd = json.loads(crds.kubectl("get", "crd", f"{plural}.{GROUP}", "-o", "json").stdout)
    conditions = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
    assert conditions["Established"] == "True"
    assert conditions["NamesAccepted"] == "True"
    assert crd["spec"]["scope"] == "Namespaced"
    assert [v["name"] for v in crd["spec"]["versions"] if v["served"]] == [VERSION]
    assert (
        crd["status"]["acceptedNames"]["shortNames"]
        == {RUN_PLURAL: ["ar"], REPLAY_PLURAL: ["arr"]}[plural]
    )


def test_kubectl_get_ar_prints_the_run_columns(crds: Kubectl, namespace: str) -> None:
    apply(crds, namespace, run_manifest("triage-42"), check=True)
    assert _header(crds, "ar", "-n", namespace) == [
        "NAME",
        "AGENT",
        "PHASE",
        "REASON",
        "ADMITTED",  # Kueue's admission of the current attempt (docs/kueue.md)
        "TOOLS",
        "ATTEMPTS",
        "AGE",
    ]
    assert _header(crds, "ar", "-n", namespace, "-o", "wide") == [
        "NAME",
        "AGENT",
        "PHASE",
        "REASON",
        "ADMITTED",
        "QUEUE",
        "TOOLS",
        "ATTEMPTS",
        "AGE",
        "TRIGGER",
        "USER",
        "REPLAY-OF",
        "MESSAGE",
        "RESULT",
        "TOKENS-IN",
        "TOKENS-OUT",
    ]


def test_kubectl_get_arr_prints_the_replay_columns(crds: Kubectl, namespace: str) -> None:
    apply(crds, namespace, replay_manifest("triage-42-again"), check=True)
    assert _header(crds, "arr", "-n", namespace) == [
        "NAME",
        "RUN",
        "PHASE",
        "REASON",
        "REPLAY",
        "AGE",
    ]


def test_tools_column_tells_none_from_unknown(crds: Kubectl, namespace: str) -> None:
    """[] (checked, none called) and null (could not check) must not look alike."""
    for name, tools in [("called", ["send_email", "update_crm"]), ("none", []), ("unknown", None)]:
        apply(crds, namespace, run_manifest(name), check=True)
        _set_status(
            crds,
            namespace,
            f"agentrun/{name}",
            {"phase": "Failed", "reason": "Evicted", "toolsExecuted": tools, "attempts": 1},
        )

    rows = {row["NAME"]: row for row in table(crds, "ar", "-n", namespace)}
    assert rows["called"]["TOOLS"] == '["send_email","update_crm"]'
    assert rows["none"]["TOOLS"] == "[]"
    assert rows["unknown"]["TOOLS"] == "<no value>"
    assert {r["PHASE"] for r in rows.values()} == {"Failed"}
    assert {r["ATTEMPTS"] for r in rows.values()} == {"1"}


def test_get_agentrun_by_singular_name_finds_one_run(crds: Kubectl, namespace: str) -> None:
    """`kubectl get agentrun NAME` must not be taken for a category covering both kinds."""
    apply(crds, namespace, run_manifest("triage-42"), check=True)
    apply(crds, namespace, replay_manifest("triage-42-again"), check=True)
    done = crds.kubectl("get", "agentrun", "triage-42", "-n", namespace, "-o", "name")
    assert done.stdout.split() == [f"agentrun.{GROUP}/triage-42"]
    both = crds.kubectl("get", "agentrun-all", "-n", namespace, "-o", "name").stdout.split()
    assert sorted(both) == [
        f"agentrun.{GROUP}/triage-42",
        f"agentrunreplay.{GROUP}/triage-42-again",
    ]


def test_defaults_are_filled_in(crds: Kubectl, namespace: str) -> None:
    apply(crds, namespace, run_manifest("triage-42"), check=True)
    spec = stored(crds, namespace, "agentrun/triage-42")["spec"]
    assert spec["trigger"] == "manual"
    assert spec["userId"] == "default"
    assert spec["retry"] == {"maxAttempts": 1, "resume": False}


def test_run_status_is_stored_whole(crds: Kubectl, namespace: str) -> None:
    apply(crds, namespace, run_manifest("triage-42"), check=True)
    status = {
        "phase": "Failed",
        "reason": "Evicted",
        "message": "The node ran out of memory and evicted the runner.",
        "toolsExecuted": ["send_email", "send_email"],
        "attempts": 2,
        "podName": "triage-42-2",
        "sessionId": "s-1",
        "inputDigest": "sha256:" + "0" * 64,
        "replayOf": "triage-41",
        "startedAt": "2026-01-01T00:00:00Z",
        "finishedAt": "2026-01-01T00:01:00Z",
        "observedGeneration": 1,
        "conditions": [
            {
                "type": "Succeeded",
                "status": "False",
                "reason": "Evicted",
                "message": "m",
                "lastTransitionTime": "2026-01-01T00:01:00Z",
            },
            {
                "type": "ToolsExecuted",
                "status": "True",
                "reason": "ToolCallsRecorded",
                "message": "send_email, send_email",
                "lastTransitionTime": "2026-01-01T00:01:00Z",
            },
        ],
        "kopf": {"progress": {"create": {"started": "2026-01-01T00:00:00Z"}}},
    }
    _set_status(crds, namespace, "agentrun/triage-42", status)
    assert stored(crds, namespace, "agentrun/triage-42")["status"] == status

    _set_status(crds, namespace, "agentrun/triage-42", {"phase": "Failed", "toolsExecuted": None})
    # null survives: "could not check" is not "absent" and not [].
    assert stored(crds, namespace, "agentrun/triage-42")["status"] == {
        "phase": "Failed",
        "toolsExecuted": None,
    }


def test_replay_status_is_stored_whole(crds: Kubectl, namespace: str) -> None:
    apply(crds, namespace, replay_manifest("triage-42-again"), check=True)
    status = {
        "phase": "Refused",
        "reason": "ToolsExecuted",
        "message": "This run already called send_email before failing: a replay would call"
        " it again. Annotate agentrun.dev/force-replay=true to run it again anyway.",
        "toolsExecuted": ["send_email"],
        "decidedAt": "2026-01-01T00:00:00Z",
        "observedGeneration": 1,
        "conditions": [
            {
                "type": "Approved",
                "status": "False",
                "reason": "ToolsExecuted",
                "message": "m",
                "lastTransitionTime": "2026-01-01T00:00:00Z",
            }
        ],
    }
    _set_status(crds, namespace, "agentrunreplay/triage-42-again", status)
    replay = stored(crds, namespace, "agentrunreplay/triage-42-again")
    assert replay["status"] == status
    assert replay["spec"] == {"runName": "triage-42", "resume": False}


def test_status_cannot_be_written_through_the_main_resource(crds: Kubectl, namespace: str) -> None:
    """With the status subresource, a user's apply of `status` is ignored, not stored."""
    manifest = run_manifest("triage-42")
    manifest["status"] = {"phase": "Succeeded", "toolsExecuted": []}
    apply(crds, namespace, manifest, check=True)
    assert "status" not in stored(crds, namespace, "agentrun/triage-42")


def test_json_patch_can_say_unknown_tools(crds: Kubectl, namespace: str) -> None:
    """A merge patch cannot write null, so the operator says "unknown" with a JSON patch."""
    apply(crds, namespace, run_manifest("triage-42"), check=True)
    crds.kubectl(
        "patch",
        "agentrun/triage-42",
        "-n",
        namespace,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": {"phase": "Running", "toolsExecuted": ["send_email"]}}),
    )
    crds.kubectl(
        "patch",
        "agentrun/triage-42",
        "-n",
        namespace,
        "--subresource=status",
        "--type=json",
        "-p",
        json.dumps(
            [
                {"op": "add", "path": "/status/toolsExecuted", "value": None},
                # A null where null means nothing is dropped, not refused.
                {"op": "add", "path": "/status/finishedAt", "value": None},
            ]
        ),
    )
    assert stored(crds, namespace, "agentrun/triage-42")["status"] == {
        "phase": "Running",
        "toolsExecuted": None,
    }
    row = table(crds, "ar", "triage-42", "-n", namespace)[0]
    assert row["TOOLS"] == "<no value>"
