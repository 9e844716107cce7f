"""The ADK agent of an Agent snapshot (agentrun.agents), built with ADK's own classes.

Each Agent of the snapshot is an `LlmAgent` (its model, description, instruction, output
schema), its tools ADK's built-ins, the tool functions the runner image's agents directory
ships (resolve_function), and one
`McpToolset` per MCP server over streamable HTTP; its sub-agents are the snapshot's. It is
built from the snapshot the run pinned at launch, never from an Agent as it is now.

What reaches an MCP server with each call:
- the Agent's headers: a value as written, or the Secret's value, which the operator put in
  the pod's env through valueFrom (agentrun.agents.header_env names the variable);
- `Idempotency-Key`: the call's idempotency key (agentrun.effects), through ADK's
  header_provider, which ADK asks on every call. The ledger sets it for the call it is
  about to let run (ledger.CALL_KEY), so a resumed attempt that runs an in-doubt call
  again sends the same key.

MCP requests never go through a proxy named in the environment: spec.env may set
HTTP(S)_PROXY for the model's traffic, and such a proxy, the run creator's, would read the
Agent's Secret headers of every plain-HTTP server. Nor does a request of a server with a
Secret header follow a redirect to another origin (direct_client): the header would go
there too.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import importlib.util
import inspect
import os
import ssl
import sys
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from agentrun import agents, effects
from agentrun.vocabulary import HEADER_IDEMPOTENCY_KEY
from agentrun_runner import ledger

if TYPE_CHECKING:
    from google.adk.agents.base_agent import BaseAgent
    from google.adk.agents.readonly_context import ReadonlyContext
    from google.adk.tools.mcp_tool.mcp_toolset import McpToolset

# How long an MCP server has to answer its tool listing before the first model call.
LISTING_SECONDS = 30.0
# Opening a connection to an MCP server; a call itself may take longer (READ_SECONDS).
CONNECT_SECONDS = 10.0
READ_SECONDS = 300.0


class AgentInvalid(ValueError):
    """The snapshot cannot be built in this image (a function that does not import, a tool
    filter naming a tool the server does not offer)."""


class ToolServerUnavailable(RuntimeError):
    """An MCP server of the Agent did not answer its tool listing."""


def builtin_tool(name: str) -> Any:
    """ADK's own object for a built-in an Agent names (agentrun.agents.BUILTINS)."""
    from google.adk import tools

    return BUILTIN_TOOLS[name](tools)


# The keys are agentrun.agents.BUILTINS' (a unit test holds them equal).
BUILTIN_TOOLS: Mapping[str, Callable[[Any], Any]] = {
    "google_search": lambda t: t.google_search,
    "url_context": lambda t: t.url_context,
    "enterprise_web_search": lambda t: t.enterprise_web_search,
    "google_maps_grounding": lambda t: t.google_maps_grounding,
    "load_memory": lambda t: t.load_memory,
    "preload_memory": lambda t: t.preload_memory,
}


@dataclass(frozen=True)
class Server:
    """One MCP server of one Agent, as built."""

    agent: str
    name: str
    url: str
    toolset: McpToolset
    tool_filter: tuple[str, ...] = ()


@dataclass
class Built:
    """The root agent of a snapshot, and its MCP servers (to check before the first call)."""

    root: BaseAgent
    servers: list[Server] = field(default_factory=list)


def call_key_header(_: ReadonlyContext) -> dict[str, str]:
    """ADK's header_provider of every MCP toolset: the key of the call the ledger is letting
    run now (none outside a call: the tool listing)."""
    key = ledger.CALL_KEY.get()
    return {HEADER_IDEMPOTENCY_KEY: key} if key else {}


class SecretRedirectRefused(httpx.HTTPError):
    """An MCP server redirected a request that carries a Secret header to another origin."""


def cross_origin_redirect(url: str, location: str) -> str | None:
    """The origin a redirect from `url` to `location` (absolute or relative) leads to,
    when it is not `url`'s own; None for a redirect within the origin."""
    here = httpx.URL(url)
    there = here.join(location)
    if (there.scheme, there.host, there.port or _PORTS.get(there.scheme)) == (
            here.scheme, here.host, here.port or _PORTS.get(here.scheme)):
        return None
    return f"{there.scheme}://{there.netloc.decode()}"


_PORTS = {"http": 80, "https": 443}


def direct_client(headers: dict[str, str] | None = None, timeout: Any = None,
                  auth: httpx.Auth | None = None, *,
                  secret_headers: Collection[str] = ()) -> httpx.AsyncClient:
    """The MCP SDK's client, less the proxy environment (see the module docstring); the CA
    file of SSL_CERT_FILE is still trusted, as httpx would. With `secret_headers` (the
    headers whose values come from Secrets), a redirect to another origin is refused, not
    followed: httpx drops only Authorization on such a redirect, and would hand any other
    header (an API key) to wherever the server points."""
    cafile = os.environ.get("SSL_CERT_FILE")
    verify: ssl.SSLContext | bool = ssl.create_default_context(cafile=cafile) if cafile else True
    hooks: dict[str, list[Any]] = {}
    if secret_headers:
        names = ", ".join(sorted(secret_headers))

        async def same_origin(response: httpx.Response) -> None:
            location = response.headers.get("location")
            if not response.is_redirect or location is None:
                return
            elsewhere = cross_origin_redirect(str(response.request.url), location)
            if elsewhere is not None:
                raise SecretRedirectRefused(
                    f"the MCP server at {response.request.url.host} redirected a request "
                    f"carrying a Secret header ({names}) to {elsewhere}: not followed")

        hooks["response"] = [same_origin]
    return httpx.AsyncClient(headers=headers, auth=auth, follow_redirects=True,
                             trust_env=False, verify=verify, event_hooks=hooks,
                             timeout=timeout or httpx.Timeout(CONNECT_SECONDS, read=READ_SECONDS))


def _within(path: str | None, agents_dir: Path) -> bool:
    return path is not None and Path(path).resolve().is_relative_to(agents_dir.resolve())


def resolve_function(path: str, agents_dir: Path) -> Any:
    """A tool function of the runner image: `module.name`, where the module is a file of
    the agents directory (the image's own code) and the function is defined in it and
    marked by one of agentrun.effects' decorators. Nothing else resolves: an Agent's
    author names tools the platform ships, never any importable callable (os.getenv,
    subprocess.getoutput, builtins.exec, a function the module merely imported).

    Only the agents directory's own modules are imported: where a module would come from
    is looked up first, and a name the image's Python environment (the standard library,
    site-packages) answers is refused before anything is imported."""
    module_name, _, attribute = path.rpartition(".")
    parts = module_name.split(".")
    refused = (f"the function {path} is not a tool of the runner image: an Agent's "
               "function tool must be defined in a module of the image's agents directory "
               f"({agents_dir}) and marked with one of agentrun.effects' decorators "
               "(@tool, @read_only, @idempotent, @effectful, @requires_approval)")
    base = agents_dir.joinpath(*parts)
    if not module_name or not (base.with_suffix(".py").is_file()
                               or (base / "__init__.py").is_file()):
        raise AgentInvalid(f"{refused}; there is no module {module_name} there")
    loaded = sys.modules.get(parts[0])
    if loaded is not None and not _within(getattr(loaded, "__file__", None), agents_dir):
        raise AgentInvalid(f"{refused}; {parts[0]} is a module of the image's Python "
                           "environment, not of its agents directory")
    if str(agents_dir) not in sys.path:
        sys.path.append(str(agents_dir))
    if loaded is None:
        found_spec = importlib.util.find_spec(parts[0])
        if found_spec is None or not _within(found_spec.origin, agents_dir):
            raise AgentInvalid(f"{refused}; {parts[0]} is a module of the image's Python "
                               "environment, not of its agents directory")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise AgentInvalid(f"the function {path} cannot be imported in the runner image "
                           f"({type(e).__name__}: {e}); fix the module, or name "
                           "another") from e
    if not _within(getattr(module, "__file__", None), agents_dir):
        raise AgentInvalid(f"{refused}; {module_name} is not a module of the agents directory")
    found = getattr(module, attribute, None)
    if not inspect.isfunction(found) or getattr(found, "__module__", None) != module_name:
        raise AgentInvalid(f"{refused}; {module_name} defines no function {attribute}")
    if not effects.is_tool(found):
        raise AgentInvalid(f"{refused}; {path} is not marked as a tool")
    return found


def _headers(agent: str, server: Mapping[str, Any], environ: Mapping[str, str]) -> dict[str, str]:
    headers: dict[str, str] = {}
    for header in server.get("headers") or []:
        name = str(header["name"])
        if "value" in header:
            headers[name] = str(header["value"])
            continue
        env = agents.header_env(agent, str(server["name"]), name)
        if env not in environ:
            # The operator puts it on every pod of a run of this snapshot: its absence
            # means the runner was started by hand, or by something else.
            raise AgentInvalid(f"header {name} of MCP server {server['name']} takes its value "
                               f"from a Secret, and ${env} (which the operator sets from it) "
                               "is not in the runner's environment")
        headers[name] = environ[env]
    return headers


def build(snapshot: Mapping[str, Any], environ: Mapping[str, str], agents_dir: Path) -> Built:
    """The ADK agent tree of `snapshot`; raises AgentInvalid with what to fix."""
    from google.adk.agents.llm_agent import LlmAgent
    from google.adk.tools.mcp_tool.mcp_session_manager import StreamableHTTPConnectionParams
    from google.adk.tools.mcp_tool.mcp_toolset import McpToolset

    specs: Mapping[str, Mapping[str, Any]] = snapshot.get("agents") or {}
    root_name = str(snapshot.get("root") or "")
    for name, spec in specs.items():
        problems = agents.problems_of(name, spec)
        if problems:
            raise AgentInvalid(f"Agent {name}: {'; '.join(problems)}")
    servers: list[Server] = []

    def make(name: str) -> Any:
        spec = specs[name]
        tools: list[Any] = []
        for tool in spec.get("tools") or []:
            tools.append(builtin_tool(tool["builtin"]) if tool.get("builtin")
                         else resolve_function(str(tool["function"]), agents_dir))
        for server in spec.get("mcpServers") or []:
            only = tuple(str(t) for t in server.get("toolFilter") or [])
            toolset = McpToolset(
                connection_params=StreamableHTTPConnectionParams(
                    url=str(server["url"]), headers=_headers(name, server, environ),
                    timeout=CONNECT_SECONDS, sse_read_timeout=READ_SECONDS,
                    httpx_client_factory=functools.partial(
                        direct_client, secret_headers=frozenset(
                            str(h["name"]) for h in server.get("headers") or []
                            if "value" not in h))),
                tool_filter=list(only) or None, header_provider=call_key_header)
            servers.append(Server(name, str(server["name"]), str(server["url"]), toolset, only))
            tools.append(toolset)
        try:
            return LlmAgent(
                name=agents.identifier(name), model=str(spec.get("model") or ""),
                description=str(spec.get("description") or ""),
                instruction=str(spec.get("instruction") or ""),
                output_schema=dict(spec["outputSchema"]) if spec.get("outputSchema") else None,
                tools=tools, sub_agents=[make(str(s["name"])) for s in
                                         spec.get("subAgents") or []])
        except (ValueError, TypeError) as e:  # pydantic's ValidationError is a ValueError
            raise AgentInvalid(f"ADK refuses Agent {name}: {e}") from e

    if root_name not in specs:
        raise AgentInvalid(f"the snapshot has no root Agent {root_name!r}")
    return Built(make(root_name), servers)


async def check_servers(built: Built, timeout: float = LISTING_SECONDS) -> None:
    """Every MCP server answers its tool listing and offers the tools its filter names,
    before the first model call (so a run whose server is down fails with nothing run)."""
    for server in built.servers:
        try:
            offered = await asyncio.wait_for(server.toolset.get_tools(), timeout)
        except Exception as e:
            cause = e.__cause__ or e
            raise ToolServerUnavailable(
                f"MCP server {server.name} of Agent {server.agent} ({server.url}) did not "
                f"answer its tool listing: {type(cause).__name__}: {cause}. Check that it "
                "runs and that this namespace reaches it; no tool was called.") from e
        names = {t.name for t in offered}
        missing = [t for t in server.tool_filter if t not in names]
        if missing:
            raise AgentInvalid(
                f"mcpServers {server.name} of Agent {server.agent} names "
                f"{', '.join(missing)} in toolFilter, which the server does not offer: "
                "remove it from toolFilter, or serve it")
