"""support-agent: the sample agent of the demo and the acceptance checks.

Its side effects are rows in the run store's `sample_outbox` table (run, attempt, tool,
args, time), so that anyone can count what was really sent. It writes them through the
runner's store client (the store API stamps each row with the run its token is for).

Test hook (this agent only): AGENTRUN_TEST_CRASH_IN=<tool> makes that tool kill its
runner with os._exit(137) right after recording its side effect and before answering:
a tool that acted, then crashed, as a runner killed mid-tool does.
"""

from __future__ import annotations

import asyncio
import os

from google.adk.agents import LlmAgent
from google.adk.tools.function_tool import FunctionTool
from google.adk.tools.tool_context import ToolContext

from agentrun import effects
from agentrun.vocabulary import ENV_TEST_CRASH_IN
from agentrun_runner import store_client


async def _act(tool: str, args: dict, key: str | None = None) -> None:
    await store_client.current().record_side_effect(tool, args, key)
    if os.environ.get(ENV_TEST_CRASH_IN) == tool:
        os._exit(137)


@effects.read_only
async def read_message(tool_context: ToolContext) -> str:
    """Returns the customer's message (the run's input text)."""
    content = tool_context.user_content
    if content is None or not content.parts:
        return ""
    return "".join(p.text or "" for p in content.parts)


@effects.idempotent
async def send_email(to: str, body: str, tool_context: ToolContext,
                     delay_seconds: float = 0) -> dict:
    """Sends an email to a customer. The email is recorded at once; the tool answers
    after `delay_seconds` (a tool that acted and has not answered yet). The outbox
    dedupes by the call's idempotency key, as an email provider does."""
    await _act("send_email", {"to": to, "body": body, "delay_seconds": delay_seconds},
               effects.idempotency_key(tool_context))
    if delay_seconds:
        await asyncio.sleep(float(delay_seconds))
    return {"status": "sent", "to": to}


@effects.effectful
async def update_crm(customer: str, status: str) -> dict:
    """Sets a customer's status in the CRM."""
    await _act("update_crm", {"customer": customer, "status": status})
    return {"status": "updated", "customer": customer}


@effects.effectful
async def charge_card(customer: str, amount: float, delay_seconds: float = 0) -> dict:
    """Charges a customer's card (Effectful: twice is twice). The charge is recorded at
    once; the tool answers after `delay_seconds`."""
    await _act("charge_card", {"customer": customer, "amount": amount,
                               "delay_seconds": delay_seconds})
    if delay_seconds:
        await asyncio.sleep(float(delay_seconds))
    return {"status": "charged", "customer": customer, "amount": amount}


@effects.effectful
async def issue_refund(customer: str, amount: float) -> dict:
    """Refunds a customer (Effectful). Declared with ADK's own require_confirmation, so
    each call waits for a human's decision (an AgentRunApproval) before it runs."""
    await _act("issue_refund", {"customer": customer, "amount": amount})
    return {"status": "refunded", "customer": customer, "amount": amount}


# What load_history holds on to while the run lasts.
_loaded: list[bytearray] = []


@effects.read_only
async def load_history(customer: str, megabytes: int = 1) -> dict:
    """Loads a customer's case history into memory (`megabytes` of it) and keeps it for
    the rest of the run: a tool whose memory use a pod's limit may not allow."""
    chunk = 1 << 20
    for _ in range(int(megabytes)):
        block = bytearray(chunk)
        block[::4096] = b"x" * (chunk // 4096)  # touch every page: resident, not reserved
        _loaded.append(block)
    return {"customer": customer, "loaded_mb": int(megabytes)}


root_agent = LlmAgent(
    name="support_agent",
    model="gemini-2.5-flash",
    description="Answers customer support requests.",
    instruction=(
        "You are a customer support agent. Read the customer's message with read_message, "
        "decide what to do, email the customer with send_email when an answer is needed, "
        "record the case status with update_crm, then summarise what you did in one sentence."
    ),
    tools=[read_message, send_email, update_crm, charge_card, load_history,
           FunctionTool(issue_refund, require_confirmation=True)],
)
