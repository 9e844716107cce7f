"""Which tool calls wait for a human's decision, and what waiting means to an attempt.

First match wins: the run's spec.tools[].approval (Required or None), then the agent's
code (ADK's `FunctionTool(require_confirmation=...)`, or `agentrun.effects
.requires_approval`). A call that needs a decision and has none is written down as waiting
(its arguments and their digest; it is not started) and the attempt ends: no pod is held
while a human decides. The attempt that resumes after the decision runs it (approved) or
tells the model it was denied.
"""

from __future__ import annotations

from dataclasses import dataclass

from agentrun_runner.stops import AttemptStop


@dataclass(frozen=True)
class ApprovalRule:
    """spec.tools[].approval of one tool: whether its calls wait, and for how long."""

    required: bool
    timeout_seconds: int


class AwaitingApproval(AttemptStop):
    """A call waits for a decision: the attempt ends, and resumes once it is decided."""

    def __init__(self, tool: str, seq: int) -> None:
        super().__init__(f"{tool} (call {seq}) waits for an approval; the attempt ends and "
                         "the run goes on once it is approved or denied.")
        self.tool = tool
        self.seq = seq


def denial(approver: str, note: str | None) -> dict[str, str]:
    """What the model is told instead of a denied call's result (api.md's words)."""
    return {"error": f"denied by {approver}: {note}" if note else f"denied by {approver}"}
