"""Loading an agent from the agents directory, with ADK's conventions:

  <agents_dir>/<name>/agent.py      defining `root_agent` (or `app`)
  <agents_dir>/<name>/__init__.py   exposing `root_agent` (or `agent.root_agent`)
  <agents_dir>/<name>/root_agent.yaml

Directory names may be hyphenated (`support-agent`, as AgentRun's spec.agent says), which
Python cannot import by name; the package is loaded from its path under an identifier.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

from google.adk.agents.base_agent import BaseAgent

import agentrun_runner


class AgentNotFound(LookupError):
    """No loadable agent of that name in the agents directory."""


def default_agents_dir() -> Path:
    """`runner-image/agents` beside the package (a checkout), else `/agents` (the image)."""
    beside = Path(agentrun_runner.__file__).resolve().parent.parent / "agents"
    return beside if beside.is_dir() else Path("/agents")


def module_name(agent: str) -> str:
    """An importable module name for an agent directory name."""
    return "agentrun_agents_" + re.sub(r"\W", "_", agent)


def _load_package(name: str, directory: Path) -> ModuleType:
    init = directory / "__init__.py"
    spec = importlib.util.spec_from_file_location(
        name,
        init if init.is_file() else directory / "agent.py",
        submodule_search_locations=[str(directory)] if init.is_file() else None,
    )
    if spec is None or spec.loader is None:
        raise AgentNotFound(f"cannot load agent from {directory}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _root_of(module: ModuleType) -> BaseAgent | None:
    app = getattr(module, "app", None)
    root = getattr(app, "root_agent", None) if app is not None else None
    root = root or getattr(module, "root_agent", None)
    return root if isinstance(root, BaseAgent) else None


def load_agent(agents_dir: Path, agent: str) -> BaseAgent:
    """The root agent of `agent` in `agents_dir`; raises AgentNotFound with where it looked."""
    if not agent or "/" in agent or agent.startswith("."):
        raise AgentNotFound(f"invalid agent name {agent!r}")
    directory = agents_dir / agent
    if not directory.is_dir():
        known = sorted(p.name for p in agents_dir.glob("*") if p.is_dir())
        found = ", ".join(known) or "none"
        raise AgentNotFound(f"no agent {agent!r} in {agents_dir} (found: {found})")
    name = module_name(agent)
    has_init = (directory / "__init__.py").is_file()
    has_agent = (directory / "agent.py").is_file()
    if has_init or has_agent:
        module = _load_package(name, directory)
        root = _root_of(module)
        if root is None and has_init and has_agent:
            root = _root_of(importlib.import_module(f"{name}.agent"))
        if root is not None:
            return root
    yaml = directory / "root_agent.yaml"
    if yaml.is_file():
        from google.adk.agents import config_agent_utils

        loaded = config_agent_utils.from_config(str(yaml))
        if isinstance(loaded, BaseAgent):
            return loaded
    raise AgentNotFound(
        f"no root_agent in {directory}: expected agent.py defining root_agent, "
        "__init__.py exposing it, or root_agent.yaml"
    )
