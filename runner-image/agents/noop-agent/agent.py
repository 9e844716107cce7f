"""noop-agent: answers without tools (benchmarks: the cost of a run, not of its tools)."""

from google.adk.agents import LlmAgent

root_agent = LlmAgent(
    name="noop_agent",
    model="gemini-2.5-flash",
    description="Answers without tools.",
    instruction="Answer the user's message in one short sentence. You have no tools.",
)
