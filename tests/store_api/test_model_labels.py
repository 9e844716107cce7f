"""A model's metric label comes only from a bounded set: LiteLLM's price map and the
chart's modelPrices (api.md, "Tenant policy: Every store route is bounded")."""

from __future__ import annotations

import pytest
from agentrun_store_api import metrics

CASES = [
    ("in LiteLLM's price map", "gemini-2.5-flash", "gemini-2.5-flash"),
    ("in the map under its name without the provider prefix", "openai/gpt-4o", "gpt-4o"),
    ("a name nobody prices", "made-up-model-7", "other"),
    ("a prefix the map does not know is not a new label", "x/gpt-4o", "gpt-4o"),
    ("in the chart's modelPrices", "house-model", "house-model"),
    ("too long", "g" * 65, "other"),
    ("not a word", "gemini 2.5", "other"),
    ("empty", "", "other"),
]


@pytest.fixture(autouse=True)
def _house_prices() -> None:
    metrics.price_models(metrics.price_models_of(
        '{"house-model": {"inputUSDPerMillionTokens": 1, "outputUSDPerMillionTokens": 2}}'))


@pytest.mark.parametrize(("model", "label"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_model_label(model: str, label: str) -> None:
    assert metrics.model_label(model) == label


def test_a_thousand_new_names_are_one_label() -> None:
    assert {metrics.model_label(f"flood-{i}") for i in range(1000)} == {"other"}
    assert {metrics.model_label(f"p{i}/gpt-4o") for i in range(1000)} == {"gpt-4o"}


def test_a_namespaces_agents_are_labels_up_to_a_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metrics, "_AGENTS", {})
    bound = metrics.AGENT_LABELS_PER_NAMESPACE
    flood = [metrics.agent_label("team-a", f"agent-{i}") for i in range(bound + 500)]
    assert flood[:bound] == [f"agent-{i}" for i in range(bound)]
    assert set(flood[bound:]) == {"other"}
    # A name already a label stays one; another namespace has its own bound.
    assert metrics.agent_label("team-a", "agent-0") == "agent-0"
    assert metrics.agent_label("team-b", "agent-999") == "agent-999"
