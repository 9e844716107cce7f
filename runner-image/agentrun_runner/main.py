"""`agentrun-runner`: runs one attempt of one AgentRun and reports how it ended.

The runner holds no database credential: it reaches the run store through the store API
(AGENTRUN_STORE_URL), presenting the pod's projected ServiceAccount token
(AGENTRUN_STORE_TOKEN_FILE), and the store API decides from that token which attempt this
is. The rest of its configuration comes from the environment the operator sets on the pod
(vocabulary.RunnerEnv); each has a CLI flag that overrides it. The exit code is a
vocabulary.RunnerExit; the outcome (and its reason) is also written to the run store,
where the operator reads it when the pod ends.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import mimetypes
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from google.genai import types

from agentrun import effects, policy
from agentrun.attempt import AttemptIdentity
from agentrun.vocabulary import (
    DEFAULT_USER_ID,
    SCRIPTED_MODEL,
    Approval,
    Reason,
    RunnerEnv,
    RunnerExit,
    RunStatus,
    Trigger,
)
from agentrun_runner import logs
from agentrun_runner.approvals import ApprovalRule, AwaitingApproval
from agentrun_runner.budget import Budget, BudgetExceeded, Counted, Limits, unpriced
from agentrun_runner.prices import Price, parse_overrides
from agentrun_runner.store_client import (
    StoreClient,
    StoreMemoryService,
    StoreRefused,
    StoreSessionService,
    StoreUnreachable,
    set_current,
)

NO_DURABLE_STORE_MESSAGE = (
    f"no durable session store is configured: set {RunnerEnv.STORE_URL} to the store API "
    f"and {RunnerEnv.STORE_TOKEN_FILE} to the pod's projected store token (the operator "
    "sets both on runner pods). Without them ADK keeps sessions in memory, and a crashed "
    "run would forget everything it did, so the runner refuses to start."
)
LITELLM_LOCAL_COST_MAP = "LITELLM_LOCAL_MODEL_COST_MAP"
SCRIPTED_REFUSED_MESSAGE = (
    "the scripted model is turned off: it lets whoever creates a run choose every tool "
    "call and its arguments. The operator enables it with --allow-scripted-model "
    "(development clusters and tests only)."
)


@dataclass(frozen=True)
class RunnerConfig:
    """Everything the runner needs to know about its attempt."""

    # Who the attempt is, as the environment names it (the store API's word counts).
    identity: AttemptIdentity
    model: str | None
    trigger: str
    agents_dir: Path
    store_url: str | None
    token_file: str | None
    store_ca: str | None = None  # the CA (PEM) of the store API's certificate
    allow_scripted_model: bool = False
    # spec.tools: tool name -> effect class, overriding the agent's declarations.
    tool_effects: dict[str, str] = field(default_factory=dict)
    # spec.tools' approvals: tool name -> whether it waits for a decision, and how long.
    tool_approvals: dict[str, ApprovalRule] = field(default_factory=dict)
    # spec.limits, and the operator's modelPrices (model -> Price).
    limits: Limits = field(default_factory=Limits)
    model_prices: dict[str, Price] = field(default_factory=dict)
    # The Agent snapshot the run pinned (None: an agent of the image's agents directory).
    agent_digest: str | None = None
    # The chart's toolPolicy (as spec.tools entries): the most trusted source of what a
    # tool does and whether it waits for an approval (agentrun.policy).
    tool_policy: list[dict[str, Any]] = field(default_factory=list)


class UsageError(ValueError):
    pass


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="agentrun-runner",
        description="Run one attempt of an AgentRun. Each flag defaults to its env var.",
    )
    flags = [
        ("--namespace", RunnerEnv.NAMESPACE),
        ("--run-name", RunnerEnv.RUN_NAME),
        ("--run-uid", RunnerEnv.RUN_UID),
        ("--attempt", RunnerEnv.ATTEMPT),
        ("--agent", RunnerEnv.AGENT),
        ("--user-id", RunnerEnv.USER_ID),
        ("--session-id", RunnerEnv.SESSION_ID),
        ("--model", RunnerEnv.MODEL),
        ("--input-digest", RunnerEnv.INPUT_DIGEST),
        ("--trigger", RunnerEnv.TRIGGER),
        ("--agents-dir", RunnerEnv.AGENTS_DIR),
        ("--store-url", RunnerEnv.STORE_URL),
        ("--store-token-file", RunnerEnv.STORE_TOKEN_FILE),
    ]
    for flag, env in flags:
        p.add_argument(flag, default=None, help=f"default: ${env}")
    return p


def parse_config(argv: Sequence[str] | None, environ: dict[str, str]) -> RunnerConfig:
    """The attempt's configuration from flags, falling back to the environment."""
    from agentrun_runner.agents import default_agents_dir

    args = _parser().parse_args(argv)

    def get(value: str | None, env: str, default: str | None = None) -> str | None:
        if value not in (None, ""):
            return value
        return environ.get(env) or default

    run_uid = get(args.run_uid, RunnerEnv.RUN_UID)
    agent = get(args.agent, RunnerEnv.AGENT)
    digest = get(args.input_digest, RunnerEnv.INPUT_DIGEST)
    missing = [
        env for env, value in
        ((RunnerEnv.RUN_UID, run_uid), (RunnerEnv.AGENT, agent), (RunnerEnv.INPUT_DIGEST, digest))
        if not value
    ]
    if missing:
        raise UsageError(f"missing {', '.join(missing)} (or the matching flags)")
    assert run_uid and agent and digest
    raw_attempt = get(args.attempt, RunnerEnv.ATTEMPT, "1") or "1"
    try:
        attempt = int(raw_attempt)
    except ValueError:
        raise UsageError(f"{RunnerEnv.ATTEMPT} must be a number, not {raw_attempt!r}") from None
    if attempt < 1:
        raise UsageError(f"{RunnerEnv.ATTEMPT} must be 1 or more")
    agents_dir = get(args.agents_dir, RunnerEnv.AGENTS_DIR)
    return RunnerConfig(
        identity=AttemptIdentity(
            namespace=get(args.namespace, RunnerEnv.NAMESPACE, "default") or "default",
            run_name=get(args.run_name, RunnerEnv.RUN_NAME, run_uid) or run_uid,
            run_uid=run_uid,
            attempt=attempt,
            agent=agent,
            user_id=get(args.user_id, RunnerEnv.USER_ID, DEFAULT_USER_ID) or DEFAULT_USER_ID,
            session_id=get(args.session_id, RunnerEnv.SESSION_ID) or f"{run_uid}-{attempt}",
            input_digest=digest),
        model=get(args.model, RunnerEnv.MODEL),
        trigger=get(args.trigger, RunnerEnv.TRIGGER, Trigger.MANUAL) or Trigger.MANUAL,
        agents_dir=Path(agents_dir) if agents_dir else default_agents_dir(),
        store_url=get(args.store_url, RunnerEnv.STORE_URL),
        token_file=get(args.store_token_file, RunnerEnv.STORE_TOKEN_FILE),
        store_ca=environ.get(RunnerEnv.STORE_CA) or None,
        # Only from the environment the operator sets (last, after the user's env).
        allow_scripted_model=environ.get(RunnerEnv.ALLOW_SCRIPTED_MODEL) == "true",
        tool_effects=_tool_effects(environ.get(RunnerEnv.TOOLS) or ""),
        tool_approvals=_tool_approvals(environ.get(RunnerEnv.TOOLS) or ""),
        limits=_limits(environ.get(RunnerEnv.LIMITS) or ""),
        model_prices=_prices(environ.get(RunnerEnv.MODEL_PRICES) or ""),
        agent_digest=environ.get(RunnerEnv.AGENT_DIGEST) or None,
        tool_policy=_tool_policy(environ.get(RunnerEnv.TOOL_POLICY) or ""),
    )


def _tool_policy(raw: str) -> list[dict[str, Any]]:
    try:
        return [dict(rule) for rule in policy.chart_rules(raw)]
    except ValueError as e:
        raise UsageError(f"{RunnerEnv.TOOL_POLICY}: {e}") from None


def _limits(raw: str) -> Limits:
    try:
        return Limits.parse(raw)
    except ValueError as e:
        raise UsageError(f"{RunnerEnv.LIMITS}: {e}") from None


def _prices(raw: str) -> dict[str, Price]:
    try:
        return parse_overrides(raw)
    except ValueError as e:
        raise UsageError(f"{RunnerEnv.MODEL_PRICES}: {e}") from None


def _tools(raw: str) -> list[dict[str, Any]]:
    """spec.tools as the operator passes it (JSON list of {name, effect?, approval?,
    approvalTimeoutSeconds?})."""
    if not raw:
        return []
    try:
        tools = json.loads(raw)
        if not isinstance(tools, list) or not all(isinstance(t, dict) and t.get("name")
                                                  for t in tools):
            raise TypeError("each entry needs a name")
    except (ValueError, TypeError) as e:
        raise UsageError(f"{RunnerEnv.TOOLS} must be a JSON list of {{name, effect, "
                         f"approval}}: {e}") from None
    return tools


def _tool_effects(raw: str) -> dict[str, str]:
    """spec.tools' effect classes, by tool name."""
    return {str(t["name"]): str(t["effect"]) for t in _tools(raw) if t.get("effect")}


def _tool_approvals(raw: str) -> dict[str, ApprovalRule]:
    """spec.tools' approvals, by tool name (only the tools that say one)."""
    return {str(t["name"]): ApprovalRule(
        t["approval"] == Approval.REQUIRED,
        int(t.get("approvalTimeoutSeconds") or Approval.DEFAULT_TIMEOUT_SECONDS))
        for t in _tools(raw) if t.get("approval")}


@dataclass(frozen=True)
class Failure:
    """How a failed attempt is reported: exit code, store reason, one human sentence."""

    code: int
    reason: str
    message: str


def classify_failure(error: BaseException) -> Failure:
    """What an exception out of the agent run means for the run (a pure decision)."""
    from agentrun_runner.ledger import LedgerWriteFailed
    from agentrun_runner.retries import EmptyModelTurn, RateLimitedAfterToolCall, causes

    for e in causes(error):
        # The store refused to open an approved call under other arguments: the run ends
        # so, whatever wraps the refusal (the ledger's fail-closed error).
        if isinstance(e, StoreRefused) and e.reason == Reason.APPROVAL_MISMATCH:
            return Failure(RunnerExit.AGENT_ERROR, Reason.APPROVAL_MISMATCH, e.message)
    for e in causes(error):
        if isinstance(e, BudgetExceeded):
            return Failure(RunnerExit.BUDGET_EXCEEDED, Reason.BUDGET_EXCEEDED, str(e))
        if isinstance(e, AwaitingApproval):
            return Failure(RunnerExit.AWAITING_APPROVAL, Reason.AWAITING_APPROVAL, str(e))
        if isinstance(e, RateLimitedAfterToolCall):
            return Failure(
                RunnerExit.RATE_LIMITED_AFTER_TOOL_CALL, Reason.RATE_LIMITED_AFTER_TOOL_CALL, str(e)
            )
        if isinstance(e, LedgerWriteFailed | EmptyModelTurn):
            return Failure(RunnerExit.AGENT_ERROR, Reason.AGENT_ERROR, str(e))
    return Failure(
        RunnerExit.AGENT_ERROR,
        Reason.AGENT_ERROR,
        f"The agent failed with {type(error).__name__}: {error}. See the runner log.",
    )


_refused: list[str] = []


def _refuse(code: int, event: str, message: str) -> int:
    _refused.append(message)
    logs.error(event, exit_code=code, message=message)
    print(f"agentrun-runner: {message}", file=sys.stderr, flush=True)
    return code


def _files_as_parts(files: dict[str, bytes]) -> list[types.Part]:
    parts: list[types.Part] = []
    for name, content in sorted(files.items()):
        mime = mimetypes.guess_type(name)[0] or "application/octet-stream"
        parts.append(types.Part(text=f"Attached file: {name}"))
        parts.append(types.Part(inline_data=types.Blob(mime_type=mime, data=content)))
    return parts


async def _report(client: StoreClient, failure: Failure | None) -> None:
    try:
        if failure is None:
            await client.record_outcome(RunStatus.SUCCEEDED)
        else:
            await client.record_outcome(RunStatus.FAILED, failure.reason, failure.message)
    except Exception as e:
        # The operator falls back to the pod's exit code and the ledger.
        logs.error("outcome.write_failed", error=f"{type(e).__name__}: {e}")


async def run_attempt(config: RunnerConfig) -> int:
    """Runs the attempt end to end; returns the exit code."""
    assert config.store_url and config.token_file
    try:
        client = StoreClient(config.store_url, config.token_file, config.store_ca)
    except StoreUnreachable as e:
        return _refuse(RunnerExit.STORE_UNAVAILABLE, "store.unavailable",
                       f"the run store cannot be used through the store API at "
                       f"{config.store_url}: {e}")
    set_current(client)
    try:
        return await _run_attempt(config, client)
    finally:
        set_current(None)
        await client.close()


async def _run_attempt(config: RunnerConfig, client: StoreClient) -> int:
    from google.adk.agents.llm_agent import LlmAgent
    from google.adk.apps.app import App, ResumabilityConfig
    from google.adk.errors.already_exists_error import AlreadyExistsError
    from google.adk.models.base_llm import BaseLlm
    from google.adk.models.registry import LLMRegistry
    from google.adk.runners import Runner
    from google.genai import types

    from agentrun_runner.compaction import CompactionPlugin
    from agentrun_runner.ledger import WriteAheadLedger
    from agentrun_runner.retries import CallWatch, ModelRetries
    from agentrun_runner.scripted import ScriptedLlm
    from agentrun_runner.usage import UsageMeter

    try:
        begun = await client.begin()
    except (StoreRefused, StoreUnreachable) as e:
        return _refuse(RunnerExit.STORE_UNAVAILABLE, "store.unavailable",
                       f"the run store cannot be used through the store API at "
                       f"{config.store_url}: {e}")
    effects.bind_lineage(begun.root_run_uid)
    # The store API's word (from the pod's token) is what counts; the environment only
    # names it for the logs.
    me, named = begun.identity, config.identity
    if (me.run_uid, me.attempt) != (named.run_uid, named.attempt):
        logs.warning("identity.mismatch", env_uid=named.run_uid, env_attempt=named.attempt,
                     uid=me.run_uid, attempt=me.attempt)

    snapshot = await client.input()
    if snapshot is None:
        # Not reported: the store API recorded InputUnavailable itself when it found no
        # snapshot (a runner may not say of itself that nothing ran).
        message = (
            f"The input snapshot {me.input_digest or named.input_digest} is not in the run "
            "store, so the agent was not started; no tool was called."
        )
        return _refuse(RunnerExit.INPUT_UNAVAILABLE, "input.unavailable", message)

    try:
        if config.model == SCRIPTED_MODEL and not config.allow_scripted_model:
            raise PermissionError(SCRIPTED_REFUSED_MESSAGE)
        loaded = await _load(config, client)
        root_agent = loaded.root
        watch = CallWatch()
        override: BaseLlm | None = None
        if config.model == SCRIPTED_MODEL:
            override = ScriptedLlm.from_env(resuming=bool(begun.resume_invocation))
        elif config.model:
            override = LLMRegistry.new_llm(config.model)
        # Each agent keeps its model's own class (ADK builds a provider's requests from
        # it); the retry rules are a plugin that knows which model each agent calls.
        models: dict[str, BaseLlm] = {}
        pending = [root_agent]
        while pending:
            agent = pending.pop()
            pending.extend(agent.sub_agents)
            if isinstance(agent, LlmAgent):
                model = override or agent.canonical_model
                agent.model = models[agent.name] = model
    except NotLoaded as e:
        await _report(client, e.failure)
        return _refuse(e.failure.code, "agent.load_failed", e.failure.message)
    except Exception as e:
        failure = Failure(
            RunnerExit.AGENT_ERROR, Reason.AGENT_ERROR,
            f"The agent {named.agent!r} could not be loaded: {type(e).__name__}: {e}",
        )
        await _report(client, failure)
        return _refuse(failure.code, "agent.load_failed", failure.message)
    # A run only tightens (agentrun.policy): checked here, where the image's code is known,
    # before the first model call; nothing has run, so toolsExecuted is [].
    loosened = policy.first_violation([
        policy.of_rules(policy.CHART, config.tool_policy), code_declarations(root_agent),
        policy.of_rules(policy.AGENT, loaded.effects), run_declarations(config)])
    if loosened is not None:
        failure = Failure(RunnerExit.POLICY_VIOLATION, Reason.POLICY_VIOLATION,
                          f"Run of {named.agent}: {loosened.message}")
        if loaded.built is not None:
            for server in loaded.built.servers:
                await server.toolset.close()
        await _report(client, failure)
        return _refuse(failure.code, "policy.violation", failure.message)
    tool_effects, tool_approvals = applied_rules(config, loaded, code_declarations(root_agent))

    why = unpriced(config.limits, sorted({str(m.model) for m in models.values()}),
                   config.model_prices)
    if why is not None:
        failure = Failure(RunnerExit.PRICE_UNKNOWN, Reason.PRICE_UNKNOWN, why)
        await _report(client, failure)
        return _refuse(failure.code, "price.unknown", failure.message)
    if loaded.built is not None:
        # Before the first model call: a server that is down fails the run, nothing run.
        from agentrun_runner import declarative

        try:
            await declarative.check_servers(loaded.built)
        except (declarative.ToolServerUnavailable, declarative.AgentInvalid) as e:
            unavailable = isinstance(e, declarative.ToolServerUnavailable)
            failure = Failure(
                RunnerExit.TOOL_SERVER_UNAVAILABLE if unavailable else RunnerExit.AGENT_INVALID,
                Reason.TOOL_SERVER_UNAVAILABLE if unavailable else Reason.AGENT_INVALID,
                f"Agent {named.agent}: {e}" if unavailable else
                f"Agent {named.agent} cannot be built in this runner: {e}. No tool was "
                "called.")
            for server in loaded.built.servers:
                await server.toolset.close()
            await _report(client, failure)
            return _refuse(failure.code, "agent.servers_failed", failure.message)
    budget = Budget(config.limits, Counted.of(begun.usage), config.model_prices)
    # Every call goes through the ledger (below), so the model's turn that calls tools
    # rides on the first call's open.
    sessions = StoreSessionService(client, watch.failures, turns_ride_on_open=True)
    memory = StoreMemoryService(client)
    journal = await client.journal() if begun.resume_invocation else {}
    ledger = WriteAheadLedger(client, watch.failures, root_run_uid=begun.root_run_uid,
                              overrides=tool_effects, journal=journal, budget=budget,
                              approvals=tool_approvals, decisions=begun.decisions)
    runner = Runner(
        app=App(
            name=named.agent,
            root_agent=root_agent,
            # The budget first: a call past a limit is refused before anything records it.
            plugins=[UsageMeter(budget, client, models, watch.failures),
                     ModelRetries(models, watch), ledger, CompactionPlugin()],
            # A resumed attempt continues the invocation it resumes: ADK replays its pending
            # function calls (through the ledger: answered from the journal, or run again)
            # and asks the model only for what comes after the recorded responses.
            resumability_config=ResumabilityConfig(is_resumable=True)
            if begun.resume_invocation else None,
        ),
        session_service=sessions,
        memory_service=memory,
    )
    new_message = types.Content(
        role="user", parts=[types.Part(text=snapshot.text), *_files_as_parts(snapshot.files)]
    )
    invocation_id: str | None = None
    answer = ""
    try:
        session = await sessions.get_session(
            app_name=named.agent, user_id=me.user_id, session_id=me.session_id
        )
        if session is None:
            try:
                await sessions.create_session(
                    app_name=named.agent, user_id=me.user_id, session_id=me.session_id,
                )
                logs.info("session.created", session=me.session_id)
            except AlreadyExistsError:
                pass
        else:
            logs.info("session.continued", session=me.session_id, events=len(session.events))
        logs.info("agent.start", model=config.model or "agent-default",
                  resumes=begun.resume_invocation or "-")
        if begun.resume_invocation:
            _check_resumable(session, begun.resume_invocation)
        async for event in runner.run_async(
            user_id=me.user_id, session_id=me.session_id,
            **({"invocation_id": begun.resume_invocation, "new_message": None}
               if begun.resume_invocation else {"new_message": new_message})
        ):
            invocation_id = event.invocation_id
            calls = [c.name for c in event.get_function_calls()]
            if calls:
                logs.info("model.calls", tools=",".join(str(c) for c in calls))
            if event.error_code:
                # ADK reports an exception raised inside the agent as an error event;
                # ours were kept, so that the reason names what really happened.
                if watch.failures:
                    raise watch.failures[0]
                raise RuntimeError(f"{event.error_code}: {event.error_message or ''}")
            if event.is_final_response() and event.content and event.content.parts:
                text = "".join(p.text or "" for p in event.content.parts if not p.thought)
                if text:
                    answer = text
    except Exception as e:
        failure = classify_failure(e)
        logs.error("agent.failed", reason=failure.reason, message=failure.message,
                   error=f"{type(e).__name__}: {e}")
        # The calls' closes still on their way land before the outcome is reported.
        await ledger.flush()
        await _report(client, failure)
        return failure.code
    finally:
        await ledger.flush()
        await runner.close()

    await _remember(sessions, memory, named.agent, me, invocation_id)
    logs.info("agent.succeeded", answer=answer[:200])
    await _record_result(client, root_agent, answer)
    await _report(client, None)
    return RunnerExit.SUCCESS


class NotLoaded(Exception):
    """The agent could not be had, for one of the runner's own reasons (`failure`)."""

    def __init__(self, failure: Failure) -> None:
        super().__init__(failure.message)
        self.failure = failure


@dataclass
class Loaded:
    """The agent of the attempt: its root, and for an Agent snapshot what was built from
    it (its MCP servers), its effect and approval rules (agentrun.agents.tool_rules) and
    the Agents' own spec.effects among them (for agentrun.policy)."""

    root: Any
    built: Any = None
    rules: list[dict[str, Any]] = field(default_factory=list)
    effects: list[Any] = field(default_factory=list)


def code_declarations(root: Any) -> dict[str, policy.Declared]:
    """What the image's code declares of each function tool of the agent tree: its
    effect (@read_only, @idempotent, @effectful) and whether its calls wait for an
    approval (@requires_approval, ADK's require_confirmation, which a callable makes
    conditional: no less trusted source may lift it either)."""
    from google.adk.tools.base_tool import BaseTool
    from google.adk.tools.function_tool import FunctionTool

    found: dict[str, policy.Declared] = {}
    pending = [root]
    while pending:
        agent = pending.pop()
        pending.extend(getattr(agent, "sub_agents", None) or [])
        for tool in getattr(agent, "tools", None) or []:
            if isinstance(tool, BaseTool):
                name = tool.name
                confirm = bool(getattr(tool, "_require_confirmation", False)) if isinstance(
                    tool, FunctionTool) else False
            elif callable(tool) and hasattr(tool, "__name__"):
                name, confirm = tool.__name__, False  # ADK names a FunctionTool so
            else:
                continue  # a toolset (MCP): its servers' hints are not the image's code
            approval = True if confirm or effects.declares_approval(tool) else None
            declared = policy.Declared(policy.CODE, effects.declared_effect(tool), approval)
            if declared.effect is not None or declared.approval is not None:
                found[name] = declared
    return found


def applied_rules(config: RunnerConfig, loaded: Loaded, code: Mapping[str, policy.Declared],
                  ) -> tuple[dict[str, str], dict[str, ApprovalRule]]:
    """What the ledger applies to each tool once no source loosens another
    (agentrun.policy.effective): the strictest effect the chart's policy, the image's code,
    the Agent (its effects, and its built-ins' effects) or the run says; and an approval
    when the chart, the Agent or the run requires one (the timeout the least trusted of
    them gives). The code's own requirement (`@requires_approval`, ADK's
    `require_confirmation`, which a callable makes conditional) is asked of the code at
    each call: none of the others may lift it, so it needs no entry here."""
    chart, agent = config.tool_policy, loaded.rules
    sources = [policy.of_rules(policy.CHART, chart), dict(code),
               policy.of_rules(policy.AGENT, agent), run_declarations(config)]
    timeouts = {**_tool_approvals(json.dumps(chart)), **_tool_approvals(json.dumps(agent)),
                **config.tool_approvals}
    tool_effects: dict[str, str] = {}
    tool_approvals: dict[str, ApprovalRule] = {}
    for name in sorted({name for said in sources for name in said}):
        said = [source[name] for source in sources if name in source]
        effect = policy.effective(said).effect
        if effect is not None:
            tool_effects[name] = effect
        required = policy.effective([d for d in said if d.source != policy.CODE]).approval
        if required is not None:
            rule = timeouts.get(name)
            tool_approvals[name] = ApprovalRule(required, rule.timeout_seconds if rule else
                                                Approval.DEFAULT_TIMEOUT_SECONDS)
    return tool_effects, tool_approvals


def run_declarations(config: RunnerConfig) -> dict[str, policy.Declared]:
    """The run's spec.tools, as agentrun.policy reads them."""
    names = set(config.tool_effects) | set(config.tool_approvals)
    return {name: policy.Declared(
        policy.RUN, config.tool_effects.get(name),
        config.tool_approvals[name].required if name in config.tool_approvals else None)
        for name in names}


async def _load(config: RunnerConfig, client: StoreClient) -> Loaded:
    """The Agent snapshot the run pinned, built; else the image's agent directory.
    Raises NotLoaded with AgentNotFound or AgentInvalid and what to do."""
    from agentrun import agents
    from agentrun_runner import declarative
    from agentrun_runner.agents import AgentNotFound, load_agent

    named = config.identity
    if not config.agent_digest:
        try:
            return Loaded(load_agent(config.agents_dir, named.agent))
        except AgentNotFound as e:
            raise NotLoaded(Failure(RunnerExit.AGENT_NOT_FOUND, Reason.AGENT_NOT_FOUND, (
                f"There was no Agent {named.agent} in namespace {named.namespace} when the "
                f"run was created, and the runner image has no agent directory of that name "
                f"({e}). Create the Agent (or name an agent of the image), then create the "
                "run again; no tool was called."))) from e
    pinned = await client.agent()
    if pinned is None:
        raise NotLoaded(Failure(RunnerExit.AGENT_NOT_FOUND, Reason.AGENT_NOT_FOUND, (
            f"The Agent snapshot {config.agent_digest} this run pinned is not in the run "
            "store; no tool was called.")))
    if pinned.get("digest") != config.agent_digest:
        logs.warning("agent.digest_mismatch", env=config.agent_digest,
                     store=pinned.get("digest"))
    snapshot = dict(pinned.get("snapshot") or {})
    try:
        built = declarative.build(snapshot, os.environ, config.agents_dir)
    except declarative.AgentInvalid as e:
        raise NotLoaded(Failure(RunnerExit.AGENT_INVALID, Reason.AGENT_INVALID, (
            f"Agent {named.agent} cannot be built in this runner: {e}. No tool was "
            "called."))) from e
    logs.info("agent.built", digest=pinned.get("digest"), agents=len(snapshot.get(
        "agents") or {}), mcp_servers=len(built.servers))
    return Loaded(built.root, built, agents.tool_rules(snapshot), policy.agent_rules(snapshot))


def structured(agent: Any, answer: str) -> Any:
    """The answer as the object of the agent's output schema, if it declares one and the
    answer parses (None otherwise: the text stands alone)."""
    if getattr(agent, "output_schema", None) is None:
        return None
    try:
        return json.loads(answer)
    except ValueError:
        return None


async def _record_result(client: StoreClient, agent: Any, answer: str) -> None:
    """The whole answer into the store, before the outcome: the operator reads it when it
    settles the attempt (status.result)."""
    try:
        await client.record_result(answer, structured(agent, answer))
    except Exception as e:
        logs.error("result.write_failed", error=f"{type(e).__name__}: {e}")


def _check_resumable(session: Any, invocation_id: str) -> None:
    """ADK continues an invocation whose last event is a function call (the call is replayed)
    or a function response (the model is asked for the next step). After anything else (an
    error event, an end) it would silently do nothing and report an empty success."""
    mine = [e for e in (session.events if session is not None else [])
            if e.invocation_id == invocation_id]
    last = mine[-1] if mine else None
    if last is None or not (last.get_function_calls() or last.get_function_responses()):
        ends = "nothing" if last is None else (
            f"an error event ({last.error_code}: {last.error_message})" if last.error_code
            else f"an event of {last.author} with "
                 + ("text" if last.content and any(p.text for p in last.content.parts or [])
                    else "no content"))
        raise ResumeImpossible(
            f"the journal of invocation {invocation_id} does not end in a tool call or its "
            f"response (it ends in {ends}), so it cannot be continued; a plain replay starts "
            "over instead")


class ResumeImpossible(RuntimeError):
    """The session's invocation cannot be continued where it stands."""


async def _remember(
    sessions: StoreSessionService, memory: StoreMemoryService, agent: str,
    me: AttemptIdentity,
    invocation_id: str | None,
) -> None:
    """This turn's conversation into long-term memory (best effort: the run is done)."""
    try:
        session = await sessions.get_session(
            app_name=agent, user_id=me.user_id, session_id=me.session_id
        )
        if session is None or invocation_id is None:
            return
        events = [e for e in session.events if e.invocation_id == invocation_id]
        await memory.add_events_to_memory(
            app_name=agent, user_id=me.user_id, events=events, session_id=me.session_id,
        )
    except Exception as e:
        logs.warning("memory.write_failed", error=f"{type(e).__name__}: {e}")


def main(argv: Sequence[str] | None = None) -> int:
    """The console script: returns a vocabulary.RunnerExit code."""
    logs.setup()
    # LiteLLM would otherwise fetch its model price list from the internet when it is
    # first imported: a runner pod without egress waits for that to time out, and the
    # list it runs with would change under it. Its bundled copy is used unless the
    # pod's environment says otherwise.
    os.environ.setdefault(LITELLM_LOCAL_COST_MAP, "True")
    try:
        config = parse_config(argv, dict(os.environ))
    except UsageError as e:
        return _refuse(RunnerExit.USAGE, "usage", str(e))
    named = config.identity
    logs.bind(run=named.run_name, attempt=named.attempt, namespace=named.namespace,
              agent=named.agent)
    if not config.store_url or not config.token_file:
        return _refuse(RunnerExit.NO_DURABLE_STORE, "refused.no_durable_store",
                       NO_DURABLE_STORE_MESSAGE)
    # Who the runner is and what it may write, as the container sees it (the restricted
    # security context: not root, a read-only root filesystem).
    logs.info("runner.start", uid=named.run_uid, session=named.session_id,
              trigger=config.trigger, input=named.input_digest, process_uid=os.getuid(),
              root_read_only=bool(os.statvfs("/").f_flag & os.ST_RDONLY))
    code = asyncio.run(run_attempt(config))
    logs.info("runner.exit", exit_code=code)
    if _refused:
        # Said again as the last line: the kubelet shows a failed container's last log
        # lines as its termination message (FallbackToLogsOnError), and so does the run.
        print(f"agentrun-runner: {_refused[-1]}", file=sys.stderr, flush=True)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
