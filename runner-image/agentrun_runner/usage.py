"""The usage meter: an ADK plugin that keeps the run's budget (budget.py) before each
model call and counts, and reports to the store, each call after it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from google.adk.plugins.base_plugin import BasePlugin

from agentrun_runner import logs
from agentrun_runner.budget import Budget, BudgetExceeded

if TYPE_CHECKING:
    from google.adk.agents.callback_context import CallbackContext
    from google.adk.models.base_llm import BaseLlm
    from google.adk.models.llm_request import LlmRequest
    from google.adk.models.llm_response import LlmResponse

    from agentrun_runner.store_client import StoreClient


def tokens_of(response: LlmResponse) -> tuple[int, int]:
    """(input, output) tokens of a model response, from the model's own usage report
    (output includes the model's thoughts, which are billed as output)."""
    meta = response.usage_metadata
    if meta is None:
        return 0, 0
    output = (meta.candidates_token_count or 0) + (meta.thoughts_token_count or 0)
    return int(meta.prompt_token_count or 0), int(output)


class UsageMeter(BasePlugin):
    """Keeps the budget before each model call, and counts and reports each call after."""

    def __init__(self, budget: Budget, client: StoreClient, models: Mapping[str, BaseLlm],
                 failures: list[BaseException]) -> None:
        super().__init__(name="agentrun_usage")
        self._budget = budget
        self._client = client
        self._models = dict(models)
        self._failures = failures

    async def before_model_callback(
        self, *, callback_context: CallbackContext, llm_request: LlmRequest
    ) -> LlmResponse | None:
        try:
            self._budget.before_model()
        except BudgetExceeded as e:
            self._failures.append(e)
            logs.error("budget.exceeded", message=str(e))
            raise
        return None

    async def after_model_callback(
        self, *, callback_context: CallbackContext, llm_response: LlmResponse
    ) -> LlmResponse | None:
        if llm_response.partial:
            return None
        llm = self._models.get(callback_context.agent_name)
        model = str(getattr(llm, "model", "") or "unknown")
        used_in, used_out = tokens_of(llm_response)
        cost = self._budget.model_called(model, used_in, used_out)
        try:
            await self._client.report_usage(model, used_in, used_out, cost)
        except Exception as e:
            # The call happened; a usage report that did not land makes the count low,
            # which the next attempt's begin would repeat: say so, never stop the run.
            logs.warning("usage.report_failed", model=model,
                         error=f"{type(e).__name__}: {e}")
        calls = [p.function_call.name or "" for p in (
            llm_response.content.parts if llm_response.content else None) or []
            if p.function_call is not None]
        try:
            self._budget.before_tools(calls)
        except BudgetExceeded as e:
            self._failures.append(e)
            logs.error("budget.exceeded", message=str(e))
            raise
        return None
