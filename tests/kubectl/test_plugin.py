"""`kubectl agentrun replay|tools|why`, run through kubectl itself (the plugin found on
PATH as kubectl-agentrun), against the session's cluster, operator and store."""

from __future__ import annotations

from agentrun.vocabulary import ANNOTATION_FORCE_REPLAY
from tests.harness import System
from tests.kubectl_plugin import plugin
from tests.replays import evicted_after_send_email, get_replay, start


def test_tools_replay_and_why(system: System, namespace: str) -> None:
    evicted_after_send_email(system, namespace, "plugged", delay=15)

    tools = plugin(system, "tools", "plugged", "-n", namespace)
    assert tools.returncode == 0, tools.stderr
    assert "AgentRun plugged: Failed (Evicted), attempts 1, toolsExecuted: send_email" in (
        tools.stdout)
    ledger = [line.split() for line in tools.stdout.splitlines()[1:]]
    assert ledger[0][:3] == ["ATTEMPT", "#", "TOOL"]
    assert (ledger[1][0], ledger[1][2]) == ("1", "send_email")
    assert "no (called, never answered)" in tools.stdout

    refused = plugin(system, "replay", "plugged", "-n", namespace, "--name", "plugged-again",
                     "--note", "customer says nothing arrived")
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "agentrunreplay/plugged-again created" in refused.stdout
    assert "AgentRunReplay plugged-again of AgentRun plugged: Refused (ToolsExecuted)" in (
        refused.stdout)
    assert "already called send_email before failing" in refused.stdout
    assert "note:           customer says nothing arrived" in refused.stdout

    forced = plugin(system, "replay", "plugged", "-n", namespace, "--name", "plugged-again",
                    "--force")
    assert forced.returncode == 0, forced.stdout + forced.stderr
    assert f"agentrunreplay/plugged-again annotated {ANNOTATION_FORCE_REPLAY}=true" in (
        forced.stdout)
    assert "Approved (Forced)" in forced.stdout
    run_name = get_replay(system, namespace, "plugged-again")["status"]["replayRunName"]
    assert f"replay run:     {run_name}" in forced.stdout

    why = plugin(system, "why", "plugged-again", "-n", namespace)
    assert why.returncode == 0, why.stderr
    assert "Approved (Forced)" in why.stdout
    assert f"force:          {ANNOTATION_FORCE_REPLAY}=true" in why.stdout
    assert "tools executed: send_email (by plugged, at decision time)" in why.stdout

    missing = plugin(system, "why", "nope", "-n", namespace)
    assert missing.returncode == 2
    assert f"AgentRunReplay nope does not exist in namespace {namespace}" in missing.stderr


def test_tools_without_a_database_credential(system: System, namespace: str) -> None:
    """The ledger the operator published on the settled run (status.toolCalls) is what
    `tools` shows with no DATABASE_URL: the same rows as the store's."""
    evicted_after_send_email(system, namespace, "published", delay=15)
    from_store = plugin(system, "tools", "published", "-n", namespace)
    published = plugin(system, "tools", "published", "-n", namespace, store=False)
    assert published.returncode == 0, published.stderr
    assert "toolsExecuted: send_email" in published.stdout

    def rows(text: str) -> list[list[str]]:
        # attempt, #, tool, effect, key, ended (the called-at stamp is shown to the second
        # from both)
        return [line.split()[:5] + line.split()[6:] for line in text.splitlines()[1:]]

    assert rows(published.stdout) == rows(from_store.stdout)
    assert "no (called, never answered): in doubt" in published.stdout


def test_tools_of_a_live_run_without_a_database_credential(system: System,
                                                           namespace: str) -> None:
    start(system, namespace, "still-going", [{"sleep": 60}, {"text": "done"}])
    shown = plugin(system, "tools", "still-going", "-n", namespace, store=False)
    assert shown.returncode == 2, shown.stdout + shown.stderr
    assert "published on the run when it settles" in shown.stderr
    assert "DATABASE_URL" in shown.stderr
