"""The Agent CRD on a real kube-apiserver: its names, its columns, and the rules that refuse
a definition before anything reads it (each message says what to fix)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agentrun.vocabulary import AGENT_KIND, AGENT_PLURAL, API_VERSION, GROUP
from tests.crds.kube import Kubectl, apply, refused, stored

pytestmark = pytest.mark.cluster

CRM = {"name": "crm", "url": "http://crm-mcp:8080/mcp"}


def agent(name: str = "triage", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": AGENT_KIND, "metadata": {"name": name},
            "spec": {"instruction": "Look the customer up.", **spec}}


def test_the_agent_crd_is_served_as_the_vocabulary_names_it(crds: Kubectl) -> None:
    crd = json.loads(crds.kubectl("get", "crd", f"{AGENT_PLURAL}.{GROUP}", "-o",
                                  "json").stdout)
    assert crd["spec"]["names"]["kind"] == AGENT_KIND and crd["spec"]["scope"] == "Namespaced"
    assert "agentrun-all" in crd["spec"]["names"]["categories"]


def test_a_full_agent_is_stored_as_written(crds: Kubectl, namespace: str) -> None:
    spec = {"model": "gemini-2.5-flash", "description": "Answers refunds",
            "outputSchema": {"type": "object", "properties": {"priority": {"type": "string"}}},
            "tools": [{"builtin": "google_search"}, {"function": "my_tools.lookup"}],
            "mcpServers": [{**CRM, "toolFilter": ["lookup_customer"], "headers": [
                {"name": "Authorization",
                 "valueFrom": {"secretKeyRef": {"name": "crm", "key": "token"}}},
                {"name": "X-Team", "value": "support"}]}],
            "effects": [{"name": "update_ticket", "effect": "Idempotent",
                         "approval": "Required", "approvalTimeoutSeconds": 600}],
            "subAgents": [{"name": "billing"}]}
    done = apply(crds, namespace, agent(**spec))
    assert done.returncode == 0, done.stderr
    found = stored(crds, namespace, "agent/triage")
    assert found["spec"] == {"instruction": "Look the customer up.", **spec}
    header = crds.kubectl("get", "agents", "-n", namespace).stdout.splitlines()[0].split()
    assert header == ["NAME", "MODEL", "READY", "REASON", "AGE"]


@pytest.mark.parametrize(("spec", "name", "said"), [
    ({"tools": [{"builtin": "google_search", "function": "a.b"}]}, "triage",
     "each entry of spec.tools names exactly one of builtin and function"),
    ({"tools": [{"builtin": "shell"}]}, "triage", "Unsupported value: \"shell\""),
    ({"tools": [{"function": "lookup"}]}, "triage", "spec.tools[0].function"),
    ({"mcpServers": [{**CRM, "url": "file:///etc/passwd"}]}, "triage",
     "spec.mcpServers[0].url"),
    ({"mcpServers": [{**CRM, "headers": [{"name": "Authorization"}]}]}, "triage",
     "each header has exactly one of value and valueFrom"),
    ({"mcpServers": [{**CRM, "headers": [{"name": "Idempotency-Key", "value": "1"}]}]},
     "triage", "Idempotency-Key is set by agentrun on every MCP call"),
    ({"effects": [{"name": "x"}]}, "triage",
     "each entry of spec.effects says an effect, an approval, or both"),
    ({"subAgents": [{"name": "other-ns/billing"}]}, "triage", "spec.subAgents[0].name"),
    ({}, "triage.v2", "an Agent's name is what AgentRun spec.agent names"),
], ids=["builtin and function", "unknown built-in", "function not module.name",
        "not HTTP", "header without a value", "the key header", "effect without either",
        "a sub-agent of another namespace", "a name no run can say"])
def test_a_definition_that_cannot_run_is_refused(crds: Kubectl, namespace: str,
                                                 spec: dict[str, Any], name: str,
                                                 said: str) -> None:
    assert said in refused(apply(crds, namespace, agent(name, **spec)))


STDLIB_REFUSED = ("spec.tools[].function names a module of Python's standard library: a "
                  "function tool is one the runner image's agents directory defines and "
                  "marks as a tool (docs/agents.md)")


@pytest.mark.parametrize("function", ["subprocess.getoutput", "os.getenv", "builtins.exec",
                                      "os.path.join", "_posixsubprocess.fork_exec"])
def test_a_function_of_the_standard_library_is_refused_at_admission(
        crds: Kubectl, namespace: str, function: str) -> None:
    said = refused(apply(crds, namespace, agent(tools=[{"function": "sample_tools.ok"},
                                                       {"function": function}])))
    assert "spec.tools[1].function" in said and STDLIB_REFUSED in said, said


def test_every_module_of_the_standard_library_is_refused_at_admission(
        crds: Kubectl, namespace: str) -> None:
    """The CEL rule holds all of Python 3.11's sys.stdlib_module_names (tests/library keeps
    agents.STDLIB_MODULES equal to it): each is tried on the API server, an Agent of 32
    tools (the most spec.tools holds) at a time, and every one is refused by name."""
    from agentrun.agents import STDLIB_MODULES

    modules = sorted(STDLIB_MODULES)
    for start in range(0, len(modules), 32):
        batch = modules[start:start + 32]
        said = refused(crds.kubectl(
            "create", "--dry-run=server", "-n", namespace, "-f", "-",
            input=json.dumps(agent(tools=[{"function": f"{m}.anything"} for m in batch])),
            check=False))
        missing = [m for i, m in enumerate(batch)
                   if f'spec.tools[{i}].function: Invalid value: "{m}.anything": '
                   f"{STDLIB_REFUSED}" not in said]
        assert not missing, said


def test_a_module_named_like_the_standard_library_only_in_part_is_stored(
        crds: Kubectl, namespace: str) -> None:
    # The rule is on the top-level module: these merely begin or end like one.
    tools = [{"function": "os_tools.getenv"}, {"function": "my.os.getenv"},
             {"function": "subprocesses.run"}]
    apply(crds, namespace, agent(tools=tools), check=True)
    assert stored(crds, namespace, "agent/triage")["spec"]["tools"] == tools
