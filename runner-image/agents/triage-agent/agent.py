"""triage-agent: answers with a structured object (ADK's output_schema), which the run
shows as status.result.json beside the text."""

from pydantic import BaseModel, Field

from google.adk.agents import LlmAgent


class Triage(BaseModel):
    """How urgent a customer's request is, and what it is about."""

    priority: str = Field(description="low, normal or urgent")
    summary: str = Field(description="the request in one sentence")


root_agent = LlmAgent(
    name="triage_agent",
    model="gemini-2.5-flash",
    description="Triages a customer request into a priority and a one-line summary.",
    instruction="Read the customer's message and answer with its priority and a summary.",
    output_schema=Triage,
)
