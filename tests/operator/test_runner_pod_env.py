"""The runner pod's env keeps every Secret out of reach of `$(VAR)` (api.md, "Tenant
policy: No expansion into Secrets"): the operator's own variables first, tenant-derived
values among them escaped; the run's spec.env next; every valueFrom Secret last. What the
kubelet makes of the manifest is asked of the kubelet's own expansion (peers.expand)."""

from __future__ import annotations

from typing import Any

import pytest
from agentrun_devtools import peers
from agentrun_operator.config import OperatorConfig
from agentrun_operator.pods import escape_expansion, runner_pod, session_id_for

HEADER = "AGENTRUN_MCP_HEADER_0123456789ABCDEF"
HEADER_ENV = [{"name": HEADER, "valueFrom": {"secretKeyRef": {"name": "crm", "key": "token"}}}]
SECRET = "s3cr3t-token"


def _run(**spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "look-42", "namespace": "team-a", "uid": "u-1"},
            "spec": {"agent": "triage", "input": {"text": "hi"}, **spec}}


def _pod(run: dict[str, Any]) -> dict[str, Any]:
    return runner_pod(run, 1, session_id_for(run, 1), "hmac-sha256:ab",
                      OperatorConfig(database_url="x", extra_runner_env={"EXTRA": "$(X)"}),
                      agent_digest="sha256:cd", agent_env=HEADER_ENV)


def _kubelet(container: dict[str, Any]) -> dict[str, str]:
    """The env the container gets, the Secret resolved to SECRET, as a kubelet makes it."""
    listed = [(e["name"], SECRET, True) if "valueFrom" in e else (e["name"], e["value"], False)
              for e in container["env"]]
    return dict(peers.expand(listed, container["command"], container.get("args") or []).env)


def test_escape_expansion() -> None:
    assert escape_expansion("plain") == "plain"
    assert escape_expansion("$(A)") == "$$(A)"
    assert escape_expansion("$$(A) $") == "$$$$(A) $$"


def test_operator_vars_first_then_spec_env_then_every_secret_last() -> None:
    user_secret = {"name": "MINE", "valueFrom": {"secretKeyRef": {"name": "own", "key": "k"}}}
    run = _run(model="$(" + HEADER + ")", userId="u$(A)",
               env=[user_secret, {"name": "GREETING", "value": "in $(AGENTRUN_NAMESPACE)"},
                    {"name": "LATE", "value": "$(MINE)"}])
    env = _pod(run)["spec"]["containers"][0]["env"]
    names = [e["name"] for e in env]
    # Ours first (the chart's extra env, then the run's identity) ...
    assert names[0] == "EXTRA"
    ours = names[:names.index("GREETING")]
    assert {"AGENTRUN_MODEL", "AGENTRUN_RUN_NAME", "AGENTRUN_TOOLS"} <= set(ours)
    # ... then spec.env's values, in their order, then every valueFrom Secret: the run's
    # own, then the Agent's header.
    assert names[len(ours):] == ["GREETING", "LATE", "MINE", HEADER]
    assert all("valueFrom" not in e for e in env[:len(ours) + 2])
    by_name = {e["name"]: e for e in env}
    assert by_name["AGENTRUN_MODEL"]["value"] == "$$(" + HEADER + ")"
    assert by_name["AGENTRUN_USER_ID"]["value"] == "u$$(A)"


def test_the_kubelet_gives_the_runner_the_tenants_text_and_no_secret() -> None:
    run = _run(model=f"$({HEADER})", userId=f"$({HEADER})", sessionId=f"s-$({HEADER})",
               tools=[{"name": f"$({HEADER})", "effect": "ReadOnly"}],
               env=[{"name": "PROBE", "value": f"$({HEADER})"},
                    {"name": "NS", "value": "ns=$(AGENTRUN_NAMESPACE)"}])
    container = _pod(run)["spec"]["containers"][0]
    seen = _kubelet(container)
    assert seen["AGENTRUN_MODEL"] == f"$({HEADER})"
    assert seen["AGENTRUN_USER_ID"] == f"$({HEADER})"
    assert seen["AGENTRUN_SESSION_ID"] == f"s-$({HEADER})"
    assert HEADER in seen["AGENTRUN_TOOLS"]
    # spec.env still composes from what precedes it, and the header is not among that.
    assert seen["NS"] == "ns=team-a"
    assert seen["PROBE"] == f"$({HEADER})"
    assert [n for n, v in seen.items() if SECRET in v] == [HEADER]
    # Nothing the tenant wrote is in command or args, which see every variable.
    assert container["command"] == ["agentrun-runner"]
    assert "args" not in container


def test_a_spec_env_duplicate_of_ours_or_of_a_header_is_left_out() -> None:
    run = _run(env=[{"name": HEADER, "value": "Bearer forged"},
                    {"name": "AGENTRUN_RUN_NAME", "value": "another-run"},
                    {"name": "EXTRA", "value": "mine"}])
    env = _pod(run)["spec"]["containers"][0]["env"]
    assert [e["name"] for e in env].count(HEADER) == 1
    seen = _kubelet(_pod(run)["spec"]["containers"][0])
    assert seen["AGENTRUN_RUN_NAME"] == "look-42"
    assert seen["EXTRA"] == "$(X)"
    assert seen[HEADER] == SECRET


def test_the_charts_tool_policy_reaches_every_runner_and_is_checked_at_start(
        capsys: pytest.CaptureFixture[str]) -> None:
    from agentrun_operator import config

    elsewhere = ["--store-api-listen=", "--store-api-url=https://store:8080",
                 "--database-url=sqlite:///x"]
    chart = '[{"name":"charge_card","approval":"Required"}]'
    parsed = config.parse([*elsewhere, f"--tool-policy={chart}"])
    assert parsed.tool_policy == chart
    run = _run(tools=[{"name": "x", "effect": "ReadOnly"}])
    pod = runner_pod(run, 1, session_id_for(run, 1), "hmac-sha256:ab", parsed)
    seen = _kubelet(pod["spec"]["containers"][0])
    assert seen["AGENTRUN_TOOL_POLICY"] == chart
    # A run cannot set it: ours come first, and a spec.env entry of that name is left out.
    forged = _run(env=[{"name": "AGENTRUN_TOOL_POLICY", "value": "[]"}])
    env = runner_pod(forged, 1, session_id_for(forged, 1), "hmac-sha256:ab",
                     parsed)["spec"]["containers"][0]["env"]
    assert [e["value"] for e in env if e["name"] == "AGENTRUN_TOOL_POLICY"] == [chart]
    with pytest.raises(SystemExit):
        config.parse([*elsewhere, '--tool-policy=[{"name": "x", "approval": "Maybe"}]'])
    assert "--tool-policy: entry x: approval must be Required or None" in (
        capsys.readouterr().err)
