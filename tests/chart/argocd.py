"""Argo CD's health checks of charts/agentrun/argocd, run by a real Lua interpreter the way
Argo CD runs them: the object, as Argo CD sees it (JSON), is the global `obj`; the script
returns a table with `status` and `message`."""

from __future__ import annotations

import datetime
import shutil
import subprocess
from pathlib import Path
from typing import Any

from agentrun_devtools.controlplane import REPO

CUSTOMIZATIONS = REPO / "charts" / "agentrun" / "argocd"
KINDS = ("AgentRun", "AgentRunReplay", "AgentRunSchedule")
LUA = shutil.which("lua5.4") or "lua5.4"

# What a health script may use: Argo CD opens the base, table, string and math libraries
# (no io, no os), so a script that reaches for anything else breaks there, not here.
_DRIVER = """
local env = {obj = OBJECT, ipairs = ipairs, pairs = pairs, next = next, type = type,
             tostring = tostring, tonumber = tonumber, error = error, pcall = pcall,
             select = select, unpack = table.unpack,
             string = string, table = table, math = math}
local chunk = assert(loadfile(SCRIPT, "t", env))
local health = chunk()
assert(type(health) == "table", "the script returned no table")
io.write(tostring(health.status), "\\0", tostring(health.message))
"""


def lua_literal(value: Any) -> str:
    """A Lua expression for a value decoded from JSON or YAML (null is nil, as in Argo CD's
    conversion: a key holding null is absent)."""
    if value is None:
        return "nil"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, datetime.datetime | datetime.date):
        return lua_literal(value.isoformat().replace("+00:00", "Z"))
    if isinstance(value, str):
        return '"' + "".join(
            chr(b) if 0x20 <= b < 0x7F and chr(b) not in '"\\' else f"\\{b:03d}"
            for b in value.encode()) + '"'
    if isinstance(value, list):
        return "{" + ", ".join(lua_literal(v) for v in value) + "}"
    if isinstance(value, dict):
        return "{" + ", ".join(f"[{lua_literal(str(k))}] = {lua_literal(v)}"
                               for k, v in value.items() if v is not None) + "}"
    raise TypeError(f"no Lua literal for {type(value).__name__}")


def health(script: Path, obj: dict[str, Any]) -> tuple[str, str]:
    """(status, message) as the health script at `script` says for `obj`."""
    chunk = (f"local OBJECT = {lua_literal(obj)}\nlocal SCRIPT = {lua_literal(str(script))}\n"
             + _DRIVER)
    done = subprocess.run([LUA, "-"], input=chunk, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, f"{script}: {done.stderr}"
    status, message = done.stdout.split("\0")
    return status, message
