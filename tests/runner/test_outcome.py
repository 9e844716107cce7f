"""The pure parts of a run's outcome: status.result from an answer, prices, and the budget
that spec.limits sets (the messages of api.md, word for word)."""

from __future__ import annotations

import json

import pytest
from agentrun_operator.status import RESULT_BYTES, preview, result_status, usage_status
from agentrun_operator.status import utf8_prefix as cut
from agentrun_runner.budget import Budget, BudgetExceeded, Counted, Limits, unpriced
from agentrun_runner.prices import Price, parse_overrides, price_of

from agentrun.store import Usage, answer_digest


@pytest.mark.parametrize(("text", "limit", "kept"), [
    ("abc", 3, "abc"),
    ("abcd", 3, "abc"),
    ("aé", 2, "a"),  # é is two bytes: never half of it
    ("aé", 3, "aé"),
    ("€€", 5, "€"),  # € is three bytes
    ("😀x", 3, ""),  # four bytes
    ("", 0, ""),
])
def test_a_cut_never_splits_a_character(text: str, limit: int, kept: str) -> None:
    assert cut(text, limit) == kept
    assert len(cut(text, limit).encode()) <= limit


def test_the_result_shows_the_first_bytes_the_digest_of_the_whole_and_a_bounded_object() -> None:
    whole = "x" * (RESULT_BYTES + 10)
    shown = result_status(whole, answer_digest(whole))
    assert shown["text"] == "x" * RESULT_BYTES and shown["truncated"] is True
    assert shown["digest"] == answer_digest(whole) != answer_digest(shown["text"])
    exact = result_status("y" * RESULT_BYTES, "d")
    assert exact["truncated"] is False
    small = {"priority": "urgent"}
    assert result_status(json.dumps(small), "d", small)["json"] == small
    big = {"items": ["z" * 1000] * 20}  # over 16 KiB
    assert "json" not in result_status(json.dumps(big), "d", big)


def test_the_preview_is_the_first_words_on_one_line() -> None:
    assert preview("Refund\n done.") == "Refund done."
    words = " ".join(["word"] * 30)
    assert preview(words) == " ".join(["word"] * 12) + "…"
    assert len(preview(words)) <= 61


def test_usage_shows_no_cost_when_a_price_is_unknown() -> None:
    assert usage_status(Usage(2, 1, 1200, 50, None)) == {
        "modelCalls": 2, "toolCalls": 1, "inputTokens": 1200, "outputTokens": 50}
    assert usage_status(Usage(2, 1, 1200, 50, 2900))["costMicroUSD"] == 2900
    assert Usage(1, 0, 1, 1, 5).plus(Usage(1, 1, 1, 1, None)).cost_micro_usd is None


def test_prices_come_from_litellm_and_the_overrides_win() -> None:
    flash = price_of("gemini-2.5-flash")
    assert flash is not None and flash.input_per_million > 0
    # A provider prefix is LiteLLM's own model name without it; Gemini's API names too.
    assert price_of("openai/gpt-4o") == price_of("gpt-4o") is not None
    assert price_of("scripted") is None
    overrides = parse_overrides(json.dumps({"scripted": {
        "inputUSDPerMillionTokens": 2, "outputUSDPerMillionTokens": 10}}))
    assert price_of("scripted", overrides) == Price(2.0, 10.0)
    assert price_of("gemini-2.5-flash", {"gemini-2.5-flash": Price(1, 1)}) == Price(1, 1)
    with pytest.raises(ValueError, match="needs inputUSDPerMillionTokens"):
        parse_overrides('{"x": {"inputUSDPerMillionTokens": 1}}')


def test_a_cost_is_in_micro_dollars_rounded_up() -> None:
    # A dollar per million tokens is a micro-dollar per token.
    assert Price(2, 10).micro_usd(1200, 50) == 2900
    assert Price(0.075, 0.3).micro_usd(1000, 0) == 75
    assert Price(0.075, 0.3).micro_usd(1, 0) == 1  # never below what was spent


def test_the_budget_stops_before_the_next_model_call_past_a_limit() -> None:
    budget = Budget(Limits(max_model_calls=2), Counted())
    for _ in range(2):
        budget.before_model()
        budget.model_called("scripted", 100, 10)
    with pytest.raises(BudgetExceeded) as refused:
        budget.before_model()
    assert str(refused.value) == (
        "maxModelCalls 2 reached after 2 model calls (220 tokens); no further call was made.")
    tokens = Budget(Limits(max_tokens=200), Counted(model_calls=2, input_tokens=200,
                                                     output_tokens=20))
    with pytest.raises(BudgetExceeded, match=r"^maxTokens 200 reached after 2 model calls"):
        tokens.before_model()
    # An unknown price cannot reach a cost limit (PriceUnknown refuses the run first).
    Budget(Limits(max_cost_micro_usd=1), Counted(cost_micro_usd=None)).before_model()


def test_the_budget_refuses_the_tool_calls_a_response_asks_for_together() -> None:
    budget = Budget(Limits(max_tool_calls=2), Counted(tool_calls=1))
    budget.before_tools(["send_email"])
    with pytest.raises(BudgetExceeded) as refused:
        budget.before_tools(["send_email", "update_crm"])
    assert "maxToolCalls 2 reached after 1 tool call" in str(refused.value)
    assert str(refused.value).endswith("send_email, update_crm were not started.")
    budget.tool_started("send_email")
    with pytest.raises(BudgetExceeded, match="update_crm was not started"):
        budget.tool_started("update_crm")
    assert budget.counted.tool_calls == 2


def test_the_count_starts_where_the_store_says_the_run_is() -> None:
    counted = Counted.of({"modelCalls": 3, "toolCalls": 2, "inputTokens": 300,
                          "outputTokens": 30, "costMicroUSD": None})
    assert (counted.model_calls, counted.tool_calls, counted.tokens) == (3, 2, 330)
    assert counted.cost_micro_usd is None
    with pytest.raises(BudgetExceeded):
        Budget(Limits(max_model_calls=3), counted).before_model()


def test_a_cost_limit_needs_a_price_for_every_model() -> None:
    assert unpriced(Limits(), ["scripted"], {}) is None
    said = unpriced(Limits(max_cost_micro_usd=5), ["gemini-2.5-flash", "scripted"], {})
    assert said is not None and "model scripted has no known price" in said
    assert unpriced(Limits(max_cost_micro_usd=5), ["scripted"], {"scripted": Price(1, 1)}) \
        is None
    with pytest.raises(ValueError, match=r"limits\.maxTokens must be a non-negative integer"):
        Limits.parse('{"maxTokens": -1}')
    assert Limits.parse('{"maxModelCalls": 2}') == Limits(max_model_calls=2)
