from . import agent  # noqa: F401  (ADK convention: the package exposes agent.root_agent)
from .agent import root_agent  # noqa: F401
