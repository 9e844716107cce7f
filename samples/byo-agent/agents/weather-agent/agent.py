"""weather-agent: an agent of your own, in ADK's layout (`agents/<name>/agent.py` defining
`root_agent`), run by agentrun's runner image. Nothing here knows about agentrun except
the effect classes, which tell a resume what may run again."""

from __future__ import annotations

from google.adk.agents import LlmAgent
from google.adk.tools.tool_context import ToolContext

from agentrun import effects

FORECASTS = {"paris": "rain", "madrid": "sun", "oslo": "snow"}


@effects.read_only
async def get_forecast(city: str) -> dict:
    """Tomorrow's weather in a city."""
    return {"city": city, "forecast": FORECASTS.get(city.lower(), "unknown")}


@effects.idempotent
async def reserve_umbrella(city: str, tool_context: ToolContext) -> dict:
    """Reserves an umbrella for the user in a city. The reservation is keyed by the call's
    idempotency key, so a resumed run that makes the same call again reserves nothing
    twice (a real service would take the key as an Idempotency-Key header)."""
    return {"city": city, "reservation": effects.idempotency_key(tool_context)}


root_agent = LlmAgent(
    name="weather_agent",
    model="gemini-2.5-flash",
    description="Tells the weather and reserves an umbrella when it rains.",
    instruction=(
        "Look up tomorrow's forecast for the user's city with get_forecast. If it rains, "
        "reserve an umbrella with reserve_umbrella. Answer in one sentence."
    ),
    tools=[get_forecast, reserve_umbrella],
)
