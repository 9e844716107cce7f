"""What the runner reads of the image's code and the run's spec.tools for "a run only
tightens": the support sample's declarations, and the decision they lead to (the runner
refuses the attempt PolicyViolation before its first model call when there is one)."""

from __future__ import annotations

import json

import pytest
from agentrun_runner.agents import default_agents_dir, load_agent
from agentrun_runner.main import code_declarations, parse_config, run_declarations

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
