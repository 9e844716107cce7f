"""The archive's selectors and continue tokens (agentrun/history.py): Kubernetes' label
selector grammar, the field selectors it answers, and refusals that say why."""

from __future__ import annotations

import datetime

import pytest

from agentrun import history
from agentrun.store.history import Field

LABELS = {"team": "payments", "tier": "gold"}


@pytest.mark.parametrize(("selector", "matched"), [
    ("", True),
    ("team=payments", True),
    ("team==payments", True),
    ("team!=payments", False),
    ("team=support", False),
    ("team!=support", True),
    ("missing!=x", True),                    # != holds where the label is absent
    ("team in (support, payments)", True),
    ("team notin (support,payments)", False),
    ("tier", True),
    ("!tier", False),
    ("!missing", True),
    ("team=payments,tier in (gold)", True),
    ("team=payments,tier=silver", False),
])
def test_label_selectors_match_as_the_api_server_does(selector: str, matched: bool) -> None:
    assert history.label_selector(selector)(LABELS) is matched


@pytest.mark.parametrize("selector", ["team=(x", "a b c", "=x"])
def test_a_label_selector_it_cannot_read_is_refused(selector: str) -> None:
    with pytest.raises(history.BadSelector, match="unable to parse"):
        history.label_selector(selector)


def test_field_selectors_name_columns_and_phases() -> None:
    assert history.field_selector("status.phase=Failed,spec.agent!=triage") == [
        Field("status", "failed"), Field("agent", "triage", equal=False)]
    assert history.field_selector("metadata.uid==abc") == [Field("uid", "abc")]
    with pytest.raises(history.BadSelector, match="field label not supported"):
        history.field_selector("status.reason=Evicted")
    with pytest.raises(history.BadSelector, match="not a phase the archive records"):
        history.field_selector("status.phase=Waiting")


def test_continue_tokens_round_trip_and_a_tampered_one_is_refused() -> None:
    at = datetime.datetime(2026, 12, 4, 10, 0, 0, 123456, tzinfo=datetime.UTC)
    token = history.encode_continue((at, "uid-1"))
    assert history.decode_continue(token) == (at, "uid-1")
    assert history.encode_continue(None) == "" and history.decode_continue("") is None
    with pytest.raises(history.BadSelector, match="continue token not valid"):
        history.decode_continue("not-a-token")


def test_a_record_keeps_its_runs_annotations_but_kubectls_copy_of_the_manifest() -> None:
    assert history.kept_annotations({
        "kubectl.kubernetes.io/last-applied-configuration": "{...}", "owner": "ops"}) == {
            "owner": "ops"}
    assert history.kept_annotations(None) is None
