"""A run's outcome on the resource: its answer (status.result), what it used (status.usage,
live while it runs), and its limits (spec.limits), with real runners of the scripted
model, whose usage figures the script sets."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agentrun_devtools.controlplane import ControlPlane

from agentrun import store
from agentrun.vocabulary import GROUP, VERSION, Phase, Reason, ReplayPhase, ReplayReason
from tests.harness import Operator, System, agent_run, in_namespace
from tests.replays import wait_decided

EMAIL = {"to": "customer-42@example.com", "body": "Refund on its way"}
FOUR_STEPS = [
    {"call": "read_message", "args": {}},
    {"call": "send_email", "args": EMAIL},
    {"call": "update_crm", "args": {"customer": "42", "status": "refunded"}},
    {"text": "Refunded customer 42 and told them."},
]


def settled(system: System, namespace: str, name: str) -> dict[str, Any]:
    run = system.wait_run(namespace, name, lambda r: (r.get("status") or {}).get(
        "phase") in (Phase.SUCCEEDED, Phase.FAILED) and r["status"].get(
        "toolsExecuted") is not None)
    return dict(run["status"])


def sha256(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def outbox(system: System, run: str) -> list[str]:
    return [r.tool for r in system.store(lambda e: store.outbox(e, run))]


def test_the_answer_and_the_usage_are_on_the_run_as_scripted(
        system: System, namespace: str) -> None:
    script = [{"call": "read_message", "args": {},
               "usage": {"inputTokens": 500, "outputTokens": 20}},
              {"text": "Refund done.", "usage": {"inputTokens": 700, "outputTokens": 30}}]
    system.apply(in_namespace(agent_run("answered", script), namespace))
    status = settled(system, namespace, "answered")
    assert status["phase"] == Phase.SUCCEEDED
    assert status["result"] == {"text": "Refund done.", "truncated": False,
                                "digest": sha256("Refund done."), "preview": "Refund done."}
    # The scripted model has no price unless modelPrices names it: no cost, not 0.
    assert status["usage"] == {"modelCalls": 2, "toolCalls": 1, "inputTokens": 1200,
                               "outputTokens": 50}


def test_a_long_answer_is_cut_on_a_character_boundary_with_the_digest_of_the_whole(
        system: System, namespace: str) -> None:
    answer = "€" * 3334  # 3 bytes each: 10,002 bytes
    system.apply(in_namespace(agent_run("long-winded", [{"text": answer}]), namespace))
    status = settled(system, namespace, "long-winded")
    result = status["result"]
    assert result["truncated"] is True
    assert result["text"] == "€" * 1365  # 4,095 bytes: the 1,366th would not fit
    assert len(result["text"].encode()) <= 4096
    assert result["digest"] == sha256(answer)
    assert result["preview"].startswith("€" * 60) and result["preview"].endswith("…")
    # Without a default, one model call counts 100 input and 10 output tokens.
    assert status["usage"]["inputTokens"] == 100 and status["usage"]["outputTokens"] == 10


def test_an_output_schema_gives_result_json(system: System, namespace: str) -> None:
    answer = {"priority": "urgent", "summary": "Customer 42 wants a refund"}
    system.apply(in_namespace(agent_run("triaged", [{"text": json.dumps(answer)}],
                                        agent="triage-agent"), namespace))
    status = settled(system, namespace, "triaged")
    assert status["phase"] == Phase.SUCCEEDED, status
    assert status["result"]["json"] == answer
    assert json.loads(status["result"]["text"]) == answer


def test_usage_is_on_the_run_while_it_runs(system: System, namespace: str) -> None:
    script = [{"call": "read_message", "args": {},
               "usage": {"inputTokens": 40, "outputTokens": 4}},
              {"sleep": 40}, {"text": "done"}]
    system.apply(in_namespace(agent_run("live-usage", script), namespace))
    run = system.wait_run(namespace, "live-usage", lambda r: (r.get("status") or {}).get(
        "usage", {}).get("modelCalls") == 1, timeout=35)
    assert run["status"]["phase"] == Phase.RUNNING
    assert run["status"]["usage"] == {"modelCalls": 1, "toolCalls": 1, "inputTokens": 40,
                                      "outputTokens": 4}
    system.kubectl("delete", "agentrun", "live-usage", "-n", namespace, "--wait=false")


def _resume(system: System, namespace: str, name: str, run: str,
            limits: dict[str, int]) -> dict[str, Any]:
    manifest = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "AgentRunReplay",
                "metadata": {"name": name, "namespace": namespace},
                "spec": {"runName": run, "resume": True, "limits": limits}}
    system.kubectl("create", "-f", "-", input=json.dumps(manifest))
    return wait_decided(system, namespace, name)


def test_max_model_calls_stops_the_run_before_the_next_call_and_a_resume_goes_on(
        system: System, namespace: str) -> None:
    system.apply(in_namespace(agent_run("two-calls", FOUR_STEPS,
                                        limits={"maxModelCalls": 2}), namespace))
    status = settled(system, namespace, "two-calls")
    assert (status["phase"], status["reason"]) == (Phase.FAILED, Reason.BUDGET_EXCEEDED)
    assert status["message"].startswith(
        "maxModelCalls 2 reached after 2 model calls (220 tokens); no further call was made.")
    assert status["usage"]["modelCalls"] == 2
    assert status["toolsExecuted"] == ["read_message", "send_email"]
    assert outbox(system, "two-calls") == ["send_email"]  # update_crm never ran
    assert "result" not in status

    replay = _resume(system, namespace, "two-calls-more", "two-calls", {"maxModelCalls": 10})
    assert (replay["status"]["phase"], replay["status"]["reason"]) == (
        ReplayPhase.APPROVED, ReplayReason.RESUMABLE)
    resumed = settled(system, namespace, replay["status"]["replayRunName"])
    assert resumed["phase"] == Phase.SUCCEEDED, resumed
    assert resumed["toolsExecuted"] == ["update_crm"]  # nothing repeated
    assert resumed["result"]["text"] == "Refunded customer 42 and told them."
    # The resumed run continues the count: the original's two calls, then its own two.
    assert resumed["usage"]["modelCalls"] == 4
    everything = outbox(system, "two-calls") + outbox(system, replay["status"]["replayRunName"])
    assert sorted(everything) == ["send_email", "update_crm"]


def test_max_tool_calls_stops_before_the_call_is_recorded(
        system: System, namespace: str) -> None:
    system.apply(in_namespace(agent_run("one-tool", FOUR_STEPS, limits={"maxToolCalls": 1}),
                              namespace))
    status = settled(system, namespace, "one-tool")
    assert (status["phase"], status["reason"]) == (Phase.FAILED, Reason.BUDGET_EXCEEDED)
    assert status["message"].startswith("maxToolCalls 1 reached after 1 tool call")
    assert "send_email was not started" in status["message"]
    assert status["toolsExecuted"] == ["read_message"]
    assert status["usage"]["toolCalls"] == 1
    assert outbox(system, "one-tool") == []


def test_max_tokens_stops_the_run_once_reached(system: System, namespace: str) -> None:
    system.apply(in_namespace(agent_run("few-tokens", FOUR_STEPS, limits={"maxTokens": 200}),
                              namespace))
    status = settled(system, namespace, "few-tokens")
    assert (status["phase"], status["reason"]) == (Phase.FAILED, Reason.BUDGET_EXCEEDED)
    assert status["message"].startswith(
        "maxTokens 200 reached after 2 model calls (220 tokens); no further call was made.")
    assert status["toolsExecuted"] == ["read_message", "send_email"]
    assert outbox(system, "few-tokens") == ["send_email"]


def test_a_cost_limit_on_an_unpriced_model_fails_at_once(
        system: System, namespace: str) -> None:
    system.apply(in_namespace(agent_run("unpriced", FOUR_STEPS,
                                        limits={"maxCostMicroUSD": 1000}), namespace))
    status = settled(system, namespace, "unpriced")
    assert (status["phase"], status["reason"]) == (Phase.FAILED, Reason.PRICE_UNKNOWN)
    assert "model scripted has no known price" in status["message"]
    assert status["toolsExecuted"] == []
    assert status["usage"]["modelCalls"] == 0


@pytest.fixture
def priced(crds: ControlPlane, dev_node: object, store_url: str, solo_namespace: str,
           tmp_path: Path) -> Iterator[System]:
    """An operator whose modelPrices names the scripted model."""
    prices = {"scripted": {"inputUSDPerMillionTokens": 2, "outputUSDPerMillionTokens": 10}}
    operator = Operator(crds, store_url, tmp_path / "op", (
        f"--namespace={solo_namespace}", f"--model-prices={json.dumps(prices)}")).start()
    try:
        yield System(crds, store_url, operator)
    finally:
        operator.stop()


def test_model_prices_give_the_cost_and_a_cost_limit(
        priced: System, solo_namespace: str) -> None:
    priced.apply(in_namespace(agent_run("costed", [
        {"call": "read_message", "args": {}, "usage": {"inputTokens": 500, "outputTokens": 20}},
        {"text": "ok", "usage": {"inputTokens": 700, "outputTokens": 30}}]), solo_namespace))
    status = settled(priced, solo_namespace, "costed")
    # 1,200 input tokens at 2 USD per million, 50 output at 10: 2,400 + 500 micro-USD.
    assert status["usage"]["costMicroUSD"] == 2900
    priced.apply(in_namespace(agent_run("capped", FOUR_STEPS,
                                        limits={"maxCostMicroUSD": 300}), solo_namespace))
    status = settled(priced, solo_namespace, "capped")
    # Each call: 100 x 2 + 10 x 10 = 300 micro-USD; the second is not made.
    assert (status["phase"], status["reason"]) == (Phase.FAILED, Reason.BUDGET_EXCEEDED)
    assert status["message"].startswith("maxCostMicroUSD 300 reached after 1 model call "
                                         "(110 tokens, 300 micro-USD)")
    assert status["toolsExecuted"] == ["read_message"]
