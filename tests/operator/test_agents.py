"""Declarative agents end to end: Agents reconciled by the operator, runs that pin their
snapshot at launch, real runners calling a real MCP server (the `mcp` SDK's FastMCP over
streamable HTTP, samples/declarative/crm_mcp.py, started by the test) through the ledger,
evictions and resumes, replays of a run whose Agent changed since, two namespaces, and
the admission of an Agent's Secrets."""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agentrun_devtools.processes import wait_for

from agentrun import agents, effects, store
from agentrun.vocabulary import (
    ANNOTATION_FORCE_REPLAY,
    GROUP,
    VERSION,
    AgentReason,
    Condition,
    Phase,
    Reason,
    ReplayReason,
)
from tests import kstatus
from tests.harness import System, agent_run, as_operator, delete_namespace, in_namespace
from tests.mcp_server import CrmServer, crm_server

AGENTS = f"agents.{GROUP}"
LOOKUP = [{"call": "lookup_customer", "args": {"customer": "42"}},
          {"text": "Ada Lovelace is on the pro plan."}]
RESUME = {"maxAttempts": 2, "resume": True}


@pytest.fixture
def crm(tmp_path: Path) -> Iterator[CrmServer]:
    with crm_server(tmp_path / "crm") as server:
        yield server


def agent(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Agent",
            "metadata": {"name": name}, "spec": spec}


def triage(url: str, **spec: Any) -> dict[str, Any]:
    return agent("triage", **{"description": "Answers customer refund requests",
                              "instruction": "Look the customer up before you answer.",
                              "mcpServers": [{"name": "crm", "url": url}], **spec})


def ready(system: System, namespace: str, name: str, reason: str = AgentReason.VALID,
          generation: int | None = None) -> dict[str, Any]:
    """The Agent once its Ready condition says `reason` (for `generation`, if given)."""
    found: dict[str, Any] = {}

    def said() -> bool:
        nonlocal found
        found = system.get(AGENTS, namespace, name) or {}
        status = found.get("status") or {}
        conditions = {c["type"]: c for c in status.get("conditions") or []}
        return (Condition.READY in conditions
                and conditions[Condition.READY]["reason"] == reason
                and status.get("observedGeneration") == (
                    generation or found["metadata"]["generation"]))

    try:
        wait_for(said, timeout=60, what=f"Agent {name} {reason}", interval=0.2)
    except TimeoutError as e:
        raise AssertionError(f"{e}: {json.dumps(found.get('status'))}") from e
    return found


def conditions(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in obj["status"].get("conditions") or []}


def settled(system: System, namespace: str, name: str, timeout: float = 120) -> dict[str, Any]:
    return system.wait_run(namespace, name, lambda r: (r.get("status") or {}).get("phase") in (
        Phase.SUCCEEDED, Phase.FAILED) and r["status"].get("toolsExecuted") is not None,
        timeout=timeout)["status"]


def ledger(system: System, run: dict[str, Any]) -> list[store.LedgerEntry]:
    return system.store(lambda e: store.ledger(e, run["metadata"]["uid"]))


def replay_run(system: System, namespace: str, replay: str) -> dict[str, Any]:
    """The settled status of the run an approved AgentRunReplay created."""
    def created() -> bool:
        found = system.get(f"agentrunreplays.{GROUP}", namespace, replay) or {}
        return bool((found.get("status") or {}).get("replayRunName"))

    wait_for(created, timeout=60, what=f"the run of {replay}")
    found = system.get(f"agentrunreplays.{GROUP}", namespace, replay)
    assert found is not None
    return settled(system, namespace, found["status"]["replayRunName"])


def pods_of(system: System, namespace: str, run: str) -> list[str]:
    done = system.kubectl("get", "pods", "-n", namespace, "-l", f"agentrun.dev/run={run}",
                          "-o", "json")
    return [p["metadata"]["name"] for p in json.loads(done.stdout)["items"]]


def test_a_read_only_mcp_tool_is_called_once_and_the_ledger_says_read_only(
        system: System, namespace: str, crm: CrmServer) -> None:
    system.kubectl("create", "secret", "generic", "crm", "-n", namespace,
                   "--from-literal=token=Bearer crm-s3cret")
    system.apply(in_namespace(triage(crm.url, mcpServers=[{
        "name": "crm", "url": crm.url, "toolFilter": ["lookup_customer", "update_ticket"],
        "headers": [{"name": "Authorization",
                     "valueFrom": {"secretKeyRef": {"name": "crm", "key": "token"}}}]}]),
        namespace))
    defined = ready(system, namespace, "triage")
    assert conditions(defined)[Condition.STALLED]["status"] == "False"
    assert kstatus.compute(defined).status == kstatus.CURRENT  # cli-utils' own verdict
    system.apply(in_namespace(agent_run("look-42", LOOKUP, agent="triage"), namespace))
    status = settled(system, namespace, "look-42")
    assert status["phase"] == Phase.SUCCEEDED, status
    assert status["toolsExecuted"] == ["lookup_customer"]
    # Pinned at launch: the digest the Agent says a run pins now.
    assert status["agentDigest"] == defined["status"]["digest"]
    (call,) = crm.calls()  # the server saw exactly one call
    assert call["tool"] == "lookup_customer"
    assert call["authorizationSha256"] == hashlib.sha256(b"Bearer crm-s3cret").hexdigest()
    run = system.run(namespace, "look-42")
    (entry,) = ledger(system, run)
    assert (entry.tool, entry.effect) == ("lookup_customer", effects.READ_ONLY)
    assert call["idempotencyKey"] == entry.idempotency_key
    assert [c["effect"] for c in status["toolCalls"]] == [effects.READ_ONLY]
    # The Secret's value is in no snapshot and no status: only its name and key are.
    snapshot = system.store(lambda e: store.get_agent(e, status["agentDigest"]))
    assert snapshot is not None and "crm-s3cret" not in json.dumps(snapshot)
    assert "crm-s3cret" not in json.dumps(run)


def test_an_in_doubt_destructive_call_refuses_the_resume(
        system: System, namespace: str, crm: CrmServer) -> None:
    system.apply(in_namespace(triage(crm.url), namespace))
    ready(system, namespace, "triage")
    script = [{"call": "close_account", "args": {"customer": "43", "delay_seconds": 15}},
              {"text": "Closed."}]
    system.apply(in_namespace(agent_run("close-43", script, agent="triage", retry=RESUME),
                              namespace))
    run = system.wait_phase(namespace, "close-43", Phase.RUNNING)
    system.wait_ledger(run["metadata"]["uid"], "close_account")
    wait_for(lambda: len(crm.calls("close_account")) == 1, timeout=30, what="the call")
    system.evict(namespace, "close-43-1")
    run = system.wait_run(namespace, "close-43", lambda r: (r.get("status") or {}).get(
        "phase") == Phase.FAILED and Condition.RESUMABLE in conditions(r))
    status = run["status"]
    assert (status["reason"], status["attempts"]) == (Reason.EVICTED, 1)
    resumable = conditions(run)[Condition.RESUMABLE]
    assert (resumable["status"], resumable["reason"]) == ("False",
                                                          ReplayReason.TOOL_CALL_IN_DOUBT)
    assert "close_account is Effectful" in resumable["message"]
    assert status["toolsExecuted"] == ["close_account"]
    assert len(crm.calls("close_account")) == 1  # not called again
    # Someone who checked forces a manual resume: the replay run continues a fork of the
    # session, on the original's snapshot, and makes the call again (with its key).
    system.apply({"apiVersion": f"{GROUP}/{VERSION}", "kind": "AgentRunReplay",
                  "metadata": {"name": "close-43-resume", "namespace": namespace,
                               "annotations": {ANNOTATION_FORCE_REPLAY: "true"}},
                  "spec": {"runName": "close-43", "resume": True}})
    resumed = replay_run(system, namespace, "close-43-resume")
    assert resumed["phase"] == Phase.SUCCEEDED, resumed
    assert resumed["agentDigest"] == status["agentDigest"]
    first, again = crm.calls("close_account")
    assert first["idempotencyKey"] == again["idempotencyKey"]


def test_an_in_doubt_idempotent_call_runs_again_with_the_same_key(
        system: System, namespace: str, crm: CrmServer) -> None:
    system.apply(in_namespace(triage(crm.url), namespace))
    ready(system, namespace, "triage")
    script = [{"call": "update_ticket", "args": {"ticket": "7", "status": "refunded",
                                                 "delay_seconds": 8}},
              {"text": "Ticket 7 is refunded."}]
    system.apply(in_namespace(agent_run("ticket-7", script, agent="triage", retry=RESUME),
                              namespace))
    run = system.wait_phase(namespace, "ticket-7", Phase.RUNNING)
    wait_for(lambda: len(crm.calls("update_ticket")) == 1, timeout=60, what="the call")
    system.evict(namespace, "ticket-7-1")
    status = settled(system, namespace, "ticket-7")
    assert status["phase"] == Phase.SUCCEEDED, status
    assert status["resumedAttempts"] == [2]
    first, again = crm.calls("update_ticket")
    assert first["idempotencyKey"] and first["idempotencyKey"] == again["idempotencyKey"]
    entries = [e for e in ledger(system, run) if e.tool == "update_ticket"]
    assert [(e.attempt, e.effect) for e in entries] == [(1, effects.IDEMPOTENT),
                                                         (2, effects.IDEMPOTENT)]
    assert {e.idempotency_key for e in entries} == {first["idempotencyKey"]}
    assert entries[1].result and entries[1].result["structuredContent"]["applied"] is False


def test_a_replay_runs_the_agent_its_original_ran_and_a_new_run_the_agent_as_it_is(
        system: System, namespace: str, tmp_path: Path) -> None:
    with crm_server(tmp_path / "v1") as v1, crm_server(tmp_path / "v2") as v2:
        system.apply(in_namespace(triage(v1.url), namespace))
        first = ready(system, namespace, "triage")["status"]["digest"]
        system.apply(in_namespace(agent_run("before", LOOKUP, agent="triage"), namespace))
        assert settled(system, namespace, "before")["agentDigest"] == first
        # The Agent changes in Git: another server, another instruction.
        system.apply(in_namespace(triage(v2.url, instruction="Be brief."), namespace))
        second = ready(system, namespace, "triage", generation=2)["status"]["digest"]
        assert second != first
        replay = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "AgentRunReplay",
                  "metadata": {"name": "before-again", "namespace": namespace,
                               "annotations": {ANNOTATION_FORCE_REPLAY: "true"}},
                  "spec": {"runName": "before"}}
        system.apply(replay)
        replayed = replay_run(system, namespace, "before-again")
        assert replayed["phase"] == Phase.SUCCEEDED, replayed
        assert replayed["agentDigest"] == first  # the original's snapshot, not the Agent's
        system.apply(in_namespace(agent_run("after", LOOKUP, agent="triage"), namespace))
        assert settled(system, namespace, "after")["agentDigest"] == second
        # What ran is what was pinned: the replay called v1's server, the new run v2's.
        assert (len(v1.calls()), len(v2.calls())) == (2, 1)


def test_a_launch_pins_the_agent_written_just_before_its_run_and_a_list_serves_a_burst(
        system: System, namespace: str, crm: CrmServer) -> None:
    """A launch resolves the Agent from a list the API server answered after its run was
    created: a list serves the runs created before it (no list per run in a burst), and a
    run created after an Agent changed, without waiting for the Agent's status, is
    launched with the change."""
    import asyncio

    from agentrun_operator.agents import pin

    before, after = triage(crm.url), triage(crm.url, instruction="Be brief.")
    system.apply(in_namespace(before, namespace))  # its status is not waited for
    for name in ("first", "second"):
        system.apply(in_namespace(agent_run(name, [{"text": "done"}], agent="triage"),
                                  namespace))
    first, second = system.run(namespace, "first"), system.run(namespace, "second")

    async def launches(ctx: Any) -> tuple[list[str | None], int, int]:
        lists: list[str] = []
        listing = ctx.kube.list_agents

        async def counted(ns: str) -> Any:
            lists.append(ns)
            return await listing(ns)

        ctx.kube.list_agents = counted
        pinned = [(await pin(ctx, first)).digest, (await pin(ctx, second)).digest]
        burst = len(lists)
        await asyncio.to_thread(system.apply, in_namespace(after, namespace))
        await asyncio.to_thread(system.apply, in_namespace(
            agent_run("third", [{"text": "done"}], agent="triage"), namespace))
        third = await asyncio.to_thread(system.run, namespace, "third")
        pinned.append((await pin(ctx, third)).digest)
        return pinned, burst, len(lists)

    pinned, burst, total = as_operator(system, launches)
    old = agents.resolve("triage", {"triage": before["spec"]}, namespace).digest
    new = agents.resolve("triage", {"triage": after["spec"]}, namespace).digest
    assert old is not None and new is not None and old != new
    assert pinned == [old, old, new]
    assert (burst, total) == (1, 2)  # the second run took the first's list; the third, its own


def test_a_run_uses_only_its_own_namespaces_agents(
        system: System, namespace: str, crm: CrmServer) -> None:
    other = f"{namespace}-other"
    system.kubectl("create", "namespace", other)
    try:
        system.apply(in_namespace(triage(crm.url), other))
        ready(system, other, "triage")
        # spec.agent is a name: there is no way to say another namespace's Agent.
        refused = system.kubectl("apply", "-f", "-", check=False, input=json.dumps(
            in_namespace(agent_run("elsewhere", LOOKUP, agent=f"{other}/triage"), namespace)))
        assert refused.returncode != 0 and "spec.agent must be" in refused.stderr
        # The same name in this namespace is no Agent of it, nor an agent of the image.
        system.apply(in_namespace(agent_run("look-here", LOOKUP, agent="triage"), namespace))
        status = settled(system, namespace, "look-here")
        assert (status["phase"], status["reason"]) == (Phase.FAILED, Reason.AGENT_NOT_FOUND)
        assert f"no Agent triage in namespace {namespace}" in status["message"]
        assert status["toolsExecuted"] == [] and "agentDigest" not in status
        assert crm.calls() == []
    finally:
        delete_namespace(system.plane, other)


def test_an_agent_may_name_only_secrets_its_creator_may_get(
        system: System, namespace: str, crm: CrmServer) -> None:
    system.kubectl("create", "secret", "generic", "crm", "-n", namespace,
                   "--from-literal=token=Bearer x")
    system.kubectl("create", "rolebinding", "sam-edit", "-n", namespace,
                   "--clusterrole=agentrun-edit", "--user=sam")
    manifest = in_namespace(triage(crm.url, mcpServers=[{
        "name": "crm", "url": crm.url, "headers": [
            {"name": "Authorization",
             "valueFrom": {"secretKeyRef": {"name": "crm", "key": "token"}}}]}]), namespace)
    refused = system.kubectl("create", "-f", "-", input=json.dumps(manifest), as_user="sam",
                             check=False)
    assert refused.returncode != 0
    assert ("Agent mcpServers crm header Authorization names Secret crm: sam may not get "
            f"secrets/crm in namespace {namespace}") in refused.stderr, refused.stderr
    # Without the Secret, the same user may create it; and with get on that one Secret,
    # with it.
    plain = in_namespace(triage(crm.url), namespace)
    done = system.kubectl("create", "-f", "-", input=json.dumps(plain), as_user="sam",
                          check=False)
    assert done.returncode == 0, done.stderr
    system.kubectl("create", "role", "crm-reader", "-n", namespace, "--verb=get",
                   "--resource=secrets", "--resource-name=crm")
    system.kubectl("create", "rolebinding", "sam-crm", "-n", namespace, "--role=crm-reader",
                   "--user=sam")
    wait_for(lambda: system.kubectl("apply", "-f", "-", input=json.dumps(manifest),
                                    as_user="sam", check=False).returncode == 0,
             timeout=30, what="the Agent admitted")


def test_an_agent_that_cannot_be_built_fails_its_runs_before_any_pod(
        system: System, namespace: str, crm: CrmServer) -> None:
    system.apply(in_namespace(triage(crm.url, subAgents=[{"name": "billing"}]), namespace))
    invalid = ready(system, namespace, "triage", AgentReason.INVALID)
    stalled = conditions(invalid)[Condition.STALLED]
    assert stalled["status"] == "True" and "sub-agent billing, which does not exist" in \
        stalled["message"]
    assert "digest" not in invalid["status"]
    verdict = kstatus.compute(invalid)
    assert (verdict.status, verdict.message) == (kstatus.FAILED, stalled["message"])
    system.apply(in_namespace(agent_run("no-billing", LOOKUP, agent="triage"), namespace))
    status = settled(system, namespace, "no-billing")
    assert (status["phase"], status["reason"]) == (Phase.FAILED, Reason.AGENT_INVALID)
    assert "names the sub-agent billing, which does not exist" in status["message"]
    assert "No pod was started" in status["message"]
    assert status["toolsExecuted"] == [] and pods_of(system, namespace, "no-billing") == []
    # Once the sub-agent exists, the Agent is valid again (the change queues its parent).
    system.apply(in_namespace(agent("billing", instruction="Answer billing questions."),
                              namespace))
    assert ready(system, namespace, "triage")["status"]["digest"]


def test_an_mcp_server_that_is_down_fails_the_run_before_any_tool(
        system: System, namespace: str) -> None:
    system.apply(in_namespace(triage("http://127.0.0.1:9/mcp"), namespace))
    ready(system, namespace, "triage")
    system.apply(in_namespace(agent_run("server-down", LOOKUP, agent="triage"), namespace))
    status = settled(system, namespace, "server-down")
    assert (status["phase"], status["reason"]) == (Phase.FAILED,
                                                    Reason.TOOL_SERVER_UNAVAILABLE)
    assert "MCP server crm of Agent triage (http://127.0.0.1:9/mcp) did not answer" in \
        status["message"]
    assert status["toolsExecuted"] == []


def test_an_agent_waits_for_its_secret(system: System, namespace: str, crm: CrmServer) -> None:
    name = f"crm-{uuid.uuid4().hex[:6]}"
    system.apply(in_namespace(triage(crm.url, mcpServers=[{
        "name": "crm", "url": crm.url, "headers": [
            {"name": "Authorization",
             "valueFrom": {"secretKeyRef": {"name": name, "key": "token"}}}]}]), namespace))
    waiting = ready(system, namespace, "triage", AgentReason.SECRET_NOT_FOUND)
    assert f"Secret {name} does not exist" in conditions(waiting)[Condition.READY]["message"]
    assert waiting["status"]["digest"]  # the definition itself is valid
    system.kubectl("create", "secret", "generic", name, "-n", namespace,
                   "--from-literal=token=Bearer x")
    # Secrets are not watched: the Agent is looked at again on its own recheck, or as
    # soon as it changes.
    system.kubectl("annotate", AGENTS, "triage", "-n", namespace, "example.com/touched=1")
    ready(system, namespace, "triage")
    assert agents.header_env("triage", "crm", "Authorization").startswith("AGENTRUN_MCP_")


def _process_env(system: System, namespace: str, pod: str) -> dict[str, str]:
    """The environment the development node gave a running pod's process (its
    containerID is devnode://<pid>), as /proc shows it."""
    pid = 0

    def running() -> bool:
        nonlocal pid
        found = json.loads(system.kubectl("get", "pod", "-n", namespace, pod, "-o", "json",
                                          check=False).stdout or "{}")
        for status in (found.get("status") or {}).get("containerStatuses") or []:
            if str(status.get("containerID", "")).startswith("devnode://"):
                pid = int(status["containerID"].removeprefix("devnode://"))
        return pid > 0

    wait_for(running, timeout=60, what=f"pod {pod} running", interval=0.2)
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode().split("\0") if "=" in item)


def test_no_tenant_text_expands_into_an_agents_secret(
        system: System, namespace: str, crm: CrmServer) -> None:
    secret = "Bearer crm-exp4nd3d"
    system.kubectl("create", "secret", "generic", "crm", "-n", namespace,
                   f"--from-literal=token={secret}")
    system.apply(in_namespace(triage(crm.url, mcpServers=[{
        "name": "crm", "url": crm.url,
        "headers": [{"name": "Authorization",
                     "valueFrom": {"secretKeyRef": {"name": "crm", "key": "token"}}}]}]),
        namespace))
    ready(system, namespace, "triage")
    header = f"$({agents.header_env('triage', 'crm', 'Authorization')})"
    # The model, an env value and the input all name the header's variable; the
    # development node expands $(VAR) by the kubelet's own code, as a real node would.
    system.apply(in_namespace(agent_run(
        "expand-model", agent="triage", text=header, model=header,
        env=[{"name": "PROBE", "value": header}]), namespace))
    status = settled(system, namespace, "expand-model")
    assert status["phase"] == Phase.FAILED, status
    assert status["toolsExecuted"] == []
    assert "crm-exp4nd3d" not in status.get("message", "")
    # The runner was told the model as the tenant wrote it, not a Secret's value.
    assert header in status.get("message", ""), status
    events = system.kubectl("get", "events", "-n", namespace, "-o", "json").stdout
    assert "crm-exp4nd3d" not in events
    assert "crm-exp4nd3d" not in json.dumps(system.run(namespace, "expand-model"))

    # A run that lives long enough to look at: its process holds the Secret in the
    # header's variable and nowhere else.
    system.apply(in_namespace(agent_run(
        "expand-env", [{"sleep": 30}, {"text": "done"}], agent="triage", text=header,
        userId=header, env=[{"name": "PROBE", "value": header},
                            {"name": "NAMESPACE_SEEN", "value": "$(AGENTRUN_NAMESPACE)"}]),
        namespace))
    seen = _process_env(system, namespace, "expand-env-1")
    variable = agents.header_env("triage", "crm", "Authorization")
    assert [name for name, value in seen.items() if "crm-exp4nd3d" in value] == [variable]
    assert seen["PROBE"] == header
    assert seen["AGENTRUN_USER_ID"] == header
    # spec.env still composes from the operator's variables before it.
    assert seen["NAMESPACE_SEEN"] == namespace


def test_an_agent_naming_a_function_the_image_does_not_mark_is_invalid_and_runs_nothing(
        system: System, namespace: str, crm: CrmServer) -> None:
    # sample_tools.order_of is a function of the image, but no tool: it carries no marker.
    system.apply(in_namespace(triage(crm.url, tools=[{"function": "sample_tools.order_of"}]),
                              namespace))
    ready(system, namespace, "triage")  # the operator cannot see the image's code
    system.apply(in_namespace(agent_run("unmarked", [
        {"call": "order_of", "args": {"order": "42"}}, {"text": "never"}], agent="triage"),
        namespace))
    status = settled(system, namespace, "unmarked")
    assert (status["phase"], status["reason"]) == (Phase.FAILED, Reason.AGENT_INVALID)
    assert "the function sample_tools.order_of is not a tool of the runner image" in \
        status["message"]
    assert status["toolsExecuted"] == [] and crm.calls() == []
    # The runner's word reaches the Agent: Ready False, naming the function.
    invalid = ready(system, namespace, "triage", AgentReason.INVALID)
    message = conditions(invalid)[Condition.READY]["message"]
    assert "sample_tools.order_of is not marked as a tool" in message, message
    assert invalid["status"]["digest"] == status["agentDigest"]


STDLIB_REFUSED = ("spec.tools[].function names a module of Python's standard library: a "
                  "function tool is one the runner image's agents directory defines and "
                  "marks as a tool (docs/agents.md)")


def test_a_tenant_cannot_turn_an_agent_into_code_over_a_sub_agents_secret(
        system: System, namespace: str, crm: CrmServer) -> None:
    """sam holds agentrun-edit only (no pods, no Secrets). billing, an Agent its author
    wrote, calls the CRM with a Secret header, which every runner pod of an Agent naming
    billing as a sub-agent holds in its env. sam's Agent over billing cannot name a function
    of Python (admission), nor an unmarked function of the image (AgentInvalid, no tool
    run), and the Secret's value is nowhere sam reads: the run's and the Agent's status, the
    Events, the run's transcript."""
    from agentrun_devtools import transcript_api

    secret = "Bearer billing-t0p-s3cr3t"
    system.kubectl("create", "secret", "generic", "billing-crm", "-n", namespace,
                   f"--from-literal=token={secret}")
    system.apply(in_namespace(agent("billing", instruction="Answer billing questions.",
                                    mcpServers=[{"name": "crm", "url": crm.url, "headers": [
                                        {"name": "Authorization", "valueFrom": {
                                            "secretKeyRef": {"name": "billing-crm",
                                                             "key": "token"}}}]}]), namespace))
    ready(system, namespace, "billing")
    system.kubectl("create", "rolebinding", "sam-edit", "-n", namespace,
                   "--clusterrole=agentrun-edit", "--user=sam")
    assert system.kubectl("auth", "can-i", "get", "secrets", "-n", namespace, as_user="sam",
                          check=False).stdout.strip() == "no"

    def create_as_sam(manifest: dict[str, Any]) -> Any:
        return system.kubectl("create", "-f", "-", input=json.dumps(manifest), as_user="sam",
                              check=False)

    for function in ("subprocess.getoutput", "os.getenv", "builtins.exec"):
        refused = create_as_sam(in_namespace(agent(
            "grab", instruction="Run what you are asked.", tools=[{"function": function}],
            subAgents=[{"name": "billing"}]), namespace))
        assert refused.returncode != 0, function
        assert STDLIB_REFUSED in refused.stderr, refused.stderr
        assert system.get(AGENTS, namespace, "grab") is None

    # A function of the image that is no tool: admitted (the API server cannot see the
    # image), refused by the runner before the first model call.
    made = create_as_sam(in_namespace(agent(
        "grab", instruction="Run what you are asked.",
        tools=[{"function": "sample_tools.order_of"}], subAgents=[{"name": "billing"}]),
        namespace))
    assert made.returncode == 0, made.stderr
    ready(system, namespace, "grab")
    header = agents.header_env("billing", "crm", "Authorization")
    made = create_as_sam(in_namespace(agent_run("grab-1", [
        {"call": "order_of", "args": {"order": f"$({header})"}},
        {"text": "never"}], agent="grab", text=f"$({header})"), namespace))
    assert made.returncode == 0, made.stderr
    status = settled(system, namespace, "grab-1")
    assert (status["phase"], status["reason"]) == (Phase.FAILED, Reason.AGENT_INVALID)
    assert "sample_tools.order_of is not marked as a tool" in status["message"]
    assert status["toolsExecuted"] == [] and crm.calls() == []
    run = system.run(namespace, "grab-1")
    assert system.store(lambda e: store.ledger(e, run["metadata"]["uid"])) == []
    invalid = ready(system, namespace, "grab", AgentReason.INVALID)

    transcript_api.wait_available(system.plane)
    read = system.kubectl("get", "transcripts.store.agentrun.dev", "grab-1", "-n",
                          namespace, "-o", "json", as_user="sam")
    seen = {"run": run, "agent": invalid, "transcript": json.loads(read.stdout),
            "events": system.kubectl("get", "events", "-n", namespace, "-o", "json").stdout}
    assert seen["transcript"]["run"]["name"] == "grab-1"
    assert all("t0p-s3cr3t" not in json.dumps(v) for v in seen.values()), seen


def test_a_run_that_lifts_the_agents_approval_is_refused_before_any_pod(
        system: System, namespace: str, crm: CrmServer) -> None:
    system.apply(in_namespace(triage(crm.url, effects=[
        {"name": "close_account", "approval": "Required"},
        {"name": "update_ticket", "effect": "Idempotent"}]), namespace))
    ready(system, namespace, "triage")
    for name, tools, said in [
            ("lifts", [{"name": "close_account", "approval": "None"}],
             "the run's spec.tools says approval None for the tool close_account, which the "
             "Agent's effects declares stricter"),
            ("loosens", [{"name": "update_ticket", "effect": "ReadOnly"}],
             "the run's spec.tools says ReadOnly (where it says Idempotent) for the tool "
             "update_ticket, which the Agent's effects declares stricter")]:
        system.apply(in_namespace(agent_run(name, [
            {"call": tools[0]["name"], "args": {"customer": "43"}}, {"text": "never"}],
            agent="triage", tools=tools), namespace))
        status = settled(system, namespace, name)
        assert (status["phase"], status["reason"]) == (Phase.FAILED, Reason.POLICY_VIOLATION)
        assert said in status["message"] and "No pod was started" in status["message"]
        assert status["toolsExecuted"] == [] and pods_of(system, namespace, name) == []
    assert crm.calls() == []


@pytest.mark.parametrize(("tools", "said"), [
    ([{"name": "issue_refund", "approval": "None"}],
     "says approval None for the tool issue_refund, which the runner image's code"),
    ([{"name": "charge_card", "effect": "ReadOnly"}],
     "says ReadOnly (where it says Effectful) for the tool charge_card, which the runner "
     "image's code"),
], ids=["require_confirmation lifted", "an effect made less strict"])
def test_a_run_that_loosens_the_images_code_fails_before_any_tool(
        system: System, namespace: str, tools: list[dict[str, str]], said: str) -> None:
    name = "loosens-code"
    system.apply(in_namespace(agent_run(name, [
        {"call": tools[0]["name"], "args": {"customer": "42", "amount": 30}},
        {"text": "never"}], tools=tools), namespace))
    status = settled(system, namespace, name)
    assert (status["phase"], status["reason"]) == (Phase.FAILED, Reason.POLICY_VIOLATION)
    assert said in status["message"], status["message"]
    assert status["toolsExecuted"] == []
    assert system.store(lambda e: store.outbox(e, name)) == []


def test_what_loosens_the_charts_policy_is_refused_at_launch(
        system: System, namespace: str, crm: CrmServer) -> None:
    """The operator's --tool-policy (the chart's toolPolicy) against a run's spec.tools and
    an Agent's effects, at launch (as the pin step of a run sees them; the chart's
    admission refuses the same on a cluster that installs it)."""
    from agentrun_operator.agents import Pin, pin

    chart = json.dumps([{"name": "close_account", "approval": "Required"},
                        {"name": "update_ticket", "effect": "Idempotent"}])
    system.apply(in_namespace(triage(crm.url, effects=[
        {"name": "update_ticket", "effect": "ReadOnly"}]), namespace))
    ready(system, namespace, "triage")

    def pinned(name: str, **spec: Any) -> Pin:
        run = in_namespace(agent_run(name, [{"text": "never"}], **spec), namespace)
        run["metadata"]["uid"] = str(uuid.uuid4())
        return as_operator(system, lambda ctx: pin(ctx, run), tool_policy=chart)

    lifted = pinned("lifts-chart", tools=[{"name": "close_account", "approval": "None"}])
    assert lifted.refusal is not None and lifted.refusal[0] == Reason.POLICY_VIOLATION
    assert ("the run's spec.tools says approval None for the tool close_account, which the "
            "chart's policy declares stricter") in lifted.refusal[1]
    assert "No pod was started" in lifted.refusal[1]
    loosened = pinned("agent-loosens", agent="triage")
    assert loosened.refusal is not None and (
        "the Agent's effects says ReadOnly (where it says Idempotent) for the tool "
        "update_ticket, which the chart's policy declares stricter") in loosened.refusal[1]
    tightened = pinned("tightens", tools=[{"name": "close_account", "effect": "Effectful",
                                           "approval": "Required"}])
    assert tightened == Pin(None)
