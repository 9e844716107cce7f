"""What the runner reads of the image's code and the run's spec.tools for "a run only
tightens": the support sample's declarations, and the decision they lead to (the runner
refuses the attempt PolicyViolation before its first model call when there is one)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from agentrun_runner.agents import default_agents_dir, load_agent
from agentrun_runner.approvals import ApprovalRule
from agentrun_runner.main import (
    Loaded,
    applied_rules,
    code_declarations,
    parse_config,
    run_declarations,
)

from agentrun import policy
from agentrun.vocabulary import RunnerEnv

ENV = {RunnerEnv.RUN_UID: "uid-1", RunnerEnv.RUN_NAME: "r", RunnerEnv.AGENT: "support-agent",
       RunnerEnv.INPUT_DIGEST: "sha256:ab", RunnerEnv.ATTEMPT: "1"}


def test_the_support_samples_code_declares_its_tools() -> None:
    code = code_declarations(load_agent(default_agents_dir(), "support-agent"))
    assert code == {
        "read_message": policy.Declared(policy.CODE, "ReadOnly"),
        "send_email": policy.Declared(policy.CODE, "Idempotent"),
        "update_crm": policy.Declared(policy.CODE, "Effectful"),
        "charge_card": policy.Declared(policy.CODE, "Effectful"),
        # FunctionTool(issue_refund, require_confirmation=True), and @effectful.
        "issue_refund": policy.Declared(policy.CODE, "Effectful", True),
        "load_history": policy.Declared(policy.CODE, "ReadOnly"),
    }


@pytest.mark.parametrize(("tools", "refused"), [
    ([{"name": "issue_refund", "approval": "None"}], ("issue_refund", policy.CODE)),
    ([{"name": "charge_card", "effect": "ReadOnly"}], ("charge_card", policy.CODE)),
    ([{"name": "send_email", "effect": "ReadOnly"}], ("send_email", policy.CODE)),
    ([{"name": "read_message", "effect": "Effectful", "approval": "Required"},
      {"name": "issue_refund", "approval": "Required"}], None),
    ([{"name": "not_in_the_code", "effect": "ReadOnly", "approval": "None"}], None),
])
def test_the_runs_spec_tools_against_the_code(tools: list[dict[str, str]],
                                              refused: tuple[str, str] | None) -> None:
    config = parse_config([], {**ENV, RunnerEnv.TOOLS: json.dumps(tools)})
    code = code_declarations(load_agent(default_agents_dir(), "support-agent"))
    found = policy.first_violation([code, {}, run_declarations(config)])
    assert (None if found is None else (found.tool, found.contradicts)) == refused


def _applied(chart: list[dict[str, Any]], agent: list[dict[str, Any]],
             run: list[dict[str, Any]]) -> tuple[policy.Violation | None, dict[str, str],
                                                 dict[str, ApprovalRule]]:
    """What the runner decides of the support sample's code under `chart`, an Agent's
    effects `agent` and the run's `run`: the violation, else the effects and approvals
    the ledger applies."""
    config = parse_config([], {**ENV, RunnerEnv.TOOLS: json.dumps(run),
                               RunnerEnv.TOOL_POLICY: json.dumps(chart)})
    root = load_agent(default_agents_dir(), "support-agent")
    code = code_declarations(root)
    loaded = Loaded(root, None, rules=agent, effects=agent)
    found = policy.first_violation([policy.of_rules(policy.CHART, config.tool_policy), code,
                                    policy.of_rules(policy.AGENT, agent),
                                    run_declarations(config)])
    return (found, *applied_rules(config, loaded, code))


def test_the_charts_policy_is_the_most_trusted_word() -> None:
    # The image's code says read_message is ReadOnly: less strict than the chart.
    found, _, _ = _applied([{"name": "read_message", "effect": "Idempotent"}], [], [])
    assert found is not None and (found.tool, found.source, found.contradicts) == (
        "read_message", policy.CODE, policy.CHART)
    assert "the runner image's code says ReadOnly (where it says Idempotent) for the tool " \
        "read_message, which the chart's policy declares stricter" in found.message
    # An Agent or a run lifting the chart's approval.
    for agent, run, source in (([{"name": "charge_card", "approval": "None"}], [],
                                policy.AGENT),
                               ([], [{"name": "charge_card", "approval": "None"}],
                                policy.RUN)):
        found, _, _ = _applied([{"name": "charge_card", "approval": "Required"}], agent, run)
        assert found is not None and (found.source, found.contradicts) == (source,
                                                                           policy.CHART)


def test_what_applies_is_the_strictest_word() -> None:
    found, effects, approvals = _applied(
        [{"name": "charge_card", "approval": "Required", "approvalTimeoutSeconds": 600},
         {"name": "update_crm", "effect": "Idempotent"},
         {"name": "lookup_customer", "effect": "Idempotent"},
         {"name": "send_email", "approval": "None"}],
        [{"name": "lookup_customer", "effect": "Effectful"}],
        [{"name": "charge_card", "approval": "Required", "approvalTimeoutSeconds": 60}])
    assert found is None
    # The code's Effectful over the chart's Idempotent; the Agent's over the chart's (an
    # MCP tool the code does not know); the code's own where only it speaks.
    assert effects["update_crm"] == "Effectful"
    assert effects["lookup_customer"] == "Effectful"
    assert effects["read_message"] == "ReadOnly"
    # The chart's approval, with the run's timeout (the least trusted word on it).
    assert approvals["charge_card"] == ApprovalRule(True, 60)
    assert approvals["send_email"] == ApprovalRule(False, 86400)
    # The code's require_confirmation is asked of the code, call by call.
    assert "issue_refund" not in approvals
