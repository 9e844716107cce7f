"""Declarative agents: an Agent resource resolved into the snapshot a run pins (pure).

An Agent (plural `agents`, namespaced) holds an ADK agent definition. At launch the
operator resolves the Agent a run names with every Agent it names as a sub-agent, checks
that they make one ADK agent tree, and snapshots the result in the store, content-
addressed: `{"root": <name>, "agents": {<name>: <spec>, ...}}`. The run records its digest
(`status.agentDigest`), and every attempt, resume and replay of it builds its ADK agent
from that snapshot, never from the Agents as they are now: what was approved, refused or
resumed is the definition that ran.

The snapshot holds no Secret value. A header whose value comes from a Secret is kept as the
reference (`valueFrom.secretKeyRef`); the operator puts it on the runner pod as an env var
through `valueFrom` (the kubelet resolves it), named by `header_env`, and the runner reads
it from there. Both sides name it with the same function.

The operator and the runner both import this module; it does no I/O.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from agentrun import effects
from agentrun.vocabulary import HEADER_IDEMPOTENCY_KEY, MCP_HEADER_ENV_PREFIX, Approval

# ADK's built-in tools an Agent may name (`tools: [{builtin: google_search}]`), each with
# the effect class its calls have: none of them touches the world (search and grounding
# run inside the model's request; memory is read, never written). The runner maps each
# name to ADK's own object (agentrun_runner.declarative.BUILTIN_TOOLS, same keys).
BUILTINS: Final[Mapping[str, str]] = {
    "google_search": effects.READ_ONLY,
    "url_context": effects.READ_ONLY,
    "enterprise_web_search": effects.READ_ONLY,
    "google_maps_grounding": effects.READ_ONLY,
    "load_memory": effects.READ_ONLY,
    "preload_memory": effects.READ_ONLY,
}

# Python 3.11's sys.stdlib_module_names (builtins among them): a function tool whose
# top-level module is one of these is refused (the CRD's CEL rule holds the same list, a
# test keeps them equal). Fixed here rather than read from the running interpreter, so the
# operator, the runner and the CRD refuse the same names whatever Python each runs.
STDLIB_MODULES: Final = frozenset({
    '__future__', '_abc', '_aix_support', '_ast', '_asyncio', '_bisect', '_blake2',
    '_bootsubprocess', '_bz2', '_codecs', '_codecs_cn', '_codecs_hk', '_codecs_iso2022',
    '_codecs_jp', '_codecs_kr', '_codecs_tw', '_collections', '_collections_abc',
    '_compat_pickle', '_compression', '_contextvars', '_crypt', '_csv', '_ctypes',
    '_curses', '_curses_panel', '_datetime', '_dbm', '_decimal', '_elementtree',
    '_frozen_importlib', '_frozen_importlib_external', '_functools', '_gdbm',
    '_hashlib', '_heapq', '_imp', '_io', '_json', '_locale', '_lsprof', '_lzma',
    '_markupbase', '_md5', '_msi', '_multibytecodec', '_multiprocessing', '_opcode',
    '_operator', '_osx_support', '_overlapped', '_pickle', '_posixshmem',
    '_posixsubprocess', '_py_abc', '_pydecimal', '_pyio', '_queue', '_random',
    '_scproxy', '_sha1', '_sha256', '_sha3', '_sha512', '_signal', '_sitebuiltins',
    '_socket', '_sqlite3', '_sre', '_ssl', '_stat', '_statistics', '_string',
    '_strptime', '_struct', '_symtable', '_thread', '_threading_local', '_tkinter',
    '_tokenize', '_tracemalloc', '_typing', '_uuid', '_warnings', '_weakref',
    '_weakrefset', '_winapi', '_zoneinfo', 'abc', 'aifc', 'antigravity', 'argparse',
    'array', 'ast', 'asynchat', 'asyncio', 'asyncore', 'atexit', 'audioop', 'base64',
    'bdb', 'binascii', 'bisect', 'builtins', 'bz2', 'cProfile', 'calendar', 'cgi',
    'cgitb', 'chunk', 'cmath', 'cmd', 'code', 'codecs', 'codeop', 'collections',
    'colorsys', 'compileall', 'concurrent', 'configparser', 'contextlib', 'contextvars',
    'copy', 'copyreg', 'crypt', 'csv', 'ctypes', 'curses', 'dataclasses', 'datetime',
    'dbm', 'decimal', 'difflib', 'dis', 'distutils', 'doctest', 'email', 'encodings',
    'ensurepip', 'enum', 'errno', 'faulthandler', 'fcntl', 'filecmp', 'fileinput',
    'fnmatch', 'fractions', 'ftplib', 'functools', 'gc', 'genericpath', 'getopt',
    'getpass', 'gettext', 'glob', 'graphlib', 'grp', 'gzip', 'hashlib', 'heapq', 'hmac',
    'html', 'http', 'idlelib', 'imaplib', 'imghdr', 'imp', 'importlib', 'inspect', 'io',
    'ipaddress', 'itertools', 'json', 'keyword', 'lib2to3', 'linecache', 'locale',
    'logging', 'lzma', 'mailbox', 'mailcap', 'marshal', 'math', 'mimetypes', 'mmap',
    'modulefinder', 'msilib', 'msvcrt', 'multiprocessing', 'netrc', 'nis', 'nntplib',
    'nt', 'ntpath', 'nturl2path', 'numbers', 'opcode', 'operator', 'optparse', 'os',
    'ossaudiodev', 'pathlib', 'pdb', 'pickle', 'pickletools', 'pipes', 'pkgutil',
    'platform', 'plistlib', 'poplib', 'posix', 'posixpath', 'pprint', 'profile',
    'pstats', 'pty', 'pwd', 'py_compile', 'pyclbr', 'pydoc', 'pydoc_data', 'pyexpat',
    'queue', 'quopri', 'random', 're', 'readline', 'reprlib', 'resource', 'rlcompleter',
    'runpy', 'sched', 'secrets', 'select', 'selectors', 'shelve', 'shlex', 'shutil',
    'signal', 'site', 'smtpd', 'smtplib', 'sndhdr', 'socket', 'socketserver', 'spwd',
    'sqlite3', 'sre_compile', 'sre_constants', 'sre_parse', 'ssl', 'stat', 'statistics',
    'string', 'stringprep', 'struct', 'subprocess', 'sunau', 'symtable', 'sys',
    'sysconfig', 'syslog', 'tabnanny', 'tarfile', 'telnetlib', 'tempfile', 'termios',
    'textwrap', 'this', 'threading', 'time', 'timeit', 'tkinter', 'token', 'tokenize',
    'tomllib', 'trace', 'traceback', 'tracemalloc', 'tty', 'turtle', 'turtledemo',
    'types', 'typing', 'unicodedata', 'unittest', 'urllib', 'uu', 'uuid', 'venv',
    'warnings', 'wave', 'weakref', 'webbrowser', 'winreg', 'winsound', 'wsgiref',
    'xdrlib', 'xml', 'xmlrpc', 'zipapp', 'zipfile', 'zipimport', 'zlib', 'zoneinfo'
})
DIGEST_PREFIX: Final = "sha256:"
# `module.attribute`, importable in the runner image (`{function: "my_tools.lookup"}`).
_FUNCTION = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+$")
_URL = re.compile(r"^https?://[^\s/]+")


@dataclass(frozen=True)
class Resolution:
    """An Agent resolved with the Agents it names: the snapshot and its digest, or the
    sentence that says why it cannot run (AgentRun reason AgentInvalid)."""

    snapshot: dict[str, Any] | None
    digest: str | None
    problem: str | None = None

    @property
    def valid(self) -> bool:
        return self.problem is None


@dataclass(frozen=True)
class SecretRef:
    """One MCP header whose value comes from a Secret (the name and key, never the value)."""

    agent: str
    server: str
    header: str
    secret: str
    key: str

    @property
    def env(self) -> str:
        return header_env(self.agent, self.server, self.header)

    @property
    def where(self) -> str:
        """Where the Agent names it, for messages."""
        return f"Agent {self.agent} mcpServers {self.server} header {self.header}"


def identifier(name: str) -> str:
    """The ADK agent name of an Agent: ADK wants a Python identifier, and a Kubernetes name
    has '-' (and may start with a digit)."""
    ident = name.replace("-", "_")
    return ident if ident[:1].isalpha() or ident[:1] == "_" else f"agent_{ident}"


def header_env(agent: str, server: str, header: str) -> str:
    """The env var of the runner pod that holds one Secret header's value."""
    digest = hashlib.sha256(f"{agent}\n{server}\n{header.lower()}".encode()).hexdigest()
    return f"{MCP_HEADER_ENV_PREFIX}{digest[:16].upper()}"


def canonical(snapshot: Mapping[str, Any]) -> bytes:
    """The bytes a snapshot's digest is taken of: JSON, keys sorted, no spaces."""
    return json.dumps(snapshot, sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False).encode("utf-8")


def snapshot_digest(snapshot: Mapping[str, Any]) -> str:
    """`sha256:<hex>` of the snapshot. Plain, not keyed (unlike input digests): a snapshot
    holds nothing that whoever may read the Agents may not read already."""
    return DIGEST_PREFIX + hashlib.sha256(canonical(snapshot)).hexdigest()


# -- one Agent's definition ------------------------------------------------------------------


def _header_problems(agent: str, server: str, headers: Sequence[Any]) -> list[str]:
    found: list[str] = []
    seen: set[str] = set()
    for header in headers:
        if not isinstance(header, Mapping) or not header.get("name"):
            found.append(f"mcpServers {server} has a header without a name")
            continue
        name = str(header["name"])
        if name.lower() == HEADER_IDEMPOTENCY_KEY.lower():
            found.append(f"mcpServers {server} sets the header {name}, which agentrun sets "
                         "on every call (the call's idempotency key)")
        if name.lower() in seen:
            found.append(f"mcpServers {server} sets the header {name} twice")
        seen.add(name.lower())
        ref = (header.get("valueFrom") or {}).get("secretKeyRef")
        if ("value" in header) == bool(ref):
            found.append(f"mcpServers {server} header {name} needs exactly one of value and "
                         "valueFrom.secretKeyRef")
        elif ref and not (ref.get("name") and ref.get("key")):
            found.append(f"mcpServers {server} header {name}: valueFrom.secretKeyRef needs "
                         "a name and a key")
    return found


def problems_of(name: str, spec: Mapping[str, Any]) -> list[str]:
    """What is wrong with one Agent's spec on its own (the CRD's schema checks most of it;
    this also holds for a snapshot read back from the store), each a short phrase."""
    found: list[str] = []
    schema = spec.get("outputSchema")
    if schema is not None and not isinstance(schema, Mapping):
        found.append("outputSchema must be a JSON Schema object")
    for i, tool in enumerate(spec.get("tools") or []):
        builtin = tool.get("builtin") if isinstance(tool, Mapping) else None
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if bool(builtin) == bool(function):
            found.append(f"tools[{i}] needs exactly one of builtin and function")
        elif builtin and builtin not in BUILTINS:
            found.append(f"tools[{i}] names the built-in {builtin!r}, which is not one of "
                         f"{', '.join(BUILTINS)}")
        elif function and not _FUNCTION.match(str(function)):
            found.append(f"tools[{i}] names the function {function!r}: write it as "
                         "module.name, importable in the runner image")
        elif function and str(function).split(".")[0] in STDLIB_MODULES:
            found.append(f"tools[{i}] names the function {function}, of Python's standard "
                         "library: a function tool is one the runner image's agents "
                         "directory defines and marks as a tool (docs/agents.md)")
    servers: set[str] = set()
    for server in spec.get("mcpServers") or []:
        label = str(server.get("name") or "")
        if not label:
            found.append("an entry of mcpServers has no name")
            continue
        if label in servers:
            found.append(f"mcpServers names {label} twice")
        servers.add(label)
        if not _URL.match(str(server.get("url") or "")):
            found.append(f"mcpServers {label} needs an http:// or https:// url (MCP "
                         "streamable HTTP)")
        found.extend(_header_problems(name, label, server.get("headers") or []))
    for rule in spec.get("effects") or []:
        if rule.get("effect") is not None and rule["effect"] not in effects.ALL:
            found.append(f"effects {rule.get('name')}: effect must be one of "
                         f"{', '.join(effects.ALL)}")
        if rule.get("approval") is not None and rule["approval"] not in (
                Approval.REQUIRED, Approval.NONE):
            found.append(f"effects {rule.get('name')}: approval must be {Approval.REQUIRED} "
                         f"or {Approval.NONE}")
    if identifier(name) == "user":
        found.append("ADK reserves the agent name user (the person the agent talks to)")
    return found


# -- an Agent with the Agents it names ------------------------------------------------------


def _tree(root: str, agents: Mapping[str, Mapping[str, Any]],
          namespace: str) -> tuple[list[str], str | None]:
    """The Agents of the tree rooted at `root`, parents first, or why they are no tree."""
    order: list[str] = []
    parent: dict[str, str] = {}
    pending: list[tuple[str, tuple[str, ...]]] = [(root, ())]
    while pending:
        name, path = pending.pop(0)
        if name in path:
            loop = " -> ".join([*path[path.index(name):], name])
            return order, (f"its sub-agents loop ({loop}): sub-agents form a tree; remove "
                           "one of them from spec.subAgents")
        if name in order:
            return order, (f"Agent {name} is a sub-agent of both {parent[name]} and "
                           f"{path[-1]}: an ADK agent has one parent; give each its own "
                           "Agent")
        if name not in agents:
            return order, (f"Agent {path[-1]} names the sub-agent {name}, which does not "
                           f"exist in namespace {namespace}: create it, or remove it from "
                           "spec.subAgents")
        order.append(name)
        if path:
            parent[name] = path[-1]
        for sub in agents[name].get("subAgents") or []:
            pending.append((str(sub.get("name") or ""), (*path, name)))
    return order, None


def _effect_conflicts(tree: Sequence[str], agents: Mapping[str, Mapping[str, Any]]) -> str | None:
    """One effect per tool name in a run: the ledger knows a tool by its name."""
    seen: dict[str, tuple[str, str | None, str | None]] = {}
    for name in tree:
        for rule in agents[name].get("effects") or []:
            tool = str(rule.get("name") or "")
            said = (name, rule.get("effect"), rule.get("approval"))
            if tool in seen and seen[tool][1:] != said[1:]:
                return (f"Agents {seen[tool][0]} and {name} say different effects or approvals "
                        f"for the tool {tool}: a tool name has one rule in a run")
            seen.setdefault(tool, said)
    return None


def resolve(root: str, agents: Mapping[str, Mapping[str, Any]], namespace: str) -> Resolution:
    """The snapshot of Agent `root` of `namespace` and the Agents it names (`agents`: every
    Agent's spec there, by name), or why it cannot be built.

    It can be built when the sub-agents exist and form a tree (no loop, no Agent with two
    parents: ADK gives each agent one), every definition passes `problems_of`, the ADK
    names are unique, and a tool name has one effect rule across the tree.
    """
    if root not in agents:
        return Resolution(None, None, f"there is no Agent {root} in namespace {namespace}")
    tree, problem = _tree(root, agents, namespace)
    if problem is not None:
        return Resolution(None, None, f"Agent {root} cannot be built: {problem}.")
    for name in tree:
        found = problems_of(name, agents[name])
        if found:
            return Resolution(None, None, f"Agent {name} is invalid: {'; '.join(found)}.")
    names: dict[str, str] = {}
    for name in tree:
        other = names.setdefault(identifier(name), name)
        if other != name:
            return Resolution(None, None, (
                f"Agents {other} and {name} have the same ADK name {identifier(name)}; "
                "rename one of them."))
    conflict = _effect_conflicts(tree, agents)
    if conflict is not None:
        return Resolution(None, None, f"Agent {root} cannot be built: {conflict}.")
    snapshot = {"root": root, "agents": {name: dict(agents[name]) for name in tree}}
    return Resolution(snapshot, snapshot_digest(snapshot))


def launch_problem(resolution: Resolution, run_model: str | None) -> str | None:
    """Why a run of this Agent cannot start even though the Agent is valid: its root has no
    model and the run names none (sub-agents inherit their parent's)."""
    if resolution.snapshot is None:
        return resolution.problem
    root = resolution.snapshot["root"]
    if not resolution.snapshot["agents"][root].get("model") and not run_model:
        return (f"Agent {root} has no spec.model and the run sets no spec.model: set one of "
                "them.")
    return None


# -- what a snapshot needs -------------------------------------------------------------------


def secret_refs(snapshot: Mapping[str, Any]) -> list[SecretRef]:
    """Every MCP header of the snapshot whose value comes from a Secret, in spec order."""
    found: list[SecretRef] = []
    for agent, spec in (snapshot.get("agents") or {}).items():
        for server in spec.get("mcpServers") or []:
            for header in server.get("headers") or []:
                ref = (header.get("valueFrom") or {}).get("secretKeyRef")
                if ref:
                    found.append(SecretRef(agent, str(server["name"]), str(header["name"]),
                                           str(ref["name"]), str(ref["key"])))
    return found


def secret_env(snapshot: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The runner pod's env entries for the snapshot's Secret headers (valueFrom: the
    kubelet puts the value in; the operator never reads it)."""
    return [{"name": ref.env, "valueFrom": {"secretKeyRef": {"name": ref.secret,
                                                             "key": ref.key}}}
            for ref in secret_refs(snapshot)]


def tool_rules(snapshot: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The snapshot's effect and approval rules (spec.effects of every Agent of it, and
    the built-ins' effects), as AgentRun spec.tools entries: a run's own spec.tools
    override them, by tool name."""
    rules: dict[str, dict[str, Any]] = {}
    for spec in (snapshot.get("agents") or {}).values():
        for tool in spec.get("tools") or []:
            if tool.get("builtin") in BUILTINS:
                rules.setdefault(tool["builtin"], {"name": tool["builtin"],
                                                   "effect": BUILTINS[tool["builtin"]]})
    for spec in (snapshot.get("agents") or {}).values():
        for rule in spec.get("effects") or []:
            rules[str(rule["name"])] = {k: v for k, v in rule.items() if v is not None}
    return list(rules.values())
