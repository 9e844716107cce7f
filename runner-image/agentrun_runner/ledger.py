"""The write-ahead tool ledger, as an ADK plugin.

Before each tool runs, its ledger row is inserted AND committed; only then does the tool
run. If that insert fails the tool does not run and the run fails (fail closed): a tool
call we cannot record is a call we could later repeat without knowing.

After the tool, its row is closed (ok or error, with the result) on the way: the tool's
answer goes back to the model without waiting for the close. The close rides on the next
call's open, one commit for both, when that comes within CLOSE_WAIT_SECONDS (an agent
calling tools one after the other); otherwise it goes alone. A close that never lands
leaves the call "called, never answered", in doubt, which is the cautious reading; the
runner flushes every close before it reports the outcome (`flush`).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
from collections.abc import Mapping
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from google.adk.plugins.base_plugin import BasePlugin
from google.adk.tools.base_tool import BaseTool

from agentrun import effects
from agentrun.vocabulary import (
    ENV_TEST_CRASH_AFTER_CLOSE,
    Approval,
    ApprovalDecision,
    LedgerOutcome,
)
from agentrun_runner import logs
from agentrun_runner.approvals import ApprovalRule, AwaitingApproval, denial
from agentrun_runner.budget import Budget, BudgetExceeded
from agentrun_runner.store_client import StoreClient

# How long a close waits for the next call's open to carry it before it goes alone: a
# scripted or fast agent calls its next tool sooner; a model that thinks takes seconds.
CLOSE_WAIT_SECONDS = 0.25
# What an open may carry (the store API's limits.CLOSES_PER_OPEN, CARRIED_RESULT_BYTES).
CLOSES_PER_OPEN = 8
CARRIED_RESULT_BYTES = 16 * 1024
if TYPE_CHECKING:
    from google.adk.agents.invocation_context import InvocationContext
    from google.adk.tools.tool_context import ToolContext
    from google.genai import types


# The idempotency key of the call the ledger is letting run now, in that call's own task
# (ADK runs each call in a task of its own, with what its before-tool callbacks set): what
# an MCP toolset sends as Idempotency-Key (declarative.call_key_header).
CALL_KEY: ContextVar[str | None] = ContextVar("agentrun_call_key", default=None)


class LedgerWriteFailed(RuntimeError):
    """The ledger row of a call could not be committed, so the tool was not run."""

    def __init__(self, tool: str, cause: BaseException) -> None:
        super().__init__(
            f"The tool ledger could not record the call to {tool}, so {tool} was not run "
            f"(fail closed): {type(cause).__name__}: {cause}. Check the run store, then replay."
        )
        self.tool = tool


class WriteAheadLedger(BasePlugin):
    """Records every tool call of one attempt before it runs, and its end after."""

    def __init__(
        self,
        client: StoreClient,
        failures: list[BaseException] | None = None,
        *,
        root_run_uid: str = "",
        overrides: Mapping[str, str] | None = None,
        journal: Mapping[str, Mapping[str, Any]] | None = None,
        budget: Budget | None = None,
        approvals: Mapping[str, ApprovalRule] | None = None,
        decisions: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> None:
        super().__init__(name="agentrun_ledger")
        self._failures = failures if failures is not None else []
        self._client = client
        # The lineage whose idempotency keys these calls get, and spec.tools' effects.
        self._root = root_run_uid
        self._overrides = dict(overrides or {})
        # A resumed attempt: the calls of the session it continues, by call id.
        self._journal = dict(journal or {})
        # spec.limits' maxToolCalls: checked (and counted) as each call starts.
        self._budget = budget
        # spec.tools' approvals, and the decisions on calls of the run that waited.
        self._approvals = dict(approvals or {})
        self._decisions = dict(decisions or {})
        self._seq = itertools.count(1)
        self._open: dict[int, int] = {}  # id(tool_context) -> seq
        # Closes not sent yet (seq -> tool, outcome, result), for the next open to carry;
        # the tasks that send them alone if none comes, and the closes being sent.
        self._pending: dict[int, tuple[str, str, Any]] = {}
        self._waiting: set[asyncio.Task[None]] = set()
        self._closing: set[asyncio.Task[bool]] = set()

    async def before_run_callback(
        self, *, invocation_context: InvocationContext
    ) -> types.Content | None:
        # Before the first model call: from here on, this invocation's session events
        # are this attempt's (store.tools_executed reads them by invocation id).
        await self._client.record_invocation(invocation_context.invocation_id)
        logs.info("invocation.recorded", invocation=invocation_context.invocation_id)
        return None

    async def before_tool_callback(
        self, *, tool: BaseTool, tool_args: dict[str, Any], tool_context: ToolContext
    ) -> dict[str, Any] | None:
        seq = next(self._seq)
        call_id = tool_context.function_call_id
        effect = effects.effect_of(tool, self._overrides)
        key = effects.key_for(self._root, call_id) if self._root and call_id else None
        recorded = self._journal.get(call_id or "")
        if recorded is not None and recorded.get("finished"):
            # It ran in the attempt we resume and its response never reached the session:
            # answer it from the journal, do not run it again. Noted on the ledger as such.
            try:
                await self._open_call(seq, tool.name, call_id,
                                      effects.args_digest(tool_args), effect, key)
                await self._client.close_call(seq, LedgerOutcome.JOURNAL,
                                              recorded.get("result"))
            except Exception as e:
                failure = LedgerWriteFailed(tool.name, e)
                self._failures.append(failure)
                raise failure from e
            logs.info("tool.from_journal", tool=tool.name, seq=seq, call_id=call_id)
            result = recorded.get("result")
            return dict(result) if isinstance(result, Mapping) else {"result": result}
        if await self._needs_approval(tool, tool_args, tool_context):
            decided = self._decisions.get(call_id or "")
            if decided is None:
                return await self._wait_for_approval(seq, tool, tool_args, call_id)
            if decided.get("decision") == ApprovalDecision.DENY:
                return await self._denied(seq, tool, tool_args, call_id, key, effect, decided)
            # Approved: it runs now, through the ledger, once. ADK's own confirmation of a
            # FunctionTool(require_confirmation=True) is this decision.
            from google.adk.tools.tool_confirmation import ToolConfirmation

            tool_context.tool_confirmation = ToolConfirmation(confirmed=True)
            logs.info("tool.approved", tool=tool.name, seq=seq, call_id=call_id,
                      approver=decided.get("approver"))
        if self._budget is not None:
            try:
                self._budget.tool_started(tool.name)
            except BudgetExceeded as e:
                self._failures.append(e)
                raise
        try:
            await self._open_call(seq, tool.name, call_id, effects.args_digest(tool_args),
                                  effect, key)
        except asyncio.CancelledError:
            raise
        except BaseException as e:
            logs.error("ledger.write_failed", tool=tool.name, seq=seq, call_id=call_id,
                       error=f"{type(e).__name__}: {e}")
            failure = LedgerWriteFailed(tool.name, e)
            self._failures.append(failure)
            raise failure from e
        self._open[id(tool_context)] = seq
        CALL_KEY.set(key)
        logs.info("tool.start", tool=tool.name, seq=seq, call_id=call_id, effect=effect)
        return None

    async def _needs_approval(self, tool: BaseTool, tool_args: dict[str, Any],
                              tool_context: ToolContext) -> bool:
        """spec.tools first (either way), then the agent's code (approvals.py)."""
        rule = self._approvals.get(tool.name)
        if rule is not None:
            return rule.required
        if effects.declares_approval(tool):
            return True
        return bool(await tool.check_require_confirmation(tool_args, tool_context))

    async def _wait_for_approval(self, seq: int, tool: BaseTool, tool_args: dict[str, Any],
                                 call_id: str | None) -> dict[str, Any]:
        """Writes the call down as waiting (never started), then ends the attempt."""
        if not call_id:
            raise LedgerWriteFailed(tool.name, ValueError(
                "a call that needs an approval must have an id to be decided by"))
        rule = self._approvals.get(tool.name)
        timeout = rule.timeout_seconds if rule else Approval.DEFAULT_TIMEOUT_SECONDS
        try:
            await self._client.request_approval(seq, tool.name, call_id, tool_args,
                                                effects.args_digest(tool_args), timeout)
        except Exception as e:
            failure = LedgerWriteFailed(tool.name, e)
            self._failures.append(failure)
            raise failure from e
        logs.info("tool.awaiting_approval", tool=tool.name, seq=seq, call_id=call_id)
        waiting = AwaitingApproval(tool.name, seq)
        self._failures.append(waiting)
        raise waiting

    async def _denied(self, seq: int, tool: BaseTool, tool_args: dict[str, Any],
                      call_id: str | None, key: str | None, effect: str,
                      decided: Mapping[str, Any]) -> dict[str, Any]:
        """A denied call: on the ledger as denied, never run; the model is told."""
        told = denial(str(decided.get("approver") or "?"), decided.get("note"))
        try:
            await self._open_call(seq, tool.name, call_id, effects.args_digest(tool_args),
                                  effect, key)
            await self._client.close_call(seq, LedgerOutcome.DENIED, told)
        except Exception as e:
            failure = LedgerWriteFailed(tool.name, e)
            self._failures.append(failure)
            raise failure from e
        logs.info("tool.denied", tool=tool.name, seq=seq, call_id=call_id,
                  approver=decided.get("approver"))
        return told

    async def _open_call(self, seq: int, tool: str, call_id: str | None, digest: str,
                         effect: str, key: str | None) -> None:
        """The open, carrying the closes still waiting (those it did not close go alone)."""
        carried = [(s, *self._pending.pop(s)) for s in list(self._pending)[:CLOSES_PER_OPEN]]
        try:
            closed = set(await self._client.open_call(
                seq, tool, call_id, digest, effect, key,
                closes=[(s, outcome, result) for s, _, outcome, result in carried]))
        except BaseException:
            for s, name, outcome, result in carried:
                self._send_alone(s, name, outcome, result)
            raise
        for s, name, outcome, result in carried:
            if s not in closed:  # not open any more, as far as the store knows: it says why
                self._send_alone(s, name, outcome, result)

    async def _close(self, tool: BaseTool, tool_context: ToolContext, outcome: str,
                     result: Any) -> None:
        seq = self._open.pop(id(tool_context), None)
        CALL_KEY.set(None)
        if seq is None:
            return
        logs.info("tool.end", tool=tool.name, seq=seq, outcome=outcome)
        # The result is journalled as JSON (what a resume answers the call with), as it
        # is now: the tool's result object may change once the model has it.
        journalled = json.loads(json.dumps(result, default=str))
        if os.environ.get(ENV_TEST_CRASH_AFTER_CLOSE) == tool.name:
            # Test hook: finished on the ledger, never in the session (so not on the way;
            # the earlier calls' closes land first, as they would have before it).
            await self.flush()
            if await self._send_close(tool.name, seq, outcome, journalled):
                os._exit(137)
            return
        if len(json.dumps(journalled)) > CARRIED_RESULT_BYTES:
            self._send_alone(seq, tool.name, outcome, journalled)
            return
        self._pending[seq] = (tool.name, outcome, journalled)
        waiting = asyncio.create_task(self._unless_carried(seq))
        self._waiting.add(waiting)
        waiting.add_done_callback(self._waiting.discard)

    async def _unless_carried(self, seq: int) -> None:
        await asyncio.sleep(CLOSE_WAIT_SECONDS)
        if seq in self._pending:
            self._send_alone(seq, *self._pending.pop(seq))

    def _send_alone(self, seq: int, tool: str, outcome: str, result: Any) -> None:
        task = asyncio.create_task(self._send_close(tool, seq, outcome, result))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def _send_close(self, tool: str, seq: int, outcome: str, result: Any) -> bool:
        try:
            await self._client.close_call(seq, outcome, result)
            return True
        except Exception as e:
            # The call itself is recorded; a missing finish only reads as "never answered".
            logs.warning("ledger.close_failed", tool=tool, seq=seq,
                         error=f"{type(e).__name__}: {e}")
            return False

    async def flush(self) -> None:
        """Sends every close still waiting, and waits for all of them to land (each logs
        its own failure)."""
        for waiting in list(self._waiting):
            waiting.cancel()
        for seq in list(self._pending):
            self._send_alone(seq, *self._pending.pop(seq))
        while self._closing:
            await asyncio.gather(*list(self._closing), return_exceptions=True)

    async def after_tool_callback(
        self,
        *,
        tool: BaseTool,
        tool_args: dict[str, Any],
        tool_context: ToolContext,
        result: dict[str, Any],
    ) -> dict[str, Any] | None:
        await self._close(tool, tool_context, LedgerOutcome.OK, result)
        return None

    async def on_tool_error_callback(
        self,
        *,
        tool: BaseTool,
        tool_args: dict[str, Any],
        tool_context: ToolContext,
        error: Exception,
    ) -> dict[str, Any] | None:
        await self._close(tool, tool_context, LedgerOutcome.ERROR,
                          {"error": f"{type(error).__name__}: {error}"})
        return None
