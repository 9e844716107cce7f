"""The Agent decisions (agentrun.agents, operator agents.agent_status): which definitions
make a runnable ADK agent tree, what the snapshot and its digest are, and what the pod and
the runner take from it. Each row reads like docs/agents.md."""

from __future__ import annotations

import datetime
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from agentrun_operator.agents import agent_status

from agentrun import agents, effects
from agentrun.vocabulary import MCP_HEADER_ENV_PREFIX, AgentReason, Condition

NS = "support"
CRM = {"name": "crm", "url": "http://crm-mcp.support.svc:8080/mcp",
       "headers": [{"name": "Authorization",
                    "valueFrom": {"secretKeyRef": {"name": "crm", "key": "token"}}},
                   {"name": "X-Team", "value": "support"}],
       "toolFilter": ["lookup_customer", "update_ticket"]}
TRIAGE = {"model": "gemini-2.5-flash", "instruction": "Look the customer up first.",
          "mcpServers": [CRM], "subAgents": [{"name": "billing"}],
          "effects": [{"name": "update_ticket", "effect": "Idempotent", "approval": "Required"}]}
BILLING = {"instruction": "Answer billing questions.", "tools": [{"function": "my_tools.refund"}]}


def with_(**changes: Any) -> dict[str, Any]:
    return {**TRIAGE, **changes}


# (case, the namespace's Agents, the problem said, or None when it resolves)
CASES: list[tuple[str, dict[str, dict[str, Any]], str | None]] = [
    ("an Agent and its sub-agent", {"triage": TRIAGE, "billing": BILLING}, None),
    ("no Agent of that name", {"billing": BILLING}, "there is no Agent triage in namespace"),
    ("a sub-agent that does not exist", {"triage": TRIAGE},
     "names the sub-agent billing, which does not exist in namespace support"),
    ("an Agent that is its own sub-agent",
     {"triage": with_(subAgents=[{"name": "triage"}])}, "loop (triage -> triage)"),
    ("sub-agents in a loop",
     {"triage": TRIAGE, "billing": {**BILLING, "subAgents": [{"name": "triage"}]}},
     "loop (triage -> billing -> triage)"),
    ("a sub-agent with two parents",
     {"triage": with_(subAgents=[{"name": "billing"}, {"name": "refunds"}]),
      "billing": {**BILLING, "subAgents": [{"name": "ledger"}]},
      "refunds": {"subAgents": [{"name": "ledger"}]}, "ledger": {}},
     "Agent ledger is a sub-agent of both billing and refunds"),
    ("a tool entry with both a builtin and a function",
     {"triage": with_(tools=[{"builtin": "google_search", "function": "x.y"}]),
      "billing": BILLING}, "tools[0] needs exactly one of builtin and function"),
    ("an unknown built-in", {"triage": with_(tools=[{"builtin": "shell"}]), "billing": BILLING},
     "names the built-in 'shell'"),
    ("a function that is not module.name",
     {"triage": TRIAGE, "billing": {**BILLING, "tools": [{"function": "refund"}]}},
     "Agent billing is invalid: tools[0] names the function 'refund'"),
    ("an MCP server that is not HTTP",
     {"triage": with_(mcpServers=[{**CRM, "url": "stdio://npx"}]), "billing": BILLING},
     "mcpServers crm needs an http:// or https:// url"),
    ("a header both plain and from a Secret",
     {"triage": with_(mcpServers=[{**CRM, "headers": [
         {"name": "Authorization", "value": "x",
          "valueFrom": {"secretKeyRef": {"name": "crm", "key": "token"}}}]}]),
      "billing": BILLING}, "header Authorization needs exactly one of value and valueFrom"),
    ("the idempotency key header set by hand",
     {"triage": with_(mcpServers=[{**CRM, "headers": [{"name": "idempotency-key",
                                                        "value": "1"}]}]), "billing": BILLING},
     "sets the header idempotency-key, which agentrun sets on every call"),
    ("one tool, two effects in one tree",
     {"triage": TRIAGE, "billing": {**BILLING, "effects": [{"name": "update_ticket",
                                                             "effect": "Effectful"}]}},
     "Agents triage and billing say different effects or approvals for the tool update_ticket"),
    ("an effect that is no effect class",
     {"triage": with_(effects=[{"name": "x", "effect": "Harmless"}]), "billing": BILLING},
     "effects x: effect must be one of ReadOnly, Idempotent, Effectful"),
    ("an output schema that is no object",
     {"triage": with_(outputSchema=["priority"]), "billing": BILLING},
     "outputSchema must be a JSON Schema object"),
    ("the ADK name user", {"user": {"model": "m"}}, "ADK reserves the agent name user"),
]


@pytest.mark.parametrize(("agents_of", "problem"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_resolve(agents_of: dict[str, dict[str, Any]], problem: str | None) -> None:
    root = "user" if "user" in agents_of else "triage"
    found = agents.resolve(root, agents_of, NS)
    if problem is None:
        assert found.valid and found.problem is None
        assert found.snapshot == {"root": "triage", "agents": {"triage": TRIAGE,
                                                               "billing": BILLING}}
        assert found.digest == agents.snapshot_digest(found.snapshot)
    else:
        assert not found.valid and found.snapshot is None and found.digest is None
        assert found.problem is not None and problem in found.problem, found.problem


def test_the_digest_is_of_the_definition_not_of_how_it_was_written() -> None:
    one = agents.resolve("triage", {"triage": TRIAGE, "billing": BILLING}, NS)
    reordered = agents.resolve("triage", {"billing": dict(reversed(BILLING.items())),
                                          "triage": dict(reversed(TRIAGE.items()))}, NS)
    edited = agents.resolve("triage", {"triage": with_(instruction="Be brief."),
                                       "billing": BILLING}, NS)
    sub_edited = agents.resolve("triage", {"triage": TRIAGE,
                                           "billing": {**BILLING, "instruction": "x"}}, NS)
    assert one.digest == reordered.digest
    assert len({one.digest, edited.digest, sub_edited.digest}) == 3
    assert str(one.digest).startswith("sha256:")
    # An Agent its tree does not reach is not in the snapshot.
    assert agents.resolve("triage", {"triage": TRIAGE, "billing": BILLING, "other": {}},
                          NS).digest == one.digest


@pytest.mark.parametrize(("root_model", "run_model", "problem"), [
    ("gemini-2.5-flash", None, None),
    (None, "scripted", None),
    (None, None, "Agent triage has no spec.model and the run sets no spec.model"),
])
def test_a_run_needs_a_model_from_the_agent_or_itself(
        root_model: str | None, run_model: str | None, problem: str | None) -> None:
    spec = {k: v for k, v in TRIAGE.items() if k != "model"}
    if root_model:
        spec["model"] = root_model
    resolution = agents.resolve("triage", {"triage": spec, "billing": BILLING}, NS)
    said = agents.launch_problem(resolution, run_model)
    assert said == problem if problem is None else problem in str(said)


def test_secret_headers_become_env_from_the_secret_never_values() -> None:
    snapshot = agents.resolve("triage", {"triage": TRIAGE, "billing": BILLING}, NS).snapshot
    assert snapshot is not None
    (ref,) = agents.secret_refs(snapshot)
    assert (ref.agent, ref.server, ref.header, ref.secret, ref.key) == (
        "triage", "crm", "Authorization", "crm", "token")
    assert ref.env.startswith(MCP_HEADER_ENV_PREFIX)
    assert ref.env == agents.header_env("triage", "crm", "authorization")  # HTTP: any case
    assert ref.env != agents.header_env("billing", "crm", "Authorization")
    assert agents.secret_env(snapshot) == [
        {"name": ref.env, "valueFrom": {"secretKeyRef": {"name": "crm", "key": "token"}}}]


def test_tool_rules_are_the_agents_effects_and_the_builtins() -> None:
    spec = with_(tools=[{"builtin": "load_memory"}])
    snapshot = agents.resolve("triage", {"triage": spec, "billing": BILLING}, NS).snapshot
    assert snapshot is not None
    assert agents.tool_rules(snapshot) == [
        {"name": "load_memory", "effect": effects.READ_ONLY},
        {"name": "update_ticket", "effect": "Idempotent", "approval": "Required"}]


@pytest.mark.parametrize(("name", "ident"), [
    ("triage", "triage"), ("support-agent", "support_agent"), ("1st-line", "agent_1st_line")])
def test_adk_names(name: str, ident: str) -> None:
    assert agents.identifier(name) == ident and ident.isidentifier()


# -- the Agent's status (operator/agentrun_operator/agents.py) ------------------------------

NOW = datetime.datetime(2026, 12, 1, 10, 0, tzinfo=datetime.UTC)


def _conditions(status: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}


@pytest.mark.parametrize(("agents_of", "missing", "ready", "stalled", "digest"), [
    ({"triage": TRIAGE, "billing": BILLING}, [], ("True", AgentReason.VALID), ("False", "Valid"),
     True),
    ({"triage": TRIAGE}, [], ("False", AgentReason.INVALID), ("True", AgentReason.INVALID),
     False),
    ({"triage": TRIAGE, "billing": BILLING}, ["Secret crm has no key token"],
     ("False", AgentReason.SECRET_NOT_FOUND), ("True", AgentReason.SECRET_NOT_FOUND), True),
], ids=["valid", "a sub-agent missing", "a Secret missing"])
def test_agent_status(agents_of: dict[str, dict[str, Any]], missing: list[str],
                      ready: tuple[str, str], stalled: tuple[str, str], digest: bool) -> None:
    resolution = agents.resolve("triage", agents_of, NS)
    status = agent_status(resolution, missing, generation=3, now=NOW, previous={})
    found = _conditions(status)
    assert found[Condition.READY] == ready
    assert found[Condition.STALLED] == stalled
    assert found[Condition.RECONCILING] == ("False", ready[1])
    assert status["observedGeneration"] == 3
    assert (status.get("digest") is not None) == digest
    if missing:
        assert "Secret crm has no key token" in status["conditions"][0]["message"]


# -- what the pod and the runner take from a snapshot -----------------------------------------


def test_the_runner_pod_takes_secret_headers_from_the_secrets_after_the_users_env() -> None:
    from agentrun_operator.config import OperatorConfig
    from agentrun_operator.pods import runner_pod

    snapshot = agents.resolve("triage", {"triage": TRIAGE, "billing": BILLING}, NS).snapshot
    assert snapshot is not None
    (ref,) = agents.secret_refs(snapshot)
    run = {"metadata": {"name": "look-42", "namespace": NS, "uid": "u-1"},
           "spec": {"agent": "triage", "input": {"text": "hi"},
                    "env": [{"name": ref.env, "value": "Bearer forged"}]}}
    pod = runner_pod(run, 1, "u-1-1", "hmac-sha256:ab", OperatorConfig(database_url="x"),
                     agent_digest="sha256:cd", agent_env=agents.secret_env(snapshot))
    env = pod["spec"]["containers"][0]["env"]
    # A later duplicate wins in a pod: the run's creator cannot set what the header carries.
    last = {e["name"]: e for e in env}
    assert last[ref.env] == {"name": ref.env, "valueFrom": {"secretKeyRef": {
        "name": "crm", "key": "token"}}}
    assert last["AGENTRUN_AGENT_DIGEST"]["value"] == "sha256:cd"
    plain = runner_pod(run, 1, "u-1-1", "hmac-sha256:ab", OperatorConfig(database_url="x"))
    assert {e["name"]: e for e in plain["spec"]["containers"][0]["env"]}[
        "AGENTRUN_AGENT_DIGEST"]["value"] == ""


def test_the_runner_maps_every_builtin_to_adks_own_object() -> None:
    from agentrun_runner.declarative import BUILTIN_TOOLS, builtin_tool
    from google.adk.tools.base_tool import BaseTool

    assert set(BUILTIN_TOOLS) == set(agents.BUILTINS)
    assert all(isinstance(builtin_tool(name), BaseTool) for name in agents.BUILTINS)


def test_an_mcp_call_carries_the_key_of_the_call_the_ledger_lets_run() -> None:
    from agentrun_runner.declarative import call_key_header
    from agentrun_runner.ledger import CALL_KEY

    assert call_key_header(None) == {}  # type: ignore[arg-type]  # the tool listing: none
    token = CALL_KEY.set("agentrun-abc")
    try:
        assert call_key_header(None) == {"Idempotency-Key": "agentrun-abc"}  # type: ignore[arg-type]
    finally:
        CALL_KEY.reset(token)


def _cel_function_modules() -> set[str]:
    """The module names the Agent CRD's CEL rule on spec.tools[].function refuses."""
    crd = yaml.safe_load((Path(__file__).resolve().parents[2] / "crds" /
                          "agentrun.dev_agents.yaml").read_text())
    function = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"][
        "properties"]["tools"]["items"]["properties"]["function"]
    (rule,) = [v["rule"] for v in function["x-kubernetes-validations"]]
    assert rule.replace(" ", "").replace("\n", "").startswith("!(self.split('.')[0]in[")
    return set(re.findall(r"'([A-Za-z_][A-Za-z0-9_]*)'", rule))


def _python_3_11_stdlib() -> set[str]:
    """sys.stdlib_module_names of Python 3.11: this interpreter's when it is one, else a
    python3.11 on PATH asked for it."""
    if sys.version_info[:2] == (3, 11):
        return set(sys.stdlib_module_names)
    found = shutil.which("python3.11")
    if found is None:
        pytest.skip("no Python 3.11 here to generate the list from (the project's own "
                    "Python is 3.11: make venv)")
    done = subprocess.run([found, "-c", "import sys, json; "
                           "print(json.dumps(sorted(sys.stdlib_module_names)))"],
                          capture_output=True, text=True, check=True, timeout=60)
    return set(json.loads(done.stdout))


def test_the_crd_refuses_the_standard_library_of_python_3_11() -> None:
    generated = _python_3_11_stdlib()
    assert set(agents.STDLIB_MODULES) == generated
    assert _cel_function_modules() == generated
    assert {"builtins", "os", "subprocess", "_posixsubprocess"} <= generated


@pytest.mark.parametrize("function", ["subprocess.getoutput", "os.getenv", "builtins.exec",
                                      "os.path.join", "_posixsubprocess.fork_exec"])
def test_a_standard_library_function_is_no_tool(function: str) -> None:
    found = agents.problems_of("triage", {"tools": [{"function": function}]})
    assert found == [f"tools[0] names the function {function}, of Python's standard "
                     "library: a function tool is one the runner image's agents directory "
                     "defines and marks as a tool (docs/agents.md)"]
    resolution = agents.resolve("triage", {"triage": {"tools": [{"function": function}]}}, "ns")
    assert resolution.problem is not None and function in resolution.problem
    assert agents.problems_of("triage", {"tools": [{"function": "sample_tools.lookup"}]}) == []


def test_an_agent_the_runner_image_refused_is_not_ready() -> None:
    resolution = agents.resolve("triage", {"triage": TRIAGE, "billing": BILLING}, NS)
    said = ("Agent triage cannot be built in this runner: the function my_tools.refund is "
            "not a tool of the runner image. No tool was called.")
    status = agent_status(resolution, [], generation=3, now=NOW, previous={}, refused=said)
    assert _conditions(status)[Condition.READY] == ("False", AgentReason.INVALID)
    assert _conditions(status)[Condition.STALLED] == ("True", AgentReason.INVALID)
    message = status["conditions"][0]["message"]
    assert said in message and "my_tools.refund" in message
    assert status["digest"] == resolution.digest  # the snapshot the refusal is of
    # A missing Secret says what to do first only when the image has not refused it.
    missing = agent_status(resolution, ["Secret crm has no key token"], generation=3,
                           now=NOW, previous={}, refused=said)
    assert _conditions(missing)[Condition.READY] == ("False", AgentReason.INVALID)
