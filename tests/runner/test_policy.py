"""The runner, which alone sees the image's code, refuses what a tenant may not do to a
tool: name a function the image does not ship as a tool (AgentInvalid), or loosen an
effect or approval the Agent or the code declares (PolicyViolation). Either way before the
first model call: nothing runs, the MCP server sees no call, toolsExecuted is []."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentrun import agents, store
from agentrun.transcript import entries_of
from agentrun.vocabulary import Reason, RunnerExit
from tests.mcp_server import CrmServer
from tests.runner.runs import Run, explain, outcome, prepare_run, query, run_runner, snapshot_of

pytestmark = pytest.mark.postgres


def nothing_ran(run: Run) -> None:
    assert query(run.url, lambda e: store.tools_executed(e, run.uid, 1)) == []
    assert query(run.url, lambda e: store.ledger(e, run.uid)) == []
    assert query(run.url, lambda e: store.outbox(e, run.name)) == []


# -- function tools ---------------------------------------------------------------------------


@pytest.fixture
def image(tmp_path: Path) -> tuple[Path, Path]:
    """An agents directory with a module whose unmarked function would leave a marker."""
    marker = tmp_path / "marker"
    agents_dir = tmp_path / "agents"
    agents_dir.mkdir()
    (agents_dir / "tenant_side.py").write_text(
        f"def grab(cmd: str) -> str:\n    open({str(marker)!r}, 'w').write(cmd)\n"
        "    return cmd\n")
    return agents_dir, marker


# The value of the sub-agent's Secret header, as the kubelet would put it in the pod's env.
SECRET = "Bearer billing-s3cr3t-7f3a"


@pytest.mark.parametrize(("function", "said"), [
    ("tenant_side.grab", "tenant_side.grab is not marked as a tool"),
    ("subprocess.getoutput", "names the function subprocess.getoutput, of Python's standard"),
    ("os.getenv", "names the function os.getenv, of Python's standard library"),
    ("builtins.exec", "names the function builtins.exec, of Python's standard library"),
])
def test_a_function_the_image_does_not_ship_as_a_tool_never_runs(
        pg_store: str, crm: CrmServer, image: tuple[Path, Path], function: str,
        said: str) -> None:
    """The tenant's Agent names the function over a sub-agent whose MCP header is a Secret
    it may not read (the runner has that Secret in its env, as the operator puts it): the
    model asks for the env, and for a marker file; nothing runs, and the Secret is in
    nothing the tenant reads back (the outcome the run's status shows, the transcript)."""
    agents_dir, marker = image
    snapshot = snapshot_of(crm.url, tools=[{"function": function}],
                           subAgents=[{"name": "billing"}])
    snapshot["agents"]["billing"] = {
        "instruction": "Answer billing questions.",
        "mcpServers": [{"name": "crm", "url": crm.url, "headers": [
            {"name": "Authorization",
             "valueFrom": {"secretKeyRef": {"name": "billing-crm", "key": "token"}}}]}]}
    run = prepare_run(pg_store, "fn-refused", agent="triage", agent_snapshot=snapshot)
    name = function.rpartition(".")[2]
    header = agents.header_env("billing", "crm", "Authorization")
    done = run_runner(run, [{"call": name, "args": {"cmd": f"touch {marker}; env"}},
                            {"call": name, "args": {"key": header}},
                            {"text": "never"}],
                      AGENTRUN_AGENTS_DIR=str(agents_dir), **{header: SECRET})
    assert done.returncode == RunnerExit.AGENT_INVALID, explain(done)
    got = outcome(run)
    assert got is not None and got.reason == Reason.AGENT_INVALID
    assert function in str(got.message) and said in str(got.message), got.message
    assert not marker.exists()
    assert crm.calls() == []
    nothing_ran(run)
    facts = query(run.url, lambda e: store.transcript_facts(e, run.uid))
    assert facts is not None
    shown = json.dumps([str(got.message), entries_of(facts)], default=str)
    assert "billing-s3cr3t" not in shown
    assert "billing-s3cr3t" not in done.stdout + done.stderr  # the pod's log


# -- a run only tightens ------------------------------------------------------------------------


@pytest.mark.parametrize(("effects", "tools", "said"), [
    ([{"name": "close_account", "approval": "Required"}],
     [{"name": "close_account", "approval": "None"}],
     "the run's spec.tools says approval None for the tool close_account, which the "
     "Agent's effects declares stricter"),
    ([{"name": "close_account", "effect": "Idempotent"}],
     [{"name": "close_account", "effect": "ReadOnly"}],
     "the run's spec.tools says ReadOnly (where it says Idempotent) for the tool "
     "close_account, which the Agent's effects declares stricter"),
])
def test_a_run_that_loosens_the_agent_fails_policy_violation(
        pg_store: str, crm: CrmServer, effects: list[dict[str, str]],
        tools: list[dict[str, str]], said: str) -> None:
    run = prepare_run(pg_store, "loosen-agent", agent="triage",
                      agent_snapshot=snapshot_of(crm.url, effects=effects))
    done = run_runner(run, [{"call": "close_account", "args": {"customer": "43"}},
                            {"text": "never"}], AGENTRUN_TOOLS=json.dumps(tools))
    assert done.returncode == RunnerExit.POLICY_VIOLATION, explain(done)
    got = outcome(run)
    assert got is not None and got.reason == Reason.POLICY_VIOLATION
    assert said in str(got.message), got.message
    assert crm.calls() == []
    nothing_ran(run)


@pytest.mark.parametrize(("tools", "said"), [
    # ADK's FunctionTool(issue_refund, require_confirmation=True) in the image's code.
    ([{"name": "issue_refund", "approval": "None"}],
     "the run's spec.tools says approval None for the tool issue_refund, which the runner "
     "image's code declares stricter"),
    # @effects.effectful in the image's code.
    ([{"name": "charge_card", "effect": "ReadOnly"}],
     "the run's spec.tools says ReadOnly (where it says Effectful) for the tool "
     "charge_card, which the runner image's code declares stricter"),
    # @effects.idempotent in the image's code.
    ([{"name": "send_email", "effect": "ReadOnly"}],
     "the run's spec.tools says ReadOnly (where it says Idempotent) for the tool "
     "send_email"),
])
def test_a_run_that_loosens_the_images_code_fails_policy_violation(
        pg_store: str, tools: list[dict[str, str]], said: str) -> None:
    run = prepare_run(pg_store, "loosen-code")
    tool = tools[0]["name"]
    done = run_runner(run, [{"call": tool, "args": {"customer": "42", "amount": 30}},
                            {"text": "never"}], AGENTRUN_TOOLS=json.dumps(tools))
    assert done.returncode == RunnerExit.POLICY_VIOLATION, explain(done)
    got = outcome(run)
    assert got is not None and got.reason == Reason.POLICY_VIOLATION
    assert said in str(got.message), got.message
    nothing_ran(run)


def test_a_run_and_an_agent_may_tighten_the_images_code(
        pg_store: str, crm: CrmServer) -> None:
    # The image's sample_tools.refund_policy is @read_only: the Agent may call it stricter
    # (below, it runs), never less strict; its approval the Agent may add.
    run = prepare_run(pg_store, "tighten-code", agent="triage", agent_snapshot=snapshot_of(
        crm.url, tools=[{"function": "sample_tools.refund_policy"}],
        effects=[{"name": "refund_policy", "effect": "Idempotent"}]))
    done = run_runner(run, [{"call": "refund_policy", "args": {"order": "42"}},
                            {"text": "Done."}],
                      AGENTRUN_TOOLS=json.dumps([{"name": "refund_policy",
                                                  "effect": "Effectful"}]))
    assert done.returncode == RunnerExit.SUCCESS, explain(done)
    (entry,) = query(run.url, lambda e: store.ledger(e, run.uid))
    assert (entry.tool, entry.effect) == ("refund_policy", "Effectful")


@pytest.mark.parametrize(("effects", "said"), [
    ([{"name": "send", "effect": "ReadOnly"}],
     "the Agent's effects says ReadOnly (where it says Idempotent) for the tool send, which "
     "the runner image's code declares stricter"),
    ([{"name": "wire", "approval": "None"}],
     "the Agent's effects says approval None for the tool wire, which the runner image's "
     "code declares stricter"),
])
def test_an_agent_that_loosens_the_images_code_fails_policy_violation(
        pg_store: str, crm: CrmServer, tmp_path: Path, effects: list[dict[str, str]],
        said: str) -> None:
    marker = tmp_path / "marker"
    agents_dir = tmp_path / "agents"
    agents_dir.mkdir()
    (agents_dir / "platform_tools.py").write_text(
        "from agentrun import effects\n\n"
        f"@effects.idempotent\ndef send(to: str) -> str:\n"
        f"    open({str(marker)!r}, 'w').write(to)\n    return to\n\n"
        f"@effects.requires_approval\ndef wire(to: str) -> str:\n"
        f"    open({str(marker)!r}, 'w').write(to)\n    return to\n")
    run = prepare_run(pg_store, "agent-loosens", agent="triage", agent_snapshot=snapshot_of(
        crm.url, effects=effects, tools=[{"function": "platform_tools.send"},
                                         {"function": "platform_tools.wire"}]))
    done = run_runner(run, [{"call": effects[0]["name"], "args": {"to": "x"}},
                            {"text": "never"}], AGENTRUN_AGENTS_DIR=str(agents_dir))
    assert done.returncode == RunnerExit.POLICY_VIOLATION, explain(done)
    got = outcome(run)
    assert got is not None and got.reason == Reason.POLICY_VIOLATION
    assert said in str(got.message), got.message
    assert not marker.exists()
    nothing_ran(run)


# -- the chart's policy: the most trusted word -------------------------------------------------

CHART = [{"name": "send_email", "approval": "Required", "approvalTimeoutSeconds": 600}]
EMAIL = {"to": "c42@example.com", "body": "Your refund is on its way."}


def test_the_charts_policy_makes_a_call_wait_for_an_approval(pg_store: str) -> None:
    """The chart says send_email waits for an approval; neither the code, the Agent nor the
    run says so: the call is written down as waiting, never run."""
    run = prepare_run(pg_store, "chart-waits")
    done = run_runner(run, [{"call": "send_email", "args": EMAIL}, {"text": "never"}],
                      AGENTRUN_TOOL_POLICY=json.dumps(CHART))
    assert done.returncode == RunnerExit.AWAITING_APPROVAL, explain(done)
    waiting = query(run.url, lambda e: store.pending_approval(e, run.uid))
    assert waiting is not None and waiting.tool == "send_email"
    # The chart's timeout: expiresAt is taken a moment before the row's requestedAt.
    assert 590 < (waiting.expires_at - waiting.requested_at).total_seconds() <= 600
    nothing_ran(run)


def test_a_run_that_lifts_the_charts_approval_fails_policy_violation(pg_store: str) -> None:
    run = prepare_run(pg_store, "chart-lifted")
    done = run_runner(run, [{"call": "send_email", "args": EMAIL}, {"text": "never"}],
                      AGENTRUN_TOOL_POLICY=json.dumps(CHART),
                      AGENTRUN_TOOLS=json.dumps([{"name": "send_email", "approval": "None"}]))
    assert done.returncode == RunnerExit.POLICY_VIOLATION, explain(done)
    got = outcome(run)
    assert got is not None and got.reason == Reason.POLICY_VIOLATION
    assert ("the run's spec.tools says approval None for the tool send_email, which the "
            "chart's policy declares stricter") in str(got.message), got.message
    nothing_ran(run)
