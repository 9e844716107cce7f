"""Every manifest in samples/ is accepted by the API server with server-side apply, as a user
copying it would send it, and is stored as written (plus the documented defaults)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from agentrun.vocabulary import API_VERSION, REPLAY_KIND, RUN_KIND
from tests.crds.kube import Kubectl, stored

pytestmark = pytest.mark.cluster

SAMPLES = Path(__file__).resolve().parents[2] / "samples"
SAMPLE_FILES = sorted([*SAMPLES.glob("*.yaml"), *SAMPLES.glob("*/agentrun*.yaml"),
                       *SAMPLES.glob("*/agent.yaml")])


def _ours(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d and d["apiVersion"] == API_VERSION]


def test_samples_cover_the_documented_cases() -> None:
    specs = [d["spec"] for p in SAMPLE_FILES for d in _ours(p) if d["kind"] == RUN_KIND]
    replays = [d for p in SAMPLE_FILES for d in _ours(p) if d["kind"] == REPLAY_KIND]
    files = [f for s in specs for f in s["input"].get("files", [])]
    assert any("configMapKeyRef" in f for f in files)
    assert any("secretKeyRef" in f for f in files)
    assert any(s.get("trigger") == "chat" and "sessionId" in s for s in specs)
    assert any({"retry", "activeDeadlineSeconds", "env", "resources"} <= s.keys() for s in specs)
    assert any("secretKeyRef" in e.get("valueFrom", {}) for s in specs for e in s.get("env", []))
    assert any("agentrun.dev/force-replay" in r["metadata"].get("annotations", {}) for r in replays)
    assert any(
        "agentrun.dev/force-replay" not in r["metadata"].get("annotations", {}) for r in replays
    )


@pytest.mark.parametrize("path", SAMPLE_FILES, ids=[p.name for p in SAMPLE_FILES])
def test_sample_is_accepted_with_server_side_apply(
    crds: Kubectl, namespace: str, path: Path
) -> None:
    done = crds.kubectl("apply", "--server-side", "-n", namespace, "-f", str(path))

    for doc in _ours(path):
        name = doc["metadata"]["name"]
        assert f"{doc['kind'].lower()}.agentrun.dev/{name} serverside-applied" in done.stdout
        spec = stored(crds, namespace, f"{doc['kind'].lower()}/{name}")["spec"]
        # What was written is what is stored; the server only adds the defaults.
        assert {k: spec[k] for k in doc["spec"]} == doc["spec"]
        if doc["kind"] == RUN_KIND:
            assert spec["trigger"] == doc["spec"].get("trigger", "manual")
            assert spec["retry"]["maxAttempts"] == doc["spec"].get("retry", {}).get(
                "maxAttempts", 1
            )


def test_applying_a_sample_again_changes_nothing(crds: Kubectl, namespace: str) -> None:
    """GitOps re-applies the same manifest; the immutable spec must not refuse that."""
    path = SAMPLES / "agentrun-retry.yaml"
    crds.kubectl("apply", "--server-side", "-n", namespace, "-f", str(path))
    before = stored(crds, namespace, "agentrun/nightly-digest")
    again = crds.kubectl("apply", "--server-side", "-n", namespace, "-f", str(path))
    assert "agentrun.agentrun.dev/nightly-digest serverside-applied" in again.stdout
    after = stored(crds, namespace, "agentrun/nightly-digest")
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
